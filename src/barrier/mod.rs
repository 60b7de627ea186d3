//! The task side of the barrier protocol, in one place: what a task does when a barrier
//! reaches one of its inputs (in-band, or overtaking through a priority slot), on every poll
//! (alignment timeouts, captures completed), and when the coordinator's control messages
//! arrive (completion and abort notices). Events come in through `before_poll`,
//! `on_inband`, `on_priority` and `on_poll`; the actions go out through two narrow
//! interfaces — `Inputs` (block and unblock a channel, capture its in-flight data) and
//! `ChainHead` (snapshot the chain and forward the barrier) — and as acknowledgements or
//! declines to the coordinator (`TaskCheckpointing`).
//!
//!
//! - aligned (exactly-once blocks each channel that delivered the barrier; at-least-once only
//!   counts), snapshotting when every live channel delivered it;
//! - unaligned: the first priority barrier snapshots at once, then each channel's in-flight
//!   data (what its producer wrote before its barrier and this task reads after the snapshot)
//!   is captured, and the snapshot is written once all of it is. A newer checkpoint's barrier
//!   snapshots too while older captures go on (each capture logs the same entries), so no
//!   checkpoint is given up because a newer one started; one still aligning here switches to
//!   unaligned first, so snapshots stay in checkpoint order;
//! - aligned with timeout: an alignment that waited longer than the bound switches to
//!   unaligned at this task (channels whose barrier already arrived have nothing in flight;
//!   the others are captured up to their in-band barrier), and the barrier goes on unaligned;
//! - adaptive (unaligned barriers under an in-flight budget): the first priority barrier
//!   defers the snapshot; each channel whose barrier arrived is read up to it and no further,
//!   and the task snapshots once no channel holds more than its share of the budget ahead of
//!   its barrier, capturing what is left (a channel read up to its barrier is aligned).
//!
//! The aligned-checkpoint timeout and the budget are read from `LiveSettings`, which a
//! running job may change.
//!
//! (Carbone et al. 2015 for aligned barriers; Flink's FLIP-76 for unaligned checkpoints.)

//!
//! Submodules: [`aligner`] (which channels delivered the barrier being aligned),
//! `inflight` (how captured in-flight data is named and encoded) and `activity` (what the task
//! tells latency probes it is doing).
//!
//! May touch: `channel`, `checkpoint`, `collector`, `context`, `error`, `faults`, `metrics`,
//! `operator`, `persist`, `snapshot`, `prng`, `record`, `state`.

pub(crate) mod activity;
pub mod aligner;
pub(crate) mod inflight;
#[cfg(test)]
mod protocol_test;

pub use aligner::{Alignment, BarrierAligner};

use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;

use crate::channel::InputGate;
use crate::checkpoint::local::LocalPart;
use crate::checkpoint::resume::{changes, TaskParts, WrittenPart};
use crate::checkpoint::task::{
    CommitsApplied, LiveSettings, SnapshotWrite, SnapshotWriter, TaskAck, TaskControl, TaskStats,
};
use crate::checkpoint::ChannelAlignment;
use crate::checkpoint::{write_task_file, CheckpointMode, CheckpointStorage, PageIndex};
use crate::collector::Collector;
use crate::context::Clock;
use crate::error::{Error, Result};
use crate::operator::TwoInputOperator;
use crate::persist::Persist;
use crate::snapshot::{Barrier, CheckpointNotice, FaultInjector, TaskSnapshot};
use inflight::{encode_inflight, inflight_part};

/// An unaligned checkpoint whose synchronous part is done at this task while its in-flight
/// data is still being captured.
pub(crate) struct PendingSnapshot {
    pub(crate) snapshot: TaskSnapshot,
    pub(crate) stats: TaskStats,
    pub(crate) started_ns: u64,
}

/// A checkpoint whose priority barriers reached a task that aligns adaptively: its snapshot
/// waits while a channel holds more than `budget` bytes ahead of its barrier.
pub(crate) struct DeferredSnapshot {
    barrier: Barrier,
    first_ns: u64,
    budget: u64,
    /// Per channel: its barrier's position, once the barrier arrived.
    seqs: Vec<Option<u64>>,
    /// Per channel: when it had been read up to its barrier.
    reached_ns: Vec<Option<u64>>,
}

/// Everything a task needs to take part in checkpoints.
pub(crate) struct TaskCheckpointing {
    pub(crate) task: usize,
    pub(crate) mode: CheckpointMode,
    /// Barriers may arrive in priority slots (every exactly-once job: a running job may turn
    /// unaligned checkpoints on).
    pub(crate) unaligned: bool,
    /// The gates hand records on in slices, so a priority barrier waits for a slice of work,
    /// not a chunk: while unaligned checkpoints are on, at the start or since the live
    /// configuration turned them on (slicing costs an aligned job a little, so only then).
    pub(crate) sliced: bool,
    /// Unaligned checkpoints snapshotted here whose in-flight data is still being captured,
    /// in checkpoint order.
    pub(crate) pending_unaligned: Vec<PendingSnapshot>,
    /// The newest unaligned checkpoint snapshotted (or abandoned) here.
    pub(crate) unaligned_done: u64,
    pub(crate) control: Receiver<TaskControl>,
    pub(crate) acks: Sender<TaskAck>,
    pub(crate) storage: Arc<CheckpointStorage>,
    pub(crate) writer: Arc<dyn SnapshotWriter>,
    /// Incremental checkpoints: where this task's pages were stored.
    pub(crate) pages: Option<Arc<PageIndex>>,
    /// Every checkpoint is full, its pages apart all the same (in its own shared file): full
    /// checkpoints of a job within a state memory budget, so that a restore can leave them
    /// where they lie.
    pub(crate) pages_apart_in_full: bool,
    pub(crate) faults: Option<Arc<FaultInjector>>,
    pub(crate) clock: Clock,
    pub(crate) aligner: BarrierAligner,
    /// What a running job may change: the aligned-checkpoint timeout (with unaligned on,
    /// switch a checkpoint to unaligned here after aligning this long) and the in-flight
    /// budget of adaptive alignment.
    pub(crate) live: Arc<LiveSettings>,
    /// Adaptive alignment: the checkpoint whose snapshot waits here until every channel holds
    /// no more than its share of the in-flight budget ahead of its barrier.
    pub(crate) deferred: Option<DeferredSnapshot>,
    /// Where this task counts the completion notices it applied.
    pub(crate) commits: Arc<CommitsApplied>,
    /// The parts this task wrote, and the part of a failed checkpoint kept for it.
    pub(crate) parts: Arc<TaskParts>,
    /// Local recovery: where the snapshot goes once written (savepoints' too: a savepoint of a
    /// checkpointed job is one of its checkpoints, copied).
    pub(crate) local: Option<Arc<crate::checkpoint::local::LocalCopies>>,
    /// What it tells latency probes it is doing.
    pub(crate) activity: activity::ActivityReport,
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
        self.mode.exactly_once()
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

    /// The coordinator kept this task's part of failed checkpoint `id`.
    pub(crate) fn keep_part(&self, id: u64) {
        self.parts.keep(id);
        if let Some(pages) = &self.pages {
            pages.keep(id);
        }
    }

    /// Tells the coordinator this task cannot take checkpoint `id`.
    pub(crate) fn decline(&self, id: u64, reason: Error) {
        let _ = self.acks.send(TaskAck { checkpoint: id, task: self.task, result: Err(reason) });
    }

    /// Hands a captured snapshot to the background writer, which acknowledges it (or declines
    /// it) to the coordinator when done. `stats` has the synchronous figures filled in. When
    /// the coordinator kept this task's part of a failed checkpoint and the snapshot holds the
    /// same, that part is reused instead of written again.
    pub(crate) fn write_async(&self, snapshot: TaskSnapshot, mut stats: TaskStats) {
        stats.inflight_bytes = snapshot.inflight_bytes();
        let (task, storage, faults, clock, pages) =
            (self.task, Arc::clone(&self.storage), self.faults.clone(), self.clock.clone(), self.pages.clone());
        let id = snapshot.barrier.id;
        // A full checkpoint reuses nothing of an earlier one either.
        let full = self.pages.is_some() && (self.pages_apart_in_full || self.live.is_full(id));
        let (parts, kept) = (Arc::clone(&self.parts), self.parts.kept().filter(|_| !full));
        let local = self.local.clone();
        // Weak: a write queued in a writer must not keep it alive.
        let writer = Arc::downgrade(&self.writer);
        let write: SnapshotWrite = Box::new(move || {
            let start = clock.now_ns();
            let mut materialize = Vec::new();
            let result = (|| {
                injected_write_failure(faults.as_deref(), &storage, task, id)?;
                if let Some(k) = kept.filter(|k| k.checkpoint < id) {
                    match reuse_part(&storage, &k, id, &snapshot) {
                        Ok(()) => {
                            if let Some(pages) = &pages {
                                pages.reused(id);
                            }
                            stats.state_bytes += k.state_bytes.saturating_sub(stats.inflight_bytes);
                            stats.reused_from = Some(k.checkpoint);
                            stats.async_ns = clock.now_ns() - start;
                            let part = WrittenPart { checkpoint: id, ..(*k).clone() };
                            let done = part.done(stats);
                            parts.written(part);
                            return Ok(done);
                        }
                        Err(why) => stats.not_reused = Some(why),
                    }
                }
                let mut w = write_task_file(&storage, pages.as_deref(), task, &snapshot, full)?;
                materialize = std::mem::take(&mut w.materialize);
                if faults.as_ref().is_some_and(|f| f.exit_mid_task_write(id)) {
                    // What the process dying mid-write leaves: half the file, no acknowledgement.
                    storage.cut_in_half(id, &w.file, w.file_digest.bytes);
                    eprintln!("injected crash: task {task}'s file of checkpoint {id} is half written");
                    std::process::exit(70);
                }
                // In-flight data is counted apart (it is written among the parts).
                stats.state_bytes += w.state_bytes.saturating_sub(stats.inflight_bytes);
                stats.written_bytes += w.written_bytes.saturating_sub(stats.inflight_bytes);
                stats.async_ns = clock.now_ns() - start;
                let part = WrittenPart::of(id, w);
                let done = part.done(stats);
                parts.written(part);
                Ok(done)
            })();
            if result.is_ok() {
                let parts: Vec<LocalPart> = snapshot.parts.into_iter().map(LocalPart::from).collect();
                if let (false, Some(pages), Some(writer)) = (materialize.is_empty(), &pages, writer.upgrade()) {
                    let forks = parts.iter().map(|p| Arc::clone(&p.state)).collect();
                    materialize_later(&*writer, storage, pages, (task, id), forks, materialize);
                }
                // Kept before the acknowledgement, so a checkpoint the coordinator completes
                // has every task's parts here.
                if let Some(local) = local {
                    local.written(id, task, parts);
                }
            }
            Some(TaskAck { checkpoint: id, task, result })
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

/// The failures tests inject into a snapshot's write (`faults`): the asynchronous part fails,
/// or the storage refuses the task's file.
fn injected_write_failure(
    faults: Option<&FaultInjector>,
    storage: &CheckpointStorage,
    task: usize,
    id: u64,
) -> Result<()> {
    if faults.is_some_and(|f| f.fail_async(id)) {
        return Err(Error::Checkpoint(format!("injected failure in the asynchronous part of checkpoint {id}")));
    }
    if let Some(e) = faults.and_then(|f| f.storage_write(id)) {
        let path = storage.checkpoint_dir(id).join(format!("task-{task}.state"));
        return Err(Error::io("cannot write task state", path, e));
    }
    Ok(())
}

/// Queues the materialization of the changelog bases of `maps` (by the id of their changes)
/// from `forks`, the state task `task` captured for checkpoint `id`: on the snapshot writer,
/// after the checkpoint's own write. It stops once the task's attempt is gone (nothing but it
/// holds the task's page index then).
fn materialize_later(
    writer: &dyn SnapshotWriter,
    storage: Arc<CheckpointStorage>,
    pages: &Arc<PageIndex>,
    (task, id): (usize, u64),
    forks: Vec<crate::snapshot::SharedFork>,
    maps: Vec<u64>,
) {
    let index = Arc::downgrade(pages);
    let wanted = maps.clone();
    let job: SnapshotWrite = Box::new(move || {
        let index = index.upgrade()?;
        let alone = || Arc::strong_count(&index) == 1;
        if let Err(e) = crate::checkpoint::materialize(&storage, &index, task, id, &forks, &wanted, &alone) {
            tracing::warn!(task, checkpoint = id, error = %e, "a changelog base was not materialized; a later checkpoint writes one");
        }
        None
    });
    if writer.submit(job).is_err() {
        pages.materialization_dropped(&maps);
    }
}

/// Reuses task part `kept` (of a failed checkpoint) as this task's part of checkpoint `id`
/// if `snapshot` holds the same; else says why not.
fn reuse_part(
    storage: &CheckpointStorage,
    kept: &WrittenPart,
    id: u64,
    snapshot: &TaskSnapshot,
) -> std::result::Result<(), String> {
    let from = kept.checkpoint;
    let changed = changes(snapshot, &kept.print)
        .map_err(|e| format!("its state could not be compared with its part of checkpoint {from}: {e}"))?;
    if !changed.is_empty() {
        return Err(format!("changed since checkpoint {from}: {}", changed.join("; ")));
    }
    storage.link_task(from, id, &kept.file).map_err(|e| format!("its part of checkpoint {from} is gone: {e}"))
}

/// Handles the coordinator's notices for a task whose chain head is `notify`; returns whether
/// an alignment or capture in progress was abandoned.
pub(crate) fn apply_notice(
    cp: &mut TaskCheckpointing,
    notice: CheckpointNotice,
    notify: &mut dyn FnMut(CheckpointNotice) -> Result<()>,
) -> Result<bool> {
    let mut unblock = false;
    if let Some(pages) = &cp.pages {
        pages.on_notice(notice);
    }
    cp.parts.on_notice(notice);
    if let CheckpointNotice::Aborted(id) = notice {
        unblock = cp.aligner.abort(id);
        let before = cp.pending_unaligned.len();
        cp.pending_unaligned.retain(|p| p.snapshot.barrier.id != id);
        unblock |= cp.pending_unaligned.len() < before;
    }
    notify(notice)?;
    if let CheckpointNotice::Complete(id) = notice {
        cp.completion_applied(id);
        if cp.faults.as_ref().is_some_and(|f| f.exit_after_first_commit(id)) {
            eprintln!("injected crash: task {} committed checkpoint {id}, and not every task heard it", cp.task);
            std::process::exit(70);
        }
    }
    Ok(unblock)
}

/// The head of a task's chain as checkpoints see it: it takes the barrier (every operator
/// captures its state and forwards it) and hears the coordinator's notices.
pub(crate) trait ChainHead {
    fn barrier(&mut self, barrier: Barrier, snapshot: &mut TaskSnapshot) -> Result<()>;
    fn notify(&mut self, notice: CheckpointNotice) -> Result<()>;
}

impl<T> ChainHead for Box<dyn Collector<T>> {
    fn barrier(&mut self, barrier: Barrier, snapshot: &mut TaskSnapshot) -> Result<()> {
        Collector::barrier(&mut **self, barrier, snapshot)
    }
    fn notify(&mut self, notice: CheckpointNotice) -> Result<()> {
        Collector::notify(&mut **self, notice)
    }
}

impl<A, B> ChainHead for Box<dyn TwoInputOperator<A, B>> {
    fn barrier(&mut self, barrier: Barrier, snapshot: &mut TaskSnapshot) -> Result<()> {
        TwoInputOperator::barrier(&mut **self, barrier, snapshot)
    }
    fn notify(&mut self, notice: CheckpointNotice) -> Result<()> {
        TwoInputOperator::notify(&mut **self, notice)
    }
}

/// Called at the start of every poll, before the backpressure check (a blocked task still
/// completes its checkpoints): the coordinator's notices, then [`on_poll`].
// Out of line: once a poll, and inlined it changed how the compiler laid out the gate's record
// loop in the same function (W2 paid 3 instructions a record, perf/instructions.sh).
#[inline(never)]
pub(crate) fn before_poll(
    cp: &mut TaskCheckpointing,
    inputs: &mut impl Inputs,
    id: &TaskIdent,
    head: &mut dyn ChainHead,
) -> Result<()> {
    while let Some(msg) = cp.next_control() {
        match msg {
            TaskControl::Notice(n) => on_notice(cp, inputs, n, head)?,
            TaskControl::PartKept(id) => cp.keep_part(id),
            TaskControl::Trigger(_) | TaskControl::EndOfInput => {}
        }
    }
    if cp.unaligned && cp.sliced != cp.live.unaligned() {
        switch_slicing(cp, inputs);
    }
    on_poll(cp, inputs, id, head)?;
    report_activity(cp);
    Ok(())
}

/// The live configuration turned unaligned checkpoints on or off: the gates follow.
#[cold]
#[inline(never)]
fn switch_slicing(cp: &mut TaskCheckpointing, inputs: &mut impl Inputs) {
    cp.sliced = !cp.sliced;
    inputs.set_slicing(cp.sliced.then(|| cp.clock.clone()));
}

/// Tells latency probes whether this task aligns (channels held back: blocked, or read no
/// further than a deferred barrier) and captures in-flight data.
#[inline]
fn report_activity(cp: &mut TaskCheckpointing) {
    let aligning = (cp.aligner.pending().is_some() && cp.blocks()) || cp.deferred.is_some();
    let capturing = !cp.pending_unaligned.is_empty();
    cp.activity.set(aligning, capturing);
}

/// Who a task is, for naming its failures and its in-flight data.
pub(crate) struct TaskIdent {
    pub(crate) name: String,
    pub(crate) operator: Arc<str>,
    pub(crate) subtask: usize,
}

/// A task's input channels across its gates, numbered from 0.
pub(crate) trait Inputs {
    fn is_ended(&self, ch: usize) -> bool;
    fn block(&mut self, ch: usize);
    fn unblock(&mut self, ch: usize);
    fn unblock_all(&mut self);
    /// Entries consumed so far from `ch`.
    fn read_position(&self, ch: usize) -> u64;
    fn start_capture(&mut self, checkpoint: u64);
    fn abort_capture(&mut self, checkpoint: u64);
    fn set_capture_limit(&mut self, checkpoint: u64, ch: usize, seq: u64);
    fn refresh_capture(&mut self);
    fn capture_complete(&self, checkpoint: u64) -> bool;
    /// The captured in-flight data of `checkpoint`, encoded, per input (0, or 0 and 1).
    fn take_capture(&mut self, checkpoint: u64) -> Vec<(usize, Vec<u8>)>;
    /// Number of channels.
    fn channel_count(&self) -> usize;
    /// Adaptive alignment: read `ch` up to its barrier of `checkpoint` at `seq`, no further.
    fn defer(&mut self, ch: usize, checkpoint: u64, seq: u64);
    /// Ends adaptive alignment on every channel.
    fn release_deferred(&mut self);
    /// Bytes `ch`'s ring holds ahead of its deferred barrier, about.
    fn ahead_bytes(&mut self, ch: usize) -> Option<u64>;
    /// Per channel, the bytes captured so far for `checkpoint`.
    fn captured_bytes(&self, checkpoint: u64) -> Vec<u64>;
    /// Hands records on in slices timed on `clock`, or (`None`) in whole chunks.
    fn set_slicing(&mut self, clock: Option<Clock>);
}

impl<T: Persist> Inputs for InputGate<T> {
    fn is_ended(&self, ch: usize) -> bool {
        InputGate::is_ended(self, ch)
    }
    fn block(&mut self, ch: usize) {
        InputGate::block(self, ch)
    }
    fn unblock(&mut self, ch: usize) {
        InputGate::unblock(self, ch)
    }
    fn unblock_all(&mut self) {
        InputGate::unblock_all(self)
    }
    fn read_position(&self, ch: usize) -> u64 {
        InputGate::read_position(self, ch)
    }
    fn start_capture(&mut self, checkpoint: u64) {
        InputGate::start_capture(self, checkpoint)
    }
    fn abort_capture(&mut self, checkpoint: u64) {
        InputGate::abort_capture(self, checkpoint)
    }
    fn set_capture_limit(&mut self, checkpoint: u64, ch: usize, seq: u64) {
        InputGate::set_capture_limit(self, checkpoint, ch, seq)
    }
    fn refresh_capture(&mut self) {
        InputGate::refresh_capture(self)
    }
    fn capture_complete(&self, checkpoint: u64) -> bool {
        InputGate::capture_complete(self, checkpoint)
    }
    fn take_capture(&mut self, checkpoint: u64) -> Vec<(usize, Vec<u8>)> {
        vec![(0, encode_inflight(InputGate::take_capture(self, checkpoint)))]
    }
    fn channel_count(&self) -> usize {
        self.channels()
    }
    fn defer(&mut self, ch: usize, checkpoint: u64, seq: u64) {
        InputGate::defer(self, ch, checkpoint, seq)
    }
    fn release_deferred(&mut self) {
        InputGate::release_deferred(self)
    }
    fn ahead_bytes(&mut self, ch: usize) -> Option<u64> {
        InputGate::ahead_bytes(self, ch)
    }
    fn captured_bytes(&self, checkpoint: u64) -> Vec<u64> {
        InputGate::captured_bytes(self, checkpoint)
    }
    fn set_slicing(&mut self, clock: Option<Clock>) {
        InputGate::set_slicing(self, clock)
    }
}

/// The two gates of a two-input task; the left one's channels come first.
pub(crate) struct GatePair<A, B> {
    pub(crate) left: InputGate<A>,
    pub(crate) right: InputGate<B>,
}

impl<A: Persist, B: Persist> GatePair<A, B> {
    fn side(&self, ch: usize) -> Result<usize, usize> {
        let n = self.left.channels();
        if ch < n {
            Ok(ch)
        } else {
            Err(ch - n)
        }
    }
}

macro_rules! by_side {
    ($self:ident, $ch:ident, $gate:ident => $e:expr) => {
        match $self.side($ch) {
            Ok($ch) => {
                let $gate = &mut $self.left;
                $e
            }
            Err($ch) => {
                let $gate = &mut $self.right;
                $e
            }
        }
    };
}

impl<A: Persist, B: Persist> Inputs for GatePair<A, B> {
    fn is_ended(&self, ch: usize) -> bool {
        match self.side(ch) {
            Ok(c) => self.left.is_ended(c),
            Err(c) => self.right.is_ended(c),
        }
    }
    fn block(&mut self, ch: usize) {
        by_side!(self, ch, g => g.block(ch))
    }
    fn unblock(&mut self, ch: usize) {
        by_side!(self, ch, g => g.unblock(ch))
    }
    fn unblock_all(&mut self) {
        self.left.unblock_all();
        self.right.unblock_all();
    }
    fn read_position(&self, ch: usize) -> u64 {
        match self.side(ch) {
            Ok(c) => self.left.read_position(c),
            Err(c) => self.right.read_position(c),
        }
    }
    fn start_capture(&mut self, checkpoint: u64) {
        self.left.start_capture(checkpoint);
        self.right.start_capture(checkpoint);
    }
    fn abort_capture(&mut self, checkpoint: u64) {
        self.left.abort_capture(checkpoint);
        self.right.abort_capture(checkpoint);
    }
    fn set_capture_limit(&mut self, checkpoint: u64, ch: usize, seq: u64) {
        by_side!(self, ch, g => g.set_capture_limit(checkpoint, ch, seq))
    }
    fn refresh_capture(&mut self) {
        self.left.refresh_capture();
        self.right.refresh_capture();
    }
    fn capture_complete(&self, checkpoint: u64) -> bool {
        self.left.capture_complete(checkpoint) && self.right.capture_complete(checkpoint)
    }
    fn take_capture(&mut self, checkpoint: u64) -> Vec<(usize, Vec<u8>)> {
        let (left, right) = (self.left.take_capture(checkpoint), self.right.take_capture(checkpoint));
        vec![(0, encode_inflight(left)), (1, encode_inflight(right))]
    }
    fn channel_count(&self) -> usize {
        self.left.channels() + self.right.channels()
    }
    fn defer(&mut self, ch: usize, checkpoint: u64, seq: u64) {
        by_side!(self, ch, g => g.defer(ch, checkpoint, seq))
    }
    fn release_deferred(&mut self) {
        self.left.release_deferred();
        self.right.release_deferred();
    }
    fn ahead_bytes(&mut self, ch: usize) -> Option<u64> {
        by_side!(self, ch, g => g.ahead_bytes(ch))
    }
    fn captured_bytes(&self, checkpoint: u64) -> Vec<u64> {
        let mut b = self.left.captured_bytes(checkpoint);
        b.extend(self.right.captured_bytes(checkpoint));
        b
    }
    fn set_slicing(&mut self, clock: Option<Clock>) {
        self.left.set_slicing(clock.clone());
        self.right.set_slicing(clock);
    }
}

/// Applies a notice from the coordinator: the chain hears it; an abandoned alignment or
/// capture is dropped.
fn on_notice(
    cp: &mut TaskCheckpointing,
    inputs: &mut impl Inputs,
    notice: CheckpointNotice,
    head: &mut dyn ChainHead,
) -> Result<()> {
    if let CheckpointNotice::Aborted(id) = notice {
        inputs.abort_capture(id);
        if cp.deferred.as_ref().is_some_and(|d| d.barrier.id == id) {
            cp.deferred = None;
            inputs.release_deferred();
        }
    }
    if apply_notice(cp, notice, &mut |n| head.notify(n))? {
        inputs.unblock_all();
        // An abandoned capture must not release an alignment still in progress: its channels
        // that delivered their barrier stay blocked (else data after the barrier would reach
        // the snapshot, and be replayed again after a restore).
        if cp.blocks() {
            for ch in cp.aligner.delivered() {
                inputs.block(ch);
            }
        }
    }
    Ok(())
}

/// Channel `ch` delivered an in-band barrier (just consumed).
pub(crate) fn on_inband(
    cp: &mut TaskCheckpointing,
    inputs: &mut impl Inputs,
    id: &TaskIdent,
    ch: usize,
    barrier: Barrier,
    head: &mut dyn ChainHead,
) -> Result<()> {
    let position = inputs.read_position(ch) - 1;
    if is_capturing(cp, barrier.id) {
        // This checkpoint is unaligned here: the barrier ends this channel's in-flight data.
        inputs.set_capture_limit(barrier.id, ch, position);
        inputs.unblock(ch);
        finish_unaligned(cp, inputs, id)?;
        report_activity(cp);
        return Ok(());
    }
    match cp.aligner.on_barrier(ch, barrier, cp.clock.now_ns(), position) {
        Alignment::Stale => inputs.unblock(ch),
        Alignment::Superseded => {
            inputs.unblock_all();
            if cp.blocks() {
                inputs.block(ch);
            }
        }
        Alignment::Waiting => {}
    }
    complete_aligned(cp, inputs, id, head)?;
    report_activity(cp);
    Ok(())
}

/// Channel `ch`'s producer published an unaligned barrier with write sequence number `seq`.
pub(crate) fn on_priority(
    cp: &mut TaskCheckpointing,
    inputs: &mut impl Inputs,
    id: &TaskIdent,
    ch: usize,
    barrier: Barrier,
    seq: u64,
    head: &mut dyn ChainHead,
) -> Result<()> {
    priority_barrier(cp, inputs, id, ch, barrier, seq, head)?;
    report_activity(cp);
    Ok(())
}

fn priority_barrier(
    cp: &mut TaskCheckpointing,
    inputs: &mut impl Inputs,
    id: &TaskIdent,
    ch: usize,
    barrier: Barrier,
    seq: u64,
    head: &mut dyn ChainHead,
) -> Result<()> {
    if let Some(d) = cp.deferred.as_ref() {
        if d.barrier.id == barrier.id {
            return defer_channel(cp, inputs, id, ch, seq, head);
        }
        if barrier.id > d.barrier.id {
            // A newer checkpoint overtakes: the deferred one snapshots now, in checkpoint
            // order. (An older one's barrier goes on below: its capture may be in progress.)
            snapshot_deferred(cp, inputs, id, head)?;
        }
    }
    if cp.aligner.pending().is_some_and(|(b, _)| b.id == barrier.id) {
        switch_to_unaligned(cp, inputs, id, head)?;
    } else {
        match begin_unaligned(cp, &barrier) {
            UnalignedBarrier::Stale => return Ok(()),
            UnalignedBarrier::Starts => {
                // An older checkpoint still aligning here is overtaken: a task's snapshots go
                // in checkpoint order (its barriers downstream too), so the older one goes
                // unaligned here first, its channels captured up to their barriers.
                switch_to_unaligned(cp, inputs, id, head)?;
                cp.aligner.pass(barrier.id);
                if let Some(budget) = cp.live.channel_budget() {
                    let n = inputs.channel_count();
                    cp.deferred = Some(DeferredSnapshot {
                        barrier,
                        first_ns: cp.clock.now_ns(),
                        budget,
                        seqs: vec![None; n],
                        reached_ns: vec![None; n],
                    });
                    return defer_channel(cp, inputs, id, ch, seq, head);
                }
                snapshot_unaligned(cp, inputs, id, barrier, None, head)?;
            }
            UnalignedBarrier::Joins => {}
        }
    }
    inputs.set_capture_limit(barrier.id, ch, seq);
    finish_unaligned(cp, inputs, id)
}

/// Called on every poll: the alignment timeout, alignments completed by ended channels, and
/// captures completed by data that reached the rings.
///
/// The timeout counts from the checkpoint's trigger, as Flink's does (its start delay
/// included): a checkpoint whose barriers crawl behind a backlog has used its time before
/// the first one arrives. (Barriers still queued in a ring are republished in its priority
/// slot by their producer once the same time is up; see `channel::writer`.)
pub(crate) fn on_poll(
    cp: &mut TaskCheckpointing,
    inputs: &mut impl Inputs,
    id: &TaskIdent,
    head: &mut dyn ChainHead,
) -> Result<()> {
    if let (Some(timeout), Some((barrier, _))) = (cp.live.alignment_timeout_ns(), cp.aligner.pending()) {
        if !barrier.savepoint && cp.clock.now_ns().saturating_sub(barrier.trigger_ns) >= timeout {
            switch_to_unaligned(cp, inputs, id, head)?;
        }
    }
    complete_aligned(cp, inputs, id, head)?;
    snapshot_within_budget(cp, inputs, id, head)?;
    finish_unaligned(cp, inputs, id)
}

/// Adaptive alignment: channel `ch`'s barrier of the deferred checkpoint arrived at `seq`;
/// the channel is read up to it, and the snapshot taken if every channel now fits its share.
fn defer_channel(
    cp: &mut TaskCheckpointing,
    inputs: &mut impl Inputs,
    id: &TaskIdent,
    ch: usize,
    seq: u64,
    head: &mut dyn ChainHead,
) -> Result<()> {
    let d = cp.deferred.as_mut().expect("a deferred checkpoint");
    d.seqs[ch] = Some(seq);
    inputs.defer(ch, d.barrier.id, seq);
    snapshot_within_budget(cp, inputs, id, head)
}

/// Adaptive alignment: snapshots the deferred checkpoint once every live channel's barrier
/// arrived and no channel holds more than its share of the budget ahead of it.
fn snapshot_within_budget(
    cp: &mut TaskCheckpointing,
    inputs: &mut impl Inputs,
    id: &TaskIdent,
    head: &mut dyn ChainHead,
) -> Result<()> {
    let Some(d) = cp.deferred.as_mut() else { return Ok(()) };
    let now = cp.clock.now_ns();
    let mut within = true;
    for ch in 0..d.seqs.len() {
        if inputs.is_ended(ch) {
            continue;
        }
        let Some(ahead) = inputs.ahead_bytes(ch) else {
            // Its barrier has not arrived.
            within = false;
            continue;
        };
        if ahead == 0 {
            d.reached_ns[ch].get_or_insert(now);
        }
        within &= ahead <= d.budget;
    }
    if within {
        snapshot_deferred(cp, inputs, id, head)?;
    }
    Ok(())
}

/// Snapshots the deferred checkpoint now: each channel's data still ahead of its barrier is
/// captured (none for the channels read up to it: those are aligned).
fn snapshot_deferred(
    cp: &mut TaskCheckpointing,
    inputs: &mut impl Inputs,
    id: &TaskIdent,
    head: &mut dyn ChainHead,
) -> Result<()> {
    let Some(d) = cp.deferred.take() else { return Ok(()) };
    snapshot_unaligned(cp, inputs, id, d.barrier, Some(d.first_ns), head)?;
    for (ch, seq) in d.seqs.iter().enumerate() {
        if let Some(seq) = *seq {
            inputs.set_capture_limit(d.barrier.id, ch, seq);
        }
    }
    inputs.release_deferred();
    let now = cp.clock.now_ns();
    let task = cp.task;
    let pending = cp.pending_unaligned.last_mut().expect("just snapshotted");
    pending.stats.channels = d
        .reached_ns
        .iter()
        .enumerate()
        .map(|(channel, reached)| ChannelAlignment {
            task,
            channel,
            // Settled once its capture is complete (see `finish_unaligned`).
            aligned: false,
            bytes: 0,
            wait_ms: reached.unwrap_or(now).saturating_sub(d.first_ns) as f64 / 1e6,
        })
        .collect();
    finish_unaligned(cp, inputs, id)
}

fn complete_aligned(
    cp: &mut TaskCheckpointing,
    inputs: &mut impl Inputs,
    id: &TaskIdent,
    head: &mut dyn ChainHead,
) -> Result<()> {
    if let Some((barrier, first_ns)) = cp.aligner.complete(|i| inputs.is_ended(i)) {
        cp.check_sync_fault(&barrier, &id.name)?;
        let start = cp.clock.now_ns();
        let mut snap = TaskSnapshot::new(barrier);
        head.barrier(barrier, &mut snap)?;
        let now = cp.clock.now_ns();
        cp.activity.forked(start, now);
        let stats = TaskStats {
            start_delay_ns: first_ns.saturating_sub(barrier.trigger_ns),
            alignment_ns: start.saturating_sub(first_ns),
            sync_ns: now - start,
            ..Default::default()
        };
        cp.write_async(snap, stats);
        inputs.unblock_all();
    }
    Ok(())
}

/// Gives up aligning the pending checkpoint: snapshot now, forward the barrier unaligned, and
/// capture each channel's data up to its barrier.
fn switch_to_unaligned(
    cp: &mut TaskCheckpointing,
    inputs: &mut impl Inputs,
    id: &TaskIdent,
    head: &mut dyn ChainHead,
) -> Result<()> {
    let Some((barrier, first_ns, positions)) = cp.aligner.take_pending() else {
        return Ok(());
    };
    if barrier.id <= cp.unaligned_done {
        // A newer checkpoint already snapshotted unaligned here: snapshots go in checkpoint
        // order, so nothing to snapshot (not expected: that one passes the aligner first).
        debug_assert!(false, "checkpoint {} aligning behind unaligned {}", barrier.id, cp.unaligned_done);
        inputs.unblock_all();
        return Ok(());
    }
    snapshot_unaligned(cp, inputs, id, Barrier { unaligned: true, ..barrier }, Some(first_ns), head)?;
    for (ch, pos) in positions.into_iter().enumerate() {
        if let Some(pos) = pos {
            inputs.set_capture_limit(barrier.id, ch, pos);
        }
    }
    inputs.unblock_all();
    Ok(())
}

/// What the first priority barrier of a checkpoint at a task means.
enum UnalignedBarrier {
    /// A checkpoint newer than any here: it snapshots now.
    Starts,
    /// One whose capture is in progress here.
    Joins,
    /// One this task snapshotted (aligned, or unaligned and captured) or abandoned, or one
    /// older than a checkpoint it has seen (its upstream gave it up).
    Stale,
}

fn begin_unaligned(cp: &TaskCheckpointing, barrier: &Barrier) -> UnalignedBarrier {
    if is_capturing(cp, barrier.id) {
        return UnalignedBarrier::Joins;
    }
    let newest = cp
        .unaligned_done
        .max(cp.aligner.done())
        .max(cp.aligner.pending().map_or(0, |(b, _)| b.id))
        .max(cp.deferred.as_ref().map_or(0, |d| d.barrier.id));
    // An aborted checkpoint's barrier is stale; an older one's is not (the abort notice came
    // beside the data, ahead of it).
    if barrier.id <= newest || cp.aligner.is_aborted(barrier.id) {
        return UnalignedBarrier::Stale;
    }
    UnalignedBarrier::Starts
}

/// Whether checkpoint `checkpoint` was snapshotted here unaligned and is still capturing.
fn is_capturing(cp: &TaskCheckpointing, checkpoint: u64) -> bool {
    cp.pending_unaligned.iter().any(|p| p.snapshot.barrier.id == checkpoint)
}

/// Snapshots the chain for an unaligned `barrier` (forwarding it) and starts capturing its
/// in-flight data.
fn snapshot_unaligned(
    cp: &mut TaskCheckpointing,
    inputs: &mut impl Inputs,
    id: &TaskIdent,
    barrier: Barrier,
    aligning_since_ns: Option<u64>,
    head: &mut dyn ChainHead,
) -> Result<()> {
    debug_assert!(barrier.id > cp.unaligned_done, "unaligned snapshots go in checkpoint order");
    cp.check_sync_fault(&barrier, &id.name)?;
    let start = cp.clock.now_ns();
    let mut snap = TaskSnapshot::new(barrier);
    head.barrier(barrier, &mut snap)?;
    let now = cp.clock.now_ns();
    cp.activity.forked(start, now);
    let first = aligning_since_ns.unwrap_or(start);
    let stats = TaskStats {
        start_delay_ns: first.saturating_sub(barrier.trigger_ns),
        sync_ns: now - start,
        ..Default::default()
    };
    cp.pending_unaligned.push(PendingSnapshot { snapshot: snap, stats, started_ns: first });
    cp.unaligned_done = barrier.id;
    inputs.start_capture(barrier.id);
    Ok(())
}

/// Once every channel's in-flight data is captured, adds it to the pending snapshot and starts
/// the write.
fn finish_unaligned(cp: &mut TaskCheckpointing, inputs: &mut impl Inputs, id: &TaskIdent) -> Result<()> {
    if cp.pending_unaligned.is_empty() {
        return Ok(());
    }
    inputs.refresh_capture();
    let mut at = 0;
    while at < cp.pending_unaligned.len() {
        let checkpoint = cp.pending_unaligned[at].snapshot.barrier.id;
        if !inputs.capture_complete(checkpoint) {
            at += 1;
            continue;
        }
        let mut p = cp.pending_unaligned.remove(at);
        if !p.stats.channels.is_empty() {
            for (c, bytes) in p.stats.channels.iter_mut().zip(inputs.captured_bytes(checkpoint)) {
                c.bytes = bytes;
                c.aligned = bytes == 0;
            }
        }
        for (input, bytes) in inputs.take_capture(checkpoint) {
            p.snapshot.add_inflight(inflight_part(&id.operator, input).into(), id.subtask, bytes);
        }
        p.stats.alignment_ns = cp.clock.now_ns().saturating_sub(p.started_ns);
        cp.write_async(p.snapshot, p.stats);
    }
    Ok(())
}
