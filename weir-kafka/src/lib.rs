//! Kafka for weir: a source that reads a topic's partitions with their offsets in weir's
//! checkpoints, and a sink that writes a topic exactly once with one Kafka transaction per
//! checkpoint. Several weir processes share a topic by each reading a set of its partitions
//! (see the README: Kafka is the distributed part, weir stays one process).
//!
//! The client speaks Kafka's wire protocol itself (messages encoded by `kafka-protocol`, a
//! blocking connection per broker): no C library, and the one thing librdkafka cannot do,
//! which exactly-once output needs: committing, after a restart, the transaction a failed
//! process pre-committed (with the producer identity the checkpoint recorded), Flink's
//! `KafkaSink` recovery.
//!
//! ```no_run
//! use weir::{Job, RunConfig};
//! use weir_kafka::{KafkaRecord, KafkaSink, KafkaSource};
//!
//! let job = Job::new("upper").with_parallelism(2);
//! job.source(KafkaSource::new("127.0.0.1:9092", "in", |m| m.value.map(<[u8]>::to_vec)).subtasks())
//!     .map(|v: Vec<u8>| v.to_ascii_uppercase())
//!     .sink(KafkaSink::new("127.0.0.1:9092", "out", |v: &Vec<u8>| KafkaRecord { key: None, value: v.clone() }).subtasks());
//! job.execute(RunConfig::default()).unwrap();
//! ```
//!
//! Clusters that are not open plaintext (managed Kafka: MSK, Confluent Cloud, Aiven) are
//! reached with a [`Security`]: TLS with the platform's roots or a CA file, SASL PLAIN or
//! SCRAM-SHA-256/512 (`KafkaSource::security`, `KafkaSink::security`,
//! `KafkaClient::connect_with`).
//!
//! The modules, in the order data flows: `wire` (one connection, with [`security`]'s TLS and
//! SASL), [`client`] (the
//! requests), [`records`] (the batch format, with [`compression`]'s codecs), [`source`], [`log`] (what the sink needs of
//! Kafka, and an in-memory model of it), [`sink`], [`committed`] (reading a topic as the
//! protocol defines what is committed), [`url`] (`kafka://` addresses), and beside them
//! [`group`] (a consumer group's membership, for processes that let Kafka share the
//! partitions out).
//!
//! ## Modules, lowest layer first (a module uses only modules above it in this list)
//!
//! - `compression`: the codecs of compressed batches.
//! - `error`, `records`, `security`, `url`: the crate's errors, the batch format, TLS and SASL
//!   settings, `kafka://` addresses.
//! - `wire`: one connection.
//! - `client`: the requests.
//! - `committed`, `group`, `log`: committed output read back, a consumer group, the log the
//!   sink needs.
//! - `sink`, `source`: the connector's two ends, which never use each other.
//!
//! May touch: `weir` (the public API).

pub mod client;
pub mod committed;
pub mod compression;
mod error;
pub mod group;
pub mod log;
pub mod records;
pub mod security;
pub mod sink;
pub mod source;
pub mod url;
mod wire;

pub use client::KafkaClient;
pub use committed::{read_topic, read_topic_with, TopicContents};
pub use compression::Compression;
pub use group::{CompletedOffsets, ConsumerGroup, GroupState};
pub use security::{Sasl, SaslMechanism, Security, Tls};
pub use sink::{Delivery, KafkaRecord, KafkaSink, KafkaSinkSubtask};
pub use source::{Assignment, KafkaMessage, KafkaSource, KafkaSubtask};
pub use url::KafkaUrl;
