//! The workspace's integration tests, one binary (one link of the library instead of one per
//! file), a module per concern. They belong to the `weir-cli` package because a third of
//! them run the `weir` command, and a package reaches only its own binaries
//! (`CARGO_BIN_EXE_weir`); the engine is built with its failure points (`testing`) for them.
//! `no_alloc.rs` is a binary of its own: its counting allocator counts the whole process.

mod common;

mod backpressure;
mod checkpoint_dirs;
mod cli;
mod control;
mod crash;
mod dashboard;
mod embedded;
mod integrity;
mod io_faults;
mod jobs;
mod kafka;
mod keyed_state;
mod latency_causes;
mod latest_sink;
mod object_store;
mod persist_derive;
mod pipelines;
mod process;
mod readers_fuzz;
mod recovery;
mod savepoints;
mod simulation;
mod tidy;
mod tracing_events;
mod two_inputs;
mod windows;
