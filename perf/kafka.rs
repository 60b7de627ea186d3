//! The Kafka connector against a running broker (`cargo bench --bench kafka -- HOST:PORT
//! [MESSAGES]`): the source's read rate at parallelism 1 (against the broker's own fetch
//! rate, the client reading the same partitions alone with no job around it, and with
//! `--features rdkafka`, against librdkafka's consumer reading them alone), and the sink's
//! write rate exactly once against at least once and none, alternating in one run so the
//! ratios share the machine's load. With `--tls TLS_HOST:PORT --ca-file PEM` (a second broker
//! behind a TLS-terminating proxy: `perf/kafka-tls.sh` starts both and runs this), the source
//! also reads the same messages over TLS, in turn with plaintext. Prints one table; `cat
//! /proc/loadavg` beside it says how busy the machine was.

use std::time::{Duration, Instant};

use weir::checkpoint::CheckpointConfig;
use weir::sink::DiscardSink;
use weir::source::Generator;
use weir::{Job, RunConfig};
use weir_kafka::records::{batches, BatchWriter, Item};
use weir_kafka::{Delivery, KafkaClient, KafkaRecord, KafkaSink, KafkaSource, Security, Tls};

/// The value of flag `name` in `args`, removing both.
fn flag(args: &mut Vec<String>, name: &str) -> Option<String> {
    let i = args.iter().position(|a| a == name)?;
    let value = args.get(i + 1).cloned();
    args.drain(i..(i + 2).min(args.len()));
    value
}

/// Writes `n` 100-byte messages over the 4 partitions of `topic` through `client`.
fn fill(client: &mut KafkaClient, topic: &str, n: u64) {
    client.create_topic(topic, 4).unwrap();
    let value = [b'x'; 100];
    for p in 0..4 {
        let mut left = n / 4;
        while left > 0 {
            let mut b = BatchWriter::default();
            for _ in 0..left.min(5_000) {
                b.push(0, None, &value);
            }
            left -= b.len() as u64;
            client.produce(None, topic, p, b.finish(None, false)).unwrap();
        }
    }
}

/// Messages a second the source reads of `topic` (`messages` of them) at parallelism 1, its
/// connections secured by `security`.
fn source_rate(broker: &str, topic: &str, messages: u64, security: &Security) -> f64 {
    let job = Job::new("kafka-read");
    job.source(KafkaSource::new(broker, topic, |m| m.value.map(<[u8]>::len)).security(security.clone()).subtasks())
        .sink(|_| Ok(DiscardSink));
    let t = Instant::now();
    let report = job.execute(RunConfig::default().pin_workers(true).workers(1)).unwrap();
    assert_eq!(report.source_records, messages);
    messages as f64 / t.elapsed().as_secs_f64()
}

/// Messages a second the client alone reads: every partition fetched to its end, the records
/// counted.
fn fetch_alone(client: &mut KafkaClient, input: &str, messages: u64) -> f64 {
    let t = Instant::now();
    let mut from: Vec<(i32, i64)> = (0..4).map(|p| (p, 0)).collect();
    let mut read = 0u64;
    while read < messages {
        for f in client.fetch(input, &from, 1, 4 << 20, true).unwrap() {
            let mut last = None;
            batches(&f.records, |item| {
                if let Item::Record(info, _) = item {
                    read += 1;
                    last = Some(info.last_offset);
                }
                Ok(true)
            })
            .unwrap();
            if let (Some(l), Some(slot)) = (last, from.iter_mut().find(|(p, _)| *p == f.partition)) {
                slot.1 = l + 1;
            }
        }
    }
    messages as f64 / t.elapsed().as_secs_f64()
}

/// Messages a second the sink writes under each guarantee in turn, each into a topic of its
/// own (named after `tag`).
fn sink_rates(client: &mut KafkaClient, broker: &str, tag: &str, messages: u64) -> Vec<(Delivery, f64)> {
    let value = [b'x'; 100];
    let mut rates = Vec::new();
    for delivery in [Delivery::None, Delivery::AtLeastOnce, Delivery::ExactlyOnce] {
        let out = format!("bench-out-{tag}-{delivery}");
        client.create_topic(&out, 4).unwrap();
        let chk = tempfile::tempdir().unwrap();
        let job = Job::new(format!("kafka-write-{tag}-{delivery}"))
            .with_checkpointing(CheckpointConfig::new(chk.path()).interval(Duration::from_millis(200)));
        job.generator(Generator::new(|i, _| i).count(messages)).sink(
            KafkaSink::new(broker, &out, move |i: &u64| KafkaRecord {
                key: Some(i.to_le_bytes().to_vec()),
                value: value.to_vec(),
            })
            .delivery(delivery)
            .subtasks(),
        );
        let t = Instant::now();
        job.execute(RunConfig::default().pin_workers(true).workers(1)).unwrap();
        rates.push((delivery, messages as f64 / t.elapsed().as_secs_f64()));
    }
    rates
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let tls = flag(&mut args, "--tls");
    let ca_file = flag(&mut args, "--ca-file");
    let Some(broker) = args.first().cloned() else {
        eprintln!("usage: cargo bench --bench kafka -- HOST:PORT [MESSAGES] [--tls TLS_HOST:PORT --ca-file PEM]");
        std::process::exit(2);
    };
    let n: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1_000_000);
    let stamp = std::process::id();
    let mut client = KafkaClient::connect(&broker).unwrap_or_else(|e| panic!("{e}"));
    // The input: `n` 100-byte messages over 4 partitions.
    let input = format!("bench-in-{stamp}");
    let secured = tls.map(|addr| {
        let ca = ca_file.as_deref().unwrap_or_else(|| panic!("--tls needs --ca-file PEM"));
        let security = Security::plaintext().tls(Tls::ca_file(ca).unwrap_or_else(|e| panic!("{e}")));
        let mut over_tls = KafkaClient::connect_with(&addr, &security).unwrap_or_else(|e| panic!("{e}"));
        fill(&mut over_tls, &input, n);
        (addr, security)
    });
    fill(&mut client, &input, n);
    let messages = (n / 4) * 4;
    println!("| what | messages/s | ratio |");
    println!("|---|---|---|");
    for round in 0..3 {
        let alone = fetch_alone(&mut client, &input, messages);
        // The source in a job, into nothing; over TLS too, in turn.
        let source = source_rate(&broker, &input, messages, &Security::plaintext());
        println!("| round {round}: fetch alone | {alone:.0} | |");
        println!("| round {round}: source | {source:.0} | {:.2} |", source / alone);
        if let Some((addr, security)) = &secured {
            let over_tls = source_rate(addr, &input, messages, security);
            println!("| round {round}: source over TLS / plaintext | {over_tls:.0} | {:.2} |", over_tls / source);
        }
        #[cfg(feature = "rdkafka")]
        {
            let consumer = rdkafka_rate(&broker, &input, messages);
            println!("| round {round}: rdkafka's consumer alone | {consumer:.0} | |");
            println!("| round {round}: source / rdkafka's consumer | | {:.2} |", source / consumer);
        }
        let rates = sink_rates(&mut client, &broker, &format!("{stamp}-{round}"), messages);
        for (d, r) in &rates {
            println!("| round {round}: sink {d} | {r:.0} | {:.2} |", r / rates[0].1);
        }
    }
}

/// Messages a second `rdkafka` (librdkafka) consumer reads, assigned every partition from the
/// beginning (`read_committed`, no group), the payloads touched and dropped.
#[cfg(feature = "rdkafka")]
fn rdkafka_rate(broker: &str, topic: &str, messages: u64) -> f64 {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker)
        .set("group.id", format!("weir-bench-{}", std::process::id()))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
        .unwrap_or_else(|e| panic!("{e}"));
    let mut partitions = TopicPartitionList::new();
    for p in 0..4 {
        partitions.add_partition_offset(topic, p, Offset::Beginning).unwrap();
    }
    consumer.assign(&partitions).unwrap();
    let t = Instant::now();
    let mut read = 0u64;
    while read < messages {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                read += 1;
                std::hint::black_box(m.payload().map(<[u8]>::len));
            }
            Some(Err(e)) => panic!("rdkafka: {e}"),
            None => {}
        }
    }
    messages as f64 / t.elapsed().as_secs_f64()
}
