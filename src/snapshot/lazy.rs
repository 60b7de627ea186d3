//! Lazy restores: a checkpoint's pages of keyed state handed to the state being restored as
//! places in files ([`StoredPage`]) rather than bytes, read and checked one at a time when a
//! lookup first reaches them, and [`StateFailure`], the unwinding of a page read that failed
//! where no error can be returned.
//!
//! The restore runs on one thread ([`restore_lazily`]); the state's decoders take the pages in
//! the order they were written from this module, and framings that count a part's length
//! with its pages ask it where a part ends ([`split_with_stored_pages`]).
//!
//! May touch: `error`.

use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};

/// An error reading or writing state that is not in memory: the payload a bounded map unwinds
/// with (a lookup cannot return an error). The task that catches it fails its attempt with the
/// error inside, so the job fails over to its last checkpoint.
#[derive(Debug)]
pub struct StateFailure(pub Error);

/// A file of pages a checkpoint stored, as a lazy restore reads them: one page at a time,
/// each checked against the checksum its task file recorded (the checkpoint's storage knows
/// the file's layout, local or in an object store).
pub trait PageSource: Send + Sync + std::fmt::Debug {
    /// Appends the `len` bytes at payload offset `offset` to `out`.
    fn read_at(&self, offset: u64, len: u32, out: &mut Vec<u8>) -> std::io::Result<()>;
    /// The file, for errors.
    fn path(&self) -> &Path;
    /// A page of it failed its checksum: the file is damaged (a later restore reads it whole,
    /// and so skips the checkpoint).
    fn damaged(&self);
    /// The file as its checkpoint directory names it, with the length and CRC-32C its
    /// `_metadata` recorded: what a later checkpoint that refers to its pages records.
    fn stored_as(&self) -> (&str, u64, u32);
}

/// One page a checkpoint stored: where it lies, its length and its CRC-32C. A lazy restore
/// hands a map these instead of the pages' bytes ([`restore_lazily`]).
#[derive(Debug, Clone)]
pub struct StoredPage {
    /// The file it lies in.
    pub source: Arc<dyn PageSource>,
    /// Its offset in that file's payload.
    pub offset: u64,
    /// Its length in bytes.
    pub len: u32,
    /// Its encoding's CRC-32C.
    pub crc: u32,
}

impl StoredPage {
    /// Its encoding, checked (a page the map is not bounded to keep out of memory is read now).
    pub(crate) fn read(&self) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(self.len as usize);
        self.read_into(&mut out).map(|()| out)
    }

    /// [`Self::read`], appended to `out`.
    pub(crate) fn read_into(&self, out: &mut Vec<u8>) -> std::io::Result<()> {
        let start = out.len();
        self.source.read_at(self.offset, self.len, out)?;
        if crc32c::crc32c(&out[start..]) != self.crc {
            out.truncate(start);
            self.source.damaged();
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "a page of keyed state in checkpoint file {} ({} bytes at payload offset {}) fails its checksum",
                    self.source.path().display(),
                    self.len,
                    self.offset
                ),
            ));
        }
        Ok(())
    }
}

/// A lazy part's pages, each with the offset in its bytes (without the pages) where it
/// belongs.
pub type PlacedPages = [(usize, StoredPage)];

/// A lazy restore under way on a thread: the pages not yet handed out, and where in the
/// encoding given to the state (its bytes without the pages) each page belonged, for framings
/// that count a part's length with its pages ([`split_with_stored_pages`]).
struct LazyRestore {
    pages: std::collections::VecDeque<StoredPage>,
    /// The address and length of the bytes without the pages.
    inline: (usize, usize),
    /// Per page, the offset in those bytes where it belonged, and its length.
    holes: Vec<(usize, u64)>,
    /// Splits made ([`split_with_stored_pages`]): at an offset, the first page after it.
    splits: std::collections::HashMap<usize, usize>,
}

thread_local! {
    static LAZY: std::cell::RefCell<Option<LazyRestore>> = const { std::cell::RefCell::new(None) };
}

/// Runs `restore` (an operator decoding its state) over `inline`, its encoding without its
/// pages of keyed state, with `pages` (each with the offset in `inline` where it belonged)
/// standing in for them in the order they were written: a bounded map takes each as a page
/// out of memory, read on its first lookup; anything else reads it now. Returns what
/// `restore` returned, or an error if it left pages untaken (the state does not match its
/// file).
pub fn restore_lazily<R>(inline: &[u8], pages: &PlacedPages, restore: impl FnOnce(&[u8]) -> Result<R>) -> Result<R> {
    let lazy = LazyRestore {
        pages: pages.iter().map(|(_, p)| p.clone()).collect(),
        inline: (inline.as_ptr() as usize, inline.len()),
        holes: pages.iter().map(|(at, p)| (*at, p.len as u64)).collect(),
        splits: Default::default(),
    };
    let before = LAZY.with(|l| l.borrow_mut().replace(lazy));
    let result = restore(inline);
    let left = LAZY.with(|l| std::mem::replace(&mut *l.borrow_mut(), before)).map_or(0, |q| q.pages.len());
    match result {
        Ok(_) if left > 0 => Err(Error::Corrupt(format!("the state leaves {left} stored pages unread"))),
        r => r,
    }
}

/// Where to split `bytes` (a part of a lazy restore's encoding) so that the first piece holds
/// `first` bytes of the whole encoding, its pages counted: `None` when no lazy restore is
/// under way over these bytes (split at `first`); `Some(None)` when no split gives that.
pub(crate) fn split_with_stored_pages(bytes: &[u8], first: u64) -> Option<Option<usize>> {
    LAZY.with(|l| {
        let mut l = l.borrow_mut();
        let lazy = l.as_mut()?;
        let (base, len) = lazy.inline;
        let from = (bytes.as_ptr() as usize).checked_sub(base).filter(|&o| o + bytes.len() <= len)?;
        // Pages lie between bytes, several at one offset: where a split fell among them
        // is remembered, so the second piece starts at its own pages.
        let mut hole = match lazy.splits.get(&from) {
            Some(&h) => h,
            None => lazy.holes.partition_point(|&(h, _)| h < from),
        };
        let (mut at, mut left) = (from, first);
        while let Some(&(offset, hole_len)) = lazy.holes.get(hole) {
            let before = (offset - at) as u64;
            if before >= left {
                break;
            }
            // The bytes up to the page, then the page, belong to the first piece.
            left -= before;
            at = offset;
            if hole_len > left {
                return Some(None);
            }
            left -= hole_len;
            hole += 1;
            if left == 0 {
                break;
            }
        }
        let split = at - from + left as usize;
        if split > bytes.len() {
            return Some(None);
        }
        lazy.splits.insert(from + split, hole);
        Some(Some(split))
    })
}

/// Where the checkpoints of a task stored its pages, by version: a page of keyed state that
/// leaves memory unchanged since a completed checkpoint stored it is dropped, and read back
/// from there, rather than written to a spill file.
pub trait StoredPages: Send + Sync {
    /// Where the newest completed checkpoint stored the page of version `version`, if it did
    /// (and the file can be read from).
    fn stored(&self, version: u64) -> Option<StoredPage>;
}

thread_local! {
    static KEPT: std::cell::RefCell<Option<Vec<(u64, StoredPage)>>> = const { std::cell::RefCell::new(None) };
}

/// Runs `build` (a task made and its state restored), returning with what it returned the
/// pages a lazy restore left where they were stored, by the version each has in its map:
/// until a page changes (and so gets a new version), a checkpoint may refer to it there.
pub(crate) fn pages_left_stored<R>(build: impl FnOnce() -> R) -> (R, Vec<(u64, StoredPage)>) {
    let before = KEPT.with(|k| k.borrow_mut().replace(Vec::new()));
    let built = build();
    let kept = KEPT.with(|k| std::mem::replace(&mut *k.borrow_mut(), before)).unwrap_or_default();
    (built, kept)
}

/// A map restored lazily keeps `page` out of memory as its page of version `version`.
pub(crate) fn page_left_stored(version: u64, page: &StoredPage) {
    KEPT.with(|k| {
        if let Some(kept) = k.borrow_mut().as_mut() {
            kept.push((version, page.clone()));
        }
    });
}

/// Whether a lazy restore is under way on this thread: page encodings are not in the input,
/// they come from [`next_stored_page`].
pub(crate) fn restoring_lazily() -> bool {
    LAZY.with(|l| l.borrow().is_some())
}

/// How many stored pages a lazy restore under way has left to hand out (`None`: none is).
pub(crate) fn stored_pages_left() -> Option<u64> {
    LAZY.with(|l| l.borrow().as_ref().map(|q| q.pages.len() as u64))
}

/// The next page of a lazy restore ([`restore_lazily`]).
pub(crate) fn next_stored_page() -> Result<StoredPage> {
    LAZY.with(|l| l.borrow_mut().as_mut().and_then(|q| q.pages.pop_front()))
        .ok_or_else(|| Error::Corrupt("the state takes more stored pages than its file lists".into()))
}
