//! The runtime: one pinned worker thread per core, each owning and polling its tasks; the
//! [`JobHandle`] to watch, stop or cancel a running job; and [`RunConfig`].
//!
//! A worker polls its tasks round-robin and never blocks while any made progress. When none
//! did, it backs off: spins briefly, then yields, then parks with a bounded timeout until a
//! ring it reads from (or one it waits to write into) wakes it. So an idle job costs nothing
//! and many jobs can share two cores, while a busy worker never parks.
//!
//! May touch: `pipeline` (the plan and tasks it runs), `context`, `error`, `metrics`, `wake`.

mod worker;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crate::context::Clock;
use crate::error::{Error, Result};
use crate::metrics::{JobMetrics, JobReport};
use crate::pipeline::{build_plan, Job, JobControl, PlanEnv, PlanLimits};
use crate::wake::Parker;
use worker::{RunState, Worker};

/// How to run a job.
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
        RunConfig {
            workers: 0,
            ring_capacity: 4096,
            batch_size: 1024,
            pin_workers: true,
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
            return Err(Error::config(format!(
                "{} workers is more than weir supports (4096)",
                self.workers
            )));
        }
        Ok(())
    }
}

/// The cores this process may run on.
pub fn available_cores() -> usize {
    core_affinity::get_core_ids()
        .map(|c| c.len())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        })
}

/// A running job.
pub struct JobHandle {
    threads: Vec<JoinHandle<()>>,
    control: Arc<JobControl>,
    state: Arc<RunState>,
    metrics: Arc<JobMetrics>,
    parkers: Vec<Arc<Parker>>,
    started: Instant,
    workers: usize,
}

impl JobHandle {
    /// Ends the sources' streams: the job processes what is in flight, fires its windows, and
    /// finishes normally.
    pub fn stop(&self) {
        self.control.stop.store(true, Ordering::SeqCst);
        self.wake_all();
    }

    /// Stops every worker at once; [`JobHandle::join`] then returns [`Error::Cancelled`].
    pub fn cancel(&self) {
        self.control.cancel.store(true, Ordering::SeqCst);
        self.wake_all();
    }

    fn wake_all(&self) {
        for p in &self.parkers {
            p.unpark_now();
        }
    }

    /// Whether every worker has exited.
    pub fn is_finished(&self) -> bool {
        self.threads.iter().all(|t| t.is_finished())
    }

    /// Live metrics.
    pub fn metrics(&self) -> &Arc<JobMetrics> {
        &self.metrics
    }

    /// Time since the job started.
    pub fn elapsed(&self) -> std::time::Duration {
        self.started.elapsed()
    }

    /// Waits for the job to end.
    pub fn join(mut self) -> Result<JobReport> {
        for t in self.threads.drain(..) {
            // Workers catch every panic of the tasks they run; a panic here is a worker bug.
            if t.join().is_err() {
                self.state
                    .fail(Error::config("a worker thread panicked outside any task"));
            }
        }
        if let Some(e) = self.state.take_error() {
            return Err(e);
        }
        if !self.state.completed() {
            return Err(Error::Cancelled);
        }
        Ok(JobReport {
            source_records: self.metrics.source_records(),
            sink_records: self.metrics.sink_records(),
            late_records: self.metrics.late_records(),
            elapsed: self.started.elapsed(),
            workers: self.workers,
            latency_ns: self.metrics.latency(),
        })
    }
}

impl Drop for JobHandle {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.cancel();
            for t in self.threads.drain(..) {
                let _ = t.join();
            }
        }
    }
}

impl Job {
    /// Starts the job on its worker threads.
    pub fn start(self, config: RunConfig) -> Result<JobHandle> {
        config.validate()?;
        let workers = config.effective_workers();
        let parkers: Vec<Arc<Parker>> = (0..workers).map(|_| Arc::new(Parker::default())).collect();
        let control = Arc::new(JobControl::default());
        let metrics = Arc::new(JobMetrics::default());
        let env = PlanEnv {
            clock: Clock::start(),
            metrics: metrics.clone(),
            control: control.clone(),
            parkers: parkers.clone(),
        };
        let limits = PlanLimits {
            workers,
            ring_capacity: config.ring_capacity,
            batch_size: config.batch_size,
        };
        let plan = build_plan(&self.graph.borrow(), limits, &env)?;
        let mut per_worker: Vec<Vec<_>> = (0..workers).map(|_| Vec::new()).collect();
        for (w, t) in plan.tasks {
            per_worker[w].push(t);
        }
        let cores = if config.pin_workers {
            core_affinity::get_core_ids().unwrap_or_default()
        } else {
            Vec::new()
        };
        let state = Arc::new(RunState::new(workers, parkers.clone()));
        let name = self.name();
        let mut threads = Vec::with_capacity(workers);
        for (i, tasks) in per_worker.into_iter().enumerate() {
            let worker = Worker {
                index: i,
                tasks,
                parker: parkers[i].clone(),
                control: control.clone(),
                state: state.clone(),
                core: if cores.is_empty() {
                    None
                } else {
                    Some(cores[i % cores.len()])
                },
            };
            let t = std::thread::Builder::new()
                .name(format!("weir-{name}-{i}"))
                .spawn(move || worker.run())
                .map_err(|e| Error::Io {
                    context: "cannot start a worker thread".into(),
                    path: None,
                    source: e,
                })?;
            threads.push(t);
        }
        Ok(JobHandle {
            threads,
            control,
            state,
            metrics,
            parkers,
            started: Instant::now(),
            workers,
        })
    }

    /// Starts the job and waits for it to end.
    pub fn execute(self, config: RunConfig) -> Result<JobReport> {
        self.start(config)?.join()
    }
}
