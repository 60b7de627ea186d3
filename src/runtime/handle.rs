//! The [`JobHandle`] a program holds and the [`JobController`] it shares: watching, stopping,
//! cancelling, savepoints and checkpoints on demand, the live configuration.

use super::*;

/// A view of a running job beside its [`JobHandle`] ([`JobHandle::controller`]), cheap to
/// clone and to share between threads: what a control endpoint or a dashboard asks of a job.
#[derive(Clone)]
pub struct JobController {
    pub(super) run: Arc<Supervised>,
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

    /// Stops every worker at once (Flink's cancel): whoever holds the job's handle sees
    /// [`Error::Cancelled`] from [`JobHandle::join`]. Nothing is committed after it.
    pub fn cancel(&self) {
        self.run.shared.control.cancel.store(true, Ordering::SeqCst);
        self.wake_all();
    }

    /// Wakes every worker of the running attempt, to see a stop or a cancel at once.
    fn wake_all(&self) {
        if let Some(a) = &self.progress().attempt {
            for p in &a.parkers {
                p.unpark_now();
            }
        }
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

    /// What the current attempt restored and from where (memory: local recovery; files;
    /// savepoint), if it restored anything.
    pub fn last_restore(&self) -> Option<crate::checkpoint::RestoreReport> {
        self.run.shared.last_restore.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether the job has ended for good.
    pub fn is_finished(&self) -> bool {
        self.progress().over
    }

    /// The checkpoints triggered and not yet completed or failed, oldest first.
    pub fn checkpoints_in_progress_now(&self) -> Vec<crate::metrics::CheckpointInProgress> {
        self.run.shared.checkpoints_in_progress.rows()
    }

    /// How many attempts restored a checkpoint or savepoint (Flink's `counts.restored`).
    pub fn restores(&self) -> u64 {
        self.run.shared.restores.load(Ordering::Relaxed)
    }

    /// Milliseconds since the Unix epoch when the job started.
    pub fn started_unix_ms(&self) -> u64 {
        self.run.started_unix_ms
    }

    /// Where the job is in its life ([`JobState`]).
    pub fn state(&self) -> JobState {
        let progress = self.progress();
        if let Some(ended) = progress.ended_as {
            return ended;
        }
        let cancelling = self.run.shared.control.cancel.load(Ordering::SeqCst);
        match &progress.attempt {
            _ if cancelling => JobState::Cancelling,
            None => JobState::Restarting,
            Some(a) if a.state.has_failed() => JobState::Failing,
            Some(_) => JobState::Running,
        }
    }

    /// The newest failure, of the job or of an attempt that restarted (Flink's exceptions).
    pub fn last_failure(&self) -> Option<JobFailure> {
        self.progress().last_failure.clone()
    }

    /// With a state memory budget ([`crate::RunConfig::state_memory`]): its counters now.
    pub fn state_memory(&self) -> Option<crate::metrics::StateMemoryStats> {
        self.run.shared.state_budget.as_ref().map(|b| b.stats())
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
        request: impl FnOnce(crate::checkpoint::coordinator::Reply<R>) -> CoordinatorRequest,
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

    /// Checkpoints triggered and not yet completed, failed or aborted (savepoints included).
    pub fn checkpoints_in_progress(&self) -> u64 {
        self.run.shared.checkpoints_in_progress.count()
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

    /// Why checkpoints failed (declined, expired, failed to write) and when, oldest first: the
    /// newest [`crate::metrics::FAILURES_KEPT`].
    pub fn checkpoint_failures(&self) -> Vec<crate::metrics::CheckpointFailure> {
        self.run.shared.checkpoint_failures.lock().unwrap_or_else(|e| e.into_inner()).kept()
    }

    /// Checkpoints failed so far, in all.
    pub fn checkpoints_failed(&self) -> u64 {
        self.run.shared.checkpoint_failures.lock().unwrap_or_else(|e| e.into_inner()).total()
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
    /// [`JobHandle::stop_with_drain`]: the job drained (every window fired, all output
    /// committed) and finished; its final checkpoint was copied as `savepoint`.
    Drained {
        /// The savepoint's folder.
        savepoint: std::path::PathBuf,
        /// How the job ran.
        report: JobReport,
    },
}

impl Stopped {
    /// The savepoint's folder, if one was taken.
    pub fn savepoint(self) -> Option<std::path::PathBuf> {
        match self {
            Stopped::Savepoint(path) | Stopped::Drained { savepoint: path, .. } => Some(path),
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
    pub(super) run: Arc<Supervised>,
    pub(super) supervisor: Option<JoinHandle<()>>,
}

/// What the handle and the supervisor thread share.
pub(super) struct Supervised {
    pub(super) job: Job,
    pub(super) config: RunConfig,
    pub(super) shared: Arc<AttemptShared>,
    pub(super) started: Instant,
    /// `started`, in milliseconds since the Unix epoch.
    pub(super) started_unix_ms: u64,
    pub(super) workers: usize,
    pub(super) state: Mutex<RunProgress>,
    /// Signalled when the job ended for good.
    pub(super) ended: std::sync::Condvar,
}

/// How far the job has got, under [`Supervised::state`].
pub(super) struct RunProgress {
    /// The attempt running now (none while the next one starts, and after the end).
    pub(super) attempt: Option<Attempt>,
    pub(super) restarts: u32,
    /// When each failure that asked for a restart happened (for the failure-rate strategy);
    /// those older than an hour are dropped, longer than any interval a job is given.
    pub(super) failures: Vec<Instant>,
    pub(super) notes: Vec<String>,
    /// The job's result, once it ended for good, until it is handed out.
    pub(super) result: Option<Result<JobReport>>,
    /// Whether the job ended for good.
    pub(super) over: bool,
    /// How it ended, once it has ([`JobState::Finished`], `Cancelled` or `Failed`).
    pub(super) ended_as: Option<JobState>,
    /// The newest failure (of an attempt that restarted, or of the job), Flink's "root
    /// exception".
    pub(super) last_failure: Option<JobFailure>,
}

/// Where a job is in its life, in Flink's names (`JobStatus`): what a control endpoint, a
/// health probe and a dashboard say. A job is `Running` from [`crate::Job::start`] on (its
/// first attempt starts before `start` returns, so Flink's `CREATED` is never seen).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum JobState {
    /// Its tasks run.
    Running,
    /// A task failed and the attempt's workers wind down; a restart or the end follows.
    Failing,
    /// Waiting out the restart strategy's delay, or starting the next attempt.
    Restarting,
    /// Cancelled, its workers stopping.
    Cancelling,
    /// Cancelled ([`JobController::cancel`]): nothing was committed after it.
    Cancelled,
    /// Failed past its restart strategy, or with an error that no restart mends.
    Failed,
    /// Every source ended (or it was stopped with a savepoint) and every result was committed.
    Finished,
}

impl JobState {
    /// Flink's name: `RUNNING`, `FAILED`, …
    pub fn name(self) -> &'static str {
        match self {
            JobState::Running => "RUNNING",
            JobState::Failing => "FAILING",
            JobState::Restarting => "RESTARTING",
            JobState::Cancelling => "CANCELLING",
            JobState::Cancelled => "CANCELED",
            JobState::Failed => "FAILED",
            JobState::Finished => "FINISHED",
        }
    }

    /// Whether the job has ended for good in this state.
    pub fn is_terminal(self) -> bool {
        matches!(self, JobState::Cancelled | JobState::Failed | JobState::Finished)
    }

    /// Every state, in the order of a job's life (for a metric per state).
    pub const ALL: [JobState; 7] = [
        JobState::Running,
        JobState::Failing,
        JobState::Restarting,
        JobState::Cancelling,
        JobState::Cancelled,
        JobState::Failed,
        JobState::Finished,
    ];
}

/// A failure of the job or of one of its attempts: why, and when (Unix milliseconds).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct JobFailure {
    /// The error, as the job's result or its restart note says it.
    pub cause: String,
    /// When the supervisor saw it, in milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// Whether the job restarted after it (false: the job ended with it).
    pub restarted: bool,
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
        self.controller().wake_all();
    }

    /// Stops every worker at once; [`JobHandle::join`] then returns [`Error::Cancelled`].
    pub fn cancel(&self) {
        self.controller().cancel();
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

    /// What the current attempt restored and from where (memory: local recovery; files;
    /// savepoint), if it restored anything.
    ///
    /// ```no_run
    /// # fn f(handle: &weir::JobHandle) {
    /// if let Some(r) = handle.last_restore() {
    ///     println!("restored checkpoint {} from {}", r.checkpoint, r.from);
    /// }
    /// # }
    /// ```
    pub fn last_restore(&self) -> Option<crate::checkpoint::RestoreReport> {
        self.controller().last_restore()
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
        let waiting = self.progress().attempt.as_ref().and_then(|a| {
            a.commits.clone().map(|c| (c, a.task_count, std::sync::Arc::clone(&a.exited), a.parkers.len()))
        });
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

    /// Stops the job with a drain (Flink's `stop --drain`): the sources end their streams,
    /// every window fires and every timer with it, the sinks commit everything, the job
    /// finishes with its final checkpoint, and that checkpoint is copied into
    /// `<dir>/savepoint-<id>/`. For a job that is retired rather than paused: a job restored
    /// from the savepoint has every window already fired. Needs checkpointing.
    ///
    /// ```no_run
    /// # fn f(handle: weir::JobHandle) -> weir::Result<()> {
    /// if let weir::Stopped::Drained { savepoint, report } = handle.stop_with_drain("savepoints")? {
    ///     println!("drained after {} records into {}", report.source_records, savepoint.display());
    /// }
    /// # Ok(()) }
    /// ```
    pub fn stop_with_drain(self, dir: impl Into<std::path::PathBuf>) -> Result<Stopped> {
        let checkpoints = match &self.run.job.graph.borrow().checkpointing {
            Some(c) => c.dir.clone(),
            None => {
                return Err(Error::config(
                    "a stop with a drain ends in a savepoint, which needs checkpointing: configure the job with \
                     with_checkpointing (or stop it without one)",
                ))
            }
        };
        let dir = dir.into();
        self.controller().check_savepoint_folder(&dir)?;
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("cannot create the savepoint directory", &dir, e))?;
        self.stop();
        let report = self.join()?;
        // The final checkpoint is the newest; one that failed leaves its folder incomplete,
        // and an older checkpoint would be a savepoint from before output that is committed.
        let storage = crate::checkpoint::CheckpointStorage::new(&checkpoints);
        let id = match storage.list().last().copied() {
            Some(id) if storage.is_complete(id) => id,
            _ => {
                return Err(Error::Checkpoint(
                    "the job drained and finished with its output committed, and its final checkpoint did not \
                     complete: there is no savepoint of its end (nothing is left to resume)"
                        .into(),
                ))
            }
        };
        let savepoint = storage.copy_to_savepoint(id, &dir)?;
        Ok(Stopped::Drained { savepoint, report })
    }

    /// A view of the running job that others may hold beside this handle (a control
    /// endpoint, a dashboard): checkpoints and savepoints on demand, the live configuration,
    /// statistics and metrics. It outlives the job harmlessly (then it answers that the job is
    /// not running).
    pub fn controller(&self) -> JobController {
        JobController { run: std::sync::Arc::clone(&self.run) }
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

    /// Why checkpoints failed ([`JobController::checkpoint_failures`]).
    pub fn checkpoint_failures(&self) -> Vec<crate::metrics::CheckpointFailure> {
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
