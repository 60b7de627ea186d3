//! Recovery at the start of an attempt: what a checkpoint directory (or a savepoint) says the
//! attempt restores, checked against the job. Refuses a directory another job finished in,
//! one of another job or format, and a savepoint whose state does not fit; removes what
//! never completed; falls back past damaged checkpoints (naming them), never past a read
//! error.
//!
//! May touch: `context`, `error`, `snapshot` (and storage, beside it).

use std::collections::{BTreeSet, HashSet};
use std::path::Path;
use std::sync::Arc;

use super::config::CheckpointConfig;
use super::local::LocalCopies;
use super::storage::{
    load_dir, read_finished, read_metadata, CheckpointMetadata, CheckpointStorage, LoadedCheckpoint, PageCache,
    RecoveryPoint, SinkOutput, FINISHED_MARKER, FORMAT_VERSION, METADATA_FILE,
};
use crate::context::Recovery;
use crate::error::{Error, Result};
use crate::snapshot::{PartName, RestoredState};

/// The job as recovery checks it.
pub(crate) struct JobIdentity<'a> {
    pub(crate) name: &'a str,
    pub(crate) fingerprint: &'a str,
    /// The operators' names.
    pub(crate) operators: HashSet<&'a str>,
    /// The savepoint (or checkpoint folder) the job was told to start from, and whether state
    /// of operators the job lacks may be dropped.
    pub(crate) restore: Option<(&'a Path, bool)>,
    /// Told what is about to be restored ([`crate::Job::on_restore`]).
    pub(crate) announce: &'a dyn Fn(&str),
    /// Where its sinks write.
    pub(crate) outputs: Vec<SinkOutput>,
}

/// Refuses to resume checkpoint `m` of directory `dir` with a sink that writes elsewhere than
/// it did: what the sink committed so far is in the recorded place, the transactions the
/// checkpoint holds can only be committed there, and the rest of the output belongs with them.
fn check_outputs(m: &CheckpointMetadata, job: &JobIdentity<'_>, dir: &Path) -> Result<()> {
    for recorded in &m.outputs {
        let Some(now) = job.outputs.iter().find(|o| o.operator == recorded.operator) else { continue };
        if now.location != recorded.location {
            return Err(Error::config(format!(
                "checkpoint {} in {} belongs to a run whose sink '{}' wrote to {}, and this run writes to {}: the \
                 output so far, and the transactions the checkpoint holds, are there. Resume with the same output \
                 (weir: --output {}), or start afresh with another checkpoint directory. Nothing was restored or \
                 created",
                m.checkpoint,
                dir.display(),
                recorded.operator,
                recorded.location,
                now.location,
                recorded.location
            )));
        }
    }
    Ok(())
}

/// What a checkpoint or savepoint holds, for the line that announces its restore.
fn restore_line(what: &str, path: &Path, m: &CheckpointMetadata) -> String {
    let bytes: u64 = m.tasks.iter().map(|t| t.bytes).sum::<u64>() + m.shared.iter().map(|s| s.bytes).sum::<u64>();
    let files = m.tasks.len() + m.shared.len();
    format!(
        "restoring {what} {} of job '{}' from {} ({:.1} MB in {files} files)",
        m.checkpoint,
        m.job,
        path.display(),
        bytes as f64 / 1e6
    )
}

/// Where an attempt's state came from (`/job`'s `last_restore`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RestoreReport {
    /// The checkpoint (or savepoint) restored.
    pub checkpoint: u64,
    /// `memory` (local recovery: the process's copy of the checkpoint), `files` (the
    /// checkpoint directory) or `savepoint` (the savepoint the job was told to start from).
    pub from: &'static str,
}

/// What an attempt of a checkpointed job starts from.
pub(crate) struct Recovered {
    pub(crate) storage: Arc<CheckpointStorage>,
    pub(crate) restored: Option<Arc<RestoredState>>,
    pub(crate) recovery: Recovery,
    /// The first checkpoint id this attempt may use.
    pub(crate) first_id: u64,
    /// Complete checkpoints up to the restored one (they take part in retention).
    pub(crate) completed: Vec<u64>,
    /// What was restored, from where.
    pub(crate) report: Option<RestoreReport>,
}

/// Refuses a checkpoint directory (`shown` as the user named it) whose job completed: this
/// job's (run it again in a fresh one) or another's.
fn refuse_a_finished_directory(cfg: &CheckpointConfig, job: &JobIdentity<'_>, shown: &str) -> Result<()> {
    let fingerprint = job.fingerprint;
    if let Some(finished) = read_finished(&cfg.dir)? {
        let marker = cfg.dir.join(FINISHED_MARKER);
        return Err(Error::Refused(if finished.fingerprint == fingerprint {
            format!(
                "the job that used checkpoint directory {} already completed ({} exists); remove the directory to run it again",
                shown,
                if cfg.store.is_some() { FINISHED_MARKER.to_string() } else { marker.display().to_string() }
            )
        } else {
            format!(
                "checkpoint directory {} belongs to another job, which completed ('{}', graph fingerprint {}; this job is '{}', {}); choose another directory",
                shown,
                finished.job,
                finished.fingerprint,
                job.name,
                fingerprint
            )
        }));
    }
    Ok(())
}

/// The process's copy of checkpoint directory `storage`'s newest complete checkpoint (local
/// recovery), with its metadata: `None` when the process has none of that checkpoint (a
/// newer one completed without every task's parts here, or local recovery is off).
fn local_copy(storage: &CheckpointStorage, local: Option<&LocalCopies>) -> Option<LoadedCheckpoint> {
    let copy = local?.latest()?;
    let newest = storage.list().into_iter().rev().find(|&id| storage.is_complete(id))?;
    if newest != copy.id {
        return None;
    }
    Some(LoadedCheckpoint { metadata: storage.metadata(copy.id).ok()?, state: copy.restored()? })
}

/// Recovers checkpoint directory `cfg.dir` for `job`; messages go to `notes`. With `local`
/// (local recovery), a copy of the newest complete checkpoint kept in the process is restored
/// instead of its files. With `lazy_pages` (a job whose state keeps within a memory budget:
/// the cache of pages read from an object store), pages of keyed state stored apart are left
/// in their files until used ([`super::storage::load_dir_lazily`]).
pub(crate) fn recover_directory(
    cfg: &CheckpointConfig,
    job: &JobIdentity<'_>,
    notes: &mut Vec<String>,
    local: Option<&LocalCopies>,
    lazy_pages: Option<&Arc<PageCache>>,
) -> Result<Recovered> {
    let fingerprint = job.fingerprint;
    // Kept in an object store, the directory is the store (the folder is a working copy).
    let shown = cfg.store.as_ref().map_or_else(|| cfg.dir.display().to_string(), |s| s.location());
    refuse_a_finished_directory(cfg, job, &shown)?;
    let storage = Arc::new(CheckpointStorage::of_config(cfg, fingerprint));
    // No checkpoint is being written now: shared pages of checkpoints that never completed
    // (a crash, an earlier attempt) can go.
    storage.remove_unreferenced_shared();
    refuse_another_format(&storage, &shown)?;
    let found = recovery_point(&storage, local, job, lazy_pages)?;
    for (id, why) in &found.skipped {
        tracing::warn!(checkpoint = id, reason = %why, "checkpoint damaged, skipped");
        notes.push(format!("checkpoint {id} is damaged and was skipped: {why}"));
    }
    let mut recovery = Recovery {
        restored: found.checkpoint.as_ref().map(|c| c.metadata.checkpoint),
        skipped: found.skipped.iter().map(|(id, _)| *id).collect(),
        allow_retracting_output: cfg.allow_retracting_output,
    };
    let mut completed = Vec::new();
    let mut restored = None;
    let mut report = None;
    if let Some(c) = found.checkpoint {
        if c.metadata.fingerprint != fingerprint {
            return Err(Error::config(format!(
                "checkpoint directory {} holds checkpoints of another job ('{}', graph fingerprint {}; this job is '{}', {})",
                shown,
                c.metadata.job,
                c.metadata.fingerprint,
                job.name,
                fingerprint
            )));
        }
        check_outputs(&c.metadata, job, &cfg.dir)?;
        let from = if c.state.from_memory() { "memory" } else { "files" };
        tracing::info!(checkpoint = c.metadata.checkpoint, job = %job.name, from, "restored from checkpoint");
        notes.push(format!("restored from checkpoint {} (from {from})", c.metadata.checkpoint));
        report = Some(RestoreReport { checkpoint: c.metadata.checkpoint, from });
        // Every complete checkpoint up to the restored one takes part in retention.
        completed =
            storage.list().into_iter().filter(|&id| id <= c.metadata.checkpoint && storage.is_complete(id)).collect();
        restored = Some(Arc::new(c.state));
    }
    // Ids continue past every folder on disk, complete or not, so none is reused (nor the id
    // of a savepoint restored below).
    let mut first_id = storage.list().last().copied().unwrap_or(0) + 1;
    // Folders of checkpoints that never completed (a crash or a failover mid-way) are not
    // checkpoints, and their files can go; this start's ids still continue past them. (A
    // later start may reuse such an id: harmless, as sinks drop what a checkpoint after the
    // restored one left, and shared pages nothing refers to went above.) Only the folders go:
    // a complete checkpoint that resumed one of them may refer to its shared pages.
    for id in storage.list() {
        if !storage.is_complete(id) {
            storage.remove_folder(id);
        }
    }
    if restored.is_none() {
        if let Some(r) = restore_from_savepoint(job, notes)? {
            first_id = first_id.max(r.checkpoint + 1);
            recovery.restored = Some(r.checkpoint);
            report = Some(RestoreReport { checkpoint: r.checkpoint, from: "savepoint" });
            restored = Some(Arc::new(r));
        }
    }
    Ok(Recovered { storage, restored, recovery, first_id, completed, report })
}

/// Refuses a directory holding a checkpoint in another format version: falling back past
/// checkpoints another weir wrote would silently start over.
fn refuse_another_format(storage: &CheckpointStorage, shown: &str) -> Result<()> {
    if let Some((id, version)) = storage
        .list()
        .into_iter()
        .filter_map(|id| storage.format_version(id).map(|v| (id, v)))
        .find(|&(_, v)| v != FORMAT_VERSION)
    {
        return Err(Error::config(format!(
            "checkpoint directory {shown} holds checkpoint {id} in format version {version}, and this weir reads \
             version {FORMAT_VERSION}: resume with the weir that wrote it, or remove the directory to start afresh",
        )));
    }
    Ok(())
}

/// The checkpoint to restore: this process's copy of the newest one (local recovery), or the
/// newest that verifies on disk (with the damaged ones skipped), each announced before it is
/// read.
fn recovery_point(
    storage: &CheckpointStorage,
    local: Option<&LocalCopies>,
    job: &JobIdentity<'_>,
    lazy_pages: Option<&Arc<PageCache>>,
) -> Result<RecoveryPoint> {
    Ok(match local_copy(storage, local) {
        Some(c) => {
            (job.announce)(&format!(
                "restoring checkpoint {} of job '{}' from memory (this process's copy of {}: local recovery)",
                c.metadata.checkpoint,
                c.metadata.job,
                storage.checkpoint_dir(c.metadata.checkpoint).display()
            ));
            RecoveryPoint { checkpoint: Some(c), skipped: Vec::new() }
        }
        None => storage.latest_valid_reading(
            &|id| {
                if let Ok(m) = storage.metadata(id) {
                    (job.announce)(&restore_line("checkpoint", &storage.checkpoint_dir(id), &m));
                }
            },
            lazy_pages,
        )?,
    })
}

/// The state of the savepoint (or checkpoint) the job was told to start from, checked against
/// the job: every operator with state must exist (unless non-restored state is allowed); its
/// parallelism may differ (keyed state and in-flight data are redistributed as the tasks
/// restore).
pub(crate) fn restore_from_savepoint(job: &JobIdentity<'_>, notes: &mut Vec<String>) -> Result<Option<RestoredState>> {
    let Some((path, allow_non_restored)) = job.restore else { return Ok(None) };
    if !path.is_dir() {
        return Err(Error::config(format!(
            "{} is not a savepoint or checkpoint folder (savepoint-<n> or chk-<n>): {}",
            path.display(),
            if path.exists() { "not a folder" } else { "it does not exist" }
        )));
    }
    if !path.join(METADATA_FILE).exists() {
        return Err(Error::config(format!(
            "{} is not a savepoint or checkpoint folder: it has no _metadata (a savepoint-<n> or a completed chk-<n> \
             folder has)",
            path.display()
        )));
    }
    if let Ok(m) = read_metadata(path) {
        (job.announce)(&restore_line(&m.kind, path, &m));
    }
    let loaded = load_dir(path)?;
    let mut state = loaded.state;
    let missing: BTreeSet<String> = state
        .operators()
        .map(|(op, _)| PartName::parse(op).operator().to_string())
        .filter(|base| !job.operators.contains(base.as_str()))
        .collect();
    // A savepoint of another graph (rescaled, or changed) restores with its in-flight data
    // re-routed by each edge's rule.
    if loaded.metadata.fingerprint != job.fingerprint {
        state.set_graph_changed();
    }
    if !missing.is_empty() {
        let names = missing.iter().map(|m| format!("'{m}'")).collect::<Vec<_>>().join(", ");
        if !allow_non_restored {
            return Err(Error::config(format!(
                "{} has state for operators this job lacks: {names} (name the operators as before, or allow non-restored state to drop it)",
                path.display()
            )));
        }
        state.retain(|op| !missing.contains(PartName::parse(op).operator()));
        notes.push(format!("dropped state of operators this job lacks: {names}"));
    }
    notes.push(format!("restored from {} {} ({})", loaded.metadata.kind, loaded.metadata.checkpoint, path.display()));
    Ok(Some(state))
}
