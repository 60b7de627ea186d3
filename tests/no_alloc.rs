//! The per-record path does not allocate: a counting allocator shows that ten times the
//! records cost no more allocations once the job's buffers and state have reached their size.
//! (One test in this file: the allocator counts the whole process.)
#![allow(clippy::disallowed_methods)] // the engine's rule (clippy.toml); tests may read the wall clock and start threads

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use weir::source::Generator;
use weir::{Job, RunConfig, Window};

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: delegates every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller upholds `alloc`'s contract, which we pass on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as for `realloc` itself.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn run(records: u64) -> u64 {
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let job = Job::new("alloc").with_parallelism(2);
    let keyed = job
        .generator(Generator::new(|i, _| (i % 1000, i)).count(records))
        .map(|(k, i)| (k, i * 2))
        .filter(|&(_, i)| i % 3 != 0)
        .with_watermarks(|e: &(u64, u64)| e.1, 0);
    keyed.key_by(|e: &(u64, u64)| e.0).reduce(|a, b| (a.0, a.1 + b.1)).discard();
    job.execute(RunConfig::default().workers(2).pin_workers(false)).unwrap();
    let job = Job::new("alloc-window").with_parallelism(2);
    job.generator(Generator::new(|i, _| (i % 100, i / 1000)).count(records))
        .with_watermarks(|e: &(u64, u64)| e.1, 0)
        .key_by(|e: &(u64, u64)| e.0)
        .window(Window::tumbling(1_000_000), |e: &(u64, u64)| e.1)
        .count()
        .discard();
    job.execute(RunConfig::default().workers(2).pin_workers(false)).unwrap();
    ALLOCATIONS.load(Ordering::Relaxed) - before
}

#[test]
fn ten_times_the_records_cost_no_more_allocations() {
    run(200_000); // warm up process-wide lazies (thread names, core lists)
    let small = run(200_000);
    let large = run(2_000_000);
    // Scheduling varies staging sizes a little between runs; the per-record path would add
    // millions.
    eprintln!("allocations: {small} for 200k records, {large} for 2M");
    assert!(large < small + small / 2 + 200, "{small} allocations for 200k records, {large} for 2M");
}
