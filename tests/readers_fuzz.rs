//! Every reader of checkpoint bytes takes arbitrary input and answers with a value or an
//! error: never a panic, never an allocation sized by a corrupt length. Random bytes, and
//! valid files with random damage (flipped, truncated, spliced), through the file decoder, the
//! task file and metadata decoders, and the state decoders of the built-in operators.

use proptest::prelude::*;
use weir::checkpoint::{decode_file, write_file, CheckpointMetadata, FileKind, StoredChunk, TaskFileContent};
use weir::persist::{from_bytes, to_bytes};
use weir::Word;

/// Everything a restore decodes, from one byte string.
fn decode_all(bytes: &[u8]) {
    let _ = decode_file(bytes, FileKind::TaskState);
    let _ = decode_file(bytes, FileKind::Metadata);
    let _ = decode_file(bytes, FileKind::SharedPages);
    let _ = from_bytes::<TaskFileContent>(bytes);
    let _ = serde_json::from_slice::<CheckpointMetadata>(bytes);
    let _ = from_bytes::<Vec<(u64, u64)>>(bytes);
    let _ = from_bytes::<Vec<(Word, u64)>>(bytes);
    let _ = from_bytes::<(Option<i64>, Option<i64>, Vec<(i64, Vec<(u64, u64)>)>)>(bytes);
    let _ = from_bytes::<(u64, Vec<u64>)>(bytes);
    let _ = from_bytes::<Vec<(String, u64, u64, bool)>>(bytes);
    let _ = from_bytes::<weir::nexmark::Event>(bytes);
}

fn a_task_file() -> Vec<u8> {
    let content = TaskFileContent {
        shared: vec!["shared/chk-1-task-0.pages".into()],
        parts: vec![
            ("count".into(), 0, vec![StoredChunk::Inline(to_bytes(&vec![(1u64, 2u64), (3, 4)]))]),
            ("sink".into(), 1, vec![StoredChunk::Shared { file: 0, offset: 8, len: 16 }]),
        ],
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    write_file(&path, FileKind::TaskState, &to_bytes(&content)).unwrap();
    std::fs::read(path).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        decode_all(&bytes);
    }

    #[test]
    fn damaged_files_are_refused_never_misread(flips in prop::collection::vec((any::<usize>(), 1u8..=255), 1..4),
                                                cut in any::<usize>(), splice in prop::collection::vec(any::<u8>(), 0..32)) {
        let good = a_task_file();
        let mut bad = good.clone();
        for (at, x) in &flips {
            let i = at % bad.len();
            bad[i] ^= x;
        }
        // Every flipped byte is caught by a checksum, the header or the terminator.
        prop_assert!(decode_file(&bad, FileKind::TaskState).is_err());
        decode_all(&bad);
        let truncated = &good[..cut % good.len()];
        prop_assert!(decode_file(truncated, FileKind::TaskState).is_err());
        decode_all(truncated);
        let mut spliced = good[..cut % good.len()].to_vec();
        spliced.extend_from_slice(&splice);
        spliced.extend_from_slice(&good[cut % good.len()..]);
        if !splice.is_empty() {
            prop_assert!(decode_file(&spliced, FileKind::TaskState).is_err());
        }
        decode_all(&spliced);
    }

    /// Lengths claiming far more than the input are refused before anything is allocated.
    #[test]
    fn huge_lengths_are_refused(len in (1u64 << 40)..u64::MAX, tail in prop::collection::vec(any::<u8>(), 0..16)) {
        let mut bytes = len.to_le_bytes().to_vec();
        bytes.extend_from_slice(&tail);
        prop_assert!(from_bytes::<Vec<u64>>(&bytes).is_err());
        prop_assert!(from_bytes::<String>(&bytes).is_err());
        let mut chunk = vec![0u8];
        chunk.extend_from_slice(&bytes);
        prop_assert!(from_bytes::<StoredChunk>(&chunk).is_err());
    }
}
