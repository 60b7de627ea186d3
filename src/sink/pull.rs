//! The embedding sink: the job hands results to a host thread (or async task) through a queue
//! that outlives each attempt, so a job survives failovers with its host attached.
//!
//! Every result carries a sequence number, counted by the sink and kept in its checkpoints: a
//! replay after a failover numbers the replayed results as the first time (for a job that
//! processes deterministically), so a host can drop what it saw already.
//! - [`Guarantee::AtLeastOnce`]: results go to the host at once (lowest latency); after a
//!   failover the results since the restored checkpoint come again, with the same numbers.
//! - [`Guarantee::ExactlyOnce`]: results are held per checkpoint and released when the
//!   checkpoint after them completes (two-phase commit); a host of one process sees each
//!   result once. A released result stays in the sink's checkpoints until the host received
//!   it, so after a process restart the results the restored checkpoint pre-committed, or
//!   released without the host receiving them yet, are released again with their numbers: a
//!   host that keeps the number of the last result it handled tells the new receiver
//!   ([`EventReceiver::resume_after`]) and gets none of the ones it had again.
//!
//! A result counts as delivered when the host receives it, or, for a receiver made with
//! [`EventReceiver::with_acks`], when the host acknowledges it ([`EventReceiver::ack`]: Kafka's
//! commit of an offset): until then it stays in the sink's checkpoints and is handed out again
//! after a process restart. A checkpointed job that finished leaves its completion marker
//! (`_finished`) only once the host has every result delivered: a host killed while it drains
//! the job's last results runs the job again from its latest checkpoint instead of being told
//! the job already completed.
//!
//! The queue is bounded by its capacity: when the host does not keep up, the sink stops
//! taking input (backpressure); results released by a completed checkpoint always enter it.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use super::Sink;
use crate::context::TaskContext;
use crate::error::Result;
use crate::persist::{from_bytes, Persist};
use crate::snapshot::{CheckpointNotice, ForkedState, PersistedFork};
use crate::wake::{lock, HostSignal, Parker};

/// When a pull sink hands results to the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guarantee {
    /// Results are released when the checkpoint after them completes (or the job finishes).
    /// What holds: within one process, through any number of failovers, the host receives
    /// each result exactly once, numbered 0, 1, 2, …. Across a process restart (a crash, then a
    /// job restored from the checkpoint directory) the results the restored checkpoint
    /// pre-committed, or had released before the host received them, are released again, and
    /// results after it are replayed, all with the numbers they had: a host that handles each
    /// result durably as it receives it, keeps the number of the last, and tells the new
    /// receiver ([`EventReceiver::resume_after`]) gets each exactly once (`weir simulate --job
    /// embedded` checks it); one that does not may see results it already had. A result
    /// counts as delivered once received: one the host received and had not handled when its
    /// process died is not handed out again, unless the receiver counts acknowledgements
    /// instead ([`EventReceiver::with_acks`]). Output is deterministic given the job's input in
    /// the same order (which the push source's numbering replays).
    ExactlyOnce,
    /// At once; after a failover, replayed results come again with the same numbers.
    AtLeastOnce,
}

/// One result handed to the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivered<T> {
    /// The result's number: 0, 1, 2, … in the order the sink received them.
    pub seq: u64,
    /// The result.
    pub record: T,
}

/// Why no result was received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecvError {
    /// No result is ready now ([`EventReceiver::try_recv`]).
    Empty,
    /// No result came within the timeout ([`EventReceiver::recv_timeout`]).
    Timeout,
    /// The job has ended and every result it released was received. `error` is why it
    /// failed (`None`: it finished, was stopped or cancelled).
    Ended {
        /// The job's error, if it failed.
        error: Option<String>,
    },
}

impl std::fmt::Display for RecvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecvError::Empty => f.write_str("no result is ready"),
            RecvError::Timeout => f.write_str("timed out waiting for a result"),
            RecvError::Ended { error: None } => f.write_str("the job has ended"),
            RecvError::Ended { error: Some(e) } => write!(f, "the job failed: {e}"),
        }
    }
}

impl std::error::Error for RecvError {}

/// Why an acknowledgement was refused ([`EventReceiver::ack`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AckError {
    /// The receiver counts delivery on receipt ([`EventReceiver::with_acks`] was not called).
    NotAcknowledging,
    /// The host has not received result `seq`: `received` results (numbers below it) so far.
    NotReceived {
        /// The number acknowledged.
        seq: u64,
        /// One more than the number of the last result received.
        received: u64,
    },
    /// Result `seq` was acknowledged before (everything below `acknowledged` is).
    AlreadyAcknowledged {
        /// The number acknowledged.
        seq: u64,
        /// One more than the number of the last result acknowledged.
        acknowledged: u64,
    },
}

impl std::fmt::Display for AckError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AckError::NotAcknowledging => f.write_str(
                "this receiver counts results as delivered when received (make it with with_acks to acknowledge)",
            ),
            AckError::NotReceived { seq, received: 0 } => {
                write!(f, "cannot acknowledge result {seq}: no result was received yet")
            }
            AckError::NotReceived { seq, received } => {
                write!(f, "cannot acknowledge result {seq}: the last result received is {}", received - 1)
            }
            AckError::AlreadyAcknowledged { seq, acknowledged } => {
                write!(f, "result {seq} was acknowledged already (every result up to {} is)", acknowledged - 1)
            }
        }
    }
}

impl std::error::Error for AckError {}

struct PullShared<T> {
    queue: Mutex<VecDeque<Delivered<T>>>,
    /// `queue.len()`, read without the lock by the sink's backpressure check.
    queued: AtomicUsize,
    capacity: usize,
    signal: Arc<HostSignal>,
    /// The highest transaction released to the host in this process (a restored checkpoint's
    /// pre-committed transactions may have been released before the failover).
    released: Mutex<Option<u64>>,
    /// The worker running the sink now, woken when the host makes room.
    worker: Mutex<Option<Arc<Parker>>>,
    /// The sink's input ended and every result was released: the host needs nothing from the
    /// job's end to know it has everything (exactly-once results after the last checkpoint
    /// wait for the job to finish, see [`TaskContext::on_job_success`]).
    stream_ended: AtomicBool,
    /// Results up to and including this number were handled by the host before (in an earlier
    /// process: [`EventReceiver::resume_after`]) and are not handed out again; `None`: none.
    handled_through: Mutex<Option<u64>>,
    /// Exactly once: results released and maybe not yet received by the host, oldest first. A
    /// checkpoint keeps them (the queue dies with the process); forgotten once received.
    unreceived: Mutex<VecDeque<(u64, T)>>,
    /// One more than the number of the last result the host received (0: none).
    received: AtomicU64,
    /// Delivery is counted when the host acknowledges a result, not when it receives it
    /// ([`EventReceiver::with_acks`]).
    acks: AtomicBool,
    /// One more than the number of the last result the host acknowledged (0: none).
    acknowledged: AtomicU64,
    /// How many results the job produced in all, set when the sink's input ended (`u64::MAX`
    /// before): the host has everything once that many are delivered.
    total: AtomicU64,
    /// Called once when the host has every result delivered after the job finished (the
    /// runtime's completion marker, [`HostDelivery::when_delivered`]).
    on_delivered: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    /// The host dropped its receiver.
    detached: AtomicBool,
}

/// What the runtime waits for before it calls a finished job done: the host has every result
/// of an embedding sink. Implemented by the pull sink's shared state.
pub(crate) trait HostDelivery: Send + Sync {
    /// Calls `done` (on this thread or the host's) once every result the finished job produced
    /// was delivered to the host; never, if the host goes away first.
    fn when_delivered(&self, done: Box<dyn FnOnce() + Send>);
}

impl<T: Send> HostDelivery for PullShared<T> {
    fn when_delivered(&self, done: Box<dyn FnOnce() + Send>) {
        *lock(&self.on_delivered) = Some(done);
        // A host that drained everything may have dropped its receiver before the job got
        // here (it saw `Ended`): the marker is still its due. One that left with results
        // undelivered gets none (a rerun hands them out again).
        self.check_delivered();
        if self.detached.load(Ordering::Acquire) {
            drop(lock(&self.on_delivered).take());
        }
    }
}

impl<T> PullShared<T> {
    fn push(&self, items: impl IntoIterator<Item = Delivered<T>>) {
        let handled = *lock(&self.handled_through);
        let mut q = lock(&self.queue);
        q.extend(items.into_iter().filter(|d| handled.is_none_or(|h| d.seq > h)));
        self.queued.store(q.len(), Ordering::Release);
        drop(q);
        self.signal.notify();
    }

    /// Every result is released: the host learns the stream is complete once it drained them.
    fn end_stream(&self) {
        self.stream_ended.store(true, Ordering::Release);
        self.signal.notify();
    }

    fn has_room(&self) -> bool {
        self.queued.load(Ordering::Acquire) < self.capacity
    }

    /// Releases transaction `txn` unless it was released before in this process.
    fn release(&self, txn: u64, records: Vec<(u64, T)>)
    where
        T: Clone,
    {
        let mut released = lock(&self.released);
        if released.is_some_and(|r| r >= txn) {
            return;
        }
        *released = Some(txn);
        self.release_unreceived(records);
    }

    /// Hands `records` to the host, keeping them until it received them.
    fn release_unreceived(&self, records: Vec<(u64, T)>)
    where
        T: Clone,
    {
        let mut unreceived = lock(&self.unreceived);
        self.forget_received(&mut unreceived);
        unreceived.extend(records.iter().cloned());
        drop(unreceived);
        self.push(records.into_iter().map(|(seq, record)| Delivered { seq, record }));
    }

    /// The results released and not yet received by the host.
    fn unreceived(&self) -> Vec<(u64, T)>
    where
        T: Clone,
    {
        let mut unreceived = lock(&self.unreceived);
        self.forget_received(&mut unreceived);
        unreceived.iter().cloned().collect()
    }

    /// Drops from `unreceived` what was delivered to the host (so it holds about a queue's
    /// worth, or what the host holds unacknowledged).
    fn forget_received(&self, unreceived: &mut VecDeque<(u64, T)>) {
        let delivered = self.delivered();
        while unreceived.front().is_some_and(|(seq, _)| *seq < delivered) {
            unreceived.pop_front();
        }
    }

    /// One more than the number of the last result delivered: received, or acknowledged with
    /// acknowledgements on; results the host said it handled before count too.
    fn delivered(&self) -> u64 {
        let counted =
            if self.acks.load(Ordering::Acquire) { &self.acknowledged } else { &self.received }.load(Ordering::Acquire);
        let handled = lock(&self.handled_through).map_or(0, |h| h + 1);
        counted.max(handled)
    }

    /// Runs the completion callback once every result the job produced is delivered.
    fn check_delivered(&self) {
        let total = self.total.load(Ordering::Acquire);
        if total == u64::MAX || self.delivered() < total {
            return;
        }
        let done = lock(&self.on_delivered).take();
        if let Some(done) = done {
            done();
        }
    }
}

/// The host's end of a pull sink.
///
/// ```
/// use std::time::Duration;
/// use weir::{Job, RunConfig, sink::RecvError};
/// let job = Job::new("doubler");
/// let (mut tx, events) = job.push_source::<u64>(64);
/// let mut rx = events.map(|x| x * 2).pull_sink(64);
/// let handle = job.start(RunConfig::default()).unwrap();
/// tx.send_timeout(21, Duration::from_secs(60)).unwrap();
/// assert_eq!(rx.recv_timeout(Duration::from_secs(60)).unwrap().record, 42);
/// tx.close();
/// handle.join().unwrap();
/// assert!(matches!(rx.recv_timeout(Duration::from_secs(60)), Err(RecvError::Ended { error: None })));
/// ```
pub struct EventReceiver<T> {
    shared: Arc<PullShared<T>>,
    /// Results taken from the queue in one lock, handed out one by one.
    local: VecDeque<Delivered<T>>,
}

impl<T> EventReceiver<T> {
    /// The next result, if one is ready. Never blocks.
    #[inline]
    pub fn try_recv(&mut self) -> std::result::Result<Delivered<T>, RecvError> {
        let d = self.next_result()?;
        self.shared.received.store(d.seq + 1, Ordering::Release);
        if self.shared.total.load(Ordering::Relaxed) != u64::MAX {
            self.shared.check_delivered();
        }
        Ok(d)
    }

    /// Counts delivery when the host acknowledges a result ([`EventReceiver::ack`]) instead of
    /// when it receives it: a result received and not yet acknowledged when the process dies is
    /// kept in the sink's checkpoints and handed out again after the restart, as Kafka's
    /// consumer with its offsets committed by hand. For a host that writes each result
    /// somewhere durable (a database) and acknowledges once it is written; one that keeps its
    /// own log of numbers can use [`EventReceiver::resume_after`] alone. Unacknowledged results
    /// are held (in memory and in every checkpoint) until acknowledged.
    ///
    /// ```
    /// use std::time::Duration;
    /// use weir::{Job, RunConfig};
    /// let job = Job::new("acked");
    /// let (mut tx, events) = job.push_source::<u64>(64);
    /// let mut rx = events.pull_sink(64).with_acks();
    /// let handle = job.start(RunConfig::default()).unwrap();
    /// tx.send_timeout(7, Duration::from_secs(60)).unwrap();
    /// tx.close();
    /// let got = rx.recv_timeout(Duration::from_secs(60)).unwrap();
    /// // … write `got.record` to the database, then:
    /// rx.ack(got.seq).unwrap();
    /// assert!(rx.ack(got.seq).is_err(), "acknowledged already");
    /// handle.join().unwrap();
    /// ```
    #[must_use = "a receiver is the job's only way out: keep it"]
    pub fn with_acks(self) -> Self {
        self.shared.acks.store(true, Ordering::Release);
        self
    }

    /// Acknowledges every result up to and including number `seq`: the host has handled them,
    /// and they are not handed out again after a restart ([`EventReceiver::with_acks`]).
    /// Refused, changing nothing, for a number the host has not received yet, one already
    /// acknowledged, or a receiver without acknowledgements.
    pub fn ack(&mut self, seq: u64) -> std::result::Result<(), AckError> {
        if !self.shared.acks.load(Ordering::Acquire) {
            return Err(AckError::NotAcknowledging);
        }
        let received = self.shared.received.load(Ordering::Acquire);
        if seq >= received {
            return Err(AckError::NotReceived { seq, received });
        }
        let acknowledged = self.shared.acknowledged.load(Ordering::Acquire);
        if seq < acknowledged {
            return Err(AckError::AlreadyAcknowledged { seq, acknowledged });
        }
        self.shared.acknowledged.store(seq + 1, Ordering::Release);
        self.shared.check_delivered();
        Ok(())
    }

    fn next_result(&mut self) -> std::result::Result<Delivered<T>, RecvError> {
        if let Some(d) = self.local.pop_front() {
            return Ok(d);
        }
        if self.shared.queued.load(Ordering::Acquire) > 0 {
            let was_full;
            {
                let mut q = lock(&self.shared.queue);
                was_full = q.len() >= self.shared.capacity;
                std::mem::swap(&mut self.local, &mut q);
                self.shared.queued.store(0, Ordering::Release);
            }
            if was_full {
                if let Some(p) = lock(&self.shared.worker).as_ref() {
                    p.notify();
                }
            }
            if let Some(d) = self.local.pop_front() {
                return Ok(d);
            }
        }
        let outcome = self.shared.signal.outcome().cloned();
        let ended = self.shared.stream_ended.load(Ordering::Acquire);
        match outcome {
            _ if self.shared.queued.load(Ordering::Acquire) > 0 => self.next_result(),
            Some(error) => Err(RecvError::Ended { error }),
            None if ended => Err(RecvError::Ended { error: None }),
            None => Err(RecvError::Empty),
        }
    }

    /// The next result, waiting up to `timeout` for one.
    pub fn recv_timeout(&mut self, timeout: Duration) -> std::result::Result<Delivered<T>, RecvError> {
        match self.try_recv() {
            Err(RecvError::Empty) => {}
            other => return other,
        }
        let signal = Arc::clone(&self.shared.signal);
        let shared = Arc::clone(&self.shared);
        signal.wait_until(crate::context::wall::now() + timeout, || {
            (shared.queued.load(Ordering::Acquire) > 0 || shared.stream_ended.load(Ordering::Acquire)).then_some(())
        });
        match self.try_recv() {
            Err(RecvError::Empty) => Err(RecvError::Timeout),
            other => other,
        }
    }

    /// The next result, as a future: for async hosts. It needs no runtime (the job wakes the
    /// task's waker), so it works with tokio, async-std or a hand-rolled executor.
    pub fn recv(&mut self) -> Recv<'_, T> {
        Recv { receiver: self }
    }

    /// Tells the sink that the host durably handled every result up to and including number
    /// `last_handled` (in an earlier process, say, before a crash): none of them is handed out
    /// again. The counterpart of [`crate::source::EventSender::resume_from`]: after a process
    /// restart, a job restored from its checkpoint releases again the results that checkpoint
    /// pre-committed, and replays the rest with the same numbers; a host that records the
    /// number of the last result it handled calls this before receiving, and gets each result
    /// exactly once across the restart.
    ///
    /// ```no_run
    /// # fn host(mut rx: weir::sink::EventReceiver<String>, last: u64) {
    /// rx.resume_after(last);
    /// let next = rx.recv_timeout(std::time::Duration::from_secs(60)).unwrap();
    /// assert!(next.seq > last);
    /// # }
    /// ```
    pub fn resume_after(&mut self, last_handled: u64) {
        *lock(&self.shared.handled_through) = Some(last_handled);
        self.local.retain(|d| d.seq > last_handled);
        let mut q = lock(&self.shared.queue);
        q.retain(|d| d.seq > last_handled);
        self.shared.queued.store(q.len(), Ordering::Release);
    }

    /// Whether the job has ended and every result was received.
    pub fn is_finished(&self) -> bool {
        self.local.is_empty()
            && self.shared.queued.load(Ordering::Acquire) == 0
            && (self.shared.signal.outcome().is_some() || self.shared.stream_ended.load(Ordering::Acquire))
    }
}

impl<T> Drop for EventReceiver<T> {
    fn drop(&mut self) {
        // Nobody takes results any more: unless the host had them all, the finished job is not
        // marked done (a rerun hands them out again), and what the marker's writer holds (the
        // directory's lock) goes.
        self.shared.check_delivered();
        self.shared.detached.store(true, Ordering::Release);
        drop(lock(&self.shared.on_delivered).take());
    }
}

/// The future of [`EventReceiver::recv`].
#[must_use = "a future does nothing unless awaited (or polled)"]
pub struct Recv<'a, T> {
    receiver: &'a mut EventReceiver<T>,
}

impl<T> Future for Recv<'_, T> {
    type Output = std::result::Result<Delivered<T>, RecvError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.receiver.try_recv() {
            Err(RecvError::Empty) => {}
            other => return Poll::Ready(other),
        }
        self.receiver.shared.signal.register(cx.waker());
        // A result may have come between the check and the registration.
        match self.receiver.try_recv() {
            Err(RecvError::Empty) => Poll::Pending,
            other => Poll::Ready(other),
        }
    }
}

/// Makes the pull sink of each attempt.
pub(crate) struct PullSinkFactory<T> {
    shared: Arc<PullShared<T>>,
    guarantee: Guarantee,
}

pub(crate) fn pull_channel<T>(capacity: usize, guarantee: Guarantee) -> (PullSinkFactory<T>, EventReceiver<T>) {
    let shared = Arc::new(PullShared {
        queue: Mutex::new(VecDeque::new()),
        queued: AtomicUsize::new(0),
        capacity: capacity.max(1),
        signal: Arc::new(HostSignal::default()),
        released: Mutex::new(None),
        worker: Mutex::new(None),
        stream_ended: AtomicBool::new(false),
        handled_through: Mutex::new(None),
        unreceived: Mutex::new(VecDeque::new()),
        received: AtomicU64::new(0),
        acks: AtomicBool::new(false),
        acknowledged: AtomicU64::new(0),
        total: AtomicU64::new(u64::MAX),
        on_delivered: Mutex::new(None),
        detached: AtomicBool::new(false),
    });
    (PullSinkFactory { shared: Arc::clone(&shared), guarantee }, EventReceiver { shared, local: VecDeque::new() })
}

impl<T> PullSinkFactory<T> {
    /// The signal the runtime uses to tell the host the job ended.
    pub(crate) fn signal(&self) -> Arc<HostSignal> {
        Arc::clone(&self.shared.signal)
    }

    /// What the runtime waits on before it marks the finished job done.
    pub(crate) fn delivery(&self) -> Arc<dyn HostDelivery>
    where
        T: Send + 'static,
    {
        Arc::clone(&self.shared) as Arc<dyn HostDelivery>
    }

    pub(crate) fn make(&self, ctx: &TaskContext) -> PullSink<T> {
        *lock(&self.shared.worker) = Some(Arc::clone(&ctx.parker));
        self.shared.stream_ended.store(false, Ordering::Release);
        self.shared.total.store(u64::MAX, Ordering::Release);
        PullSink {
            shared: Arc::clone(&self.shared),
            ctx: ctx.clone(),
            guarantee: self.guarantee,
            next_seq: 0,
            held: Vec::new(),
            current: Vec::new(),
            pending: Vec::new(),
            finished: false,
            released_on_success: false,
        }
    }
}

/// One attempt's pull sink.
pub(crate) struct PullSink<T> {
    shared: Arc<PullShared<T>>,
    ctx: TaskContext,
    guarantee: Guarantee,
    /// The number of the next result.
    next_seq: u64,
    /// At least once: results waiting for room in the queue.
    held: Vec<Delivered<T>>,
    /// Exactly once: results since the last barrier, and pre-committed transactions
    /// (checkpoint id, results), oldest first.
    current: Vec<(u64, T)>,
    pending: Vec<(u64, Vec<(u64, T)>)>,
    /// The input ended.
    finished: bool,
    /// Exactly once: the input ended with results that only the job's success releases; the
    /// host is told the stream is complete by that release, not before.
    released_on_success: bool,
}

impl<T> PullSink<T> {
    /// Tells the host the stream is complete once the input ended and nothing is left to
    /// release.
    fn end_if_released(&self) {
        if self.finished
            && !self.released_on_success
            && self.held.is_empty()
            && self.current.is_empty()
            && self.pending.is_empty()
        {
            self.shared.end_stream();
        }
    }
}

/// What a pull sink's checkpoint holds: the next sequence number, the pre-committed
/// transactions, and the results released that the host had not received.
type PullState<T> = (u64, Vec<(u64, Vec<(u64, T)>)>, Vec<(u64, T)>);
/// A checkpoint of a build before the unreceived results were kept.
type PullStateV1<T> = (u64, Vec<(u64, Vec<(u64, T)>)>);

impl<T: Persist + Clone + Send + Sync + 'static> Sink<T> for PullSink<T> {
    fn write(&mut self, records: &mut Vec<T>) -> Result<()> {
        let first = self.next_seq;
        self.next_seq += records.len() as u64;
        let numbered = (first..).zip(records.drain(..));
        match self.guarantee {
            Guarantee::ExactlyOnce => self.current.extend(numbered),
            Guarantee::AtLeastOnce => {
                self.held.extend(numbered.map(|(seq, record)| Delivered { seq, record }));
                self.drain()?;
            }
        }
        Ok(())
    }

    fn drain(&mut self) -> Result<bool> {
        if !self.shared.has_room() {
            return Ok(false);
        }
        if !self.held.is_empty() {
            self.shared.push(self.held.drain(..));
        }
        self.end_if_released();
        Ok(true)
    }

    fn pre_commit(&mut self, checkpoint: u64) -> Result<Option<Box<dyn ForkedState>>> {
        if self.guarantee == Guarantee::ExactlyOnce {
            self.pending.push((checkpoint, std::mem::take(&mut self.current)));
        }
        let state: PullState<T> = (self.next_seq, self.pending.clone(), self.shared.unreceived());
        Ok(Some(Box::new(PersistedFork(state))))
    }

    fn notify(&mut self, notice: CheckpointNotice) -> Result<()> {
        // An aborted checkpoint's transaction stays pending: it is released with the next
        // completed one.
        if let CheckpointNotice::Complete(id) = notice {
            for (txn, records) in super::committed_by(&mut self.pending, id) {
                self.shared.release(txn, records);
            }
        }
        Ok(())
    }

    fn restore(&mut self, bytes: &[u8]) -> Result<()> {
        let (next_seq, pending, unreceived): PullState<T> = match from_bytes(bytes) {
            Ok(state) => state,
            Err(_) => from_bytes::<PullStateV1<T>>(bytes).map(|(n, p)| (n, p, Vec::new()))?,
        };
        self.next_seq = next_seq;
        // Released before the checkpoint, maybe never received: again, unless this process
        // released them (a failover: they are in the queue, or the host has them).
        // Transactions are numbered from 1: 0 marks this process as having released.
        let first_here = {
            let mut released = lock(&self.shared.released);
            let first = released.is_none();
            released.get_or_insert(0);
            first
        };
        if first_here {
            self.shared.release_unreceived(unreceived);
        }
        // What the restored (complete) checkpoint pre-committed is committed now.
        for (txn, records) in pending {
            self.shared.release(txn, records);
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        self.finished = true;
        self.shared.total.store(self.next_seq, Ordering::Release);
        if self.guarantee == Guarantee::AtLeastOnce || (self.current.is_empty() && self.pending.is_empty()) {
            self.end_if_released();
            return Ok(());
        }
        let mut rest = std::mem::take(&mut self.pending);
        rest.push((super::FINAL_TXN, std::mem::take(&mut self.current)));
        self.released_on_success = true;
        let shared = Arc::clone(&self.shared);
        self.ctx.on_job_success(move || {
            for (txn, records) in std::mem::take(&mut rest) {
                shared.release(txn, records);
            }
            shared.end_stream();
            Ok(())
        });
        Ok(())
    }
}

// Their fields are closures, shared internals or whole state: a name says enough.
crate::debug_as_name!([T] EventReceiver<T>);
crate::debug_as_name!(['a, T] Recv<'a, T>);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_once_releases_on_completion_and_once_per_transaction() {
        let (factory, mut rx) = pull_channel::<String>(16, Guarantee::ExactlyOnce);
        let ctx = TaskContext::for_test("pull", 0, 1);
        let mut sink = factory.make(&ctx);
        sink.write(&mut vec!["a".into(), "b".into()]).unwrap();
        let snapshot = sink.pre_commit(1).unwrap().unwrap();
        sink.write(&mut vec!["c".into()]).unwrap();
        assert_eq!(rx.try_recv(), Err(RecvError::Empty), "nothing before the checkpoint completes");
        sink.notify(CheckpointNotice::Complete(1)).unwrap();
        assert_eq!(rx.try_recv().unwrap(), Delivered { seq: 0, record: "a".to_string() });
        assert_eq!(rx.try_recv().unwrap().seq, 1);
        assert_eq!(rx.try_recv(), Err(RecvError::Empty), "'c' waits for the next checkpoint");
        // A failover restores checkpoint 1: its transaction was released already.
        let mut bytes = Vec::new();
        snapshot.write_to(&mut bytes).unwrap();
        let mut again = factory.make(&ctx);
        again.restore(&bytes).unwrap();
        assert_eq!(rx.try_recv(), Err(RecvError::Empty), "released once");
        again.write(&mut vec!["c".into()]).unwrap();
        again.pre_commit(2).unwrap();
        again.notify(CheckpointNotice::Complete(2)).unwrap();
        assert_eq!(rx.try_recv().unwrap(), Delivered { seq: 2, record: "c".to_string() }, "numbered as the first time");
    }

    /// Results released (their checkpoint completed) and still queued for the host when the
    /// process dies are in the next checkpoint: the restarted job hands them out again, and
    /// the host that tells the last one it had gets the rest, each once (they were lost:
    /// `weir simulate --job embedded --mode aligned --parallelism 1 --seeds 431`).
    #[test]
    fn results_the_host_had_not_received_survive_a_process_restart() {
        let ctx = TaskContext::for_test("pull", 0, 1);
        let (factory, mut rx) = pull_channel::<u64>(16, Guarantee::ExactlyOnce);
        let mut sink = factory.make(&ctx);
        sink.write(&mut vec![10, 11, 12]).unwrap();
        sink.pre_commit(1).unwrap();
        sink.notify(CheckpointNotice::Complete(1)).unwrap();
        assert_eq!(rx.try_recv().unwrap(), Delivered { seq: 0, record: 10 });
        sink.write(&mut vec![13]).unwrap();
        let snapshot = sink.pre_commit(2).unwrap().unwrap();
        let mut bytes = Vec::new();
        snapshot.write_to(&mut bytes).unwrap();
        // Checkpoint 2 completed, and the process died before anyone heard it.
        drop((sink, rx, factory));
        let (factory, mut rx) = pull_channel::<u64>(16, Guarantee::ExactlyOnce);
        rx.resume_after(0);
        let mut sink = factory.make(&ctx);
        sink.restore(&bytes).unwrap();
        let got: Vec<(u64, u64)> = std::iter::from_fn(|| rx.try_recv().ok()).map(|d| (d.seq, d.record)).collect();
        assert_eq!(got, [(1, 11), (2, 12), (3, 13)]);
        // A failover in this process restores it again: nothing comes twice (nor with nothing
        // pre-committed).
        let mut twice = factory.make(&ctx);
        twice
            .restore(&crate::persist::to_bytes(&(4u64, Vec::<(u64, Vec<(u64, u64)>)>::new(), vec![(2u64, 12u64)])))
            .unwrap();
        assert_eq!(rx.try_recv(), Err(RecvError::Empty));
        let mut again = factory.make(&ctx);
        again.restore(&bytes).unwrap();
        assert_eq!(rx.try_recv(), Err(RecvError::Empty));
        // What the host received is forgotten at the next checkpoint.
        let mut bytes = Vec::new();
        again.pre_commit(3).unwrap().unwrap().write_to(&mut bytes).unwrap();
        let (_, _, unreceived): PullState<u64> = from_bytes(&bytes).unwrap();
        assert!(unreceived.is_empty(), "{unreceived:?}");
    }

    #[test]
    fn at_least_once_backpressures_when_the_host_lags() {
        let (factory, mut rx) = pull_channel::<u64>(2, Guarantee::AtLeastOnce);
        let ctx = TaskContext::for_test("pull", 0, 1);
        let mut sink = factory.make(&ctx);
        sink.write(&mut vec![1, 2]).unwrap();
        assert!(!sink.drain().unwrap(), "the queue is full");
        sink.write(&mut vec![3]).unwrap();
        assert_eq!(rx.try_recv().unwrap().record, 1);
        assert_eq!(rx.try_recv().unwrap().record, 2);
        assert!(sink.drain().unwrap());
        assert_eq!(rx.try_recv().unwrap(), Delivered { seq: 2, record: 3 });
        factory.signal().job_ended(Some("boom".into()));
        assert_eq!(rx.try_recv(), Err(RecvError::Ended { error: Some("boom".into()) }));
    }
}
