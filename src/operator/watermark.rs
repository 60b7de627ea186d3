//! Event-time watermarks with bounded out-of-orderness (Flink's
//! `forBoundedOutOfOrderness`): after each batch, the watermark is the largest timestamp seen
//! minus the bound. At end of input the watermark jumps to `Timestamp::MAX`, firing every
//! window that is still open.
//!
//! [`WatermarkAlignment`] (Flink's watermark alignment, FLIP-182) bounds how far one input runs
//! ahead of the others in event time: an assigner whose watermark is more than the group's
//! `max_drift` past the group's least stops taking input (its `drain` says it is held back,
//! which a task treats as backpressure) until the others catch up. Without it a fast source
//! opens windows the slow one has not reached, and they stay open, holding state, until the
//! slow one's watermark closes them. Unlike Flink, a job's assigners are aligned by default
//! when it has windows: every assigner not put in a named group joins the job's default
//! group, whose drift is set when the job starts (from its windows, or the user's bound).
//!
//! Idleness (Flink's `withIdleness`): every assigner of a job publishes its watermark in the
//! job's [`WatermarkRegistry`]. One made with an idleness timeout that has had no input for that
//! long (processing time) is idle: it stops holding event time back by emitting the least
//! watermark of the job's assigners that are not idle (as if it were not there, which is what
//! downstream's minimum then computes), and holds it again as soon as input comes. The
//! watermark it emitted while idle is its watermark, snapshotted like any.

use crate::collector::Collector;
use crate::context::Clock;
use crate::error::Result;
use crate::persist::from_bytes;
use crate::record::Timestamp;
use crate::snapshot::{Barrier, ForkedState, PersistedFork};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A subtask of an assigner operator: (operator, subtask).
type MemberId = (Arc<str>, usize);

/// Entries of assigner subtasks, by (operator, subtask): a new attempt's subtask replaces the
/// old one's entry. Shared by a group's members, which keep a copy of the list and re-read it
/// only when membership changed.
struct MemberList<E> {
    members: Mutex<Vec<(MemberId, Arc<E>)>>,
    /// Bumped on every change of membership.
    generation: AtomicU64,
}

impl<E> Default for MemberList<E> {
    fn default() -> Self {
        MemberList { members: Mutex::new(Vec::new()), generation: AtomicU64::new(0) }
    }
}

impl<E> MemberList<E> {
    /// Puts `entry` in as subtask `subtask` of `operator` (replacing an earlier attempt's).
    fn join(&self, operator: Arc<str>, subtask: usize, entry: Arc<E>) {
        let mut members = crate::wake::lock(&self.members);
        let id = (operator, subtask);
        match members.iter_mut().find(|(m, _)| *m == id) {
            Some((_, e)) => *e = entry,
            None => members.push((id, entry)),
        }
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// Empties the list, for a new attempt of the job: its subtasks join afresh (a subtask the
    /// new attempt lacks, after a restore at a lower parallelism, would otherwise hold the
    /// others at its last watermark forever).
    fn clear(&self) {
        crate::wake::lock(&self.members).clear();
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// Refreshes `copy` (every entry but `me`, if given) when membership changed since `seen`.
    fn refresh(&self, seen: &mut u64, copy: &mut Vec<Arc<E>>, me: Option<&Arc<E>>) {
        let generation = self.generation.load(Ordering::Acquire);
        if generation != *seen {
            *copy = crate::wake::lock(&self.members)
                .iter()
                .filter(|(_, e)| me.is_none_or(|me| !Arc::ptr_eq(e, me)))
                .map(|(_, e)| Arc::clone(e))
                .collect();
            *seen = generation;
        }
    }
}

/// A group of watermark assigners (of one operator's subtasks, or of several sources) whose
/// watermarks may differ by at most `max_drift`.
///
/// A job's default group (every assigner not put in a named one) learns its drift when the job
/// starts, once every window of the job is known: hence an atomic, read once per batch.
pub(crate) struct WatermarkAlignment {
    max_drift: AtomicU64,
    /// Each member's latest watermark. A member that has emitted nothing yet holds 0.
    members: MemberList<AtomicU64>,
}

/// The drift of a group that holds no one back (a job's default group with alignment off).
const UNBOUNDED_DRIFT: Timestamp = Timestamp::MAX;

impl WatermarkAlignment {
    pub(crate) fn new(max_drift: Timestamp) -> Arc<Self> {
        Arc::new(WatermarkAlignment { max_drift: AtomicU64::new(max_drift), members: MemberList::default() })
    }

    /// A group that holds no one back until [`Self::set_max_drift`] bounds it.
    pub(crate) fn unbounded() -> Arc<Self> {
        Self::new(UNBOUNDED_DRIFT)
    }

    pub(crate) fn max_drift(&self) -> Timestamp {
        self.max_drift.load(Ordering::Relaxed)
    }

    /// Forgets every member, before an attempt's assigners join (see [`MemberList::clear`]).
    pub(crate) fn forget_members(&self) {
        self.members.clear();
    }

    /// Bounds the group's drift (`None`: unbounded). Set before its members start.
    pub(crate) fn set_max_drift(&self, max_drift: Option<Timestamp>) {
        self.max_drift.store(max_drift.unwrap_or(UNBOUNDED_DRIFT), Ordering::Relaxed);
    }

    /// Whether the group holds anyone back.
    pub(crate) fn is_bounded(&self) -> bool {
        self.max_drift() != UNBOUNDED_DRIFT
    }

    /// Joins the group (or takes over this subtask's place after a restart).
    fn join(self: &Arc<Self>, operator: Arc<str>, subtask: usize) -> AlignedMember {
        let slot = Arc::new(AtomicU64::new(0));
        self.members.join(operator, subtask, Arc::clone(&slot));
        AlignedMember { group: Arc::clone(self), slot, others: Vec::new(), seen: u64::MAX }
    }
}

/// The watermarks of every assigner of a job, and which are idle: what an idle assigner
/// follows. One per job, shared by its attempts.
#[derive(Default)]
pub(crate) struct WatermarkRegistry {
    members: MemberList<RegisteredWatermark>,
}

/// One assigner's entry in the registry.
#[derive(Default)]
struct RegisteredWatermark {
    watermark: AtomicU64,
    idle: std::sync::atomic::AtomicBool,
}

impl WatermarkRegistry {
    /// Forgets every assigner, before an attempt's assigners join (see [`MemberList::clear`]).
    pub(crate) fn forget_members(&self) {
        self.members.clear();
    }

    /// Joins (or takes over this subtask's entry after a restart).
    fn join(self: &Arc<Self>, operator: Arc<str>, subtask: usize) -> Registered {
        let entry = Arc::new(RegisteredWatermark::default());
        self.members.join(operator, subtask, Arc::clone(&entry));
        Registered { registry: Arc::clone(self), entry, others: Vec::new(), seen: u64::MAX }
    }
}

/// An assigner's entry in its job's [`WatermarkRegistry`].
struct Registered {
    registry: Arc<WatermarkRegistry>,
    entry: Arc<RegisteredWatermark>,
    /// The other entries, re-read when the registry's generation moved.
    others: Vec<Arc<RegisteredWatermark>>,
    seen: u64,
}

impl Registered {
    fn publish(&self, watermark: Timestamp) {
        self.entry.watermark.store(watermark, Ordering::Release);
    }

    fn set_idle(&self, idle: bool) {
        self.entry.idle.store(idle, Ordering::Release);
    }

    /// The watermark an idle assigner follows: the least of the other assigners that are not
    /// idle; when every other one is idle too, the greatest of theirs (as Flink's watermark
    /// valve does when all its inputs are idle: nothing active holds event time back). `None`
    /// when no other assigner is left (every other one ended, or there is none).
    fn followed_watermark(&mut self) -> Option<Timestamp> {
        self.registry.members.refresh(&mut self.seen, &mut self.others, Some(&self.entry));
        // An input that ended (at the end of event time) says nothing about the others.
        let live = || {
            self.others
                .iter()
                .map(|e| (e.idle.load(Ordering::Acquire), e.watermark.load(Ordering::Acquire)))
                .filter(|&(_, w)| w != Timestamp::MAX)
        };
        live().filter(|&(idle, _)| !idle).map(|(_, w)| w).min().or_else(|| live().map(|(_, w)| w).max())
    }
}

/// How an assigner tells it is idle: no input for `after_ns` of processing time.
struct Idleness {
    after_ns: u64,
    clock: Clock,
    last_input_ns: u64,
    idle: bool,
}

/// One assigner's place in a [`WatermarkAlignment`].
struct AlignedMember {
    group: Arc<WatermarkAlignment>,
    slot: Arc<AtomicU64>,
    others: Vec<Arc<AtomicU64>>,
    seen: u64,
}

impl AlignedMember {
    fn publish(&self, watermark: Timestamp) {
        self.slot.store(watermark, Ordering::Release);
    }

    /// Whether this member's watermark is more than the drift past the group's least.
    fn ahead(&mut self) -> bool {
        let mine = self.slot.load(Ordering::Relaxed);
        // An input at the end of event time has nothing left to hold back: it must get to
        // its end (which may be what the others wait for: a checkpoint's last barrier).
        if mine == Timestamp::MAX {
            return false;
        }
        self.group.members.refresh(&mut self.seen, &mut self.others, None);
        let least = self.others.iter().map(|s| s.load(Ordering::Acquire)).min().unwrap_or(0);
        mine > least.saturating_add(self.group.max_drift())
    }
}

pub(crate) struct WatermarkAssigner<F, T> {
    timestamp: F,
    out_of_orderness: Timestamp,
    max_seen: Option<Timestamp>,
    emitted: Option<Timestamp>,
    aligned: Option<AlignedMember>,
    registered: Option<Registered>,
    idleness: Option<Idleness>,
    next: Box<dyn Collector<T>>,
}

impl<F, T> WatermarkAssigner<F, T> {
    pub(crate) fn new(timestamp: F, out_of_orderness: Timestamp, next: Box<dyn Collector<T>>) -> Self {
        WatermarkAssigner {
            timestamp,
            out_of_orderness,
            max_seen: None,
            emitted: None,
            aligned: None,
            registered: None,
            idleness: None,
            next,
        }
    }

    /// Publishes its watermark in the job's `registry` as subtask `subtask` of `operator`
    /// (what idle assigners follow).
    pub(crate) fn registered(mut self, registry: &Arc<WatermarkRegistry>, operator: Arc<str>, subtask: usize) -> Self {
        self.registered = Some(registry.join(operator, subtask));
        self
    }

    /// Idle after `after` of processing time without input on `clock` (see the module doc).
    /// Needs [`WatermarkAssigner::registered`].
    pub(crate) fn idle_after(mut self, after: std::time::Duration, clock: Clock) -> Self {
        let now = clock.now_ns();
        self.idleness = Some(Idleness { after_ns: after.as_nanos() as u64, clock, last_input_ns: now, idle: false });
        self
    }

    /// With idleness: input came (active again), or none for the timeout (idle, following
    /// the least active watermark of the job's other assigners).
    fn check_idleness(&mut self, input: bool) -> Result<()> {
        let Some(idle) = self.idleness.as_mut() else { return Ok(()) };
        let now = idle.clock.now_ns();
        if input {
            idle.last_input_ns = now;
            if std::mem::replace(&mut idle.idle, false) {
                if let Some(r) = &self.registered {
                    r.set_idle(false);
                }
            }
            return Ok(());
        }
        if !idle.idle && now.saturating_sub(idle.last_input_ns) >= idle.after_ns {
            idle.idle = true;
            if let Some(r) = &self.registered {
                r.set_idle(true);
            }
        }
        if !idle.idle {
            return Ok(());
        }
        let Some(least) = self.registered.as_mut().and_then(Registered::followed_watermark) else { return Ok(()) };
        if self.emitted.is_none_or(|e| least > e) {
            self.emit(least)?;
        }
        Ok(())
    }

    /// Takes part in `group` as subtask `subtask` of `operator`.
    pub(crate) fn aligned(mut self, group: &Arc<WatermarkAlignment>, operator: Arc<str>, subtask: usize) -> Self {
        self.aligned = Some(group.join(operator, subtask));
        self
    }

    /// Takes part in `group` if it bounds drift (a job's default group does only when the job
    /// has windows or was told a drift).
    pub(crate) fn aligned_if_bounded(
        self,
        group: &Arc<WatermarkAlignment>,
        operator: Arc<str>,
        subtask: usize,
    ) -> Self {
        if group.is_bounded() {
            self.aligned(group, operator, subtask)
        } else {
            self
        }
    }

    fn emit(&mut self, watermark: Timestamp) -> Result<()> {
        self.emitted = Some(watermark);
        if let Some(a) = &self.aligned {
            a.publish(watermark);
        }
        if let Some(r) = &self.registered {
            r.publish(watermark);
        }
        self.next.watermark(watermark)
    }
}

impl<T: Send, F: Fn(&T) -> Timestamp + Send> Collector<T> for WatermarkAssigner<F, T> {
    #[inline]
    fn batch(&mut self, records: &mut Vec<T>) -> Result<()> {
        if !records.is_empty() {
            self.check_idleness(true)?;
        }
        let batch_max = records.iter().map(&self.timestamp).max();
        self.next.batch(records)?;
        if let Some(m) = batch_max {
            let max = self.max_seen.map_or(m, |s| s.max(m));
            self.max_seen = Some(max);
            let wm = max.saturating_sub(self.out_of_orderness);
            if self.emitted.is_none_or(|e| wm > e) {
                self.emit(wm)?;
            }
        }
        Ok(())
    }

    fn watermark(&mut self, upstream: Timestamp) -> Result<()> {
        // This operator defines event time from here on; upstream watermarks are superseded,
        // but for the end of event time (all input has ended), which holds here too.
        if upstream == Timestamp::MAX && self.emitted != Some(Timestamp::MAX) {
            self.emit(Timestamp::MAX)?;
        }
        Ok(())
    }

    fn end(&mut self) -> Result<()> {
        if self.emitted != Some(Timestamp::MAX) {
            self.emit(Timestamp::MAX)?;
        }
        self.next.end()
    }

    fn drain(&mut self) -> Result<bool> {
        // Polled whether or not input came: where idleness is noticed.
        self.check_idleness(false)?;
        // What was emitted goes on first (a checkpoint's barrier among it, which the other
        // inputs' downstream may be waiting for: held back with it, they would wait forever).
        let flushed = self.next.drain()?;
        // Ahead of its alignment group: held back, as if downstream were full.
        Ok(flushed && !self.aligned.as_mut().is_some_and(AlignedMember::ahead))
    }
    fn next_control(&mut self) -> Option<&mut dyn crate::collector::CollectorControl> {
        Some(&mut self.next)
    }
    fn snapshot_state(&mut self, _: &Barrier) -> Result<Option<Box<dyn ForkedState>>> {
        Ok(Some(Box::new(PersistedFork((self.max_seen, self.emitted)))))
    }
    fn restore_state(&mut self, bytes: &[u8]) -> Result<()> {
        (self.max_seen, self.emitted) = from_bytes(bytes)?;
        self.publish_restored();
        Ok(())
    }
    fn restore_rescaled(&mut self, parts: &[(usize, &[u8])], _scope: &crate::record::KeyScope) -> Result<()> {
        // The least of the old subtasks' positions: event time never runs ahead of any input.
        let decoded: Vec<(Option<Timestamp>, Option<Timestamp>)> =
            parts.iter().map(|(_, b)| from_bytes(b)).collect::<Result<_>>()?;
        self.max_seen = super::window::merged_watermark(decoded.iter().map(|d| d.0));
        self.emitted = super::window::merged_watermark(decoded.iter().map(|d| d.1));
        self.publish_restored();
        Ok(())
    }
}

impl<F, T> WatermarkAssigner<F, T> {
    /// A restored member starts from its restored watermark, not from 0.
    fn publish_restored(&self) {
        if let (Some(a), Some(wm)) = (&self.aligned, self.emitted) {
            a.publish(wm);
        }
        if let (Some(r), Some(wm)) = (&self.registered, self.emitted) {
            r.publish(wm);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collector::Recorder;
    use std::sync::atomic::AtomicU64;
    use std::sync::{Arc, Mutex};

    /// Two inputs with watermarks, one silent: downstream's watermark (the least of the two)
    /// stayed where the silent one left it, and no window fired until it was closed. With
    /// idleness the silent one follows the active one after the timeout (on the clock, here
    /// a hand-moved one), and holds event time again once input comes.
    #[test]
    fn an_idle_assigner_follows_the_active_ones_and_holds_again_on_input() {
        let registry = Arc::new(WatermarkRegistry::default());
        let time = Arc::new(AtomicU64::new(0));
        let clock = Clock::manual(Arc::clone(&time));
        let recorder = || Arc::new(Mutex::new(Recorder::<u64>::default()));
        let (busy_out, quiet_out) = (recorder(), recorder());
        let op: Arc<str> = "watermarks".into();
        let mut busy =
            WatermarkAssigner::new(|t: &u64| *t, 0, Box::new(Arc::clone(&busy_out)) as Box<dyn Collector<u64>>)
                .registered(&registry, Arc::clone(&op), 0)
                .idle_after(std::time::Duration::from_millis(100), clock.clone());
        let mut quiet =
            WatermarkAssigner::new(|t: &u64| *t, 0, Box::new(Arc::clone(&quiet_out)) as Box<dyn Collector<u64>>)
                .registered(&registry, Arc::clone(&op), 1)
                .idle_after(std::time::Duration::from_millis(100), clock.clone());
        quiet.batch(&mut vec![5]).unwrap();
        busy.batch(&mut vec![1_000]).unwrap();
        time.store(50_000_000, Ordering::SeqCst);
        quiet.drain().unwrap();
        assert_eq!(quiet_out.lock().unwrap().watermarks, vec![5], "not idle before the timeout");
        time.store(150_000_000, Ordering::SeqCst);
        busy.batch(&mut vec![2_000]).unwrap();
        quiet.drain().unwrap();
        assert_eq!(quiet_out.lock().unwrap().watermarks, vec![5, 2_000], "idle: follows the active one");
        busy.batch(&mut vec![3_000]).unwrap();
        quiet.drain().unwrap();
        assert_eq!(quiet_out.lock().unwrap().watermarks, vec![5, 2_000, 3_000]);
        // Input again: active, and it holds the busy one back from here (as seen by a third).
        quiet.batch(&mut vec![3_001]).unwrap();
        busy.batch(&mut vec![9_000]).unwrap();
        quiet.drain().unwrap();
        assert_eq!(quiet_out.lock().unwrap().watermarks, vec![5, 2_000, 3_000, 3_001], "active: its own time");
        let mut third = WatermarkAssigner::new(|t: &u64| *t, 0, Box::new(recorder()) as Box<dyn Collector<u64>>)
            .registered(&registry, Arc::clone(&op), 2);
        third.batch(&mut vec![1]).unwrap();
        let mut probe = registry.join(Arc::clone(&op), 3);
        assert_eq!(probe.followed_watermark(), Some(1), "every active input counts, the quiet one again too");
        // Every other input idle: the greatest of them (nothing active holds time back).
        third.end().unwrap();
        probe.publish(Timestamp::MAX);
        time.store(1_000_000_000, Ordering::SeqCst);
        busy.drain().unwrap();
        quiet.drain().unwrap();
        assert_eq!(quiet_out.lock().unwrap().watermarks.last(), Some(&9_000), "all idle: the greatest");
        // Every other input ended: nothing to follow.
        let mut alone = registry.join(Arc::clone(&op), 4);
        busy.registered.as_ref().unwrap().publish(Timestamp::MAX);
        quiet.registered.as_ref().unwrap().publish(Timestamp::MAX);
        assert_eq!(alone.followed_watermark(), None, "ended inputs say nothing");
    }

    #[test]
    fn an_assigner_ahead_of_its_group_by_more_than_the_drift_is_held_back() {
        let group = WatermarkAlignment::new(100);
        let rec = || Box::new(Arc::new(Mutex::new(Recorder::<u64>::default()))) as Box<dyn Collector<u64>>;
        let op: Arc<str> = "watermarks".into();
        let fast_out = Arc::new(Mutex::new(Recorder::<u64>::default()));
        let mut fast =
            WatermarkAssigner::new(|t: &u64| *t, 0, Box::new(Arc::clone(&fast_out)) as Box<dyn Collector<u64>>)
                .aligned(&group, Arc::clone(&op), 0);
        let mut slow = WatermarkAssigner::new(|t: &u64| *t, 0, rec()).aligned(&group, Arc::clone(&op), 1);
        fast.batch(&mut vec![100]).unwrap();
        assert!(fast.drain().unwrap(), "100 is within the drift of the slow one's 0");
        fast.batch(&mut vec![150]).unwrap();
        let drains = fast_out.lock().unwrap().drains;
        assert!(!fast.drain().unwrap(), "150 is more than 100 past 0");
        // Held back from taking input, it still pushes on what it emitted: a barrier among it
        // may be what the slow input's downstream waits for.
        assert_eq!(fast_out.lock().unwrap().drains, drains + 1, "downstream drained while held back");
        assert!(slow.drain().unwrap(), "the least is never held back");
        slow.batch(&mut vec![60]).unwrap();
        assert!(fast.drain().unwrap(), "the slow one caught up to within the drift");
        // A restarted subtask takes over its slot: it starts from 0 again, holding the fast one.
        let mut slow = WatermarkAssigner::new(|t: &u64| *t, 0, rec()).aligned(&group, Arc::clone(&op), 1);
        assert!(!fast.drain().unwrap());
        // An input that ended holds nobody, and is never held itself (its end may be what
        // the others wait for).
        slow.end().unwrap();
        assert!(fast.drain().unwrap());
        let mut behind = WatermarkAssigner::new(|t: &u64| *t, 0, rec()).aligned(&group, Arc::clone(&op), 2);
        behind.batch(&mut vec![1]).unwrap();
        fast.end().unwrap();
        assert!(fast.drain().unwrap(), "at the end of event time, far past 1, and not held");
    }

    #[test]
    fn watermarks_trail_the_maximum_by_the_bound() {
        let rec = Arc::new(Mutex::new(Recorder::<u64>::default()));
        let mut w = WatermarkAssigner::new(|t: &u64| *t, 10, Box::new(Arc::clone(&rec)));
        w.batch(&mut vec![100, 50]).unwrap();
        w.batch(&mut vec![95]).unwrap(); // no advance
        w.batch(&mut vec![130]).unwrap();
        w.end().unwrap();
        let r = rec.lock().unwrap();
        assert_eq!(r.watermarks, vec![90, 120, u64::MAX]);
        assert_eq!(r.records, vec![100, 50, 95, 130]);
    }
}
