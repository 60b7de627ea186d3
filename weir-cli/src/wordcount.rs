//! `weir wordcount`: word count over text files or a Kafka topic into a transactional file
//! sink or a Kafka topic (a Kafka transaction per checkpoint), resumable after any crash.

use weir::metrics::group_digits;
use weir::source::TextSource;
use weir::Error;
use weir_jobs::wordcount::{wordcount_between, WordInput, WordOutput};
use weir_kafka::{Delivery, KafkaUrl};
use weir_object_store::S3Url;

use crate::args::*;
use crate::supervisor::*;

fn join(parts: &[i32], sep: &str) -> String {
    parts.iter().map(i32::to_string).collect::<Vec<_>>().join(sep)
}

/// `arg` as a Kafka topic address, if it is meant as one (`kafka://…`; a malformed one is an
/// error that shows the form).
fn kafka_url(arg: &std::path::Path) -> weir::Result<Option<KafkaUrl>> {
    arg.to_str().filter(|s| KafkaUrl::is_kafka(s)).map(KafkaUrl::parse).transpose()
}

pub(crate) fn run_wordcount(args: &WordcountArgs) -> weir::Result<()> {
    let (kafka_in, kafka_out) = (kafka_url(&args.input)?, kafka_url(&args.output)?);
    let (config, parallelism) = args.runtime.config();
    let transactional = args.checkpoints.checkpoint_dir.is_some();
    if args.partitions.is_some() && kafka_in.is_none() {
        return Err(Error::config("--partitions needs a Kafka input (--input kafka://HOST:PORT/TOPIC)"));
    }
    let (input, bytes, from) = match &kafka_in {
        Some(topic) => {
            let partitions = args.partitions.clone().map(|p| p.0);
            let from = match &partitions {
                Some(p) => format!("{topic} (partitions {})", join(p, ",")),
                None => topic.to_string(),
            };
            (WordInput::Kafka { topic: topic.clone(), partitions, follow: args.follow }, None, from)
        }
        None => {
            let text = TextSource::open(&args.input)?.follow(args.follow);
            let bytes = text.total_bytes();
            let from = std::path::absolute(&args.input).unwrap_or_else(|_| args.input.clone()).display().to_string();
            (WordInput::Text(text), Some(bytes), from)
        }
    };
    if let Some(topic) = kafka_out {
        // Exactly once with checkpoints (a Kafka transaction per checkpoint), as the files are.
        let delivery = if transactional { Delivery::ExactlyOnce } else { Delivery::None };
        let description = format!("word count of {from} into {topic}");
        // One prefix per input: processes that share the output topic over parts of the
        // input must not fence each other's transactions.
        let source = match (&kafka_in, &args.partitions) {
            (Some(t), Some(p)) => format!("{}-p{}", t.topic, join(&p.0, ".")),
            (Some(t), None) => t.topic.clone(),
            (None, _) => "files".to_string(),
        };
        let transactional_id_prefix = format!("weir-wordcount-{}-from-{source}", topic.topic);
        let output = WordOutput::Kafka { topic: topic.clone(), delivery, transactional_id_prefix };
        return run_job(
            args,
            wordcount_between(input, output, parallelism),
            description,
            config,
            bytes,
            &topic.to_string(),
        );
    }
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
    let in_store = args.checkpoints.checkpoint_dir.is_some() && args.checkpoints.local_dir().is_none();
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
    run_job(args, wordcount_between(input, output, parallelism), description, config, bytes, &written)
}

/// Runs word count `job` (described as `description`) under the command's checkpoint flags:
/// a finished checkpoint directory is not run again, a restore is honoured, the report says
/// how much came in (`bytes`, for files) and where it went (`written`).
fn run_job(
    args: &WordcountArgs,
    job: weir::Job,
    description: String,
    config: weir::RunConfig,
    bytes: Option<u64>,
    written: &str,
) -> weir::Result<()> {
    let mut job = job.with_description(description.clone());
    if let Some(c) = args.checkpoints.config()? {
        job = job.with_checkpointing(c);
    }
    if let Some(dir) = &args.checkpoints.checkpoint_dir {
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
            return Ok(());
        }
    }
    // Found out now, not when Ctrl-C asks for the savepoint.
    let savepoints = args.checkpoints.savepoint_dir.as_deref().map(crate::stored::SavepointDir::open).transpose()?;
    if let Some(path) = &args.checkpoints.restore {
        job = job.restore_from(crate::stored::restorable(path)?, args.checkpoints.allow_non_restored_state);
    } else if args.checkpoints.allow_non_restored_state {
        return Err(Error::config("--allow-non-restored-state needs --restore"));
    }
    let handle = announce_restores(job).start(config)?;
    let Some(report) = supervise(handle, None, !args.runtime.no_progress, savepoints.as_ref())? else {
        return Ok(());
    };
    print!("{}", report.summary_table());
    if args.checkpoints.checkpoint_dir.is_some() {
        println!("checkpoints completed: {}", report.checkpoints.len());
        if !report.checkpoints.is_empty() {
            print!("{}", weir::checkpoint::stats_table(&report.checkpoints));
        }
    }
    let secs = report.elapsed.as_secs_f64().max(1e-9);
    let input = match bytes {
        Some(bytes) => format!("{} bytes ({:.1} MB/s)", group_digits(bytes), bytes as f64 / secs / 1e6),
        None => format!("{} messages", group_digits(report.source_records)),
    };
    println!("input: {input}; words: {}; output: {written}", group_digits(report.sink_records));
    Ok(())
}
