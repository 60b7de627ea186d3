//! A whole checkpoint folder whose task file and shared pages file hold arbitrary payloads
//! (in valid files): a restore resolves the task file's chunks against the shared file and
//! must refuse, never panic on, ranges and names that lead nowhere.
#![no_main]

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| {
    let Some((&cut, rest)) = bytes.split_first() else { return };
    let (task, shared) = rest.split_at((cut as usize).min(rest.len()));
    let scratch = tempfile::tempdir().expect("a scratch folder");
    let _ = weir::fuzzing::load_fuzzed_checkpoint(scratch.path(), task, shared);
});
