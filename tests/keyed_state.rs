//! Keyed state in running jobs: incremental checkpoints of a state loaded once and then touched
//! at a few keys write far less than its size, and jobs failing over from incremental chains
//! (an aggregate, and a user function over `MapState` and `ListState`) produce exactly the
//! failure-free output.

use std::time::Duration;

use weir::checkpoint::{CheckpointConfig, RestartStrategy};
use weir::snapshot::{Fault, FaultInjector};
use weir::source::Generator;
use weir::state::{ListState, MapState};
use weir::{Job, RunConfig};

use crate::common::PausingSource;

const KEYS: u64 = 60_000;
const EVENTS: u64 = 120_000;

/// Records 0..KEYS create one key each; later records update ten hot keys.
fn key(i: u64) -> u64 {
    if i < KEYS {
        i
    } else {
        i % 10
    }
}

/// Which sums reach the sink: every new key's, and about one in 64 of a hot key's. The sink's
/// pending output is checkpointed whole, so passing every hot-key update would put bytes
/// proportional to the time between checkpoints (longer on a slow machine) beside the few
/// changed pages that the test measures. A lost or repeated record still shifts every later
/// sum of its key, so the rows kept still tell an exact run from a wrong one.
fn kept(&(k, sum): &(u64, u64)) -> bool {
    k >= 10 || sum % 64 == 0
}

/// The rows a correct run produces, sorted: `kept` running sums per key.
fn expected_sums() -> Vec<(u64, u64)> {
    let mut sums = std::collections::HashMap::new();
    let mut rows = Vec::new();
    for i in 0..EVENTS {
        let sum = sums.entry(key(i)).or_insert(0u64);
        *sum += i;
        rows.push((key(i), *sum));
    }
    rows.retain(kept);
    rows.sort_unstable();
    rows
}

fn run(checkpointing: Option<CheckpointConfig>) -> (Vec<(u64, u64)>, weir::JobReport) {
    let mut job = Job::new("incremental").with_parallelism(2);
    // With checkpoints, the source pauses for them (see `PausingSource`): once every key
    // exists, then before each failure (so recovery reads a full checkpoint and incremental
    // ones on top of it), and at the end until three have completed while nothing changes
    // (the test looks for two that wrote almost nothing; the first after a restart is full).
    let mut pauses: &'static [(u64, u32)] = &[];
    if let Some(c) = checkpointing {
        job = job.with_checkpointing(c);
        pauses = &[(KEYS, 1), (KEYS + 6_000, 1), (KEYS + 17_000, 1), (EVENTS, 3)];
    }
    let out = job
        .source(move |ctx| Ok(PausingSource::new(|i| (key(i), i), EVENTS, pauses, ctx)))
        .key_by(|e: &(u64, u64)| e.0)
        .aggregate(|| 0u64, |s: &mut u64, e| *s += e.1, |k: &u64, s: &u64| (*k, *s))
        .named("sum")
        .filter(kept)
        .collect_exactly_once();
    run_collected(job, out)
}

/// Runs `job` to the end on 2 workers; its committed output, sorted, and its report.
fn run_collected<T: Ord + Clone>(job: Job, out: weir::sink::CommittedOutput<T>) -> (Vec<T>, weir::JobReport) {
    let report = job.execute(RunConfig::default().workers(2)).unwrap();
    let mut rows = out.records();
    rows.sort_unstable();
    (rows, report)
}

#[test]
fn incremental_checkpoints_write_only_changed_pages_and_recover_exactly() {
    let (golden, _) = run(None);
    assert!(golden == expected_sums(), "the failure-free run's sums differ from the ones computed here");
    let dir = tempfile::tempdir().unwrap();
    let faults = FaultInjector::new(vec![
        Fault::AtRecord { operator: "sum".into(), nth: KEYS + 12_000 },
        Fault::AtRecord { operator: "sum".into(), nth: KEYS + 22_000 },
    ]);
    let config = CheckpointConfig::new(dir.path())
        .interval(Duration::from_millis(20))
        .incremental(true)
        .retained(2)
        .tolerable_failed_checkpoints(100)
        .restart(RestartStrategy::FixedDelay { attempts: 5, delay: Duration::from_millis(1) })
        .faults(std::sync::Arc::clone(&faults));
    let (got, report) = run(Some(config));
    assert_eq!(faults.fired(), 2);
    assert_eq!(report.restarts, 2);
    assert!(got == golden, "output after failures from incremental checkpoints differs from the failure-free run");
    // Once every key exists, a checkpoint writes the hot pages only.
    let big = report.checkpoints.iter().map(|c| c.state_bytes).max().unwrap();
    let small = report.checkpoints.iter().filter(|c| c.state_bytes * 2 > big && c.written_bytes * 10 < c.state_bytes);
    assert!(
        small.count() >= 2,
        "no incremental checkpoint wrote under a tenth of the state: {:?}",
        report.checkpoints.iter().map(|c| (c.state_bytes, c.written_bytes)).collect::<Vec<_>>()
    );
    // Retention left only what the retained checkpoints name.
    let storage = weir::checkpoint::CheckpointStorage::new(dir.path());
    let complete: Vec<u64> = storage.list().into_iter().filter(|&id| storage.is_complete(id)).collect();
    assert!(complete.len() <= 2, "{complete:?}");
    let named: std::collections::HashSet<String> =
        complete.iter().flat_map(|&id| storage.metadata(id).unwrap().shared.into_iter().map(|s| s.file)).collect();
    let on_disk = std::fs::read_dir(dir.path().join(weir::checkpoint::SHARED_DIR)).map_or(0, |d| d.count());
    eprintln!("{on_disk} shared files on disk, {} named by retained checkpoints", named.len());
    // A checkpoint aborted as the job ended may have had writers still running.
    assert!(on_disk <= named.len() + 2, "{on_disk} shared files for {} named", named.len());
    for id in complete {
        storage.load(id).unwrap();
    }
}

/// Per key: the number of distinct values seen (MapState), and every third value's sum of the
/// last three (ListState).
fn distinct(checkpointing: Option<CheckpointConfig>) -> (Vec<(u64, u64, u64)>, weir::JobReport) {
    let mut job = Job::new("distinct").with_parallelism(3);
    if let Some(c) = checkpointing {
        job = job.with_checkpointing(c);
    }
    type S = (MapState<u64, u64, u64>, ListState<u64, u64>);
    let out = job
        // A key's records all come from one source subtask (key ≡ i mod 3), so their order,
        // and so every output row, is the same in every run.
        .generator(Generator::new(|i, _| (i % 3 + 3 * (i / 3 % 33), (i * 7919) % 1_000)).count(60_000).rate(200_000.0))
        .key_by(|e: &(u64, u64)| e.0)
        .process(
            || (MapState::new(), ListState::new()),
            |k: &u64, e: (u64, u64), s: &mut S, out: &mut Vec<(u64, u64, u64)>| {
                s.0.put(*k, e.1, 1);
                s.1.add(*k, e.1);
                let last = if s.1.get(k).len() == 3 { s.1.take(k).iter().sum() } else { 0 };
                out.push((*k, s.0.user_keys(k).len() as u64, last));
            },
        )
        .named("distinct")
        .collect_exactly_once();
    run_collected(job, out)
}

#[test]
fn a_user_function_over_map_and_list_state_recovers_exactly() {
    let (golden, _) = distinct(None);
    assert_eq!(golden.len(), 60_000);
    for incremental in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let faults = FaultInjector::new(vec![
            Fault::AtRecord { operator: "distinct".into(), nth: 21_000 },
            Fault::AtRecord { operator: "distinct".into(), nth: 42_000 },
        ]);
        let config = CheckpointConfig::new(dir.path())
            .interval(Duration::from_millis(20))
            .incremental(incremental)
            .tolerable_failed_checkpoints(100)
            .restart(RestartStrategy::FixedDelay { attempts: 5, delay: Duration::from_millis(1) })
            .faults(std::sync::Arc::clone(&faults));
        let (got, report) = distinct(Some(config));
        assert_eq!(report.restarts, 2, "incremental={incremental}");
        assert!(got == golden, "incremental={incremental}: output differs from the failure-free run");
    }
}
