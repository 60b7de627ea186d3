//! The benchmark matrix, in one run so its ratios are comparable: every `weir bench` workload
//! under every checkpoint mode at full speed (throughput; each mode against the run without
//! checkpoints in the same round, median over rounds), the keyed and window workloads at a
//! fixed rate with and without checkpoints (latency), the backlog workload (a skewed key
//! makes one subtask of a slow keyed stage lag) as the rings grow 16× and the stage's cost
//! per record 10× (duration, start delay, alignment and in-flight bytes of aligned, unaligned,
//! aligned-with-timeout and adaptive checkpoints, with the spread over rounds, on log axes),
//! the mixed workload (adaptive alignment against unaligned where most in-flight bytes sit in
//! channels that move), and the keyed workload with skewed keys (Zipf 1.0 and 1.5) against
//! uniform ones.
//!
//! Writes `perf/results/<date>/matrix.md` (the report, headline first), `matrix.json` (every
//! run, as `weir bench --json` writes it) and four SVG plots beside them.
//!
//! `cargo bench --bench matrix -- [--duration-s S] [--rounds N] [--out DIR] [--only backlog|skew]`

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

mod common;
mod plot;

use plot::{Point, Series, Stamp};

use std::path::PathBuf;
use std::time::Duration;

use weir::checkpoint::{CheckpointConfig, CheckpointMode, ModeKeys, ModeKind};
use weir::metrics::{format_ns, group_digits};
use weir::RunConfig;
use weir_jobs::bench::{BenchConfig, BenchResult, Workload};

/// The modes of the matrix's headline (throughput without backpressure): none, aligned,
/// unaligned, at-least-once.
const HEADLINE: [Option<ModeKind>; 4] =
    [None, Some(ModeKind::Aligned), Some(ModeKind::Unaligned), Some(ModeKind::AtLeastOnce)];

/// A mode's name, or `none`.
fn named(c: Option<ModeKind>) -> &'static str {
    c.map_or("none", ModeKind::name)
}

struct Matrix {
    duration: Duration,
    scratch: tempfile::TempDir,
    runs: Vec<BenchResult>,
    count: usize,
    /// The in-flight budget of adaptive runs.
    budget: u64,
    /// Rounds of each section (the backlog sections run at most 3).
    rounds: usize,
    /// The keyed workload's key skew (Zipf's exponent; `None`: uniform).
    zipf: Option<f64>,
    /// The report so far.
    md: String,
    out: PathBuf,
    stamp: Stamp,
}

/// Section 1's figures, per workload: each mode's median throughput and its spread, the
/// samples of its ratio to no checkpoints, and its checkpoints' share of each run.
struct Headline {
    throughput: Vec<Vec<f64>>,
    throughput_points: Vec<Vec<Point>>,
    ratios: Vec<Vec<Vec<f64>>>,
    busy: Vec<Vec<Vec<f64>>>,
}

/// The ring capacities of the backlog section.
const BACKLOG_RINGS: [usize; 3] = [256, 1024, 4096];

impl Matrix {
    fn run(
        &mut self,
        workload: Workload,
        checkpoint: Option<ModeKind>,
        rate: Option<f64>,
        ring: usize,
        interval_ms: u64,
        stage_cost_ns: u64,
    ) -> BenchResult {
        self.count += 1;
        let dir = self.scratch.path().join(format!("run-{}", self.count));
        let keys = |k| ModeKeys::word(k, weir::checkpoint::DEFAULT_ALIGNMENT_TIMEOUT, self.budget);
        let config = BenchConfig {
            workload,
            checkpoint: checkpoint.map(|k| {
                let mode = CheckpointMode::from_flat(keys(k)).expect("a budget above zero");
                CheckpointConfig::new(&dir).interval(Duration::from_millis(interval_ms)).mode(mode)
            }),
            parallelism: 2,
            rate,
            keys: 10_000,
            zipf: self.zipf,
            sink_cost_ns: stage_cost_ns,
        };
        let job = config.job().expect("a valid benchmark");
        let report =
            common::run_for(job, RunConfig::default().pin_workers(true).workers(2).ring_capacity(ring), self.duration);
        let _ = std::fs::remove_dir_all(&dir);
        let result = BenchResult::new(&config, &report);
        eprintln!(
            "{:>12} {:>15} {:>6} ring {:>5} cost {:>6}: {:>15} rec/s, {} checkpoints",
            workload.to_string(),
            named(checkpoint),
            rate.map_or("max".into(), short_rate),
            ring,
            format_ns(stage_cost_ns),
            group_digits(result.throughput_rps as u64),
            result.checkpoints.len()
        );
        self.runs.push(result.clone());
        result
    }

    /// Section 1's runs: per workload, each mode's throughput (median over rounds), its
    /// spread for the plot, its ratios to the run without checkpoints, and its checkpoints'
    /// share of the run.
    fn headline_runs(&mut self, workloads: &[Workload]) -> Headline {
        let rounds = self.rounds;
        let mut throughput: Vec<Vec<f64>> = Vec::new();
        // Per workload and mode: the median and spread over rounds, for the plot.
        let mut throughput_points: Vec<Vec<Point>> = Vec::new();
        let mut ratios: Vec<Vec<Vec<f64>>> = Vec::new();
        let mut busy: Vec<Vec<Vec<f64>>> = Vec::new();
        for &w in workloads {
            let mut runs = vec![Vec::new(); 4];
            let mut samples = vec![Vec::new(); 4];
            let mut busy_samples = vec![Vec::new(); 4];
            for round in 0..rounds {
                let mut this = [0f64; 4];
                for k in 0..4 {
                    let i = (round + k) % 4;
                    let r = self.run(w, HEADLINE[i], None, 4096, 1000, SINK_COST_NS);
                    this[i] = r.throughput_rps;
                    busy_samples[i].push(checkpoint_share(&r));
                }
                for i in 0..4 {
                    runs[i].push(this[i]);
                    samples[i].push(this[i] / this[0]);
                }
            }
            throughput_points.push(runs.iter().map(|r| Point::of(r)).collect());
            throughput.push(runs.into_iter().map(median).collect());
            ratios.push(samples);
            busy.push(busy_samples);
        }
        Headline { throughput, throughput_points, ratios, busy }
    }

    /// Section 2b, skew: the keyed workload with Zipf-distributed keys (s = 1.0 and 1.5)
    /// against uniform keys, without checkpoints and with aligned ones, alternating in each
    /// round (a different skew first each round); the median over rounds and each skew's
    /// ratio to uniform keys in the same round.
    fn skew(&mut self) {
        const SKEWS: [Option<f64>; 3] = [None, Some(1.0), Some(1.5)];
        self.md += "## Skew: the keyed workload with Zipf-distributed keys against uniform keys

| checkpoints | uniform (median) | Zipf 1.0 | Zipf 1.5 |\n|---|---|---|---|\n";
        for checkpoint in [None, Some(ModeKind::Aligned)] {
            let mut throughput = vec![Vec::new(); 3];
            let mut ratios = vec![Vec::new(); 3];
            for round in 0..self.rounds {
                let mut this = [0f64; 3];
                for k in 0..3 {
                    let i = (round + k) % 3;
                    self.zipf = SKEWS[i];
                    this[i] = self.run(Workload::Keyed, checkpoint, None, 4096, 1000, SINK_COST_NS).throughput_rps;
                }
                for i in 0..3 {
                    throughput[i].push(this[i]);
                    ratios[i].push(this[i] / this[0]);
                }
            }
            self.zipf = None;
            let cell = |i: usize| {
                format!(
                    "{} rec/s ({:.3} of uniform)",
                    group_digits(median(throughput[i].clone()) as u64),
                    median(ratios[i].clone())
                )
            };
            self.md += &format!(
                "| {} | {} rec/s | {} | {} |\n",
                named(checkpoint),
                group_digits(median(throughput[0].clone()) as u64),
                cell(1),
                cell(2)
            );
        }
        self.md += &format!("\nEach ratio is the median over {} rounds of the skewed run divided by the uniform run of the same round. Zipf's keys are ranks over the same 10,000 keys, hashed to subtasks: at s = 1.5 the hottest key takes about 38% of the records.\n\n", self.rounds);
    }

    /// Section 1, throughput: every workload under every checkpoint mode, as fast as possible. A
    /// round runs the four modes back to back (starting with a different one each round), and
    /// each mode's ratio to the run without checkpoints of the same round is one sample: runs
    /// close in time share the machine's mood, which drifts by more than 3% over minutes.
    /// Returns each workload's throughput per mode.
    fn headline(&mut self) -> Vec<Vec<f64>> {
        let workloads =
            [Workload::Stateless, Workload::Keyed, Workload::Window, Workload::Join, Workload::SparseWindow];
        let Headline { throughput, throughput_points, ratios, busy } = self.headline_runs(&workloads);
        let rounds = self.rounds;
        self.md += "## Headline: throughput with checkpoints every second, relative to none

| workload | none (median) | aligned | unaligned | at-least-once |\n|---|---|---|---|---|\n";
        let cell = |r: &Vec<f64>| {
            let lo = r.iter().copied().fold(f64::MAX, f64::min);
            let hi = r.iter().copied().fold(0f64, f64::max);
            format!("{:.3} ({lo:.3}–{hi:.3})", median(r.clone()))
        };
        for ((w, t), r) in workloads.iter().zip(&throughput).zip(&ratios) {
            self.md += &format!(
                "| {w} | {} rec/s | {} | {} | {} |\n",
                group_digits(t[0] as u64),
                cell(&r[1]),
                cell(&r[2]),
                cell(&r[3])
            );
        }
        self.md += &format!("\nTarget: every ratio at least 0.97 (checkpoints cost at most 3% without backpressure). Each ratio is the median over {rounds} rounds of the mode's run divided by the run without checkpoints in the same round (the four modes back to back, a different one first each round), with the smallest and largest of the {rounds} in brackets.\n\n![throughput](throughput.svg)\n\n");
        self.md += "### What the checkpoints took, from their own statistics\n\nPer second of run, the time checkpoints held a task: synchronous part + asynchronous write (on its own thread; it includes fsync waits, so it overstates CPU) + barrier alignment, of the task where each was longest, summed over the run's checkpoints (median over the rounds). Unlike the ratios above it does not move with the machine; a job's loss is at most this share times the tasks per worker (one for stateless, all chained; two for keyed and window, the source chain and the keyed one; three for the join).\n\n| workload | aligned | unaligned | at-least-once |\n|---|---|---|---|\n";
        for (w, b) in workloads.iter().zip(&busy) {
            self.md += &format!(
                "| {w} | {:.2}% | {:.2}% | {:.2}% |\n",
                median(b[1].clone()) * 100.0,
                median(b[2].clone()) * 100.0,
                median(b[3].clone()) * 100.0
            );
        }
        self.md += "\n";
        let categories: Vec<String> = workloads.iter().map(|w| w.to_string()).collect();
        let series: Vec<Series> = HEADLINE
            .iter()
            .enumerate()
            .map(|(i, c)| Series {
                name: named(*c).to_string(),
                points: throughput_points.iter().map(|t| t[i].scaled(1e-6)).collect(),
            })
            .collect();
        plot::grouped_bars(
            &self.out.join("throughput.svg"),
            "Throughput by checkpoint mode (median over rounds, bars: lowest and highest)",
            "million records/s",
            &categories,
            &series,
            &self.stamp,
        )
        .expect("plot");
        throughput
    }

    /// Section 2, latency at half of each workload's speed without checkpoints (`throughput`), and the
    /// keyed one at W5's rates (1 M and 10 k records/s: a run is handed on when its producer has
    /// nothing more, so a slow stream waits for no batch to fill).
    fn latency(&mut self, throughput: &[Vec<f64>]) {
        self.md += "## Latency at a fixed rate (half the speed without checkpoints; keyed also at 1 M and 10 k records/s)\n\n| workload | checkpoints | rate | p50 | p90 | p99 | p99.9 | max |\n|---|---|---|---|---|---|---|---|\n";
        let mut latency_series: Vec<Series> = Vec::new();
        let mut latency_categories = Vec::new();
        let rates = [
            (Workload::Keyed, throughput[1][0] / 2.0),
            (Workload::Keyed, 1e6),
            (Workload::Keyed, 1e4),
            (Workload::Window, throughput[2][0] / 2.0),
        ];
        for (w, rate) in rates {
            for c in [None, Some(ModeKind::Aligned), Some(ModeKind::Unaligned)] {
                let r = self.run(w, c, Some(rate), 4096, 1000, SINK_COST_NS);
                let c = named(c);
                let Some(l) = r.latency_ns.clone() else { continue };
                self.md += &format!(
                    "| {w} | {c} | {} rec/s | {} | {} | {} | {} | {} |\n",
                    group_digits(rate as u64),
                    format_ns(l.p50),
                    format_ns(l.p90),
                    format_ns(l.p99),
                    format_ns(l.p999),
                    format_ns(l.max)
                );
                latency_categories.push(format!("{w} {} {c}", short_rate(rate)));
                for (i, (name, v)) in [("p50", l.p50), ("p99", l.p99), ("p99.9", l.p999)].into_iter().enumerate() {
                    if latency_series.len() <= i {
                        latency_series.push(Series { name: name.to_string(), points: Vec::new() });
                    }
                    latency_series[i].points.push(Point::of(&[v as f64 / 1e3]));
                }
            }
        }
        self.md += "\n![latency](latency.svg)\n\n";
        plot::grouped_bars(
            &self.out.join("latency.svg"),
            "Latency percentiles, with and without checkpoints",
            "µs",
            &latency_categories,
            &latency_series,
            &self.stamp,
        )
        .expect("plot");
    }

    /// Section 3, aligned against unaligned under a real backlog, as the rings and the lag grow: the
    /// table, and each mode's median duration and in-flight bytes by ring for the plots.
    fn backlog(&mut self) -> (Vec<Series>, Vec<Series>) {
        let backlog_rounds = self.rounds.min(3);
        self.md += &format!(
            "## Aligned against unaligned under a backlog\n\nThe `backlog` workload: generator → key_by (half the events on one key) → a keyed running sum spending the given cost per record → rebalance → sink, checkpoints every 500 ms, aligned-timeout with a {} ms timeout, adaptive with an in-flight budget of half what the rings hold ({BACKLOG_BUDGET_PER_SLOT} bytes per ring slot: the job's 8 channels of 32-byte entries). Each figure is the median over every checkpoint of {backlog_rounds} rounds (modes back to back, a different one first each round); the spread is the smallest and largest median of one round.\n\n| stage cost | ring | mode | checkpoints | median duration (spread) | max duration | start delay | alignment | in-flight bytes | throughput (rec/s) |\n|---|---|---|---|---|---|---|---|---|---|\n",
            weir::checkpoint::DEFAULT_ALIGNMENT_TIMEOUT.as_millis(),
        );
        let rings = BACKLOG_RINGS;
        let costs = [10_000u64, 100_000];
        let modes = [ModeKind::Aligned, ModeKind::Unaligned, ModeKind::AlignedTimeout, ModeKind::Adaptive];
        let mut durations: Vec<Series> = Vec::new();
        let mut inflight: Vec<Series> = Vec::new();
        // Median duration and in-flight bytes per (cost, mode, ring), for the ratios under the table.
        let mut medians = std::collections::HashMap::new();
        let mut median_bytes = std::collections::HashMap::new();
        for cost in costs {
            let mut line = vec![Vec::new(); modes.len()];
            let mut bytes_line = vec![Vec::new(); modes.len()];
            for ring in rings {
                self.budget = ring as u64 * BACKLOG_BUDGET_PER_SLOT;
                let mut runs: Vec<Vec<BenchResult>> = vec![Vec::new(); modes.len()];
                for round in 0..backlog_rounds {
                    for k in 0..modes.len() {
                        let i = (round + k) % modes.len();
                        runs[i].push(self.run(Workload::Backlog, Some(modes[i]), None, ring, 500, cost));
                    }
                }
                for (i, mode) in modes.iter().enumerate() {
                    let all = || runs[i].iter().flat_map(|r| r.checkpoints.iter());
                    let of = |f: &dyn Fn(&weir::checkpoint::CheckpointStats) -> f64| median(all().map(f).collect());
                    let per_round: Vec<f64> =
                        runs[i].iter().map(|r| median(r.checkpoints.iter().map(|c| c.duration_ms).collect())).collect();
                    let duration = of(&|c| c.duration_ms);
                    let bytes = of(&|c| c.inflight_bytes as f64);
                    self.md += &format!(
                        "| {} | {ring} | {mode} | {} | {duration:.1} ms ({:.1}–{:.1}) | {:.1} ms | {:.2} ms | {:.1} ms | {} | {} |\n",
                        format_ns(cost),
                        all().count(),
                        per_round.iter().cloned().fold(f64::INFINITY, f64::min),
                        per_round.iter().cloned().fold(0.0, f64::max),
                        all().map(|c| c.duration_ms).fold(0.0, f64::max),
                        of(&|c| c.start_delay_ms),
                        of(&|c| c.alignment_ms),
                        group_digits(bytes as u64),
                        group_digits(median(runs[i].iter().map(|r| r.throughput_rps).collect()) as u64),
                    );
                    let bytes_per_round: Vec<f64> = runs[i]
                        .iter()
                        .map(|r| median(r.checkpoints.iter().map(|c| c.inflight_bytes as f64).collect()))
                        .collect();
                    line[i].push(Point { median: duration, ..Point::of(&per_round) });
                    bytes_line[i].push(Point { median: bytes, ..Point::of(&bytes_per_round) });
                    medians.insert((cost, i, ring), duration);
                    median_bytes.insert((cost, i, ring), bytes);
                }
            }
            for (i, mode) in modes.iter().enumerate() {
                durations.push(Series { name: format!("{mode}, {}", format_ns(cost)), points: line[i].clone() });
                if *mode != ModeKind::Aligned {
                    inflight
                        .push(Series { name: format!("{mode}, {}", format_ns(cost)), points: bytes_line[i].clone() });
                }
            }
        }
        let (big_cost, big_ring, small_ring) = (costs[costs.len() - 1], rings[rings.len() - 1], rings[0]);
        self.md += &format!(
            "\nAt the largest backlog ({} per record, ring {big_ring}): unaligned / aligned median duration {:.4} (target at most 0.01); unaligned at ring {big_ring} / ring {small_ring}: {:.2} (target within 2); aligned-timeout / aligned {:.3}; adaptive / unaligned duration {:.2}, in-flight bytes {:.2} (here the in-flight bytes sit in the lagging subtask's channels, which drain slowly: a budget below them costs alignment time in proportion; see the mixed workload below for where adaptive alignment pays).\n\n![checkpoint duration under a backlog](backlog-duration.svg)\n\n![in-flight bytes](inflight.svg)\n",
            format_ns(big_cost),
            medians[&(big_cost, 1, big_ring)] / medians[&(big_cost, 0, big_ring)],
            medians[&(big_cost, 1, big_ring)] / medians[&(big_cost, 1, small_ring)],
            medians[&(big_cost, 2, big_ring)] / medians[&(big_cost, 0, big_ring)],
            medians[&(big_cost, 3, big_ring)] / medians[&(big_cost, 1, big_ring)],
            median_bytes[&(big_cost, 3, big_ring)] / median_bytes[&(big_cost, 1, big_ring)].max(1.0),
        );
        (durations, inflight)
    }

    /// Section 4, adaptive alignment where most in-flight bytes sit in channels that move.
    fn mixed(&mut self) {
        let backlog_rounds = self.rounds.min(3);
        self.md += &format!(
            "\n## Adaptive alignment: a lagging pipeline beside a moving one\n\nThe `mixed` workload: the backlog workload's pipeline (100 µs per record) and, in the same job, generator → rebalance → 1 µs per 1 KiB event → sink, whose rings are full but drain in milliseconds; ring 4096, checkpoints every 500 ms, adaptive with a {} byte budget; median over every checkpoint of {backlog_rounds} rounds.\n\n| mode | checkpoints | median duration (spread) | max duration | in-flight bytes | channels aligned / captured | throughput (rec/s) |\n|---|---|---|---|---|---|---|\n",
            group_digits(weir::checkpoint::DEFAULT_INFLIGHT_BUDGET),
        );
        self.budget = weir::checkpoint::DEFAULT_INFLIGHT_BUDGET;
        let mixed_modes = [ModeKind::Unaligned, ModeKind::Adaptive, ModeKind::Aligned];
        let mut mixed: Vec<Vec<BenchResult>> = vec![Vec::new(); mixed_modes.len()];
        for round in 0..backlog_rounds {
            for k in 0..mixed_modes.len() {
                let i = (round + k) % mixed_modes.len();
                mixed[i].push(self.run(Workload::Mixed, Some(mixed_modes[i]), None, 4096, 500, 100_000));
            }
        }
        let mut mixed_medians = Vec::new();
        for (i, mode) in mixed_modes.iter().enumerate() {
            let all = || mixed[i].iter().flat_map(|r| r.checkpoints.iter());
            let per_round: Vec<f64> =
                mixed[i].iter().map(|r| median(r.checkpoints.iter().map(|c| c.duration_ms).collect())).collect();
            let duration = median(all().map(|c| c.duration_ms).collect());
            let bytes = median(all().map(|c| c.inflight_bytes as f64).collect());
            let (aligned, captured) =
                all().flat_map(|c| c.channels.iter()).fold(
                    (0, 0),
                    |(a, b), c| {
                        if c.aligned {
                            (a + 1, b)
                        } else {
                            (a, b + 1)
                        }
                    },
                );
            self.md += &format!(
                "| {mode} | {} | {duration:.1} ms ({:.1}–{:.1}) | {:.1} ms | {} | {} | {} |\n",
                all().count(),
                per_round.iter().cloned().fold(f64::INFINITY, f64::min),
                per_round.iter().cloned().fold(0.0, f64::max),
                all().map(|c| c.duration_ms).fold(0.0, f64::max),
                group_digits(bytes as u64),
                if *mode == ModeKind::Adaptive { format!("{aligned} / {captured}") } else { "–".into() },
                group_digits(median(mixed[i].iter().map(|r| r.throughput_rps).collect()) as u64),
            );
            mixed_medians.push((duration, bytes));
        }
        self.md += &format!(
            "\nAdaptive / unaligned: median duration {:.2} (target within 2), in-flight bytes {:.3} (target at most 0.1).\n",
            mixed_medians[1].0 / mixed_medians[0].0,
            mixed_medians[1].1 / mixed_medians[0].1.max(1.0),
        );
    }

    /// Section 3's plots: duration and in-flight bytes by ring capacity.
    fn backlog_plots(&self, durations: &[Series], inflight: &[Series]) {
        let ring_labels: Vec<String> = BACKLOG_RINGS.iter().map(|r| r.to_string()).collect();
        plot::log_lines(
            &self.out.join("backlog-duration.svg"),
            "Checkpoint duration under a backlog (median, bars: lowest and highest round)",
            "ring capacity (entries)",
            "median duration, ms",
            &ring_labels,
            durations,
            &self.stamp,
        )
        .expect("plot");
        plot::log_lines(
            &self.out.join("inflight.svg"),
            "In-flight bytes per checkpoint (median, bars: lowest and highest round)",
            "ring capacity (entries)",
            "median bytes",
            &ring_labels,
            inflight,
            &self.stamp,
        )
        .expect("plot");
    }
}

/// The backlog section's in-flight budget per ring slot: half of what its 8 channels of 32-byte
/// entries hold.
const BACKLOG_BUDGET_PER_SLOT: u64 = 8 * 32 / 2;

/// What the backpressure workload's sink spends per record in the throughput and latency
/// sections (none of them backpressures with it).
const SINK_COST_NS: u64 = 2_000;

fn short_rate(r: f64) -> String {
    if r >= 1e6 {
        format!("{:.0}M", r / 1e6)
    } else {
        format!("{:.0}k", r / 1e3)
    }
}

/// The share of a run's time its checkpoints held the task where each took longest: synchronous
/// part, asynchronous write and alignment, summed over its checkpoints.
fn checkpoint_share(r: &BenchResult) -> f64 {
    let held: f64 = r.checkpoints.iter().map(|c| c.sync_ms + c.async_ms + c.alignment_ms).sum();
    held / (r.duration_s * 1000.0).max(1e-9)
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let secs: f64 = arg("--duration-s").and_then(|s| s.parse().ok()).unwrap_or(4.0);
    let date = common::today();
    let out = PathBuf::from(arg("--out").unwrap_or_else(|| format!("perf/results/{date}")));
    std::fs::create_dir_all(&out).expect("results folder");
    let rounds: usize = arg("--rounds").and_then(|s| s.parse().ok()).unwrap_or(5).max(1);
    let mut m = Matrix {
        duration: Duration::from_secs_f64(secs),
        scratch: tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("scratch folder"),
        runs: Vec::new(),
        count: 0,
        budget: weir::checkpoint::DEFAULT_INFLIGHT_BUDGET,
        zipf: None,
        rounds,
        md: format!("# Benchmark matrix, {date}\n\n`cargo bench --bench matrix -- --duration-s {secs} --rounds {rounds}`: 2 workers, parallelism 2, 10,000 keys, checkpoints every second unless said otherwise, {secs} s per run, all in one run.\n\n"),
        stamp: Stamp::here(&date),
        out,
    };
    // `--only backlog` runs sections 3 and 4 alone, `--only skew` the skew section alone.
    let only = arg("--only");
    if only.is_none() {
        let throughput = m.headline();
        m.latency(&throughput);
    }
    if only.as_deref() != Some("backlog") {
        m.skew();
    }
    if only.as_deref() != Some("skew") {
        let (durations, inflight) = m.backlog();
        m.mixed();
        m.backlog_plots(&durations, &inflight);
    }
    let json = serde_json::to_string_pretty(&m.runs).expect("plain data");
    std::fs::write(m.out.join("matrix.json"), json).expect("json");
    std::fs::write(m.out.join("matrix.md"), &m.md).expect("report");
    print!("{}", m.md);
    println!(
        "\nwritten: {}/matrix.md, matrix.json, throughput.svg, latency.svg, backlog-duration.svg, inflight.svg",
        m.out.display()
    );
}
