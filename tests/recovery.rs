//! Failure injection on real threads: seeded failure schedules (several failures per run,
//! during snapshots, right after recovery, declined checkpoints) over word count, a windowed
//! count and a window join, at parallelism 2 to 4 on 2 workers, with full and incremental
//! checkpoints. Exactly-once runs must produce exactly the failure-free output; at-least-once
//! runs must lose nothing. Nothing here depends on timing: how many checkpoints complete
//! between two failures is the machine's business, and every outcome must give the same
//! output. Which interleavings of checkpoints and failures happen is proved from seeds by
//! the simulator (`tests/simulation.rs`), not here.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use weir::checkpoint::{CheckpointConfig, CheckpointMode, RestartStrategy};
use weir::prng::mix;
use weir::sink::CommittedOutput;
use weir::snapshot::{Fault, FaultInjector};
use weir::source::{Generator, TextSource};
use weir::{Job, RunConfig, Window, Word};

/// The jobs under test. Each returns its committed output, as comparable rows.
#[derive(Clone, Copy, Debug)]
enum Workload {
    WordCount,
    WindowedCount,
    Join,
}

type Row = (u64, u64, u64);

const EVENTS: u64 = 40_000;

fn build(w: Workload, job: &Job, corpus: &Path) -> (CommittedOutput<Row>, &'static str) {
    match w {
        Workload::WordCount => {
            let out = job
                .text(TextSource::open(corpus).unwrap())
                .words()
                .key_by(|w: &Word| w.clone())
                .aggregate(|| 0u64, |c: &mut u64, _| *c += 1, |w: &Word, c: &u64| (w.clone(), *c))
                .named("count")
                .map(|(w, c)| (weir::record::hash_key(&w), c, 0))
                .collect_exactly_once();
            (out, "count")
        }
        Workload::WindowedCount => {
            let out = job
                .generator(Generator::new(|i, _| (mix(i) % 17, i + mix(i ^ 99) % 40)).count(EVENTS))
                .with_watermarks(|e: &(u64, u64)| e.1, 40)
                .key_by(|e: &(u64, u64)| e.0)
                .window(Window::sliding(2000, 500), |e: &(u64, u64)| e.1)
                .count()
                .named("window")
                .map(|(k, w, c)| (k, w.start, c))
                .collect_exactly_once();
            (out, "window")
        }
        Workload::Join => {
            let l = job
                .generator(Generator::new(|i, _| (mix(i) % 300, i)).count(EVENTS / 2))
                .with_watermarks(|e: &(u64, u64)| e.1, 0);
            let r = job
                .generator(Generator::new(|i, _| (mix(i + 5) % 300, i)).count(EVENTS / 2))
                .with_watermarks(|e: &(u64, u64)| e.1, 0);
            let out = l
                .window_join(
                    r,
                    |e: &(u64, u64)| e.0,
                    |e: &(u64, u64)| e.0,
                    |e: &(u64, u64)| e.1,
                    |e: &(u64, u64)| e.1,
                    Window::tumbling(1000),
                    |&k, a: &(u64, u64), b: &(u64, u64)| (k, a.1, b.1),
                )
                .named("join")
                .collect_exactly_once();
            (out, "join")
        }
    }
}

fn write_corpus(dir: &Path) {
    let words = ["river", "weir", "dam", "log", "Barrier", "snapshot", "über", "flow", "x9"];
    for f in 0..2 {
        let mut text = String::new();
        for line in 0..60_000u64 {
            for w in 0..(mix(line * 3 + f) % 7) {
                text.push_str(words[(mix(line * 31 + w + f * 1000) % words.len() as u64) as usize]);
                text.push(' ');
            }
            text.push('\n');
        }
        std::fs::write(dir.join(format!("f{f}.txt")), text).unwrap();
    }
}

fn run(w: Workload, p: usize, corpus: &Path, checkpointing: Option<CheckpointConfig>) -> (Vec<Row>, u32, Vec<String>) {
    let mut job = Job::new(format!("{w:?}")).with_parallelism(p);
    if let Some(c) = checkpointing {
        job = job.with_checkpointing(c);
    }
    let (out, _) = build(w, &job, corpus);
    let mut handle = job.start(RunConfig::default().workers(2)).unwrap();
    let report = handle.wait().unwrap_or_else(|e| panic!("{w:?} at p={p}: {e}; notes: {:?}", handle.notes()));
    let mut rows = out.records();
    rows.sort_unstable();
    let mut notes = handle.notes().to_vec();
    notes.extend(handle.checkpoint_failures().iter().map(ToString::to_string));
    notes.push(format!("{} checkpoints completed", report.checkpoints.len()));
    (rows, report.restarts, notes)
}

/// A seeded failure schedule: failures at records (one right after the first), during the
/// synchronous and asynchronous parts of snapshots, and a declined checkpoint.
fn schedule(seed: u64, operator: &str, records: u64) -> Vec<Fault> {
    // Record counts run over all attempts, and at most one record fault fires per attempt.
    let first = records / 3 + mix(seed) % (records / 6);
    let second = first + records / 3;
    vec![
        Fault::AtRecord { operator: operator.into(), nth: first },
        Fault::AtRecord { operator: operator.into(), nth: second },
        // Right after the second recovery.
        Fault::AtRecord { operator: operator.into(), nth: second + 20 + mix(seed + 1) % 100 },
        Fault::SyncSnapshot { checkpoint: 1 + mix(seed + 2) % 3 },
        Fault::AsyncSnapshot { checkpoint: 2 + mix(seed + 3) % 3 },
        Fault::Decline { checkpoint: 1 + mix(seed + 4) % 4 },
        // The first task polled after the first restore fails before it got anywhere.
        Fault::RightAfterRestore { restart: 1 },
    ]
}

fn checkpointed(dir: &Path, mode: CheckpointMode, faults: Arc<FaultInjector>) -> CheckpointConfig {
    CheckpointConfig::new(dir)
        .interval(Duration::from_millis(5))
        .mode(mode)
        .tolerable_failed_checkpoints(100)
        .retained(2)
        .restart(RestartStrategy::FixedDelay { attempts: 20, delay: Duration::from_millis(1) })
        .faults(faults)
}

/// At-least-once: nothing is missing. Replays may add rows, and windows may count a replayed
/// event twice, so a window's count may only be higher.
fn check_nothing_lost(w: Workload, golden: &[Row], got: &[Row], p: usize) {
    match w {
        Workload::WindowedCount => {
            let mut best: HashMap<(u64, u64), u64> = HashMap::new();
            for &(k, s, c) in got {
                let e = best.entry((k, s)).or_insert(0);
                *e = (*e).max(c);
            }
            for &(k, s, c) in golden {
                assert!(best.get(&(k, s)).copied().unwrap_or(0) >= c, "{w:?} p={p}: at-least-once lost window {k}/{s}");
            }
        }
        _ => {
            let (g, o) = (multiset(golden), multiset(got));
            for (row, n) in g {
                assert!(o.get(&row).copied().unwrap_or(0) >= n.min(1), "{w:?} p={p}: at-least-once lost {row:?}");
            }
        }
    }
}

fn multiset(rows: &[Row]) -> HashMap<Row, usize> {
    let mut m = HashMap::new();
    for r in rows {
        *m.entry(*r).or_insert(0) += 1;
    }
    m
}

fn check_workload(w: Workload, records: u64) {
    let corpus = tempfile::tempdir().unwrap();
    write_corpus(corpus.path());
    for (p, seed) in [(2, 1u64), (3, 2), (4, 3)] {
        let (golden, _, _) = run(w, p, corpus.path(), None);
        assert!(!golden.is_empty());
        // Aligned, unaligned, aligned turning unaligned after 1 ms, at-least-once.
        let modes = [
            CheckpointMode::Aligned,
            CheckpointMode::Unaligned,
            CheckpointMode::AlignedTimeout { timeout: Duration::from_millis(1) },
            CheckpointMode::AtLeastOnce,
        ];
        for (i, mode) in modes.into_iter().enumerate() {
            // Every mode runs with full and with incremental checkpoints across the three
            // parallelisms.
            let incremental = (p + i) % 2 == 0;
            let dir = tempfile::tempdir().unwrap();
            let (_, operator) = build(w, &Job::new("probe"), corpus.path());
            let faults = FaultInjector::new(schedule(seed, operator, records));
            let config = checkpointed(dir.path(), mode, Arc::clone(&faults)).incremental(incremental);
            let (got, restarts, notes) = run(w, p, corpus.path(), Some(config));
            let name = format!("{w:?} p={p} {mode} incremental={incremental}");
            assert!(restarts >= 2, "{name}: the schedule should force restarts ({restarts}): {notes:?}");
            assert!(faults.fired() >= 3, "{name}: only {} faults fired", faults.fired());
            if mode.exactly_once() {
                assert_eq!(got.len(), golden.len(), "{name}: row count; {notes:?}");
                assert!(got == golden, "{name}: output differs from the failure-free run");
            } else {
                check_nothing_lost(w, &golden, &got, p);
            }
        }
    }
}

#[test]
fn word_count_recovers_exactly_once() {
    check_workload(Workload::WordCount, 240_000);
}

#[test]
fn windowed_count_recovers_exactly_once() {
    check_workload(Workload::WindowedCount, EVENTS);
}

#[test]
fn window_join_recovers_exactly_once() {
    check_workload(Workload::Join, EVENTS);
}

/// Every line of the files under `dir` (all partitions, all subtasks), sorted.
fn lines_under(dir: &Path) -> Vec<String> {
    let mut lines = Vec::new();
    let mut folders = vec![dir.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
            } else {
                let partition = path.parent().unwrap().strip_prefix(dir).unwrap().display().to_string();
                let text = std::fs::read_to_string(&path).unwrap();
                lines.extend(text.lines().map(|l| format!("{partition}: {l}")));
            }
        }
    }
    lines.sort_unstable();
    lines
}

/// Numbers through an operator named `copy` into files partitioned by the number's remainder
/// by 7 and by its thousand, under the failure schedule of the other workloads: the files
/// hold what a failure-free run writes, each line once.
#[test]
fn partitioned_files_recover_exactly_once() {
    let write = |p: usize, checkpointing: Option<CheckpointConfig>, out: &Path| {
        let mut job = Job::new("partitioned").with_parallelism(p);
        if let Some(c) = checkpointing {
            job = job.with_checkpointing(c);
        }
        let numbers = Generator::new(|i, _| i).count(EVENTS).rate(100_000.0);
        job.generator(numbers).map(|i| i).named("copy").write_files_partitioned(
            out,
            |i: &u64, part: &mut String| part.push_str(&format!("r={}/k={}", i % 7, i / 1000)),
            |i: &u64, o: &mut Vec<u8>| o.extend_from_slice(format!("{i}\n").as_bytes()),
        );
        job.execute(RunConfig::default().workers(2)).unwrap()
    };
    for (p, seed) in [(2, 4u64), (3, 5)] {
        let golden_dir = tempfile::tempdir().unwrap();
        write(p, None, golden_dir.path());
        let golden = lines_under(golden_dir.path());
        assert_eq!(golden.len(), EVENTS as usize);
        let (chk, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let faults = FaultInjector::new(schedule(seed, "copy", EVENTS));
        let report = write(p, Some(checkpointed(chk.path(), CheckpointMode::Aligned, Arc::clone(&faults))), out.path());
        assert!(report.restarts >= 2, "p={p}: the schedule should force restarts ({})", report.restarts);
        assert!(faults.fired() >= 3, "p={p}: only {} faults fired", faults.fired());
        let got = lines_under(out.path());
        assert_eq!(got.len(), golden.len(), "p={p}: line count");
        assert!(got == golden, "p={p}: the files differ from the failure-free run's");
    }
}
