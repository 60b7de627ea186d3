//! Keyed two-input window join: records of both inputs with equal keys in the same tumbling
//! (or sliding) event-time window are paired when the window fires. The operator's watermark is
//! the minimum of its two inputs' watermarks.

use std::sync::Arc;

use super::window::{merged_watermark, merged_windows, ForkedWindows, OpenWindows, Window};
use super::TwoInputOperator;
use crate::collector::Collector;
use crate::error::Result;
use crate::metrics::Counter;
use crate::persist::{from_bytes, Persist};
use crate::record::{Key, Timestamp};
use crate::snapshot::{Barrier, ForkedState};

/// Per key and window: the records of each side.
type Sides<L, R> = (Vec<L>, Vec<R>);

pub(crate) struct WindowJoin<L, R, K, O, KL, KR, TL, TR, J> {
    key_left: KL,
    key_right: KR,
    ts_left: TL,
    ts_right: TR,
    join: J,
    windows: OpenWindows<K, Sides<L, R>>,
    wm: [Option<Timestamp>; 2],
    emitted: Option<Timestamp>,
    ended: [bool; 2],
    late: Arc<Counter>,
    out: Vec<O>,
    next: Box<dyn Collector<O>>,
}

impl<L: Clone + Persist, R: Clone + Persist, K: Key, O, KL, KR, TL, TR, J> WindowJoin<L, R, K, O, KL, KR, TL, TR, J> {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        window: Window,
        key_left: KL,
        key_right: KR,
        ts_left: TL,
        ts_right: TR,
        join: J,
        late: Arc<Counter>,
        next: Box<dyn Collector<O>>,
    ) -> Self {
        WindowJoin {
            key_left,
            key_right,
            ts_left,
            ts_right,
            join,
            windows: OpenWindows::new(window),
            wm: [None; 2],
            emitted: None,
            ended: [false; 2],
            late,
            out: Vec::new(),
            next,
        }
    }
}

impl<L, R, K, O, KL, KR, TL, TR, J> WindowJoin<L, R, K, O, KL, KR, TL, TR, J>
where
    L: Clone + Persist,
    R: Clone + Persist,
    K: Key,
    O: Send,
    J: FnMut(&K, &L, &R) -> O,
{
    fn advance(&mut self) -> Result<()> {
        let combined = match self.wm {
            [Some(a), Some(b)] => a.min(b),
            _ => return Ok(()),
        };
        if self.emitted.is_some_and(|e| combined <= e) {
            return Ok(());
        }
        self.emitted = Some(combined);
        let (out, join) = (&mut self.out, &mut self.join);
        self.windows.fire(combined, |_, map| {
            for (k, (ls, rs)) in map.iter() {
                for l in ls {
                    for r in rs {
                        out.push(join(k, l, r));
                    }
                }
            }
        });
        if !self.out.is_empty() {
            self.next.batch(&mut self.out)?;
        }
        self.next.watermark(combined)
    }
}

/// Adds one side's records to their windows; returns how many were late (every window of theirs
/// already fired).
fn insert_all<T: Clone, K: Key, V: Default + Clone + Persist>(
    windows: &mut OpenWindows<K, V>,
    watermark: Option<Timestamp>,
    records: &mut Vec<T>,
    key: &impl Fn(&T) -> K,
    timestamp: &impl Fn(&T) -> Timestamp,
    side: fn(&mut V, T),
) -> u64 {
    let mut late = 0;
    for r in records.drain(..) {
        let (ts, k) = (timestamp(&r), key(&r));
        let assigned = windows
            .assign(ts, watermark, (k, r), |map, (k, r), _, _| side(map.get_or_insert_with(k, Default::default), r));
        if assigned.is_some() {
            late += 1;
        }
    }
    late
}

impl<L, R, K, O, KL, KR, TL, TR, J> TwoInputOperator<L, R> for WindowJoin<L, R, K, O, KL, KR, TL, TR, J>
where
    L: Clone + Send + Sync + Persist + 'static,
    R: Clone + Send + Sync + Persist + 'static,
    K: Key,
    O: Send,
    KL: Fn(&L) -> K + Send,
    KR: Fn(&R) -> K + Send,
    TL: Fn(&L) -> Timestamp + Send,
    TR: Fn(&R) -> Timestamp + Send,
    J: FnMut(&K, &L, &R) -> O + Send,
{
    fn batch1(&mut self, records: &mut Vec<L>) -> Result<()> {
        let late =
            insert_all(&mut self.windows, self.emitted, records, &self.key_left, &self.ts_left, |s, l| s.0.push(l));
        self.late.add(late);
        Ok(())
    }
    fn batch2(&mut self, records: &mut Vec<R>) -> Result<()> {
        let late =
            insert_all(&mut self.windows, self.emitted, records, &self.key_right, &self.ts_right, |s, r| s.1.push(r));
        self.late.add(late);
        Ok(())
    }
    fn watermark1(&mut self, watermark: Timestamp) -> Result<()> {
        self.wm[0] = Some(watermark);
        self.advance()
    }
    fn watermark2(&mut self, watermark: Timestamp) -> Result<()> {
        self.wm[1] = Some(watermark);
        self.advance()
    }
    fn end1(&mut self) -> Result<()> {
        self.ended[0] = true;
        self.wm[0] = Some(Timestamp::MAX);
        self.finish_if_done()
    }
    fn end2(&mut self) -> Result<()> {
        self.ended[1] = true;
        self.wm[1] = Some(Timestamp::MAX);
        self.finish_if_done()
    }
    fn next_control(&mut self) -> Option<&mut dyn crate::collector::CollectorControl> {
        Some(&mut self.next)
    }
    fn snapshot_state(&mut self, _: &Barrier) -> Result<Option<Box<dyn ForkedState>>> {
        Ok(Some(Box::new(ForkedWindows { head: (self.wm, self.emitted), windows: self.windows.fork() })))
    }
    fn restore_state(&mut self, bytes: &[u8]) -> Result<()> {
        let (wm, emitted, windows) = from_bytes(bytes)?;
        (self.wm, self.emitted) = (wm, emitted);
        self.windows.import(windows, emitted);
        Ok(())
    }
    fn restore_rescaled(&mut self, parts: &[(usize, &[u8])], scope: &crate::record::KeyScope) -> Result<()> {
        type JoinState<K, L, R> =
            ([Option<Timestamp>; 2], Option<Timestamp>, super::window::WindowEntries<K, Sides<L, R>>);
        let decoded: Vec<JoinState<K, L, R>> = parts.iter().map(|(_, b)| from_bytes(b)).collect::<Result<_>>()?;
        self.wm = [0, 1].map(|i| merged_watermark(decoded.iter().map(|d| d.0[i])));
        self.emitted = merged_watermark(decoded.iter().map(|d| d.1));
        self.windows.import(merged_windows(decoded.into_iter().map(|d| d.2).collect(), scope), self.emitted);
        Ok(())
    }
}

impl<L, R, K, O, KL, KR, TL, TR, J> WindowJoin<L, R, K, O, KL, KR, TL, TR, J>
where
    L: Clone + Persist,
    R: Clone + Persist,
    K: Key,
    O: Send,
    J: FnMut(&K, &L, &R) -> O,
{
    fn finish_if_done(&mut self) -> Result<()> {
        self.advance()?;
        if self.ended == [true, true] {
            self.next.end()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collector::Recorder;
    use std::sync::Mutex;

    #[test]
    fn joins_equal_keys_in_the_same_window() {
        let rec = Arc::new(Mutex::new(Recorder::<(u8, u64, u64)>::default()));
        let mut op = WindowJoin::new(
            Window::tumbling(10),
            |l: &(u8, u64)| l.0,
            |r: &(u8, u64)| r.0,
            |l: &(u8, u64)| l.1,
            |r: &(u8, u64)| r.1,
            |k: &u8, l: &(u8, u64), r: &(u8, u64)| (*k, l.1, r.1),
            Arc::new(Counter::default()),
            Box::new(Arc::clone(&rec)),
        );
        op.batch1(&mut vec![(1, 1), (2, 2), (1, 15)]).unwrap();
        op.batch2(&mut vec![(1, 5), (1, 7), (2, 12), (1, 19)]).unwrap();
        op.watermark1(9).unwrap();
        assert!(rec.lock().unwrap().records.is_empty(), "fires only when both sides pass");
        op.watermark2(9).unwrap();
        assert_eq!(rec.lock().unwrap().records, vec![(1, 1, 5), (1, 1, 7)]);
        op.end1().unwrap();
        op.end2().unwrap();
        let r = rec.lock().unwrap();
        assert_eq!(r.records, vec![(1, 1, 5), (1, 1, 7), (1, 15, 19)]);
        assert!(r.ended);
        assert_eq!(r.watermarks, vec![9, u64::MAX]);
    }
}
