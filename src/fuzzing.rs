//! Entry points for fuzzing the readers of checkpoint bytes: the cargo-fuzz targets in
//! `fuzz/` and the proptest run in `tests/readers_fuzz.rs` call these, so both exercise the
//! same readers. Not part of the API (hidden from the docs).
//!
//! May touch: `checkpoint`, `error`, `persist`, `record`, `source` (the word
//! encoding), `state` (the paged map's snapshot format).

use std::path::Path;

use crate::checkpoint::{
    decode_file, encode_file, load_dir, CheckpointMetadata, CheckpointStats, FileDigest, FileIdentity, FileKind,
    LoadedCheckpoint, SharedFile, TaskFile, TaskFileContent, FORMAT_VERSION, METADATA_FILE,
};
use crate::error::Result;
use crate::persist::from_bytes;
use crate::Word;

/// Runs every reader a restore uses over `bytes`: the file decoder for each kind, the task
/// file and metadata decoders, and the state decoders of the built-in operators. Each must
/// answer with a value or an error; a panic (or an allocation sized by a corrupt length) is
/// the bug a fuzzer looks for.
pub fn decode_every_reader(bytes: &[u8]) {
    for kind in [FileKind::TaskState, FileKind::Metadata, FileKind::SharedPages, FileKind::Finished, FileKind::Lock] {
        if let Ok((_, payload)) = decode_file(bytes, kind) {
            decode_payload(&payload);
        }
    }
    decode_payload(bytes);
}

/// The decoders of what a file's payload holds.
fn decode_payload(bytes: &[u8]) {
    let _ = from_bytes::<TaskFileContent>(bytes);
    let _ = serde_json::from_slice::<CheckpointMetadata>(bytes);
    let _ = from_bytes::<Vec<(u64, u64)>>(bytes);
    let _ = from_bytes::<Vec<(Word, u64)>>(bytes);
    let _ = from_bytes::<(Option<i64>, Option<i64>, Vec<(i64, Vec<(u64, u64)>)>)>(bytes);
    let _ = from_bytes::<crate::state::PagedImage<u64, u64>>(bytes);
    let _ = from_bytes::<crate::state::PagedImage<Word, u64>>(bytes);
    let _ = from_bytes::<(Option<i64>, Vec<(i64, crate::state::PagedImage<Word, u64>)>)>(bytes);
    let _ = from_bytes::<(u64, Vec<u64>)>(bytes);
    let _ = from_bytes::<Vec<(String, u64, u64, bool)>>(bytes);
    let _ = from_bytes::<DerivedShape>(bytes);
}

/// The shapes a job's records take through `#[derive(Persist)]` (an enum of boxed and plain
/// structs with strings and vectors), for the decoder of derived types.
#[derive(crate::Persist)]
#[allow(dead_code)] // decoded, never read
enum DerivedShape {
    Boxed(Box<DerivedFields>),
    Plain(DerivedFields),
    Empty,
}

#[derive(crate::Persist)]
#[allow(dead_code)] // decoded, never read
struct DerivedFields {
    id: u64,
    name: String,
    tags: Vec<u32>,
    price: Option<i64>,
}

/// Builds checkpoint 1 in `scratch` (an empty folder) from fuzzed payloads, each wrapped in a
/// valid file so the fuzzer gets past the checksums: one task file holding `task_payload`
/// and the shared pages file it may refer to holding `shared_payload`, under a valid
/// `_metadata`; then loads it as a restore would (resolving chunks, bounds-checking ranges of
/// the shared file).
pub fn load_fuzzed_checkpoint(scratch: &Path, task_payload: &[u8], shared_payload: &[u8]) -> Result<LoadedCheckpoint> {
    let dir = scratch.join("chk-1");
    let shared = scratch.join(crate::checkpoint::SHARED_DIR);
    let task_file = encode_file(&FileIdentity::new(FileKind::TaskState, "", 1, Some(0)), task_payload);
    let shared_file = encode_file(&FileIdentity::new(FileKind::SharedPages, "", 1, Some(0)), shared_payload);
    let (task_digest, shared_digest) = (FileDigest::of(&task_file), FileDigest::of(&shared_file));
    let metadata = CheckpointMetadata {
        format: FORMAT_VERSION,
        job: "fuzz".into(),
        fingerprint: String::new(),
        checkpoint: 1,
        kind: "checkpoint".into(),
        mode: "exactly-once".into(),
        generation: 1,
        completed_unix_ms: 0,
        stats: CheckpointStats::default(),
        tasks: vec![TaskFile {
            task: 0,
            name: "task".into(),
            file: "task-0.state".into(),
            bytes: task_digest.bytes,
            crc32c: task_digest.crc32c,
            checkpoint: None,
        }],
        shared: vec![SharedFile::new(crate::checkpoint::CheckpointStorage::shared_name(1, 0), shared_digest)],
        outputs: Vec::new(),
    };
    let json = serde_json::to_vec(&metadata).expect("metadata encodes");
    let files = [
        (dir.join(METADATA_FILE), encode_file(&FileIdentity::new(FileKind::Metadata, "", 1, None), &json)),
        (dir.join("task-0.state"), task_file),
        (shared.join("chk-1-task-0.pages"), shared_file),
    ];
    for (path, bytes) in &files {
        let written = path.parent().map_or(Ok(()), std::fs::create_dir_all).and_then(|_| std::fs::write(path, bytes));
        assert!(written.is_ok(), "cannot write the fuzzed checkpoint into {}", scratch.display());
    }
    load_dir(&dir)
}
