//! How a task names and encodes the in-flight data it captured for an unaligned checkpoint:
//! one part per input, named by [`crate::snapshot::PartName::Inflight`] (a typed name, never
//! split from a string by hand), holding `(channel, entries)` per channel.
//!
//! May touch: `channel`, `error`, `persist`, `snapshot`.

use crate::channel::Entry;
use crate::error::Result;
use crate::persist::{to_bytes, Persist};
use crate::snapshot::PartName;

/// The name under which a task stores the in-flight data of its input `input`.
pub(crate) fn inflight_part(operator: &str, input: usize) -> String {
    PartName::Inflight { operator: operator.to_string(), input }.to_string()
}

/// Encodes one gate's captured in-flight data.
pub(crate) fn encode_inflight<T: Persist>(data: Vec<(usize, Vec<Entry<T>>)>) -> Vec<u8> {
    let data: Vec<(u64, Vec<Entry<T>>)> = data.into_iter().map(|(c, e)| (c as u64, e)).collect();
    to_bytes(&data)
}

/// Decodes in-flight data written by [`encode_inflight`].
pub(crate) fn decode_inflight<T: Persist>(bytes: &[u8]) -> Result<Vec<(usize, Vec<Entry<T>>)>> {
    let data: Vec<(u64, Vec<Entry<T>>)> = crate::persist::from_bytes(bytes)?;
    Ok(data.into_iter().map(|(c, e)| (c as usize, e)).collect())
}
