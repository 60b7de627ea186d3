//! Savepoints kept from earlier releases (`tests/fixtures/`), restored by this one: a format
//! moves on without breaking its users. Each fixture was taken, by the ignored test that makes
//! it, from the job below while it ran; restoring it into the same job (and at another
//! parallelism) must continue exactly, whatever the state's layout became since. A fixture
//! whose header names a format version this weir does not read is refused, naming the file,
//! the version found and the one read.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use weir::checkpoint::{CheckpointConfig, FORMAT_VERSION, METADATA_FILE};
use weir::sink::CommittedOutput;
use weir::source::Generator;
use weir::{Job, RunConfig, Stopped};

const N: u64 = 12_000;
const WORDS: u64 = 600;

/// The word of record `i`.
fn word(i: u64) -> String {
    format!("word-{}", i * 7919 % WORDS)
}

/// Words → a running count per word (`String` keys in paged state) → exactly-once collection.
fn job(checkpoints: &Path, p: usize) -> (Job, CommittedOutput<(String, u64)>) {
    let job = Job::new("format-fixture")
        .with_parallelism(p)
        .with_checkpointing(CheckpointConfig::new(checkpoints).interval(Duration::from_secs(3600)));
    let out = job
        .generator(Generator::new(|i, _| word(i)).count(N).rate(40_000.0))
        .named("words")
        .key_by(|w: &String| w.clone())
        .aggregate(|| 0u64, |c: &mut u64, _| *c += 1, |w: &String, c: &u64| (w.clone(), *c))
        .named("count")
        .collect_exactly_once();
    (job, out)
}

/// The savepoint of round 5 (format version 3, pages of `(Option<(K, V)>)` slots probed
/// linearly), taken half-way.
fn round_5() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/savepoint-round-5")
}

/// Each word's counts are exactly 1..=its total, once each: what the savepoint pre-committed,
/// committed at the restore, then the rest counted on from the restored state.
fn assert_continues(rows: &[(String, u64)]) {
    let mut totals: HashMap<String, u64> = HashMap::new();
    (0..N).for_each(|i| *totals.entry(word(i)).or_default() += 1);
    let mut seen: HashMap<&str, Vec<u64>> = HashMap::new();
    rows.iter().for_each(|(w, c)| seen.entry(w).or_default().push(*c));
    assert_eq!(seen.len(), totals.len());
    for (w, total) in &totals {
        let mut counts = seen.remove(w.as_str()).unwrap_or_default();
        counts.sort_unstable();
        assert_eq!(counts, (1..=*total).collect::<Vec<_>>(), "{w}");
    }
}

#[test]
fn the_round_5_savepoint_restores_exactly_at_its_parallelism_and_another() {
    for p in [2, 3] {
        let dir = tempfile::tempdir().unwrap();
        let (job, out) = job(dir.path(), p);
        let handle = job.restore_from(round_5(), false).start(RunConfig::default().workers(2)).unwrap();
        let notes = handle.notes().join("\n");
        handle.join().unwrap();
        assert!(notes.contains("restored from savepoint"), "{notes}");
        assert_continues(&out.records());
    }
}

#[test]
fn a_savepoint_of_a_format_version_this_weir_does_not_read_is_refused_by_name() {
    let copy = tempfile::tempdir().unwrap();
    let savepoint = copy.path().join("savepoint-1");
    std::fs::create_dir(&savepoint).unwrap();
    for e in std::fs::read_dir(round_5()).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), savepoint.join(e.file_name())).unwrap();
    }
    // As a later weir would write it: its version in a header whose checksum holds.
    let metadata = savepoint.join(METADATA_FILE);
    let mut bytes = std::fs::read(&metadata).unwrap();
    bytes[4..8].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    let crc = crc32c::crc32c(&bytes[..44]);
    bytes[44..48].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&metadata, bytes).unwrap();
    let (job, out) = job(&copy.path().join("chk"), 2);
    let err = job.restore_from(&savepoint, false).execute(RunConfig::default().workers(2)).unwrap_err().to_string();
    assert!(err.contains(&metadata.display().to_string()), "{err}");
    assert!(err.contains(&format!("format version {}", FORMAT_VERSION + 1)), "{err}");
    assert!(err.contains(&format!("reads version {FORMAT_VERSION}")), "{err}");
    assert!(out.records().is_empty(), "nothing ran");
}

/// Makes the fixture (run by hand, once per release whose format changes):
/// `cargo test --test integration -- --ignored make_the_savepoint_fixture`.
#[test]
#[ignore = "makes tests/fixtures/savepoint-round-5; run by hand"]
fn make_the_savepoint_fixture() {
    let dir = tempfile::tempdir().unwrap();
    let (job, _) = job(&dir.path().join("chk"), 2);
    let handle = job.start(RunConfig::default().workers(2)).unwrap();
    while handle.metrics().source_records() < N / 2 {
        std::thread::sleep(Duration::from_millis(2));
    }
    let Stopped::Savepoint(taken) = handle.stop_with_savepoint(dir.path().join("savepoints")).unwrap() else {
        panic!("the job ended before its savepoint");
    };
    let to = round_5();
    let _ = std::fs::remove_dir_all(&to);
    std::fs::create_dir_all(&to).unwrap();
    for e in std::fs::read_dir(&taken).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}
