//! The checkpoint directory kept in an object store (S3 and its kind), so that it outlives the
//! machine: a process started anywhere resumes from it. The local folder is then this
//! process's working copy: checkpoints are written and verified there as always, and go up
//! when they complete; at start the store's checkpoints come down into it.
//!
//! Under the store's prefix the layout is the directory's own: `chk-<n>/<task files>`,
//! `chk-<n>/_metadata`, `shared/<pages>`, `_finished`, and `_generations/<g>`, one claim per
//! process that took the directory over.
//!
//! A checkpoint exists in the store once its `_metadata` does, and that object is created with
//! a conditional put that fails when the key exists: of two processes completing checkpoint
//! *n* on one prefix, one succeeds. Every other file goes up before it. Fencing: a process
//! claims generation *g*, one above every claim and every checkpoint's generation, by creating
//! `_generations/<g>`; before each checkpoint's completion and each sink commit it lists the
//! claims and stops (`Error::Fenced`) when a newer one exists. A process that started later
//! has claimed before it listed the checkpoints, so whatever an older one completed before
//! seeing that claim is a checkpoint the newer one restores.
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
}

const GENERATIONS: &str = "_generations/";

/// Files of one checkpoint uploaded at once.
const PARALLEL_UPLOADS: usize = 8;

/// The remote side of a checkpoint directory: what goes up, comes down, and who may write.
#[derive(Debug, Clone)]
pub struct CheckpointMirror {
    store: Arc<dyn ObjectStore>,
}

impl CheckpointMirror {
    /// The directory kept in `store`.
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        CheckpointMirror { store }
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

    /// Brings the store's complete checkpoints (every file, `_metadata` last), its shared
    /// files and its completion marker down into `dir`. Files already there are kept. Returns
    /// the ids of the checkpoints brought down.
    pub fn download_into(&self, dir: &Path) -> Result<Vec<u64>> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("cannot create checkpoint directory", dir, e))?;
        let keys = self.store.list("").map_err(|e| self.failed("list", "", e))?;
        let complete: BTreeSet<u64> =
            keys.iter().filter_map(|k| checkpoint_of(k).filter(|_| k.ends_with(METADATA_FILE))).collect();
        let shared = format!("{SHARED_DIR}/");
        let mut wanted: Vec<&String> = keys
            .iter()
            .filter(|k| {
                k.as_str() == FINISHED_MARKER
                    || k.starts_with(&shared)
                    || checkpoint_of(k).is_some_and(|id| complete.contains(&id))
            })
            .collect();
        // `_metadata` last, so a download cut short leaves no checkpoint that looks complete.
        wanted.sort_by_key(|k| k.ends_with(METADATA_FILE));
        for key in wanted {
            let to = dir.join(key);
            if to.exists() {
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
    /// first. On failure, what went up is removed again.
    pub fn publish(&self, dir: &Path, metadata: &CheckpointMetadata, also: &HashSet<String>) -> Result<()> {
        let id = metadata.checkpoint;
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
        let result = (|| {
            self.upload_all(dir, &files)?;
            let key = format!("{folder}/{METADATA_FILE}");
            let path = dir.join(&key);
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
            for key in files {
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

    /// Uploads `keys` (each the file `dir/<key>`), up to [`PARALLEL_UPLOADS`] at once: the
    /// files are independent, and one request at a time leaves the store's bandwidth idle.
    fn upload_all(&self, dir: &Path, keys: &[String]) -> Result<()> {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let upload = || -> Result<()> {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(key) = keys.get(i) else { return Ok(()) };
                self.store.upload(key, &dir.join(key)).map_err(|e| self.failed("upload", key, e))?;
            }
        };
        std::thread::scope(|s| {
            let workers: Vec<_> = (0..PARALLEL_UPLOADS.min(keys.len())).map(|_| s.spawn(upload)).collect();
            workers.into_iter().try_for_each(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
        })
    }

    /// Leaves the completion marker written in `dir` in the store too.
    pub fn publish_finished(&self, dir: &Path) -> Result<()> {
        self.store
            .upload(FINISHED_MARKER, &dir.join(FINISHED_MARKER))
            .map_err(|e| self.failed("upload", FINISHED_MARKER, e))
    }

    /// Deletes retired checkpoints `ids` (every object under their folders) and the shared
    /// files `shared` from the store. Best effort: what stays is garbage, never a checkpoint
    /// (a folder without `_metadata` is none); returns how many deletions failed.
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
        for f in shared {
            failed += self.store.delete(f).is_err() as usize;
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
            return Err(Error::config(format!(
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
        let (a, b) = (CheckpointMirror::new(store.clone()), CheckpointMirror::new(store.clone()));
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
