//! `weir wordcount`: word count over text files or a Kafka topic into a transactional file
//! sink or a Kafka topic (a Kafka transaction per checkpoint), resumable after any crash.
//!
//! May touch: `args`, `group` (a consumer group's hand-overs).

use weir::metrics::group_digits;
use weir::source::TextSource;
use weir::Error;
use weir_jobs::wordcount::{wordcount_between, KafkaPartitions, WordInput, WordOutput};
use weir_kafka::{Delivery, KafkaUrl};
use weir_object_store::S3Url;

use std::sync::atomic::Ordering;

use crate::args::*;
use weir_ops::supervisor::*;

fn join(parts: &[i32], sep: &str) -> String {
    parts.iter().map(i32::to_string).collect::<Vec<_>>().join(sep)
}

/// `arg` as a Kafka topic address, if it is meant as one (`kafka://…`; a malformed one is an
/// error that shows the form).
fn kafka_url(arg: &std::path::Path) -> weir::Result<Option<KafkaUrl>> {
    if let Some((scheme, _)) = arg.to_str().and_then(|s| s.split_once("://")).filter(|(s, _)| *s != "kafka") {
        // `kafkas://…` (or any other address) was read as a file path named after it.
        let tls = if scheme.eq_ignore_ascii_case("kafkas") { " (over TLS: kafka://… with --kafka-tls)" } else { "" };
        return Err(Error::config(format!(
            "'{}' is an address weir does not take: a Kafka topic is kafka://HOST:PORT/TOPIC{tls}, anything else a \
             file or folder",
            arg.display()
        )));
    }
    arg.to_str().filter(|s| KafkaUrl::is_kafka(s)).map(KafkaUrl::parse).transpose()
}

pub(crate) fn run_wordcount(args: &WordcountArgs) -> weir::Result<()> {
    let mut args = args.clone();
    args.checkpoints.flags = args.checkpoints.flags.with_file()?;
    let args = &args;
    let (kafka_in, kafka_out) = (kafka_url(&args.input)?, kafka_url(&args.output)?);
    let (config, parallelism) = args.runtime.config();
    let config = args.checkpoints.flags.run_config(config)?;
    if args.kafka.given() && kafka_in.is_none() && kafka_out.is_none() {
        return Err(Error::config("the --kafka-* flags need a Kafka input or output (kafka://HOST:PORT/TOPIC)"));
    }
    if args.kafka.kafka_compression != weir_kafka::Compression::None && kafka_out.is_none() {
        return Err(Error::config(
            "--kafka-compression needs a Kafka output (--output kafka://HOST:PORT/TOPIC); the input's batches are \
             read whatever their codec",
        ));
    }
    if args.partitions.is_some() && kafka_in.is_none() {
        return Err(Error::config("--partitions needs a Kafka input (--input kafka://HOST:PORT/TOPIC)"));
    }
    if let Some(group) = &args.group {
        let Some(topic) = &kafka_in else {
            return Err(Error::config("--group needs a Kafka input (--input kafka://HOST:PORT/TOPIC)"));
        };
        let Some(dir) = &args.checkpoints.flags.checkpoint_dir else {
            return Err(Error::config(
                "--group needs --checkpoint-dir: a process's offsets live in its checkpoints, and the directory is \
                 its name in the group",
            ));
        };
        if !args.follow {
            return Err(Error::config(
                "--group needs --follow: a consumer group shares a topic that keeps growing (to read fixed \
                 partitions to their ends, give --partitions)",
            ));
        }
        if args.checkpoints.restore.is_some() || args.checkpoints.savepoint_dir.is_some() {
            return Err(Error::config(
                "--group takes no --restore or --savepoint-dir: a member resumes from its --checkpoint-dir (Ctrl-C \
                 leaves the group with a savepoint there), and partitions new to it start from the group's offsets",
            ));
        }
        return run_in_group(args, topic, group, dir, kafka_out.as_ref(), config, parallelism);
    }
    let security = args.kafka.security()?;
    let (input, bytes, from) = match &kafka_in {
        Some(topic) => {
            let partitions = args.partitions.clone().map(|p| p.0);
            let from = match &partitions {
                Some(p) => format!("{topic} (partitions {})", join(p, ",")),
                None => topic.to_string(),
            };
            let partitions = partitions.map_or(KafkaPartitions::All, KafkaPartitions::Only);
            let input =
                WordInput::Kafka { topic: topic.clone(), partitions, follow: args.follow, security: security.clone() };
            (input, None, from)
        }
        None => {
            let text = TextSource::open(&args.input)?.follow(args.follow);
            let bytes = text.total_bytes();
            let from = std::path::absolute(&args.input).unwrap_or_else(|_| args.input.clone()).display().to_string();
            (WordInput::Text(text), Some(bytes), from)
        }
    };
    if let Some(topic) = kafka_out {
        let (output, description, written) = kafka_output(args, &topic, &from, &security);
        let job = wordcount_between(input, output, parallelism);
        return run_job(args, job, description, config, bytes, &written, None).map(|_| ());
    }
    let (output, description, written) = file_output(args, &from)?;
    run_job(args, wordcount_between(input, output, parallelism), description, config, bytes, &written, None).map(|_| ())
}

/// Word count into Kafka topic `topic`: exactly once with checkpoints (a Kafka transaction
/// per checkpoint), as the files are. The transactional ids are named by the checkpoint
/// directory's identity (the sink's default): every directory's its own, however the
/// input is named (two word counts of different files into one topic took each other's).
fn kafka_output(
    args: &WordcountArgs,
    topic: &KafkaUrl,
    from: &str,
    security: &weir_kafka::Security,
) -> (WordOutput, String, String) {
    let transactional = args.checkpoints.flags.checkpoint_dir.is_some();
    let delivery = if transactional { Delivery::ExactlyOnce } else { Delivery::None };
    let output = WordOutput::Kafka {
        topic: topic.clone(),
        delivery,
        transactional_id_prefix: None,
        security: security.clone(),
        compression: args.kafka.kafka_compression,
    };
    (output, format!("word count of {from} into {topic}"), topic.to_string())
}

/// `weir wordcount --group`: runs the job on the partitions the group hands this process,
/// again after every change of the group, until it ends or Ctrl-C stops it.
fn run_in_group(
    args: &WordcountArgs,
    topic: &KafkaUrl,
    group: &str,
    dir: &std::path::Path,
    kafka_out: Option<&KafkaUrl>,
    config: weir::RunConfig,
    parallelism: usize,
) -> weir::Result<()> {
    let security = &args.kafka.security()?;
    let name = crate::group::member_name(dir);
    let mut session = crate::group::GroupSession::join(topic, security, group, &name)?;
    let from = format!("{topic} (consumer group {group})");
    loop {
        let assignment = session.assignment()?;
        let input = WordInput::Kafka {
            topic: topic.clone(),
            partitions: KafkaPartitions::Group(assignment),
            follow: true,
            security: security.clone(),
        };
        let (output, description, written) = match kafka_out {
            // The transactional ids are this member's, whatever partitions it has.
            Some(out) => kafka_output(args, out, &from, security),
            None => file_output(args, &from)?,
        };
        let job = wordcount_between(input, output, parallelism);
        match run_job(args, job, description, config.clone(), None, &written, Some(&mut session))? {
            Ran::HandedOver if STOP_REQUESTS.load(Ordering::SeqCst) > 0 => {
                session.commit_all()?;
                session.leave()?;
                println!(
                    "left consumer group '{group}': the output this process's partitions had reached is committed, \
                     and so are their offsets in the group; run again with --checkpoint-dir {} to rejoin",
                    dir.display()
                );
                return Ok(());
            }
            Ran::HandedOver => {
                session.commit_all()?;
                session.rejoin()?;
            }
            Ran::Ended { output_committed } => {
                if output_committed {
                    session.commit_all()?;
                }
                return session.leave();
            }
        }
    }
}

/// Word count into the output folder: checks it may be written, and says what goes there.
fn file_output(args: &WordcountArgs, from: &str) -> weir::Result<(WordOutput, String, String)> {
    let transactional = args.checkpoints.flags.checkpoint_dir.is_some();
    let output = std::path::absolute(&args.output)
        .map_err(|e| Error::io("cannot resolve the output folder", &args.output, e))?;
    let description = format!("word count of {from} into {}", output.display());
    for (flag, other) in [
        ("--checkpoint-dir", args.checkpoints.local_dir().as_ref()),
        ("--savepoint-dir", args.checkpoints.savepoint_dir.as_ref().filter(|d| !S3Url::is_s3(&d.to_string_lossy()))),
    ] {
        let Some(other) = other else { continue };
        let other = std::path::absolute(other).map_err(|e| Error::io("cannot resolve the folder", other, e))?;
        if other.starts_with(&output) || output.starts_with(&other) {
            return Err(Error::config(format!(
                "--output {} and {flag} {} overlap (one is inside the other): every file in the output folder is \
                 output, so checkpoints must live elsewhere",
                args.output.display(),
                other.display()
            )));
        }
    }
    // A rerun with the same checkpoint directory resumes into the same output (the
    // two-phase-commit sink keeps what was committed and discards the rest), and so does a
    // restore (the plain file sink cuts each file back to its length at the savepoint).
    // (Checkpoints in an object store may hold this job's: the sink finds out as it starts.)
    let in_store = args.checkpoints.flags.checkpoint_dir.is_some() && args.checkpoints.local_dir().is_none();
    let resuming = args.checkpoints.restore.is_some()
        || in_store
        || args.checkpoints.local_dir().as_ref().is_some_and(|d| d.exists());
    if let Ok(mut entries) = std::fs::read_dir(&args.output) {
        if entries.next().is_some() && !resuming {
            return Err(Error::config(format!(
                "output folder {} is not empty; remove it or choose another",
                args.output.display()
            )));
        }
    } else if args.output.exists() {
        return Err(Error::config(format!("output {} exists and is not a folder", args.output.display())));
    }
    let output = WordOutput::Files { dir: args.output.clone(), transactional };
    let written = format!(
        "{}/part-*{}",
        args.output.display(),
        if transactional { " (committed files only; hidden ones are in progress)" } else { "" }
    );
    Ok((output, description, written))
}

/// How [`run_job`] ended.
enum Ran {
    /// The job ended: finished (`output_committed`), stopped with a savepoint, or found
    /// complete already.
    Ended { output_committed: bool },
    /// The consumer group changed: the job stopped with a savepoint, its output committed.
    HandedOver,
}

/// Runs word count `job` (described as `description`) under the command's checkpoint flags:
/// a finished checkpoint directory is not run again, a restore is honoured, the report says
/// how much came in (`bytes`, for files) and where it went (`written`). A member of a
/// consumer group (`group`) hands over when the group changes.
fn run_job(
    args: &WordcountArgs,
    job: weir::Job,
    description: String,
    config: weir::RunConfig,
    bytes: Option<u64>,
    written: &str,
    group: Option<&mut crate::group::GroupSession>,
) -> weir::Result<Ran> {
    let mut job = job.with_description(description.clone());
    if let Some(c) = args.checkpoints.config()? {
        job = job.with_checkpointing(c);
    }
    if let Some(dir) = &args.checkpoints.flags.checkpoint_dir {
        // A finished job is not run again; another job's finished directory is not reused.
        if let Some(finished) = args.checkpoints.finished()? {
            if finished.fingerprint != job.fingerprint() || finished.description != description {
                return Err(Error::config(format!(
                    "checkpoint directory {} holds another job, which completed: '{}' ({}, graph fingerprint {}); this \
                     run is {} (graph fingerprint {}). Choose another checkpoint directory",
                    dir.display(),
                    finished.job,
                    finished.description,
                    finished.fingerprint,
                    description,
                    job.fingerprint()
                )));
            }
            println!(
                "the job is already complete ({} in {}); its output is in {}. Remove {} to run it again.",
                weir::runtime::FINISHED_MARKER,
                dir.display(),
                args.output.display(),
                dir.display()
            );
            return Ok(Ran::Ended { output_committed: false });
        }
    }
    // Found out now, not when Ctrl-C asks for the savepoint.
    let savepoints = args.checkpoints.savepoint_dir.as_deref().map(weir_ops::stored::SavepointDir::open).transpose()?;
    if let Some(path) = &args.checkpoints.restore {
        job = job.restore_from(weir_ops::stored::restorable(path)?, args.checkpoints.allow_non_restored_state);
    } else if args.checkpoints.allow_non_restored_state {
        return Err(Error::config("--allow-non-restored-state needs --restore"));
    }
    let (handle, control) = start_with_control(job, config, args.runtime.bind_control()?)?;
    let (progress, control) = (!args.runtime.no_progress, control.as_ref());
    let supervised = match group {
        Some(g) => supervise_with(handle, None, progress, savepoints.as_ref(), control, &mut |h| g.tick(h))?,
        None => supervise_with(handle, None, progress, savepoints.as_ref(), control, &mut |_| Ok(false))?,
    };
    let report = match supervised {
        Supervised::Finished(report) => *report,
        Supervised::Savepoint => return Ok(Ran::Ended { output_committed: true }),
        Supervised::HandedOver => return Ok(Ran::HandedOver),
    };
    // A source record is a block of text (or a Kafka message); the sinks get one count per
    // word: the headline counts words.
    let words = Some(("words", report.sink_records));
    weir_ops::runner::print_report(&report, args.checkpoints.flags.checkpoint_dir.is_some(), words);
    let secs = report.elapsed.as_secs_f64().max(1e-9);
    let input = match bytes {
        Some(bytes) => format!("{} bytes ({:.1} MB/s)", group_digits(bytes), bytes as f64 / secs / 1e6),
        None => format!("{} messages", group_digits(report.source_records)),
    };
    println!("input: {input}; words: {}; output: {written}", group_digits(report.sink_records));
    Ok(Ran::Ended { output_committed: true })
}
