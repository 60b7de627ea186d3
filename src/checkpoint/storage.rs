//! Checkpoint storage: `<dir>/chk-<n>/` with one state file per task and `_metadata`, written
//! last and atomically (temporary file, fsync, rename, fsync of the folder). A checkpoint
//! without a valid `_metadata` does not exist.
//!
//! Every file starts with a header (magic `WEIR`, format version, file kind) and holds its
//! payload in blocks of at most 64 KiB, each with its length and CRC-32C, ended by a
//! terminator that carries the payload's total length. A reader checks all of it and names what
//! is wrong; a damaged checkpoint is never restored (recovery falls back to an older one).
//!
//! Incremental checkpoints keep the pages of keyed state in `<dir>/shared/`, one file per
//! checkpoint and task holding the pages that checkpoint wrote; a task file then lists, per
//! operator, chunks that are either inline bytes or a range of a shared file. `_metadata` names
//! every shared file the checkpoint needs, and retention deletes a shared file only when no
//! retained checkpoint names it.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::persist::{from_bytes, take, to_bytes, Persist};
use crate::snapshot::RestoredState;

/// Version of the on-disk format; a reader refuses any other.
pub const FORMAT_VERSION: u32 = 2;
const MAGIC: [u8; 4] = *b"WEIR";
const HEADER_BYTES: usize = 16;
const BLOCK_BYTES: usize = 64 * 1024;
/// The name of a checkpoint's metadata file.
pub const METADATA_FILE: &str = "_metadata";

/// What a file holds (checked when it is read).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum FileKind {
    /// One task's state.
    TaskState = 1,
    /// A checkpoint's metadata.
    Metadata = 2,
    /// Pages of keyed state written by one task for one incremental checkpoint.
    SharedPages = 3,
}

/// The folder, under the checkpoint directory, of files that incremental checkpoints share.
pub const SHARED_DIR: &str = "shared";

/// Statistics of one completed checkpoint.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CheckpointStats {
    /// The checkpoint id.
    pub id: u64,
    /// Trigger time, milliseconds since the job (attempt) started.
    pub trigger_ms: f64,
    /// From trigger to completion.
    pub duration_ms: f64,
    /// Longest time from trigger until a task saw the first barrier.
    pub start_delay_ms: f64,
    /// Longest barrier alignment at a task.
    pub alignment_ms: f64,
    /// Longest synchronous snapshot part at a task.
    pub sync_ms: f64,
    /// Longest asynchronous snapshot part at a task.
    pub async_ms: f64,
    /// Bytes of the whole state (what a full checkpoint writes).
    pub state_bytes: u64,
    /// Bytes of state this checkpoint wrote: all of it for a full checkpoint, the pages dirtied
    /// since the last completed checkpoint (and small operator state) for an incremental one.
    /// Named `incremental_bytes` in JSON (metadata and `weir bench --json`).
    #[serde(default, rename = "incremental_bytes", alias = "written_bytes")]
    pub written_bytes: u64,
    /// Bytes of in-flight data written (unaligned checkpoints).
    pub inflight_bytes: u64,
}

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
    /// Wall-clock completion time, milliseconds since the Unix epoch.
    pub completed_unix_ms: u64,
    /// Statistics.
    pub stats: CheckpointStats,
    /// Every task's file.
    pub tasks: Vec<TaskFile>,
    /// The shared files (relative to the checkpoint directory) this checkpoint refers to;
    /// empty for a full checkpoint and for every savepoint.
    #[serde(default)]
    pub shared: Vec<String>,
}

fn checkpoint_kind() -> String {
    "checkpoint".into()
}

fn corrupt(path: &Path, what: impl std::fmt::Display) -> Error {
    Error::Corrupt(format!("{}: {what}", path.display()))
}

/// Writes `payload` as a checksummed file of `kind`, and fsyncs it. Returns its size.
pub fn write_file(path: &Path, kind: FileKind, payload: &[u8]) -> std::io::Result<u64> {
    let mut w = ChecksummedWriter::create(path, kind)?;
    w.write(payload)?;
    w.finish()
}

/// The image of a file of `kind` holding `payload`, in memory: exactly what [`write_file`]
/// writes (for tests and fuzzing, which need valid files to damage or to wrap input in).
pub fn encode_file(kind: FileKind, payload: &[u8]) -> Vec<u8> {
    let mut w = ChecksummedWriter::new(Vec::new(), kind).expect("writing to memory cannot fail");
    w.write(payload).expect("writing to memory cannot fail");
    w.finish_unsynced().expect("writing to memory cannot fail").0
}

/// A checksummed file written as its payload arrives: each 64 KiB block is framed and handed
/// to the file once full, so a large snapshot never needs its whole encoding in memory.
pub struct ChecksummedWriter<W: Write = std::io::BufWriter<File>> {
    out: W,
    block: Vec<u8>,
    payload: u64,
    size: u64,
}

fn emit_block(out: &mut impl Write, block: &[u8]) -> std::io::Result<u64> {
    out.write_all(&(block.len() as u32).to_le_bytes())?;
    out.write_all(&crc32c::crc32c(block).to_le_bytes())?;
    out.write_all(block)?;
    Ok(8 + block.len() as u64)
}

impl ChecksummedWriter {
    /// Creates (or truncates) `path` and writes the header of a file of `kind`.
    pub fn create(path: &Path, kind: FileKind) -> std::io::Result<Self> {
        ChecksummedWriter::new(std::io::BufWriter::with_capacity(1 << 20, File::create(path)?), kind)
    }

    /// Writes the last block and the terminator, and fsyncs the file. Returns its size.
    pub fn finish(self) -> std::io::Result<u64> {
        let (out, size) = self.finish_unsynced()?;
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        Ok(size)
    }
}

impl<W: Write> ChecksummedWriter<W> {
    /// Writes the header of a file of `kind` to `out`.
    pub fn new(mut out: W, kind: FileKind) -> std::io::Result<Self> {
        let mut header = [0u8; HEADER_BYTES];
        header[..4].copy_from_slice(&MAGIC);
        header[4..8].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        header[8..12].copy_from_slice(&(kind as u32).to_le_bytes());
        out.write_all(&header)?;
        Ok(ChecksummedWriter { out, block: Vec::with_capacity(BLOCK_BYTES), payload: 0, size: HEADER_BYTES as u64 })
    }

    /// Payload bytes written so far (the offset of the next byte).
    pub fn position(&self) -> u64 {
        self.payload
    }

    /// Appends payload bytes.
    pub fn write(&mut self, mut data: &[u8]) -> std::io::Result<()> {
        self.payload += data.len() as u64;
        while !data.is_empty() {
            if self.block.is_empty() && data.len() >= BLOCK_BYTES {
                self.size += emit_block(&mut self.out, &data[..BLOCK_BYTES])?;
                data = &data[BLOCK_BYTES..];
                continue;
            }
            let n = (BLOCK_BYTES - self.block.len()).min(data.len());
            self.block.extend_from_slice(&data[..n]);
            data = &data[n..];
            if self.block.len() == BLOCK_BYTES {
                self.size += emit_block(&mut self.out, &self.block)?;
                self.block.clear();
            }
        }
        Ok(())
    }

    /// Writes the last block and the terminator, and flushes. Returns the output and the
    /// file's size.
    pub fn finish_unsynced(mut self) -> std::io::Result<(W, u64)> {
        if !self.block.is_empty() {
            self.size += emit_block(&mut self.out, &self.block)?;
        }
        // Terminator: a zero-length block carrying the payload's length, so truncation at a
        // block boundary is detected too.
        let total = self.payload.to_le_bytes();
        self.out.write_all(&0u32.to_le_bytes())?;
        self.out.write_all(&crc32c::crc32c(&total).to_le_bytes())?;
        self.out.write_all(&total)?;
        self.out.flush()?;
        Ok((self.out, self.size + 16))
    }
}

/// Reads and verifies a file written by [`write_file`]; returns its payload.
pub fn read_file(path: &Path, kind: FileKind) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(|e| Error::io("cannot read checkpoint file", path, e))?;
    decode_file(&bytes, kind).map_err(|m| corrupt(path, m))
}

/// Verifies and decodes a whole file image. Errors say what is wrong; never panics.
pub fn decode_file(bytes: &[u8], kind: FileKind) -> std::result::Result<Vec<u8>, String> {
    if bytes.len() < HEADER_BYTES {
        return Err(format!("file too short for a header ({} bytes)", bytes.len()));
    }
    if bytes[..4] != MAGIC {
        return Err("not a weir checkpoint file (bad magic)".into());
    }
    let word = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
    let version = word(4);
    if version != FORMAT_VERSION {
        return Err(format!("format version {version}, this weir reads version {FORMAT_VERSION}"));
    }
    if word(8) != kind as u32 {
        return Err(format!("file kind {} where {:?} was expected", word(8), kind));
    }
    if word(12) != 0 {
        return Err(format!("reserved header field is {}, not 0", word(12)));
    }
    let mut pos = HEADER_BYTES;
    let mut payload = Vec::new();
    loop {
        if bytes.len() < pos + 8 {
            return Err(format!("truncated at byte {pos} (block header missing)"));
        }
        let len = word(pos) as usize;
        let crc = word(pos + 4);
        pos += 8;
        if len == 0 {
            if bytes.len() < pos + 8 {
                return Err("truncated terminator".into());
            }
            let total = &bytes[pos..pos + 8];
            if crc32c::crc32c(total) != crc {
                return Err("terminator checksum mismatch".into());
            }
            if u64::from_le_bytes(total.try_into().expect("8 bytes")) != payload.len() as u64 {
                return Err("payload length does not match the terminator (blocks missing)".into());
            }
            if bytes.len() != pos + 8 {
                return Err(format!("{} unexpected bytes after the terminator", bytes.len() - pos - 8));
            }
            return Ok(payload);
        }
        if len > BLOCK_BYTES {
            return Err(format!("block at byte {} claims {len} bytes (at most {BLOCK_BYTES})", pos - 8));
        }
        if bytes.len() < pos + len {
            return Err(format!("truncated block at byte {}", pos - 8));
        }
        let block = &bytes[pos..pos + len];
        if crc32c::crc32c(block) != crc {
            return Err(format!("checksum mismatch in block at byte {}", pos - 8));
        }
        payload.extend_from_slice(block);
        pos += len;
    }
}

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

crate::persist_struct!(TaskFileContent { shared, parts });

/// Reads shared files on demand, each once, for the task files of one checkpoint.
struct SharedFiles<'a> {
    root: &'a Path,
    loaded: HashMap<String, Vec<u8>>,
}

impl SharedFiles<'_> {
    fn range(&mut self, name: &str, offset: u64, len: u64) -> Result<&[u8]> {
        if !self.loaded.contains_key(name) {
            if name.contains("..") || Path::new(name).is_absolute() {
                return Err(Error::Corrupt(format!("shared file name '{name}' leaves the checkpoint directory")));
            }
            let payload = read_file(&self.root.join(name), FileKind::SharedPages)?;
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

/// Reads one task file and resolves its chunks: (operator, subtask, state bytes) per part.
fn read_task_parts(path: &Path, shared: &mut SharedFiles) -> Result<Vec<(String, u64, Vec<u8>)>> {
    let payload = read_file(path, FileKind::TaskState)?;
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

/// A checkpoint folder tree.
#[derive(Clone, Debug)]
pub struct CheckpointStorage {
    dir: PathBuf,
}

/// A checkpoint read back and verified.
#[derive(Debug)]
pub struct LoadedCheckpoint {
    /// Its metadata.
    pub metadata: CheckpointMetadata,
    /// Its state.
    pub state: RestoredState,
}

impl CheckpointStorage {
    /// Storage under `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        CheckpointStorage { dir: dir.into() }
    }

    /// The root folder.
    pub fn dir(&self) -> &Path {
        &self.dir
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

    /// Writes one task's state file; returns the file name and size.
    pub fn write_task(&self, id: u64, task: usize, content: &TaskFileContent) -> Result<(String, u64)> {
        let name = format!("task-{task}.state");
        let path = self.checkpoint_dir(id).join(&name);
        let bytes = write_file(&path, FileKind::TaskState, &to_bytes(content))
            .map_err(|e| Error::io("cannot write task state", &path, e))?;
        Ok((name, bytes))
    }

    /// The name (relative to the checkpoint directory) of the shared file in which task
    /// `task` keeps the pages it wrote for checkpoint `id`.
    pub fn shared_name(id: u64, task: usize) -> String {
        format!("{SHARED_DIR}/chk-{id}-task-{task}.pages")
    }

    /// Starts the shared pages file of task `task` for checkpoint `id`.
    pub fn create_shared(&self, id: u64, task: usize) -> std::io::Result<ChecksummedWriter> {
        let path = self.dir.join(Self::shared_name(id, task));
        let folder = self.dir.join(SHARED_DIR);
        std::fs::create_dir_all(&folder)
            .and_then(|_| ChecksummedWriter::create(&path, FileKind::SharedPages))
            .map_err(|e| std::io::Error::new(e.kind(), format!("cannot create {}: {e}", path.display())))
    }

    /// Makes checkpoint `metadata.checkpoint` exist: writes `_metadata` atomically.
    pub fn commit(&self, metadata: &CheckpointMetadata) -> Result<()> {
        write_metadata(&self.checkpoint_dir(metadata.checkpoint), metadata)
    }
}

/// Writes `<dir>/_metadata` atomically: temporary file, fsync, rename, fsync of the folder.
fn write_metadata(d: &Path, metadata: &CheckpointMetadata) -> Result<()> {
    let tmp = d.join("_metadata.inprogress");
    let json = serde_json::to_vec_pretty(metadata).map_err(|e| Error::Corrupt(e.to_string()))?;
    write_file(&tmp, FileKind::Metadata, &json).map_err(|e| Error::io("cannot write checkpoint metadata", &tmp, e))?;
    let target = d.join(METADATA_FILE);
    std::fs::rename(&tmp, &target).map_err(|e| Error::io("cannot publish checkpoint metadata", &target, e))?;
    File::open(d).and_then(|f| f.sync_all()).map_err(|e| Error::io("cannot sync checkpoint folder", d, e))
}

/// Reads and verifies `<dir>/_metadata`.
pub fn read_metadata(dir: &Path) -> Result<CheckpointMetadata> {
    let path = dir.join(METADATA_FILE);
    if !path.exists() {
        return Err(Error::Corrupt(format!("{}: missing (the checkpoint never completed)", path.display())));
    }
    let json = read_file(&path, FileKind::Metadata)?;
    serde_json::from_slice(&json).map_err(|e| corrupt(&path, format!("unreadable metadata: {e}")))
}

/// Reads and verifies a whole checkpoint or savepoint folder. Shared files an incremental
/// checkpoint refers to are read from the folder above it (the checkpoint directory).
pub fn load_dir(dir: &Path) -> Result<LoadedCheckpoint> {
    let metadata = read_metadata(dir)?;
    let mut state = RestoredState::new(metadata.checkpoint);
    let root = dir.parent().unwrap_or(dir);
    let mut shared = SharedFiles { root, loaded: HashMap::new() };
    for t in &metadata.tasks {
        for (op, subtask, bytes) in read_task_parts(&dir.join(&t.file), &mut shared)? {
            state.insert(op, subtask as usize, bytes);
        }
    }
    Ok(LoadedCheckpoint { metadata, state })
}

impl CheckpointStorage {
    /// Removes what an aborted checkpoint `id` wrote: its folder and its shared files (no
    /// other checkpoint refers to pages of one that never completed).
    pub fn discard(&self, id: u64) {
        let _ = std::fs::remove_dir_all(self.checkpoint_dir(id));
        let prefix = format!("chk-{id}-task-");
        if let Ok(entries) = std::fs::read_dir(self.dir.join(SHARED_DIR)) {
            for e in entries.filter_map(|e| e.ok()) {
                if e.file_name().to_str().is_some_and(|n| n.starts_with(&prefix)) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
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
        read_metadata(&self.checkpoint_dir(id))
    }

    /// Reads and verifies checkpoint `id` completely.
    pub fn load(&self, id: u64) -> Result<LoadedCheckpoint> {
        let c = load_dir(&self.checkpoint_dir(id))?;
        if c.metadata.checkpoint != id {
            return Err(Error::Corrupt(format!("chk-{id}/_metadata describes checkpoint {}", c.metadata.checkpoint)));
        }
        Ok(c)
    }

    /// Copies complete checkpoint `id` into `<target>/savepoint-<id>/` as a savepoint (every
    /// file synced, the metadata last). Chunks in shared files are copied into the task files,
    /// so the savepoint refers to nothing outside its folder.
    pub fn copy_to_savepoint(&self, id: u64, target: &Path) -> Result<PathBuf> {
        let from = self.checkpoint_dir(id);
        let mut metadata = read_metadata(&from)?;
        let to = target.join(format!("savepoint-{id}"));
        std::fs::create_dir_all(&to).map_err(|e| Error::io("cannot create savepoint folder", &to, e))?;
        let mut shared = SharedFiles { root: &self.dir, loaded: HashMap::new() };
        for t in &mut metadata.tasks {
            let parts = read_task_parts(&from.join(&t.file), &mut shared)?;
            let dst = to.join(&t.file);
            t.bytes = write_file(&dst, FileKind::TaskState, &to_bytes(&TaskFileContent::inline(parts)))
                .map_err(|e| Error::io("cannot write savepoint state", &dst, e))?;
        }
        metadata.kind = "savepoint".into();
        metadata.shared.clear();
        write_metadata(&to, &metadata)?;
        Ok(to)
    }

    /// The format version `_metadata` of checkpoint `id` declares, if it has a weir header
    /// (read from the header alone: a checkpoint of another version is not damage but a
    /// different program's, and must not be skipped as if it were).
    pub fn format_version(&self, id: u64) -> Option<u32> {
        let mut header = [0u8; HEADER_BYTES];
        File::open(self.checkpoint_dir(id).join(METADATA_FILE)).and_then(|mut f| f.read_exact(&mut header)).ok()?;
        (header[..4] == MAGIC).then(|| u32::from_le_bytes(header[4..8].try_into().expect("4 bytes")))
    }

    /// The newest checkpoint that verifies, with a note for each newer one skipped and why.
    pub fn latest_valid(&self) -> (Option<LoadedCheckpoint>, Vec<String>) {
        let mut notes = Vec::new();
        for id in self.list().into_iter().rev() {
            if !self.is_complete(id) {
                // Never completed (crashed or aborted mid-way): not a checkpoint at all.
                continue;
            }
            match self.load(id) {
                Ok(c) => return (Some(c), notes),
                Err(e) => notes.push(format!("checkpoint {id} is damaged and was skipped: {e}")),
            }
        }
        (None, notes)
    }

    /// Keeps the newest `keep` of `completed` and deletes the rest, then the shared files the
    /// deleted checkpoints referred to that neither a retained checkpoint nor `in_use` (what
    /// checkpoints in progress refer to) names. Returns the shared files deleted.
    pub fn retain(&self, completed: &mut Vec<u64>, keep: usize, in_use: &HashSet<String>) -> Vec<String> {
        completed.sort_unstable();
        let mut candidates = HashSet::new();
        while completed.len() > keep {
            let old = completed.remove(0);
            if let Ok(m) = self.metadata(old) {
                candidates.extend(m.shared);
            }
            // Its own shared files may be needed by newer checkpoints: only the folder goes.
            let _ = std::fs::remove_dir_all(self.checkpoint_dir(old));
        }
        if candidates.is_empty() {
            return Vec::new();
        }
        let mut needed = in_use.clone();
        for &id in completed.iter() {
            match self.metadata(id) {
                Ok(m) => needed.extend(m.shared),
                // What a retained checkpoint needs is unknown: delete nothing.
                Err(_) => return Vec::new(),
            }
        }
        let mut deleted: Vec<String> = candidates.into_iter().filter(|f| !needed.contains(f)).collect();
        deleted.sort();
        for f in &deleted {
            let _ = std::fs::remove_file(self.dir.join(f));
        }
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
                Ok(m) => needed.extend(m.shared),
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
        deleted
    }
}

/// Metadata of a one-task checkpoint, for tests.
#[cfg(test)]
pub(crate) fn test_metadata(id: u64, file: String, bytes: u64, shared: Vec<String>) -> CheckpointMetadata {
    CheckpointMetadata {
        format: FORMAT_VERSION,
        job: "j".into(),
        fingerprint: "f".into(),
        checkpoint: id,
        kind: "checkpoint".into(),
        mode: "exactly-once".into(),
        completed_unix_ms: 0,
        stats: CheckpointStats::default(),
        tasks: vec![TaskFile { task: 0, name: "t".into(), file, bytes }],
        shared,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_round_trip_and_damage_is_detected() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let payload: Vec<u8> = (0..200_000u32).map(|i| (i * 7) as u8).collect();
        write_file(&path, FileKind::TaskState, &payload).unwrap();
        assert_eq!(read_file(&path, FileKind::TaskState).unwrap(), payload);
        assert!(read_file(&path, FileKind::Metadata).is_err(), "wrong kind");
        let good = std::fs::read(&path).unwrap();
        // Truncations and every kind of flipped byte are caught.
        for cut in [0, 3, 15, 16, 100, 65_000, good.len() - 8, good.len() - 1] {
            assert!(decode_file(&good[..cut], FileKind::TaskState).is_err(), "cut at {cut}");
        }
        for at in [0, 5, 9, 13, 16, 20, 30, 70_000, good.len() - 3] {
            let mut bad = good.clone();
            bad[at] ^= 0x40;
            assert!(decode_file(&bad, FileKind::TaskState).is_err(), "flip at {at}");
        }
        let mut longer = good.clone();
        longer.push(0);
        assert!(decode_file(&longer, FileKind::TaskState).is_err());
    }

    #[test]
    fn checkpoints_commit_load_and_fall_back_past_damage() {
        let dir = tempfile::tempdir().unwrap();
        let s = CheckpointStorage::new(dir.path());
        for id in 1..=3u64 {
            s.prepare(id).unwrap();
            let parts = TaskFileContent::inline(vec![("op".into(), 0, vec![id as u8; 10])]);
            let (file, bytes) = s.write_task(id, 0, &parts).unwrap();
            s.commit(&test_metadata(id, file, bytes, Vec::new())).unwrap();
        }
        s.prepare(4).unwrap(); // never completed
        let (c, notes) = s.latest_valid();
        assert_eq!(c.unwrap().state.get("op", 0), Some(&[3u8; 10][..]));
        assert!(notes.is_empty());
        // Damage checkpoint 3's task file: recovery falls back to 2 and says why.
        let f = s.checkpoint_dir(3).join("task-0.state");
        let mut b = std::fs::read(&f).unwrap();
        b[30] ^= 1;
        std::fs::write(&f, b).unwrap();
        let (c, notes) = s.latest_valid();
        assert_eq!(c.unwrap().metadata.checkpoint, 2);
        assert!(notes[0].contains("checkpoint 3") && notes[0].contains("checksum"), "{notes:?}");
        let mut completed = vec![1, 2, 3];
        assert!(s.retain(&mut completed, 1, &HashSet::new()).is_empty());
        assert_eq!(completed, vec![3]);
        assert_eq!(s.list(), vec![3, 4]);
    }
}
