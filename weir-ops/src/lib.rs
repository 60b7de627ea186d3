//! Operating weir jobs from a program, as the `weir` command does: what an embedder needs
//! around a running [`weir::Job`] without the command's argument parsing, allocator or
//! process-wide handlers.
//!
//! - [`Runner`] runs a program's own job with the command's handling: the progress line, the
//!   control endpoint, stop with a savepoint, the report and its tables.
//! - [`control`] serves the control endpoint beside any running job (Flink's REST API as the
//!   model): checkpoints and savepoints on demand, stop, the live configuration, the metrics
//!   ([`metrics`], for Prometheus; a program's own registry can take them) and the dashboard.
//! - [`settings`]: the checkpoint settings by name, one struct for the command's flags (with
//!   the `clap` feature), a TOML configuration file and the endpoint's live keys.
//! - [`supervisor`] watches a running job; [`install_stop_handler`] makes Ctrl-C and SIGTERM
//!   stop it, only when the program asks (a process has one such handler, and it may be the
//!   program's own).
//! - [`stored`]: savepoints staged in a working folder for an object store, and restores
//!   brought down from one; [`tables`]: the reports' tables.
//! - [`lab`]: checkpoint modes taking turns checkpoint by checkpoint in one running job.
//!
//! ## Modules, lowest layer first (a module uses only modules above it in this list)
//!
//! - `metrics`, `stored`: the vocabulary, which never use each other.
//! - `lab`, `settings`: checkpoint modes (weir's, resolved by `CheckpointMode::from_flat`).
//! - `tables`: the reports (with the lab's).
//! - `control`: the endpoint.
//! - `supervisor`: watching a job, carrying out the endpoint's stops.
//! - `runner`: a program's job under the supervisor.
//!
//! May touch: `weir`, `weir-object-store` (savepoints in a store, with the `object-store`
//! feature: without it the crate builds with no C compiler).

use std::path::PathBuf;

pub mod control;
pub mod lab;
pub mod metrics;
pub mod runner;
pub mod settings;
pub mod stored;
pub mod supervisor;
pub mod tables;

pub use control::{ControlBinding, ControlEndpoint};
pub use lab::CheckpointLab;
pub use runner::Runner;
pub use settings::CheckpointSettings;
pub use supervisor::install_stop_handler;

/// A fresh folder name under the system's temporary directory for `what` (a benchmark's
/// checkpoints, a copy of a store's files; removed by the caller afterwards).
pub fn scratch_dir(what: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    std::env::temp_dir().join(format!("weir-{what}-{}-{nanos}", std::process::id()))
}
