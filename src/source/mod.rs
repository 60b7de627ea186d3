//! Sources: where records enter a job. Each source subtask is polled by its worker and appends
//! at most a batch of records per poll.
//!
//! - `generator`: deterministic, seekable by index, optional rate limit.
//! - `text`: lines of a file or of a folder of files, split by byte ranges over the subtasks.
//! - `push`: the embedding API, a lock-free ring from a host thread into the job, replayed after
//!   failovers from a bounded buffer.
//!
//! May touch: `channel` (the push source's ring entries), `context`, `error`, `record`, `wake`,
//! `persist`.

mod generator;
mod push;
mod text;

pub use generator::Generator;
pub(crate) use push::push_channel;
pub use push::{Closing, EventSender, ResumePoint, SendError, Sending, DEFAULT_REPLAY_EVENTS};
pub(crate) use text::{lines_in, TextBlocks};
pub use text::{TextSource, TEXT_BACKLOG_BYTES};

use crate::context::TaskContext;
use crate::error::Result;

/// What one poll of a source achieved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourcePoll {
    /// Records were appended (possibly none, if more may come at once).
    Emitted,
    /// Nothing is available now (a rate limit, or an empty push ring); poll again later.
    Idle,
    /// The source has ended; nothing follows.
    Finished,
}

/// One subtask of a source.
pub trait Source<T>: Send {
    /// Appends up to `max` records to `out`.
    fn poll(&mut self, ctx: &TaskContext, out: &mut Vec<T>, max: usize) -> Result<SourcePoll>;

    /// The position to replay from after recovery: everything emitted so far is before it.
    /// `None` for sources that cannot replay (such a job restarts them from scratch).
    fn offset(&self) -> Option<Vec<u8>> {
        None
    }

    /// The job is being stopped ([`crate::JobHandle::stop`], Ctrl-C): append what the source
    /// holds back waiting for more input (a followed log's last line, still without its
    /// newline, say). Called once, after the last [`Source::poll`].
    fn on_stop(&mut self, _ctx: &TaskContext, _out: &mut Vec<T>) -> Result<()> {
        Ok(())
    }

    /// Whether the source can replay from a checkpoint: by default, whether it has an
    /// [`Source::offset`] when the job starts. A job with exactly-once checkpoints refuses to
    /// start with a source that cannot (it would restart from scratch after a failover).
    fn replayable(&self) -> bool {
        self.offset().is_some()
    }

    /// How many of the input's records `emitted` (what one poll appended) holds, for the job's
    /// `source_records` (the metrics' records from sources): one per element by default. A
    /// source that hands over blocks of several (the word count's text, lines in blocks) counts
    /// what they hold, so the figure reads as the input's own.
    fn records_in(&self, emitted: &[T]) -> u64 {
        emitted.len() as u64
    }

    /// Checkpoint `id` completed, which recorded `offset` (what [`Source::offset`] returned at
    /// its barrier): nothing before `offset` will be replayed again, so a source that buffers
    /// events for replay may drop them.
    fn checkpoint_complete(&mut self, _id: u64, _offset: &[u8]) {}

    /// Whether the source is catching up on a backlog (far behind the newest input it could
    /// read), asked after every poll. While any source is, checkpoints come at
    /// [`crate::checkpoint::CheckpointConfig::interval_during_backlog`] (Flink's `isProcessingBacklog`).
    /// The text source reports one while more than [`TEXT_BACKLOG_BYTES`] of its range are
    /// left; a push source while its host ring is full.
    fn backlog(&self) -> bool {
        false
    }

    /// The source's own watermark, asked after every poll: everything it emits later has a
    /// timestamp above it (a source that reads several partitions, each in
    /// order, knows this better than an operator after it: Flink's per-partition
    /// watermarks). `None` (the default) leaves watermarks to the stream
    /// ([`crate::Stream::with_watermarks`]). The task emits it when it advances.
    fn watermark(&self) -> Option<crate::record::Timestamp> {
        None
    }

    /// Moves to a position returned by [`Source::offset`].
    fn seek(&mut self, _offset: &[u8]) -> Result<()> {
        Err(crate::Error::config("this source cannot be replayed from a checkpoint"))
    }

    /// Restarts from the offsets every subtask had at another parallelism (`parts`, by old
    /// subtask): this subtask (of `parallelism`) takes over its share of what is left.
    fn seek_rescaled(&mut self, _parts: &[(usize, &[u8])], _subtask: usize, _parallelism: usize) -> Result<()> {
        Err(crate::Error::config("this source cannot be restored at another parallelism"))
    }

    /// The source's position is settled: restored from a checkpoint ([`Source::seek`]) or a
    /// fresh start. Called once per attempt, before the first [`Source::poll`] and whatever
    /// the rest of the job is doing (a push source tells its host where to resume here, so a
    /// host waiting for that before it drains a full sink is never deadlocked).
    fn restored(&mut self) {}
}
