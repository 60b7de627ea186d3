//! The completion marker `_finished`: left in the checkpoint directory when a checkpointed
//! job finishes, saying which job it was, so a second run of a finished job can say so.
//!
//! May touch: `error`.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

use super::*;

/// Written into the checkpoint directory when a checkpointed job finishes successfully.
pub const FINISHED_MARKER: &str = "_finished";

/// What the completion marker says: which job finished in this directory.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct FinishedJob {
    /// The job's name.
    pub job: String,
    /// Its graph fingerprint.
    pub fingerprint: String,
    /// What it read and wrote ([`crate::Job::with_description`]).
    pub description: String,
}

/// Leaves the completion marker in `dir`, atomically (temporary file, fsync, rename).
pub fn write_finished(dir: &Path, finished: &FinishedJob) -> Result<()> {
    let identity = FileIdentity::new(FileKind::Finished, &finished.fingerprint, 0, None);
    publish_json(dir, FINISHED_MARKER, &identity, finished, "the job's completion marker")
}

/// The completion marker in `dir`: `None` when there is none; damage (an empty or garbage
/// file, a folder of that name) is an error naming it.
pub fn read_finished(dir: &Path) -> Result<Option<FinishedJob>> {
    let path = dir.join(FINISHED_MARKER);
    match std::fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io("cannot read the completion marker", &path, e)),
        Ok(m) if !m.is_file() => return Err(corrupt(&path, "not a completion marker (not a plain file)")),
        Ok(_) => {}
    }
    let (found, json) = read_file(&path, FileKind::Finished)?;
    decode_described(&path, &found, &json, "completion marker", |f: &FinishedJob| {
        FileIdentity::new(FileKind::Finished, &f.fingerprint, 0, None)
    })
    .map(Some)
}
