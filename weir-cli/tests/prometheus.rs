//! The metrics as a real Prometheus takes them: Debian's `prometheus` (which `.ci/run`
//! installs, naming it in `WEIR_TEST_PROMETHEUS` so that there its absence fails instead of
//! skipping) scrapes a running job's `/metrics` on loopback, and its query API returns the
//! job's series with the scrape's `job` label and the job's own `job_name`; its `promtool
//! check metrics` passes the text. (The OpenMetrics parser refused the old text: "Clashing
//! name: weir_source_records_total".)

use std::path::Path;
use std::process::{Command, Stdio};

use crate::common;
use crate::control::{bench_with_control, control};

/// Prometheus' binary: `WEIR_TEST_PROMETHEUS`, or `prometheus` on the path.
fn prometheus() -> Option<String> {
    if let Ok(path) = std::env::var("WEIR_TEST_PROMETHEUS") {
        return Some(path);
    }
    let found = Command::new("sh").args(["-c", "command -v prometheus"]).output().ok()?;
    found.status.success().then(|| String::from_utf8_lossy(&found.stdout).trim().to_string())
}

/// The body of the server at `addr`'s answer to `GET path` (empty if it does not answer).
fn get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(addr) else { return String::new() };
    let mut answer = String::new();
    let _ = write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").and_then(|_| s.read_to_string(&mut answer));
    answer.split_once("\r\n\r\n").map_or(String::new(), |(_, body)| body.to_string())
}

#[test]
fn a_real_prometheus_scrapes_the_job_and_returns_its_series() {
    let Some(prometheus) = prometheus() else {
        common::did_not_run(
            "prometheus::a_real_prometheus_scrapes_the_job_and_returns_its_series",
            "no prometheus on the path (apt-get install prometheus; .ci/run installs it)",
        );
        return;
    };
    let (mut job, addr) =
        bench_with_control(&["--workload", "window", "--checkpoint", "aligned", "--duration-s", "120"]);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: weir\n    static_configs:\n      - targets: \
             ['{addr}']\n"
        ),
    )
    .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let web = format!("127.0.0.1:{port}");
    let mut server = Command::new(&prometheus)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
        .arg(format!("--web.listen-address={web}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The scrape's series: the job's records (a counter), its latency histogram's buckets and
    // its last checkpoint's duration in seconds, each with the scrape's `job` and the job's
    // `job_name`.
    let series = |query: &str| get(&web, &format!("/api/v1/query?query={query}"));
    common::wait_until("Prometheus has scraped the job's series", || {
        let records = series("weir_source_records_total");
        let buckets = series("weir_latency_seconds_bucket");
        let duration = series("weir_last_checkpoint_duration_seconds");
        [&records, &buckets, &duration]
            .iter()
            .all(|s| s.contains("\"job\":\"weir\"") && s.contains("\"job_name\":\"default\""))
    });
    let up = series("up");
    assert!(up.contains("\"job\":\"weir\"") && up.contains("\"1\"]"), "the target is up: {up}");
    // promtool's own check of the text as served.
    let (ok, text) = control(&addr, &["metrics"]);
    assert!(ok, "{text}");
    check_with_promtool(&prometheus, &text);
    server.kill().unwrap();
    server.wait().unwrap();
    job.child.kill().unwrap();
    job.child.wait().unwrap();
}

/// `promtool check metrics` (beside `prometheus`, as Debian's package puts it) passes `text`.
fn check_with_promtool(prometheus: &str, text: &str) {
    let promtool = Path::new(prometheus).with_file_name("promtool");
    let mut check = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", promtool.display()));
    use std::io::Write;
    check.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = check.wait_with_output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool check metrics: {said}\n{text}");
}
