//! Keyed state beyond memory: the [`StateBudget`] a job's paged state keeps within, and the
//! spill files where a changed page goes when it leaves memory.
//!
//! A [`PagedMap`](super::PagedMap) made on a thread inside a budget's scope
//! ([`StateBudget::enter`]: the runtime enters it where it builds a job's tasks and on each
//! worker) is bounded: while the job's resident pages pass the budget, the map being written
//! sends its least recently used pages out (a second-chance clock over an access bit per page).
//! A page already on disk unchanged since it came back is dropped; a changed one is first
//! written to the map's spill file. A lookup that reaches a page not in memory reads it back
//! (a fault) and checks it.
//!
//! A spill file is scratch: unlinked as soon as it is made, so it lives only as long as the
//! maps and forks that refer to it, never outlives the process and is never restored from.
//! A failure to write or read one is not survivable inside the attempt (a lookup cannot return
//! an error): it unwinds with a [`StateFailure`] that the task turns into the attempt's error,
//! so the job fails over to its last checkpoint.
//!
//! May touch: `error`, `context` (the wall clock, to time faults for a metric), `metrics` (the
//! counters' figures), `snapshot` (pages a checkpoint stored, read by a lazy restore).

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::metrics::StateMemoryStats;
use crate::snapshot::{StateFailure, StoredPage, StoredPages};

/// The least budget a task of keyed state can work within: a few pages of the largest kinds
/// (a page is 256 slots), so that a lookup's pages and the page being written fit at once.
pub const LEAST_STATE_MEMORY_PER_TASK: u64 = 64 << 10;

/// How much memory a job's keyed and window state may hold, and where pages that leave memory
/// go.
///
/// ```
/// use weir::state::StateBudget;
/// let budget = StateBudget::new(64 << 20, std::env::temp_dir()).unwrap();
/// assert_eq!(budget.limit_bytes(), 64 << 20);
/// assert!(StateBudget::new(64 << 20, "/no/such/folder").is_err());
/// ```
#[derive(Debug)]
pub struct StateBudget {
    limit: u64,
    dir: PathBuf,
    counters: ColdCounters,
    /// Where a lookahead's page reads go, off the workers: the runtime's reader threads
    /// ([`StateBudget::read_with`]); unset (the simulator, a test), every read is a fault's own.
    readers: std::sync::OnceLock<Arc<dyn PageReader>>,
    /// Where the tasks' checkpoints stored pages ([`StateBudget::pages_stored_by`]).
    stored: std::sync::Mutex<Vec<std::sync::Weak<dyn StoredPages>>>,
}

/// Runs page reads off the workers: a keyed operator's lookahead hands them over, and a fault
/// that finds its read done (or under way) takes the result instead of reading itself.
pub trait PageReader: Send + Sync {
    /// Runs `read` on a reader thread, soon.
    fn submit(&self, read: Box<dyn FnOnce() + Send>);
}

impl std::fmt::Debug for dyn PageReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PageReader")
    }
}

/// What a budget's maps did: read by metrics and reports, written off the per-record path
/// (on evictions and faults only).
#[derive(Debug, Default)]
struct ColdCounters {
    /// Bytes of pages bounded maps hold in memory, and the most they held.
    resident: AtomicI64,
    resident_peak: AtomicI64,
    /// Bytes spill files still open span, their free extents included (a file goes with the
    /// last map or fork that refers to it).
    spilled: AtomicI64,
    faults: AtomicU64,
    fault_nanos: AtomicU64,
    evictions: AtomicU64,
    spill_writes: AtomicU64,
    /// The spill write that fails (a seam for the simulator: 1 = the next); 0: none.
    failing_write: AtomicU64,
}

thread_local! {
    static CURRENT: std::cell::RefCell<Option<Arc<StateBudget>>> = const { std::cell::RefCell::new(None) };
}

/// The scope of [`StateBudget::enter`]: leaving it restores the budget the thread had before.
#[derive(Debug)]
#[must_use = "the budget applies only while the scope lives"]
pub struct BudgetScope(Option<Arc<StateBudget>>);

impl Drop for BudgetScope {
    fn drop(&mut self) {
        CURRENT.with(|c| *c.borrow_mut() = self.0.take());
    }
}

impl StateBudget {
    /// A budget of `bytes` whose spill files go into `dir`, which must exist and take files.
    pub fn new(bytes: u64, dir: impl Into<PathBuf>) -> Result<Arc<Self>> {
        let dir = dir.into();
        if bytes == 0 {
            return Err(Error::config("a state memory budget of 0 bytes leaves no room for a page"));
        }
        check_writable(&dir)?;
        Ok(Arc::new(StateBudget {
            limit: bytes,
            dir,
            counters: ColdCounters::default(),
            readers: Default::default(),
            stored: Default::default(),
        }))
    }

    /// Sends the lookahead's page reads to `readers` (the runtime's reader threads).
    pub fn read_with(&self, readers: Arc<dyn PageReader>) {
        let _ = self.readers.set(readers);
    }

    /// A page unchanged since one of `stored`'s checkpoints stored it leaves memory without
    /// a spill write: it is read back from the checkpoint's file (a task's incremental
    /// checkpoints; held weakly, so a task that ends takes it along).
    pub fn pages_stored_by(&self, stored: std::sync::Weak<dyn StoredPages>) {
        self.stored.lock().unwrap_or_else(|e| e.into_inner()).push(stored);
    }

    /// Where a checkpoint stored the page of version `version`, if one did.
    pub(super) fn find_stored(&self, version: u64) -> Option<StoredPage> {
        let mut stored = self.stored.lock().unwrap_or_else(|e| e.into_inner());
        stored.retain(|s| s.strong_count() > 0);
        stored.iter().filter_map(std::sync::Weak::upgrade).find_map(|s| s.stored(version))
    }

    /// Refuses a budget that leaves a task less than [`LEAST_STATE_MEMORY_PER_TASK`] (any task
    /// may keep keyed state).
    pub fn check_share(&self, tasks: usize) -> Result<()> {
        let least = LEAST_STATE_MEMORY_PER_TASK * tasks.max(1) as u64;
        if self.limit < least {
            return Err(Error::config(format!(
                "a state memory budget of {} is less than a page per task: the job has {tasks} tasks, \
                 so the least that works is {} ({} each)",
                ByteSize(self.limit),
                ByteSize(least),
                ByteSize(LEAST_STATE_MEMORY_PER_TASK),
            )));
        }
        Ok(())
    }

    /// The budget, in bytes.
    pub fn limit_bytes(&self) -> u64 {
        self.limit
    }

    /// The folder spill files go into.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Maps made on this thread until the scope ends keep within `budget` (`None`: unbounded).
    pub fn enter(budget: Option<Arc<StateBudget>>) -> BudgetScope {
        BudgetScope(CURRENT.with(|c| std::mem::replace(&mut *c.borrow_mut(), budget)))
    }

    /// The budget maps made on this thread now keep within.
    pub(crate) fn current() -> Option<Arc<StateBudget>> {
        CURRENT.with(|c| c.borrow().clone())
    }

    /// The counters now.
    pub fn stats(&self) -> StateMemoryStats {
        let c = &self.counters;
        StateMemoryStats {
            limit_bytes: self.limit,
            resident_bytes: c.resident.load(Ordering::Relaxed).max(0) as u64,
            resident_peak_bytes: c.resident_peak.load(Ordering::Relaxed).max(0) as u64,
            spilled_bytes: c.spilled.load(Ordering::Relaxed).max(0) as u64,
            faults: c.faults.load(Ordering::Relaxed),
            fault_nanos: c.fault_nanos.load(Ordering::Relaxed),
            evictions: c.evictions.load(Ordering::Relaxed),
            spill_writes: c.spill_writes.load(Ordering::Relaxed),
        }
    }

    /// Makes the `n`-th spill write from now fail as a full disk would (the simulator's
    /// fault).
    pub(crate) fn fail_spill_write(&self, n: u64) {
        self.counters.failing_write.store(n, Ordering::Relaxed);
    }

    /// Whether `bytes` more fit within the budget.
    pub(super) fn has_room(&self, bytes: u64) -> bool {
        self.counters.resident.load(Ordering::Relaxed) + bytes as i64 <= self.limit as i64
    }

    /// Whether the bounded maps hold more than the budget.
    #[inline]
    pub(super) fn over(&self) -> bool {
        self.counters.resident.load(Ordering::Relaxed) > self.limit as i64
    }

    pub(super) fn resident_changed(&self, bytes: i64) {
        let now = self.counters.resident.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if bytes > 0 {
            self.counters.resident_peak.fetch_max(now, Ordering::Relaxed);
        }
    }

    pub(super) fn evicted(&self) {
        self.counters.evictions.fetch_add(1, Ordering::Relaxed);
    }

    fn spilled_changed(&self, bytes: i64) {
        self.counters.spilled.fetch_add(bytes, Ordering::Relaxed);
    }

    /// A new spill file in the budget's folder, already unlinked.
    pub(super) fn spill_file(self: &Arc<Self>) -> Arc<SpillFile> {
        match SpillFile::create(self) {
            Ok(f) => Arc::new(f),
            Err(e) => fail(e),
        }
    }
}

/// Checks that `dir` is a folder weir can write files into (by making and removing one).
fn check_writable(dir: &Path) -> Result<()> {
    let meta = std::fs::metadata(dir).map_err(|e| Error::io("the state directory cannot be read", dir, e))?;
    if !meta.is_dir() {
        return Err(Error::config(format!("the state directory {} is not a folder", dir.display())));
    }
    // Named apart per check: budgets made at once in one process (tests, two jobs) each
    // make and remove their own.
    scratch_file(dir, ".weir-state-probe", "a file in the state directory").map(|_| ()).map_err(|e| match e {
        Error::Io { source, .. } => Error::io("the state directory does not take files", dir, source),
        other => other,
    })
}

/// Unwinds with `e` as a [`StateFailure`].
pub(super) fn fail(e: Error) -> ! {
    std::panic::panic_any(StateFailure(e))
}

/// A file of pages that left memory: written by one map, read by it and by the forks that
/// share its pages. Unlinked when made: it goes away with the last reference. A page takes
/// an extent of whole blocks; an extent no map or fork refers to any longer is written over
/// by the next page of its size, so the file stays near the size of what it holds (and a
/// write over an extent the file has is cheaper than one that grows it).
#[derive(Debug)]
pub(super) struct SpillFile {
    file: std::fs::File,
    path: PathBuf,
    budget: Arc<StateBudget>,
    space: std::sync::Mutex<Space>,
}

/// A spill file's extents: its length, and the extents free, by their length in blocks.
#[derive(Debug, Default)]
struct Space {
    end: u64,
    free: std::collections::HashMap<u64, Vec<u64>>,
}

/// The unit of a spill file's extents.
const BLOCK: u64 = 4096;

impl Drop for SpillFile {
    fn drop(&mut self) {
        let end = self.space.get_mut().map_or(0, |s| s.end);
        self.budget.spilled_changed(-(end as i64));
    }
}

impl SpillFile {
    fn create(budget: &Arc<StateBudget>) -> Result<Self> {
        // Scratch: nothing may ever restore from it.
        let (file, path) = scratch_file(&budget.dir, "weir-spill", "a spill file for keyed state")?;
        Ok(SpillFile { file, path, budget: Arc::clone(budget), space: Default::default() })
    }

    fn space(&self) -> std::sync::MutexGuard<'_, Space> {
        // The space is consistent after every step: a panic elsewhere leaves it usable.
        self.space.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes `page` (a page's encoding) into a free extent of its size or at the end.
    pub(super) fn write(self: &Arc<Self>, page: &[u8]) -> ColdRef {
        let blocks = (page.len() as u64).div_ceil(BLOCK).max(1);
        let offset = {
            let mut space = self.space();
            match space.free.get_mut(&blocks).and_then(Vec::pop) {
                Some(at) => at,
                None => {
                    let at = space.end;
                    space.end += blocks * BLOCK;
                    self.budget.spilled_changed((blocks * BLOCK) as i64);
                    at
                }
            }
        };
        let place = Place::Spill { file: Arc::clone(self), offset, blocks };
        let extent = Extent { place, len: page.len() as u32, crc: crc32c::crc32c(page) };
        let failing = &self.budget.counters.failing_write;
        let injected = failing.load(Ordering::Relaxed) != 0 && failing.fetch_sub(1, Ordering::Relaxed) == 1;
        let written = match injected {
            true => Err(std::io::Error::from_raw_os_error(28)),
            false => self.file.write_all_at(page, offset),
        };
        if let Err(e) = written {
            drop(extent);
            fail(Error::io("cannot write a page of keyed state to its spill file (a full disk?)", &self.path, e));
        }
        self.budget.counters.spill_writes.fetch_add(1, Ordering::Relaxed);
        ColdRef(Arc::new(extent))
    }
}

/// A new file in `dir` named `<prefix>-<pid>-<n>`, open to read and write and already unlinked:
/// scratch that goes with its last handle and never outlives the process. `what` names it in
/// errors.
pub(crate) fn scratch_file(dir: &Path, prefix: &str, what: &str) -> Result<(std::fs::File, PathBuf)> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let path = dir.join(format!("{prefix}-{}-{n}", std::process::id()));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|e| Error::io(format!("cannot make {what}"), &path, e))?;
    std::fs::remove_file(&path).map_err(|e| Error::io(format!("cannot unlink {what}"), &path, e))?;
    Ok((file, path))
}

/// Where a page's encoding lies on disk: an extent of a spill file (free again when dropped),
/// or a page a checkpoint stored (a lazy restore's pages, until they change).
#[derive(Debug)]
struct Extent {
    place: Place,
    len: u32,
    crc: u32,
}

#[derive(Debug)]
enum Place {
    Spill { file: Arc<SpillFile>, offset: u64, blocks: u64 },
    Stored { page: StoredPage, budget: Arc<StateBudget> },
}

impl Drop for Extent {
    fn drop(&mut self) {
        if let Place::Spill { file, offset, blocks } = &self.place {
            file.space().free.entry(*blocks).or_default().push(*offset);
        }
    }
}

/// Where a page that left memory lies: a spill file's extent, or a page a checkpoint stored,
/// with its checksum. Shared by the map and its forks: a spill extent is free once all have
/// let go.
#[derive(Debug, Clone)]
pub(super) struct ColdRef(Arc<Extent>);

impl ColdRef {
    /// A page a checkpoint stored, read within `budget`.
    pub(super) fn stored(page: StoredPage, budget: Arc<StateBudget>) -> ColdRef {
        let (len, crc) = (page.len, page.crc);
        ColdRef(Arc::new(Extent { place: Place::Stored { page, budget }, len, crc }))
    }

    /// The page's encoding, checked against its checksum.
    pub(super) fn read(&self) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(self.0.len as usize);
        self.read_into(&mut out).map(|()| out)
    }

    /// [`Self::read`], appended to `out`.
    pub(super) fn read_into(&self, out: &mut Vec<u8>) -> std::io::Result<()> {
        let (file, offset) = match &self.0.place {
            Place::Spill { file, offset, .. } => (file, *offset),
            Place::Stored { page, .. } => return page.read_into(out),
        };
        let start = out.len();
        out.resize(start + self.0.len as usize, 0);
        file.file.read_exact_at(&mut out[start..], offset)?;
        if crc32c::crc32c(&out[start..]) != self.0.crc {
            out.truncate(start);
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "a page of keyed state read back from its spill file ({} bytes at {}) fails its checksum",
                    self.0.len, offset
                ),
            ));
        }
        Ok(())
    }

    /// The page's encoding for a fault: the lookahead's read if one was asked for (waited for
    /// if under way), else read now; timed (the worker's wait) and counted, and a failure
    /// unwinds.
    pub(super) fn fault(&self, ahead: Option<Arc<ReadAhead>>) -> Vec<u8> {
        // A metric of the wait itself, outside the job's time: it decides nothing.
        let began = crate::context::wall::now();
        let read = ahead.and_then(|a| a.take()).unwrap_or_else(|| self.read());
        let bytes = read.unwrap_or_else(|e| fail(self.read_failed(e)));
        let budget = self.budget_ref();
        let c = &budget.counters;
        c.faults.fetch_add(1, Ordering::Relaxed);
        c.fault_nanos.fetch_add(began.elapsed().as_nanos() as u64, Ordering::Relaxed);
        bytes
    }

    /// Starts reading the page on the budget's reader threads (`None` without them).
    pub(super) fn read_ahead(&self) -> Option<Arc<ReadAhead>> {
        let readers = self.budget_ref().readers.get()?;
        let ahead = Arc::new(ReadAhead::default());
        let (at, slot) = (self.clone(), Arc::clone(&ahead));
        readers.submit(Box::new(move || slot.run(&at)));
        Some(ahead)
    }

    /// Overwrites the page's first byte on disk (a test's damage).
    #[cfg(test)]
    pub(super) fn damage(&self) {
        let Place::Spill { file, offset, .. } = &self.0.place else { panic!("a spilled page") };
        let mut b = [0u8; 1];
        file.file.read_exact_at(&mut b, *offset).expect("readable");
        file.file.write_all_at(&[b[0] ^ 0xff], *offset).expect("writable");
    }

    /// Whether the page lies in a checkpoint's file (not a spill file).
    pub(super) fn is_stored(&self) -> bool {
        matches!(self.0.place, Place::Stored { .. })
    }

    fn budget_ref(&self) -> &Arc<StateBudget> {
        match &self.0.place {
            Place::Spill { file, .. } => &file.budget,
            Place::Stored { budget, .. } => budget,
        }
    }

    /// The budget whose map wrote (or restored) the page.
    pub(super) fn budget(&self) -> Arc<StateBudget> {
        Arc::clone(self.budget_ref())
    }

    /// The error of a read of this page that failed (`e`, or its content not a page).
    pub(super) fn read_failed(&self, e: std::io::Error) -> Error {
        match &self.0.place {
            Place::Spill { file, .. } => {
                Error::io("cannot read a page of keyed state back from its spill file", &file.path, e)
            }
            Place::Stored { page, .. } => {
                Error::io("cannot read a page of keyed state from its checkpoint file", page.source.path(), e)
            }
        }
    }
}

/// A page read handed to the reader threads ahead of its fault.
#[derive(Debug, Default)]
pub(super) struct ReadAhead {
    state: std::sync::Mutex<AheadState>,
    done: std::sync::Condvar,
}

#[derive(Debug, Default)]
enum AheadState {
    #[default]
    Queued,
    Reading,
    Done(std::io::Result<Vec<u8>>),
    /// The fault came first and reads for itself: the reader skips it.
    Taken,
}

impl ReadAhead {
    fn lock(&self) -> std::sync::MutexGuard<'_, AheadState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The reader's part: reads the page unless its fault came first.
    fn run(&self, at: &ColdRef) {
        {
            let mut state = self.lock();
            if !matches!(*state, AheadState::Queued) {
                return;
            }
            *state = AheadState::Reading;
        }
        let read = at.read();
        *self.lock() = AheadState::Done(read);
        self.done.notify_all();
    }

    /// Whether the read finished (a fault would take it without waiting).
    pub(super) fn is_done(&self) -> bool {
        matches!(*self.lock(), AheadState::Done(_))
    }

    /// The fault's part: the read's result once done (waiting while it is under way), or
    /// `None` when it has not started (the fault reads for itself, and the reader skips it).
    pub(super) fn take(&self) -> Option<std::io::Result<Vec<u8>>> {
        let mut state = self.lock();
        loop {
            match std::mem::replace(&mut *state, AheadState::Taken) {
                AheadState::Queued | AheadState::Taken => return None,
                AheadState::Done(read) => return Some(read),
                AheadState::Reading => {
                    *state = AheadState::Reading;
                    state = self.done.wait(state).unwrap_or_else(|e| e.into_inner());
                }
            }
        }
    }
}

/// A size in bytes, read as a number with an optional unit (`512MiB`, `2GiB`, `64MB`, `4096`)
/// and shown in the largest binary unit that keeps it whole or to one decimal.
///
/// ```
/// use weir::state::ByteSize;
/// assert_eq!("512MiB".parse::<ByteSize>().unwrap().0, 512 << 20);
/// assert_eq!("1.5 GiB".parse::<ByteSize>().unwrap().0, 3 << 29);
/// assert_eq!(ByteSize(3 << 29).to_string(), "1.5 GiB");
/// assert!("lots".parse::<ByteSize>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

const UNITS: [(&str, u64); 9] = [
    ("TiB", 1 << 40),
    ("GiB", 1 << 30),
    ("MiB", 1 << 20),
    ("KiB", 1 << 10),
    ("TB", 1_000_000_000_000),
    ("GB", 1_000_000_000),
    ("MB", 1_000_000),
    ("KB", 1_000),
    ("B", 1),
];

impl std::str::FromStr for ByteSize {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let t = s.trim();
        let digits = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
        let (number, unit) = (&t[..digits], t[digits..].trim());
        let scale = match unit {
            "" => 1,
            u => UNITS.iter().find(|(name, _)| name.eq_ignore_ascii_case(u)).map(|&(_, s)| s).ok_or_else(|| {
                format!("{s:?} is not a size: the unit {u:?} is none of B, KiB, MiB, GiB, TiB, KB, MB, GB, TB")
            })?,
        };
        let value: f64 =
            number.parse().map_err(|_| format!("{s:?} is not a size (a number with a unit, as 512MiB)"))?;
        let bytes = value * scale as f64;
        if !bytes.is_finite() || bytes >= u64::MAX as f64 {
            return Err(format!("{s:?} is larger than weir can count"));
        }
        Ok(ByteSize(bytes.round() as u64))
    }
}

impl std::fmt::Display for ByteSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Some(&(name, scale)) = UNITS[..4].iter().find(|(_, s)| self.0 >= *s) else {
            return write!(f, "{} B", self.0);
        };
        match self.0 % scale {
            0 => write!(f, "{} {name}", self.0 / scale),
            _ => write!(f, "{:.1} {name}", self.0 as f64 / scale as f64),
        }
    }
}
