//! The contents of `_metadata`: the checkpoint's identity, its statistics, every task file
//! and shared file it needs with their lengths and checksums, and where its sinks write; read
//! back and checked against its header.
//!
//! May touch: `error`, `metrics` (the statistics).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

use super::*;

// The statistics belong to `metrics` (a job's report carries them); `_metadata` records them.
pub use crate::metrics::{ChannelAlignment, CheckpointStats, PartReuse};

/// One task's file in a checkpoint.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TaskFile {
    /// The task's index in the job's plan.
    pub task: usize,
    /// The task's name.
    pub name: String,
    /// The file, relative to the checkpoint's folder.
    pub file: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// CRC-32C of the whole file.
    pub crc32c: u32,
    /// A part this checkpoint reused from a failed one: the checkpoint the file was written
    /// for (its header names that one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<u64>,
}

impl TaskFile {
    /// The file's length and checksum.
    pub fn digest(&self) -> FileDigest {
        FileDigest { bytes: self.bytes, crc32c: self.crc32c }
    }
}

/// Where one sink of the job writes (a folder of a file sink): recorded in each checkpoint, so
/// a resume against another output is refused before anything is restored or created.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SinkOutput {
    /// The sink operator's name.
    pub operator: String,
    /// Where it writes (an absolute path).
    pub location: String,
}

/// A shared file (incremental checkpoints) a checkpoint refers to.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SharedFile {
    /// The file, relative to the checkpoint directory (`shared/chk-<n>-task-<i>.pages`).
    pub file: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// CRC-32C of the whole file.
    pub crc32c: u32,
}

impl SharedFile {
    /// The record of shared file `file` with `digest`.
    pub fn new(file: String, digest: FileDigest) -> Self {
        SharedFile { file, bytes: digest.bytes, crc32c: digest.crc32c }
    }

    /// The file's length and checksum.
    pub fn digest(&self) -> FileDigest {
        FileDigest { bytes: self.bytes, crc32c: self.crc32c }
    }
}

/// The contents of `_metadata`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CheckpointMetadata {
    /// [`FORMAT_VERSION`].
    pub format: u32,
    /// The job's name.
    pub job: String,
    /// A fingerprint of the job graph (operators, parallelism, edges).
    pub fingerprint: String,
    /// The checkpoint id.
    pub checkpoint: u64,
    /// `checkpoint`, or `savepoint` for a copy taken by hand.
    #[serde(default = "checkpoint_kind")]
    pub kind: String,
    /// `exactly-once` or `at-least-once`.
    pub mode: String,
    /// The generation (fencing token) of the process that completed it: each process that
    /// takes the checkpoint directory's lock counts one higher than every checkpoint before.
    #[serde(default)]
    pub generation: u64,
    /// Wall-clock completion time, milliseconds since the Unix epoch.
    pub completed_unix_ms: u64,
    /// Statistics.
    pub stats: CheckpointStats,
    /// Every task's file.
    pub tasks: Vec<TaskFile>,
    /// The shared files this checkpoint refers to; empty for a full checkpoint and for every
    /// savepoint.
    #[serde(default)]
    pub shared: Vec<SharedFile>,
    /// Where the job's sinks write (empty in checkpoints of weirs before this field, and for
    /// jobs whose sinks write nowhere on disk).
    #[serde(default)]
    pub outputs: Vec<SinkOutput>,
}

impl CheckpointMetadata {
    /// The names of the shared files it refers to.
    pub fn shared_names(&self) -> impl Iterator<Item = &str> {
        self.shared.iter().map(|s| s.file.as_str())
    }

    /// What it stores: its own bytes (its task files and the shared files it wrote), and
    /// the bytes and number of the shared files it refers to that earlier checkpoints wrote.
    ///
    /// ```
    /// # fn f(m: &weir::checkpoint::CheckpointMetadata) {
    /// let (own, shared, files) = m.own_and_shared_bytes();
    /// println!("{own} bytes of its own, {shared} in {files} earlier files");
    /// # }
    /// ```
    pub fn own_and_shared_bytes(&self) -> (u64, u64, usize) {
        let own_prefix = format!("{}/chk-{}-task-", super::SHARED_DIR, self.checkpoint);
        let (own, earlier): (Vec<&SharedFile>, Vec<&SharedFile>) =
            self.shared.iter().partition(|s| s.file.starts_with(&own_prefix));
        let tasks: u64 = self.tasks.iter().map(|t| t.bytes).sum();
        (tasks + own.iter().map(|s| s.bytes).sum::<u64>(), earlier.iter().map(|s| s.bytes).sum(), earlier.len())
    }
}

pub(super) fn checkpoint_kind() -> String {
    "checkpoint".into()
}

/// Reads and verifies `<dir>/_metadata`: its header names the checkpoint and job its content
/// describes.
pub fn read_metadata(dir: &Path) -> Result<CheckpointMetadata> {
    let path = dir.join(METADATA_FILE);
    let (found, json) = match read_file(&path, FileKind::Metadata) {
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::Corrupt(format!("{}: missing (the checkpoint never completed)", path.display())));
        }
        r => r?,
    };
    decode_described(&path, &found, &json, "metadata", |m: &CheckpointMetadata| {
        FileIdentity::new(FileKind::Metadata, &m.fingerprint, m.checkpoint, None)
    })
}
