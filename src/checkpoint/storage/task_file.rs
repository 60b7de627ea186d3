//! What a task file holds: per operator subtask, the chunks of its state, each inline bytes
//! or a range of a shared file (incremental checkpoints); and reading one back, resolving its
//! chunks through the shared files, each read once and checked against `_metadata`.
//!
//! May touch: `error`, `persist`.

use std::collections::HashMap;
use std::path::Path;

use crate::error::{Error, Result};
use crate::persist::{from_bytes, take, Persist};

use super::*;

/// A piece of one operator's state in a task file; the pieces of a part, concatenated, are
/// the state's encoding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoredChunk {
    /// Bytes kept in the task file itself.
    Inline(Vec<u8>),
    /// `len` bytes at `offset` in the payload of a shared file (an index into the task file's
    /// list of shared files).
    Shared {
        /// Index into [`TaskFileContent::shared`].
        file: u32,
        /// Byte offset in the shared file's payload.
        offset: u64,
        /// Length in bytes.
        len: u64,
    },
}

impl Persist for StoredChunk {
    fn persist(&self, out: &mut Vec<u8>) {
        match self {
            StoredChunk::Inline(bytes) => {
                0u8.persist(out);
                (bytes.len() as u64).persist(out);
                out.extend_from_slice(bytes);
            }
            StoredChunk::Shared { file, offset, len } => {
                1u8.persist(out);
                (*file, *offset, *len).persist(out);
            }
        }
    }
    fn restore(input: &mut &[u8]) -> Result<Self> {
        match u8::restore(input)? {
            0 => {
                let len = u64::restore(input)?;
                let len = usize::try_from(len).map_err(|_| Error::Corrupt(format!("inline chunk of {len} bytes")))?;
                Ok(StoredChunk::Inline(take(input, len)?.to_vec()))
            }
            1 => {
                let (file, offset, len) = Persist::restore(input)?;
                Ok(StoredChunk::Shared { file, offset, len })
            }
            tag => Err(Error::Corrupt(format!("unknown state chunk tag {tag}"))),
        }
    }
}

/// What one task file holds: the shared files its chunks refer to (relative to the checkpoint
/// directory), and per part (operator, subtask) the chunks of its state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskFileContent {
    /// Shared files referred to, by index.
    pub shared: Vec<String>,
    /// (operator, subtask, chunks) per part.
    pub parts: Vec<(String, u64, Vec<StoredChunk>)>,
}

impl TaskFileContent {
    /// A file whose parts are all inline: (operator, subtask, state bytes) per part.
    pub fn inline(parts: Vec<(String, u64, Vec<u8>)>) -> Self {
        TaskFileContent {
            shared: Vec::new(),
            parts: parts.into_iter().map(|(op, s, b)| (op, s, vec![StoredChunk::Inline(b)])).collect(),
        }
    }
}

/// The fields one after the other, unframed: the task file format, which has its own version.
impl Persist for TaskFileContent {
    fn persist(&self, out: &mut Vec<u8>) {
        self.shared.persist(out);
        self.parts.persist(out);
    }
    fn restore(input: &mut &[u8]) -> Result<Self> {
        Ok(TaskFileContent { shared: Persist::restore(input)?, parts: Persist::restore(input)? })
    }
}

/// Reads shared files on demand, each once, for the task files of one checkpoint, checking
/// each against what the referring checkpoint's `_metadata` recorded for it.
pub(super) struct SharedFiles<'a> {
    root: &'a Path,
    fingerprint: &'a str,
    recorded: HashMap<&'a str, FileDigest>,
    loaded: HashMap<String, Vec<u8>>,
}

impl<'a> SharedFiles<'a> {
    pub(super) fn of(root: &'a Path, metadata: &'a CheckpointMetadata) -> Self {
        SharedFiles {
            root,
            fingerprint: &metadata.fingerprint,
            recorded: metadata.shared.iter().map(|s| (s.file.as_str(), s.digest())).collect(),
            loaded: HashMap::new(),
        }
    }

    pub(super) fn range(&mut self, name: &str, offset: u64, len: u64) -> Result<&[u8]> {
        if !self.loaded.contains_key(name) {
            let path = self.root.join(name);
            let Some((id, task)) = parse_shared_name(name) else {
                return Err(Error::Corrupt(format!("'{name}' is not the name of a shared state file")));
            };
            let digest = self.recorded.get(name).ok_or_else(|| {
                corrupt(&path, "a task file refers to it, and the checkpoint's _metadata does not list it")
            })?;
            let expected = FileIdentity::new(FileKind::SharedPages, self.fingerprint, id, Some(task));
            let payload = read_expected(&path, &expected, Some(digest))?;
            self.loaded.insert(name.to_string(), payload);
        }
        let payload = &self.loaded[name];
        let end = offset.checked_add(len).filter(|&e| e <= payload.len() as u64).ok_or_else(|| {
            Error::Corrupt(format!(
                "{}: a chunk refers to bytes {offset}..+{len}, past its {} bytes",
                self.root.join(name).display(),
                payload.len()
            ))
        })?;
        Ok(&payload[offset as usize..end as usize])
    }
}

/// How the name of a changelog base materialized in the background ends
/// ([`super::CheckpointStorage::base_name`]).
pub(crate) const BASE_SUFFIX: &str = ".base.pages";

/// The checkpoint and task of a shared file's name, `shared/chk-<n>-task-<i>.pages` (or a
/// base's, `….base.pages`).
pub(crate) fn parse_shared_name(name: &str) -> Option<(u64, usize)> {
    let rest = name.strip_prefix(SHARED_DIR)?.strip_prefix('/')?.strip_prefix("chk-")?;
    let rest = rest.strip_suffix(BASE_SUFFIX).or_else(|| rest.strip_suffix(".pages"))?;
    let (id, task) = rest.split_once("-task-")?;
    Some((id.parse().ok()?, task.parse().ok()?))
}

/// Whether shared file `name` is a changelog base materialized in the background (written
/// beside checkpoint `n`, not by it: the checkpoint that first refers to it publishes it).
pub(crate) fn is_base_name(name: &str) -> bool {
    name.ends_with(BASE_SUFFIX)
}

/// The identity task `t`'s file of the checkpoint `metadata` describes must have.
pub(super) fn task_identity(metadata: &CheckpointMetadata, t: &TaskFile) -> FileIdentity {
    let written_for = t.checkpoint.unwrap_or(metadata.checkpoint);
    FileIdentity::new(FileKind::TaskState, &metadata.fingerprint, written_for, Some(t.task))
}

/// Reads one task file (checked against its identity and digest) and resolves its chunks:
/// (operator, subtask, state bytes) per part.
pub(super) fn read_task_parts(
    path: &Path,
    expected: &FileIdentity,
    digest: &FileDigest,
    shared: &mut SharedFiles,
) -> Result<Vec<(String, u64, Vec<u8>)>> {
    let payload = read_expected(path, expected, Some(digest))?;
    let content: TaskFileContent = from_bytes(&payload).map_err(|e| corrupt(path, e))?;
    let mut parts = Vec::with_capacity(content.parts.len());
    for (op, subtask, chunks) in content.parts {
        let mut bytes = Vec::new();
        for c in chunks {
            match c {
                StoredChunk::Inline(b) if bytes.is_empty() => bytes = b,
                StoredChunk::Inline(b) => bytes.extend_from_slice(&b),
                StoredChunk::Shared { file, offset, len } => {
                    let name = content.shared.get(file as usize).ok_or_else(|| {
                        corrupt(path, format!("chunk refers to shared file #{file}, which is not listed"))
                    })?;
                    bytes.extend_from_slice(shared.range(name, offset, len)?);
                }
            }
        }
        parts.push((op, subtask, bytes));
    }
    Ok(parts)
}
