//! The consumer side: [`ChannelReader`] (one ring) and [`InputGate`] (all rings that feed one
//! logical input of a subtask), which merges them, tracks the input's watermark as the minimum
//! over its live channels, and reports end of stream once every channel has ended.

use std::sync::Arc;

use rtrb::Consumer;

use super::{Entry, Parker};
use crate::collector::Collector;
use crate::error::Result;
use crate::record::Timestamp;
use crate::snapshot::Barrier;

/// The consumer end of one ring.
pub(crate) struct ChannelReader<T> {
    consumer: Consumer<Entry<T>>,
    producer: Arc<Parker>,
    /// Entries consumed so far: this channel's read sequence number.
    read: u64,
}

impl<T> ChannelReader<T> {
    pub(crate) fn new(consumer: Consumer<Entry<T>>, producer: Arc<Parker>) -> Self {
        ChannelReader {
            consumer,
            producer,
            read: 0,
        }
    }
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
    /// until [`InputGate::unblock_all`].
    Barrier {
        /// The channel's index in this gate.
        channel: usize,
        /// The barrier.
        barrier: Barrier,
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
}

impl<T: Copy> InputGate<T> {
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
        }
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
        let n = self.channels.len();
        let mut consumed = 0usize;
        for step in 0..n {
            let i = (self.next + step) % n;
            if self.ended[i] || self.blocked[i] {
                continue;
            }
            let left = budget.saturating_sub(consumed);
            if left == 0 {
                break;
            }
            let ch = &mut self.channels[i];
            let avail = ch.consumer.slots().min(left);
            if avail == 0 {
                continue;
            }
            let chunk = ch
                .consumer
                .read_chunk(avail)
                .expect("avail slots were checked");
            let mut barrier = None;
            let mut taken = 0;
            let (a, b) = chunk.as_slices();
            for entry in a.iter().chain(b) {
                taken += 1;
                match *entry {
                    Entry::Record(r) => self.buf.push(r),
                    Entry::Watermark(w) => {
                        if !self.buf.is_empty() {
                            head.batch(&mut self.buf)?;
                        }
                        debug_assert!(w >= self.watermarks[i], "a channel's watermark went back");
                        self.watermarks[i] = w;
                        advance(&self.watermarks, &self.ended, &mut self.emitted, head)?;
                    }
                    Entry::Barrier(b) => {
                        barrier = Some(b);
                        break;
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
            }
            chunk.commit(taken);
            ch.read += taken as u64;
            ch.producer.notify();
            consumed += taken;
            if !self.buf.is_empty() {
                head.batch(&mut self.buf)?;
            }
            if let Some(barrier) = barrier {
                if self.block_on_barrier {
                    self.blocked[i] = true;
                }
                self.next = (i + 1) % n;
                return Ok(GatePoll::Barrier {
                    channel: i,
                    barrier,
                });
            }
            if !head.drain()? {
                self.next = (i + 1) % n;
                return Ok(GatePoll::Progress);
            }
        }
        self.next = (self.next + 1) % n;
        if self.live == 0 {
            head.end()?;
            self.end_delivered = true;
            return Ok(GatePoll::Finished);
        }
        Ok(if consumed > 0 {
            GatePoll::Progress
        } else {
            GatePoll::Idle
        })
    }
}

/// Delivers the input's watermark (the minimum over live channels) if it advanced.
fn advance<T>(
    watermarks: &[Timestamp],
    ended: &[bool],
    emitted: &mut Timestamp,
    head: &mut dyn Collector<T>,
) -> Result<()> {
    let min = watermarks
        .iter()
        .zip(ended)
        .filter(|(_, &e)| !e)
        .map(|(&w, _)| w)
        .min()
        .unwrap_or(Timestamp::MAX);
    if min > *emitted {
        *emitted = min;
        head.watermark(min)?;
    }
    Ok(())
}
