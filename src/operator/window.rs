//! Keyed event-time windows, tumbling and sliding, with incremental aggregation.
//!
//! Each open window holds one accumulator per key. A window `[start, start + size)` fires when
//! the watermark reaches `start + size - 1`: every key's result is emitted and the window's map
//! is kept for reuse (no allocation per window once warm). A record none of whose windows is
//! still open is late: it is dropped and counted, as Flink does with zero allowed lateness.

use std::sync::Arc;

use crate::collector::Collector;
use crate::error::Result;
use crate::metrics::Counter;
use crate::persist::{from_bytes, Persist};
use crate::record::{Key, Timestamp};
use crate::snapshot::{Barrier, CheckpointNotice, ForkedState, TaskSnapshot};
use crate::state::{PagedFork, PagedMap};

/// The windows of an event-time window operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// Length of each window, in event-time units.
    pub size: Timestamp,
    /// Distance between window starts (equal to `size` for tumbling windows).
    pub slide: Timestamp,
}

impl Window {
    /// Back-to-back windows of `size`.
    pub fn tumbling(size: Timestamp) -> Window {
        Window { size, slide: size }
    }
    /// Windows of `size` starting every `slide`; each record falls into `size / slide` of them.
    pub fn sliding(size: Timestamp, slide: Timestamp) -> Window {
        Window { size, slide }
    }
    /// Checks the sizes make sense.
    pub fn validate(&self) -> crate::Result<()> {
        if self.size == 0 || self.slide == 0 {
            return Err(crate::Error::config("window size and slide must be greater than zero"));
        }
        if self.slide > self.size {
            return Err(crate::Error::config(format!(
                "window slide {} is larger than its size {}: records between windows would be lost",
                self.slide, self.size
            )));
        }
        Ok(())
    }
    /// The last timestamp inside the window starting at `start`.
    #[inline]
    pub(crate) fn max_timestamp(&self, start: Timestamp) -> Timestamp {
        start.saturating_add(self.size - 1)
    }
    /// Calls `f` with the start of every window containing `ts`, newest first.
    #[inline]
    pub(crate) fn for_each_start(&self, ts: Timestamp, mut f: impl FnMut(Timestamp)) {
        let mut start = ts - ts % self.slide;
        loop {
            f(start);
            if start < self.slide || start - self.slide + self.size <= ts {
                break;
            }
            start -= self.slide;
        }
    }
}

/// A snapshot of open windows: `head` (the operator's watermarks), then every window's entries,
/// in the [`Persist`] encoding of `(H, Vec<(Timestamp, Vec<(K, V)>)>)` so it restores with
/// `from_bytes`. Written from forked pages in the background.
pub(crate) struct ForkedWindows<H, K, V> {
    pub(crate) head: H,
    pub(crate) windows: Vec<(Timestamp, PagedFork<K, V>)>,
}

impl<H: Persist + Send, K: Key, V: Persist + Send + Sync> ForkedState for ForkedWindows<H, K, V> {
    fn write_chunks(&self, out: &mut dyn crate::snapshot::StateChunks) -> std::io::Result<()> {
        let mut buf = Vec::new();
        self.head.persist(&mut buf);
        (self.windows.len() as u64).persist(&mut buf);
        out.bytes(&buf)?;
        for (start, fork) in &self.windows {
            buf.clear();
            start.persist(&mut buf);
            out.bytes(&buf)?;
            fork.write_chunks(out)?;
        }
        Ok(())
    }
}

/// The watermark after merging subtasks saved at another parallelism: the least of theirs
/// (none if any had none), so no window closes early.
pub(crate) fn merged_watermark(marks: impl Iterator<Item = Option<Timestamp>>) -> Option<Timestamp> {
    let mut out = None;
    for m in marks {
        let m = m?;
        out = Some(out.map_or(m, |o: Timestamp| o.min(m)));
    }
    out
}

/// Open windows as a snapshot stores them: (start, entries), oldest first.
pub(crate) type WindowEntries<K, V> = Vec<(Timestamp, Vec<(K, V)>)>;

/// Window contents of every old subtask, keeping the keys `scope` owns.
pub(crate) fn merged_windows<K: Key, V>(
    parts: Vec<WindowEntries<K, V>>,
    scope: &crate::record::KeyScope,
) -> WindowEntries<K, V> {
    let mut by_start: std::collections::BTreeMap<Timestamp, Vec<(K, V)>> = std::collections::BTreeMap::new();
    for windows in parts {
        for (start, entries) in windows {
            let keep = entries.into_iter().filter(|(k, _)| scope.owns(crate::record::hash_key(k)));
            by_start.entry(start).or_default().extend(keep);
        }
    }
    by_start.into_iter().collect()
}

/// The bounds of a fired window, handed to the result function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowBounds {
    /// First timestamp inside.
    pub start: Timestamp,
    /// First timestamp after.
    pub end: Timestamp,
}

/// Two timestamps, unframed: a built-in type whose encoding never changes.
impl Persist for WindowBounds {
    fn persist(&self, out: &mut Vec<u8>) {
        (self.start, self.end).persist(out)
    }
    fn restore(input: &mut &[u8]) -> Result<Self> {
        let (start, end) = <(Timestamp, Timestamp)>::restore(input)?;
        Ok(WindowBounds { start, end })
    }
}

/// Open windows, oldest first, each with its per-key values in copy-on-write pages; shared by
/// the window aggregate and the window join. A snapshot forks every open window's pages.
///
/// Window starts are multiples of the slide, and open windows are usually back to back, so a
/// start's place is computed from the oldest one's: finding a record's window takes the same
/// time however many windows are open (a source running ahead in event time opens many, and
/// the records of a lagging one used to walk past all of them). Gaps (a slide with no record)
/// fall back to a binary search.
pub(crate) struct OpenWindows<K, V> {
    pub(crate) window: Window,
    open: std::collections::VecDeque<(Timestamp, PagedMap<K, V>)>,
}

impl<K: Key, V: Clone> OpenWindows<K, V> {
    pub(crate) fn new(window: Window) -> Self {
        OpenWindows { window, open: std::collections::VecDeque::new() }
    }

    /// The per-key map of the window starting at `start`, opening it if needed.
    #[inline]
    pub(crate) fn window_mut(&mut self, start: Timestamp) -> &mut PagedMap<K, V> {
        let pos = match self.open.front() {
            Some(&(first, _)) if start >= first => {
                let guess = ((start - first) / self.window.slide) as usize;
                match self.open.get(guess) {
                    Some((s, _)) if *s == start => guess,
                    // Past the newest: open it at the back (the common way a window opens).
                    None if self.open.back().is_some_and(|(s, _)| *s < start) => {
                        self.open.push_back((start, PagedMap::new()));
                        self.open.len() - 1
                    }
                    _ => self.search_or_insert(start),
                }
            }
            Some(_) => {
                self.open.push_front((start, PagedMap::new()));
                0
            }
            None => {
                self.open.push_back((start, PagedMap::new()));
                0
            }
        };
        &mut self.open[pos].1
    }

    /// Where `start` is among the open windows (gaps before it), opening it if needed.
    #[cold]
    fn search_or_insert(&mut self, start: Timestamp) -> usize {
        match self.open.binary_search_by_key(&start, |(s, _)| *s) {
            Ok(pos) => pos,
            Err(pos) => {
                self.open.insert(pos, (start, PagedMap::new()));
                pos
            }
        }
    }

    /// Calls `f` with the map of every still-open window containing `ts` (opening it if
    /// needed) and `item`: moved into the last such window, cloned for the others (a sliding
    /// window's record is in several; a tumbling window's is moved once). Returns `false`
    /// when the record is late: all its windows already fired at `watermark`.
    #[inline]
    pub(crate) fn assign<X: Clone>(
        &mut self,
        ts: Timestamp,
        watermark: Option<Timestamp>,
        item: X,
        mut f: impl FnMut(&mut PagedMap<K, V>, X),
    ) -> bool {
        let window = self.window;
        let open = |start: Timestamp| watermark.is_none_or(|wm| window.max_timestamp(start) > wm);
        if window.slide == window.size {
            // Tumbling: the one window, and no clone.
            let start = ts - ts % window.size;
            if !open(start) {
                return false;
            }
            f(self.window_mut(start), item);
            return true;
        }
        // One pass: each open window gets a clone once the next open one is found; the last
        // gets the item itself.
        let mut pending = None;
        window.for_each_start(ts, |start| {
            if open(start) {
                if let Some(previous) = pending.replace(start) {
                    f(self.window_mut(previous), item.clone());
                }
            }
        });
        match pending {
            Some(last) => {
                f(self.window_mut(last), item);
                true
            }
            None => false,
        }
    }

    /// Removes every window that the watermark `wm` closes, oldest first, handing each to `f`.
    /// (A fired window's pages are dropped; a snapshot that still holds them keeps them.)
    pub(crate) fn fire(&mut self, wm: Timestamp, mut f: impl FnMut(WindowBounds, &PagedMap<K, V>)) {
        while let Some((start, _)) = self.open.front() {
            if self.window.max_timestamp(*start) > wm {
                break;
            }
            let (start, map) = self.open.pop_front().expect("a front window");
            f(WindowBounds { start, end: start.saturating_add(self.window.size) }, &map);
        }
    }

    /// Forks every open window's pages (pointer work), for a snapshot.
    pub(crate) fn fork(&mut self) -> Vec<(Timestamp, PagedFork<K, V>)> {
        self.open.iter_mut().map(|(s, m)| (*s, m.fork())).collect()
    }

    /// Replaces the open windows with what a snapshot of them wrote.
    pub(crate) fn import(&mut self, windows: Vec<(Timestamp, Vec<(K, V)>)>) {
        self.open = windows
            .into_iter()
            .map(|(s, entries)| {
                let mut m = PagedMap::new();
                for (k, v) in entries {
                    m.insert(k, v);
                }
                (s, m)
            })
            .collect();
        self.open.make_contiguous().sort_by_key(|(s, _)| *s);
    }

    /// Number of open windows.
    #[allow(dead_code)]
    pub(crate) fn len(&self) -> usize {
        self.open.len()
    }
}

pub(crate) struct WindowAggregate<T, K, A, O, KF, TF, I, F, R> {
    key: KF,
    timestamp: TF,
    init: I,
    fold: F,
    result: R,
    windows: OpenWindows<K, A>,
    watermark: Option<Timestamp>,
    late: Arc<Counter>,
    out: Vec<O>,
    next: Box<dyn Collector<O>>,
    _input: std::marker::PhantomData<fn(T)>,
}

impl<T, K: Key, A: Clone, O, KF, TF, I, F, R> WindowAggregate<T, K, A, O, KF, TF, I, F, R> {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        window: Window,
        key: KF,
        timestamp: TF,
        init: I,
        fold: F,
        result: R,
        late: Arc<Counter>,
        next: Box<dyn Collector<O>>,
    ) -> Self {
        WindowAggregate {
            key,
            timestamp,
            init,
            fold,
            result,
            windows: OpenWindows::new(window),
            watermark: None,
            late,
            out: Vec::new(),
            next,
            _input: std::marker::PhantomData,
        }
    }
}

impl<T, K, A, O, KF, TF, I, F, R> crate::collector::Collector<T> for WindowAggregate<T, K, A, O, KF, TF, I, F, R>
where
    T: Clone,
    K: Key,
    A: Persist + Clone + Send + Sync + 'static,
    O: Send,
    KF: Fn(&T) -> K + Send,
    TF: Fn(&T) -> Timestamp + Send,
    I: Fn() -> A + Send,
    F: FnMut(&mut A, T) + Send,
    R: FnMut(&K, WindowBounds, &A) -> O + Send,
{
    #[inline]
    fn batch(&mut self, records: &mut Vec<T>) -> Result<()> {
        let mut late = 0;
        let (windows, init, fold) = (&mut self.windows, &self.init, &mut self.fold);
        let (timestamp, key, watermark) = (&self.timestamp, &self.key, self.watermark);
        crate::collector::move_each(records, |r, _| {
            let (ts, k) = (timestamp(&r), key(&r));
            if !windows.assign(ts, watermark, (k, r), |map, (k, r)| fold(map.get_or_insert_with(k, init), r)) {
                late += 1;
            }
        });
        if late > 0 {
            self.late.add(late);
        }
        Ok(())
    }

    fn watermark(&mut self, watermark: Timestamp) -> Result<()> {
        self.watermark = Some(watermark);
        let (out, result) = (&mut self.out, &mut self.result);
        self.windows.fire(watermark, |bounds, map| {
            out.extend(map.iter().map(|(k, a)| result(k, bounds, a)));
        });
        if !self.out.is_empty() {
            self.next.batch(&mut self.out)?;
        }
        self.next.watermark(watermark)
    }

    fn end(&mut self) -> Result<()> {
        // The input ended: fire everything still open (the upstream normally sent MAX already).
        if self.watermark != Some(Timestamp::MAX) {
            self.watermark(Timestamp::MAX)?;
        }
        self.next.end()
    }

    fn drain(&mut self) -> Result<bool> {
        self.next.drain()
    }
    fn barrier(&mut self, barrier: Barrier, snapshot: &mut TaskSnapshot) -> Result<()> {
        self.next.barrier(barrier, snapshot)
    }
    fn notify(&mut self, notice: CheckpointNotice) -> Result<()> {
        self.next.notify(notice)
    }
    fn snapshot_state(&mut self, _: &Barrier) -> Result<Option<Box<dyn ForkedState>>> {
        // Window contents and the watermark (the pending timers are the open windows' ends).
        Ok(Some(Box::new(ForkedWindows { head: self.watermark, windows: self.windows.fork() })))
    }
    fn restore_state(&mut self, bytes: &[u8]) -> Result<()> {
        let (watermark, windows) = from_bytes(bytes)?;
        self.watermark = watermark;
        self.windows.import(windows);
        Ok(())
    }
    fn restore_rescaled(&mut self, parts: &[(usize, &[u8])], scope: &crate::record::KeyScope) -> Result<()> {
        let decoded: Vec<WindowState<K, A>> = parts.iter().map(|(_, b)| from_bytes(b)).collect::<Result<_>>()?;
        self.watermark = merged_watermark(decoded.iter().map(|(w, _)| *w));
        self.windows.import(merged_windows(decoded.into_iter().map(|(_, w)| w).collect(), scope));
        Ok(())
    }
}

/// A window operator's snapshot: its watermark and each open window's entries.
type WindowState<K, V> = (Option<Timestamp>, WindowEntries<K, V>);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collector::Recorder;
    use std::sync::Mutex;

    #[test]
    fn window_starts() {
        let mut v = Vec::new();
        Window::sliding(10, 5).for_each_start(12, |s| v.push(s));
        assert_eq!(v, vec![10, 5]);
        v.clear();
        Window::sliding(10, 5).for_each_start(3, |s| v.push(s));
        assert_eq!(v, vec![0]);
        v.clear();
        Window::tumbling(10).for_each_start(19, |s| v.push(s));
        assert_eq!(v, vec![10]);
        v.clear();
        Window::sliding(9, 3).for_each_start(9, |s| v.push(s));
        assert_eq!(v, vec![9, 6, 3]);
        assert!(Window::sliding(5, 10).validate().is_err());
    }

    #[test]
    fn windows_open_in_any_order_with_gaps_and_fire_oldest_first() {
        let mut w: OpenWindows<u8, u64> = OpenWindows::new(Window::tumbling(10));
        // Out of order, with gaps, before the oldest, and again at known starts.
        for (ts, k) in [(55, 1), (5, 1), (95, 2), (35, 1), (56, 2), (0, 3), (99, 1), (45, 4), (12, 5)] {
            *w.window_mut(ts - ts % 10).get_or_insert_with(k, || 0) += 1;
        }
        assert_eq!(w.len(), 6);
        let mut fired = Vec::new();
        w.fire(Timestamp::MAX, |b, m| {
            let mut keys: Vec<(u8, u64)> = m.iter().map(|(k, v)| (*k, *v)).collect();
            keys.sort();
            fired.push((b.start, keys));
        });
        assert_eq!(
            fired,
            vec![
                (0, vec![(1, 1), (3, 1)]),
                (10, vec![(5, 1)]),
                (30, vec![(1, 1)]),
                (40, vec![(4, 1)]),
                (50, vec![(1, 1), (2, 1)]),
                (90, vec![(1, 1), (2, 1)]),
            ]
        );
        assert_eq!(w.len(), 0);
    }

    #[test]
    fn counts_per_key_and_window_and_drops_late() {
        let rec = Arc::new(Mutex::new(Recorder::<(u8, u64, u64)>::default()));
        let late = Arc::new(Counter::default());
        let mut op = WindowAggregate::new(
            Window::tumbling(10),
            |r: &(u8, u64)| r.0,
            |r: &(u8, u64)| r.1,
            || 0u64,
            |c: &mut u64, _r| *c += 1,
            |k: &u8, b: WindowBounds, c: &u64| (*k, b.start, *c),
            late.clone(),
            Box::new(rec.clone()),
        );
        op.batch(&mut vec![(1, 1), (1, 12), (2, 3), (1, 9)]).unwrap();
        op.watermark(9).unwrap();
        op.batch(&mut vec![(1, 5), (2, 15)]).unwrap(); // (1,5) is late
        op.end().unwrap();
        let mut got = rec.lock().unwrap().records.clone();
        got.sort();
        assert_eq!(got, vec![(1, 0, 2), (1, 10, 1), (2, 0, 1), (2, 10, 1)]);
        assert_eq!(late.get(), 1);
    }
}
