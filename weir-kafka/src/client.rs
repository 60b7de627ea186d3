//! A blocking Kafka client: exactly the requests weir's source and sink make (topic metadata,
//! offsets, fetch, produce, and the transaction coordinator's four requests), each sent to the
//! broker that leads the partition or coordinates the transactional id, with connections kept
//! per broker and a failed request tried again a few times (after a metadata refresh) before
//! its error reaches the job, which then fails over.
//!
//! May touch: `error`, `security`, `wire`.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::add_partitions_to_txn_request::{AddPartitionsToTxnTopic, AddPartitionsToTxnTransaction};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    AddPartitionsToTxnRequest, BrokerId, CreateTopicsRequest, EndTxnRequest, FetchRequest, FindCoordinatorRequest,
    InitProducerIdRequest, ListOffsetsRequest, MetadataRequest, ProduceRequest, ProducerId, TopicName, TransactionalId,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::error::{network, protocol, transient};
use crate::security::Security;
use crate::wire::Connection;
use weir::{Error, Result};

/// How often a request is tried before its error fails the job.
const ATTEMPTS: u32 = 4;

/// What a fetch returned for one partition.
#[derive(Debug)]
pub struct FetchedPartition {
    /// The partition.
    pub partition: i32,
    /// The broker's high watermark (the end of the log).
    pub high_watermark: i64,
    /// The end of the log a `read_committed` reader may read (before the oldest open
    /// transaction), or -1 if the broker does not say.
    pub last_stable_offset: i64,
    /// The first offset the log still holds, or -1 if the broker does not say.
    pub log_start_offset: i64,
    /// Whether the offset asked for is no longer (or not yet) in the log: nothing else is set.
    pub out_of_range: bool,
    /// Transactions aborted in the range returned: (producer id, first offset).
    pub aborted: Vec<(i64, i64)>,
    /// The record batches, as the broker sent them.
    pub records: Bytes,
}

/// A producer identity the transaction coordinator handed out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProducerIdentity {
    /// The producer id.
    pub id: i64,
    /// Its epoch: a newer epoch of the same transactional id fences older ones.
    pub epoch: i16,
}

/// A connection pool to one Kafka cluster.
pub struct KafkaClient {
    bootstrap: String,
    /// How every connection is secured.
    security: Security,
    /// Connections by broker address.
    conns: HashMap<String, Connection>,
    /// Broker addresses by node id.
    brokers: HashMap<i32, String>,
    /// Partition leaders by (topic, partition).
    leaders: HashMap<(String, i32), i32>,
    /// Partition counts by topic.
    partitions: HashMap<String, i32>,
    /// Coordinators by (key type: 0 a consumer group, 1 a transactional id; key).
    coordinators: HashMap<(i8, String), String>,
}

impl std::fmt::Debug for KafkaClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaClient").field("bootstrap", &self.bootstrap).finish_non_exhaustive()
    }
}

fn name(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

impl KafkaClient {
    /// Connects to the cluster through `bootstrap` (`host:port`), plaintext. An unreachable
    /// broker is an error within seconds, naming it.
    pub fn connect(bootstrap: &str) -> Result<KafkaClient> {
        KafkaClient::connect_with(bootstrap, &Security::plaintext())
    }

    /// Connects to the cluster through `bootstrap` (`host:port`), every connection secured
    /// as `security` says (TLS, SASL). A broker that refuses the login or whose certificate
    /// is not trusted is a configuration error naming it.
    pub fn connect_with(bootstrap: &str, security: &Security) -> Result<KafkaClient> {
        let conn = Connection::open(bootstrap, security)?;
        let mut conns = HashMap::new();
        conns.insert(bootstrap.to_string(), conn);
        Ok(KafkaClient {
            bootstrap: bootstrap.to_string(),
            security: security.clone(),
            conns,
            brokers: HashMap::new(),
            leaders: HashMap::new(),
            partitions: HashMap::new(),
            coordinators: HashMap::new(),
        })
    }

    fn conn(&mut self, addr: &str) -> Result<&mut Connection> {
        if !self.conns.contains_key(addr) {
            let c = Connection::open(addr, &self.security)?;
            self.conns.insert(addr.to_string(), c);
        }
        Ok(self.conns.get_mut(addr).expect("inserted above"))
    }

    /// Runs `f` against the connection to `addr()` up to [`ATTEMPTS`] times: after a network
    /// error the connection is dropped and the cached metadata forgotten (so `addr` is looked
    /// up again), after a transient broker error it waits a little.
    pub(crate) fn retrying<X>(
        &mut self,
        what: &str,
        mut addr: impl FnMut(&mut Self) -> Result<String>,
        mut f: impl FnMut(&mut Connection) -> Result<Result<X, i16>>,
    ) -> Result<X> {
        let mut last = None;
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(50 << attempt));
            }
            let target = match addr(self) {
                Ok(a) => a,
                Err(e) if e.is_retryable() => {
                    self.forget();
                    last = Some(e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let outcome = self.conn(&target).and_then(&mut f);
            match outcome {
                Ok(Ok(x)) => return Ok(x),
                Ok(Err(code)) if transient(code) => {
                    self.forget();
                    last = Some(protocol(&target, what, code));
                }
                Ok(Err(code)) => return Err(protocol(&target, what, code)),
                Err(e) if e.is_retryable() => {
                    self.conns.remove(&target);
                    self.forget();
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.expect("at least one attempt was made"))
    }

    /// Forgets cached leaders and coordinators (they may have moved).
    fn forget(&mut self) {
        self.leaders.clear();
        self.coordinators.clear();
    }

    /// Asks the cluster about `topic`: its partitions and their leaders.
    fn refresh(&mut self, topic: &str) -> Result<()> {
        let bootstrap = self.bootstrap.clone();
        let response = self.retrying(
            "Metadata",
            |_| Ok(bootstrap.clone()),
            |c| {
                let mut t = MetadataRequestTopic::default();
                t.name = Some(TopicName(name(topic)));
                let mut request = MetadataRequest::default();
                request.topics = Some(vec![t]);
                request.allow_auto_topic_creation = false;
                c.call(&request).map(Ok)
            },
        )?;
        for b in &response.brokers {
            self.brokers.insert(b.node_id.0, format!("{}:{}", b.host.as_str(), b.port));
        }
        let Some(t) = response.topics.iter().find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic)) else {
            return Err(self.no_topic(topic));
        };
        if t.error_code == ResponseError::UnknownTopicOrPartition.code() {
            return Err(self.no_topic(topic));
        }
        if t.error_code != 0 {
            return Err(protocol(&self.bootstrap, "Metadata", t.error_code));
        }
        self.partitions.insert(topic.to_string(), t.partitions.len() as i32);
        for p in &t.partitions {
            self.leaders.insert((topic.to_string(), p.partition_index), p.leader_id.0);
        }
        Ok(())
    }

    fn no_topic(&self, topic: &str) -> Error {
        Error::config(format!("Kafka topic '{topic}' does not exist on {} (create it first)", self.bootstrap))
    }

    /// The partitions of `topic`, `0..n`. A topic that does not exist is an error naming it.
    pub fn partitions(&mut self, topic: &str) -> Result<Vec<i32>> {
        self.refresh(topic)?;
        Ok((0..self.partitions[topic]).collect())
    }

    /// The broker address it was connected through.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// The address of the leader of `topic`'s `partition`.
    fn leader(&mut self, topic: &str, partition: i32) -> Result<String> {
        let key = (topic.to_string(), partition);
        if !self.leaders.contains_key(&key) {
            self.refresh(topic)?;
        }
        let Some(node) = self.leaders.get(&key).copied() else {
            return Err(Error::config(format!(
                "Kafka topic '{topic}' has no partition {partition} on {}",
                self.bootstrap
            )));
        };
        match self.brokers.get(&node) {
            Some(a) => Ok(a.clone()),
            None => Err(network(
                format!("Kafka partition {topic}/{partition} has no live leader"),
                std::io::Error::other("leader unknown"),
            )),
        }
    }

    /// Creates `topic` with `partitions` partitions; one that exists already is left as it is.
    pub fn create_topic(&mut self, topic: &str, partitions: i32) -> Result<()> {
        let bootstrap = self.bootstrap.clone();
        self.retrying(
            "CreateTopics",
            |_| Ok(bootstrap.clone()),
            |c| {
                let mut t = CreatableTopic::default();
                t.name = TopicName(name(topic));
                t.num_partitions = partitions;
                t.replication_factor = 1;
                let mut request = CreateTopicsRequest::default();
                request.topics = vec![t];
                request.timeout_ms = 10_000;
                let response = c.call(&request)?;
                let code = response.topics.first().map_or(0, |t| t.error_code);
                Ok(if code == 0 || code == ResponseError::TopicAlreadyExists.code() { Ok(()) } else { Err(code) })
            },
        )?;
        self.partitions.remove(topic);
        Ok(())
    }

    /// Where the log of each of `partitions` starts and ends now: `(first offset, end)`, the end
    /// being the high watermark or, with `committed`, the last stable offset (before the
    /// oldest open transaction). Asked with a fetch, whose answer carries all three (Tansu
    /// 0.6 answers `ListOffsets` for the latest offset one short, and for the earliest with
    /// an offset past records it still holds); the earliest offset is asked with
    /// `ListOffsets` only if the log no longer starts at 0.
    pub fn bounds(&mut self, topic: &str, partitions: &[i32], committed: bool) -> Result<HashMap<i32, (i64, i64)>> {
        let from: Vec<(i32, i64)> = partitions.iter().map(|p| (*p, 0)).collect();
        let fetched = self.fetch(topic, &from, 1, 1, committed)?;
        let mut out = HashMap::new();
        for f in fetched {
            let end = if committed && f.last_stable_offset >= 0 { f.last_stable_offset } else { f.high_watermark };
            let start = if f.out_of_range {
                self.offsets(topic, &[f.partition], false)?[&f.partition]
            } else {
                f.log_start_offset.max(0)
            };
            out.insert(f.partition, (start, end.max(start)));
        }
        if let Some(p) = partitions.iter().find(|p| !out.contains_key(p)) {
            return Err(network(
                format!("Kafka broker {} did not say where partition {topic}/{p} starts and ends", self.bootstrap),
                std::io::Error::other("no answer for the partition"),
            ));
        }
        Ok(out)
    }

    /// The earliest offsets of `partitions` of `topic`, by `ListOffsets`.
    fn offsets(&mut self, topic: &str, partitions: &[i32], committed: bool) -> Result<HashMap<i32, i64>> {
        let mut out = HashMap::new();
        for &p in partitions {
            let offset = self.retrying(
                "ListOffsets",
                |me| me.leader(topic, p),
                |c| {
                    let mut part = ListOffsetsPartition::default();
                    part.partition_index = p;
                    part.current_leader_epoch = -1;
                    part.timestamp = -2;
                    let mut t = ListOffsetsTopic::default();
                    t.name = TopicName(name(topic));
                    t.partitions = vec![part];
                    let mut request = ListOffsetsRequest::default();
                    request.replica_id = BrokerId(-1);
                    request.isolation_level = i8::from(committed);
                    request.topics = vec![t];
                    let response = c.call(&request)?;
                    let r = response.topics.first().and_then(|t| t.partitions.first());
                    Ok(match r {
                        Some(r) if r.error_code == 0 => Ok(r.offset),
                        Some(r) => Err(r.error_code),
                        None => Err(ResponseError::UnknownServerError.code()),
                    })
                },
            )?;
            out.insert(p, offset);
        }
        Ok(out)
    }

    /// Fetches `topic`'s partitions from the given offsets (`(partition, offset)`), waiting up
    /// to `max_wait_ms` on the broker for data; `committed` reads only committed transactions.
    pub fn fetch(
        &mut self,
        topic: &str,
        from: &[(i32, i64)],
        max_wait_ms: i32,
        max_bytes: i32,
        committed: bool,
    ) -> Result<Vec<FetchedPartition>> {
        // One request per leader.
        let mut by_leader: HashMap<String, Vec<(i32, i64)>> = HashMap::new();
        for &(p, offset) in from {
            by_leader.entry(self.leader(topic, p)?).or_default().push((p, offset));
        }
        let mut out = Vec::new();
        for (leader, parts) in by_leader {
            let fetched = self.retrying(
                "Fetch",
                |_| Ok(leader.clone()),
                |c| {
                    let mut t = FetchTopic::default();
                    t.topic = TopicName(name(topic));
                    t.partitions = parts
                        .iter()
                        .map(|&(p, offset)| {
                            let mut fp = FetchPartition::default();
                            fp.partition = p;
                            fp.current_leader_epoch = -1;
                            fp.fetch_offset = offset;
                            fp.last_fetched_epoch = -1;
                            fp.log_start_offset = -1;
                            fp.partition_max_bytes = max_bytes;
                            fp
                        })
                        .collect();
                    let mut request = FetchRequest::default();
                    request.replica_id = BrokerId(-1);
                    request.max_wait_ms = max_wait_ms;
                    request.min_bytes = 1;
                    request.max_bytes = max_bytes;
                    request.isolation_level = i8::from(committed);
                    request.session_epoch = -1;
                    request.topics = vec![t];
                    let response = c.call(&request)?;
                    if response.error_code != 0 {
                        return Ok(Err(response.error_code));
                    }
                    let mut got = Vec::new();
                    for t in response.responses {
                        for p in t.partitions {
                            let out_of_range = p.error_code == ResponseError::OffsetOutOfRange.code();
                            if p.error_code != 0 && !out_of_range {
                                return Ok(Err(p.error_code));
                            }
                            got.push(FetchedPartition {
                                partition: p.partition_index,
                                high_watermark: p.high_watermark,
                                last_stable_offset: p.last_stable_offset,
                                log_start_offset: p.log_start_offset,
                                out_of_range,
                                aborted: p
                                    .aborted_transactions
                                    .unwrap_or_default()
                                    .iter()
                                    .map(|a| (a.producer_id.0, a.first_offset))
                                    .collect(),
                                records: p.records.unwrap_or_default(),
                            });
                        }
                    }
                    Ok(Ok(got))
                },
            )?;
            out.extend(fetched);
        }
        Ok(out)
    }

    /// Appends one encoded record batch to `topic`'s `partition` (as transaction
    /// `transactional_id`'s, if given), waiting for every in-sync replica.
    pub fn produce(&mut self, transactional_id: Option<&str>, topic: &str, partition: i32, batch: Bytes) -> Result<()> {
        self.retrying(
            "Produce",
            |me| me.leader(topic, partition),
            |c| {
                let mut pd = PartitionProduceData::default();
                pd.index = partition;
                pd.records = Some(batch.clone());
                let mut t = TopicProduceData::default();
                t.name = TopicName(name(topic));
                t.partition_data = vec![pd];
                let mut request = ProduceRequest::default();
                request.transactional_id = transactional_id.map(|id| TransactionalId(name(id)));
                request.acks = -1;
                request.timeout_ms = 30_000;
                request.topic_data = vec![t];
                let response = c.call(&request)?;
                let code =
                    response.responses.first().and_then(|t| t.partition_responses.first()).map_or(0, |p| p.error_code);
                // A batch the broker already has (a retry after a lost answer) is not written twice.
                Ok(if code == 0 || code == ResponseError::DuplicateSequenceNumber.code() { Ok(()) } else { Err(code) })
            },
        )
    }

    /// The address of the transaction coordinator of `transactional_id`.
    fn coordinator(&mut self, transactional_id: &str) -> Result<String> {
        self.coordinator_of(transactional_id, 1)
    }

    /// The address of the coordinator of consumer group `group`.
    pub(crate) fn group_coordinator(&mut self, group: &str) -> Result<String> {
        self.coordinator_of(group, 0)
    }

    /// The coordinator of `key`: a consumer group (`key_type` 0) or a transactional id (1).
    fn coordinator_of(&mut self, key: &str, key_type: i8) -> Result<String> {
        let cached = (key_type, key.to_string());
        if let Some(a) = self.coordinators.get(&cached) {
            return Ok(a.clone());
        }
        let bootstrap = self.bootstrap.clone();
        let addr = self.retrying(
            "FindCoordinator",
            |_| Ok(bootstrap.clone()),
            |c| {
                let mut request = FindCoordinatorRequest::default();
                request.key = name(key);
                request.key_type = key_type;
                let r = c.call(&request)?;
                Ok(if r.error_code == 0 { Ok(format!("{}:{}", r.host.as_str(), r.port)) } else { Err(r.error_code) })
            },
        )?;
        self.coordinators.insert(cached, addr.clone());
        Ok(addr)
    }

    /// Registers `transactional_id` with its coordinator: any earlier producer of that id is
    /// fenced and its open transaction aborted. Returns the new identity (epoch 0 for an id
    /// the coordinator did not know).
    pub fn init_producer(&mut self, transactional_id: &str, timeout: Duration) -> Result<ProducerIdentity> {
        self.retrying(
            "InitProducerId",
            |me| me.coordinator(transactional_id),
            |c| {
                let mut request = InitProducerIdRequest::default();
                request.transactional_id = Some(TransactionalId(name(transactional_id)));
                request.transaction_timeout_ms = timeout.as_millis().min(i32::MAX as u128) as i32;
                request.producer_id = ProducerId(-1);
                request.producer_epoch = -1;
                let r = c.call(&request)?;
                Ok(if r.error_code == 0 {
                    Ok(ProducerIdentity { id: r.producer_id.0, epoch: r.producer_epoch })
                } else {
                    Err(r.error_code)
                })
            },
        )
    }

    /// Adds `partitions` of `topic` to the open transaction of `transactional_id`.
    pub fn add_partitions(
        &mut self,
        transactional_id: &str,
        producer: ProducerIdentity,
        topic: &str,
        partitions: &[i32],
    ) -> Result<()> {
        self.retrying(
            "AddPartitionsToTxn",
            |me| me.coordinator(transactional_id),
            |c| {
                let mut t = AddPartitionsToTxnTopic::default();
                t.name = TopicName(name(topic));
                t.partitions = partitions.to_vec();
                let mut txn = AddPartitionsToTxnTransaction::default();
                txn.transactional_id = TransactionalId(name(transactional_id));
                txn.producer_id = ProducerId(producer.id);
                txn.producer_epoch = producer.epoch;
                txn.topics = vec![t];
                let mut request = AddPartitionsToTxnRequest::default();
                // Versions before 4 carry one transaction in the top-level fields.
                request.v3_and_below_transactional_id = txn.transactional_id.clone();
                request.v3_and_below_producer_id = txn.producer_id;
                request.v3_and_below_producer_epoch = txn.producer_epoch;
                request.v3_and_below_topics = txn.topics;
                let r = c.call(&request)?;
                if r.error_code != 0 {
                    return Ok(Err(r.error_code));
                }
                let codes = r
                    .results_by_topic_v3_and_below
                    .iter()
                    .chain(r.results_by_transaction.iter().flat_map(|t| t.topic_results.iter()))
                    .flat_map(|t| t.results_by_partition.iter().map(|p| p.partition_error_code));
                for code in codes {
                    if code != 0 {
                        return Ok(Err(code));
                    }
                }
                Ok(Ok(()))
            },
        )
    }

    /// Commits (or aborts) the open transaction of `transactional_id` made by `producer`.
    /// Repeating a commit that was done is done. An identity a newer producer replaced is
    /// [`Error::Fenced`]: another process took the transactional id over, or the coordinator
    /// aborted the transaction when its timeout passed.
    pub fn end_txn(&mut self, transactional_id: &str, producer: ProducerIdentity, commit: bool) -> Result<()> {
        self.retrying(
            "EndTxn",
            |me| me.coordinator(transactional_id),
            |c| {
                let mut request = EndTxnRequest::default();
                request.transactional_id = TransactionalId(name(transactional_id));
                request.producer_id = ProducerId(producer.id);
                request.producer_epoch = producer.epoch;
                request.committed = commit;
                let r = c.call(&request)?;
                Ok(if r.error_code == 0 { Ok(()) } else { Err(r.error_code) })
            },
        )
    }
}
