//! Checkpoint storage: `<dir>/chk-<n>/` with one state file per task and `_metadata`, written
//! last and atomically (temporary file, fsync, rename, fsync of the folder). A checkpoint
//! without a valid `_metadata` does not exist.
//!
//! Every file starts with a checksummed header that says what it is: magic `WEIR`, format
//! version, file kind, the job's fingerprint, the checkpoint id and the task index. Its payload
//! follows in blocks of at most 64 KiB, each with its length and CRC-32C, ended by a
//! terminator that carries the payload's total length. `_metadata` records every other file's
//! length and whole-file CRC-32C. A reader checks all of it and names the file and what is
//! wrong: a file that verifies but belongs to another task, checkpoint or job (copied over,
//! left from an earlier run) is damage like a flipped bit. A damaged checkpoint is never
//! restored (recovery falls back to an older one); a file that cannot be *read* (an I/O error)
//! is not damage, and stops whoever reads it instead.
//!
//! Incremental checkpoints keep the pages of keyed state in `<dir>/shared/`, one file per
//! checkpoint and task holding the pages that checkpoint wrote; a task file then lists, per
//! operator, chunks that are either inline bytes or a range of a shared file. `_metadata` names
//! every shared file the checkpoint needs with its length and checksum, and retention deletes a
//! shared file only when no retained checkpoint names it.
//!
//! The files by concept: [`format`] (the checksummed file format and atomic publication),
//! [`metadata`] (`_metadata` and the statistics), [`task_file`] (what a task file holds),
//! [`finished`] (the completion marker), [`remote`] (the directory kept in an object store as
//! well); this file is the directory's lifecycle (writing, finding, loading, retiring and
//! discarding checkpoints).
//!
//! May touch: `error`, `persist`, `snapshot`, `metrics`, `state` (scratch files of the page cache).

mod finished;
mod format;
mod metadata;
mod pages;
mod remote;
mod task_file;
#[cfg(test)]
mod tests;

pub use finished::{read_finished, write_finished, FinishedJob, FINISHED_MARKER};
pub use format::*;
pub use metadata::*;
pub(crate) use pages::open_stored;
pub use pages::PageCache;
pub use remote::{CheckpointMirror, InMemoryObjectStore, Lineage, ObjectStore, INSTANCE_FILE};
pub use task_file::*;

use std::collections::HashSet;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::persist::to_bytes;
use crate::snapshot::RestoredState;

/// The folder, under the checkpoint directory, of files that incremental checkpoints share.
pub const SHARED_DIR: &str = "shared";

/// A checkpoint folder tree. Files it writes carry the fingerprint of the job it was made
/// for ([`CheckpointStorage::for_job`]).
#[derive(Clone, Debug)]
pub struct CheckpointStorage {
    dir: PathBuf,
    fingerprint: String,
    /// The object store the directory is kept in as well, if any.
    mirror: Option<CheckpointMirror>,
}

/// A checkpoint read back and verified.
#[derive(Debug)]
pub struct LoadedCheckpoint {
    /// Its metadata.
    pub metadata: CheckpointMetadata,
    /// Its state.
    pub state: RestoredState,
}

/// What recovery found in a checkpoint directory: the newest checkpoint that verifies, and
/// the newer complete ones it had to skip as damaged (id, why), newest first.
#[derive(Debug, Default)]
pub struct RecoveryPoint {
    /// The checkpoint to restore.
    pub checkpoint: Option<LoadedCheckpoint>,
    /// Complete checkpoints newer than it that failed verification.
    pub skipped: Vec<(u64, String)>,
}

impl CheckpointStorage {
    /// Storage under `dir`, for reading (files it writes name no job).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        CheckpointStorage { dir: dir.into(), fingerprint: String::new(), mirror: None }
    }

    /// Storage under `dir` for the job with graph fingerprint `fingerprint`: every file it
    /// writes names that job.
    pub fn for_job(dir: impl Into<PathBuf>, fingerprint: &str) -> Self {
        CheckpointStorage { dir: dir.into(), fingerprint: header_fingerprint(fingerprint), mirror: None }
    }

    /// The storage of `config`'s directory for the job with graph fingerprint `fingerprint`,
    /// kept in `config`'s object store as well when it has one.
    pub fn of_config(config: &crate::checkpoint::CheckpointConfig, fingerprint: &str) -> Self {
        let mirror = config.store.clone().map(CheckpointMirror::new);
        CheckpointStorage { mirror, ..Self::for_job(&config.dir, fingerprint) }
    }

    /// The object store the directory is kept in as well, if any.
    pub fn mirror(&self) -> Option<&CheckpointMirror> {
        self.mirror.as_ref()
    }

    /// The root folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The fingerprint of the job whose files this storage writes.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// The folder of checkpoint `id`.
    pub fn checkpoint_dir(&self, id: u64) -> PathBuf {
        self.dir.join(format!("chk-{id}"))
    }

    /// Creates the folder of checkpoint `id`.
    pub fn prepare(&self, id: u64) -> Result<()> {
        let d = self.checkpoint_dir(id);
        std::fs::create_dir_all(&d).map_err(|e| Error::io("cannot create checkpoint folder", d, e))
    }

    /// Writes one task's state file; returns the file name and its digest.
    pub fn write_task(&self, id: u64, task: usize, content: &TaskFileContent) -> Result<(String, FileDigest)> {
        let name = format!("task-{task}.state");
        let path = self.checkpoint_dir(id).join(&name);
        let identity = FileIdentity::new(FileKind::TaskState, &self.fingerprint, id, Some(task));
        let digest = write_file(&path, &identity, &to_bytes(content))
            .map_err(|e| Error::io("cannot write task state", &path, e))?;
        Ok((name, digest))
    }

    /// The name (relative to the checkpoint directory) of the shared file in which task
    /// `task` keeps the pages it wrote for checkpoint `id`.
    pub fn shared_name(id: u64, task: usize) -> String {
        format!("{SHARED_DIR}/chk-{id}-task-{task}.pages")
    }

    /// The name of the shared file in which task `task` keeps a changelog base materialized
    /// in the background from its state as checkpoint `id` captured it.
    pub fn base_name(id: u64, task: usize) -> String {
        format!("{SHARED_DIR}/chk-{id}-task-{task}{BASE_SUFFIX}")
    }

    /// Starts the shared pages file of task `task` for checkpoint `id`.
    pub fn create_shared(&self, id: u64, task: usize) -> std::io::Result<ChecksummedWriter> {
        self.create_shared_named(&Self::shared_name(id, task), id, task)
    }

    /// Starts shared pages file `name` (a [`Self::shared_name`] or a [`Self::base_name`]) of
    /// task `task`, written for checkpoint `id`.
    pub fn create_shared_named(&self, name: &str, id: u64, task: usize) -> std::io::Result<ChecksummedWriter> {
        let path = self.dir.join(name);
        let folder = self.dir.join(SHARED_DIR);
        let identity = FileIdentity::new(FileKind::SharedPages, &self.fingerprint, id, Some(task));
        std::fs::create_dir_all(&folder)
            .and_then(|_| ChecksummedWriter::create(&path, &identity))
            .map_err(|e| std::io::Error::new(e.kind(), format!("cannot create {}: {e}", path.display())))
    }

    /// Reads shared file `name` (of task `task`, written for checkpoint `id`) back whole and
    /// checks it against `digest`: a base materialized in the background is verified so before
    /// any checkpoint refers to it.
    pub fn verify_shared(&self, name: &str, id: u64, task: usize, digest: &FileDigest) -> Result<()> {
        let expected = FileIdentity::new(FileKind::SharedPages, &self.fingerprint, id, Some(task));
        read_expected(&self.dir.join(name), &expected, Some(digest)).map(|_| ())
    }

    /// Puts task file `file` of checkpoint `from` into checkpoint `to`'s folder under the same
    /// name (a hard link; a copy where links are not supported): a part `to` reuses. The
    /// folder's entry becomes durable with `to`'s `_metadata` (its folder is synced then).
    pub fn link_task(&self, from: u64, to: u64, file: &str) -> Result<()> {
        let (src, dst) = (self.checkpoint_dir(from).join(file), self.checkpoint_dir(to).join(file));
        std::fs::hard_link(&src, &dst)
            .or_else(|_| std::fs::copy(&src, &dst).and_then(|_| File::open(&dst)?.sync_all()))
            .map_err(|e| Error::io(format!("cannot reuse {}", src.display()), &dst, e))
    }

    /// Makes checkpoint `metadata.checkpoint` exist: writes `_metadata` atomically.
    pub fn commit(&self, metadata: &CheckpointMetadata) -> Result<()> {
        write_metadata(&self.checkpoint_dir(metadata.checkpoint), metadata)
    }

    /// Puts committed and verified checkpoint `metadata.checkpoint` into the object store, if
    /// the directory is kept in one (see [`CheckpointMirror::publish`]); until then it exists
    /// here only.
    pub fn publish(&self, metadata: &CheckpointMetadata, also: &HashSet<String>) -> Result<()> {
        match &self.mirror {
            Some(m) => m.publish(&self.dir, metadata, also),
            None => Ok(()),
        }
    }

    /// What the process dying in the middle of writing file `file` (of `bytes` bytes) of
    /// checkpoint `id` leaves: its first half (fault injection).
    pub(crate) fn cut_in_half(&self, id: u64, file: &str, bytes: u64) {
        let path = self.checkpoint_dir(id).join(file);
        if let Ok(f) = std::fs::OpenOptions::new().write(true).open(path) {
            let _ = f.set_len(bytes / 2);
        }
    }

    /// What a crash between writing `_metadata` and renaming it into place leaves: only the
    /// temporary file (fault injection).
    pub(crate) fn write_unpublished_metadata(&self, metadata: &CheckpointMetadata) -> Result<()> {
        let identity = FileIdentity::new(FileKind::Metadata, &metadata.fingerprint, metadata.checkpoint, None);
        let dir = self.checkpoint_dir(metadata.checkpoint);
        write_json_unpublished(&dir, METADATA_FILE, &identity, metadata, "checkpoint metadata").map(|_| ())
    }
}

/// Reads and verifies a whole checkpoint or savepoint folder: every file's length, checksum
/// and identity. Shared files an incremental checkpoint refers to are read from the folder
/// above it (the checkpoint directory).
pub fn load_dir(dir: &Path) -> Result<LoadedCheckpoint> {
    load_dir_from(dir, None)
}

/// [`load_dir`], bringing shared files a take-over left in `mirror` down as they are read.
fn load_dir_from(dir: &Path, mirror: Option<&CheckpointMirror>) -> Result<LoadedCheckpoint> {
    let metadata = read_metadata(dir)?;
    let mut state = RestoredState::new(metadata.checkpoint);
    let root = dir.parent().unwrap_or(dir);
    let mut shared = SharedFiles::of(root, &metadata, mirror);
    for t in &metadata.tasks {
        let path = dir.join(&t.file);
        for (op, subtask, bytes) in read_task_parts(&path, &task_identity(&metadata, t), &t.digest(), &mut shared)? {
            state.insert(op, subtask as usize, bytes);
        }
    }
    Ok(LoadedCheckpoint { metadata, state })
}

/// [`load_dir`], the pages of keyed state left where they lie (a lazy restore): task files
/// are read and verified whole, shared files only opened and their headers checked; each
/// page is checked against its own checksum when a lookup first reaches it. A shared file
/// a page of which failed that check in this process is read whole instead. A shared file a
/// take-over left in `mirror`'s store is read there, a block at a time, through `cache`.
pub(crate) fn load_dir_lazily(
    dir: &Path,
    mirror: Option<&CheckpointMirror>,
    cache: &Arc<PageCache>,
) -> Result<LoadedCheckpoint> {
    let metadata = read_metadata(dir)?;
    let mut state = RestoredState::new(metadata.checkpoint);
    let root = dir.parent().unwrap_or(dir);
    let mut files = PageFiles::of(root, &metadata, mirror, cache);
    for t in &metadata.tasks {
        let path = dir.join(&t.file);
        for (op, subtask, part) in read_task_parts_lazily(&path, &task_identity(&metadata, t), &t.digest(), &mut files)?
        {
            state.insert_lazy(op, subtask as usize, part.inline, part.pages);
        }
    }
    Ok(LoadedCheckpoint { metadata, state })
}

impl CheckpointStorage {
    /// Removes what an aborted checkpoint `id` wrote: its folder and its shared files.
    pub fn discard(&self, id: u64) {
        self.discard_sparing(id, &HashSet::new());
    }

    /// Removes what checkpoint `id`, which never completed, wrote: its folder and its shared
    /// files but those in `spare` (a later checkpoint that resumed it refers to them). Returns
    /// the shared files deleted.
    pub fn discard_sparing(&self, id: u64, spare: &HashSet<String>) -> Vec<String> {
        self.remove_folder(id);
        let prefix = format!("chk-{id}-task-");
        let mut deleted = Vec::new();
        if let Ok(entries) = std::fs::read_dir(self.dir.join(SHARED_DIR)) {
            for e in entries.filter_map(|e| e.ok()) {
                let Some(name) = e.file_name().to_str().map(|n| format!("{SHARED_DIR}/{n}")) else { continue };
                // A base materialized beside it is not its own: its task's page index removes
                // it when no chain stands on it, retention once no checkpoint names it.
                let own = name[SHARED_DIR.len() + 1..].starts_with(&prefix) && !is_base_name(&name);
                if own && !spare.contains(&name) && std::fs::remove_file(e.path()).is_ok() {
                    deleted.push(name);
                }
            }
        }
        deleted
    }

    /// Removes checkpoint `id`'s folder only (its shared files may be referred to by others).
    pub fn remove_folder(&self, id: u64) {
        let _ = std::fs::remove_dir_all(self.checkpoint_dir(id));
    }

    /// Ids of every `chk-<n>` folder, ascending (complete or not).
    pub fn list(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = std::fs::read_dir(&self.dir)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok())
                    .filter_map(|e| {
                        e.file_name().to_str().and_then(|n| n.strip_prefix("chk-")).and_then(|n| n.parse().ok())
                    })
                    .collect()
            })
            .unwrap_or_default();
        ids.sort_unstable();
        ids
    }

    /// Whether checkpoint `id` completed (has its `_metadata`; not yet verified).
    pub fn is_complete(&self, id: u64) -> bool {
        self.checkpoint_dir(id).join(METADATA_FILE).exists()
    }

    /// Reads only the metadata of checkpoint `id`.
    pub fn metadata(&self, id: u64) -> Result<CheckpointMetadata> {
        let m = read_metadata(&self.checkpoint_dir(id))?;
        if m.checkpoint != id {
            return Err(Error::Corrupt(format!(
                "{}: misplaced file: it describes checkpoint {}, in the folder of checkpoint {id}",
                self.checkpoint_dir(id).join(METADATA_FILE).display(),
                m.checkpoint
            )));
        }
        Ok(m)
    }

    /// Reads and verifies checkpoint `id` completely.
    pub fn load(&self, id: u64) -> Result<LoadedCheckpoint> {
        self.metadata(id)?;
        load_dir_from(&self.checkpoint_dir(id), self.mirror.as_ref())
    }

    /// Reads back every file checkpoint `id` wrote and checks it against `_metadata` (length,
    /// checksum, identity, every block), and that the shared files it refers to from earlier
    /// checkpoints are there at their recorded length. Done before a checkpoint's transactions
    /// commit, so a checkpoint that would not restore is never the one they are committed
    /// under. Returns the metadata.
    pub fn verify(&self, id: u64) -> Result<CheckpointMetadata> {
        self.verify_including(id, &HashSet::new())
    }

    /// [`CheckpointStorage::verify`], reading the shared files in `whole` back whole too:
    /// files of a failed checkpoint whose kept parts checkpoint `id` reused, which no completed
    /// checkpoint verified yet.
    pub fn verify_including(&self, id: u64, whole: &HashSet<String>) -> Result<CheckpointMetadata> {
        let metadata = self.metadata(id)?;
        let dir = self.checkpoint_dir(id);
        for t in &metadata.tasks {
            read_expected(&dir.join(&t.file), &task_identity(&metadata, t), Some(&t.digest()))?;
        }
        for s in &metadata.shared {
            let path = self.dir.join(&s.file);
            let digest = s.digest();
            match parse_shared_name(&s.file) {
                Some((written_by, task)) if written_by == id || whole.contains(&s.file) => {
                    let expected =
                        FileIdentity::new(FileKind::SharedPages, &metadata.fingerprint, written_by, Some(task));
                    read_expected(&path, &expected, Some(&digest))?;
                }
                // Left in the store by a take-over: verified whole when the checkpoint that
                // wrote it completed, and there since.
                Some(_)
                    if !path.exists() && self.mirror.as_ref().is_some_and(|m| m.left_in_store(&s.file).is_some()) => {}
                Some(_) => {
                    // Verified whole when the checkpoint that wrote it completed.
                    let len = std::fs::metadata(&path).map_err(|e| match e.kind() {
                        std::io::ErrorKind::NotFound => corrupt(&path, "missing (a checkpoint refers to it)"),
                        _ => Error::io("cannot read checkpoint file", &path, e),
                    })?;
                    if len.len() != s.bytes {
                        return Err(corrupt(
                            &path,
                            format!("{} bytes, where _metadata recorded {}", len.len(), s.bytes),
                        ));
                    }
                }
                None => return Err(Error::Corrupt(format!("'{}' is not the name of a shared state file", s.file))),
            }
        }
        Ok(metadata)
    }

    /// Copies complete checkpoint `id` into `<target>/savepoint-<id>/` as a savepoint (every
    /// file synced, the metadata last). Chunks in shared files are copied into the task files,
    /// so the savepoint refers to nothing outside its folder.
    pub fn copy_to_savepoint(&self, id: u64, target: &Path) -> Result<PathBuf> {
        let from = self.checkpoint_dir(id);
        let mut metadata = self.metadata(id)?;
        let to = target.join(format!("savepoint-{id}"));
        std::fs::create_dir_all(&to).map_err(|e| Error::io("cannot create savepoint folder", &to, e))?;
        let source = metadata.clone();
        let mut shared = SharedFiles::of(&self.dir, &source, self.mirror.as_ref());
        for t in &mut metadata.tasks {
            let identity = task_identity(&source, t);
            let parts = read_task_parts(&from.join(&t.file), &identity, &t.digest(), &mut shared)?;
            let dst = to.join(&t.file);
            let digest = write_file(&dst, &identity, &to_bytes(&TaskFileContent::inline(parts)))
                .map_err(|e| Error::io("cannot write savepoint state", &dst, e))?;
            (t.bytes, t.crc32c) = (digest.bytes, digest.crc32c);
        }
        metadata.kind = "savepoint".into();
        metadata.shared.clear();
        write_metadata(&to, &metadata)?;
        Ok(to)
    }

    /// The format version `_metadata` of checkpoint `id` declares, if it has a weir header
    /// (read from the header alone: a checkpoint of another version is not damage but a
    /// different program's, and must not be skipped as if it were).
    ///
    /// A header of this version whose version field alone was damaged (its checksum holds
    /// once the field reads this version) is this version's, and damaged: recovery must fall
    /// back past it, not refuse the directory as another weir's.
    pub fn format_version(&self, id: u64) -> Option<u32> {
        let mut header = [0u8; HEADER_BYTES];
        let mut f = File::open(self.checkpoint_dir(id).join(METADATA_FILE)).ok()?;
        let read = f.read(&mut header).ok()?;
        if read < 8 || header[..4] != MAGIC {
            return None;
        }
        let version = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
        if version != FORMAT_VERSION && read == HEADER_BYTES {
            let mut current = header;
            current[4..8].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
            let crc = u32::from_le_bytes(header[44..48].try_into().expect("4 bytes"));
            if crc32c::crc32c(&current[..44]) == crc {
                return Some(FORMAT_VERSION);
            }
        }
        Some(version)
    }

    /// The newest checkpoint that verifies, and the newer complete ones skipped as damaged.
    /// A file that cannot be read (an I/O error, not damage) is an error: falling back past a
    /// checkpoint that may be intact would retract its committed output.
    pub fn latest_valid(&self) -> Result<RecoveryPoint> {
        self.latest_valid_with(&|_| {})
    }

    /// [`CheckpointStorage::latest_valid`], calling `before_load` with each checkpoint's id
    /// before reading it (to say what is being restored).
    pub fn latest_valid_with(&self, before_load: &dyn Fn(u64)) -> Result<RecoveryPoint> {
        self.latest_valid_reading(before_load, None)
    }

    /// [`Self::latest_valid_with`], the pages of keyed state read lazily with a `lazy` cache
    /// (for pages in the object store; [`load_dir_lazily`]).
    pub(crate) fn latest_valid_reading(
        &self,
        before_load: &dyn Fn(u64),
        lazy: Option<&Arc<PageCache>>,
    ) -> Result<RecoveryPoint> {
        let mut found = RecoveryPoint::default();
        for id in self.list().into_iter().rev() {
            if !self.is_complete(id) {
                // Never completed (crashed or aborted mid-way): not a checkpoint at all.
                continue;
            }
            before_load(id);
            let loaded = match lazy {
                Some(cache) => self
                    .metadata(id)
                    .and_then(|_| load_dir_lazily(&self.checkpoint_dir(id), self.mirror.as_ref(), cache)),
                None => self.load(id),
            };
            match loaded {
                Ok(c) => {
                    found.checkpoint = Some(c);
                    return Ok(found);
                }
                Err(e @ Error::Corrupt(_)) => found.skipped.push((id, e.to_string())),
                Err(e) => return Err(e),
            }
        }
        Ok(found)
    }

    /// Keeps the newest `keep` of `completed` and deletes the rest, then the shared files the
    /// deleted checkpoints referred to that neither a retained checkpoint nor `in_use` (what
    /// checkpoints in progress refer to) names. Returns the shared files deleted.
    pub fn retain(&self, completed: &mut Vec<u64>, keep: usize, in_use: &HashSet<String>) -> Vec<String> {
        completed.sort_unstable();
        let mut candidates = HashSet::new();
        let mut retired = Vec::new();
        while completed.len() > keep {
            let old = completed.remove(0);
            retired.push(old);
            if let Ok(m) = self.metadata(old) {
                candidates.extend(m.shared.into_iter().map(|s| s.file));
            }
            // Its own shared files may be needed by newer checkpoints: only the folder goes.
            let _ = std::fs::remove_dir_all(self.checkpoint_dir(old));
        }
        let deleted = self.unneeded_shared(candidates, completed, in_use);
        for f in &deleted {
            let _ = std::fs::remove_file(self.dir.join(f));
        }
        if let Some(m) = &self.mirror {
            m.retire(&retired, &deleted);
        }
        deleted
    }

    /// Which of `candidates` neither a checkpoint in `completed` nor `in_use` names, sorted:
    /// none when what a retained checkpoint needs is unknown.
    fn unneeded_shared(&self, candidates: HashSet<String>, completed: &[u64], in_use: &HashSet<String>) -> Vec<String> {
        if candidates.is_empty() {
            return Vec::new();
        }
        let mut needed = in_use.clone();
        for &id in completed {
            match self.metadata(id) {
                Ok(m) => needed.extend(m.shared.into_iter().map(|s| s.file)),
                Err(_) => return Vec::new(),
            }
        }
        let mut deleted: Vec<String> = candidates.into_iter().filter(|f| !needed.contains(f)).collect();
        deleted.sort();
        deleted
    }

    /// Deletes shared files no complete checkpoint refers to (left by checkpoints that never
    /// completed, e.g. before a crash). Call it only while no checkpoint is being written.
    /// Deletes nothing when some checkpoint's metadata cannot be read.
    pub fn remove_unreferenced_shared(&self) -> Vec<String> {
        let folder = self.dir.join(SHARED_DIR);
        let Ok(entries) = std::fs::read_dir(&folder) else { return Vec::new() };
        let mut needed = HashSet::new();
        for id in self.list() {
            if !self.is_complete(id) {
                continue;
            }
            match self.metadata(id) {
                Ok(m) => needed.extend(m.shared.into_iter().map(|s| s.file)),
                Err(_) => return Vec::new(),
            }
        }
        let mut deleted = Vec::new();
        for e in entries.filter_map(|e| e.ok()) {
            let Some(name) = e.file_name().to_str().map(|n| format!("{SHARED_DIR}/{n}")) else { continue };
            if !needed.contains(&name) && std::fs::remove_file(e.path()).is_ok() {
                deleted.push(name);
            }
        }
        deleted.sort();
        if let Some(m) = &self.mirror {
            m.retire(&[], &deleted);
        }
        deleted
    }
}

/// Metadata of a one-task checkpoint of a job without a fingerprint, for tests.
#[cfg(test)]
pub(crate) fn test_metadata(id: u64, file: String, digest: FileDigest, shared: Vec<SharedFile>) -> CheckpointMetadata {
    CheckpointMetadata {
        format: FORMAT_VERSION,
        job: "j".into(),
        fingerprint: String::new(),
        checkpoint: id,
        kind: "checkpoint".into(),
        mode: "exactly-once".into(),
        generation: 1,
        completed_unix_ms: 0,
        stats: CheckpointStats::default(),
        tasks: vec![TaskFile {
            task: 0,
            name: "t".into(),
            file,
            bytes: digest.bytes,
            crc32c: digest.crc32c,
            checkpoint: None,
        }],
        shared,
        outputs: Vec::new(),
    }
}
