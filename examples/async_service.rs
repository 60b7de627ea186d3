//! Embedding weir in an async service: requests are pushed into a running job from a tokio task,
//! results are awaited by another, and the job's handle is joined on a blocking thread. The job
//! checkpoints every 20 ms and one of its operators fails once mid-run; the job restarts from
//! its latest checkpoint, the push source replays what that checkpoint did not cover, and the
//! host drops the results it already has by their sequence numbers.
//!
//! `cargo run --release --example async_service`
#![allow(clippy::disallowed_methods)] // the engine's rule (clippy.toml); an example is a program, which may read the wall clock and start threads

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use weir::checkpoint::{CheckpointConfig, CheckpointMode};
use weir::sink::{Guarantee, RecvError};
use weir::source::SendError;
use weir::{Job, RunConfig};

/// A request: which user asked, and when it was sent (for the end-to-end latency).
#[derive(Clone, Debug, weir::Persist)]
struct Request {
    id: u64,
    user: String,
    sent_ns: u64,
}

/// A reply: the user's running request count.
#[derive(Clone, Debug, weir::Persist)]
struct Reply {
    id: u64,
    user: String,
    count: u64,
    sent_ns: u64,
}

const REQUESTS: u64 = 50_000;
/// The request whose processing fails (once).
const FAILING_REQUEST: u64 = 20_000;
static FAILED: AtomicBool = AtomicBool::new(false);

#[tokio::main]
async fn main() -> weir::Result<()> {
    // The injected failure is a panic in a user function: weir catches it and fails over; say
    // so in one line instead of the default hook's backtrace.
    std::panic::set_hook(Box::new(|info| eprintln!("(injected) {info}")));
    let clock = Instant::now();
    let dir = std::env::temp_dir().join(format!("weir-async-service-{}", std::process::id()));
    let job = Job::new("async-service").with_checkpointing(
        CheckpointConfig::new(&dir).interval(Duration::from_millis(20)).mode(CheckpointMode::Aligned),
    );
    let (mut requests, stream) = job.push_source::<Request>(4096);
    let mut replies = stream
        .map(|r: Request| {
            if r.id == FAILING_REQUEST && !FAILED.swap(true, Ordering::SeqCst) {
                panic!("injected failure at request {}", r.id);
            }
            r
        })
        .key_by(|r: &Request| r.user.clone())
        .aggregate(
            || (0u64, 0u64, 0u64),
            |acc: &mut (u64, u64, u64), r: Request| *acc = (acc.0 + 1, r.id, r.sent_ns),
            |user: &String, acc: &(u64, u64, u64)| Reply {
                id: acc.1,
                user: user.clone(),
                count: acc.0,
                sent_ns: acc.2,
            },
        )
        .pull_sink_with(4096, Guarantee::AtLeastOnce);
    let handle = job.start(RunConfig::default().workers(2))?;
    let job_done = tokio::task::spawn_blocking(move || handle.join());

    // The service's front end: requests pushed in as they come (here: as fast as the job takes them).
    let producer = tokio::spawn(async move {
        for id in 0..REQUESTS {
            let mut request =
                Request { id, user: format!("user-{}", id % 100), sent_ns: clock.elapsed().as_nanos() as u64 };
            loop {
                match requests.try_send(request) {
                    Ok(()) => break,
                    Err(SendError::Full(back)) => {
                        request = back;
                        tokio::task::yield_now().await;
                    }
                    Err(e) => panic!("the job stopped taking requests: {e}"),
                }
            }
        }
        requests.close();
    });

    // The back end: replies awaited; replays after the failover carry numbers already seen.
    let mut next_seq = 0u64;
    let (mut latencies, mut replayed) = (Vec::with_capacity(REQUESTS as usize), 0u64);
    loop {
        match replies.recv().await {
            Ok(d) if d.seq < next_seq => replayed += 1,
            Ok(d) => {
                next_seq = d.seq + 1;
                latencies.push(clock.elapsed().as_nanos() as u64 - d.record.sent_ns);
            }
            Err(RecvError::Ended { error: None }) => break,
            Err(e) => panic!("{e}"),
        }
    }
    producer.await.expect("the producer task");
    let report = job_done.await.expect("the join task")?;
    let _ = std::fs::remove_dir_all(&dir);

    assert_eq!(latencies.len() as u64, REQUESTS, "one reply per request, after dropping replays");
    latencies.sort_unstable();
    let q = |f: f64| latencies[((latencies.len() - 1) as f64 * f) as usize];
    println!(
        "{REQUESTS} requests; {} restart(s), {replayed} replayed replies dropped; end-to-end latency p50 {} µs, p99 {} µs",
        report.restarts,
        q(0.5) / 1000,
        q(0.99) / 1000
    );
    Ok(())
}
