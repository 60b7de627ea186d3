//! `weir` without a command (`cargo run --release`): what weir is for, in about ten seconds.
//! First the windowed count (generator → key_by → tumbling-window count → sink) with aligned
//! checkpoints, its throughput, latency and checkpoint table; then the checkpoint lab under
//! backpressure: aligned and unaligned checkpoints taking turns in one running job, each
//! mode's figures and the ratios of consecutive checkpoints.
//!
//! May touch: `args`.

use std::sync::atomic::Ordering;
use std::time::Duration;

use weir::checkpoint::{CheckpointConfig, CheckpointMode};
use weir::metrics::group_digits;
use weir_jobs::bench::{BenchConfig, Workload};
use weir_jobs::wordcount::DefaultJob;
use weir_ops::lab::CheckpointLab;

use crate::args::*;
use weir_ops::supervisor::*;

/// The share of the run the windowed count gets; the lab has the rest.
const WINDOW_SHARE: f64 = 0.6;

/// What the lab's slow sink spends per record: its rings fill, and aligned barriers wait
/// behind the in-flight data that unaligned ones overtake.
const LAB_SINK_COST_NS: u64 = 20_000;

pub(crate) fn run_default(args: &DefaultArgs) -> weir::Result<()> {
    let (config, parallelism) = args.runtime.config();
    let window_s = args.duration_s * WINDOW_SHARE;
    let job = DefaultJob { parallelism, keys: args.keys, window_ms: args.window_ms, rate_per_s: args.rate };
    println!(
        "weir default job: generator → key_by ({} keys) → {} ms tumbling-window count → sink, aligned checkpoints \
         every second; {} workers, parallelism {}, {}, {:.1} s",
        args.keys,
        args.window_ms,
        config.effective_workers(),
        parallelism,
        args.rate
            .map(|r| format!("{} events/s", group_digits(r as u64)))
            .unwrap_or_else(|| "as fast as possible".into()),
        window_s
    );
    let checkpoints = weir_ops::scratch_dir("default-job");
    let ran = run_window_count(args, &job, &checkpoints, window_s, config.clone());
    let _ = std::fs::remove_dir_all(&checkpoints);
    if !ran? || STOP_REQUESTS.load(Ordering::SeqCst) > 0 {
        return Ok(());
    }
    run_lab(args, parallelism, args.duration_s - window_s, config)
}

/// The windowed count with checkpoints into `dir`, for `seconds`. Returns whether it ran to
/// its end (not stopped with a savepoint through the control endpoint).
fn run_window_count(
    args: &DefaultArgs,
    job: &DefaultJob,
    dir: &std::path::Path,
    seconds: f64,
    config: weir::RunConfig,
) -> weir::Result<bool> {
    let job = job.build().with_checkpointing(CheckpointConfig::new(dir).interval(Duration::from_secs(1)));
    let (handle, control) = start_with_control(job, config, args.runtime.bind_control()?)?;
    let limit = Some(Duration::from_secs_f64(seconds));
    // Stopped with a savepoint through the control endpoint: said where, nothing to report.
    let Some(report) = supervise(handle, limit, !args.runtime.no_progress, None, control.as_ref())? else {
        return Ok(false);
    };
    weir_ops::runner::print_report(&report, true, None);
    if report.latency_ns.as_ref().is_some_and(|h| !h.is_empty()) {
        println!("latency: from the instant a window is complete (event time = creation time) to the sink");
    } else {
        println!("latency: no window fired (run longer than one window)");
    }
    Ok(true)
}

/// The checkpoint lab under backpressure for `seconds`: aligned and unaligned in turn.
fn run_lab(args: &DefaultArgs, parallelism: usize, seconds: f64, config: weir::RunConfig) -> weir::Result<()> {
    let dir = weir_ops::scratch_dir("default-lab");
    let bench = BenchConfig {
        workload: Workload::Backpressure,
        checkpoint: Some(CheckpointConfig::new(&dir).interval(Duration::from_millis(200))),
        parallelism,
        rate: None,
        keys: args.keys,
        zipf: None,
        sink_cost_ns: LAB_SINK_COST_NS,
    };
    println!(
        "\nthe checkpoint lab: a sink spending {} µs a record fills the rings; aligned and unaligned checkpoints take \
         turns every 200 ms in one running job, {seconds:.1} s",
        LAB_SINK_COST_NS / 1000
    );
    let job = bench.job()?;
    let lab = CheckpointLab::new(vec![CheckpointMode::Aligned, CheckpointMode::Unaligned]);
    let handle = announce_restores(job).start(config)?;
    lab.start(&handle)?;
    let limit = Some(Duration::from_secs_f64(seconds));
    let ended = supervise_with(handle, limit, !args.runtime.no_progress, None, None, &mut |_| Ok(false));
    let _ = std::fs::remove_dir_all(&dir);
    if let Supervised::Finished(report) = ended? {
        print!("{}", weir_ops::tables::lab(&CheckpointLab::summary(&report.checkpoints)));
        println!(
            "(unaligned barriers overtake the data in the rings and store it with the checkpoint; aligned ones wait \
             behind it)"
        );
    }
    Ok(())
}
