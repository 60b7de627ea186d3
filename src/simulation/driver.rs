//! The driver: one process after another (a crash ends one, a new one recovers from the
//! checkpoint directory), each running attempts of the job (a task failure ends one, failover
//! starts the next) with every task, the coordinator and the snapshot writes on this thread,
//! in an order drawn from the seed, against a clock it moves.
//!
//! May touch: `checkpoint`, `context`, `error`, `pipeline`, `prng`, `runtime`, `sink`,
//! `record`, `snapshot`, `wake`, `state`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::checkpoint::coordinator::{Command, CrashPoint, CrashSchedule, RequestRefused};
use crate::checkpoint::task::{SnapshotWriter, TaskControl};
use crate::checkpoint::{CheckpointStorage, DirectoryLock};
use crate::context::Clock;
use crate::error::{Error, Result};
use crate::pipeline::{poll_catching_panics, Job, Task, TaskPoll};
use crate::prng::Prng;
use crate::runtime::{prepare_attempt, AttemptEnv, AttemptShared, RunConfig};
use crate::snapshot::CheckpointNotice;
use crate::wake::Parker;

use super::*;

/// A folder for the runs' checkpoints, removed afterwards; in memory where the system has a
/// memory-backed `/dev/shm` (the runs fsync every checkpoint).
pub(super) struct Scratch {
    pub(super) path: PathBuf,
}

impl Scratch {
    pub(super) fn new() -> Result<Scratch> {
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
pub(super) struct Run<T> {
    pub(super) output: std::result::Result<Vec<T>, String>,
    pub(super) stats: RunStats,
}

/// How an attempt ended.
pub(super) enum AttemptEnd {
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
pub(super) const INJECTED: &str = "injected failure (simulation)";

pub(super) fn is_injected(e: &Error) -> bool {
    matches!(e, Error::OperatorPanicked { message, .. } if message == INJECTED)
}

/// The most restarts of one run before it counts as failed (a fault schedule has few faults;
/// more restarts mean recovery itself keeps failing).
pub(super) const MAX_RESTARTS: u32 = 40;

/// Runs the job once: failure-free (`seed` None) or under seed `seed`'s schedule, whose
/// faults are placed within the golden run's steps and checkpoints.
/// Calls the job closure, a panic in it an error naming the run.
pub(super) fn build_job<T, B, O>(build: &B, name: &str) -> Result<(Job, SimOutput<T>)>
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
pub(super) fn new_process<T, B, O>(
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

/// A run's output as its job gave it: committed output, a host, or a reader.
type SimOutputs<'a, T> =
    (&'a Option<CommittedOutput<T>>, &'a Option<Box<dyn SimHost<T>>>, &'a Option<Box<dyn Fn() -> Vec<T>>>);

/// The parallelism every operator of `job` shares, if they share one: rescales are drawn for
/// such a job (the rescale gives them all another).
fn uniform_parallelism(job: &Job) -> Option<usize> {
    let graph = job.graph.borrow();
    let first = graph.nodes.first().map(|n| n.parallelism);
    first.filter(|&p| graph.nodes.iter().all(|n| n.parallelism == p))
}

/// A run's output, sorted, from its committed output, its host's log or its reader; or why
/// it failed (`result`, or committed transactions withdrawn in a run without damage, which
/// `stats` counts otherwise).
fn outcome<T: crate::Record + Ord>(
    result: std::result::Result<(), String>,
    (out, host, read): SimOutputs<'_, T>,
    damages: bool,
    stats: &mut RunStats,
) -> std::result::Result<Vec<T>, String> {
    let retracted = out.as_ref().map_or(0, |o| o.retracted());
    let result = result.and_then(|()| match retracted {
        0 => Ok(()),
        n if damages => {
            stats.retractions += n;
            Ok(())
        }
        n => Err(format!("{n} committed transactions were withdrawn, and no checkpoint was damaged")),
    });
    result.map(|()| {
        let mut records = match (out, host, read) {
            (Some(out), _, _) => out.records(),
            (None, Some(host), _) => host.log().handled.clone(),
            (None, None, Some(read)) => read(),
            (None, None, None) => unreachable!("a job has its output, its host or its reader"),
        };
        records.sort();
        records
    })
}

pub(super) fn simulate<T, B, O>(
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
    // Failure-free runs (the golden one and the reordered one) have no golden figures.
    let faults_from = seed.filter(|_| golden.is_some());
    let (job, out) = super::with_fault_seed(faults_from, || build_job(build, &name))?;
    let (out, host, read) = match out {
        SimOutput::Committed(out) => (Some(out), None, None),
        SimOutput::Host(host) => (None, Some(host), None),
        SimOutput::Read(read) => (None, None, Some(read)),
    };
    let uniform = uniform_parallelism(&job);
    let mut schedule = Schedule::new(seed, golden, uniform.filter(|_| options.rescale));
    let subtasks = job.graph.borrow().nodes.iter().map(|n| n.parallelism).sum();
    // Output that cannot be withdrawn must not be written twice: recovery past damage refuses.
    let mut config = schedule.config(dir, options, subtasks).allow_retracting_output(read.is_none());
    let store = store_for(seed, golden, &mut schedule);
    config.store.clone_from(&store);
    let job = job.with_checkpointing(config);
    // A start from a savepoint continues in a directory of its own.
    let dir = dir.to_path_buf();
    let directories = vec![dir.clone()];
    if let Some(cfg) = &job.graph.borrow().checkpointing {
        cfg.validate()?;
    }
    // Drawn apart, so a seed's other faults are the same with or without: a host's process
    // dies while it drains the finished job's results.
    if let (Some(seed), Some(_)) = (seed, &host) {
        let mut r = crate::prng::Prng::new(seed ^ 0x0D8A_14ED);
        if r.chance(1, 3) {
            schedule.faults.push(Fault::CrashWhileDraining(r.below(8)));
        }
    }
    let damages = schedule.faults.iter().any(|f| matches!(f, Fault::DamageAt { .. }));
    let mut stats = RunStats { faults: schedule.faults.iter().map(|f| f.to_string()).collect(), ..RunStats::default() };
    stats.in_store = store.is_some();
    let crashes = armed_crashes(&schedule, store.clone());
    let mut processes = Processes {
        build,
        name,
        job,
        host,
        readable: read.is_some(),
        schedule,
        stats,
        crashes: Arc::clone(&crashes),
        store,
        damages,
        dir,
        directories,
        time: Arc::new(AtomicU64::new(0)),
        options,
        restarts: 0,
    };
    let result = processes.run()?;
    let Processes { mut stats, host, directories, .. } = processes;
    stats.late_publishes = crashes.late.lock().unwrap_or_else(|e| e.into_inner()).len() as u64;
    let output = outcome(result, (&out, &host, &read), damages, &mut stats);
    for d in directories {
        let _ = std::fs::remove_dir_all(&d);
        let _ = std::fs::remove_dir_all(d.with_extension("savepoints"));
    }
    Ok(Run { output, stats })
}

/// Apart from the schedule's draws, so a seed's other faults are the same with or without:
/// in a quarter of the seeds whose faults neither damage a checkpoint's files nor move the
/// job to another directory, the directory is kept in an object store (in memory), each
/// new process's working copy filled from it alone; in half of those an owner pauses
/// between its check and its publish while a successor takes the store over. Chosen by the
/// seed's residue, not drawn: every run of 8 consecutive seeds holds one of each (60 drawn
/// seeds of the suite once held no paused owner, 1 run in 40, and its check failed).
fn store_for(
    seed: Option<u64>,
    golden: Option<&RunStats>,
    schedule: &mut Schedule,
) -> Option<Arc<dyn crate::checkpoint::ObjectStore>> {
    match (seed, golden) {
        (Some(seed), Some(g)) => {
            let mut r = Prng::new(seed ^ 0x5709_E0B1);
            let moves = schedule
                .faults
                .iter()
                .any(|f| matches!(f, Fault::DamageAt { .. } | Fault::Rescale { .. } | Fault::StopWithSavepoint(_)));
            (seed % 4 == 1 && !moves).then(|| {
                if (seed / 4) % 2 == 1 {
                    let id = r.between(1, g.checkpoints.max(1));
                    schedule.faults.push(Fault::CrashAt(CrashPoint::BeforePublish, id));
                }
                Arc::new(crate::checkpoint::InMemoryObjectStore::default()) as Arc<dyn crate::checkpoint::ObjectStore>
            })
        }
        _ => None,
    }
}

/// The crash points `schedule` arms for the coordinator to ask (a damage fault's crash
/// before the completion notice among them), with the store a successor takes over.
fn armed_crashes(schedule: &Schedule, store: Option<Arc<dyn crate::checkpoint::ObjectStore>>) -> Arc<ArmedCrashes> {
    let crashes = Arc::new(ArmedCrashes { store, ..ArmedCrashes::default() });
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
    crashes
}

/// A simulated run's processes, one after another, and what outlives each of them.
struct Processes<'a, T, B> {
    build: &'a B,
    name: String,
    job: Job,
    host: Option<Box<dyn SimHost<T>>>,
    /// The output is read from outside the job (it cannot be withdrawn).
    readable: bool,
    schedule: Schedule,
    stats: RunStats,
    crashes: Arc<ArmedCrashes>,
    store: Option<Arc<dyn crate::checkpoint::ObjectStore>>,
    /// The schedule damages a checkpoint's files.
    damages: bool,
    /// The checkpoint directory now (a start from a savepoint or a rescale moves it).
    dir: PathBuf,
    directories: Vec<PathBuf>,
    time: Arc<AtomicU64>,
    options: &'a SimOptions,
    restarts: u32,
}

/// What comes after an attempt.
enum Next {
    /// Another attempt in the same process.
    Attempt,
    /// A new process.
    Process,
    /// The run ended: well, or why the seed fails.
    End(std::result::Result<(), String>),
}

impl<T, B, O> Processes<'_, T, B>
where
    T: crate::Record + Ord,
    B: Fn() -> (Job, O),
    O: Into<SimOutput<T>>,
{
    /// Runs processes until one ends the run.
    fn run(&mut self) -> Result<std::result::Result<(), String>> {
        let mut first_process = true;
        loop {
            if !std::mem::take(&mut first_process) {
                if let Some(h) = self.host.take() {
                    let (j, h) = new_process(self.build, &self.name, &self.job, h)?;
                    self.job = j;
                    self.host = Some(h);
                }
            }
            if let Next::End(result) = self.process()? {
                return Ok(result);
            }
        }
    }

    /// A process: it takes the directory's lock, then runs attempts until one ends the
    /// process or the run.
    fn process(&mut self) -> Result<Next> {
        let cfg = self.job.graph.borrow().checkpointing.clone().expect("a simulated job takes checkpoints");
        let storage = CheckpointStorage::of_config(&cfg, &self.job.fingerprint());
        let lock = match DirectoryLock::acquire(&storage, &self.job.name()) {
            Ok((lock, _)) => Arc::new(lock),
            Err(e) => return Ok(Next::End(Err(e.to_string()))),
        };
        // A checkpoint put into the store after a successor took over must never come down.
        let late = self.crashes.late.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some((g, id)) = late.into_iter().find(|&(g, id)| storage.metadata(id).is_ok_and(|m| m.generation == g)) {
            return Ok(Next::End(Err(format!(
                "checkpoint {id}, put into the store by generation {g} after a successor took over, was brought down"
            ))));
        }
        let state_budget = match self.options.state_memory {
            Some(bytes) => Some(crate::state::StateBudget::new(bytes, std::env::temp_dir())?),
            None => None,
        };
        if let (Some(b), Some(Fault::SpillFails(n))) =
            (&state_budget, self.schedule.take(|f| matches!(f, Fault::SpillFails(_))))
        {
            b.fail_spill_write(n);
        }
        let shared =
            Arc::new(AttemptShared { lock: Some(Arc::clone(&lock)), state_budget, ..AttemptShared::default() });
        let next = loop {
            match self.attempt(&storage, &lock, &shared)? {
                Next::Attempt => {}
                next => break next,
            }
        };
        if let Some(b) = &shared.state_budget {
            let s = b.stats();
            (self.stats.evictions, self.stats.faults_in) =
                (self.stats.evictions + s.evictions, self.stats.faults_in + s.faults);
        }
        Ok(next)
    }

    /// One attempt in the process holding `lock`.
    fn attempt(
        &mut self,
        storage: &CheckpointStorage,
        lock: &Arc<DirectoryLock>,
        shared: &Arc<AttemptShared>,
    ) -> Result<Next> {
        let writes = Arc::new(QueuedWrites {
            queue: Mutex::new(Vec::new()),
            limit_writes: 64,
            storage: CheckpointStorage::new(&self.dir),
        });
        let writer = Arc::clone(&writes);
        let env = AttemptEnv {
            clock: Clock::manual(Arc::clone(&self.time)),
            parkers: vec![Arc::new(Parker::default())],
            writer: Box::new(move |_acks| Arc::clone(&writer) as Arc<dyn SnapshotWriter>),
            crash: Some(Arc::clone(&self.crashes) as Arc<dyn CrashSchedule>),
        };
        let run_config = RunConfig::default()
            .workers(1)
            .ring_capacity(self.schedule.ring_capacity)
            .batch_size(self.schedule.batch_size);
        let mut notes = Vec::new();
        // The attempt's state, made and used on this thread, keeps within the budget.
        let _budget = crate::state::StateBudget::enter(shared.state_budget.clone());
        let prepared = match prepare_attempt(&self.job, &run_config, &env, shared, &mut notes) {
            Ok(p) => p,
            // A start that failed retryably (a sink's restore met a lost request) is a
            // failover like any other.
            Err(e) if e.is_retryable() && self.restarts < MAX_RESTARTS => {
                self.stats.failovers += 1;
                self.restarts += 1;
                return Ok(Next::Attempt);
            }
            Err(Error::OutputCannotBeWithdrawn(_)) if self.damages && self.readable => {
                self.stats.refusals += 1;
                return Ok(Next::End(Ok(())));
            }
            Err(e) => return Ok(Next::End(Err(format!("the job could not start: {e}")))),
        };
        match shared.last_restore.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|r| r.from) {
            Some("memory") => self.stats.restores_from_memory += 1,
            Some("files") => self.stats.restores_from_files += 1,
            _ => {}
        }
        let restarts = self.restarts;
        let fail_soon = self.schedule.take(|f| *f == Fault::FailsAfterRestore(restarts)).is_some();
        let mut host_step = self.host.as_mut().map(|h| move |budget: usize| h.step(budget));
        let mut world = World {
            host: host_step.as_mut().map(|f| f as &mut dyn FnMut(usize)),
            schedule: &mut self.schedule,
            time: &self.time,
            writes: &writes,
            stats: &mut self.stats,
            max_steps: self.options.max_steps,
            dir: &self.dir,
            lock,
        };
        let end = run_attempt(prepared, &mut world, fail_soon);
        for c in shared.stats.lock().unwrap_or_else(|e| e.into_inner()).take() {
            self.stats.checkpoints += 1;
            self.stats.resumed += c.resumed_from.is_some() as u64;
            self.stats.parts_reused += c.parts.iter().filter(|p| p.reused).count() as u64;
        }
        if matches!(end, AttemptEnd::Finished) {
            if let Some(next) = self.finished(lock)? {
                return Ok(next);
            }
        }
        if matches!(end, AttemptEnd::Finished | AttemptEnd::Stopped(_)) {
            if let Some(h) = self.host.as_mut() {
                h.drain();
            }
        }
        Ok(self.after(end, storage))
    }

    /// The job finished: `run_attempt` checked the lock and ran the success work; the
    /// directory is marked finished once the host has every result, as the runtime does. A
    /// host's process may die while it drains the last results (`Some`: what comes next).
    fn finished(&mut self, lock: &Arc<DirectoryLock>) -> Result<Option<Next>> {
        let graph = self.job.graph.borrow();
        let stored = self.store.clone().map(crate::checkpoint::CheckpointMirror::new);
        let marker = crate::runtime::FinishedMarker::of(&graph, self.dir.clone(), stored, Some(Arc::clone(lock)));
        if let Err(e) = marker.write_when_delivered(&graph.host_deliveries) {
            return Ok(Some(Next::End(Err(e.to_string()))));
        }
        drop(graph);
        if let (Some(h), Some(Fault::CrashWhileDraining(n))) =
            (self.host.as_mut(), self.schedule.take(|f| matches!(f, Fault::CrashWhileDraining(_))))
        {
            h.step(n as usize);
            // The host may have had every result by then: the job is marked finished, and the
            // process dying now ends nothing.
            if matches!(crate::checkpoint::read_finished(&self.dir), Ok(Some(_))) {
                return Ok(Some(Next::End(Ok(()))));
            }
            self.stats.crashes += 1;
            self.restarts += 1;
            return Ok(Some(Next::Process));
        }
        Ok(None)
    }

    /// The user starts the job again in a new directory (named after `why`): from `restore`
    /// if given, at `parallelism` if given.
    fn start_again(&mut self, why: &str, restore: Option<PathBuf>, parallelism: Option<usize>) {
        self.dir = self.dir.with_extension(format!("{why}-{}", self.restarts));
        self.directories.push(self.dir.clone());
        let mut graph = self.job.graph.borrow_mut();
        if let Some(path) = restore {
            graph.restore = Some((path, false));
        }
        if let Some(p) = parallelism {
            graph.nodes.iter_mut().for_each(|n| n.parallelism = p);
        }
        if let Some(c) = graph.checkpointing.as_mut() {
            c.dir = self.dir.clone();
        }
    }

    /// What follows an attempt that ended as `end`.
    fn after(&mut self, end: AttemptEnd, storage: &CheckpointStorage) -> Next {
        match end {
            AttemptEnd::Finished => match crate::checkpoint::read_finished(&self.dir) {
                Ok(Some(_)) => Next::End(Ok(())),
                Ok(None) => Next::End(Err("the host has every result and the job is not marked finished".into())),
                Err(e) => Next::End(Err(e.to_string())),
            },
            AttemptEnd::Crashed => {
                self.stats.crashes += 1;
                self.restarts += 1;
                let fired = self.crashes.fired.lock().unwrap_or_else(|e| e.into_inner()).take();
                if let Some((CrashPoint::BeforeCompletionNotice, id)) = fired {
                    if let Some(Fault::DamageAt { misplace, .. }) =
                        self.schedule.take(|f| matches!(f, Fault::DamageAt { checkpoint, .. } if *checkpoint == id))
                    {
                        damage(storage, id, misplace, &mut self.schedule.rng);
                    }
                }
                if self.restarts > MAX_RESTARTS {
                    return Next::End(Err(format!("more than {MAX_RESTARTS} restarts")));
                }
                Next::Process
            }
            AttemptEnd::Stuck(steps) => Next::End(Err(format!(
                "the run did not finish in {steps} steps (a livelock, or a checkpoint that can never complete)"
            ))),
            AttemptEnd::Stopped(savepoint) => {
                // The user starts the job again from the savepoint, in a new directory.
                self.restarts += 1;
                self.start_again("from-savepoint", Some(savepoint), None);
                Next::Process
            }
            AttemptEnd::Rescaled(parallelism) => {
                // The user starts the job at another parallelism from its latest checkpoint
                // (the one before, or the start, if there is none), in a new directory.
                self.stats.crashes += 1;
                self.restarts += 1;
                let latest = storage.list().into_iter().rev().find(|&id| storage.is_complete(id));
                self.start_again("rescaled", latest.map(|id| storage.checkpoint_dir(id)), Some(parallelism));
                Next::Process
            }
            AttemptEnd::Failed(Error::Fenced(_)) => {
                // Fenced: this process stops; the owner that took over goes on (a fresh
                // process in the simulation).
                self.stats.crashes += 1;
                self.restarts += 1;
                Next::Process
            }
            // A panic the schedule did not inject is a bug (or a broken invariant) that a
            // failover would hide: the seed fails.
            AttemptEnd::Failed(e @ Error::OperatorPanicked { .. }) if !is_injected(&e) => {
                Next::End(Err(format!("a task panicked: {e}")))
            }
            AttemptEnd::Failed(Error::OutputCannotBeWithdrawn(_)) if self.damages && self.readable => {
                self.stats.refusals += 1;
                Next::End(Ok(()))
            }
            AttemptEnd::Failed(e) if e.is_retryable() && self.restarts < MAX_RESTARTS => {
                self.stats.failovers += 1;
                self.restarts += 1;
                Next::Attempt
            }
            AttemptEnd::Failed(e) => Next::End(Err(e.to_string())),
        }
    }
}

/// What an attempt runs in: the schedule, the clock, the writes, the figures.
pub(super) struct World<'a> {
    /// An embedded job's host: takes a step (sends and receives up to so many times).
    pub(super) host: Option<&'a mut dyn FnMut(usize)>,
    pub(super) schedule: &'a mut Schedule,
    pub(super) time: &'a Arc<AtomicU64>,
    pub(super) writes: &'a QueuedWrites,
    pub(super) stats: &'a mut RunStats,
    pub(super) max_steps: u64,
    /// The checkpoint directory (its lock file; stop-with-savepoint writes beside it).
    pub(super) dir: &'a Path,
    pub(super) lock: &'a DirectoryLock,
}

/// Carries out the coordinator's commands; a completion notice armed for a crash schedules
/// the crash a few steps on, when some tasks have applied it (their sinks committed) and
/// others not yet.
fn deliver(
    commands: Vec<Command>,
    endpoints: &[crate::checkpoint::coordinator::TaskEndpoint],
    schedule: &mut Schedule,
    step: u64,
) -> Option<AttemptEnd> {
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
}

/// The faults the schedule has due at `step` before anything runs: a crash or a rescale
/// (what ends the attempt), the directory's lock taken away (with checkpointing), a snapshot
/// write that will fail.
fn faults_due(
    schedule: &mut Schedule,
    step: u64,
    writes: &QueuedWrites,
    checkpointing: bool,
    dir: &Path,
    failed_write_due: &mut bool,
) -> Option<AttemptEnd> {
    if schedule.take(|f| matches!(f, Fault::Crash(n) if *n <= step)).is_some() {
        crash_writes(writes, &mut schedule.rng);
        return Some(AttemptEnd::Crashed);
    }
    if let Some(Fault::Rescale { parallelism, .. }) =
        schedule.take(|f| matches!(f, Fault::Rescale { at, .. } if *at <= step))
    {
        crash_writes(writes, &mut schedule.rng);
        return Some(AttemptEnd::Rescaled(parallelism));
    }
    if checkpointing && schedule.take(|f| matches!(f, Fault::Fence(n) if *n <= step)).is_some() {
        let _ = std::fs::remove_file(dir.join(crate::checkpoint::LOCK_FILE));
    }
    if schedule.take(|f| matches!(f, Fault::WriteFails(n) if *n <= step)).is_some() {
        *failed_write_due = true;
    }
    None
}

/// One snapshot write the schedule picks, if any is queued: it hangs where the schedule says
/// (in half those seeds the process then dies as a later checkpoint completes), fails where
/// a failed write is due, and otherwise acknowledges to the coordinator at `now`.
fn run_a_write(
    writes: &QueuedWrites,
    schedule: &mut Schedule,
    failed_write_due: &mut bool,
    coordinator: Option<&mut crate::runtime::PreparedCoordinator>,
    now: u64,
    step: u64,
) -> Option<AttemptEnd> {
    let write = writes.take(&mut schedule.rng)?;
    let mut ack = write()?;
    if schedule.take(|f| *f == Fault::HangsWrite(ack.checkpoint)).is_some() {
        // In half the seeds the process then dies as a checkpoint that may have resumed this
        // one completes, so a restore reads the parts it reused.
        if schedule.rng.chance(1, 2) {
            let id = ack.checkpoint;
            schedule.faults.extend([Fault::CrashMidCompletion(id + 1), Fault::CrashMidCompletion(id + 2)]);
        }
        return None;
    }
    if std::mem::take(failed_write_due) {
        ack.result = Err(Error::io(
            "cannot write task state",
            PathBuf::from(format!("task-{}.state", ack.task)),
            std::io::Error::other("injected by the simulation"),
        ));
    }
    let c = coordinator?;
    let commands = c.core.on_ack(ack, now);
    deliver(commands, &c.endpoints, schedule, step)
}

/// A stop with a savepoint, as the schedule asks for it at `step`: asked of the coordinator,
/// its answer awaited in `stopping`, the savepoint `taken`; its folder once every sink
/// committed the savepoint's transactions (the attempt then stops without draining).
fn stop_with_savepoint(
    c: &mut crate::runtime::PreparedCoordinator,
    schedule: &mut Schedule,
    step: u64,
    dir: &Path,
    stopping: &mut Option<SavepointAnswer>,
    taken: &mut Option<(u64, PathBuf)>,
) -> Option<PathBuf> {
    if stopping.is_none() && schedule.take(|f| matches!(f, Fault::StopWithSavepoint(n) if *n <= step)).is_some() {
        let (reply, answer) = std::sync::mpsc::channel();
        c.core.on_savepoint(crate::checkpoint::coordinator::SavepointRequest {
            dir: dir.with_extension("savepoints"),
            reply,
            stop: true,
        });
        *stopping = Some(answer);
    }
    match stopping.as_ref().map(|a| a.try_recv()) {
        Some(Ok(Ok(t))) => {
            *taken = Some(t);
            *stopping = None;
        }
        // The job is finishing (its input ended): it finishes instead, as
        // `JobHandle::stop_with_savepoint` does.
        Some(Ok(Err(_))) => *stopping = None,
        _ => {}
    }
    let (id, path) = taken.as_ref()?;
    c.commits.all_applied(*id, c.endpoints.len()).then(|| path.clone())
}

/// The clock moves; the coordinator sees the time.
fn tick(
    time: &AtomicU64,
    schedule: &mut Schedule,
    coordinator: Option<&mut crate::runtime::PreparedCoordinator>,
    step: u64,
) -> Option<AttemptEnd> {
    time.fetch_add(schedule.rng.between(1, 40) * 1_000, Ordering::Relaxed);
    let c = coordinator?;
    let commands = c.core.on_tick(time.load(Ordering::Relaxed));
    deliver(commands, &c.endpoints, schedule, step)
}

/// The tasks' acknowledgements reach the coordinator (declines a task sent itself in the
/// order sent).
fn take_acks(
    time: &AtomicU64,
    schedule: &mut Schedule,
    coordinator: Option<&mut crate::runtime::PreparedCoordinator>,
    step: u64,
) -> Option<AttemptEnd> {
    let c = coordinator?;
    while let Ok(ack) = c.acks.try_recv() {
        let commands = c.core.on_ack(ack, time.load(Ordering::Relaxed));
        if let Some(end) = deliver(commands, &c.endpoints, schedule, step) {
            return Some(end);
        }
    }
    None
}

/// The answer to a stop with a savepoint: its checkpoint and folder, or why not.
type SavepointAnswer = std::sync::mpsc::Receiver<std::result::Result<(u64, PathBuf), RequestRefused>>;

/// The failure the schedule injects into `task`, as a panic in it.
fn injected_panic(task: &dyn Task) -> Error {
    Error::OperatorPanicked { operator: task.name().to_string(), subtask: 0, message: INJECTED.into() }
}

/// Runs one attempt on this thread until it ends.
pub(super) fn run_attempt(
    prepared: crate::runtime::PreparedAttempt,
    world: &mut World<'_>,
    fail_soon: bool,
) -> AttemptEnd {
    let World { host, schedule, time, writes, stats, max_steps, dir, lock } = world;
    // A stop with a savepoint in progress: its reply, then (id, folder) once it is taken.
    let mut stopping: Option<SavepointAnswer> = None;
    let mut taken: Option<(u64, PathBuf)> = None;
    let (time, writes, max_steps) = (*time, *writes, *max_steps);
    let mut tasks: Vec<Box<dyn Task>> = prepared.tasks.into_iter().map(|(_, t)| t).collect();
    let scope = prepared.scope;
    let mut coordinator = prepared.coordinator;
    // A failure right after the restore: within the attempt's first few steps.
    let fail_at_step = fail_soon.then(|| stats.steps + schedule.rng.below(4));
    let mut failed_write_due = false;
    loop {
        stats.steps += 1;
        let step = stats.steps;
        if step > max_steps {
            return AttemptEnd::Stuck(max_steps);
        }
        if let Some(end) = faults_due(schedule, step, writes, coordinator.is_some(), dir, &mut failed_write_due) {
            return end;
        }
        if let Some(c) = coordinator.as_mut() {
            if let Some(path) = stop_with_savepoint(c, schedule, step, dir, &mut stopping, &mut taken) {
                return settle(AttemptEnd::Stopped(path), writes, &mut coordinator, &mut schedule.rng);
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
            if let Some(end) = tick(time, schedule, coordinator.as_mut(), step) {
                return settle(end, writes, &mut coordinator, &mut schedule.rng);
            }
            continue;
        }
        if roll < schedule.tick_per_mille + schedule.write_per_mille {
            let now = time.load(Ordering::Relaxed);
            if let Some(end) = run_a_write(writes, schedule, &mut failed_write_due, coordinator.as_mut(), now, step) {
                return settle(end, writes, &mut coordinator, &mut schedule.rng);
            }
            continue;
        }
        if let Some(end) = take_acks(time, schedule, coordinator.as_mut(), step) {
            return settle(end, writes, &mut coordinator, &mut schedule.rng);
        }
        if tasks.is_empty() {
            // Every task finished: the job's success work (the sinks' final commits), only
            // while this process owns the directory, as in the runtime.
            let end = match lock.check().and_then(|()| scope.succeed()) {
                Ok(()) => AttemptEnd::Finished,
                Err(e) => AttemptEnd::Failed(e),
            };
            return settle(end, writes, &mut coordinator, &mut schedule.rng);
        }
        let i = schedule.rng.below(tasks.len() as u64) as usize;
        let task_fails = fail_at_step.is_some_and(|n| n <= step)
            || schedule.take(|f| matches!(f, Fault::TaskFails(n) if *n <= step)).is_some();
        if task_fails {
            return settle(AttemptEnd::Failed(injected_panic(&*tasks[i])), writes, &mut coordinator, &mut schedule.rng);
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

/// Ends an attempt as the runtime does: after a failure or at the end, the writes still
/// queued finish (their acknowledgements go nowhere) and the coordinator cleans up; after a
/// crash, nothing runs.
pub(super) fn settle(
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
