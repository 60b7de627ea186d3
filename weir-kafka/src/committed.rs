//! The output of transactional producers as the protocol defines what is committed: a
//! transaction's batches count only once a COMMIT marker of their producer follows them, and
//! never after an ABORT marker. Read from the log with its control records, so a check of
//! exactly-once output does not trust the broker's own `read_committed` filtering (Tansu 0.6,
//! the broker weir's tests run against, hands aborted records to `read_committed` readers).
//!
//! May touch: `client`, `records`, `security`.

use std::collections::HashMap;

use weir::Result;

use crate::client::KafkaClient;
use crate::records::{batches, Item, Marker};

/// One message of a topic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// Its key.
    pub key: Option<Vec<u8>>,
    /// Its value.
    pub value: Option<Vec<u8>>,
}

/// What a topic holds, read to the end of every partition: the committed messages (those
/// written outside transactions, and those of committed transactions), and how many
/// messages belong to transactions aborted or still open.
#[derive(Debug, Default)]
pub struct TopicContents {
    /// Committed messages, by partition and offset.
    pub committed: Vec<Message>,
    /// Messages of aborted transactions.
    pub aborted: usize,
    /// Messages of transactions with no marker yet.
    pub open: usize,
}

/// Reads all of `topic` through `bootstrap`, markers included, and sorts its messages into
/// committed, aborted and open (see the module doc).
pub fn read_topic(bootstrap: &str, topic: &str) -> Result<TopicContents> {
    read_topic_with(bootstrap, &crate::Security::plaintext(), topic)
}

/// [`read_topic`] with connections secured as `security` says (TLS, SASL).
pub fn read_topic_with(bootstrap: &str, security: &crate::Security, topic: &str) -> Result<TopicContents> {
    let mut client = KafkaClient::connect_with(bootstrap, security)?;
    let partitions = client.partitions(topic)?;
    let bounds = client.bounds(topic, &partitions, false)?;
    let mut out = TopicContents::default();
    for p in partitions {
        let (mut next, end) = bounds[&p];
        // Per producer: its transaction's messages since its last marker.
        let mut undecided: HashMap<i64, Vec<Message>> = HashMap::new();
        while next < end {
            let fetched = client.fetch(topic, &[(p, next)], 100, 4 << 20, false)?;
            let mut last = next - 1;
            for part in fetched {
                batches(&part.records, |item| {
                    match item {
                        Item::Batch(info) => last = last.max(info.last_offset),
                        Item::Marker(info, marker) => {
                            last = last.max(info.last_offset);
                            let msgs = undecided.remove(&info.producer_id).unwrap_or_default();
                            match marker {
                                Some(Marker::Commit) => out.committed.extend(msgs),
                                _ => out.aborted += msgs.len(),
                            }
                        }
                        Item::Record(info, r) if r.offset >= next => {
                            let m = Message {
                                partition: p,
                                offset: r.offset,
                                key: r.key.map(<[u8]>::to_vec),
                                value: r.value.map(<[u8]>::to_vec),
                            };
                            if info.transactional {
                                undecided.entry(info.producer_id).or_default().push(m);
                            } else {
                                out.committed.push(m);
                            }
                        }
                        Item::Record(..) => {}
                    }
                    Ok(true)
                })?;
            }
            if last < next {
                break;
            }
            next = last + 1;
        }
        out.open += undecided.values().map(Vec::len).sum::<usize>();
    }
    out.committed.sort_by_key(|m| (m.partition, m.offset));
    Ok(out)
}
