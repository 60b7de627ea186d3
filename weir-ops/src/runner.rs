//! Any job of a program's own with the command's handling ([`Runner`]): the progress line,
//! the control endpoint, the report with the checkpoint table at the end, and when asked,
//! Ctrl-C and SIGTERM (the first stops the job, with a savepoint where a savepoint folder is
//! given; the second cancels it), as `weir wordcount` has them.
//!
//! May touch: `supervisor`, `control`, `stored`, `tables` (the report).

use std::path::PathBuf;

use weir::{Job, JobReport, RunConfig};

use crate::control::ControlBinding;
use crate::supervisor::{install_stop_handler, start_with_control, supervise};

/// Runs a program's own job as the `weir` command runs its jobs.
///
/// ```no_run
/// use weir::{Job, RunConfig};
/// use weir::checkpoint::CheckpointConfig;
/// use weir::source::Generator;
///
/// let job = Job::new("mine").with_checkpointing(CheckpointConfig::new("chk"));
/// job.generator(Generator::new(|i, _| i).count(1_000_000)).discard();
/// let report = weir_ops::Runner::new()
///     .control("127.0.0.1:8081")
///     .savepoint_dir("savepoints")
///     .run(job, RunConfig::default())
///     .unwrap();
/// # drop(report);
/// ```
#[derive(Debug, Default)]
pub struct Runner {
    control: Option<String>,
    binding: Option<ControlBinding>,
    control_public: bool,
    savepoint_dir: Option<PathBuf>,
    quiet: bool,
    handle_signals: bool,
}

impl Runner {
    /// Progress line and report on, no control endpoint, no signal handler.
    pub fn new() -> Runner {
        Runner::default()
    }

    /// Serves the control endpoint at `addr` (`HOST:PORT`, on loopback; port 0 picks one, and
    /// the address is said on standard error).
    pub fn control(mut self, addr: impl Into<String>) -> Runner {
        self.control = Some(addr.into());
        self
    }

    /// Serves the control endpoint at an address the program bound itself (and so knows,
    /// port 0 included).
    pub fn control_at(mut self, binding: ControlBinding) -> Runner {
        self.binding = Some(binding);
        self
    }

    /// Lets the control endpoint serve off loopback (anyone who reaches it can stop the job).
    pub fn control_public(mut self, public: bool) -> Runner {
        self.control_public = public;
        self
    }

    /// Ctrl-C and SIGTERM (with [`Runner::handle_signals`]) stop the job with a savepoint into
    /// `dir` (a folder, or `s3://BUCKET/PREFIX`).
    pub fn savepoint_dir(mut self, dir: impl Into<PathBuf>) -> Runner {
        self.savepoint_dir = Some(dir.into());
        self
    }

    /// Ctrl-C and SIGTERM stop the job (with a savepoint where [`Runner::savepoint_dir`] is
    /// given; a second one cancels it): the process-wide handler is installed
    /// ([`crate::install_stop_handler`]); where the program installed its own, [`Runner::run`]
    /// says so and runs nothing. Off unless asked: a program that handles its signals stops the
    /// job through its handle or the control endpoint.
    pub fn handle_signals(mut self, on: bool) -> Runner {
        self.handle_signals = on;
        self
    }

    /// No progress line and no report (the job's notes still go to standard error).
    pub fn quiet(mut self, quiet: bool) -> Runner {
        self.quiet = quiet;
        self
    }

    /// Runs `job` to its end. Returns its report, or `None` when it was stopped with a
    /// savepoint (Ctrl-C with a savepoint folder, or the control endpoint's `stop`), after
    /// saying where the savepoint is.
    pub fn run(self, job: Job, config: RunConfig) -> weir::Result<Option<JobReport>> {
        if self.handle_signals {
            install_stop_handler()?;
        }
        let binding = match self.binding {
            Some(b) => Some(b),
            None => self
                .control
                .as_deref()
                .map(|addr| ControlBinding::bind(addr, crate::control::Reach::of_public(self.control_public)))
                .transpose()?,
        };
        let savepoints = self.savepoint_dir.as_deref().map(crate::stored::SavepointDir::open).transpose()?;
        let checkpointing = job.checkpointing().is_some();
        let (handle, control) = start_with_control(job, config, binding)?;
        let report = supervise(handle, None, !self.quiet, savepoints.as_ref(), control.as_ref())?;
        if let Some(report) = report.as_ref().filter(|_| !self.quiet) {
            print_report(report, checkpointing, None);
        }
        Ok(report)
    }
}

/// The end-of-job report: the summary table (its throughput in `counting`'s unit, if given,
/// else source records) and, for a job with checkpoints, the checkpoint table and latency by
/// cause.
pub fn print_report(report: &JobReport, checkpointing: bool, counting: Option<(&str, u64)>) {
    print!("{}", crate::tables::summary(report, counting));
    if let Some(b) = &report.state_memory {
        println!("{}", crate::tables::state_memory(b));
    }
    if checkpointing {
        let total = report.checkpoints_completed;
        println!("checkpoints completed: {total}{}", crate::tables::listed(total, report.checkpoints.len()));
        if !report.checkpoints.is_empty() {
            print!("{}", crate::tables::checkpoint_stats(&report.checkpoints));
        }
        if let Some(table) = crate::tables::latency_by_cause(report) {
            println!("latency by what the job was doing while a record was in flight:");
            print!("{table}");
        }
    }
}

#[cfg(test)]
mod tests {
    use weir::source::Generator;

    use super::*;

    /// A program's own Ctrl-C handler still installs after a job ran under a [`Runner`] that
    /// was not asked to handle signals (the runner installed the process's one handler, and
    /// the program's then failed with "a handler is already installed"); and a runner asked to
    /// handle them where the program has its own says so instead of losing to it silently
    /// (Ctrl-C then did nothing to the job). One test: the handler is the process's.
    #[test]
    fn a_runner_leaves_the_signals_to_the_program_unless_asked() {
        let job = || {
            let job = Job::new("signals");
            job.generator(Generator::new(|i, _| i).count(1_000)).discard();
            job
        };
        let report = Runner::new().quiet(true).run(job(), RunConfig::default().workers(1)).unwrap();
        assert_eq!(report.expect("a job that ran to its end").source_records, 1_000);
        ctrlc::set_handler(|| {}).expect("the program's own handler");
        let e = Runner::new().quiet(true).handle_signals(true).run(job(), RunConfig::default().workers(1)).unwrap_err();
        assert!(e.to_string().contains("a handler is already installed"), "{e}");
    }
}
