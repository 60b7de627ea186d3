//! The registry of shared files (incremental checkpoints' pages, changelog bases): which ones
//! retention deleted in this attempt (a checkpoint referring to one fails), which ones written
//! for checkpoints that never completed were adopted by a completed one (they go with the last
//! checkpoint naming them), and which changelog bases checkpoints not yet completed refer to.
//! It removes files only through the storage, sparing what it is told is in use.
//!
//! May touch: nothing outside `checkpoint` (its storage).

use std::collections::{HashMap, HashSet};

use crate::checkpoint::storage::{is_base_name, parse_shared_name, CheckpointMetadata, CheckpointStorage, SharedFile};

/// What the coordinator knows of the shared files of its attempt.
#[derive(Default)]
pub(super) struct SharedFileRegistry {
    /// Shared files retention deleted in this attempt.
    deleted: HashSet<String>,
    /// Shared files written for checkpoints that never completed, which a completed one that
    /// resumed them refers to (retention deletes them with the last checkpoint naming them).
    adopted: HashSet<String>,
    /// Changelog bases materialized in the background that checkpoints not (yet) completed
    /// refer to, by checkpoint: they go with its files if it never completes (a base only a
    /// failed checkpoint adopted is adopted by none later: its chain ended with it).
    bases_of: HashMap<u64, Vec<String>>,
}

impl SharedFileRegistry {
    /// A task's part of checkpoint `id` refers to `shared`: the changelog bases among them no
    /// completed checkpoint adopted yet are noted as `id`'s.
    pub(super) fn note_bases(&mut self, id: u64, shared: &[SharedFile]) {
        let bases = shared.iter().filter(|s| is_base_name(&s.file) && !self.adopted.contains(&s.file));
        let bases: Vec<String> = bases.map(|s| s.file.clone()).collect();
        if !bases.is_empty() {
            self.bases_of.entry(id).or_default().extend(bases);
        }
    }

    /// The first of `shared` that retention already deleted: its writer read a page index
    /// older than a completion that retired the file (a race with retention).
    pub(super) fn deleted_among<'a>(&self, shared: &'a [SharedFile]) -> Option<&'a SharedFile> {
        shared.iter().find(|f| self.deleted.contains(&f.file))
    }

    /// Removes what checkpoint `id`, which did not complete, wrote, but the shared files
    /// `in_use` (by kept parts and checkpoints in progress) and the adopted ones.
    pub(super) fn drop_files(&mut self, storage: &CheckpointStorage, id: u64, mut in_use: HashSet<String>) {
        in_use.extend(self.adopted.iter().cloned());
        let deleted = storage.discard_sparing(id, &in_use);
        self.deleted.extend(deleted);
        for base in self.bases_of.remove(&id).unwrap_or_default() {
            if !in_use.contains(&base) && std::fs::remove_file(storage.dir().join(&base)).is_ok() {
                self.deleted.insert(base);
            }
        }
    }

    /// The shared files checkpoint `id` refers to that must be read back before it counts —
    /// those of kept parts (`kept`) and those written for checkpoints that did not complete
    /// (not among `completed`), unless adopted — and apart the latter, which it adopts once
    /// it completes.
    pub(super) fn unverified<'a>(
        &self,
        id: u64,
        metadata: &CheckpointMetadata,
        kept: impl Iterator<Item = &'a String>,
        completed: &[u64],
    ) -> (HashSet<String>, Vec<String>) {
        // Shared files of kept parts, written for a checkpoint that never completed, are read
        // back whole the first time a completed one refers to them.
        let mut unverified: HashSet<String> = kept.filter(|f| !self.adopted.contains(*f)).cloned().collect();
        // Shared files written for a checkpoint that did not complete, whichever: a task's
        // write may refer to a kept part the coordinator has since replaced by a newer failed
        // checkpoint's (checkpoint 3 referred to 4's kept pages after 5 failed; once 3 was no
        // longer pending nothing spared them, and dropping 4's files later damaged 3:
        // `weir simulate --job owned --mode unaligned --incremental --parallelism 4 --seeds
        // 90003`). They are read back now and adopted, as the current kept part's are.
        let foreign: Vec<String> = metadata
            .shared
            .iter()
            .filter(|s| {
                parse_shared_name(&s.file).is_some_and(|(written_by, _)| {
                    written_by != id && !completed.contains(&written_by) && !self.adopted.contains(&s.file)
                })
            })
            .map(|s| s.file.clone())
            .collect();
        unverified.extend(foreign.iter().cloned());
        (unverified, foreign)
    }

    /// The changelog bases `metadata` refers to that go into the object store with it: those
    /// neither adopted nor among `unverified` (which go anyway).
    pub(super) fn new_bases(&self, metadata: &CheckpointMetadata, unverified: &HashSet<String>) -> Vec<String> {
        let new = |f: &String| is_base_name(f) && !self.adopted.contains(f) && !unverified.contains(f);
        metadata.shared.iter().filter(|s| new(&s.file)).map(|s| s.file.clone()).collect()
    }

    /// Checkpoint `id` completed, adopting `foreign` shared files: the checkpoints in
    /// `completed` past `retained` go (sparing the files `in_use`).
    pub(super) fn retire(
        &mut self,
        storage: &CheckpointStorage,
        id: u64,
        foreign: Vec<String>,
        (completed, retained): (&mut Vec<u64>, usize),
        in_use: &HashSet<String>,
    ) {
        self.adopted.extend(foreign);
        self.bases_of.remove(&id);
        completed.push(id);
        let deleted = storage.retain(completed, retained, in_use);
        for f in &deleted {
            self.adopted.remove(f);
        }
        self.deleted.extend(deleted);
    }

    /// A completed checkpoint that resumed kept parts adopts what it refers to of `kept`.
    pub(super) fn adopt_referred<'a>(&mut self, metadata: &CheckpointMetadata, kept: impl Iterator<Item = &'a String>) {
        let kept: HashSet<&String> = kept.collect();
        let adopt = metadata.shared.iter().filter(|s| kept.contains(&s.file)).map(|s| s.file.clone());
        self.adopted.extend(adopt);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(file: &str) -> SharedFile {
        SharedFile { file: file.into(), bytes: 1, crc32c: 0 }
    }

    #[test]
    fn a_deleted_file_is_named_and_a_dropped_checkpoint_spares_what_is_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let storage = CheckpointStorage::for_job(dir.path(), "f");
        storage.prepare(3).unwrap();
        let mut registry = SharedFileRegistry::default();
        std::fs::create_dir_all(dir.path().join("shared")).unwrap();
        let [kept, gone] = ["shared/chk-3-task-0.pages", "shared/chk-3-task-1.pages"];
        for f in [kept, gone] {
            std::fs::write(dir.path().join(f), b"x").unwrap();
        }
        registry.drop_files(&storage, 3, HashSet::from([kept.to_string()]));
        assert!(dir.path().join(kept).exists(), "in use: spared");
        assert!(!dir.path().join(gone).exists(), "written for checkpoint 3 alone: gone");
        let refs = [shared(kept), shared(gone)];
        assert_eq!(registry.deleted_among(&refs).map(|s| s.file.as_str()), Some(gone));
    }
}
