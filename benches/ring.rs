//! One ring hop between two pinned threads: a bare rtrb push/pop loop (the baseline), weir's
//! channel with single-record batches, and weir's channel with chunked batches. All three run
//! in the same process, so their ratio is meaningful on a noisy machine.
//!
//! `cargo bench --bench ring`
#![allow(clippy::disallowed_methods)] // the engine's rule (clippy.toml); a benchmark may read the wall clock and start threads

use criterion::{criterion_group, criterion_main, Criterion, Throughput};

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[path = "../perf/ring_hop.rs"]
mod ring_hop;
use ring_hop::{bare_rtrb, weir_channel};

fn ring_hop(c: &mut Criterion) {
    let mut g = c.benchmark_group("ring_hop");
    const N: u64 = 1 << 20;
    g.throughput(Throughput::Elements(N));
    g.sample_size(20);
    g.bench_function("bare_rtrb_push_pop", |b| b.iter_custom(|iters| (0..iters).map(|_| bare_rtrb(N)).sum()));
    g.bench_function("weir_single", |b| b.iter_custom(|iters| (0..iters).map(|_| weir_channel(N, 1)).sum()));
    g.bench_function("weir_chunked_256", |b| b.iter_custom(|iters| (0..iters).map(|_| weir_channel(N, 256)).sum()));
    g.finish();
}

criterion_group!(benches, ring_hop);
criterion_main!(benches);
