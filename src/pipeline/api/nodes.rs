//! How a builder call becomes a node of the job graph: the type-erased constructors made here,
//! where the record types are known (an operator wrapped so its panics and restores name it,
//! the task that heads a chain, its in-flight data replayed), and the edges into the node.
//!
//! May touch: `barrier`, `channel`, `collector`, `context`, `error`, `operator`, `record`, `sink`,
//! `snapshot` (a lazy restore).

use std::sync::Arc;

use crate::barrier::inflight::{decode_inflight, inflight_part, rescale_inflight, InflightRoute};
use crate::channel::{InputGate, Partitioning};
use crate::collector::Collector;
use crate::context::{RestoreView, TaskContext};
use crate::error::Result;
use crate::operator::side::Outputs;
use crate::operator::stateless::PassThrough;
use crate::operator::TwoInputOperator;
use crate::pipeline::graph::{
    channels_of, downcast_collector, downcast_readers, downcast_two, fan_out_of, AnyBox, EdgeInput, MakeChannels,
    NodeKind,
};
use crate::pipeline::task::{CountIn, Guarded, OneInputTask, PerElement, Task, TwoInputTask};
use crate::record::Record;
use crate::sink::{Sink, SinkOperator};

use super::*;

/// Wraps one subtask's operator so its panics name it, and erases its type for the plan.
/// Restores the operator's state when the job restarts from a checkpoint.
pub(super) fn guarded<T: 'static>(ctx: &TaskContext, op: Box<dyn Collector<T>>) -> Result<AnyBox> {
    guarded_counting::<T, PerElement>(ctx, op)
}

/// [`guarded`], its records in counted by `N`.
pub(super) fn guarded_counting<T: 'static, N: CountIn<T> + 'static>(
    ctx: &TaskContext,
    op: Box<dyn Collector<T>>,
) -> Result<AnyBox> {
    let mut op = Guarded::<_, N>::new(ctx.clone(), op);
    match ctx.restored_fork() {
        // Local recovery: the fork the process kept, handed back without being encoded.
        Some(fork) => {
            let fork = fork.lock().unwrap_or_else(|e| e.into_inner());
            naming_incompatible(ctx, op.restore_local(&**fork))?
        }
        None => restore_operator(ctx, |view| match view {
            RestoreView::Own(bytes) => op.restore_state(bytes),
            RestoreView::Rescaled { parts, scope } => op.restore_rescaled(&parts, &scope),
            RestoreView::Nothing => Ok(()),
        })?,
    }
    Ok(Box::new(Box::new(op) as Box<dyn Collector<T>>))
}

/// Restores an operator from what this subtask restores (see [`TaskContext::restore_view`]).
/// State that does not decode as the operator's types now is refused with an error naming the
/// job, the operator and what did not decode (the files' checksums passed, so the types
/// changed).
pub(super) fn restore_operator(ctx: &TaskContext, restore: impl FnOnce(RestoreView<'_>) -> Result<()>) -> Result<()> {
    // A lazy restore of the subtask's own part: its pages of keyed state stay where the
    // checkpoint stored them until a lookup reaches them.
    if let Some((inline, pages)) = ctx.lazy_restore() {
        return naming_incompatible(
            ctx,
            crate::snapshot::restore_lazily(inline, pages, |b| restore(RestoreView::Own(b))),
        );
    }
    let view = ctx.restore_view();
    if matches!(view, RestoreView::Nothing) {
        return Ok(());
    }
    naming_incompatible(ctx, restore(view))
}

/// A restore's `result`, state that did not decode named as [`restore_operator`] says.
fn naming_incompatible(ctx: &TaskContext, result: Result<()>) -> Result<()> {
    result.map_err(|e| match e {
        crate::Error::Corrupt(detail) => crate::Error::IncompatibleState {
            job: ctx.job.to_string(),
            operator: ctx.operator.to_string(),
            checkpoint: ctx.recovery().restored,
            detail,
        },
        other => other,
    })
}

/// A chained one-input operator over a stream of `T` that may not be a [`Record`].
pub(super) fn chained_op<T, U, M>(s: &Stream<T>, base: &str, make: M) -> Stream<U>
where
    T: Clone + Send + 'static,
    U: Clone + Send + 'static,
    M: Fn(&TaskContext, Box<dyn Collector<U>>) -> Result<Box<dyn Collector<T>>> + Send + 'static,
{
    chained_op_counting::<T, U, M, PerElement>(s, base, make)
}

/// [`chained_op`], its records in counted by `N`.
pub(super) fn chained_op_counting<T, U, M, N>(s: &Stream<T>, base: &str, make: M) -> Stream<U>
where
    T: Clone + Send + 'static,
    U: Clone + Send + 'static,
    M: Fn(&TaskContext, Box<dyn Collector<U>>) -> Result<Box<dyn Collector<T>>> + Send + 'static,
    N: CountIn<T> + 'static,
{
    let job = s.job();
    let p = s.parallelism();
    let kind = NodeKind::OneInput {
        make: Box::new(move |ctx, down| guarded_counting::<T, N>(ctx, make(ctx, downcast_collector::<U>(down))?)),
        // Never a task head: its input edge has no rings, and the plan refuses to break it.
        make_task: Box::new(|_, _, _, _, _| -> Result<Box<dyn Task>> {
            unreachable!("an edge carrying non-plain records is always chained")
        }),
    };
    let input = Input { from: s.node, input: 0, port: 0, partitioning: Partitioning::Forward, make_channels: None };
    let id = job.add_node(base, p, false, kind, fan_out_of::<U>(), vec![input]);
    job.stream(id)
}

/// Joins a main output of `O` with side outputs into the [`Outputs`] an operator takes.
pub(super) fn outputs_of<O: 'static>() -> crate::pipeline::graph::MakeOutputs {
    Box::new(|main, sides| Box::new(Outputs { main: downcast_collector::<O>(main), sides }) as AnyBox)
}

pub(super) fn make_one_input_task<T: Record>() -> crate::pipeline::graph::MakeTask {
    Box::new(|ctx, readers, head, budget, checkpointing| {
        let (channels, route) = EdgeInput::join(readers.into_iter().map(|(_, r)| downcast_readers::<T>(r)));
        let mut gate = InputGate::new(channels);
        gate.report_fill(ctx, 0);
        replay_inflight(ctx, 0, &mut gate, &route)?;
        Ok(Box::new(OneInputTask::new(ctx, gate, downcast_collector::<T>(head), budget, checkpointing))
            as Box<dyn Task>)
    })
}

/// Restarting from an unaligned checkpoint: queue the in-flight data of input `input` for
/// replay before the rings are read. From a checkpoint of another graph (a rescale), every old
/// subtask's in-flight data of the input is re-routed by the edge's `route`.
pub(super) fn replay_inflight<T: Record>(
    ctx: &TaskContext,
    input: usize,
    gate: &mut InputGate<T>,
    route: &InflightRoute<T>,
) -> Result<()> {
    let Some(restored) = &ctx.restored else {
        return Ok(());
    };
    let part = inflight_part(&ctx.operator, input);
    if !restored.graph_changed() {
        if let Some(bytes) = restored.get(&part, ctx.subtask) {
            gate.replay(decode_inflight::<T>(bytes)?);
        }
        return Ok(());
    }
    let old = restored
        .parts_of(&part)
        .into_iter()
        .map(|(subtask, bytes)| Ok((subtask, decode_inflight::<T>(bytes)?)))
        .collect::<Result<Vec<_>>>()?;
    if old.is_empty() {
        return Ok(());
    }
    // Broadcast state is restored from the subtask's own part, or on a rescale from old
    // subtask 0's: the broadcast in-flight data replayed is that subtask's.
    let broadcast_from = match ctx.restore_view() {
        RestoreView::Own(_) => ctx.subtask,
        _ => 0,
    };
    gate.replay(rescale_inflight(route, old, ctx.subtask, ctx.parallelism, gate.channels(), broadcast_from));
    Ok(())
}

impl<T> Stream<T> {
    pub(super) fn job(&self) -> Job {
        Job { graph: Arc::clone(&self.graph) }
    }

    pub(super) fn parallelism(&self) -> usize {
        self.graph.borrow().nodes[self.node].parallelism
    }
}

impl<T: Record> Stream<T> {
    /// Adds a one-input operator fed by this stream through `partitioning`.
    pub(super) fn one_input<U, M>(
        &self,
        base: &str,
        partitioning: Partitioning,
        make_channels: MakeChannels,
        keyed: bool,
        make: M,
    ) -> Stream<U>
    where
        U: Record,
        M: Fn(&TaskContext, Box<dyn Collector<U>>) -> Result<Box<dyn Collector<T>>> + Send + 'static,
    {
        let job = self.job();
        let kind = NodeKind::OneInput {
            make: Box::new(move |ctx, down| guarded(ctx, make(ctx, downcast_collector::<U>(down))?)),
            make_task: make_one_input_task::<T>(),
        };
        let input = Input { from: self.node, input: 0, port: 0, partitioning, make_channels: Some(make_channels) };
        let id = job.add_node(base, self.parallelism(), keyed, kind, fan_out_of::<U>(), vec![input]);
        job.stream(id)
    }

    /// [`Stream::one_input`] for an operator with side outputs: it takes an [`Outputs`].
    pub(super) fn with_side_outputs<U, M>(
        &self,
        base: &str,
        partitioning: Partitioning,
        make_channels: MakeChannels,
        keyed: bool,
        make: M,
    ) -> Stream<U>
    where
        U: Record,
        M: Fn(&TaskContext, Outputs<U>) -> Result<Box<dyn Collector<T>>> + Send + 'static,
    {
        let job = self.job();
        let kind = NodeKind::OneInput {
            make: Box::new(move |ctx, down| {
                let outputs = *down.downcast::<Outputs<U>>().expect("builder type mismatch: outputs");
                guarded(ctx, make(ctx, outputs)?)
            }),
            make_task: make_one_input_task::<T>(),
        };
        let input = Input { from: self.node, input: 0, port: 0, partitioning, make_channels: Some(make_channels) };
        let id = job.add_node(base, self.parallelism(), keyed, kind, fan_out_of::<U>(), vec![input]);
        job.graph.borrow_mut().nodes[id].with_sides = Some(outputs_of::<U>());
        job.stream(id)
    }

    pub(super) fn forward<U: Record, M>(&self, base: &str, make: M) -> Stream<U>
    where
        M: Fn(&TaskContext, Box<dyn Collector<U>>) -> Result<Box<dyn Collector<T>>> + Send + 'static,
    {
        self.one_input(base, Partitioning::Forward, channels_of::<T, fn(&T) -> u64>(None), false, make)
    }

    pub(super) fn sink_node<S: Sink<T> + 'static, MS: Fn(&TaskContext) -> Result<S> + Send + 'static>(
        &self,
        base: &str,
        make: MS,
    ) -> usize {
        self.forward::<(), _>(base, move |ctx, _nowhere| {
            Ok(Box::new(SinkOperator::new(make(ctx)?, ctx.metrics.sink_counter())))
        })
        .node
    }

    /// Records that sink `node` writes into `dir` (kept in every checkpoint: a resume against
    /// another folder is refused).
    pub(super) fn writes_to(&self, node: usize, dir: &std::path::Path) {
        let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
        self.job().graph.borrow_mut().sink_outputs.push((node, dir));
    }

    pub(super) fn redistribute(self, base: &str, partitioning: Partitioning) -> Stream<T> {
        self.one_input(base, partitioning, channels_of::<T, fn(&T) -> u64>(None), false, |_, next| {
            Ok(Box::new(PassThrough::new(next)))
        })
    }

    /// A keyed two-input operator fed by this stream (input 1) and `other` (input 2).
    pub(super) fn two_input<R, O, M>(
        &self,
        base: &str,
        other: &Stream<R>,
        inputs: [(Partitioning, MakeChannels); 2],
        make: M,
    ) -> Stream<O>
    where
        R: Record,
        O: Record,
        M: Fn(&TaskContext, Outputs<O>) -> Result<Box<dyn TwoInputOperator<T, R>>> + Send + 'static,
    {
        assert!(Arc::ptr_eq(&self.graph, &other.graph), "two streams of different jobs cannot be combined");
        let job = self.job();
        let kind = NodeKind::TwoInput {
            make: Box::new(move |ctx, down| {
                let outputs = *down.downcast::<Outputs<O>>().expect("builder type mismatch: outputs");
                let mut op = Guarded::new(ctx.clone(), make(ctx, outputs)?);
                restore_operator(ctx, |view| match view {
                    RestoreView::Own(bytes) => op.restore_state(bytes),
                    RestoreView::Rescaled { parts, scope } => op.restore_rescaled(&parts, &scope),
                    RestoreView::Nothing => Ok(()),
                })?;
                Ok(Box::new(Box::new(op) as Box<dyn TwoInputOperator<T, R>>) as AnyBox)
            }),
            make_task: Box::new(|ctx, readers, head, budget, checkpointing| {
                let (mut left, mut right) = (Vec::new(), Vec::new());
                for (input, r) in readers {
                    if input == 0 {
                        left.push(downcast_readers::<T>(r));
                    } else {
                        right.push(downcast_readers::<R>(r));
                    }
                }
                let ((left, left_route), (right, right_route)) = (EdgeInput::join(left), EdgeInput::join(right));
                let (mut left, mut right) = (InputGate::new(left), InputGate::new(right));
                left.report_fill(ctx, 0);
                right.report_fill(ctx, 1);
                replay_inflight(ctx, 0, &mut left, &left_route)?;
                replay_inflight(ctx, 1, &mut right, &right_route)?;
                Ok(Box::new(TwoInputTask::new(ctx, left, right, downcast_two::<T, R>(head), budget, checkpointing))
                    as Box<dyn Task>)
            }),
        };
        let [(p1, c1), (p2, c2)] = inputs;
        let inputs = vec![
            Input { from: self.node, input: 0, port: 0, partitioning: p1, make_channels: Some(c1) },
            Input { from: other.node, input: 1, port: 0, partitioning: p2, make_channels: Some(c2) },
        ];
        let id = job.add_node(base, self.parallelism(), true, kind, fan_out_of::<O>(), inputs);
        job.graph.borrow_mut().nodes[id].with_sides = Some(outputs_of::<O>());
        job.stream(id)
    }
}
