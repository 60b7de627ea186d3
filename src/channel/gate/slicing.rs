//! Record slicing: with unaligned checkpoints, records are handed on in slices of about
//! [`SLICE_NS`] of work, timed on the job clock, so a priority barrier waits for one slice of
//! the task's work, not for a whole chunk of it.
//!
//! May touch: `context`.

/// How long a task works on records between two looks at its priority slots, and what it
/// has learnt about its cost per record. Measured on the job clock, so under simulation
/// (where the clock stands still while a task runs) slices are whole chunks, as before.
pub(super) struct RecordSlicing {
    pub(super) clock: crate::context::Clock,
    /// Records per slice, from the cost measured so far.
    pub(super) slice: usize,
    /// The cost of a record, nanoseconds, averaged over recent slices (×16 fixed point).
    pub(super) cost_x16: u64,
    /// Chunks handed on whole, untimed, since the last timed one.
    pub(super) untimed: u32,
}

/// The work between two looks at the priority slots: what a barrier may wait for at most,
/// whatever a record costs (a few microseconds, Flink's priority-event latency).
pub(super) const SLICE_NS: u64 = 20_000;

/// The work after which a poll gives its worker back even with records left in the chunk:
/// the other tasks of the worker (a source that must forward or republish a barrier, say)
/// wait for one poll, which must not be a chunk of slow records.
pub(super) const POLL_NS: u64 = 200_000;

/// A chunk that fits in one slice is timed one time in this many (reading the clock costs a
/// cheap record path a few percent).
pub(super) const TIME_ONE_CHUNK_IN: u32 = 32;

impl RecordSlicing {
    /// When a chunk of `len` entries is timed and sliced: the clock now, or `None` for a chunk
    /// of cheap records handed on whole.
    #[inline]
    pub(super) fn begin(&mut self, len: usize) -> Option<u64> {
        if self.slice < len || self.untimed >= TIME_ONE_CHUNK_IN {
            self.untimed = 0;
            Some(self.clock.now_ns())
        } else {
            self.untimed += 1;
            None
        }
    }

    /// A slice of `records` begun at `t0` was handed on: learns its cost, sizes the next slice,
    /// and returns the clock now (the next slice's start).
    #[inline]
    pub(super) fn slice_done(&mut self, records: usize, t0: u64) -> u64 {
        let now = self.clock.now_ns();
        let per = (now.saturating_sub(t0) * 16) / records.max(1) as u64;
        self.cost_x16 = if self.cost_x16 == 0 { per } else { (self.cost_x16 * 3 + per) / 4 };
        self.slice = ((SLICE_NS * 16) / self.cost_x16.max(1)).clamp(1, usize::MAX as u64) as usize;
        now
    }
}
