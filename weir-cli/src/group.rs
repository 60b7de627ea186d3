//! `weir wordcount --group`: one of several processes that let a Kafka consumer group share a
//! topic's partitions out. The process joins under its name (its checkpoint directory, so a
//! process started again from the same directory gets the same partitions), runs the job on
//! what it was handed, keeps its membership alive from a thread of its own, and commits the
//! offsets of every checkpoint whose output is committed to the group. When the group changes
//! it stops the job with a savepoint (its output committed), commits the offsets that
//! savepoint holds, and joins again: the partitions it gave up start elsewhere from exactly
//! there (Kafka's eager rebalance, with weir's checkpoints as the offsets' source of truth).
//!
//! May touch: `weir_kafka::group`, the job's handle.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use weir::JobHandle;
use weir_kafka::group::SESSION_TIMEOUT;
use weir_kafka::{Assignment, CompletedOffsets, ConsumerGroup, GroupState, KafkaUrl};

/// This process's membership of a consumer group while it runs its job.
pub(crate) struct GroupSession {
    group: String,
    member: Arc<Mutex<ConsumerGroup>>,
    /// Set by the heartbeat when the group changes; cleared by [`GroupSession::rejoin`].
    changing: Arc<AtomicBool>,
    quit: Arc<AtomicBool>,
    heart: Option<JoinHandle<()>>,
    /// Where the job's source records completed checkpoints' offsets.
    completed: CompletedOffsets,
    /// Offsets whose output is committed, not yet committed to the group.
    pending: BTreeMap<i32, i64>,
}

impl GroupSession {
    /// Joins `group` reading `topic` as the member called `name`, and keeps the membership
    /// alive from now on.
    pub(crate) fn join(
        topic: &KafkaUrl,
        security: &weir_kafka::Security,
        group: &str,
        name: &str,
    ) -> weir::Result<GroupSession> {
        let member = ConsumerGroup::join_with(&topic.bootstrap, security, group, &topic.topic, name)?;
        let member = Arc::new(Mutex::new(member));
        let (changing, quit) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let heart = {
            let (member, changing, quit) = (Arc::clone(&member), Arc::clone(&changing), Arc::clone(&quit));
            std::thread::Builder::new()
                .name("weir-group-heartbeat".into())
                .spawn(move || beat(&member, &changing, &quit))
                .map_err(|e| weir::Error::config(format!("cannot start the consumer group's heartbeat: {e}")))?
        };
        Ok(GroupSession {
            group: group.to_string(),
            member,
            changing,
            quit,
            heart: Some(heart),
            completed: CompletedOffsets::default(),
            pending: BTreeMap::new(),
        })
    }

    fn member(&self) -> std::sync::MutexGuard<'_, ConsumerGroup> {
        self.member.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The partitions the group handed this process now, where those its checkpoints lack
    /// start, and a fresh record of completed checkpoints' offsets for the job's source.
    pub(crate) fn assignment(&mut self) -> weir::Result<Assignment> {
        let mut member = self.member();
        let (partitions, committed) = (member.partitions().to_vec(), member.committed()?);
        eprintln!(
            "consumer group '{}' (generation {}): this process reads partitions {}",
            self.group,
            member.generation(),
            if partitions.is_empty() {
                "none (the group has more members than the topic has partitions)".to_string()
            } else {
                partitions.iter().map(i32::to_string).collect::<Vec<_>>().join(",")
            }
        );
        drop(member);
        self.completed = CompletedOffsets::default();
        Ok(Assignment { partitions, committed, completed: self.completed.clone() })
    }

    /// Called as the job runs: commits the offsets of the checkpoints whose output is
    /// committed, and says whether the job must stop and hand its partitions over (the group
    /// is changing, or Ctrl-C asked this member to leave).
    pub(crate) fn tick(&mut self, handle: &JobHandle) -> weir::Result<bool> {
        if let Some(applied) = handle.applied_checkpoint() {
            self.pending.extend(self.completed.take_until(applied));
            self.commit()?;
        }
        Ok(self.changing.load(Ordering::SeqCst) || weir_ops::supervisor::STOP_REQUESTS.load(Ordering::SeqCst) > 0)
    }

    /// After the job stopped (a savepoint's output committed, or it finished): commits every
    /// offset its source recorded.
    pub(crate) fn commit_all(&mut self) -> weir::Result<()> {
        self.pending.extend(self.completed.take_until(u64::MAX));
        self.commit()
    }

    fn commit(&mut self) -> weir::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let outcome = self.member().commit(&self.pending);
        match outcome {
            Ok(()) => {
                self.pending.clear();
                Ok(())
            }
            // The group moved on: the heartbeat says so too; the offsets go with the next try.
            Err(weir::Error::Fenced(_)) => {
                self.changing.store(true, Ordering::SeqCst);
                Ok(())
            }
            Err(e) if e.is_retryable() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Joins the group again after it changed: [`GroupSession::assignment`] then has this
    /// process's new partitions.
    pub(crate) fn rejoin(&mut self) -> weir::Result<()> {
        let mut member = self.member();
        member.rejoin()?;
        self.changing.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Leaves the group: the others take this process's partitions at once.
    pub(crate) fn leave(mut self) -> weir::Result<()> {
        self.stop_heart();
        let left = self.member().leave();
        left
    }

    fn stop_heart(&mut self) {
        self.quit.store(true, Ordering::SeqCst);
        if let Some(h) = self.heart.take() {
            h.thread().unpark();
            let _ = h.join();
        }
    }
}

impl Drop for GroupSession {
    fn drop(&mut self) {
        self.stop_heart();
    }
}

/// The heartbeat thread: a heartbeat every third of the session timeout, until `quit`.
fn beat(member: &Mutex<ConsumerGroup>, changing: &AtomicBool, quit: &AtomicBool) {
    let mut failing = false;
    while !quit.load(Ordering::SeqCst) {
        std::thread::park_timeout(SESSION_TIMEOUT / 3);
        if quit.load(Ordering::SeqCst) {
            return;
        }
        // Under the lock: a rejoin in between cannot be undone by an older generation's answer.
        let mut m = member.lock().unwrap_or_else(|e| e.into_inner());
        match m.heartbeat() {
            Ok(GroupState::Changing) => changing.store(true, Ordering::SeqCst),
            Ok(GroupState::Stable) => failing = false,
            Err(e) => {
                if !failing {
                    eprintln!("the consumer group's heartbeat failed (trying again): {e}");
                }
                failing = true;
            }
        }
    }
}

/// The name this process joins under: its checkpoint directory, as given.
pub(crate) fn member_name(checkpoint_dir: &std::path::Path) -> String {
    checkpoint_dir.to_string_lossy().into_owned()
}
