//! The vocabulary of checkpoints shared by channels, operators, sources, sinks and tasks:
//! [`Barrier`], [`TaskSnapshot`] (what one task captured for one checkpoint), [`ForkedState`]
//! (one operator's captured state, written later in the background), [`RestoredState`] (what
//! a restarted task reads back), and [`FaultInjector`] (failure points for tests).
//!
//! The protocol is asynchronous barrier snapshotting (Carbone et al., "Lightweight
//! Asynchronous Snapshots for Distributed Dataflows", 2015), a variant of Chandy and Lamport's
//! distributed snapshots (1985).
//!
//! May touch: `error`, `persist`.

use std::collections::HashMap;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::persist::Persist;

/// A checkpoint barrier, travelling in-band through the rings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Barrier {
    /// The checkpoint id, increasing from 1.
    pub id: u64,
    /// When the coordinator triggered it, on the job clock.
    pub trigger_ns: u64,
    /// Unaligned: the barrier overtakes in-flight data through each channel's priority slot,
    /// and that data is stored with the checkpoint.
    pub unaligned: bool,
}

/// A notice from the coordinator after a checkpoint's fate is decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckpointNotice {
    /// Every task acknowledged and the metadata is durable: sinks may commit.
    Complete(u64),
    /// The checkpoint was abandoned: drop its pending work.
    Aborted(u64),
}

/// One operator's state captured by the synchronous part of a snapshot, written out later by
/// the asynchronous part (on a background thread, while the task goes on).
pub trait ForkedState: Send {
    /// Hands the captured state to `out` as a sequence of chunks; concatenated, the chunks are
    /// the state's encoding (what [`crate::collector::Collector::restore_state`] reads).
    /// Paged state hands each page as a [`StateChunks::page`], so that an incremental
    /// checkpoint can refer to a page an earlier checkpoint stored instead of writing it again.
    fn write_chunks(&self, out: &mut dyn StateChunks) -> io::Result<()>;

    /// Writes the whole encoding to `out`; returns the bytes written.
    fn write_to(&self, out: &mut dyn Write) -> io::Result<u64> {
        let mut all = Concatenated { out, written: 0 };
        self.write_chunks(&mut all)?;
        Ok(all.written)
    }
}

/// Receives a [`ForkedState`]'s encoding, chunk by chunk.
pub trait StateChunks {
    /// Bytes of the encoding.
    fn bytes(&mut self, bytes: &[u8]) -> io::Result<()>;
    /// One page of state whose content is identified by `version`: two pages with the same
    /// version have the same content ([`crate::state::PagedMap`] gives a page a new version
    /// when it is first written after a fork). `encode` appends the page's encoding; a receiver
    /// that already stored this version may refer to it and not call `encode` at all.
    /// Returns the length of the page's encoding.
    fn page(&mut self, version: u64, encode: &mut dyn FnMut(&mut Vec<u8>)) -> io::Result<u64>;
}

/// The plain receiver: every chunk written out in order.
struct Concatenated<'a> {
    out: &'a mut dyn Write,
    written: u64,
}

impl StateChunks for Concatenated<'_> {
    fn bytes(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }
    fn page(&mut self, _version: u64, encode: &mut dyn FnMut(&mut Vec<u8>)) -> io::Result<u64> {
        let mut buf = Vec::new();
        encode(&mut buf);
        self.bytes(&buf)?;
        Ok(buf.len() as u64)
    }
}

/// A captured value that is written with its [`Persist`] encoding.
pub struct PersistedFork<T>(pub T);

impl<T: Persist + Send> ForkedState for PersistedFork<T> {
    fn write_chunks(&self, out: &mut dyn StateChunks) -> io::Result<()> {
        let mut buf = Vec::new();
        self.0.persist(&mut buf);
        out.bytes(&buf)
    }
}

/// Bytes captured as they are (a source offset, encoded in-flight data).
pub struct RawBytes(pub Vec<u8>);

impl ForkedState for RawBytes {
    fn write_chunks(&self, out: &mut dyn StateChunks) -> io::Result<()> {
        out.bytes(&self.0)
    }
}

/// One part of a task's snapshot: the state of one operator in one subtask.
pub struct SnapshotPart {
    /// The operator's name.
    pub operator: Arc<str>,
    /// The subtask.
    pub subtask: usize,
    /// The captured state.
    pub state: Box<dyn ForkedState>,
}

/// Everything one task captured for one checkpoint, in chain order.
pub struct TaskSnapshot {
    /// The checkpoint.
    pub barrier: Barrier,
    /// The captured parts.
    pub parts: Vec<SnapshotPart>,
}

impl TaskSnapshot {
    /// An empty snapshot for `barrier`.
    pub fn new(barrier: Barrier) -> Self {
        TaskSnapshot { barrier, parts: Vec::new() }
    }
    /// Adds one operator's captured state.
    pub fn add(&mut self, operator: Arc<str>, subtask: usize, state: Box<dyn ForkedState>) {
        self.parts.push(SnapshotPart { operator, subtask, state });
    }
}

/// The state a restarted job reads back: operator state by (operator, subtask).
#[derive(Default, Debug)]
pub struct RestoredState {
    /// The checkpoint it came from.
    pub checkpoint: u64,
    parts: HashMap<(String, usize), Vec<u8>>,
}

impl RestoredState {
    /// An empty restore of checkpoint `checkpoint`.
    pub fn new(checkpoint: u64) -> Self {
        RestoredState { checkpoint, parts: HashMap::new() }
    }
    /// Adds one part.
    pub fn insert(&mut self, operator: String, subtask: usize, bytes: Vec<u8>) {
        self.parts.insert((operator, subtask), bytes);
    }
    /// The state of `operator` in `subtask`, if the checkpoint has one.
    pub fn get(&self, operator: &str, subtask: usize) -> Option<&[u8]> {
        self.parts.get(&(operator.to_string(), subtask)).map(Vec::as_slice)
    }
    /// Number of parts.
    pub fn len(&self) -> usize {
        self.parts.len()
    }
    /// Whether there are no parts.
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }
    /// Every subtask's part of `operator`, by subtask.
    pub fn parts_of(&self, operator: &str) -> Vec<(usize, &[u8])> {
        let mut parts: Vec<(usize, &[u8])> =
            self.parts.iter().filter(|((op, _), _)| op == operator).map(|((_, s), b)| (*s, b.as_slice())).collect();
        parts.sort_by_key(|(s, _)| *s);
        parts
    }

    /// How many subtasks `operator` had when the state was saved (0 if it has no state).
    pub fn saved_parallelism(&self, operator: &str) -> usize {
        self.parts.keys().filter(|(op, _)| op == operator).map(|(_, s)| s + 1).max().unwrap_or(0)
    }

    /// Keeps only the parts whose operator satisfies `keep`.
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.parts.retain(|(op, _), _| keep(op));
    }

    /// The operators that have state, with their subtasks.
    pub fn operators(&self) -> impl Iterator<Item = &(String, usize)> {
        self.parts.keys()
    }
}

/// Where a test wants a failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Fail `operator` (any subtask) when its `nth` record (counted over all subtasks and
    /// attempts, from 1) arrives.
    AtRecord {
        /// The operator's name.
        operator: String,
        /// Which record, counted over all subtasks and attempts.
        nth: u64,
    },
    /// Fail a task during the synchronous part of checkpoint `checkpoint`.
    SyncSnapshot {
        /// The checkpoint id.
        checkpoint: u64,
    },
    /// Fail the asynchronous write of checkpoint `checkpoint` (the task declines it).
    AsyncSnapshot {
        /// The checkpoint id.
        checkpoint: u64,
    },
    /// Make the coordinator decline checkpoint `checkpoint`.
    Decline {
        /// The checkpoint id.
        checkpoint: u64,
    },
    /// A storage error while a task writes its part of checkpoint `checkpoint`.
    StorageWrite {
        /// The checkpoint id.
        checkpoint: u64,
        /// What the storage says.
        error: StorageFault,
    },
    /// A storage error while the coordinator writes checkpoint `checkpoint`'s metadata.
    MetadataWrite {
        /// The checkpoint id.
        checkpoint: u64,
        /// What the storage says.
        error: StorageFault,
    },
    /// End the whole process (exit status 70) right after checkpoint `checkpoint`'s metadata
    /// is durable and before any sink hears that it completed: a crash between pre-commit
    /// and commit.
    ExitBeforeCommit {
        /// The checkpoint id.
        checkpoint: u64,
    },
}

/// What an injected storage failure looks like to the code that writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StorageFault {
    /// The disk is full (`ENOSPC`).
    DiskFull,
    /// The file or folder may not be written (`EACCES`).
    PermissionDenied,
    /// `fsync` failed (`EIO`): what was written may not be durable.
    FsyncFailed,
}

impl StorageFault {
    /// The I/O error the storage would return.
    pub fn to_io_error(self) -> io::Error {
        match self {
            StorageFault::DiskFull => io::Error::new(io::ErrorKind::StorageFull, "No space left on device (injected)"),
            StorageFault::PermissionDenied => {
                io::Error::new(io::ErrorKind::PermissionDenied, "Permission denied (injected)")
            }
            StorageFault::FsyncFailed => io::Error::other("fsync failed: Input/output error (injected)"),
        }
    }
}

/// One-shot failure points for tests: each fault fires once, then is spent.
#[derive(Default, Debug)]
pub struct FaultInjector {
    faults: Mutex<Vec<(Fault, bool)>>,
    /// Records seen per operator (for [`Fault::AtRecord`]).
    seen: Mutex<HashMap<String, Arc<AtomicU64>>>,
    fired: AtomicU64,
    armed: AtomicBool,
    /// A record fault already fired in this attempt: the next may fire only after a restart
    /// (two subtasks failing at once would otherwise spend two faults on one failover).
    record_fault_this_attempt: AtomicBool,
}

impl FaultInjector {
    /// Injects `faults`, each once.
    pub fn new(faults: Vec<Fault>) -> Arc<Self> {
        let armed = !faults.is_empty();
        Arc::new(FaultInjector {
            faults: Mutex::new(faults.into_iter().map(|f| (f, false)).collect()),
            armed: AtomicBool::new(armed),
            ..Default::default()
        })
    }

    /// A new attempt of the job starts (called by the runtime).
    pub fn new_attempt(&self) {
        self.record_fault_this_attempt.store(false, Ordering::SeqCst);
    }

    /// How many faults have fired.
    pub fn fired(&self) -> u64 {
        self.fired.load(Ordering::SeqCst)
    }

    fn fire_if(&self, mut matches: impl FnMut(&Fault) -> bool) -> bool {
        if !self.armed.load(Ordering::Relaxed) {
            return false;
        }
        let mut faults = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        for (f, spent) in faults.iter_mut() {
            if !*spent && matches(f) {
                *spent = true;
                self.fired.fetch_add(1, Ordering::SeqCst);
                return true;
            }
        }
        false
    }

    /// Whether the process should end after checkpoint `id`'s metadata (the coordinator asks).
    pub fn exit_before_commit(&self, id: u64) -> bool {
        self.fire_if(|f| *f == Fault::ExitBeforeCommit { checkpoint: id })
    }

    /// Counts `n` records arriving at `operator`; fails if a fault's record is among them.
    pub fn on_records(&self, operator: &str, n: usize) -> Result<()> {
        if !self.armed.load(Ordering::Relaxed) || n == 0 {
            return Ok(());
        }
        let counter = {
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            seen.entry(operator.to_string()).or_default().clone()
        };
        let after = counter.fetch_add(n as u64, Ordering::SeqCst) + n as u64;
        // One failure per batch; a fault whose record passed in the same batch as another's
        // fires with the next batch.
        if self.record_fault_this_attempt.load(Ordering::SeqCst) {
            return Ok(());
        }
        if self.fire_if(|f| matches!(f, Fault::AtRecord { operator: o, nth } if o == operator && *nth <= after)) {
            self.record_fault_this_attempt.store(true, Ordering::SeqCst);
            return Err(Error::OperatorPanicked {
                operator: operator.to_string(),
                subtask: 0,
                message: format!("injected failure at record {}", after),
            });
        }
        Ok(())
    }

    /// Whether the synchronous part of `checkpoint` should fail now.
    pub fn fail_sync(&self, checkpoint: u64) -> bool {
        self.fire_if(|f| *f == Fault::SyncSnapshot { checkpoint })
    }
    /// Whether the asynchronous part of `checkpoint` should fail now.
    pub fn fail_async(&self, checkpoint: u64) -> bool {
        self.fire_if(|f| *f == Fault::AsyncSnapshot { checkpoint })
    }
    /// Fires the first unspent fault `which` maps to a storage error, and returns the error.
    fn storage_error(&self, which: impl Fn(&Fault) -> Option<StorageFault>) -> Option<io::Error> {
        let mut error = None;
        self.fire_if(|f| {
            error = which(f);
            error.is_some()
        });
        error.map(StorageFault::to_io_error)
    }
    /// The storage error a task's write of `checkpoint` should meet now, if any.
    pub fn storage_write(&self, checkpoint: u64) -> Option<io::Error> {
        self.storage_error(|f| match f {
            Fault::StorageWrite { checkpoint: c, error } if *c == checkpoint => Some(*error),
            _ => None,
        })
    }
    /// The storage error the metadata write of `checkpoint` should meet now, if any.
    pub fn metadata_write(&self, checkpoint: u64) -> Option<io::Error> {
        self.storage_error(|f| match f {
            Fault::MetadataWrite { checkpoint: c, error } if *c == checkpoint => Some(*error),
            _ => None,
        })
    }
    /// Whether the coordinator should decline `checkpoint`.
    pub fn decline(&self, checkpoint: u64) -> bool {
        self.fire_if(|f| *f == Fault::Decline { checkpoint })
    }
}
