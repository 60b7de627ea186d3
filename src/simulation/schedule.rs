//! The failures a seed schedules: when a task fails, when the process crashes and at which
//! point of a checkpoint (snapshot writes dropped or half written, `_metadata` written and not
//! renamed, a completion notice not yet heard), damage while it is down, failed writes, the
//! directory lock taken away, an owner paused before its publish into the object store while
//! a successor takes the store over.
//!
//! May touch: `checkpoint`, `prng`.

use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::checkpoint::coordinator::{CrashPoint, CrashSchedule};
use crate::checkpoint::{CheckpointConfig, CheckpointMirror, CheckpointMode, ModeKeys, ObjectStore};
use crate::prng::Prng;

use super::*;

/// One fault of a seed's schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fault {
    /// At step `n` of the run, the task polled fails (the job fails over).
    TaskFails(u64),
    /// At step `n`, the process dies.
    Crash(u64),
    /// The process dies at a point of checkpoint `id`'s completion.
    CrashAt(CrashPoint, u64),
    /// The process dies as checkpoint `id` is complete and not yet committed, and while it
    /// is down one of that checkpoint's files is damaged (or, with `misplace`, replaced by
    /// another task's).
    DamageAt { checkpoint: u64, misplace: bool },
    /// The snapshot write run at step `n` (or the next one) fails.
    WriteFails(u64),
    /// At step `n`, the checkpoint directory's lock file is removed (another process took
    /// the directory over): the job must stop without completing or committing anything.
    Fence(u64),
    /// A task fails within a few steps after the `n`-th restart's restore.
    FailsAfterRestore(u32),
    /// The process dies once some tasks, not all, applied checkpoint `id`'s completion.
    CrashMidCompletion(u64),
    /// At step `n`, a stop with a savepoint: once the savepoint's sink transactions are all
    /// committed the job stops, and a new job in a new checkpoint directory starts from it.
    StopWithSavepoint(u64),
    /// At step `at`, the process dies; the job starts again at `parallelism` from the latest
    /// checkpoint of its directory (from the start if there is none), in a new directory.
    Rescale { at: u64, parallelism: usize },
    /// The first snapshot write of checkpoint `id` hangs: the coordinator never hears of it,
    /// the checkpoint expires (the timeout is a few intervals then), and the next one
    /// resumes it with the other tasks' kept parts; in half the seeds the process dies as
    /// one of the next two completes.
    HangsWrite(u64),
    /// The job finished and the process dies while its host drains the results: after the
    /// host took `n` of them (the job must run again, its completion marker not written).
    CrashWhileDraining(u64),
    /// With a state memory budget: the `n`-th write of a page to a spill file in the process
    /// fails (a full disk), failing the attempt over.
    SpillFails(u64),
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::TaskFails(n) => write!(f, "task failure at step {n}"),
            Fault::HangsWrite(id) => write!(f, "a snapshot write of checkpoint {id} hangs, and the checkpoint expires"),
            Fault::Crash(n) => write!(f, "crash at step {n}"),
            Fault::CrashAt(CrashPoint::MetadataNotRenamed, id) => {
                write!(f, "crash with checkpoint {id}'s _metadata written and not renamed")
            }
            Fault::CrashAt(CrashPoint::BeforeCompletionNotice, id) => {
                write!(f, "crash after checkpoint {id} completed, before any task heard it")
            }
            Fault::CrashAt(CrashPoint::BeforePublish, id) => {
                write!(f, "paused before checkpoint {id} went into the store, while a successor took over")
            }
            Fault::DamageAt { checkpoint, misplace: false } => {
                write!(f, "crash before checkpoint {checkpoint} was committed, then one of its files damaged")
            }
            Fault::DamageAt { checkpoint, misplace: true } => {
                write!(f, "crash before checkpoint {checkpoint} was committed, then one of its task files misplaced")
            }
            Fault::WriteFails(n) => write!(f, "snapshot write failure at step {n}"),
            Fault::Fence(n) => write!(f, "directory lock taken away at step {n}"),
            Fault::FailsAfterRestore(n) => write!(f, "task failure right after restore {n}"),
            Fault::CrashWhileDraining(n) => {
                write!(f, "crash while the host drained the finished job's results, {n} taken")
            }
            Fault::StopWithSavepoint(n) => write!(f, "stop with a savepoint at step {n}, then a start from it"),
            Fault::Rescale { at, parallelism } => {
                write!(f, "crash at step {at}, then a start from the latest checkpoint at parallelism {parallelism}")
            }
            Fault::CrashMidCompletion(id) => {
                write!(f, "crash once some tasks, not all, applied checkpoint {id}'s completion")
            }
            Fault::SpillFails(n) => write!(f, "spill write {n} fails (a full disk)"),
        }
    }
}

/// A seed's schedule: its faults, and the scheduler's choices.
pub(super) struct Schedule {
    pub(super) rng: Prng,
    pub(super) faults: Vec<Fault>,
    pub(super) ring_capacity: usize,
    pub(super) batch_size: usize,
    pub(super) interval_ns: u64,
    pub(super) max_concurrent: usize,
    pub(super) alignment_timeout_ns: u64,
    /// Adaptive alignment's in-flight budget: up to 16 bytes per ring slot of one channel, so
    /// never above what the rings hold.
    pub(super) inflight_budget: u64,
    /// The checkpoint timeout: in half the seeds short (sim time), so checkpoints whose writes
    /// the schedule holds back expire; in the golden run and the other half too long to reach,
    /// so a checkpoint that can never complete stalls the run and is reported.
    pub(super) timeout_ns: u64,
    /// A write hangs ([`Fault::HangsWrite`]): the timeout is four intervals.
    pub(super) short_timeout: bool,
    /// Of 1,000 steps, how many move the clock.
    pub(super) tick_per_mille: u64,
    /// Of 1,000 steps of an embedded job, how many are its host's.
    pub(super) host_per_mille: u64,
    /// Of 1,000 steps, how many run a snapshot write.
    pub(super) write_per_mille: u64,
}

/// Crash points armed by the schedule, asked by the coordinator.
#[derive(Default)]
pub(super) struct ArmedCrashes {
    pub(super) points: Mutex<Vec<(CrashPoint, u64)>>,
    /// Checkpoint of the last crash that fired, for damage faults.
    pub(super) fired: Mutex<Option<(CrashPoint, u64)>>,
    /// The object store the directory is kept in, if it is: where a successor takes over while
    /// the owner is paused before its publish.
    pub(super) store: Option<Arc<dyn ObjectStore>>,
    /// (generation, checkpoint) of each checkpoint put into the store by an owner a successor
    /// had already fenced: never to be restored.
    pub(super) late: Mutex<Vec<(u64, u64)>>,
}

impl ArmedCrashes {
    /// A successor takes the store over while the owner is paused before it publishes
    /// checkpoint `id` (it claims, brings down what counts and records it, in a folder of its
    /// own), then dies; the owner's checkpoint goes up after that.
    fn successor_takes_over(&self, id: u64) {
        let Some(store) = &self.store else { return };
        let mirror = CheckpointMirror::new(Arc::clone(store));
        let Ok(generation) = mirror.next_generation() else { return };
        let Ok(folder) = super::driver::Scratch::new() else { return };
        if mirror.take_over(&folder.path, generation, "a successor (simulated)").is_ok() {
            // The paused owner holds the claim below it.
            self.late.lock().unwrap_or_else(|e| e.into_inner()).push((generation - 1, id));
        }
    }
}

impl CrashSchedule for ArmedCrashes {
    fn crash_at(&self, point: CrashPoint, checkpoint: u64) -> bool {
        let mut points = self.points.lock().unwrap_or_else(|e| e.into_inner());
        match points.iter().position(|&p| p == (point, checkpoint)) {
            Some(i) if point == CrashPoint::BeforePublish => {
                // Not a crash: a pause, during which a successor takes over.
                points.remove(i);
                drop(points);
                self.successor_takes_over(checkpoint);
                false
            }
            Some(i) => {
                points.remove(i);
                *self.fired.lock().unwrap_or_else(|e| e.into_inner()) = Some((point, checkpoint));
                true
            }
            None => false,
        }
    }
}

impl Schedule {
    /// The failure-free schedule (the golden run) or seed `seed`'s, for a job whose golden
    /// run took `golden_steps` steps and completed `golden_checkpoints` checkpoints.
    pub(super) fn new(seed: Option<u64>, golden: Option<&RunStats>, rescale_from: Option<usize>) -> Schedule {
        let mut rng = Prng::new(seed.map_or(0x5EED, |s| s ^ 0xA5A5_5A5A_0F0F_F0F0));
        let ring_capacity = [1, 2, 3, 8, 64][rng.below(5) as usize];
        let batch_size = [1, 3, 16, 64][rng.below(4) as usize];
        let mut s = Schedule {
            faults: Vec::new(),
            ring_capacity,
            batch_size,
            // Checkpoints every few hundred steps: more often, and the barriers of one
            // checkpoint would not have left the sources before the next is due (a checkpoint
            // storm, in which sources only ever forward barriers).
            interval_ns: rng.between(400, 3000) * 1_000,
            max_concurrent: rng.between(1, 2) as usize,
            alignment_timeout_ns: rng.between(0, 50) * 1_000,
            // Drawn apart, so the other modes' schedules are as they were.
            inflight_budget: Prng::new(seed.unwrap_or(0) ^ 0xADA_9713).between(1, ring_capacity as u64 * 16),
            timeout_ns: if seed.is_some() && rng.chance(1, 2) { 50_000_000 } else { 600_000_000_000 },
            short_timeout: false,
            // Drawn apart, as `inflight_budget`.
            host_per_mille: Prng::new(seed.unwrap_or(0) ^ 0x4057_5EED).between(20, 300),
            tick_per_mille: rng.between(20, 200),
            write_per_mille: rng.between(20, 300),
            rng,
        };
        let (Some(_), Some(g)) = (seed, golden) else { return s };
        let steps = g.steps.max(10);
        let checkpoints = g.checkpoints.max(1);
        for _ in 0..s.rng.between(1, 3) {
            let at = s.rng.below(steps);
            let id = s.rng.between(1, checkpoints + 2);
            let fault = match s.rng.below(11) {
                0 | 1 => Fault::TaskFails(at),
                2 => Fault::Crash(at),
                3 => Fault::CrashAt(CrashPoint::MetadataNotRenamed, id),
                4 => Fault::CrashAt(CrashPoint::BeforeCompletionNotice, id),
                5 => Fault::DamageAt { checkpoint: id, misplace: s.rng.chance(1, 2) },
                6 => Fault::WriteFails(at),
                7 => Fault::Fence(at),
                8 => Fault::StopWithSavepoint(at),
                9 => Fault::CrashMidCompletion(id),
                _ => Fault::FailsAfterRestore(s.rng.between(1, 2) as u32),
            };
            s.faults.push(fault);
        }
        // Drawn apart, so that a seed's other faults and choices are the same with or without.
        // Not with a damaged checkpoint: restoring the one before it would repeat output its
        // successor committed, which only a recovery in the same directory can see.
        let mut r = Prng::new(seed.unwrap_or(0) ^ 0x5CA1_AB1E);
        if let Some(p) = rescale_from {
            if r.chance(1, 3) && !s.faults.iter().any(|f| matches!(f, Fault::DamageAt { .. })) {
                let parallelism = [1, 2, 3, 4].into_iter().filter(|&q| q != p).nth(r.below(3) as usize);
                s.faults.push(Fault::Rescale { at: r.below(steps), parallelism: parallelism.expect("three others") });
            }
        }
        let mut r = Prng::new(seed.unwrap_or(0) ^ 0x4A_96ED);
        if r.chance(1, 3) {
            s.short_timeout = true;
            s.faults.push(Fault::HangsWrite(r.between(1, checkpoints)));
        }
        // Drawn apart too; taken only by a run with a state memory budget.
        let mut r = Prng::new(seed.unwrap_or(0) ^ 0x5_9177);
        if r.chance(1, 3) {
            s.faults.push(Fault::SpillFails(r.between(1, 200)));
        }
        s
    }

    /// The checkpoint configuration for a job of `subtasks` subtasks in all. A barrier's
    /// round trip takes steps in proportion to the subtasks polled on the way, so the interval
    /// grows with them (one unit per 24 subtasks): a large job at parallelism 4 would
    /// otherwise trigger each checkpoint before the last one's barriers got through, and spend
    /// its steps forwarding barriers (a storm that never reaches the step limit's end).
    pub(super) fn config(&self, dir: &Path, options: &SimOptions, subtasks: usize) -> CheckpointConfig {
        let scale = subtasks.div_ceil(24).max(1) as u64;
        let timeout_ns = if self.short_timeout { 4 * self.interval_ns * scale } else { self.timeout_ns };
        let mut c = CheckpointConfig::new(dir)
            .local_recovery(options.local_recovery)
            .interval(Duration::from_nanos(self.interval_ns * scale))
            .incremental(options.incremental)
            .max_concurrent(self.max_concurrent)
            .checkpoint_timeout(Duration::from_nanos(timeout_ns))
            // A savepoint's own timeout, twice the checkpoints': a hung write expires it in
            // simulated time too.
            .savepoint_timeout(Duration::from_nanos(2 * timeout_ns))
            .tolerable_failed_checkpoints(u32::MAX / 2)
            // Damage can reach a checkpoint whose output was committed (a part one checkpoint
            // reuses is the same file as the other's): recovery then falls back past it, and
            // the sink withdraws that output and computes it again, which the comparison with
            // the golden run checks. A withdrawal in a seed without damage fails the seed.
            .allow_retracting_output(true);
        if options.changelog {
            c = c.materialize_every(2);
        }
        let timeout = Duration::from_nanos(self.alignment_timeout_ns.max(1));
        let keys = ModeKeys::word(options.mode, timeout, self.inflight_budget.max(1));
        c.mode(CheckpointMode::from_flat(keys).expect("a drawn timeout and budget are above zero"))
    }

    /// Whether fault `f` is due at `step`, taking it out of the schedule.
    pub(super) fn take(&mut self, due: impl Fn(&Fault) -> bool) -> Option<Fault> {
        let i = self.faults.iter().position(due)?;
        Some(self.faults.remove(i))
    }
}
