//! Channels: one `rtrb` SPSC ring per edge between two subtasks, and the entry format on it.
//!
//! Every entry is tagged ([`Entry`]): a record, a watermark, or end of stream (the checkpoint
//! issue adds barriers). A *record batch* is the run of record entries one producer commits in
//! one chunk: producers write whole batches with one atomic publish (`write_chunk_uninit`),
//! consumers read whole chunks and commit once, so the ring's atomics are paid per batch.
//!
//! Nothing is held back to fill a batch: a writer publishes what its task hands it at once, so a
//! lone record is not delayed (the flush bound is the task's own batch). When a ring is full the
//! writer stages the rest (bounded: at most what one input batch produced) and reports
//! `drain() == false`; its task then takes no new input until the stage empties. That is
//! backpressure, and there is no unbounded queue anywhere.
//!
//! Each side keeps its own `u64` sequence counter (entries written / read), since rtrb exposes
//! none; unaligned checkpoints will name ring positions with them.
//!
//! May touch: `collector`, `record`, `error`.

mod gate;
mod partition;
mod writer;

pub(crate) use crate::wake::Parker;
pub(crate) use gate::{ChannelReader, GatePoll, InputGate};
pub use partition::Partitioning;
pub(crate) use partition::{KeyRouter, Partitioner};
pub(crate) use writer::{ChannelWriter, OutChannel};

use crate::record::Timestamp;

/// One slot of a ring.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Entry<T> {
    /// A record.
    Record(T),
    /// The producer's watermark advanced to this timestamp.
    Watermark(Timestamp),
    /// The producer's stream ended; nothing follows.
    End,
}

/// Creates the two ends of one channel with room for `capacity` entries.
pub(crate) fn channel<T: Copy>(
    capacity: usize,
    consumer_parker: std::sync::Arc<Parker>,
    producer_parker: std::sync::Arc<Parker>,
) -> (OutChannel<T>, ChannelReader<T>) {
    assert!(capacity > 0, "a ring holds at least one entry");
    let (p, c) = rtrb::RingBuffer::new(capacity);
    (
        OutChannel::new(p, consumer_parker),
        ChannelReader::new(c, producer_parker),
    )
}

#[cfg(test)]
mod model_test;
