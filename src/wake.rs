//! [`Parker`]: how a producer (or consumer) wakes a worker that went to sleep.
//!
//! May touch: nothing else in the crate.
//!
//! The protocol is Dekker's: the sleeper stores `sleeping = true`, issues a SeqCst fence and
//! polls its rings once more before parking; a writer publishes into the ring, issues a SeqCst
//! fence and then reads `sleeping`. At least one of them sees the other's write, so a wakeup is
//! never lost; parking also has a bounded timeout, so even a bug here could only add latency,
//! never hang a job.

use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
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

/// Locks `m`, taking over a lock a panicking thread poisoned (what it guards here stays
/// consistent across a panic: queues and slots, written whole under the lock).
pub(crate) fn lock<X>(m: &std::sync::Mutex<X>) -> std::sync::MutexGuard<'_, X> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How the job wakes host threads (and async tasks) that wait on an embedding endpoint (a push
/// source's sender waiting for room, a pull sink's receiver waiting for results), and how it
/// tells them the job has ended.
///
/// The same Dekker handshake as [`Parker`], for any number of host threads that come and go: a
/// waiter counts itself in `waiting` and checks its condition again under the mutex before it
/// sleeps on the condvar; the job publishes, issues a SeqCst fence and takes the mutex only if
/// somebody waits. So the job pays one fence and one load per notification when no host waits.
#[derive(Default)]
pub(crate) struct HostSignal {
    lock: std::sync::Mutex<()>,
    cond: std::sync::Condvar,
    waiting: AtomicUsize,
    /// The job's end: `Some(None)` when it finished (or was stopped), `Some(Some(error))` when
    /// it failed; set once.
    outcome: OnceLock<Option<String>>,
    waker: std::sync::Mutex<Option<std::task::Waker>>,
    has_waker: AtomicBool,
}

impl HostSignal {
    /// The job published something a host may wait for.
    #[inline]
    pub(crate) fn notify(&self) {
        fence(Ordering::SeqCst);
        if self.waiting.load(Ordering::Relaxed) > 0 {
            let _guard = lock(&self.lock);
            self.cond.notify_all();
        }
        if self.has_waker.load(Ordering::Relaxed) {
            // Cleared under the lock that `register` sets it under: cleared after the lock
            // (as it was), a waker registered in between was left in the slot unflagged, and
            // no later notify woke it (an async host waited for ever, found by a host that
            // awaits a send and a receive on one thread).
            let waker = {
                let mut slot = lock(&self.waker);
                self.has_waker.store(false, Ordering::Relaxed);
                slot.take()
            };
            if let Some(w) = waker {
                w.wake();
            }
        }
    }

    /// The job has ended (for good: no failover follows); `error` is why it failed.
    pub(crate) fn job_ended(&self, error: Option<String>) {
        let _ = self.outcome.set(error);
        self.notify();
    }

    /// How the job ended, once it has.
    pub(crate) fn outcome(&self) -> Option<&Option<String>> {
        self.outcome.get()
    }

    /// Calls `check` until it gives a value, sleeping between calls until notified, until the
    /// job has ended (then `check` runs once more), or until `deadline` (then `None`).
    pub(crate) fn wait_until<R>(
        &self,
        deadline: std::time::Instant,
        mut check: impl FnMut() -> Option<R>,
    ) -> Option<R> {
        if let Some(r) = check() {
            return Some(r);
        }
        let mut guard = lock(&self.lock);
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let found = loop {
            if let Some(r) = check() {
                break Some(r);
            }
            // The lowest layer, below the clock's: a host's wait reads the wall clock itself.
            #[allow(clippy::disallowed_methods)]
            let now = std::time::Instant::now();
            if now >= deadline || self.outcome.get().is_some() {
                break None;
            }
            guard = self.cond.wait_timeout(guard, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        };
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        found
    }

    /// Registers the waker of an async task to wake on the next notification. The caller
    /// checks its condition again afterwards (a notification may have come just before).
    /// Threads waiting in [`HostSignal::wait_until`] now.
    #[cfg(test)]
    pub(crate) fn waiters(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    pub(crate) fn register(&self, waker: &std::task::Waker) {
        let mut slot = lock(&self.waker);
        match slot.as_ref() {
            Some(w) if w.will_wake(waker) => {}
            _ => *slot = Some(waker.clone()),
        }
        self.has_waker.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests drive the engine from outside: their threads and clocks are theirs
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;
    use std::time::Instant;

    /// Every interleaving of one publish+notify with one wait finds the value: the waiter
    /// either sees it on a check or is woken (a generous deadline only bounds a failure).
    #[test]
    fn a_wait_never_misses_a_notification() {
        for _ in 0..200 {
            let signal = Arc::new(HostSignal::default());
            let value = Arc::new(AtomicU64::new(0));
            let (s, v) = (Arc::clone(&signal), Arc::clone(&value));
            let t = std::thread::spawn(move || {
                v.store(7, Ordering::SeqCst);
                s.notify();
            });
            let deadline = Instant::now() + Duration::from_secs(60);
            let got = signal.wait_until(deadline, || Some(value.load(Ordering::SeqCst)).filter(|&x| x == 7));
            assert_eq!(got, Some(7));
            t.join().unwrap();
        }
    }

    #[test]
    fn the_end_stops_a_wait_and_says_why() {
        let signal = HostSignal::default();
        signal.job_ended(Some("boom".into()));
        let got: Option<()> = signal.wait_until(Instant::now() + Duration::from_secs(60), || None);
        assert_eq!(got, None);
        assert_eq!(signal.outcome(), Some(&Some("boom".to_string())));
    }
}
