//! `weir bench`: one benchmark workload, its throughput, latency and checkpoint table.
//!
//! May touch: `args`.

use std::time::Duration;

use weir::metrics::group_digits;
use weir::Error;

use crate::args::*;
use weir_ops::supervisor::*;

pub(crate) fn run_bench(args: &BenchArgs) -> weir::Result<()> {
    use weir_jobs::bench::{BenchConfig, BenchResult, CheckpointChoice};
    let flags = args.checkpoints.clone().with_file()?;
    let plan = flags.plan(true)?;
    let first = plan.as_ref().map_or(CheckpointChoice::None, |p| p.first());
    let interval_ms = flags.interval_ms.unwrap_or(DEFAULT_BENCH_INTERVAL_MS);
    let (config, parallelism) = args.runtime.config();
    let checkpointing = plan.is_some();
    let temporary = flags.checkpoint_dir.is_none() && checkpointing;
    let checkpoint_dir = flags.checkpoint_dir.clone().unwrap_or_else(|| weir_ops::scratch_dir("bench"));
    if let Some(json) = &args.json {
        // Refuse an unwritable destination before running for minutes.
        std::fs::write(json, b"").map_err(|e| Error::io("cannot write the JSON results", json, e))?;
    }
    let bench = BenchConfig {
        workload: args.workload,
        checkpoint: first,
        interval: Duration::from_millis(interval_ms),
        checkpoint_dir: checkpoint_dir.clone(),
        parallelism,
        rate: args.rate,
        keys: args.keys,
        sink_cost_ns: args.sink_cost_ns,
        alignment_timeout: flags
            .aligned_checkpoint_timeout_ms
            .map_or(weir_jobs::bench::DEFAULT_ALIGNMENT_TIMEOUT, Duration::from_millis),
        max_concurrent: flags.max_concurrent.unwrap_or(1) as usize,
        inflight_budget: flags.inflight_budget_bytes.unwrap_or(weir_jobs::bench::DEFAULT_INFLIGHT_BUDGET),
    };
    println!(
        "weir bench: workload {}, checkpoints {}{}, {} workers, parallelism {}, {}, {} s",
        args.workload,
        plan.as_ref().map_or_else(|| "none".to_string(), |p| p.to_string()),
        if checkpointing { format!(" every {interval_ms} ms") } else { String::new() },
        config.effective_workers(),
        parallelism,
        args.rate
            .map(|r| format!("{} events/s", group_digits(r as u64)))
            .unwrap_or_else(|| "as fast as possible".into()),
        args.duration_s
    );
    let binding = args.runtime.bind_control()?;
    let job = weir_ops::settings::with_flags(bench.job()?, &flags, first, config.ring_capacity)?;
    // The checkpoint lab: the modes take turns through the live configuration.
    let lab = plan.as_ref().filter(|p| p.modes.len() > 1).map(|p| {
        let budget = flags
            .inflight_budget_bytes
            .unwrap_or_else(|| weir_jobs::bench::default_inflight_budget(&job, config.ring_capacity));
        weir_ops::lab::CheckpointLab::new(p.modes.clone(), bench.alignment_timeout, budget)
    });
    let (handle, control) = start_with_control(job, config, binding)?;
    let limit = Some(Duration::from_secs_f64(args.duration_s));
    let progress = !args.runtime.no_progress;
    if let Some(lab) = &lab {
        lab.start(&handle)?;
    }
    let report = supervise_with(handle, limit, progress, None, control.as_ref(), &mut |_| Ok(false)).map(|s| match s {
        Supervised::Finished(report) => Some(*report),
        Supervised::Savepoint | Supervised::HandedOver => None,
    });
    if temporary {
        let _ = std::fs::remove_dir_all(&checkpoint_dir);
    }
    // Stopped with a savepoint through the control endpoint: said where, nothing to report.
    let Some(report) = report? else { return Ok(()) };
    weir_ops::runner::print_report(&report, checkpointing, None);
    if let (Some(_), Some(plan)) = (&lab, &plan) {
        println!("the checkpoint lab ({plan}):");
        print!("{}", weir_ops::tables::lab(&weir_ops::lab::CheckpointLab::summary(&report.checkpoints)));
    }
    if let Some(json) = &args.json {
        let result = BenchResult::new(&bench, &report);
        std::fs::write(json, result.to_json()).map_err(|e| Error::io("cannot write the JSON results", json, e))?;
        println!("results: {}", json.display());
    }
    Ok(())
}
