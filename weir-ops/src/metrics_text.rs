//! A running job's metrics in Prometheus's text exposition format (version 0.0.4, which
//! OpenMetrics scrapers read too): counters of records, restarts and checkpoints, and gauges
//! of the newest checkpoint's statistics and the state's memory. Read from the job's counters
//! and statistics as they are when scraped: nothing on the record path.
//!
//! May touch: nothing else in the crate; the job's [`JobController`].

use std::fmt::Write;

use weir::metrics::Histogram;
use weir::JobController;

/// One metric family: its help, type and samples (`labels`, value).
struct Family<'a> {
    out: &'a mut String,
    job: String,
}

impl Family<'_> {
    fn metric(&mut self, name: &str, kind: &str, help: &str, value: f64) {
        self.labelled(name, kind, help, std::iter::once((String::new(), value)));
    }

    /// A family with a sample per label set (`extra` labels after the job's, `k="v",…`).
    fn labelled(&mut self, name: &str, kind: &str, help: &str, samples: impl Iterator<Item = (String, f64)>) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
        for (extra, value) in samples {
            let sep = if extra.is_empty() { "" } else { "," };
            let _ = writeln!(self.out, "{name}{{job=\"{}\"{sep}{extra}}} {value}", self.job);
        }
    }

    /// A summary family of latency histograms (nanoseconds, shown in seconds): p50, p99 and
    /// p99.9, sum and count per histogram, labelled `cause="…"` unless the cause is empty.
    fn summary<'h>(
        &mut self,
        name: &str,
        help: &str,
        histograms: impl IntoIterator<Item = (&'h str, &'h Histogram<u64>)>,
    ) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} summary");
        for (cause, h) in histograms {
            let labels = if cause.is_empty() {
                format!("job=\"{}\"", self.job)
            } else {
                format!("job=\"{}\",cause=\"{cause}\"", self.job)
            };
            for q in [0.5, 0.99, 0.999] {
                let v = h.value_at_quantile(q) as f64 / 1e9;
                let _ = writeln!(self.out, "{name}{{{labels},quantile=\"{q}\"}} {v}");
            }
            let _ = writeln!(self.out, "{name}_sum{{{labels}}} {}", h.mean() * h.len() as f64 / 1e9);
            let _ = writeln!(self.out, "{name}_count{{{labels}}} {}", h.len());
        }
    }
}

/// Escapes a label value (backslash, quote, newline).
fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The metrics of `job`, as text.
pub fn render(job: &JobController) -> String {
    let mut out = String::new();
    let m = job.metrics();
    let mut f = Family { out: &mut out, job: label(&job.name()) };
    f.metric("weir_source_records_total", "counter", "Records the job's sources emitted.", m.source_records() as f64);
    f.metric("weir_sink_records_total", "counter", "Records the job's sinks received.", m.sink_records() as f64);
    f.metric("weir_late_records_total", "counter", "Late records windows dropped.", m.late_records() as f64);
    f.metric("weir_restarts_total", "counter", "Restarts after failures.", f64::from(job.restarts()));
    f.metric("weir_uptime_seconds", "gauge", "Time since the job started.", job.elapsed().as_secs_f64());
    f.metric("weir_workers", "gauge", "Worker threads the job runs on.", job.workers() as f64);
    f.metric(
        "weir_state_memory_bytes",
        "gauge",
        "Memory held by keyed state pages in this process.",
        weir::state::state_memory_bytes() as f64,
    );
    let operators = m.operators();
    let at =
        |o: &weir::metrics::OperatorMetrics| format!("operator=\"{}\",subtask=\"{}\"", label(&o.operator), o.subtask);
    f.labelled(
        "weir_operator_records_in_total",
        "counter",
        "Records an operator subtask received.",
        operators.iter().map(|o| (at(o), o.records_in() as f64)),
    );
    f.labelled(
        "weir_operator_records_out_total",
        "counter",
        "Records an operator subtask sent into its output rings (the last operator of a chain; a chained one's are \
         the next one's records in).",
        operators.iter().filter(|o| o.records_out() > 0).map(|o| (at(o), o.records_out() as f64)),
    );
    f.labelled(
        "weir_operator_watermark",
        "gauge",
        "The newest watermark a one-input operator subtask received (event time).",
        operators.iter().filter_map(|o| o.watermark().map(|w| (at(o), w as f64))),
    );
    // Event time is the job's own unit (wall-clock milliseconds, nanoseconds since the job
    // began…): a subtask's lag is how far it is behind the job's most advanced watermark, the
    // subtasks that hold event time back (windows close at the slowest input's watermark).
    let ahead = operators.iter().filter_map(|o| o.watermark()).filter(|&w| w < u64::MAX / 2).max();
    f.labelled(
        "weir_operator_watermark_lag",
        "gauge",
        "How far a one-input operator subtask's newest watermark is behind the job's most advanced one, in event \
         time's unit: the subtasks that hold event time back.",
        operators.iter().filter_map(|o| {
            let (w, ahead) = (o.watermark().filter(|&w| w < u64::MAX / 2)?, ahead?);
            Some((at(o), ahead.saturating_sub(w) as f64))
        }),
    );
    let fills = m.input_fills();
    f.labelled(
        "weir_input_ring_fill_ratio",
        "gauge",
        "How full an input ring of an operator subtask was when last looked at (1: its producer waits, backpressure).",
        fills.iter().flat_map(|fill| {
            let labels =
                format!("operator=\"{}\",subtask=\"{}\",input=\"{}\"", label(&fill.operator), fill.subtask, fill.input);
            let capacity = fill.capacity.max(1) as f64;
            fill.waiting()
                .into_iter()
                .enumerate()
                .map(move |(channel, waiting)| (format!("{labels},channel=\"{channel}\""), waiting as f64 / capacity))
        }),
    );
    if let Some(h) = m.latency().filter(|h| !h.is_empty()) {
        // A summary: the quantiles since the job started, as the probes hand them on (every
        // tenth of a second).
        f.summary("weir_latency_seconds", "Event creation to sink, where the job measures it.", [("", &h)]);
        let by_cause = m.latency_by_cause();
        f.summary(
            "weir_latency_by_cause_seconds",
            "The same, by what the job's tasks did for checkpoints while the record was in flight.",
            by_cause.iter().map(|(c, h)| (c.key(), h)),
        );
    }
    checkpoint_families(&mut f, job);
    out
}

/// The checkpoint families, for a job that checkpoints: completed and failed, and the newest
/// completed checkpoint's figures.
fn checkpoint_families(f: &mut Family<'_>, job: &JobController) {
    if job.checkpoint_config().is_some() {
        let failures = job.checkpoint_failures();
        f.metric(
            "weir_checkpoints_completed_total",
            "counter",
            "Checkpoints completed.",
            job.checkpoints_completed() as f64,
        );
        f.metric("weir_checkpoints_failed_total", "counter", "Checkpoints that failed.", failures.len() as f64);
        if let Some(last) = job.last_checkpoint() {
            let gauges: [(&str, &str, f64); 8] = [
                ("weir_last_checkpoint_id", "Id of the newest completed checkpoint.", last.id as f64),
                ("weir_last_checkpoint_duration_ms", "Its duration, trigger to completion.", last.duration_ms),
                ("weir_last_checkpoint_start_delay_ms", "Its barriers' delay to the tasks.", last.start_delay_ms),
                ("weir_last_checkpoint_alignment_ms", "Its longest alignment.", last.alignment_ms),
                ("weir_last_checkpoint_sync_ms", "Its longest synchronous part.", last.sync_ms),
                ("weir_last_checkpoint_async_ms", "Its longest asynchronous part.", last.async_ms),
                ("weir_last_checkpoint_state_bytes", "The state it holds.", last.state_bytes as f64),
                ("weir_last_checkpoint_inflight_bytes", "The in-flight data it holds.", last.inflight_bytes as f64),
            ];
            for (name, help, value) in gauges {
                f.metric(name, "gauge", help, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::label;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
