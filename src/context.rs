//! What a subtask knows about itself: its operator, index, parallelism, and the job's clock.
//!
//! Time reaches operators only through [`TaskContext::now_ns`], so tests can reason about it and
//! a later deterministic scheduler can replace it.
//!
//! May touch: `metrics`, `wake`.

use std::sync::Arc;
use std::time::Instant;

use crate::metrics::JobMetrics;
use crate::wake::Parker;

/// The job's monotonic clock: nanoseconds since the job started.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin: Instant,
}

impl Clock {
    /// A clock starting now.
    pub fn start() -> Clock {
        Clock {
            origin: Instant::now(),
        }
    }

    /// Nanoseconds since the clock started.
    #[inline]
    pub fn now_ns(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }
}

/// The identity and environment of one subtask.
#[derive(Clone)]
pub struct TaskContext {
    /// The operator's name (unique within a job).
    pub operator: Arc<str>,
    /// This subtask's index, `0 .. parallelism`.
    pub subtask: usize,
    /// The operator's parallelism.
    pub parallelism: usize,
    /// The job's maximum parallelism (number of key groups).
    pub max_parallelism: usize,
    pub(crate) clock: Clock,
    pub(crate) metrics: Arc<JobMetrics>,
    /// The parker of the worker that runs this subtask (for wakeups from outside the job).
    pub(crate) parker: Arc<Parker>,
}

impl TaskContext {
    /// Nanoseconds since the job started, from the job's clock.
    #[inline]
    pub fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }

    /// The job's metrics registry.
    pub fn metrics(&self) -> &Arc<JobMetrics> {
        &self.metrics
    }

    /// A context for unit tests of operators.
    #[cfg(test)]
    pub(crate) fn for_test(operator: &str, subtask: usize, parallelism: usize) -> TaskContext {
        TaskContext {
            operator: operator.into(),
            subtask,
            parallelism,
            max_parallelism: 128,
            clock: Clock::start(),
            metrics: Arc::new(JobMetrics::default()),
            parker: Arc::new(Parker::default()),
        }
    }
}
