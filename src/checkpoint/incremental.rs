//! Which bytes a task's checkpoint writes and which it refers to: the [`PageIndex`] remembers
//! where the pages of the last completed checkpoint lie, and [`write_task_snapshot`] turns a
//! [`TaskSnapshot`] into a task file, writing only pages whose version that index lacks (all
//! of them when checkpoints are full).
//!
//! Compaction: a checkpoint stops referring to a shared file whose pages the last one referred
//! to are under half its bytes ([`COMPACT_BELOW_LIVE`]), or, once a task's checkpoint would
//! refer to more than [`MAX_SHARED_FILES`] files, to those holding the fewest of its bytes:
//! their pages are written again, from memory, into its own file, and retention deletes the
//! old file once no retained checkpoint names it. So what a checkpoint refers to stays within
//! twice its state and a bounded number of files, however long the chain runs.
//!
//! Changelog checkpoints ([`PageIndex::changelog`]): a map goes as the changes since the last
//! checkpoint (a segment) appended to the chain of a base and the segments after it. Once a
//! chain is due for a new base, the checkpoint still only appends its segment, and the base is
//! materialized in the background ([`materialize`]) from the state that checkpoint captured,
//! read back whole, and adopted by the first checkpoint after it is durable: its chain is the
//! new base and the segments after the capture. Only a chain that cannot be extended (a
//! restart, a failed checkpoint's hole, a grown map) or whose materialization fell twice
//! behind writes its base in the checkpoint itself.
//!
//! The index of a task moves forward only on a completion notice: a checkpoint in progress or
//! aborted never becomes a reference, so every reference points into a file that a completed
//! (and so retained, until a newer one completes) checkpoint names — or that a failed
//! checkpoint whose part the coordinator kept names (`PageIndex::keep`): the coordinator keeps
//! those files until a later checkpoint completes, and keeps what that one refers to.
//!
//! May touch: `checkpoint::storage`, `checkpoint::resume`, `error`, `prng`, `snapshot`,
//! `state`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::sync::{Arc, Mutex};

use super::resume::TaskPrint;
use super::storage::{CheckpointStorage, ChecksummedWriter, FileDigest, SharedFile, StoredChunk, TaskFileContent};
use crate::error::{Error, Result};
use crate::snapshot::{CheckpointNotice, StateChunks, TaskSnapshot};

/// Where a page's encoding is stored: a byte range of a shared file.
#[derive(Clone, Debug, PartialEq, Eq)]
struct PageRef {
    file: Arc<str>,
    offset: u64,
    len: u64,
    /// The encoding's CRC-32C (a lazy restore checks the page alone).
    crc: u32,
}

/// Where the pages of one checkpoint lie, by page version, and the digests of the shared files
/// they lie in (for `_metadata`).
#[derive(Default)]
struct PageLocations {
    pages: HashMap<u64, PageRef>,
    files: HashMap<Arc<str>, FileDigest>,
    /// Changelog checkpoints: by the id of a chain's newest part (its newest segment's, or
    /// its base's), the chain.
    chains: HashMap<u64, Arc<Chain>>,
}

/// A changelog chain as stored: its base and the segments after it, by version (each stored
/// as a page). The chains extending one base share it.
struct Chain {
    base: Arc<ChainBase>,
    segments: Vec<u64>,
}

/// A chain's base: the image's head, then its pages by version.
struct ChainBase {
    head: Vec<u8>,
    pages: Vec<u64>,
}

/// A base materialized in the background from the state one checkpoint captured, until a
/// checkpoint's chain adopts it.
struct Materialized {
    base: Arc<ChainBase>,
    /// Where its pages lie: in its own file, or in files stored before.
    pages: HashMap<u64, PageRef>,
    /// Its own file (none when every page was stored before) and that file's digest.
    file: Option<(Arc<str>, FileDigest)>,
    /// That file on disk, removed when the base is forgotten and no checkpoint adopted it.
    path: std::path::PathBuf,
    /// [`OPEN`], then [`ADOPTED`] (by a checkpoint being written) or [`REMOVED`] (its file,
    /// by the index), whichever comes first: a base is never adopted after its file went.
    fate: Arc<std::sync::atomic::AtomicU8>,
}

const OPEN: u8 = 0;
const ADOPTED: u8 = 1;
const REMOVED: u8 = 2;

impl Materialized {
    /// Adopts it for a checkpoint being written, if it may be: every file it refers to is its
    /// own or one the last checkpoint refers to (so retained until this one completes, and
    /// then kept by it), and its file was not removed first. Returns whether it was adopted.
    fn adopt(&self, known: &Known) -> bool {
        let own = self.file.as_ref().map(|f| &f.0);
        self.pages.values().all(|r| Some(&r.file) == own || known.file(&r.file).is_some())
            && self.settle(ADOPTED) != REMOVED
    }

    /// Moves an open base to `fate`; returns the fate it has now.
    fn settle(&self, fate: u8) -> u8 {
        use std::sync::atomic::Ordering::SeqCst;
        self.fate.compare_exchange(OPEN, fate, SeqCst, SeqCst).map_or_else(|now| now, |_| fate)
    }
}

/// Passes a base's chunks on to the task file, noting its head and its pages' versions.
struct RecordingBase<'a, 'b> {
    inner: &'a mut TaskFileBuilder<'b>,
    head: Vec<u8>,
    pages: Vec<u64>,
}

impl StateChunks for RecordingBase<'_, '_> {
    fn bytes(&mut self, bytes: &[u8]) -> io::Result<()> {
        assert!(self.pages.is_empty(), "a base's head comes before its pages");
        self.head.extend_from_slice(bytes);
        self.inner.bytes(bytes)
    }
    fn page(&mut self, version: u64, encode: &mut dyn FnMut(&mut Vec<u8>)) -> io::Result<u64> {
        self.pages.push(version);
        self.inner.page(version, encode)
    }
}

/// One task's memory of where its pages are stored, by page version. The runtime keeps one
/// per task when checkpoints are incremental; it is public for tools that write snapshots
/// themselves (benchmarks, tests).
#[derive(Default)]
pub struct PageIndex {
    inner: Mutex<PageIndexInner>,
    /// Changelog checkpoints: the segments after which a new base is written.
    changelog: Option<u32>,
    /// The checkpoint directory and the job's fingerprint, once pages are to be read from
    /// its files ([`PageIndex::read_from`]), and the files opened for that.
    directory: std::sync::OnceLock<(std::path::PathBuf, String)>,
    sources: Mutex<HashMap<Arc<str>, Arc<dyn crate::snapshot::PageSource>>>,
}

#[derive(Default)]
struct PageIndexInner {
    /// The pages of the newest checkpoint completed.
    completed: Arc<PageLocations>,
    /// The pages of checkpoints written here and not yet completed, by checkpoint id.
    pending: BTreeMap<u64, Arc<PageLocations>>,
    /// The pages of this task's part of a failed checkpoint that the coordinator kept: the
    /// next checkpoints refer to them too, until one completes.
    kept: Option<(u64, Arc<PageLocations>)>,
    /// Changelog: maps (by the id of the changes their fork captured) whose base is being
    /// materialized in the background, and the bases materialized, by the same id.
    materializing: HashSet<u64>,
    materialized: HashMap<u64, Arc<Materialized>>,
}

impl PageIndexInner {
    /// Forgets the bases no chain written here can adopt any more (a chain adopts a base of
    /// a capture among its segments).
    fn prune_materialized(&mut self) {
        let chains = self.completed.chains.values().chain(self.pending.values().flat_map(|p| p.chains.values()));
        let chains = chains.chain(self.kept.iter().flat_map(|k| k.1.chains.values()));
        let live: HashSet<u64> = chains.flat_map(|c| c.segments.iter().copied()).collect();
        let mut gone = Vec::new();
        self.materialized.retain(|f, m| {
            let keep = live.contains(f);
            if !keep && m.file.is_some() {
                gone.push(Arc::clone(m));
            }
            keep
        });
        for m in gone {
            // No checkpoint adopted it (it came too late for its chain) nor may one still
            // adopt another base in its file: it goes. (Adopted only by checkpoints that
            // failed, it stays until a new process's start removes what nothing names.)
            if !self.materialized.values().any(|o| o.path == m.path) && m.settle(REMOVED) == REMOVED {
                let _ = std::fs::remove_file(&m.path);
            }
        }
    }
}

/// A shared file is compacted when the pages the last checkpoint referred to in it are under
/// this share of its bytes.
pub const COMPACT_BELOW_LIVE: f64 = 0.5;
/// The most shared files one task's part of a checkpoint refers to; beyond them, the files
/// holding the fewest of its bytes are compacted.
pub const MAX_SHARED_FILES: usize = 64;

/// The pages a checkpoint may refer to: the last completed one's, and a kept part's.
#[derive(Default)]
struct Known {
    completed: Arc<PageLocations>,
    kept: Option<Arc<PageLocations>>,
    materializing: HashSet<u64>,
    materialized: HashMap<u64, Arc<Materialized>>,
}

impl Known {
    /// The shared files this checkpoint stops referring to (see the module doc): by the
    /// bytes the known pages hold in each.
    fn to_compact(&self) -> HashSet<Arc<str>> {
        let mut live: HashMap<&Arc<str>, u64> = HashMap::new();
        let pages = self.completed.pages.values().chain(self.kept.iter().flat_map(|k| k.pages.values()));
        for r in pages {
            *live.entry(&r.file).or_default() += r.len;
        }
        let mut files: Vec<(u64, &Arc<str>)> = live.into_iter().map(|(f, b)| (b, f)).collect();
        // Fewest live bytes first; ties by name, so every run decides alike.
        files.sort_unstable();
        let over = files.len().saturating_sub(MAX_SHARED_FILES);
        files
            .iter()
            .enumerate()
            .filter(|(i, (bytes, f))| {
                let size = self.file(f).map_or(0, |d| d.bytes);
                *i < over || (*bytes as f64) < COMPACT_BELOW_LIVE * size as f64
            })
            .map(|(_, (_, f))| Arc::clone(*f))
            .collect()
    }

    fn page(&self, version: u64) -> Option<&PageRef> {
        self.completed.pages.get(&version).or_else(|| self.kept.as_ref()?.pages.get(&version))
    }

    fn file(&self, name: &str) -> Option<&FileDigest> {
        self.completed.files.get(name).or_else(|| self.kept.as_ref()?.files.get(name))
    }

    fn chain(&self, newest: u64) -> Option<&Arc<Chain>> {
        self.completed.chains.get(&newest).or_else(|| self.kept.as_ref()?.chains.get(&newest))
    }
}

impl PageIndex {
    /// The index of a task whose checkpoints are changelog ones: keyed state goes as the
    /// changes since the last checkpoint, and a new base after `materialize_every` of them.
    pub fn changelog(materialize_every: u32) -> Self {
        assert!(materialize_every >= 1, "a base is written after at least one segment");
        PageIndex { changelog: Some(materialize_every), ..Default::default() }
    }

    /// Pages are read from the files of the checkpoint directory at `root`, of the job with
    /// `fingerprint` ([`crate::snapshot::StoredPages`]).
    pub(crate) fn read_from(&self, root: &std::path::Path, fingerprint: &str) {
        let _ = self.directory.set((root.to_path_buf(), fingerprint.to_string()));
    }

    /// Whether checkpoints are changelogs (chains of a base and segments).
    pub(crate) fn is_changelog(&self) -> bool {
        self.changelog.is_some()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PageIndexInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn known(&self) -> Known {
        let inner = self.lock();
        Known {
            completed: Arc::clone(&inner.completed),
            kept: inner.kept.as_ref().map(|k| Arc::clone(&k.1)),
            materializing: inner.materializing.clone(),
            materialized: inner.materialized.clone(),
        }
    }

    /// The bases of `forks` are to be materialized in the background (see [`materialize`]).
    fn materializing(&self, forks: &[u64]) {
        self.lock().materializing.extend(forks);
    }

    /// The materialization of `maps` was not queued (the writer is full): a later checkpoint
    /// asks again.
    pub(crate) fn materialization_dropped(&self, maps: &[u64]) {
        self.materialized(maps, None);
    }

    /// The materialization of `forks` ended: with their bases, or (`None`) without.
    fn materialized(&self, forks: &[u64], bases: Option<HashMap<u64, Materialized>>) {
        let mut inner = self.lock();
        for f in forks {
            inner.materializing.remove(f);
        }
        inner.materialized.extend(bases.into_iter().flatten().map(|(f, m)| (f, Arc::new(m))));
        inner.prune_materialized();
    }

    /// The coordinator kept this task's part of failed checkpoint `id`: its pages stay
    /// references until a later checkpoint completes.
    pub(crate) fn keep(&self, id: u64) {
        let mut inner = self.lock();
        inner.kept = inner.pending.get(&id).cloned().map(|pages| (id, pages));
    }

    /// Checkpoint `id` reused the kept part: its pages are the kept part's.
    pub(crate) fn reused(&self, id: u64) {
        let mut inner = self.lock();
        if let Some((_, pages)) = inner.kept.clone() {
            inner.pending.insert(id, pages);
        }
    }

    /// A task restored lazily left `pages` where the checkpoint it restored stored them, by
    /// the version each has in its map: the next checkpoint refers to those unchanged since,
    /// as it would to a completed checkpoint's (so it neither reads them back nor writes them
    /// again).
    pub(crate) fn seed(&self, pages: Vec<(u64, crate::snapshot::StoredPage)>) {
        let mut locations = PageLocations::default();
        for (version, page) in pages {
            let (name, bytes, crc32c) = page.source.stored_as();
            let file: Arc<str> = name.into();
            locations.files.entry(Arc::clone(&file)).or_insert(FileDigest { bytes, crc32c });
            locations.pages.insert(version, PageRef { file, offset: page.offset, len: page.len.into(), crc: page.crc });
        }
        self.lock().completed = Arc::new(locations);
    }

    fn written(&self, id: u64, pages: PageLocations) {
        self.lock().pending.insert(id, Arc::new(pages));
    }

    /// A checkpoint completed (its pages become the references of the next one) or was
    /// aborted (its pages are forgotten).
    pub fn on_notice(&self, notice: CheckpointNotice) {
        let mut inner = self.lock();
        match notice {
            CheckpointNotice::Complete(id) => {
                if let Some(pages) = inner.pending.remove(&id) {
                    inner.completed = pages;
                }
                inner.pending = inner.pending.split_off(&id);
                if inner.kept.as_ref().is_some_and(|k| k.0 <= id) {
                    inner.kept = None;
                }
            }
            CheckpointNotice::Aborted(id) => {
                inner.pending.remove(&id);
                // The coordinator keeps the newest failed checkpoint's parts only (see
                // `TaskParts::on_notice`).
                if inner.kept.as_ref().is_some_and(|k| k.0 < id) {
                    inner.kept = None;
                }
            }
        }
        inner.prune_materialized();
    }
}

/// A page unchanged since the newest completed checkpoint stored it lies in that checkpoint's
/// file: a bounded map that sends it out of memory reads it back from there. (Not with
/// changelogs: a chain's pages are read through its base and segments.) A file is opened once
/// and kept open while the completed checkpoint refers to it, so retention removing it later
/// leaves it readable.
impl crate::snapshot::StoredPages for PageIndex {
    fn stored(&self, version: u64) -> Option<crate::snapshot::StoredPage> {
        let (root, fingerprint) = self.directory.get().filter(|_| self.changelog.is_none())?;
        let completed = Arc::clone(&self.lock().completed);
        let r = completed.pages.get(&version)?;
        let mut sources = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        let source = match sources.get(&r.file) {
            Some(s) => Arc::clone(s),
            None => {
                let digest = completed.files.get(&r.file)?;
                let opened = super::storage::open_stored(root, &r.file, fingerprint, digest).ok()?;
                sources.retain(|f, _| completed.files.contains_key(f));
                sources.insert(Arc::clone(&r.file), Arc::clone(&opened));
                opened
            }
        };
        Some(crate::snapshot::StoredPage { source, offset: r.offset, len: u32::try_from(r.len).ok()?, crc: r.crc })
    }
}

/// Builds the chunks of one task file.
struct TaskFileBuilder<'a> {
    storage: &'a CheckpointStorage,
    id: u64,
    task: usize,
    /// References to pages stored earlier; `None` writes everything inline (full checkpoints).
    known: Option<Known>,
    /// Shared files whose pages are written again rather than referred to (compaction).
    compacted: HashSet<Arc<str>>,
    /// Changelog checkpoints (not a full one, nor a savepoint): segments after which a new
    /// base is written.
    changelog: Option<u32>,
    /// Maps (by the id of their changes) whose base is due: materialized in the background
    /// after this checkpoint is written.
    materialize: Vec<u64>,
    /// A materialization ([`materialize`]): only these maps' bases are written, nothing else.
    materializing: Option<HashSet<u64>>,
    /// Whether a materialization is to stop (the task's attempt ended).
    cancelled: &'a dyn Fn() -> bool,
    /// This checkpoint's own shared file (pages written now), opened at the first new page.
    own_file: Arc<str>,
    new_pages: Option<ChecksummedWriter>,
    scratch: Vec<u8>,
    content: TaskFileContent,
    file_index: HashMap<Arc<str>, u32>,
    /// Where each page of this checkpoint lies.
    pages: PageLocations,
    chunks: Vec<StoredChunk>,
    state_bytes: u64,
    written_bytes: u64,
    print: TaskPrint,
}

impl TaskFileBuilder<'_> {
    /// Checkpoint `id`'s state as a new chain: a base, the state's image.
    fn new_base(&mut self, id: u64, base: &mut dyn FnMut(&mut dyn StateChunks) -> io::Result<()>) -> io::Result<()> {
        let base = self.write_base(base)?;
        self.pages.chains.insert(id, Arc::new(Chain { base: Arc::new(base), segments: Vec::new() }));
        Ok(())
    }

    /// Checkpoint `id`'s state as the chain on `chain_base` (an `adopted` materialized base's,
    /// or the last chain's with its `base_parts`), the `kept` segments and one more: `segment`.
    fn extend_chain(
        &mut self,
        id: u64,
        chain_base: Arc<ChainBase>,
        adopted: Option<&Materialized>,
        base_parts: &[(u64, PageRef)],
        kept: &[(u64, PageRef)],
        segment: &mut dyn FnMut(&mut Vec<u8>),
    ) -> io::Result<()> {
        self.bytes(&crate::snapshot::chain_head(kept.len() + 1))?;
        self.bytes(&chain_base.head)?;
        match adopted {
            Some(m) => {
                for v in &m.base.pages {
                    self.stored(*v, m.pages[v].clone());
                }
                if let Some((name, digest)) = &m.file {
                    self.pages.files.insert(Arc::clone(name), *digest);
                }
            }
            None => {
                for (v, r) in base_parts {
                    self.stored(*v, r.clone());
                }
            }
        }
        for (v, r) in kept {
            self.stored(*v, r.clone());
        }
        self.page(id, segment)?;
        let segments = kept.iter().map(|(v, _)| *v).chain([id]).collect();
        self.pages.chains.insert(id, Arc::new(Chain { base: chain_base, segments }));
        Ok(())
    }

    fn push_ref(&mut self, r: &PageRef) {
        if r.len == 0 {
            return;
        }
        let next = self.content.shared.len() as u32;
        let file = *self.file_index.entry(Arc::clone(&r.file)).or_insert(next);
        if file == next {
            self.content.shared.push(r.file.to_string());
        }
        // A page apiece (not ranges merged): a lazy restore reads and checks each alone.
        let len = u32::try_from(r.len).expect("a page's encoding is under 4 GiB");
        self.chunks.push(StoredChunk::Page { file, offset: r.offset, len, crc: r.crc });
    }

    fn inline(&mut self) -> &mut Vec<u8> {
        if !matches!(self.chunks.last(), Some(StoredChunk::Inline(_))) {
            self.chunks.push(StoredChunk::Inline(Vec::new()));
        }
        match self.chunks.last_mut() {
            Some(StoredChunk::Inline(b)) => b,
            _ => unreachable!("an inline chunk was just ensured"),
        }
    }
}

impl StateChunks for TaskFileBuilder<'_> {
    fn changelog(&self) -> bool {
        self.changelog.is_some()
    }

    fn changes(
        &mut self,
        after: u64,
        id: u64,
        base: &mut dyn FnMut(&mut dyn StateChunks) -> io::Result<()>,
        segment: &mut dyn FnMut(&mut Vec<u8>),
    ) -> io::Result<()> {
        if let Some(wanted) = &self.materializing {
            if wanted.contains(&id) {
                self.new_base(id, base)?;
            }
            return Ok(());
        }
        let most = self.changelog.unwrap_or(1) as usize;
        // The chain the last checkpoint stored for the state as it was at `after`, if every
        // part of it can still be referred to.
        // (A live chain's files wait for its next base to be compacted: its parts cannot be
        // written again from this fork.)
        let known = self.known.as_ref();
        let chain = known.and_then(|k| {
            let c = k.chain(after)?;
            let parts: Vec<(u64, PageRef)> = c
                .base
                .pages
                .iter()
                .chain(&c.segments)
                .map(|&v| Some((v, k.page(v)?.clone())))
                .collect::<Option<_>>()?;
            Some((Arc::clone(c), parts))
        });
        let Some((c, parts)) = chain else {
            // A new base, now: the state's image.
            return self.new_base(id, base);
        };
        let known = known.expect("a chain is known");
        let (base_parts, segment_parts) = parts.split_at(c.base.pages.len());
        // The newest base materialized from a capture among the chain's segments, if it can be
        // adopted: the chain is then that base and the segments after its capture.
        let adopt = c.segments.iter().enumerate().rev().find_map(|(i, s)| {
            let m = known.materialized.get(s).filter(|m| m.adopt(known))?;
            Some((Arc::clone(m), i + 1))
        });
        let (chain_base, kept) = match &adopt {
            Some((m, from)) => (Arc::clone(&m.base), &segment_parts[*from..]),
            None => (Arc::clone(&c.base), segment_parts),
        };
        // Due for a new base after `most` segments, or once its segments hold as many bytes
        // as its base's pages (a restore then reads at most about twice the state, and a job
        // that changes every key between checkpoints writes bases, not segments as large).
        // The base is materialized in the background; a chain twice past due gets one now:
        // by its segments' bytes always (what a restore reads), by their count only when no
        // materialization is underway (it failed; a slow one is waited for rather than
        // written twice).
        let bytes = |refs: &[(u64, PageRef)]| refs.iter().map(|(_, r)| r.len).sum::<u64>();
        let (n, seg_bytes, base_bytes) = match &adopt {
            Some((m, _)) => (kept.len(), bytes(kept), m.pages.values().map(|r| r.len).sum::<u64>()),
            None => (kept.len(), bytes(kept), bytes(base_parts)),
        };
        let underway = c.segments.iter().any(|s| known.materializing.contains(s) || known.materialized.contains_key(s));
        if (n >= 2 * most && !underway) || seg_bytes >= 2 * base_bytes.max(1) {
            return self.new_base(id, base);
        }
        let due = n + 1 >= most || seg_bytes >= base_bytes;
        if due && adopt.is_none() && !underway {
            self.materialize.push(id);
        }
        self.extend_chain(id, chain_base, adopt.as_ref().map(|(m, _)| m.as_ref()), base_parts, kept, segment)
    }

    fn bytes(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.print.bytes(bytes);
        self.inline().extend_from_slice(bytes);
        self.state_bytes += bytes.len() as u64;
        self.written_bytes += bytes.len() as u64;
        Ok(())
    }

    fn page(&mut self, version: u64, encode: &mut dyn FnMut(&mut Vec<u8>)) -> io::Result<u64> {
        let Some(known) = &self.known else {
            let buf = self.inline();
            let before = buf.len();
            encode(buf);
            let n = (buf.len() - before) as u64;
            self.state_bytes += n;
            self.written_bytes += n;
            self.print.page(version, n);
            return Ok(n);
        };
        let r = match known.page(version).filter(|r| !self.compacted.contains(&r.file)) {
            Some(r) => r.clone(),
            None => {
                if (self.cancelled)() {
                    return Err(io::Error::other("the task's attempt ended"));
                }
                if self.new_pages.is_none() {
                    self.new_pages = Some(self.storage.create_shared_named(&self.own_file, self.id, self.task)?);
                }
                let out = self.new_pages.as_mut().expect("opened above");
                self.scratch.clear();
                encode(&mut self.scratch);
                let (offset, len) = (out.position(), self.scratch.len() as u64);
                out.write(&self.scratch)?;
                self.written_bytes += len;
                PageRef { file: Arc::clone(&self.own_file), offset, len, crc: crc32c::crc32c(&self.scratch) }
            }
        };
        Ok(self.stored(version, r))
    }
}

impl<'a> TaskFileBuilder<'a> {
    /// A builder of task `task`'s file of checkpoint `id` whose new pages go into `own_file`,
    /// referring to the `known` pages (none: every byte inline).
    fn new(storage: &'a CheckpointStorage, (id, task): (u64, usize), known: Option<Known>, own_file: Arc<str>) -> Self {
        TaskFileBuilder {
            storage,
            id,
            task,
            changelog: None,
            materialize: Vec::new(),
            materializing: None,
            cancelled: &|| false,
            compacted: known.as_ref().map(Known::to_compact).unwrap_or_default(),
            known,
            own_file,
            new_pages: None,
            scratch: Vec::new(),
            content: TaskFileContent::default(),
            file_index: HashMap::new(),
            pages: PageLocations::default(),
            chunks: Vec::new(),
            state_bytes: 0,
            written_bytes: 0,
            print: TaskPrint::default(),
        }
    }

    /// Writes a base: the state's image, page by page (pages stored before are referred to,
    /// as in an incremental checkpoint).
    fn write_base(&mut self, base: &mut dyn FnMut(&mut dyn StateChunks) -> io::Result<()>) -> io::Result<ChainBase> {
        self.bytes(&crate::snapshot::chain_head(0))?;
        let mut recording = RecordingBase { inner: self, head: Vec::new(), pages: Vec::new() };
        base(&mut recording)?;
        Ok(ChainBase { head: recording.head, pages: recording.pages })
    }

    /// Page `version` is at `r`: referred to from the task file and remembered.
    fn stored(&mut self, version: u64, r: PageRef) -> u64 {
        self.state_bytes += r.len;
        self.print.page(version, r.len);
        self.push_ref(&r);
        let len = r.len;
        self.pages.pages.insert(version, r);
        len
    }
}

/// What writing one task's part of a checkpoint produced.
#[derive(Debug)]
pub struct TaskFileWritten {
    /// The task file, relative to the checkpoint's folder.
    pub file: String,
    /// Its length and checksum.
    pub file_digest: FileDigest,
    /// Bytes of the whole state.
    pub state_bytes: u64,
    /// Bytes of state written now (all of it for a full checkpoint).
    pub written_bytes: u64,
    /// The shared files the task file refers to.
    pub shared: Vec<SharedFile>,
    /// What it holds, to tell whether a later snapshot holds the same.
    pub(crate) print: TaskPrint,
    /// Changelog: the maps (by the id of their changes) whose base is due, to be written by
    /// [`materialize`] from this snapshot in the background.
    pub materialize: Vec<u64>,
}

/// Writes task `task`'s part of checkpoint `snapshot.barrier.id`: with an `index`
/// (incremental checkpoints), pages the last completed checkpoint stored are referred to and
/// only the others are written, to this checkpoint's shared file; without one, every byte
/// goes into the task file.
pub fn write_task_snapshot(
    storage: &CheckpointStorage,
    index: Option<&PageIndex>,
    task: usize,
    snapshot: &TaskSnapshot,
) -> Result<TaskFileWritten> {
    write_task_file(storage, index, task, snapshot, false)
}

/// [`write_task_snapshot`], or with `full` and an `index`, every page written to this
/// checkpoint's shared file and nothing referred to in earlier ones (a full checkpoint of an
/// incremental job: the next ones refer to it).
pub(crate) fn write_task_file(
    storage: &CheckpointStorage,
    index: Option<&PageIndex>,
    task: usize,
    snapshot: &TaskSnapshot,
    full: bool,
) -> Result<TaskFileWritten> {
    let id = snapshot.barrier.id;
    let known = index.map(|i| if full { Known::default() } else { i.known() });
    // A savepoint is always whole and canonical; so is a full checkpoint.
    let changelog = index.and_then(|i| i.changelog).filter(|_| !full && !snapshot.barrier.savepoint);
    let mut b = TaskFileBuilder::new(storage, (id, task), known, CheckpointStorage::shared_name(id, task).into());
    b.changelog = changelog;
    for p in &snapshot.parts {
        b.print.start(&p.operator, p.subtask);
        p.state.write_chunks(&mut b).map_err(|e| {
            Error::Checkpoint(format!("cannot write the state of {} subtask {}: {e}", p.operator, p.subtask))
        })?;
        let chunks = std::mem::take(&mut b.chunks);
        b.content.parts.push((p.operator.to_string(), p.subtask as u64, chunks));
    }
    if let Some(w) = b.new_pages.take() {
        let name = CheckpointStorage::shared_name(id, task);
        let digest =
            w.finish().map_err(|e| Error::io("cannot write shared state pages", storage.dir().join(&name), e))?;
        b.pages.files.insert(Arc::clone(&b.own_file), digest);
    }
    let mut shared = Vec::with_capacity(b.content.shared.len());
    for name in &b.content.shared {
        let digest = b.pages.files.get(&**name).or_else(|| b.known.as_ref().and_then(|k| k.file(name)));
        let digest = *digest.expect("a referred shared file was written here or by the checkpoint referred to");
        b.pages.files.insert(name.as_str().into(), digest);
        shared.push(SharedFile::new(name.clone(), digest));
    }
    let (file, file_digest) = storage.write_task(id, task, &b.content)?;
    if let Some(index) = index {
        index.written(id, b.pages);
        index.materializing(&b.materialize);
    }
    Ok(TaskFileWritten {
        file,
        file_digest,
        state_bytes: b.state_bytes,
        written_bytes: b.written_bytes,
        shared,
        print: b.print,
        materialize: b.materialize,
    })
}

/// Materializes in the background the bases of the maps `forks` names (by the id of their
/// changes; [`TaskFileWritten::materialize`]) from `parts`, the state checkpoint `id` of task
/// `task` captured: their images go into the task's base file beside that checkpoint
/// ([`CheckpointStorage::base_name`]), pages stored before referred to; the file is read back
/// whole, and then the bases are `index`'s to adopt. Stops, handing nothing over, when
/// `cancelled()` says so between pages. Either way the maps are no longer materializing.
pub fn materialize(
    storage: &CheckpointStorage,
    index: &PageIndex,
    task: usize,
    id: u64,
    parts: &[crate::snapshot::SharedFork],
    forks: &[u64],
    cancelled: &dyn Fn() -> bool,
) -> Result<()> {
    let name: Arc<str> = CheckpointStorage::base_name(id, task).into();
    let mut b = TaskFileBuilder::new(storage, (id, task), Some(index.known()), Arc::clone(&name));
    (b.changelog, b.materializing, b.cancelled) = (index.changelog, Some(forks.iter().copied().collect()), cancelled);
    let path = storage.dir().join(&*name);
    b.print.start("", 0);
    let result = (|| {
        for p in parts {
            let state = p.lock().unwrap_or_else(|e| e.into_inner());
            state.write_chunks(&mut b).map_err(|e| Error::io("cannot materialize a changelog base", &path, e))?;
        }
        let file = match b.new_pages.take() {
            Some(w) => {
                let digest = w.finish().map_err(|e| Error::io("cannot materialize a changelog base", &path, e))?;
                storage.verify_shared(&name, id, task, &digest)?;
                Some((Arc::clone(&name), digest))
            }
            None => None,
        };
        // The bases in one file share its fate.
        let fate: Arc<std::sync::atomic::AtomicU8> = Arc::default();
        let bases = b.pages.chains.iter().map(|(&fork, chain)| {
            let pages = chain.base.pages.iter().map(|v| (*v, b.pages.pages[v].clone())).collect();
            let (file, path, fate) = (file.clone(), path.clone(), Arc::clone(&fate));
            (fork, Materialized { base: Arc::clone(&chain.base), pages, file, path, fate })
        });
        Ok(bases.collect())
    })();
    match result {
        Ok(bases) => index.materialized(forks, Some(bases)),
        Err(e) => {
            index.materialized(forks, None);
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
    }
    Ok(())
}

// Their fields are closures, shared internals or whole state: a name says enough.
crate::debug_as_name!([] PageIndex);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::storage::{is_base_name, test_metadata};
    use crate::prng::mix;
    use crate::snapshot::Barrier;
    use crate::state::{KeyedValueState, Snapshot};
    use std::collections::HashSet;

    /// Writes one checkpoint of `state` (one task, one part) and commits it.
    fn checkpoint(
        storage: &CheckpointStorage,
        index: Option<&PageIndex>,
        id: u64,
        state: &mut KeyedValueState<u64, u64>,
    ) -> TaskFileWritten {
        storage.prepare(id).unwrap();
        let mut snap = TaskSnapshot::new(Barrier { id, trigger_ns: 0, unaligned: false, savepoint: false });
        snap.add("counts".into(), 0, state.fork());
        let w = write_task_snapshot(storage, index, 0, &snap).unwrap();
        storage.commit(&test_metadata(id, w.file.clone(), w.file_digest, w.shared.clone())).unwrap();
        w
    }

    /// [`checkpoint`], giving back the fork it wrote, to materialize a base from.
    fn checkpoint_keeping_fork(
        storage: &CheckpointStorage,
        index: &PageIndex,
        id: u64,
        state: &mut KeyedValueState<u64, u64>,
    ) -> (TaskFileWritten, crate::snapshot::SharedFork) {
        storage.prepare(id).unwrap();
        let mut snap = TaskSnapshot::new(Barrier { id, trigger_ns: 0, unaligned: false, savepoint: false });
        snap.add("counts".into(), 0, state.fork());
        let w = write_task_snapshot(storage, Some(index), 0, &snap).unwrap();
        storage.commit(&test_metadata(id, w.file.clone(), w.file_digest, w.shared.clone())).unwrap();
        let fork = Arc::new(Mutex::new(snap.parts.pop().unwrap().state));
        (w, fork)
    }

    /// Keys `0..keys`, each counting itself.
    fn counts(keys: u64) -> KeyedValueState<u64, u64> {
        let mut state = KeyedValueState::new();
        (0..keys).for_each(|k| state.put(k, k));
        state
    }

    /// 300 updates to keys drawn uniformly (every page is touched), a new key and a removal
    /// (backward shifts move entries between slots).
    fn update(state: &mut KeyedValueState<u64, u64>, id: u64, keys: u64) {
        for j in 0..300 {
            *state.get_or_insert_with(mix(id * 1000 + j) % keys, || 0) += 1;
        }
        state.put(keys + id, id);
        state.remove(&(mix(id) % keys));
    }

    /// Whether checkpoint `id`'s chain stands on a base materialized in the background.
    fn on_materialized_base(storage: &CheckpointStorage, id: u64) -> bool {
        storage.metadata(id).unwrap().shared.iter().any(|s| is_base_name(&s.file))
    }

    /// Settles checkpoint `id`: aborted (its files go), or completed and retained with the one
    /// before it. Returns whether it completed.
    fn settle(storage: &CheckpointStorage, index: &PageIndex, completed: &mut Vec<u64>, id: u64, abort: bool) -> bool {
        if abort {
            index.on_notice(CheckpointNotice::Aborted(id));
            storage.discard(id);
            return false;
        }
        index.on_notice(CheckpointNotice::Complete(id));
        completed.push(id);
        storage.retain(completed, 2, &HashSet::new());
        true
    }

    /// Checkpoint `id` restores exactly `state`.
    fn assert_restores(storage: &CheckpointStorage, id: u64, state: &KeyedValueState<u64, u64>) {
        let got = storage.load(id).unwrap_or_else(|e| panic!("checkpoint {id}: {e}"));
        let mut back: KeyedValueState<u64, u64> = KeyedValueState::new();
        back.restore(got.state.get("counts", 0).unwrap()).unwrap();
        assert!(back.len() == state.len() && state.iter().all(|(k, v)| back.get(k) == Some(v)), "checkpoint {id}");
    }

    /// A chain of incremental checkpoints, some aborted, with retention deleting old ones:
    /// every retained checkpoint restores exactly what a full checkpoint of the same state
    /// restores, and the latest needs only the files retention kept.
    #[test]
    fn an_incremental_chain_restores_what_a_full_checkpoint_does_and_retention_keeps_what_it_needs() {
        let (inc_dir, full_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (inc, full) = (CheckpointStorage::new(inc_dir.path()), CheckpointStorage::new(full_dir.path()));
        let index = PageIndex::default();
        let mut state: KeyedValueState<u64, u64> = KeyedValueState::new();
        for k in 0..50_000 {
            state.put(k, k);
        }
        let mut completed = Vec::new();
        let mut full_bytes = Vec::new();
        let mut rewrites = 0;
        for id in 1..=14u64 {
            // Dirty a few pages: updates to a small key range, a few new keys and removals.
            for j in 0..20 {
                let k = (id * 977 + j) % 2_000;
                *state.get_or_insert_with(k, || 0) += id;
            }
            state.put(100_000 + id, id);
            state.remove(&(mix(id) % 50_000));
            let w = checkpoint(&inc, Some(&index), id, &mut state);
            let f = checkpoint(&full, None, id, &mut state);
            assert_eq!(w.state_bytes, f.state_bytes, "checkpoint {id}: the same state has the same size");
            assert_eq!(f.written_bytes, f.state_bytes, "a full checkpoint writes everything");
            // Compaction rewrites the first checkpoint's file once under half of it is live
            // (about half the state, once); every other checkpoint writes a few pages.
            if id > 1 && w.written_bytes * 5 >= w.state_bytes {
                rewrites += 1;
                assert!(
                    rewrites == 1 && w.written_bytes * 3 < w.state_bytes * 2,
                    "checkpoint {id} wrote {} of {}",
                    w.written_bytes,
                    w.state_bytes
                );
            }
            full_bytes.push(full.load(id).unwrap().state.get("counts", 0).unwrap().to_vec());
            if id % 5 == 3 {
                // Aborted: its pages must never become references.
                index.on_notice(CheckpointNotice::Aborted(id));
                inc.discard(id);
                continue;
            }
            index.on_notice(CheckpointNotice::Complete(id));
            completed.push(id);
            let deleted = inc.retain(&mut completed, 2, &HashSet::new());
            for id in &completed {
                let m = inc.metadata(*id).unwrap();
                assert!(
                    deleted.iter().all(|d| m.shared_names().all(|s| s != d)),
                    "retention deleted a file {id} needs"
                );
                let got = inc.load(*id).unwrap();
                assert_eq!(got.state.get("counts", 0), Some(&full_bytes[*id as usize - 1][..]), "checkpoint {id}");
            }
        }
        assert_eq!(completed.len(), 2);
        let on_disk = std::fs::read_dir(inc_dir.path().join(crate::checkpoint::SHARED_DIR)).unwrap().count();
        let needed: HashSet<String> =
            completed.iter().flat_map(|id| inc.metadata(*id).unwrap().shared.into_iter().map(|s| s.file)).collect();
        assert_eq!(on_disk, needed.len(), "shared files nothing refers to were deleted");
        // The restored state equals the live one.
        let latest = *completed.last().unwrap();
        let mut back: KeyedValueState<u64, u64> = KeyedValueState::new();
        back.restore(inc.load(latest).unwrap().state.get("counts", 0).unwrap()).unwrap();
        assert_eq!(back.len(), state.len());
        assert!(state.iter().all(|(k, v)| back.get(k) == Some(v)));
        // A savepoint of an incremental checkpoint refers to nothing outside its folder.
        let sp_dir = tempfile::tempdir().unwrap();
        let sp = inc.copy_to_savepoint(latest, sp_dir.path()).unwrap();
        std::fs::remove_dir_all(inc_dir.path().join(crate::checkpoint::SHARED_DIR)).unwrap();
        assert!(inc.load(latest).is_err(), "without its shared files the checkpoint is damaged");
        let restored = crate::checkpoint::load_dir(&sp).unwrap();
        assert_eq!(restored.state.get("counts", 0), Some(&full_bytes[latest as usize - 1][..]));
        assert!(restored.metadata.shared.is_empty());
    }

    /// A chain of 300 incremental checkpoints, every seventh aborted, where each checkpoint
    /// rewrites one page in a sweep over the state (and a few hot keys): without compaction
    /// each checkpoint's small file stayed live until the sweep came round again, and the
    /// latest checkpoint referred to ever more files. With it, what each checkpoint refers to
    /// stays within `MAX_SHARED_FILES` files and twice the state, retention leaves only what
    /// the retained checkpoints name, and every checkpoint restores the live state.
    #[test]
    fn compaction_bounds_the_files_and_bytes_a_long_chain_refers_to() {
        let dir = tempfile::tempdir().unwrap();
        let storage = CheckpointStorage::new(dir.path());
        let index = PageIndex::default();
        let mut state: KeyedValueState<u64, u64> = KeyedValueState::new();
        let keys = 60_000u64;
        for k in 0..keys {
            state.put(k, k);
        }
        let mut completed = Vec::new();
        let (mut most_files, mut compacted_some) = (0, false);
        for id in 1..=300u64 {
            // One key of every 240th: about one page of the sweep a checkpoint.
            for j in 0..4 {
                let k = (id * 240 + j * 61) % keys;
                *state.get_or_insert_with(k, || 0) += id;
            }
            *state.get_or_insert_with(7, || 0) += 1;
            let w = checkpoint(&storage, Some(&index), id, &mut state);
            if !settle(&storage, &index, &mut completed, id, id % 7 == 3) {
                continue;
            }
            let referred: u64 = w.shared.iter().map(|s| s.bytes).sum();
            most_files = most_files.max(w.shared.len());
            assert!(w.shared.len() <= MAX_SHARED_FILES + 1, "checkpoint {id} refers to {} files", w.shared.len());
            // Twice the state, and each file's header.
            let slack = 2 * w.state_bytes + 4096 * w.shared.len() as u64;
            assert!(referred <= slack, "checkpoint {id} refers to {referred} bytes for {} of state", w.state_bytes);
            compacted_some |= id > 1 && w.written_bytes * 4 > w.state_bytes;
            assert_restores(&storage, id, &state);
        }
        assert!(most_files > MAX_SHARED_FILES / 2, "the chain grew to {most_files} files: it did not test the bound");
        // What `weir checkpoints` shows: the latest's own bytes, and the earlier files it needs.
        let m = storage.metadata(*completed.last().unwrap()).unwrap();
        let (own, shared, files) = m.own_and_shared_bytes();
        assert_eq!(files + 1, m.shared.len(), "every shared file but its own is an earlier one's");
        assert!(own > 0 && shared > own, "own {own}, shared {shared}");
        assert!(compacted_some, "no checkpoint rewrote a file's pages");
        let on_disk = std::fs::read_dir(dir.path().join(crate::checkpoint::SHARED_DIR)).unwrap().count();
        let needed: HashSet<String> =
            completed.iter().flat_map(|id| storage.metadata(*id).unwrap().shared.into_iter().map(|s| s.file)).collect();
        assert_eq!(on_disk, needed.len(), "retention left only what the retained checkpoints name");
    }

    /// Changelog checkpoints over uniform updates that touch every page: each checkpoint
    /// writes about the changed entries (an incremental one wrote every page), a new base
    /// every fourth segment and after an aborted checkpoint left a hole in the chain, and
    /// every completed checkpoint restores exactly the live state, under retention.
    #[test]
    fn changelog_checkpoints_write_the_changes_and_restore_the_state() {
        let dir = tempfile::tempdir().unwrap();
        let storage = CheckpointStorage::new(dir.path());
        let index = PageIndex::changelog(4);
        let keys = 40_000u64;
        let mut state = counts(keys);
        let mut completed = Vec::new();
        let (mut small, mut bases) = (0, 0);
        for id in 1..=24u64 {
            update(&mut state, id, keys);
            let w = checkpoint(&storage, Some(&index), id, &mut state);
            if w.written_bytes * 10 < w.state_bytes {
                small += 1;
            } else {
                bases += 1;
            }
            if !settle(&storage, &index, &mut completed, id, id % 9 == 5) {
                continue;
            }
            assert_restores(&storage, id, &state);
            // The one retained before it still loads (retention kept what its chain needs).
            for &c in &completed {
                storage.load(c).unwrap_or_else(|e| panic!("checkpoint {c}: {e}"));
            }
        }
        // The first, one every fifth checkpoint (four segments, then a base), and the one after
        // each aborted checkpoint's hole; the rest wrote their changes only.
        assert!(small >= 14, "{small} checkpoints wrote only changes, {bases} a base");
        assert!(bases >= 5, "{bases} bases");
        let on_disk = std::fs::read_dir(dir.path().join(crate::checkpoint::SHARED_DIR)).unwrap().count();
        let needed: HashSet<String> =
            completed.iter().flat_map(|id| storage.metadata(*id).unwrap().shared.into_iter().map(|s| s.file)).collect();
        assert_eq!(on_disk, needed.len(), "retention left only what the retained checkpoints name");
        // A savepoint of a changelog checkpoint is whole: its state reads without the chain.
        let sp_dir = tempfile::tempdir().unwrap();
        let latest = *completed.last().unwrap();
        let sp = storage.copy_to_savepoint(latest, sp_dir.path()).unwrap();
        let restored = crate::checkpoint::load_dir(&sp).unwrap();
        let mut back: KeyedValueState<u64, u64> = KeyedValueState::new();
        back.restore(restored.state.get("counts", 0).unwrap()).unwrap();
        assert_eq!(back.len(), state.len());
    }

    /// A truncated or damaged segment is damage: recovery skips every checkpoint whose chain
    /// holds it and restores the newest one before, exactly — never state read from it.
    /// A chain due for a new base gets it in the background: the due checkpoint and those
    /// after it write their changes only, the first checkpoint after the base is durable
    /// stands on it, and every checkpoint restores exactly. Only the first two checkpoints and
    /// the one after each failed checkpoint's hole write a base themselves.
    #[test]
    fn a_base_materialized_in_the_background_keeps_every_checkpoint_small() {
        let dir = tempfile::tempdir().unwrap();
        let storage = CheckpointStorage::new(dir.path());
        let index = PageIndex::changelog(3);
        let keys = 40_000u64;
        let mut state = counts(keys);
        let (mut completed, mut adopted, mut materialized, mut last) = (Vec::new(), 0, 0, 0);
        let mut after_hole = true;
        let mut due: Option<(u64, Vec<u64>, crate::snapshot::SharedFork)> = None;
        for id in 1..=40u64 {
            update(&mut state, id, keys);
            let (w, fork) = checkpoint_keeping_fork(&storage, &index, id, &mut state);
            // The map tracks its writes from the fork after the first changelog checkpoint on.
            let wrote_base = w.written_bytes * 10 >= w.state_bytes;
            let (bytes, of) = (w.written_bytes, w.state_bytes);
            assert_eq!(wrote_base, id <= 2 || after_hole, "checkpoint {id} wrote {bytes} of {of} bytes");
            if !w.materialize.is_empty() {
                assert!(due.is_none(), "one materialization at a time");
                due = Some((id, w.materialize.clone(), fork));
            }
            // The materialization finishes at varying points: before the due checkpoint
            // completes, or a checkpoint later.
            if due.as_ref().is_some_and(|d| id % 2 == 0 || d.0 < id) {
                let (at, maps, fork) = due.take().unwrap();
                materialize(&storage, &index, 0, at, &[fork], &maps, &|| false).unwrap();
                (materialized, last) = (materialized + 1, at);
            }
            after_hole = !settle(&storage, &index, &mut completed, id, id % 11 == 7);
            if after_hole {
                // A base only a failed checkpoint adopted is the coordinator's to remove
                // (`CoordinatorCore::drop_files`): no later chain can stand on it.
                for s in w.shared.iter().filter(|s| is_base_name(&s.file)) {
                    let named = completed.iter().any(|c| storage.metadata(*c).unwrap().shared.contains(s));
                    if !named {
                        std::fs::remove_file(dir.path().join(&s.file)).unwrap();
                    }
                }
                continue;
            }
            adopted += on_materialized_base(&storage, id) as u32;
            assert_restores(&storage, id, &state);
            for &c in &completed {
                storage.load(c).unwrap_or_else(|e| panic!("checkpoint {c}: {e}"));
            }
        }
        assert!(materialized >= 8 && adopted >= 8, "{materialized} bases materialized, {adopted} checkpoints on one");
        // What the retained checkpoints name is what is on disk: a base no checkpoint adopted
        // (its chain broken by a hole first) was removed.
        let on_disk: HashSet<String> = std::fs::read_dir(dir.path().join(crate::checkpoint::SHARED_DIR))
            .unwrap()
            .map(|e| format!("shared/{}", e.unwrap().file_name().to_str().unwrap()))
            .collect();
        let mut needed: HashSet<String> =
            completed.iter().flat_map(|id| storage.metadata(*id).unwrap().shared.into_iter().map(|s| s.file)).collect();
        // And the last base materialized, which the next checkpoint would adopt.
        needed.insert(CheckpointStorage::base_name(last, 0));
        assert_eq!(on_disk, needed);
    }

    /// A materialization that stops part way (its task's attempt ended, or the process died
    /// in it) leaves nothing a checkpoint refers to: the chain goes on with its old base,
    /// gets a base of its own once twice past due, and every checkpoint restores exactly; a
    /// new process's start removes what a crash in it left.
    #[test]
    fn a_materialization_cut_short_leaves_the_chain_on_its_old_base() {
        let dir = tempfile::tempdir().unwrap();
        let storage = CheckpointStorage::new(dir.path());
        let index = PageIndex::changelog(2);
        let keys = 40_000u64;
        let mut state = counts(keys);
        let mut completed = Vec::new();
        let mut bases = Vec::new();
        for id in 1..=8u64 {
            update(&mut state, id, keys);
            let (w, fork) = checkpoint_keeping_fork(&storage, &index, id, &mut state);
            if w.written_bytes * 10 >= w.state_bytes {
                bases.push(id);
            }
            if !w.materialize.is_empty() {
                // Cut short after a few pages, as a task's attempt ending mid-way does.
                let pages = std::cell::Cell::new(0);
                let cancelled = || {
                    pages.set(pages.get() + 1);
                    pages.get() > 5
                };
                let e = materialize(&storage, &index, 0, id, &[fork], &w.materialize, &cancelled).unwrap_err();
                assert!(e.to_string().contains("attempt ended"), "{e}");
                assert!(!dir.path().join(CheckpointStorage::base_name(id, 0)).exists(), "the cut file is removed");
            }
            assert!(settle(&storage, &index, &mut completed, id, false));
            assert!(!on_materialized_base(&storage, id));
            assert_restores(&storage, id, &state);
        }
        // The first two (the map tracks its writes from the second fork on), then one once
        // the chain is twice past due: four segments (3 to 6) after its base.
        assert_eq!(bases, [1, 2, 7]);
        // What a process dying mid-materialization leaves: part of a base file. Recovery
        // never reads it, and the next process's start removes it.
        update(&mut state, 9, keys);
        let (w, fork) = checkpoint_keeping_fork(&storage, &index, 9, &mut state);
        assert!(!w.materialize.is_empty(), "checkpoint 9 is due for a base");
        materialize(&storage, &index, 0, 9, &[fork], &w.materialize, &|| false).unwrap();
        let base = dir.path().join(CheckpointStorage::base_name(9, 0));
        let bytes = std::fs::read(&base).unwrap();
        std::fs::write(&base, &bytes[..bytes.len() / 2]).unwrap();
        let fresh = CheckpointStorage::new(dir.path());
        let point = fresh.latest_valid().unwrap();
        assert_eq!((point.checkpoint.map(|c| c.metadata.checkpoint), point.skipped.len()), (Some(9), 0));
        assert_eq!(fresh.remove_unreferenced_shared(), [CheckpointStorage::base_name(9, 0)]);
        assert_restores(&fresh, 9, &state);
    }

    #[test]
    fn a_damaged_or_truncated_segment_falls_back_to_the_checkpoint_before() {
        let dir = tempfile::tempdir().unwrap();
        let storage = CheckpointStorage::new(dir.path());
        let index = PageIndex::changelog(10);
        let mut state: KeyedValueState<u64, u64> = KeyedValueState::new();
        for k in 0..20_000u64 {
            state.put(k, k);
        }
        let mut states = Vec::new();
        // Checkpoints 1 and 2 are bases (tracking starts at the fork after the first asked for
        // changes); 3 and 4 extend 2's chain with a segment each.
        for id in 1..=4u64 {
            for j in 0..50 {
                *state.get_or_insert_with(mix(id * 100 + j) % 20_000, || 0) += id;
            }
            let w = checkpoint(&storage, Some(&index), id, &mut state);
            assert_eq!(w.written_bytes * 10 < w.state_bytes, id > 2, "checkpoint {id}: a segment from the third on");
            states.push(state.iter().map(|(k, v)| (*k, *v)).collect::<HashMap<u64, u64>>());
            // Every checkpoint kept (no retention), so recovery can fall back to each.
            index.on_notice(CheckpointNotice::Complete(id));
        }
        let restored = |storage: &CheckpointStorage| {
            let found = storage.latest_valid().unwrap();
            let c = found.checkpoint.expect("a checkpoint to restore");
            let mut back: KeyedValueState<u64, u64> = KeyedValueState::new();
            back.restore(c.state.get("counts", 0).unwrap()).unwrap();
            let back: HashMap<u64, u64> = back.iter().map(|(k, v)| (*k, *v)).collect();
            (c.metadata.checkpoint, found.skipped.iter().map(|s| s.0).collect::<Vec<_>>(), back)
        };
        // Checkpoint 4's segment cut short: 4 is skipped, 3 restored as it was.
        let own = |id| dir.path().join(CheckpointStorage::shared_name(id, 0));
        let bytes = std::fs::read(own(4)).unwrap();
        std::fs::write(own(4), &bytes[..bytes.len() - 7]).unwrap();
        let (id, skipped, back) = restored(&storage);
        assert_eq!((id, skipped), (3, vec![4]));
        assert!(back == states[2], "checkpoint 3 restored exactly");
        // A bit flipped in checkpoint 3's segment, which 4's chain holds too: both skipped.
        let mut bytes = std::fs::read(own(3)).unwrap();
        let last = bytes.len() - 20;
        bytes[last] ^= 1;
        std::fs::write(own(3), bytes).unwrap();
        let (id, skipped, back) = restored(&storage);
        assert_eq!((id, skipped), (2, vec![4, 3]));
        assert!(back == states[1], "checkpoint 2 restored exactly");
    }

    /// 20,000 counts in checkpoint 1, completed; returns them.
    fn first_checkpoint(storage: &CheckpointStorage, index: &PageIndex) -> KeyedValueState<u64, u64> {
        let mut state = counts(20_000);
        checkpoint(storage, Some(index), 1, &mut state);
        index.on_notice(CheckpointNotice::Complete(1));
        state
    }

    /// 20,000 counts, updated and checkpointed three times (checkpoints 1 to 3, each completed
    /// and then handed to `completed`); returns the state as checkpoint 3 holds it.
    fn three_checkpoints(
        storage: &CheckpointStorage,
        index: &PageIndex,
        mut completed: impl FnMut(u64),
    ) -> KeyedValueState<u64, u64> {
        let keys = 20_000;
        let mut state = counts(keys);
        for id in 1..=3 {
            update(&mut state, id, keys);
            checkpoint(storage, Some(index), id, &mut state);
            index.on_notice(CheckpointNotice::Complete(id));
            completed(id);
        }
        state
    }

    /// Restores checkpoint `id` lazily into `back` within `budget`: nothing is read but the
    /// task file (and a changelog's segments).
    fn restore_lazily_within(
        storage: &CheckpointStorage,
        id: u64,
        budget: &Arc<crate::state::StateBudget>,
    ) -> Result<KeyedValueState<u64, u64>> {
        let cache = crate::checkpoint::PageCache::new(budget.dir(), 1 << 20);
        let loaded = crate::checkpoint::storage::load_dir_lazily(&storage.checkpoint_dir(id), None, &cache)?;
        let (inline, pages) = loaded.state.lazy("counts", 0).expect("pages stored apart");
        let _scope = crate::state::StateBudget::enter(Some(Arc::clone(budget)));
        let mut back = KeyedValueState::new();
        crate::state::restore_lazily(inline, pages, |b| back.restore(b))?;
        Ok(back)
    }

    /// A lazy restore reads no page before a lookup needs it (but what a changelog's segments
    /// change), then every value is the checkpoint's (incremental and changelog chains); a
    /// stored page damaged after the restore began fails the lookup that reaches it with an
    /// error naming the file, and the next restore reads that file whole, so the checkpoint
    /// is found damaged.
    #[test]
    fn a_lazy_restore_reads_pages_when_used_and_a_damaged_page_fails_over() {
        for changelog in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let storage = CheckpointStorage::new(dir.path());
            let index = if changelog { PageIndex::changelog(8) } else { PageIndex::default() };
            let state = three_checkpoints(&storage, &index, |_| {});
            let spill = tempfile::tempdir().unwrap();
            let budget = crate::state::StateBudget::new(1 << 20, spill.path()).unwrap();
            let back = restore_lazily_within(&storage, 3, &budget).unwrap();
            let after_restore = budget.stats();
            assert!(after_restore.resident_bytes < 1 << 20, "{after_restore:?}");
            if !changelog {
                assert_eq!(after_restore.faults, 0, "an incremental restore reads no page");
            }
            let _scope = crate::state::StateBudget::enter(Some(Arc::clone(&budget)));
            assert_eq!(back.len(), state.len());
            assert!(state.iter().all(|(k, v)| back.get(k) == Some(v)), "changelog {changelog}");
            assert!(budget.stats().faults > after_restore.faults + 10, "{:?}", budget.stats());
            drop(back);
            if changelog {
                // (Its segments, applied at the restore, brought back most pages already.)
                continue;
            }

            // Damage a page in the middle of checkpoint 3's own file (most pages changed since
            // checkpoint 2), after the restore began.
            let back = restore_lazily_within(&storage, 3, &budget).unwrap();
            let shared = CheckpointStorage::shared_name(3, 0);
            let path = dir.path().join(&shared);
            let mut bytes = std::fs::read(&path).unwrap();
            let at = bytes.len() / 2;
            bytes[at] ^= 0xff;
            std::fs::write(&path, &bytes).unwrap();
            let lookups = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                state.iter().all(|(k, v)| back.get(k) == Some(v))
            }));
            let failure = lookups.expect_err("a damaged page is never read as a value");
            let failure = failure.downcast::<crate::state::StateFailure>().expect("a state failure");
            let message = failure.0.to_string();
            assert!(message.contains("fails its checksum") && message.contains(&shared), "{message}");
            drop(back);
            let cache = crate::checkpoint::PageCache::new(spill.path(), 1 << 20);
            match crate::checkpoint::storage::load_dir_lazily(&storage.checkpoint_dir(3), None, &cache) {
                Err(Error::Corrupt(why)) => assert!(why.contains(&shared), "{why}"),
                other => panic!("a damaged file is read whole and found damaged: {other:?}"),
            }
        }
    }

    /// After a lazy restore, the next incremental checkpoint refers to the pages left where
    /// the restored checkpoint stored them (unchanged since): it writes only what changed, and
    /// reads nothing back; it restores exactly.
    #[test]
    fn the_checkpoint_after_a_lazy_restore_refers_to_the_pages_left_stored() {
        let (dir, spill) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let storage = CheckpointStorage::new(dir.path());
        let index = PageIndex::default();
        let (keys, mut state) = (20_000, first_checkpoint(&storage, &index));
        let budget = crate::state::StateBudget::new(1 << 20, spill.path()).unwrap();
        let (back, left) = crate::snapshot::pages_left_stored(|| restore_lazily_within(&storage, 1, &budget));
        let mut back = back.unwrap();
        assert!(left.len() > 10, "the pages left stored: {}", left.len());
        let after = PageIndex::default();
        after.seed(left);
        let _scope = crate::state::StateBudget::enter(Some(Arc::clone(&budget)));
        (0..20).for_each(|k| back.put(k * 977 % keys, 7));
        let faults = budget.stats().faults;
        let w = checkpoint(&storage, Some(&after), 2, &mut back);
        assert_eq!(budget.stats().faults, faults, "the checkpoint read no page back");
        assert!(w.written_bytes * 5 < w.state_bytes, "wrote {} of {}", w.written_bytes, w.state_bytes);
        assert!(storage.metadata(2).unwrap().shared.iter().any(|s| s.file == CheckpointStorage::shared_name(1, 0)));
        (0..20).for_each(|k| state.put(k * 977 % keys, 7));
        assert_restores(&storage, 2, &state);
    }

    /// After a lazy restore, with reader threads (here, reads run where they are asked for),
    /// pages the checkpoint stored come back in the background: a pass over every key faults
    /// a few pages, and the warm-up brings the rest in while the budget has room.
    #[test]
    fn a_lazily_restored_map_warms_up_in_the_background() {
        struct ReadsAtOnce;
        impl crate::state::PageReader for ReadsAtOnce {
            fn submit(&self, read: Box<dyn FnOnce() + Send>) {
                read()
            }
        }
        let (dir, spill) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let storage = CheckpointStorage::new(dir.path());
        let state = first_checkpoint(&storage, &PageIndex::default());
        for (readers, most_faults) in [(false, usize::MAX), (true, 40)] {
            let budget = crate::state::StateBudget::new(4 << 20, spill.path()).unwrap();
            if readers {
                budget.read_with(Arc::new(ReadsAtOnce));
            }
            let back = restore_lazily_within(&storage, 1, &budget).unwrap();
            let _scope = crate::state::StateBudget::enter(Some(Arc::clone(&budget)));
            assert!(state.iter().all(|(k, v)| back.get(k) == Some(v)));
            let faults = budget.stats().faults as usize;
            assert!(faults <= most_faults, "readers {readers}: {faults} faults");
            assert!(readers || faults > 100, "without readers every page is a fault: {faults}");
        }
    }

    /// Within a budget, a page unchanged since a completed checkpoint stored it leaves memory
    /// without a spill write: it is read back from the checkpoint's file.
    #[test]
    fn a_page_unchanged_since_a_completed_checkpoint_leaves_memory_without_a_spill_write() {
        let (dir, spill) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let storage = CheckpointStorage::new(dir.path());
        let index = Arc::new(PageIndex::default());
        index.read_from(storage.dir(), storage.fingerprint());
        let budget = crate::state::StateBudget::new(64 << 10, spill.path()).unwrap();
        budget.pages_stored_by(Arc::downgrade(&index) as std::sync::Weak<dyn crate::snapshot::StoredPages>);
        let _scope = crate::state::StateBudget::enter(Some(Arc::clone(&budget)));
        let keys = 20_000;
        let mut state = counts(keys);
        checkpoint(&storage, Some(&index), 1, &mut state);
        index.on_notice(CheckpointNotice::Complete(1));
        let (writes, evictions) = (budget.stats().spill_writes, budget.stats().evictions);
        // Lookups bring every page back; writes to one key send the others out again.
        assert!((0..keys).all(|k| state.get(&k) == Some(&k)));
        (0..20).for_each(|_| *state.get_or_insert_with(0, || 0) += 1);
        let after = budget.stats();
        assert!(after.evictions >= evictions + 100, "the writes sent pages out: {after:?}");
        // (The page written may go too, once.)
        assert!(after.spill_writes <= writes + 1, "unchanged pages were written to a spill file: {after:?}");
        assert!((1..keys).all(|k| state.get(&k) == Some(&k)), "read back from the checkpoint's file");
    }

    /// Checkpoints kept in an object store, taken over by a process elsewhere: it brings down
    /// the task files and `_metadata` but no page, restores lazily, and reads each page from
    /// the store (a ranged read of its block) into a local cache that keeps within its limit;
    /// every value is the checkpoint's.
    #[test]
    fn a_lazy_restore_reads_pages_from_the_object_store_through_a_bounded_cache() {
        use crate::checkpoint::{CheckpointMirror, InMemoryObjectStore, ObjectStore, PageCache};
        let (dir, working, spill) =
            (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let storage = CheckpointStorage::new(dir.path());
        let store: Arc<dyn ObjectStore> = Arc::new(InMemoryObjectStore::default());
        let state = three_checkpoints(&storage, &PageIndex::default(), |id| {
            let metadata = storage.metadata(id).unwrap();
            CheckpointMirror::new(Arc::clone(&store)).publish(dir.path(), &metadata, &HashSet::new()).unwrap();
        });
        let elsewhere = CheckpointMirror::new(Arc::clone(&store));
        assert_eq!(elsewhere.take_over(working.path(), 1, "elsewhere").unwrap(), vec![1, 2, 3]);
        assert!(std::fs::read_dir(working.path().join(crate::checkpoint::SHARED_DIR)).is_err(), "no page came down");

        let limit = 192 << 10;
        let cache = PageCache::new(spill.path(), limit);
        let loaded =
            crate::checkpoint::storage::load_dir_lazily(&working.path().join("chk-3"), Some(&elsewhere), &cache)
                .unwrap();
        let (inline, pages) = loaded.state.lazy("counts", 0).expect("pages left in the store");
        let budget = crate::state::StateBudget::new(256 << 10, spill.path()).unwrap();
        let _scope = crate::state::StateBudget::enter(Some(Arc::clone(&budget)));
        let mut back: KeyedValueState<u64, u64> = KeyedValueState::new();
        crate::state::restore_lazily(inline, pages, |b| back.restore(b)).unwrap();
        assert_eq!(cache.bytes(), 0, "the restore read no page");
        assert_eq!(back.len(), state.len());
        assert!(state.iter().all(|(k, v)| back.get(k) == Some(v)));
        let read = cache.bytes();
        assert!(read > 0 && read <= limit + (64 << 10), "the cache holds {read} bytes of {limit}");
        assert!(std::fs::read_dir(working.path().join(crate::checkpoint::SHARED_DIR)).is_err(), "nor later");
    }

    #[test]
    fn unreferenced_shared_files_are_removed_and_referenced_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let storage = CheckpointStorage::new(dir.path());
        let index = PageIndex::default();
        let mut state: KeyedValueState<u64, u64> = KeyedValueState::new();
        for k in 0..10_000 {
            state.put(k, k);
        }
        checkpoint(&storage, Some(&index), 1, &mut state);
        index.on_notice(CheckpointNotice::Complete(1));
        state.put(3, 0);
        // Checkpoint 2 never completes: its shared file is an orphan.
        storage.prepare(2).unwrap();
        let mut snap = TaskSnapshot::new(Barrier { id: 2, trigger_ns: 0, unaligned: false, savepoint: false });
        snap.add("counts".into(), 0, state.fork());
        write_task_snapshot(&storage, Some(&index), 0, &snap).unwrap();
        assert_eq!(storage.remove_unreferenced_shared(), vec![CheckpointStorage::shared_name(2, 0)]);
        assert!(storage.load(1).is_ok());
    }
}
