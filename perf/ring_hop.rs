//! One ring hop between two pinned threads, shared by `benches/ring.rs` and the perf harness:
//! a bare rtrb push/pop loop (the baseline) and weir's channel at a given batch size.

use std::time::{Duration, Instant};

use weir::channel::{pair, GatePoll};

const CAPACITY: usize = 4096;

/// Pins the calling thread to the `i`-th core the process may use. The list is read once:
/// `get_core_ids` reads the *calling thread's* mask, which is a single core once it is pinned.
fn pin(i: usize) {
    static CORES: std::sync::OnceLock<Vec<core_affinity::CoreId>> = std::sync::OnceLock::new();
    let cores = CORES.get_or_init(|| core_affinity::get_core_ids().unwrap_or_default());
    if !cores.is_empty() {
        core_affinity::set_for_current(cores[i % cores.len()]);
    }
}

/// Moves `n` u64s through a bare rtrb ring, one push and one pop at a time.
pub(crate) fn bare_rtrb(n: u64) -> Duration {
    let (mut p, mut c) = rtrb::RingBuffer::<u64>::new(CAPACITY);
    let start = Instant::now();
    let producer = std::thread::spawn(move || {
        pin(0);
        for i in 0..n {
            while p.push(i).is_err() {
                std::hint::spin_loop();
            }
        }
    });
    pin(1);
    let mut expected = 0;
    while expected < n {
        if let Ok(v) = c.pop() {
            assert_eq!(v, expected, "the baseline must deliver in order");
            expected += 1;
        } else {
            std::hint::spin_loop();
        }
    }
    producer.join().expect("producer thread");
    start.elapsed()
}

/// Moves `n` u64s through a weir channel in batches of `batch` records.
pub(crate) fn weir_channel(n: u64, batch: usize) -> Duration {
    let (mut tx, mut rx) = pair::<u64>(CAPACITY);
    let start = Instant::now();
    let producer = std::thread::spawn(move || {
        pin(0);
        let mut buf = Vec::with_capacity(batch);
        let mut i = 0;
        while i < n {
            while buf.len() < batch && i < n {
                buf.push(i);
                i += 1;
            }
            while !tx.send(&mut buf) {
                std::hint::spin_loop();
            }
        }
        tx.close();
    });
    pin(1);
    let mut expected = 0u64;
    loop {
        let polled = rx.poll(
            |records| {
                assert_eq!(records[0], expected, "weir must deliver in order");
                expected += records.len() as u64;
            },
            CAPACITY,
        );
        if polled == GatePoll::Finished {
            break;
        }
    }
    assert_eq!(expected, n);
    producer.join().expect("producer thread");
    start.elapsed()
}
