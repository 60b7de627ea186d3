//! A two-input window join: orders joined with payments of the same order id that fall into
//! the same 100 ms event-time window.
//!
//! `cargo run --release --example join`
#![allow(clippy::disallowed_methods)] // the engine's rule (clippy.toml); an example is a program, which may read the wall clock and start threads

use weir::source::Generator;
use weir::{Job, RunConfig, Window};

#[derive(Clone, Copy, weir::Persist)]
struct Order {
    id: u64,
    ts_ms: u64,
}

#[derive(Clone, Copy, weir::Persist)]
struct Payment {
    order: u64,
    amount_cents: u64,
    ts_ms: u64,
}

fn main() -> weir::Result<()> {
    let job = Job::new("orders-payments").with_parallelism(2);
    let orders = job
        .generator(Generator::new(|i, _| Order { id: i, ts_ms: i }).count(1000))
        .with_watermarks(|o: &Order| o.ts_ms, 0);
    // Every third order is paid 5 ms after it was placed.
    let payments = job
        .generator(Generator::new(|i, _| Payment { order: i * 3, amount_cents: 100 + i, ts_ms: i * 3 + 5 }).count(334))
        .with_watermarks(|p: &Payment| p.ts_ms, 0);
    let paid = orders
        .window_join(
            payments,
            |o: &Order| o.id,
            |p: &Payment| p.order,
            |o: &Order| o.ts_ms,
            |p: &Payment| p.ts_ms,
            Window::tumbling(100),
            |&id, o: &Order, p: &Payment| (id, o.ts_ms, p.amount_cents),
        )
        .collect();
    job.execute(RunConfig::default())?;
    let mut paid = paid.lock().expect("collector").clone();
    paid.sort_unstable();
    println!("{} orders paid within their window; first five:", paid.len());
    for (id, ts, cents) in paid.iter().take(5) {
        println!("  order {id} at {ts} ms: {}.{:02}", cents / 100, cents % 100);
    }
    Ok(())
}
