//! The task side of checkpointing: the control inbox (triggers and notices from the
//! coordinator), the [`BarrierAligner`], and the asynchronous part of a snapshot (written on
//! rayon's pool, then acknowledged to the coordinator).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::config::CheckpointMode;
use super::incremental::{write_task_snapshot, PageIndex};
use super::storage::{CheckpointStorage, FileDigest, SharedFile};
use crate::context::Clock;
use crate::error::{Error, Result};
use crate::snapshot::{Barrier, CheckpointNotice, FaultInjector, TaskSnapshot};

/// From the coordinator to one task.
#[derive(Clone, Copy, Debug)]
pub(crate) enum TaskControl {
    /// Sources only: take checkpoint `barrier.id` now and inject the barrier.
    Trigger(Barrier),
    /// A checkpoint's fate.
    Notice(CheckpointNotice),
    /// Sources only: the final checkpoint (the first triggered once every source had reached
    /// the end of its input) completed: end the streams now.
    EndOfInput,
}

/// Per-task timings and sizes of one checkpoint.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TaskStats {
    pub(crate) start_delay_ns: u64,
    pub(crate) alignment_ns: u64,
    pub(crate) sync_ns: u64,
    pub(crate) async_ns: u64,
    pub(crate) state_bytes: u64,
    pub(crate) written_bytes: u64,
    pub(crate) inflight_bytes: u64,
}

/// One task's part of a checkpoint, durable.
#[derive(Debug)]
pub(crate) struct TaskDone {
    /// The task file (relative to the checkpoint's folder), its length and checksum.
    pub(crate) file: String,
    pub(crate) digest: FileDigest,
    pub(crate) stats: TaskStats,
    /// Shared files (incremental checkpoints) the task file refers to.
    pub(crate) shared: Vec<SharedFile>,
}

/// From one task to the coordinator: its part of a checkpoint is durable, or it declines.
#[derive(Debug)]
pub(crate) struct TaskAck {
    pub(crate) checkpoint: u64,
    pub(crate) task: usize,
    /// Why a task declined: retryable (the next checkpoint may succeed) or not (the job
    /// cannot go on, e.g. it lost its checkpoint directory).
    pub(crate) result: std::result::Result<TaskDone, Error>,
}

/// What happened to a barrier at the aligner.
#[derive(Debug, PartialEq, Eq)]
pub enum Alignment {
    /// From a checkpoint already done or abandoned here: ignore it (and unblock its channel).
    Stale,
    /// Waiting for other channels.
    Waiting,
    /// A newer checkpoint's barrier abandoned the one being aligned: unblock every channel
    /// but this one.
    Superseded,
}

struct Pending {
    barrier: Barrier,
    first_ns: u64,
    /// Per channel: where its copy of the barrier was (its read position), once seen.
    seen: Vec<Option<u64>>,
}

/// Tracks which input channels of a task delivered the barrier of the checkpoint in progress.
/// Channels that ended count as delivered (their producer finished and sends no barrier).
pub struct BarrierAligner {
    channels: usize,
    pending: Option<Pending>,
    /// The newest checkpoint snapshotted or abandoned here.
    done: u64,
}

impl BarrierAligner {
    /// An aligner over `channels` input channels.
    pub fn new(channels: usize) -> Self {
        BarrierAligner { channels, pending: None, done: 0 }
    }

    /// Channel `channel` delivered `barrier` at `now_ns`, at read position `position`.
    pub fn on_barrier(&mut self, channel: usize, barrier: Barrier, now_ns: u64, position: u64) -> Alignment {
        assert!(channel < self.channels, "channel {channel} out of range");
        if barrier.id <= self.done {
            return Alignment::Stale;
        }
        let mut result = Alignment::Waiting;
        match &self.pending {
            Some(p) if p.barrier.id == barrier.id => {}
            Some(p) if p.barrier.id > barrier.id => return Alignment::Stale,
            Some(p) => {
                self.done = p.barrier.id;
                self.pending = None;
                result = Alignment::Superseded;
            }
            None => {}
        }
        let p =
            self.pending.get_or_insert_with(|| Pending { barrier, first_ns: now_ns, seen: vec![None; self.channels] });
        p.seen[channel] = Some(position);
        result
    }

    /// If every channel delivered the pending barrier or ended: the barrier, and when its
    /// first copy arrived. The aligner is then ready for the next checkpoint.
    pub fn complete(&mut self, ended: impl Fn(usize) -> bool) -> Option<(Barrier, u64)> {
        let p = self.pending.as_ref()?;
        if (0..self.channels).all(|i| p.seen[i].is_some() || ended(i)) {
            let p = self.pending.take().expect("checked");
            self.done = p.barrier.id;
            return Some((p.barrier, p.first_ns));
        }
        None
    }

    /// The checkpoint being aligned, and when its first barrier arrived.
    pub fn pending(&self) -> Option<(Barrier, u64)> {
        self.pending.as_ref().map(|p| (p.barrier, p.first_ns))
    }

    /// The newest checkpoint snapshotted or abandoned here: its barriers and older ones are
    /// stale.
    pub fn done(&self) -> u64 {
        self.done
    }

    /// The channels that delivered the barrier being aligned.
    pub fn delivered(&self) -> Vec<usize> {
        self.pending.as_ref().map_or_else(Vec::new, |p| (0..self.channels).filter(|&i| p.seen[i].is_some()).collect())
    }

    /// Gives up aligning (the checkpoint switches to unaligned here): the barrier, when it
    /// first arrived, and the position of each channel's barrier seen so far.
    pub fn take_pending(&mut self) -> Option<(Barrier, u64, Vec<Option<u64>>)> {
        let p = self.pending.take()?;
        self.done = p.barrier.id;
        Some((p.barrier, p.first_ns, p.seen))
    }

    /// The coordinator aborted `id`: returns whether it was being aligned here.
    pub fn abort(&mut self, id: u64) -> bool {
        if self.pending.as_ref().is_some_and(|p| p.barrier.id == id) {
            self.pending = None;
            self.done = self.done.max(id);
            return true;
        }
        self.done = self.done.max(id);
        false
    }
}

/// An unaligned checkpoint whose synchronous part is done at this task while its in-flight
/// data is still being captured.
pub(crate) struct PendingSnapshot {
    pub(crate) snapshot: TaskSnapshot,
    pub(crate) stats: TaskStats,
    pub(crate) started_ns: u64,
}

/// One task's part of a checkpoint, written in the background; returns the task's
/// acknowledgement (or decline) for the coordinator.
pub(crate) type SnapshotWrite = Box<dyn FnOnce() -> TaskAck + Send>;

/// Where the asynchronous part of snapshots runs: rayon's pool in production
/// ([`PoolWriter`]), a queue the simulator runs on its own thread under simulation. Both bound
/// the writes queued or running, so a storage slower than the checkpoint interval declines
/// checkpoints instead of queueing snapshots (and their memory) without end.
pub(crate) trait SnapshotWriter: Send + Sync {
    /// Queues `write`; gives it back when the limit of writes is reached.
    fn submit(&self, write: SnapshotWrite) -> std::result::Result<(), SnapshotWrite>;
    /// The most writes queued or running at once.
    fn limit_writes(&self) -> usize;
    /// Waits until no write runs, for at most `limit` (wall time). Returns whether none does.
    fn wait_idle(&self, limit: Duration) -> bool;
}

/// The default bound on snapshot writes queued or running in one attempt: enough for every
/// task of a large job to have two checkpoints in flight.
pub(crate) const DEFAULT_QUEUE_LIMIT_WRITES: usize = 1024;

/// Snapshot writes on rayon's pool; acknowledgements go to the coordinator's channel. When the
/// attempt ends, the coordinator waits for them before it removes the folders of checkpoints
/// that can no longer complete: a writer still running could otherwise create a file in a
/// folder being removed (which then stays), or keep the space of a removed file held open.
pub(crate) struct PoolWriter {
    in_flight: Arc<AtomicUsize>,
    limit_writes: usize,
    acks: Sender<TaskAck>,
}

impl PoolWriter {
    pub(crate) fn new(acks: Sender<TaskAck>, limit_writes: usize) -> Self {
        PoolWriter { in_flight: Arc::default(), limit_writes, acks }
    }
}

/// One write in flight; counted out when dropped (also if the write panics).
struct WriteInFlight(Arc<AtomicUsize>);

impl Drop for WriteInFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl SnapshotWriter for PoolWriter {
    fn submit(&self, write: SnapshotWrite) -> std::result::Result<(), SnapshotWrite> {
        if self.in_flight.fetch_add(1, Ordering::SeqCst) >= self.limit_writes {
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            return Err(write);
        }
        let (in_flight, acks) = (WriteInFlight(self.in_flight.clone()), self.acks.clone());
        rayon::spawn(move || {
            let _in_flight = in_flight;
            // The coordinator may be gone (the attempt ended); nothing to tell then.
            let _ = acks.send(write());
        });
        Ok(())
    }

    fn limit_writes(&self) -> usize {
        self.limit_writes
    }

    fn wait_idle(&self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        while self.in_flight.load(Ordering::SeqCst) > 0 {
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }
}

/// How many tasks of an attempt have applied each checkpoint's completion notice (so their
/// sinks committed its transactions): a stop with a savepoint waits for all of them before it
/// cancels the job, as Flink commits a stop-with-savepoint's transactions before the job ends.
#[derive(Debug, Default)]
pub(crate) struct CommitsApplied {
    /// Per task, the newest checkpoint whose completion it applied (notices come in order).
    newest: std::sync::Mutex<std::collections::HashMap<usize, u64>>,
    changed: std::sync::Condvar,
}

impl CommitsApplied {
    fn applied(&self, task: usize, id: u64) {
        let mut newest = self.newest.lock().unwrap_or_else(|e| e.into_inner());
        let n = newest.entry(task).or_default();
        *n = (*n).max(id);
        self.changed.notify_all();
    }

    /// Whether `tasks` tasks applied checkpoint `id`'s completion.
    pub(crate) fn all_applied(&self, id: u64, tasks: usize) -> bool {
        self.newest.lock().unwrap_or_else(|e| e.into_inner()).values().filter(|&&n| n >= id).count() >= tasks
    }

    /// Waits until `tasks` tasks applied checkpoint `id`'s completion, for at most `limit` or
    /// until `ended()` (the attempt's workers are gone). Returns whether they did.
    pub(crate) fn wait(&self, id: u64, tasks: usize, ended: impl Fn() -> bool, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        let mut newest = self.newest.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if newest.values().filter(|&&n| n >= id).count() >= tasks {
                return true;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() || ended() {
                return false;
            }
            // Bounded, so workers that end (and never apply it) are seen too.
            let wait = left.min(Duration::from_millis(10));
            newest = self.changed.wait_timeout(newest, wait).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

/// Everything a task needs to take part in checkpoints.
pub(crate) struct TaskCheckpointing {
    pub(crate) task: usize,
    pub(crate) mode: CheckpointMode,
    /// Unaligned checkpoints: barriers arrive in priority slots.
    pub(crate) unaligned: bool,
    pub(crate) pending_unaligned: Option<PendingSnapshot>,
    /// The newest unaligned checkpoint snapshotted (or abandoned) here.
    pub(crate) unaligned_done: u64,
    pub(crate) control: Receiver<TaskControl>,
    pub(crate) acks: Sender<TaskAck>,
    pub(crate) storage: Arc<CheckpointStorage>,
    pub(crate) writer: Arc<dyn SnapshotWriter>,
    /// Incremental checkpoints: where this task's pages were stored.
    pub(crate) pages: Option<Arc<PageIndex>>,
    pub(crate) faults: Option<Arc<FaultInjector>>,
    pub(crate) clock: Clock,
    pub(crate) aligner: BarrierAligner,
    /// With unaligned on: switch a checkpoint to unaligned here after aligning this long.
    pub(crate) alignment_timeout_ns: Option<u64>,
    /// Where this task counts the completion notices it applied.
    pub(crate) commits: Arc<CommitsApplied>,
}

impl TaskCheckpointing {
    /// This task's chain heard (and its sinks committed) checkpoint `id`'s completion.
    pub(crate) fn completion_applied(&self, id: u64) {
        self.commits.applied(self.task, id);
    }

    /// The next message from the coordinator, if any (never blocks).
    #[inline]
    pub(crate) fn next_control(&self) -> Option<TaskControl> {
        self.control.try_recv().ok()
    }

    /// Whether input gates block a channel that delivered a barrier.
    pub(crate) fn blocks(&self) -> bool {
        self.mode == CheckpointMode::ExactlyOnce
    }

    /// The synchronous part's failure point (tests).
    pub(crate) fn check_sync_fault(&self, barrier: &Barrier, task_name: &str) -> Result<()> {
        if self.faults.as_ref().is_some_and(|f| f.fail_sync(barrier.id)) {
            return Err(Error::OperatorPanicked {
                operator: task_name.to_string(),
                subtask: 0,
                message: format!("injected failure in the synchronous part of checkpoint {}", barrier.id),
            });
        }
        Ok(())
    }

    /// Tells the coordinator this task cannot take checkpoint `id`.
    pub(crate) fn decline(&self, id: u64, reason: Error) {
        let _ = self.acks.send(TaskAck { checkpoint: id, task: self.task, result: Err(reason) });
    }

    /// Hands a captured snapshot to the background writer, which acknowledges it (or declines
    /// it) to the coordinator when done. `stats` has the synchronous figures filled in.
    pub(crate) fn write_async(&self, snapshot: TaskSnapshot, mut stats: TaskStats) {
        let (task, storage, faults, clock, pages) =
            (self.task, self.storage.clone(), self.faults.clone(), self.clock.clone(), self.pages.clone());
        let id = snapshot.barrier.id;
        let write: SnapshotWrite = Box::new(move || {
            let start = clock.now_ns();
            let result = (|| {
                if faults.as_ref().is_some_and(|f| f.fail_async(id)) {
                    return Err(Error::Checkpoint(format!(
                        "injected failure in the asynchronous part of checkpoint {id}"
                    )));
                }
                if let Some(e) = faults.as_ref().and_then(|f| f.storage_write(id)) {
                    let path = storage.checkpoint_dir(id).join(format!("task-{task}.state"));
                    return Err(Error::io("cannot write task state", path, e));
                }
                let w = write_task_snapshot(&storage, pages.as_deref(), task, &snapshot)?;
                // In-flight data is counted apart (it is written among the parts).
                stats.state_bytes += w.state_bytes.saturating_sub(stats.inflight_bytes);
                stats.written_bytes += w.written_bytes.saturating_sub(stats.inflight_bytes);
                stats.async_ns = clock.now_ns() - start;
                Ok(TaskDone { file: w.file, digest: w.file_digest, stats, shared: w.shared })
            })();
            TaskAck { checkpoint: id, task, result }
        });
        if self.writer.submit(write).is_err() {
            self.decline(
                id,
                Error::Checkpoint(format!(
                    "{} snapshot writes are already queued or running (the limit): the checkpoint storage is slower \
                     than the checkpoint interval",
                    self.writer.limit_writes()
                )),
            );
        }
    }
}

#[cfg(test)]
impl BarrierAligner {
    fn on_barrier_at(&mut self, channel: usize, barrier: Barrier, now_ns: u64) -> Alignment {
        self.on_barrier(channel, barrier, now_ns, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(id: u64) -> Barrier {
        Barrier { id, trigger_ns: 0, unaligned: false }
    }

    #[test]
    fn aligns_over_all_live_channels() {
        let mut a = BarrierAligner::new(3);
        assert_eq!(a.on_barrier_at(0, b(1), 10), Alignment::Waiting);
        assert!(a.complete(|_| false).is_none());
        assert_eq!(a.on_barrier_at(2, b(1), 20), Alignment::Waiting);
        assert!(a.complete(|_| false).is_none());
        // Channel 1 ended: it counts as aligned.
        assert_eq!(a.complete(|i| i == 1), Some((b(1), 10)));
        assert_eq!(a.on_barrier_at(1, b(1), 30), Alignment::Stale, "a late copy of a done barrier");
    }

    #[test]
    fn newer_barriers_supersede_and_aborts_reset() {
        let mut a = BarrierAligner::new(2);
        a.on_barrier_at(0, b(1), 0);
        assert_eq!(a.on_barrier_at(1, b(2), 5), Alignment::Superseded);
        assert_eq!(a.on_barrier_at(0, b(1), 6), Alignment::Stale);
        assert_eq!(a.on_barrier_at(0, b(2), 7), Alignment::Waiting);
        assert_eq!(a.complete(|_| false), Some((b(2), 5)));
        a.on_barrier_at(0, b(3), 8);
        assert!(a.abort(3));
        assert!(a.complete(|_| false).is_none());
        assert_eq!(a.on_barrier_at(1, b(3), 9), Alignment::Stale);
    }

    /// Model test: random barrier orders over several channels against a simple model (the
    /// set of channels that delivered each id).
    #[test]
    fn random_schedules_match_a_model() {
        let mut seed = 7u64;
        let mut next = move || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            seed >> 33
        };
        for _ in 0..2000 {
            let channels = 1 + (next() % 4) as usize;
            let mut a = BarrierAligner::new(channels);
            // Each channel delivers barriers 1, 2, 3 in order; interleave channels randomly.
            let mut progress = vec![0u64; channels];
            let mut completed = Vec::new();
            while progress.iter().any(|&p| p < 3) {
                let ch = (next() % channels as u64) as usize;
                if progress[ch] == 3 {
                    continue;
                }
                progress[ch] += 1;
                a.on_barrier_at(ch, b(progress[ch]), 0);
                if let Some((bar, _)) = a.complete(|_| false) {
                    // Model: complete only when every channel has delivered this id.
                    assert!(progress.iter().all(|&p| p >= bar.id), "completed {} early: {progress:?}", bar.id);
                    completed.push(bar.id);
                }
            }
            assert!(completed.windows(2).all(|w| w[0] < w[1]), "{completed:?}");
            assert_eq!(completed.last(), Some(&3), "the last barrier always completes");
        }
    }
}
