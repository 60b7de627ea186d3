//! Two-input keyed functions: [`KeyedCoProcessFunction`] over two streams connected by key
//! (Flink's `KeyedCoProcessFunction`: one keyed state and one set of timers shared by both
//! inputs, the watermark the least of the two), and [`KeyedBroadcastProcessFunction`] over a
//! keyed stream and a broadcast one (Flink's broadcast state pattern: every subtask receives
//! every broadcast record and keeps the same [`BroadcastState`], which the keyed side reads).
//!
//! Broadcast state is in every subtask's snapshot; a restore at another parallelism gives every
//! new subtask the state of old subtask 0 (all old subtasks held the same). The broadcast
//! input's watermarks do not hold back event time: a rules stream rarely has any.

use super::process::{due_processing_time, EventTime, KeyedContext, TimerScope};
use super::side::Outputs;
use super::TwoInputOperator;
use crate::collector::Collector;
use crate::context::{Clock, TaskContext};
use crate::error::Result;
use crate::persist::{from_bytes, Persist};
use crate::record::{Key, KeyScope, Timestamp};
use crate::snapshot::{Barrier, ForkedState};
use crate::state::{KeyedState, PagedMap, ScopedState, Snapshot, TimeDomain, TimerService};

/// A function over two keyed streams with the same key type, sharing keyed state and timers.
/// Made once per subtask by cloning the one given to [`crate::ConnectedStreams::process`].
pub trait KeyedCoProcessFunction<K, A, B>: Send + 'static {
    /// What it emits.
    type Out;
    /// Its keyed state, seen through the current key by both inputs.
    type State: ScopedState<K>;
    /// Empty state for a new subtask.
    fn state(&self) -> Self::State;
    /// A record of the first stream.
    fn process1(&mut self, record: A, ctx: &mut KeyedContext<'_, K, Self::State, Self::Out>);
    /// A record of the second stream.
    fn process2(&mut self, record: B, ctx: &mut KeyedContext<'_, K, Self::State, Self::Out>);
    /// A timer of the current key fires.
    fn on_timer(
        &mut self,
        timestamp: Timestamp,
        domain: TimeDomain,
        ctx: &mut KeyedContext<'_, K, Self::State, Self::Out>,
    ) {
        let _ = (timestamp, domain, ctx);
    }
}

/// State every subtask of a broadcast-connected operator holds in full: a map written by the
/// broadcast side and read by the keyed side.
pub struct BroadcastState<BK, BV> {
    map: PagedMap<BK, BV>,
}

impl<BK: Key, BV: Clone + Persist> Default for BroadcastState<BK, BV> {
    fn default() -> Self {
        BroadcastState { map: PagedMap::new() }
    }
}

impl<BK: Key, BV: Clone + Persist> BroadcastState<BK, BV> {
    /// The value of `key`.
    pub fn get(&self, key: &BK) -> Option<&BV> {
        self.map.get(key)
    }
    /// Sets `key`.
    pub fn put(&mut self, key: BK, value: BV) {
        self.map.insert(key, value)
    }
    /// Removes `key`.
    pub fn remove(&mut self, key: &BK) -> Option<BV> {
        self.map.remove(key)
    }
    /// Every entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&BK, &BV)> {
        self.map.iter()
    }
    /// Entries.
    pub fn len(&self) -> usize {
        self.map.len()
    }
    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

impl<BK: Key, BV: Persist + Clone + Send + Sync + 'static> Snapshot for BroadcastState<BK, BV> {
    fn fork(&mut self) -> Box<dyn ForkedState> {
        crate::state::fork_paged(&mut self.map)
    }
    fn restore(&mut self, bytes: &[u8]) -> Result<()> {
        self.map = from_bytes::<crate::state::PagedImage<BK, BV>>(bytes)?.into_map();
        Ok(())
    }
}

impl<BK: Key, BV: Persist + Clone + Send + Sync + 'static> KeyedState for BroadcastState<BK, BV> {
    /// Every old subtask held the same broadcast state: take the first one's, whole.
    fn restore_owned(&mut self, parts: &[&[u8]], _scope: &KeyScope) -> Result<()> {
        match parts.first() {
            Some(first) => self.restore(first),
            None => Ok(()),
        }
    }
}

/// What the broadcast side of a [`KeyedBroadcastProcessFunction`] sees: the broadcast state to
/// change, and the outputs (there is no current key).
pub struct BroadcastContext<'a, BK, BV, O> {
    state: &'a mut BroadcastState<BK, BV>,
    out: &'a mut Vec<O>,
    sides: &'a mut super::side::SideOutputs,
    watermark: Option<Timestamp>,
}

impl<BK, BV, O> BroadcastContext<'_, BK, BV, O> {
    /// The broadcast state (the same in every subtask, if every subtask changes it alike).
    pub fn state(&mut self) -> &mut BroadcastState<BK, BV> {
        self.state
    }
    /// Emits a record.
    pub fn emit(&mut self, record: O) {
        self.out.push(record)
    }
    /// Emits a record to the side output `tag`.
    pub fn output<X: 'static>(&mut self, tag: &super::side::OutputTag<X>, record: X) {
        self.sides.emit(tag, record)
    }
    /// The keyed side's watermark.
    pub fn current_watermark(&self) -> Option<Timestamp> {
        self.watermark
    }
}

/// A function over a keyed stream and a broadcast stream (rules, say): the broadcast side
/// writes [`BroadcastState`], which every subtask holds, and the keyed side reads it beside
/// its own keyed state and timers. Changes to broadcast state must depend only on the
/// broadcast records (every subtask sees them in the same order), so every subtask's state
/// stays the same.
pub trait KeyedBroadcastProcessFunction<K, T, B>: Send + 'static {
    /// What it emits.
    type Out;
    /// Its keyed state.
    type State: ScopedState<K>;
    /// The broadcast state's key.
    type BroadcastKey: Key;
    /// The broadcast state's value.
    type BroadcastValue: Persist + Clone + Send + Sync + 'static;
    /// Empty keyed state for a new subtask.
    fn state(&self) -> Self::State;
    /// A record of the keyed stream, with the broadcast state to read.
    fn process(
        &mut self,
        record: T,
        broadcast: &BroadcastState<Self::BroadcastKey, Self::BroadcastValue>,
        ctx: &mut KeyedContext<'_, K, Self::State, Self::Out>,
    );
    /// A record of the broadcast stream.
    fn process_broadcast(
        &mut self,
        record: B,
        ctx: &mut BroadcastContext<'_, Self::BroadcastKey, Self::BroadcastValue, Self::Out>,
    );
    /// A timer of the current key fires.
    fn on_timer(
        &mut self,
        timestamp: Timestamp,
        domain: TimeDomain,
        broadcast: &BroadcastState<Self::BroadcastKey, Self::BroadcastValue>,
        ctx: &mut KeyedContext<'_, K, Self::State, Self::Out>,
    ) {
        let _ = (timestamp, domain, broadcast, ctx);
    }
}

/// Calls `f` for every record with its key's context.
fn each_with_context<R, K: Key, S: ScopedState<K>, O>(
    records: &mut Vec<R>,
    key_of: &impl Fn(&R) -> K,
    scope: &mut TimerScope<'_, K, S, O>,
    watermark: Option<Timestamp>,
    mut f: impl FnMut(R, &mut KeyedContext<'_, K, S, O>),
) {
    crate::collector::move_each(records, |r, _| {
        let key = key_of(&r);
        f(r, &mut scope.context(&key, watermark));
    });
}

/// The snapshot of a co-process operator: keyed state, timers, each input's watermark.
type CoHeld<S, K> = (S, (TimerService<K>, (EventTime, EventTime)));

pub(crate) struct CoProcessOperator<A, B, K, P: KeyedCoProcessFunction<K, A, B>, KA, KB> {
    key1: KA,
    key2: KB,
    f: P,
    held: CoHeld<P::State, K>,
    /// The watermark sent on (the least of the inputs').
    emitted: Option<Timestamp>,
    ended: [bool; 2],
    out: Vec<P::Out>,
    outputs: Outputs<P::Out>,
    clock: Clock,
    _inputs: std::marker::PhantomData<fn(A, B)>,
}

impl<A, B, K: Key, P: KeyedCoProcessFunction<K, A, B>, KA, KB> CoProcessOperator<A, B, K, P, KA, KB> {
    pub(crate) fn new(ctx: &TaskContext, key1: KA, key2: KB, f: P, outputs: Outputs<P::Out>) -> Result<Self> {
        let state = f.state();
        state.check()?;
        Ok(CoProcessOperator {
            key1,
            key2,
            f,
            held: (state, (TimerService::new(), (EventTime(None), EventTime(None)))),
            emitted: None,
            ended: [false; 2],
            out: Vec::new(),
            outputs,
            clock: ctx.clock.clone(),
            _inputs: std::marker::PhantomData,
        })
    }

    fn watermark(&self) -> Option<Timestamp> {
        let (a, b) = &self.held.1 .1;
        Some(a.0?.min(b.0?))
    }

    fn fire(&mut self, domain: TimeDomain, upto: Timestamp) -> Result<()> {
        let watermark = self.watermark();
        let (state, (timers, _)) = &mut self.held;
        let mut scope = TimerScope::new(state, timers, &mut self.out, &mut self.outputs, &self.clock);
        let f = &mut self.f;
        scope.fire(domain, upto, watermark, |ts, ctx| f.on_timer(ts, domain, ctx));
        self.outputs.batch(&mut self.out)
    }

    /// An input's watermark moved: fire what the least of both reaches, and send it on.
    fn advance(&mut self) -> Result<()> {
        let Some(wm) = self.watermark() else { return Ok(()) };
        if self.emitted.is_some_and(|e| wm <= e) {
            return Ok(());
        }
        self.emitted = Some(wm);
        self.fire(TimeDomain::EventTime, wm)?;
        self.outputs.watermark(wm)
    }

    fn processing_time(&mut self) -> Result<()> {
        if due_processing_time(&mut self.held.1 .0, &self.clock) {
            self.fire(TimeDomain::ProcessingTime, self.clock.processing_time_ms())?;
        }
        Ok(())
    }
}

impl<A, B, K, P, KA, KB> TwoInputOperator<A, B> for CoProcessOperator<A, B, K, P, KA, KB>
where
    A: Send,
    B: Send,
    K: Key,
    P: KeyedCoProcessFunction<K, A, B>,
    P::Out: Send,
    KA: Fn(&A) -> K + Send,
    KB: Fn(&B) -> K + Send,
{
    fn batch1(&mut self, records: &mut Vec<A>) -> Result<()> {
        let watermark = self.watermark();
        let (state, (timers, _)) = &mut self.held;
        let mut scope = TimerScope::new(state, timers, &mut self.out, &mut self.outputs, &self.clock);
        let f = &mut self.f;
        each_with_context(records, &self.key1, &mut scope, watermark, |r, ctx| f.process1(r, ctx));
        self.outputs.batch(&mut self.out)?;
        self.processing_time()
    }
    fn batch2(&mut self, records: &mut Vec<B>) -> Result<()> {
        let watermark = self.watermark();
        let (state, (timers, _)) = &mut self.held;
        let mut scope = TimerScope::new(state, timers, &mut self.out, &mut self.outputs, &self.clock);
        let f = &mut self.f;
        each_with_context(records, &self.key2, &mut scope, watermark, |r, ctx| f.process2(r, ctx));
        self.outputs.batch(&mut self.out)?;
        self.processing_time()
    }
    fn watermark1(&mut self, watermark: Timestamp) -> Result<()> {
        self.held.1 .1 .0 = EventTime(Some(watermark));
        self.advance()
    }
    fn watermark2(&mut self, watermark: Timestamp) -> Result<()> {
        self.held.1 .1 .1 = EventTime(Some(watermark));
        self.advance()
    }
    fn end1(&mut self) -> Result<()> {
        self.ended[0] = true;
        self.watermark1(Timestamp::MAX)?;
        self.end_if_both()
    }
    fn end2(&mut self) -> Result<()> {
        self.ended[1] = true;
        self.watermark2(Timestamp::MAX)?;
        self.end_if_both()
    }
    fn drain(&mut self) -> Result<bool> {
        self.processing_time()?;
        self.outputs.drain()
    }
    super::forward_barriers!(outputs);
    fn snapshot_state(&mut self, _: &Barrier) -> Result<Option<Box<dyn ForkedState>>> {
        Ok(Some(self.held.fork()))
    }
    fn restore_state(&mut self, bytes: &[u8]) -> Result<()> {
        self.held.restore(bytes)?;
        self.emitted = self.watermark();
        Ok(())
    }
    fn restore_rescaled(&mut self, parts: &[(usize, &[u8])], scope: &KeyScope) -> Result<()> {
        let parts: Vec<&[u8]> = parts.iter().map(|(_, b)| *b).collect();
        self.held.restore_owned(&parts, scope)?;
        self.emitted = self.watermark();
        Ok(())
    }
}

impl<A, B, K: Key, P: KeyedCoProcessFunction<K, A, B>, KA, KB> CoProcessOperator<A, B, K, P, KA, KB> {
    fn end_if_both(&mut self) -> Result<()> {
        if self.ended == [true, true] {
            self.outputs.end()?;
        }
        Ok(())
    }
}

/// The snapshot of a broadcast-connected operator: keyed state, timers, the keyed side's
/// watermark, the broadcast state.
type BroadcastHeld<S, K, BK, BV> = (S, (TimerService<K>, (EventTime, BroadcastState<BK, BV>)));

pub(crate) struct BroadcastProcessOperator<T, B, K, P: KeyedBroadcastProcessFunction<K, T, B>, KF> {
    key: KF,
    f: P,
    held: BroadcastHeld<P::State, K, P::BroadcastKey, P::BroadcastValue>,
    ended: [bool; 2],
    out: Vec<P::Out>,
    outputs: Outputs<P::Out>,
    clock: Clock,
    _inputs: std::marker::PhantomData<fn(T, B)>,
}

impl<T, B, K: Key, P: KeyedBroadcastProcessFunction<K, T, B>, KF> BroadcastProcessOperator<T, B, K, P, KF> {
    pub(crate) fn new(ctx: &TaskContext, key: KF, f: P, outputs: Outputs<P::Out>) -> Result<Self> {
        let state = f.state();
        state.check()?;
        Ok(BroadcastProcessOperator {
            key,
            f,
            held: (state, (TimerService::new(), (EventTime(None), BroadcastState::default()))),
            ended: [false; 2],
            out: Vec::new(),
            outputs,
            clock: ctx.clock.clone(),
            _inputs: std::marker::PhantomData,
        })
    }

    fn fire(&mut self, domain: TimeDomain, upto: Timestamp) -> Result<()> {
        let (state, (timers, (watermark, broadcast))) = &mut self.held;
        let mut scope = TimerScope::new(state, timers, &mut self.out, &mut self.outputs, &self.clock);
        let f = &mut self.f;
        let broadcast = &*broadcast;
        scope.fire(domain, upto, watermark.0, |ts, ctx| f.on_timer(ts, domain, broadcast, ctx));
        self.outputs.batch(&mut self.out)
    }

    fn processing_time(&mut self) -> Result<()> {
        if due_processing_time(&mut self.held.1 .0, &self.clock) {
            self.fire(TimeDomain::ProcessingTime, self.clock.processing_time_ms())?;
        }
        Ok(())
    }

    fn end_if_both(&mut self) -> Result<()> {
        if self.ended == [true, true] {
            self.outputs.end()?;
        }
        Ok(())
    }
}

impl<T, B, K, P, KF> TwoInputOperator<T, B> for BroadcastProcessOperator<T, B, K, P, KF>
where
    T: Send,
    B: Send,
    K: Key,
    P: KeyedBroadcastProcessFunction<K, T, B>,
    P::Out: Send,
    KF: Fn(&T) -> K + Send,
{
    fn batch1(&mut self, records: &mut Vec<T>) -> Result<()> {
        let (state, (timers, (watermark, broadcast))) = &mut self.held;
        let mut scope = TimerScope::new(state, timers, &mut self.out, &mut self.outputs, &self.clock);
        let (f, broadcast) = (&mut self.f, &*broadcast);
        each_with_context(records, &self.key, &mut scope, watermark.0, |r, ctx| f.process(r, broadcast, ctx));
        self.outputs.batch(&mut self.out)?;
        self.processing_time()
    }
    fn batch2(&mut self, records: &mut Vec<B>) -> Result<()> {
        let (_, (_, (watermark, broadcast))) = &mut self.held;
        let mut ctx = BroadcastContext {
            state: broadcast,
            out: &mut self.out,
            sides: &mut self.outputs.sides,
            watermark: watermark.0,
        };
        for r in records.drain(..) {
            self.f.process_broadcast(r, &mut ctx);
        }
        self.outputs.batch(&mut self.out)
    }
    fn watermark1(&mut self, wm: Timestamp) -> Result<()> {
        self.held.1 .1 .0 = EventTime(Some(wm));
        self.fire(TimeDomain::EventTime, wm)?;
        self.outputs.watermark(wm)
    }
    fn watermark2(&mut self, _watermark: Timestamp) -> Result<()> {
        Ok(())
    }
    fn end1(&mut self) -> Result<()> {
        if self.held.1 .1 .0 .0 != Some(Timestamp::MAX) {
            self.watermark1(Timestamp::MAX)?;
        }
        self.ended[0] = true;
        self.end_if_both()
    }
    fn end2(&mut self) -> Result<()> {
        self.ended[1] = true;
        self.end_if_both()
    }
    fn drain(&mut self) -> Result<bool> {
        self.processing_time()?;
        self.outputs.drain()
    }
    super::forward_barriers!(outputs);
    fn snapshot_state(&mut self, _: &Barrier) -> Result<Option<Box<dyn ForkedState>>> {
        Ok(Some(self.held.fork()))
    }
    fn restore_state(&mut self, bytes: &[u8]) -> Result<()> {
        self.held.restore(bytes)
    }
    fn restore_rescaled(&mut self, parts: &[(usize, &[u8])], scope: &KeyScope) -> Result<()> {
        // Old subtask 0's part first, so the broadcast state restored is its.
        let mut parts = parts.to_vec();
        parts.sort_by_key(|(subtask, _)| *subtask);
        let parts: Vec<&[u8]> = parts.iter().map(|(_, b)| *b).collect();
        self.held.restore_owned(&parts, scope)
    }
}

// Their fields are closures, shared internals or whole state: a name says enough.
crate::debug_as_name!([BK, BV] BroadcastState<BK, BV>);
crate::debug_as_name!(['a, BK, BV, O] BroadcastContext<'a, BK, BV, O>);
