//! The window toolbox against sequential references: session windows (merging), allowed
//! lateness with late records to a side output, process functions over a window's records with
//! early firings by count, processing-time windows; sessions rescaled through a savepoint; and
//! the settings that make no sense refused when the job starts.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use weir::checkpoint::CheckpointConfig;
use weir::sink::CommittedOutput;
use weir::source::Generator;
use weir::{EarlyFiring, Emitter, Error, Job, RunConfig, Window, WindowBounds};

use crate::common::{at_rate, savepoint_after, sorted};

const N: u64 = 12_000;
const KEYS: u64 = 13;
const DISORDER: u64 = 40;
const GAP: u64 = 25;

/// Event `i`: a key and a time about `3 i`, up to `DISORDER` out of order.
fn event(i: u64) -> (u64, u64) {
    let h = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    ((h >> 7) % KEYS, i * 3 + (h >> 29) % DISORDER)
}

/// Sessions per key computed from the sorted times: (key, start, end, count).
fn reference_sessions() -> Vec<(u64, u64, u64, u64)> {
    let mut times: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for (k, ts) in (0..N).map(event) {
        times.entry(k).or_default().push(ts);
    }
    let mut out = Vec::new();
    for (k, mut ts) in times {
        ts.sort_unstable();
        let (mut start, mut last, mut n) = (ts[0], ts[0], 0);
        for t in ts {
            if t >= last + GAP {
                out.push((k, start, last + GAP, n));
                (start, n) = (t, 0);
            }
            last = t;
            n += 1;
        }
        out.push((k, start, last + GAP, n));
    }
    out.sort_unstable();
    out
}

fn session_job(
    p: usize,
    checkpoints: Option<&Path>,
    rate: Option<f64>,
) -> (Job, CommittedOutput<(u64, u64, u64, u64)>) {
    let mut job = Job::new("sessions").with_parallelism(p);
    if let Some(dir) = checkpoints {
        job = job.with_checkpointing(CheckpointConfig::new(dir).interval(Duration::from_secs(3600)));
    }
    let g = at_rate(Generator::new(|i, _| event(i)).count(N), rate);
    let out = job
        .generator(g)
        .named("events")
        .with_watermarks(|e: &(u64, u64)| e.1, DISORDER)
        .named("time")
        .key_by(|e: &(u64, u64)| e.0)
        .session_window(GAP, |e: &(u64, u64)| e.1)
        .aggregate(
            || 0u64,
            |n: &mut u64, _| *n += 1,
            |n, m| *n += m,
            |k: &u64, w: WindowBounds, n: &u64| (*k, w.start, w.end, *n),
        )
        .named("sessions")
        .collect_exactly_once();
    (job, out)
}

#[test]
fn session_windows_match_the_sequential_reference_at_1_2_and_4() {
    let expected = reference_sessions();
    assert!(expected.iter().any(|s| s.3 > 2), "some sessions merge several records");
    for p in [1, 2, 4] {
        let (job, out) = session_job(p, None, None);
        job.execute(RunConfig::default().workers(2)).unwrap();
        assert_eq!(sorted(&out), expected, "parallelism {p}");
    }
}

#[test]
fn open_sessions_rescale_through_a_savepoint() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = session_job(2, Some(&dir.path().join("a")), Some(100_000.0));
    let handle = a.start(RunConfig::default().workers(2)).unwrap();
    let sp = savepoint_after(handle, N / 4, &dir.path().join("sp"));
    let (b, out) = session_job(3, Some(&dir.path().join("b")), None);
    b.restore_from(&sp, false).execute(RunConfig::default().workers(2)).unwrap();
    // B commits again what A committed with the savepoint, then everything after it.
    assert_eq!(sorted(&out), reference_sessions());
}

/// Times of one source, one record per batch so a watermark (no out-of-orderness) follows
/// each: which records are late is fixed by the sequence.
fn late_sequence() -> Vec<(u64, u64)> {
    (0..3_000u64)
        .map(|i| {
            let h = i.wrapping_mul(0x2545_F491_4F6C_DD1D);
            // Mostly ascending, one in eight up to 30 back.
            let back = if h % 8 == 0 { (h >> 9) % 30 } else { 0 };
            ((h >> 20) % 5, (i * 2).saturating_sub(back))
        })
        .collect()
}

/// What a tumbling 10 count with allowed lateness 8 emits for `late_sequence`, and which records
/// are too late, following the window operator's definition one record at a time.
type Counts = Vec<(u64, u64, u64)>;

fn reference_lateness() -> (Counts, Vec<(u64, u64)>) {
    const LATENESS: u64 = 8;
    let (mut counts, mut fired): (HashMap<(u64, u64), u64>, Vec<u64>) = (HashMap::new(), Vec::new());
    let (mut out, mut late, mut wm): (Vec<_>, Vec<_>, Option<u64>) = (Vec::new(), Vec::new(), None);
    let mut max_seen = 0;
    for (k, ts) in late_sequence() {
        let start = ts - ts % 10;
        if wm.is_some_and(|w| start + 9 + LATENESS <= w) {
            late.push((k, ts));
        } else {
            let c = counts.entry((k, start)).or_default();
            *c += 1;
            if fired.contains(&start) {
                out.push((k, start, *c));
            }
        }
        max_seen = max_seen.max(ts);
        if wm.is_none_or(|w| max_seen > w) {
            wm = Some(max_seen);
            let mut starts: Vec<u64> = counts.keys().map(|(_, s)| *s).filter(|s| !fired.contains(s)).collect();
            starts.sort_unstable();
            starts.dedup();
            for s in starts.into_iter().filter(|s| s + 9 <= max_seen) {
                fired.push(s);
                out.extend(counts.iter().filter(|((_, s2), _)| *s2 == s).map(|((k, s), c)| (*k, *s, *c)));
            }
        }
    }
    // The end of input fires what is still open.
    let open: Vec<u64> = counts.keys().map(|(_, s)| *s).filter(|s| !fired.contains(s)).collect();
    out.extend(counts.iter().filter(|((_, s), _)| open.contains(s)).map(|((k, s), c)| (*k, *s, *c)));
    out.sort_unstable();
    late.sort_unstable();
    (out, late)
}

#[test]
fn allowed_lateness_refires_and_records_later_than_it_go_to_the_side_output() {
    let (expected, expected_late) = reference_lateness();
    assert!(!expected_late.is_empty(), "the sequence has records later than the lateness");
    let windows: std::collections::HashSet<(u64, u64)> = expected.iter().map(|r| (r.0, r.1)).collect();
    assert!(expected.len() > windows.len() + 50, "and many late within it, which refire their window");
    for p in [1, 2, 4] {
        let job = Job::new("lateness").with_parallelism(p);
        let late = job.output_tag::<(u64, u64)>("late");
        let seq = late_sequence();
        let counts = job
            .generator(Generator::new(move |i, _| seq[i as usize]).count(3_000))
            .set_parallelism(1)
            .with_watermarks(|e: &(u64, u64)| e.1, 0)
            .key_by(|e: &(u64, u64)| e.0)
            .window(Window::tumbling(10), |e: &(u64, u64)| e.1)
            .allowed_lateness(8)
            .side_output_late_data(&late)
            .aggregate(|| 0u64, |c: &mut u64, _| *c += 1, |k: &u64, w, c: &u64| (*k, w.start, *c));
        let too_late = counts.side_output(&late).collect();
        let counts = counts.collect();
        job.execute(RunConfig::default().workers(2).batch_size(1)).unwrap();
        let mut got = counts.lock().unwrap().clone();
        got.sort_unstable();
        assert_eq!(got, expected, "parallelism {p}");
        let mut got_late = too_late.lock().unwrap().clone();
        got_late.sort_unstable();
        assert_eq!(got_late, expected_late, "parallelism {p}");
    }
}

#[test]
fn a_process_window_function_sees_every_record_and_a_count_trigger_fires_early() {
    let job = Job::new("contents").with_parallelism(2);
    let out = job
        .generator(Generator::new(|i, _| event(i)).count(N))
        .with_watermarks(|e: &(u64, u64)| e.1, DISORDER)
        .key_by(|e: &(u64, u64)| e.0)
        .window(Window::sliding(100, 50), |e: &(u64, u64)| e.1)
        .early_firing(EarlyFiring::Count(4))
        .process(|k: &u64, w, records: &[(u64, u64)], out: &mut Emitter<'_, (u64, u64, u64, u64)>| {
            assert!(records.iter().all(|r| r.0 == *k && r.1 >= w.start && r.1 < w.end));
            out.emit((*k, w.start, records.len() as u64, records.iter().map(|r| r.1).sum()));
        })
        .collect();
    job.execute(RunConfig::default().workers(2)).unwrap();
    // The last result of each window is complete; the early ones come every 4 records.
    let mut per_window: BTreeMap<(u64, u64), Vec<(u64, u64)>> = BTreeMap::new();
    for (k, start, n, sum) in out.lock().unwrap().iter() {
        per_window.entry((*k, *start)).or_default().push((*n, *sum));
    }
    let mut expected: BTreeMap<(u64, u64), (u64, u64)> = BTreeMap::new();
    for (k, ts) in (0..N).map(event) {
        let s = ts - ts % 50;
        for start in std::iter::once(s).chain(s.checked_sub(50)) {
            let e = expected.entry((k, start)).or_default();
            e.0 += 1;
            e.1 += ts;
        }
    }
    assert_eq!(per_window.len(), expected.len());
    for (w, results) in &per_window {
        let (n, sum) = expected[w];
        assert_eq!(results.iter().max(), Some(&(n, sum)), "window {w:?}: the last result has every record");
        assert_eq!(results.len() as u64, n / 4 + 1, "window {w:?}: early every 4 records and once at the end");
    }
}

#[test]
fn processing_time_windows_count_every_record_once() {
    for p in [1, 2] {
        let job = Job::new("processing-time").with_parallelism(p);
        let out = job
            .generator(Generator::new(|i, _| i % KEYS).count(N))
            .key_by(|k: &u64| *k)
            .processing_time_window(Window::tumbling(5))
            .count()
            .collect();
        job.execute(RunConfig::default().workers(2)).unwrap();
        let mut per_key: HashMap<u64, u64> = HashMap::new();
        for (k, _, c) in out.lock().unwrap().iter() {
            *per_key.entry(*k).or_default() += c;
        }
        for k in 0..KEYS {
            assert_eq!(per_key[&k], N / KEYS + u64::from(k < N % KEYS), "key {k}");
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
fn window_settings_that_make_no_sense_are_refused_when_the_job_starts() {
    let job = Job::new("gap");
    job.generator(Generator::new(|i, _| (i, i)).count(10))
        .key_by(|e: &(u64, u64)| e.0)
        .session_window(0, |e: &(u64, u64)| e.1)
        .count()
        .discard();
    assert!(start_error(job).contains("session gap of 0"));

    let job = Job::new("lateness");
    job.generator(Generator::new(|i, _| i).count(10))
        .key_by(|x: &u64| *x)
        .processing_time_window(Window::tumbling(10))
        .allowed_lateness(5)
        .count()
        .discard();
    assert!(start_error(job).contains("allowed lateness needs event time"));

    let job = Job::new("early");
    job.generator(Generator::new(|i, _| i).count(10))
        .key_by(|x: &u64| *x)
        .window(Window::tumbling(10), |x: &u64| *x)
        .early_firing(EarlyFiring::Count(0))
        .count()
        .discard();
    assert!(start_error(job).contains("every 0 records"));

    let job = Job::new("drift").with_watermark_alignment(0);
    job.generator(Generator::new(|i, _| i).count(10))
        .with_watermarks(|x: &u64| *x, 0)
        .key_by(|x: &u64| *x)
        .window(Window::tumbling(10), |x: &u64| *x)
        .count()
        .discard();
    assert!(start_error(job).contains("alignment drift of 0"));
}

/// The user's case: two live push sources with their own watermarks, one of them silent. Of
/// 30 one-second windows none fired until the silent one was closed: downstream's watermark
/// is the least of its inputs'. With idleness the silent source stops holding event time
/// back after 20 ms without input (and once both are idle, the greatest of their watermarks
/// holds), so every complete window fires while both sources are still open.
#[test]
fn a_silent_source_with_idleness_does_not_hold_windows_back() {
    use weir::sink::RecvError;
    const WAIT: Duration = Duration::from_secs(120);
    let job = Job::new("idle-sources");
    let (mut busy, busy_events) = job.push_source::<(u64, u64)>(1024);
    let (mut quiet, quiet_events) = job.push_source::<(u64, u64)>(1024);
    let idle = Duration::from_millis(20);
    let busy_events = busy_events.with_watermarks_and_idleness(|e: &(u64, u64)| e.1, 0, idle);
    let quiet_events = quiet_events.with_watermarks_and_idleness(|e: &(u64, u64)| e.1, 0, idle);
    let mut counts = busy_events
        .union(quiet_events)
        .key_by(|e: &(u64, u64)| e.0)
        .window(Window::tumbling(1_000), |e: &(u64, u64)| e.1)
        .aggregate(|| 0u64, |c: &mut u64, _| *c += 1, |k: &u64, w, c: &u64| (*k, w.start, *c))
        .pull_sink(1024);
    let handle = job.start(RunConfig::default().workers(2)).unwrap();
    // 31 seconds of event time, ten events a second, on one key; the quiet source says one
    // thing at the start, then nothing.
    quiet.send_timeout((7, 0), WAIT).unwrap();
    for ms in (0..31_000).step_by(100) {
        busy.send_timeout((1, ms), WAIT).unwrap();
    }
    let mut fired = BTreeMap::new();
    // Windows 0 to 29 of the busy key (the 31st is open: event time reached 30,900), and the
    // quiet key's first.
    while fired.len() < 31 {
        match counts.recv_timeout(WAIT) {
            Ok(d) => {
                fired.insert((d.record.0, d.record.1), d.record.2);
            }
            Err(e) => panic!("{} windows fired, then: {e}", fired.len()),
        }
    }
    assert_eq!(fired.get(&(7, 0)), Some(&1), "the quiet source's record counts");
    assert!((0..30).all(|s| fired.get(&(1, s * 1_000)) == Some(&10)), "{fired:?}");
    quiet.close();
    busy.close();
    loop {
        match counts.recv_timeout(WAIT) {
            Ok(_) => {}
            Err(RecvError::Ended { error: None }) => break,
            Err(e) => panic!("{e}"),
        }
    }
    handle.join().unwrap();
}

/// Two source subtasks, one forced behind the other: subtask 1 emits a record only while
/// subtask 0 is `LEAD` or more ahead of it in event time, or has not moved since subtask 1's
/// last poll (held back, or done). Records carry their subtask's event time; `gap` is the
/// largest lead of subtask 0 seen by subtask 1.
struct LaggingSource {
    subtask: usize,
    next: u64,
    /// Subtask 0's last emitted time; `u64::MAX` once it is done.
    leader: std::sync::Arc<std::sync::atomic::AtomicU64>,
    seen: u64,
    gap: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

const LAGGING_COUNT: u64 = 60_000;
const LEAD: u64 = 20_000;

impl weir::source::Source<(u64, u64)> for LaggingSource {
    fn poll(
        &mut self,
        _: &weir::TaskContext,
        out: &mut Vec<(u64, u64)>,
        max: usize,
    ) -> weir::Result<weir::source::SourcePoll> {
        use std::sync::atomic::Ordering::SeqCst;
        use weir::source::SourcePoll;
        if self.next >= LAGGING_COUNT {
            if self.subtask == 0 {
                self.leader.store(u64::MAX, SeqCst);
            }
            return Ok(SourcePoll::Finished);
        }
        if self.subtask == 0 {
            while out.len() < max && self.next < LAGGING_COUNT {
                out.push((self.next % 10, self.next));
                self.next += 1;
            }
            self.leader.store(self.next - 1, SeqCst);
            return Ok(SourcePoll::Emitted);
        }
        let leader = self.leader.load(SeqCst);
        let moved = std::mem::replace(&mut self.seen, leader) != leader;
        if leader != u64::MAX {
            self.gap.fetch_max(leader.saturating_sub(self.next), SeqCst);
        }
        if leader != u64::MAX && moved && leader < self.next + LEAD {
            return Ok(SourcePoll::Idle);
        }
        out.push((self.next % 10, self.next));
        self.next += 1;
        Ok(SourcePoll::Emitted)
    }
}

/// Runs the lagging pair on one worker (tasks take turns), counting per 100-wide window;
/// returns the largest lead seen and the windows' total count.
fn lagging_sources(job: Job) -> (u64, u64) {
    use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
    use std::sync::Arc;
    let (leader, gap) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let job = job.with_parallelism(2);
    let (l, g) = (Arc::clone(&leader), Arc::clone(&gap));
    let counts = job
        .source(move |ctx| {
            Ok(LaggingSource {
                subtask: ctx.subtask,
                next: 0,
                leader: Arc::clone(&l),
                seen: u64::MAX,
                gap: Arc::clone(&g),
            })
        })
        .with_watermarks(|e: &(u64, u64)| e.1, 0)
        .key_by(|e: &(u64, u64)| e.0)
        .window(Window::tumbling(100), |e: &(u64, u64)| e.1)
        .count()
        .collect();
    job.execute(RunConfig::default().workers(1)).unwrap();
    let total = counts.lock().unwrap().iter().map(|(_, _, c)| c).sum();
    (gap.load(SeqCst), total)
}

/// The user's case (W3 written with plain `with_watermarks`): one source ran ahead of the
/// other in event time, and the windows it opened stayed open (in memory and in every
/// checkpoint: 95 MB and 300 ms checkpoints) until the slow one closed them. Assigners are now
/// kept within ten windows of each other by default: the fast subtask is held back at 1,000
/// past the slow one (plus one batch), where it used to run the whole `LEAD` ahead.
#[test]
fn sources_are_kept_together_in_event_time_by_default() {
    let (gap, total) = lagging_sources(Job::new("lagging"));
    assert_eq!(total, 2 * LAGGING_COUNT, "every record counted once");
    assert!(gap < 10 * 100 + 1024 * 2, "subtask 0 ran {gap} ahead, past the default drift of 1,000");

    let (gap, total) = lagging_sources(Job::new("lagging-drift").with_watermark_alignment(5_000));
    assert_eq!(total, 2 * LAGGING_COUNT);
    assert!((5_000..5_000 + 1024 * 2).contains(&gap), "a drift of 5,000 holds at {gap}");

    // Without alignment the leader runs as far ahead as its input allows.
    let (gap, total) = lagging_sources(Job::new("lagging-free").without_watermark_alignment());
    assert_eq!(total, 2 * LAGGING_COUNT);
    assert!(gap >= LEAD, "unaligned, the leader got {gap} ahead");
}
