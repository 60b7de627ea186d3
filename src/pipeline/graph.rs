//! The logical job graph the builder records: nodes (operators with a parallelism) and edges
//! (with a partitioning), each carrying type-erased constructors made while the types were
//! known. `plan` turns the graph into tasks.

use std::any::Any;
use std::sync::Arc;

use super::task::{JobControl, Task};
use crate::barrier::inflight::InflightRoute;
use crate::barrier::TaskCheckpointing;
use crate::channel::{channel, ChannelReader, ChannelWriter, KeyRouter, OutChannel, Partitioner, Partitioning};
use crate::collector::{Collector, FanOut, Nowhere};
use crate::context::TaskContext;
use crate::error::Result;
use crate::operator::side::{SideOut, SideOutputs, SideSink};
use crate::operator::TwoInputOperator;
use crate::record::Record;
use crate::wake::Parker;

/// A value whose type the node or edge that made it knows.
pub(crate) type AnyBox = Box<dyn Any + Send>;

/// Makes one subtask's chain element from its downstream collector.
pub(crate) type MakeOperator = Box<dyn Fn(&TaskContext, AnyBox) -> Result<AnyBox> + Send>;
/// Makes a source task from its downstream collector, the batch size and the job's controls.
pub(crate) type MakeSource = Box<
    dyn Fn(&TaskContext, AnyBox, usize, Arc<JobControl>, Option<TaskCheckpointing>) -> Result<Box<dyn Task>> + Send,
>;
/// Makes a task from the readers of each input (input index, readers) and the chain head.
pub(crate) type MakeTask = Box<
    dyn Fn(&TaskContext, Vec<(usize, AnyBox)>, AnyBox, usize, Option<TaskCheckpointing>) -> Result<Box<dyn Task>>
        + Send,
>;
/// Combines the collectors of a node's outgoing edges into one.
pub(crate) type MakeFanOut = Box<dyn Fn(Vec<AnyBox>) -> AnyBox + Send>;
/// Builds an edge's rings: writers per upstream subtask, readers per downstream subtask.
pub(crate) type MakeRings = Box<dyn Fn(&ChannelSpec) -> (Vec<AnyBox>, Vec<AnyBox>) + Send>;

/// An edge's ring constructor, made while its record type was known.
pub(crate) struct MakeChannels {
    pub(crate) make: MakeRings,
    /// The size of one ring entry, for records that own no heap memory (what an in-flight
    /// budget is checked against): their encoding is no larger. `None` for records that do.
    pub(crate) entry_bytes: Option<usize>,
}

pub(crate) enum NodeKind {
    Source(MakeSource),
    OneInput { make: MakeOperator, make_task: MakeTask },
    TwoInput { make: MakeOperator, make_task: MakeTask },
}

pub(crate) struct Node {
    pub(crate) name: Arc<str>,
    pub(crate) parallelism: usize,
    /// Needs key groups: parallelism may not exceed the max parallelism.
    pub(crate) keyed: bool,
    pub(crate) inputs: Vec<usize>,
    pub(crate) outputs: Vec<usize>,
    pub(crate) kind: NodeKind,
    pub(crate) fan_out: MakeFanOut,
    /// For an operator with side outputs: joins its main output with the side outputs read.
    pub(crate) with_sides: Option<MakeOutputs>,
    /// The side outputs read, in port order (port `i + 1` is `side_ports[i]`).
    pub(crate) side_ports: Vec<SidePort>,
}

/// Joins a node's main output collector with its side outputs' into what its operator takes.
pub(crate) type MakeOutputs = Box<dyn Fn(AnyBox, SideOutputs) -> AnyBox + Send>;

/// A side output somebody reads.
pub(crate) struct SidePort {
    pub(crate) name: Arc<str>,
    pub(crate) type_id: std::any::TypeId,
    /// Makes the side output's collector from its edges' collectors.
    pub(crate) make: Box<dyn Fn(Vec<AnyBox>) -> Box<dyn SideSink> + Send>,
}

/// The side-port constructor for records of `X`.
pub(crate) fn side_port_of<X: Clone + Send + 'static>(name: Arc<str>) -> SidePort {
    SidePort {
        name,
        type_id: std::any::TypeId::of::<X>(),
        make: Box::new(|outs| {
            let next = downcast_collector::<X>((fan_out_of::<X>())(outs));
            Box::new(SideOut::new(next)) as Box<dyn SideSink>
        }),
    }
}

pub(crate) struct Edge {
    pub(crate) from: usize,
    pub(crate) to: usize,
    /// Which input of `to` this edge feeds (0, or 1 for the right side of a two-input node).
    pub(crate) input: usize,
    /// Which output of `from` it carries: 0 the main one, `i + 1` side port `i`.
    pub(crate) port: usize,
    pub(crate) partitioning: Partitioning,
    /// `None` for edges whose values are not [`Record`]s (text lines): they can only be chained.
    pub(crate) make_channels: Option<MakeChannels>,
}

/// What `make_channels` needs to build an edge's rings.
pub(crate) struct ChannelSpec {
    pub(crate) partitioning: Partitioning,
    pub(crate) upstream: usize,
    pub(crate) downstream: usize,
    pub(crate) capacity: usize,
    pub(crate) max_parallelism: usize,
    pub(crate) upstream_parkers: Vec<Arc<Parker>>,
    pub(crate) downstream_parkers: Vec<Arc<Parker>>,
    /// With an aligned-checkpoint timeout: when producers republish queued barriers.
    pub(crate) barrier_expiry: Option<crate::channel::BarrierExpiry>,
    /// Per upstream subtask, its live figures (the records it sends are counted there).
    pub(crate) senders: Vec<Arc<crate::metrics::OperatorMetrics>>,
}

pub(crate) struct Graph {
    pub(crate) name: String,
    pub(crate) nodes: Vec<Node>,
    pub(crate) edges: Vec<Edge>,
    pub(crate) default_parallelism: usize,
    pub(crate) max_parallelism: usize,
    pub(crate) checkpointing: Option<crate::checkpoint::CheckpointConfig>,
    /// A savepoint or checkpoint to start from, and whether its state for operators this job
    /// lacks may be dropped.
    pub(crate) restore: Option<(std::path::PathBuf, bool)>,
    /// What the job reads and writes, for its completion marker.
    pub(crate) description: String,
    /// The embedding endpoints' signals (push sources, pull sinks): told when the job ends.
    pub(crate) host_signals: Vec<Arc<crate::wake::HostSignal>>,
    /// The pull sinks' deliveries: a finished job is marked done once the host has them all.
    pub(crate) host_deliveries: Vec<Arc<dyn crate::sink::HostDelivery>>,
    /// Every watermark assigner's watermark, and which are idle (see
    /// [`crate::Stream::with_watermarks_and_idleness`]).
    pub(crate) watermark_registry: Arc<crate::operator::watermark::WatermarkRegistry>,
    /// Watermark alignment groups, by name (see [`crate::Stream::with_aligned_watermarks`]).
    pub(crate) watermark_groups: Vec<(String, Arc<crate::operator::watermark::WatermarkAlignment>)>,
    /// The group of every assigner not in a named one; its drift is set when the job starts
    /// ([`Graph::default_drift`]).
    pub(crate) default_alignment: Arc<crate::operator::watermark::WatermarkAlignment>,
    /// How the default group's drift is chosen ([`crate::Job::with_watermark_alignment`]).
    pub(crate) default_drift: DefaultDrift,
    /// The longest event-time span of the job's windows (window size, session gap); 0 when
    /// it has none.
    pub(crate) longest_window: crate::record::Timestamp,
    /// Side-output tags by name, with their record type's id and name.
    pub(crate) tags: Vec<(Arc<str>, std::any::TypeId, &'static str)>,
    /// Mistakes found while the job was built, reported when it starts.
    pub(crate) build_errors: Vec<String>,
    /// Sinks that write to a folder: (node, the folder as an absolute path).
    pub(crate) sink_outputs: Vec<(usize, std::path::PathBuf)>,
    /// Told what a start restores before it reads it ([`crate::Job::on_restore`]).
    pub(crate) on_restore: Option<Arc<RestoreAnnouncer>>,
    /// The job's clock in place of the wall clock's ([`crate::Job::with_manual_clock`], tests).
    pub(crate) manual_clock: Option<Arc<std::sync::atomic::AtomicU64>>,
}

/// How a job bounds the drift of its default watermark alignment group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DefaultDrift {
    /// [`WINDOWS_OF_DRIFT`] times the job's longest window span; unbounded without windows.
    FromWindows,
    /// The user's bound.
    Fixed(crate::record::Timestamp),
    /// No alignment ([`crate::Job::without_watermark_alignment`]).
    Off,
}

/// How many of its longest windows one input may run ahead of the slowest by default. Each is
/// a window per key held open (and in every checkpoint) until the slow input closes it; a few
/// are what lets the inputs take turns in batches rather than stall each other. Measured on
/// W3 (perf/README, "Windows as a user writes them"): ten keep checkpoints at the size an
/// explicit alignment group gets.
pub(crate) const WINDOWS_OF_DRIFT: crate::record::Timestamp = 10;

impl Graph {
    /// Counts an event-time window of `span` (size, or session gap) toward the default drift.
    pub(crate) fn note_window(&mut self, span: crate::record::Timestamp) {
        self.longest_window = self.longest_window.max(span);
    }

    /// The drift of the default alignment group, `None` for unbounded.
    pub(crate) fn default_drift(&self) -> Option<crate::record::Timestamp> {
        match self.default_drift {
            DefaultDrift::Fixed(d) => Some(d),
            DefaultDrift::Off => None,
            DefaultDrift::FromWindows => {
                (self.longest_window > 0).then(|| self.longest_window.saturating_mul(WINDOWS_OF_DRIFT))
            }
        }
    }
}

/// What [`crate::Job::on_restore`] calls.
pub(crate) type RestoreAnnouncer = dyn Fn(&str) + Send + Sync;

/// The graph a [`crate::Job`] builds, shared by the job's streams. A mutex (not a `RefCell`) so
/// a job under construction, and the handle of a running one, can move between threads; the
/// builder takes it for one call at a time, so it is never contended.
pub(crate) struct SharedGraph(std::sync::Mutex<Graph>);

impl SharedGraph {
    pub(crate) fn new(graph: Graph) -> Self {
        SharedGraph(std::sync::Mutex::new(graph))
    }
    /// The graph, for reading. Never hold it across another call that takes it.
    pub(crate) fn borrow(&self) -> std::sync::MutexGuard<'_, Graph> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// The graph, for changing it.
    pub(crate) fn borrow_mut(&self) -> std::sync::MutexGuard<'_, Graph> {
        self.borrow()
    }
}

impl Graph {
    /// A fingerprint of the graph's shape: operator names and parallelism, and edges. A
    /// checkpoint is restored only into a job with the same fingerprint.
    pub(crate) fn fingerprint(&self) -> String {
        let mut h = crate::record::KeyHasher::default();
        use std::hash::{Hash, Hasher};
        for n in &self.nodes {
            n.name.hash(&mut h);
            n.parallelism.hash(&mut h);
        }
        for e in &self.edges {
            (e.from, e.to, e.input, e.partitioning as u8).hash(&mut h);
            // Side-output edges only, so main-output graphs keep their fingerprints.
            if e.port != 0 {
                e.port.hash(&mut h);
            }
        }
        format!("{:016x}", h.finish())
    }
}

/// The fan-out constructor for a node whose output type is `T`.
pub(crate) fn fan_out_of<T: Clone + Send + 'static>() -> MakeFanOut {
    Box::new(|mut outs: Vec<AnyBox>| -> AnyBox {
        let mut typed: Vec<Box<dyn Collector<T>>> = outs.drain(..).map(downcast_collector::<T>).collect();
        match typed.len() {
            0 => Box::new(Box::new(Nowhere) as Box<dyn Collector<T>>),
            1 => Box::new(typed.pop().expect("one output")),
            _ => Box::new(Box::new(FanOut::new(typed)) as Box<dyn Collector<T>>),
        }
    })
}

/// Takes a `Box<dyn Collector<T>>` out of an [`AnyBox`]; a mismatch is a bug in the builder.
pub(crate) fn downcast_collector<T: 'static>(b: AnyBox) -> Box<dyn Collector<T>> {
    *b.downcast::<Box<dyn Collector<T>>>().expect("builder type mismatch: collector")
}

/// Takes a `Box<dyn TwoInputOperator<A, B>>` out of an [`AnyBox`].
pub(crate) fn downcast_two<A: 'static, B: 'static>(b: AnyBox) -> Box<dyn TwoInputOperator<A, B>> {
    *b.downcast::<Box<dyn TwoInputOperator<A, B>>>().expect("builder type mismatch: two-input operator")
}

/// Takes the readers of one edge out of an [`AnyBox`].
pub(crate) fn downcast_readers<T: 'static>(b: AnyBox) -> EdgeInput<T> {
    *b.downcast::<EdgeInput<T>>().expect("builder type mismatch: readers")
}

/// One downstream subtask's end of an edge: its channels, one per upstream subtask it reads,
/// and the edge's routing (what a restore at another parallelism re-routes in-flight data by).
pub(crate) struct EdgeInput<T> {
    pub(crate) readers: Vec<ChannelReader<T>>,
    pub(crate) route: InflightRoute<T>,
}

impl<T> EdgeInput<T> {
    /// The readers of one input fed by `edges` (several for a union, all forward), and its
    /// routing.
    pub(crate) fn join(edges: impl IntoIterator<Item = EdgeInput<T>>) -> (Vec<ChannelReader<T>>, InflightRoute<T>) {
        let mut readers = Vec::new();
        let mut route = None;
        for e in edges {
            readers.extend(e.readers);
            assert!(
                route.is_none() || matches!(e.route, InflightRoute::Forward),
                "only forward edges share an input (a union)"
            );
            route = Some(e.route);
        }
        (readers, route.unwrap_or(InflightRoute::Forward))
    }
}

/// The channel constructor of an edge carrying `T`; `hash` is the key hash for key-by edges.
pub(crate) fn channels_of<T: Record, H: Fn(&T) -> u64 + Clone + Send + 'static>(hash: Option<H>) -> MakeChannels {
    let make = Box::new(move |spec: &ChannelSpec| {
        let (up, down) = (spec.upstream, spec.downstream);
        // outs[i][j]: ring from upstream i to downstream j (only i == j for forward).
        let mut outs: Vec<Vec<OutChannel<T>>> = (0..up).map(|_| Vec::new()).collect();
        let mut ins: Vec<Vec<ChannelReader<T>>> = (0..down).map(|_| Vec::new()).collect();
        for (i, out) in outs.iter_mut().enumerate() {
            for (j, input) in ins.iter_mut().enumerate() {
                if spec.partitioning == Partitioning::Forward && i != j {
                    continue;
                }
                let (w, r) = channel::<T>(
                    spec.capacity,
                    Arc::clone(&spec.downstream_parkers[j]),
                    Arc::clone(&spec.upstream_parkers[i]),
                );
                out.push(w.with_expiry(spec.barrier_expiry.clone()));
                input.push(r);
            }
        }
        let writers = outs
            .into_iter()
            .enumerate()
            .map(|(i, o)| {
                let partitioner = match spec.partitioning {
                    Partitioning::Forward => Partitioner::Forward,
                    // Upstream subtasks start at different targets so batches spread at once.
                    Partitioning::Rebalance => Partitioner::Rebalance { next: i % down },
                    Partitioning::Broadcast => Partitioner::Broadcast,
                    // One downstream subtask owns every key group: its one ring takes each run
                    // whole, unhashed.
                    Partitioning::KeyBy if down == 1 => Partitioner::Forward,
                    Partitioning::KeyBy => Partitioner::KeyBy {
                        hash: hash.clone().expect("a key-by edge has a key hash"),
                        router: KeyRouter::new(spec.max_parallelism, down),
                    },
                };
                let writer = ChannelWriter::new(o, partitioner).counting_into(Arc::clone(&spec.senders[i]));
                Box::new(Box::new(writer) as Box<dyn Collector<T>>) as AnyBox
            })
            .collect();
        let readers = ins
            .into_iter()
            .map(|readers| {
                let route = match spec.partitioning {
                    Partitioning::Forward => InflightRoute::Forward,
                    Partitioning::Rebalance => InflightRoute::Rebalance,
                    Partitioning::Broadcast => InflightRoute::Broadcast,
                    Partitioning::KeyBy => InflightRoute::KeyBy {
                        hash: Box::new(hash.clone().expect("a key-by edge has a key hash")),
                        max_parallelism: spec.max_parallelism,
                    },
                };
                Box::new(EdgeInput { readers, route }) as AnyBox
            })
            .collect();
        (writers, readers)
    });
    let entry_bytes = (!std::mem::needs_drop::<T>()).then(std::mem::size_of::<crate::channel::Entry<T>>);
    MakeChannels { make, entry_bytes }
}
