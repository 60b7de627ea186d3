//! Savepoints: taken by hand while a job runs (or to stop it), restored into a new job that
//! continues exactly where the savepoint was, at the same or another parallelism (keyed state
//! is redistributed by key group); state for operators a job lacks is refused unless allowed.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use weir::checkpoint::CheckpointConfig;
use weir::sink::CommittedOutput;
use weir::source::Generator;
use weir::{Error, Job, RunConfig};

const N: u64 = 30_000;
const KEYS: u64 = 7;

/// generator → key_by → running count per key (named "count") → exactly-once collection.
fn job(checkpoints: &Path, p: usize, count_name: &str) -> (Job, CommittedOutput<(u64, u64)>) {
    let job = Job::new("counts")
        .with_parallelism(p)
        .with_checkpointing(CheckpointConfig::new(checkpoints).interval(Duration::from_secs(3600)));
    let out = job
        .generator(Generator::new(|i, _| i % KEYS).count(N).rate(150_000.0))
        .named("numbers")
        .key_by(|k: &u64| *k)
        .aggregate(|| 0u64, |c: &mut u64, _| *c += 1, |k: &u64, c: &u64| (*k, *c))
        .named(count_name)
        .collect_exactly_once();
    (job, out)
}

fn per_key(rows: &[(u64, u64)]) -> HashMap<u64, Vec<u64>> {
    let mut m: HashMap<u64, Vec<u64>> = HashMap::new();
    for &(k, c) in rows {
        m.entry(k).or_default().push(c);
    }
    for v in m.values_mut() {
        v.sort_unstable();
    }
    m
}

/// The restored job's output: its sink commits what the savepoint pre-committed (the counts
/// before it), then the job continues from the restored counts. So each key's counts are
/// exactly 1..=total, once each: a restore that lost the state would count from 1 again and
/// repeat values; one that lost the source position would overshoot the total.
fn assert_continues(rows: &[(u64, u64)]) {
    for k in 0..KEYS {
        let total = N / KEYS + u64::from(k < N % KEYS);
        let counts = per_key(rows).remove(&k).unwrap_or_default();
        assert_eq!(counts, (1..=total).collect::<Vec<_>>(), "key {k}");
    }
}

#[test]
fn a_savepoint_restores_into_a_new_job_that_continues_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let (a, out_a) = job(&dir.path().join("a"), 2, "count");
    let handle = a.start(RunConfig::default().workers(2)).unwrap();
    std::thread::sleep(Duration::from_millis(60));
    let savepoint = handle.trigger_savepoint(dir.path().join("savepoints")).unwrap();
    handle.join().unwrap();
    assert!(savepoint.join("_metadata").exists());
    let listed = weir::checkpoint::read_metadata(&savepoint).unwrap();
    assert_eq!(listed.kind, "savepoint");
    // The original job ran to the end: every key counted 1..=total.
    for (k, counts) in per_key(&out_a.records()) {
        assert_eq!(counts, (1..=counts.len() as u64).collect::<Vec<_>>(), "key {k}");
    }

    let (b, out_b) = job(&dir.path().join("b"), 2, "count");
    let handle = b.restore_from(&savepoint, false).start(RunConfig::default().workers(2)).unwrap();
    let notes_ok = handle.notes().iter().any(|n| n.contains("restored from savepoint"));
    handle.join().unwrap();
    assert!(notes_ok, "the restore is reported");
    assert_continues(&out_b.records());
}

#[test]
fn stop_with_savepoint_then_resume() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = job(&dir.path().join("a"), 2, "count");
    let handle = a.start(RunConfig::default().workers(2)).unwrap();
    std::thread::sleep(Duration::from_millis(60));
    let savepoint =
        handle.stop_with_savepoint(dir.path().join("sp")).unwrap().savepoint().expect("a savepoint, not the end");
    let (b, out_b) = job(&dir.path().join("b"), 2, "count");
    b.restore_from(&savepoint, false).execute(RunConfig::default().workers(2)).unwrap();
    assert_continues(&out_b.records());
}

#[test]
fn state_for_a_missing_operator_is_refused_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = job(&dir.path().join("a"), 2, "count");
    let handle = a.start(RunConfig::default().workers(2)).unwrap();
    std::thread::sleep(Duration::from_millis(40));
    let savepoint =
        handle.stop_with_savepoint(dir.path().join("sp")).unwrap().savepoint().expect("a savepoint, not the end");

    let (renamed, _) = job(&dir.path().join("c"), 2, "tally");
    let err = renamed.restore_from(&savepoint, false).execute(RunConfig::default().workers(2)).unwrap_err();
    assert!(matches!(err, Error::InvalidConfig(_)), "{err}");
    assert!(err.to_string().contains("'count'"), "the message names the operator: {err}");

    let (allowed, out) = job(&dir.path().join("d"), 2, "tally");
    let handle = allowed.restore_from(&savepoint, true).start(RunConfig::default().workers(2)).unwrap();
    assert!(
        handle.notes().iter().any(|n| n.contains("dropped state") && n.contains("'count'")),
        "{:?}",
        handle.notes()
    );
    handle.join().unwrap();
    // The counts start over (their state was dropped), from the savepoint's source position.
    assert!(!out.records().is_empty());
}

#[test]
fn savepoints_need_checkpointing() {
    let job = Job::new("plain");
    job.generator(Generator::new(|i, _| i)).discard();
    let handle = job.start(RunConfig::default().workers(1)).unwrap();
    let err = handle.trigger_savepoint(std::env::temp_dir().join("weir-unused")).unwrap_err();
    assert!(err.to_string().contains("checkpointing"), "{err}");
    handle.cancel();
}

#[test]
fn rescaling_2_to_4_to_1_through_savepoints_gives_the_same_counts() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = job(&dir.path().join("a"), 2, "count");
    let handle = a.start(RunConfig::default().workers(2)).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let sp1 =
        handle.stop_with_savepoint(dir.path().join("sp1")).unwrap().savepoint().expect("a savepoint, not the end");

    let (b, _) = job(&dir.path().join("b"), 4, "count");
    let handle = b.restore_from(&sp1, false).start(RunConfig::default().workers(2)).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let sp2 =
        handle.stop_with_savepoint(dir.path().join("sp2")).unwrap().savepoint().expect("a savepoint, not the end");

    let (c, out_c) = job(&dir.path().join("c"), 1, "count");
    c.restore_from(&sp2, false).execute(RunConfig::default().workers(2)).unwrap();
    // The last job's counts end at each key's total — neither lost (state redistributed by key
    // group at every step) nor overshot (each generator index emitted once across 2, 4, 1).
    let rows = out_c.records();
    for (k, counts) in per_key(&rows) {
        let total = N / KEYS + u64::from(k < N % KEYS);
        assert_eq!(counts.last().copied(), Some(total), "key {k}");
        let first = counts[0];
        assert_eq!(counts, (first..=total).collect::<Vec<_>>(), "key {k}: contiguous, each once");
    }
    assert_eq!(per_key(&rows).len() as u64, KEYS);
}

/// Event-time window counts, stopped with a savepoint mid-run and resumed at parallelism 3:
/// open windows and watermarks are redistributed, and the output equals a run without the stop.
#[test]
fn windows_rescale_through_a_savepoint() {
    fn windows(checkpoints: &Path, p: usize) -> (Job, CommittedOutput<(u64, u64, u64)>) {
        let job = Job::new("windows")
            .with_parallelism(p)
            .with_checkpointing(CheckpointConfig::new(checkpoints).interval(Duration::from_secs(3600)));
        let out = job
            .generator(Generator::new(|i, _| (i % 13, i)).count(N).rate(150_000.0))
            .named("events")
            .with_watermarks(|e: &(u64, u64)| e.1, 0)
            .named("time")
            .key_by(|e: &(u64, u64)| e.0)
            .window(weir::Window::tumbling(1000), |e: &(u64, u64)| e.1)
            .count()
            .named("window")
            .map(|(k, w, c)| (k, w.start, c))
            .collect_exactly_once();
        (job, out)
    }
    let dir = tempfile::tempdir().unwrap();
    let (golden_job, golden) = windows(&dir.path().join("g"), 2);
    golden_job.execute(RunConfig::default().workers(2)).unwrap();
    let mut golden = golden.records();
    golden.sort_unstable();

    let (a, _) = windows(&dir.path().join("a"), 2);
    let handle = a.start(RunConfig::default().workers(2)).unwrap();
    std::thread::sleep(Duration::from_millis(80));
    let sp = handle.stop_with_savepoint(dir.path().join("sp")).unwrap().savepoint().expect("a savepoint, not the end");
    let (b, out_b) = windows(&dir.path().join("b"), 3);
    b.restore_from(&sp, false).execute(RunConfig::default().workers(2)).unwrap();
    // The savepoint's pending transaction (everything A fired) is committed by B's restore.
    let mut got = out_b.records();
    got.sort_unstable();
    assert_eq!(got, golden);
}

#[test]
fn a_savepoint_after_one_source_ended_is_taken() {
    let dir = tempfile::tempdir().unwrap();
    let job = Job::new("short")
        .with_checkpointing(CheckpointConfig::new(dir.path().join("c")).interval(Duration::from_secs(3600)));
    // One source that ends at once, one that runs on: the ended one waits for the final
    // checkpoint and takes part in every checkpoint until then, so savepoints work.
    job.generator(Generator::new(|i, _| i).count(10)).named("short").discard();
    job.generator(Generator::new(|i, _| i).rate(1000.0)).named("long").discard();
    let handle = job.start(RunConfig::default().workers(2)).unwrap();
    let sp = handle.trigger_savepoint(dir.path().join("sp")).unwrap();
    let restored = weir::checkpoint::load_dir(&sp).unwrap();
    assert!(restored.state.get("short", 0).is_some(), "the short source's offset is in the savepoint");
    assert!(!handle.is_finishing());
    handle.cancel();
}

/// Word count into the two-phase-commit file sink, slowed so a savepoint lands mid-input.
fn file_wordcount(input: &Path, out: &Path, checkpoints: &Path, p: usize) -> Job {
    let job = Job::new("files")
        .with_parallelism(p)
        .with_checkpointing(CheckpointConfig::new(checkpoints).interval(Duration::from_millis(10)));
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    job.text(weir::source::TextSource::open(input).unwrap())
        .words()
        .map(move |w| {
            if seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed).is_multiple_of(256) {
                std::thread::sleep(Duration::from_micros(500));
            }
            w
        })
        .key_by(|w: &weir::Word| w.clone())
        .aggregate(|| 0u64, |c: &mut u64, _| *c += 1, |w: &weir::Word, c: &u64| (w.clone(), *c))
        .named("count")
        .write_files_transactional(out, |(w, c): &(weir::Word, u64), o: &mut Vec<u8>| {
            w.with_str(|s| o.extend_from_slice(format!("{s}\t{c}\n").as_bytes()))
        });
    job
}

/// The text source and the two-phase-commit file sink rescale too: a savepoint of a word count
/// at parallelism 2 restores at 3 into the same output folder, and the committed files hold
/// every word's counts 1..=n exactly once.
#[test]
fn a_file_to_file_job_rescales_through_a_savepoint_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    std::fs::create_dir(&input).unwrap();
    let mut expected: HashMap<String, u64> = HashMap::new();
    for f in 0..3u64 {
        let mut text = String::new();
        for line in 0..20_000u64 {
            for w in 0..(line * 7 + f) % 6 {
                let word = format!("w{}", (line * 31 + w * 17 + f) % 700);
                text.push_str(&word);
                text.push(' ');
                *expected.entry(word).or_insert(0) += 1;
            }
            text.push('\n');
        }
        std::fs::write(input.join(format!("{f}.txt")), text).unwrap();
    }
    let out = dir.path().join("out");
    let a = file_wordcount(&input, &out, &dir.path().join("a"), 2);
    let handle = a.start(RunConfig::default().workers(2)).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let savepoint =
        handle.stop_with_savepoint(dir.path().join("sp")).unwrap().savepoint().expect("a savepoint, not the end");
    let b = file_wordcount(&input, &out, &dir.path().join("b"), 3);
    b.restore_from(&savepoint, false).execute(RunConfig::default().workers(2)).unwrap();
    let mut got: HashMap<String, Vec<u64>> = HashMap::new();
    for f in std::fs::read_dir(&out).unwrap() {
        let f = f.unwrap();
        let name = f.file_name().to_string_lossy().to_string();
        assert!(!name.starts_with('.'), "a hidden file is left: {name}");
        for line in std::fs::read_to_string(f.path()).unwrap().lines() {
            let (w, c) = line.split_once('\t').unwrap();
            got.entry(w.to_string()).or_default().push(c.parse().unwrap());
        }
    }
    assert!(got.values().map(Vec::len).sum::<usize>() > 0);
    for (w, n) in &expected {
        let mut counts = got.remove(w).unwrap_or_default();
        counts.sort_unstable();
        assert_eq!(counts, (1..=*n).collect::<Vec<_>>(), "counts of {w}");
    }
    assert!(got.is_empty());
}

/// Flink's `stop --drain`: a job over an endless source, stopped with a drain, fires every
/// window it has (each record is counted in a fired window, the open ones included, where a
/// stop with a savepoint leaves the open ones in the savepoint), commits it all, finishes, and
/// its final checkpoint is the savepoint. Without checkpointing there is none to make: a clear
/// error, the job going on.
#[test]
fn a_stop_with_a_drain_fires_every_window_and_keeps_the_final_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let job = Job::new("drain")
        .with_parallelism(2)
        .with_checkpointing(CheckpointConfig::new(dir.path().join("c")).interval(Duration::from_secs(3600)));
    let out = job
        .generator(Generator::new(|i, _| (i % 5, i)).rate(200_000.0))
        .with_watermarks(|e: &(u64, u64)| e.1, 0)
        .key_by(|e: &(u64, u64)| e.0)
        .window(weir::Window::tumbling(1_000_000), |e: &(u64, u64)| e.1)
        .count()
        .map(|(k, w, c)| (k, w.start, c))
        .collect_exactly_once();
    let handle = job.start(RunConfig::default().workers(2)).unwrap();
    crate::common::wait_until("records flow", || handle.metrics().source_records() > 10_000);
    let stopped = handle.stop_with_drain(dir.path().join("sp")).unwrap();
    let weir::Stopped::Drained { savepoint, report } = stopped else { panic!("drained: {stopped:?}") };
    let counted: u64 = out.records().iter().map(|&(_, _, c)| c).sum();
    assert_eq!(counted, report.source_records, "every record is in a fired window");
    assert!(report.source_records > 10_000);
    let metadata = weir::checkpoint::read_metadata(&savepoint).unwrap();
    assert_eq!(metadata.kind, "savepoint");

    let unchecked = Job::new("no-checkpoints");
    unchecked.generator(Generator::new(|i, _| i).rate(1000.0)).discard();
    let handle = unchecked.start(RunConfig::default().workers(1)).unwrap();
    let e = handle.stop_with_drain(dir.path().join("sp2")).unwrap_err().to_string();
    assert!(e.contains("needs checkpointing"), "{e}");
}

/// The count of checkpoints in progress (the `/checkpoints` overview's): 1 while a checkpoint
/// waits on an operator that holds its barrier back, 0 once it completed.
#[test]
fn checkpoints_in_progress_are_counted_until_they_complete() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let job = Job::new("pending")
        .with_checkpointing(CheckpointConfig::new(dir.path().join("c")).interval(Duration::from_secs(3600)));
    let held = Arc::new(AtomicBool::new(false));
    let hold = Arc::clone(&held);
    job.generator(Generator::new(|i, _| i).rate(10_000.0))
        .map(move |i| {
            while hold.load(Ordering::SeqCst) {
                std::thread::yield_now();
            }
            i
        })
        .discard();
    let handle = job.start(RunConfig::default().workers(2)).unwrap();
    let controller = handle.controller();
    assert_eq!(controller.checkpoints_in_progress(), 0);
    held.store(true, Ordering::SeqCst);
    let asked = std::thread::spawn({
        let controller = controller.clone();
        move || controller.trigger_checkpoint()
    });
    crate::common::wait_until("the checkpoint is pending", || controller.checkpoints_in_progress() == 1);
    held.store(false, Ordering::SeqCst);
    let id = asked.join().unwrap().unwrap();
    crate::common::wait_until("no checkpoint pending", || controller.checkpoints_in_progress() == 0);
    assert_eq!(controller.checkpoints_completed(), 1, "checkpoint {id} completed");
    handle.cancel();
}
