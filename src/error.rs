//! The one error type of weir's operating errors.
//!
//! Broken invariants panic; everything a user or the environment can cause (bad configuration,
//! I/O, a panicking user function) is an [`Error`]. [`Error::is_retryable`] tells a caller
//! whether trying again can help: the runtime restarts a failed job only for a retryable one,
//! and the hooks that run when a job succeeds (a sink's final commit) retry only those.
//!
//! May touch: nothing else in the crate.

use std::fmt;
use std::path::PathBuf;

/// Result alias used across weir.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every operating error weir reports.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A configuration value or a job graph is invalid; the message names the problem.
    InvalidConfig(String),
    /// An I/O operation failed; `context` says what weir was doing, `path` where.
    Io {
        /// What weir was doing.
        context: String,
        /// The file or folder involved, if any.
        path: Option<PathBuf>,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A user function (or a built-in operator) panicked inside a subtask.
    OperatorPanicked {
        /// The operator's name.
        operator: String,
        /// The subtask index, from 0.
        subtask: usize,
        /// The panic message.
        message: String,
    },
    /// Stored data (a checkpoint file) is damaged or of another format; the message says how.
    Corrupt(String),
    /// A checkpoint could not be taken (declined, expired or failed); the message says why.
    Checkpoint(String),
    /// The job was cancelled before it finished.
    Cancelled,
    /// A checkpoint's or savepoint's state for an operator does not decode as the operator's
    /// types now (a record, key or accumulator type changed in a way that is not allowed: see
    /// `weir::persist`). Not retryable: nothing is restored.
    IncompatibleState {
        /// The job's name.
        job: String,
        /// The operator whose state it is.
        operator: String,
        /// The checkpoint restored from (`None`: a savepoint given to start from).
        checkpoint: Option<u64>,
        /// What did not decode.
        detail: String,
    },
    /// This process no longer owns its checkpoint directory (another process took it over):
    /// it must not complete checkpoints or commit output. Not retryable.
    Fenced(String),
    /// Recovery fell back past damaged checkpoints, and a sink's output committed under them
    /// cannot be withdrawn (a Kafka topic): resuming would write it twice. Refused, naming
    /// them; nothing was written. Not retryable.
    OutputCannotBeWithdrawn(String),
    /// A checkpoint directory (or object-store prefix) another process holds now: its lock is
    /// taken, or it claimed the prefix at the same moment. The message names the holder.
    InUse(String),
    /// A peer (the control endpoint, for the command) refused the connection or accepted it
    /// and never answered; the message names it.
    Unreachable(String),
    /// What is there refused the request: a checkpoint directory whose job completed, or the
    /// control endpoint's answer. The message says why.
    Refused(String),
}

impl Error {
    /// Builds an [`Error::Io`] for `path`.
    pub fn io(context: impl Into<String>, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { context: context.into(), path: Some(path.into()), source }
    }

    /// Builds an [`Error::InvalidConfig`].
    pub fn config(message: impl Into<String>) -> Self {
        Error::InvalidConfig(message.into())
    }

    /// Whether the same operation may succeed if tried again (I/O can; a bad config cannot).
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Io { .. } | Error::OperatorPanicked { .. } | Error::Checkpoint(_))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidConfig(m) => write!(f, "invalid configuration: {m}"),
            Error::Io { context, path: Some(p), source } => {
                write!(f, "{context} ({}): {source}", p.display())
            }
            Error::Io { context, path: None, source } => write!(f, "{context}: {source}"),
            Error::OperatorPanicked { operator, subtask, message } => {
                write!(f, "operator '{operator}' (subtask {subtask}) panicked: {message}")
            }
            Error::Corrupt(m) => write!(f, "damaged data: {m}"),
            Error::Checkpoint(m) => write!(f, "checkpoint failed: {m}"),
            Error::Cancelled => write!(f, "the job was cancelled"),
            Error::Fenced(m) => write!(f, "lost ownership of the checkpoint directory: {m}"),
            Error::OutputCannotBeWithdrawn(m) => write!(f, "{m}"),
            Error::InUse(m) => write!(f, "in use: {m}"),
            Error::Unreachable(m) => write!(f, "unreachable: {m}"),
            Error::Refused(m) => write!(f, "refused: {m}"),
            Error::IncompatibleState { job, operator, checkpoint, detail } => {
                let from = checkpoint.map_or_else(|| "the savepoint".to_string(), |c| format!("checkpoint {c}"));
                write!(
                    f,
                    "cannot restore job '{job}' from {from}: the state of operator '{operator}' does not decode as \
                     its types now: {detail} (a type may only gain trailing #[persist(default)] fields and new enum \
                     variants at the end; see weir::persist)"
                )
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// The value of `all` whose name (its `Display`) is `s`, or a message listing every name:
/// "'x' is not {what} (a, b, c)". For command-line choices, so the list can never drift from
/// the values.
#[doc(hidden)] // for weir's own crates (weir-jobs)
pub fn one_of<T: fmt::Display + Copy>(all: &[T], s: &str, what: &str) -> std::result::Result<T, String> {
    all.iter().copied().find(|v| v.to_string() == s).ok_or_else(|| {
        let names: Vec<String> = all.iter().map(T::to_string).collect();
        format!("'{s}' is not {what} ({})", names.join(", "))
    })
}
