//! Per-key timers in event time and processing time (Flink's `TimerService`), as keyed state:
//! each key's timers live in copy-on-write pages like any other keyed state, so a snapshot's
//! synchronous part shares pages (pointer work) and a rescaled restore keeps the keys a
//! subtask owns. The order in which timers fire is an index beside the pages (a heap per
//! domain), not written to snapshots: a restore rebuilds it from the keys' timers.
//!
//! May touch: `error`, `persist`, `record`, `snapshot`, `state::kinds`, `state::paged`.

use std::collections::BinaryHeap;

use super::kinds::{ForkedMap, KeyedState};
use super::paged::PagedMap;
use super::Snapshot;
use crate::error::Result;
use crate::record::{hash_key, Key, KeyScope, Timestamp};
use crate::snapshot::ForkedState;

/// Which clock a timer is set on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TimeDomain {
    /// Fires when the watermark reaches the timer's time.
    EventTime,
    /// Fires when the processing-time clock ([`crate::TaskContext::processing_time_ms`])
    /// reaches it.
    ProcessingTime,
}

/// The times of one key's timers in one domain: most keys have one, kept inline.
#[derive(Clone, Debug, PartialEq, Eq, crate::Persist)]
enum Times {
    None,
    One(Timestamp),
    Many(Vec<Timestamp>),
}

impl Times {
    fn contains(&self, ts: Timestamp) -> bool {
        match self {
            Times::None => false,
            Times::One(t) => *t == ts,
            Times::Many(v) => v.contains(&ts),
        }
    }
    fn insert(&mut self, ts: Timestamp) {
        *self = match std::mem::replace(self, Times::None) {
            Times::None => Times::One(ts),
            Times::One(t) => Times::Many(vec![t, ts]),
            Times::Many(mut v) => {
                v.push(ts);
                Times::Many(v)
            }
        };
    }
    /// Removes `ts`; whether it was there.
    fn remove(&mut self, ts: Timestamp) -> bool {
        match self {
            Times::One(t) if *t == ts => *self = Times::None,
            Times::Many(v) => match v.iter().position(|t| *t == ts) {
                Some(i) => {
                    v.swap_remove(i);
                    if let [only] = v[..] {
                        *self = Times::One(only);
                    }
                }
                None => return false,
            },
            _ => return false,
        }
        true
    }
    fn is_empty(&self) -> bool {
        matches!(self, Times::None)
    }
    fn iter(&self) -> impl Iterator<Item = Timestamp> + '_ {
        let (one, many) = match self {
            Times::None => (None, &[][..]),
            Times::One(t) => (Some(*t), &[][..]),
            Times::Many(v) => (None, &v[..]),
        };
        one.into_iter().chain(many.iter().copied())
    }
}

/// One key's timers: what snapshots hold.
#[derive(Clone, Debug, PartialEq, Eq, crate::Persist)]
struct KeyTimers {
    event: Times,
    processing: Times,
}

impl Default for KeyTimers {
    fn default() -> Self {
        KeyTimers { event: Times::None, processing: Times::None }
    }
}

impl KeyTimers {
    fn of(&mut self, domain: TimeDomain) -> &mut Times {
        match domain {
            TimeDomain::EventTime => &mut self.event,
            TimeDomain::ProcessingTime => &mut self.processing,
        }
    }
    fn is_empty(&self) -> bool {
        self.event.is_empty() && self.processing.is_empty()
    }
}

/// A timer in the firing order: by time only (timers due at the same time fire in any order).
struct Due<K> {
    ts: Timestamp,
    key: K,
}

impl<K> PartialEq for Due<K> {
    fn eq(&self, other: &Self) -> bool {
        self.ts == other.ts
    }
}
impl<K> Eq for Due<K> {}
impl<K> PartialOrd for Due<K> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<K> Ord for Due<K> {
    /// Reversed: the heap's top is the earliest.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.ts.cmp(&self.ts)
    }
}

/// The firing order of one domain's timers: a heap, earliest on top. A deleted timer stays in
/// the heap until it comes up and is found gone from its key's timers (no search on delete);
/// the heap is rebuilt from the keys' timers when such dead entries outnumber the live ones.
struct TimerIndex<K> {
    heap: BinaryHeap<Due<K>>,
    live: usize,
}

impl<K: Key> TimerIndex<K> {
    fn new() -> Self {
        TimerIndex { heap: BinaryHeap::new(), live: 0 }
    }
    fn len(&self) -> usize {
        self.live
    }
}

/// Timers per key in both domains. A key has at most one timer per time and domain (a second
/// registration is a no-op, as in Flink).
///
/// ```
/// use weir::state::{TimeDomain, TimerService};
/// let mut timers: TimerService<u64> = TimerService::new();
/// timers.register(TimeDomain::EventTime, &1, 20);
/// timers.register(TimeDomain::EventTime, &2, 10);
/// assert!(!timers.register(TimeDomain::EventTime, &1, 20), "already set");
/// assert_eq!(timers.pop_due(TimeDomain::EventTime, 15), Some((10, 2)));
/// assert_eq!(timers.pop_due(TimeDomain::EventTime, 15), None);
/// assert!(timers.delete(TimeDomain::EventTime, &1, 20));
/// assert_eq!(timers.len(), 0);
/// ```
pub struct TimerService<K> {
    by_key: PagedMap<K, KeyTimers>,
    event: TimerIndex<K>,
    processing: TimerIndex<K>,
}

impl<K: Key> Default for TimerService<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Key> TimerService<K> {
    /// No timers.
    pub fn new() -> Self {
        TimerService { by_key: PagedMap::new(), event: TimerIndex::new(), processing: TimerIndex::new() }
    }

    fn index(&mut self, domain: TimeDomain) -> &mut TimerIndex<K> {
        match domain {
            TimeDomain::EventTime => &mut self.event,
            TimeDomain::ProcessingTime => &mut self.processing,
        }
    }

    /// Sets a timer for `key` at `ts`; `false` if it was already set.
    pub fn register(&mut self, domain: TimeDomain, key: &K, ts: Timestamp) -> bool {
        let timers = self.by_key.get_or_insert_with(key.clone(), KeyTimers::default).of(domain);
        if timers.contains(ts) {
            return false;
        }
        timers.insert(ts);
        let index = self.index(domain);
        index.heap.push(Due { ts, key: key.clone() });
        index.live += 1;
        true
    }

    /// Removes `key`'s timer at `ts`; `false` if there was none.
    pub fn delete(&mut self, domain: TimeDomain, key: &K, ts: Timestamp) -> bool {
        if !self.forget(domain, key, ts) {
            return false;
        }
        let index = self.index(domain);
        index.live -= 1;
        if index.heap.len() > 2 * index.live + 1024 {
            self.rebuild_index(domain);
        }
        true
    }

    /// Removes `ts` from `key`'s timers (not from the index); whether it was there.
    fn forget(&mut self, domain: TimeDomain, key: &K, ts: Timestamp) -> bool {
        let Some(timers) = self.by_key.get_mut(key) else { return false };
        if !timers.of(domain).remove(ts) {
            return false;
        }
        if timers.is_empty() {
            self.by_key.remove(key);
        }
        true
    }

    /// Drops dead entries (deleted timers) from the top of `domain`'s heap.
    fn skip_deleted(&mut self, domain: TimeDomain) {
        loop {
            let top = match domain {
                TimeDomain::EventTime => self.event.heap.peek(),
                TimeDomain::ProcessingTime => self.processing.heap.peek(),
            };
            let Some(Due { ts, key }) = top else { return };
            let alive = self.by_key.get(key).is_some_and(|t| match domain {
                TimeDomain::EventTime => t.event.contains(*ts),
                TimeDomain::ProcessingTime => t.processing.contains(*ts),
            });
            if alive {
                return;
            }
            self.index(domain).heap.pop();
        }
    }

    /// Takes the earliest timer at or before `upto`, if any: it is removed, and the caller
    /// fires it.
    pub fn pop_due(&mut self, domain: TimeDomain, upto: Timestamp) -> Option<(Timestamp, K)> {
        loop {
            let index = self.index(domain);
            if index.heap.peek()?.ts > upto {
                return None;
            }
            let Due { ts, key } = index.heap.pop().expect("peeked");
            // A deleted timer is gone from its key's timers: skip it.
            if self.forget(domain, &key, ts) {
                self.index(domain).live -= 1;
                return Some((ts, key));
            }
        }
    }

    /// The earliest timer's time in `domain`.
    pub fn next(&mut self, domain: TimeDomain) -> Option<Timestamp> {
        self.skip_deleted(domain);
        match domain {
            TimeDomain::EventTime => self.event.heap.peek().map(|d| d.ts),
            TimeDomain::ProcessingTime => self.processing.heap.peek().map(|d| d.ts),
        }
    }

    /// Timers in both domains.
    pub fn len(&self) -> usize {
        self.event.len() + self.processing.len()
    }

    /// Whether no timer is set.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// Rebuilds both domains' heaps from the keys' timers (after a restore).
    fn rebuild_indexes(&mut self) {
        self.rebuild_index(TimeDomain::EventTime);
        self.rebuild_index(TimeDomain::ProcessingTime);
    }

    /// Rebuilds `domain`'s heap from the keys' timers.
    fn rebuild_index(&mut self, domain: TimeDomain) {
        let mut heap = Vec::new();
        for (k, t) in self.by_key.iter() {
            let times = match domain {
                TimeDomain::EventTime => &t.event,
                TimeDomain::ProcessingTime => &t.processing,
            };
            heap.extend(times.iter().map(|ts| Due { ts, key: k.clone() }));
        }
        let live = heap.len();
        *self.index(domain) = TimerIndex { heap: BinaryHeap::from(heap), live };
    }
}

impl<K: Key> Snapshot for TimerService<K> {
    fn fork(&mut self) -> Box<dyn ForkedState> {
        Box::new(ForkedMap(self.by_key.fork()))
    }
    fn restore(&mut self, bytes: &[u8]) -> Result<()> {
        self.by_key = super::kinds::read_map(bytes)?;
        self.rebuild_indexes();
        Ok(())
    }
}

impl<K: Key> KeyedState for TimerService<K> {
    fn restore_owned(&mut self, parts: &[&[u8]], scope: &KeyScope) -> Result<()> {
        self.by_key = super::kinds::read_entries(parts, |k: &K| scope.owns(hash_key(k)))?;
        self.rebuild_indexes();
        Ok(())
    }
}

// Their fields are closures, shared internals or whole state: a name says enough.
crate::debug_as_name!([K] TimerService<K>);

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(s: &mut impl Snapshot) -> Vec<u8> {
        let mut bytes = Vec::new();
        s.fork().write_to(&mut bytes).unwrap();
        bytes
    }

    #[test]
    fn timers_fire_in_time_order_survive_a_snapshot_and_split_by_key_group() {
        let mut t: TimerService<u64> = TimerService::new();
        for k in 0..1_000u64 {
            t.register(TimeDomain::EventTime, &k, 1_000 - k);
            t.register(TimeDomain::ProcessingTime, &k, k);
        }
        assert!(t.delete(TimeDomain::EventTime, &7, 993));
        assert!(!t.delete(TimeDomain::EventTime, &7, 993), "deleted once");
        let bytes = snapshot(&mut t);
        // Firing after the snapshot does not reach it.
        let mut fired = Vec::new();
        while let Some((ts, k)) = t.pop_due(TimeDomain::EventTime, 500) {
            fired.push((ts, k));
        }
        assert_eq!(fired.len(), 500, "timers 1..=500");
        assert!(fired.windows(2).all(|w| w[0].0 < w[1].0), "earliest first");
        let mut back: TimerService<u64> = TimerService::new();
        back.restore(&bytes).unwrap();
        assert_eq!(back.len(), 1_999);
        assert_eq!(back.next(TimeDomain::EventTime), Some(1));
        assert!(!back.delete(TimeDomain::EventTime, &7, 993), "the deleted timer stays deleted");
        assert_eq!(back.pop_due(TimeDomain::ProcessingTime, 0), Some((0, 0)));
        let scopes = [0, 1].map(|subtask| KeyScope { subtask, parallelism: 2, max_parallelism: 128 });
        let parts: usize = scopes
            .iter()
            .map(|scope| {
                let mut part: TimerService<u64> = TimerService::new();
                part.restore_owned(&[&bytes], scope).unwrap();
                assert!(part.by_key.iter().all(|(k, _)| scope.owns(hash_key(k))));
                part.len()
            })
            .sum();
        assert_eq!(parts, 1_999);
        assert!(back.restore(&bytes[..bytes.len() - 1]).is_err());
    }
}
