//! The checkpoints in flight: each one's barrier, the configuration it was triggered under
//! and its tasks' acknowledgements; the parts kept of the newest failed one (which later ones
//! may reuse); and the checkpoints aborted in this attempt, whose late writers' files go as
//! they come in. A completed checkpoint's statistics are made here, from its acknowledgements.
//!
//! May touch: `context` (the job clock), `metrics` (a checkpoint's statistics), `snapshot`
//! (barriers, modes); the tasks' acknowledgements.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use super::{Reply, SavepointRequest, TaskInfo};
use crate::checkpoint::storage::{CheckpointStats, PartReuse};
use crate::checkpoint::task::{TaskDone, TaskStats};
use crate::context::Clock;
use crate::snapshot::{Barrier, CheckpointMode};

/// One checkpoint in flight.
pub(super) struct Pending {
    pub(super) barrier: Barrier,
    pub(super) started_ns: u64,
    /// The configuration in force when it was triggered: interval, timeout, and how its
    /// barriers go (`None` for a savepoint: always aligned, whatever the mode).
    pub(super) interval_ns: u64,
    pub(super) timeout_ns: u64,
    pub(super) mode: Option<CheckpointMode>,
    pub(super) acks: HashMap<usize, TaskDone>,
    /// When each acknowledgement came.
    pub(super) acked_ns: HashMap<usize, u64>,
    pub(super) savepoint: Option<SavepointRequest>,
    /// Who asked for a checkpoint now and got this one.
    pub(super) requested: Vec<Reply<u64>>,
    /// The failed checkpoint whose parts were kept when this one was triggered, and the tasks
    /// whose parts they are.
    pub(super) resumes: Option<(u64, HashSet<usize>)>,
}

/// The parts the tasks had completed of the newest checkpoint that failed.
pub(super) struct KeptParts {
    pub(super) id: u64,
    pub(super) parts: HashMap<usize, TaskDone>,
}

impl KeptParts {
    /// The shared files the kept parts refer to.
    pub(super) fn shared(&self) -> impl Iterator<Item = &String> {
        self.parts.values().flat_map(|a| a.shared.iter().map(|s| &s.file))
    }
}

/// The checkpoints in flight, the kept parts, and the checkpoints aborted in this attempt.
#[derive(Default)]
pub(super) struct PendingSet {
    pending: BTreeMap<u64, Pending>,
    /// Checkpoints aborted in this attempt, and when: other tasks may still be writing their
    /// parts into the folder, so it is removed again as their late acknowledgements come in.
    aborted: BTreeMap<u64, u64>,
    /// The parts of the newest failed checkpoint, which later ones may reuse.
    kept: Option<KeptParts>,
}

impl PendingSet {
    pub(super) fn insert(&mut self, p: Pending) {
        self.pending.insert(p.barrier.id, p);
    }

    pub(super) fn get_mut(&mut self, id: u64) -> Option<&mut Pending> {
        self.pending.get_mut(&id)
    }

    pub(super) fn remove(&mut self, id: u64) -> Option<Pending> {
        self.pending.remove(&id)
    }

    pub(super) fn contains(&self, id: u64) -> bool {
        self.pending.contains_key(&id)
    }

    pub(super) fn len(&self) -> usize {
        self.pending.len()
    }

    /// Every checkpoint in flight, oldest first.
    pub(super) fn ids(&self) -> Vec<u64> {
        self.pending.keys().copied().collect()
    }

    /// Those older than `id`.
    pub(super) fn ids_before(&self, id: u64) -> Vec<u64> {
        self.pending.range(..id).map(|(k, _)| *k).collect()
    }

    /// Those past their timeout at `now`.
    pub(super) fn expired(&self, now: u64) -> Vec<u64> {
        let late = |p: &Pending| now.saturating_sub(p.started_ns) > p.timeout_ns;
        self.pending.iter().filter(|(_, p)| late(p)).map(|(k, _)| *k).collect()
    }

    /// Whether a savepoint is in flight.
    pub(super) fn savepoint_in_flight(&self) -> bool {
        self.pending.values().any(|p| p.savepoint.is_some())
    }

    /// Checkpoint `id` was aborted at `now`.
    pub(super) fn aborted(&mut self, id: u64, now: u64) {
        self.aborted.insert(id, now);
    }

    pub(super) fn was_aborted(&self, id: u64) -> bool {
        self.aborted.contains_key(&id)
    }

    /// Forgets the checkpoints aborted more than `timeout` before `now`: their writers have
    /// ended (or failed them) by then.
    pub(super) fn forget_aborted(&mut self, now: u64, timeout: u64) {
        self.aborted.retain(|_, at| now.saturating_sub(*at) <= timeout);
    }

    pub(super) fn aborted_ids(&self) -> Vec<u64> {
        self.aborted.keys().copied().collect()
    }

    pub(super) fn is_kept(&self, id: u64) -> bool {
        self.kept.as_ref().is_some_and(|k| k.id == id)
    }

    pub(super) fn kept(&self) -> Option<&KeptParts> {
        self.kept.as_ref()
    }

    /// The kept parts' checkpoint and tasks, which a checkpoint triggered now resumes.
    pub(super) fn resumes(&self) -> Option<(u64, HashSet<usize>)> {
        self.kept.as_ref().map(|k| (k.id, k.parts.keys().copied().collect()))
    }

    /// Keeps `new` in place of the parts kept so far, which it returns.
    pub(super) fn replace_kept(&mut self, new: Option<KeptParts>) -> Option<KeptParts> {
        std::mem::replace(&mut self.kept, new)
    }

    /// The kept parts, if older than `id` (which resumed them).
    pub(super) fn take_kept_before(&mut self, id: u64) -> Option<KeptParts> {
        self.kept.take_if(|k| k.id < id)
    }

    /// The shared files that checkpoints in flight and kept parts refer to.
    pub(super) fn shared_in_use(&self) -> HashSet<String> {
        let pending = self.pending.values().flat_map(|p| p.acks.values().flat_map(|a| a.shared.iter()));
        pending.map(|s| &s.file).chain(self.kept.iter().flat_map(KeptParts::shared)).cloned().collect()
    }

    /// The checkpoints in flight as the job's statistics show them.
    pub(super) fn rows<'a>(
        &'a self,
        clock: &'a Clock,
        sources: usize,
    ) -> impl ExactSizeIterator<Item = crate::metrics::CheckpointInProgress> + Clone + 'a {
        self.pending.values().map(move |p| crate::metrics::CheckpointInProgress {
            id: p.barrier.id,
            trigger_unix_ms: clock.epoch_ms_at(p.barrier.trigger_ns),
            acknowledged: p.acks.len(),
            tasks: sources,
            savepoint: p.savepoint.is_some(),
        })
    }
}

impl Pending {
    /// Why it expired: its timeout, and which of `tasks` had not finished their part (those
    /// that had are named by count: their parts are kept for the next one).
    pub(super) fn expiry_reason(&self, tasks: &[TaskInfo]) -> String {
        let missing: Vec<&str> =
            tasks.iter().filter(|t| !self.acks.contains_key(&t.index)).map(|t| t.name.as_str()).collect();
        const NAMED: usize = 4;
        let more = missing.len().saturating_sub(NAMED);
        format!(
            "expired after {:?}: {} of {} tasks had completed their part{}; still waiting for {}{}",
            Duration::from_nanos(self.timeout_ns),
            self.acks.len(),
            tasks.len(),
            if self.barrier.savepoint { "" } else { " (kept for the next checkpoint)" },
            missing.iter().take(NAMED).copied().collect::<Vec<_>>().join(", "),
            if more > 0 { format!(" and {more} more") } else { String::new() }
        )
    }

    /// Each task's part, when it resumed failed checkpoint `from` whose parts of the tasks
    /// `kept` were kept: reused, or why not.
    fn part_reuse(&self, tasks: &[TaskInfo], from: u64, kept: &HashSet<usize>) -> Vec<PartReuse> {
        tasks
            .iter()
            .map(|t| {
                let stats = &self.acks[&t.index].stats;
                let why_not = match () {
                    _ if stats.reused_from.is_some() => None,
                    _ if !kept.contains(&t.index) => {
                        Some(format!("it had not completed its part of checkpoint {from}"))
                    }
                    _ => Some(stats.not_reused.clone().unwrap_or_else(|| {
                        format!("it began writing before it heard that its part of checkpoint {from} was kept")
                    })),
                };
                PartReuse { task: t.index, name: t.name.clone(), reused: why_not.is_none(), why_not }
            })
            .collect()
    }

    /// Its statistics once every one of `tasks` acknowledged, at `now_ns`.
    pub(super) fn stats(&self, tasks: &[TaskInfo], clock: &Clock, now_ns: u64) -> CheckpointStats {
        let ms = |ns: u64| ns as f64 / 1e6;
        let max = |f: fn(&TaskStats) -> u64| self.acks.values().map(|a| f(&a.stats)).max().unwrap_or(0);
        let sum = |f: fn(&TaskStats) -> u64| self.acks.values().map(|a| f(&a.stats)).sum();
        let trigger_ns = self.barrier.trigger_ns;
        let mut channels: Vec<_> = self.acks.values().flat_map(|a| a.stats.channels.iter().cloned()).collect();
        channels.sort_by_key(|c| (c.task, c.channel));
        CheckpointStats {
            id: self.barrier.id,
            trigger_ms: ms(trigger_ns),
            trigger_unix_ms: clock.epoch_ms_at(trigger_ns),
            duration_ms: ms(now_ns.saturating_sub(trigger_ns)),
            start_delay_ms: ms(max(|s| s.start_delay_ns)),
            alignment_ms: ms(max(|s| s.alignment_ns)),
            sync_ms: ms(max(|s| s.sync_ns)),
            async_ms: ms(max(|s| s.async_ns)),
            state_bytes: sum(|s| s.state_bytes),
            written_bytes: sum(|s| s.written_bytes),
            inflight_bytes: sum(|s| s.inflight_bytes),
            interval_ms: ms(self.interval_ns),
            timeout_ms: ms(self.timeout_ns),
            mode: self.mode,
            channels,
            resumed_from: self.resumes.as_ref().map(|r| r.0),
            parts: self.resumes.as_ref().map_or_else(Vec::new, |(from, kept)| self.part_reuse(tasks, *from, kept)),
            upload_ms: None,
            tasks: tasks
                .iter()
                .map(|t| {
                    let s = &self.acks[&t.index].stats;
                    let acked = self.acked_ns.get(&t.index).copied().unwrap_or(now_ns);
                    crate::metrics::TaskCheckpointStats {
                        task: t.index,
                        name: t.name.clone(),
                        acknowledged_ms: ms(acked.saturating_sub(trigger_ns)),
                        start_delay_ms: ms(s.start_delay_ns),
                        alignment_ms: ms(s.alignment_ns),
                        sync_ms: ms(s.sync_ns),
                        async_ms: ms(s.async_ns),
                        state_bytes: s.state_bytes,
                        written_bytes: s.written_bytes,
                        inflight_bytes: s.inflight_bytes,
                    }
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::storage::FileDigest;

    fn pending(id: u64, started_ns: u64) -> Pending {
        Pending {
            barrier: Barrier { id, trigger_ns: started_ns, unaligned: false, savepoint: false },
            started_ns,
            interval_ns: 0,
            timeout_ns: 100,
            mode: Some(CheckpointMode::Aligned),
            acks: HashMap::new(),
            acked_ns: HashMap::new(),
            savepoint: None,
            requested: Vec::new(),
            resumes: None,
        }
    }

    fn done(shared: &str) -> TaskDone {
        let file = crate::checkpoint::storage::SharedFile { file: shared.into(), bytes: 1, crc32c: 0 };
        TaskDone {
            file: "t".into(),
            digest: FileDigest::default(),
            written_for: None,
            stats: TaskStats::default(),
            shared: vec![file],
        }
    }

    #[test]
    fn expiry_and_order_follow_the_ids_and_the_clock() {
        let mut set = PendingSet::default();
        set.insert(pending(3, 0));
        set.insert(pending(4, 50));
        assert_eq!((set.ids(), set.ids_before(4), set.len()), (vec![3, 4], vec![3], 2));
        assert_eq!(set.expired(120), vec![3], "past its timeout of 100 ns");
        let tasks = [TaskInfo { index: 0, name: "source".into(), is_source: true }];
        let reason = set.remove(3).unwrap().expiry_reason(&tasks);
        assert!(reason.contains("0 of 1 tasks") && reason.contains("still waiting for source"), "{reason}");
        set.aborted(3, 120);
        set.forget_aborted(200, 100);
        assert!(set.was_aborted(3));
        set.forget_aborted(221, 100);
        assert!(!set.was_aborted(3));
    }

    #[test]
    fn kept_parts_and_acknowledged_ones_are_in_use_until_replaced() {
        let mut set = PendingSet::default();
        let mut p = pending(5, 0);
        p.acks.insert(0, done("shared/a"));
        set.insert(p);
        let kept = KeptParts { id: 4, parts: HashMap::from([(1, done("shared/b"))]) };
        assert!(set.replace_kept(Some(kept)).is_none());
        assert_eq!(set.shared_in_use(), HashSet::from(["shared/a".to_string(), "shared/b".to_string()]));
        assert_eq!(set.resumes(), Some((4, HashSet::from([1]))));
        assert!(set.is_kept(4) && set.take_kept_before(4).is_none() && set.take_kept_before(5).is_some());
        assert_eq!(set.shared_in_use(), HashSet::from(["shared/a".to_string()]));
    }
}
