//! Side outputs (Flink's `OutputTag` and `ctx.output`): streams an operator emits beside its
//! main one, each named by a tag that carries its record type. `Outputs` is what an operator
//! with side outputs pushes into: the main collector and one buffered collector per side
//! output somebody reads (a side output nobody reads is dropped). Control (watermarks,
//! barriers, the end) goes to all of them, side buffers first, so each stream's records stay
//! before the barrier that follows them.

use std::any::Any;
use std::marker::PhantomData;
use std::sync::Arc;

use crate::collector::{Collector, CollectorControl};
use crate::error::{Error, Result};
use crate::record::Timestamp;
use crate::snapshot::{Barrier, CheckpointNotice, TaskSnapshot};

/// Names a side output and the type of its records. Made by [`crate::Job::output_tag`],
/// which refuses (when the job starts) one name given two types; read the stream with
/// [`crate::Stream::side_output`].
pub struct OutputTag<T> {
    pub(crate) name: Arc<str>,
    _t: PhantomData<fn() -> T>,
}

impl<T> Clone for OutputTag<T> {
    fn clone(&self) -> Self {
        OutputTag { name: Arc::clone(&self.name), _t: PhantomData }
    }
}

impl<T> OutputTag<T> {
    pub(crate) fn new(name: Arc<str>) -> Self {
        OutputTag { name, _t: PhantomData }
    }
    /// The side output's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// One side output's collector, whatever its record type.
pub(crate) trait SideSink: Send {
    fn as_any(&mut self) -> &mut dyn Any;
    /// Pushes the buffered records on.
    fn flush(&mut self) -> Result<()>;
    fn control(&mut self) -> &mut dyn CollectorControl;
}

/// The buffered collector of a side output of `X`.
pub(crate) struct SideOut<X> {
    buf: Vec<X>,
    next: Box<dyn Collector<X>>,
}

impl<X> SideOut<X> {
    pub(crate) fn new(next: Box<dyn Collector<X>>) -> Self {
        SideOut { buf: Vec::new(), next }
    }
}

impl<X: Send + 'static> SideSink for SideOut<X> {
    fn as_any(&mut self) -> &mut dyn Any {
        self
    }
    fn flush(&mut self) -> Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        self.next.batch(&mut self.buf)
    }
    fn control(&mut self) -> &mut dyn CollectorControl {
        &mut self.next
    }
}

/// The side outputs of one operator subtask, by name.
#[derive(Default)]
pub struct SideOutputs {
    sides: Vec<(Arc<str>, Box<dyn SideSink>)>,
    misuse: Option<String>,
}

impl SideOutputs {
    pub(crate) fn new(sides: Vec<(Arc<str>, Box<dyn SideSink>)>) -> Self {
        SideOutputs { sides, misuse: None }
    }

    /// Emits `record` to the side output `tag` (dropped if nobody reads it).
    #[inline]
    pub(crate) fn emit<X: 'static>(&mut self, tag: &OutputTag<X>, record: X) {
        let Some((_, side)) = self.sides.iter_mut().find(|(n, _)| Arc::ptr_eq(n, &tag.name) || **n == *tag.name) else {
            return;
        };
        match side.as_any().downcast_mut::<SideOut<X>>() {
            Some(out) => out.buf.push(record),
            None => {
                self.misuse.get_or_insert_with(|| {
                    format!(
                        "side output '{}' is read as another type than {} (a tag of another job?)",
                        tag.name,
                        std::any::type_name::<X>()
                    )
                });
            }
        }
    }

    fn each(&mut self, mut f: impl FnMut(&mut dyn SideSink) -> Result<()>) -> Result<()> {
        if let Some(m) = self.misuse.take() {
            return Err(Error::config(m));
        }
        self.sides.iter_mut().try_for_each(|(_, s)| f(&mut **s))
    }

    pub(crate) fn flush(&mut self) -> Result<()> {
        self.each(|s| s.flush())
    }
}

/// An operator's main output and its side outputs.
pub(crate) struct Outputs<O> {
    pub(crate) main: Box<dyn Collector<O>>,
    pub(crate) sides: SideOutputs,
}

impl<O> Outputs<O> {
    /// Only a main output (operator unit tests).
    #[cfg(test)]
    pub(crate) fn main(main: Box<dyn Collector<O>>) -> Self {
        Outputs { main, sides: SideOutputs::default() }
    }
}

// Outputs are the next collector of an operator with side outputs (`next_control`): every
// control call reaches the main and the side outputs.
crate::collector::control_through_collector!([O: Send] Outputs<O>);

impl<O> Collector<O> for Outputs<O> {
    fn batch(&mut self, records: &mut Vec<O>) -> Result<()> {
        self.sides.flush()?;
        if records.is_empty() {
            return Ok(());
        }
        self.main.batch(records)
    }
    fn watermark(&mut self, watermark: Timestamp) -> Result<()> {
        self.sides.each(|s| {
            s.flush()?;
            s.control().watermark(watermark)
        })?;
        Collector::watermark(&mut self.main, watermark)
    }
    fn end(&mut self) -> Result<()> {
        self.sides.each(|s| {
            s.flush()?;
            s.control().end()
        })?;
        Collector::end(&mut self.main)
    }
    fn drain(&mut self) -> Result<bool> {
        let mut all = true;
        self.sides.each(|s| {
            all &= s.control().drain()?;
            Ok(())
        })?;
        Ok(Collector::drain(&mut self.main)? && all)
    }
    fn barrier(&mut self, barrier: Barrier, snapshot: &mut TaskSnapshot) -> Result<()> {
        self.sides.each(|s| {
            s.flush()?;
            s.control().barrier(barrier, snapshot)
        })?;
        Collector::barrier(&mut self.main, barrier, snapshot)
    }
    fn notify(&mut self, notice: CheckpointNotice) -> Result<()> {
        self.sides.each(|s| s.control().notify(notice))?;
        Collector::notify(&mut self.main, notice)
    }
}

// Their fields are closures, shared internals or whole state: a name says enough.
crate::debug_as_name!([T] OutputTag<T>);
crate::debug_as_name!([] SideOutputs);
