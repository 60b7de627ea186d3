//! The requests from outside the coordinator: savepoints, checkpoints asked for now (Flink's
//! `flink checkpoint`), and configurations changed on the running job; who waits for which
//! checkpoint's fate, and the answers they get. It owns the reply channels and the handed-over
//! configurations, nothing else: the coordinator decides when a request is triggered, refused
//! or answered.
//!
//! May touch: nothing outside `checkpoint` (its configuration, handed over by the job's
//! handle; the coordinator's request types).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use super::{CoordinatorRequest, Reply, RequestRefused, SavepointRequest};
use crate::checkpoint::CheckpointConfig;

/// The requests waiting to be triggered, and the askers waiting for a checkpoint's fate.
pub(super) struct OutsideRequests {
    /// A configuration changed on the running job (the handle writes it), taken at the next
    /// tick: it applies to the checkpoints triggered from then on. Several take turns.
    update: Arc<Mutex<Option<Vec<CheckpointConfig>>>>,
    /// Savepoints asked for and not yet triggered.
    savepoints: VecDeque<SavepointRequest>,
    /// The request of a savepoint whose checkpoint left the pending ones (it completed or
    /// failed) and that is not answered yet: answered with its checkpoint's fate, in words.
    unanswered: Option<(u64, SavepointRequest)>,
    /// Checkpoints asked for now, not yet triggered.
    asked: Vec<Reply<u64>>,
    /// One of them was asked for in full.
    full: bool,
    /// Who asked for checkpoints that left the pending ones, by checkpoint: answered with its
    /// fate.
    awaiting: HashMap<u64, Vec<Reply<u64>>>,
}

impl OutsideRequests {
    pub(super) fn new(update: Arc<Mutex<Option<Vec<CheckpointConfig>>>>) -> Self {
        OutsideRequests {
            update,
            savepoints: VecDeque::new(),
            unanswered: None,
            asked: Vec::new(),
            full: false,
            awaiting: HashMap::new(),
        }
    }

    /// Takes a request: it waits for the coordinator's next trigger.
    pub(super) fn take(&mut self, request: CoordinatorRequest) {
        match request {
            CoordinatorRequest::Savepoint(r) => self.savepoints.push_back(r),
            CoordinatorRequest::Checkpoint { reply, full } => {
                self.asked.push(reply);
                self.full |= full;
            }
        }
    }

    /// The configurations handed over since the last call, if any (several take turns).
    pub(super) fn take_update(&self) -> Option<Vec<CheckpointConfig>> {
        self.update.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Tells everyone waiting for a savepoint or a checkpoint now that none can be taken.
    pub(super) fn refuse_all(&mut self, why: &str) {
        for req in self.savepoints.drain(..) {
            let _ = req.reply.send(Err(RequestRefused::NotTaken(why.to_string())));
        }
        for reply in self.asked.drain(..) {
            let _ = reply.send(Err(RequestRefused::NotTaken(why.to_string())));
        }
    }

    /// The oldest savepoint asked for, to trigger now.
    pub(super) fn next_savepoint(&mut self) -> Option<SavepointRequest> {
        self.savepoints.pop_front()
    }

    /// Whether a checkpoint was asked for now.
    pub(super) fn checkpoint_asked(&self) -> bool {
        !self.asked.is_empty()
    }

    /// Whether one asked for a full checkpoint (the next one triggered is).
    pub(super) fn take_full(&mut self) -> bool {
        std::mem::take(&mut self.full)
    }

    /// Whoever asked for a checkpoint now: the one triggered is theirs.
    pub(super) fn take_asked(&mut self) -> Vec<Reply<u64>> {
        std::mem::take(&mut self.asked)
    }

    /// Checkpoint `id` left the pending ones: its savepoint request and askers wait here for
    /// its fate.
    pub(super) fn await_fate(&mut self, id: u64, savepoint: Option<SavepointRequest>, asked: Vec<Reply<u64>>) {
        if let Some(req) = savepoint {
            self.unanswered = Some((id, req));
        }
        if !asked.is_empty() {
            self.awaiting.insert(id, asked);
        }
    }

    /// Tells whoever waits for checkpoint `id` (a savepoint, a checkpoint now) why it failed.
    pub(super) fn answer_failed(&mut self, id: u64, reason: &str) {
        for reply in self.awaiting.remove(&id).unwrap_or_default() {
            let _ = reply.send(Err(RequestRefused::Failed { checkpoint: id, reason: reason.to_string() }));
        }
        if let Some((_, req)) = self.unanswered.take_if(|(i, _)| *i == id) {
            let _ = req.reply.send(Err(RequestRefused::SavepointFailed { checkpoint: id, reason: reason.to_string() }));
        }
    }

    /// The savepoint request of checkpoint `id`, which completed: the coordinator copies it
    /// and answers.
    pub(super) fn completed_savepoint(&mut self, id: u64) -> Option<SavepointRequest> {
        self.unanswered.take_if(|(i, _)| *i == id).map(|(_, req)| req)
    }

    /// Tells whoever asked for checkpoint `id` now that it completed.
    pub(super) fn answer_completed(&mut self, id: u64) {
        for reply in self.awaiting.remove(&id).unwrap_or_default() {
            let _ = reply.send(Ok(id));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::mpsc::channel;

    use super::*;

    fn savepoint(requests: &mut OutsideRequests) -> std::sync::mpsc::Receiver<Result<(u64, PathBuf), RequestRefused>> {
        let (reply, answer) = channel();
        requests.take(CoordinatorRequest::Savepoint(SavepointRequest { dir: "/sp".into(), reply, stop: false }));
        answer
    }

    #[test]
    fn a_refusal_reaches_every_asker_in_the_same_words() {
        let mut requests = OutsideRequests::new(Arc::default());
        let sp = savepoint(&mut requests);
        let (reply, now) = channel();
        requests.take(CoordinatorRequest::Checkpoint { reply, full: true });
        assert!(requests.checkpoint_asked() && requests.take_full() && !requests.take_full());
        requests.refuse_all("the job is stopping");
        let said = RequestRefused::NotTaken("the job is stopping".into());
        assert_eq!(sp.recv().unwrap(), Err(said.clone()));
        assert_eq!(now.recv().unwrap(), Err(said));
        assert!(requests.next_savepoint().is_none() && !requests.checkpoint_asked());
    }

    #[test]
    fn askers_hear_their_checkpoints_fate_and_an_expired_savepoint_says_what_to_do() {
        let mut requests = OutsideRequests::new(Arc::default());
        let sp = savepoint(&mut requests);
        let (reply, now) = channel();
        requests.take(CoordinatorRequest::Checkpoint { reply, full: false });
        let req = requests.next_savepoint().unwrap();
        requests.await_fate(7, Some(req), Vec::new());
        let asked = requests.take_asked();
        requests.await_fate(8, None, asked);
        requests.answer_failed(7, "expired after 1s");
        let e = sp.recv().unwrap().unwrap_err().to_string();
        assert!(e.starts_with("its checkpoint (7) failed: expired") && e.contains("--savepoint-timeout-ms"), "{e}");
        requests.answer_failed(7, "again");
        assert!(sp.try_recv().is_err(), "answered once");
        assert!(requests.completed_savepoint(8).is_none());
        requests.answer_completed(8);
        assert_eq!(now.recv().unwrap(), Ok(8));
    }

    #[test]
    fn a_handed_over_configuration_is_taken_once() {
        let update = Arc::default();
        let requests = OutsideRequests::new(Arc::clone(&update));
        *update.lock().unwrap() = Some(vec![CheckpointConfig::new("/x")]);
        assert_eq!(requests.take_update().map(|c| c.len()), Some(1));
        assert!(requests.take_update().is_none());
    }
}
