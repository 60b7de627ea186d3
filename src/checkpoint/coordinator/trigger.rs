//! When the next checkpoint is due: the interval of the moment (the interval during backlog
//! while a source reports one), the minimum pause after a completion, a checkpoint asked for
//! now, the final checkpoint once every source is at its end, and configurations taking turns
//! checkpoint by checkpoint (the checkpoint lab). Time comes in as an argument.
//!
//! May touch: nothing outside `checkpoint` (its configuration).

use std::time::Duration;

use crate::checkpoint::CheckpointConfig;

pub(super) fn ns(d: Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128) as u64
}

/// The coordinator's trigger policy and what it remembers for it.
pub(super) struct TriggerPolicy {
    /// When the last checkpoint was triggered (the attempt's start before the first): the next
    /// is due an interval after it, the interval of the moment.
    last_trigger_ns: u64,
    last_completion_ns: Option<u64>,
    /// The final checkpoint, once triggered.
    final_id: Option<u64>,
    /// Configurations taking turns ([`crate::runtime::JobController::checkpoints_in_turn`])
    /// and how many turns were taken: none when one configuration holds.
    turns: Vec<CheckpointConfig>,
    turn: usize,
}

/// What the policy weighs at a tick besides the time and the configuration.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Moment {
    /// A source reports a backlog.
    pub(super) in_backlog: bool,
    /// A checkpoint was asked for now.
    pub(super) asked: bool,
    /// Another checkpoint may be in flight (fewer than the most concurrent, no savepoint).
    pub(super) room: bool,
    /// Every source is at the end of its input.
    pub(super) sources_at_end: bool,
}

impl TriggerPolicy {
    /// The policy of an attempt that starts at `now`.
    pub(super) fn new(now: u64) -> Self {
        TriggerPolicy { last_trigger_ns: now, last_completion_ns: None, final_id: None, turns: Vec::new(), turn: 0 }
    }

    /// The interval now: the one during backlog while a source reports one (`None` when that
    /// is zero: no checkpoints until the backlog is gone).
    pub(super) fn interval_ns(config: &CheckpointConfig, in_backlog: bool) -> Option<u64> {
        match config.interval_during_backlog {
            Some(during) if in_backlog => (!during.is_zero()).then(|| ns(during)),
            _ => Some(ns(config.interval)),
        }
    }

    /// When the next checkpoint is due, on the job clock (never, while a backlog pauses them).
    pub(super) fn next_trigger_ns(&self, config: &CheckpointConfig, in_backlog: bool) -> u64 {
        Self::interval_ns(config, in_backlog).map_or(u64::MAX, |i| self.last_trigger_ns.saturating_add(i))
    }

    /// Whether an ordinary checkpoint is due at `now`: asked for (neither the interval nor the
    /// minimum pause holds it back), or the interval passed and the pause too. None after the
    /// final one: a newer barrier would supersede the final one at a task that does not align
    /// (at-least-once: it then never acknowledges it), and if the newer ones failed too (a
    /// storm of them on slow storage) the job would wait out the final one's timeout.
    pub(super) fn due(&self, now: u64, config: &CheckpointConfig, m: Moment) -> bool {
        let paused = self.last_completion_ns.is_some_and(|t| now < t.saturating_add(ns(config.min_pause)));
        let time = now >= self.next_trigger_ns(config, m.in_backlog) && !paused;
        (m.asked || time) && m.room && self.final_id.is_none()
    }

    /// Whether the final checkpoint is due: once every source is at the end of its input it
    /// is taken at once (not after the interval).
    pub(super) fn final_due(&self, m: Moment) -> bool {
        m.sources_at_end && self.final_id.is_none() && m.room
    }

    /// The final checkpoint, once triggered.
    pub(super) fn final_id(&self) -> Option<u64> {
        self.final_id
    }

    /// Checkpoint `id`, triggered at `now`, is the final one when `is_final`.
    pub(super) fn triggered(&mut self, id: u64, now: u64, is_final: bool) {
        self.last_trigger_ns = now;
        if is_final {
            self.final_id = Some(id);
        }
    }

    /// Checkpoint `id` completed at `now`: whether everything before the end of input is
    /// committed with it.
    pub(super) fn completed(&mut self, id: u64, now: u64) -> bool {
        self.last_completion_ns = Some(now);
        self.final_id.is_some_and(|f| id >= f)
    }

    /// Configurations handed over: the first holds now, and several take turns from the next
    /// checkpoint on.
    pub(super) fn hand_over(&mut self, mut configs: Vec<CheckpointConfig>) -> CheckpointConfig {
        let first = configs[0].clone();
        if configs.len() == 1 {
            configs.clear();
        }
        (self.turns, self.turn) = (configs, 0);
        first
    }

    /// The configuration of the next checkpoint's turn, if configurations take turns.
    pub(super) fn next_turn(&mut self) -> Option<CheckpointConfig> {
        let config = self.turns.get(self.turn % self.turns.len().max(1))?.clone();
        self.turn += 1;
        Some(config)
    }

    /// Whether one of the configurations taking turns lets barriers overtake.
    pub(super) fn a_turn_overtakes(&self) -> bool {
        self.turns.iter().any(|c| c.mode.may_overtake())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::CheckpointMode;

    const MS: u64 = 1_000_000;

    #[test]
    fn the_interval_the_pause_and_a_request_decide_when() {
        let config =
            CheckpointConfig::new("/x").interval(Duration::from_millis(10)).min_pause(Duration::from_millis(8));
        let mut policy = TriggerPolicy::new(0);
        let room = Moment { room: true, ..Moment::default() };
        assert!(!policy.due(9 * MS, &config, room) && policy.due(10 * MS, &config, room));
        assert!(!policy.due(10 * MS, &config, Moment { room: false, ..room }), "no room");
        policy.triggered(1, 10 * MS, false);
        assert!(!policy.completed(1, 15 * MS), "not the final one");
        assert!(!policy.due(20 * MS, &config, room), "the pause after a completion holds");
        assert!(policy.due(23 * MS, &config, room));
        assert!(policy.due(16 * MS, &config, Moment { asked: true, ..room }), "asked for: at once");
        let backlog = CheckpointConfig { interval_during_backlog: Some(Duration::ZERO), ..config.clone() };
        assert_eq!(policy.next_trigger_ns(&backlog, true), u64::MAX, "none while the backlog lasts");
    }

    #[test]
    fn nothing_is_due_after_the_final_checkpoint() {
        let config = CheckpointConfig::new("/x").interval(Duration::from_millis(10));
        let mut policy = TriggerPolicy::new(0);
        let at_end = Moment { room: true, sources_at_end: true, ..Moment::default() };
        assert!(policy.final_due(at_end) && !policy.final_due(Moment { room: false, ..at_end }));
        policy.triggered(4, MS, true);
        assert_eq!(policy.final_id(), Some(4));
        assert!(!policy.final_due(at_end) && !policy.due(u64::MAX, &config, Moment { asked: true, ..at_end }));
        assert!(!policy.completed(3, 2 * MS) && policy.completed(4, 3 * MS));
    }

    #[test]
    fn configurations_take_turns_one_checkpoint_each() {
        let c = CheckpointConfig::new("/x");
        let mut policy = TriggerPolicy::new(0);
        let first =
            policy.hand_over(vec![c.clone().mode(CheckpointMode::Aligned), c.clone().mode(CheckpointMode::Unaligned)]);
        assert_eq!(first.mode, CheckpointMode::Aligned);
        assert!(policy.a_turn_overtakes());
        let modes: Vec<_> = (0..3).map(|_| policy.next_turn().unwrap().mode).collect();
        assert_eq!(modes, [CheckpointMode::Aligned, CheckpointMode::Unaligned, CheckpointMode::Aligned]);
        policy.hand_over(vec![c.mode(CheckpointMode::Aligned)]);
        assert!(policy.next_turn().is_none() && !policy.a_turn_overtakes(), "one configuration holds");
    }
}
