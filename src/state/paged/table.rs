//! [`PageTable`]: a map's page pointers, one cell each, so that a lookup through `&self` can
//! bring a page that left memory back (see `bounded`). Owns nothing but the pointers; the
//! rules for when an entry may change are its callers'.

use std::cell::UnsafeCell;
use std::sync::Arc;

use super::Page;

/// The pages of a map, in page order.
pub(super) struct PageTable<K, V>(Vec<UnsafeCell<Arc<Page<K, V>>>>);

impl<K, V> PageTable<K, V> {
    pub(super) fn new(pages: impl Iterator<Item = Arc<Page<K, V>>>) -> Self {
        PageTable(pages.map(UnsafeCell::new).collect())
    }

    #[inline(always)]
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    /// Page `p`'s pointer.
    #[inline(always)]
    pub(super) fn get(&self, p: usize) -> &Arc<Page<K, V>> {
        debug_assert!(p < self.0.len(), "page {p} of {}", self.0.len());
        // SAFETY: callers pass `p` below the page count (a masked slot's page, or an index in
        // `0..len`). An entry changes through `&self` only in `replace_shared`, whose callers
        // hold no reference to that entry (a page not in memory is never handed out).
        unsafe { &*self.0.get_unchecked(p).get() }
    }

    /// Page `p`'s pointer, for changing it (the map is borrowed exclusively).
    #[inline(always)]
    pub(super) fn get_mut(&mut self, p: usize) -> &mut Arc<Page<K, V>> {
        self.0[p].get_mut()
    }

    /// Sets page `p`'s pointer through a shared borrow, returning the one it had.
    ///
    /// # Safety
    /// No reference to entry `p` (the pointer itself) may be alive: the caller replaces the
    /// entry of a page not in memory, which no lookup hands out. References into the pages
    /// (slots) stay valid: the old page is kept alive by its owner until `&self` ends.
    pub(super) unsafe fn replace_shared(&self, p: usize, page: Arc<Page<K, V>>) -> Arc<Page<K, V>> {
        // SAFETY: the caller's contract above; the map is not `Sync` (the cells make it so),
        // so no other thread reaches this entry.
        unsafe { std::mem::replace(&mut *self.0[p].get(), page) }
    }

    /// Every page pointer, cloned (a fork's share).
    pub(super) fn cloned(&self) -> Vec<Arc<Page<K, V>>> {
        (0..self.len()).map(|p| Arc::clone(self.get(p))).collect()
    }

    /// The pointers, moved out.
    pub(super) fn into_pages(self) -> impl Iterator<Item = Arc<Page<K, V>>> {
        self.0.into_iter().map(UnsafeCell::into_inner)
    }
}
