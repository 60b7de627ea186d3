//! The command's tables, drawn with `comfy-table`: the run summary, checkpoint statistics,
//! the checkpoint lab's medians and ratios, latency by cause. ASCII only (logs and CI), every
//! column right-aligned but the summary's names, one latency unit per table.
//!
//! May touch: `lab` (its summary); the engine's report types.

use crate::lab::LabSummary;
use comfy_table::{CellAlignment, ContentLineStyle, LineStyle, Table, TableStyle};
use weir::metrics::{group_digits, CheckpointStats, JobReport, TimeUnit};

/// `+---+` rules above, below and under the header; `|` between columns.
const STYLE: TableStyle = TableStyle::new()
    .top_border(LineStyle::new('+', '-', '+', '+'))
    .header_lines(ContentLineStyle::new('|', '|', '|'))
    .header_separator(LineStyle::new('+', '-', '+', '+'))
    .content_lines(ContentLineStyle::new('|', '|', '|'))
    .bottom_border(LineStyle::new('+', '-', '+', '+'));

fn drawn(mut t: Table, right_from: usize) -> String {
    t.load_style(STYLE);
    for c in t.column_iter_mut().skip(right_from) {
        c.set_cell_alignment(CellAlignment::Right);
    }
    format!("{t}\n")
}

/// A table of `rows` under `header`, every column right-aligned.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut t = Table::new();
    t.set_header(header.to_vec());
    t.add_rows(rows.iter().cloned());
    drawn(t, 0)
}

/// The run's summary: throughput in source records per second, latency percentiles in one
/// unit. With `counting`, the throughput counts that instead (`("words", n)`: word count's
/// words, where a source record is a block of text).
pub fn summary(report: &JobReport, counting: Option<(&str, u64)>) -> String {
    let (what, count) = counting.unwrap_or(("records", report.source_records));
    let per_s = count as f64 / report.elapsed.as_secs_f64().max(1e-9);
    let mut rows: Vec<[String; 2]> = vec![
        ["workers".into(), report.workers.to_string()],
        ["elapsed".into(), format!("{:.2} s", report.elapsed.as_secs_f64())],
        ["records (sources)".into(), group_digits(report.source_records)],
        ["records (sinks)".into(), group_digits(report.sink_records)],
        ["throughput".into(), format!("{} {what}/s", group_digits(per_s as u64))],
    ];
    if report.restarts > 0 {
        rows.push(["restarts after failures".into(), report.restarts.to_string()]);
    }
    if report.late_records > 0 {
        rows.push(["late records dropped".into(), group_digits(report.late_records)]);
    }
    if let Some(h) = &report.latency_ns {
        rows.push(["latency samples".into(), group_digits(h.len())]);
        // One unit for every latency row, the one that suits the largest.
        let unit = TimeUnit::for_largest(h.max());
        for (name, q) in [("p50", 0.5), ("p99", 0.99), ("p99.9", 0.999)] {
            rows.push([format!("latency {name}"), unit.format(h.value_at_quantile(q))]);
        }
        rows.push(["latency max".into(), unit.format(h.max())]);
    }
    let mut t = Table::new();
    t.add_rows(rows);
    drawn(t, 1)
}

/// The columns of one checkpoint's statistics.
pub const STATS_COLUMNS: [&str; 8] =
    ["duration", "start delay", "alignment", "sync", "async", "state bytes", "written", "in-flight bytes"];

/// One checkpoint's statistics as the cells of [`STATS_COLUMNS`].
pub fn stats_cells(s: &CheckpointStats) -> Vec<String> {
    let mut cells: Vec<String> =
        [s.duration_ms, s.start_delay_ms, s.alignment_ms, s.sync_ms, s.async_ms].map(|v| format!("{v:.2} ms")).into();
    cells.extend([s.state_bytes, s.written_bytes, s.inflight_bytes].map(group_digits));
    cells
}

/// Checkpoint statistics, one row per checkpoint. With adaptive alignment, a column counts
/// the input channels aligned and captured; where a checkpoint resumed a failed one, a column
/// counts the task parts it reused; with the directory in an object store, a last column says
/// how long its files took to go up.
pub fn checkpoint_stats(stats: &[CheckpointStats]) -> String {
    let mut header = vec!["id"];
    header.extend(STATS_COLUMNS);
    let adaptive = stats.iter().any(|s| !s.channels.is_empty());
    if adaptive {
        header.push("channels aligned / captured");
    }
    let resumed = stats.iter().any(|s| s.resumed_from.is_some());
    if resumed {
        header.push("parts reused");
    }
    let uploaded = stats.iter().any(|s| s.upload_ms.is_some());
    if uploaded {
        header.push("upload");
    }
    let rows: Vec<Vec<String>> = stats
        .iter()
        .map(|s| {
            let aligned = s.channels.iter().filter(|c| c.aligned).count();
            let channels = adaptive.then(|| format!("{aligned} / {}", s.channels.len() - aligned));
            let reused = resumed.then(|| match s.resumed_from {
                Some(from) => {
                    format!("{} of {} (from {from})", s.parts.iter().filter(|p| p.reused).count(), s.parts.len())
                }
                None => "-".to_string(),
            });
            let upload = uploaded.then(|| s.upload_ms.map_or_else(|| "-".to_string(), |ms| format!("{ms:.2} ms")));
            std::iter::once(s.id.to_string())
                .chain(stats_cells(s))
                .chain(channels)
                .chain(reused)
                .chain(upload)
                .collect()
        })
        .collect();
    table(&header, &rows)
}

/// The checkpoint lab's medians per mode, then the ratios of consecutive checkpoints of two
/// modes (if any pair ran).
pub fn lab(summary: &LabSummary) -> String {
    let rows: Vec<Vec<String>> = summary
        .modes
        .iter()
        .map(|m| {
            vec![
                m.mode.clone(),
                m.checkpoints.to_string(),
                format!("{:.2} ms", m.median_duration_ms),
                format!("{:.2} ms", m.median_alignment_ms),
                group_digits(m.median_inflight_bytes as u64),
            ]
        })
        .collect();
    let mut out =
        table(&["mode", "checkpoints", "median duration", "median alignment", "median in-flight bytes"], &rows);
    let rows: Vec<Vec<String>> = summary
        .ratios
        .iter()
        .map(|r| {
            vec![
                format!("{} ÷ {}", r.numerator, r.denominator),
                r.pairs.to_string(),
                format!("{:.3}", r.median),
                format!("{:.3}–{:.3}", r.p10, r.p90),
            ]
        })
        .collect();
    if !rows.is_empty() {
        out.push_str("duration ratios of consecutive checkpoints (each pair under the same moment's load):\n");
        out.push_str(&table(&["modes", "pairs", "median ratio", "p10–p90"], &rows));
    }
    out
}

/// Latency by what the job's tasks were doing while each record was in flight
/// ([`weir::metrics::LatencyCause`]): per cause its share of the samples and
/// p50/p99/p99.9/max, in one unit. `None` without latency samples.
pub fn latency_by_cause(report: &JobReport) -> Option<String> {
    let total: u64 = report.latency_by_cause.iter().map(|(_, h)| h.len()).sum();
    if total == 0 {
        return None;
    }
    let unit = TimeUnit::for_largest(report.latency_by_cause.iter().map(|(_, h)| h.max()).max().unwrap_or(0));
    let rows: Vec<Vec<String>> = report
        .latency_by_cause
        .iter()
        .map(|(cause, h)| {
            let mut row = vec![
                cause.name().to_string(),
                group_digits(h.len()),
                format!("{:.1}%", 100.0 * h.len() as f64 / total as f64),
            ];
            row.extend([0.5, 0.99, 0.999].map(|q| unit.format(h.value_at_quantile(q))));
            row.push(unit.format(h.max()));
            row
        })
        .collect();
    Some(table(&["while in flight", "samples", "share", "p50", "p99", "p99.9", "max"], &rows))
}

/// What a table of `kept` of `total` checkpoints leaves out, if anything.
pub fn listed(total: u64, kept: usize) -> String {
    match total > kept as u64 {
        true => format!(" (the newest {kept} listed)"),
        false => String::new(),
    }
}

/// What a state memory budget's pages did, in a line.
pub fn state_memory(b: &weir::metrics::StateMemoryStats) -> String {
    use weir::state::ByteSize;
    if b.resident_peak_bytes == 0 && b.spill_writes == 0 {
        return format!(
            "state memory {}: nothing to bound (this job keeps no keyed or window state)",
            ByteSize(b.limit_bytes)
        );
    }
    let mean_fault_us = b.fault_nanos as f64 / b.faults.max(1) as f64 / 1e3;
    format!(
        "state memory {}: at most {} in memory; {} pages left it ({} written to spill files) and {} came back, \
         {mean_fault_us:.1} µs each on average",
        ByteSize(b.limit_bytes),
        ByteSize(b.resident_peak_bytes),
        weir::metrics::group_digits(b.evictions),
        weir::metrics::group_digits(b.spill_writes),
        weir::metrics::group_digits(b.faults),
    )
}
