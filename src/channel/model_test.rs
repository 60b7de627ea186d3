//! Exhaustive interleaving test of the ring and batching protocol: producers (with their
//! overflow stage and chunked publishing) and one input gate, over tiny real rings, under every
//! order of producer steps, drain attempts and consumer polls. rtrb's ring itself is verified by
//! its own CI; this checks our protocol on top of it: per-producer FIFO, nothing lost or
//! duplicated, watermarks never ahead of any live input, end of stream exactly once and last,
//! and no schedule that deadlocks. The key-by writer (records routed to their rings, staged
//! where a ring is full) is explored the same way, one producer into two consumers.

use std::sync::{Arc, Mutex};

use super::partition::KeyRouter;
use super::{channel, ChannelWriter, Entry, InputGate, Partitioner};
use crate::collector::Collector;
use crate::error::Result;
use crate::record::Timestamp;
use crate::wake::Parker;

#[derive(Clone, Debug)]
enum Action {
    Batch(Vec<u64>),
    Watermark(Timestamp),
    End,
}

#[derive(Clone, Debug, PartialEq)]
enum Event {
    Record(u64),
    Watermark(Timestamp),
    End,
}

#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<Event>>>);

impl Collector<u64> for Log {
    fn batch(&mut self, records: &mut Vec<u64>) -> Result<()> {
        self.0.lock().unwrap().extend(records.drain(..).map(Event::Record));
        Ok(())
    }
    fn watermark(&mut self, w: Timestamp) -> Result<()> {
        self.0.lock().unwrap().push(Event::Watermark(w));
        Ok(())
    }
    fn end(&mut self) -> Result<()> {
        self.0.lock().unwrap().push(Event::End);
        Ok(())
    }
}

type Writer = ChannelWriter<u64, fn(&u64) -> u64>;

/// The key-by model's routing: records keyed by themselves, two consumers.
fn route(r: u64) -> usize {
    KeyRouter::new(128, 2).subtask(r)
}

struct System {
    writers: Vec<Writer>,
    next_action: Vec<usize>,
    /// One consumer per gate, each with the log of what it received.
    gates: Vec<(InputGate<u64>, Log)>,
}

impl System {
    /// `producers` forward writers into one consumer.
    fn new(producers: usize, capacity: usize) -> System {
        let mut writers = Vec::new();
        let mut readers = Vec::new();
        for _ in 0..producers {
            let (w, r) = channel::<u64>(capacity, Arc::new(Parker::default()), Arc::new(Parker::default()));
            writers.push(ChannelWriter::new(vec![w], Partitioner::Forward));
            readers.push(r);
        }
        System { writers, next_action: vec![0; producers], gates: vec![(InputGate::new(readers), Log::default())] }
    }

    /// One key-by writer into two consumers.
    fn keyed(capacity: usize) -> System {
        let (mut outs, mut gates) = (Vec::new(), Vec::new());
        for _ in 0..2 {
            let (w, r) = channel::<u64>(capacity, Arc::new(Parker::default()), Arc::new(Parker::default()));
            outs.push(w);
            gates.push((InputGate::new(vec![r]), Log::default()));
        }
        let hash: fn(&u64) -> u64 = |r| *r;
        let writer = ChannelWriter::new(outs, Partitioner::KeyBy { hash, router: KeyRouter::new(128, 2) });
        System { writers: vec![writer], next_action: vec![0], gates }
    }

    fn is_finished(&self) -> bool {
        self.gates.iter().all(|(g, _)| g.is_finished())
    }

    /// Runs one step; returns false if it changed nothing (a stutter, pruned from the search).
    fn step(&mut self, scripts: &[Vec<Action>], actor: usize, budget: usize) -> bool {
        if let Some((gate, log)) = actor.checked_sub(scripts.len()).map(|g| &mut self.gates[g]) {
            let before = (log.0.lock().unwrap().len(), gate.consumed());
            let mut into = log.clone();
            gate.poll(&mut into, budget).unwrap();
            return (log.0.lock().unwrap().len(), gate.consumed()) != before;
        }
        let w = &mut self.writers[actor];
        let before = w.written();
        if !w.drain().unwrap() {
            // Blocked: this step was a drain attempt; it moved something only if room appeared.
            return w.written() != before;
        }
        let Some(action) = scripts[actor].get(self.next_action[actor]) else {
            return w.written() != before;
        };
        self.next_action[actor] += 1;
        match action.clone() {
            Action::Batch(mut v) => w.batch(&mut v).unwrap(),
            Action::Watermark(t) => w.watermark(t).unwrap(),
            Action::End => w.end().unwrap(),
        }
        true
    }
}

/// Checks one complete run's log against the producers' scripts.
fn check(scripts: &[Vec<Action>], log: &[Event], schedule: &[usize]) {
    // Every record exactly once, each producer's in order.
    for script in scripts {
        let sent: Vec<u64> = script
            .iter()
            .flat_map(|a| match a {
                Action::Batch(v) => v.clone(),
                _ => vec![],
            })
            .collect();
        let got: Vec<u64> = log
            .iter()
            .filter_map(|e| match e {
                Event::Record(r) if sent.contains(r) => Some(*r),
                _ => None,
            })
            .collect();
        assert_eq!(got, sent, "records lost, duplicated or reordered; schedule {schedule:?}");
    }
    // End exactly once, last.
    assert_eq!(log.iter().filter(|e| **e == Event::End).count(), 1, "schedule {schedule:?}");
    assert_eq!(log.last(), Some(&Event::End), "schedule {schedule:?}");
    // No record behind the watermark (every producer sends timestamps above its watermarks).
    let mut wm = 0;
    for e in log {
        match e {
            Event::Watermark(w) => {
                assert!(*w > wm, "watermarks must increase; schedule {schedule:?}");
                wm = *w;
            }
            Event::Record(r) => assert!(*r >= wm, "record {r} behind watermark {wm}; schedule {schedule:?}"),
            Event::End => {}
        }
    }
}

/// Explores every schedule of the forward system by depth-first search.
fn explore(scripts: &[Vec<Action>], capacity: usize, budget: usize) -> usize {
    explore_system(scripts, budget, &|| System::new(scripts.len(), capacity), &|sys, schedule| {
        check(scripts, &sys.gates[0].1 .0.lock().unwrap(), schedule)
    })
}

/// Explores every schedule of the system `make` builds, replaying each prefix on a fresh one,
/// and checks every complete run with `verify`.
fn explore_system(
    scripts: &[Vec<Action>],
    budget: usize,
    make: &dyn Fn() -> System,
    verify: &dyn Fn(&System, &[usize]),
) -> usize {
    let actors = scripts.len() + make().gates.len();
    let mut complete = 0;
    let mut stack: Vec<Vec<usize>> = vec![Vec::new()];
    while let Some(prefix) = stack.pop() {
        assert!(prefix.len() < 200, "a schedule did not terminate: {prefix:?}");
        let mut extended = false;
        for actor in 0..actors {
            let mut sys = make();
            for &a in &prefix {
                sys.step(scripts, a, budget);
            }
            if sys.step(scripts, actor, budget) {
                let mut next = prefix.clone();
                next.push(actor);
                stack.push(next);
                extended = true;
            }
        }
        if !extended {
            // Nothing can move: the run must be complete, not deadlocked.
            let mut sys = make();
            for &a in &prefix {
                sys.step(scripts, a, budget);
            }
            assert!(sys.is_finished(), "deadlock: schedule {prefix:?} stops before end of stream");
            verify(&sys, &prefix);
            complete += 1;
        }
    }
    complete
}

#[test]
fn one_producer_batches_through_a_tiny_ring() {
    let script = vec![
        Action::Batch(vec![1, 2, 3]),
        Action::Watermark(3),
        Action::Batch(vec![4]),
        Action::Batch(vec![5, 6]),
        Action::End,
    ];
    for capacity in 1..=3 {
        for budget in [1, 2, 8] {
            let n = explore(std::slice::from_ref(&script), capacity, budget);
            // A one-slot ring forces strict alternation: a single schedule.
            assert!(n > usize::from(capacity > 1), "capacity {capacity}: only {n} schedules explored");
        }
    }
}

#[test]
fn two_producers_merge_with_the_minimum_watermark() {
    let scripts = vec![
        vec![Action::Batch(vec![1]), Action::Watermark(10), Action::Batch(vec![10, 11]), Action::End],
        vec![Action::Batch(vec![2]), Action::Watermark(4), Action::Batch(vec![5]), Action::End],
    ];
    for capacity in [1, 2] {
        let n = explore(&scripts, capacity, 2);
        assert!(n > 100, "only {n} schedules explored");
    }
}

#[test]
fn key_by_writes_each_consumer_its_records_in_order_through_tiny_rings() {
    // Both consumers get records from the first batch, more than a ring holds.
    let script = vec![
        Action::Batch(vec![20, 21, 22, 23, 24, 25]),
        Action::Watermark(20),
        Action::Batch(vec![26, 27]),
        Action::Batch(vec![28, 29, 30]),
        Action::End,
    ];
    let sent: Vec<u64> = (20..=30).collect();
    assert!((0..2).all(|g| sent.iter().filter(|&&r| route(r) == g).count() >= 3), "both consumers get a share");
    let scripts = std::slice::from_ref(&script);
    for capacity in 1..=3 {
        let n = explore_system(scripts, 2, &|| System::keyed(capacity), &|sys, schedule| {
            for (g, (_, log)) in sys.gates.iter().enumerate() {
                let log = log.0.lock().unwrap();
                let got: Vec<u64> =
                    log.iter().filter_map(|e| if let Event::Record(r) = e { Some(*r) } else { None }).collect();
                let mine: Vec<u64> = sent.iter().copied().filter(|&r| route(r) == g).collect();
                assert_eq!(got, mine, "consumer {g}: records lost, duplicated or reordered; schedule {schedule:?}");
                assert_eq!(log.last(), Some(&Event::End), "consumer {g}; schedule {schedule:?}");
                assert_eq!(log.iter().filter(|e| **e == Event::End).count(), 1);
                let wm = log.iter().position(|e| *e == Event::Watermark(20)).expect("the watermark arrives");
                let before: Vec<u64> = mine.iter().copied().filter(|r| (20..=25).contains(r)).collect();
                let records_before_wm = log[..wm].iter().filter(|e| matches!(e, Event::Record(_))).count();
                assert_eq!(records_before_wm, before.len(), "consumer {g}: the watermark overtook a record");
            }
        });
        assert!(n > 10, "capacity {capacity}: only {n} schedules explored");
    }
}

/// Every schedule of two actors (0 the producer, 1 the consumer) over a system `new` makes:
/// `step(system, actor)` moves one actor and says whether anything changed; a schedule ends
/// when neither can move, and `check` gets the system replayed to that point. Returns the
/// schedules explored.
fn explore_two<R>(
    new: impl Fn() -> R,
    step: impl Fn(&mut R, usize) -> bool,
    mut check: impl FnMut(R, &[usize]),
) -> usize {
    let mut complete = 0;
    let mut stack: Vec<Vec<usize>> = vec![Vec::new()];
    while let Some(prefix) = stack.pop() {
        assert!(prefix.len() < 100, "a schedule did not terminate: {prefix:?}");
        let replay = |extra: Option<usize>| {
            let mut r = new();
            let mut moved = false;
            for &a in prefix.iter().chain(extra.iter()) {
                moved = step(&mut r, a);
            }
            (r, moved)
        };
        let mut extended = false;
        for actor in 0..2 {
            if replay(Some(actor)).1 {
                let mut next = prefix.clone();
                next.push(actor);
                stack.push(next);
                extended = true;
            }
        }
        if !extended {
            check(replay(None).0, &prefix);
            complete += 1;
        }
    }
    complete
}

/// One schedule's run of [`priority_barriers_overtake_and_capture_exactly_the_in_flight_records`]:
/// the producer's writer and step, the consumer's gate and log, where it snapshotted.
struct PriorityRun {
    writer: Writer,
    gate: InputGate<u64>,
    log: Log,
    step: usize,
    snapshot_at: Option<(u64, u64)>,
}
// Producer steps: write `before` as two batches, publish the barrier, write `after`, end.
fn produce_priority(r: &mut PriorityRun, before: &[u64], after: &[u64], barrier: crate::snapshot::Barrier) -> bool {
    let w = &mut r.writer;
    let written = w.written();
    if !w.drain().unwrap() {
        return w.written() != written;
    }
    let mut snap = crate::snapshot::TaskSnapshot::new(barrier);
    match r.step {
        0 => w.batch(&mut before[..2].to_vec()).unwrap(),
        1 => w.batch(&mut before[2..].to_vec()).unwrap(),
        2 => w.barrier(barrier, &mut snap).unwrap(),
        3 => w.batch(&mut after.to_vec()).unwrap(),
        4 => w.end().unwrap(),
        _ => return w.written() != written,
    }
    r.step += 1;
    true
}
fn consume_priority(r: &mut PriorityRun, budget: usize) -> bool {
    let before = (r.log.0.lock().unwrap().len(), r.gate.consumed(), r.gate.capturing());
    let mut log = r.log.clone();
    match r.gate.poll(&mut log, budget).unwrap() {
        super::GatePoll::PriorityBarrier { seq, .. } => {
            let consumed = r.log.0.lock().unwrap().len() as u64;
            r.snapshot_at = Some((consumed, seq));
            r.gate.start_capture(1);
            r.gate.set_capture_limit(1, 0, seq);
            return true;
        }
        _ => r.gate.refresh_capture(),
    }
    (r.log.0.lock().unwrap().len(), r.gate.consumed(), r.gate.capturing()) != before
}

/// The priority-slot protocol between one producer and one consumer, under every
/// interleaving: the producer writes records, publishes an unaligned barrier (its write
/// sequence number S counts records still staged), and writes more; the consumer polls in
/// unaligned mode and, on the barrier, snapshots (at read position R) and captures in-flight
/// data by peeking and logging. Checked: nothing at or after S is consumed before the barrier
/// is seen (R <= S), S is exactly the records written before the barrier, and the captured data
/// is exactly the records in [R, S), in order. The consumer reads runs of 1, 2 and 8 entries
/// a poll, so a barrier overtakes part of a run, and a capture starts in a run partly consumed.
#[test]
fn priority_barriers_overtake_and_capture_exactly_the_in_flight_records() {
    use crate::snapshot::Barrier;
    let barrier = Barrier { id: 1, trigger_ns: 0, unaligned: true, savepoint: false };
    let before: Vec<u64> = vec![1, 2, 3, 4];
    let after: Vec<u64> = vec![5, 6];

    let new_run = |capacity: usize| {
        let (w, rd) = channel::<u64>(capacity, Arc::new(Parker::default()), Arc::new(Parker::default()));
        let mut gate = InputGate::new(vec![rd]);
        gate.set_unaligned(true);
        PriorityRun {
            writer: ChannelWriter::new(vec![w], Partitioner::Forward),
            gate,
            log: Log::default(),
            step: 0,
            snapshot_at: None,
        }
    };
    for (capacity, budget) in [1, 2, 3].into_iter().flat_map(|c| [1, 2, 8].map(|b| (c, b))) {
        let step = |r: &mut PriorityRun, actor: usize| {
            if actor == 0 {
                produce_priority(r, &before, &after, barrier)
            } else {
                consume_priority(r, budget)
            }
        };
        let complete = explore_two(
            || new_run(capacity),
            step,
            |mut r, prefix| {
                assert!(r.gate.is_finished(), "deadlock: {prefix:?}");
                let (read_at_snapshot, seq) = r.snapshot_at.expect("the barrier was seen");
                assert_eq!(seq, before.len() as u64, "S counts the records written (or staged) before the barrier");
                assert!(read_at_snapshot <= seq, "consumed past the barrier before seeing it: {prefix:?}");
                assert!(r.gate.capture_complete(1), "in-flight data incomplete at the end: {prefix:?}");
                let captured: Vec<u64> = r
                    .gate
                    .take_capture(1)
                    .into_iter()
                    .flat_map(|(_, es)| es.decode::<u64>().unwrap())
                    .map(|e| match e {
                        Entry::Record(v) => v,
                        other => panic!("unexpected in-flight entry {other:?}"),
                    })
                    .collect();
                assert_eq!(captured, before[read_at_snapshot as usize..], "schedule {prefix:?}");
                let all: Vec<Event> = r.log.0.lock().unwrap().clone();
                let records: Vec<u64> =
                    all.iter().filter_map(|e| if let Event::Record(v) = e { Some(*v) } else { None }).collect();
                assert_eq!(
                    records,
                    [before.clone(), after.clone()].concat(),
                    "every record is still delivered once, in order"
                );
            },
        );
        assert!(
            complete >= if capacity == 1 { 1 } else { 5 },
            "capacity {capacity} budget {budget}: {complete} schedules"
        );
    }
}

/// One schedule of [`in_band_barriers_and_watermarks_cut_runs_exactly`]: the producer's writer
/// and step, the consumer's gate and log, and what the log held when the barrier came.
struct InBandRun {
    writer: Writer,
    gate: InputGate<u64>,
    log: Log,
    step: usize,
    at_barrier: Option<Vec<Event>>,
}

/// The producer of [`in_band_barriers_and_watermarks_cut_runs_exactly`]: two runs around a
/// watermark, an in-band barrier, one more run, the end.
fn produce_in_band(r: &mut InBandRun) -> bool {
    let w = &mut r.writer;
    let written = w.written();
    if !w.drain().unwrap() {
        return w.written() != written;
    }
    let barrier = crate::snapshot::Barrier { id: 1, trigger_ns: 0, unaligned: false, savepoint: false };
    match r.step {
        0 => w.batch(&mut vec![1, 2, 3]).unwrap(),
        1 => w.watermark(3).unwrap(),
        2 => w.batch(&mut vec![4, 5]).unwrap(),
        3 => w.barrier(barrier, &mut crate::snapshot::TaskSnapshot::new(barrier)).unwrap(),
        4 => w.batch(&mut vec![6, 7]).unwrap(),
        5 => w.end().unwrap(),
        _ => return w.written() != written,
    }
    r.step += 1;
    true
}

fn consume_in_band(r: &mut InBandRun, budget: usize) -> bool {
    let before = (r.log.0.lock().unwrap().len(), r.gate.consumed());
    let mut log = r.log.clone();
    if let super::GatePoll::Barrier { .. } = r.gate.poll(&mut log, budget).unwrap() {
        assert!(r.at_barrier.is_none(), "one barrier, delivered once");
        r.at_barrier = Some(r.log.0.lock().unwrap().clone());
        return true;
    }
    (r.log.0.lock().unwrap().len(), r.gate.consumed()) != before
}

/// The gate takes records off the ring in runs that end at control entries: under every
/// interleaving of a producer and a consumer reading 1, 2, 3 or 8 entries a poll, through rings
/// of 1 to 4 slots, a barrier inside a stream of runs cuts it exactly (everything before it
/// delivered when it is, nothing after), a watermark comes between the records around it, and
/// every record arrives once, in order.
#[test]
fn in_band_barriers_and_watermarks_cut_runs_exactly() {
    let new_run = |capacity: usize| {
        let (w, rd) = channel::<u64>(capacity, Arc::new(Parker::default()), Arc::new(Parker::default()));
        InBandRun {
            writer: ChannelWriter::new(vec![w], Partitioner::Forward),
            gate: InputGate::new(vec![rd]),
            log: Log::default(),
            step: 0,
            at_barrier: None,
        }
    };
    let records = |events: &[Event]| -> Vec<u64> {
        events.iter().filter_map(|e| if let Event::Record(v) = e { Some(*v) } else { None }).collect()
    };
    for (capacity, budget) in [1, 2, 3, 4].into_iter().flat_map(|c| [1, 2, 3, 8].map(|b| (c, b))) {
        let step = |r: &mut InBandRun, actor: usize| {
            if actor == 0 {
                produce_in_band(r)
            } else {
                consume_in_band(r, budget)
            }
        };
        let complete = explore_two(
            || new_run(capacity),
            step,
            |r, prefix| {
                assert!(r.gate.is_finished(), "deadlock: {prefix:?}");
                let at_barrier = r.at_barrier.expect("the barrier was delivered");
                assert_eq!(records(&at_barrier), [1, 2, 3, 4, 5], "the barrier cuts the runs exactly: {prefix:?}");
                let all = r.log.0.lock().unwrap().clone();
                assert_eq!(records(&all), (1..=7).collect::<Vec<_>>(), "every record once, in order: {prefix:?}");
                let wm = all.iter().position(|e| *e == Event::Watermark(3)).expect("the watermark arrives");
                assert_eq!(records(&all[..wm]), [1, 2, 3], "the watermark between its runs: {prefix:?}");
                assert_eq!((all.last(), all.iter().filter(|e| **e == Event::End).count()), (Some(&Event::End), 1));
            },
        );
        assert!(complete >= if capacity == 1 { 1 } else { 5 }, "capacity {capacity} budget {budget}: {complete}");
    }
}
