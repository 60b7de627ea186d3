//! The control endpoint (`--control`) driven by its client (`weir control ADDR …`) while a
//! word count runs: a checkpoint and a savepoint on demand, the live configuration changed
//! (and bad changes refused, the job going on), statistics and metrics, then a stop with a
//! savepoint that a new run resumes from; and the endpoint's bad addresses refused.

use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

use crate::common::{self, Running};

/// `weir control ADDR args…`: whether it succeeded, and what it printed (stdout, stderr).
/// `weir bench ARGS --control 127.0.0.1:0` running, and its endpoint's address.
pub(crate) fn bench_with_control(args: &[&str]) -> (Running, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_weir"));
    c.arg("bench").args(args).args(["--workers", "2", "--no-progress", "--control", "127.0.0.1:0"]);
    let mut job = Running::start(c);
    job.wait_to_say("control endpoint: http://", 1);
    let addr = job.word_after("control endpoint: http://").unwrap();
    (job, addr)
}

/// The value of the first sample whose line starts with `name` in the metrics of the endpoint
/// at `addr`.
pub(crate) fn metric(addr: &str, name: &str) -> f64 {
    let (ok, text) = control(addr, &["metrics"]);
    // Prometheus' text format (OpenMetrics only for a scraper that asks for it).
    assert!(ok && text.contains("# TYPE weir_source_records_total counter") && !text.contains("# EOF"), "{text}");
    let line = text.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{name} in {text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

pub(crate) fn control(addr: &str, args: &[&str]) -> (bool, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_weir")).arg("control").arg(addr).args(args).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(!text.contains("panicked"), "{text}");
    (o.status.success(), text)
}

/// A word count following a log of 2000 lines of two words (`distinct` different first
/// words), checkpointing only when asked, with its control endpoint.
struct FollowedLog {
    job: Running,
    addr: String,
    input: std::path::PathBuf,
    out: std::path::PathBuf,
    lines: Vec<String>,
}

impl FollowedLog {
    fn start(dir: &Path, distinct: usize, flags: &[&str]) -> FollowedLog {
        let input = dir.join("log.txt");
        let lines: Vec<String> = (0..2000).map(|i| format!("w{} x{}", i % distinct, i % 7)).collect();
        std::fs::write(&input, lines.join("\n") + "\n").unwrap();
        let (out, chk) = (dir.join("out"), dir.join("chk"));
        // Followed, the log keeps the job running until it is told to stop.
        let flags = [&["--follow", "--interval-ms", "3600000", "--control", "127.0.0.1:0"][..], flags].concat();
        let mut job = Running::start(common::wordcount(&input, &out, &chk, &flags));
        job.wait_to_say("control endpoint: http://", 1);
        let addr = job.word_after("control endpoint: http://").unwrap();
        FollowedLog { job, addr, input, out, lines }
    }
}

#[test]
fn a_running_job_is_checkpointed_reconfigured_and_stopped_from_outside() {
    let dir = tempfile::tempdir().unwrap();
    let f = FollowedLog::start(dir.path(), 50, &["--min-pause-ms", "7"]);
    let (mut job, addr, input, out, lines) = (f.job, f.addr, f.input, f.out, f.lines);

    let (ok, text) = control(&addr, &["checkpoint"]);
    assert!(ok && text.contains("\"checkpoint\":"), "{text}");
    let (_, text) = control(&addr, &["config"]);
    assert!(text.contains("\"min-pause-ms\": 7"), "the command's --min-pause-ms: {text}");
    assert!(text.contains("\"local-recovery\": true"), "local recovery is on by default: {text}");
    let (ok, text) = control(&addr, &["config", "interval-ms=200", "min-pause-ms=10"]);
    assert!(ok && text.contains("\"interval-ms\": 200") && text.contains("\"min-pause-ms\": 10"), "{text}");
    // A duration with its unit where milliseconds are.
    let (ok, text) = control(&addr, &["config", "min-pause-ms=0.01s"]);
    assert!(ok && text.contains("\"min-pause-ms\": 10"), "{text}");
    // Bad changes: refused whole, named, the job going on with its configuration.
    for (bad, says) in [
        ("bogus=1", "unknown configuration key 'bogus'"),
        ("interval-ms=soon", "interval-ms=soon: invalid type: string \"soon\""),
        ("interval-ms=2x", "'2x' has the unknown unit 'x'"),
        ("incremental=true", "fixed for the job's life"),
        ("local-recovery=false", "fixed for the job's life"),
        ("max-concurrent=0", "max-concurrent must be from 1 to 64, not 0"),
        ("mode=at-least-once", "fixed for the job's life"),
        ("checkpoint=at-least-once", "switches between aligned, unaligned"),
        // A value is a value: it cannot carry a second key (it did, as TOML text).
        ("retained=3\nmax-concurrent = 2", "retained=3\nmax-concurrent = 2: invalid type: string"),
    ] {
        let (ok, text) = control(&addr, &["config", "retain=9", bad]);
        assert!(!ok && text.contains(says) && text.contains("400"), "{bad}: {text}");
    }
    // The restart strategy is the running job's too (Flink's names).
    let (ok, text) = control(&addr, &["config", "restart-strategy=failure-rate", "restart-failures-per-interval=3"]);
    assert!(ok && text.contains("failure-rate: at most 3 failures in 60000 ms"), "{text}");
    let (ok, text) = control(&addr, &["config", "restart-attempts=2"]);
    assert!(!ok && text.contains("--restart-attempts needs --restart-strategy"), "{text}");
    let (_, text) = control(&addr, &["config"]);
    assert!(text.contains("\"retained\": 2") && text.contains("\"interval-ms\": 200"), "{text}");
    // A savepoint with the job running, and one whose folder cannot be made.
    let (ok, text) = control(&addr, &["savepoint", dir.path().join("sp").to_str().unwrap()]);
    assert!(ok && text.contains("savepoint-"), "{text}");
    let blocked = dir.path().join("file");
    std::fs::write(&blocked, "").unwrap();
    let (ok, text) = control(&addr, &["savepoint", blocked.join("sp").to_str().unwrap()]);
    assert!(!ok && text.contains("cannot create the savepoint directory"), "{text}");
    // Checkpoints come every 200 ms now (the hour's interval would have given none), and the
    // metrics count them and every word.
    let metric = |name: &str| metric(&addr, name);
    common::wait_until("checkpoints at the new interval", || metric("weir_checkpoints_completed_total") >= 5.0);
    common::wait_until("every word counted", || metric("weir_sink_records_total{job_name=\"wordcount\"}") == 4000.0);
    let (ok, text) = control(&addr, &["checkpoints"]);
    assert!(ok && text.contains("checkpoints completed: ") && text.contains("duration"), "{text}");
    // Per operator subtask: the counting operator received every word, over its subtasks.
    let (_, text) = control(&addr, &["metrics"]);
    let counted: f64 = text
        .lines()
        .filter(|l| l.starts_with("weir_operator_records_in_total{job_name=\"wordcount\",operator=\"count\""))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum();
    assert_eq!(counted, 4000.0, "{text}");
    // And the words the splitting operator sent into the keyed exchange, per subtask.
    let sent: f64 = text
        .lines()
        .filter(|l| l.starts_with("weir_operator_records_out_total{job_name=\"wordcount\",operator=\"words\""))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum();
    assert_eq!(sent, 4000.0, "{text}");
    let (ok, text) = control(&addr, &["job"]);
    assert!(ok && text.contains("\"finished\": false"), "{text}");
    let (ok, text) = control(&addr, &["nonsense"]);
    assert!(!ok && text.contains("unexpected argument 'nonsense'"), "{text}");

    // Stopped with a savepoint: the process ends, and a new run resumes from it.
    let sp = dir.path().join("final");
    let (ok, text) = control(&addr, &["stop", sp.to_str().unwrap()]);
    assert!(ok && text.contains("savepoint-"), "{text}");
    let status = job.child.wait().unwrap();
    assert!(status.success() && job.said("stopped with savepoint") == 1, "{}", job.text.lock().unwrap());
    let (ok, text) = control(&addr, &["job"]);
    assert!(!ok && text.contains("cannot reach the control endpoint"), "{text}");
    let savepoint = std::fs::read_dir(&sp).unwrap().next().unwrap().unwrap().path();
    assert!(savepoint.join("_metadata").exists());
    let resumed =
        common::wordcount(&input, &out, &dir.path().join("chk2"), &["--restore", savepoint.to_str().unwrap()])
            .output()
            .unwrap();
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
    let mut expected = std::collections::HashMap::new();
    for w in lines.iter().flat_map(|l| l.split(' ')) {
        *expected.entry(w.to_string()).or_insert(0u64) += 1;
    }
    crate::crash::check_exactly_once(&expected, &out, "resumed from the stop's savepoint");
}

/// The state bytes and bytes written of checkpoint `id` in `weir control ADDR checkpoints`'s
/// table (columns: id, duration, start delay, alignment, sync, async, state bytes, written, …).
fn state_and_written(table: &str, id: u64) -> (u64, u64) {
    let row = table
        .lines()
        .map(|l| l.split('|').map(str::trim).collect::<Vec<_>>())
        .find(|cells| cells.get(1) == Some(&id.to_string().as_str()))
        .unwrap_or_else(|| panic!("checkpoint {id} in {table}"));
    let number = |c: &str| c.replace(',', "").parse::<u64>().unwrap();
    (number(row[7]), number(row[8]))
}

/// A user of incremental checkpoints could not ask for a full one (Flink's `flink checkpoint
/// --full`): `weir control ADDR checkpoint --full` writes every byte of the state, the
/// incremental ones around it only what changed.
#[test]
fn a_full_checkpoint_of_an_incremental_job_on_demand() {
    let dir = tempfile::tempdir().unwrap();
    let FollowedLog { mut job, addr, .. } = FollowedLog::start(dir.path(), 500, &["--incremental"]);
    common::wait_until("every word counted", || {
        metric(&addr, "weir_sink_records_total{job_name=\"wordcount\"}") == 4000.0
    });
    let take = |args: &[&str]| -> u64 {
        let (ok, text) = control(&addr, &[&["checkpoint"][..], args].concat());
        assert!(ok, "{text}");
        let id = text.split("\"checkpoint\":").nth(1).unwrap().trim().trim_end_matches('}').trim();
        id.parse().unwrap_or_else(|_| panic!("{text}"))
    };
    let first = take(&[]);
    let unchanged = take(&["--incremental"]);
    let full = take(&["--full"]);
    let after = take(&[]);
    let (_, table) = control(&addr, &["checkpoints"]);
    let (state, written) = state_and_written(&table, unchanged);
    assert!(state > 0 && written < state / 4, "incremental, nothing changed: wrote {written} of {state}: {table}");
    let (state, written) = state_and_written(&table, full);
    assert!(state > 0 && written == state, "full: wrote {written} of {state}: {table}");
    let (state, written) = state_and_written(&table, after);
    assert!(written < state / 4, "incremental again after the full one: wrote {written} of {state}: {table}");
    assert!(first < unchanged && unchanged < full && full < after);
    job.child.kill().unwrap();
    let _ = job.child.wait();

    // A job whose checkpoints are not incremental refuses an incremental one, and goes on.
    let (mut plain, addr) =
        bench_with_control(&["--checkpoint", "aligned", "--interval-ms", "3600000", "--duration-s", "60"]);
    let (ok, text) = control(&addr, &["checkpoint", "--incremental"]);
    assert!(!ok && text.contains("409") && text.contains("not incremental"), "{text}");
    let (ok, text) = control(&addr, &["checkpoint", "--full"]);
    assert!(ok && text.contains("\"checkpoint\":"), "a full checkpoint of a job taking full ones: {text}");
    plain.child.kill().unwrap();
    let _ = plain.child.wait();
}

#[test]
fn bad_control_addresses_are_refused_before_the_job_runs() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.txt");
    std::fs::write(&input, "a b\n").unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().unwrap().to_string();
    for (i, (flags, says)) in [
        (vec!["--control", "0.0.0.0:0"], "is not on loopback"),
        (vec!["--control", taken.as_str()], "cannot serve the control endpoint at"),
        (vec!["--control", "nowhere"], "is not HOST:PORT"),
        (vec!["--control-public"], "--control <HOST:PORT>"),
    ]
    .into_iter()
    .enumerate()
    {
        let out = dir.path().join(format!("out{i}"));
        let o = common::wordcount(&input, &out, &dir.path().join(format!("chk{i}")), &flags).output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(!o.status.success() && text.contains(says) && !text.contains("panicked"), "{flags:?}: {text}");
    }
    assert!(!Path::new(&dir.path().join("out0")).exists());
}

/// A program's own job under `weir_ops::Runner`: the control endpoint takes a checkpoint and
/// stops it with a savepoint, and the run says it stopped so.
#[test]
fn a_programs_own_job_gets_the_commands_handling() {
    use weir::checkpoint::CheckpointConfig;
    use weir::source::Generator;
    let dir = tempfile::tempdir().unwrap();
    let job = weir::Job::new("mine").with_parallelism(2).with_checkpointing(
        CheckpointConfig::new(dir.path().join("chk")).interval(std::time::Duration::from_secs(3600)),
    );
    job.generator(Generator::new(|i, _| i).count(u64::MAX).rate(10_000.0)).discard();
    let binding = weir_ops::control::ControlBinding::bind("127.0.0.1:0", weir_ops::control::Reach::Loopback).unwrap();
    let addr = binding.addr().to_string();
    let run = std::thread::spawn(move || {
        weir_ops::Runner::new().control_at(binding).quiet(true).run(job, weir::RunConfig::default().workers(2))
    });
    let (ok, text) = control(&addr, &["checkpoint"]);
    assert!(ok && text.contains("\"checkpoint\": 1"), "{text}");
    let sp = dir.path().join("sp");
    let (ok, text) = control(&addr, &["stop", sp.to_str().unwrap()]);
    assert!(ok && text.contains("savepoint-2"), "{text}");
    assert!(run.join().unwrap().unwrap().is_none(), "stopped with a savepoint: no report");
    assert!(sp.join("savepoint-2").join("_metadata").exists());
}

/// Latency stayed empty until subtasks ended: a running benchmark's metrics now carry its
/// latency histograms while it runs, in all and by what the tasks did for checkpoints while
/// each record was in flight (buckets, which add up over subtasks and processes, where a
/// summary's quantiles did not).
#[test]
fn latency_is_in_the_metrics_while_the_job_runs() {
    let (mut job, addr) = bench_with_control(&[
        "--workload",
        "window",
        "--checkpoint",
        "aligned",
        "--interval-ms",
        "100",
        "--duration-s",
        "120",
    ]);
    common::wait_until("latency in the metrics", || {
        let (_, text) = control(&addr, &["metrics"]);
        text.contains("# TYPE weir_latency_seconds histogram")
            && text.contains("weir_latency_seconds_bucket{le=\"0.001\",job_name=\"default\"}")
            && text.contains("weir_latency_by_cause_seconds_bucket{le=\"+Inf\",job_name=\"default\",cause=\"nothing\"}")
    });
    let (ok, text) = control(&addr, &["job"]);
    assert!(ok && text.contains("\"finished\": false"), "still running: {text}");
    job.child.kill().unwrap();
    job.child.wait().unwrap();
}

/// Backpressure, as the metrics show it: the slow sink of the backpressure workload keeps the
/// input rings of its task (rebalance → latency → sink, chained: named by its first operator)
/// full.
#[test]
fn the_metrics_show_where_the_rings_are_full() {
    let (mut job, addr) = bench_with_control(&["--workload", "backpressure", "--duration-s", "120"]);
    common::wait_until("a full input ring at the sink", || {
        let (_, text) = control(&addr, &["metrics"]);
        text.lines()
            .filter(|l| {
                l.starts_with("weir_input_ring_fill_ratio{job_name=\"bench-backpressure\",operator=\"rebalance")
            })
            .any(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap() > 0.9)
    });
    job.child.kill().unwrap();
    job.child.wait().unwrap();
}

/// Records out and watermark lag per operator subtask, as the metrics show them on the window
/// workload: the generator's subtasks send every record they make, and the window count's
/// subtasks say how far each is behind the most advanced watermark (one of them is it).
#[test]
fn the_metrics_show_records_out_and_watermark_lag() {
    let (mut job, addr) = bench_with_control(&["--workload", "window", "--duration-s", "120"]);
    let samples = |text: &str, prefix: &str| -> Vec<f64> {
        text.lines().filter(|l| l.starts_with(prefix)).map(|l| l.rsplit(' ').next().unwrap().parse().unwrap()).collect()
    };
    common::wait_until("records out and watermark lag", || {
        let (_, text) = control(&addr, &["metrics"]);
        let out = samples(&text, "weir_operator_records_out_total{job_name=\"default\"");
        let lag = samples(&text, "weir_operator_watermark_lag_seconds{job_name=\"default\",operator=\"window-count\"");
        out.iter().sum::<f64>() > 0.0 && lag.len() == 2 && lag.contains(&0.0)
    });
    job.child.kill().unwrap();
    job.child.wait().unwrap();
}

/// Restarts and their causes from outside: a word count whose counting operator fails every
/// 500 words (the testing feature's failure point) restarts, and `weir control ADDR job`
/// says how often and why.
#[test]
fn the_endpoint_says_why_a_job_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let FollowedLog { mut job, addr, .. } = FollowedLog::start(dir.path(), 50, &["--fail-every-words", "500"]);
    common::wait_until("a restart", || metric(&addr, "weir_restarts_total") >= 1.0);
    // (Not `control`: the cause says the operator panicked, as the injected failure does.)
    let o = Command::new(env!("CARGO_BIN_EXE_weir")).args(["control", &addr, "job"]).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && text.contains("\"restart_causes\"") && text.contains("restart 1 after:"), "{text}");
    assert!(text.contains("injected failure at record"), "the cause: {text}");
    job.child.kill().unwrap();
    let _ = job.child.wait();
}

/// Two stop requests at once: the job stopped with the first one's savepoint, the second
/// never got an answer, and the process did not exit (up to an hour). Both are answered now,
/// and the process ends.
#[test]
fn two_stop_requests_at_once_are_both_answered_and_the_process_exits() {
    let dir = tempfile::tempdir().unwrap();
    let f = FollowedLog::start(dir.path(), 50, &[]);
    let (mut job, addr) = (f.job, f.addr);
    let answers = Arc::new(Mutex::new(Vec::new()));
    for name in ["first", "second"] {
        let (addr, answers, sp) = (addr.clone(), Arc::clone(&answers), dir.path().join(name));
        std::thread::spawn(move || {
            let answer = control(&addr, &["stop", sp.to_str().unwrap()]);
            answers.lock().unwrap().push(answer);
        });
    }
    common::wait_until("both stop requests answered", || answers.lock().unwrap().len() == 2);
    let answers = answers.lock().unwrap().clone();
    let stopped = answers.iter().filter(|(ok, text)| *ok && text.contains("savepoint-")).count();
    assert_eq!(stopped, 1, "one stop carried out: {answers:?}");
    let (_, refused) = answers.iter().find(|(ok, _)| !ok).expect("one refused");
    assert!(refused.contains("409"), "{refused}");
    common::wait_until("the process to exit", || job.child.try_wait().unwrap().is_some());
    assert!(job.child.wait().unwrap().success(), "{}", job.text.lock().unwrap());
}

/// `POST /savepoints?dir=` took the job's own output folder (savepoint files among committed
/// output: malformed lines and torn files for a reader) and its checkpoint directory, which
/// `--savepoint-dir` refuses; `dir=%FF%FE` made a folder named `��`. Refused, naming why,
/// and nothing is written there.
#[test]
fn a_savepoint_into_the_jobs_own_folders_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let f = FollowedLog::start(dir.path(), 50, &[]);
    let (mut job, addr) = (f.job, f.addr);
    for (folder, says) in [
        (f.out.join("sp"), "overlaps the job's output folder"),
        (f.out.clone(), "overlaps the job's output folder"),
        (dir.path().join("chk"), "overlaps the job's checkpoint directory"),
        (dir.path().to_path_buf(), "overlaps the job's"),
    ] {
        let (ok, text) = control(&addr, &["savepoint", folder.to_str().unwrap()]);
        assert!(!ok && text.contains(says) && text.contains("409"), "{}: {text}", folder.display());
    }
    assert!(!f.out.join("sp").exists());
    // Bytes that are no text, as a hostile client sends them.
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    write!(s, "POST /savepoints?dir=%FF%FE HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 400") && answer.contains("not valid UTF-8"), "{answer}");
    let (ok, text) = control(&addr, &["savepoint", dir.path().join("elsewhere").to_str().unwrap()]);
    assert!(ok && text.contains("savepoint-"), "the job goes on and takes one elsewhere: {text}");
    job.child.kill().unwrap();
    job.child.wait().unwrap();
}

/// An operator's bounds on the endpoint: with `--control-savepoint-root`, a savepoint into a
/// folder elsewhere (or with a `..` out of the root) is refused with 403, nothing is written
/// there, and the job goes on; one inside is taken. Then Flink's `stop --drain`: the followed
/// log's stream ends, the job finishes with every count committed, and its final checkpoint
/// is the savepoint.
#[test]
fn savepoints_stay_under_the_allowed_root_and_a_stop_with_a_drain_commits_everything() {
    let dir = tempfile::tempdir().unwrap();
    let allowed = dir.path().join("allowed");
    let f = FollowedLog::start(dir.path(), 50, &["--control-savepoint-root", allowed.to_str().unwrap()]);
    let (mut job, addr) = (f.job, f.addr);
    let elsewhere = dir.path().join("elsewhere");
    for (folder, says) in [
        (elsewhere.clone(), "outside the folders the operator allowed"),
        (allowed.join("..").join("elsewhere"), "has a '..' in it"),
    ] {
        let (ok, text) = control(&addr, &["savepoint", folder.to_str().unwrap()]);
        assert!(!ok && text.contains("403") && text.contains(says), "{}: {text}", folder.display());
        let (ok, text) = control(&addr, &["stop", folder.to_str().unwrap()]);
        assert!(!ok && text.contains("403"), "{text}");
    }
    assert!(!elsewhere.exists(), "nothing is written outside the root");
    let (ok, text) = control(&addr, &["savepoint", allowed.join("sp").to_str().unwrap()]);
    assert!(ok && text.contains("savepoint-"), "inside the root: {text}");

    let (ok, text) = control(&addr, &["stop", allowed.join("drained").to_str().unwrap(), "--drain"]);
    assert!(ok && text.contains("savepoint-"), "{text}");
    let status = job.child.wait().unwrap();
    assert!(status.success() && job.said("drained: every window fired") == 1, "{}", job.text.lock().unwrap());
    let savepoint = std::fs::read_dir(allowed.join("drained")).unwrap().next().unwrap().unwrap().path();
    assert!(savepoint.join("_metadata").exists());
    let mut expected = std::collections::HashMap::new();
    for w in f.lines.iter().flat_map(|l| l.split(' ')) {
        *expected.entry(w.to_string()).or_insert(0u64) += 1;
    }
    crate::crash::check_exactly_once(&expected, &f.out, "drained");
}

/// A bench within a state memory budget of a fraction of its state: the endpoint shows the
/// budget (read-only: a change is refused) and Prometheus' families count pages leaving memory
/// and coming back.
#[test]
fn a_state_memory_budget_is_shown_and_its_pages_counted_at_the_endpoint() {
    let (mut job, addr) = bench_with_control(&[
        "--workload",
        "keyed",
        "--keys",
        "400000",
        "--state-memory",
        "4MiB",
        "--checkpoint",
        "aligned",
        "--duration-s",
        "120",
    ]);
    common::wait_until("pages faulted back", || metric(&addr, "weir_state_page_faults_total") > 100.0);
    assert_eq!(metric(&addr, "weir_state_memory_limit_bytes"), 4.0 * 1024.0 * 1024.0);
    assert!(metric(&addr, "weir_state_page_evictions_total") > 100.0);
    assert!(metric(&addr, "weir_state_spilled_bytes") > 0.0);
    let (ok, text) = control(&addr, &["config"]);
    assert!(ok && text.contains("\"state-memory\": 4194304"), "{text}");
    let (ok, text) = control(&addr, &["config", "state-memory=1GiB"]);
    assert!(!ok && text.contains("state-memory is fixed for the job's life"), "{text}");
    job.child.kill().unwrap();
    job.child.wait().unwrap();
}
