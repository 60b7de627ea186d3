//! The embedding source: a host thread pushes events through a lock-free SPSC ring straight into
//! a source subtask, and wakes its worker if it sleeps.
//!
//! Events are numbered in the order they are sent, from the job's *resume point* (0 on a fresh
//! start; after a restart from a checkpoint, the number of the first event that checkpoint did
//! not cover). With checkpoints on, the source keeps every event since the last completed
//! checkpoint in a bounded replay buffer that outlives the attempt: after a failover the new
//! attempt replays from it, so the job survives task failures exactly-once. When the buffer is
//! full the source stops reading the ring, so the host is backpressured; no event is dropped.
//! After a process restart the buffer is gone, and the host resends from
//! [`EventSender::resume_from`] (a host with its own log gets exactly-once across crashes too).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rtrb::{Consumer, Producer};

use super::{Source, SourcePoll};
use crate::channel::Entry;
use crate::context::TaskContext;
use crate::error::{Error, Result};
use crate::wake::{lock, HostSignal, Parker};

/// Why an event was not sent; the event comes back in it.
#[derive(Debug, PartialEq, Eq)]
pub enum SendError<T> {
    /// The ring is full: the job is behind (or its replay buffer waits for a checkpoint to
    /// complete). Try again, or use [`EventSender::send_timeout`].
    Full(T),
    /// [`EventSender::send_timeout`] waited its whole timeout for room.
    Timeout(T),
    /// The job has ended and reads no more events. `error` is why it failed (`None`: it
    /// finished, was stopped or cancelled).
    Ended {
        /// The event that was not sent.
        event: T,
        /// The job's error, if it failed.
        error: Option<String>,
    },
}

impl<T> SendError<T> {
    /// The event that was not sent.
    pub fn into_event(self) -> T {
        match self {
            SendError::Full(e) | SendError::Timeout(e) | SendError::Ended { event: e, .. } => e,
        }
    }
}

impl<T> std::fmt::Display for SendError<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Full(_) => f.write_str("the push source's ring is full (the job is behind)"),
            SendError::Timeout(_) => f.write_str("timed out waiting for room in the push source's ring"),
            SendError::Ended { error: None, .. } => f.write_str("the job has ended"),
            SendError::Ended { error: Some(e), .. } => write!(f, "the job failed: {e}"),
        }
    }
}

impl<T: std::fmt::Debug> std::error::Error for SendError<T> {}

/// The default bound of a push source's replay buffer, in events.
pub const DEFAULT_REPLAY_EVENTS: usize = 1 << 20;

/// What survives an attempt: the job's end of the ring and the replay buffer.
struct PushLog<T> {
    consumer: Consumer<Entry<T>>,
    /// Events from `base` on that a failover may have to replay (all events read from the ring
    /// since the last completed checkpoint; empty without checkpoints).
    replay: VecDeque<T>,
    /// The number of `replay[0]`; `base + replay.len()` is the number of the next event in the
    /// ring.
    base: u64,
    /// The number the end of the stream came at, once it did.
    end_at: Option<u64>,
    /// No attempt has run in this process yet (a restored offset then sets `base`).
    fresh: bool,
}

/// Between the host's [`EventSender`] and every attempt's source.
struct PushShared<T> {
    log: Mutex<Option<PushLog<T>>>,
    /// The number of the next event the job expects, once it started: the resume point.
    resume: Mutex<Option<u64>>,
    /// Host waits (room in the ring, the resume point) and the job's end.
    signal: Arc<HostSignal>,
    /// The worker that runs the source now, and a counter of changes to it (the sender
    /// re-reads the parker only when the counter moved).
    worker: Mutex<Option<Arc<Parker>>>,
    worker_epoch: AtomicU64,
    /// The sender was closed or dropped: once the ring is empty the stream has ended, with
    /// or without the end marker (which a full ring had no room for). Set after the last push,
    /// then the worker is woken: a source that reads it set and then an empty ring has every
    /// event.
    sender_gone: AtomicBool,
}

impl<T> PushShared<T> {
    /// The resume point, or the job's end; `None` while neither is known.
    fn resume_or_end(&self) -> Option<std::result::Result<u64, SendError<()>>> {
        if let Some(seq) = *lock(&self.resume) {
            return Some(Ok(seq));
        }
        self.signal.outcome().map(|error| Err(SendError::Ended { event: (), error: error.clone() }))
    }
}

/// The host's end of a push source: send events into a running (or not yet started) job.
///
/// `Send`: it may move to another thread (a tokio blocking task, say), but there is one sender.
pub struct EventSender<T> {
    producer: Producer<Entry<T>>,
    shared: Arc<PushShared<T>>,
    worker: Option<Arc<Parker>>,
    worker_epoch: u64,
    sent: u64,
    closed: bool,
}

impl<T> EventSender<T> {
    /// Sends one event without blocking. The error says why not: the ring is full, or the job
    /// has ended (with its error); the event comes back in it.
    #[inline]
    pub fn try_send(&mut self, event: T) -> std::result::Result<(), SendError<T>> {
        if let Some(error) = self.shared.signal.outcome() {
            return Err(SendError::Ended { event, error: error.clone() });
        }
        match self.producer.push(Entry::Record(event)) {
            Ok(()) => {
                self.sent += 1;
                self.notify();
                Ok(())
            }
            Err(rtrb::PushError::Full(Entry::Record(event))) => Err(SendError::Full(event)),
            Err(rtrb::PushError::Full(_)) => unreachable!("a record was pushed"),
        }
    }

    /// Sends one event, waiting up to `timeout` for room in the ring.
    pub fn send_timeout(&mut self, event: T, timeout: Duration) -> std::result::Result<(), SendError<T>> {
        let deadline = crate::context::wall::now() + timeout;
        let signal = Arc::clone(&self.shared.signal);
        let mut event = event;
        loop {
            event = match self.try_send(event) {
                Err(SendError::Full(e)) if crate::context::wall::now() < deadline => e,
                Err(SendError::Full(e)) => return Err(SendError::Timeout(e)),
                other => return other,
            };
            let producer = &self.producer;
            signal.wait_until(deadline, || (!producer.is_full()).then_some(()));
        }
    }

    /// Sends one event, waiting for room in the ring without blocking a thread: a future any
    /// runtime can await (the counterpart of the pull sink's [`crate::sink::EventReceiver::recv`]).
    /// It is ready with `Ok` once the event is in the ring, or with the job's end.
    ///
    /// ```no_run
    /// # async fn host(mut tx: weir::source::EventSender<String>) {
    /// tx.send("river".to_string()).await.unwrap();
    /// # }
    /// ```
    pub fn send(&mut self, event: T) -> Sending<'_, T> {
        Sending { sender: self, event: Some(event) }
    }

    /// Sends as many events from the front of `events` as fit without blocking (cloning them);
    /// returns how many. Nothing is sent once the job has ended.
    pub fn send_slice(&mut self, events: &[T]) -> usize
    where
        T: Clone,
    {
        if self.shared.signal.outcome().is_some() {
            return 0;
        }
        let n = events.len().min(self.producer.slots());
        if n > 0 {
            let chunk = self.producer.write_chunk_uninit(n).expect("n free slots were checked");
            chunk.fill_from_iter(events[..n].iter().cloned().map(Entry::Record));
            self.sent += n as u64;
            self.notify();
        }
        n
    }

    /// The number the job gives the first event this sender sends: 0 on a fresh start; after
    /// a restart from a checkpoint, the first event that checkpoint does not cover. A host that
    /// logs its events resends its log from here. Waits up to `timeout` for the job's source to
    /// be restored (it knows the number only then), which does not wait for the host to receive
    /// anything: ask before, while or after receiving. `Err(SendError::Timeout(()))` means "not
    /// known yet" (the job has not started, or is still reading its checkpoint), never "nothing
    /// to resend": ask again. An async host awaits [`EventSender::resume_point`] instead.
    pub fn resume_from(&self, timeout: Duration) -> std::result::Result<u64, SendError<()>> {
        let shared = &self.shared;
        shared
            .signal
            .wait_until(crate::context::wall::now() + timeout, || shared.resume_or_end())
            .unwrap_or(Err(SendError::Timeout(())))
    }

    /// [`EventSender::resume_from`] without blocking a thread: a future ready with the resume
    /// point once the job's source was restored (or with the job's end). It is `Send` and
    /// borrows nothing, so a spawned task can await it. No timeout of its own: wrap
    /// it in the runtime's (`tokio::time::timeout`).
    ///
    /// ```no_run
    /// # async fn host(tx: weir::source::EventSender<String>, log: Vec<String>) {
    /// let from = tx.resume_point().await.unwrap();
    /// // Resend the host's own log from `from` on.
    /// # }
    /// ```
    pub fn resume_point(&self) -> ResumePoint<T> {
        ResumePoint { shared: Arc::clone(&self.shared) }
    }

    /// The number of the next event this sender sends, once the job told its resume point.
    pub fn next_seq(&self) -> Option<u64> {
        lock(&self.shared.resume).map(|r| r + self.sent)
    }

    /// Ends the stream: the job finishes once it has processed everything sent. Never blocks
    /// (so it is as safe in async code as [`EventSender::close_async`]): the end marker goes
    /// into the ring if there is room, and the source ends the stream at an empty ring after a
    /// closed sender either way. Dropping the sender does the same.
    pub fn close(mut self) {
        self.end_stream();
    }

    /// Ends the stream as [`EventSender::close`] does, as a future (ready at once; kept for
    /// hosts written when closing waited for room).
    pub fn close_async(self) -> Closing<T> {
        Closing { sender: self }
    }

    /// Drops the sender without ending the stream: the host process died (a simulated
    /// crash), and its job with it.
    #[doc(hidden)] // for weir's own crates (weir-jobs)
    pub fn abandon(mut self) {
        self.closed = true;
    }

    /// Ends the stream without waiting: the end marker if the ring has room (the source then
    /// records where the stream ended), and in any case the mark that the sender is gone, then
    /// a wake-up for the worker.
    fn end_stream(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        let _ = self.producer.push(Entry::End);
        self.shared.sender_gone.store(true, Ordering::Release);
        self.notify();
    }

    #[inline]
    fn notify(&mut self) {
        let epoch = self.shared.worker_epoch.load(Ordering::Acquire);
        if epoch != self.worker_epoch {
            self.worker = lock(&self.shared.worker).clone();
            self.worker_epoch = epoch;
        }
        if let Some(p) = &self.worker {
            p.notify();
        }
    }
}

/// The future of [`EventSender::send`].
#[must_use = "a future does nothing unless awaited (or polled)"]
pub struct Sending<'a, T> {
    sender: &'a mut EventSender<T>,
    /// The event, until it is in the ring.
    event: Option<T>,
}

// Nothing in it relies on staying in place: the event is moved in and out by value.
impl<T> Unpin for Sending<'_, T> {}

impl<T> std::future::Future for Sending<'_, T> {
    type Output = std::result::Result<(), SendError<T>>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        let this = self.get_mut();
        let event = this.event.take().expect("a send future polled after it was ready");
        let event = match this.sender.try_send(event) {
            Err(SendError::Full(e)) => e,
            other => return std::task::Poll::Ready(other),
        };
        this.sender.shared.signal.register(cx.waker());
        // Room may have come between the try and the registration.
        match this.sender.try_send(event) {
            Err(SendError::Full(e)) => {
                this.event = Some(e);
                std::task::Poll::Pending
            }
            other => std::task::Poll::Ready(other),
        }
    }
}

/// The future of [`EventSender::close_async`].
#[must_use = "a future does nothing unless awaited (or polled)"]
pub struct Closing<T> {
    sender: EventSender<T>,
}

impl<T> Closing<T> {
    /// See [`EventSender::abandon`].
    #[doc(hidden)] // for weir's own crates (weir-jobs)
    pub fn abandon(self) {
        self.sender.abandon();
    }
}

impl<T> Unpin for Closing<T> {}

impl<T> std::future::Future for Closing<T> {
    type Output = ();

    fn poll(self: std::pin::Pin<&mut Self>, _cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        self.get_mut().sender.end_stream();
        std::task::Poll::Ready(())
    }
}

/// The future of [`EventSender::resume_point`]: `Send` (it holds none of the sender's
/// single-threaded ring end), so a `tokio::spawn`ed task can await it.
#[must_use = "a future does nothing unless awaited (or polled)"]
pub struct ResumePoint<T> {
    shared: Arc<PushShared<T>>,
}

impl<T> std::future::Future for ResumePoint<T> {
    type Output = std::result::Result<u64, SendError<()>>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        if let Some(r) = self.shared.resume_or_end() {
            return std::task::Poll::Ready(r);
        }
        self.shared.signal.register(cx.waker());
        // The source may have been restored between the look and the registration.
        match self.shared.resume_or_end() {
            Some(r) => std::task::Poll::Ready(r),
            None => std::task::Poll::Pending,
        }
    }
}

impl<T> Drop for EventSender<T> {
    fn drop(&mut self) {
        // Dropping the sender ends the stream, as dropping a channel sender does; without
        // waiting for room (a drop in async code must not block the thread).
        self.end_stream();
    }
}

/// One attempt's push source: takes the log for its life and gives it back when dropped (so
/// the next attempt replays from it).
pub(crate) struct PushSource<T> {
    shared: Arc<PushShared<T>>,
    log: Option<PushLog<T>>,
    /// The number of the next event to emit.
    next: u64,
    /// Keep events for replay (checkpoints are on).
    replaying: bool,
    replay_capacity: usize,
    /// The host ring was full at a poll, and has not been below half full since.
    backlogged: bool,
}

/// The two ends of a push source: the host's sender and what makes each attempt's source.
pub(crate) fn push_channel<T>(capacity: usize) -> (EventSender<T>, PushSourceFactory<T>) {
    let (producer, consumer) = rtrb::RingBuffer::new(capacity.max(1));
    let shared = Arc::new(PushShared {
        log: Mutex::new(Some(PushLog { consumer, replay: VecDeque::new(), base: 0, end_at: None, fresh: true })),
        resume: Mutex::new(None),
        signal: Arc::new(HostSignal::default()),
        worker: Mutex::new(None),
        worker_epoch: AtomicU64::new(0),
        sender_gone: AtomicBool::new(false),
    });
    let sender =
        EventSender { producer, shared: Arc::clone(&shared), worker: None, worker_epoch: 0, sent: 0, closed: false };
    (sender, PushSourceFactory { shared })
}

/// Makes the push source of each attempt.
pub(crate) struct PushSourceFactory<T> {
    shared: Arc<PushShared<T>>,
}

impl<T> PushSourceFactory<T> {
    /// The signal the runtime uses to tell the host the job ended.
    pub(crate) fn signal(&self) -> Arc<HostSignal> {
        Arc::clone(&self.shared.signal)
    }

    /// The source of one attempt; `replay_capacity` bounds the replay buffer when
    /// `checkpointed`.
    pub(crate) fn make(&self, ctx: &TaskContext, checkpointed: bool, replay_capacity: usize) -> Result<PushSource<T>> {
        if checkpointed && replay_capacity == 0 {
            return Err(Error::config(format!(
                "push source '{}': a replay buffer of 0 events cannot keep events until a checkpoint completes; \
                 give it room for at least one batch",
                ctx.operator
            )));
        }
        let log = lock(&self.shared.log).take().ok_or_else(|| {
            Error::config(format!("push source '{}' is already running in another attempt", ctx.operator))
        })?;
        *lock(&self.shared.worker) = Some(Arc::clone(&ctx.parker));
        self.shared.worker_epoch.fetch_add(1, Ordering::Release);
        // A fresh attempt (no checkpoint restored) replays everything still buffered: no
        // completed checkpoint covers it.
        let next = log.base;
        Ok(PushSource {
            shared: Arc::clone(&self.shared),
            log: Some(log),
            next,
            replaying: checkpointed,
            replay_capacity,
            backlogged: false,
        })
    }
}

impl<T> Drop for PushSource<T> {
    fn drop(&mut self) {
        if let Some(log) = self.log.take() {
            *lock(&self.shared.log) = Some(log);
        }
    }
}

impl<T: Clone + Send> Source<T> for PushSource<T> {
    fn backlog(&self) -> bool {
        self.backlogged
    }

    fn poll(&mut self, _ctx: &TaskContext, out: &mut Vec<T>, max: usize) -> Result<SourcePoll> {
        let log = self.log.as_mut().expect("held for the source's life");
        let before = out.len();
        let (queued, capacity) = (log.consumer.slots(), log.consumer.buffer().capacity());
        if queued >= capacity {
            self.backlogged = true;
        } else if queued <= capacity / 2 {
            self.backlogged = false;
        }
        // Replay first: events a failed attempt emitted after the restored checkpoint.
        let buffered = log.base + log.replay.len() as u64;
        while out.len() - before < max && self.next < buffered {
            out.push(log.replay[(self.next - log.base) as usize].clone());
            self.next += 1;
        }
        if log.end_at == Some(self.next) {
            return Ok(if out.len() == before { SourcePoll::Finished } else { SourcePoll::Emitted });
        }
        if out.len() - before == max {
            return Ok(SourcePoll::Emitted);
        }
        let room = if self.replaying { self.replay_capacity - log.replay.len() } else { usize::MAX };
        let n = log.consumer.slots().min(max - (out.len() - before)).min(room);
        if n == 0 {
            return Ok(if out.len() > before {
                SourcePoll::Emitted
            } else if (self.shared.sender_gone.load(Ordering::Acquire) || log.consumer.is_abandoned())
                && log.consumer.is_empty()
            {
                SourcePoll::Finished
            } else {
                // An empty ring, or a full replay buffer waiting for a checkpoint to complete.
                SourcePoll::Idle
            });
        }
        let chunk = log.consumer.read_chunk(n).expect("n slots were checked");
        let mut ended = false;
        for e in chunk {
            match e {
                Entry::Record(r) => {
                    if self.replaying {
                        log.replay.push_back(r.clone());
                    } else {
                        log.base += 1;
                    }
                    out.push(r);
                    self.next += 1;
                }
                Entry::End => {
                    log.end_at = Some(self.next);
                    ended = true;
                    break;
                }
                Entry::Watermark(_) | Entry::Barrier(_) => {}
            }
        }
        self.shared.signal.notify();
        Ok(if ended && out.len() == before { SourcePoll::Finished } else { SourcePoll::Emitted })
    }

    fn offset(&self) -> Option<Vec<u8>> {
        Some(self.next.to_le_bytes().to_vec())
    }

    fn seek(&mut self, offset: &[u8]) -> Result<()> {
        let at = u64::from_le_bytes(
            offset.try_into().map_err(|_| Error::Corrupt("a push source's offset is not 8 bytes".into()))?,
        );
        let log = self.log.as_mut().expect("held for the source's life");
        if log.fresh {
            // A new process: the events before `at` are covered by the checkpoint, and the
            // host resends from `at` (see `EventSender::resume_from`).
            log.base = at;
        } else if at < log.base || at > log.base + log.replay.len() as u64 {
            return Err(Error::Corrupt(format!(
                "the push source is to replay from event {at}, but its buffer holds events {} to {}",
                log.base,
                log.base + log.replay.len() as u64
            )));
        }
        self.next = at;
        Ok(())
    }

    fn restored(&mut self) {
        // The host may be waiting for this before it receives anything: a sink restored with
        // more results than its queue holds keeps this task from polling until the host drains
        // it, so the resume point is told now, not at the first poll.
        if let Some(log) = self.log.as_mut() {
            log.fresh = false;
        }
        *lock(&self.shared.resume) = Some(self.next);
        self.shared.signal.notify();
    }

    fn checkpoint_complete(&mut self, _id: u64, offset: &[u8]) {
        let Ok(bytes) = <[u8; 8]>::try_from(offset) else { return };
        let covered = u64::from_le_bytes(bytes);
        let log = self.log.as_mut().expect("held for the source's life");
        while log.base < covered && !log.replay.is_empty() {
            log.replay.pop_front();
            log.base += 1;
        }
    }
}

// Their fields are closures, shared internals or whole state: a name says enough.
crate::debug_as_name!([T] EventSender<T>);
crate::debug_as_name!(['a, T] Sending<'a, T>);
crate::debug_as_name!([T] Closing<T>);
crate::debug_as_name!([T] ResumePoint<T>);

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests drive the engine from outside: their threads and clocks are theirs
mod tests {
    use std::future::Future;

    use super::*;

    fn source(factory: &PushSourceFactory<u32>, ctx: &TaskContext, checkpointed: bool) -> PushSource<u32> {
        factory.make(ctx, checkpointed, 4).unwrap()
    }

    /// [`source`] as the job starts it fresh: nothing restored.
    fn started(factory: &PushSourceFactory<u32>, ctx: &TaskContext, checkpointed: bool) -> PushSource<u32> {
        let mut src = source(factory, ctx, checkpointed);
        src.restored();
        src
    }

    #[test]
    fn events_arrive_in_order_then_end() {
        let (mut tx, factory) = push_channel::<u32>(4);
        let ctx = TaskContext::for_test("push", 0, 1);
        let mut src = started(&factory, &ctx, false);
        assert_eq!(tx.send_slice(&[1, 2, 3, 4, 5]), 4);
        assert_eq!(tx.try_send(9), Err(SendError::Full(9)), "a full ring hands the event back");
        let mut out = Vec::new();
        assert_eq!(src.poll(&ctx, &mut out, 10).unwrap(), SourcePoll::Emitted);
        assert_eq!(tx.resume_from(Duration::ZERO), Ok(0));
        tx.try_send(5).unwrap();
        assert_eq!(tx.next_seq(), Some(5));
        tx.close();
        assert_eq!(src.poll(&ctx, &mut out, 10).unwrap(), SourcePoll::Emitted);
        assert_eq!(src.poll(&ctx, &mut out, 10).unwrap(), SourcePoll::Finished);
        assert_eq!(out, vec![1, 2, 3, 4, 5]);
    }

    /// A failover replays what the restored checkpoint does not cover, from memory; a full
    /// replay buffer stops reading the ring (backpressure) until a checkpoint completes.
    #[test]
    fn a_new_attempt_replays_from_the_restored_offset() {
        let (mut tx, factory) = push_channel::<u32>(8);
        let ctx = TaskContext::for_test("push", 0, 1);
        let mut src = started(&factory, &ctx, true);
        assert_eq!(tx.send_slice(&[10, 11, 12, 13, 14, 15]), 6);
        let mut out = Vec::new();
        src.poll(&ctx, &mut out, 2).unwrap();
        let checkpoint = src.offset().unwrap(); // after events 0 and 1
        src.poll(&ctx, &mut out, 10).unwrap();
        assert_eq!(out, vec![10, 11, 12, 13], "the replay buffer holds 4 events");
        assert_eq!(src.poll(&ctx, &mut Vec::new(), 10).unwrap(), SourcePoll::Idle, "full: backpressure");
        src.checkpoint_complete(1, &checkpoint);
        drop(src); // the attempt fails
        let mut again = source(&factory, &ctx, true);
        again.seek(&checkpoint).unwrap();
        again.restored();
        let mut replayed = Vec::new();
        again.poll(&ctx, &mut replayed, 10).unwrap();
        again.poll(&ctx, &mut replayed, 10).unwrap();
        assert_eq!(replayed, vec![12, 13, 14, 15], "replayed from event 2, then the ring");
        assert!(again.seek(&0u64.to_le_bytes()).is_err(), "events before the completed checkpoint are gone");
    }

    /// Closing or dropping a sender whose ring is full waited (up to 10 s) for room: a drop in
    /// async code blocked its runtime's thread. Neither waits now, and the stream still ends
    /// after every event sent: the source sees the sender gone once the ring is empty.
    #[test]
    fn a_sender_dropped_at_a_full_ring_ends_the_stream_without_waiting() {
        let (mut tx, factory) = push_channel::<u32>(4);
        let ctx = TaskContext::for_test("push", 0, 1);
        let mut src = started(&factory, &ctx, false);
        assert_eq!(tx.send_slice(&[1, 2, 3, 4]), 4, "the ring is full");
        let signal = factory.signal();
        let dropping = std::thread::spawn(move || drop(tx));
        // The old drop waited on the signal for room that only this thread's polls make:
        // either it is seen waiting, or the drop ends without having waited.
        while !dropping.is_finished() {
            assert_eq!(signal.waiters(), 0, "the drop waits for room in the ring");
            std::thread::yield_now();
        }
        dropping.join().unwrap();
        let mut out = Vec::new();
        while src.poll(&ctx, &mut out, 2).unwrap() == SourcePoll::Emitted {}
        assert_eq!(out, vec![1, 2, 3, 4]);
        assert_eq!(src.poll(&ctx, &mut out, 2).unwrap(), SourcePoll::Finished);
    }

    /// A sender closed while the job holds its ring ends the stream at the ring's end, though
    /// the end marker had no room; the producer's end is still held by the sender's fields
    /// then (the mark, not the ring's abandonment, says so).
    #[test]
    fn a_closed_sender_is_seen_before_its_ring_is_abandoned() {
        let (mut tx, factory) = push_channel::<u32>(2);
        let ctx = TaskContext::for_test("push", 0, 1);
        let mut src = started(&factory, &ctx, false);
        assert_eq!(tx.send_slice(&[7, 8]), 2);
        tx.end_stream();
        let mut out = Vec::new();
        assert_eq!(src.poll(&ctx, &mut out, 10).unwrap(), SourcePoll::Emitted);
        assert_eq!(src.poll(&ctx, &mut out, 10).unwrap(), SourcePoll::Finished, "ended while the sender lives");
        assert_eq!(out, vec![7, 8]);
        drop(tx);
    }

    /// An async host learns where to resume without blocking its thread.
    #[test]
    fn the_resume_point_is_a_future() {
        let (tx, factory) = push_channel::<u32>(4);
        let ctx = TaskContext::for_test("push", 0, 1);
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut point = tx.resume_point();
        assert!(std::pin::Pin::new(&mut point).poll(&mut cx).is_pending(), "the source has not started");
        let mut src = source(&factory, &ctx, true);
        src.seek(&5u64.to_le_bytes()).unwrap();
        assert!(std::pin::Pin::new(&mut point).poll(&mut cx).is_pending(), "not restored yet");
        src.restored();
        assert_eq!(std::pin::Pin::new(&mut point).poll(&mut cx), std::task::Poll::Ready(Ok(5)));
        let (tx, factory) = push_channel::<u32>(1);
        factory.signal().job_ended(None);
        let mut point = tx.resume_point();
        assert!(matches!(
            std::pin::Pin::new(&mut point).poll(&mut cx),
            std::task::Poll::Ready(Err(SendError::Ended { error: None, .. }))
        ));
    }

    #[test]
    fn the_sender_learns_the_jobs_error() {
        let (mut tx, factory) = push_channel::<u32>(1);
        factory.signal().job_ended(Some("operator 'x' panicked".into()));
        match tx.try_send(3) {
            Err(SendError::Ended { event: 3, error: Some(e) }) => assert!(e.contains("panicked")),
            other => panic!("{other:?}"),
        }
        assert!(matches!(tx.resume_from(Duration::from_secs(60)), Err(SendError::Ended { .. })));
    }
}
