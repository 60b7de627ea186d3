//! The keyed state kinds beside [`super::KeyedValueState`] (Flink's `AggregatingState`,
//! `ListState` and `MapState`), all in copy-on-write pages, and [`KeyedState`]: what a
//! [`crate::pipeline::KeyedStream::process`] operator's state must do (fork, restore, and
//! restore at another parallelism by key group).
//!
//! May touch: `error`, `persist`, `record`, `snapshot`, `state::paged`.

use super::paged::{PagedFork, PagedImage, PagedMap};
use super::{KeyedValueState, Snapshot};
use crate::error::Result;
use crate::persist::{from_bytes, Persist};
use crate::record::{hash_key, Key, KeyScope};
use crate::snapshot::{ForkedState, StateChunks};

/// Keyed state a stateful operator holds: snapshotted in two steps ([`Snapshot`]) and
/// restorable from the snapshots of subtasks saved at another parallelism.
pub trait KeyedState: Snapshot + Send + 'static {
    /// Restores from the snapshots of several subtasks, keeping the keys whose key groups
    /// `scope` owns now.
    fn restore_owned(&mut self, parts: &[&[u8]], scope: &KeyScope) -> Result<()>;
    /// Checks the state's configuration (a TTL of zero, say) when the job starts.
    fn check(&self) -> Result<()> {
        Ok(())
    }
}

/// Reads one subtask's snapshot of a [`PagedMap`] back whole (each entry into the slot it had,
/// see [`PagedImage`]).
pub(super) fn read_map<K, V>(bytes: &[u8]) -> Result<PagedMap<K, V>>
where
    K: Persist + std::hash::Hash + Eq + Clone,
    V: Persist + Clone,
{
    Ok(from_bytes::<PagedImage<K, V>>(bytes)?.into_map())
}

/// Reads the snapshots of several subtasks' [`PagedMap`]s into a fresh map, keeping the
/// entries `keep` accepts.
pub(super) fn read_entries<K, V>(parts: &[&[u8]], keep: impl Fn(&K) -> bool) -> Result<PagedMap<K, V>>
where
    K: Persist + std::hash::Hash + Eq + Clone,
    V: Persist + Clone,
{
    let mut kept = Vec::new();
    for bytes in parts {
        let entries = from_bytes::<PagedImage<K, V>>(bytes)?.into_entries();
        kept.extend(entries.into_iter().filter(|(k, _)| keep(k)));
    }
    Ok(PagedMap::from_entries(kept))
}

/// A fork of a [`PagedMap`], written as its entries.
pub(super) struct ForkedMap<K, V>(pub(super) PagedFork<K, V>);

impl<K: Persist + Send + Sync + 'static, V: Persist + Send + Sync + 'static> ForkedState for ForkedMap<K, V> {
    fn write_chunks(&self, out: &mut dyn StateChunks) -> std::io::Result<()> {
        self.0.write_chunks(out)
    }
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}

impl<K: Key, V: Persist + Clone + Send + Sync + 'static> KeyedState for KeyedValueState<K, V> {
    fn restore_owned(&mut self, parts: &[&[u8]], scope: &KeyScope) -> Result<()> {
        KeyedValueState::restore_owned(self, parts.iter().copied(), scope)
    }
}

/// One accumulator per key, folded by the state's own function (Flink's `AggregatingState`).
///
/// ```
/// use weir::state::AggregatingState;
/// let mut max: AggregatingState<u64, u64, u64> = AggregatingState::new(|| 0, |m, x| *m = (*m).max(x));
/// max.add(1, 5);
/// max.add(1, 3);
/// assert_eq!(max.get(&1), Some(&5));
/// ```
pub struct AggregatingState<K, T, A> {
    values: KeyedValueState<K, A>,
    init: fn() -> A,
    fold: fn(&mut A, T),
}

impl<K: Key, T, A: Clone + Persist> AggregatingState<K, T, A> {
    /// Empty state whose accumulators start as `init()` and take inputs with `fold`.
    pub fn new(init: fn() -> A, fold: fn(&mut A, T)) -> Self {
        AggregatingState { values: KeyedValueState::new(), init, fold }
    }
    /// Folds `input` into `key`'s accumulator; returns it.
    #[inline]
    pub fn add(&mut self, key: K, input: T) -> &A {
        let acc = self.values.get_or_insert_with(key, self.init);
        (self.fold)(acc, input);
        acc
    }
    /// `key`'s accumulator.
    pub fn get(&self, key: &K) -> Option<&A> {
        self.values.get(key)
    }
    /// Forgets `key`.
    pub fn clear(&mut self, key: &K) -> Option<A> {
        self.values.remove(key)
    }
    /// Number of keys.
    pub fn len(&self) -> usize {
        self.values.len()
    }
    /// Whether no key has an accumulator.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

impl<K: Key, T: 'static, A: Persist + Clone + Send + Sync + 'static> Snapshot for AggregatingState<K, T, A> {
    fn fork(&mut self) -> Box<dyn ForkedState> {
        self.values.fork()
    }
    fn restore(&mut self, bytes: &[u8]) -> Result<()> {
        self.values.restore(bytes)
    }
    fn restore_local(&mut self, fork: &dyn ForkedState) -> Result<()> {
        self.values.restore_local(fork)
    }
}

impl<K: Key, T: 'static, A: Persist + Clone + Send + Sync + 'static> KeyedState for AggregatingState<K, T, A> {
    fn restore_owned(&mut self, parts: &[&[u8]], scope: &KeyScope) -> Result<()> {
        KeyedValueState::restore_owned(&mut self.values, parts.iter().copied(), scope)
    }
}

/// A list per key (Flink's `ListState`). The lists' slots live in pages; their elements are
/// on the heap, copied with the slot when a page is copied on write.
///
/// ```
/// use weir::state::ListState;
/// let mut l: ListState<u64, u32> = ListState::new();
/// l.add(7, 1);
/// l.add(7, 2);
/// assert_eq!(l.get(&7), &[1, 2]);
/// assert_eq!(l.take(&7), vec![1, 2]);
/// assert!(l.get(&7).is_empty());
/// ```
pub struct ListState<K, T> {
    lists: PagedMap<K, Vec<T>>,
}

impl<K: Key, T: Clone + Persist> Default for ListState<K, T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Key, T: Clone + Persist> ListState<K, T> {
    /// Empty state.
    pub fn new() -> Self {
        ListState { lists: PagedMap::new() }
    }
    /// Appends `value` to `key`'s list.
    #[inline]
    pub fn add(&mut self, key: K, value: T) {
        self.lists.get_or_insert_with(key, Vec::new).push(value);
    }
    /// `key`'s list (empty if none).
    pub fn get(&self, key: &K) -> &[T] {
        self.lists.get(key).map_or(&[], Vec::as_slice)
    }
    /// Replaces `key`'s list (an empty one removes the key).
    pub fn update(&mut self, key: K, values: Vec<T>) {
        if values.is_empty() {
            self.lists.remove(&key);
        } else {
            self.lists.insert(key, values);
        }
    }
    /// Removes and returns `key`'s list.
    pub fn take(&mut self, key: &K) -> Vec<T> {
        self.lists.remove(key).unwrap_or_default()
    }
    /// Number of keys with a list.
    pub fn len(&self) -> usize {
        self.lists.len()
    }
    /// Whether no key has a list.
    pub fn is_empty(&self) -> bool {
        self.lists.is_empty()
    }
}

impl<K: Key, T: Persist + Clone + Send + Sync + 'static> Snapshot for ListState<K, T> {
    fn fork(&mut self) -> Box<dyn ForkedState> {
        Box::new(ForkedMap(self.lists.fork()))
    }
    fn restore(&mut self, bytes: &[u8]) -> Result<()> {
        self.lists = read_map(bytes)?;
        Ok(())
    }
}

impl<K: Key, T: Persist + Clone + Send + Sync + 'static> KeyedState for ListState<K, T> {
    fn restore_owned(&mut self, parts: &[&[u8]], scope: &KeyScope) -> Result<()> {
        self.lists = read_entries(parts, |k: &K| scope.owns(hash_key(k)))?;
        Ok(())
    }
}

/// A map per key (Flink's `MapState`): entries by (key, user key) in pages, and per key the
/// list of its user keys, for iteration.
///
/// ```
/// use weir::state::MapState;
/// let mut m: MapState<u64, u32, f64> = MapState::new();
/// m.put(1, 10, 0.5);
/// m.put(1, 11, 1.5);
/// assert_eq!(m.get(&1, &11), Some(&1.5));
/// assert_eq!(m.remove(&1, &10), Some(0.5));
/// assert_eq!(m.iter(&1).collect::<Vec<_>>(), vec![(&11, &1.5)]);
/// ```
pub struct MapState<K, UK, UV> {
    entries: PagedMap<(K, UK), UV>,
    user_keys: PagedMap<K, Vec<UK>>,
}

impl<K: Key, UK: Key, UV: Clone + Persist> Default for MapState<K, UK, UV> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Key, UK: Key, UV: Clone + Persist> MapState<K, UK, UV> {
    /// Empty state.
    pub fn new() -> Self {
        MapState { entries: PagedMap::new(), user_keys: PagedMap::new() }
    }
    /// Sets `key`'s entry `user_key` to `value`.
    pub fn put(&mut self, key: K, user_key: UK, value: UV) {
        let mut value = Some(value);
        let v = self.entries.get_or_insert_with((key.clone(), user_key.clone()), || value.take().expect("once"));
        match value {
            Some(value) => *v = value,
            None => self.user_keys.get_or_insert_with(key, Vec::new).push(user_key),
        }
    }
    /// `key`'s entry `user_key`.
    pub fn get(&self, key: &K, user_key: &UK) -> Option<&UV> {
        self.entries.get(&(key.clone(), user_key.clone()))
    }
    /// Whether `key` has an entry `user_key`.
    pub fn contains(&self, key: &K, user_key: &UK) -> bool {
        self.get(key, user_key).is_some()
    }
    /// Removes `key`'s entry `user_key`.
    pub fn remove(&mut self, key: &K, user_key: &UK) -> Option<UV> {
        let v = self.entries.remove(&(key.clone(), user_key.clone()))?;
        let keys = self.user_keys.get_or_insert_with(key.clone(), Vec::new);
        if let Some(i) = keys.iter().position(|u| u == user_key) {
            keys.swap_remove(i);
        }
        if keys.is_empty() {
            self.user_keys.remove(key);
        }
        Some(v)
    }
    /// `key`'s user keys, in no particular order.
    pub fn user_keys(&self, key: &K) -> &[UK] {
        self.user_keys.get(key).map_or(&[], Vec::as_slice)
    }
    /// `key`'s entries, in no particular order.
    pub fn iter<'a>(&'a self, key: &'a K) -> impl Iterator<Item = (&'a UK, &'a UV)> + 'a {
        self.user_keys(key).iter().map(move |u| (u, self.get(key, u).expect("listed user keys have entries")))
    }
    /// Entries in all.
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn index_user_keys(&mut self) {
        let mut user_keys: PagedMap<K, Vec<UK>> = PagedMap::new();
        for ((k, u), _) in self.entries.iter() {
            user_keys.get_or_insert_with(k.clone(), Vec::new).push(u.clone());
        }
        self.user_keys = user_keys;
    }
}

impl<K: Key, UK: Key, UV: Persist + Clone + Send + Sync + 'static> Snapshot for MapState<K, UK, UV> {
    /// Only the entries are written; the user-key lists are rebuilt on restore.
    fn fork(&mut self) -> Box<dyn ForkedState> {
        Box::new(ForkedMap(self.entries.fork()))
    }
    fn restore(&mut self, bytes: &[u8]) -> Result<()> {
        self.entries = read_map(bytes)?;
        self.index_user_keys();
        Ok(())
    }
}

impl<K: Key, UK: Key, UV: Persist + Clone + Send + Sync + 'static> KeyedState for MapState<K, UK, UV> {
    fn restore_owned(&mut self, parts: &[&[u8]], scope: &KeyScope) -> Result<()> {
        self.entries = read_entries(parts, |k: &(K, UK)| scope.owns(hash_key(&k.0)))?;
        self.index_user_keys();
        Ok(())
    }
}

/// Counts the bytes a [`ForkedState`] hands on.
struct Counted<'a> {
    inner: &'a mut dyn StateChunks,
    bytes: u64,
}

impl StateChunks for Counted<'_> {
    fn bytes(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.bytes += bytes.len() as u64;
        self.inner.bytes(bytes)
    }
    fn page(&mut self, version: u64, encode: &mut dyn FnMut(&mut Vec<u8>)) -> std::io::Result<u64> {
        let n = self.inner.page(version, encode)?;
        self.bytes += n;
        Ok(n)
    }
}

/// Two forks written one after the other, then the first one's length (8 bytes), so restore
/// can split them.
struct ForkedPair(Box<dyn ForkedState>, Box<dyn ForkedState>);

impl ForkedState for ForkedPair {
    fn write_chunks(&self, out: &mut dyn StateChunks) -> std::io::Result<()> {
        let mut first = Counted { inner: out, bytes: 0 };
        self.0.write_chunks(&mut first)?;
        let len = first.bytes;
        self.1.write_chunks(out)?;
        out.bytes(&len.to_le_bytes())
    }
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}

/// Splits what [`ForkedPair`] wrote.
fn split_pair(bytes: &[u8]) -> Result<(&[u8], &[u8])> {
    let corrupt = || crate::Error::Corrupt(format!("a state pair of {} bytes has no valid split", bytes.len()));
    let (body, len) = bytes.split_at_checked(bytes.len().checked_sub(8).ok_or_else(corrupt)?).ok_or_else(corrupt)?;
    let first = u64::from_le_bytes(len.try_into().expect("8 bytes"));
    // A lazy restore's bytes lack the pages the length counts.
    if let Some(split) = crate::snapshot::split_with_stored_pages(body, first) {
        return Ok(body.split_at(split.ok_or_else(corrupt)?));
    }
    let first = usize::try_from(first).ok().filter(|&f| f <= body.len()).ok_or_else(corrupt)?;
    Ok(body.split_at(first))
}

/// Two kinds of state in one operator: `(MapState<..>, ListState<..>)` and the like.
impl<A: Snapshot, B: Snapshot> Snapshot for (A, B) {
    fn fork(&mut self) -> Box<dyn ForkedState> {
        Box::new(ForkedPair(self.0.fork(), self.1.fork()))
    }
    fn restore(&mut self, bytes: &[u8]) -> Result<()> {
        let (a, b) = split_pair(bytes)?;
        self.0.restore(a)?;
        self.1.restore(b)
    }
    fn restore_local(&mut self, fork: &dyn ForkedState) -> Result<()> {
        match fork.as_any().and_then(|f| f.downcast_ref::<ForkedPair>()) {
            Some(ForkedPair(a, b)) => {
                self.0.restore_local(&**a)?;
                self.1.restore_local(&**b)
            }
            None => self.restore(&crate::snapshot::encoded(fork)?),
        }
    }
}

impl<A: KeyedState, B: KeyedState> KeyedState for (A, B) {
    fn check(&self) -> Result<()> {
        self.0.check()?;
        self.1.check()
    }
    fn restore_owned(&mut self, parts: &[&[u8]], scope: &KeyScope) -> Result<()> {
        let split: Vec<(&[u8], &[u8])> = parts.iter().map(|p| split_pair(p)).collect::<Result<_>>()?;
        self.0.restore_owned(&split.iter().map(|s| s.0).collect::<Vec<_>>(), scope)?;
        self.1.restore_owned(&split.iter().map(|s| s.1).collect::<Vec<_>>(), scope)
    }
}

// Their fields are closures, shared internals or whole state: a name says enough.
crate::debug_as_name!([K, T, A] AggregatingState<K, T, A>);
crate::debug_as_name!([K, T] ListState<K, T>);
crate::debug_as_name!([K, UK, UV] MapState<K, UK, UV>);

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(s: &mut impl Snapshot) -> Vec<u8> {
        let fork = s.fork();
        let mut bytes = Vec::new();
        fork.write_to(&mut bytes).unwrap();
        bytes
    }

    #[test]
    fn list_and_map_state_fork_restore_and_split_by_key_group() {
        let mut lists: ListState<u64, u32> = ListState::new();
        let mut maps: MapState<u64, u32, u64> = MapState::new();
        for k in 0..2_000u64 {
            for j in 0..(k % 4) as u32 {
                lists.add(k, j);
                maps.put(k, j, k * 100 + j as u64);
            }
        }
        maps.remove(&3, &1);
        let (lb, mb) = (snapshot(&mut lists), snapshot(&mut maps));
        // Later writes do not reach the snapshots.
        lists.add(1, 99);
        maps.put(1, 99, 0);
        let mut l2: ListState<u64, u32> = ListState::new();
        l2.restore(&lb).unwrap();
        let mut m2: MapState<u64, u32, u64> = MapState::new();
        m2.restore(&mb).unwrap();
        assert_eq!(l2.get(&3), &[0, 1, 2]);
        assert_eq!(l2.get(&1), &[0]);
        assert_eq!(m2.get(&1, &99), None);
        let mut three: Vec<_> = m2.iter(&3).map(|(u, v)| (*u, *v)).collect();
        three.sort();
        assert_eq!(three, vec![(0, 300), (2, 302)]);
        // Two subtasks' worth of key groups partition the keys.
        let scopes = [0, 1].map(|subtask| KeyScope { subtask, parallelism: 2, max_parallelism: 128 });
        let mut seen = 0;
        for scope in &scopes {
            let mut part: MapState<u64, u32, u64> = MapState::new();
            part.restore_owned(&[&mb], scope).unwrap();
            let mut lpart: ListState<u64, u32> = ListState::new();
            lpart.restore_owned(&[&lb], scope).unwrap();
            for k in 0..2_000u64 {
                let owned = scope.owns(hash_key(&k));
                assert_eq!(part.user_keys(&k).is_empty(), !owned || k % 4 == 0, "key {k}");
                assert_eq!(lpart.get(&k).len(), if owned { (k % 4) as usize } else { 0 });
            }
            seen += part.len();
        }
        assert_eq!(seen, m2.len());
    }

    #[test]
    fn a_pair_of_states_round_trips_and_damage_is_refused() {
        let mut pair: (ListState<u64, u32>, AggregatingState<u64, u32, u64>) =
            (ListState::new(), AggregatingState::new(|| 0, |s, x| *s += x as u64));
        for k in 0..500u64 {
            pair.0.add(k, k as u32);
            pair.1.add(k % 5, 2);
        }
        let bytes = snapshot(&mut pair);
        let mut back = (ListState::<u64, u32>::new(), AggregatingState::<u64, u32, u64>::new(|| 0, |_, _| {}));
        back.restore(&bytes).unwrap();
        assert_eq!(back.0.get(&499), &[499]);
        assert_eq!(back.1.get(&4), Some(&200));
        for cut in [0, 7, bytes.len() - 1] {
            assert!(back.restore(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn aggregating_state_folds_with_its_own_function_and_restores() {
        let mut sums: AggregatingState<u32, u64, u64> = AggregatingState::new(|| 0, |s, x| *s += x);
        for i in 0..1_000u64 {
            sums.add((i % 7) as u32, i);
        }
        let bytes = snapshot(&mut sums);
        sums.add(0, 1);
        let mut back: AggregatingState<u32, u64, u64> = AggregatingState::new(|| 0, |s, x| *s += x);
        back.restore(&bytes).unwrap();
        let expected: u64 = (0..1_000u64).filter(|i| i % 7 == 0).sum();
        assert_eq!(back.get(&0), Some(&expected));
        assert_eq!(sums.get(&0), Some(&(expected + 1)));
        assert_eq!(back.len(), 7);
    }
}
