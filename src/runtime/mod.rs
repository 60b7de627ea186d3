//! The runtime: one pinned worker thread per core, each owning and polling its tasks; the
//! [`JobHandle`] to watch, stop or cancel a running job; and [`RunConfig`].
//!
//! A worker polls its tasks round-robin and never blocks while any made progress. When none
//! did, it backs off: spins briefly, then yields, then parks with a bounded timeout until a
//! ring it reads from (or one it waits to write into) wakes it. So an idle job costs nothing
//! and many jobs can share two cores, while a busy worker never parks.
//!
//! `handle`: the [`JobHandle`] and the [`JobController`] beside it. `attempt`: preparing an
//! attempt from the checkpoint directory (shared with the simulator) and starting it on the
//! workers (`worker`). `failover`: the supervisor thread's part when an attempt ends (settle,
//! restart as the strategy allows, mark a finished job done). `readers`: the threads that read
//! keyed state's pages back ahead of their faults.
//!
//! May touch: `checkpoint` (starts the coordinator, finds the checkpoint to restore),
//! `pipeline` (the plan and tasks it runs), `sink` (waits for the host to have a pull sink's
//! results before it marks a finished job done), `snapshot` (the restored state it hands the
//! plan), `context`, `error`, `metrics`, `wake`, `state` (a job's state memory budget, and the
//! threads that read its pages ahead).

mod attempt;
mod failover;
mod handle;
mod readers;
mod worker;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::checkpoint::coordinator::{
    run_thread, CoordinatorCore, CoordinatorRequest, CoordinatorSetup, CrashSchedule, SavepointRequest,
};
use crate::checkpoint::recovery::{recover_directory, restore_from_savepoint, JobIdentity};
use crate::checkpoint::task::{CommitsApplied, PoolWriter, SnapshotWriter, DEFAULT_QUEUE_LIMIT_WRITES};
use crate::checkpoint::{
    write_finished, CheckpointConfig, CheckpointStats, CheckpointStorage, DirectoryLock, FinishedJob, RestartStrategy,
};
use crate::context::{AttemptScope, Clock, Recovery};
use crate::error::{Error, Result};
use crate::metrics::{JobMetrics, JobReport};
use crate::pipeline::{build_plan, CheckpointWiring, Job, JobControl, PlanEnv, PlanLimits};
use crate::wake::Parker;
use worker::{RunState, Worker};

/// How to run a job: workers (one pinned thread per core by default), ring capacity and
/// batch size.
///
/// ```
/// use weir::{source::Generator, Job, RunConfig};
/// let job = Job::new("small");
/// let out = job.generator(Generator::new(|i, _| i).count(1_000)).collect();
/// // Two workers, not pinned (a shared machine), smaller rings than the default.
/// job.execute(RunConfig::default().workers(2).pin_workers(false).ring_capacity(1024)).unwrap();
/// assert_eq!(out.lock().unwrap().len(), 1_000);
/// ```
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Worker threads; 0 means one per available core.
    pub workers: usize,
    /// Capacity of each ring, in entries.
    pub ring_capacity: usize,
    /// Records per batch (source polls and ring reads).
    pub batch_size: usize,
    /// Pin each worker to a core. Off by default: a program that embeds weir has threads of
    /// its own (an async runtime's, say) that pinned workers would crowd on their cores; the
    /// `weir` command and the benchmarks pin (a machine given to the job).
    pub pin_workers: bool,
    /// The memory keyed and window state may hold, in bytes (`None`: all of it stays in
    /// memory). Past it, pages leave memory for spill files in [`RunConfig::state_dir`] and
    /// come back when used (see [`crate::state::StateBudget`]).
    pub state_memory: Option<u64>,
    /// Where spill files go: by default the system's temporary folder.
    pub state_dir: Option<std::path::PathBuf>,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            workers: 0,
            ring_capacity: 4096,
            batch_size: 1024,
            pin_workers: false,
            state_memory: None,
            state_dir: None,
        }
    }
}

impl RunConfig {
    /// Sets the number of workers (0: one per core).
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers;
        self
    }
    /// Sets the ring capacity in entries.
    pub fn ring_capacity(mut self, entries: usize) -> Self {
        self.ring_capacity = entries;
        self
    }
    /// Sets the batch size in records.
    pub fn batch_size(mut self, records: usize) -> Self {
        self.batch_size = records;
        self
    }
    /// Whether to pin workers to cores (default: no; see [`RunConfig::pin_workers`]).
    pub fn pin_workers(mut self, pin: bool) -> Self {
        self.pin_workers = pin;
        self
    }

    /// Keeps keyed and window state within `bytes` of memory: past it, the pages used least
    /// recently leave memory (those changed since they were last on disk go to a spill file
    /// in [`RunConfig::state_dir`]) and come back when a record needs them.
    ///
    /// ```
    /// use weir::{source::Generator, Job, RunConfig};
    /// let job = Job::new("bounded");
    /// let counts = job
    ///     .generator(Generator::new(|i, _| i % 50_000).count(200_000))
    ///     .key_by(|k: &u64| *k)
    ///     .aggregate(|| 0u64, |n: &mut u64, _| *n += 1, |k: &u64, n: &u64| (*k, *n))
    ///     .collect();
    /// let report = job.execute(RunConfig::default().workers(1).state_memory(1 << 20)).unwrap();
    /// assert_eq!(counts.lock().unwrap().len(), 200_000);
    /// assert!(report.state_memory.unwrap().evictions > 0, "50,000 keys take more than 1 MiB");
    /// ```
    pub fn state_memory(mut self, bytes: u64) -> Self {
        self.state_memory = Some(bytes);
        self
    }

    /// Where spill files go (default: the system's temporary folder). They are scratch:
    /// unlinked as soon as they are made, so nothing is left there after the process.
    pub fn state_dir(mut self, dir: impl Into<std::path::PathBuf>) -> Self {
        self.state_dir = Some(dir.into());
        self
    }

    /// The budget [`RunConfig::state_memory`] sets, checked (`None` without one).
    fn state_budget(&self) -> Result<Option<Arc<crate::state::StateBudget>>> {
        let Some(bytes) = self.state_memory else { return Ok(None) };
        let dir = self.state_dir.clone().unwrap_or_else(std::env::temp_dir);
        crate::state::StateBudget::new(bytes, dir).map(Some)
    }

    /// The number of workers this config starts.
    pub fn effective_workers(&self) -> usize {
        if self.workers > 0 {
            self.workers
        } else {
            available_cores()
        }
    }

    fn validate(&self) -> Result<()> {
        if self.ring_capacity == 0 {
            return Err(Error::config("ring capacity must be at least 1 entry"));
        }
        if self.batch_size == 0 {
            return Err(Error::config("batch size must be at least 1 record"));
        }
        if self.workers > 4096 {
            return Err(Error::config(format!("{} workers is more than weir supports (4096)", self.workers)));
        }
        Ok(())
    }
}

/// The cores this process may use, read once per process.
///
/// NB: `core_affinity::get_core_ids` reads the *calling thread's* affinity mask, which is one
/// core once that thread is pinned; reading it once, early, keeps a pinned caller (or a job
/// started from a worker) from seeing a single core.
fn core_ids() -> &'static [core_affinity::CoreId] {
    static CORES: std::sync::OnceLock<Vec<core_affinity::CoreId>> = std::sync::OnceLock::new();
    CORES.get_or_init(|| core_affinity::get_core_ids().unwrap_or_default())
}

/// The number of cores this process may use.
pub fn available_cores() -> usize {
    match core_ids().len() {
        0 => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        n => n,
    }
}

pub use crate::checkpoint::FINISHED_MARKER;

pub(crate) use attempt::{prepare_attempt, AttemptEnv, AttemptShared, PreparedAttempt, PreparedCoordinator};
use attempt::{start_attempt, Attempt};
pub(crate) use failover::FinishedMarker;
pub use handle::{JobController, JobFailure, JobHandle, JobState, Stopped};
use handle::{RunProgress, Supervised};

/// Threads reading keyed state's pages back ahead of their faults, with a state memory budget.
const READER_THREADS: usize = 2;

/// Starts thread `name` running `f`: the engine's threads (workers, the coordinator, the
/// supervisor, the completion marker's writer) start here and nowhere else (`clippy.toml`).
#[allow(clippy::disallowed_methods)] // the runtime's threads
pub(crate) fn spawn_named<T: Send + 'static>(
    name: String,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<JoinHandle<T>> {
    std::thread::Builder::new().name(name).spawn(f)
}

impl Job {
    /// Starts the job on its worker threads.
    pub fn start(self, config: RunConfig) -> Result<JobHandle> {
        config.validate()?;
        let (checkpointing, fingerprint) = {
            let graph = self.graph.borrow();
            (graph.checkpointing.clone(), graph.fingerprint())
        };
        if let Some(cfg) = &checkpointing {
            cfg.validate()?;
        }
        let mut notes = Vec::new();
        let lock = match &checkpointing {
            Some(cfg) => {
                // The lock takes an object store's prefix over too, and brings its
                // checkpoints down.
                let storage = CheckpointStorage::of_config(cfg, &fingerprint);
                let (lock, note) = DirectoryLock::acquire(&storage, &self.name())?;
                notes.extend(note);
                Some(Arc::new(lock))
            }
            None => None,
        };
        let state_budget = config.state_budget()?;
        if let Some(b) = &state_budget {
            b.read_with(readers::ReaderPool::start(&self.name(), READER_THREADS)?);
        }
        let shared = Arc::new(AttemptShared { lock, state_budget, ..AttemptShared::default() });
        let attempt = start_attempt(&self, &config, &shared, &mut notes)?;
        let name = self.name();
        let workers = config.effective_workers();
        let run = Arc::new(Supervised {
            job: self,
            config,
            shared,
            started: crate::context::wall::now(),
            started_unix_ms: crate::context::wall::unix_ms(),
            workers,
            state: Mutex::new(RunProgress {
                attempt: Some(attempt),
                restarts: 0,
                failures: Vec::new(),
                notes,
                result: None,
                over: false,
                ended_as: None,
                last_failure: None,
            }),
            ended: std::sync::Condvar::new(),
        });
        let supervised = Arc::clone(&run);
        let supervisor = spawn_named(format!("weir-{name}-supervisor"), move || supervised.supervise())
            .map_err(|e| Error::Io { context: "cannot start the job's supervisor".into(), path: None, source: e })?;
        Ok(JobHandle { run, supervisor: Some(supervisor) })
    }

    /// Starts the job and waits for it to end.
    pub fn execute(self, config: RunConfig) -> Result<JobReport> {
        self.start(config)?.join()
    }
}
