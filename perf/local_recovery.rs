//! Restart after a task failure, with local recovery against without: a keyed running sum
//! over `--keys` u64 keys (20,000,000 by default: 2^25 slots of 32 bytes, 1 GiB of pages)
//! loads every key, takes a checkpoint, then a task fails (a map panics on a flag the bench
//! sets) and the job restarts in the same process. Timed: from the failure to the restarted
//! attempt running (its operators restored), with the restart strategy's delay at zero — the
//! failed attempt's teardown, recovery and the restore. Alternating rounds, local recovery on
//! and off, each a fresh job. Round 0 also pays the process's first panic (about 60 ms of
//! one-off start-up), so read the later rounds.
//!
//! `cargo bench --bench local_recovery -- [--keys N] [--rounds N] [--only memory|files]`

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir::checkpoint::{CheckpointConfig, RestartStrategy};
use weir::metrics::group_digits;
use weir::source::Generator;
use weir::{Job, RunConfig};

/// One round: seconds from the failure to the restarted attempt, and where it restored from.
fn round(keys: u64, local: bool) -> (f64, f64, String) {
    let scratch = tempfile::tempdir_in(common::target_dir()).expect("scratch");
    let config = CheckpointConfig::new(scratch.path())
        .interval(Duration::from_secs(3600))
        .local_recovery(local)
        .restart(RestartStrategy::FixedDelay { attempts: 3, delay: Duration::ZERO });
    let job = Job::new("local-recovery-bench").with_checkpointing(config);
    let fail = Arc::new(AtomicBool::new(false));
    let failing = Arc::clone(&fail);
    job.generator(Generator::new(move |i, _| (i % keys, 1u64)))
        .map(move |r: (u64, u64)| {
            if failing.swap(false, Ordering::Relaxed) {
                panic!("the bench's failure");
            }
            r
        })
        .key_by(|r: &(u64, u64)| r.0)
        .reduce(|a, b| (a.0, a.1 + b.1))
        .named("sum")
        .discard();
    let handle = job.start(RunConfig::default().pin_workers(true).workers(2)).expect("start");
    while handle.metrics().source_records() < keys {
        std::thread::sleep(Duration::from_millis(5));
    }
    let t = Instant::now();
    handle.trigger_checkpoint().expect("checkpoint");
    let checkpoint_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    fail.store(true, Ordering::Relaxed);
    while handle.restarts() == 0 {
        std::thread::sleep(Duration::from_micros(100));
    }
    let restart_s = t.elapsed().as_secs_f64();
    let from = handle.last_restore().map_or_else(|| "nothing".to_string(), |r| r.from.to_string());
    handle.cancel();
    let _ = handle.join();
    (restart_s, checkpoint_s, from)
}

fn main() {
    let (keys, rounds): (u64, u64) = (common::flag("--keys", 20_000_000), common::flag("--rounds", 3));
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("restart after a task failure, {} keys; load average before: {}", group_digits(keys), load.trim());
    println!("{:>6} {:>16} {:>12} {:>14}", "round", "local recovery", "restart ms", "checkpoint s");
    let kinds: &[bool] = match common::flag("--only", String::new()).as_str() {
        "memory" => &[true],
        "files" => &[false],
        "" => &[true, false],
        other => panic!("--only takes memory or files, not {other}"),
    };
    for r in 0..rounds {
        for &local in kinds {
            let (restart_s, checkpoint_s, from) = round(keys, local);
            let expected = if local { "memory" } else { "files" };
            assert_eq!(from, expected, "round {r}: restored from {from}");
            println!(
                "{r:>6} {:>16} {:>12.1} {checkpoint_s:>14.2}",
                if local { "on (memory)" } else { "off (files)" },
                restart_s * 1e3
            );
        }
    }
}
