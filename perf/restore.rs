//! Restore time of keyed state against the number of keys: a keyed count over N distinct
//! `String` words is stopped with a savepoint, then started again from it, and the time of
//! the start (reading and checking the files, decoding, rebuilding every key's state: what a
//! restarting process spends before "restored from") is taken. At the same parallelism (1 to
//! 1: the state goes back whole) and at another (1 to 2: every key is routed to its new
//! subtask). Prints the curve: seconds and nanoseconds per key, from 100,000 keys up.
//!
//! `cargo bench --bench restore -- [--max-keys N]` (default 4,000,000)

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use weir::checkpoint::CheckpointConfig;
use weir::metrics::group_digits;
use weir::source::Generator;
use weir::{Job, RunConfig, Stopped};

/// The keyed count: `keys` distinct words, over and over.
fn job(keys: u64, parallelism: usize, dir: &Path) -> Job {
    let config = CheckpointConfig::new(dir).interval(Duration::from_secs(3600));
    let job = Job::new("restore-bench").with_parallelism(parallelism).with_checkpointing(config);
    job.generator(Generator::new(move |i, _| (format!("word-{}", i % keys), 1u64)))
        .key_by(|e: &(String, u64)| e.0.clone())
        .aggregate(|| 0u64, |c: &mut u64, e| *c += e.1, |k: &String, c: &u64| (k.clone(), *c))
        .named("count")
        .discard();
    job
}

/// Runs the count until every key has been seen, then stops it with a savepoint.
fn savepoint(keys: u64, scratch: &Path) -> PathBuf {
    let handle =
        job(keys, 1, &scratch.join("first")).start(RunConfig::default().pin_workers(true).workers(2)).expect("start");
    while handle.metrics().source_records() < keys {
        std::thread::sleep(Duration::from_millis(5));
    }
    match handle.stop_with_savepoint(scratch.join("savepoints")).expect("savepoint") {
        Stopped::Savepoint(path) => path,
        Stopped::Finished(_) | Stopped::Drained { .. } => {
            unreachable!("the generator never ends, and no drain was asked")
        }
    }
}

/// Seconds to start from `savepoint` at `parallelism` (the start returns once every operator
/// has restored).
fn restore(keys: u64, parallelism: usize, savepoint: &Path, dir: &Path) -> f64 {
    let job = job(keys, parallelism, dir).restore_from(savepoint, false);
    let t = Instant::now();
    let handle = job.start(RunConfig::default().pin_workers(true).workers(2)).expect("restart");
    let seconds = t.elapsed().as_secs_f64();
    let notes = handle.notes().join("\n");
    assert!(notes.contains("restored from savepoint"), "{notes}");
    handle.cancel();
    let _ = handle.join();
    seconds
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let max_keys = args
        .iter()
        .position(|a| a == "--max-keys")
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse::<u64>().expect("--max-keys takes a number"))
        .unwrap_or(4_000_000);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("restore of a keyed count's state (String keys); load average before: {}", load.trim());
    println!("{:>10} {:>10} {:>12} {:>10} {:>12}", "keys", "1 → 1 s", "ns/key", "1 → 2 s", "ns/key");
    for keys in [100_000u64, 200_000, 400_000, 1_000_000, 2_000_000, 4_000_000].into_iter().filter(|&k| k <= max_keys) {
        let scratch = tempfile::tempdir().expect("scratch");
        let sp = savepoint(keys, scratch.path());
        let same = restore(keys, 1, &sp, &scratch.path().join("same"));
        let other = restore(keys, 2, &sp, &scratch.path().join("other"));
        println!(
            "{:>10} {same:>10.3} {:>12.0} {other:>10.3} {:>12.0}",
            group_digits(keys),
            same * 1e9 / keys as f64,
            other * 1e9 / keys as f64
        );
    }
}
