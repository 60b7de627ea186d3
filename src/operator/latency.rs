//! The latency probe: records, for every record passing, the time since the event was created
//! (read from the record by a user function, on the job's clock) into a per-subtask HDR
//! histogram, merged into the job's metrics at end of stream.

use hdrhistogram::Histogram;

use crate::collector::Collector;
use crate::context::TaskContext;
use crate::error::Result;
use crate::metrics::new_latency_histogram;
use crate::record::Timestamp;
use crate::snapshot::{Barrier, CheckpointNotice, TaskSnapshot};

pub(crate) struct LatencyProbe<F, T> {
    created_ns: F,
    ctx: TaskContext,
    histogram: Histogram<u64>,
    next: Box<dyn Collector<T>>,
}

impl<F, T> LatencyProbe<F, T> {
    pub(crate) fn new(created_ns: F, ctx: TaskContext, next: Box<dyn Collector<T>>) -> Self {
        LatencyProbe { created_ns, ctx, histogram: new_latency_histogram(), next }
    }
}

impl<T: Send, F: Fn(&T) -> u64 + Send> Collector<T> for LatencyProbe<F, T> {
    #[inline]
    fn batch(&mut self, records: &mut Vec<T>) -> Result<()> {
        let now = self.ctx.now_ns();
        for r in records.iter() {
            // Saturating: 0 ns is recorded as the histogram's lowest value.
            let _ = self.histogram.record(now.saturating_sub((self.created_ns)(r)).max(1));
        }
        self.next.batch(records)
    }
    fn watermark(&mut self, watermark: Timestamp) -> Result<()> {
        self.next.watermark(watermark)
    }
    fn end(&mut self) -> Result<()> {
        self.ctx.metrics.merge_latency(&self.histogram);
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
}
