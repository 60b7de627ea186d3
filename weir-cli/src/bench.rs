//! `weir bench`: one benchmark workload, its throughput, latency and checkpoint table.
//!
//! May touch: `args`.

use std::time::Duration;

use weir::checkpoint::CheckpointConfig;
use weir::metrics::group_digits;
use weir::Error;

use crate::args::*;
use weir_ops::supervisor::*;

/// The line that says what runs: the workload and its keys, the checkpoints, the workers, the
/// rate and the duration.
fn announce(
    args: &BenchArgs,
    plan: Option<&weir_ops::settings::CheckpointPlan>,
    interval_ms: u64,
    (workers, parallelism): (usize, usize),
) {
    println!(
        "weir bench: workload {}{}, checkpoints {}{}, {} workers, parallelism {}, {}, {} s",
        args.workload,
        args.zipf
            .filter(|s| *s > 0.0)
            .map(|s| format!(" (keys drawn with Zipf's law, exponent {s})"))
            .unwrap_or_default(),
        plan.map_or_else(|| "none".to_string(), |p| p.to_string()),
        if plan.is_some() { format!(" every {interval_ms} ms") } else { String::new() },
        workers,
        parallelism,
        args.rate
            .map(|r| format!("{} events/s", group_digits(r as u64)))
            .unwrap_or_else(|| "as fast as possible".into()),
        args.duration_s
    );
}

pub(crate) fn run_bench(args: &BenchArgs) -> weir::Result<()> {
    use weir_jobs::bench::{BenchConfig, BenchResult};
    let flags = args.checkpoints.clone().with_file()?;
    let plan = flags.plan(true)?;
    let interval_ms = flags.interval_ms.unwrap_or(DEFAULT_BENCH_INTERVAL_MS);
    let (config, parallelism) = args.runtime.config();
    let config = flags.run_config(config)?;
    let temporary = flags.checkpoint_dir.is_none() && plan.is_some();
    let checkpoint_dir = flags.checkpoint_dir.clone().unwrap_or_else(|| weir_ops::scratch_dir("bench"));
    if let Some(json) = &args.json {
        // Refuse an unwritable destination before running for minutes.
        std::fs::write(json, b"").map_err(|e| Error::io("cannot write the JSON results", json, e))?;
    }
    let mut bench = BenchConfig {
        workload: args.workload,
        checkpoint: None,
        parallelism,
        rate: args.rate,
        keys: args.keys,
        zipf: args.zipf,
        sink_cost_ns: args.sink_cost_ns,
    };
    announce(args, plan.as_ref(), interval_ms, (config.effective_workers(), parallelism));
    let binding = args.runtime.bind_control()?;
    // The checkpoint configuration, built once from the flags (the bench's interval unless
    // given) on the workload's graph, whose rings fit the in-flight budget.
    let mut job = bench.job()?;
    if let Some(plan) = &plan {
        let c = CheckpointConfig::new(&checkpoint_dir).interval(Duration::from_millis(interval_ms));
        job = weir_ops::settings::with_flags(job.with_checkpointing(c), &flags, plan, config.ring_capacity)?;
        bench.checkpoint = job.checkpointing();
    }
    // The checkpoint lab: the modes take turns through the live configuration.
    let lab = match &plan {
        Some(p) if p.modes.len() > 1 => {
            Some(weir_ops::lab::CheckpointLab::new(flags.fitted_modes(p, &job, config.ring_capacity)?))
        }
        _ => None,
    };
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
    weir_ops::runner::print_report(&report, plan.is_some(), None);
    print_state(&bench);
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

/// What the job's state held at most, in its pages and per key (the keyed workload's keys are
/// its entries), and the process's peak resident memory.
fn print_state(bench: &weir_jobs::bench::BenchConfig) {
    let peak = weir::state::state_memory_peak_bytes();
    if peak == 0 {
        return;
    }
    let per_key = match bench.workload {
        weir_jobs::bench::Workload::Keyed => {
            format!(", {:.0} bytes a key of {}", peak as f64 / bench.keys as f64, group_digits(bench.keys))
        }
        _ => String::new(),
    };
    let rss = weir_jobs::bench::peak_rss_bytes()
        .map(|b| format!("; the process's peak resident memory {:.1} MB", b as f64 / 1e6));
    println!("state: at most {:.1} MB in pages{per_key}{}", peak as f64 / 1e6, rss.unwrap_or_default());
}
