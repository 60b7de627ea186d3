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
//! The parts: `options` (what is asked), `schedule` (the failures a seed draws), `driver`
//! (processes and attempts on one thread), `damage` (what a crash leaves on disk), and
//! `report` (what was found); this file is the embedding of a job (its output, a host
//! program beside it) and [`check`].
//!
//! May touch: `checkpoint`, `context`, `error`, `pipeline`, `prng`, `runtime`, `sink`, `snapshot`,
//! `wake`, `record`, `state` (a state memory budget for the simulated job).

mod damage;
mod driver;
mod options;
mod report;
mod schedule;

use damage::*;
use driver::*;
pub use options::{Expect, OutputCheck, SimOptions};
pub use report::{RunStats, SeedResult, SimReport};
use schedule::*;

use std::fmt;
use std::ops::Range;

use crate::error::{Error, Result};
use crate::pipeline::Job;
use crate::sink::CommittedOutput;

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
    /// Output kept outside the job, in a model of an external system that outlives a
    /// process (a transactional log), read when the run ends. Such output cannot be
    /// withdrawn: a seed whose damage makes recovery fall back past committed output ends
    /// with the sink's refusal, which is what it expects.
    Read(Box<dyn Fn() -> Vec<T>>),
}

thread_local! {
    static FAULT_SEED: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// The seed of the simulated run whose job is being built on this thread: `None` outside a
/// simulation and for its failure-free runs. A job's own model of an external system (a
/// transactional log that loses requests) draws its faults from it, so a seed replays them.
pub fn fault_seed() -> Option<u64> {
    FAULT_SEED.with(|s| s.get())
}

/// Runs `f` with [`fault_seed`] answering `seed`.
pub(crate) fn with_fault_seed<R>(seed: Option<u64>, f: impl FnOnce() -> R) -> R {
    let before = FAULT_SEED.with(|s| s.replace(seed));
    let r = f();
    FAULT_SEED.with(|s| s.set(before));
    r
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
/// use weir::checkpoint::ModeKind;
/// use weir::simulation::{check, Expect, SimOptions};
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
/// let options = SimOptions { mode: ModeKind::Unaligned, ..SimOptions::default() };
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
            // Refused as it must be: nothing to compare.
            _ if run.stats.refusals > 0 => None,
            Ok(out) => expect.check(&golden_out, &out).err(),
            Err(e) => Some(format!("the job failed: {e}")),
        };
        let _ = std::fs::remove_dir_all(&dir);
        results.push(SeedResult { seed, differs, stats: run.stats });
    }
    Ok(SimReport { seeds: results, golden: golden.stats, golden_records: golden_out.len() })
}

// Their fields are closures, shared internals or whole state: a name says enough.
crate::debug_as_name!([T] SimOutput<T>);
