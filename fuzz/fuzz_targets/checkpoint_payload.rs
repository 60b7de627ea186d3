//! Arbitrary payloads inside valid checksummed files, so the fuzzer reaches the payload
//! decoders behind the checksums (random bytes almost never carry a right CRC).
#![no_main]

use weir::checkpoint::{encode_file, FileIdentity, FileKind};

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| {
    let Some((&which, payload)) = bytes.split_first() else { return };
    let kind = match which % 5 {
        0 => FileKind::TaskState,
        1 => FileKind::Metadata,
        2 => FileKind::SharedPages,
        3 => FileKind::Finished,
        _ => FileKind::Lock,
    };
    weir::fuzzing::decode_every_reader(&encode_file(&FileIdentity::new(kind, "", 1, Some(0)), payload));
});
