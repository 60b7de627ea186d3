//! The Kafka connector against a real Kafka-protocol broker (Tansu; `weir_testkit::kafka`):
//! the source reads what was produced, once, at any parallelism, read-committed by the
//! markers in the log; the exactly-once sink's output under failovers is what a failure-free
//! run writes, read as the protocol defines committed output; a fenced sink commits nothing
//! more; an idle partition does not hold the watermark back; consumer-group members share the
//! partitions by name; bad addresses and missing topics are clear errors.

use std::collections::HashMap;

use std::sync::{Arc, Mutex};
use std::time::Duration;
use weir_testkit::kafka::*;

use weir::checkpoint::{CheckpointConfig, RestartStrategy};
use weir::sink::CollectSink;
use weir::snapshot::{Fault, FaultInjector};
use weir::source::Generator;
use weir::{Job, RunConfig};
use weir_kafka::records::BatchWriter;
use weir_kafka::{read_topic, Delivery, KafkaClient, KafkaRecord, KafkaSink, KafkaSource};

#[test]
fn the_source_reads_every_message_once_at_any_parallelism() {
    if !weir_testkit::kafka::available("the_source_reads_every_message_once_at_any_parallelism") {
        return;
    }
    let t = topic("source", 3);
    let expected: Vec<String> = (0..5_000).map(|i| format!("m{i}")).collect();
    produce(&t, expected.clone());
    for p in [1, 2, 4] {
        let got = Arc::new(Mutex::new(Vec::new()));
        let job = Job::new("read").with_parallelism(p);
        let into = Arc::clone(&got);
        job.source(KafkaSource::new(broker(), &t, value_text).subtasks())
            .sink(move |_| Ok(CollectSink::new(Arc::clone(&into))));
        job.execute(RunConfig::default().workers(2)).unwrap();
        let mut got = got.lock().unwrap().clone();
        got.sort();
        let mut want = expected.clone();
        want.sort();
        assert_eq!(got, want, "parallelism {p}");
    }
}

/// Numbers through `copy` into a topic, exactly once, under failovers before and after
/// checkpoints: the committed messages are each number once; what the failed attempts wrote
/// after their last checkpoint was aborted; nothing stays open.
#[test]
fn the_exactly_once_sink_commits_each_record_once_across_failovers() {
    if !weir_testkit::kafka::available("the_exactly_once_sink_commits_each_record_once_across_failovers") {
        return;
    }
    const N: u64 = 20_000;
    let t = topic("eos", 3);
    let chk = tempfile::tempdir().unwrap();
    let faults = FaultInjector::new(vec![
        Fault::AtRecord { operator: "copy".into(), nth: N / 3 },
        Fault::AtRecord { operator: "copy".into(), nth: 2 * N / 3 },
        Fault::RightAfterRestore { restart: 1 },
    ]);
    let job = Job::new("eos").with_parallelism(2).with_checkpointing(checkpointed(chk.path(), Arc::clone(&faults)));
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
    if !weir_testkit::kafka::available("bad_addresses_and_missing_topics_are_named") {
        return;
    }
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

/// A topic holding plain records, an aborted transaction, a committed one, and an aborted one
/// with plain records written while it was open (issue 45, item 7). After the abort Tansu 0.6
/// reports a last stable offset below the high watermark for good and lists no aborted
/// transaction: the source stopped at that offset and handed on the aborted records. Now the
/// source reads the markers in the log itself: it reads every committed or plain record once,
/// in log order (the plain ones written during the open transaction behind it), and none of
/// an aborted transaction.
#[test]
fn the_source_reads_committed_by_the_markers_in_the_log() {
    if !weir_testkit::kafka::available("the_source_reads_committed_by_the_markers_in_the_log") {
        return;
    }
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
    let into = Arc::clone(&got);
    job.source(KafkaSource::new(broker(), &t, value_text).subtasks())
        .sink(move |_| Ok(CollectSink::new(Arc::clone(&into))));
    job.execute(RunConfig::default().workers(1)).unwrap();
    assert_eq!(*got.lock().unwrap(), expected, "the committed and plain records once, in log order");
}

/// A second producer registers the transactional ids a running job writes with (another
/// process given the same prefix, say): the job's next write or commit is refused by the
/// broker, the job stops with an error that says another producer took over (no restart),
/// and nothing it wrote after that is committed.
#[test]
fn a_sink_fenced_by_a_newer_producer_stops_and_commits_nothing_more() {
    if !weir_testkit::kafka::available("a_sink_fenced_by_a_newer_producer_stops_and_commits_nothing_more") {
        return;
    }
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
    if !weir_testkit::kafka::available("an_idle_partition_stops_holding_the_watermark_back") {
        return;
    }
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
    let into = Arc::clone(&got);
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
    .sink(move |_| Ok(CollectSink::new(Arc::clone(&into))));
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
    if !weir_testkit::kafka::available("the_sink_protocol_is_exactly_once_over_the_transaction_model") {
        return;
    }
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
        let job =
            Job::new("model").with_parallelism(p).with_checkpointing(checkpointed(chk.path(), Arc::clone(&faults)));
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

/// The group protocol against Tansu: a lone member gets every partition; a second one joining
/// makes the first hear that the group changes, and after both join again they split the
/// partitions by name; offsets committed are read back; a member leaving hands its
/// partitions to the other.
#[test]
fn consumer_group_members_share_the_partitions_by_name() {
    if !weir_testkit::kafka::available("consumer_group_members_share_the_partitions_by_name") {
        return;
    }
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

/// Compressed batches, as producers with `compression.type` write them (the source refused
/// them: "weir reads uncompressed batches only"): the exactly-once sink writes each codec's
/// batches through the broker, and the source reads every record back once; a batch whose
/// compressed records are damaged (its CRC made to match) is a clear error, never records.
#[test]
fn compressed_batches_are_written_and_read_in_every_codec() {
    if !weir_testkit::kafka::available("compressed_batches_are_written_and_read_in_every_codec") {
        return;
    }
    use weir_kafka::Compression;
    for c in [Compression::Gzip, Compression::Snappy, Compression::Lz4, Compression::Zstd] {
        let t = topic(&format!("compressed-{}", c.name()), 2);
        let chk = tempfile::tempdir().unwrap();
        let job = Job::new("compressed")
            .with_parallelism(2)
            .with_checkpointing(checkpointed(chk.path(), FaultInjector::new(vec![])));
        job.generator(Generator::new(|i, _| i).count(3_000)).sink(
            KafkaSink::new(broker(), &t, |i: &u64| KafkaRecord { key: None, value: format!("m{i}").into_bytes() })
                .compression(c)
                .subtasks(),
        );
        job.execute(RunConfig::default().workers(2)).unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let read = Job::new("read-compressed");
        let into = Arc::clone(&got);
        read.source(KafkaSource::new(broker(), &t, value_text).subtasks())
            .sink(move |_| Ok(CollectSink::new(Arc::clone(&into))));
        read.execute(RunConfig::default().workers(2)).unwrap();
        let mut got = got.lock().unwrap().clone();
        got.sort();
        let mut want: Vec<String> = (0..3_000).map(|i| format!("m{i}")).collect();
        want.sort();
        assert_eq!(got, want, "{c:?}");
    }
    // Damage inside the compressed records, the CRC recomputed: the decompression says so.
    let t = topic("compressed-damaged", 1);
    let mut b = BatchWriter::compressed(Compression::Zstd);
    (0..100).for_each(|i| b.push(1_000 + i, None, format!("value {i}").as_bytes()));
    let mut batch = b.finish(None, false).to_vec();
    let mid = 61 + (batch.len() - 61) / 2;
    batch[mid..].iter_mut().for_each(|x| *x ^= 0x5a);
    let crc = crc32c::crc32c(&batch[21..]);
    batch[17..21].copy_from_slice(&crc.to_be_bytes());
    KafkaClient::connect(broker()).unwrap().produce(None, &t, 0, batch.into()).unwrap();
    let read = Job::new("read-damaged");
    read.source(KafkaSource::new(broker(), &t, value_text).subtasks()).discard();
    let e = read.execute(RunConfig::default().workers(1)).unwrap_err();
    let said = e.to_string();
    assert!(said.contains(&format!("from Kafka broker {}, topic '{t}' partition 0", broker())), "{said}");
    assert!(said.contains("the record batch at offset 0: its zstd data does not decompress"), "{said}");
}
