//! Keyed state, and the snapshot interface every stateful operator implements.
//!
//! A snapshot is two steps, as DESIGN.md section 4 requires: a synchronous [`Snapshot::fork`]
//! taken while the task is paused at a barrier, and an asynchronous [`ForkedState::write_to`]
//! run in the background while the task goes on. Today's [`KeyedValueState`] forks by copying
//! its map; the arena backend (a later issue) forks by sharing pages copy-on-write behind the
//! same two calls, so operators need not change.
//!
//! May touch: `error`, `persist`, `record`, `snapshot`.

use crate::error::Result;
use crate::persist::{from_bytes, Persist};
use crate::record::Key;

mod kinds;
mod paged;
mod scoped;
mod timers;
mod ttl;

pub use crate::snapshot::{ForkedState, PersistedFork, StateChunks};
pub use kinds::{AggregatingState, KeyedState, ListState, MapState};
pub use paged::{state_memory_bytes, PagedFork, PagedMap, PAGE_SLOTS};
pub use scoped::{AggregatingView, ListView, MapView, ReducingState, ReducingView, ScopedState, ValueView};
pub use timers::{TimeDomain, TimerService};
pub use ttl::{
    StateTtlConfig, TtlListState, TtlListView, TtlMapState, TtlMapView, TtlTime, TtlUpdate, TtlValueState,
    TtlValueView, TtlVisibility,
};

/// Forks a [`PagedMap`] for a snapshot written as its entries (`Vec<(K, V)>`).
pub(crate) fn fork_paged<K: Key + Sync, V: Persist + Clone + Send + Sync + 'static>(
    map: &mut PagedMap<K, V>,
) -> Box<dyn ForkedState> {
    Box::new(kinds::ForkedMap(map.fork()))
}

/// State that can be snapshotted in two steps.
pub trait Snapshot {
    /// The synchronous part: capture the current state so later writes do not affect it.
    fn fork(&mut self) -> Box<dyn ForkedState>;
    /// Replaces the state with what [`ForkedState::write_to`] wrote.
    fn restore(&mut self, bytes: &[u8]) -> Result<()>;
}

/// One value per key (Flink's `ValueState`), local to a subtask, in copy-on-write pages: a
/// snapshot's synchronous part shares the pages (pointer work per page), and the live state
/// copies a page only when it first writes to it while a snapshot holds it.
///
/// ```
/// use weir::state::KeyedValueState;
/// let mut counts: KeyedValueState<u64, u64> = KeyedValueState::new();
/// *counts.get_or_insert_with(7, || 0) += 1;
/// assert_eq!(counts.get(&7), Some(&1));
/// ```
pub struct KeyedValueState<K, V> {
    map: PagedMap<K, V>,
}

impl<K: Key, V: Clone> Default for KeyedValueState<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Key, V: Clone> KeyedValueState<K, V> {
    /// Empty state.
    pub fn new() -> Self {
        KeyedValueState { map: PagedMap::new() }
    }
    /// The value of `key`.
    #[inline]
    pub fn get(&self, key: &K) -> Option<&V> {
        self.map.get(key)
    }
    /// The value of `key`, inserting `init()` first if there is none.
    #[inline]
    pub fn get_or_insert_with(&mut self, key: K, init: impl FnOnce() -> V) -> &mut V {
        self.map.get_or_insert_with(key, init)
    }
    /// Starts loading the memory a lookup of `key` reads (see [`PagedMap::prefetch`]).
    #[inline]
    pub fn prefetch(&self, key: &K) {
        self.map.prefetch(key)
    }
    /// [`Self::prefetch`] by the key's hash ([`crate::record::hash_key`]).
    #[inline]
    pub fn prefetch_hashed(&self, hash: u64) {
        self.map.prefetch_hashed(hash)
    }
    /// [`Self::get_or_insert_with`] with the key's hash ([`crate::record::hash_key`]) already
    /// computed (a caller that prefetched by it hashes each key once).
    #[inline]
    pub fn get_or_insert_with_hashed(&mut self, hash: u64, key: K, init: impl FnOnce() -> V) -> &mut V {
        self.map.get_or_insert_with_hashed(hash, key, init)
    }
    /// [`Self::get_or_insert_with_hashed`], also handing back the key as stored.
    #[inline]
    pub fn entry_hashed(&mut self, hash: u64, key: K, init: impl FnOnce() -> V) -> (&K, &mut V) {
        self.map.entry_hashed(hash, key, init)
    }
    /// Sets the value of `key`.
    #[inline]
    pub fn put(&mut self, key: K, value: V) {
        self.map.insert(key, value);
    }
    /// Removes `key`.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        self.map.remove(key)
    }
    /// Number of keys.
    pub fn len(&self) -> usize {
        self.map.len()
    }
    /// Whether no key has a value.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
    /// All entries, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.map.iter()
    }
    /// Bytes of the live pages.
    pub fn memory_bytes(&self) -> usize {
        self.map.page_bytes()
    }
}

impl<K: Key + Sync, V: Persist + Clone + Send + Sync + 'static> Snapshot for KeyedValueState<K, V> {
    fn fork(&mut self) -> Box<dyn ForkedState> {
        Box::new(kinds::ForkedMap(self.map.fork()))
    }

    fn restore(&mut self, bytes: &[u8]) -> Result<()> {
        let entries: Vec<(K, V)> = from_bytes(bytes)?;
        let mut map = PagedMap::new();
        for (k, v) in entries {
            map.insert(k, v);
        }
        self.map = map;
        Ok(())
    }
}

impl<K: Key, V: Persist + Clone> KeyedValueState<K, V> {
    /// Restores from the snapshots of several subtasks saved at another parallelism, keeping
    /// the keys whose key groups `scope` owns now.
    pub fn restore_owned<'a>(
        &mut self,
        parts: impl Iterator<Item = &'a [u8]>,
        scope: &crate::record::KeyScope,
    ) -> Result<()> {
        let mut map = PagedMap::new();
        for bytes in parts {
            let entries: Vec<(K, V)> = from_bytes(bytes)?;
            for (k, v) in entries.into_iter().filter(|(k, _)| scope.owns(crate::record::hash_key(k))) {
                map.insert(k, v);
            }
        }
        self.map = map;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fork_is_isolated_from_later_writes_and_restores() {
        let mut s: KeyedValueState<u64, u64> = KeyedValueState::new();
        for k in 0..100 {
            s.put(k, k * 10);
        }
        let fork = s.fork();
        for k in 0..100 {
            *s.get_or_insert_with(k, || 0) += 1;
        }
        s.put(1000, 1);
        let mut bytes = Vec::new();
        let n = fork.write_to(&mut bytes).unwrap();
        assert_eq!(n as usize, bytes.len());
        let mut r: KeyedValueState<u64, u64> = KeyedValueState::new();
        r.restore(&bytes).unwrap();
        assert_eq!(r.len(), 100);
        for k in 0..100 {
            assert_eq!(r.get(&k), Some(&(k * 10)));
        }
        assert_eq!(s.get(&5), Some(&51));
        assert!(r.restore(&bytes[..10]).is_err(), "a truncated snapshot must not restore");
    }
}
