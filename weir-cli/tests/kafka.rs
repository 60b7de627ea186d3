//! `weir wordcount` with Kafka input and output against a real Kafka-protocol broker (Tansu;
//! `weir_testkit::kafka`): killed and resumed, processes sharing a topic by partitions or
//! through a consumer group, two jobs into one topic, a crash between pre-commit and commit, a
//! broker outage, recovery past a damaged checkpoint; every count committed once. The
//! connector's own tests are weir-kafka's.

use std::collections::HashMap;

use std::process::Command;
use weir_testkit::kafka::*;

use crate::common::Running;
use weir_kafka::records::BatchWriter;
use weir_kafka::{read_topic, KafkaClient};

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

/// `weir wordcount` from a topic to a topic, exactly once, SIGKILLed as each of its first
/// four runs completes a checkpoint and run again until it completes: every word's counts
/// 1, 2, …, n are committed exactly once, and nothing stays open.
#[test]
fn a_killed_kafka_word_count_resumes_and_commits_every_count_once() {
    if !weir_testkit::kafka::available("a_killed_kafka_word_count_resumes_and_commits_every_count_once") {
        return;
    }
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
    if !weir_testkit::kafka::available("the_command_names_bad_kafka_addresses") {
        return;
    }
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
    // TLS, SASL and compression: what each needs, named; a password never on the command line.
    let missing_ca = out.path().join("missing.pem").display().to_string();
    let cases: [(&str, Vec<&str>, &str); 6] = [
        (file.to_str().unwrap(), vec!["--kafka-tls"], "need a Kafka input or output"),
        (&from, vec!["--kafka-compression", "zstd"], "--kafka-compression needs a Kafka output"),
        (&from, vec!["--kafka-compression", "brotli"], "[possible values: none, gzip, snappy, lz4, zstd]"),
        (&from, vec!["--kafka-sasl-mechanism", "SCRAM-SHA-256"], "--kafka-sasl-mechanism needs --kafka-sasl-username"),
        (
            &from,
            vec!["--kafka-sasl-mechanism", "SCRAM-SHA-256", "--kafka-sasl-username", "u"],
            "WEIR_KAFKA_SASL_PASSWORD",
        ),
        (&from, vec!["--kafka-ca-file", &missing_ca], "missing.pem: cannot read it"),
    ];
    for (from, flags, says) in cases {
        let text = run_with(from, &out_dir, &flags);
        assert!(text.contains(says), "{flags:?}: {text}");
    }
    let text = run_with(&from, &out_dir, &["--kafka-sasl-mechanism", "GSSAPI", "--kafka-sasl-username", "u"]);
    assert!(text.contains("possible values: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"), "{text}");
    // `kafkas://` was read as a file path named after it.
    let text = run(&format!("kafkas://{}/{input}", broker()), &out_dir);
    assert!(text.contains("is an address weir does not take") && text.contains("--kafka-tls"), "{text}");
    // A password file that is a FIFO blocked the command for good (and /dev/zero was read until
    // memory ran out): refused at once, as the configuration file is.
    let fifo = out.path().join("password.fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["wordcount", "--no-progress", "--input", &from, "--output", &out_dir])
        .args(["--kafka-sasl-mechanism", "PLAIN", "--kafka-sasl-username", "u", "--kafka-sasl-password-file"])
        .arg(&fifo)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    crate::common::wait_until("the command to refuse the FIFO", || child.try_wait().unwrap().is_some());
    let o = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && text.contains("not a plain file"), "{text}");
}

/// `weir wordcount` from a topic to a topic through a TLS-terminating proxy
/// (`--kafka-ca-file`), the output compressed (`--kafka-compression zstd`), exactly once:
/// every count committed once, read back over TLS; and the batches written are zstd's.
#[test]
fn a_word_count_over_tls_writes_compressed_batches() {
    if !weir_testkit::kafka::tls_available("a_word_count_over_tls_writes_compressed_batches") {
        return;
    }
    let broker = secured_broker(true, false);
    let security = weir_kafka::Security::plaintext().tls(weir_kafka::Tls::ca_file(&broker.ca_file).unwrap());
    let mut client = KafkaClient::connect_with(&broker.addr, &security).unwrap();
    let (input, output) = ("tls-lines", "tls-counts");
    client.create_topic(input, 2).unwrap();
    client.create_topic(output, 2).unwrap();
    let lines: Vec<String> = (0..500).map(|i| format!("w{} x{}", i % 37, i % 5)).collect();
    let mut batch = BatchWriter::default();
    for l in &lines {
        batch.push(0, None, l.as_bytes());
    }
    client.produce(None, input, 0, batch.finish(None, false)).unwrap();
    let chk = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["wordcount", "--no-progress", "--input", &format!("kafka://{}/{input}", broker.addr)])
        .args(["--output", &format!("kafka://{}/{output}", broker.addr)])
        .args(["--checkpoint-dir", chk.path().join("c").to_str().unwrap()])
        .args(["--kafka-ca-file", broker.ca_file.to_str().unwrap(), "--kafka-compression", "zstd"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let contents = weir_kafka::read_topic_with(&broker.addr, &security, output).unwrap();
    assert_eq!(contents.open, 0);
    let mut got: HashMap<String, Vec<u64>> = HashMap::new();
    for m in &contents.committed {
        let text = String::from_utf8(m.value.clone().unwrap()).unwrap();
        let (w, c) = text.split_once('\t').unwrap();
        got.entry(w.to_string()).or_default().push(c.parse().unwrap());
    }
    for counts in got.values_mut() {
        counts.sort_unstable();
    }
    assert_eq!(got, running_counts(&lines));
    // Written compressed: the data batches' attributes name zstd (codec 4; markers are not
    // compressed). A batch: base offset (8 bytes), length (4), …, attributes at 21.
    let fetched = client.fetch(output, &[(0, 0), (1, 0)], 1, 1 << 20, false).unwrap();
    let mut codecs = Vec::new();
    for f in &fetched {
        let mut rest = &f.records[..];
        while rest.len() >= 23 {
            let len = 12 + i32::from_be_bytes(rest[8..12].try_into().unwrap()) as usize;
            let attributes = i16::from_be_bytes([rest[21], rest[22]]);
            if attributes & 0x20 == 0 {
                codecs.push(attributes & 0x7);
            }
            rest = &rest[len.min(rest.len())..];
        }
    }
    assert!(!codecs.is_empty() && codecs.iter().all(|&c| c == 4), "{codecs:?}");
}

/// Two `weir` processes share a four-partition topic (partitions 0,1 and 2,3), each with its
/// own checkpoint prefix in S3, writing one output topic; one is killed twice and resumes. Each
/// counts the words of its own partitions (no shuffle between processes), exactly once, and
/// neither fences the other's transactions.
#[test]
fn two_processes_share_a_topic_by_partitions() {
    if !weir_testkit::kafka::available("two_processes_share_a_topic_by_partitions") {
        return;
    }
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

/// Two word counts of different files into one topic, each with a checkpoint directory of its
/// own, one of them killed twice (issue 45, item 5). Every file input got the transactional-id
/// prefix `…-from-files`, so each start of one registered the other's ids and aborted its
/// pre-committed transactions: counts were lost and the job failed on every restart. Now the
/// ids are named by each directory's identity: both come out exact.
#[test]
fn two_word_counts_of_files_into_one_topic_keep_their_own_transactions() {
    if !weir_testkit::kafka::available("two_word_counts_of_files_into_one_topic_keep_their_own_transactions") {
        return;
    }
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
    if !weir_testkit::kafka::available("recovery_past_a_damaged_checkpoint_refuses_to_write_kafka_output_twice") {
        return;
    }
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

/// A crash between checkpoint 3's pre-commit and its commit (the process exits as the
/// checkpoint completes, before any sink commits): its transactions are left open, and the
/// rerun, a new process, must commit them with the producer identities checkpoint 3
/// recorded, or their counts are lost (with the restored list dropped, 39,288 messages stayed
/// open); every count is committed once.
#[test]
fn a_crash_between_pre_commit_and_commit_loses_no_kafka_output() {
    if !weir_testkit::kafka::available("a_crash_between_pre_commit_and_commit_loses_no_kafka_output") {
        return;
    }
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

/// The broker goes away under a running Kafka → Kafka word count, as its first checkpoint
/// completes: every connection cut, new ones refused, until the job has tried to reconnect a
/// few times; then it is back. The source and the sink retry, the job fails over (and, if
/// its restarts run out first, the command is run again, as a user would): every count is
/// committed exactly once.
#[test]
fn a_broker_outage_under_a_running_job_loses_and_duplicates_nothing() {
    if !weir_testkit::kafka::available("a_broker_outage_under_a_running_job_loses_and_duplicates_nothing") {
        return;
    }
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

/// Two `weir wordcount --group` processes share a topic's four partitions through a consumer
/// group: the first alone reads all four, taking no checkpoint (a minute apart); the second
/// joining makes the first stop with a savepoint and hand two over, which the second starts
/// exactly where the savepoint left them (the group's offsets, committed at the hand-over:
/// nothing else told the group); the first, SIGKILLed and started again from its checkpoint
/// directory, gets its two back. Every line's words are committed exactly once, and after both
/// leave (SIGTERM), the group's committed offsets are the topic's ends.
#[test]
fn processes_in_a_consumer_group_hand_partitions_over_exactly_once() {
    if !weir_testkit::kafka::available("processes_in_a_consumer_group_hand_partitions_over_exactly_once") {
        return;
    }
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
