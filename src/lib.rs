//! # weir
//!
//! A single-node stream processor on a thread-per-core runtime, built around Apache Flink's
//! fault-tolerance model (asynchronous barrier snapshots: Carbone et al. 2015, after Chandy and
//! Lamport 1985). This crate doc is the architecture doc.
//!
//! ## How records flow
//!
//! A [`Job`] is a graph of operators, each with a parallelism. Consecutive operators joined by a
//! forward edge with equal parallelism are *chained*: fused into one task as nested
//! [`Collector`] calls, with no ring between them. Every other edge between two subtasks is one
//! lock-free SPSC ring (`rtrb`) carrying tagged [`channel::Entry`]s: records, watermarks, end of
//! stream. `key_by` hashes a key to one of `max_parallelism` key groups and the key group to a
//! subtask, as Flink does. Records that cross rings are any owned [`Record`] type (a `String`, an enum with
//! data), moved into the ring and out of it with no serialisation; text may use the compact
//! [`Word`].
//!
//! Each subtask belongs to one worker thread, one per core, pinned. A worker polls its tasks and
//! processes whole batches run-to-completion: no locks, no allocation and no system calls per
//! record. A full ring is backpressure: the producing task stops taking input and its worker
//! serves its other tasks. An idle worker spins, yields, then parks until woken.
//!
//! ## How a barrier flows
//!
//! The checkpoint coordinator ([`checkpoint`]; a state machine behind a thread of its own)
//! triggers checkpoint *n* at every source subtask through its control inbox. The source
//! records its offset, snapshots its chain and puts barrier *n* into each output ring behind
//! everything it emitted — or, for an unaligned checkpoint, into each ring's priority slot,
//! overtaking the data still in the ring. At a task with inputs, [`barrier`] takes over:
//!
//! - **aligned, exactly-once**: each channel that delivers barrier *n* is blocked; once every
//!   live channel has, the task snapshots its chain (each operator forks its state), forwards
//!   the barrier and unblocks. At-least-once only counts the barriers, blocking nothing.
//! - **unaligned**: the first priority barrier snapshots at once and forwards the barrier
//!   unaligned; the data each producer wrote before its barrier and this task reads after the
//!   snapshot (and what a restored gate has yet to replay) is captured as in-flight data.
//! - **aligned with a timeout**: an alignment that waits too long switches to unaligned there.
//!
//! A task's snapshots, and so its barriers downstream, go in checkpoint order. The snapshot's
//! writing runs in the background ([`checkpoint`]'s `SnapshotWriter`: rayon's pool, bounded),
//! then the task acknowledges to the coordinator — or declines, with an [`Error`] that says
//! whether a later checkpoint may succeed. When every task has acknowledged, the coordinator
//! writes `_metadata` atomically, reads the checkpoint back, retires old ones and tells every
//! task it completed: two-phase-commit sinks commit then. A checkpoint that expires or is
//! declined is aborted, and the tasks drop their part of it.
//!
//! After a failure, recovery ([`checkpoint`]) finds the newest checkpoint that verifies; every
//! task restores its operators' state and replays its in-flight data, and the sources resume
//! from their offsets. [`simulation`] runs all of this on one thread from a seed, with a clock
//! it moves and failures it injects, against the failure-free run.
//!
//! ## Modules, lowest layer first (a module uses only modules above it in this list)
//!
//! - [`error`], [`prng`], [`persist`], [`record`], [`snapshot`], `faults` (with the `testing`
//!   feature), [`metrics`], `wake`, [`context`], [`collector`]: shared vocabulary.
//! - [`channel`]: rings, the entry format, partitioning, input gates.
//! - [`state`]: keyed state and the fork-then-write snapshot interface.
//! - [`source`], [`operator`], [`sink`]: where records enter, change, and leave. They never
//!   use each other.
//! - [`checkpoint`]: beside the data path — configuration, the coordinator (a state machine
//!   run by its own thread), the control plane to the tasks, recovery, storage. Control
//!   messages (trigger, acknowledge, complete, abort) travel on their own channels, never on
//!   rings.
//! - [`barrier`]: the task side of the barrier protocol (alignment, unaligned capture,
//!   completion and abort notices, in-flight data).
//! - [`pipeline`]: the builder API, the logical graph, the physical plan and the tasks.
//! - [`runtime`]: worker threads, pinning, backoff, the [`JobHandle`].
//! - [`simulation`]: the same tasks and coordinator on one thread, from a seed.
//! - `fuzzing` (hidden): every reader of checkpoint bytes from one byte string, for the fuzz
//!   targets in `fuzz/` and the proptest run of them.
//!
//! ## Example
//!
//! ```
//! use weir::{Job, RunConfig, Window, source::Generator};
//!
//! // (key, event time in ms) pairs, counted per key in 10 ms tumbling windows.
//! let job = Job::new("example").with_parallelism(2);
//! let counts = job
//!     .generator(Generator::new(|i, _| (i % 3, i)).count(30))
//!     .with_watermarks(|&(_, ts)| ts, 0)
//!     .key_by(|&(k, _)| k)
//!     .window(Window::tumbling(10), |&(_, ts)| ts)
//!     .count()
//!     .collect();
//! job.execute(RunConfig::default().workers(2)).unwrap();
//! let total: u64 = counts.lock().unwrap().iter().map(|&(_, _, c)| c).sum();
//! assert_eq!(total, 30);
//! ```

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]

// The derive's generated code names `::weir`, which this makes work inside weir too.
extern crate self as weir;

pub mod barrier;
pub mod channel;
pub mod checkpoint;
pub mod collector;
pub mod context;
pub mod error;
#[cfg(feature = "testing")]
pub mod faults;
#[cfg(not(feature = "testing"))]
#[path = "faults_absent.rs"]
mod faults;
#[doc(hidden)]
pub mod fuzzing;
pub mod metrics;
pub mod operator;
pub mod persist;
pub mod pipeline;
pub mod prng;
pub mod record;
pub mod runtime;
pub mod simulation;
pub mod sink;
pub mod snapshot;
pub mod source;
pub mod state;
mod wake;

pub use collector::Collector;
pub use context::TaskContext;
pub use error::{Error, Result};
pub use metrics::JobReport;
pub use operator::co_process::{
    BroadcastContext, BroadcastState, KeyedBroadcastProcessFunction, KeyedCoProcessFunction,
};
pub use operator::process::{KeyedContext, KeyedProcessFunction};
pub use operator::side::OutputTag;
pub use operator::window::{EarlyFiring, Window, WindowBounds};
pub use operator::Emitter;
pub use persist::Persist;
pub use pipeline::{
    BroadcastConnectedStream, ConnectedStreams, Job, KeyedStream, LineStream, SessionWindowedStream, Stream,
    WindowedStream,
};
pub use record::{for_each_word, for_each_word_in_bytes, Key, Record, Timestamp, Word};
pub use runtime::{JobHandle, RunConfig, Stopped};
/// `#[derive(weir::Persist)]`: see [`persist`] for the encoding and how a type may evolve.
pub use weir_derive::Persist;
