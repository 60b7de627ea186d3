//! Small helpers shared by the perf/ harnesses (each uses some of them).
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use weir::prng::mix;
use weir::{Job, JobReport, RunConfig};

/// The value after flag `name` on the command line (`--keys 1000`), parsed; `default`
/// without the flag. A value that does not parse stops the harness, naming the flag.
pub(crate) fn flag<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)) {
        Some(v) => v.parse().unwrap_or_else(|_| panic!("{name} cannot take {v}")),
        None => default,
    }
}

/// The workspace's `target` folder, for scratch files on the same disk as the build (not
/// `/tmp`, which may be memory): `cargo bench` runs harnesses in `perf/`, a binary run by hand
/// anywhere.
pub(crate) fn target_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target")
}

/// Runs `job` under `config` for `duration`, then stops it gracefully.
pub(crate) fn run_for(job: Job, config: RunConfig, duration: Duration) -> JobReport {
    let handle = job.start(config).expect("job starts");
    std::thread::sleep(duration);
    handle.stop();
    handle.join().expect("job ends cleanly")
}

/// Today's date as `YYYY-MM-DD` (from `date`), or `undated`: the folder results go to.
pub(crate) fn today() -> String {
    std::process::Command::new("date")
        .arg("+%Y-%m-%d")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "undated".into())
}

/// Eight files of English-like text (`bytes` in all): a skewed vocabulary of 100,000 words (a few very
/// frequent, a long tail), some capitalised, lines of 4 to 16 words.
pub(crate) fn corpus(dir: &Path, bytes: u64) -> Vec<PathBuf> {
    let files: Vec<PathBuf> = (0..8).map(|i| dir.join(format!("corpus-{i}.txt"))).collect();
    let per_file = bytes / 8;
    if files.iter().all(|f| std::fs::metadata(f).is_ok_and(|m| m.len() >= per_file)) {
        return files;
    }
    std::fs::create_dir_all(dir).expect("corpus folder");
    let vocabulary: Vec<String> = (0..100_000u64)
        .map(|i| {
            let len = 2 + mix(i) % 9;
            let mut w: String = (0..len).map(|j| (b'a' + (mix(i * 31 + j) % 26) as u8) as char).collect();
            if i % 10 == 0 {
                w[..1].make_ascii_uppercase();
            }
            w
        })
        .collect();
    let mut state = 1u64;
    for f in &files {
        let mut out = std::io::BufWriter::new(std::fs::File::create(f).expect("corpus file"));
        let mut written = 0u64;
        let mut line = String::new();
        while written < per_file {
            line.clear();
            state = mix(state);
            for j in 0..4 + state % 13 {
                let r = mix(state ^ j);
                // Zipf-like: the index's magnitude is drawn first.
                let idx = (r % 100_000) >> (r >> 60);
                line.push_str(&vocabulary[idx as usize]);
                line.push(if j % 7 == 6 { ',' } else { ' ' });
            }
            line.push('\n');
            out.write_all(line.as_bytes()).expect("corpus write");
            written += line.len() as u64;
        }
        out.flush().expect("corpus flush");
    }
    files
}
