//! Where a [`Stream`] ends: a sink of the user's, discard, collect, file sinks (plain,
//! transactional, partitioned) and the pull sink an embedding program reads.
//!
//! May touch: `channel`, `context`, `error`, `record`, `sink`.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::context::TaskContext;
use crate::error::Result;
use crate::record::Record;
use crate::sink::{
    pull_channel, CollectSink, CommittedOutput, DiscardSink, EventReceiver, FileSink, Guarantee, PartitionedFileSink,
    Sink, TransactionalCollectSink, TwoPhaseFileSink,
};

use super::*;

impl<T: Record> Stream<T> {
    /// Sends the stream to a sink made once per subtask.
    pub fn sink<S: Sink<T> + 'static, MS: Fn(&TaskContext) -> Result<S> + Send + 'static>(self, make: MS) {
        self.sink_node("sink", make);
    }

    /// Drops every record (counting them).
    pub fn discard(self) {
        self.sink_node("discard", |_| Ok(DiscardSink));
    }

    /// Collects every record into the returned vector (for tests and small jobs).
    pub fn collect(self) -> Arc<Mutex<Vec<T>>> {
        let out = Arc::new(Mutex::new(Vec::new()));
        let o = Arc::clone(&out);
        self.sink_node("collect", move |_| Ok(CollectSink::new(Arc::clone(&o))));
        out
    }

    /// Collects records through a two-phase-commit sink: they become visible in the returned
    /// [`CommittedOutput`] only when the checkpoint after them completes (or the job finishes),
    /// so exactly-once holds across failures.
    pub fn collect_exactly_once(self) -> CommittedOutput<T> {
        let out = CommittedOutput::new();
        let o = out.clone();
        self.sink_node("collect-exactly-once", move |ctx| Ok(TransactionalCollectSink::new(o.clone(), ctx.clone())));
        out
    }

    /// Writes every record, formatted by `format`, to `<dir>/part-<subtask>`.
    pub fn write_files<F: Fn(&T, &mut Vec<u8>) + Clone + Send + 'static>(self, dir: impl Into<PathBuf>, format: F) {
        let dir = dir.into();
        self.writes_to(
            self.sink_node("file-sink", {
                let dir = dir.clone();
                move |ctx| FileSink::create(&dir, ctx.subtask, format.clone())
            }),
            &dir,
        );
    }

    /// Writes each record, formatted by `format`, to files in `dir` committed by two-phase
    /// commit: one transaction per checkpoint and subtask, in a hidden file until its
    /// checkpoint completes, then renamed to `part-<subtask>-<checkpoint>`. Every visible file
    /// is committed output; with exactly-once checkpoints each record is in exactly one of
    /// them, whatever failures happen (see [`TwoPhaseFileSink`]). The sink owns the files
    /// named `part-<n>-<n>` and `.part-<n>-…` in `dir`: a fresh start deletes them.
    pub fn write_files_transactional<F: Fn(&T, &mut Vec<u8>) + Clone + Send + 'static>(
        self,
        dir: impl Into<PathBuf>,
        format: F,
    ) {
        let dir = dir.into();
        self.writes_to(
            self.sink_node("file-sink", {
                let dir = dir.clone();
                move |ctx| TwoPhaseFileSink::create(&dir, ctx, format.clone())
            }),
            &dir,
        );
    }

    /// Writes each record, formatted by `format`, to `<dir>/<partition>/part-<subtask>`, where
    /// `partition` writes the record's partition: a relative folder path such as
    /// `dt=2026-12-02/hm=10:05` (see [`PartitionedFileSink`]; exactly-once as
    /// [`Stream::write_files`] is). A partition that would leave `dir` is an error.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// use weir::source::Generator;
    /// let job = weir::Job::new("by-parity");
    /// job.generator(Generator::new(|i, _| i + 1).count(3)).write_files_partitioned(
    ///     dir.path(),
    ///     |n: &u64, p: &mut String| p.push_str(if n % 2 == 0 { "even" } else { "odd" }),
    ///     |n: &u64, out: &mut Vec<u8>| out.extend_from_slice(format!("{n}\n").as_bytes()),
    /// );
    /// job.execute(weir::RunConfig::default().workers(1)).unwrap();
    /// assert_eq!(std::fs::read_to_string(dir.path().join("odd/part-0")).unwrap(), "1\n3\n");
    /// ```
    pub fn write_files_partitioned<P, F>(self, dir: impl Into<PathBuf>, partition: P, format: F)
    where
        P: Fn(&T, &mut String) + Clone + Send + 'static,
        F: Fn(&T, &mut Vec<u8>) + Clone + Send + 'static,
    {
        let dir = dir.into();
        let node = self.sink_node("partitioned-file-sink", {
            let dir = dir.clone();
            move |ctx| PartitionedFileSink::create(&dir, ctx.subtask, partition.clone(), format.clone())
        });
        self.writes_to(node, &dir);
    }

    /// Sends every record to the host through the returned [`EventReceiver`] at once
    /// ([`Guarantee::AtLeastOnce`]; see [`Stream::pull_sink_with`]). The sink gets parallelism
    /// 1; a host that does not keep up backpressures the job once `capacity` results wait.
    pub fn pull_sink(self, capacity: usize) -> EventReceiver<T> {
        self.pull_sink_with(capacity, Guarantee::AtLeastOnce)
    }

    /// Sends every record to the host with the given guarantee: exactly-once (released when
    /// the checkpoint after them completes) or at-least-once (at once, numbered so a host can
    /// drop replays). Either survives failovers: the receiver stays attached.
    pub fn pull_sink_with(self, capacity: usize, guarantee: Guarantee) -> EventReceiver<T> {
        let (factory, rx) = pull_channel::<T>(capacity, guarantee);
        self.graph.borrow_mut().host_signals.push(factory.signal());
        self.graph.borrow_mut().host_deliveries.push(factory.delivery());
        let single = if self.parallelism() == 1 { self } else { self.rebalance().set_parallelism(1) };
        single.sink_node("pull-sink", move |ctx| Ok(factory.make(ctx)));
        rx
    }
}
