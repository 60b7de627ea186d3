//! Event-time watermarks with bounded out-of-orderness (Flink's
//! `forBoundedOutOfOrderness`): after each batch, the watermark is the largest timestamp seen
//! minus the bound. At end of input the watermark jumps to `Timestamp::MAX`, firing every
//! window that is still open.

use crate::collector::Collector;
use crate::error::Result;
use crate::persist::from_bytes;
use crate::record::Timestamp;
use crate::snapshot::{Barrier, CheckpointNotice, ForkedState, PersistedFork, TaskSnapshot};

pub(crate) struct WatermarkAssigner<F, T> {
    timestamp: F,
    out_of_orderness: Timestamp,
    max_seen: Option<Timestamp>,
    emitted: Option<Timestamp>,
    next: Box<dyn Collector<T>>,
}

impl<F, T> WatermarkAssigner<F, T> {
    pub(crate) fn new(timestamp: F, out_of_orderness: Timestamp, next: Box<dyn Collector<T>>) -> Self {
        WatermarkAssigner { timestamp, out_of_orderness, max_seen: None, emitted: None, next }
    }
}

impl<T: Send, F: Fn(&T) -> Timestamp + Send> Collector<T> for WatermarkAssigner<F, T> {
    #[inline]
    fn batch(&mut self, records: &mut Vec<T>) -> Result<()> {
        let batch_max = records.iter().map(&self.timestamp).max();
        self.next.batch(records)?;
        if let Some(m) = batch_max {
            let max = self.max_seen.map_or(m, |s| s.max(m));
            self.max_seen = Some(max);
            let wm = max.saturating_sub(self.out_of_orderness);
            if self.emitted.is_none_or(|e| wm > e) {
                self.emitted = Some(wm);
                self.next.watermark(wm)?;
            }
        }
        Ok(())
    }

    fn watermark(&mut self, upstream: Timestamp) -> Result<()> {
        // This operator defines event time from here on; upstream watermarks are superseded,
        // but for the end of event time (all input has ended), which holds here too.
        if upstream == Timestamp::MAX && self.emitted != Some(Timestamp::MAX) {
            self.emitted = Some(Timestamp::MAX);
            self.next.watermark(Timestamp::MAX)?;
        }
        Ok(())
    }

    fn end(&mut self) -> Result<()> {
        if self.emitted != Some(Timestamp::MAX) {
            self.next.watermark(Timestamp::MAX)?;
        }
        self.next.end()
    }

    fn drain(&mut self) -> Result<bool> {
        self.next.drain()
    }
    fn barrier(&mut self, barrier: Barrier, snapshot: &mut TaskSnapshot) -> Result<()> {
        self.next.barrier(barrier, snapshot)
    }
    fn notify(&mut self, notice: CheckpointNotice) -> Result<()> {
        self.next.notify(notice)
    }
    fn snapshot_state(&mut self, _: &Barrier) -> Result<Option<Box<dyn ForkedState>>> {
        Ok(Some(Box::new(PersistedFork((self.max_seen, self.emitted)))))
    }
    fn restore_state(&mut self, bytes: &[u8]) -> Result<()> {
        (self.max_seen, self.emitted) = from_bytes(bytes)?;
        Ok(())
    }
    fn restore_rescaled(&mut self, parts: &[(usize, &[u8])], _scope: &crate::record::KeyScope) -> Result<()> {
        // The least of the old subtasks' positions: event time never runs ahead of any input.
        let decoded: Vec<(Option<Timestamp>, Option<Timestamp>)> =
            parts.iter().map(|(_, b)| from_bytes(b)).collect::<Result<_>>()?;
        self.max_seen = super::window::merged_watermark(decoded.iter().map(|d| d.0));
        self.emitted = super::window::merged_watermark(decoded.iter().map(|d| d.1));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collector::Recorder;
    use std::sync::{Arc, Mutex};

    #[test]
    fn watermarks_trail_the_maximum_by_the_bound() {
        let rec = Arc::new(Mutex::new(Recorder::<u64>::default()));
        let mut w = WatermarkAssigner::new(|t: &u64| *t, 10, Box::new(rec.clone()));
        w.batch(&mut vec![100, 50]).unwrap();
        w.batch(&mut vec![95]).unwrap(); // no advance
        w.batch(&mut vec![130]).unwrap();
        w.end().unwrap();
        let r = rec.lock().unwrap();
        assert_eq!(r.watermarks, vec![90, 120, u64::MAX]);
        assert_eq!(r.records, vec![100, 50, 95, 130]);
    }
}
