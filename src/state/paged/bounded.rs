//! A bounded [`PagedMap`]: pages that leave memory while its budget is over, and come back
//! when a lookup reaches them.
//!
//! Per page the map keeps whether it is in memory, an access bit (set by lookups, cleared by
//! the clock hand as it passes) and, when its current content is on disk, where
//! ([`ColdRef`]). A page not in memory points at the map's shared blank page: with no place
//! on disk it is simply empty (pages are allocated when first written), with one it must be
//! brought back before any slot of it is read. The map's page versions do not change when a
//! page leaves or comes back, so checkpoints that hold a version already never read it.
//!
//! May touch: `state` (the budget and spill files of `state::cold`), `persist`, `record`,
//! `snapshot`.

use std::cell::Cell;
use std::hash::Hash;
use std::sync::Arc;

use super::{fill_page, write_page, Page, PagedMap, PAGE_SHIFT, PAGE_SLOTS};
use crate::persist::Persist;
use crate::snapshot::StoredPage;
use crate::state::cold::{fail, ColdRef, ReadAhead, SpillFile, StateBudget};

/// Page flag: the page is in memory (its entry is not the blank page).
const IN_MEMORY: u8 = 1;
/// Page flag: a lookup used the page since the clock hand last passed it.
const ACCESSED: u8 = 2;

/// Pages the clock may send out in one go, so one write never stalls long.
const EVICTIONS_AT_ONCE: usize = 16;

/// Page reads a map may have asked the reader threads for and not used yet.
const READS_AHEAD: usize = 256;

/// Pages a lazily restored map's warm-up brings in, and asks for, at each fault.
const WARM_AT_ONCE: usize = 8;

/// A bounded map's side: its budget, the pages out of memory and where they lie.
pub(super) struct ColdPages<K, V> {
    budget: Arc<StateBudget>,
    /// The page every entry not in memory points at: empty, never written.
    blank: Arc<Page<K, V>>,
    /// Per page: [`IN_MEMORY`], [`ACCESSED`]. Cells: a lookup through `&self` sets them.
    flags: Vec<Cell<u8>>,
    /// Per page: where its current content lies on disk (a page out of memory, or one read
    /// back and unchanged since: it leaves again without a write).
    at: Vec<Option<ColdRef>>,
    /// Where this map writes pages, made on its first eviction.
    file: Option<Arc<SpillFile>>,
    hand: usize,
    resident: Cell<usize>,
    /// Pages out of memory whose reads a lookahead asked for ([`PagedMap::read_ahead`]).
    ahead: std::cell::RefCell<std::collections::HashMap<usize, Arc<ReadAhead>>>,
    /// A lazy restore's warm-up: the next page it asks the reader threads for, while pages a
    /// checkpoint stored are out of memory and the budget has room (`None`: done, or none).
    warm: Cell<Option<usize>>,
}

/// A fork's pages out of memory: where each lies (empty when the map kept all in memory).
#[derive(Default)]
pub(super) struct ForkRefs(Vec<Option<ColdRef>>);

impl ForkRefs {
    /// Where page `p` lies, if it is out of memory.
    pub(super) fn get(&self, p: usize) -> Option<&ColdRef> {
        self.0.get(p).and_then(Option::as_ref)
    }

    /// The budget of the map this fork was taken of, if it had pages out of memory.
    pub(super) fn budget(&self) -> Option<Arc<StateBudget>> {
        self.0.iter().flatten().next().map(ColdRef::budget)
    }
}

impl<K, V> ColdPages<K, V> {
    /// The side of a map of `pages` pages, none of them in memory yet.
    pub(super) fn new(budget: Arc<StateBudget>, pages: usize) -> Self {
        ColdPages {
            budget,
            blank: Page::new(),
            flags: (0..pages).map(|_| Cell::new(0)).collect(),
            at: (0..pages).map(|_| None).collect(),
            file: None,
            hand: 0,
            resident: Cell::new(0),
            ahead: Default::default(),
            warm: Cell::new(None),
        }
    }

    /// The side of a map that shares a fork's pages: those the fork has in memory are in
    /// memory (shared), the others lie where the fork's do.
    pub(super) fn of_fork(budget: Arc<StateBudget>, refs: &ForkRefs, pages: usize) -> Self {
        let mut side = Self::new(budget, pages);
        for p in 0..pages {
            match refs.get(p) {
                Some(at) => side.at[p] = Some(at.clone()),
                None => side.now_in_memory(p),
            }
        }
        side
    }

    pub(super) fn budget(&self) -> Arc<StateBudget> {
        Arc::clone(&self.budget)
    }

    pub(super) fn blank(&self) -> Arc<Page<K, V>> {
        Arc::clone(&self.blank)
    }

    pub(super) fn resident_pages(&self) -> usize {
        self.resident.get()
    }

    /// Where each page out of memory lies, for a fork.
    pub(super) fn fork_refs(&self) -> ForkRefs {
        ForkRefs(
            self.flags.iter().zip(&self.at).map(|(f, at)| at.clone().filter(|_| f.get() & IN_MEMORY == 0)).collect(),
        )
    }

    fn now_in_memory(&self, p: usize) {
        self.flags[p].set(IN_MEMORY | ACCESSED);
        self.resident.set(self.resident.get() + 1);
        self.budget.resident_changed(std::mem::size_of::<Page<K, V>>() as i64);
    }

    fn now_out(&self, p: usize) {
        self.flags[p].set(0);
        self.resident.set(self.resident.get() - 1);
        self.budget.resident_changed(-(std::mem::size_of::<Page<K, V>>() as i64));
    }

    /// Drops page `p`'s place on disk (its content changes, or goes): the place is free
    /// again once no fork refers to it either, and a read of it asked for ahead is no longer
    /// the page's.
    fn drop_place(&mut self, p: usize) {
        self.at[p] = None;
        self.ahead.get_mut().remove(&p);
    }

    /// Empties page `p` (the map is cleared): returns what its entry points at now.
    pub(super) fn forget(&mut self, p: usize) -> Arc<Page<K, V>> {
        if self.flags[p].get() & IN_MEMORY != 0 {
            self.now_out(p);
        }
        self.drop_place(p);
        self.blank()
    }
}

impl<K, V> Drop for ColdPages<K, V> {
    fn drop(&mut self) {
        let bytes = self.resident.get() * std::mem::size_of::<Page<K, V>>();
        self.budget.resident_changed(-(bytes as i64));
    }
}

/// Page `p` of a map being taken apart (grown, or read out): its content, from memory or
/// read back from disk; `None` for a page that was never written. `cold` is the map's side,
/// if it is bounded, whose count the page leaves.
pub(super) fn content<K: Persist, V: Persist>(
    cold: &mut Option<Box<ColdPages<K, V>>>,
    p: usize,
    page: Arc<Page<K, V>>,
) -> Option<Arc<Page<K, V>>> {
    let Some(c) = cold.as_deref_mut() else { return Some(page) };
    if c.flags[p].get() & IN_MEMORY != 0 {
        c.now_out(p);
        c.drop_place(p);
        return Some(page);
    }
    let at = c.at[p].take()?;
    Some(read_page(&at).unwrap_or_else(|e| fail(at.read_failed(e))))
}

/// A page's content read back from where it lies.
pub(super) fn read_page<K: Persist, V: Persist>(at: &ColdRef) -> std::io::Result<Arc<Page<K, V>>> {
    decode(&at.read()?)
}

fn decode<K: Persist, V: Persist>(bytes: &[u8]) -> std::io::Result<Arc<Page<K, V>>> {
    let mut page = Page::new();
    let mut input = bytes;
    let filled = fill_page(Arc::get_mut(&mut page).expect("a new page"), &mut input);
    match filled {
        Ok(_) if input.is_empty() => Ok(page),
        Ok(_) => Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "a page of keyed state has bytes after it")),
        Err(e) => Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string())),
    }
}

impl<K: Hash + Eq + Clone + Persist, V: Clone + Persist> PagedMap<K, V> {
    /// Brings page `p` back into memory if it left (and marks it used): a no-op for an
    /// unbounded map.
    #[inline]
    pub(super) fn fault_in(&self, p: usize) {
        let Some(c) = self.cold.as_deref() else { return };
        let flags = c.flags[p].get();
        if flags & IN_MEMORY != 0 {
            c.flags[p].set(flags | ACCESSED);
        } else if c.at[p].is_some() {
            self.bring_back(c, p);
        }
    }

    #[cold]
    #[inline(never)]
    fn bring_back(&self, c: &ColdPages<K, V>, p: usize) {
        let at = c.at[p].as_ref().expect("a page out of memory with a place on disk");
        let ahead = c.ahead.borrow_mut().remove(&p);
        let bytes = at.fault(ahead);
        self.install(c, p, &bytes);
        self.warm_up(c);
    }

    /// Puts page `p`, out of memory, back from its encoding `bytes`.
    fn install(&self, c: &ColdPages<K, V>, p: usize, bytes: &[u8]) {
        let at = c.at[p].as_ref().expect("a page out of memory with a place on disk");
        let page = decode(bytes).unwrap_or_else(|e| fail(at.read_failed(e)));
        // SAFETY: page `p` is out of memory, so its entry points at the blank page and no
        // lookup has handed a reference to the entry out (slots of the blank page it may have
        // read stay valid: `c.blank` keeps that page alive).
        let blank = unsafe { self.pages.replace_shared(p, page) };
        debug_assert!(Arc::ptr_eq(&blank, &c.blank), "only a page out of memory is brought back");
        c.now_in_memory(p);
    }

    /// Makes page `p` of a map being restored the page a checkpoint stored, left out of
    /// memory until a lookup reaches it (a lazy restore). Returns `false` for an unbounded
    /// map, which must be given the page's content instead.
    pub(super) fn keep_stored(&mut self, p: usize, page: StoredPage) -> bool {
        let Some(c) = self.cold.as_deref_mut() else { return false };
        debug_assert!(c.flags[p].get() & IN_MEMORY == 0, "a page being restored is not in memory yet");
        // Not the map's own yet: its first write gives it a new version, so until then this
        // version is the stored page's, and a checkpoint may refer to it where it lies.
        debug_assert!(!self.owned[p], "a bounded map's page is its own only once written");
        crate::snapshot::page_left_stored(self.versions[p], &page);
        c.at[p] = Some(ColdRef::stored(page, c.budget()));
        // With reader threads, the pages come back in the background from the first fault on.
        c.warm.set(Some(0));
        true
    }

    /// A lazily restored map's warm-up, a step at each fault: pages whose reads finished come
    /// into memory while the budget has room, and the reader threads are asked for the next
    /// pages still where the checkpoint stored them, so they come back in the background
    /// rather than one fault at a time. Ends once a pass finds none left, or once the budget
    /// is full (the state does not fit: pages brought in would only push others out), or
    /// without reader threads.
    fn warm_up(&self, c: &ColdPages<K, V>) {
        let Some(mut next) = c.warm.get() else { return };
        let page = std::mem::size_of::<Page<K, V>>() as u64;
        let done: Vec<usize> =
            c.ahead.borrow().iter().filter(|(_, a)| a.is_done()).map(|(&p, _)| p).take(WARM_AT_ONCE).collect();
        for p in done {
            if !c.budget.has_room(page) {
                c.warm.set(None);
                return;
            }
            if c.flags[p].get() & IN_MEMORY == 0 {
                let ahead = c.ahead.borrow_mut().remove(&p);
                if let Some(Ok(bytes)) = ahead.and_then(|a| a.take()) {
                    self.install(c, p, &bytes);
                    // Brought in ahead of use: the clock may take it first.
                    c.flags[p].set(IN_MEMORY);
                }
            }
        }
        let pages = c.flags.len();
        let mut asked = 0;
        let mut looked = 0;
        while asked < WARM_AT_ONCE && looked < pages && c.ahead.borrow().len() < READS_AHEAD / 2 {
            let p = next;
            next = (next + 1) % pages;
            looked += 1;
            let stored = c.at[p].as_ref().filter(|at| at.is_stored() && c.flags[p].get() & IN_MEMORY == 0);
            let Some(at) = stored.filter(|_| !c.ahead.borrow().contains_key(&p)) else { continue };
            let pending = (c.ahead.borrow().len() + 1) as u64 * page;
            let read = c.budget.has_room(pending).then(|| at.read_ahead()).flatten();
            let Some(read) = read else {
                c.warm.set(None);
                return;
            };
            c.ahead.borrow_mut().insert(p, read);
            asked += 1;
        }
        // A whole pass asked for nothing and nothing is pending: every stored page is back.
        let finished = asked == 0 && looked == pages && c.ahead.borrow().is_empty();
        c.warm.set(if finished { None } else { Some(next) });
    }

    /// Asks the reader threads for the page where a lookup of `hash` starts, if it is out of
    /// memory: the keyed operators' lookahead, a block of records before their lookups.
    #[cold]
    #[inline(never)]
    pub(super) fn read_ahead(&self, hash: u64) {
        let Some(c) = self.cold.as_deref() else { return };
        let p = (hash as usize & self.mask) >> PAGE_SHIFT;
        let Some(at) = c.at[p].as_ref().filter(|_| c.flags[p].get() & IN_MEMORY == 0) else { return };
        let mut ahead = c.ahead.borrow_mut();
        if ahead.len() < READS_AHEAD && !ahead.contains_key(&p) {
            if let Some(read) = at.read_ahead() {
                ahead.insert(p, read);
            }
        }
    }

    /// The slot holding `key` or the empty slot where it would go, in a bounded map: each page
    /// the probe enters comes back into memory first.
    #[inline(never)]
    pub(super) fn find_faulting<Q: ?Sized + Hash + Eq>(&self, hash: u64, key: &Q) -> Result<usize, usize>
    where
        K: std::borrow::Borrow<Q>,
    {
        let mut i = hash as usize & self.mask;
        self.fault_in(i >> PAGE_SHIFT);
        loop {
            match self.slot(i) {
                Some((k, _)) if k.borrow() == key => return Ok(i),
                Some(_) => {
                    i = (i + 1) & self.mask;
                    if i & (PAGE_SLOTS - 1) == 0 {
                        self.fault_in(i >> PAGE_SHIFT);
                    }
                }
                None => return Err(i),
            }
        }
    }

    /// Page `p` in memory and changing, before `take_page` makes it the map's own: brought
    /// back (or allocated, if never written), and its place on disk given up (it is about
    /// to differ).
    pub(super) fn take_cold_page(&mut self, p: usize) {
        self.fault_in(p);
        let c = self.cold.as_deref_mut().expect("a bounded map");
        if c.flags[p].get() & IN_MEMORY == 0 {
            *self.pages.get_mut(p) = Page::new();
            c.now_in_memory(p);
        }
        c.drop_place(p);
    }

    /// Sends pages out while a bounded map's budget is over.
    #[inline]
    pub(super) fn enforce_budget(&mut self) {
        if self.cold.as_ref().is_some_and(|c| c.budget.over()) {
            self.evict();
        }
    }

    /// The clock: passes over the pages in memory, clearing access bits, and sends out those
    /// not used since it last passed, until the budget holds or [`EVICTIONS_AT_ONCE`] went.
    #[cold]
    #[inline(never)]
    fn evict(&mut self) {
        let pages = self.pages.len();
        let mut sent = 0;
        for _ in 0..2 * pages {
            let c = self.cold.as_deref_mut().expect("a bounded map");
            if sent == EVICTIONS_AT_ONCE || c.resident.get() == 0 || !c.budget.over() {
                return;
            }
            let p = c.hand;
            c.hand = (p + 1) % pages;
            match c.flags[p].get() {
                f if f & IN_MEMORY == 0 => {}
                f if f & ACCESSED != 0 => c.flags[p].set(f & !ACCESSED),
                _ => {
                    self.send_out(p);
                    sent += 1;
                }
            }
        }
    }

    /// Sends page `p` out of memory: written to the spill file first unless its content lies
    /// on disk already (read back unchanged, or stored by a completed checkpoint).
    fn send_out(&mut self, p: usize) {
        let c = self.cold.as_deref_mut().expect("a bounded map");
        if c.at[p].is_none() {
            // Unchanged since a completed checkpoint stored this version: read back from there.
            c.at[p] = match c.budget.find_stored(self.versions[p]) {
                Some(stored) => Some(ColdRef::stored(stored, c.budget())),
                None => {
                    let mut bytes = Vec::new();
                    write_page(self.pages.get(p), &mut bytes);
                    let file = c.file.get_or_insert_with(|| c.budget.spill_file());
                    Some(file.write(&bytes))
                }
            };
        }
        *self.pages.get_mut(p) = c.blank();
        c.now_out(p);
        c.budget.evicted();
        if self.owned[p] {
            self.owned[p] = false;
            self.unowned += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::StateFailure;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// A budget of `pages` pages of `PagedMap<u32, u64>`, spilling into the system's
    /// temporary folder.
    fn budget(pages: usize) -> Arc<StateBudget> {
        let page = std::mem::size_of::<Page<u32, u64>>() as u64;
        StateBudget::new(page * pages as u64, std::env::temp_dir()).expect("the temporary folder takes files")
    }

    fn bounded(budget: &Arc<StateBudget>) -> PagedMap<u32, u64> {
        let _scope = StateBudget::enter(Some(Arc::clone(budget)));
        PagedMap::new()
    }

    fn image(fork: &crate::state::PagedFork<u32, u64>) -> Vec<u8> {
        let mut bytes = Vec::new();
        crate::snapshot::ForkedState::write_to(&crate::state::kinds::ForkedMap(fork_clone(fork)), &mut bytes).unwrap();
        bytes
    }

    fn fork_clone(fork: &crate::state::PagedFork<u32, u64>) -> crate::state::PagedFork<u32, u64> {
        crate::state::PagedFork {
            pages: fork.pages.clone(),
            cold: ForkRefs(fork.cold.0.clone()),
            versions: fork.versions.clone(),
            len: fork.len,
            delta: super::super::Delta { after: 0, id: 0, dirty: Vec::new() },
            changes_wanted: Arc::default(),
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Add(u32, u64),
        Remove(u32),
        Fork,
        Clear,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            60 => (0..5_000u32, any::<u64>()).prop_map(|(k, v)| Op::Add(k, v)),
            15 => (0..5_000u32).prop_map(Op::Remove),
            4 => Just(Op::Fork),
            1 => Just(Op::Clear),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        /// The same writes to a map held within a budget of a few pages and to one in memory:
        /// the bounded map sends pages out and reads them back, and still equals the other at
        /// every step: the same lookups, and forks whose encodings are the same bytes (pages
        /// out of memory are copied from the spill file as they were written).
        #[test]
        fn a_map_within_a_budget_of_a_few_pages_equals_one_in_memory(ops in prop::collection::vec(op(), 1..3_000)) {
            let budget = budget(4);
            let mut cold = bounded(&budget);
            let mut warm: PagedMap<u32, u64> = PagedMap::new();
            let mut model: HashMap<u32, u64> = HashMap::new();
            for op in ops {
                match op {
                    Op::Add(k, v) => {
                        let (a, b) = (cold.get_or_insert_with(k, || 0), warm.get_or_insert_with(k, || 0));
                        *a = a.wrapping_add(v);
                        *b = b.wrapping_add(v);
                        let m = model.entry(k).or_insert(0);
                        *m = m.wrapping_add(v);
                    }
                    Op::Remove(k) => {
                        let r = cold.remove(&k);
                        prop_assert_eq!(r, warm.remove(&k));
                        prop_assert_eq!(r, model.remove(&k));
                    }
                    Op::Fork => {
                        let (a, b) = (cold.fork(), warm.fork());
                        prop_assert_eq!(image(&a), image(&b));
                    }
                    Op::Clear => {
                        cold.clear();
                        warm.clear();
                        model.clear();
                    }
                }
                prop_assert_eq!(cold.len(), model.len());
            }
            for (k, v) in &model {
                prop_assert_eq!(cold.get(k), Some(v));
            }
            prop_assert!(cold.iter().zip(warm.iter()).all(|(a, b)| a == b), "the same entries in the same slots");
            let stats = budget.stats();
            if cold.pages() > 8 {
                prop_assert!(stats.evictions > 0 && stats.faults > 0, "pages left and came back: {stats:?}");
            }
        }
    }

    /// Pages out of memory stay out of the budget's count; dropping the map gives every
    /// byte back.
    #[test]
    fn the_budget_holds_and_a_dropped_map_gives_its_pages_back() {
        let budget = budget(8);
        let mut m = bounded(&budget);
        for k in 0..200_000u32 {
            *m.get_or_insert_with(k, || 0) += k as u64;
        }
        let page = std::mem::size_of::<Page<u32, u64>>() as u64;
        let s = budget.stats();
        assert!(s.resident_bytes <= s.limit_bytes + EVICTIONS_AT_ONCE as u64 * page, "{s:?}");
        assert!(m.pages() > 500 && s.spilled_bytes > 0 && s.evictions > 500, "{s:?}, {} pages", m.pages());
        for k in (0..200_000u32).step_by(7) {
            assert_eq!(m.get(&k), Some(&(k as u64)));
        }
        let from_fork = {
            let fork = m.fork();
            let _scope = StateBudget::enter(Some(Arc::clone(&budget)));
            PagedMap::from_fork(&fork)
        };
        assert_eq!(from_fork.get(&199_999), Some(&199_999), "a map made from a fork reads its pages from disk");
        drop((m, from_fork));
        let s = budget.stats();
        assert_eq!((s.resident_bytes, s.spilled_bytes), (0, 0), "every page and spill file went with the maps");
    }

    /// A spill file damaged under a page out of memory: the lookup that reads the page back
    /// unwinds with a `StateFailure` naming the checksum, never returning a wrong value.
    #[test]
    fn a_damaged_spill_file_fails_the_lookup_with_a_clear_error() {
        let budget = budget(4);
        let mut m = bounded(&budget);
        for k in 0..20_000u32 {
            m.insert(k, k as u64);
        }
        let c = m.cold.as_deref().expect("bounded");
        let p = (0..m.pages()).find(|&p| c.flags[p].get() & IN_MEMORY == 0 && c.at[p].is_some()).expect("a page out");
        c.at[p].as_ref().expect("on disk").damage();
        let key = (0..20_000u32).find(|k| crate::record::hash_key(k) as usize & m.mask >> PAGE_SHIFT == p);
        let key = key.expect("a key on that page");
        let failure = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| m.get(&key).copied()))
            .expect_err("a damaged page is not read as a value");
        let StateFailure(e) = *failure.downcast::<StateFailure>().expect("a StateFailure");
        assert!(e.to_string().contains("checksum"), "{e}");
    }
}
