//! [`PagedMap`]: a hash map (open addressing, linear probing) whose slots live in fixed-size
//! pages shared copy-on-write with snapshots.
//!
//! A fork clones the page pointers, one per page, and copies no entries: the synchronous part
//! of a snapshot is proportional to the number of pages, not to the bytes of state. Afterwards
//! the live map copies a page the first time it writes to it while a snapshot still holds it;
//! untouched pages stay shared until the snapshot has been written and dropped.
//!
//! Invariant: `owned[p]` is true only while this map holds the only reference to `pages[p]`
//! (set right after a uniqueness check or a fresh allocation; cleared for every page by
//! [`PagedMap::fork`] before it hands out clones). It lets writes skip the atomic uniqueness
//! check on the hot path.

use std::hash::Hash;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use crate::persist::Persist;
use crate::record::hash_key;
use crate::snapshot::StateChunks;

/// Slots per page (a power of two).
pub const PAGE_SLOTS: usize = 256;
const PAGE_SHIFT: u32 = PAGE_SLOTS.trailing_zeros();

/// Bytes of all state pages alive in this process: pages of live maps and pages that only
/// snapshots still hold (in flight to disk). Updated when a page is allocated or freed, never
/// per record.
static PAGE_BYTES: AtomicI64 = AtomicI64::new(0);

/// Memory held by keyed and window state in this process, in bytes: live pages plus pages
/// held by snapshots being written.
pub fn state_memory_bytes() -> u64 {
    PAGE_BYTES.load(Ordering::Relaxed).max(0) as u64
}

/// Page versions, unique in the process: a page gets a new one when it is created and when it
/// is first written after a fork, so two forks that show a page with the same version show
/// the same content (what incremental checkpoints rely on to skip unchanged pages).
static NEXT_VERSION: AtomicU64 = AtomicU64::new(1);

fn new_version() -> u64 {
    NEXT_VERSION.fetch_add(1, Ordering::Relaxed)
}

struct Page<K, V> {
    slots: [Option<(K, V)>; PAGE_SLOTS],
}

impl<K, V> Page<K, V> {
    fn new() -> Arc<Self> {
        PAGE_BYTES.fetch_add(std::mem::size_of::<Self>() as i64, Ordering::Relaxed);
        Arc::new(Page { slots: std::array::from_fn(|_| None) })
    }
}

impl<K: Clone, V: Clone> Clone for Page<K, V> {
    fn clone(&self) -> Self {
        PAGE_BYTES.fetch_add(std::mem::size_of::<Self>() as i64, Ordering::Relaxed);
        Page { slots: self.slots.clone() }
    }
}

impl<K, V> Drop for Page<K, V> {
    fn drop(&mut self) {
        PAGE_BYTES.fetch_sub(std::mem::size_of::<Self>() as i64, Ordering::Relaxed);
    }
}

/// A hash map in copy-on-write pages.
///
/// ```
/// use weir::state::PagedMap;
/// let mut m: PagedMap<u64, u64> = PagedMap::new();
/// *m.get_or_insert_with(3, || 0) += 5;
/// let snapshot = m.fork();
/// *m.get_or_insert_with(3, || 0) += 1;
/// assert_eq!(m.get(&3), Some(&6));
/// assert_eq!(snapshot.iter().collect::<Vec<_>>(), vec![(&3, &5)]);
/// ```
pub struct PagedMap<K, V> {
    pages: Vec<Arc<Page<K, V>>>,
    owned: Vec<bool>,
    /// Per page: its version (see [`NEXT_VERSION`]); renewed on the first write after a fork.
    versions: Vec<u64>,
    /// Slots in all, minus one (the slot count is a power of two).
    mask: usize,
    len: usize,
    copied_pages: u64,
}

/// The pages of a [`PagedMap`] at the moment of a fork: a read-only view for the snapshot
/// writer.
pub struct PagedFork<K, V> {
    pages: Vec<Arc<Page<K, V>>>,
    versions: Vec<u64>,
    len: usize,
}

impl<K: Hash + Eq + Clone, V: Clone> Default for PagedMap<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Hash + Eq + Clone, V: Clone> PagedMap<K, V> {
    /// An empty map (one page).
    pub fn new() -> Self {
        Self::with_slots(PAGE_SLOTS)
    }

    /// An empty map with room for `entries` entries before it grows.
    pub fn with_capacity(entries: usize) -> Self {
        Self::with_slots(Self::slots_for(entries))
    }

    /// The map of `entries` (a later entry of a key replaces an earlier one), sized for all of
    /// them before the first goes in.
    ///
    /// This is how a restore builds a map: a snapshot's entries come in slot order, that is
    /// sorted by hash, and inserted into a map that starts small and doubles they pile up in
    /// the lower slots of each size (every prefix of them lies in a fraction of the range),
    /// so probe runs grow with the map: quadratic in the entries. Sized first, each lands near
    /// its own slot.
    ///
    /// ```
    /// use weir::state::PagedMap;
    /// let m: PagedMap<u64, u64> = PagedMap::from_entries((0..1000).map(|k| (k, k * 2)).collect());
    /// assert_eq!((m.len(), m.get(&999)), (1000, Some(&1998)));
    /// ```
    pub fn from_entries(entries: Vec<(K, V)>) -> Self {
        let mut map = Self::with_capacity(entries.len());
        for (k, v) in entries {
            map.insert(k, v);
        }
        map
    }

    /// The smallest slot count (a power of two, at least a page) that holds `entries` within
    /// the load factor [`Self::entry_hashed`] grows at (7/8).
    fn slots_for(entries: usize) -> usize {
        (entries.saturating_mul(8) / 7 + 1).next_power_of_two().max(PAGE_SLOTS)
    }

    fn with_slots(slots: usize) -> Self {
        debug_assert!(slots.is_power_of_two() && slots >= PAGE_SLOTS);
        let pages = slots / PAGE_SLOTS;
        PagedMap {
            pages: (0..pages).map(|_| Page::new()).collect(),
            owned: vec![true; pages],
            versions: (0..pages).map(|_| new_version()).collect(),
            mask: slots - 1,
            len: 0,
            copied_pages: 0,
        }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of pages.
    pub fn pages(&self) -> usize {
        self.pages.len()
    }

    /// Pages copied because a snapshot still shared them (copy-on-write events so far).
    pub fn copied_pages(&self) -> u64 {
        self.copied_pages
    }

    /// Bytes of all pages (live state; pages held only by snapshots are not counted).
    pub fn page_bytes(&self) -> usize {
        self.pages.len() * std::mem::size_of::<Page<K, V>>()
    }

    #[inline]
    fn slot(&self, i: usize) -> &Option<(K, V)> {
        &self.pages[i >> PAGE_SHIFT].slots[i & (PAGE_SLOTS - 1)]
    }

    #[inline(always)]
    fn page_mut(&mut self, p: usize) -> &mut Page<K, V> {
        // Every write comes here: the check is inlined, taking the page (after a snapshot, once
        // per page) is not.
        if !self.owned[p] {
            self.take_page(p);
        }
        debug_assert_eq!(Arc::strong_count(&self.pages[p]), 1, "an owned page is unshared");
        // SAFETY: `owned[p]` is true only while this map holds the only reference to the page
        // (see the module invariant: set after `get_mut` succeeded or a fresh `Arc::new`, and
        // cleared by `fork` before any clone leaves the map; the map never makes `Weak`s). With
        // `&mut self`, this is the only access to the page, so a unique reference is sound.
        unsafe { &mut *(Arc::as_ptr(&self.pages[p]) as *mut Page<K, V>) }
    }

    /// Makes page `p` this map's own: copied if a snapshot shares it, and given a new version.
    #[cold]
    #[inline(never)]
    fn take_page(&mut self, p: usize) {
        if Arc::get_mut(&mut self.pages[p]).is_none() {
            // Shared with a snapshot: copy before the first write.
            self.pages[p] = Arc::new((*self.pages[p]).clone());
            self.copied_pages += 1;
        }
        self.owned[p] = true;
        self.versions[p] = new_version();
    }

    #[inline]
    fn slot_mut(&mut self, i: usize) -> &mut Option<(K, V)> {
        &mut self.page_mut(i >> PAGE_SHIFT).slots[i & (PAGE_SLOTS - 1)]
    }

    /// The slot holding `key`, or the empty slot where it would go.
    #[inline]
    fn find(&self, key: &K) -> Result<usize, usize> {
        self.find_hashed(hash_key(key), key)
    }

    /// [`Self::find`] with `key`'s hash ([`hash_key`]) already computed.
    #[inline]
    fn find_hashed(&self, hash: u64, key: &K) -> Result<usize, usize> {
        debug_assert_eq!(hash, hash_key(key), "the hash is the key's");
        let mut i = hash as usize & self.mask;
        loop {
            match self.slot(i) {
                Some((k, _)) if k == key => return Ok(i),
                Some(_) => i = (i + 1) & self.mask,
                None => return Err(i),
            }
        }
    }

    /// Asks the CPU to start loading the slot where a lookup of `key` begins, so a lookup a
    /// few records later finds it in cache (for batches whose keys miss the cache).
    #[inline]
    pub fn prefetch(&self, key: &K) {
        self.prefetch_hashed(hash_key(key))
    }

    /// [`Self::prefetch`] by the key's hash ([`hash_key`]), for a caller that keeps it for the
    /// lookup ([`Self::get_or_insert_with_hashed`]) instead of hashing the key twice.
    #[inline]
    pub fn prefetch_hashed(&self, hash: u64) {
        let i = hash as usize & self.mask;
        let slot: *const Option<(K, V)> = self.slot(i);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch is only a hint: it never faults and reads nothing into the
        // program, so any address is allowed (this one points at a live slot anyway).
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(slot.cast());
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = slot;
    }

    /// The value of `key`.
    #[inline]
    pub fn get(&self, key: &K) -> Option<&V> {
        self.find(key).ok().map(|i| &self.slot(i).as_ref().expect("found").1)
    }

    /// The value of `key`, for changing (its page is copied first if a snapshot shares it).
    #[inline]
    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        let i = self.find(key).ok()?;
        Some(&mut self.slot_mut(i).as_mut().expect("found").1)
    }

    /// The value of `key`, inserting `init()` first if there is none. (Always inlined: it is
    /// the keyed operators' per-record step, and a caller grown by a few branches stopped
    /// inlining it, costing the window path a fifth.)
    #[inline(always)]
    pub fn get_or_insert_with(&mut self, key: K, init: impl FnOnce() -> V) -> &mut V {
        self.get_or_insert_with_hashed(hash_key(&key), key, init)
    }

    /// [`Self::get_or_insert_with`] with `key`'s hash ([`hash_key`]) already computed.
    #[inline(always)]
    pub fn get_or_insert_with_hashed(&mut self, hash: u64, key: K, init: impl FnOnce() -> V) -> &mut V {
        self.entry_hashed(hash, key, init).1
    }

    /// [`Self::get_or_insert_with_hashed`], also handing back the key as stored (so a caller
    /// that moved its key in can still read it).
    #[inline(always)]
    pub fn entry_hashed(&mut self, hash: u64, key: K, init: impl FnOnce() -> V) -> (&K, &mut V) {
        let i = match self.find_hashed(hash, &key) {
            Ok(i) => i,
            Err(_) if (self.len + 1) * 8 > (self.mask + 1) * 7 => {
                self.grow();
                let i = self.find_hashed(hash, &key).expect_err("absent");
                *self.slot_mut(i) = Some((key, init()));
                self.len += 1;
                i
            }
            Err(i) => {
                *self.slot_mut(i) = Some((key, init()));
                self.len += 1;
                i
            }
        };
        let (k, v) = self.slot_mut(i).as_mut().expect("present");
        (&*k, v)
    }

    /// Sets the value of `key`.
    pub fn insert(&mut self, key: K, value: V) {
        let mut value = Some(value);
        let v = self.get_or_insert_with(key, || value.take().expect("once"));
        if let Some(value) = value {
            *v = value;
        }
    }

    /// Removes `key` (backward-shift deletion keeps every probe chain unbroken).
    pub fn remove(&mut self, key: &K) -> Option<V> {
        let mut hole = self.find(key).ok()?;
        let (_, value) = self.slot_mut(hole).take().expect("found");
        self.len -= 1;
        let mut j = hole;
        loop {
            j = (j + 1) & self.mask;
            let Some((k, _)) = self.slot(j) else { break };
            let ideal = hash_key(k) as usize & self.mask;
            // Move the entry at j into the hole unless its ideal slot lies in (hole, j].
            let stays = if hole <= j { hole < ideal && ideal <= j } else { hole < ideal || ideal <= j };
            if !stays {
                let moved = self.slot_mut(j).take();
                *self.slot_mut(hole) = moved;
                hole = j;
            }
        }
        Some(value)
    }

    fn grow(&mut self) {
        let wider = Self::with_slots((self.mask + 1) * 2);
        let old = std::mem::replace(&mut self.pages, wider.pages);
        self.owned = wider.owned;
        self.versions = wider.versions;
        self.mask = wider.mask;
        for page in old {
            // A page no snapshot holds gives its entries up by move; a shared one is copied
            // (the snapshot keeps the originals).
            match Arc::try_unwrap(page) {
                Ok(mut page) => {
                    for (k, v) in page.slots.iter_mut().filter_map(Option::take) {
                        let i = self.find(&k).expect_err("keys are unique");
                        *self.slot_mut(i) = Some((k, v));
                    }
                }
                Err(shared) => {
                    for (k, v) in shared.slots.iter().flatten() {
                        let i = self.find(k).expect_err("keys are unique");
                        *self.slot_mut(i) = Some((k.clone(), v.clone()));
                    }
                }
            }
        }
    }

    /// All entries, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.pages.iter().flat_map(|p| p.slots.iter().flatten().map(|(k, v)| (k, v)))
    }

    /// Shares every page with the returned fork: pointer work, one clone per page.
    pub fn fork(&mut self) -> PagedFork<K, V> {
        self.owned.iter_mut().for_each(|o| *o = false);
        PagedFork { pages: self.pages.clone(), versions: self.versions.clone(), len: self.len }
    }
}

impl<K: Persist, V: Persist> PagedFork<K, V> {
    /// Hands the entries to `out` as the [`Persist`] encoding of `Vec<(K, V)>`: the count,
    /// then every page as one chunk (so unchanged pages can be referred to, not rewritten).
    pub fn write_chunks(&self, out: &mut dyn StateChunks) -> std::io::Result<()> {
        let mut len = Vec::with_capacity(8);
        (self.len as u64).persist(&mut len);
        out.bytes(&len)?;
        for (page, &version) in self.pages.iter().zip(&self.versions) {
            out.page(version, &mut |buf| {
                for (k, v) in page.slots.iter().flatten() {
                    k.persist(buf);
                    v.persist(buf);
                }
            })?;
        }
        Ok(())
    }
}

impl<K, V> PagedFork<K, V> {
    /// The version of every page, in page order.
    pub fn page_versions(&self) -> &[u64] {
        &self.versions
    }

    /// Entries at the fork, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.pages.iter().flat_map(|p| p.slots.iter().flatten().map(|(k, v)| (k, v)))
    }

    /// Number of entries at the fork.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the fork is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[derive(Debug, Clone)]
    enum Op {
        Put(u16, u32),
        Add(u16, u32),
        Remove(u16),
        Fork,
        Release(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (any::<u16>(), any::<u32>()).prop_map(|(k, v)| Op::Put(k % 2000, v)),
            6 => (any::<u16>(), any::<u32>()).prop_map(|(k, v)| Op::Add(k % 2000, v)),
            2 => any::<u16>().prop_map(|k| Op::Remove(k % 2000)),
            1 => Just(Op::Fork),
            1 => any::<usize>().prop_map(Op::Release),
        ]
    }

    proptest! {
        /// Random writes interleaved with forks and releases, against a model: every fork reads
        /// back exactly the state at its fork, and the live map always equals the model.
        #[test]
        fn forks_are_isolated_and_the_live_map_is_undisturbed(ops in prop::collection::vec(op(), 1..600)) {
            let mut live: PagedMap<u16, u32> = PagedMap::new();
            let mut model: HashMap<u16, u32> = HashMap::new();
            let mut forks: Vec<(PagedFork<u16, u32>, HashMap<u16, u32>)> = Vec::new();
            for op in ops {
                match op {
                    Op::Put(k, v) => { live.insert(k, v); model.insert(k, v); }
                    Op::Add(k, v) => {
                        let x = live.get_or_insert_with(k, || 0);
                        *x = x.wrapping_add(v);
                        let m = model.entry(k).or_insert(0);
                        *m = m.wrapping_add(v);
                    }
                    Op::Remove(k) => prop_assert_eq!(live.remove(&k), model.remove(&k)),
                    Op::Fork => forks.push((live.fork(), model.clone())),
                    Op::Release(i) => if !forks.is_empty() { let i = i % forks.len(); forks.swap_remove(i); },
                }
                prop_assert_eq!(live.len(), model.len());
            }
            let got: HashMap<u16, u32> = live.iter().map(|(k, v)| (*k, *v)).collect();
            prop_assert_eq!(&got, &model);
            for (k, v) in &model {
                prop_assert_eq!(live.get(k), Some(v));
            }
            for (fork, at_fork) in &forks {
                let got: HashMap<u16, u32> = fork.iter().map(|(k, v)| (*k, *v)).collect();
                prop_assert_eq!(&got, at_fork);
                prop_assert_eq!(fork.len(), at_fork.len());
            }
        }
    }

    #[test]
    fn page_memory_counts_pages_held_by_snapshots_until_they_are_dropped() {
        // Other tests allocate pages concurrently: compare with generous margins.
        let page = std::mem::size_of::<Page<u64, [u64; 64]>>() as i64;
        let mut m: PagedMap<u64, [u64; 64]> = PagedMap::new();
        for k in 0..20_000u64 {
            m.insert(k, [k; 64]);
        }
        let fork = m.fork();
        let before = state_memory_bytes() as i64;
        for k in 0..20_000u64 {
            m.insert(k, [0; 64]);
        }
        let copied = m.copied_pages() as i64;
        assert_eq!(copied, m.pages() as i64, "every shared page was written, so copied once");
        let during = state_memory_bytes() as i64;
        assert!(during - before >= copied * page / 2, "copies are counted while the fork holds the originals");
        drop(fork);
        let after = state_memory_bytes() as i64;
        assert!(during - after >= copied * page / 2, "dropping the fork frees the originals");
    }

    /// Values that own heap memory: a page copied on its first write after a fork clones its
    /// values (the fork keeps the originals), growing moves unshared values, and dropping the
    /// map and its forks drops every value (counted through `Arc`s).
    #[test]
    fn values_that_own_memory_are_cloned_on_copy_and_dropped_with_the_last_page() {
        let witness = Arc::new(());
        let mut m: PagedMap<String, (Arc<()>, Vec<String>)> = PagedMap::new();
        for k in 0..1_000u64 {
            m.insert(format!("key-{k}"), (witness.clone(), vec![format!("v{k}")]));
        }
        let fork = m.fork();
        for k in 0..1_000u64 {
            m.get_or_insert_with(format!("key-{k}"), || unreachable!("present")).1.push("more".into());
        }
        for k in 1_000..3_000u64 {
            m.insert(format!("key-{k}"), (witness.clone(), Vec::new())); // grows past the fork
        }
        assert_eq!(m.get(&"key-7".to_string()).map(|v| v.1.clone()), Some(vec!["v7".to_string(), "more".into()]));
        let at_fork: Vec<&Vec<String>> = fork.iter().map(|(_, v)| &v.1).collect();
        assert!(at_fork.iter().all(|v| v.len() == 1), "the fork kept the values as they were");
        assert!(Arc::strong_count(&witness) > 3_000, "the fork's copies are alive while it is");
        drop(fork);
        assert_eq!(Arc::strong_count(&witness), 3_001, "the fork's values went with it");
        drop(m);
        assert_eq!(Arc::strong_count(&witness), 1, "every value was dropped");
    }

    #[test]
    fn a_fork_shares_pages_and_writes_copy_only_what_they_touch() {
        let mut m: PagedMap<u64, u64> = PagedMap::new();
        for k in 0..100_000 {
            m.insert(k, k);
        }
        let pages = m.pages();
        assert!(pages > 100);
        let fork = m.fork();
        *m.get_or_insert_with(7, || 0) += 1;
        assert_eq!(m.copied_pages(), 1, "one write copies one page");
        *m.get_or_insert_with(7, || 0) += 1;
        assert_eq!(m.copied_pages(), 1, "a copied page is then written in place");
        let again = m.fork();
        assert_eq!(m.get(&7), Some(&9));
        let changed = fork.page_versions().iter().zip(again.page_versions()).filter(|(a, b)| a != b).count();
        assert_eq!(changed, 1, "only the written page has a new version");
        *m.get_or_insert_with(7, || 0) += 1;
        let third = m.fork();
        assert_ne!(again.page_versions(), third.page_versions(), "a write after a fork renews the version");
    }
}
