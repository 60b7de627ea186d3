//! weir-jobs' integration tests, one binary: the jobs the command runs (Nexmark, the
//! benchmark workloads, word count) against their references, the pipelines they are built
//! from, and the simulator's seeds over every simulated job.

/// The helpers every package's tests share.
mod common {
    pub(crate) use weir_testkit::*;
}

mod jobs;
mod pipelines;
mod simulation;
