//! The checkpoint coordinator: its own thread, never a worker. It triggers checkpoints at the
//! sources, collects the tasks' acknowledgements, completes a checkpoint by writing its
//! `_metadata` atomically, then tells every task (sinks commit); it aborts checkpoints that
//! time out or are declined, tells the tasks, and fails the job after too many consecutive
//! failures. It retains the configured number of completed checkpoints.
//!
//! Sources at the end of their input keep answering triggers; once all are, the coordinator
//! takes the final checkpoint at once and, when it completes, tells them to end their streams
//! (after FLIP-147: a source that ends first does not stop the job's checkpoints, and a
//! bounded job's output is committed by a checkpoint).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::config::CheckpointConfig;
use super::lock::DirectoryLock;
use super::storage::{CheckpointMetadata, CheckpointStats, CheckpointStorage, SharedFile, TaskFile, FORMAT_VERSION};
use super::task::{TaskAck, TaskControl, TaskDone, TaskStats, WritesInFlight};
use crate::context::Clock;
use crate::error::Error;
use crate::snapshot::{Barrier, CheckpointNotice};

/// How the coordinator reaches one task.
pub(crate) struct TaskEndpoint {
    pub(crate) index: usize,
    pub(crate) name: String,
    pub(crate) is_source: bool,
    pub(crate) control: Sender<TaskControl>,
}

/// A request for a savepoint: an aligned checkpoint copied, complete, into `dir`.
pub(crate) struct SavepointRequest {
    pub(crate) dir: std::path::PathBuf,
    /// The savepoint's checkpoint id and folder, or why it failed.
    pub(crate) reply: Sender<Result<(u64, std::path::PathBuf), String>>,
}

/// Everything the coordinator thread owns.
pub(crate) struct Coordinator {
    pub(crate) config: CheckpointConfig,
    pub(crate) storage: Arc<CheckpointStorage>,
    pub(crate) tasks: Vec<TaskEndpoint>,
    pub(crate) acks: Receiver<TaskAck>,
    pub(crate) clock: Clock,
    /// The id of the first checkpoint this attempt triggers.
    pub(crate) first_id: u64,
    /// Completed checkpoints already on disk (for retention).
    pub(crate) completed: Vec<u64>,
    pub(crate) job: String,
    pub(crate) fingerprint: String,
    pub(crate) stats: Arc<Mutex<Vec<CheckpointStats>>>,
    /// Why checkpoints failed, for the job's notes.
    pub(crate) failures: Arc<Mutex<Vec<String>>>,
    /// The next checkpoint id, shared across attempts so ids never repeat.
    pub(crate) next_id: Arc<std::sync::atomic::AtomicU64>,
    /// Set when the attempt ends.
    pub(crate) shutdown: Arc<AtomicBool>,
    /// The attempt's snapshot writes still running.
    pub(crate) writes: Arc<WritesInFlight>,
    /// Tasks that finished: once any has, no new checkpoint can complete.
    pub(crate) finished_tasks: Arc<AtomicUsize>,
    /// Source subtasks at the end of their input: once all are, the next checkpoint is the
    /// final one, and its completion tells them to end their streams.
    pub(crate) sources_at_end: Arc<AtomicUsize>,
    /// Set once the sources were told to end their streams.
    pub(crate) input_ended: Arc<AtomicBool>,
    /// Fails the job.
    pub(crate) fail: Box<dyn Fn(Error) + Send>,
    /// Savepoints asked for by hand.
    pub(crate) savepoints: Receiver<SavepointRequest>,
    /// Shared files retention deleted in this attempt: a checkpoint referring to one fails.
    pub(crate) deleted_shared: HashSet<String>,
    /// Checkpoints aborted in this attempt, and when: other tasks may still be writing their
    /// parts into the folder, so it is removed again as their late acknowledgements come in.
    pub(crate) aborted: BTreeMap<u64, Instant>,
    /// The checkpoint directory's lock: checked before every completion and commit notice.
    pub(crate) lock: Arc<DirectoryLock>,
    /// Set when the lock check failed: the job is failing, and nothing more may complete.
    pub(crate) fenced: bool,
}

struct Pending {
    barrier: Barrier,
    started: Instant,
    acks: HashMap<usize, TaskDone>,
    savepoint: Option<SavepointRequest>,
}

impl Coordinator {
    pub(crate) fn run(mut self) {
        let mut next_id = self.first_id.max(self.next_id.load(Ordering::SeqCst));
        let mut pending: BTreeMap<u64, Pending> = BTreeMap::new();
        let mut consecutive_failures = 0u32;
        let mut last_completion: Option<Instant> = None;
        let mut next_trigger = Instant::now() + self.config.interval;
        let sources = self.tasks.iter().filter(|t| t.is_source).count();
        // The final checkpoint, once triggered.
        let mut final_id: Option<u64> = None;
        loop {
            if self.shutdown.load(Ordering::SeqCst) {
                // The attempt is over (the job ended, failed or was cancelled): checkpoints in
                // flight can no longer complete, and their folders must not stay behind. (A
                // writer that outlives the wait only leaves a folder the next start removes.)
                self.writes.wait_idle(self.config.timeout.min(Duration::from_secs(10)));
                for id in std::mem::take(&mut pending).into_keys() {
                    self.abort(id);
                }
                for &id in self.aborted.keys() {
                    if self.storage.checkpoint_dir(id).exists() {
                        self.storage.discard(id);
                    }
                }
                return;
            }
            let wait = next_trigger
                .saturating_duration_since(Instant::now())
                .clamp(Duration::from_micros(100), Duration::from_millis(5));
            let mut events = Vec::new();
            match self.acks.recv_timeout(wait) {
                Ok(a) => events.push(a),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            events.extend(self.acks.try_iter());
            for ack in events {
                let Some(p) = pending.get_mut(&ack.checkpoint) else {
                    if self.aborted.contains_key(&ack.checkpoint) {
                        // A writer finished after the abort: what it wrote goes too.
                        self.storage.discard(ack.checkpoint);
                    }
                    continue;
                };
                let result = ack.result.and_then(|done| {
                    match done.shared.iter().find(|f| self.deleted_shared.contains(&f.file)) {
                        // Its writer read a page index older than a completion that retired the
                        // file (a race with retention): this checkpoint cannot be restored.
                        Some(f) => Err(format!("refers to shared state {}, which retention already deleted", f.file)),
                        None => Ok(done),
                    }
                });
                match result {
                    Ok(info) => {
                        p.acks.insert(ack.task, info);
                        if p.acks.len() == self.tasks.len() {
                            let p = pending.remove(&ack.checkpoint).expect("present");
                            let in_use: HashSet<String> = pending
                                .values()
                                .flat_map(|p| p.acks.values().flat_map(|a| a.shared.iter().map(|s| s.file.clone())))
                                .collect();
                            match self.complete(p, &in_use) {
                                Ok(()) => {
                                    consecutive_failures = 0;
                                    last_completion = Some(Instant::now());
                                    if final_id.is_some_and(|f| ack.checkpoint >= f) {
                                        // Everything before the end of input is committed.
                                        self.end_input();
                                    }
                                    // Older checkpoints still pending are subsumed.
                                    let older: Vec<u64> = pending.range(..ack.checkpoint).map(|(k, _)| *k).collect();
                                    for id in older {
                                        pending.remove(&id);
                                        self.abort(id);
                                    }
                                }
                                // Another process owns the directory now: touch nothing
                                // in it (its files may be the new owner's), just stop.
                                Err(_) if self.fenced => return,
                                Err(reason) => {
                                    if self.failed(&mut consecutive_failures, ack.checkpoint, &reason) {
                                        return;
                                    }
                                }
                            }
                        }
                    }
                    Err(reason) => {
                        pending.remove(&ack.checkpoint);
                        if self.failed(
                            &mut consecutive_failures,
                            ack.checkpoint,
                            &format!("task {} declined: {reason}", ack.task),
                        ) {
                            return;
                        }
                    }
                }
            }
            // Writers of an aborted checkpoint end within its timeout (or fail it).
            let timeout = self.config.timeout;
            self.aborted.retain(|_, at| at.elapsed() <= timeout);
            let expired: Vec<u64> =
                pending.iter().filter(|(_, p)| p.started.elapsed() > self.config.timeout).map(|(k, _)| *k).collect();
            for id in expired {
                pending.remove(&id);
                let reason = format!("expired after {:?}", self.config.timeout);
                if self.failed(&mut consecutive_failures, id, &reason) {
                    return;
                }
            }
            if self.finished_tasks.load(Ordering::SeqCst) > 0 {
                // Some task finished: it cannot acknowledge, so no checkpoint can complete now.
                for id in std::mem::take(&mut pending).into_keys() {
                    self.abort(id);
                }
                for req in self.savepoints.try_iter() {
                    let _ = req.reply.send(Err("the job is finishing: some of its tasks already ended".into()));
                }
                continue;
            }
            let now = Instant::now();
            if self.input_ended.load(Ordering::SeqCst) {
                // The sources are ending their streams: no checkpoint can complete now.
                for req in self.savepoints.try_iter() {
                    let _ = req.reply.send(Err("the job is finishing: its input has ended".into()));
                }
                continue;
            }
            if let Some(f) = final_id.filter(|f| !pending.contains_key(f)) {
                // The final checkpoint failed (its reason is among the failures): the job ends
                // without it rather than wait for one that may never fit, and its last output
                // is committed once the whole job has succeeded, as without checkpoints.
                self.failures
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(format!("the final checkpoint {f} failed: the job ends without it"));
                self.end_input();
                continue;
            }
            // Once every source is at the end of its input, the final checkpoint is taken at
            // once (not after the interval).
            let final_due = sources > 0
                && self.sources_at_end.load(Ordering::SeqCst) >= sources
                && final_id.is_none()
                && pending.len() < self.config.max_concurrent;
            // A savepoint is triggered at once (aligned, whatever the mode), beside any
            // checkpoint in flight.
            let savepoint = self.savepoints.try_recv().ok();
            let paused = last_completion.is_some_and(|t| now < t + self.config.min_pause);
            let due = now >= next_trigger && pending.len() < self.config.max_concurrent && !paused;
            if savepoint.is_some() || due || final_due {
                if final_due {
                    final_id = Some(next_id);
                }
                let id = next_id;
                next_id += 1;
                self.next_id.store(next_id, Ordering::SeqCst);
                next_trigger = now + self.config.interval;
                if let Err(e) = self.storage.prepare(id) {
                    if self.failed(&mut consecutive_failures, id, &e.to_string()) {
                        return;
                    }
                    continue;
                }
                if self.config.faults.as_ref().is_some_and(|f| f.decline(id)) {
                    if self.failed(&mut consecutive_failures, id, "declined by the coordinator (injected)") {
                        return;
                    }
                    continue;
                }
                let barrier = Barrier {
                    id,
                    trigger_ns: self.clock.now_ns(),
                    // With an alignment timeout, barriers start aligned and turn unaligned
                    // only at a task that waited too long. Savepoints are always aligned.
                    unaligned: savepoint.is_none() && self.config.unaligned && self.config.alignment_timeout.is_none(),
                };
                for t in self.tasks.iter().filter(|t| t.is_source) {
                    let _ = t.control.send(TaskControl::Trigger(barrier));
                }
                pending.insert(id, Pending { barrier, started: now, acks: HashMap::new(), savepoint });
            }
        }
    }

    /// Aborts `id` and counts a failure; returns true when the job was failed.
    fn failed(&mut self, consecutive: &mut u32, id: u64, reason: &str) -> bool {
        self.abort(id);
        self.failures.lock().unwrap_or_else(|e| e.into_inner()).push(format!("checkpoint {id} failed: {reason}"));
        *consecutive += 1;
        if *consecutive > self.config.tolerable_failures {
            (self.fail)(Error::Checkpoint(format!(
                "{consecutive} consecutive checkpoints failed (tolerable: {}); the last, {id}: {reason}",
                self.config.tolerable_failures
            )));
            return true;
        }
        false
    }

    /// Tells the sources to end their streams (the final checkpoint is done, or failed).
    fn end_input(&self) {
        self.input_ended.store(true, Ordering::SeqCst);
        for t in self.tasks.iter().filter(|t| t.is_source) {
            let _ = t.control.send(TaskControl::EndOfInput);
        }
    }

    /// Fails the job if this process no longer owns the checkpoint directory.
    fn still_owner(&mut self) -> Result<(), String> {
        self.lock.check().map_err(|e| {
            let reason = e.to_string();
            (self.fail)(e);
            self.fenced = true;
            reason
        })
    }

    fn notify(&self, notice: CheckpointNotice) {
        for t in &self.tasks {
            // A task that already finished has dropped its inbox; nothing to tell it.
            let _ = t.control.send(TaskControl::Notice(notice));
        }
    }

    fn abort(&mut self, id: u64) {
        self.notify(CheckpointNotice::Aborted(id));
        self.storage.discard(id);
        self.aborted.insert(id, Instant::now());
    }

    /// Completes a checkpoint every task acknowledged; `in_use` are the shared files that
    /// checkpoints still in progress refer to (retention keeps them).
    fn complete(&mut self, mut p: Pending, in_use: &HashSet<String>) -> Result<(), String> {
        let id = p.barrier.id;
        let savepoint = p.savepoint.take();
        let ms = |ns: u64| ns as f64 / 1e6;
        let max = |f: fn(&TaskStats) -> u64| p.acks.values().map(|a| f(&a.stats)).max().unwrap_or(0);
        let sum = |f: fn(&TaskStats) -> u64| p.acks.values().map(|a| f(&a.stats)).sum();
        let stats = CheckpointStats {
            id,
            trigger_ms: ms(p.barrier.trigger_ns),
            duration_ms: ms(self.clock.now_ns().saturating_sub(p.barrier.trigger_ns)),
            start_delay_ms: ms(max(|s| s.start_delay_ns)),
            alignment_ms: ms(max(|s| s.alignment_ns)),
            sync_ms: ms(max(|s| s.sync_ns)),
            async_ms: ms(max(|s| s.async_ns)),
            state_bytes: sum(|s| s.state_bytes),
            written_bytes: sum(|s| s.written_bytes),
            inflight_bytes: sum(|s| s.inflight_bytes),
        };
        let mut tasks: Vec<TaskFile> = self
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
                }
            })
            .collect();
        tasks.sort_by_key(|t| t.task);
        let mut shared: Vec<SharedFile> = p.acks.values().flat_map(|a| a.shared.iter().cloned()).collect();
        shared.sort();
        shared.dedup();
        let metadata = CheckpointMetadata {
            format: FORMAT_VERSION,
            job: self.job.clone(),
            fingerprint: self.fingerprint.clone(),
            checkpoint: id,
            kind: "checkpoint".into(),
            mode: self.config.mode.to_string(),
            generation: self.lock.generation(),
            completed_unix_ms: SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0),
            stats: stats.clone(),
            tasks,
            shared,
        };
        if let Some(e) = self.config.faults.as_ref().and_then(|f| f.metadata_write(id)) {
            let path = self.storage.checkpoint_dir(id).join(super::storage::METADATA_FILE);
            return Err(Error::io("cannot write checkpoint metadata", path, e).to_string());
        }
        self.still_owner()?;
        self.storage.commit(&metadata).map_err(|e| e.to_string())?;
        // Read back and verified before anything is committed under it: a checkpoint that
        // would not restore must never be the one sink transactions are committed under (its
        // folder goes with the abort that follows).
        self.storage.verify(id).map_err(|e| format!("its files did not verify when read back: {e}"))?;
        if let Some(req) = savepoint {
            let _ = req
                .reply
                .send(self.storage.copy_to_savepoint(id, &req.dir).map(|p| (id, p)).map_err(|e| e.to_string()));
        }
        // Older checkpoints go before any sink commits: this one lists every transaction not
        // yet committed (a sink's snapshot carries all its pending ones, aborted checkpoints'
        // included), so after a crash from here on, recovery commits them from it alone. Only
        // an owner deletes anything or lets the sinks commit.
        self.still_owner()?;
        self.completed.push(id);
        let deleted = self.storage.retain(&mut self.completed, self.config.retained, in_use);
        self.deleted_shared.extend(deleted);
        if self.config.faults.as_ref().is_some_and(|f| f.exit_before_commit(id)) {
            eprintln!("injected crash: checkpoint {id} is complete, and no sink has committed it");
            std::process::exit(70);
        }
        self.notify(CheckpointNotice::Complete(id));
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).push(stats);
        Ok(())
    }
}
