//! The pace a job's checkpoint settings and restart strategy set, as the running job shows
//! it: the minimum pause between checkpoints holds however short the interval, and the
//! failure-rate restart strategy stops a job whose failures come in a burst and keeps one
//! going whose failures are further apart than its interval. Each asserts a bound the
//! engine guarantees (a pause at least so long, a restart delay at least so long), never a
//! time the machine must reach.

use std::time::Duration;

use weir::checkpoint::{CheckpointConfig, RestartStrategy};
use weir::snapshot::{Fault, FaultInjector};
use weir::source::Generator;
use weir::{Job, RunConfig};

const N: u64 = 40_000;

/// Every 40 ms at least between a checkpoint's completion and the next one's trigger, with
/// checkpoints asked for every millisecond.
#[test]
fn the_minimum_pause_holds_between_checkpoints() {
    const PAUSE_MS: f64 = 40.0;
    let dir = tempfile::tempdir().unwrap();
    let config = CheckpointConfig::new(dir.path())
        .interval(Duration::from_millis(1))
        .min_pause(Duration::from_millis(PAUSE_MS as u64));
    let job = Job::new("paced").with_checkpointing(config);
    job.generator(Generator::new(|i, _| (i % 64, 1u64)).count(u64::MAX))
        .key_by(|e: &(u64, u64)| e.0)
        .reduce(|a, b| (a.0, a.1 + b.1))
        .discard();
    let handle = job.start(RunConfig::default().workers(2)).unwrap();
    crate::common::wait_until("five checkpoints", || handle.checkpoints_completed() >= 5);
    // Those of the running job: stopping takes a final checkpoint at once, as it must (its
    // sinks commit with it).
    let stats = handle.checkpoint_stats();
    handle.stop();
    handle.join().unwrap();
    assert!(stats.len() >= 5, "{stats:?}");
    for w in stats.windows(2) {
        let completed = w[0].trigger_ms + w[0].duration_ms;
        let pause = w[1].trigger_ms - completed;
        // (Both on the job clock, whole nanoseconds: a margin for the float only.)
        assert!(
            pause >= PAUSE_MS - 1e-3,
            "checkpoint {} triggered {pause:.3} ms after checkpoint {} completed",
            w[1].id,
            w[0].id
        );
    }
}

/// A keyed running sum over `N` records, failing at the 10,000th, 20,000th and 30,000th
/// record its sum sees (over every attempt), restarting as `restart` says.
fn failing_three_times(dir: &std::path::Path, restart: RestartStrategy) -> (Job, std::sync::Arc<FaultInjector>) {
    let faults = FaultInjector::new(
        [10_000, 20_000, 30_000].map(|nth| Fault::AtRecord { operator: "sum".into(), nth }).to_vec(),
    );
    let config = CheckpointConfig::new(dir)
        .interval(Duration::from_millis(5))
        .restart(restart)
        .faults(std::sync::Arc::clone(&faults));
    let job = Job::new("failing").with_checkpointing(config);
    job.generator(Generator::new(|i, _| (i % 64, 1u64)).count(N))
        .key_by(|e: &(u64, u64)| e.0)
        .reduce(|a, b| (a.0, a.1 + b.1))
        .named("sum")
        .discard();
    (job, faults)
}

/// Three failures within an hour, two allowed: the third fails the job, after two restarts.
#[test]
fn the_failure_rate_strategy_stops_a_burst_of_failures() {
    let dir = tempfile::tempdir().unwrap();
    let burst = RestartStrategy::FailureRate {
        max_failures: 2,
        interval: Duration::from_secs(3600),
        delay: Duration::from_millis(1),
    };
    let (job, faults) = failing_three_times(dir.path(), burst);
    let mut handle = job.start(RunConfig::default().workers(2)).unwrap();
    let result = crate::common::finish(&mut handle);
    assert_eq!(faults.fired(), 3);
    assert!(result.is_err(), "a third failure within the interval fails the job");
    assert_eq!(handle.restarts(), 2, "{:?}", handle.notes());
}

/// The same three failures, one allowed per millisecond and 30 ms between a failure and its
/// restart: no two fall within the interval, so the job restarts each time and finishes.
#[test]
fn the_failure_rate_strategy_keeps_a_job_whose_failures_are_spread_out() {
    let dir = tempfile::tempdir().unwrap();
    let spread = RestartStrategy::FailureRate {
        max_failures: 1,
        interval: Duration::from_millis(1),
        delay: Duration::from_millis(30),
    };
    let (job, faults) = failing_three_times(dir.path(), spread);
    let report = job.execute(RunConfig::default().workers(2)).unwrap();
    assert_eq!(faults.fired(), 3);
    assert_eq!(report.restarts, 3);
    assert!(report.source_records >= N, "{} records", report.source_records);
}
