//! The embedding source: a host thread pushes events through a lock-free SPSC ring straight into
//! a source subtask, and wakes its worker if it sleeps.

use std::sync::{Arc, OnceLock};

use rtrb::{Consumer, Producer};

use super::{Source, SourcePoll};
use crate::channel::Entry;
use crate::context::TaskContext;
use crate::error::Result;
use crate::wake::Parker;

/// The host's end of a push source: send events into a running (or not yet started) job.
pub struct EventSender<T> {
    producer: Producer<Entry<T>>,
    worker: Arc<OnceLock<Arc<Parker>>>,
    closed: bool,
}

impl<T: Copy> EventSender<T> {
    /// Sends one event. When the ring is full (the job is behind) the event is handed back.
    #[inline]
    pub fn send(&mut self, event: T) -> std::result::Result<(), T> {
        match self.producer.push(Entry::Record(event)) {
            Ok(()) => {
                self.notify();
                Ok(())
            }
            Err(_) => Err(event),
        }
    }

    /// Sends as many events from the front of `events` as fit; returns how many.
    pub fn send_slice(&mut self, events: &[T]) -> usize {
        let n = events.len().min(self.producer.slots());
        if n > 0 {
            let chunk = self.producer.write_chunk_uninit(n).expect("n free slots were checked");
            chunk.fill_from_iter(events[..n].iter().map(|&e| Entry::Record(e)));
            self.notify();
        }
        n
    }

    /// Ends the stream: the job finishes once it has processed everything sent.
    pub fn close(mut self) {
        self.end_stream();
    }

    fn end_stream(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        // Waits for one free slot, unless the job is gone (then nobody needs the end marker).
        while self.producer.push(Entry::End).is_err() {
            if self.producer.is_abandoned() {
                return;
            }
            std::thread::yield_now();
        }
        self.notify();
    }

    #[inline]
    fn notify(&self) {
        if let Some(p) = self.worker.get() {
            p.notify();
        }
    }
}

impl<T> Drop for EventSender<T> {
    fn drop(&mut self) {
        if !self.closed {
            self.closed = true;
            // Dropping the sender ends the stream, as dropping a channel sender does.
            let mut tries = 0u32;
            while self.producer.push(Entry::End).is_err() && !self.producer.is_abandoned() && tries < 1_000_000 {
                std::thread::yield_now();
                tries += 1;
            }
            if let Some(p) = self.worker.get() {
                p.notify();
            }
        }
    }
}

/// The job's end of a push source.
pub(crate) struct PushSource<T> {
    consumer: Consumer<Entry<T>>,
    worker: Arc<OnceLock<Arc<Parker>>>,
}

pub(crate) fn push_channel<T: Copy>(capacity: usize) -> (EventSender<T>, PushSource<T>) {
    let (producer, consumer) = rtrb::RingBuffer::new(capacity.max(1));
    let worker = Arc::new(OnceLock::new());
    (EventSender { producer, worker: worker.clone(), closed: false }, PushSource { consumer, worker })
}

impl<T: Copy + Send> Source<T> for PushSource<T> {
    fn poll(&mut self, ctx: &TaskContext, out: &mut Vec<T>, max: usize) -> Result<SourcePoll> {
        if self.worker.get().is_none() {
            let _ = self.worker.set(ctx.parker.clone());
        }
        let n = self.consumer.slots().min(max);
        if n == 0 {
            return Ok(if self.consumer.is_abandoned() && self.consumer.is_empty() {
                SourcePoll::Finished
            } else {
                SourcePoll::Idle
            });
        }
        let chunk = self.consumer.read_chunk(n).expect("n slots were checked");
        let mut ended = false;
        let mut taken = 0;
        let (a, b) = chunk.as_slices();
        for e in a.iter().chain(b) {
            taken += 1;
            match *e {
                Entry::Record(r) => out.push(r),
                Entry::End => {
                    ended = true;
                    break;
                }
                Entry::Watermark(_) | Entry::Barrier(_) => {}
            }
        }
        chunk.commit(taken);
        Ok(if ended { SourcePoll::Finished } else { SourcePoll::Emitted })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_arrive_in_order_then_end() {
        let (mut tx, mut src) = push_channel::<u32>(4);
        let ctx = TaskContext::for_test("push", 0, 1);
        assert_eq!(tx.send_slice(&[1, 2, 3, 4, 5]), 4);
        assert_eq!(tx.send(9), Err(9), "full ring hands the event back");
        let mut out = Vec::new();
        assert_eq!(src.poll(&ctx, &mut out, 10).unwrap(), SourcePoll::Emitted);
        tx.send(5).unwrap();
        tx.close();
        assert_eq!(src.poll(&ctx, &mut out, 10).unwrap(), SourcePoll::Finished);
        assert_eq!(out, vec![1, 2, 3, 4, 5]);
    }
}
