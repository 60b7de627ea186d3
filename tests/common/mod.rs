//! Helpers the integration tests share (each test binary includes this module).

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};

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
