//! I/O faults while checkpointing (through the fault injector's storage errors): a full disk,
//! a permission error or a failed fsync while a task writes its part, or while the
//! coordinator writes the metadata. The checkpoint is declined and discarded, the job keeps
//! processing and its output is exactly the failure-free output; tolerable failures are
//! honoured; no partial checkpoint is ever restored. Where the test may mount one, a real
//! full disk (a small tmpfs) does the same with the operating system's own error.

use std::time::Duration;

use weir::checkpoint::{CheckpointConfig, CheckpointStorage, RestartStrategy};
use weir::snapshot::{Fault, FaultInjector, StorageFault};
use weir::source::Generator;
use weir::{Error, Job, RunConfig};

use crate::common::PausingSource;

const N: u64 = 60_000;

fn job(config: Option<CheckpointConfig>) -> (Job, weir::sink::CommittedOutput<(u64, u64)>) {
    job_held(config, &[])
}

/// The job, its source ending only after `pauses` (see [`PausingSource`]).
fn job_held(
    config: Option<CheckpointConfig>,
    pauses: &'static [(u64, u32)],
) -> (Job, weir::sink::CommittedOutput<(u64, u64)>) {
    let mut job = Job::new("io-faults").with_parallelism(2);
    if let Some(c) = config {
        job = job.with_checkpointing(c);
    }
    // Key ≡ i (mod 2) at source parallelism 2: every key's order is fixed, so is the output.
    let out = job
        .source(move |ctx| Ok(PausingSource::new(|i| (i % 40, i), N, pauses, ctx)))
        .key_by(|e: &(u64, u64)| e.0)
        .aggregate(|| 0u64, |s: &mut u64, e| *s += e.1, |k: &u64, s: &u64| (*k, *s))
        .named("sum")
        .collect_exactly_once();
    (job, out)
}

fn sorted(mut v: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    v.sort_unstable();
    v
}

/// Runs `job` to its end; its result and every checkpoint failure it recorded.
fn run_to_the_end(job: Job) -> (weir::Result<weir::JobReport>, Vec<String>) {
    let mut handle = job.start(RunConfig::default().workers(2)).unwrap();
    let result = crate::common::finish(&mut handle);
    (result, handle.checkpoint_failures().iter().map(ToString::to_string).collect())
}

#[test]
fn storage_errors_decline_checkpoints_and_the_job_goes_on() {
    let (golden_job, golden) = job(None);
    golden_job.execute(RunConfig::default().workers(2)).unwrap();
    let golden = sorted(golden.records());

    let dir = tempfile::tempdir().unwrap();
    let faults = FaultInjector::new(vec![
        Fault::StorageWrite { checkpoint: 2, error: StorageFault::DiskFull },
        Fault::StorageWrite { checkpoint: 3, error: StorageFault::PermissionDenied },
        Fault::StorageWrite { checkpoint: 4, error: StorageFault::FsyncFailed },
        Fault::MetadataWrite { checkpoint: 5, error: StorageFault::DiskFull },
        // A task failure after them: recovery must pick a complete checkpoint.
        Fault::AtRecord { operator: "sum".into(), nth: N * 3 / 4 },
    ]);
    let config = CheckpointConfig::new(dir.path())
        .interval(Duration::from_millis(15))
        .tolerable_failed_checkpoints(10)
        .retained(3)
        .restart(RestartStrategy::FixedDelay { attempts: 3, delay: Duration::from_millis(1) })
        .faults(std::sync::Arc::clone(&faults));
    // The end waits for two checkpoints to complete after the last (re)start: the second is
    // past the failing ones however slowly checkpoints come (they once did not all come
    // before the end on a loaded machine).
    let (j, out) = job_held(Some(config), &[(N, 2)]);
    let (report, failures) = run_to_the_end(j);
    let report = report.unwrap();
    assert_eq!(faults.fired(), 5, "every fault fired: {failures:?}");
    for (id, what) in [(2, "No space left"), (3, "Permission denied"), (4, "fsync failed"), (5, "metadata")] {
        assert!(
            failures.iter().any(|f| f.contains(&format!("checkpoint {id} failed")) && f.contains(what)),
            "checkpoint {id}: {what} not reported in {failures:?}"
        );
    }
    let completed: Vec<u64> = report.checkpoints.iter().map(|c| c.id).collect();
    assert!(completed.iter().all(|id| !(2..=5).contains(id)), "a failed checkpoint completed: {completed:?}");
    assert_eq!(report.restarts, 1);
    assert!(sorted(out.records()) == golden, "output differs from the failure-free run");
    // Nothing of the failed checkpoints is left to be restored by mistake.
    let storage = CheckpointStorage::new(dir.path());
    for id in 2..=5 {
        assert!(!storage.is_complete(id), "checkpoint {id} has metadata");
    }
}

#[test]
fn too_many_consecutive_storage_errors_fail_the_job_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let faults = FaultInjector::new(
        (1..=3).map(|checkpoint| Fault::StorageWrite { checkpoint, error: StorageFault::DiskFull }).collect(),
    );
    // (With a restart strategy the failed job would restart, as Flink's does.)
    let config = CheckpointConfig::new(dir.path())
        .interval(Duration::from_millis(10))
        .tolerable_failed_checkpoints(2)
        .restart(RestartStrategy::None)
        .faults(faults);
    // The end waits for a checkpoint that never completes: the failures end the job.
    let (j, _) = job_held(Some(config), &[(N, 1)]);
    let err = j.execute(RunConfig::default().workers(2)).unwrap_err();
    assert!(matches!(err, Error::Checkpoint(_)), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("3 consecutive checkpoints failed") && text.contains("No space left"), "{text}");
}

/// A small tmpfs mounted on a temporary folder, unmounted when dropped. `None` where this
/// process may not mount (not root, or in a container without the capability).
struct SmallTmpfs {
    dir: tempfile::TempDir,
}

impl SmallTmpfs {
    fn mount(bytes: u64) -> Option<Self> {
        let dir = tempfile::tempdir().ok()?;
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir.path())
            .stderr(std::process::Stdio::null())
            .status()
            .ok()?;
        status.success().then_some(SmallTmpfs { dir })
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(self.dir.path()).status();
    }
}

/// A real full disk: the keyed state grows with the input until its checkpoints no longer fit
/// in a 384 KiB tmpfs. The first checkpoints complete; the later ones fail with the operating
/// system's ENOSPC, are declined and cleaned up; a task failure after that recovers from the
/// last checkpoint that fitted and the output is still exactly the failure-free output.
#[test]
fn a_real_full_disk_declines_checkpoints_and_recovery_uses_one_that_fitted() {
    let Some(disk) = SmallTmpfs::mount(384 * 1024) else {
        crate::common::did_not_run(
            "io_faults::a_real_full_disk_declines_checkpoints_and_recovery_uses_one_that_fitted",
            "this process may not mount a tmpfs (run the tests as root; the injected faults above still run)",
        );
        return;
    };
    const KEYS: u64 = 80_000;
    let growing = |config: Option<CheckpointConfig>| {
        let mut job = Job::new("full-disk").with_parallelism(2);
        if let Some(c) = config {
            job = job.with_checkpointing(c);
        }
        // Every record a new key: the state (and each full checkpoint) grows all the time.
        let out = job
            .generator(Generator::new(|i, _| (i, i)).count(KEYS).rate(150_000.0))
            .key_by(|e: &(u64, u64)| e.0 % 2)
            .aggregate(|| 0u64, |s: &mut u64, e| *s += e.1, |k: &u64, s: &u64| (*k, *s))
            .key_by(|e: &(u64, u64)| e.1)
            .aggregate(|| 0u64, |s: &mut u64, _| *s += 1, |k: &u64, s: &u64| (*k, *s))
            .named("count")
            .collect_exactly_once();
        (job, out)
    };
    let (golden_job, golden) = growing(None);
    golden_job.execute(RunConfig::default().workers(2)).unwrap();
    let golden = sorted(golden.records());

    let faults = FaultInjector::new(vec![Fault::AtRecord { operator: "count".into(), nth: KEYS * 9 / 10 }]);
    let config = CheckpointConfig::new(disk.dir.path().join("checkpoints"))
        .interval(Duration::from_millis(20))
        .tolerable_failed_checkpoints(1_000)
        .retained(1)
        .restart(RestartStrategy::FixedDelay { attempts: 3, delay: Duration::from_millis(1) })
        .faults(std::sync::Arc::clone(&faults));
    let (j, out) = growing(Some(config));
    let (result, failures) = run_to_the_end(j);
    match result {
        Ok(report) => assert_eq!(report.restarts, 1),
        // The job's work is done and its output committed; only the marker that stops a rerun
        // found no room, next to the checkpoint that filled the disk. The job says so.
        Err(e) => {
            let e = e.to_string();
            assert!(e.contains("completion marker") && e.contains("No space left"), "{e}");
        }
    }
    assert_eq!(faults.fired(), 1);
    assert!(failures.iter().any(|f| f.contains("No space left on device")), "the disk never filled up: {failures:?}");
    assert!(sorted(out.records()) == golden, "output differs from the failure-free run");
    // What is left on the disk is complete and verifies; declined checkpoints left nothing.
    let storage = CheckpointStorage::new(disk.dir.path().join("checkpoints"));
    assert!(!storage.list().is_empty(), "no checkpoint fitted at all: {failures:?}");
    for id in storage.list() {
        assert!(storage.is_complete(id), "checkpoint {id} never completed but its folder is left");
        storage.load(id).unwrap_or_else(|e| panic!("checkpoint {id} left on the full disk is damaged: {e}"));
    }
}

/// A sink whose opening fails once with an I/O error, on the attempt after the first failure
/// (a transactional sink's restore meeting a lost request, say): that start's failure is one
/// more the restart strategy handles, and the job completes. (It used to end the job, with
/// restarts left.)
#[test]
fn a_restart_whose_start_fails_retryably_is_restarted_again() {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    struct Counting(Arc<AtomicU32>);
    impl weir::sink::Sink<u64> for Counting {
        fn write(&mut self, records: &mut Vec<u64>) -> weir::Result<()> {
            self.0.fetch_add(records.len() as u32, Ordering::Relaxed);
            records.clear();
            Ok(())
        }
    }
    const N: u64 = 5_000;
    let dir = tempfile::tempdir().unwrap();
    let faults = FaultInjector::new(vec![Fault::AtRecord { operator: "copy".into(), nth: N / 2 }]);
    let config = CheckpointConfig::new(dir.path())
        .interval(Duration::from_millis(5))
        .restart(RestartStrategy::FixedDelay { attempts: 5, delay: Duration::from_millis(1) })
        .faults(faults);
    let job = Job::new("flaky-sink").with_checkpointing(config);
    let (opened, written) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let (o, w) = (Arc::clone(&opened), Arc::clone(&written));
    job.generator(Generator::new(|i, _| i).count(N)).map(|i| i).named("copy").sink(move |_ctx| {
        match o.fetch_add(1, Ordering::SeqCst) {
            1 => Err(Error::Io {
                context: "cannot reach the sink's store".into(),
                path: None,
                source: std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer"),
            }),
            _ => Ok(Counting(Arc::clone(&w))),
        }
    });
    let report = job.execute(RunConfig::default().workers(1)).unwrap();
    assert_eq!(opened.load(Ordering::SeqCst), 3, "opened at the start, failed once, opened again");
    assert_eq!(report.restarts, 2);
    assert!(written.load(Ordering::Relaxed) as u64 >= N);
}
