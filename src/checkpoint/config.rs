//! [`CheckpointConfig`]: when and how checkpoints are taken, and how a failed job restarts.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::storage::ObjectStore;
use crate::error::{Error, Result};
use crate::snapshot::{CheckpointMode, FaultInjector};

/// How a failed job is restarted from its latest checkpoint.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RestartStrategy {
    /// Never: the first failure fails the job.
    None,
    /// Up to `attempts` restarts, `delay` apart.
    FixedDelay {
        /// Restarts allowed.
        attempts: u32,
        /// Wait before each restart.
        delay: Duration,
    },
    /// Up to `attempts` restarts; the wait starts at `initial` and is multiplied by
    /// `multiplier` after each restart, up to `max`.
    ExponentialBackoff {
        /// Restarts allowed.
        attempts: u32,
        /// The first wait.
        initial: Duration,
        /// The longest wait.
        max: Duration,
        /// Growth factor (at least 1).
        multiplier: f64,
    },
    /// Restarts `delay` after each failure while at most `max_failures` failures fell within
    /// the last `interval` (Flink's failure-rate strategy): a job that fails now and then goes
    /// on for ever, one that fails in a burst stops.
    FailureRate {
        /// Failures allowed within `interval`.
        max_failures: u32,
        /// The window failures are counted in.
        interval: Duration,
        /// Wait before each restart.
        delay: Duration,
    },
}

impl RestartStrategy {
    /// The wait before restart number `restart` (from 0), or `None` if no restart is left;
    /// `failures_ago` is how long ago each failure so far happened, this one included (the
    /// failure-rate strategy counts those within its interval).
    ///
    /// ```
    /// use std::time::Duration;
    /// use weir::checkpoint::RestartStrategy;
    /// let s = Duration::from_secs;
    /// let rate = RestartStrategy::FailureRate { max_failures: 2, interval: s(60), delay: s(1) };
    /// assert_eq!(rate.delay(5, &[s(600), s(30), s(0)]), Some(s(1)));
    /// assert_eq!(rate.delay(5, &[s(50), s(30), s(0)]), None);
    /// ```
    pub fn delay(&self, restart: u32, failures_ago: &[Duration]) -> Option<Duration> {
        match *self {
            RestartStrategy::None => None,
            RestartStrategy::FailureRate { max_failures, interval, delay } => {
                let recent = failures_ago.iter().filter(|ago| **ago <= interval).count();
                (recent <= max_failures as usize).then_some(delay)
            }
            RestartStrategy::FixedDelay { attempts, delay } => (restart < attempts).then_some(delay),
            RestartStrategy::ExponentialBackoff { attempts, initial, max, multiplier } => {
                (restart < attempts).then(|| {
                    let f = multiplier.max(1.0).powi(restart.min(64) as i32);
                    initial.mul_f64(f).min(max)
                })
            }
        }
    }

    /// Records a failure at `now` among `failures` (when each earlier one happened), forgetting
    /// those the strategy counts no longer, and returns how long ago each remembered one
    /// happened, for [`RestartStrategy::delay`]. The failure-rate strategy remembers its
    /// interval, however long; the others count restarts, and an hour of failures is kept for
    /// a change of strategy on a running job.
    pub(crate) fn remember_failure(
        strategy: Option<&RestartStrategy>,
        failures: &mut Vec<std::time::Instant>,
        now: std::time::Instant,
    ) -> Vec<Duration> {
        let memory = match strategy {
            Some(RestartStrategy::FailureRate { interval, .. }) => (*interval).max(Duration::from_secs(3600)),
            _ => Duration::from_secs(3600),
        };
        failures.retain(|t| now.duration_since(*t) <= memory);
        failures.push(now);
        failures.iter().map(|t| now.duration_since(*t)).collect()
    }
}

/// Checkpointing settings. Checkpointing is off unless a job is given one (as in Flink).
///
/// ```
/// use std::time::Duration;
/// use weir::checkpoint::{CheckpointConfig, CheckpointMode};
/// let dir = tempfile::tempdir().unwrap();
/// let cfg = CheckpointConfig::new(dir.path())
///     .interval(Duration::from_millis(500))
///     .mode(CheckpointMode::Aligned)
///     .retained(3);
/// cfg.validate().unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct CheckpointConfig {
    /// Where checkpoints are written (`chk-<n>/` folders); with an object store, this
    /// process's working copy of it.
    pub dir: PathBuf,
    /// The object store the checkpoint directory is kept in ([`CheckpointConfig::in_store`]).
    pub store: Option<Arc<dyn ObjectStore>>,
    /// Time between checkpoint triggers.
    pub interval: Duration,
    /// Time between checkpoint triggers while a source reports it is catching up on a backlog
    /// ([`crate::source::Source::backlog`]); zero takes none then. `None`: `interval` always.
    pub interval_during_backlog: Option<Duration>,
    /// How barriers go, and the guarantee that gives.
    pub mode: CheckpointMode,
    /// A checkpoint not complete after this long is aborted.
    pub checkpoint_timeout: Duration,
    /// Time a savepoint may take before it fails (its own: a savepoint must not fail because
    /// ordinary checkpoints of a slow job expire).
    pub savepoint_timeout: Duration,
    /// Least time between the end of one checkpoint and the trigger of the next.
    pub min_pause: Duration,
    /// Checkpoints in flight at once.
    pub max_concurrent: usize,
    /// Consecutive failed checkpoints tolerated before the job fails.
    pub tolerable_failed_checkpoints: u32,
    /// Completed checkpoints kept on disk.
    pub retained: usize,
    /// Incremental checkpoints: write only the state pages dirtied since the last completed
    /// checkpoint and refer to earlier files for the rest.
    pub incremental: bool,
    /// Local recovery: a failover in a live process restores from the state of the last
    /// completed checkpoint that the process kept in memory, not from its files (see
    /// [`CheckpointConfig::local_recovery`]).
    pub local_recovery: bool,
    /// Changelog checkpoints: keyed state goes as the changes since the last checkpoint, and a
    /// new base after this many of them (see [`CheckpointConfig::changelog`]); `None`: off.
    pub changelog: Option<u32>,
    /// How the job restarts after a failure.
    pub restart: RestartStrategy,
    /// Whether a recovery may remove committed sink output (see
    /// [`CheckpointConfig::allow_retracting_output`]).
    pub allow_retracting_output: bool,
    /// Failure points for tests (the `testing` feature; see [`CheckpointConfig::faults`]).
    pub(crate) faults: Option<Arc<FaultInjector>>,
}

/// Completed checkpoints kept unless told otherwise: two, so that when the newest is found
/// damaged at recovery the one before it is still there (recovery then falls back one
/// checkpoint instead of starting over). The cost is disk: one more checkpoint's files (with
/// incremental checkpoints, the shared pages only the older one refers to).
pub const DEFAULT_RETAINED: usize = 2;

/// Changelog checkpoints between two bases unless told otherwise
/// ([`CheckpointConfig::materialize_every`]).
pub const DEFAULT_MATERIALIZE_EVERY: u32 = 10;

impl CheckpointConfig {
    /// Exactly-once aligned checkpoints into `dir` every second, with Flink-like defaults.
    /// `dir` is a folder, or `file:///FOLDER` (the same folder); a directory in an object
    /// store is [`CheckpointConfig::in_store`]'s.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        let dir: PathBuf = dir.into();
        let dir = match dir.to_str().and_then(|d| d.strip_prefix("file://")) {
            Some(folder) => PathBuf::from(folder),
            None => dir,
        };
        CheckpointConfig {
            dir,
            store: None,
            interval: Duration::from_secs(1),
            interval_during_backlog: None,
            mode: CheckpointMode::Aligned,
            checkpoint_timeout: Duration::from_secs(600),
            savepoint_timeout: Duration::from_secs(600),
            min_pause: Duration::ZERO,
            max_concurrent: 1,
            tolerable_failed_checkpoints: 3,
            retained: DEFAULT_RETAINED,
            incremental: false,
            local_recovery: true,
            changelog: None,
            restart: RestartStrategy::FixedDelay { attempts: 10, delay: Duration::from_millis(100) },
            allow_retracting_output: false,
            faults: None,
        }
    }

    /// Checkpoints kept in object store `store` (S3 and its kind: the `weir-object-store`
    /// crate opens `s3://BUCKET/PREFIX`), so a process started anywhere resumes from them.
    /// Checkpoints are written to a working folder of this process first (under the system's
    /// temporary directory; [`CheckpointConfig::dir`] names it) and go up as they complete;
    /// at start the store's checkpoints come down into it.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use weir::checkpoint::{CheckpointConfig, InMemoryObjectStore};
    /// let cfg = CheckpointConfig::in_store(Arc::new(InMemoryObjectStore::default()));
    /// cfg.validate().unwrap();
    /// ```
    pub fn in_store(store: Arc<dyn ObjectStore>) -> Self {
        let dir = working_folder(&store.location());
        CheckpointConfig { store: Some(store), ..CheckpointConfig::new(dir) }
    }

    /// Sets the interval.
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }
    /// Sets the interval while any source is catching up on a backlog (Flink's
    /// `execution.checkpointing.interval-during-backlog`): a longer one spends less of the
    /// catch-up on checkpoints, zero takes none until the backlog is gone. The normal interval
    /// applies again from the last checkpoint once no source reports one.
    ///
    /// ```
    /// use std::time::Duration;
    /// let c = weir::checkpoint::CheckpointConfig::new("/tmp/chk")
    ///     .interval(Duration::from_secs(1))
    ///     .interval_during_backlog(Duration::from_secs(30));
    /// assert_eq!(c.interval_during_backlog, Some(Duration::from_secs(30)));
    /// ```
    pub fn interval_during_backlog(mut self, interval: Duration) -> Self {
        self.interval_during_backlog = Some(interval);
        self
    }
    /// How barriers go (default [`CheckpointMode::Aligned`]).
    pub fn mode(mut self, mode: CheckpointMode) -> Self {
        self.mode = mode;
        self
    }
    /// Turns incremental checkpoints on or off.
    pub fn incremental(mut self, incremental: bool) -> Self {
        self.incremental = incremental;
        self
    }
    /// Turns local recovery on (the default) or off (`--local-recovery`, the file's and the
    /// endpoint's `local-recovery`). On, the process keeps the state of its newest completed
    /// checkpoint as the tasks captured it (copy-on-write forks: their pages are shared, not
    /// copied), and a failover in the process restores from it in milliseconds instead of
    /// reading the checkpoint's files; a restarted process reads the files. The cost: the
    /// live state copies each page the first time it writes to it after a checkpoint (as it
    /// does anyway while a checkpoint is being written), so up to a checkpoint's state more
    /// memory.
    ///
    /// ```
    /// use weir::checkpoint::CheckpointConfig;
    /// let c = CheckpointConfig::new("/tmp/chk").local_recovery(false);
    /// assert!(!c.local_recovery);
    /// ```
    pub fn local_recovery(mut self, on: bool) -> Self {
        self.local_recovery = on;
        self
    }
    /// Turns changelog checkpoints on (`--changelog`, the file's and the endpoint's
    /// `changelog`): keyed state is checkpointed as the entries written since the last
    /// checkpoint (each page's written slots, tracked as they are written), referring to the
    /// base and the earlier changes stored before, so a checkpoint's cost follows the changes,
    /// not the state's size or how its changes spread over pages. After
    /// [`DEFAULT_MATERIALIZE_EVERY`] checkpoints of changes (see
    /// [`CheckpointConfig::materialize_every`]), or once the changes stored hold as many
    /// bytes as the base, a checkpoint writes the state whole again (a new base), after which
    /// retention lets the old chain go. A restore reads the base and
    /// applies the changes in order. Savepoints and full checkpoints are always whole.
    ///
    /// ```
    /// use weir::checkpoint::CheckpointConfig;
    /// let c = CheckpointConfig::new("/tmp/chk").changelog(true);
    /// assert_eq!(c.changelog, Some(weir::checkpoint::DEFAULT_MATERIALIZE_EVERY));
    /// ```
    pub fn changelog(mut self, on: bool) -> Self {
        self.changelog = on.then_some(self.changelog.unwrap_or(DEFAULT_MATERIALIZE_EVERY));
        self
    }
    /// Changelog checkpoints with a new base after every `checkpoints` checkpoints of changes
    /// (`--materialize-every`); zero is refused when the job starts.
    pub fn materialize_every(mut self, checkpoints: u32) -> Self {
        self.changelog = Some(checkpoints);
        self
    }
    /// A checkpoint not complete after this long is aborted (`--checkpoint-timeout-ms`, the
    /// file's and the endpoint's `checkpoint-timeout-ms`).
    pub fn checkpoint_timeout(mut self, timeout: Duration) -> Self {
        self.checkpoint_timeout = timeout;
        self
    }
    /// The old name of [`CheckpointConfig::checkpoint_timeout`].
    #[deprecated(note = "one name per setting: checkpoint_timeout, as the flag and the file say")]
    pub fn timeout(self, timeout: Duration) -> Self {
        self.checkpoint_timeout(timeout)
    }

    /// Time a savepoint may take before it fails (default 10 minutes), apart from the
    /// checkpoints' [`CheckpointConfig::checkpoint_timeout`].
    pub fn savepoint_timeout(mut self, timeout: Duration) -> Self {
        self.savepoint_timeout = timeout;
        self
    }
    /// Sets the minimum pause between checkpoints.
    pub fn min_pause(mut self, pause: Duration) -> Self {
        self.min_pause = pause;
        self
    }
    /// Sets the maximum concurrent checkpoints.
    pub fn max_concurrent(mut self, n: usize) -> Self {
        self.max_concurrent = n;
        self
    }
    /// Checkpoints that may fail in a row before the job fails
    /// (`--tolerable-failed-checkpoints`, the file's and the endpoint's
    /// `tolerable-failed-checkpoints`).
    pub fn tolerable_failed_checkpoints(mut self, n: u32) -> Self {
        self.tolerable_failed_checkpoints = n;
        self
    }
    /// The old name of [`CheckpointConfig::tolerable_failed_checkpoints`].
    #[deprecated(note = "one name per setting: tolerable_failed_checkpoints, as the flag and the file say")]
    pub fn tolerable_failures(self, n: u32) -> Self {
        self.tolerable_failed_checkpoints(n)
    }
    /// How many completed checkpoints are kept (default [`DEFAULT_RETAINED`]; `--retained`,
    /// the file's and the endpoint's `retained`).
    pub fn retained(mut self, n: usize) -> Self {
        self.retained = n;
        self
    }
    /// The old name of [`CheckpointConfig::retained`].
    #[deprecated(note = "one name per setting: retained, as the flag and the file say")]
    pub fn retain(self, n: usize) -> Self {
        self.retained(n)
    }
    /// Sets the restart strategy.
    pub fn restart(mut self, strategy: RestartStrategy) -> Self {
        self.restart = strategy;
        self
    }
    /// Lets a recovery remove committed sink output. A recovery that falls back past a
    /// damaged checkpoint, or starts over with no checkpoint left, would have to remove output
    /// committed under the checkpoints it cannot restore (and write it again); by default it
    /// refuses to start instead, naming the files. Allowed, it removes them and says which in
    /// the job's notes.
    pub fn allow_retracting_output(mut self, allow: bool) -> Self {
        self.allow_retracting_output = allow;
        self
    }
    /// Injects failures (tests; with the `testing` feature only).
    #[cfg(feature = "testing")]
    pub fn faults(mut self, faults: Arc<FaultInjector>) -> Self {
        self.faults = Some(faults);
        self
    }

    /// Checks that `new` differs from this configuration only in what a running job can
    /// change ([`crate::JobHandle::update_checkpoints`]), and that it is valid.
    pub(crate) fn check_live_change(&self, new: &CheckpointConfig) -> Result<()> {
        let fixed = [
            ("the checkpoint directory", self.dir != new.dir),
            (
                "the checkpoint store",
                self.store.as_ref().map(|s| s.location()) != new.store.as_ref().map(|s| s.location()),
            ),
            ("the guarantee (exactly-once or at-least-once)", self.mode.exactly_once() != new.mode.exactly_once()),
            ("incremental", self.incremental != new.incremental),
            ("allow_retracting_output", self.allow_retracting_output != new.allow_retracting_output),
        ];
        if let Some((what, _)) = fixed.iter().find(|(_, changed)| *changed) {
            return Err(Error::config(format!(
                "{what} cannot change on a running job (the tasks are wired for it when the job starts); the job keeps its configuration"
            )));
        }
        new.validate().map_err(|e| Error::config(format!("{e}; the job keeps its configuration")))
    }

    /// Checks the settings, and that the directory can be created and written.
    pub fn validate(&self) -> Result<()> {
        if self.store.is_none() {
            if let Some(url) = self.dir.to_str().filter(|d| d.contains("://")) {
                return Err(Error::config(format!(
                    "checkpoint directory '{url}' is an address, not a folder: for one in an object store use \
                     CheckpointConfig::in_store(weir_object_store::open(\"{url}\")?) (the weir-object-store crate); \
                     file:///FOLDER is the folder itself"
                )));
            }
        }
        if self.interval.is_zero() {
            return Err(Error::config("the checkpoint interval must be greater than zero"));
        }
        if self.checkpoint_timeout.is_zero() {
            return Err(Error::config("the checkpoint timeout must be greater than zero"));
        }
        if self.savepoint_timeout.is_zero() {
            return Err(Error::config("the savepoint timeout must be greater than zero"));
        }
        if self.max_concurrent == 0 {
            return Err(Error::config("at least one concurrent checkpoint must be allowed"));
        }
        if self.retained == 0 {
            return Err(Error::config("at least one completed checkpoint must be retained"));
        }
        if self.changelog == Some(0) {
            return Err(Error::config(
                "a changelog's materialization interval must be at least one checkpoint (a new base after every N                  checkpoints of changes; 1 writes a base every other checkpoint)",
            ));
        }
        self.mode.check()?;
        match self.restart {
            RestartStrategy::ExponentialBackoff { multiplier, .. }
                if !(multiplier >= 1.0 && multiplier.is_finite()) =>
            {
                return Err(Error::config("the back-off multiplier must be a finite number of at least 1"));
            }
            RestartStrategy::FailureRate { interval, .. } if interval.is_zero() => {
                return Err(Error::config("the failure-rate interval must be longer than zero"));
            }
            _ => {}
        }
        check_writable(&self.dir)?;
        match &self.store {
            Some(store) => super::storage::CheckpointMirror::new(Arc::clone(store)).probe(),
            None => Ok(()),
        }
    }
}

/// A working folder of this process for checkpoints kept in the store at `location`:
/// `<tmp>/weir-checkpoints/<pid>-<n>-<location>`. Those of processes no longer running are
/// removed (a process killed leaves its own).
fn working_folder(location: &str) -> PathBuf {
    static FOLDERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let root = std::env::temp_dir().join("weir-checkpoints");
    if let Ok(entries) = std::fs::read_dir(&root) {
        for e in entries.flatten() {
            let name = e.file_name();
            let pid = name.to_str().and_then(|n| n.split('-').next()).and_then(|p| p.parse::<u32>().ok());
            let gone =
                pid.is_some_and(|p| Path::new("/proc/self").exists() && !Path::new(&format!("/proc/{p}")).exists());
            if gone {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let safe: String = location.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' { c } else { '_' }).collect();
    let n = FOLDERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    root.join(format!("{}-{n}-{safe}", std::process::id()))
}

fn check_writable(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io("cannot create the checkpoint directory", dir, e))?;
    let probe = dir.join(".weir-write-probe");
    std::fs::write(&probe, b"probe").map_err(|e| Error::io("the checkpoint directory is not writable", dir, e))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests drive the engine from outside: their threads and clocks are theirs
mod tests {
    use super::*;

    /// The failure-rate strategy forgot failures after an hour whatever its interval: with
    /// two hours, a failure 90 minutes ago and one now were one failure, and the job restarted.
    #[test]
    fn the_failure_rate_strategy_remembers_failures_over_its_whole_interval() {
        let hours = |h: f64| Duration::from_secs_f64(h * 3600.0);
        let rate = RestartStrategy::FailureRate { max_failures: 1, interval: hours(2.0), delay: Duration::ZERO };
        let start = std::time::Instant::now();
        let mut failures = Vec::new();
        let ago = RestartStrategy::remember_failure(Some(&rate), &mut failures, start);
        assert_eq!(rate.delay(0, &ago), Some(Duration::ZERO), "one failure in two hours is allowed");
        let ago = RestartStrategy::remember_failure(Some(&rate), &mut failures, start + hours(1.5));
        assert_eq!(ago, [hours(1.5), Duration::ZERO]);
        assert_eq!(rate.delay(1, &ago), None, "two failures within two hours end the job");
        // Past the interval a failure is forgotten.
        let ago = RestartStrategy::remember_failure(Some(&rate), &mut failures, start + hours(3.0));
        assert_eq!(ago, [hours(1.5), Duration::ZERO]);
        let ago = RestartStrategy::remember_failure(Some(&rate), &mut failures, start + hours(7.0));
        assert_eq!(ago, [Duration::ZERO]);
    }

    #[test]
    fn invalid_combinations_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ok = CheckpointConfig::new(dir.path());
        ok.validate().unwrap();
        let bad = [
            ok.clone().interval(Duration::ZERO),
            ok.clone().checkpoint_timeout(Duration::ZERO),
            ok.clone().max_concurrent(0),
            ok.clone().retained(0),
            ok.clone().mode(CheckpointMode::Adaptive { budget: 0 }),
            ok.clone().mode(CheckpointMode::AlignedTimeout { timeout: Duration::ZERO }),
            CheckpointConfig::new("/proc/weir-cannot-write-here"),
        ];
        for cfg in bad {
            assert!(cfg.validate().is_err(), "{cfg:?} should be refused");
        }
    }

    #[test]
    fn a_file_url_is_the_folder_and_another_address_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = CheckpointConfig::new(format!("file://{}", dir.path().display()));
        assert_eq!(cfg.dir, dir.path());
        cfg.validate().unwrap();
        let e = CheckpointConfig::new("s3://bucket/prefix").validate().unwrap_err().to_string();
        assert!(e.contains("'s3://bucket/prefix' is an address") && e.contains("in_store"), "{e}");
    }

    #[test]
    fn restart_delays() {
        let fixed = RestartStrategy::FixedDelay { attempts: 2, delay: Duration::from_millis(5) };
        assert_eq!(fixed.delay(0, &[]), Some(Duration::from_millis(5)));
        assert_eq!(fixed.delay(2, &[]), None);
        let exp = RestartStrategy::ExponentialBackoff {
            attempts: 5,
            initial: Duration::from_millis(10),
            max: Duration::from_millis(50),
            multiplier: 2.0,
        };
        let delays: Vec<_> = (0..6).map(|i| exp.delay(i, &[]).map(|d| d.as_millis())).collect();
        assert_eq!(delays, vec![Some(10), Some(20), Some(40), Some(50), Some(50), None]);
        assert_eq!(RestartStrategy::None.delay(0, &[]), None);
        let ms = Duration::from_millis;
        let rate = RestartStrategy::FailureRate { max_failures: 1, interval: ms(100), delay: ms(3) };
        // Failures far apart restart for ever; a second one within the interval ends the job.
        assert_eq!(rate.delay(1000, &[ms(500), ms(250), ms(0)]), Some(ms(3)));
        assert_eq!(rate.delay(2, &[ms(500), ms(100), ms(0)]), None);
    }
}
