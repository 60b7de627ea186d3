//! A real S3 server for the tests: moto (`pip install "moto[server]"`), started once per test
//! binary on loopback and stopped when the binary exits, or the one `WEIR_TEST_S3` names
//! (`.ci/run` starts it). Each test makes a bucket of its own.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, OnceLock};

use weir::checkpoint::ObjectStore;

/// Whether `test`, which needs an S3 server, can run ([`crate::required`]).
pub fn available(test: &str) -> bool {
    static MOTO: OnceLock<bool> = OnceLock::new();
    let present = std::env::var_os("WEIR_TEST_S3").is_some()
        || *MOTO.get_or_init(|| {
            Command::new(crate::python()).args(["-c", "import moto.server"]).output().is_ok_and(|o| o.status.success())
        });
    crate::required(test, "an S3 server (moto, from PyPI's moto[server])", present)
}

/// The S3 endpoint, `http://127.0.0.1:PORT`.
pub fn endpoint() -> &'static str {
    static ENDPOINT: OnceLock<String> = OnceLock::new();
    ENDPOINT.get_or_init(|| match std::env::var("WEIR_TEST_S3") {
        Ok(url) => url,
        Err(_) => start_moto(""),
    })
}

/// Starts a moto on a free port of loopback with environment `settings` (`K=V …`), stopped
/// when the test binary exits; returns its endpoint once it answers.
fn start_moto(settings: &str) -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let script = format!(
        "{settings} '{python}' -m moto.server -H 127.0.0.1 -p {port} >/dev/null 2>&1 & m=$!; \
         while kill -0 {me} 2>/dev/null; do sleep 0.5; done; kill $m",
        me = std::process::id(),
        python = crate::python()
    );
    drop(Command::new("sh").arg("-c").arg(script).stdin(Stdio::null()).spawn().unwrap());
    let addr = format!("127.0.0.1:{port}");
    crate::wait_until("the S3 server (moto) answers; `pip install \"moto[server]\"` installs it", || {
        std::net::TcpStream::connect(&addr).is_ok()
    });
    format!("http://{addr}")
}

/// A moto of its own that checks credentials (which the tests' are not), after one request
/// that creates bucket `denied`: its endpoint, and `s3://denied/job`, a checkpoint directory
/// in a bucket the tests have no permission for.
pub fn denying() -> (String, String) {
    let endpoint = start_moto("INITIAL_NO_AUTH_ACTION_COUNT=1");
    let status = request(endpoint.trim_start_matches("http://"), "PUT", "/denied").expect("moto answers");
    assert!(status.starts_with("HTTP/1.1 200"), "creating bucket denied: {status}");
    (endpoint, "s3://denied/job".to_string())
}

/// The settings a process needs to reach the server (as AWS environment variables).
pub fn env() -> Vec<(String, String)> {
    [
        ("AWS_ENDPOINT_URL", endpoint()),
        ("AWS_ACCESS_KEY_ID", "weir-test"),
        ("AWS_SECRET_ACCESS_KEY", "weir-test"),
        ("AWS_REGION", "us-east-1"),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .into()
}

/// A new empty bucket; returns `s3://BUCKET/PREFIX` for a checkpoint directory in it.
pub fn checkpoint_url(name: &str) -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let bucket = format!("{name}-{}-{n}", std::process::id());
    let addr = endpoint().trim_start_matches("http://");
    let status = request(addr, "PUT", &format!("/{bucket}")).expect("the S3 server answers");
    assert!(status.starts_with("HTTP/1.1 200"), "creating bucket {bucket}: {status}");
    format!("s3://{bucket}/job")
}

/// The store at `url` (`s3://…`), as the engine reaches it.
pub fn store(url: &str) -> Arc<dyn ObjectStore> {
    weir_object_store::open_with(url, env()).unwrap()
}

/// One plain HTTP request (moto checks no signature); its status line.
fn request(addr: &str, method: &str, path: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    write!(s, "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").ok()?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).ok()?;
    answer.lines().next().map(str::to_string)
}
