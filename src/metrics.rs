//! Job metrics: record counters per source and sink subtask, late records, and the latency
//! histogram (event creation to sink), the statistics of each completed checkpoint
//! ([`CheckpointStats`], which `_metadata` records too), and the end-of-job [`JobReport`].
//! [`CheckpointActivity`] is what the tasks are doing for checkpoints (aligning, forking
//! state, capturing in-flight data), so latency probes can say which of it a record's time
//! in the job overlapped ([`LatencyCause`]).
//!
//! Counters are single-writer atomics padded to their own cache lines (two subtasks on
//! different cores must not false-share); readers (the progress line) only load them.
//! Histograms are per subtask and merged once, when the subtask ends, so the record path never
//! takes a lock.
//!
//! May touch: `snapshot` (the checkpoint mode a checkpoint was taken in).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_utils::CachePadded;
/// The latency histograms of reports and metrics (re-exported: they are part of this API).
pub use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::snapshot::CheckpointMode;

/// A monotonically increasing counter written by one subtask.
#[derive(Default, Debug)]
pub struct Counter(CachePadded<AtomicU64>);

impl Counter {
    /// Adds `n`.
    #[inline]
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Lowest and highest latency the histograms track, and their precision.
const LATENCY_LOW_NS: u64 = 1;
const LATENCY_HIGH_NS: u64 = 3_600_000_000_000;
const LATENCY_SIGFIG: u8 = 3;

/// A new latency histogram (nanoseconds, 3 significant figures, up to an hour).
pub fn new_latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(LATENCY_LOW_NS, LATENCY_HIGH_NS, LATENCY_SIGFIG)
        .expect("static histogram bounds are valid")
}

/// One operator subtask's live figures, written by its task alone (per batch, not per
/// record), read by whoever scrapes them.
#[derive(Debug)]
pub struct OperatorMetrics {
    /// The operator's name.
    pub operator: Arc<str>,
    /// The subtask.
    pub subtask: usize,
    records_in: Counter,
    /// Records it sent into its output rings (the last operator of a chain: a chained one
    /// hands its records to the next, whose records in count them).
    records_out: Counter,
    /// The newest watermark it received (`u64::MAX`: none yet).
    watermark: CachePadded<AtomicU64>,
}

impl OperatorMetrics {
    /// Records it received so far (over every attempt of the job).
    pub fn records_in(&self) -> u64 {
        self.records_in.get()
    }

    /// Records it sent into its output rings so far (over every attempt of the job).
    pub fn records_out(&self) -> u64 {
        self.records_out.get()
    }

    /// The newest watermark it received, if any.
    pub fn watermark(&self) -> Option<u64> {
        Some(self.watermark.load(Ordering::Relaxed)).filter(|&w| w != u64::MAX)
    }

    #[inline]
    pub(crate) fn received(&self, n: u64) {
        self.records_in.add(n);
    }

    #[inline]
    pub(crate) fn sent(&self, n: usize) {
        self.records_out.add(n as u64);
    }

    #[inline]
    pub(crate) fn watermarked(&self, w: u64) {
        self.watermark.store(w, Ordering::Relaxed);
    }
}

/// How full one operator subtask's input rings are: per channel, the entries waiting in it when
/// the subtask last read it (a full ring means its producer waits: backpressure). Written by
/// the subtask at each read of a channel, read by whoever scrapes them.
#[derive(Debug)]
pub struct InputFill {
    /// The operator's name.
    pub operator: Arc<str>,
    /// The subtask.
    pub subtask: usize,
    /// Which of the operator's inputs (0, or 1 for a two-input operator's second).
    pub input: usize,
    /// Entries a ring holds.
    pub capacity: usize,
    waiting: Vec<CachePadded<AtomicU64>>,
}

impl InputFill {
    /// Per channel, the entries waiting when it was last read.
    pub fn waiting(&self) -> Vec<u64> {
        self.waiting.iter().map(|w| w.load(Ordering::Relaxed)).collect()
    }

    #[inline]
    pub(crate) fn saw(&self, channel: usize, entries: usize) {
        self.waiting[channel].store(entries as u64, Ordering::Relaxed);
    }
}

/// What a record's time in the job is attributed to: the checkpoint work of the job's tasks
/// that overlapped most of it, if that overlap is at least a quarter of the record's latency
/// (a record queued 700 ms behind backpressure is not explained by a 50 µs fork it crossed).
///
/// Job-wide, not per path: a record is attributed to what any task did while it was in
/// flight (in a job of one pipeline, its path); and per kind of work only its latest spell
/// across the job counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LatencyCause {
    /// A task held channels back for a checkpoint (aligned barriers, or adaptive alignment
    /// reading a channel no further than its barrier).
    Aligning,
    /// A task took the synchronous part of its snapshot (the arenas' fork).
    SyncFork,
    /// A task captured the in-flight data of an unaligned checkpoint.
    Capture,
    /// None of the above.
    Nothing,
}

impl LatencyCause {
    /// Every cause, in the order a sample is attributed.
    pub const ALL: [LatencyCause; 4] =
        [LatencyCause::Aligning, LatencyCause::SyncFork, LatencyCause::Capture, LatencyCause::Nothing];

    /// Its name in tables and metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            LatencyCause::Aligning => "aligning",
            LatencyCause::SyncFork => "sync fork",
            LatencyCause::Capture => "behind a capture",
            LatencyCause::Nothing => "nothing",
        }
    }

    /// Its name as a metrics label value (and in JSON).
    pub fn key(self) -> &'static str {
        match self {
            LatencyCause::Aligning => "aligning",
            LatencyCause::SyncFork => "sync-fork",
            LatencyCause::Capture => "capture",
            LatencyCause::Nothing => "nothing",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One kind of checkpoint work across the job's tasks.
#[derive(Default, Debug)]
struct Phase {
    /// Tasks doing it now.
    active: CachePadded<AtomicU64>,
    /// When its latest spell began, nanoseconds on the job clock.
    started: CachePadded<AtomicU64>,
    /// When a task last stopped doing it, nanoseconds on the job clock, plus one (0: never).
    ended: CachePadded<AtomicU64>,
}

/// What the job's tasks are doing for checkpoints, for latency attribution: per kind of work
/// (the first three [`LatencyCause`]s), how many tasks do it now and its latest spell across
/// the job. Tasks write it when their work changes (a few times a checkpoint); latency probes
/// read it once a batch.
#[derive(Default, Debug)]
pub struct CheckpointActivity {
    phases: [Phase; 3],
}

/// Per kind of work, its latest spell: `(start, end)` on the job clock, the end `u64::MAX`
/// while a task does it, `(0, 0)` if none ever did.
pub(crate) type Spells = [(u64, u64); 3];

impl CheckpointActivity {
    /// A task started `cause`'s work at `now_ns`.
    pub(crate) fn enter(&self, cause: LatencyCause, now_ns: u64) {
        let p = &self.phases[cause.index()];
        if p.active.fetch_add(1, Ordering::Relaxed) == 0 {
            p.started.store(now_ns, Ordering::Relaxed);
        }
    }

    /// A task stopped `cause`'s work at `now_ns`.
    pub(crate) fn leave(&self, cause: LatencyCause, now_ns: u64) {
        let p = &self.phases[cause.index()];
        p.ended.fetch_max(now_ns.saturating_add(1), Ordering::Relaxed);
        let was = p.active.fetch_sub(1, Ordering::Relaxed);
        debug_assert!(was > 0, "{cause:?} left more often than entered");
    }

    /// A task did `cause`'s work from `start_ns` to `end_ns` (work done in one call, as the
    /// synchronous fork).
    pub(crate) fn happened(&self, cause: LatencyCause, start_ns: u64, end_ns: u64) {
        let p = &self.phases[cause.index()];
        p.started.store(start_ns, Ordering::Relaxed);
        p.ended.fetch_max(end_ns.saturating_add(1), Ordering::Relaxed);
    }

    /// Each kind of work's latest spell.
    #[inline]
    pub(crate) fn spells(&self) -> Spells {
        std::array::from_fn(|i| {
            let p = &self.phases[i];
            let started = p.started.load(Ordering::Relaxed);
            if p.active.load(Ordering::Relaxed) > 0 {
                (started, u64::MAX)
            } else {
                match p.ended.load(Ordering::Relaxed) {
                    0 => (0, 0),
                    ended => (started.min(ended - 1), ended - 1),
                }
            }
        })
    }
}

/// The cause a record created at `created_ns` and delivered at `now_ns` is attributed to,
/// given the job's [`Spells`] then.
#[inline]
pub(crate) fn attribute(created_ns: u64, now_ns: u64, spells: &Spells) -> LatencyCause {
    let latency = now_ns.saturating_sub(created_ns);
    let mut best = (0, LatencyCause::Nothing);
    for (i, &(start, end)) in spells.iter().enumerate() {
        let overlap = end.min(now_ns).saturating_sub(start.max(created_ns));
        if overlap > best.0 {
            best = (overlap, LatencyCause::ALL[i]);
        }
    }
    if best.0 > 0 && best.0.saturating_mul(4) >= latency {
        best.1
    } else {
        LatencyCause::Nothing
    }
}

/// Metrics shared by every subtask of a job.
#[derive(Default)]
pub struct JobMetrics {
    operators: Mutex<Vec<Arc<OperatorMetrics>>>,
    inputs: Mutex<Vec<Arc<InputFill>>>,
    sources: Mutex<Vec<Arc<Counter>>>,
    sinks: Mutex<Vec<Arc<Counter>>>,
    late: Mutex<Vec<Arc<Counter>>>,
    latency: Mutex<Option<Histogram<u64>>>,
    /// Per [`LatencyCause`], the latency of the records attributed to it.
    latency_by_cause: Mutex<[Option<Histogram<u64>>; 4]>,
    activity: Arc<CheckpointActivity>,
}

fn register(list: &Mutex<Vec<Arc<Counter>>>) -> Arc<Counter> {
    let c = Arc::new(Counter::default());
    list.lock().unwrap_or_else(|e| e.into_inner()).push(Arc::clone(&c));
    c
}

fn total(list: &Mutex<Vec<Arc<Counter>>>) -> u64 {
    list.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|c| c.get()).sum()
}

impl JobMetrics {
    /// The live figures of subtask `subtask` of `operator` (the same ones again after a
    /// restart: they count over the job's life).
    pub fn operator(&self, operator: &Arc<str>, subtask: usize) -> Arc<OperatorMetrics> {
        let mut all = self.operators.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = all.iter().find(|m| m.operator == *operator && m.subtask == subtask) {
            return Arc::clone(m);
        }
        let m = Arc::new(OperatorMetrics {
            operator: Arc::clone(operator),
            subtask,
            records_in: Counter::default(),
            records_out: Counter::default(),
            watermark: CachePadded::new(AtomicU64::new(u64::MAX)),
        });
        all.push(Arc::clone(&m));
        m
    }

    /// The fill of input `input` of subtask `subtask` of `operator`, of `channels` rings of
    /// `capacity` entries (the same one again after a restart).
    pub fn input_fill(
        &self,
        operator: &Arc<str>,
        subtask: usize,
        input: usize,
        channels: usize,
        capacity: usize,
    ) -> Arc<InputFill> {
        let mut all = self.inputs.lock().unwrap_or_else(|e| e.into_inner());
        let same = |f: &&Arc<InputFill>| {
            f.operator == *operator && f.subtask == subtask && f.input == input && f.waiting.len() == channels
        };
        if let Some(f) = all.iter().find(same) {
            return Arc::clone(f);
        }
        let waiting = (0..channels).map(|_| CachePadded::new(AtomicU64::new(0))).collect();
        let f = Arc::new(InputFill { operator: Arc::clone(operator), subtask, input, capacity, waiting });
        all.push(Arc::clone(&f));
        f
    }

    /// Every operator subtask's input fill, in the order they started.
    pub fn input_fills(&self) -> Vec<Arc<InputFill>> {
        self.inputs.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Every operator subtask's live figures, in the order they started.
    pub fn operators(&self) -> Vec<Arc<OperatorMetrics>> {
        self.operators.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A counter of records emitted by one source subtask.
    pub fn source_counter(&self) -> Arc<Counter> {
        register(&self.sources)
    }
    /// A counter of records received by one sink subtask.
    pub fn sink_counter(&self) -> Arc<Counter> {
        register(&self.sinks)
    }
    /// A counter of late records dropped by one window subtask.
    pub fn late_counter(&self) -> Arc<Counter> {
        register(&self.late)
    }
    /// Records emitted by all sources so far.
    pub fn source_records(&self) -> u64 {
        total(&self.sources)
    }
    /// Records received by all sinks so far.
    pub fn sink_records(&self) -> u64 {
        total(&self.sinks)
    }
    /// Late records dropped so far.
    pub fn late_records(&self) -> u64 {
        total(&self.late)
    }
    /// Merges a subtask's latency histogram into the job's.
    pub fn merge_latency(&self, h: &Histogram<u64>) {
        let mut slot = self.latency.lock().unwrap_or_else(|e| e.into_inner());
        match slot.as_mut() {
            Some(all) => all.add(h).expect("histograms share bounds"),
            None => *slot = Some(h.clone()),
        }
    }
    /// The merged latency histogram, if any subtask measured latency.
    pub fn latency(&self) -> Option<Histogram<u64>> {
        self.latency.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Merges a subtask's latency histograms, one per [`LatencyCause`] (in
    /// [`LatencyCause::ALL`]'s order), into the job's: by cause and in all.
    pub fn merge_latency_by_cause(&self, by_cause: &[Histogram<u64>; 4]) {
        {
            let mut slots = self.latency_by_cause.lock().unwrap_or_else(|e| e.into_inner());
            for (slot, h) in slots.iter_mut().zip(by_cause) {
                if h.is_empty() {
                    continue;
                }
                match slot.as_mut() {
                    Some(all) => all.add(h).expect("histograms share bounds"),
                    None => *slot = Some(h.clone()),
                }
            }
        }
        for h in by_cause.iter().filter(|h| !h.is_empty()) {
            self.merge_latency(h);
        }
    }

    /// Per cause, the latency of the records attributed to it (causes no record was
    /// attributed to are left out).
    pub fn latency_by_cause(&self) -> Vec<(LatencyCause, Histogram<u64>)> {
        let slots = self.latency_by_cause.lock().unwrap_or_else(|e| e.into_inner());
        LatencyCause::ALL.iter().zip(slots.iter()).filter_map(|(c, h)| Some((*c, h.clone()?))).collect()
    }

    /// What the job's tasks are doing for checkpoints (written by the tasks, read by latency
    /// probes).
    pub fn activity(&self) -> &Arc<CheckpointActivity> {
        &self.activity
    }
}

/// What a state memory budget's pages did ([`crate::RunConfig::state_memory`]), at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StateMemoryStats {
    /// The budget, in bytes.
    pub limit_bytes: u64,
    /// Bytes of pages in memory.
    pub resident_bytes: u64,
    /// The most bytes of pages in memory at once.
    pub resident_peak_bytes: u64,
    /// Bytes in spill files still open.
    pub spilled_bytes: u64,
    /// Pages read back into memory.
    pub faults: u64,
    /// Time spent reading pages back, in nanoseconds, over all faults.
    pub fault_nanos: u64,
    /// Pages that left memory.
    pub evictions: u64,
    /// Pages written to a spill file (an eviction of a page unchanged since it was read back
    /// writes none).
    pub spill_writes: u64,
}

/// What a finished job reports.
#[derive(Debug, Clone)]
pub struct JobReport {
    /// Records emitted by the sources.
    pub source_records: u64,
    /// Records received by the sinks.
    pub sink_records: u64,
    /// Late records dropped by windows.
    pub late_records: u64,
    /// Wall-clock time from start to end.
    pub elapsed: Duration,
    /// Workers the job ran on.
    pub workers: usize,
    /// Event-creation-to-sink latency, where the job measured it.
    pub latency_ns: Option<Histogram<u64>>,
    /// The same latency split by what the job's tasks were doing while each record was in
    /// flight ([`LatencyCause`]; causes without samples left out).
    pub latency_by_cause: Vec<(LatencyCause, Histogram<u64>)>,
    /// Completed checkpoints, in order: the newest [`HISTORY_KEPT`].
    pub checkpoints: Vec<CheckpointStats>,
    /// Checkpoints completed in all.
    pub checkpoints_completed: u64,
    /// Restarts after failures.
    pub restarts: u32,
    /// With a state memory budget ([`crate::RunConfig::state_memory`]): what its pages did.
    pub state_memory: Option<StateMemoryStats>,
}

impl JobReport {
    /// Source records per second over the whole run.
    pub fn throughput_rps(&self) -> f64 {
        self.source_records as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// A unit to show durations in, so that values side by side compare at a glance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeUnit {
    /// Nanoseconds.
    Ns,
    /// Microseconds.
    Us,
    /// Milliseconds.
    Ms,
    /// Seconds.
    S,
}

impl TimeUnit {
    /// The unit [`format_ns`] picks for `ns`.
    pub fn for_ns(ns: u64) -> TimeUnit {
        match ns {
            0..=9_999 => TimeUnit::Ns,
            10_000..=9_999_999 => TimeUnit::Us,
            10_000_000..=9_999_999_999 => TimeUnit::Ms,
            _ => TimeUnit::S,
        }
    }

    /// The unit for a column of values whose largest is `ns`: it shows below 1000.
    pub fn for_largest(ns: u64) -> TimeUnit {
        match ns {
            0..=999 => TimeUnit::Ns,
            1_000..=999_999 => TimeUnit::Us,
            1_000_000..=999_999_999 => TimeUnit::Ms,
            _ => TimeUnit::S,
        }
    }

    /// `ns` in this unit.
    pub fn format(self, ns: u64) -> String {
        match self {
            TimeUnit::Ns => format!("{ns} ns"),
            TimeUnit::Us => format!("{:.1} µs", ns as f64 / 1e3),
            TimeUnit::Ms => format!("{:.2} ms", ns as f64 / 1e6),
            TimeUnit::S => format!("{:.2} s", ns as f64 / 1e9),
        }
    }
}

/// `1234567` as `1,234,567`.
pub fn group_digits(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A duration in nanoseconds with a readable unit.
pub fn format_ns(ns: u64) -> String {
    TimeUnit::for_ns(ns).format(ns)
}

/// One input channel's part in an adaptive checkpoint at its task.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChannelAlignment {
    /// The task's index in the job's plan.
    pub task: usize,
    /// The channel's index among the task's input channels.
    pub channel: usize,
    /// Aligned (everything before its barrier was processed before the snapshot) or captured.
    pub aligned: bool,
    /// In-flight bytes captured from it.
    pub bytes: u64,
    /// From the checkpoint's first barrier at the task until the channel reached its barrier
    /// (aligned) or the task snapshotted (captured), milliseconds.
    pub wait_ms: f64,
}

/// A checkpoint triggered and not yet completed or failed (Flink's `IN_PROGRESS` row).
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct CheckpointInProgress {
    /// The checkpoint id.
    pub id: u64,
    /// Trigger time, milliseconds since the Unix epoch.
    pub trigger_unix_ms: u64,
    /// Tasks that acknowledged it so far, of `tasks`.
    pub acknowledged: usize,
    /// Tasks that must acknowledge it.
    pub tasks: usize,
    /// Whether it is a savepoint.
    pub savepoint: bool,
}

/// The checkpoints in progress, published by the coordinator's thread after each of its steps
/// (written only when they changed), read by anyone.
#[derive(Debug, Default)]
pub(crate) struct InProgress {
    rows: std::sync::Mutex<Vec<CheckpointInProgress>>,
}

impl InProgress {
    /// How many are in progress.
    pub(crate) fn count(&self) -> u64 {
        self.rows.lock().unwrap_or_else(|e| e.into_inner()).len() as u64
    }

    /// The rows, oldest first.
    pub(crate) fn rows(&self) -> Vec<CheckpointInProgress> {
        self.rows.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Publishes `rows` if they differ from what is published (most of the coordinator's steps
    /// change nothing: they allocate nothing then).
    pub(crate) fn publish(&self, rows: impl ExactSizeIterator<Item = CheckpointInProgress> + Clone) {
        let mut published = self.rows.lock().unwrap_or_else(|e| e.into_inner());
        if rows.len() == published.len() && rows.clone().zip(published.iter()).all(|(r, p)| r == *p) {
            return;
        }
        published.clear();
        published.extend(rows);
    }
}

/// Statistics of one completed checkpoint.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CheckpointStats {
    /// The checkpoint id.
    pub id: u64,
    /// Trigger time, milliseconds since the job (attempt) started.
    pub trigger_ms: f64,
    /// Trigger time, milliseconds since the Unix epoch (Flink's `trigger_timestamp`; 0 in the
    /// statistics of a checkpoint written before it was kept, and under simulation the
    /// simulated time).
    #[serde(default)]
    pub trigger_unix_ms: u64,
    /// From trigger to completion.
    pub duration_ms: f64,
    /// Longest time from trigger until a task saw the first barrier.
    pub start_delay_ms: f64,
    /// Longest barrier alignment at a task.
    pub alignment_ms: f64,
    /// Longest synchronous snapshot part at a task.
    pub sync_ms: f64,
    /// Longest asynchronous snapshot part at a task.
    pub async_ms: f64,
    /// Bytes of the whole state (what a full checkpoint writes).
    pub state_bytes: u64,
    /// Bytes of state this checkpoint wrote: all of it for a full checkpoint, the pages dirtied
    /// since the last completed checkpoint (and small operator state) for an incremental one.
    /// Named `incremental_bytes` in JSON (metadata and `weir bench --json`).
    #[serde(default, rename = "incremental_bytes", alias = "written_bytes")]
    pub written_bytes: u64,
    /// Bytes of in-flight data written (unaligned checkpoints).
    pub inflight_bytes: u64,
    /// The configuration it ran under: the interval in force when it was triggered (the
    /// interval during backlog, if a source reported one), and its timeout.
    #[serde(default)]
    pub interval_ms: f64,
    /// See `interval_ms`.
    #[serde(default)]
    pub timeout_ms: f64,
    /// How its barriers went: the mode it was taken in, with its parameter, or `None` for a
    /// savepoint (always aligned). Written in JSON as it always was: `alignment` (the mode's
    /// name, or `savepoint`), `alignment_timeout_ms` for aligned-timeout and
    /// `inflight_budget` (bytes) for adaptive.
    #[serde(flatten, with = "mode_fields")]
    pub mode: Option<CheckpointMode>,
    /// Adaptive alignment: each task's input channels, aligned or captured.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub channels: Vec<ChannelAlignment>,
    /// A checkpoint that resumed a failed one (it expired, or a task declined it): that
    /// checkpoint's id, and each task's part, reused or why not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_from: Option<u64>,
    /// See `resumed_from`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<PartReuse>,
    /// With the checkpoint directory in an object store: the time its files took to go up,
    /// part of `duration_ms` (the checkpoint completes once `_metadata` is in the store). The
    /// statistics in `_metadata` itself are taken before it goes up, without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload_ms: Option<f64>,
    /// Each task's part, in plan order (Flink's per-subtask checkpoint details); kept for the
    /// newest [`TASK_STATS_KEPT`] checkpoints of a running job.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<TaskCheckpointStats>,
}

/// The checkpoints of a running job whose per-task statistics are kept (older ones keep their
/// totals).
pub const TASK_STATS_KEPT: usize = 100;

/// The completed checkpoints whose statistics a running job keeps, the newest: a job that
/// checkpoints every second for a month completes 2.6 million, and every scrape and report
/// would copy them all.
pub const HISTORY_KEPT: usize = 1000;

/// The failed checkpoints whose failure a running job keeps, the newest (how many failed in
/// all is counted apart): a job whose storage is gone fails a checkpoint a second for as long
/// as it runs.
pub const FAILURES_KEPT: usize = 100;

/// Why a checkpoint failed, and when.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CheckpointFailure {
    /// The checkpoint.
    pub checkpoint: u64,
    /// When it failed (milliseconds since the Unix epoch, from the job's clock).
    pub failed_unix_ms: u64,
    /// Why (declined by a task, expired, failed to write, …).
    pub reason: String,
}

impl std::fmt::Display for CheckpointFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "checkpoint {} failed: {}", self.checkpoint, self.reason)
    }
}

/// The newest `N` of a series (checkpoints completed, failures), oldest first, and how many
/// there were in all: a job that runs for months keeps a bounded list and an exact count.
#[derive(Debug)]
pub(crate) struct NewestKept<T, const N: usize> {
    kept: std::collections::VecDeque<T>,
    total: u64,
}

impl<T, const N: usize> Default for NewestKept<T, N> {
    fn default() -> Self {
        NewestKept { kept: std::collections::VecDeque::new(), total: 0 }
    }
}

impl<T: Clone, const N: usize> NewestKept<T, N> {
    /// One more, the oldest kept going past `N`.
    pub(crate) fn push(&mut self, item: T) {
        self.total += 1;
        self.kept.push_back(item);
        if self.kept.len() > N {
            self.kept.pop_front();
        }
    }

    /// Those kept, oldest first.
    pub(crate) fn kept(&self) -> Vec<T> {
        self.kept.iter().cloned().collect()
    }

    /// The newest.
    pub(crate) fn last(&self) -> Option<T> {
        self.kept.back().cloned()
    }

    /// How many in all.
    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    /// Takes those kept, oldest first, leaving none (the count stays).
    pub(crate) fn take(&mut self) -> Vec<T> {
        self.kept.drain(..).collect()
    }
}

/// A job's checkpoint failures: the newest [`FAILURES_KEPT`], and how many in all.
pub(crate) type CheckpointFailures = NewestKept<CheckpointFailure, FAILURES_KEPT>;

#[cfg(test)]
mod failure_tests {
    use super::*;

    /// A job that fails a checkpoint a second for a month keeps the newest hundred, with
    /// their times, and counts them all (the list grew without end).
    #[test]
    fn failures_are_kept_bounded_and_counted() {
        let mut f = CheckpointFailures::default();
        for id in 1..=250 {
            f.push(CheckpointFailure { checkpoint: id, failed_unix_ms: 1000 * id, reason: "expired".into() });
        }
        let kept = f.kept();
        assert_eq!((kept.len(), f.total()), (FAILURES_KEPT, 250));
        assert_eq!((kept[0].checkpoint, kept[99].checkpoint, kept[99].failed_unix_ms), (151, 250, 250_000));
        assert_eq!(kept[99].to_string(), "checkpoint 250 failed: expired");
    }
}

/// A job's completed checkpoints: the statistics of the newest [`HISTORY_KEPT`] (per-task
/// details of the newest [`TASK_STATS_KEPT`]), and how many completed in all.
#[derive(Debug, Default)]
pub(crate) struct CheckpointHistory(NewestKept<CheckpointStats, HISTORY_KEPT>);

impl CheckpointHistory {
    /// One more completed checkpoint.
    pub(crate) fn push(&mut self, stats: CheckpointStats) {
        self.0.push(stats);
        let kept = &mut self.0.kept;
        if let Some(old) = kept.len().checked_sub(TASK_STATS_KEPT + 1) {
            kept[old].tasks = Vec::new();
        }
    }

    /// The statistics kept, oldest first.
    pub(crate) fn stats(&self) -> Vec<CheckpointStats> {
        self.0.kept()
    }

    /// The newest checkpoint's statistics.
    pub(crate) fn last(&self) -> Option<CheckpointStats> {
        self.0.last()
    }

    /// Checkpoints completed in all.
    pub(crate) fn completed(&self) -> u64 {
        self.0.total()
    }
    /// Takes the statistics kept, oldest first, leaving none (the count stays).
    pub(crate) fn take(&mut self) -> Vec<CheckpointStats> {
        self.0.take()
    }
}

/// One task's part of a completed checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskCheckpointStats {
    /// The task's index in the job's plan.
    pub task: usize,
    /// The task's name (its operators, subtask).
    pub name: String,
    /// From the trigger until the coordinator heard the part was durable.
    pub acknowledged_ms: f64,
    /// From the trigger until the task saw the first barrier.
    pub start_delay_ms: f64,
    /// Its barrier alignment.
    pub alignment_ms: f64,
    /// Its synchronous part.
    pub sync_ms: f64,
    /// Its asynchronous part.
    pub async_ms: f64,
    /// Bytes of its state.
    pub state_bytes: u64,
    /// Bytes of state it wrote.
    pub written_bytes: u64,
    /// Bytes of in-flight data it wrote.
    pub inflight_bytes: u64,
}

/// One task's part in a checkpoint that resumed a failed one.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PartReuse {
    /// The task's index in the job's plan.
    pub task: usize,
    /// The task's name.
    pub name: String,
    /// Its part is the one it completed for the failed checkpoint (nothing it depends on
    /// changed since), not written again.
    pub reused: bool,
    /// Why not, when it was written again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why_not: Option<String>,
}

// Their fields are closures, shared internals or whole state: a name says enough.
crate::debug_as_name!([] JobMetrics);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_histograms_add_up() {
        let m = JobMetrics::default();
        let a = m.source_counter();
        let b = m.source_counter();
        a.add(3);
        b.add(4);
        assert_eq!(m.source_records(), 7);
        let mut h = new_latency_histogram();
        h.record(1000).unwrap();
        m.merge_latency(&h);
        m.merge_latency(&h);
        assert_eq!(m.latency().unwrap().len(), 2);
    }

    /// A long-running job's checkpoint history stays bounded: the newest `HISTORY_KEPT`
    /// statistics, per-task details for the newest `TASK_STATS_KEPT`, and the count of all.
    #[test]
    fn the_checkpoint_history_keeps_the_newest() {
        let mut h = CheckpointHistory::default();
        for id in 1..=HISTORY_KEPT as u64 + 100 {
            let task = TaskCheckpointStats { task: 0, ..Default::default() };
            h.push(CheckpointStats { id, tasks: vec![task], ..Default::default() });
        }
        let kept = h.stats();
        assert_eq!((h.completed(), kept.len()), (HISTORY_KEPT as u64 + 100, HISTORY_KEPT));
        assert_eq!((kept[0].id, kept[kept.len() - 1].id), (101, HISTORY_KEPT as u64 + 100));
        let with_tasks = kept.iter().filter(|s| !s.tasks.is_empty()).count();
        assert_eq!(with_tasks, TASK_STATS_KEPT);
        assert!(kept[kept.len() - TASK_STATS_KEPT..].iter().all(|s| !s.tasks.is_empty()), "the newest keep theirs");
    }

    #[test]
    fn formats() {
        assert_eq!(group_digits(1234567), "1,234,567");
        assert_eq!(group_digits(12), "12");
        assert_eq!(format_ns(20_500), "20.5 µs");
    }
}

/// [`CheckpointStats::mode`] as JSON: the fields the dashboard and `_metadata` of earlier
/// versions read (`alignment`: the mode's name, or `savepoint` for none; its timeout in
/// milliseconds; its in-flight budget).
mod mode_fields {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::snapshot::{CheckpointMode, ModeKind};

    #[derive(Serialize, Deserialize, Default)]
    struct Fields {
        #[serde(default)]
        alignment: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        alignment_timeout_ms: Option<f64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        inflight_budget: Option<u64>,
    }

    pub(super) fn serialize<S: Serializer>(mode: &Option<CheckpointMode>, s: S) -> Result<S::Ok, S::Error> {
        Fields {
            alignment: mode.map_or("savepoint", |m| m.kind().name()).to_string(),
            alignment_timeout_ms: mode.and_then(CheckpointMode::alignment_timeout).map(|t| t.as_nanos() as f64 / 1e6),
            inflight_budget: mode.and_then(CheckpointMode::inflight_budget),
        }
        .serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<CheckpointMode>, D::Error> {
        let f = Fields::deserialize(d)?;
        if f.alignment == "savepoint" || f.alignment.is_empty() {
            return Ok(None);
        }
        let kind: ModeKind = f.alignment.parse().map_err(serde::de::Error::custom)?;
        let timeout = Duration::from_nanos((f.alignment_timeout_ms.unwrap_or(0.0) * 1e6).round() as u64);
        Ok(Some(kind.with(timeout, f.inflight_budget.unwrap_or(0))))
    }
}
