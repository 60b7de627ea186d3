//! What a task file holds: per operator subtask, the chunks of its state, each inline bytes
//! or a range of a shared file (incremental checkpoints); and reading one back, resolving its
//! chunks through the shared files, each read once and checked against `_metadata`.
//!
//! May touch: `error`, `persist`, `snapshot` (the pages a lazy restore hands over).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::persist::{from_bytes, take, Persist};
use crate::snapshot::{PageSource, StoredPage};

use super::pages::{is_damaged, CheckpointPages, PageCache, RemotePages};

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
    /// One page of keyed state in a shared file: where it lies, as [`StoredChunk::Shared`],
    /// and its CRC-32C, so that a lazy restore can read and check it alone.
    Page {
        /// Index into [`TaskFileContent::shared`].
        file: u32,
        /// Byte offset in the shared file's payload.
        offset: u64,
        /// Length in bytes.
        len: u32,
        /// CRC-32C of those bytes.
        crc: u32,
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
            StoredChunk::Page { file, offset, len, crc } => {
                2u8.persist(out);
                (*file, *offset, *len, *crc).persist(out);
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
            2 => {
                let (file, offset, len, crc) = Persist::restore(input)?;
                Ok(StoredChunk::Page { file, offset, len, crc })
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
    pub(super) root: &'a Path,
    fingerprint: &'a str,
    recorded: HashMap<&'a str, FileDigest>,
    loaded: HashMap<String, Vec<u8>>,
    /// The store the directory is kept in, whose shared files a take-over left there: one
    /// read whole is brought down first.
    mirror: Option<&'a CheckpointMirror>,
}

impl<'a> SharedFiles<'a> {
    pub(super) fn of(root: &'a Path, metadata: &'a CheckpointMetadata, mirror: Option<&'a CheckpointMirror>) -> Self {
        SharedFiles {
            root,
            fingerprint: &metadata.fingerprint,
            recorded: metadata.shared.iter().map(|s| (s.file.as_str(), s.digest())).collect(),
            loaded: HashMap::new(),
            mirror,
        }
    }

    pub(super) fn range(&mut self, name: &str, offset: u64, len: u64) -> Result<&[u8]> {
        if !self.loaded.contains_key(name) {
            let path = self.root.join(name);
            if let Some(m) = self.mirror.filter(|_| !path.exists()) {
                m.bring_down(self.root, name)?;
            }
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
                    bytes.extend_from_slice(shared.range(shared_name(&content.shared, path, file)?, offset, len)?);
                }
                StoredChunk::Page { file, offset, len, crc } => {
                    let name = shared_name(&content.shared, path, file)?;
                    let page = shared.range(name, offset, len as u64)?;
                    if crc32c::crc32c(page) != crc {
                        return Err(corrupt(
                            &shared.root.join(name),
                            format!("the page at {offset} fails its checksum"),
                        ));
                    }
                    bytes.extend_from_slice(page);
                }
            }
        }
        parts.push((op, subtask, bytes));
    }
    Ok(parts)
}

/// The name of shared file `#file` of task file `path`'s `content`.
fn shared_name<'c>(shared: &'c [String], path: &Path, file: u32) -> Result<&'c str> {
    shared
        .get(file as usize)
        .map(String::as_str)
        .ok_or_else(|| corrupt(path, format!("chunk refers to shared file #{file}, which is not listed")))
}

/// One part of a task file read lazily: its bytes without the pages of keyed state, and
/// those pages, each with the offset in the bytes where it belongs.
pub(crate) struct LazyPart {
    pub(crate) inline: Vec<u8>,
    pub(crate) pages: Vec<(usize, StoredPage)>,
}

/// The shared files of one checkpoint's lazy restore, each opened once.
pub(super) struct PageFiles<'a> {
    shared: SharedFiles<'a>,
    open: HashMap<String, Arc<dyn PageSource>>,
    /// Where pages read from the object store are kept (files a take-over left there).
    cache: &'a Arc<PageCache>,
}

impl<'a> PageFiles<'a> {
    pub(super) fn of(
        root: &'a Path,
        metadata: &'a CheckpointMetadata,
        mirror: Option<&'a CheckpointMirror>,
        cache: &'a Arc<PageCache>,
    ) -> Self {
        PageFiles { shared: SharedFiles::of(root, metadata, mirror), open: HashMap::new(), cache }
    }

    /// Shared file `name`, opened and its header checked (in the directory, or in the object
    /// store where a take-over left it); `None` once a page of it failed its checksum (it is
    /// then read whole, and so checked whole).
    fn pages(&mut self, name: &str) -> Result<Option<Arc<dyn PageSource>>> {
        let path = self.shared.root.join(name);
        if is_damaged(&path) {
            return Ok(None);
        }
        if let Some(f) = self.open.get(name) {
            return Ok(Some(Arc::clone(f)));
        }
        let Some((id, task)) = parse_shared_name(name) else {
            return Err(Error::Corrupt(format!("'{name}' is not the name of a shared state file")));
        };
        let digest = *self.shared.recorded.get(name).ok_or_else(|| {
            corrupt(&path, "a task file refers to it, and the checkpoint's _metadata does not list it")
        })?;
        let expected = FileIdentity::new(FileKind::SharedPages, self.shared.fingerprint, id, Some(task));
        let remote = self.shared.mirror.filter(|_| !path.exists()).and_then(|m| m.left_in_store(name));
        let f: Arc<dyn PageSource> = match remote {
            Some((store, key)) => {
                RemotePages::open(store, key, (self.shared.root, name), &expected, &digest, self.cache)?
            }
            None => Arc::new(CheckpointPages::open((self.shared.root, name), &expected, &digest)?),
        };
        self.open.insert(name.to_string(), Arc::clone(&f));
        Ok(Some(f))
    }
}

/// Reads one task file (checked against its identity and digest) and resolves its chunks,
/// the pages of keyed state left where they lie: (operator, subtask, part) per part.
pub(super) fn read_task_parts_lazily(
    path: &Path,
    expected: &FileIdentity,
    digest: &FileDigest,
    files: &mut PageFiles,
) -> Result<Vec<(String, u64, LazyPart)>> {
    let payload = read_expected(path, expected, Some(digest))?;
    let content: TaskFileContent = from_bytes(&payload).map_err(|e| corrupt(path, e))?;
    let mut parts = Vec::with_capacity(content.parts.len());
    for (op, subtask, chunks) in content.parts {
        let mut part = LazyPart { inline: Vec::new(), pages: Vec::new() };
        for c in chunks {
            match c {
                StoredChunk::Inline(b) => part.inline.extend_from_slice(&b),
                StoredChunk::Shared { file, offset, len } => {
                    let name = shared_name(&content.shared, path, file)?;
                    part.inline.extend_from_slice(files.shared.range(name, offset, len)?);
                }
                StoredChunk::Page { file, offset, len, crc } => {
                    let name = shared_name(&content.shared, path, file)?;
                    match files.pages(name)? {
                        Some(source) => part.pages.push((part.inline.len(), StoredPage { source, offset, len, crc })),
                        None => {
                            let page = files.shared.range(name, offset, len as u64)?;
                            part.inline.extend_from_slice(page);
                        }
                    }
                }
            }
        }
        parts.push((op, subtask, part));
    }
    Ok(parts)
}
