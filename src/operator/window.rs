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
use crate::persist::Persist;
use crate::record::{Key, Timestamp};
use crate::snapshot::{Barrier, ForkedState};
use crate::state::{PagedFork, PagedMap};

use super::side::{OutputTag, Outputs};

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

impl<H: Persist + Send + 'static, K: Key, V: Persist + Send + Sync + 'static> ForkedState for ForkedWindows<H, K, V> {
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
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
pub(crate) type WindowEntries<K, V> = Vec<(Timestamp, crate::state::PagedImage<K, V>)>;

/// Window contents of every old subtask, keeping the keys `scope` owns.
pub(crate) fn merged_windows<K: Key, V: Clone + Persist>(
    parts: Vec<WindowEntries<K, V>>,
    scope: &crate::record::KeyScope,
) -> WindowEntries<K, V> {
    let mut by_start: std::collections::BTreeMap<Timestamp, Vec<(K, V)>> = std::collections::BTreeMap::new();
    for windows in parts {
        for (start, entries) in windows {
            let keep = entries.into_entries().into_iter().filter(|(k, _)| scope.owns(crate::record::hash_key(k)));
            by_start.entry(start).or_default().extend(keep);
        }
    }
    by_start.into_iter().map(|(start, entries)| (start, entries.into())).collect()
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
    /// How long after firing a window is kept for late records (Flink's allowed lateness).
    lateness: Timestamp,
    /// The oldest `fired` windows have fired and are kept only for late records.
    fired: usize,
    /// Maps of dropped windows, emptied when a window opens with one: a window's map is
    /// sized by the windows before it instead of growing from one page for each window.
    spare: Vec<PagedMap<K, V>>,
}

/// How many dropped windows' maps are kept for the next windows to open.
const SPARE_MAPS: usize = 2;

/// How many of the newest windows `window_mut` walks before it computes a record's place.
const NEAR_WINDOWS: usize = 8;

impl<K: Key, V: Clone + Persist> OpenWindows<K, V> {
    pub(crate) fn new(window: Window) -> Self {
        OpenWindows { window, open: std::collections::VecDeque::new(), lateness: 0, fired: 0, spare: Vec::new() }
    }

    /// Keeps fired windows for `lateness` more of event time, taking late records.
    pub(crate) fn with_lateness(mut self, lateness: Timestamp) -> Self {
        self.lateness = lateness;
        self
    }

    /// Whether the window starting at `start` has fired at `watermark`.
    #[inline]
    fn has_fired(&self, start: Timestamp, watermark: Option<Timestamp>) -> bool {
        watermark.is_some_and(|wm| self.window.max_timestamp(start) <= wm)
    }

    /// The per-key map of the window starting at `start`, opening it if needed.
    #[inline]
    pub(crate) fn window_mut(&mut self, start: Timestamp) -> &mut PagedMap<K, V> {
        // Most records fall in the newest window: no arithmetic for them.
        if self.open.back().is_some_and(|(s, _)| *s == start) {
            return &mut self.open.back_mut().expect("a back window").1;
        }
        // A sliding window's record falls in the few newest: a short walk back finds them
        // without a division (a fifth of q5's window step was the one below).
        let len = self.open.len();
        if let Some(back) = (2..=len.min(NEAR_WINDOWS)).find(|&back| self.open[len - back].0 == start) {
            return &mut self.open[len - back].1;
        }
        let pos = match self.open.front() {
            Some(&(first, _)) if start >= first => {
                let guess = ((start - first) / self.window.slide) as usize;
                match self.open.get(guess) {
                    Some((s, _)) if *s == start => guess,
                    // Past the newest: open it at the back (the common way a window opens).
                    None if self.open.back().is_some_and(|(s, _)| *s < start) => {
                        let map = self.empty_map();
                        self.open.push_back((start, map));
                        self.open.len() - 1
                    }
                    _ => self.search_or_insert(start),
                }
            }
            Some(_) => {
                // Before every open window (a late record reopening a dropped start cannot
                // happen: `assign` refuses it), so it has not fired.
                let map = self.empty_map();
                self.open.push_front((start, map));
                self.fired = 0;
                0
            }
            None => {
                let map = self.empty_map();
                self.open.push_back((start, map));
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
                let map = self.empty_map();
                self.open.insert(pos, (start, map));
                pos
            }
        }
    }

    /// A map for a window that opens: a dropped window's, emptied, if one is kept.
    fn empty_map(&mut self) -> PagedMap<K, V> {
        match self.spare.pop() {
            Some(mut map) => {
                map.clear();
                map
            }
            None => PagedMap::new(),
        }
    }

    /// Calls `f` with the map of every window containing `ts` that still takes records
    /// (opening it if needed), `item` — moved into the last such window, cloned for the others
    /// (a sliding window's record is in several; a tumbling window's is moved once) — the
    /// window's bounds and whether it has already fired (a late record within the allowed
    /// lateness). Gives `item` back when the record is too late: every window of it was
    /// dropped.
    #[inline]
    pub(crate) fn assign<X: Clone>(
        &mut self,
        ts: Timestamp,
        watermark: Option<Timestamp>,
        item: X,
        mut f: impl FnMut(&mut PagedMap<K, V>, X, WindowBounds, bool),
    ) -> Option<X> {
        let (window, lateness) = (self.window, self.lateness);
        let takes =
            |start: Timestamp| watermark.is_none_or(|wm| window.max_timestamp(start).saturating_add(lateness) > wm);
        let bounds = |start: Timestamp| WindowBounds { start, end: start.saturating_add(window.size) };
        if window.slide == window.size {
            // Tumbling: the one window, and no clone.
            let start = ts - ts % window.size;
            if !takes(start) {
                return Some(item);
            }
            let fired = self.has_fired(start, watermark);
            f(self.window_mut(start), item, bounds(start), fired);
            return None;
        }
        // One pass: each window gets a clone once the next one is found; the last gets the
        // item itself.
        let mut pending = None;
        window.for_each_start(ts, |start| {
            if takes(start) {
                if let Some(previous) = pending.replace(start) {
                    let fired = self.has_fired(previous, watermark);
                    f(self.window_mut(previous), item.clone(), bounds(previous), fired);
                }
            }
        });
        match pending {
            Some(last) => {
                let fired = self.has_fired(last, watermark);
                f(self.window_mut(last), item, bounds(last), fired);
                None
            }
            None => Some(item),
        }
    }

    /// Fires every window the watermark `wm` reaches that has not fired, oldest first, handing
    /// each to `f`; then drops the windows whose allowed lateness `wm` has passed. (A dropped
    /// window's map is kept for the next window to open, or freed; a snapshot that still
    /// holds its pages keeps them.)
    pub(crate) fn fire(&mut self, wm: Timestamp, mut f: impl FnMut(WindowBounds, &PagedMap<K, V>)) {
        while let Some((start, map)) = self.open.get(self.fired) {
            if self.window.max_timestamp(*start) > wm {
                break;
            }
            f(WindowBounds { start: *start, end: start.saturating_add(self.window.size) }, map);
            self.fired += 1;
        }
        while let Some((start, _)) = self.open.front() {
            if self.window.max_timestamp(*start).saturating_add(self.lateness) > wm {
                break;
            }
            let (_, map) = self.open.pop_front().expect("a front window");
            if self.spare.len() < SPARE_MAPS {
                // Emptied when taken: by then a snapshot that shares its pages may be done.
                self.spare.push(map);
            }
            self.fired -= 1;
        }
    }

    /// Calls `f` with every window that has not fired (early firings).
    pub(crate) fn for_each_unfired(&self, mut f: impl FnMut(WindowBounds, &PagedMap<K, V>)) {
        for (start, map) in self.open.iter().skip(self.fired) {
            f(WindowBounds { start: *start, end: start.saturating_add(self.window.size) }, map);
        }
    }

    /// Forks every open window's pages (pointer work), for a snapshot.
    pub(crate) fn fork(&mut self) -> Vec<(Timestamp, PagedFork<K, V>)> {
        self.open.iter_mut().map(|(s, m)| (*s, m.fork())).collect()
    }

    /// Replaces the open windows with what a snapshot of them wrote at `watermark`.
    pub(crate) fn import(&mut self, windows: WindowEntries<K, V>, watermark: Option<Timestamp>) {
        self.reopen(windows.into_iter().map(|(s, image)| (s, image.into_map())), watermark);
    }

    /// Replaces the open windows with the forks [`Self::fork`] made, sharing their pages
    /// (local recovery).
    pub(crate) fn import_forks(&mut self, forks: &[(Timestamp, PagedFork<K, V>)], watermark: Option<Timestamp>) {
        self.reopen(forks.iter().map(|(s, fork)| (*s, PagedMap::from_fork(fork))), watermark);
    }

    fn reopen(&mut self, open: impl Iterator<Item = (Timestamp, PagedMap<K, V>)>, watermark: Option<Timestamp>) {
        self.open = open.collect();
        self.open.make_contiguous().sort_by_key(|(s, _)| *s);
        self.fired = self.open.iter().take_while(|(s, _)| self.has_fired(*s, watermark)).count();
    }

    /// Number of open windows.
    #[allow(dead_code)]
    pub(crate) fn len(&self) -> usize {
        self.open.len()
    }
}

/// How a window operator fires before a window's end (Flink's early-firing triggers); the
/// window still fires at its end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EarlyFiring {
    /// After every `n` records of a key in a window: that key's current result.
    Count(u64),
    /// Every `interval_ms` of processing time: every key's current result in every open window.
    ProcessingTime(u64),
}

/// What a window operator does beyond firing each window once at its end.
pub(crate) struct WindowSettings<T> {
    /// Event time a window is kept after it fires, refiring with each late record.
    pub(crate) lateness: Timestamp,
    /// Where records too late for any window go (counted and dropped without it).
    pub(crate) late: Option<OutputTag<T>>,
    pub(crate) early: Option<EarlyFiring>,
    /// Windows of processing time (the time a record arrives), fired by the clock.
    pub(crate) processing_time: bool,
}

impl<T> Clone for WindowSettings<T> {
    fn clone(&self) -> Self {
        WindowSettings {
            lateness: self.lateness,
            late: self.late.clone(),
            early: self.early,
            processing_time: self.processing_time,
        }
    }
}

impl<T> Default for WindowSettings<T> {
    fn default() -> Self {
        WindowSettings { lateness: 0, late: None, early: None, processing_time: false }
    }
}

impl<T> WindowSettings<T> {
    /// Checks the settings make sense together.
    pub(crate) fn validate(&self) -> crate::Result<()> {
        if self.processing_time && self.lateness > 0 {
            return Err(crate::Error::config(
                "allowed lateness needs event time: a processing-time window has no late records",
            ));
        }
        if self.processing_time && self.late.is_some() {
            return Err(crate::Error::config(
                "late data needs event time: a processing-time window has no late records to send to a side output",
            ));
        }
        match self.early {
            Some(EarlyFiring::Count(0)) => Err(crate::Error::config("an early firing every 0 records never fires")),
            Some(EarlyFiring::ProcessingTime(0)) => {
                Err(crate::Error::config("an early firing every 0 ms of processing time would never stop"))
            }
            _ => Ok(()),
        }
    }
}

pub(crate) struct WindowAggregate<T, K, A, O, KF, TF, I, F, R> {
    key: KF,
    timestamp: TF,
    init: I,
    fold: F,
    result: R,
    windows: OpenWindows<K, A>,
    /// Records per key and window, for early firings by count.
    counts: OpenWindows<K, u64>,
    settings: WindowSettings<T>,
    clock: crate::context::Clock,
    /// Processing time of the next early firing by processing time.
    next_early: u64,
    watermark: Option<Timestamp>,
    late: Arc<Counter>,
    out: Vec<O>,
    next: Outputs<O>,
}

impl<T, K: Key, A: Clone + Persist, O, KF, TF, I, F, R> WindowAggregate<T, K, A, O, KF, TF, I, F, R> {
    /// Local recovery: the watermark and the open windows from the fork of them.
    fn import_local(&mut self, w: &ForkedWindows<Option<Timestamp>, K, A>) {
        self.watermark = w.head;
        self.windows.import_forks(&w.windows, w.head);
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        ctx: &crate::context::TaskContext,
        window: Window,
        settings: WindowSettings<T>,
        key: KF,
        timestamp: TF,
        init: I,
        fold: F,
        result: R,
        next: Outputs<O>,
    ) -> Self {
        WindowAggregate {
            key,
            timestamp,
            init,
            fold,
            result,
            windows: OpenWindows::new(window).with_lateness(settings.lateness),
            counts: OpenWindows::new(window).with_lateness(settings.lateness),
            settings,
            clock: ctx.clock.clone(),
            next_early: 0,
            watermark: None,
            late: ctx.metrics.late_counter(),
            out: Vec::new(),
            next,
        }
    }
}

impl<T, K, A, O, KF, TF, I, F, R> WindowAggregate<T, K, A, O, KF, TF, I, F, R>
where
    T: Clone + 'static,
    K: Key,
    A: Clone + Persist,
    O: Send,
    R: FnMut(&K, WindowBounds, &A, &mut Vec<O>),
{
    /// Fires what event time `wm` completes (the windows, and their counts' bookkeeping).
    fn fire(&mut self, wm: Timestamp) {
        let (out, result) = (&mut self.out, &mut self.result);
        self.windows.fire(wm, |bounds, map| {
            for (k, a) in map.iter() {
                result(k, bounds, a, out);
            }
        });
        if matches!(self.settings.early, Some(EarlyFiring::Count(_))) {
            self.counts.fire(wm, |_, _| {});
        }
    }

    /// Processing time moved on: processing-time windows that ended fire, and early firings
    /// by processing time that are due.
    fn on_processing_time(&mut self) -> Result<()> {
        let now = self.clock.processing_time_ms();
        if self.settings.processing_time && now > 0 {
            self.fire(now - 1);
        }
        if let Some(EarlyFiring::ProcessingTime(interval)) = self.settings.early {
            if now >= self.next_early {
                if self.next_early > 0 {
                    let (out, result) = (&mut self.out, &mut self.result);
                    self.windows.for_each_unfired(|bounds, map| {
                        for (k, a) in map.iter() {
                            result(k, bounds, a, out);
                        }
                    });
                }
                self.next_early = now + interval;
            }
        }
        if !self.out.is_empty() {
            self.next.batch(&mut self.out)?;
        }
        Ok(())
    }
}

impl<T, K, A, O, KF, TF, I, F, R> crate::collector::Collector<T> for WindowAggregate<T, K, A, O, KF, TF, I, F, R>
where
    T: Clone + Send + 'static,
    K: Key,
    A: Persist + Clone + Send + Sync + 'static,
    O: Send,
    KF: Fn(&T) -> K + Send,
    TF: Fn(&T) -> Timestamp + Send,
    I: Fn() -> A + Send,
    F: FnMut(&mut A, T) + Send,
    R: FnMut(&K, WindowBounds, &A, &mut Vec<O>) + Send,
{
    #[inline]
    fn batch(&mut self, records: &mut Vec<T>) -> Result<()> {
        let mut late = 0;
        let (windows, counts, init, fold, result, out) =
            (&mut self.windows, &mut self.counts, &self.init, &mut self.fold, &mut self.result, &mut self.out);
        let (timestamp, key, watermark) = (&self.timestamp, &self.key, self.watermark);
        let (sides, late_tag) = (&mut self.next.sides, self.settings.late.as_ref());
        let every = match self.settings.early {
            Some(EarlyFiring::Count(n)) => n,
            _ => 0,
        };
        // Processing-time windows: a record's time is its arrival (one reading per batch).
        let arrival = self.settings.processing_time.then(|| self.clock.processing_time_ms());
        if every == 0 && self.settings.lateness == 0 {
            // The common case, kept to a closure small enough that the state lookup inlines
            // into it: no result before a window fires, and no window takes a record after.
            crate::collector::move_each(records, |r, _| {
                let ts = arrival.unwrap_or_else(|| timestamp(&r));
                let k = key(&r);
                let assigned =
                    windows.assign(ts, watermark, (k, r), |map, (k, r), _, _| fold(map.get_or_insert_with(k, init), r));
                if let Some((_, r)) = assigned {
                    late += 1;
                    if let Some(tag) = late_tag {
                        sides.emit(tag, r);
                    }
                }
            });
            if late > 0 {
                self.late.add(late);
            }
            return self.next.batch(&mut self.out);
        }
        crate::collector::move_each(records, |r, _| {
            let ts = arrival.unwrap_or_else(|| timestamp(&r));
            let k = key(&r);
            let assigned = windows.assign(ts, watermark, (k, r), |map, (k, r), bounds, fired| {
                if !fired && every == 0 {
                    fold(map.get_or_insert_with(k, init), r);
                    return;
                }
                let early = every > 0 && !fired && {
                    let n = counts.window_mut(bounds.start).get_or_insert_with(k.clone(), || 0);
                    *n += 1;
                    *n % every == 0
                };
                let (k, acc) = map.entry_hashed(crate::record::hash_key(&k), k, init);
                fold(acc, r);
                if fired || early {
                    // A late record refires its window (within the allowed lateness), or a
                    // count trigger fires early: the key's current result.
                    result(k, bounds, acc, out);
                }
            });
            if let Some((_, r)) = assigned {
                late += 1;
                if let Some(tag) = late_tag {
                    sides.emit(tag, r);
                }
            }
        });
        if late > 0 {
            self.late.add(late);
        }
        self.next.batch(&mut self.out)
    }

    fn watermark(&mut self, watermark: Timestamp) -> Result<()> {
        if !self.settings.processing_time {
            self.watermark = Some(watermark);
            self.fire(watermark);
            if !self.out.is_empty() {
                self.next.batch(&mut self.out)?;
            }
        }
        self.next.watermark(watermark)
    }

    fn end(&mut self) -> Result<()> {
        // The input ended: fire everything still open (the upstream normally sent MAX already;
        // processing-time windows fire at the end too, so bounded input gives all its results).
        if self.settings.processing_time {
            self.fire(Timestamp::MAX);
            self.next.batch(&mut self.out)?;
        } else if self.watermark != Some(Timestamp::MAX) {
            self.watermark(Timestamp::MAX)?;
        }
        self.next.end()
    }

    fn drain(&mut self) -> Result<bool> {
        if self.settings.processing_time || self.settings.early.is_some() {
            self.on_processing_time()?;
        }
        self.next.drain()
    }
    fn next_control(&mut self) -> Option<&mut dyn crate::collector::CollectorControl> {
        Some(&mut self.next)
    }
    fn snapshot_state(&mut self, _: &Barrier) -> Result<Option<Box<dyn ForkedState>>> {
        // Window contents and the watermark (the pending timers are the open windows' ends);
        // the counts of a count trigger after them.
        let windows = Box::new(ForkedWindows { head: self.watermark, windows: self.windows.fork() });
        Ok(Some(match self.settings.early {
            Some(EarlyFiring::Count(_)) => {
                Box::new(Concatenated(windows, Box::new(ForkedWindows { head: (), windows: self.counts.fork() })))
            }
            _ => windows,
        }))
    }
    fn restore_state(&mut self, bytes: &[u8]) -> Result<()> {
        let (watermark, windows, counts) = decode_window_state::<K, A>(bytes)?;
        self.watermark = watermark;
        self.windows.import(windows, watermark);
        self.counts.import(counts, watermark);
        Ok(())
    }
    fn restore_local(&mut self, fork: &dyn ForkedState) -> Result<()> {
        // What `snapshot_state` made: the windows, and with a count trigger the counts after.
        let any = fork.as_any();
        let (windows, counts) = match any.and_then(|f| f.downcast_ref::<Concatenated>()) {
            Some(Concatenated(w, c)) => (w.as_any(), c.as_any()),
            None => (any, None),
        };
        let windows = windows.and_then(|w| w.downcast_ref::<ForkedWindows<Option<Timestamp>, K, A>>());
        let counts = counts.and_then(|c| c.downcast_ref::<ForkedWindows<(), K, u64>>());
        match (windows, counts, self.settings.early) {
            (Some(w), Some(c), Some(EarlyFiring::Count(_))) => {
                self.counts.import_forks(&c.windows, w.head);
                self.import_local(w);
                Ok(())
            }
            (Some(w), None, early) if !matches!(early, Some(EarlyFiring::Count(_))) => {
                self.import_local(w);
                Ok(())
            }
            _ => self.restore_state(&crate::snapshot::encoded(fork)?),
        }
    }
    fn restore_rescaled(&mut self, parts: &[(usize, &[u8])], scope: &crate::record::KeyScope) -> Result<()> {
        let decoded: Vec<_> = parts.iter().map(|(_, b)| decode_window_state::<K, A>(b)).collect::<Result<_>>()?;
        self.watermark = merged_watermark(decoded.iter().map(|(w, _, _)| *w));
        let (mut windows, mut counts) = (Vec::new(), Vec::new());
        for (_, w, c) in decoded {
            windows.push(w);
            counts.push(c);
        }
        self.windows.import(merged_windows(windows, scope), self.watermark);
        self.counts.import(merged_windows(counts, scope), self.watermark);
        Ok(())
    }
}

/// Two forks written one after the other (the reader knows where the first ends).
struct Concatenated(Box<dyn ForkedState>, Box<dyn ForkedState>);

impl ForkedState for Concatenated {
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
    fn write_chunks(&self, out: &mut dyn crate::snapshot::StateChunks) -> std::io::Result<()> {
        self.0.write_chunks(out)?;
        self.1.write_chunks(out)
    }
}

/// A window operator's state as restored: watermark, windows, counts.
type WindowState<K, A> = (Option<Timestamp>, WindowEntries<K, A>, WindowEntries<K, u64>);

/// A window operator's snapshot: its watermark, each open window's entries, and — only with
/// early firings by count — each window's counts. (Snapshots from before count triggers
/// existed end after the windows, and restore with no counts.)
fn decode_window_state<K: Key, A: Persist + Clone>(bytes: &[u8]) -> Result<WindowState<K, A>> {
    let mut input = bytes;
    let watermark = Option::<Timestamp>::restore(&mut input)?;
    let windows = WindowEntries::<K, A>::restore(&mut input)?;
    let counts = if input.is_empty() { Vec::new() } else { WindowEntries::<K, u64>::restore(&mut input)? };
    if !input.is_empty() {
        return Err(crate::Error::Corrupt(format!("{} bytes after a window operator's state", input.len())));
    }
    Ok((watermark, windows, counts))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collector::{Collector, Recorder};
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
    fn a_window_opens_with_a_dropped_windows_map_emptied_not_a_new_one_that_grows() {
        let mut w: OpenWindows<u64, u64> = OpenWindows::new(Window::tumbling(10));
        for k in 0..1_000 {
            *w.window_mut(0).get_or_insert_with(k, || 0) += 1;
        }
        let pages = w.window_mut(0).pages();
        assert!(pages > 1);
        // A snapshot shares the first window's pages while it fires and is dropped.
        let forked = w.fork();
        w.fire(9, |_, m| assert_eq!(m.len(), 1_000));
        assert_eq!(w.len(), 0);
        let next = w.window_mut(10);
        assert_eq!((next.len(), next.pages(), next.iter().count()), (0, pages, 0), "sized as the last window");
        *next.get_or_insert_with(3, || 0) += 1;
        assert_eq!(next.get(&3), Some(&1));
        assert_eq!(forked[0].1.len(), 1_000, "the snapshot keeps what it forked");
        assert_eq!(forked[0].1.entries().unwrap().len(), 1_000);
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

    type Recorded<T> = Arc<Mutex<Recorder<T>>>;

    /// A tumbling-10 count per key, with `settings`; returns the operator, its main output and
    /// its late side output.
    #[allow(clippy::type_complexity)]
    fn counter(
        settings: WindowSettings<(u8, u64)>,
    ) -> (impl Collector<(u8, u64)>, Recorded<(u8, u64, u64)>, Recorded<(u8, u64)>, Arc<crate::metrics::JobMetrics>)
    {
        let rec = Arc::new(Mutex::new(Recorder::<(u8, u64, u64)>::default()));
        let late_rec = Arc::new(Mutex::new(Recorder::<(u8, u64)>::default()));
        let ctx = crate::context::TaskContext::for_test("window", 0, 1);
        let name: Arc<str> = "late".into();
        let side = super::super::side::SideOut::new(Box::new(Arc::clone(&late_rec)) as Box<dyn Collector<(u8, u64)>>);
        let sides = super::super::side::SideOutputs::new(vec![(name, Box::new(side) as _)]);
        let op = WindowAggregate::new(
            &ctx,
            Window::tumbling(10),
            settings,
            |r: &(u8, u64)| r.0,
            |r: &(u8, u64)| r.1,
            || 0u64,
            |c: &mut u64, _r| *c += 1,
            |k: &u8, b: WindowBounds, c: &u64, out: &mut Vec<(u8, u64, u64)>| out.push((*k, b.start, *c)),
            Outputs { main: Box::new(Arc::clone(&rec)), sides },
        );
        (op, rec, late_rec, Arc::clone(&ctx.metrics))
    }

    fn records<T: Clone + Ord>(r: &Recorded<T>) -> Vec<T> {
        let mut v = r.lock().unwrap().records.clone();
        v.sort();
        v
    }

    #[test]
    fn counts_per_key_and_window_and_drops_late() {
        let (mut op, rec, _, late) = counter(WindowSettings::default());
        op.batch(&mut vec![(1, 1), (1, 12), (2, 3), (1, 9)]).unwrap();
        op.watermark(9).unwrap();
        op.batch(&mut vec![(1, 5), (2, 15)]).unwrap(); // (1,5) is late
        op.end().unwrap();
        assert_eq!(records(&rec), vec![(1, 0, 2), (1, 10, 1), (2, 0, 1), (2, 10, 1)]);
        assert_eq!(late.late_records(), 1);
    }

    #[test]
    fn a_late_record_within_the_allowed_lateness_refires_and_later_ones_go_to_the_side_output() {
        let tag = OutputTag::new("late".into());
        let settings = WindowSettings { lateness: 5, late: Some(tag), ..WindowSettings::default() };
        let (mut op, rec, late_rec, late) = counter(settings);
        op.batch(&mut vec![(1, 1), (1, 2), (2, 3)]).unwrap();
        op.watermark(9).unwrap(); // [0, 10) fires: (1, 0, 2), (2, 0, 1)
        op.batch(&mut vec![(1, 4)]).unwrap(); // late, within 5: refires key 1 only
        op.watermark(13).unwrap();
        op.batch(&mut vec![(2, 8)]).unwrap(); // still within: 9 + 5 > 13
        op.watermark(14).unwrap(); // the window is dropped
        op.batch(&mut vec![(1, 7), (2, 12)]).unwrap(); // (1, 7) too late
        op.end().unwrap();
        assert_eq!(records(&rec), vec![(1, 0, 2), (1, 0, 3), (2, 0, 1), (2, 0, 2), (2, 10, 1)]);
        assert_eq!(records(&late_rec), vec![(1, 7)]);
        assert_eq!(late.late_records(), 1);
    }

    #[test]
    fn a_count_trigger_fires_early_every_n_records_and_the_window_still_fires_at_its_end() {
        let settings = WindowSettings { early: Some(EarlyFiring::Count(2)), ..WindowSettings::default() };
        let (mut op, rec, _, _) = counter(settings);
        op.batch(&mut vec![(1, 1), (1, 2), (1, 3), (2, 4), (1, 5)]).unwrap();
        assert_eq!(records(&rec), vec![(1, 0, 2), (1, 0, 4)]);
        op.end().unwrap();
        assert_eq!(records(&rec), vec![(1, 0, 2), (1, 0, 4), (1, 0, 4), (2, 0, 1)]);
    }
}
