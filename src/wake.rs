//! [`Parker`]: how a producer (or consumer) wakes a worker that went to sleep.
//!
//! May touch: nothing else in the crate.
//!
//! The protocol is Dekker's: the sleeper stores `sleeping = true`, issues a SeqCst fence and
//! polls its rings once more before parking; a writer publishes into the ring, issues a SeqCst
//! fence and then reads `sleeping`. At least one of them sees the other's write, so a wakeup is
//! never lost; parking also has a bounded timeout, so even a bug here could only add latency,
//! never hang a job.

use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::OnceLock;
use std::thread::Thread;
use std::time::Duration;

use crossbeam_utils::CachePadded;

/// The sleep/wake handle of one worker.
#[derive(Default, Debug)]
pub(crate) struct Parker {
    thread: OnceLock<Thread>,
    // Padded: read by every writer into this worker's rings, written only by the worker.
    sleeping: CachePadded<AtomicBool>,
}

impl Parker {
    /// Binds the parker to the calling thread (the worker). Once.
    pub(crate) fn bind_current(&self) {
        let _ = self.thread.set(std::thread::current());
    }

    /// Called by whoever just published something the worker may be waiting for.
    #[inline]
    pub(crate) fn notify(&self) {
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) {
            if let Some(t) = self.thread.get() {
                t.unpark();
            }
        }
    }

    /// First half of going to sleep: after this the worker must poll once more before
    /// [`Parker::park`], and call [`Parker::wake_up`] instead if that poll made progress.
    pub(crate) fn announce_sleep(&self) {
        self.sleeping.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// Sleeps until notified or `timeout` passes.
    pub(crate) fn park(&self, timeout: Duration) {
        std::thread::park_timeout(timeout);
        self.wake_up();
    }

    /// Wakes the worker whatever it is doing (for stop, cancel and failure: the worker then
    /// re-reads the job's flags).
    pub(crate) fn unpark_now(&self) {
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }

    /// Clears the sleeping flag.
    pub(crate) fn wake_up(&self) {
        self.sleeping.store(false, Ordering::Relaxed);
    }
}
