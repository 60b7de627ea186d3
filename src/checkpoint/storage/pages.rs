//! The pages of a checkpoint's shared files as a lazy restore reads them: one page at a time,
//! from a file in the directory ([`CheckpointPages`]) or from the object store the directory
//! is kept in, through a local cache of a size limit ([`RemotePages`], [`PageCache`]), each
//! page checked against the checksum its task file recorded. A file a page of which failed
//! that check is marked damaged for the process: a later restore reads it whole.
//!
//! May touch: `error`, `snapshot`, `state` (its scratch files).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::snapshot::PageSource;

use super::*;

/// Whether a page of shared file `path` (as the directory names it) failed its check in this
/// process.
pub(super) fn is_damaged(path: &Path) -> bool {
    damaged_files().contains(path)
}

/// Shared file `name` of the checkpoint directory at `root` (of the job with `fingerprint`),
/// open for reading pages, its header checked against `digest`'s length and the identity its
/// name gives.
pub(crate) fn open_stored(
    root: &Path,
    name: &str,
    fingerprint: &str,
    digest: &FileDigest,
) -> Result<Arc<dyn PageSource>> {
    let Some((id, task)) = parse_shared_name(name) else {
        return Err(Error::Corrupt(format!("'{name}' is not the name of a shared state file")));
    };
    let expected = FileIdentity::new(FileKind::SharedPages, fingerprint, id, Some(task));
    Ok(Arc::new(CheckpointPages::open((root, name), &expected, digest)?))
}

/// Calls `read(at, n)` for each piece of payload bytes `offset..offset + len` of a file in the
/// checkpoint format: `n` bytes at file offset `at`. Every block but the last holds
/// [`BLOCK_BYTES`] after its 8-byte length and CRC, so a page may span two.
fn for_each_piece(offset: u64, len: u32, mut read: impl FnMut(u64, u64) -> std::io::Result<()>) -> std::io::Result<()> {
    let block = BLOCK_BYTES as u64;
    let (mut at, mut left) = (offset, len as u64);
    while left > 0 {
        let (b, within) = (at / block, at % block);
        let n = left.min(block - within);
        read(HEADER_BYTES as u64 + b * (block + 8) + 8 + within, n)?;
        (at, left) = (at + n, left - n);
    }
    Ok(())
}

/// The file offsets of block `b` of a file of `file_len` bytes in the checkpoint format: its
/// length and CRC, then its bytes (the last one may be short, and the terminator follows it).
fn block_span(b: u64, file_len: u64) -> (u64, u64) {
    let start = HEADER_BYTES as u64 + b * (BLOCK_BYTES as u64 + 8);
    (start, (start + BLOCK_BYTES as u64 + 8).min(file_len))
}

/// The shared files whose pages failed a check in this process: a later restore reads them
/// whole (so the checkpoint that refers to them is found damaged and skipped).
fn damaged_files() -> std::sync::MutexGuard<'static, std::collections::HashSet<PathBuf>> {
    static DAMAGED: std::sync::OnceLock<Mutex<std::collections::HashSet<PathBuf>>> = std::sync::OnceLock::new();
    DAMAGED.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner())
}

/// A shared file of pages, open for a lazy restore's reads: a page at a time, from the blocks
/// of the file format (a page may span two). Open, it stays readable after retention removes
/// it.
#[derive(Debug)]
pub(super) struct CheckpointPages {
    file: std::fs::File,
    path: PathBuf,
    /// As the directory names it, and its recorded digest.
    name: String,
    digest: FileDigest,
}

impl CheckpointPages {
    pub(super) fn open((root, name): (&Path, &str), expected: &FileIdentity, digest: &FileDigest) -> Result<Self> {
        let path = &root.join(name);
        use std::os::unix::fs::FileExt;
        let file = std::fs::File::open(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => corrupt(path, "missing (the checkpoint's _metadata lists it)"),
            _ => Error::io("cannot open a checkpoint's shared pages", path, e),
        })?;
        let len = file.metadata().map_err(|e| Error::io("cannot read a checkpoint's shared pages", path, e))?.len();
        digest.check_len(path, len as usize)?;
        let mut header = [0u8; HEADER_BYTES];
        file.read_exact_at(&mut header, 0)
            .map_err(|e| Error::io("cannot read a checkpoint's shared pages", path, e))?;
        let found = decode_header(&header, expected.kind).map_err(|m| corrupt(path, m))?;
        check_identity(path, &found, expected)?;
        Ok(CheckpointPages { file, path: path.to_path_buf(), name: name.to_string(), digest: *digest })
    }
}

impl PageSource for CheckpointPages {
    fn read_at(&self, offset: u64, len: u32, out: &mut Vec<u8>) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        for_each_piece(offset, len, |at, n| {
            let start = out.len();
            out.resize(start + n as usize, 0);
            self.file.read_exact_at(&mut out[start..], at)
        })
    }

    fn path(&self) -> &Path {
        &self.path
    }

    fn damaged(&self) {
        damaged_files().insert(self.path.clone());
    }

    fn stored_as(&self) -> (&str, u64, u32) {
        (&self.name, self.digest.bytes, self.digest.crc32c)
    }
}

/// Where pages read from an object store are kept on local disk, within a size limit: per
/// remote file a sparse local copy holding the blocks read so far; past the limit, the copies
/// used longest ago are emptied (their blocks are read from the store again when needed).
#[derive(Debug)]
pub struct PageCache {
    dir: PathBuf,
    limit: u64,
    held: Mutex<CacheUse>,
}

#[derive(Debug, Default)]
struct CacheUse {
    bytes: u64,
    /// The remote files with blocks here, used longest ago first.
    files: std::collections::VecDeque<std::sync::Weak<RemotePages>>,
}

impl PageCache {
    /// A cache in `dir` (its files are unlinked when made: scratch, gone with the process) of
    /// at most `limit` bytes.
    pub fn new(dir: impl Into<PathBuf>, limit: u64) -> Arc<Self> {
        Arc::new(PageCache { dir: dir.into(), limit, held: Mutex::default() })
    }

    /// Bytes the cache holds now.
    pub fn bytes(&self) -> u64 {
        self.held().bytes
    }

    fn held(&self) -> std::sync::MutexGuard<'_, CacheUse> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `file` took `bytes` more: it is now the most recently used, and the copies used longest
    /// ago are emptied while the cache holds more than its limit.
    fn took(&self, file: &Arc<RemotePages>, bytes: u64) {
        let mut emptied = Vec::new();
        {
            let mut held = self.held();
            held.bytes += bytes;
            held.files.retain(|f| f.upgrade().is_some_and(|f| !Arc::ptr_eq(&f, file)));
            held.files.push_back(Arc::downgrade(file));
            while held.bytes > self.limit && held.files.len() > 1 {
                let Some(old) = held.files.pop_front().and_then(|f| f.upgrade()) else { continue };
                emptied.push(old);
            }
        }
        for old in emptied {
            let freed = old.empty();
            self.held().bytes -= freed;
        }
    }
}

/// A shared file left in the object store, read a page at a time through the [`PageCache`]:
/// the blocks a page lies in are read from the store (a ranged read each) into the local copy
/// first.
#[derive(Debug)]
pub(super) struct RemotePages {
    store: Arc<dyn crate::checkpoint::ObjectStore>,
    key: String,
    /// The file as the directory names it (the mark of damage), and as messages show it.
    local: PathBuf,
    shown: PathBuf,
    name: String,
    digest: FileDigest,
    len: u64,
    cache: Arc<PageCache>,
    /// The local copy, and which of its blocks it holds.
    copy: std::fs::File,
    present: Mutex<Vec<bool>>,
    /// Itself, for the cache's list.
    this: std::sync::Weak<RemotePages>,
}

impl RemotePages {
    /// Opens object `key`, which holds shared file `name`, checking its header.
    pub(super) fn open(
        store: Arc<dyn crate::checkpoint::ObjectStore>,
        key: String,
        (root, name): (&Path, &str),
        expected: &FileIdentity,
        digest: &FileDigest,
        cache: &Arc<PageCache>,
    ) -> Result<Arc<Self>> {
        let shown = PathBuf::from(format!("{}/{key}", store.location()));
        let header = store
            .read_range(&key, 0, HEADER_BYTES as u64)
            .map_err(|e| Error::io("cannot read a checkpoint's shared pages from the store", &shown, e))?;
        let found = decode_header(&header, expected.kind).map_err(|m| corrupt(&shown, m))?;
        check_identity(&shown, &found, expected)?;
        // Scratch, as spill files are: it must not outlive the process.
        let (copy, _) = crate::state::scratch_file(&cache.dir, "weir-page-cache", "a file in the page cache")?;
        let blocks = digest.bytes.div_ceil(BLOCK_BYTES as u64 + 8) as usize;
        Ok(Arc::new_cyclic(|this| RemotePages {
            store,
            key,
            local: root.join(name),
            shown,
            name: name.to_string(),
            digest: *digest,
            len: digest.bytes,
            cache: Arc::clone(cache),
            copy,
            present: Mutex::new(vec![false; blocks]),
            this: std::sync::Weak::clone(this),
        }))
    }

    fn present(&self) -> std::sync::MutexGuard<'_, Vec<bool>> {
        self.present.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Brings block `b` into the local copy unless it is there.
    fn ensure(&self, b: u64) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        if self.present().get(b as usize).copied().unwrap_or(true) {
            return Ok(());
        }
        let (start, end) = block_span(b, self.len);
        let bytes = self.store.read_range(&self.key, start, end)?;
        self.copy.write_all_at(&bytes, start)?;
        let newly = !std::mem::replace(&mut self.present()[b as usize], true);
        if let (true, Some(this)) = (newly, self.this.upgrade()) {
            self.cache.took(&this, bytes.len() as u64);
        }
        Ok(())
    }

    /// Drops every block of the local copy; returns the bytes freed.
    fn empty(&self) -> u64 {
        let mut present = self.present();
        let held: u64 = (0..present.len() as u64)
            .filter(|&b| present[b as usize])
            .map(|b| block_span(b, self.len))
            .map(|(s, e)| e - s)
            .sum();
        present.iter_mut().for_each(|p| *p = false);
        let _ = self.copy.set_len(0);
        held
    }
}

impl PageSource for RemotePages {
    fn read_at(&self, offset: u64, len: u32, out: &mut Vec<u8>) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        for_each_piece(offset, len, |at, n| {
            let b = (at - HEADER_BYTES as u64) / (BLOCK_BYTES as u64 + 8);
            self.ensure(b)?;
            let start = out.len();
            out.resize(start + n as usize, 0);
            self.copy.read_exact_at(&mut out[start..], at)
        })
    }

    fn path(&self) -> &Path {
        &self.shown
    }

    fn damaged(&self) {
        damaged_files().insert(self.local.clone());
    }

    fn stored_as(&self) -> (&str, u64, u32) {
        (&self.name, self.digest.bytes, self.digest.crc32c)
    }
}
