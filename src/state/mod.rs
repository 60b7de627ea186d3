//! Keyed state, and the snapshot interface every stateful operator implements.
//!
//! A snapshot is two steps (Flink's synchronous and asynchronous parts): a synchronous
//! [`Snapshot::fork`] taken while the task is paused at a barrier, and an asynchronous
//! [`ForkedState::write_to`] run in the background while the task goes on. Every keyed state
//! ([`KeyedValueState`] and the kinds in `kinds`, timers, TTL) keeps its entries in a
//! `PagedMap` (`paged`), whose fork shares its pages copy-on-write: the pause is proportional
//! to the number of pages, not to the bytes of state.
//!
//! May touch: `error`, `persist`, `record`, `snapshot`, `context` (the wall clock, for a
//! fault's time), `metrics` (a state memory budget's figures).

use crate::error::Result;
use crate::persist::Persist;
use crate::record::Key;

mod cold;
pub(crate) use cold::scratch_file;
mod kinds;
mod paged;
mod scoped;
mod timers;
mod ttl;

pub use crate::snapshot::{restore_lazily, PageSource, StateFailure, StoredPage};
pub use crate::snapshot::{ForkedState, PersistedFork, StateChunks};
pub use cold::{BudgetScope, ByteSize, PageReader, StateBudget, LEAST_STATE_MEMORY_PER_TASK};
pub use kinds::{AggregatingState, KeyedState, ListState, MapState};
pub use paged::{state_memory_bytes, state_memory_peak_bytes, OwnedPages, PagedFork, PagedImage, PagedMap, PAGE_SLOTS};
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
    /// Replaces the state with a fork [`Snapshot::fork`] made, kept in this process (local
    /// recovery). By default from the fork's encoding; paged state shares the fork's pages
    /// again (copied on their first write, as after any fork).
    fn restore_local(&mut self, fork: &dyn ForkedState) -> Result<()> {
        self.restore(&crate::snapshot::encoded(fork)?)
    }
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

impl<K: Key, V: Clone + Persist> Default for KeyedValueState<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Key, V: Clone + Persist> KeyedValueState<K, V> {
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
    /// Writes for a run of records without a copy-on-write check per record, when no snapshot
    /// shares a page ([`PagedMap::owned_pages`]).
    #[inline]
    pub fn owned_pages(&mut self) -> Option<OwnedPages<'_, K, V>> {
        self.map.owned_pages()
    }
    /// [`PagedMap::owned_pages_tracked`]: the same, while writes are tracked for changelog
    /// checkpoints.
    #[inline]
    pub fn owned_pages_tracked(&mut self) -> Option<OwnedPages<'_, K, V, true>> {
        self.map.owned_pages_tracked()
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

/// Lookups by a key's hash for a run of records: a [`KeyedValueState`] checks copy-on-write
/// ownership per write, its [`OwnedPages`] once for the run.
pub(crate) trait HashedEntries<K, V> {
    fn prefetch_hashed(&self, hash: u64);
    fn entry_hashed(&mut self, hash: u64, key: K, init: impl FnOnce() -> V) -> (&K, &mut V);
    fn entry_by_ref_hashed<Q>(&mut self, hash: u64, key: &Q, init: impl FnOnce() -> V) -> (&K, &mut V)
    where
        Q: ?Sized + std::hash::Hash + Eq + ToOwned<Owned = K>,
        K: std::borrow::Borrow<Q>;
}

impl<K: Key, V: Clone + Persist> HashedEntries<K, V> for KeyedValueState<K, V> {
    #[inline(always)]
    fn prefetch_hashed(&self, hash: u64) {
        self.map.prefetch_hashed(hash)
    }
    #[inline(always)]
    fn entry_hashed(&mut self, hash: u64, key: K, init: impl FnOnce() -> V) -> (&K, &mut V) {
        self.map.entry_hashed(hash, key, init)
    }
    #[inline(always)]
    fn entry_by_ref_hashed<Q>(&mut self, hash: u64, key: &Q, init: impl FnOnce() -> V) -> (&K, &mut V)
    where
        Q: ?Sized + std::hash::Hash + Eq + ToOwned<Owned = K>,
        K: std::borrow::Borrow<Q>,
    {
        self.map.entry_by_ref_hashed(hash, key, init)
    }
}

impl<K: Key, V: Clone + Persist, const TRACK: bool> HashedEntries<K, V> for OwnedPages<'_, K, V, TRACK> {
    #[inline(always)]
    fn prefetch_hashed(&self, hash: u64) {
        OwnedPages::prefetch_hashed(self, hash)
    }
    #[inline(always)]
    fn entry_hashed(&mut self, hash: u64, key: K, init: impl FnOnce() -> V) -> (&K, &mut V) {
        OwnedPages::entry_hashed(self, hash, key, init)
    }
    #[inline(always)]
    fn entry_by_ref_hashed<Q>(&mut self, hash: u64, key: &Q, init: impl FnOnce() -> V) -> (&K, &mut V)
    where
        Q: ?Sized + std::hash::Hash + Eq + ToOwned<Owned = K>,
        K: std::borrow::Borrow<Q>,
    {
        OwnedPages::entry_by_ref_hashed(self, hash, key, init)
    }
}

impl<K: Key + Sync, V: Persist + Clone + Send + Sync + 'static> Snapshot for KeyedValueState<K, V> {
    fn fork(&mut self) -> Box<dyn ForkedState> {
        Box::new(kinds::ForkedMap(self.map.fork()))
    }

    fn restore(&mut self, bytes: &[u8]) -> Result<()> {
        self.map = kinds::read_map(bytes)?;
        Ok(())
    }

    fn restore_local(&mut self, fork: &dyn ForkedState) -> Result<()> {
        match fork.as_any().and_then(|f| f.downcast_ref::<kinds::ForkedMap<K, V>>()) {
            Some(f) => {
                self.map = PagedMap::from_fork(&f.0);
                Ok(())
            }
            None => self.restore(&crate::snapshot::encoded(fork)?),
        }
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
        let parts: Vec<&[u8]> = parts.collect();
        self.map = kinds::read_entries(&parts, |k| scope.owns(crate::record::hash_key(k)))?;
        Ok(())
    }
}

// Their fields are closures, shared internals or whole state: a name says enough.
crate::debug_as_name!([K, V] KeyedValueState<K, V>);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::KeyScope;

    /// Local recovery hands the fork's pages back without encoding them: the restored state
    /// equals the snapshot, shares its pages (a write copies a page, never reaching the
    /// fork), and a fork of another kind is restored from its encoding instead.
    #[test]
    fn a_fork_restored_locally_shares_its_pages_until_written() {
        let mut s: KeyedValueState<u64, u64> = KeyedValueState::new();
        for k in 0..5_000u64 {
            *s.get_or_insert_with(k, || 0) = k * 2;
        }
        let fork = s.fork();
        let mut bytes = Vec::new();
        fork.write_to(&mut bytes).unwrap();

        let mut local: KeyedValueState<u64, u64> = KeyedValueState::new();
        local.restore_local(&*fork).unwrap();
        assert!((0..5_000u64).all(|k| local.get(&k) == Some(&(k * 2))));
        assert_eq!(local.map.copied_pages(), 0);
        *local.get_or_insert_with(7, || 0) += 1;
        assert_eq!(local.map.copied_pages(), 1, "the first write copies the page it shares with the fork");
        let mut again = Vec::new();
        fork.write_to(&mut again).unwrap();
        assert_eq!(again, bytes, "the write did not reach the fork");

        // A fork that is not this state's own: restored from its encoding.
        let mut decoded: KeyedValueState<u64, u64> = KeyedValueState::new();
        decoded.restore_local(&crate::snapshot::RawBytes(bytes)).unwrap();
        assert!((0..5_000u64).all(|k| decoded.get(&k) == Some(&(k * 2))));
    }

    thread_local! {
        static COMPARISONS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }

    /// A key that counts how often it is compared: a lookup's probe run, in comparisons.
    #[derive(Clone, Eq, Debug)]
    struct Probed(u64);

    impl std::hash::Hash for Probed {
        fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
            self.0.hash(state)
        }
    }

    impl PartialEq for Probed {
        fn eq(&self, other: &Self) -> bool {
            COMPARISONS.with(|c| c.set(c.get() + 1));
            self.0 == other.0
        }
    }

    impl Persist for Probed {
        fn persist(&self, out: &mut Vec<u8>) {
            self.0.persist(out)
        }
        fn restore(input: &mut &[u8]) -> Result<Self> {
            u64::restore(input).map(Probed)
        }
    }

    fn comparisons(f: impl FnOnce()) -> u64 {
        let before = COMPARISONS.with(|c| c.get());
        f();
        COMPARISONS.with(|c| c.get()) - before
    }

    /// A snapshot's entries come back in slot order (sorted by hash); inserted into a map
    /// that grew as they came, they piled up in probe runs as long as a fraction of the map
    /// (restoring 400,000 keys took 19 s). A restore at the same parallelism puts every entry
    /// back into the slot it had, comparing no key; a rescaled one builds its map sized first:
    /// a few comparisons per key, at any number of keys.
    #[test]
    fn restores_compare_each_key_a_few_times_at_any_size() {
        const KEYS: u64 = 100_000;
        let mut s: KeyedValueState<Probed, u64> = KeyedValueState::new();
        for k in 0..KEYS {
            s.put(Probed(k), k);
        }
        let mut bytes = Vec::new();
        s.fork().write_to(&mut bytes).unwrap();
        let mut r: KeyedValueState<Probed, u64> = KeyedValueState::new();
        let whole = comparisons(|| r.restore(&bytes).unwrap());
        assert_eq!(r.len() as u64, KEYS);
        assert_eq!(whole, 0, "a restore at the same parallelism compares no key");
        assert!((0..KEYS).all(|k| r.get(&Probed(k)) == Some(&k)));
        // Rescaled: two old subtasks' snapshots into one, and one into two halves.
        let one = KeyScope { subtask: 0, parallelism: 1, max_parallelism: 128 };
        let merged = comparisons(|| r.restore_owned([bytes.as_slice(), bytes.as_slice()].into_iter(), &one).unwrap());
        assert!(merged < 8 * KEYS, "{merged} comparisons to merge {KEYS} keys twice");
        let half = KeyScope { subtask: 1, parallelism: 2, max_parallelism: 128 };
        let split = comparisons(|| r.restore_owned(std::iter::once(bytes.as_slice()), &half).unwrap());
        assert!(split < 4 * KEYS && !r.is_empty() && (r.len() as u64) < KEYS, "{split} comparisons, {} keys", r.len());
        // The other kinds read their entries the same way.
        let mut lists: ListState<Probed, u64> = ListState::new();
        for k in 0..KEYS {
            lists.add(Probed(k), k);
        }
        let mut bytes = Vec::new();
        lists.fork().write_to(&mut bytes).unwrap();
        let list = comparisons(|| lists.restore(&bytes).unwrap());
        assert!(list == 0 && lists.len() as u64 == KEYS, "{list} comparisons to restore {KEYS} lists");
        let mut timers: TimerService<Probed> = TimerService::new();
        for k in 0..KEYS {
            timers.register(TimeDomain::EventTime, &Probed(k), k as crate::record::Timestamp);
        }
        let mut bytes = Vec::new();
        timers.fork().write_to(&mut bytes).unwrap();
        let timed = comparisons(|| timers.restore(&bytes).unwrap());
        assert!(timed == 0 && timers.len() as u64 == KEYS, "{timed} comparisons to restore {KEYS} timers");
    }

    /// Snapshots written before the map was written slot by slot (the entries alone) still
    /// restore, at the same parallelism and rescaled.
    #[test]
    fn snapshots_of_the_entries_alone_still_restore() {
        let entries: Vec<(u64, u64)> = (0..10_000).map(|k| (k, k * 3)).collect();
        let bytes = crate::persist::to_bytes(&entries);
        let mut r: KeyedValueState<u64, u64> = KeyedValueState::new();
        r.restore(&bytes).unwrap();
        assert_eq!(r.len(), 10_000);
        assert!((0..10_000).all(|k| r.get(&k) == Some(&(k * 3))));
        let half = KeyScope { subtask: 0, parallelism: 2, max_parallelism: 128 };
        r.restore_owned(std::iter::once(bytes.as_slice()), &half).unwrap();
        assert!(r.len() > 1_000 && r.len() < 9_000);
        assert!(r.iter().all(|(k, v)| *v == k * 3 && half.owns(crate::record::hash_key(k))));
    }

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
