//! [`Collector`]: the push interface every stage of a subtask implements.
//!
//! A task is a chain: its head receives what the input rings (or the source) deliver, and each
//! stage pushes its output into the next stage's `Collector`, down to a sink or to the ring
//! writers of the task's outgoing edges. Records move in batches (`&mut Vec<T>`, drained by the
//! callee) so every virtual call and ring atomic is paid per batch, not per record.
//!
//! May touch: `error`, `record`, `snapshot`.

use crate::error::Result;
use crate::record::{KeyScope, Timestamp};
use crate::snapshot::{Barrier, CheckpointNotice, ForkedState, TaskSnapshot};

/// Receives one stream inside a subtask.
pub trait Collector<T>: Send {
    /// Takes every record out of `records`, leaving it empty (its allocation stays with the
    /// caller for reuse).
    fn batch(&mut self, records: &mut Vec<T>) -> Result<()>;

    /// The stream's event time has reached `watermark`: no later record will have a smaller
    /// timestamp (late records may still arrive and are the operator's to handle).
    fn watermark(&mut self, watermark: Timestamp) -> Result<()>;

    /// The stream has ended; nothing follows.
    fn end(&mut self) -> Result<()>;

    /// The next collector of the chain, whatever its record type: the defaults of
    /// [`Collector::drain`], [`Collector::barrier`] and [`Collector::notify`] forward to it.
    /// `None` (the default) when this collector ends the chain: then nothing is held back,
    /// and barriers and notices stop here.
    fn next_control(&mut self) -> Option<&mut dyn CollectorControl> {
        None
    }

    /// Pushes output held back by a full ring further. Returns `true` when nothing is held
    /// back any more; a task does not take new input while this is `false` (backpressure).
    /// By default, the next collector's.
    fn drain(&mut self) -> Result<bool> {
        self.next_control().map_or(Ok(true), |next| next.drain())
    }

    /// Checkpoint barrier `barrier` passes: forward it downstream (stateful operators are
    /// captured by their chain wrapper through [`Collector::snapshot_state`] first). By
    /// default, forwarded to the next collector.
    fn barrier(&mut self, barrier: Barrier, snapshot: &mut TaskSnapshot) -> Result<()> {
        self.next_control().map_or(Ok(()), |next| next.barrier(barrier, snapshot))
    }

    /// The coordinator decided a checkpoint's fate: forward the notice downstream (sinks
    /// commit or keep their transactions). By default, forwarded to the next collector.
    fn notify(&mut self, notice: CheckpointNotice) -> Result<()> {
        self.next_control().map_or(Ok(()), |next| next.notify(notice))
    }

    /// The synchronous part of this operator's snapshot: capture its state (`None`: stateless).
    fn snapshot_state(&mut self, _barrier: &Barrier) -> Result<Option<Box<dyn ForkedState>>> {
        Ok(None)
    }

    /// Restores this operator's state from what its [`ForkedState`] wrote.
    fn restore_state(&mut self, _bytes: &[u8]) -> Result<()> {
        Ok(())
    }

    /// Restores state saved at another parallelism: every old subtask's part; a keyed
    /// operator keeps the keys `scope` owns. Operators that cannot be rescaled refuse.
    fn restore_rescaled(&mut self, _parts: &[(usize, &[u8])], _scope: &KeyScope) -> Result<()> {
        Err(crate::Error::config("this operator's state cannot be restored at another parallelism"))
    }

    /// Restores this operator's state from the fork its [`Collector::snapshot_state`]
    /// captured, kept in this process (local recovery). By default from the fork's encoding;
    /// keyed state takes the fork's pages back as they are.
    fn restore_local(&mut self, fork: &dyn ForkedState) -> Result<()> {
        self.restore_state(&crate::snapshot::encoded(fork)?)
    }
}

impl<T, C: Collector<T> + ?Sized> Collector<T> for Box<C> {
    #[inline]
    fn batch(&mut self, records: &mut Vec<T>) -> Result<()> {
        (**self).batch(records)
    }
    #[inline]
    fn watermark(&mut self, watermark: Timestamp) -> Result<()> {
        (**self).watermark(watermark)
    }
    #[inline]
    fn end(&mut self) -> Result<()> {
        (**self).end()
    }
    fn next_control(&mut self) -> Option<&mut dyn CollectorControl> {
        (**self).next_control()
    }
    #[inline]
    fn drain(&mut self) -> Result<bool> {
        (**self).drain()
    }
    fn barrier(&mut self, barrier: Barrier, snapshot: &mut TaskSnapshot) -> Result<()> {
        (**self).barrier(barrier, snapshot)
    }
    fn notify(&mut self, notice: CheckpointNotice) -> Result<()> {
        (**self).notify(notice)
    }
    fn snapshot_state(&mut self, barrier: &Barrier) -> Result<Option<Box<dyn ForkedState>>> {
        (**self).snapshot_state(barrier)
    }
    fn restore_state(&mut self, bytes: &[u8]) -> Result<()> {
        (**self).restore_state(bytes)
    }
    fn restore_rescaled(&mut self, parts: &[(usize, &[u8])], scope: &KeyScope) -> Result<()> {
        (**self).restore_rescaled(parts, scope)
    }
    fn restore_local(&mut self, fork: &dyn ForkedState) -> Result<()> {
        (**self).restore_local(fork)
    }
}

/// The control half of a [`Collector`], whatever its record type: what an operator's
/// [`Collector::next_control`] returns, so the control methods' defaults can forward to a
/// next collector of another record type, and what side outputs are driven through.
pub trait CollectorControl: Send {
    /// [`Collector::watermark`].
    fn watermark(&mut self, watermark: Timestamp) -> Result<()>;
    /// [`Collector::end`].
    fn end(&mut self) -> Result<()>;
    /// [`Collector::drain`].
    fn drain(&mut self) -> Result<bool>;
    /// [`Collector::barrier`].
    fn barrier(&mut self, barrier: Barrier, snapshot: &mut TaskSnapshot) -> Result<()>;
    /// [`Collector::notify`].
    fn notify(&mut self, notice: CheckpointNotice) -> Result<()>;
}

/// Implements [`CollectorControl`] for a [`Collector`] of one record type by calling its
/// `Collector` methods.
macro_rules! control_through_collector {
    ([$($gen:tt)*] $ty:ty) => {
        impl<$($gen)*> $crate::collector::CollectorControl for $ty {
            fn watermark(&mut self, watermark: $crate::record::Timestamp) -> $crate::error::Result<()> {
                $crate::collector::Collector::watermark(self, watermark)
            }
            fn end(&mut self) -> $crate::error::Result<()> {
                $crate::collector::Collector::end(self)
            }
            fn drain(&mut self) -> $crate::error::Result<bool> {
                $crate::collector::Collector::drain(self)
            }
            fn barrier(
                &mut self,
                barrier: $crate::snapshot::Barrier,
                snapshot: &mut $crate::snapshot::TaskSnapshot,
            ) -> $crate::error::Result<()> {
                $crate::collector::Collector::barrier(self, barrier, snapshot)
            }
            fn notify(&mut self, notice: $crate::snapshot::CheckpointNotice) -> $crate::error::Result<()> {
                $crate::collector::Collector::notify(self, notice)
            }
        }
    };
}
pub(crate) use control_through_collector;

control_through_collector!([X] Box<dyn Collector<X>>);

/// Moves every record out of `records` in order, handing each to `f` with the records after
/// it (still in place, for a look-ahead), and leaves `records` empty with its allocation: what
/// a collector does with a batch. The records are read in place; the element-wise moves of
/// `Vec::drain` cost the key-by and window paths 5–10%. A panic in `f` leaks the records not
/// yet handed over (it never drops one twice).
#[inline(always)]
pub(crate) fn move_each<T>(records: &mut Vec<T>, mut f: impl FnMut(T, &[T])) {
    let len = records.len();
    let base = records.as_mut_ptr();
    // SAFETY: shrinking the length only stops the vector from dropping its elements; the
    // allocation is not touched through `records` until the loop ends (`f` cannot reach it).
    unsafe { records.set_len(0) };
    for i in 0..len {
        // SAFETY: `i < len`; element `i` is read exactly once and the ones after it are still
        // initialised, so the slice of them is valid for as long as this call lasts.
        let (record, rest) =
            unsafe { (std::ptr::read(base.add(i)), std::slice::from_raw_parts(base.add(i + 1), len - i - 1)) };
        f(record, rest);
    }
}

/// Moves every record out of `records` in order, `BLOCK` at a time, in two passes over each
/// block: first `key` puts each record's key into `keys` (which lends its allocation and is
/// left empty), then `each` takes the records with their keys, in order. Between the passes a
/// caller prefetches what the keys will look up, so a block's lookups find it in cache. Both
/// passes get `ctx` (what both need, borrowed once). Records and keys are moved out by
/// pointer, not through iterators of `Option`s (for a key with a niche, the compiler copied an
/// `Option`'s payload around its tag, and the lookups' loads of that copy stalled on the
/// stores). A panic leaks the records and keys not yet handed over (never drops one twice).
#[inline(always)]
pub(crate) fn move_in_blocks<T, K, C, const BLOCK: usize>(
    records: &mut Vec<T>,
    keys: &mut Vec<K>,
    ctx: &mut C,
    mut key: impl FnMut(&mut C, &[T], &mut Vec<K>),
    mut each: impl FnMut(&mut C, T, K),
) {
    let len = records.len();
    let base = records.as_mut_ptr();
    // SAFETY: at length 0 the vector no longer drops its records: each is read out below
    // exactly once, and a panic in `key` or `each` leaks the unread ones (never drops one
    // twice). The allocation is not touched through `records` until the loop ends.
    unsafe { records.set_len(0) };
    let mut start = 0;
    while start < len {
        let n = (len - start).min(BLOCK);
        // SAFETY: records `start .. start + n` are initialised and not yet read out.
        let block = unsafe { std::slice::from_raw_parts(base.add(start), n) };
        debug_assert!(keys.is_empty(), "the keys of a block live in the spare capacity");
        key(ctx, block, keys);
        debug_assert_eq!(keys.len(), n, "a key for every record of the block");
        // SAFETY: the keys stay in the allocation, beyond the length, until each is read out
        // below; at length 0 a panic leaks the unread ones (as for the records).
        unsafe { keys.set_len(0) };
        for j in 0..n {
            // SAFETY: `j < n`: record `start + j` and key `j` are initialised and each is read
            // exactly once.
            let (r, k) = unsafe { (std::ptr::read(base.add(start + j)), std::ptr::read(keys.as_ptr().add(j))) };
            each(ctx, r, k);
        }
        start += n;
    }
}

/// Sends a stream to several collectors (a stream consumed by more than one operator).
pub(crate) struct FanOut<T> {
    outputs: Vec<Box<dyn Collector<T>>>,
    copy: Vec<T>,
}

impl<T> FanOut<T> {
    pub(crate) fn new(outputs: Vec<Box<dyn Collector<T>>>) -> Self {
        assert!(outputs.len() >= 2, "a fan-out has at least two outputs");
        FanOut { outputs, copy: Vec::new() }
    }
}

impl<T: Clone + Send> Collector<T> for FanOut<T> {
    fn batch(&mut self, records: &mut Vec<T>) -> Result<()> {
        let (last, rest) = self.outputs.split_last_mut().expect("at least two outputs");
        for out in rest {
            self.copy.clear();
            self.copy.extend_from_slice(records);
            out.batch(&mut self.copy)?;
        }
        last.batch(records)
    }
    fn watermark(&mut self, watermark: Timestamp) -> Result<()> {
        self.outputs.iter_mut().try_for_each(|o| Collector::watermark(o, watermark))
    }
    fn end(&mut self) -> Result<()> {
        self.outputs.iter_mut().try_for_each(|o| Collector::end(o))
    }
    fn drain(&mut self) -> Result<bool> {
        let mut all = true;
        for o in &mut self.outputs {
            all &= Collector::drain(o)?;
        }
        Ok(all)
    }
    fn barrier(&mut self, barrier: Barrier, snapshot: &mut TaskSnapshot) -> Result<()> {
        self.outputs.iter_mut().try_for_each(|o| Collector::barrier(o, barrier, snapshot))
    }
    fn notify(&mut self, notice: CheckpointNotice) -> Result<()> {
        self.outputs.iter_mut().try_for_each(|o| Collector::notify(o, notice))
    }
}

/// Hands each batch of records to a closure and ignores everything else: what a lone
/// channel's reader ([`crate::channel::ChannelReceiver::poll`]) and the gate's tests put at
/// the end of a gate. The closure takes the records it keeps (what it leaves is cleared).
pub(crate) struct OnBatch<F>(pub(crate) F);

impl<T, F: FnMut(&mut Vec<T>) + Send> Collector<T> for OnBatch<F> {
    fn batch(&mut self, records: &mut Vec<T>) -> Result<()> {
        (self.0)(records);
        records.clear();
        Ok(())
    }
    fn watermark(&mut self, _: Timestamp) -> Result<()> {
        Ok(())
    }
    fn end(&mut self) -> Result<()> {
        Ok(())
    }
}

/// Drops everything (the output of an operator nobody consumes).
pub(crate) struct Nowhere;

impl<T> Collector<T> for Nowhere {
    fn batch(&mut self, records: &mut Vec<T>) -> Result<()> {
        records.clear();
        Ok(())
    }
    fn watermark(&mut self, _: Timestamp) -> Result<()> {
        Ok(())
    }
    fn end(&mut self) -> Result<()> {
        Ok(())
    }
}

/// A collector that records everything it sees, for unit tests of operators.
#[cfg(test)]
#[derive(Default)]
pub(crate) struct Recorder<T> {
    pub records: Vec<T>,
    pub watermarks: Vec<Timestamp>,
    pub ended: bool,
    /// Calls of `drain` (pushes of held-back output).
    pub drains: usize,
}

#[cfg(test)]
impl<T: Send> Collector<T> for std::sync::Arc<std::sync::Mutex<Recorder<T>>> {
    fn batch(&mut self, records: &mut Vec<T>) -> Result<()> {
        let mut r = self.lock().expect("recorder lock");
        assert!(!r.ended, "records after end of stream");
        r.records.append(records);
        Ok(())
    }
    fn watermark(&mut self, watermark: Timestamp) -> Result<()> {
        let mut r = self.lock().expect("recorder lock");
        if let Some(&last) = r.watermarks.last() {
            assert!(watermark > last, "watermarks must strictly increase");
        }
        r.watermarks.push(watermark);
        Ok(())
    }
    fn end(&mut self) -> Result<()> {
        let mut r = self.lock().expect("recorder lock");
        assert!(!r.ended, "end of stream twice");
        r.ended = true;
        Ok(())
    }
    fn drain(&mut self) -> Result<bool> {
        self.lock().expect("recorder lock").drains += 1;
        Ok(true)
    }
}
