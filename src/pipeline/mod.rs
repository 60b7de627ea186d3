//! The pipeline: the builder API ([`Job`], [`Stream`], …), the logical graph it records, and
//! the plan that turns the graph into tasks (chaining forward edges, building rings, and
//! instantiating each subtask's chain).
//!
//! May touch: `channel`, `collector`, `context`, `error`, `metrics`, `operator`, `record`,
//! `sink`, `source`, `state`, `wake`, `barrier`, `checkpoint`, `persist`, `snapshot`.

mod api;
pub(crate) mod graph;
mod plan;
mod task;

pub use api::{
    BroadcastConnectedStream, ConnectedStreams, Job, KeyedStream, LineStream, RefKeyedStream, SessionWindowedStream,
    Stream, WindowedStream, DEFAULT_EXTERNAL_RING,
};
pub(crate) use graph::Graph;
pub(crate) use plan::{build as build_plan, CheckpointWiring, PlanEnv, PlanLimits};
pub(crate) use task::{poll_catching_panics, JobControl, Task, TaskPoll};

/// The text of a panic payload.
pub(crate) fn panic_text(payload: Box<dyn std::any::Any + Send>) -> String {
    task::panic_message(payload)
}
