//! One worker thread: polls its tasks until all finish, the job fails, or it is cancelled.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::Error;
use crate::pipeline::{poll_catching_panics, JobControl, Task, TaskPoll};
use crate::wake::Parker;

/// Idle rounds spent spinning, then yielding, before a worker parks.
const SPIN_ROUNDS: u32 = 64;
const YIELD_ROUNDS: u32 = 256;
/// The longest a worker sleeps without being woken: bounds the cost of any missed wakeup.
const PARK_TIMEOUT: Duration = Duration::from_millis(1);

/// Shared by the workers of one job: the first failure, and how many workers completed.
pub(super) struct RunState {
    error: Mutex<Option<Error>>,
    failed: AtomicBool,
    completed_workers: AtomicUsize,
    workers: usize,
    parkers: Vec<Arc<Parker>>,
    /// When the last worker ran out of tasks (the job's end, for its elapsed time).
    ended: Mutex<Option<std::time::Instant>>,
}

impl RunState {
    pub(super) fn new(workers: usize, parkers: Vec<Arc<Parker>>) -> Self {
        RunState {
            error: Mutex::new(None),
            failed: AtomicBool::new(false),
            completed_workers: AtomicUsize::new(0),
            workers,
            parkers,
            ended: Mutex::new(None),
        }
    }

    /// Records the job's first error and wakes every worker so they all stop.
    pub(super) fn fail(&self, e: Error) {
        let mut slot = self.error.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(e);
        }
        self.failed.store(true, Ordering::SeqCst);
        for p in &self.parkers {
            p.unpark_now();
        }
    }

    /// Whether a task failed (the attempt is winding down).
    pub(super) fn has_failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    pub(super) fn take_error(&self) -> Option<Error> {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Whether every worker ran all its tasks to the end.
    pub(super) fn completed(&self) -> bool {
        self.completed_workers.load(Ordering::SeqCst) == self.workers
    }

    /// When every worker had run all its tasks to the end.
    pub(super) fn ended_at(&self) -> Option<std::time::Instant> {
        *self.ended.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub(super) struct Worker {
    pub(super) tasks: Vec<Box<dyn Task>>,
    pub(super) parker: Arc<Parker>,
    pub(super) control: Arc<JobControl>,
    pub(super) state: Arc<RunState>,
    pub(super) scope: Arc<crate::context::AttemptScope>,
    pub(super) core: Option<core_affinity::CoreId>,
    /// The memory keyed state keeps within: maps made on this worker keep within it.
    pub(super) state_budget: Option<Arc<crate::state::StateBudget>>,
}

impl Worker {
    // Not inlined into the thread's closure: profilers name the worker's loop by it
    // (perf/instructions.sh --scraped counts what runs under it). Called once a thread.
    #[inline(never)]
    pub(super) fn run(mut self) {
        self.parker.bind_current();
        let _budget = crate::state::StateBudget::enter(self.state_budget.take());
        if let Some(core) = self.core {
            // Pinning can fail in restricted containers; the job still runs, unpinned.
            let _ = core_affinity::set_for_current(core);
        }
        let mut idle_rounds = 0u32;
        let mut announced = false;
        loop {
            if self.control.cancel.load(Ordering::Relaxed) || self.state.failed.load(Ordering::Relaxed) {
                return;
            }
            let mut progress = false;
            let mut i = 0;
            while i < self.tasks.len() {
                match poll_catching_panics(&mut *self.tasks[i]) {
                    Ok(TaskPoll::Progress) => progress = true,
                    Ok(TaskPoll::Idle) => {}
                    Ok(TaskPoll::Finished) => {
                        self.scope.end.finished_tasks.fetch_add(1, Ordering::SeqCst);
                        self.tasks.swap_remove(i);
                        progress = true;
                        continue;
                    }
                    Err(e) => {
                        self.state.fail(e);
                        return;
                    }
                }
                i += 1;
            }
            if self.tasks.is_empty() {
                if self.state.completed_workers.fetch_add(1, Ordering::SeqCst) + 1 == self.state.workers {
                    *self.state.ended.lock().unwrap_or_else(|e| e.into_inner()) = Some(crate::context::wall::now());
                }
                return;
            }
            if progress {
                idle_rounds = 0;
                if announced {
                    self.parker.wake_up();
                    announced = false;
                }
                continue;
            }
            idle_rounds = idle_rounds.saturating_add(1);
            if idle_rounds < SPIN_ROUNDS {
                std::hint::spin_loop();
            } else if idle_rounds < YIELD_ROUNDS {
                std::thread::yield_now();
            } else if !announced {
                // Poll once more after announcing, so a write racing with this is not missed.
                self.parker.announce_sleep();
                announced = true;
            } else {
                self.parker.park(PARK_TIMEOUT);
                announced = false;
            }
        }
    }
}
