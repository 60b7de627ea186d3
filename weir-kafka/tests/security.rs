//! Kafka as managed clusters run it: TLS through a terminating proxy (Debian's `stunnel4`)
//! in front of Tansu; SASL against Tansu's own (`--authentication`), which runs SCRAM-SHA-256
//! and -512 for real but keeps no users in its memory or S3 storage (0.6: its
//! `AlterUserScramCredentials` answers and stores nothing), so it refuses every login, and
//! offers no PLAIN; so the logins that succeed are checked against a broker written here that
//! speaks a connection's first requests in Kafka's wire format and checks PLAIN and SCRAM as
//! Kafka does (the server side of RFC 5802; the client's arithmetic is checked against RFC
//! 7677's recorded conversation in the crate's unit tests). Each mismatch a user makes (TLS to
//! a plaintext listener and the reverse, an untrusted certificate, a wrong password, an
//! unknown user, a mechanism the broker lacks) is a clear error naming the broker.

use std::sync::{Arc, Mutex};

use std::io::{Read, Write};
use weir::sink::CollectSink;
use weir::source::Generator;
use weir::{Job, RunConfig};

use base64::Engine as _;
use weir_kafka::{
    read_topic_with, Delivery, KafkaClient, KafkaRecord, KafkaSink, KafkaSource, Sasl, SaslMechanism, Security, Tls,
};
use weir_testkit::kafka::*;

/// Writes 0..n through an exactly-once sink and reads them back through the source, both
/// secured by `security`; the committed output and what the source read are each number once.
fn round_trip(addr: &str, security: &Security, admin: &Security, n: u64) {
    let topic = format!("secured-{}-{n}", std::process::id());
    KafkaClient::connect_with(addr, admin).unwrap().create_topic(&topic, 2).unwrap();
    let chk = tempfile::tempdir().unwrap();
    let job = Job::new("secured-write").with_parallelism(2).with_checkpointing(
        weir::checkpoint::CheckpointConfig::new(chk.path()).interval(std::time::Duration::from_millis(20)),
    );
    job.generator(Generator::new(|i, _| i).count(n)).sink(
        KafkaSink::new(addr, &topic, |i: &u64| KafkaRecord { key: None, value: i.to_string().into_bytes() })
            .delivery(Delivery::ExactlyOnce)
            .security(security.clone())
            .subtasks(),
    );
    job.execute(RunConfig::default().workers(2)).unwrap();
    let contents = read_topic_with(addr, security, &topic).unwrap();
    assert_eq!((contents.open, contents.committed.len() as u64), (0, n), "committed once, nothing open");

    let got = Arc::new(Mutex::new(Vec::new()));
    let job = Job::new("secured-read").with_parallelism(2);
    let into = Arc::clone(&got);
    job.source(KafkaSource::new(addr, &topic, value_text).security(security.clone()).subtasks())
        .sink(move |_| Ok(CollectSink::new(Arc::clone(&into))));
    job.execute(RunConfig::default().workers(2)).unwrap();
    let mut got: Vec<u64> = got.lock().unwrap().iter().map(|v| v.parse().unwrap()).collect();
    got.sort_unstable();
    assert_eq!(got, (0..n).collect::<Vec<_>>(), "the source read each message once");
}

fn error_of(addr: &str, security: &Security) -> String {
    KafkaClient::connect_with(addr, security).map(drop).unwrap_err().to_string()
}

#[test]
fn tls_through_a_terminating_proxy_and_its_mismatches() {
    if !weir_testkit::kafka::tls_available("tls_through_a_terminating_proxy_and_its_mismatches") {
        return;
    }
    let broker = secured_broker(true, false);
    let tls = Security::plaintext().tls(Tls::ca_file(&broker.ca_file).unwrap());
    round_trip(&broker.addr, &tls, &broker.admin, 2_000);

    // TLS to the broker's own plaintext listener.
    let e = error_of(&broker.plaintext, &tls);
    assert!(e.contains(&broker.plaintext) && e.contains("plaintext listener"), "{e}");
    // Plaintext to the TLS listener.
    let e = error_of(&broker.addr, &Security::plaintext());
    assert!(e.contains(&broker.addr) && e.contains("TLS"), "{e}");
    // The platform's roots do not hold the test's CA.
    let platform = Security::plaintext().tls(Tls::platform_roots().unwrap());
    let e = error_of(&broker.addr, &platform);
    assert!(e.contains(&broker.addr) && e.contains("not trusted") && e.contains("platform"), "{e}");
    // A broker's refusal is no fault of the configuration (it read "invalid configuration").
    assert!(e.starts_with("refused: ") && !e.contains("invalid configuration"), "{e}");
}

/// Tansu with `--authentication`, plaintext and behind TLS: SCRAM-SHA-256 and -512 run to the
/// broker's answer, which refuses the user (it keeps none); the error names the broker, the
/// mechanism and the user, and never the password. PLAIN, which it does not take, and no login
/// at all are errors naming the broker too.
#[test]
fn tansu_refuses_logins_and_the_errors_say_whose() {
    if !weir_testkit::kafka::tls_available("tansu_refuses_logins_and_the_errors_say_whose") {
        return;
    }
    for tls in [false, true] {
        let broker = secured_broker(tls, true);
        let base =
            if tls { Security::plaintext().tls(Tls::ca_file(&broker.ca_file).unwrap()) } else { Security::plaintext() };
        for mechanism in [SaslMechanism::ScramSha256, SaslMechanism::ScramSha512] {
            let login = base.clone().sasl(Sasl::new(mechanism, "ana", "a secret"));
            let e = error_of(&broker.addr, &login);
            assert!(
                e.contains(&broker.addr)
                    && e.contains(mechanism.name())
                    && e.contains("user 'ana'")
                    && e.contains("refused"),
                "{e}"
            );
            assert!(!e.contains("a secret"), "the password stays out of the message: {e}");
        }
        let e = error_of(&broker.addr, &base.clone().sasl(Sasl::new(SaslMechanism::Plain, "ana", "pw")));
        assert!(e.contains(&broker.addr) && e.contains("PLAIN"), "{e}");
        let e =
            KafkaClient::connect_with(&broker.addr, &base).and_then(|mut c| c.partitions("t")).unwrap_err().to_string();
        assert!(e.contains(&broker.addr), "{e}");
    }
}

/// A broker that answers a connection's first requests — ApiVersions (v0), SaslHandshake (v1)
/// and SaslAuthenticate (v0), in Kafka's wire format written out here — and checks the login
/// as Kafka does: PLAIN against `password`, SCRAM against the stored key of `password` salted
/// (4096 iterations), proving its own knowledge with the server signature. Refusals are
/// Kafka's error 58 with Kafka's message. Serves connections until the test binary ends;
/// returns its address.
fn login_broker(user: &'static str, password: &'static str, mechanisms: &'static [&'static str]) -> String {
    serving(move |conn| serve_logins(conn, user, password, mechanisms, true))
}

/// A listener of a broker whose SASL is on another listener: it refuses every mechanism and
/// names the broker's, as a Kafka broker does (the mechanism asked for among them).
fn listener_without_sasl(mechanisms: &'static [&'static str]) -> String {
    serving(move |conn| serve_logins(conn, "", "", mechanisms, false))
}

/// A loopback address where `serve` answers each connection.
fn serving(serve: impl Fn(std::net::TcpStream) -> std::io::Result<()> + Copy + Send + 'static) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let _ = serve(conn);
            });
        }
    });
    addr
}

fn serve_logins(
    mut conn: std::net::TcpStream,
    user: &str,
    password: &str,
    mechanisms: &[&str],
    takes_sasl: bool,
) -> std::io::Result<()> {
    let mut mechanism = String::new();
    let mut scram: Option<(String, String)> = None; // (client-first-bare, server-first)
    loop {
        let mut size = [0u8; 4];
        conn.read_exact(&mut size)?;
        let mut body = vec![0u8; i32::from_be_bytes(size) as usize];
        conn.read_exact(&mut body)?;
        let (key, correlation) = (i16::from_be_bytes([body[0], body[1]]), &body[4..8]);
        // The request header's client id (a nullable string) ends it.
        let id_len = i16::from_be_bytes([body[8], body[9]]).max(0) as usize;
        let request = &body[10 + id_len..];
        let mut out = correlation.to_vec();
        match key {
            18 => {
                // ApiVersions v0: no error, three APIs.
                out.extend(0i16.to_be_bytes());
                out.extend(3i32.to_be_bytes());
                for (k, min, max) in [(18i16, 0i16, 0i16), (17, 0, 1), (36, 0, 0)] {
                    out.extend(k.to_be_bytes().into_iter().chain(min.to_be_bytes()).chain(max.to_be_bytes()));
                }
            }
            17 => {
                let len = i16::from_be_bytes([request[0], request[1]]) as usize;
                mechanism = String::from_utf8_lossy(&request[2..2 + len]).into_owned();
                let known = takes_sasl && mechanisms.contains(&mechanism.as_str());
                out.extend(if known { 0i16 } else { 33 }.to_be_bytes());
                out.extend((mechanisms.len() as i32).to_be_bytes());
                for m in mechanisms {
                    out.extend((m.len() as i16).to_be_bytes());
                    out.extend(m.as_bytes());
                }
            }
            36 => {
                let len = i32::from_be_bytes(request[..4].try_into().unwrap()) as usize;
                let message = String::from_utf8_lossy(&request[4..4 + len]).into_owned();
                let answer = match mechanism.as_str() {
                    "PLAIN" => (message == format!("\0{user}\0{password}")).then(String::new),
                    _ => scram_step(&mechanism, &message, user, password, &mut scram),
                };
                match answer {
                    Some(bytes) => {
                        out.extend(0i16.to_be_bytes());
                        out.extend((-1i16).to_be_bytes());
                        out.extend((bytes.len() as i32).to_be_bytes());
                        out.extend(bytes.as_bytes());
                    }
                    None => {
                        let why = format!("Authentication failed during authentication due to invalid credentials with SASL mechanism {mechanism}");
                        out.extend(58i16.to_be_bytes());
                        out.extend((why.len() as i16).to_be_bytes());
                        out.extend(why.as_bytes());
                        out.extend(0i32.to_be_bytes());
                    }
                }
            }
            _ => return Ok(()),
        }
        conn.write_all(&(out.len() as i32).to_be_bytes())?;
        conn.write_all(&out)?;
    }
}

/// The server side of one SCRAM message: the server-first for a client-first, the
/// server-final for a client-final whose proof holds; `None` refuses.
fn scram_step(
    mechanism: &str,
    message: &str,
    user: &str,
    password: &str,
    state: &mut Option<(String, String)>,
) -> Option<String> {
    let (hmac, digest, pbkdf2) = match mechanism {
        "SCRAM-SHA-256" => (ring::hmac::HMAC_SHA256, &ring::digest::SHA256, ring::pbkdf2::PBKDF2_HMAC_SHA256),
        "SCRAM-SHA-512" => (ring::hmac::HMAC_SHA512, &ring::digest::SHA512, ring::pbkdf2::PBKDF2_HMAC_SHA512),
        _ => return None,
    };
    let b64 = base64::engine::general_purpose::STANDARD;
    let mac = |key: &[u8], data: &[u8]| ring::hmac::sign(&ring::hmac::Key::new(hmac, key), data).as_ref().to_vec();
    let salt = b"weir-test-salt";
    let mut salted = vec![0u8; digest.output_len()];
    ring::pbkdf2::derive(pbkdf2, std::num::NonZeroU32::new(4096).unwrap(), salt, password.as_bytes(), &mut salted);
    match state.take() {
        None => {
            let bare = message.strip_prefix("n,,")?.to_string();
            let name = bare.strip_prefix("n=")?.split(',').next()?;
            let nonce = bare.split(',').find_map(|f| f.strip_prefix("r="))?;
            if name != user {
                return None;
            }
            let first = format!("r={nonce}server-nonce,s={},i=4096", b64.encode(salt));
            *state = Some((bare, first.clone()));
            Some(first)
        }
        Some((bare, first)) => {
            let (without_proof, proof) = message.rsplit_once(",p=")?;
            let auth_message = format!("{bare},{first},{without_proof}");
            let stored_key = ring::digest::digest(digest, &mac(&salted, b"Client Key"));
            let signature = mac(stored_key.as_ref(), auth_message.as_bytes());
            let client_key: Vec<u8> = b64.decode(proof).ok()?.iter().zip(&signature).map(|(p, s)| p ^ s).collect();
            if ring::digest::digest(digest, &client_key).as_ref() != stored_key.as_ref() {
                return None;
            }
            Some(format!("v={}", b64.encode(mac(&mac(&salted, b"Server Key"), auth_message.as_bytes()))))
        }
    }
}

/// PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 logins that a broker checking them takes, and each
/// wrong password, unknown user and mechanism it lacks refused, naming the broker, the
/// mechanism and the user (never the password).
#[test]
fn logins_a_checking_broker_takes_and_refuses() {
    let addr = login_broker("ana", "right horse", &["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]);
    for mechanism in [SaslMechanism::Plain, SaslMechanism::ScramSha256, SaslMechanism::ScramSha512] {
        let login = |user: &str, password: &str| Security::plaintext().sasl(Sasl::new(mechanism, user, password));
        KafkaClient::connect_with(&addr, &login("ana", "right horse")).unwrap_or_else(|e| panic!("{mechanism:?}: {e}"));
        for (user, password) in [("ana", "wrong"), ("nobody", "right horse")] {
            let e = error_of(&addr, &login(user, password));
            assert!(
                e.contains(&addr)
                    && e.contains(mechanism.name())
                    && e.contains(&format!("user '{user}'"))
                    && e.contains("invalid credentials"),
                "{mechanism:?} {user}: {e}"
            );
            assert!(!e.contains(password), "the password stays out of the message: {e}");
        }
    }
    let only_scram = login_broker("ana", "pw", &["SCRAM-SHA-512"]);
    let e = error_of(&only_scram, &Security::plaintext().sasl(Sasl::new(SaslMechanism::Plain, "ana", "pw")));
    assert!(e.contains("does not take SASL PLAIN logins (it takes: SCRAM-SHA-512)"), "{e}");
    // A listener without SASL named the broker's mechanisms as if it took them: "does not
    // take SASL SCRAM-SHA-512 logins (it takes: SCRAM-SHA-512)".
    let plain_listener = listener_without_sasl(&["SCRAM-SHA-512"]);
    let e = error_of(&plain_listener, &Security::plaintext().sasl(Sasl::new(SaslMechanism::ScramSha512, "ana", "pw")));
    assert!(e.contains("takes no SASL logins on this listener") && !e.contains("invalid configuration"), "{e}");
}
