//! The [`BarrierAligner`]: which input channels of a task delivered the barrier of the
//! checkpoint being aligned (Carbone et al. 2015), with a model test against the plain
//! definition.
//!
//! May touch: `prng`, `snapshot`.

use crate::snapshot::Barrier;

/// What happened to a barrier at the aligner.
#[derive(Debug, PartialEq, Eq)]
pub enum Alignment {
    /// From a checkpoint already done or abandoned here: ignore it (and unblock its channel).
    Stale,
    /// Waiting for other channels.
    Waiting,
    /// A newer checkpoint's barrier abandoned the one being aligned: unblock every channel
    /// but this one.
    Superseded,
}

struct Pending {
    barrier: Barrier,
    first_ns: u64,
    /// Per channel: where its copy of the barrier was (its read position), once seen.
    seen: Vec<Option<u64>>,
}

/// Tracks which input channels of a task delivered the barrier of the checkpoint in progress.
/// Channels that ended count as delivered (their producer finished and sends no barrier).
pub struct BarrierAligner {
    channels: usize,
    pending: Option<Pending>,
    /// The newest checkpoint snapshotted or abandoned here.
    done: u64,
    /// Newer checkpoints than `done` that the coordinator aborted: their barriers are stale
    /// when they come, older ones' are not (few: forgotten as `done` passes them).
    aborted: Vec<u64>,
}

impl BarrierAligner {
    /// An aligner over `channels` input channels.
    pub fn new(channels: usize) -> Self {
        BarrierAligner { channels, pending: None, done: 0, aborted: Vec::new() }
    }

    /// Channel `channel` delivered `barrier` at `now_ns`, at read position `position`.
    pub fn on_barrier(&mut self, channel: usize, barrier: Barrier, now_ns: u64, position: u64) -> Alignment {
        assert!(channel < self.channels, "channel {channel} out of range");
        debug_assert!(self.pending.as_ref().is_none_or(|p| p.barrier.id > self.done));
        if barrier.id <= self.done || self.is_aborted(barrier.id) {
            return Alignment::Stale;
        }
        let mut result = Alignment::Waiting;
        match &self.pending {
            Some(p) if p.barrier.id == barrier.id => {}
            Some(p) if p.barrier.id > barrier.id => return Alignment::Stale,
            Some(p) => {
                let superseded = p.barrier.id;
                self.pass(superseded); // drops the pending alignment
                result = Alignment::Superseded;
            }
            None => {}
        }
        let p =
            self.pending.get_or_insert_with(|| Pending { barrier, first_ns: now_ns, seen: vec![None; self.channels] });
        p.seen[channel] = Some(position);
        result
    }

    /// If every channel delivered the pending barrier or ended: the barrier, and when its
    /// first copy arrived. The aligner is then ready for the next checkpoint.
    pub fn complete(&mut self, ended: impl Fn(usize) -> bool) -> Option<(Barrier, u64)> {
        let p = self.pending.as_ref()?;
        if (0..self.channels).all(|i| p.seen[i].is_some() || ended(i)) {
            let p = self.pending.take().expect("checked");
            self.pass(p.barrier.id);
            return Some((p.barrier, p.first_ns));
        }
        None
    }

    /// The checkpoint being aligned, and when its first barrier arrived.
    pub fn pending(&self) -> Option<(Barrier, u64)> {
        self.pending.as_ref().map(|p| (p.barrier, p.first_ns))
    }

    /// The newest checkpoint snapshotted or abandoned here: its barriers and older ones are
    /// stale.
    pub fn done(&self) -> u64 {
        self.done
    }

    /// The channels that delivered the barrier being aligned.
    pub fn delivered(&self) -> Vec<usize> {
        self.pending.as_ref().map_or_else(Vec::new, |p| (0..self.channels).filter(|&i| p.seen[i].is_some()).collect())
    }

    /// Gives up aligning (the checkpoint switches to unaligned here): the barrier, when it
    /// first arrived, and the position of each channel's barrier seen so far.
    pub fn take_pending(&mut self) -> Option<(Barrier, u64, Vec<Option<u64>>)> {
        let p = self.pending.take()?;
        self.pass(p.barrier.id);
        Some((p.barrier, p.first_ns, p.seen))
    }

    /// The coordinator aborted `id`: returns whether it was being aligned here. Only `id`'s
    /// barriers become stale: an older checkpoint still on its way here may complete.
    pub fn abort(&mut self, id: u64) -> bool {
        if self.pending.as_ref().is_some_and(|p| p.barrier.id == id) {
            self.pass(id);
            return true;
        }
        if id > self.done && !self.is_aborted(id) {
            self.aborted.push(id);
        }
        false
    }

    /// Whether the coordinator aborted `id`, a checkpoint newer than any done here.
    pub fn is_aborted(&self, id: u64) -> bool {
        self.aborted.contains(&id)
    }

    /// Checkpoint `id` went on here without aligning (unaligned, or superseded): its barriers
    /// and older ones are stale. Drops an alignment of an older one in progress.
    pub fn pass(&mut self, id: u64) {
        if self.pending.as_ref().is_some_and(|p| p.barrier.id <= id) {
            self.pending = None;
        }
        self.done = self.done.max(id);
        let done = self.done;
        self.aborted.retain(|&a| a > done);
    }
}

#[cfg(test)]
impl BarrierAligner {
    fn on_barrier_at(&mut self, channel: usize, barrier: Barrier, now_ns: u64) -> Alignment {
        self.on_barrier(channel, barrier, now_ns, 0)
    }
}

// Their fields are closures, shared internals or whole state: a name says enough.
crate::debug_as_name!([] BarrierAligner);

#[cfg(test)]
mod tests {
    use super::*;

    fn b(id: u64) -> Barrier {
        Barrier { id, trigger_ns: 0, unaligned: false, savepoint: false }
    }

    #[test]
    fn aligns_over_all_live_channels() {
        let mut a = BarrierAligner::new(3);
        assert_eq!(a.on_barrier_at(0, b(1), 10), Alignment::Waiting);
        assert!(a.complete(|_| false).is_none());
        assert_eq!(a.on_barrier_at(2, b(1), 20), Alignment::Waiting);
        assert!(a.complete(|_| false).is_none());
        // Channel 1 ended: it counts as aligned.
        assert_eq!(a.complete(|i| i == 1), Some((b(1), 10)));
        assert_eq!(a.on_barrier_at(1, b(1), 30), Alignment::Stale, "a late copy of a done barrier");
    }

    /// The coordinator's abort notices travel beside the data, so a task can hear that a newer
    /// checkpoint failed while an older one's barriers are still on the way: the older one
    /// goes on (it was left unacknowledged at this task for ever, its checkpoint stuck until it
    /// expired: `weir simulate --job timers --mode aligned --parallelism 3 --seeds 404`).
    #[test]
    fn an_abort_of_a_newer_checkpoint_leaves_older_ones_be() {
        let mut a = BarrierAligner::new(2);
        a.on_barrier_at(0, b(1), 0);
        assert!(!a.abort(2), "2 is not being aligned");
        assert_eq!(a.on_barrier_at(1, b(1), 1), Alignment::Waiting);
        assert_eq!(a.complete(|_| false), Some((b(1), 0)));
        assert_eq!(a.on_barrier_at(0, b(2), 2), Alignment::Stale, "2 was aborted");
        assert_eq!(a.on_barrier_at(0, b(3), 3), Alignment::Waiting);
        // Heard before any barrier of the older one arrived.
        let mut a = BarrierAligner::new(1);
        a.abort(5);
        assert_eq!(a.on_barrier_at(0, b(4), 0), Alignment::Waiting);
        assert_eq!(a.complete(|_| false), Some((b(4), 0)));
        assert_eq!(a.on_barrier_at(0, b(5), 1), Alignment::Stale);
        assert_eq!(a.on_barrier_at(0, b(6), 2), Alignment::Waiting);
        assert_eq!(a.complete(|_| false), Some((b(6), 2)));
        assert!(!a.is_aborted(5));
    }

    #[test]
    fn newer_barriers_supersede_and_aborts_reset() {
        let mut a = BarrierAligner::new(2);
        a.on_barrier_at(0, b(1), 0);
        assert_eq!(a.on_barrier_at(1, b(2), 5), Alignment::Superseded);
        assert_eq!(a.on_barrier_at(0, b(1), 6), Alignment::Stale);
        assert_eq!(a.on_barrier_at(0, b(2), 7), Alignment::Waiting);
        assert_eq!(a.complete(|_| false), Some((b(2), 5)));
        a.on_barrier_at(0, b(3), 8);
        assert!(a.abort(3));
        assert!(a.complete(|_| false).is_none());
        assert_eq!(a.on_barrier_at(1, b(3), 9), Alignment::Stale);
    }

    /// Model test: random barrier orders over several channels against a simple model (the
    /// set of channels that delivered each id).
    #[test]
    fn random_schedules_match_a_model() {
        let mut rng = crate::prng::Prng::new(7);
        let mut next = move || rng.next_u64() >> 33;
        for _ in 0..2000 {
            let channels = 1 + (next() % 4) as usize;
            let mut a = BarrierAligner::new(channels);
            // Each channel delivers barriers 1, 2, 3 in order; interleave channels randomly.
            let mut progress = vec![0u64; channels];
            let mut completed = Vec::new();
            while progress.iter().any(|&p| p < 3) {
                let ch = (next() % channels as u64) as usize;
                if progress[ch] == 3 {
                    continue;
                }
                progress[ch] += 1;
                a.on_barrier_at(ch, b(progress[ch]), 0);
                if let Some((bar, _)) = a.complete(|_| false) {
                    // Model: complete only when every channel has delivered this id.
                    assert!(progress.iter().all(|&p| p >= bar.id), "completed {} early: {progress:?}", bar.id);
                    completed.push(bar.id);
                }
            }
            assert!(completed.windows(2).all(|w| w[0] < w[1]), "{completed:?}");
            assert_eq!(completed.last(), Some(&3), "the last barrier always completes");
        }
    }
}
