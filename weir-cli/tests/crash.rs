//! End-to-end exactly-once through process crashes: `weir wordcount` with checkpoints is
//! killed with SIGKILL the moment the run's first checkpoint completes (so while it commits,
//! or as the next one starts), with no sleep to spread the kills,
//! rerun with the same command until it completes, and its committed output is checked against
//! a sequential count: with exactly-once, every word's counts 1, 2, …, n appear exactly once;
//! with at-least-once, none is missing. A crash between pre-commit and commit leaves no
//! duplicate and no gap.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use weir::checkpoint::CheckpointStorage;
use weir::prng::mix;

use crate::common;
use crate::common::committed_counts;

/// Two files of words from a skewed vocabulary of 5,000 words.
pub(crate) fn write_corpus(dir: &Path) -> HashMap<String, u64> {
    // Half the occurrences from 50 hot words, half from 5,000.
    write_words(dir, 150_000, |r| format!("w{}", if r >> 63 == 1 { r % 50 } else { r % 5_000 }))
}

/// Two files of `lines` lines of up to 11 words each, `word` making each from a random number;
/// returns each word's count.
fn write_words(dir: &Path, lines: u64, word: impl Fn(u64) -> String) -> HashMap<String, u64> {
    let mut counts = HashMap::new();
    for f in 0..2u64 {
        let mut text = String::new();
        for line in 0..lines {
            for w in 0..(mix(line * 7 + f) % 12) {
                let word = word(mix(line * 131 + w + f * 1_000_003));
                text.push_str(&word);
                text.push(' ');
                *counts.entry(word).or_insert(0) += 1;
            }
            text.push('\n');
        }
        std::fs::write(dir.join(format!("f{f}.txt")), text).unwrap();
    }
    counts
}

fn wordcount(input: &Path, out: &Path, chk: &Path, extra: &[&str]) -> Command {
    let args: Vec<&str> = ["--parallelism", "2", "--interval-ms", "15"].iter().chain(extra).copied().collect();
    common::wordcount(input, out, chk, &args)
}

pub(crate) fn check_exactly_once(expected: &HashMap<String, u64>, out: &Path, what: &str) {
    let mut got = committed_counts(out);
    assert_eq!(got.len(), expected.len(), "{what}: distinct words");
    for (w, &n) in expected {
        let mut counts = got.remove(w).unwrap_or_else(|| panic!("{what}: {w} missing"));
        counts.sort_unstable();
        assert!(counts == (1..=n).collect::<Vec<_>>(), "{what}: counts of {w} are not 1..={n} exactly once");
    }
}

fn check_nothing_missing(expected: &HashMap<String, u64>, out: &Path, what: &str) {
    let got = committed_counts(out);
    for (w, &n) in expected {
        let counts: std::collections::HashSet<u64> = got.get(w).into_iter().flatten().copied().collect();
        assert!((1..=n).all(|c| counts.contains(&c)), "{what}: a count of {w} (1..={n}) is missing");
    }
}

/// Ids of the completed checkpoints in `chk`, ascending.
pub(crate) fn complete_checkpoints(chk: &Path) -> Vec<u64> {
    if let Some(url) = chk.to_str().filter(|c| c.starts_with("s3://")) {
        let keys = common::s3::store(url).list("chk-").unwrap();
        // `chk-<n>/g<generation>/_metadata`: a checkpoint each generation published.
        let mut ids: Vec<u64> = keys
            .iter()
            .filter(|k| k.ends_with("/_metadata"))
            .filter_map(|k| k.strip_prefix("chk-")?.split_once('/')?.0.parse().ok())
            .collect();
        ids.sort_unstable();
        ids.dedup();
        return ids;
    }
    let storage = CheckpointStorage::new(chk);
    storage.list().into_iter().filter(|&id| storage.is_complete(id)).collect()
}

/// The newest completed checkpoint in `chk`.
fn newest_complete(chk: &Path) -> Option<u64> {
    complete_checkpoints(chk).last().copied()
}

/// Runs to completion, killing each of the first `kills` runs as its first checkpoint
/// completes. Returns how many runs resumed from a checkpoint.
pub(crate) fn run_with_kills(input: &Path, out: &Path, chk: &Path, extra: &[&str], kills: u64) -> usize {
    let mut resumed = 0;
    for run in 0.. {
        assert!(run < kills + 20, "the job did not complete after {run} runs");
        let mut child = wordcount(input, out, chk, extra).spawn().unwrap();
        if run < kills {
            // On an event, not after a time: once this run completed a checkpoint, so that
            // every killed run made progress and the next one resumes, however fast or slow
            // the machine (waiting for more completions let a fast run reach its end before
            // enough kills); the kill lands while that checkpoint commits or the next one
            // starts. (The bound only keeps a hung job from hanging the test.)
            let before = newest_complete(chk);
            let waiting = Instant::now();
            while newest_complete(chk) == before
                && child.try_wait().unwrap().is_none()
                && waiting.elapsed() < Duration::from_secs(120)
            {
                // Polling the folder, not spreading the kill: it lands at the completion.
                std::thread::sleep(Duration::from_millis(1));
            }
            child.kill().unwrap(); // SIGKILL
        }
        let o = child.wait_with_output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(!text.contains("panicked"), "run {run}: {text}");
        if text.contains("restored from checkpoint") {
            resumed += 1;
        }
        if run >= kills {
            assert!(o.status.success(), "run {run} failed: {text}");
            if text.contains("already complete") || text.contains("words:") {
                break;
            }
        }
    }
    match chk.to_str().filter(|c| c.starts_with("s3://")) {
        Some(url) => assert!(!common::s3::store(url).list("_finished").unwrap().is_empty(), "{url}: no _finished"),
        None => assert!(chk.join("_finished").exists()),
    }
    let rerun = wordcount(input, out, chk, extra).output().unwrap();
    assert!(rerun.status.success());
    assert!(String::from_utf8_lossy(&rerun.stdout).contains("already complete"), "a rerun says the job is complete");
    // (An output that is not a folder is a Kafka topic: tests/kafka.rs checks it.)
    if out.is_dir() {
        let hidden: Vec<String> = std::fs::read_dir(out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(hidden.is_empty(), "hidden files left after completion: {hidden:?}");
    }
    resumed
}

#[test]
fn sigkill_at_random_moments_then_rerun_gives_every_count_exactly_once() {
    let input = tempfile::tempdir().unwrap();
    let expected = write_corpus(input.path());
    let modes: [(&str, &[&str]); 5] = [
        ("aligned", &["--mode", "exactly-once"]),
        ("unaligned", &["--mode", "exactly-once", "--unaligned"]),
        ("aligned incremental", &["--mode", "exactly-once", "--incremental", "--retain", "2"]),
        // A new base after every two checkpoints of changes: kills land in chains and bases.
        ("aligned changelog", &["--mode", "exactly-once", "--changelog", "--materialize-every", "2"]),
        ("at-least-once", &["--mode", "at-least-once"]),
    ];
    for (what, extra) in modes.iter() {
        let (out, chk) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let chk = chk.path().join("chk");
        let r = run_with_kills(input.path(), out.path(), &chk, extra, 6);
        let committed = std::fs::read_dir(out.path()).unwrap().count();
        eprintln!("{what}: {r} of 7 runs resumed from a checkpoint; {committed} committed files");
        // Fewer than 6 when the job reached its end before a kill.
        assert!(r >= 2, "{what}: only {r} of 7 runs resumed from a checkpoint");
        if *what == "at-least-once" {
            check_nothing_missing(&expected, out.path(), what);
        } else {
            check_exactly_once(&expected, out.path(), what);
        }
    }
}

#[test]
fn a_crash_between_pre_commit_and_commit_leaves_no_duplicate_and_no_gap() {
    let input = tempfile::tempdir().unwrap();
    let expected = write_corpus(input.path());
    // The crash comes after checkpoint 3's metadata and after retention deleted the older
    // checkpoints, before any sink committed: checkpoint 3 alone must be enough. On a loaded
    // machine a run can reach the end of its input before its third checkpoint completes
    // (the disk is slow, the input is not); such a run is started again, from scratch.
    let (out, chk_root) = (0..5)
        .find_map(|_| {
            let (out, chk_root) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
            let first = wordcount(
                input.path(),
                out.path(),
                &chk_root.path().join("chk"),
                &["--exit-before-commit", "3", "--retain", "1"],
            )
            .output()
            .unwrap();
            let text = String::from_utf8_lossy(&first.stdout).into_owned() + &String::from_utf8_lossy(&first.stderr);
            match first.status.code() {
                Some(70) => Some((out, chk_root)),
                Some(0) if text.contains("checkpoints completed") => None,
                _ => panic!("neither the injected crash nor the end of the input: {text}"),
            }
        })
        .expect("five runs in a row ended before their third checkpoint completed");
    let chk = chk_root.path().join("chk");
    assert_eq!(complete_checkpoints(&chk), vec![3], "retention kept only the newest checkpoint");
    let names: Vec<String> =
        std::fs::read_dir(out.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().to_string()).collect();
    assert!(names.iter().any(|n| n.ends_with("00000003.pending")), "checkpoint 3 pre-committed: {names:?}");
    assert!(
        !names.iter().any(|n| n.ends_with("-00000003") && !n.starts_with('.')),
        "nothing of 3 committed: {names:?}"
    );
    let second = wordcount(input.path(), out.path(), &chk, &[]).output().unwrap();
    let text = String::from_utf8_lossy(&second.stderr);
    assert!(second.status.success(), "{text}");
    assert!(text.contains("restored from checkpoint 3"), "{text}");
    check_exactly_once(&expected, out.path(), "crash before commit");
}

/// The crash points of the checkpoint path, on the final checkpoint of a bounded job (with an
/// hour's interval it is the first, so where it lands does not depend on the machine's speed):
/// a task file half written, or `_metadata` written and not renamed (either way the checkpoint
/// does not exist, and the rerun starts over),
/// and the process dying once the first task applied the completion (its sinks committed, if
/// it has any) while the others had not heard (the rerun restores it and commits the rest). Either way every count appears exactly once.
#[test]
fn crashes_mid_metadata_and_mid_commit_leave_every_count_exactly_once() {
    let input = tempfile::tempdir().unwrap();
    let expected = write_corpus(input.path());
    for (flag, resumes) in [
        ("--exit-mid-task-write", false),
        ("--exit-before-metadata-rename", false),
        ("--exit-after-first-commit", true),
    ] {
        let (out, chk_root) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let chk = chk_root.path().join("chk");
        let args = ["--parallelism", "2", "--interval-ms", "3600000"];
        let crashed =
            common::wordcount(input.path(), out.path(), &chk, &[&args[..], &[flag, "1"]].concat()).output().unwrap();
        let text = String::from_utf8_lossy(&crashed.stderr).into_owned();
        assert_eq!(crashed.status.code(), Some(70), "{flag}: {text}");
        if resumes {
            let committed = std::fs::read_dir(out.path())
                .unwrap()
                .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with("-00000001"))
                .count();
            // The first task to hear may be a source (nothing to commit) or a sink subtask.
            assert!(committed < 2, "{flag}: both sink subtasks committed before the crash");
        } else {
            assert!(!chk.join("chk-1/_metadata").exists(), "{flag}: checkpoint 1 never completed");
            let left = |suffix: &str| {
                std::fs::read_dir(chk.join("chk-1"))
                    .unwrap()
                    .any(|e| e.unwrap().file_name().to_string_lossy().ends_with(suffix))
            };
            let what = if flag == "--exit-mid-task-write" { ".state" } else { "_metadata.inprogress" };
            assert!(left(what), "{flag}: the crash leaves a {what} file behind");
        }
        let rerun = common::wordcount(input.path(), out.path(), &chk, &args).output().unwrap();
        let text = String::from_utf8_lossy(&rerun.stderr).into_owned();
        assert!(rerun.status.success(), "{flag}: {text}");
        assert_eq!(text.contains("restored from checkpoint 1"), resumes, "{flag}: {text}");
        check_exactly_once(&expected, out.path(), flag);
    }
}

/// A restarting process said nothing while it restored (seconds, for much state), and a
/// SIGTERM then killed it (exit 143, no savepoint): killed every 1.5 s, it never made
/// progress. It now says what it restores before reading it, and a SIGTERM from the first
/// instant stops it cleanly: here one sent the moment that line appears, which is while it
/// restores or just after.
#[test]
fn a_restarting_process_says_what_it_restores_and_a_sigterm_stops_it_cleanly() {
    use std::io::BufRead;
    let input = tempfile::tempdir().unwrap();
    write_corpus(input.path());
    let work = tempfile::tempdir().unwrap();
    let (out, chk, sp) = (work.path().join("out"), work.path().join("chk"), work.path().join("sp"));
    let newest = killed_after_a_checkpoint(input.path(), &out, &chk);

    let mut second = wordcount(input.path(), &out, &chk, &["--savepoint-dir", sp.to_str().unwrap()])
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(second.stderr.take().unwrap());
    let mut said = String::new();
    let mut line = String::new();
    while !said.contains("restoring checkpoint") {
        line.clear();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "it ended without saying what it restores: {said}");
        said.push_str(&line);
    }
    Command::new("kill").args(["-TERM", &second.id().to_string()]).status().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    let o = second.wait_with_output().unwrap();
    let text = format!("{said}{rest}{}", String::from_utf8_lossy(&o.stdout));
    assert!(said.contains(&format!("restoring checkpoint {newest} ")) && said.contains(" MB in "), "{text}");
    assert_eq!(o.status.code(), Some(0), "stopped cleanly, not killed by the signal: {text}");
    assert!(text.contains("stopped with savepoint") || text.contains("finished instead"), "{text}");
}

/// Runs the word count into `out` and `chk` and kills it (SIGKILL) once a checkpoint has
/// completed; returns the newest complete one.
fn killed_after_a_checkpoint(input: &Path, out: &Path, chk: &Path) -> u64 {
    let mut first = wordcount(input, out, chk, &[]).spawn().unwrap();
    common::wait_until("a completed checkpoint", || {
        newest_complete(chk).is_some() || first.try_wait().unwrap().is_some()
    });
    first.kill().unwrap();
    first.wait().unwrap();
    newest_complete(chk).expect("the first run completed no checkpoint")
}

/// Killed, then rerun with another `--output`: it restored, then failed with "cannot commit
/// output file (its pending file is gone?)", leaving an empty new folder; `weir checkpoints`
/// called the checkpoints valid without saying whose they were. Checkpoints now record where
/// their sinks write: the resume is refused up front naming both folders, nothing is created,
/// and `weir checkpoints` shows the job and its output; the right output still resumes.
#[test]
fn a_resume_with_another_output_is_refused_up_front_naming_both() {
    let input = tempfile::tempdir().unwrap();
    let expected = write_corpus(input.path());
    let work = tempfile::tempdir().unwrap();
    let (out, out2, chk) = (work.path().join("out"), work.path().join("out2"), work.path().join("chk"));
    let newest = killed_after_a_checkpoint(input.path(), &out, &chk);
    let o = wordcount(input.path(), &out2, &chk, &[]).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(!o.status.success(), "{text}");
    let (was, now) = (out.display().to_string(), out2.display().to_string());
    assert!(text.contains(&format!("wrote to {was}")) && text.contains(&format!("writes to {now}")), "{text}");
    assert!(text.contains(&format!("--output {was}")), "{text}");
    assert!(!out2.exists(), "nothing was created: {text}");
    let listing = Command::new(env!("CARGO_BIN_EXE_weir")).arg("checkpoints").arg(&chk).output().unwrap();
    let table = String::from_utf8_lossy(&listing.stdout).into_owned();
    let row = table
        .lines()
        .find(|l| l.split('|').nth(1).map(str::trim) == Some(&format!("chk-{newest}")))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(row.contains("'wordcount'") && row.contains(&was), "{table}");
    // With its own output it resumes, exactly once.
    let o = wordcount(input.path(), &out, &chk, &[]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    check_exactly_once(&expected, &out, "resumed with its own output");
}

/// Two files of 330,000 words from a vocabulary of 60,000: word count's state, about 4 MiB of
/// pages, several times any budget under a megabyte.
fn write_wide_corpus(dir: &Path) -> HashMap<String, u64> {
    write_words(dir, 30_000, |r| format!("v{}", r % 60_000))
}

/// SIGKILLed word count whose keyed state is held within 512 KiB, an eighth of it: pages leave
/// memory for spill files and come back all through the run, every restart restores into the
/// budget, and every count is committed exactly once, with checkpoints in files and, where an
/// S3 server is, in S3.
#[test]
fn sigkill_with_state_memory_of_an_eighth_of_the_state_counts_every_word_exactly_once() {
    let input = tempfile::tempdir().unwrap();
    let expected = write_wide_corpus(input.path());
    let budget = ["--mode", "exactly-once", "--incremental", "--state-memory", "512KiB"];
    let (out, chk) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let chk = chk.path().join("chk");
    let resumed = run_with_kills(input.path(), out.path(), &chk, &budget, 4);
    assert!(resumed >= 2, "only {resumed} runs resumed from a checkpoint");
    check_exactly_once(&expected, out.path(), "files, within 512 KiB");
    if weir_testkit::s3::available("sigkill_with_state_memory_of_an_eighth_of_the_state (in S3)") {
        let out = tempfile::tempdir().unwrap();
        let chk = common::s3::checkpoint_url("bounded");
        let resumed = run_with_kills(input.path(), out.path(), Path::new(&chk), &budget, 3);
        assert!(resumed >= 2, "only {resumed} runs resumed from {chk}");
        check_exactly_once(&expected, out.path(), "S3, within 512 KiB");
    }
}
