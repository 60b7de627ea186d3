//! Tasks: what a worker polls. A task is one subtask of a chain: a source or one or two input
//! gates at the head, then chained operators as nested collectors, ending in sinks or ring
//! writers. [`Guarded`] wraps each operator so a panic in user code becomes an
//! [`Error::OperatorPanicked`] naming the operator and subtask.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::barrier::BarrierAligner;
use crate::barrier::{self as barriers, apply_notice, GatePair, TaskCheckpointing, TaskIdent};
use crate::channel::{GatePoll, InputGate};
use crate::checkpoint::task::{TaskControl, TaskStats};
use crate::collector::Collector;
use crate::context::{Clock, TaskContext};
use crate::error::{Error, Result};
use crate::metrics::Counter;
use crate::operator::{Left, Right, TwoInputOperator};
use crate::persist::Persist;
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

/// Polls `task`, turning a panic outside its operators' guards (a bug in weir) into an
/// error naming the task, as every operator's own panic already is.
pub(crate) fn poll_catching_panics(task: &mut dyn Task) -> Result<TaskPoll> {
    catch_unwind(AssertUnwindSafe(|| task.poll())).unwrap_or_else(|p| Err(panic_error(task.name(), 0, p)))
}

/// The error a panic of `operator`'s subtask ends its attempt with: a keyed state's failure
/// to read or write a page out of memory is that I/O error; any other panic is the
/// operator's.
pub(crate) fn panic_error(operator: &str, subtask: usize, payload: Box<dyn Any + Send>) -> Error {
    match payload.downcast::<crate::state::StateFailure>() {
        Ok(failure) => failure.0,
        Err(p) => Error::OperatorPanicked { operator: operator.to_string(), subtask, message: panic_message(p) },
    }
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
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| Err(panic_error(&ctx.operator, ctx.subtask, p)))
}

/// An operator whose panics are reported with its name and subtask. In builds with debug
/// assertions (the test profile, the simulator's runs in `cargo test`) it also checks what
/// reaches the operator, per input: barrier ids strictly increase, watermarks never go back,
/// and nothing arrives after the end of the stream.
pub(crate) struct Guarded<C, N = PerElement> {
    ctx: TaskContext,
    inner: C,
    /// How its records in are counted from a batch.
    counting: std::marker::PhantomData<fn() -> N>,
    /// Its records in and watermark, for the metrics endpoint.
    metrics: Arc<crate::metrics::OperatorMetrics>,
    #[cfg(debug_assertions)]
    seen: [StreamInvariants; 2],
    /// The last barrier the operator took (one sequence for both inputs of a two-input one).
    #[cfg(debug_assertions)]
    barrier: u64,
}

/// How an operator's records in are counted from a batch of its input: what the metrics call
/// records should read as the input's own (Flink users compare them).
pub(crate) trait CountIn<T> {
    /// The records `batch` holds.
    fn count(batch: &[T]) -> u64;
}

/// One record per element: every operator but those fed blocks.
pub(crate) struct PerElement;

impl<T> CountIn<T> for PerElement {
    #[inline]
    fn count(batch: &[T]) -> u64 {
        batch.len() as u64
    }
}

/// Blocks of whole lines (the text source's, for `words`): the lines they hold, as the
/// source counts them ([`crate::source::Source::records_in`]); a block counted as one record
/// read 9,182 against 114,800 lines.
pub(crate) struct LinesInBlocks;

impl CountIn<Vec<u8>> for LinesInBlocks {
    #[inline]
    fn count(batch: &[Vec<u8>]) -> u64 {
        batch.iter().map(|b| crate::source::lines_in(b)).sum()
    }
}

/// What one input of an operator has delivered so far (debug builds).
#[cfg(debug_assertions)]
#[derive(Default)]
struct StreamInvariants {
    watermark: Option<Timestamp>,
    ended: bool,
}

#[cfg(debug_assertions)]
impl StreamInvariants {
    fn records(&self, ctx: &TaskContext) {
        assert!(!self.ended, "{}: records after the end of the stream", task_name(ctx));
    }
    fn watermark(&mut self, ctx: &TaskContext, w: Timestamp) {
        assert!(!self.ended, "{}: a watermark after the end of the stream", task_name(ctx));
        assert!(self.watermark.is_none_or(|last| w >= last), "{}: the watermark went back", task_name(ctx));
        self.watermark = Some(w);
    }
    fn end(&mut self, ctx: &TaskContext) {
        assert!(!self.ended, "{}: the stream ended twice", task_name(ctx));
        self.ended = true;
    }
}

#[cfg(debug_assertions)]
impl<C, N> Guarded<C, N> {
    /// A barrier reached the operator: after every earlier one, and while an input is live.
    fn check_barrier(&mut self, id: u64, inputs: usize) {
        let name = task_name(&self.ctx);
        assert!(!self.seen[..inputs].iter().all(|s| s.ended), "{name}: barrier {id} after the end of the stream");
        assert!(id > self.barrier, "{name}: barrier {id} after barrier {}", self.barrier);
        self.barrier = id;
    }
}

/// Runs an invariant check in debug builds; nothing otherwise.
macro_rules! check_stream {
    ($self:ident, $input:expr, $check:ident $(, $arg:expr)*) => {
        #[cfg(debug_assertions)]
        $self.seen[$input].$check(&$self.ctx $(, $arg)*);
    };
}

impl<C, N> Guarded<C, N> {
    pub(crate) fn new(ctx: TaskContext, inner: C) -> Self {
        let metrics = ctx.metrics.operator(&ctx.operator, ctx.subtask);
        Guarded {
            ctx,
            inner,
            counting: std::marker::PhantomData,
            metrics,
            #[cfg(debug_assertions)]
            seen: Default::default(),
            #[cfg(debug_assertions)]
            barrier: 0,
        }
    }

    /// Counts records for injected failures (tests); a no-op unless faults are configured.
    #[inline]
    fn count_for_faults(&self, n: usize) -> Result<()> {
        match &self.ctx.faults {
            Some(f) => f.on_records(&self.ctx.operator, n).map_err(|e| with_subtask(e, self.ctx.subtask)),
            None => Ok(()),
        }
    }
}

/// The chain wrapper's part of a checkpoint: capture the operator's state (named after it),
/// then let the operator forward the barrier. The same for one- and two-input operators.
macro_rules! snapshot_then_forward {
    ($self:ident, $barrier:ident, $snapshot:ident) => {{
        let inner = &mut $self.inner;
        let ctx = &$self.ctx;
        guard(ctx, || {
            if let Some(state) = inner.snapshot_state(&$barrier)? {
                $snapshot.add(ctx.operator.clone(), ctx.subtask, state);
            }
            inner.barrier($barrier, $snapshot)
        })
    }};
}

impl<T, C: Collector<T>, N: CountIn<T>> Collector<T> for Guarded<C, N> {
    #[inline]
    fn batch(&mut self, records: &mut Vec<T>) -> Result<()> {
        check_stream!(self, 0, records);
        self.count_for_faults(records.len())?;
        self.metrics.received(N::count(records));
        let inner = &mut self.inner;
        guard(&self.ctx, || inner.batch(records))
    }
    fn barrier(&mut self, barrier: Barrier, snapshot: &mut TaskSnapshot) -> Result<()> {
        #[cfg(debug_assertions)]
        self.check_barrier(barrier.id, 1);
        snapshot_then_forward!(self, barrier, snapshot)
    }
    fn notify(&mut self, notice: CheckpointNotice) -> Result<()> {
        let inner = &mut self.inner;
        guard(&self.ctx, || inner.notify(notice))
    }
    fn restore_state(&mut self, bytes: &[u8]) -> Result<()> {
        let inner = &mut self.inner;
        guard(&self.ctx, || inner.restore_state(bytes))
    }
    fn restore_rescaled(&mut self, parts: &[(usize, &[u8])], scope: &crate::record::KeyScope) -> Result<()> {
        let inner = &mut self.inner;
        guard(&self.ctx, || inner.restore_rescaled(parts, scope)).map_err(|e| naming_operator(&self.ctx, e))
    }
    fn restore_local(&mut self, fork: &dyn ForkedState) -> Result<()> {
        let inner = &mut self.inner;
        guard(&self.ctx, || inner.restore_local(fork))
    }
    fn watermark(&mut self, watermark: Timestamp) -> Result<()> {
        check_stream!(self, 0, watermark, watermark);
        self.metrics.watermarked(watermark);
        let inner = &mut self.inner;
        guard(&self.ctx, || inner.watermark(watermark))
    }
    fn end(&mut self) -> Result<()> {
        check_stream!(self, 0, end);
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
        #[cfg(debug_assertions)]
        self.check_barrier(barrier.id, 2);
        snapshot_then_forward!(self, barrier, snapshot)
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
    fn restore_rescaled(&mut self, parts: &[(usize, &[u8])], scope: &crate::record::KeyScope) -> Result<()> {
        let inner = &mut self.inner;
        guard(&self.ctx, || inner.restore_rescaled(parts, scope)).map_err(|e| naming_operator(&self.ctx, e))
    }
    fn batch1(&mut self, records: &mut Vec<A>) -> Result<()> {
        check_stream!(self, 0, records);
        self.count_for_faults(records.len())?;
        self.metrics.received(records.len() as u64);
        let inner = &mut self.inner;
        guard(&self.ctx, || inner.batch1(records))
    }
    fn batch2(&mut self, records: &mut Vec<B>) -> Result<()> {
        check_stream!(self, 1, records);
        self.count_for_faults(records.len())?;
        self.metrics.received(records.len() as u64);
        let inner = &mut self.inner;
        guard(&self.ctx, || inner.batch2(records))
    }
    fn watermark1(&mut self, watermark: Timestamp) -> Result<()> {
        check_stream!(self, 0, watermark, watermark);
        let inner = &mut self.inner;
        guard(&self.ctx, || inner.watermark1(watermark))
    }
    fn watermark2(&mut self, watermark: Timestamp) -> Result<()> {
        check_stream!(self, 1, watermark, watermark);
        let inner = &mut self.inner;
        guard(&self.ctx, || inner.watermark2(watermark))
    }
    fn end1(&mut self) -> Result<()> {
        check_stream!(self, 0, end);
        let inner = &mut self.inner;
        guard(&self.ctx, || inner.end1())
    }
    fn end2(&mut self) -> Result<()> {
        check_stream!(self, 1, end);
        let inner = &mut self.inner;
        guard(&self.ctx, || inner.end2())
    }
    fn drain(&mut self) -> Result<bool> {
        let inner = &mut self.inner;
        guard(&self.ctx, || inner.drain())
    }
}

/// Names the operator in a configuration error raised by its restore.
fn naming_operator(ctx: &TaskContext, e: Error) -> Error {
    match e {
        Error::InvalidConfig(m) => Error::config(format!("operator '{}': {m}", ctx.operator)),
        other => other,
    }
}

/// Names the subtask in an injected failure.
fn with_subtask(e: Error, subtask: usize) -> Error {
    match e {
        Error::OperatorPanicked { operator, message, .. } => Error::OperatorPanicked { operator, subtask, message },
        other => other,
    }
}

fn task_name(ctx: &TaskContext) -> String {
    format!("{} ({}/{})", ctx.operator, ctx.subtask + 1, ctx.parallelism)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    /// A checkpointed source at the end of its input: it takes part in checkpoints (its
    /// offset is the end) and ends its stream once the final checkpoint completed, so that a
    /// source that ends first does not stop the job's checkpoints (Flink's FLIP-147), and all
    /// output before the end is committed by a checkpoint.
    AtEnd,
    /// End of stream was sent; waiting for it to drain.
    Ending,
    Done,
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
    /// The offsets recorded by checkpoints not yet completed or aborted, oldest first.
    offsets: Vec<(u64, Vec<u8>)>,
    /// Whether this subtask counts among the attempt's sources in backlog.
    in_backlog: bool,
    /// The source's own watermark last emitted ([`Source::watermark`]).
    watermark: Timestamp,
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
            offsets: Vec::new(),
            in_backlog: false,
            watermark: Timestamp::MIN,
        }
    }

    /// Takes this source's part of checkpoint `barrier`: its offset, then the chain's state,
    /// then the barrier goes downstream behind everything emitted so far.
    fn checkpoint(&mut self, barrier: Barrier) -> Result<()> {
        let cp = self.checkpointing.as_ref().expect("triggers reach checkpointed sources only");
        cp.check_sync_fault(&barrier, &self.name)?;
        let start = self.ctx.now_ns();
        let mut snapshot = TaskSnapshot::new(barrier);
        if let Some(offset) = self.source.offset() {
            self.offsets.push((barrier.id, offset.clone()));
            snapshot.add(Arc::clone(&self.ctx.operator), self.ctx.subtask, Box::new(RawBytes(offset)));
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

impl<T> SourceTask<T> {
    /// Carries out the coordinator's messages: triggers (a checkpoint here), the end of input,
    /// kept parts and notices.
    #[inline]
    fn take_control(&mut self) -> Result<()> {
        while let Some(msg) = self.checkpointing.as_ref().and_then(|c| c.next_control()) {
            match msg {
                TaskControl::Trigger(b) if matches!(self.phase, Phase::Running | Phase::AtEnd) => self.checkpoint(b)?,
                TaskControl::Trigger(_) => {}
                TaskControl::EndOfInput if self.phase == Phase::AtEnd => {
                    self.out.end()?;
                    self.phase = Phase::Ending;
                }
                TaskControl::EndOfInput => {}
                TaskControl::PartKept(id) => self.checkpointing.as_ref().expect("message came from it").keep_part(id),
                TaskControl::Notice(n) => {
                    self.source_learns(n);
                    let out = &mut self.out;
                    let cp = self.checkpointing.as_mut().expect("message came from it");
                    apply_notice(cp, n, &mut |n| out.notify(n))?;
                }
            }
        }
        Ok(())
    }

    /// Counts this source among those in a backlog, or no longer.
    #[inline]
    fn note_backlog(&mut self, backlog: bool) {
        if backlog != self.in_backlog {
            self.in_backlog = backlog;
            let count = &self.ctx.attempt.end.sources_in_backlog;
            if backlog {
                count.fetch_add(1, Ordering::SeqCst);
            } else {
                count.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    /// Tells the source which of its offsets a completed checkpoint covers.
    fn source_learns(&mut self, notice: CheckpointNotice) {
        match notice {
            CheckpointNotice::Complete(id) => {
                let covered = self.offsets.partition_point(|(c, _)| *c <= id);
                if let Some((_, offset)) = self.offsets.drain(..covered).next_back() {
                    self.source.checkpoint_complete(id, &offset);
                }
            }
            CheckpointNotice::Aborted(id) => self.offsets.retain(|(c, _)| *c != id),
        }
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
        if self.ctx.faults.as_ref().is_some_and(|f| f.fail_after_restore()) {
            return Err(Error::OperatorPanicked {
                operator: self.ctx.operator.to_string(),
                subtask: self.ctx.subtask,
                message: "injected failure right after the restore".into(),
            });
        }
        self.take_control()?;
        if !self.out.drain()? {
            return Ok(TaskPoll::Idle);
        }
        if self.phase == Phase::Ending {
            self.phase = Phase::Done;
            return Ok(TaskPoll::Finished);
        }
        if self.phase == Phase::AtEnd {
            return Ok(TaskPoll::Idle);
        }
        let status = if self.control.stop.load(Ordering::Relaxed) {
            let (source, ctx, buf) = (&mut self.source, &self.ctx, &mut self.buf);
            guard(&self.ctx, || source.on_stop(ctx, buf))?;
            SourcePoll::Finished
        } else {
            let (source, ctx, buf, max) = (&mut self.source, &self.ctx, &mut self.buf, self.batch_size);
            guard(&self.ctx, || source.poll(ctx, buf, max))?
        };
        if !self.buf.is_empty() {
            self.emitted.add(self.source.records_in(&self.buf));
            self.out.batch(&mut self.buf)?;
        }
        if status != SourcePoll::Finished {
            // A source's own watermark (per-partition sources), after the records below it.
            if let Some(w) = self.source.watermark().filter(|&w| w > self.watermark) {
                self.watermark = w;
                self.out.watermark(w)?;
            }
        }
        let backlog = status != SourcePoll::Finished && self.source.backlog();
        self.note_backlog(backlog);
        match status {
            SourcePoll::Emitted => Ok(TaskPoll::Progress),
            SourcePoll::Idle => Ok(TaskPoll::Idle),
            SourcePoll::Finished if self.checkpointing.is_some() => {
                // The end of event time goes first, so windows fire (and their output is
                // written) before the final checkpoint, which then commits it.
                self.out.watermark(Timestamp::MAX)?;
                self.phase = Phase::AtEnd;
                self.ctx.attempt.end.sources_at_end.fetch_add(1, Ordering::SeqCst);
                Ok(TaskPoll::Progress)
            }
            SourcePoll::Finished => {
                self.out.end()?;
                self.phase = Phase::Ending;
                Ok(TaskPoll::Progress)
            }
        }
    }
}

fn ident(ctx: &TaskContext) -> TaskIdent {
    TaskIdent { name: task_name(ctx), operator: Arc::clone(&ctx.operator), subtask: ctx.subtask }
}

/// How a task's gates take part in checkpoints.
#[derive(Clone)]
struct GateSetup {
    /// Block a channel that delivered the barrier being aligned.
    blocks: bool,
    /// Check the priority slots (barriers may be unaligned).
    priority: bool,
    /// With unaligned checkpoints on at the start: the clock record slices are timed on.
    slicing: Option<Clock>,
}

/// Sets up a task's checkpointing for `channels` input channels.
fn prepare(checkpointing: &mut Option<TaskCheckpointing>, channels: usize) -> GateSetup {
    match checkpointing.as_mut() {
        Some(cp) => {
            cp.aligner = BarrierAligner::new(channels);
            GateSetup { blocks: cp.blocks(), priority: cp.unaligned, slicing: cp.sliced.then(|| cp.clock.clone()) }
        }
        None => GateSetup { blocks: false, priority: false, slicing: None },
    }
}

/// A subtask with one input (possibly fed by several edges, as after a union).
pub(crate) struct OneInputTask<T> {
    id: TaskIdent,
    gate: InputGate<T>,
    head: Box<dyn Collector<T>>,
    budget: usize,
    checkpointing: Option<TaskCheckpointing>,
    phase: Phase,
}

impl<T: Persist> OneInputTask<T> {
    pub(crate) fn new(
        ctx: &TaskContext,
        mut gate: InputGate<T>,
        head: Box<dyn Collector<T>>,
        budget: usize,
        mut checkpointing: Option<TaskCheckpointing>,
    ) -> Self {
        gate.mode(prepare(&mut checkpointing, gate.channels()));
        OneInputTask { id: ident(ctx), gate, head, budget, checkpointing, phase: Phase::Running }
    }
}

impl<T: Send + Persist> Task for OneInputTask<T> {
    fn name(&self) -> &str {
        &self.id.name
    }

    fn poll(&mut self) -> Result<TaskPoll> {
        if self.phase == Phase::Done {
            return Ok(TaskPoll::Finished);
        }
        let OneInputTask { id, gate, head, checkpointing, .. } = self;
        if let Some(cp) = checkpointing.as_mut() {
            barriers::before_poll(cp, gate, id, head)?;
        }
        if !self.head.drain()? {
            // Backpressured: the input rings fill while the gate is not read; say so.
            self.gate.count_turn();
            return Ok(TaskPoll::Idle);
        }
        if self.phase == Phase::Ending {
            self.phase = Phase::Done;
            return Ok(TaskPoll::Finished);
        }
        let polled = self.gate.poll(&mut *self.head, self.budget)?;
        let OneInputTask { id, gate, head, checkpointing, .. } = self;
        Ok(match polled {
            GatePoll::Progress => {
                if let Some(cp) = checkpointing.as_mut() {
                    barriers::on_poll(cp, gate, id, head)?;
                }
                TaskPoll::Progress
            }
            GatePoll::Idle => TaskPoll::Idle,
            GatePoll::Barrier { channel, barrier } => {
                let cp = checkpointing.as_mut().expect("barriers flow only in checkpointed jobs");
                barriers::on_inband(cp, gate, id, channel, barrier, head)?;
                TaskPoll::Progress
            }
            GatePoll::PriorityBarrier { channel, barrier, seq } => {
                let cp = checkpointing.as_mut().expect("barriers flow only in checkpointed jobs");
                barriers::on_priority(cp, gate, id, channel, barrier, seq, head)?;
                TaskPoll::Progress
            }
            GatePoll::Finished => {
                self.phase = Phase::Ending;
                TaskPoll::Progress
            }
        })
    }
}

/// A subtask of a two-input operator. Its channels are numbered left input first.
pub(crate) struct TwoInputTask<A, B> {
    id: TaskIdent,
    gates: GatePair<A, B>,
    op: Box<dyn TwoInputOperator<A, B>>,
    budget: usize,
    checkpointing: Option<TaskCheckpointing>,
    done: [bool; 2],
    phase: Phase,
}

impl<A: Persist, B: Persist> TwoInputTask<A, B> {
    pub(crate) fn new(
        ctx: &TaskContext,
        mut left: InputGate<A>,
        mut right: InputGate<B>,
        op: Box<dyn TwoInputOperator<A, B>>,
        budget: usize,
        mut checkpointing: Option<TaskCheckpointing>,
    ) -> Self {
        let setup = prepare(&mut checkpointing, left.channels() + right.channels());
        for g in [&mut left as &mut dyn GateMode, &mut right] {
            g.mode(setup.clone());
        }
        TwoInputTask {
            id: ident(ctx),
            gates: GatePair { left, right },
            op,
            budget,
            checkpointing,
            done: [false; 2],
            phase: Phase::Running,
        }
    }
}

/// Sets a gate's checkpoint mode whatever its record type.
trait GateMode {
    fn mode(&mut self, setup: GateSetup);
}

impl<T: Persist> GateMode for InputGate<T> {
    fn mode(&mut self, setup: GateSetup) {
        self.set_blocking(setup.blocks);
        self.set_unaligned(setup.priority);
        self.set_slicing(setup.slicing);
    }
}

impl<A: Send + Persist, B: Send + Persist> Task for TwoInputTask<A, B> {
    fn name(&self) -> &str {
        &self.id.name
    }

    fn poll(&mut self) -> Result<TaskPoll> {
        if self.phase == Phase::Done {
            return Ok(TaskPoll::Finished);
        }
        {
            let TwoInputTask { id, gates, op, checkpointing, .. } = self;
            if let Some(cp) = checkpointing.as_mut() {
                barriers::before_poll(cp, gates, id, op)?;
            }
        }
        if !self.op.drain()? {
            self.gates.left.count_turn();
            self.gates.right.count_turn();
            return Ok(TaskPoll::Idle);
        }
        if self.phase == Phase::Ending {
            self.phase = Phase::Done;
            return Ok(TaskPoll::Finished);
        }
        let mut progress = false;
        let n_left = self.gates.left.channels();
        for side in 0..2 {
            if self.done[side] || (side == 1 && !self.op.drain()?) {
                continue;
            }
            let polled = if side == 0 {
                self.gates.left.poll(&mut Left(&mut *self.op), self.budget)?
            } else {
                self.gates.right.poll(&mut Right(&mut *self.op), self.budget)?
            };
            let offset = if side == 0 { 0 } else { n_left };
            let TwoInputTask { id, gates, op, checkpointing, .. } = self;
            match polled {
                GatePoll::Progress => progress = true,
                GatePoll::Idle => {}
                GatePoll::Barrier { channel, barrier } => {
                    let cp = checkpointing.as_mut().expect("barriers flow only in checkpointed jobs");
                    barriers::on_inband(cp, gates, id, offset + channel, barrier, op)?;
                    progress = true;
                }
                GatePoll::PriorityBarrier { channel, barrier, seq } => {
                    let cp = checkpointing.as_mut().expect("barriers flow only in checkpointed jobs");
                    barriers::on_priority(cp, gates, id, offset + channel, barrier, seq, op)?;
                    progress = true;
                }
                GatePoll::Finished => {
                    self.done[side] = true;
                    progress = true;
                }
            }
        }
        if progress {
            let TwoInputTask { id, gates, op, checkpointing, .. } = self;
            if let Some(cp) = checkpointing.as_mut() {
                barriers::on_poll(cp, gates, id, op)?;
            }
        }
        if self.done == [true, true] {
            self.phase = Phase::Ending;
        }
        Ok(if progress { TaskPoll::Progress } else { TaskPoll::Idle })
    }
}
