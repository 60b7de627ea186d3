//! Which part of a failed checkpoint a task may reuse in the next one (resumable partial
//! checkpoints). A task remembers a [`TaskPrint`] of every part it writes — per operator
//! part, the version and length of each page and a digest of its other bytes — until the
//! checkpoint's fate is known. When a checkpoint fails (it expired, or a task declined it),
//! the coordinator keeps the parts the tasks had completed and tells each of those tasks
//! (`TaskControl::PartKept`); the task keeps that part's print ([`TaskParts`]). The next
//! checkpoint's writer compares its snapshot with the kept print ([`changes`]) without encoding
//! a page (a page's version names its content), and when nothing differs it reuses the kept
//! file instead of writing the part again; else it writes it and says what changed.
//!
//! May touch: `checkpoint::storage`, `checkpoint::task`, `prng`, `snapshot` (and `state`, in
//! its tests).

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex};

use super::storage::{FileDigest, SharedFile};
use super::task::{TaskDone, TaskStats};
use crate::snapshot::{CheckpointNotice, StateChunks, TaskSnapshot};

/// A digest of a byte sequence that does not depend on how it was cut into calls: its length,
/// its CRC-32C and a 64-bit multiply-xor hash of its 8-byte words (two unrelated functions,
/// so state that changed and kept its length passes both with odds of about 2^-96).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct BytesDigest {
    len: u64,
    crc: u32,
    mix: u64,
    /// Bytes of the last word not yet complete, little-endian, and how many.
    tail: u64,
    tail_len: u32,
}

impl BytesDigest {
    fn word(&mut self, w: u64) {
        self.mix = crate::prng::mix(self.mix.rotate_left(23) ^ w);
    }

    fn update(&mut self, mut bytes: &[u8]) {
        self.len += bytes.len() as u64;
        self.crc = crc32c::crc32c_append(self.crc, bytes);
        while self.tail_len > 0 && !bytes.is_empty() {
            self.tail |= (bytes[0] as u64) << (8 * self.tail_len);
            self.tail_len += 1;
            bytes = &bytes[1..];
            if self.tail_len == 8 {
                let w = std::mem::take(&mut self.tail);
                self.tail_len = 0;
                self.word(w);
            }
        }
        if bytes.is_empty() {
            return;
        }
        debug_assert_eq!(self.tail_len, 0, "the tail is complete once bytes are left");
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            self.word(u64::from_le_bytes(w.try_into().expect("8 bytes")));
        }
        for (i, &b) in words.remainder().iter().enumerate() {
            self.tail |= (b as u64) << (8 * i);
        }
        self.tail_len = words.remainder().len() as u32;
    }
}

/// One operator part of a task's checkpoint part, as written.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct OperatorPrint {
    operator: String,
    subtask: usize,
    /// (version, length of the encoding) of each page, in order.
    pages: Vec<(u64, u64)>,
    /// Everything else the part's state handed on.
    other: BytesDigest,
}

/// What a task's part of a checkpoint held, enough to tell whether a later snapshot holds the
/// same: built while the part is written ([`TaskPrint::start`], `bytes`, `page`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TaskPrint {
    parts: Vec<OperatorPrint>,
}

impl TaskPrint {
    /// The next operator part begins.
    pub(crate) fn start(&mut self, operator: &str, subtask: usize) {
        self.parts.push(OperatorPrint { operator: operator.to_string(), subtask, ..Default::default() });
    }

    fn current(&mut self) -> &mut OperatorPrint {
        self.parts.last_mut().expect("a part was started")
    }

    /// Bytes of the current part that are not a page.
    pub(crate) fn bytes(&mut self, bytes: &[u8]) {
        self.current().other.update(bytes);
    }

    /// A page of the current part, and the length of its encoding.
    pub(crate) fn page(&mut self, version: u64, len: u64) {
        self.current().pages.push((version, len));
    }
}

/// Compares one operator part of a snapshot with its print as it is handed on: pages by
/// version (never encoded), the rest by digest. A page that differs is answered with length
/// zero: the part differs already, and what follows only has to be deterministic.
struct PartComparison<'a> {
    kept: Option<&'a OperatorPrint>,
    page: usize,
    changed_pages: usize,
    other: BytesDigest,
}

impl StateChunks for PartComparison<'_> {
    fn bytes(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.other.update(bytes);
        Ok(())
    }

    fn page(&mut self, version: u64, _encode: &mut dyn FnMut(&mut Vec<u8>)) -> io::Result<u64> {
        let kept = self.kept.and_then(|k| k.pages.get(self.page)).copied();
        self.page += 1;
        match kept {
            Some((v, len)) if v == version => Ok(len),
            _ => {
                self.changed_pages += 1;
                Ok(0)
            }
        }
    }
}

/// What changed in `snapshot` since the part `kept` printed, one line per operator part that
/// differs (at most a few, then how many more); empty when nothing did.
pub(crate) fn changes(snapshot: &TaskSnapshot, kept: &TaskPrint) -> io::Result<Vec<String>> {
    let mut changed = Vec::new();
    if snapshot.parts.len() != kept.parts.len() {
        changed.push(format!("its chain has {} state parts, and had {}", snapshot.parts.len(), kept.parts.len()));
    }
    for (i, p) in snapshot.parts.iter().enumerate() {
        let k = kept.parts.get(i).filter(|k| *k.operator == *p.operator && k.subtask == p.subtask);
        let mut c = PartComparison { kept: k, page: 0, changed_pages: 0, other: BytesDigest::default() };
        p.state.write_chunks(&mut c)?;
        let Some(k) = k else {
            changed.push(format!("{} subtask {} is new", p.operator, p.subtask));
            continue;
        };
        let pages_changed = c.changed_pages + k.pages.len().saturating_sub(c.page);
        let what = match (pages_changed, c.other != k.other) {
            (0, false) => continue,
            (0, true) => "its state".to_string(),
            (n, other) => format!(
                "{n} of {} pages{}",
                c.page.max(k.pages.len()),
                if other { " and the rest of its state" } else { "" }
            ),
        };
        changed.push(format!("{} subtask {}: {what}", p.operator, p.subtask));
    }
    const NAMED: usize = 3;
    if changed.len() > NAMED {
        let more = changed.len() - NAMED;
        changed.truncate(NAMED);
        changed.push(format!("{more} more parts"));
    }
    Ok(changed)
}

/// A task's part of a checkpoint, written (or reused) and durable.
#[derive(Clone, Debug)]
pub(crate) struct WrittenPart {
    /// The checkpoint whose folder holds the file.
    pub(crate) checkpoint: u64,
    /// The checkpoint the file was written for (its header names it): `checkpoint`, or an
    /// earlier one whose part this one reused.
    pub(crate) written_for: u64,
    pub(crate) file: String,
    pub(crate) digest: FileDigest,
    pub(crate) shared: Vec<SharedFile>,
    pub(crate) state_bytes: u64,
    pub(crate) print: TaskPrint,
}

impl WrittenPart {
    /// The part `written`, task file of checkpoint `id`.
    pub(crate) fn of(id: u64, written: crate::checkpoint::incremental::TaskFileWritten) -> WrittenPart {
        WrittenPart {
            checkpoint: id,
            written_for: id,
            file: written.file,
            digest: written.file_digest,
            shared: written.shared,
            state_bytes: written.state_bytes,
            print: written.print,
        }
    }

    /// The acknowledgement of this part as task part of checkpoint `self.checkpoint`.
    pub(crate) fn done(&self, stats: TaskStats) -> TaskDone {
        TaskDone {
            file: self.file.clone(),
            digest: self.digest,
            written_for: (self.written_for != self.checkpoint).then_some(self.written_for),
            stats,
            shared: self.shared.clone(),
        }
    }
}

/// The parts one task wrote whose checkpoint's fate it has not heard yet, and the part of a
/// failed checkpoint the coordinator kept for it. Shared by the task and its writers.
#[derive(Default)]
pub(crate) struct TaskParts {
    inner: Mutex<TaskPartsInner>,
}

#[derive(Default)]
struct TaskPartsInner {
    written: BTreeMap<u64, Arc<WrittenPart>>,
    kept: Option<Arc<WrittenPart>>,
}

impl TaskParts {
    fn lock(&self) -> std::sync::MutexGuard<'_, TaskPartsInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A writer finished this task's part of `part.checkpoint`.
    pub(crate) fn written(&self, part: WrittenPart) {
        self.lock().written.insert(part.checkpoint, Arc::new(part));
    }

    /// The coordinator kept this task's part of failed checkpoint `id` (in place of any
    /// part it kept before).
    pub(crate) fn keep(&self, id: u64) {
        let mut inner = self.lock();
        inner.kept = inner.written.remove(&id);
    }

    /// The part the next checkpoint may reuse, if any.
    pub(crate) fn kept(&self) -> Option<Arc<WrittenPart>> {
        self.lock().kept.clone()
    }

    /// A checkpoint completed (nothing older is needed: the kept part goes too, as the
    /// coordinator deletes what the completed one does not refer to) or was aborted (a kept
    /// part older than it goes: the coordinator keeps the parts of the newest failed
    /// checkpoint only, and this task heard `keep` before the abort if one of them is its).
    pub(crate) fn on_notice(&self, notice: CheckpointNotice) {
        let mut inner = self.lock();
        match notice {
            CheckpointNotice::Complete(id) => {
                inner.written = inner.written.split_off(&(id + 1));
                if inner.kept.as_ref().is_some_and(|k| k.checkpoint <= id) {
                    inner.kept = None;
                }
            }
            CheckpointNotice::Aborted(id) => {
                inner.written.remove(&id);
                if inner.kept.as_ref().is_some_and(|k| k.checkpoint < id) {
                    inner.kept = None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::Barrier;
    use crate::state::{KeyedValueState, Snapshot};

    fn snapshot(id: u64, state: &mut KeyedValueState<u64, u64>, other: &[u8]) -> TaskSnapshot {
        let mut snap = TaskSnapshot::new(Barrier { id, trigger_ns: 0, unaligned: false, savepoint: false });
        snap.add("counts".into(), 0, state.fork());
        let inflight = crate::snapshot::PartName::Inflight { operator: "counts".into(), input: 0 };
        snap.add_inflight(inflight.to_string().into(), 0, other.to_vec());
        snap
    }

    /// The print of what the writer wrote, taken as it writes.
    fn print(snap: &TaskSnapshot) -> TaskPrint {
        struct Printing<'a>(&'a mut TaskPrint);
        impl StateChunks for Printing<'_> {
            fn bytes(&mut self, bytes: &[u8]) -> io::Result<()> {
                self.0.bytes(bytes);
                Ok(())
            }
            fn page(&mut self, version: u64, encode: &mut dyn FnMut(&mut Vec<u8>)) -> io::Result<u64> {
                let mut buf = Vec::new();
                encode(&mut buf);
                self.0.page(version, buf.len() as u64);
                Ok(buf.len() as u64)
            }
        }
        let mut print = TaskPrint::default();
        for p in &snap.parts {
            print.start(&p.operator, p.subtask);
            p.state.write_chunks(&mut Printing(&mut print)).unwrap();
        }
        print
    }

    /// A snapshot of unchanged state matches the print of the part written before; one page
    /// written, or other bytes changed, and it does not, and the difference is named.
    #[test]
    fn a_snapshot_matches_the_kept_print_only_while_nothing_changed() {
        let mut state: KeyedValueState<u64, u64> = KeyedValueState::new();
        for k in 0..5_000 {
            state.put(k, k);
        }
        let first = print(&snapshot(1, &mut state, b"in flight"));
        assert!(changes(&snapshot(2, &mut state, b"in flight"), &first).unwrap().is_empty());
        let other = changes(&snapshot(3, &mut state, b"in fligh!"), &first).unwrap();
        assert_eq!(other.len(), 1, "{other:?}");
        assert!(other[0].ends_with(": its state"), "{other:?}");
        state.put(7, 0);
        let changed = changes(&snapshot(4, &mut state, b"in flight"), &first).unwrap();
        assert_eq!(changed.len(), 1, "{changed:?}");
        assert!(changed[0].starts_with("counts subtask 0: 1 of "), "{changed:?}");
    }

    /// The digest does not depend on how the bytes were cut, and tells apart sequences that
    /// differ in one byte or in their length.
    #[test]
    fn the_digest_is_the_same_however_the_bytes_are_cut() {
        let bytes: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut whole = BytesDigest::default();
        whole.update(&bytes);
        for cut in [1, 3, 7, 8, 9, 500] {
            let mut pieces = BytesDigest::default();
            bytes.chunks(cut).for_each(|c| pieces.update(c));
            assert_eq!(pieces, whole, "cut every {cut}");
        }
        let mut changed = bytes.clone();
        changed[500] ^= 1;
        let mut other = BytesDigest::default();
        other.update(&changed);
        assert_ne!(other, whole);
        let mut shorter = BytesDigest::default();
        shorter.update(&bytes[..999]);
        assert_ne!(shorter, whole);
    }

    /// A kept part lives until a later checkpoint completes; written parts go with their
    /// checkpoint's notice.
    #[test]
    fn a_kept_part_lives_until_a_later_checkpoint_completes() {
        let parts = TaskParts::default();
        let part = |checkpoint| WrittenPart {
            checkpoint,
            written_for: checkpoint,
            file: "task-0.state".into(),
            digest: FileDigest::default(),
            shared: Vec::new(),
            state_bytes: 0,
            print: TaskPrint::default(),
        };
        parts.written(part(1));
        parts.written(part(2));
        parts.keep(1);
        parts.on_notice(CheckpointNotice::Aborted(1));
        assert_eq!(parts.kept().map(|k| k.checkpoint), Some(1));
        parts.on_notice(CheckpointNotice::Complete(2));
        assert!(parts.kept().is_none());
        assert!(parts.lock().written.is_empty());
        // Checkpoint 4 failed and the coordinator kept other tasks' parts of it, not this
        // one's (it heard no `keep`): its part of 3 is gone from the coordinator, so from here.
        parts.written(part(3));
        parts.keep(3);
        parts.on_notice(CheckpointNotice::Aborted(3));
        parts.on_notice(CheckpointNotice::Aborted(4));
        assert!(parts.kept().is_none(), "a part the coordinator no longer keeps is not reused");
    }
}
