//! The checkpoint machinery in isolation: barrier alignment over several channels, a barrier
//! reaching a consumer behind a full ring in-band against through the priority slot, the
//! copy-on-write write after a fork, and the snapshot writer (full and incremental).
//!
//! `cargo bench --bench checkpointing`
#![allow(clippy::disallowed_methods)] // the engine's rule (clippy.toml); a benchmark may read the wall clock and start threads

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use weir::barrier::BarrierAligner;
use weir::channel::{pair, GatePoll};
use weir::checkpoint::{write_task_snapshot, CheckpointStorage, PageIndex};
use weir::snapshot::{Barrier, CheckpointNotice, TaskSnapshot};
use weir::state::{KeyedValueState, PagedMap, Snapshot};

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn barrier(id: u64, unaligned: bool) -> Barrier {
    Barrier { id, trigger_ns: 0, unaligned, savepoint: false }
}

fn alignment(c: &mut Criterion) {
    let mut g = c.benchmark_group("barrier_alignment");
    for channels in [2usize, 8, 32] {
        g.bench_function(format!("{channels}_channels"), |b| {
            let mut aligner = BarrierAligner::new(channels);
            let mut id = 0;
            b.iter(|| {
                id += 1;
                for ch in 0..channels {
                    aligner.on_barrier(ch, barrier(id, false), 0, 0);
                }
                let done = aligner.complete(|_| false);
                assert!(done.is_some(), "every channel delivered the barrier");
            })
        });
    }
    g.finish();
}

/// Time until the consumer sees a barrier sent behind `backlog` records.
fn barrier_delivery(backlog: usize, unaligned: bool) -> Duration {
    let (mut tx, mut rx) = pair::<u64>(backlog + 64);
    rx.check_priority_slot(unaligned);
    let mut records: Vec<u64> = (0..backlog as u64).collect();
    assert!(tx.send(&mut records));
    let start = Instant::now();
    tx.send_barrier(barrier(1, unaligned));
    loop {
        match rx.poll(|_| {}, 256) {
            GatePoll::Barrier { .. } | GatePoll::PriorityBarrier { .. } => return start.elapsed(),
            GatePoll::Finished => unreachable!("the channel stays open"),
            _ => {}
        }
    }
}

fn delivery(c: &mut Criterion) {
    let mut g = c.benchmark_group("barrier_behind_backlog");
    for backlog in [256usize, 4096] {
        for (name, unaligned) in [("in_band", false), ("priority_slot", true)] {
            g.bench_function(format!("{name}_{backlog}"), |b| {
                b.iter_custom(|iters| (0..iters).map(|_| barrier_delivery(backlog, unaligned)).sum())
            });
        }
    }
    g.finish();
}

fn copy_on_write(c: &mut Criterion) {
    let mut g = c.benchmark_group("copy_on_write");
    const KEYS: u64 = 1_000_000;
    let mut map: PagedMap<u64, u64> = PagedMap::new();
    for k in 0..KEYS {
        map.insert(k, k);
    }
    let pages = map.pages() as u64;
    g.throughput(Throughput::Elements(pages));
    // One write per page right after a fork: every write copies its page first.
    let one_key_per_page: Vec<u64> = {
        let mut seen = std::collections::HashSet::new();
        let before = map.copied_pages();
        let _fork = map.fork();
        let keys: Vec<u64> = (0..KEYS)
            .filter(|&k| {
                let copied = map.copied_pages();
                *map.get_or_insert_with(k, || 0) += 0;
                map.copied_pages() > copied && seen.insert(k)
            })
            .collect();
        assert_eq!(map.copied_pages() - before, pages, "every page was copied once");
        keys
    };
    g.bench_function("first_write_per_page_after_fork", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let fork = map.fork();
                let start = Instant::now();
                for &k in &one_key_per_page {
                    *map.get_or_insert_with(k, || 0) += 1;
                }
                total += start.elapsed();
                drop(fork);
            }
            total
        })
    });
    g.finish();
}

fn snapshot_writer(c: &mut Criterion) {
    let mut g = c.benchmark_group("snapshot_writer");
    g.sample_size(10);
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("scratch folder");
    let storage = CheckpointStorage::new(dir.path());
    let mut state: KeyedValueState<u64, u64> = KeyedValueState::new();
    for k in 0..1_000_000u64 {
        state.put(k, k);
    }
    let mut id = 0u64;
    let mut snapshot = |state: &mut KeyedValueState<u64, u64>| {
        id += 1;
        storage.prepare(id).expect("folder");
        let mut snap = TaskSnapshot::new(barrier(id, false));
        snap.add("state".into(), 0, state.fork());
        snap
    };
    let full_bytes = {
        let snap = snapshot(&mut state);
        write_task_snapshot(&storage, None, 0, &snap).expect("written").state_bytes
    };
    g.throughput(Throughput::Bytes(full_bytes));
    g.bench_function("full_1M_keys", |b| {
        b.iter_batched(
            || snapshot(&mut state),
            |snap| write_task_snapshot(&storage, None, 0, &snap).expect("written"),
            BatchSize::LargeInput,
        )
    });
    let index = PageIndex::default();
    g.bench_function("incremental_1M_keys_1pct_pages_changed", |b| {
        let mut round = 0u64;
        b.iter_batched(
            || {
                round += 1;
                for k in (0..1_000_000u64).step_by(100).take(60) {
                    *state.get_or_insert_with((k * 7919 + round) % 1_000_000, || 0) += 1;
                }
                snapshot(&mut state)
            },
            |snap| {
                let w = write_task_snapshot(&storage, Some(&index), 0, &snap).expect("written");
                index.on_notice(CheckpointNotice::Complete(snap.barrier.id));
                w
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

criterion_group!(benches, alignment, delivery, copy_on_write, snapshot_writer);
criterion_main!(benches);
