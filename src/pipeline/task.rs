//! Tasks: what a worker polls. A task is one subtask of a chain: a source or one or two input
//! gates at the head, then chained operators as nested collectors, ending in sinks or ring
//! writers. [`Guarded`] wraps each operator so a panic in user code becomes an
//! [`Error::OperatorPanicked`] naming the operator and subtask.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::channel::{GatePoll, InputGate};
use crate::collector::Collector;
use crate::context::TaskContext;
use crate::error::{Error, Result};
use crate::metrics::Counter;
use crate::operator::{Left, Right, TwoInputOperator};
use crate::record::Timestamp;
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
}

impl<T, C: Collector<T>> Collector<T> for Guarded<C> {
    #[inline]
    fn batch(&mut self, records: &mut Vec<T>) -> Result<()> {
        let inner = &mut self.inner;
        guard(&self.ctx, || inner.batch(records))
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
    fn batch1(&mut self, records: &mut Vec<A>) -> Result<()> {
        let inner = &mut self.inner;
        guard(&self.ctx, || inner.batch1(records))
    }
    fn batch2(&mut self, records: &mut Vec<B>) -> Result<()> {
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
    phase: Phase,
}

impl<T> SourceTask<T> {
    pub(crate) fn new(
        ctx: TaskContext,
        source: Box<dyn Source<T>>,
        out: Box<dyn Collector<T>>,
        batch_size: usize,
        control: Arc<JobControl>,
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
            phase: Phase::Running,
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

/// A subtask with one input (possibly fed by several edges, as after a union).
pub(crate) struct OneInputTask<T> {
    name: String,
    gate: InputGate<T>,
    head: Box<dyn Collector<T>>,
    budget: usize,
    phase: Phase,
}

impl<T> OneInputTask<T> {
    pub(crate) fn new(
        ctx: &TaskContext,
        gate: InputGate<T>,
        head: Box<dyn Collector<T>>,
        budget: usize,
    ) -> Self {
        OneInputTask {
            name: task_name(ctx),
            gate,
            head,
            budget,
            phase: Phase::Running,
        }
    }
}

impl<T: Copy + Send> Task for OneInputTask<T> {
    fn name(&self) -> &str {
        &self.name
    }

    fn poll(&mut self) -> Result<TaskPoll> {
        if self.phase == Phase::Done {
            return Ok(TaskPoll::Finished);
        }
        if !self.head.drain()? {
            return Ok(TaskPoll::Idle);
        }
        if self.phase == Phase::Ending {
            self.phase = Phase::Done;
            return Ok(TaskPoll::Finished);
        }
        Ok(match self.gate.poll(&mut *self.head, self.budget)? {
            GatePoll::Progress => TaskPoll::Progress,
            GatePoll::Idle => TaskPoll::Idle,
            GatePoll::Finished => {
                self.phase = Phase::Ending;
                TaskPoll::Progress
            }
        })
    }
}

/// A subtask of a two-input operator.
pub(crate) struct TwoInputTask<A, B> {
    name: String,
    left: InputGate<A>,
    right: InputGate<B>,
    op: Box<dyn TwoInputOperator<A, B>>,
    budget: usize,
    done: [bool; 2],
    phase: Phase,
}

impl<A, B> TwoInputTask<A, B> {
    pub(crate) fn new(
        ctx: &TaskContext,
        left: InputGate<A>,
        right: InputGate<B>,
        op: Box<dyn TwoInputOperator<A, B>>,
        budget: usize,
    ) -> Self {
        TwoInputTask {
            name: task_name(ctx),
            left,
            right,
            op,
            budget,
            done: [false; 2],
            phase: Phase::Running,
        }
    }
}

impl<A: Copy + Send, B: Copy + Send> Task for TwoInputTask<A, B> {
    fn name(&self) -> &str {
        &self.name
    }

    fn poll(&mut self) -> Result<TaskPoll> {
        if self.phase == Phase::Done {
            return Ok(TaskPoll::Finished);
        }
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
                GatePoll::Finished => {
                    self.done[1] = true;
                    progress = true;
                }
            }
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
