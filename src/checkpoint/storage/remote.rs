//! The checkpoint directory kept in an object store (S3 and its kind), so that it outlives the
//! machine: a process started anywhere resumes from it. The local folder is then this
//! process's working copy: checkpoints are written and verified there as always, and go up
//! when they complete; at start the store's checkpoints come down into it.
//!
//! Under the store's prefix the layout is the directory's own, each file of a checkpoint in a
//! folder of the generation that wrote it: `chk-<n>/g<g>/<task files>`, `chk-<n>/g<g>/_metadata`,
//! `shared/g<g>/<pages>`, then `_finished`, `_instance` (the job's identity),
//! `_generations/<g>` (the newest claim) and `_bases/<g>-<n>` (each claim's, and the newest
//! checkpoint it found). Keys without a generation folder are the round-3 layout's, read as
//! generation 0.
//!
//! A checkpoint exists in the store once its `_metadata` does, created with a conditional put
//! that fails when the key exists. Every other file goes up before it.
//!
//! Fencing: a process claims generation *g*, one above every claim, by creating
//! `_generations/<g>`; before each checkpoint's completion and each sink commit it lists the
//! claims and stops (`Error::Fenced`) when a newer one exists. A process that started later has
//! claimed before it listed the checkpoints, so whatever an older one completed before seeing
//! that claim is a checkpoint the newer one restores. What an older one publishes after the
//! claim (it passed its check, then paused: a GC or VM pause, a slow link) must count for
//! nothing, and S3 cannot refuse that put on the claim's behalf; so right after listing, the
//! newer process records in `_bases/<g>-<n>` the newest checkpoint it found, before it restores
//! anything. A checkpoint written by generation *h* counts only while the first recorded base
//! above *h* is at least its id ([`Lineage`]): later ones by *h* were published after it was
//! fenced. Generations' keys never collide, so such a late publish overwrites nothing of its
//! successor's, and the successor deletes it when it finds it.
//!
//! May touch: `error` (and the directory's files, beside it).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::{parse_shared_name, CheckpointMetadata, FINISHED_MARKER, METADATA_FILE, SHARED_DIR};
use crate::error::{Error, Result};

/// A store of whole objects by key, as S3 and its kin offer. Keys are relative to the store's
/// own prefix and use `/` as the separator. Implemented for S3 by the `weir-object-store`
/// crate; [`InMemoryObjectStore`] keeps objects in memory (for tests).
pub trait ObjectStore: Send + Sync + Debug {
    /// Where the store is, for messages (`s3://bucket/prefix`).
    fn location(&self) -> String;
    /// Writes the file at `from` as object `key`, replacing any.
    fn upload(&self, key: &str, from: &Path) -> std::io::Result<()>;
    /// Creates object `key` holding `bytes` unless it exists: `false` when it did (nothing
    /// written).
    fn create(&self, key: &str, bytes: &[u8]) -> std::io::Result<bool>;
    /// Writes object `key` into the file at `to`: `false` when there is no such object.
    fn download(&self, key: &str, to: &Path) -> std::io::Result<bool>;
    /// The keys of every object whose key starts with `prefix`.
    fn list(&self, prefix: &str) -> std::io::Result<Vec<String>>;
    /// Deletes object `key` (a missing one is not an error).
    fn delete(&self, key: &str) -> std::io::Result<()>;
    /// Bytes `start..end` of object `key` (a lazy restore's pages). The default brings the
    /// whole object down and cuts the range out; stores that can read a range do.
    fn read_range(&self, key: &str, start: u64, end: u64) -> std::io::Result<Vec<u8>> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let scratch = std::env::temp_dir().join(format!("weir-range-{}-{n}", std::process::id()));
        let found = self.download(key, &scratch);
        let bytes = std::fs::read(&scratch);
        let _ = std::fs::remove_file(&scratch);
        if !found? {
            return Err(std::io::Error::new(std::io::ErrorKind::NotFound, format!("no object {key}")));
        }
        let bytes = bytes?;
        bytes.get(start as usize..end as usize).map(<[u8]>::to_vec).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::UnexpectedEof, format!("{key} ends before byte {end}"))
        })
    }
}

/// An [`ObjectStore`] in memory: for tests of what is built on the store.
///
/// ```
/// use weir::checkpoint::{InMemoryObjectStore, ObjectStore};
/// let store = InMemoryObjectStore::default();
/// assert!(store.create("_generations/1", b"a").unwrap());
/// assert!(!store.create("_generations/1", b"b").unwrap(), "a second create of a key fails");
/// assert_eq!(store.list("_generations/").unwrap(), vec!["_generations/1".to_string()]);
/// ```
#[derive(Debug, Default)]
pub struct InMemoryObjectStore {
    objects: Mutex<BTreeMap<String, Vec<u8>>>,
}

impl InMemoryObjectStore {
    /// The bytes of object `key`.
    pub fn get(&self, key: &str) -> Option<Vec<u8>> {
        self.objects().get(key).cloned()
    }

    fn objects(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Vec<u8>>> {
        self.objects.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl ObjectStore for InMemoryObjectStore {
    fn location(&self) -> String {
        "memory://".into()
    }
    fn upload(&self, key: &str, from: &Path) -> std::io::Result<()> {
        let bytes = std::fs::read(from)?;
        self.objects().insert(key.to_string(), bytes);
        Ok(())
    }
    fn create(&self, key: &str, bytes: &[u8]) -> std::io::Result<bool> {
        let mut objects = self.objects();
        if objects.contains_key(key) {
            return Ok(false);
        }
        objects.insert(key.to_string(), bytes.to_vec());
        Ok(true)
    }
    fn download(&self, key: &str, to: &Path) -> std::io::Result<bool> {
        let Some(bytes) = self.get(key) else { return Ok(false) };
        std::fs::write(to, bytes).map(|_| true)
    }
    fn list(&self, prefix: &str) -> std::io::Result<Vec<String>> {
        Ok(self
            .objects()
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, _)| k.clone())
            .collect())
    }
    fn delete(&self, key: &str) -> std::io::Result<()> {
        self.objects().remove(key);
        Ok(())
    }
    fn read_range(&self, key: &str, start: u64, end: u64) -> std::io::Result<Vec<u8>> {
        let objects = self.objects();
        let bytes = objects.get(key).ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, key))?;
        bytes.get(start as usize..end as usize).map(<[u8]>::to_vec).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::UnexpectedEof, format!("{key} ends before byte {end}"))
        })
    }
}

/// The file holding the identity of the job a checkpoint directory belongs to (in the
/// directory, and under the same key in its store).
pub const INSTANCE_FILE: &str = "_instance";

const GENERATIONS: &str = "_generations/";
const BASES: &str = "_bases/";

/// The key of local file `local` (relative to the directory) written by generation
/// `generation`: a checkpoint's files and shared files go into a folder of their generation.
fn stored_key(local: &str, generation: u64) -> String {
    match local.split_once('/') {
        Some((folder, file)) => format!("{folder}/g{generation}/{file}"),
        None => local.to_string(),
    }
}

/// The local file a key of the store is, and the generation that wrote it (0: the round-3
/// layout, without a generation folder).
fn local_key(key: &str) -> (String, u64) {
    if let Some((folder, rest)) = key.split_once('/') {
        if let Some((g, file)) = rest.split_once('/') {
            if let Some(generation) = g.strip_prefix('g').and_then(|n| n.parse::<u64>().ok()) {
                return (format!("{folder}/{file}"), generation);
            }
        }
    }
    (key.to_string(), 0)
}

/// What each process that took the prefix over found there: generation → the newest
/// checkpoint it saw (0: none). Says which generations' checkpoints count.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Lineage {
    bases: BTreeMap<u64, u64>,
}

impl Lineage {
    /// Whether checkpoint `id` (or a shared file written for it) by generation `generation`
    /// counts: the first generation above it that recorded what it found saw that far (no
    /// newer one recorded anything: it counts). A later one was published after that
    /// generation had claimed the prefix, by a writer already fenced.
    ///
    /// ```
    /// use weir::checkpoint::Lineage;
    /// // Generation 6 took over finding checkpoint 16 (of generation 5).
    /// let lineage = Lineage::from_bases([(6, 16)]);
    /// assert!(lineage.counts(5, 16));
    /// assert!(!lineage.counts(5, 17), "published by generation 5 after 6 took over");
    /// assert!(lineage.counts(6, 17));
    /// ```
    pub fn counts(&self, generation: u64, id: u64) -> bool {
        match self.bases.range(generation + 1..).next() {
            Some((_, &base)) => id <= base,
            None => true,
        }
    }

    /// The lineage of these (generation, base) records.
    pub fn from_bases(bases: impl IntoIterator<Item = (u64, u64)>) -> Lineage {
        Lineage { bases: bases.into_iter().collect() }
    }
}

/// Files of one checkpoint uploaded at once.
const PARALLEL_UPLOADS: usize = 8;

/// The remote side of a checkpoint directory: what goes up, comes down, and who may write.
#[derive(Debug, Clone)]
pub struct CheckpointMirror {
    store: Arc<dyn ObjectStore>,
    /// Shared files left in the store (the state's primary copy): by local name, their keys.
    /// Brought down when something reads one whole; a lazy restore reads their pages from the
    /// store instead.
    left_in_store: Arc<Mutex<BTreeMap<String, String>>>,
}

impl CheckpointMirror {
    /// The directory kept in `store`.
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        CheckpointMirror { store, left_in_store: Default::default() }
    }

    /// The store and key of shared file `name` (relative to the directory), which a take-over
    /// left there rather than bring it down. Another handle on the store than the one that
    /// took over learns the keys from a listing, once.
    pub(crate) fn left_in_store(&self, name: &str) -> Option<(Arc<dyn ObjectStore>, String)> {
        let mut left = self.left_in_store.lock().unwrap_or_else(|e| e.into_inner());
        if left.is_empty() {
            if let (Ok(lineage), Ok(keys)) = (self.lineage(), self.store.list(&format!("{SHARED_DIR}/"))) {
                let (wanted, _) = self.sort_keys(&keys, &lineage);
                left.extend(wanted.into_iter().map(|(local, (_, key))| (local, key)));
            }
        }
        let key = left.get(name).cloned()?;
        Some((Arc::clone(&self.store), key))
    }

    /// Brings shared file `name`, left in the store, down into `dir` (nothing when it was not
    /// left there). Returns whether it came down.
    pub(crate) fn bring_down(&self, dir: &Path, name: &str) -> Result<bool> {
        let Some((_, key)) = self.left_in_store(name) else { return Ok(false) };
        let to = dir.join(name);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent).map_err(|e| Error::io("cannot create checkpoint folder", parent, e))?;
        }
        let part = PathBuf::from(format!("{}.part", to.display()));
        self.store.download(&key, &part).map_err(|e| self.failed("download", &key, e))?;
        std::fs::rename(&part, &to).map_err(|e| Error::io("cannot place downloaded checkpoint file", &to, e))?;
        Ok(true)
    }

    /// Where the store is.
    pub fn location(&self) -> String {
        self.store.location()
    }

    fn failed(&self, what: &str, key: &str, e: std::io::Error) -> Error {
        let key = if key.is_empty() { "the objects" } else { key };
        Error::Io {
            context: format!("cannot {what} {key} in checkpoint store {}", self.location()),
            path: None,
            source: e,
        }
    }

    /// Checks that the store answers (a listing), naming it when it does not.
    pub fn probe(&self) -> Result<()> {
        self.store.list(GENERATIONS).map(|_| ()).map_err(|e| self.failed("list", GENERATIONS, e))
    }

    /// What the processes that took the prefix over found there (`_bases/<g>-<base>`).
    pub fn lineage(&self) -> Result<Lineage> {
        let keys = self.store.list(BASES).map_err(|e| self.failed("list", BASES, e))?;
        let parse = |k: &str| {
            let (g, base) = k.strip_prefix(BASES)?.split_once('-')?;
            Some((g.parse().ok()?, base.parse().ok()?))
        };
        Ok(Lineage::from_bases(keys.iter().filter_map(|k| parse(k))))
    }

    /// Which keys of the store hold which local files, among those that count (see
    /// [`Lineage`]): every complete checkpoint's files, the shared files, the completion
    /// marker; and the keys of checkpoint files that do not count.
    fn sort_keys(&self, keys: &[String], lineage: &Lineage) -> (BTreeMap<String, (u64, String)>, Vec<String>) {
        let shared = format!("{SHARED_DIR}/");
        let locals: Vec<(String, u64)> = keys.iter().map(|k| local_key(k)).collect();
        let complete: BTreeSet<(u64, u64)> = locals
            .iter()
            .filter(|(local, _)| local.ends_with(METADATA_FILE))
            .filter_map(|(local, g)| checkpoint_of(local).map(|id| (id, *g)))
            .collect();
        let mut wanted: BTreeMap<String, (u64, String)> = BTreeMap::new();
        let mut stray = Vec::new();
        for (key, (local, g)) in keys.iter().zip(locals) {
            let written_for = checkpoint_of(&local).or_else(|| parse_shared_name(&local).map(|(id, _)| id));
            let counts = match written_for {
                None => local == FINISHED_MARKER || local == INSTANCE_FILE,
                Some(id) if !lineage.counts(g, id) => {
                    stray.push(key.clone());
                    false
                }
                Some(_) if local.starts_with(&shared) => true,
                Some(id) => complete.contains(&(id, g)),
            };
            // Two generations' copies of one file that both count are one file written twice
            // (a process publishing shared state it had brought down): the newest is taken.
            if counts && wanted.get(&local).is_none_or(|(h, _)| *h <= g) {
                wanted.insert(local, (g, key.clone()));
            }
        }
        (wanted, stray)
    }

    /// Brings the store's complete checkpoints (every file, `_metadata` last), its shared
    /// files and its completion marker down into `dir`: those that count (see [`Lineage`]).
    /// Files already there are kept. Returns the ids of the checkpoints brought down.
    pub fn download_into(&self, dir: &Path) -> Result<Vec<u64>> {
        self.bring_into(dir, true)
    }

    /// [`Self::download_into`], the shared files (the pages of keyed state) left in the store,
    /// the state's primary copy, unless `pages`: a restore brings down the files it reads
    /// whole, and a lazy one reads pages from the store as they are used.
    fn bring_into(&self, dir: &Path, pages: bool) -> Result<Vec<u64>> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("cannot create checkpoint directory", dir, e))?;
        let lineage = self.lineage()?;
        let keys = self.store.list("").map_err(|e| self.failed("list", "", e))?;
        let (wanted, _) = self.sort_keys(&keys, &lineage);
        let complete: BTreeSet<u64> =
            wanted.keys().filter(|k| k.ends_with(METADATA_FILE)).filter_map(|k| checkpoint_of(k)).collect();
        let mut wanted: Vec<(&String, &String)> = wanted.iter().map(|(local, (_, key))| (local, key)).collect();
        // `_metadata` last, so a download cut short leaves no checkpoint that looks complete.
        wanted.sort_by_key(|(local, _)| local.ends_with(METADATA_FILE));
        for (local, key) in wanted {
            let to = dir.join(local);
            if to.exists() {
                continue;
            }
            if !pages && local.starts_with(SHARED_DIR) {
                self.left_in_store.lock().unwrap_or_else(|e| e.into_inner()).insert(local.clone(), key.clone());
                continue;
            }
            if let Some(parent) = to.parent() {
                std::fs::create_dir_all(parent).map_err(|e| Error::io("cannot create checkpoint folder", parent, e))?;
            }
            let part = PathBuf::from(format!("{}.part", to.display()));
            self.store.download(key, &part).map_err(|e| self.failed("download", key, e))?;
            std::fs::rename(&part, &to).map_err(|e| Error::io("cannot place downloaded checkpoint file", &to, e))?;
        }
        Ok(complete.into_iter().collect())
    }

    /// Puts checkpoint `metadata.checkpoint`, written and verified in `dir`, into the store:
    /// its task files, the shared files it wrote and those in `also` (files of a failed
    /// checkpoint it reused), then its `_metadata`, created only if no process created it
    /// first. On failure, what went up is removed again. Every key goes into the folders of
    /// the metadata's generation, so a process fenced after its check overwrites nothing its
    /// successor wrote.
    pub fn publish(&self, dir: &Path, metadata: &CheckpointMetadata, also: &HashSet<String>) -> Result<()> {
        let id = metadata.checkpoint;
        let generation = metadata.generation;
        let folder = format!("chk-{id}");
        let mut files: Vec<String> = metadata.tasks.iter().map(|t| format!("{folder}/{}", t.file)).collect();
        files.extend(
            metadata
                .shared
                .iter()
                .filter(|s| {
                    parse_shared_name(&s.file).is_some_and(|(written_by, _)| written_by == id) || also.contains(&s.file)
                })
                .map(|s| s.file.clone()),
        );
        let uploads: Vec<(String, String)> = files.into_iter().map(|f| (stored_key(&f, generation), f)).collect();
        let result = (|| {
            self.upload_all(dir, &uploads)?;
            let local = format!("{folder}/{METADATA_FILE}");
            let key = stored_key(&local, generation);
            let path = dir.join(&local);
            let bytes = std::fs::read(&path).map_err(|e| Error::io("cannot read checkpoint metadata", &path, e))?;
            if !self.store.create(&key, &bytes).map_err(|e| self.failed("create", &key, e))? {
                return Err(Error::Fenced(format!(
                    "checkpoint {id} in {} was completed by another process first (its {key} exists): two processes \
                     write to one checkpoint prefix",
                    self.location()
                )));
            }
            Ok(())
        })();
        if result.is_err() {
            for (key, _) in uploads {
                let _ = self.store.delete(&key);
            }
        }
        result
    }

    /// Puts every file of folder `from` (a savepoint: a flat folder) into the store under
    /// `key` (`<key>/<file>`), `_metadata` last, so that it is complete once that is there.
    pub fn upload_folder(&self, from: &Path, key: &str) -> Result<()> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(from)
            .map_err(|e| Error::io("cannot list the folder", from, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file())
            .collect();
        files.sort_by_key(|p| p.file_name().is_some_and(|n| n == METADATA_FILE));
        for f in files {
            let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            let k = format!("{}/{name}", key.trim_end_matches('/'));
            self.store.upload(&k, &f).map_err(|e| self.failed("upload", &k, e))?;
        }
        Ok(())
    }

    /// Brings every object under `key` (`<key>/<file>`) down into folder `to`, `_metadata`
    /// last. Returns how many there were.
    pub fn download_folder(&self, key: &str, to: &Path) -> Result<usize> {
        let prefix = if key.is_empty() { String::new() } else { format!("{}/", key.trim_end_matches('/')) };
        let mut keys = self.store.list(&prefix).map_err(|e| self.failed("list", &prefix, e))?;
        keys.retain(|k| !k[prefix.len()..].contains('/'));
        keys.sort_by_key(|k| k.ends_with(METADATA_FILE));
        std::fs::create_dir_all(to).map_err(|e| Error::io("cannot create the folder", to, e))?;
        for k in &keys {
            let path = to.join(&k[prefix.len()..]);
            self.store.download(k, &path).map_err(|e| self.failed("download", k, e))?;
        }
        Ok(keys.len())
    }

    /// Uploads each `(key, file)` of `uploads` (the file `dir/<file>` as object `key`), up to
    /// [`PARALLEL_UPLOADS`] at once: the files are independent, and one request at a time
    /// leaves the store's bandwidth idle.
    fn upload_all(&self, dir: &Path, uploads: &[(String, String)]) -> Result<()> {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let upload = || -> Result<()> {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((key, file)) = uploads.get(i) else { return Ok(()) };
                self.store.upload(key, &dir.join(file)).map_err(|e| self.failed("upload", key, e))?;
            }
        };
        std::thread::scope(|s| {
            let workers: Vec<_> = (0..PARALLEL_UPLOADS.min(uploads.len())).map(|_| s.spawn(upload)).collect();
            workers.into_iter().try_for_each(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
        })
    }

    /// Keeps the job identity written in `dir` in the store unless the store holds one, which
    /// then replaces it in `dir`: returns the identity both hold.
    pub fn keep_instance(&self, dir: &Path) -> Result<String> {
        let path = dir.join(INSTANCE_FILE);
        let mine = std::fs::read(&path).map_err(|e| Error::io("cannot read the job identity", &path, e))?;
        let created = self.store.create(INSTANCE_FILE, &mine).map_err(|e| self.failed("create", INSTANCE_FILE, e))?;
        if !created {
            self.store.download(INSTANCE_FILE, &path).map_err(|e| self.failed("download", INSTANCE_FILE, e))?;
        }
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io("cannot read the job identity", &path, e))?;
        Ok(text.trim().to_string())
    }

    /// Leaves the completion marker written in `dir` in the store too.
    pub fn publish_finished(&self, dir: &Path) -> Result<()> {
        self.store
            .upload(FINISHED_MARKER, &dir.join(FINISHED_MARKER))
            .map_err(|e| self.failed("upload", FINISHED_MARKER, e))
    }

    /// Deletes retired checkpoints `ids` (every object under their folders, whichever
    /// generation wrote it) and the shared files `shared` from the store. Best effort: what
    /// stays is garbage, never a checkpoint (a folder without `_metadata` is none); returns how
    /// many deletions failed.
    pub fn retire(&self, ids: &[u64], shared: &[String]) -> usize {
        let mut failed = 0;
        for id in ids {
            // `_metadata` first: from then on the rest is not a checkpoint, whatever stays.
            let mut keys = self.store.list(&format!("chk-{id}/")).unwrap_or_default();
            keys.sort_by_key(|k| !k.ends_with(METADATA_FILE));
            for key in keys {
                failed += self.store.delete(&key).is_err() as usize;
            }
        }
        if !shared.is_empty() {
            let names: HashSet<&str> = shared.iter().map(String::as_str).collect();
            let keys = self.store.list(&format!("{SHARED_DIR}/")).unwrap_or_default();
            for key in keys.iter().filter(|k| names.contains(local_key(k).0.as_str())) {
                failed += self.store.delete(key).is_err() as usize;
            }
        }
        failed
    }

    fn claims(&self) -> Result<Vec<u64>> {
        let keys = self.store.list(GENERATIONS).map_err(|e| self.failed("list", GENERATIONS, e))?;
        Ok(keys.iter().filter_map(|k| k.strip_prefix(GENERATIONS)?.parse().ok()).collect())
    }

    /// The lowest generation a process taking the directory over may claim: one above every
    /// claim made so far.
    pub fn next_generation(&self) -> Result<u64> {
        Ok(self.claims()?.into_iter().max().map_or(1, |g| g + 1))
    }

    /// Claims generation `generation` for `owner` (a description: process, host, job); fails
    /// when another process claimed it first. Older claims are deleted: the newest is the only
    /// one that fences.
    pub fn claim(&self, generation: u64, owner: &str) -> Result<()> {
        let key = format!("{GENERATIONS}{generation:020}");
        if !self.store.create(&key, owner.as_bytes()).map_err(|e| self.failed("create", &key, e))? {
            return Err(Error::InUse(format!(
                "another process took checkpoint prefix {} over at the same moment (it claimed generation \
                 {generation} first); one process at a time may own it",
                self.location()
            )));
        }
        for older in self.claims()?.into_iter().filter(|&g| g < generation) {
            let _ = self.store.delete(&format!("{GENERATIONS}{older:020}"));
        }
        Ok(())
    }

    /// Takes the prefix over as generation `generation`: claims it, brings the checkpoints that
    /// count down into `dir` (their shared files, the state, stay in the store until read),
    /// then records the newest of them as what this generation found,
    /// before anything is restored from them. Checkpoints the fenced owners published after
    /// the claim are deleted (best effort: they count for nothing). Returns the ids brought
    /// down.
    pub fn take_over(&self, dir: &Path, generation: u64, owner: &str) -> Result<Vec<u64>> {
        self.claim(generation, owner)?;
        let ids = self.bring_into(dir, false)?;
        let key = format!("{BASES}{generation:020}-{:020}", ids.last().copied().unwrap_or(0));
        if !self.store.create(&key, owner.as_bytes()).map_err(|e| self.failed("create", &key, e))? {
            return Err(Error::Fenced(format!(
                "{key} in checkpoint store {} exists: another process claimed generation {generation} too",
                self.location()
            )));
        }
        let lineage = self.lineage()?;
        if let Ok(keys) = self.store.list("") {
            let (_, stray) = self.sort_keys(&keys, &lineage);
            for key in stray {
                let _ = self.store.delete(&key);
            }
        }
        Ok(ids)
    }

    /// Fails with [`Error::Fenced`] when a process claimed a generation newer than
    /// `generation`.
    pub fn check(&self, generation: u64) -> Result<()> {
        match self.claims()?.into_iter().max() {
            Some(newest) if newest > generation => Err(Error::Fenced(format!(
                "a process with generation {newest} took checkpoint prefix {} over; this one (generation \
                 {generation}) stops without completing a checkpoint or committing output",
                self.location()
            ))),
            _ => Ok(()),
        }
    }
}

/// The checkpoint a key of the store belongs to (`chk-<n>/...`).
fn checkpoint_of(key: &str) -> Option<u64> {
    key.strip_prefix("chk-")?.split_once('/')?.0.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_newer_claim_fences_the_older_owner_and_a_checkpoint_is_completed_once() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemoryObjectStore::default());
        let (a, b) = (CheckpointMirror::new(Arc::clone(&store)), CheckpointMirror::new(Arc::clone(&store)));
        assert_eq!(a.next_generation().unwrap(), 1);
        a.claim(1, "a").unwrap();
        a.check(1).unwrap();
        assert!(b.claim(1, "b").is_err(), "a generation is claimed once");
        let g = b.next_generation().unwrap();
        assert_eq!(g, 2);
        b.claim(g, "b").unwrap();
        assert!(matches!(a.check(1), Err(Error::Fenced(_))), "the older owner sees the newer claim");
        b.check(2).unwrap();
        assert_eq!(store.list(GENERATIONS).unwrap().len(), 1, "older claims go");
    }

    /// Checkpoint `id` of generation `generation` (a task file and a shared file written for
    /// it, contents naming the writer) published from a working folder of its own.
    fn publish(mirror: &CheckpointMirror, id: u64, generation: u64) {
        let dir = tempfile::tempdir().unwrap();
        let written = |file: &str| {
            let path = dir.path().join(file);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, format!("{file} by {generation}")).unwrap();
        };
        let shared = format!("{SHARED_DIR}/chk-{id}-task-0.pages");
        written(&format!("chk-{id}/task-0.state"));
        written(&format!("chk-{id}/{METADATA_FILE}"));
        written(&shared);
        let digest = crate::checkpoint::storage::FileDigest { bytes: 1, crc32c: 0 };
        let mut metadata = super::super::test_metadata(
            id,
            "task-0.state".into(),
            digest,
            vec![crate::checkpoint::SharedFile { file: shared, bytes: 1, crc32c: 0 }],
        );
        metadata.generation = generation;
        mirror.publish(dir.path(), &metadata, &HashSet::new()).unwrap();
    }

    /// Who wrote the files of checkpoint `id` that a new process brings down.
    fn brought_down(mirror: &CheckpointMirror, id: u64) -> Option<String> {
        let dir = tempfile::tempdir().unwrap();
        mirror.download_into(dir.path()).unwrap();
        let task = std::fs::read_to_string(dir.path().join(format!("chk-{id}/task-0.state"))).ok()?;
        let shared = std::fs::read_to_string(dir.path().join(format!("{SHARED_DIR}/chk-{id}-task-0.pages"))).unwrap();
        assert_eq!(task.rsplit_once(" by ").unwrap().1, shared.rsplit_once(" by ").unwrap().1, "one writer");
        Some(task.rsplit_once(" by ").unwrap().1.to_string())
    }

    /// The fencing window in the store: generation 1 passed its check, paused, and published
    /// checkpoint 3 after generation 2 had taken over finding 2. Generation 1's checkpoint 3
    /// counts for nothing, overwrites nothing of generation 2's own checkpoint 3, and the next
    /// process takes generation 2's.
    #[test]
    fn a_checkpoint_published_after_a_newer_claim_counts_for_nothing() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemoryObjectStore::default());
        let (a, b, c) = (
            CheckpointMirror::new(Arc::clone(&store)),
            CheckpointMirror::new(Arc::clone(&store)),
            CheckpointMirror::new(Arc::clone(&store)),
        );
        a.take_over(tempfile::tempdir().unwrap().path(), 1, "a").unwrap();
        publish(&a, 1, 1);
        publish(&a, 2, 1);
        let working = tempfile::tempdir().unwrap();
        assert_eq!(b.take_over(working.path(), 2, "b").unwrap(), vec![1, 2]);
        // Paused between its check and its publish: the put goes through.
        publish(&a, 3, 1);
        assert!(matches!(a.check(1), Err(Error::Fenced(_))));
        assert_eq!(brought_down(&c, 3), None, "generation 1's checkpoint 3 came after generation 2 took over");
        assert_eq!(brought_down(&c, 2).as_deref(), Some("1"), "what generation 2 found counts");
        publish(&b, 3, 2);
        assert_eq!(brought_down(&c, 3).as_deref(), Some("2"));
        // A process taking over now finds generation 2's checkpoint 3, and removes the other.
        let working = tempfile::tempdir().unwrap();
        assert_eq!(c.take_over(working.path(), 3, "c").unwrap(), vec![1, 2, 3]);
        assert!(store.list("chk-3/g1/").unwrap().is_empty() && store.list("shared/g1/chk-3").unwrap().is_empty());
        assert_eq!(store.list("chk-3/g2/").unwrap().len(), 2);
    }

    #[test]
    fn keys_carry_their_generation() {
        assert_eq!(stored_key("chk-3/task-0.state", 7), "chk-3/g7/task-0.state");
        assert_eq!(stored_key("shared/chk-3-task-0.pages", 7), "shared/g7/chk-3-task-0.pages");
        assert_eq!(stored_key(FINISHED_MARKER, 7), FINISHED_MARKER);
        for local in ["chk-3/task-0.state", "shared/chk-3-task-0.pages", "chk-3/_metadata"] {
            assert_eq!(local_key(&stored_key(local, 7)), (local.to_string(), 7));
            assert_eq!(local_key(local), (local.to_string(), 0), "the round-3 layout: generation 0");
        }
    }

    #[test]
    fn a_folder_goes_up_and_comes_down_whole() {
        let mirror = CheckpointMirror::new(Arc::new(InMemoryObjectStore::default()));
        let (from, to) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        std::fs::write(from.path().join("task-0.state"), b"state").unwrap();
        std::fs::write(from.path().join(METADATA_FILE), b"meta").unwrap();
        mirror.upload_folder(from.path(), "savepoints/savepoint-3").unwrap();
        assert_eq!(mirror.download_folder("savepoints", to.path()).unwrap(), 0, "only the folder's own objects");
        let back = to.path().join("savepoint-3");
        assert_eq!(mirror.download_folder("savepoints/savepoint-3", &back).unwrap(), 2);
        assert_eq!(std::fs::read(back.join("task-0.state")).unwrap(), b"state");
        assert_eq!(std::fs::read(back.join(METADATA_FILE)).unwrap(), b"meta");
    }

    #[test]
    fn keys_name_their_checkpoint() {
        assert_eq!(checkpoint_of("chk-12/_metadata"), Some(12));
        assert_eq!(checkpoint_of("chk-12"), None);
        assert_eq!(checkpoint_of("shared/chk-3-task-0.pages"), None);
    }
}
