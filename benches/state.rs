//! A keyed update in the copy-on-write paged state against a `std::collections::HashMap`
//! update of the same key and value types, in the same run; and the synchronous fork.
//!
//! `cargo bench --bench state`
#![allow(clippy::disallowed_methods)] // the engine's rule (clippy.toml); a benchmark may read the wall clock and start threads

use std::collections::HashMap;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use weir::record::BuildKeyHasher;
use weir::state::PagedMap;

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const KEYS: u64 = 100_000;
const UPDATES: u64 = 1 << 20;

fn keys() -> Vec<u64> {
    (0..UPDATES).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % KEYS).collect()
}

fn updates(c: &mut Criterion) {
    let ks = keys();
    let mut g = c.benchmark_group("keyed_update");
    g.throughput(Throughput::Elements(UPDATES));
    let mut paged: PagedMap<u64, u64> = PagedMap::new();
    let mut std_map: HashMap<u64, u64> = HashMap::new();
    let mut fx_map: HashMap<u64, u64, BuildKeyHasher> = HashMap::default();
    for &k in &ks {
        paged.insert(k, 0);
        std_map.insert(k, 0);
        fx_map.insert(k, 0);
    }
    assert_eq!(paged.len(), std_map.len(), "benches assert before they measure");
    g.bench_function("paged_cow_map", |b| {
        b.iter(|| {
            for &k in &ks {
                *paged.get_or_insert_with(k, || 0) += 1;
            }
        })
    });
    g.bench_function("std_hashmap_siphash", |b| {
        b.iter(|| {
            for &k in &ks {
                *std_map.entry(k).or_insert(0) += 1;
            }
        })
    });
    g.bench_function("std_hashmap_keyhasher", |b| {
        b.iter(|| {
            for &k in &ks {
                *fx_map.entry(k).or_insert(0) += 1;
            }
        })
    });
    g.finish();

    let mut g = c.benchmark_group("fork");
    let mut big: PagedMap<u64, u64> = PagedMap::new();
    for k in 0..1_000_000u64 {
        big.insert(k, k);
    }
    g.bench_function("fork_1M_keys", |b| b.iter_batched(|| (), |_| big.fork(), BatchSize::SmallInput));
    g.finish();
}

/// Timers at a million keys: register one per key, fire them all, delete them all, and the
/// synchronous part of a snapshot of the timer state (what a checkpoint pauses the task for).
fn timers(c: &mut Criterion) {
    use weir::state::{Snapshot, TimeDomain, TimerService};
    const TIMER_KEYS: u64 = 1_000_000;
    let at = |k: u64| 1_000 + k.wrapping_mul(0x9E37_79B9) % 100_000;
    let full = || {
        let mut t: TimerService<u64> = TimerService::new();
        for k in 0..TIMER_KEYS {
            t.register(TimeDomain::EventTime, &k, at(k));
        }
        t
    };
    let mut g = c.benchmark_group("timers_1m_keys");
    g.sample_size(10);
    g.throughput(Throughput::Elements(TIMER_KEYS));
    g.bench_function("register", |b| {
        b.iter_batched(
            TimerService::<u64>::new,
            |mut t| {
                for k in 0..TIMER_KEYS {
                    t.register(TimeDomain::EventTime, &k, at(k));
                }
                t
            },
            BatchSize::LargeInput,
        )
    });
    g.bench_function("fire_all", |b| {
        b.iter_batched(
            full,
            |mut t| {
                let mut n = 0;
                while t.pop_due(TimeDomain::EventTime, u64::MAX).is_some() {
                    n += 1;
                }
                assert_eq!(n, TIMER_KEYS);
                t
            },
            BatchSize::LargeInput,
        )
    });
    g.bench_function("delete_all", |b| {
        b.iter_batched(
            full,
            |mut t| {
                for k in 0..TIMER_KEYS {
                    t.delete(TimeDomain::EventTime, &k, at(k));
                }
                assert!(t.is_empty());
                t
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
    let mut g = c.benchmark_group("timers_1m_keys_snapshot");
    g.sample_size(20);
    let mut t = full();
    assert_eq!(t.len() as u64, TIMER_KEYS, "benches assert before they measure");
    g.bench_function("synchronous_fork", |b| b.iter(|| t.fork()));
    g.finish();
}

criterion_group!(benches, updates, timers);
criterion_main!(benches);
