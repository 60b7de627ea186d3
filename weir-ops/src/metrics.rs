//! A running job's metrics for Prometheus, through `prometheus-client`: counters of records,
//! restarts and checkpoints, gauges of the newest checkpoint's figures and the state's memory,
//! latency as histograms (fixed buckets, so they add up over subtasks and processes), in
//! base units (seconds, bytes), every series labelled `job_name` (a scrape sets `job` itself).
//! Read from the job's counters and statistics as they are when scraped ([`JobMetrics`] is a
//! collector): nothing on the record path.
//!
//! A program that keeps its own registry registers the job's collector in it
//! ([`register`]); the control endpoint serves [`render`]'s text, OpenMetrics 1.0 ([`CONTENT_TYPE`]).
//!
//! ```no_run
//! # fn program(handle: &weir::JobHandle) {
//! let mut registry = prometheus_client::registry::Registry::default();
//! weir_ops::metrics::register(&mut registry, handle.controller());
//! let mut text = String::new();
//! prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
//! # }
//! ```
//!
//! May touch: nothing else in the crate; the job's [`JobController`].

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use weir::metrics::Histogram;
use weir::JobController;

/// What `/metrics` answers a scraper that asks for OpenMetrics (Prometheus does) with.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What `/metrics` answers anyone else with (`curl`, `promtool check metrics`, `weir control
/// ADDR metrics`): Prometheus' text format 0.0.4 ([`to_text_format`]).
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The latency histograms' buckets, in seconds: 10 µs to 10 s.
pub const LATENCY_BUCKETS: [f64; 19] = [
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
    0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The metrics of one job, read when collected.
#[derive(Debug)]
pub struct JobMetrics {
    job: JobController,
}

/// Registers `job`'s metrics in `registry`.
pub fn register(registry: &mut Registry, job: JobController) {
    registry.register_collector(Box::new(JobMetrics { job }));
}

/// The metrics of `job`, as OpenMetrics text.
pub fn render(job: &JobController) -> String {
    let mut registry = Registry::default();
    register(&mut registry, job.clone());
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("writing into a String does not fail");
    text
}

/// OpenMetrics text as Prometheus' text format 0.0.4: a counter's help and type name its
/// samples' `_total` name (OpenMetrics names the family without it), and no `# UNIT` or
/// `# EOF` lines (units are in the names already).
pub fn to_text_format(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let lines: Vec<&str> = openmetrics.lines().collect();
    let mut counter = "";
    for (i, line) in lines.iter().enumerate() {
        if line.starts_with("# UNIT ") || *line == "# EOF" {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or("");
            let typed = lines.get(i + 1).and_then(|l| l.strip_prefix("# TYPE "));
            counter = if typed == Some(&format!("{name} counter")) { name } else { "" };
        }
        match line.strip_prefix("# HELP ").or_else(|| line.strip_prefix("# TYPE ")) {
            Some(rest) if !counter.is_empty() && rest.starts_with(&format!("{counter} ")) => {
                out.push_str(&line[..7]);
                out.push_str(counter);
                out.push_str("_total");
                out.push_str(&rest[counter.len()..]);
            }
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

type Labels = Vec<(&'static str, String)>;

/// Writes one family at a time: its descriptor, then a sample per label set (the job's name
/// first on each).
struct Families<'a> {
    encoder: DescriptorEncoder<'a>,
    job: String,
}

impl Families<'_> {
    fn labels(&self, extra: Labels) -> Labels {
        let mut l = vec![("job_name", self.job.clone())];
        l.extend(extra);
        l
    }

    fn counter(&mut self, name: &str, help: &str, samples: impl IntoIterator<Item = (Labels, u64)>) -> Fmt {
        let samples: Vec<(Labels, u64)> = samples.into_iter().map(|(l, v)| (self.labels(l), v)).collect();
        let mut family = self.encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
        for (labels, value) in samples {
            ConstCounter::new(value).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }

    fn gauge(
        &mut self,
        name: &str,
        help: &str,
        unit: Option<Unit>,
        samples: impl IntoIterator<Item = (Labels, f64)>,
    ) -> Fmt {
        let samples: Vec<(Labels, f64)> = samples.into_iter().map(|(l, v)| (self.labels(l), v)).collect();
        let mut family = self.encoder.encode_descriptor(name, help, unit.as_ref(), MetricType::Gauge)?;
        for (labels, value) in samples {
            ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }

    /// Latency histograms (nanoseconds, shown in seconds) in [`LATENCY_BUCKETS`].
    fn histogram<'h>(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (Labels, &'h Histogram<u64>)>,
    ) -> Fmt {
        let samples: Vec<(Labels, &Histogram<u64>)> = samples.into_iter().map(|(l, h)| (self.labels(l), h)).collect();
        let mut family = self.encoder.encode_descriptor(name, help, Some(&Unit::Seconds), MetricType::Histogram)?;
        for (labels, h) in samples {
            let (sum, count, buckets) = buckets(h);
            family.encode_family(&labels)?.encode_histogram::<Labels>(sum, count, &buckets, None)?;
        }
        Ok(())
    }
}

type Fmt = Result<(), std::fmt::Error>;

/// A histogram's sum (seconds), count and per-bucket counts in [`LATENCY_BUCKETS`] and +Inf.
fn buckets(h: &Histogram<u64>) -> (f64, u64, Vec<(f64, u64)>) {
    let mut below = 0;
    let mut out = Vec::with_capacity(LATENCY_BUCKETS.len() + 1);
    for bound in LATENCY_BUCKETS {
        let upto = h.count_between(0, (bound * 1e9) as u64);
        out.push((bound, upto.saturating_sub(below)));
        below = below.max(upto);
    }
    out.push((f64::INFINITY, h.len().saturating_sub(below)));
    (h.mean() * h.len() as f64 / 1e9, h.len(), out)
}

impl Collector for JobMetrics {
    fn encode(&self, encoder: DescriptorEncoder) -> Fmt {
        let job = &self.job;
        let mut f = Families { encoder, job: job.name() };
        let m = job.metrics();
        job_families(&mut f, job)?;
        operator_families(&mut f, m)?;
        if let Some(h) = m.latency().filter(|h| !h.is_empty()) {
            f.histogram("weir_latency", "Event creation to sink, where the job measures it.", [(vec![], &h)])?;
            let by_cause = m.latency_by_cause();
            f.histogram(
                "weir_latency_by_cause",
                "The same, by what the job's tasks did for checkpoints while the record was in flight.",
                by_cause.iter().map(|(c, h)| (vec![("cause", c.key().to_string())], h)),
            )?;
        }
        checkpoint_families(&mut f, job)
    }
}

/// The job's own families: records in and out, late records, restarts, its state, uptime,
/// workers and the memory its keyed state holds.
fn job_families(f: &mut Families<'_>, job: &JobController) -> Fmt {
    let m = job.metrics();
    f.counter("weir_source_records", "Records the job's sources emitted.", [(vec![], m.source_records())])?;
    f.counter("weir_sink_records", "Records the job's sinks received.", [(vec![], m.sink_records())])?;
    f.counter("weir_late_records", "Late records windows dropped.", [(vec![], m.late_records())])?;
    f.counter("weir_restarts", "Restarts after failures.", [(vec![], u64::from(job.restarts()))])?;
    let state = job.state();
    f.gauge(
        "weir_job_state",
        "1 for the state the job is in (Flink's names), 0 for the others.",
        None,
        weir::JobState::ALL.iter().map(|&s| (vec![("state", s.name().to_string())], f64::from(u8::from(s == state)))),
    )?;
    let uptime = job.elapsed().as_secs_f64();
    f.gauge("weir_uptime", "Time since the job started.", Some(Unit::Seconds), [(vec![], uptime)])?;
    f.gauge("weir_workers", "Worker threads the job runs on.", None, [(vec![], job.workers() as f64)])?;
    let memory = weir::state::state_memory_bytes() as f64;
    f.gauge(
        "weir_state_memory",
        "Memory held by keyed state pages in this process.",
        Some(Unit::Bytes),
        [(vec![], memory)],
    )?;
    if let Some(b) = job.state_memory() {
        state_budget_families(f, &b)?;
    }
    Ok(())
}

/// With a state memory budget: the budget, the pages in memory and in spill files, the pages
/// that left memory and came back, and the time faults took.
fn state_budget_families(f: &mut Families<'_>, b: &weir::metrics::StateMemoryStats) -> Fmt {
    f.gauge(
        "weir_state_memory_limit",
        "The state memory budget (--state-memory).",
        Some(Unit::Bytes),
        [(vec![], b.limit_bytes as f64)],
    )?;
    f.gauge(
        "weir_state_resident",
        "Bytes of keyed state pages in memory under the budget.",
        Some(Unit::Bytes),
        [(vec![], b.resident_bytes as f64)],
    )?;
    f.gauge(
        "weir_state_spilled",
        "Bytes of spill files holding keyed state pages that left memory.",
        Some(Unit::Bytes),
        [(vec![], b.spilled_bytes as f64)],
    )?;
    f.counter("weir_state_page_evictions", "Keyed state pages that left memory.", [(vec![], b.evictions)])?;
    f.counter("weir_state_page_faults", "Keyed state pages read back into memory.", [(vec![], b.faults)])?;
    f.counter("weir_state_spill_writes", "Keyed state pages written to spill files.", [(vec![], b.spill_writes)])?;
    f.gauge(
        "weir_state_page_fault_time",
        "Time spent reading keyed state pages back, over all faults (a counter's value; divide by the faults \
         for the mean).",
        Some(Unit::Seconds),
        [(vec![], b.fault_nanos as f64 / 1e9)],
    )
}

/// Per operator subtask: records in and out, its watermark and how far it lags, and how full
/// its input rings are.
fn operator_families(f: &mut Families<'_>, m: &weir::metrics::JobMetrics) -> Fmt {
    let operators = m.operators();
    let at = |o: &weir::metrics::OperatorMetrics| -> Labels {
        vec![("operator", o.operator.to_string()), ("subtask", o.subtask.to_string())]
    };
    f.counter(
        "weir_operator_records_in",
        "Records an operator subtask received.",
        operators.iter().map(|o| (at(o), o.records_in())),
    )?;
    f.counter(
        "weir_operator_records_out",
        "Records an operator subtask sent into its output rings (the last operator of a chain; a chained one's \
         are the next one's records in).",
        operators.iter().filter(|o| o.records_out() > 0).map(|o| (at(o), o.records_out())),
    )?;
    // Event time is in milliseconds (Flink's `currentInputWatermark`); Prometheus' base unit
    // is the second, and the unit is in the name.
    f.gauge(
        "weir_operator_watermark",
        "The newest watermark a one-input operator subtask received, in the job's event time: seconds since \
         the Unix epoch for a job whose timestamps are milliseconds since it (most are, as Flink's).",
        Some(Unit::Seconds),
        operators.iter().filter_map(|o| o.watermark().map(|w| (at(o), w as f64 / 1e3))),
    )?;
    // A subtask's lag is how far it is behind the job's most advanced watermark: the
    // subtasks that hold event time back (windows close at the slowest input's watermark).
    let ahead = operators.iter().filter_map(|o| o.watermark()).filter(|&w| w < u64::MAX / 2).max();
    f.gauge(
        "weir_operator_watermark_lag",
        "How far a one-input operator subtask's newest watermark is behind the job's most advanced one, in event \
         time: the subtasks that hold event time back.",
        Some(Unit::Seconds),
        operators.iter().filter_map(|o| {
            let (w, ahead) = (o.watermark().filter(|&w| w < u64::MAX / 2)?, ahead?);
            Some((at(o), ahead.saturating_sub(w) as f64 / 1e3))
        }),
    )?;
    let fills = m.input_fills();
    f.gauge(
        "weir_input_ring_fill_ratio",
        "How full an input ring of an operator subtask was when last looked at (1: its producer waits, \
         backpressure).",
        None,
        fills.iter().flat_map(|fill| {
            let capacity = fill.capacity.max(1) as f64;
            fill.waiting().into_iter().enumerate().map(move |(channel, waiting)| {
                let labels = vec![
                    ("operator", fill.operator.to_string()),
                    ("subtask", fill.subtask.to_string()),
                    ("input", fill.input.to_string()),
                    ("channel", channel.to_string()),
                ];
                (labels, waiting as f64 / capacity)
            })
        }),
    )?;
    Ok(())
}

/// The checkpoint families, for a job that checkpoints: completed and failed, and the newest
/// completed checkpoint's figures.
fn checkpoint_families(f: &mut Families<'_>, job: &JobController) -> Fmt {
    if job.checkpoint_config().is_none() {
        return Ok(());
    }
    f.counter("weir_checkpoints_completed", "Checkpoints completed.", [(vec![], job.checkpoints_completed())])?;
    let failed = job.checkpoints_failed();
    f.counter("weir_checkpoints_failed", "Checkpoints that failed.", [(vec![], failed)])?;
    let in_progress = job.checkpoints_in_progress() as f64;
    f.gauge("weir_checkpoints_in_progress", "Checkpoints triggered and not yet done.", None, [(vec![], in_progress)])?;
    f.counter("weir_restores", "Attempts that restored a checkpoint or savepoint.", [(vec![], job.restores())])?;
    let Some(last) = job.last_checkpoint() else { return Ok(()) };
    f.gauge("weir_last_checkpoint_id", "Id of the newest completed checkpoint.", None, [(vec![], last.id as f64)])?;
    // What an alert on checkpoints that stopped completing compares with `time()`.
    let completed_s = (last.trigger_unix_ms as f64 + last.duration_ms) / 1e3;
    f.gauge(
        "weir_last_checkpoint_completed_timestamp",
        "When the newest checkpoint completed, in seconds since the Unix epoch.",
        Some(Unit::Seconds),
        [(vec![], completed_s)],
    )?;
    let seconds: [(&str, &str, f64); 5] = [
        ("weir_last_checkpoint_duration", "Its duration, trigger to completion.", last.duration_ms),
        ("weir_last_checkpoint_start_delay", "Its barriers' delay to the tasks.", last.start_delay_ms),
        ("weir_last_checkpoint_alignment", "Its longest alignment.", last.alignment_ms),
        ("weir_last_checkpoint_sync", "Its longest synchronous part.", last.sync_ms),
        ("weir_last_checkpoint_async", "Its longest asynchronous part.", last.async_ms),
    ];
    for (name, help, ms) in seconds {
        f.gauge(name, help, Some(Unit::Seconds), [(vec![], ms / 1e3)])?;
    }
    let bytes: [(&str, &str, u64); 2] = [
        ("weir_last_checkpoint_state", "The state it holds.", last.state_bytes),
        ("weir_last_checkpoint_inflight", "The in-flight data it holds.", last.inflight_bytes),
    ];
    for (name, help, b) in bytes {
        f.gauge(name, help, Some(Unit::Bytes), [(vec![], b as f64)])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_format_names_a_counters_family_by_its_samples() {
        let om = "# HELP weir_x Records.\n# TYPE weir_x counter\nweir_x_total{job_name=\"j\"} 3\n\
                  # HELP weir_up Uptime.\n# TYPE weir_up_seconds gauge\n# UNIT weir_up_seconds seconds\n\
                  weir_up_seconds{job_name=\"j\"} 1.5\n# EOF\n";
        assert_eq!(
            to_text_format(om),
            "# HELP weir_x_total Records.\n# TYPE weir_x_total counter\nweir_x_total{job_name=\"j\"} 3\n\
             # HELP weir_up Uptime.\n# TYPE weir_up_seconds gauge\nweir_up_seconds{job_name=\"j\"} 1.5\n"
        );
    }

    /// Buckets hold each value once, in the first bound at or above it; +Inf the rest.
    #[test]
    fn latency_buckets_count_each_value_once() {
        let mut h = Histogram::<u64>::new(3).unwrap();
        for ns in [5_000u64, 5_000, 800_000, 3_000_000_000, 60_000_000_000] {
            h.record(ns).unwrap();
        }
        let (sum, count, buckets) = buckets(&h);
        assert_eq!(count, 5);
        assert!((sum - 63.00081).abs() < 0.1, "{sum}");
        let at = |bound: f64| buckets.iter().find(|(b, _)| *b == bound).unwrap().1;
        assert_eq!((at(0.000_01), at(0.001), at(5.0), at(f64::INFINITY)), (2, 1, 1, 1));
        assert_eq!(buckets.iter().map(|b| b.1).sum::<u64>(), 5);
    }
}
