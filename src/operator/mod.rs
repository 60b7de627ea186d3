//! Built-in operators, one file each. Every operator is a [`Collector`] of its input that
//! pushes into the [`Collector`] of its output (the next operator in the chain, or the ring
//! writers), so a chain is plain nested calls with one virtual call per batch per operator.
//!
//! - `stateless`: map, filter, flat_map, pass-through (union).
//! - `watermark`: timestamps and watermarks with bounded out-of-orderness.
//! - `keyed`: running keyed aggregation over [`crate::state::KeyedValueState`].
//! - `window`: keyed tumbling and sliding windows, in event or processing time.
//! - `session`: keyed event-time session windows.
//! - `co_process`: two-input keyed functions (connected streams, broadcast state).
//! - `join`: keyed two-input window join.
//! - `latency`: the event-creation-to-here latency probe.
//! - `process`: keyed process functions with a context (state per key, timers, side outputs).
//! - `side`: side outputs and the tags that name them.
//!
//! May touch: `collector`, `context`, `error`, `metrics`, `record`, `snapshot`, `state`,
//! `persist`, `wake`.

/// Forwards watermark and end to `next`, and makes it the collector the control methods'
/// defaults forward to (shared by the one-output operators that do nothing on a watermark).
macro_rules! forward_control {
    ($next:ident) => {
        fn watermark(&mut self, watermark: Timestamp) -> Result<()> {
            self.$next.watermark(watermark)
        }
        fn end(&mut self) -> Result<()> {
            self.$next.end()
        }
        $crate::operator::forward_barriers!($next);
    };
}
pub(crate) use forward_control;

pub mod co_process;
/// Snapshot, restore and rescaled restore of an operator whose state is the one
/// [`KeyedState`] field `$state`.
macro_rules! keyed_state_checkpointing {
    ($state:ident) => {
        fn snapshot_state(
            &mut self,
            _: &$crate::snapshot::Barrier,
        ) -> Result<Option<Box<dyn $crate::snapshot::ForkedState>>> {
            Ok(Some($crate::state::Snapshot::fork(&mut self.$state)))
        }
        fn restore_state(&mut self, bytes: &[u8]) -> Result<()> {
            $crate::state::Snapshot::restore(&mut self.$state, bytes)
        }
        fn restore_rescaled(&mut self, parts: &[(usize, &[u8])], scope: &crate::record::KeyScope) -> Result<()> {
            let parts: Vec<&[u8]> = parts.iter().map(|(_, b)| *b).collect();
            $crate::state::KeyedState::restore_owned(&mut self.$state, &parts, scope)
        }
        fn restore_local(&mut self, fork: &dyn $crate::snapshot::ForkedState) -> Result<()> {
            $crate::state::Snapshot::restore_local(&mut self.$state, fork)
        }
    };
}

pub(crate) use keyed_state_checkpointing;

/// Makes `next` the collector that [`Collector`]'s control methods (drain, barriers,
/// checkpoint notices) forward to by default.
macro_rules! forward_barriers {
    ($next:ident) => {
        fn next_control(&mut self) -> Option<&mut dyn $crate::collector::CollectorControl> {
            Some(&mut self.$next)
        }
    };
}
pub(crate) use forward_barriers;

pub(crate) mod join;
pub(crate) mod keyed;
pub(crate) mod latency;
pub mod process;
pub(crate) mod session;
pub mod side;
pub(crate) mod stateless;
pub(crate) mod watermark;
pub mod window;

use crate::collector::{Collector, CollectorControl};
use crate::error::Result;
use crate::record::Timestamp;
use crate::snapshot::{Barrier, CheckpointNotice, ForkedState, TaskSnapshot};

/// Where `flat_map` functions put their output.
pub struct Emitter<'a, T> {
    out: &'a mut Vec<T>,
}

impl<'a, T> Emitter<'a, T> {
    pub(crate) fn new(out: &'a mut Vec<T>) -> Self {
        Emitter { out }
    }
}

impl<T> Emitter<'_, T> {
    /// Emits one record.
    #[inline]
    pub fn emit(&mut self, record: T) {
        self.out.push(record);
    }
}

/// An operator with two inputs (the left one is input 1).
pub(crate) trait TwoInputOperator<A, B>: Send {
    fn batch1(&mut self, records: &mut Vec<A>) -> Result<()>;
    fn batch2(&mut self, records: &mut Vec<B>) -> Result<()>;
    fn watermark1(&mut self, watermark: Timestamp) -> Result<()>;
    fn watermark2(&mut self, watermark: Timestamp) -> Result<()>;
    fn end1(&mut self) -> Result<()>;
    fn end2(&mut self) -> Result<()>;
    /// See [`Collector::next_control`]: the control methods' defaults forward to it.
    fn next_control(&mut self) -> Option<&mut dyn CollectorControl> {
        None
    }
    /// See [`Collector::drain`].
    fn drain(&mut self) -> Result<bool> {
        self.next_control().map_or(Ok(true), |next| next.drain())
    }
    /// See [`Collector::barrier`].
    fn barrier(&mut self, barrier: Barrier, snapshot: &mut TaskSnapshot) -> Result<()> {
        self.next_control().map_or(Ok(()), |next| next.barrier(barrier, snapshot))
    }
    /// See [`Collector::notify`].
    fn notify(&mut self, notice: CheckpointNotice) -> Result<()> {
        self.next_control().map_or(Ok(()), |next| next.notify(notice))
    }
    fn snapshot_state(&mut self, barrier: &Barrier) -> Result<Option<Box<dyn ForkedState>>>;
    fn restore_state(&mut self, bytes: &[u8]) -> Result<()>;
    /// See [`Collector::restore_rescaled`].
    fn restore_rescaled(&mut self, _parts: &[(usize, &[u8])], _scope: &crate::record::KeyScope) -> Result<()> {
        Err(crate::Error::config("this operator's state cannot be restored at another parallelism"))
    }
}

impl<A, B, O: TwoInputOperator<A, B> + ?Sized> TwoInputOperator<A, B> for Box<O> {
    fn batch1(&mut self, records: &mut Vec<A>) -> Result<()> {
        (**self).batch1(records)
    }
    fn batch2(&mut self, records: &mut Vec<B>) -> Result<()> {
        (**self).batch2(records)
    }
    fn watermark1(&mut self, watermark: Timestamp) -> Result<()> {
        (**self).watermark1(watermark)
    }
    fn watermark2(&mut self, watermark: Timestamp) -> Result<()> {
        (**self).watermark2(watermark)
    }
    fn end1(&mut self) -> Result<()> {
        (**self).end1()
    }
    fn end2(&mut self) -> Result<()> {
        (**self).end2()
    }
    fn next_control(&mut self) -> Option<&mut dyn CollectorControl> {
        (**self).next_control()
    }
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
    fn restore_rescaled(&mut self, parts: &[(usize, &[u8])], scope: &crate::record::KeyScope) -> Result<()> {
        (**self).restore_rescaled(parts, scope)
    }
}

/// The left input of a [`TwoInputOperator`] as a [`Collector`], so an input gate can feed it.
pub(crate) struct Left<'a, A, B>(pub &'a mut dyn TwoInputOperator<A, B>);

/// The right input of a [`TwoInputOperator`] as a [`Collector`].
pub(crate) struct Right<'a, A, B>(pub &'a mut dyn TwoInputOperator<A, B>);

impl<A, B> Collector<A> for Left<'_, A, B> {
    fn batch(&mut self, records: &mut Vec<A>) -> Result<()> {
        self.0.batch1(records)
    }
    fn watermark(&mut self, watermark: Timestamp) -> Result<()> {
        self.0.watermark1(watermark)
    }
    fn end(&mut self) -> Result<()> {
        self.0.end1()
    }
    fn drain(&mut self) -> Result<bool> {
        self.0.drain()
    }
    fn barrier(&mut self, barrier: Barrier, snapshot: &mut TaskSnapshot) -> Result<()> {
        self.0.barrier(barrier, snapshot)
    }
    fn notify(&mut self, notice: CheckpointNotice) -> Result<()> {
        self.0.notify(notice)
    }
}

impl<A, B> Collector<B> for Right<'_, A, B> {
    fn batch(&mut self, records: &mut Vec<B>) -> Result<()> {
        self.0.batch2(records)
    }
    fn watermark(&mut self, watermark: Timestamp) -> Result<()> {
        self.0.watermark2(watermark)
    }
    fn end(&mut self) -> Result<()> {
        self.0.end2()
    }
    fn drain(&mut self) -> Result<bool> {
        self.0.drain()
    }
    fn barrier(&mut self, barrier: Barrier, snapshot: &mut TaskSnapshot) -> Result<()> {
        self.0.barrier(barrier, snapshot)
    }
    fn notify(&mut self, notice: CheckpointNotice) -> Result<()> {
        self.0.notify(notice)
    }
}

// Their fields are closures, shared internals or whole state: a name says enough.
crate::debug_as_name!(['a, T] Emitter<'a, T>);
