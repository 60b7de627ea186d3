//! The two-phase-commit file sink: one transaction per checkpoint and subtask.
//!
//! Records go to a hidden in-progress file `.part-<subtask>-<run>-<n>.inprogress`. On a
//! checkpoint's barrier the buffered output is written out, the file closed to new records,
//! and the snapshot records every transaction still pending; the pre-commit proper (fsync, and
//! a rename to the hidden pending file `.part-<subtask>-<checkpoint>.pending`) is done by the
//! background writer when it writes the snapshot, before the checkpoint can complete, so the
//! task does not wait for the disk. A snapshot is written only after every transaction it
//! lists is pre-committed; a transaction whose snapshot was never written is pre-committed by
//! the next snapshot or, at the latest, when it is committed. When the checkpoint completes,
//! its pending files (and those of earlier aborted checkpoints) are committed by an atomic
//! rename to the visible `part-<subtask>-<checkpoint>`. With checkpoints, the job's final
//! checkpoint commits everything written up to the end of the input (windows fire at the end
//! of event time, before it); what operators emit only when their stream ends goes into a last
//! transaction, named after the last checkpoint plus one and committed, with everything still
//! pending, once the whole job has succeeded.
//!
//! On recovery from checkpoint `k`, what `k` recorded as pending is committed (a file already
//! renamed counts as committed: commits are idempotent), and everything else the sink wrote is
//! discarded: hidden files, and the visible file of the transaction after `k` (which only the
//! end of a job can commit, before a crash that came before the job's completion marker; the
//! replay writes it again alike). Visible files the replay would not write again (recovery
//! fell back past a damaged checkpoint, or found none) are committed output that would be lost:
//! recovery refuses unless the job allows retracting output. So every visible file in the
//! folder is committed output, and each record is in exactly one of them.
//! Old subtasks' files are handled by subtask `old % parallelism` (rescaling).
//!
//! May touch: `context`, `error`, `persist`, `record`, `snapshot`.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use super::{format_into, write_buffer, Sink, OUTPUT_BUFFER_BYTES};
use crate::context::TaskContext;
use crate::error::{Error, Result};
use crate::persist::from_bytes;
use crate::snapshot::{CheckpointNotice, ForkedState, PersistedFork, StateChunks};

/// The visible name of subtask `subtask`'s transaction `txn`.
pub fn committed_name(subtask: usize, txn: u64) -> String {
    format!("part-{subtask}-{txn:08}")
}

fn pending_name(subtask: usize, txn: u64) -> String {
    format!(".part-{subtask}-{txn:08}.pending")
}

/// What a file name in the output folder is to this sink.
#[derive(Debug, PartialEq, Eq)]
enum OwnFile {
    /// `part-<subtask>-<txn>`.
    Committed { subtask: usize, txn: u64 },
    /// `.part-<subtask>-…`: pending or in progress.
    Hidden { subtask: usize },
}

fn parse_name(name: &str) -> Option<OwnFile> {
    if let Some(rest) = name.strip_prefix(".part-") {
        let subtask = rest.split('-').next()?.parse().ok()?;
        return Some(OwnFile::Hidden { subtask });
    }
    let rest = name.strip_prefix("part-")?;
    let (subtask, txn) = rest.split_once('-')?;
    if !txn.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(OwnFile::Committed { subtask: subtask.parse().ok()?, txn: txn.parse().ok()? })
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|f| f.sync_all()).map_err(|e| Error::io("cannot sync output folder", dir, e))
}

/// Commits `subtask`'s pending transaction `txn`: renames its pending file to the visible
/// name. Already visible counts as done (a commit repeated after recovery).
fn commit(dir: &Path, subtask: usize, txn: u64) -> Result<()> {
    let (from, to) = (dir.join(pending_name(subtask, txn)), dir.join(committed_name(subtask, txn)));
    match std::fs::rename(&from, &to) {
        Ok(()) => Ok(()),
        Err(_) if to.exists() => Ok(()),
        Err(e) => Err(Error::io("cannot commit output file (its pending file is gone?)", from, e)),
    }
}

struct InProgress {
    path: PathBuf,
    out: File,
}

/// One transaction between its barrier and its commit: the closed in-progress file until it is
/// pre-committed. Shared by the sink and the snapshots that list it; whichever comes first
/// pre-commits it (the lock makes the other wait, then find it done).
struct Transaction {
    txn: u64,
    subtask: usize,
    dir: PathBuf,
    file: Mutex<TransactionFile>,
}

enum TransactionFile {
    /// Every record written, nothing synced yet.
    Written(InProgress),
    /// Synced and renamed to its pending name.
    PreCommitted,
    /// The sync or rename failed (the message): not retried, since a second fsync can report
    /// success for data the first one lost.
    Failed(String),
}

impl Transaction {
    /// Makes the transaction durable under its pending name (once; later calls return the
    /// first outcome).
    fn pre_commit(&self) -> Result<()> {
        let mut file = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        let attempt = match &*file {
            TransactionFile::PreCommitted => return Ok(()),
            TransactionFile::Failed(message) => return Err(Error::Checkpoint(message.clone())),
            TransactionFile::Written(InProgress { path, out }) => (|| {
                out.sync_all().map_err(|e| Error::io("cannot sync output file", path, e))?;
                let to = self.dir.join(pending_name(self.subtask, self.txn));
                std::fs::rename(path, &to).map_err(|e| Error::io("cannot pre-commit output file", &to, e))?;
                sync_dir(&self.dir)
            })(),
        };
        *file = match &attempt {
            Ok(()) => TransactionFile::PreCommitted,
            Err(e) => TransactionFile::Failed(e.to_string()),
        };
        attempt
    }
}

/// The sink's part of a snapshot: the newest checkpoint seen here and the pending
/// transactions' ids, written once those transactions are pre-committed.
struct PreCommitFork {
    checkpoint: u64,
    pending: Vec<Arc<Transaction>>,
}

impl ForkedState for PreCommitFork {
    fn write_chunks(&self, out: &mut dyn StateChunks) -> io::Result<()> {
        for t in &self.pending {
            t.pre_commit().map_err(|e| io::Error::other(e.to_string()))?;
        }
        let ids: Vec<u64> = self.pending.iter().map(|t| t.txn).collect();
        PersistedFork((self.checkpoint, ids)).write_chunks(out)
    }
}

/// One subtask of the two-phase-commit file sink (see the module documentation).
pub struct TwoPhaseFileSink<F> {
    dir: PathBuf,
    ctx: TaskContext,
    format: F,
    /// Names this run's in-progress files apart from any earlier run's.
    run: String,
    files_opened: u64,
    current: Option<InProgress>,
    /// Formatted records not yet handed to the in-progress file (less than
    /// [`OUTPUT_BUFFER_BYTES`] between calls).
    line: Vec<u8>,
    /// Transactions closed at a barrier and not yet committed, oldest first.
    pending: Vec<Arc<Transaction>>,
    /// The newest checkpoint whose barrier passed here (or that was restored).
    last_checkpoint: u64,
    /// Files of earlier runs are cleaned up before the first write.
    prepared: bool,
}

impl<F> TwoPhaseFileSink<F> {
    /// The sink for subtask `ctx.subtask`, writing into `dir` (created if missing).
    pub fn create(dir: &Path, ctx: &TaskContext, format: F) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("cannot create output folder", dir, e))?;
        let nanos = crate::context::wall::unix_nanos();
        Ok(TwoPhaseFileSink {
            dir: dir.to_path_buf(),
            ctx: ctx.clone(),
            format,
            run: format!("{}{:x}", std::process::id(), nanos % (1 << 48)),
            files_opened: 0,
            current: None,
            line: Vec::new(),
            pending: Vec::new(),
            last_checkpoint: 0,
            prepared: false,
        })
    }

    /// Deletes what earlier runs of the subtasks this one stands for left: hidden files, and
    /// visible ones of transactions after `restored` (all of them when nothing is restored).
    /// A visible file is committed output: one the replay does not write again identically is
    /// removed only if the job allows retracting output, and listed in its notes; otherwise
    /// nothing is removed and the restore fails naming them.
    fn clean_up(&mut self, restored: Option<u64>) -> Result<()> {
        let p = self.ctx.parallelism;
        let entries = std::fs::read_dir(&self.dir).map_err(|e| Error::io("cannot list output folder", &self.dir, e))?;
        let (mut stale, mut retracted) = (Vec::new(), Vec::new());
        for e in entries {
            let e = e.map_err(|e| Error::io("cannot list output folder", &self.dir, e))?;
            let Some(kind) = e.file_name().to_str().and_then(parse_name) else { continue };
            match kind {
                OwnFile::Hidden { subtask } if subtask % p == self.ctx.subtask => stale.push(e.path()),
                OwnFile::Committed { subtask, txn }
                    if subtask % p == self.ctx.subtask && restored.is_none_or(|k| txn > k) =>
                {
                    if self.ctx.recovery().replays_exactly(txn) {
                        stale.push(e.path());
                    } else {
                        retracted.push(e.path());
                    }
                }
                _ => {}
            }
        }
        retracted.sort();
        if !retracted.is_empty() {
            let names: Vec<String> =
                retracted.iter().map(|p| p.file_name().unwrap_or_default().to_string_lossy().into_owned()).collect();
            let recovery = self.ctx.recovery();
            let from = recovery.restored.map_or("the start".to_string(), |k| format!("checkpoint {k}"));
            if !recovery.allow_retracting_output {
                return Err(Error::config(format!(
                    "recovery from {from} would remove committed output in {}: {} (committed under checkpoints \
                     that can no longer be restored: {}). Nothing was removed. To remove it and compute it again \
                     from {from}, allow retracting output (weir: --allow-retracting-output; \
                     CheckpointConfig::allow_retracting_output)",
                    self.dir.display(),
                    names.join(", "),
                    recovery.why_lost()
                )));
            }
            self.ctx.note(format!(
                "removed committed output in {} that recovery from {from} computes again ({}): {}",
                self.dir.display(),
                recovery.why_lost(),
                names.join(", ")
            ));
            stale.extend(retracted);
        }
        for path in stale {
            match std::fs::remove_file(&path) {
                // Renamed meanwhile by a pre-commit of an earlier attempt that outlasted the
                // wait for its writes: the pending name is hidden too (and, checkpoint ids
                // never repeating, no later transaction's); the next clean-up removes it.
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                r => r.map_err(|err| Error::io("cannot remove stale output", &path, err))?,
            }
        }
        self.prepared = true;
        sync_dir(&self.dir)
    }

    fn prepare(&mut self) -> Result<()> {
        if !self.prepared {
            self.clean_up(None)?;
        }
        Ok(())
    }

    fn in_progress(&mut self) -> Result<&mut InProgress> {
        if self.current.is_none() {
            self.prepare()?;
            self.ctx.check_owner()?;
            self.files_opened += 1;
            let path =
                self.dir.join(format!(".part-{}-{}-{}.inprogress", self.ctx.subtask, self.run, self.files_opened));
            let file = File::create(&path).map_err(|e| Error::io("cannot create output file", &path, e))?;
            self.current = Some(InProgress { path, out: file });
        }
        Ok(self.current.as_mut().expect("just opened"))
    }

    /// Hands the buffered output to the in-progress file (opening one if needed).
    fn write_out(&mut self) -> Result<()> {
        self.in_progress()?;
        let current = self.current.as_mut().expect("opened above");
        write_buffer(&mut current.out, &current.path, &mut self.line)
    }

    /// Writes out the buffer and closes the in-progress file as transaction `txn` (pending
    /// once pre-committed); nothing when no record came since the last one.
    fn close_transaction(&mut self, txn: u64) -> Result<()> {
        if !self.line.is_empty() {
            self.write_out()?;
        }
        if let Some(file) = self.current.take() {
            self.pending.push(Arc::new(Transaction {
                txn,
                subtask: self.ctx.subtask,
                dir: self.dir.clone(),
                file: Mutex::new(TransactionFile::Written(file)),
            }));
        }
        Ok(())
    }

    fn commit_up_to(&mut self, id: u64) -> Result<()> {
        let split = self.pending.partition_point(|t| t.txn <= id);
        if split == 0 {
            return Ok(());
        }
        for t in self.pending.drain(..split) {
            // Done by the snapshot that completed, unless that snapshot was never written
            // (an earlier, aborted checkpoint's transaction).
            t.pre_commit()?;
            commit(&self.dir, self.ctx.subtask, t.txn)?;
        }
        sync_dir(&self.dir)
    }
}

impl<T, F: FnMut(&T, &mut Vec<u8>) + Send> Sink<T> for TwoPhaseFileSink<F> {
    fn write(&mut self, records: &mut Vec<T>) -> Result<()> {
        format_into(records, &mut self.format, &mut self.line);
        if self.line.len() >= OUTPUT_BUFFER_BYTES {
            self.write_out()?;
        }
        Ok(())
    }

    fn pre_commit(&mut self, checkpoint: u64) -> Result<Option<Box<dyn ForkedState>>> {
        self.prepare()?;
        self.close_transaction(checkpoint)?;
        self.last_checkpoint = checkpoint;
        Ok(Some(Box::new(PreCommitFork { checkpoint, pending: self.pending.clone() })))
    }

    fn notify(&mut self, notice: CheckpointNotice) -> Result<()> {
        // An aborted checkpoint's transaction stays pending and is committed with the next
        // completed one.
        if let CheckpointNotice::Complete(id) = notice {
            self.commit_up_to(id)?;
        }
        Ok(())
    }

    fn restore(&mut self, bytes: &[u8]) -> Result<()> {
        let (checkpoint, pending): (u64, Vec<u64>) = from_bytes(bytes)?;
        for txn in pending {
            commit(&self.dir, self.ctx.subtask, txn)?;
        }
        self.last_checkpoint = checkpoint;
        self.clean_up(Some(checkpoint))
    }

    fn restore_rescaled(&mut self, parts: &[(usize, &[u8])], scope: &crate::record::KeyScope) -> Result<()> {
        let mut restored = 0;
        for (old, bytes) in parts {
            let (checkpoint, pending): (u64, Vec<u64>) = from_bytes(bytes)?;
            restored = restored.max(checkpoint);
            if old % self.ctx.parallelism == scope.subtask {
                for txn in pending {
                    commit(&self.dir, *old, txn)?;
                }
            }
        }
        self.last_checkpoint = restored;
        self.clean_up(Some(restored))
    }

    fn finish(&mut self) -> Result<()> {
        self.prepare()?;
        self.close_transaction(self.last_checkpoint + 1)?;
        // Each pre-commit syncs the folder after its rename.
        for t in &self.pending {
            t.pre_commit()?;
        }
        // Committed only when the whole job succeeded: a failure before that restores the
        // last checkpoint, whose recovery discards these transactions and writes them again.
        let (dir, subtask) = (self.dir.clone(), self.ctx.subtask);
        let pending: Vec<u64> = self.pending.drain(..).map(|t| t.txn).collect();
        self.ctx.on_job_success(move || {
            pending.iter().try_for_each(|&txn| commit(&dir, subtask, txn))?;
            sync_dir(&dir)
        });
        Ok(())
    }
}

// Their fields are closures, shared internals or whole state: a name says enough.
crate::debug_as_name!([F] TwoPhaseFileSink<F>);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::{AttemptScope, Recovery};

    fn format(r: &u32, out: &mut Vec<u8>) {
        out.extend_from_slice(format!("{r}\n").as_bytes());
    }

    fn listing(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    fn snapshot_bytes(state: Option<Box<dyn ForkedState>>) -> Vec<u8> {
        let mut bytes = Vec::new();
        state.unwrap().write_to(&mut bytes).unwrap();
        bytes
    }

    /// An aborted checkpoint's transaction stays pending and is in the next snapshot; recovery
    /// commits what the snapshot lists and removes everything else this subtask wrote.
    #[test]
    fn recovery_commits_the_snapshot_pending_and_discards_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = TaskContext::for_test("sink", 0, 1);
        let mut s = TwoPhaseFileSink::create(dir.path(), &ctx, format).unwrap();
        s.write(&mut vec![1, 2]).unwrap();
        let never_written = s.pre_commit(1).unwrap();
        let closed = listing(dir.path());
        assert!(
            closed.len() == 1 && closed[0].ends_with(".inprogress"),
            "synced by the snapshot, not here: {closed:?}"
        );
        // Checkpoint 1's snapshot is never written (its write was declined): it aborts.
        drop(never_written);
        s.notify(CheckpointNotice::Aborted(1)).unwrap();
        s.write(&mut vec![3]).unwrap();
        let bytes = snapshot_bytes(s.pre_commit(2).unwrap());
        assert_eq!(
            listing(dir.path()),
            vec![pending_name(0, 1), pending_name(0, 2)],
            "a snapshot is written only once every transaction it lists is pre-committed"
        );
        s.write(&mut vec![4]).unwrap(); // in progress when the process dies
        s.write(&mut vec![]).unwrap();
        s.write_out().unwrap();
        drop(s);
        // A visible file after the restored checkpoint: committed at the end of a run that
        // crashed before its completion marker.
        std::fs::write(dir.path().join(committed_name(0, 3)), "4\n").unwrap();
        std::fs::write(dir.path().join("notes.txt"), "not the sink's").unwrap();

        // Restoring checkpoint 2 with nothing skipped: transaction 3 is written again alike.
        let mut ctx = ctx.clone();
        ctx.attempt = Arc::new(AttemptScope::new(Recovery { restored: Some(2), ..Recovery::default() }, false));
        let mut r = TwoPhaseFileSink::create(dir.path(), &ctx, format).unwrap();
        r.restore(&bytes).unwrap();
        assert_eq!(listing(dir.path()), vec!["notes.txt".to_string(), committed_name(0, 1), committed_name(0, 2)]);
        assert_eq!(std::fs::read_to_string(dir.path().join(committed_name(0, 1))).unwrap(), "1\n2\n");
        assert_eq!(std::fs::read_to_string(dir.path().join(committed_name(0, 2))).unwrap(), "3\n");
        // Restoring the same snapshot again (a second crash) changes nothing.
        let mut again = TwoPhaseFileSink::create(dir.path(), &ctx, format).unwrap();
        again.restore(&bytes).unwrap();
        assert_eq!(listing(dir.path()).len(), 3);
        // A pending file that vanished is an error that names it, not silent loss.
        std::fs::remove_file(dir.path().join(committed_name(0, 2))).unwrap();
        let err = again.restore(&bytes).unwrap_err().to_string();
        assert!(err.contains(&pending_name(0, 2)), "{err}");
    }

    /// The end of the input pre-commits the last transaction and every earlier one whose
    /// snapshot was never written; all wait, hidden, for the job's success.
    #[test]
    fn the_end_pre_commits_what_no_snapshot_did() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = TaskContext::for_test("sink", 0, 1);
        let mut s = TwoPhaseFileSink::create(dir.path(), &ctx, format).unwrap();
        s.write(&mut vec![1]).unwrap();
        drop(s.pre_commit(1).unwrap());
        s.write(&mut vec![2]).unwrap();
        s.finish().unwrap();
        assert_eq!(listing(dir.path()), vec![pending_name(0, 1), pending_name(0, 2)]);
        assert_eq!(std::fs::read_to_string(dir.path().join(pending_name(0, 1))).unwrap(), "1\n");
        assert_eq!(std::fs::read_to_string(dir.path().join(pending_name(0, 2))).unwrap(), "2\n");
    }

    /// A pre-commit that fails fails the snapshot with the file named, and is not retried: a
    /// commit of that transaction fails too, rather than commit what may not be on disk.
    #[test]
    fn a_failed_pre_commit_is_final() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("out");
        let ctx = TaskContext::for_test("sink", 0, 1);
        let mut s = TwoPhaseFileSink::create(&dir, &ctx, format).unwrap();
        s.write(&mut vec![1]).unwrap();
        let fork = s.pre_commit(1).unwrap().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let err = fork.write_to(&mut Vec::new()).unwrap_err().to_string();
        assert!(err.contains("cannot pre-commit output file") && err.contains(&pending_name(0, 1)), "{err}");
        std::fs::create_dir_all(&dir).unwrap();
        let again = s.notify(CheckpointNotice::Complete(1)).unwrap_err().to_string();
        assert!(again.contains(&pending_name(0, 1)), "{again}");
        assert!(listing(&dir).is_empty(), "nothing committed");
    }

    /// Output committed under checkpoints recovery cannot restore (a damaged one skipped, or
    /// none left) is never removed silently: the restore fails naming it, and removes it only
    /// when allowed, saying so.
    #[test]
    fn committed_output_is_retracted_only_when_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = TwoPhaseFileSink::create(dir.path(), &TaskContext::for_test("sink", 0, 1), format).unwrap();
        s.write(&mut vec![1]).unwrap();
        let bytes = snapshot_bytes(s.pre_commit(1).unwrap());
        s.notify(CheckpointNotice::Complete(1)).unwrap();
        s.write(&mut vec![2]).unwrap();
        drop(s.pre_commit(2).unwrap().unwrap().write_to(&mut Vec::new()));
        s.notify(CheckpointNotice::Complete(2)).unwrap();
        let committed = listing(dir.path());
        assert_eq!(committed, vec![committed_name(0, 1), committed_name(0, 2)]);
        let restoring = |recovery: Recovery| {
            let mut ctx = TaskContext::for_test("sink", 0, 1);
            ctx.attempt = Arc::new(AttemptScope::new(recovery, false));
            (TwoPhaseFileSink::create(dir.path(), &ctx, format).unwrap(), ctx)
        };
        // Checkpoint 2 damaged, 1 restored: part 2 would be lost.
        let damaged = Recovery { restored: Some(1), skipped: vec![2], allow_retracting_output: false };
        let err = restoring(damaged.clone()).0.restore(&bytes).unwrap_err().to_string();
        assert!(err.contains(&committed_name(0, 2)) && err.contains("checkpoint(s) 2 are damaged"), "{err}");
        assert!(err.contains("--allow-retracting-output"), "{err}");
        assert_eq!(listing(dir.path()), committed, "nothing was removed");
        // No checkpoint left at all: everything committed would go.
        let err = restoring(Recovery::default()).0.pre_commit(3).err().unwrap().to_string();
        assert!(err.contains(&committed_name(0, 2)) && err.contains("no checkpoint to restore"), "{err}");
        assert_eq!(listing(dir.path()), committed, "nothing was removed");
        // Allowed: removed, and said.
        let (mut r, ctx) = restoring(Recovery { allow_retracting_output: true, ..damaged });
        r.restore(&bytes).unwrap();
        assert_eq!(listing(dir.path()), vec![committed_name(0, 1)]);
        let notes = ctx.attempt.notes.lock().unwrap().join("\n");
        assert!(notes.contains("removed committed output") && notes.contains(&committed_name(0, 2)), "{notes}");
    }

    #[test]
    fn names_parse_back() {
        assert_eq!(parse_name(&committed_name(3, 17)), Some(OwnFile::Committed { subtask: 3, txn: 17 }));
        assert_eq!(parse_name(&pending_name(2, 5)), Some(OwnFile::Hidden { subtask: 2 }));
        assert_eq!(parse_name(".part-1-abc-3.inprogress"), Some(OwnFile::Hidden { subtask: 1 }));
        assert_eq!(parse_name("part-1-x"), None);
        assert_eq!(parse_name("notes.txt"), None);
    }
}
