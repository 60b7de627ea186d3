//! Lines of text from a file or a folder of files: the replayable file source.
//!
//! Files are taken in name order. Each file is split into `parallelism` byte ranges; a subtask
//! reads the lines that *start* in its ranges (a line crossing a range boundary belongs to the
//! range it starts in), so every line is read exactly once at any parallelism. Invalid UTF-8 is
//! replaced by U+FFFD (which is not alphanumeric, so it separates words); a trailing `\r` is
//! dropped.
//!
//! The offset is the list of spans a subtask has left to read, each a file name and a byte
//! range (the current one starting at the next line), so recovery resumes at the exact byte,
//! and a restore at another parallelism deals the old subtasks' spans out to the new ones. In
//! follow mode the last file is read as a growing log: its span has no end, a line is emitted
//! only once its newline is there, and the source never finishes by itself (stop the job).
//!
//! An input that is not a regular file with a size — a pipe, a device, `-` for standard
//! input, or a file that reports no size (those under `/proc`) — is read as a stream by one
//! subtask, to its end. A pipe or standard input cannot be read again, so it cannot replay from
//! a checkpoint. The offset also records each input file's size and modification time; a
//! resumed run whose input changed since (other than a followed log growing) is refused,
//! naming the file, since the positions it resumes at would no longer mean the same lines.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{Source, SourcePoll};
use crate::context::TaskContext;
use crate::error::{Error, Result};
use crate::persist::{from_bytes, to_bytes};

/// The end of a followed file's span: none.
const FOLLOWED: u64 = u64::MAX;

/// The longest line read by default: a longer one is an error, not unbounded memory.
pub(crate) const MAX_LINE_BYTES: u64 = 64 << 20;

/// A text source over a file or a folder of files (not recursive; hidden files skipped).
///
/// ```
/// use weir::{source::TextSource, Job, RunConfig, Word};
/// let dir = std::env::temp_dir().join(format!("weir-doc-text-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// std::fs::write(dir.join("a.txt"), "to be or\nnot to be\n").unwrap();
/// let job = Job::new("words");
/// let words = job
///     .text(TextSource::open(&dir).unwrap())
///     .flat_map(|line: &str, out| line.split_whitespace().for_each(|w| out.emit(Word::new(w))))
///     .collect();
/// job.execute(RunConfig::default()).unwrap();
/// assert_eq!(words.lock().unwrap().len(), 6);
/// # std::fs::remove_dir_all(&dir).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct TextSource {
    files: Arc<Vec<InputFile>>,
    follow: bool,
    max_line: u64,
    /// The single input is a stream, read to its end by one subtask (see the module doc).
    stream: Option<StreamInput>,
}

/// One input file as it was listed.
#[derive(Clone, Debug)]
struct InputFile {
    path: PathBuf,
    len: u64,
    /// Modification time, nanoseconds since the Unix epoch (0 if unknown).
    modified_ns: u64,
}

/// How a stream input can be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StreamInput {
    /// A file that reports no size but can be opened again (under `/proc`, say).
    Reopenable,
    /// A pipe, a device or standard input: read once.
    Once,
}

fn modified_ns(m: &std::fs::Metadata) -> u64 {
    m.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map_or(0, |d| d.as_nanos() as u64)
}

impl InputFile {
    fn of(path: PathBuf, m: &std::fs::Metadata) -> Self {
        InputFile { path, len: m.len(), modified_ns: modified_ns(m) }
    }

    fn name(&self) -> String {
        self.path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned())
    }
}

impl TextSource {
    /// Lists the input. Fails with a clear error when `path` is missing or unreadable.
    /// `-` reads standard input. A folder's subfolders and special files (pipes, devices)
    /// are refused, not skipped.
    pub fn open(path: impl AsRef<Path>) -> Result<TextSource> {
        let path = path.as_ref();
        let path = if path == Path::new("-") { Path::new("/dev/stdin") } else { path };
        let meta = std::fs::metadata(path).map_err(|e| Error::io("cannot read input", path, e))?;
        let mut files = Vec::new();
        let mut stream = None;
        if meta.is_dir() {
            let entries = std::fs::read_dir(path).map_err(|e| Error::io("cannot list input folder", path, e))?;
            for entry in entries {
                let entry = entry.map_err(|e| Error::io("cannot list input folder", path, e))?;
                let p = entry.path();
                if p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with('.')) {
                    continue;
                }
                let m = std::fs::metadata(&p).map_err(|e| Error::io("cannot read input file", &p, e))?;
                if m.is_dir() {
                    return Err(Error::config(format!(
                        "input folder {} holds a folder, {}: the files directly in an input folder are read, not \
                         its subfolders; move it out, or name it as the input",
                        path.display(),
                        p.display()
                    )));
                }
                if !m.is_file() {
                    return Err(Error::config(format!(
                        "input folder {} holds {}, which is not a regular file (a pipe or a device): name it as the \
                         input on its own to read it as a stream",
                        path.display(),
                        p.display()
                    )));
                }
                files.push(InputFile::of(p, &m));
            }
            files.sort_by(|a, b| a.path.cmp(&b.path));
        } else {
            if !meta.is_file() {
                stream = Some(StreamInput::Once);
            } else if meta.len() == 0 {
                stream = Some(StreamInput::Reopenable);
            }
            files.push(InputFile::of(path.to_path_buf(), &meta));
        }
        Ok(TextSource { files: Arc::new(files), follow: false, max_line: MAX_LINE_BYTES, stream })
    }

    /// The longest line accepted, newline included (default 64 MiB); a longer
    /// one fails the job
    /// with an error naming the file and position (it is likely not a text file).
    pub fn max_line_bytes(mut self, bytes: u64) -> Self {
        self.max_line = bytes.max(1);
        self
    }

    /// Follow mode: keep reading the last file (in name order) as it grows, like `tail -f`;
    /// the source then never finishes by itself.
    pub fn follow(mut self, follow: bool) -> Self {
        self.follow = follow;
        self
    }

    /// The files, in reading order, with their sizes when listed.
    pub fn files(&self) -> Vec<(&Path, u64)> {
        self.files.iter().map(|f| (f.path.as_path(), f.len)).collect()
    }

    /// Total bytes of input (when listed; 0 for a stream).
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.len).sum()
    }

    /// Whether the input can be read again from a checkpoint's positions (not a pipe or
    /// standard input).
    pub fn replayable(&self) -> bool {
        self.stream != Some(StreamInput::Once)
    }

    pub(crate) fn subtask(&self, subtask: usize, parallelism: usize) -> TextSubtask {
        let (s, n) = (subtask as u64, parallelism as u64);
        let last = self.files.len().saturating_sub(1);
        let mut spans = VecDeque::new();
        for (file, len) in self.files.iter().map(|f| f.len).enumerate() {
            if (self.follow && file == last) || self.stream.is_some() {
                // A growing file cannot be split by length: one subtask reads it all.
                if file % parallelism == subtask {
                    spans.push_back(Span { file, start: 0, end: FOLLOWED, at_line_start: true });
                }
                continue;
            }
            let (start, end) = (len * s / n, len * (s + 1) / n);
            if start < end {
                spans.push_back(Span { file, start, end, at_line_start: start == 0 });
            }
        }
        TextSubtask {
            files: Arc::clone(&self.files),
            replayable: self.replayable(),
            follow: self.follow,
            max_line: self.max_line,
            blocks: false,
            spans,
            open: None,
            buf: Vec::new(),
            read: Vec::new(),
        }
    }
}

/// A byte range of one file still to read: the lines that start in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    file: usize,
    start: u64,
    end: u64,
    /// `start` is the start of a line (else the line begun before it belongs to another span).
    at_line_start: bool,
}

struct OpenSpan {
    reader: BufReader<File>,
    file: usize,
    /// Byte position of the next line's start.
    pos: u64,
    end: u64,
    /// Where reading began, and the CRC-32C of the bytes read since (up to `pos`).
    read_from: u64,
    crc: u32,
}

/// Bytes a subtask read of one file: (file, from, to, CRC-32C of them). Kept in the offset,
/// so a resume can tell an input that only got a new modification time (`touch`, a copy)
/// from one whose content changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ReadDigest {
    file: usize,
    from: u64,
    to: u64,
    crc: u32,
}

pub(crate) struct TextSubtask {
    files: Arc<Vec<InputFile>>,
    replayable: bool,
    follow: bool,
    max_line: u64,
    /// Each record is a block of whole lines, `\n`-separated, instead of one line.
    blocks: bool,
    spans: VecDeque<Span>,
    open: Option<OpenSpan>,
    buf: Vec<u8>,
    /// What this subtask read of spans it finished (and, after a restore, what the restored
    /// offset says was read).
    read: Vec<ReadDigest>,
}

/// A span in an offset: (file name, start, end, at line start).
type StoredSpan = (String, u64, u64, bool);
/// Bytes read, in an offset: (file name, from, to, CRC-32C).
type StoredDigest = (String, u64, u64, u32);
/// An input file as the offset records it: (name, size and modification time in ns when
/// listed, whether the run follows it as a growing log).
type ListedFile = (String, u64, u64, bool);

/// Bytes a block of lines grows to before it is emitted. Small, so that what one block
/// becomes downstream (its words, then the key-by stage, about ten times its size) stays in
/// the core's own caches: 4 KiB blocks ran the word count 12% faster than 64 KiB ones
/// (median of 6 alternating runs each).
const BLOCK_BYTES: usize = 4 * 1024;

/// Lines (or blocks) read per round when a stopped source reads the rest of its input.
const READ_TO_END_BATCH: usize = 1024;

/// Each open file's read buffer.
const READ_BUFFER_BYTES: usize = 256 * 1024;

/// A text source subtask with more than this much of its input left to read reports a
/// backlog ([`crate::source::Source::backlog`]): at the word count's ~100 MB/s per core, a
/// few seconds of catching up.
pub const TEXT_BACKLOG_BYTES: u64 = 256 * 1024 * 1024;

impl TextSubtask {
    fn path(&self, file: usize) -> &Path {
        &self.files[file].path
    }

    fn open_next(&mut self) -> Result<bool> {
        let Some(span) = self.spans.pop_front() else {
            return Ok(false);
        };
        let path = self.path(span.file).to_path_buf();
        let file = File::open(&path).map_err(|e| Error::io("cannot open input file", &path, e))?;
        let mut reader = BufReader::with_capacity(READ_BUFFER_BYTES, file);
        let mut pos = span.start;
        let (mut read_from, mut crc) = (pos, 0);
        if !span.at_line_start {
            // Skip the line that started in the previous span (up to and including the first
            // newline at or after start - 1).
            reader.seek(SeekFrom::Start(pos - 1)).map_err(|e| Error::io("cannot seek input file", &path, e))?;
            self.buf.clear();
            let n =
                reader.read_until(b'\n', &mut self.buf).map_err(|e| Error::io("cannot read input file", &path, e))?;
            (read_from, crc) = (pos - 1, crc32c::crc32c(&self.buf));
            pos = pos - 1 + n as u64;
        } else if pos > 0 {
            reader.seek(SeekFrom::Start(pos)).map_err(|e| Error::io("cannot seek input file", &path, e))?;
        }
        self.open = Some(OpenSpan { reader, file: span.file, pos, end: span.end, read_from, crc });
        Ok(true)
    }

    /// Ends the open span, keeping what was read of it.
    fn close_open(&mut self) {
        if let Some(o) = self.open.take() {
            self.read.push(ReadDigest { file: o.file, from: o.read_from, to: o.pos, crc: o.crc });
        }
    }

    /// What this subtask has read: of finished spans, and of the open one so far.
    fn read_so_far(&self) -> impl Iterator<Item = ReadDigest> + '_ {
        let open = self.open.as_ref().map(|o| ReadDigest { file: o.file, from: o.read_from, to: o.pos, crc: o.crc });
        self.read.iter().copied().chain(open).filter(|d| d.to > d.from)
    }

    /// Every span left, the open one first (from its next line).
    fn remaining(&self) -> Vec<Span> {
        let open = self.open.as_ref().map(|o| Span { file: o.file, start: o.pos, end: o.end, at_line_start: true });
        open.into_iter().chain(self.spans.iter().copied()).filter(|s| s.start < s.end).collect()
    }

    /// The spans an offset says are left, and what it says was read, checked against the
    /// input as it is now: a file of another size, or of the same size and a new modification
    /// time whose bytes read differ, changed (a `touch` alone, or a copy of the same content,
    /// did not).
    fn decode(&self, offset: &[u8]) -> Result<(Vec<Span>, Vec<ReadDigest>)> {
        // Offsets of weirs before the digests hold no third part.
        let (stored, listed, digests): (Vec<StoredSpan>, Vec<ListedFile>, Option<Vec<StoredDigest>>) =
            match from_bytes::<(Vec<StoredSpan>, Vec<ListedFile>, Vec<StoredDigest>)>(offset) {
                Ok((s, l, d)) => (s, l, Some(d)),
                Err(_) => {
                    let (s, l): (Vec<StoredSpan>, Vec<ListedFile>) = from_bytes(offset)?;
                    (s, l, None)
                }
            };
        let index = |name: &str| self.files.iter().position(|f| f.name() == name);
        let read: Vec<ReadDigest> = digests
            .iter()
            .flatten()
            .filter_map(|(name, from, to, crc)| {
                Some(ReadDigest { file: index(name)?, from: *from, to: *to, crc: *crc })
            })
            .collect();
        for (name, len, modified, followed) in &listed {
            let Some(i) = index(name) else { continue };
            let now = &self.files[i];
            // A followed log grows (whichever subtask reads it).
            let grew = *followed && now.len >= *len;
            let changed = match () {
                _ if grew => None,
                _ if now.len != *len => Some(format!("it is {} bytes now", now.len)),
                _ if now.modified_ns == *modified => None,
                _ if digests.is_none() => Some("it was modified since".to_string()),
                _ => read.iter().filter(|d| d.file == i).find_map(|d| match crc_of(&now.path, d.from, d.to) {
                    Ok(crc) if crc == d.crc => None,
                    Ok(_) => Some(format!("bytes {}..{} the job had read differ", d.from, d.to)),
                    Err(e) => Some(e.to_string()),
                }),
            };
            if let Some(what) = changed {
                return Err(Error::config(format!(
                    "input file {} changed since the checkpoint was taken: {what} (the checkpoint recorded {len} \
                     bytes, last modified {}). The positions the job would resume at no longer mean the same \
                     lines. Put the input back as it was, or start afresh: remove the checkpoint directory and \
                     the output the job wrote",
                    now.path.display(),
                    crate::record::utc_text(*modified),
                )));
            }
        }
        let spans =         stored
            .into_iter()
            .map(|(name, start, end, at_line_start)| {
                let file = self.files.iter().position(|f| f.name() == name).ok_or_else(|| {
                    Error::config(format!("the checkpoint reads input file '{name}', which is not in the input any more"))
                })?;
                let (path, len) = (&self.files[file].path, &self.files[file].len);
                if start > *len && end != FOLLOWED {
                    return Err(Error::config(format!(
                        "input file {} is shorter ({len} bytes) than the checkpoint had read ({start}): the input changed",
                        path.display()
                    )));
                }
                // A span with no end (a followed log, a stream) is read to the end of the file
                // when the run does not follow it.
                Ok(Span { file, start, end, at_line_start })
            })
            .collect::<Result<Vec<Span>>>()?;
        Ok((spans, read))
    }
}

impl TextSubtask {
    /// Bytes of its input left to read (a followed file's growth not counted).
    fn left_to_read(&self) -> u64 {
        let open = self.open.as_ref().filter(|o| o.end != FOLLOWED).map_or(0, |o| o.end.saturating_sub(o.pos));
        let spans = self.spans.iter().filter(|s| s.end != FOLLOWED).map(|s| s.end.saturating_sub(s.start));
        spans.fold(open, u64::saturating_add)
    }
}

impl Source<String> for TextSubtask {
    fn backlog(&self) -> bool {
        self.left_to_read() > TEXT_BACKLOG_BYTES
    }

    /// Every span left to read, the current one from the next line.
    fn offset(&self) -> Option<Vec<u8>> {
        let stored: Vec<StoredSpan> = self
            .remaining()
            .into_iter()
            .map(|s| (self.files[s.file].name(), s.start, s.end, s.at_line_start))
            .collect();
        let last = self.files.len().saturating_sub(1);
        let listed: Vec<ListedFile> = self
            .files
            .iter()
            .enumerate()
            .map(|(i, f)| (f.name(), f.len, f.modified_ns, self.follow && i == last))
            .collect();
        let read: Vec<StoredDigest> =
            self.read_so_far().map(|d| (self.files[d.file].name(), d.from, d.to, d.crc)).collect();
        Some(to_bytes(&(stored, listed, read)))
    }

    fn replayable(&self) -> bool {
        self.replayable
    }

    fn seek(&mut self, offset: &[u8]) -> Result<()> {
        let (spans, read) = self.decode(offset)?;
        (self.spans, self.read, self.open) = (spans.into(), read, None);
        Ok(())
    }

    fn seek_rescaled(&mut self, parts: &[(usize, &[u8])], subtask: usize, parallelism: usize) -> Result<()> {
        let (mut all, mut read) = (Vec::new(), Vec::new());
        for (_, bytes) in parts {
            let (spans, digests) = self.decode(bytes)?;
            all.extend(spans);
            read.extend(digests);
        }
        all.sort_by_key(|s| (s.file, s.start));
        read.sort_by_key(|d| (d.file, d.from));
        let mine = |i: usize| i % parallelism == subtask;
        self.spans = all.into_iter().enumerate().filter(|(i, _)| mine(*i)).map(|(_, s)| s).collect();
        self.read = read.into_iter().enumerate().filter(|(i, _)| mine(*i)).map(|(_, d)| d).collect();
        self.open = None;
        Ok(())
    }

    fn poll(&mut self, _ctx: &TaskContext, out: &mut Vec<String>, max: usize) -> Result<SourcePoll> {
        self.read(out, max, |line| String::from_utf8_lossy(line).into_owned(), into_text)
    }

    fn on_stop(&mut self, _ctx: &TaskContext, out: &mut Vec<String>) -> Result<()> {
        self.read_to_end(out, |line| String::from_utf8_lossy(line).into_owned(), into_text)
    }
}

/// A text source subtask that hands over blocks of whole lines as bytes (for word splitting
/// that needs neither lines nor checked UTF-8).
pub(crate) struct TextBlocks(TextSubtask);

impl TextBlocks {
    pub(crate) fn new(mut lines: TextSubtask) -> Self {
        lines.blocks = true;
        TextBlocks(lines)
    }
}

impl Source<Vec<u8>> for TextBlocks {
    fn offset(&self) -> Option<Vec<u8>> {
        self.0.offset()
    }
    fn backlog(&self) -> bool {
        self.0.backlog()
    }
    fn replayable(&self) -> bool {
        self.0.replayable
    }
    fn seek(&mut self, offset: &[u8]) -> Result<()> {
        self.0.seek(offset)
    }
    fn seek_rescaled(&mut self, parts: &[(usize, &[u8])], subtask: usize, parallelism: usize) -> Result<()> {
        self.0.seek_rescaled(parts, subtask, parallelism)
    }
    fn poll(&mut self, _ctx: &TaskContext, out: &mut Vec<Vec<u8>>, max: usize) -> Result<SourcePoll> {
        self.0.read(out, max, <[u8]>::to_vec, |block| block)
    }

    /// The lines the blocks hold (a last line without its newline is one too): the input's
    /// records are lines, however they travel.
    fn records_in(&self, emitted: &[Vec<u8>]) -> u64 {
        emitted.iter().map(|b| lines_in(b)).sum()
    }

    fn on_stop(&mut self, _ctx: &TaskContext, out: &mut Vec<Vec<u8>>) -> Result<()> {
        self.0.read_to_end(out, <[u8]>::to_vec, |block| block)
    }
}

/// Lines in a block of whole lines, the last perhaps without its newline. Counted in 64-byte
/// chunks the compiler turns into vector compares: a fraction of the cost of the word
/// splitting every block goes through next.
pub(crate) fn lines_in(block: &[u8]) -> u64 {
    let mut chunks = block.chunks_exact(64);
    // A chunk's count fits a byte: summed as bytes, the compare and add stay 16 or 32 lanes wide.
    let mut n: u64 =
        chunks.by_ref().map(|c| u64::from(c.iter().fold(0u8, |n, &b| n.wrapping_add(u8::from(b == b'\n'))))).sum();
    n += chunks.remainder().iter().filter(|&&b| b == b'\n').count() as u64;
    n + u64::from(block.last().is_some_and(|&b| b != b'\n'))
}

impl TextSubtask {
    /// Stops following: reads what is left up to the end of the input as it is now, a last
    /// line without its newline included.
    fn read_to_end<R>(
        &mut self,
        out: &mut Vec<R>,
        line_record: impl Fn(&[u8]) -> R + Copy,
        block_record: impl Fn(Vec<u8>) -> R + Copy,
    ) -> Result<()> {
        self.follow = false;
        while self.read(out, READ_TO_END_BATCH, line_record, block_record)? == SourcePoll::Emitted {}
        Ok(())
    }

    /// Reads up to `max` lines (or, in block mode, one block of lines) into `out`.
    fn read<R>(
        &mut self,
        out: &mut Vec<R>,
        max: usize,
        line_record: impl Fn(&[u8]) -> R,
        block_record: impl Fn(Vec<u8>) -> R,
    ) -> Result<SourcePoll> {
        let mut emitted = 0;
        let mut block = Vec::new();
        let result = loop {
            if self.blocks && block.len() >= BLOCK_BYTES {
                out.push(block_record(std::mem::take(&mut block)));
                emitted += 1;
            }
            // A block is a batch in itself: return it, so barriers and stops are not held up.
            if emitted >= max || (self.blocks && emitted > 0) {
                break SourcePoll::Emitted;
            }
            let Some(open) = self.open.as_mut() else {
                if !self.open_next()? {
                    let done = if self.follow { SourcePoll::Idle } else { SourcePoll::Finished };
                    break if emitted > 0 || !block.is_empty() { SourcePoll::Emitted } else { done };
                }
                continue;
            };
            if open.pos >= open.end {
                self.close_open();
                continue;
            }
            let path = &self.files[open.file].path;
            if self.blocks && self.max_line >= READ_BUFFER_BYTES as u64 && take_whole_lines(open, path, &mut block)? {
                continue;
            }
            let line_start = block.len();
            // At most one byte past the limit: a longer line is refused, never held whole.
            let n = (&mut open.reader)
                .take(self.max_line + 1)
                .read_until(b'\n', &mut block)
                .map_err(|e| Error::io("cannot read input file", path, e))?;
            // This read's line (a block holds earlier lines too).
            let complete = block.len() > line_start && block.last() == Some(&b'\n');
            if n as u64 > self.max_line {
                return Err(line_too_long(path, open.pos, self.max_line));
            }
            if self.follow && open.end == FOLLOWED && !complete {
                // The log's last line is still being written: read it again once it is whole.
                block.truncate(line_start);
                if n > 0 {
                    open.reader
                        .seek(SeekFrom::Start(open.pos))
                        .map_err(|e| Error::io("cannot seek input file", path, e))?;
                }
                break if emitted > 0 || !block.is_empty() { SourcePoll::Emitted } else { SourcePoll::Idle };
            }
            if n == 0 {
                self.close_open();
                continue;
            }
            open.crc = crc32c::crc32c_append(open.crc, &block[line_start..]);
            open.pos += n as u64;
            if self.blocks {
                if !complete {
                    block.push(b'\n');
                }
                continue;
            }
            out.push(line_record(without_line_end(&block)));
            block.clear();
            emitted += 1;
        };
        if !block.is_empty() {
            out.push(block_record(block));
        }
        Ok(result)
    }
}

/// A line longer than the limit `max` at byte `at` of `path`: refused, never held whole.
#[cold]
fn line_too_long(path: &Path, at: u64, max: u64) -> Error {
    Error::Corrupt(format!(
        "{}: the line at byte {at} is longer than {max} bytes (is this a text file?)",
        path.display()
    ))
}

/// `line` without its `\n` or `\r\n`.
#[inline]
fn without_line_end(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// Many whole lines at once into `block`, straight from `open`'s read buffer: a byte before
/// the span's end is in a line that starts before it (so is this span's), and the bytes up to
/// the last newline among them are whole lines. Lines can be no longer than the buffer here
/// (the caller checked), so none is over the limit. False where it took nothing: a line
/// across the buffer's end or the span's is read line by line.
#[inline]
fn take_whole_lines(open: &mut OpenSpan, path: &Path, block: &mut Vec<u8>) -> Result<bool> {
    let buffered = open.reader.fill_buf().map_err(|e| Error::io("cannot read input file", path, e))?;
    let ours = buffered
        .len()
        .min(usize::try_from(open.end - open.pos).unwrap_or(usize::MAX))
        .min(BLOCK_BYTES.saturating_sub(block.len()));
    let Some(last) = buffered[..ours].iter().rposition(|&b| b == b'\n') else { return Ok(false) };
    if block.capacity() == 0 {
        block.reserve_exact(BLOCK_BYTES + 4096);
    }
    block.extend_from_slice(&buffered[..=last]);
    open.crc = crc32c::crc32c_append(open.crc, &buffered[..=last]);
    open.reader.consume(last + 1);
    open.pos += last as u64 + 1;
    Ok(true)
}

/// The CRC-32C of bytes `from..to` of the file at `path`.
fn crc_of(path: &Path, from: u64, to: u64) -> Result<u32> {
    let mut f = File::open(path).map_err(|e| Error::io("cannot open input file", path, e))?;
    f.seek(SeekFrom::Start(from)).map_err(|e| Error::io("cannot seek input file", path, e))?;
    let (mut crc, mut left, mut buf) = (0u32, to.saturating_sub(from), vec![0u8; 1 << 16]);
    while left > 0 {
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = f.read(&mut buf[..want]).map_err(|e| Error::io("cannot read input file", path, e))?;
        if n == 0 {
            break;
        }
        crc = crc32c::crc32c_append(crc, &buf[..n]);
        left -= n as u64;
    }
    Ok(crc)
}

/// Bytes as text: moved when valid UTF-8 (checked once), else with U+FFFD for invalid bytes.
fn into_text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests drive the engine from outside: their threads and clocks are theirs
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

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests drive the engine from outside: their threads and clocks are theirs
mod span_tests {
    use super::*;

    fn drain(sub: &mut TextSubtask, ctx: &TaskContext, lines: &mut Vec<String>) -> SourcePoll {
        loop {
            match sub.poll(ctx, lines, 2).unwrap() {
                SourcePoll::Emitted => continue,
                other => return other,
            }
        }
    }

    /// What is left to read, for the backlog a subtask reports: its whole range at first,
    /// less as it reads, nothing at the end.
    #[test]
    fn what_is_left_to_read_shrinks_to_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let text: String = (0..100).map(|i| format!("line {i}\n")).collect();
        std::fs::write(dir.path().join("a.txt"), &text).unwrap();
        let src = TextSource::open(dir.path()).unwrap();
        let ctx = TaskContext::for_test("text", 0, 2);
        let (mut first, second) = (src.subtask(0, 2), src.subtask(1, 2));
        assert_eq!(first.left_to_read() + second.left_to_read(), text.len() as u64);
        let before = first.left_to_read();
        first.poll(&ctx, &mut Vec::new(), 3).unwrap();
        assert!(first.left_to_read() < before);
        assert_eq!(drain(&mut first, &ctx, &mut Vec::new()), SourcePoll::Finished);
        assert_eq!(first.left_to_read(), 0);
        assert!(!first.backlog() && !second.backlog(), "a few bytes are no backlog");
    }

    /// Offsets taken mid-way by 3 subtasks restore at 1, 2, 3 and 5 subtasks: every line once.
    #[test]
    fn offsets_resume_exactly_and_rescale() {
        let dir = tempfile::tempdir().unwrap();
        let mut expected = Vec::new();
        for f in 0..3 {
            let text: String = (0..200).map(|i| format!("file{f} line {i} {}\n", "x".repeat(i % 17))).collect();
            expected.extend(text.lines().map(String::from));
            std::fs::write(dir.path().join(format!("{f}.txt")), text).unwrap();
        }
        expected.sort();
        let src = TextSource::open(dir.path()).unwrap();
        let ctx = TaskContext::for_test("text", 0, 3);
        let mut before = Vec::new();
        let mut offsets = Vec::new();
        for s in 0..3 {
            let mut sub = src.subtask(s, 3);
            for _ in 0..(10 + s * 7) {
                sub.poll(&ctx, &mut before, 3).unwrap();
            }
            offsets.push((s, sub.offset().unwrap()));
        }
        for p in [1, 2, 3, 5] {
            let mut got = before.clone();
            for s in 0..p {
                let mut sub = src.subtask(s, p);
                let parts: Vec<(usize, &[u8])> = offsets.iter().map(|(s, b)| (*s, b.as_slice())).collect();
                if p == 3 {
                    sub.seek(parts[s].1).unwrap();
                } else {
                    sub.seek_rescaled(&parts, s, p).unwrap();
                }
                assert_eq!(drain(&mut sub, &ctx, &mut got), SourcePoll::Finished);
            }
            got.sort();
            assert_eq!(got, expected, "restored at parallelism {p}");
        }
    }

    /// Blocks of whole lines (the word count's path, which takes many lines at once from the
    /// read buffer) hold every line once at any parallelism, across read buffers, span ends
    /// and lines longer than a buffer, also when restored mid-way at another parallelism.
    #[test]
    fn blocks_hold_every_line_once_across_buffers_and_restores() {
        let dir = tempfile::tempdir().unwrap();
        let mut expected = Vec::new();
        for f in 0..3u64 {
            let mut text = String::new();
            for i in 0..30_000u64 {
                let len = if i % 9_999 == 5 { 300_000 } else { ((i * 7919 + f) % 61) as usize };
                text.push_str(&format!("{f}:{i}:{}\n", "y".repeat(len)));
            }
            if f == 1 {
                text.push_str("no newline at the end");
            }
            expected.extend(text.lines().map(String::from));
            std::fs::write(dir.path().join(format!("{f}.txt")), text).unwrap();
        }
        expected.sort();
        let src = TextSource::open(dir.path()).unwrap();
        let ctx = TaskContext::for_test("text", 0, 1);
        let lines_of = |blocks: &[Vec<u8>]| -> Vec<String> {
            blocks
                .iter()
                .flat_map(|b| {
                    assert_eq!(b.last(), Some(&b'\n'), "a block ends with a whole line");
                    String::from_utf8(b.clone()).unwrap().lines().map(String::from).collect::<Vec<_>>()
                })
                .collect()
        };
        for (p, q) in [(1, 1), (2, 3), (3, 2), (4, 1)] {
            let (mut blocks, mut offsets) = (Vec::new(), Vec::new());
            for s in 0..p {
                let mut sub = TextBlocks::new(src.subtask(s, p));
                for _ in 0..(5 + s * 11) {
                    sub.poll(&ctx, &mut blocks, 1024).unwrap();
                }
                offsets.push((s, sub.offset().unwrap()));
            }
            let parts: Vec<(usize, &[u8])> = offsets.iter().map(|(s, b)| (*s, b.as_slice())).collect();
            for s in 0..q {
                let mut sub = TextBlocks::new(src.subtask(s, q));
                sub.seek_rescaled(&parts, s, q).unwrap();
                while sub.poll(&ctx, &mut blocks, 1024).unwrap() != SourcePoll::Finished {}
            }
            let mut got = lines_of(&blocks);
            got.sort();
            assert!(got == expected, "{p} subtasks restored at {q}: {} lines, {} expected", got.len(), expected.len());
        }
    }

    #[test]
    fn follow_mode_reads_a_growing_file_whole_lines_only() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log.txt");
        std::fs::write(&log, "one\ntw").unwrap();
        let src = TextSource::open(&log).unwrap().follow(true);
        let ctx = TaskContext::for_test("text", 0, 1);
        let mut sub = src.subtask(0, 1);
        let mut lines = Vec::new();
        assert_eq!(drain(&mut sub, &ctx, &mut lines), SourcePoll::Idle);
        assert_eq!(lines, vec!["one"]);
        let offset = sub.offset().unwrap();
        let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
        f.write_all(b"o\nthree\n").unwrap();
        assert_eq!(drain(&mut sub, &ctx, &mut lines), SourcePoll::Idle);
        assert_eq!(lines, vec!["one", "two", "three"]);
        // Blocks of lines (what word splitting reads) follow the log the same way.
        let mut blocks = TextBlocks::new(src.subtask(0, 1));
        let mut got: Vec<Vec<u8>> = Vec::new();
        while blocks.poll(&ctx, &mut got, 8).unwrap() == SourcePoll::Emitted {}
        assert_eq!(got.concat(), b"one\ntwo\nthree\n");
        f.write_all(b"four\nfi").unwrap();
        let mut more: Vec<Vec<u8>> = Vec::new();
        while blocks.poll(&ctx, &mut more, 8).unwrap() == SourcePoll::Emitted {}
        assert_eq!(more.concat(), b"four\n", "a block takes whole lines only, and keeps following");
        // Recovery from the offset taken before "two" was complete reads it again, whole.
        let mut again = src.subtask(0, 1);
        again.seek(&offset).unwrap();
        let mut replay = Vec::new();
        assert_eq!(drain(&mut again, &ctx, &mut replay), SourcePoll::Idle);
        assert_eq!(replay, vec!["two", "three", "four"]);
    }

    /// A run that followed a log, resumed without following, reads the file to its end as it
    /// is now and finishes (it used to wait at the end of the file for ever).
    #[test]
    fn a_followed_file_resumed_without_following_is_read_to_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log.txt");
        std::fs::write(&log, "one\ntwo\n").unwrap();
        let ctx = TaskContext::for_test("text", 0, 1);
        let mut followed = TextSource::open(&log).unwrap().follow(true).subtask(0, 1);
        let mut lines = Vec::new();
        assert_eq!(drain(&mut followed, &ctx, &mut lines), SourcePoll::Idle);
        let offset = followed.offset().unwrap();
        std::fs::write(&log, "one\ntwo\nthree\n").unwrap();
        let mut resumed = TextSource::open(&log).unwrap().subtask(0, 1);
        resumed.seek(&offset).unwrap();
        let mut rest = Vec::new();
        assert_eq!(drain(&mut resumed, &ctx, &mut rest), SourcePoll::Finished);
        assert_eq!(rest, vec!["three"]);
    }

    #[test]
    fn a_line_over_the_limit_is_a_clear_error_not_unbounded_memory() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("big.txt");
        std::fs::write(&f, format!("short line\n{}\nafter\n", "x".repeat(5_000))).unwrap();
        let ctx = TaskContext::for_test("text", 0, 1);
        let src = TextSource::open(&f).unwrap().max_line_bytes(4_096);
        let mut lines = Vec::new();
        let mut sub = src.subtask(0, 1);
        let err = loop {
            match sub.poll(&ctx, &mut lines, 1) {
                Ok(SourcePoll::Finished) => panic!("the long line was accepted"),
                Ok(_) => continue,
                Err(e) => break e.to_string(),
            }
        };
        assert!(err.contains("big.txt") && err.contains("byte 11") && err.contains("4096"), "{err}");
        assert_eq!(lines, vec!["short line"]);
        // The same line fits under the default limit.
        let mut all = Vec::new();
        let mut sub = TextSource::open(&f).unwrap().subtask(0, 1);
        assert_eq!(drain(&mut sub, &ctx, &mut all), SourcePoll::Finished);
        assert_eq!(all.len(), 3);
    }

    #[test]
    fn an_offset_into_a_missing_or_shorter_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "alpha\nbeta\n").unwrap();
        let src = TextSource::open(dir.path()).unwrap();
        let sub = src.subtask(0, 1);
        let none: Vec<ListedFile> = Vec::new();
        let stored: Vec<StoredSpan> = vec![("gone.txt".into(), 0, 5, true)];
        let err = sub.decode(&to_bytes(&(stored, none.clone()))).unwrap_err().to_string();
        assert!(err.contains("gone.txt"), "{err}");
        let stored: Vec<StoredSpan> = vec![("a.txt".into(), 100, 200, true)];
        let err = sub.decode(&to_bytes(&(stored, none))).unwrap_err().to_string();
        assert!(err.contains("input changed"), "{err}");
        // The file listed with another size or modification time than it has now: changed.
        let stored: Vec<StoredSpan> = vec![("a.txt".into(), 0, 11, true)];
        let modified = src.files[0].modified_ns;
        for listed in [vec![("a.txt".to_string(), 12u64, modified, false)], vec![("a.txt".into(), 11, 1, false)]] {
            let err = sub.decode(&to_bytes(&(stored.clone(), listed))).unwrap_err().to_string();
            assert!(err.contains("changed since the checkpoint") && err.contains("a.txt"), "{err}");
        }
        let same = vec![("a.txt".to_string(), 11u64, modified, false)];
        assert_eq!(sub.decode(&to_bytes(&(stored.clone(), same))).unwrap().0.len(), 1);
        // A followed log may have grown, whichever subtask's offset it is.
        let followed = vec![("a.txt".to_string(), 5u64, 1u64, true)];
        assert_eq!(sub.decode(&to_bytes(&(stored, followed))).unwrap().0.len(), 1);
    }

    /// `touch` on an input whose content did not change made a resume refuse ("changed since
    /// the checkpoint was taken … Put the input back as it was"), with no recorded time to put
    /// it back to. The offset now keeps a checksum of what was read: a new modification time
    /// alone passes; changed bytes of the same size are refused, naming them and the recorded
    /// size and time, and the advice names everything a fresh start needs removed.
    #[test]
    fn a_touched_input_resumes_and_a_changed_one_is_refused_with_its_recorded_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.txt");
        std::fs::write(&path, "alpha\nbeta\ngamma\n").unwrap();
        let ctx = TaskContext::for_test("text", 0, 1);
        let mut sub = TextSource::open(&path).unwrap().subtask(0, 1);
        let mut lines = Vec::new();
        sub.poll(&ctx, &mut lines, 2).unwrap();
        assert_eq!(lines, vec!["alpha", "beta"]);
        let offset = sub.offset().unwrap();
        // touch: a new modification time, the same bytes.
        let later = std::time::SystemTime::now() + std::time::Duration::from_secs(3600);
        std::fs::File::options().write(true).open(&path).unwrap().set_modified(later).unwrap();
        let mut resumed = TextSource::open(&path).unwrap().subtask(0, 1);
        resumed.seek(&offset).unwrap();
        let mut rest = Vec::new();
        while resumed.poll(&ctx, &mut rest, 10).unwrap() != SourcePoll::Finished {}
        assert_eq!(rest, vec!["gamma"]);
        // The same size, other bytes where the job had read: refused.
        std::fs::write(&path, "alpha\nBETA\ngamma\n").unwrap();
        let err = TextSource::open(&path).unwrap().subtask(0, 1).seek(&offset).unwrap_err().to_string();
        assert!(err.contains("bytes 0..11 the job had read differ") && err.contains("recorded 17 bytes"), "{err}");
        assert!(err.contains(" UTC)") && err.contains("remove the checkpoint directory and the output"), "{err}");
        // A checkpoint's offset written as a whole after a restore still holds what was read.
        std::fs::write(&path, "alpha\nbeta\ngamma\n").unwrap();
        std::fs::File::options().write(true).open(&path).unwrap().set_modified(later).unwrap();
        let mut again = TextSource::open(&path).unwrap().subtask(0, 1);
        again.seek(&offset).unwrap();
        let carried = again.offset().unwrap();
        std::fs::write(&path, "ALPHA\nbeta\ngamma\n").unwrap();
        let err = TextSource::open(&path).unwrap().subtask(0, 1).seek(&carried).unwrap_err().to_string();
        assert!(err.contains("the job had read differ"), "{err}");
    }
}
