//! The soak run: two jobs side by side for `--minutes` (default 10), each with exactly-once
//! checkpoints every 500 ms, an injected operator failure every few seconds (in-process
//! failover) and a SIGKILL every minute (the same command is run again and resumes):
//!
//! - `weir wordcount --follow` over a log that a writer thread keeps growing; at the end the
//!   writer stops, the job is stopped with Ctrl-C (SIGINT), and the committed output must hold,
//!   for every word of the log, the counts 1..n exactly once;
//! - a windowed job (this program run again with `--window-child`): generated events counted
//!   per key in tumbling event-time windows, written through the two-phase-commit file sink;
//!   it is bounded, and once it completes every (key, window) must be in the committed output
//!   exactly once with its exact count.
//!
//! The resident memory of both processes is sampled every 5 s and printed.
//!
//! `cargo build --release && cargo bench --bench soak -- [--minutes M]`

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir::checkpoint::{CheckpointConfig, RestartStrategy};
use weir::prng::mix;
use weir::snapshot::{Fault, FaultInjector};
use weir::source::Generator;
use weir::{Job, RunConfig, Window};

/// The windowed job: keys, window length (event-time ms, one event per ms), events per second.
const WINDOW_KEYS: u64 = 50;
const WINDOW_MS: u64 = 1_000;
const WINDOW_RATE: f64 = 100_000.0;
/// An injected failure of its window operator every this many records (about every 4 s).
const WINDOW_FAIL_EVERY: u64 = 400_000;

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Starts `weir wordcount`; its standard error goes to `errors` (read at the end).
fn start_wordcount(weir: &Path, log: &Path, out: &Path, chk: &Path, errors: &Path) -> Child {
    Command::new(weir)
        .args(["wordcount", "--follow", "--parallelism", "2", "--workers", "2", "--no-progress"])
        .args(["--interval-ms", "500", "--fail-every-words", "3000000"])
        .arg("--input")
        .arg(log)
        .arg("--output")
        .arg(out)
        .arg("--checkpoint-dir")
        .arg(chk)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(errors).expect("stderr file"))
        .spawn()
        .expect("weir starts")
}

/// Starts this program as the windowed job over `events` events in `dir`.
fn start_window(dir: &Path, events: u64, errors: &Path) -> Child {
    Command::new(std::env::current_exe().expect("this program"))
        .arg("--window-child")
        .arg(dir)
        .arg(events.to_string())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(errors).expect("stderr file"))
        .spawn()
        .expect("the windowed job starts")
}

/// The windowed job (in the child process): resumes from the newest checkpoint in
/// `<dir>/chk` if there is one, prints the runtime's notes (restores, restarts) to standard
/// error as they come, and exits 0 once the job has completed (also when an earlier run
/// completed it and was killed before it could exit).
fn window_child(dir: &Path, events: u64) {
    let chk = dir.join("chk");
    if chk.join(weir::runtime::FINISHED_MARKER).exists() {
        eprintln!("already complete");
        return;
    }
    let faults = FaultInjector::new(
        (1..=1_000u64).map(|k| Fault::AtRecord { operator: "count".into(), nth: k * WINDOW_FAIL_EVERY }).collect(),
    );
    let config = CheckpointConfig::new(&chk)
        .interval(Duration::from_millis(500))
        .restart(RestartStrategy::FixedDelay { attempts: u32::MAX, delay: Duration::from_millis(50) })
        .faults(faults);
    let job = Job::new("soak-window").with_parallelism(2).with_checkpointing(config);
    job.generator(Generator::new(|i, _| (i % WINDOW_KEYS, i)).count(events).rate(WINDOW_RATE))
        .with_watermarks(|&(_, ts)| ts, 0)
        .key_by(|&(k, _)| k)
        .window(Window::tumbling(WINDOW_MS), |&(_, ts)| ts)
        .count()
        .named("count")
        .write_files_transactional(dir.join("out"), |&(k, w, c), out: &mut Vec<u8>| {
            let _ = writeln!(out, "{k}\t{}\t{c}", w.start);
        });
    let mut handle = job.start(RunConfig::default().pin_workers(true).workers(2)).expect("the windowed job starts");
    let mut shown = 0;
    // try_finish, not join: it restarts the job after each injected failure and returns.
    let result = loop {
        if let Some(result) = handle.try_finish() {
            break result;
        }
        std::thread::sleep(Duration::from_millis(100));
        for note in &handle.notes()[shown..] {
            eprintln!("{note}");
        }
        shown = handle.notes().len();
    };
    for note in &handle.notes()[shown..] {
        eprintln!("{note}");
    }
    result.expect("the windowed job completes");
}

/// One supervised process: restarted after each SIGKILL, its memory sampled.
struct Supervised {
    name: &'static str,
    start: Box<dyn Fn(&Path) -> Child>,
    child: Child,
    stderr: Vec<PathBuf>,
    kills: usize,
    last_kill: Instant,
    samples: Vec<(u64, u64)>,
    /// The bounded job ended by itself (successfully).
    finished: bool,
}

impl Supervised {
    fn new(name: &'static str, scratch: &Path, start: Box<dyn Fn(&Path) -> Child>, kill_offset: Duration) -> Self {
        let first = scratch.join(format!("{name}-stderr-1.txt"));
        let child = start(&first);
        Supervised {
            name,
            start,
            child,
            stderr: vec![first],
            kills: 0,
            last_kill: Instant::now() - kill_offset,
            samples: Vec::new(),
            finished: false,
        }
    }

    fn stderr_text(&self) -> Vec<String> {
        self.stderr.iter().map(|p| std::fs::read_to_string(p).unwrap_or_default()).collect()
    }

    /// Notices a process that ended by itself: fine for the bounded job once it succeeded.
    fn check(&mut self, may_finish: bool) {
        if self.finished {
            return;
        }
        if let Ok(Some(status)) = self.child.try_wait() {
            let last = self.stderr_text().pop().unwrap_or_default();
            assert!(may_finish && status.success(), "{} ended by itself ({status}): {last}", self.name);
            self.finished = true;
        }
    }

    fn kill_every_minute(&mut self, scratch: &Path) {
        if self.finished || self.last_kill.elapsed() < Duration::from_secs(60) {
            return;
        }
        self.child.kill().expect("SIGKILL");
        let _ = self.child.wait();
        self.kills += 1;
        self.last_kill = Instant::now();
        let errors = scratch.join(format!("{}-stderr-{}.txt", self.name, self.stderr.len() + 1));
        self.child = (self.start)(&errors);
        self.stderr.push(errors);
    }

    fn sample(&mut self, at_s: u64) {
        if !self.finished {
            if let Some(kib) = rss_kib(self.child.id()) {
                self.samples.push((at_s, kib));
            }
        }
    }

    /// SIGKILLs, processes resumed from a checkpoint, in-process restarts.
    fn summary(&self) -> String {
        let stderr = self.stderr_text();
        let restarts: usize = stderr.iter().map(|e| e.matches("restart ").count()).sum();
        // A resumed process says so before its first in-process restart (after taking over the
        // lock the killed process left, which it notes first).
        let resumed = stderr
            .iter()
            .filter(|e| {
                e.lines().take_while(|l| !l.starts_with("restart ")).any(|l| l.starts_with("restored from checkpoint"))
            })
            .count();
        format!(
            "{} SIGKILLs, {resumed} processes resumed from a checkpoint; {restarts} in-process restarts after injected failures",
            self.kills
        )
    }

    fn memory(&self) -> String {
        let mib: Vec<f64> = self.samples.iter().map(|&(_, kib)| kib as f64 / 1024.0).collect();
        let (lo, hi) = mib.iter().fold((f64::MAX, 0f64), |(lo, hi), &m| (lo.min(m), hi.max(m)));
        let listed: Vec<String> =
            self.samples.iter().map(|&(s, kib)| format!("{s}s {:.1}", kib as f64 / 1024.0)).collect();
        format!("{} samples, {lo:.1}–{hi:.1} MiB: {}", mib.len(), listed.join("  "))
    }
}

/// The committed files of a two-phase-commit sink's folder, line by line.
fn committed_lines(out: &Path, mut each: impl FnMut(&str)) {
    for f in std::fs::read_dir(out).expect("output") {
        let f = f.expect("entry");
        if f.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        for line in std::fs::read_to_string(f.path()).expect("part").lines() {
            each(line);
        }
    }
}

/// Every word's committed counts must be 1..n exactly once: (words wrong, words not in the log).
fn check_wordcount(out: &Path, expected: &HashMap<String, u64>) -> (usize, usize) {
    let mut got: HashMap<String, Vec<u64>> = HashMap::new();
    committed_lines(out, |line| {
        let (w, c) = line.split_once('\t').expect("word<TAB>count");
        got.entry(w.to_string()).or_default().push(c.parse().expect("count"));
    });
    let mut wrong = 0;
    for (w, n) in expected {
        let mut counts = got.remove(w).unwrap_or_default();
        counts.sort_unstable();
        if counts != (1..=*n).collect::<Vec<_>>() {
            wrong += 1;
        }
    }
    (wrong, got.len())
}

/// Every (key, window) of `events` events must be committed exactly once with its exact
/// count: (windows expected, windows wrong or missing, lines that are duplicates or unexpected).
fn check_windows(out: &Path, events: u64) -> (usize, usize, usize) {
    let mut expected: HashMap<(u64, u64), u64> = HashMap::new();
    for i in 0..events {
        *expected.entry((i % WINDOW_KEYS, i / WINDOW_MS * WINDOW_MS)).or_default() += 1;
    }
    let windows = expected.len();
    let mut got: HashMap<(u64, u64), u64> = HashMap::new();
    let mut extra = 0;
    committed_lines(out, |line| {
        let mut f = line.split('\t').map(|v| v.parse::<u64>().expect("key<TAB>window<TAB>count"));
        let (k, w, c) = (f.next().expect("key"), f.next().expect("window"), f.next().expect("count"));
        if got.insert((k, w), c).is_some() {
            extra += 1;
        }
    });
    let mut wrong = 0;
    for (kw, c) in &expected {
        if got.remove(kw) != Some(*c) {
            wrong += 1;
        }
    }
    (windows, wrong, extra + got.len())
}

/// The log's writer: ~1.5 MB/s of text lines, whole lines only, until `stop`; it returns each
/// word's count.
fn start_writer(log: &Path, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<HashMap<String, u64>> {
    let log = log.to_path_buf();
    std::thread::spawn(move || {
        let mut f = std::fs::OpenOptions::new().append(true).open(&log).expect("log");
        let mut counts: HashMap<String, u64> = HashMap::new();
        let mut n = 0u64;
        while !stop.load(Ordering::SeqCst) {
            let mut chunk = String::new();
            for _ in 0..2_000 {
                n += 1;
                for w in 0..(mix(n) % 9) {
                    let word = format!("w{}", mix(n * 31 + w) % 20_000);
                    chunk.push_str(&word);
                    chunk.push(' ');
                    *counts.entry(word).or_default() += 1;
                }
                chunk.push('\n');
            }
            f.write_all(chunk.as_bytes()).expect("append");
            std::thread::sleep(Duration::from_millis(20));
        }
        counts
    })
}

/// Checks both jobs' output exactly once and prints what the soak saw.
fn report(
    minutes: f64,
    (wordcount, windowed): (&Supervised, &Supervised),
    (out, window_dir): (&Path, &Path),
    (expected, window_events, window_took): (&HashMap<String, u64>, u64, Duration),
) {
    let (wrong, unknown) = check_wordcount(out, expected);
    let (windows, windows_wrong, windows_extra) = check_windows(&window_dir.join("out"), window_events);
    let words: u64 = expected.values().sum();
    println!("## Soak: {minutes} min of weir wordcount --follow and a windowed job, side by side\n");
    println!("word count: {words} words in the log, {} distinct; {}", expected.len(), wordcount.summary());
    println!("  exactly-once check: {wrong} words with wrong counts, {unknown} words that are not in the log");
    println!("  resident memory: {}", wordcount.memory());
    println!(
        "windowed job: {window_events} events, {windows} (key, window) results, done after {:.0} s; {}",
        window_took.as_secs_f64(),
        windowed.summary()
    );
    println!("  exactly-once check: {windows_wrong} results wrong or missing, {windows_extra} duplicate or unexpected");
    println!("  resident memory: {}", windowed.memory());
    assert_eq!(wrong, 0, "some word's counts are not 1..n exactly once");
    assert_eq!(unknown, 0, "words in the output that are not in the log");
    assert_eq!((windows_wrong, windows_extra), (0, 0), "window results are not exactly once");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--window-child") {
        let events = args[i + 2].parse().expect("events");
        window_child(Path::new(&args[i + 1]), events);
        return;
    }
    let minutes: f64 = args
        .iter()
        .position(|a| a == "--minutes")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(10.0);
    let weir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/weir");
    assert!(weir.exists(), "build the command first: cargo build --release");
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("scratch folder");
    let scratch = dir.path().to_path_buf();
    let (log, out, chk) = (scratch.join("log.txt"), scratch.join("out"), scratch.join("chk"));
    std::fs::write(&log, "").expect("log");
    let window_dir = scratch.join("window");
    // Sized to take about the soak's length at the rate limit (restarts make it longer).
    let window_events = (minutes * 60.0 * WINDOW_RATE * 0.9) as u64;

    // The writer: ~1.5 MB/s of text lines, whole lines only.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = start_writer(&log, Arc::clone(&stop));

    let started = Instant::now();
    let until = Duration::from_secs_f64(minutes * 60.0);
    let mut wordcount = {
        let (weir, log, out, chk) = (weir.clone(), log.clone(), out.clone(), chk.clone());
        Supervised::new(
            "wordcount",
            &scratch,
            Box::new(move |errors| start_wordcount(&weir, &log, &out, &chk, errors)),
            Duration::ZERO,
        )
    };
    // Killed half a minute after the word count each time, so the two never die together.
    let mut windowed = {
        let window_dir = window_dir.clone();
        Supervised::new(
            "window",
            &scratch,
            Box::new(move |errors| start_window(&window_dir, window_events, errors)),
            Duration::from_secs(30),
        )
    };
    let mut last_sample = Instant::now() - Duration::from_secs(10);
    while started.elapsed() < until {
        std::thread::sleep(Duration::from_millis(200));
        wordcount.check(false);
        windowed.check(true);
        if last_sample.elapsed() >= Duration::from_secs(5) {
            last_sample = Instant::now();
            wordcount.sample(started.elapsed().as_secs());
            windowed.sample(started.elapsed().as_secs());
        }
        wordcount.kill_every_minute(&scratch);
        windowed.kill_every_minute(&scratch);
    }
    stop.store(true, Ordering::SeqCst);
    let expected = writer.join().expect("writer");
    // Let the word count read the rest of the log, then stop it as a user does: Ctrl-C.
    std::thread::sleep(Duration::from_secs(10));
    Command::new("kill").args(["-INT", &wordcount.child.id().to_string()]).status().expect("kill -INT");
    let status = wordcount.child.wait().expect("weir ends");
    assert!(status.success(), "the stopped word count failed: {}", wordcount.stderr_text().pop().unwrap_or_default());
    // The windowed job runs until its last event (no more kills).
    while !windowed.finished {
        std::thread::sleep(Duration::from_millis(200));
        windowed.check(true);
    }
    let window_took = started.elapsed();

    report(minutes, (&wordcount, &windowed), (&out, &window_dir), (&expected, window_events, window_took));
}
