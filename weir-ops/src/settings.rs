//! One set of checkpoint settings for every command that checkpoints (`wordcount`, `bench`,
//! `nexmark`), the keys of a TOML configuration file (`--config FILE`, the flags overriding
//! it) and of the control endpoint's live configuration: one struct, so a flag, a file key
//! and a `weir control ADDR config KEY=VALUE` key are the same name by construction. Names
//! follow Flink's `execution.checkpointing.*` and `restart-strategy.*` options.
//!
//! Defaults are the engine's, the same on every command, and Flink's except where said:
//! tolerable failed checkpoints 3 (Flink 0: one checkpoint expired under a backlog should not
//! restart a job that is making progress), retained 2 (Flink 1: recovery falls back one
//! checkpoint when the newest is damaged), restarts fixed-delay 10 × 100 ms (Flink's
//! exponential-delay from 1 s: weir restarts inside its process in milliseconds, with no
//! cluster to reschedule on).
//!
//! May touch: weir's checkpoint configuration (its modes resolved by `CheckpointMode::from_flat`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use weir::checkpoint::{CheckpointConfig, CheckpointMode, ModeKeys, ModeKind, RestartStrategy};
use weir::Error;

/// `--checkpoint`: no checkpoints (`none`), one mode, or for `weir bench` several taking
/// turns (`alternate:MODE,MODE…`, the checkpoint lab).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointPlan {
    /// The modes, in turn: none for no checkpoints, one for no alternation.
    pub modes: Vec<ModeKind>,
}

impl CheckpointPlan {
    /// The mode the job starts with (`None`: no checkpoints).
    pub fn first(&self) -> Option<ModeKind> {
        self.modes.first().copied()
    }

    /// Whether `mode` is among the plan's.
    pub fn uses(&self, mode: ModeKind) -> bool {
        self.modes.contains(&mode)
    }

    /// Each of the plan's modes with the flat keys given beside the word (`keys.kind` is
    /// ignored): a timeout or budget goes to the modes that take it, and where none does,
    /// the first mode refuses it, in [`CheckpointMode::from_flat`]'s words.
    pub fn resolve(&self, keys: ModeKeys) -> weir::Result<Vec<CheckpointMode>> {
        let takes = |kind: ModeKind, needed: ModeKind| kind == needed || !self.uses(needed);
        self.modes
            .iter()
            .map(|&kind| {
                CheckpointMode::from_flat(ModeKeys {
                    kind: Some(kind),
                    timeout: keys.timeout.filter(|_| takes(kind, ModeKind::AlignedTimeout)),
                    budget: keys.budget.filter(|_| takes(kind, ModeKind::Adaptive)),
                    ..keys
                })
            })
            .collect()
    }
}

impl std::fmt::Display for CheckpointPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.modes.as_slice() {
            [] => f.write_str("none"),
            [one] => write!(f, "{one}"),
            many => write!(f, "alternate:{}", many.iter().map(|m| m.to_string()).collect::<Vec<_>>().join(",")),
        }
    }
}

/// `none`, a checkpoint mode, or `alternate:` and two or more of those a running job can
/// switch between (its live configuration: aligned, unaligned, aligned-timeout, adaptive).
pub fn checkpoint_plan(s: &str) -> Result<CheckpointPlan, String> {
    let word = |w: &str| w.parse::<ModeKind>().map_err(|e| format!("{e}, or none"));
    let Some(list) = s.strip_prefix("alternate:") else {
        return match s {
            "none" => Ok(CheckpointPlan { modes: Vec::new() }),
            _ => word(s).map(|m| CheckpointPlan { modes: vec![m] }),
        };
    };
    let cannot = |m: &str| {
        format!(
            "'{m}' cannot take turns: a running job switches between aligned, unaligned, aligned-timeout and \
             adaptive only"
        )
    };
    let modes = list
        .split(',')
        .map(|m| match m.trim() {
            m @ ("none" | "at-least-once") => Err(cannot(m)),
            m => word(m),
        })
        .collect::<Result<Vec<_>, _>>()?;
    if modes.len() < 2 || modes.iter().all(|m| *m == modes[0]) {
        return Err(format!("alternate:{list} needs two modes or more, say alternate:aligned,unaligned"));
    }
    Ok(CheckpointPlan { modes })
}

/// Checkpoint settings, as flags and as the keys of a configuration file (the same names).
/// Every one is optional: unset, the engine's default holds.
#[derive(Deserialize, Debug, Clone, Default)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
#[cfg_attr(feature = "clap", command(next_help_heading = "Checkpoints"))]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct CheckpointSettings {
    /// A TOML file of these settings, one `key = value` per flag without its dashes (say
    /// `interval-ms = 500`, `unaligned = true`); flags given as well override it.
    #[cfg_attr(feature = "clap", arg(long, value_name = "FILE"))]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// How checkpoints go, in one word: none, aligned (exactly-once), unaligned, at-least-once,
    /// aligned-timeout (aligned, turning unaligned after --aligned-checkpoint-timeout-ms),
    /// adaptive (unaligned within --inflight-budget-bytes), or for `bench`, alternate:MODE,MODE…
    /// (the checkpoint lab). Flink's --mode and --unaligned say the same in parts.
    #[cfg_attr(feature = "clap", arg(long, value_name = "MODE", value_parser = checkpoint_plan))]
    #[serde(deserialize_with = "plan")]
    pub checkpoint: Option<CheckpointPlan>,
    /// Where checkpoints go: a folder, file:///FOLDER, or s3://BUCKET/PREFIX (endpoint and
    /// credentials from the standard AWS environment variables: AWS_ENDPOINT_URL, AWS_REGION,
    /// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY). Turns checkpoints on. A directory with
    /// checkpoints of the same job resumes from the newest valid one (wordcount; bench and
    /// nexmark default to a temporary folder, removed afterwards).
    #[cfg_attr(feature = "clap", arg(long))]
    pub checkpoint_dir: Option<PathBuf>,
    /// Milliseconds between checkpoints (default 1000). Turns checkpoints on.
    #[cfg_attr(feature = "clap", arg(long, value_parser = millis))]
    #[serde(deserialize_with = "duration_ms")]
    pub interval_ms: Option<u64>,
    /// Milliseconds between checkpoints while the input is far from its end (more than 256
    /// MiB left to a subtask): 0 takes none until then (default: --interval-ms always).
    #[cfg_attr(feature = "clap", arg(long, value_parser = millis))]
    #[serde(deserialize_with = "duration_ms")]
    pub interval_during_backlog_ms: Option<u64>,
    /// exactly-once (default) or at-least-once. Turns checkpoints on.
    #[cfg_attr(feature = "clap", arg(long, value_parser = ["exactly-once", "at-least-once"]))]
    pub mode: Option<String>,
    /// Unaligned checkpoints: barriers overtake in-flight data, which is stored instead
    /// (--unaligned=false to override a configuration file). Turns checkpoints on.
    #[cfg_attr(feature = "clap", arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true"))]
    pub unaligned: Option<bool>,
    /// With unaligned checkpoints: start aligned, turn unaligned at a task that has waited
    /// this many milliseconds (default with --checkpoint aligned-timeout: 10).
    #[cfg_attr(feature = "clap", arg(long, value_parser = millis, alias = "alignment-timeout-ms"))]
    #[serde(alias = "alignment-timeout-ms", deserialize_with = "duration_ms")]
    pub aligned_checkpoint_timeout_ms: Option<u64>,
    /// With unaligned checkpoints: adaptive alignment, a checkpoint's in-flight data kept under
    /// this many bytes (channels that drain are aligned, those that lag captured; default with
    /// --checkpoint adaptive: half of what the job's rings hold, at most 1 MiB).
    #[cfg_attr(feature = "clap", arg(long))]
    pub inflight_budget_bytes: Option<u64>,
    /// Milliseconds a checkpoint may take before it expires (default 600000).
    #[cfg_attr(feature = "clap", arg(long, value_parser = millis))]
    #[serde(deserialize_with = "duration_ms")]
    pub checkpoint_timeout_ms: Option<u64>,
    /// Milliseconds at least between a checkpoint's completion and the next one's start
    /// (default 0), so a slow checkpoint leaves the job time between checkpoints.
    #[cfg_attr(feature = "clap", arg(long, value_parser = millis))]
    #[serde(deserialize_with = "duration_ms")]
    pub min_pause_ms: Option<u64>,
    /// Checkpoints in flight at once, 1 to 64 (default 1).
    #[cfg_attr(feature = "clap", arg(long))]
    pub max_concurrent: Option<u64>,
    /// Checkpoints that may fail in a row before the job fails (default 3; Flink's is 0).
    #[cfg_attr(feature = "clap", arg(long, alias = "tolerable-failures"))]
    #[serde(alias = "tolerable-failures")]
    pub tolerable_failed_checkpoints: Option<u32>,
    /// Completed checkpoints kept, 1 to 1000 (default 2; Flink's is 1).
    #[cfg_attr(feature = "clap", arg(long, alias = "retain"))]
    #[serde(alias = "retain")]
    pub retained: Option<u64>,
    /// Incremental checkpoints: write only the state pages changed since the last completed
    /// checkpoint and refer to earlier files for the rest.
    #[cfg_attr(
        feature = "clap",
        arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", help_heading = "State")
    )]
    pub incremental: Option<bool>,
    /// Local recovery (default on): a failover restores the newest completed checkpoint from
    /// the state the process kept in memory instead of from its files.
    #[cfg_attr(
        feature = "clap",
        arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", help_heading = "State")
    )]
    pub local_recovery: Option<bool>,
    /// Changelog checkpoints: keyed state checkpointed as its changes since the last
    /// checkpoint, with a new base every --materialize-every checkpoints.
    #[cfg_attr(
        feature = "clap",
        arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", help_heading = "State")
    )]
    pub changelog: Option<bool>,
    /// Changelog checkpoints between two bases, at least 1 (default 10); implies --changelog.
    #[cfg_attr(feature = "clap", arg(long, help_heading = "State"))]
    pub materialize_every: Option<u32>,
    /// How the job restarts after a failure: none, fixed-delay (default: 10 attempts 100 ms
    /// apart), exponential-delay (from --restart-delay-ms, times --restart-backoff-multiplier
    /// up to --restart-max-delay-ms) or failure-rate (while at most
    /// --restart-failures-per-interval failures fell in --restart-failure-rate-interval-ms).
    #[cfg_attr(feature = "clap", arg(long, value_name = "STRATEGY", value_parser = RESTART_STRATEGIES, help_heading = "Restarts"))]
    pub restart_strategy: Option<String>,
    /// Restarts allowed (fixed-delay and exponential-delay; default 10).
    #[cfg_attr(feature = "clap", arg(long, help_heading = "Restarts"))]
    pub restart_attempts: Option<u32>,
    /// Milliseconds before a restart; exponential-delay's first (default 100).
    #[cfg_attr(feature = "clap", arg(long, value_parser = millis, help_heading = "Restarts"))]
    #[serde(deserialize_with = "duration_ms")]
    pub restart_delay_ms: Option<u64>,
    /// exponential-delay: the longest wait, in milliseconds (default 60000).
    #[cfg_attr(feature = "clap", arg(long, value_parser = millis, help_heading = "Restarts"))]
    #[serde(deserialize_with = "duration_ms")]
    pub restart_max_delay_ms: Option<u64>,
    /// exponential-delay: the wait's growth per restart, at least 1 (default 1.5).
    #[cfg_attr(feature = "clap", arg(long, help_heading = "Restarts"))]
    pub restart_backoff_multiplier: Option<f64>,
    /// failure-rate: failures allowed within the interval (default 1).
    #[cfg_attr(feature = "clap", arg(long, help_heading = "Restarts"))]
    pub restart_failures_per_interval: Option<u32>,
    /// failure-rate: the interval failures are counted in, in milliseconds (default 60000).
    #[cfg_attr(feature = "clap", arg(long, value_parser = millis, help_heading = "Restarts"))]
    #[serde(deserialize_with = "duration_ms")]
    pub restart_failure_rate_interval_ms: Option<u64>,
    /// Keep keyed and window state within this much memory (512MiB, 2GiB; not the process's
    /// whole memory): past it, the pages used least recently leave memory (those changed
    /// since they were last on disk for a spill file in --state-dir) and come back when a
    /// record needs them. A restart restores lazily: pages stay in the checkpoint's files
    /// (or its s3:// store) until used. Needs no checkpoints; fixed for the job's life.
    #[cfg_attr(feature = "clap", arg(long, value_name = "SIZE", value_parser = byte_size, help_heading = "State"))]
    #[serde(deserialize_with = "byte_size_key")]
    pub state_memory: Option<weir::state::ByteSize>,
    /// Where --state-memory's spill files and its cache of pages read from an s3:// store go
    /// (default: the system's temporary folder, $TMPDIR or /tmp). They are scratch, unlinked
    /// as soon as made: nothing stays behind.
    #[cfg_attr(feature = "clap", arg(long, value_name = "DIR", help_heading = "State"))]
    pub state_dir: Option<PathBuf>,
}

/// A size in bytes with an optional unit (512MiB, 2GiB, 4096), above zero.
pub fn byte_size(s: &str) -> Result<weir::state::ByteSize, String> {
    let size: weir::state::ByteSize = s.parse()?;
    if size.0 == 0 {
        return Err(format!("{s:?} is no room at all: give a size above zero (say 512MiB)"));
    }
    Ok(size)
}

/// A setting from a file or the control endpoint that takes a number or text with a unit
/// (milliseconds or `2s`; bytes or `512MiB`).
#[derive(Deserialize)]
#[serde(untagged)]
enum Given {
    Number(u64),
    Text(String),
}

/// A size from a file or the control endpoint: a number of bytes, or with its unit.
fn byte_size_key<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<weir::state::ByteSize>, D::Error> {
    let text = match Given::deserialize(d) {
        Ok(Given::Number(n)) => n.to_string(),
        Ok(Given::Text(t)) => t,
        Err(_) => {
            return Err(serde::de::Error::custom(
                "invalid type: expected a size (a number of bytes, or say \"512MiB\")",
            ))
        }
    };
    byte_size(&text).map(Some).map_err(serde::de::Error::custom)
}

const RESTART_STRATEGIES: [&str; 4] = ["none", "fixed-delay", "exponential-delay", "failure-rate"];

/// The keys a running job's configuration takes (`weir control ADDR config KEY=VALUE`), with
/// the restart strategy's (`restart-*`); the others are fixed for its life.
pub const LIVE_KEYS: [&str; 12] = [
    "checkpoint",
    "interval-ms",
    "interval-during-backlog-ms",
    "checkpoint-timeout-ms",
    "min-pause-ms",
    "max-concurrent",
    "tolerable-failed-checkpoints",
    "retained",
    "unaligned",
    "aligned-checkpoint-timeout-ms",
    "inflight-budget-bytes",
    "restart-strategy",
];

fn plan<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<CheckpointPlan>, D::Error> {
    let s = String::deserialize(d)?;
    checkpoint_plan(&s).map(Some).map_err(serde::de::Error::custom)
}

/// Milliseconds from `500`, `500ms`, `2s`, `1.5s`, `3m`, `1h`, or a duration as `humantime`
/// reads it (`1m30s`, `1h 15min`): every setting in milliseconds takes a duration with its unit
/// too, on the command line, in the file and at the control endpoint. An unknown unit, or a
/// number that is no whole count of milliseconds, is named.
pub fn millis(value: &str) -> Result<u64, String> {
    let text = value.trim();
    if let Ok(d) = humantime::parse_duration(text) {
        if d.subsec_nanos() % 1_000_000 == 0 {
            return u64::try_from(d.as_millis()).map_err(|_| format!("'{value}' is too long a duration"));
        }
    }
    let (number, unit) = text.split_at(text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len()));
    let not_a_duration = || format!("'{value}' is not a duration in milliseconds (say 500, 500ms, 2s, 1m or 1h)");
    if number.is_empty() {
        return Err(not_a_duration());
    }
    let per_unit = match unit.trim() {
        "" | "ms" => 1.0,
        "s" => 1e3,
        "m" | "min" => 60e3,
        "h" => 3_600e3,
        other => return Err(format!("'{value}' has the unknown unit '{other}': give ms, s, m or h (say 500ms or 2s)")),
    };
    let ms = number.parse::<f64>().map_err(|_| not_a_duration())? * per_unit;
    if !ms.is_finite() || ms > u64::MAX as f64 || (ms - ms.round()).abs() > 1e-6 {
        return Err(not_a_duration());
    }
    Ok(ms.round() as u64)
}

/// A setting in milliseconds from a file or the control endpoint: a number, or a duration with
/// its unit ([`millis`]).
fn duration_ms<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    match Given::deserialize(d) {
        Ok(Given::Number(n)) => Ok(Some(n)),
        Ok(Given::Text(t)) => millis(&t).map(Some).map_err(|why| {
            serde::de::Error::custom(format!("invalid type: string {t:?}, expected milliseconds: {why}"))
        }),
        Err(_) => Err(serde::de::Error::custom("invalid type: expected milliseconds (a number, or say \"2s\")")),
    }
}

/// `a`, or `b` where `a` is unset: the flag over the file.
macro_rules! merge {
    ($a:expr, $b:expr, $($field:ident),*) => {
        CheckpointSettings { config: $a.config, $($field: $a.$field.or($b.$field)),* }
    };
}

impl CheckpointSettings {
    /// These flags over the settings of their `--config` file, if one was given: the file's
    /// unknown keys and wrongly typed values are errors that name the key and the file.
    pub fn with_file(self) -> weir::Result<CheckpointSettings> {
        let Some(path) = self.config.clone() else { return Ok(self) };
        let file = read_file(&path)?;
        Ok(merge!(
            self,
            file,
            checkpoint,
            checkpoint_dir,
            interval_ms,
            interval_during_backlog_ms,
            mode,
            unaligned,
            aligned_checkpoint_timeout_ms,
            inflight_budget_bytes,
            checkpoint_timeout_ms,
            min_pause_ms,
            max_concurrent,
            tolerable_failed_checkpoints,
            retained,
            incremental,
            local_recovery,
            changelog,
            materialize_every,
            restart_strategy,
            restart_attempts,
            restart_delay_ms,
            restart_max_delay_ms,
            restart_backoff_multiplier,
            restart_failures_per_interval,
            restart_failure_rate_interval_ms,
            state_memory,
            state_dir
        ))
    }

    /// `c` with the state settings (`state-memory`, `state-dir`); they need no checkpoints.
    pub fn run_config(&self, c: weir::RunConfig) -> weir::Result<weir::RunConfig> {
        let c = match self.state_memory {
            Some(size) => c.state_memory(size.0),
            None if self.state_dir.is_some() => {
                return Err(Error::config(
                    "--state-dir is where --state-memory's spill files go: give --state-memory too",
                ));
            }
            None => c,
        };
        Ok(match &self.state_dir {
            Some(dir) => c.state_dir(dir),
            None => c,
        })
    }

    /// Each setting's key (its flag without the dashes) and whether it is given, in the
    /// order of the flags; `checkpoint` and `config` apart.
    fn settings(&self) -> [(&'static str, bool); 23] {
        [
            ("checkpoint-dir", self.checkpoint_dir.is_some()),
            ("interval-ms", self.interval_ms.is_some()),
            ("interval-during-backlog-ms", self.interval_during_backlog_ms.is_some()),
            ("mode", self.mode.is_some()),
            ("unaligned", self.unaligned.is_some()),
            ("aligned-checkpoint-timeout-ms", self.aligned_checkpoint_timeout_ms.is_some()),
            ("inflight-budget-bytes", self.inflight_budget_bytes.is_some()),
            ("checkpoint-timeout-ms", self.checkpoint_timeout_ms.is_some()),
            ("min-pause-ms", self.min_pause_ms.is_some()),
            ("max-concurrent", self.max_concurrent.is_some()),
            ("tolerable-failed-checkpoints", self.tolerable_failed_checkpoints.is_some()),
            ("retained", self.retained.is_some()),
            ("incremental", self.incremental.is_some()),
            ("local-recovery", self.local_recovery.is_some()),
            ("changelog", self.changelog.is_some()),
            ("materialize-every", self.materialize_every.is_some()),
            ("restart-strategy", self.restart_strategy.is_some()),
            ("restart-attempts", self.restart_attempts.is_some()),
            ("restart-delay-ms", self.restart_delay_ms.is_some()),
            ("restart-max-delay-ms", self.restart_max_delay_ms.is_some()),
            ("restart-backoff-multiplier", self.restart_backoff_multiplier.is_some()),
            ("restart-failures-per-interval", self.restart_failures_per_interval.is_some()),
            ("restart-failure-rate-interval-ms", self.restart_failure_rate_interval_ms.is_some()),
        ]
    }

    /// The settings given, by key.
    fn given(&self) -> Vec<&'static str> {
        self.settings().into_iter().filter_map(|(k, g)| g.then_some(k)).collect()
    }

    /// How checkpoints go, from `--checkpoint` or from Flink's parts (`--mode`, `--unaligned`,
    /// the aligned-checkpoint timeout, the in-flight budget); `None`: no checkpoints (then
    /// no other setting may be given). `alternate` allows the checkpoint lab's plans.
    pub fn plan(&self, alternate: bool) -> weir::Result<Option<CheckpointPlan>> {
        // Every value checked first, naming its key, before a command builds its job on them.
        self.apply_live(CheckpointConfig::new(std::env::temp_dir()))?;
        self.restart(RestartStrategy::None)?;
        let keys = self.mode_keys()?;
        let given = self.given();
        let plan = match &self.checkpoint {
            Some(p) if p.modes.is_empty() => {
                if let Some(key) = given.first() {
                    return Err(Error::config(format!("--{key} needs checkpoints, and --checkpoint is none")));
                }
                return Ok(None);
            }
            Some(p) => {
                if p.modes.len() > 1 && !alternate {
                    return Err(Error::config(format!(
                        "--checkpoint {p}: the checkpoint lab (modes taking turns) is weir bench's"
                    )));
                }
                p.resolve(keys)?;
                p.clone()
            }
            None => {
                let mode = CheckpointMode::from_flat(keys)?;
                let on = self.checkpoint_dir.is_some()
                    || self.interval_ms.is_some()
                    || self.mode.is_some()
                    || self.unaligned.is_some();
                if !on {
                    if let Some(key) = given.first() {
                        return Err(Error::config(format!(
                            "--{key} needs checkpoints: turn them on with --checkpoint MODE, --checkpoint-dir DIR or \
                             --interval-ms N"
                        )));
                    }
                    return Ok(None);
                }
                CheckpointPlan { modes: vec![mode.kind()] }
            }
        };
        Ok(Some(plan))
    }

    /// The mode's keys these settings give, the word aside (a plan holds it): `mode`,
    /// `unaligned`, the aligned-checkpoint timeout and the in-flight budget.
    fn mode_keys(&self) -> weir::Result<ModeKeys> {
        let exactly_once = match self.mode.as_deref() {
            None => None,
            Some("exactly-once") => Some(true),
            Some("at-least-once") => Some(false),
            Some(m) => return Err(Error::config(format!("mode: '{m}' is not exactly-once or at-least-once"))),
        };
        Ok(ModeKeys {
            kind: None,
            exactly_once,
            unaligned: self.unaligned,
            timeout: self.aligned_checkpoint_timeout_ms.map(Duration::from_millis),
            budget: self.inflight_budget_bytes,
        })
    }

    /// The modes of `plan` (as [`CheckpointSettings::plan`] returned it) with these settings'
    /// parameters, in turn.
    pub fn modes(&self, plan: &CheckpointPlan) -> weir::Result<Vec<CheckpointMode>> {
        plan.resolve(self.mode_keys()?)
    }

    /// [`CheckpointSettings::modes`] for `job` with rings of `ring_capacity` entries: without
    /// a budget given, adaptive alignment's is [`weir::Job::default_inflight_budget`].
    pub fn fitted_modes(
        &self,
        plan: &CheckpointPlan,
        job: &weir::Job,
        ring_capacity: usize,
    ) -> weir::Result<Vec<CheckpointMode>> {
        let fit = |m| match m {
            CheckpointMode::Adaptive { .. } if self.inflight_budget_bytes.is_none() => {
                CheckpointMode::Adaptive { budget: job.default_inflight_budget(ring_capacity) }
            }
            m => m,
        };
        Ok(self.modes(plan)?.into_iter().map(fit).collect())
    }

    /// `c` with these settings for a job that checkpoints as `plan` says (its first mode):
    /// everything but its directory. A job of `adaptive` without a budget gets
    /// [`weir::checkpoint::DEFAULT_INFLIGHT_BUDGET`], for the command to fit to its rings.
    pub fn apply(&self, plan: &CheckpointPlan, c: CheckpointConfig) -> weir::Result<CheckpointConfig> {
        let mut c = self.apply_live(c)?;
        if let Some(mode) = self.modes(plan)?.first() {
            c = c.mode(*mode);
        }
        if let Some(on) = self.incremental {
            c.incremental = on;
        }
        if let Some(on) = self.local_recovery {
            c.local_recovery = on;
        }
        if let Some(on) = self.changelog {
            c = c.changelog(on);
        }
        if let Some(n) = self.materialize_every {
            if self.changelog == Some(false) {
                return Err(Error::config(
                    "--materialize-every is for changelog checkpoints, and --changelog=false turns them off",
                ));
            }
            c = c.materialize_every(n);
        }
        c.restart = self.restart(c.restart)?;
        c.validate()?;
        Ok(c)
    }

    /// `c` with the settings a running job can change (as [`LIVE_KEYS`]).
    pub fn apply_live(&self, mut c: CheckpointConfig) -> weir::Result<CheckpointConfig> {
        let ms = Duration::from_millis;
        if let Some(n) = self.interval_ms {
            c.interval = ms(at_least("interval-ms", n, 1)?);
        }
        if let Some(n) = self.interval_during_backlog_ms {
            c.interval_during_backlog = Some(ms(n));
        }
        if let Some(n) = self.checkpoint_timeout_ms {
            c.checkpoint_timeout = ms(at_least("checkpoint-timeout-ms", n, 1)?);
        }
        if let Some(n) = self.min_pause_ms {
            c.min_pause = ms(n);
        }
        if let Some(n) = self.max_concurrent {
            c.max_concurrent = within("max-concurrent", n, 1, 64)? as usize;
        }
        if let Some(n) = self.tolerable_failed_checkpoints {
            c.tolerable_failed_checkpoints = n;
        }
        if let Some(n) = self.retained {
            c.retained = within("retained", n, 1, 1000)? as usize;
        }
        if let Some(n) = self.aligned_checkpoint_timeout_ms {
            at_least("aligned-checkpoint-timeout-ms", n, 1)?;
        }
        if let Some(n) = self.inflight_budget_bytes {
            at_least("inflight-budget-bytes", n, 1)?;
        }
        Ok(c)
    }

    /// A running job's configuration `c` with these settings (all given ones must be
    /// [`LIVE_KEYS`]): the mode word `checkpoint` or `unaligned` and its timeout or budget.
    pub fn change_live(&self, c: CheckpointConfig) -> weir::Result<CheckpointConfig> {
        let fixed = ["checkpoint-dir", "mode", "incremental", "local-recovery", "changelog", "materialize-every"];
        let state = [("state-memory", self.state_memory.is_some()), ("state-dir", self.state_dir.is_some())];
        let state = state.into_iter().filter_map(|(k, g)| g.then_some(k));
        if let Some(key) = self.given().into_iter().filter(|k| fixed.contains(k)).chain(state).next() {
            return Err(Error::config(format!("{key} is fixed for the job's life (a running job cannot change it)")));
        }
        let mut c = self.apply_live(c)?;
        c.restart = self.restart(c.restart)?;
        let keys = self.mode_keys()?;
        match &self.checkpoint {
            Some(p) if p.modes.len() > 1 => {
                return Err(Error::config("checkpoint: one mode at a time (the lab is weir bench's)"));
            }
            Some(p) if matches!(p.first(), None | Some(ModeKind::AtLeastOnce)) => {
                return Err(Error::config(format!(
                    "checkpoint: a running job switches between aligned, unaligned, aligned-timeout and adaptive, not {p}"
                )));
            }
            // The word or Flink's flat keys, each over the running job's own: one mode, or refused.
            _ => {
                let keys = ModeKeys { kind: self.checkpoint.as_ref().and_then(CheckpointPlan::first), ..keys };
                c.mode = CheckpointMode::from_flat(keys.over(c.mode))?;
            }
        }
        Ok(c)
    }

    /// The restart strategy these settings ask for (`default` without one).
    fn restart(&self, default: RestartStrategy) -> weir::Result<RestartStrategy> {
        let ms = Duration::from_millis;
        let strategy = self.restart_strategy.as_deref();
        let only = |key: &str, given: bool, strategies: &[&str]| -> weir::Result<()> {
            match strategy {
                Some(s) if given && !strategies.contains(&s) => Err(Error::config(format!(
                    "--{key} is for --restart-strategy {}, not {s}",
                    strategies.join(" or ")
                ))),
                None if given => {
                    Err(Error::config(format!("--{key} needs --restart-strategy {}", strategies.join(" or "))))
                }
                _ => Ok(()),
            }
        };
        only("restart-attempts", self.restart_attempts.is_some(), &["fixed-delay", "exponential-delay"])?;
        only(
            "restart-delay-ms",
            self.restart_delay_ms.is_some(),
            &["fixed-delay", "exponential-delay", "failure-rate"],
        )?;
        only("restart-max-delay-ms", self.restart_max_delay_ms.is_some(), &["exponential-delay"])?;
        only("restart-backoff-multiplier", self.restart_backoff_multiplier.is_some(), &["exponential-delay"])?;
        only("restart-failures-per-interval", self.restart_failures_per_interval.is_some(), &["failure-rate"])?;
        only("restart-failure-rate-interval-ms", self.restart_failure_rate_interval_ms.is_some(), &["failure-rate"])?;
        let attempts = self.restart_attempts.unwrap_or(10);
        let delay = ms(self.restart_delay_ms.unwrap_or(100));
        Ok(match strategy {
            None => default,
            Some("none") => RestartStrategy::None,
            Some("fixed-delay") => RestartStrategy::FixedDelay { attempts, delay },
            Some("exponential-delay") => {
                let max = ms(self.restart_max_delay_ms.unwrap_or(60_000));
                if max < delay {
                    return Err(Error::config(format!(
                        "--restart-max-delay-ms {} is shorter than --restart-delay-ms {}",
                        max.as_millis(),
                        delay.as_millis()
                    )));
                }
                let multiplier = self.restart_backoff_multiplier.unwrap_or(1.5);
                RestartStrategy::ExponentialBackoff { attempts, initial: delay, max, multiplier }
            }
            Some("failure-rate") => RestartStrategy::FailureRate {
                max_failures: self.restart_failures_per_interval.unwrap_or(1),
                interval: ms(at_least(
                    "restart-failure-rate-interval-ms",
                    self.restart_failure_rate_interval_ms.unwrap_or(60_000),
                    1,
                )?),
                delay,
            },
            Some(s) => {
                return Err(Error::config(format!(
                    "restart-strategy: '{s}' is not one of {}",
                    RESTART_STRATEGIES.join(", ")
                )))
            }
        })
    }

    /// `KEY=VALUE` settings of the live configuration, together (a restart strategy and its
    /// parameters, say): each VALUE a number, true/false, or text. An unknown key, a key given
    /// twice or a wrong value is named. The settings are made into a table, never into TOML
    /// text: a value cannot carry another key (`retained=3\nmax-concurrent = 2` is the text
    /// `3\nmax-concurrent = 2` for `retained`, and refused).
    pub fn parse_settings(settings: &[(String, String)]) -> Result<CheckpointSettings, String> {
        let read = |table: toml::Table| table.try_into::<CheckpointSettings>();
        let mut all = toml::Table::new();
        for (key, value) in settings {
            let one = toml::Table::from_iter([(key.clone(), setting_value(value))]);
            read(one.clone()).map_err(|e| match e.message().starts_with("unknown field") {
                true => format!("unknown configuration key '{key}': one of {}", LIVE_KEYS.join(", ")),
                false => format!("{key}={value}: {}", e.message().trim()),
            })?;
            if all.insert(key.clone(), one[key].clone()).is_some() {
                return Err(format!("{key} is given twice"));
            }
        }
        read(all).map_err(|e| e.message().trim().to_string())
    }
}

/// A setting's value as the configuration file would hold it: true/false, a whole number, a
/// finite decimal number, or else text.
fn setting_value(value: &str) -> toml::Value {
    if let Ok(b) = value.parse::<bool>() {
        toml::Value::Boolean(b)
    } else if let Ok(n) = value.parse::<i64>() {
        toml::Value::Integer(n)
    } else if let Some(x) = value.parse::<f64>().ok().filter(|x| x.is_finite()) {
        toml::Value::Float(x)
    } else {
        toml::Value::String(value.to_string())
    }
}

/// `job` with `flags` on its checkpoint configuration (a job without one is returned as it
/// is), checkpointing as `plan` says; without a budget given, adaptive alignment's is fitted
/// to the job's rings of `ring_capacity` entries ([`CheckpointSettings::fitted_modes`]).
pub fn with_flags(
    job: weir::Job,
    flags: &CheckpointSettings,
    plan: &CheckpointPlan,
    ring_capacity: usize,
) -> weir::Result<weir::Job> {
    let Some(c) = job.checkpointing() else { return Ok(job) };
    let mut c = flags.apply(plan, c)?;
    if let Some(first) = flags.fitted_modes(plan, &job, ring_capacity)?.first() {
        c = c.mode(*first);
    }
    Ok(job.with_checkpointing(c))
}

fn at_least(key: &str, n: u64, min: u64) -> weir::Result<u64> {
    if n < min {
        return Err(Error::config(format!("--{key} must be at least {min}, not {n}")));
    }
    Ok(n)
}

fn within(key: &str, n: u64, min: u64, max: u64) -> weir::Result<u64> {
    if !(min..=max).contains(&n) {
        return Err(Error::config(format!("--{key} must be from {min} to {max}, not {n}")));
    }
    Ok(n)
}

/// The largest configuration file read: a few dozen keys take a few hundred bytes.
const CONFIG_FILE_MAX_BYTES: u64 = 1 << 20;

/// The text of `path`, `what` the user named (a configuration file, a password file): a plain
/// file of at most `max_bytes`. A FIFO would block the command for ever and `/dev/zero` would
/// be read until memory ran out, so anything but a plain file is refused, and a larger one.
pub fn read_plain_file(path: &Path, what: &str, max_bytes: u64) -> weir::Result<String> {
    let cannot = |e| Error::io(format!("cannot read the {what}"), path, e);
    let meta = std::fs::metadata(path).map_err(cannot)?;
    if !meta.is_file() {
        return Err(Error::config(format!("{what} {}: not a plain file", path.display())));
    }
    let mut text = String::new();
    let file = std::fs::File::open(path).map_err(cannot)?;
    std::io::Read::read_to_string(&mut std::io::Read::take(file, max_bytes + 1), &mut text).map_err(cannot)?;
    if text.len() as u64 > max_bytes {
        return Err(Error::config(format!("{what} {}: larger than {max_bytes} bytes", path.display())));
    }
    Ok(text)
}

/// The settings of configuration file `path`: a plain file (a FIFO blocked the command for
/// ever, and `/dev/zero` was read until memory ran out) of at most [`CONFIG_FILE_MAX_BYTES`].
fn read_file(path: &Path) -> weir::Result<CheckpointSettings> {
    let text = read_plain_file(path, "configuration file", CONFIG_FILE_MAX_BYTES)?;
    toml::from_str::<CheckpointSettings>(&text)
        .map_err(|e| Error::config(format!("configuration file {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_write_them() {
        for (text, ms) in [("500", 500), ("500ms", 500), ("2s", 2_000), ("1.5s", 1_500), ("3m", 180_000)] {
            assert_eq!(millis(text), Ok(ms), "{text}");
        }
        for (text, ms) in [("1m30s", 90_000), ("1h 15min", 4_500_000), ("2d", 172_800_000)] {
            assert_eq!(millis(text), Ok(ms), "{text}");
        }
        let e = millis("2x").unwrap_err();
        assert!(e.contains("unknown unit 'x'"), "{e}");
        assert!(millis("").is_err() && millis("0.0001s").is_err());
    }

    /// Only a plain file of bounded size is read: a FIFO blocked for ever, `/dev/zero` was
    /// read until memory ran out.
    #[test]
    fn only_plain_files_of_bounded_size_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let e = read_plain_file(&fifo, "password file", 64).unwrap_err().to_string();
        assert!(e.contains("password file") && e.contains("not a plain file"), "{e}");
        let e = read_plain_file(Path::new("/dev/zero"), "password file", 64).unwrap_err().to_string();
        assert!(e.contains("not a plain file"), "{e}");
        let big = dir.path().join("big");
        std::fs::write(&big, [b'x'; 65]).unwrap();
        assert!(read_plain_file(&big, "password file", 64).unwrap_err().to_string().contains("larger than 64"));
        std::fs::write(&big, "secret\n").unwrap();
        assert_eq!(read_plain_file(&big, "password file", 64).unwrap(), "secret\n");
        assert!(read_plain_file(&dir.path().join("missing"), "password file", 64).is_err());
    }
}
