//! The file format every checkpoint file shares: a checksummed header that says what the
//! file is (magic `WEIR`, format version, file kind, the job's fingerprint, the checkpoint id
//! and the task index), then the payload in blocks of at most 64 KiB, each with its length and
//! CRC-32C, ended by a terminator that carries the payload's total length. Writing (whole, or
//! as the payload arrives), reading and verifying (a file that verifies but belongs to another
//! task, checkpoint or job is damage, like a flipped bit), and the atomic publication of a
//! JSON file (temporary file, fsync, rename, fsync of the folder).
//!
//! May touch: `error`.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

use super::*;

/// Version of the on-disk format; a reader refuses any other. (3: headers name the job,
/// checkpoint and task, and `_metadata` records whole-file checksums.)
pub const FORMAT_VERSION: u32 = 3;
pub(super) const MAGIC: [u8; 4] = *b"WEIR";
pub(super) const HEADER_BYTES: usize = 48;
/// Bytes of the job fingerprint kept in a header (a fingerprint is 16 hex digits).
pub(super) const FINGERPRINT_BYTES: usize = 16;
/// The task field of a file that belongs to no one task.
pub(super) const NO_TASK: u32 = u32::MAX;
pub(super) const BLOCK_BYTES: usize = 64 * 1024;
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
pub(super) fn header_fingerprint(fingerprint: &str) -> String {
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
    pub(super) fn check_len(&self, path: &Path, len: usize) -> Result<()> {
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

pub(super) fn corrupt(path: &Path, what: impl std::fmt::Display) -> Error {
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
pub(super) struct DigestedOutput<W> {
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
pub(super) fn read_bytes(path: &Path) -> Result<Vec<u8>> {
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
pub(super) fn check_identity(path: &Path, found: &FileIdentity, expected: &FileIdentity) -> Result<()> {
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
pub(super) fn decode_digested(
    bytes: &[u8],
    kind: FileKind,
) -> std::result::Result<(FileIdentity, Vec<u8>, u32), String> {
    let identity = decode_header(bytes, kind)?;
    let word = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
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

/// Verifies a file's header (the first [`HEADER_BYTES`] of `bytes` at least): what it says the
/// file is.
pub(super) fn decode_header(bytes: &[u8], kind: FileKind) -> std::result::Result<FileIdentity, String> {
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
    Ok(identity)
}

/// Writes `<dir>/_metadata` atomically: temporary file, fsync, rename, fsync of the folder.
pub(super) fn write_metadata(d: &Path, metadata: &CheckpointMetadata) -> Result<()> {
    let identity = FileIdentity::new(FileKind::Metadata, &metadata.fingerprint, metadata.checkpoint, None);
    publish_json(d, METADATA_FILE, &identity, metadata, "checkpoint metadata")
}

/// Writes `value` as JSON into `<dir>/<name>` atomically: a temporary file with `identity`,
/// fsync, rename, fsync of the folder. `what` names the file in errors.
pub(super) fn publish_json(
    dir: &Path,
    name: &str,
    identity: &FileIdentity,
    value: &impl Serialize,
    what: &str,
) -> Result<()> {
    let tmp = write_json_unpublished(dir, name, identity, value, what)?;
    let target = dir.join(name);
    std::fs::rename(&tmp, &target).map_err(|e| Error::io(format!("cannot publish {what}"), &target, e))?;
    sync_folder(dir)
}

/// The first half of [`publish_json`]: the temporary file, durable; returns its path.
pub(super) fn write_json_unpublished(
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
pub(super) fn decode_described<T: serde::de::DeserializeOwned>(
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

// Their fields are closures, shared internals or whole state: a name says enough.
crate::debug_as_name!([W: Write] ChecksummedWriter<W>);
