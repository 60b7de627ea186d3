//! `weir simulate`: weir's own jobs under the simulator, seed by seed.
//!
//! May touch: `args`.

use weir::Error;

use crate::args::*;

/// Runs the seeds; returns whether every one matched the golden run.
pub(crate) fn run_simulate(args: &SimulateArgs) -> weir::Result<bool> {
    use weir::simulation::{check, SimOptions};
    let scratch = std::env::temp_dir().join(format!("weir-simulate-input-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).map_err(|e| Error::io("cannot create a scratch folder", &scratch, e))?;
    let p = args.parallelism as usize;
    let build = args.job.builder(p, &scratch)?;
    let options = SimOptions {
        mode: args.mode,
        incremental: args.incremental,
        changelog: args.changelog,
        rescale: args.job.rescales(),
        state_memory: args.state_memory.map(|b| b.0),
        local_recovery: !args.no_local_recovery,
        ..SimOptions::default()
    };
    let started = std::time::Instant::now();
    let report = check(build, args.seeds.clone(), &options, args.job.expect(args.mode));
    let _ = std::fs::remove_dir_all(&scratch);
    let report = report?;
    let rerun = |seed: u64| {
        format!(
            "weir simulate --job {} --mode {}{} --parallelism {p} --seeds {seed}",
            args.job,
            args.mode,
            if args.incremental { " --incremental" } else { "" },
        ) + if args.changelog { " --changelog" } else { "" }
            + &args.state_memory.map(|b| format!(" --state-memory {}B", b.0)).unwrap_or_default()
            + if args.no_local_recovery { " --no-local-recovery" } else { "" }
    };
    for s in report.failing() {
        println!(
            "seed {}: {} (faults: {}); rerun: {}",
            s.seed,
            s.differs.as_deref().unwrap_or_default(),
            s.stats.faults.join("; "),
            rerun(s.seed)
        );
    }
    let elapsed = started.elapsed().as_secs_f64();
    println!("{}", report.summary());
    eprintln!(
        "{:.0} seeds/s; per seed on average {} steps, {:.1} failovers, {:.1} crashes, {:.1} checkpoints; {} checkpoints \
         resumed a failed one, reusing {} task parts; {} restores from memory (local recovery), {} from files; {} committed transactions withdrawn after damage; {} recoveries \
         refused after damage (output that cannot be withdrawn); {} pages left memory and {} came back; {} seeds kept their checkpoints in an object store, \
         {} checkpoints went up after a successor took it over; the golden run: {} records, {} checkpoints",
        report.seeds.len() as f64 / elapsed.max(1e-9),
        report.seeds.iter().map(|s| s.stats.steps).sum::<u64>() / report.seeds.len() as u64,
        report.seeds.iter().map(|s| s.stats.failovers as f64).sum::<f64>() / report.seeds.len() as f64,
        report.seeds.iter().map(|s| s.stats.crashes as f64).sum::<f64>() / report.seeds.len() as f64,
        report.seeds.iter().map(|s| s.stats.checkpoints as f64).sum::<f64>() / report.seeds.len() as f64,
        report.seeds.iter().map(|s| s.stats.resumed).sum::<u64>(),
        report.seeds.iter().map(|s| s.stats.parts_reused).sum::<u64>(),
        report.seeds.iter().map(|s| s.stats.restores_from_memory).sum::<u64>(),
        report.seeds.iter().map(|s| s.stats.restores_from_files).sum::<u64>(),
        report.seeds.iter().map(|s| s.stats.retractions).sum::<u64>(),
        report.seeds.iter().map(|s| s.stats.refusals).sum::<u64>(),
        report.seeds.iter().map(|s| s.stats.evictions).sum::<u64>(),
        report.seeds.iter().map(|s| s.stats.faults_in).sum::<u64>(),
        report.seeds.iter().filter(|s| s.stats.in_store).count(),
        report.seeds.iter().map(|s| s.stats.late_publishes).sum::<u64>(),
        report.golden_records,
        report.golden.checkpoints,
    );
    Ok(report.failing().count() == 0)
}
