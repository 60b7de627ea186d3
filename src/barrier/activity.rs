//! What one task tells the job's [`CheckpointActivity`] it is doing for checkpoints (aligning,
//! capturing in-flight data, forking its state), so latency probes can attribute a record's
//! time in the job. Reported when the task's protocol state changes, at poll granularity.
//!
//! May touch: `context`, `metrics`.

use std::sync::Arc;

use crate::context::Clock;
use crate::metrics::{CheckpointActivity, LatencyCause};

/// A task's report. Dropped with its task (a failed attempt's included), it leaves what it had
/// entered, so a task that is gone holds no cause.
pub(crate) struct ActivityReport {
    activity: Arc<CheckpointActivity>,
    clock: Clock,
    aligning: bool,
    capturing: bool,
}

impl ActivityReport {
    pub(crate) fn new(activity: Arc<CheckpointActivity>, clock: Clock) -> Self {
        ActivityReport { activity, clock, aligning: false, capturing: false }
    }

    /// The task now is (or is not) aligning and capturing.
    #[inline]
    pub(crate) fn set(&mut self, aligning: bool, capturing: bool) {
        if aligning != self.aligning || capturing != self.capturing {
            let now = self.clock.now_ns();
            switch(&self.activity, LatencyCause::Aligning, &mut self.aligning, aligning, now);
            switch(&self.activity, LatencyCause::Capture, &mut self.capturing, capturing, now);
        }
    }

    /// The task forked its state (a snapshot's synchronous part) from `start_ns` to `end_ns`.
    pub(crate) fn forked(&self, start_ns: u64, end_ns: u64) {
        self.activity.happened(LatencyCause::SyncFork, start_ns, end_ns);
    }
}

fn switch(activity: &CheckpointActivity, cause: LatencyCause, was: &mut bool, now: bool, at_ns: u64) {
    match (*was, now) {
        (false, true) => activity.enter(cause, at_ns),
        (true, false) => activity.leave(cause, at_ns),
        _ => {}
    }
    *was = now;
}

impl Drop for ActivityReport {
    fn drop(&mut self) {
        self.set(false, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn a_task_enters_and_leaves_and_a_dropped_one_holds_nothing() {
        let time = Arc::new(AtomicU64::new(1_000));
        let activity = Arc::new(CheckpointActivity::default());
        let mut a = ActivityReport::new(Arc::clone(&activity), Clock::manual(Arc::clone(&time)));
        let mut b = ActivityReport::new(Arc::clone(&activity), Clock::manual(Arc::clone(&time)));
        assert_eq!(activity.spells(), [(0, 0); 3], "nothing ever happened");
        a.set(true, false);
        time.store(1_500, Ordering::Relaxed);
        b.set(true, true);
        assert_eq!(activity.spells(), [(1_000, u64::MAX), (0, 0), (1_500, u64::MAX)]);
        time.store(2_000, Ordering::Relaxed);
        a.set(false, false);
        assert_eq!(activity.spells()[0], (1_000, u64::MAX), "b still aligns");
        time.store(3_000, Ordering::Relaxed);
        drop(b);
        assert_eq!(activity.spells(), [(1_000, 3_000), (0, 0), (1_500, 3_000)], "b left both when it went");
        a.forked(3_400, 3_500);
        assert_eq!(activity.spells()[1], (3_400, 3_500));
    }
}
