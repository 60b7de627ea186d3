//! Helpers the integration tests share (each test binary includes this module and uses
//! some of it).
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use weir::sink::CommittedOutput;
use weir::source::Generator;
use weir::JobHandle;

/// `weir wordcount` on 2 workers with checkpoints into `chk`, with `args` (settings, then
/// anything else), its output captured.
pub fn wordcount(input: &Path, out: &Path, chk: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_weir"));
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
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < Duration::from_secs(120), "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
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
