//! In-flight data at a gate: the capture of an unaligned checkpoint's data (entries read after
//! the snapshot that the producer wrote before its barrier, encoded from a reference, peeked
//! in place where they are still in the ring), adaptive alignment's deferral (a channel read
//! up to its barrier and no further, and how much lies ahead of it), and the replay of a
//! restored checkpoint's in-flight data before the rings.
//!
//! May touch: `collector`, `error`, `persist`.

use super::{advance, ChannelReader, InputGate};
use crate::channel::Entry;
use crate::collector::Collector;
use crate::error::Result;
use crate::persist::Persist;

/// The in-flight data of one unaligned checkpoint at one gate: per channel, the entries the
/// producer wrote before its barrier (`limit`, once known) that this task reads after its
/// snapshot. Entries already in the ring are encoded in place (peeked, not consumed) when the
/// limit becomes known; the rest (not yet in the ring, or before the limit is known) are
/// encoded as they are consumed. Encoding from a reference is what lets records that own heap
/// memory be captured without a clone.
///
/// A gate may hold several, one per unaligned checkpoint snapshotted here and not yet
/// captured: each logs the same consumed entries into its own data (Flink takes one unaligned
/// checkpoint at a time; weir lets checkpoint n+1's barrier pass while n's data is captured).
pub(super) struct Capture {
    /// The checkpoint.
    pub(super) checkpoint: u64,
    /// Per channel: the producer's sequence number at its barrier, once it arrived.
    pub(super) limit: Vec<Option<u64>>,
    /// Per channel: entries before this position are captured (or were consumed before the
    /// snapshot).
    pub(super) upto: Vec<u64>,
    pub(super) data: Vec<Captured>,
}

/// One channel's captured in-flight entries: how many, and their [`Persist`] encodings one
/// after another (what `Vec<Entry<T>>` encodes to, less the length prefix).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Captured {
    pub(crate) entries: u64,
    pub(crate) bytes: Vec<u8>,
}

impl Captured {
    #[inline]
    pub(crate) fn push<T: Persist>(&mut self, entry: &Entry<T>) {
        entry.persist(&mut self.bytes);
        self.entries += 1;
    }

    /// The entries back (for tests; a restore decodes the whole part at once).
    #[cfg(test)]
    pub(crate) fn decode<T: Persist>(&self) -> Result<Vec<Entry<T>>> {
        let mut input = self.bytes.as_slice();
        let entries = (0..self.entries).map(|_| Entry::restore(&mut input)).collect::<Result<Vec<_>>>()?;
        assert!(input.is_empty(), "the count covers every byte");
        Ok(entries)
    }
}

/// Logs entry `pos` of channel `i`, consumed now, into each capture it is in flight for.
#[inline]
pub(super) fn log_consumed<T: Persist>(captures: &mut [Capture], i: usize, pos: u64, entry: &Entry<T>) {
    for cap in captures {
        if pos >= cap.upto[i] && cap.limit[i].is_none_or(|l| pos < l) {
            // Another checkpoint's barrier is not data, and it is past: the capture's position
            // moves over it (else a limit found later would lie ahead of the capture and
            // behind the read position).
            if !matches!(entry, Entry::Barrier(_)) {
                cap.data[i].push(entry);
            }
            cap.upto[i] = pos + 1;
        }
    }
}

impl<T: Persist> InputGate<T> {
    /// Forgets what priority barriers carried on channels no longer deferred: a deferred
    /// barrier's carried entries wait for its capture, the others' were stale.
    pub(super) fn forget_stale_carried(&mut self) {
        let mut kept = false;
        for (c, stop) in self.carried.iter_mut().zip(&self.stop_at) {
            if stop.is_none() {
                *c = None;
            }
            kept |= c.is_some();
        }
        self.carrying = kept;
    }

    /// Replays `entries` of each channel (in-flight data of a restored checkpoint) before
    /// reading that channel's ring.
    pub(crate) fn replay(&mut self, entries: Vec<(usize, Vec<Entry<T>>)>) {
        for (channel, es) in entries {
            assert!(channel < self.channels.len(), "restored in-flight data for a channel this input lacks");
            self.replay.extend(es.into_iter().map(|e| (channel, e)));
        }
    }

    /// Starts capturing in-flight data for an unaligned checkpoint (the task just snapshotted).
    ///
    /// In-flight data of a restored checkpoint not yet replayed comes before everything in the
    /// rings, and is in flight for this checkpoint too: it starts the capture. (A two-input
    /// task snapshots on one gate's barrier while its other gate may still be replaying.)
    pub(crate) fn start_capture(&mut self, checkpoint: u64) {
        debug_assert!(self.captures.iter().all(|c| c.checkpoint < checkpoint), "captures start in checkpoint order");
        let n = self.channels.len();
        let mut data = vec![Captured::default(); n];
        for (channel, entry) in &self.replay {
            data[*channel].push(entry);
        }
        let upto = self.channels.iter().map(|c| c.read).collect();
        self.captures.push(Capture { checkpoint, limit: vec![None; n], upto, data });
    }

    /// Channel `channel`'s barrier of `checkpoint` says its in-flight data ends before `seq`:
    /// copies what of it is in the ring now, without consuming it.
    pub(crate) fn set_capture_limit(&mut self, checkpoint: u64, channel: usize, seq: u64) {
        let read = self.channels[channel].read;
        let carried = self.carried[channel].take_if(|c| (c.0, c.1) == (checkpoint, seq)).map(|(_, _, c)| c);
        let carried_entries = carried.as_ref().map_or(0, |c| c.entries);
        // The carried entries read already are no longer in flight.
        let carried = carried.map(|c| skip_entries::<T>(c, read.saturating_sub(seq)));
        let Some(cap) = self.captures.iter_mut().find(|c| c.checkpoint == checkpoint) else {
            return;
        };
        if cap.limit[channel].is_some() {
            // The same barrier twice (in-band, then its republished copy, or the other way):
            // the first one set the limit, and the channel may have been read past it since.
            return;
        }
        // The first copy of the barrier: its position is never behind the read position but
        // by entries it carried (adaptive alignment reads through a deferred barrier's staged
        // entries, which a later barrier may carry again); an in-band barrier's position is
        // one behind it (the barrier entry itself was consumed).
        debug_assert!(
            seq + 1 + carried_entries >= read,
            "a barrier behind data already consumed: checkpoint {checkpoint} channel {channel} seq {seq} read {read}"
        );
        cap.limit[channel] = Some(seq);
        peek_into(&mut self.channels[channel], cap, channel);
        if let Some(c) = carried {
            // What the producer had staged follows what its ring held before the barrier.
            debug_assert!(cap.upto[channel] >= seq, "entries before a priority barrier are all in the ring");
            cap.data[channel].entries += c.entries;
            cap.data[channel].bytes.extend_from_slice(&c.bytes);
        }
    }

    /// Copies in-flight data that reached the rings since the limits became known (entries
    /// the producers had staged), so a capture completes without waiting for the backlog to
    /// be consumed.
    pub(crate) fn refresh_capture(&mut self) {
        for cap in &mut self.captures {
            for (i, ch) in self.channels.iter_mut().enumerate() {
                if cap.limit[i].is_some_and(|l| cap.upto[i] < l) {
                    peek_into(ch, cap, i);
                }
            }
        }
    }

    /// Entries consumed so far from channel `channel`.
    pub(crate) fn read_position(&self, channel: usize) -> u64 {
        self.channels[channel].read
    }

    /// Adaptive alignment: channel `channel`'s barrier of `checkpoint` is at `seq`; until
    /// [`InputGate::release_deferred`], the channel is read up to the barrier and no further:
    /// up to `seq`, and through the entries its producer still held staged, which the barrier
    /// carried and which reach the ring next.
    pub(crate) fn defer(&mut self, channel: usize, checkpoint: u64, seq: u64) {
        let staged =
            self.carried[channel].as_ref().filter(|c| (c.0, c.1) == (checkpoint, seq)).map_or(0, |c| c.2.entries);
        // Behind the read position only by staged entries read through an earlier deferral.
        debug_assert!(seq + staged >= self.channels[channel].read, "a barrier behind data already consumed");
        self.stop_at[channel] = Some(seq + staged);
    }

    /// Ends adaptive alignment: every channel is read on (past its barrier: the snapshot is
    /// taken).
    pub(crate) fn release_deferred(&mut self) {
        self.stop_at.iter_mut().for_each(|s| *s = None);
    }

    /// About how many bytes of in-flight data channel `channel` holds ahead of its deferred
    /// barrier: the entries in its ring before the barrier, at the encoded size of the first
    /// few of them, and the staged entries the barrier carried not yet read. `None` if it has
    /// no deferred barrier.
    pub(crate) fn ahead_bytes(&mut self, channel: usize) -> Option<u64> {
        let stop = self.stop_at[channel]?;
        let ch = &mut self.channels[channel];
        let ahead = stop.saturating_sub(ch.read);
        let avail = ch.consumer.slots() as u64;
        let in_ring = ahead.min(avail);
        // The carried entries not yet in the ring: the last of them.
        let staged = self.carried[channel].as_ref().map_or(0, |c| {
            let not_in_ring = ahead - in_ring;
            (c.2.bytes.len() as u64 * not_in_ring).div_ceil(c.2.entries.max(1))
        });
        if in_ring == 0 {
            return Some(staged);
        }
        // A sample's encoding sizes the rest; the chunk is dropped unread (a peek).
        const SAMPLE: u64 = 16;
        let chunk = ch.consumer.read_chunk(in_ring.min(SAMPLE) as usize).expect("avail slots were checked");
        let (a, b) = chunk.as_slices();
        let mut buf = std::mem::take(&mut self.sample);
        buf.clear();
        let mut n = 0u64;
        for e in a.iter().chain(b) {
            e.persist(&mut buf);
            n += 1;
        }
        let bytes = (buf.len() as u64).div_ceil(n.max(1)) * in_ring + staged;
        self.sample = buf;
        Some(bytes)
    }

    /// Per channel, the bytes captured so far for `checkpoint` (statistics).
    pub(crate) fn captured_bytes(&self, checkpoint: u64) -> Vec<u64> {
        let n = self.channels.len();
        self.captures
            .iter()
            .find(|c| c.checkpoint == checkpoint)
            .map_or_else(|| vec![0; n], |c| c.data.iter().map(|d| d.bytes.len() as u64).collect())
    }

    /// Whether every channel's in-flight data of `checkpoint` is captured.
    pub(crate) fn capture_complete(&self, checkpoint: u64) -> bool {
        self.captures.iter().find(|c| c.checkpoint == checkpoint).is_some_and(|c| {
            (0..self.channels.len()).all(|i| self.ended[i] || c.limit[i].is_some_and(|l| c.upto[i] >= l))
        })
    }

    /// Takes the captured in-flight data of `checkpoint`: (channel, entries) for channels
    /// that had any.
    pub(crate) fn take_capture(&mut self, checkpoint: u64) -> Vec<(usize, Captured)> {
        let Some(at) = self.captures.iter().position(|c| c.checkpoint == checkpoint) else {
            return Vec::new();
        };
        let c = self.captures.remove(at);
        c.data.into_iter().enumerate().filter(|(_, d)| d.entries > 0).collect()
    }

    /// Drops the capture of `checkpoint`, if one is in progress (it was abandoned).
    pub(crate) fn abort_capture(&mut self, checkpoint: u64) {
        self.captures.retain(|c| c.checkpoint != checkpoint);
    }

    /// Whether a capture is in progress.
    #[cfg(test)]
    pub(crate) fn capturing(&self) -> bool {
        !self.captures.is_empty()
    }

    /// Processes replayed entries; returns how many.
    pub(super) fn poll_replay(&mut self, head: &mut dyn Collector<T>, budget: usize) -> Result<usize> {
        let mut n = 0;
        while n < budget {
            let Some((i, entry)) = self.replay.pop_front() else {
                break;
            };
            n += 1;
            match entry {
                Entry::Record(r) => self.buf.push(r),
                Entry::Watermark(w) => {
                    if !self.buf.is_empty() {
                        head.batch(&mut self.buf)?;
                    }
                    self.watermarks[i] = self.watermarks[i].max(w);
                    advance(&self.watermarks, &self.ended, &mut self.emitted, head)?;
                }
                Entry::Barrier(_) | Entry::End => {}
            }
        }
        if !self.buf.is_empty() {
            head.batch(&mut self.buf)?;
        }
        Ok(n)
    }
}

/// `captured` less its first `n` entries.
pub(super) fn skip_entries<T: Persist>(mut captured: Captured, n: u64) -> Captured {
    if n == 0 {
        return captured;
    }
    let mut rest = captured.bytes.as_slice();
    let mut skipped = 0;
    while skipped < n.min(captured.entries) {
        if Entry::<T>::restore(&mut rest).is_err() {
            debug_assert!(false, "carried entries decode as they were encoded");
            break;
        }
        skipped += 1;
    }
    let at = captured.bytes.len() - rest.len();
    captured.bytes.drain(..at);
    captured.entries -= skipped;
    captured
}

/// Encodes channel `i`'s ring entries in `[upto, limit)` into the capture without consuming
/// them (a read chunk dropped without commit is a peek).
pub(super) fn peek_into<T: Persist>(ch: &mut ChannelReader<T>, cap: &mut Capture, i: usize) {
    let Some(limit) = cap.limit[i] else { return };
    let avail = ch.consumer.slots();
    if avail == 0 || cap.upto[i] >= limit {
        return;
    }
    let chunk = ch.consumer.read_chunk(avail).expect("avail slots were checked");
    let (a, b) = chunk.as_slices();
    // Everything consumed before the limit was logged as it was consumed.
    debug_assert!(cap.upto[i] >= ch.read.min(limit), "in-flight data consumed and not captured");
    let first = cap.upto[i].saturating_sub(ch.read) as usize;
    let last = limit.saturating_sub(ch.read).min(avail as u64) as usize;
    for e in a.iter().chain(b).take(last).skip(first) {
        cap.data[i].push(e);
    }
    if last > first {
        cap.upto[i] = ch.read + last as u64;
    }
}
