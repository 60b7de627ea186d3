//! The `weir` command: the embedded default job, word count, benchmarks, checkpoint listings,
//! the simulator, and their options.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use weir::checkpoint::{CheckpointConfig, CheckpointMode, CheckpointStatus};
use weir::metrics::group_digits;
use weir::runtime::available_cores;
use weir::source::TextSource;
use weir::{Error, Job, JobHandle, JobReport, RunConfig};
use weir_jobs::wordcount::DefaultJob;

/// weir: a thread-per-core stream processor with Flink-style checkpoints.
///
/// Without a command, runs the default job: generator → key_by → 10 ms tumbling-window count
/// → sink on all cores for about 10 s, then prints throughput and latency.
#[derive(Parser, Debug)]
#[command(name = "weir", version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    default_job: DefaultArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
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
}

#[derive(Args, Debug)]
struct SimulateArgs {
    /// The job: wordcount, window, join, keyed, timers (a process function with event-time
    /// timers and a side output), sessions (session windows), owned (records that own heap memory,
    /// through every built-in operator) or embedded (a host program feeding a push source and
    /// reading an exactly-once pull sink, restarted with the job after a crash).
    #[arg(long)]
    job: weir_jobs::simulated::SimJob,
    /// aligned, unaligned, aligned-timeout, at-least-once or adaptive.
    #[arg(long, default_value = "aligned")]
    mode: weir::simulation::SimMode,
    /// Incremental checkpoints.
    #[arg(long)]
    incremental: bool,
    /// Parallelism of every operator.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=64))]
    parallelism: u64,
    /// The seeds, A..B (B excluded) or a single seed N.
    #[arg(long, value_parser = seed_range)]
    seeds: std::ops::Range<u64>,
}

/// `A..B` (A < B) or `N` (the one seed N).
fn seed_range(s: &str) -> Result<std::ops::Range<u64>, String> {
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

#[derive(Args, Debug)]
struct NexmarkArgs {
    /// q0 (pass-through), q1 (currency conversion), q2 (selection), q3 (local item
    /// suggestion), q4 (average price per category), q5 (hot items), q6 (average price per
    /// seller), q7 (highest bid), q8 (new users), q9 (winning bids), q11 (user sessions), q12
    /// (processing-time windows), q13 (side input join), q14 (calculation), q15-q17 (bid,
    /// channel and auction statistics), q18 (last bid), q19 (top 10 bids), q20 (expanded bids),
    /// q21 (channel id), q22 (URL directories); q10 (log to a file system) writes every bid
    /// under --output, partitioned by day and minute (--check reads the files back).
    #[arg(long)]
    query: weir_jobs::nexmark::Query,
    /// Where q10 writes its files (`dt=YYYY-MM-DD/hm=HH:MM/part-<subtask>`; q10 only).
    #[arg(long)]
    output: Option<PathBuf>,
    /// Events to generate (persons, auctions and bids, 1:3:46).
    #[arg(long, default_value_t = 10_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    events: u64,
    /// Events per second in all (default: as fast as possible).
    #[arg(long, allow_negative_numbers = true, value_parser = rate_per_s)]
    rate: Option<f64>,
    /// none | aligned | unaligned | at-least-once.
    #[arg(long, default_value = "none")]
    checkpoint: weir_jobs::bench::CheckpointChoice,
    /// Milliseconds between checkpoints (default 1000; needs --checkpoint).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    interval_ms: Option<u64>,
    /// Incremental checkpoints: write only the state pages changed since the last one (for
    /// the queries whose state grows, q16-q20; needs --checkpoint).
    #[arg(long)]
    incremental: bool,
    /// Compare the results with a sequential implementation (at most 2,000,000 events).
    #[arg(long)]
    check: bool,
    #[command(flatten)]
    runtime: RuntimeArgs,
}

#[derive(Args, Debug)]
struct BenchArgs {
    /// stateless | keyed | window | join | backpressure (a sink spending --sink-cost-ns per
    /// record, so the rings fill up) | sparse-window (Flink's W3: a 1 s window count where every
    /// (key, window) gets one event).
    #[arg(long, default_value = "keyed")]
    workload: weir_jobs::bench::Workload,
    /// none | aligned | unaligned | at-least-once | aligned-timeout (aligned, turning
    /// unaligned after --alignment-timeout-ms) | adaptive (unaligned barriers, a checkpoint's
    /// in-flight data kept under --inflight-budget-bytes).
    #[arg(long, default_value = "none")]
    checkpoint: weir_jobs::bench::CheckpointChoice,
    /// With --checkpoint adaptive: the in-flight budget of a checkpoint, in bytes (default 1 MiB).
    #[arg(long)]
    inflight_budget_bytes: Option<u64>,
    /// Milliseconds between checkpoints (default 1000; needs --checkpoint).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    interval_ms: Option<u64>,
    /// With --checkpoint aligned-timeout: milliseconds from a checkpoint's trigger after which
    /// its barriers turn unaligned (default 10).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    alignment_timeout_ms: Option<u64>,
    /// Checkpoints in flight at once (default 1; needs --checkpoint).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=64))]
    max_concurrent: Option<u64>,
    /// How long to run, in seconds.
    #[arg(long, default_value_t = 10.0, allow_negative_numbers = true, value_parser = duration_s)]
    duration_s: f64,
    /// Events per second in all (default: as fast as possible).
    #[arg(long, allow_negative_numbers = true, value_parser = rate_per_s)]
    rate: Option<f64>,
    /// Distinct keys (the size of keyed state).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    keys: u64,
    /// Nanoseconds the slow stage spends per record: the sink's (backpressure) or the keyed
    /// stage's (backlog).
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    sink_cost_ns: u64,
    /// Write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Where checkpoints go (default: a temporary folder, removed afterwards; needs
    /// --checkpoint).
    #[arg(long)]
    checkpoint_dir: Option<PathBuf>,
    #[command(flatten)]
    runtime: RuntimeArgs,
}

#[derive(Args, Debug)]
struct CheckpointsArgs {
    /// A checkpoint directory (holding chk-<n> folders), a savepoint directory (holding
    /// savepoint-<n> folders), or one chk-<n> or savepoint-<n> folder.
    dir: PathBuf,
}

#[derive(Args, Debug)]
struct CheckpointArgs {
    /// Take checkpoints into this directory (checkpointing is off without it). A directory
    /// with checkpoints of the same job resumes from the newest valid one.
    #[arg(long)]
    checkpoint_dir: Option<PathBuf>,
    /// Milliseconds between checkpoints.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    interval_ms: Option<u64>,
    /// Milliseconds between checkpoints while the input is far from its end (more than 256
    /// MiB left to a subtask): 0 takes none until then.
    #[arg(long)]
    interval_during_backlog_ms: Option<u64>,
    /// Checkpoint mode.
    #[arg(long, value_parser = ["exactly-once", "at-least-once"])]
    mode: Option<String>,
    /// Unaligned checkpoints: barriers overtake in-flight data, which is stored instead.
    #[arg(long)]
    unaligned: bool,
    /// Incremental checkpoints: write only the state pages changed since the last completed
    /// checkpoint and refer to earlier files for the rest.
    #[arg(long)]
    incremental: bool,
    /// With --unaligned: start aligned, switch to unaligned after this many milliseconds.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    alignment_timeout_ms: Option<u64>,
    /// With --unaligned: adaptive alignment, keeping a checkpoint's in-flight data under this
    /// many bytes (channels that drain are aligned, those that lag captured).
    #[arg(long)]
    inflight_budget_bytes: Option<u64>,
    /// Checkpoints in flight at once.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=64))]
    max_concurrent: Option<u64>,
    /// Milliseconds a checkpoint may take before it expires (default 600000); the next one
    /// reuses the parts its tasks had completed where nothing in them changed.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    checkpoint_timeout_ms: Option<u64>,
    /// Checkpoints that may fail in a row before the job fails (default 3).
    #[arg(long)]
    tolerable_failures: Option<u32>,
    /// Completed checkpoints to keep.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1000))]
    retain: Option<u64>,
    /// Ctrl-C or SIGTERM stops the job with a savepoint in this directory (needs
    /// --checkpoint-dir).
    #[arg(long)]
    savepoint_dir: Option<PathBuf>,
    /// Milliseconds the savepoint of --savepoint-dir may take before it fails (default
    /// 600000), apart from --checkpoint-timeout-ms.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    savepoint_timeout_ms: Option<u64>,
    /// Start from this savepoint (savepoint-<n>) or checkpoint (chk-<n>) folder.
    #[arg(long)]
    restore: Option<PathBuf>,
    /// With --restore: drop state of operators this job lacks instead of refusing it.
    #[arg(long)]
    allow_non_restored_state: bool,
    /// Let a recovery that falls back past a damaged checkpoint (or finds none left) remove
    /// the output committed under the checkpoints it cannot restore, and compute it again;
    /// without it, such a recovery refuses to start and names the files.
    #[arg(long)]
    allow_retracting_output: bool,
    /// Tests only: end the process right after checkpoint N is complete, before any sink
    /// commits it.
    #[cfg(feature = "testing")]
    #[arg(long, hide = true)]
    exit_before_commit: Option<u64>,
    /// Tests only: end the process once the first task committed checkpoint N, before the
    /// others heard it completed.
    #[cfg(feature = "testing")]
    #[arg(long, hide = true)]
    exit_after_first_commit: Option<u64>,
    /// Tests only: end the process with checkpoint N's `_metadata` written and not renamed.
    #[cfg(feature = "testing")]
    #[arg(long, hide = true)]
    exit_before_metadata_rename: Option<u64>,
    /// Tests only: end the process in the middle of a task's write of checkpoint N.
    #[cfg(feature = "testing")]
    #[arg(long, hide = true)]
    exit_mid_task_write: Option<u64>,
    /// Tests only (the soak run): fail the counting operator every N words it receives, and
    /// restart without limit.
    #[cfg(feature = "testing")]
    #[arg(long, hide = true, value_parser = clap::value_parser!(u64).range(1..))]
    fail_every_words: Option<u64>,
}

impl CheckpointArgs {
    /// The failure points the hidden test flags ask for.
    #[cfg(feature = "testing")]
    fn with_faults(&self, mut c: CheckpointConfig) -> CheckpointConfig {
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

    fn config(&self) -> weir::Result<Option<CheckpointConfig>> {
        let Some(dir) = &self.checkpoint_dir else {
            let given = [
                ("--interval-ms", self.interval_ms.is_some()),
                ("--interval-during-backlog-ms", self.interval_during_backlog_ms.is_some()),
                ("--mode", self.mode.is_some()),
                ("--unaligned", self.unaligned),
                ("--incremental", self.incremental),
                ("--alignment-timeout-ms", self.alignment_timeout_ms.is_some()),
                ("--inflight-budget-bytes", self.inflight_budget_bytes.is_some()),
                ("--max-concurrent", self.max_concurrent.is_some()),
                ("--checkpoint-timeout-ms", self.checkpoint_timeout_ms.is_some()),
                ("--tolerable-failures", self.tolerable_failures.is_some()),
                ("--retain", self.retain.is_some()),
                ("--savepoint-dir", self.savepoint_dir.is_some()),
                ("--savepoint-timeout-ms", self.savepoint_timeout_ms.is_some()),
                ("--allow-retracting-output", self.allow_retracting_output),
            ];
            if let Some((flag, _)) = given.iter().find(|(_, g)| *g) {
                return Err(Error::config(format!("{flag} needs --checkpoint-dir")));
            }
            return Ok(None);
        };
        #[allow(unused_mut)]
        let mut c = CheckpointConfig::new(dir)
            .unaligned(self.unaligned)
            .incremental(self.incremental)
            .allow_retracting_output(self.allow_retracting_output);
        #[cfg(feature = "testing")]
        {
            c = self.with_faults(c);
        }
        if let Some(ms) = self.interval_ms {
            c = c.interval(Duration::from_millis(ms));
        }
        if let Some(ms) = self.interval_during_backlog_ms {
            c = c.interval_during_backlog(Duration::from_millis(ms));
        }
        if let Some(m) = &self.mode {
            c = c.mode(m.parse::<CheckpointMode>().map_err(Error::config)?);
        }
        if let Some(ms) = self.alignment_timeout_ms {
            c = c.alignment_timeout(Duration::from_millis(ms));
        }
        if let Some(bytes) = self.inflight_budget_bytes {
            c = c.inflight_budget(bytes);
        }
        if let Some(n) = self.max_concurrent {
            c = c.max_concurrent(n as usize);
        }
        if let Some(ms) = self.checkpoint_timeout_ms {
            c = c.timeout(Duration::from_millis(ms));
        }
        if let Some(ms) = self.savepoint_timeout_ms {
            if self.savepoint_dir.is_none() {
                return Err(Error::config("--savepoint-timeout-ms needs --savepoint-dir"));
            }
            c = c.savepoint_timeout(Duration::from_millis(ms));
        }
        if let Some(n) = self.tolerable_failures {
            c = c.tolerable_failures(n);
        }
        if let Some(n) = self.retain {
            c = c.retain(n as usize);
        }
        c.validate()?;
        Ok(Some(c))
    }
}

#[derive(Args, Debug)]
struct RuntimeArgs {
    /// Worker threads, one per core (default: every available core).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=4096))]
    workers: Option<u64>,
    /// Parallelism of every operator (default: the number of workers).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=128))]
    parallelism: Option<u64>,
    /// Capacity of each ring between subtasks, in entries.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..=(1 << 24)))]
    ring_capacity: u64,
    /// Records per batch (source polls and ring reads): smaller batches lower latency.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=(1 << 20)))]
    batch_size: u64,
    /// Do not pin workers to cores (let the OS place and migrate them).
    #[arg(long)]
    no_pin: bool,
    /// Hide the live progress line.
    #[arg(long)]
    no_progress: bool,
}

#[derive(Args, Debug)]
struct DefaultArgs {
    /// How long to run, in seconds.
    #[arg(long, default_value_t = 10.0, allow_negative_numbers = true, value_parser = duration_s)]
    duration_s: f64,
    /// Events per second in all (default: as fast as possible).
    #[arg(long, allow_negative_numbers = true, value_parser = rate_per_s)]
    rate: Option<f64>,
    /// Number of distinct keys.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    keys: u64,
    /// Tumbling window length in milliseconds.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    window_ms: u64,
    #[command(flatten)]
    runtime: RuntimeArgs,
}

#[derive(Args, Debug)]
struct WordcountArgs {
    /// A text file, a folder of text files (read in name order), or - for standard input.
    #[arg(long)]
    input: PathBuf,
    /// The output folder (created; must be empty, unless the job resumes there): files
    /// part-<subtask>, or with --checkpoint-dir committed files part-<subtask>-<checkpoint>.
    #[arg(long)]
    output: PathBuf,
    /// Keep reading the last input file as it grows (a log); the job then runs until Ctrl-C.
    #[arg(long)]
    follow: bool,
    #[command(flatten)]
    runtime: RuntimeArgs,
    #[command(flatten)]
    checkpoints: CheckpointArgs,
}

/// Refuses checkpoint flags given to a benchmark that takes no checkpoints (they would be
/// silently ignored otherwise).
fn refuse_checkpoint_flags_without_checkpoints(
    choice: weir_jobs::bench::CheckpointChoice,
    given: &[(&str, bool)],
) -> weir::Result<()> {
    match given.iter().find(|(_, g)| *g) {
        Some((flag, _)) if choice == weir_jobs::bench::CheckpointChoice::None => {
            Err(Error::config(format!("{flag} needs --checkpoint aligned, unaligned or at-least-once")))
        }
        _ => Ok(()),
    }
}

/// A fresh folder name under the system's temporary directory for a benchmark's checkpoints
/// (removed by the caller afterwards).
fn scratch_checkpoint_dir(command: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    std::env::temp_dir().join(format!("weir-{command}-{}-{nanos}", std::process::id()))
}

/// Milliseconds between checkpoints when a benchmark is not told.
const DEFAULT_BENCH_INTERVAL_MS: u64 = 1000;

/// The longest run a duration flag accepts, in seconds (about 31 years).
const MAX_DURATION_S: f64 = 1e9;
/// The highest rate a rate flag accepts, in events per second: far above what any machine
/// reaches, where "as fast as possible" is the same.
const MAX_RATE_PER_S: f64 = 1e10;

/// A positive number of at most `max`.
fn positive_at_most(s: &str, max: f64, unit: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("'{s}' is not a number"))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("'{s}' must be a positive number"));
    }
    if v > max {
        return Err(format!("'{s}' is out of range: at most {max:e} {unit}"));
    }
    Ok(v)
}

fn duration_s(s: &str) -> Result<f64, String> {
    positive_at_most(s, MAX_DURATION_S, "seconds")
}

fn rate_per_s(s: &str) -> Result<f64, String> {
    positive_at_most(s, MAX_RATE_PER_S, "events per second (leave --rate out to run as fast as possible)")
}

impl RuntimeArgs {
    fn config(&self) -> (RunConfig, usize) {
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

/// The `weir` command: parses the arguments, runs the command, and says how it ended.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Some(Command::Checkpoints(_) | Command::Simulate(_))) {
        // From the first instant of a command that runs a job: a restart restores its state
        // before the job runs (seconds, for much state), and a SIGTERM then must not kill it.
        install_stop_handler();
    }
    let result = match cli.command {
        None => run_default(&cli.default_job),
        Some(Command::Wordcount(args)) => run_wordcount(&args),
        Some(Command::Checkpoints(args)) => list_checkpoints(&args),
        Some(Command::Bench(args)) => run_bench(&args),
        Some(Command::Nexmark(args)) => run_nexmark(&args),
        Some(Command::Simulate(args)) => match run_simulate(&args) {
            // The differing seeds and the summary are printed.
            Ok(all_equal) => return if all_equal { ExitCode::SUCCESS } else { ExitCode::FAILURE },
            Err(e) => Err(e),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Ctrl-C presses (and SIGTERMs) so far: the first stops the job gracefully, the second
/// cancels it. Counted from the start of the process ([`install_stop_handler`]).
static STOP_REQUESTS: AtomicUsize = AtomicUsize::new(0);

/// Whether a running job is watched ([`supervise`]); until then, a job is starting.
static SUPERVISED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Counts Ctrl-C presses and SIGTERMs from now on. While the job is still starting
/// (restoring its state) the first says the job stops once it runs, the second quits at once,
/// which is as safe as a crash: nothing of the checkpoint directory is lost.
fn install_stop_handler() {
    // A second handler cannot be installed; then Ctrl-C keeps its default effect.
    let _ = ctrlc::set_handler(move || {
        let n = STOP_REQUESTS.fetch_add(1, Ordering::SeqCst) + 1;
        if SUPERVISED.load(Ordering::SeqCst) {
            return;
        }
        if n == 1 {
            eprintln!(
                "stop requested (Ctrl-C or SIGTERM) while the job is starting: it stops as soon as it runs; \
                 press Ctrl-C again to quit now"
            );
        } else {
            eprintln!("quit while the job was starting: its checkpoints are as they were; run it again to resume");
            std::process::exit(130);
        }
    });
}

/// Asks `job` to say what it restores, on standard error, as it starts.
fn announce_restores(job: Job) -> Job {
    job.on_restore(|line| eprintln!("{line}"))
}

/// Prints the job's notes not shown yet (restores, skipped checkpoints, failovers) on
/// standard error, above the progress line when there is one.
fn show_notes(handle: &JobHandle, bar: &indicatif::ProgressBar, shown: &mut usize) {
    let notes = handle.notes();
    for note in &notes[(*shown).min(notes.len())..] {
        if bar.is_hidden() {
            eprintln!("{note}");
        } else {
            bar.println(note);
        }
    }
    *shown = notes.len();
}

/// Watches a running job: progress line, Ctrl-C, and an optional time limit.
/// Returns `None` when Ctrl-C stopped the job with a savepoint (after saying where).
fn supervise(
    mut handle: JobHandle,
    limit: Option<Duration>,
    progress: bool,
    savepoint_dir: Option<&std::path::Path>,
) -> weir::Result<Option<JobReport>> {
    SUPERVISED.store(true, Ordering::SeqCst);
    let presses = &STOP_REQUESTS;
    let bar = if progress { indicatif::ProgressBar::new_spinner() } else { indicatif::ProgressBar::hidden() };
    let mut stopped = false;
    let mut cancelled = false;
    let mut last = (0u64, handle.elapsed());
    let mut notes_shown = 0;
    let result = loop {
        if let Some(result) = handle.try_finish() {
            break result;
        }
        show_notes(&handle, &bar, &mut notes_shown);
        std::thread::sleep(Duration::from_millis(100));
        let n = presses.load(Ordering::SeqCst);
        if n >= 1 && !stopped {
            if let Some(dir) = savepoint_dir {
                bar.println("stopping with a savepoint…");
                let stopped = handle.stop_with_savepoint(dir);
                bar.finish_and_clear();
                return match stopped? {
                    weir::Stopped::Savepoint(path) => {
                        println!("stopped with savepoint {}", path.display());
                        println!("the output it covers is committed");
                        println!("resume with --restore {}", path.display());
                        Ok(None)
                    }
                    weir::Stopped::Finished(report) => {
                        println!(
                            "the job was already reaching the end of its input, so it finished instead of taking a \
                             savepoint (no savepoint: nothing is left to resume)"
                        );
                        Ok(Some(report))
                    }
                };
            }
            bar.println("Ctrl-C: stopping (press again to cancel)");
            handle.stop();
            stopped = true;
        }
        if n >= 2 && !cancelled {
            handle.cancel();
            cancelled = true;
        }
        let elapsed = handle.elapsed();
        if limit.is_some_and(|l| elapsed >= l) && !stopped {
            handle.stop();
            stopped = true;
        }
        let records = handle.metrics().source_records();
        let dt = (elapsed - last.1).as_secs_f64();
        if dt >= 0.5 {
            let rate = (records - last.0) as f64 / dt;
            let until = limit.map(|l| format!(" / {:.0} s", l.as_secs_f64())).unwrap_or_default();
            bar.set_message(format!(
                "{:.1} s{until} | {} records | {} records/s | state {:.1} MB",
                elapsed.as_secs_f64(),
                group_digits(records),
                group_digits(rate as u64),
                weir::state::state_memory_bytes() as f64 / 1e6
            ));
            bar.tick();
            last = (records, elapsed);
        }
    };
    bar.finish_and_clear();
    for note in &handle.notes()[notes_shown..] {
        eprintln!("{note}");
    }
    for failure in handle.checkpoint_failures() {
        eprintln!("{failure}");
    }
    result.map(Some)
}

fn run_default(args: &DefaultArgs) -> weir::Result<()> {
    let (config, parallelism) = args.runtime.config();
    let job = DefaultJob { parallelism, keys: args.keys, window_ms: args.window_ms, rate_per_s: args.rate };
    println!(
        "weir default job: generator → key_by ({} keys) → {} ms tumbling-window count → sink; {} workers, parallelism {}, {}, {} s",
        args.keys,
        args.window_ms,
        config.effective_workers(),
        parallelism,
        args.rate.map(|r| format!("{} events/s", group_digits(r as u64))).unwrap_or_else(|| "as fast as possible".into()),
        args.duration_s
    );
    let handle = announce_restores(job.build()).start(config)?;
    let report = supervise(handle, Some(Duration::from_secs_f64(args.duration_s)), !args.runtime.no_progress, None)?
        .expect("the default job stops without a savepoint");
    print!("{}", report.summary_table());
    if report.latency_ns.as_ref().is_some_and(|h| !h.is_empty()) {
        println!("latency: from the instant a window is complete (event time = creation time) to the sink");
    } else {
        println!("latency: no window fired (run longer than one window)");
    }
    Ok(())
}

fn list_checkpoints(args: &CheckpointsArgs) -> weir::Result<()> {
    let found = weir::checkpoint::inspect(&args.dir)?;
    if found.is_empty() {
        println!("no checkpoints in {}", args.dir.display());
        return Ok(());
    }
    let mut rows = Vec::new();
    let mut damaged = 0;
    for (name, status) in &found {
        let mut row = vec![name.clone()];
        match status {
            CheckpointStatus::Valid(m) => {
                row.push("valid".into());
                row.push(job_cell(m));
                row.extend(weir::checkpoint::stats_cells(&m.stats));
            }
            CheckpointStatus::Incomplete => {
                row.push("incomplete (no _metadata: never completed)".into());
                row.push(String::new());
                row.extend(std::iter::repeat_n(String::new(), weir::checkpoint::STATS_COLUMNS.len()));
            }
            CheckpointStatus::Damaged(reason) => {
                damaged += 1;
                row.push(format!("DAMAGED: {reason}"));
                row.push(String::new());
                row.extend(std::iter::repeat_n(String::new(), weir::checkpoint::STATS_COLUMNS.len()));
            }
            CheckpointStatus::Finished(f) => {
                let what = if f.description.is_empty() { String::new() } else { format!(": {}", f.description) };
                row.push(format!("the job '{}' finished{what}", f.job));
                row.push(String::new());
                row.extend(std::iter::repeat_n(String::new(), weir::checkpoint::STATS_COLUMNS.len()));
            }
        }
        rows.push(row);
    }
    let mut header = vec!["folder", "status", "job (its sinks' output)"];
    header.extend(weir::checkpoint::STATS_COLUMNS);
    print!("{}", weir::checkpoint::table(&header, &rows));
    if damaged > 0 {
        return Err(Error::Corrupt(format!(
            "{damaged} damaged checkpoint folder(s) or file(s) in {}",
            args.dir.display()
        )));
    }
    Ok(())
}

/// Whose a checkpoint is: the job's name, and where its sinks write.
fn job_cell(m: &weir::checkpoint::CheckpointMetadata) -> String {
    let outputs: Vec<String> = m.outputs.iter().map(|o| format!("{} → {}", o.operator, o.location)).collect();
    match outputs.is_empty() {
        true => format!("'{}'", m.job),
        false => format!("'{}' ({})", m.job, outputs.join(", ")),
    }
}

fn run_bench(args: &BenchArgs) -> weir::Result<()> {
    use weir_jobs::bench::{BenchConfig, BenchResult, CheckpointChoice};
    refuse_checkpoint_flags_without_checkpoints(
        args.checkpoint,
        &[
            ("--interval-ms", args.interval_ms.is_some()),
            ("--checkpoint-dir", args.checkpoint_dir.is_some()),
            ("--max-concurrent", args.max_concurrent.is_some()),
        ],
    )?;
    if args.alignment_timeout_ms.is_some() && args.checkpoint != CheckpointChoice::AlignedTimeout {
        return Err(Error::config(format!(
            "--alignment-timeout-ms needs --checkpoint aligned-timeout (not {})",
            args.checkpoint
        )));
    }
    if args.inflight_budget_bytes.is_some() && args.checkpoint != CheckpointChoice::Adaptive {
        return Err(Error::config(format!(
            "--inflight-budget-bytes needs --checkpoint adaptive (not {})",
            args.checkpoint
        )));
    }
    let interval_ms = args.interval_ms.unwrap_or(DEFAULT_BENCH_INTERVAL_MS);
    let (config, parallelism) = args.runtime.config();
    let temporary = args.checkpoint_dir.is_none() && args.checkpoint != CheckpointChoice::None;
    let checkpoint_dir = args.checkpoint_dir.clone().unwrap_or_else(|| scratch_checkpoint_dir("bench"));
    if let Some(json) = &args.json {
        // Refuse an unwritable destination before running for minutes.
        std::fs::write(json, b"").map_err(|e| Error::io("cannot write the JSON results", json, e))?;
    }
    let bench = BenchConfig {
        workload: args.workload,
        checkpoint: args.checkpoint,
        interval: Duration::from_millis(interval_ms),
        checkpoint_dir: checkpoint_dir.clone(),
        parallelism,
        rate: args.rate,
        keys: args.keys,
        sink_cost_ns: args.sink_cost_ns,
        alignment_timeout: args
            .alignment_timeout_ms
            .map_or(weir_jobs::bench::DEFAULT_ALIGNMENT_TIMEOUT, Duration::from_millis),
        max_concurrent: args.max_concurrent.unwrap_or(1) as usize,
        inflight_budget: args.inflight_budget_bytes.unwrap_or(weir_jobs::bench::DEFAULT_INFLIGHT_BUDGET),
    };
    println!(
        "weir bench: workload {}, checkpoints {}{}, {} workers, parallelism {}, {}, {} s",
        args.workload,
        args.checkpoint,
        if args.checkpoint == CheckpointChoice::None { String::new() } else { format!(" every {interval_ms} ms") },
        config.effective_workers(),
        parallelism,
        args.rate
            .map(|r| format!("{} events/s", group_digits(r as u64)))
            .unwrap_or_else(|| "as fast as possible".into()),
        args.duration_s
    );
    let handle = announce_restores(bench.job()?).start(config)?;
    let report = supervise(handle, Some(Duration::from_secs_f64(args.duration_s)), !args.runtime.no_progress, None);
    if temporary {
        let _ = std::fs::remove_dir_all(&checkpoint_dir);
    }
    let report = report?.expect("a benchmark stops without a savepoint");
    print!("{}", report.summary_table());
    if args.checkpoint != CheckpointChoice::None {
        println!("checkpoints completed: {}", report.checkpoints.len());
        if !report.checkpoints.is_empty() {
            print!("{}", weir::checkpoint::stats_table(&report.checkpoints));
        }
    }
    if let Some(json) = &args.json {
        let result = BenchResult::new(&bench, &report);
        std::fs::write(json, result.to_json()).map_err(|e| Error::io("cannot write the JSON results", json, e))?;
        println!("results: {}", json.display());
    }
    Ok(())
}

fn run_nexmark(args: &NexmarkArgs) -> weir::Result<()> {
    use weir_jobs::nexmark::{build, final_rows, reference};
    const MAX_CHECKED: u64 = 2_000_000;
    refuse_checkpoint_flags_without_checkpoints(
        args.checkpoint,
        &[("--interval-ms", args.interval_ms.is_some()), ("--incremental", args.incremental)],
    )?;
    if args.check && args.events > MAX_CHECKED {
        return Err(Error::config(format!(
            "--check computes the answer sequentially in memory: use at most {} events, not {}",
            group_digits(MAX_CHECKED),
            group_digits(args.events)
        )));
    }
    let q10 = args.query == weir_jobs::nexmark::Query::Q10;
    match (&args.output, q10) {
        (None, true) => {
            return Err(Error::config("q10 writes every bid to files: give the folder with --output DIR"));
        }
        (Some(_), false) => {
            return Err(Error::config(format!("--output is for q10, which writes files; {} does not", args.query)));
        }
        _ => {}
    }
    let (config, parallelism) = args.runtime.config();
    let workers = config.effective_workers();
    let mut job = weir::Job::new(format!("nexmark-{}", args.query)).with_parallelism(parallelism);
    let checkpoint_dir = scratch_checkpoint_dir("nexmark");
    let interval = Duration::from_millis(args.interval_ms.unwrap_or(DEFAULT_BENCH_INTERVAL_MS));
    if let Some(c) = args.checkpoint.config(
        &checkpoint_dir,
        interval,
        weir_jobs::bench::DEFAULT_ALIGNMENT_TIMEOUT,
        weir_jobs::bench::DEFAULT_INFLIGHT_BUDGET,
    ) {
        job = job.with_checkpointing(c.incremental(args.incremental));
    }
    let collected = match &args.output {
        Some(dir) => {
            weir_jobs::nexmark::write_q10(&job, Some(args.events), args.rate, dir);
            None
        }
        None => {
            let rows = build(&job, args.query, Some(args.events), args.rate);
            if args.check {
                Some(rows.collect())
            } else {
                rows.discard();
                None
            }
        }
    };
    println!(
        "weir nexmark {}: {} events, {} workers, parallelism {}, checkpoints {}{}",
        args.query,
        group_digits(args.events),
        workers,
        parallelism,
        args.checkpoint,
        if args.incremental { " (incremental)" } else { "" }
    );
    let report = supervise(announce_restores(job).start(config)?, None, !args.runtime.no_progress, None);
    let _ = std::fs::remove_dir_all(&checkpoint_dir);
    let report = report?.expect("no savepoint was asked for");
    print!("{}", report.summary_table());
    // Not the sources' records: q8 reads the event stream twice (people and auctions).
    let events_per_s = args.events as f64 / report.elapsed.as_secs_f64().max(1e-9);
    println!(
        "events per second: {} ({} per core)",
        group_digits(events_per_s as u64),
        group_digits((events_per_s / workers as f64) as u64)
    );
    if let Some(out) = collected {
        let got = final_rows(args.query, out.lock().unwrap_or_else(|e| e.into_inner()).clone());
        let expected = reference(args.query, args.events);
        if got != expected {
            return Err(Error::Checkpoint(format!(
                "{}: {} result rows differ from the sequential implementation's {}",
                args.query,
                got.len(),
                expected.len()
            )));
        }
        println!("check: {} result rows, the same as the sequential implementation", group_digits(got.len() as u64));
    }
    if let (Some(dir), true) = (&args.output, args.check) {
        let (got, expected) = (weir_jobs::nexmark::read_q10(dir)?, weir_jobs::nexmark::q10_reference(args.events));
        if got != expected {
            return Err(Error::Checkpoint(format!(
                "q10: the files under {} ({} partitions) differ from the sequential implementation's ({} partitions)",
                dir.display(),
                got.len(),
                expected.len()
            )));
        }
        let lines: usize = got.values().map(Vec::len).sum();
        println!(
            "check: {} lines in {} partitions, the same as the sequential implementation",
            group_digits(lines as u64),
            got.len()
        );
    }
    Ok(())
}

fn run_wordcount(args: &WordcountArgs) -> weir::Result<()> {
    let (config, parallelism) = args.runtime.config();
    let input = TextSource::open(&args.input)?.follow(args.follow);
    let output = std::path::absolute(&args.output)
        .map_err(|e| Error::io("cannot resolve the output folder", &args.output, e))?;
    let description = format!(
        "word count of {} into {}",
        std::path::absolute(&args.input).unwrap_or_else(|_| args.input.clone()).display(),
        output.display()
    );
    for (flag, other) in [
        ("--checkpoint-dir", args.checkpoints.checkpoint_dir.as_ref()),
        ("--savepoint-dir", args.checkpoints.savepoint_dir.as_ref()),
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
    let resuming =
        args.checkpoints.restore.is_some() || args.checkpoints.checkpoint_dir.as_ref().is_some_and(|d| d.exists());
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
    let bytes = input.total_bytes();
    let transactional = args.checkpoints.checkpoint_dir.is_some();
    let mut job = weir_jobs::wordcount::wordcount(input, args.output.clone(), parallelism, transactional)
        .with_description(description.clone());
    if let Some(c) = args.checkpoints.config()? {
        job = job.with_checkpointing(c);
    }
    if let Some(dir) = &args.checkpoints.checkpoint_dir {
        // A finished job is not run again; another job's finished directory is not reused.
        if let Some(finished) = weir::checkpoint::read_finished(dir)? {
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
    if let Some(dir) = &args.checkpoints.savepoint_dir {
        // Found out now, not when Ctrl-C asks for the savepoint.
        std::fs::create_dir_all(dir).map_err(|e| Error::io("cannot create the savepoint directory", dir, e))?;
    }
    if let Some(path) = &args.checkpoints.restore {
        job = job.restore_from(path, args.checkpoints.allow_non_restored_state);
    } else if args.checkpoints.allow_non_restored_state {
        return Err(Error::config("--allow-non-restored-state needs --restore"));
    }
    let handle = announce_restores(job).start(config)?;
    let Some(report) = supervise(handle, None, !args.runtime.no_progress, args.checkpoints.savepoint_dir.as_deref())?
    else {
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
    println!(
        "input: {} bytes ({:.1} MB/s); words: {}; output: {}/part-*{}",
        group_digits(bytes),
        bytes as f64 / secs / 1e6,
        group_digits(report.sink_records),
        args.output.display(),
        if transactional { " (committed files only; hidden ones are in progress)" } else { "" }
    );
    Ok(())
}

/// Runs the seeds; returns whether every one matched the golden run.
fn run_simulate(args: &SimulateArgs) -> weir::Result<bool> {
    use weir::simulation::{check, SimOptions};
    let scratch = std::env::temp_dir().join(format!("weir-simulate-input-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).map_err(|e| Error::io("cannot create a scratch folder", &scratch, e))?;
    let p = args.parallelism as usize;
    let build = args.job.builder(p, &scratch)?;
    let options = SimOptions {
        mode: args.mode,
        incremental: args.incremental,
        rescale: args.job.rescales(),
        ..SimOptions::default()
    };
    let started = std::time::Instant::now();
    let report = check(build, args.seeds.clone(), &options, args.job.expect(args.mode));
    let _ = std::fs::remove_dir_all(&scratch);
    let report = report?;
    let rerun = |seed: u64| {
        format!(
            "weir simulate --job {} --mode {}{} --parallelism {p} --seeds {seed}",
            args.job,
            args.mode,
            if args.incremental { " --incremental" } else { "" }
        )
    };
    for s in report.failing() {
        println!(
            "seed {}: {} (faults: {}); rerun: {}",
            s.seed,
            s.differs.as_deref().unwrap_or_default(),
            s.stats.faults.join("; "),
            rerun(s.seed)
        );
    }
    let elapsed = started.elapsed().as_secs_f64();
    println!("{}", report.summary());
    eprintln!(
        "{:.0} seeds/s; per seed on average {} steps, {:.1} failovers, {:.1} crashes, {:.1} checkpoints; {} checkpoints \
         resumed a failed one, reusing {} task parts; {} committed transactions withdrawn after damage; the golden \
         run: {} records, {} checkpoints",
        report.seeds.len() as f64 / elapsed.max(1e-9),
        report.seeds.iter().map(|s| s.stats.steps).sum::<u64>() / report.seeds.len() as u64,
        report.seeds.iter().map(|s| s.stats.failovers as f64).sum::<f64>() / report.seeds.len() as f64,
        report.seeds.iter().map(|s| s.stats.crashes as f64).sum::<f64>() / report.seeds.len() as f64,
        report.seeds.iter().map(|s| s.stats.checkpoints as f64).sum::<f64>() / report.seeds.len() as f64,
        report.seeds.iter().map(|s| s.stats.resumed).sum::<u64>(),
        report.seeds.iter().map(|s| s.stats.parts_reused).sum::<u64>(),
        report.seeds.iter().map(|s| s.stats.retractions).sum::<u64>(),
        report.golden_records,
        report.golden.checkpoints,
    );
    Ok(report.failing().count() == 0)
}
