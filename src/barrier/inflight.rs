//! How a task names and encodes the in-flight data it captured for an unaligned checkpoint:
//! one part per input, named by [`crate::snapshot::PartName::Inflight`] (a typed name, never
//! split from a string by hand), holding `(channel, entries)` per channel; and how a restored
//! task finds it again, with what the channels' producers stored of their staged entries
//! ([`crate::snapshot::PartName::Staged`], one `Vec<Entry<T>>` per channel).
//!
//! May touch: `channel`, `error`, `persist`, `snapshot`.

use crate::channel::{Captured, Entry};
use crate::error::Result;
use crate::persist::Persist;
use crate::snapshot::{PartName, RestoredState};

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

/// The in-flight data of input `input` of `operator`'s subtask `subtask` in `restored`, per
/// channel in replay order: what the task captured from the ring, then what the producer held
/// staged behind it.
pub(crate) fn restored_inflight<T: Persist>(
    restored: &RestoredState,
    operator: &str,
    subtask: usize,
    input: usize,
) -> Result<Vec<(usize, Vec<Entry<T>>)>> {
    let mut data = match restored.get(&inflight_part(operator, input), subtask) {
        Some(bytes) => decode_inflight(bytes)?,
        None => Vec::new(),
    };
    let mut staged = Vec::new();
    for (name, s) in restored.operators() {
        if *s != subtask {
            continue;
        }
        if let PartName::Staged { operator: op, input: i, channel } = PartName::parse(name) {
            if op == operator && i == input {
                let bytes = restored.get(name, subtask).expect("a listed part is there");
                staged.push((channel, crate::persist::from_bytes::<Vec<Entry<T>>>(bytes)?));
            }
        }
    }
    staged.sort_by_key(|(c, _)| *c);
    data.extend(staged);
    Ok(data)
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
