//! Partitioning: which downstream subtask gets a record.
//!
//! `key_by` hashes the key, maps the hash to one of `max_parallelism` key groups and the key
//! group to a subtask by contiguous ranges (as Flink does), so keyed state can later be
//! redistributed by whole key groups when parallelism changes.

use crate::record::{key_group, subtask_of_key_group};

/// How an edge spreads records over the downstream subtasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Partitioning {
    /// Subtask i sends to subtask i (same parallelism); such edges are chained when possible.
    Forward,
    /// Each key goes to the subtask that owns its key group.
    KeyBy,
    /// Whole batches go round-robin to the downstream subtasks.
    Rebalance,
    /// Every record goes to every downstream subtask.
    Broadcast,
}

/// Routes a key hash to a downstream subtask through a precomputed key-group table.
#[derive(Clone, Debug)]
pub(crate) struct KeyRouter {
    max_parallelism: usize,
    subtask_of_group: Vec<u16>,
}

impl KeyRouter {
    pub(crate) fn new(max_parallelism: usize, parallelism: usize) -> KeyRouter {
        assert!(parallelism >= 1 && parallelism <= max_parallelism);
        assert!(max_parallelism <= u16::MAX as usize);
        let subtask_of_group =
            (0..max_parallelism).map(|g| subtask_of_key_group(g, max_parallelism, parallelism) as u16).collect();
        KeyRouter { max_parallelism, subtask_of_group }
    }

    #[inline]
    pub(crate) fn subtask(&self, hash: u64) -> usize {
        let group = key_group(hash, self.max_parallelism);
        debug_assert!(group < self.subtask_of_group.len());
        // SAFETY: `key_group` maps into `0 .. max_parallelism` (a multiply-shift by it), and the
        // table has one entry per key group (`new`).
        (unsafe { *self.subtask_of_group.get_unchecked(group) }) as usize
    }

    /// The number of subtasks routed to.
    pub(crate) fn parallelism(&self) -> usize {
        self.subtask_of_group.iter().map(|&s| s as usize + 1).max().unwrap_or(1)
    }
}

/// The routing a [`super::ChannelWriter`] applies. `H` hashes a record's key; it is a type
/// parameter, not a boxed closure, so the per-record hash is inlined into the routing loop.
pub(crate) enum Partitioner<H> {
    Forward,
    Rebalance { next: usize },
    Broadcast,
    KeyBy { hash: H, router: KeyRouter },
}
