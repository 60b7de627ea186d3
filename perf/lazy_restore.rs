//! Start-to-first-record after a crash, restoring keyed state eagerly (every page read and
//! decoded before the job runs) and lazily within a state memory budget (the task files read,
//! each page left in the checkpoint's shared files until a lookup needs it). A keyed sum over
//! `(u64, u64)` entries with incremental checkpoints runs until every key has been seen and a
//! checkpoint holds them all, and is dropped without a final checkpoint (what a SIGKILL
//! leaves); then the same job starts from the directory, and the time until its first record
//! (start returns once every operator restored; the source's first record follows) is taken,
//! with the bytes of state in memory then (the budget's count; an eager restore holds all of
//! it). Eager and lazy alternate on the same checkpoint.
//!
//! `cargo bench --bench lazy_restore -- [--keys 1500000,25000000] [--budget-mib 64]`

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::path::Path;
use std::time::{Duration, Instant};

use weir::checkpoint::{CheckpointConfig, CheckpointStorage};
use weir::metrics::group_digits;
use weir::source::Generator;
use weir::{Job, RunConfig};

/// The keyed sum over `keys` keys, checkpoints incremental and only when asked.
fn job(keys: u64, dir: &Path) -> Job {
    let config = CheckpointConfig::new(dir).interval(Duration::from_secs(3600)).incremental(true).local_recovery(false);
    let job = Job::new("lazy-restore-bench").with_parallelism(2).with_checkpointing(config);
    job.generator(Generator::new(move |i, _| (i % keys, 1u64)))
        .key_by(|e: &(u64, u64)| e.0)
        .aggregate(|| 0u64, |c: &mut u64, e| *c += e.1, |k: &u64, c: &u64| (*k, *c))
        .named("sum")
        .discard();
    job
}

fn config(budget: Option<u64>) -> RunConfig {
    let c = RunConfig::default().pin_workers(true).workers(2);
    match budget {
        Some(b) => c.state_memory(b),
        None => c,
    }
}

/// Runs the sum until every key was seen, checkpoints it, and drops it without another.
/// Returns the bytes of state the checkpoint holds.
fn leave_checkpoint(keys: u64, dir: &Path, budget: Option<u64>) -> u64 {
    let handle = job(keys, dir).start(config(budget)).expect("start");
    while handle.metrics().source_records() < keys {
        std::thread::sleep(Duration::from_millis(5));
    }
    let id = handle.trigger_checkpoint().expect("a checkpoint");
    while handle.checkpoints_completed() == 0 {
        std::thread::sleep(Duration::from_millis(5));
    }
    handle.cancel();
    let _ = handle.join();
    let m = CheckpointStorage::new(dir).metadata(id).expect("the checkpoint completed");
    m.tasks.iter().map(|t| t.bytes).sum::<u64>() + m.shared.iter().map(|s| s.bytes).sum::<u64>()
}

/// Seconds from the start to the first record, and the bytes of state in memory then (within
/// a budget).
fn restart(keys: u64, dir: &Path, budget: Option<u64>) -> (f64, u64) {
    let t = Instant::now();
    let handle = job(keys, dir).start(config(budget)).expect("restart");
    let before = handle.metrics().source_records();
    while handle.metrics().source_records() == before {
        std::hint::spin_loop();
    }
    let seconds = t.elapsed().as_secs_f64();
    let resident = handle.controller().state_memory().map_or(0, |m| m.resident_bytes);
    assert!(handle.notes().join("\n").contains("restored from checkpoint"), "{:?}", handle.notes());
    handle.cancel();
    let _ = handle.join();
    (seconds, resident)
}

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let keys: Vec<u64> = flag(&args, "--keys")
        .unwrap_or_else(|| "1500000,25000000".into())
        .split(',')
        .map(|k| k.parse().expect("--keys takes numbers, comma-separated"))
        .collect();
    let budget =
        flag(&args, "--budget-mib").map_or(64, |b| b.parse::<u64>().expect("--budget-mib takes a number")) << 20;
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("start to first record after a crash; budget {} MiB; load average before: {}", budget >> 20, load.trim());
    println!("{:>12} {:>12} {:>10} {:>10} {:>16}", "keys", "state MB", "eager s", "lazy s", "lazy in memory MB");
    for k in keys {
        let scratch = tempfile::tempdir().expect("scratch");
        let bytes = leave_checkpoint(k, scratch.path(), None);
        // Alternating, twice each: the second pair runs on warm page caches as the first.
        let mut eager = Vec::new();
        let mut lazy = Vec::new();
        for _ in 0..2 {
            eager.push(restart(k, scratch.path(), None));
            lazy.push(restart(k, scratch.path(), Some(budget)));
        }
        let best = |runs: &[(f64, u64)]| runs.iter().copied().fold((f64::MAX, 0), |a, r| if r.0 < a.0 { r } else { a });
        let (e, l) = (best(&eager), best(&lazy));
        println!(
            "{:>12} {:>12.1} {:>10.3} {:>10.3} {:>16.1}",
            group_digits(k),
            bytes as f64 / 1e6,
            e.0,
            l.0,
            l.1 as f64 / 1e6
        );
    }
}
