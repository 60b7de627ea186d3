//! `weir wordcount` against a plain single-threaded Rust word count, in one run, on a generated
//! corpus (kept under `target/` between runs):
//!
//! 1. the baseline: read the files line by line, split on non-alphanumeric characters,
//!    lowercase, `HashMap<String, u64>` update; no framework, no output;
//! 2. weir's word count (the job `weir wordcount` runs) at parallelism 2 without checkpoints,
//!    writing every running count to files;
//! 3. the same with exactly-once checkpoints every second, writing through the
//!    two-phase-commit file sink (what `weir wordcount --checkpoint-dir` does);
//! 4. run 2 on owned `String` words instead of `weir::Word` (`weir_jobs::wordcount::wordcount_strings`).
//!
//! The corpus is read once before timing; the weir runs alternate twice, the baseline runs
//! twice after them, and the faster run of each counts.
//!
//! `cargo bench --bench wordcount -- [--gib G] [--interval-ms N] [--skip-baseline]`

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use weir::checkpoint::{CheckpointConfig, CheckpointMode};
use weir::metrics::group_digits;
use weir::source::TextSource;
use weir::RunConfig;

mod common;
use common::corpus;

fn arg<T: std::str::FromStr>(args: &[String], name: &str) -> Option<T> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|s| s.parse().ok())
}

/// The plain word count: what one would write without a framework.
fn baseline(files: &[PathBuf]) -> (Duration, u64, usize) {
    let start = Instant::now();
    let mut counts: HashMap<String, u64> = HashMap::new();
    let mut words = 0u64;
    for f in files {
        let reader = BufReader::with_capacity(1 << 20, std::fs::File::open(f).expect("corpus"));
        for line in reader.lines() {
            let line = line.expect("read");
            for w in line.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()) {
                words += 1;
                let lower;
                let w = if w.chars().any(char::is_uppercase) {
                    lower = w.to_lowercase();
                    lower.as_str()
                } else {
                    w
                };
                match counts.get_mut(w) {
                    Some(c) => *c += 1,
                    None => {
                        counts.insert(w.to_owned(), 1);
                    }
                }
            }
        }
    }
    (start.elapsed(), words, counts.len())
}

/// Which word type the weir run counts.
#[derive(Clone, Copy, PartialEq)]
enum Words {
    /// `weir::Word`: 32 bytes, inline up to 28 bytes.
    Word,
    /// Owned `String`s (no checkpoints).
    Strings,
}

fn weir_wordcount(input: &Path, out: &Path, checkpoints: Option<(&Path, u64)>, words: Words) -> (Duration, u64, usize) {
    let _ = std::fs::remove_dir_all(out);
    let source = TextSource::open(input).expect("corpus");
    let mut job = match words {
        Words::Word => weir_jobs::wordcount::wordcount(source, out.into(), 2, checkpoints.is_some()),
        Words::Strings => weir_jobs::wordcount::wordcount_strings(source, out.into(), 2),
    };
    if let Some((dir, ms)) = checkpoints {
        let _ = std::fs::remove_dir_all(dir);
        job = job.with_checkpointing(
            CheckpointConfig::new(dir).interval(Duration::from_millis(ms)).mode(CheckpointMode::Aligned),
        );
    }
    let report = job.execute(RunConfig::default().pin_workers(true).workers(2)).expect("word count runs");
    let _ = std::fs::remove_dir_all(out);
    (report.elapsed, report.sink_records, report.checkpoints.len())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let gib: f64 = arg(&args, "--gib").unwrap_or(1.0);
    let interval: u64 = arg(&args, "--interval-ms").unwrap_or(1000);
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("wordcount");
    let bytes = (gib * (1u64 << 30) as f64) as u64;
    let input = root.join("corpus");
    let files = corpus(&input, bytes);
    let total: u64 = files.iter().map(|f| std::fs::metadata(f).map_or(0, |m| m.len())).sum();
    let mb = total as f64 / 1e6;
    println!("## word count over {} bytes ({} files), 2 workers\n", group_digits(total), files.len());
    println!("| run | time | input MB/s | words | throughput ÷ weir without checkpoints |\n|---|---|---|---|---|");
    // Every file read once first, so no run pays for a cold page cache; then the two weir
    // runs alternate twice and the faster of each counts.
    for f in &files {
        std::io::copy(&mut std::fs::File::open(f).expect("corpus"), &mut std::io::sink()).expect("warm-up read");
    }
    let mut best: [Option<(Duration, u64, usize)>; 3] = [None, None, None];
    let runs = [(None, Words::Word), (Some((root.join("chk"), interval)), Words::Word), (None, Words::Strings)];
    for _ in 0..2 {
        for (i, (checkpoints, kind)) in runs.iter().enumerate() {
            let r = weir_wordcount(
                &input,
                &root.join("out"),
                checkpoints.as_ref().map(|(d, ms)| (d.as_path(), *ms)),
                *kind,
            );
            if best[i].is_none_or(|b| r.0 < b.0) {
                best[i] = Some(r);
            }
        }
    }
    let [Some((none, words, _)), Some((with, words_c, completed)), Some((strings, words_s, _))] = best else {
        unreachable!("all ran")
    };
    assert_eq!(words, words_c, "both runs count every word");
    assert_eq!(words, words_s, "the String run counts every word");
    let row = |name: &str, d: Duration, words: u64, base: Duration| {
        println!(
            "| {name} | {:.2} s | {:.0} | {} | {:.2} |",
            d.as_secs_f64(),
            mb / d.as_secs_f64(),
            group_digits(words),
            base.as_secs_f64() / d.as_secs_f64()
        )
    };
    row("weir, p=2, no checkpoints", none, words, none);
    row(&format!("weir, p=2, exactly-once every {interval} ms ({completed} completed)"), with, words, none);
    row("weir, p=2, owned String words, no checkpoints", strings, words_s, none);
    if !args.iter().any(|a| a == "--skip-baseline") {
        // Best of two as well, so neither side gets more chances than the other.
        let (plain, plain_words, distinct) = (0..2).map(|_| baseline(&files)).min_by_key(|r| r.0).expect("two runs");
        assert_eq!(plain_words, words, "the baseline splits words as weir does");
        row("plain single-threaded Rust", plain, plain_words, none);
        println!(
            "\nweir with checkpoints ÷ without: {:.2}; weir with checkpoints ÷ plain Rust: {:.2} ({} distinct words)",
            none.as_secs_f64() / with.as_secs_f64(),
            plain.as_secs_f64() / with.as_secs_f64(),
            group_digits(distinct as u64)
        );
    }
}
