//! Per-key timers in event time and processing time (Flink's `TimerService`), as keyed state:
//! each key's timers live in copy-on-write pages like any other keyed state, so a snapshot's
//! synchronous part shares pages (pointer work) and a rescaled restore keeps the keys a
//! subtask owns. The order in which timers fire is an index beside the pages, not written to
//! snapshots: a restore rebuilds it from the keys' timers.
//!
//! May touch: `error`, `persist`, `record`, `snapshot`, `state::kinds`, `state::paged`.

use std::collections::{BTreeMap, HashSet};
use std::hash::BuildHasherDefault;

use super::kinds::{ForkedMap, KeyedState};
use super::paged::PagedMap;
use super::Snapshot;
use crate::error::Result;
use crate::persist::from_bytes;
use crate::record::{hash_key, Key, KeyHasher, KeyScope, Timestamp};
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

/// One key's timers: what snapshots hold.
#[derive(Clone, Debug, Default, PartialEq, Eq, crate::Persist)]
struct KeyTimers {
    event: Vec<Timestamp>,
    processing: Vec<Timestamp>,
}

impl KeyTimers {
    fn of(&mut self, domain: TimeDomain) -> &mut Vec<Timestamp> {
        match domain {
            TimeDomain::EventTime => &mut self.event,
            TimeDomain::ProcessingTime => &mut self.processing,
        }
    }
    fn is_empty(&self) -> bool {
        self.event.is_empty() && self.processing.is_empty()
    }
}

type KeySet<K> = HashSet<K, BuildHasherDefault<KeyHasher>>;

/// The keys with a timer at each time, earliest first.
struct TimerIndex<K> {
    due: BTreeMap<Timestamp, KeySet<K>>,
}

impl<K: Key> TimerIndex<K> {
    fn new() -> Self {
        TimerIndex { due: BTreeMap::new() }
    }
    fn insert(&mut self, ts: Timestamp, key: K) {
        self.due.entry(ts).or_default().insert(key);
    }
    fn remove(&mut self, ts: Timestamp, key: &K) {
        if let Some(keys) = self.due.get_mut(&ts) {
            keys.remove(key);
            if keys.is_empty() {
                self.due.remove(&ts);
            }
        }
    }
    /// Takes one timer at or before `upto`, earliest first.
    fn pop_due(&mut self, upto: Timestamp) -> Option<(Timestamp, K)> {
        let mut first = self.due.first_entry()?;
        let ts = *first.key();
        if ts > upto {
            return None;
        }
        let keys = first.get_mut();
        let key = keys.iter().next().expect("no empty sets are kept").clone();
        keys.remove(&key);
        if keys.is_empty() {
            first.remove();
        }
        Some((ts, key))
    }
    fn next(&self) -> Option<Timestamp> {
        self.due.keys().next().copied()
    }
    fn len(&self) -> usize {
        self.due.values().map(HashSet::len).sum()
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
        if timers.contains(&ts) {
            return false;
        }
        timers.push(ts);
        self.index(domain).insert(ts, key.clone());
        true
    }

    /// Removes `key`'s timer at `ts`; `false` if there was none.
    pub fn delete(&mut self, domain: TimeDomain, key: &K, ts: Timestamp) -> bool {
        if !self.forget(domain, key, ts) {
            return false;
        }
        self.index(domain).remove(ts, key);
        true
    }

    /// Removes `ts` from `key`'s timers (not from the index).
    fn forget(&mut self, domain: TimeDomain, key: &K, ts: Timestamp) -> bool {
        if !self.by_key.get(key).is_some_and(|t| match domain {
            TimeDomain::EventTime => t.event.contains(&ts),
            TimeDomain::ProcessingTime => t.processing.contains(&ts),
        }) {
            return false;
        }
        let timers = self.by_key.get_or_insert_with(key.clone(), KeyTimers::default);
        let list = timers.of(domain);
        list.swap_remove(list.iter().position(|t| *t == ts).expect("checked above"));
        if timers.is_empty() {
            self.by_key.remove(key);
        }
        true
    }

    /// Takes the earliest timer at or before `upto`, if any: it is removed, and the caller
    /// fires it.
    pub fn pop_due(&mut self, domain: TimeDomain, upto: Timestamp) -> Option<(Timestamp, K)> {
        let (ts, key) = self.index(domain).pop_due(upto)?;
        let forgotten = self.forget(domain, &key, ts);
        debug_assert!(forgotten, "an indexed timer is in its key's timers");
        Some((ts, key))
    }

    /// The earliest timer's time in `domain`.
    pub fn next(&self, domain: TimeDomain) -> Option<Timestamp> {
        match domain {
            TimeDomain::EventTime => self.event.next(),
            TimeDomain::ProcessingTime => self.processing.next(),
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

    fn rebuild_index(&mut self) {
        let (mut event, mut processing) = (TimerIndex::new(), TimerIndex::new());
        for (k, t) in self.by_key.iter() {
            t.event.iter().for_each(|&ts| event.insert(ts, k.clone()));
            t.processing.iter().for_each(|&ts| processing.insert(ts, k.clone()));
        }
        (self.event, self.processing) = (event, processing);
    }
}

impl<K: Key> Snapshot for TimerService<K> {
    fn fork(&mut self) -> Box<dyn ForkedState> {
        Box::new(ForkedMap(self.by_key.fork()))
    }
    fn restore(&mut self, bytes: &[u8]) -> Result<()> {
        self.restore_owned(&[bytes], &KeyScope { subtask: 0, parallelism: 1, max_parallelism: 1 })
    }
}

impl<K: Key> KeyedState for TimerService<K> {
    fn restore_owned(&mut self, parts: &[&[u8]], scope: &KeyScope) -> Result<()> {
        let mut by_key = PagedMap::new();
        for bytes in parts {
            let entries: Vec<(K, KeyTimers)> = from_bytes(bytes)?;
            for (k, t) in entries.into_iter().filter(|(k, _)| scope.owns(hash_key(k))) {
                by_key.insert(k, t);
            }
        }
        self.by_key = by_key;
        self.rebuild_index();
        Ok(())
    }
}

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
