//! The embedded round trip, host → job → host, through `push_source` and `pull_sink`: a
//! keyed running count over owned `String` keys, parallelism 1 on two workers.
//!
//! - latency: one request in flight at a time (send, then wait for its reply), p50/p99 of the
//!   round trip;
//! - throughput: the host keeps the ring full from one thread and drains replies on another.
//!
//! Each without checkpoints, and with exactly-once checkpoints every 100 ms (the push source
//! then keeps every event since the last completed checkpoint in its replay buffer: one clone
//! per event, dropped when a checkpoint completes), in one run; the ratios are the cost of
//! checkpointing the host job, replay buffer included. The replay buffer's own cost is measured
//! alone too: an event cloned into the buffer and dropped from it, per event. With checkpoints,
//! the same again with the host acknowledging each result (`with_acks`, `ack(seq)` after each
//! receive): the ratio is what acknowledged delivery costs a round trip.
//!
//! `cargo bench --bench embedded -- [--requests N]`

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use weir::checkpoint::CheckpointConfig;
use weir::metrics::group_digits;
use weir::sink::{EventReceiver, RecvError};
use weir::source::{EventSender, SendError};
use weir::{Job, RunConfig};

const WAIT: Duration = Duration::from_secs(60);

type Event = (String, u64);
/// One round: latency p50/p99 without and with checkpoints (ns), throughput without and with;
/// then with checkpoints and acknowledgements, latency p50/p99 and throughput.
type Round = (u64, u64, u64, u64, f64, f64, u64, u64, f64);

/// Whether the host acknowledges each result it receives.
#[derive(Clone, Copy)]
struct Acks(bool);

impl Acks {
    fn handled(self, rx: &mut EventReceiver<Event>, seq: u64) {
        if self.0 {
            rx.ack(seq).expect("ack");
        }
    }
}

fn job(checkpoints: Option<&std::path::Path>, acks: Acks) -> (Job, EventSender<Event>, EventReceiver<Event>) {
    let mut job = Job::new("embedded-bench");
    if let Some(dir) = checkpoints {
        job = job.with_checkpointing(CheckpointConfig::new(dir).interval(Duration::from_millis(100)));
    }
    let (tx, events) = job.push_source::<(String, u64)>(8192);
    let rx = events
        .key_by(|e: &(String, u64)| e.0.clone())
        .aggregate(|| 0u64, |c: &mut u64, _| *c += 1, |k: &String, c: &u64| (k.clone(), *c))
        .pull_sink(8192);
    (job, tx, if acks.0 { rx.with_acks() } else { rx })
}

fn key(i: u64) -> String {
    format!("user-{}", i % 1000)
}

/// Round trips one at a time; returns (p50, p99) in ns.
fn latency(checkpoints: Option<&std::path::Path>, n: u64, acks: Acks) -> (u64, u64) {
    let (job, mut tx, mut rx) = job(checkpoints, acks);
    let handle = job.start(RunConfig::default().pin_workers(true).workers(2)).expect("start");
    let mut rtt = Vec::with_capacity(n as usize);
    for i in 0..n {
        let t = Instant::now();
        tx.send_timeout((key(i), i), WAIT).expect("send");
        loop {
            match rx.try_recv() {
                Ok(d) => {
                    acks.handled(&mut rx, d.seq);
                    break;
                }
                Err(RecvError::Empty) => std::hint::spin_loop(),
                Err(e) => panic!("{e}"),
            }
        }
        rtt.push(t.elapsed().as_nanos() as u64);
    }
    tx.close();
    drain(&mut rx, acks);
    handle.join().expect("join");
    rtt.sort_unstable();
    (rtt[rtt.len() / 2], rtt[rtt.len() * 99 / 100])
}

fn drain(rx: &mut EventReceiver<(String, u64)>, acks: Acks) -> u64 {
    let mut n = 0;
    loop {
        match rx.recv_timeout(WAIT) {
            Ok(d) => {
                acks.handled(rx, d.seq);
                n += 1
            }
            Err(RecvError::Ended { error: None }) => return n,
            Err(e) => panic!("{e}"),
        }
    }
}

/// Requests per second with the ring kept full.
fn throughput(checkpoints: Option<&std::path::Path>, n: u64, acks: Acks) -> f64 {
    let (job, mut tx, mut rx) = job(checkpoints, acks);
    let handle = job.start(RunConfig::default().pin_workers(true).workers(2)).expect("start");
    let start = Instant::now();
    let receiver = std::thread::spawn(move || drain(&mut rx, acks));
    for i in 0..n {
        let mut e = (key(i), i);
        loop {
            match tx.try_send(e) {
                Ok(()) => break,
                Err(SendError::Full(back)) => {
                    e = back;
                    std::hint::spin_loop();
                }
                Err(err) => panic!("{err}"),
            }
        }
    }
    tx.close();
    let got = receiver.join().expect("receiver");
    let secs = start.elapsed().as_secs_f64();
    handle.join().expect("join");
    assert_eq!(got, n, "one reply per request");
    n as f64 / secs
}

/// The replay buffer's work per event on its own: clone in, drop out (a checkpoint's trim).
fn replay_buffer_ns(n: u64) -> f64 {
    let events: Vec<(String, u64)> = (0..4096).map(|i| (key(i), i)).collect();
    let mut buffer: VecDeque<(String, u64)> = VecDeque::new();
    let start = Instant::now();
    for i in 0..n {
        buffer.push_back(std::hint::black_box(&events[(i % 4096) as usize]).clone());
        if buffer.len() > 10_000 {
            buffer.drain(..5_000);
        }
    }
    std::hint::black_box(&buffer);
    start.elapsed().as_nanos() as f64 / n as f64
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let requests: u64 = args
        .iter()
        .position(|a| a == "--requests")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(200_000);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut rows: Vec<Round> = Vec::new();
    for round in 0..2 {
        let chk = dir.path().join(format!("chk-{round}"));
        let (p50, p99) = latency(None, requests / 10, Acks(false));
        let (c50, c99) = latency(Some(&chk.join("latency")), requests / 10, Acks(false));
        let (a50, a99) = latency(Some(&chk.join("latency-acked")), requests / 10, Acks(true));
        let plain = throughput(None, requests, Acks(false));
        let checkpointed = throughput(Some(&chk.join("throughput")), requests, Acks(false));
        let acked = throughput(Some(&chk.join("throughput-acked")), requests, Acks(true));
        rows.push((p50, p99, c50, c99, plain, checkpointed, a50, a99, acked));
    }
    let best = |f: fn(&Round) -> f64, max: bool| {
        rows.iter().map(f).fold(if max { f64::MIN } else { f64::MAX }, |a, b| if max { a.max(b) } else { a.min(b) })
    };
    let (p50, p99) = (best(|r| r.0 as f64, false), best(|r| r.1 as f64, false));
    let (c50, c99) = (best(|r| r.2 as f64, false), best(|r| r.3 as f64, false));
    let (plain, checkpointed) = (best(|r| r.4, true), best(|r| r.5, true));
    let (a50, a99, acked) = (best(|r| r.6 as f64, false), best(|r| r.7 as f64, false), best(|r| r.8, true));
    let buffer = replay_buffer_ns(20_000_000);
    println!("embedded round trip (keyed count over String keys, p=1, 2 workers), best of 2 rounds:");
    println!("  latency, one in flight:   no checkpoints p50 {:.1} µs p99 {:.1} µs; checkpoints every 100 ms p50 {:.1} µs p99 {:.1} µs", p50 / 1e3, p99 / 1e3, c50 / 1e3, c99 / 1e3);
    println!(
        "  throughput, ring full:    no checkpoints {} req/s; checkpoints every 100 ms {} req/s ({:.2}×)",
        group_digits(plain as u64),
        group_digits(checkpointed as u64),
        checkpointed / plain
    );
    println!(
        "  acknowledged (with checkpoints): p50 {:.1} µs p99 {:.1} µs ({:.2}× and {:.2}× without acks); {} req/s ({:.2}× without acks)",
        a50 / 1e3,
        a99 / 1e3,
        a50 / c50,
        a99 / c99,
        group_digits(acked as u64),
        acked / checkpointed
    );
    println!(
        "  replay buffer alone:      {buffer:.1} ns per event (clone in, drop out) = {:.1}% of a request at the plain throughput",
        buffer / (1e9 / plain) * 100.0
    );
}
