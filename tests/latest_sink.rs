//! The idempotent keyed sink: after failures, and after a restore at another parallelism,
//! its table files hold exactly what a failure-free run writes.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use weir::checkpoint::{CheckpointConfig, RestartStrategy};
use weir::snapshot::{Fault, FaultInjector};
use weir::source::Generator;
use weir::{Job, RunConfig};

const N: u64 = 40_000;

fn job(out: &Path, p: usize, checkpointing: Option<CheckpointConfig>) -> Job {
    let mut job = Job::new("latest").with_parallelism(p);
    if let Some(c) = checkpointing {
        job = job.with_checkpointing(c);
    }
    // A running maximum per key: whatever order a key's records arrive in, its last result
    // (what the table keeps) is its largest index.
    job.generator(Generator::new(|i, _| (i % 50, i)).count(N).rate(200_000.0))
        .key_by(|e: &(u64, u64)| e.0)
        .reduce(|a, b| (a.0, a.1.max(b.1)))
        .named("max")
        .key_by(|e: &(u64, u64)| e.0)
        .write_latest(out, |&(k, i): &(u64, u64), o: &mut Vec<u8>| {
            o.extend_from_slice(format!("{k}\t{i}\n").as_bytes())
        });
    job
}

/// Every table line, by key; and the table files present.
fn tables(out: &Path) -> (BTreeMap<u64, u64>, Vec<String>) {
    let mut rows = BTreeMap::new();
    let mut names = Vec::new();
    for f in std::fs::read_dir(out).unwrap() {
        let f = f.unwrap();
        let name = f.file_name().to_string_lossy().to_string();
        names.push(name.clone());
        if name.starts_with('.') {
            continue;
        }
        let text = std::fs::read_to_string(f.path()).unwrap();
        let mut lines: Vec<&str> = text.lines().collect();
        let sorted = {
            let mut s = lines.clone();
            s.sort();
            s
        };
        assert_eq!(lines, sorted, "{name} is sorted");
        for l in lines.drain(..) {
            let (k, v) = l.split_once('\t').unwrap();
            assert!(rows.insert(k.parse().unwrap(), v.parse().unwrap()).is_none(), "key {k} in two tables");
        }
    }
    names.sort();
    (rows, names)
}

fn expected() -> BTreeMap<u64, u64> {
    (N - 50..N).map(|i| (i % 50, i)).collect()
}

#[test]
fn failures_leave_the_same_table_as_a_failure_free_run() {
    let clean = tempfile::tempdir().unwrap();
    job(clean.path(), 3, None).execute(RunConfig::default().workers(2)).unwrap();
    let (rows, names) = tables(clean.path());
    assert_eq!(rows, expected());
    assert_eq!(names, vec!["latest-0", "latest-1", "latest-2"]);

    let (out, chk) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let faults = FaultInjector::new(vec![
        Fault::AtRecord { operator: "max".into(), nth: N / 3 },
        Fault::AtRecord { operator: "max".into(), nth: 2 * N / 3 },
    ]);
    let config = CheckpointConfig::new(chk.path())
        .interval(Duration::from_millis(15))
        .restart(RestartStrategy::FixedDelay { attempts: 5, delay: Duration::from_millis(1) })
        .faults(std::sync::Arc::clone(&faults));
    let report = job(out.path(), 3, Some(config)).execute(RunConfig::default().workers(2)).unwrap();
    assert_eq!(report.restarts, 2);
    for s in 0..3 {
        let name = format!("latest-{s}");
        assert_eq!(
            std::fs::read(out.path().join(&name)).unwrap(),
            std::fs::read(clean.path().join(&name)).unwrap(),
            "{name} differs from the failure-free run"
        );
    }
}

#[test]
fn a_savepoint_restores_the_table_at_another_parallelism() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let config = |name: &str| CheckpointConfig::new(dir.path().join(name)).interval(Duration::from_secs(3600));
    let handle = job(&out, 3, Some(config("a"))).start(RunConfig::default().workers(2)).unwrap();
    std::thread::sleep(Duration::from_millis(60));
    let savepoint =
        handle.stop_with_savepoint(dir.path().join("sp")).unwrap().savepoint().expect("a savepoint, not the end");
    assert!(out.join("latest-2").exists(), "the savepoint's barrier wrote every table");
    job(&out, 2, Some(config("b"))).restore_from(&savepoint, false).execute(RunConfig::default().workers(2)).unwrap();
    let (rows, names) = tables(&out);
    assert_eq!(rows, expected());
    assert_eq!(names, vec!["latest-0", "latest-1"], "the third subtask's table is gone");
}
