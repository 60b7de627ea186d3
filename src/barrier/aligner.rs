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
}

impl BarrierAligner {
    /// An aligner over `channels` input channels.
    pub fn new(channels: usize) -> Self {
        BarrierAligner { channels, pending: None, done: 0 }
    }

    /// Channel `channel` delivered `barrier` at `now_ns`, at read position `position`.
    pub fn on_barrier(&mut self, channel: usize, barrier: Barrier, now_ns: u64, position: u64) -> Alignment {
        assert!(channel < self.channels, "channel {channel} out of range");
        if barrier.id <= self.done {
            return Alignment::Stale;
        }
        let mut result = Alignment::Waiting;
        match &self.pending {
            Some(p) if p.barrier.id == barrier.id => {}
            Some(p) if p.barrier.id > barrier.id => return Alignment::Stale,
            Some(p) => {
                self.done = p.barrier.id;
                self.pending = None;
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
            self.done = p.barrier.id;
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
        self.done = p.barrier.id;
        Some((p.barrier, p.first_ns, p.seen))
    }

    /// The coordinator aborted `id`: returns whether it was being aligned here.
    pub fn abort(&mut self, id: u64) -> bool {
        if self.pending.as_ref().is_some_and(|p| p.barrier.id == id) {
            self.pending = None;
            self.done = self.done.max(id);
            return true;
        }
        self.done = self.done.max(id);
        false
    }
}

#[cfg(test)]
impl BarrierAligner {
    fn on_barrier_at(&mut self, channel: usize, barrier: Barrier, now_ns: u64) -> Alignment {
        self.on_barrier(channel, barrier, now_ns, 0)
    }
}

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
