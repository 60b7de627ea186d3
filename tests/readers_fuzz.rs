//! Every reader of checkpoint bytes takes arbitrary input and answers with a value or an
//! error: never a panic, never an allocation sized by a corrupt length. Random bytes, and
//! valid files with random damage (flipped, truncated, spliced), through the file decoder, the
//! task file and metadata decoders, and the state decoders of the built-in operators; and whole
//! checkpoints whose task file refers to arbitrary ranges of a shared file. The same entry
//! points (`weir::fuzzing`) are the cargo-fuzz targets in `fuzz/`.

use proptest::prelude::*;
use weir::checkpoint::{decode_file, encode_file, FileIdentity, FileKind, StoredChunk, TaskFileContent};
use weir::fuzzing::{decode_every_reader as decode_all, load_fuzzed_checkpoint};
use weir::persist::{from_bytes, to_bytes};

fn a_task_file() -> Vec<u8> {
    let content = TaskFileContent {
        shared: vec!["shared/chk-1-task-0.pages".into()],
        parts: vec![
            ("count".into(), 0, vec![StoredChunk::Inline(to_bytes(&vec![(1u64, 2u64), (3, 4)]))]),
            ("sink".into(), 1, vec![StoredChunk::Shared { file: 0, offset: 8, len: 16 }]),
        ],
    };
    encode_file(&FileIdentity::new(FileKind::TaskState, "0123456789abcdef", 1, Some(0)), &to_bytes(&content))
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

    /// A task file's chunks point anywhere in (or past) a shared file: a restore resolves the
    /// ranges inside it and refuses the rest, and what loads is exactly the bytes referred to.
    #[test]
    fn chunks_of_shared_files_are_bounds_checked(
        chunks in prop::collection::vec((0u32..3, any::<u16>(), any::<u16>(), prop::option::of(prop::collection::vec(any::<u8>(), 0..8)), 0u8..4), 0..6),
        shared in prop::collection::vec(any::<u8>(), 0..600),
    ) {
        let scratch = tempfile::tempdir().unwrap();
        let range = |offset: u64, len: u64| shared.get(offset as usize..(offset + len) as usize);
        let stored: Vec<StoredChunk> = chunks
            .iter()
            .map(|(file, offset, len, inline, kind)| {
                let (offset, len) = (u64::from(*offset) % 700, u64::from(*len) % 300);
                match (inline, kind) {
                    (Some(bytes), _) => StoredChunk::Inline(bytes.clone()),
                    // A page chunk with its checksum (or, one time in three, a wrong one).
                    (None, 1..=3) => {
                        let crc = range(offset, len).map_or(0, crc32c::crc32c) ^ u32::from(*kind == 3);
                        StoredChunk::Page { file: *file, offset, len: len as u32, crc }
                    }
                    (None, _) => StoredChunk::Shared { file: *file, offset, len },
                }
            })
            .collect();
        // What the part's bytes must be, or the error where a chunk points outside the shared
        // file or a page fails its checksum.
        let expected: Result<Vec<u8>, &str> = stored.iter().try_fold(Vec::new(), |mut acc, c| {
            match c {
                StoredChunk::Inline(bytes) => acc.extend_from_slice(bytes),
                StoredChunk::Shared { file: 0, offset, len } if offset + len <= shared.len() as u64 => {
                    acc.extend_from_slice(&shared[*offset as usize..(offset + len) as usize])
                }
                StoredChunk::Page { file: 0, offset, len, crc } if offset + u64::from(*len) <= shared.len() as u64 => {
                    let page = range(*offset, u64::from(*len)).unwrap();
                    if crc32c::crc32c(page) != *crc {
                        return Err("fails its checksum");
                    }
                    acc.extend_from_slice(page)
                }
                StoredChunk::Shared { .. } | StoredChunk::Page { .. } => return Err("refers to"),
            }
            Ok(acc)
        });
        let content = TaskFileContent {
            shared: vec!["shared/chk-1-task-0.pages".into()],
            parts: vec![("op".into(), 0, stored)],
        };
        let loaded = load_fuzzed_checkpoint(scratch.path(), &to_bytes(&content), &shared);
        match (expected, loaded) {
            (Ok(bytes), Ok(c)) => prop_assert_eq!(c.state.get("op", 0), Some(&bytes[..])),
            (Err(why), Err(e)) => prop_assert!(e.to_string().contains(why), "{}", e),
            (expected, loaded) => prop_assert!(false, "expected {:?}, loaded {:?}", expected, loaded.map(|_| ())),
        }
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
