//! `weir nexmark`: a Nexmark query, optionally checked against its sequential reference.
//!
//! May touch: `args`.

use weir::metrics::group_digits;
use weir::Error;

use crate::args::*;
use weir_ops::supervisor::*;

pub(crate) fn run_nexmark(args: &NexmarkArgs) -> weir::Result<()> {
    use weir_jobs::nexmark::build;
    const MAX_CHECKED: u64 = 2_000_000;
    let flags = args.checkpoints.clone().with_file()?;
    let plan = flags.plan(false)?;
    if args.check && args.events > MAX_CHECKED {
        return Err(Error::config(format!(
            "--check computes the answer sequentially in memory: use at most {} events, not {}",
            group_digits(MAX_CHECKED),
            group_digits(args.events)
        )));
    }
    let q10 = args.query == weir_jobs::nexmark::Query::Q10;
    match (&args.output, q10) {
        (None, true) => {
            return Err(Error::config("q10 writes every bid to files: give the folder with --output DIR"));
        }
        (Some(_), false) => {
            return Err(Error::config(format!("--output is for q10, which writes files; {} does not", args.query)));
        }
        _ => {}
    }
    let (config, parallelism) = args.runtime.config();
    let config = flags.run_config(config)?;
    let workers = config.effective_workers();
    let mut job = weir::Job::new(format!("nexmark-{}", args.query)).with_parallelism(parallelism);
    let checkpoint_dir = flags.checkpoint_dir.clone().unwrap_or_else(|| weir_ops::scratch_dir("nexmark"));
    // Its settings (the interval too, the engine's second unless given) come from the flags.
    if plan.is_some() {
        job = job.with_checkpointing(weir::checkpoint::CheckpointConfig::new(&checkpoint_dir));
    }
    let collected = match &args.output {
        Some(dir) => {
            weir_jobs::nexmark::write_q10(&job, Some(args.events), args.rate, dir);
            None
        }
        None => {
            let rows = build(&job, args.query, Some(args.events), args.rate);
            if args.check {
                Some(rows.collect())
            } else {
                rows.discard();
                None
            }
        }
    };
    println!(
        "weir nexmark {}: {} events, {} workers, parallelism {}, checkpoints {}{}",
        args.query,
        group_digits(args.events),
        workers,
        parallelism,
        plan.as_ref().map_or_else(|| "none".to_string(), |p| p.to_string()),
        if flags.incremental == Some(true) { " (incremental)" } else { "" }
    );
    let binding = args.runtime.bind_control()?;
    if let Some(plan) = &plan {
        job = weir_ops::settings::with_flags(job, &flags, plan, config.ring_capacity)?;
    }
    let (handle, control) = start_with_control(job, config, binding)?;
    let report = supervise(handle, None, !args.runtime.no_progress, None, control.as_ref());
    if flags.checkpoint_dir.is_none() {
        let _ = std::fs::remove_dir_all(&checkpoint_dir);
    }
    // Stopped with a savepoint through the control endpoint: said where, nothing to report.
    let Some(report) = report? else { return Ok(()) };
    print!("{}", weir_ops::tables::summary(&report, None));
    // Not the sources' records: q8 reads the event stream twice (people and auctions).
    let events_per_s = args.events as f64 / report.elapsed.as_secs_f64().max(1e-9);
    println!(
        "events per second: {} ({} per core)",
        group_digits(events_per_s as u64),
        group_digits((events_per_s / workers as f64) as u64)
    );
    check(args, collected)
}

/// With `--check`, the job's results (`collected`, or q10's files) against the sequential
/// implementation's: the same, or an error naming how they differ.
fn check(
    args: &NexmarkArgs,
    collected: Option<std::sync::Arc<std::sync::Mutex<Vec<weir_jobs::nexmark::Row>>>>,
) -> weir::Result<()> {
    use weir_jobs::nexmark::{final_rows, reference};
    if let Some(out) = collected {
        let got = final_rows(args.query, out.lock().unwrap_or_else(|e| e.into_inner()).clone());
        let expected = reference(args.query, args.events);
        if got != expected {
            return Err(Error::Checkpoint(format!(
                "{}: {} result rows differ from the sequential implementation's {}",
                args.query,
                got.len(),
                expected.len()
            )));
        }
        println!("check: {} result rows, the same as the sequential implementation", group_digits(got.len() as u64));
    }
    if let (Some(dir), true) = (&args.output, args.check) {
        let (got, expected) = (weir_jobs::nexmark::read_q10(dir)?, weir_jobs::nexmark::q10_reference(args.events));
        if got != expected {
            return Err(Error::Checkpoint(format!(
                "q10: the files under {} ({} partitions) differ from the sequential implementation's ({} partitions)",
                dir.display(),
                got.len(),
                expected.len()
            )));
        }
        let lines: usize = got.values().map(Vec::len).sum();
        println!(
            "check: {} lines in {} partitions, the same as the sequential implementation",
            group_digits(lines as u64),
            got.len()
        );
    }
    Ok(())
}
