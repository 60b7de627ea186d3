//! Checkpoints: configuration, the coordinator, the task side of barrier alignment and
//! snapshot writing, and storage. Beside the data path: control messages (trigger,
//! acknowledge, complete, abort) travel on their own channels, never on the data rings.
//!
//! The model is Flink's (Carbone et al. 2015): the coordinator triggers checkpoint *n* at the
//! sources, which record their offsets and inject barrier *n* in-band; a task snapshots its
//! operators when barrier *n* has arrived on all inputs (exactly-once blocks each input that
//! delivered it; at-least-once only counts), forwards it, and writes the snapshot in the
//! background; the checkpoint exists once its `_metadata` is durable.
//!
//! May touch: `context`, `error`, `persist`, `snapshot`.

mod config;
pub(crate) mod coordinator;
mod incremental;
mod storage;
pub(crate) mod task;

pub use config::{CheckpointConfig, CheckpointMode, RestartStrategy};
pub use incremental::{write_task_snapshot, PageIndex, TaskFileWritten};
pub use storage::{
    decode_file, encode_file, load_dir, read_file, read_metadata, write_file, CheckpointMetadata, CheckpointStats,
    CheckpointStorage, FileKind, LoadedCheckpoint, StoredChunk, TaskFile, TaskFileContent, FORMAT_VERSION,
    METADATA_FILE, SHARED_DIR,
};
pub use task::{Alignment, BarrierAligner};

/// A table of checkpoint statistics, one row per checkpoint (for the command line).
pub fn stats_table(stats: &[CheckpointStats]) -> String {
    let header =
        ["id", "duration", "start delay", "alignment", "sync", "async", "state bytes", "written", "in-flight bytes"];
    let ms = |v: f64| format!("{v:.2} ms");
    let rows: Vec<Vec<String>> = stats
        .iter()
        .map(|s| {
            vec![
                s.id.to_string(),
                ms(s.duration_ms),
                ms(s.start_delay_ms),
                ms(s.alignment_ms),
                ms(s.sync_ms),
                ms(s.async_ms),
                crate::metrics::group_digits(s.state_bytes),
                crate::metrics::group_digits(s.written_bytes),
                crate::metrics::group_digits(s.inflight_bytes),
            ]
        })
        .collect();
    table(&header, &rows)
}

/// Formats a plain-text table with right-aligned columns.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| -> String {
        let parts: Vec<String> = cells.iter().zip(&widths).map(|(c, w)| format!("{c:>w$}")).collect();
        format!("| {} |\n", parts.join(" | "))
    };
    let rule = format!("+-{}-+\n", widths.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>().join("-+-"));
    let mut out = rule.clone();
    out.push_str(&line(header.iter().map(|h| h.to_string()).collect()));
    out.push_str(&rule);
    for r in rows {
        out.push_str(&line(r.clone()));
    }
    out.push_str(&rule);
    out
}

/// The state of one `chk-<n>` folder, for `weir checkpoints`.
#[derive(Debug)]
pub enum CheckpointStatus {
    /// Complete, and every file verifies.
    Valid(Box<CheckpointMetadata>),
    /// Has no `_metadata`: it never completed, so it is not a checkpoint.
    Incomplete,
    /// Damaged: the reason.
    Damaged(String),
}

/// Checks every checkpoint folder under `dir`, oldest first.
pub fn inspect(dir: &std::path::Path) -> crate::Result<Vec<(u64, CheckpointStatus)>> {
    let meta = std::fs::metadata(dir).map_err(|e| crate::Error::io("cannot read checkpoint directory", dir, e))?;
    if !meta.is_dir() {
        return Err(crate::Error::config(format!("{} is not a directory", dir.display())));
    }
    let storage = CheckpointStorage::new(dir);
    Ok(storage
        .list()
        .into_iter()
        .map(|id| {
            let status = if !storage.is_complete(id) {
                CheckpointStatus::Incomplete
            } else {
                match storage.load(id) {
                    Ok(c) => CheckpointStatus::Valid(Box::new(c.metadata)),
                    Err(e) => CheckpointStatus::Damaged(e.to_string()),
                }
            };
            (id, status)
        })
        .collect())
}
