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
//!
//! A map made inside a [`StateBudget`](super::StateBudget)'s scope is bounded (`bounded`): its
//! pages may leave memory, and every access goes the checked way, which brings them back.
//! `table`: the page pointers, in cells so that a lookup through `&self` can do so.
//!
//! May touch: `persist`, `record`, `snapshot`, `error`, `state` (its budget and spill files).

use std::borrow::Borrow;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use crate::persist::Persist;
use crate::record::hash_key;
use crate::snapshot::StateChunks;

mod bounded;
mod table;

use bounded::{ColdPages, ForkRefs};
use table::PageTable;

/// Slots per page (a power of two).
pub const PAGE_SLOTS: usize = 256;
const PAGE_SHIFT: u32 = PAGE_SLOTS.trailing_zeros();

/// Bytes of all state pages alive in this process: pages of live maps and pages that only
/// snapshots still hold (in flight to disk). Updated when a page is allocated or freed, never
/// per record.
static PAGE_BYTES: AtomicI64 = AtomicI64::new(0);

/// The most [`PAGE_BYTES`] has been: raised when a page is allocated, never per record.
static PAGE_BYTES_PEAK: AtomicI64 = AtomicI64::new(0);

/// Memory held by keyed and window state in this process, in bytes: live pages plus pages
/// held by snapshots being written.
pub fn state_memory_bytes() -> u64 {
    PAGE_BYTES.load(Ordering::Relaxed).max(0) as u64
}

/// The most memory keyed and window state held in this process at once, in bytes (as
/// [`state_memory_bytes`] counts it): what a benchmark reports as its state's size, which a
/// look after the job ended (its pages freed) cannot see.
pub fn state_memory_peak_bytes() -> u64 {
    PAGE_BYTES_PEAK.load(Ordering::Relaxed).max(0) as u64
}

/// A page of `bytes` was allocated.
fn page_allocated(bytes: usize) {
    let now = PAGE_BYTES.fetch_add(bytes as i64, Ordering::Relaxed) + bytes as i64;
    PAGE_BYTES_PEAK.fetch_max(now, Ordering::Relaxed);
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
        page_allocated(std::mem::size_of::<Self>());
        Arc::new(Page { slots: std::array::from_fn(|_| None) })
    }
}

impl<K: Clone, V: Clone> Clone for Page<K, V> {
    fn clone(&self) -> Self {
        page_allocated(std::mem::size_of::<Self>());
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
/// assert_eq!(snapshot.entries().unwrap(), vec![(3, 5)]);
/// ```
pub struct PagedMap<K, V> {
    pages: PageTable<K, V>,
    owned: Vec<bool>,
    /// Pages not owned (`owned[p]` false): a run of writes to a map that owns every page
    /// checks ownership once for the run ([`PagedMap::owns_every_page`]), not per record.
    unowned: u32,
    /// Per page: its version (see [`NEXT_VERSION`]); renewed on the first write after a fork.
    versions: Vec<u64>,
    /// Slots in all, minus one (the slot count is a power of two).
    mask: usize,
    len: usize,
    copied_pages: u32,
    /// Changelog checkpoints: per page, the slots written since the last fork (a bit each).
    /// Empty while writes are not tracked ([`Self::tracking`]).
    dirty: Vec<[u64; PAGE_SLOTS / 64]>,
    /// Set by the writer of a changelog checkpoint through a fork: the next fork turns
    /// tracking on.
    changes_wanted: Arc<AtomicBool>,
    /// The id of the changes since the last fork (the segment the next fork closes); 0 when
    /// they are not known whole: untracked, or the slot layout changed since (grown, cleared,
    /// restored), so they cannot be applied to the last fork's image.
    segment: u64,
    /// A bounded map's pages out of memory and its budget; `None`: unbounded (every page
    /// resident, and the per-record path never looks here).
    cold: Option<Box<ColdPages<K, V>>>,
}

/// A [`PagedMap`] that owns every page, borrowed for a run of writes
/// ([`PagedMap::owned_pages`]): its writes skip the per-record ownership check.
pub struct OwnedPages<'a, K, V, const TRACK: bool = false>(&'a mut PagedMap<K, V>);

impl<K: Hash + Eq + Clone + Persist, V: Clone + Persist, const TRACK: bool> OwnedPages<'_, K, V, TRACK> {
    /// [`PagedMap::prefetch_hashed`].
    #[inline]
    pub fn prefetch_hashed(&self, hash: u64) {
        // A map that owns every page for a run is unbounded (`owned_pages`).
        self.0.prefetch_slot_hashed(hash)
    }

    /// [`PagedMap::entry_hashed`], without the ownership check.
    #[inline(always)]
    pub fn entry_hashed(&mut self, hash: u64, key: K, init: impl FnOnce() -> V) -> (&K, &mut V) {
        // No fork can have run since `owned_pages` checked (this borrow is exclusive), and a
        // write that grows the map owns the new pages.
        debug_assert!(self.0.owns_every_page());
        debug_assert_eq!(self.0.tracking(), TRACK);
        self.0.entry_in::<false, TRACK, K>(hash, KeyArg::Owned(key), init)
    }

    /// [`PagedMap::entry_by_ref_hashed`], without the ownership check.
    #[inline(always)]
    pub fn entry_by_ref_hashed<Q>(&mut self, hash: u64, key: &Q, init: impl FnOnce() -> V) -> (&K, &mut V)
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        debug_assert!(self.0.owns_every_page());
        debug_assert_eq!(self.0.tracking(), TRACK);
        self.0.entry_in::<false, TRACK, Q>(hash, KeyArg::Borrowed(key), init)
    }
}

/// A key handed to a lookup: owned (moved in if new), or borrowed (copied with `to_owned` if
/// new). Always inlined with its variant known, so the match costs nothing.
enum KeyArg<'q, K, Q: ?Sized> {
    Owned(K),
    Borrowed(&'q Q),
}

impl<K: Borrow<Q>, Q: ?Sized + ToOwned<Owned = K>> KeyArg<'_, K, Q> {
    #[inline(always)]
    fn get(&self) -> &Q {
        match self {
            KeyArg::Owned(k) => k.borrow(),
            KeyArg::Borrowed(q) => q,
        }
    }
    #[inline(always)]
    fn into_owned(self) -> K {
        match self {
            KeyArg::Owned(k) => k,
            KeyArg::Borrowed(q) => q.to_owned(),
        }
    }
}

/// The pages of a [`PagedMap`] at the moment of a fork: a read-only view for the snapshot
/// writer.
pub struct PagedFork<K, V> {
    pages: Vec<Arc<Page<K, V>>>,
    /// Where the pages not in memory lie (empty for an unbounded map's fork).
    cold: ForkRefs,
    versions: Vec<u64>,
    len: usize,
    delta: Delta,
    changes_wanted: Arc<AtomicBool>,
}

/// What changed between two forks: the slots written since the one whose segment id is
/// `after` (0: none that this image extends), as the segment with id `id`.
struct Delta {
    after: u64,
    id: u64,
    dirty: Vec<[u64; PAGE_SLOTS / 64]>,
}

impl<K: Hash + Eq + Clone + Persist, V: Clone + Persist> Default for PagedMap<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Hash + Eq + Clone + Persist, V: Clone + Persist> PagedMap<K, V> {
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
        Self::with_slots_in(slots, crate::state::StateBudget::current())
    }

    /// An empty map of `slots` slots, bounded by `budget` if there is one (then its pages
    /// are allocated when first written).
    fn with_slots_in(slots: usize, budget: Option<Arc<crate::state::StateBudget>>) -> Self {
        debug_assert!(slots.is_power_of_two() && slots >= PAGE_SLOTS);
        let pages = slots / PAGE_SLOTS;
        let cold = budget.map(|b| Box::new(ColdPages::new(b, pages)));
        let table = match &cold {
            Some(c) => PageTable::new((0..pages).map(|_| c.blank())),
            None => PageTable::new((0..pages).map(|_| Page::new())),
        };
        PagedMap {
            pages: table,
            owned: vec![cold.is_none(); pages],
            unowned: if cold.is_some() { pages as u32 } else { 0 },
            versions: (0..pages).map(|_| new_version()).collect(),
            mask: slots - 1,
            len: 0,
            copied_pages: 0,
            dirty: Vec::new(),
            changes_wanted: Arc::default(),
            segment: 0,
            cold,
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
        u64::from(self.copied_pages)
    }

    /// Bytes of all pages in memory (live state; pages held only by snapshots are not
    /// counted, nor those of a bounded map that left memory).
    pub fn page_bytes(&self) -> usize {
        let resident = self.cold.as_ref().map_or(self.pages.len(), |c| c.resident_pages());
        resident * std::mem::size_of::<Page<K, V>>()
    }

    #[inline]
    fn slot(&self, i: usize) -> &Option<(K, V)> {
        debug_assert!(i <= self.mask, "slot {i} of {}", self.mask + 1);
        // Every caller masks `i` (`i <= mask`), and the map has `(mask + 1) / PAGE_SLOTS` pages
        // (`with_slots`; `grow` replaces pages and mask together): the unchecked `get` is sound.
        &self.pages.get(i >> PAGE_SHIFT).slots[i & (PAGE_SLOTS - 1)]
    }

    /// Page `p` for writing; `CHECKED`: made this map's own first if it is not (a caller that
    /// checked [`Self::owns_every_page`] for its run passes `false`).
    #[inline(always)]
    fn page_mut<const CHECKED: bool>(&mut self, p: usize) -> &mut Page<K, V> {
        // Every write comes here: the check is inlined, taking the page (after a snapshot, once
        // per page) is not.
        debug_assert!(p < self.pages.len(), "page {p} of {}", self.pages.len());
        if CHECKED && !self.owned[p] {
            self.take_page(p);
        }
        debug_assert!(self.owned[p], "a write to page {p}, which a snapshot may share");
        debug_assert_eq!(Arc::strong_count(self.pages.get(p)), 1, "an owned page is unshared");
        // SAFETY: `p` is a masked slot's page (`i >> PAGE_SHIFT` with `i <= mask`; the map has
        // `(mask + 1) / PAGE_SLOTS` pages) or a restore's page below their count, so it exists.
        // `owned[p]` is true only while this map holds the only reference to the page (see the
        // module invariant: set after `get_mut` succeeded or a fresh `Arc::new`, and cleared by
        // `fork` before any clone leaves the map; the map never makes `Weak`s). With `&mut
        // self`, this is the only access to the page, so a unique reference is sound.
        unsafe { &mut *(Arc::as_ptr(self.pages.get(p)) as *mut Page<K, V>) }
    }

    /// Makes page `p` this map's own: copied if a snapshot shares it, and given a new version.
    #[cold]
    #[inline(never)]
    fn take_page(&mut self, p: usize) {
        if self.cold.is_some() {
            // Brought back or allocated first if not in memory.
            self.take_cold_page(p);
        }
        if Arc::get_mut(self.pages.get_mut(p)).is_none() {
            // Shared with a snapshot: copy before the first write.
            let copy = Arc::new((**self.pages.get(p)).clone());
            *self.pages.get_mut(p) = copy;
            self.copied_pages = self.copied_pages.saturating_add(1);
        }
        self.owned[p] = true;
        self.unowned -= 1;
        self.versions[p] = new_version();
    }

    /// Whether writes are marked for a changelog checkpoint: from the fork after one asked
    /// for changes (`changes_wanted`), so a job without a changelog pays nothing.
    #[inline(always)]
    fn tracking(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// Whether this map owns every page (no snapshot taken since shares one): writes need no
    /// ownership check until the next fork.
    #[inline]
    pub fn owns_every_page(&self) -> bool {
        self.unowned == 0
    }

    #[inline]
    fn slot_mut(&mut self, i: usize) -> &mut Option<(K, V)> {
        self.slot_mut_in::<true, false>(i)
    }

    /// Slot `i` for writing, marked written for the changelog while writes are tracked:
    /// `TRACK` says they are for the run (`OwnedPages`); a `CHECKED` write asks [`Self::tracking`].
    #[inline(always)]
    fn slot_mut_in<const CHECKED: bool, const TRACK: bool>(&mut self, i: usize) -> &mut Option<(K, V)> {
        if TRACK || (CHECKED && self.tracking()) {
            debug_assert!(i <= self.mask && self.dirty.len() == self.pages.len());
            // SAFETY: `i` is masked (as in `slot`), and while tracking there is a dirty bitmap
            // per page (`fork`, `grow`).
            let bits = unsafe { self.dirty.get_unchecked_mut(i >> PAGE_SHIFT) };
            bits[(i >> 6) & (PAGE_SLOTS / 64 - 1)] |= 1 << (i & 63);
        }
        &mut self.page_mut::<CHECKED>(i >> PAGE_SHIFT).slots[i & (PAGE_SLOTS - 1)]
    }

    /// The slot holding `key`, or the empty slot where it would go.
    #[inline]
    fn find(&self, key: &K) -> Result<usize, usize> {
        self.find_hashed::<true, K>(hash_key(key), key)
    }

    /// [`Self::find`] with `key`'s hash ([`hash_key`]) already computed. `CHECKED`: the map
    /// may be bounded (its pages out of memory are brought back); a caller that knows it is
    /// not (it owns every page) passes `false`.
    #[inline]
    fn find_hashed<const CHECKED: bool, Q: ?Sized + Hash + Eq>(&self, hash: u64, key: &Q) -> Result<usize, usize>
    where
        K: Borrow<Q>,
    {
        debug_assert_eq!(hash, hash_key(key), "the hash is the key's");
        if CHECKED && self.cold.is_some() {
            return self.find_faulting(hash, key);
        }
        debug_assert!(self.cold.is_none(), "an unchecked lookup in a bounded map");
        let mut i = hash as usize & self.mask;
        loop {
            match self.slot(i) {
                Some((k, _)) if k.borrow() == key => return Ok(i),
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
        if self.cold.is_some() {
            // A bounded map's page may be on disk: its read goes ahead on the reader threads.
            self.read_ahead(hash);
        }
        self.prefetch_slot_hashed(hash);
    }

    /// The CPU's part of [`Self::prefetch_hashed`] (an unbounded map's whole).
    #[inline]
    fn prefetch_slot_hashed(&self, hash: u64) {
        let i = hash as usize & self.mask;
        prefetch_slot(self.slot(i));
    }

    /// The value of `key`.
    #[inline]
    pub fn get(&self, key: &K) -> Option<&V> {
        self.find(key).ok().map(|i| &self.slot(i).as_ref().expect("found").1)
    }

    /// The value of `key`, for changing (its page is copied first if a snapshot shares it).
    #[inline]
    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        self.enforce_budget();
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
        self.entry_in::<true, false, K>(hash, KeyArg::Owned(key), init)
    }

    /// [`Self::entry_hashed`] by a borrowed form of the key (`&str` for a `String` key): the
    /// key is made (`to_owned`) only when it is new, so a lookup of a key already there
    /// allocates nothing.
    ///
    /// ```
    /// use weir::state::PagedMap;
    /// let mut m: PagedMap<String, u64> = PagedMap::new();
    /// for w in ["a", "b", "a"] {
    ///     *m.entry_by_ref_hashed(weir::record::hash_key(w), w, || 0).1 += 1;
    /// }
    /// assert_eq!(m.get(&"a".to_string()), Some(&2));
    /// ```
    #[inline(always)]
    pub fn entry_by_ref_hashed<Q>(&mut self, hash: u64, key: &Q, init: impl FnOnce() -> V) -> (&K, &mut V)
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        self.entry_in::<true, false, Q>(hash, KeyArg::Borrowed(key), init)
    }

    /// Writes for a run of records, when this map owns every page: ownership is checked
    /// here, once for the run, not per write (the borrow keeps any fork out until it ends).
    /// `None` after a fork, until every page has been written once.
    ///
    /// ```
    /// use weir::state::PagedMap;
    /// let mut m: PagedMap<u64, u64> = PagedMap::new();
    /// let mut run = m.owned_pages().expect("a new map owns its pages");
    /// *run.entry_hashed(weir::record::hash_key(&7), 7, || 0).1 += 1;
    /// let _snapshot = m.fork();
    /// assert!(m.owned_pages().is_none(), "the snapshot shares every page");
    /// ```
    #[inline]
    pub fn owned_pages(&mut self) -> Option<OwnedPages<'_, K, V>> {
        (self.owns_every_page() && !self.tracking() && self.cold.is_none()).then_some(OwnedPages(self))
    }

    /// [`Self::owned_pages`] while writes are tracked for a changelog checkpoint: `None`
    /// when they are not, or a snapshot shares a page.
    #[inline]
    pub fn owned_pages_tracked(&mut self) -> Option<OwnedPages<'_, K, V, true>> {
        (self.owns_every_page() && self.tracking() && self.cold.is_none()).then_some(OwnedPages(self))
    }

    #[inline(always)]
    fn entry_in<const CHECKED: bool, const TRACK: bool, Q>(
        &mut self,
        hash: u64,
        key: KeyArg<'_, K, Q>,
        init: impl FnOnce() -> V,
    ) -> (&K, &mut V)
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        if CHECKED && self.cold.is_some() {
            // A bounded map's lookups go out of line: the unbounded path pays this one test.
            return self.entry_bounded(hash, key, init);
        }
        let i = match self.find_hashed::<false, Q>(hash, key.get()) {
            Ok(i) => i,
            Err(_) if (self.len + 1) * 8 > (self.mask + 1) * 7 => {
                self.grow();
                let i = self.find_hashed::<false, Q>(hash, key.get()).expect_err("absent");
                *self.slot_mut_in::<CHECKED, TRACK>(i) = Some((key.into_owned(), init()));
                self.len += 1;
                i
            }
            Err(i) => {
                *self.slot_mut_in::<CHECKED, TRACK>(i) = Some((key.into_owned(), init()));
                self.len += 1;
                i
            }
        };
        let (k, v) = self.slot_mut_in::<CHECKED, TRACK>(i).as_mut().expect("present");
        (&*k, v)
    }

    /// [`Self::entry_in`] in a bounded map: pages sent out while over the budget first, the
    /// probe's pages brought back.
    #[cold]
    #[inline(never)]
    fn entry_bounded<Q>(&mut self, hash: u64, key: KeyArg<'_, K, Q>, init: impl FnOnce() -> V) -> (&K, &mut V)
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        self.enforce_budget();
        let mut i = self.find_faulting(hash, key.get());
        if i.is_err() && (self.len + 1) * 8 > (self.mask + 1) * 7 {
            self.grow();
            i = self.find_faulting(hash, key.get());
        }
        let i = i.unwrap_or_else(|i| {
            *self.slot_mut(i) = Some((key.into_owned(), init()));
            self.len += 1;
            i
        });
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
        self.enforce_budget();
        let mut hole = self.find(key).ok()?;
        let (_, value) = self.slot_mut(hole).take().expect("found");
        self.len -= 1;
        let mut j = hole;
        loop {
            j = (j + 1) & self.mask;
            if j & (PAGE_SLOTS - 1) == 0 {
                self.fault_in(j >> PAGE_SHIFT);
            }
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
        let wider = Self::with_slots_in((self.mask + 1) * 2, self.cold.as_ref().map(|c| c.budget()));
        let old = std::mem::replace(&mut self.pages, wider.pages);
        let mut old_cold = std::mem::replace(&mut self.cold, wider.cold);
        self.owned = wider.owned;
        self.unowned = wider.unowned;
        self.versions = wider.versions;
        self.mask = wider.mask;
        if self.tracking() {
            self.dirty = vec![[0; PAGE_SLOTS / 64]; self.pages.len()];
        }
        self.segment = 0;
        for (p, page) in old.into_pages().enumerate() {
            let Some(page) = bounded::content(&mut old_cold, p, page) else { continue };
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
            // A bounded map's new pages leave memory as they fill.
            self.enforce_budget();
        }
    }

    /// All entries, in slot order (a bounded map's pages out of memory come back).
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        let bounded = self.cold.is_some();
        (0..self.pages.len()).flat_map(move |p| {
            if bounded {
                self.fault_in(p);
            }
            self.pages.get(p).slots.iter().flatten().map(|(k, v)| (k, v))
        })
    }

    /// Whether a lookup finds every entry: none lies before its hash's slot or past an empty
    /// slot after it (walking the table once from an empty slot, so runs that wrap around
    /// the end are seen whole). A bounded map's pages come back one by one, in its budget.
    fn every_entry_is_found(&mut self) -> bool {
        let slots = self.mask + 1;
        let Some(empty) = (0..slots).find(|&i| self.home_at(i).is_none()) else { return false };
        let mut run_start = empty + 1;
        for step in 1..slots {
            let i = (empty + step) & self.mask;
            match self.home_at(i) {
                None => run_start = i + 1,
                Some(home) => {
                    // Both distances walk forward (mod the slot count) to `i`.
                    if (i.wrapping_sub(home) & self.mask) > (i.wrapping_sub(run_start) & self.mask) {
                        return false;
                    }
                }
            }
        }
        true
    }

    /// The slot where the lookup of the entry in slot `i` starts (`None`: the slot is
    /// empty), for a walk over the slots in order: a bounded map brings each page back as
    /// the walk enters it.
    fn home_at(&mut self, i: usize) -> Option<usize> {
        if self.cold.is_some() && i & (PAGE_SLOTS - 1) == 0 {
            self.enforce_budget();
            self.fault_in(i >> PAGE_SHIFT);
        }
        self.slot(i).as_ref().map(|(k, _)| hash_key(k) as usize & self.mask)
    }

    /// The entries, in slot order, moved out (pages no snapshot shares give them up without a
    /// copy).
    fn into_entries(mut self) -> Vec<(K, V)> {
        let mut entries = Vec::with_capacity(self.len);
        let pages = std::mem::replace(&mut self.pages, PageTable::new(std::iter::empty()));
        for (p, page) in pages.into_pages().enumerate() {
            let Some(page) = bounded::content(&mut self.cold, p, page) else { continue };
            match Arc::try_unwrap(page) {
                Ok(mut page) => entries.extend(page.slots.iter_mut().filter_map(Option::take)),
                Err(shared) => entries.extend(shared.slots.iter().flatten().cloned()),
            }
        }
        entries
    }

    /// Removes every entry and keeps the slots: a map emptied for reuse does not grow again
    /// to the size it had. Pages a snapshot still shares are left to it and replaced by
    /// empty ones; the others are emptied in place (a bounded map lets them all go).
    ///
    /// ```
    /// use weir::state::PagedMap;
    /// let mut m: PagedMap<u64, u64> = PagedMap::new();
    /// (0..1000).for_each(|k| m.insert(k, k));
    /// let pages = m.pages();
    /// m.clear();
    /// assert_eq!((m.len(), m.get(&7), m.pages()), (0, None, pages));
    /// ```
    pub fn clear(&mut self) {
        if let Some(c) = self.cold.as_deref_mut() {
            for p in 0..self.pages.len() {
                *self.pages.get_mut(p) = c.forget(p);
                self.owned[p] = false;
                self.versions[p] = new_version();
            }
            self.unowned = self.pages.len() as u32;
            self.len = 0;
            self.segment = 0;
            return;
        }
        for p in 0..self.pages.len() {
            match Arc::get_mut(self.pages.get_mut(p)) {
                Some(page) => {
                    if self.len > 0 {
                        page.slots.iter_mut().for_each(|s| *s = None);
                    }
                }
                None => *self.pages.get_mut(p) = Page::new(),
            }
            self.owned[p] = true;
            self.versions[p] = new_version();
        }
        self.unowned = 0;
        self.len = 0;
        self.segment = 0;
    }

    /// The map a fork was taken of, sharing the fork's pages (local recovery): pointer work,
    /// one clone per page; each page is copied on its first write, as after [`Self::fork`].
    /// Pages the fork has out of memory stay out, read back when first used.
    pub fn from_fork(fork: &PagedFork<K, V>) -> Self {
        let pages = fork.pages.len();
        assert!(pages.is_power_of_two(), "a fork has a power of two of pages, not {pages}");
        let budget = crate::state::StateBudget::current().or_else(|| fork.cold.budget());
        let cold = budget.map(|b| Box::new(ColdPages::of_fork(b, &fork.cold, pages)));
        // Pages the fork has out of memory point at this map's blank page, as all of its own.
        let page = |p: usize| match (&cold, fork.cold.get(p)) {
            (Some(c), Some(_)) => c.blank(),
            _ => Arc::clone(&fork.pages[p]),
        };
        PagedMap {
            pages: PageTable::new((0..pages).map(page)),
            owned: vec![false; pages],
            unowned: pages as u32,
            versions: fork.versions.clone(),
            mask: pages * PAGE_SLOTS - 1,
            len: fork.len,
            copied_pages: 0,
            dirty: Vec::new(),
            changes_wanted: Arc::clone(&fork.changes_wanted),
            segment: 0,
            cold,
        }
    }

    /// Shares every page with the returned fork: pointer work, one clone per page.
    pub fn fork(&mut self) -> PagedFork<K, V> {
        self.owned.iter_mut().for_each(|o| *o = false);
        self.unowned = self.pages.len() as u32;
        // The changes since the last fork are known whole only if tracked all along.
        let after = if self.tracking() { self.segment } else { 0 };
        let dirty = std::mem::take(&mut self.dirty);
        if self.changes_wanted.load(Ordering::Relaxed) {
            self.dirty = vec![[0; PAGE_SLOTS / 64]; self.pages.len()];
        }
        let delta = Delta { after, id: new_version(), dirty };
        self.segment = delta.id;
        PagedFork {
            pages: self.pages.cloned(),
            cold: self.cold.as_ref().map_or_else(ForkRefs::default, |c| c.fork_refs()),
            versions: self.versions.clone(),
            len: self.len,
            delta,
            changes_wanted: Arc::clone(&self.changes_wanted),
        }
    }
}

impl<K: Persist, V: Persist> PagedFork<K, V> {
    /// Hands the map to `out` in the encoding [`PagedImage`] reads: a header (the format's
    /// mark, the entry count, the slot count), then every page as one chunk (so unchanged
    /// pages can be referred to, not rewritten) holding which of its slots are full and their
    /// entries in slot order.
    ///
    /// With a changelog ([`StateChunks::changelog`]), the map goes as the changes since the
    /// last fork (a segment: the slots written since, each as it is now) or, when the
    /// receiver cannot extend the chain of the last fork, as a base: the image above, whole.
    pub fn write_chunks(&self, out: &mut dyn StateChunks) -> std::io::Result<()> {
        if out.changelog() {
            // From the next fork on, the map tracks its writes.
            self.changes_wanted.store(true, Ordering::Relaxed);
            let d = &self.delta;
            let mut failed = None;
            out.changes(d.after, d.id, &mut |out| self.write_image(out), &mut |buf| {
                if let Err(e) = self.write_segment(buf) {
                    failed = Some(e);
                }
            })?;
            return failed.map_or(Ok(()), Err);
        }
        self.write_image(out)
    }

    /// The whole image, page by page.
    fn write_image(&self, out: &mut dyn StateChunks) -> std::io::Result<()> {
        let mut head = Vec::with_capacity(24);
        write_head(self.len, self.pages.len(), &mut head);
        out.bytes(&head)?;
        for (p, (page, &version)) in self.pages.iter().zip(&self.versions).enumerate() {
            match self.cold.get(p) {
                // Out of memory: its encoding is copied from where it lies (and not even
                // read when the receiver holds this version already).
                Some(at) => {
                    let mut failed = None;
                    out.page(version, &mut |buf| {
                        if let Err(e) = at.read_into(buf) {
                            failed = Some(e);
                        }
                    })?;
                    failed.map_or(Ok(()), Err)?;
                }
                None => {
                    out.page(version, &mut |buf| write_page(page, buf))?;
                }
            }
        }
        Ok(())
    }

    /// The changes since the last fork: the slot count and the entry count (checked when
    /// applied), then each page with a written slot: its index, which slots were written (a
    /// bit each), and each such slot as it is now (empty, or its entry).
    fn write_segment(&self, out: &mut Vec<u8>) -> std::io::Result<()> {
        ((self.pages.len() * PAGE_SLOTS) as u64).persist(out);
        (self.len as u64).persist(out);
        let changed: Vec<(usize, &[u64; PAGE_SLOTS / 64])> =
            self.delta.dirty.iter().enumerate().filter(|(_, bits)| bits.iter().any(|&b| b != 0)).collect();
        (changed.len() as u64).persist(out);
        // The written slots lie scattered over the state: while one page's are encoded, the
        // next one's are loaded (a miss each otherwise, most of a large segment's time).
        let prefetch = |&(p, bits): &(usize, &[u64; PAGE_SLOTS / 64])| {
            set_slots(bits).for_each(|i| prefetch_slot(&self.pages[p].slots[i]));
        };
        changed.iter().take(1).for_each(prefetch);
        for (j, &(p, bits)) in changed.iter().enumerate() {
            changed.get(j + 1).iter().for_each(|c| prefetch(c));
            (p as u64).persist(out);
            bits.persist(out);
            let page = self.page(p)?;
            for i in set_slots(bits) {
                match &page.slots[i] {
                    Some((k, v)) => {
                        1u8.persist(out);
                        k.persist(out);
                        v.persist(out);
                    }
                    None => 0u8.persist(out),
                }
            }
        }
        Ok(())
    }

    /// Page `p` at the fork: shared, or read back from where it lies if it was out of memory.
    fn page(&self, p: usize) -> std::io::Result<Arc<Page<K, V>>> {
        match self.cold.get(p) {
            Some(at) => bounded::read_page(at),
            None => Ok(Arc::clone(&self.pages[p])),
        }
    }

    /// Calls `f` with every entry at the fork, in slot order (a bounded map's pages out of
    /// memory are read back for it, one at a time).
    pub fn for_each_entry(&self, mut f: impl FnMut(&K, &V)) -> std::io::Result<()> {
        for p in 0..self.pages.len() {
            self.page(p)?.slots.iter().flatten().for_each(|(k, v)| f(k, v));
        }
        Ok(())
    }
}

impl<K: Persist + Clone, V: Persist + Clone> PagedFork<K, V> {
    /// Entries at the fork, in slot order, copied.
    pub fn entries(&self) -> std::io::Result<Vec<(K, V)>> {
        let mut entries = Vec::with_capacity(self.len);
        self.for_each_entry(|k, v| entries.push((k.clone(), v.clone())))?;
        Ok(entries)
    }
}

fn write_head(len: usize, pages: usize, out: &mut Vec<u8>) {
    LAID_OUT.persist(out);
    (len as u64).persist(out);
    ((pages * PAGE_SLOTS) as u64).persist(out);
}

/// Which slots of `page` are full (a bit each), then their entries in slot order.
fn write_page<K: Persist, V: Persist>(page: &Page<K, V>, out: &mut Vec<u8>) {
    let mut full = [0u64; PAGE_SLOTS / 64];
    for (i, slot) in page.slots.iter().enumerate() {
        full[i / 64] |= (slot.is_some() as u64) << (i % 64);
    }
    full.persist(out);
    for (k, v) in page.slots.iter().flatten() {
        k.persist(out);
        v.persist(out);
    }
}

/// The first word of a map written slot by slot ([`PagedFork::write_chunks`]). The format
/// before it began with the entry count, which never reaches this value, so both are read.
const LAID_OUT: u64 = u64::MAX;

/// A [`PagedMap`]'s snapshot as read back. Written slot by slot, it is the map itself: every
/// entry goes back into the slot it had, with no probing and no key compared, once a pass over
/// the slots has checked that each lies where a lookup finds it (from its hash's slot, no empty
/// slot on the way). An image that fails that check (keys hashed differently when it was
/// written) and one in the older format (the entries alone) are inserted entry by entry into
/// a map sized for them first.
pub struct PagedImage<K, V>(Image<K, V>);

enum Image<K, V> {
    Laid(PagedMap<K, V>),
    Entries(Vec<(K, V)>),
}

impl<K: Hash + Eq + Clone + Persist, V: Clone + Persist> PagedImage<K, V> {
    /// The map (see the type's doc for when this re-inserts).
    pub fn into_map(self) -> PagedMap<K, V> {
        match self.0 {
            Image::Laid(map) => map,
            Image::Entries(entries) => PagedMap::from_entries(entries),
        }
    }

    /// The entries, in slot order (to be filtered and merged, as a rescaled restore does).
    pub fn into_entries(self) -> Vec<(K, V)> {
        match self.0 {
            Image::Laid(map) => map.into_entries(),
            Image::Entries(entries) => entries,
        }
    }
}

impl<K, V> From<Vec<(K, V)>> for PagedImage<K, V> {
    fn from(entries: Vec<(K, V)>) -> Self {
        PagedImage(Image::Entries(entries))
    }
}

impl<K: Persist + Hash + Eq + Clone, V: Persist + Clone> Persist for PagedImage<K, V> {
    fn persist(&self, out: &mut Vec<u8>) {
        match &self.0 {
            Image::Laid(map) => {
                write_head(map.len, map.pages.len(), out);
                (0..map.pages.len()).for_each(|p| {
                    map.fault_in(p);
                    write_page(map.pages.get(p), out)
                });
            }
            Image::Entries(entries) => entries.persist(out),
        }
    }

    fn restore(input: &mut &[u8]) -> crate::error::Result<Self> {
        let mut map = match crate::snapshot::chain_segments(input)? {
            Some(segments) => {
                // A changelog chain: the base, then each segment applied in order.
                let mut map = read_laid(input)?;
                for _ in 0..segments {
                    apply_segment(&mut map, input)?;
                }
                map
            }
            None if input.get(..8) != Some(&LAID_OUT.to_le_bytes()[..]) => {
                return Vec::restore(input).map(|entries| PagedImage(Image::Entries(entries)));
            }
            None => read_laid(input)?,
        };
        // A lazy restore trusts the layout (checking it would read every page): a checkpoint of
        // this job, in this format, hashed its keys as this code does.
        let laid = crate::snapshot::restoring_lazily() || map.every_entry_is_found();
        Ok(PagedImage(if laid { Image::Laid(map) } else { Image::Entries(map.into_entries()) }))
    }
}

/// Applies one changelog segment (see `PagedFork::write_segment`) to `map`, which must have
/// the slot layout it was taken in.
fn apply_segment<K: Persist + Hash + Eq + Clone, V: Persist + Clone>(
    map: &mut PagedMap<K, V>,
    input: &mut &[u8],
) -> crate::error::Result<()> {
    let corrupt = |what: String| crate::error::Error::Corrupt(format!("a paged map's changelog segment {what}"));
    // A lazy restore's segment is not in the input: it is read now, where it was stored.
    if crate::snapshot::restoring_lazily() {
        let stored = crate::snapshot::next_stored_page()?.read().map_err(|e| corrupt(e.to_string()))?;
        return apply_segment_from(map, &mut &stored[..]);
    }
    apply_segment_from(map, input)
}

/// [`apply_segment`] from the segment's encoding.
fn apply_segment_from<K: Persist + Hash + Eq + Clone, V: Persist + Clone>(
    map: &mut PagedMap<K, V>,
    input: &mut &[u8],
) -> crate::error::Result<()> {
    let corrupt = |what: String| crate::error::Error::Corrupt(format!("a paged map's changelog segment {what}"));
    let (slots, len, changed) = (u64::restore(input)?, u64::restore(input)?, u64::restore(input)?);
    if slots != (map.mask + 1) as u64 {
        return Err(corrupt(format!("is for {slots} slots, applied to {}", map.mask + 1)));
    }
    let pages = map.pages.len() as u64;
    if changed > pages {
        return Err(corrupt(format!("changes {changed} of {pages} pages")));
    }
    let mut count = map.len as i64;
    for _ in 0..changed {
        let p = u64::restore(input)?;
        if p >= pages {
            return Err(corrupt(format!("changes page {p} of {pages}")));
        }
        let bits = <[u64; PAGE_SLOTS / 64]>::restore(input)?;
        let page = map.page_mut::<true>(p as usize);
        for i in set_slots(&bits) {
            let entry = match u8::restore(input)? {
                0 => None,
                1 => Some((K::restore(input)?, V::restore(input)?)),
                t => return Err(corrupt(format!("has a slot tagged {t}"))),
            };
            count += entry.is_some() as i64 - page.slots[i].is_some() as i64;
            page.slots[i] = entry;
        }
        map.enforce_budget();
    }
    if count != len as i64 {
        return Err(corrupt(format!("leaves {count} entries where it says {len}")));
    }
    map.len = count as usize;
    Ok(())
}

/// Reads a laid-out image (see `PagedFork::write_chunks`) into a map with its slot layout.
fn read_laid<K: Persist + Hash + Eq + Clone, V: Persist + Clone>(
    input: &mut &[u8],
) -> crate::error::Result<PagedMap<K, V>> {
    let corrupt = |what: String| crate::error::Error::Corrupt(format!("a paged map's snapshot {what}"));
    if input.get(..8) != Some(&LAID_OUT.to_le_bytes()[..]) {
        return Err(corrupt("is not laid out (a changelog chain's base must be)".into()));
    }
    *input = &input[8..];
    let len = u64::restore(input)?;
    let slots = u64::restore(input)?;
    let pages = slots / PAGE_SLOTS as u64;
    // Every page takes at least its slot bits: a damaged slot count cannot allocate more
    // pages than the bytes left could describe.
    // (A lazy restore's pages are not in the input: each is one of the stored pages left.)
    let page_min = (PAGE_SLOTS / 8) as u64;
    let at_most = crate::snapshot::stored_pages_left().unwrap_or(input.len() as u64 / page_min);
    if !slots.is_power_of_two() || pages == 0 || pages > at_most || len >= slots {
        return Err(corrupt(format!("has {len} entries in {slots} slots ({} bytes follow)", input.len())));
    }
    let mut map = PagedMap::with_slots(slots as usize);
    if crate::snapshot::restoring_lazily() {
        // The pages are not in the input: each is where its checkpoint stored it.
        for p in 0..pages as usize {
            let stored = crate::snapshot::next_stored_page()?;
            if !map.keep_stored(p, stored.clone()) {
                fill_page(map.page_mut::<true>(p), &mut &stored.read().map_err(|e| corrupt(e.to_string()))?[..])?;
            }
        }
        map.len = len as usize;
        return Ok(map);
    }
    let mut read = 0;
    for p in 0..pages as usize {
        read += fill_page(map.page_mut::<true>(p), input)?;
        // A bounded map's pages leave memory as the restore goes on.
        map.enforce_budget();
    }
    if read as u64 != len {
        return Err(corrupt(format!("says {len} entries and holds {read}")));
    }
    map.len = read;
    Ok(map)
}

/// Reads one page's encoding (see `write_page`) into `page`'s slots; returns the entries read.
fn fill_page<K: Persist, V: Persist>(page: &mut Page<K, V>, input: &mut &[u8]) -> crate::error::Result<usize> {
    let full = <[u64; PAGE_SLOTS / 64]>::restore(input)?;
    let mut read = 0;
    for i in set_slots(&full) {
        page.slots[i] = Some((K::restore(input)?, V::restore(input)?));
        read += 1;
    }
    Ok(read)
}

/// The slots a page's bitmap (a bit a slot) marks, in order.
/// Asks the CPU to start loading `slot` (a hint: it reads nothing into the program).
#[inline]
fn prefetch_slot<T>(slot: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint: it never faults and reads nothing into the program,
    // so any address is allowed (callers pass a live slot's anyway).
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(slot.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = slot;
}

fn set_slots(bits: &[u64; PAGE_SLOTS / 64]) -> impl Iterator<Item = usize> + '_ {
    bits.iter().enumerate().flat_map(|(w, &word)| {
        std::iter::successors(Some(word).filter(|&b| b != 0), |&b| Some(b & (b - 1)).filter(|&b| b != 0))
            .map(move |b| w * 64 + b.trailing_zeros() as usize)
    })
}

impl<K, V> PagedFork<K, V> {
    /// The version of every page, in page order.
    pub fn page_versions(&self) -> &[u64] {
        &self.versions
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

// Their fields are closures, shared internals or whole state: a name says enough.
crate::debug_as_name!([K, V] PagedMap<K, V>);
crate::debug_as_name!([K, V] PagedFork<K, V>);
crate::debug_as_name!([K, V] PagedImage<K, V>);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// The keyed aggregate writes a run without a copy-on-write check per record only while
    /// no snapshot shares a page: after a fork the run's writes copy the pages they touch (the
    /// snapshot keeps what it saw), and the unchecked path comes back once every page was
    /// written.
    #[test]
    fn a_run_skips_the_ownership_check_only_while_no_snapshot_shares_a_page() {
        let mut m: PagedMap<u64, u64> = PagedMap::with_capacity(2000);
        for k in 0..2000 {
            *m.owned_pages().expect("no snapshot yet").entry_hashed(hash_key(&k), k, || 0).1 += 1;
        }
        let snapshot = m.fork();
        assert!(m.owned_pages().is_none(), "every page is shared");
        for k in 0..1000 {
            *m.entry_hashed(hash_key(&k), k, || 0).1 += 1;
        }
        assert!(m.owned_pages().is_none() || m.copied_pages() as usize == m.pages(), "some pages are still shared");
        for k in 0..2000 {
            *m.entry_hashed(hash_key(&k), k, || 0).1 += 1;
        }
        let mut run = m.owned_pages().expect("every page written since the fork");
        for k in 0..2000 {
            *run.entry_hashed(hash_key(&k), k, || 0).1 += 1;
        }
        assert!(snapshot.entries().unwrap().iter().all(|e| e.1 == 1), "the snapshot never sees a later write");
        assert_eq!(m.get(&0), Some(&4));
        assert_eq!(m.get(&1999), Some(&3));
    }

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
                let got: HashMap<u16, u32> = fork.entries().unwrap().into_iter().collect();
                prop_assert_eq!(&got, at_fork);
                prop_assert_eq!(fork.len(), at_fork.len());
            }
        }
    }

    fn image_bytes(map: &mut PagedMap<u64, u64>) -> Vec<u8> {
        let mut bytes = Vec::new();
        crate::snapshot::ForkedState::write_to(&super::super::kinds::ForkedMap(map.fork()), &mut bytes).unwrap();
        bytes
    }

    /// A map read back slot by slot is the map written: same slots, same lookups, and it
    /// goes on growing and removing as before.
    #[test]
    fn a_map_read_back_slot_by_slot_has_every_entry_where_it_was() {
        let mut m: PagedMap<u64, u64> = PagedMap::new();
        for k in 0..50_000u64 {
            m.insert(k.wrapping_mul(0x9e37_79b9_7f4a_7c15), k);
        }
        for k in (0..50_000u64).step_by(3) {
            m.remove(&k.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        }
        let bytes = image_bytes(&mut m);
        let mut back = crate::persist::from_bytes::<PagedImage<u64, u64>>(&bytes).unwrap();
        assert!(matches!(back.0, Image::Laid(_)), "a valid image is taken as it is");
        assert_eq!(crate::persist::to_bytes(&back), bytes, "an image writes back what it read");
        back = crate::persist::from_bytes(&bytes).unwrap();
        let mut back = back.into_map();
        assert_eq!((back.len(), back.pages()), (m.len(), m.pages()));
        assert!(m.iter().zip(back.iter()).all(|(a, b)| a == b), "the same entries in the same slots");
        for k in 50_000..100_000u64 {
            back.insert(k.wrapping_mul(0x9e37_79b9_7f4a_7c15), k);
        }
        assert_eq!(back.len(), m.len() + 50_000);
        assert_eq!(back.remove(&(7u64.wrapping_mul(0x9e37_79b9_7f4a_7c15))), Some(7));
    }

    /// An image whose entries do not lie where their hashes lead (another hash wrote it, or
    /// it was changed) is not taken as it is: its entries are inserted again, so every one is
    /// found. Damaged counts and sizes are refused with an error, never a panic or a huge
    /// allocation.
    #[test]
    fn entries_out_of_their_place_are_inserted_again_and_damaged_sizes_are_refused() {
        let mut m: PagedMap<u64, u64> = PagedMap::new();
        for k in 0..100u64 {
            m.insert(k, k + 1000);
        }
        let mut bytes = image_bytes(&mut m);
        // Swap the first two entries' keys: each now sits in the other's slot.
        let first = 24 + 32;
        let (a, b) = (first, first + 16);
        let (ka, kb) = (bytes[a..a + 8].to_vec(), bytes[b..b + 8].to_vec());
        bytes[a..a + 8].copy_from_slice(&kb);
        bytes[b..b + 8].copy_from_slice(&ka);
        let image = crate::persist::from_bytes::<PagedImage<u64, u64>>(&bytes).unwrap();
        assert!(matches!(image.0, Image::Entries(_)), "misplaced entries are not taken as laid out");
        let back = image.into_map();
        assert_eq!(back.len(), 100);
        let swapped = [u64::from_le_bytes(ka.try_into().unwrap()), u64::from_le_bytes(kb.try_into().unwrap())];
        assert!((0..100u64).all(|k| back.get(&k).is_some()), "every key is found");
        assert_eq!(back.get(&swapped[0]), m.get(&swapped[1]), "values went with the slots they were in");

        let good = image_bytes(&mut m);
        let mut huge = good.clone();
        huge[16..24].copy_from_slice(&(1u64 << 60).to_le_bytes());
        let mut odd = good.clone();
        odd[16..24].copy_from_slice(&300u64.to_le_bytes());
        let mut miscounted = good.clone();
        miscounted[8..16].copy_from_slice(&99u64.to_le_bytes());
        for (what, bytes) in
            [("huge", huge), ("odd", odd), ("miscounted", miscounted), ("cut", good[..good.len() - 5].to_vec())]
        {
            let r = crate::persist::from_bytes::<PagedImage<u64, u64>>(&bytes);
            assert!(matches!(r, Err(crate::error::Error::Corrupt(_))), "{what}: {:?}", r.map(|_| ()));
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
        let witness = Witness(Arc::new(()));
        let mut m: PagedMap<String, (Witness, Vec<String>)> = PagedMap::new();
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
        assert!(fork.entries().unwrap().iter().all(|e| e.1 .1.len() == 1), "the fork kept the values as they were");
        assert!(Arc::strong_count(&witness.0) > 3_000, "the fork's copies are alive while it is");
        drop(fork);
        assert_eq!(Arc::strong_count(&witness.0), 3_001, "the fork's values went with it");
        drop(m);
        assert_eq!(Arc::strong_count(&witness.0), 1, "every value was dropped");
    }

    /// A value that counts its copies (through the `Arc` they share); it persists as nothing.
    #[derive(Clone)]
    struct Witness(Arc<()>);

    impl Persist for Witness {
        fn persist(&self, _: &mut Vec<u8>) {}
        fn restore(_: &mut &[u8]) -> crate::error::Result<Self> {
            Ok(Witness(Arc::new(())))
        }
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
crate::debug_as_name!(['a, K, V] OwnedPages<'a, K, V>);
