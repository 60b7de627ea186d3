//! Checkpoints into object storage against the local disk at the same state
//! (`cargo bench --bench object_store -- s3://BUCKET/PREFIX [KEYS]`, the store's endpoint and
//! credentials from the AWS environment variables; moto on loopback serves): a keyed sum over
//! KEYS keys (state of about 24 bytes a key) checkpointed every 200 ms, full and incremental,
//! the local disk and the store alternating in one run so the ratios share the machine's
//! load. Prints the median checkpoint duration and its asynchronous part per setting and the
//! ratio store / disk; `cat /proc/loadavg` beside it says how busy the machine was.

use std::time::Duration;

use weir::checkpoint::{CheckpointConfig, CheckpointStats};
use weir::sink::DiscardSink;
use weir::source::Generator;
use weir::{Job, RunConfig};

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The completed checkpoints of one run (the first, while state still grows, left out).
fn run(config: CheckpointConfig, keys: u64, name: &str) -> Vec<CheckpointStats> {
    let job = Job::new(name).with_parallelism(2).with_checkpointing(config.interval(Duration::from_millis(200)));
    job.generator(Generator::new(move |i, _| (i % keys, i)).count(keys * 40))
        .key_by(|e: &(u64, u64)| e.0)
        .aggregate(|| 0u64, |s: &mut u64, e| *s += e.1, |k, s| (*k, *s))
        .sink(|_| Ok(DiscardSink));
    let report = job.execute(RunConfig::default().pin_workers(true).workers(2)).unwrap();
    report.checkpoints.into_iter().skip(1).collect()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let Some(url) = args.first().cloned() else {
        eprintln!("usage: cargo bench --bench object_store -- s3://BUCKET/PREFIX [KEYS]");
        std::process::exit(2);
    };
    let keys: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1_000_000);
    println!(
        "| round | kind | where | checkpoints | median duration ms | median async ms | median upload ms | median state MB | duration store / disk |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for round in 0..3 {
        for incremental in [false, true] {
            let kind = if incremental { "incremental" } else { "full" };
            let disk = tempfile::tempdir().unwrap();
            let local = run(CheckpointConfig::new(disk.path()).incremental(incremental), keys, "disk");
            let prefix = format!("{}/{}-{round}-{kind}", url.trim_end_matches('/'), std::process::id());
            let store = weir_object_store::open(&prefix).unwrap_or_else(|e| panic!("{e}"));
            let remote = run(CheckpointConfig::in_store(store).incremental(incremental), keys, "store");
            let figures = |s: &[CheckpointStats]| {
                (
                    median(s.iter().map(|c| c.duration_ms).collect()),
                    median(s.iter().map(|c| c.async_ms).collect()),
                    median(s.iter().map(|c| c.upload_ms.unwrap_or(0.0)).collect()),
                    median(s.iter().map(|c| c.state_bytes as f64 / 1e6).collect()),
                )
            };
            let (ld, la, lu, lb) = figures(&local);
            let (rd, ra, ru, rb) = figures(&remote);
            println!("| {round} | {kind} | disk | {} | {ld:.1} | {la:.1} | {lu:.1} | {lb:.1} | |", local.len());
            println!(
                "| {round} | {kind} | store | {} | {rd:.1} | {ra:.1} | {ru:.1} | {rb:.1} | {:.2} |",
                remote.len(),
                rd / ld
            );
        }
    }
}
