//! Local recovery: the process keeps the state of the newest completed checkpoint as the
//! tasks captured it (their copy-on-write forks, shared, not copied), so that a failover in a
//! live process restores from memory instead of reading the checkpoint's files (Flink's local
//! recovery, with the copy in memory rather than on a local disk). A restarted process has
//! no copy and reads the files; so does a failover when the copy is not the checkpoint
//! recovery chose (the coordinator completed a newer one whose copy is incomplete, say).
//!
//! The copy outlives attempts (it lives in the job's `AttemptShared`), never processes. A
//! task hands its parts here after its snapshot was written; the coordinator promotes a
//! checkpoint's parts when it completes (once every task's are here) and drops them when it
//! aborts. Keeping a fork keeps its pages shared, so the live state copies a page the first
//! time it writes to it after a checkpoint (as it does anyway while a snapshot is written).
//!
//! May touch: `snapshot`.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use crate::snapshot::{RestoredState, SharedFork, SnapshotPart};

/// One operator subtask's captured state, or a task's in-flight data.
pub(crate) struct LocalPart {
    pub(crate) operator: Arc<str>,
    pub(crate) subtask: usize,
    pub(crate) state: SharedFork,
}

impl From<SnapshotPart> for LocalPart {
    fn from(p: SnapshotPart) -> Self {
        LocalPart { operator: p.operator, subtask: p.subtask, state: Arc::new(Mutex::new(p.state)) }
    }
}

/// Every task's parts of one checkpoint.
pub(crate) struct LocalCheckpoint {
    pub(crate) id: u64,
    pub(crate) parts: Vec<LocalPart>,
}

impl LocalCheckpoint {
    /// The state to restore: parts whose fork an operator can take as it is
    /// ([`ForkedState::as_any`]) are handed over as forks, the rest encoded here. `None` if a
    /// part cannot be encoded (the files are read instead).
    pub(crate) fn restored(&self) -> Option<RestoredState> {
        let mut r = RestoredState::new(self.id);
        r.set_from_memory();
        for p in &self.parts {
            let state = p.state.lock().unwrap_or_else(|e| e.into_inner());
            if state.as_any().is_some() {
                r.insert_local(p.operator.to_string(), p.subtask, Arc::clone(&p.state));
            } else {
                r.insert(p.operator.to_string(), p.subtask, crate::snapshot::encoded(&**state).ok()?);
            }
        }
        Some(r)
    }
}

#[derive(Default)]
struct Pending {
    tasks: HashSet<usize>,
    parts: Vec<LocalPart>,
}

#[derive(Default)]
struct Copies {
    /// Checkpoints some of whose tasks wrote their parts, not yet complete.
    pending: BTreeMap<u64, Pending>,
    completed: Option<Arc<LocalCheckpoint>>,
}

/// The process's copy of the newest completed checkpoint (see the module doc).
#[derive(Default)]
pub(crate) struct LocalCopies {
    inner: Mutex<Copies>,
}

impl LocalCopies {
    fn lock(&self) -> std::sync::MutexGuard<'_, Copies> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Task `task` wrote its parts of checkpoint `id` (called after the write succeeded).
    pub(crate) fn written(&self, id: u64, task: usize, parts: Vec<LocalPart>) {
        let mut copies = self.lock();
        if copies.completed.as_ref().is_some_and(|c| c.id >= id) {
            return;
        }
        let pending = copies.pending.entry(id).or_default();
        pending.tasks.insert(task);
        pending.parts.extend(parts);
    }

    /// Checkpoint `id` of `tasks` tasks completed: its parts become the copy if every task's
    /// are here; else there is no copy (recovery reads the files). Older pending ones go.
    pub(crate) fn completed(&self, id: u64, tasks: usize) {
        let mut copies = self.lock();
        let pending = copies.pending.remove(&id);
        copies.pending = copies.pending.split_off(&id);
        copies.completed =
            pending.filter(|p| p.tasks.len() == tasks).map(|p| Arc::new(LocalCheckpoint { id, parts: p.parts }));
    }

    /// Checkpoint `id` was aborted: its parts go.
    pub(crate) fn aborted(&self, id: u64) {
        self.lock().pending.remove(&id);
    }

    /// The copy of the newest completed checkpoint, if this process has one.
    pub(crate) fn latest(&self) -> Option<Arc<LocalCheckpoint>> {
        self.lock().completed.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::RawBytes;

    fn part(op: &str, subtask: usize, bytes: &[u8]) -> SnapshotPart {
        SnapshotPart { operator: op.into(), subtask, state: Box::new(RawBytes(bytes.to_vec())) }
    }

    #[test]
    fn a_checkpoint_is_the_copy_once_complete_with_every_task_part() {
        let copies = LocalCopies::default();
        copies.written(1, 0, vec![LocalPart::from(part("src", 0, b"a"))]);
        copies.written(1, 1, vec![LocalPart::from(part("sum", 0, b"b"))]);
        assert!(copies.latest().is_none(), "not complete yet");
        copies.completed(1, 2);
        let c = copies.latest().expect("complete with both tasks' parts");
        let r = c.restored().unwrap();
        assert_eq!((r.checkpoint, r.get("src", 0), r.get("sum", 0)), (1, Some(&b"a"[..]), Some(&b"b"[..])));

        // A checkpoint one task's part of which is missing leaves no copy: the files are read.
        copies.written(2, 0, vec![LocalPart::from(part("src", 0, b"c"))]);
        copies.completed(2, 2);
        assert!(copies.latest().is_none());

        // An aborted one goes; a later one completes on its own.
        copies.written(3, 0, vec![LocalPart::from(part("src", 0, b"d"))]);
        copies.aborted(3);
        copies.written(4, 0, vec![LocalPart::from(part("src", 0, b"e"))]);
        copies.completed(4, 1);
        assert_eq!(copies.latest().unwrap().id, 4);
        assert!(copies.lock().pending.is_empty());
        // A part written late for a checkpoint older than the copy is not kept.
        copies.written(3, 1, vec![LocalPart::from(part("sum", 0, b"f"))]);
        assert!(copies.lock().pending.is_empty());
    }
}
