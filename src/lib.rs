//! # weir
//!
//! A single-node stream processor on a thread-per-core runtime, built around Apache Flink's
//! fault-tolerance model (asynchronous barrier snapshots: Carbone et al. 2015, after Chandy and
//! Lamport 1985). This crate doc is the architecture doc.
//!
//! ## How records flow, and where
//!
//! 1. The builder ([`pipeline`]: [`Job`], [`Stream`], [`KeyedStream`], …) records a graph of
//!    operators, each with a parallelism; nothing runs until the job starts.
//! 2. The plan (`pipeline`'s planner) *chains* consecutive operators joined by a forward edge
//!    with equal parallelism into one task (nested [`Collector`] calls, no ring between
//!    them), and joins every other pair of subtasks by one lock-free SPSC ring (`rtrb`:
//!    [`channel`]) of tagged entries (records, watermarks, barriers, end of stream). `key_by`
//!    hashes a key to one of `max_parallelism` key groups and the key group to a subtask
//!    ([`record`]'s key groups, [`channel`]'s partitioning), as in Flink.
//! 3. The runtime ([`runtime`]) gives each subtask to one worker thread, one per core,
//!    pinned. A worker polls its tasks (`pipeline`'s tasks) and processes whole batches
//!    run-to-completion: no locks, no allocation and no system calls per record. An idle
//!    worker spins, yields, then parks until woken (`wake`).
//! 4. A task's head takes batches from its source ([`source`]) or its input gate
//!    ([`channel`]: the rings of one input merged, the watermark the minimum over them), and
//!    hands them down its chain: operators ([`operator`], their keyed state in [`state`])
//!    to a sink ([`sink`]) or to the ring writers of its outgoing edges ([`channel`]).
//!    Records are any owned [`Record`] type, moved into a ring and out of it with no
//!    serialisation; text may use the compact [`Word`].
//! 5. Records move in *runs*. A run is the records a producer publishes in one ring chunk
//!    (a batch, or a key-by writer's share of one for each downstream subtask), between two
//!    control entries; the gate moves a whole run out of the ring into its batch in one pass
//!    (per record a tag compared and the bytes copied) and hands it on as one batch. A run is
//!    never held back to fill: a producer publishes what its task handed it at once, so a
//!    lone record is not delayed. A run is cut where a control entry lies in the ring (a
//!    watermark, an in-band barrier, the end), at the turn's budget, and, with unaligned
//!    checkpoints, at a slice's worth of records (so a priority barrier waits for one slice:
//!    what is left of the run stays in the ring, in flight for its checkpoint). Keyed
//!    operators take a run at a time: the keyed aggregate checks copy-on-write ownership
//!    once for the run when no snapshot shares a page ([`state::PagedMap::owned_pages`]).
//! 6. A full ring is backpressure: the writer holds its batch, `drain` reports it, and the
//!    task takes no input until it has gone on; its worker serves its other tasks meanwhile.
//!
//! ## How a barrier flows, and where
//!
//! 1. The coordinator ([`checkpoint`]: a state machine behind a thread of its own, handed
//!    the time) triggers checkpoint *n* at every source subtask through its control inbox;
//!    control messages (trigger, acknowledge, complete, abort) never travel on the rings.
//! 2. The source task (`pipeline`'s tasks) records its offset, snapshots its chain (each
//!    operator forks its state: [`snapshot`], [`state`]) and puts barrier *n* into each
//!    output ring behind everything it emitted — or, for an unaligned checkpoint, into each
//!    ring's priority slot, overtaking the data in the ring ([`channel`]).
//! 3. At a task with inputs, the gate ([`channel`]) hands the barrier to the barrier
//!    protocol (`barrier`):
//!    - **aligned, exactly-once**: each channel that delivers barrier *n* is blocked; once
//!      every live channel has, the task snapshots its chain, forwards the barrier and
//!      unblocks. At-least-once only counts the barriers, blocking nothing.
//!    - **unaligned**: the first priority barrier snapshots at once and forwards the barrier
//!      unaligned; the data each producer wrote before its barrier and this task reads after
//!      the snapshot is captured as in-flight data (the gate's capture, `barrier`'s
//!      in-flight log).
//!    - **aligned with a timeout**, **adaptive**: an alignment that waits too long, or holds
//!      too much in flight, turns unaligned there.
//! 4. The chain forwards the barrier collector by collector ([`Collector::barrier`]; each
//!    operator's default forwards it); sinks pre-commit ([`sink`]). A task's snapshots, and
//!    so its barriers downstream, go in checkpoint order.
//! 5. The snapshot is written in the background ([`checkpoint`]'s snapshot writer: a rayon
//!    pool of weir's own, not the program's global one; bounded) into the checkpoint's folder
//!    (the file format and `_metadata` in [`checkpoint`]'s storage); then the task
//!    acknowledges — or declines, with an [`Error`] that says whether a later checkpoint may
//!    succeed.
//! 6. When every task has acknowledged, the coordinator writes `_metadata` atomically, reads
//!    the checkpoint back, retires old ones and tells every task it completed: two-phase-
//!    commit sinks commit then ([`sink`]). A checkpoint that expires or is declined is
//!    aborted, and the tasks drop their part of it.
//! 7. After a failure, recovery ([`checkpoint`]) finds the newest checkpoint that verifies;
//!    every task restores its operators' state and replays its in-flight data, and the
//!    sources resume from their offsets ([`runtime`] restarts the attempt). [`simulation`]
//!    runs all of this on one thread from a seed, with a clock it moves and failures it
//!    injects, against the failure-free run.
//!
//! ## Modules, lowest layer first (a module uses only modules above it in this list)
//!
//! - [`error`], [`prng`], [`persist`], [`record`], `faults` (with the `testing` feature),
//!   [`snapshot`], [`metrics`], `wake`, [`context`], [`collector`]: shared vocabulary.
//! - [`channel`]: rings, the entry format, partitioning, input gates.
//! - [`state`]: keyed state and the fork-then-write snapshot interface.
//! - [`source`], [`operator`], [`sink`]: where records enter, change, and leave. They never
//!   use each other.
//! - [`checkpoint`]: beside the data path — configuration, the coordinator, the control
//!   plane to the tasks, recovery, storage.
//! - `barrier`: the task side of the barrier protocol (alignment, unaligned capture,
//!   completion and abort notices, in-flight data).
//! - [`pipeline`]: the builder API, the logical graph, the physical plan and the tasks.
//! - [`runtime`]: worker threads, pinning, backoff, the [`JobHandle`].
//! - [`simulation`]: the same tasks and coordinator on one thread, from a seed.
//! - `fuzzing` (hidden): every reader of checkpoint bytes from one byte string, for the fuzz
//!   targets in `fuzz/` and the proptest run of them.
//!
//! `tests/tidy.rs` holds the code to this list and to every module's "May touch" line.
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

/// `Debug` for a public type whose fields are closures, shared internals or whole state: the
/// type's name.
macro_rules! debug_as_name {
    ([$($gen:tt)*] $ty:ty) => {
        impl<$($gen)*> ::std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                let name = stringify!($ty);
                f.debug_struct(name.split('<').next().unwrap_or(name).trim()).finish_non_exhaustive()
            }
        }
    };
}
pub(crate) use debug_as_name;

// The derive's generated code names `::weir`, which this makes work inside weir too.
extern crate self as weir;

// The task side of the barrier protocol: reachable for the benches, not part of the API.
#[doc(hidden)]
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
    BroadcastConnectedStream, ConnectedStreams, Job, KeyedStream, LineStream, RefKeyedStream, SessionWindowedStream,
    Stream, WindowedStream,
};
pub use record::{for_each_word, for_each_word_in_bytes, Key, Record, Timestamp, Word};
pub use runtime::{JobController, JobFailure, JobHandle, JobState, RunConfig, Stopped};
/// `#[derive(weir::Persist)]`: see [`persist`] for the encoding and how a type may evolve.
pub use weir_derive::Persist;
