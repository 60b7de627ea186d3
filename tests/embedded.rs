//! The host as a source and a sink: a job fed by `push_source` and read through `pull_sink`,
//! with owned records, survives failovers. With failures injected it hands the host exactly the
//! failure-free output in exactly-once mode, and everything at least once (with the same
//! sequence numbers, so the host can drop replays) in the other; after the process "crashes"
//! (the job fails for good) a new job on the same directory tells the host where to resend
//! from, and the two runs together give the failure-free output. Bad input: a host sending
//! after the job failed gets the job's error; a replay buffer of nothing is refused.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use weir::checkpoint::{CheckpointConfig, CheckpointMode, RestartStrategy};
use weir::faults::{Fault, FaultInjector};
use weir::sink::{Delivered, Guarantee, RecvError};
use weir::source::SendError;
use weir::{Job, RunConfig};

use crate::common;

const EVENTS: u64 = 4_000;
const WAIT: Duration = Duration::from_secs(120);

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, weir::Persist)]
enum Request {
    Visit { user: String, page: Vec<u8> },
    Leave(String),
}

fn request(i: u64) -> Request {
    let user = format!("user-{}", i % 13);
    if i % 5 == 4 {
        Request::Leave(user)
    } else {
        Request::Visit { user, page: vec![i as u8; (i % 7) as usize] }
    }
}

/// A running (visits, bytes) per user, emitted as (user, visits, bytes).
#[derive(Clone, Debug, Default, weir::Persist)]
struct Tally {
    visits: u64,
    bytes: u64,
}

type Reply = (String, u64, u64);

/// push source → keyed running tally over owned strings (operator "tally") → pull sink. One
/// subtask per operator, so the sink's input comes in one order and its numbers are stable.
fn build(
    dir: &Path,
    mode: CheckpointMode,
    guarantee: Guarantee,
    faults: Option<Arc<FaultInjector>>,
    restart: bool,
) -> (Job, weir::source::EventSender<Request>, weir::sink::EventReceiver<Reply>) {
    build_with(dir, mode, guarantee, faults, restart, 128, Shape::Keyed)
}

/// What the job between the host's two ends is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    /// The keyed running tally: source and sink in tasks of their own.
    Keyed,
    /// push source → map → pull sink chained into one task (the README's service): the
    /// source is polled only when the sink has room.
    Chained,
}

/// The chained shape's reply to one request.
fn reply(r: Request) -> Reply {
    match r {
        Request::Visit { user, page } => (user, 1, page.len() as u64),
        Request::Leave(user) => (user, 0, 0),
    }
}

/// [`build`] with the pull sink's queue capacity.
fn build_with(
    dir: &Path,
    mode: CheckpointMode,
    guarantee: Guarantee,
    faults: Option<Arc<FaultInjector>>,
    restart: bool,
    capacity: usize,
    shape: Shape,
) -> (Job, weir::source::EventSender<Request>, weir::sink::EventReceiver<Reply>) {
    let mut cfg = CheckpointConfig::new(dir).interval(Duration::from_millis(5)).mode(mode);
    if let Some(f) = faults {
        cfg = cfg.faults(f);
    }
    if !restart {
        cfg = cfg.restart(RestartStrategy::None);
    }
    let job = Job::new("embedded-host").with_checkpointing(cfg);
    let (tx, requests) = job.push_source::<Request>(256);
    if shape == Shape::Chained {
        return (job, tx, requests.map(reply).named("reply").pull_sink_with(capacity, guarantee));
    }
    let rx = requests
        .key_by(|r: &Request| match r {
            Request::Visit { user, .. } | Request::Leave(user) => user.clone(),
        })
        .aggregate(
            Tally::default,
            |t: &mut Tally, r: Request| {
                if let Request::Visit { page, .. } = r {
                    t.visits += 1;
                    t.bytes += page.len() as u64;
                }
            },
            |user: &String, t: &Tally| (user.clone(), t.visits, t.bytes),
        )
        .named("tally")
        .pull_sink_with(capacity, guarantee);
    (job, tx, rx)
}

/// Sends `events` (blocking on a full ring) while receiving, until the sink's stream ends or
/// the job fails; returns what was received and the job's result.
fn drive(
    job: Job,
    tx: weir::source::EventSender<Request>,
    rx: weir::sink::EventReceiver<Reply>,
    resume_at: Option<u64>,
) -> (Vec<Delivered<Reply>>, weir::Result<weir::JobReport>) {
    let handle = job.start(RunConfig::default().workers(2)).unwrap();
    let joiner = std::thread::spawn(move || handle.join());
    (exchange(tx, rx, resume_at), joiner.join().unwrap())
}

/// The host's side alone: sends from where the job says (checked against `resume_at`) while
/// receiving, until the sink's stream ends; returns what was received.
fn exchange(
    mut tx: weir::source::EventSender<Request>,
    mut rx: weir::sink::EventReceiver<Reply>,
    resume_at: Option<u64>,
) -> Vec<Delivered<Reply>> {
    let from = tx.resume_from(WAIT).expect("the job's resume point");
    if let Some(expected) = resume_at {
        assert_eq!(from, expected);
    }
    let sender = std::thread::spawn(move || {
        for i in from..EVENTS {
            match tx.send_timeout(request(i), WAIT) {
                Ok(()) => {}
                Err(SendError::Ended { .. }) => return,
                Err(e) => panic!("{e}"),
            }
        }
        tx.close();
    });
    let mut got = Vec::new();
    loop {
        match rx.recv_timeout(WAIT) {
            Ok(d) => got.push(d),
            Err(RecvError::Ended { .. }) => break,
            Err(e) => panic!("{e}"),
        }
    }
    sender.join().unwrap();
    got
}

fn failure_free() -> Vec<Delivered<Reply>> {
    let dir = tempfile::tempdir().unwrap();
    let (job, tx, rx) = build(dir.path(), CheckpointMode::Aligned, Guarantee::AtLeastOnce, None, true);
    let (got, result) = drive(job, tx, rx, Some(0));
    result.unwrap();
    assert_eq!(got.len() as u64, EVENTS);
    got
}

/// What a host keeps when it drops results it has seen by their numbers; a result seen twice
/// must carry the same number both times.
fn deduplicated(got: impl IntoIterator<Item = Delivered<Reply>>) -> Vec<Delivered<Reply>> {
    let mut by_seq = BTreeMap::new();
    for d in got {
        if let Some(earlier) = by_seq.insert(d.seq, d.record.clone()) {
            assert_eq!(earlier, d.record, "a replayed result carries its number");
        }
    }
    by_seq.into_iter().map(|(seq, record)| Delivered { seq, record }).collect()
}

fn faults() -> Arc<FaultInjector> {
    FaultInjector::new(vec![
        Fault::AtRecord { operator: "tally".into(), nth: EVENTS / 3 },
        Fault::AtRecord { operator: "tally".into(), nth: 2 * EVENTS / 3 },
    ])
}

#[test]
fn exactly_once_the_host_gets_the_failure_free_output_through_failovers() {
    let golden = failure_free();
    let dir = tempfile::tempdir().unwrap();
    let (job, tx, rx) = build(dir.path(), CheckpointMode::Aligned, Guarantee::ExactlyOnce, Some(faults()), true);
    let (got, result) = drive(job, tx, rx, Some(0));
    let report = result.unwrap();
    assert_eq!(report.restarts, 2, "both injected failures failed over");
    assert_eq!(got, golden, "each result once, with its number, after two failovers");
}

#[test]
fn at_least_once_the_host_gets_everything_and_drops_replays_by_number() {
    let golden = failure_free();
    let dir = tempfile::tempdir().unwrap();
    let (job, tx, rx) = build(dir.path(), CheckpointMode::AtLeastOnce, Guarantee::AtLeastOnce, Some(faults()), true);
    let (got, result) = drive(job, tx, rx, Some(0));
    assert_eq!(result.unwrap().restarts, 2);
    assert!(got.len() >= golden.len());
    assert_eq!(deduplicated(got), golden);
}

/// The first job fails for good halfway (no restarts: as if the process died); a new job on
/// the same directory restores its latest checkpoint and tells the host to resend from the
/// first event that checkpoint did not cover. Deduplicated by number, the two runs' output is
/// the failure-free one; and the host that kept sending to the failed job got its error.
/// The first process of a crash test: the job (exactly-once) fails for good half-way; returns
/// what the host received before.
fn run_until_the_crash(dir: &Path) -> Vec<Delivered<Reply>> {
    let crash = FaultInjector::new(vec![Fault::AtRecord { operator: "tally".into(), nth: EVENTS / 2 }]);
    let (job, tx, rx) = build(dir, CheckpointMode::Aligned, Guarantee::ExactlyOnce, Some(crash), false);
    let handle = job.start(RunConfig::default().workers(2)).unwrap();
    let joiner = std::thread::spawn(move || handle.join());
    let mut tx = tx;
    let mut rx = rx;
    let mut first = Vec::new();
    let mut ended = None;
    for i in 0..EVENTS {
        match tx.send_timeout(request(i), WAIT) {
            Ok(()) => {}
            Err(SendError::Ended { event, error }) => {
                assert_eq!(event, request(i), "the event comes back");
                ended = error;
                break;
            }
            Err(e) => panic!("{e}"),
        }
        while let Ok(d) = rx.try_recv() {
            first.push(d);
        }
    }
    let err = joiner.join().unwrap().unwrap_err().to_string();
    let error = ended.expect("the job failed before every event was sent");
    assert!(error.contains("tally") && error == err, "the host gets the job's error: {error}");
    loop {
        match rx.try_recv() {
            Ok(d) => first.push(d),
            Err(RecvError::Ended { error: Some(e) }) => {
                assert_eq!(e, err);
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    first
}

#[test]
fn after_a_crash_the_restored_job_says_where_the_host_resends_from() {
    let golden = failure_free();
    let dir = tempfile::tempdir().unwrap();
    let first = run_until_the_crash(dir.path());
    let (job, tx, rx) = build(dir.path(), CheckpointMode::Aligned, Guarantee::ExactlyOnce, None, true);
    let (second, result) = drive(job, tx, rx, None);
    result.unwrap();
    assert_eq!(deduplicated(first.into_iter().chain(second)), golden);
}

/// After a process restart the exactly-once host received results it already had (2,621
/// instead of 2,056 in a try): the restored checkpoint's transactions are released again. A
/// host that tells the new receiver the last number it handled gets each result once.
#[test]
fn after_a_crash_a_host_that_says_what_it_handled_gets_each_result_once() {
    let golden = failure_free();
    let dir = tempfile::tempdir().unwrap();
    let first = run_until_the_crash(dir.path());
    let last = first.last().map(|d| d.seq);
    let (job, tx, mut rx) = build(dir.path(), CheckpointMode::Aligned, Guarantee::ExactlyOnce, None, true);
    if let Some(last) = last {
        rx.resume_after(last);
    }
    let (second, result) = drive(job, tx, rx, None);
    result.unwrap();
    let all: Vec<Delivered<Reply>> = first.into_iter().chain(second).collect();
    assert_eq!(all, golden, "each result exactly once across the restart, in order");
}

#[test]
fn a_replay_buffer_of_nothing_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let job = Job::new("no-replay").with_checkpointing(CheckpointConfig::new(dir.path()));
    let (_tx, events) = job.push_source_with::<u64>(16, 0);
    events.discard();
    let err = match job.start(RunConfig::default()) {
        Err(e) => e,
        Ok(handle) => handle.join().unwrap_err(),
    }
    .to_string();
    assert!(err.contains("replay buffer of 0 events"), "{err}");
}

/// `EventReceiver::recv` is a future that needs no particular runtime: awaited on tokio here,
/// with the job's handle joined on a blocking thread.
#[test]
fn results_are_awaited_from_an_async_task() {
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    runtime.block_on(async {
        let job = Job::new("async-host");
        let (mut tx, events) = job.push_source::<String>(64);
        let mut rx = events.map(|s: String| s.to_uppercase()).pull_sink(64);
        let handle = job.start(RunConfig::default().workers(2)).unwrap();
        let joined = std::thread::spawn(move || handle.join());
        let sender = std::thread::spawn(move || {
            for word in ["river", "weir", "dam"] {
                tx.send_timeout(word.to_string(), WAIT).unwrap();
            }
        });
        let mut got = Vec::new();
        loop {
            match rx.recv().await {
                Ok(d) => got.push((d.seq, d.record)),
                Err(RecvError::Ended { error: None }) => break,
                Err(e) => panic!("{e}"),
            }
        }
        sender.join().unwrap();
        joined.join().unwrap().unwrap();
        assert_eq!(got, vec![(0, "RIVER".to_string()), (1, "WEIR".into()), (2, "DAM".into())]);
    });
}

/// With no thread in `join` or `wait`, a failure left the embedded job dead (`restarts=0`)
/// while the host's `send_timeout` kept returning `Timeout` and `recv_timeout` timed out for
/// ever. Failover is the runtime's own: the host only sends and receives, and gets the
/// failure-free output through two failovers.
#[test]
fn the_job_fails_over_with_nobody_waiting_on_its_handle() {
    let golden = failure_free();
    let dir = tempfile::tempdir().unwrap();
    let (job, tx, rx) = build(dir.path(), CheckpointMode::Aligned, Guarantee::ExactlyOnce, Some(faults()), true);
    let handle = job.start(RunConfig::default().workers(2)).unwrap();
    let got = exchange(tx, rx, Some(0));
    assert_eq!(handle.restarts(), 2, "both injected failures failed over before anyone waited");
    assert_eq!(got, golden);
    assert_eq!(handle.join().unwrap().restarts, 2);
}

/// A job that fails for good, with nobody waiting on its handle, ends its endpoints with its
/// error: the host's receive and send say `Ended` with it, and do not time out.
#[test]
fn a_job_that_fails_for_good_ends_its_endpoints_with_nobody_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let once = FaultInjector::new(vec![Fault::AtRecord { operator: "tally".into(), nth: EVENTS / 2 }]);
    let (job, mut tx, mut rx) = build(dir.path(), CheckpointMode::Aligned, Guarantee::AtLeastOnce, Some(once), false);
    let handle = job.start(RunConfig::default().workers(2)).unwrap();
    let sender = std::thread::spawn(move || {
        for i in 0.. {
            match tx.send_timeout(request(i), WAIT) {
                Ok(()) => {}
                Err(SendError::Ended { error, .. }) => return error,
                Err(e) => panic!("sent {i}: {e}"),
            }
        }
        unreachable!()
    });
    let error = loop {
        match rx.recv_timeout(WAIT) {
            Ok(_) => {}
            Err(RecvError::Ended { error }) => break error,
            Err(e) => panic!("{e}"),
        }
    };
    let error = error.expect("the job failed");
    assert!(error.contains("injected"), "{error}");
    let sent = sender.join().unwrap().expect("the job failed");
    assert!(sent.contains("injected"), "{sent}");
    assert!(handle.is_finished());
    assert!(handle.join().is_err());
}

/// The push source's `send` (and `close_async`) are futures too: an async host sends and
/// receives on one thread, through rings of 4, blocking no thread and with nobody in `join`.
#[test]
fn an_async_host_sends_and_receives_on_one_thread() {
    const N: u64 = 2_000;
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    runtime.block_on(async {
        let job = Job::new("async-sender");
        let (mut tx, events) = job.push_source::<u64>(4);
        let mut rx = events.map(|x: u64| x * 2).pull_sink(4);
        let handle = job.start(RunConfig::default().workers(2)).unwrap();
        let send_all = async move {
            for i in 0..N {
                tx.send(i).await.unwrap();
            }
            // Not `close`, which waits for room blocking the thread the receiving task needs.
            tx.close_async().await;
        };
        let receive_all = async {
            let mut got = Vec::new();
            loop {
                match rx.recv().await {
                    Ok(d) => got.push(d.record),
                    Err(RecvError::Ended { error: None }) => break got,
                    Err(e) => panic!("{e}"),
                }
            }
        };
        let ((), got) = tokio::join!(send_all, receive_all);
        assert_eq!(got, (0..N).map(|i| i * 2).collect::<Vec<_>>());
        handle.join().unwrap();
    });
}

/// How the slow host of the SIGKILL tests stops: it blocks (to be killed) at a point of its work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HostStop {
    /// It runs to the end.
    Never,
    /// The job finished while the host drained its results: after 20 results it waits for the
    /// job's end, handles 5 more, then blocks.
    WhileDraining,
    /// Mid-run (the host's sends keep the job open): it blocks while "handling" result 20,
    /// saying which checkpoint was the newest then.
    WhileHandling,
    /// Mid-run, a host that batches its writes: from result 20 on it receives without handling
    /// or acknowledging, and once it received every result it blocks, saying which checkpoint
    /// was the newest then: the checkpoints after hold thousands of unacknowledged results.
    WhileBatching,
}

impl HostStop {
    fn parse(s: &str) -> HostStop {
        match s {
            "never" => HostStop::Never,
            "draining" => HostStop::WhileDraining,
            "handling" => HostStop::WhileHandling,
            "batching" => HostStop::WhileBatching,
            other => panic!("unknown stop {other}"),
        }
    }
    fn name(self) -> &'static str {
        match self {
            HostStop::Never => "never",
            HostStop::WhileDraining => "draining",
            HostStop::WhileHandling => "handling",
            HostStop::WhileBatching => "batching",
        }
    }
}

/// The newest completed checkpoint in `chk` (0: none).
fn newest_checkpoint(chk: &Path) -> u64 {
    std::fs::read_dir(chk)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("_metadata").exists())
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("chk-")?.parse().ok())
        .max()
        .unwrap_or(0)
}

/// The slow host as a service would be: its "database" is `log` (a line per result handled,
/// written before it is acknowledged), it tells the receiver the last number in it and resends
/// from where the restored job says. Exits the process with 3 if the job fails or is refused.
fn slow_host(root: &Path, acks: bool, stop: HostStop, capacity: usize, shape: Shape) {
    let chk = root.join("chk");
    let log = root.join("log");
    let handled: Vec<Delivered<Reply>> = std::fs::read_to_string(&log).map(|t| parse_log(&t)).unwrap_or_default();
    let (job, mut tx, rx) =
        build_with(&chk, CheckpointMode::Aligned, Guarantee::ExactlyOnce, None, true, capacity, shape);
    let mut rx = if acks { rx.with_acks() } else { rx };
    if let Some(last) = handled.last() {
        rx.resume_after(last.seq);
    }
    let handle = match job.start(RunConfig::default().workers(2)) {
        Ok(h) => h,
        Err(e) => {
            println!("refused: {e}");
            std::process::exit(3);
        }
    };
    let joined = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let joiner = {
        let joined = Arc::clone(&joined);
        std::thread::spawn(move || {
            let r = handle.join();
            if let Err(e) = &r {
                println!("failed: {e}");
                std::process::exit(3);
            }
            joined.store(true, std::sync::atomic::Ordering::SeqCst);
        })
    };
    // Asked before receiving anything, as the README shows: the restore knows it, whatever
    // the sink holds for the host.
    let from = tx.resume_from(WAIT).expect("the restored job's resume point");
    let hold_open = matches!(stop, HostStop::WhileHandling | HostStop::WhileBatching);
    let sender = std::thread::spawn(move || {
        for i in from..EVENTS {
            tx.send_timeout(request(i), WAIT).unwrap();
        }
        if hold_open {
            std::thread::park();
        }
        tx.close();
    });
    let mut out = std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap();
    let mut count = 0;
    loop {
        let d = match rx.recv_timeout(WAIT) {
            Ok(d) => d,
            Err(RecvError::Ended { error: None }) => break,
            Err(e) => panic!("{e}"),
        };
        count += 1;
        match stop {
            HostStop::WhileDraining if count == 20 => {
                common::wait_until("the job's end", || joined.load(std::sync::atomic::Ordering::SeqCst))
            }
            HostStop::WhileDraining if count == 25 => block(&format!("blocked draining at {}", d.seq)),
            HostStop::WhileHandling if count == 20 => {
                block(&format!("blocked handling {} after checkpoint {} ", d.seq, newest_checkpoint(&chk)))
            }
            HostStop::WhileBatching if count == EVENTS => {
                block(&format!("blocked batching {} after checkpoint {} ", d.seq, newest_checkpoint(&chk)))
            }
            HostStop::WhileBatching if count >= 20 => continue,
            _ => {}
        }
        std::io::Write::write_all(
            &mut out,
            format!("{} {} {} {}\n", d.seq, d.record.0, d.record.1, d.record.2).as_bytes(),
        )
        .unwrap();
        if acks {
            rx.ack(d.seq).unwrap();
        }
    }
    // Done with the results: a host lets its receiver go before it waits for the job, and
    // exits the moment the job is over (the completion marker must be there by then).
    drop(rx);
    sender.join().unwrap();
    joiner.join().unwrap();
    println!("done");
}

/// Says `what` and waits to be killed.
fn block(what: &str) -> ! {
    println!("{what}");
    loop {
        std::thread::park();
    }
}

fn parse_log(text: &str) -> Vec<Delivered<Reply>> {
    text.lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            Delivered {
                seq: f[0].parse().unwrap(),
                record: (f[1].to_string(), f[2].parse().unwrap(), f[3].parse().unwrap()),
            }
        })
        .collect()
}

/// The slow host's process: the SIGKILL tests run this test binary again with `WEIR_SLOW_HOST`
/// set (`<root> <acks> <stop>`) to be the host. Run by itself it is the host of one uneventful
/// run, which must hand it the failure-free output.
#[test]
fn slow_host_process() {
    if let Ok(spec) = std::env::var("WEIR_SLOW_HOST") {
        let f: Vec<&str> = spec.split(' ').collect();
        let shape = if f[4] == "chained" { Shape::Chained } else { Shape::Keyed };
        slow_host(Path::new(f[0]), f[1] == "acks", HostStop::parse(f[2]), f[3].parse().unwrap(), shape);
        return;
    }
    let root = tempfile::tempdir().unwrap();
    slow_host(root.path(), true, HostStop::Never, 2 * EVENTS as usize, Shape::Keyed);
    let got = parse_log(&std::fs::read_to_string(root.path().join("log")).unwrap());
    assert_eq!(got, failure_free());
}

/// Runs the slow host as a process of its own.
fn slow_host_command(root: &Path, acks: bool, stop: HostStop, sink: (usize, Shape)) -> std::process::Command {
    let mut c = std::process::Command::new(std::env::current_exe().unwrap());
    let (capacity, shape) = sink;
    let shape = if shape == Shape::Chained { "chained" } else { "keyed" };
    c.args(["embedded::slow_host_process", "--exact", "--nocapture", "--test-threads", "1"]).env(
        "WEIR_SLOW_HOST",
        format!("{} {} {} {capacity} {shape}", root.display(), if acks { "acks" } else { "received" }, stop.name()),
    );
    c
}

/// Kills the host where `stop` says, runs it again to the end, and checks that its log holds
/// the failure-free output, each result once, and that the rerun, exiting the moment its job
/// was over, left the job's completion marker. `sink`: the pull sink's capacity and the job.
fn killed_host_gets_everything(acks: bool, stop: HostStop, sink: (usize, Shape)) {
    let golden = match sink.1 {
        Shape::Keyed => failure_free(),
        Shape::Chained => (0..EVENTS).map(|i| Delivered { seq: i, record: reply(request(i)) }).collect(),
    };
    let root = tempfile::tempdir().unwrap();
    let mut first = common::Running::start(slow_host_command(root.path(), acks, stop, sink));
    first.wait_to_say("blocked", 1);
    if matches!(stop, HostStop::WhileHandling | HostStop::WhileBatching) {
        // Killed once a checkpoint triggered after the host took the result has completed.
        let seen: u64 = first.word_after("after checkpoint").unwrap().parse().unwrap();
        common::wait_until("a checkpoint after the host took its result", || {
            newest_checkpoint(&root.path().join("chk")) >= seen + 2
        });
    }
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let mut second = common::Running::start(slow_host_command(root.path(), acks, HostStop::Never, sink));
    let status = second.child.wait().unwrap();
    assert!(status.success(), "the rerun: {status}: {}", second.text.lock().unwrap());
    let got = parse_log(&std::fs::read_to_string(root.path().join("log")).unwrap());
    assert_eq!(got.len(), golden.len(), "each result once ({} handled of {})", got.len(), golden.len());
    assert_eq!(got, golden);
    assert!(
        root.path().join("chk/_finished").exists(),
        "the host had every result and the job was over when it exited: the job is marked finished"
    );
    drop(second);
}

/// A host killed while it drains a finished job's last results (a database write each) ran the
/// job again and was refused ("already completed: `_finished` exists"): 117 of 128 results were
/// never delivered. The job is finished for the host when the host has its output.
#[test]
fn a_host_killed_while_it_drains_the_finished_job_gets_the_rest_from_a_rerun() {
    killed_host_gets_everything(false, HostStop::WhileDraining, (2 * EVENTS as usize, Shape::Keyed));
}

/// A host killed while it handled a result lost it: the checkpoint after `recv` forgot it
/// (7,679 of 7,680). With acknowledgements, a result is forgotten once the host acknowledges it.
#[test]
fn a_host_killed_while_it_handles_a_result_gets_it_again_when_it_acknowledges() {
    killed_host_gets_everything(true, HostStop::WhileHandling, (2 * EVENTS as usize, Shape::Keyed));
}

/// A restarted host asked where to resume before it received (the README's order), and the
/// restored sink held more unacknowledged results than its queue: the job never polled its
/// source, `resume_from` answered nothing until its timeout, and a host that took the timeout
/// for "all sent" lost results (130,215 of 300,000). The resume point is told at the restore.
#[test]
fn a_restarted_host_learns_where_to_resume_before_it_drains_a_full_sink() {
    killed_host_gets_everything(true, HostStop::WhileBatching, (64, Shape::Chained));
}

/// Acknowledgements the host cannot mean are refused and change nothing.
#[test]
fn a_wrong_acknowledgement_is_refused_naming_it() {
    let job = Job::new("acks");
    let (mut tx, events) = job.push_source::<u64>(16);
    let mut plain = job.push_source::<u64>(16).1.pull_sink(16);
    assert_eq!(plain.ack(0).unwrap_err(), weir::sink::AckError::NotAcknowledging);
    let mut rx = events.pull_sink(16).with_acks();
    let err = rx.ack(0).unwrap_err();
    assert_eq!(err.to_string(), "cannot acknowledge result 0: no result was received yet");
    let handle = job.start(RunConfig::default()).unwrap();
    for i in 0..3 {
        tx.send_timeout(i, WAIT).unwrap();
    }
    tx.close();
    let got: Vec<u64> = (0..3).map(|_| rx.recv_timeout(WAIT).unwrap().seq).collect();
    assert_eq!(got, [0, 1, 2]);
    assert_eq!(rx.ack(3).unwrap_err().to_string(), "cannot acknowledge result 3: the last result received is 2");
    rx.ack(1).unwrap();
    assert_eq!(rx.ack(0).unwrap_err().to_string(), "result 0 was acknowledged already (every result up to 1 is)");
    rx.ack(2).unwrap();
    handle.join().unwrap();
    drop(plain);
}

/// An exactly-once pull sink in a job without checkpoints said `Ended` before it handed over
/// anything (its results came only after `join`), and a host that stops at `Ended`, as the
/// README says, lost them all. `Ended` comes after the last result, with or without
/// checkpoints, and without anybody in `join`.
#[test]
fn an_exactly_once_sink_ends_after_its_results_without_checkpoints() {
    for checkpoints in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let job = Job::new("ends-after-results");
        let job = if checkpoints { job.with_checkpointing(CheckpointConfig::new(dir.path())) } else { job };
        let mut rx =
            job.generator(weir::source::Generator::new(|i, _| i).count(10)).pull_sink_with(64, Guarantee::ExactlyOnce);
        let handle = job.start(RunConfig::default().workers(2)).unwrap();
        let mut got = Vec::new();
        loop {
            match rx.recv_timeout(WAIT) {
                Ok(d) => got.push(d.record),
                Err(RecvError::Ended { error: None }) => break,
                Err(e) => panic!("{e}"),
            }
        }
        got.sort_unstable();
        assert_eq!(got, (0..10).collect::<Vec<u64>>(), "checkpoints: {checkpoints}");
        handle.join().unwrap();
    }
}

/// `resume_point()`'s future borrowed the sender, whose ring end is not `Sync`, so it could not
/// be awaited inside `tokio::spawn` (a compile error). It is `Send` and borrows nothing now.
#[test]
fn the_resume_point_is_awaited_in_a_spawned_task() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).build().unwrap();
    let job = Job::new("spawned-host");
    let (tx, events) = job.push_source::<u64>(16);
    let mut rx = events.pull_sink(16);
    let handle = job.start(RunConfig::default().workers(1)).unwrap();
    let from = runtime.block_on(async move {
        tokio::spawn(async move {
            let mut tx = tx;
            let from = tx.resume_point().await.unwrap();
            tx.send(from + 41).await.unwrap();
            tx.close();
            from
        })
        .await
        .unwrap()
    });
    assert_eq!(from, 0);
    assert_eq!(rx.recv_timeout(WAIT).unwrap().record, 41);
    handle.join().unwrap();
}

/// Defaults that surprised a host: snapshot writes ran on rayon's global pool (the program's:
/// with its threads busy, no checkpoint completed), and `RunConfig::default()` pinned a worker
/// to every core beside the program's own threads. A checkpoint completes with the global pool
/// held, and the default leaves workers where the operating system puts them.
#[test]
fn a_checkpoint_completes_with_the_programs_rayon_pool_busy_and_workers_unpinned() {
    // The global pool, one thread, held for the whole test binary's life from here: no other
    // test of this binary uses it.
    let _ = rayon::ThreadPoolBuilder::new().num_threads(1).build_global();
    let (hold, held) = std::sync::mpsc::channel::<()>();
    let (started, busy) = std::sync::mpsc::channel();
    rayon::spawn(move || {
        started.send(()).unwrap();
        let _ = held.recv();
    });
    busy.recv().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let job =
        Job::new("host-pool").with_checkpointing(CheckpointConfig::new(dir.path()).interval(Duration::from_secs(3600)));
    job.generator(weir::source::Generator::new(|i, _| (i % 5, 1u64)).count(u64::MAX))
        .key_by(|&(k, _)| k)
        .reduce(|a, b| (a.0, a.1 + b.1))
        .named("pool-sum")
        .discard();
    let handle = job.start(RunConfig::default().workers(2)).unwrap();
    let id = handle.trigger_checkpoint().expect("a checkpoint completes while the program's pool is busy");
    assert!(id >= 1);
    let allowed: Vec<String> = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| {
            let t = t.ok()?.path();
            let name = std::fs::read_to_string(t.join("comm")).ok()?;
            name.starts_with("weir-host-pool-").then_some(())?;
            let status = std::fs::read_to_string(t.join("status")).ok()?;
            status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).map(|c| c.trim().to_string())
        })
        .collect();
    let ours = std::fs::read_to_string("/proc/self/status").unwrap();
    let ours = ours.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap().trim().to_string();
    assert!(!allowed.is_empty() && allowed.iter().all(|a| *a == ours), "workers pinned: {allowed:?} of {ours}");
    handle.cancel();
    assert!(handle.join().is_err());
    drop(hold);
}
