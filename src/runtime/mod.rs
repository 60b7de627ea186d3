//! The runtime: one pinned worker thread per core, each owning and polling its tasks; the
//! [`JobHandle`] to watch, stop or cancel a running job; and [`RunConfig`].
//!
//! A worker polls its tasks round-robin and never blocks while any made progress. When none
//! did, it backs off: spins briefly, then yields, then parks with a bounded timeout until a
//! ring it reads from (or one it waits to write into) wakes it. So an idle job costs nothing
//! and many jobs can share two cores, while a busy worker never parks.
//!
//! May touch: `checkpoint` (starts the coordinator, finds the checkpoint to restore),
//! `pipeline` (the plan and tasks it runs), `sink` (waits for the host to have a pull sink's
//! results before it marks a finished job done), `context`, `error`, `metrics`, `wake`.

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
#[derive(Clone, Copy, Debug)]
pub struct RunConfig {
    /// Worker threads; 0 means one per available core.
    pub workers: usize,
    /// Capacity of each ring, in entries.
    pub ring_capacity: usize,
    /// Records per batch (source polls and ring reads).
    pub batch_size: usize,
    /// Pin each worker to a core.
    pub pin_workers: bool,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig { workers: 0, ring_capacity: 4096, batch_size: 1024, pin_workers: true }
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
    /// Whether to pin workers to cores.
    pub fn pin_workers(mut self, pin: bool) -> Self {
        self.pin_workers = pin;
        self
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

/// What outlives attempts: checkpoint ids and failure reasons.
#[derive(Default)]
pub(crate) struct AttemptShared {
    pub(crate) next_checkpoint: Arc<std::sync::atomic::AtomicU64>,
    /// Stop and cancel flags.
    pub(crate) control: Arc<JobControl>,
    pub(crate) metrics: Arc<JobMetrics>,
    /// Statistics of the checkpoints completed.
    pub(crate) stats: Arc<Mutex<crate::metrics::CheckpointHistory>>,
    pub(crate) checkpoint_failures: Arc<Mutex<Vec<String>>>,
    /// The checkpoint directory's lock, held for the job's life.
    pub(crate) lock: Option<Arc<DirectoryLock>>,
    /// A checkpoint configuration changed on the running job (or several taking turns), for
    /// the coordinator running now (later attempts read the job's own, changed too).
    pub(crate) checkpoint_update: Arc<Mutex<Option<Vec<CheckpointConfig>>>>,
}

/// One attempt of a job: its workers and, with checkpointing, its coordinator. A failover
/// ends the attempt and starts a new one from the latest checkpoint.
struct Attempt {
    threads: Vec<JoinHandle<()>>,
    state: Arc<RunState>,
    parkers: Vec<Arc<Parker>>,
    scope: Arc<AttemptScope>,
    coordinator: Option<(JoinHandle<()>, Arc<AtomicBool>)>,
    /// Savepoints and checkpoints asked for from outside go to the coordinator here.
    requests: Option<std::sync::mpsc::Sender<CoordinatorRequest>>,
    /// Which tasks applied which checkpoint's completion (with checkpointing).
    commits: Option<Arc<CommitsApplied>>,
    /// Tasks in the attempt.
    task_count: usize,
    /// Worker threads that have exited (however they ended).
    exited: Arc<std::sync::atomic::AtomicUsize>,
}

/// A view of a running job beside its [`JobHandle`] ([`JobHandle::controller`]), cheap to
/// clone and to share between threads: what a control endpoint or a dashboard asks of a job.
#[derive(Clone)]
pub struct JobController {
    run: Arc<Supervised>,
}

impl std::fmt::Debug for JobController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobController").field("job", &self.name()).finish_non_exhaustive()
    }
}

// A control endpoint's threads share the controller: checked when the crate compiles.
const _: fn() = || {
    fn shared<T: Send + Sync + Clone>() {}
    shared::<JobController>();
};

impl JobController {
    fn progress(&self) -> std::sync::MutexGuard<'_, RunProgress> {
        self.run.progress()
    }

    /// The job's name.
    pub fn name(&self) -> String {
        self.run.job.graph.borrow().name.clone()
    }

    /// The checkpoint configuration in force, if the job takes checkpoints.
    pub fn checkpoint_config(&self) -> Option<CheckpointConfig> {
        self.run.job.graph.borrow().checkpointing.clone()
    }

    /// Live metrics.
    pub fn metrics(&self) -> &Arc<JobMetrics> {
        &self.run.shared.metrics
    }

    /// Time since the job started.
    pub fn elapsed(&self) -> std::time::Duration {
        self.run.started.elapsed()
    }

    /// Restarts so far.
    pub fn restarts(&self) -> u32 {
        self.progress().restarts
    }

    /// Whether the job has ended for good.
    pub fn is_finished(&self) -> bool {
        self.progress().over
    }

    /// Workers the job runs on.
    pub fn workers(&self) -> usize {
        self.run.workers
    }

    /// Takes a savepoint now: an aligned checkpoint, copied complete into
    /// `<dir>/savepoint-<id>/`, and returns that folder. The job goes on. Needs checkpointing
    /// (the savepoint is written through the checkpoint coordinator).
    pub fn trigger_savepoint(&self, dir: impl Into<std::path::PathBuf>) -> Result<std::path::PathBuf> {
        self.take_savepoint(dir, false).map(|(_, path)| path)
    }

    /// Takes a checkpoint now, as the configuration makes them, however long since the last
    /// (Flink's `flink checkpoint`), and waits for it: its id once it completed, or why it
    /// failed. The job goes on either way.
    pub fn trigger_checkpoint(&self) -> Result<u64> {
        self.checkpoint_now(false)
    }

    /// Takes a full checkpoint now (Flink's `flink checkpoint --full`): with incremental
    /// checkpoints, every task writes all its state and refers to nothing in earlier
    /// checkpoints, so the chain of references starts again from it (and retention can drop
    /// the files only older checkpoints needed). Without, the same as
    /// [`JobController::trigger_checkpoint`].
    pub fn trigger_full_checkpoint(&self) -> Result<u64> {
        self.checkpoint_now(true)
    }

    fn checkpoint_now(&self, full: bool) -> Result<u64> {
        let timeout = match &self.run.job.graph.borrow().checkpointing {
            Some(c) => c.checkpoint_timeout,
            None => return Err(Error::config("the job takes no checkpoints: configure it with with_checkpointing")),
        };
        // It may wait for a checkpoint in flight to make room, and then takes its own timeout.
        let wait = timeout * 2 + Duration::from_secs(10);
        self.ask_coordinator("checkpoint", wait, "two checkpoint timeouts", |reply| CoordinatorRequest::Checkpoint {
            reply,
            full,
        })
    }

    /// Takes a savepoint into `dir` (a stop with a savepoint if `stop`): its checkpoint id and
    /// folder.
    pub(crate) fn take_savepoint(
        &self,
        dir: impl Into<std::path::PathBuf>,
        stop: bool,
    ) -> Result<(u64, std::path::PathBuf)> {
        let timeout = match &self.run.job.graph.borrow().checkpointing {
            Some(c) => c.savepoint_timeout,
            None => {
                return Err(Error::config("savepoints need checkpointing: configure the job with with_checkpointing"))
            }
        };
        let dir = dir.into();
        self.check_savepoint_folder(&dir)?;
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("cannot create the savepoint directory", &dir, e))?;
        // The coordinator answers within the savepoint's timeout (it expires it then); the
        // margin covers writing the savepoint's copy.
        let wait = timeout + Duration::from_secs(60);
        self.ask_coordinator("savepoint", wait, "its timeout, and a minute to copy it", |reply| {
            CoordinatorRequest::Savepoint(SavepointRequest { dir, reply, stop })
        })
    }

    /// Refuses savepoint folder `dir` where it overlaps a sink's output folder (one inside the
    /// other: savepoint files among committed output are malformed output for a reader), or is
    /// the job's checkpoint directory or holds it (the directory is the job's own; a folder
    /// inside it, as `chk/savepoints`, is a place of its own). Every savepoint is checked so;
    /// a caller that makes the folder first checks before.
    pub fn check_savepoint_folder(&self, dir: &std::path::Path) -> Result<()> {
        let resolve = |p: &std::path::Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        let graph = self.run.job.graph.borrow();
        let owned = graph
            .checkpointing
            .iter()
            .map(|c| ("checkpoint directory", c.dir.as_path(), false))
            .chain(graph.sink_outputs.iter().map(|(_, out)| ("output folder", out.as_path(), true)));
        let wanted = resolve(dir);
        for (what, path, not_inside) in owned {
            let path = resolve(path);
            if path.starts_with(&wanted) || (not_inside && wanted.starts_with(&path)) {
                return Err(Error::config(format!(
                    "savepoint folder {} overlaps the job's {what} {} (it is, holds or is inside it): a \
                     savepoint goes elsewhere",
                    dir.display(),
                    path.display()
                )));
            }
        }
        Ok(())
    }

    /// Hands the running attempt's coordinator the request `request` makes of a reply channel,
    /// and waits at most `wait` (`why_so_long`, for the message) for the answer; `what` (a
    /// checkpoint, a savepoint) names it in errors.
    fn ask_coordinator<R>(
        &self,
        what: &str,
        wait: Duration,
        why_so_long: &str,
        request: impl FnOnce(std::sync::mpsc::Sender<std::result::Result<R, String>>) -> CoordinatorRequest,
    ) -> Result<R> {
        let sender = self.progress().attempt.as_ref().and_then(|a| a.requests.clone()).ok_or_else(|| {
            Error::Checkpoint(format!("the {what} failed: the job is not running (it ended, or is restarting)"))
        })?;
        let (reply, answer) = std::sync::mpsc::channel();
        sender
            .send(request(reply))
            .map_err(|_| Error::Checkpoint(format!("the job ended before the {what} was taken")))?;
        match answer.recv_timeout(wait) {
            Ok(Ok(taken)) => Ok(taken),
            Ok(Err(reason)) => Err(Error::Checkpoint(format!("the {what} failed: {reason}"))),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(Error::Checkpoint(format!(
                "the {what} failed: the job ended (it failed, or was cancelled) before the {what} completed"
            ))),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                Err(Error::Checkpoint(format!("the {what} failed: no answer within {wait:?} ({why_so_long})")))
            }
        }
    }

    /// Changes the checkpoint configuration of the running job: `change` gets the one in force
    /// and returns the new one, which applies to the checkpoints triggered from the next
    /// coordinator tick on (and after a restart). What a running job can change: interval,
    /// interval during backlog, checkpoint timeout, minimum pause, concurrent checkpoints,
    /// tolerable failures, checkpoints retained, the restart strategy, and how barriers go
    /// (unaligned, the aligned-checkpoint timeout, the in-flight budget). A change to anything
    /// else (mode, incremental, directory, allow_retracting_output) or an invalid configuration
    /// is refused with an error naming it, and the job keeps its configuration. Each
    /// checkpoint's statistics record the configuration it ran under.
    ///
    /// ```no_run
    /// # fn f(handle: &weir::JobHandle) -> weir::Result<()> {
    /// use std::time::Duration;
    /// handle.update_checkpoints(|c| c.interval(Duration::from_secs(5)))?;
    /// # Ok(()) }
    /// ```
    pub fn update_checkpoints(&self, change: impl FnOnce(CheckpointConfig) -> CheckpointConfig) -> Result<()> {
        let mut graph = self.run.job.graph.borrow_mut();
        let Some(current) = graph.checkpointing.clone() else {
            return Err(Error::config("the job takes no checkpoints: there is no checkpoint configuration to change"));
        };
        let new = change(current.clone());
        current.check_live_change(&new)?;
        graph.checkpointing = Some(new.clone());
        *self.run.shared.checkpoint_update.lock().unwrap_or_else(|e| e.into_inner()) = Some(vec![new]);
        Ok(())
    }

    /// Checkpoint configurations taking turns, one checkpoint each: the coordinator takes the
    /// next one as it triggers each checkpoint (savepoints excepted), so consecutive checkpoints
    /// run under consecutive configurations however fast they come. The checkpoint lab uses it
    /// to compare ways of taking barriers under the load of the same moments. Each is a change
    /// [`JobController::update_checkpoints`] accepts; the next change ends the turns, and so
    /// does a restart (its attempt takes the first).
    ///
    /// ```no_run
    /// # fn f(handle: &weir::JobHandle) -> weir::Result<()> {
    /// use weir::checkpoint::CheckpointMode;
    /// handle.checkpoints_in_turn(|c| vec![c.clone().mode(CheckpointMode::Aligned), c.mode(CheckpointMode::Unaligned)])?;
    /// # Ok(()) }
    /// ```
    pub fn checkpoints_in_turn(&self, turns: impl FnOnce(CheckpointConfig) -> Vec<CheckpointConfig>) -> Result<()> {
        let mut graph = self.run.job.graph.borrow_mut();
        let Some(current) = graph.checkpointing.clone() else {
            return Err(Error::config("the job takes no checkpoints: there is no checkpoint configuration to change"));
        };
        let turns = turns(current.clone());
        let Some(first) = turns.first() else {
            return Err(Error::config("checkpoints in turn: no configuration given"));
        };
        for t in &turns {
            current.check_live_change(t)?;
        }
        graph.checkpointing = Some(first.clone());
        *self.run.shared.checkpoint_update.lock().unwrap_or_else(|e| e.into_inner()) = Some(turns);
        Ok(())
    }

    /// The newest checkpoint whose completion every task of the running attempt applied: its
    /// sinks committed the output it covers, and its sources learned it
    /// ([`crate::source::Source::checkpoint_complete`]). Offsets a source hands to the outside
    /// (a Kafka consumer group's) are safe to publish up to it. `None` before the first, and
    /// while the job restarts.
    pub fn applied_checkpoint(&self) -> Option<u64> {
        let progress = self.progress();
        let attempt = progress.attempt.as_ref()?;
        attempt.commits.as_ref()?.newest_everywhere(attempt.task_count)
    }

    /// Statistics of the checkpoints completed so far: the newest
    /// [`crate::metrics::HISTORY_KEPT`].
    pub fn checkpoint_stats(&self) -> Vec<CheckpointStats> {
        self.run.checkpoint_stats()
    }

    /// Checkpoints completed so far, in all.
    pub fn checkpoints_completed(&self) -> u64 {
        self.run.checkpoints_completed()
    }

    /// The newest completed checkpoint's statistics (without copying the others).
    pub fn last_checkpoint(&self) -> Option<CheckpointStats> {
        self.run.last_checkpoint()
    }

    /// Messages about recovery (restarts, restored checkpoints, damaged ones skipped), oldest
    /// first, including those of the attempt running now.
    pub fn notes(&self) -> Vec<String> {
        let progress = self.progress();
        let mut notes = progress.notes.clone();
        if let Some(a) = &progress.attempt {
            notes.extend(a.scope.notes.lock().unwrap_or_else(|e| e.into_inner()).iter().cloned());
        }
        notes
    }

    /// Why checkpoints failed (declined, expired, failed to write), oldest first.
    pub fn checkpoint_failures(&self) -> Vec<String> {
        self.run.shared.checkpoint_failures.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// How [`JobHandle::stop_with_savepoint`] ended the job.
#[derive(Debug)]
pub enum Stopped {
    /// A savepoint was taken, its sink transactions committed, and the job stopped: a job
    /// restored from it goes on where this one stopped.
    Savepoint(std::path::PathBuf),
    /// The job's input had already ended (its final checkpoint completed), so no savepoint
    /// could be taken: the job was stopped gracefully instead and finished, committing all its
    /// output.
    Finished(JobReport),
}

impl Stopped {
    /// The savepoint's folder, if one was taken.
    pub fn savepoint(self) -> Option<std::path::PathBuf> {
        match self {
            Stopped::Savepoint(path) => Some(path),
            Stopped::Finished(_) => None,
        }
    }
}

/// A running job.
///
/// With checkpointing, a failing task fails the job over: every task stops, and the job
/// restarts from its latest complete checkpoint under the restart strategy. Failover is the
/// runtime's: a supervisor thread of the job's own watches each attempt and starts the next,
/// whether or not anyone waits on the handle (an embedded job whose host only sends and
/// receives recovers like any). When the job ends for good, its embedding endpoints hear it
/// ([`crate::source::SendError::Ended`], [`crate::sink::RecvError::Ended`]).
///
/// ```
/// use weir::{source::Generator, Job, RunConfig};
/// let job = Job::new("endless");
/// // An unbounded generator: the job runs until it is stopped.
/// job.generator(Generator::new(|i, _| i)).discard();
/// let handle = job.start(RunConfig::default().workers(1)).unwrap();
/// handle.stop(); // sources end their streams; what is in flight drains to the sinks
/// let report = handle.join().unwrap();
/// assert_eq!(report.restarts, 0);
/// ```
pub struct JobHandle {
    run: Arc<Supervised>,
    supervisor: Option<JoinHandle<()>>,
}

/// What the handle and the supervisor thread share.
struct Supervised {
    job: Job,
    config: RunConfig,
    shared: Arc<AttemptShared>,
    started: Instant,
    workers: usize,
    state: Mutex<RunProgress>,
    /// Signalled when the job ended for good.
    ended: std::sync::Condvar,
}

/// How far the job has got, under [`Supervised::state`].
struct RunProgress {
    /// The attempt running now (none while the next one starts, and after the end).
    attempt: Option<Attempt>,
    restarts: u32,
    /// When each failure that asked for a restart happened (for the failure-rate strategy);
    /// those older than an hour are dropped, longer than any interval a job is given.
    failures: Vec<Instant>,
    notes: Vec<String>,
    /// The job's result, once it ended for good, until it is handed out.
    result: Option<Result<JobReport>>,
    /// Whether the job ended for good.
    over: bool,
}

impl std::fmt::Debug for JobHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobHandle")
            .field("finished", &self.is_finished())
            .field("restarts", &self.restarts())
            .finish_non_exhaustive()
    }
}

impl JobHandle {
    fn progress(&self) -> std::sync::MutexGuard<'_, RunProgress> {
        self.run.progress()
    }

    /// Ends the sources' streams: the job processes what is in flight, fires its windows, and
    /// finishes normally.
    pub fn stop(&self) {
        self.run.shared.control.stop.store(true, Ordering::SeqCst);
        self.wake_all();
    }

    /// Stops every worker at once; [`JobHandle::join`] then returns [`Error::Cancelled`].
    pub fn cancel(&self) {
        self.run.shared.control.cancel.store(true, Ordering::SeqCst);
        self.wake_all();
    }

    fn wake_all(&self) {
        if let Some(a) = &self.progress().attempt {
            for p in &a.parkers {
                p.unpark_now();
            }
        }
    }

    /// Whether the job has ended for good (finished, failed past its restart strategy, or
    /// cancelled): [`JobHandle::try_finish`] then returns its result. Failovers happen on
    /// their own meanwhile.
    pub fn is_finished(&self) -> bool {
        self.controller().is_finished()
    }

    /// Live metrics.
    pub fn metrics(&self) -> &Arc<JobMetrics> {
        &self.run.shared.metrics
    }

    /// Time since the job started.
    pub fn elapsed(&self) -> std::time::Duration {
        self.controller().elapsed()
    }

    /// Restarts so far.
    pub fn restarts(&self) -> u32 {
        self.controller().restarts()
    }

    /// Whether the current attempt is finishing: its final checkpoint started (every source
    /// is at the end of its input) or completed and the sources are ending their streams (or,
    /// without checkpointing, a task has finished); no savepoint can be taken any more.
    pub fn is_finishing(&self) -> bool {
        self.progress().attempt.as_ref().is_some_and(|a| {
            let end = &a.scope.end;
            end.input_ended.load(Ordering::SeqCst)
                || end.final_started.load(Ordering::SeqCst)
                || end.finished_tasks.load(Ordering::SeqCst) > 0
        })
    }

    /// Takes a savepoint, waits until every sink has committed the transactions it covers,
    /// then stops every worker without draining (no further output after the savepoint; a job
    /// restored from it produces that). If the job is already finishing
    /// ([`JobHandle::is_finishing`]), it is stopped gracefully and finishes instead. Says which
    /// it did.
    pub fn stop_with_savepoint(self, dir: impl Into<std::path::PathBuf>) -> Result<Stopped> {
        let (id, path) = match self.controller().take_savepoint(dir, true) {
            Ok(taken) => taken,
            Err(_) if self.is_finishing() => {
                self.stop();
                return self.join().map(Stopped::Finished);
            }
            Err(e) => return Err(e),
        };
        let waiting = self
            .progress()
            .attempt
            .as_ref()
            .and_then(|a| a.commits.clone().map(|c| (c, a.task_count, a.exited.clone(), a.parkers.len())));
        if let Some((commits, tasks, exited, workers)) = waiting {
            let timeout =
                self.run.job.graph.borrow().checkpointing.as_ref().map_or(Duration::ZERO, |c| c.checkpoint_timeout);
            let ended = || exited.load(Ordering::SeqCst) >= workers;
            if !commits.wait(id, tasks, ended, timeout) {
                self.cancel();
                let _ = self.join();
                return Err(Error::Checkpoint(format!(
                    "savepoint {} was taken, and its sink transactions were not all committed within {timeout:?}; \
                     they are committed when a job restores from it",
                    path.display()
                )));
            }
        }
        self.cancel();
        match self.join() {
            Ok(_) | Err(Error::Cancelled) => Ok(Stopped::Savepoint(path)),
            Err(e) => Err(e),
        }
    }

    /// A view of the running job that others may hold beside this handle (a control
    /// endpoint, a dashboard): checkpoints and savepoints on demand, the live configuration,
    /// statistics and metrics. It outlives the job harmlessly (then it answers that the job is
    /// not running).
    pub fn controller(&self) -> JobController {
        JobController { run: self.run.clone() }
    }

    /// Takes a savepoint now ([`JobController::trigger_savepoint`]).
    pub fn trigger_savepoint(&self, dir: impl Into<std::path::PathBuf>) -> Result<std::path::PathBuf> {
        self.controller().trigger_savepoint(dir)
    }

    /// Takes a checkpoint now ([`JobController::trigger_checkpoint`]).
    pub fn trigger_checkpoint(&self) -> Result<u64> {
        self.controller().trigger_checkpoint()
    }

    /// Takes a full checkpoint now ([`JobController::trigger_full_checkpoint`]).
    pub fn trigger_full_checkpoint(&self) -> Result<u64> {
        self.controller().trigger_full_checkpoint()
    }

    /// Changes the checkpoint configuration of the running job
    /// ([`JobController::update_checkpoints`]).
    pub fn update_checkpoints(&self, change: impl FnOnce(CheckpointConfig) -> CheckpointConfig) -> Result<()> {
        self.controller().update_checkpoints(change)
    }

    /// Checkpoint configurations taking turns, one checkpoint each
    /// ([`JobController::checkpoints_in_turn`]).
    pub fn checkpoints_in_turn(&self, turns: impl FnOnce(CheckpointConfig) -> Vec<CheckpointConfig>) -> Result<()> {
        self.controller().checkpoints_in_turn(turns)
    }

    /// The newest checkpoint every task applied ([`JobController::applied_checkpoint`]).
    pub fn applied_checkpoint(&self) -> Option<u64> {
        self.controller().applied_checkpoint()
    }

    /// Statistics of the checkpoints completed so far ([`JobController::checkpoint_stats`]).
    pub fn checkpoint_stats(&self) -> Vec<CheckpointStats> {
        self.run.checkpoint_stats()
    }

    /// Checkpoints completed so far, in all.
    pub fn checkpoints_completed(&self) -> u64 {
        self.run.checkpoints_completed()
    }

    /// Messages about recovery ([`JobController::notes`]).
    pub fn notes(&self) -> Vec<String> {
        self.controller().notes()
    }

    /// Why checkpoints failed (declined, expired, failed to write), oldest first.
    pub fn checkpoint_failures(&self) -> Vec<String> {
        self.controller().checkpoint_failures()
    }

    /// The job's result once it has ended for good (returned once); `None` while it runs or
    /// restarts.
    pub fn try_finish(&mut self) -> Option<Result<JobReport>> {
        self.progress().result.take()
    }

    /// Waits for the job to end, restarting it after failures as configured.
    pub fn join(mut self) -> Result<JobReport> {
        self.wait()
    }

    /// Waits for the job to end like [`JobHandle::join`], keeping the handle (for its notes and
    /// statistics afterwards).
    pub fn wait(&mut self) -> Result<JobReport> {
        let mut progress = self.progress();
        if progress.over && progress.result.is_none() {
            return Err(Error::config("the job has already ended (its result was returned once)"));
        }
        while progress.result.is_none() {
            progress = self.run.ended.wait(progress).unwrap_or_else(|e| e.into_inner());
        }
        progress.result.take().expect("waited for it")
    }
}

impl Drop for JobHandle {
    fn drop(&mut self) {
        // A handle dropped before the job ended cancels it; the supervisor ends it (and tells
        // its hosts).
        if !self.is_finished() {
            self.cancel();
        }
        if let Some(t) = self.supervisor.take() {
            let _ = t.join();
        }
    }
}

impl Supervised {
    fn progress(&self) -> std::sync::MutexGuard<'_, RunProgress> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn checkpoint_stats(&self) -> Vec<CheckpointStats> {
        self.shared.stats.lock().unwrap_or_else(|e| e.into_inner()).stats()
    }

    fn checkpoints_completed(&self) -> u64 {
        self.shared.stats.lock().unwrap_or_else(|e| e.into_inner()).completed()
    }

    fn last_checkpoint(&self) -> Option<CheckpointStats> {
        self.shared.stats.lock().unwrap_or_else(|e| e.into_inner()).last()
    }

    /// The supervisor thread: waits for each attempt's workers to exit, then restarts the job
    /// or records its result, until it has ended for good.
    fn supervise(&self) {
        loop {
            let (threads, coordinator) = {
                let mut progress = self.progress();
                let Some(a) = progress.attempt.as_mut() else { return };
                (std::mem::take(&mut a.threads), a.coordinator.take())
            };
            let mut worker_panicked = false;
            for t in threads {
                // Workers catch every panic of their tasks; a panic here is a worker bug.
                worker_panicked |= t.join().is_err();
            }
            if let Some((t, shutdown)) = coordinator {
                shutdown.store(true, Ordering::SeqCst);
                let _ = t.join();
            }
            let attempt = {
                let mut progress = self.progress();
                let a = progress.attempt.take().expect("only the supervisor takes the attempt");
                if worker_panicked {
                    a.state.fail(Error::config("a worker thread panicked outside any task"));
                }
                progress.notes.append(&mut a.scope.notes.lock().unwrap_or_else(|e| e.into_inner()));
                a
            };
            match self.settle(attempt) {
                Some(result) => {
                    // Over before the hosts hear it: a host that saw `Ended` finds the handle
                    // finished.
                    let error = result.as_ref().err().map(|e| e.to_string());
                    {
                        let mut progress = self.progress();
                        progress.result = Some(result);
                        progress.over = true;
                    }
                    for s in &self.job.graph.borrow().host_signals {
                        s.job_ended(error.clone());
                    }
                    self.ended.notify_all();
                    return;
                }
                None => continue,
            }
        }
    }

    /// Ends attempt `a`, whose workers exited: starts the next one when its failure allows a
    /// restart (returns `None`), or returns the job's result.
    fn settle(&self, a: Attempt) -> Option<Result<JobReport>> {
        if let Some(e) = a.state.take_error() {
            let restarts = self.progress().restarts;
            let strategy = self.job.graph.borrow().checkpointing.as_ref().map(|c| c.restart);
            let (mut e, mut restarts) = (e, restarts);
            // A restart whose start fails retryably (a sink's restore that met a lost
            // request) is a failure like any other: the strategy decides whether to go on.
            loop {
                let cancelled = self.shared.control.cancel.load(Ordering::SeqCst);
                let failures_ago =
                    RestartStrategy::remember_failure(strategy.as_ref(), &mut self.progress().failures, Instant::now());
                let delay = strategy.and_then(|s| s.delay(restarts, &failures_ago));
                let Some(delay) = delay.filter(|_| e.is_retryable() && !cancelled) else { return Some(Err(e)) };
                tracing::warn!(job = %self.job.graph.borrow().name, restart = restarts + 1, cause = %e, "job restarts");
                self.progress().notes.push(format!("restart {} after: {e}", restarts + 1));
                std::thread::sleep(delay);
                let mut notes = Vec::new();
                let next = start_attempt(&self.job, &self.config, &self.shared, &mut notes);
                let mut progress = self.progress();
                progress.restarts += 1;
                restarts = progress.restarts;
                progress.notes.append(&mut notes);
                match next {
                    Ok(next) => {
                        progress.attempt = Some(next);
                        if self.shared.control.cancel.load(Ordering::SeqCst) {
                            // Cancelled while it started: stop it at once.
                            for p in &progress.attempt.as_ref().expect("just set").parkers {
                                p.unpark_now();
                            }
                        }
                        return None;
                    }
                    Err(next) => e = next,
                }
            }
        }
        if !a.state.completed() {
            return Some(Err(Error::Cancelled));
        }
        // The sinks' last commits, like every commit, only while this process owns the
        // checkpoint directory.
        if let Some(Err(e)) = self.shared.lock.as_ref().map(|l| l.check()) {
            return Some(Err(e));
        }
        if let Err(e) = a.scope.succeed() {
            return Some(Err(e));
        }
        let graph = self.job.graph.borrow();
        if let Some(cfg) = &graph.checkpointing {
            // A rerun with the same directory must not silently redo (or resume) a finished job;
            // but a job whose host has not taken all its results yet is not finished for the
            // host: the marker waits for them (a host killed while it drains reruns the job).
            let stored = cfg.store.clone().map(crate::checkpoint::CheckpointMirror::new);
            let marker = FinishedMarker::of(&graph, cfg.dir.clone(), stored, self.shared.lock.clone());
            if let Err(e) = marker.write_when_delivered(&graph.host_deliveries) {
                return Some(Err(e));
            }
        }
        drop(graph);
        Some(Ok(JobReport {
            source_records: self.shared.metrics.source_records(),
            sink_records: self.shared.metrics.sink_records(),
            late_records: self.shared.metrics.late_records(),
            elapsed: a.state.ended_at().map_or_else(|| self.started.elapsed(), |t| t - self.started),
            workers: self.workers,
            latency_ns: self.shared.metrics.latency(),
            latency_by_cause: self.shared.metrics.latency_by_cause(),
            checkpoints: self.checkpoint_stats(),
            checkpoints_completed: self.checkpoints_completed(),
            restarts: self.progress().restarts,
        }))
    }
}

/// The completion marker of a finished checkpointed job, and where it goes.
pub(crate) struct FinishedMarker {
    dir: std::path::PathBuf,
    finished: FinishedJob,
    stored: Option<crate::checkpoint::CheckpointMirror>,
    /// Held until the marker is written: the directory is this process's until then.
    lock: Option<Arc<DirectoryLock>>,
}

impl FinishedMarker {
    /// The marker of `graph`'s job, for directory `dir` (and the store beside it).
    pub(crate) fn of(
        graph: &crate::pipeline::Graph,
        dir: std::path::PathBuf,
        stored: Option<crate::checkpoint::CheckpointMirror>,
        lock: Option<Arc<DirectoryLock>>,
    ) -> FinishedMarker {
        let finished = FinishedJob {
            job: graph.name.clone(),
            fingerprint: graph.fingerprint(),
            description: graph.description.clone(),
        };
        FinishedMarker { dir, finished, stored, lock }
    }

    /// Writes the marker now when the job has no host to deliver to, else once the host has
    /// every result ([`FinishedMarker::when_delivered`]).
    pub(crate) fn write_when_delivered(self, deliveries: &[Arc<dyn crate::sink::HostDelivery>]) -> Result<()> {
        if deliveries.is_empty() {
            self.write()
        } else {
            self.when_delivered(deliveries);
            Ok(())
        }
    }

    fn write(&self) -> Result<()> {
        if let Some(lock) = &self.lock {
            lock.check()?;
        }
        write_finished(&self.dir, &self.finished)?;
        self.stored.as_ref().map_or(Ok(()), |m| m.publish_finished(&self.dir))
    }

    /// Writes the marker once every one of `deliveries` has its results delivered to the host,
    /// on the thread of the host's last receive or acknowledgement. The write runs on a thread
    /// of its own (the object store's client must not run inside the host's async runtime) and
    /// the host's call waits for it, so once the host has its last result the marker is there.
    fn when_delivered(self, deliveries: &[Arc<dyn crate::sink::HostDelivery>]) {
        let left = Arc::new(std::sync::atomic::AtomicUsize::new(deliveries.len()));
        let marker = Arc::new(Mutex::new(Some(self)));
        for d in deliveries {
            let (left, marker) = (left.clone(), marker.clone());
            d.when_delivered(Box::new(move || {
                if left.fetch_sub(1, Ordering::AcqRel) != 1 {
                    return;
                }
                let Some(marker) = marker.lock().unwrap_or_else(|e| e.into_inner()).take() else { return };
                let written = std::thread::Builder::new()
                    .name("weir-finished".into())
                    .spawn(move || marker.write().map_err(|e| e.to_string()))
                    .map_err(|e| e.to_string())
                    .and_then(|t| t.join().unwrap_or_else(|_| Err("its writer panicked".into())));
                if let Err(e) = written {
                    tracing::warn!(error = %e, "the finished job's completion marker was not written: a rerun runs it again from its latest checkpoint");
                }
            }));
        }
    }
}

/// What the job looks like to recovery.
fn identity<'a>(graph: &'a crate::pipeline::Graph, fingerprint: &'a str) -> JobIdentity<'a> {
    JobIdentity {
        name: &graph.name,
        fingerprint,
        operators: graph.nodes.iter().map(|n| &*n.name).collect(),
        restore: graph.restore.as_ref().map(|(p, allow)| (p.as_path(), *allow)),
        announce: graph.on_restore.as_deref().unwrap_or(&say_nothing),
        outputs: sink_outputs(graph),
    }
}

/// Where the graph's sinks write, as checkpoints record it.
fn sink_outputs(graph: &crate::pipeline::Graph) -> Vec<crate::checkpoint::SinkOutput> {
    graph
        .sink_outputs
        .iter()
        .map(|(node, dir)| crate::checkpoint::SinkOutput {
            operator: graph.nodes[*node].name.to_string(),
            location: dir.display().to_string(),
        })
        .collect()
}

fn say_nothing(_: &str) {}

/// How an attempt runs its snapshot writes and reads the time: on threads and the wall clock,
/// or on the simulator's thread and clock.
pub(crate) struct AttemptEnv {
    pub(crate) clock: Clock,
    pub(crate) parkers: Vec<Arc<Parker>>,
    /// Makes the attempt's snapshot writer, given where acknowledgements go.
    pub(crate) writer:
        Box<dyn Fn(std::sync::mpsc::Sender<crate::checkpoint::task::TaskAck>) -> Arc<dyn SnapshotWriter>>,
    /// Where the coordinator may be made to crash (fault injection).
    pub(crate) crash: Option<Arc<dyn CrashSchedule>>,
}

/// The checkpoint side of a prepared attempt.
pub(crate) struct PreparedCoordinator {
    pub(crate) core: CoordinatorCore,
    pub(crate) endpoints: Vec<crate::checkpoint::coordinator::TaskEndpoint>,
    pub(crate) acks: std::sync::mpsc::Receiver<crate::checkpoint::task::TaskAck>,
    pub(crate) writer: Arc<dyn SnapshotWriter>,
    pub(crate) commits: Arc<CommitsApplied>,
}

/// One attempt, built and not yet running: its tasks (with the worker each belongs to), the
/// scope they share, and the coordinator that drives their checkpoints.
pub(crate) struct PreparedAttempt {
    pub(crate) tasks: Vec<(usize, Box<dyn crate::pipeline::Task>)>,
    pub(crate) scope: Arc<AttemptScope>,
    pub(crate) coordinator: Option<PreparedCoordinator>,
}

/// What the runtime and the simulator share of starting an attempt: recovers the checkpoint
/// directory (or the savepoint to start from), builds the tasks and the coordinator.
pub(crate) fn prepare_attempt(
    job: &Job,
    config: &RunConfig,
    env: &AttemptEnv,
    shared: &Arc<AttemptShared>,
    notes: &mut Vec<String>,
) -> Result<PreparedAttempt> {
    let (control, metrics, stats) = (&shared.control, &shared.metrics, &shared.stats);
    let graph = job.graph.borrow();
    let workers = env.parkers.len();
    let fingerprint = graph.fingerprint();
    if let Some(f) = graph.checkpointing.as_ref().and_then(|c| c.faults.as_ref()) {
        f.new_attempt();
    }
    let restored;
    let mut recovery = Recovery::default();
    let mut wiring = None;
    let mut coordinator = None;
    let (acks_tx, acks_rx) = std::sync::mpsc::channel();
    if let Some(cfg) = &graph.checkpointing {
        let lock = shared.lock.clone().expect("a checkpointed job holds its directory's lock");
        let found = recover_directory(cfg, &identity(&graph, &fingerprint), notes)?;
        recovery = found.recovery;
        restored = found.restored;
        let writer = (env.writer)(acks_tx.clone());
        let commits = Arc::new(CommitsApplied::default());
        wiring = Some(CheckpointWiring {
            mode: cfg.mode,
            // Every exactly-once job's gates check the priority slots, so a running job can
            // turn unaligned checkpoints on (and off).
            unaligned: cfg.mode.exactly_once(),
            slice_records: cfg.mode.may_overtake(),
            activity: metrics.activity().clone(),
            live: Arc::new(crate::checkpoint::task::LiveSettings::new(cfg)),
            incremental: cfg.incremental,
            acks: acks_tx,
            storage: found.storage.clone(),
            writer: writer.clone(),
            commits: commits.clone(),
        });
        coordinator = Some((cfg.clone(), found.storage, found.first_id, found.completed, writer, commits, lock));
    } else {
        restored = restore_from_savepoint(&identity(&graph, &fingerprint), notes)?.map(Arc::new);
    }
    let scope = Arc::new(
        AttemptScope::new(recovery, graph.checkpointing.is_some()).with_lock(
            shared
                .lock
                .clone()
                .filter(|_| graph.checkpointing.is_some())
                .map(|l| l as Arc<dyn crate::context::OutputOwnership>),
        ),
    );
    let plan_env = PlanEnv {
        clock: env.clock.clone(),
        metrics: metrics.clone(),
        control: control.clone(),
        parkers: env.parkers.clone(),
        restored,
        faults: graph.checkpointing.as_ref().and_then(|c| c.faults.clone()),
        attempt: scope.clone(),
        checkpointing: wiring,
    };
    let limits = PlanLimits { workers, ring_capacity: config.ring_capacity, batch_size: config.batch_size };
    let plan = build_plan(&graph, limits, &plan_env)?;
    let live = plan_env.checkpointing.as_ref().map(|w| w.live.clone());
    let coordinator = coordinator.map(|(cfg, storage, first_id, completed, writer, commits, lock)| {
        let crash = env.crash.clone().or_else(|| cfg.faults.clone().map(|f| f as Arc<dyn CrashSchedule>));
        let outputs = sink_outputs(&graph);
        let core = CoordinatorCore::new(CoordinatorSetup {
            outputs,
            config: cfg,
            storage,
            tasks: plan.endpoints.iter().map(|e| (e.index, e.name.clone(), e.is_source)).collect(),
            clock: env.clock.clone(),
            first_id,
            completed,
            job: graph.name.clone(),
            fingerprint,
            stats: stats.clone(),
            failures: shared.checkpoint_failures.clone(),
            next_id: shared.next_checkpoint.clone(),
            end: scope.end.clone(),
            lock,
            crash,
            update: shared.checkpoint_update.clone(),
            live,
        });
        PreparedCoordinator { core, endpoints: plan.endpoints, acks: acks_rx, writer, commits }
    });
    Ok(PreparedAttempt { tasks: plan.tasks, scope, coordinator })
}

/// Starts one attempt on threads: prepares it, then spawns the workers and the coordinator.
fn start_attempt(
    job: &Job,
    config: &RunConfig,
    shared: &Arc<AttemptShared>,
    notes: &mut Vec<String>,
) -> Result<Attempt> {
    let control = &shared.control;
    let workers = config.effective_workers();
    let parkers: Vec<Arc<Parker>> = (0..workers).map(|_| Arc::new(Parker::default())).collect();
    let manual_clock = job.graph.borrow().manual_clock.clone();
    let env = AttemptEnv {
        clock: manual_clock.map_or_else(Clock::start, Clock::manual),
        parkers: parkers.clone(),
        writer: Box::new(|acks| Arc::new(PoolWriter::new(acks, DEFAULT_QUEUE_LIMIT_WRITES))),
        crash: None,
    };
    let state = Arc::new(RunState::new(workers, parkers.clone()));
    let prepared = prepare_attempt(job, config, &env, shared, notes)?;
    let name = job.graph.borrow().name.clone();
    let task_count = prepared.tasks.len();
    let scope = prepared.scope;
    let (mut requests, mut commits) = (None, None);
    let coordinator = match prepared.coordinator {
        Some(c) => {
            let shutdown = Arc::new(AtomicBool::new(false));
            let (request_tx, request_rx) = std::sync::mpsc::channel();
            requests = Some(request_tx);
            commits = Some(c.commits);
            let fail_state = state.clone();
            let stop = shutdown.clone();
            let t = std::thread::Builder::new()
                .name(format!("weir-{name}-coordinator"))
                .spawn(move || {
                    run_thread(
                        c.core,
                        c.endpoints,
                        c.acks,
                        request_rx,
                        stop,
                        c.writer,
                        Box::new(move |e| fail_state.fail(e)),
                    )
                })
                .map_err(|e| Error::Io {
                    context: "cannot start the checkpoint coordinator".into(),
                    path: None,
                    source: e,
                })?;
            Some((t, shutdown))
        }
        None => None,
    };
    let mut per_worker: Vec<Vec<_>> = (0..workers).map(|_| Vec::new()).collect();
    for (w, t) in prepared.tasks {
        per_worker[w].push(t);
    }
    let cores: &[core_affinity::CoreId] = if config.pin_workers { core_ids() } else { &[] };
    let mut threads = Vec::with_capacity(workers);
    let exited = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for (i, tasks) in per_worker.into_iter().enumerate() {
        let worker = Worker {
            tasks,
            parker: parkers[i].clone(),
            control: control.clone(),
            state: state.clone(),
            scope: scope.clone(),
            core: if cores.is_empty() { None } else { Some(cores[i % cores.len()]) },
        };
        let t = std::thread::Builder::new()
            .name(format!("weir-{name}-{i}"))
            .spawn({
                let exited = ExitCount(exited.clone());
                move || {
                    let _counted = exited;
                    worker.run()
                }
            })
            .map_err(|e| Error::Io { context: "cannot start a worker thread".into(), path: None, source: e })?;
        threads.push(t);
    }
    Ok(Attempt { threads, state, parkers, scope, coordinator, requests, commits, task_count, exited })
}

/// Counts a worker thread as exited when it is dropped at the thread's end, however the
/// thread ends (a panic included).
struct ExitCount(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for ExitCount {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
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
        let shared = Arc::new(AttemptShared { lock, ..AttemptShared::default() });
        let attempt = start_attempt(&self, &config, &shared, &mut notes)?;
        let name = self.name();
        let run = Arc::new(Supervised {
            job: self,
            config,
            shared,
            started: Instant::now(),
            workers: config.effective_workers(),
            state: Mutex::new(RunProgress {
                attempt: Some(attempt),
                restarts: 0,
                failures: Vec::new(),
                notes,
                result: None,
                over: false,
            }),
            ended: std::sync::Condvar::new(),
        });
        let supervised = run.clone();
        let supervisor = std::thread::Builder::new()
            .name(format!("weir-{name}-supervisor"))
            .spawn(move || supervised.supervise())
            .map_err(|e| Error::Io { context: "cannot start the job's supervisor".into(), path: None, source: e })?;
        Ok(JobHandle { run, supervisor: Some(supervisor) })
    }

    /// Starts the job and waits for it to end.
    pub fn execute(self, config: RunConfig) -> Result<JobReport> {
        self.start(config)?.join()
    }
}
