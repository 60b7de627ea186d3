//! Incremental checkpoints in a running job: a keyed state loaded once and then touched at a
//! few keys writes far less than its size per checkpoint, and a job failing over from an
//! incremental chain produces exactly the failure-free output.

use std::time::Duration;

use weir::checkpoint::{CheckpointConfig, RestartStrategy};
use weir::snapshot::{Fault, FaultInjector};
use weir::source::Generator;
use weir::{Job, RunConfig};

const KEYS: u64 = 60_000;
const EVENTS: u64 = 90_000;

/// Records 0..KEYS create one key each; later records update ten hot keys.
fn key(i: u64) -> u64 {
    if i < KEYS {
        i
    } else {
        i % 10
    }
}

fn run(checkpointing: Option<CheckpointConfig>) -> (Vec<(u64, u64)>, weir::JobReport) {
    let mut job = Job::new("incremental").with_parallelism(2);
    if let Some(c) = checkpointing {
        job = job.with_checkpointing(c);
    }
    let out = job
        // Slow enough for many checkpoints while only the hot keys change.
        .generator(Generator::new(|i, _| (key(i), i)).count(EVENTS).rate(150_000.0))
        .key_by(|e: &(u64, u64)| e.0)
        .aggregate(|| 0u64, |s: &mut u64, e| *s += e.1, |k: &u64, s: &u64| (*k, *s))
        .named("sum")
        .collect_exactly_once();
    let handle = job.start(RunConfig::default().workers(2)).unwrap();
    let report = handle.join().unwrap();
    let mut rows = out.records();
    rows.sort_unstable();
    (rows, report)
}

#[test]
fn incremental_checkpoints_write_only_changed_pages_and_recover_exactly() {
    let (golden, _) = run(None);
    assert_eq!(golden.len() as u64, EVENTS);
    let dir = tempfile::tempdir().unwrap();
    let faults = FaultInjector::new(vec![
        Fault::AtRecord { operator: "sum".into(), nth: KEYS + 12_000 },
        Fault::AtRecord { operator: "sum".into(), nth: KEYS + 22_000 },
    ]);
    let config = CheckpointConfig::new(dir.path())
        .interval(Duration::from_millis(20))
        .incremental(true)
        .retain(2)
        .tolerable_failures(100)
        .restart(RestartStrategy::FixedDelay { attempts: 5, delay: Duration::from_millis(1) })
        .faults(faults.clone());
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
        complete.iter().flat_map(|&id| storage.metadata(id).unwrap().shared).collect();
    let on_disk = std::fs::read_dir(dir.path().join(weir::checkpoint::SHARED_DIR)).map_or(0, |d| d.count());
    eprintln!("{on_disk} shared files on disk, {} named by retained checkpoints", named.len());
    // A checkpoint aborted as the job ended may have had writers still running.
    assert!(on_disk <= named.len() + 2, "{on_disk} shared files for {} named", named.len());
    for id in complete {
        storage.load(id).unwrap();
    }
}
