//! [`Job`]: where a job starts (its sources: generators, text files, push sources, the host's
//! ring), its settings (parallelism, watermark alignment, restore notices) and side-output
//! tags; and running it.
//!
//! May touch: `checkpoint`, `context`, `error`, `operator`, `record`, `source`.

use std::marker::PhantomData;
use std::sync::Arc;

use crate::context::{RestoreView, TaskContext};
use crate::error::Result;
use crate::operator::side::OutputTag;
use crate::operator::watermark::WatermarkAlignment;
use crate::pipeline::graph::{downcast_collector, fan_out_of, DefaultDrift, Edge, Graph, Node, NodeKind, SharedGraph};
use crate::pipeline::task::{SourceTask, Task};
use crate::record::{Record, Timestamp};
use crate::source::{EventSender, Generator, Source, TextSource};

use super::*;

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
                host_deliveries: Vec::new(),
                watermark_groups: Vec::new(),
                default_alignment: WatermarkAlignment::unbounded(),
                default_drift: DefaultDrift::FromWindows,
                longest_window: 0,
                tags: Vec::new(),
                build_errors: Vec::new(),
                sink_outputs: Vec::new(),
                watermark_registry: Arc::default(),
                on_restore: None,
                manual_clock: None,
            })),
        }
    }

    /// Runs the job on a clock that reads `time` (nanoseconds), which only the test moves (a
    /// source of the test, say, a step each poll): the job's times (latency, checkpoint
    /// intervals, event creation) then follow what the job did, not how the machine's
    /// scheduler ran its threads. For tests (the `testing` feature).
    #[cfg(feature = "testing")]
    pub fn with_manual_clock(self, time: Arc<std::sync::atomic::AtomicU64>) -> Job {
        self.graph.borrow_mut().manual_clock = Some(time);
        self
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

    /// What the job's rings hold at most, in bytes, with `ring_capacity` entries a ring
    /// ([`crate::RunConfig::ring_capacity`]): the largest in-flight data an unaligned checkpoint
    /// can store, and so the bound on a useful in-flight budget
    /// ([`crate::checkpoint::CheckpointMode::Adaptive`]). `None` when a record type that
    /// owns heap memory crosses a ring (then it is not bounded), or nothing does.
    pub fn ring_bytes(&self, ring_capacity: usize) -> Option<u64> {
        crate::pipeline::plan::ring_bytes(&self.graph.borrow(), ring_capacity)
    }

    /// The in-flight budget adaptive alignment takes unless told one, with rings of
    /// `ring_capacity` entries: half of what they hold, at most
    /// [`crate::checkpoint::DEFAULT_INFLIGHT_BUDGET`] (1 MiB was refused on the default rings
    /// of the backpressure workload, which hold 512 KiB).
    pub fn default_inflight_budget(&self, ring_capacity: usize) -> u64 {
        let most = crate::checkpoint::DEFAULT_INFLIGHT_BUDGET;
        self.ring_bytes(ring_capacity).map_or(most, |bytes| most.min(bytes / 2).max(1))
    }

    /// The checkpoint configuration, if checkpointing is on.
    pub fn checkpointing(&self) -> Option<crate::checkpoint::CheckpointConfig> {
        self.graph.borrow().checkpointing.clone()
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

    pub(super) fn add_node(
        &self,
        base: &str,
        parallelism: usize,
        keyed: bool,
        kind: NodeKind,
        fan_out: crate::pipeline::graph::MakeFanOut,
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

    pub(super) fn stream<T>(&self, node: usize) -> Stream<T> {
        Stream { graph: Arc::clone(&self.graph), node, _t: PhantomData }
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

    pub(super) fn source_of<T, S, MS>(&self, make: MS) -> Stream<T>
    where
        T: Clone + Send + 'static,
        S: Source<T> + 'static,
        MS: Fn(&TaskContext) -> Result<S> + Send + 'static,
    {
        let p = self.graph.borrow().default_parallelism;
        let kind = NodeKind::Source(Box::new(move |ctx, out, batch, control, checkpointing| {
            let mut source = make(ctx)?;
            if checkpointing.as_ref().is_some_and(|c| c.mode.exactly_once()) && !source.replayable() {
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
            source.restored();
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
        self.source(move |ctx| Ok(generator.clone().subtask(ctx.subtask, ctx.parallelism)))
            .named_by_default("generator")
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
            .named_by_default("push-source")
            .set_parallelism(1);
        (tx, stream)
    }

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
                g.tags.push((Arc::clone(&n), id, type_name));
                n
            }
        };
        OutputTag::new(name)
    }
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job").field("name", &self.name()).finish_non_exhaustive()
    }
}
