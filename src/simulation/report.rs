//! What a simulation found: per seed, whether the output was as expected and what the run
//! did (attempts, checkpoints, the faults it injected); and the summary.
//!
//! May touch: nothing.

/// What happened in one simulated run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunStats {
    /// Scheduler steps (task polls, writes, deliveries, clock moves).
    pub steps: u64,
    /// Failovers (a task failed; the job restarted in the same process).
    pub failovers: u32,
    /// Process crashes (the job restarted from its checkpoint directory alone).
    pub crashes: u32,
    /// Checkpoints completed.
    pub checkpoints: u64,
    /// Of those, checkpoints that resumed a failed one, and the task parts they reused.
    pub resumed: u64,
    /// See `resumed`.
    pub parts_reused: u64,
    /// Attempts that restored a checkpoint from the process's memory (local recovery), and
    /// from its files.
    pub restores_from_memory: u64,
    /// See `restores_from_memory`.
    pub restores_from_files: u64,
    /// Committed transactions withdrawn and computed again (damage reached a checkpoint
    /// whose output was committed).
    pub retractions: u64,
    /// Recoveries refused because damage reached a checkpoint whose output cannot be
    /// withdrawn (`Error::OutputCannotBeWithdrawn`): the expected end of such a run.
    pub refusals: u64,
    /// Faults the schedule injected.
    pub faults: Vec<String>,
    /// The checkpoint directory was kept in an object store.
    pub in_store: bool,
    /// Checkpoints an owner put into the store after a successor had taken it over (paused
    /// between its check and its publish).
    pub late_publishes: u64,
    /// With a state memory budget: pages that left memory, and pages read back.
    pub evictions: u64,
    /// See `evictions`.
    pub faults_in: u64,
}

/// One seed's result.
#[derive(Debug)]
pub struct SeedResult {
    /// The seed.
    pub seed: u64,
    /// What differed from the golden run, if anything.
    pub differs: Option<String>,
    /// What the run went through.
    pub stats: RunStats,
}

/// The results of a range of seeds.
#[derive(Debug)]
pub struct SimReport {
    /// Every seed's result, in order.
    pub seeds: Vec<SeedResult>,
    /// The golden run's statistics.
    pub golden: RunStats,
    /// Records in the golden output.
    pub golden_records: usize,
}

impl SimReport {
    /// The seeds whose output differed.
    pub fn failing(&self) -> impl Iterator<Item = &SeedResult> {
        self.seeds.iter().filter(|s| s.differs.is_some())
    }

    /// `N seeds, F differ from the golden run`.
    pub fn summary(&self) -> String {
        format!("{} seeds, {} differ from the golden run", self.seeds.len(), self.failing().count())
    }
}
