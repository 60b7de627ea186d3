//! `weir` without a command: the embedded default job.

use std::time::Duration;

use weir::metrics::group_digits;
use weir_jobs::wordcount::DefaultJob;

use crate::args::*;
use crate::supervisor::*;

pub(crate) fn run_default(args: &DefaultArgs) -> weir::Result<()> {
    let (config, parallelism) = args.runtime.config();
    let job = DefaultJob { parallelism, keys: args.keys, window_ms: args.window_ms, rate_per_s: args.rate };
    println!(
        "weir default job: generator → key_by ({} keys) → {} ms tumbling-window count → sink; {} workers, parallelism {}, {}, {} s",
        args.keys,
        args.window_ms,
        config.effective_workers(),
        parallelism,
        args.rate.map(|r| format!("{} events/s", group_digits(r as u64))).unwrap_or_else(|| "as fast as possible".into()),
        args.duration_s
    );
    let binding = args.runtime.bind_control()?;
    let handle = announce_restores(job.build()).start(config)?;
    let control = serve_control(binding, &handle)?;
    let limit = Some(Duration::from_secs_f64(args.duration_s));
    // Stopped with a savepoint through the control endpoint: said where, nothing to report.
    let Some(report) = supervise(handle, limit, !args.runtime.no_progress, None, control.as_ref())? else {
        return Ok(());
    };
    print!("{}", report.summary_table());
    if report.latency_ns.as_ref().is_some_and(|h| !h.is_empty()) {
        println!("latency: from the instant a window is complete (event time = creation time) to the sink");
    } else {
        println!("latency: no window fired (run longer than one window)");
    }
    Ok(())
}
