//! Keyed event-time session windows (Flink's `EventTimeSessionWindows.withGap`): a key's
//! records less than `gap` apart are one session, `[first, last + gap)` (records exactly `gap`
//! apart are two, where Flink merges windows that only touch). A record that bridges
//! two sessions merges them, accumulators included (the user's `merge`). A session fires when
//! the watermark passes its last instant; with allowed lateness it is kept that much longer,
//! and a late record merged into it fires it again. Sessions live per key in copy-on-write
//! pages; an event-time timer per key (the session ends) says when to look at a key again.

use std::sync::Arc;

use super::process::EventTime;
use super::side::{OutputTag, Outputs};
use super::window::WindowBounds;
use crate::collector::Collector;
use crate::error::Result;
use crate::metrics::Counter;
use crate::persist::Persist;
use crate::record::{Key, Timestamp};
use crate::state::{KeyedValueState, TimeDomain, TimerService};

/// One session of one key.
#[derive(Clone, Debug, PartialEq, crate::Persist)]
pub(crate) struct Session<A> {
    start: Timestamp,
    /// The first instant after the session (its last record's time plus the gap).
    end: Timestamp,
    acc: A,
    fired: bool,
}

impl<A> Session<A> {
    fn bounds(&self) -> WindowBounds {
        WindowBounds { start: self.start, end: self.end }
    }
    fn max_timestamp(&self) -> Timestamp {
        self.end - 1
    }
}

/// The settings of a session window operator.
pub(crate) struct SessionSettings<T> {
    pub(crate) gap: Timestamp,
    pub(crate) lateness: Timestamp,
    pub(crate) late: Option<OutputTag<T>>,
}

impl<T> Clone for SessionSettings<T> {
    fn clone(&self) -> Self {
        SessionSettings { gap: self.gap, lateness: self.lateness, late: self.late.clone() }
    }
}

impl<T> SessionSettings<T> {
    pub(crate) fn validate(&self) -> Result<()> {
        if self.gap == 0 {
            return Err(crate::Error::config(
                "a session gap of 0 would put every record in a session of its own; give the gap in event time",
            ));
        }
        Ok(())
    }
}

/// What a session operator snapshots: the sessions, the timers, the watermark.
type Held<K, A> = (KeyedValueState<K, Vec<Session<A>>>, (TimerService<K>, EventTime));

pub(crate) struct SessionWindows<T, K, A, O, KF, TF, I, F, M, R> {
    settings: SessionSettings<T>,
    key: KF,
    timestamp: TF,
    init: I,
    fold: F,
    merge: M,
    result: R,
    held: Held<K, A>,
    late: Arc<Counter>,
    out: Vec<O>,
    next: Outputs<O>,
}

impl<T, K: Key, A: Persist + Clone + Send + Sync + 'static, O, KF, TF, I, F, M, R>
    SessionWindows<T, K, A, O, KF, TF, I, F, M, R>
{
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        ctx: &crate::context::TaskContext,
        settings: SessionSettings<T>,
        key: KF,
        timestamp: TF,
        init: I,
        fold: F,
        merge: M,
        result: R,
        next: Outputs<O>,
    ) -> Self {
        SessionWindows {
            settings,
            key,
            timestamp,
            init,
            fold,
            merge,
            result,
            held: (KeyedValueState::new(), (TimerService::new(), EventTime(None))),
            late: ctx.metrics.late_counter(),
            out: Vec::new(),
            next,
        }
    }
}

impl<T, K, A, O, KF, TF, I, F, M, R> SessionWindows<T, K, A, O, KF, TF, I, F, M, R>
where
    K: Key,
    A: Persist + Clone + Send + Sync + 'static,
    I: Fn() -> A,
    F: FnMut(&mut A, T),
    M: FnMut(&mut A, A),
    R: FnMut(&K, WindowBounds, &A, &mut Vec<O>),
{
    /// Adds one record; gives it back if it is too late for any session.
    fn add(&mut self, k: K, ts: Timestamp, r: T) -> Option<T> {
        let (gap, lateness) = (self.settings.gap, self.settings.lateness);
        let (sessions, (timers, watermark)) = &mut self.held;
        let watermark = watermark.0;
        let (mut start, mut end) = (ts, ts.saturating_add(gap));
        // One lookup per record (a record too late for any session of a new key takes its
        // empty entry out again).
        let list = sessions.get_or_insert_with(k.clone(), Vec::new);
        // The sessions this record overlaps are next to each other (sessions never overlap).
        // Records exactly `gap` apart are two sessions: then a session that fired can never
        // take a record that is not late, and results do not depend on arrival order.
        let first = list.partition_point(|s| s.end <= start);
        let last = first + list[first..].iter().take_while(|s| s.start < end).count();
        for s in &list[first..last] {
            start = start.min(s.start);
            end = end.max(s.end);
        }
        if watermark.is_some_and(|wm| (end - 1).saturating_add(lateness) <= wm) {
            if list.is_empty() {
                sessions.remove(&k);
            }
            return Some(r);
        }
        let mut merged = list.drain(first..last);
        let mut acc = match merged.next() {
            Some(s) => s.acc,
            None => (self.init)(),
        };
        for s in merged {
            (self.merge)(&mut acc, s.acc);
        }
        (self.fold)(&mut acc, r);
        let session = Session { start, end, acc, fired: false };
        let max = session.max_timestamp();
        let due = watermark.is_some_and(|wm| max <= wm);
        list.insert(first, session);
        if due {
            // Late but within the allowed lateness: the merged session fires again now.
            let s = &mut list[first];
            s.fired = true;
            (self.result)(&k, s.bounds(), &s.acc, &mut self.out);
        } else {
            timers.register(TimeDomain::EventTime, &k, max);
        }
        if lateness > 0 {
            timers.register(TimeDomain::EventTime, &k, max.saturating_add(lateness));
        }
        None
    }

    /// Fires the sessions the watermark `wm` ends and drops those past their lateness.
    fn advance(&mut self, wm: Timestamp) {
        let lateness = self.settings.lateness;
        let (sessions, (timers, watermark)) = &mut self.held;
        watermark.0 = Some(wm);
        while let Some((_, k)) = timers.pop_due(TimeDomain::EventTime, wm) {
            let Some(list) = sessions.get(&k) else { continue };
            if !list.iter().any(|s| s.max_timestamp() <= wm) {
                continue;
            }
            let list = sessions.get_or_insert_with(k.clone(), Vec::new);
            for s in list.iter_mut().filter(|s| !s.fired && s.max_timestamp() <= wm) {
                s.fired = true;
                (self.result)(&k, s.bounds(), &s.acc, &mut self.out);
            }
            list.retain(|s| s.max_timestamp().saturating_add(lateness) > wm);
            if list.is_empty() {
                sessions.remove(&k);
            }
        }
    }
}

impl<T, K, A, O, KF, TF, I, F, M, R> Collector<T> for SessionWindows<T, K, A, O, KF, TF, I, F, M, R>
where
    T: Send + 'static,
    K: Key,
    A: Persist + Clone + Send + Sync + 'static,
    O: Send,
    KF: Fn(&T) -> K + Send,
    TF: Fn(&T) -> Timestamp + Send,
    I: Fn() -> A + Send,
    F: FnMut(&mut A, T) + Send,
    M: FnMut(&mut A, A) + Send,
    R: FnMut(&K, WindowBounds, &A, &mut Vec<O>) + Send,
{
    fn batch(&mut self, records: &mut Vec<T>) -> Result<()> {
        let mut late = 0;
        for r in records.drain(..) {
            let (k, ts) = ((self.key)(&r), (self.timestamp)(&r));
            if let Some(r) = self.add(k, ts, r) {
                late += 1;
                if let Some(tag) = &self.settings.late {
                    self.next.sides.emit(tag, r);
                }
            }
        }
        if late > 0 {
            self.late.add(late);
        }
        self.next.batch(&mut self.out)
    }

    fn watermark(&mut self, watermark: Timestamp) -> Result<()> {
        self.advance(watermark);
        self.next.batch(&mut self.out)?;
        self.next.watermark(watermark)
    }

    fn end(&mut self) -> Result<()> {
        if self.held.1 .1 .0 != Some(Timestamp::MAX) {
            self.watermark(Timestamp::MAX)?;
        }
        self.next.end()
    }

    super::forward_barriers!(next);
    super::keyed_state_checkpointing!(held);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collector::Recorder;
    use std::sync::Mutex;

    type Out = Arc<Mutex<Recorder<(u8, u64, u64, u64)>>>;

    fn sessions(gap: u64, lateness: u64) -> (impl Collector<(u8, u64)>, Out) {
        let rec = Arc::new(Mutex::new(Recorder::default()));
        let ctx = crate::context::TaskContext::for_test("sessions", 0, 1);
        let op = SessionWindows::new(
            &ctx,
            SessionSettings { gap, lateness, late: None },
            |r: &(u8, u64)| r.0,
            |r: &(u8, u64)| r.1,
            || 0u64,
            |c: &mut u64, _| *c += 1,
            |c: &mut u64, other: u64| *c += other,
            |k: &u8, b: WindowBounds, c: &u64, out: &mut Vec<(u8, u64, u64, u64)>| out.push((*k, b.start, b.end, *c)),
            Outputs::main(Box::new(Arc::clone(&rec))),
        );
        (op, rec)
    }

    fn got(rec: &Out) -> Vec<(u8, u64, u64, u64)> {
        let mut v = rec.lock().unwrap().records.clone();
        v.sort();
        v
    }

    #[test]
    fn records_closer_than_the_gap_form_a_session_and_a_bridge_merges_two() {
        let (mut op, rec) = sessions(10, 0);
        // Key 1: [0, 10) and [18, 28), then 9 overlaps both: one session [0, 28) of three.
        op.batch(&mut vec![(1, 0), (1, 18), (2, 100), (1, 50)]).unwrap();
        op.batch(&mut vec![(1, 9)]).unwrap();
        // 38 overlaps nothing: [38, 48).
        op.batch(&mut vec![(1, 38)]).unwrap();
        op.watermark(40).unwrap();
        assert_eq!(got(&rec), vec![(1, 0, 28, 3)]);
        // 12's session would end at 21, before the watermark: too late (no lateness).
        op.batch(&mut vec![(1, 12)]).unwrap();
        op.end().unwrap();
        assert_eq!(got(&rec), vec![(1, 0, 28, 3), (1, 38, 48, 1), (1, 50, 60, 1), (2, 100, 110, 1)]);
    }

    #[test]
    fn a_late_record_within_the_lateness_merges_into_a_fired_session_and_refires_it() {
        let (mut op, rec) = sessions(10, 20);
        op.batch(&mut vec![(1, 0), (1, 5)]).unwrap();
        op.watermark(20).unwrap();
        assert_eq!(got(&rec), vec![(1, 0, 15, 2)]);
        op.batch(&mut vec![(1, 8)]).unwrap(); // late, merges, refires at once
        assert_eq!(got(&rec), vec![(1, 0, 15, 2), (1, 0, 18, 3)]);
        op.watermark(40).unwrap(); // 17 + 20 <= 40: dropped
        op.batch(&mut vec![(1, 9)]).unwrap(); // too late now
        op.end().unwrap();
        assert_eq!(got(&rec).len(), 2);
    }
}
