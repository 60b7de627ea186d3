//! `weir control ADDR …`: the control endpoint's client ([`weir_ops::control`]). One HTTP/1.1
//! request per command through `ureq`; the answer is printed as it comes (JSON, or
//! Prometheus text), an error answer as `error: …` with a non-zero exit.
//!
//! May touch: `args`.

use std::net::ToSocketAddrs;
use std::time::Duration;

use weir::Error;

use crate::args::{ControlArgs, ControlRequest};

/// How long the client waits for the answer to a checkpoint, savepoint or stop: it comes when
/// they are done.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(3600);

/// How long the client waits for any other answer, and for the endpoint to answer `GET /job`
/// before a long request: a peer that accepts connections and never answers is named within
/// seconds.
const QUICK_ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// Percent-encodes a query value.
fn encode(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub(crate) fn run_control(args: &ControlArgs) -> weir::Result<()> {
    let (method, target) = match &args.request {
        ControlRequest::Checkpoint { full, incremental } => {
            let kind = match (full, incremental) {
                (true, _) => "?type=full",
                (_, true) => "?type=incremental",
                _ => "",
            };
            ("POST", format!("/checkpoints{kind}"))
        }
        ControlRequest::Savepoint { dir } => ("POST", format!("/savepoints?dir={}", encode(&absolute(dir)?))),
        ControlRequest::Stop { dir, drain } => {
            let drain = if *drain { "&drain=true" } else { "" };
            ("POST", format!("/stop?dir={}{drain}", encode(&absolute(dir)?)))
        }
        ControlRequest::Config { settings } if settings.is_empty() => ("GET", "/config".to_string()),
        ControlRequest::Config { settings } => {
            let mut query = Vec::new();
            for s in settings {
                let Some((k, v)) = s.split_once('=') else {
                    return Err(Error::config(format!("'{s}' is not KEY=VALUE")));
                };
                query.push(format!("{}={}", encode(k), encode(v)));
            }
            ("POST", format!("/config?{}", query.join("&")))
        }
        ControlRequest::Checkpoints => ("GET", "/checkpoints".to_string()),
        ControlRequest::Metrics => ("GET", "/metrics".to_string()),
        ControlRequest::Job => ("GET", "/job".to_string()),
        ControlRequest::Health => ("GET", "/health".to_string()),
        ControlRequest::Cancel => ("POST", "/cancel".to_string()),
    };
    let long = matches!(
        args.request,
        ControlRequest::Checkpoint { .. } | ControlRequest::Savepoint { .. } | ControlRequest::Stop { .. }
    );
    if long {
        // The endpoint answers at all (quickly) before this waits for a long answer.
        request(&args.addr, "GET", "/job", QUICK_ANSWER_TIMEOUT)?;
    }
    let timeout = if long { ANSWER_TIMEOUT } else { QUICK_ANSWER_TIMEOUT };
    let (status, body) = request(&args.addr, method, &target, timeout)?;
    if (200..300).contains(&status) {
        print!("{}", shown(&args.request, &body));
        return Ok(());
    }
    let message = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_string))
        .unwrap_or(body);
    Err(Error::Refused(format!("the control endpoint at {} answered {status}: {message}", args.addr)))
}

/// An answer as the command shows it: checkpoints as the checkpoint table (and the failures
/// below it), other JSON indented, text as it came.
fn shown(request: &ControlRequest, body: &str) -> String {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(body) else {
        return if body.ends_with('\n') { body.to_string() } else { format!("{body}\n") };
    };
    if matches!(request, ControlRequest::Checkpoints) {
        let stats: Vec<weir::metrics::CheckpointStats> =
            value.get("completed").and_then(|c| serde_json::from_value(c.clone()).ok()).unwrap_or_default();
        let total = value.get("completed_total").and_then(|t| t.as_u64()).unwrap_or(stats.len() as u64);
        let mut out = format!("checkpoints completed: {}{}\n", total, weir_ops::tables::listed(total, stats.len()));
        if !stats.is_empty() {
            out.push_str(&weir_ops::tables::checkpoint_stats(&stats));
        }
        let failed = value.get("failed_total").and_then(|t| t.as_u64()).unwrap_or(0);
        let failures = value.get("failures").and_then(|f| f.as_array()).cloned().unwrap_or_default();
        if failed > 0 {
            out.push_str(&format!(
                "checkpoints failed: {failed}{}\n",
                weir_ops::tables::listed(failed, failures.len())
            ));
        }
        for f in failures {
            let (id, reason) = (f["checkpoint"].as_u64().unwrap_or(0), f["reason"].as_str().unwrap_or_default());
            out.push_str(&format!("checkpoint {id} failed: {reason}\n"));
        }
        return out;
    }
    format!("{}\n", serde_json::to_string_pretty(&value).unwrap_or_else(|_| body.to_string()))
}

/// A folder the job's process can find whatever its working folder: a local one made
/// absolute, a store's (`s3://BUCKET/PREFIX`) as it is (made absolute, it became a local
/// folder named `s3:`).
fn absolute(dir: &std::path::Path) -> weir::Result<String> {
    if let Some(url) = dir.to_str().filter(|d| weir_ops::stored::is_stored(d)) {
        return Ok(url.to_string());
    }
    let d = std::path::absolute(dir).map_err(|e| Error::io("cannot resolve the folder", dir, e))?;
    Ok(d.display().to_string())
}

/// Sends one request to the endpoint at `addr`; its status and body, within `timeout`. Each
/// error says what kind it is: the address is no address, nothing listens there, it did not
/// answer in time, or what answered is not HTTP.
fn request(addr: &str, method: &str, target: &str, timeout: Duration) -> weir::Result<(u16, String)> {
    let host = addr.trim_start_matches("http://").trim_end_matches('/');
    // Checked first: a bad address is the caller's to fix, not the endpoint's absence.
    host.to_socket_addrs()
        .map_err(|e| Error::config(format!("control endpoint address '{addr}' is not HOST:PORT: {e}")))?
        .next()
        .ok_or_else(|| Error::config(format!("control endpoint address '{addr}' resolves to nothing")))?;
    let config = ureq::Agent::config_builder()
        .timeout_connect(Some(Duration::from_secs(5)))
        .timeout_global(Some(timeout))
        // Error answers are the endpoint's to explain (their JSON `error`), not the client's.
        .http_status_as_error(false)
        .build();
    let agent = ureq::Agent::new_with_config(config);
    let url = format!("http://{host}{target}");
    let answer = match method {
        "POST" => agent.post(&url).send_empty(),
        _ => agent.get(&url).call(),
    };
    let failed = |e: ureq::Error| match e {
        ureq::Error::Timeout(_) => Error::Unreachable(format!(
            "the control endpoint at {addr} accepted the connection and did not answer {method} {target} within {} s \
             (is weir's control endpoint listening there?)",
            timeout.as_secs()
        )),
        ureq::Error::Io(e) => Error::Unreachable(format!("cannot reach the control endpoint at {addr}: {e}")),
        ureq::Error::ConnectionFailed | ureq::Error::HostNotFound => {
            Error::Unreachable(format!("cannot reach the control endpoint at {addr}: {e}"))
        }
        e => Error::Refused(format!("the control endpoint at {addr} answered something that is not HTTP: {e}")),
    };
    let mut answer = answer.map_err(failed)?;
    let status = answer.status().as_u16();
    let body = answer.body_mut().read_to_string().map_err(failed)?;
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_encoded() {
        assert_eq!(encode("/tmp/a b&c=d"), "/tmp/a%20b%26c%3Dd");
    }

    /// A store's folder went through `std::path::absolute` and became `$PWD/s3:/BUCKET/P`.
    #[test]
    fn a_store_folder_is_sent_as_it_is() {
        assert_eq!(absolute(std::path::Path::new("s3://bucket/savepoints")).unwrap(), "s3://bucket/savepoints");
        assert!(absolute(std::path::Path::new("local")).unwrap().starts_with('/'));
    }

    /// Each failure names its kind: nothing listening is `Unreachable` ("Connection refused"
    /// read "invalid configuration"), an answer that is not HTTP is named so, a bad address is
    /// the caller's.
    #[test]
    fn errors_name_their_kind() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let e = request(&format!("127.0.0.1:{port}"), "GET", "/job", QUICK_ANSWER_TIMEOUT).unwrap_err();
        assert!(matches!(e, Error::Unreachable(_)), "{e:?}");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            use std::io::{Read, Write};
            let (mut s, _) = listener.accept().unwrap();
            let _ = s.read(&mut [0; 1024]);
            let _ = s.write_all(b"SSH-2.0-OpenSSH_9.2\r\n");
        });
        let e = request(&addr, "GET", "/job", QUICK_ANSWER_TIMEOUT).unwrap_err();
        assert!(e.to_string().contains("not HTTP"), "{e}");
        let e = request("no-port", "GET", "/job", QUICK_ANSWER_TIMEOUT).unwrap_err();
        assert!(e.to_string().contains("is not HOST:PORT"), "{e}");
    }
}
