//! Checkpoint overhead, in one run so the ratios are comparable:
//!
//! 1. the keyed pipeline (generator → map → filter → key_by → keyed sum, 10,000 keys, p=2)
//!    without checkpoints and with exactly-once aligned checkpoints every second;
//! 2. the synchronous pause per task per checkpoint with 1 million keys of state;
//! 3. a slow sink backpressuring the job: checkpoint duration and in-flight bytes, aligned
//!    against unaligned, as the ring capacity grows 16×;
//! 4. the state backend on 1 GiB of keyed state: the synchronous fork, the background write
//!    against a plain file write of the same size, and an incremental checkpoint after 1% of
//!    the pages changed.
//!
//! `cargo bench --bench checkpoints -- [--duration-s S] [--state-gib G] [--only-state]`

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

// (Its date helper is for the harnesses that write dated results; this one does not.)
mod common;

use std::time::{Duration, Instant};

use weir::checkpoint::{
    write_task_snapshot, CheckpointConfig, CheckpointMode, CheckpointStats, CheckpointStorage, PageIndex,
};
use weir::metrics::group_digits;
use weir::snapshot::{Barrier, CheckpointNotice, TaskSnapshot};
use weir::source::Generator;
use weir::state::{KeyedValueState, Snapshot};
use weir::{Job, JobReport, RunConfig};
use weir_jobs::wordcount::key_of;

fn keyed(checkpoint: Option<CheckpointConfig>, keys: u64, d: Duration) -> JobReport {
    let mut job = Job::new("keyed").with_parallelism(2);
    if let Some(c) = checkpoint {
        job = job.with_checkpointing(c);
    }
    job.generator(Generator::new(|i, _| i))
        .map(move |x| (key_of(x, keys), x))
        .filter(|x| x.1 % 8 != 7)
        .key_by(|x: &(u64, u64)| x.0)
        .reduce(|a, b| (a.0, a.1.wrapping_add(b.1)))
        .discard();
    common::run_for(job, RunConfig::default().pin_workers(true).workers(2), d)
}

fn percentile(mut v: Vec<f64>, q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// A sink that spends about `cost` per record keeps the rings full.
fn backpressured(unaligned: bool, ring: usize, d: Duration, dir: &std::path::Path) -> Vec<CheckpointStats> {
    let mode = if unaligned { CheckpointMode::Unaligned } else { CheckpointMode::Aligned };
    let config = CheckpointConfig::new(dir).interval(Duration::from_millis(200)).mode(mode);
    let job = Job::new("backpressure").with_parallelism(2).with_checkpointing(config);
    job.generator(Generator::new(|i, _| i))
        .rebalance()
        .map(|x| {
            let t = std::time::Instant::now();
            while t.elapsed() < Duration::from_nanos(2_000) {
                std::hint::spin_loop();
            }
            x
        })
        .discard();
    common::run_for(job, RunConfig::default().pin_workers(true).workers(2).ring_capacity(ring), d).checkpoints
}

/// Section 1: the keyed pipeline without checkpoints, configured but none taken, and every second.
fn overhead(tmp: &std::path::Path, d: Duration, secs: f64) {
    println!("## 1. keyed pipeline, 10k keys, p=2, {secs} s each, best of two alternating runs\n");
    let mut best = [0f64; 3];
    let mut completed = 0;
    for round in 0..2 {
        for (i, interval) in
            [None, Some(Duration::from_secs(3600)), Some(Duration::from_secs(1))].into_iter().enumerate()
        {
            let config = interval.map(|iv| CheckpointConfig::new(tmp.join(format!("keyed-{round}-{i}"))).interval(iv));
            let r = keyed(config, 10_000, d);
            best[i] = best[i].max(r.throughput_rps());
            if i == 2 {
                completed = completed.max(r.checkpoints.len());
            }
        }
    }
    println!("| checkpoints | throughput | ratio |\n|---|---|---|");
    println!("| none | {} rec/s | 1.000 |", group_digits(best[0] as u64));
    println!(
        "| configured, none taken (interval 1 h) | {} rec/s | {:.3} |",
        group_digits(best[1] as u64),
        best[1] / best[0]
    );
    println!(
        "| exactly-once aligned, every 1 s ({completed} completed) | {} rec/s | {:.3} |",
        group_digits(best[2] as u64),
        best[2] / best[0]
    );
}

/// Section 2: the synchronous pause per task with a million keys.
fn pause(tmp: &std::path::Path, d: Duration) {
    println!("\n## 2. synchronous pause per task, 1M keys, checkpoints every 1 s\n");
    let dir = tmp.join("million");
    let big = keyed(
        Some(CheckpointConfig::new(&dir).interval(Duration::from_secs(1))),
        1_000_000,
        d.max(Duration::from_secs(4)),
    );
    let sync: Vec<f64> = big.checkpoints.iter().map(|c| c.sync_ms).collect();
    println!(
        "{} checkpoints; longest synchronous part per checkpoint: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; state {} bytes",
        sync.len(),
        percentile(sync.clone(), 0.5),
        percentile(sync.clone(), 0.99),
        sync.iter().cloned().fold(0.0, f64::max),
        group_digits(big.checkpoints.last().map_or(0, |c| c.state_bytes))
    );
}

/// Section 3: aligned against unaligned under backpressure, as the rings grow.
fn backpressure(tmp: &std::path::Path, d: Duration, secs: f64) {
    println!("\n## 3. backpressure (sink ~2 µs/record), checkpoints every 200 ms, {secs} s each\n");
    println!("| ring capacity | mode | checkpoints | median duration | max duration | median in-flight bytes |");
    println!("|---|---|---|---|---|---|");
    for ring in [256, 1024, 4096] {
        for unaligned in [false, true] {
            let dir = tmp.join(format!("bp-{ring}-{unaligned}"));
            let stats = backpressured(unaligned, ring, d, &dir);
            let durations: Vec<f64> = stats.iter().map(|c| c.duration_ms).collect();
            let inflight: Vec<f64> = stats.iter().map(|c| c.inflight_bytes as f64).collect();
            println!(
                "| {ring} | {} | {} | {:.1} ms | {:.1} ms | {} |",
                if unaligned { "unaligned" } else { "aligned" },
                stats.len(),
                percentile(durations.clone(), 0.5),
                durations.iter().cloned().fold(0.0, f64::max),
                group_digits(percentile(inflight, 0.5) as u64)
            );
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let secs: f64 = common::flag("--duration-s", 5.0);
    let d = Duration::from_secs_f64(secs);
    let gib: f64 = common::flag("--state-gib", 1.0);
    // Under target/, not /tmp: the write figures are about the disk the checkpoints go to.
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temporary directory");
    if args.iter().any(|a| a == "--only-state") {
        state_backend(tmp.path(), gib);
        return;
    }

    overhead(tmp.path(), d, secs);
    pause(tmp.path(), d);
    backpressure(tmp.path(), d, secs);
    state_backend(tmp.path(), gib);
}

/// Value of the keyed state in section 4: with its key, a 64-byte slot.
type Wide = [u64; 6];

fn snapshot_of(id: u64, state: &mut KeyedValueState<u64, Wide>) -> (TaskSnapshot, Duration) {
    let mut snap = TaskSnapshot::new(Barrier { id, trigger_ns: 0, unaligned: false, savepoint: false });
    let t = Instant::now();
    let fork = state.fork();
    let took = t.elapsed();
    snap.add("state".into(), 0, fork);
    (snap, took)
}

fn state_backend(dir: &std::path::Path, gib: f64) {
    println!("\n## 4. state backend, {gib} GiB of keyed state (u64 keys, 48-byte values)\n");
    // The map doubles past 7/8 full: this many keys fill `gib` GiB of 64-byte slots.
    let slots = ((gib * (1u64 << 30) as f64) as u64 / 64).next_power_of_two();
    let keys = slots / 2 + slots / 4;
    let mut state: KeyedValueState<u64, Wide> = KeyedValueState::new();
    for k in 0..keys {
        state.put(k, [k; 6]);
    }
    println!(
        "{} keys in {} bytes of pages ({} MiB)",
        group_digits(keys),
        group_digits(state.memory_bytes() as u64),
        state.memory_bytes() >> 20
    );
    let mut forks: Vec<f64> = (0..20).map(|_| snapshot_of(0, &mut state).1.as_secs_f64() * 1e3).collect();
    forks.sort_by(|a, b| a.total_cmp(b));
    println!("synchronous fork: median {:.3} ms, max {:.3} ms (20 forks)", forks[10], forks[19]);

    let storage = CheckpointStorage::new(dir.join("state-backend"));
    let index = PageIndex::default();
    storage.prepare(1).expect("checkpoint folder");
    let (snap, _) = snapshot_of(1, &mut state);
    let t = Instant::now();
    let full = write_task_snapshot(&storage, Some(&index), 0, &snap).expect("checkpoint 1 written");
    let snapshot_s = t.elapsed().as_secs_f64();
    drop(snap);
    index.on_notice(CheckpointNotice::Complete(1));
    // The same number of bytes written plainly: one buffer, write_all, fsync.
    let plain_path = dir.join("plain.bin");
    let buf = vec![0x5au8; full.written_bytes as usize];
    let t = Instant::now();
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&plain_path).expect("plain file");
        f.write_all(&buf).expect("plain write");
        f.sync_all().expect("plain fsync");
    }
    let plain_s = t.elapsed().as_secs_f64();
    drop(buf);
    let _ = std::fs::remove_file(&plain_path);
    let mb = full.written_bytes as f64 / 1e6;
    println!(
        "background write of the snapshot: {:.0} MB/s; plain file write of the same {:.0} MB: {:.0} MB/s; ratio {:.2}",
        mb / snapshot_s,
        mb,
        mb / plain_s,
        plain_s / snapshot_s
    );

    // Change one key in each of 1% of the pages (keys picked at random: a few share a page).
    let pages = slots / weir::state::PAGE_SLOTS as u64;
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for _ in 0..pages / 100 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        state.get_or_insert_with(x % keys, || [0; 6])[0] += 1;
    }
    storage.prepare(2).expect("checkpoint folder");
    let (snap, _) = snapshot_of(2, &mut state);
    let t = Instant::now();
    let inc = write_task_snapshot(&storage, Some(&index), 0, &snap).expect("checkpoint 2 written");
    let inc_s = t.elapsed().as_secs_f64();
    println!(
        "incremental checkpoint after changing 1% of {} pages: wrote {} of {} bytes ({:.2}%) in {:.0} ms",
        group_digits(pages),
        group_digits(inc.written_bytes),
        group_digits(inc.state_bytes),
        100.0 * inc.written_bytes as f64 / inc.state_bytes as f64,
        inc_s * 1e3
    );
}
