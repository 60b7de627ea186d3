//! The soak run: `weir wordcount --follow` over a log that a writer thread keeps growing, with
//! exactly-once checkpoints, an injected operator failure every few seconds (in-process
//! failover) and a SIGKILL every minute (the same command is run again and resumes), for
//! `--minutes` (default 10). Then the writer stops, the job is stopped with Ctrl-C (SIGINT),
//! and the committed output must hold, for every word of the log, the counts 1..n exactly once.
//! The resident memory of the running process is sampled every 5 s and printed.
//!
//! `cargo build --release && cargo bench --bench soak -- [--minutes M]`

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z ^ (z >> 31)
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Starts `weir wordcount`; its standard error goes to `errors` (read at the end).
fn start(weir: &Path, log: &Path, out: &Path, chk: &Path, errors: &Path) -> Child {
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

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let minutes: f64 = args
        .iter()
        .position(|a| a == "--minutes")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(10.0);
    let weir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/release/weir");
    assert!(weir.exists(), "build the command first: cargo build --release");
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("scratch folder");
    let (log, out, chk) = (dir.path().join("log.txt"), dir.path().join("out"), dir.path().join("chk"));
    std::fs::write(&log, "").expect("log");

    // The writer: ~1.5 MB/s of text lines, whole lines only.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (log, stop) = (log.clone(), stop.clone());
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
    };

    let started = Instant::now();
    let until = Duration::from_secs_f64(minutes * 60.0);
    let errors = |run: usize| dir.path().join(format!("stderr-{run}.txt"));
    let mut runs = 1;
    let mut child = start(&weir, &log, &out, &chk, &errors(runs));
    let (mut kills, mut last_kill, mut samples) = (0, Instant::now(), Vec::new());
    let mut last_sample = Instant::now() - Duration::from_secs(10);
    while started.elapsed() < until {
        std::thread::sleep(Duration::from_millis(200));
        if let Ok(Some(status)) = child.try_wait() {
            panic!("weir ended by itself ({status}) after {:?}", started.elapsed());
        }
        if last_sample.elapsed() >= Duration::from_secs(5) {
            last_sample = Instant::now();
            if let Some(kib) = rss_kib(child.id()) {
                samples.push((started.elapsed().as_secs(), kib));
            }
        }
        if last_kill.elapsed() >= Duration::from_secs(60) {
            child.kill().expect("SIGKILL");
            let _ = child.wait();
            kills += 1;
            last_kill = Instant::now();
            runs += 1;
            child = start(&weir, &log, &out, &chk, &errors(runs));
        }
    }
    stop.store(true, Ordering::SeqCst);
    let expected = writer.join().expect("writer");
    // Let the job read the rest of the log, then stop it as a user does: Ctrl-C.
    std::thread::sleep(Duration::from_secs(10));
    Command::new("kill").args(["-INT", &child.id().to_string()]).status().expect("kill -INT");
    let status = child.wait().expect("weir ends");
    let stderr: Vec<String> = (1..=runs).map(|r| std::fs::read_to_string(errors(r)).unwrap_or_default()).collect();
    assert!(status.success(), "the stopped job failed: {}", stderr[runs - 1]);
    let restarts: usize = stderr.iter().map(|e| e.matches("restart ").count()).sum();
    let resumed = stderr.iter().filter(|e| e.contains("restored from checkpoint")).count();

    let mut got: HashMap<String, Vec<u64>> = HashMap::new();
    for f in std::fs::read_dir(&out).expect("output") {
        let f = f.expect("entry");
        if f.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        for line in std::fs::read_to_string(f.path()).expect("part").lines() {
            let (w, c) = line.split_once('\t').expect("word<TAB>count");
            got.entry(w.to_string()).or_default().push(c.parse().expect("count"));
        }
    }
    let mut wrong = 0;
    for (w, n) in &expected {
        let mut counts = got.remove(w).unwrap_or_default();
        counts.sort_unstable();
        if counts != (1..=*n).collect::<Vec<_>>() {
            wrong += 1;
        }
    }
    let words: u64 = expected.values().sum();
    println!("## Soak: {minutes} min of weir wordcount --follow\n");
    println!(
        "{} words in the log, {} distinct; {kills} SIGKILLs, {resumed} processes resumed from a checkpoint; {restarts} in-process restarts after injected failures",
        words,
        expected.len()
    );
    println!("exactly-once check: {} words with wrong counts, {} words that are not in the log", wrong, got.len());
    println!("\nresident memory of the running process (s → MiB):");
    for (s, kib) in &samples {
        print!("{s}s {:.1}  ", *kib as f64 / 1024.0);
    }
    println!();
    assert_eq!(wrong, 0, "some word's counts are not 1..n exactly once");
    assert!(got.is_empty(), "words in the output that are not in the log");
}
