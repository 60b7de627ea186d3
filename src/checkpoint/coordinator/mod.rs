//! The checkpoint coordinator: its own thread, never a worker. It triggers checkpoints at the
//! sources, collects the tasks' acknowledgements, completes a checkpoint by writing its
//! `_metadata` atomically, then tells every task (sinks commit); it aborts checkpoints that
//! time out or are declined, tells the tasks, and fails the job after too many consecutive
//! failures. It retains the configured number of completed checkpoints.
//!
//! A checkpoint that fails (it expires, or a task declines it) keeps the parts the tasks had
//! completed: their files stay, each such task hears so (`TaskControl::PartKept`), and the
//! next checkpoint's tasks reuse their part when nothing in it changed
//! ([`super::resume`]), or write it again and say why. The kept files stay until a later
//! checkpoint completes; what that one refers to stays with it.
//!
//! Sources at the end of their input keep answering triggers; once all are, the coordinator
//! takes the final checkpoint at once and, when it completes, tells them to end their streams
//! (after FLIP-147: a source that ends first does not stop the job's checkpoints, and a
//! bounded job's output is committed by a checkpoint).
//!
//! The protocol lives in [`CoordinatorCore`], a state machine with events in
//! ([`CoordinatorCore::on_ack`], [`CoordinatorCore::on_tick`], [`CoordinatorCore::on_savepoint`],
//! [`CoordinatorCore::on_shutdown`]) and [`Command`]s out (a message for a task, a failure of
//! the job, an injected crash); time comes in as an argument, never from the wall clock. The
//! runtime runs it behind a thin thread loop ([`run_thread`]); the simulator calls it from
//! its one thread.
//!
//! The core composes four parts, each with the state it owns and tests of its own, which
//! never use each other: `trigger` (when the next checkpoint is due: interval, pause, the
//! final checkpoint, configurations taking turns), `pending` (the checkpoints in flight, the
//! kept parts, the aborted ones; a completed one's statistics), `requests` (savepoints,
//! checkpoints asked for now and configurations handed over from outside, and their answers)
//! and `shared_files` (what retention deleted, what was adopted, changelog bases).
//!
//! May touch: `context`, `error`, `faults`, `metrics`, `snapshot`.

mod pending;
mod requests;
mod shared_files;
mod trigger;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::config::CheckpointConfig;
use super::lock::DirectoryLock;
use super::storage::{CheckpointMetadata, CheckpointStorage, SharedFile, TaskFile, FORMAT_VERSION};
use super::task::{SnapshotWriter, TaskAck, TaskControl};
use crate::context::{Clock, EndOfJob};
use crate::error::Error;
use crate::snapshot::{Barrier, CheckpointNotice};
use pending::{KeptParts, Pending, PendingSet};
use requests::OutsideRequests;
use shared_files::SharedFileRegistry;
use trigger::{ns, Moment, TriggerPolicy};

/// How the coordinator reaches one task.
pub(crate) struct TaskEndpoint {
    pub(crate) index: usize,
    pub(crate) name: String,
    pub(crate) is_source: bool,
    pub(crate) control: Sender<TaskControl>,
}

/// Why a request from outside was not carried out: what its asker hears.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RequestRefused {
    /// No checkpoint could be taken for it (the job is finishing or stopping, say): why.
    NotTaken(String),
    /// The checkpoint asked for was triggered and failed.
    Failed {
        /// The checkpoint.
        checkpoint: u64,
        /// Why it failed.
        reason: String,
    },
    /// A savepoint's checkpoint was triggered and failed.
    SavepointFailed {
        /// The checkpoint.
        checkpoint: u64,
        /// Why it failed.
        reason: String,
    },
    /// A savepoint's checkpoint completed, and copying it into the savepoint's folder failed.
    NotCopied(String),
}

impl std::fmt::Display for RequestRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestRefused::NotTaken(why) | RequestRefused::NotCopied(why) => f.write_str(why),
            RequestRefused::Failed { checkpoint, reason } => write!(f, "checkpoint {checkpoint} failed: {reason}"),
            RequestRefused::SavepointFailed { checkpoint, reason } => {
                write!(f, "its checkpoint ({checkpoint}) failed: {reason}")?;
                if reason.starts_with("expired") {
                    f.write_str(
                        ". A savepoint waits its own timeout: give it more (CheckpointConfig::savepoint_timeout; \
                         weir: --savepoint-timeout-ms)",
                    )?;
                }
                Ok(())
            }
        }
    }
}

/// Where a request's answer goes: what it asked for, or why not.
pub(crate) type Reply<T> = Sender<Result<T, RequestRefused>>;

/// A request for a savepoint: an aligned checkpoint copied, complete, into `dir`.
pub(crate) struct SavepointRequest {
    pub(crate) dir: std::path::PathBuf,
    /// The savepoint's checkpoint id and folder, or why it failed.
    pub(crate) reply: Reply<(u64, std::path::PathBuf)>,
    /// A stop with a savepoint: once it is complete no other checkpoint may complete (its
    /// commits would be output after the savepoint, which a job started from it produces
    /// again), so none is triggered any more.
    pub(crate) stop: bool,
}

/// What a job's handle asks the coordinator for.
pub(crate) enum CoordinatorRequest {
    /// A savepoint.
    Savepoint(SavepointRequest),
    /// A checkpoint now, as the configuration makes them (Flink's `flink checkpoint`), or
    /// `full` (every page written, nothing referred to in earlier checkpoints: `flink
    /// checkpoint --full`): the reply is its id once it completed, or why it failed.
    Checkpoint { reply: Reply<u64>, full: bool },
}

/// One task, as the coordinator names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TaskInfo {
    /// Its index in the plan.
    pub(crate) index: usize,
    pub(crate) name: String,
    /// A source's task: checkpoints are triggered there.
    pub(crate) is_source: bool,
}

impl From<&TaskEndpoint> for TaskInfo {
    fn from(e: &TaskEndpoint) -> Self {
        TaskInfo { index: e.index, name: e.name.clone(), is_source: e.is_source }
    }
}

/// Where a process may be made to die on the coordinator's path (fault injection: the
/// `testing` feature's [`crate::snapshot::FaultInjector`], and the simulator).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CrashPoint {
    /// `_metadata` was written to its temporary file and not yet renamed into place.
    MetadataNotRenamed,
    /// `_metadata` is durable and verified, and no task has heard that the checkpoint
    /// completed (no sink committed it).
    BeforeCompletionNotice,
    /// The coordinator checked that it still owns the directory and has not put the
    /// checkpoint into the object store yet: where a pause lets a successor take over.
    BeforePublish,
}

/// Decides whether the process dies at a [`CrashPoint`] of a checkpoint.
pub(crate) trait CrashSchedule: Send + Sync {
    fn crash_at(&self, point: CrashPoint, checkpoint: u64) -> bool;
}

impl CrashSchedule for crate::snapshot::FaultInjector {
    fn crash_at(&self, point: CrashPoint, checkpoint: u64) -> bool {
        match point {
            CrashPoint::BeforeCompletionNotice => self.exit_before_commit(checkpoint),
            CrashPoint::MetadataNotRenamed => self.exit_before_metadata_rename(checkpoint),
            CrashPoint::BeforePublish => {
                self.stop_before_publish(checkpoint);
                false
            }
        }
    }
}

/// What the coordinator asks of the world.
#[derive(Debug)]
pub(crate) enum Command {
    /// Deliver a control message to task `task` (its index in the plan).
    Send(usize, TaskControl),
    /// Fail the job (the restart strategy then decides what happens).
    Fail(Error),
    /// An injected crash: the process ends here, as if killed.
    Crash(CrashPoint, u64),
}

/// Everything the coordinator needs to start an attempt.
pub(crate) struct CoordinatorSetup {
    pub(crate) config: CheckpointConfig,
    pub(crate) storage: Arc<CheckpointStorage>,
    pub(crate) tasks: Vec<TaskInfo>,
    pub(crate) clock: Clock,
    /// The id of the first checkpoint this attempt triggers.
    pub(crate) first_id: u64,
    /// Completed checkpoints already on disk (for retention).
    pub(crate) completed: Vec<u64>,
    pub(crate) job: String,
    pub(crate) fingerprint: String,
    /// Where the job's sinks write, recorded in every checkpoint.
    pub(crate) outputs: Vec<super::storage::SinkOutput>,
    pub(crate) stats: Arc<Mutex<crate::metrics::CheckpointHistory>>,
    /// Why checkpoints failed, for the job's notes.
    pub(crate) failures: Arc<Mutex<crate::metrics::CheckpointFailures>>,
    /// The next checkpoint id, shared across attempts so ids never repeat.
    pub(crate) next_id: Arc<std::sync::atomic::AtomicU64>,
    /// The checkpoints pending, for the job's statistics (written by the coordinator's thread
    /// after each step, read by anyone).
    pub(crate) in_progress: Arc<crate::metrics::InProgress>,
    pub(crate) end: EndOfJob,
    /// The checkpoint directory's lock: checked before every completion and commit notice.
    pub(crate) lock: Arc<DirectoryLock>,
    pub(crate) crash: Option<Arc<dyn CrashSchedule>>,
    /// A configuration changed on the running job, taken at the next tick: it applies to the
    /// checkpoints triggered from then on. Several take turns, one checkpoint each.
    pub(crate) update: Arc<Mutex<Option<Vec<CheckpointConfig>>>>,
    /// The settings the tasks read at each checkpoint, stored when a new configuration is taken.
    pub(crate) live: Option<Arc<super::task::LiveSettings>>,
    /// Local recovery: the tasks' parts kept in the process, made the copy as a checkpoint
    /// completes.
    pub(crate) local: Option<Arc<super::local::LocalCopies>>,
}

/// The checkpoint coordinator's state machine.
pub(crate) struct CoordinatorCore {
    s: CoordinatorSetup,
    sources: usize,
    next_id: u64,
    consecutive_failures: u32,
    /// Set once the coordinator failed the job or crashed: it does nothing more.
    halted: bool,
    /// Set once a stop-with-savepoint completed: the job is stopping, and no checkpoint starts.
    stopped: bool,
    trigger: TriggerPolicy,
    pending: PendingSet,
    requests: OutsideRequests,
    files: SharedFileRegistry,
    out: Vec<Command>,
}

impl CoordinatorCore {
    pub(crate) fn new(s: CoordinatorSetup) -> Self {
        let next_id = s.first_id.max(s.next_id.load(Ordering::SeqCst));
        CoordinatorCore {
            sources: s.tasks.iter().filter(|t| t.is_source).count(),
            next_id,
            consecutive_failures: 0,
            halted: false,
            stopped: false,
            trigger: TriggerPolicy::new(s.clock.now_ns()),
            pending: PendingSet::default(),
            requests: OutsideRequests::new(Arc::clone(&s.update)),
            files: SharedFileRegistry::default(),
            out: Vec::new(),
            s,
        }
    }

    /// Whether the coordinator failed the job or crashed: it takes no more events.
    pub(crate) fn is_halted(&self) -> bool {
        self.halted
    }

    fn in_backlog(&self) -> bool {
        self.s.end.sources_in_backlog.load(Ordering::SeqCst) > 0
    }

    /// When the next checkpoint is due, on the job clock (never, while a backlog pauses them).
    pub(crate) fn next_trigger_ns(&self) -> u64 {
        self.trigger.next_trigger_ns(&self.s.config, self.in_backlog())
    }

    fn take_commands(&mut self) -> Vec<Command> {
        std::mem::take(&mut self.out)
    }

    /// A savepoint was asked for: it is triggered at the next tick.
    pub(crate) fn on_savepoint(&mut self, request: SavepointRequest) {
        self.requests.take(CoordinatorRequest::Savepoint(request));
    }

    /// A request from the job's handle: a savepoint, or a checkpoint now (triggered at the
    /// next tick that has room for one, however long since the last).
    pub(crate) fn on_request(&mut self, request: CoordinatorRequest) {
        self.requests.take(request);
    }

    /// The attempt is over (the job ended, failed or was cancelled), and no snapshot write
    /// runs any more: checkpoints in flight can no longer complete, and their folders must not
    /// stay behind.
    pub(crate) fn on_shutdown(&mut self) -> Vec<Command> {
        if self.halted {
            return Vec::new();
        }
        for id in self.pending.ids() {
            self.remove_pending(id);
            self.abort(id);
        }
        self.pending.replace_kept(None);
        for id in self.pending.aborted_ids() {
            if self.s.storage.checkpoint_dir(id).exists() {
                self.drop_files(id);
            }
        }
        self.halted = true;
        self.take_commands()
    }

    /// A task acknowledged (or declined) its part of a checkpoint.
    pub(crate) fn on_ack(&mut self, ack: TaskAck, now_ns: u64) -> Vec<Command> {
        if self.halted {
            return Vec::new();
        }
        self.ack(ack, now_ns);
        self.take_commands()
    }

    fn ack(&mut self, ack: TaskAck, now_ns: u64) {
        if let Ok(done) = &ack.result {
            self.files.note_bases(ack.checkpoint, &done.shared);
        }
        if !self.pending.contains(ack.checkpoint) {
            if self.pending.was_aborted(ack.checkpoint) && !self.pending.is_kept(ack.checkpoint) {
                // A writer finished after the abort: what it wrote goes too (a kept
                // checkpoint's files go together, later).
                self.drop_files(ack.checkpoint);
            }
            return;
        }
        let result = ack.result.and_then(|done| match self.files.deleted_among(&done.shared) {
            // Its writer read a page index older than a completion that retired the file
            // (a race with retention): this checkpoint cannot be restored.
            Some(f) => {
                Err(Error::Checkpoint(format!("refers to shared state {}, which retention already deleted", f.file)))
            }
            None => Ok(done),
        });
        match result {
            Ok(done) => {
                let (task, id) = (ack.task, ack.checkpoint);
                let p = self.pending.get_mut(id).expect("present");
                assert!(p.acks.insert(task, done).is_none(), "task {task} acknowledged checkpoint {id} twice");
                p.acked_ns.insert(task, now_ns);
                if p.acks.len() >= self.s.tasks.len() {
                    self.all_acknowledged(id, now_ns);
                }
            }
            Err(e) if !e.is_retryable() => {
                // Trying again cannot help (the task lost its checkpoint directory, say): the
                // job fails with the task's error rather than after more declined checkpoints.
                self.remove_pending(ack.checkpoint);
                let reason = format!("task {} declined: {e}", ack.task);
                self.requests.answer_failed(ack.checkpoint, &reason);
                self.abort(ack.checkpoint);
                self.record_failure(ack.checkpoint, &reason);
                self.halt(e);
            }
            Err(e) => {
                let p = self.remove_pending(ack.checkpoint).expect("present");
                self.keep_parts(p);
                self.failed(ack.checkpoint, &format!("task {} declined: {e}", ack.task));
            }
        }
    }

    /// Every task acknowledged checkpoint `id`: it completes, or fails.
    fn all_acknowledged(&mut self, id: u64, now_ns: u64) {
        let p = self.remove_pending(id).expect("present");
        // Kept parts count as in use: a checkpoint older than the kept one may complete.
        let in_use = self.pending.shared_in_use();
        match self.complete(p, &in_use, now_ns) {
            Ok(()) => {
                self.consecutive_failures = 0;
                if self.trigger.completed(id, now_ns) {
                    // Everything before the end of input is committed.
                    self.end_input();
                }
                // Older checkpoints still pending are subsumed.
                for older in self.pending.ids_before(id) {
                    self.remove_pending(older);
                    self.abort(older);
                }
            }
            // Another process owns the directory now (touch nothing in it: its files may be
            // the new owner's), or the process crashed: just stop.
            Err(_) if self.halted => {}
            Err(reason) => self.failed(id, &reason.to_string()),
        }
    }

    /// From now on `config` holds, and the tasks read its settings at their next checkpoint.
    fn take_config(&mut self, config: CheckpointConfig) {
        if let Some(live) = &self.s.live {
            live.apply(&config);
            // Configurations taking turns, one of which overtakes: the gates slice records in
            // the aligned turns too. Else a task takes whole chunks while an aligned checkpoint
            // is in force, and the next unaligned barrier, injected by a source on the same
            // worker, waits for such a chunk of slow records: the lab's unaligned checkpoints
            // on a backlog of 100 µs records took 86 ms, against 6 ms run alone.
            if self.trigger.a_turn_overtakes() {
                live.slice_records();
            }
        }
        self.s.config = config;
    }

    /// Time passed: expires checkpoints, and triggers the next one when it is due.
    pub(crate) fn on_tick(&mut self, now_ns: u64) -> Vec<Command> {
        if self.halted {
            return Vec::new();
        }
        self.tick(now_ns);
        self.take_commands()
    }

    fn tick(&mut self, now: u64) {
        if let Some(configs) = self.requests.take_update() {
            let first = self.trigger.hand_over(configs);
            self.take_config(first);
        }
        if !self.expire(now) || self.refuses_checkpoints() {
            return;
        }
        // A savepoint is triggered at once (aligned, whatever the mode) and alone: checkpoints
        // in flight are aborted for it (an unaligned one would overtake its barriers, and a
        // task must snapshot in checkpoint order), and none starts until it is done — not
        // even the final one, whose commits would come after a stop-with-savepoint's. Once
        // the final checkpoint started, the job is finishing and takes no savepoint.
        let savepoint_pending = self.pending.savepoint_in_flight();
        if self.trigger.final_id().is_some() {
            self.requests.refuse_all("the job is finishing: its final checkpoint is in progress");
        }
        let moment = Moment {
            in_backlog: self.in_backlog(),
            asked: self.requests.checkpoint_asked(),
            room: self.pending.len() < self.s.config.max_concurrent && !savepoint_pending,
            sources_at_end: self.sources > 0 && self.s.end.sources_at_end.load(Ordering::SeqCst) >= self.sources,
        };
        let final_due = self.trigger.final_due(moment);
        let savepoint = if savepoint_pending { None } else { self.requests.next_savepoint() };
        if savepoint.is_some() {
            for id in self.pending.ids() {
                self.remove_pending(id);
                self.abort(id);
                self.record_failure(id, "aborted for a savepoint");
            }
        }
        if savepoint.is_none() && !self.trigger.due(now, &self.s.config, moment) && !final_due {
            return;
        }
        self.trigger(now, savepoint, final_due);
    }

    /// Fails every pending checkpoint past its timeout. False once the job halted for it.
    fn expire(&mut self, now: u64) -> bool {
        // Writers of an aborted checkpoint end within its timeout (or fail it).
        self.pending.forget_aborted(now, ns(self.s.config.checkpoint_timeout));
        for id in self.pending.expired(now) {
            let p = self.remove_pending(id).expect("listed above");
            let reason = p.expiry_reason(&self.s.tasks);
            self.keep_parts(p);
            self.failed(id, &reason);
            if self.halted {
                return false;
            }
        }
        true
    }

    /// Whether no checkpoint may start now (the job is finishing or stopping, or its final
    /// checkpoint failed), answering the requests waiting for one.
    fn refuses_checkpoints(&mut self) -> bool {
        if self.s.end.finished_tasks.load(Ordering::SeqCst) > 0 {
            // Some task finished: it cannot acknowledge, so no checkpoint can complete now.
            let why = "the job is finishing: some of its tasks already ended";
            for id in self.pending.ids() {
                self.remove_pending(id);
                self.requests.answer_failed(id, why);
                self.abort(id);
            }
            self.requests.refuse_all(why);
            return true;
        }
        if self.stopped {
            self.requests.refuse_all("the job is stopping with a savepoint");
            return true;
        }
        if self.s.end.input_ended.load(Ordering::SeqCst) {
            // The sources are ending their streams: no checkpoint can complete now.
            self.requests.refuse_all("the job is finishing: its input has ended");
            return true;
        }
        if let Some(f) = self.trigger.final_id().filter(|f| !self.pending.contains(*f)) {
            // The final checkpoint failed (its reason is among the failures): the job ends
            // without it rather than wait for one that may never fit, and its last output is
            // committed once the whole job has succeeded, as without checkpoints.
            self.record_failure(f, "it was the final checkpoint: the job ends without it");
            self.end_input();
            return true;
        }
        false
    }

    /// Triggers the next checkpoint (`savepoint` if one is asked for; the final one when
    /// `final_due`): its id, its configuration's turn, its folder, its barriers to the
    /// sources' tasks, and its pending entry.
    fn trigger(&mut self, now: u64, savepoint: Option<SavepointRequest>, final_due: bool) {
        let id = self.next_id;
        if final_due {
            self.s.end.final_started.store(true, Ordering::SeqCst);
        }
        self.trigger.triggered(id, now, final_due);
        self.next_id += 1;
        self.s.next_id.store(self.next_id, Ordering::SeqCst);
        // Configurations taking turns: each checkpoint its own (a savepoint goes its own way).
        if let Some(config) = savepoint.is_none().then(|| self.trigger.next_turn()).flatten() {
            self.take_config(config);
        }
        // A process that lost the directory (stopped, then continued after its successor took
        // over) must not make a folder there: the id may be one the successor used.
        if self.still_owner().is_err() {
            return;
        }
        if let Err(e) = self.s.storage.prepare(id) {
            return self.failed(id, &e.to_string());
        }
        if self.s.config.faults.as_ref().is_some_and(|f| f.decline(id)) {
            return self.failed(id, "declined by the coordinator (injected)");
        }
        let barrier = Barrier {
            id,
            trigger_ns: self.s.clock.now_ns(),
            // With an alignment timeout, barriers start aligned and turn unaligned only at a
            // task that waited too long. Savepoints are always aligned.
            unaligned: savepoint.is_none() && self.s.config.mode.overtakes_at_once(),
            savepoint: savepoint.is_some(),
        };
        // A savepoint refers to nothing outside its folder anyway.
        if self.requests.take_full() && savepoint.is_none() {
            match &self.s.live {
                Some(live) => live.mark_full(id),
                None => {
                    tracing::warn!(job = %self.s.job, checkpoint = id, "a full checkpoint asked for, taken as configured")
                }
            }
        }
        for t in self.s.tasks.iter().filter(|t| t.is_source) {
            self.out.push(Command::Send(t.index, TaskControl::Trigger(barrier)));
        }
        tracing::info!(
            job = %self.s.job,
            checkpoint = id,
            unaligned = barrier.unaligned,
            savepoint = barrier.savepoint,
            "checkpoint triggered"
        );
        let pending = self.pending_for(barrier, now, savepoint);
        self.pending.insert(pending);
    }

    /// The pending entry of a checkpoint triggered at `now` with `barrier`.
    fn pending_for(&mut self, barrier: Barrier, now: u64, savepoint: Option<SavepointRequest>) -> Pending {
        let c = &self.s.config;
        // A savepoint has its own timeout: it must not fail for the reason ordinary checkpoints
        // expire (a slow job), when a user is stopping the job with it.
        let timeout = if barrier.savepoint { c.savepoint_timeout } else { c.checkpoint_timeout };
        Pending {
            barrier,
            started_ns: now,
            interval_ns: TriggerPolicy::interval_ns(c, self.in_backlog()).unwrap_or(0),
            timeout_ns: ns(timeout),
            mode: (!barrier.savepoint).then_some(c.mode),
            acks: HashMap::new(),
            acked_ns: HashMap::new(),
            requested: if barrier.savepoint { Vec::new() } else { self.requests.take_asked() },
            savepoint,
            resumes: self.pending.resumes(),
        }
    }

    /// Whether the process dies at `point` of checkpoint `id` (then it has halted).
    fn crashes_at(&mut self, point: CrashPoint, id: u64) -> bool {
        if self.s.crash.as_ref().is_some_and(|c| c.crash_at(point, id)) {
            self.halted = true;
            self.out.push(Command::Crash(point, id));
            return true;
        }
        false
    }

    fn halt(&mut self, e: Error) {
        self.halted = true;
        self.out.push(Command::Fail(e));
    }

    /// Takes checkpoint `id` out of the pending ones; whoever waits for it (a savepoint, a
    /// checkpoint asked for now) waits for its fate among the requests.
    fn remove_pending(&mut self, id: u64) -> Option<Pending> {
        let mut p = self.pending.remove(id)?;
        self.requests.await_fate(id, p.savepoint.take(), std::mem::take(&mut p.requested));
        Some(p)
    }

    fn record_failure(&self, id: u64, reason: &str) {
        tracing::warn!(job = %self.s.job, checkpoint = id, reason, "checkpoint failed");
        let failed_unix_ms = self.s.clock.epoch_ms_at(self.s.clock.now_ns());
        let failure = crate::metrics::CheckpointFailure { checkpoint: id, failed_unix_ms, reason: reason.to_string() };
        self.s.failures.lock().unwrap_or_else(|e| e.into_inner()).push(failure);
    }

    /// Aborts `id` and counts a failure; fails the job after too many in a row.
    fn failed(&mut self, id: u64, reason: &str) {
        self.requests.answer_failed(id, reason);
        self.abort(id);
        self.record_failure(id, reason);
        self.consecutive_failures += 1;
        if self.consecutive_failures > self.s.config.tolerable_failed_checkpoints {
            let e = Error::Checkpoint(format!(
                "{} consecutive checkpoints failed (tolerable: {}); the last, {id}: {reason}",
                self.consecutive_failures, self.s.config.tolerable_failed_checkpoints
            ));
            self.halt(e);
        }
    }

    /// Tells the sources to end their streams (the final checkpoint is done, or failed).
    fn end_input(&mut self) {
        self.s.end.input_ended.store(true, Ordering::SeqCst);
        for t in self.s.tasks.iter().filter(|t| t.is_source) {
            self.out.push(Command::Send(t.index, TaskControl::EndOfInput));
        }
    }

    /// Fails the job (the core halts, touching nothing more in the directory) if this
    /// process no longer owns the checkpoint directory.
    fn still_owner(&mut self) -> Result<(), Error> {
        self.s.lock.check().map_err(|e| {
            self.halt(e);
            Error::Cancelled
        })
    }

    fn notify(&mut self, notice: CheckpointNotice) {
        for t in &self.s.tasks {
            self.out.push(Command::Send(t.index, TaskControl::Notice(notice)));
        }
    }

    fn abort(&mut self, id: u64) {
        if let Some(local) = &self.s.local {
            local.aborted(id);
        }
        self.requests.answer_failed(id, "it was aborted: the job is ending or failing");
        self.notify(CheckpointNotice::Aborted(id));
        if !self.pending.is_kept(id) {
            self.drop_files(id);
        }
        self.pending.aborted(id, self.s.clock.now_ns());
    }

    /// Removes what checkpoint `id`, which did not complete, wrote, but the shared files that
    /// kept parts, checkpoints in progress or completed ones refer to.
    fn drop_files(&mut self, id: u64) {
        self.files.drop_files(&self.s.storage, id, self.pending.shared_in_use());
    }

    /// Checkpoint `p` failed (it is removed from the pending ones; the caller fails it): the
    /// parts its tasks completed are kept in place of the older kept ones, and those tasks
    /// hear it before the abort notice (on which the others drop the parts they kept). A
    /// savepoint's parts are not kept.
    fn keep_parts(&mut self, p: Pending) {
        let id = p.barrier.id;
        let new = (!p.acks.is_empty() && !p.barrier.savepoint).then_some(KeptParts { id, parts: p.acks });
        for &task in new.iter().flat_map(|k| k.parts.keys()) {
            self.out.push(Command::Send(task, TaskControl::PartKept(id)));
        }
        if let Some(old) = self.pending.replace_kept(new) {
            // Parts reused from it were linked into the newer folder; what they refer to stays.
            self.drop_files(old.id);
        }
    }

    /// Completes a checkpoint every task acknowledged; `in_use` are the shared files that
    /// checkpoints still in progress refer to (retention keeps them).
    fn complete(&mut self, p: Pending, in_use: &HashSet<String>, now_ns: u64) -> Result<(), Error> {
        let id = p.barrier.id;
        let ms = |ns: u64| ns as f64 / 1e6;
        let mut stats = p.stats(&self.s.tasks, &self.s.clock, now_ns);
        let metadata = self.metadata_of(&p, stats.clone(), now_ns);
        if let Some(e) = self.s.config.faults.as_ref().and_then(|f| f.metadata_write(id)) {
            let path = self.s.storage.checkpoint_dir(id).join(super::storage::METADATA_FILE);
            return Err(Error::io("cannot write checkpoint metadata", path, e));
        }
        self.still_owner()?;
        if self.crashes_at(CrashPoint::MetadataNotRenamed, id) {
            // What a crash between the write and the rename leaves: the temporary file only.
            let _ = self.s.storage.write_unpublished_metadata(&metadata);
            return Err(Error::Cancelled);
        }
        let kept = self.pending.kept().into_iter().flat_map(KeptParts::shared);
        let (unverified, mut foreign) = self.files.unverified(id, &metadata, kept, &self.s.completed);
        // Changelog bases materialized in the background (read back whole when written) go
        // into the object store with the first checkpoint that refers to them.
        let bases = self.files.new_bases(&metadata, &unverified);
        self.s.storage.commit(&metadata)?;
        // Read back and verified before anything is committed under it: a checkpoint that
        // would not restore must never be the one sink transactions are committed under (its
        // folder goes with the abort that follows).
        self.s
            .storage
            .verify_including(id, &unverified)
            .map_err(|e| Error::Checkpoint(format!("its files did not verify when read back: {e}")))?;
        // Then into the object store, if the directory is kept in one: a checkpoint a process
        // elsewhere could not resume from must not be one transactions are committed under.
        if self.s.storage.mirror().is_some() && self.crashes_at(CrashPoint::BeforePublish, id) {
            return Err(Error::Cancelled);
        }
        let uploading = self.s.clock.now_ns();
        let publish_also: HashSet<String> = unverified.iter().chain(&bases).cloned().collect();
        self.s.storage.publish(&metadata, &publish_also)?;
        if self.s.storage.mirror().is_some() {
            let upload_ms = ms(self.s.clock.now_ns().saturating_sub(uploading));
            (stats.upload_ms, stats.duration_ms) = (Some(upload_ms), stats.duration_ms + upload_ms);
        }
        if let Some(req) = self.requests.completed_savepoint(id) {
            self.stopped |= req.stop;
            let copied = self.s.storage.copy_to_savepoint(id, &req.dir);
            let _ = req.reply.send(copied.map(|p| (id, p)).map_err(|e| RequestRefused::NotCopied(e.to_string())));
        }
        // Older checkpoints go before any sink commits: this one lists every transaction not
        // yet committed (a sink's snapshot carries all its pending ones, aborted checkpoints'
        // included), so after a crash from here on, recovery commits them from it alone. Only
        // an owner deletes anything or lets the sinks commit.
        self.still_owner()?;
        foreign.extend(bases);
        self.retire_older(id, &metadata, foreign, in_use);
        if self.crashes_at(CrashPoint::BeforeCompletionNotice, id) {
            return Err(Error::Cancelled);
        }
        if let Some(local) = &self.s.local {
            local.completed(id, self.s.tasks.len());
        }
        self.notify(CheckpointNotice::Complete(id));
        tracing::info!(
            job = %self.s.job,
            checkpoint = id,
            duration_ms = stats.duration_ms,
            alignment = stats.mode.map_or("savepoint", |m| m.kind().name()),
            state_bytes = stats.state_bytes,
            "checkpoint completed"
        );
        self.s.stats.lock().unwrap_or_else(|e| e.into_inner()).push(stats);
        // Published before the answer: whoever asked for this checkpoint sees it no longer
        // in progress (the loop's own publication comes after the step).
        self.s.in_progress.publish(self.in_progress_rows());
        self.requests.answer_completed(id);
        Ok(())
    }

    /// The pending checkpoints as the job's statistics show them.
    fn in_progress_rows(&self) -> impl ExactSizeIterator<Item = crate::metrics::CheckpointInProgress> + Clone + '_ {
        self.pending.rows(&self.s.clock, self.sources)
    }

    /// A completed checkpoint's `_metadata`: its tasks' files and the shared files they
    /// refer to, with `stats`.
    fn metadata_of(&self, p: &Pending, stats: super::storage::CheckpointStats, now_ns: u64) -> CheckpointMetadata {
        let mut tasks: Vec<TaskFile> = self
            .s
            .tasks
            .iter()
            .map(|t| {
                let a = &p.acks[&t.index];
                TaskFile {
                    task: t.index,
                    name: t.name.clone(),
                    file: a.file.clone(),
                    bytes: a.digest.bytes,
                    crc32c: a.digest.crc32c,
                    checkpoint: a.written_for,
                }
            })
            .collect();
        tasks.sort_by_key(|t| t.task);
        let mut shared: Vec<SharedFile> = p.acks.values().flat_map(|a| a.shared.iter().cloned()).collect();
        shared.sort();
        shared.dedup();
        CheckpointMetadata {
            format: FORMAT_VERSION,
            job: self.s.job.clone(),
            fingerprint: self.s.fingerprint.clone(),
            checkpoint: p.barrier.id,
            kind: "checkpoint".into(),
            mode: self.s.config.mode.to_string(),
            generation: self.s.lock.generation(),
            completed_unix_ms: self.s.clock.epoch_ms_at(now_ns),
            stats,
            tasks,
            shared,
            outputs: self.s.outputs.clone(),
        }
    }

    /// After checkpoint `id` completed: it adopts the `foreign` shared files it refers to,
    /// older checkpoints go as retention says (sparing the files of those `in_use`), and of
    /// a kept part it resumed, what it does not refer to.
    fn retire_older(&mut self, id: u64, metadata: &CheckpointMetadata, foreign: Vec<String>, in_use: &HashSet<String>) {
        let retention = (&mut self.s.completed, self.s.config.retained);
        self.files.retire(&self.s.storage, id, foreign, retention, in_use);
        if let Some(k) = self.pending.take_kept_before(id) {
            // Resumed: what this checkpoint refers to of the kept parts stays with it; the
            // rest goes.
            self.files.adopt_referred(metadata, k.shared());
            self.drop_files(k.id);
        }
    }
}

/// The coordinator's thread: feeds the core acknowledgements, savepoint requests and the
/// time, and carries out its commands, until the attempt ends (`shutdown`) or the core halts.
pub(crate) fn run_thread(
    mut core: CoordinatorCore,
    tasks: Vec<TaskEndpoint>,
    acks: Receiver<TaskAck>,
    requests: Receiver<CoordinatorRequest>,
    shutdown: Arc<AtomicBool>,
    writer: Arc<dyn SnapshotWriter>,
    fail: Box<dyn Fn(Error) + Send>,
) {
    let clock = core.s.clock.clone();
    let timeout = core.s.config.checkpoint_timeout;
    let dispatch = |commands: Vec<Command>| {
        for c in commands {
            match c {
                // A task that already finished has dropped its inbox; nothing to tell it.
                Command::Send(task, msg) => {
                    let _ = tasks[task].control.send(msg);
                }
                Command::Fail(e) => fail(e),
                Command::Crash(point, id) => {
                    eprintln!("injected crash at checkpoint {id}: {point:?}");
                    std::process::exit(70);
                }
            }
        }
    };
    let in_progress = Arc::clone(&core.s.in_progress);
    // None again however the thread ends: the attempt's pending checkpoints end with it.
    struct NonePending(Arc<crate::metrics::InProgress>);
    impl Drop for NonePending {
        fn drop(&mut self) {
            self.0.publish(std::iter::empty());
        }
    }
    let _none_pending = NonePending(Arc::clone(&in_progress));
    loop {
        if shutdown.load(Ordering::SeqCst) {
            // A writer that outlives the wait only leaves a folder the next start removes.
            writer.wait_idle(timeout.min(Duration::from_secs(10)));
            dispatch(core.on_shutdown());
            return;
        }
        let wait = Duration::from_nanos(core.next_trigger_ns().saturating_sub(clock.now_ns()))
            .clamp(Duration::from_micros(100), Duration::from_millis(5));
        let mut events = Vec::new();
        match acks.recv_timeout(wait) {
            Ok(a) => events.push(a),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        events.extend(acks.try_iter());
        for ack in events {
            dispatch(core.on_ack(ack, clock.now_ns()));
        }
        for req in requests.try_iter() {
            core.on_request(req);
        }
        dispatch(core.on_tick(clock.now_ns()));
        in_progress.publish(core.in_progress_rows());
        if core.is_halted() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::incremental::write_task_snapshot;
    use crate::checkpoint::task::{TaskDone, TaskStats};
    use crate::snapshot::TaskSnapshot;

    /// A coordinator over one source (task 0) and one other task (task 1), on a clock it
    /// does not read (every event carries its time).
    fn core(dir: &std::path::Path) -> CoordinatorCore {
        core_with(CheckpointConfig::new(dir).interval(Duration::from_millis(10)))
    }

    fn core_with(config: CheckpointConfig) -> CoordinatorCore {
        let storage = Arc::new(CheckpointStorage::for_job(&config.dir, "f"));
        let (lock, _) = DirectoryLock::acquire(&storage, "test").unwrap();
        CoordinatorCore::new(CoordinatorSetup {
            config,
            storage,
            tasks: vec![
                TaskInfo { index: 0, name: "source".into(), is_source: true },
                TaskInfo { index: 1, name: "sink".into(), is_source: false },
            ],
            outputs: Vec::new(),
            clock: Clock::manual(Arc::new(std::sync::atomic::AtomicU64::new(0))),
            first_id: 1,
            completed: Vec::new(),
            job: "test".into(),
            fingerprint: "f".into(),
            stats: Arc::default(),
            failures: Arc::default(),
            next_id: Arc::default(),
            in_progress: Arc::default(),
            end: EndOfJob::default(),
            lock: Arc::new(lock),
            crash: None,
            update: Arc::default(),
            live: None,
            local: None,
        })
    }

    /// The checkpoint lab's unaligned checkpoints on a backlog of 100 µs records took 86 ms,
    /// against 6 ms for unaligned checkpoints alone: each aligned turn turned the gates'
    /// slicing off, a task took whole chunks of slow records, and the next unaligned barrier,
    /// injected by a source on the same worker, waited behind one. Records stay sliced
    /// through every turn when one of the turns overtakes; an aligned job alone does not
    /// slice.
    #[test]
    fn records_stay_sliced_through_the_aligned_turns_of_the_lab() {
        let dir = tempfile::tempdir().unwrap();
        let config = CheckpointConfig::new(dir.path()).interval(Duration::from_millis(10));
        let live = Arc::new(crate::checkpoint::task::LiveSettings::new(&config));
        let mut core = core_with(config.clone());
        core.s.live = Some(Arc::clone(&live));
        let turns = vec![
            config.clone().mode(crate::checkpoint::CheckpointMode::Aligned),
            config.clone().mode(crate::checkpoint::CheckpointMode::Unaligned),
        ];
        *core.s.update.lock().unwrap() = Some(turns);
        core.on_tick(ns(Duration::from_millis(20)));
        assert_eq!(core.s.config.mode, crate::checkpoint::CheckpointMode::Aligned, "the first turn is in force");
        assert!(live.unaligned(), "records are sliced in the aligned turn");
        *core.s.update.lock().unwrap() = Some(vec![config.clone().mode(crate::checkpoint::CheckpointMode::Aligned)]);
        core.on_tick(ns(Duration::from_millis(40)));
        assert!(!live.unaligned(), "an aligned configuration alone does not slice");
    }

    /// What the tasks would acknowledge for `barrier`: their (empty) snapshots, written.
    fn ack(core: &CoordinatorCore, task: usize, barrier: Barrier) -> TaskAck {
        let w = write_task_snapshot(&core.s.storage, None, task, &TaskSnapshot::new(barrier)).unwrap();
        let done = TaskDone {
            file: w.file,
            digest: w.file_digest,
            written_for: None,
            stats: TaskStats::default(),
            shared: w.shared,
        };
        TaskAck { checkpoint: barrier.id, task, result: Ok(done) }
    }

    fn triggered(commands: &[Command]) -> Vec<Barrier> {
        commands
            .iter()
            .filter_map(|c| match c {
                Command::Send(0, TaskControl::Trigger(b)) => Some(*b),
                _ => None,
            })
            .collect()
    }

    fn completed(commands: &[Command]) -> Vec<u64> {
        commands
            .iter()
            .filter_map(|c| match c {
                Command::Send(1, TaskControl::Notice(CheckpointNotice::Complete(id))) => Some(*id),
                _ => None,
            })
            .collect()
    }

    /// A job catching up on a backlog checkpoints at the interval during backlog (here every
    /// 100 ms, not 10), and at the normal one again, from its last trigger, once no source
    /// reports one; zero takes none while the backlog lasts.
    #[test]
    fn a_backlog_stretches_the_interval_until_it_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let ms = 1_000_000;
        let config = CheckpointConfig::new(dir.path().join("chk"))
            .interval(Duration::from_millis(10))
            .interval_during_backlog(Duration::from_millis(100));
        let mut c = core_with(config);
        c.s.end.sources_in_backlog.store(1, Ordering::SeqCst);
        assert!(triggered(&c.on_tick(50 * ms)).is_empty(), "10 ms passed long ago, 100 ms not yet");
        let first = triggered(&c.on_tick(100 * ms));
        assert_eq!(first.len(), 1, "due at 100 ms");
        for task in 0..2 {
            c.on_ack(ack(&c, task, first[0]), 101 * ms);
        }
        assert!(triggered(&c.on_tick(150 * ms)).is_empty());
        c.s.end.sources_in_backlog.store(0, Ordering::SeqCst);
        assert_eq!(triggered(&c.on_tick(151 * ms)).len(), 1, "10 ms after the last trigger: due at once");
        let mut none = core_with(
            CheckpointConfig::new(dir.path().join("chk2"))
                .interval(Duration::from_millis(10))
                .interval_during_backlog(Duration::ZERO),
        );
        none.s.end.sources_in_backlog.store(1, Ordering::SeqCst);
        assert!(triggered(&none.on_tick(10_000 * ms)).is_empty(), "no checkpoint during a backlog");
        assert_eq!(none.next_trigger_ns(), u64::MAX);
        none.s.end.sources_in_backlog.store(0, Ordering::SeqCst);
        assert_eq!(triggered(&none.on_tick(10_001 * ms)).len(), 1);
    }

    /// `_metadata`'s completion time is the coordinator's clock at the time it is handed
    /// (under simulation, the simulated time: a seed's checkpoints are the same every run),
    /// never the wall clock.
    #[test]
    fn the_completion_time_comes_from_the_clock() {
        let dir = tempfile::tempdir().unwrap();
        let ms = 1_000_000;
        let mut c = core_with(CheckpointConfig::new(dir.path().join("chk")).interval(Duration::from_millis(10)));
        let first = triggered(&c.on_tick(10 * ms));
        for task in 0..2 {
            c.on_ack(ack(&c, task, first[0]), 37 * ms);
        }
        let metadata = super::super::read_metadata(&c.s.storage.checkpoint_dir(first[0].id)).unwrap();
        assert_eq!(metadata.completed_unix_ms, 37, "the manual clock's epoch is 0");
    }

    /// A coordinator checkpointing every 10 ms whose checkpoints expire after 50 ms.
    fn expiring_core(dir: &std::path::Path) -> CoordinatorCore {
        core_with(
            CheckpointConfig::new(dir)
                .interval(Duration::from_millis(10))
                .checkpoint_timeout(Duration::from_millis(50)),
        )
    }

    /// A checkpoint that expires says which tasks had not completed their part, so a user
    /// sees where it was stuck (the source had written its part; the sink never did).
    #[test]
    fn an_expired_checkpoint_names_the_tasks_it_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let ms = 1_000_000;
        let mut c = expiring_core(dir.path());
        let first = triggered(&c.on_tick(10 * ms));
        c.on_ack(ack(&c, 0, first[0]), 11 * ms);
        c.on_tick(70 * ms);
        let failures: Vec<String> = c.s.failures.lock().unwrap().kept().iter().map(ToString::to_string).collect();
        assert_eq!(
            failures,
            vec!["checkpoint 1 failed: expired after 50ms: 1 of 2 tasks had completed their part (kept for the next \
                  checkpoint); still waiting for sink"
                .to_string()]
        );
    }

    /// The user's case: a checkpoint that timed out threw away the part of every task that
    /// had finished. Now the source's part of expired checkpoint 1 is kept (the source hears
    /// so before the abort), checkpoint 2 completes with it reused (its file carries
    /// checkpoint 1's identity, and restores), its statistics say which part was reused and
    /// why the other was not, and checkpoint 1's folder goes once 2 completed.
    #[test]
    fn an_expired_checkpoint_keeps_the_finished_parts_for_the_next_one() {
        let dir = tempfile::tempdir().unwrap();
        let ms = 1_000_000;
        let mut c = expiring_core(dir.path());
        let first = triggered(&c.on_tick(10 * ms))[0];
        let source_part = ack(&c, 0, first);
        let source_file = match &source_part.result {
            Ok(done) => done.file.clone(),
            Err(e) => panic!("{e}"),
        };
        c.on_ack(source_part, 11 * ms);
        let commands = c.on_tick(70 * ms);
        let sent: Vec<String> = commands
            .iter()
            .filter_map(|c| match c {
                Command::Send(0, m) => Some(format!("{m:?}")),
                _ => None,
            })
            .collect();
        assert_eq!(sent[..2], ["PartKept(1)".to_string(), "Notice(Aborted(1))".to_string()]);
        assert!(c.s.storage.checkpoint_dir(1).join(&source_file).exists(), "the finished part is kept");
        let second = triggered(&commands)[0];
        assert_eq!(second.id, 2);
        // The source's writer found nothing changed: it links its kept part into checkpoint 2.
        c.s.storage.link_task(1, 2, &source_file).unwrap();
        let kept = c.pending.kept().unwrap().parts[&0].digest;
        let stats = TaskStats { reused_from: Some(1), ..Default::default() };
        let done = TaskDone { file: source_file, digest: kept, written_for: Some(1), stats, shared: Vec::new() };
        c.on_ack(TaskAck { checkpoint: 2, task: 0, result: Ok(done) }, 81 * ms);
        let sink = ack(&c, 1, second);
        assert_eq!(completed(&c.on_ack(sink, 82 * ms)), vec![2]);
        let metadata = c.s.storage.verify(2).unwrap();
        assert_eq!(metadata.tasks[0].checkpoint, Some(1));
        assert_eq!(metadata.tasks[1].checkpoint, None);
        c.s.storage.load(2).unwrap();
        let stats = &metadata.stats;
        assert_eq!(stats.resumed_from, Some(1));
        assert!(stats.parts[0].reused && stats.parts[0].why_not.is_none(), "{:?}", stats.parts);
        assert_eq!(stats.parts[1].why_not.as_deref(), Some("it had not completed its part of checkpoint 1"));
        assert!(!c.s.storage.checkpoint_dir(1).exists(), "the kept folder goes once a later checkpoint completed");
    }

    /// A checkpoint asked for now (the control endpoint's `checkpoint`) is triggered at the
    /// next tick, long before the interval, and answered with its id when it completes; one
    /// that fails is answered with why.
    #[test]
    fn a_checkpoint_asked_for_is_taken_at_once_and_answered() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = core_with(CheckpointConfig::new(dir.path().join("chk")).interval(Duration::from_secs(3600)));
        let ms = 1_000_000;
        assert!(triggered(&c.on_tick(ms)).is_empty(), "an hour's interval");
        let (reply, answer) = std::sync::mpsc::channel();
        c.on_request(CoordinatorRequest::Checkpoint { reply, full: false });
        let asked = triggered(&c.on_tick(2 * ms));
        assert_eq!(asked.len(), 1);
        assert!(answer.try_recv().is_err(), "not answered before it completes");
        let a = ack(&c, 0, asked[0]);
        c.on_ack(a, 3 * ms);
        let b = ack(&c, 1, asked[0]);
        assert_eq!(completed(&c.on_ack(b, 4 * ms)), vec![asked[0].id]);
        assert_eq!(answer.try_recv().unwrap(), Ok(asked[0].id));
        // Asked again, and declined by a task: the answer says why.
        let (reply, answer) = std::sync::mpsc::channel();
        c.on_request(CoordinatorRequest::Checkpoint { reply, full: false });
        let second = triggered(&c.on_tick(5 * ms));
        assert_eq!(second.len(), 1);
        let declined = TaskAck { checkpoint: second[0].id, task: 1, result: Err(Error::Checkpoint("no room".into())) };
        c.on_ack(declined, 6 * ms);
        let why = answer.try_recv().unwrap().unwrap_err().to_string();
        assert!(why.contains(&format!("checkpoint {} failed", second[0].id)) && why.contains("no room"), "{why}");
    }

    /// Found by the simulator: a stop-with-savepoint let later checkpoints (the final one
    /// too) commit output after the savepoint. It runs alone, and nothing starts after it.
    #[test]
    fn a_stop_with_savepoint_runs_alone_and_nothing_starts_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = core(&dir.path().join("chk"));
        let ms = 1_000_000;
        let first = triggered(&c.on_tick(10 * ms));
        assert_eq!(first.iter().map(|b| b.id).collect::<Vec<_>>(), vec![1]);
        let (reply, answer) = std::sync::mpsc::channel();
        c.on_savepoint(SavepointRequest { dir: dir.path().join("sp"), reply, stop: true });
        let commands = c.on_tick(11 * ms);
        // Checkpoint 1 is aborted for the savepoint, which is triggered aligned.
        assert!(commands
            .iter()
            .any(|c| matches!(c, Command::Send(1, TaskControl::Notice(CheckpointNotice::Aborted(1))))));
        let savepoint = triggered(&commands);
        assert_eq!(savepoint.len(), 1);
        assert!(!savepoint[0].unaligned);
        // Every source is at its end while the savepoint is in flight: no final checkpoint yet.
        c.s.end.sources_at_end.store(1, Ordering::SeqCst);
        assert!(triggered(&c.on_tick(30 * ms)).is_empty(), "nothing starts beside a savepoint");
        let a = ack(&c, 0, savepoint[0]);
        assert!(c.on_ack(a, 31 * ms).is_empty());
        let b = ack(&c, 1, savepoint[0]);
        assert_eq!(completed(&c.on_ack(b, 32 * ms)), vec![savepoint[0].id]);
        assert!(answer.try_recv().unwrap().is_ok(), "the savepoint was written");
        // Stopping: neither a checkpoint nor the final one starts any more.
        for t in 40..60 {
            assert!(triggered(&c.on_tick(t * ms)).is_empty(), "a checkpoint after a stop-with-savepoint");
        }
    }

    /// A stop-with-savepoint while checkpoints expired failed with "the savepoint did not
    /// complete (… Some(\"checkpoint 49 failed: aborted for a savepoint\"))": it had the
    /// checkpoints' timeout, the caller gave up at the same moment, and the reason shown was
    /// another checkpoint's. A savepoint now has its own timeout, and its request is answered
    /// with its own checkpoint's fate, in words.
    #[test]
    fn a_savepoint_has_its_own_timeout_and_is_told_why_it_failed() {
        let dir = tempfile::tempdir().unwrap();
        let config = CheckpointConfig::new(dir.path().join("chk"))
            .interval(Duration::from_millis(10))
            .checkpoint_timeout(Duration::from_millis(5))
            .savepoint_timeout(Duration::from_millis(100));
        let mut c = core_with(config);
        let ms = 1_000_000;
        let (reply, answer) = std::sync::mpsc::channel();
        c.on_savepoint(SavepointRequest { dir: dir.path().join("sp"), reply, stop: true });
        let savepoint = triggered(&c.on_tick(ms));
        assert_eq!(savepoint.len(), 1);
        let a = ack(&c, 0, savepoint[0]);
        assert!(c.on_ack(a, 2 * ms).is_empty());
        // Past the checkpoints' timeout, within its own: still in flight.
        c.on_tick(50 * ms);
        assert!(answer.try_recv().is_err(), "not answered yet");
        c.on_tick(102 * ms);
        let why = answer.try_recv().unwrap().unwrap_err().to_string();
        assert!(why.contains(&format!("its checkpoint ({})", savepoint[0].id)), "{why}");
        assert!(why.contains("expired after 100ms: 1 of 2 tasks had completed their part; still waiting for"), "{why}");
        assert!(why.contains("--savepoint-timeout-ms") && !why.contains("kept"), "{why}");
    }

    /// Found by the simulator (seed 1132658, at-least-once): checkpoints went on being
    /// triggered while the final one was in flight; a union task that does not align took the
    /// next one's barrier before the final one's second and dropped the final one, the newer
    /// ones all failed (their writes over the limit), and the job waited out the final one's
    /// timeout. Nothing starts after the final checkpoint.
    #[test]
    fn no_checkpoint_starts_while_the_final_one_is_in_flight() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = core_with(
            CheckpointConfig::new(dir.path().join("chk")).interval(Duration::from_millis(1)).max_concurrent(3),
        );
        let ms = 1_000_000;
        let first = triggered(&c.on_tick(ms));
        assert_eq!(first.len(), 1, "the interval is up");
        c.s.end.sources_at_end.store(1, Ordering::SeqCst);
        let last = triggered(&c.on_tick(2 * ms));
        assert_eq!(last.len(), 1, "the final checkpoint starts at once");
        assert_eq!(c.trigger.final_id(), Some(last[0].id));
        for t in 3..20 {
            assert!(triggered(&c.on_tick(t * ms)).is_empty(), "nothing after the final checkpoint (at {t} ms)");
        }
        // It completes and ends the input.
        for task in [0, 1] {
            let a = ack(&c, task, last[0]);
            c.on_ack(a, 20 * ms);
        }
        assert!(c.s.end.input_ended.load(Ordering::SeqCst));
    }

    /// A savepoint is refused once the final checkpoint started: the job is finishing.
    #[test]
    fn a_savepoint_is_refused_once_the_final_checkpoint_started() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = core(&dir.path().join("chk"));
        c.s.end.sources_at_end.store(1, Ordering::SeqCst);
        let last = triggered(&c.on_tick(1));
        assert_eq!(last.len(), 1, "the final checkpoint starts at once");
        assert!(c.s.end.final_started.load(Ordering::SeqCst));
        let (reply, answer) = std::sync::mpsc::channel();
        c.on_savepoint(SavepointRequest { dir: dir.path().join("sp"), reply, stop: true });
        assert!(triggered(&c.on_tick(2)).is_empty());
        let refusal = answer.try_recv().unwrap().unwrap_err().to_string();
        assert!(refusal.contains("finishing"), "{refusal}");
    }
}
