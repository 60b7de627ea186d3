//! [`CheckpointChoice`]: no checkpoints, or a checkpoint mode without its parameter, as the
//! command's flags, the checkpoint lab and the benchmarks name them; the aligned-checkpoint
//! timeout and in-flight budget a choice takes unless told otherwise.
//!
//! May touch: nothing else in the crate (weir's checkpoint configuration and the job's rings).

use std::time::Duration;

use weir::checkpoint::{CheckpointConfig, CheckpointMode, ModeKind};
use weir::Job;

/// Which checkpoints a benchmark takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckpointChoice {
    /// None.
    None,
    /// Exactly-once, aligned barriers.
    Aligned,
    /// Exactly-once, unaligned barriers.
    Unaligned,
    /// At-least-once (barriers counted, not aligned).
    AtLeastOnce,
    /// Exactly-once, aligned barriers that turn unaligned once the checkpoint has run for the
    /// aligned-checkpoint timeout (counted from its trigger).
    AlignedTimeout,
    /// Exactly-once, unaligned barriers with adaptive alignment: a checkpoint's in-flight data
    /// under the in-flight budget.
    Adaptive,
}

/// The aligned-checkpoint timeout of `aligned-timeout` unless told otherwise.
pub const DEFAULT_ALIGNMENT_TIMEOUT: Duration = Duration::from_millis(10);

/// The in-flight budget of `adaptive` unless told otherwise: 1 MiB, or half of what `job`'s
/// rings hold where that is less ([`fit_inflight_budget`]).
pub const DEFAULT_INFLIGHT_BUDGET: u64 = 1 << 20;

/// `job` with the default in-flight budget fitted to its rings (of `ring_capacity` entries):
/// 1 MiB was refused on the default rings of the backpressure workload, which hold 512 KiB.
/// A job without a budget is returned as it is.
pub fn fit_inflight_budget(job: Job, ring_capacity: usize) -> Job {
    let Some(config) = job.checkpointing().filter(|c| c.mode.inflight_budget().is_some()) else { return job };
    let budget = default_inflight_budget(&job, ring_capacity);
    job.with_checkpointing(config.mode(CheckpointMode::Adaptive { budget }))
}

/// The default in-flight budget of `job` with rings of `ring_capacity` entries: half of what
/// they hold, at most [`DEFAULT_INFLIGHT_BUDGET`].
pub fn default_inflight_budget(job: &Job, ring_capacity: usize) -> u64 {
    match job.ring_bytes(ring_capacity) {
        Some(bytes) => DEFAULT_INFLIGHT_BUDGET.min(bytes / 2).max(1),
        None => DEFAULT_INFLIGHT_BUDGET,
    }
}

impl CheckpointChoice {
    /// Every choice, in the order reports list them.
    pub const ALL: [CheckpointChoice; 6] = [
        CheckpointChoice::None,
        CheckpointChoice::Aligned,
        CheckpointChoice::Unaligned,
        CheckpointChoice::AtLeastOnce,
        CheckpointChoice::AlignedTimeout,
        CheckpointChoice::Adaptive,
    ];

    /// The choices of the matrix's headline (throughput without backpressure).
    pub const HEADLINE: [CheckpointChoice; 4] =
        [CheckpointChoice::None, CheckpointChoice::Aligned, CheckpointChoice::Unaligned, CheckpointChoice::AtLeastOnce];

    /// The checkpoint mode's kind of this choice (`None` for no checkpoints).
    pub fn kind(self) -> Option<ModeKind> {
        Some(match self {
            CheckpointChoice::None => return None,
            CheckpointChoice::Aligned => ModeKind::Aligned,
            CheckpointChoice::Unaligned => ModeKind::Unaligned,
            CheckpointChoice::AtLeastOnce => ModeKind::AtLeastOnce,
            CheckpointChoice::AlignedTimeout => ModeKind::AlignedTimeout,
            CheckpointChoice::Adaptive => ModeKind::Adaptive,
        })
    }

    /// The checkpoint configuration of this choice (`None` for no checkpoints), writing to
    /// `dir` every `interval`; `alignment_timeout` is used by `AlignedTimeout` only,
    /// `inflight_budget` by `Adaptive` only.
    pub fn config(
        self,
        dir: &std::path::Path,
        interval: Duration,
        alignment_timeout: Duration,
        inflight_budget: u64,
    ) -> Option<CheckpointConfig> {
        let kind = self.kind()?;
        Some(CheckpointConfig::new(dir).interval(interval).mode(kind.with(alignment_timeout, inflight_budget)))
    }
}

impl std::str::FromStr for CheckpointChoice {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        weir::error::one_of(&CheckpointChoice::ALL, s, "a checkpoint choice")
    }
}

impl std::fmt::Display for CheckpointChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.kind().map_or("none", ModeKind::name))
    }
}
