//! One run of a fixed workload at parallelism 1 on one worker, without checkpoints: what
//! `perf/instructions.sh` counts the instructions of (under callgrind, where counts are the
//! same on a busy machine and a quiet one).
//!
//! `budget W1|W2|W2p2|W3|W5|wordcount|wordcount-strings|q5 N [SCRATCH]`: N records (word count: a
//! generated corpus of N words under SCRATCH; q5: N Nexmark events). Prints the records
//! processed.
//!
//! `budget updates|updates-tracked N [SCRATCH]`: N updates to keys drawn uniformly from a
//! keyed state of 1,000,000 counts, after a fork; `-tracked` after a changelog checkpoint, so
//! every write also marks its slot for the next one (what changelog checkpoints cost the run
//! path).

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

mod common;

use std::path::PathBuf;

use weir::source::{Generator, TextSource};
use weir::{Job, RunConfig, Window};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let usage = "usage: budget W1|W2|W2p2|W3|W5|wordcount|wordcount-strings|q5 N [SCRATCH]";
    let (Some(workload), Some(n)) = (args.first(), args.get(1).and_then(|n| n.parse::<u64>().ok())) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let scratch = PathBuf::from(args.get(2).map_or("target/budget", String::as_str));
    if let Some(tracked) = match workload.as_str() {
        "updates" => Some(false),
        "updates-tracked" => Some(true),
        _ => None,
    } {
        return updates(&scratch, n, tracked);
    }
    let job = Job::new(format!("budget-{workload}")).with_parallelism(if workload == "W2p2" { 2 } else { 1 });
    match workload.as_str() {
        // Flink's W1–W3 as `../shared/peers/weir` writes them.
        "W1" => job
            .generator(Generator::new(|i, _| i).count(n))
            .map(|x: u64| x.wrapping_mul(3))
            .filter(|x| x % 2 == 0)
            .discard(),
        // W2p2: W2 at parallelism 2 (two source and two sum subtasks on the one worker; the job's
        // parallelism is set above): the key-by that routes each record to one of two rings,
        // which parallelism 1 skips.
        "W2" | "W2p2" => job
            .generator(Generator::new(|i, _| (i % 10_000, 1u64)).count(n))
            .key_by(|r: &(u64, u64)| r.0)
            .reduce(|a, b| (a.0, a.1 + b.1))
            .named("sum")
            .discard(),
        // W5's path (W2's, keeping each key's newest record, with the latency probe), at full
        // speed: what a record costs when the source is not paced.
        "W5" => job
            .generator(Generator::new(|i, now_ns| (i % 10_000, now_ns)).count(n))
            .key_by(|r: &(u64, u64)| r.0)
            .reduce(|_, b| *b)
            .named("latest")
            .measure_latency(|r: &(u64, u64)| r.1)
            .discard(),
        "W3" => job
            .generator(Generator::new(|i, _| (i % 1000, i)).count(n))
            .with_watermarks(|r: &(u64, u64)| r.1, 0)
            .key_by(|r: &(u64, u64)| r.0)
            .window(Window::tumbling(1000), |r: &(u64, u64)| r.1)
            .count()
            .discard(),
        "wordcount" => {
            return words(&scratch, n, |input, out| weir_jobs::wordcount::wordcount(input, out, 1, false));
        }
        // The same words as owned `String`s, keyed by reference.
        "wordcount-strings" => {
            return words(&scratch, n, |input, out| weir_jobs::wordcount::wordcount_strings(input, out, 1));
        }
        "q5" => {
            let q: weir_jobs::nexmark::Query = "q5".parse().expect("a query");
            weir_jobs::nexmark::build(&job, q, Some(n), None).discard();
        }
        other => {
            eprintln!("no workload {other}; {usage}");
            std::process::exit(2);
        }
    }
    run(job);
}

/// Runs the word count `make` builds over a corpus of about `n` words (6.5 bytes a word; the
/// corpus is made once per size and kept).
fn words(scratch: &std::path::Path, n: u64, make: impl FnOnce(TextSource, PathBuf) -> Job) {
    let dir = scratch.join(format!("corpus-{n}"));
    common::corpus(&dir, n * 13 / 2);
    let input = TextSource::open(&dir).expect("the corpus was just written");
    let out = scratch.join(format!("out-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    run(make(input, out.clone()));
    let _ = std::fs::remove_dir_all(&out);
}

/// `n` uniform updates of a state of 1,000,000 counts after a fork (and, `tracked`, after a
/// changelog checkpoint of it, which turns on the marking of written slots).
fn updates(scratch: &std::path::Path, n: u64, tracked: bool) {
    use weir::checkpoint::{write_task_snapshot, CheckpointStorage, PageIndex};
    use weir::snapshot::{Barrier, TaskSnapshot};
    use weir::state::{KeyedValueState, Snapshot};
    const KEYS: u64 = 1_000_000;
    let mut state: KeyedValueState<u64, u64> = KeyedValueState::new();
    (0..KEYS).for_each(|k| state.put(k, 0));
    if tracked {
        let storage = CheckpointStorage::new(scratch.join(format!("updates-{}", std::process::id())));
        storage.prepare(1).expect("a checkpoint folder");
        let mut snap = TaskSnapshot::new(Barrier { id: 1, trigger_ns: 0, unaligned: false, savepoint: false });
        snap.add("counts".into(), 0, state.fork());
        write_task_snapshot(&storage, Some(&PageIndex::changelog(10)), 0, &snap).expect("a changelog checkpoint");
        let _ = std::fs::remove_dir_all(storage.dir());
    }
    // Writes are marked from this fork on when a changelog checkpoint asked for them.
    let fork = state.fork();
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *state.get_or_insert_with(x % KEYS, || 0) += 1;
    }
    drop(fork);
    println!("records {n}");
}

fn run(job: Job) {
    let config = RunConfig::default().pin_workers(true).workers(1);
    let report = match std::env::var("WEIR_BUDGET_SCRAPE_MS").ok().and_then(|ms| ms.parse::<u64>().ok()) {
        None => job.execute(config).expect("the job runs"),
        Some(every_ms) => {
            // The control endpoint on, its metrics scraped every `every_ms` of wall time as
            // Prometheus would: perf/instructions.sh --scraped counts the threads apart.
            let mut handle = job.start(config).expect("the job starts");
            let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let scraper = {
                let (job, done) = (handle.controller(), std::sync::Arc::clone(&done));
                std::thread::spawn(move || scrape_metrics_every(job, every_ms, &done))
            };
            let report = loop {
                if let Some(r) = handle.try_finish() {
                    break r.expect("the job runs");
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            };
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            let scrapes = scraper.join().expect("the scraper ends");
            println!("scrapes {scrapes}");
            report
        }
    };
    println!("records {}", report.source_records);
}

/// Serves `job`'s control endpoint and gets its `/metrics` every `every_ms` until `done`;
/// how many it got. The endpoint is started here, off the main thread, so that callgrind's
/// per-thread counts put everything it costs in this thread and the endpoint's own (named so
/// that perf/instructions.sh --scraped finds them).
#[inline(never)]
fn scrape_metrics_every(job: weir::JobController, every_ms: u64, done: &std::sync::atomic::AtomicBool) -> u64 {
    use std::io::{Read, Write};
    let endpoint = weir_ops::ControlEndpoint::start("127.0.0.1:0", weir_ops::control::Reach::Loopback, job)
        .expect("the endpoint serves");
    let addr = endpoint.addr();
    let mut scrapes = 0;
    while !done.load(std::sync::atomic::Ordering::SeqCst) {
        if let Ok(mut s) = std::net::TcpStream::connect(addr) {
            let _ = write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
            let mut answer = Vec::new();
            if s.read_to_end(&mut answer).is_ok() && answer.starts_with(b"HTTP/1.1 200") {
                scrapes += 1;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(every_ms));
    }
    scrapes
}
