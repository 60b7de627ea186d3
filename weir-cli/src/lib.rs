//! The `weir` command: the embedded default job, word count, benchmarks, Nexmark, checkpoint
//! listings, the control endpoint's client and the simulator. [`main`] parses the arguments
//! (`args`) and hands each command to its runner (a module per command), which builds its
//! job from `weir-jobs` and runs it under `weir-ops`' supervisor (progress, Ctrl-C, the
//! control endpoint, the report and its tables). A program that runs jobs of its own uses
//! `weir-ops` directly.
//!
//! ## Modules, lowest layer first (a module uses only modules above it in this list)
//!
//! - `args`: the command line.
//! - `group`: a consumer group's hand-overs (word count's).
//! - `bench`, `checkpoints`, `control_client`, `default_job`, `nexmark`, `simulate`,
//!   `wordcount`: the commands, which never use each other.
//!
//! May touch: `weir`, `weir-ops`, `weir-jobs`, `weir-kafka`, `weir-object-store`.

mod args;
mod bench;
mod checkpoints;
pub mod control_client;
mod default_job;
mod group;
mod nexmark;
mod simulate;
mod wordcount;

use std::process::ExitCode;

use clap::Parser;

use args::{Cli, Command};
use weir_ops::install_stop_handler;

/// The `weir` command: parses the arguments, runs the command, and says how it ended.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Some(Command::Checkpoints(_) | Command::Simulate(_) | Command::Control(_))) {
        // From the first instant of a command that runs a job: a restart restores its state
        // before the job runs (seconds, for much state), and a SIGTERM then must not kill it.
        // The command is the process: nothing installed a handler before.
        if let Err(e) = install_stop_handler() {
            eprintln!("warning: {e}");
        }
    }
    let result = match cli.command {
        None => default_job::run_default(&cli.default_job),
        Some(Command::Wordcount(args)) => wordcount::run_wordcount(&args),
        Some(Command::Checkpoints(args)) => checkpoints::list_checkpoints(&args),
        Some(Command::Bench(args)) => bench::run_bench(&args),
        Some(Command::Nexmark(args)) => nexmark::run_nexmark(&args),
        Some(Command::Control(args)) => control_client::run_control(&args),
        Some(Command::Simulate(args)) => match simulate::run_simulate(&args) {
            // The differing seeds and the summary are printed.
            Ok(all_equal) => return if all_equal { ExitCode::SUCCESS } else { ExitCode::FAILURE },
            Err(e) => Err(e),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
