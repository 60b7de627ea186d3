//! What the supervisor thread does when an attempt ends: settles it, restarts the job as
//! its restart strategy allows, and marks a finished job done ([`FinishedMarker`]).

use super::*;

impl Supervised {
    pub(super) fn progress(&self) -> std::sync::MutexGuard<'_, RunProgress> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn checkpoint_stats(&self) -> Vec<CheckpointStats> {
        self.shared.stats.lock().unwrap_or_else(|e| e.into_inner()).stats()
    }

    pub(super) fn checkpoints_completed(&self) -> u64 {
        self.shared.stats.lock().unwrap_or_else(|e| e.into_inner()).completed()
    }

    pub(super) fn last_checkpoint(&self) -> Option<CheckpointStats> {
        self.shared.stats.lock().unwrap_or_else(|e| e.into_inner()).last()
    }

    /// The supervisor thread: waits for each attempt's workers to exit, then restarts the job
    /// or records its result, until it has ended for good.
    pub(super) fn supervise(&self) {
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
                        progress.ended_as = Some(match &result {
                            Ok(_) => JobState::Finished,
                            Err(Error::Cancelled) => JobState::Cancelled,
                            Err(_) => JobState::Failed,
                        });
                        if let Some(cause) = &error {
                            progress.last_failure = Some(failure(cause.clone(), false));
                        }
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
    pub(super) fn settle(&self, a: Attempt) -> Option<Result<JobReport>> {
        if let Some(e) = a.state.take_error() {
            let restarts = self.progress().restarts;
            let strategy = self.job.graph.borrow().checkpointing.as_ref().map(|c| c.restart);
            let (mut e, mut restarts) = (e, restarts);
            // A restart whose start fails retryably (a sink's restore that met a lost
            // request) is a failure like any other: the strategy decides whether to go on.
            loop {
                let cancelled = self.shared.control.cancel.load(Ordering::SeqCst);
                let failures_ago = RestartStrategy::remember_failure(
                    strategy.as_ref(),
                    &mut self.progress().failures,
                    crate::context::wall::now(),
                );
                let delay = strategy.and_then(|s| s.delay(restarts, &failures_ago));
                let Some(delay) = delay.filter(|_| e.is_retryable() && !cancelled) else { return Some(Err(e)) };
                tracing::warn!(job = %self.job.graph.borrow().name, restart = restarts + 1, cause = %e, "job restarts");
                {
                    let mut progress = self.progress();
                    progress.notes.push(format!("restart {} after: {e}", restarts + 1));
                    progress.last_failure = Some(failure(e.to_string(), true));
                }
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
        Some(Ok(self.report(&a)))
    }

    /// The report of the job that finished with attempt `a`.
    fn report(&self, a: &Attempt) -> JobReport {
        JobReport {
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
            state_memory: self.shared.state_budget.as_ref().map(|b| b.stats()),
        }
    }
}

/// A failure seen now.
fn failure(cause: String, restarted: bool) -> JobFailure {
    let unix_ms = crate::context::wall::unix_ms();
    JobFailure { cause, unix_ms, restarted }
}

/// The completion marker of a finished checkpointed job, and where it goes.
pub(crate) struct FinishedMarker {
    pub(super) dir: std::path::PathBuf,
    pub(super) finished: FinishedJob,
    pub(super) stored: Option<crate::checkpoint::CheckpointMirror>,
    /// Held until the marker is written: the directory is this process's until then.
    pub(super) lock: Option<Arc<DirectoryLock>>,
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

    pub(super) fn write(&self) -> Result<()> {
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
    pub(super) fn when_delivered(self, deliveries: &[Arc<dyn crate::sink::HostDelivery>]) {
        let left = Arc::new(std::sync::atomic::AtomicUsize::new(deliveries.len()));
        let marker = Arc::new(Mutex::new(Some(self)));
        for d in deliveries {
            let (left, marker) = (std::sync::Arc::clone(&left), std::sync::Arc::clone(&marker));
            d.when_delivered(Box::new(move || {
                if left.fetch_sub(1, Ordering::AcqRel) != 1 {
                    return;
                }
                let Some(marker) = marker.lock().unwrap_or_else(|e| e.into_inner()).take() else { return };
                let written = spawn_named("weir-finished".into(), move || marker.write().map_err(|e| e.to_string()))
                    .map_err(|e| e.to_string())
                    .and_then(|t| t.join().unwrap_or_else(|_| Err("its writer panicked".into())));
                if let Err(e) = written {
                    tracing::warn!(error = %e, "the finished job's completion marker was not written: a rerun runs it again from its latest checkpoint");
                }
            }));
        }
    }
}
