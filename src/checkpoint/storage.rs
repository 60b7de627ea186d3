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
//! May touch: `error`, `persist`, `snapshot`.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::persist::{from_bytes, take, to_bytes, Persist};
use crate::snapshot::RestoredState;

/// Version of the on-disk format; a reader refuses any other. (3: headers name the job,
/// checkpoint and task, and `_metadata` records whole-file checksums.)
pub const FORMAT_VERSION: u32 = 3;
const MAGIC: [u8; 4] = *b"WEIR";
const HEADER_BYTES: usize = 48;
/// Bytes of the job fingerprint kept in a header (a fingerprint is 16 hex digits).
const FINGERPRINT_BYTES: usize = 16;
/// The task field of a file that belongs to no one task.
const NO_TASK: u32 = u32::MAX;
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
    /// The marker a job leaves when it finished.
    Finished = 4,
    /// The lock of a checkpoint directory: which process owns it, and its generation.
    Lock = 5,
}

impl FileKind {
    fn from_u32(v: u32) -> Option<FileKind> {
        [FileKind::TaskState, FileKind::Metadata, FileKind::SharedPages, FileKind::Finished, FileKind::Lock]
            .into_iter()
            .find(|k| *k as u32 == v)
    }
}

/// What a file says it is, in its checksummed header: its kind, the job (graph fingerprint),
/// the checkpoint and the task it belongs to. A file is read only where its identity is the
/// one expected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileIdentity {
    /// The file's kind.
    pub kind: FileKind,
    /// The job's graph fingerprint (at most 16 bytes are kept).
    pub fingerprint: String,
    /// The checkpoint it belongs to (0 for files of no checkpoint: the lock, the marker).
    pub checkpoint: u64,
    /// The task it belongs to, if one.
    pub task: Option<usize>,
}

impl FileIdentity {
    /// The identity of a file of `kind`.
    pub fn new(kind: FileKind, fingerprint: &str, checkpoint: u64, task: Option<usize>) -> Self {
        FileIdentity { kind, fingerprint: header_fingerprint(fingerprint), checkpoint, task }
    }

    fn header(&self) -> [u8; HEADER_BYTES] {
        let mut h = [0u8; HEADER_BYTES];
        h[..4].copy_from_slice(&MAGIC);
        h[4..8].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        h[8..12].copy_from_slice(&(self.kind as u32).to_le_bytes());
        let task = self.task.map_or(NO_TASK, |t| u32::try_from(t).expect("task index fits 32 bits"));
        h[12..16].copy_from_slice(&task.to_le_bytes());
        h[16..24].copy_from_slice(&self.checkpoint.to_le_bytes());
        h[24..24 + self.fingerprint.len()].copy_from_slice(self.fingerprint.as_bytes());
        let crc = crc32c::crc32c(&h[..44]);
        h[44..48].copy_from_slice(&crc.to_le_bytes());
        h
    }
}

/// The part of a fingerprint a header keeps: longer fingerprints compare on their first 16
/// bytes.
fn header_fingerprint(fingerprint: &str) -> String {
    let mut fingerprint = fingerprint.to_string();
    while fingerprint.len() > FINGERPRINT_BYTES {
        fingerprint.pop();
    }
    fingerprint
}

impl std::fmt::Display for FileIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.kind {
            FileKind::TaskState => "task state",
            FileKind::Metadata => "metadata",
            FileKind::SharedPages => "shared state pages",
            FileKind::Finished => "completion marker",
            FileKind::Lock => "directory lock",
        };
        write!(f, "{what}")?;
        if let Some(t) = self.task {
            write!(f, " of task {t}")?;
        }
        if self.checkpoint > 0 {
            write!(f, " of checkpoint {}", self.checkpoint)?;
        }
        write!(f, " of job {}", if self.fingerprint.is_empty() { "(none)" } else { &self.fingerprint })
    }
}

/// A file's length and the CRC-32C of all its bytes, as `_metadata` records them.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct FileDigest {
    /// Its size in bytes.
    pub bytes: u64,
    /// CRC-32C of the whole file.
    pub crc32c: u32,
}

impl FileDigest {
    /// The digest of a whole file image.
    pub fn of(bytes: &[u8]) -> Self {
        FileDigest { bytes: bytes.len() as u64, crc32c: crc32c::crc32c(bytes) }
    }

    /// Checks the length of the file read from `path` against this digest.
    fn check_len(&self, path: &Path, len: usize) -> Result<()> {
        if len as u64 != self.bytes {
            return Err(corrupt(path, format!("{len} bytes, where _metadata recorded {}", self.bytes)));
        }
        Ok(())
    }

    /// Checks the CRC-32C of the file read from `path` against this digest.
    fn check_crc(&self, path: &Path, crc: u32) -> Result<()> {
        if crc != self.crc32c {
            return Err(corrupt(
                path,
                format!("whole-file checksum {crc:08x}, where _metadata recorded {:08x}", self.crc32c),
            ));
        }
        Ok(())
    }
}

/// The folder, under the checkpoint directory, of files that incremental checkpoints share.
pub const SHARED_DIR: &str = "shared";

/// One input channel's part in an adaptive checkpoint at its task.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChannelAlignment {
    /// The task's index in the job's plan.
    pub task: usize,
    /// The channel's index among the task's input channels.
    pub channel: usize,
    /// Aligned (everything before its barrier was processed before the snapshot) or captured.
    pub aligned: bool,
    /// In-flight bytes captured from it.
    pub bytes: u64,
    /// From the checkpoint's first barrier at the task until the channel reached its barrier
    /// (aligned) or the task snapshotted (captured), milliseconds.
    pub wait_ms: f64,
}

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
    /// The configuration it ran under: the interval in force when it was triggered (the
    /// interval during backlog, if a source reported one), and its timeout.
    #[serde(default)]
    pub interval_ms: f64,
    /// See `interval_ms`.
    #[serde(default)]
    pub timeout_ms: f64,
    /// How its barriers went: `aligned`, `unaligned`, `aligned-timeout` (aligned, turning
    /// unaligned after `alignment_timeout_ms`), `adaptive` (under `inflight_budget`),
    /// `at-least-once` or `savepoint`.
    #[serde(default)]
    pub alignment: String,
    /// See `alignment`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alignment_timeout_ms: Option<f64>,
    /// Adaptive alignment: the in-flight budget it ran under (bytes), and each task's input
    /// channels, aligned or captured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inflight_budget: Option<u64>,
    /// See `inflight_budget`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub channels: Vec<ChannelAlignment>,
    /// A checkpoint that resumed a failed one (it expired, or a task declined it): that
    /// checkpoint's id, and each task's part, reused or why not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_from: Option<u64>,
    /// See `resumed_from`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<PartReuse>,
}

/// One task's part in a checkpoint that resumed a failed one.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PartReuse {
    /// The task's index in the job's plan.
    pub task: usize,
    /// The task's name.
    pub name: String,
    /// Its part is the one it completed for the failed checkpoint (nothing it depends on
    /// changed since), not written again.
    pub reused: bool,
    /// Why not, when it was written again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why_not: Option<String>,
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
}

fn checkpoint_kind() -> String {
    "checkpoint".into()
}

fn corrupt(path: &Path, what: impl std::fmt::Display) -> Error {
    Error::Corrupt(format!("{}: {what}", path.display()))
}

/// Writes `payload` as a checksummed file with `identity`, and fsyncs it. Returns its digest.
pub fn write_file(path: &Path, identity: &FileIdentity, payload: &[u8]) -> std::io::Result<FileDigest> {
    let mut w = ChecksummedWriter::create(path, identity)?;
    w.write(payload)?;
    w.finish()
}

/// The image of a file with `identity` holding `payload`, in memory: exactly what
/// [`write_file`] writes (for tests and fuzzing, which need valid files to damage or to wrap
/// input in).
pub fn encode_file(identity: &FileIdentity, payload: &[u8]) -> Vec<u8> {
    let mut w = ChecksummedWriter::new(Vec::new(), identity).expect("writing to memory cannot fail");
    w.write(payload).expect("writing to memory cannot fail");
    w.finish_unsynced().expect("writing to memory cannot fail").0
}

/// A checksummed file written as its payload arrives: each 64 KiB block is framed and handed
/// to the file once full, so a large snapshot never needs its whole encoding in memory. It
/// keeps the CRC-32C of every byte it writes, for `_metadata`.
pub struct ChecksummedWriter<W: Write = std::io::BufWriter<File>> {
    out: DigestedOutput<W>,
    block: Vec<u8>,
    payload: u64,
}

/// An output that keeps the digest of everything written to it.
struct DigestedOutput<W> {
    out: W,
    digest: FileDigest,
}

impl<W: Write> DigestedOutput<W> {
    fn put(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.out.write_all(bytes)?;
        self.digest.bytes += bytes.len() as u64;
        self.digest.crc32c = crc32c::crc32c_append(self.digest.crc32c, bytes);
        Ok(())
    }

    fn block(&mut self, block: &[u8]) -> std::io::Result<()> {
        let crc = crc32c::crc32c(block);
        self.put(&(block.len() as u32).to_le_bytes())?;
        self.put(&crc.to_le_bytes())?;
        // The file's checksum reads the block again: hardware CRC over a block costs less
        // than combining the block's checksum into the file's (a 32×32 matrix power, 4% of
        // a checkpointing q18 run).
        self.put(block)
    }
}

impl ChecksummedWriter {
    /// Creates (or truncates) `path` and writes the header of a file with `identity`.
    pub fn create(path: &Path, identity: &FileIdentity) -> std::io::Result<Self> {
        ChecksummedWriter::new(std::io::BufWriter::with_capacity(1 << 20, File::create(path)?), identity)
    }

    /// Writes the last block and the terminator, and fsyncs the file. Returns its digest.
    pub fn finish(self) -> std::io::Result<FileDigest> {
        let (out, digest) = self.finish_unsynced()?;
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        Ok(digest)
    }
}

impl<W: Write> ChecksummedWriter<W> {
    /// Writes the header of a file with `identity` to `out`.
    pub fn new(out: W, identity: &FileIdentity) -> std::io::Result<Self> {
        let mut out = DigestedOutput { out, digest: FileDigest::default() };
        out.put(&identity.header())?;
        Ok(ChecksummedWriter { out, block: Vec::with_capacity(BLOCK_BYTES), payload: 0 })
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
                self.out.block(&data[..BLOCK_BYTES])?;
                data = &data[BLOCK_BYTES..];
                continue;
            }
            let n = (BLOCK_BYTES - self.block.len()).min(data.len());
            self.block.extend_from_slice(&data[..n]);
            data = &data[n..];
            if self.block.len() == BLOCK_BYTES {
                self.out.block(&self.block)?;
                self.block.clear();
            }
        }
        Ok(())
    }

    /// Writes the last block and the terminator, and flushes. Returns the output and the
    /// file's digest.
    pub fn finish_unsynced(mut self) -> std::io::Result<(W, FileDigest)> {
        if !self.block.is_empty() {
            self.out.block(&self.block)?;
        }
        // Terminator: a zero-length block carrying the payload's length, so truncation at a
        // block boundary is detected too.
        let total = self.payload.to_le_bytes();
        self.out.put(&0u32.to_le_bytes())?;
        self.out.put(&crc32c::crc32c(&total).to_le_bytes())?;
        self.out.put(&total)?;
        self.out.out.flush()?;
        Ok((self.out.out, self.out.digest))
    }
}

/// Reads a whole file; an error here is an I/O error, never damage.
fn read_bytes(path: &Path) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(|e| Error::io("cannot read checkpoint file", path, e))?;
    Ok(bytes)
}

/// Reads and verifies a file written by [`write_file`]; returns what its header says it is,
/// and its payload.
pub fn read_file(path: &Path, kind: FileKind) -> Result<(FileIdentity, Vec<u8>)> {
    decode_file(&read_bytes(path)?, kind).map_err(|m| corrupt(path, m))
}

/// Reads a file that must be exactly `expected` (and, with a digest, have the length and
/// checksum recorded for it); returns its payload. A file that verifies but is another
/// task's, checkpoint's or job's is damage, named as such; so is a file with a digest (one a
/// `_metadata` lists) that does not exist: the checkpoint is incomplete, and recovery falls
/// back past it as past any damage (where another read error stops it).
pub fn read_expected(path: &Path, expected: &FileIdentity, digest: Option<&FileDigest>) -> Result<Vec<u8>> {
    let bytes = match read_bytes(path) {
        Err(Error::Io { source, .. }) if digest.is_some() && source.kind() == std::io::ErrorKind::NotFound => {
            return Err(corrupt(path, "missing (the checkpoint's _metadata lists it)"));
        }
        r => r?,
    };
    if let Some(d) = digest {
        d.check_len(path, bytes.len())?;
    }
    let (found, payload, crc) = decode_digested(&bytes, expected.kind).map_err(|m| corrupt(path, m))?;
    if let Some(d) = digest {
        d.check_crc(path, crc)?;
    }
    check_identity(path, &found, expected)?;
    Ok(payload)
}

/// A file whose header names another owner than `expected` is misplaced.
fn check_identity(path: &Path, found: &FileIdentity, expected: &FileIdentity) -> Result<()> {
    // An empty expected fingerprint accepts any job (readers that learn it from _metadata).
    let job_ok = expected.fingerprint.is_empty() || found.fingerprint == expected.fingerprint;
    if job_ok && found.checkpoint == expected.checkpoint && found.task == expected.task {
        return Ok(());
    }
    Err(corrupt(path, format!("misplaced file: it is the {found}, where the {expected} belongs")))
}

/// Verifies and decodes a whole file image of `kind`: what its header says it is, and its
/// payload. Errors say what is wrong; never panics.
pub fn decode_file(bytes: &[u8], kind: FileKind) -> std::result::Result<(FileIdentity, Vec<u8>), String> {
    decode_digested(bytes, kind).map(|(identity, payload, _)| (identity, payload))
}

/// [`decode_file`], also returning the CRC-32C of the whole image, extended from each block's
/// checksum as it is verified (so the bytes are checksummed once).
fn decode_digested(bytes: &[u8], kind: FileKind) -> std::result::Result<(FileIdentity, Vec<u8>, u32), String> {
    if bytes.len() < 8 {
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
    if bytes.len() < HEADER_BYTES {
        return Err(format!("file too short for a header ({} bytes)", bytes.len()));
    }
    if crc32c::crc32c(&bytes[..44]) != word(44) {
        return Err("header checksum mismatch".into());
    }
    if word(8) != kind as u32 {
        let found = FileKind::from_u32(word(8)).map_or_else(|| format!("kind {}", word(8)), |k| format!("{k:?}"));
        return Err(format!("a {found} file where {kind:?} was expected"));
    }
    if word(40) != 0 {
        return Err(format!("reserved header field is {}, not 0", word(40)));
    }
    let fingerprint = &bytes[24..24 + FINGERPRINT_BYTES];
    let fingerprint = &fingerprint[..fingerprint.iter().position(|&b| b == 0).unwrap_or(FINGERPRINT_BYTES)];
    let identity = FileIdentity {
        kind,
        fingerprint: String::from_utf8(fingerprint.to_vec()).map_err(|_| "job fingerprint is not text".to_string())?,
        checkpoint: u64::from_le_bytes(bytes[16..24].try_into().expect("8 bytes")),
        task: (word(12) != NO_TASK).then(|| word(12) as usize),
    };
    let mut pos = HEADER_BYTES;
    let mut payload = Vec::new();
    let mut file_crc = crc32c::crc32c(&bytes[..HEADER_BYTES]);
    loop {
        if bytes.len() < pos + 8 {
            return Err(format!("truncated at byte {pos} (block header missing)"));
        }
        let len = word(pos) as usize;
        let crc = word(pos + 4);
        file_crc = crc32c::crc32c_append(file_crc, &bytes[pos..pos + 8]);
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
            return Ok((identity, payload, crc32c::crc32c_append(file_crc, total)));
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
        file_crc = crc32c::crc32c_append(file_crc, block);
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
struct SharedFiles<'a> {
    root: &'a Path,
    fingerprint: &'a str,
    recorded: HashMap<&'a str, FileDigest>,
    loaded: HashMap<String, Vec<u8>>,
}

impl<'a> SharedFiles<'a> {
    fn of(root: &'a Path, metadata: &'a CheckpointMetadata) -> Self {
        SharedFiles {
            root,
            fingerprint: &metadata.fingerprint,
            recorded: metadata.shared.iter().map(|s| (s.file.as_str(), s.digest())).collect(),
            loaded: HashMap::new(),
        }
    }

    fn range(&mut self, name: &str, offset: u64, len: u64) -> Result<&[u8]> {
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

/// The checkpoint and task of a shared file's name, `shared/chk-<n>-task-<i>.pages`.
fn parse_shared_name(name: &str) -> Option<(u64, usize)> {
    let rest = name.strip_prefix(SHARED_DIR)?.strip_prefix('/')?.strip_prefix("chk-")?.strip_suffix(".pages")?;
    let (id, task) = rest.split_once("-task-")?;
    Some((id.parse().ok()?, task.parse().ok()?))
}

/// The identity task `t`'s file of the checkpoint `metadata` describes must have.
fn task_identity(metadata: &CheckpointMetadata, t: &TaskFile) -> FileIdentity {
    let written_for = t.checkpoint.unwrap_or(metadata.checkpoint);
    FileIdentity::new(FileKind::TaskState, &metadata.fingerprint, written_for, Some(t.task))
}

/// Reads one task file (checked against its identity and digest) and resolves its chunks:
/// (operator, subtask, state bytes) per part.
fn read_task_parts(
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

/// A checkpoint folder tree. Files it writes carry the fingerprint of the job it was made
/// for ([`CheckpointStorage::for_job`]).
#[derive(Clone, Debug)]
pub struct CheckpointStorage {
    dir: PathBuf,
    fingerprint: String,
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
        CheckpointStorage { dir: dir.into(), fingerprint: String::new() }
    }

    /// Storage under `dir` for the job with graph fingerprint `fingerprint`: every file it
    /// writes names that job.
    pub fn for_job(dir: impl Into<PathBuf>, fingerprint: &str) -> Self {
        CheckpointStorage { dir: dir.into(), fingerprint: header_fingerprint(fingerprint) }
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

    /// Starts the shared pages file of task `task` for checkpoint `id`.
    pub fn create_shared(&self, id: u64, task: usize) -> std::io::Result<ChecksummedWriter> {
        let path = self.dir.join(Self::shared_name(id, task));
        let folder = self.dir.join(SHARED_DIR);
        let identity = FileIdentity::new(FileKind::SharedPages, &self.fingerprint, id, Some(task));
        std::fs::create_dir_all(&folder)
            .and_then(|_| ChecksummedWriter::create(&path, &identity))
            .map_err(|e| std::io::Error::new(e.kind(), format!("cannot create {}: {e}", path.display())))
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

/// Writes `<dir>/_metadata` atomically: temporary file, fsync, rename, fsync of the folder.
fn write_metadata(d: &Path, metadata: &CheckpointMetadata) -> Result<()> {
    let identity = FileIdentity::new(FileKind::Metadata, &metadata.fingerprint, metadata.checkpoint, None);
    publish_json(d, METADATA_FILE, &identity, metadata, "checkpoint metadata")
}

/// Writes `value` as JSON into `<dir>/<name>` atomically: a temporary file with `identity`,
/// fsync, rename, fsync of the folder. `what` names the file in errors.
fn publish_json(dir: &Path, name: &str, identity: &FileIdentity, value: &impl Serialize, what: &str) -> Result<()> {
    let tmp = write_json_unpublished(dir, name, identity, value, what)?;
    let target = dir.join(name);
    std::fs::rename(&tmp, &target).map_err(|e| Error::io(format!("cannot publish {what}"), &target, e))?;
    sync_folder(dir)
}

/// The first half of [`publish_json`]: the temporary file, durable; returns its path.
fn write_json_unpublished(
    dir: &Path,
    name: &str,
    identity: &FileIdentity,
    value: &impl Serialize,
    what: &str,
) -> Result<PathBuf> {
    let tmp = dir.join(format!("{name}.inprogress"));
    let json = serde_json::to_vec_pretty(value).map_err(|e| Error::Corrupt(e.to_string()))?;
    write_file(&tmp, identity, &json).map_err(|e| Error::io(format!("cannot write {what}"), &tmp, e))?;
    Ok(tmp)
}

/// Decodes the JSON payload of the file at `path`, whose header said it is `found`: the
/// content must describe the same file (`described`), else the file is misplaced.
fn decode_described<T: serde::de::DeserializeOwned>(
    path: &Path,
    found: &FileIdentity,
    json: &[u8],
    what: &str,
    described: impl Fn(&T) -> FileIdentity,
) -> Result<T> {
    let value: T = serde_json::from_slice(json).map_err(|e| corrupt(path, format!("unreadable {what}: {e}")))?;
    let described = described(&value);
    if *found != described {
        return Err(corrupt(path, format!("its header is the {found}, and its content describes the {described}")));
    }
    Ok(value)
}

/// Makes a folder's entries (a rename into it) durable.
pub(crate) fn sync_folder(d: &Path) -> Result<()> {
    File::open(d).and_then(|f| f.sync_all()).map_err(|e| Error::io("cannot sync checkpoint folder", d, e))
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

/// Reads and verifies a whole checkpoint or savepoint folder: every file's length, checksum
/// and identity. Shared files an incremental checkpoint refers to are read from the folder
/// above it (the checkpoint directory).
pub fn load_dir(dir: &Path) -> Result<LoadedCheckpoint> {
    let metadata = read_metadata(dir)?;
    let mut state = RestoredState::new(metadata.checkpoint);
    let root = dir.parent().unwrap_or(dir);
    let mut shared = SharedFiles::of(root, &metadata);
    for t in &metadata.tasks {
        let path = dir.join(&t.file);
        for (op, subtask, bytes) in read_task_parts(&path, &task_identity(&metadata, t), &t.digest(), &mut shared)? {
            state.insert(op, subtask as usize, bytes);
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
                let own = name[SHARED_DIR.len() + 1..].starts_with(&prefix);
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
        load_dir(&self.checkpoint_dir(id))
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
        let mut shared = SharedFiles::of(&self.dir, &source);
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
        let mut found = RecoveryPoint::default();
        for id in self.list().into_iter().rev() {
            if !self.is_complete(id) {
                // Never completed (crashed or aborted mid-way): not a checkpoint at all.
                continue;
            }
            before_load(id);
            match self.load(id) {
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
        while completed.len() > keep {
            let old = completed.remove(0);
            if let Ok(m) = self.metadata(old) {
                candidates.extend(m.shared.into_iter().map(|s| s.file));
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
                Ok(m) => needed.extend(m.shared.into_iter().map(|s| s.file)),
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
        deleted
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn task_file(id: u64, task: usize) -> FileIdentity {
        FileIdentity::new(FileKind::TaskState, "0123456789abcdef", id, Some(task))
    }

    #[test]
    fn files_round_trip_and_damage_is_detected() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let payload: Vec<u8> = (0..200_000u32).map(|i| (i * 7) as u8).collect();
        let digest = write_file(&path, &task_file(4, 2), &payload).unwrap();
        assert_eq!(read_file(&path, FileKind::TaskState).unwrap(), (task_file(4, 2), payload.clone()));
        assert_eq!(read_expected(&path, &task_file(4, 2), Some(&digest)).unwrap(), payload);
        assert!(read_file(&path, FileKind::Metadata).is_err(), "wrong kind");
        let good = std::fs::read(&path).unwrap();
        assert_eq!(FileDigest::of(&good), digest);
        // Truncations and every kind of flipped byte are caught.
        for cut in [0, 3, 15, 16, 47, 48, 100, 65_000, good.len() - 8, good.len() - 1] {
            assert!(decode_file(&good[..cut], FileKind::TaskState).is_err(), "cut at {cut}");
        }
        for at in [0, 5, 9, 13, 17, 25, 41, 45, 48, 52, 60, 70_000, good.len() - 3] {
            let mut bad = good.clone();
            bad[at] ^= 0x40;
            assert!(decode_file(&bad, FileKind::TaskState).is_err(), "flip at {at}");
        }
        let mut longer = good.clone();
        longer.push(0);
        assert!(decode_file(&longer, FileKind::TaskState).is_err());
    }

    /// A file that verifies but was written for another task, checkpoint or job is refused,
    /// naming what it is and what belongs there; so is one whose length or checksum is not
    /// what was recorded for it.
    #[test]
    fn files_that_belong_elsewhere_are_misplaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let digest = write_file(&path, &task_file(4, 2), b"state").unwrap();
        for (expected, what) in [
            (task_file(4, 0), "task 2"),
            (task_file(3, 2), "checkpoint 4"),
            (FileIdentity::new(FileKind::TaskState, "fedcba9876543210", 4, Some(2)), "job 0123456789abcdef"),
        ] {
            let err = read_expected(&path, &expected, None).unwrap_err().to_string();
            assert!(err.contains("misplaced") && err.contains(what) && err.contains("f:"), "{err}");
        }
        let other = FileDigest { bytes: digest.bytes, crc32c: digest.crc32c ^ 1 };
        let err = read_expected(&path, &task_file(4, 2), Some(&other)).unwrap_err().to_string();
        assert!(err.contains("whole-file checksum"), "{err}");
        let shorter = FileDigest { bytes: digest.bytes - 1, ..digest };
        assert!(read_expected(&path, &task_file(4, 2), Some(&shorter)).unwrap_err().to_string().contains("bytes"));
    }

    /// A checkpoint that reused a failed one's part refers to shared pages no completed
    /// checkpoint verified: read back whole, a flipped bit in them fails verification, which
    /// the length alone (enough for pages a completed checkpoint verified) does not see.
    #[test]
    fn shared_pages_of_a_failed_checkpoint_are_verified_whole_when_first_reused() {
        let dir = tempfile::tempdir().unwrap();
        let s = CheckpointStorage::new(dir.path());
        let mut w = s.create_shared(1, 0).unwrap();
        w.write(&[7u8; 5000]).unwrap();
        let shared = SharedFile::new(CheckpointStorage::shared_name(1, 0), w.finish().unwrap());
        s.prepare(2).unwrap();
        let parts = TaskFileContent::inline(vec![("op".into(), 0, vec![2; 10])]);
        let (file, digest) = s.write_task(2, 0, &parts).unwrap();
        s.commit(&test_metadata(2, file, digest, vec![shared.clone()])).unwrap();
        let whole: HashSet<String> = [shared.file.clone()].into();
        s.verify_including(2, &whole).unwrap();
        let path = dir.path().join(&shared.file);
        let mut b = std::fs::read(&path).unwrap();
        b[3000] ^= 1;
        std::fs::write(&path, b).unwrap();
        assert!(s.verify(2).is_ok(), "its length is unchanged");
        let err = s.verify_including(2, &whole).unwrap_err().to_string();
        assert!(err.contains("chk-1-task-0.pages"), "{err}");
    }

    #[test]
    fn checkpoints_commit_load_and_fall_back_past_damage() {
        let dir = tempfile::tempdir().unwrap();
        let s = CheckpointStorage::new(dir.path());
        for id in 1..=3u64 {
            s.prepare(id).unwrap();
            let parts = TaskFileContent::inline(vec![("op".into(), 0, vec![id as u8; 10])]);
            let (file, digest) = s.write_task(id, 0, &parts).unwrap();
            s.commit(&test_metadata(id, file, digest, Vec::new())).unwrap();
            assert!(s.verify(id).is_ok());
        }
        s.prepare(4).unwrap(); // never completed
        let found = s.latest_valid().unwrap();
        assert_eq!(found.checkpoint.unwrap().state.get("op", 0), Some(&[3u8; 10][..]));
        assert!(found.skipped.is_empty());
        // Damage checkpoint 3's task file: recovery falls back to 2 and says why.
        let f = s.checkpoint_dir(3).join("task-0.state");
        let mut b = std::fs::read(&f).unwrap();
        b[60] ^= 1;
        std::fs::write(&f, b).unwrap();
        assert!(s.verify(3).is_err());
        let found = s.latest_valid().unwrap();
        assert_eq!(found.checkpoint.unwrap().metadata.checkpoint, 2);
        assert_eq!(found.skipped.len(), 1);
        assert!(found.skipped[0].0 == 3 && found.skipped[0].1.contains("checksum"), "{:?}", found.skipped);
        // Checkpoint 2's file where checkpoint 1's belongs: misplaced.
        std::fs::copy(s.checkpoint_dir(2).join("task-0.state"), s.checkpoint_dir(1).join("task-0.state")).unwrap();
        let err = s.load(1).unwrap_err().to_string();
        assert!(err.contains("chk-1") && err.contains("task-0.state"), "{err}");
        let mut completed = vec![1, 2, 3];
        assert!(s.retain(&mut completed, 1, &HashSet::new()).is_empty());
        assert_eq!(completed, vec![3]);
        assert_eq!(s.list(), vec![3, 4]);
    }

    /// A file that cannot be read is not damage: recovery stops with the I/O error instead of
    /// falling back past the checkpoint.
    #[test]
    fn an_unreadable_file_stops_recovery_and_is_not_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let s = CheckpointStorage::new(dir.path());
        for id in 1..=2u64 {
            s.prepare(id).unwrap();
            let (file, digest) =
                s.write_task(id, 0, &TaskFileContent::inline(vec![("op".into(), 0, vec![1])])).unwrap();
            s.commit(&test_metadata(id, file, digest, Vec::new())).unwrap();
        }
        // A symbolic link to itself: open(2) fails (ELOOP), as it would with EACCES or EIO.
        let f = s.checkpoint_dir(2).join("task-0.state");
        std::fs::rename(&f, dir.path().join("aside")).unwrap();
        std::os::unix::fs::symlink(&f, &f).unwrap();
        let err = s.latest_valid().unwrap_err();
        assert!(matches!(err, Error::Io { .. }) && err.to_string().contains("task-0.state"), "{err}");
        std::fs::remove_file(&f).unwrap();
        std::fs::rename(dir.path().join("aside"), &f).unwrap();
        assert_eq!(s.latest_valid().unwrap().checkpoint.unwrap().metadata.checkpoint, 2);
    }
}
