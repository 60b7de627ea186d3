//! The latency probe: records, for every record passing, the time since the event was created
//! (read from the record by a user function, on the job's clock) into a per-subtask HDR
//! histogram, merged into the job's metrics every [`PUBLISH_NS`] of the job's clock (so the
//! metrics endpoint shows latency while the job runs) and at end of stream.
//!
//! Each sample is attributed to what the job's tasks were doing for checkpoints while its
//! record was in flight ([`LatencyCause`]: aligning, the synchronous fork, an in-flight
//! capture, nothing), read from the job's [`crate::metrics::CheckpointActivity`] once a batch,
//! so a user sees the tail each checkpoint mode adds rather than its mean.

use hdrhistogram::Histogram;

use crate::collector::Collector;
use crate::context::TaskContext;
use crate::error::Result;
use crate::metrics::{attribute, new_latency_histogram, LatencyCause};
use crate::record::Timestamp;

/// How often a probe hands what it recorded to the job's metrics (one lock a probe a tenth of a
/// second: nothing on the record path).
const PUBLISH_NS: u64 = 100_000_000;

pub(crate) struct LatencyProbe<F, T> {
    created_ns: F,
    ctx: TaskContext,
    /// What it recorded since it last handed it on, per cause ([`LatencyCause::ALL`]'s order).
    histograms: [Histogram<u64>; 4],
    /// When it last handed it on (job clock).
    published_ns: u64,
    next: Box<dyn Collector<T>>,
}

impl<F, T> LatencyProbe<F, T> {
    pub(crate) fn new(created_ns: F, ctx: TaskContext, next: Box<dyn Collector<T>>) -> Self {
        let published_ns = ctx.now_ns();
        let histograms = std::array::from_fn(|_| new_latency_histogram());
        LatencyProbe { created_ns, ctx, histograms, published_ns, next }
    }

    /// Hands what it recorded to the job's metrics, and starts afresh.
    fn publish(&mut self, now: u64) {
        if self.histograms.iter().any(|h| !h.is_empty()) {
            self.ctx.metrics.merge_latency_by_cause(&self.histograms);
            self.histograms.iter_mut().for_each(Histogram::reset);
        }
        self.published_ns = now;
    }
}

/// Records the latency of each of `records`, attributed by `cause_of` (from its creation
/// instant). Runs of equal latencies and causes (the results of one window firing share their
/// creation instant) are recorded with one histogram update each.
#[inline(always)]
fn record_runs<T>(
    histograms: &mut [Histogram<u64>; 4],
    records: &[T],
    created_ns: impl Fn(&T) -> u64,
    now: u64,
    cause_of: impl Fn(u64) -> LatencyCause,
) {
    let mut run: Option<(u64, LatencyCause, u64)> = None;
    for r in records {
        let created = created_ns(r);
        // Saturating: 0 ns is recorded as the histogram's lowest value.
        let latency = now.saturating_sub(created).max(1);
        let cause = cause_of(created);
        run = match run {
            Some((value, c, n)) if value == latency && c == cause => Some((value, c, n + 1)),
            Some((value, c, n)) => {
                record(histograms, c, value, n);
                Some((latency, cause, 1))
            }
            None => Some((latency, cause, 1)),
        };
    }
    if let Some((value, c, n)) = run {
        record(histograms, c, value, n);
    }
}

/// Records `n` samples of `value` attributed to `cause`.
#[inline]
fn record(histograms: &mut [Histogram<u64>; 4], cause: LatencyCause, value: u64, n: u64) {
    let _ = histograms[cause as usize].record_n(value, n);
}

impl<T: Send, F: Fn(&T) -> u64 + Send> Collector<T> for LatencyProbe<F, T> {
    #[inline]
    fn batch(&mut self, records: &mut Vec<T>) -> Result<()> {
        let now = self.ctx.now_ns();
        let spells = self.ctx.metrics.activity().spells();
        // Records created after every spell ended overlapped no checkpoint work (all of them
        // in a job without checkpoints): one comparison each.
        let newest = spells.iter().map(|&(_, end)| end).max().unwrap_or(0);
        let created_ns = &self.created_ns;
        if newest == 0 {
            // No checkpoint work ever (a job without checkpoints): the loop without attribution.
            record_runs(&mut self.histograms, records, |r| created_ns(r), now, |_| LatencyCause::Nothing);
        } else {
            record_runs(
                &mut self.histograms,
                records,
                |r| created_ns(r),
                now,
                |created| {
                    if created >= newest {
                        LatencyCause::Nothing
                    } else {
                        attribute(created, now, &spells)
                    }
                },
            );
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
        let mut probe = LatencyProbe::new(|&created: &u64| created, ctx.clone(), Box::new(Arc::clone(&rec)));
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
        ctx.clock = crate::context::Clock::manual(Arc::clone(&time));
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

    /// The lab's question: which tail does a checkpoint mode add? A task aligns from 10 ms to
    /// 60 ms of the job clock (its alignment held 50 ms); records that spent most of their time
    /// in it are attributed to aligning, those created after it to nothing, those in flight
    /// while a capture ran to the capture, and one queued behind a long fork to the fork.
    #[test]
    fn samples_are_attributed_to_what_the_job_did_while_they_were_in_flight() {
        use std::sync::atomic::{AtomicU64, Ordering};
        const MS: u64 = 1_000_000;
        let time = Arc::new(AtomicU64::new(0));
        let mut ctx = TaskContext::for_test("latency", 0, 1);
        ctx.clock = crate::context::Clock::manual(Arc::clone(&time));
        let mut probe = LatencyProbe::new(|&created: &u64| created, ctx.clone(), Box::new(crate::collector::Nowhere));
        // What a task reports (barrier::activity), told to the job's activity directly.
        let task = Arc::clone(ctx.metrics.activity());
        // Before any checkpoint work: nothing.
        time.store(5 * MS, Ordering::Relaxed);
        probe.batch(&mut vec![4 * MS]).unwrap();
        time.store(10 * MS, Ordering::Relaxed);
        task.enter(LatencyCause::Aligning, 10 * MS);
        // While it aligns, whatever is delivered was in flight during it.
        time.store(30 * MS, Ordering::Relaxed);
        probe.batch(&mut vec![9 * MS, 29 * MS]).unwrap();
        time.store(60 * MS, Ordering::Relaxed);
        task.leave(LatencyCause::Aligning, 60 * MS);
        // After: records created before the alignment ended were held by it; later ones not.
        time.store(70 * MS, Ordering::Relaxed);
        probe.batch(&mut vec![15 * MS, 59 * MS, 61 * MS, 65 * MS]).unwrap();
        // A capture from 80 to 90 ms.
        task.enter(LatencyCause::Capture, 80 * MS);
        time.store(90 * MS, Ordering::Relaxed);
        task.leave(LatencyCause::Capture, 90 * MS);
        probe.batch(&mut vec![75 * MS, 89 * MS, 90 * MS + 1]).unwrap();
        // A fork of 20 ms (big state) holds what queued behind it.
        task.happened(LatencyCause::SyncFork, 100 * MS, 120 * MS);
        time.store(121 * MS, Ordering::Relaxed);
        probe.batch(&mut vec![99 * MS]).unwrap();
        probe.end().unwrap();
        let by: std::collections::HashMap<_, _> = ctx.metrics.latency_by_cause().into_iter().collect();
        let aligning = &by[&LatencyCause::Aligning];
        assert_eq!(aligning.len(), 3, "9, 29 and 15 ms spent most of their time in the alignment");
        assert!(aligning.max() >= 55 * MS - MS / 100, "15 ms held until 70 ms: {}", aligning.max());
        assert_eq!(by[&LatencyCause::Capture].len(), 2, "75 and 89 ms");
        assert_eq!(
            by[&LatencyCause::Nothing].len(),
            5,
            "4, 61, 65 ms, the one after the capture, and 59 ms (1 ms of its 11 in the alignment)"
        );
        assert_eq!(by[&LatencyCause::SyncFork].len(), 1, "99 ms: 20 of its 22 ms behind the fork");
        assert_eq!(ctx.metrics.latency().unwrap().len(), 11, "the whole holds every sample");
    }
}
