//! Who owns a checkpoint directory: `<dir>/_lock`, held with an exclusive advisory lock
//! (`flock`) for the job's life, names the owning process and its **generation** (a fencing
//! token one higher than every checkpoint already in the directory). A second process on the
//! same directory is refused at start, naming the process that holds it; the kernel drops the
//! lock of a process that died, and the next one takes it over with a note.
//!
//! The lock alone cannot stop a process that lost the directory some other way (its lock file
//! deleted and re-created by another process, a network file system that does not honour
//! `flock`): so before every checkpoint completion and every sink commit the owner reads the
//! lock file back and goes on only while it still names this process and generation; the
//! generation is also written into each checkpoint's `_metadata`. A directory kept in an
//! object store is fenced there as well: the generation is claimed in the store, and the
//! check fails once a newer claim exists (`storage::remote`).
//!
//! A `flock` belongs to an open file, and a child process this one is starting holds a copy
//! of every open file until it has started its program (even with close-on-exec): closing the
//! file alone would leave the lock held for that instant, so dropping the lock unlocks first.
//!
//! May touch: `checkpoint::storage`, `context` (the output ownership it answers), `error`.

use std::fs::{File, OpenOptions};
use std::io::{Seek, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::storage::{
    encode_file, read_file, CheckpointMirror, CheckpointStorage, FileIdentity, FileKind, INSTANCE_FILE,
};
use crate::error::{Error, Result};

/// The lock file's name in a checkpoint directory.
pub const LOCK_FILE: &str = "_lock";

/// What the lock file says.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
struct LockRecord {
    pid: u32,
    generation: u64,
    job: String,
}

/// The lock of one checkpoint directory, held until dropped.
#[derive(Debug)]
pub struct DirectoryLock {
    dir: PathBuf,
    path: PathBuf,
    /// Holds the `flock`, released when the lock is dropped.
    file: File,
    record: LockRecord,
    /// The object store the directory is kept in, whose claims fence this process too.
    mirror: Option<CheckpointMirror>,
    /// The directory's job identity ([`INSTANCE_FILE`]).
    instance: String,
}

fn read_record(path: &Path) -> Result<LockRecord> {
    let (_, json) = read_file(path, FileKind::Lock)?;
    serde_json::from_slice(&json).map_err(|e| Error::Corrupt(format!("{}: unreadable lock: {e}", path.display())))
}

/// The newest generation among `storage`'s complete checkpoints (0 without one).
fn newest_generation(storage: &CheckpointStorage) -> u64 {
    storage
        .list()
        .into_iter()
        .filter(|&id| storage.is_complete(id))
        .filter_map(|id| storage.metadata(id).ok())
        .map(|m| m.generation)
        .max()
        .unwrap_or(0)
}

/// The directory's lock file, opened and locked: refused, naming the process that holds it,
/// while another holds it.
fn lock_file(dir: &Path) -> Result<(PathBuf, File)> {
    let path = dir.join(LOCK_FILE);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| Error::io("cannot open the checkpoint directory's lock", &path, e))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let holder = match read_record(&path) {
                Ok(r) => format!("process {} (job '{}')", r.pid, r.job),
                Err(_) => "another process".to_string(),
            };
            return Err(Error::InUse(format!(
                "checkpoint directory {} is in use by {holder}: one process at a time may own it (its lock is {}); \
                 wait for that process to end, stop it, or choose another directory",
                dir.display(),
                path.display()
            )));
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(Error::io("cannot lock the checkpoint directory", &path, e));
        }
    }
    Ok((path, file))
}

impl DirectoryLock {
    /// Takes the lock of `storage`'s directory (created if missing) for job `job`, or refuses
    /// with an error naming the directory and the process that holds it. Returns notes: the
    /// lock of a process no longer running was taken over; checkpoints came down from the
    /// object store the directory is kept in.
    pub fn acquire(storage: &CheckpointStorage, job: &str) -> Result<(DirectoryLock, Vec<String>)> {
        let dir = storage.dir().to_path_buf();
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("cannot create checkpoint directory", &dir, e))?;
        let (path, file) = lock_file(&dir)?;
        // From here on, dropping the lock (also on an error below) releases it.
        let mut lock = DirectoryLock {
            dir: dir.clone(),
            path: path.clone(),
            file,
            record: LockRecord { pid: std::process::id(), generation: 0, job: job.to_string() },
            mirror: None,
            instance: String::new(),
        };
        let empty = lock.file.metadata().map(|m| m.len() == 0).unwrap_or(false);
        let previous = if empty { None } else { Some(read_record(&path)) };
        let pid = lock.record.pid;
        let mut notes: Vec<String> = match &previous {
            Some(Ok(r)) if r.pid != pid => Some(format!(
                "took over checkpoint directory {} from process {} (job '{}'), which is no longer running",
                dir.display(),
                r.pid,
                r.job
            )),
            Some(Err(e)) => {
                Some(format!("the lock of checkpoint directory {} was unreadable ({e}); taken over", dir.display()))
            }
            _ => None,
        }
        .into_iter()
        .collect();
        // Higher than every generation this directory has seen, so a process that still
        // thinks it owns the directory can tell it lost it.
        let last = previous.and_then(|r| r.ok()).map_or(0, |r| r.generation);
        lock.record.generation = newest_generation(storage).max(last) + 1;
        if let Some(m) = storage.mirror() {
            notes.push(lock.claim_store(m)?);
        }
        lock.instance = instance_of(&dir, lock.mirror.as_ref())?;
        let json = serde_json::to_vec(&lock.record).map_err(|e| Error::Corrupt(e.to_string()))?;
        let bytes = encode_file(&FileIdentity::new(FileKind::Lock, storage.fingerprint(), 0, None), &json);
        (|| {
            let mut f = &lock.file;
            f.set_len(0)?;
            f.rewind()?;
            f.write_all(&bytes)?;
            f.sync_all()
        })()
        .map_err(|e| Error::io("cannot write the checkpoint directory's lock", &path, e))?;
        super::storage::sync_folder(&dir)?;
        Ok((lock, notes))
    }

    /// Claims the object store the directory is kept in (its claims fence processes on other
    /// machines, which the file lock cannot see) and brings its checkpoints down: claimed
    /// before they come down (see `storage::remote`). Returns the note saying so.
    fn claim_store(&mut self, m: &CheckpointMirror) -> Result<String> {
        self.record.generation = self.record.generation.max(m.next_generation()?);
        let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
        let owner = format!("process {} on {} (job '{}')", self.record.pid, host.trim(), self.record.job);
        // The working copy is the store's, whole: what an earlier process here left (a
        // checkpoint it published after it was fenced, files it never published) must not
        // be restored from, nor stand in for the store's file of the same name.
        clear_except(&self.dir, LOCK_FILE)?;
        let ids = m.take_over(&self.dir, self.record.generation, &owner)?;
        self.mirror = Some(m.clone());
        Ok(format!(
            "checkpoint store {}: {} complete checkpoint(s) brought down into {}",
            m.location(),
            ids.len(),
            self.dir.display()
        ))
    }

    /// The identity of the job the directory belongs to: random, made when it was first used
    /// (see [`crate::TaskContext::job_instance`]).
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// This owner's generation (written into each `_metadata`).
    pub fn generation(&self) -> u64 {
        self.record.generation
    }

    /// Whether this process still owns the directory: the lock file must still name it and
    /// its generation. Called before every checkpoint completion and sink commit.
    pub fn check(&self) -> Result<()> {
        let lost = |why: String| {
            Err(Error::Fenced(format!(
                "{why}; this process ({}, generation {}) stops without completing a checkpoint or committing output in {}",
                self.record.pid,
                self.record.generation,
                self.dir.display()
            )))
        };
        match read_record(&self.path) {
            Ok(r) if r == self.record => match &self.mirror {
                Some(m) => m.check(self.record.generation),
                None => Ok(()),
            },
            Ok(r) => lost(format!(
                "process {} (job '{}', generation {}) took over the directory",
                r.pid, r.job, r.generation
            )),
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                lost(format!("its lock file {} was removed", self.path.display()))
            }
            Err(e) => lost(format!("its lock cannot be read back ({e})")),
        }
    }
}

/// The identity kept in `dir` (brought down from the store already, if it is kept in one), or
/// a new one, kept there and put into the store.
fn instance_of(dir: &Path, mirror: Option<&CheckpointMirror>) -> Result<String> {
    let path = dir.join(INSTANCE_FILE);
    let valid = |s: &str| s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit());
    match std::fs::read_to_string(&path) {
        Ok(text) if valid(text.trim()) => return Ok(text.trim().to_string()),
        Ok(text) => {
            return Err(Error::Corrupt(format!(
                "{} does not hold a job identity (16 hexadecimal digits) but {:?}: it names the job's transactions, \
                 so it is not replaced; restore it, or start the job in a new checkpoint directory",
                path.display(),
                text.chars().take(40).collect::<String>()
            )))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io("cannot read the job identity", &path, e)),
    }
    // OS-seeded keys make each `RandomState` a fresh random function.
    use std::hash::BuildHasher;
    let nanos = crate::context::wall::unix_nanos();
    let instance =
        format!("{:016x}", std::collections::hash_map::RandomState::new().hash_one((nanos, std::process::id())));
    std::fs::write(&path, &instance).map_err(|e| Error::io("cannot write the job identity", &path, e))?;
    match mirror {
        // Created only if absent: the store's is the directory's (brought down over this one).
        Some(m) => m.keep_instance(dir),
        None => Ok(instance),
    }
}

/// Removes everything in `dir` but `keep`.
fn clear_except(dir: &Path, keep: &str) -> Result<()> {
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io("cannot list the working folder", dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io("cannot list the working folder", dir, e))?;
        if entry.file_name() == keep {
            continue;
        }
        let path = entry.path();
        let removed = if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
        removed.map_err(|e| Error::io("cannot clear the working folder", &path, e))?;
    }
    Ok(())
}

impl Drop for DirectoryLock {
    fn drop(&mut self) {
        // Unlocked, not only closed: a child process being started may still hold a copy of
        // the open file (see the module doc). An error leaves it to the close that follows.
        let _ = self.file.unlock();
        // A directory kept in an object store: the folder here was this process's working
        // copy, and the store has everything the next process needs (a process killed leaves
        // its copy, removed by the next one to start here: `CheckpointConfig::in_store`).
        if self.mirror.is_some() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The lock is what says whether this process still owns the job's output.
impl crate::context::OutputOwnership for DirectoryLock {
    fn check(&self) -> Result<()> {
        DirectoryLock::check(self)
    }
    fn instance(&self) -> &str {
        &self.instance
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_owner_at_a_time_and_a_lost_lock_is_noticed() {
        let dir = tempfile::tempdir().unwrap();
        let storage = CheckpointStorage::for_job(dir.path(), "0123456789abcdef");
        let (first, notes) = DirectoryLock::acquire(&storage, "a").unwrap();
        assert!(notes.is_empty());
        assert_eq!(first.generation(), 1);
        first.check().unwrap();
        let err = DirectoryLock::acquire(&storage, "b").unwrap_err().to_string();
        assert!(err.contains(&dir.path().display().to_string()), "{err}");
        assert!(err.contains(&format!("process {}", std::process::id())), "{err}");
        // Released when dropped; the next owner counts one generation higher.
        drop(first);
        let (second, _) = DirectoryLock::acquire(&storage, "b").unwrap();
        assert_eq!(second.generation(), 2);
        // Its lock file removed, then taken by another process: the owner finds out before its
        // next commit.
        let path = dir.path().join(LOCK_FILE);
        std::fs::remove_file(&path).unwrap();
        let err = second.check().unwrap_err();
        assert!(matches!(err, Error::Fenced(_)) && !err.is_retryable() && err.to_string().contains("removed"), "{err}");
        let other = LockRecord { pid: 1, generation: 3, job: "c".into() };
        let identity = FileIdentity::new(FileKind::Lock, storage.fingerprint(), 0, None);
        std::fs::write(&path, encode_file(&identity, &serde_json::to_vec(&other).unwrap())).unwrap();
        let err = second.check().unwrap_err().to_string();
        assert!(err.contains("process 1 (job 'c', generation 3) took over"), "{err}");
        // A damaged lock of a process that is gone is taken over, with a note.
        drop(second);
        std::fs::write(dir.path().join(LOCK_FILE), b"garbage").unwrap();
        let (_fourth, notes) = DirectoryLock::acquire(&storage, "d").unwrap();
        assert!(notes[0].contains("unreadable"));
    }
}
