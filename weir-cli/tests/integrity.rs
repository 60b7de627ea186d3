//! Checkpoint integrity as operators meet it: two processes on one checkpoint directory,
//! files that verify but belong to another task, checkpoint or job, a completion marker that
//! is empty, garbage or another job's, a checkpoint file that cannot be read (not damage), bad
//! values, and `weir checkpoints` on every kind of folder. Nothing committed may be silently
//! lost in any of them.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use weir::checkpoint::{CheckpointConfig, CheckpointStorage, FileKind, RestartStrategy, LOCK_FILE};
use weir::source::Generator;
use weir::{Error, Job, RunConfig};

use crate::common;
use crate::common::{committed_counts, wait_until};

fn text_of(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn complete_checkpoints(chk: &Path) -> Vec<u64> {
    let storage = CheckpointStorage::new(chk);
    storage.list().into_iter().filter(|&id| storage.is_complete(id)).collect()
}

/// Every file under `dir` (relative name → bytes), but the lock (which each start rewrites).
fn tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            if p.is_dir() {
                walk(root, &p, out);
            } else if rel != LOCK_FILE {
                out.insert(rel, std::fs::read(&p).unwrap_or_else(|e| format!("unreadable: {e}").into_bytes()));
            }
        }
    }
    let mut out = BTreeMap::new();
    if dir.exists() {
        walk(dir, dir, &mut out);
    }
    out
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        let target = to.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_tree(&p, &target);
        } else {
            std::fs::copy(&p, &target).unwrap();
        }
    }
}

// --- word count through the command line --------------------------------------------------

/// A small corpus: 2,000 lines over 300 words; returns each word's count.
fn write_corpus(path: &Path, seed: u64) -> HashMap<String, u64> {
    let mut counts = HashMap::new();
    let mut text = String::new();
    for line in 0..2_000u64 {
        for w in 0..(line % 7) {
            let word = format!("w{}", (line * 31 + w * 17 + seed) % 300);
            text.push_str(&word);
            text.push(' ');
            *counts.entry(word).or_insert(0) += 1;
        }
        text.push('\n');
    }
    std::fs::write(path, text).unwrap();
    counts
}

fn wordcount(input: &Path, out: &Path, chk: &Path, extra: &[&str]) -> Command {
    let args: Vec<&str> = ["--interval-ms", "10"].iter().chain(extra).copied().collect();
    common::wordcount(input, out, chk, &args)
}

fn assert_exactly_once(expected: &HashMap<String, u64>, out: &Path) {
    let mut got = committed_counts(out);
    assert_eq!(got.len(), expected.len(), "distinct words");
    for (w, &n) in expected {
        let mut c = got.remove(w).unwrap_or_else(|| panic!("{w} missing"));
        c.sort_unstable();
        assert_eq!(c, (1..=n).collect::<Vec<_>>(), "the counts of {w}");
    }
}

/// A `--follow` word count (it runs until killed) that has completed two checkpoints and
/// committed output under them.
fn running_follow_job(input: &Path, out: &Path, chk: &Path) -> Child {
    let child = wordcount(input, out, chk, &["--parallelism", "2", "--follow"]).spawn().unwrap();
    wait_until("two completed checkpoints", || complete_checkpoints(chk).len() >= 2);
    child
}

fn kill(mut child: Child) {
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn a_second_process_on_the_same_checkpoint_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (input, out, chk) = (dir.path().join("in.txt"), dir.path().join("out"), dir.path().join("chk"));
    let expected = write_corpus(&input, 1);
    let first = running_follow_job(&input, &out, &chk);
    let second = wordcount(&input, &out, &chk, &["--parallelism", "2"]).output().unwrap();
    let text = text_of(&second);
    assert!(!second.status.success(), "the second process ran: {text}");
    assert!(text.contains(&chk.display().to_string()), "the message names the directory: {text}");
    assert!(text.contains(&format!("process {}", first.id())), "the message names the owner: {text}");
    assert!(!text.contains("panicked"), "{text}");
    // The lock of a process that died is taken over, with a note, and the job resumes exactly.
    let pid = first.id();
    kill(first);
    let third = wordcount(&input, &out, &chk, &["--parallelism", "2"]).output().unwrap();
    let text = text_of(&third);
    assert!(third.status.success(), "{text}");
    assert!(text.contains(&format!("took over checkpoint directory {} from process {pid}", chk.display())), "{text}");
    assert!(text.contains("restored from checkpoint"), "{text}");
    assert_exactly_once(&expected, &out);
}

#[test]
fn a_checkpoint_file_that_cannot_be_read_stops_the_job_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (input, out, chk) = (dir.path().join("in.txt"), dir.path().join("out"), dir.path().join("chk"));
    let expected = write_corpus(&input, 2);
    kill(running_follow_job(&input, &out, &chk));
    let newest = *complete_checkpoints(&chk).last().unwrap();
    // A symbolic link to itself: opening it fails (ELOOP) as permission denied or EIO would,
    // also for root.
    let file = chk.join(format!("chk-{newest}")).join("task-0.state");
    let aside = dir.path().join("aside");
    std::fs::rename(&file, &aside).unwrap();
    std::os::unix::fs::symlink(&file, &file).unwrap();
    let (before_chk, before_out) = (tree(&chk), tree(&out));
    let run = wordcount(&input, &out, &chk, &["--parallelism", "2"]).output().unwrap();
    let text = text_of(&run);
    assert!(!run.status.success(), "{text}");
    assert!(text.contains("cannot read checkpoint file") && text.contains(&file.display().to_string()), "{text}");
    assert!(!text.contains("damaged"), "an I/O error is not damage: {text}");
    assert_eq!(tree(&chk), before_chk, "the checkpoint directory changed");
    assert_eq!(tree(&out), before_out, "the output changed");
    // Readable again: the job resumes from that very checkpoint, exactly once.
    std::fs::remove_file(&file).unwrap();
    std::fs::rename(&aside, &file).unwrap();
    let run = wordcount(&input, &out, &chk, &["--parallelism", "2"]).output().unwrap();
    let text = text_of(&run);
    assert!(run.status.success(), "{text}");
    assert!(text.contains(&format!("restored from checkpoint {newest}")), "{text}");
    assert_exactly_once(&expected, &out);
}

#[test]
fn the_completion_marker_names_its_job_and_is_verified() {
    let dir = tempfile::tempdir().unwrap();
    let (input, chk) = (dir.path().join("in.txt"), dir.path().join("chk"));
    let (o2, o3) = (dir.path().join("o2"), dir.path().join("o3"));
    let expected = write_corpus(&input, 3);
    let done = wordcount(&input, &o2, &chk, &["--parallelism", "2"]).output().unwrap();
    assert!(done.status.success(), "{}", text_of(&done));
    assert_exactly_once(&expected, &o2);
    // Another input, output and parallelism on the same directory: another job's.
    let other_input = dir.path().join("other.txt");
    write_corpus(&other_input, 4);
    let other = wordcount(&other_input, &o3, &chk, &["--parallelism", "3"]).output().unwrap();
    let text = text_of(&other);
    assert!(!other.status.success(), "{text}");
    assert!(text.contains("holds another job") && text.contains(&chk.display().to_string()), "{text}");
    assert!(!o3.exists(), "the refused run created its output");
    // The same command again: already complete, with the right output folder.
    let again = wordcount(&input, &o2, &chk, &["--parallelism", "2"]).output().unwrap();
    let text = text_of(&again);
    assert!(again.status.success() && text.contains("already complete"), "{text}");
    assert!(text.contains(&o2.display().to_string()), "{text}");
    // An empty marker, garbage, or a folder of that name: damage, not "complete".
    let marker = chk.join(weir::runtime::FINISHED_MARKER);
    let good = std::fs::read(&marker).unwrap();
    let mut flipped = good.clone();
    *flipped.last_mut().unwrap() ^= 1;
    for damage in [Some(Vec::new()), Some(b"{\"job\": \"wordcount\"}".to_vec()), Some(flipped), None] {
        std::fs::remove_file(&marker).ok();
        match &damage {
            Some(bytes) => std::fs::write(&marker, bytes).unwrap(),
            None => std::fs::create_dir(&marker).unwrap(),
        }
        let run = wordcount(&input, &o2, &chk, &["--parallelism", "2"]).output().unwrap();
        let text = text_of(&run);
        assert!(!run.status.success(), "{damage:?}: {text}");
        assert!(text.contains("_finished") && !text.contains("already complete"), "{damage:?}: {text}");
        let listing = Command::new(env!("CARGO_BIN_EXE_weir")).arg("checkpoints").arg(&chk).output().unwrap();
        assert!(!listing.status.success(), "{damage:?}: {}", text_of(&listing));
        if damage.is_none() {
            std::fs::remove_dir(&marker).unwrap();
        }
    }
    std::fs::write(&marker, good).unwrap();
    let listing = Command::new(env!("CARGO_BIN_EXE_weir")).arg("checkpoints").arg(&chk).output().unwrap();
    assert!(listing.status.success() && text_of(&listing).contains("finished"), "{}", text_of(&listing));
}

#[test]
fn out_of_range_values_and_overlapping_folders_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.txt");
    std::fs::write(&input, "a b\n").unwrap();
    let out = dir.path().join("out");
    let weir = |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_weir")).args(args).output().unwrap();
    for args in [
        vec!["--duration-s", "99999999999999999999"],
        vec!["--duration-s", "1e300"],
        vec!["--rate", "1e300"],
        vec!["bench", "--duration-s", "1e300"],
        vec!["bench", "--rate", "1e300"],
        vec!["nexmark", "--query", "q1", "--rate", "1e300"],
    ] {
        let o = weir(&args);
        let t = text_of(&o);
        assert!(!o.status.success() && t.contains("out of range"), "{args:?}: {t}");
        assert!(!t.contains("panicked"), "{args:?}: {t}");
    }
    let (i, o) = (input.display().to_string(), out.display().to_string());
    let inside = out.join("chk").display().to_string();
    for chk in [o.as_str(), inside.as_str(), dir.path().to_str().unwrap()] {
        let run = weir(&["wordcount", "--input", &i, "--output", &o, "--checkpoint-dir", chk]);
        let t = text_of(&run);
        assert!(!run.status.success() && t.contains("overlap"), "{chk}: {t}");
    }
    assert!(!out.exists(), "a refused run created its output");
}

// --- the library: misplaced files, fencing ------------------------------------------------

const N: u64 = 20_000;

/// A keyed sum at parallelism 2 over `N` events, or with `endless` over ever more.
fn keyed_job(dir: &Path, incremental: bool, endless: bool) -> Job {
    let config = CheckpointConfig::new(dir)
        .interval(Duration::from_millis(5))
        .incremental(incremental)
        .retained(4)
        .restart(RestartStrategy::None);
    let job = Job::new("keyed").with_parallelism(2).with_checkpointing(config);
    let generator = Generator::new(|i, _| (i % 5_000, i)).rate(100_000.0);
    let events = job.generator(if endless { generator } else { generator.count(N) });
    let out = events.key_by(|e: &(u64, u64)| e.0).aggregate(|| 0u64, |s: &mut u64, e| *s += e.1, |k, s| (*k, *s));
    out.named("sum").discard();
    job
}

/// Checkpoints left by a run cancelled (as a crash leaves them) once four completed.
fn leave_checkpoints(dir: &Path, incremental: bool) -> Vec<u64> {
    let handle = keyed_job(dir, incremental, true).start(RunConfig::default().workers(2)).unwrap();
    wait_until("four completed checkpoints", || complete_checkpoints(dir).len() >= 4);
    handle.cancel();
    assert!(matches!(handle.join(), Err(Error::Cancelled)));
    complete_checkpoints(dir)
}

fn listing(dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weir")).arg("checkpoints").arg(dir).output().unwrap()
}

/// Each manipulation of a copy of the fixture makes checkpoint `newest` damaged, with a
/// message naming `file`; recovery falls back to an older checkpoint and says so.
fn assert_damaged(fixture: &Path, incremental: bool, what: &str, change: impl Fn(&Path) -> PathBuf) {
    let copy = tempfile::tempdir().unwrap();
    copy_tree(fixture, copy.path());
    let newest = *complete_checkpoints(copy.path()).last().unwrap();
    let file = change(copy.path());
    let name = file.strip_prefix(copy.path()).unwrap().display().to_string();
    let err = CheckpointStorage::new(copy.path()).load(newest).unwrap_err();
    assert!(matches!(err, Error::Corrupt(_)), "{what}: {err}");
    assert!(err.to_string().contains(&name), "{what}: the error names {name}: {err}");
    let l = listing(copy.path());
    let t = text_of(&l);
    assert!(!l.status.success() && t.contains("DAMAGED") && t.contains(&name), "{what}: {t}");
    // `weir checkpoints` on the folder alone says the same.
    let l = listing(&copy.path().join(format!("chk-{newest}")));
    assert!(!l.status.success() && text_of(&l).contains("DAMAGED"), "{what}: {}", text_of(&l));
    let mut handle = keyed_job(copy.path(), incremental, false).start(RunConfig::default().workers(2)).unwrap();
    let _ = handle.wait();
    let notes = handle.notes().join("\n");
    assert!(notes.contains(&format!("checkpoint {newest} is damaged and was skipped")), "{what}: {notes}");
    assert!(notes.contains(&name), "{what}: {notes}");
    assert!(!notes.contains(&format!("restored from checkpoint {newest}")), "{what}: {notes}");
}

#[test]
fn files_that_verify_but_belong_elsewhere_are_damage() {
    let fixture = tempfile::tempdir().unwrap();
    let complete = leave_checkpoints(fixture.path(), false);
    let (newest, older) = (complete[complete.len() - 1], complete[complete.len() - 2]);
    let chk = |root: &Path, id: u64| root.join(format!("chk-{id}"));
    let l = listing(fixture.path());
    assert!(l.status.success(), "{}", text_of(&l));
    assert_damaged(fixture.path(), false, "another task's file", |root| {
        std::fs::copy(chk(root, newest).join("task-0.state"), chk(root, newest).join("task-2.state")).unwrap();
        chk(root, newest).join("task-2.state")
    });
    assert_damaged(fixture.path(), false, "the same task's file of an older checkpoint", |root| {
        std::fs::copy(chk(root, older).join("task-3.state"), chk(root, newest).join("task-3.state")).unwrap();
        chk(root, newest).join("task-3.state")
    });
    assert_damaged(fixture.path(), false, "an older checkpoint's metadata", |root| {
        std::fs::copy(chk(root, older).join("_metadata"), chk(root, newest).join("_metadata")).unwrap();
        chk(root, newest).join("_metadata")
    });
    for (file, at) in [("task-1.state", 20), ("task-2.state", 200), ("_metadata", 30)] {
        assert_damaged(fixture.path(), false, &format!("a flipped byte in {file}"), |root| {
            let path = chk(root, newest).join(file);
            let mut bytes = std::fs::read(&path).unwrap();
            bytes[at] ^= 0x10;
            std::fs::write(&path, bytes).unwrap();
            path
        });
    }
}

#[test]
fn shared_files_are_checked_against_the_checkpoint_that_refers_to_them() {
    let fixture = tempfile::tempdir().unwrap();
    let complete = leave_checkpoints(fixture.path(), true);
    let newest = *complete.last().unwrap();
    let storage = CheckpointStorage::new(fixture.path());
    let refers: Vec<String> = storage.metadata(newest).unwrap().shared.into_iter().map(|s| s.file).collect();
    let all: Vec<String> = std::fs::read_dir(fixture.path().join("shared"))
        .unwrap()
        .map(|e| format!("shared/{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    // A file it refers to, and another checkpoint's file of the same task.
    let (target, other) = refers
        .iter()
        .find_map(|r| {
            let task = r.rsplit_once("-task-").unwrap().1;
            all.iter().find(|a| *a != r && a.ends_with(&format!("-task-{task}"))).map(|o| (r.clone(), o.clone()))
        })
        .expect("two shared files of one task");
    assert_damaged(fixture.path(), true, "another checkpoint's shared file", |root| {
        std::fs::copy(root.join(&other), root.join(&target)).unwrap();
        root.join(&target)
    });
    assert_damaged(fixture.path(), true, "a flipped byte in a shared file", |root| {
        let mut bytes = std::fs::read(root.join(&target)).unwrap();
        let at = bytes.len() / 2;
        bytes[at] ^= 1;
        std::fs::write(root.join(&target), bytes).unwrap();
        root.join(&target)
    });
}

#[test]
fn savepoints_and_single_folders_are_listed_and_verified() {
    let dir = tempfile::tempdir().unwrap();
    let (chk, sp) = (dir.path().join("chk"), dir.path().join("sp"));
    let handle = keyed_job(&chk, true, false).start(RunConfig::default().workers(2)).unwrap();
    let savepoint = handle.trigger_savepoint(&sp).unwrap();
    handle.join().unwrap();
    let name = savepoint.file_name().unwrap().to_string_lossy().to_string();
    for folder in [sp.clone(), savepoint.clone()] {
        let l = listing(&folder);
        assert!(l.status.success() && text_of(&l).contains(&name) && text_of(&l).contains("valid"), "{}", text_of(&l));
    }
    let task = std::fs::read_dir(&savepoint)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "state"))
        .unwrap();
    let mut bytes = std::fs::read(&task).unwrap();
    bytes[60] ^= 4;
    std::fs::write(&task, bytes).unwrap();
    for folder in [sp, savepoint] {
        let l = listing(&folder);
        assert!(!l.status.success() && text_of(&l).contains("DAMAGED"), "{}", text_of(&l));
    }
}

#[test]
fn a_process_that_lost_its_directory_completes_no_checkpoint_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let config = CheckpointConfig::new(dir.path()).interval(Duration::from_millis(5)).restart(RestartStrategy::None);
    let job = Job::new("endless").with_parallelism(2).with_checkpointing(config);
    job.generator(Generator::new(|i, _| (i % 100, i)).rate(50_000.0))
        .key_by(|e: &(u64, u64)| e.0)
        .aggregate(|| 0u64, |s: &mut u64, e| *s += e.1, |k, s| (*k, *s))
        .discard();
    let handle = job.start(RunConfig::default().workers(2)).unwrap();
    wait_until("a completed checkpoint", || !complete_checkpoints(dir.path()).is_empty());
    // Another process takes the directory over: its lock file removed, and a word count run
    // on the directory takes the lock anew (then refuses the checkpoints, another job's).
    let at_takeover = complete_checkpoints(dir.path()).last().copied().unwrap();
    std::fs::remove_file(dir.path().join(LOCK_FILE)).unwrap();
    let input = dir.path().join("in.txt");
    std::fs::write(&input, "a\n").unwrap();
    let other = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["wordcount", "--no-progress", "--input"])
        .arg(&input)
        .arg("--output")
        .arg(tempfile::tempdir().unwrap().path().join("out"))
        .arg("--checkpoint-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(text_of(&other).contains("another job"), "{}", text_of(&other));
    let storage = CheckpointStorage::new(dir.path());
    let err = handle.join().unwrap_err();
    assert!(matches!(err, Error::Fenced(_)), "{err}");
    // It notices the removal, the other process's lock being written, or that lock, whichever
    // it checks first.
    let msg = err.to_string();
    assert!(msg.contains(&dir.path().display().to_string()), "{msg}");
    // At most the checkpoint whose completion was under way at the takeover completed after it.
    let after = complete_checkpoints(dir.path()).last().copied().unwrap();
    assert!(after <= at_takeover + 1, "checkpoints {at_takeover}..{after} completed after the takeover");
    // And it deleted nothing: the checkpoint complete at the takeover is still there.
    assert!(complete_checkpoints(dir.path()).contains(&at_takeover), "{:?}", complete_checkpoints(dir.path()));
    // Every checkpoint is of the first owner's generation; the other process's is higher.
    let (_, payload) = weir::checkpoint::read_file(&dir.path().join(LOCK_FILE), FileKind::Lock).unwrap();
    let record: serde_json::Value = serde_json::from_slice(&payload).unwrap();
    assert_eq!(record["job"], "wordcount", "the other process's lock was left alone");
    for id in complete_checkpoints(dir.path()) {
        assert!(storage.metadata(id).unwrap().generation < record["generation"].as_u64().unwrap());
    }
}

/// Every file under `dir` with its length, except the lock file.
fn files_and_lengths(dir: &Path) -> BTreeMap<PathBuf, u64> {
    let mut found = BTreeMap::new();
    let mut folders = vec![dir.to_path_buf()];
    while let Some(d) = folders.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                folders.push(p);
            } else if p.file_name().is_some_and(|n| n != LOCK_FILE) {
                found.insert(p.clone(), std::fs::metadata(&p).unwrap().len());
            }
        }
    }
    found
}

/// A process stopped (SIGSTOP) while its successor took the directory over and finished the
/// job, then continued: it wrote `chk-<n>/task-*.state` into the finished directory (the
/// successor's ids, so into its checkpoints) and `.inprogress` files into the output. A
/// process that lost its directory now writes nothing more there: it checks the lock before
/// it starts a checkpoint and before a sink creates a file, and fails as fenced.
#[test]
fn a_process_continued_after_its_successor_finished_writes_nothing_more() {
    let dir = tempfile::tempdir().unwrap();
    let (input, out, chk) = (dir.path().join("in.txt"), dir.path().join("out"), dir.path().join("chk"));
    let text: String = (0..200_000).map(|i| format!("w{} x{}\n", i % 300, i % 7)).collect();
    std::fs::write(&input, text).unwrap();
    let wordcount = |follow: bool| {
        let mut c = common::wordcount(&input, &out, &chk, &["--interval-ms", "10", "--parallelism", "2"]);
        if follow {
            c.arg("--follow");
        }
        c
    };
    // The first process tails its input for ever; stopped once it completed a checkpoint.
    let first = wordcount(true).spawn().unwrap();
    wait_until("a completed checkpoint", || !complete_checkpoints(&chk).is_empty());
    let signal = |sig: &str, child: &Child| Command::new("kill").args([sig, &child.id().to_string()]).status().unwrap();
    assert!(signal("-STOP", &first).success());
    // `kill` returns once the signal is sent, not once every thread stopped: a thread that
    // was running may still check the lock (and find it removed) unless this waits.
    wait_until("every thread of the first process to stop", || common::all_threads_stopped(first.id()));
    // Its lock is taken from it; a second process resumes the job and finishes it.
    std::fs::remove_file(chk.join(LOCK_FILE)).unwrap();
    let second = wordcount(false).output().unwrap();
    assert!(second.status.success(), "{}", text_of(&second));
    assert!(chk.join(weir::runtime::FINISHED_MARKER).exists());
    let (chk_files, out_files) = (files_and_lengths(&chk), files_and_lengths(&out));
    // Continued: it must notice and stop, writing nothing.
    assert!(signal("-CONT", &first).success());
    let mut first = first;
    wait_until("the first process to stop", || first.try_wait().unwrap().is_some());
    let o = first.wait_with_output().unwrap();
    assert!(!o.status.success() && text_of(&o).contains("took over"), "{}", text_of(&o));
    assert_eq!(files_and_lengths(&chk), chk_files, "the finished checkpoint directory is as the second left it");
    assert_eq!(files_and_lengths(&out), out_files, "the output is as the second left it");
    assert!(out_files.keys().all(|p| !p.file_name().unwrap().to_string_lossy().starts_with('.')), "{out_files:?}");
}

// --- committed output is never silently retracted -----------------------------------------

/// Numbers `0..N` through a two-phase-commit file sink, checkpointed every 5 ms.
fn numbers_job(chk: &Path, out: &Path) -> Job {
    let config = CheckpointConfig::new(chk).interval(Duration::from_millis(5)).restart(RestartStrategy::None);
    let job = Job::new("numbers").with_parallelism(2).with_checkpointing(config);
    copy_into_files(job.generator(Generator::new(|i, _| i).count(N).rate(100_000.0)), out);
    job
}

/// Numbers through an operator named `copy` into a two-phase-commit file sink, one a line.
fn copy_into_files(numbers: weir::Stream<u64>, out: &Path) {
    numbers
        .map(|i| i)
        .named("copy")
        .write_files_transactional(out, |i: &u64, o: &mut Vec<u8>| o.extend_from_slice(format!("{i}\n").as_bytes()));
}

fn committed_numbers(out: &Path) -> Vec<u64> {
    let mut all: Vec<u64> = std::fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .flat_map(|e| {
            std::fs::read_to_string(e.path()).unwrap().lines().map(|l| l.parse().unwrap()).collect::<Vec<_>>()
        })
        .collect();
    all.sort_unstable();
    all
}

/// Every number the generator's subtasks (parallelism 2: one even, one odd) emitted up to
/// where each stopped, committed exactly once.
fn assert_each_number_once_without_gaps(out: &Path) {
    let numbers = committed_numbers(out);
    assert!(numbers.windows(2).all(|w| w[0] < w[1]), "a number committed twice");
    for residue in 0..2 {
        let of: Vec<u64> = numbers.iter().copied().filter(|n| n % 2 == residue).collect();
        assert!(
            of.iter().enumerate().all(|(k, &n)| n == residue + 2 * k as u64),
            "a gap among the numbers ≡ {residue}"
        );
    }
}

#[test]
fn a_recovery_that_would_retract_committed_output_refuses_unless_allowed() {
    for all_gone in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let (chk, out) = (dir.path().join("chk"), dir.path().join("out"));
        // An endless job cancelled (as a crash leaves it) once two checkpoints completed and
        // output was committed.
        let handle = endless_numbers_job(&chk, &out, false).start(RunConfig::default().workers(2)).unwrap();
        wait_until("two checkpoints and committed output", || {
            complete_checkpoints(&chk).len() >= 2 && tree(&out).keys().any(|n| n.starts_with("part-"))
        });
        handle.cancel();
        assert!(matches!(handle.join(), Err(Error::Cancelled)));
        let complete = complete_checkpoints(&chk);
        assert!(complete.len() >= 2, "{complete:?}");
        let committed = tree(&out);
        // The newest transaction committed (the newest checkpoint's may still be pending: the
        // crash can come between its completion and the commit).
        let newest = committed
            .keys()
            .filter(|n| n.starts_with("part-"))
            .filter_map(|n| n.rsplit_once('-').and_then(|(_, t)| t.parse::<u64>().ok()))
            .max()
            .expect("committed output");
        for id in complete.iter().filter(|&&id| all_gone || id >= newest) {
            if all_gone {
                std::fs::remove_dir_all(chk.join(format!("chk-{id}"))).unwrap();
            } else {
                let f = chk.join(format!("chk-{id}")).join("_metadata");
                let mut bytes = std::fs::read(&f).unwrap();
                bytes[100] ^= 1;
                std::fs::write(&f, bytes).unwrap();
            }
        }
        let err = endless_numbers_job(&chk, &out, false).execute(RunConfig::default().workers(2)).unwrap_err();
        let msg = err.to_string();
        assert!(!err.is_retryable(), "{msg}");
        // The first subtask to restore refuses, naming its own committed files.
        assert!(msg.contains("would remove committed output"), "{msg}");
        assert!(committed.keys().any(|n| n.starts_with("part-") && msg.contains(n.as_str())), "{msg}");
        assert!(msg.contains("allow_retracting_output"), "{msg}");
        let visible = |t: &BTreeMap<String, Vec<u8>>| {
            t.iter().filter(|(n, _)| !n.starts_with('.')).map(|(n, b)| (n.clone(), b.clone())).collect::<Vec<_>>()
        };
        assert_eq!(visible(&tree(&out)), visible(&committed), "committed output changed (all gone: {all_gone})");
        // Allowed: the files go, the notes say which, and the output is exact again.
        let mut handle = endless_numbers_job(&chk, &out, true).start(RunConfig::default().workers(2)).unwrap();
        handle.stop();
        handle.wait().unwrap();
        let notes = handle.notes().join("\n");
        assert!(notes.contains("removed committed output") && notes.contains(&format!("{newest:08}")), "{notes}");
        assert_each_number_once_without_gaps(&out);
    }
}

/// Ever more numbers through a two-phase-commit file sink, checkpointed every 5 ms.
fn endless_numbers_job(chk: &Path, out: &Path, allow_retracting: bool) -> Job {
    let config = CheckpointConfig::new(chk)
        .interval(Duration::from_millis(5))
        .restart(RestartStrategy::None)
        .allow_retracting_output(allow_retracting);
    let job = Job::new("numbers").with_parallelism(2).with_checkpointing(config);
    copy_into_files(job.generator(Generator::new(|i, _| i).rate(100_000.0)), out);
    job
}

// --- stop with a savepoint ----------------------------------------------------------------

fn pending_transactions(out: &Path) -> Vec<u64> {
    std::fs::read_dir(out)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            let txn = name.strip_prefix(".part-")?.strip_suffix(".pending")?.rsplit_once('-')?.1.parse().ok()?;
            Some(txn)
        })
        .collect()
}

#[test]
fn stop_with_savepoint_commits_what_the_savepoint_covers() {
    let dir = tempfile::tempdir().unwrap();
    let (chk, out, sp) = (dir.path().join("chk"), dir.path().join("out"), dir.path().join("sp"));
    let config = CheckpointConfig::new(&chk).interval(Duration::from_millis(5));
    let job = Job::new("endless-numbers").with_parallelism(2).with_checkpointing(config);
    copy_into_files(job.generator(Generator::new(|i, _| i).rate(100_000.0)), &out);
    let handle = job.start(RunConfig::default().workers(2)).unwrap();
    wait_until("a completed checkpoint", || !complete_checkpoints(&chk).is_empty());
    let savepoint = handle.stop_with_savepoint(&sp).unwrap().savepoint().expect("a savepoint");
    let id: u64 = savepoint.file_name().unwrap().to_string_lossy().strip_prefix("savepoint-").unwrap().parse().unwrap();
    let pending = pending_transactions(&out);
    assert!(pending.iter().all(|&t| t > id), "transactions the savepoint {id} covers are still pending: {pending:?}");
    let committed = committed_numbers(&out);
    assert!(!committed.is_empty());
    assert!(committed.windows(2).all(|w| w[0] < w[1]), "a number committed twice");
}

/// A source that ends first no longer stops the job's checkpoints (FLIP-147): a union of a
/// 100-record source and an endless one keeps checkpointing, and a savepoint taken long after
/// the short source ended holds all of it, committed.
#[test]
fn checkpoints_go_on_after_a_source_ends() {
    let dir = tempfile::tempdir().unwrap();
    let (chk, out, sp) = (dir.path().join("chk"), dir.path().join("out"), dir.path().join("sp"));
    let config = CheckpointConfig::new(&chk).interval(Duration::from_millis(5)).retained(100);
    let job = Job::new("short-and-long").with_parallelism(1).with_checkpointing(config);
    let short = job.generator(Generator::new(|i, _| i).count(100));
    let long = job.generator(Generator::new(|i, _| 1_000_000 + i).rate(20_000.0));
    copy_into_files(short.union(long), &out);
    let handle = job.start(RunConfig::default().workers(2)).unwrap();
    wait_until("ten completed checkpoints", || complete_checkpoints(&chk).len() >= 10);
    let savepoint = handle.stop_with_savepoint(&sp).unwrap().savepoint().expect("a savepoint");
    let id: u64 = savepoint.file_name().unwrap().to_string_lossy().strip_prefix("savepoint-").unwrap().parse().unwrap();
    assert!(id >= 10, "savepoint {id}");
    let committed = committed_numbers(&out);
    assert!((0..100).all(|i| committed.binary_search(&i).is_ok()), "the short source's numbers are committed");
    assert!(committed.windows(2).all(|w| w[0] < w[1]), "a number committed twice");
    assert!(pending_transactions(&out).iter().all(|&t| t > id));
}

/// A bounded job ends with a final checkpoint that commits its output: every committed file
/// is named after a completed checkpoint, none after the end.
#[test]
fn a_bounded_job_ends_with_a_final_checkpoint_that_commits_its_output() {
    let dir = tempfile::tempdir().unwrap();
    let (chk, out) = (dir.path().join("chk"), dir.path().join("out"));
    let report = numbers_job(&chk, &out).execute(RunConfig::default().workers(2)).unwrap();
    let last = report.checkpoints.iter().map(|c| c.id).max().expect("checkpoints completed");
    assert_eq!(committed_numbers(&out), (0..N).collect::<Vec<_>>());
    for name in tree(&out).keys() {
        let txn: u64 = name.rsplit_once('-').unwrap().1.parse().unwrap();
        assert!(txn <= last, "{name} was committed after the final checkpoint {last}");
    }
}

/// Windows fire at the end of event time, before the final checkpoint, which commits their
/// output too: a windowed count leaves no output for after its last checkpoint.
#[test]
fn the_final_checkpoint_commits_the_last_windows() {
    let dir = tempfile::tempdir().unwrap();
    let (chk, out) = (dir.path().join("chk"), dir.path().join("out"));
    let config = CheckpointConfig::new(&chk).interval(Duration::from_millis(5));
    let job = Job::new("windows").with_parallelism(2).with_checkpointing(config);
    job.generator(Generator::new(|i, _| (i % 7, i)).count(N).rate(100_000.0))
        .with_watermarks(|e: &(u64, u64)| e.1, 0)
        .key_by(|e: &(u64, u64)| e.0)
        .window(weir::Window::tumbling(1_000), |e: &(u64, u64)| e.1)
        .count()
        .write_files_transactional(&out, |r: &(u64, weir::WindowBounds, u64), o: &mut Vec<u8>| {
            o.extend_from_slice(format!("{} {} {}\n", r.0, r.1.start, r.2).as_bytes())
        });
    let report = job.execute(RunConfig::default().workers(2)).unwrap();
    let last = report.checkpoints.iter().map(|c| c.id).max().expect("checkpoints completed");
    let mut total = 0;
    for (name, bytes) in tree(&out) {
        let txn: u64 = name.rsplit_once('-').unwrap().1.parse().unwrap();
        assert!(txn <= last, "{name} was committed after the final checkpoint {last}");
        total += String::from_utf8(bytes)
            .unwrap()
            .lines()
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum::<u64>();
    }
    assert_eq!(total, N, "every event counted once");
}

#[test]
fn stop_with_savepoint_when_the_job_is_finishing_finishes_it_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let (chk, out, sp) = (dir.path().join("chk"), dir.path().join("out"), dir.path().join("sp"));
    let config = CheckpointConfig::new(&chk).interval(Duration::from_millis(5));
    let job = Job::new("bounded").with_parallelism(2).with_checkpointing(config);
    copy_into_files(job.generator(Generator::new(|i, _| i).count(2_000)), &out);
    let handle = job.start(RunConfig::default().workers(2)).unwrap();
    wait_until("the end of the input", || handle.is_finishing());
    match handle.stop_with_savepoint(&sp).unwrap() {
        weir::Stopped::Finished(report) => assert_eq!(report.sink_records, 2_000, "{report:?}"),
        weir::Stopped::Savepoint(p) | weir::Stopped::Drained { savepoint: p, .. } => {
            panic!("a savepoint was taken ({}) after the input ended", p.display())
        }
    }
    assert!(pending_transactions(&out).is_empty(), "the finished job left pending output");
    assert_eq!(committed_numbers(&out), (0..2_000).collect::<Vec<_>>());
    assert!(chk.join(weir::runtime::FINISHED_MARKER).exists());
}

// --- sources and inputs -------------------------------------------------------------------

/// A source that keeps no offset.
struct Forgetful(u64);

impl weir::source::Source<u64> for Forgetful {
    fn poll(&mut self, _: &weir::TaskContext, out: &mut Vec<u64>, _: usize) -> weir::Result<weir::source::SourcePoll> {
        self.0 += 1;
        out.push(self.0);
        Ok(if self.0 < 100 { weir::source::SourcePoll::Emitted } else { weir::source::SourcePoll::Finished })
    }
}

#[test]
fn a_source_without_offsets_is_refused_under_exactly_once() {
    let run = |mode| {
        let dir = tempfile::tempdir().unwrap();
        let job = Job::new("forgetful").with_checkpointing(CheckpointConfig::new(dir.path()).mode(mode));
        job.source(|_| Ok(Forgetful(0))).named("forgetful").discard();
        job.execute(RunConfig::default().workers(1))
    };
    let err = run(weir::checkpoint::CheckpointMode::Aligned).unwrap_err().to_string();
    assert!(err.contains("'forgetful'") && err.contains("Source::offset"), "{err}");
    run(weir::checkpoint::CheckpointMode::AtLeastOnce).unwrap();
}

fn mkfifo(path: &Path) {
    let made = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(made.success());
}

#[test]
fn pipes_and_standard_input_are_read_as_streams_and_folders_are_never_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let text = "b a\na b c\nc"; // the last line has no newline
                                // Standard input.
    let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["wordcount", "--input", "-", "--parallelism", "2", "--workers", "2", "--no-progress", "--output"])
        .arg(dir.path().join("o1"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", text_of(&o));
    let expected: HashMap<String, u64> = [("a", 2), ("b", 2), ("c", 2)].map(|(w, n)| (w.to_string(), n)).into();
    assert_exactly_once(&expected, &dir.path().join("o1"));
    // A named pipe.
    let fifo = dir.path().join("pipe");
    mkfifo(&fifo);
    let writer = std::thread::spawn({
        let fifo = fifo.clone();
        move || std::fs::write(fifo, text).unwrap()
    });
    let o = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["wordcount", "--parallelism", "2", "--workers", "2", "--no-progress", "--input"])
        .arg(&fifo)
        .arg("--output")
        .arg(dir.path().join("o2"))
        .output()
        .unwrap();
    writer.join().unwrap();
    assert!(o.status.success(), "{}", text_of(&o));
    assert_exactly_once(&expected, &dir.path().join("o2"));
    // Exactly-once checkpoints cannot replay a pipe: refused before reading it.
    let o = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["wordcount", "--input", "-", "--no-progress", "--output"])
        .arg(dir.path().join("o3"))
        .arg("--checkpoint-dir")
        .arg(dir.path().join("chk"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!o.status.success() && text_of(&o).contains("Source::offset"), "{}", text_of(&o));
    // A folder with a subfolder, or with a pipe in it: refused, naming it.
    let folder = dir.path().join("in");
    std::fs::create_dir_all(folder.join("sub")).unwrap();
    std::fs::write(folder.join("a.txt"), "a\n").unwrap();
    let refused = |what: &str| {
        let o = Command::new(env!("CARGO_BIN_EXE_weir"))
            .args(["wordcount", "--no-progress", "--input"])
            .arg(&folder)
            .arg("--output")
            .arg(dir.path().join("o4"))
            .output()
            .unwrap();
        let t = text_of(&o);
        assert!(!o.status.success() && t.contains(what), "{t}");
    };
    refused("sub");
    std::fs::remove_dir(folder.join("sub")).unwrap();
    mkfifo(&folder.join("p"));
    refused("not a regular file");
}

#[test]
fn a_resumed_run_whose_input_changed_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (input, out, chk) = (dir.path().join("in"), dir.path().join("out"), dir.path().join("chk"));
    std::fs::create_dir(&input).unwrap();
    write_corpus(&input.join("a.txt"), 5);
    write_corpus(&input.join("b.txt"), 6);
    kill(running_follow_job(&input, &out, &chk));
    // The first file is rewritten with other content of the same size.
    let a = input.join("a.txt");
    let mut bytes = std::fs::read(&a).unwrap();
    let before = std::fs::metadata(&a).unwrap().modified().unwrap();
    bytes.reverse();
    std::fs::write(&a, bytes).unwrap();
    // A modification time apart from the old one whatever the file system's resolution.
    std::fs::File::options().write(true).open(&a).unwrap().set_modified(before + Duration::from_secs(2)).unwrap();
    let o = wordcount(&input, &out, &chk, &["--parallelism", "2"]).output().unwrap();
    let t = text_of(&o);
    assert!(!o.status.success() && t.contains("changed since the checkpoint") && t.contains("a.txt"), "{t}");
}

#[test]
fn ctrl_c_on_a_followed_log_counts_its_last_line_without_a_newline() {
    let dir = tempfile::tempdir().unwrap();
    let (log, out) = (dir.path().join("log.txt"), dir.path().join("out"));
    std::fs::write(&log, "a b\nb c").unwrap(); // the last line is still being written
    let child = wordcount(&log, &out, &dir.path().join("chk"), &["--follow"]).spawn().unwrap();
    // The complete line's counts are committed: the job is running and following.
    wait_until("the first line's words", || {
        std::fs::read_dir(&out).is_ok_and(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                .any(|e| std::fs::read_to_string(e.path()).is_ok_and(|t| t.contains("a\t1")))
        })
    });
    let status = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", text_of(&o));
    let expected: HashMap<String, u64> = [("a", 1), ("b", 2), ("c", 1)].map(|(w, n)| (w.to_string(), n)).into();
    assert_exactly_once(&expected, &out);
}

/// A followed log that grew after the last checkpoint is not a changed input: any subtask's
/// offset (also one that does not read the log) lets the job resume and count the new lines.
#[test]
fn a_followed_log_that_grew_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let (input, out, chk) = (dir.path().join("in.txt"), dir.path().join("out"), dir.path().join("chk"));
    let mut expected = write_corpus(&input, 7);
    kill(running_follow_job(&input, &out, &chk));
    let more = "w1 w2 new\nnew\n";
    std::fs::OpenOptions::new().append(true).open(&input).unwrap().write_all(more.as_bytes()).unwrap();
    for w in more.split_whitespace() {
        *expected.entry(w.to_string()).or_default() += 1;
    }
    let o = wordcount(&input, &out, &chk, &["--parallelism", "2"]).output().unwrap();
    assert!(o.status.success(), "{}", text_of(&o));
    assert_exactly_once(&expected, &out);
}
