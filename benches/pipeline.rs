//! A fully chained stateless pipeline (generator → map → filter → discard) on one worker, and
//! the same with a key_by and a keyed sum on two workers.
//!
//! `cargo bench --bench pipeline`
#![allow(clippy::disallowed_methods)] // the engine's rule (clippy.toml); a benchmark may read the wall clock and start threads

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use weir::source::Generator;
use weir::{Job, RunConfig};

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn chained(n: u64) -> u64 {
    let job = Job::new("chained");
    job.generator(Generator::new(|i, _| i).count(n)).map(|x| x.wrapping_mul(3)).filter(|x| x % 4 != 1).discard();
    let report = job.execute(RunConfig::default().pin_workers(true).workers(1)).unwrap();
    assert_eq!(report.source_records, n, "benches assert before they measure");
    report.sink_records
}

fn keyed(n: u64) -> u64 {
    let job = Job::new("keyed").with_parallelism(2);
    job.generator(Generator::new(|i, _| i).count(n))
        .map(|x| (x % 10_000, x))
        .filter(|x| x.1 % 4 != 1)
        .key_by(|x: &(u64, u64)| x.0)
        .reduce(|a, b| (a.0, a.1.wrapping_add(b.1)))
        .discard();
    job.execute(RunConfig::default().pin_workers(true).workers(2)).unwrap().sink_records
}

fn pipelines(c: &mut Criterion) {
    let mut g = c.benchmark_group("pipeline");
    g.sample_size(10);
    const N: u64 = 20_000_000;
    g.throughput(Throughput::Elements(N));
    g.bench_function("chained_map_filter_1_worker", |b| b.iter(|| chained(N)));
    g.bench_function("keyed_sum_10k_keys_2_workers", |b| b.iter(|| keyed(N)));
    g.finish();
}

criterion_group!(benches, pipelines);
criterion_main!(benches);
