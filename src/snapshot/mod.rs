//! The vocabulary of checkpoints shared by channels, operators, sources, sinks and tasks:
//! [`Barrier`], [`TaskSnapshot`] (what one task captured for one checkpoint), [`ForkedState`]
//! (one operator's captured state, written later in the background), [`RestoredState`] (what
//! a restarted task reads back), and, re-exported from `faults`, the failure points of tests.
//!
//! The protocol is asynchronous barrier snapshotting (Carbone et al., "Lightweight
//! Asynchronous Snapshots for Distributed Dataflows", 2015), a variant of Chandy and Lamport's
//! distributed snapshots (1985).
//!
//! May touch: `error`, `faults`, `persist`.

mod lazy;
mod mode;

use std::collections::HashMap;
use std::io::{self, Write};
use std::sync::Arc;

use crate::persist::Persist;
pub(crate) use lazy::{
    next_stored_page, page_left_stored, pages_left_stored, restoring_lazily, split_with_stored_pages, stored_pages_left,
};
pub use lazy::{restore_lazily, PageSource, PlacedPages, StateFailure, StoredPage, StoredPages};
pub use mode::{CheckpointMode, ModeKeys, ModeKind, DEFAULT_ALIGNMENT_TIMEOUT, DEFAULT_INFLIGHT_BUDGET};

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
    /// A savepoint's barrier: always aligned, never switched to unaligned by the aligned-
    /// checkpoint timeout (a savepoint holds no in-flight data).
    pub savepoint: bool,
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
    ///
    /// It may be called more than once for one snapshot (a checkpoint that resumes a failed
    /// one compares the snapshot with the part kept before it writes), so whatever else it
    /// does (a sink's pre-commit) must happen once and hand on the same chunks each time.
    fn write_chunks(&self, out: &mut dyn StateChunks) -> io::Result<()>;

    /// The captured state itself, for an operator that can take it back as it is (local
    /// recovery: a fork of copy-on-write pages becomes the live state again without being
    /// encoded and decoded). `None`: the state is restored from its encoding.
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }

    /// Writes the whole encoding to `out`; returns the bytes written.
    fn write_to(&self, out: &mut dyn Write) -> io::Result<u64> {
        let mut all = Concatenated { out, written: 0 };
        self.write_chunks(&mut all)?;
        Ok(all.written)
    }
}

/// `fork`'s whole encoding, in memory.
pub(crate) fn encoded(fork: &dyn ForkedState) -> crate::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    fork.write_to(&mut bytes)
        .map_err(|e| crate::Error::Checkpoint(format!("cannot encode a state kept in memory: {e}")))?;
    Ok(bytes)
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

    /// Whether this receiver keeps a changelog ([`StateChunks::changes`]): changelog
    /// checkpoints, not a savepoint or a full checkpoint.
    fn changelog(&self) -> bool {
        false
    }

    /// Changelog checkpoints: state captured as the changes since an earlier capture. `id`
    /// names the changes since the capture whose changes were named `after` (0: none this
    /// extends); `segment` encodes them (only if this receiver stored the chain `after` ends
    /// and may extend it), `base` hands the whole state on, chunk by chunk (otherwise, or
    /// when the chain is due to start again: a materialization). Called only when
    /// [`StateChunks::changelog`] says so: a receiver that keeps no changelog refuses.
    fn changes(
        &mut self,
        _after: u64,
        _id: u64,
        _base: &mut dyn FnMut(&mut dyn StateChunks) -> io::Result<()>,
        _segment: &mut dyn FnMut(&mut Vec<u8>),
    ) -> io::Result<()> {
        Err(io::Error::other("this receiver of state keeps no changelog"))
    }
}

/// The mark that opens a changelog chain: a state written as a base and the segments of
/// changes after it ([`StateChunks::changes`]), each reading its own end.
const CHAIN_MARK: u64 = u64::MAX - 1;

/// The head of a chain of a base and `segments` segments (see [`chain_segments`]).
pub(crate) fn chain_head(segments: usize) -> Vec<u8> {
    let mut head = CHAIN_MARK.to_le_bytes().to_vec();
    head.extend((segments as u64).to_le_bytes());
    head
}

/// If `input` starts a chain, takes its head off and returns how many segments follow the
/// base; `Ok(None)` if it does not start one.
pub(crate) fn chain_segments(input: &mut &[u8]) -> crate::Result<Option<u64>> {
    if input.get(..8) != Some(&CHAIN_MARK.to_le_bytes()[..]) {
        return Ok(None);
    }
    let n = input.get(8..16).ok_or_else(|| crate::Error::Corrupt("a changelog chain ends in its head".into()))?;
    let n = u64::from_le_bytes(n.try_into().expect("8 bytes"));
    *input = &input[16..];
    // Each segment takes at least its three counts: a damaged count cannot run on. (In a
    // lazy restore each is a stored page.)
    let at_most = stored_pages_left().unwrap_or(input.len() as u64 / 24);
    if n > at_most {
        return Err(crate::Error::Corrupt(format!("a changelog chain says {n} segments in {} bytes", input.len())));
    }
    Ok(Some(n))
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
    /// Bytes of in-flight data among the parts (counted apart from state in the statistics).
    inflight_bytes: u64,
}

impl TaskSnapshot {
    /// An empty snapshot for `barrier`.
    pub fn new(barrier: Barrier) -> Self {
        TaskSnapshot { barrier, parts: Vec::new(), inflight_bytes: 0 }
    }
    /// Adds one operator's captured state.
    pub fn add(&mut self, operator: Arc<str>, subtask: usize, state: Box<dyn ForkedState>) {
        self.parts.push(SnapshotPart { operator, subtask, state });
    }
    /// Adds encoded in-flight data under `part` (a [`PartName::Inflight`] name).
    pub(crate) fn add_inflight(&mut self, part: Arc<str>, subtask: usize, bytes: Vec<u8>) {
        debug_assert!(PartName::parse(&part).is_inflight(), "{part} is not an in-flight part's name");
        self.inflight_bytes += bytes.len() as u64;
        self.add(part, subtask, Box::new(RawBytes(bytes)));
    }
    /// Bytes of in-flight data added so far.
    pub fn inflight_bytes(&self) -> u64 {
        self.inflight_bytes
    }
}

/// A fork kept in this process for local recovery and for a changelog base materialized in
/// the background, shared by whoever reads it (a fork need not be `Sync`: whoever reads it
/// holds the lock).
pub type SharedFork = Arc<std::sync::Mutex<Box<dyn ForkedState>>>;

/// One part of a restored state: its encoding, or (local recovery) the fork it was written
/// from, encoded only if something asks for the bytes.
struct RestoredPart {
    bytes: std::sync::OnceLock<Vec<u8>>,
    local: Option<SharedFork>,
    /// A lazy restore's part: its bytes without its pages of keyed state, and the pages, each
    /// with the offset in those bytes where it belongs.
    lazy: Option<(Vec<u8>, Box<PlacedPages>)>,
}

impl RestoredPart {
    fn bytes(&self) -> &[u8] {
        self.bytes.get_or_init(|| {
            if let Some((inline, pages)) = &self.lazy {
                return splice_pages(inline, pages);
            }
            let fork = self.local.as_ref().expect("a part has its bytes or its fork");
            // Only forks that hand themselves over are kept unencoded, and those encode into
            // memory without failing (`LocalCheckpoint::restored`).
            encoded(&**fork.lock().unwrap_or_else(|e| e.into_inner())).expect("a fork kept for local recovery encodes")
        })
    }
}

/// A lazy part's whole encoding: its pages read (and checked) into their places. Only a
/// restore that cannot take its pages lazily asks for it (a rescale); a page that fails to
/// read unwinds as the failure of a page read during processing does.
fn splice_pages(inline: &[u8], pages: &PlacedPages) -> Vec<u8> {
    let mut out = Vec::with_capacity(inline.len() + pages.iter().map(|(_, p)| p.len as usize).sum::<usize>());
    let mut from = 0;
    for (at, page) in pages {
        out.extend_from_slice(&inline[from..*at]);
        from = *at;
        let read = page.read().unwrap_or_else(|e| {
            std::panic::panic_any(StateFailure(crate::Error::io(
                "cannot read a page of keyed state from its checkpoint file",
                page.source.path(),
                e,
            )))
        });
        out.extend_from_slice(&read);
    }
    out.extend_from_slice(&inline[from..]);
    out
}

impl std::fmt::Debug for RestoredPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.bytes.get() {
            Some(b) => write!(f, "{} bytes", b.len()),
            None => f.write_str("a fork in memory"),
        }
    }
}

/// The state a restarted job reads back: operator state by (operator, subtask).
#[derive(Default, Debug)]
pub struct RestoredState {
    /// The checkpoint it came from.
    pub checkpoint: u64,
    parts: HashMap<(String, usize), RestoredPart>,
    /// Saved by another graph (a savepoint or checkpoint restored into a rescaled or changed
    /// job): in-flight data is re-routed, not replayed where it was.
    graph_changed: bool,
    /// This process's copy of the checkpoint (local recovery), not read from its files.
    from_memory: bool,
}

impl RestoredState {
    /// An empty restore of checkpoint `checkpoint`.
    pub fn new(checkpoint: u64) -> Self {
        RestoredState { checkpoint, parts: HashMap::new(), graph_changed: false, from_memory: false }
    }
    /// Marks the state as saved by another graph than the one restoring it.
    pub(crate) fn set_graph_changed(&mut self) {
        self.graph_changed = true;
    }
    /// Whether the state was saved by another graph (see `RestoredState::set_graph_changed`).
    pub fn graph_changed(&self) -> bool {
        self.graph_changed
    }
    /// Adds one part.
    pub fn insert(&mut self, operator: String, subtask: usize, bytes: Vec<u8>) {
        self.parts.insert((operator, subtask), RestoredPart { bytes: bytes.into(), local: None, lazy: None });
    }
    /// Adds one part read lazily: its bytes without its pages of keyed state (`inline`), and
    /// the pages with where in those bytes each belongs.
    pub(crate) fn insert_lazy(
        &mut self,
        operator: String,
        subtask: usize,
        inline: Vec<u8>,
        pages: Vec<(usize, StoredPage)>,
    ) {
        let part = match pages.is_empty() {
            true => RestoredPart { bytes: inline.into(), local: None, lazy: None },
            false => {
                RestoredPart { bytes: Default::default(), local: None, lazy: Some((inline, pages.into_boxed_slice())) }
            }
        };
        self.parts.insert((operator, subtask), part);
    }
    /// The state of `operator` in `subtask` as a lazy restore takes it: its bytes without its
    /// pages of keyed state, and the pages (`None` when the part was not read lazily).
    pub(crate) fn lazy(&self, operator: &str, subtask: usize) -> Option<(&[u8], &PlacedPages)> {
        let (inline, pages) = self.parts.get(&(operator.to_string(), subtask))?.lazy.as_ref()?;
        Some((inline, pages))
    }
    /// Adds one part as the fork it was captured as (local recovery).
    pub(crate) fn insert_local(&mut self, operator: String, subtask: usize, fork: SharedFork) {
        self.parts
            .insert((operator, subtask), RestoredPart { bytes: Default::default(), local: Some(fork), lazy: None });
    }
    /// The state of `operator` in `subtask`, if the checkpoint has one.
    pub fn get(&self, operator: &str, subtask: usize) -> Option<&[u8]> {
        self.parts.get(&(operator.to_string(), subtask)).map(RestoredPart::bytes)
    }
    /// The fork `operator`'s state in `subtask` was captured as, when it was restored from
    /// this process's memory.
    pub(crate) fn local(&self, operator: &str, subtask: usize) -> Option<SharedFork> {
        self.parts.get(&(operator.to_string(), subtask))?.local.clone()
    }
    /// Whether the state came from this process's memory (local recovery), not from files.
    pub fn from_memory(&self) -> bool {
        self.from_memory
    }
    /// Marks the state as this process's copy of the checkpoint (local recovery).
    pub(crate) fn set_from_memory(&mut self) {
        self.from_memory = true;
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
            self.parts.iter().filter(|((op, _), _)| op == operator).map(|((_, s), b)| (*s, b.bytes())).collect();
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

/// Failure points for tests (with the `testing` feature; without it, one that never fires).
pub use crate::faults::FaultInjector;
/// The name under which one part of a task's snapshot is stored: an operator's state, or
/// the in-flight data of one input of a task (unaligned checkpoints). Operator names never
/// hold `#` (the plan refuses them), so a stored name parses back to what it was.
///
/// ```
/// use weir::snapshot::PartName;
/// let part = PartName::Inflight { operator: "join".into(), input: 1 };
/// assert_eq!(PartName::parse(&part.to_string()), part);
/// assert_eq!(PartName::parse("count"), PartName::State("count".into()));
/// assert_eq!(part.operator(), "join");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PartName {
    /// The state of the operator so named.
    State(String),
    /// The in-flight data of input `input` (0, or 1 for a two-input operator's right input)
    /// of the task whose head is `operator`.
    Inflight {
        /// The operator at the head of the task.
        operator: String,
        /// Which input.
        input: usize,
    },
}

/// What separates an operator's name from the kind of part in a stored name.
pub(crate) const PART_SEPARATOR: char = '#';

impl PartName {
    /// The name as stored.
    pub fn parse(name: &str) -> PartName {
        let inflight = name.split_once(PART_SEPARATOR).and_then(|(op, kind)| {
            let input = kind.strip_prefix("inflight")?.parse().ok()?;
            Some(PartName::Inflight { operator: op.to_string(), input })
        });
        inflight.unwrap_or_else(|| PartName::State(name.to_string()))
    }

    /// The operator the part belongs to.
    pub fn operator(&self) -> &str {
        match self {
            PartName::State(op) | PartName::Inflight { operator: op, .. } => op,
        }
    }

    /// Whether the part is in-flight data.
    pub fn is_inflight(&self) -> bool {
        matches!(self, PartName::Inflight { .. })
    }
}

impl std::fmt::Display for PartName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PartName::State(op) => f.write_str(op),
            PartName::Inflight { operator, input } => write!(f, "{operator}{PART_SEPARATOR}inflight{input}"),
        }
    }
}

#[cfg(feature = "testing")]
pub use crate::faults::{Fault, StorageFault};

// Their fields are closures, shared internals or whole state: a name says enough.
crate::debug_as_name!([T] PersistedFork<T>);
crate::debug_as_name!([] RawBytes);
crate::debug_as_name!([] SnapshotPart);
crate::debug_as_name!([] TaskSnapshot);
