//! What a subtask knows about itself: its operator, index, parallelism, and the job's clock.
//!
//! Time reaches operators and the checkpoint path only through the job's [`Clock`]
//! ([`TaskContext::now_ns`]): the wall clock in production, a clock the simulator
//! ([`crate::simulation`]) advances by hand under simulation, so a seed decides every timeout.
//!
//! May touch: `error`, `metrics`, `record`, `snapshot`, `wake`.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::metrics::JobMetrics;
use crate::record::KeyScope;
use crate::snapshot::{FaultInjector, RestoredState};
use crate::wake::Parker;

/// The wall clock, for what waits on it outside the job's time: a host's timeout, the
/// supervisor's restart delay, the coordinator waiting for its writers, a directory lock's
/// and a transaction's names. With [`Clock`] the engine's only reads of it (`clippy.toml`
/// forbids them elsewhere); a task's time is its context's clock, which the simulator drives.
pub(crate) mod wall {
    /// Now, for a deadline or a duration outside the job's time.
    #[allow(clippy::disallowed_methods)] // the home of wall-clock reads
    pub(crate) fn now() -> std::time::Instant {
        std::time::Instant::now()
    }

    /// Nanoseconds since the Unix epoch (0 before it).
    #[allow(clippy::disallowed_methods)] // the home of wall-clock reads
    pub(crate) fn unix_nanos() -> u128 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
    }

    /// Milliseconds since the Unix epoch (0 before it).
    pub(crate) fn unix_ms() -> u64 {
        (unix_nanos() / 1_000_000) as u64
    }
}

/// The job's monotonic clock: nanoseconds since the job started.
#[derive(Clone, Debug)]
pub struct Clock {
    origin: Instant,
    /// Milliseconds since the Unix epoch at `origin` (processing time's zero).
    origin_epoch_ms: u64,
    /// Under simulation: the time, set by the simulator (never the wall clock).
    manual: Option<Arc<AtomicU64>>,
}

impl Clock {
    /// A clock starting now.
    pub fn start() -> Clock {
        Clock { origin: wall::now(), origin_epoch_ms: wall::unix_ms(), manual: None }
    }

    /// A clock that reads `time` (nanoseconds), which only its owner moves: the simulator's.
    pub(crate) fn manual(time: Arc<AtomicU64>) -> Clock {
        Clock { origin: wall::now(), origin_epoch_ms: 0, manual: Some(time) }
    }

    /// Nanoseconds since the clock started.
    #[inline]
    pub fn now_ns(&self) -> u64 {
        match &self.manual {
            None => self.origin.elapsed().as_nanos() as u64,
            Some(t) => t.load(Ordering::Relaxed),
        }
    }

    /// Processing time: milliseconds since the Unix epoch (under simulation, the simulated
    /// time in milliseconds), never going back. It continues across restarts, so a restored
    /// processing-time timer that is already due fires at once.
    #[inline]
    pub fn processing_time_ms(&self) -> u64 {
        self.epoch_ms_at(self.now_ns())
    }

    /// The processing time (milliseconds since the Unix epoch; under simulation, the
    /// simulated time) at `now_ns` on this clock: for code that is handed the time.
    #[inline]
    pub fn epoch_ms_at(&self, now_ns: u64) -> u64 {
        self.origin_epoch_ms + now_ns / 1_000_000
    }
}

/// The identity and environment of one subtask.
#[derive(Clone)]
pub struct TaskContext {
    /// The job's name.
    pub job: Arc<str>,
    /// The operator's name (unique within a job).
    pub operator: Arc<str>,
    /// This subtask's index, `0 .. parallelism`.
    pub subtask: usize,
    /// The operator's parallelism.
    pub parallelism: usize,
    /// The job's maximum parallelism (number of key groups).
    pub max_parallelism: usize,
    pub(crate) clock: Clock,
    pub(crate) metrics: Arc<JobMetrics>,
    /// The parker of the worker that runs this subtask (for wakeups from outside the job).
    pub(crate) parker: Arc<Parker>,
    /// The state this attempt restores, if it restarts from a checkpoint.
    pub(crate) restored: Option<Arc<RestoredState>>,
    /// Failure points for tests.
    pub(crate) faults: Option<Arc<FaultInjector>>,
    /// Work to run if this attempt of the job finishes successfully.
    pub(crate) attempt: Arc<AttemptScope>,
}

/// What a subtask restores (see [`TaskContext::restore_view`]).
pub enum RestoreView<'a> {
    /// No state for this operator.
    Nothing,
    /// This subtask's own part (same parallelism as when saved).
    Own(&'a [u8]),
    /// The operator ran at another parallelism: every old subtask's part, and what this
    /// subtask owns now.
    Rescaled {
        /// (old subtask, bytes), by old subtask.
        parts: Vec<(usize, &'a [u8])>,
        /// The key groups this subtask owns at the new parallelism.
        scope: KeyScope,
    },
}

/// Tries of a job-success hook that fails retryably ([`TaskContext::on_job_success`]).
pub(crate) const SUCCESS_TRIES: u32 = 5;

/// Work registered with [`TaskContext::on_job_success`].
type SuccessHook = Box<dyn FnMut() -> crate::Result<()> + Send>;

/// What an attempt restores from, for sinks that must decide whether removing output is a
/// loss.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// The checkpoint restored, if any.
    pub restored: Option<u64>,
    /// Complete checkpoints newer than it that recovery skipped as damaged.
    pub skipped: Vec<u64>,
    /// Whether removing committed output is allowed
    /// ([`crate::checkpoint::CheckpointConfig::allow_retracting_output`]).
    pub allow_retracting_output: bool,
}

impl Recovery {
    /// Whether output committed as transaction `txn` (named after the checkpoint it was
    /// committed under) may be removed without loss: only the transaction the end of a job
    /// commits (the restored checkpoint plus one) when no checkpoint was skipped, which the
    /// replay writes again identically. With no checkpoint restored nothing is: a transaction
    /// 1 may as well have been committed under a checkpoint 1 that is gone, and one subtask
    /// must not remove it while another refuses.
    pub fn replays_exactly(&self, txn: u64) -> bool {
        self.skipped.is_empty() && self.restored.is_some_and(|k| txn == k + 1)
    }

    /// Why output after the restored checkpoint can no longer be restored, for messages.
    pub fn why_lost(&self) -> String {
        match (self.restored, self.skipped.as_slice()) {
            (_, []) if self.restored.is_none() => "there is no checkpoint to restore".into(),
            (Some(k), []) => format!("no checkpoint after {k} completed"),
            (_, skipped) => format!(
                "checkpoint(s) {} are damaged",
                skipped.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
            ),
        }
    }
}

/// How far one attempt of a job has got through its input and towards its end, shared by
/// its tasks, its workers, its checkpoint coordinator and the job's handle.
#[derive(Clone, Default)]
pub(crate) struct EndOfJob {
    /// Tasks that finished: once any has, no new checkpoint can complete.
    pub(crate) finished_tasks: Arc<AtomicUsize>,
    /// Source subtasks at the end of their input, waiting for the final checkpoint before
    /// they end their streams (with checkpointing): once all are, the next checkpoint is the
    /// final one.
    pub(crate) sources_at_end: Arc<AtomicUsize>,
    /// Source subtasks that report they are catching up on a backlog.
    pub(crate) sources_in_backlog: Arc<AtomicUsize>,
    /// Set when the final checkpoint completed and the sources were told to end their streams.
    pub(crate) input_ended: Arc<AtomicBool>,
    /// Set when the final checkpoint was triggered: no savepoint can be taken any more.
    pub(crate) final_started: Arc<AtomicBool>,
}

/// What belongs to one attempt of a job (a failover starts a new one).
#[derive(Default)]
pub struct AttemptScope {
    on_success: std::sync::Mutex<Vec<SuccessHook>>,
    /// How far the attempt has got towards the job's end.
    pub(crate) end: EndOfJob,
    /// What this attempt restores from.
    pub(crate) recovery: Recovery,
    /// Messages from tasks for the job's notes.
    pub(crate) notes: std::sync::Mutex<Vec<String>>,
    /// Whether the job takes checkpoints.
    pub(crate) checkpointed: bool,
    /// The checkpoint directory's lock, while the job holds one: output files are created only
    /// while it is still this process's ([`TaskContext::check_owner`]).
    pub(crate) lock: Option<Arc<dyn OutputOwnership>>,
}

/// Whether this process still owns the job's output: the checkpoint directory's lock
/// (`checkpoint`'s `DirectoryLock`), asked before a sink creates an output file. A trait here,
/// so the tasks' context needs nothing from the checkpoint layer above it.
pub(crate) trait OutputOwnership: Send + Sync {
    /// `Ok` while the output is this process's; the error says who took it.
    fn check(&self) -> crate::Result<()>;
    /// The identity of the job the checkpoint directory belongs to (see
    /// [`TaskContext::job_instance`]).
    fn instance(&self) -> &str;
}

impl AttemptScope {
    /// The scope of an attempt that restores from `recovery`, in a job that takes checkpoints
    /// or not.
    pub(crate) fn new(recovery: Recovery, checkpointed: bool) -> Self {
        AttemptScope { recovery, checkpointed, ..AttemptScope::default() }
    }

    /// The scope, holding the checkpoint directory's lock (see [`TaskContext::check_owner`]).
    pub(crate) fn with_lock(self, lock: Option<Arc<dyn OutputOwnership>>) -> Self {
        AttemptScope { lock, ..self }
    }

    /// Runs the registered work: called once every task of the attempt has finished. Every
    /// hook runs, one that fails retryably again (up to [`SUCCESS_TRIES`] times in all); the
    /// first error is returned (the job then fails).
    ///
    /// Retried here, not by a failover: a failover would restore the last checkpoint and
    /// write again what the hooks that did succeed (another sink's final commit, or part of
    /// this one's, its answer lost) already committed.
    pub(crate) fn succeed(&self) -> crate::Result<()> {
        let hooks = std::mem::take(&mut *self.on_success.lock().unwrap_or_else(|e| e.into_inner()));
        let mut first = Ok(());
        for mut h in hooks {
            let mut tries = 1;
            let result = loop {
                match h() {
                    Err(e) if e.is_retryable() && tries < SUCCESS_TRIES => tries += 1,
                    r => break r,
                }
            };
            if let Err(e) = result {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }
}

impl TaskContext {
    /// Nanoseconds since the job started, from the job's clock.
    #[inline]
    pub fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }

    /// Processing time (see [`Clock::processing_time_ms`]).
    #[inline]
    pub fn processing_time_ms(&self) -> u64 {
        self.clock.processing_time_ms()
    }

    /// This subtask's state in the checkpoint the job restarts from, if any (at the parallelism
    /// it was saved with; see [`TaskContext::restore_view`] for a rescaled restore).
    pub fn restored_state(&self) -> Option<&[u8]> {
        self.restored.as_ref().and_then(|r| r.get(&self.operator, self.subtask))
    }

    /// This subtask's own part as the fork the process kept (local recovery), when the state
    /// was restored from memory at the parallelism it was saved with.
    pub(crate) fn restored_fork(&self) -> Option<crate::snapshot::SharedFork> {
        let r = self.restored.as_ref()?;
        (r.saved_parallelism(&self.operator) == self.parallelism).then(|| r.local(&self.operator, self.subtask))?
    }

    /// What this subtask restores: nothing, its own part, or — when the state was saved at
    /// another parallelism — every old subtask's part and the key groups it now owns.
    pub fn restore_view(&self) -> RestoreView<'_> {
        let Some(r) = &self.restored else { return RestoreView::Nothing };
        match r.saved_parallelism(&self.operator) {
            0 => RestoreView::Nothing,
            p if p == self.parallelism => match r.get(&self.operator, self.subtask) {
                Some(b) => RestoreView::Own(b),
                None => RestoreView::Nothing,
            },
            _ => RestoreView::Rescaled {
                parts: r.parts_of(&self.operator),
                scope: KeyScope {
                    subtask: self.subtask,
                    parallelism: self.parallelism,
                    max_parallelism: self.max_parallelism,
                },
            },
        }
    }

    /// This subtask's own part read lazily ([`RestoredState::lazy`]): its bytes without its
    /// pages of keyed state, and the pages. `None` for anything else (no part, a rescale, or
    /// a part read whole).
    pub(crate) fn lazy_restore(&self) -> Option<(&[u8], &crate::snapshot::PlacedPages)> {
        let r = self.restored.as_ref()?;
        if r.saved_parallelism(&self.operator) != self.parallelism {
            return None;
        }
        r.lazy(&self.operator, self.subtask)
    }

    /// Registers work that runs only if this attempt of the job finishes successfully (a
    /// transactional sink's final commit, say). A failed attempt drops it. A retryable error
    /// (an I/O error) runs it again, so it must be idempotent and go on where it stopped (a
    /// commit repeated is done); another error, or the last try's, fails the job (and no
    /// completion marker is written).
    pub fn on_job_success(&self, f: impl FnMut() -> crate::Result<()> + Send + 'static) {
        self.attempt.on_success.lock().unwrap_or_else(|e| e.into_inner()).push(Box::new(f));
    }

    /// The job's metrics registry.
    pub fn metrics(&self) -> &Arc<JobMetrics> {
        &self.metrics
    }

    /// The identity of this job's checkpoint directory: made at random when the directory was
    /// first used (kept in it, and in the object store it is kept in), the same for every
    /// restart and process that resumes from it, different for every other directory. What a
    /// sink names its transactions by (Kafka's transactional ids), so that two jobs never
    /// take each other's. `None` without checkpoints.
    pub fn job_instance(&self) -> Option<&str> {
        self.attempt.lock.as_deref().map(|l| l.instance())
    }

    /// Whether the job takes checkpoints (a source that buffers for replay needs to know).
    pub fn checkpointed(&self) -> bool {
        self.attempt.checkpointed
    }

    /// What this attempt of the job restores from.
    pub fn recovery(&self) -> &Recovery {
        &self.attempt.recovery
    }

    /// Fails with [`crate::Error::Fenced`] once another process took the job's checkpoint
    /// directory over: a sink calls it before it creates an output file, so a process that
    /// lost its directory (stopped, then continued after its successor took over) writes
    /// nothing more into the output. One small file read, per file created.
    pub fn check_owner(&self) -> crate::Result<()> {
        self.attempt.lock.as_ref().map_or(Ok(()), |l| l.check())
    }

    /// Adds a message to the job's notes ([`crate::JobHandle::notes`]).
    pub fn note(&self, message: impl Into<String>) {
        self.attempt.notes.lock().unwrap_or_else(|e| e.into_inner()).push(message.into());
    }

    /// A context for unit tests of operators.
    #[cfg(test)]
    pub(crate) fn for_test(operator: &str, subtask: usize, parallelism: usize) -> TaskContext {
        TaskContext {
            job: "test".into(),
            operator: operator.into(),
            subtask,
            parallelism,
            max_parallelism: 128,
            clock: Clock::start(),
            metrics: Arc::new(JobMetrics::default()),
            parker: Arc::new(Parker::default()),
            restored: None,
            faults: None,
            attempt: Arc::new(AttemptScope::default()),
        }
    }
}

// Their fields are closures, shared internals or whole state: a name says enough.
crate::debug_as_name!([] TaskContext);
crate::debug_as_name!(['a] RestoreView<'a>);
crate::debug_as_name!([] AttemptScope);
