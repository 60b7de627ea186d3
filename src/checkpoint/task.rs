//! The control plane between the coordinator and the tasks: the messages each way
//! ([`TaskControl`], [`TaskAck`]), where snapshot writes run ([`SnapshotWriter`]: rayon's pool,
//! or the simulator's queue), and which completions the tasks applied ([`CommitsApplied`]).
//! What a task does with a barrier is in [`crate::barrier`].
//!
//! May touch: `context` (the wall clock of its waits), `error`, `snapshot` (and storage, beside it).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Duration;

use super::storage::{ChannelAlignment, FileDigest, SharedFile};
use crate::error::Error;
use crate::snapshot::{Barrier, CheckpointNotice};

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
    /// Checkpoint `id` failed, and the coordinator keeps this task's part of it: the next
    /// checkpoint may reuse it (sent before the abort notice).
    PartKept(u64),
}

/// The checkpoint settings tasks (and producers) read as each checkpoint reaches them, which a
/// running job may change ([`crate::JobHandle::update_checkpoints`]): the coordinator stores
/// them when it takes a new configuration, so they apply from the next checkpoint on.
#[derive(Debug)]
pub(crate) struct LiveSettings {
    /// The aligned-checkpoint timeout; `u64::MAX`: none. Shared with the producers'
    /// [`crate::channel::BarrierExpiry`].
    pub(crate) alignment_timeout_ns: Arc<AtomicU64>,
    /// The in-flight budget of a checkpoint, bytes; `u64::MAX`: none (capture everything).
    inflight_budget: AtomicU64,
    /// The job's input channels (the budget's shares).
    channels: AtomicU64,
    /// Unaligned checkpoints on (or taking turns with aligned ones): gates hand records on in
    /// slices, so a priority barrier waits for a slice of work rather than a chunk of it.
    unaligned: AtomicBool,
    /// Checkpoints asked for in full (an incremental job's, on demand): their tasks write
    /// every page and refer to no earlier checkpoint. Marked before their barriers go out.
    full: std::sync::Mutex<Vec<u64>>,
}

impl LiveSettings {
    /// The settings of `cfg`.
    pub(crate) fn new(cfg: &super::CheckpointConfig) -> Self {
        let s = LiveSettings {
            alignment_timeout_ns: Arc::new(AtomicU64::new(u64::MAX)),
            inflight_budget: AtomicU64::new(u64::MAX),
            channels: AtomicU64::new(1),
            unaligned: AtomicBool::new(false),
            full: std::sync::Mutex::new(Vec::new()),
        };
        s.apply(cfg);
        s
    }

    /// Takes the settings of a new configuration.
    pub(crate) fn apply(&self, cfg: &super::CheckpointConfig) {
        let timeout = cfg.mode.alignment_timeout().map_or(u64::MAX, |t| t.as_nanos().min(u64::MAX as u128 - 1) as u64);
        self.alignment_timeout_ns.store(timeout, Ordering::Relaxed);
        self.inflight_budget.store(cfg.mode.inflight_budget().unwrap_or(u64::MAX), Ordering::Relaxed);
        self.unaligned.store(cfg.mode.may_overtake(), Ordering::Relaxed);
    }

    /// Gates hand records on in slices whatever the configuration in force says (checkpoint
    /// configurations take turns, and one of them overtakes).
    pub(crate) fn slice_records(&self) {
        self.unaligned.store(true, Ordering::Relaxed);
    }

    /// Checkpoint `id` is to be full: stored before its barriers go out, so every task that
    /// snapshots it sees the mark.
    pub(crate) fn mark_full(&self, id: u64) {
        let mut full = self.full.lock().unwrap_or_else(|e| e.into_inner());
        // Checkpoints far behind are long over: the list stays short.
        full.retain(|f| f + 64 > id);
        full.push(id);
    }

    /// Whether checkpoint `id` was asked for in full.
    pub(crate) fn is_full(&self, id: u64) -> bool {
        self.full.lock().unwrap_or_else(|e| e.into_inner()).contains(&id)
    }

    /// Whether unaligned checkpoints are on (so records are handed on in slices).
    pub(crate) fn unaligned(&self) -> bool {
        self.unaligned.load(Ordering::Relaxed)
    }

    /// The job's input channels, once its plan is built.
    pub(crate) fn set_channels(&self, channels: usize) {
        self.channels.store(channels.max(1) as u64, Ordering::Relaxed);
    }

    /// The aligned-checkpoint timeout, if any.
    pub(crate) fn alignment_timeout_ns(&self) -> Option<u64> {
        Some(self.alignment_timeout_ns.load(Ordering::Relaxed)).filter(|&t| t != u64::MAX)
    }

    /// One channel's share of the in-flight budget (adaptive alignment), if there is one.
    pub(crate) fn channel_budget(&self) -> Option<u64> {
        let budget = self.inflight_budget.load(Ordering::Relaxed);
        (budget != u64::MAX).then(|| (budget / self.channels.load(Ordering::Relaxed)).max(1))
    }
}

/// Per-task timings and sizes of one checkpoint.
#[derive(Clone, Debug, Default)]
pub(crate) struct TaskStats {
    pub(crate) start_delay_ns: u64,
    pub(crate) alignment_ns: u64,
    pub(crate) sync_ns: u64,
    pub(crate) async_ns: u64,
    pub(crate) state_bytes: u64,
    pub(crate) written_bytes: u64,
    pub(crate) inflight_bytes: u64,
    /// Adaptive checkpoints: each input channel's part.
    pub(crate) channels: Vec<ChannelAlignment>,
    /// The failed checkpoint whose kept part this one reused.
    pub(crate) reused_from: Option<u64>,
    /// Why a kept part was not reused (what changed since).
    pub(crate) not_reused: Option<String>,
}

/// One task's part of a checkpoint, durable.
#[derive(Debug)]
pub(crate) struct TaskDone {
    /// The task file (relative to the checkpoint's folder), its length and checksum.
    pub(crate) file: String,
    pub(crate) digest: FileDigest,
    /// A reused part: the checkpoint the file was written for (its header names it).
    pub(crate) written_for: Option<u64>,
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

/// One task's part of a checkpoint, written in the background; returns the task's
/// acknowledgement (or decline) for the coordinator. Work that acknowledges nothing (a
/// changelog base materialized after a checkpoint, see `incremental::materialize`) returns
/// `None`.
pub(crate) type SnapshotWrite = Box<dyn FnOnce() -> Option<TaskAck> + Send>;

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

/// The threads that write snapshots: a rayon pool of weir's own, made at the first write, of
/// at most [`SNAPSHOT_THREADS`] threads named `weir-snapshot-N`. Not rayon's global pool, which
/// is the embedding program's (its parallel iterators would queue behind checkpoint writes, and
/// its pool's size would bound weir's).
fn snapshot_pool() -> &'static rayon::ThreadPool {
    static POOL: std::sync::OnceLock<rayon::ThreadPool> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        rayon::ThreadPoolBuilder::new()
            .num_threads(cores.clamp(1, SNAPSHOT_THREADS))
            .thread_name(|i| format!("weir-snapshot-{i}"))
            .build()
            .expect("the snapshot writers' threads start")
    })
}

/// The most threads writing snapshots at once, for all jobs of a process: writes are I/O, and
/// a handful keep a disk busy.
pub(crate) const SNAPSHOT_THREADS: usize = 4;

/// Snapshot writes on weir's pool ([`snapshot_pool`]); acknowledgements go to the coordinator's channel. When the
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
        let (in_flight, acks) = (WriteInFlight(Arc::clone(&self.in_flight)), self.acks.clone());
        snapshot_pool().spawn(move || {
            let _in_flight = in_flight;
            // The coordinator may be gone (the attempt ended); nothing to tell then.
            if let Some(ack) = write() {
                let _ = acks.send(ack);
            }
        });
        Ok(())
    }

    fn limit_writes(&self) -> usize {
        self.limit_writes
    }

    fn wait_idle(&self, limit: Duration) -> bool {
        let until = crate::context::wall::now() + limit;
        while self.in_flight.load(Ordering::SeqCst) > 0 {
            if crate::context::wall::now() >= until {
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
    pub(crate) fn applied(&self, task: usize, id: u64) {
        let mut newest = self.newest.lock().unwrap_or_else(|e| e.into_inner());
        let n = newest.entry(task).or_default();
        *n = (*n).max(id);
        self.changed.notify_all();
    }

    /// Whether `tasks` tasks applied checkpoint `id`'s completion.
    pub(crate) fn all_applied(&self, id: u64, tasks: usize) -> bool {
        self.newest.lock().unwrap_or_else(|e| e.into_inner()).values().filter(|&&n| n >= id).count() >= tasks
    }

    /// The newest checkpoint all `tasks` tasks applied the completion of, if any.
    pub(crate) fn newest_everywhere(&self, tasks: usize) -> Option<u64> {
        let newest = self.newest.lock().unwrap_or_else(|e| e.into_inner());
        if newest.len() < tasks {
            return None;
        }
        newest.values().min().copied()
    }

    /// Waits until `tasks` tasks applied checkpoint `id`'s completion, for at most `limit` or
    /// until `ended()` (the attempt's workers are gone). Returns whether they did.
    pub(crate) fn wait(&self, id: u64, tasks: usize, ended: impl Fn() -> bool, limit: Duration) -> bool {
        let until = crate::context::wall::now() + limit;
        let mut newest = self.newest.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if newest.values().filter(|&&n| n >= id).count() >= tasks {
                return true;
            }
            let left = until.saturating_duration_since(crate::context::wall::now());
            if left.is_zero() || ended() {
                return false;
            }
            // Bounded, so workers that end (and never apply it) are seen too.
            let wait = left.min(Duration::from_millis(10));
            newest = self.changed.wait_timeout(newest, wait).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}
