//! Embedding weir in a low-latency program: the host pushes events in through a lock-free ring
//! and reads results back from another, measuring the round trip.
//!
//! `cargo run --release --example embedded`
#![allow(clippy::disallowed_methods)] // the engine's rule (clippy.toml); an example is a program, which may read the wall clock and start threads

use std::time::Instant;

use weir::{Job, RunConfig};

#[derive(Clone, Copy, weir::Persist)]
struct Tick {
    symbol: u32,
    price: f64,
    sent_ns: u64,
}

fn main() -> weir::Result<()> {
    let clock = Instant::now();
    let job = Job::new("embedded");
    let (mut ticks, stream) = job.push_source::<Tick>(1024);
    // A running maximum price per symbol, as a keyed reduce.
    let mut highs =
        stream.key_by(|t: &Tick| t.symbol).reduce(|a, b| if b.price > a.price { *b } else { *a }).pull_sink(1024);
    let handle = job.start(RunConfig::default().workers(2))?;

    let mut round_trips_ns = Vec::new();
    for i in 0..20_000u64 {
        let tick =
            Tick { symbol: (i % 4) as u32, price: 100.0 + (i % 97) as f64, sent_ns: clock.elapsed().as_nanos() as u64 };
        let mut t = tick;
        while let Err(back) = ticks.try_send(t) {
            t = back.into_event();
        }
        // Wait for this tick's result: one result per tick.
        loop {
            if let Ok(high) = highs.try_recv() {
                round_trips_ns.push(clock.elapsed().as_nanos() as u64 - tick.sent_ns);
                let _ = high;
                break;
            }
            std::hint::spin_loop();
        }
    }
    ticks.close();
    while !highs.is_finished() {
        let _ = highs.try_recv();
    }
    handle.join()?;
    round_trips_ns.sort_unstable();
    let q = |f: f64| round_trips_ns[((round_trips_ns.len() - 1) as f64 * f) as usize];
    println!("{} ticks; round trip host → job → host: p50 {} ns, p99 {} ns", round_trips_ns.len(), q(0.5), q(0.99));
    Ok(())
}
