//! The builder API: [`Job`], [`Stream`], [`KeyedStream`], [`WindowedStream`],
//! [`SessionWindowedStream`], [`ConnectedStreams`], [`BroadcastConnectedStream`],
//! [`LineStream`]: the types here, their methods in a file per builder concept.
//!
//! Every call records a node in the job graph together with type-erased constructors made
//! where the record types are known ([`nodes`]); nothing runs until the job is started.
//!
//! May touch: `barrier`, `channel`, `collector`, `context`, `error`, `operator`, `persist`,
//! `record`, `sink`, `snapshot`, `source`, `checkpoint`, `state`.

mod connected;
mod job;
mod keyed;
mod lines;
mod nodes;
mod sinks;
mod stream;
mod watermarks;
mod windowed;

use nodes::*;

use std::marker::PhantomData;
use std::sync::Arc;

use super::graph::{MakeChannels, SharedGraph};
use crate::channel::Partitioning;
use crate::operator::session::SessionSettings;
use crate::operator::window::{Window, WindowSettings};
use crate::source::TextSource;

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
        Stream { graph: Arc::clone(&self.graph), node: self.node, _t: PhantomData }
    }
}

/// A stream partitioned by key: the input of keyed operators ([`Stream::key_by`]).
///
/// ```
/// use weir::{source::Generator, Job, RunConfig};
/// let job = Job::new("sums").with_parallelism(2);
/// // A running sum per key: every record's key decides the subtask that keeps its state.
/// let sums = job
///     .generator(Generator::new(|i, _| (i % 3, i)).count(30))
///     .key_by(|&(k, _)| k)
///     .reduce(|a, b| (a.0, a.1 + b.1))
///     .collect();
/// job.execute(RunConfig::default().workers(2)).unwrap();
/// let last: u64 = sums.lock().unwrap().iter().filter(|(k, _)| *k == 0).map(|&(_, s)| s).max().unwrap();
/// assert_eq!(last, (0..30u64).filter(|i| i % 3 == 0).sum::<u64>());
/// ```
pub struct KeyedStream<T, KF> {
    stream: Stream<T>,
    key: KF,
}

/// A stream keyed by a key borrowed from each record ([`Stream::key_by_ref`]): running
/// aggregates whose owned key (a `String`, say) is copied only when it is new to the state, not
/// once per record as a `key_by` function returning it must.
pub struct RefKeyedStream<T, KF, Q: ?Sized> {
    stream: Stream<T>,
    key: KF,
    _key: std::marker::PhantomData<fn(&Q)>,
}

/// A keyed stream with event-time (or processing-time) windows.
pub struct WindowedStream<T, KF, TF> {
    keyed: KeyedStream<T, KF>,
    window: Window,
    timestamp: TF,
    settings: WindowSettings<T>,
}

/// Two keyed streams with the same key type, connected for a [`KeyedCoProcessFunction`](crate::KeyedCoProcessFunction)
/// ([`KeyedStream::connect`]).
pub struct ConnectedStreams<A, B, KA, KB> {
    first: KeyedStream<A, KA>,
    second: KeyedStream<B, KB>,
}

/// A keyed stream connected with a broadcast stream, for a
/// [`KeyedBroadcastProcessFunction`](crate::KeyedBroadcastProcessFunction) ([`KeyedStream::connect_broadcast`]).
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

// Their fields are closures, shared internals or whole state: a name says enough.
crate::debug_as_name!([T] Stream<T>);
crate::debug_as_name!([T, KF] KeyedStream<T, KF>);
impl<T, KF, Q: ?Sized> std::fmt::Debug for RefKeyedStream<T, KF, Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RefKeyedStream")
    }
}
crate::debug_as_name!([T, KF, TF] WindowedStream<T, KF, TF>);
crate::debug_as_name!([A, B, KA, KB] ConnectedStreams<A, B, KA, KB>);
crate::debug_as_name!([T, B, KF] BroadcastConnectedStream<T, B, KF>);
crate::debug_as_name!([T, KF, TF] SessionWindowedStream<T, KF, TF>);
crate::debug_as_name!([] LineStream);
