//! Two inputs: `connect` with a keyed co-process function (shared keyed state and timers),
//! against a sequential reference at parallelism 1, 2 and 4; and broadcast state, read by a
//! keyed stream, snapshotted and restored at another parallelism with every subtask holding the
//! same rules.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use weir::checkpoint::CheckpointConfig;
use weir::source::Generator;
use weir::state::{KeyedValueState, TimeDomain};
use weir::{
    BroadcastContext, BroadcastState, Job, KeyedBroadcastProcessFunction, KeyedCoProcessFunction, KeyedContext,
    OutputTag, RunConfig,
};

const ORDERS: u64 = 6_000;
const DEADLINE: u64 = 100;
/// The watermarks' bound: larger than any disorder, so nothing is late.
const BOUND: u64 = 30;

/// Order `i`: (id, amount, time). Ids are unique, times about `2 i`.
fn order(i: u64) -> (u64, u64, u64) {
    (i, 10 + i % 90, i * 2 + (i * 7919) % BOUND)
}

/// Orders with `i % 3 != 0` are paid, within `DEADLINE` of the order: (id, amount, time).
fn payment(i: u64) -> Option<(u64, u64, u64)> {
    (!i.is_multiple_of(3)).then(|| (i, 10 + i % 90, order(i).2 + 10 + (i * 31) % 80))
}

/// Matches each order with its payment (they may come in either order); an order unpaid when
/// event time passes its deadline goes to the side output.
#[derive(Clone)]
struct MatchPayments {
    unpaid: OutputTag<u64>,
}

impl KeyedCoProcessFunction<u64, (u64, u64, u64), (u64, u64, u64)> for MatchPayments {
    type Out = (u64, u64, u64);
    type State = KeyedValueState<u64, (Option<u64>, Option<u64>)>;
    fn state(&self) -> Self::State {
        KeyedValueState::new()
    }
    fn process1(&mut self, (id, amount, ts): (u64, u64, u64), ctx: &mut KeyedContext<'_, u64, Self::State, Self::Out>) {
        let mut s = ctx.state();
        let entry = s.get_or_insert_with(|| (None, None));
        entry.0 = Some(amount);
        if let (Some(o), Some(p)) = *entry {
            s.clear();
            ctx.emit((id, o, p));
        } else {
            ctx.register_event_time_timer(ts + DEADLINE);
        }
    }
    fn process2(&mut self, (id, amount, _): (u64, u64, u64), ctx: &mut KeyedContext<'_, u64, Self::State, Self::Out>) {
        let mut s = ctx.state();
        let entry = s.get_or_insert_with(|| (None, None));
        entry.1 = Some(amount);
        if let (Some(o), Some(p)) = *entry {
            s.clear();
            ctx.emit((id, o, p));
        }
    }
    fn on_timer(&mut self, _ts: u64, domain: TimeDomain, ctx: &mut KeyedContext<'_, u64, Self::State, Self::Out>) {
        assert_eq!(domain, TimeDomain::EventTime);
        let id = *ctx.key();
        if ctx.state().clear().is_some() {
            ctx.output(&self.unpaid, id);
        }
    }
}

#[test]
fn connected_streams_share_keyed_state_and_timers_and_match_the_reference_at_1_2_and_4() {
    let matched: Vec<(u64, u64, u64)> = (0..ORDERS).filter_map(payment).map(|(i, a, _)| (i, a, a)).collect();
    let unpaid: Vec<u64> = (0..ORDERS).filter(|i| payment(*i).is_none()).collect();
    for p in [1, 2, 4] {
        let job = Job::new("payments").with_parallelism(p);
        let tag = job.output_tag::<u64>("unpaid");
        let orders = job
            .generator(Generator::new(|i, _| order(i)).count(ORDERS))
            .named("orders")
            .with_watermarks(|o: &(u64, u64, u64)| o.2, BOUND)
            .key_by(|o: &(u64, u64, u64)| o.0);
        let payments = job
            .generator(Generator::new(|i, _| payment(i)).count(ORDERS))
            .named("payments")
            .flat_map(|p, out| {
                if let Some(p) = p {
                    out.emit(p)
                }
            })
            .with_watermarks(|p: &(u64, u64, u64)| p.2, BOUND + DEADLINE)
            .key_by(|p: &(u64, u64, u64)| p.0);
        let out = orders.connect(payments).process(MatchPayments { unpaid: tag.clone() });
        let late = out.side_output(&tag).collect();
        let out = out.collect();
        job.execute(RunConfig::default().workers(2)).unwrap();
        let mut got = out.lock().unwrap().clone();
        got.sort_unstable();
        assert_eq!(got, matched, "parallelism {p}");
        let mut got = late.lock().unwrap().clone();
        got.sort_unstable();
        assert_eq!(got, unpaid, "parallelism {p}");
    }
}

const CATEGORIES: u64 = 5;
const RULE_ROW: u64 = u64::MAX;

/// Keeps events above their category's threshold; the thresholds come from a broadcast
/// stream of (category, threshold). Emits (event, value, threshold seen) for every event, and
/// (RULE_ROW, rules known) when a rule arrives.
#[derive(Clone)]
struct Thresholds;

impl KeyedBroadcastProcessFunction<u64, (u64, u64), (u64, u64)> for Thresholds {
    type Out = (u64, u64, Option<u64>);
    type State = ();
    type BroadcastKey = u64;
    type BroadcastValue = u64;
    fn state(&self) {}
    fn process(
        &mut self,
        (event, value): (u64, u64),
        rules: &BroadcastState<u64, u64>,
        ctx: &mut KeyedContext<'_, u64, (), Self::Out>,
    ) {
        ctx.emit((event, value, rules.get(&(event % CATEGORIES)).copied()));
    }
    fn process_broadcast(
        &mut self,
        (category, threshold): (u64, u64),
        ctx: &mut BroadcastContext<'_, u64, u64, Self::Out>,
    ) {
        ctx.state().put(category, threshold);
        let known = ctx.state().len() as u64;
        ctx.emit((RULE_ROW, known, None));
    }
}

type Collected = std::sync::Arc<std::sync::Mutex<Vec<(u64, u64, Option<u64>)>>>;

fn threshold(category: u64) -> u64 {
    category * 10 + 5
}

fn rules_job(p: usize, dir: &std::path::Path, events: u64) -> (Job, Collected) {
    let job = Job::new("thresholds")
        .with_parallelism(p)
        .with_checkpointing(CheckpointConfig::new(dir).interval(Duration::from_secs(3600)));
    let rules =
        job.generator(Generator::new(|c, _| (c, threshold(c))).count(CATEGORIES)).named("rules").set_parallelism(1);
    let out = job
        .generator(Generator::new(|i, _| (i, i % 100)).count(events).rate(20_000.0))
        .named("events")
        .key_by(|e: &(u64, u64)| e.0)
        .connect_broadcast(rules)
        .process(Thresholds)
        .named("thresholds")
        .collect();
    (job, out)
}

#[test]
fn broadcast_state_reaches_every_subtask_and_restores_whole_at_another_parallelism() {
    let dir = tempfile::tempdir().unwrap();
    let (a, out_a) = rules_job(2, &dir.path().join("a"), 1_000_000);
    let handle = a.start(RunConfig::default().workers(2)).unwrap();
    // Every subtask has every rule once the rows say so: 2 subtasks × 5 rules.
    let deadline = Instant::now() + Duration::from_secs(60);
    while out_a.lock().unwrap().iter().filter(|r| r.0 == RULE_ROW).count() < 2 * CATEGORIES as usize {
        assert!(Instant::now() < deadline, "the rules never reached both subtasks");
        std::thread::sleep(Duration::from_millis(2));
    }
    let seen_a: Vec<_> = out_a.lock().unwrap().clone();
    for (event, _, t) in seen_a.iter().filter(|r| r.0 != RULE_ROW) {
        assert!(t.is_none_or(|t| t == threshold(event % CATEGORIES)), "a wrong threshold for {event}");
    }
    let sp = handle.stop_with_savepoint(dir.path().join("sp")).unwrap().savepoint().expect("a savepoint");
    // At parallelism 3, every subtask restores the rules: every event sees its threshold, and
    // no rule is sent again (the rules source restored its end).
    let (b, out_b) = rules_job(3, &dir.path().join("b"), 30_000);
    b.restore_from(&sp, false).execute(RunConfig::default().workers(2)).unwrap();
    let rows = out_b.lock().unwrap().clone();
    assert!(rows.iter().all(|r| r.0 != RULE_ROW), "rules were sent again");
    let events: BTreeSet<u64> = rows.iter().map(|r| r.0).collect();
    assert!(!events.is_empty());
    for (event, value, t) in &rows {
        assert_eq!(*t, Some(threshold(event % CATEGORIES)), "event {event} ({value}) without its rule");
    }
}
