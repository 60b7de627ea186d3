//! Event time on a [`Stream`]: watermark assigners, idleness, and the alignment groups that
//! keep sources together in event time.
//!
//! May touch: `error`, `operator`, `record`.

use std::sync::Arc;

use crate::operator::watermark::{WatermarkAlignment, WatermarkAssigner, WatermarkRegistry};
use crate::record::{Record, Timestamp};

use super::*;

impl<T: Record> Stream<T> {
    /// The job's watermark registry and default alignment group, which assigners not in a
    /// named group join.
    pub(super) fn default_watermark_groups(&self) -> (Arc<WatermarkRegistry>, Arc<WatermarkAlignment>) {
        let g = self.graph.borrow();
        (Arc::clone(&g.watermark_registry), Arc::clone(&g.default_alignment))
    }

    /// Assigns event time: `timestamp` reads a record's time; watermarks trail the largest time
    /// seen by `out_of_orderness`. At end of input the watermark jumps to the maximum. The
    /// job's assigners are kept together in event time when it has windows (see
    /// [`Job::with_watermark_alignment`]).
    pub fn with_watermarks<F: Fn(&T) -> Timestamp + Clone + Send + 'static>(
        self,
        timestamp: F,
        out_of_orderness: Timestamp,
    ) -> Stream<T> {
        let (registry, alignment) = self.default_watermark_groups();
        self.forward("watermarks", move |ctx, next| {
            let assigner = WatermarkAssigner::new(timestamp.clone(), out_of_orderness, next).registered(
                &registry,
                Arc::clone(&ctx.operator),
                ctx.subtask,
            );
            Ok(Box::new(assigner.aligned_if_bounded(&alignment, Arc::clone(&ctx.operator), ctx.subtask)))
        })
    }

    /// [`Stream::with_watermarks`] with idleness (Flink's `withIdleness`): a subtask that has
    /// had no input for `idleness` (processing time) stops holding event time back, following
    /// the least watermark of the job's other watermark assigners that are not idle, until
    /// input comes again. So a silent source (a push source nobody sends to, a followed log
    /// that does not grow, a partition without data) does not stop every window of the job
    /// from firing. Records that come after it followed the others may be late. The watermark
    /// it reached is snapshotted like any. An idleness of zero is refused when the job starts.
    ///
    /// ```
    /// use std::time::Duration;
    /// use weir::{Job, RunConfig, source::Generator};
    /// let job = Job::new("idle");
    /// let out = job
    ///     .generator(Generator::new(|i, _| i).count(100))
    ///     .with_watermarks_and_idleness(|t: &u64| *t, 0, Duration::from_millis(200))
    ///     .collect();
    /// job.execute(RunConfig::default().workers(1)).unwrap();
    /// assert_eq!(out.lock().unwrap().len(), 100);
    /// ```
    pub fn with_watermarks_and_idleness<F: Fn(&T) -> Timestamp + Clone + Send + 'static>(
        self,
        timestamp: F,
        out_of_orderness: Timestamp,
        idleness: std::time::Duration,
    ) -> Stream<T> {
        let (registry, alignment) = self.default_watermark_groups();
        self.forward("watermarks", move |ctx, next| {
            if idleness.is_zero() {
                return Err(crate::Error::config(
                    "an idleness of zero would make a watermark assigner idle between any two batches; give the \
                     time after which a silent input stops holding event time back",
                ));
            }
            let assigner = WatermarkAssigner::new(timestamp.clone(), out_of_orderness, next)
                .registered(&registry, Arc::clone(&ctx.operator), ctx.subtask)
                .idle_after(idleness, ctx.clock.clone())
                .aligned_if_bounded(&alignment, Arc::clone(&ctx.operator), ctx.subtask);
            Ok(Box::new(assigner))
        })
    }

    /// [`Stream::with_watermarks`] in a watermark alignment group (Flink's
    /// `withWatermarkAlignment`): every assigner made with the same `group` name in this job
    /// (this operator's subtasks, and other streams' assigners) stops taking input while its
    /// watermark is more than `max_drift` past the least in the group, so a fast input cannot
    /// open windows far ahead of a slow one (and hold them open, with their state). An input
    /// that has emitted no watermark yet holds the others at `max_drift`; one that ended holds
    /// nobody. A `max_drift` of zero is refused when the job starts.
    ///
    /// ```
    /// use weir::{Job, RunConfig, source::Generator};
    /// let job = Job::new("aligned").with_parallelism(2);
    /// let out = job
    ///     .generator(Generator::new(|i, _| i).count(10_000))
    ///     .with_aligned_watermarks(|t: &u64| *t, 0, "sources", 1_000)
    ///     .collect();
    /// job.execute(RunConfig::default().workers(2)).unwrap();
    /// assert_eq!(out.lock().unwrap().len(), 10_000);
    /// ```
    pub fn with_aligned_watermarks<F: Fn(&T) -> Timestamp + Clone + Send + 'static>(
        self,
        timestamp: F,
        out_of_orderness: Timestamp,
        group: &str,
        max_drift: Timestamp,
    ) -> Stream<T> {
        let alignment = {
            let mut g = self.graph.borrow_mut();
            match g.watermark_groups.iter().find(|(name, _)| name == group) {
                Some((_, a)) => Arc::clone(a),
                None => {
                    let a = WatermarkAlignment::new(max_drift);
                    g.watermark_groups.push((group.to_string(), Arc::clone(&a)));
                    a
                }
            }
        };
        let group = group.to_string();
        let registry = Arc::clone(&self.graph.borrow().watermark_registry);
        self.forward("watermarks", move |ctx, next| {
            if max_drift == 0 {
                return Err(crate::Error::config(format!(
                    "watermark alignment group '{group}' has a max drift of 0: no input could ever be ahead of \
                     another, so they would take turns one batch at a time; give a drift of at least a few \
                     batches' worth of event time"
                )));
            }
            if alignment.max_drift() != max_drift {
                return Err(crate::Error::config(format!(
                    "watermark alignment group '{group}' is given a max drift of {max_drift} here and {} elsewhere; \
                     one group has one drift",
                    alignment.max_drift()
                )));
            }
            let assigner = WatermarkAssigner::new(timestamp.clone(), out_of_orderness, next).registered(
                &registry,
                Arc::clone(&ctx.operator),
                ctx.subtask,
            );
            Ok(Box::new(assigner.aligned(&alignment, Arc::clone(&ctx.operator), ctx.subtask)))
        })
    }
}
