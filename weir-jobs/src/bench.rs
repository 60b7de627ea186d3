//! The benchmark workloads `weir bench` runs and the perf/ harness drives, and the JSON they
//! report: one place, so that a figure in perf/ is what a user gets from the command.
//!
//! Every workload's events carry their creation time (job clock); a latency probe before the
//! sink records, for every record, the time since the event was created (for windows and
//! joins, since the window's end: the moment the result could first be known).
//!
//! May touch: `wordcount` (the default job), `zipf` (skewed keys); weir's `checkpoint` (configuration), `error`,
//! `metrics`, `operator`, `pipeline`, `runtime`, `sink`, `source`.

use std::time::Duration;

use serde::Serialize;

use crate::wordcount::{key_of, DefaultJob};
use weir::checkpoint::{CheckpointConfig, CheckpointStats};
use weir::error::{Error, Result};
use weir::metrics::JobReport;
use weir::operator::window::Window;
use weir::pipeline::Job;
use weir::sink::Sink;
use weir::source::Generator;

/// What a benchmark runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// generator → map → filter → sink, chained.
    Stateless,
    /// generator → key_by → running sum per key → sink.
    Keyed,
    /// generator → watermarks → key_by → 10 ms tumbling window count → sink (the default job).
    Window,
    /// two generators → watermarks → keyed 10 ms tumbling window join → sink.
    Join,
    /// generator → rebalance → a sink spending a fixed time per record: the rings fill up.
    Backpressure,
    /// Windows that open for every few events (Flink's peer workload W3): key `i % 1000`,
    /// event time `i` ms, watermarks with no out-of-orderness, 1 s tumbling event-time window
    /// count, so every (key, window) pair gets exactly one event.
    SparseWindow,
    /// A backlog that lags on one subtask: generator → key_by (half the events on one hot
    /// key) → a keyed running sum spending a fixed time per record → rebalance → sink. The
    /// hot key's subtask falls behind, its rings stay full, and the sink aligns two inputs of
    /// which one lags.
    Backlog,
    /// Two pipelines in one job, one lagging and one moving: the backlog workload's, and
    /// generator → rebalance → a stage spending 1 µs per 1 KiB event → sink, whose rings are
    /// full but drain in milliseconds. Most in-flight bytes sit in the moving pipeline, where
    /// adaptive alignment aligns instead of storing them.
    Mixed,
}

impl Workload {
    /// Every workload, in the order reports list them.
    pub const ALL: [Workload; 8] = [
        Workload::Stateless,
        Workload::Keyed,
        Workload::Window,
        Workload::Join,
        Workload::Backpressure,
        Workload::SparseWindow,
        Workload::Backlog,
        Workload::Mixed,
    ];
}

impl std::str::FromStr for Workload {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        weir::error::one_of(&Workload::ALL, s, "a workload")
    }
}

impl std::fmt::Display for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Workload::Stateless => "stateless",
            Workload::Keyed => "keyed",
            Workload::Window => "window",
            Workload::Join => "join",
            Workload::Backpressure => "backpressure",
            Workload::SparseWindow => "sparse-window",
            Workload::Backlog => "backlog",
            Workload::Mixed => "mixed",
        })
    }
}

/// One benchmark's settings.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// What runs.
    pub workload: Workload,
    /// Its checkpoints (`None`: none), built once by whoever runs it: the command from its
    /// flags, perf/ and the tests from a mode.
    pub checkpoint: Option<CheckpointConfig>,
    /// Parallelism of every operator.
    pub parallelism: usize,
    /// Events per second in all; `None` runs as fast as possible.
    pub rate: Option<f64>,
    /// Distinct keys (the size of keyed state).
    pub keys: u64,
    /// How keys are drawn: uniformly (`None`), or with Zipf's law of this exponent (a few hot
    /// keys, a long tail), for the workloads whose events draw keys (stateless, keyed, join,
    /// backpressure; [`BenchConfig::draws_keys`]).
    pub zipf: Option<f64>,
    /// Nanoseconds the slow stage spends per record: the sink's in `backpressure`, the keyed
    /// stage's in `backlog`.
    pub sink_cost_ns: u64,
}

/// A benchmark event: a key, a value, and when it was created (job clock, ns).
#[derive(Clone, Copy, Debug, PartialEq, Eq, weir::Persist)]
pub struct BenchEvent {
    /// The key, in `0 .. keys`.
    pub key: u64,
    /// A value to compute with.
    pub value: u64,
    /// Creation time on the job clock, in nanoseconds (the event time too).
    pub created_ns: u64,
}

/// The payload of a `mixed` workload's bulky event.
const BULK_PAYLOAD_BYTES: usize = 1024;

/// The `mixed` workload's bulky event: a value, its creation time, and a payload.
#[derive(Clone, Debug, PartialEq, Eq, weir::Persist)]
pub struct BulkEvent {
    /// A value to compute with.
    pub value: u64,
    /// Creation time on the job clock, in nanoseconds.
    pub created_ns: u64,
    /// `BULK_PAYLOAD_BYTES` bytes.
    pub payload: Vec<u8>,
}

/// A sink that spends `cost_ns` per record (spinning: a stand-in for a slow external system).
struct SlowSink {
    cost: Duration,
}

impl<T> Sink<T> for SlowSink {
    fn write(&mut self, records: &mut Vec<T>) -> Result<()> {
        for _ in records.drain(..) {
            spin(self.cost);
        }
        Ok(())
    }
}

/// `g`, limited to `rate` events per second in all if given.
fn paced<F>(g: Generator<F>, rate: Option<f64>) -> Generator<F> {
    match rate {
        Some(r) => g.rate(r),
        None => g,
    }
}

/// Spends `cost` on this core (a stand-in for work or a slow external system).
fn spin(cost: Duration) {
    let start = std::time::Instant::now();
    while start.elapsed() < cost {
        std::hint::spin_loop();
    }
}

impl BenchConfig {
    fn generator(&self, rate: Option<f64>, salt: u64) -> Generator<impl Fn(u64, u64) -> BenchEvent + Clone> {
        let keys = self.keys.max(1);
        // Rank 1 the hottest key; the state hashes keys, so neighbours in rank share no page.
        let zipf = self.zipf.filter(|s| *s > 0.0).map(|s| crate::zipf::Zipf::new(keys, s));
        let key = move |i: u64| match &zipf {
            Some(z) => z.rank(i ^ salt) - 1,
            None => key_of(i ^ salt, keys),
        };
        let g = Generator::new(move |i, now_ns| BenchEvent { key: key(i), value: i, created_ns: now_ns });
        paced(g, rate)
    }

    /// Whether the workload's events draw their keys from `keys` (and `zipf`): the window,
    /// sparse-window, backlog and mixed workloads lay their keys out themselves.
    pub fn draws_keys(&self) -> bool {
        matches!(self.workload, Workload::Stateless | Workload::Keyed | Workload::Join | Workload::Backpressure)
    }

    /// The backlog workload's pipeline up to its slow stage: every other event on key 0, whose
    /// subtask gets three quarters of the work, into a keyed running sum spending
    /// `sink_cost_ns` per record.
    fn lagging_sum(&self, job: &Job) -> weir::Stream<BenchEvent> {
        let cost = Duration::from_nanos(self.sink_cost_ns);
        let keys = self.keys.max(1);
        let g = Generator::new(move |i, now_ns| BenchEvent {
            key: if i % 2 == 0 { 0 } else { key_of(i, keys) },
            value: i,
            created_ns: now_ns,
        });
        job.generator(paced(g, self.rate))
            .key_by(|e: &BenchEvent| e.key)
            .reduce(move |a, b| {
                spin(cost);
                BenchEvent { key: a.key, value: a.value.wrapping_add(b.value), created_ns: b.created_ns }
            })
            .named("slow-sum")
    }

    /// The job: the workload, with checkpoints as chosen.
    pub fn job(&self) -> Result<Job> {
        if self.parallelism == 0 || self.keys == 0 {
            return Err(Error::config("parallelism and keys must be at least 1"));
        }
        if let Some(s) = self.zipf {
            if !s.is_finite() || s < 0.0 {
                return Err(Error::config(format!("--zipf {s}: an exponent is a finite number, 0 or more")));
            }
            if !self.draws_keys() {
                return Err(Error::config(format!(
                    "--zipf is for the workloads that draw keys (stateless, keyed, join, backpressure), not {}",
                    self.workload
                )));
            }
        }
        let name = format!("bench-{}", self.workload);
        let job = match self.workload {
            Workload::Window => {
                DefaultJob { parallelism: self.parallelism, keys: self.keys, window_ms: 10, rate_per_s: self.rate }
                    .build()
            }
            _ => Job::new(name).with_parallelism(self.parallelism),
        };
        let created = |e: &BenchEvent| e.created_ns;
        match self.workload {
            Workload::Stateless => job
                .generator(self.generator(self.rate, 0))
                .map(|e| BenchEvent { value: e.value.wrapping_mul(0x9E37_79B9), ..e })
                .filter(|e| e.value & 7 != 7)
                .measure_latency(created)
                .discard(),
            Workload::Keyed => job
                .generator(self.generator(self.rate, 0))
                .key_by(|e: &BenchEvent| e.key)
                .reduce(|a, b| BenchEvent {
                    key: a.key,
                    value: a.value.wrapping_add(b.value),
                    created_ns: b.created_ns,
                })
                .named("sum")
                .measure_latency(created)
                .discard(),
            Workload::Window => {}
            Workload::Join => self.join(&job),
            Workload::Backpressure => {
                let cost = Duration::from_nanos(self.sink_cost_ns);
                job.generator(self.generator(self.rate, 0))
                    .rebalance()
                    .measure_latency(created)
                    .sink(move |_| Ok(SlowSink { cost }))
            }
            Workload::SparseWindow => self.sparse_window(&job),
            Workload::Backlog => self.lagging_sum(&job).rebalance().measure_latency(created).discard(),
            Workload::Mixed => self.mixed(&job),
        }
        let Some(config) = &self.checkpoint else { return Ok(job) };
        config.validate()?;
        Ok(job.with_checkpointing(config.clone()))
    }

    /// Two generators joined per key in 10 ms tumbling windows of event time.
    fn join(&self, job: &Job) {
        let created = |e: &BenchEvent| e.created_ns;
        let half = self.rate.map(|r| r / 2.0);
        let left = job.generator(self.generator(half, 0)).with_watermarks(created, 0);
        let right = job.generator(self.generator(half, 0x5555)).with_watermarks(created, 0);
        let window = Window::tumbling(10_000_000);
        left.window_join(
            right,
            |e: &BenchEvent| e.key,
            |e: &BenchEvent| e.key,
            created,
            created,
            window,
            |&k, l: &BenchEvent, r: &BenchEvent| BenchEvent {
                key: k,
                value: l.value ^ r.value,
                // The pair is known at the end of their window.
                created_ns: (l.created_ns.max(r.created_ns) / 10_000_000 + 1) * 10_000_000 - 1,
            },
        )
        .named("join")
        .measure_latency(created)
        .discard()
    }

    /// One event per key and window (Flink's W3): every window opens, fires and goes for one event.
    fn sparse_window(&self, job: &Job) {
        let created = |e: &BenchEvent| e.created_ns;
        // Event time is the index in ms; a result's latency counts from the creation
        // of the window's (only) event.
        let g = Generator::new(|i, now_ns| BenchEvent { key: i % 1000, value: i, created_ns: now_ns });
        let g = paced(g, self.rate);
        // The sources stay within 10 windows of each other in event time (Flink's
        // watermark alignment), so at most that many windows are open.
        job.generator(g)
            .with_aligned_watermarks(|e: &BenchEvent| e.value, 0, "sources", 10_000)
            .key_by(|e: &BenchEvent| e.key)
            .window(Window::tumbling(1_000), |e: &BenchEvent| e.value)
            .aggregate(
                || (0u64, 0u64),
                |(count, created): &mut (u64, u64), e: BenchEvent| {
                    *count += 1;
                    *created = (*created).max(e.created_ns);
                },
                |&key, _window, &(count, created_ns)| BenchEvent { key, value: count, created_ns },
            )
            .named("sparse-window-count")
            .measure_latency(created)
            .discard()
    }

    /// The lagging sum beside a stream of bulky events through a fast stage.
    fn mixed(&self, job: &Job) {
        let created = |e: &BenchEvent| e.created_ns;
        self.lagging_sum(job).discard();
        let bulky = Generator::new(|i, now_ns| BulkEvent {
            value: i,
            created_ns: now_ns,
            payload: vec![(i % 251) as u8; BULK_PAYLOAD_BYTES],
        });
        job.generator(paced(bulky, self.rate))
            .named("bulky-events")
            .rebalance()
            .map(|e: BulkEvent| {
                spin(Duration::from_micros(1));
                BenchEvent {
                    key: e.payload.iter().map(|&b| b as u64).sum::<u64>(),
                    value: e.value,
                    created_ns: e.created_ns,
                }
            })
            .named("fast-stage")
            .measure_latency(created)
            .discard()
    }
}

/// Latency percentiles, in nanoseconds.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct LatencySummary {
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Largest.
    pub max: u64,
}

/// The latency of the records attributed to one cause.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CauseLatency {
    /// The cause ([`weir::metrics::LatencyCause::key`]).
    pub cause: &'static str,
    /// Samples attributed to it.
    pub samples: u64,
    /// Their percentiles.
    pub latency: LatencySummary,
}

impl LatencySummary {
    /// The percentiles of `h`.
    pub fn of(h: &weir::metrics::Histogram<u64>) -> Self {
        LatencySummary {
            p50: h.value_at_quantile(0.5),
            p90: h.value_at_quantile(0.9),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
        }
    }
}

/// What `weir bench --json` writes.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct BenchResult {
    /// The workload.
    pub workload: String,
    /// How it checkpointed at first: a mode's name, or `none`.
    pub checkpoint: String,
    /// Parallelism of every operator.
    pub parallelism: usize,
    /// Worker threads.
    pub workers: usize,
    /// How long it ran.
    pub duration_s: f64,
    /// Events the sources emitted.
    pub records: u64,
    /// Events per second.
    pub throughput_rps: f64,
    /// Latency percentiles (absent when nothing reached the probe).
    pub latency_ns: Option<LatencySummary>,
    /// The same by what the job's tasks did for checkpoints while each record was in flight
    /// (`aligning`, `sync-fork`, `capture`, `nothing`; causes without samples left out).
    pub latency_by_cause_ns: Vec<CauseLatency>,
    /// Every completed checkpoint.
    pub checkpoints: Vec<CheckpointStats>,
    /// The target rate, if any.
    pub rate: Option<f64>,
    /// Distinct keys.
    pub keys: u64,
    /// Zipf's exponent of the key draws (`None`: uniform).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zipf: Option<f64>,
    /// The most memory the process's keyed and window state held at once (its pages).
    pub state_peak_bytes: u64,
    /// The process's peak resident memory (Linux' `VmHWM`), where the system says it.
    pub peak_rss_bytes: Option<u64>,
    /// With `--state-memory`: the budget and what its pages did (evictions, faults and their
    /// time, spill writes, the most bytes in memory at once).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_memory: Option<weir::metrics::StateMemoryStats>,
}

/// The process's peak resident memory (`VmHWM` in `/proc/self/status`), where it is known.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

impl BenchResult {
    /// The result of `config`'s run, from the job's report.
    pub fn new(config: &BenchConfig, report: &JobReport) -> Self {
        let latency_ns = report.latency_ns.as_ref().filter(|h| !h.is_empty()).map(LatencySummary::of);
        let latency_by_cause_ns = report
            .latency_by_cause
            .iter()
            .map(|(c, h)| CauseLatency { cause: c.key(), samples: h.len(), latency: LatencySummary::of(h) })
            .collect();
        BenchResult {
            workload: config.workload.to_string(),
            checkpoint: config.checkpoint.as_ref().map_or("none", |c| c.mode.kind().name()).to_string(),
            parallelism: config.parallelism,
            workers: report.workers,
            duration_s: report.elapsed.as_secs_f64(),
            records: report.source_records,
            throughput_rps: report.throughput_rps(),
            latency_ns,
            latency_by_cause_ns,
            checkpoints: report.checkpoints.clone(),
            rate: config.rate,
            keys: config.keys,
            zipf: config.zipf,
            state_peak_bytes: weir::state::state_memory_peak_bytes(),
            peak_rss_bytes: peak_rss_bytes(),
            state_memory: report.state_memory,
        }
    }

    /// Pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("plain data serializes")
    }
}
