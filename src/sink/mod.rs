//! Sinks: where records leave a job. A [`Sink`] receives batches; the runtime wraps it in an
//! operator that counts records for the job's metrics and calls [`Sink::finish`] at end of
//! stream.
//!
//! - [`DiscardSink`]: drops everything (benchmarks).
//! - [`CollectSink`]: collects into a shared `Vec` (tests).
//! - `transactional`: collects exactly once, committing per checkpoint ([`CommittedOutput`]).
//! - [`FileSink`]: one file per subtask, each record formatted by a function.
//! - [`PartitionedFileSink`]: one file per subtask and partition (a folder chosen per record,
//!   as `dt=…/hm=…`), exactly once as [`FileSink`] is.
//! - [`TwoPhaseFileSink`]: files committed per checkpoint (two-phase commit), exactly once.
//! - [`LatestPerKeySink`]: the latest record per key, rewritten idempotently.
//! - `pull`: the embedding API, results handed to a host thread or async task through a queue
//!   that outlives failovers, exactly-once or at-least-once.
//!
//! May touch: `channel` (the pull sink's ring), `collector`, `context`, `error`, `metrics`,
//! `persist`, `record`, `snapshot`, `wake`, `state`.

mod latest;
mod partitioned;
mod pull;
mod transactional;
mod two_phase;

pub use latest::LatestPerKeySink;
pub use partitioned::{partition_files, PartitionedFileSink};
pub(crate) use pull::{pull_channel, HostDelivery};
pub use pull::{AckError, Delivered, EventReceiver, Guarantee, Recv, RecvError};
pub use transactional::CommittedOutput;
pub(crate) use transactional::TransactionalCollectSink;
pub use two_phase::{committed_name, TwoPhaseFileSink};

use std::fs::File;
use std::io::{Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::collector::Collector;
use crate::error::{Error, Result};
use crate::metrics::Counter;
use crate::persist::from_bytes;
use crate::record::Timestamp;
use crate::snapshot::{Barrier, CheckpointNotice, ForkedState, PersistedFork};

/// The id of a sink's final transaction: after every checkpoint (committed when the job
/// succeeds).
pub(crate) const FINAL_TXN: u64 = u64::MAX;

/// The pre-committed transactions `(id, data)` (oldest first) that checkpoint `id`'s completion
/// commits: every one up to it (an aborted checkpoint's transaction is still valid and goes
/// with the next completed one), taken out of `pending`.
pub(crate) fn committed_by<X>(pending: &mut Vec<(u64, X)>, id: u64) -> std::vec::Drain<'_, (u64, X)> {
    let split = pending.partition_point(|(txn, _)| *txn <= id);
    pending.drain(..split)
}

/// One subtask of a sink: where records leave the job. [`crate::Stream::sink`] makes one per
/// subtask.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
/// use weir::{sink::Sink, source::Generator, Job, RunConfig};
///
/// /// Adds up what it receives.
/// struct Total(Arc<AtomicU64>);
/// impl Sink<u64> for Total {
///     fn write(&mut self, records: &mut Vec<u64>) -> weir::Result<()> {
///         self.0.fetch_add(records.drain(..).sum::<u64>(), Ordering::Relaxed);
///         Ok(())
///     }
/// }
///
/// let total = Arc::new(AtomicU64::new(0));
/// let job = Job::new("total").with_parallelism(2);
/// let shared = total.clone();
/// job.generator(Generator::new(|i, _| i).count(100)).sink(move |_| Ok(Total(shared.clone())));
/// job.execute(RunConfig::default().workers(2)).unwrap();
/// assert_eq!(total.load(Ordering::Relaxed), (0..100u64).sum::<u64>());
/// ```
pub trait Sink<T>: Send {
    /// Takes every record out of `records`.
    fn write(&mut self, records: &mut Vec<T>) -> Result<()>;
    /// The input ended: make everything durable.
    fn finish(&mut self) -> Result<()> {
        Ok(())
    }
    /// Pushes output held back by a full buffer; `true` when nothing is held back.
    fn drain(&mut self) -> Result<bool> {
        Ok(true)
    }
    /// Checkpoint `checkpoint`'s barrier arrived: pre-commit (make this checkpoint's output
    /// durable but not visible) and return what must be in the snapshot to commit it later.
    /// The slow part of a pre-commit (an fsync) may be left to the returned state, which the
    /// background writer writes before the checkpoint can complete.
    fn pre_commit(&mut self, _checkpoint: u64) -> Result<Option<Box<dyn ForkedState>>> {
        Ok(None)
    }
    /// The coordinator decided a checkpoint's fate: commit on completion.
    fn notify(&mut self, _notice: CheckpointNotice) -> Result<()> {
        Ok(())
    }
    /// Restart from a checkpoint: `bytes` is what [`Sink::pre_commit`] captured; commit it.
    fn restore(&mut self, _bytes: &[u8]) -> Result<()> {
        Ok(())
    }
    /// Restart at another parallelism: `parts` are what every old subtask pre-committed (by
    /// old subtask); `scope` says which subtask this is now, of how many, and (after a key-by)
    /// which key groups it owns. Sinks that cannot take over other subtasks' transactions
    /// refuse.
    fn restore_rescaled(&mut self, _parts: &[(usize, &[u8])], _scope: &crate::record::KeyScope) -> Result<()> {
        Err(Error::config("this sink cannot be restored at another parallelism"))
    }
}

/// Adapts a [`Sink`] to the collector chain and counts what it receives.
pub(crate) struct SinkOperator<S> {
    sink: S,
    counter: Arc<Counter>,
}

impl<S> SinkOperator<S> {
    pub(crate) fn new(sink: S, counter: Arc<Counter>) -> Self {
        SinkOperator { sink, counter }
    }
}

impl<T, S: Sink<T>> Collector<T> for SinkOperator<S> {
    #[inline]
    fn batch(&mut self, records: &mut Vec<T>) -> Result<()> {
        self.counter.add(records.len() as u64);
        self.sink.write(records)
    }
    fn watermark(&mut self, _: Timestamp) -> Result<()> {
        Ok(())
    }
    fn end(&mut self) -> Result<()> {
        self.sink.finish()
    }
    fn drain(&mut self) -> Result<bool> {
        self.sink.drain()
    }
    fn notify(&mut self, notice: CheckpointNotice) -> Result<()> {
        self.sink.notify(notice)
    }
    fn snapshot_state(&mut self, barrier: &Barrier) -> Result<Option<Box<dyn ForkedState>>> {
        self.sink.pre_commit(barrier.id)
    }
    fn restore_state(&mut self, bytes: &[u8]) -> Result<()> {
        self.sink.restore(bytes)
    }
    fn restore_rescaled(&mut self, parts: &[(usize, &[u8])], scope: &crate::record::KeyScope) -> Result<()> {
        self.sink.restore_rescaled(parts, scope)
    }
}

/// Drops every record.
#[derive(Default, Clone, Copy)]
pub struct DiscardSink;

impl<T> Sink<T> for DiscardSink {
    #[inline]
    fn write(&mut self, records: &mut Vec<T>) -> Result<()> {
        records.clear();
        Ok(())
    }
}

/// Collects every record into a shared vector (for tests and small jobs). The lock is taken
/// once per batch.
pub struct CollectSink<T> {
    into: Arc<Mutex<Vec<T>>>,
}

impl<T> CollectSink<T> {
    /// Collects into `into`.
    pub fn new(into: Arc<Mutex<Vec<T>>>) -> Self {
        CollectSink { into }
    }
}

impl<T: Send> Sink<T> for CollectSink<T> {
    fn write(&mut self, records: &mut Vec<T>) -> Result<()> {
        self.into.lock().unwrap_or_else(|e| e.into_inner()).append(records);
        Ok(())
    }
}

/// Writes each record as formatted bytes to `<dir>/part-<subtask>`.
///
/// With checkpointing, the file is flushed and fsynced on every barrier and its length is the
/// sink's state; a restart truncates the file back to the length of the restored checkpoint,
/// so what follows is written exactly once. (Readers may see output that a failure later takes
/// back; the two-phase-commit file sink hides it until commit.)
pub struct FileSink<F> {
    path: PathBuf,
    /// Opened on first use: truncated for a fresh start, or cut back to the checkpointed
    /// length by [`Sink::restore`].
    out: Option<File>,
    format: F,
    /// Formatted records not yet handed to the file (see [`OUTPUT_BUFFER_BYTES`]).
    line: Vec<u8>,
    /// Bytes formatted so far, buffered ones included.
    written: u64,
}

/// File sinks format records straight into their own buffer and hand it to the file in
/// pieces of about this size: the bytes are copied once (into the page cache), not a second
/// time into a `BufWriter`.
pub(crate) const OUTPUT_BUFFER_BYTES: usize = 256 * 1024;

/// Formats every record of `records` (taking them out) onto the end of `buffer`.
#[inline]
pub(crate) fn format_into<T>(records: &mut Vec<T>, format: &mut impl FnMut(&T, &mut Vec<u8>), buffer: &mut Vec<u8>) {
    for r in records.drain(..) {
        format(&r, buffer);
    }
}

impl<F> FileSink<F> {
    /// A sink writing `<dir>/part-<subtask>` (creating `dir`); an old file is replaced.
    pub fn create(dir: &Path, subtask: usize, format: F) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("cannot create output folder", dir, e))?;
        let path = dir.join(format!("part-{subtask}"));
        Ok(FileSink { path, out: None, format, line: Vec::new(), written: 0 })
    }

    /// The output file, created on first use.
    fn file(&mut self) -> Result<&mut File> {
        if self.out.is_none() {
            let file = File::create(&self.path).map_err(|e| Error::io("cannot create output file", &self.path, e))?;
            self.out = Some(file);
        }
        Ok(self.out.as_mut().expect("just opened"))
    }

    /// Hands the buffered output to the file.
    fn write_out(&mut self) -> Result<()> {
        self.file()?;
        let file = self.out.as_mut().expect("opened above");
        write_buffer(file, &self.path, &mut self.line)
    }

    fn sync(&mut self) -> Result<()> {
        self.write_out()?;
        let file = self.out.as_ref().expect("opened by write_out");
        file.sync_all().map_err(|e| Error::io("cannot sync output file", &self.path, e))
    }
}

/// Reopens a file sink's output file `path` and cuts it back to the `len` bytes a checkpoint
/// recorded (what followed, the replay writes again). A file shorter than that is damage.
pub(crate) fn cut_back(path: &Path, len: u64) -> Result<File> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| Error::io("cannot reopen output file", path, e))?;
    let on_disk = file.metadata().map_err(|e| Error::io("cannot read output file", path, e))?.len();
    if on_disk < len {
        // Shorter than the checkpoint says: damage, not something to pad with zeros.
        return Err(Error::Corrupt(format!("{} holds {on_disk} bytes; the checkpoint recorded {len}", path.display())));
    }
    file.set_len(len).map_err(|e| Error::io("cannot truncate output file", path, e))?;
    Ok(file)
}

/// Hands a file sink's formatted output in `buffer` to `file` (named `path` in errors) and
/// empties the buffer.
pub(crate) fn write_buffer(file: &mut File, path: &Path, buffer: &mut Vec<u8>) -> Result<()> {
    let result = file.write_all(buffer).map_err(|e| Error::io("cannot write output file", path, e));
    buffer.clear();
    result
}

impl<T, F: FnMut(&T, &mut Vec<u8>) + Send> Sink<T> for FileSink<F> {
    fn write(&mut self, records: &mut Vec<T>) -> Result<()> {
        let before = self.line.len();
        format_into(records, &mut self.format, &mut self.line);
        self.written += (self.line.len() - before) as u64;
        if self.line.len() >= OUTPUT_BUFFER_BYTES {
            self.write_out()?;
        }
        Ok(())
    }
    fn finish(&mut self) -> Result<()> {
        self.sync()
    }
    fn pre_commit(&mut self, _checkpoint: u64) -> Result<Option<Box<dyn ForkedState>>> {
        self.sync()?;
        Ok(Some(Box::new(PersistedFork(self.written))))
    }
    fn restore(&mut self, bytes: &[u8]) -> Result<()> {
        let len: u64 = from_bytes(bytes)?;
        let path = &self.path;
        let mut file = cut_back(path, len)?;
        file.seek(std::io::SeekFrom::Start(len)).map_err(|e| Error::io("cannot seek output file", path, e))?;
        self.out = Some(file);
        self.line.clear();
        self.written = len;
        Ok(())
    }
}

// Their fields are closures, shared internals or whole state: a name says enough.
crate::debug_as_name!([] DiscardSink);
crate::debug_as_name!([T] CollectSink<T>);
crate::debug_as_name!([F] FileSink<F>);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_sink_writes_formatted_records() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = FileSink::create(dir.path(), 3, |r: &u32, out: &mut Vec<u8>| {
            out.extend_from_slice(format!("{r}\n").as_bytes())
        })
        .unwrap();
        s.write(&mut vec![1, 2]).unwrap();
        s.finish().unwrap();
        assert_eq!(std::fs::read_to_string(dir.path().join("part-3")).unwrap(), "1\n2\n");
    }
}
