//! The Kafka sink, Flink's `KafkaSink` as the model, with three delivery guarantees:
//!
//! - `ExactlyOnce`: one Kafka transaction per subtask and checkpoint interval, with its own
//!   transactional id `<prefix>-<subtask>-<n>` (`n` counts the subtask's transactions). On a
//!   checkpoint's barrier the sink flushes (pre-commit: everything is in the log, invisible to
//!   `read_committed` readers) and records the transaction's id and producer identity in the
//!   snapshot; when the checkpoint completes it commits (`EndTxn`). On recovery it commits
//!   what the restored checkpoint pre-committed, with the recorded identity (the
//!   coordinator accepts a commit from whoever holds it), then aborts whatever the failed run
//!   left open after it: re-registering an id (`InitProducerId`) fences its old producer and
//!   aborts its transaction, and the ids after the restored checkpoint's are re-registered
//!   until one the coordinator never saw. What is emitted after the last checkpoint goes into
//!   a final transaction committed when the whole job has succeeded.
//! - `AtLeastOnce`: every barrier flushes and waits for the broker's acknowledgement; a replay
//!   writes again what followed the restored checkpoint.
//! - `None`: records are written as they come, flushed at the end.
//!
//! Records are sent in batches per partition; a partition is chosen by the key's murmur2
//! hash, Kafka's own default partitioner (a record without a key goes round-robin). The sink
//! writes through a [`TransactionLog`]: a Kafka cluster, or the in-memory model of one.
//!
//! May touch: `client`, `compression`, `log`, `records`, `security`.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use weir::sink::Sink;
use weir::snapshot::{CheckpointNotice, ForkedState, PersistedFork};
use weir::{Result, TaskContext};

use crate::client::{KafkaClient, ProducerIdentity};
use crate::log::TransactionLog;
use crate::records::BatchWriter;

/// What a [`KafkaSink`] guarantees about its output after failures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Delivery {
    /// Each record in the output exactly once, visible to `read_committed` readers when the
    /// checkpoint after it completes.
    ExactlyOnce,
    /// Each record at least once (a failover repeats what followed the restored checkpoint).
    AtLeastOnce,
    /// No guarantee: what was in flight at a failure may be lost or repeated.
    None,
}

impl std::fmt::Display for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Delivery::ExactlyOnce => "exactly-once",
            Delivery::AtLeastOnce => "at-least-once",
            Delivery::None => "none",
        })
    }
}

/// One output message: its key (for partitioning) and value.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KafkaRecord {
    /// The key; records with the same key go to the same partition.
    pub key: Option<Vec<u8>>,
    /// The value.
    pub value: Vec<u8>,
}

type Encode<T> = Arc<dyn Fn(&T) -> KafkaRecord + Send + Sync>;

/// Opens a connection to the log the sink writes (a Kafka cluster, or a model of one).
type Connect = Arc<dyn Fn() -> Result<Box<dyn TransactionLog>> + Send + Sync>;

/// How long the coordinator keeps a transaction open before aborting it. A job down longer
/// than this between a checkpoint and its commit loses that checkpoint's output (recovery
/// then fails, naming it): Flink's `transaction.timeout.ms` as the model, and the broker's
/// `transaction.max.timeout.ms` (15 minutes by default) as its ceiling.
pub const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// By default a partition's batch is sent once it holds this much (Kafka's `batch.size` is
/// 16 KiB; a sink that flushes at every checkpoint can afford larger ones).
pub const BATCH_BYTES: usize = 256 << 10;

/// A Kafka topic as a sink: `stream.sink(KafkaSink::new(..).subtasks())`.
///
/// ```no_run
/// use weir::source::Generator;
/// use weir::Job;
/// use weir_kafka::{Delivery, KafkaRecord, KafkaSink};
///
/// let job = Job::new("numbers");
/// job.generator(Generator::new(|i, _| i).count(100)).sink(
///     KafkaSink::new("127.0.0.1:9092", "numbers", |n: &u64| KafkaRecord { key: None, value: n.to_string().into_bytes() })
///         .delivery(Delivery::ExactlyOnce)
///         .subtasks(),
/// );
/// ```
pub struct KafkaSink<T> {
    /// Where it writes, for messages (`host:port`).
    bootstrap: String,
    connect: Connect,
    topic: String,
    delivery: Delivery,
    prefix: Option<String>,
    batch_bytes: usize,
    compression: crate::Compression,
    encode: Encode<T>,
}

impl<T> std::fmt::Debug for KafkaSink<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSink")
            .field("bootstrap", &self.bootstrap)
            .field("topic", &self.topic)
            .field("delivery", &self.delivery)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl<T: Send + 'static> KafkaSink<T> {
    /// Writes to `topic` through broker `bootstrap` (`host:port`), each record turned into a
    /// message by `encode`. Exactly once by default.
    pub fn new(
        bootstrap: impl Into<String>,
        topic: impl Into<String>,
        encode: impl Fn(&T) -> KafkaRecord + Send + Sync + 'static,
    ) -> Self {
        let bootstrap: String = bootstrap.into();
        let address = bootstrap.clone();
        let connect: Connect =
            Arc::new(move || KafkaClient::connect(&address).map(|c| Box::new(c) as Box<dyn TransactionLog>));
        KafkaSink::over(bootstrap, connect, topic, encode)
    }

    /// Writes to `topic` of the log `connect` opens (named `name` in messages): a model of
    /// Kafka ([`crate::log::TransactionModel`]) in tests.
    pub fn over(
        name: impl Into<String>,
        connect: Arc<dyn Fn() -> Result<Box<dyn TransactionLog>> + Send + Sync>,
        topic: impl Into<String>,
        encode: impl Fn(&T) -> KafkaRecord + Send + Sync + 'static,
    ) -> Self {
        KafkaSink {
            bootstrap: name.into(),
            connect,
            topic: topic.into(),
            delivery: Delivery::ExactlyOnce,
            prefix: None,
            batch_bytes: BATCH_BYTES,
            compression: crate::Compression::None,
            encode: Arc::new(encode),
        }
    }

    /// The delivery guarantee.
    pub fn delivery(mut self, delivery: Delivery) -> Self {
        self.delivery = delivery;
        self
    }

    /// Sends a partition's batch once it holds `bytes` (else at the next barrier, or the end):
    /// larger batches cost fewer requests, smaller ones hold less in memory.
    pub fn batch_bytes(mut self, bytes: usize) -> Self {
        self.batch_bytes = bytes.max(1);
        self
    }

    /// How the batches it writes are compressed (Kafka's `compression.type`; none by default):
    /// a batch's records are compressed whole, by the sink's task as it sends them.
    pub fn compression(mut self, compression: crate::Compression) -> Self {
        self.compression = compression;
        self
    }

    /// The prefix of the transactional ids (exactly once): stable across restarts of the
    /// job, and different for every job (and every process) writing to the cluster. By
    /// default `weir-<job name>-<directory identity>-<topic>`, the identity of the job's
    /// checkpoint directory ([`weir::TaskContext::job_instance`]): two jobs never share it.
    /// One given here is the program's to keep unique: a job that starts with another's
    /// prefix aborts that one's open transactions.
    pub fn transactional_id_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// How its connections to the cluster it was made for ([`KafkaSink::new`]) are secured
    /// (TLS, SASL); plaintext by default.
    pub fn security(mut self, security: crate::Security) -> Self {
        let address = self.bootstrap.clone();
        self.connect = Arc::new(move || {
            KafkaClient::connect_with(&address, &security).map(|c| Box::new(c) as Box<dyn TransactionLog>)
        });
        self
    }

    /// The factory of the sink's subtasks, for [`weir::Stream::sink`].
    pub fn subtasks(self) -> impl Fn(&TaskContext) -> Result<KafkaSinkSubtask<T>> + Send + 'static {
        move |ctx| KafkaSinkSubtask::start(&self, ctx)
    }
}

/// A transaction: its id, its producer identity, the partitions added to it, and each
/// partition's next sequence number.
#[derive(Debug)]
struct OpenTxn {
    id: String,
    producer: ProducerIdentity,
    partitions: HashSet<i32>,
    sequences: BTreeMap<i32, i32>,
}

/// A pre-committed transaction, as the snapshot records it: (checkpoint, transactional id,
/// producer id, producer epoch).
type Pending = (u64, String, i64, i16);

/// What the snapshot holds: the subtask's next transaction number, and its pre-committed
/// transactions, oldest first.
type SinkState = (u64, Vec<Pending>);

/// One subtask of a [`KafkaSink`].
pub struct KafkaSinkSubtask<T> {
    client: Box<dyn TransactionLog>,
    connect: Connect,
    topic: String,
    delivery: Delivery,
    prefix: String,
    batch_bytes: usize,
    compression: crate::Compression,
    encode: Encode<T>,
    ctx: TaskContext,
    partitions: i32,
    round_robin: i32,
    /// Per partition: the batch being filled.
    batches: BTreeMap<i32, BatchWriter>,
    txn: Option<OpenTxn>,
    /// The number of the next transaction this subtask opens.
    next_number: u64,
    pending: Vec<Pending>,
    /// Whether what an earlier run left open was aborted (done before the first write).
    cleaned: bool,
}

impl<T> std::fmt::Debug for KafkaSinkSubtask<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSinkSubtask")
            .field("topic", &self.topic)
            .field("delivery", &self.delivery)
            .field("txn", &self.txn)
            .field("pending", &self.pending)
            .finish_non_exhaustive()
    }
}

/// Kafka's default partitioner's hash (murmur2, seed 0x9747b28c), as the Java client
/// computes it.
pub fn murmur2(data: &[u8]) -> i32 {
    const M: u32 = 0x5bd1_e995;
    let mut h: u32 = 0x9747_b28c ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes(c.try_into().expect("4 bytes"));
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

impl<T: Send + 'static> KafkaSinkSubtask<T> {
    fn start(sink: &KafkaSink<T>, ctx: &TaskContext) -> Result<Self> {
        let mut client = (sink.connect)()?;
        let partitions = client.partitions(&sink.topic)?.len() as i32;
        let prefix = sink.prefix.clone().unwrap_or_else(|| default_prefix(ctx, &sink.topic));
        Ok(KafkaSinkSubtask {
            client,
            connect: Arc::clone(&sink.connect),
            topic: sink.topic.clone(),
            delivery: sink.delivery,
            prefix,
            batch_bytes: sink.batch_bytes,
            compression: sink.compression,
            encode: Arc::clone(&sink.encode),
            ctx: ctx.clone(),
            partitions,
            round_robin: ctx.subtask as i32,
            batches: BTreeMap::new(),
            txn: None,
            next_number: 0,
            pending: Vec::new(),
            cleaned: false,
        })
    }

    fn txn_id(&self, subtask: usize, number: u64) -> String {
        format!("{}-{subtask}-{number}", self.prefix)
    }

    /// Before this start writes anything (exactly once): aborts the transactions a failed
    /// run of `subtask` left open, from number `from` on.
    fn abort_lingering(&mut self, subtask: usize, from: u64) -> Result<u64> {
        let mut n = from;
        loop {
            let id = self.txn_id(subtask, n);
            let producer = self.client.init_producer(&id, TRANSACTION_TIMEOUT)?;
            // An id the coordinator never saw starts at epoch 0: nothing after it was used.
            if producer.epoch == 0 {
                return Ok(n);
            }
            n += 1;
        }
    }

    fn clean(&mut self) -> Result<()> {
        if self.delivery != Delivery::ExactlyOnce || std::mem::replace(&mut self.cleaned, true) {
            return Ok(());
        }
        self.refuse_writing_again()?;
        self.abort_lingering(self.ctx.subtask, self.next_number)?;
        Ok(())
    }

    /// Recovery fell back past damaged checkpoints: what this sink committed under them, the
    /// replay writes again, and Kafka output cannot be withdrawn. Refused (naming them),
    /// unless the job allows retracting output, taken here to mean it accepts those records
    /// twice.
    fn refuse_writing_again(&self) -> Result<()> {
        let recovery = self.ctx.recovery();
        if recovery.skipped.is_empty() {
            return Ok(());
        }
        let from = recovery.restored.map_or("the start".to_string(), |k| format!("checkpoint {k}"));
        if !recovery.allow_retracting_output {
            return Err(weir::Error::OutputCannotBeWithdrawn(format!(
                "recovery from {from} would write to Kafka topic '{}' again what later checkpoints committed ({}); \
                 Kafka output cannot be withdrawn. Nothing was written. To go on and accept those records twice, \
                 allow retracting output (weir: --allow-retracting-output; CheckpointConfig::allow_retracting_output)",
                self.topic,
                recovery.why_lost()
            )));
        }
        self.ctx.note(format!(
            "Kafka topic '{}' may hold twice what was committed after {from} ({}): Kafka output cannot be withdrawn",
            self.topic,
            recovery.why_lost()
        ));
        Ok(())
    }

    /// The open transaction, opened if there is none (exactly once).
    fn open(&mut self) -> Result<&mut OpenTxn> {
        if self.txn.is_none() {
            let number = self.next_number;
            let id = self.txn_id(self.ctx.subtask, number);
            let producer = self.client.init_producer(&id, TRANSACTION_TIMEOUT)?;
            self.next_number += 1;
            self.txn = Some(OpenTxn { id, producer, partitions: HashSet::new(), sequences: BTreeMap::new() });
        }
        Ok(self.txn.as_mut().expect("opened above"))
    }

    /// Sends partition `p`'s batch.
    fn send(&mut self, p: i32) -> Result<()> {
        // The writer stays in the map: its buffer is reused by the partition's next batch.
        if self.batches.get(&p).is_none_or(BatchWriter::is_empty) {
            return Ok(());
        }
        if self.delivery != Delivery::ExactlyOnce {
            let bytes = self.batches.get_mut(&p).expect("checked above").finish(None, false);
            return self.client.produce(None, &self.topic, p, bytes);
        }
        self.open()?;
        let txn = self.txn.as_mut().expect("opened above");
        if txn.partitions.insert(p) {
            self.client.add_partitions(&txn.id, txn.producer, &self.topic, &[p])?;
        }
        let batch = self.batches.get_mut(&p).expect("checked above");
        let seq = txn.sequences.entry(p).or_insert(0);
        let records = batch.len() as i32;
        let bytes = batch.finish(Some((txn.producer.id, txn.producer.epoch, *seq)), true);
        *seq = seq.wrapping_add(records);
        self.client.produce(Some(&txn.id), &self.topic, p, bytes)
    }

    fn flush(&mut self) -> Result<()> {
        let parts: Vec<i32> = self.batches.keys().copied().collect();
        for p in parts {
            self.send(p)?;
        }
        Ok(())
    }

    /// Commits the pre-committed transactions that checkpoint `id` covers.
    fn commit_through(&mut self, id: u64) -> Result<()> {
        let split = self.pending.partition_point(|(k, ..)| *k <= id);
        let done: Vec<Pending> = self.pending.drain(..split).collect();
        for (_, txn, pid, epoch) in done {
            self.client.end_txn(&txn, ProducerIdentity { id: pid, epoch }, true)?;
        }
        Ok(())
    }

    fn state(&self) -> SinkState {
        (self.next_number, self.pending.clone())
    }
}

impl<T: Send + 'static> Sink<T> for KafkaSinkSubtask<T> {
    fn write(&mut self, records: &mut Vec<T>) -> Result<()> {
        self.clean()?;
        let now = self.ctx.processing_time_ms() as i64;
        for r in records.drain(..) {
            let m = (self.encode)(&r);
            let p = match &m.key {
                Some(k) => (murmur2(k) & 0x7fff_ffff) % self.partitions,
                None => {
                    self.round_robin = (self.round_robin + 1) % self.partitions;
                    self.round_robin
                }
            };
            let compression = self.compression;
            let batch = self.batches.entry(p).or_insert_with(|| BatchWriter::compressed(compression));
            batch.push(now, m.key.as_deref(), &m.value);
            if batch.bytes() >= self.batch_bytes {
                self.send(p)?;
            }
        }
        Ok(())
    }

    fn pre_commit(&mut self, checkpoint: u64) -> Result<Option<Box<dyn ForkedState>>> {
        match self.delivery {
            Delivery::None => Ok(None),
            Delivery::AtLeastOnce => self.flush().map(|()| None),
            Delivery::ExactlyOnce => {
                self.clean()?;
                self.flush()?;
                if let Some(txn) = self.txn.take() {
                    self.pending.push((checkpoint, txn.id, txn.producer.id, txn.producer.epoch));
                }
                Ok(Some(Box::new(PersistedFork(self.state()))))
            }
        }
    }

    fn notify(&mut self, notice: CheckpointNotice) -> Result<()> {
        // An aborted checkpoint's transaction stays pending and is committed with the next
        // completed one (its records are still valid; only the checkpoint failed).
        if let CheckpointNotice::Complete(id) = notice {
            self.commit_through(id)?;
        }
        Ok(())
    }

    fn restore(&mut self, bytes: &[u8]) -> Result<()> {
        let (next, pending): SinkState = weir::persist::from_bytes(bytes)?;
        self.pending = pending;
        // Everything the restored (complete) checkpoint pre-committed is committed now.
        self.commit_through(u64::MAX)?;
        self.next_number = next;
        Ok(())
    }

    fn restore_rescaled(&mut self, parts: &[(usize, &[u8])], _scope: &weir::record::KeyScope) -> Result<()> {
        let p = self.ctx.parallelism;
        for (old, bytes) in parts {
            let (next, pending): SinkState = weir::persist::from_bytes(bytes)?;
            // Old subtask `old`'s transactions are this one's to finish if it stands for it.
            if old % p != self.ctx.subtask {
                continue;
            }
            self.pending = pending;
            self.commit_through(u64::MAX)?;
            if *old == self.ctx.subtask {
                self.next_number = next;
            } else {
                self.abort_lingering(*old, next)?;
            }
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        self.clean()?;
        self.flush()?;
        if self.delivery != Delivery::ExactlyOnce {
            return Ok(());
        }
        let mut rest = std::mem::take(&mut self.pending);
        if let Some(txn) = self.txn.take() {
            rest.push((u64::MAX, txn.id, txn.producer.id, txn.producer.epoch));
        }
        if rest.is_empty() {
            return Ok(());
        }
        let connect = Arc::clone(&self.connect);
        self.ctx.on_job_success(move || {
            // Tried again after a lost answer: from the first not known to be committed (a
            // commit repeated is done).
            let mut client = connect()?;
            while let Some((_, txn, pid, epoch)) = rest.first() {
                client.end_txn(txn, ProducerIdentity { id: *pid, epoch: *epoch }, true)?;
                rest.remove(0);
            }
            Ok(())
        });
        Ok(())
    }
}

/// The transactional id prefix a sink of `ctx`'s job uses by default for `topic`: the job's
/// name, the identity of its checkpoint directory (two jobs, even of one name, never share
/// it; every restart from the directory has it), the topic.
fn default_prefix(ctx: &TaskContext, topic: &str) -> String {
    match ctx.job_instance() {
        Some(instance) => format!("weir-{}-{instance}-{topic}", ctx.job),
        None => format!("weir-{}-{topic}", ctx.job),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values the Java client's `Utils.murmur2` gives (Kafka's partitioner tests).
    #[test]
    fn murmur2_matches_kafka() {
        assert_eq!(murmur2(b"21"), -973_932_308);
        assert_eq!(murmur2(b"foobar"), -790_332_482);
        assert_eq!(murmur2(b"a-little-bit-long-string"), -985_981_536);
        assert_eq!(murmur2(b"a-little-bit-longer-string"), -1_486_304_829);
        assert_eq!(murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8"), -58_897_971);
        assert_eq!(murmur2(b"abc"), 479_470_107);
    }
}
