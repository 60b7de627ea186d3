//! The engine's integration tests, one binary (one link of the library instead of one per
//! file), a module per concern, built with the engine's failure points (`testing`).
//! `no_alloc.rs` is a binary of its own: its counting allocator counts the whole process.
//! The command's tests are `weir-cli`'s, the connectors' their own packages'.
#![allow(clippy::disallowed_methods)] // the engine's rule (clippy.toml); tests may read the wall clock and start threads

/// The helpers every package's tests share.
mod common {
    pub(crate) use weir_testkit::*;
}

mod backpressure;
mod changelog;
mod embedded;
mod format_fixtures;
mod io_faults;
mod keyed_state;
mod latency_causes;
mod latest_sink;
mod local_recovery;
mod pacing;
mod persist_derive;
mod process;
mod readers_fuzz;
mod recovery;
mod savepoints;
mod state_budget;
mod tidy;
mod tracing_events;
mod two_inputs;
mod windows;
