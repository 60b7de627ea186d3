//! Changelog checkpoints in a running job: checkpoints after the first two write only the
//! changes; a full disk while one is written declines it, the job goes on, and the next
//! checkpoint writes a new base (the chain has a hole); a failover then restores from the
//! files (base and segments) the exact state. Checkpoints are taken on request and the
//! failure is at a record sent after them: nothing waits on time.

use std::time::Duration;

use weir::checkpoint::{CheckpointConfig, RestartStrategy, RestoreReport};
use weir::faults::{Fault, FaultInjector, StorageFault};
use weir::{Job, RunConfig};

const KEYS: u64 = 5_000;
/// Records between two requested checkpoints: each touches a fifth of the keys.
const PHASE: u64 = 1_000;
const WAIT: Duration = Duration::from_secs(120);

#[test]
fn a_full_disk_declines_a_changelog_checkpoint_and_the_next_writes_a_base() {
    let dir = tempfile::tempdir().unwrap();
    // Checkpoint 4's write meets a full disk; the task fails at a record sent after checkpoint 5.
    let faults = FaultInjector::new(vec![
        Fault::StorageWrite { checkpoint: 4, error: StorageFault::DiskFull },
        Fault::AtRecord { operator: "count".into(), nth: KEYS + 5 * PHASE + 100 },
    ]);
    let cfg = CheckpointConfig::new(dir.path())
        .interval(Duration::from_secs(3600))
        .changelog(true)
        .local_recovery(false)
        .restart(RestartStrategy::FixedDelay { attempts: 3, delay: Duration::from_millis(1) })
        .faults(std::sync::Arc::clone(&faults));
    let job = Job::new("changelog").with_checkpointing(cfg);
    let (mut tx, records) = job.push_source::<u64>(64);
    let out = records
        .key_by(|x: &u64| x % KEYS)
        .aggregate(|| 0u64, |c: &mut u64, _| *c += 1, |k: &u64, c: &u64| (*k, *c))
        .named("count")
        .collect_exactly_once();
    let mut handle = job.start(RunConfig::default().workers(2)).unwrap();
    let mut sent = 0;
    let mut send = |n: u64, tx: &mut weir::source::EventSender<u64>| {
        for _ in 0..n {
            tx.send_timeout(sent, WAIT).unwrap();
            sent += 1;
        }
    };
    // Every key once, then a phase before each checkpoint.
    send(KEYS, &mut tx);
    let mut ids = Vec::new();
    for _ in 0..5 {
        send(PHASE, &mut tx);
        ids.push(handle.trigger_checkpoint().map_err(|e| e.to_string()));
    }
    assert!(ids[3].as_ref().is_err_and(|e| e.contains("No space left")), "{ids:?}");
    let done: Vec<u64> = ids.iter().filter_map(|r| r.as_ref().ok().copied()).collect();
    send(PHASE, &mut tx);
    tx.close();
    handle.wait().unwrap_or_else(|e| panic!("{e}; notes: {:?}", handle.notes()));
    assert_eq!(faults.fired(), 2);

    // Checkpoints 1 and 2 are bases (changes are tracked from the fork after the first
    // asked), 3 a segment, 5 a base again after 4's hole.
    let stats = handle.checkpoint_stats();
    let written = |id: u64| stats.iter().find(|s| s.id == id).map(|s| (s.written_bytes, s.state_bytes)).unwrap();
    let (w3, s3) = written(3);
    assert!(w3 * 2 < s3, "checkpoint 3 wrote {w3} of {s3} bytes: the changes only");
    let (w5, s5) = written(5);
    assert!(w5 * 2 > s5, "checkpoint 5 wrote {w5} of {s5} bytes: a new base");
    assert!(handle.checkpoint_failures().iter().any(|f| f.reason.contains("No space left")));

    // The failover restored checkpoint 5 from its files, exactly.
    assert_eq!(done, vec![1, 2, 3, 5]);
    assert_eq!(handle.last_restore(), Some(RestoreReport { checkpoint: 5, from: "files" }), "{:?}", handle.notes());
    let mut rows = out.records();
    rows.sort_unstable();
    let total = KEYS + 6 * PHASE;
    let mut expected: Vec<(u64, u64)> =
        (0..KEYS).flat_map(|k| (1..=(total - k).div_ceil(KEYS)).map(move |c| (k, c))).collect();
    expected.sort_unstable();
    assert!(
        rows == expected,
        "output differs from the failure-free run ({} rows, {} expected)",
        rows.len(),
        expected.len()
    );
}
