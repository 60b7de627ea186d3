//! The consumer side: [`ChannelReader`] (one ring) and [`InputGate`] (all rings that feed one
//! logical input of a subtask), which merges them, tracks the input's watermark as the minimum
//! over its live channels, reports end of stream once every channel has ended, and hands a
//! checkpoint barrier to the task (blocking its channel while the task aligns).
//!
//! Beside the hot path, in files of their own: [`capture`] (the in-flight data of unaligned
//! checkpoints, adaptive alignment's deferral, and the replay of restored in-flight data) and
//! [`slicing`] (records handed on in slices short enough for a priority barrier).
//!
//! May touch: `collector`, `context`, `error`, `metrics` (how full its rings are),
//! `persist`, `record`, `snapshot`.

mod capture;
mod slicing;

use std::sync::Arc;

use rtrb::Consumer;

use super::{Entry, Parker, PriorityBarrier, Slot};
use crate::collector::Collector;
use crate::error::Result;
use crate::persist::Persist;
use crate::record::Timestamp;
use crate::snapshot::Barrier;

use capture::Capture;
pub(crate) use capture::Captured;
use slicing::{RecordSlicing, POLL_NS, TIME_ONE_CHUNK_IN};

/// The consumer end of one ring.
pub(crate) struct ChannelReader<T> {
    consumer: Consumer<Slot<T>>,
    producer: Arc<Parker>,
    /// Entries consumed so far: this channel's read sequence number.
    read: u64,
    priority: Option<Consumer<PriorityBarrier>>,
}

impl<T> ChannelReader<T> {
    pub(crate) fn new(consumer: Consumer<Slot<T>>, producer: Arc<Parker>) -> Self {
        ChannelReader { consumer, producer, read: 0, priority: None }
    }

    pub(crate) fn with_priority(mut self, slot: Consumer<PriorityBarrier>) -> Self {
        self.priority = Some(slot);
        self
    }

    /// An unaligned barrier waiting in the priority slot, taken out.
    #[inline]
    fn take_priority(&mut self) -> Option<PriorityBarrier> {
        take_priority(&mut self.priority)
    }
}

impl<T> Drop for ChannelReader<T> {
    /// Drops the entries left in the ring (a [`Slot`] never drops its own).
    fn drop(&mut self) {
        if !std::mem::needs_drop::<T>() {
            return;
        }
        let left = self.consumer.slots();
        if let Ok(chunk) = self.consumer.read_chunk(left) {
            chunk.into_iter().for_each(|slot| drop(std::mem::ManuallyDrop::into_inner(slot)));
        }
    }
}

/// An unaligned barrier waiting in priority slot `slot`, taken out (a function of the field
/// alone, for while the ring's chunk is borrowed).
#[inline]
fn take_priority(slot: &mut Option<Consumer<PriorityBarrier>>) -> Option<PriorityBarrier> {
    slot.as_mut().and_then(|p| p.pop().ok())
}

/// What one poll of an input achieved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GatePoll {
    /// Entries were consumed.
    Progress,
    /// Every live channel was empty (or blocked).
    Idle,
    /// Every channel has ended and the end was delivered downstream.
    Finished,
    /// Channel `channel` delivered a checkpoint barrier. Everything before it was delivered
    /// downstream; nothing after it was read. With blocking on, the channel is now blocked
    /// until the alignment ends.
    Barrier {
        /// The channel's index in this gate.
        channel: usize,
        /// The barrier.
        barrier: Barrier,
    },
    /// Channel `channel`'s producer published an unaligned barrier: its entries before `seq`
    /// belong to the checkpoint, and so do those it still held staged, which came with the
    /// barrier (a capture of the checkpoint takes them). Nothing at or after `seq` was
    /// consumed.
    PriorityBarrier {
        /// The channel's index in this gate.
        channel: usize,
        /// The barrier.
        barrier: Barrier,
        /// The producer's write sequence number at the barrier.
        seq: u64,
    },
}

/// All channels of one logical input of a subtask.
pub(crate) struct InputGate<T> {
    channels: Vec<ChannelReader<T>>,
    /// Per channel: its last watermark, whether it ended, whether it is blocked by barrier
    /// alignment. Kept beside `channels` so they can be read while one channel's chunk is
    /// borrowed.
    watermarks: Vec<Timestamp>,
    ended: Vec<bool>,
    blocked: Vec<bool>,
    /// Block a channel when it delivers a barrier (exactly-once alignment).
    block_on_barrier: bool,
    live: usize,
    /// The watermark last delivered downstream.
    emitted: Timestamp,
    end_delivered: bool,
    next: usize,
    buf: Vec<T>,
    /// Check priority slots (unaligned checkpoints).
    unaligned: bool,
    /// Captures in progress, in checkpoint order.
    captures: Vec<Capture>,
    /// Per channel: what the last priority barrier polled carried of its producer's staged
    /// entries, with its checkpoint and position, until the task sets that limit (or polls
    /// again: the barrier was stale).
    carried: Vec<Option<(u64, u64, Captured)>>,
    /// Whether any of `carried` may be set (so a poll clears them only then).
    carrying: bool,
    /// Scratch space of [`InputGate::ahead_bytes`].
    sample: Vec<u8>,
    /// Per channel: adaptive alignment holds the snapshot while this channel is read up to its
    /// barrier's position, and no further (what it carried is kept meanwhile).
    stop_at: Vec<Option<u64>>,
    /// In-flight data restored from a checkpoint, replayed before the rings.
    replay: std::collections::VecDeque<(usize, Entry<T>)>,
    /// With unaligned checkpoints: how records are handed on in slices short enough that a
    /// priority barrier waits for one slice, not for a chunk, of the task's work.
    slicing: Option<RecordSlicing>,
    /// Where the gate says, every [`FILL_EVERY_POLLS`] polls, how full each ring is (the
    /// metrics' backpressure).
    fill: Option<Arc<crate::metrics::InputFill>>,
    polls: u32,
}

/// How often a gate reports its rings' fill: one look at every channel each this many polls
/// (each reads up to a batch from every channel), off the per-chunk path (where it cost the keyed
/// exchange 2 instructions a record).
const FILL_EVERY_POLLS: u32 = 64;

impl<T: Persist> InputGate<T> {
    pub(crate) fn new(channels: Vec<ChannelReader<T>>) -> Self {
        assert!(!channels.is_empty(), "an input has at least one channel");
        let n = channels.len();
        InputGate {
            channels,
            watermarks: vec![Timestamp::MIN; n],
            ended: vec![false; n],
            blocked: vec![false; n],
            block_on_barrier: false,
            live: n,
            emitted: Timestamp::MIN,
            end_delivered: false,
            next: 0,
            buf: Vec::new(),
            unaligned: false,
            captures: Vec::new(),
            carried: vec![None; n],
            carrying: false,
            sample: Vec::new(),
            stop_at: vec![None; n],
            replay: std::collections::VecDeque::new(),
            slicing: None,
            fill: None,
            polls: 0,
        }
    }

    /// Counts a turn of the task (a poll of the gate, or one the task skipped because its
    /// output is full, while the rings fill): every [`FILL_EVERY_POLLS`] turns, reports the
    /// rings' fill.
    #[inline]
    pub(crate) fn count_turn(&mut self) {
        self.polls = self.polls.wrapping_add(1);
        if self.polls.is_multiple_of(FILL_EVERY_POLLS) {
            self.report_fill_now();
        }
    }

    #[cold]
    fn report_fill_now(&self) {
        if let Some(fill) = &self.fill {
            for (i, ch) in self.channels.iter().enumerate() {
                fill.saw(i, ch.consumer.slots());
            }
        }
    }

    /// Reports how full the rings are at each read into `metrics`, as input `input` of the
    /// task of `ctx`.
    pub(crate) fn report_fill(&mut self, ctx: &crate::context::TaskContext, input: usize) {
        let capacity = self.channels[0].consumer.buffer().capacity();
        let n = self.channels.len();
        self.fill = Some(ctx.metrics.input_fill(&ctx.operator, ctx.subtask, input, n, capacity));
    }

    /// Hands records on in slices of about [`SLICE_NS`] of work (timed on `clock`), looking
    /// at the priority slots between slices (unaligned checkpoints), or (`None`) in whole
    /// chunks.
    pub(crate) fn set_slicing(&mut self, clock: Option<crate::context::Clock>) {
        // The first slice is one record: its cost sizes the next, so a gate that starts slicing
        // in the middle of a backlog of slow records (unaligned turned on while the job runs)
        // does not first work through a whole chunk of them.
        self.slicing = clock.map(|clock| RecordSlicing { clock, slice: 1, cost_x16: 0, untimed: TIME_ONE_CHUNK_IN });
    }

    /// Whether priority slots are checked (unaligned checkpoints).
    pub(crate) fn set_unaligned(&mut self, unaligned: bool) {
        self.unaligned = unaligned;
    }

    /// Whether a channel that delivers a barrier stops being read until unblocked.
    pub(crate) fn set_blocking(&mut self, block: bool) {
        self.block_on_barrier = block;
    }

    /// Resumes reading every channel (alignment finished or was abandoned).
    pub(crate) fn unblock_all(&mut self) {
        self.blocked.iter_mut().for_each(|b| *b = false);
    }

    /// Stops reading one channel (it delivered the barrier being aligned).
    pub(crate) fn block(&mut self, channel: usize) {
        self.blocked[channel] = true;
    }

    /// Resumes reading one channel.
    pub(crate) fn unblock(&mut self, channel: usize) {
        self.blocked[channel] = false;
    }

    /// Number of channels.
    pub(crate) fn channels(&self) -> usize {
        self.channels.len()
    }

    /// Whether channel `i` has ended.
    pub(crate) fn is_ended(&self, i: usize) -> bool {
        self.ended[i]
    }

    /// Entries consumed so far over all channels.
    #[allow(dead_code)]
    pub(crate) fn consumed(&self) -> u64 {
        self.channels.iter().map(|c| c.read).sum()
    }

    /// Whether end of stream was delivered.
    #[allow(dead_code)]
    pub(crate) fn is_finished(&self) -> bool {
        self.end_delivered
    }

    /// Reads up to `budget` entries (spread over the channels, round-robin) into `head`.
    /// Stops early when `head` reports backpressure, and at a barrier.
    pub(crate) fn poll(&mut self, head: &mut dyn Collector<T>, budget: usize) -> Result<GatePoll> {
        if self.end_delivered {
            return Ok(GatePoll::Finished);
        }
        if !self.replay.is_empty() {
            self.poll_replay(head, budget)?;
            return Ok(GatePoll::Progress);
        }
        if self.carrying {
            self.forget_stale_carried();
        }
        self.count_turn();
        let n = self.channels.len();
        let mut consumed = 0usize;
        for step in 0..n {
            let i = (self.next + step) % n;
            let left = budget.saturating_sub(consumed);
            if left == 0 {
                break;
            }
            let Some(left) = self.readable(i, left) else { continue };
            match self.take_turn(i, left, head)? {
                Turn::Next(taken) => consumed += taken,
                Turn::Stop(poll) => {
                    self.next = (i + 1) % n;
                    return Ok(poll);
                }
            }
        }
        self.next = (self.next + 1) % n;
        if self.live == 0 {
            head.end()?;
            self.end_delivered = true;
            return Ok(GatePoll::Finished);
        }
        Ok(if consumed > 0 { GatePoll::Progress } else { GatePoll::Idle })
    }

    /// How many entries of channel `i` a poll with `left` of its budget may read: none from a
    /// channel that ended, is blocked by alignment, or was read up to its deferred barrier.
    #[inline]
    fn readable(&self, i: usize, left: usize) -> Option<usize> {
        if self.ended[i] || self.blocked[i] {
            return None;
        }
        match self.stop_at[i] {
            None => Some(left),
            Some(stop) => {
                let before = stop.saturating_sub(self.channels[i].read) as usize;
                (before > 0).then(|| left.min(before))
            }
        }
    }

    /// Channel `i`'s turn in a poll: reads up to `left` of its entries into `head`, up to its
    /// next barrier (a priority barrier ahead of everything), logging what in-flight captures
    /// need and, when sliced, looking at the priority slot between slices.
    ///
    /// Records come off the ring in runs: the records between two control entries move into
    /// the batch in one pass ([`move_run`]), with no per-record branch but the slot's tag; a
    /// control entry is then taken on its own. A run is cut short only by slicing (a slice's
    /// worth of records handed on before the priority slot is looked at again) or the turn's
    /// budget; what is left of it stays in the ring, still in flight for any capture.
    // Always inlined: left to itself the compiler calls it, and the keyed exchange (W2) pays
    // 3 instructions a record for the call (perf/instructions.sh).
    #[inline(always)]
    fn take_turn(&mut self, i: usize, left: usize, head: &mut dyn Collector<T>) -> Result<Turn> {
        // A channel with a deferred barrier is read only up to it, where no later barrier can
        // lie: its priority slot waits (so what that barrier carried stays its own).
        let priority = self.unaligned && self.stop_at[i].is_none();
        if priority {
            if let Some(pb) = self.channels[i].take_priority() {
                return Ok(Turn::Stop(priority_polled(&mut self.carried, &mut self.carrying, i, pb)));
            }
        }
        let ch = &mut self.channels[i];
        let avail = ch.consumer.slots().min(left);
        if avail == 0 {
            return Ok(Turn::Next(0));
        }
        if priority {
            // Checked after the ring's tail was read: a barrier published before any of these
            // entries is seen here, so nothing after a barrier is consumed before it.
            if let Some(pb) = take_priority(&mut ch.priority) {
                return Ok(Turn::Stop(priority_polled(&mut self.carried, &mut self.carrying, i, pb)));
            }
        }
        let mut end = ChunkEnd::Whole;
        let mut taken = 0;
        let start = ch.read;
        let mut slice_start = self.slicing.as_mut().and_then(|s| s.begin(avail));
        // Read only for a timed chunk (when `slice_start` is some).
        let poll_start = slice_start.unwrap_or(0);
        while taken < avail {
            let want = match (&self.slicing, slice_start) {
                (Some(s), Some(_)) => (avail - taken).min(s.slice.saturating_sub(self.buf.len()).max(1)),
                _ => avail - taken,
            };
            let ch = &mut self.channels[i];
            let moved = if self.captures.is_empty() {
                move_run(&mut ch.consumer, want, &mut self.buf, |_, _| {})
            } else {
                let captures = &mut self.captures;
                let at = start + taken as u64;
                move_run(&mut ch.consumer, want, &mut self.buf, |j, e| capture::log_consumed(captures, i, at + j, e))
            };
            taken += moved;
            if let (Some(s), Some(t0)) = (self.slicing.as_ref(), slice_start) {
                if self.buf.len() >= s.slice {
                    let (now, ended) = self.hand_on_slice(i, priority, (t0, poll_start), head)?;
                    slice_start = Some(now);
                    if let Some(e) = ended {
                        end = e;
                        break;
                    }
                    continue;
                }
            }
            if moved == want {
                continue;
            }
            // The run ended at a control entry: it is taken on its own.
            let barrier = self.take_control(i, start + taken as u64, head)?;
            taken += 1;
            if let Some(barrier) = barrier {
                end = ChunkEnd::Barrier(barrier);
                break;
            }
        }
        let ch = &mut self.channels[i];
        ch.read += taken as u64;
        ch.producer.notify();
        if !self.buf.is_empty() {
            let n = self.buf.len();
            head.batch(&mut self.buf)?;
            if let (Some(s), Some(t0)) = (self.slicing.as_mut(), slice_start) {
                s.slice_done(n, t0);
            }
        }
        self.turn_ended(end, i, taken, head)
    }

    /// A slice's worth of records read in a timed chunk (started at `t0`, the poll at
    /// `poll_start`): hands it on, then looks at channel `i`'s priority slot (not on a channel
    /// read up to a deferred barrier, whose slot waits). A barrier there overtakes the rest of
    /// the chunk, which stays in the ring (in flight for its checkpoint); so does the poll's
    /// end. Returns when the slice was done, and why the chunk ends, if it does.
    #[inline(always)]
    fn hand_on_slice(
        &mut self,
        i: usize,
        priority: bool,
        (t0, poll_start): (u64, u64),
        head: &mut dyn Collector<T>,
    ) -> Result<(u64, Option<ChunkEnd>)> {
        let n = self.buf.len();
        head.batch(&mut self.buf)?;
        let now = self.slicing.as_mut().map_or(t0, |s| s.slice_done(n, t0));
        if let Some(pb) = priority.then(|| take_priority(&mut self.channels[i].priority)).flatten() {
            return Ok((now, Some(ChunkEnd::Overtaken(pb))));
        }
        let out_of_time = now.saturating_sub(poll_start) >= POLL_NS;
        Ok((now, out_of_time.then_some(ChunkEnd::OutOfTime)))
    }

    /// Takes channel `i`'s control entry at the front of its ring (sequence `at`), on its own:
    /// a barrier is returned, ending the turn.
    #[inline(always)]
    fn take_control(&mut self, i: usize, at: u64, head: &mut dyn Collector<T>) -> Result<Option<Barrier>> {
        let ch = &mut self.channels[i];
        let entry = std::mem::ManuallyDrop::into_inner(ch.consumer.pop().expect("avail entries were counted"));
        if !self.captures.is_empty() {
            capture::log_consumed(&mut self.captures, i, at, &entry);
        }
        self.on_control(i, entry, head)
    }

    /// Channel `i`'s control entry `entry`, just consumed: a watermark or end is delivered (the
    /// records before it first); a barrier is returned, ending the turn.
    fn on_control(&mut self, i: usize, entry: Entry<T>, head: &mut dyn Collector<T>) -> Result<Option<Barrier>> {
        match entry {
            Entry::Record(_) => unreachable!("a run ends at a control entry"),
            Entry::Barrier(b) => return Ok(Some(b)),
            Entry::Watermark(w) => {
                if !self.buf.is_empty() {
                    head.batch(&mut self.buf)?;
                }
                debug_assert!(w >= self.watermarks[i], "a channel's watermark went back");
                self.watermarks[i] = w;
                advance(&self.watermarks, &self.ended, &mut self.emitted, head)?;
            }
            Entry::End => {
                if !self.buf.is_empty() {
                    head.batch(&mut self.buf)?;
                }
                debug_assert!(!self.ended[i], "a channel ended twice");
                self.ended[i] = true;
                self.live -= 1;
                if self.live > 0 {
                    advance(&self.watermarks, &self.ended, &mut self.emitted, head)?;
                }
            }
        }
        Ok(None)
    }

    /// What follows channel `i`'s turn that took `taken` entries and ended as `end`.
    #[inline]
    fn turn_ended(&mut self, end: ChunkEnd, i: usize, taken: usize, head: &mut dyn Collector<T>) -> Result<Turn> {
        Ok(match end {
            ChunkEnd::Overtaken(pb) => Turn::Stop(priority_polled(&mut self.carried, &mut self.carrying, i, pb)),
            ChunkEnd::OutOfTime => Turn::Stop(GatePoll::Progress),
            ChunkEnd::Barrier(barrier) => {
                if self.block_on_barrier {
                    self.blocked[i] = true;
                }
                Turn::Stop(GatePoll::Barrier { channel: i, barrier })
            }
            ChunkEnd::Whole if !head.drain()? => Turn::Stop(GatePoll::Progress),
            ChunkEnd::Whole => Turn::Next(taken),
        })
    }
}

/// How one channel's turn in a poll ended.
enum Turn {
    /// The poll goes on to the next channel; this many entries were consumed.
    Next(usize),
    /// The poll ends with this.
    Stop(GatePoll),
}

/// Why a turn stopped reading its chunk.
enum ChunkEnd {
    /// Every entry of the chunk was read.
    Whole,
    /// A barrier in the ring; the entries after it stay there.
    Barrier(Barrier),
    /// A priority barrier published while the chunk was read in slices.
    Overtaken(PriorityBarrier),
    /// The poll's time ran out between slices.
    OutOfTime,
}

/// Moves the run of records at the front of `ring`, at most `max` of them, into `batch`, and
/// frees their slots; stops at the first control entry, which stays in the ring. `seen(j, e)`
/// sees the run's `j`th entry before it moves (captures log it; elsewhere it is a no-op that
/// compiles away). Returns how many records moved.
///
/// This is the gate's hot path: per record a tag compared and the record's bytes copied, no
/// iterator state, no capacity check, one ring commit for the run.
#[inline(always)]
fn move_run<T>(
    ring: &mut Consumer<Slot<T>>,
    max: usize,
    batch: &mut Vec<T>,
    mut seen: impl FnMut(u64, &Entry<T>),
) -> usize {
    let Ok(chunk) = ring.read_chunk(max) else {
        debug_assert!(false, "the caller counted {max} entries in the ring");
        return 0;
    };
    let (a, b) = chunk.as_slices();
    batch.reserve(max);
    let mut moved = 0;
    for part in [a, b] {
        let base = batch.len();
        let dst = batch.spare_capacity_mut();
        let mut n = 0;
        for slot in part {
            let Entry::Record(r) = &**slot else { break };
            seen(moved as u64 + n as u64, slot);
            // SAFETY: `dst` has room for `max` records (reserved above, `moved + n < max`
            // as the chunk holds `max` slots), and `r` is read out once: the slot is freed
            // below without being dropped (a `Slot` never drops its entry), so the record
            // is owned by the batch alone.
            dst[n].write(unsafe { std::ptr::read(r) });
            n += 1;
        }
        // SAFETY: the `n` slots after `base` were just written.
        unsafe { batch.set_len(base + n) };
        moved += n;
        if n < part.len() {
            break;
        }
    }
    chunk.commit(moved);
    moved
}

/// What a poll reports of priority barrier `pb` of channel `i`; keeps what it carried.
fn priority_polled(
    carried: &mut [Option<(u64, u64, Captured)>],
    carrying: &mut bool,
    i: usize,
    pb: PriorityBarrier,
) -> GatePoll {
    if pb.staged.entries > 0 {
        carried[i] = Some((pb.barrier.id, pb.seq, pb.staged));
        *carrying = true;
    }
    GatePoll::PriorityBarrier { channel: i, barrier: pb.barrier, seq: pb.seq }
}

/// Delivers the input's watermark (the minimum over live channels) if it advanced.
fn advance<T>(
    watermarks: &[Timestamp],
    ended: &[bool],
    emitted: &mut Timestamp,
    head: &mut dyn Collector<T>,
) -> Result<()> {
    let min = watermarks.iter().zip(ended).filter(|(_, &e)| !e).map(|(&w, _)| w).min().unwrap_or(Timestamp::MAX);
    if min > *emitted {
        *emitted = min;
        head.watermark(min)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::{channel, BarrierExpiry, OutChannel};
    use crate::collector::{Nowhere, OnBatch};

    fn barrier(id: u64) -> Barrier {
        Barrier { id, trigger_ns: 0, unaligned: false, savepoint: false }
    }

    fn one_channel_gate(entries: &[Entry<u64>]) -> InputGate<u64> {
        let parker = Arc::new(Parker::default());
        let (mut out, reader) = channel::<u64>(8, Arc::clone(&parker), parker);
        for e in entries {
            out.write_entry(*e);
        }
        assert!(out.flush());
        InputGate::new(vec![reader])
    }

    /// A user's aligned checkpoint with a timeout never turned unaligned at a task with one
    /// input: its barrier sat behind a full ring. Once the checkpoint has run for the timeout
    /// (from its trigger), the producer republishes the queued barrier in the priority slot,
    /// and the reader sees it before the backlog.
    #[test]
    fn a_queued_barrier_overtakes_the_backlog_once_its_checkpoint_times_out() {
        let parker = Arc::new(Parker::default());
        let time = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let expiry = BarrierExpiry::after(crate::context::Clock::manual(Arc::clone(&time)), 10);
        let (out, reader) = channel::<u64>(4, Arc::clone(&parker), parker);
        let mut out = out.with_expiry(Some(expiry));
        let mut backlog: Vec<u64> = (0..6).collect();
        out.write_records(&mut backlog);
        let b = Barrier { trigger_ns: 5, ..barrier(1) };
        out.write_entry(Entry::Barrier(b));
        let mut gate = InputGate::new(vec![reader]);
        gate.set_unaligned(true);
        time.store(14, std::sync::atomic::Ordering::Relaxed);
        assert!(!out.flush(), "the ring is full");
        let got = std::sync::Mutex::new(Vec::new());
        let mut head = OnBatch(|r: &mut Vec<u64>| got.lock().unwrap().append(r));
        // Not yet timed out: the reader works through the ring, no barrier overtakes.
        assert_eq!(gate.poll(&mut head, 1).unwrap(), GatePoll::Progress);
        time.store(15, std::sync::atomic::Ordering::Relaxed);
        out.flush();
        let polled = gate.poll(&mut head, 16).unwrap();
        assert_eq!(
            polled,
            GatePoll::PriorityBarrier { channel: 0, barrier: Barrier { unaligned: true, ..b }, seq: 4 },
            "the barrier overtakes the five records still queued: three in the ring before position 4, two it carries"
        );
        assert_eq!(*got.lock().unwrap(), vec![0]);
        // A barrier the reader has already consumed is not republished.
        time.store(12, std::sync::atomic::Ordering::Relaxed);
        let (out, reader) = channel::<u64>(4, Arc::new(Parker::default()), Arc::new(Parker::default()));
        let mut out = out.with_expiry(Some(BarrierExpiry::after(crate::context::Clock::manual(Arc::clone(&time)), 10)));
        out.write_entry(Entry::Barrier(b));
        let mut gate = InputGate::new(vec![reader]);
        gate.set_unaligned(true);
        assert!(matches!(gate.poll(&mut head, 16).unwrap(), GatePoll::Barrier { .. }));
        time.store(100, std::sync::atomic::Ordering::Relaxed);
        out.flush();
        assert_eq!(gate.poll(&mut head, 16).unwrap(), GatePoll::Idle, "nothing overtakes: it was read");
    }

    /// A user's unaligned checkpoint under backpressure lasted as long as the slow task took to
    /// make room for what its producer held staged beyond the full ring. Now the barrier names
    /// the ring's write position and carries the staged entries: the consumer's capture is
    /// complete with what the ring holds at that instant, it holds every entry before the
    /// barrier in order, and the staged entries still arrive as data.
    #[test]
    fn an_unaligned_capture_takes_the_ring_and_what_the_barrier_carried() {
        let parker = Arc::new(Parker::default());
        let (mut out, reader) = channel::<u64>(4, Arc::clone(&parker), parker);
        let mut backlog: Vec<u64> = (0..10).collect();
        out.write_records(&mut backlog);
        out.write_entry(Entry::Watermark(3));
        let b = Barrier { unaligned: true, ..barrier(1) };
        out.write_priority(b);
        let mut gate = InputGate::new(vec![reader]);
        gate.set_unaligned(true);
        let polled = gate.poll(&mut Nowhere, 16).unwrap();
        assert_eq!(polled, GatePoll::PriorityBarrier { channel: 0, barrier: b, seq: 4 }, "the ring's write position");
        gate.start_capture(1);
        gate.set_capture_limit(1, 0, 4);
        assert!(gate.capture_complete(1), "complete with the ring as it is: nothing read, nothing waited for");
        let captured = gate.take_capture(1).remove(0).1.decode::<u64>().unwrap();
        let mut expected: Vec<Entry<u64>> = (0..10).map(Entry::Record).collect();
        expected.push(Entry::Watermark(3));
        assert_eq!(captured, expected);
        // The staged entries are written as usual once there is room.
        let got = std::sync::Mutex::new(Vec::new());
        let mut head = OnBatch(|r: &mut Vec<u64>| got.lock().unwrap().append(r));
        while got.lock().unwrap().len() < 10 {
            out.flush();
            gate.poll(&mut head, 16).unwrap();
        }
        assert_eq!(*got.lock().unwrap(), (0..10).collect::<Vec<_>>());
    }

    /// A republished barrier still staged behind a full ring carries what was staged before
    /// it, not what came after, and its in-band copy is taken out of the stage: read later it
    /// would only be stale, and cost the consumer a poll.
    #[test]
    fn a_republished_barrier_carries_what_was_staged_before_it() {
        let parker = Arc::new(Parker::default());
        let time = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let expiry = BarrierExpiry::after(crate::context::Clock::manual(Arc::clone(&time)), 10);
        let (out, reader) = channel::<u64>(4, Arc::clone(&parker), parker);
        let mut out = out.with_expiry(Some(expiry));
        out.write_records(&mut (0..6).collect());
        out.write_entry(Entry::Barrier(barrier(1)));
        out.write_records(&mut (6..8).collect());
        let mut gate = InputGate::new(vec![reader]);
        gate.set_unaligned(true);
        time.store(10, std::sync::atomic::Ordering::Relaxed);
        out.flush();
        let GatePoll::PriorityBarrier { seq, barrier: b, .. } = gate.poll(&mut Nowhere, 16).unwrap() else {
            panic!("the republished barrier comes first");
        };
        assert_eq!((b.id, seq), (1, 4));
        gate.start_capture(1);
        gate.set_capture_limit(1, 0, seq);
        assert!(gate.capture_complete(1));
        let captured = gate.take_capture(1).remove(0).1.decode::<u64>().unwrap();
        assert_eq!(captured, (0..6).map(Entry::Record).collect::<Vec<_>>());
        let got = std::sync::Mutex::new(Vec::new());
        let mut head = OnBatch(|r: &mut Vec<u64>| got.lock().unwrap().append(r));
        while got.lock().unwrap().len() < 8 {
            out.flush();
            let polled = gate.poll(&mut head, 16).unwrap();
            assert!(!matches!(polled, GatePoll::Barrier { .. }), "no in-band copy follows");
        }
        assert_eq!(*got.lock().unwrap(), (0..8).collect::<Vec<_>>());
        assert_eq!(gate.read_position(0), 8, "eight records, no barrier entry");
    }

    /// A capture logs the runs it consumes before its limit is known, and peeks the rest of a
    /// run partly consumed once the limit comes: the watermark between two runs is in flight
    /// like the records, and what lies past the limit is not captured.
    #[test]
    fn a_capture_takes_a_run_partly_consumed_and_peeks_the_rest() {
        let parker = Arc::new(Parker::default());
        let (mut out, reader) = channel::<u64>(16, Arc::clone(&parker), parker);
        out.write_records(&mut (0..5).collect());
        out.write_entry(Entry::Watermark(5));
        out.write_records(&mut (5..10).collect());
        let mut gate = InputGate::new(vec![reader]);
        gate.set_unaligned(true);
        gate.start_capture(1);
        let got = std::sync::Mutex::new(Vec::new());
        let mut head = OnBatch(|r: &mut Vec<u64>| got.lock().unwrap().append(r));
        assert_eq!(gate.poll(&mut head, 3).unwrap(), GatePoll::Progress);
        assert_eq!(gate.read_position(0), 3, "three records of the first run");
        // The producer's barrier came after records 0..=6 and the watermark: position 8.
        gate.set_capture_limit(1, 0, 8);
        assert!(gate.capture_complete(1), "the rest was peeked in the ring");
        while gate.read_position(0) < 11 {
            gate.poll(&mut head, 4).unwrap();
        }
        assert_eq!(*got.lock().unwrap(), (0..10).collect::<Vec<_>>(), "all still delivered");
        let captured = gate.take_capture(1).remove(0).1.decode::<u64>().unwrap();
        let mut expected: Vec<Entry<u64>> = (0..5).map(Entry::Record).collect();
        expected.push(Entry::Watermark(5));
        expected.extend((5..7).map(Entry::Record));
        assert_eq!(captured, expected);
    }

    /// A one-channel gate (a ring of 64) checking its priority slot, slicing records on a clock
    /// that reads `time`, and the ring's producer.
    fn sliced_gate(time: &Arc<std::sync::atomic::AtomicU64>) -> (OutChannel<u64>, InputGate<u64>) {
        let parker = Arc::new(Parker::default());
        let (out, reader) = channel::<u64>(64, Arc::clone(&parker), parker);
        let mut gate = InputGate::new(vec![reader]);
        gate.set_unaligned(true);
        gate.set_slicing(Some(crate::context::Clock::manual(Arc::clone(time))));
        (out, gate)
    }

    /// With slicing, a priority barrier published while the task works through a chunk stops
    /// the chunk at the next slice: the rest stays in the ring (in flight).
    #[test]
    fn a_priority_barrier_interrupts_a_chunk_between_slices() {
        let time = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (mut out, mut gate) = sliced_gate(&time);
        // Each record costs 10 µs of (simulated) time: two per 20 µs slice once learnt. Once
        // six records are in, the producer publishes an unaligned barrier.
        let got = std::sync::Mutex::new(Vec::new());
        let publish = std::sync::Mutex::new(None::<&mut OutChannel<u64>>);
        let mut head = OnBatch(|r: &mut Vec<u64>| {
            time.fetch_add(10_000 * r.len() as u64, std::sync::atomic::Ordering::Relaxed);
            let mut got = got.lock().unwrap();
            got.append(r);
            if got.len() >= 6 {
                if let Some(out) = publish.lock().unwrap().take() {
                    out.write_priority(Barrier { unaligned: true, ..barrier(1) });
                }
            }
        });
        let mut first: Vec<u64> = (0..4).collect();
        out.write_records(&mut first);
        assert_eq!(gate.poll(&mut head, 64).unwrap(), GatePoll::Progress, "learns the cost");
        let mut more: Vec<u64> = (4..40).collect();
        out.write_records(&mut more);
        *publish.lock().unwrap() = Some(&mut out);
        let polled = gate.poll(&mut head, 64).unwrap();
        assert!(matches!(polled, GatePoll::PriorityBarrier { seq: 40, .. }), "{polled:?}");
        assert_eq!(*got.lock().unwrap(), (0..6).collect::<Vec<_>>(), "stopped at the slice after the barrier came");
        assert_eq!(gate.read_position(0), 6, "the other 34 records stay in the ring");
    }

    /// Found by the simulator (owned records, adaptive alignment, parallelism 2): a channel
    /// read up to a deferred barrier took the next checkpoint's priority barrier between two
    /// slices, so a barrier behind data already consumed reached its capture. Its slot waits
    /// until the deferral ends, slices or not.
    #[test]
    fn a_deferred_channel_takes_no_priority_barrier_between_slices() {
        let time = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (mut out, mut gate) = sliced_gate(&time);
        let mut records: Vec<u64> = (0..20).collect();
        out.write_records(&mut records);
        out.flush();
        // Checkpoint 1's barrier is at 20: the channel is read up to it, a record per slice.
        gate.defer(0, 1, 20);
        let publish = std::sync::Mutex::new(Some(&mut out));
        let got = std::sync::Mutex::new(0usize);
        let mut head = OnBatch(|r: &mut Vec<u64>| {
            time.fetch_add(100_000 * r.len() as u64, std::sync::atomic::Ordering::Relaxed);
            *got.lock().unwrap() += r.len();
            if let Some(out) = publish.lock().unwrap().take() {
                out.write_priority(Barrier { unaligned: true, ..barrier(2) });
            }
        });
        for _ in 0..40 {
            let polled = gate.poll(&mut head, 64).unwrap();
            assert!(!matches!(polled, GatePoll::PriorityBarrier { .. }), "taken while deferred: {polled:?}");
            if gate.read_position(0) == 20 {
                break;
            }
        }
        assert_eq!((*got.lock().unwrap(), gate.read_position(0)), (20, 20), "read up to the deferred barrier");
        gate.release_deferred();
        let polled = gate.poll(&mut head, 64).unwrap();
        assert!(matches!(polled, GatePoll::PriorityBarrier { seq: 20, .. }), "then the next barrier: {polled:?}");
    }

    /// Found by the simulator: barriers of other checkpoints consumed during a capture must
    /// move its position, or a limit found later lies between the capture and the read
    /// position (the capture never completes, and peeking underflowed).
    #[test]
    fn other_checkpoints_barriers_move_the_capture_along() {
        let mut gate =
            one_channel_gate(&[Entry::Barrier(barrier(1)), Entry::Barrier(barrier(2)), Entry::Barrier(barrier(3))]);
        gate.start_capture(3);
        let mut head = Nowhere;
        for id in 1..=3 {
            assert_eq!(gate.poll(&mut head, 16).unwrap(), GatePoll::Barrier { channel: 0, barrier: barrier(id) });
        }
        // Checkpoint 3's in-band barrier, at position 2, ends the channel's in-flight data.
        gate.set_capture_limit(3, 0, 2);
        gate.refresh_capture();
        assert!(gate.capture_complete(3));
        assert!(gate.take_capture(3).is_empty(), "barriers are not in-flight data");
    }

    /// Found by the simulator: what a restored gate has not replayed yet is in flight for the
    /// next unaligned checkpoint too (a two-input task may snapshot while one gate replays).
    #[test]
    fn a_capture_starts_with_the_entries_still_to_replay() {
        let mut gate = one_channel_gate(&[Entry::Record(7)]);
        gate.replay(vec![(0, vec![Entry::Record(1), Entry::Record(2)])]);
        gate.start_capture(1);
        // The producer's barrier came before its record 7: nothing of the ring is in flight.
        gate.set_capture_limit(1, 0, 0);
        assert!(gate.capture_complete(1));
        let captured = gate.take_capture(1);
        assert_eq!(captured.len(), 1);
        let records: Vec<u64> = captured[0]
            .1
            .decode::<u64>()
            .unwrap()
            .into_iter()
            .filter_map(|e| if let Entry::Record(r) = e { Some(r) } else { None })
            .collect();
        assert_eq!(records, vec![1, 2]);
    }
}
