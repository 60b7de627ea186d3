//! Counts events per key in 1-second tumbling event-time windows, with events arriving up to
//! 200 ms out of order.
//!
//! `cargo run --release --example windowed_count`
#![allow(clippy::disallowed_methods)] // the engine's rule (clippy.toml); an example is a program, which may read the wall clock and start threads

use weir::source::Generator;
use weir::{Job, RunConfig, Window};

#[derive(Clone, Copy, weir::Persist)]
struct Click {
    user: u32,
    /// Event time in milliseconds.
    ts_ms: u64,
}

fn main() -> weir::Result<()> {
    let job = Job::new("clicks").with_parallelism(2);
    let counts = job
        // 10 clicks per millisecond from 5 users, jittered by up to 200 ms.
        .generator(
            Generator::new(|i, _| Click { user: (i % 5) as u32, ts_ms: i / 10 + (i * 7919) % 200 }).count(50_000),
        )
        .with_watermarks(|c: &Click| c.ts_ms, 200)
        .key_by(|c: &Click| c.user)
        .window(Window::tumbling(1000), |c: &Click| c.ts_ms)
        .count()
        .collect();
    let report = job.execute(RunConfig::default())?;
    let mut rows = counts.lock().expect("collector").clone();
    rows.sort_by_key(|&(user, w, _)| (w.start, user));
    for (user, w, n) in rows {
        println!("[{:>5} ms, {:>5} ms) user {user}: {n} clicks", w.start, w.end);
    }
    println!("late events dropped: {}", report.late_records);
    Ok(())
}
