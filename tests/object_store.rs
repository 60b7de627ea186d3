//! Checkpoints kept in an object store (`CheckpointConfig::in_store`), over the in-memory
//! store: a process whose machine is lost resumes from the store in a fresh working folder with
//! exactly the failure-free output; a second process on the same store fences the first; the
//! store keeps only the retained checkpoints. (The same code against a real S3 server, moto, is
//! in `kafka.rs`'s word count tests, through the command.)

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
    let config = CheckpointConfig::in_store(store.clone())
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
    for incremental in [false, true] {
        let (expected_out, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let clean: Arc<dyn ObjectStore> = Arc::new(InMemoryObjectStore::default());
        job(&clean, expected_out.path(), false, incremental, &[]).0.execute(RunConfig::default().workers(2)).unwrap();
        let expected = committed(expected_out.path());
        assert_eq!(expected.len() as u64, N, "one line per record");

        let memory = Arc::new(InMemoryObjectStore::default());
        let store: Arc<dyn ObjectStore> = memory.clone();
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
    let (expected_out, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let clean: Arc<dyn ObjectStore> = Arc::new(InMemoryObjectStore::default());
    job(&clean, expected_out.path(), false, false, &[]).0.execute(RunConfig::default().workers(1)).unwrap();
    let memory = Arc::new(InMemoryObjectStore::default());
    let store: Arc<dyn ObjectStore> = memory.clone();
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

/// `weir wordcount` with `--checkpoint-dir s3://…` on a real S3 server (moto), SIGKILLed as
/// its checkpoints complete: every run after a kill is a new process with a new working
/// folder, so each resumes from the store alone (incremental checkpoints too: their shared
/// files come down with them). Every count is committed exactly once.
#[test]
fn a_killed_word_count_resumes_from_s3_every_time() {
    let input = tempfile::tempdir().unwrap();
    let expected = crate::crash::write_corpus(input.path());
    for (what, extra) in [("full", &[][..]), ("incremental", &["--incremental"][..])] {
        let out = tempfile::tempdir().unwrap();
        let chk = common::s3::checkpoint_url("wordcount");
        let resumed = crate::crash::run_with_kills(input.path(), out.path(), Path::new(&chk), extra, 3);
        assert!(resumed >= 2, "{what}: only {resumed} runs resumed from a checkpoint in {chk}");
        crate::crash::check_exactly_once(&expected, out.path(), what);
        let left = common::s3::store(&chk).list("chk-").unwrap();
        let complete = left.iter().filter(|k| k.ends_with("/_metadata")).count();
        assert!(complete <= weir::checkpoint::DEFAULT_RETAINED, "{what}: retention left {left:?}");
        // `weir checkpoints` reads the store: its checkpoints valid, the job finished.
        let listing = std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
            .args(["checkpoints", &chk])
            .envs(common::s3::env())
            .output()
            .unwrap();
        let table = String::from_utf8_lossy(&listing.stdout);
        assert!(listing.status.success(), "{}", String::from_utf8_lossy(&listing.stderr));
        assert_eq!(table.lines().filter(|l| l.contains(" valid |")).count(), complete, "{table}");
        assert!(table.contains("the job 'wordcount' finished"), "{table}");
    }
}

/// The fencing window in the store (issue 45, item 4). The first process checked that it still
/// owned the prefix and stopped (SIGSTOP, as a GC or VM pause would) before it put checkpoint
/// 2 into the store; a second one took over from checkpoint 1 (its sink aborting what the
/// first had pre-committed after it) and stopped before its own checkpoint 2 went up.
/// Continued, the first one's checkpoint 2 went up before it found itself fenced; the second
/// was killed. The third then restored the first one's checkpoint 2 and failed for good
/// ("cannot commit output file (its pending file is gone?)"). Now each generation writes keys
/// of its own, the second recorded what it found when it took over, and the first one's late
/// checkpoint counts for nothing: the third resumes from checkpoint 1, every count once.
#[test]
fn an_owner_paused_before_its_publish_completes_nothing_after_its_successor_took_over() {
    let input = tempfile::tempdir().unwrap();
    let expected = crate::crash::write_corpus(input.path());
    let out = tempfile::tempdir().unwrap();
    let chk = common::s3::checkpoint_url("paused-owner");
    let run = |extra: &[&str]| {
        let args: Vec<&str> = ["--parallelism", "2", "--interval-ms", "10"].iter().chain(extra).copied().collect();
        common::wordcount(input.path(), out.path(), Path::new(&chk), &args)
    };
    let text = |o: &std::process::Output| {
        format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
    };
    // The first tails its input (it never ends by itself) and stops before checkpoint 2 goes
    // up, checkpoint 1 in the store.
    let mut first = run(&["--follow", "--stop-before-publish", "2"]).spawn().unwrap();
    common::wait_until("the first process to stop before its publish", || {
        common::all_threads_stopped(first.id()) || first.try_wait().unwrap().is_some()
    });
    assert!(first.try_wait().unwrap().is_none(), "the first process ended instead of stopping");
    // The second takes over from checkpoint 1 and stops before its own checkpoint 2 goes up.
    let mut second = run(&["--stop-before-publish", "2"]).spawn().unwrap();
    common::wait_until("the second process to stop before its publish", || {
        common::all_threads_stopped(second.id()) || second.try_wait().unwrap().is_some()
    });
    assert!(second.try_wait().unwrap().is_none(), "the second process ended instead of stopping");
    // The first goes on: its checkpoint goes up, then it finds the newer claim and stops.
    let continued = std::process::Command::new("kill").args(["-CONT", &first.id().to_string()]).status().unwrap();
    assert!(continued.success());
    let o = first.wait_with_output().unwrap();
    assert!(!o.status.success() && text(&o).contains("took checkpoint prefix"), "the first process: {}", text(&o));
    let store = common::s3::store(&chk);
    assert!(!store.list("chk-2/g1/").unwrap().is_empty(), "the first process's checkpoint 2 went up late");
    // The second dies where it stopped; a third finishes the job.
    second.kill().unwrap();
    second.wait().unwrap();
    let o = run(&[]).output().unwrap();
    assert!(o.status.success() && !text(&o).contains("panicked"), "the third process: {}", text(&o));
    crate::crash::check_exactly_once(&expected, out.path(), "after a paused owner");
    assert!(text(&o).contains("restored from checkpoint 1"), "the third process: {}", text(&o));
    let o = run(&[]).output().unwrap();
    assert!(text(&o).contains("already complete"), "a rerun: {}", text(&o));
}

/// Bad S3 addresses and stores (malformed, a missing bucket, an unreachable endpoint, a bucket
/// without permission): named at once, non-zero exit, no panic, nothing written.
#[test]
fn bad_s3_addresses_and_stores_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.txt");
    std::fs::write(&input, "a b\n").unwrap();
    let run = |chk: &str, env: &[(&str, &str)]| {
        let out = dir.path().join(format!("out-{}", chk.len() + env.len()));
        let o = common::wordcount(&input, &out, Path::new(chk), &[]).envs(env.iter().copied()).output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(!o.status.success() && !text.contains("panicked"), "{chk}: {text}");
        text
    };
    let text = run("s3://X/p", &[]);
    assert!(text.contains("'s3://X/p' is not an S3 address") && text.contains("s3://BUCKET/PREFIX"), "{text}");
    let missing = common::s3::checkpoint_url("missing").replace("missing-", "absent-");
    let text = run(&missing, &[]);
    assert!(text.contains("NoSuchBucket") && text.contains(&missing[..missing.len() - 4]), "{text}");
    // Port 1: nothing listens there.
    let text = run(&common::s3::checkpoint_url("unreachable"), &[("AWS_ENDPOINT_URL", "http://127.0.0.1:1")]);
    assert!(text.contains("http://127.0.0.1:1") && text.contains("cannot list"), "{text}");
    // A bucket these credentials may not use: the store's refusal, named.
    let (endpoint, denied) = common::s3::denying();
    let text = run(&denied, &[("AWS_ENDPOINT_URL", &endpoint)]);
    assert!(text.contains("s3://denied/job") && text.contains("403 Forbidden"), "{text}");
    assert!(text.contains("InvalidAccessKeyId"), "{text}");
}

/// Stopped with a savepoint into S3 (`--savepoint-dir s3://…`, SIGTERM as its first checkpoint
/// completes), the word count is resumed from the store (`--restore s3://…/savepoint-<n>`) by
/// a new process with a new checkpoint prefix: every count exactly once.
#[test]
fn a_savepoint_in_s3_resumes_in_a_new_process() {
    let input = tempfile::tempdir().unwrap();
    let expected = crate::crash::write_corpus(input.path());
    let out = tempfile::tempdir().unwrap();
    let (chk, savepoints) = (common::s3::checkpoint_url("stop"), common::s3::checkpoint_url("savepoints"));
    let args = ["--parallelism", "2", "--interval-ms", "15", "--savepoint-dir", &savepoints];
    let mut first = common::wordcount(input.path(), out.path(), Path::new(&chk), &args).spawn().unwrap();
    common::wait_until("a checkpoint in the store, or the job's end", || {
        !crate::crash::complete_checkpoints(Path::new(&chk)).is_empty() || first.try_wait().unwrap().is_some()
    });
    std::process::Command::new("kill").args(["-TERM", &first.id().to_string()]).status().unwrap();
    let o = first.wait_with_output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{text}");
    if text.contains("finished instead") {
        // The input ended first (a fast machine): nothing is left to resume, and the output
        // is complete.
        crate::crash::check_exactly_once(&expected, out.path(), "finished before the savepoint");
        eprintln!("the job finished before its savepoint: nothing to resume");
        return;
    }
    let restore = text
        .lines()
        .find_map(|l| l.strip_prefix("resume with --restore "))
        .unwrap_or_else(|| panic!("no savepoint named: {text}"))
        .to_string();
    assert!(restore.starts_with(&savepoints) && restore.contains("/savepoint-"), "{restore}");
    let keys = common::s3::store(&savepoints).list("savepoint-").unwrap();
    assert!(keys.iter().any(|k| k.ends_with("/_metadata")), "the savepoint is in the store: {keys:?}");
    // Elsewhere: a new checkpoint prefix, the savepoint from the store.
    let fresh = common::s3::checkpoint_url("resumed");
    let args = ["--parallelism", "2", "--interval-ms", "15", "--restore", &restore];
    let o = common::wordcount(input.path(), out.path(), Path::new(&fresh), &args).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success() && text.contains("restoring savepoint"), "{text}");
    crate::crash::check_exactly_once(&expected, out.path(), "resumed from a savepoint in S3");
}

/// A file larger than one part (16 MiB) goes up in parts (S3's multipart upload) and comes
/// back byte for byte; a missing object is `false`, not an error.
#[test]
fn a_large_file_goes_up_in_parts_and_comes_back_whole() {
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
    let url = common::s3::checkpoint_url("in-runtime");
    let store = common::s3::store(&url);
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let listed = runtime.block_on(async {
        assert!(store.create("_generations/1", b"me").unwrap());
        store.list("_generations/").unwrap()
    });
    assert_eq!(listed, ["_generations/1"]);
}
