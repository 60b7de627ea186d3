//! One attempt of a job: what outlives attempts ([`AttemptShared`]), how an attempt is
//! prepared from the checkpoint directory (shared with the simulator) and started on worker
//! threads.

use super::*;

/// What outlives attempts: checkpoint ids and failure reasons.
#[derive(Default)]
pub(crate) struct AttemptShared {
    pub(crate) next_checkpoint: Arc<std::sync::atomic::AtomicU64>,
    /// Checkpoints triggered and not yet completed, failed or aborted (the coordinator's,
    /// published after each of its steps; 0 between attempts).
    pub(crate) checkpoints_in_progress: Arc<crate::metrics::InProgress>,
    /// Stop and cancel flags.
    pub(crate) control: Arc<JobControl>,
    pub(crate) metrics: Arc<JobMetrics>,
    /// Statistics of the checkpoints completed.
    pub(crate) stats: Arc<Mutex<crate::metrics::CheckpointHistory>>,
    pub(crate) checkpoint_failures: Arc<Mutex<crate::metrics::CheckpointFailures>>,
    /// The checkpoint directory's lock, held for the job's life.
    pub(crate) lock: Option<Arc<DirectoryLock>>,
    /// A checkpoint configuration changed on the running job (or several taking turns), for
    /// the coordinator running now (later attempts read the job's own, changed too).
    pub(crate) checkpoint_update: Arc<Mutex<Option<Vec<CheckpointConfig>>>>,
    /// Local recovery: the state of the newest completed checkpoint, kept across attempts
    /// (never across processes).
    pub(crate) local: Arc<crate::checkpoint::local::LocalCopies>,
    /// Where the newest attempt's state came from.
    pub(crate) last_restore: Mutex<Option<crate::checkpoint::RestoreReport>>,
    /// Attempts that restored a checkpoint or savepoint (Flink's `counts.restored`).
    pub(crate) restores: std::sync::atomic::AtomicU64,
    /// The memory keyed state keeps within ([`RunConfig::state_memory`]), for every attempt.
    pub(crate) state_budget: Option<Arc<crate::state::StateBudget>>,
}

/// One attempt of a job: its workers and, with checkpointing, its coordinator. A failover
/// ends the attempt and starts a new one from the latest checkpoint.
pub(super) struct Attempt {
    pub(super) threads: Vec<JoinHandle<()>>,
    pub(super) state: Arc<RunState>,
    pub(super) parkers: Vec<Arc<Parker>>,
    pub(super) scope: Arc<AttemptScope>,
    pub(super) coordinator: Option<(JoinHandle<()>, Arc<AtomicBool>)>,
    /// Savepoints and checkpoints asked for from outside go to the coordinator here.
    pub(super) requests: Option<std::sync::mpsc::Sender<CoordinatorRequest>>,
    /// Which tasks applied which checkpoint's completion (with checkpointing).
    pub(super) commits: Option<Arc<CommitsApplied>>,
    /// Tasks in the attempt.
    pub(super) task_count: usize,
    /// Worker threads that have exited (however they ended).
    pub(super) exited: Arc<std::sync::atomic::AtomicUsize>,
}

/// What the job looks like to recovery.
pub(super) fn identity<'a>(graph: &'a crate::pipeline::Graph, fingerprint: &'a str) -> JobIdentity<'a> {
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
pub(super) fn sink_outputs(graph: &crate::pipeline::Graph) -> Vec<crate::checkpoint::SinkOutput> {
    graph
        .sink_outputs
        .iter()
        .map(|(node, dir)| crate::checkpoint::SinkOutput {
            operator: graph.nodes[*node].name.to_string(),
            location: dir.display().to_string(),
        })
        .collect()
}

pub(super) fn say_nothing(_: &str) {}

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

/// What a checkpointed attempt recovered from its checkpoint directory, for its tasks and its
/// coordinator.
struct Recovered {
    recovery: Recovery,
    restored: Option<Arc<crate::snapshot::RestoredState>>,
    /// What the tasks' checkpoint side is wired to.
    wiring: CheckpointWiring,
    /// What the coordinator is built from, once the plan knows the tasks.
    coordinator: CoordinatorParts,
}

/// The coordinator's part of a recovered checkpoint directory.
struct CoordinatorParts {
    config: CheckpointConfig,
    storage: Arc<CheckpointStorage>,
    first_id: u64,
    completed: Vec<u64>,
    writer: Arc<dyn SnapshotWriter>,
    commits: Arc<CommitsApplied>,
    lock: Arc<DirectoryLock>,
    local: Option<Arc<crate::checkpoint::local::LocalCopies>>,
}

/// Recovers `cfg`'s checkpoint directory for an attempt of `graph`: the newest usable
/// checkpoint (or the process's copy of it: local recovery), and the writer, commit counter
/// and acknowledgement channel (`acks`) the tasks and the coordinator share.
fn recover_checkpointed(
    cfg: &CheckpointConfig,
    graph: &crate::pipeline::Graph,
    env: &AttemptEnv,
    shared: &Arc<AttemptShared>,
    notes: &mut Vec<String>,
    acks: std::sync::mpsc::Sender<crate::checkpoint::task::TaskAck>,
) -> Result<Recovered> {
    let lock = shared.lock.clone().expect("a checkpointed job holds its directory's lock");
    // Local recovery: the process's copy, which the tasks and the coordinator keep up too.
    let local = cfg.local_recovery.then(|| std::sync::Arc::clone(&shared.local));
    // Within a state memory budget, pages are restored lazily; those read from an object
    // store are cached locally within as many bytes as the budget.
    let cache = shared.state_budget.as_ref().map(|b| crate::checkpoint::PageCache::new(b.dir(), b.limit_bytes()));
    let found =
        recover_directory(cfg, &identity(graph, &graph.fingerprint()), notes, local.as_deref(), cache.as_ref())?;
    if found.report.is_some() {
        shared.restores.fetch_add(1, Ordering::Relaxed);
    }
    *shared.last_restore.lock().unwrap_or_else(|e| e.into_inner()) = found.report.clone();
    let writer = (env.writer)(acks.clone());
    let commits = Arc::new(CommitsApplied::default());
    let wiring = CheckpointWiring {
        mode: cfg.mode,
        // Every exactly-once job's gates check the priority slots, so a running job can turn
        // unaligned checkpoints on (and off).
        unaligned: cfg.mode.exactly_once(),
        slice_records: cfg.mode.may_overtake(),
        activity: std::sync::Arc::clone(shared.metrics.activity()),
        live: Arc::new(crate::checkpoint::task::LiveSettings::new(cfg)),
        incremental: cfg.incremental,
        changelog: cfg.changelog,
        acks,
        storage: std::sync::Arc::clone(&found.storage),
        writer: std::sync::Arc::clone(&writer),
        commits: std::sync::Arc::clone(&commits),
        local: local.clone(),
    };
    let coordinator = CoordinatorParts {
        config: cfg.clone(),
        storage: found.storage,
        first_id: found.first_id,
        completed: found.completed,
        writer,
        commits,
        lock,
        local,
    };
    Ok(Recovered { recovery: found.recovery, restored: found.restored, wiring, coordinator })
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
    let graph = job.graph.borrow();
    let fingerprint = graph.fingerprint();
    if let Some(f) = graph.checkpointing.as_ref().and_then(|c| c.faults.as_ref()) {
        f.new_attempt();
    }
    let (acks_tx, acks_rx) = std::sync::mpsc::channel();
    let (recovery, restored, wiring, parts) = match &graph.checkpointing {
        Some(cfg) => {
            let r = recover_checkpointed(cfg, &graph, env, shared, notes, acks_tx)?;
            (r.recovery, r.restored, Some(r.wiring), Some(r.coordinator))
        }
        None => {
            let restored = restore_from_savepoint(&identity(&graph, &fingerprint), notes)?.map(Arc::new);
            (Recovery::default(), restored, None, None)
        }
    };
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
        metrics: std::sync::Arc::clone(&shared.metrics),
        control: std::sync::Arc::clone(&shared.control),
        parkers: env.parkers.clone(),
        restored,
        faults: graph.checkpointing.as_ref().and_then(|c| c.faults.clone()),
        attempt: std::sync::Arc::clone(&scope),
        checkpointing: wiring,
    };
    let limits =
        PlanLimits { workers: env.parkers.len(), ring_capacity: config.ring_capacity, batch_size: config.batch_size };
    // The state the tasks make and restore here keeps within the job's budget.
    let plan = {
        let _budget = crate::state::StateBudget::enter(shared.state_budget.clone());
        build_plan(&graph, limits, &plan_env)?
    };

    let live = plan_env.checkpointing.as_ref().map(|w| std::sync::Arc::clone(&w.live));
    let coordinator = parts.map(|p| {
        let crash = env.crash.clone().or_else(|| p.config.faults.clone().map(|f| f as Arc<dyn CrashSchedule>));
        let core = CoordinatorCore::new(CoordinatorSetup {
            outputs: sink_outputs(&graph),
            config: p.config,
            storage: p.storage,
            tasks: plan.endpoints.iter().map(crate::checkpoint::coordinator::TaskInfo::from).collect(),
            clock: env.clock.clone(),
            first_id: p.first_id,
            completed: p.completed,
            job: graph.name.clone(),
            fingerprint,
            stats: std::sync::Arc::clone(&shared.stats),
            failures: std::sync::Arc::clone(&shared.checkpoint_failures),
            next_id: std::sync::Arc::clone(&shared.next_checkpoint),
            in_progress: std::sync::Arc::clone(&shared.checkpoints_in_progress),
            end: scope.end.clone(),
            lock: p.lock,
            crash,
            update: std::sync::Arc::clone(&shared.checkpoint_update),
            live,
            local: p.local,
        });
        PreparedCoordinator { core, endpoints: plan.endpoints, acks: acks_rx, writer: p.writer, commits: p.commits }
    });
    Ok(PreparedAttempt { tasks: plan.tasks, scope, coordinator })
}

/// Starts one attempt on threads: prepares it, then spawns the workers and the coordinator.
pub(super) fn start_attempt(
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
    shared.state_budget.as_ref().map_or(Ok(()), |b| b.check_share(prepared.tasks.len()))?;
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
            let fail_state = std::sync::Arc::clone(&state);
            let stop = std::sync::Arc::clone(&shutdown);
            let t = spawn_named(format!("weir-{name}-coordinator"), move || {
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
            parker: std::sync::Arc::clone(&parkers[i]),
            control: std::sync::Arc::clone(control),
            state: std::sync::Arc::clone(&state),
            scope: std::sync::Arc::clone(&scope),
            core: if cores.is_empty() { None } else { Some(cores[i % cores.len()]) },
            state_budget: shared.state_budget.clone(),
        };
        let t = spawn_named(format!("weir-{name}-{i}"), {
            let exited = ExitCount(std::sync::Arc::clone(&exited));
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
pub(super) struct ExitCount(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for ExitCount {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}
