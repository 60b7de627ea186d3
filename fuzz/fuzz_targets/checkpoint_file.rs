//! Arbitrary bytes as a checkpoint file of every kind, and as every payload decoder's input.
#![no_main]

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| {
    weir::fuzzing::decode_every_reader(bytes);
});
