//! [`KeyedStream`]: keyed aggregates, keyed process functions, windows, session windows, and
//! connecting to a second keyed stream or a broadcast stream.
//!
//! May touch: `channel`, `operator`, `persist`, `record`, `sink`, `state`.

use std::path::PathBuf;

use crate::channel::Partitioning;
use crate::operator::keyed::{ByRef, ByValue, KeyedAggregate, KeyedProcess};
use crate::operator::process::{KeyedProcessFunction, KeyedProcessOperator};
use crate::operator::session::SessionSettings;
use crate::operator::window::{Window, WindowSettings};
use crate::persist::Persist;
use crate::pipeline::graph::{channels_of, MakeChannels};
use crate::record::{hash_key, Key, Record, Timestamp};
use crate::sink::{LatestPerKeySink, SinkOperator};

use super::*;

impl<T: Record, K: Key, KF: Fn(&T) -> K + Clone + Send + 'static> KeyedStream<T, KF> {
    pub(super) fn keyed_channels(&self) -> MakeChannels {
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
        let step = move |k: &K, acc: &mut A, r: T| {
            fold(acc, r);
            result(k, acc)
        };
        self.stream.one_input("aggregate", Partitioning::KeyBy, channels, true, move |_, next| {
            Ok(Box::new(KeyedAggregate::new(ByValue(key.clone()), init.clone(), step.clone(), next)))
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
        .named_by_default("reduce")
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
    /// [`KeyedCoProcessFunction`](crate::KeyedCoProcessFunction) then sees both, records of one key in one subtask, with
    /// shared keyed state and timers (Flink's `connect` + `KeyedCoProcessFunction`).
    pub fn connect<B: Record, KB: Fn(&B) -> K + Clone + Send + 'static>(
        self,
        other: KeyedStream<B, KB>,
    ) -> ConnectedStreams<T, B, KF, KB> {
        ConnectedStreams { first: self, second: other }
    }

    /// Connects this keyed stream with `broadcast`, whose every record reaches every subtask:
    /// a [`KeyedBroadcastProcessFunction`](crate::KeyedBroadcastProcessFunction) keeps the broadcast records' effect in
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

impl<T, Q, KF> RefKeyedStream<T, KF, Q>
where
    T: Record,
    Q: ?Sized + std::hash::Hash + Eq + ToOwned + 'static,
    Q::Owned: Key + std::borrow::Borrow<Q>,
    KF: for<'a> Fn(&'a T) -> &'a Q + Clone + Send + 'static,
{
    /// [`KeyedStream::aggregate`], the key borrowed from each record: `result` sees the key as
    /// stored.
    pub fn aggregate<A, O, I, F, R>(self, init: I, fold: F, result: R) -> Stream<O>
    where
        A: Persist + Clone + Send + Sync + 'static,
        O: Record,
        I: Fn() -> A + Clone + Send + 'static,
        F: Fn(&mut A, T) + Clone + Send + 'static,
        R: Fn(&Q::Owned, &A) -> O + Clone + Send + 'static,
    {
        self.stepping(init, move |k: &Q::Owned, acc: &mut A, r: T| {
            fold(acc, r);
            result(k, acc)
        })
    }

    /// A running aggregate whose result is made from the record itself: `fold` updates the
    /// key's accumulator from a reference to the record, then `result` takes the record (by
    /// move) and the accumulator. What the record owns (a word's `String`) goes downstream
    /// without a copy; nothing per record is cloned.
    ///
    /// ```
    /// use weir::{Job, RunConfig, source::Generator};
    /// let job = Job::new("counts");
    /// let counts = job
    ///     .generator(Generator::new(|i, _| format!("word-{}", i % 3)).count(9))
    ///     .key_by_ref(|w: &String| w.as_str())
    ///     .aggregate_with_record(|| 0u64, |c: &mut u64, _w: &String| *c += 1, |w: String, c: &u64| (w, *c))
    ///     .collect();
    /// job.execute(RunConfig::default()).unwrap();
    /// assert!(counts.lock().unwrap().contains(&("word-1".to_string(), 3)));
    /// ```
    pub fn aggregate_with_record<A, O, I, F, R>(self, init: I, fold: F, result: R) -> Stream<O>
    where
        A: Persist + Clone + Send + Sync + 'static,
        O: Record,
        I: Fn() -> A + Clone + Send + 'static,
        F: Fn(&mut A, &T) + Clone + Send + 'static,
        R: Fn(T, &A) -> O + Clone + Send + 'static,
    {
        self.stepping(init, move |_: &Q::Owned, acc: &mut A, r: T| {
            fold(acc, &r);
            result(r, acc)
        })
    }

    /// The keyed aggregate node: `step(key, accumulator, record)` per record.
    fn stepping<A, O, I, S>(self, init: I, step: S) -> Stream<O>
    where
        A: Persist + Clone + Send + Sync + 'static,
        O: Record,
        I: Fn() -> A + Clone + Send + 'static,
        S: Fn(&Q::Owned, &mut A, T) -> O + Clone + Send + 'static,
    {
        let (key, hash) = (self.key.clone(), self.key);
        let channels = channels_of::<T, _>(Some(move |t: &T| hash_key(hash(t))));
        self.stream.one_input("aggregate", Partitioning::KeyBy, channels, true, move |_, next| {
            Ok(Box::new(KeyedAggregate::new(ByRef::new(key.clone()), init.clone(), step.clone(), next)))
        })
    }
}
