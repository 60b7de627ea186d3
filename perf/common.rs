//! Small helpers shared by the perf/ harnesses.

use std::time::Duration;

use weir::{Job, JobReport, RunConfig};

/// Runs `job` under `config` for `duration`, then stops it gracefully.
pub fn run_for(job: Job, config: RunConfig, duration: Duration) -> JobReport {
    let handle = job.start(config).expect("job starts");
    std::thread::sleep(duration);
    handle.stop();
    handle.join().expect("job ends cleanly")
}

/// Today's date as `YYYY-MM-DD` (from `date`), or `undated`: the folder results go to.
pub fn today() -> String {
    std::process::Command::new("date")
        .arg("+%Y-%m-%d")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "undated".into())
}
