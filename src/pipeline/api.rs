//! The builder API: [`Job`], [`Stream`], [`KeyedStream`], [`LineStream`].
//!
//! Every call records a node in the job graph together with type-erased constructors made here,
//! where the record types are known; nothing runs until the job is started.

use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::graph::{
    channels_of, downcast_collector, downcast_readers, downcast_two, fan_out_of, AnyBox, DefaultDrift, Edge, EdgeInput,
    Graph, MakeChannels, Node, NodeKind, SharedGraph,
};
use super::task::{Guarded, OneInputTask, SourceTask, Task, TwoInputTask};
use crate::barrier::inflight::{decode_inflight, inflight_part, rescale_inflight, InflightRoute};
use crate::channel::{InputGate, Partitioning};
use crate::collector::Collector;
use crate::context::{RestoreView, TaskContext};
use crate::error::Result;
use crate::operator::co_process::{
    BroadcastProcessOperator, CoProcessOperator, KeyedBroadcastProcessFunction, KeyedCoProcessFunction,
};
use crate::operator::join::WindowJoin;
use crate::operator::keyed::{KeyedAggregate, KeyedProcess};
use crate::operator::latency::LatencyProbe;
use crate::operator::process::{KeyedProcessFunction, KeyedProcessOperator};
use crate::operator::session::{SessionSettings, SessionWindows};
use crate::operator::side::{OutputTag, Outputs};
use crate::operator::stateless::{Filter, FlatMap, Map, PassThrough};
use crate::operator::watermark::{WatermarkAlignment, WatermarkAssigner, WatermarkRegistry};
use crate::operator::window::{EarlyFiring, Window, WindowAggregate, WindowBounds, WindowSettings};
use crate::operator::{Emitter, TwoInputOperator};
use crate::persist::Persist;
use crate::record::{hash_key, Key, Record, Timestamp};
use crate::sink::{
    pull_channel, CollectSink, CommittedOutput, DiscardSink, EventReceiver, FileSink, Guarantee, LatestPerKeySink,
    PartitionedFileSink, Sink, SinkOperator, TransactionalCollectSink, TwoPhaseFileSink,
};
use crate::source::{EventSender, Generator, Source, TextBlocks, TextSource};

/// The default capacity of push-source and pull-sink rings, in entries.
pub const DEFAULT_EXTERNAL_RING: usize = 64 * 1024;

/// A dataflow job under construction.
///
/// ```
/// use weir::{Job, RunConfig, source::Generator};
/// let job = Job::new("squares").with_parallelism(2);
/// let out = job
///     .generator(Generator::new(|i, _| i).count(100))
///     .map(|x| x * x)
///     .filter(|x| x % 2 == 0)
///     .collect();
/// job.execute(RunConfig::default().workers(2)).unwrap();
/// assert_eq!(out.lock().unwrap().len(), 50);
/// ```
#[derive(Clone)]
pub struct Job {
    pub(crate) graph: Arc<SharedGraph>,
}

/// A stream of records of type `T`.
pub struct Stream<T> {
    graph: Arc<SharedGraph>,
    node: usize,
    _t: PhantomData<fn() -> T>,
}

/// A stream read by more than one operator: each gets every record (all but one a clone).
///
/// ```
/// use weir::{Job, RunConfig, source::Generator};
/// let job = Job::new("twice");
/// let numbers = job.generator(Generator::new(|i, _| i).count(10));
/// let evens = numbers.clone().filter(|x| x % 2 == 0).collect();
/// let all = numbers.collect();
/// job.execute(RunConfig::default()).unwrap();
/// assert_eq!((evens.lock().unwrap().len(), all.lock().unwrap().len()), (5, 10));
/// ```
impl<T> Clone for Stream<T> {
    fn clone(&self) -> Self {
        Stream { graph: self.graph.clone(), node: self.node, _t: PhantomData }
    }
}

/// A stream partitioned by key: the input of keyed operators.
pub struct KeyedStream<T, KF> {
    stream: Stream<T>,
    key: KF,
}

/// A keyed stream with event-time (or processing-time) windows.
pub struct WindowedStream<T, KF, TF> {
    keyed: KeyedStream<T, KF>,
    window: Window,
    timestamp: TF,
    settings: WindowSettings<T>,
}

/// Two keyed streams with the same key type, connected for a [`KeyedCoProcessFunction`]
/// ([`KeyedStream::connect`]).
pub struct ConnectedStreams<A, B, KA, KB> {
    first: KeyedStream<A, KA>,
    second: KeyedStream<B, KB>,
}

/// A keyed stream connected with a broadcast stream, for a
/// [`KeyedBroadcastProcessFunction`] ([`KeyedStream::connect_broadcast`]).
pub struct BroadcastConnectedStream<T, B, KF> {
    keyed: KeyedStream<T, KF>,
    broadcast: Stream<B>,
}

/// A keyed stream with event-time session windows ([`KeyedStream::session_window`]).
pub struct SessionWindowedStream<T, KF, TF> {
    keyed: KeyedStream<T, KF>,
    timestamp: TF,
    settings: SessionSettings<T>,
}

/// Lines of text from a [`TextSource`]; turn them into records with [`LineStream::flat_map`].
/// Lines are not records (a `String` line is not checkpointed), so they never cross a ring:
/// the flat_map runs chained to the source.
pub struct LineStream {
    job: Job,
    source: TextSource,
}

/// The input edge of a node being added.
struct Input {
    from: usize,
    input: usize,
    /// Which output of `from` (0: the main one).
    port: usize,
    partitioning: Partitioning,
    make_channels: Option<MakeChannels>,
}

impl Job {
    /// An empty job; operators get parallelism 1 unless told otherwise.
    pub fn new(name: impl Into<String>) -> Job {
        Job {
            graph: Arc::new(SharedGraph::new(Graph {
                name: name.into(),
                nodes: Vec::new(),
                edges: Vec::new(),
                default_parallelism: 1,
                max_parallelism: 128,
                checkpointing: None,
                restore: None,
                description: String::new(),
                host_signals: Vec::new(),
                watermark_groups: Vec::new(),
                default_alignment: WatermarkAlignment::unbounded(),
                default_drift: DefaultDrift::FromWindows,
                longest_window: 0,
                tags: Vec::new(),
                build_errors: Vec::new(),
                sink_outputs: Vec::new(),
                watermark_registry: Arc::default(),
                on_restore: None,
            })),
        }
    }

    /// The parallelism of sources (and, through them, of operators that do not set their own).
    pub fn with_parallelism(self, parallelism: usize) -> Job {
        self.graph.borrow_mut().default_parallelism = parallelism;
        self
    }

    /// Bounds how far in event time one watermark assigner of the job may run ahead of the
    /// slowest: an assigner whose watermark is more than `max_drift` past the least stops
    /// taking input until the others catch up (Flink's watermark alignment, here on by
    /// default). Assigners put in a named group ([`Stream::with_aligned_watermarks`]) keep
    /// their group's drift.
    ///
    /// Without this call, a job with event-time windows bounds the drift at ten times its
    /// longest window (size, or session gap): otherwise an input that runs ahead (its worker
    /// is faster, or its data is denser) opens windows the slow input has not reached, and
    /// they stay open, in memory and in every checkpoint, until it does. A job without
    /// event-time windows is not aligned unless asked. A drift of zero is refused when the job
    /// starts.
    ///
    /// ```
    /// use weir::{Job, RunConfig, Window, source::Generator};
    /// let job = Job::new("aligned").with_parallelism(2).with_watermark_alignment(5_000);
    /// let counts = job
    ///     .generator(Generator::new(|i, _| (i % 10, i)).count(20_000))
    ///     .with_watermarks(|r: &(u64, u64)| r.1, 0)
    ///     .key_by(|r: &(u64, u64)| r.0)
    ///     .window(Window::tumbling(1_000), |r: &(u64, u64)| r.1)
    ///     .count()
    ///     .collect();
    /// job.execute(RunConfig::default().workers(2)).unwrap();
    /// assert_eq!(counts.lock().unwrap().len(), 20 * 10);
    /// ```
    pub fn with_watermark_alignment(self, max_drift: Timestamp) -> Job {
        self.graph.borrow_mut().default_drift = DefaultDrift::Fixed(max_drift);
        self
    }

    /// Lets every watermark assigner not in a named group run as far ahead in event time as
    /// its input allows (see [`Job::with_watermark_alignment`]).
    pub fn without_watermark_alignment(self) -> Job {
        self.graph.borrow_mut().default_drift = DefaultDrift::Off;
        self
    }

    /// The number of key groups: the upper bound of any keyed operator's parallelism.
    pub fn with_max_parallelism(self, max_parallelism: usize) -> Job {
        self.graph.borrow_mut().max_parallelism = max_parallelism;
        self
    }

    /// Turns checkpointing on (it is off unless configured, as in Flink).
    pub fn with_checkpointing(self, config: crate::checkpoint::CheckpointConfig) -> Job {
        self.graph.borrow_mut().checkpointing = Some(config);
        self
    }

    /// Starts the job from a savepoint (or a checkpoint folder, `chk-<n>`). Operators are
    /// matched by name: give the operators with state stable names with `named`. State for
    /// an operator this job lacks is refused unless `allow_non_restored_state` is true. A
    /// checkpoint directory that already holds checkpoints of this job takes precedence (it is
    /// newer).
    pub fn restore_from(self, path: impl Into<std::path::PathBuf>, allow_non_restored_state: bool) -> Job {
        self.graph.borrow_mut().restore = Some((path.into(), allow_non_restored_state));
        self
    }

    /// Calls `f` with a line saying what a start (the first, or a restart after a failure)
    /// restores, before reading it: which checkpoint or savepoint, and its size. Reading and
    /// restoring much state takes a while, and a process that says nothing meanwhile looks
    /// hung. `f` runs on the thread that starts the attempt.
    ///
    /// ```
    /// let job = weir::Job::new("counts").on_restore(|line| eprintln!("{line}"));
    /// # drop(job);
    /// ```
    pub fn on_restore(self, f: impl Fn(&str) + Send + Sync + 'static) -> Job {
        self.graph.borrow_mut().on_restore = Some(Arc::new(f));
        self
    }

    /// The job's name.
    pub fn name(&self) -> String {
        self.graph.borrow().name.clone()
    }

    /// Says what the job reads and writes (say, its input and output paths). With
    /// checkpointing, it is kept in the completion marker the job leaves in its checkpoint
    /// directory, so a rerun on that directory can say where the finished job's output went.
    pub fn with_description(self, description: impl Into<String>) -> Job {
        self.graph.borrow_mut().description = description.into();
        self
    }

    /// The fingerprint of the job's graph (operator names and parallelism, edges): a
    /// checkpoint is restored only into a job with the same one.
    pub fn fingerprint(&self) -> String {
        self.graph.borrow().fingerprint()
    }

    fn add_node(
        &self,
        base: &str,
        parallelism: usize,
        keyed: bool,
        kind: NodeKind,
        fan_out: super::graph::MakeFanOut,
        inputs: Vec<Input>,
    ) -> usize {
        let mut g = self.graph.borrow_mut();
        let id = g.nodes.len();
        g.nodes.push(Node {
            name: format!("{base}-{id}").into(),
            parallelism,
            keyed,
            inputs: Vec::new(),
            outputs: Vec::new(),
            kind,
            fan_out,
            with_sides: None,
            side_ports: Vec::new(),
        });
        for i in inputs {
            let e = g.edges.len();
            g.edges.push(Edge {
                from: i.from,
                to: id,
                input: i.input,
                port: i.port,
                partitioning: i.partitioning,
                make_channels: i.make_channels,
            });
            g.nodes[i.from].outputs.push(e);
            g.nodes[id].inputs.push(e);
        }
        id
    }

    fn stream<T>(&self, node: usize) -> Stream<T> {
        Stream { graph: self.graph.clone(), node, _t: PhantomData }
    }

    /// A source from a constructor called once per subtask.
    pub fn source<T, S, MS>(&self, make: MS) -> Stream<T>
    where
        T: Record,
        S: Source<T> + 'static,
        MS: Fn(&TaskContext) -> Result<S> + Send + 'static,
    {
        Job::source_of(self, make)
    }

    fn source_of<T, S, MS>(&self, make: MS) -> Stream<T>
    where
        T: Clone + Send + 'static,
        S: Source<T> + 'static,
        MS: Fn(&TaskContext) -> Result<S> + Send + 'static,
    {
        let p = self.graph.borrow().default_parallelism;
        let kind = NodeKind::Source(Box::new(move |ctx, out, batch, control, checkpointing| {
            let mut source = make(ctx)?;
            if checkpointing.as_ref().is_some_and(|c| c.mode == crate::checkpoint::CheckpointMode::ExactlyOnce)
                && !source.replayable()
            {
                return Err(crate::Error::config(format!(
                    "source '{}' cannot replay from a checkpoint (it keeps no Source::offset, or reads a pipe or \
                     standard input, which cannot be read again): after a failover it would start again from \
                     scratch, and exactly-once checkpoints could not hold. Give it an offset (Source::offset and \
                     Source::seek) or a file to read, or checkpoint at-least-once (replays then repeat records), or \
                     run without checkpoints",
                    ctx.operator
                )));
            }
            restore_operator(ctx, |view| match view {
                RestoreView::Own(offset) => source.seek(offset),
                RestoreView::Rescaled { parts, .. } => source.seek_rescaled(&parts, ctx.subtask, ctx.parallelism),
                RestoreView::Nothing => Ok(()),
            })?;
            let out = downcast_collector::<T>(out);
            Ok(Box::new(SourceTask::new(ctx.clone(), Box::new(source), out, batch, control, checkpointing))
                as Box<dyn Task>)
        }));
        let id = self.add_node("source", p, false, kind, fan_out_of::<T>(), Vec::new());
        self.stream(id)
    }

    /// A deterministic generator (see [`Generator`]).
    pub fn generator<T: Record, F: Fn(u64, u64) -> T + Clone + Send + 'static>(
        &self,
        generator: Generator<F>,
    ) -> Stream<T> {
        self.source(move |ctx| Ok(generator.clone().subtask(ctx.subtask, ctx.parallelism))).named("generator")
    }

    /// Lines of a file or folder.
    pub fn text(&self, source: TextSource) -> LineStream {
        LineStream { job: self.clone(), source }
    }

    /// A source fed by the host program through the returned [`EventSender`] (parallelism 1);
    /// `capacity` is the ring's, in events. With checkpoints on, it replays after failovers
    /// from a buffer of up to [`crate::source::DEFAULT_REPLAY_EVENTS`] events (see
    /// [`Job::push_source_with`]).
    pub fn push_source<T: Record>(&self, capacity: usize) -> (EventSender<T>, Stream<T>) {
        self.push_source_with(capacity, crate::source::DEFAULT_REPLAY_EVENTS)
    }

    /// [`Job::push_source`] with a replay buffer of `replay_events`: with checkpoints on, the
    /// source keeps every event since the last completed checkpoint (up to this many; then it
    /// stops reading the ring, and the host is backpressured until a checkpoint completes) and
    /// replays them after a failover, so the job survives task failures exactly-once.
    pub fn push_source_with<T: Record>(&self, capacity: usize, replay_events: usize) -> (EventSender<T>, Stream<T>) {
        let (tx, factory) = crate::source::push_channel::<T>(capacity);
        self.graph.borrow_mut().host_signals.push(factory.signal());
        let stream = self
            .source(move |ctx| factory.make(ctx, ctx.checkpointed(), replay_events))
            .named("push-source")
            .set_parallelism(1);
        (tx, stream)
    }
}

impl Job {
    /// A side-output tag: names a stream of `X` that operators with side outputs (keyed
    /// process functions, windows' late records) emit beside their main output. One name has
    /// one type in a job: a second tag of the same name and another type is refused when the
    /// job starts.
    pub fn output_tag<X: Record>(&self, name: &str) -> OutputTag<X> {
        let mut g = self.graph.borrow_mut();
        let id = std::any::TypeId::of::<X>();
        let type_name = std::any::type_name::<X>();
        let found = g.tags.iter().find(|(n, _, _)| &**n == name).cloned();
        let name: Arc<str> = match found {
            Some((n, t, _)) if t == id => n,
            Some((n, _, other)) => {
                g.build_errors.push(format!(
                    "side output '{n}' is declared with two types, {other} and {type_name}; give each its own name"
                ));
                n
            }
            None => {
                let n: Arc<str> = name.into();
                g.tags.push((n.clone(), id, type_name));
                n
            }
        };
        OutputTag::new(name)
    }
}

impl<T> Stream<T> {
    fn job(&self) -> Job {
        Job { graph: self.graph.clone() }
    }

    fn parallelism(&self) -> usize {
        self.graph.borrow().nodes[self.node].parallelism
    }

    /// Names the operator that produces this stream (names appear in errors and metrics and
    /// must be unique within a job).
    pub fn named(self, name: &str) -> Self {
        let mut g = self.graph.borrow_mut();
        let taken = g.nodes.iter().enumerate().any(|(i, n)| i != self.node && &*n.name == name);
        g.nodes[self.node].name = if taken { format!("{name}-{}", self.node).into() } else { name.into() };
        drop(g);
        self
    }

    /// Sets the parallelism of the operator that produces this stream.
    pub fn set_parallelism(self, parallelism: usize) -> Self {
        self.graph.borrow_mut().nodes[self.node].parallelism = parallelism;
        self
    }
}

/// Wraps one subtask's operator so its panics name it, and erases its type for the plan.
/// Restores the operator's state when the job restarts from a checkpoint.
fn guarded<T: 'static>(ctx: &TaskContext, op: Box<dyn Collector<T>>) -> Result<AnyBox> {
    let mut op = Guarded::new(ctx.clone(), op);
    restore_operator(ctx, |view| match view {
        RestoreView::Own(bytes) => op.restore_state(bytes),
        RestoreView::Rescaled { parts, scope } => op.restore_rescaled(&parts, &scope),
        RestoreView::Nothing => Ok(()),
    })?;
    Ok(Box::new(Box::new(op) as Box<dyn Collector<T>>))
}

/// Restores an operator from what this subtask restores (see [`TaskContext::restore_view`]).
/// State that does not decode as the operator's types now is refused with an error naming the
/// job, the operator and what did not decode (the files' checksums passed, so the types
/// changed).
fn restore_operator(ctx: &TaskContext, restore: impl FnOnce(RestoreView<'_>) -> Result<()>) -> Result<()> {
    let view = ctx.restore_view();
    if matches!(view, RestoreView::Nothing) {
        return Ok(());
    }
    let result = restore(view);
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
fn chained_op<T, U, M>(s: &Stream<T>, base: &str, make: M) -> Stream<U>
where
    T: Clone + Send + 'static,
    U: Clone + Send + 'static,
    M: Fn(&TaskContext, Box<dyn Collector<U>>) -> Result<Box<dyn Collector<T>>> + Send + 'static,
{
    let job = s.job();
    let p = s.parallelism();
    let kind = NodeKind::OneInput {
        make: Box::new(move |ctx, down| guarded(ctx, make(ctx, downcast_collector::<U>(down))?)),
        // Never a task head: its input edge has no rings, and the plan refuses to break it.
        make_task: Box::new(|_, _, _, _, _| -> Result<Box<dyn Task>> {
            unreachable!("an edge carrying non-plain records is always chained")
        }),
    };
    let input = Input { from: s.node, input: 0, port: 0, partitioning: Partitioning::Forward, make_channels: None };
    let id = job.add_node(base, p, false, kind, fan_out_of::<U>(), vec![input]);
    job.stream(id)
}

impl LineStream {
    /// Turns each line into any number of records (chained to the source).
    pub fn flat_map<U: Record, F: Fn(&str, &mut Emitter<'_, U>) + Clone + Send + 'static>(self, f: F) -> Stream<U> {
        let source = self.source.clone();
        let lines = self.job.source_of(move |ctx| Ok(source.subtask(ctx.subtask, ctx.parallelism))).named("text");
        chained_op(&lines, "flat_map", move |_, next| {
            let f = f.clone();
            Ok(Box::new(FlatMap::new(move |line: String, e: &mut Emitter<'_, U>| f(&line, e), next)))
        })
    }

    /// Splits each line into lowercase [`crate::Word`]s (see [`crate::for_each_word`]). Words
    /// never span lines, so the source hands over blocks of whole lines as bytes: one
    /// allocation per block, and no separate UTF-8 check (the splitter reads invalid bytes
    /// as separators, as U+FFFD is).
    pub fn words(self) -> Stream<crate::Word> {
        let source = self.source.clone();
        let blocks = self
            .job
            .source_of(move |ctx| Ok(TextBlocks::new(source.subtask(ctx.subtask, ctx.parallelism))))
            .named("text");
        chained_op(&blocks, "flat_map", move |_, next| {
            Ok(Box::new(FlatMap::new(
                |block: Vec<u8>, e: &mut Emitter<'_, crate::Word>| {
                    crate::record::for_each_word_in_bytes(&block, |w| e.emit(w))
                },
                next,
            )))
        })
        .named("words")
    }
}

impl<T: Record, K: Key, KF, TF> SessionWindowedStream<T, KF, TF>
where
    KF: Fn(&T) -> K + Clone + Send + 'static,
    TF: Fn(&T) -> Timestamp + Clone + Send + 'static,
{
    /// Keeps each session for `lateness` of event time after it fires; a late record merged
    /// into it fires it again (see [`WindowedStream::allowed_lateness`]).
    pub fn allowed_lateness(mut self, lateness: Timestamp) -> Self {
        self.settings.lateness = lateness;
        self
    }

    /// Sends records too late for any session to the side output `tag`.
    pub fn side_output_late_data(mut self, tag: &OutputTag<T>) -> Self {
        self.settings.late = Some(tag.clone());
        self
    }

    /// Aggregates each session: `fold` adds a record, `merge` combines the accumulators of
    /// two sessions a record joined, `result` makes the record emitted when a session fires.
    ///
    /// ```
    /// use weir::{Job, RunConfig, source::Generator};
    /// let job = Job::new("visits");
    /// // Key 0 at times 0, 3, 6 (one session), then 100 (another).
    /// let out = job
    ///     .generator(Generator::new(|i, _| [(0u64, 0u64), (0, 3), (0, 6), (0, 100)][i as usize]).count(4))
    ///     .with_watermarks(|e: &(u64, u64)| e.1, 0)
    ///     .key_by(|e: &(u64, u64)| e.0)
    ///     .session_window(10, |e: &(u64, u64)| e.1)
    ///     .aggregate(|| 0u64, |n: &mut u64, _| *n += 1, |n, m| *n += m, |k: &u64, w, n: &u64| (*k, w.start, w.end, *n))
    ///     .collect();
    /// job.execute(RunConfig::default()).unwrap();
    /// let mut got = out.lock().unwrap().clone();
    /// got.sort();
    /// assert_eq!(got, vec![(0, 0, 16, 3), (0, 100, 110, 1)]);
    /// ```
    pub fn aggregate<A, O, I, F, M, R>(self, init: I, fold: F, merge: M, result: R) -> Stream<O>
    where
        A: Persist + Clone + Send + Sync + 'static,
        O: Record,
        I: Fn() -> A + Clone + Send + 'static,
        F: Fn(&mut A, T) + Clone + Send + 'static,
        M: Fn(&mut A, A) + Clone + Send + 'static,
        R: Fn(&K, WindowBounds, &A) -> O + Clone + Send + 'static,
    {
        self.session_node(init, fold, merge, move |k: &K, b, a: &A, out: &mut Vec<O>| out.push(result(k, b, a)))
    }

    /// A function over each session's records when it fires (see [`WindowedStream::process`]).
    pub fn process<O, P>(self, f: P) -> Stream<O>
    where
        O: Record,
        P: Fn(&K, WindowBounds, &[T], &mut Emitter<'_, O>) + Clone + Send + 'static,
    {
        self.session_node(
            Vec::new,
            |all: &mut Vec<T>, r| all.push(r),
            |all: &mut Vec<T>, mut other: Vec<T>| all.append(&mut other),
            move |k: &K, b, all: &Vec<T>, out: &mut Vec<O>| f(k, b, all, &mut Emitter::new(out)),
        )
    }

    /// Counts each key's records per session, emitting `(key, session, count)`.
    pub fn count(self) -> Stream<(K, WindowBounds, u64)>
    where
        K: Record,
    {
        self.aggregate(|| 0u64, |c: &mut u64, _| *c += 1, |c, o| *c += o, |k: &K, w, c: &u64| (k.clone(), w, *c))
    }

    fn session_node<A, O, I, F, M, R>(self, init: I, fold: F, merge: M, result: R) -> Stream<O>
    where
        A: Persist + Clone + Send + Sync + 'static,
        O: Record,
        I: Fn() -> A + Clone + Send + 'static,
        F: Fn(&mut A, T) + Clone + Send + 'static,
        M: Fn(&mut A, A) + Clone + Send + 'static,
        R: Fn(&K, WindowBounds, &A, &mut Vec<O>) + Clone + Send + 'static,
    {
        let SessionWindowedStream { keyed, timestamp, settings } = self;
        let key = keyed.key.clone();
        let channels = keyed.keyed_channels();
        keyed.stream.with_side_outputs("session", Partitioning::KeyBy, channels, true, move |ctx, next| {
            settings.validate()?;
            Ok(Box::new(SessionWindows::new(
                ctx,
                settings.clone(),
                key.clone(),
                timestamp.clone(),
                init.clone(),
                fold.clone(),
                merge.clone(),
                result.clone(),
                next,
            )))
        })
    }
}

impl<A: Record, B: Record, K: Key, KA, KB> ConnectedStreams<A, B, KA, KB>
where
    KA: Fn(&A) -> K + Clone + Send + 'static,
    KB: Fn(&B) -> K + Clone + Send + 'static,
{
    /// Runs `f` over both streams (see [`KeyedCoProcessFunction`]); its state and timers are
    /// checkpointed, restored and rescaled by key group like a one-input process function's.
    pub fn process<P>(self, f: P) -> Stream<P::Out>
    where
        P: KeyedCoProcessFunction<K, A, B> + Clone,
        P::Out: Record,
    {
        let ConnectedStreams { first, second } = self;
        let inputs = [(Partitioning::KeyBy, first.keyed_channels()), (Partitioning::KeyBy, second.keyed_channels())];
        let (k1, k2) = (first.key.clone(), second.key.clone());
        first.stream.two_input("co-process", &second.stream, inputs, move |ctx, outputs| {
            Ok(Box::new(CoProcessOperator::new(ctx, k1.clone(), k2.clone(), f.clone(), outputs)?))
        })
    }
}

impl<T: Record, B: Record, K: Key, KF: Fn(&T) -> K + Clone + Send + 'static> BroadcastConnectedStream<T, B, KF> {
    /// Runs `f` over the keyed stream and the broadcast one (see
    /// [`KeyedBroadcastProcessFunction`]). Every subtask's broadcast state is in its snapshot;
    /// a rescaled restore gives every new subtask the same one.
    pub fn process<P>(self, f: P) -> Stream<P::Out>
    where
        P: KeyedBroadcastProcessFunction<K, T, B> + Clone,
        P::Out: Record,
    {
        let BroadcastConnectedStream { keyed, broadcast } = self;
        let inputs = [
            (Partitioning::KeyBy, keyed.keyed_channels()),
            (Partitioning::Broadcast, channels_of::<B, fn(&B) -> u64>(None)),
        ];
        let key = keyed.key.clone();
        keyed.stream.two_input("broadcast-process", &broadcast, inputs, move |ctx, outputs| {
            Ok(Box::new(BroadcastProcessOperator::new(ctx, key.clone(), f.clone(), outputs)?))
        })
    }
}

/// Joins a main output of `O` with side outputs into the [`Outputs`] an operator takes.
fn outputs_of<O: 'static>() -> super::graph::MakeOutputs {
    Box::new(|main, sides| Box::new(Outputs { main: downcast_collector::<O>(main), sides }) as AnyBox)
}

fn make_one_input_task<T: Record>() -> super::graph::MakeTask {
    Box::new(|ctx, readers, head, budget, checkpointing| {
        let (channels, route) = EdgeInput::join(readers.into_iter().map(|(_, r)| downcast_readers::<T>(r)));
        let mut gate = InputGate::new(channels);
        replay_inflight(ctx, 0, &mut gate, &route)?;
        Ok(Box::new(OneInputTask::new(ctx, gate, downcast_collector::<T>(head), budget, checkpointing))
            as Box<dyn Task>)
    })
}

/// Restarting from an unaligned checkpoint: queue the in-flight data of input `input` for
/// replay before the rings are read. From a checkpoint of another graph (a rescale), every old
/// subtask's in-flight data of the input is re-routed by the edge's `route`.
fn replay_inflight<T: Record>(
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

impl<T: Record> Stream<T> {
    /// Adds a one-input operator fed by this stream through `partitioning`.
    fn one_input<U, M>(
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
    fn with_side_outputs<U, M>(
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

    fn forward<U: Record, M>(&self, base: &str, make: M) -> Stream<U>
    where
        M: Fn(&TaskContext, Box<dyn Collector<U>>) -> Result<Box<dyn Collector<T>>> + Send + 'static,
    {
        self.one_input(base, Partitioning::Forward, channels_of::<T, fn(&T) -> u64>(None), false, make)
    }

    fn sink_node<S: Sink<T> + 'static, MS: Fn(&TaskContext) -> Result<S> + Send + 'static>(
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
    fn writes_to(&self, node: usize, dir: &std::path::Path) {
        let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
        self.job().graph.borrow_mut().sink_outputs.push((node, dir));
    }

    /// The side output `tag` of the operator that produces this stream (a
    /// [`KeyedStream::keyed_process`] function's `ctx.output`, a window's late records). An
    /// operator without side outputs is refused when the job starts.
    pub fn side_output<X: Record>(&self, tag: &OutputTag<X>) -> Stream<X> {
        let port = {
            let mut g = self.graph.borrow_mut();
            let known = g.tags.iter().find(|(n, _, _)| Arc::ptr_eq(n, &tag.name)).map(|(_, t, _)| *t);
            let node = &mut g.nodes[self.node];
            let name = node.name.clone();
            let mut error = None;
            if node.with_sides.is_none() {
                error = Some(format!(
                    "operator '{name}' has no side outputs, so side output '{}' of it would stay empty; read it from \
                     the operator that emits it (a keyed process function or a window)",
                    tag.name
                ));
            } else if known != Some(std::any::TypeId::of::<X>()) {
                error = Some(format!(
                    "side output '{}' is read as {} but was not declared with that type by this job's output_tag",
                    tag.name,
                    std::any::type_name::<X>()
                ));
            }
            let port = match node.side_ports.iter().position(|p| *p.name == *tag.name) {
                Some(p) if node.side_ports[p].type_id != std::any::TypeId::of::<X>() => {
                    error = Some(format!("side output '{}' of '{name}' is read as two types", tag.name));
                    p + 1
                }
                Some(p) => p + 1,
                None => {
                    node.side_ports.push(super::graph::side_port_of::<X>(tag.name.clone()));
                    node.side_ports.len()
                }
            };
            if let Some(e) = error {
                g.build_errors.push(e);
            }
            port
        };
        let job = self.job();
        let kind = NodeKind::OneInput {
            make: Box::new(|ctx, down| guarded::<X>(ctx, Box::new(PassThrough::new(downcast_collector::<X>(down))))),
            make_task: make_one_input_task::<X>(),
        };
        let input = Input {
            from: self.node,
            input: 0,
            port,
            partitioning: Partitioning::Forward,
            make_channels: Some(channels_of::<X, fn(&X) -> u64>(None)),
        };
        let id = job.add_node("side-output", self.parallelism(), false, kind, fan_out_of::<X>(), vec![input]);
        job.stream(id)
    }

    /// Transforms each record.
    pub fn map<U: Record, F: Fn(T) -> U + Clone + Send + 'static>(self, f: F) -> Stream<U> {
        self.forward("map", move |_, next| Ok(Box::new(Map::new(f.clone(), next))))
    }

    /// Keeps the records for which `f` holds.
    pub fn filter<F: Fn(&T) -> bool + Clone + Send + 'static>(self, f: F) -> Stream<T> {
        self.forward("filter", move |_, next| Ok(Box::new(Filter::new(f.clone(), next))))
    }

    /// Turns each record into any number of records.
    pub fn flat_map<U: Record, F: Fn(T, &mut Emitter<'_, U>) + Clone + Send + 'static>(self, f: F) -> Stream<U> {
        self.forward("flat_map", move |_, next| Ok(Box::new(FlatMap::new(f.clone(), next))))
    }

    /// The job's watermark registry and default alignment group, which assigners not in a
    /// named group join.
    fn default_watermark_groups(&self) -> (Arc<WatermarkRegistry>, Arc<WatermarkAlignment>) {
        let g = self.graph.borrow();
        (g.watermark_registry.clone(), g.default_alignment.clone())
    }

    /// Assigns event time: `timestamp` reads a record's time; watermarks trail the largest time
    /// seen by `out_of_orderness`. At end of input the watermark jumps to the maximum. The
    /// job's assigners are kept together in event time when it has windows (see
    /// [`Job::with_watermark_alignment`]).
    pub fn with_watermarks<F: Fn(&T) -> Timestamp + Clone + Send + 'static>(
        self,
        timestamp: F,
        out_of_orderness: Timestamp,
    ) -> Stream<T> {
        let (registry, alignment) = self.default_watermark_groups();
        self.forward("watermarks", move |ctx, next| {
            let assigner = WatermarkAssigner::new(timestamp.clone(), out_of_orderness, next).registered(
                &registry,
                ctx.operator.clone(),
                ctx.subtask,
            );
            Ok(Box::new(assigner.aligned_if_bounded(&alignment, ctx.operator.clone(), ctx.subtask)))
        })
    }

    /// [`Stream::with_watermarks`] with idleness (Flink's `withIdleness`): a subtask that has
    /// had no input for `idleness` (processing time) stops holding event time back, following
    /// the least watermark of the job's other watermark assigners that are not idle, until
    /// input comes again. So a silent source (a push source nobody sends to, a followed log
    /// that does not grow, a partition without data) does not stop every window of the job
    /// from firing. Records that come after it followed the others may be late. The watermark
    /// it reached is snapshotted like any. An idleness of zero is refused when the job starts.
    ///
    /// ```
    /// use std::time::Duration;
    /// use weir::{Job, RunConfig, source::Generator};
    /// let job = Job::new("idle");
    /// let out = job
    ///     .generator(Generator::new(|i, _| i).count(100))
    ///     .with_watermarks_and_idleness(|t: &u64| *t, 0, Duration::from_millis(200))
    ///     .collect();
    /// job.execute(RunConfig::default().workers(1)).unwrap();
    /// assert_eq!(out.lock().unwrap().len(), 100);
    /// ```
    pub fn with_watermarks_and_idleness<F: Fn(&T) -> Timestamp + Clone + Send + 'static>(
        self,
        timestamp: F,
        out_of_orderness: Timestamp,
        idleness: std::time::Duration,
    ) -> Stream<T> {
        let (registry, alignment) = self.default_watermark_groups();
        self.forward("watermarks", move |ctx, next| {
            if idleness.is_zero() {
                return Err(crate::Error::config(
                    "an idleness of zero would make a watermark assigner idle between any two batches; give the \
                     time after which a silent input stops holding event time back",
                ));
            }
            let assigner = WatermarkAssigner::new(timestamp.clone(), out_of_orderness, next)
                .registered(&registry, ctx.operator.clone(), ctx.subtask)
                .idle_after(idleness, ctx.clock.clone())
                .aligned_if_bounded(&alignment, ctx.operator.clone(), ctx.subtask);
            Ok(Box::new(assigner))
        })
    }

    /// [`Stream::with_watermarks`] in a watermark alignment group (Flink's
    /// `withWatermarkAlignment`): every assigner made with the same `group` name in this job
    /// (this operator's subtasks, and other streams' assigners) stops taking input while its
    /// watermark is more than `max_drift` past the least in the group, so a fast input cannot
    /// open windows far ahead of a slow one (and hold them open, with their state). An input
    /// that has emitted no watermark yet holds the others at `max_drift`; one that ended holds
    /// nobody. A `max_drift` of zero is refused when the job starts.
    ///
    /// ```
    /// use weir::{Job, RunConfig, source::Generator};
    /// let job = Job::new("aligned").with_parallelism(2);
    /// let out = job
    ///     .generator(Generator::new(|i, _| i).count(10_000))
    ///     .with_aligned_watermarks(|t: &u64| *t, 0, "sources", 1_000)
    ///     .collect();
    /// job.execute(RunConfig::default().workers(2)).unwrap();
    /// assert_eq!(out.lock().unwrap().len(), 10_000);
    /// ```
    pub fn with_aligned_watermarks<F: Fn(&T) -> Timestamp + Clone + Send + 'static>(
        self,
        timestamp: F,
        out_of_orderness: Timestamp,
        group: &str,
        max_drift: Timestamp,
    ) -> Stream<T> {
        let alignment = {
            let mut g = self.graph.borrow_mut();
            match g.watermark_groups.iter().find(|(name, _)| name == group) {
                Some((_, a)) => a.clone(),
                None => {
                    let a = WatermarkAlignment::new(max_drift);
                    g.watermark_groups.push((group.to_string(), a.clone()));
                    a
                }
            }
        };
        let group = group.to_string();
        let registry = self.graph.borrow().watermark_registry.clone();
        self.forward("watermarks", move |ctx, next| {
            if max_drift == 0 {
                return Err(crate::Error::config(format!(
                    "watermark alignment group '{group}' has a max drift of 0: no input could ever be ahead of \
                     another, so they would take turns one batch at a time; give a drift of at least a few \
                     batches' worth of event time"
                )));
            }
            if alignment.max_drift() != max_drift {
                return Err(crate::Error::config(format!(
                    "watermark alignment group '{group}' is given a max drift of {max_drift} here and {} elsewhere; \
                     one group has one drift",
                    alignment.max_drift()
                )));
            }
            let assigner = WatermarkAssigner::new(timestamp.clone(), out_of_orderness, next).registered(
                &registry,
                ctx.operator.clone(),
                ctx.subtask,
            );
            Ok(Box::new(assigner.aligned(&alignment, ctx.operator.clone(), ctx.subtask)))
        })
    }

    /// Records each record's latency (now minus `created_ns`, on the job clock) in the job's
    /// latency histogram.
    pub fn measure_latency<F: Fn(&T) -> u64 + Clone + Send + 'static>(self, created_ns: F) -> Stream<T> {
        self.forward("latency", move |ctx, next| Ok(Box::new(LatencyProbe::new(created_ns.clone(), ctx.clone(), next))))
    }

    /// Partitions the stream by key.
    pub fn key_by<K: Key, KF: Fn(&T) -> K + Clone + Send + 'static>(self, key: KF) -> KeyedStream<T, KF> {
        KeyedStream { stream: self, key }
    }

    fn redistribute(self, base: &str, partitioning: Partitioning) -> Stream<T> {
        self.one_input(base, partitioning, channels_of::<T, fn(&T) -> u64>(None), false, |_, next| {
            Ok(Box::new(PassThrough::new(next)))
        })
    }

    /// Spreads batches round-robin over the next operator's subtasks.
    pub fn rebalance(self) -> Stream<T> {
        self.redistribute("rebalance", Partitioning::Rebalance)
    }

    /// Sends every record to every subtask of the next operator.
    pub fn broadcast(self) -> Stream<T> {
        self.redistribute("broadcast", Partitioning::Broadcast)
    }

    /// Merges this stream with `other` (same type); the watermark is the minimum of both.
    pub fn union(self, other: Stream<T>) -> Stream<T> {
        assert!(Arc::ptr_eq(&self.graph, &other.graph), "union of streams from different jobs");
        let job = self.job();
        let kind = NodeKind::OneInput {
            make: Box::new(|ctx, down| guarded::<T>(ctx, Box::new(PassThrough::new(downcast_collector::<T>(down))))),
            make_task: make_one_input_task::<T>(),
        };
        let inputs = [self.node, other.node]
            .into_iter()
            .map(|from| Input {
                from,
                input: 0,
                port: 0,
                partitioning: Partitioning::Forward,
                make_channels: Some(channels_of::<T, fn(&T) -> u64>(None)),
            })
            .collect();
        let id = job.add_node("union", self.parallelism(), false, kind, fan_out_of::<T>(), inputs);
        job.stream(id)
    }

    /// Joins this stream with `other`: records with equal keys whose timestamps fall into the
    /// same event-time window are paired by `join` when the window fires.
    #[allow(clippy::too_many_arguments)]
    pub fn window_join<R, K, O, KL, KR, TL, TR, J>(
        self,
        other: Stream<R>,
        key_left: KL,
        key_right: KR,
        ts_left: TL,
        ts_right: TR,
        window: Window,
        join: J,
    ) -> Stream<O>
    where
        R: Record,
        K: Key,
        O: Record,
        KL: Fn(&T) -> K + Clone + Send + 'static,
        KR: Fn(&R) -> K + Clone + Send + 'static,
        TL: Fn(&T) -> Timestamp + Clone + Send + 'static,
        TR: Fn(&R) -> Timestamp + Clone + Send + 'static,
        J: Fn(&K, &T, &R) -> O + Clone + Send + 'static,
    {
        self.graph.borrow_mut().note_window(window.size);
        let (kl, kr) = (key_left.clone(), key_right.clone());
        let inputs = [
            (Partitioning::KeyBy, channels_of::<T, _>(Some(move |t: &T| hash_key(&kl(t))))),
            (Partitioning::KeyBy, channels_of::<R, _>(Some(move |r: &R| hash_key(&kr(r))))),
        ];
        self.two_input("window-join", &other, inputs, move |ctx, outputs: Outputs<O>| {
            window.validate()?;
            Ok(Box::new(WindowJoin::new(
                window,
                key_left.clone(),
                key_right.clone(),
                ts_left.clone(),
                ts_right.clone(),
                join.clone(),
                ctx.metrics.late_counter(),
                outputs.main,
            )))
        })
    }

    /// A keyed two-input operator fed by this stream (input 1) and `other` (input 2).
    fn two_input<R, O, M>(
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

    /// Sends the stream to a sink made once per subtask.
    pub fn sink<S: Sink<T> + 'static, MS: Fn(&TaskContext) -> Result<S> + Send + 'static>(self, make: MS) {
        self.sink_node("sink", make);
    }

    /// Drops every record (counting them).
    pub fn discard(self) {
        self.sink_node("discard", |_| Ok(DiscardSink));
    }

    /// Collects every record into the returned vector (for tests and small jobs).
    pub fn collect(self) -> Arc<Mutex<Vec<T>>> {
        let out = Arc::new(Mutex::new(Vec::new()));
        let o = out.clone();
        self.sink_node("collect", move |_| Ok(CollectSink::new(o.clone())));
        out
    }

    /// Collects records through a two-phase-commit sink: they become visible in the returned
    /// [`CommittedOutput`] only when the checkpoint after them completes (or the job finishes),
    /// so exactly-once holds across failures.
    pub fn collect_exactly_once(self) -> CommittedOutput<T> {
        let out = CommittedOutput::new();
        let o = out.clone();
        self.sink_node("collect-exactly-once", move |ctx| Ok(TransactionalCollectSink::new(o.clone(), ctx.clone())));
        out
    }

    /// Writes every record, formatted by `format`, to `<dir>/part-<subtask>`.
    pub fn write_files<F: Fn(&T, &mut Vec<u8>) + Clone + Send + 'static>(self, dir: impl Into<PathBuf>, format: F) {
        let dir = dir.into();
        self.writes_to(
            self.sink_node("file-sink", {
                let dir = dir.clone();
                move |ctx| FileSink::create(&dir, ctx.subtask, format.clone())
            }),
            &dir,
        );
    }

    /// Writes each record, formatted by `format`, to files in `dir` committed by two-phase
    /// commit: one transaction per checkpoint and subtask, in a hidden file until its
    /// checkpoint completes, then renamed to `part-<subtask>-<checkpoint>`. Every visible file
    /// is committed output; with exactly-once checkpoints each record is in exactly one of
    /// them, whatever failures happen (see [`TwoPhaseFileSink`]). The sink owns the files
    /// named `part-<n>-<n>` and `.part-<n>-…` in `dir`: a fresh start deletes them.
    pub fn write_files_transactional<F: Fn(&T, &mut Vec<u8>) + Clone + Send + 'static>(
        self,
        dir: impl Into<PathBuf>,
        format: F,
    ) {
        let dir = dir.into();
        self.writes_to(
            self.sink_node("file-sink", {
                let dir = dir.clone();
                move |ctx| TwoPhaseFileSink::create(&dir, ctx, format.clone())
            }),
            &dir,
        );
    }

    /// Writes each record, formatted by `format`, to `<dir>/<partition>/part-<subtask>`, where
    /// `partition` writes the record's partition: a relative folder path such as
    /// `dt=2026-12-02/hm=10:05` (see [`PartitionedFileSink`]; exactly-once as
    /// [`Stream::write_files`] is). A partition that would leave `dir` is an error.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// use weir::source::Generator;
    /// let job = weir::Job::new("by-parity");
    /// job.generator(Generator::new(|i, _| i + 1).count(3)).write_files_partitioned(
    ///     dir.path(),
    ///     |n: &u64, p: &mut String| p.push_str(if n % 2 == 0 { "even" } else { "odd" }),
    ///     |n: &u64, out: &mut Vec<u8>| out.extend_from_slice(format!("{n}\n").as_bytes()),
    /// );
    /// job.execute(weir::RunConfig::default().workers(1)).unwrap();
    /// assert_eq!(std::fs::read_to_string(dir.path().join("odd/part-0")).unwrap(), "1\n3\n");
    /// ```
    pub fn write_files_partitioned<P, F>(self, dir: impl Into<PathBuf>, partition: P, format: F)
    where
        P: Fn(&T, &mut String) + Clone + Send + 'static,
        F: Fn(&T, &mut Vec<u8>) + Clone + Send + 'static,
    {
        let dir = dir.into();
        let node = self.sink_node("partitioned-file-sink", {
            let dir = dir.clone();
            move |ctx| PartitionedFileSink::create(&dir, ctx.subtask, partition.clone(), format.clone())
        });
        self.writes_to(node, &dir);
    }

    /// Sends every record to the host through the returned [`EventReceiver`] at once
    /// ([`Guarantee::AtLeastOnce`]; see [`Stream::pull_sink_with`]). The sink gets parallelism
    /// 1; a host that does not keep up backpressures the job once `capacity` results wait.
    pub fn pull_sink(self, capacity: usize) -> EventReceiver<T> {
        self.pull_sink_with(capacity, Guarantee::AtLeastOnce)
    }

    /// Sends every record to the host with the given guarantee: exactly-once (released when
    /// the checkpoint after them completes) or at-least-once (at once, numbered so a host can
    /// drop replays). Either survives failovers: the receiver stays attached.
    pub fn pull_sink_with(self, capacity: usize, guarantee: Guarantee) -> EventReceiver<T> {
        let (factory, rx) = pull_channel::<T>(capacity, guarantee);
        self.graph.borrow_mut().host_signals.push(factory.signal());
        let single = if self.parallelism() == 1 { self } else { self.rebalance().set_parallelism(1) };
        single.sink_node("pull-sink", move |ctx| Ok(factory.make(ctx)));
        rx
    }
}

impl<T: Record, K: Key, KF: Fn(&T) -> K + Clone + Send + 'static> KeyedStream<T, KF> {
    fn keyed_channels(&self) -> MakeChannels {
        let key = self.key.clone();
        channels_of::<T, _>(Some(move |t: &T| hash_key(&key(t))))
    }

    /// A running aggregate per key: for each record, `fold` updates the key's accumulator
    /// (created by `init`) and `result` makes the record emitted for it.
    pub fn aggregate<A, O, I, F, R>(self, init: I, fold: F, result: R) -> Stream<O>
    where
        A: Persist + Clone + Send + Sync + 'static,
        O: Record,
        I: Fn() -> A + Clone + Send + 'static,
        F: Fn(&mut A, T) + Clone + Send + 'static,
        R: Fn(&K, &A) -> O + Clone + Send + 'static,
    {
        let key = self.key.clone();
        let channels = self.keyed_channels();
        self.stream.one_input("aggregate", Partitioning::KeyBy, channels, true, move |_, next| {
            Ok(Box::new(KeyedAggregate::new(key.clone(), init.clone(), fold.clone(), result.clone(), next)))
        })
    }

    /// A stateful function per key: for every record, `f(key, record, state, out)` with the
    /// subtask's keyed state (made by `state`: a [`crate::state::KeyedValueState`],
    /// [`crate::state::AggregatingState`], [`crate::state::ListState`],
    /// [`crate::state::MapState`], or a type of your own implementing
    /// [`crate::state::KeyedState`]); records pushed to `out` go downstream. The state is
    /// checkpointed, restored after failures and redistributed by key group on rescaling.
    ///
    /// ```
    /// use weir::{Job, RunConfig, source::Generator, state::ListState};
    /// let job = Job::new("pairs");
    /// // Emit each key's records two at a time.
    /// let pairs = job
    ///     .generator(Generator::new(|i, _| (i % 2, i)).count(8))
    ///     .key_by(|e: &(u64, u64)| e.0)
    ///     .process(ListState::new, |k: &u64, e: (u64, u64), buf: &mut ListState<u64, u64>, out: &mut Vec<(u64, u64, u64)>| {
    ///         buf.add(*k, e.1);
    ///         if let [a, b] = buf.get(k) {
    ///             out.push((*k, *a, *b));
    ///             buf.take(k);
    ///         }
    ///     })
    ///     .collect();
    /// job.execute(RunConfig::default()).unwrap();
    /// let mut got = pairs.lock().unwrap().clone();
    /// got.sort();
    /// assert_eq!(got, vec![(0, 0, 2), (0, 4, 6), (1, 1, 3), (1, 5, 7)]);
    /// ```
    pub fn process<S, O, SF, F>(self, state: SF, f: F) -> Stream<O>
    where
        S: crate::state::KeyedState,
        O: Record,
        SF: Fn() -> S + Clone + Send + 'static,
        F: FnMut(&K, T, &mut S, &mut Vec<O>) + Clone + Send + 'static,
    {
        let key = self.key.clone();
        let channels = self.keyed_channels();
        self.stream.one_input("process", Partitioning::KeyBy, channels, true, move |_, next| {
            Ok(Box::new(KeyedProcess::new(key.clone(), state(), f.clone(), next)))
        })
    }

    /// A [`KeyedProcessFunction`] over the keyed stream: for each record (and each timer
    /// that fires) the function sees the current key, its state scoped to that key, the
    /// watermark and processing time, sets and deletes timers, and emits to the main output
    /// and to side outputs ([`Stream::side_output`] reads them). State and timers are in every
    /// checkpoint and savepoint, restored after failures and redistributed by key group when
    /// the job is rescaled.
    pub fn keyed_process<P>(self, f: P) -> Stream<P::Out>
    where
        P: KeyedProcessFunction<K, T> + Clone,
        P::Out: Record,
    {
        let key = self.key.clone();
        let channels = self.keyed_channels();
        self.stream.with_side_outputs("process", Partitioning::KeyBy, channels, true, move |ctx, outputs| {
            Ok(Box::new(KeyedProcessOperator::new(ctx, key.clone(), f.clone(), outputs)?))
        })
    }

    /// Keeps the latest record per key in `<dir>/latest-<subtask>`, one line per key
    /// formatted by `format`, sorted; the file is rewritten whole on every checkpoint and at
    /// the end (see [`crate::sink::LatestPerKeySink`]: replays rewrite the same content, so
    /// the output is exactly-once in effect whatever failures happen).
    pub fn write_latest<F: Fn(&T, &mut Vec<u8>) + Clone + Send + 'static>(self, dir: impl Into<PathBuf>, format: F) {
        let dir = dir.into();
        let key = self.key.clone();
        let channels = self.keyed_channels();
        let folder = dir.clone();
        let node = self.stream.one_input::<(), _>("latest-sink", Partitioning::KeyBy, channels, true, move |ctx, _| {
            let sink = LatestPerKeySink::create(&folder, ctx, key.clone(), format.clone())?;
            Ok(Box::new(SinkOperator::new(sink, ctx.metrics.sink_counter())))
        });
        self.stream.writes_to(node.node, &dir);
    }

    /// A running reduce per key: emits the combined value after every record.
    pub fn reduce<F: Fn(&T, &T) -> T + Clone + Send + 'static>(self, f: F) -> Stream<T> {
        self.aggregate(
            || None::<T>,
            move |acc: &mut Option<T>, r: T| {
                let combined = match acc.as_ref() {
                    None => r,
                    Some(a) => f(a, &r),
                };
                *acc = Some(combined);
            },
            |_, acc: &Option<T>| acc.clone().expect("the accumulator was just set"),
        )
        .named("reduce")
    }

    /// Event-time windows over the keyed stream; `timestamp` reads a record's event time.
    pub fn window<TF: Fn(&T) -> Timestamp + Clone + Send + 'static>(
        self,
        window: Window,
        timestamp: TF,
    ) -> WindowedStream<T, KF, TF> {
        self.stream.graph.borrow_mut().note_window(window.size);
        WindowedStream { keyed: self, window, timestamp, settings: WindowSettings::default() }
    }

    /// Processing-time windows: a record falls in the windows of the time it arrives
    /// ([`crate::TaskContext::processing_time_ms`], milliseconds), and a window fires when
    /// processing time passes its end (at the end of input, every open window fires).
    pub fn processing_time_window(self, window: Window) -> WindowedStream<T, KF, fn(&T) -> Timestamp> {
        let settings = WindowSettings { processing_time: true, ..WindowSettings::default() };
        WindowedStream { keyed: self, window, timestamp: |_| 0, settings }
    }

    /// Connects this keyed stream with another keyed by the same key type: a
    /// [`KeyedCoProcessFunction`] then sees both, records of one key in one subtask, with
    /// shared keyed state and timers (Flink's `connect` + `KeyedCoProcessFunction`).
    pub fn connect<B: Record, KB: Fn(&B) -> K + Clone + Send + 'static>(
        self,
        other: KeyedStream<B, KB>,
    ) -> ConnectedStreams<T, B, KF, KB> {
        ConnectedStreams { first: self, second: other }
    }

    /// Connects this keyed stream with `broadcast`, whose every record reaches every subtask:
    /// a [`KeyedBroadcastProcessFunction`] keeps the broadcast records' effect in
    /// [`crate::operator::co_process::BroadcastState`] (rules, say), read by the keyed side.
    pub fn connect_broadcast<B: Record>(self, broadcast: Stream<B>) -> BroadcastConnectedStream<T, B, KF> {
        BroadcastConnectedStream { keyed: self, broadcast }
    }

    /// Event-time session windows: a key's records less than `gap` apart (by `timestamp`) are
    /// one session, from its first record to its last plus `gap`; a record between two
    /// sessions merges them. A gap of zero is refused when the job starts.
    pub fn session_window<TF: Fn(&T) -> Timestamp + Clone + Send + 'static>(
        self,
        gap: Timestamp,
        timestamp: TF,
    ) -> SessionWindowedStream<T, KF, TF> {
        self.stream.graph.borrow_mut().note_window(gap);
        SessionWindowedStream { keyed: self, timestamp, settings: SessionSettings { gap, lateness: 0, late: None } }
    }
}

impl<T: Record, K: Key, KF, TF> WindowedStream<T, KF, TF>
where
    KF: Fn(&T) -> K + Clone + Send + 'static,
    TF: Fn(&T) -> Timestamp + Clone + Send + 'static,
{
    /// Keeps each window for `lateness` of event time after it fires: a late record within it
    /// is added and the window fires again for its key (Flink's allowed lateness). Records
    /// later than that are dropped and counted, or sent to [`Self::side_output_late_data`].
    pub fn allowed_lateness(mut self, lateness: Timestamp) -> Self {
        self.settings.lateness = lateness;
        self
    }

    /// Sends records too late for every window of theirs to the side output `tag` (read it
    /// with [`Stream::side_output`] on the window's output).
    pub fn side_output_late_data(mut self, tag: &OutputTag<T>) -> Self {
        self.settings.late = Some(tag.clone());
        self
    }

    /// Fires early as well as at each window's end (see [`EarlyFiring`]).
    pub fn early_firing(mut self, early: EarlyFiring) -> Self {
        self.settings.early = Some(early);
        self
    }

    /// Aggregates each key's records per window; when a window fires, `result` makes one record
    /// per key.
    pub fn aggregate<A, O, I, F, R>(self, init: I, fold: F, result: R) -> Stream<O>
    where
        A: Persist + Clone + Send + Sync + 'static,
        O: Record,
        I: Fn() -> A + Clone + Send + 'static,
        F: Fn(&mut A, T) + Clone + Send + 'static,
        R: Fn(&K, WindowBounds, &A) -> O + Clone + Send + 'static,
    {
        self.window_node(init, fold, move |k: &K, b: WindowBounds, a: &A, out: &mut Vec<O>| out.push(result(k, b, a)))
    }

    /// A function over each key's records of a window when it fires (Flink's
    /// `ProcessWindowFunction`): `f(key, window, records, out)`, with the records in arrival
    /// order. The records are kept until the window fires; prefer [`Self::aggregate`] when a
    /// running accumulator will do.
    ///
    /// ```
    /// use weir::{Job, RunConfig, Window, source::Generator};
    /// let job = Job::new("medians");
    /// let out = job
    ///     .generator(Generator::new(|i, _| (i % 2, i)).count(40))
    ///     .with_watermarks(|e: &(u64, u64)| e.1, 0)
    ///     .key_by(|e: &(u64, u64)| e.0)
    ///     .window(Window::tumbling(10), |e: &(u64, u64)| e.1)
    ///     .process(|k: &u64, w, records: &[(u64, u64)], out: &mut weir::Emitter<'_, (u64, u64, u64)>| {
    ///         let mut times: Vec<u64> = records.iter().map(|r| r.1).collect();
    ///         times.sort();
    ///         out.emit((*k, w.start, times[times.len() / 2]));
    ///     })
    ///     .collect();
    /// job.execute(RunConfig::default()).unwrap();
    /// let mut got = out.lock().unwrap().clone();
    /// got.sort();
    /// assert_eq!(got[..2], [(0, 0, 4), (0, 10, 14)]);
    /// ```
    pub fn process<O, P>(self, f: P) -> Stream<O>
    where
        O: Record,
        P: Fn(&K, WindowBounds, &[T], &mut Emitter<'_, O>) + Clone + Send + 'static,
    {
        self.window_node(
            Vec::new,
            |all: &mut Vec<T>, r| all.push(r),
            move |k: &K, b, all: &Vec<T>, out: &mut Vec<O>| f(k, b, all, &mut Emitter::new(out)),
        )
    }

    fn window_node<A, O, I, F, R>(self, init: I, fold: F, result: R) -> Stream<O>
    where
        A: Persist + Clone + Send + Sync + 'static,
        O: Record,
        I: Fn() -> A + Clone + Send + 'static,
        F: Fn(&mut A, T) + Clone + Send + 'static,
        R: Fn(&K, WindowBounds, &A, &mut Vec<O>) + Clone + Send + 'static,
    {
        let WindowedStream { keyed, window, timestamp, settings } = self;
        let key = keyed.key.clone();
        let channels = keyed.keyed_channels();
        keyed.stream.with_side_outputs("window", Partitioning::KeyBy, channels, true, move |ctx, next| {
            window.validate()?;
            settings.validate()?;
            Ok(Box::new(WindowAggregate::new(
                ctx,
                window,
                settings.clone(),
                key.clone(),
                timestamp.clone(),
                init.clone(),
                fold.clone(),
                result.clone(),
                next,
            )))
        })
    }

    /// Counts each key's records per window, emitting `(key, window, count)`.
    pub fn count(self) -> Stream<(K, WindowBounds, u64)>
    where
        K: Record,
    {
        self.aggregate(|| 0u64, |c: &mut u64, _| *c += 1, |k: &K, w, c: &u64| (k.clone(), w, *c))
    }
}
