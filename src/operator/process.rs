//! Keyed process functions with a context (Flink's `KeyedProcessFunction`): per record and per
//! timer, the user's function sees the current key, keyed state scoped to it, the current
//! watermark and processing time, registers and deletes timers for the key, and emits to the
//! main output and to side outputs. State, timers and the watermark are one snapshot.
//!
//! Timers in event time fire when a watermark reaches them, before the watermark goes on (so
//! what they emit is not late downstream); at the end of input every event-time timer fires.
//! Timers in processing time fire when the task next runs after their time (a task runs at
//! least every millisecond while the job runs); at the end of input those not yet due are
//! dropped, as in Flink.

use super::side::{OutputTag, Outputs};
use crate::collector::Collector;
use crate::context::{Clock, TaskContext};
use crate::error::Result;
use crate::persist::from_bytes;
use crate::record::{Key, KeyScope, Timestamp};
use crate::snapshot::{ForkedState, PersistedFork};
use crate::state::{KeyedState, ScopedState, Snapshot, TimeDomain, TimerService};

/// A function over a keyed stream with state and timers, called for every record and every
/// timer that fires. Made once per subtask by cloning the one given to
/// [`crate::KeyedStream::keyed_process`].
///
/// ```
/// use weir::{Job, RunConfig, source::Generator};
/// use weir::operator::process::{KeyedContext, KeyedProcessFunction};
/// use weir::state::{KeyedValueState, TimeDomain};
///
/// /// Emits (key, count) once a key has been quiet for 100 units of event time.
/// #[derive(Clone)]
/// struct CountUntilQuiet;
/// impl KeyedProcessFunction<u64, (u64, u64)> for CountUntilQuiet {
///     type Out = (u64, u64);
///     type State = KeyedValueState<u64, (u64, u64)>; // (count, last timestamp)
///     fn state(&self) -> Self::State {
///         KeyedValueState::new()
///     }
///     fn process(&mut self, (_, ts): (u64, u64), ctx: &mut KeyedContext<'_, u64, Self::State, Self::Out>) {
///         let mut s = ctx.state();
///         let (count, last) = s.get_or_insert_with(|| (0, 0));
///         *count += 1;
///         *last = ts;
///         ctx.register_event_time_timer(ts + 100);
///     }
///     fn on_timer(&mut self, ts: u64, _: TimeDomain, ctx: &mut KeyedContext<'_, u64, Self::State, Self::Out>) {
///         let key = *ctx.key();
///         let mut s = ctx.state();
///         if let Some(&(count, last)) = s.get() {
///             if last + 100 == ts {
///                 s.clear();
///                 ctx.emit((key, count));
///             }
///         }
///     }
/// }
///
/// let job = Job::new("quiet");
/// let out = job
///     .generator(Generator::new(|i, _| (i % 2, i * 10)).count(10))
///     .with_watermarks(|e: &(u64, u64)| e.1, 0)
///     .key_by(|e: &(u64, u64)| e.0)
///     .keyed_process(CountUntilQuiet)
///     .collect();
/// job.execute(RunConfig::default()).unwrap();
/// let mut got = out.lock().unwrap().clone();
/// got.sort();
/// assert_eq!(got, vec![(0, 5), (1, 5)]);
/// ```
pub trait KeyedProcessFunction<K, T>: Send + 'static {
    /// What it emits on the main output.
    type Out;
    /// Its keyed state (a built-in kind, a pair of them, or `()`), seen through the current key.
    type State: ScopedState<K>;
    /// Empty state for a new subtask.
    fn state(&self) -> Self::State;
    /// Called for every record, with the record's key as the current key.
    fn process(&mut self, record: T, ctx: &mut KeyedContext<'_, K, Self::State, Self::Out>);
    /// Called when a timer of the current key fires (`timestamp` is the time it was set for).
    fn on_timer(
        &mut self,
        timestamp: Timestamp,
        domain: TimeDomain,
        ctx: &mut KeyedContext<'_, K, Self::State, Self::Out>,
    ) {
        let _ = (timestamp, domain, ctx);
    }
}

/// What a [`KeyedProcessFunction`] sees: the current key and everything scoped to it. Timers
/// exist only here, so a timer cannot be set outside a keyed context.
pub struct KeyedContext<'a, K, S, O> {
    key: &'a K,
    state: &'a mut S,
    timers: &'a mut TimerService<K>,
    out: &'a mut Vec<O>,
    sides: &'a mut super::side::SideOutputs,
    watermark: Option<Timestamp>,
    clock: &'a Clock,
}

impl<'a, K: Key, S: ScopedState<K>, O> KeyedContext<'a, K, S, O> {
    /// The current key.
    pub fn key(&self) -> &K {
        self.key
    }
    /// The state, seen through the current key.
    pub fn state(&mut self) -> S::View<'_> {
        self.state.scoped(self.key)
    }
    /// Emits a record on the main output.
    pub fn emit(&mut self, record: O) {
        self.out.push(record);
    }
    /// Emits a record on the side output `tag` (see [`crate::Job::output_tag`]).
    pub fn output<X: 'static>(&mut self, tag: &OutputTag<X>, record: X) {
        self.sides.emit(tag, record);
    }
    /// The operator's current watermark (`None` before the first).
    pub fn current_watermark(&self) -> Option<Timestamp> {
        self.watermark
    }
    /// Processing time, in milliseconds (see [`crate::context::Clock::processing_time_ms`]).
    pub fn current_processing_time(&self) -> Timestamp {
        self.clock.processing_time_ms()
    }
    /// Sets a timer for the current key at event time `ts` (once per key and time).
    pub fn register_event_time_timer(&mut self, ts: Timestamp) {
        self.timers.register(TimeDomain::EventTime, self.key, ts);
    }
    /// Removes the current key's event-time timer at `ts`, if set.
    pub fn delete_event_time_timer(&mut self, ts: Timestamp) {
        self.timers.delete(TimeDomain::EventTime, self.key, ts);
    }
    /// Sets a timer for the current key at processing time `ts` (milliseconds).
    pub fn register_processing_time_timer(&mut self, ts: Timestamp) {
        self.timers.register(TimeDomain::ProcessingTime, self.key, ts);
    }
    /// Removes the current key's processing-time timer at `ts`, if set.
    pub fn delete_processing_time_timer(&mut self, ts: Timestamp) {
        self.timers.delete(TimeDomain::ProcessingTime, self.key, ts);
    }
}

/// The operator's watermark as state: restored with the rest (the least of the old subtasks'
/// after a rescale, so nothing fires early).
pub(crate) struct EventTime(pub(crate) Option<Timestamp>);

impl Snapshot for EventTime {
    fn fork(&mut self) -> Box<dyn ForkedState> {
        Box::new(PersistedFork(self.0))
    }
    fn restore(&mut self, bytes: &[u8]) -> Result<()> {
        self.0 = from_bytes(bytes)?;
        Ok(())
    }
}

impl KeyedState for EventTime {
    fn restore_owned(&mut self, parts: &[&[u8]], _scope: &KeyScope) -> Result<()> {
        let marks: Vec<Option<Timestamp>> = parts.iter().map(|b| from_bytes(b)).collect::<Result<_>>()?;
        self.0 = super::window::merged_watermark(marks.into_iter());
        Ok(())
    }
}

/// What a keyed process operator snapshots: the function's state, the timers, the watermark.
type Held<S, K> = (S, (TimerService<K>, EventTime));

pub(crate) struct KeyedProcessOperator<T, K, P: KeyedProcessFunction<K, T>, KF> {
    key: KF,
    f: P,
    held: Held<P::State, K>,
    out: Vec<P::Out>,
    outputs: Outputs<P::Out>,
    clock: Clock,
    _input: std::marker::PhantomData<fn(T)>,
}

impl<T, K: Key, P: KeyedProcessFunction<K, T>, KF> KeyedProcessOperator<T, K, P, KF> {
    pub(crate) fn new(ctx: &TaskContext, key: KF, f: P, outputs: Outputs<P::Out>) -> Result<Self> {
        let state = f.state();
        state.check()?;
        Ok(KeyedProcessOperator {
            key,
            f,
            held: (state, (TimerService::new(), EventTime(None))),
            out: Vec::new(),
            outputs,
            clock: ctx.clock.clone(),
            _input: std::marker::PhantomData,
        })
    }

    /// Fires every timer of `domain` at or before `upto` (including those the timers set).
    fn fire(&mut self, domain: TimeDomain, upto: Timestamp) {
        let (state, (timers, watermark)) = &mut self.held;
        let mut scope = TimerScope::new(state, timers, &mut self.out, &mut self.outputs, &self.clock);
        let f = &mut self.f;
        scope.fire(domain, upto, watermark.0, |ts, ctx| f.on_timer(ts, domain, ctx));
    }

    fn fire_processing_time(&mut self) -> Result<()> {
        if due_processing_time(&mut self.held.1 .0, &self.clock) {
            self.fire(TimeDomain::ProcessingTime, self.clock.processing_time_ms());
            self.outputs.batch(&mut self.out)?;
        }
        Ok(())
    }
}

/// Whether a processing-time timer is due.
#[inline]
pub(crate) fn due_processing_time<K: Key>(timers: &mut TimerService<K>, clock: &Clock) -> bool {
    timers.next(TimeDomain::ProcessingTime).is_some_and(|t| t <= clock.processing_time_ms())
}

/// What firing timers needs of a keyed operator (every keyed function operator has these).
pub(crate) struct TimerScope<'a, K, S, O> {
    /// Processing time when the scope was made (what expiring state counts in).
    pub(crate) now: Timestamp,
    pub(crate) state: &'a mut S,
    pub(crate) timers: &'a mut TimerService<K>,
    pub(crate) out: &'a mut Vec<O>,
    pub(crate) outputs: &'a mut Outputs<O>,
    pub(crate) clock: &'a Clock,
}

impl<'a, K: Key, S: ScopedState<K>, O> TimerScope<'a, K, S, O> {
    pub(crate) fn new(
        state: &'a mut S,
        timers: &'a mut TimerService<K>,
        out: &'a mut Vec<O>,
        outputs: &'a mut Outputs<O>,
        clock: &'a Clock,
    ) -> Self {
        TimerScope { now: clock.processing_time_ms(), state, timers, out, outputs, clock }
    }

    /// Fires every timer of `domain` at or before `upto`, earliest first (including those the
    /// timers themselves set), each with its key as the current key.
    pub(crate) fn fire(
        &mut self,
        domain: TimeDomain,
        upto: Timestamp,
        watermark: Option<Timestamp>,
        mut on_timer: impl FnMut(Timestamp, &mut KeyedContext<'_, K, S, O>),
    ) {
        while let Some((ts, key)) = self.timers.pop_due(domain, upto) {
            let mut ctx = self.context(&key, watermark);
            on_timer(ts, &mut ctx);
        }
    }

    /// The context of `key`.
    pub(crate) fn context<'k>(&'k mut self, key: &'k K, watermark: Option<Timestamp>) -> KeyedContext<'k, K, S, O> {
        self.state.advance_time(self.now, watermark);
        KeyedContext {
            key,
            state: self.state,
            timers: self.timers,
            out: self.out,
            sides: &mut self.outputs.sides,
            watermark,
            clock: self.clock,
        }
    }
}

impl<T, K, P, KF> Collector<T> for KeyedProcessOperator<T, K, P, KF>
where
    T: Send,
    K: Key,
    P: KeyedProcessFunction<K, T>,
    P::Out: Send,
    KF: Fn(&T) -> K + Send,
{
    fn batch(&mut self, records: &mut Vec<T>) -> Result<()> {
        let (state, (timers, watermark)) = &mut self.held;
        let mut scope = TimerScope::new(state, timers, &mut self.out, &mut self.outputs, &self.clock);
        let (f, key_of, watermark) = (&mut self.f, &self.key, watermark.0);
        crate::collector::move_each(records, |r, _| {
            let key = key_of(&r);
            f.process(r, &mut scope.context(&key, watermark));
        });
        self.outputs.batch(&mut self.out)?;
        self.fire_processing_time()
    }

    fn watermark(&mut self, wm: Timestamp) -> Result<()> {
        self.held.1 .1 .0 = Some(wm);
        self.fire(TimeDomain::EventTime, wm);
        self.outputs.batch(&mut self.out)?;
        self.outputs.watermark(wm)
    }

    fn end(&mut self) -> Result<()> {
        if self.held.1 .1 .0 != Some(Timestamp::MAX) {
            self.watermark(Timestamp::MAX)?;
        }
        self.outputs.end()
    }

    fn drain(&mut self) -> Result<bool> {
        // Called on every poll of the task, input or not: where processing time advances.
        self.fire_processing_time()?;
        self.outputs.drain()
    }
    super::forward_barriers!(outputs);
    super::keyed_state_checkpointing!(held);
}

// Their fields are closures, shared internals or whole state: a name says enough.
crate::debug_as_name!(['a, K, S, O] KeyedContext<'a, K, S, O>);
