//! Tasks: what a worker polls. A task is one subtask of a chain: a source or one or two input
//! gates at the head, then chained operators as nested collectors, ending in sinks or ring
//! writers. [`Guarded`] wraps each operator so a panic in user code becomes an
//! [`Error::OperatorPanicked`] naming the operator and subtask.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::channel::Entry;
use crate::channel::{GatePoll, InputGate};
use crate::checkpoint::task::{
    Alignment, BarrierAligner, PendingSnapshot, TaskCheckpointing, TaskControl, TaskStats,
};
use crate::collector::Collector;
use crate::context::TaskContext;
use crate::error::{Error, Result};
use crate::metrics::Counter;
use crate::operator::{Left, Right, TwoInputOperator};
use crate::persist::{to_bytes, Persist};
use crate::record::Timestamp;
use crate::snapshot::{Barrier, CheckpointNotice, ForkedState, RawBytes, TaskSnapshot};
use crate::source::{Source, SourcePoll};

/// What one poll of a task achieved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TaskPoll {
    Progress,
    Idle,
    Finished,
}

/// One subtask chain, owned and polled by one worker.
pub(crate) trait Task: Send {
    fn name(&self) -> &str;
    fn poll(&mut self) -> Result<TaskPoll>;
}

/// Job-wide control flags, shared by the handle, the workers and the source tasks.
#[derive(Default, Debug)]
pub(crate) struct JobControl {
    /// Sources end their streams; the job drains and finishes normally.
    pub(crate) stop: AtomicBool,
    /// Workers stop at once; the job ends with [`Error::Cancelled`].
    pub(crate) cancel: AtomicBool,
}

pub(crate) fn panic_message(payload: Box<dyn Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(s) => *s,
        Err(p) => match p.downcast::<&'static str>() {
            Ok(s) => s.to_string(),
            Err(_) => "(a panic without a message)".to_string(),
        },
    }
}

/// Runs `f`, turning a panic into [`Error::OperatorPanicked`].
#[inline]
fn guard<R>(ctx: &TaskContext, f: impl FnOnce() -> Result<R>) -> Result<R> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => Err(Error::OperatorPanicked {
            operator: ctx.operator.to_string(),
            subtask: ctx.subtask,
            message: panic_message(p),
        }),
    }
}

/// An operator whose panics are reported with its name and subtask.
pub(crate) struct Guarded<C> {
    ctx: TaskContext,
    inner: C,
}

impl<C> Guarded<C> {
    pub(crate) fn new(ctx: TaskContext, inner: C) -> Self {
        Guarded { ctx, inner }
    }

    /// Counts records for injected failures (tests); a no-op unless faults are configured.
    #[inline]
    fn count_for_faults(&self, n: usize) -> Result<()> {
        match &self.ctx.faults {
            Some(f) => f
                .on_records(&self.ctx.operator, n)
                .map_err(|e| with_subtask(e, self.ctx.subtask)),
            None => Ok(()),
        }
    }
}

impl<T, C: Collector<T>> Collector<T> for Guarded<C> {
    #[inline]
    fn batch(&mut self, records: &mut Vec<T>) -> Result<()> {
        self.count_for_faults(records.len())?;
        let inner = &mut self.inner;
        guard(&self.ctx, || inner.batch(records))
    }
    fn barrier(&mut self, barrier: Barrier, snapshot: &mut TaskSnapshot) -> Result<()> {
        let inner = &mut self.inner;
        let ctx = &self.ctx;
        guard(ctx, || {
            if let Some(state) = inner.snapshot_state(&barrier)? {
                snapshot.add(ctx.operator.clone(), ctx.subtask, state);
            }
            inner.barrier(barrier, snapshot)
        })
    }
    fn notify(&mut self, notice: CheckpointNotice) -> Result<()> {
        let inner = &mut self.inner;
        guard(&self.ctx, || inner.notify(notice))
    }
    fn restore_state(&mut self, bytes: &[u8]) -> Result<()> {
        let inner = &mut self.inner;
        guard(&self.ctx, || inner.restore_state(bytes))
    }
    fn watermark(&mut self, watermark: Timestamp) -> Result<()> {
        let inner = &mut self.inner;
        guard(&self.ctx, || inner.watermark(watermark))
    }
    fn end(&mut self) -> Result<()> {
        let inner = &mut self.inner;
        guard(&self.ctx, || inner.end())
    }
    fn drain(&mut self) -> Result<bool> {
        let inner = &mut self.inner;
        guard(&self.ctx, || inner.drain())
    }
}

impl<A, B, O: TwoInputOperator<A, B>> TwoInputOperator<A, B> for Guarded<O> {
    fn barrier(&mut self, barrier: Barrier, snapshot: &mut TaskSnapshot) -> Result<()> {
        let inner = &mut self.inner;
        let ctx = &self.ctx;
        guard(ctx, || {
            if let Some(state) = inner.snapshot_state(&barrier)? {
                snapshot.add(ctx.operator.clone(), ctx.subtask, state);
            }
            inner.barrier(barrier, snapshot)
        })
    }
    fn notify(&mut self, notice: CheckpointNotice) -> Result<()> {
        let inner = &mut self.inner;
        guard(&self.ctx, || inner.notify(notice))
    }
    fn snapshot_state(&mut self, barrier: &Barrier) -> Result<Option<Box<dyn ForkedState>>> {
        self.inner.snapshot_state(barrier)
    }
    fn restore_state(&mut self, bytes: &[u8]) -> Result<()> {
        let inner = &mut self.inner;
        guard(&self.ctx, || inner.restore_state(bytes))
    }
    fn batch1(&mut self, records: &mut Vec<A>) -> Result<()> {
        self.count_for_faults(records.len())?;
        let inner = &mut self.inner;
        guard(&self.ctx, || inner.batch1(records))
    }
    fn batch2(&mut self, records: &mut Vec<B>) -> Result<()> {
        self.count_for_faults(records.len())?;
        let inner = &mut self.inner;
        guard(&self.ctx, || inner.batch2(records))
    }
    fn watermark1(&mut self, watermark: Timestamp) -> Result<()> {
        let inner = &mut self.inner;
        guard(&self.ctx, || inner.watermark1(watermark))
    }
    fn watermark2(&mut self, watermark: Timestamp) -> Result<()> {
        let inner = &mut self.inner;
        guard(&self.ctx, || inner.watermark2(watermark))
    }
    fn end1(&mut self) -> Result<()> {
        let inner = &mut self.inner;
        guard(&self.ctx, || inner.end1())
    }
    fn end2(&mut self) -> Result<()> {
        let inner = &mut self.inner;
        guard(&self.ctx, || inner.end2())
    }
    fn drain(&mut self) -> Result<bool> {
        let inner = &mut self.inner;
        guard(&self.ctx, || inner.drain())
    }
}

/// Names the subtask in an injected failure.
fn with_subtask(e: Error, subtask: usize) -> Error {
    match e {
        Error::OperatorPanicked {
            operator, message, ..
        } => Error::OperatorPanicked {
            operator,
            subtask,
            message,
        },
        other => other,
    }
}

fn task_name(ctx: &TaskContext) -> String {
    format!("{} ({}/{})", ctx.operator, ctx.subtask + 1, ctx.parallelism)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    /// End of stream was sent; waiting for it to drain.
    Ending,
    Done,
}

/// Handles the coordinator's notices for a task whose chain head is `notify`.
fn apply_notice(
    cp: &mut TaskCheckpointing,
    notice: CheckpointNotice,
    notify: &mut dyn FnMut(CheckpointNotice) -> Result<()>,
) -> Result<bool> {
    let mut unblock = false;
    if let CheckpointNotice::Aborted(id) = notice {
        unblock = cp.aligner.abort(id);
        if cp
            .pending_unaligned
            .as_ref()
            .is_some_and(|p| p.snapshot.barrier.id == id)
        {
            cp.pending_unaligned = None;
            unblock = true;
        }
        cp.unaligned_done = cp.unaligned_done.max(id);
    }
    notify(notice)?;
    Ok(unblock)
}

/// A source subtask and its chain.
pub(crate) struct SourceTask<T> {
    name: String,
    ctx: TaskContext,
    source: Box<dyn Source<T>>,
    out: Box<dyn Collector<T>>,
    buf: Vec<T>,
    batch_size: usize,
    emitted: Arc<Counter>,
    control: Arc<JobControl>,
    checkpointing: Option<TaskCheckpointing>,
    phase: Phase,
}

impl<T> SourceTask<T> {
    pub(crate) fn new(
        ctx: TaskContext,
        source: Box<dyn Source<T>>,
        out: Box<dyn Collector<T>>,
        batch_size: usize,
        control: Arc<JobControl>,
        checkpointing: Option<TaskCheckpointing>,
    ) -> Self {
        let emitted = ctx.metrics.source_counter();
        SourceTask {
            name: task_name(&ctx),
            ctx,
            source,
            out,
            buf: Vec::with_capacity(batch_size),
            batch_size,
            emitted,
            control,
            checkpointing,
            phase: Phase::Running,
        }
    }

    /// Takes this source's part of checkpoint `barrier`: its offset, then the chain's state,
    /// then the barrier goes downstream behind everything emitted so far.
    fn checkpoint(&mut self, barrier: Barrier) -> Result<()> {
        let cp = self
            .checkpointing
            .as_ref()
            .expect("triggers reach checkpointed sources only");
        cp.check_sync_fault(&barrier, &self.name)?;
        let start = self.ctx.now_ns();
        let mut snapshot = TaskSnapshot::new(barrier);
        if let Some(offset) = self.source.offset() {
            snapshot.add(
                self.ctx.operator.clone(),
                self.ctx.subtask,
                Box::new(RawBytes(offset)),
            );
        }
        self.out.barrier(barrier, &mut snapshot)?;
        let now = self.ctx.now_ns();
        let stats = TaskStats {
            start_delay_ns: start.saturating_sub(barrier.trigger_ns),
            sync_ns: now - start,
            ..Default::default()
        };
        cp.write_async(snapshot, stats);
        Ok(())
    }
}

impl<T: Send> Task for SourceTask<T> {
    fn name(&self) -> &str {
        &self.name
    }

    fn poll(&mut self) -> Result<TaskPoll> {
        if self.phase == Phase::Done {
            return Ok(TaskPoll::Finished);
        }
        while let Some(msg) = self.checkpointing.as_ref().and_then(|c| c.next_control()) {
            match msg {
                TaskControl::Trigger(b) if self.phase == Phase::Running => self.checkpoint(b)?,
                TaskControl::Trigger(_) => {}
                TaskControl::Notice(n) => {
                    let out = &mut self.out;
                    let cp = self.checkpointing.as_mut().expect("message came from it");
                    apply_notice(cp, n, &mut |n| out.notify(n))?;
                }
            }
        }
        if !self.out.drain()? {
            return Ok(TaskPoll::Idle);
        }
        if self.phase == Phase::Ending {
            self.phase = Phase::Done;
            return Ok(TaskPoll::Finished);
        }
        let status = if self.control.stop.load(Ordering::Relaxed) {
            SourcePoll::Finished
        } else {
            let (source, ctx, buf, max) =
                (&mut self.source, &self.ctx, &mut self.buf, self.batch_size);
            guard(&self.ctx, || source.poll(ctx, buf, max))?
        };
        if !self.buf.is_empty() {
            self.emitted.add(self.buf.len() as u64);
            self.out.batch(&mut self.buf)?;
        }
        match status {
            SourcePoll::Emitted => Ok(TaskPoll::Progress),
            SourcePoll::Idle => Ok(TaskPoll::Idle),
            SourcePoll::Finished => {
                self.out.end()?;
                self.phase = Phase::Ending;
                Ok(TaskPoll::Progress)
            }
        }
    }
}

/// Snapshot bookkeeping shared by the one- and two-input tasks: when the aligner reports a
/// complete alignment, run `snapshot` (the chain's synchronous part) and start the write.
fn snapshot_aligned(
    cp: &TaskCheckpointing,
    name: &str,
    barrier: Barrier,
    first_ns: u64,
    snapshot: impl FnOnce(&mut TaskSnapshot) -> Result<()>,
) -> Result<()> {
    cp.check_sync_fault(&barrier, name)?;
    let start = cp.clock.now_ns();
    let mut snap = TaskSnapshot::new(barrier);
    snapshot(&mut snap)?;
    let now = cp.clock.now_ns();
    let stats = TaskStats {
        start_delay_ns: first_ns.saturating_sub(barrier.trigger_ns),
        alignment_ns: start.saturating_sub(first_ns),
        sync_ns: now - start,
        ..Default::default()
    };
    cp.write_async(snap, stats);
    Ok(())
}

/// The name under which a task stores the in-flight data of its input `input`.
pub(crate) fn inflight_part(operator: &str, input: usize) -> String {
    format!("{operator}#inflight{input}")
}

/// Encodes one gate's captured in-flight data.
fn encode_inflight<T: Persist>(data: Vec<(usize, Vec<Entry<T>>)>) -> Vec<u8> {
    let data: Vec<(u64, Vec<Entry<T>>)> = data.into_iter().map(|(c, e)| (c as u64, e)).collect();
    to_bytes(&data)
}

/// Decodes in-flight data written by [`encode_inflight`].
pub(crate) fn decode_inflight<T: Persist>(bytes: &[u8]) -> Result<Vec<(usize, Vec<Entry<T>>)>> {
    let data: Vec<(u64, Vec<Entry<T>>)> = crate::persist::from_bytes(bytes)?;
    Ok(data.into_iter().map(|(c, e)| (c as usize, e)).collect())
}

/// The first priority barrier of an unaligned checkpoint at a task: decides whether it starts
/// a snapshot now (returns true), is stale, or supersedes an older one still capturing.
fn begin_unaligned(cp: &mut TaskCheckpointing, barrier: &Barrier) -> Option<bool> {
    if barrier.id <= cp.unaligned_done {
        return None;
    }
    if let Some(p) = &cp.pending_unaligned {
        let pending = p.snapshot.barrier.id;
        if pending > barrier.id {
            return None;
        }
        if pending < barrier.id {
            cp.decline(
                pending,
                "superseded by a newer checkpoint before its in-flight data was complete",
            );
            cp.pending_unaligned = None;
            cp.unaligned_done = pending;
            return Some(true);
        }
        return Some(false);
    }
    Some(true)
}

/// Adds the captured in-flight data to the pending snapshot and starts its write.
fn finish_unaligned(cp: &mut TaskCheckpointing, inflight: Vec<(String, usize, Vec<u8>)>) {
    let mut p = cp
        .pending_unaligned
        .take()
        .expect("an unaligned checkpoint is pending");
    for (part, subtask, bytes) in inflight {
        p.stats.inflight_bytes += bytes.len() as u64;
        p.snapshot
            .add(part.into(), subtask, Box::new(RawBytes(bytes)));
    }
    p.stats.alignment_ns = cp.clock.now_ns().saturating_sub(p.started_ns);
    cp.unaligned_done = p.snapshot.barrier.id;
    cp.write_async(p.snapshot, p.stats);
}

/// Takes the synchronous part of an unaligned checkpoint: `snapshot` runs the chain.
fn snapshot_unaligned(
    cp: &mut TaskCheckpointing,
    name: &str,
    barrier: Barrier,
    snapshot: impl FnOnce(&mut TaskSnapshot) -> Result<()>,
) -> Result<()> {
    cp.check_sync_fault(&barrier, name)?;
    let start = cp.clock.now_ns();
    let mut snap = TaskSnapshot::new(barrier);
    snapshot(&mut snap)?;
    let now = cp.clock.now_ns();
    let stats = TaskStats {
        start_delay_ns: start.saturating_sub(barrier.trigger_ns),
        sync_ns: now - start,
        ..Default::default()
    };
    cp.pending_unaligned = Some(PendingSnapshot {
        snapshot: snap,
        stats,
        started_ns: start,
    });
    Ok(())
}

/// A subtask with one input (possibly fed by several edges, as after a union).
pub(crate) struct OneInputTask<T> {
    name: String,
    /// (operator, subtask) of the chain head, naming this task's in-flight data.
    head_id: (Arc<str>, usize),
    gate: InputGate<T>,
    head: Box<dyn Collector<T>>,
    budget: usize,
    checkpointing: Option<TaskCheckpointing>,
    phase: Phase,
}

impl<T: Copy> OneInputTask<T> {
    pub(crate) fn new(
        ctx: &TaskContext,
        mut gate: InputGate<T>,
        head: Box<dyn Collector<T>>,
        budget: usize,
        checkpointing: Option<TaskCheckpointing>,
    ) -> Self {
        gate.set_blocking(checkpointing.as_ref().is_some_and(|c| c.blocks()));
        let mut checkpointing = checkpointing;
        if let Some(cp) = checkpointing.as_mut() {
            cp.aligner = BarrierAligner::new(gate.channels());
            gate.set_unaligned(cp.unaligned);
        }
        OneInputTask {
            name: task_name(ctx),
            head_id: (ctx.operator.clone(), ctx.subtask),
            gate,
            head,
            budget,
            checkpointing,
            phase: Phase::Running,
        }
    }

    fn on_priority_barrier(&mut self, channel: usize, barrier: Barrier, seq: u64) -> Result<()>
    where
        T: Persist,
    {
        let cp = self
            .checkpointing
            .as_mut()
            .expect("barriers flow only in checkpointed jobs");
        match begin_unaligned(cp, &barrier) {
            None => return Ok(()),
            Some(true) => {
                self.gate.abort_capture();
                let head = &mut self.head;
                snapshot_unaligned(cp, &self.name, barrier, |snap| head.barrier(barrier, snap))?;
                self.gate.start_capture();
            }
            Some(false) => {}
        }
        self.gate.set_capture_limit(channel, seq);
        self.try_finish_unaligned();
        Ok(())
    }

    fn try_finish_unaligned(&mut self)
    where
        T: Persist,
    {
        let Some(cp) = self.checkpointing.as_mut() else {
            return;
        };
        if cp.pending_unaligned.is_none() {
            return;
        }
        self.gate.refresh_capture();
        if !self.gate.capture_complete() {
            return;
        }
        let data = encode_inflight(self.gate.take_capture());
        finish_unaligned(
            cp,
            vec![(inflight_part(&self.head_id.0, 0), self.head_id.1, data)],
        );
    }

    fn on_barrier(&mut self, channel: usize, barrier: Barrier) -> Result<()> {
        let cp = self
            .checkpointing
            .as_mut()
            .expect("barriers flow only in checkpointed jobs");
        match cp.aligner.on_barrier(channel, barrier, cp.clock.now_ns()) {
            Alignment::Stale => self.gate.unblock(channel),
            Alignment::Superseded => {
                self.gate.unblock_all();
                if cp.blocks() {
                    self.gate.block(channel);
                }
            }
            Alignment::Waiting => {}
        }
        self.try_complete()
    }

    fn try_complete(&mut self) -> Result<()> {
        let Some(cp) = self.checkpointing.as_mut() else {
            return Ok(());
        };
        let gate = &self.gate;
        if let Some((barrier, first_ns)) = cp.aligner.complete(|i| gate.is_ended(i)) {
            let head = &mut self.head;
            snapshot_aligned(cp, &self.name, barrier, first_ns, |snap| {
                head.barrier(barrier, snap)
            })?;
            self.gate.unblock_all();
        }
        Ok(())
    }
}

impl<T: Copy + Send + Persist> Task for OneInputTask<T> {
    fn name(&self) -> &str {
        &self.name
    }

    fn poll(&mut self) -> Result<TaskPoll> {
        if self.phase == Phase::Done {
            return Ok(TaskPoll::Finished);
        }
        while let Some(msg) = self.checkpointing.as_ref().and_then(|c| c.next_control()) {
            if let TaskControl::Notice(n) = msg {
                let head = &mut self.head;
                let cp = self.checkpointing.as_mut().expect("message came from it");
                if apply_notice(cp, n, &mut |n| head.notify(n))? {
                    self.gate.unblock_all();
                }
                if cp.pending_unaligned.is_none() && self.gate.capturing() {
                    self.gate.abort_capture();
                }
            }
        }
        // A backpressured task still completes an unaligned capture: the data is in the rings.
        self.try_finish_unaligned();
        if !self.head.drain()? {
            return Ok(TaskPoll::Idle);
        }
        if self.phase == Phase::Ending {
            self.phase = Phase::Done;
            return Ok(TaskPoll::Finished);
        }
        let polled = self.gate.poll(&mut *self.head, self.budget)?;
        Ok(match polled {
            GatePoll::Progress => {
                self.try_complete()?;
                self.try_finish_unaligned();
                TaskPoll::Progress
            }
            GatePoll::PriorityBarrier {
                channel,
                barrier,
                seq,
            } => {
                self.on_priority_barrier(channel, barrier, seq)?;
                TaskPoll::Progress
            }
            GatePoll::Idle => TaskPoll::Idle,
            GatePoll::Barrier { channel, barrier } => {
                self.on_barrier(channel, barrier)?;
                TaskPoll::Progress
            }
            GatePoll::Finished => {
                self.phase = Phase::Ending;
                TaskPoll::Progress
            }
        })
    }
}

/// A subtask of a two-input operator. Its aligner numbers the left input's channels first.
pub(crate) struct TwoInputTask<A, B> {
    name: String,
    head_id: (Arc<str>, usize),
    left: InputGate<A>,
    right: InputGate<B>,
    op: Box<dyn TwoInputOperator<A, B>>,
    budget: usize,
    checkpointing: Option<TaskCheckpointing>,
    done: [bool; 2],
    phase: Phase,
}

impl<A: Copy, B: Copy> TwoInputTask<A, B> {
    pub(crate) fn new(
        ctx: &TaskContext,
        mut left: InputGate<A>,
        mut right: InputGate<B>,
        op: Box<dyn TwoInputOperator<A, B>>,
        budget: usize,
        checkpointing: Option<TaskCheckpointing>,
    ) -> Self {
        let blocks = checkpointing.as_ref().is_some_and(|c| c.blocks());
        left.set_blocking(blocks);
        right.set_blocking(blocks);
        let mut checkpointing = checkpointing;
        if let Some(cp) = checkpointing.as_mut() {
            cp.aligner = BarrierAligner::new(left.channels() + right.channels());
            left.set_unaligned(cp.unaligned);
            right.set_unaligned(cp.unaligned);
        }
        TwoInputTask {
            name: task_name(ctx),
            head_id: (ctx.operator.clone(), ctx.subtask),
            left,
            right,
            op,
            budget,
            checkpointing,
            done: [false; 2],
            phase: Phase::Running,
        }
    }

    fn unblock_all(&mut self) {
        self.left.unblock_all();
        self.right.unblock_all();
    }

    fn on_priority_barrier(&mut self, channel: usize, barrier: Barrier, seq: u64) -> Result<()>
    where
        A: Persist,
        B: Persist,
    {
        let cp = self
            .checkpointing
            .as_mut()
            .expect("barriers flow only in checkpointed jobs");
        match begin_unaligned(cp, &barrier) {
            None => return Ok(()),
            Some(true) => {
                self.left.abort_capture();
                self.right.abort_capture();
                let op = &mut self.op;
                snapshot_unaligned(cp, &self.name, barrier, |snap| op.barrier(barrier, snap))?;
                self.left.start_capture();
                self.right.start_capture();
            }
            Some(false) => {}
        }
        let n_left = self.left.channels();
        if channel < n_left {
            self.left.set_capture_limit(channel, seq);
        } else {
            self.right.set_capture_limit(channel - n_left, seq);
        }
        self.try_finish_unaligned();
        Ok(())
    }

    fn try_finish_unaligned(&mut self)
    where
        A: Persist,
        B: Persist,
    {
        let Some(cp) = self.checkpointing.as_mut() else {
            return;
        };
        if cp.pending_unaligned.is_none() {
            return;
        }
        self.left.refresh_capture();
        self.right.refresh_capture();
        if !self.left.capture_complete() || !self.right.capture_complete() {
            return;
        }
        let (op, subtask) = (&self.head_id.0, self.head_id.1);
        let parts = vec![
            (
                inflight_part(op, 0),
                subtask,
                encode_inflight(self.left.take_capture()),
            ),
            (
                inflight_part(op, 1),
                subtask,
                encode_inflight(self.right.take_capture()),
            ),
        ];
        finish_unaligned(cp, parts);
    }

    fn on_barrier(&mut self, channel: usize, barrier: Barrier) -> Result<()> {
        let cp = self
            .checkpointing
            .as_mut()
            .expect("barriers flow only in checkpointed jobs");
        let n_left = self.left.channels();
        match cp.aligner.on_barrier(channel, barrier, cp.clock.now_ns()) {
            Alignment::Stale if channel < n_left => self.left.unblock(channel),
            Alignment::Stale => self.right.unblock(channel - n_left),
            Alignment::Superseded => {
                let blocks = cp.blocks();
                self.unblock_all();
                if blocks && channel < n_left {
                    self.left.block(channel);
                } else if blocks {
                    self.right.block(channel - n_left);
                }
            }
            Alignment::Waiting => {}
        }
        self.try_complete()
    }

    fn try_complete(&mut self) -> Result<()> {
        let Some(cp) = self.checkpointing.as_mut() else {
            return Ok(());
        };
        let (left, right) = (&self.left, &self.right);
        let n_left = left.channels();
        let ended = |i: usize| {
            if i < n_left {
                left.is_ended(i)
            } else {
                right.is_ended(i - n_left)
            }
        };
        if let Some((barrier, first_ns)) = cp.aligner.complete(ended) {
            let op = &mut self.op;
            snapshot_aligned(cp, &self.name, barrier, first_ns, |snap| {
                op.barrier(barrier, snap)
            })?;
            self.unblock_all();
        }
        Ok(())
    }
}

impl<A: Copy + Send + Persist, B: Copy + Send + Persist> Task for TwoInputTask<A, B> {
    fn name(&self) -> &str {
        &self.name
    }

    fn poll(&mut self) -> Result<TaskPoll> {
        if self.phase == Phase::Done {
            return Ok(TaskPoll::Finished);
        }
        while let Some(msg) = self.checkpointing.as_ref().and_then(|c| c.next_control()) {
            if let TaskControl::Notice(n) = msg {
                let op = &mut self.op;
                let cp = self.checkpointing.as_mut().expect("message came from it");
                let unblock = apply_notice(cp, n, &mut |n| op.notify(n))?;
                let abandoned = cp.pending_unaligned.is_none();
                if unblock {
                    self.unblock_all();
                }
                if abandoned && self.left.capturing() {
                    self.left.abort_capture();
                    self.right.abort_capture();
                }
            }
        }
        self.try_finish_unaligned();
        if !self.op.drain()? {
            return Ok(TaskPoll::Idle);
        }
        if self.phase == Phase::Ending {
            self.phase = Phase::Done;
            return Ok(TaskPoll::Finished);
        }
        let mut progress = false;
        if !self.done[0] {
            match self.left.poll(&mut Left(&mut *self.op), self.budget)? {
                GatePoll::Progress => progress = true,
                GatePoll::Idle => {}
                GatePoll::Barrier { channel, barrier } => {
                    self.on_barrier(channel, barrier)?;
                    progress = true;
                }
                GatePoll::PriorityBarrier {
                    channel,
                    barrier,
                    seq,
                } => {
                    self.on_priority_barrier(channel, barrier, seq)?;
                    progress = true;
                }
                GatePoll::Finished => {
                    self.done[0] = true;
                    progress = true;
                }
            }
        }
        if !self.done[1] && self.op.drain()? {
            match self.right.poll(&mut Right(&mut *self.op), self.budget)? {
                GatePoll::Progress => progress = true,
                GatePoll::Idle => {}
                GatePoll::Barrier { channel, barrier } => {
                    let n_left = self.left.channels();
                    self.on_barrier(n_left + channel, barrier)?;
                    progress = true;
                }
                GatePoll::PriorityBarrier {
                    channel,
                    barrier,
                    seq,
                } => {
                    let n_left = self.left.channels();
                    self.on_priority_barrier(n_left + channel, barrier, seq)?;
                    progress = true;
                }
                GatePoll::Finished => {
                    self.done[1] = true;
                    progress = true;
                }
            }
        }
        if progress {
            self.try_complete()?;
            self.try_finish_unaligned();
        }
        if self.done == [true, true] {
            self.phase = Phase::Ending;
        }
        Ok(if progress {
            TaskPoll::Progress
        } else {
            TaskPoll::Idle
        })
    }
}
