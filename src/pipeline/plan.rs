//! From the logical graph to tasks: decide which edges are chained, build every edge's rings,
//! and instantiate each subtask's chain, assigning subtask `i` of every operator to worker
//! `i % workers` (so a pipeline's subtasks share a worker, as Flink's slot sharing does).

use std::sync::Arc;

use super::graph::{AnyBox, ChannelSpec, Graph, NodeKind};
use super::task::{JobControl, Task};
use crate::barrier::{BarrierAligner, TaskCheckpointing};
use crate::channel::Partitioning;
use crate::checkpoint::coordinator::TaskEndpoint;
use crate::checkpoint::task::TaskAck;
use crate::checkpoint::{CheckpointMode, CheckpointStorage, PageIndex};
use crate::context::{AttemptScope, Clock, TaskContext};
use crate::error::{Error, Result};
use crate::metrics::JobMetrics;
use crate::snapshot::{FaultInjector, RestoredState};
use crate::wake::Parker;
use std::sync::mpsc::Sender;

/// Sizes the physical plan is built with.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PlanLimits {
    pub(crate) workers: usize,
    pub(crate) ring_capacity: usize,
    pub(crate) batch_size: usize,
}

/// Everything a worker pool needs to run a job.
pub(crate) struct PhysicalPlan {
    /// Tasks with the worker that owns each.
    pub(crate) tasks: Vec<(usize, Box<dyn Task>)>,
    /// How the checkpoint coordinator reaches each task (empty without checkpointing).
    pub(crate) endpoints: Vec<TaskEndpoint>,
}

/// What the plan needs to make tasks take part in checkpoints.
pub(crate) struct CheckpointWiring {
    pub(crate) mode: CheckpointMode,
    /// Gates check their priority slots: barriers may be unaligned.
    pub(crate) unaligned: bool,
    /// Unaligned checkpoints configured at the start: gates slice their records.
    pub(crate) slice_records: bool,
    /// Where tasks say what they are doing for checkpoints (latency attribution).
    pub(crate) activity: Arc<crate::metrics::CheckpointActivity>,
    /// What the tasks read at each checkpoint and a running job may change: the aligned-
    /// checkpoint timeout (with unaligned on, a checkpoint switches to unaligned once it has
    /// run this long, and producers republish their in-band barriers still queued then) and
    /// the in-flight budget.
    pub(crate) live: Arc<crate::checkpoint::task::LiveSettings>,
    pub(crate) incremental: bool,
    /// Changelog checkpoints: a new base after this many checkpoints of changes.
    pub(crate) changelog: Option<u32>,
    pub(crate) acks: Sender<TaskAck>,
    pub(crate) storage: Arc<CheckpointStorage>,
    pub(crate) writer: Arc<dyn crate::checkpoint::task::SnapshotWriter>,
    pub(crate) commits: Arc<crate::checkpoint::task::CommitsApplied>,
    /// Local recovery: where tasks keep what they wrote, for a failover in this process.
    pub(crate) local: Option<Arc<crate::checkpoint::local::LocalCopies>>,
}

pub(crate) struct PlanEnv {
    pub(crate) clock: Clock,
    pub(crate) metrics: Arc<JobMetrics>,
    pub(crate) control: Arc<JobControl>,
    pub(crate) parkers: Vec<Arc<Parker>>,
    pub(crate) restored: Option<Arc<RestoredState>>,
    pub(crate) faults: Option<Arc<FaultInjector>>,
    pub(crate) attempt: Arc<AttemptScope>,
    pub(crate) checkpointing: Option<CheckpointWiring>,
}

fn validate(graph: &Graph) -> Result<()> {
    if let Some(e) = graph.build_errors.first() {
        return Err(Error::config(e.clone()));
    }
    if graph.default_drift == super::graph::DefaultDrift::Fixed(0) {
        return Err(Error::config(
            "a watermark alignment drift of 0 would let no input be ahead of another, so they would take turns one \
             batch at a time; give a drift of at least a few batches' worth of event time, or turn alignment off \
             with without_watermark_alignment",
        ));
    }
    if graph.nodes.is_empty() {
        return Err(Error::config(format!("job '{}' has no operators", graph.name)));
    }
    if !graph.nodes.iter().any(|n| matches!(n.kind, NodeKind::Source(_))) {
        return Err(Error::config(format!("job '{}' has no source", graph.name)));
    }
    if graph.max_parallelism == 0 || graph.max_parallelism > u16::MAX as usize {
        return Err(Error::config(format!("max parallelism must be in 1..=65535, not {}", graph.max_parallelism)));
    }
    let mut names = std::collections::HashSet::new();
    for n in &graph.nodes {
        if n.name.contains(crate::snapshot::PART_SEPARATOR) {
            return Err(Error::config(format!(
                "operator name '{}' holds '{}', which names the parts of a checkpoint; choose another name",
                n.name,
                crate::snapshot::PART_SEPARATOR
            )));
        }
        if !names.insert(Arc::clone(&n.name)) {
            return Err(Error::config(format!("two operators are named '{}'; names must be unique", n.name)));
        }
        if n.parallelism == 0 {
            return Err(Error::config(format!("operator '{}' has parallelism 0", n.name)));
        }
        if n.keyed && n.parallelism > graph.max_parallelism {
            return Err(Error::config(format!(
                "keyed operator '{}' has parallelism {} above the max parallelism {}",
                n.name, n.parallelism, graph.max_parallelism
            )));
        }
    }
    Ok(())
}

fn effective(graph: &Graph, e: usize) -> Partitioning {
    let edge = &graph.edges[e];
    let (from, to) = (&graph.nodes[edge.from], &graph.nodes[edge.to]);
    if edge.partitioning == Partitioning::Forward && from.parallelism != to.parallelism {
        Partitioning::Rebalance
    } else {
        edge.partitioning
    }
}

fn is_chained(graph: &Graph, e: usize) -> bool {
    let to = &graph.nodes[graph.edges[e].to];
    effective(graph, e) == Partitioning::Forward && to.inputs.len() == 1 && matches!(to.kind, NodeKind::OneInput { .. })
}

struct Builder<'a> {
    graph: &'a Graph,
    limits: PlanLimits,
    env: &'a PlanEnv,
    writers: Vec<Vec<Option<AnyBox>>>,
    readers: Vec<Vec<Option<AnyBox>>>,
}

impl Builder<'_> {
    /// Makes every ring edge's channels, keeping their writers and readers for the tasks:
    /// per ring edge, its channels and the size of an entry, if bounded.
    fn wire_rings(&mut self) -> Result<Vec<(usize, Option<usize>)>> {
        let graph = self.graph;
        let mut ring_entries = Vec::new();
        for (e, edge) in graph.edges.iter().enumerate() {
            let (from, to) = (&graph.nodes[edge.from], &graph.nodes[edge.to]);
            if is_chained(graph, e) {
                self.writers.push(Vec::new());
                self.readers.push(Vec::new());
                continue;
            }
            let spec = self.channel_spec(e);
            let Some(make_channels) = &edge.make_channels else {
                return Err(Error::config(format!(
                    "operator '{}' must keep the parallelism of its input '{}': its input is not records (text lines) and cannot cross a ring",
                    to.name, from.name
                )));
            };
            let (w, r) = (make_channels.make)(&spec);
            let channels = if spec.partitioning == Partitioning::Forward {
                to.parallelism
            } else {
                from.parallelism * to.parallelism
            };
            ring_entries.push((channels, make_channels.entry_bytes));
            self.writers.push(w.into_iter().map(Some).collect());
            self.readers.push(r.into_iter().map(Some).collect());
        }
        Ok(ring_entries)
    }

    /// The channels of ring edge `e`, as its partitioning, parallelism and the job's
    /// checkpointing make them.
    fn channel_spec(&self, e: usize) -> ChannelSpec {
        let (graph, env) = (self.graph, self.env);
        let edge = &graph.edges[e];
        let (from, to) = (&graph.nodes[edge.from], &graph.nodes[edge.to]);
        ChannelSpec {
            partitioning: effective(graph, e),
            upstream: from.parallelism,
            downstream: to.parallelism,
            capacity: self.limits.ring_capacity,
            max_parallelism: graph.max_parallelism,
            upstream_parkers: (0..from.parallelism).map(|i| Arc::clone(&env.parkers[self.worker(i)])).collect(),
            downstream_parkers: (0..to.parallelism).map(|i| Arc::clone(&env.parkers[self.worker(i)])).collect(),
            senders: (0..from.parallelism).map(|i| env.metrics.operator(&from.name, i)).collect(),
            // With unaligned on, an aligned-checkpoint timeout may be set on the running job.
            barrier_expiry: env.checkpointing.as_ref().filter(|w| w.unaligned).map(|w| crate::channel::BarrierExpiry {
                clock: env.clock.clone(),
                timeout_ns: Arc::clone(&w.live.alignment_timeout_ns),
            }),
        }
    }

    fn worker(&self, subtask: usize) -> usize {
        subtask % self.limits.workers
    }

    fn ctx(&self, node: usize, subtask: usize) -> TaskContext {
        let n = &self.graph.nodes[node];
        TaskContext {
            job: self.graph.name.as_str().into(),
            operator: Arc::clone(&n.name),
            subtask,
            parallelism: n.parallelism,
            max_parallelism: self.graph.max_parallelism,
            clock: self.env.clock.clone(),
            metrics: Arc::clone(&self.env.metrics),
            parker: Arc::clone(&self.env.parkers[self.worker(subtask)]),
            restored: self.env.restored.clone(),
            faults: self.env.faults.clone(),
            attempt: Arc::clone(&self.env.attempt),
        }
    }

    /// The collector that receives node `node`'s output in subtask `i`.
    fn output(&mut self, node: usize, i: usize) -> Result<AnyBox> {
        let n = &self.graph.nodes[node];
        let mut outs: Vec<Vec<AnyBox>> = (0..=n.side_ports.len()).map(|_| Vec::new()).collect();
        for &e in &n.outputs {
            let out = if is_chained(self.graph, e) {
                let to = self.graph.edges[e].to;
                self.chained(to, i)?
            } else {
                self.writers[e][i].take().expect("each writer is taken once")
            };
            outs[self.graph.edges[e].port].push(out);
        }
        let mut outs = outs.into_iter();
        let main = (n.fan_out)(outs.next().expect("the main port"));
        Ok(match &n.with_sides {
            None => main,
            Some(join) => {
                let sides = n.side_ports.iter().zip(outs).map(|(p, o)| (Arc::clone(&p.name), (p.make)(o))).collect();
                join(main, crate::operator::side::SideOutputs::new(sides))
            }
        })
    }

    /// The chain element of `node` in subtask `i`, with everything downstream of it.
    fn chained(&mut self, node: usize, i: usize) -> Result<AnyBox> {
        let downstream = self.output(node, i)?;
        let ctx = self.ctx(node, i);
        match &self.graph.nodes[node].kind {
            NodeKind::OneInput { make, .. } | NodeKind::TwoInput { make, .. } => make(&ctx, downstream),
            NodeKind::Source(_) => unreachable!("sources have no inputs and are never chained"),
        }
    }
}

/// Builds every task of `graph`.
pub(crate) fn build(graph: &Graph, limits: PlanLimits, env: &PlanEnv) -> Result<PhysicalPlan> {
    validate(graph)?;
    // Before any assigner is made: this attempt's join afresh, and the default group's only
    // when it bounds drift.
    graph.watermark_registry.forget_members();
    graph.watermark_groups.iter().for_each(|(_, group)| group.forget_members());
    graph.default_alignment.forget_members();
    graph.default_alignment.set_max_drift(graph.default_drift());
    assert!(limits.workers >= 1 && env.parkers.len() == limits.workers);
    let mut b = Builder { graph, limits, env, writers: Vec::new(), readers: Vec::new() };
    let ring_entries = b.wire_rings()?;
    if let Some(w) = &env.checkpointing {
        let channels = ring_entries.iter().map(|(c, _)| c).sum::<usize>();
        w.live.set_channels(channels);
        check_inflight_budget(graph, limits.ring_capacity, &ring_entries)?;
    }
    let mut tasks = Vec::new();
    let mut endpoints = Vec::new();
    for (id, node) in graph.nodes.iter().enumerate() {
        let head = match node.kind {
            NodeKind::Source(_) => true,
            _ => node.inputs.iter().any(|&e| !is_chained(graph, e)),
        };
        if !head {
            continue;
        }
        check_both_inputs(graph, node)?;
        for i in 0..node.parallelism {
            let ctx = b.ctx(id, i);
            let (checkpointing, control) = match &env.checkpointing {
                Some(w) => {
                    let (c, tx) = task_checkpointing(w, env, tasks.len());
                    (Some(c), Some(tx))
                }
                None => (None, None),
            };
            // Incremental checkpoints refer to the pages a lazy restore left where they were
            // stored (a changelog's chain starts again after a restart: its base is written).
            let index = checkpointing.as_ref().and_then(|c| c.pages.clone()).filter(|i| !i.is_changelog());
            // Within a budget, a page unchanged since a checkpoint stored it leaves memory
            // without a spill write (read back from the checkpoint's file).
            if let (Some(index), Some(budget), Some(w)) =
                (&index, crate::state::StateBudget::current(), &env.checkpointing)
            {
                index.read_from(w.storage.dir(), w.storage.fingerprint());
                budget.pages_stored_by(Arc::downgrade(index) as std::sync::Weak<dyn crate::snapshot::StoredPages>);
            }
            let (task, left_stored) = crate::snapshot::pages_left_stored(|| b.make_task(id, i, &ctx, checkpointing));
            let task = task?;
            if let Some(index) = index.filter(|_| !left_stored.is_empty()) {
                index.seed(left_stored);
            }
            if let Some(control) = control {
                let is_source = matches!(node.kind, NodeKind::Source(_));
                endpoints.push(TaskEndpoint { index: tasks.len(), name: task.name().to_string(), is_source, control });
            }
            tasks.push((b.worker(i), task));
        }
    }
    Ok(PhysicalPlan { tasks, endpoints })
}

impl Builder<'_> {
    /// Task `i` of node `id`, its operators made and restored.
    fn make_task(
        &mut self,
        id: usize,
        i: usize,
        ctx: &TaskContext,
        checkpointing: Option<TaskCheckpointing>,
    ) -> Result<Box<dyn Task>> {
        let (graph, limits, env) = (self.graph, self.limits, self.env);
        let node = &graph.nodes[id];
        match &node.kind {
            NodeKind::Source(make) => {
                let out = self.output(id, i)?;
                make(ctx, out, limits.batch_size, Arc::clone(&env.control), checkpointing)
            }
            NodeKind::OneInput { make_task, .. } | NodeKind::TwoInput { make_task, .. } => {
                let head = self.chained(id, i)?;
                let readers = node
                    .inputs
                    .iter()
                    .map(|&e| (graph.edges[e].input, self.readers[e][i].take().expect("each reader is taken once")))
                    .collect();
                make_task(ctx, readers, head, limits.batch_size, checkpointing)
            }
        }
    }
}

/// A two-input operator must have both its inputs.
fn check_both_inputs(graph: &Graph, node: &super::graph::Node) -> Result<()> {
    if let NodeKind::TwoInput { .. } = node.kind {
        let sides: Vec<usize> = node.inputs.iter().map(|&e| graph.edges[e].input).collect();
        if !(sides.contains(&0) && sides.contains(&1)) {
            return Err(Error::config(format!("two-input operator '{}' lacks an input", node.name)));
        }
    }
    Ok(())
}

/// Task `task`'s side of the checkpoint wiring `w`: what it needs to take part in
/// checkpoints, and the sender the coordinator controls it through.
fn task_checkpointing(
    w: &CheckpointWiring,
    env: &PlanEnv,
    task: usize,
) -> (TaskCheckpointing, Sender<crate::checkpoint::task::TaskControl>) {
    let (tx, rx) = std::sync::mpsc::channel();
    // Within a state memory budget even full checkpoints keep pages apart, in their own
    // shared files: a restore then leaves them there until used.
    let pages_apart_in_full = !w.incremental && w.changelog.is_none() && crate::state::StateBudget::current().is_some();
    let checkpointing = TaskCheckpointing {
        task,
        mode: w.mode,
        unaligned: w.unaligned,
        sliced: w.slice_records,
        activity: crate::barrier::activity::ActivityReport::new(Arc::clone(&w.activity), env.clock.clone()),
        pending_unaligned: Vec::new(),
        unaligned_done: 0,
        control: rx,
        acks: w.acks.clone(),
        storage: Arc::clone(&w.storage),
        writer: Arc::clone(&w.writer),
        commits: Arc::clone(&w.commits),
        pages: match w.changelog {
            Some(every) => Some(Arc::new(PageIndex::changelog(every))),
            None => (w.incremental || pages_apart_in_full).then(Default::default),
        },
        pages_apart_in_full,
        faults: env.faults.clone(),
        clock: env.clock.clone(),
        aligner: BarrierAligner::new(0),
        live: Arc::clone(&w.live),
        deferred: None,
        parts: Default::default(),
        local: w.local.clone(),
    };
    (checkpointing, tx)
}

/// What the job's rings hold at most, in bytes, with `capacity` entries a ring: `None` when
/// that is not bounded (a record type that owns heap memory crosses a ring) or there is no
/// ring (everything chained).
pub(crate) fn ring_bytes(graph: &Graph, capacity: usize) -> Option<u64> {
    let mut bytes = 0u64;
    let mut rings = 0;
    for (e, edge) in graph.edges.iter().enumerate() {
        if is_chained(graph, e) {
            continue;
        }
        let (from, to) = (&graph.nodes[edge.from], &graph.nodes[edge.to]);
        let channels = if effective(graph, e) == Partitioning::Forward {
            to.parallelism
        } else {
            from.parallelism * to.parallelism
        };
        let entry = edge.make_channels.as_ref()?.entry_bytes?;
        bytes += (channels * capacity * entry) as u64;
        rings += 1;
    }
    (rings > 0).then_some(bytes)
}

/// An in-flight budget the job's rings could never fill would never align a channel: it is
/// refused. What the rings hold is bounded for records that own no heap memory (their
/// encoding is no larger than an entry); a job with records that do is not checked.
fn check_inflight_budget(graph: &Graph, capacity: usize, rings: &[(usize, Option<usize>)]) -> Result<()> {
    let Some(budget) = graph.checkpointing.as_ref().and_then(|c| c.mode.inflight_budget()) else { return Ok(()) };
    if rings.iter().any(|(_, b)| b.is_none()) {
        return Ok(());
    }
    let entries: usize = rings.iter().map(|(c, _)| c * capacity).sum();
    let bytes = ring_bytes(graph, capacity).unwrap_or(0);
    if budget > bytes {
        return Err(Error::config(format!(
            "the in-flight budget of {budget} bytes is above what the job's rings hold ({entries} entries, at most \
             {bytes} bytes): no channel would ever be aligned; choose a smaller budget, or plain unaligned checkpoints"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::Job;
    use crate::source::Generator;

    fn tasks_of(job: &Job, workers: usize) -> Vec<(usize, String)> {
        let env = PlanEnv {
            clock: Clock::start(),
            metrics: Arc::new(JobMetrics::default()),
            control: Arc::new(JobControl::default()),
            parkers: (0..workers).map(|_| Arc::new(Parker::default())).collect(),
            restored: None,
            faults: None,
            attempt: Arc::new(AttemptScope::default()),
            checkpointing: None,
        };
        let limits = PlanLimits { workers, ring_capacity: 8, batch_size: 8 };
        let plan = build(&job.graph.borrow(), limits, &env).unwrap();
        plan.tasks.into_iter().map(|(w, t)| (w, t.name().to_string())).collect()
    }

    #[test]
    fn forward_edges_with_equal_parallelism_are_chained() {
        let job = Job::new("chain").with_parallelism(3);
        job.generator(Generator::new(|i, _| i)).map(|x| x + 1).filter(|x| x % 2 == 0).discard();
        let tasks = tasks_of(&job, 2);
        // One task per subtask: the map, filter and sink run inside the source's task.
        assert_eq!(tasks.len(), 3, "{tasks:?}");
        assert_eq!(tasks.iter().map(|t| t.0).collect::<Vec<_>>(), vec![0, 1, 0], "subtask i on worker i % 2");
    }

    #[test]
    fn key_by_and_parallelism_changes_break_chains() {
        let job = Job::new("split").with_parallelism(2);
        job.generator(Generator::new(|i, _| i))
            .key_by(|x: &u64| *x)
            .reduce(|a, b| a + b)
            .map(|x| x * 2)
            .set_parallelism(1)
            .discard();
        let names: Vec<String> = tasks_of(&job, 2).into_iter().map(|t| t.1).collect();
        // 2 source tasks, 2 reduce tasks (key_by), 1 map task (parallelism 2 → 1), sink chained.
        assert_eq!(names.len(), 5, "{names:?}");
        assert!(names.iter().filter(|n| n.starts_with("reduce")).count() == 2, "{names:?}");
        assert!(names.iter().any(|n| n.starts_with("map")), "{names:?}");
    }
}
