//! State time-to-live (Flink's `StateTtlConfig`): values that expire a while after they were
//! written (or read), in processing or event time. Expired values are never written to a
//! snapshot, are removed a few at a time as the state is used (an expiry queue beside the
//! pages, rebuilt on restore), and are hidden from reads unless the configuration lets a
//! not-yet-removed one through.
//!
//! [`TtlValueState`], [`TtlListState`] (a list expires as a whole, from its last write) and
//! [`TtlMapState`] (each entry on its own) are the keyed kinds with a TTL; a process function's operator tells them the time before
//! every call ([`super::ScopedState::advance_time`]).
//!
//! May touch: `error`, `persist`, `record`, `snapshot`, `state::kinds`, `state::paged`,
//! `state::scoped`.

use std::collections::VecDeque;
use std::time::Duration;

use super::kinds::KeyedState;
use super::paged::{PagedFork, PagedMap};
use super::scoped::ScopedState;
use super::Snapshot;
use crate::error::Result;
use crate::persist::{from_bytes, Persist};
use crate::record::{hash_key, Key, KeyScope, Timestamp};
use crate::snapshot::{ForkedState, StateChunks};

/// When a value's time to live starts again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TtlUpdate {
    /// When it is created or written (Flink's `OnCreateAndWrite`).
    OnCreateAndWrite,
    /// When it is created, written or read (Flink's `OnReadAndWrite`).
    OnReadAndWrite,
}

/// Whether an expired value not yet removed may be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TtlVisibility {
    /// Never (Flink's `NeverReturnExpired`).
    NeverReturnExpired,
    /// Until it is removed (Flink's `ReturnExpiredIfNotCleanedUp`).
    ReturnExpiredIfNotCleanedUp,
}

/// Which time a TTL counts in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TtlTime {
    /// Processing time, in milliseconds.
    ProcessingTime,
    /// Event time: the operator's watermark, in event-time units.
    EventTime,
}

/// How a keyed state's values expire.
///
/// ```
/// use std::time::Duration;
/// use weir::state::{StateTtlConfig, TtlUpdate, TtlValueState};
/// let ttl = StateTtlConfig::new(Duration::from_secs(60)).update(TtlUpdate::OnReadAndWrite);
/// let state: TtlValueState<u64, u64> = TtlValueState::new(ttl);
/// # let _ = state;
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateTtlConfig {
    /// How long a value lives, in the time's units (milliseconds for processing time).
    pub ttl: Timestamp,
    /// What restarts its life.
    pub update: TtlUpdate,
    /// Whether an expired value may still be read before it is removed.
    pub visibility: TtlVisibility,
    /// The time it counts in.
    pub time: TtlTime,
    /// Entries checked for expiry on every state access (0: only snapshots and reads clean up).
    pub cleanup_per_access: usize,
}

impl StateTtlConfig {
    /// Values live `ttl` of processing time after their last write, are never read once
    /// expired, and two queued expiries are checked on every access.
    pub fn new(ttl: Duration) -> Self {
        StateTtlConfig {
            ttl: ttl.as_millis() as Timestamp,
            update: TtlUpdate::OnCreateAndWrite,
            visibility: TtlVisibility::NeverReturnExpired,
            time: TtlTime::ProcessingTime,
            cleanup_per_access: 2,
        }
    }
    /// Counts in event time: a value written at watermark `w` expires once the watermark
    /// passes `w + ttl`.
    pub fn event_time(ttl: Timestamp) -> Self {
        StateTtlConfig { ttl, time: TtlTime::EventTime, ..StateTtlConfig::new(Duration::ZERO) }
    }
    /// What restarts a value's life.
    pub fn update(mut self, update: TtlUpdate) -> Self {
        self.update = update;
        self
    }
    /// Whether expired values may be read until removed.
    pub fn visibility(mut self, visibility: TtlVisibility) -> Self {
        self.visibility = visibility;
        self
    }
    /// Entries checked for expiry on every access.
    pub fn cleanup_per_access(mut self, entries: usize) -> Self {
        self.cleanup_per_access = entries;
        self
    }
    /// Checks the configuration makes sense.
    pub fn validate(&self) -> Result<()> {
        if self.ttl == 0 {
            return Err(crate::Error::config(
                "a state TTL of 0 would expire every value as it is written; give a positive time to live",
            ));
        }
        Ok(())
    }
}

/// A value with the time its life (re)started.
#[derive(Clone, Debug, PartialEq, crate::Persist)]
struct Stamped<V> {
    value: V,
    at: Timestamp,
}

/// The engine of the TTL kinds: values stamped with their last update, and a queue of
/// (expiry, key) to remove them by.
struct TtlMap<K, V> {
    config: StateTtlConfig,
    map: PagedMap<K, Stamped<V>>,
    queue: VecDeque<(Timestamp, K)>,
    now: Timestamp,
}

impl<K: Key, V: Clone + Persist> TtlMap<K, V> {
    fn new(config: StateTtlConfig) -> Self {
        TtlMap { config, map: PagedMap::new(), queue: VecDeque::new(), now: 0 }
    }

    fn expired(&self, s: &Stamped<V>) -> bool {
        s.at.saturating_add(self.config.ttl) <= self.now
    }

    /// Removes up to `n` queued entries that expired (those rewritten since stay).
    fn clean(&mut self, n: usize) {
        for _ in 0..n {
            match self.queue.front() {
                Some((expiry, _)) if *expiry <= self.now => {}
                _ => return,
            }
            let (_, k) = self.queue.pop_front().expect("a front entry");
            if self.map.get(&k).is_some_and(|s| self.expired(s)) {
                self.map.remove(&k);
            }
        }
    }

    fn touch(&mut self) {
        let n = self.config.cleanup_per_access;
        if n > 0 {
            self.clean(n);
        }
    }

    fn stamp(&mut self, key: &K) {
        self.queue.push_back((self.now.saturating_add(self.config.ttl), key.clone()));
    }

    fn get(&mut self, key: &K) -> Option<&V> {
        self.touch();
        let expired = self.map.get(key).map(|s| self.expired(s))?;
        if expired && self.config.visibility == TtlVisibility::NeverReturnExpired {
            self.map.remove(key);
            return None;
        }
        if self.config.update == TtlUpdate::OnReadAndWrite && !expired {
            self.stamp(key);
            let now = self.now;
            let s = self.map.get_mut(key)?;
            s.at = now;
            return Some(&s.value);
        }
        self.map.get(key).map(|s| &s.value)
    }

    fn get_mut_or_insert_with(&mut self, key: &K, init: impl FnOnce() -> V) -> &mut V {
        self.touch();
        if self.map.get(key).is_some_and(|s| self.expired(s)) {
            self.map.remove(key);
        }
        let now = self.now;
        self.stamp(key);
        let s = self.map.get_or_insert_with(key.clone(), || Stamped { value: init(), at: now });
        s.at = now;
        &mut s.value
    }

    fn put(&mut self, key: &K, value: V) {
        self.touch();
        self.stamp(key);
        self.map.insert(key.clone(), Stamped { value, at: self.now });
    }

    fn remove(&mut self, key: &K) -> Option<V> {
        self.touch();
        let s = self.map.remove(key)?;
        (!self.expired(&s) || self.config.visibility == TtlVisibility::ReturnExpiredIfNotCleanedUp).then_some(s.value)
    }

    fn rebuild(&mut self, entries: Vec<(K, Stamped<V>)>, keep: impl Fn(&K) -> bool) {
        let kept: Vec<(K, Stamped<V>)> = entries.into_iter().filter(|(k, _)| keep(k)).collect();
        let mut queue: Vec<(Timestamp, K)> =
            kept.iter().map(|(k, s)| (s.at.saturating_add(self.config.ttl), k.clone())).collect();
        queue.sort_by_key(|(e, _)| *e);
        (self.map, self.queue) = (PagedMap::from_entries(kept), queue.into());
    }
}

/// A fork that writes only the entries alive at the fork's time.
struct LiveEntries<K, V> {
    fork: PagedFork<K, Stamped<V>>,
    now: Timestamp,
    ttl: Timestamp,
}

impl<K: Persist + Send + Sync, V: Persist + Send + Sync> ForkedState for LiveEntries<K, V> {
    fn write_chunks(&self, out: &mut dyn StateChunks) -> std::io::Result<()> {
        let (mut live, mut body) = (0u64, Vec::new());
        self.fork.for_each_entry(|k, s| {
            if s.at.saturating_add(self.ttl) > self.now {
                live += 1;
                k.persist(&mut body);
                s.persist(&mut body);
            }
        })?;
        let mut count = Vec::with_capacity(8);
        live.persist(&mut count);
        out.bytes(&count)?;
        out.bytes(&body)
    }
}

impl<K: Key, V: Persist + Clone + Send + Sync + 'static> TtlMap<K, V> {
    fn fork(&mut self) -> Box<dyn ForkedState> {
        Box::new(LiveEntries { fork: self.map.fork(), now: self.now, ttl: self.config.ttl })
    }
    /// Restores the entries of `parts` that `keep` accepts.
    fn restore_parts(&mut self, parts: &[&[u8]], keep: impl Fn(&K) -> bool) -> Result<()> {
        let mut all = Vec::new();
        for bytes in parts {
            all.extend(from_bytes::<Vec<(K, Stamped<V>)>>(bytes)?);
        }
        self.rebuild(all, keep);
        Ok(())
    }
    fn advance(&mut self, processing_ms: Timestamp, watermark: Option<Timestamp>) {
        let now = match self.config.time {
            TtlTime::ProcessingTime => processing_ms,
            TtlTime::EventTime => watermark.unwrap_or(0),
        };
        self.now = self.now.max(now);
    }
}

/// One value per key that expires (see [`StateTtlConfig`]).
pub struct TtlValueState<K, V> {
    inner: TtlMap<K, V>,
}

/// A list per key that expires as a whole, from its last write.
pub struct TtlListState<K, T> {
    inner: TtlMap<K, Vec<T>>,
}

impl<K: Key, V: Clone + Persist> TtlValueState<K, V> {
    /// Empty state whose values expire as `config` says.
    pub fn new(config: StateTtlConfig) -> Self {
        TtlValueState { inner: TtlMap::new(config) }
    }
    /// Live values (expired ones not yet removed included).
    pub fn len(&self) -> usize {
        self.inner.map.len()
    }
    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.inner.map.is_empty()
    }
}

impl<K: Key, T: Clone + Persist> TtlListState<K, T> {
    /// Empty state whose lists expire as `config` says.
    pub fn new(config: StateTtlConfig) -> Self {
        TtlListState { inner: TtlMap::new(config) }
    }
    /// Lists held (expired ones not yet removed included).
    pub fn len(&self) -> usize {
        self.inner.map.len()
    }
    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.inner.map.is_empty()
    }
}

macro_rules! ttl_state {
    ($state:ident<$k:ident, $v:ident>) => {
        impl<$k: Key, $v: Persist + Clone + Send + Sync + 'static> Snapshot for $state<$k, $v> {
            fn fork(&mut self) -> Box<dyn ForkedState> {
                self.inner.fork()
            }
            fn restore(&mut self, bytes: &[u8]) -> Result<()> {
                self.inner.restore_parts(&[bytes], |_| true)
            }
        }
        impl<$k: Key, $v: Persist + Clone + Send + Sync + 'static> KeyedState for $state<$k, $v> {
            fn restore_owned(&mut self, parts: &[&[u8]], scope: &KeyScope) -> Result<()> {
                self.inner.restore_parts(parts, |k| scope.owns(hash_key(k)))
            }
            fn check(&self) -> Result<()> {
                self.inner.config.validate()
            }
        }
    };
}
ttl_state!(TtlValueState<K, V>);
ttl_state!(TtlListState<K, T>);

/// A map per key whose entries expire one by one (Flink's `MapState` with a TTL): entries by
/// (key, user key), and per key the list of its user keys (not snapshotted: rebuilt on
/// restore; a user key whose entry expired stays listed until the key's entries are read).
pub struct TtlMapState<K, UK, UV> {
    inner: TtlMap<(K, UK), UV>,
    user_keys: PagedMap<K, Vec<UK>>,
}

impl<K: Key, UK: Key, UV: Clone + Persist> TtlMapState<K, UK, UV> {
    /// Empty state whose entries expire as `config` says.
    pub fn new(config: StateTtlConfig) -> Self {
        TtlMapState { inner: TtlMap::new(config), user_keys: PagedMap::new() }
    }
    /// Entries held (expired ones not yet removed included).
    pub fn len(&self) -> usize {
        self.inner.map.len()
    }
    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.inner.map.is_empty()
    }
    fn index_user_keys(&mut self) {
        let mut user_keys: PagedMap<K, Vec<UK>> = PagedMap::new();
        for ((k, u), _) in self.inner.map.iter() {
            user_keys.get_or_insert_with(k.clone(), Vec::new).push(u.clone());
        }
        self.user_keys = user_keys;
    }
}

impl<K: Key, UK: Key, UV: Persist + Clone + Send + Sync + 'static> Snapshot for TtlMapState<K, UK, UV> {
    fn fork(&mut self) -> Box<dyn ForkedState> {
        self.inner.fork()
    }
    fn restore(&mut self, bytes: &[u8]) -> Result<()> {
        self.inner.restore_parts(&[bytes], |_| true)?;
        self.index_user_keys();
        Ok(())
    }
}

impl<K: Key, UK: Key, UV: Persist + Clone + Send + Sync + 'static> KeyedState for TtlMapState<K, UK, UV> {
    fn restore_owned(&mut self, parts: &[&[u8]], scope: &KeyScope) -> Result<()> {
        self.inner.restore_parts(parts, |(k, _)| scope.owns(hash_key(k)))?;
        self.index_user_keys();
        Ok(())
    }
    fn check(&self) -> Result<()> {
        self.inner.config.validate()
    }
}

/// One key's map in a [`TtlMapState`].
pub struct TtlMapView<'a, K, UK, UV> {
    state: &'a mut TtlMapState<K, UK, UV>,
    key: &'a K,
}

impl<K: Key, UK: Key, UV: Clone + Persist> TtlMapView<'_, K, UK, UV> {
    /// Sets entry `user_key` (its life starts again).
    pub fn put(&mut self, user_key: UK, value: UV) {
        let fresh = self.state.inner.map.get(&(self.key.clone(), user_key.clone())).is_none();
        self.state.inner.put(&(self.key.clone(), user_key.clone()), value);
        if fresh {
            let listed = self.state.user_keys.get_or_insert_with(self.key.clone(), Vec::new);
            if !listed.contains(&user_key) {
                listed.push(user_key);
            }
        }
    }
    /// Entry `user_key`, unless it expired.
    pub fn get(&mut self, user_key: &UK) -> Option<&UV> {
        self.state.inner.get(&(self.key.clone(), user_key.clone()))
    }
    /// Removes entry `user_key`, returning it unless it had expired.
    pub fn remove(&mut self, user_key: &UK) -> Option<UV> {
        let v = self.state.inner.remove(&(self.key.clone(), user_key.clone()));
        if let Some(listed) = self.state.user_keys.get_mut(self.key) {
            listed.retain(|u| u != user_key);
            if listed.is_empty() {
                self.state.user_keys.remove(self.key);
            }
        }
        v
    }
    /// The entries that have not expired, in no particular order (copies: reading one may
    /// restart its life, or remove it).
    pub fn entries(&mut self) -> Vec<(UK, UV)> {
        let listed: Vec<UK> = self.state.user_keys.get(self.key).cloned().unwrap_or_default();
        let mut live = Vec::with_capacity(listed.len());
        for u in listed {
            match self.state.inner.get(&(self.key.clone(), u.clone())).cloned() {
                Some(v) => live.push((u, v)),
                None => {
                    // Expired (or removed by the cleanup): drop it from the list too.
                    if let Some(l) = self.state.user_keys.get_mut(self.key) {
                        l.retain(|x| *x != u);
                    }
                }
            }
        }
        live
    }
}

impl<K: Key, UK: Key, UV: Persist + Clone + Send + Sync + 'static> ScopedState<K> for TtlMapState<K, UK, UV> {
    type View<'a>
        = TtlMapView<'a, K, UK, UV>
    where
        K: 'a,
        UK: 'a,
        UV: 'a;
    fn scoped<'a>(&'a mut self, key: &'a K) -> TtlMapView<'a, K, UK, UV> {
        TtlMapView { state: self, key }
    }
    fn advance_time(&mut self, processing_ms: Timestamp, watermark: Option<Timestamp>) {
        self.inner.advance(processing_ms, watermark)
    }
}

/// One key's value in a [`TtlValueState`].
pub struct TtlValueView<'a, K, V> {
    state: &'a mut TtlMap<K, V>,
    key: &'a K,
}

impl<K: Key, V: Clone + Persist> TtlValueView<'_, K, V> {
    /// The value, unless it expired (a read restarts its life with
    /// [`TtlUpdate::OnReadAndWrite`]).
    pub fn get(&mut self) -> Option<&V> {
        self.state.get(self.key)
    }
    /// Sets the value (its life starts again).
    pub fn set(&mut self, value: V) {
        self.state.put(self.key, value)
    }
    /// The value for changing, made by `init` if there is none or it expired (its life
    /// starts again).
    pub fn get_or_insert_with(&mut self, init: impl FnOnce() -> V) -> &mut V {
        self.state.get_mut_or_insert_with(self.key, init)
    }
    /// Removes the value, returning it unless it had expired.
    pub fn clear(&mut self) -> Option<V> {
        self.state.remove(self.key)
    }
}

/// One key's list in a [`TtlListState`].
pub struct TtlListView<'a, K, T> {
    state: &'a mut TtlMap<K, Vec<T>>,
    key: &'a K,
}

impl<K: Key, T: Clone + Persist> TtlListView<'_, K, T> {
    /// Appends `value` (the list's life starts again).
    pub fn add(&mut self, value: T) {
        self.state.get_mut_or_insert_with(self.key, Vec::new).push(value)
    }
    /// The list, unless it expired.
    pub fn get(&mut self) -> &[T] {
        self.state.get(self.key).map_or(&[], Vec::as_slice)
    }
    /// Removes the list, returning it unless it had expired.
    pub fn take(&mut self) -> Vec<T> {
        self.state.remove(self.key).unwrap_or_default()
    }
}

impl<K: Key, V: Persist + Clone + Send + Sync + 'static> ScopedState<K> for TtlValueState<K, V> {
    type View<'a>
        = TtlValueView<'a, K, V>
    where
        K: 'a,
        V: 'a;
    fn scoped<'a>(&'a mut self, key: &'a K) -> TtlValueView<'a, K, V> {
        TtlValueView { state: &mut self.inner, key }
    }
    fn advance_time(&mut self, processing_ms: Timestamp, watermark: Option<Timestamp>) {
        self.inner.advance(processing_ms, watermark)
    }
}

impl<K: Key, T: Persist + Clone + Send + Sync + 'static> ScopedState<K> for TtlListState<K, T> {
    type View<'a>
        = TtlListView<'a, K, T>
    where
        K: 'a,
        T: 'a;
    fn scoped<'a>(&'a mut self, key: &'a K) -> TtlListView<'a, K, T> {
        TtlListView { state: &mut self.inner, key }
    }
    fn advance_time(&mut self, processing_ms: Timestamp, watermark: Option<Timestamp>) {
        self.inner.advance(processing_ms, watermark)
    }
}

// Their fields are closures, shared internals or whole state: a name says enough.
crate::debug_as_name!([K, V] TtlValueState<K, V>);
crate::debug_as_name!([K, T] TtlListState<K, T>);
crate::debug_as_name!([K, UK, UV] TtlMapState<K, UK, UV>);
crate::debug_as_name!(['a, K, UK, UV] TtlMapView<'a, K, UK, UV>);
crate::debug_as_name!(['a, K, V] TtlValueView<'a, K, V>);
crate::debug_as_name!(['a, K, T] TtlListView<'a, K, T>);

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(s: &mut impl Snapshot) -> Vec<u8> {
        let mut bytes = Vec::new();
        s.fork().write_to(&mut bytes).unwrap();
        bytes
    }

    #[test]
    fn values_expire_after_their_ttl_and_are_not_written_to_snapshots() {
        let mut s: TtlValueState<u64, u64> = TtlValueState::new(StateTtlConfig::event_time(10));
        s.advance_time(0, Some(100));
        for k in 0..10 {
            s.scoped(&k).set(k);
        }
        s.advance_time(0, Some(105));
        s.scoped(&0).set(99); // restarts key 0's life
        s.advance_time(0, Some(110));
        assert_eq!(s.scoped(&1).get(), None, "expired at 110");
        assert_eq!(s.scoped(&0).get(), Some(&99));
        let mut back: TtlValueState<u64, u64> = TtlValueState::new(StateTtlConfig::event_time(10));
        back.restore(&snapshot(&mut s)).unwrap();
        assert_eq!(back.len(), 1, "only the live value was written");
        // Incremental cleanup removed expired entries as the state was used.
        assert!(s.len() < 10, "{} entries left", s.len());
    }

    #[test]
    fn read_and_write_updates_and_visibility_of_expired_values() {
        let cfg = StateTtlConfig::event_time(10).update(TtlUpdate::OnReadAndWrite).cleanup_per_access(0);
        let mut s: TtlValueState<u64, u64> = TtlValueState::new(cfg);
        s.advance_time(0, Some(0));
        s.scoped(&1).set(1);
        s.advance_time(0, Some(8));
        assert_eq!(s.scoped(&1).get(), Some(&1), "a read at 8 restarts the life");
        s.advance_time(0, Some(15));
        assert_eq!(s.scoped(&1).get(), Some(&1), "alive until 18");
        let cfg = cfg.update(TtlUpdate::OnCreateAndWrite).visibility(TtlVisibility::ReturnExpiredIfNotCleanedUp);
        let mut r: TtlListState<u64, u32> = TtlListState::new(cfg);
        r.advance_time(0, Some(0));
        r.scoped(&1).add(7);
        r.advance_time(0, Some(50));
        assert_eq!(r.scoped(&1).get(), &[7], "expired but not cleaned up: still readable");
        assert!(StateTtlConfig::event_time(0).validate().is_err());
    }

    #[test]
    fn map_entries_expire_one_by_one_and_split_by_key_group() {
        let mut m: TtlMapState<u64, u32, u64> = TtlMapState::new(StateTtlConfig::event_time(10));
        m.advance_time(0, Some(0));
        for k in 0..200u64 {
            m.scoped(&k).put(1, k);
        }
        m.advance_time(0, Some(6));
        for k in 0..200u64 {
            m.scoped(&k).put(2, k * 2);
        }
        m.advance_time(0, Some(12)); // user key 1 (written at 0) expired, 2 (at 6) lives
        assert_eq!(m.scoped(&7).entries(), vec![(2, 14)]);
        assert_eq!(m.scoped(&8).get(&1), None);
        let bytes = snapshot(&mut m);
        let scopes = [0, 1].map(|subtask| KeyScope { subtask, parallelism: 2, max_parallelism: 128 });
        let mut total = 0;
        for scope in &scopes {
            let mut part: TtlMapState<u64, u32, u64> = TtlMapState::new(StateTtlConfig::event_time(10));
            part.restore_owned(&[&bytes], scope).unwrap();
            part.advance_time(0, Some(12));
            for k in (0..200u64).filter(|k| scope.owns(hash_key(k))) {
                assert_eq!(part.scoped(&k).entries(), vec![(2, k * 2)], "key {k}");
            }
            total += part.len();
        }
        assert_eq!(total, 200, "only live entries were written, each restored once");
    }
}
