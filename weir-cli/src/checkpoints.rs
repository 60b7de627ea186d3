//! `weir checkpoints DIR`: the table of a checkpoint directory's checkpoints.
//!
//! May touch: `args`.

use weir::checkpoint::CheckpointStatus;
use weir::Error;

use crate::args::*;

/// What the checkpoint directory `dir` holds, folder by folder. A directory in an object
/// store is read from a copy of its complete checkpoints, removed afterwards.
fn inspect(dir: &std::path::Path) -> weir::Result<Vec<(String, CheckpointStatus)>> {
    let url = dir.to_str().filter(|d| weir_object_store::S3Url::is_s3(d));
    let copy = match url {
        Some(url) => {
            let copy = weir_ops::scratch_dir("checkpoints-listing");
            let mirror = weir::checkpoint::CheckpointMirror::new(weir_object_store::open(url)?);
            mirror.download_into(&copy).inspect_err(|_| {
                let _ = std::fs::remove_dir_all(&copy);
            })?;
            Some(copy)
        }
        None => None,
    };
    let found = weir::checkpoint::inspect(copy.as_deref().unwrap_or(dir));
    if let Some(copy) = &copy {
        let _ = std::fs::remove_dir_all(copy);
    }
    found
}

pub(crate) fn list_checkpoints(args: &CheckpointsArgs) -> weir::Result<()> {
    let found = inspect(&args.dir)?;
    if found.is_empty() {
        println!("no checkpoints in {}", args.dir.display());
        return Ok(());
    }
    let mut rows = Vec::new();
    let mut damaged = 0;
    // The completion marker is said below the table: its description would widen a column.
    let mut finished = Vec::new();
    for (name, status) in &found {
        let mut row = vec![name.clone()];
        match status {
            CheckpointStatus::Valid(m) => {
                row.push("valid".into());
                row.push(job_cell(m));
                let (own, shared, files) = m.own_and_shared_bytes();
                row.push(weir::metrics::group_digits(own));
                row.push(if files == 0 {
                    "-".into()
                } else {
                    format!(
                        "{} in {files} file{}",
                        weir::metrics::group_digits(shared),
                        if files == 1 { "" } else { "s" }
                    )
                });
                row.extend(weir_ops::tables::stats_cells(&m.stats));
            }
            CheckpointStatus::Incomplete => {
                row.push("incomplete (no _metadata: never completed)".into());
                row.extend(std::iter::repeat_n(String::new(), 3));
                row.extend(std::iter::repeat_n(String::new(), weir_ops::tables::STATS_COLUMNS.len()));
            }
            CheckpointStatus::Damaged(reason) => {
                damaged += 1;
                row.push(format!("DAMAGED: {reason}"));
                row.extend(std::iter::repeat_n(String::new(), 3));
                row.extend(std::iter::repeat_n(String::new(), weir_ops::tables::STATS_COLUMNS.len()));
            }
            CheckpointStatus::Finished(f) => {
                let what = if f.description.is_empty() { String::new() } else { format!(": {}", f.description) };
                finished.push(format!("{name}: the job '{}' finished{what}", f.job));
                continue;
            }
        }
        rows.push(row);
    }
    // Own: its task files and the pages it wrote; shared: earlier checkpoints' files it refers
    // to (incremental checkpoints), which compaction keeps bounded.
    let mut header = vec!["folder", "status", "job (its sinks' output)", "own bytes", "shared bytes"];
    header.extend(weir_ops::tables::STATS_COLUMNS);
    if !rows.is_empty() {
        print!("{}", weir_ops::tables::table(&header, &rows));
    }
    for line in finished {
        println!("{line}");
    }
    if damaged > 0 {
        return Err(Error::Corrupt(format!(
            "{damaged} damaged checkpoint folder(s) or file(s) in {}",
            args.dir.display()
        )));
    }
    Ok(())
}

/// Whose a checkpoint is: the job's name, and where its sinks write.
pub(crate) fn job_cell(m: &weir::checkpoint::CheckpointMetadata) -> String {
    let outputs: Vec<String> = m.outputs.iter().map(|o| format!("{} → {}", o.operator, o.location)).collect();
    match outputs.is_empty() {
        true => format!("'{}'", m.job),
        false => format!("'{}' ({})", m.job, outputs.join(", ")),
    }
}
