//! What a simulation is asked: the checkpoint mode and the options of a run
//! ([`SimOptions`]), and what its output must be against the failure-free run's ([`Expect`]).
//!
//! May touch: `checkpoint`, `error`.

use std::fmt;

use crate::checkpoint::ModeKind;

/// How to simulate.
#[derive(Clone, Copy, Debug)]
pub struct SimOptions {
    /// The checkpoint mode.
    pub mode: ModeKind,
    /// Incremental checkpoints.
    pub incremental: bool,
    /// Changelog checkpoints (a new base due after every two checkpoints of changes and
    /// materialized in the background, so short runs go through bases, segments, adopted
    /// bases and chains cut by failures).
    pub changelog: bool,
    /// Steps after which a run that has not finished counts as stuck.
    pub max_steps: u64,
    /// Also draw rescales: the process dies and the job starts again from its latest
    /// checkpoint at another parallelism (1 to 4), in a new directory, so a checkpoint's state
    /// and in-flight data are redistributed. Only for a job whose output does not depend on its
    /// parallelism.
    pub rescale: bool,
    /// Keyed state within this many bytes of memory ([`crate::RunConfig::state_memory`]): a
    /// budget of a few pages sends pages out and back all the time, and the seed may fail a
    /// spill write. `None`: all state in memory.
    pub state_memory: Option<u64>,
    /// Restore from the copy of the newest checkpoint kept in memory where it applies (on by
    /// default, as for a job); off, every restore reads files.
    pub local_recovery: bool,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            mode: ModeKind::Aligned,
            incremental: false,
            changelog: false,
            max_steps: 3_000_000,
            rescale: false,
            state_memory: None,
            local_recovery: true,
        }
    }
}

/// A comparison of one's own: (golden, got), both sorted; `Err` says what differs.
pub type OutputCheck<T> = dyn Fn(&[T], &[T]) -> std::result::Result<(), String>;

/// How a seed's output is compared with the golden run's.
pub enum Expect<T> {
    /// The same records, as many times each (exactly-once).
    Equal,
    /// Every golden record at least once (at-least-once).
    NothingMissing,
    /// A check of one's own: `Err` says what differs.
    Custom(Box<OutputCheck<T>>),
}

impl<T: Ord + Clone + fmt::Debug> Expect<T> {
    /// What a mode promises: equal output under exactly-once, nothing missing otherwise.
    pub fn of(mode: ModeKind) -> Expect<T> {
        if mode.exactly_once() {
            Expect::Equal
        } else {
            Expect::NothingMissing
        }
    }

    /// `golden` and `got` sorted.
    pub(super) fn check(&self, golden: &[T], got: &[T]) -> std::result::Result<(), String> {
        match self {
            Expect::Equal => {
                if golden == got {
                    return Ok(());
                }
                let (missing, extra) = difference(golden, got);
                Err(format!(
                    "{} records instead of {}: {} missing (first {:?}), {} extra (first {:?})",
                    got.len(),
                    golden.len(),
                    missing.len(),
                    missing.first(),
                    extra.len(),
                    extra.first()
                ))
            }
            Expect::NothingMissing => {
                let (missing, _) = difference(golden, got);
                let missing: Vec<&T> = missing.into_iter().filter(|m| got.binary_search(m).is_err()).collect();
                match missing.first() {
                    None => Ok(()),
                    Some(first) => Err(format!("{} golden records missing (first {first:?})", missing.len())),
                }
            }
            Expect::Custom(f) => f(golden, got),
        }
    }
}

/// The records of sorted `a` that sorted `b` lacks, and those of `b` that `a` lacks (as
/// multisets).
fn difference<'a, T: Ord>(a: &'a [T], b: &'a [T]) -> (Vec<&'a T>, Vec<&'a T>) {
    let (mut i, mut j) = (0, 0);
    let (mut only_a, mut only_b) = (Vec::new(), Vec::new());
    while i < a.len() || j < b.len() {
        match (a.get(i), b.get(j)) {
            (Some(x), Some(y)) if x == y => {
                i += 1;
                j += 1;
            }
            (Some(x), Some(y)) if x < y => {
                only_a.push(x);
                i += 1;
            }
            (Some(_), Some(y)) | (None, Some(y)) => {
                only_b.push(y);
                j += 1;
            }
            (Some(x), None) => {
                only_a.push(x);
                i += 1;
            }
            (None, None) => unreachable!(),
        }
    }
    (only_a, only_b)
}

// Their fields are closures, shared internals or whole state: a name says enough.
crate::debug_as_name!([T] Expect<T>);
