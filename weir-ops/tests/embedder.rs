//! A program's own job, served by the control endpoint this crate gives it: the metrics text
//! and the dashboard over HTTP, a checkpoint on demand, with nothing of the `weir` command.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use weir::checkpoint::CheckpointConfig;
use weir::source::Generator;
use weir::{Job, RunConfig};
use weir_ops::ControlEndpoint;

/// One HTTP/1.1 request, the whole answer (status line, headers and body) as text.
fn request(addr: SocketAddr, method: &str, path: &str) -> String {
    request_with(addr, method, path, "")
}

/// [`request`] with a JSON `body`.
fn request_with(addr: SocketAddr, method: &str, path: &str, body: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let kind = if body.is_empty() { "" } else { "Content-Type: application/json\r\n" };
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{kind}Content-Length: {}\r\nConnection: close",
        body.len()
    );
    write!(s, "{head}\r\n\r\n{body}").unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    answer
}

/// A job named `name` that runs until stopped (checkpoints only on demand), its checkpoint
/// folder and the control endpoint serving it.
fn running(name: &str) -> (tempfile::TempDir, weir::JobHandle, ControlEndpoint) {
    let dir = tempfile::tempdir().unwrap();
    let job = Job::new(name).with_checkpointing(CheckpointConfig::new(dir.path()).interval(Duration::from_secs(3600)));
    job.generator(Generator::new(|i, _| (i % 7, 1u64)).count(u64::MAX))
        .key_by(|&(k, _)| k)
        .reduce(|a, b| (a.0, a.1 + b.1))
        .discard();
    let handle = job.start(RunConfig::default().workers(2)).unwrap();
    let endpoint =
        ControlEndpoint::start("127.0.0.1:0", weir_ops::control::Reach::Loopback, handle.controller()).unwrap();
    (dir, handle, endpoint)
}

/// The JSON body of an answer.
fn body(answer: &str) -> serde_json::Value {
    let text = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {answer}"))
}

/// Flink's REST model for what takes long: a savepoint asked for answers at once with a
/// request id to poll (it held the connection until done, up to an hour); a health check;
/// `/checkpoints` with counts, a summary and the latest of each; cancel. Requests for another
/// job are refused with a status and a JSON error, the job going on.
#[test]
fn savepoints_by_trigger_health_checkpoint_summary_and_cancel() {
    let (dir, handle, endpoint) = running("rest-job");
    let addr = endpoint.addr();

    let health = request(addr, "GET", "/health");
    assert!(health.starts_with("HTTP/1.1 200") && body(&health)["status"] == "running", "{health}");

    let sp = dir.path().join("savepoints");
    let asked = format!("{{\"target-directory\": \"{}\"}}", sp.display());
    let trigger = request_with(addr, "POST", "/jobs/rest-job/savepoints", &asked);
    assert!(trigger.starts_with("HTTP/1.1 202"), "answered at once: {trigger}");
    let id = body(&trigger)["request-id"].as_str().unwrap().to_string();
    let mut status = serde_json::Value::Null;
    for _ in 0..12_000 {
        status = body(&request(addr, "GET", &format!("/jobs/rest-job/savepoints/{id}")));
        if status["status"]["id"] == "COMPLETED" {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let location = status["operation"]["location"].as_str().unwrap_or_else(|| panic!("{status}"));
    assert!(std::path::Path::new(location).join("_metadata").exists(), "{status}");

    let other = request_with(addr, "POST", "/jobs/other/savepoints", &asked);
    assert!(
        other.starts_with("HTTP/1.1 404") && body(&other)["error"].as_str().unwrap().contains("rest-job"),
        "{other}"
    );
    let unknown = request(addr, "GET", "/jobs/rest-job/savepoints/nothing");
    assert!(unknown.starts_with("HTTP/1.1 404"), "{unknown}");

    assert!(request(addr, "POST", "/checkpoints").starts_with("HTTP/1.1 200"));
    let checkpoints = body(&request(addr, "GET", "/checkpoints"));
    assert_eq!(checkpoints["counts"]["completed"], 2, "the savepoint and the checkpoint: {checkpoints}");
    assert_eq!(checkpoints["counts"]["in_progress"], 0, "none pending between requests: {checkpoints}");
    let duration = &checkpoints["summary"]["end_to_end_duration_ms"];
    assert!(duration["min"].as_f64() <= duration["max"].as_f64() && duration["p99"].as_f64() > Some(0.0), "{duration}");
    assert_eq!(checkpoints["latest"]["completed"]["id"], 2, "{checkpoints}");
    assert_eq!(checkpoints["latest"]["savepoint"]["location"], location, "{checkpoints}");

    // Hostile requests: a wrong method, an unknown path, a huge query string — each a status
    // and a JSON error, the job going on.
    let wrong = request(addr, "DELETE", "/job");
    assert!(wrong.starts_with("HTTP/1.1 405") && body(&wrong)["error"].as_str().unwrap().contains("DELETE"), "{wrong}");
    let unknown_path = request(addr, "GET", "/nothing/here");
    assert!(unknown_path.starts_with("HTTP/1.1 404") && body(&unknown_path)["error"].is_string(), "{unknown_path}");
    let long = request(addr, "POST", &format!("/config?{}={}", "k".repeat(15_000), "v".repeat(15_000)));
    assert!(long.starts_with("HTTP/1.1 400") && body(&long)["error"].is_string(), "{}", &long[..long.len().min(300)]);
    // Past 64 KB the HTTP server answers before the endpoint sees it: a status, no body.
    let huge = request(addr, "POST", &format!("/config?k={}", "v".repeat(100_000)));
    assert!(huge.starts_with("HTTP/1.1 414"), "{}", &huge[..huge.len().min(300)]);
    let health = request(addr, "GET", "/health");
    assert!(health.starts_with("HTTP/1.1 200") && body(&health)["status"] == "running", "{health}");

    let cancel = request(addr, "PATCH", "/jobs/rest-job?mode=cancel");
    assert!(cancel.starts_with("HTTP/1.1 202"), "{cancel}");
    assert!(matches!(handle.join(), Err(weir::Error::Cancelled)));
}

#[test]
fn a_programs_own_job_serves_its_metrics_and_dashboard() {
    let (_dir, handle, endpoint) = running("own-job");
    let addr = endpoint.addr();

    let page = request(addr, "GET", "/");
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.contains("<title>weir dashboard</title>"), "the dashboard page: {}", &page[..page.len().min(400)]);

    let checkpoint = request(addr, "POST", "/checkpoints");
    assert!(
        checkpoint.starts_with("HTTP/1.1 200") && checkpoint.replace(" ", "").contains("\"checkpoint\":1"),
        "{checkpoint}"
    );

    let metrics = request(addr, "GET", "/metrics");
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    let records = metrics
        .lines()
        .find(|l| l.starts_with("weir_source_records_total"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no weir_source_records_total in {metrics}"));
    assert!(records > 0.0, "the running job's records: {records}");
    assert!(metrics.contains("own-job"), "the job's name labels its series: {metrics}");
    assert!(metrics.contains("weir_checkpoints_completed_total"), "{metrics}");

    drop(endpoint);
    handle.stop();
    handle.join().unwrap();
}

/// A service that already serves HTTP had to open a second port: `ControlEndpoint::start`
/// started its own server and `router()` was private. The endpoint's routes now mount in the
/// program's own axum server, beside its own routes, with options by name; stops with a
/// savepoint, which only the job's handle can carry out, are refused with a JSON error unless
/// the program takes them.
#[test]
fn the_endpoint_mounts_in_the_programs_own_server() {
    let dir = tempfile::tempdir().unwrap();
    let job =
        Job::new("mounted").with_checkpointing(CheckpointConfig::new(dir.path()).interval(Duration::from_secs(3600)));
    job.generator(Generator::new(|i, _| i).count(u64::MAX)).discard();
    let handle = job.start(RunConfig::default().workers(1)).unwrap();
    let allowed = dir.path().join("allowed");
    let options = weir_ops::control::ControlOptions::new().savepoint_roots([allowed.to_str().unwrap()]);
    let app = axum::Router::new()
        .route("/own", axum::routing::get(|| async { "the program's own" }))
        .nest("/weir", weir_ops::control::router(handle.controller(), options));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_io().build().unwrap();
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    runtime.spawn(async move { axum::serve(listener, app).await });

    assert!(request(addr, "GET", "/own").ends_with("the program's own"));
    let job = request(addr, "GET", "/weir/job");
    assert!(job.starts_with("HTTP/1.1 200") && body(&job)["state"] == "RUNNING", "{job}");
    let outside = request(addr, "POST", &format!("/weir/savepoints?dir={}", dir.path().join("x").display()));
    assert!(outside.starts_with("HTTP/1.1 403"), "the options hold: {outside}");
    let stop = request(addr, "POST", &format!("/weir/stop?dir={}", allowed.display()));
    assert!(stop.starts_with("HTTP/1.1 409"), "{stop}");
    assert!(body(&stop)["error"].as_str().unwrap().contains("stop_requests"), "{stop}");
    let taken = request(addr, "POST", &format!("/weir/savepoints?dir={}", allowed.display()));
    assert!(taken.starts_with("HTTP/1.1 200") && body(&taken)["savepoint"].is_string(), "{taken}");
    handle.cancel();
    assert!(handle.join().is_err());
    drop(runtime);
}

/// `weir-ops` needed a C compiler (ring, through the object store's TLS) though README said
/// "no C build": without its `object-store` feature nothing in its build compiles C.
#[test]
fn weir_ops_builds_without_a_c_compiler_unless_asked() {
    let tree = |features: &[&str]| {
        let o = std::process::Command::new(env!("CARGO"))
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(["tree", "--offline", "-p", "weir-ops", "-e", "normal,build", "--prefix", "none"])
            .args(features)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    let builds_c = |tree: &str| tree.lines().any(|l| l.starts_with("cc v"));
    assert!(!builds_c(&tree(&[])), "{}", tree(&[]));
    assert!(builds_c(&tree(&["--features", "object-store"])), "the check can see a C build");
}
