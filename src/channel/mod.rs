//! Channels: one `rtrb` SPSC ring per edge between two subtasks, and the entry format on it.
//!
//! Every entry is tagged ([`Entry`]): a record, a watermark, a checkpoint barrier, or end of
//! stream. A *run* is the record entries between two control entries: producers write whole
//! batches with one atomic publish (`write_chunk_uninit`), and the gate moves a run out in
//! one pass and one commit (`move_run`), so the ring's atomics are paid per run and the per-
//! record cost is a tag compared and the record's bytes copied. Entries stay one per slot, so
//! a position in the ring is a sequence number (what captures, priority barriers and
//! republished barriers name), and a run may be cut at any record: where a control entry
//! lies, at the turn's budget, or between slices (unaligned checkpoints). A slot never drops
//! its entry (`Slot`): the gate copies a run's records out and frees their slots; the reader
//! drops what is left when it goes.
//!
//! Nothing is held back to fill a batch: a writer publishes what its task hands it at once, so a
//! lone record is not delayed (the flush bound is the task's own batch). When a ring is full the
//! writer stages the rest (bounded: at most what one input batch produced) and reports
//! `drain() == false`; its task then takes no new input until the stage empties. That is
//! backpressure, and there is no unbounded queue anywhere.
//!
//! Each side keeps its own `u64` sequence counter (entries written / read), since rtrb exposes
//! none; an unaligned barrier in a channel's priority slot names the ring position it
//! overtook with the producer's (`PriorityBarrier::seq`), so the consumer knows which entries
//! it reads afterwards are in-flight data of that checkpoint.
//!
//! May touch: `collector`, `context`, `error`, `metrics`, `persist`, `record`, `snapshot`, `wake`.

mod gate;
mod partition;
mod writer;

pub(crate) use crate::wake::Parker;
pub use gate::GatePoll;
pub(crate) use gate::{Captured, ChannelReader, InputGate};
pub use partition::Partitioning;
pub(crate) use partition::{KeyRouter, Partitioner};
pub(crate) use writer::{BarrierExpiry, ChannelWriter, OutChannel};

use crate::record::Timestamp;

/// A ring's slot: an entry the ring never drops itself. The gate moves a run of records out of
/// their slots in bulk and then frees the slots, which must not drop what was moved out; a
/// reader dropped with entries left in its ring drops them ([`ChannelReader`]'s `Drop`).
pub(crate) type Slot<T> = std::mem::ManuallyDrop<Entry<T>>;

/// One entry of a ring.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Entry<T> {
    /// A record.
    Record(T),
    /// The producer's watermark advanced to this timestamp.
    Watermark(Timestamp),
    /// A checkpoint barrier: everything before it belongs to the checkpoint.
    Barrier(crate::snapshot::Barrier),
    /// The producer's stream ended; nothing follows.
    End,
}

impl<T: crate::persist::Persist> crate::persist::Persist for Entry<T> {
    fn persist(&self, out: &mut Vec<u8>) {
        match self {
            Entry::Record(r) => {
                out.push(0);
                r.persist(out);
            }
            Entry::Watermark(w) => {
                out.push(1);
                w.persist(out);
            }
            Entry::Barrier(b) => {
                out.push(2);
                (b.id, b.trigger_ns, b.unaligned).persist(out);
            }
            Entry::End => out.push(3),
        }
    }
    fn restore(input: &mut &[u8]) -> crate::Result<Self> {
        match crate::persist::take(input, 1)?[0] {
            0 => Ok(Entry::Record(T::restore(input)?)),
            1 => Ok(Entry::Watermark(Timestamp::restore(input)?)),
            2 => {
                let (id, trigger_ns, unaligned) = <(u64, u64, bool)>::restore(input)?;
                // Replayed barriers are skipped, so whether this was a savepoint's is not kept.
                Ok(Entry::Barrier(crate::snapshot::Barrier { id, trigger_ns, unaligned, savepoint: false }))
            }
            3 => Ok(Entry::End),
            t => Err(crate::Error::Corrupt(format!("invalid ring entry tag {t}"))),
        }
    }
}

/// A barrier published in a channel's priority slot, with the producer's write sequence
/// number at that moment: the channel's entries before `seq` that the consumer reads after its
/// snapshot are in flight for the checkpoint, and so are `staged`, the data entries the
/// producer held staged before the barrier (not yet in the ring, the ring being full).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PriorityBarrier {
    pub(crate) barrier: crate::snapshot::Barrier,
    pub(crate) seq: u64,
    pub(crate) staged: Captured,
}

/// Capacity of a priority slot, in barriers (more than any number of concurrent checkpoints
/// needs; the producer stages beyond it).
const PRIORITY_SLOTS: usize = 8;

/// Creates the two ends of one channel with room for `capacity` entries.
pub(crate) fn channel<T: crate::persist::Persist>(
    capacity: usize,
    consumer_parker: std::sync::Arc<Parker>,
    producer_parker: std::sync::Arc<Parker>,
) -> (OutChannel<T>, ChannelReader<T>) {
    assert!(capacity > 0, "a ring holds at least one entry");
    let (p, c) = rtrb::RingBuffer::new(capacity);
    let (pp, pc) = rtrb::RingBuffer::new(PRIORITY_SLOTS);
    (OutChannel::new(p, consumer_parker).with_priority(pp), ChannelReader::new(c, producer_parker).with_priority(pc))
}

// Their fields are closures, shared internals or whole state: a name says enough.
crate::debug_as_name!([T: crate::record::Record] ChannelSender<T>);
crate::debug_as_name!([T] ChannelReceiver<T>);

#[cfg(test)]
mod model_test;

/// A single channel used outside a job: for benchmarks of the ring hop and for custom
/// runtimes. Inside jobs the planner builds channels itself.
///
/// ```
/// use weir::channel::{pair, GatePoll};
/// let (mut tx, mut rx) = pair::<u64>(16);
/// tx.send(&mut vec![1, 2, 3]);
/// tx.close();
/// let mut got = Vec::new();
/// while rx.poll(|batch| got.extend_from_slice(batch), 64) != GatePoll::Finished {}
/// assert_eq!(got, [1, 2, 3]);
/// ```
pub fn pair<T: crate::record::Record>(capacity: usize) -> (ChannelSender<T>, ChannelReceiver<T>) {
    let parker = std::sync::Arc::new(Parker::default());
    let (w, r) = channel::<T>(capacity, std::sync::Arc::clone(&parker), parker);
    (
        ChannelSender { writer: ChannelWriter::new(vec![w], Partitioner::Forward) },
        ChannelReceiver { gate: InputGate::new(vec![r]) },
    )
}

/// The sending end of a [`pair`].
pub struct ChannelSender<T: crate::record::Record> {
    writer: ChannelWriter<T, fn(&T) -> u64>,
}

impl<T: crate::record::Record> ChannelSender<T> {
    /// Publishes `records` (one chunk); what does not fit is staged. Returns `true` when
    /// nothing is staged (see [`ChannelSender::flush`]).
    #[inline]
    pub fn send(&mut self, records: &mut Vec<T>) -> bool {
        use crate::collector::Collector;
        let _ = self.writer.batch(records);
        self.flush()
    }
    /// Publishes staged entries that fit now; `true` when none are left.
    #[inline]
    pub fn flush(&mut self) -> bool {
        use crate::collector::Collector;
        self.writer.drain().unwrap_or(false)
    }
    /// Sends a checkpoint barrier: in-band behind the records already sent, or, when
    /// `barrier.unaligned`, through the priority slot ahead of them.
    pub fn send_barrier(&mut self, barrier: crate::snapshot::Barrier) {
        use crate::collector::Collector;
        let _ = self.writer.barrier(barrier, &mut crate::snapshot::TaskSnapshot::new(barrier));
    }
    /// Ends the stream (spinning until the end marker fits).
    pub fn close(mut self) {
        use crate::collector::Collector;
        let _ = self.writer.end();
        while !self.flush() {
            std::hint::spin_loop();
        }
    }
}

/// The receiving end of a [`pair`].
pub struct ChannelReceiver<T> {
    gate: InputGate<T>,
}

impl<T: crate::record::Record> ChannelReceiver<T> {
    /// Checks the priority slot on every poll, so an unaligned barrier overtakes the records
    /// ahead of it ([`GatePoll::PriorityBarrier`]); off by default, as in a job without
    /// unaligned checkpoints.
    ///
    /// ```
    /// use weir::channel::{pair, GatePoll};
    /// use weir::snapshot::Barrier;
    /// let (mut tx, mut rx) = pair::<u64>(16);
    /// rx.check_priority_slot(true);
    /// tx.send(&mut vec![1, 2, 3]);
    /// tx.send_barrier(Barrier { id: 1, trigger_ns: 0, unaligned: true, savepoint: false });
    /// let first = rx.poll(|_| panic!("the barrier comes first"), 64);
    /// assert!(matches!(first, GatePoll::PriorityBarrier { .. }), "{first:?}");
    /// ```
    pub fn check_priority_slot(&mut self, on: bool) {
        self.gate.set_unaligned(on);
    }
    /// Reads up to `budget` entries, handing each batch of records to `f`.
    #[inline]
    pub fn poll(&mut self, f: impl FnMut(&[T]) + Send, budget: usize) -> GatePoll {
        let mut f = f;
        let mut head = crate::collector::OnBatch(|records: &mut Vec<T>| f(records));
        self.gate.poll(&mut head, budget).unwrap_or(GatePoll::Finished)
    }
}
