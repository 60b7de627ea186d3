//! Deterministic simulation: a job's real tasks, operators, sinks and checkpoint coordinator,
//! run on one thread in an order drawn from a seed, against a clock the simulator moves and
//! a schedule of failures from the same seed — task failures (failover), process crashes
//! (with snapshot writes dropped or half written, `_metadata` written and not renamed, or the
//! completion notice not yet heard by every task), checkpoint files damaged or misplaced
//! while the process is down, failed snapshot writes, a directory lock taken away (fencing).
//! Each seed's committed output is compared with the failure-free (golden) run's: equal under
//! exactly-once, nothing missing under at-least-once. A seed that differs reruns bit for bit.
//! After TigerBeetle's VOPR and RisingWave's madsim.
//!
//! [`check`] runs a user's own job so; `weir simulate` runs weir's own jobs (the `weir-jobs`
//! crate's `simulated` module) through it.
//!
//! May touch: `checkpoint`, `context`, `error`, `pipeline`, `prng`, `runtime`, `sink`, `snapshot`,
//! `wake`.

use std::fmt;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::checkpoint::coordinator::{Command, CrashPoint, CrashSchedule};
use crate::checkpoint::task::{SnapshotWrite, SnapshotWriter, TaskControl};
use crate::checkpoint::{CheckpointConfig, CheckpointMode, CheckpointStorage, DirectoryLock, FinishedJob};
use crate::context::Clock;
use crate::error::{Error, Result};
use crate::pipeline::{poll_catching_panics, Job, Task, TaskPoll};
use crate::prng::Prng;
use crate::runtime::{prepare_attempt, AttemptEnv, AttemptShared, RunConfig};
use crate::sink::CommittedOutput;
use crate::snapshot::CheckpointNotice;
use crate::wake::Parker;

/// The checkpointing of a simulated job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimMode {
    /// Exactly-once, aligned barriers.
    Aligned,
    /// Exactly-once, unaligned barriers (in-flight data is stored).
    Unaligned,
    /// Exactly-once, aligned until a task has waited longer than the alignment timeout.
    AlignedTimeout,
    /// At-least-once (no alignment).
    AtLeastOnce,
    /// Exactly-once, unaligned barriers with adaptive alignment under an in-flight budget
    /// drawn from the seed.
    Adaptive,
}

impl SimMode {
    /// Every mode, in the order `weir simulate` lists them.
    pub const ALL: [SimMode; 5] =
        [SimMode::Aligned, SimMode::Unaligned, SimMode::AlignedTimeout, SimMode::AtLeastOnce, SimMode::Adaptive];

    /// Whether the output must equal the golden run's (else: nothing may be missing).
    pub fn exactly_once(self) -> bool {
        self != SimMode::AtLeastOnce
    }
}

impl fmt::Display for SimMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SimMode::Aligned => "aligned",
            SimMode::Unaligned => "unaligned",
            SimMode::AlignedTimeout => "aligned-timeout",
            SimMode::AtLeastOnce => "at-least-once",
            SimMode::Adaptive => "adaptive",
        })
    }
}

impl std::str::FromStr for SimMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        crate::error::one_of(&SimMode::ALL, s, "a simulation mode")
    }
}

/// How to simulate.
#[derive(Clone, Copy, Debug)]
pub struct SimOptions {
    /// The checkpoint mode.
    pub mode: SimMode,
    /// Incremental checkpoints.
    pub incremental: bool,
    /// Steps after which a run that has not finished counts as stuck.
    pub max_steps: u64,
    /// Also draw rescales: the process dies and the job starts again from its latest
    /// checkpoint at another parallelism (1 to 4), in a new directory, so a checkpoint's state
    /// and in-flight data are redistributed. Only for a job whose output does not depend on its
    /// parallelism.
    pub rescale: bool,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions { mode: SimMode::Aligned, incremental: false, max_steps: 3_000_000, rescale: false }
    }
}

/// A comparison of one's own: (golden, got), both sorted; `Err` says what differs.
pub type OutputCheck<T> = dyn Fn(&[T], &[T]) -> std::result::Result<(), String>;

/// How a seed's output is compared with the golden run's.
pub enum Expect<T> {
    /// The same records, as many times each (exactly-once).
    Equal,
    /// Every golden record at least once (at-least-once).
    NothingMissing,
    /// A check of one's own: `Err` says what differs.
    Custom(Box<OutputCheck<T>>),
}

impl<T: Ord + Clone + fmt::Debug> Expect<T> {
    /// What a mode promises: equal output under exactly-once, nothing missing otherwise.
    pub fn of(mode: SimMode) -> Expect<T> {
        if mode.exactly_once() {
            Expect::Equal
        } else {
            Expect::NothingMissing
        }
    }

    /// `golden` and `got` sorted.
    fn check(&self, golden: &[T], got: &[T]) -> std::result::Result<(), String> {
        match self {
            Expect::Equal => {
                if golden == got {
                    return Ok(());
                }
                let (missing, extra) = difference(golden, got);
                Err(format!(
                    "{} records instead of {}: {} missing (first {:?}), {} extra (first {:?})",
                    got.len(),
                    golden.len(),
                    missing.len(),
                    missing.first(),
                    extra.len(),
                    extra.first()
                ))
            }
            Expect::NothingMissing => {
                let (missing, _) = difference(golden, got);
                let missing: Vec<&T> = missing.into_iter().filter(|m| got.binary_search(m).is_err()).collect();
                match missing.first() {
                    None => Ok(()),
                    Some(first) => Err(format!("{} golden records missing (first {first:?})", missing.len())),
                }
            }
            Expect::Custom(f) => f(golden, got),
        }
    }
}

/// The records of sorted `a` that sorted `b` lacks, and those of `b` that `a` lacks (as
/// multisets).
fn difference<'a, T: Ord>(a: &'a [T], b: &'a [T]) -> (Vec<&'a T>, Vec<&'a T>) {
    let (mut i, mut j) = (0, 0);
    let (mut only_a, mut only_b) = (Vec::new(), Vec::new());
    while i < a.len() || j < b.len() {
        match (a.get(i), b.get(j)) {
            (Some(x), Some(y)) if x == y => {
                i += 1;
                j += 1;
            }
            (Some(x), Some(y)) if x < y => {
                only_a.push(x);
                i += 1;
            }
            (Some(_), Some(y)) | (None, Some(y)) => {
                only_b.push(y);
                j += 1;
            }
            (Some(x), None) => {
                only_a.push(x);
                i += 1;
            }
            (None, None) => unreachable!(),
        }
    }
    (only_a, only_b)
}

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
    /// Committed transactions withdrawn and computed again (damage reached a checkpoint
    /// whose output was committed).
    pub retractions: u64,
    /// Faults the schedule injected.
    pub faults: Vec<String>,
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

/// A job under simulation: its graph and where it commits its output.
pub type Simulated<T> = (Job, CommittedOutput<T>);

/// What the host program of an embedded job keeps durably: the results it handled, in order,
/// and the number of the last one (which it tells a new process's receiver,
/// [`crate::sink::EventReceiver::resume_after`]).
#[derive(Clone, Debug)]
pub struct HostLog<T> {
    /// The results handled.
    pub handled: Vec<T>,
    /// The number of the last result handled.
    pub last_seq: Option<u64>,
}

impl<T> Default for HostLog<T> {
    fn default() -> Self {
        HostLog { handled: Vec::new(), last_seq: None }
    }
}

/// The host program beside an embedded job under simulation: it feeds the job's push sources
/// and reads its pull sinks between the job's steps, never blocking, and keeps what it handled
/// in a [`HostLog`] that outlives a process. A process crash loses the host's endpoints with
/// the job: the simulator builds the job again (new endpoints, as a restarted program does)
/// and the new host goes on from the old one's log.
pub trait SimHost<T> {
    /// Sends and receives up to `budget` times, as far as it can without waiting.
    fn step(&mut self, budget: usize);
    /// The job ended cleanly (it finished, or stopped with a savepoint): takes every result
    /// still queued for the host.
    fn drain(&mut self);
    /// A host of a new process, going on from an earlier process's log.
    fn resume(&mut self, log: HostLog<T>);
    /// What it handled so far.
    fn log(&self) -> &HostLog<T>;
    /// The process ended: its log.
    fn into_log(self: Box<Self>) -> HostLog<T>;
}

/// Where a simulated job's output is compared: a transactional sink's committed output, or
/// what an embedded job's host handled.
pub enum SimOutput<T> {
    /// [`crate::Stream::collect_exactly_once`]'s output.
    Committed(CommittedOutput<T>),
    /// The host program's log.
    Host(Box<dyn SimHost<T>>),
}

impl<T> From<CommittedOutput<T>> for SimOutput<T> {
    fn from(out: CommittedOutput<T>) -> Self {
        SimOutput::Committed(out)
    }
}

/// Simulates the job `build` makes for every seed of `seeds` and compares each run's committed
/// output with the failure-free run's. `build` is called once per run and must make the same
/// job every time, its output through [`crate::Stream::collect_exactly_once`] (or a
/// [`SimHost`] beside an embedded job, which makes `build` run again for each new process);
/// its checkpointing is set by the simulator (mode from `options`, a directory of its own).
///
/// ```
/// use weir::simulation::{check, Expect, SimMode, SimOptions};
/// use weir::{source::Generator, Job};
///
/// // A running count per key: its results do not depend on how the two source subtasks'
/// // records interleave (a running sum's would), so every run can be compared.
/// let build = || {
///     let job = Job::new("counts").with_parallelism(2);
///     let out = job
///         .generator(Generator::new(|i, _| i % 5).count(200))
///         .key_by(|k: &u64| *k)
///         .aggregate(|| 0u64, |c: &mut u64, _| *c += 1, |k: &u64, c: &u64| (*k, *c))
///         .collect_exactly_once();
///     (job, out)
/// };
/// let options = SimOptions { mode: SimMode::Unaligned, ..SimOptions::default() };
/// let report = check(build, 0..20, &options, Expect::of(options.mode)).unwrap();
/// assert_eq!(report.failing().count(), 0, "{:?}", report.failing().next());
/// ```
pub fn check<T, B, O>(build: B, seeds: Range<u64>, options: &SimOptions, expect: Expect<T>) -> Result<SimReport>
where
    T: crate::Record + Ord + fmt::Debug,
    B: Fn() -> (Job, O),
    O: Into<SimOutput<T>>,
{
    if seeds.is_empty() {
        return Err(Error::config(format!(
            "the seed range {}..{} is empty (give A..B with A < B)",
            seeds.start, seeds.end
        )));
    }
    let scratch = Scratch::new()?;
    let golden = simulate(&build, None, None, options, &scratch.path.join("golden"))?;
    let golden_out = match golden.output {
        Ok(out) => out,
        Err(e) => return Err(Error::config(format!("the failure-free run of the job failed: {e}"))),
    };
    // A second failure-free run in another order: a job whose output depends on the order
    // in which its inputs interleave cannot be compared with a golden run.
    let reordered = simulate(&build, Some(u64::MAX), None, options, &scratch.path.join("reordered"))?;
    match reordered.output.map(|out| Expect::Equal.check(&golden_out, &out)) {
        Ok(Ok(())) => {}
        Ok(Err(diff)) => {
            return Err(Error::config(format!(
                "the job's output depends on the order in which its inputs interleave (two failure-free runs in \
                 different orders differ: {diff}), so no run can be compared with a golden one; make each key's \
                 records come from one source subtask, or its results independent of their order"
            )))
        }
        Err(e) => return Err(Error::config(format!("a failure-free run of the job failed: {e}"))),
    }
    let mut results = Vec::new();
    for seed in seeds {
        let dir = scratch.path.join(format!("seed-{seed}"));
        let run = simulate(&build, Some(seed), Some(&golden.stats), options, &dir)?;
        let differs = match run.output {
            Ok(out) => expect.check(&golden_out, &out).err(),
            Err(e) => Some(format!("the job failed: {e}")),
        };
        let _ = std::fs::remove_dir_all(&dir);
        results.push(SeedResult { seed, differs, stats: run.stats });
    }
    Ok(SimReport { seeds: results, golden: golden.stats, golden_records: golden_out.len() })
}

/// A folder for the runs' checkpoints, removed afterwards; in memory where the system has a
/// memory-backed `/dev/shm` (the runs fsync every checkpoint).
struct Scratch {
    path: PathBuf,
}

impl Scratch {
    fn new() -> Result<Scratch> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let shm = Path::new("/dev/shm");
        let base = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
        let path = base.join(format!("weir-sim-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::SeqCst)));
        std::fs::create_dir_all(&path).map_err(|e| Error::io("cannot create the simulation's folder", &path, e))?;
        Ok(Scratch { path })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A simulated run's output (sorted) or why the job failed, and what it went through.
struct Run<T> {
    output: std::result::Result<Vec<T>, String>,
    stats: RunStats,
}

/// The snapshot writes of a simulated attempt: queued, and run by the simulator when its
/// schedule says (in any order, or never, when the process crashes first).
struct QueuedWrites {
    queue: Mutex<Vec<SnapshotWrite>>,
    limit_writes: usize,
    /// Where the writes go (to cut a file short when the process dies mid-write).
    storage: CheckpointStorage,
}

impl SnapshotWriter for QueuedWrites {
    fn submit(&self, write: SnapshotWrite) -> std::result::Result<(), SnapshotWrite> {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() >= self.limit_writes {
            return Err(write);
        }
        q.push(write);
        Ok(())
    }

    fn limit_writes(&self) -> usize {
        self.limit_writes
    }

    fn wait_idle(&self, _limit: Duration) -> bool {
        // The simulator runs or drops every queued write itself before the attempt ends.
        true
    }
}

impl QueuedWrites {
    fn take(&self, rng: &mut Prng) -> Option<SnapshotWrite> {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.is_empty() {
            return None;
        }
        let i = rng.below(q.len() as u64) as usize;
        Some(q.swap_remove(i))
    }

    fn drain(&self) -> Vec<SnapshotWrite> {
        std::mem::take(&mut *self.queue.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// One fault of a seed's schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
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
            Fault::DamageAt { checkpoint, misplace: false } => {
                write!(f, "crash before checkpoint {checkpoint} was committed, then one of its files damaged")
            }
            Fault::DamageAt { checkpoint, misplace: true } => {
                write!(f, "crash before checkpoint {checkpoint} was committed, then one of its task files misplaced")
            }
            Fault::WriteFails(n) => write!(f, "snapshot write failure at step {n}"),
            Fault::Fence(n) => write!(f, "directory lock taken away at step {n}"),
            Fault::FailsAfterRestore(n) => write!(f, "task failure right after restore {n}"),
            Fault::StopWithSavepoint(n) => write!(f, "stop with a savepoint at step {n}, then a start from it"),
            Fault::Rescale { at, parallelism } => {
                write!(f, "crash at step {at}, then a start from the latest checkpoint at parallelism {parallelism}")
            }
            Fault::CrashMidCompletion(id) => {
                write!(f, "crash once some tasks, not all, applied checkpoint {id}'s completion")
            }
        }
    }
}

/// A seed's schedule: its faults, and the scheduler's choices.
struct Schedule {
    rng: Prng,
    faults: Vec<Fault>,
    ring_capacity: usize,
    batch_size: usize,
    interval_ns: u64,
    max_concurrent: usize,
    alignment_timeout_ns: u64,
    /// Adaptive alignment's in-flight budget: up to 16 bytes per ring slot of one channel, so
    /// never above what the rings hold.
    inflight_budget: u64,
    /// The checkpoint timeout: in half the seeds short (sim time), so checkpoints whose writes
    /// the schedule holds back expire; in the golden run and the other half too long to reach,
    /// so a checkpoint that can never complete stalls the run and is reported.
    timeout_ns: u64,
    /// A write hangs ([`Fault::HangsWrite`]): the timeout is four intervals.
    short_timeout: bool,
    /// Of 1,000 steps, how many move the clock.
    tick_per_mille: u64,
    /// Of 1,000 steps of an embedded job, how many are its host's.
    host_per_mille: u64,
    /// Of 1,000 steps, how many run a snapshot write.
    write_per_mille: u64,
}

/// Crash points armed by the schedule, asked by the coordinator.
#[derive(Default)]
struct ArmedCrashes {
    points: Mutex<Vec<(CrashPoint, u64)>>,
    /// Checkpoint of the last crash that fired, for damage faults.
    fired: Mutex<Option<(CrashPoint, u64)>>,
}

impl CrashSchedule for ArmedCrashes {
    fn crash_at(&self, point: CrashPoint, checkpoint: u64) -> bool {
        let mut points = self.points.lock().unwrap_or_else(|e| e.into_inner());
        match points.iter().position(|&p| p == (point, checkpoint)) {
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
    fn new(seed: Option<u64>, golden: Option<&RunStats>, rescale_from: Option<usize>) -> Schedule {
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
        s
    }

    /// The checkpoint configuration for a job of `subtasks` subtasks in all. A barrier's
    /// round trip takes steps in proportion to the subtasks polled on the way, so the interval
    /// grows with them (one unit per 24 subtasks): a large job at parallelism 4 would
    /// otherwise trigger each checkpoint before the last one's barriers got through, and spend
    /// its steps forwarding barriers (a storm that never reaches the step limit's end).
    fn config(&self, dir: &Path, options: &SimOptions, subtasks: usize) -> CheckpointConfig {
        let scale = subtasks.div_ceil(24).max(1) as u64;
        let timeout_ns = if self.short_timeout { 4 * self.interval_ns * scale } else { self.timeout_ns };
        let mut c = CheckpointConfig::new(dir)
            .interval(Duration::from_nanos(self.interval_ns * scale))
            .incremental(options.incremental)
            .max_concurrent(self.max_concurrent)
            .timeout(Duration::from_nanos(timeout_ns))
            // A savepoint's own timeout, twice the checkpoints': a hung write expires it in
            // simulated time too.
            .savepoint_timeout(Duration::from_nanos(2 * timeout_ns))
            .tolerable_failures(u32::MAX / 2)
            // Damage can reach a checkpoint whose output was committed (a part one checkpoint
            // reuses is the same file as the other's): recovery then falls back past it, and
            // the sink withdraws that output and computes it again, which the comparison with
            // the golden run checks. A withdrawal in a seed without damage fails the seed.
            .allow_retracting_output(true);
        c = match options.mode {
            SimMode::Aligned => c,
            SimMode::Unaligned => c.unaligned(true),
            SimMode::AlignedTimeout => {
                c.unaligned(true).alignment_timeout(Duration::from_nanos(self.alignment_timeout_ns.max(1)))
            }
            SimMode::AtLeastOnce => c.mode(CheckpointMode::AtLeastOnce),
            SimMode::Adaptive => c.unaligned(true).inflight_budget(self.inflight_budget),
        };
        c
    }

    /// Whether fault `f` is due at `step`, taking it out of the schedule.
    fn take(&mut self, due: impl Fn(&Fault) -> bool) -> Option<Fault> {
        let i = self.faults.iter().position(due)?;
        Some(self.faults.remove(i))
    }
}

/// How an attempt ended.
enum AttemptEnd {
    /// Every task finished and the job's success work ran.
    Finished,
    /// A task or the coordinator failed the job.
    Failed(Error),
    /// The process died.
    Crashed,
    /// Stopped with the savepoint in this folder, its transactions committed.
    Stopped(PathBuf),
    /// The process died, and the job is to start again at this parallelism.
    Rescaled(usize),
    /// The run did not end within this many steps.
    Stuck(u64),
}

/// The message of the task failures the simulator injects.
const INJECTED: &str = "injected failure (simulation)";

fn is_injected(e: &Error) -> bool {
    matches!(e, Error::OperatorPanicked { message, .. } if message == INJECTED)
}

/// The most restarts of one run before it counts as failed (a fault schedule has few faults;
/// more restarts mean recovery itself keeps failing).
const MAX_RESTARTS: u32 = 40;

/// Runs the job once: failure-free (`seed` None) or under seed `seed`'s schedule, whose
/// faults are placed within the golden run's steps and checkpoints.
/// Calls the job closure, a panic in it an error naming the run.
fn build_job<T, B, O>(build: &B, name: &str) -> Result<(Job, SimOutput<T>)>
where
    B: Fn() -> (Job, O),
    O: Into<SimOutput<T>>,
{
    let (job, out) = catch_unwind(AssertUnwindSafe(build)).map_err(|p| {
        Error::config(format!(
            "the job closure panicked while building the job for {name}: {}",
            crate::pipeline::panic_text(p)
        ))
    })?;
    Ok((job, out.into()))
}

/// An embedded job's new process: the program builds its job again (the host gets new
/// endpoints), runs it as the last process did (its checkpointing, restore and parallelism),
/// and its host goes on from the last one's log.
fn new_process<T, B, O>(
    build: &B,
    name: &str,
    last: &Job,
    host: Box<dyn SimHost<T>>,
) -> Result<(Job, Box<dyn SimHost<T>>)>
where
    B: Fn() -> (Job, O),
    O: Into<SimOutput<T>>,
{
    let log = host.into_log();
    let (job, out) = build_job(build, name)?;
    let SimOutput::Host(mut host) = out else {
        return Err(Error::config(format!("the job closure made a job without its host for {name}")));
    };
    {
        let old = last.graph.borrow();
        let mut graph = job.graph.borrow_mut();
        graph.checkpointing.clone_from(&old.checkpointing);
        graph.restore.clone_from(&old.restore);
        for (n, o) in graph.nodes.iter_mut().zip(&old.nodes) {
            n.parallelism = o.parallelism;
        }
    }
    host.resume(log);
    Ok((job, host))
}

fn simulate<T, B, O>(
    build: &B,
    seed: Option<u64>,
    golden: Option<&RunStats>,
    options: &SimOptions,
    dir: &Path,
) -> Result<Run<T>>
where
    T: crate::Record + Ord,
    B: Fn() -> (Job, O),
    O: Into<SimOutput<T>>,
{
    let name = seed.map_or_else(|| "the golden run".to_string(), |s| format!("seed {s}"));
    let (job, out) = build_job(build, &name)?;
    let (out, mut host) = match out {
        SimOutput::Committed(out) => (Some(out), None),
        SimOutput::Host(host) => (None, Some(host)),
    };
    // Rescales are drawn for a job whose operators share one parallelism (the rescale gives
    // them all another).
    let uniform = {
        let graph = job.graph.borrow();
        let first = graph.nodes.first().map(|n| n.parallelism);
        first.filter(|&p| graph.nodes.iter().all(|n| n.parallelism == p))
    };
    let mut schedule = Schedule::new(seed, golden, uniform.filter(|_| options.rescale));
    let subtasks = job.graph.borrow().nodes.iter().map(|n| n.parallelism).sum();
    let mut job = job.with_checkpointing(schedule.config(dir, options, subtasks));
    // A start from a savepoint continues in a directory of its own.
    let mut dir = dir.to_path_buf();
    let mut directories = vec![dir.clone()];
    if let Some(cfg) = &job.graph.borrow().checkpointing {
        cfg.validate()?;
    }
    let damages = schedule.faults.iter().any(|f| matches!(f, Fault::DamageAt { .. }));
    let mut stats = RunStats { faults: schedule.faults.iter().map(|f| f.to_string()).collect(), ..RunStats::default() };
    let crashes = Arc::new(ArmedCrashes::default());
    for f in &schedule.faults {
        match *f {
            Fault::CrashAt(point, id) => crashes.points.lock().unwrap_or_else(|e| e.into_inner()).push((point, id)),
            Fault::DamageAt { checkpoint, .. } => crashes
                .points
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((CrashPoint::BeforeCompletionNotice, checkpoint)),
            _ => {}
        }
    }
    let time = Arc::new(AtomicU64::new(0));
    let run_config =
        RunConfig::default().workers(1).ring_capacity(schedule.ring_capacity).batch_size(schedule.batch_size);
    let mut restarts = 0u32;
    let mut first_process = true;
    let result = 'processes: loop {
        // A process: it takes the directory's lock, then runs attempts until one ends the job.
        if !std::mem::take(&mut first_process) {
            if let Some(h) = host.take() {
                let (j, h) = new_process(build, &name, &job, h)?;
                job = j;
                host = Some(h);
            }
        }
        let storage = CheckpointStorage::for_job(&dir, &job.fingerprint());
        let lock = match DirectoryLock::acquire(&storage, &job.name()) {
            Ok((lock, _)) => Arc::new(lock),
            Err(e) => break Err(e.to_string()),
        };
        let shared = Arc::new(AttemptShared { lock: Some(lock.clone()), ..AttemptShared::default() });
        let checkpoint_stats = shared.stats.clone();
        loop {
            let writes = Arc::new(QueuedWrites {
                queue: Mutex::new(Vec::new()),
                limit_writes: 64,
                storage: CheckpointStorage::new(&dir),
            });
            let writer = writes.clone();
            let env = AttemptEnv {
                clock: Clock::manual(time.clone()),
                parkers: vec![Arc::new(Parker::default())],
                writer: Box::new(move |_acks| writer.clone() as Arc<dyn SnapshotWriter>),
                crash: Some(crashes.clone() as Arc<dyn CrashSchedule>),
            };
            let mut notes = Vec::new();
            let prepared = prepare_attempt(&job, &run_config, &env, &shared, &mut notes);
            let prepared = match prepared {
                Ok(p) => p,
                Err(e) => break 'processes Err(format!("the job could not start: {e}")),
            };
            let fail_soon = schedule.take(|f| *f == Fault::FailsAfterRestore(restarts)).is_some();
            let mut host_step = host.as_mut().map(|h| move |budget: usize| h.step(budget));
            let mut world = World {
                host: host_step.as_mut().map(|f| f as &mut dyn FnMut(usize)),
                schedule: &mut schedule,
                time: &time,
                writes: &writes,
                stats: &mut stats,
                max_steps: options.max_steps,
                dir: &dir,
                lock: &lock,
            };
            let end = run_attempt(prepared, &mut world, fail_soon);
            for c in checkpoint_stats.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
                stats.checkpoints += 1;
                stats.resumed += c.resumed_from.is_some() as u64;
                stats.parts_reused += c.parts.iter().filter(|p| p.reused).count() as u64;
            }
            if matches!(end, AttemptEnd::Finished | AttemptEnd::Stopped(_)) {
                if let Some(h) = host.as_mut() {
                    h.drain();
                }
            }
            match end {
                AttemptEnd::Finished => {
                    // `run_attempt` checked the lock and ran the success work; the directory
                    // is marked finished.
                    let graph = job.graph.borrow();
                    let finished = FinishedJob {
                        job: graph.name.clone(),
                        fingerprint: graph.fingerprint(),
                        description: graph.description.clone(),
                    };
                    if let Err(e) = crate::checkpoint::write_finished(&dir, &finished) {
                        break 'processes Err(e.to_string());
                    }
                    break 'processes Ok(());
                }
                AttemptEnd::Crashed => {
                    stats.crashes += 1;
                    restarts += 1;
                    let fired = crashes.fired.lock().unwrap_or_else(|e| e.into_inner()).take();
                    if let Some((CrashPoint::BeforeCompletionNotice, id)) = fired {
                        if let Some(Fault::DamageAt { misplace, .. }) =
                            schedule.take(|f| matches!(f, Fault::DamageAt { checkpoint, .. } if *checkpoint == id))
                        {
                            damage(&storage, id, misplace, &mut schedule.rng);
                        }
                    }
                    if restarts > MAX_RESTARTS {
                        break 'processes Err(format!("more than {MAX_RESTARTS} restarts"));
                    }
                    continue 'processes;
                }
                AttemptEnd::Stuck(steps) => {
                    break 'processes Err(format!(
                        "the run did not finish in {steps} steps (a livelock, or a checkpoint that can never complete)"
                    ));
                }
                AttemptEnd::Stopped(savepoint) => {
                    // The user starts the job again from the savepoint, in a new directory.
                    restarts += 1;
                    dir = dir.with_extension(format!("from-savepoint-{restarts}"));
                    directories.push(dir.clone());
                    let mut graph = job.graph.borrow_mut();
                    graph.restore = Some((savepoint, false));
                    if let Some(c) = graph.checkpointing.as_mut() {
                        c.dir = dir.clone();
                    }
                    continue 'processes;
                }
                AttemptEnd::Rescaled(parallelism) => {
                    // The user starts the job at another parallelism from its latest
                    // checkpoint (the one before, or the start, if there is none), in a new
                    // directory.
                    stats.crashes += 1;
                    restarts += 1;
                    let latest = storage.list().into_iter().rev().find(|&id| storage.is_complete(id));
                    dir = dir.with_extension(format!("rescaled-{restarts}"));
                    directories.push(dir.clone());
                    let mut graph = job.graph.borrow_mut();
                    if let Some(id) = latest {
                        graph.restore = Some((storage.checkpoint_dir(id), false));
                    }
                    for n in &mut graph.nodes {
                        n.parallelism = parallelism;
                    }
                    if let Some(c) = graph.checkpointing.as_mut() {
                        c.dir = dir.clone();
                    }
                    continue 'processes;
                }
                AttemptEnd::Failed(Error::Fenced(_)) => {
                    // Fenced: this process stops; the owner that took over goes on (a fresh
                    // process in the simulation).
                    stats.crashes += 1;
                    restarts += 1;
                    continue 'processes;
                }
                // A panic the schedule did not inject is a bug (or a broken invariant) that a
                // failover would hide: the seed fails.
                AttemptEnd::Failed(e @ Error::OperatorPanicked { .. }) if !is_injected(&e) => {
                    break 'processes Err(format!("a task panicked: {e}"));
                }
                AttemptEnd::Failed(e) if e.is_retryable() && restarts < MAX_RESTARTS => {
                    stats.failovers += 1;
                    restarts += 1;
                }
                AttemptEnd::Failed(e) => break 'processes Err(e.to_string()),
            }
        }
    };
    let retracted = out.as_ref().map_or(0, |o| o.retracted());
    let result = result.and_then(|()| match retracted {
        0 => Ok(()),
        n if damages => {
            stats.retractions += n;
            Ok(())
        }
        n => Err(format!("{n} committed transactions were withdrawn, and no checkpoint was damaged")),
    });
    let output = result.map(|()| {
        let mut records = match (&out, &host) {
            (Some(out), _) => out.records(),
            (None, Some(host)) => host.log().handled.clone(),
            (None, None) => unreachable!("a job has its output or its host"),
        };
        records.sort();
        records
    });
    for d in directories {
        let _ = std::fs::remove_dir_all(&d);
        let _ = std::fs::remove_dir_all(d.with_extension("savepoints"));
    }
    Ok(Run { output, stats })
}

/// Damages checkpoint `id` while the process is down: one byte of one of its files flipped,
/// or (`misplace`) one task file replaced by another task's.
fn damage(storage: &CheckpointStorage, id: u64, misplace: bool, rng: &mut Prng) {
    let folder = storage.checkpoint_dir(id);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&folder)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.is_file()).collect())
        .unwrap_or_default();
    files.sort();
    let tasks: Vec<&PathBuf> = files.iter().filter(|p| p.extension().is_some_and(|e| e == "state")).collect();
    if misplace && tasks.len() >= 2 {
        let a = rng.below(tasks.len() as u64) as usize;
        let b = (a + 1 + rng.below(tasks.len() as u64 - 1) as usize) % tasks.len();
        let _ = std::fs::copy(tasks[a], tasks[b]);
        return;
    }
    if files.is_empty() {
        return;
    }
    let file = &files[rng.below(files.len() as u64) as usize];
    if let Ok(mut bytes) = std::fs::read(file) {
        if !bytes.is_empty() {
            let i = rng.below(bytes.len() as u64) as usize;
            bytes[i] ^= 0x20;
            let _ = std::fs::write(file, bytes);
        }
    }
}

/// What an attempt runs in: the schedule, the clock, the writes, the figures.
struct World<'a> {
    /// An embedded job's host: takes a step (sends and receives up to so many times).
    host: Option<&'a mut dyn FnMut(usize)>,
    schedule: &'a mut Schedule,
    time: &'a Arc<AtomicU64>,
    writes: &'a QueuedWrites,
    stats: &'a mut RunStats,
    max_steps: u64,
    /// The checkpoint directory (its lock file; stop-with-savepoint writes beside it).
    dir: &'a Path,
    lock: &'a DirectoryLock,
}

/// Runs one attempt on this thread until it ends.
fn run_attempt(prepared: crate::runtime::PreparedAttempt, world: &mut World<'_>, fail_soon: bool) -> AttemptEnd {
    let World { host, schedule, time, writes, stats, max_steps, dir, lock } = world;
    // A stop with a savepoint in progress: its reply, then (id, folder) once it is taken.
    let mut stopping: Option<std::sync::mpsc::Receiver<std::result::Result<(u64, PathBuf), String>>> = None;
    let mut taken: Option<(u64, PathBuf)> = None;
    let (time, writes, max_steps) = (*time, *writes, *max_steps);
    let mut tasks: Vec<Box<dyn Task>> = prepared.tasks.into_iter().map(|(_, t)| t).collect();
    let scope = prepared.scope;
    let mut coordinator = prepared.coordinator;
    // A failure right after the restore: within the attempt's first few steps.
    let fail_at_step = fail_soon.then(|| stats.steps + schedule.rng.below(4));
    let mut failed_write_due = false;
    // Carries out the coordinator's commands; a completion notice armed for a crash schedules
    // the crash a few steps on, when some tasks have applied it (their sinks committed) and
    // others not yet.
    let deliver = |commands: Vec<Command>,
                   endpoints: &[crate::checkpoint::coordinator::TaskEndpoint],
                   schedule: &mut Schedule,
                   step: u64|
     -> Option<AttemptEnd> {
        let mut end = None;
        for c in commands {
            match c {
                Command::Send(task, msg) => {
                    if let TaskControl::Notice(CheckpointNotice::Complete(id)) = msg {
                        if schedule.take(|f| *f == Fault::CrashMidCompletion(id)).is_some() {
                            let soon = step + schedule.rng.between(1, 2 * endpoints.len() as u64);
                            schedule.faults.push(Fault::Crash(soon));
                        }
                    }
                    let _ = endpoints[task].control.send(msg);
                }
                Command::Fail(e) => end = end.or(Some(AttemptEnd::Failed(e))),
                Command::Crash(..) => return Some(AttemptEnd::Crashed),
            }
        }
        end
    };
    loop {
        stats.steps += 1;
        let step = stats.steps;
        if step > max_steps {
            return AttemptEnd::Stuck(max_steps);
        }
        if schedule.take(|f| matches!(f, Fault::Crash(n) if *n <= step)).is_some() {
            crash_writes(writes, &mut schedule.rng);
            return AttemptEnd::Crashed;
        }
        if let Some(Fault::Rescale { parallelism, .. }) =
            schedule.take(|f| matches!(f, Fault::Rescale { at, .. } if *at <= step))
        {
            crash_writes(writes, &mut schedule.rng);
            return AttemptEnd::Rescaled(parallelism);
        }
        if coordinator.is_some() && schedule.take(|f| matches!(f, Fault::Fence(n) if *n <= step)).is_some() {
            let _ = std::fs::remove_file(dir.join(crate::checkpoint::LOCK_FILE));
        }
        if schedule.take(|f| matches!(f, Fault::WriteFails(n) if *n <= step)).is_some() {
            failed_write_due = true;
        }
        if let Some(c) = coordinator.as_mut() {
            if stopping.is_none() && schedule.take(|f| matches!(f, Fault::StopWithSavepoint(n) if *n <= step)).is_some()
            {
                let (reply, answer) = std::sync::mpsc::channel();
                c.core.on_savepoint(crate::checkpoint::coordinator::SavepointRequest {
                    dir: dir.with_extension("savepoints"),
                    reply,
                    stop: true,
                });
                stopping = Some(answer);
            }
            match stopping.as_ref().map(|a| a.try_recv()) {
                Some(Ok(Ok(t))) => {
                    taken = Some(t);
                    stopping = None;
                }
                // The job is finishing (its input ended): it finishes instead, as
                // `JobHandle::stop_with_savepoint` does.
                Some(Ok(Err(_))) => stopping = None,
                _ => {}
            }
            if let Some((id, path)) = &taken {
                if c.commits.all_applied(*id, c.endpoints.len()) {
                    // Every sink committed the savepoint's transactions: stop without draining.
                    let end = AttemptEnd::Stopped(path.clone());
                    return settle(end, writes, &mut coordinator, &mut schedule.rng);
                }
            }
        }
        // Drawn only for a job with a host, so the other jobs' seeds run as they did.
        if let Some(host) = host.as_mut() {
            if schedule.rng.below(1000) < schedule.host_per_mille {
                host(schedule.rng.between(1, 8) as usize);
                continue;
            }
        }
        let roll = schedule.rng.below(1000);
        if roll < schedule.tick_per_mille {
            // The clock moves; the coordinator sees the time.
            time.fetch_add(schedule.rng.between(1, 40) * 1_000, Ordering::Relaxed);
            if let Some(c) = coordinator.as_mut() {
                let now = time.load(Ordering::Relaxed);
                let commands = c.core.on_tick(now);
                if let Some(end) = deliver(commands, &c.endpoints, schedule, step) {
                    return settle(end, writes, &mut coordinator, &mut schedule.rng);
                }
            }
            continue;
        }
        if roll < schedule.tick_per_mille + schedule.write_per_mille {
            if let Some(write) = writes.take(&mut schedule.rng) {
                let mut ack = write();
                if schedule.take(|f| *f == Fault::HangsWrite(ack.checkpoint)).is_some() {
                    // In half the seeds the process then dies as a checkpoint that may have
                    // resumed this one completes, so a restore reads the parts it reused.
                    if schedule.rng.chance(1, 2) {
                        let id = ack.checkpoint;
                        schedule.faults.extend([Fault::CrashMidCompletion(id + 1), Fault::CrashMidCompletion(id + 2)]);
                    }
                    continue;
                }
                if std::mem::take(&mut failed_write_due) {
                    ack.result = Err(Error::io(
                        "cannot write task state",
                        PathBuf::from(format!("task-{}.state", ack.task)),
                        std::io::Error::other("injected by the simulation"),
                    ));
                }
                if let Some(c) = coordinator.as_mut() {
                    let commands = c.core.on_ack(ack, time.load(Ordering::Relaxed));
                    if let Some(end) = deliver(commands, &c.endpoints, schedule, step) {
                        return settle(end, writes, &mut coordinator, &mut schedule.rng);
                    }
                }
            }
            continue;
        }
        // Declines a task sent itself reach the coordinator in the order sent.
        if let Some(c) = coordinator.as_mut() {
            while let Ok(ack) = c.acks.try_recv() {
                let commands = c.core.on_ack(ack, time.load(Ordering::Relaxed));
                if let Some(end) = deliver(commands, &c.endpoints, schedule, step) {
                    return settle(end, writes, &mut coordinator, &mut schedule.rng);
                }
            }
        }
        if tasks.is_empty() {
            // Every task finished: the job's success work (the sinks' final commits), only
            // while this process owns the directory, as in the runtime.
            if let Err(e) = lock.check() {
                return settle(AttemptEnd::Failed(e), writes, &mut coordinator, &mut schedule.rng);
            }
            return match scope.succeed() {
                Ok(()) => settle(AttemptEnd::Finished, writes, &mut coordinator, &mut schedule.rng),
                Err(e) => settle(AttemptEnd::Failed(e), writes, &mut coordinator, &mut schedule.rng),
            };
        }
        let i = schedule.rng.below(tasks.len() as u64) as usize;
        let task_fails = fail_at_step.is_some_and(|n| n <= step)
            || schedule.take(|f| matches!(f, Fault::TaskFails(n) if *n <= step)).is_some();
        if task_fails {
            let e =
                Error::OperatorPanicked { operator: tasks[i].name().to_string(), subtask: 0, message: INJECTED.into() };
            return settle(AttemptEnd::Failed(e), writes, &mut coordinator, &mut schedule.rng);
        }
        match poll_catching_panics(&mut *tasks[i]) {
            Ok(TaskPoll::Finished) => {
                scope.end.finished_tasks.fetch_add(1, Ordering::SeqCst);
                tasks.swap_remove(i);
            }
            Ok(_) => {}
            Err(e) => return settle(AttemptEnd::Failed(e), writes, &mut coordinator, &mut schedule.rng),
        }
    }
}

/// A process crash with snapshot writes queued: each is lost, or dies half written (its
/// task file cut in half, its acknowledgement never sent).
fn crash_writes(writes: &QueuedWrites, rng: &mut Prng) {
    for write in writes.drain() {
        if rng.chance(1, 2) {
            let ack = write();
            if let Ok(done) = ack.result {
                writes.storage.cut_in_half(ack.checkpoint, &done.file, done.digest.bytes);
            }
        }
    }
}

/// Ends an attempt as the runtime does: after a failure or at the end, the writes still
/// queued finish (their acknowledgements go nowhere) and the coordinator cleans up; after a
/// crash, nothing runs.
fn settle(
    end: AttemptEnd,
    writes: &QueuedWrites,
    coordinator: &mut Option<crate::runtime::PreparedCoordinator>,
    rng: &mut Prng,
) -> AttemptEnd {
    match end {
        AttemptEnd::Crashed => crash_writes(writes, rng),
        _ => {
            for write in writes.drain() {
                let _ = write();
            }
            if let Some(c) = coordinator.as_mut() {
                let _ = c.core.on_shutdown();
            }
        }
    }
    end
}
