//! [`Stream`]'s transformations: naming, parallelism, map, filter, flat_map, side outputs,
//! latency probes, key_by, rebalance, broadcast, union and window joins.
//!
//! May touch: `channel`, `operator`, `record`.

use std::sync::Arc;

use crate::channel::Partitioning;
use crate::operator::join::WindowJoin;
use crate::operator::latency::LatencyProbe;
use crate::operator::side::{OutputTag, Outputs};
use crate::operator::stateless::{Filter, FlatMap, Map, PassThrough};
use crate::operator::window::Window;
use crate::operator::Emitter;
use crate::pipeline::graph::{channels_of, downcast_collector, fan_out_of, NodeKind};
use crate::record::{hash_key, Key, Record, Timestamp};

use super::*;

impl<T> Stream<T> {
    /// Names the operator that produces this stream: its state's key in checkpoints and its
    /// name in errors and metrics. A name another operator of the job has is refused when the
    /// job starts, as Flink refuses a duplicate `uid` (it was renamed silently, and the state
    /// and metrics went under a name nobody gave).
    pub fn named(self, name: &str) -> Self {
        let mut g = self.graph.borrow_mut();
        match g.nodes.iter().enumerate().find(|(i, n)| *i != self.node && &*n.name == name) {
            Some(_) => g.build_errors.push(format!(
                "two operators are named '{name}': a name keys the operator's state in checkpoints and its \
                 metrics, so each operator needs its own"
            )),
            None => g.nodes[self.node].name = name.into(),
        }
        drop(g);
        self
    }

    /// Gives the operator weir's own name for it (`generator`, `text`, …), made unique with
    /// its node number where the job has that name already: a job of two generators is no
    /// user's duplicate.
    pub(crate) fn named_by_default(self, name: &str) -> Self {
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

impl<T: Record> Stream<T> {
    /// The side output `tag` of the operator that produces this stream (a
    /// [`KeyedStream::keyed_process`] function's `ctx.output`, a window's late records). An
    /// operator without side outputs is refused when the job starts.
    pub fn side_output<X: Record>(&self, tag: &OutputTag<X>) -> Stream<X> {
        let port = {
            let mut g = self.graph.borrow_mut();
            let known = g.tags.iter().find(|(n, _, _)| Arc::ptr_eq(n, &tag.name)).map(|(_, t, _)| *t);
            let node = &mut g.nodes[self.node];
            let name = Arc::clone(&node.name);
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
                    node.side_ports.push(crate::pipeline::graph::side_port_of::<X>(Arc::clone(&tag.name)));
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

    /// Records each record's latency (now minus `created_ns`, on the job clock) in the job's
    /// latency histogram.
    pub fn measure_latency<F: Fn(&T) -> u64 + Clone + Send + 'static>(self, created_ns: F) -> Stream<T> {
        self.forward("latency", move |ctx, next| Ok(Box::new(LatencyProbe::new(created_ns.clone(), ctx.clone(), next))))
    }

    /// Partitions the stream by key.
    pub fn key_by<K: Key, KF: Fn(&T) -> K + Clone + Send + 'static>(self, key: KF) -> KeyedStream<T, KF> {
        KeyedStream { stream: self, key }
    }

    /// Partitions the stream by a key borrowed from each record, for running aggregates: the
    /// key-by hashes the borrowed key and the state looks it up by it, so an owned key (the
    /// `String` a record carries) is copied once, when it is first stored, not for every
    /// record as with [`Stream::key_by`] (whose function must return the key).
    ///
    /// ```
    /// use weir::{Job, RunConfig, source::Generator};
    /// let job = Job::new("counts");
    /// let counts = job
    ///     .generator(Generator::new(|i, _| format!("word-{}", i % 3)).count(9))
    ///     .key_by_ref(|w: &String| w.as_str())
    ///     .aggregate(|| 0u64, |c: &mut u64, _w| *c += 1, |w: &String, c: &u64| (w.clone(), *c))
    ///     .collect();
    /// job.execute(RunConfig::default()).unwrap();
    /// let mut counts = counts.lock().unwrap().clone();
    /// counts.sort();
    /// assert_eq!(counts.last(), Some(&("word-2".to_string(), 3)));
    /// ```
    pub fn key_by_ref<Q, KF>(self, key: KF) -> RefKeyedStream<T, KF, Q>
    where
        Q: ?Sized + std::hash::Hash + Eq + ToOwned + 'static,
        Q::Owned: Key + std::borrow::Borrow<Q>,
        KF: for<'a> Fn(&'a T) -> &'a Q + Clone + Send + 'static,
    {
        RefKeyedStream { stream: self, key, _key: std::marker::PhantomData }
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
}
