//! The jobs `weir simulate` runs (and `cargo test` simulates): word count over a text
//! corpus, a sliding-window count, a window join of two sources, a keyed process with list
//! state, records that own memory through every operator, a keyed process function with
//! timers and a side output, session windows, and an embedded job whose host program feeds a
//! push source and reads an exactly-once pull sink. Small (a few thousand records), so a seed
//! takes milliseconds; each commits its output as `(u64, u64, u64)` rows.
//!
//! May touch: `error`, `operator`, `pipeline`, `prng`, `record`, `sink`, `source`, `state`.

use std::fmt;
use std::path::{Path, PathBuf};

use weir::checkpoint::ModeKind;
use weir::error::{Error, Result};
use weir::operator::window::Window;
use weir::pipeline::Job;
use weir::prng::mix;
use weir::record::Word;
use weir::simulation::{Expect, HostLog, SimHost, SimOutput};
use weir::source::{Generator, TextSource};
use weir::state::ListState;

/// One committed row of a simulated job.
pub type Row = (u64, u64, u64);

/// weir's simulated jobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimJob {
    /// Running word counts over a text corpus (the text source's offsets, keyed state).
    Wordcount,
    /// Sliding event-time windows counting per key (watermarks, window state, timers).
    Window,
    /// A tumbling window join of two sources (a two-input task, two gates).
    Join,
    /// A keyed process function with list state, pairing each record with its key's previous
    /// one (user state).
    Keyed,
    /// Records that own heap memory (an enum of strings, byte buffers, vectors and nested
    /// options) through every built-in operator: flat_map, filter, rebalance, broadcast,
    /// union, a running aggregate keyed by a borrowed `&str` (stored as a `String`), a reduce
    /// keyed by `String`, a sliding window, a window join and a process function with list
    /// state.
    Owned,
    /// A keyed process function with event-time timers: tumbling windows kept in map state,
    /// each closed by a timer at its end, closed early (its timer deleted) at five records,
    /// and some records sent to a side output (timers in snapshots, firing exactly once across
    /// restores).
    Timers,
    /// Event-time session windows, merging as records bridge sessions (session state merged
    /// across checkpoints and restores).
    Sessions,
    /// Running counts per key into Kafka through the exactly-once transactional sink, over an
    /// in-memory model of a partitioned transactional log (producer ids and epochs, fencing,
    /// commit and abort markers) that, under a seed, loses requests and answers. The output is
    /// what the log holds as committed when the run ends; damage to a checkpoint whose output
    /// was committed must end in the sink's refusal (Kafka output cannot be withdrawn).
    Kafka,
    /// An embedded job: a host program sends events through a push source (an async host,
    /// its futures polled between the job's steps) and takes running counts from an
    /// exactly-once pull sink into a log of its own. After a process crash the program starts
    /// again: the host resends from the job's resume point (`EventSender::resume_from`) and
    /// tells the sink the last result it logged (`EventReceiver::resume_after`).
    Embedded,
}

impl SimJob {
    /// Every job, in the order `weir simulate` lists them.
    pub const ALL: [SimJob; 9] = [
        SimJob::Wordcount,
        SimJob::Window,
        SimJob::Join,
        SimJob::Keyed,
        SimJob::Owned,
        SimJob::Timers,
        SimJob::Sessions,
        SimJob::Kafka,
        SimJob::Embedded,
    ];

    /// Whether the job's output is the same at every parallelism (no record is late and no
    /// result depends on the order keys' records meet), so seeds may rescale it
    /// ([`weir::simulation::SimOptions::rescale`]). The keyed, owned and timer jobs' results depend on
    /// the order in which a key's records arrive, which the source's parallelism decides.
    pub fn rescales(self) -> bool {
        matches!(self, SimJob::Wordcount | SimJob::Window | SimJob::Join | SimJob::Sessions | SimJob::Kafka)
    }

    /// How a seed's output must compare with the golden run's in `mode`. Under at-least-once
    /// a window may count a replayed event twice, so its count may only be higher.
    pub fn expect(self, mode: ModeKind) -> Expect<Row> {
        if mode.exactly_once() || !matches!(self, SimJob::Window | SimJob::Owned | SimJob::Timers | SimJob::Sessions) {
            return Expect::of(mode);
        }
        if matches!(self, SimJob::Timers | SimJob::Sessions) {
            // A replayed record counts again, and may close a window early once more: per key
            // (early or not) and window, the counts may only add up to more. (A session's rows
            // are (key, start, count): a replay lands in the same session.)
            return Expect::Custom(Box::new(|golden: &[Row], got: &[Row]| {
                let sums = |rows: &[Row]| {
                    let mut m = std::collections::HashMap::new();
                    for &(k, start, c) in rows {
                        let k = if k >> 56 == EARLY_ROWS { k & ((1 << 56) - 1) } else { k };
                        *m.entry((k, start)).or_insert(0u64) += c;
                    }
                    m
                };
                let got = sums(got);
                for ((k, start), c) in sums(golden) {
                    if got.get(&(k, start)).copied().unwrap_or(0) < c {
                        return Err(format!(
                            "key {k:#x} window {start}: {c} records counted in the golden run, fewer now"
                        ));
                    }
                }
                Ok(())
            }));
        }
        // Window rows are (key, start, count); the owned job's are tagged in the key's top byte
        // (window rows with WINDOW_ROWS), its other rows must all be there.
        let windows_only = self == SimJob::Window;
        Expect::Custom(Box::new(move |golden: &[Row], got: &[Row]| {
            let is_window = |k: u64| windows_only || k >> 56 == WINDOW_ROWS;
            let mut best = std::collections::HashMap::new();
            let mut others = std::collections::HashMap::new();
            for &(k, start, c) in got {
                if is_window(k) {
                    let e = best.entry((k, start)).or_insert(0);
                    *e = c.max(*e);
                } else {
                    *others.entry((k, start, c)).or_insert(0u64) += 1;
                }
            }
            for &(k, s, c) in golden {
                if is_window(k) {
                    if best.get(&(k, s)).copied().unwrap_or(0) < c {
                        return Err(format!("window (key, start, count) {:?} lost (at-least-once)", (k, s, c)));
                    }
                } else {
                    match others.get_mut(&(k, s, c)) {
                        Some(n) if *n > 0 => *n -= 1,
                        _ => return Err(format!("row {:?} lost (at-least-once)", (k, s, c))),
                    }
                }
            }
            Ok(())
        }))
    }

    /// A builder of the job at `parallelism`; `scratch` holds its input (word count's corpus,
    /// written here once).
    pub fn builder(self, parallelism: usize, scratch: &Path) -> Result<impl Fn() -> (Job, SimOutput<Row>)> {
        let corpus = match self {
            SimJob::Wordcount => Some(write_corpus(scratch)?),
            _ => None,
        };
        Ok(move || build(self, parallelism, corpus.as_deref()))
    }
}

impl fmt::Display for SimJob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SimJob::Wordcount => "wordcount",
            SimJob::Window => "window",
            SimJob::Join => "join",
            SimJob::Keyed => "keyed",
            SimJob::Owned => "owned",
            SimJob::Timers => "timers",
            SimJob::Sessions => "sessions",
            SimJob::Kafka => "kafka",
            SimJob::Embedded => "embedded",
        })
    }
}

impl std::str::FromStr for SimJob {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        weir::error::one_of(&SimJob::ALL, s, "a simulated job")
    }
}

/// Events per source.
const EVENTS: u64 = 600;

fn build(which: SimJob, parallelism: usize, corpus: Option<&Path>) -> (Job, SimOutput<Row>) {
    let job = Job::new(format!("sim-{which}")).with_parallelism(parallelism);
    let out = match which {
        SimJob::Embedded => {
            let out = embedded(&job);
            return (job, out);
        }
        SimJob::Kafka => {
            let out = kafka(&job);
            return (job, out);
        }
        SimJob::Wordcount => job
            .text(TextSource::open(corpus.expect("word count has a corpus")).expect("the corpus was just written"))
            .words()
            .key_by_ref(|w: &Word| w)
            .aggregate_with_record(|| 0u64, |c: &mut u64, _: &Word| *c += 1, |w: Word, c: &u64| (w, *c))
            .named("count")
            .map(|(w, c)| (weir::record::hash_key(&w), c, 0))
            .collect_exactly_once(),
        SimJob::Window => job
            .generator(Generator::new(|i, _| (mix(i) % 7, i + mix(i ^ 99) % 40)).count(EVENTS))
            .with_watermarks(|e: &(u64, u64)| e.1, 40)
            .key_by(|e: &(u64, u64)| e.0)
            .window(Window::sliding(100, 25), |e: &(u64, u64)| e.1)
            .count()
            .named("window")
            .map(|(k, w, c)| (k, w.start, c))
            .collect_exactly_once(),
        SimJob::Join => join(&job),
        // Each key's records come from one source subtask (index i is generated by subtask
        // i % parallelism), so they reach the process function in one order in every run.
        SimJob::Keyed => job
            .generator(Generator::new(move |i, _| ((i % parallelism as u64) * 16 + mix(i) % 5, i)).count(EVENTS))
            .key_by(|e: &(u64, u64)| e.0)
            // Each record paired with its key's previous one: under at-least-once a replay
            // adds pairs and loses none.
            .process(ListState::new, |k: &u64, e: (u64, u64), last: &mut ListState<u64, u64>, out: &mut Vec<Row>| {
                if let [previous] = last.get(k) {
                    out.push((*k, *previous, e.1));
                }
                last.take(k);
                last.add(*k, e.1);
            })
            .named("pairs")
            .collect_exactly_once(),
        SimJob::Owned => owned(&job, parallelism),
        SimJob::Timers => timers(&job),
        // Each key gets an event about every 21 units, out of order by up to 40 (the
        // watermarks' bound, so none is late); a gap of 15 splits some and merges others.
        SimJob::Sessions => job
            .generator(Generator::new(|i, _| (mix(i) % 7, i * 3 + mix(i ^ 99) % 40)).count(EVENTS))
            .with_watermarks(|e: &(u64, u64)| e.1, 40)
            .key_by(|e: &(u64, u64)| e.0)
            .session_window(15, |e: &(u64, u64)| e.1)
            .count()
            .named("sessions")
            .map(|(k, w, c)| (k, w.start, c))
            .collect_exactly_once(),
    };
    (job, out.into())
}

/// Two generators joined per key in tumbling windows of event time.
fn join(job: &Job) -> weir::sink::CommittedOutput<Row> {
    let left = job
        .generator(Generator::new(|i, _| (mix(i) % 20, i)).count(EVENTS / 2))
        .named("left")
        .with_watermarks(|e: &(u64, u64)| e.1, 0);
    let right = job
        .generator(Generator::new(|i, _| (mix(i + 5) % 20, i)).count(EVENTS / 2))
        .named("right")
        .with_watermarks(|e: &(u64, u64)| e.1, 0);
    left.window_join(
        right,
        |e: &(u64, u64)| e.0,
        |e: &(u64, u64)| e.0,
        |e: &(u64, u64)| e.1,
        |e: &(u64, u64)| e.1,
        Window::tumbling(50),
        |&k, a: &(u64, u64), b: &(u64, u64)| (k, a.1, b.1),
    )
    .named("join")
    .collect_exactly_once()
}

/// Windows of the job's own timers, with a side output.
fn timers(job: &Job) -> weir::sink::CommittedOutput<Row> {
    let side = job.output_tag::<Row>("thirteens");
    let events = job
        .generator(Generator::new(|i, _| (mix(i) % 7, i + mix(i ^ 99) % 40)).count(EVENTS))
        .with_watermarks(|e: &(u64, u64)| e.1, 40)
        .key_by(|e: &(u64, u64)| e.0)
        .keyed_process(TimerWindows { side: side.clone() })
        .named("timer-windows");
    let thirteens = events.side_output(&side);
    events.union(thirteens).collect_exactly_once()
}

/// The embedded job: a host feeding a push source, a keyed count, an exactly-once pull sink the host acknowledges.
fn embedded(job: &Job) -> SimOutput<Row> {
    // Small rings and a small replay buffer: the host is backpressured, and waits for
    // checkpoints to complete.
    let (sender, events) = job.push_source_with::<(u64, u64)>(8, 32);
    let receiver = events
        .key_by(|e: &(u64, u64)| e.0)
        .aggregate(|| 0u64, |c: &mut u64, _| *c += 1, |k: &u64, c: &u64| (*k, *c, 0))
        .named("count")
        .pull_sink_with(16, weir::sink::Guarantee::ExactlyOnce)
        .with_acks();
    let host = EmbeddedHost {
        sender: Some(sender),
        closing: None,
        receiver,
        next: None,
        in_hand: None,
        log: HostLog::default(),
    };
    SimOutput::Host(Box::new(host))
}

/// Running counts into the exactly-once Kafka sink over a model of a transactional log that loses requests and answers; read from the model.
fn kafka(job: &Job) -> SimOutput<Row> {
    use weir_kafka::log::{TransactionLog, TransactionModel};
    // About one request in 40 lost (or its answer), at most 3 a run: each a failover.
    let model = match weir::simulation::fault_seed() {
        Some(seed) => TransactionModel::losing_requests(seed, 40, 3),
        None => TransactionModel::default(),
    };
    model.create_topic("counts", 3);
    let log = model.clone();
    let connect = std::sync::Arc::new(move || Ok(Box::new(log.clone()) as Box<dyn TransactionLog>));
    job.generator(Generator::new(|i, _| mix(i) % 23).count(EVENTS))
        .key_by(|k: &u64| *k)
        .aggregate(|| 0u64, |c: &mut u64, _| *c += 1, |k: &u64, c: &u64| (*k, *c))
        .named("count")
        .sink(
            weir_kafka::KafkaSink::over("model", connect, "counts", |r: &(u64, u64)| weir_kafka::KafkaRecord {
                key: Some(r.0.to_le_bytes().to_vec()),
                value: r.1.to_le_bytes().to_vec(),
            })
            .batch_bytes(256)
            .subtasks(),
        );
    let read = move || committed_counts(&model);
    SimOutput::Read(Box::new(read))
}

/// The embedded job's event `i`: a key of seven, and its number.
fn embedded_event(i: u64) -> (u64, u64) {
    (mix(i) % 7, i)
}

/// The embedded job's host program: sends events 0 to `EVENTS` from the job's resume point
/// (it can make any of them again, as a host replaying its own log does), then closes the
/// stream; handles each result it receives in the step after (a database write, say: a crash
/// between the two loses the result in hand), then logs it with its number and acknowledges it.
/// An async host whose futures the simulator polls between the job's steps (with a waker that
/// does nothing: it polls again).
struct EmbeddedHost {
    sender: Option<weir::source::EventSender<(u64, u64)>>,
    closing: Option<weir::source::Closing<(u64, u64)>>,
    receiver: weir::sink::EventReceiver<Row>,
    /// The next event to send, once the job told its resume point.
    next: Option<u64>,
    /// The result received and not yet handled: lost with the process if it dies now.
    in_hand: Option<weir::sink::Delivered<Row>>,
    log: HostLog<Row>,
}

impl EmbeddedHost {
    /// Handles the result in hand, then receives one if one is ready (to handle next time).
    fn receive(&mut self, cx: &mut std::task::Context<'_>) -> bool {
        use std::future::Future;
        if let Some(d) = self.in_hand.take() {
            self.log.handled.push(d.record);
            self.log.last_seq = Some(d.seq);
            if let Err(e) = self.receiver.ack(d.seq) {
                panic!("the host's acknowledgement of {} was refused: {e}", d.seq);
            }
        }
        match std::pin::Pin::new(&mut self.receiver.recv()).poll(cx) {
            std::task::Poll::Ready(Ok(d)) => {
                self.in_hand = Some(d);
                true
            }
            _ => false,
        }
    }
}

impl SimHost<Row> for EmbeddedHost {
    fn step(&mut self, budget: usize) {
        use std::future::Future;
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        for _ in 0..budget {
            if let Some(tx) = self.sender.as_mut() {
                // The resume point is known once the job's source started (0 on a fresh
                // start, else the first event its restored checkpoint does not cover).
                if self.next.is_none() {
                    self.next = tx.next_seq();
                }
                match self.next {
                    Some(i) if i >= EVENTS => {
                        self.closing = self.sender.take().map(|tx| tx.close_async());
                    }
                    Some(i) => {
                        if let std::task::Poll::Ready(Ok(())) =
                            std::pin::Pin::new(&mut tx.send(embedded_event(i))).poll(&mut cx)
                        {
                            self.next = Some(i + 1);
                        }
                    }
                    None => {}
                }
            }
            if let Some(closing) = self.closing.as_mut() {
                if std::pin::Pin::new(closing).poll(&mut cx).is_ready() {
                    self.closing = None;
                }
            }
            self.receive(&mut cx);
        }
    }

    fn drain(&mut self) {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        while self.receive(&mut cx) {}
        debug_assert!(self.in_hand.is_none(), "a receive that got nothing handled the result in hand");
    }

    fn resume(&mut self, log: HostLog<Row>) {
        if let Some(last) = log.last_seq {
            self.receiver.resume_after(last);
        }
        self.log = log;
    }

    fn log(&self) -> &HostLog<Row> {
        &self.log
    }

    fn into_log(mut self: Box<Self>) -> HostLog<Row> {
        // The process died: its sender sends no end marker.
        if let Some(tx) = self.sender.take() {
            tx.abandon();
        }
        if let Some(closing) = self.closing.take() {
            closing.abandon();
        }
        std::mem::take(&mut self.log)
    }
}

/// The timers job's function: a count per key and 50-unit window in map state, emitted by a
/// timer at the window's end, or at five records (then the timer is deleted and the window
/// starts counting again). Records whose time is a multiple of 13 also go to a side output.
#[derive(Clone)]
struct TimerWindows {
    side: weir::operator::side::OutputTag<Row>,
}

/// Rows of the timers job: early closes carry this in the key's top byte.
const EARLY_ROWS: u64 = 1;
/// Side-output rows.
const SIDE_ROWS: u64 = 2;
const TIMER_WINDOW: u64 = 50;

impl weir::operator::process::KeyedProcessFunction<u64, (u64, u64)> for TimerWindows {
    type Out = Row;
    type State = weir::state::MapState<u64, u64, u64>;
    fn state(&self) -> Self::State {
        weir::state::MapState::new()
    }
    fn process(&mut self, (key, ts): (u64, u64), ctx: &mut weir::KeyedContext<'_, u64, Self::State, Row>) {
        if ts % 13 == 0 {
            ctx.output(&self.side, ((SIDE_ROWS << 56) | key, ts, 1));
        }
        let start = ts - ts % TIMER_WINDOW;
        let end = start + TIMER_WINDOW - 1;
        let mut windows = ctx.state();
        let count = windows.get(&start).copied().unwrap_or(0) + 1;
        if count == 5 {
            windows.remove(&start);
            ctx.delete_event_time_timer(end);
            ctx.emit(((EARLY_ROWS << 56) | key, start, count));
        } else {
            windows.put(start, count);
            ctx.register_event_time_timer(end);
        }
    }
    fn on_timer(
        &mut self,
        end: u64,
        _: weir::state::TimeDomain,
        ctx: &mut weir::KeyedContext<'_, u64, Self::State, Row>,
    ) {
        let key = *ctx.key();
        let start = end + 1 - TIMER_WINDOW;
        let count = ctx.state().remove(&start).expect("a window's timer fires once, while it is open");
        ctx.emit((key, start, count));
    }
}

/// An event of the owned-records job: what a user's records look like.
#[derive(Clone, Debug, PartialEq, weir::Persist)]
pub enum Activity {
    /// A page view.
    View {
        /// Who.
        user: String,
        /// The page, as bytes.
        page: Box<[u8]>,
        /// Event time.
        at: u64,
    },
    /// A purchase of named items.
    Buy {
        /// Who.
        user: String,
        /// (item, quantity).
        items: Vec<(String, u32)>,
        /// Event time.
        at: u64,
    },
    /// A wrapper the job's flat_map unwraps (or drops when empty).
    Wrapped(Option<Box<Activity>>),
}

impl Activity {
    fn user(&self) -> &str {
        match self {
            Activity::View { user, .. } | Activity::Buy { user, .. } => user,
            Activity::Wrapped(_) => "",
        }
    }
    fn at(&self) -> u64 {
        match self {
            Activity::View { at, .. } | Activity::Buy { at, .. } => *at,
            Activity::Wrapped(inner) => inner.as_ref().map_or(0, |a| a.at()),
        }
    }
}

/// A running tally per user (the aggregate's accumulator).
#[derive(Clone, Debug, Default, weir::Persist)]
struct Tally {
    events: u64,
    items: Vec<String>,
}

/// The owned job's rows carry their branch in the key's top byte.
const AGGREGATE_ROWS: u64 = 1;
const WINDOW_ROWS: u64 = 2;
const JOIN_ROWS: u64 = 3;
const PAIR_ROWS: u64 = 4;
const BROADCAST_ROWS: u64 = 5;
const REDUCE_ROWS: u64 = 6;

fn tagged(tag: u64, key: &str) -> u64 {
    (tag << 56) | (weir::record::hash_key(&key.to_string()) >> 8)
}

fn activity(i: u64) -> Activity {
    let user = format!("user-{}", mix(i) % 9);
    let at = i + mix(i ^ 7) % 30;
    let base = if mix(i ^ 3).is_multiple_of(3) {
        Activity::Buy { user, items: (0..mix(i) % 3).map(|n| (format!("item-{n}"), n as u32 + 1)).collect(), at }
    } else {
        Activity::View { user, page: vec![i as u8; (mix(i) % 5) as usize].into_boxed_slice(), at }
    };
    match mix(i ^ 11) % 5 {
        0 => Activity::Wrapped(Some(Box::new(base))),
        1 => Activity::Wrapped(None),
        _ => base,
    }
}

/// Events per source of the owned job (it has six branches: fewer events keep a seed quick).
const OWNED_EVENTS: u64 = 200;

fn owned(job: &Job, parallelism: usize) -> weir::sink::CommittedOutput<Row> {
    let activities = job
        .generator(Generator::new(|i, _| activity(i)).count(OWNED_EVENTS))
        .named("activities")
        .flat_map(|a: Activity, out: &mut weir::operator::Emitter<'_, Activity>| match a {
            Activity::Wrapped(Some(inner)) => out.emit(*inner),
            Activity::Wrapped(None) => {}
            a => out.emit(a),
        })
        .filter(|a: &Activity| !matches!(a, Activity::View { page, .. } if page.is_empty()))
        .with_watermarks(Activity::at, 30);
    let tallies = activities
        .clone()
        .rebalance()
        .key_by_ref(Activity::user)
        .aggregate(
            Tally::default,
            |t: &mut Tally, a: Activity| {
                t.events += 1;
                if let Activity::Buy { items, .. } = a {
                    t.items.extend(items.into_iter().map(|(name, _)| name));
                }
            },
            // The count alone: the items seen so far depend on the order a key's records
            // arrive in from the rebalanced subtasks.
            |user: &String, t: &Tally| (tagged(AGGREGATE_ROWS, user), t.events, 0),
        )
        .named("tally");
    let windows = activities
        .clone()
        .key_by(|a: &Activity| a.user().to_string())
        .window(Window::sliding(100, 25), Activity::at)
        .aggregate(
            || 0u64,
            |c: &mut u64, _: Activity| *c += 1,
            |user: &String, w, c: &u64| (tagged(WINDOW_ROWS, user), w.start, *c),
        )
        .named("windows");
    let joined = owned_join(job, activities.clone());
    let reduced = activities
        .key_by(|a: &Activity| a.user().to_string())
        .reduce(|a: &Activity, b: &Activity| if b.at() > a.at() { b.clone() } else { a.clone() })
        .named("latest")
        .map(|a: Activity| (tagged(REDUCE_ROWS, a.user()), 0, 0));
    let pairs = owned_pairs(job, parallelism);
    let broadcast = job
        .generator(Generator::new(|i, _| format!("b{i}")).count(OWNED_EVENTS / 10))
        .named("announcements")
        .broadcast()
        .map(|s: String| (tagged(BROADCAST_ROWS, &s), s.len() as u64, 0));
    tallies.union(windows).union(joined).union(reduced).union(pairs).union(broadcast).collect_exactly_once()
}

/// The owned job's activities joined with the users' profiles, per user in tumbling windows.
fn owned_join(job: &Job, activities: weir::Stream<Activity>) -> weir::Stream<Row> {
    let profiles = job
        .generator(
            Generator::new(|i, _| (format!("user-{}", mix(i + 5) % 9), format!("tier-{}", i % 3), i))
                .count(OWNED_EVENTS / 4),
        )
        .named("profiles")
        .with_watermarks(|p: &(String, String, u64)| p.2, 0);
    activities
        .window_join(
            profiles,
            |a: &Activity| a.user().to_string(),
            |p: &(String, String, u64)| p.0.clone(),
            Activity::at,
            |p: &(String, String, u64)| p.2,
            Window::tumbling(50),
            |user: &String, a: &Activity, p: &(String, String, u64)| {
                (tagged(JOIN_ROWS, user), a.at(), p.2 + p.1.len() as u64)
            },
        )
        .named("join")
}

/// The owned job's pairs: each record with its key's previous one. Each key's records come
/// from one source subtask, so they reach the process function in one order in every run (as
/// in the keyed job).
fn owned_pairs(job: &Job, parallelism: usize) -> weir::Stream<Row> {
    job.generator(
        Generator::new(move |i, _| (format!("k{}", (i % parallelism as u64) * 16 + mix(i) % 5), vec![i]))
            .count(OWNED_EVENTS),
    )
    .named("keyed")
    .key_by(|e: &(String, Vec<u64>)| e.0.clone())
    .process(
        ListState::new,
        |k: &String, e: (String, Vec<u64>), last: &mut ListState<String, Vec<u64>>, out: &mut Vec<Row>| {
            if let [previous] = last.get(k) {
                out.push((tagged(PAIR_ROWS, k), previous[0], e.1[0]));
            }
            last.take(k);
            last.add(k.clone(), e.1);
        },
    )
    .named("pairs")
}

/// Writes word count's corpus (two files of a few hundred lines) into `dir`.
fn write_corpus(dir: &Path) -> Result<PathBuf> {
    let corpus = dir.join("corpus");
    std::fs::create_dir_all(&corpus).map_err(|e| Error::io("cannot create the corpus folder", &corpus, e))?;
    let words = ["river", "weir", "dam", "log", "Barrier", "snapshot", "über", "flow", "x9"];
    for f in 0..2u64 {
        let mut text = String::new();
        for line in 0..120u64 {
            for w in 0..(mix(line * 3 + f) % 6) {
                text.push_str(words[(mix(line * 31 + w + f * 1000) % words.len() as u64) as usize]);
                text.push(' ');
            }
            text.push('\n');
        }
        let path = corpus.join(format!("f{f}.txt"));
        std::fs::write(&path, text).map_err(|e| Error::io("cannot write the corpus", &path, e))?;
    }
    Ok(corpus)
}

/// The (key, count, 0) rows the model's topic holds as committed.
fn committed_counts(model: &weir_kafka::log::TransactionModel) -> Vec<Row> {
    let mut rows = Vec::new();
    let le = |b: Option<&[u8]>| b.and_then(|b| b.try_into().ok()).map(u64::from_le_bytes).unwrap_or(u64::MAX);
    for batch in model.committed("counts") {
        let walked = weir_kafka::records::batches(&batch, |item| {
            if let weir_kafka::records::Item::Record(_, r) = item {
                rows.push((le(r.key), le(r.value), 0));
            }
            Ok(true)
        });
        if walked.is_err() {
            // A batch the model holds that does not decode: a row no golden run has.
            rows.push((u64::MAX, u64::MAX, u64::MAX));
        }
    }
    rows
}
