//! Local recovery, as a user meets it: a task fails in a live process after a checkpoint
//! completed, and the job restores that checkpoint from the state the process kept in memory
//! (the restore's note and `JobHandle::last_restore` say so), with exactly the output of a run
//! without the failure; off, or in a new process, it reads the checkpoint's files. Nothing
//! here waits on time: the checkpoint is taken on request and the failure is at a record the
//! host sends only after it completed.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use weir::checkpoint::{CheckpointConfig, RestartStrategy, RestoreReport};
use weir::faults::{Fault, FaultInjector};
use weir::sink::CommittedOutput;
use weir::source::EventSender;
use weir::{Job, JobHandle, RunConfig};

const KEYS: u64 = 50;
/// Records before the checkpoint, and in all.
const BEFORE: u64 = 1_000;
const ALL: u64 = 2_000;
/// The record (counted at the keyed operator, over attempts) that fails the task.
const FAIL_AT: u64 = 1_300;
const WAIT: Duration = Duration::from_secs(120);

/// push source → running count per key ("count") → exactly-once collection.
fn build(
    dir: &Path,
    local: bool,
    faults: Arc<FaultInjector>,
    restart: bool,
) -> (Job, EventSender<u64>, CommittedOutput<(u64, u64)>) {
    let restart = if restart {
        RestartStrategy::FixedDelay { attempts: 3, delay: Duration::from_millis(1) }
    } else {
        RestartStrategy::None
    };
    // Checkpoints only when asked for.
    let cfg = CheckpointConfig::new(dir)
        .interval(Duration::from_secs(3600))
        .local_recovery(local)
        .restart(restart)
        .faults(faults);
    let job = Job::new("local-recovery").with_checkpointing(cfg);
    let (tx, records) = job.push_source::<u64>(64);
    let out = records
        .key_by(|x: &u64| x % KEYS)
        .aggregate(|| 0u64, |c: &mut u64, _| *c += 1, |k: &u64, c: &u64| (*k, *c))
        .named("count")
        .collect_exactly_once();
    (job, tx, out)
}

fn send(tx: &mut EventSender<u64>, records: std::ops::Range<u64>) {
    for i in records {
        tx.send_timeout(i, WAIT).unwrap();
    }
}

/// Runs the job to its end: `BEFORE` records, a checkpoint, the rest (the task fails among
/// them); returns the handle, the checkpoint's id and the sorted output.
fn run_with_a_failover(dir: &Path, local: bool) -> (JobHandle, u64, Vec<(u64, u64)>) {
    let faults = FaultInjector::new(vec![Fault::AtRecord { operator: "count".into(), nth: FAIL_AT }]);
    let (job, mut tx, out) = build(dir, local, Arc::clone(&faults), true);
    let mut handle = job.start(RunConfig::default().workers(2)).unwrap();
    send(&mut tx, 0..BEFORE);
    let checkpoint = handle.trigger_checkpoint().unwrap();
    send(&mut tx, BEFORE..ALL);
    tx.close();
    handle.wait().unwrap_or_else(|e| panic!("{e}; notes: {:?}", handle.notes()));
    assert_eq!(faults.fired(), 1, "the failure fired");
    assert_eq!(handle.restarts(), 1);
    let mut rows = out.records();
    rows.sort_unstable();
    (handle, checkpoint, rows)
}

/// What a run without failures emits: every key's running count.
fn expected() -> Vec<(u64, u64)> {
    let mut rows: Vec<(u64, u64)> = (0..KEYS).flat_map(|k| (1..=ALL / KEYS).map(move |c| (k, c))).collect();
    rows.sort_unstable();
    rows
}

fn restored_from(handle: &JobHandle, checkpoint: u64, from: &'static str) {
    assert_eq!(handle.last_restore(), Some(RestoreReport { checkpoint, from }), "notes: {:?}", handle.notes());
    let note = format!("restored from checkpoint {checkpoint} (from {from})");
    assert!(handle.notes().contains(&note), "no note '{note}' in {:?}", handle.notes());
}

/// A run with a failover after the checkpoint restores it from `from`, with the output of
/// a run without the failure.
fn fails_over_restoring_from(local: bool, from: &'static str) {
    let dir = tempfile::tempdir().unwrap();
    let (handle, checkpoint, rows) = run_with_a_failover(dir.path(), local);
    restored_from(&handle, checkpoint, from);
    assert!(rows == expected(), "output differs from the failure-free run ({} rows)", rows.len());
}

#[test]
fn a_failover_restores_the_last_checkpoint_from_memory() {
    fails_over_restoring_from(true, "memory");
}

#[test]
fn without_local_recovery_a_failover_reads_the_files() {
    fails_over_restoring_from(false, "files");
}

/// A new process has no copy: it restores from the files, though local recovery is on.
#[test]
fn a_new_process_restores_from_the_files() {
    let dir = tempfile::tempdir().unwrap();
    let faults = FaultInjector::new(vec![Fault::AtRecord { operator: "count".into(), nth: FAIL_AT }]);
    let (job, mut tx, _) = build(dir.path(), true, faults, false);
    let mut handle = job.start(RunConfig::default().workers(2)).unwrap();
    send(&mut tx, 0..BEFORE);
    let checkpoint = handle.trigger_checkpoint().unwrap();
    // The host keeps sending until the job, failed for good, refuses.
    for i in BEFORE..ALL {
        if tx.send_timeout(i, WAIT).is_err() {
            break;
        }
    }
    assert!(handle.wait().is_err(), "without restarts the failure ends the job");
    // The process ends: its lock on the directory and its copy go.
    drop((handle, tx));

    let (job, mut tx, out) = build(dir.path(), true, FaultInjector::new(Vec::new()), true);
    let mut handle = job.start(RunConfig::default().workers(2)).unwrap();
    let from = tx.resume_from(WAIT).unwrap();
    send(&mut tx, from..ALL);
    tx.close();
    handle.wait().unwrap_or_else(|e| panic!("{e}; notes: {:?}", handle.notes()));
    restored_from(&handle, checkpoint, "files");
    let mut rows = out.records();
    rows.sort_unstable();
    // The second process's output: the counts from the checkpoint on.
    assert_eq!(rows.last().map(|r| r.1), Some(ALL / KEYS), "every key counted to its end");
}
