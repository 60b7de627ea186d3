//! [`WindowedStream`] and [`SessionWindowedStream`]: what a window computes (count, reduce,
//! aggregate, apply) and its settings (allowed lateness, early firings, late records).
//!
//! May touch: `channel`, `operator`, `persist`, `record`.

use crate::channel::Partitioning;
use crate::operator::session::SessionWindows;
use crate::operator::side::OutputTag;
use crate::operator::window::{EarlyFiring, WindowAggregate, WindowBounds};
use crate::operator::Emitter;
use crate::persist::Persist;
use crate::record::{Key, Record, Timestamp};

use super::*;

impl<T: Record, K: Key, KF, TF> WindowedStream<T, KF, TF>
where
    KF: Fn(&T) -> K + Clone + Send + 'static,
    TF: Fn(&T) -> Timestamp + Clone + Send + 'static,
{
    /// Keeps each window for `lateness` of event time after it fires: a late record within it
    /// is added and the window fires again for its key (Flink's allowed lateness). Records
    /// later than that are dropped and counted, or sent to [`Self::side_output_late_data`].
    pub fn allowed_lateness(mut self, lateness: Timestamp) -> Self {
        self.settings.lateness = lateness;
        self
    }

    /// Sends records too late for every window of theirs to the side output `tag` (read it
    /// with [`Stream::side_output`] on the window's output).
    pub fn side_output_late_data(mut self, tag: &OutputTag<T>) -> Self {
        self.settings.late = Some(tag.clone());
        self
    }

    /// Fires early as well as at each window's end (see [`EarlyFiring`]).
    pub fn early_firing(mut self, early: EarlyFiring) -> Self {
        self.settings.early = Some(early);
        self
    }

    /// Aggregates each key's records per window; when a window fires, `result` makes one record
    /// per key.
    pub fn aggregate<A, O, I, F, R>(self, init: I, fold: F, result: R) -> Stream<O>
    where
        A: Persist + Clone + Send + Sync + 'static,
        O: Record,
        I: Fn() -> A + Clone + Send + 'static,
        F: Fn(&mut A, T) + Clone + Send + 'static,
        R: Fn(&K, WindowBounds, &A) -> O + Clone + Send + 'static,
    {
        self.window_node(init, fold, move |k: &K, b: WindowBounds, a: &A, out: &mut Vec<O>| out.push(result(k, b, a)))
    }

    /// A function over each key's records of a window when it fires (Flink's
    /// `ProcessWindowFunction`): `f(key, window, records, out)`, with the records in arrival
    /// order. The records are kept until the window fires; prefer [`Self::aggregate`] when a
    /// running accumulator will do.
    ///
    /// ```
    /// use weir::{Job, RunConfig, Window, source::Generator};
    /// let job = Job::new("medians");
    /// let out = job
    ///     .generator(Generator::new(|i, _| (i % 2, i)).count(40))
    ///     .with_watermarks(|e: &(u64, u64)| e.1, 0)
    ///     .key_by(|e: &(u64, u64)| e.0)
    ///     .window(Window::tumbling(10), |e: &(u64, u64)| e.1)
    ///     .process(|k: &u64, w, records: &[(u64, u64)], out: &mut weir::Emitter<'_, (u64, u64, u64)>| {
    ///         let mut times: Vec<u64> = records.iter().map(|r| r.1).collect();
    ///         times.sort();
    ///         out.emit((*k, w.start, times[times.len() / 2]));
    ///     })
    ///     .collect();
    /// job.execute(RunConfig::default()).unwrap();
    /// let mut got = out.lock().unwrap().clone();
    /// got.sort();
    /// assert_eq!(got[..2], [(0, 0, 4), (0, 10, 14)]);
    /// ```
    pub fn process<O, P>(self, f: P) -> Stream<O>
    where
        O: Record,
        P: Fn(&K, WindowBounds, &[T], &mut Emitter<'_, O>) + Clone + Send + 'static,
    {
        self.window_node(
            Vec::new,
            |all: &mut Vec<T>, r| all.push(r),
            move |k: &K, b, all: &Vec<T>, out: &mut Vec<O>| f(k, b, all, &mut Emitter::new(out)),
        )
    }

    pub(super) fn window_node<A, O, I, F, R>(self, init: I, fold: F, result: R) -> Stream<O>
    where
        A: Persist + Clone + Send + Sync + 'static,
        O: Record,
        I: Fn() -> A + Clone + Send + 'static,
        F: Fn(&mut A, T) + Clone + Send + 'static,
        R: Fn(&K, WindowBounds, &A, &mut Vec<O>) + Clone + Send + 'static,
    {
        let WindowedStream { keyed, window, timestamp, settings } = self;
        let key = keyed.key.clone();
        let channels = keyed.keyed_channels();
        keyed.stream.with_side_outputs("window", Partitioning::KeyBy, channels, true, move |ctx, next| {
            window.validate()?;
            settings.validate()?;
            Ok(Box::new(WindowAggregate::new(
                ctx,
                window,
                settings.clone(),
                key.clone(),
                timestamp.clone(),
                init.clone(),
                fold.clone(),
                result.clone(),
                next,
            )))
        })
    }

    /// Counts each key's records per window, emitting `(key, window, count)`.
    pub fn count(self) -> Stream<(K, WindowBounds, u64)>
    where
        K: Record,
    {
        self.aggregate(|| 0u64, |c: &mut u64, _| *c += 1, |k: &K, w, c: &u64| (k.clone(), w, *c))
    }
}

impl<T: Record, K: Key, KF, TF> SessionWindowedStream<T, KF, TF>
where
    KF: Fn(&T) -> K + Clone + Send + 'static,
    TF: Fn(&T) -> Timestamp + Clone + Send + 'static,
{
    /// Keeps each session for `lateness` of event time after it fires; a late record merged
    /// into it fires it again (see [`WindowedStream::allowed_lateness`]).
    pub fn allowed_lateness(mut self, lateness: Timestamp) -> Self {
        self.settings.lateness = lateness;
        self
    }

    /// Sends records too late for any session to the side output `tag`.
    pub fn side_output_late_data(mut self, tag: &OutputTag<T>) -> Self {
        self.settings.late = Some(tag.clone());
        self
    }

    /// Aggregates each session: `fold` adds a record, `merge` combines the accumulators of
    /// two sessions a record joined, `result` makes the record emitted when a session fires.
    ///
    /// ```
    /// use weir::{Job, RunConfig, source::Generator};
    /// let job = Job::new("visits");
    /// // Key 0 at times 0, 3, 6 (one session), then 100 (another).
    /// let out = job
    ///     .generator(Generator::new(|i, _| [(0u64, 0u64), (0, 3), (0, 6), (0, 100)][i as usize]).count(4))
    ///     .with_watermarks(|e: &(u64, u64)| e.1, 0)
    ///     .key_by(|e: &(u64, u64)| e.0)
    ///     .session_window(10, |e: &(u64, u64)| e.1)
    ///     .aggregate(|| 0u64, |n: &mut u64, _| *n += 1, |n, m| *n += m, |k: &u64, w, n: &u64| (*k, w.start, w.end, *n))
    ///     .collect();
    /// job.execute(RunConfig::default()).unwrap();
    /// let mut got = out.lock().unwrap().clone();
    /// got.sort();
    /// assert_eq!(got, vec![(0, 0, 16, 3), (0, 100, 110, 1)]);
    /// ```
    pub fn aggregate<A, O, I, F, M, R>(self, init: I, fold: F, merge: M, result: R) -> Stream<O>
    where
        A: Persist + Clone + Send + Sync + 'static,
        O: Record,
        I: Fn() -> A + Clone + Send + 'static,
        F: Fn(&mut A, T) + Clone + Send + 'static,
        M: Fn(&mut A, A) + Clone + Send + 'static,
        R: Fn(&K, WindowBounds, &A) -> O + Clone + Send + 'static,
    {
        self.session_node(init, fold, merge, move |k: &K, b, a: &A, out: &mut Vec<O>| out.push(result(k, b, a)))
    }

    /// A function over each session's records when it fires (see [`WindowedStream::process`]).
    pub fn process<O, P>(self, f: P) -> Stream<O>
    where
        O: Record,
        P: Fn(&K, WindowBounds, &[T], &mut Emitter<'_, O>) + Clone + Send + 'static,
    {
        self.session_node(
            Vec::new,
            |all: &mut Vec<T>, r| all.push(r),
            |all: &mut Vec<T>, mut other: Vec<T>| all.append(&mut other),
            move |k: &K, b, all: &Vec<T>, out: &mut Vec<O>| f(k, b, all, &mut Emitter::new(out)),
        )
    }

    /// Counts each key's records per session, emitting `(key, session, count)`.
    pub fn count(self) -> Stream<(K, WindowBounds, u64)>
    where
        K: Record,
    {
        self.aggregate(|| 0u64, |c: &mut u64, _| *c += 1, |c, o| *c += o, |k: &K, w, c: &u64| (k.clone(), w, *c))
    }

    pub(super) fn session_node<A, O, I, F, M, R>(self, init: I, fold: F, merge: M, result: R) -> Stream<O>
    where
        A: Persist + Clone + Send + Sync + 'static,
        O: Record,
        I: Fn() -> A + Clone + Send + 'static,
        F: Fn(&mut A, T) + Clone + Send + 'static,
        M: Fn(&mut A, A) + Clone + Send + 'static,
        R: Fn(&K, WindowBounds, &A, &mut Vec<O>) + Clone + Send + 'static,
    {
        let SessionWindowedStream { keyed, timestamp, settings } = self;
        let key = keyed.key.clone();
        let channels = keyed.keyed_channels();
        keyed.stream.with_side_outputs("session", Partitioning::KeyBy, channels, true, move |ctx, next| {
            settings.validate()?;
            Ok(Box::new(SessionWindows::new(
                ctx,
                settings.clone(),
                key.clone(),
                timestamp.clone(),
                init.clone(),
                fold.clone(),
                merge.clone(),
                result.clone(),
                next,
            )))
        })
    }
}
