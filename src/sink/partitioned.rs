//! The partitioned file sink: each record goes to `<dir>/<partition>/part-<subtask>`, its
//! partition (a relative folder path such as `dt=2026-12-02/hm=10:05`) chosen by a function of
//! the record, as Flink's filesystem connector partitions by columns.
//!
//! Exactly-once the way [`super::FileSink`] is: on a checkpoint's barrier every file written
//! since the last one is flushed and fsynced, and the snapshot records the length of every
//! partition file this subtask has written; a restart truncates each to its recorded length
//! and removes this subtask's files in partitions the checkpoint does not know, so what
//! follows is written exactly once. A fresh start removes this subtask's files under `dir`.
//! Readers may see output that a failure later takes back (as with [`super::FileSink`]).
//! The snapshot lists every partition the subtask ever wrote, a few bytes each.
//!
//! May touch: `error`, `persist`, `snapshot`.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Component, Path, PathBuf};

use super::{cut_back, write_buffer, Sink, OUTPUT_BUFFER_BYTES};
use crate::error::{Error, Result};
use crate::persist::from_bytes;
use crate::snapshot::{ForkedState, PersistedFork};

/// One partition's file of one subtask.
#[derive(Default)]
struct PartitionFile {
    /// Open while written since the last barrier (closed there, so open files stay few).
    out: Option<File>,
    /// Formatted records not yet handed to the file.
    line: Vec<u8>,
    /// Bytes formatted so far, buffered ones included.
    written: u64,
    /// Written since the last barrier.
    dirty: bool,
}

/// One subtask of the partitioned file sink (see the module documentation).
pub struct PartitionedFileSink<P, F> {
    dir: PathBuf,
    name: String,
    partition: P,
    format: F,
    files: BTreeMap<String, PartitionFile>,
    /// The partition of the record at hand (reused, so a known partition costs no allocation).
    key: String,
    /// Files of earlier runs are removed (fresh start) or cut back (restore) before any write.
    prepared: bool,
}

impl<P, F> PartitionedFileSink<P, F> {
    /// The sink for subtask `subtask`, writing under `dir` (created if missing).
    pub fn create(dir: &Path, subtask: usize, partition: P, format: F) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("cannot create output folder", dir, e))?;
        Ok(PartitionedFileSink {
            dir: dir.to_path_buf(),
            name: format!("part-{subtask}"),
            partition,
            format,
            files: BTreeMap::new(),
            key: String::new(),
            prepared: false,
        })
    }

    /// This subtask's files under the output folder, with their partitions.
    fn own_files(&self) -> Result<Vec<(String, PathBuf)>> {
        let mut files = partition_files(&self.dir)?;
        files.retain(|(_, path)| path.file_name().is_some_and(|n| n == self.name.as_str()));
        Ok(files)
    }

    /// A fresh start: this subtask's files of earlier runs go.
    fn prepare(&mut self) -> Result<()> {
        if !self.prepared {
            for (_, path) in self.own_files()? {
                std::fs::remove_file(&path).map_err(|e| Error::io("cannot remove old output file", &path, e))?;
            }
            self.prepared = true;
        }
        Ok(())
    }

    fn path_of(&self, partition: &str) -> PathBuf {
        self.dir.join(partition).join(&self.name)
    }

    /// Hands a partition's buffered output to its file (opened, and its folder made, as needed).
    fn write_out(dir: &Path, name: &str, partition: &str, file: &mut PartitionFile) -> Result<()> {
        let folder = dir.join(partition);
        let path = folder.join(name);
        if file.out.is_none() {
            std::fs::create_dir_all(&folder).map_err(|e| Error::io("cannot create partition folder", &folder, e))?;
            let opened = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|e| Error::io("cannot open output file", &path, e))?;
            file.out = Some(opened);
        }
        write_buffer(file.out.as_mut().expect("opened above"), &path, &mut file.line)
    }

    /// Makes everything written so far durable and closes the files.
    fn sync(&mut self) -> Result<()> {
        self.prepare()?;
        for (partition, file) in self.files.iter_mut().filter(|(_, f)| f.dirty) {
            Self::write_out(&self.dir, &self.name, partition, file)?;
            let out = file.out.take().expect("opened by write_out");
            out.sync_all()
                .map_err(|e| Error::io("cannot sync output file", self.dir.join(partition).join(&self.name), e))?;
            // Closed until written again: its buffer goes too, so only the partitions written
            // since the last barrier hold one (q10 opens a new one a minute, for ever).
            file.line = Vec::new();
            file.dirty = false;
        }
        Ok(())
    }
}

/// Every file under `dir` in a partition folder, with its partition (the folder's path
/// relative to `dir`), as the partitioned file sink leaves them: the files of all its subtasks.
pub fn partition_files(dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let mut found = Vec::new();
    let mut folders = vec![dir.to_path_buf()];
    while let Some(folder) = folders.pop() {
        let entries = std::fs::read_dir(&folder).map_err(|e| Error::io("cannot list output folder", &folder, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| Error::io("cannot list output folder", &folder, e))?;
            let path = entry.path();
            let kind = entry.file_type().map_err(|e| Error::io("cannot read output folder", &path, e))?;
            if kind.is_dir() {
                folders.push(path);
            } else if folder != dir {
                let partition = folder.strip_prefix(dir).expect("under the output folder");
                found.push((partition.to_string_lossy().into_owned(), path));
            }
        }
    }
    Ok(found)
}

/// A partition must be a relative path of plain folder names: it may not leave the output
/// folder or name one of its files.
fn check_partition(partition: &str) -> Result<()> {
    let path = Path::new(partition);
    let plain = !partition.is_empty() && path.components().all(|c| matches!(c, Component::Normal(_)));
    if plain {
        Ok(())
    } else {
        Err(Error::config(format!(
            "a partition must be a relative folder path of plain names (such as dt=2026-12-02/hm=10:05), not {partition:?}"
        )))
    }
}

impl<T, P, F> Sink<T> for PartitionedFileSink<P, F>
where
    P: FnMut(&T, &mut String) + Send,
    F: FnMut(&T, &mut Vec<u8>) + Send,
{
    fn write(&mut self, records: &mut Vec<T>) -> Result<()> {
        self.prepare()?;
        for r in records.drain(..) {
            self.key.clear();
            (self.partition)(&r, &mut self.key);
            let file = match self.files.get_mut(self.key.as_str()) {
                Some(f) => f,
                None => {
                    check_partition(&self.key)?;
                    self.files.entry(self.key.clone()).or_default()
                }
            };
            let before = file.line.len();
            (self.format)(&r, &mut file.line);
            file.written += (file.line.len() - before) as u64;
            file.dirty = true;
            if file.line.len() >= OUTPUT_BUFFER_BYTES {
                Self::write_out(&self.dir, &self.name, &self.key, file)?;
            }
        }
        Ok(())
    }
    fn finish(&mut self) -> Result<()> {
        self.sync()
    }
    fn pre_commit(&mut self, _checkpoint: u64) -> Result<Option<Box<dyn ForkedState>>> {
        self.sync()?;
        let lengths: Vec<(String, u64)> = self.files.iter().map(|(p, f)| (p.clone(), f.written)).collect();
        Ok(Some(Box::new(PersistedFork(lengths))))
    }
    fn restore(&mut self, bytes: &[u8]) -> Result<()> {
        let lengths: Vec<(String, u64)> = from_bytes(bytes)?;
        let recorded: BTreeMap<String, u64> = lengths.into_iter().collect();
        for (partition, path) in self.own_files()? {
            match recorded.get(&partition) {
                Some(&len) => {
                    let file = cut_back(&path, len)?;
                    file.sync_all().map_err(|e| Error::io("cannot sync output file", &path, e))?;
                }
                // Written after the checkpoint: the replay writes it again.
                None => std::fs::remove_file(&path).map_err(|e| Error::io("cannot remove output file", &path, e))?,
            }
        }
        self.files.clear();
        for (partition, len) in recorded {
            if len > 0 && !self.path_of(&partition).exists() {
                return Err(Error::Corrupt(format!(
                    "{} is missing; the checkpoint recorded {len} bytes in it",
                    self.path_of(&partition).display()
                )));
            }
            self.files.insert(partition, PartitionFile { written: len, ..PartitionFile::default() });
        }
        self.prepared = true;
        Ok(())
    }
}

// Their fields are closures, shared internals or whole state: a name says enough.
crate::debug_as_name!([P, F] PartitionedFileSink<P, F>);

#[cfg(test)]
mod tests {
    use super::*;

    type Line = (u32, &'static str);

    type TestSink = PartitionedFileSink<fn(&Line, &mut String), fn(&Line, &mut Vec<u8>)>;

    fn sink(dir: &Path) -> TestSink {
        let partition: fn(&Line, &mut String) = |r, p| p.push_str(r.1);
        let format: fn(&Line, &mut Vec<u8>) = |r, out| out.extend_from_slice(format!("{}\n", r.0).as_bytes());
        PartitionedFileSink::create(dir, 1, partition, format).unwrap()
    }

    fn snapshot_bytes(state: Option<Box<dyn ForkedState>>) -> Vec<u8> {
        let mut bytes = Vec::new();
        state.unwrap().write_to(&mut bytes).unwrap();
        bytes
    }

    fn read(dir: &Path, partition: &str) -> String {
        std::fs::read_to_string(dir.join(partition).join("part-1")).unwrap_or_default()
    }

    #[test]
    fn records_go_to_their_partitions_and_a_restore_takes_back_what_followed_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = sink(dir.path());
        s.write(&mut vec![(1, "dt=a/hm=1"), (2, "dt=a/hm=2"), (3, "dt=a/hm=1")]).unwrap();
        let bytes = snapshot_bytes(s.pre_commit(1).unwrap());
        s.write(&mut vec![(4, "dt=a/hm=1"), (5, "dt=b/hm=1")]).unwrap();
        s.finish().unwrap();
        assert_eq!(read(dir.path(), "dt=a/hm=1"), "1\n3\n4\n");
        assert_eq!(read(dir.path(), "dt=b/hm=1"), "5\n");

        // A restart from checkpoint 1: what came after it is gone, the replay writes it again.
        let mut again = sink(dir.path());
        again.restore(&bytes).unwrap();
        assert_eq!(read(dir.path(), "dt=a/hm=1"), "1\n3\n");
        assert_eq!(read(dir.path(), "dt=a/hm=2"), "2\n");
        assert!(!dir.path().join("dt=b/hm=1/part-1").exists());
        again.write(&mut vec![(4, "dt=a/hm=1"), (5, "dt=b/hm=1")]).unwrap();
        again.finish().unwrap();
        assert_eq!(read(dir.path(), "dt=a/hm=1"), "1\n3\n4\n");
        assert_eq!(read(dir.path(), "dt=b/hm=1"), "5\n");

        // A fresh start removes this subtask's files (not another subtask's).
        std::fs::write(dir.path().join("dt=a/hm=1/part-0"), "other\n").unwrap();
        let mut fresh = sink(dir.path());
        fresh.write(&mut vec![(9, "dt=c")]).unwrap();
        fresh.finish().unwrap();
        assert_eq!(read(dir.path(), "dt=a/hm=1"), "");
        assert_eq!(read(dir.path(), "dt=c"), "9\n");
        assert_eq!(std::fs::read_to_string(dir.path().join("dt=a/hm=1/part-0")).unwrap(), "other\n");
    }

    #[test]
    fn a_partition_may_not_leave_the_folder_and_a_short_file_is_damage() {
        let dir = tempfile::tempdir().unwrap();
        for bad in ["", "../x", "/etc", "a/../../b"] {
            let err = sink(dir.path()).write(&mut vec![(1, bad)]).unwrap_err();
            assert!(err.to_string().contains("relative folder path"), "{bad:?}: {err}");
        }
        let mut s = sink(dir.path());
        s.write(&mut vec![(1, "p"), (22, "p")]).unwrap();
        let bytes = snapshot_bytes(s.pre_commit(1).unwrap());
        std::fs::write(dir.path().join("p/part-1"), "1\n").unwrap();
        let err = sink(dir.path()).restore(&bytes).unwrap_err();
        assert!(err.to_string().contains("holds 2 bytes; the checkpoint recorded 5"), "{err}");
    }
}
