//! What the sink needs of Kafka: a partitioned log with transactions. [`KafkaClient`] is the
//! real one; [`TransactionModel`] is an in-memory model of the broker's side of the protocol
//! (producer ids and epochs, fencing, a transaction's partitions, commit and abort markers),
//! for tests that exercise the sink's protocol without a broker, and for `weir simulate`,
//! where it also loses requests and answers as a seed draws them.
//!
//! May touch: `client`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use weir::{Error, Result};

use crate::client::{KafkaClient, ProducerIdentity};

/// The requests the Kafka sink makes.
pub trait TransactionLog: Send {
    /// The partitions of `topic` (an error naming it if it does not exist).
    fn partitions(&mut self, topic: &str) -> Result<Vec<i32>>;
    /// Registers `transactional_id`: fences its earlier producer and aborts its open
    /// transaction; epoch 0 for an id never seen.
    fn init_producer(&mut self, transactional_id: &str, timeout: Duration) -> Result<ProducerIdentity>;
    /// Adds partitions to the producer's open transaction.
    fn add_partitions(
        &mut self,
        transactional_id: &str,
        producer: ProducerIdentity,
        topic: &str,
        partitions: &[i32],
    ) -> Result<()>;
    /// Appends an encoded batch (the transaction's, if `transactional_id` is given).
    fn produce(&mut self, transactional_id: Option<&str>, topic: &str, partition: i32, batch: Bytes) -> Result<()>;
    /// Commits or aborts the producer's transaction; a repeated commit is done.
    fn end_txn(&mut self, transactional_id: &str, producer: ProducerIdentity, commit: bool) -> Result<()>;
}

impl TransactionLog for KafkaClient {
    fn partitions(&mut self, topic: &str) -> Result<Vec<i32>> {
        KafkaClient::partitions(self, topic)
    }
    fn init_producer(&mut self, transactional_id: &str, timeout: Duration) -> Result<ProducerIdentity> {
        KafkaClient::init_producer(self, transactional_id, timeout)
    }
    fn add_partitions(
        &mut self,
        transactional_id: &str,
        producer: ProducerIdentity,
        topic: &str,
        partitions: &[i32],
    ) -> Result<()> {
        KafkaClient::add_partitions(self, transactional_id, producer, topic, partitions)
    }
    fn produce(&mut self, transactional_id: Option<&str>, topic: &str, partition: i32, batch: Bytes) -> Result<()> {
        KafkaClient::produce(self, transactional_id, topic, partition, batch)
    }
    fn end_txn(&mut self, transactional_id: &str, producer: ProducerIdentity, commit: bool) -> Result<()> {
        KafkaClient::end_txn(self, transactional_id, producer, commit)
    }
}

/// One entry of a modelled partition.
#[derive(Clone, Debug)]
enum Entry {
    /// A batch: its producer (-1 for none), whether transactional, its bytes.
    Data { producer: i64, transactional: bool, batch: Bytes },
    /// A transaction marker.
    Marker { producer: i64, commit: bool },
}

#[derive(Debug)]
struct ModelProducer {
    identity: ProducerIdentity,
    open: bool,
    partitions: HashSet<(String, i32)>,
    /// How its last transaction ended (a repeated end is answered the same).
    ended: Option<bool>,
}

#[derive(Debug, Default)]
struct ModelState {
    topics: HashMap<String, Vec<Vec<Entry>>>,
    producers: HashMap<String, ModelProducer>,
    next_id: i64,
    /// Requests lost, if the model loses any.
    losses: Option<Losses>,
}

/// Which requests a lossy model loses: drawn from a seed, a few per run.
#[derive(Debug)]
struct Losses {
    seed: u64,
    /// About one request in this many is lost.
    one_in: u64,
    /// Requests seen so far.
    drawn: u64,
    /// Losses left to inject.
    left: u32,
    /// Losses injected.
    lost: u32,
}

/// What becomes of one request.
enum Fate {
    Answered,
    /// Lost on the way: the broker never saw it.
    LostRequest,
    /// Carried out, its answer lost: the client cannot tell it from a lost request.
    LostAnswer,
}

/// An in-memory partitioned transactional log (see the module doc); clones share it.
#[derive(Clone, Debug, Default)]
pub struct TransactionModel {
    state: Arc<Mutex<ModelState>>,
}

fn fenced(id: &str) -> Error {
    Error::Fenced(format!("producer of transactional id {id} was fenced by a newer one"))
}

impl TransactionModel {
    fn lock(&self) -> MutexGuard<'_, ModelState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A model that loses some requests, as a network and a broker under load do: about one
    /// in `one_in` fails with a timeout, either before the broker saw it or after it was
    /// carried out (the answer lost), at most `most` in all; which ones is drawn from `seed`.
    pub fn losing_requests(seed: u64, one_in: u64, most: u32) -> Self {
        let model = TransactionModel::default();
        model.lock().losses = Some(Losses { seed, one_in: one_in.max(1), drawn: 0, left: most, lost: 0 });
        model
    }

    /// Requests lost so far (both kinds).
    pub fn lost(&self) -> u32 {
        self.lock().losses.as_ref().map_or(0, |l| l.lost)
    }

    /// Carries out request `what` on the model, unless the model loses it (or its answer).
    fn request<R>(&self, what: &str, apply: impl FnOnce(&mut ModelState) -> Result<R>) -> Result<R> {
        let mut state = self.lock();
        let fate = match state.losses.as_mut() {
            Some(l) if l.left > 0 => {
                l.drawn += 1;
                let r = weir::prng::mix(l.seed ^ l.drawn.wrapping_mul(0x9e37_79b9_7f4a_7c15));
                match (r % l.one_in, r >> 63) {
                    (0, 0) => Fate::LostRequest,
                    (0, _) => Fate::LostAnswer,
                    _ => Fate::Answered,
                }
            }
            _ => Fate::Answered,
        };
        let lost = || Error::Io {
            context: format!("Kafka request {what} (to the model)"),
            path: None,
            source: std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer: the request or its answer was lost"),
        };
        if !matches!(fate, Fate::Answered) {
            let l = state.losses.as_mut().expect("drawn from them");
            (l.left, l.lost) = (l.left - 1, l.lost + 1);
        }
        match fate {
            Fate::Answered => apply(&mut state),
            Fate::LostRequest => Err(lost()),
            Fate::LostAnswer => apply(&mut state).and(Err(lost())),
        }
    }

    /// Creates `topic` with `partitions` partitions.
    pub fn create_topic(&self, topic: &str, partitions: usize) {
        self.lock().topics.insert(topic.to_string(), vec![Vec::new(); partitions]);
    }

    /// The committed batches of `topic`, by partition in log order: those written outside
    /// transactions, and those of transactions a commit marker followed.
    pub fn committed(&self, topic: &str) -> Vec<Bytes> {
        let state = self.lock();
        let mut out = Vec::new();
        for log in state.topics.get(topic).into_iter().flatten() {
            let mut undecided: HashMap<i64, Vec<Bytes>> = HashMap::new();
            for e in log {
                match e {
                    Entry::Data { transactional: false, batch, .. } => out.push(batch.clone()),
                    Entry::Data { producer, batch, .. } => undecided.entry(*producer).or_default().push(batch.clone()),
                    Entry::Marker { producer, commit } => {
                        let batches = undecided.remove(producer).unwrap_or_default();
                        if *commit {
                            out.extend(batches);
                        }
                    }
                }
            }
        }
        out
    }

    /// Transactions still open (their batches neither committed nor aborted).
    pub fn open_transactions(&self) -> usize {
        self.lock().producers.values().filter(|p| p.open).count()
    }

    /// Writes the markers of `producer`'s open transaction.
    fn end(state: &mut ModelState, id: &str, commit: bool) {
        let Some(p) = state.producers.get_mut(id) else { return };
        let marks: Vec<(String, i32)> = p.partitions.drain().collect();
        let producer = p.identity.id;
        p.open = false;
        p.ended = Some(commit);
        for (topic, partition) in marks {
            if let Some(log) = state.topics.get_mut(&topic).and_then(|t| t.get_mut(partition as usize)) {
                log.push(Entry::Marker { producer, commit });
            }
        }
    }

    /// `producer` is the current identity of `id`, else the error a broker gives.
    fn current(state: &ModelState, id: &str, producer: ProducerIdentity) -> Result<()> {
        match state.producers.get(id) {
            Some(p) if p.identity == producer => Ok(()),
            _ => Err(fenced(id)),
        }
    }
}

impl TransactionLog for TransactionModel {
    fn partitions(&mut self, topic: &str) -> Result<Vec<i32>> {
        match self.lock().topics.get(topic) {
            Some(t) => Ok((0..t.len() as i32).collect()),
            None => Err(Error::config(format!("Kafka topic '{topic}' does not exist (in the model)"))),
        }
    }

    fn init_producer(&mut self, id: &str, _timeout: Duration) -> Result<ProducerIdentity> {
        self.request("InitProducerId", |state| {
            if state.producers.get(id).is_some_and(|p| p.open) {
                TransactionModel::end(state, id, false);
            }
            let next_id = state.next_id;
            let p = state.producers.entry(id.to_string()).or_insert_with(|| ModelProducer {
                identity: ProducerIdentity { id: next_id, epoch: -1 },
                open: false,
                partitions: HashSet::new(),
                ended: None,
            });
            p.identity.epoch += 1;
            p.ended = None;
            let identity = p.identity;
            if identity.id == next_id {
                state.next_id += 1;
            }
            Ok(identity)
        })
    }

    fn add_partitions(&mut self, id: &str, producer: ProducerIdentity, topic: &str, partitions: &[i32]) -> Result<()> {
        self.request("AddPartitionsToTxn", |state| {
            TransactionModel::current(state, id, producer)?;
            let p = state.producers.get_mut(id).expect("checked above");
            p.open = true;
            p.partitions.extend(partitions.iter().map(|&q| (topic.to_string(), q)));
            Ok(())
        })
    }

    fn produce(&mut self, id: Option<&str>, topic: &str, partition: i32, batch: Bytes) -> Result<()> {
        self.request("Produce", |state| {
            let (producer, transactional) = match id {
                Some(id) => {
                    let p = state.producers.get(id).ok_or_else(|| fenced(id))?;
                    if !p.open || !p.partitions.contains(&(topic.to_string(), partition)) {
                        return Err(Error::config(format!(
                            "{id} wrote to {topic}/{partition} outside its transaction"
                        )));
                    }
                    (p.identity.id, true)
                }
                None => (-1, false),
            };
            let log = state
                .topics
                .get_mut(topic)
                .and_then(|t| t.get_mut(partition as usize))
                .ok_or_else(|| Error::config(format!("no partition {topic}/{partition} in the model")))?;
            log.push(Entry::Data { producer, transactional, batch });
            Ok(())
        })
    }

    fn end_txn(&mut self, id: &str, producer: ProducerIdentity, commit: bool) -> Result<()> {
        self.request("EndTxn", |state| {
            TransactionModel::current(state, id, producer)?;
            let p = &state.producers[id];
            if !p.open {
                // Nothing open: a repeat of the same end is done; an empty transaction commits.
                return match p.ended {
                    Some(c) if c != commit => {
                        Err(Error::config(format!("{id}: its transaction already ended otherwise")))
                    }
                    _ => Ok(()),
                };
            }
            TransactionModel::end(state, id, commit);
            Ok(())
        })
    }
}
