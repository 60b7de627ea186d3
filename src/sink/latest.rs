//! The idempotent keyed sink: the latest record per key, as a table file per subtask that is
//! rewritten whole (temporary file, fsync, atomic rename) on every checkpoint barrier and at
//! the end of the input.
//!
//! Its lines are sorted, so the file's content depends only on the table: a replay after
//! recovery writes the same content again, and a table file written for a checkpoint that
//! then failed is overwritten by the same values once the replay passes that point (upserts,
//! not appends). The table is keyed state, checkpointed and redistributed by key group when the
//! job is restored at another parallelism.
//!
//! May touch: `context`, `error`, `persist`, `record`, `snapshot`, `state`.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::Sink;
use crate::context::TaskContext;
use crate::error::{Error, Result};
use crate::persist::Persist;
use crate::record::{Key, KeyScope};
use crate::snapshot::ForkedState;
use crate::state::{KeyedValueState, Snapshot};

/// One subtask of the latest-value-per-key sink: `<dir>/latest-<subtask>` holds one line per
/// key (the key's latest record, formatted), sorted.
pub struct LatestPerKeySink<T, K, KF, F> {
    dir: PathBuf,
    subtask: usize,
    parallelism: usize,
    key: KF,
    format: F,
    table: KeyedValueState<K, T>,
    text: Vec<u8>,
}

fn table_name(subtask: usize) -> String {
    format!("latest-{subtask}")
}

impl<T, K: Key, KF, F> LatestPerKeySink<T, K, KF, F>
where
    T: Persist + Clone + Send + Sync + 'static,
    KF: Fn(&T) -> K,
    F: FnMut(&T, &mut Vec<u8>),
{
    /// The sink of subtask `ctx.subtask`, writing into `dir` (created if missing).
    pub fn create(dir: &Path, ctx: &TaskContext, key: KF, format: F) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("cannot create output folder", dir, e))?;
        Ok(LatestPerKeySink {
            dir: dir.to_path_buf(),
            subtask: ctx.subtask,
            parallelism: ctx.parallelism,
            key,
            format,
            table: KeyedValueState::new(),
            text: Vec::new(),
        })
    }

    /// Rewrites the table file from the table.
    fn publish(&mut self) -> Result<()> {
        self.text.clear();
        let mut lines: Vec<(usize, usize)> = Vec::with_capacity(self.table.len());
        for (_, record) in self.table.iter() {
            let start = self.text.len();
            (self.format)(record, &mut self.text);
            if self.text.last() != Some(&b'\n') {
                self.text.push(b'\n');
            }
            lines.push((start, self.text.len()));
        }
        let text = &self.text;
        lines.sort_unstable_by(|a, b| text[a.0..a.1].cmp(&text[b.0..b.1]));
        let tmp = self.dir.join(format!(".{}.tmp", table_name(self.subtask)));
        let target = self.dir.join(table_name(self.subtask));
        let write = || -> std::io::Result<()> {
            let mut out = std::io::BufWriter::with_capacity(256 * 1024, std::fs::File::create(&tmp)?);
            for &(a, b) in &lines {
                out.write_all(&text[a..b])?;
            }
            out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
            std::fs::rename(&tmp, &target)?;
            std::fs::File::open(&self.dir)?.sync_all()
        };
        write().map_err(|e| Error::io("cannot write the latest-value table", &target, e))
    }
}

impl<T, K: Key, KF, F> Sink<T> for LatestPerKeySink<T, K, KF, F>
where
    T: Persist + Clone + Send + Sync + 'static,
    KF: Fn(&T) -> K + Send,
    F: FnMut(&T, &mut Vec<u8>) + Send,
{
    fn write(&mut self, records: &mut Vec<T>) -> Result<()> {
        for r in records.drain(..) {
            self.table.put((self.key)(&r), r);
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        self.publish()
    }

    fn pre_commit(&mut self, _checkpoint: u64) -> Result<Option<Box<dyn ForkedState>>> {
        self.publish()?;
        Ok(Some(self.table.fork()))
    }

    fn restore(&mut self, bytes: &[u8]) -> Result<()> {
        self.table.restore(bytes)
    }

    fn restore_rescaled(&mut self, parts: &[(usize, &[u8])], scope: &KeyScope) -> Result<()> {
        self.table.restore_owned(parts.iter().map(|(_, b)| *b), scope)?;
        // Tables of old subtasks that no longer exist go; each is removed by one new subtask.
        for (old, _) in parts {
            if *old >= self.parallelism && old % self.parallelism == self.subtask {
                let stale = self.dir.join(table_name(*old));
                if let Err(e) = std::fs::remove_file(&stale) {
                    if e.kind() != std::io::ErrorKind::NotFound {
                        return Err(Error::io("cannot remove an old subtask's table", stale, e));
                    }
                }
            }
        }
        Ok(())
    }
}

// Their fields are closures, shared internals or whole state: a name says enough.
crate::debug_as_name!([T, K, KF, F] LatestPerKeySink<T, K, KF, F>);
