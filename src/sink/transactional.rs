//! A transactional collecting sink, for tests and for seeing exactly-once at work: records are
//! buffered per checkpoint and published only when that checkpoint completes (two-phase
//! commit: pre-commit on the barrier, commit on the completion notice). Output after the last
//! checkpoint is published only if the whole job finishes successfully.
//!
//! Commits are idempotent (each subtask's transaction id is published once), as two-phase
//! commit requires: a restart may commit again what the restored checkpoint pre-committed.
//! Output published under a checkpoint that recovery can no longer restore (it is damaged, so
//! recovery fell back past it) would be published a second time by the replay: such a restart
//! is refused, as the file sinks refuse it, unless the job allows retracting output, in which
//! case those transactions are withdrawn first and computed again.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use super::Sink;
use crate::context::TaskContext;
use crate::error::{Error, Result};
use crate::persist::from_bytes;
use crate::record::Record;
use crate::snapshot::{CheckpointNotice, ForkedState, PersistedFork};

/// One published transaction: the subtask that committed it, its id, its records.
struct Published<T> {
    subtask: usize,
    txn: u64,
    records: Vec<T>,
}

struct Log<T> {
    transactions: Vec<Published<T>>,
    published: HashSet<(usize, u64)>,
    retracted: u64,
}

/// What a transactional collecting sink has published (committed) so far.
pub struct CommittedOutput<T> {
    log: Arc<Mutex<Log<T>>>,
}

impl<T> Clone for CommittedOutput<T> {
    fn clone(&self) -> Self {
        CommittedOutput { log: Arc::clone(&self.log) }
    }
}

impl<T: Clone> CommittedOutput<T> {
    pub(crate) fn new() -> Self {
        CommittedOutput {
            log: Arc::new(Mutex::new(Log { transactions: Vec::new(), published: HashSet::new(), retracted: 0 })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Log<T>> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every committed record, in commit order.
    pub fn records(&self) -> Vec<T> {
        self.lock().transactions.iter().flat_map(|t| t.records.iter().cloned()).collect()
    }

    /// Transactions withdrawn so far because recovery could not restore the checkpoint they
    /// were committed under (only where the job allows retracting output).
    pub fn retracted(&self) -> u64 {
        self.lock().retracted
    }

    fn publish(&self, subtask: usize, txn: u64, records: Vec<T>) {
        let mut log = self.lock();
        if log.published.insert((subtask, txn)) {
            log.transactions.push(Published { subtask, txn, records });
        }
    }

    /// The transactions published by a subtask that `owns` and not covered by checkpoint
    /// `restored` (all of them with none): `(subtask, txn)`, sorted.
    fn published_after(&self, restored: Option<u64>, owns: impl Fn(usize) -> bool) -> Vec<(usize, u64)> {
        let mut lost: Vec<(usize, u64)> = self
            .lock()
            .published
            .iter()
            .copied()
            .filter(|&(s, txn)| owns(s) && restored.is_none_or(|k| txn > k))
            .collect();
        lost.sort_unstable();
        lost
    }

    fn retract(&self, lost: &[(usize, u64)]) {
        let mut log = self.lock();
        log.transactions.retain(|t| !lost.contains(&(t.subtask, t.txn)));
        for key in lost {
            log.published.remove(key);
        }
        log.retracted += lost.len() as u64;
    }
}

/// One subtask of the transactional collecting sink.
pub(crate) struct TransactionalCollectSink<T> {
    out: CommittedOutput<T>,
    ctx: TaskContext,
    current: Vec<T>,
    /// Pre-committed transactions: (checkpoint id, records), oldest first.
    pending: Vec<(u64, Vec<T>)>,
    /// Whether output that this start cannot reproduce exactly has been looked for.
    prepared: bool,
}

impl<T: Record> TransactionalCollectSink<T> {
    pub(crate) fn new(out: CommittedOutput<T>, ctx: TaskContext) -> Self {
        TransactionalCollectSink { out, ctx, current: Vec::new(), pending: Vec::new(), prepared: false }
    }

    /// Before anything is published in this start: transactions an earlier run of this subtask
    /// (or, after a rescale, of the old subtasks it stands for) published that the restored
    /// checkpoint does not cover would be published again by the replay. They are withdrawn if
    /// the job allows retracting output; otherwise the start is refused, naming them.
    fn prepare(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.prepared, true) {
            return Ok(());
        }
        let (p, me) = (self.ctx.parallelism, self.ctx.subtask);
        let recovery = self.ctx.recovery();
        let lost = self.out.published_after(recovery.restored, |s| s % p == me);
        if lost.is_empty() {
            return Ok(());
        }
        let from = recovery.restored.map_or("the start".to_string(), |k| format!("checkpoint {k}"));
        let names = lost.iter().map(|(s, t)| format!("subtask {s} transaction {t}")).collect::<Vec<_>>().join(", ");
        if !recovery.allow_retracting_output {
            return Err(Error::config(format!(
                "recovery from {from} would commit output a second time: {names} (committed under checkpoints that \
                 can no longer be restored: {}). Nothing was published. To withdraw that output and compute it \
                 again from {from}, allow retracting output (weir: --allow-retracting-output; \
                 CheckpointConfig::allow_retracting_output)",
                recovery.why_lost()
            )));
        }
        self.ctx.note(format!(
            "withdrew committed output that recovery from {from} computes again ({}): {names}",
            recovery.why_lost()
        ));
        self.out.retract(&lost);
        Ok(())
    }
}

impl<T: Record> Sink<T> for TransactionalCollectSink<T> {
    fn write(&mut self, records: &mut Vec<T>) -> Result<()> {
        self.prepare()?;
        self.current.append(records);
        Ok(())
    }

    fn pre_commit(&mut self, checkpoint: u64) -> Result<Option<Box<dyn ForkedState>>> {
        self.prepare()?;
        self.pending.push((checkpoint, std::mem::take(&mut self.current)));
        Ok(Some(Box::new(PersistedFork(self.pending.clone()))))
    }

    fn notify(&mut self, notice: CheckpointNotice) -> Result<()> {
        self.prepare()?;
        // An aborted checkpoint's transaction stays pending and is committed with the next
        // completed one (its records are still valid; only the checkpoint failed).
        if let CheckpointNotice::Complete(id) = notice {
            for (txn, records) in super::committed_by(&mut self.pending, id) {
                self.out.publish(self.ctx.subtask, txn, records);
            }
        }
        Ok(())
    }

    fn restore(&mut self, bytes: &[u8]) -> Result<()> {
        self.prepare()?;
        // Everything the restored (complete) checkpoint pre-committed is committed now.
        let pending: Vec<(u64, Vec<T>)> = from_bytes(bytes)?;
        for (txn, records) in pending {
            self.out.publish(self.ctx.subtask, txn, records);
        }
        Ok(())
    }

    fn restore_rescaled(&mut self, parts: &[(usize, &[u8])], _scope: &crate::record::KeyScope) -> Result<()> {
        self.prepare()?;
        // Every new subtask sees every old one's pending transactions; commits are keyed by the
        // old subtask, so each is published once.
        for (old, bytes) in parts {
            let pending: Vec<(u64, Vec<T>)> = from_bytes(bytes)?;
            for (txn, records) in pending {
                self.out.publish(*old, txn, records);
            }
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        self.prepare()?;
        let mut rest = std::mem::take(&mut self.pending);
        rest.push((super::FINAL_TXN, std::mem::take(&mut self.current)));
        let (out, subtask) = (self.out.clone(), self.ctx.subtask);
        self.ctx.on_job_success(move || {
            for (txn, records) in std::mem::take(&mut rest) {
                out.publish(subtask, txn, records);
            }
            Ok(())
        });
        Ok(())
    }
}

// Their fields are closures, shared internals or whole state: a name says enough.
crate::debug_as_name!([T] CommittedOutput<T>);

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::context::{AttemptScope, Recovery};
    use crate::persist::Persist;

    fn sink(out: &CommittedOutput<u64>, recovery: Recovery) -> (TransactionalCollectSink<u64>, TaskContext) {
        let mut ctx = TaskContext::for_test("sink", 0, 1);
        ctx.attempt = Arc::new(AttemptScope::new(recovery, false));
        (TransactionalCollectSink::new(out.clone(), ctx.clone()), ctx)
    }

    /// What the simulator found (`weir simulate --job owned --mode aligned --parallelism 4
    /// --seeds 170`): checkpoints 1 and 2 committed, then damage that reached both (a part
    /// checkpoint 2 reused is the same file as 1's), so recovery started over. The replay
    /// published everything a second time. Now that start is refused, naming what it would
    /// commit again, and with retracting allowed the old output is withdrawn first.
    #[test]
    fn a_start_that_would_commit_output_again_is_refused_or_withdraws_it() {
        let out = CommittedOutput::new();
        let (mut s, _) = sink(&out, Recovery::default());
        for (txn, record) in [(1, 10), (2, 20)] {
            s.write(&mut vec![record]).unwrap();
            drop(s.pre_commit(txn).unwrap());
            s.notify(CheckpointNotice::Complete(txn)).unwrap();
        }
        assert_eq!(out.records(), vec![10, 20]);
        let lost = Recovery { restored: None, skipped: vec![2, 1], allow_retracting_output: false };
        let err = sink(&out, lost.clone()).0.write(&mut vec![10]).unwrap_err().to_string();
        assert!(err.contains("transaction 1, subtask 0 transaction 2") && err.contains("are damaged"), "{err}");
        assert!(err.contains("--allow-retracting-output"), "{err}");
        assert_eq!(out.records(), vec![10, 20], "nothing withdrawn, nothing published");
        // Restoring checkpoint 1 with 2 damaged: only transaction 2 is in question.
        let mut pending = Vec::new();
        vec![(1u64, vec![10u64])].persist(&mut pending);
        let after_one = Recovery { restored: Some(1), skipped: vec![2], allow_retracting_output: false };
        let err = sink(&out, after_one).0.restore(&pending).unwrap_err().to_string();
        assert!(err.contains("subtask 0 transaction 2") && !err.contains("transaction 1"), "{err}");
        // Allowed: withdrawn, said, and the replay publishes it again once.
        let (mut s, ctx) = sink(&out, Recovery { allow_retracting_output: true, ..lost });
        s.write(&mut vec![10]).unwrap();
        assert_eq!((out.records(), out.retracted()), (vec![], 2));
        let notes = ctx.attempt.notes.lock().unwrap().join("\n");
        assert!(notes.contains("withdrew committed output") && notes.contains("transaction 2"), "{notes}");
        drop(s.pre_commit(3).unwrap());
        s.notify(CheckpointNotice::Complete(3)).unwrap();
        assert_eq!(out.records(), vec![10]);
    }

    /// A restore of the newest checkpoint, or a start with no output published, is as before.
    #[test]
    fn an_ordinary_restore_commits_the_restored_transactions_once() {
        let out = CommittedOutput::new();
        let mut pending = Vec::new();
        vec![(4u64, vec![7u64, 8])].persist(&mut pending);
        let recovery = Recovery { restored: Some(4), ..Recovery::default() };
        for _ in 0..2 {
            sink(&out, recovery.clone()).0.restore(&pending).unwrap();
        }
        assert_eq!((out.records(), out.retracted()), (vec![7, 8], 0));
    }
}
