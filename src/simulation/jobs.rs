//! The jobs `weir simulate` runs (and `cargo test` simulates): word count over a text
//! corpus, a sliding-window count, a window join of two sources, and a keyed process with
//! list state. Small (a few thousand records), so a seed takes milliseconds; each commits its
//! output as `(u64, u64, u64)` rows.
//!
//! May touch: `error`, `operator`, `pipeline`, `prng`, `record`, `sink`, `source`, `state`.

use std::fmt;
use std::path::{Path, PathBuf};

use super::{Expect, SimMode, Simulated};
use crate::error::{Error, Result};
use crate::operator::window::Window;
use crate::pipeline::Job;
use crate::prng::mix;
use crate::record::Word;
use crate::source::{Generator, TextSource};
use crate::state::ListState;

/// One committed row of a simulated job.
pub type Row = (u64, u64, u64);

/// weir's simulated jobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimJob {
    /// Running word counts over a text corpus (the text source's offsets, keyed state).
    Wordcount,
    /// Sliding event-time windows counting per key (watermarks, window state, timers).
    Window,
    /// A tumbling window join of two sources (a two-input task, two gates).
    Join,
    /// A keyed process function with list state, pairing each record with its key's previous
    /// one (user state).
    Keyed,
}

impl SimJob {
    /// Every job, in the order `weir simulate` lists them.
    pub const ALL: [SimJob; 4] = [SimJob::Wordcount, SimJob::Window, SimJob::Join, SimJob::Keyed];

    /// How a seed's output must compare with the golden run's in `mode`. Under at-least-once
    /// a window may count a replayed event twice, so its count may only be higher.
    pub fn expect(self, mode: SimMode) -> Expect<Row> {
        if mode.exactly_once() || self != SimJob::Window {
            return Expect::of(mode);
        }
        Expect::Custom(Box::new(|golden: &[Row], got: &[Row]| {
            let mut best = std::collections::HashMap::new();
            for &(k, start, c) in got {
                let e = best.entry((k, start)).or_insert(0);
                *e = c.max(*e);
            }
            match golden.iter().find(|&&(k, s, c)| best.get(&(k, s)).copied().unwrap_or(0) < c) {
                None => Ok(()),
                Some(lost) => Err(format!("window (key, start, count) {lost:?} lost (at-least-once)")),
            }
        }))
    }

    /// A builder of the job at `parallelism`; `scratch` holds its input (word count's corpus,
    /// written here once).
    pub fn builder(self, parallelism: usize, scratch: &Path) -> Result<impl Fn() -> Simulated<Row>> {
        let corpus = match self {
            SimJob::Wordcount => Some(write_corpus(scratch)?),
            _ => None,
        };
        Ok(move || build(self, parallelism, corpus.as_deref()))
    }
}

impl fmt::Display for SimJob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SimJob::Wordcount => "wordcount",
            SimJob::Window => "window",
            SimJob::Join => "join",
            SimJob::Keyed => "keyed",
        })
    }
}

impl std::str::FromStr for SimJob {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        crate::error::one_of(&SimJob::ALL, s, "a simulated job")
    }
}

/// Events per source.
const EVENTS: u64 = 600;

fn build(which: SimJob, parallelism: usize, corpus: Option<&Path>) -> Simulated<Row> {
    let job = Job::new(format!("sim-{which}")).with_parallelism(parallelism);
    let out = match which {
        SimJob::Wordcount => job
            .text(TextSource::open(corpus.expect("word count has a corpus")).expect("the corpus was just written"))
            .words()
            .key_by(|w: &Word| *w)
            .aggregate(|| 0u64, |c: &mut u64, _| *c += 1, |w: &Word, c: &u64| (*w, *c))
            .named("count")
            .map(|(w, c)| (crate::record::hash_key(&w), c, 0))
            .collect_exactly_once(),
        SimJob::Window => job
            .generator(Generator::new(|i, _| (mix(i) % 7, i + mix(i ^ 99) % 40)).count(EVENTS))
            .with_watermarks(|e: &(u64, u64)| e.1, 40)
            .key_by(|e: &(u64, u64)| e.0)
            .window(Window::sliding(100, 25), |e: &(u64, u64)| e.1)
            .count()
            .named("window")
            .map(|(k, w, c)| (k, w.start, c))
            .collect_exactly_once(),
        SimJob::Join => {
            let left = job
                .generator(Generator::new(|i, _| (mix(i) % 20, i)).count(EVENTS / 2))
                .named("left")
                .with_watermarks(|e: &(u64, u64)| e.1, 0);
            let right = job
                .generator(Generator::new(|i, _| (mix(i + 5) % 20, i)).count(EVENTS / 2))
                .named("right")
                .with_watermarks(|e: &(u64, u64)| e.1, 0);
            left.window_join(
                right,
                |e: &(u64, u64)| e.0,
                |e: &(u64, u64)| e.0,
                |e: &(u64, u64)| e.1,
                |e: &(u64, u64)| e.1,
                Window::tumbling(50),
                |&k, a: &(u64, u64), b: &(u64, u64)| (k, a.1, b.1),
            )
            .named("join")
            .collect_exactly_once()
        }
        // Each key's records come from one source subtask (index i is generated by subtask
        // i % parallelism), so they reach the process function in one order in every run.
        SimJob::Keyed => job
            .generator(Generator::new(move |i, _| ((i % parallelism as u64) * 16 + mix(i) % 5, i)).count(EVENTS))
            .key_by(|e: &(u64, u64)| e.0)
            // Each record paired with its key's previous one: under at-least-once a replay
            // adds pairs and loses none.
            .process(ListState::new, |k: &u64, e: (u64, u64), last: &mut ListState<u64, u64>, out: &mut Vec<Row>| {
                if let [previous] = last.get(k) {
                    out.push((*k, *previous, e.1));
                }
                last.take(k);
                last.add(*k, e.1);
            })
            .named("pairs")
            .collect_exactly_once(),
    };
    (job, out)
}

/// Writes word count's corpus (two files of a few hundred lines) into `dir`.
fn write_corpus(dir: &Path) -> Result<PathBuf> {
    let corpus = dir.join("corpus");
    std::fs::create_dir_all(&corpus).map_err(|e| Error::io("cannot create the corpus folder", &corpus, e))?;
    let words = ["river", "weir", "dam", "log", "Barrier", "snapshot", "über", "flow", "x9"];
    for f in 0..2u64 {
        let mut text = String::new();
        for line in 0..120u64 {
            for w in 0..(mix(line * 3 + f) % 6) {
                text.push_str(words[(mix(line * 31 + w + f * 1000) % words.len() as u64) as usize]);
                text.push(' ');
            }
            text.push('\n');
        }
        let path = corpus.join(format!("f{f}.txt"));
        std::fs::write(&path, text).map_err(|e| Error::io("cannot write the corpus", &path, e))?;
    }
    Ok(corpus)
}
