//! A slow operator backpressures the job, filling the rings. Aligned barriers queue behind the
//! backlog: when the slow operator snapshots, it has processed everything its sources emitted
//! before the barrier. Unaligned barriers overtake it: the slow operator snapshots with records
//! still in flight, and those records are stored with the checkpoint instead. Checked by counts
//! read back from the checkpoints, never by timing.

use std::time::Duration;

use weir::checkpoint::{CheckpointConfig, CheckpointMode, CheckpointStorage};
use weir::persist::from_bytes;
use weir::source::Generator;
use weir::state::PagedImage;
use weir::{Job, RunConfig};

const RECORDS: u64 = 24_000;
const PARALLELISM: usize = 2;

/// Runs the job; returns, per completed checkpoint, (records the sources had emitted,
/// records the slow operator had processed, in-flight bytes stored).
fn run(unaligned: bool, alignment_timeout: Option<Duration>) -> Vec<(u64, u64, u64)> {
    let dir = tempfile::tempdir().unwrap();
    let mode = match (unaligned, alignment_timeout) {
        (true, Some(timeout)) => CheckpointMode::AlignedTimeout { timeout },
        (true, None) => CheckpointMode::Unaligned,
        (false, _) => CheckpointMode::Aligned,
    };
    let config = CheckpointConfig::new(dir.path()).interval(Duration::from_millis(15)).mode(mode).retained(1000);
    let job = Job::new("slow").with_parallelism(PARALLELISM).with_checkpointing(config);
    let processed = job
        .generator(Generator::new(|i, _| i).count(RECORDS))
        .named("source")
        .key_by(|x: &u64| x % 2)
        .aggregate(
            || 0u64,
            |n: &mut u64, _x| {
                *n += 1;
                std::thread::sleep(Duration::from_micros(20));
            },
            |k: &u64, n: &u64| (*k, *n),
        )
        .named("slow")
        .collect_exactly_once();
    let report = job.execute(RunConfig::default().workers(2).ring_capacity(2048).batch_size(64)).unwrap();
    assert!(!processed.records().is_empty());
    let storage = CheckpointStorage::new(dir.path());
    let mut out = Vec::new();
    for stats in &report.checkpoints {
        let Ok(c) = storage.load(stats.id) else {
            continue;
        };
        let emitted: u64 = (0..PARALLELISM)
            .map(|s| {
                // The generator's offset: (next index, layers emitted before a rescale).
                let (next, _): (u64, Vec<(u64, Vec<u64>)>) =
                    from_bytes(c.state.get("source", s).expect("source offset")).unwrap();
                // Subtask s emits s, s + p, …: the count below `next`.
                (next - s as u64).div_ceil(PARALLELISM as u64)
            })
            .sum();
        let counted: u64 = (0..PARALLELISM)
            .filter_map(|s| c.state.get("slow", s))
            .map(|b| from_bytes::<PagedImage<u64, u64>>(b).unwrap().into_entries().iter().map(|(_, n)| n).sum::<u64>())
            .sum();
        out.push((emitted, counted, stats.inflight_bytes));
    }
    assert!(!out.is_empty(), "checkpoints must complete (unaligned: {unaligned})");
    out
}

#[test]
fn aligned_barriers_wait_for_the_backlog() {
    for (emitted, processed, inflight) in run(false, None) {
        assert_eq!(inflight, 0, "aligned checkpoints store no in-flight data");
        assert_eq!(processed, emitted, "everything before an aligned barrier is processed before the snapshot");
    }
}

#[test]
fn unaligned_barriers_overtake_the_backlog() {
    let checkpoints = run(true, None);
    let overtaken = checkpoints.iter().filter(|(e, p, i)| p < e && *i > 0).count();
    for &(emitted, processed, _) in &checkpoints {
        assert!(processed <= emitted, "the operator cannot have processed what was not emitted");
    }
    assert!(
        overtaken > 0,
        "with full rings, unaligned checkpoints snapshot the slow operator with records still in flight: {checkpoints:?}"
    );
}

#[test]
fn aligned_checkpoints_with_a_timeout_switch_to_unaligned_under_backpressure() {
    // Barriers start aligned; a slow operator keeps the second channel's barrier behind the
    // backlog for longer than the timeout, so the checkpoint turns unaligned there.
    let checkpoints = run(true, Some(Duration::from_millis(2)));
    for &(emitted, processed, _) in &checkpoints {
        assert!(processed <= emitted);
    }
    assert!(
        checkpoints.iter().any(|(e, p, i)| p < e && *i > 0),
        "some checkpoint must have switched to unaligned and stored in-flight data: {checkpoints:?}"
    );
}
