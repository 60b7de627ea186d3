//! Checkpoints: configuration, the coordinator, the control plane to the tasks, recovery of
//! a checkpoint directory, and storage (the task side of barriers is [`crate::barrier`]). Beside the data path: control messages (trigger,
//! acknowledge, complete, abort) travel on their own channels, never on the data rings.
//!
//! The model is Flink's (Carbone et al. 2015): the coordinator triggers checkpoint *n* at the
//! sources, which record their offsets and inject barrier *n* in-band; a task snapshots its
//! operators when barrier *n* has arrived on all inputs (exactly-once blocks each input that
//! delivered it; at-least-once only counts), forwards it, and writes the snapshot in the
//! background; the checkpoint exists once its `_metadata` is durable.
//!
//! May touch: `context`, `error`, `faults`, `metrics`, `persist`, `snapshot`, `prng`, `state`.

mod config;
pub(crate) mod coordinator;
mod incremental;
pub(crate) mod local;
mod lock;
pub(crate) mod recovery;
pub(crate) mod resume;
mod storage;
pub(crate) mod task;

pub use crate::snapshot::{CheckpointMode, ModeKeys, ModeKind, DEFAULT_ALIGNMENT_TIMEOUT, DEFAULT_INFLIGHT_BUDGET};
pub use config::{CheckpointConfig, RestartStrategy, DEFAULT_MATERIALIZE_EVERY, DEFAULT_RETAINED};
pub use lock::{DirectoryLock, LOCK_FILE};
pub use recovery::RestoreReport;
pub use storage::{
    load_dir, read_finished, read_metadata, ChannelAlignment, CheckpointMetadata, CheckpointMirror, CheckpointStats,
    CheckpointStorage, FinishedJob, InMemoryObjectStore, Lineage, LoadedCheckpoint, ObjectStore, PageCache, PartReuse,
    RecoveryPoint, SharedFile, SinkOutput, TaskFile, FINISHED_MARKER, FORMAT_VERSION, INSTANCE_FILE, METADATA_FILE,
    SHARED_DIR,
};

// The file format and the task side of a snapshot's writing: reachable for weir's benches,
// tests and fuzz targets (which build and damage checkpoint files), not part of the API.
#[doc(hidden)]
pub(crate) use incremental::write_task_file;
pub use incremental::{
    materialize, write_task_snapshot, PageIndex, TaskFileWritten, COMPACT_BELOW_LIVE, MAX_SHARED_FILES,
};
#[doc(hidden)]
pub use storage::{
    decode_file, encode_file, read_expected, read_file, write_file, write_finished, FileDigest, FileIdentity, FileKind,
    StoredChunk, TaskFileContent,
};

/// The state of one checkpoint or savepoint folder (or of the completion marker), for
/// `weir checkpoints`.
#[derive(Debug)]
pub enum CheckpointStatus {
    /// Complete, and every file verifies.
    Valid(Box<CheckpointMetadata>),
    /// Has no `_metadata`: it never completed, so it is not a checkpoint.
    Incomplete,
    /// Damaged: the reason.
    Damaged(String),
    /// The completion marker of the job that finished in this directory.
    Finished(FinishedJob),
}

/// The status of a checkpoint (or savepoint) folder: valid, damaged (the reason) or
/// incomplete. An I/O error is not damage: it is returned.
fn folder_status(loaded: crate::Result<LoadedCheckpoint>, has_metadata: bool) -> crate::Result<CheckpointStatus> {
    match loaded {
        Ok(c) => Ok(CheckpointStatus::Valid(Box::new(c.metadata))),
        Err(_) if !has_metadata => Ok(CheckpointStatus::Incomplete),
        Err(e @ crate::Error::Corrupt(_)) => Ok(CheckpointStatus::Damaged(e.to_string())),
        Err(e) => Err(e),
    }
}

/// The id in a folder name `<prefix><n>`.
fn folder_id(name: &str, prefix: &str) -> Option<u64> {
    name.strip_prefix(prefix).and_then(|n| n.parse().ok())
}

/// Checks what `dir` holds and verifies every file, oldest first, one row per folder: a
/// checkpoint directory (its `chk-<n>` folders and its completion marker), a savepoint
/// directory (its `savepoint-<n>` folders), or a single checkpoint or savepoint folder. A
/// file that cannot be read is an error, not damage.
pub fn inspect(dir: &std::path::Path) -> crate::Result<Vec<(String, CheckpointStatus)>> {
    let meta = std::fs::metadata(dir).map_err(|e| crate::Error::io("cannot read checkpoint directory", dir, e))?;
    if !meta.is_dir() {
        return Err(crate::Error::config(format!("{} is not a directory", dir.display())));
    }
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
    let has_metadata = |d: &std::path::Path| std::fs::symlink_metadata(d.join(METADATA_FILE)).is_ok();
    if has_metadata(dir) || folder_id(&name, "chk-").is_some() || folder_id(&name, "savepoint-").is_some() {
        // One folder. A `chk-<n>` folder must describe checkpoint n, as in its directory.
        let loaded = match folder_id(&name, "chk-") {
            Some(id) => CheckpointStorage::new(dir.parent().unwrap_or(dir)).load(id),
            None => load_dir(dir),
        };
        return Ok(vec![(name, folder_status(loaded, has_metadata(dir))?)]);
    }
    let mut folders: Vec<(u8, u64, String)> = std::fs::read_dir(dir)
        .map_err(|e| crate::Error::io("cannot read checkpoint directory", dir, e))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let n = e.file_name().to_str()?.to_string();
            let key =
                folder_id(&n, "chk-").map(|id| (0, id)).or_else(|| folder_id(&n, "savepoint-").map(|id| (1, id)))?;
            Some((key.0, key.1, n))
        })
        .collect();
    folders.sort();
    let storage = CheckpointStorage::new(dir);
    let mut rows = Vec::new();
    for (kind, id, name) in folders {
        let path = dir.join(&name);
        let loaded = if kind == 0 { storage.load(id) } else { load_dir(&path) };
        rows.push((name, folder_status(loaded, has_metadata(&path))?));
    }
    match read_finished(dir) {
        Ok(Some(f)) => rows.push((FINISHED_MARKER.to_string(), CheckpointStatus::Finished(f))),
        Ok(None) => {}
        Err(e @ crate::Error::Corrupt(_)) => {
            rows.push((FINISHED_MARKER.to_string(), CheckpointStatus::Damaged(e.to_string())))
        }
        Err(e) => return Err(e),
    }
    Ok(rows)
}
