//! The command line: every command, its arguments and their parsing (clap), and what the
//! checkpoint and runtime arguments make of themselves (a `CheckpointConfig`, a `RunConfig`).
//!
//! May touch: nothing else in the crate (`weir-ops`' settings and control binding).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use weir::checkpoint::CheckpointConfig;
use weir::runtime::available_cores;
use weir::{Error, RunConfig};

/// weir: a thread-per-core stream processor with Flink-style checkpoints.
///
/// Without a command, runs the default job: generator → key_by → 10 ms tumbling-window count
/// → sink on all cores for about 10 s, then prints throughput and latency.
#[derive(Parser, Debug)]
#[command(name = "weir", version, args_conflicts_with_subcommands = true)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Option<Command>,
    #[command(flatten)]
    pub(crate) default_job: DefaultArgs,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Counts words: one line `word<TAB>count` per occurrence, a running count per word.
    Wordcount(Box<WordcountArgs>),
    /// Lists the checkpoints (or savepoints) in a directory, or one checkpoint folder, with
    /// their statistics, verifying every file (exits non-zero if one is damaged).
    Checkpoints(CheckpointsArgs),
    /// Runs a benchmark workload for a while, with or without checkpoints: throughput,
    /// latency percentiles and every checkpoint's statistics, as a table and as JSON.
    Bench(Box<BenchArgs>),
    /// Runs a Nexmark query over generated auction events: throughput per core, and with
    /// --check the results compared with a sequential implementation.
    Nexmark(Box<NexmarkArgs>),
    /// Runs one of weir's jobs under deterministic simulation: for each seed, a failure
    /// schedule (task failures, crashes, damaged checkpoints, failed writes, fencing) on one
    /// thread, its committed output compared with the failure-free run's. Prints each seed
    /// that differs with the command that reruns it, and `N seeds, F differ from the golden
    /// run`; exits non-zero when any differs.
    Simulate(SimulateArgs),
    /// Asks a running job's control endpoint (--control of the command running it): take a
    /// checkpoint or a savepoint, stop with a savepoint, change the checkpoint configuration,
    /// list checkpoints, read metrics.
    Control(ControlArgs),
}

#[derive(Args, Debug, Clone)]
pub(crate) struct ControlArgs {
    /// The endpoint, HOST:PORT (or http://HOST:PORT).
    pub(crate) addr: String,
    #[command(subcommand)]
    pub(crate) request: ControlRequest,
}

#[derive(clap::Subcommand, Debug, Clone)]
pub(crate) enum ControlRequest {
    /// Takes a checkpoint now and waits for it: its id.
    Checkpoint {
        /// A full checkpoint: with incremental checkpoints, every page written and nothing
        /// referred to in earlier checkpoints (Flink's `flink checkpoint --full`).
        #[arg(long, conflicts_with = "incremental")]
        full: bool,
        /// An incremental one (refused if the job's checkpoints are not incremental).
        #[arg(long)]
        incremental: bool,
    },
    /// Takes a savepoint into DIR, the job going on: its folder.
    Savepoint {
        /// The folder the savepoint goes into (created).
        dir: PathBuf,
    },
    /// Stops the job with a savepoint into DIR: its folder (with --drain, every window fires
    /// and the job finishes first).
    Stop {
        /// The folder the savepoint goes into (created).
        dir: PathBuf,
        /// Drain first (Flink's stop --drain): the sources end their streams, every window
        /// fires, the output is committed and the job finishes; its final checkpoint is the
        /// savepoint. For a job retired, not paused.
        #[arg(long)]
        drain: bool,
    },
    /// Shows the checkpoint configuration in force, or changes it: KEY=VALUE … (all or
    /// nothing), keys as the checkpoint flags' a running job can change: checkpoint (aligned,
    /// unaligned, aligned-timeout, adaptive), interval-ms, interval-during-backlog-ms,
    /// checkpoint-timeout-ms, min-pause-ms, max-concurrent, tolerable-failed-checkpoints,
    /// retained, unaligned, aligned-checkpoint-timeout-ms, inflight-budget-bytes, and
    /// restart-strategy with its restart-* parameters.
    Config {
        /// KEY=VALUE settings; none shows the configuration.
        settings: Vec<String>,
    },
    /// Lists the completed checkpoints with their statistics.
    Checkpoints,
    /// The job's metrics, in Prometheus's text format.
    Metrics,
    /// The job: name, state, uptime, records, restarts, the last failure.
    Job,
    /// Whether the job is healthy: its state; exits non-zero once it failed.
    Health,
    /// Cancels the job (no savepoint; Flink's cancel).
    Cancel,
}

#[derive(Args, Debug, Clone)]
pub(crate) struct SimulateArgs {
    /// The job: wordcount, window, join, keyed, timers (a process function with event-time
    /// timers and a side output), sessions (session windows), owned (records that own heap memory,
    /// through every built-in operator), kafka (running counts into the exactly-once Kafka sink
    /// over a model of a transactional log that loses requests and answers) or embedded (a host
    /// program feeding a push source and reading an exactly-once pull sink, restarted with the
    /// job after a crash).
    #[arg(long, value_parser = listed(&weir_jobs::simulated::SimJob::ALL))]
    pub(crate) job: weir_jobs::simulated::SimJob,
    /// How checkpoints go: aligned, unaligned, aligned-timeout (aligned, turning unaligned
    /// where a task waits too long), at-least-once, or adaptive (unaligned within an
    /// in-flight budget).
    #[arg(long, default_value = "aligned", value_parser = listed(&weir::checkpoint::ModeKind::ALL))]
    pub(crate) mode: weir::checkpoint::ModeKind,
    /// Incremental checkpoints.
    #[arg(long)]
    pub(crate) incremental: bool,
    /// Changelog checkpoints (a new base due after every two checkpoints of changes,
    /// materialized in the background).
    #[arg(long)]
    pub(crate) changelog: bool,
    /// Parallelism of every operator.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub(crate) parallelism: u64,
    /// The seeds, A..B (B excluded) or a single seed N.
    #[arg(long, value_parser = seed_range)]
    pub(crate) seeds: std::ops::Range<u64>,
    /// Keep keyed state within this much memory (as 16KiB: a few pages, so pages leave
    /// memory and come back all the time); a third of the seeds also fail a spill write.
    #[arg(long, value_parser = weir_ops::settings::byte_size)]
    pub(crate) state_memory: Option<weir::state::ByteSize>,
    /// Restore every attempt from files, never from the copy of the newest checkpoint kept
    /// in memory (local recovery).
    #[arg(long)]
    pub(crate) no_local_recovery: bool,
}

/// `A..B` (A < B) or `N` (the one seed N).
pub(crate) fn seed_range(s: &str) -> Result<std::ops::Range<u64>, String> {
    let number = |t: &str| t.trim().parse::<u64>().map_err(|_| format!("'{t}' is not a seed (a whole number)"));
    let range = match s.split_once("..") {
        Some((a, b)) => number(a)?..number(b)?,
        None => {
            let n = number(s)?;
            n..n.checked_add(1).ok_or_else(|| format!("seed {n} is too large"))?
        }
    };
    if range.is_empty() {
        return Err(format!("the seed range {s} is empty: give A..B with A < B (B is excluded)"));
    }
    Ok(range)
}

#[derive(Args, Debug, Clone)]
pub(crate) struct NexmarkArgs {
    /// q0 (pass-through), q1 (currency conversion), q2 (selection), q3 (local item
    /// suggestion), q4 (average price per category), q5 (hot items), q6 (average price per
    /// seller), q7 (highest bid), q8 (new users), q9 (winning bids), q11 (user sessions), q12
    /// (processing-time windows), q13 (side input join), q14 (calculation), q15-q17 (bid,
    /// channel and auction statistics), q18 (last bid), q19 (top 10 bids), q20 (expanded bids),
    /// q21 (channel id), q22 (URL directories); q10 (log to a file system) writes every bid
    /// under --output, partitioned by day and minute (--check reads the files back).
    #[arg(long, value_parser = listed(&weir_jobs::nexmark::Query::ALL))]
    pub(crate) query: weir_jobs::nexmark::Query,
    /// Where q10 writes its files (`dt=YYYY-MM-DD/hm=HH:MM/part-<subtask>`; q10 only).
    #[arg(long)]
    pub(crate) output: Option<PathBuf>,
    /// Events to generate (persons, auctions and bids, 1:3:46).
    #[arg(long, default_value_t = 10_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) events: u64,
    /// Events per second in all (default: as fast as possible).
    #[arg(long, allow_negative_numbers = true, value_parser = rate_per_s)]
    pub(crate) rate: Option<f64>,
    #[command(flatten)]
    pub(crate) checkpoints: weir_ops::settings::CheckpointSettings,
    /// Compare the results with a sequential implementation (at most 2,000,000 events).
    #[arg(long)]
    pub(crate) check: bool,
    #[command(flatten)]
    pub(crate) runtime: RuntimeArgs,
}

#[derive(Args, Debug, Clone)]
pub(crate) struct BenchArgs {
    /// stateless | keyed | window | join | backpressure (a sink spending --sink-cost-ns per
    /// record, so the rings fill up) | sparse-window (Flink's W3: a 1 s window count where every
    /// (key, window) gets one event) | backlog (half the events on one hot key whose subtask
    /// spends --sink-cost-ns each and lags: a sink aligning a lagging and a moving input) |
    /// mixed (the backlog pipeline beside one whose rings are full but drain in milliseconds).
    #[arg(long, default_value = "keyed", value_parser = listed(&weir_jobs::bench::Workload::ALL))]
    pub(crate) workload: weir_jobs::bench::Workload,
    /// How long to run, in seconds.
    #[arg(long, default_value_t = 10.0, allow_negative_numbers = true, value_parser = duration_s)]
    pub(crate) duration_s: f64,
    /// Events per second in all (default: as fast as possible).
    #[arg(long, allow_negative_numbers = true, value_parser = rate_per_s)]
    pub(crate) rate: Option<f64>,
    /// Distinct keys (the size of keyed state).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) keys: u64,
    /// Draw keys with Zipf's law of this exponent (a few hot keys, a long tail; 1.0 is the
    /// classic skew, 0 uniform) instead of uniformly: stateless, keyed, join, backpressure.
    #[arg(long, value_name = "S", allow_negative_numbers = true, value_parser = zipf_exponent)]
    pub(crate) zipf: Option<f64>,
    /// Nanoseconds the slow stage spends per record: the sink's (backpressure) or the keyed
    /// stage's (backlog).
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    pub(crate) sink_cost_ns: u64,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) checkpoints: weir_ops::settings::CheckpointSettings,
    #[command(flatten)]
    pub(crate) runtime: RuntimeArgs,
}

#[derive(Args, Debug, Clone)]
pub(crate) struct CheckpointsArgs {
    /// A checkpoint directory (holding chk-<n> folders; s3://BUCKET/PREFIX for one in an
    /// object store: its complete checkpoints), a savepoint directory (holding savepoint-<n>
    /// folders), or one chk-<n> or savepoint-<n> folder.
    pub(crate) dir: PathBuf,
}

#[derive(Args, Debug, Clone)]
pub(crate) struct CheckpointArgs {
    #[command(flatten)]
    pub(crate) flags: weir_ops::settings::CheckpointSettings,
    /// Ctrl-C or SIGTERM stops the job with a savepoint in this directory, a folder or
    /// s3://BUCKET/PREFIX (needs --checkpoint-dir).
    #[arg(long, help_heading = "Savepoints and restores")]
    pub(crate) savepoint_dir: Option<PathBuf>,
    /// Milliseconds the savepoint of --savepoint-dir may take before it fails (default
    /// 600000), apart from --checkpoint-timeout-ms.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..), help_heading = "Savepoints and restores")]
    pub(crate) savepoint_timeout_ms: Option<u64>,
    /// Start from this savepoint (savepoint-<n>) or checkpoint (chk-<n>) folder, or one in an
    /// object store (s3://BUCKET/PREFIX/savepoint-<n>).
    #[arg(long, help_heading = "Savepoints and restores")]
    pub(crate) restore: Option<PathBuf>,
    /// With --restore: drop state of operators this job lacks instead of refusing it.
    #[arg(long, help_heading = "Savepoints and restores")]
    pub(crate) allow_non_restored_state: bool,
    /// Let a recovery that falls back past a damaged checkpoint (or finds none left) remove
    /// the output committed under the checkpoints it cannot restore, and compute it again;
    /// without it, such a recovery refuses to start and names the files.
    #[arg(long, help_heading = "Savepoints and restores")]
    pub(crate) allow_retracting_output: bool,
    /// Tests only: end the process right after checkpoint N is complete, before any sink
    /// commits it.
    #[cfg(feature = "testing")]
    #[arg(long, hide = true)]
    pub(crate) exit_before_commit: Option<u64>,
    /// Tests only: end the process once the first task committed checkpoint N, before the
    /// others heard it completed.
    #[cfg(feature = "testing")]
    #[arg(long, hide = true)]
    pub(crate) exit_after_first_commit: Option<u64>,
    /// Tests only: end the process with checkpoint N's `_metadata` written and not renamed.
    #[cfg(feature = "testing")]
    #[arg(long, hide = true)]
    pub(crate) exit_before_metadata_rename: Option<u64>,
    /// Tests only: stop the process (SIGSTOP) between its ownership check and its publish of
    /// checkpoint N into the object store.
    #[cfg(feature = "testing")]
    #[arg(long, hide = true)]
    pub(crate) stop_before_publish: Option<u64>,
    /// Tests only: end the process in the middle of a task's write of checkpoint N.
    #[cfg(feature = "testing")]
    #[arg(long, hide = true)]
    pub(crate) exit_mid_task_write: Option<u64>,
    /// Tests only (the soak run): fail the counting operator every N words it receives, and
    /// restart without limit.
    #[cfg(feature = "testing")]
    #[arg(long, hide = true, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) fail_every_words: Option<u64>,
}

impl CheckpointArgs {
    /// The completion marker of --checkpoint-dir, if a job finished there (read from the
    /// store, for one in an object store).
    pub(crate) fn finished(&self) -> weir::Result<Option<weir::checkpoint::FinishedJob>> {
        let Some(dir) = &self.flags.checkpoint_dir else { return Ok(None) };
        if let Some(local) = self.local_dir() {
            return weir::checkpoint::read_finished(&local);
        }
        let store = weir_object_store::open(&dir.to_string_lossy())?;
        let scratch = weir_ops::scratch_dir("finished");
        std::fs::create_dir_all(&scratch).map_err(|e| Error::io("cannot create a temporary folder", &scratch, e))?;
        let marker = scratch.join(weir::checkpoint::FINISHED_MARKER);
        let found = store
            .download(weir::checkpoint::FINISHED_MARKER, &marker)
            .map_err(|e| Error::Io { context: format!("cannot read {}", store.location()), path: None, source: e })
            .and_then(|there| if there { weir::checkpoint::read_finished(&scratch) } else { Ok(None) });
        let _ = std::fs::remove_dir_all(&scratch);
        found
    }

    /// The local folder of --checkpoint-dir (`file://` taken off); `None` without one, or
    /// when it is in an object store (`s3://`).
    pub(crate) fn local_dir(&self) -> Option<PathBuf> {
        let dir = self.flags.checkpoint_dir.as_ref()?;
        match dir.to_str() {
            Some(s) if weir_object_store::S3Url::is_s3(s) => None,
            Some(s) if s.starts_with("file://") => Some(PathBuf::from(&s["file://".len()..])),
            _ => Some(dir.clone()),
        }
    }

    /// The failure points the hidden test flags ask for.
    #[cfg(feature = "testing")]
    pub(super) fn with_faults(&self, mut c: CheckpointConfig) -> CheckpointConfig {
        let mut faults = Vec::new();
        if let Some(n) = self.exit_before_commit {
            faults.push(weir::faults::Fault::ExitBeforeCommit { checkpoint: n });
        }
        if let Some(n) = self.exit_after_first_commit {
            faults.push(weir::faults::Fault::ExitAfterFirstCommit { checkpoint: n });
        }
        if let Some(n) = self.exit_before_metadata_rename {
            faults.push(weir::faults::Fault::ExitBeforeMetadataRename { checkpoint: n });
        }
        if let Some(n) = self.stop_before_publish {
            faults.push(weir::faults::Fault::StopBeforePublish { checkpoint: n });
        }
        if let Some(n) = self.exit_mid_task_write {
            faults.push(weir::faults::Fault::ExitMidTaskWrite { checkpoint: n });
        }
        if let Some(every) = self.fail_every_words {
            faults.extend(
                (1..=1_000u64).map(|k| weir::faults::Fault::AtRecord { operator: "count".into(), nth: k * every }),
            );
            c = c.restart(weir::checkpoint::RestartStrategy::FixedDelay {
                attempts: u32::MAX,
                delay: Duration::from_millis(50),
            });
        }
        if !faults.is_empty() {
            c = c.faults(weir::faults::FaultInjector::new(faults));
        }
        c
    }

    /// Word count's checkpoint configuration: `None` without checkpoints. Its flags are
    /// [`weir_ops::settings::CheckpointSettings`] (merged with their file already); word
    /// count's checkpoints need a directory, as they are what it resumes from.
    pub(super) fn config(&self) -> weir::Result<Option<CheckpointConfig>> {
        let lifecycle = [
            ("--savepoint-dir", self.savepoint_dir.is_some()),
            ("--savepoint-timeout-ms", self.savepoint_timeout_ms.is_some()),
            ("--allow-retracting-output", self.allow_retracting_output),
        ];
        let Some(plan) = self.flags.plan(false)? else {
            if let Some((flag, _)) = lifecycle.iter().find(|(_, g)| *g) {
                return Err(Error::config(format!("{flag} needs --checkpoint-dir")));
            }
            return Ok(None);
        };
        let Some(dir) = &self.flags.checkpoint_dir else {
            return Err(Error::config(format!(
                "word count's checkpoints (--checkpoint {plan}) need --checkpoint-dir DIR: they are what it resumes from"
            )));
        };
        let c = match self.local_dir() {
            Some(local) => CheckpointConfig::new(local),
            None => CheckpointConfig::in_store(weir_object_store::open(&dir.to_string_lossy())?),
        };
        #[allow(unused_mut)]
        let mut c = c.allow_retracting_output(self.allow_retracting_output);
        #[cfg(feature = "testing")]
        {
            c = self.with_faults(c);
        }
        if let Some(ms) = self.savepoint_timeout_ms {
            if self.savepoint_dir.is_none() {
                return Err(Error::config("--savepoint-timeout-ms needs --savepoint-dir"));
            }
            c = c.savepoint_timeout(Duration::from_millis(ms));
        }
        self.flags.apply(&plan, c).map(Some)
    }
}

#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Runtime")]
pub(crate) struct RuntimeArgs {
    /// Worker threads, one per core (default: every available core).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub(crate) workers: Option<u64>,
    /// Parallelism of every operator (default: the number of workers).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=128))]
    pub(crate) parallelism: Option<u64>,
    /// Capacity of each ring between subtasks, in entries.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..=(1 << 24)))]
    pub(crate) ring_capacity: u64,
    /// Records per batch (source polls and ring reads): smaller batches lower latency.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=(1 << 20)))]
    pub(crate) batch_size: u64,
    /// Do not pin workers to cores (let the OS place and migrate them).
    #[arg(long)]
    pub(crate) no_pin: bool,
    /// Hide the live progress line.
    #[arg(long)]
    pub(crate) no_progress: bool,
    /// Serve the control endpoint at HOST:PORT (port 0 picks one; the address is printed):
    /// checkpoints and savepoints on demand, stop with a savepoint, the live checkpoint
    /// configuration, statistics, Prometheus metrics. `weir control ADDR …` is its client.
    #[arg(long, value_name = "HOST:PORT", help_heading = "Control")]
    pub(crate) control: Option<String>,
    /// Let --control serve off loopback (anyone who reaches it can stop the job).
    #[arg(long, requires = "control", help_heading = "Control")]
    pub(crate) control_public: bool,
    /// Let the control endpoint write savepoints only under DIR (a folder or s3://BUCKET/PREFIX;
    /// give it again for more): a request for a folder elsewhere is refused. Without it, any
    /// folder this process may write.
    #[arg(long, value_name = "DIR", requires = "control", help_heading = "Control")]
    pub(crate) control_savepoint_root: Vec<String>,
    /// Keep the control endpoint serving this long after the job ended (`30s`, `2m`), so
    /// that a probe or an operator reads how it ended (`/health`, `/job`); it serves on anyway
    /// while a savepoint or stop asked for by trigger has an outcome nobody polled, up to 30 s.
    #[arg(long, value_name = "DURATION", requires = "control", value_parser = duration_s, help_heading = "Control")]
    pub(crate) control_linger: Option<f64>,
}

impl RuntimeArgs {
    /// The control endpoint's address the flags ask for, bound now: before the job starts, so
    /// that a bad address stops nothing that ran.
    pub(crate) fn bind_control(&self) -> weir::Result<Option<weir_ops::control::ControlBinding>> {
        let roots = &self.control_savepoint_root;
        self.control
            .as_deref()
            .map(|a| {
                weir_ops::control::ControlBinding::bind(a, weir_ops::control::Reach::of_public(self.control_public))
                    .map(|b| {
                        let linger = Duration::from_secs_f64(self.control_linger.unwrap_or(0.0));
                        b.savepoint_roots(roots).linger(linger)
                    })
            })
            .transpose()
    }
}

#[derive(Args, Debug, Clone)]
pub(crate) struct DefaultArgs {
    /// How long to run, in seconds.
    #[arg(long, default_value_t = 10.0, allow_negative_numbers = true, value_parser = duration_s)]
    pub(crate) duration_s: f64,
    /// Events per second in all (default: as fast as possible).
    #[arg(long, allow_negative_numbers = true, value_parser = rate_per_s)]
    pub(crate) rate: Option<f64>,
    /// Number of distinct keys.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) keys: u64,
    /// Tumbling window length in milliseconds.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub(crate) window_ms: u64,
    #[command(flatten)]
    pub(crate) runtime: RuntimeArgs,
}

#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Input and output")]
pub(crate) struct WordcountArgs {
    /// A text file, a folder of text files (read in name order), - for standard input, or a
    /// Kafka topic, kafka://HOST:PORT/TOPIC (one line of text per message; read up to the
    /// ends it had when the job first started, unless --follow).
    #[arg(long)]
    pub(crate) input: PathBuf,
    /// The output folder (created; must be empty, unless the job resumes there): files
    /// part-<subtask>, or with --checkpoint-dir committed files part-<subtask>-<checkpoint>.
    /// Or a Kafka topic, kafka://HOST:PORT/TOPIC (it must exist): one word<TAB>count message
    /// per count, keyed by the word; with --checkpoint-dir exactly once, a Kafka transaction
    /// per checkpoint.
    #[arg(long)]
    pub(crate) output: PathBuf,
    /// Keep reading the last input file as it grows (a log), or the Kafka topic; the job then
    /// runs until Ctrl-C.
    #[arg(long)]
    pub(crate) follow: bool,
    /// With a Kafka input: read only these partitions of it (a comma-separated list, say
    /// 0,1), as one of several processes that share the topic. Each process then needs its own
    /// --checkpoint-dir; their output transactions are told apart by the partitions.
    #[arg(long, value_parser = partition_list, conflicts_with = "group")]
    pub(crate) partitions: Option<PartitionList>,
    /// With a Kafka input and --follow: read the partitions Kafka consumer group GROUP hands
    /// this process, as one of several that share the topic (each with its own
    /// --checkpoint-dir, which is also its name in the group: started again from the same
    /// directory, a process gets the same partitions). When the group changes, the process
    /// stops with a savepoint, commits its offsets to the group and goes on with its new
    /// partitions; the offsets of every checkpoint whose output is committed go to the group.
    #[arg(long, value_name = "GROUP")]
    pub(crate) group: Option<String>,
    #[command(flatten)]
    pub(crate) kafka: KafkaArgs,
    #[command(flatten)]
    pub(crate) runtime: RuntimeArgs,
    #[command(flatten)]
    pub(crate) checkpoints: CheckpointArgs,
}

/// A parser for a flag whose values are `all` (each shown as it displays): `--help` lists
/// every one, and a wrong one is refused with the list.
fn listed<T>(all: &[T]) -> impl clap::builder::TypedValueParser<Value = T>
where
    T: std::str::FromStr + std::fmt::Display + Clone + Send + Sync + 'static,
    T::Err: std::fmt::Display,
{
    use clap::builder::TypedValueParser;
    // Parsed once per flag per run: the names live as long as the process.
    let names: Vec<&'static str> = all.iter().map(|v| &*Box::leak(v.to_string().into_boxed_str())).collect();
    clap::builder::PossibleValuesParser::new(names).try_map(|s: String| s.parse::<T>().map_err(|e| e.to_string()))
}

/// How the Kafka input and output are reached (TLS, SASL) and how the output is compressed.
#[derive(Args, Debug, Clone, Default)]
#[command(next_help_heading = "Kafka")]
pub(crate) struct KafkaArgs {
    /// Speak TLS to the Kafka brokers, checking their certificates against the platform's
    /// roots (managed Kafka: MSK, Confluent Cloud, Aiven).
    #[arg(long)]
    pub(crate) kafka_tls: bool,
    /// Speak TLS to the Kafka brokers, checking their certificates against the CA
    /// certificates in this PEM file only (a private CA).
    #[arg(long, value_name = "PEM")]
    pub(crate) kafka_ca_file: Option<PathBuf>,
    /// Log in to the Kafka brokers with SASL: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512, as
    /// --kafka-sasl-username with the password in the environment variable
    /// WEIR_KAFKA_SASL_PASSWORD or in --kafka-sasl-password-file (never on the command line,
    /// where other users of the machine can read it).
    #[arg(long, value_name = "MECHANISM", value_parser = listed(&KAFKA_SASL_MECHANISMS))]
    pub(crate) kafka_sasl_mechanism: Option<weir_kafka::SaslMechanism>,
    /// The SASL user.
    #[arg(long, value_name = "USER")]
    pub(crate) kafka_sasl_username: Option<String>,
    /// A file holding the SASL password (its first line).
    #[arg(long, value_name = "FILE")]
    pub(crate) kafka_sasl_password_file: Option<PathBuf>,
    /// How the Kafka output's batches are compressed (Kafka's compression.type); the input's
    /// are read whatever their codec.
    #[arg(long, value_name = "CODEC", default_value = "none", value_parser = listed(&KAFKA_COMPRESSIONS))]
    pub(crate) kafka_compression: weir_kafka::Compression,
}

const KAFKA_SASL_MECHANISMS: [weir_kafka::SaslMechanism; 3] =
    [weir_kafka::SaslMechanism::Plain, weir_kafka::SaslMechanism::ScramSha256, weir_kafka::SaslMechanism::ScramSha512];

const KAFKA_COMPRESSIONS: [weir_kafka::Compression; 5] = [
    weir_kafka::Compression::None,
    weir_kafka::Compression::Gzip,
    weir_kafka::Compression::Snappy,
    weir_kafka::Compression::Lz4,
    weir_kafka::Compression::Zstd,
];

impl KafkaArgs {
    /// Whether any flag asks for more than plaintext and no compression.
    pub(crate) fn given(&self) -> bool {
        self.kafka_tls
            || self.kafka_ca_file.is_some()
            || self.kafka_sasl_mechanism.is_some()
            || self.kafka_sasl_username.is_some()
            || self.kafka_sasl_password_file.is_some()
            || self.kafka_compression != weir_kafka::Compression::None
    }

    /// The security the flags ask for; a login without a user or password, or a password
    /// file that cannot be read, is an error naming what is missing.
    pub(crate) fn security(&self) -> weir::Result<weir_kafka::Security> {
        let mut security = weir_kafka::Security::plaintext();
        if let Some(ca) = &self.kafka_ca_file {
            security = security.tls(weir_kafka::Tls::ca_file(ca)?);
        } else if self.kafka_tls {
            security = security.tls(weir_kafka::Tls::platform_roots()?);
        }
        match (&self.kafka_sasl_mechanism, &self.kafka_sasl_username) {
            (None, None) if self.kafka_sasl_password_file.is_none() => {}
            (None, _) => {
                return Err(weir::Error::config(
                    "--kafka-sasl-username and --kafka-sasl-password-file need --kafka-sasl-mechanism (PLAIN, \
                     SCRAM-SHA-256 or SCRAM-SHA-512)",
                ))
            }
            (Some(_), None) => return Err(weir::Error::config("--kafka-sasl-mechanism needs --kafka-sasl-username")),
            (Some(mechanism), Some(user)) => {
                let password = match &self.kafka_sasl_password_file {
                    Some(file) => {
                        // A password is a line: a FIFO or /dev/zero is refused, not read.
                        let text = weir_ops::settings::read_plain_file(file, "--kafka-sasl-password-file", 4096)?;
                        text.lines().next().unwrap_or("").to_string()
                    }
                    None => std::env::var("WEIR_KAFKA_SASL_PASSWORD").map_err(|_| {
                        weir::Error::config(
                            "--kafka-sasl-mechanism needs a password: in the environment variable \
                             WEIR_KAFKA_SASL_PASSWORD or in --kafka-sasl-password-file",
                        )
                    })?,
                };
                security = security.sasl(weir_kafka::Sasl::new(*mechanism, user.clone(), password));
            }
        }
        Ok(security)
    }
}

/// Kafka partitions, sorted, each once.
#[derive(Clone, Debug)]
pub(crate) struct PartitionList(pub(crate) Vec<i32>);

/// A comma-separated list of Kafka partitions, each a number from 0.
fn partition_list(s: &str) -> Result<PartitionList, String> {
    let parts: Result<Vec<i32>, String> = s
        .split(',')
        .map(|p| {
            p.trim().parse::<i32>().ok().filter(|p| *p >= 0).ok_or_else(|| format!("'{p}' is not a partition number"))
        })
        .collect();
    let mut parts = parts?;
    parts.sort_unstable();
    parts.dedup();
    Ok(PartitionList(parts))
}

/// Milliseconds between checkpoints when a benchmark is not told.
pub(crate) const DEFAULT_BENCH_INTERVAL_MS: u64 = 1000;

/// The longest run a duration flag accepts, in seconds (about 31 years).
pub(crate) const MAX_DURATION_S: f64 = 1e9;
/// The highest rate a rate flag accepts, in events per second: far above what any machine
/// reaches, where "as fast as possible" is the same.
pub(crate) const MAX_RATE_PER_S: f64 = 1e10;

/// A positive number of at most `max`.
pub(crate) fn positive_at_most(s: &str, max: f64, unit: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("'{s}' is not a number"))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("'{s}' must be a positive number"));
    }
    if v > max {
        return Err(format!("'{s}' is out of range: at most {max:e} {unit}"));
    }
    Ok(v)
}

/// Seconds, as a number (`2.5`) or a duration with its unit (`90s`, `1m30s`, `500ms`: read as
/// the checkpoint settings read theirs, [`weir_ops::settings::millis`]).
pub(crate) fn duration_s(s: &str) -> Result<f64, String> {
    if s.trim().parse::<f64>().is_ok() {
        return positive_at_most(s, MAX_DURATION_S, "seconds");
    }
    let ms = weir_ops::settings::millis(s)?;
    positive_at_most(&(ms as f64 / 1e3).to_string(), MAX_DURATION_S, "seconds")
        .map_err(|_| format!("'{s}' must be a positive duration of at most {MAX_DURATION_S:e} seconds"))
}

/// A Zipf exponent: a finite number, 0 (uniform) up to 10 (all on a handful of keys).
pub(crate) fn zipf_exponent(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && (0.0..=10.0).contains(&x) => Ok(x),
        _ => Err(format!("'{s}' is not a Zipf exponent: a number from 0 (uniform) to 10")),
    }
}

pub(crate) fn rate_per_s(s: &str) -> Result<f64, String> {
    positive_at_most(s, MAX_RATE_PER_S, "events per second (leave --rate out to run as fast as possible)")
}

impl RuntimeArgs {
    pub(super) fn config(&self) -> (RunConfig, usize) {
        let workers = self.workers.map(|w| w as usize).unwrap_or_else(available_cores);
        let parallelism = self.parallelism.map(|p| p as usize).unwrap_or(workers).min(128);
        let config = RunConfig::default()
            .workers(workers)
            .ring_capacity(self.ring_capacity as usize)
            .batch_size(self.batch_size as usize)
            .pin_workers(!self.no_pin);
        (config, parallelism)
    }
}
