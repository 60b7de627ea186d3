//! What a crash does to the disk: snapshot writes queued (so a crash can drop them or leave
//! them half written) and checkpoint files damaged or misplaced while the process is down.
//!
//! May touch: `checkpoint`, `prng`.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use crate::checkpoint::task::{SnapshotWrite, SnapshotWriter};
use crate::checkpoint::CheckpointStorage;
use crate::prng::Prng;

/// The snapshot writes of a simulated attempt: queued, and run by the simulator when its
/// schedule says (in any order, or never, when the process crashes first).
pub(super) struct QueuedWrites {
    pub(super) queue: Mutex<Vec<SnapshotWrite>>,
    pub(super) limit_writes: usize,
    /// Where the writes go (to cut a file short when the process dies mid-write).
    pub(super) storage: CheckpointStorage,
}

impl SnapshotWriter for QueuedWrites {
    fn submit(&self, write: SnapshotWrite) -> std::result::Result<(), SnapshotWrite> {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() >= self.limit_writes {
            return Err(write);
        }
        q.push(write);
        Ok(())
    }

    fn limit_writes(&self) -> usize {
        self.limit_writes
    }

    fn wait_idle(&self, _limit: Duration) -> bool {
        // The simulator runs or drops every queued write itself before the attempt ends.
        true
    }
}

impl QueuedWrites {
    pub(super) fn take(&self, rng: &mut Prng) -> Option<SnapshotWrite> {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.is_empty() {
            return None;
        }
        let i = rng.below(q.len() as u64) as usize;
        Some(q.swap_remove(i))
    }

    pub(super) fn drain(&self) -> Vec<SnapshotWrite> {
        std::mem::take(&mut *self.queue.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Damages checkpoint `id` while the process is down: one byte of one of its files flipped,
/// or (`misplace`) one task file replaced by another task's.
pub(super) fn damage(storage: &CheckpointStorage, id: u64, misplace: bool, rng: &mut Prng) {
    let folder = storage.checkpoint_dir(id);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&folder)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.is_file()).collect())
        .unwrap_or_default();
    files.sort();
    let tasks: Vec<&PathBuf> = files.iter().filter(|p| p.extension().is_some_and(|e| e == "state")).collect();
    if misplace && tasks.len() >= 2 {
        let a = rng.below(tasks.len() as u64) as usize;
        let b = (a + 1 + rng.below(tasks.len() as u64 - 1) as usize) % tasks.len();
        let _ = std::fs::copy(tasks[a], tasks[b]);
        return;
    }
    if files.is_empty() {
        return;
    }
    let file = &files[rng.below(files.len() as u64) as usize];
    if let Ok(mut bytes) = std::fs::read(file) {
        if !bytes.is_empty() {
            let i = rng.below(bytes.len() as u64) as usize;
            bytes[i] ^= 0x20;
            let _ = std::fs::write(file, bytes);
        }
    }
}

/// A process crash with snapshot writes queued: each is lost, or dies half written (its
/// task file cut in half, its acknowledgement never sent).
pub(super) fn crash_writes(writes: &QueuedWrites, rng: &mut Prng) {
    for write in writes.drain() {
        if rng.chance(1, 2) {
            let Some(ack) = write() else { continue };
            if let Ok(done) = ack.result {
                writes.storage.cut_in_half(ack.checkpoint, &done.file, done.digest.bytes);
            }
        }
    }
}
