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
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(s, "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    answer
}

#[test]
fn a_programs_own_job_serves_its_metrics_and_dashboard() {
    let dir = tempfile::tempdir().unwrap();
    let job =
        Job::new("own-job").with_checkpointing(CheckpointConfig::new(dir.path()).interval(Duration::from_secs(3600)));
    // Runs until stopped: the requests below see it running.
    job.generator(Generator::new(|i, _| (i % 7, 1u64)).count(u64::MAX))
        .key_by(|&(k, _)| k)
        .reduce(|a, b| (a.0, a.1 + b.1))
        .discard();
    let handle = job.start(RunConfig::default().workers(2)).unwrap();
    let endpoint = ControlEndpoint::start("127.0.0.1:0", false, handle.controller()).unwrap();
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
