//! Keyed state within a memory budget ([`RunConfig::state_memory`]): a job whose state is
//! several times its budget sends pages to disk and back, and after failures from
//! incremental and changelog checkpoints its output is the failure-free run's with all state
//! in memory. A budget or state directory that cannot work is refused, naming the value.

use std::time::Duration;

use weir::checkpoint::{CheckpointConfig, RestartStrategy};
use weir::snapshot::{Fault, FaultInjector};
use weir::{Error, Job, RunConfig};

use crate::common::PausingSource;

const KEYS: u64 = 150_000;
const EVENTS: u64 = 300_000;

/// Every key once, then again in another order (so the second pass faults pages back).
fn key(i: u64) -> u64 {
    if i < KEYS {
        i
    } else {
        (i * 7_919) % KEYS
    }
}

/// The job's running sums per key, committed exactly once, sorted; and its report.
fn sums(checkpointing: Option<CheckpointConfig>, config: RunConfig) -> (Vec<(u64, u64)>, weir::JobReport) {
    let mut job = Job::new("bounded-sums").with_parallelism(2);
    let mut pauses: &'static [(u64, u32)] = &[];
    if let Some(c) = checkpointing {
        job = job.with_checkpointing(c);
        // Checkpoints of the whole state before each failure, so recovery restores pages.
        pauses = &[(KEYS, 1), (KEYS + 50_000, 1), (KEYS + 110_000, 1)];
    }
    let out = job
        .source(move |ctx| Ok(PausingSource::new(|i| (key(i), i), EVENTS, pauses, ctx)))
        .key_by(|e: &(u64, u64)| e.0)
        .aggregate(|| 0u64, |s: &mut u64, e| *s += e.1, |k: &u64, s: &u64| (*k, *s))
        .named("sum")
        .collect_exactly_once();
    let report = job.execute(config.workers(2)).unwrap();
    let mut rows = out.records();
    rows.sort_unstable();
    (rows, report)
}

/// 2 MiB for state of about 7 MiB (150,000 entries in 262,144 slots of 24 bytes).
const BUDGET: u64 = 2 << 20;

fn failing_config(dir: &std::path::Path, faults: &std::sync::Arc<FaultInjector>) -> CheckpointConfig {
    CheckpointConfig::new(dir)
        .interval(Duration::from_millis(20))
        .retained(2)
        .tolerable_failed_checkpoints(100)
        .restart(RestartStrategy::FixedDelay { attempts: 5, delay: Duration::from_millis(1) })
        .faults(std::sync::Arc::clone(faults))
}

#[test]
fn state_four_times_its_budget_recovers_exactly_from_incremental_and_changelog_checkpoints() {
    let (golden, _) = sums(None, RunConfig::default());
    assert_eq!(golden.len() as u64, EVENTS);
    for changelog in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let faults = FaultInjector::new(vec![
            Fault::AtRecord { operator: "sum".into(), nth: KEYS + 30_000 },
            Fault::AtRecord { operator: "sum".into(), nth: KEYS + 90_000 },
        ]);
        let mut config = failing_config(dir.path(), &faults).incremental(!changelog);
        if changelog {
            config = config.changelog(true);
        }
        let (got, report) = sums(Some(config), RunConfig::default().state_memory(BUDGET));
        assert_eq!((faults.fired(), report.restarts), (2, 2), "changelog: {changelog}");
        assert!(got == golden, "changelog {changelog}: the output within a budget differs from the failure-free run's");
        let s = report.state_memory.expect("a budget was set");
        assert!(s.evictions > 1_000 && s.faults > 1_000 && s.spill_writes > 0, "changelog {changelog}: {s:?}");
        // A restore from the copy kept in memory (local recovery) shares the pages each task
        // had in memory at its own fork, taken at other moments: together up to twice the
        // budget, until the first writes send the excess out.
        assert!(s.resident_peak_bytes < 2 * BUDGET + (1 << 20), "changelog {changelog}: {s:?}");
    }
    // Without failures, the pages in memory never pass the budget by more than the pages the
    // clock sends out at once (16 a worker).
    let (got, report) = sums(None, RunConfig::default().state_memory(BUDGET));
    assert!(got == golden);
    let s = report.state_memory.expect("a budget was set");
    assert!(s.resident_peak_bytes <= BUDGET + 2 * 16 * 6 * 1024, "{s:?}");
}

#[test]
fn a_budget_below_a_page_per_task_and_a_state_dir_that_cannot_take_files_are_refused() {
    let run = |config: RunConfig| {
        let job = Job::new("refused").with_parallelism(2);
        let _ = job
            .generator(weir::source::Generator::new(|i, _| i).count(10))
            .key_by(|k: &u64| *k)
            .reduce(|a, _| *a)
            .collect();
        job.execute(config.workers(2))
    };
    match run(RunConfig::default().state_memory(4096)) {
        Err(Error::InvalidConfig(m)) => {
            assert!(m.contains("4 KiB") && m.contains("least that works is"), "{m}");
        }
        other => panic!("a 4 KiB budget: {:?}", other.map(|_| ())),
    }
    let missing = RunConfig::default().state_memory(64 << 20).state_dir("/no/such/folder");
    match run(missing) {
        Err(Error::Io { context, path, .. }) => {
            assert!(context.contains("state directory") && path.unwrap().ends_with("folder"), "{context}");
        }
        other => panic!("a missing state directory: {:?}", other.map(|_| ())),
    }
    let file = tempfile::NamedTempFile::new().unwrap();
    match run(RunConfig::default().state_memory(64 << 20).state_dir(file.path())) {
        Err(Error::InvalidConfig(m)) => assert!(m.contains("is not a folder"), "{m}"),
        other => panic!("a file as the state directory: {:?}", other.map(|_| ())),
    }
    match run(RunConfig::default().state_memory(0)) {
        Err(Error::InvalidConfig(m)) => assert!(m.contains("0 bytes"), "{m}"),
        other => panic!("a budget of 0: {:?}", other.map(|_| ())),
    }
}
