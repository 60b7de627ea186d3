//! An operator's first hour with a real `weir` process and plain HTTP: the job's state tells
//! the truth (`/health` of a cancelled job said 200 "finished"; a failed one looked healthy),
//! Flink's REST paths answer where Flink users look, a stop asked for by trigger can be
//! followed to its savepoint after the job ended, savepoint roots hold against symbolic links,
//! and every wrong request gets a status and a JSON error while the job goes on.

use std::io::{Read, Write};
use std::path::Path;

use crate::common::{self, Running};
use crate::control::control;

/// One HTTP/1.1 request to `addr`: the status and the body.
fn http(addr: &str, method: &str, target: &str, body: Option<&str>) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let body = body.unwrap_or("");
    let kind = if body.is_empty() { String::new() } else { "Content-Type: application/json\r\n".to_string() };
    write!(
        s,
        "{method} {target} HTTP/1.1\r\nHost: {addr}\r\n{kind}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let status = answer.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    // Chunked bodies: the JSON is what lies between the first `{` and the last `}`.
    let json = match (body.find('{'), body.rfind('}')) {
        (Some(a), Some(b)) if a < b => body[a..=b].to_string(),
        _ => body,
    };
    (status, json)
}

fn value(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// A word count following a log (so it runs until told), with its endpoint; `flags` more.
fn followed(dir: &Path, flags: &[&str]) -> (Running, String) {
    let input = dir.join("log.txt");
    let lines: Vec<String> = (0..2000).map(|i| format!("w{} x{}", i % 50, i % 7)).collect();
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let base = ["--follow", "--interval-ms", "3600000", "--control", "127.0.0.1:0"];
    let flags = [&base[..], flags].concat();
    let mut job = Running::start(common::wordcount(&input, &dir.join("out"), &dir.join("chk"), &flags));
    job.wait_to_say("control endpoint: http://", 1);
    let addr = job.word_after("control endpoint: http://").unwrap();
    (job, addr)
}

fn stop(mut job: Running) {
    let _ = job.child.kill();
    let _ = job.child.wait();
}

/// `/health` said 200 "finished" for a cancelled job and `/job` had no state: a cancelled job
/// says so now, and a job that failed past its restart strategy answers 503 with its cause
/// (`weir control health` exits non-zero), while the endpoint lingers as told.
#[test]
fn the_job_state_tells_the_truth() {
    let dir = tempfile::tempdir().unwrap();
    let (job, addr) = followed(dir.path(), &["--control-linger", "1m"]);
    let (status, text) = http(&addr, "GET", "/health", None);
    assert_eq!((status, value(&text)["status"].as_str()), (200, Some("running")), "{text}");
    assert_eq!(value(&http(&addr, "GET", "/job", None).1)["state"], "RUNNING");
    let (ok, text) = control(&addr, &["cancel"]);
    assert!(ok && text.contains("cancelled"), "{text}");
    common::wait_until("the job cancelled", || value(&http(&addr, "GET", "/job", None).1)["state"] == "CANCELED");
    let (status, text) = http(&addr, "GET", "/health", None);
    assert_eq!((status, value(&text)["status"].as_str()), (200, Some("cancelled")), "{text}");
    let (status, text) = http(&addr, "POST", "/cancel", None);
    assert!(status == 409 && value(&text)["error"].as_str().unwrap().contains("ended already"), "{text}");
    stop(job);

    let dir = tempfile::tempdir().unwrap();
    let (job, addr) =
        followed(dir.path(), &["--control-linger", "60s", "--fail-every-words", "500", "--restart-strategy", "none"]);
    common::wait_until("the job failed", || http(&addr, "GET", "/health", None).0 == 503);
    let (_, text) = http(&addr, "GET", "/health", None);
    let health = value(&text);
    assert_eq!(health["status"], "failed", "{text}");
    assert!(health["last_failure"].as_str().unwrap().contains("injected failure"), "{text}");
    let job_text = http(&addr, "GET", "/job", None).1;
    let failure = &value(&job_text)["last_failure"];
    assert!(
        failure["cause"].as_str().unwrap().contains("injected failure") && failure["unix_ms"].as_u64() > Some(1 << 40)
    );
    // (Not `control`, which refuses a "panicked" in the answer: the cause says the operator did.)
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_weir")).args(["control", &addr, "health"]).output().unwrap();
    let text = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && text.contains("503") && text.contains("FAILED"), "{text}");
    stop(job);
}

/// `POST /jobs/JOB/stop` answered 202 with a request id, then the process exited, and every
/// poll of the id was refused: the savepoint's location was only in stdout. The endpoint now
/// serves until the outcome was read (no linger asked for), and then the process exits.
#[test]
fn a_stop_by_trigger_is_followed_to_its_savepoint() {
    let dir = tempfile::tempdir().unwrap();
    let (mut job, addr) = followed(dir.path(), &[]);
    let name = value(&http(&addr, "GET", "/jobs", None).1)["jobs"][0]["id"].as_str().unwrap().to_string();
    let target = dir.path().join("savepoints");
    let body = format!("{{\"targetDirectory\": \"{}\"}}", target.display());
    let (status, text) = http(&addr, "POST", &format!("/jobs/{name}/stop"), Some(&body));
    assert_eq!(status, 202, "{text}");
    let id = value(&text)["request-id"].as_str().unwrap().to_string();
    let mut answer = serde_json::Value::Null;
    common::wait_until("the stop completed", || {
        answer = value(&http(&addr, "GET", &format!("/jobs/{name}/savepoints/{id}"), None).1);
        answer["status"]["id"] == "COMPLETED"
    });
    let location = answer["operation"]["location"].as_str().unwrap_or_else(|| panic!("{answer}"));
    assert!(Path::new(location).join("_metadata").exists(), "{answer}");
    common::wait_until("the process to exit once the outcome was read", || job.child.try_wait().unwrap().is_some());
    assert!(job.child.wait().unwrap().success(), "{}", job.text.lock().unwrap());
}

/// Flink's paths were 404 or 405 (`/jobs`, `/jobs/overview`, `/jobs/:id`,
/// `/jobs/:id/checkpoints`), the history held completed rows only with trigger times relative to
/// the job's start, `counts` had no `restored`, and a malformed body got axum's plain text.
#[test]
fn flinks_rest_paths_answer_in_flinks_names() {
    let dir = tempfile::tempdir().unwrap();
    let (job, addr) = followed(dir.path(), &[]);
    let jobs = value(&http(&addr, "GET", "/jobs", None).1);
    assert_eq!(jobs["jobs"][0]["status"], "RUNNING", "{jobs}");
    let name = jobs["jobs"][0]["id"].as_str().unwrap().to_string();
    let overview = value(&http(&addr, "GET", "/jobs/overview", None).1);
    assert_eq!(overview["jobs"][0]["state"], "RUNNING", "{overview}");
    assert!(overview["jobs"][0]["start-time"].as_u64() > Some(1 << 40), "epoch milliseconds: {overview}");
    let details = value(&http(&addr, "GET", &format!("/jobs/{name}"), None).1);
    assert_eq!((details["jid"].as_str(), details["end-time"].as_i64()), (Some(name.as_str()), Some(-1)), "{details}");
    let (ok, text) = control(&addr, &["checkpoint"]);
    assert!(ok, "{text}");
    let (status, text) = http(&addr, "GET", &format!("/jobs/{name}/checkpoints"), None);
    let stats = value(&text);
    assert_eq!(status, 200, "{text}");
    assert_eq!(stats["counts"]["restored"], 0, "{text}");
    assert!(stats["counts"]["completed"].as_u64() >= Some(1), "{text}");
    let row = &stats["history"][0];
    assert_eq!(row["status"], "COMPLETED", "{text}");
    assert!(row["trigger_timestamp"].as_u64() > Some(1 << 40), "epoch milliseconds: {text}");
    assert_eq!(value(&http(&addr, "GET", "/checkpoints", None).1)["counts"], stats["counts"], "the old path stays");
    let config = value(&http(&addr, "GET", &format!("/jobs/{name}/checkpoints/config"), None).1);
    assert_eq!((config["mode"].as_str(), config["interval"].as_u64()), (Some("exactly_once"), Some(3_600_000)));

    // Hostile and wrong requests: a status and a JSON error each, and the job goes on.
    for (method, target, body, expected) in [
        ("GET", "/jobs/nobody".to_string(), None, 404),
        ("GET", "/jobs/nobody/checkpoints".to_string(), None, 404),
        ("GET", format!("/jobs/{name}/savepoints/0123456789abcdef"), None, 404),
        ("POST", format!("/jobs/{name}/stop"), Some("{\"targetDirectory\": "), 400),
        ("POST", format!("/jobs/{name}/savepoints"), Some("[1, 2]"), 400),
        ("POST", "/stop?dir=/tmp/x&drain=maybe".to_string(), None, 400),
        ("POST", "/config?min-pause-ms=1m30x".to_string(), None, 400),
        ("DELETE", "/jobs".to_string(), None, 405),
    ] {
        let (status, text) = http(&addr, method, &target, body);
        assert_eq!(status, expected, "{method} {target}: {text}");
        assert!(value(&text)["error"].is_string(), "{method} {target}: {text}");
    }
    // A duration as people write it.
    let (ok, text) = control(&addr, &["config", "min-pause-ms=1m30s"]);
    assert!(ok && text.contains("\"min-pause-ms\": 90000"), "{text}");
    assert_eq!(value(&http(&addr, "GET", "/health", None).1)["status"], "running");
    stop(job);
}

/// With `--control-savepoint-root ROOT` and a symbolic link `ROOT/link` to a folder elsewhere,
/// a savepoint into `ROOT/link` (or below it, by trigger or stop too) was taken, outside the
/// root. Folders are resolved as the operating system will: refused with 403, nothing written.
#[test]
fn a_link_inside_the_savepoint_root_does_not_lead_out_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let (root, elsewhere) = (dir.path().join("root"), dir.path().join("elsewhere"));
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, root.join("link")).unwrap();
    std::os::unix::fs::symlink(dir.path().join("nothing-yet"), root.join("dangling")).unwrap();
    let (job, addr) = followed(dir.path(), &["--control-savepoint-root", root.to_str().unwrap()]);
    let name = value(&http(&addr, "GET", "/jobs", None).1)["jobs"][0]["id"].as_str().unwrap().to_string();
    for folder in [root.join("link"), root.join("link/deep"), root.join("dangling"), root.join("dangling/deep")] {
        let f = folder.to_str().unwrap();
        let (status, text) = http(&addr, "POST", &format!("/savepoints?dir={f}"), None);
        assert!(status == 403 && text.contains("outside the folders the operator allowed"), "{f}: {text}");
        let (status, _) = http(&addr, "POST", &format!("/stop?dir={f}"), None);
        assert_eq!(status, 403, "{f}");
        let body = format!("{{\"target-directory\": \"{f}\"}}");
        let (status, _) = http(&addr, "POST", &format!("/jobs/{name}/savepoints"), Some(&body));
        assert_eq!(status, 403, "{f}");
    }
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0, "nothing is written outside the root");
    assert!(!dir.path().join("nothing-yet").exists());
    let (ok, text) = control(&addr, &["savepoint", root.join("inside").to_str().unwrap()]);
    assert!(ok && text.contains("savepoint-"), "a folder really inside is taken: {text}");
    stop(job);
}

/// The metrics a Flink user compares: `weir_operator_records_in_total{operator="words"}` counted
/// the source's blocks (9,182 against 114,800 lines); there was no in-progress checkpoints
/// gauge, no time of the last completed checkpoint (the alert every SRE writes), no restore
/// count, no job state, and watermark gauges had no unit.
#[test]
fn the_metrics_count_records_and_say_when_the_last_checkpoint_completed() {
    let dir = tempfile::tempdir().unwrap();
    let (job, addr) = followed(dir.path(), &[]);
    let sum = |text: &str, prefix: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum()
    };
    common::wait_until("every line counted into the words operator", || {
        let (_, text) = control(&addr, &["metrics"]);
        sum(&text, "weir_operator_records_in_total{job_name=\"wordcount\",operator=\"words\"") == 2000.0
    });
    let (ok, text) = control(&addr, &["checkpoint"]);
    assert!(ok, "{text}");
    let (_, text) = control(&addr, &["metrics"]);
    let now_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    let completed = sum(&text, "weir_last_checkpoint_completed_timestamp_seconds{");
    assert!((now_s - completed).abs() < 600.0, "seconds since the Unix epoch: {completed} against {now_s}");
    for series in [
        "weir_checkpoints_in_progress{",
        "weir_restores_total{",
        "weir_job_state{job_name=\"wordcount\",state=\"RUNNING\"} 1",
        "weir_job_state{job_name=\"wordcount\",state=\"FAILED\"} 0",
        "# TYPE weir_operator_watermark_lag_seconds gauge",
    ] {
        assert!(text.contains(series), "{series} in {text}");
    }
    stop(job);
}

/// The command: `wordcount --help` was one flat list of ~60 flags; `1m30s` was refused as a
/// duration.
#[test]
fn help_comes_in_headings_and_durations_read_as_people_write_them() {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_weir")).args(["wordcount", "--help"]).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    for heading in ["Input and output:", "Kafka:", "Runtime:", "Control:", "Checkpoints:", "State:", "Restarts:"] {
        assert!(text.lines().any(|l| l == heading), "{heading} in {text}");
    }
    let state = text.split("\nState:").nth(1).unwrap();
    assert!(state.trim_start().starts_with("--incremental"), "{text}");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["bench", "--duration-s", "0m0.5s", "--workers", "1", "--no-progress"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["bench", "--duration-s", "1m30x"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && text.contains("'1m30x'"), "{text}");
}

/// One bad combination of checkpoint settings, through each edge: the command's flags, a
/// configuration file, and a running job's keys at the control endpoint. The running job
/// took `checkpoint=aligned aligned-checkpoint-timeout-ms=5` and dropped the timeout, where
/// the flags refused it; every edge now refuses it in the same words.
#[test]
fn a_bad_checkpoint_setting_is_refused_in_the_same_words_at_every_edge() {
    let dir = tempfile::tempdir().unwrap();
    let weir = env!("CARGO_BIN_EXE_weir");
    let refusal = |text: &str| -> String {
        let at = text.find("invalid configuration: ").unwrap_or_else(|| panic!("a refusal: {text}"));
        text[at..].lines().next().unwrap().trim_end_matches('"').to_string()
    };
    for (mode, key, value) in
        [("aligned", "aligned-checkpoint-timeout-ms", "5"), ("unaligned", "inflight-budget-bytes", "4096")]
    {
        let flag = format!("--{key}");
        let o = std::process::Command::new(weir)
            .args(["bench", "--duration-s", "1", "--no-progress", "--checkpoint", mode, &flag, value])
            .output()
            .unwrap();
        let by_flags = refusal(&String::from_utf8_lossy(&o.stderr));
        let file = dir.path().join(format!("{mode}.toml"));
        std::fs::write(&file, format!("checkpoint = \"{mode}\"\n{key} = {value}\n")).unwrap();
        let o = std::process::Command::new(weir)
            .args(["bench", "--duration-s", "1", "--no-progress", "--config"])
            .arg(&file)
            .output()
            .unwrap();
        let by_file = refusal(&String::from_utf8_lossy(&o.stderr));
        let own = dir.path().join(mode);
        std::fs::create_dir_all(&own).unwrap();
        let (job, addr) = followed(&own, &["--checkpoint", "aligned"]);
        let (status, text) = http(&addr, "POST", &format!("/config?checkpoint={mode}&{key}={value}"), None);
        assert_eq!(status, 400, "{text}");
        let by_endpoint = refusal(value_of_error(&text).as_str());
        assert_eq!(by_flags, by_file, "flags and file");
        assert_eq!(by_flags, by_endpoint, "flags and the running job's keys");
        // Named in words, as the engine's one resolver names it whatever the edge.
        let named = if key.starts_with("aligned") { "aligned-checkpoint timeout" } else { "in-flight budget" };
        assert!(by_flags.contains(named) && by_flags.contains(mode), "{by_flags}");
        stop(job);
    }
}

fn value_of_error(text: &str) -> String {
    value(text)["error"].as_str().unwrap_or_else(|| panic!("{text}")).to_string()
}
