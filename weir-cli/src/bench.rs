//! `weir bench`: one benchmark workload, its throughput, latency and checkpoint table.

use std::time::Duration;

use weir::metrics::group_digits;
use weir::Error;

use crate::args::*;
use crate::supervisor::*;

pub(crate) fn run_bench(args: &BenchArgs) -> weir::Result<()> {
    use weir_jobs::bench::{BenchConfig, BenchResult, CheckpointChoice};
    refuse_checkpoint_flags_without_checkpoints(
        args.checkpoint.first(),
        &[
            ("--interval-ms", args.interval_ms.is_some()),
            ("--checkpoint-dir", args.checkpoint_dir.is_some()),
            ("--max-concurrent", args.max_concurrent.is_some()),
            ("--min-pause-ms", args.min_pause_ms.is_some()),
        ],
    )?;
    if args.alignment_timeout_ms.is_some() && !args.checkpoint.uses(CheckpointChoice::AlignedTimeout) {
        return Err(Error::config(format!(
            "--alignment-timeout-ms needs --checkpoint aligned-timeout (not {})",
            args.checkpoint
        )));
    }
    if args.inflight_budget_bytes.is_some() && !args.checkpoint.uses(CheckpointChoice::Adaptive) {
        return Err(Error::config(format!(
            "--inflight-budget-bytes needs --checkpoint adaptive (not {})",
            args.checkpoint
        )));
    }
    let interval_ms = args.interval_ms.unwrap_or(DEFAULT_BENCH_INTERVAL_MS);
    let (config, parallelism) = args.runtime.config();
    let checkpointing = args.checkpoint.first() != CheckpointChoice::None;
    let temporary = args.checkpoint_dir.is_none() && checkpointing;
    let checkpoint_dir = args.checkpoint_dir.clone().unwrap_or_else(|| scratch_dir("bench"));
    if let Some(json) = &args.json {
        // Refuse an unwritable destination before running for minutes.
        std::fs::write(json, b"").map_err(|e| Error::io("cannot write the JSON results", json, e))?;
    }
    let bench = BenchConfig {
        workload: args.workload,
        checkpoint: args.checkpoint.first(),
        interval: Duration::from_millis(interval_ms),
        checkpoint_dir: checkpoint_dir.clone(),
        parallelism,
        rate: args.rate,
        keys: args.keys,
        sink_cost_ns: args.sink_cost_ns,
        alignment_timeout: args
            .alignment_timeout_ms
            .map_or(weir_jobs::bench::DEFAULT_ALIGNMENT_TIMEOUT, Duration::from_millis),
        max_concurrent: args.max_concurrent.unwrap_or(1) as usize,
        inflight_budget: args.inflight_budget_bytes.unwrap_or(weir_jobs::bench::DEFAULT_INFLIGHT_BUDGET),
    };
    println!(
        "weir bench: workload {}, checkpoints {}{}, {} workers, parallelism {}, {}, {} s",
        args.workload,
        args.checkpoint,
        if checkpointing { format!(" every {interval_ms} ms") } else { String::new() },
        config.effective_workers(),
        parallelism,
        args.rate
            .map(|r| format!("{} events/s", group_digits(r as u64)))
            .unwrap_or_else(|| "as fast as possible".into()),
        args.duration_s
    );
    let binding = args.runtime.bind_control()?;
    let mut job = bench.job()?;
    if args.inflight_budget_bytes.is_none() {
        job = weir_jobs::bench::fit_inflight_budget(job, config.ring_capacity);
    }
    job = with_min_pause(job, args.min_pause_ms);
    // The checkpoint lab: the modes take turns through the live configuration.
    let mut lab = (args.checkpoint.modes.len() > 1).then(|| {
        let budget = args
            .inflight_budget_bytes
            .unwrap_or_else(|| weir_jobs::bench::default_inflight_budget(&job, config.ring_capacity));
        weir_jobs::lab::CheckpointLab::new(args.checkpoint.modes.clone(), bench.alignment_timeout, budget)
    });
    let (handle, control) = start_with_control(job, config, binding)?;
    let limit = Some(Duration::from_secs_f64(args.duration_s));
    let progress = !args.runtime.no_progress;
    let report = supervise_with(handle, limit, progress, None, control.as_ref(), &mut |h| {
        if let Some(lab) = lab.as_mut() {
            lab.tick(h)?;
        }
        Ok(false)
    })
    .map(|s| match s {
        Supervised::Finished(report) => Some(report),
        Supervised::Savepoint | Supervised::HandedOver => None,
    });
    if temporary {
        let _ = std::fs::remove_dir_all(&checkpoint_dir);
    }
    // Stopped with a savepoint through the control endpoint: said where, nothing to report.
    let Some(report) = report? else { return Ok(()) };
    crate::runner::print_report(&report, checkpointing, None);
    if lab.is_some() {
        println!("the checkpoint lab ({}):", args.checkpoint);
        print!("{}", weir_jobs::lab::CheckpointLab::report(&report.checkpoints));
    }
    if let Some(json) = &args.json {
        let result = BenchResult::new(&bench, &report);
        std::fs::write(json, result.to_json()).map_err(|e| Error::io("cannot write the JSON results", json, e))?;
        println!("results: {}", json.display());
    }
    Ok(())
}
