//! The Kafka source, Flink's `KafkaSource` as the model: a topic's partitions spread over the
//! source's subtasks, each partition's offset in every checkpoint (the checkpoint is the
//! source of truth: nothing is committed to Kafka), read committed: the source reads every
//! record and holds a transaction's records until its marker in the log says commit (handed
//! on) or abort (dropped), a partition's records after a held one held behind it, so the
//! checkpointed offset never passes an undecided transaction — what a broker's last stable
//! offset and list of aborted transactions promise, without trusting a broker that gets them
//! wrong (Tansu 0.6 kept reporting an old last stable offset after an abort, and no list).
//! Bounded (to the end offsets the topic had when the job first started, kept in the
//! checkpoint, so a resumed run ends where the first would have; a transaction open there is
//! waited for, its marker read past the end) or following the topic, rescaled (a
//! savepoint restored at another parallelism hands each partition to the subtask that owns it
//! now), with per-partition watermarks that an idle partition stops holding back.
//!
//! May touch: `client`, `group` (a consumer group's partitions), `records`, `security`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use weir::source::{Source, SourcePoll};
use weir::{Error, Result, TaskContext};

use crate::client::KafkaClient;
use crate::group::CompletedOffsets;
use crate::records::{batches, Item, Marker};

/// A record as the source hands it to the decoding function.
#[derive(Clone, Copy, Debug)]
pub struct KafkaMessage<'a> {
    /// The partition it was read from.
    pub partition: i32,
    /// Its offset there.
    pub offset: i64,
    /// Its timestamp, milliseconds since the epoch.
    pub timestamp: i64,
    /// Its key.
    pub key: Option<&'a [u8]>,
    /// Its value (`None` for a tombstone).
    pub value: Option<&'a [u8]>,
}

type Decode<T> = Arc<dyn Fn(&KafkaMessage<'_>) -> Option<T> + Send + Sync>;

/// How long an idle source waits between fetches that found nothing (it is polled far more
/// often: each empty fetch is a request to the broker).
const IDLE_FETCH_NS: u64 = 5_000_000;

/// The most a fetch asks for, per partition and in all.
const FETCH_BYTES: i32 = 4 << 20;

/// A Kafka topic as a source: `job.source(KafkaSource::new(..).subtasks())`.
///
/// ```no_run
/// use weir::Job;
/// use weir_kafka::KafkaSource;
///
/// let job = Job::new("lines").with_parallelism(2);
/// let lines = job.source(
///     KafkaSource::new("127.0.0.1:9092", "input", |m| m.value.map(|v| String::from_utf8_lossy(v).into_owned()))
///         .subtasks(),
/// );
/// # drop(lines);
/// ```
pub struct KafkaSource<T> {
    bootstrap: String,
    topic: String,
    partitions: Option<Vec<i32>>,
    assignment: Option<Assignment>,
    follow: bool,
    watermarks: Option<Watermarks>,
    security: crate::Security,
    decode: Decode<T>,
}

/// The partitions a consumer group handed this process, for [`KafkaSource::assigned`].
#[derive(Clone, Debug, Default)]
pub struct Assignment {
    /// The partitions.
    pub partitions: Vec<i32>,
    /// Where to start those that this job's checkpoints do not hold (the group's committed
    /// offsets: where the member that had them stopped); the others from their start.
    pub committed: HashMap<i32, i64>,
    /// Where the subtasks record the offsets of completed checkpoints, for the group.
    pub completed: CompletedOffsets,
}

/// Per-partition watermarks: how far a partition's timestamps may run out of order, and how
/// long a partition without new messages waits before it stops holding the watermark back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Watermarks {
    out_of_order_ms: u64,
    idle_after_ns: u64,
}

impl<T> std::fmt::Debug for KafkaSource<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSource")
            .field("bootstrap", &self.bootstrap)
            .field("topic", &self.topic)
            .field("partitions", &self.partitions)
            .field("follow", &self.follow)
            .finish_non_exhaustive()
    }
}

impl<T: Send + 'static> KafkaSource<T> {
    /// Reads `topic` through broker `bootstrap` (`host:port`), each message turned into a
    /// record by `decode` (`None` skips it). Bounded, from the earliest offset of every
    /// partition, unless told otherwise.
    pub fn new(
        bootstrap: impl Into<String>,
        topic: impl Into<String>,
        decode: impl Fn(&KafkaMessage<'_>) -> Option<T> + Send + Sync + 'static,
    ) -> Self {
        KafkaSource {
            bootstrap: bootstrap.into(),
            topic: topic.into(),
            partitions: None,
            assignment: None,
            follow: false,
            watermarks: None,
            security: crate::Security::plaintext(),
            decode: Arc::new(decode),
        }
    }

    /// Reads only these partitions (several processes sharing a topic each take a set).
    pub fn partitions(mut self, partitions: impl IntoIterator<Item = i32>) -> Self {
        let mut p: Vec<i32> = partitions.into_iter().collect();
        p.sort_unstable();
        p.dedup();
        self.partitions = Some(p);
        self
    }

    /// Reads the partitions a consumer group handed this process ([`crate::group`]), which
    /// may differ from those its checkpoints hold: a restored partition no longer assigned is
    /// dropped, an assigned one the checkpoints lack starts at the group's committed offset.
    /// Each partition goes to subtask `partition % parallelism`, so it stays with its subtask
    /// whatever else the group hands over. Every completed checkpoint's offsets go to
    /// `assignment.completed`.
    pub fn assigned(mut self, assignment: Assignment) -> Self {
        let mut partitions = assignment.partitions.clone();
        partitions.sort_unstable();
        partitions.dedup();
        self.partitions = Some(partitions);
        self.assignment = Some(assignment);
        self
    }

    /// Keeps reading as the topic grows (and picks up partitions added to it), instead of
    /// ending at the offsets the topic had when the job first started.
    pub fn follow(mut self, follow: bool) -> Self {
        self.follow = follow;
        self
    }

    /// Emits watermarks from the messages' timestamps (milliseconds), per partition as
    /// Flink's `KafkaSource` does: each subtask's watermark is the lowest over its partitions
    /// of the newest timestamp handed on, less `out_of_order` (how late a message may come
    /// within its partition). A partition with no new message for `idle_after` of
    /// processing time stops holding it back until it has one again. Event time downstream
    /// must then be the same milliseconds ([`KafkaMessage::timestamp`]).
    pub fn watermarks(mut self, out_of_order: Duration, idle_after: Duration) -> Self {
        self.watermarks = Some(Watermarks {
            out_of_order_ms: out_of_order.as_millis() as u64,
            idle_after_ns: idle_after.as_nanos().min(u128::from(u64::MAX)) as u64,
        });
        self
    }

    /// How its connections are secured (TLS, SASL); plaintext by default.
    pub fn security(mut self, security: crate::Security) -> Self {
        self.security = security;
        self
    }

    /// The factory of the source's subtasks, for [`weir::Job::source`].
    pub fn subtasks(self) -> impl Fn(&TaskContext) -> Result<KafkaSubtask<T>> + Send + 'static {
        move |ctx| KafkaSubtask::start(&self, ctx)
    }
}

/// Where one partition is read.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Cursor {
    partition: i32,
    /// The next offset to fetch.
    fetched: i64,
    /// The next offset whose record was not handed on yet: the checkpointed position.
    emitted: i64,
    /// Bounded: the offset it ends at.
    end: Option<i64>,
    /// The newest timestamp handed on (per-partition watermarks).
    newest: Option<i64>,
    /// When a fetch last brought records of it (job clock, ns).
    last_data_ns: u64,
}

impl Cursor {
    fn done(&self) -> bool {
        self.end.is_some_and(|e| self.emitted >= e)
    }
}

/// A record read but not handed on: a transaction's, until its marker, or one behind it.
struct Held<T> {
    offset: i64,
    timestamp: i64,
    record: Option<T>,
    /// The transaction's producer (`None`: not transactional).
    producer: Option<i64>,
    /// `None` until the marker came; then whether it committed.
    committed: Option<bool>,
}

/// A partition's held records, in log order.
struct HeldRecords<T> {
    held: VecDeque<Held<T>>,
}

impl<T> Default for HeldRecords<T> {
    fn default() -> Self {
        HeldRecords { held: VecDeque::new() }
    }
}

impl<T> HeldRecords<T> {
    /// The marker of `producer`'s transaction: decides every held record of it.
    fn decide(&mut self, producer: i64, commit: bool) {
        for h in self.held.iter_mut().filter(|h| h.producer == Some(producer) && h.committed.is_none()) {
            h.committed = Some(commit);
        }
    }

    /// The decided records at the front, in order: committed ones to hand on, aborted ones
    /// dropped.
    fn release(&mut self, mut f: impl FnMut(i64, i64, T)) {
        while let Some(h) = self.held.front() {
            match h.committed {
                None => return,
                Some(commit) => {
                    let h = self.held.pop_front().expect("checked");
                    if let (true, Some(r)) = (commit, h.record) {
                        f(h.offset, h.timestamp, r);
                    }
                }
            }
        }
    }

    /// The first held offset: where a replay must start.
    fn first(&self) -> Option<i64> {
        self.held.front().map(|h| h.offset)
    }
}

/// One subtask of a [`KafkaSource`].
pub struct KafkaSubtask<T> {
    client: KafkaClient,
    topic: String,
    /// All partitions read (explicitly given, or the topic's).
    explicit: Option<Vec<i32>>,
    /// Handed out by a consumer group: where the partitions the checkpoints lack start, and
    /// where completed checkpoints' offsets go.
    assignment: Option<(HashMap<i32, i64>, CompletedOffsets)>,
    follow: bool,
    decode: Decode<T>,
    subtask: usize,
    parallelism: usize,
    cursors: Vec<Cursor>,
    /// Fetched records not handed on yet: (cursor index, offset, timestamp, record).
    buffered: VecDeque<(usize, i64, i64, T)>,
    /// Per partition: records read and not decided yet (see the module doc).
    held: HashMap<i32, HeldRecords<T>>,
    last_empty_fetch: Option<u64>,
    last_discovery: u64,
    /// The job clock at the last poll (ns).
    now_ns: u64,
    watermarks: Option<Watermarks>,
    /// The watermark as of the last poll.
    watermark: Option<u64>,
}

impl<T> std::fmt::Debug for KafkaSubtask<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSubtask")
            .field("topic", &self.topic)
            .field("cursors", &self.cursors)
            .finish_non_exhaustive()
    }
}

/// Which of `all` (sorted) subtask `subtask` of `parallelism` reads: every `parallelism`-th.
fn owned(all: &[i32], subtask: usize, parallelism: usize) -> Vec<i32> {
    all.iter().enumerate().filter(|(i, _)| i % parallelism == subtask).map(|(_, &p)| p).collect()
}

impl<T: Send + 'static> KafkaSubtask<T> {
    fn start(source: &KafkaSource<T>, ctx: &TaskContext) -> Result<Self> {
        let mut client = KafkaClient::connect_with(&source.bootstrap, &source.security)?;
        let topic_partitions = client.partitions(&source.topic)?;
        if let Some(given) = &source.partitions {
            if let Some(missing) = given.iter().find(|p| !topic_partitions.contains(p)) {
                return Err(Error::config(format!(
                    "Kafka topic '{}' has no partition {missing} (it has {})",
                    source.topic,
                    topic_partitions.len()
                )));
            }
        }
        let all = source.partitions.clone().unwrap_or(topic_partitions);
        let mut me = KafkaSubtask {
            client,
            topic: source.topic.clone(),
            explicit: source.partitions.clone(),
            assignment: source.assignment.as_ref().map(|a| (a.committed.clone(), a.completed.clone())),
            follow: source.follow,
            decode: Arc::clone(&source.decode),
            subtask: ctx.subtask,
            parallelism: ctx.parallelism,
            cursors: Vec::new(),
            buffered: VecDeque::new(),
            held: HashMap::new(),
            last_empty_fetch: None,
            last_discovery: ctx.now_ns(),
            now_ns: ctx.now_ns(),
            watermarks: source.watermarks,
            watermark: None,
        };
        let mine = me.owned(&all);
        me.cursors = me.new_cursors(&mine)?;
        Ok(me)
    }

    /// Which of `all` (sorted) this subtask reads: under a consumer group's assignment
    /// partition `p` is subtask `p % parallelism`'s (it stays there whatever the group hands
    /// over), otherwise every `parallelism`-th.
    fn owned(&self, all: &[i32]) -> Vec<i32> {
        if self.assignment.is_some() {
            all.iter().copied().filter(|&p| p.rem_euclid(self.parallelism as i32) as usize == self.subtask).collect()
        } else {
            owned(all, self.subtask, self.parallelism)
        }
    }

    /// Under a consumer group's assignment, restored `cursors` as far as the group still
    /// hands their partitions to this subtask, and the partitions it hands over that they
    /// lack (from the group's committed offsets). Otherwise `cursors` as they are.
    fn reconciled(&mut self, cursors: Vec<Cursor>) -> Result<Vec<Cursor>> {
        let Some(assigned) = self.explicit.clone().filter(|_| self.assignment.is_some()) else {
            return Ok(cursors);
        };
        let mine = self.owned(&assigned);
        let mut kept: Vec<Cursor> = cursors.into_iter().filter(|c| mine.contains(&c.partition)).collect();
        let missing: Vec<i32> = mine.into_iter().filter(|p| kept.iter().all(|c| c.partition != *p)).collect();
        kept.extend(self.new_cursors(&missing)?);
        kept.sort_by_key(|c| c.partition);
        Ok(kept)
    }
    /// Cursors at the start of `partitions` (and, bounded, their current committed ends).
    fn new_cursors(&mut self, partitions: &[i32]) -> Result<Vec<Cursor>> {
        if partitions.is_empty() {
            return Ok(Vec::new());
        }
        // The high watermark: the source decides what is committed itself (module doc).
        let bounds = self.client.bounds(&self.topic, partitions, false)?;
        let (follow, now) = (self.follow, self.now_ns);
        let committed = self.assignment.as_ref().map(|(c, _)| c);
        Ok(partitions
            .iter()
            .map(|&p| {
                let (earliest, end) = bounds[&p];
                let start = committed.and_then(|c| c.get(&p).copied()).unwrap_or(earliest);
                Cursor {
                    partition: p,
                    fetched: start,
                    emitted: start,
                    end: (!follow).then_some(end),
                    newest: None,
                    last_data_ns: now,
                }
            })
            .collect())
    }

    /// Following: partitions added to the topic since, that this subtask owns, from their
    /// start. (Explicitly given partitions are all there is.)
    fn discover(&mut self) -> Result<()> {
        if self.explicit.is_some() {
            return Ok(());
        }
        let all = self.client.partitions(&self.topic)?;
        let known: HashSet<i32> = self.cursors.iter().map(|c| c.partition).collect();
        let new: Vec<i32> = self.owned(&all).into_iter().filter(|p| !known.contains(p)).collect();
        let added = self.new_cursors(&new)?;
        self.cursors.extend(added);
        Ok(())
    }

    /// Fetches once for every partition not at its end (or waiting for the marker of a
    /// transaction that began before it); buffers what it decodes and may hand on, holds the
    /// rest.
    fn fetch(&mut self) -> Result<()> {
        // A cursor with held records is not done: its replay position is the first of them.
        let from: Vec<(i32, i64)> =
            self.cursors.iter().filter(|c| !c.done()).map(|c| (c.partition, c.fetched)).collect();
        if from.is_empty() {
            return Ok(());
        }
        // The broker waits at most 1 ms for data (Tansu answers a 0 ms wait with nothing at all).
        // Read uncommitted: the markers decide (see the module doc).
        let fetched = self.client.fetch(&self.topic, &from, 1, FETCH_BYTES, false)?;
        for part in fetched {
            if part.out_of_range {
                return Err(Error::config(format!(
                    "Kafka partition {}/{} no longer holds the offset to read from (the topic's retention deleted \
                     it): the records between cannot be read",
                    self.topic, part.partition
                )));
            }
            let Some(ci) = self.cursors.iter().position(|c| c.partition == part.partition) else { continue };
            let held = self.held.entry(part.partition).or_default();
            let cursor = &mut self.cursors[ci];
            let (next, end) = (cursor.fetched, cursor.end);
            let mut last = None;
            let decode = &self.decode;
            let buffered = &mut self.buffered;
            batches(&part.records, |item| {
                match item {
                    Item::Marker(info, marker) => {
                        last = Some(info.last_offset);
                        if let (Some(marker), true) = (marker, info.last_offset >= next) {
                            held.decide(info.producer_id, marker == Marker::Commit);
                            held.release(|offset, ts, t| buffered.push_back((ci, offset, ts, t)));
                        }
                    }
                    Item::Batch(info) => last = Some(info.last_offset),
                    Item::Record(info, r) if r.offset >= next && end.is_none_or(|e| r.offset < e) => {
                        let m = KafkaMessage {
                            partition: part.partition,
                            offset: r.offset,
                            timestamp: r.timestamp,
                            key: r.key,
                            value: r.value,
                        };
                        let record = decode(&m);
                        if info.transactional || held.first().is_some() {
                            held.held.push_back(Held {
                                offset: r.offset,
                                timestamp: r.timestamp,
                                record,
                                producer: info.transactional.then_some(info.producer_id),
                                committed: (!info.transactional).then_some(true),
                            });
                        } else if let Some(t) = record {
                            buffered.push_back((ci, r.offset, r.timestamp, t));
                        }
                    }
                    Item::Record(..) => {}
                }
                Ok(true)
            })
            .map_err(|e| match e {
                // Which broker, topic and partition sent it.
                Error::Corrupt(m) => Error::Corrupt(format!(
                    "from Kafka broker {}, topic '{}' partition {}: {m}",
                    self.client.bootstrap(),
                    self.topic,
                    part.partition
                )),
                e => e,
            })?;
            if let Some(last) = last {
                let cursor = &mut self.cursors[ci];
                cursor.last_data_ns = self.now_ns;
                cursor.fetched = cursor.fetched.max(last + 1);
            }
        }
        Ok(())
    }

    fn encode_offsets(cursors: &[Cursor]) -> Vec<u8> {
        let v: Vec<(i32, i64, Option<i64>)> = cursors.iter().map(|c| (c.partition, c.emitted, c.end)).collect();
        weir::persist::to_bytes(&v)
    }

    fn decode_offsets(bytes: &[u8]) -> Result<Vec<Cursor>> {
        let v: Vec<(i32, i64, Option<i64>)> = weir::persist::from_bytes(bytes)?;
        Ok(v.into_iter()
            .map(|(partition, at, end)| Cursor {
                partition,
                fetched: at,
                emitted: at,
                end,
                newest: None,
                last_data_ns: 0,
            })
            .collect())
    }

    /// Hands on up to `max` buffered records, fetching when none are buffered.
    fn take(&mut self, ctx: &TaskContext, out: &mut Vec<T>, max: usize) -> Result<SourcePoll> {
        if self.buffered.is_empty() {
            // Everything fetched was handed on (or skipped: markers, aborted records) but what
            // is held: a replay starts at the first held record.
            for c in &mut self.cursors {
                let first_held = self.held.get(&c.partition).and_then(HeldRecords::first);
                c.emitted = first_held.unwrap_or(c.fetched).min(c.end.unwrap_or(i64::MAX));
            }
            if self.cursors.iter().all(Cursor::done) && !self.follow {
                return Ok(SourcePoll::Finished);
            }
            let now = ctx.now_ns();
            if self.last_empty_fetch.is_some_and(|t| now.saturating_sub(t) < IDLE_FETCH_NS) {
                return Ok(SourcePoll::Idle);
            }
            if self.follow && now.saturating_sub(self.last_discovery) > 10_000_000_000 {
                self.last_discovery = now;
                self.discover()?;
            }
            self.fetch()?;
            if self.buffered.is_empty() {
                self.last_empty_fetch = Some(now);
                return Ok(SourcePoll::Idle);
            }
            self.last_empty_fetch = None;
        }
        for _ in 0..max {
            let Some((ci, offset, ts, t)) = self.buffered.pop_front() else { break };
            let c = &mut self.cursors[ci];
            c.emitted = offset + 1;
            c.newest = Some(c.newest.map_or(ts, |n| n.max(ts)));
            out.push(t);
        }
        Ok(SourcePoll::Emitted)
    }

    /// After a restore: nothing buffered or known of aborted transactions, and every
    /// partition counts as live (not idle) until it has gone `idle_after` without data from now.
    fn restarted(&mut self) {
        self.buffered.clear();
        self.held.clear();
        for c in &mut self.cursors {
            c.last_data_ns = self.now_ns;
        }
    }

    /// Per-partition watermarks: the lowest newest timestamp over the partitions that are not
    /// idle (or done), less the allowed disorder; held where such a partition has none yet.
    fn advance_watermark(&mut self) {
        let Some(w) = self.watermarks else { return };
        let now = self.now_ns;
        let live = self.cursors.iter().filter(|c| !c.done() && now.saturating_sub(c.last_data_ns) < w.idle_after_ns);
        let mut lowest = None;
        for c in live {
            let Some(newest) = c.newest else { return };
            lowest = Some(lowest.map_or(newest, |l: i64| l.min(newest)));
        }
        if let Some(l) = lowest {
            let wm = (l.max(0) as u64).saturating_sub(w.out_of_order_ms);
            self.watermark = Some(self.watermark.map_or(wm, |old| old.max(wm)));
        }
    }
}

impl<T: Send + 'static> Source<T> for KafkaSubtask<T> {
    fn watermark(&self) -> Option<u64> {
        self.watermark
    }

    fn poll(&mut self, ctx: &TaskContext, out: &mut Vec<T>, max: usize) -> Result<SourcePoll> {
        self.now_ns = ctx.now_ns();
        let polled = self.take(ctx, out, max);
        self.advance_watermark();
        polled
    }

    fn offset(&self) -> Option<Vec<u8>> {
        Some(Self::encode_offsets(&self.cursors))
    }

    fn checkpoint_complete(&mut self, id: u64, offset: &[u8]) {
        if let Some((_, completed)) = &self.assignment {
            // The offsets this subtask encoded itself: they decode.
            if let Ok(cursors) = Self::decode_offsets(offset) {
                completed.record(id, cursors.iter().map(|c| (c.partition, c.emitted)));
            }
        }
    }

    fn seek(&mut self, offset: &[u8]) -> Result<()> {
        let restored = Self::decode_offsets(offset)?;
        self.cursors = self.reconciled(restored)?;
        self.restarted();
        Ok(())
    }

    fn seek_rescaled(&mut self, parts: &[(usize, &[u8])], subtask: usize, parallelism: usize) -> Result<()> {
        let mut all: Vec<Cursor> = Vec::new();
        for (_, bytes) in parts {
            all.extend(Self::decode_offsets(bytes)?);
        }
        all.sort_by_key(|c| c.partition);
        all.dedup_by_key(|c| c.partition);
        let partitions: Vec<i32> = all.iter().map(|c| c.partition).collect();
        self.subtask = subtask;
        self.parallelism = parallelism;
        let mine: HashSet<i32> = self.owned(&partitions).into_iter().collect();
        let restored = all.into_iter().filter(|c| mine.contains(&c.partition)).collect();
        self.cursors = self.reconciled(restored)?;
        self.restarted();
        Ok(())
    }
}
