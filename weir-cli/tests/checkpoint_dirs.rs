//! A checkpoint directory that is not this job's to resume: one holding another job's
//! checkpoints, or checkpoints in another format version. Each is refused with a message that
//! says what the directory holds, before anything runs; the checkpoints are left untouched.
//! And the checkpoint configuration a running job takes, or refuses, through its handle.

use crate::common;

use std::path::Path;
use std::time::Duration;

use weir::checkpoint::{
    CheckpointConfig, CheckpointMode, CheckpointStorage, ModeKind, RestartStrategy, FORMAT_VERSION, METADATA_FILE,
};
use weir::snapshot::{Fault, FaultInjector};
use weir::source::Generator;
use weir::{Job, RunConfig};

const N: u64 = 20_000;

/// A keyed sum (with `other`, behind one more operator: another job) that fails half-way with no
/// restart, so its checkpoints stay behind as a crash would leave them.
fn job(dir: &Path, other: bool, fail: bool) -> Job {
    let faults =
        FaultInjector::new(if fail { vec![Fault::AtRecord { operator: "sum".into(), nth: N / 2 }] } else { vec![] });
    let config =
        CheckpointConfig::new(dir).interval(Duration::from_millis(5)).restart(RestartStrategy::None).faults(faults);
    let job = Job::new("keyed").with_parallelism(2).with_checkpointing(config);
    let events = job.generator(Generator::new(|i, _| (i % 10, i)).count(N).rate(100_000.0));
    // Another job: one more operator in the graph, so another fingerprint.
    let events = if other { events.map(|e| e).named("copy") } else { events };
    let out = events.key_by(|e: &(u64, u64)| e.0).aggregate(|| 0u64, |s: &mut u64, e| *s += e.1, |k, s| (*k, *s));
    out.named("sum").discard();
    job
}

/// [`job`] (not another, failing with no restart or not), its checkpoints incremental: what
/// a job within a state memory budget restores lazily.
fn incremental_job(dir: &Path, fail: bool, restart: RestartStrategy) -> Job {
    let faults =
        FaultInjector::new(if fail { vec![Fault::AtRecord { operator: "sum".into(), nth: N / 2 }] } else { vec![] });
    let config = CheckpointConfig::new(dir)
        .interval(Duration::from_millis(5))
        .incremental(true)
        .local_recovery(false)
        .restart(restart)
        .faults(faults);
    let job = Job::new("keyed").with_parallelism(2).with_checkpointing(config);
    let events = job.generator(Generator::new(|i, _| (i % 1000, i)).count(N).rate(100_000.0));
    let out = events.key_by(|e: &(u64, u64)| e.0).aggregate(|| 0u64, |s: &mut u64, e| *s += e.1, |k, s| (*k, *s));
    out.named("sum").discard();
    job
}

/// A page of the newest checkpoint damaged where a lazy restore reads it only when a key
/// needs it: the restore starts (it reads no page), the first lookup of that page finds the
/// damage (its checksum), the attempt fails over, and the next restore reads the file whole,
/// so the checkpoint is skipped as damaged and the one before it restored; never a wrong sum.
#[test]
fn a_page_damaged_under_a_lazy_restore_fails_over_to_the_checkpoint_before() {
    let dir = tempfile::tempdir().unwrap();
    let budget = RunConfig::default().workers(2).state_memory(1 << 20);
    assert!(incremental_job(dir.path(), true, RestartStrategy::None).execute(budget.clone()).is_err());
    let storage = CheckpointStorage::new(dir.path());
    let complete: Vec<u64> = storage.list().into_iter().filter(|&id| storage.is_complete(id)).collect();
    let [.., previous, newest] = complete[..] else { panic!("two checkpoints completed: {complete:?}") };
    // Every page file the newest checkpoint wrote itself, one byte flipped in its middle.
    let mut damaged = 0;
    for shared in storage.metadata(newest).unwrap().shared {
        if shared.file.starts_with(&format!("shared/chk-{newest}-")) {
            let path = dir.path().join(&shared.file);
            let mut bytes = std::fs::read(&path).unwrap();
            let middle = 56 + (bytes.len() - 72) / 2;
            bytes[middle] ^= 0x55;
            std::fs::write(&path, bytes).unwrap();
            damaged += 1;
        }
    }
    assert!(damaged > 0, "checkpoint {newest} wrote no pages of its own");
    let restart = RestartStrategy::FixedDelay { attempts: 2, delay: Duration::ZERO };
    let mut handle = incremental_job(dir.path(), false, restart).start(budget).unwrap();
    handle.wait().unwrap();
    let notes = handle.notes().join("\n");
    assert!(notes.contains("fails its checksum"), "{notes}");
    assert!(notes.contains(&format!("checkpoint {newest} is damaged and was skipped")), "{notes}");
    assert!(notes.contains(&format!("restored from checkpoint {previous}")), "{notes}");
}

/// Runs the job until its injected failure, leaving completed checkpoints in `dir`.
fn leave_checkpoints(dir: &Path) -> Vec<u64> {
    assert!(job(dir, false, true).execute(RunConfig::default().workers(2)).is_err());
    let storage = CheckpointStorage::new(dir);
    let complete: Vec<u64> = storage.list().into_iter().filter(|&id| storage.is_complete(id)).collect();
    assert!(!complete.is_empty(), "the first run completed no checkpoint");
    complete
}

#[test]
fn a_directory_of_another_job_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let complete = leave_checkpoints(dir.path());
    let err = job(dir.path(), true, false).execute(RunConfig::default().workers(2)).unwrap_err().to_string();
    assert!(err.contains("holds checkpoints of another job"), "{err}");
    assert!(err.contains(&dir.path().display().to_string()), "{err}");
    // Refused before anything ran: the other job's checkpoints are all still there.
    let storage = CheckpointStorage::new(dir.path());
    for id in complete {
        assert!(storage.load(id).is_ok(), "checkpoint {id} was touched");
    }
    // The job they belong to resumes from them.
    let handle = job(dir.path(), false, false).start(RunConfig::default().workers(2)).unwrap();
    handle.join().unwrap();
}

#[test]
fn checkpoints_in_another_format_version_are_refused_not_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let complete = leave_checkpoints(dir.path());
    // As an older weir would have written it: the same files, version 1 in a header whose
    // checksum holds (a header that checks out only as this version's is damage instead:
    // `a_damaged_version_field_is_damage_not_another_version`).
    let newest = *complete.last().unwrap();
    let metadata = CheckpointStorage::new(dir.path()).checkpoint_dir(newest).join(METADATA_FILE);
    let mut bytes = std::fs::read(&metadata).unwrap();
    assert_eq!(u32::from_le_bytes(bytes[4..8].try_into().unwrap()), FORMAT_VERSION);
    bytes[4..8].copy_from_slice(&1u32.to_le_bytes());
    let crc = crc32c::crc32c(&bytes[..44]);
    bytes[44..48].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&metadata, bytes).unwrap();

    let err = job(dir.path(), false, false).execute(RunConfig::default().workers(2)).unwrap_err().to_string();
    assert!(err.contains(&format!("checkpoint {newest} in format version 1")), "{err}");
    assert!(err.contains(&format!("reads version {FORMAT_VERSION}")), "{err}");
    // Nothing was deleted or started over.
    let storage = CheckpointStorage::new(dir.path());
    assert!(storage.is_complete(newest));
    assert!(!dir.path().join(weir::runtime::FINISHED_MARKER).exists());
    // `weir checkpoints` names the reason too.
    let listing =
        std::process::Command::new(env!("CARGO_BIN_EXE_weir")).arg("checkpoints").arg(dir.path()).output().unwrap();
    let text = String::from_utf8_lossy(&listing.stdout).into_owned() + &String::from_utf8_lossy(&listing.stderr);
    assert!(!listing.status.success() && text.contains("format version 1"), "{text}");
}

/// Found by the simulator (a damaged-file fault of the keyed job, unaligned): one bit flipped
/// in the version field of the newest `_metadata` made the directory look like another
/// weir's, and recovery refused to start instead of falling back past the damage.
#[test]
fn a_damaged_version_field_is_damage_not_another_version() {
    let dir = tempfile::tempdir().unwrap();
    let complete = leave_checkpoints(dir.path());
    let newest = *complete.last().unwrap();
    let metadata = CheckpointStorage::new(dir.path()).checkpoint_dir(newest).join(METADATA_FILE);
    let mut bytes = std::fs::read(&metadata).unwrap();
    bytes[4] ^= 0x20;
    std::fs::write(&metadata, bytes).unwrap();
    let mut handle = job(dir.path(), false, false).start(RunConfig::default().workers(2)).unwrap();
    handle.wait().unwrap();
    let notes = handle.notes().join("\n");
    assert!(notes.contains(&format!("checkpoint {newest} is damaged and was skipped")), "{notes}");
    if let [.., previous, _] = complete[..] {
        assert!(notes.contains(&format!("restored from checkpoint {previous}")), "{notes}");
    }
}

/// A file the newest checkpoint's `_metadata` lists, deleted (by hand, or lost with a disk):
/// `weir checkpoints` printed one I/O error and no table, and every start failed the same way,
/// where only removing the folder helped. It is damage: listed as such, and recovery falls
/// back past that checkpoint.
#[test]
fn a_deleted_task_file_is_damage_and_recovery_falls_back_past_it() {
    let dir = tempfile::tempdir().unwrap();
    let complete = leave_checkpoints(dir.path());
    let newest = *complete.last().unwrap();
    let folder = CheckpointStorage::new(dir.path()).checkpoint_dir(newest);
    let task = std::fs::read_dir(&folder)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "state"))
        .expect("a task file");
    std::fs::remove_file(&task).unwrap();
    let listing =
        std::process::Command::new(env!("CARGO_BIN_EXE_weir")).arg("checkpoints").arg(dir.path()).output().unwrap();
    let text = String::from_utf8_lossy(&listing.stdout).into_owned() + &String::from_utf8_lossy(&listing.stderr);
    assert!(!listing.status.success(), "{text}");
    let row = text
        .lines()
        .find(|l| l.split('|').nth(1).map(str::trim) == Some(&format!("chk-{newest}")))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(row.contains("DAMAGED") && row.contains("missing"), "{text}");
    if let [.., previous, _] = complete[..] {
        assert!(
            text.lines()
                .any(|l| l.split('|').nth(1).map(str::trim) == Some(&format!("chk-{previous}")) && l.contains("valid")),
            "{text}"
        );
    }
    let mut handle = job(dir.path(), false, false).start(RunConfig::default().workers(2)).unwrap();
    handle.wait().unwrap();
    let notes = handle.notes().join("\n");
    assert!(notes.contains(&format!("checkpoint {newest} is damaged and was skipped")), "{notes}");
    assert!(notes.contains("missing"), "{notes}");
}

#[test]
fn folders_of_checkpoints_that_never_completed_are_removed_at_start_and_their_ids_not_reused() {
    let dir = tempfile::tempdir().unwrap();
    let complete = leave_checkpoints(dir.path());
    let storage = CheckpointStorage::new(dir.path());
    // As a crash mid-checkpoint leaves it: a folder with a task file and no _metadata.
    let stale = storage.list().last().copied().unwrap() + 1;
    storage.prepare(stale).unwrap();
    std::fs::write(storage.checkpoint_dir(stale).join("task-0.state"), b"half-written").unwrap();

    let mut handle = job(dir.path(), false, false).start(RunConfig::default().workers(2)).unwrap();
    let report = loop {
        if let Some(r) = handle.try_finish() {
            break r.unwrap();
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let restored = format!("restored from checkpoint {} (from files)", complete.last().unwrap());
    assert!(handle.notes().contains(&restored), "{:?}", handle.notes());
    assert!(!storage.checkpoint_dir(stale).exists(), "the never-completed checkpoint {stale} is still there");
    assert!(report.checkpoints.iter().all(|c| c.id > stale), "an id was reused: {:?}", report.checkpoints);
    assert!(storage.list().iter().all(|&id| storage.is_complete(id)), "{:?}", storage.list());
}

/// The live configuration a user changes on a running job through its handle: the interval
/// applies from the next checkpoint (each checkpoint's statistics record the one it ran
/// under); a change to what the tasks are wired for, or an invalid one, is refused with the
/// reason, and the job keeps its configuration.
#[test]
fn a_running_job_takes_a_new_interval_and_refuses_what_it_cannot_change() {
    let dir = tempfile::tempdir().unwrap();
    let config = CheckpointConfig::new(dir.path()).interval(Duration::from_millis(10));
    let job = Job::new("live").with_parallelism(2).with_checkpointing(config);
    let events = job.generator(Generator::new(|i, _| (i % 10, i)).rate(50_000.0));
    events.key_by(|e: &(u64, u64)| e.0).aggregate(|| 0u64, |s: &mut u64, e| *s += e.1, |k, s| (*k, *s)).discard();
    let handle = job.start(RunConfig::default().workers(2)).unwrap();
    let newest_interval = |h: &weir::JobHandle| h.checkpoint_stats().last().map(|s| s.interval_ms);
    common::wait_until("a checkpoint at 10 ms", || newest_interval(&handle) == Some(10.0));
    handle.update_checkpoints(|c| c.interval(Duration::from_millis(30))).unwrap();
    common::wait_until("a checkpoint at 30 ms", || newest_interval(&handle) == Some(30.0));
    let wired = handle.update_checkpoints(|c| c.mode(CheckpointMode::AtLeastOnce)).unwrap_err().to_string();
    assert!(wired.contains("the guarantee (exactly-once or at-least-once) cannot change on a running job"), "{wired}");
    let invalid = handle.update_checkpoints(|c| c.interval(Duration::ZERO)).unwrap_err().to_string();
    assert!(
        invalid.contains("interval must be greater than zero") && invalid.contains("keeps its configuration"),
        "{invalid}"
    );
    let zero_budget =
        handle.update_checkpoints(|c| c.mode(CheckpointMode::Adaptive { budget: 0 })).unwrap_err().to_string();
    assert!(
        zero_budget.contains("greater than zero") && zero_budget.contains("keeps its configuration"),
        "{zero_budget}"
    );
    let seen = handle.checkpoint_stats().len();
    common::wait_until("another checkpoint", || handle.checkpoint_stats().len() > seen);
    let after = handle.checkpoint_stats();
    assert!(after[seen..].iter().all(|s| s.interval_ms == 30.0), "the refused changes changed nothing");
    assert!(
        after.iter().all(|s| s.mode == Some(CheckpointMode::Aligned)),
        "{:?}",
        after.iter().map(|s| &s.mode).collect::<Vec<_>>()
    );
    // Aligned, then unaligned, then aligned with a timeout, then adaptive, on the running job.
    let newest = |h: &weir::JobHandle| h.checkpoint_stats().last().and_then(|s| s.mode.map(CheckpointMode::kind));
    handle.update_checkpoints(|c| c.mode(CheckpointMode::Unaligned)).unwrap();
    common::wait_until("an unaligned checkpoint", || newest(&handle) == Some(ModeKind::Unaligned));
    let timeout = Duration::from_millis(5);
    handle.update_checkpoints(|c| c.mode(CheckpointMode::AlignedTimeout { timeout })).unwrap();
    common::wait_until("an aligned-timeout checkpoint", || newest(&handle) == Some(ModeKind::AlignedTimeout));
    assert_eq!(handle.checkpoint_stats().last().unwrap().mode, Some(CheckpointMode::AlignedTimeout { timeout }));
    let mut adaptive = None;
    handle.update_checkpoints(|c| c.mode(CheckpointMode::Adaptive { budget: 1 << 16 })).unwrap();
    common::wait_until("an adaptive checkpoint", || {
        adaptive = handle
            .checkpoint_stats()
            .last()
            .filter(|s| s.mode.map(CheckpointMode::kind) == Some(ModeKind::Adaptive))
            .cloned();
        adaptive.is_some()
    });
    let adaptive = adaptive.unwrap();
    assert_eq!(adaptive.mode, Some(CheckpointMode::Adaptive { budget: 1 << 16 }));
    // The keyed stage's tasks report each of their input channels (2 subtasks, 2 channels each).
    assert_eq!(adaptive.channels.len(), 4, "{:?}", adaptive.channels);
    handle.stop();
    handle.join().unwrap();
}
