//! `weir wordcount` with checkpoints and savepoints in S3 (moto; `weir_testkit::s3`): killed
//! and resumed from the store every time, an owner paused before its publish completing
//! nothing after its successor took over, bad S3 addresses and stores named.

use crate::common;

use std::path::Path;

/// `weir wordcount` with `--checkpoint-dir s3://…` on a real S3 server (moto), SIGKILLed as
/// its checkpoints complete: every run after a kill is a new process with a new working
/// folder, so each resumes from the store alone (incremental and changelog checkpoints too:
/// their shared files come down with them). Every count is committed exactly once.
#[test]
fn a_killed_word_count_resumes_from_s3_every_time() {
    if !weir_testkit::s3::available("a_killed_word_count_resumes_from_s3_every_time") {
        return;
    }
    let input = tempfile::tempdir().unwrap();
    let expected = crate::crash::write_corpus(input.path());
    let modes: [(&str, &[&str]); 3] = [
        ("full", &[]),
        ("incremental", &["--incremental"]),
        ("changelog", &["--changelog", "--materialize-every", "2"]),
    ];
    for (what, extra) in modes {
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
    if !weir_testkit::s3::available(
        "an_owner_paused_before_its_publish_completes_nothing_after_its_successor_took_over",
    ) {
        return;
    }
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
    if !weir_testkit::s3::available("bad_s3_addresses_and_stores_are_named") {
        return;
    }
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
    if !weir_testkit::s3::available("a_savepoint_in_s3_resumes_in_a_new_process") {
        return;
    }
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

/// `weir control ADDR savepoint s3://BUCKET/P` wrote the savepoint into a local folder named
/// `s3:` (the client made the address absolute), and every job with `s3://` checkpoints and
/// `--control` panicked the endpoint's thread as it ended ("Cannot drop a runtime in a context
/// where blocking is not allowed"), exiting 0. The savepoint goes to the store, and the job ends
/// cleanly.
#[test]
fn a_savepoint_into_s3_from_the_control_client_and_a_clean_end() {
    if !weir_testkit::s3::available("a_savepoint_into_s3_from_the_control_client_and_a_clean_end") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("log.txt");
    std::fs::write(&input, "a b\nc d\n").unwrap();
    let chk = common::s3::checkpoint_url("controlled");
    let savepoints = common::s3::checkpoint_url("controlled-savepoints");
    let flags = ["--follow", "--interval-ms", "3600000", "--control", "127.0.0.1:0"];
    let mut command = common::wordcount(&input, &dir.path().join("out"), Path::new(&chk), &flags);
    command.current_dir(dir.path());
    let mut job = common::Running::start(command);
    job.wait_to_say("control endpoint: http://", 1);
    let addr = job.word_after("control endpoint: http://").unwrap();
    let mut client = std::process::Command::new(env!("CARGO_BIN_EXE_weir"));
    let o = client.args(["control", &addr, "savepoint", &savepoints]).current_dir(dir.path()).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && text.contains(&format!("{savepoints}/savepoint-")), "{text}");
    assert!(!dir.path().join("s3:").exists(), "no local folder named after the address");
    let keys = common::s3::store(&savepoints).list("savepoint-").unwrap();
    assert!(keys.iter().any(|k| k.ends_with("/_metadata")), "the savepoint is in the store: {keys:?}");
    let (ok, text) = crate::control::control(&addr, &["cancel"]);
    assert!(ok, "{text}");
    let status = job.child.wait().unwrap();
    let said = job.text.lock().unwrap().clone();
    assert!(!said.contains("panicked"), "{said}");
    assert!(!status.success(), "a cancelled job exits non-zero: {said}");
}
