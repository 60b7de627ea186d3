//! The embedding sink: the job pushes results through a lock-free SPSC ring to a host thread.
//! A full ring backpressures the job (the host must keep reading).

use std::sync::Arc;

use rtrb::Consumer;

use super::Sink;
use crate::channel::{Entry, OutChannel};
use crate::error::Result;
use crate::wake::Parker;

/// The host's end of a pull sink.
pub struct EventReceiver<T> {
    consumer: Consumer<Entry<T>>,
    ended: bool,
}

impl<T: Copy> EventReceiver<T> {
    /// The next result, if one is ready. Never blocks.
    #[inline]
    pub fn try_recv(&mut self) -> Option<T> {
        loop {
            match self.consumer.pop() {
                Ok(Entry::Record(r)) => return Some(r),
                Ok(Entry::End) => {
                    self.ended = true;
                    return None;
                }
                Ok(Entry::Watermark(_) | Entry::Barrier(_)) => continue,
                Err(_) => return None,
            }
        }
    }

    /// Whether the job's stream ended (everything before the end was received), or the job is
    /// gone.
    pub fn is_finished(&self) -> bool {
        self.ended || (self.consumer.is_abandoned() && self.consumer.is_empty())
    }
}

/// The job's end of a pull sink.
pub(crate) struct PullSink<T> {
    out: OutChannel<T>,
}

pub(crate) fn pull_channel<T: Copy>(capacity: usize) -> (PullSink<T>, EventReceiver<T>) {
    let (p, c) = rtrb::RingBuffer::new(capacity.max(1));
    // The host polls; nobody parks on this ring, so the parker is never asleep.
    (PullSink { out: OutChannel::new(p, Arc::new(Parker::default())) }, EventReceiver { consumer: c, ended: false })
}

impl<T: Copy + Send> Sink<T> for PullSink<T> {
    fn write(&mut self, records: &mut Vec<T>) -> Result<()> {
        self.out.write_records(records);
        records.clear();
        Ok(())
    }
    fn finish(&mut self) -> Result<()> {
        self.out.write_entry(Entry::End);
        Ok(())
    }
    fn drain(&mut self) -> Result<bool> {
        Ok(self.out.flush())
    }
}
