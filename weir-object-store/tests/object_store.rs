//! Checkpoints kept in an object store (`CheckpointConfig::in_store`), over the in-memory
//! store: a process whose machine is lost resumes from the store in a fresh working folder with
//! exactly the failure-free output; a second process on the same store fences the first. And
//! this crate's S3 client against a real S3 server (moto): a large file goes up in parts, and
//! the store answers inside a tokio runtime. (The command's S3 tests are weir-cli's.)

use crate::common;
use crate::common::PausingSource;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use weir::checkpoint::{CheckpointConfig, InMemoryObjectStore, ObjectStore, RestartStrategy};
use weir::snapshot::{Fault, FaultInjector};
use weir::{Error, Job, RunConfig};

const N: u64 = 20_000;

/// A keyed running sum written to transactional files in `out`, checkpointed into `store`,
/// its source stopping at `pauses` until so many checkpoints completed there (no rate tuned
/// to the machine); with `fail`, it fails at record `N / 2` of the sum with no restart (the
/// process is lost).
fn job(
    store: &Arc<dyn ObjectStore>,
    out: &Path,
    fail: bool,
    incremental: bool,
    pauses: &[(u64, u32)],
) -> (Job, CheckpointConfig) {
    let faults =
        FaultInjector::new(if fail { vec![Fault::AtRecord { operator: "sum".into(), nth: N / 2 }] } else { vec![] });
    let config = CheckpointConfig::in_store(Arc::clone(store))
        .interval(Duration::from_millis(5))
        .incremental(incremental)
        .restart(RestartStrategy::None)
        .faults(faults);
    let job = Job::new("keyed").with_parallelism(2).with_checkpointing(config.clone());
    let pauses = pauses.to_vec();
    job.source(move |ctx| Ok(PausingSource::new(|i| (i % 10, i), N, &pauses, ctx)))
        .key_by(|e: &(u64, u64)| e.0)
        .aggregate(|| 0u64, |s: &mut u64, e| *s += e.1, |k, s| (*k, *s))
        .named("sum")
        .write_files_transactional(out, |r: &(u64, u64), b: &mut Vec<u8>| {
            b.extend_from_slice(format!("{} {}\n", r.0, r.1).as_bytes())
        });
    (job, config)
}

/// Every committed line of `out`, counted.
fn committed(out: &Path) -> BTreeMap<String, u32> {
    let mut lines = BTreeMap::new();
    for f in std::fs::read_dir(out).unwrap().map(|f| f.unwrap()) {
        if f.file_name().to_string_lossy().starts_with("part-") {
            for l in std::fs::read_to_string(f.path()).unwrap().lines() {
                *lines.entry(l.to_string()).or_default() += 1;
            }
        }
    }
    lines
}

fn keys(store: &InMemoryObjectStore, prefix: &str) -> Vec<String> {
    store.list(prefix).unwrap()
}

#[test]
fn a_lost_process_resumes_from_the_store_in_a_fresh_folder_with_the_failure_free_output() {
    if !weir_testkit::s3::available(
        "a_lost_process_resumes_from_the_store_in_a_fresh_folder_with_the_failure_free_output",
    ) {
        return;
    }
    for incremental in [false, true] {
        let (expected_out, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let clean: Arc<dyn ObjectStore> = Arc::new(InMemoryObjectStore::default());
        job(&clean, expected_out.path(), false, incremental, &[]).0.execute(RunConfig::default().workers(2)).unwrap();
        let expected = committed(expected_out.path());
        assert_eq!(expected.len() as u64, N, "one line per record");

        let memory = Arc::new(InMemoryObjectStore::default());
        let store: Arc<dyn ObjectStore> = Arc::clone(&memory) as Arc<dyn ObjectStore>;
        // Two checkpoints complete at N / 4, before the failure at N / 2.
        let (first, first_config) = job(&store, out.path(), true, incremental, &[(N / 4, 2)]);
        assert!(first.execute(RunConfig::default().workers(2)).is_err(), "the injected failure ends the first run");
        let in_store: Vec<String> = keys(&memory, "chk-").into_iter().filter(|k| k.ends_with("/_metadata")).collect();
        assert!(!in_store.is_empty(), "complete checkpoints went up to the store");
        // The working folder went with the process (the store has what the next one needs),
        // as if the machine were lost.
        assert!(!first_config.dir.exists(), "{} stayed", first_config.dir.display());

        let (second, second_config) = job(&store, out.path(), false, incremental, &[]);
        assert_ne!(second_config.dir, first_config.dir, "a fresh working folder");
        let mut handle = second.start(RunConfig::default().workers(2)).unwrap();
        let notes = handle.notes();
        handle.wait().unwrap();
        drop(handle);
        assert!(notes.iter().any(|n| n.starts_with("restored from checkpoint")), "it resumed: {notes:?}");
        // A job that finished leaves no working copy behind either (issue 45, item 9).
        assert!(!second_config.dir.exists(), "{} stayed", second_config.dir.display());
        assert_eq!(committed(out.path()), expected, "exactly the failure-free output (incremental: {incremental})");

        // Retention reached the store: the retained checkpoints, the shared files they name,
        // the completion marker, one claim.
        let complete: Vec<String> = keys(&memory, "chk-").into_iter().filter(|k| k.ends_with("/_metadata")).collect();
        assert!(complete.len() <= weir::checkpoint::DEFAULT_RETAINED, "{complete:?}");
        assert!(memory.get("_finished").is_some(), "the completion marker went up");
        assert_eq!(keys(&memory, "_generations/").len(), 1);
        let named: std::collections::HashSet<String> = complete
            .iter()
            .flat_map(|k| {
                let dir = tempfile::tempdir().unwrap();
                let folder = dir.path().join("chk");
                std::fs::create_dir_all(&folder).unwrap();
                std::fs::write(folder.join("_metadata"), memory.get(k).unwrap()).unwrap();
                weir::checkpoint::read_metadata(&folder).unwrap().shared.into_iter().map(|s| s.file)
            })
            .collect();
        // `shared/g<generation>/<file>`: the file `shared/<file>` as a generation wrote it.
        for key in keys(&memory, "shared/") {
            let (generation, file) = key["shared/".len()..].split_once('/').unwrap();
            assert!(generation.starts_with('g'), "{key}: in its generation's folder");
            let f = format!("shared/{file}");
            assert!(named.contains(&f), "{key} is named by no retained checkpoint");
        }
        // A rerun sees the finished job from the store alone.
        let (third, _) = job(&store, out.path(), false, incremental, &[]);
        let err = third.execute(RunConfig::default().workers(2)).unwrap_err().to_string();
        assert!(err.contains("already completed"), "{err}");
    }
}

#[test]
fn a_second_process_on_the_same_store_fences_the_first() {
    if !weir_testkit::s3::available("a_second_process_on_the_same_store_fences_the_first") {
        return;
    }
    let (expected_out, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let clean: Arc<dyn ObjectStore> = Arc::new(InMemoryObjectStore::default());
    job(&clean, expected_out.path(), false, false, &[]).0.execute(RunConfig::default().workers(1)).unwrap();
    let memory = Arc::new(InMemoryObjectStore::default());
    let store: Arc<dyn ObjectStore> = Arc::clone(&memory) as Arc<dyn ObjectStore>;
    // Held at N / 2 for good (checkpointing all the while): running when the second starts.
    let (a, _) = job(&store, out.path(), false, false, &[(N / 2, u32::MAX)]);
    let mut first = a.start(RunConfig::default().workers(1)).unwrap();
    common::wait_until("a checkpoint of the first process", || {
        keys(&memory, "chk-").iter().any(|k| k.ends_with("/_metadata"))
    });
    let (b, _) = job(&store, out.path(), false, false, &[]);
    let mut second = b.start(RunConfig::default().workers(1)).unwrap();
    match first.wait() {
        Err(Error::Fenced(why)) => assert!(why.contains("took checkpoint prefix memory:// over"), "{why}"),
        other => panic!("the first process must stop fenced, got {other:?}"),
    }
    second.wait().unwrap();
    assert_eq!(committed(out.path()), committed(expected_out.path()), "the output is the second process's, once");
}

/// A file larger than one part (16 MiB) goes up in parts (S3's multipart upload) and comes
/// back byte for byte; a missing object is `false`, not an error.
#[test]
fn a_large_file_goes_up_in_parts_and_comes_back_whole() {
    if !weir_testkit::s3::available("a_large_file_goes_up_in_parts_and_comes_back_whole") {
        return;
    }
    let store = common::s3::store(&common::s3::checkpoint_url("large"));
    let dir = tempfile::tempdir().unwrap();
    let (from, to) = (dir.path().join("big"), dir.path().join("back"));
    let bytes: Vec<u8> = (0..40u64 << 20).map(|i| weir::prng::mix(i) as u8).collect();
    std::fs::write(&from, &bytes).unwrap();
    store.upload("chk-1/task-0.state", &from).unwrap();
    assert!(store.download("chk-1/task-0.state", &to).unwrap());
    assert!(std::fs::read(&to).unwrap() == bytes, "the same 40 MiB came back");
    assert!(!store.download("chk-1/no-such", &dir.path().join("none")).unwrap());
    store.delete("chk-1/task-0.state").unwrap();
    assert!(store.list("chk-1/").unwrap().is_empty());
}

/// The store's blocking calls made from inside a tokio runtime (an embedding service, the
/// control endpoint's handlers) panicked: "Cannot start a runtime from within a runtime" (49 of
/// 321 `POST /config` requests to a job checkpointing to `s3://`). They run on a thread of
/// their own there.
#[test]
fn the_store_answers_inside_a_tokio_runtime() {
    if !weir_testkit::s3::available("the_store_answers_inside_a_tokio_runtime") {
        return;
    }
    let url = common::s3::checkpoint_url("in-runtime");
    let store = common::s3::store(&url);
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let listed = runtime.block_on(async {
        assert!(store.create("_generations/1", b"me").unwrap());
        store.list("_generations/").unwrap()
    });
    assert_eq!(listed, ["_generations/1"]);
}
