//! The latency probe: records, for every record passing, the time since the event was created
//! (read from the record by a user function, on the job's clock) into a per-subtask HDR
//! histogram, merged into the job's metrics every [`PUBLISH_NS`] of the job's clock (so the
//! metrics endpoint shows latency while the job runs) and at end of stream.

use hdrhistogram::Histogram;

use crate::collector::Collector;
use crate::context::TaskContext;
use crate::error::Result;
use crate::metrics::new_latency_histogram;
use crate::record::Timestamp;

/// How often a probe hands what it recorded to the job's metrics (one lock a probe a tenth of a
/// second: nothing on the record path).
const PUBLISH_NS: u64 = 100_000_000;

pub(crate) struct LatencyProbe<F, T> {
    created_ns: F,
    ctx: TaskContext,
    /// What it recorded since it last handed it on.
    histogram: Histogram<u64>,
    /// When it last handed it on (job clock).
    published_ns: u64,
    next: Box<dyn Collector<T>>,
}

impl<F, T> LatencyProbe<F, T> {
    pub(crate) fn new(created_ns: F, ctx: TaskContext, next: Box<dyn Collector<T>>) -> Self {
        let published_ns = ctx.now_ns();
        LatencyProbe { created_ns, ctx, histogram: new_latency_histogram(), published_ns, next }
    }

    /// Hands what it recorded to the job's metrics, and starts afresh.
    fn publish(&mut self, now: u64) {
        if !self.histogram.is_empty() {
            self.ctx.metrics.merge_latency(&self.histogram);
            self.histogram.reset();
        }
        self.published_ns = now;
    }
}

impl<T: Send, F: Fn(&T) -> u64 + Send> Collector<T> for LatencyProbe<F, T> {
    #[inline]
    fn batch(&mut self, records: &mut Vec<T>) -> Result<()> {
        let now = self.ctx.now_ns();
        // Runs of equal latencies (the results of one window firing share their creation
        // instant) are recorded with one histogram update each.
        let mut run: Option<(u64, u64)> = None;
        for r in records.iter() {
            // Saturating: 0 ns is recorded as the histogram's lowest value.
            let latency = now.saturating_sub((self.created_ns)(r)).max(1);
            run = match run {
                Some((value, n)) if value == latency => Some((value, n + 1)),
                Some((value, n)) => {
                    let _ = self.histogram.record_n(value, n);
                    Some((latency, 1))
                }
                None => Some((latency, 1)),
            };
        }
        if let Some((value, n)) = run {
            let _ = self.histogram.record_n(value, n);
        }
        if now.saturating_sub(self.published_ns) >= PUBLISH_NS {
            self.publish(now);
        }
        self.next.batch(records)
    }
    fn watermark(&mut self, watermark: Timestamp) -> Result<()> {
        self.next.watermark(watermark)
    }
    fn end(&mut self) -> Result<()> {
        self.publish(self.ctx.now_ns());
        self.next.end()
    }
    fn next_control(&mut self) -> Option<&mut dyn crate::collector::CollectorControl> {
        Some(&mut self.next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collector::Recorder;
    use std::sync::{Arc, Mutex};

    #[test]
    fn every_record_is_counted_once_whatever_its_runs() {
        let ctx = TaskContext::for_test("latency", 0, 1);
        let rec = Arc::new(Mutex::new(Recorder::<u64>::default()));
        let mut probe = LatencyProbe::new(|&created: &u64| created, ctx.clone(), Box::new(rec.clone()));
        // u64::MAX is "created in the future": recorded as the lowest value, 1 ns; 0 is as old
        // as the job clock.
        let future = u64::MAX;
        let batches = [vec![future, future, 0, 0, 0, future, 0], vec![0], vec![future], vec![]];
        for b in &batches {
            probe.batch(&mut b.clone()).unwrap();
        }
        probe.end().unwrap();
        let h = ctx.metrics.latency().expect("the probe merged its histogram");
        assert_eq!(h.len(), 9);
        assert_eq!(h.count_at(1), 4, "the four future records");
        assert_eq!(h.count_between(2, u64::MAX), 5, "the five records created at 0");
        let passed = rec.lock().unwrap().records.clone();
        assert_eq!(passed, batches.concat(), "records pass unchanged, in order");
    }

    /// Latency stayed empty until subtasks ended: a probe now hands its records on every tenth
    /// of a second of the job's clock, before the end, each record once.
    #[test]
    fn latency_is_seen_while_the_job_runs() {
        use std::sync::atomic::{AtomicU64, Ordering};
        let time = Arc::new(AtomicU64::new(0));
        let mut ctx = TaskContext::for_test("latency", 0, 1);
        ctx.clock = crate::context::Clock::manual(time.clone());
        let rec = Arc::new(Mutex::new(Recorder::<u64>::default()));
        let mut probe = LatencyProbe::new(|&created: &u64| created, ctx.clone(), Box::new(rec));
        probe.batch(&mut vec![0, 0]).unwrap();
        assert!(ctx.metrics.latency().is_none(), "not yet a tenth of a second");
        time.store(PUBLISH_NS, Ordering::SeqCst);
        probe.batch(&mut vec![0]).unwrap();
        assert_eq!(ctx.metrics.latency().unwrap().len(), 3, "seen while running");
        probe.batch(&mut vec![0]).unwrap();
        probe.end().unwrap();
        assert_eq!(ctx.metrics.latency().unwrap().len(), 4, "each record once");
    }
}
