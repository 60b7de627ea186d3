//! The default job (generator → key_by → tumbling window count, with its events and results)
//! and the word count (lines of text or a Kafka topic → words → running counts, into files
//! or a Kafka topic), as the `weir` command runs them.
//!
//! May touch: `pipeline`, `operator`, `record`, `source`, and `weir_kafka`.

use std::path::PathBuf;

use weir::operator::window::{Window, WindowBounds};
use weir::pipeline::Job;
use weir::record::Word;
use weir::source::{Generator, TextSource};
use weir_kafka::{Assignment, Compression, Delivery, KafkaRecord, KafkaSink, KafkaSource, KafkaUrl, Security};

/// An event of the default job: a key and the time it was created (also its event time).
#[derive(Clone, Copy, Debug, PartialEq, Eq, weir::Persist)]
pub struct Event {
    /// The key, in `0 .. keys`.
    pub key: u64,
    /// Creation time on the job clock, in nanoseconds; the event time too.
    pub created_ns: u64,
}

/// One window result of the default job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, weir::Persist)]
pub struct WindowCount {
    /// The key.
    pub key: u64,
    /// The window.
    pub window: WindowBounds,
    /// Events of this key in the window.
    pub count: u64,
}

impl WindowCount {
    /// When the result could first be known: the window's last instant. Event time is
    /// creation time on the job clock, so the window is complete once an event created after
    /// this instant has passed; latency is measured from here to the sink.
    pub fn complete_ns(&self) -> u64 {
        self.window.end - 1
    }
}

/// Settings of the default job.
#[derive(Clone, Copy, Debug)]
pub struct DefaultJob {
    /// Parallelism of every operator.
    pub parallelism: usize,
    /// Number of distinct keys.
    pub keys: u64,
    /// Tumbling window length in milliseconds.
    pub window_ms: u64,
    /// Events per second in all; `None` runs as fast as possible.
    pub rate_per_s: Option<f64>,
}

/// Spreads index `i` over `keys` keys (a multiplicative hash, so consecutive indices and the
/// subtasks' strided indices all reach every key).
#[inline]
pub fn key_of(i: u64, keys: u64) -> u64 {
    ((i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) * keys) >> 32
}

impl DefaultJob {
    /// generator → event-time watermarks → key_by → tumbling window count → latency → discard.
    pub fn build(&self) -> Job {
        let keys = self.keys.max(1);
        let job = Job::new("default").with_parallelism(self.parallelism);
        let mut generator = Generator::new(move |i, now_ns| Event { key: key_of(i, keys), created_ns: now_ns });
        if let Some(rate) = self.rate_per_s {
            generator = generator.rate(rate);
        }
        job.generator(generator)
            .with_watermarks(|e: &Event| e.created_ns, 0)
            .key_by(|e: &Event| e.key)
            .window(Window::tumbling(self.window_ms * 1_000_000), |e: &Event| e.created_ns)
            .aggregate(
                || 0u64,
                |c: &mut u64, _e: Event| *c += 1,
                |&key, window, &count| WindowCount { key, window, count },
            )
            .named("window-count")
            .measure_latency(WindowCount::complete_ns)
            .discard();
        job
    }
}

/// Word count as a running count: for every word occurrence in `input`, one line
/// `word<TAB>count` in `<output>/part-<subtask>`, or, with `transactional`, in files committed
/// per checkpoint by the two-phase-commit file sink (`<output>/part-<subtask>-<checkpoint>`;
/// see [`weir::Stream::write_files_transactional`]).
pub fn wordcount(input: TextSource, output: PathBuf, parallelism: usize, transactional: bool) -> Job {
    let job = Job::new("wordcount").with_parallelism(parallelism);
    let counts = running_counts(job.text(input).words());
    write_counts(counts, output, transactional);
    job
}

/// Each word with its running count.
fn running_counts(words: weir::Stream<Word>) -> weir::Stream<(Word, u64)> {
    words
        .key_by_ref(|w: &Word| w)
        .aggregate_with_record(|| 0u64, |c: &mut u64, _: &Word| *c += 1, |w: Word, c: &u64| (w, *c))
        .named("count")
}

/// Counts into files under `dir`: plain, or committed per checkpoint.
fn write_counts(counts: weir::Stream<(Word, u64)>, dir: PathBuf, transactional: bool) {
    if transactional {
        counts.write_files_transactional(dir, format_count);
    } else {
        counts.write_files(dir, format_count);
    }
}

/// Where word count reads its text.
#[derive(Debug)]
pub enum WordInput {
    /// Files (or a followed log).
    Text(TextSource),
    /// A Kafka topic, one line of text per message: bounded to the ends the topic had when
    /// the job first started, or followed.
    Kafka {
        /// The topic.
        topic: KafkaUrl,
        /// Which partitions.
        partitions: KafkaPartitions,
        /// Keep reading as the topic grows.
        follow: bool,
        /// How its connections are secured (TLS, SASL).
        security: Security,
    },
}

/// Which partitions of a Kafka topic word count reads.
#[derive(Debug)]
pub enum KafkaPartitions {
    /// All of them (and, followed, those added later).
    All,
    /// These (one of several processes sharing the topic).
    Only(Vec<i32>),
    /// Those a consumer group handed this process.
    Group(Assignment),
}

/// Where word count writes its counts.
#[derive(Debug)]
pub enum WordOutput {
    /// Files in a folder: plain, or committed per checkpoint.
    Files {
        /// The folder.
        dir: PathBuf,
        /// Committed per checkpoint by the two-phase-commit file sink.
        transactional: bool,
    },
    /// A Kafka topic, one `word<TAB>count` message per count, keyed by the word.
    Kafka {
        /// The topic.
        topic: KafkaUrl,
        /// Exactly once (a transaction per checkpoint), at least once or none.
        delivery: Delivery,
        /// The prefix of the transactional ids: stable across restarts of this job, and
        /// different for every process writing the topic. `None`: the sink's default, named
        /// by the checkpoint directory's identity (unique by construction).
        transactional_id_prefix: Option<String>,
        /// How its connections are secured (TLS, SASL).
        security: Security,
        /// How its batches are compressed.
        compression: Compression,
    },
}

/// [`wordcount`] from any [`WordInput`] to any [`WordOutput`].
pub fn wordcount_between(input: WordInput, output: WordOutput, parallelism: usize) -> Job {
    // Files to files is [`wordcount`] itself: built through the match below, its word path
    // costs 25 instructions a word more (perf/instructions.sh: 565 against 540).
    let (input, output) = match (input, output) {
        (WordInput::Text(text), WordOutput::Files { dir, transactional }) => {
            return wordcount(text, dir, parallelism, transactional)
        }
        other => other,
    };
    let job = Job::new("wordcount").with_parallelism(parallelism);
    let words = match input {
        WordInput::Text(text) => job.text(text).words(),
        WordInput::Kafka { topic, partitions, follow, security } => {
            let mut source = KafkaSource::new(&topic.bootstrap, &topic.topic, |m| m.value.map(<[u8]>::to_vec))
                .follow(follow)
                .security(security);
            source = match partitions {
                KafkaPartitions::All => source,
                KafkaPartitions::Only(p) => source.partitions(p),
                KafkaPartitions::Group(assignment) => source.assigned(assignment),
            };
            job.source(source.subtasks())
        }
        .named("kafka")
        .flat_map(|line: Vec<u8>, out: &mut weir::Emitter<'_, Word>| {
            weir::record::for_each_word_in_bytes(&line, |w| out.emit(w))
        }),
    };
    let counts = running_counts(words);
    match output {
        WordOutput::Files { dir, transactional } => write_counts(counts, dir, transactional),
        WordOutput::Kafka { topic, delivery, transactional_id_prefix, security, compression } => {
            let mut sink = KafkaSink::new(&topic.bootstrap, &topic.topic, |wc: &(Word, u64)| {
                let mut value = Vec::new();
                format_count(wc, &mut value);
                value.pop(); // one message per count: no newline
                KafkaRecord { key: Some(wc.0.as_str().into_bytes()), value }
            })
            .delivery(delivery)
            .security(security)
            .compression(compression);
            if let Some(prefix) = transactional_id_prefix {
                sink = sink.transactional_id_prefix(prefix);
            }
            counts.sink(sink.subtasks())
        }
    }
    job
}

/// [`wordcount`] on owned `String` words instead of [`Word`]s (no checkpoints): the same
/// words and output, each word its own heap allocation as it crosses the ring and goes on to
/// the output (`aggregate_with_record` moves it there); keyed by reference (`key_by_ref`), so
/// the state copies a word only the first time it sees it. For
/// comparing the two paths (`cargo bench --bench wordcount`).
pub fn wordcount_strings(input: TextSource, output: PathBuf, parallelism: usize) -> Job {
    let job = Job::new("wordcount-strings").with_parallelism(parallelism);
    job.text(input)
        .flat_map(|line: &str, out: &mut weir::Emitter<'_, String>| {
            weir::record::for_each_word(line, |w| out.emit(w.as_str()))
        })
        .key_by_ref(|w: &String| w.as_str())
        .aggregate_with_record(|| 0u64, |c: &mut u64, _: &String| *c += 1, |w: String, c: &u64| (w, *c))
        .named("count")
        .write_files(output, |(w, c): &(String, u64), out: &mut Vec<u8>| {
            out.extend_from_slice(w.as_bytes());
            out.push(b'\t');
            push_decimal(out, *c);
            out.push(b'\n');
        });
    job
}

/// `word<TAB>count<LF>`.
#[doc(hidden)] // for the tests (tests/jobs.rs)
pub fn format_count((w, c): &(Word, u64), out: &mut Vec<u8>) {
    let c = *c;
    w.write_to(out);
    out.push(b'\t');
    push_decimal(out, c);
    out.push(b'\n');
}

/// `"00" "01" … "99"`: two digits per division.
const DIGIT_PAIRS: &[u8; 200] = b"\
0001020304050607080910111213141516171819202122232425262728293031323334353637383940414243444546474849\
5051525354555657585960616263646566676869707172737475767778798081828384858687888990919293949596979899";

/// The number of decimal digits of `n` (1 for 0).
#[inline]
fn decimal_digits(n: u64) -> usize {
    // floor(log10(2) * bits) is the digit count or one less; one comparison tells which.
    let bits = 64 - (n | 1).leading_zeros();
    let guess = ((bits * 1233) >> 12) as usize;
    (guess + usize::from(n >= POWERS_OF_TEN[guess])).max(1)
}

/// `10^0 … 10^19`.
const POWERS_OF_TEN: [u64; 20] = {
    let mut p = [1u64; 20];
    let mut i = 1;
    while i < 20 {
        p[i] = p[i - 1] * 10;
        i += 1;
    }
    p
};

/// Appends `n` in decimal without allocating. The digits are written in place into a
/// fixed-size extension that is then cut back: copies of known size need no `memmove` call,
/// which a formatting loop of short numbers otherwise spends much of its time in.
#[inline]
pub fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
    let (start, len) = (out.len(), decimal_digits(n));
    out.extend_from_slice(&[0u8; 20]);
    let digits = &mut out[start..start + len];
    let mut i = len;
    while n >= 100 {
        let pair = (n % 100) as usize * 2;
        n /= 100;
        i -= 2;
        digits[i..i + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
    }
    if n >= 10 {
        digits[..2].copy_from_slice(&DIGIT_PAIRS[n as usize * 2..n as usize * 2 + 2]);
    } else {
        digits[0] = b'0' + n as u8;
    }
    out.truncate(start + len);
}
