//! Lines of text from a file or a folder of files.
//!
//! Files are taken in name order. Each file is split into `parallelism` byte ranges; a subtask
//! reads the lines that *start* in its ranges (a line crossing a range boundary belongs to the
//! range it starts in), so every line is read exactly once at any parallelism. Invalid UTF-8 is
//! replaced by U+FFFD (which is not alphanumeric, so it separates words); a trailing `\r` is
//! dropped.

use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use super::{Source, SourcePoll};
use crate::context::TaskContext;
use crate::error::{Error, Result};

/// A text source over a file or a folder of files (not recursive; hidden files skipped).
#[derive(Clone, Debug)]
pub struct TextSource {
    files: Vec<(PathBuf, u64)>,
}

impl TextSource {
    /// Lists the input. Fails with a clear error when `path` is missing or unreadable.
    pub fn open(path: impl AsRef<Path>) -> Result<TextSource> {
        let path = path.as_ref();
        let meta = std::fs::metadata(path).map_err(|e| Error::io("cannot read input", path, e))?;
        let mut files = Vec::new();
        if meta.is_dir() {
            let entries = std::fs::read_dir(path).map_err(|e| Error::io("cannot list input folder", path, e))?;
            for entry in entries {
                let entry = entry.map_err(|e| Error::io("cannot list input folder", path, e))?;
                let p = entry.path();
                let hidden = p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with('.'));
                let m = std::fs::metadata(&p).map_err(|e| Error::io("cannot read input file", &p, e))?;
                if m.is_file() && !hidden {
                    files.push((p, m.len()));
                }
            }
            files.sort();
        } else {
            files.push((path.to_path_buf(), meta.len()));
        }
        Ok(TextSource { files })
    }

    /// The files, in reading order, with their sizes.
    pub fn files(&self) -> &[(PathBuf, u64)] {
        &self.files
    }

    /// Total bytes of input.
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|(_, n)| n).sum()
    }

    pub(crate) fn subtask(&self, subtask: usize, parallelism: usize) -> TextSubtask {
        let ranges = self
            .files
            .iter()
            .map(|(p, len)| {
                let (s, n) = (subtask as u64, parallelism as u64);
                (p.clone(), len * s / n, len * (s + 1) / n)
            })
            .filter(|(_, a, b)| a < b)
            .collect();
        TextSubtask { ranges, next_range: 0, open: None, buf: Vec::new() }
    }
}

struct OpenRange {
    reader: BufReader<File>,
    path: PathBuf,
    /// Byte position of the next line's start.
    pos: u64,
    end: u64,
}

pub(crate) struct TextSubtask {
    ranges: Vec<(PathBuf, u64, u64)>,
    next_range: usize,
    open: Option<OpenRange>,
    buf: Vec<u8>,
}

impl TextSubtask {
    fn open_next(&mut self) -> Result<bool> {
        let Some((path, start, end)) = self.ranges.get(self.next_range).cloned() else {
            return Ok(false);
        };
        self.next_range += 1;
        let file = File::open(&path).map_err(|e| Error::io("cannot open input file", &path, e))?;
        let mut reader = BufReader::with_capacity(256 * 1024, file);
        let mut pos = start;
        if start > 0 {
            // Skip the line that started in the previous range (up to and including the first
            // newline at or after start - 1).
            reader.seek(SeekFrom::Start(start - 1)).map_err(|e| Error::io("cannot seek input file", &path, e))?;
            self.buf.clear();
            let n =
                reader.read_until(b'\n', &mut self.buf).map_err(|e| Error::io("cannot read input file", &path, e))?;
            pos = start - 1 + n as u64;
        }
        self.open = Some(OpenRange { reader, path, pos, end });
        Ok(true)
    }
}

impl Source<String> for TextSubtask {
    /// The offset is (range index, byte position of the next line in that range's file), or
    /// (range index, `u64::MAX`) for a range not opened yet.
    fn offset(&self) -> Option<Vec<u8>> {
        let (range, pos) = match &self.open {
            Some(open) => (self.next_range - 1, open.pos),
            None => (self.next_range, u64::MAX),
        };
        Some(crate::persist::to_bytes(&(range as u64, pos)))
    }

    fn seek(&mut self, offset: &[u8]) -> Result<()> {
        let (range, pos): (u64, u64) = crate::persist::from_bytes(offset)?;
        let range = range as usize;
        self.open = None;
        self.next_range = range;
        let Some((path, start, end)) = self.ranges.get(range).cloned() else {
            return Ok(()); // everything was read
        };
        if pos == u64::MAX {
            return Ok(()); // the range opens as usual, skipping a line begun in the previous one
        }
        if pos < start {
            return Err(Error::Corrupt(format!("text offset {pos} before its range in {}", path.display())));
        }
        let file = File::open(&path).map_err(|e| Error::io("cannot open input file", &path, e))?;
        let mut reader = BufReader::with_capacity(256 * 1024, file);
        reader.seek(SeekFrom::Start(pos)).map_err(|e| Error::io("cannot seek input file", &path, e))?;
        self.next_range = range + 1;
        self.open = Some(OpenRange { reader, path, pos, end });
        Ok(())
    }

    fn poll(&mut self, _ctx: &TaskContext, out: &mut Vec<String>, max: usize) -> Result<SourcePoll> {
        let mut emitted = 0;
        while emitted < max {
            let Some(open) = self.open.as_mut() else {
                if !self.open_next()? {
                    return Ok(if emitted > 0 { SourcePoll::Emitted } else { SourcePoll::Finished });
                }
                continue;
            };
            if open.pos >= open.end {
                self.open = None;
                continue;
            }
            self.buf.clear();
            let n = open
                .reader
                .read_until(b'\n', &mut self.buf)
                .map_err(|e| Error::io("cannot read input file", &open.path, e))?;
            if n == 0 {
                self.open = None;
                continue;
            }
            open.pos += n as u64;
            let mut line: &[u8] = &self.buf;
            if let Some(l) = line.strip_suffix(b"\n") {
                line = l;
            }
            if let Some(l) = line.strip_suffix(b"\r") {
                line = l;
            }
            out.push(String::from_utf8_lossy(line).into_owned());
            emitted += 1;
        }
        Ok(SourcePoll::Emitted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(src: &TextSource, p: usize) -> Vec<String> {
        let ctx = TaskContext::for_test("text", 0, p);
        let mut lines = Vec::new();
        for s in 0..p {
            let mut sub = src.subtask(s, p);
            while sub.poll(&ctx, &mut lines, 3).unwrap() != SourcePoll::Finished {}
        }
        lines
    }

    #[test]
    fn every_line_once_at_any_parallelism() {
        let dir = tempfile::tempdir().unwrap();
        let text = "alpha beta\r\ngamma\n\ndelta epsilon zeta\nlast line without newline";
        std::fs::write(dir.path().join("b.txt"), text).unwrap();
        std::fs::write(dir.path().join("a.txt"), "first\n").unwrap();
        std::fs::write(dir.path().join(".hidden"), "not me\n").unwrap();
        let src = TextSource::open(dir.path()).unwrap();
        assert_eq!(src.files().len(), 2);
        let mut expected: Vec<String> = vec!["first".into()];
        expected.extend(text.split('\n').map(|l| l.trim_end_matches('\r').to_string()));
        expected.sort();
        for p in 1..=7 {
            let mut got = read_all(&src, p);
            got.sort();
            assert_eq!(got, expected, "parallelism {p}");
        }
    }

    #[test]
    fn a_missing_input_is_a_clear_error() {
        let err = TextSource::open("/no/such/input").unwrap_err();
        assert!(err.to_string().contains("/no/such/input"), "{err}");
    }
}
