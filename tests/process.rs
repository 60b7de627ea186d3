//! Keyed process functions with a context: timers in event and processing time, state scoped
//! to the current key, side outputs; checked against a sequential reference at parallelism 1, 2
//! and 4 with out-of-order input, rescaled through savepoints with timers pending, and the
//! mistakes refused when the job starts.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use weir::checkpoint::CheckpointConfig;
use weir::sink::CommittedOutput;
use weir::source::Generator;
use weir::state::{KeyedValueState, MapState, ReducingState, TimeDomain};
use weir::{Error, Job, KeyedContext, KeyedProcessFunction, OutputTag, RunConfig};

use crate::common::{at_rate, savepoint_after, sorted};

const N: u64 = 20_000;
const KEYS: u64 = 11;
const WINDOW: u64 = 50;
/// How far out of order events are (and the watermarks' bound: none is late).
const DISORDER: u64 = 40;
const EARLY: u64 = 1 << 60;

/// Event `i`: a key and a time up to `DISORDER` after `i`.
fn event(i: u64) -> (u64, u64) {
    let h = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    ((h >> 7) % KEYS, i + (h >> 29) % DISORDER)
}

/// A count per key and window in map state, emitted by an event-time timer at the window's end
/// or early at five records (deleting the timer); times divisible by 13 also go to a side
/// output.
#[derive(Clone)]
struct TimerWindows {
    thirteens: OutputTag<(u64, u64)>,
}

impl KeyedProcessFunction<u64, (u64, u64)> for TimerWindows {
    type Out = (u64, u64, u64);
    type State = MapState<u64, u64, u64>;
    fn state(&self) -> Self::State {
        MapState::new()
    }
    fn process(&mut self, (key, ts): (u64, u64), ctx: &mut KeyedContext<'_, u64, Self::State, Self::Out>) {
        assert_eq!(*ctx.key(), key, "the current key is the record's");
        assert!(ctx.current_watermark().is_none_or(|w| ts > w), "no event is late");
        if ts % 13 == 0 {
            ctx.output(&self.thirteens, (key, ts));
        }
        let start = ts - ts % WINDOW;
        let end = start + WINDOW - 1;
        let mut windows = ctx.state();
        let count = windows.get(&start).copied().unwrap_or(0) + 1;
        if count == 5 {
            windows.remove(&start);
            ctx.delete_event_time_timer(end);
            ctx.emit((key | EARLY, start, 5));
        } else {
            windows.put(start, count);
            ctx.register_event_time_timer(end);
        }
    }
    fn on_timer(&mut self, end: u64, domain: TimeDomain, ctx: &mut KeyedContext<'_, u64, Self::State, Self::Out>) {
        assert_eq!(domain, TimeDomain::EventTime);
        assert!(ctx.current_watermark().is_some_and(|w| w >= end), "fired by the watermark");
        let key = *ctx.key();
        let start = end + 1 - WINDOW;
        let count = ctx.state().remove(&start).expect("each window's timer fires once, while it is open");
        ctx.emit((key, start, count));
    }
}

/// What `TimerWindows` must emit, computed one event after another.
type Rows = Vec<(u64, u64, u64)>;

fn reference() -> (Rows, Vec<(u64, u64)>) {
    let mut per_window: HashMap<(u64, u64), u64> = HashMap::new();
    let mut thirteens = Vec::new();
    for (key, ts) in (0..N).map(event) {
        *per_window.entry((key, ts - ts % WINDOW)).or_default() += 1;
        if ts % 13 == 0 {
            thirteens.push((key, ts));
        }
    }
    let mut rows = Vec::new();
    for ((key, start), n) in per_window {
        rows.extend(std::iter::repeat_n((key | EARLY, start, 5), (n / 5) as usize));
        if n % 5 != 0 {
            rows.push((key, start, n % 5));
        }
    }
    rows.sort_unstable();
    thirteens.sort_unstable();
    (rows, thirteens)
}

type Outputs = (CommittedOutput<(u64, u64, u64)>, CommittedOutput<(u64, u64)>);

fn timer_job(p: usize, checkpoints: Option<&Path>, rate: Option<f64>) -> (Job, Outputs) {
    let mut job = Job::new("timer-windows").with_parallelism(p);
    if let Some(dir) = checkpoints {
        job = job.with_checkpointing(CheckpointConfig::new(dir).interval(Duration::from_secs(3600)));
    }
    let thirteens = job.output_tag::<(u64, u64)>("thirteens");
    let generator = at_rate(Generator::new(|i, _| event(i)).count(N), rate);
    let windows = job
        .generator(generator)
        .named("events")
        .with_watermarks(|e: &(u64, u64)| e.1, DISORDER)
        .named("time")
        .key_by(|e: &(u64, u64)| e.0)
        .keyed_process(TimerWindows { thirteens: thirteens.clone() })
        .named("timer-windows");
    let side = windows.side_output(&thirteens).collect_exactly_once();
    (job, (windows.collect_exactly_once(), side))
}

/// The output of jobs run one after another, each restored from the previous one's savepoint:
/// a restored job commits again (into its own output) the savepoint's transaction, which the
/// previous job committed when the savepoint completed; those come first in its output.
fn joined<T: Ord + Clone, const N: usize>(outputs: [CommittedOutput<T>; N]) -> Vec<T> {
    let mut all = Vec::new();
    let mut recommitted = 0;
    for out in outputs {
        let records = out.records();
        all.extend_from_slice(&records[recommitted..]);
        recommitted = records.len() - recommitted;
    }
    all.sort_unstable();
    all
}

#[test]
fn event_time_timers_and_side_outputs_match_the_sequential_reference_at_1_2_and_4() {
    let (rows, thirteens) = reference();
    assert!(rows.iter().any(|r| r.0 & EARLY != 0) && rows.iter().any(|r| r.0 & EARLY == 0));
    for p in [1, 2, 4] {
        let (job, (main, side)) = timer_job(p, None, None);
        job.execute(RunConfig::default().workers(2)).unwrap();
        assert_eq!(sorted(&main), rows, "main output at parallelism {p}");
        assert_eq!(sorted(&side), thirteens, "side output at parallelism {p}");
    }
}

/// Stopped with a savepoint while windows (and their timers) are open, resumed at 4, stopped
/// again, resumed at 1: every timer fires exactly once, in the subtask that owns its key now.
#[test]
fn timers_rescale_through_savepoints_2_to_4_to_1() {
    let dir = tempfile::tempdir().unwrap();
    let (rows, thirteens) = reference();
    let (a, (main_a, side_a)) = timer_job(2, Some(&dir.path().join("a")), Some(100_000.0));
    let handle = a.start(RunConfig::default().workers(2)).unwrap();
    let sp1 = savepoint_after(handle, N / 5, &dir.path().join("sp1"));
    let (b, (main_b, side_b)) = timer_job(4, Some(&dir.path().join("b")), Some(100_000.0));
    let handle = b.restore_from(&sp1, false).start(RunConfig::default().workers(2)).unwrap();
    let sp2 = savepoint_after(handle, N / 5, &dir.path().join("sp2"));
    let (c, (main_c, side_c)) = timer_job(1, Some(&dir.path().join("c")), None);
    c.restore_from(&sp2, false).execute(RunConfig::default().workers(2)).unwrap();
    assert_eq!(joined([main_a, main_b, main_c]), rows);
    assert_eq!(joined([side_a, side_b, side_c]), thirteens);
}

/// Processing-time timers: each record sets one due at once (it fires within the same call)
/// and one an hour ahead (never due: dropped at the end of input); reducing and value state
/// are scoped to the key.
#[derive(Clone)]
struct FlushOnProcessingTime;

impl KeyedProcessFunction<u64, u64> for FlushOnProcessingTime {
    type Out = (u64, u64, u64);
    type State = (ReducingState<u64, u64>, KeyedValueState<u64, u64>);
    fn state(&self) -> Self::State {
        (ReducingState::new(|a, b| a + b), KeyedValueState::new())
    }
    fn process(&mut self, x: u64, ctx: &mut KeyedContext<'_, u64, Self::State, Self::Out>) {
        let now = ctx.current_processing_time();
        let (mut sum, mut seen) = ctx.state();
        sum.add(x);
        *seen.get_or_insert_with(|| 0) += 1;
        ctx.register_processing_time_timer(now);
        ctx.register_processing_time_timer(now + 3_600_000);
    }
    fn on_timer(&mut self, ts: u64, domain: TimeDomain, ctx: &mut KeyedContext<'_, u64, Self::State, Self::Out>) {
        assert_eq!(domain, TimeDomain::ProcessingTime);
        assert!(ts <= ctx.current_processing_time(), "a processing-time timer fires once due");
        let key = *ctx.key();
        let (mut sum, mut seen) = ctx.state();
        if let (Some(s), Some(n)) = (sum.clear(), seen.clear()) {
            ctx.emit((key, s, n));
        }
    }
}

#[test]
fn processing_time_timers_fire_when_due_and_state_is_scoped_to_the_key() {
    for p in [1, 2, 4] {
        let job = Job::new("flush").with_parallelism(p);
        let out = job
            .generator(Generator::new(|i, _| i).count(N))
            .key_by(|x: &u64| x % KEYS)
            .keyed_process(FlushOnProcessingTime)
            .collect();
        job.execute(RunConfig::default().workers(2)).unwrap();
        let mut per_key: HashMap<u64, (u64, u64)> = HashMap::new();
        for (k, s, n) in out.lock().unwrap().iter() {
            let e = per_key.entry(*k).or_default();
            e.0 += s;
            e.1 += n;
        }
        for k in 0..KEYS {
            let expected = (0..N).filter(|x| x % KEYS == k);
            let expect = (expected.clone().sum::<u64>(), expected.count() as u64);
            assert_eq!(per_key.get(&k), Some(&expect), "key {k} at parallelism {p}");
        }
    }
}

fn start_error(job: Job) -> String {
    match job.execute(RunConfig::default()) {
        Err(e @ Error::InvalidConfig(_)) => e.to_string(),
        other => panic!("expected a configuration error, got {other:?}"),
    }
}

#[test]
fn mistakes_are_refused_when_the_job_starts() {
    // One side-output name with two types.
    let job = Job::new("tags");
    let a = job.output_tag::<(u64, u64)>("late");
    let _b = job.output_tag::<u64>("late");
    let s = job
        .generator(Generator::new(|i, _| event(i)).count(10))
        .key_by(|e: &(u64, u64)| e.0)
        .keyed_process(TimerWindows { thirteens: a.clone() });
    s.side_output(&a).discard();
    s.discard();
    let e = start_error(job);
    assert!(e.contains("'late'") && e.contains("two types"), "{e}");

    // A side output of an operator that has none.
    let job = Job::new("no-sides");
    let tag = job.output_tag::<u64>("extra");
    let mapped = job.generator(Generator::new(|i, _| i).count(10)).map(|x| x + 1);
    mapped.side_output(&tag).discard();
    mapped.discard();
    let e = start_error(job);
    assert!(e.contains("has no side outputs") && e.contains("'extra'"), "{e}");

    // A watermark alignment drift of zero.
    let job = Job::new("drift");
    job.generator(Generator::new(|i, _| i).count(10)).with_aligned_watermarks(|t: &u64| *t, 0, "g", 0).discard();
    let e = start_error(job);
    assert!(e.contains("max drift of 0"), "{e}");
}

/// A count per key that starts again when the key was quiet for `TTL` of event time: the
/// count lives in a TTL value state.
#[derive(Clone)]
struct CountUntilExpired;

const TTL: u64 = 60;
const TTL_EVENTS: u64 = 4_000;

/// One source, out of order, with keys that go quiet now and then.
fn ttl_event(i: u64) -> (u64, u64) {
    let h = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let key = if (i / 500).is_multiple_of(2) { (h >> 7) % 3 } else { 3 + (h >> 7) % 3 };
    (key, (i * 2).saturating_sub((h >> 40) % 20))
}

impl KeyedProcessFunction<u64, (u64, u64)> for CountUntilExpired {
    type Out = (u64, u64, u64);
    type State = weir::state::TtlValueState<u64, u64>;
    fn state(&self) -> Self::State {
        weir::state::TtlValueState::new(weir::state::StateTtlConfig::event_time(TTL))
    }
    fn process(&mut self, (key, ts): (u64, u64), ctx: &mut KeyedContext<'_, u64, Self::State, Self::Out>) {
        let mut s = ctx.state();
        let n = s.get_or_insert_with(|| 0);
        *n += 1;
        let n = *n;
        ctx.emit((key, ts, n));
    }
}

/// The counts, one record at a time: a value written at watermark `w` is gone once the
/// watermark (the largest time before the record, no out-of-orderness) reaches `w + TTL`.
fn ttl_reference() -> Vec<(u64, u64, u64)> {
    let mut state: HashMap<u64, (u64, u64)> = HashMap::new();
    let (mut wm, mut out) = (0u64, Vec::new());
    for (key, ts) in (0..TTL_EVENTS).map(ttl_event) {
        let entry = state.entry(key).or_insert((0, wm));
        if entry.1 + TTL <= wm {
            *entry = (0, wm);
        }
        entry.0 += 1;
        entry.1 = wm;
        out.push((key, ts, entry.0));
        wm = wm.max(ts);
    }
    out.sort_unstable();
    out
}

fn ttl_job(p: usize, dir: &Path, rate: Option<f64>) -> (Job, CommittedOutput<(u64, u64, u64)>) {
    let job = Job::new("ttl")
        .with_parallelism(p)
        .with_checkpointing(CheckpointConfig::new(dir).interval(Duration::from_secs(3600)));
    let g = at_rate(Generator::new(|i, _| ttl_event(i)).count(TTL_EVENTS), rate);
    let out = job
        .generator(g)
        .named("events")
        .set_parallelism(1)
        .with_watermarks(|e: &(u64, u64)| e.1, 0)
        .named("time")
        .key_by(|e: &(u64, u64)| e.0)
        .keyed_process(CountUntilExpired)
        .named("counts")
        .collect_exactly_once();
    (job, out)
}

#[test]
fn state_ttl_in_event_time_expires_quiet_keys_across_a_savepoint_and_a_rescale() {
    let expected = ttl_reference();
    assert!(expected.iter().filter(|r| r.2 == 1).count() > 6, "keys expire and start again");
    let dir = tempfile::tempdir().unwrap();
    // One record per batch, so the watermark before each record is the one the reference uses.
    let config = || RunConfig::default().workers(2).batch_size(1);
    let (job, out) = ttl_job(2, &dir.path().join("g"), None);
    job.execute(config()).unwrap();
    assert_eq!(sorted(&out), expected);

    let (a, out_a) = ttl_job(2, &dir.path().join("a"), Some(40_000.0));
    let handle = a.start(config()).unwrap();
    let sp = savepoint_after(handle, TTL_EVENTS / 4, &dir.path().join("sp"));
    let (b, out_b) = ttl_job(3, &dir.path().join("b"), None);
    b.restore_from(&sp, false).execute(config()).unwrap();
    assert_eq!(joined([out_a, out_b]), expected);
}

#[test]
fn a_state_ttl_of_zero_is_refused_when_the_job_starts() {
    #[derive(Clone)]
    struct ZeroTtl;
    impl KeyedProcessFunction<u64, u64> for ZeroTtl {
        type Out = u64;
        type State = weir::state::TtlValueState<u64, u64>;
        fn state(&self) -> Self::State {
            weir::state::TtlValueState::new(weir::state::StateTtlConfig::new(Duration::ZERO))
        }
        fn process(&mut self, x: u64, ctx: &mut KeyedContext<'_, u64, Self::State, u64>) {
            ctx.emit(x)
        }
    }
    let job = Job::new("zero-ttl");
    job.generator(Generator::new(|i, _| i).count(10)).key_by(|x: &u64| *x).keyed_process(ZeroTtl).discard();
    assert!(start_error(job).contains("state TTL of 0"));
}
