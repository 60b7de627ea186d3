//! [`CheckpointMode`] and its kind [`ModeKind`]: how a checkpoint's barriers go, and the one
//! resolver ([`CheckpointMode::from_flat`]) from the keys an edge was given to a mode. Here,
//! in the vocabulary, so that the coordinator, the statistics and every edge name the mode
//! itself rather than its parts.
//!
//! May touch: `error`.

use std::time::Duration;

use crate::error::{Error, Result};

/// The aligned-checkpoint timeout of `aligned-timeout` unless told otherwise.
pub const DEFAULT_ALIGNMENT_TIMEOUT: Duration = Duration::from_millis(10);

/// The in-flight budget of `adaptive` unless told otherwise: 1 MiB (a command fits it to
/// half of what the job's rings hold where that is less: `Job::default_inflight_budget`).
pub const DEFAULT_INFLIGHT_BUDGET: u64 = 1 << 20;

/// How a checkpoint's barriers go, and the guarantee that gives: one value, so no combination
/// that does not work can be written (Flink's flat keys, `mode`, `unaligned`,
/// `aligned-checkpoint-timeout` and an in-flight budget, parse into it with
/// [`CheckpointMode::from_flat`]).
///
/// ```
/// use std::time::Duration;
/// use weir::checkpoint::{CheckpointConfig, CheckpointMode};
/// let c = CheckpointConfig::new("/tmp/chk")
///     .mode(CheckpointMode::AlignedTimeout { timeout: Duration::from_millis(10) });
/// assert!(c.mode.exactly_once() && c.mode.kind().name() == "aligned-timeout");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckpointMode {
    /// Exactly-once, barriers aligned: a task with several inputs snapshots only once every
    /// input delivered the barrier, reading none past it meanwhile. After recovery, results
    /// are as if no failure happened.
    Aligned,
    /// Exactly-once, unaligned: barriers overtake the data in flight, which is stored with the
    /// checkpoint instead (Flink's unaligned checkpoints).
    Unaligned,
    /// Exactly-once: barriers start aligned and turn unaligned at a task that has waited
    /// `timeout` for alignment (Flink's `aligned-checkpoint-timeout`).
    AlignedTimeout {
        /// How long a task aligns before its barriers overtake.
        timeout: Duration,
    },
    /// Exactly-once, adaptive alignment: barriers overtake through the priority slots as
    /// unaligned ones do, and at each task the snapshot waits while a channel holds more ahead
    /// of its barrier than its share of `budget` bytes, working that channel down; then it
    /// captures what every channel still holds. A channel that drains quickly is aligned, one
    /// that lags is captured: about as quick as unaligned with far less in-flight data.
    Adaptive {
        /// A checkpoint's in-flight data, at most, shared evenly by the job's input channels.
        budget: u64,
    },
    /// At-least-once: barriers are only counted, never aligned; records read after an early
    /// barrier may be processed again after recovery. Nothing is lost.
    AtLeastOnce,
}

impl CheckpointMode {
    /// Whether results after a recovery are as if no failure happened.
    pub fn exactly_once(self) -> bool {
        self != CheckpointMode::AtLeastOnce
    }

    /// Whether barriers may overtake in-flight data (the job's rings then carry priority
    /// slots, and tasks capture what the barriers overtook).
    pub fn may_overtake(self) -> bool {
        matches!(
            self,
            CheckpointMode::Unaligned | CheckpointMode::AlignedTimeout { .. } | CheckpointMode::Adaptive { .. }
        )
    }

    /// Whether barriers overtake from the start (not only after a timeout).
    pub fn overtakes_at_once(self) -> bool {
        matches!(self, CheckpointMode::Unaligned | CheckpointMode::Adaptive { .. })
    }

    /// The aligned-checkpoint timeout, for [`CheckpointMode::AlignedTimeout`].
    pub fn alignment_timeout(self) -> Option<Duration> {
        match self {
            CheckpointMode::AlignedTimeout { timeout } => Some(timeout),
            _ => None,
        }
    }

    /// The in-flight budget, for [`CheckpointMode::Adaptive`].
    pub fn inflight_budget(self) -> Option<u64> {
        match self {
            CheckpointMode::Adaptive { budget } => Some(budget),
            _ => None,
        }
    }

    /// Which of the five it is, without its parameter.
    pub fn kind(self) -> ModeKind {
        match self {
            CheckpointMode::Aligned => ModeKind::Aligned,
            CheckpointMode::Unaligned => ModeKind::Unaligned,
            CheckpointMode::AlignedTimeout { .. } => ModeKind::AlignedTimeout,
            CheckpointMode::Adaptive { .. } => ModeKind::Adaptive,
            CheckpointMode::AtLeastOnce => ModeKind::AtLeastOnce,
        }
    }

    /// The mode the keys an edge was given name: weir's one word (with the parameter its
    /// kind takes), Flink's flat keys (`mode`, `unaligned`, an aligned-checkpoint timeout, an
    /// in-flight budget), or both where they agree. The only place the rules of a mode's keys
    /// are written: the command's flags, a configuration file, the control endpoint's live
    /// keys, the simulator and the benchmarks all come here, so a refusal says the same
    /// words wherever the keys came from, and a new mode is its variant and what the
    /// compiler points at.
    ///
    /// ```
    /// use std::time::Duration;
    /// use weir::checkpoint::{CheckpointMode, ModeKeys, ModeKind};
    /// let t = Some(Duration::from_millis(5));
    /// let flat = ModeKeys { unaligned: Some(true), timeout: t, ..ModeKeys::default() };
    /// assert_eq!(CheckpointMode::from_flat(flat).unwrap(), CheckpointMode::AlignedTimeout { timeout: t.unwrap() });
    /// let word = ModeKeys { kind: Some(ModeKind::Aligned), timeout: t, ..ModeKeys::default() };
    /// assert!(CheckpointMode::from_flat(word).unwrap_err().to_string().contains("is for checkpoint mode aligned-timeout"));
    /// let eo = ModeKeys { exactly_once: Some(false), unaligned: Some(true), ..ModeKeys::default() };
    /// assert!(CheckpointMode::from_flat(eo).unwrap_err().to_string().contains("at-least-once never aligns"));
    /// ```
    pub fn from_flat(keys: ModeKeys) -> Result<CheckpointMode> {
        let mode = match keys.kind {
            Some(kind) => Self::from_word(kind, keys)?,
            None => Self::from_parts(keys)?,
        };
        mode.check()?;
        Ok(mode)
    }

    /// `kind` with the flat keys given beside it: each must say what the word says.
    fn from_word(kind: ModeKind, keys: ModeKeys) -> Result<CheckpointMode> {
        let guarantee = |eo: bool| if eo { "exactly-once" } else { "at-least-once" };
        if let Some(eo) = keys.exactly_once.filter(|eo| *eo != kind.exactly_once()) {
            return Err(Error::config(format!(
                "checkpoint mode {kind} and mode {} disagree: give one of them",
                guarantee(eo)
            )));
        }
        let mode = kind
            .with(keys.timeout.unwrap_or(DEFAULT_ALIGNMENT_TIMEOUT), keys.budget.unwrap_or(DEFAULT_INFLIGHT_BUDGET));
        if let Some(u) = keys.unaligned.filter(|u| *u != mode.may_overtake()) {
            return Err(Error::config(format!("checkpoint mode {kind} and unaligned={u} disagree: give one of them")));
        }
        if keys.timeout.is_some() && kind != ModeKind::AlignedTimeout {
            return Err(Error::config(format!(
                "an aligned-checkpoint timeout is for checkpoint mode aligned-timeout, not {kind}"
            )));
        }
        if keys.budget.is_some() && kind != ModeKind::Adaptive {
            return Err(Error::config(format!("an in-flight budget is for checkpoint mode adaptive, not {kind}")));
        }
        Ok(mode)
    }

    /// Flink's flat keys alone: exactly-once and aligned unless told otherwise.
    fn from_parts(keys: ModeKeys) -> Result<CheckpointMode> {
        let never_aligns = "at-least-once never aligns";
        let exactly_once = keys.exactly_once.unwrap_or(true);
        let unaligned = keys.unaligned.unwrap_or(false);
        let refused = |why: String| Err(Error::config(why));
        match (exactly_once, unaligned, keys.timeout, keys.budget) {
            (false, false, None, None) => Ok(CheckpointMode::AtLeastOnce),
            (false, true, ..) => refused(format!(
                "unaligned checkpoints need exactly-once mode ({never_aligns}): at-least-once cannot be combined with them"
            )),
            (false, _, Some(_), _) => refused(format!(
                "an aligned-checkpoint timeout needs exactly-once mode ({never_aligns}, so nothing times out)"
            )),
            (false, _, _, Some(_)) => refused(format!("an in-flight budget needs exactly-once mode ({never_aligns})")),
            (true, _, Some(_), Some(_)) => refused(
                "an in-flight budget and an aligned-checkpoint timeout cannot be combined: choose adaptive \
                 alignment or aligned-then-unaligned"
                    .into(),
            ),
            (true, false, Some(_), None) => refused(
                "an aligned-checkpoint timeout needs unaligned checkpoints turned on (or checkpoint mode \
                 aligned-timeout)"
                    .into(),
            ),
            (true, false, None, Some(_)) => refused(
                "an in-flight budget needs unaligned checkpoints turned on (or checkpoint mode adaptive): its \
                 barriers overtake through the priority slots"
                    .into(),
            ),
            (true, true, Some(timeout), None) => Ok(CheckpointMode::AlignedTimeout { timeout }),
            (true, true, None, Some(budget)) => Ok(CheckpointMode::Adaptive { budget }),
            (true, true, None, None) => Ok(CheckpointMode::Unaligned),
            (true, false, None, None) => Ok(CheckpointMode::Aligned),
        }
    }

    /// Whether its parameter is usable: a timeout and a budget above zero.
    pub(crate) fn check(self) -> Result<()> {
        match self {
            CheckpointMode::AlignedTimeout { timeout } if timeout.is_zero() => {
                Err(Error::config("the alignment timeout must be greater than zero"))
            }
            CheckpointMode::Adaptive { budget: 0 } => Err(Error::config(
                "the in-flight budget must be greater than zero (for no in-flight data at all, take aligned checkpoints)",
            )),
            _ => Ok(()),
        }
    }
}

/// A checkpoint mode as an edge was given it: weir's one word, Flink's flat keys, or both;
/// what [`CheckpointMode::from_flat`] resolves. Unset keys take the engine's defaults:
/// exactly-once, aligned, [`DEFAULT_ALIGNMENT_TIMEOUT`], [`DEFAULT_INFLIGHT_BUDGET`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModeKeys {
    /// The mode in one word (`--checkpoint aligned-timeout`).
    pub kind: Option<ModeKind>,
    /// Flink's `mode`: exactly-once (`true`) or at-least-once.
    pub exactly_once: Option<bool>,
    /// Flink's `unaligned`: whether barriers overtake in-flight data.
    pub unaligned: Option<bool>,
    /// Flink's `aligned-checkpoint-timeout`, for a mode that starts aligned and turns unaligned.
    pub timeout: Option<Duration>,
    /// The in-flight budget of adaptive alignment, bytes.
    pub budget: Option<u64>,
}

impl ModeKeys {
    /// `kind` in one word, with `timeout` if it is aligned-timeout and `budget` if adaptive:
    /// for an edge that names a kind and holds a parameter of each (the simulator, the
    /// benchmarks, the checkpoint lab).
    pub fn word(kind: ModeKind, timeout: Duration, budget: u64) -> ModeKeys {
        ModeKeys {
            kind: Some(kind),
            timeout: (kind == ModeKind::AlignedTimeout).then_some(timeout),
            budget: (kind == ModeKind::Adaptive).then_some(budget),
            ..ModeKeys::default()
        }
    }

    /// These keys over a running job's `mode`: what they leave unset is the job's own (its
    /// guarantee, whether it overtakes, its timeout and budget), except a word's parameter
    /// that the job's mode does not have (switching to `aligned-timeout` from `adaptive`
    /// takes the default timeout, not the budget).
    pub fn over(self, mode: CheckpointMode) -> ModeKeys {
        match self.kind {
            Some(kind) => ModeKeys {
                timeout: self.timeout.or(mode.alignment_timeout().filter(|_| kind == ModeKind::AlignedTimeout)),
                budget: self.budget.or(mode.inflight_budget().filter(|_| kind == ModeKind::Adaptive)),
                ..self
            },
            None => ModeKeys {
                kind: None,
                exactly_once: self.exactly_once.or(Some(mode.exactly_once())),
                unaligned: self.unaligned.or(Some(mode.may_overtake())),
                timeout: self.timeout.or(mode.alignment_timeout()),
                budget: self.budget.or(mode.inflight_budget()),
            },
        }
    }
}

impl std::fmt::Display for CheckpointMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CheckpointMode::AlignedTimeout { timeout } => write!(f, "aligned-timeout ({} ms)", timeout.as_millis()),
            CheckpointMode::Adaptive { budget } => write!(f, "adaptive ({budget} bytes in flight)"),
            other => f.write_str(other.kind().name()),
        }
    }
}

impl ModeKind {
    /// The mode of this kind, with `timeout` for aligned-timeout and `budget` for adaptive,
    /// unchecked (every edge resolves through [`CheckpointMode::from_flat`]).
    pub(crate) fn with(self, timeout: Duration, budget: u64) -> CheckpointMode {
        match self {
            ModeKind::Aligned => CheckpointMode::Aligned,
            ModeKind::Unaligned => CheckpointMode::Unaligned,
            ModeKind::AlignedTimeout => CheckpointMode::AlignedTimeout { timeout },
            ModeKind::Adaptive => CheckpointMode::Adaptive { budget },
            ModeKind::AtLeastOnce => CheckpointMode::AtLeastOnce,
        }
    }
}

/// Which checkpoint mode, without its parameter: what a command line, a lab, the simulator
/// and each checkpoint's statistics name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModeKind {
    /// [`crate::checkpoint::CheckpointMode::Aligned`].
    Aligned,
    /// [`crate::checkpoint::CheckpointMode::Unaligned`].
    Unaligned,
    /// [`crate::checkpoint::CheckpointMode::AlignedTimeout`].
    AlignedTimeout,
    /// [`crate::checkpoint::CheckpointMode::Adaptive`].
    Adaptive,
    /// [`crate::checkpoint::CheckpointMode::AtLeastOnce`].
    AtLeastOnce,
}

impl ModeKind {
    /// Every kind, in the order `weir simulate` and `weir bench` list them.
    pub const ALL: [ModeKind; 5] =
        [ModeKind::Aligned, ModeKind::Unaligned, ModeKind::AlignedTimeout, ModeKind::AtLeastOnce, ModeKind::Adaptive];

    /// Whether results after a recovery are as if no failure happened.
    pub fn exactly_once(self) -> bool {
        self != ModeKind::AtLeastOnce
    }

    /// Its name on command lines and in statistics.
    pub fn name(self) -> &'static str {
        match self {
            ModeKind::Aligned => "aligned",
            ModeKind::Unaligned => "unaligned",
            ModeKind::AlignedTimeout => "aligned-timeout",
            ModeKind::Adaptive => "adaptive",
            ModeKind::AtLeastOnce => "at-least-once",
        }
    }
}

impl std::fmt::Display for ModeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ModeKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        ModeKind::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| {
            format!("'{s}' is not a checkpoint mode (aligned, unaligned, aligned-timeout, adaptive or at-least-once)")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flat(exactly_once: bool, unaligned: bool, timeout: Option<Duration>, budget: Option<u64>) -> ModeKeys {
        ModeKeys { kind: None, exactly_once: Some(exactly_once), unaligned: Some(unaligned), timeout, budget }
    }

    /// The six combinations of Flink's flat keys that do not work cannot be written as a
    /// mode; parsed from the flat keys, each is refused naming why.
    #[test]
    fn flat_keys_parse_into_one_mode_or_are_refused() {
        let five = Duration::from_millis(5);
        let t = Some(five);
        let refused = [
            (flat(false, true, None, None), "unaligned checkpoints need exactly-once"),
            (flat(false, false, t, None), "timeout needs exactly-once"),
            (flat(false, false, None, Some(9)), "budget needs exactly-once"),
            (flat(true, false, t, None), "needs unaligned checkpoints turned on"),
            (flat(true, false, None, Some(9)), "needs unaligned checkpoints turned on"),
            (flat(true, true, t, Some(9)), "cannot be combined"),
            (flat(true, true, Some(Duration::ZERO), None), "greater than zero"),
            (flat(true, true, None, Some(0)), "greater than zero"),
        ];
        for (keys, says) in refused {
            let err = CheckpointMode::from_flat(keys).unwrap_err().to_string();
            assert!(err.contains(says), "{keys:?}: {err}");
        }
        let ok = [
            (flat(true, false, None, None), CheckpointMode::Aligned),
            (flat(true, true, None, None), CheckpointMode::Unaligned),
            (flat(true, true, t, None), CheckpointMode::AlignedTimeout { timeout: five }),
            (flat(true, true, None, Some(9)), CheckpointMode::Adaptive { budget: 9 }),
            (flat(false, false, None, None), CheckpointMode::AtLeastOnce),
            (ModeKeys::default(), CheckpointMode::Aligned),
        ];
        for (keys, mode) in ok {
            assert_eq!(CheckpointMode::from_flat(keys).unwrap(), mode, "{keys:?}");
            assert_eq!(mode.kind().with(five, 9), mode, "a kind and its parameter make the mode again");
            assert_eq!(mode.kind().name().parse::<ModeKind>(), Ok(mode.kind()));
            let word = ModeKeys::word(mode.kind(), five, 9);
            assert_eq!(CheckpointMode::from_flat(word).unwrap(), mode, "the word says the same");
        }
    }

    /// A word with keys beside it: each key must say what the word says, and a parameter
    /// belongs to the one kind that takes it.
    #[test]
    fn a_word_and_the_flat_keys_beside_it_agree_or_are_refused() {
        let word = |kind| ModeKeys { kind: Some(kind), ..ModeKeys::default() };
        let five = Duration::from_millis(5);
        let t = Some(five);
        let refused = [
            (ModeKeys { unaligned: Some(true), ..word(ModeKind::Aligned) }, "aligned and unaligned=true disagree"),
            (ModeKeys { unaligned: Some(false), ..word(ModeKind::Adaptive) }, "adaptive and unaligned=false disagree"),
            (ModeKeys { exactly_once: Some(false), ..word(ModeKind::Aligned) }, "and mode at-least-once disagree"),
            (ModeKeys { exactly_once: Some(true), ..word(ModeKind::AtLeastOnce) }, "and mode exactly-once disagree"),
            (
                ModeKeys { timeout: t, ..word(ModeKind::Unaligned) },
                "is for checkpoint mode aligned-timeout, not unaligned",
            ),
            (ModeKeys { budget: Some(9), ..word(ModeKind::Aligned) }, "is for checkpoint mode adaptive, not aligned"),
        ];
        for (keys, says) in refused {
            let err = CheckpointMode::from_flat(keys).unwrap_err().to_string();
            assert!(err.contains(says), "{keys:?}: {err}");
        }
        let defaults = [
            (word(ModeKind::AlignedTimeout), CheckpointMode::AlignedTimeout { timeout: DEFAULT_ALIGNMENT_TIMEOUT }),
            (word(ModeKind::Adaptive), CheckpointMode::Adaptive { budget: DEFAULT_INFLIGHT_BUDGET }),
            (
                ModeKeys { unaligned: Some(true), timeout: t, ..word(ModeKind::AlignedTimeout) },
                CheckpointMode::AlignedTimeout { timeout: five },
            ),
        ];
        for (keys, mode) in defaults {
            assert_eq!(CheckpointMode::from_flat(keys).unwrap(), mode, "{keys:?}");
        }
    }

    /// A running job's keys land on its mode: what they leave unset is the job's own, except a
    /// word's parameter that its mode does not have.
    #[test]
    fn keys_over_a_running_mode_keep_what_they_leave_unset() {
        let five = Duration::from_millis(5);
        let running = CheckpointMode::AlignedTimeout { timeout: five };
        let over = |keys: ModeKeys| CheckpointMode::from_flat(keys.over(running));
        let budget = ModeKeys { budget: Some(7), timeout: None, ..ModeKeys::default() };
        assert!(over(budget).unwrap_err().to_string().contains("cannot be combined"), "the job's timeout stays");
        let aligned = ModeKeys { unaligned: Some(false), ..ModeKeys::default() };
        assert!(over(aligned).unwrap_err().to_string().contains("needs unaligned checkpoints"));
        let adaptive = ModeKeys { kind: Some(ModeKind::Adaptive), ..ModeKeys::default() };
        assert_eq!(over(adaptive).unwrap(), CheckpointMode::Adaptive { budget: DEFAULT_INFLIGHT_BUDGET });
        let again = ModeKeys { kind: Some(ModeKind::AlignedTimeout), ..ModeKeys::default() };
        assert_eq!(over(again).unwrap(), running, "the job's own timeout");
    }
}
