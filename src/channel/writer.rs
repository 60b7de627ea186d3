//! The producer side: [`OutChannel`] (one ring) and [`ChannelWriter`] (all rings of one edge
//! from one upstream subtask, with the partitioner).
//!
//! With an aligned-checkpoint timeout, a ring also keeps the in-band barriers it holds that
//! the consumer has not read: once a barrier's checkpoint has run past the timeout (counted
//! from its trigger), the producer republishes it in the priority slot, so it overtakes the
//! backlog and what is queued ahead of it becomes the checkpoint's in-flight data (Flink's
//! timeout-able aligned barriers, FLIP-76 follow-ups).
//!
//! A producer whose ring is full holds entries staged that come before a priority barrier:
//! they are in flight for its checkpoint too. Their encoding travels with the barrier, which
//! names the ring's write position, so the consumer's capture takes what the ring holds at
//! that instant plus what came with the barrier, and never waits for the slow consumer to make
//! room (Flink persists a task's output buffers for the same reason).

use std::sync::Arc;

use rtrb::Producer;

use super::{Captured, Entry, Parker, Partitioner, PriorityBarrier, Slot};
use crate::collector::Collector;
use crate::error::Result;
use crate::persist::Persist;
use crate::record::{Record, Timestamp};
use crate::snapshot::{Barrier, CheckpointNotice, TaskSnapshot};

/// The producer end of one ring, with its overflow stage.
///
/// Records move into the ring (an owned `String` crosses without a copy of its text); a
/// `Copy` record moves as its bytes.
pub(crate) struct OutChannel<T> {
    producer: Producer<Slot<T>>,
    /// Entries that did not fit, still to be written, in order.
    staged: Stage<T>,
    consumer: Arc<Parker>,
    /// Entries published so far.
    written: u64,
    /// The priority slot for unaligned barriers, and barriers waiting for room in it.
    priority: Option<Producer<PriorityBarrier>>,
    priority_staged: std::collections::VecDeque<PriorityBarrier>,
    /// With an aligned-checkpoint timeout: the clock and the timeout.
    expiry: Option<BarrierExpiry>,
    /// In-band barriers written and maybe not yet read, with their sequence numbers.
    queued: Vec<(Barrier, u64)>,
}

/// When a producer republishes a queued in-band barrier: the job clock and the aligned-
/// checkpoint timeout, counted from the barrier's trigger.
#[derive(Clone)]
pub(crate) struct BarrierExpiry {
    pub(crate) clock: crate::context::Clock,
    /// The aligned-checkpoint timeout, which a running job may change; `u64::MAX`: none.
    pub(crate) timeout_ns: Arc<std::sync::atomic::AtomicU64>,
}

impl BarrierExpiry {
    /// An expiry after `timeout_ns` (tests).
    #[cfg(test)]
    pub(crate) fn after(clock: crate::context::Clock, timeout_ns: u64) -> Self {
        BarrierExpiry { clock, timeout_ns: Arc::new(timeout_ns.into()) }
    }
}

impl<T: Persist> OutChannel<T> {
    pub(crate) fn new(producer: Producer<Slot<T>>, consumer: Arc<Parker>) -> Self {
        OutChannel {
            producer,
            staged: Stage::default(),
            consumer,
            written: 0,
            priority: None,
            priority_staged: std::collections::VecDeque::new(),
            expiry: None,
            queued: Vec::new(),
        }
    }

    /// Republish in-band barriers still queued once their checkpoint passed the timeout.
    pub(crate) fn with_expiry(mut self, expiry: Option<BarrierExpiry>) -> Self {
        self.expiry = expiry;
        self
    }

    pub(crate) fn with_priority(mut self, slot: Producer<PriorityBarrier>) -> Self {
        self.priority = Some(slot);
        self
    }

    /// The write sequence number: entries written so far, staged ones included (they were
    /// produced before anything written after them).
    pub(crate) fn seq(&self) -> u64 {
        self.written + self.staged.len() as u64
    }

    /// Publishes an unaligned barrier in the priority slot, ahead of everything in the ring,
    /// at the ring's write position and carrying what is staged (see the module doc).
    pub(crate) fn write_priority(&mut self, barrier: Barrier) {
        let pb = PriorityBarrier { barrier, seq: self.written, staged: carried(self.staged.live()) };
        self.priority_staged.push_back(pb);
        self.flush_priority();
    }

    fn flush_priority(&mut self) -> bool {
        let Some(slot) = self.priority.as_mut() else {
            unreachable!("unaligned barriers need a channel with a priority slot");
        };
        while let Some(pb) = self.priority_staged.pop_front() {
            if let Err(rtrb::PushError::Full(pb)) = slot.push(pb) {
                self.priority_staged.push_front(pb);
                return false;
            }
            self.consumer.notify();
        }
        true
    }

    #[inline]
    fn has_staged(&self) -> bool {
        !self.staged.is_empty()
    }

    /// Free slots, refreshing the cached view only when it is too small.
    #[inline]
    fn room_for(&self, wanted: usize) -> usize {
        if self.producer.cached_slots() >= wanted {
            wanted
        } else {
            wanted.min(self.producer.slots())
        }
    }

    /// Publishes as many records as fit and stages the rest, taking them all out of
    /// `records` (by move).
    #[inline]
    pub(crate) fn write_records(&mut self, records: &mut Vec<T>) {
        if records.is_empty() {
            return;
        }
        let mut rest = records.drain(..);
        if !self.has_staged() {
            let n = self.room_for(rest.len());
            if n > 0 {
                let chunk = self.producer.write_chunk_uninit(n).expect("n free slots were checked");
                let filled = chunk.fill_from_iter(rest.by_ref().take(n).map(|r| Slot::new(Entry::Record(r))));
                debug_assert_eq!(filled, n);
                self.written += n as u64;
                self.consumer.notify();
            }
        }
        self.staged.extend(rest);
    }

    /// Publishes one control entry (after anything staged).
    pub(crate) fn write_entry(&mut self, entry: Entry<T>) {
        if let Entry::Barrier(b) = &entry {
            if self.expiry.is_some() && !b.unaligned && !b.savepoint {
                self.queued.push((*b, self.seq()));
            }
        }
        self.staged.push(entry);
        self.flush();
    }

    /// Forgets queued barriers the consumer has read, and republishes in the priority slot
    /// those whose checkpoint has run past the timeout. (Runs at every flush while a barrier
    /// is queued, so it works in place.)
    #[cold]
    fn expire_queued(&mut self) {
        let Some(expiry) = &self.expiry else { return };
        // What the consumer has read: everything written but what is still in the ring.
        let in_ring = (self.producer.buffer().capacity() - self.producer.slots()) as u64;
        let read = self.written - in_ring;
        let (now, timeout) = (expiry.clock.now_ns(), expiry.timeout_ns.load(std::sync::atomic::Ordering::Relaxed));
        let OutChannel { staged, written, queued, priority_staged, .. } = self;
        let before_republishing = priority_staged.len();
        // Positions of the later queued barriers move back by one for each one taken out of
        // the stage before them.
        let mut removed = 0;
        queued.retain_mut(|(barrier, seq)| {
            *seq -= removed;
            if read > *seq {
                return false;
            }
            if now.saturating_sub(barrier.trigger_ns) < timeout {
                return true;
            }
            let barrier = Barrier { unaligned: true, ..*barrier };
            let pb = match seq.checked_sub(*written) {
                // Still staged: its in-band copy would only reach the consumer stale (and cost
                // it a poll each, which piles up when checkpoints come fast), so it goes; the
                // priority copy carries what is staged before it.
                Some(before) => {
                    let before = before as usize;
                    let copy = staged.remove(before);
                    debug_assert!(
                        matches!(copy, Entry::Barrier(b) if b.id == barrier.id),
                        "a queued barrier's position"
                    );
                    removed += 1;
                    PriorityBarrier { barrier, seq: *written, staged: carried(&staged.live()[..before]) }
                }
                // In the ring: it names its own position.
                None => PriorityBarrier { barrier, seq: *seq, staged: Captured::default() },
            };
            priority_staged.push_back(pb);
            false
        });
        if priority_staged.len() > before_republishing {
            self.flush_priority();
        }
    }

    /// The ring's free slots, to be written one record at a time by the key-by path
    /// ([`DirectSlots`]): none while entries are staged (they go first).
    #[inline]
    fn direct(&mut self) -> DirectSlots<T> {
        let room = if self.staged.is_empty() { self.producer.slots() } else { 0 };
        if room == 0 {
            return DirectSlots::NONE;
        }
        let mut chunk = self.producer.write_chunk_uninit(room).expect("the free slots were just counted");
        let (a, b) = chunk.as_mut_slices();
        // Dropped without a commit: nothing is published; the slots stay the next `room` ones
        // after the ring's tail until `publish_direct` commits those written.
        DirectSlots { first: a.as_mut_ptr(), first_len: a.len(), second: b.as_mut_ptr(), room, filled: 0 }
    }

    /// Publishes the slots [`DirectSlots`] wrote, or stages `record` when none is left.
    #[inline]
    fn push_direct(&mut self, slots: &mut DirectSlots<T>, record: T) {
        if slots.filled == slots.room {
            self.staged.push(Entry::Record(record));
            return;
        }
        let i = slots.filled;
        // SAFETY: `i < room`: `direct` found `room` free slots after the ring's tail (`first_len`
        // at `first`, the rest at `second`, as the chunk's `as_mut_slices` gave them) and nothing
        // has moved the tail since (`&mut self`; the consumer reads only up to the tail), and
        // the ring's buffer never moves. So the slot is in bounds, free, and written once.
        unsafe {
            let slot = if i < slots.first_len { slots.first.add(i) } else { slots.second.add(i - slots.first_len) };
            (*slot).write(Slot::new(Entry::Record(record)));
        }
        slots.filled += 1;
    }

    /// Publishes the slots written through `slots`.
    fn publish_direct(&mut self, slots: &DirectSlots<T>) {
        debug_assert!(slots.filled <= slots.room);
        if slots.filled == 0 {
            return;
        }
        let chunk = self.producer.write_chunk_uninit(slots.filled).expect("the slots were free and still are");
        // SAFETY: the chunk is the first `filled` slots after the tail, the ones `push_direct`
        // wrote in order (the tail has not moved since `direct`), so all are initialised.
        unsafe { chunk.commit_all() };
        self.written += slots.filled as u64;
        self.consumer.notify();
    }

    /// Publishes staged entries that fit. Returns `true` when none are left.
    pub(crate) fn flush(&mut self) -> bool {
        if !self.queued.is_empty() {
            self.expire_queued();
        }
        if !self.priority_staged.is_empty() && !self.flush_priority() {
            return false;
        }
        if !self.has_staged() {
            return true;
        }
        let n = self.room_for(self.staged.len());
        if n > 0 {
            self.staged.move_front_into(&mut self.producer, n);
            self.written += n as u64;
            self.consumer.notify();
        }
        self.staged.is_empty()
    }

    /// Entries published so far.
    pub(crate) fn written(&self) -> u64 {
        self.written
    }
}

/// The data among staged entries, encoded to travel with a priority barrier: records and
/// watermarks (another barrier or an end is not data).
fn carried<T: Persist>(staged: &[Slot<T>]) -> Captured {
    let mut carried = Captured::default();
    for e in staged.iter().filter(|e| matches!(***e, Entry::Record(_) | Entry::Watermark(_))) {
        carried.push(e);
    }
    carried
}

/// Entries a producer holds until its ring has room, in order. Entries moved into the ring
/// leave the front by an offset (their slots are forgotten, never dropped: a [`Slot`] does not
/// drop its entry), so a flush that moves some of a long stage does not shift the rest down
/// (that shift made a large stage drained a little at a time quadratic); the forgotten front is
/// reclaimed when the stage empties, or in one shift once it is half the vector.
struct Stage<T> {
    slots: Vec<Slot<T>>,
    /// The first live entry: those before it were moved into the ring.
    from: usize,
}

impl<T> Default for Stage<T> {
    fn default() -> Self {
        Stage { slots: Vec::new(), from: 0 }
    }
}

impl<T> Stage<T> {
    #[inline]
    fn len(&self) -> usize {
        self.slots.len() - self.from
    }
    #[inline]
    fn is_empty(&self) -> bool {
        self.slots.len() == self.from
    }
    /// The live entries, in order.
    fn live(&self) -> &[Slot<T>] {
        &self.slots[self.from..]
    }
    /// Makes room at the back by dropping the forgotten front once it is half the vector.
    #[inline]
    fn reclaim(&mut self) {
        if self.from > 0 && self.from * 2 >= self.slots.len() {
            // The forgotten slots are not dropped (a `Slot` never drops its entry).
            self.slots.drain(..self.from);
            self.from = 0;
        }
    }
    #[inline]
    fn push(&mut self, entry: Entry<T>) {
        self.reclaim();
        self.slots.push(Slot::new(entry));
    }
    #[inline]
    fn extend(&mut self, records: impl Iterator<Item = T>) {
        self.reclaim();
        self.slots.extend(records.map(|r| Slot::new(Entry::Record(r))));
    }
    /// Takes out live entry `i`.
    fn remove(&mut self, i: usize) -> Entry<T> {
        std::mem::ManuallyDrop::into_inner(self.slots.remove(self.from + i))
    }

    /// Moves the first `n` live entries into `n` free slots of the ring as one copy of their
    /// bytes (a move: the stage forgets them). The key-by path stages what does not fit, so
    /// this is its hot path under backpressure; an element-wise move cost it ~10%.
    #[inline]
    fn move_front_into(&mut self, producer: &mut Producer<Slot<T>>, n: usize) {
        assert!(n <= self.len(), "moving more entries than are staged");
        let mut chunk = producer.write_chunk_uninit(n).expect("n free slots were checked");
        let (first, second) = chunk.as_mut_slices();
        debug_assert_eq!(first.len() + second.len(), n);
        // SAFETY: the stage holds at least `n` live entries from `from` (asserted) and the
        // chunk's two slices are `n` uninitialised slots in all, distinct memory from the
        // vector's; a ring slot (`MaybeUninit<Slot<T>>`, `repr(transparent)`) has the layout of
        // a stage slot. Copying the bytes moves the entries into the ring; advancing `from`
        // past them makes the stage forget them (a `Slot` is never dropped by the vector), so
        // each entry is owned exactly once (by the ring, once committed). Nothing between the
        // copies and the commit can panic.
        unsafe {
            let src = self.slots.as_ptr().add(self.from);
            std::ptr::copy_nonoverlapping(src, first.as_mut_ptr().cast::<Slot<T>>(), first.len());
            std::ptr::copy_nonoverlapping(src.add(first.len()), second.as_mut_ptr().cast::<Slot<T>>(), second.len());
            chunk.commit_all();
        }
        self.from += n;
        if self.from == self.slots.len() {
            // Every entry moved: the forgotten slots are not dropped.
            self.slots.clear();
            self.from = 0;
        }
    }
}

impl<T> Drop for Stage<T> {
    /// Drops the entries still staged (a [`Slot`] never drops its own).
    fn drop(&mut self) {
        let from = self.from;
        self.slots.drain(from..).for_each(|s| drop(std::mem::ManuallyDrop::into_inner(s)));
    }
}

/// One ring's free slots for a batch of the key-by path (raw pointers, so the writer keeps
/// them in a vector it reuses: a batch allocates nothing): records go into them in order, the
/// overflow into the stage behind them, and [`OutChannel::publish_direct`] makes the written
/// slots visible to the consumer at once.
struct DirectSlots<T> {
    /// The free slots' two runs: `first_len` at `first`, the rest at `second`.
    first: *mut std::mem::MaybeUninit<Slot<T>>,
    first_len: usize,
    second: *mut std::mem::MaybeUninit<Slot<T>>,
    /// Slots free, and written so far (the first `filled`).
    room: usize,
    filled: usize,
}

impl<T> DirectSlots<T> {
    const NONE: Self =
        DirectSlots { first: std::ptr::null_mut(), first_len: 0, second: std::ptr::null_mut(), room: 0, filled: 0 };
}

// SAFETY: the pointers are only followed by the writer that made them, on its own thread,
// within one batch; between batches the vector holds stale values that are never followed
// (each batch refills it from `direct`).
unsafe impl<T: Send> Send for DirectSlots<T> {}

/// All rings of one edge leaving one upstream subtask: a [`Collector`] that partitions.
pub(crate) struct ChannelWriter<T, H> {
    outs: Vec<OutChannel<T>>,
    partitioner: Partitioner<H>,
    /// A broadcast's copy of each batch for the rings but the last (kept for its allocation).
    copy: Vec<T>,
    /// The key-by path's free slots per ring during a batch (kept for its allocation).
    direct: Vec<DirectSlots<T>>,
    /// The producing subtask's live figures: records sent, counted per batch.
    sent: Option<std::sync::Arc<crate::metrics::OperatorMetrics>>,
}

impl<T: Record, H: Fn(&T) -> u64 + Send> ChannelWriter<T, H> {
    pub(crate) fn new(outs: Vec<OutChannel<T>>, partitioner: Partitioner<H>) -> Self {
        assert!(!outs.is_empty(), "an edge has at least one downstream subtask");
        if matches!(partitioner, Partitioner::Forward) {
            assert_eq!(outs.len(), 1, "a forward writer has exactly one ring");
        }
        if let Partitioner::KeyBy { router, .. } = &partitioner {
            // The key-by path indexes the rings by the router's subtask unchecked.
            assert!(router.parallelism() <= outs.len(), "a key group routed to a ring this edge lacks");
        }
        ChannelWriter { outs, partitioner, copy: Vec::new(), direct: Vec::new(), sent: None }
    }

    /// Counts what it writes as records sent by the subtask of `metrics`.
    pub(crate) fn counting_into(mut self, metrics: std::sync::Arc<crate::metrics::OperatorMetrics>) -> Self {
        self.sent = Some(metrics);
        self
    }

    /// Entries published so far over all rings.
    #[allow(dead_code)]
    pub(crate) fn written(&self) -> u64 {
        self.outs.iter().map(OutChannel::written).sum()
    }

    fn flush_all(&mut self) -> bool {
        let mut all = true;
        for o in &mut self.outs {
            all &= o.flush();
        }
        all
    }
}

impl<T: Record, H: Fn(&T) -> u64 + Send> Collector<T> for ChannelWriter<T, H> {
    #[inline]
    fn batch(&mut self, records: &mut Vec<T>) -> Result<()> {
        if let Some(m) = &self.sent {
            m.sent(records.len());
        }
        match &mut self.partitioner {
            Partitioner::Forward => self.outs[0].write_records(records),
            Partitioner::Rebalance { next } => {
                let i = *next;
                *next = (i + 1) % self.outs.len();
                self.outs[i].write_records(records);
            }
            Partitioner::Broadcast => {
                // The one place a record is duplicated on the ring path: every ring but the
                // last gets a clone, the last gets the records themselves.
                let (last, others) = self.outs.split_last_mut().expect("an edge has a ring");
                for o in others {
                    self.copy.extend_from_slice(records);
                    o.write_records(&mut self.copy);
                }
                last.write_records(records);
            }
            Partitioner::KeyBy { hash, router } => {
                // Each record moves straight into its ring's free slots, published once per
                // batch and ring; only what does not fit is staged (it was all staged, then
                // copied into the rings: a second copy of every record).
                let (outs, direct) = (&mut self.outs, &mut self.direct);
                direct.clear();
                direct.extend(outs.iter_mut().map(OutChannel::direct));
                let (outs_len, direct_len) = (outs.len(), direct.len());
                let (out_rings, slots) = (outs.as_mut_ptr(), direct.as_mut_ptr());
                crate::collector::move_each(records, |r, _| {
                    let to = router.subtask(hash(&r));
                    debug_assert!(to < outs_len && to < direct_len);
                    // SAFETY: the router's subtasks are below `outs.len()` (asserted in `new`),
                    // and `direct` has one entry per ring (just refilled); the two vectors are
                    // distinct and neither is resized in this loop.
                    unsafe { (*out_rings.add(to)).push_direct(&mut *slots.add(to), r) };
                });
                for (o, d) in outs.iter_mut().zip(direct.iter()) {
                    o.publish_direct(d);
                }
                self.flush_all();
            }
        }
        debug_assert!(records.is_empty(), "a writer takes every record");
        Ok(())
    }

    fn watermark(&mut self, watermark: Timestamp) -> Result<()> {
        for o in &mut self.outs {
            o.write_entry(Entry::Watermark(watermark));
        }
        Ok(())
    }

    fn end(&mut self) -> Result<()> {
        for o in &mut self.outs {
            o.write_entry(Entry::End);
        }
        Ok(())
    }

    fn drain(&mut self) -> Result<bool> {
        Ok(self.flush_all())
    }

    fn barrier(&mut self, barrier: Barrier, _snapshot: &mut TaskSnapshot) -> Result<()> {
        for o in &mut self.outs {
            if barrier.unaligned {
                o.write_priority(barrier);
            } else {
                o.write_entry(Entry::Barrier(barrier));
            }
        }
        Ok(())
    }

    fn notify(&mut self, _notice: CheckpointNotice) -> Result<()> {
        // Notices reach every task from the coordinator; they do not travel on rings.
        Ok(())
    }
}
