//! Start-to-first-record after a crash, restoring keyed state eagerly (every page read and
//! decoded before the job runs) and lazily within a state memory budget (the task files read,
//! each page left in the checkpoint's shared files until a lookup needs it). A keyed sum over
//! `(u64, u64)` entries with incremental checkpoints runs until every key has been seen and a
//! checkpoint holds them all, and is dropped without a final checkpoint (what a SIGKILL
//! leaves); then the same job starts from the directory, and the time until its first record
//! (start returns once every operator restored; the source's first record follows) is taken,
//! with the bytes of state in memory then (the budget's count; an eager restore holds all of
//! it), and the time until the source sent a million records through the sum (what the pages
//! left behind cost once the job runs). Eager, lazy within the budget and lazy within a budget
//! the state fits in alternate on the same checkpoint.
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

/// What a restart measured: seconds to the first record, the bytes of state in memory then
/// (within a budget), and seconds from the start until the source sent [`AFTER`] records (the
/// rings before the sum hold a few thousand: backpressure keeps the two together).
struct Restart {
    first: f64,
    resident: u64,
    after: f64,
}

/// Records the restarted job counts after its first before the run ends: what the pages
/// left where they lie cost once the job runs.
const AFTER: u64 = 1_000_000;

fn restart(keys: u64, dir: &Path, budget: Option<u64>) -> Restart {
    let t = Instant::now();
    let handle = job(keys, dir).start(config(budget)).expect("restart");
    let before = handle.metrics().source_records();
    while handle.metrics().source_records() == before {
        std::hint::spin_loop();
    }
    let first = t.elapsed().as_secs_f64();
    let resident = handle.controller().state_memory().map_or(0, |m| m.resident_bytes);
    while handle.metrics().source_records() - before < AFTER {
        std::thread::sleep(Duration::from_micros(200));
    }
    let after = t.elapsed().as_secs_f64();
    assert!(handle.notes().join("\n").contains("restored from checkpoint"), "{:?}", handle.notes());
    handle.cancel();
    let _ = handle.join();
    Restart { first, resident, after }
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
    println!(
        "{:>12} {:>10} | {:>9} {:>11} | {:>9} {:>11} {:>11} | {:>9} {:>11}",
        "keys", "state MB", "eager s", "+1M rec s", "lazy s", "in mem MB", "+1M rec s", "fits s", "+1M rec s"
    );
    for k in keys {
        let scratch = tempfile::tempdir().expect("scratch");
        let bytes = leave_checkpoint(k, scratch.path(), None);
        // Eager (no budget), lazy within the budget, and lazy within a budget the state fits
        // in (its pages come back in the background), alternating, twice each: the best of two.
        let fits = Some((bytes * 8).max(budget));
        let mut runs: [Vec<Restart>; 3] = Default::default();
        for _ in 0..2 {
            for (i, b) in [None, Some(budget), fits].into_iter().enumerate() {
                runs[i].push(restart(k, scratch.path(), b));
            }
        }
        let best = |i: usize| runs[i].iter().min_by(|a, b| a.first.total_cmp(&b.first)).expect("two runs");
        let (e, l, f) = (best(0), best(1), best(2));
        println!(
            "{:>12} {:>10.1} | {:>9.3} {:>11.3} | {:>9.3} {:>11.1} {:>11.3} | {:>9.3} {:>11.3}",
            group_digits(k),
            bytes as f64 / 1e6,
            e.first,
            e.after,
            l.first,
            l.resident as f64 / 1e6,
            l.after,
            f.first,
            f.after
        );
    }
}
