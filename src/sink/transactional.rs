//! A transactional collecting sink, for tests and for seeing exactly-once at work: records are
//! buffered per checkpoint and published only when that checkpoint completes (two-phase
//! commit: pre-commit on the barrier, commit on the completion notice). Output after the last
//! checkpoint is published only if the whole job finishes successfully.
//!
//! Commits are idempotent (each subtask's transaction id is published once), as two-phase
//! commit requires: a restart may commit again what the restored checkpoint pre-committed.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use super::Sink;
use crate::context::TaskContext;
use crate::error::Result;
use crate::persist::from_bytes;
use crate::record::Record;
use crate::snapshot::{CheckpointNotice, ForkedState, PersistedFork};

struct Log<T> {
    records: Vec<T>,
    published: HashSet<(usize, u64)>,
}

/// What a transactional collecting sink has published (committed) so far.
pub struct CommittedOutput<T> {
    log: Arc<Mutex<Log<T>>>,
}

impl<T> Clone for CommittedOutput<T> {
    fn clone(&self) -> Self {
        CommittedOutput { log: self.log.clone() }
    }
}

impl<T: Clone> CommittedOutput<T> {
    pub(crate) fn new() -> Self {
        CommittedOutput { log: Arc::new(Mutex::new(Log { records: Vec::new(), published: HashSet::new() })) }
    }

    /// Every committed record, in commit order.
    pub fn records(&self) -> Vec<T> {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).records.clone()
    }

    fn publish(&self, subtask: usize, txn: u64, records: Vec<T>) {
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        if log.published.insert((subtask, txn)) {
            log.records.extend(records);
        }
    }
}

/// One subtask of the transactional collecting sink.
pub(crate) struct TransactionalCollectSink<T> {
    out: CommittedOutput<T>,
    ctx: TaskContext,
    current: Vec<T>,
    /// Pre-committed transactions: (checkpoint id, records), oldest first.
    pending: Vec<(u64, Vec<T>)>,
}

impl<T: Record> TransactionalCollectSink<T> {
    pub(crate) fn new(out: CommittedOutput<T>, ctx: TaskContext) -> Self {
        TransactionalCollectSink { out, ctx, current: Vec::new(), pending: Vec::new() }
    }
}

impl<T: Record> Sink<T> for TransactionalCollectSink<T> {
    fn write(&mut self, records: &mut Vec<T>) -> Result<()> {
        self.current.append(records);
        Ok(())
    }

    fn pre_commit(&mut self, checkpoint: u64) -> Result<Option<Box<dyn ForkedState>>> {
        self.pending.push((checkpoint, std::mem::take(&mut self.current)));
        Ok(Some(Box::new(PersistedFork(self.pending.clone()))))
    }

    fn notify(&mut self, notice: CheckpointNotice) -> Result<()> {
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
        // Everything the restored (complete) checkpoint pre-committed is committed now.
        let pending: Vec<(u64, Vec<T>)> = from_bytes(bytes)?;
        for (txn, records) in pending {
            self.out.publish(self.ctx.subtask, txn, records);
        }
        Ok(())
    }

    fn restore_rescaled(&mut self, parts: &[(usize, &[u8])], _scope: &crate::record::KeyScope) -> Result<()> {
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
        let mut rest = std::mem::take(&mut self.pending);
        rest.push((super::FINAL_TXN, std::mem::take(&mut self.current)));
        let (out, subtask) = (self.out.clone(), self.ctx.subtask);
        self.ctx.on_job_success(move || {
            for (txn, records) in rest {
                out.publish(subtask, txn, records);
            }
            Ok(())
        });
        Ok(())
    }
}
