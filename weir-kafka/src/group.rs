//! Membership of a Kafka consumer group, for weir processes that share a topic's partitions
//! without being told which: the group's coordinator (on a broker) keeps the members, and the
//! member it elects leader hands out the partitions. Kafka's classic ("eager") protocol:
//! JoinGroup, SyncGroup, Heartbeat, LeaveGroup, and OffsetCommit/OffsetFetch for the offsets a
//! member hands over.
//!
//! The assignment is a function of the members' *names* (each process names itself, weir's
//! CLI by its checkpoint directory), not of the member ids the coordinator makes up: a process
//! that is killed and started again under its name gets the partitions its checkpoints hold.
//! Partitions go to members in contiguous ranges (Kafka's range assignor), so that a member's
//! partitions spread evenly over its source subtasks.
//!
//! What a member must do when the group changes (stop with its offsets committed before it
//! joins again) is the caller's: [`ConsumerGroup::heartbeat`] says when.
//!
//! May touch: `client`, `wire`, `error`, `security`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition as AssignedPartitions;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::{
    ConsumerProtocolAssignment, ConsumerProtocolSubscription, GroupId, HeartbeatRequest, JoinGroupRequest,
    LeaveGroupRequest, OffsetCommitRequest, OffsetFetchRequest, SyncGroupRequest, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, Message, StrBytes};
use kafka_protocol::ResponseError;
use weir::{Error, Result};

use crate::client::KafkaClient;

/// How long the coordinator waits for a heartbeat before it drops a member (and gives its
/// partitions to the others).
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the coordinator waits for every member to join again when the group changes (a
/// JoinGroup is answered when they have, so it must stay below the connection's timeout).
const REBALANCE_TIMEOUT: Duration = Duration::from_secs(20);

/// The assignment protocol's name: every member must speak the same one.
const PROTOCOL: &str = "weir-range";

fn text(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

fn encode_versioned<M: Encodable>(message: &M, version: i16) -> Result<Bytes> {
    let mut buf = BytesMut::new();
    buf.extend_from_slice(&version.to_be_bytes());
    message.encode(&mut buf, version).map_err(|e| Error::config(format!("cannot encode a group message: {e}")))?;
    Ok(buf.freeze())
}

fn decode_versioned<M: Decodable + Message>(bytes: &Bytes, what: &str) -> Result<M> {
    let mut b = bytes.clone();
    let bad = |e: String| Error::Io {
        context: format!("a consumer group member sent a {what} this client cannot read: {e}"),
        path: None,
        source: std::io::Error::from(std::io::ErrorKind::InvalidData),
    };
    if b.len() < 2 {
        return Err(bad("too short".into()));
    }
    let version = i16::from_be_bytes([b[0], b[1]]);
    let mut b = b.split_off(2);
    // A newer version only adds fields after the ones this client reads.
    M::decode(&mut b, version.clamp(M::VERSIONS.min, M::VERSIONS.max)).map_err(|e| bad(e.to_string()))
}

/// Which partitions of `partitions` each member gets: members sorted by (name, member id),
/// each a contiguous range, the first ones one more when they do not divide evenly.
pub fn assign(partitions: &[i32], members: &[(String, String)]) -> Vec<(String, Vec<i32>)> {
    let mut sorted: Vec<&(String, String)> = members.iter().collect();
    sorted.sort();
    let mut all = partitions.to_vec();
    all.sort_unstable();
    let (n, m) = (all.len(), sorted.len().max(1));
    let mut at = 0;
    sorted
        .iter()
        .enumerate()
        .map(|(i, (_, id))| {
            let take = n / m + usize::from(i < n % m);
            let range = all[at..at + take].to_vec();
            at += take;
            (id.clone(), range)
        })
        .collect()
}

/// What a heartbeat learned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupState {
    /// The group is as it was: keep reading the partitions.
    Stable,
    /// The group is changing (a member joined or left, or this one was dropped): stop reading,
    /// commit the offsets, and [`ConsumerGroup::rejoin`].
    Changing,
}

/// This process's membership of a consumer group reading one topic.
pub struct ConsumerGroup {
    client: KafkaClient,
    group: String,
    topic: String,
    name: String,
    member_id: String,
    generation: i32,
    partitions: Vec<i32>,
}

impl std::fmt::Debug for ConsumerGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerGroup")
            .field("group", &self.group)
            .field("topic", &self.topic)
            .field("name", &self.name)
            .field("generation", &self.generation)
            .field("partitions", &self.partitions)
            .finish_non_exhaustive()
    }
}

impl ConsumerGroup {
    /// Joins consumer group `group` through broker `bootstrap` as the member called `name`,
    /// reading `topic`; returns once the group has handed this member its partitions (which
    /// waits for the other members to join too).
    pub fn join(bootstrap: &str, group: &str, topic: &str, name: &str) -> Result<ConsumerGroup> {
        ConsumerGroup::join_with(bootstrap, &crate::Security::plaintext(), group, topic, name)
    }

    /// [`ConsumerGroup::join`] with connections secured as `security` says (TLS, SASL).
    pub fn join_with(
        bootstrap: &str,
        security: &crate::Security,
        group: &str,
        topic: &str,
        name: &str,
    ) -> Result<ConsumerGroup> {
        if group.is_empty() {
            return Err(Error::config("a consumer group needs a name"));
        }
        let mut client = KafkaClient::connect_with(bootstrap, security)?;
        // A missing topic is named now, not as an empty assignment.
        client.partitions(topic)?;
        let mut me = ConsumerGroup {
            client,
            group: group.to_string(),
            topic: topic.to_string(),
            name: name.to_string(),
            member_id: String::new(),
            generation: -1,
            partitions: Vec::new(),
        };
        me.rejoin()?;
        Ok(me)
    }

    /// The partitions the group handed this member.
    pub fn partitions(&self) -> &[i32] {
        &self.partitions
    }

    /// The group's generation this member's partitions belong to.
    pub fn generation(&self) -> i32 {
        self.generation
    }

    /// Joins again (after [`GroupState::Changing`]): the group's new generation, and this
    /// member's partitions in it.
    pub fn rejoin(&mut self) -> Result<()> {
        let subscription = ConsumerProtocolSubscription::default()
            .with_topics(vec![text(&self.topic)])
            .with_user_data(Some(Bytes::from(self.name.clone().into_bytes())));
        let metadata = encode_versioned(&subscription, 0)?;
        // The coordinator may ask for the member id it made up first (JoinGroup v4 and on), or
        // forget one this member had (dropped while it was away): join again with what it says.
        // A leader that never hands the assignment out (it died as it was elected) holds the
        // others until its session times out and the group changes again: keep joining until
        // then.
        let until = std::time::Instant::now() + SESSION_TIMEOUT + REBALANCE_TIMEOUT * 2;
        while std::time::Instant::now() < until {
            let group = self.group.clone();
            let (member_id, metadata) = (self.member_id.clone(), metadata.clone());
            let joined = self.client.retrying(
                "JoinGroup",
                |c| c.group_coordinator(&group),
                |c| {
                    let request = JoinGroupRequest::default()
                        .with_group_id(GroupId(text(&group)))
                        .with_session_timeout_ms(SESSION_TIMEOUT.as_millis() as i32)
                        .with_rebalance_timeout_ms(REBALANCE_TIMEOUT.as_millis() as i32)
                        .with_member_id(text(&member_id))
                        .with_protocol_type(text("consumer"))
                        .with_protocols(vec![JoinGroupRequestProtocol::default()
                            .with_name(text(PROTOCOL))
                            .with_metadata(metadata.clone())]);
                    let r = c.call(&request)?;
                    let code = r.error_code;
                    let renewed =
                        code == ResponseError::MemberIdRequired.code() || code == ResponseError::UnknownMemberId.code();
                    Ok(if code == 0 || renewed { Ok((code, r)) } else { Err(code) })
                },
            )?;
            let (code, response) = joined;
            if code == ResponseError::UnknownMemberId.code() {
                self.member_id.clear();
                continue;
            }
            self.member_id = response.member_id.to_string();
            if code == ResponseError::MemberIdRequired.code() {
                continue;
            }
            self.generation = response.generation_id;
            let leader = response.leader.as_str() == response.member_id.as_str();
            let assignments = if leader { self.plan(&response.members)? } else { Vec::new() };
            match self.sync(assignments)? {
                Some(partitions) => {
                    self.partitions = partitions;
                    return Ok(());
                }
                // The group changed again while it synced: join once more.
                None => std::thread::sleep(Duration::from_millis(100)),
            }
        }
        Err(Error::Io {
            context: format!(
                "could not join Kafka consumer group '{}': the group kept changing while this member joined",
                self.group
            ),
            path: None,
            source: std::io::Error::from(std::io::ErrorKind::TimedOut),
        })
    }

    /// The leader's work: every member's partitions, by the members' names.
    fn plan(
        &mut self,
        members: &[kafka_protocol::messages::join_group_response::JoinGroupResponseMember],
    ) -> Result<Vec<SyncGroupRequestAssignment>> {
        let mut named = Vec::new();
        for m in members {
            let s: ConsumerProtocolSubscription = decode_versioned(&m.metadata, "subscription")?;
            if s.topics.iter().any(|t| t.as_str() != self.topic) {
                return Err(Error::config(format!(
                    "consumer group '{}' has a member that reads other topics than '{}': one group, one topic",
                    self.group, self.topic
                )));
            }
            let name = s.user_data.map(|d| String::from_utf8_lossy(&d).into_owned()).unwrap_or_default();
            named.push((name, m.member_id.to_string()));
        }
        let partitions = self.client.partitions(&self.topic)?;
        let topic = self.topic.clone();
        assign(&partitions, &named)
            .into_iter()
            .map(|(member, parts)| {
                let assignment =
                    ConsumerProtocolAssignment::default().with_assigned_partitions(vec![AssignedPartitions::default()
                        .with_topic(TopicName(text(&topic)))
                        .with_partitions(parts)]);
                Ok(SyncGroupRequestAssignment::default()
                    .with_member_id(text(&member))
                    .with_assignment(encode_versioned(&assignment, 0)?))
            })
            .collect()
    }

    /// Sends this member's SyncGroup (the leader's with everyone's assignment); returns its
    /// partitions, or `None` if the group began changing again meanwhile.
    fn sync(&mut self, assignments: Vec<SyncGroupRequestAssignment>) -> Result<Option<Vec<i32>>> {
        let (group, member_id, generation) = (self.group.clone(), self.member_id.clone(), self.generation);
        let answer = self.client.retrying(
            "SyncGroup",
            |c| c.group_coordinator(&group),
            |c| {
                let request = SyncGroupRequest::default()
                    .with_group_id(GroupId(text(&group)))
                    .with_generation_id(generation)
                    .with_member_id(text(&member_id))
                    .with_protocol_type(Some(text("consumer")))
                    .with_protocol_name(Some(text(PROTOCOL)))
                    .with_assignments(assignments.clone());
                let r = c.call(&request)?;
                Ok(match r.error_code {
                    0 => Ok(Some(r.assignment)),
                    code if changing(code) => Ok(None),
                    code => Err(code),
                })
            },
        )?;
        let Some(bytes) = answer else { return Ok(None) };
        if bytes.is_empty() {
            return Ok(Some(Vec::new()));
        }
        let assignment: ConsumerProtocolAssignment = decode_versioned(&bytes, "assignment")?;
        let mut mine: Vec<i32> = assignment
            .assigned_partitions
            .into_iter()
            .filter(|t| t.topic.0.as_str() == self.topic)
            .flat_map(|t| t.partitions)
            .collect();
        mine.sort_unstable();
        Ok(Some(mine))
    }

    /// Tells the coordinator this member is alive (at least every third of
    /// [`SESSION_TIMEOUT`]), and learns whether the group is changing.
    pub fn heartbeat(&mut self) -> Result<GroupState> {
        let (group, member_id, generation) = (self.group.clone(), self.member_id.clone(), self.generation);
        self.client.retrying(
            "Heartbeat",
            |c| c.group_coordinator(&group),
            |c| {
                let request = HeartbeatRequest::default()
                    .with_group_id(GroupId(text(&group)))
                    .with_generation_id(generation)
                    .with_member_id(text(&member_id));
                let r = c.call(&request)?;
                Ok(match r.error_code {
                    0 => Ok(GroupState::Stable),
                    code if changing(code) => Ok(GroupState::Changing),
                    code => Err(code),
                })
            },
        )
    }

    /// The offsets the group has for this member's partitions (the next offset to read), for
    /// those it has any.
    pub fn committed(&mut self) -> Result<HashMap<i32, i64>> {
        committed_offsets(&mut self.client, &self.group, &self.topic, &self.partitions)
    }

    /// Commits `offsets` (partition → the next offset to read) for this member's generation.
    /// A member the group dropped meanwhile is refused ([`Error::Fenced`]): its partitions may
    /// be another's now.
    pub fn commit(&mut self, offsets: &BTreeMap<i32, i64>) -> Result<()> {
        if offsets.is_empty() {
            return Ok(());
        }
        let (group, topic, member_id, generation) =
            (self.group.clone(), self.topic.clone(), self.member_id.clone(), self.generation);
        let result = self.client.retrying(
            "OffsetCommit",
            |c| c.group_coordinator(&group),
            |c| {
                let partitions = offsets
                    .iter()
                    .map(|(&p, &o)| {
                        OffsetCommitRequestPartition::default()
                            .with_partition_index(p)
                            .with_committed_offset(o)
                            .with_committed_leader_epoch(-1)
                    })
                    .collect();
                let request = OffsetCommitRequest::default()
                    .with_group_id(GroupId(text(&group)))
                    .with_generation_id_or_member_epoch(generation)
                    .with_member_id(text(&member_id))
                    .with_retention_time_ms(-1)
                    .with_topics(vec![OffsetCommitRequestTopic::default()
                        .with_name(TopicName(text(&topic)))
                        .with_partitions(partitions)]);
                let r = c.call(&request)?;
                let code = r.topics.iter().flat_map(|t| t.partitions.iter()).map(|p| p.error_code).find(|&c| c != 0);
                Ok(match code {
                    None => Ok(Ok(())),
                    Some(code) if changing(code) => Ok(Err(code)),
                    Some(code) => Err(code),
                })
            },
        )?;
        result.map_err(|code| {
            Error::Fenced(format!(
                "Kafka consumer group '{}' refused this member's offsets ({:?}): the group moved on to another \
                 generation, and its partitions may be another member's now",
                self.group,
                ResponseError::try_from_code(code).unwrap_or(ResponseError::Unknown(code))
            ))
        })
    }

    /// Leaves the group now (the others get this member's partitions at once, not after
    /// [`SESSION_TIMEOUT`]).
    pub fn leave(&mut self) -> Result<()> {
        let (group, member_id) = (self.group.clone(), self.member_id.clone());
        self.client.retrying(
            "LeaveGroup",
            |c| c.group_coordinator(&group),
            |c| {
                let request = LeaveGroupRequest::default()
                    .with_group_id(GroupId(text(&group)))
                    .with_members(vec![MemberIdentity::default().with_member_id(text(&member_id))]);
                let r = c.call(&request)?;
                Ok(match r.error_code {
                    0 => Ok(()),
                    code if changing(code) => Ok(()),
                    code => Err(code),
                })
            },
        )
    }
}

/// The offsets consumer group `group` has committed for `partitions` of `topic` (the next
/// offset to read), for those it has any. Asking needs no membership: a monitor may.
pub fn committed_offsets(
    client: &mut KafkaClient,
    group: &str,
    topic: &str,
    partitions: &[i32],
) -> Result<HashMap<i32, i64>> {
    if partitions.is_empty() {
        return Ok(HashMap::new());
    }
    client.retrying(
        "OffsetFetch",
        |c| c.group_coordinator(group),
        |c| {
            let request = OffsetFetchRequest::default().with_group_id(GroupId(text(group))).with_topics(Some(vec![
                OffsetFetchRequestTopic::default()
                    .with_name(TopicName(text(topic)))
                    .with_partition_indexes(partitions.to_vec()),
            ]));
            let r = c.call(&request)?;
            if r.error_code != 0 {
                return Ok(Err(r.error_code));
            }
            let mut found = HashMap::new();
            for p in r.topics.iter().filter(|t| t.name.0.as_str() == topic).flat_map(|t| t.partitions.iter()) {
                if p.error_code != 0 {
                    return Ok(Err(p.error_code));
                }
                if p.committed_offset >= 0 {
                    found.insert(p.partition_index, p.committed_offset);
                }
            }
            Ok(Ok(found))
        },
    )
}

/// Whether error `code` means the group moved on (a rebalance, or this member dropped).
fn changing(code: i16) -> bool {
    [ResponseError::RebalanceInProgress, ResponseError::IllegalGeneration, ResponseError::UnknownMemberId]
        .iter()
        .any(|e| e.code() == code)
}

/// The offsets of completed checkpoints as a Kafka source's subtasks learn them, shared with
/// whoever commits them to a consumer group: per checkpoint, partition → next offset to read.
/// Only a checkpoint whose completion every task applied (its output committed) may be
/// committed to the group: [`CompletedOffsets::take_until`].
#[derive(Clone, Debug, Default)]
pub struct CompletedOffsets(Arc<Mutex<BTreeMap<u64, BTreeMap<i32, i64>>>>);

impl CompletedOffsets {
    /// A source subtask learned that checkpoint `id` completed with it at `offsets`.
    pub(crate) fn record(&self, id: u64, offsets: impl IntoIterator<Item = (i32, i64)>) {
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        all.entry(id).or_default().extend(offsets);
    }

    /// The offsets every subtask recorded up to checkpoint `id` (the newest for each
    /// partition), forgetting those checkpoints.
    pub fn take_until(&self, id: u64) -> BTreeMap<i32, i64> {
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let later = all.split_off(&id.saturating_add(1));
        let upto = std::mem::replace(&mut *all, later);
        let mut merged = BTreeMap::new();
        for offsets in upto.into_values() {
            merged.extend(offsets);
        }
        merged
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_follow_names_not_member_ids() {
        let parts = [0, 1, 2, 3, 4];
        let members = vec![("b".to_string(), "id-1".to_string()), ("a".to_string(), "id-2".to_string())];
        let got = assign(&parts, &members);
        assert_eq!(got, vec![("id-2".to_string(), vec![0, 1, 2]), ("id-1".to_string(), vec![3, 4])]);
        // The same names with other member ids: the same partitions per name.
        let again = vec![("a".to_string(), "x".to_string()), ("b".to_string(), "y".to_string())];
        assert_eq!(assign(&parts, &again), vec![("x".to_string(), vec![0, 1, 2]), ("y".to_string(), vec![3, 4])]);
        // More members than partitions: the last ones get none.
        let many: Vec<(String, String)> = (0..7).map(|i| (format!("m{i}"), format!("id{i}"))).collect();
        let got = assign(&parts, &many);
        assert_eq!(got.iter().map(|(_, p)| p.len()).sum::<usize>(), 5);
        assert!(got[5].1.is_empty() && got[6].1.is_empty());
    }

    #[test]
    fn completed_offsets_merge_subtasks_and_keep_later_checkpoints() {
        let c = CompletedOffsets::default();
        c.record(1, [(0, 10)]);
        c.record(1, [(1, 20)]);
        c.record(2, [(0, 15)]);
        c.record(3, [(0, 30), (1, 40)]);
        assert_eq!(c.take_until(2), BTreeMap::from([(0, 15), (1, 20)]));
        assert_eq!(c.take_until(2), BTreeMap::new());
        assert_eq!(c.take_until(3), BTreeMap::from([(0, 30), (1, 40)]));
    }
}
