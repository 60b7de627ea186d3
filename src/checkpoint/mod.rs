//! Checkpoints: configuration, the coordinator, the task side of barrier alignment and
//! snapshot writing, and storage. Beside the data path: control messages (trigger,
//! acknowledge, complete, abort) travel on their own channels, never on the data rings.
//!
//! The model is Flink's (Carbone et al. 2015): the coordinator triggers checkpoint *n* at the
//! sources, which record their offsets and inject barrier *n* in-band; a task snapshots its
//! operators when barrier *n* has arrived on all inputs (exactly-once blocks each input that
//! delivered it; at-least-once only counts), forwards it, and writes the snapshot in the
//! background; the checkpoint exists once its `_metadata` is durable.
//!
//! May touch: `context`, `error`, `persist`, `snapshot`.

mod config;
pub(crate) mod coordinator;
mod storage;
pub(crate) mod task;

pub use config::{CheckpointConfig, CheckpointMode, RestartStrategy};
pub use storage::{
    decode_file, read_file, write_file, CheckpointMetadata, CheckpointStats, CheckpointStorage,
    FileKind, LoadedCheckpoint, TaskFile, FORMAT_VERSION, METADATA_FILE,
};
