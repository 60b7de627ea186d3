//! How a task names and encodes the in-flight data it captured for an unaligned checkpoint:
//! one part per input, named by [`crate::snapshot::PartName::Inflight`] (a typed name, never
//! split from a string by hand), holding `(channel, entries)` per channel.
//!
//! May touch: `channel`, `error`, `persist`, `snapshot`.

use crate::channel::{Captured, Entry};
use crate::error::Result;
use crate::persist::Persist;
use crate::snapshot::PartName;

/// The name under which a task stores the in-flight data of its input `input`.
pub(crate) fn inflight_part(operator: &str, input: usize) -> String {
    PartName::Inflight { operator: operator.to_string(), input }.to_string()
}

/// Encodes one gate's captured in-flight data as `Vec<(u64, Vec<Entry<T>>)>` encodes (what
/// [`decode_inflight`] reads): the entries were encoded as they were captured, so only the
/// counts are written here.
pub(crate) fn encode_inflight(data: Vec<(usize, Captured)>) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + data.iter().map(|(_, c)| 16 + c.bytes.len()).sum::<usize>());
    (data.len() as u64).persist(&mut out);
    for (channel, captured) in data {
        (channel as u64).persist(&mut out);
        captured.entries.persist(&mut out);
        out.extend_from_slice(&captured.bytes);
    }
    out
}

/// Decodes in-flight data written by [`encode_inflight`].
pub(crate) fn decode_inflight<T: Persist>(bytes: &[u8]) -> Result<Vec<(usize, Vec<Entry<T>>)>> {
    let data: Vec<(u64, Vec<Entry<T>>)> = crate::persist::from_bytes(bytes)?;
    Ok(data.into_iter().map(|(c, e)| (c as usize, e)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The captured encoding is the one `decode_inflight` reads, for records that own memory.
    #[test]
    fn captured_entries_decode_as_written() {
        let entries = [Entry::Record("a".to_string()), Entry::Watermark(4), Entry::Record("βγ".repeat(9))];
        let mut captured = Captured::default();
        for e in &entries {
            e.persist(&mut captured.bytes);
            captured.entries += 1;
        }
        let bytes = encode_inflight(vec![(3, captured), (5, Captured::default())]);
        let back = decode_inflight::<String>(&bytes).unwrap();
        assert_eq!(back, vec![(3, entries.to_vec()), (5, Vec::new())]);
    }
}
