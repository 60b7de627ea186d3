//! How the client reaches a cluster that is not open plaintext: TLS (rustls on `ring`, with
//! the platform's roots or a CA file of the operator's, and no process-wide provider
//! installed) and SASL (PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512, RFC 5802/7677), Kafka's
//! `security.protocol` of SSL, SASL_PLAINTEXT and SASL_SSL. This module holds the settings
//! and SCRAM's arithmetic; `wire` runs the exchanges on a connection.
//!
//! May touch: nothing else in the crate.

use std::path::Path;
use std::sync::Arc;

use base64::Engine as _;
use weir::{Error, Result};

/// How connections to a cluster are secured: plaintext (the default), TLS, SASL, or both.
///
/// ```no_run
/// use weir_kafka::{KafkaClient, Sasl, SaslMechanism, Security, Tls};
///
/// // Managed Kafka (SASL_SSL): the platform's roots, SCRAM-SHA-512.
/// let security = Security::default()
///     .tls(Tls::platform_roots()?)
///     .sasl(Sasl::new(SaslMechanism::ScramSha512, "weir", std::env::var("KAFKA_PASSWORD").unwrap_or_default()));
/// let client = KafkaClient::connect_with("broker.example.com:9096", &security)?;
/// # drop(client);
/// # Ok::<(), weir::Error>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct Security {
    pub(crate) tls: Option<Tls>,
    pub(crate) sasl: Option<Sasl>,
}

impl Security {
    /// Plaintext, no authentication (Kafka's `PLAINTEXT`).
    pub fn plaintext() -> Security {
        Security::default()
    }

    /// Speaks TLS to every broker.
    pub fn tls(mut self, tls: Tls) -> Security {
        self.tls = Some(tls);
        self
    }

    /// Authenticates every connection with SASL (after TLS, if set).
    pub fn sasl(mut self, sasl: Sasl) -> Security {
        self.sasl = Some(sasl);
        self
    }

    /// Kafka's name for it: `PLAINTEXT`, `SSL`, `SASL_PLAINTEXT` or `SASL_SSL`.
    pub fn protocol_name(&self) -> &'static str {
        match (&self.tls, &self.sasl) {
            (None, None) => "PLAINTEXT",
            (Some(_), None) => "SSL",
            (None, Some(_)) => "SASL_PLAINTEXT",
            (Some(_), Some(_)) => "SASL_SSL",
        }
    }
}

/// TLS settings: which certificates a broker's is checked against.
#[derive(Clone)]
pub struct Tls {
    pub(crate) config: Arc<rustls::ClientConfig>,
    /// Where the roots came from, for messages.
    pub(crate) roots: String,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("roots", &self.roots).finish_non_exhaustive()
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    // Given to each configuration, never installed process-wide: the embedding program's own
    // TLS keeps whatever provider it chose. rustls 0.23.48 deprecates ring's provider for its
    // lack of post-quantum key exchange; ring stays, since aws-lc-rs (the other provider) needs
    // cmake and a C toolchain to build. Kafka's brokers offer no post-quantum groups yet.
    #[allow(deprecated)]
    let ring = rustls::crypto::ring::default_provider();
    Arc::new(ring)
}

impl Tls {
    /// Checks brokers' certificates against the platform's roots (what managed Kafka's
    /// public certificates chain to).
    pub fn platform_roots() -> Result<Tls> {
        use rustls_platform_verifier::BuilderVerifierExt;
        let config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .and_then(|b| b.with_platform_verifier())
            .map_err(|e| Error::config(format!("cannot set up TLS with the platform's certificates: {e}")))?
            .with_no_client_auth();
        Ok(Tls { config: Arc::new(config), roots: "the platform's certificates".into() })
    }

    /// Checks brokers' certificates against the CA certificates in PEM file `path` only
    /// (a private CA's, a self-signed broker's).
    pub fn ca_file(path: impl AsRef<Path>) -> Result<Tls> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::CertificateDer;
        let path = path.as_ref();
        let bad = |why: String| Error::config(format!("TLS CA file {}: {why}", path.display()));
        let pem = std::fs::read(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert = cert.map_err(|e| bad(format!("not PEM certificates: {e}")))?;
            roots.add(cert).map_err(|e| bad(format!("a certificate in it is not one rustls accepts: {e}")))?;
        }
        if roots.is_empty() {
            return Err(bad("it holds no certificate (expected PEM: -----BEGIN CERTIFICATE-----)".into()));
        }
        let config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(format!("cannot set up TLS: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Tls { config: Arc::new(config), roots: format!("the CA file {}", path.display()) })
    }
}

/// A SASL mechanism this client speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaslMechanism {
    /// `PLAIN`: the password itself, sent once (only ever over TLS, outside tests).
    Plain,
    /// `SCRAM-SHA-256`: a salted challenge; the password never crosses the wire.
    ScramSha256,
    /// `SCRAM-SHA-512`.
    ScramSha512,
}

impl SaslMechanism {
    /// Kafka's name for it (`sasl.mechanism`).
    pub fn name(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
            SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }

    fn scram(self) -> Option<Scram> {
        match self {
            SaslMechanism::Plain => None,
            SaslMechanism::ScramSha256 => Some(Scram {
                digest: &ring::digest::SHA256,
                hmac: ring::hmac::HMAC_SHA256,
                pbkdf2: ring::pbkdf2::PBKDF2_HMAC_SHA256,
            }),
            SaslMechanism::ScramSha512 => Some(Scram {
                digest: &ring::digest::SHA512,
                hmac: ring::hmac::HMAC_SHA512,
                pbkdf2: ring::pbkdf2::PBKDF2_HMAC_SHA512,
            }),
        }
    }
}

impl std::fmt::Display for SaslMechanism {
    /// Kafka's name for it (`sasl.mechanism`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for SaslMechanism {
    type Err = Error;
    fn from_str(s: &str) -> Result<SaslMechanism> {
        match s.to_ascii_uppercase().as_str() {
            "PLAIN" => Ok(SaslMechanism::Plain),
            "SCRAM-SHA-256" => Ok(SaslMechanism::ScramSha256),
            "SCRAM-SHA-512" => Ok(SaslMechanism::ScramSha512),
            _ => Err(Error::config(format!(
                "'{s}' is not a SASL mechanism this client speaks (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)"
            ))),
        }
    }
}

/// A SASL login: mechanism, user and password. Its `Debug` does not show the password.
#[derive(Clone)]
pub struct Sasl {
    pub(crate) mechanism: SaslMechanism,
    pub(crate) username: String,
    pub(crate) password: String,
}

impl std::fmt::Debug for Sasl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sasl")
            .field("mechanism", &self.mechanism)
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

impl Sasl {
    /// Logs in as `username` with `password` by `mechanism`.
    pub fn new(mechanism: SaslMechanism, username: impl Into<String>, password: impl Into<String>) -> Sasl {
        Sasl { mechanism, username: username.into(), password: password.into() }
    }

    /// The mechanism.
    pub fn mechanism(&self) -> SaslMechanism {
        self.mechanism
    }

    /// The user.
    pub fn username(&self) -> &str {
        &self.username
    }
}

/// The three primitives SCRAM is built from, for one hash.
#[derive(Clone, Copy)]
struct Scram {
    digest: &'static ring::digest::Algorithm,
    hmac: ring::hmac::Algorithm,
    pbkdf2: ring::pbkdf2::Algorithm,
}

impl Scram {
    fn hmac(&self, key: &[u8], data: &[u8]) -> Vec<u8> {
        ring::hmac::sign(&ring::hmac::Key::new(self.hmac, key), data).as_ref().to_vec()
    }

    /// `Hi(password, salt, i)`: PBKDF2 with this hash's HMAC.
    fn salted_password(&self, password: &str, salt: &[u8], iterations: u32) -> Vec<u8> {
        let mut out = vec![0u8; self.digest.output_len()];
        let i = std::num::NonZeroU32::new(iterations).expect("iterations checked positive");
        ring::pbkdf2::derive(self.pbkdf2, i, salt, password.as_bytes(), &mut out);
        out
    }
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn unb64(s: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD.decode(s).ok()
}

/// One SCRAM login from the client's side: the messages it sends, checking what the server
/// answers (RFC 5802 §3, without channel binding, as Kafka does).
pub(crate) struct ScramLogin {
    scram: Scram,
    password: String,
    client_first_bare: String,
    nonce: String,
    /// Set by `client_final`: the signature the server must prove it knows.
    server_signature: Option<Vec<u8>>,
}

/// The fewest iterations a server may ask for: Kafka's own minimum (RFC 7677 asks at least
/// 4096 too). Fewer would make a captured exchange cheap to attack offline.
const MIN_ITERATIONS: u32 = 4096;

impl ScramLogin {
    /// Starts a login of `sasl` (a SCRAM mechanism) with client nonce `nonce` (printable,
    /// no ','); returns it and the client's first message.
    pub(crate) fn start(sasl: &Sasl, nonce: &str) -> (ScramLogin, Vec<u8>) {
        let scram = sasl.mechanism.scram().expect("a SCRAM mechanism");
        // saslname: '=' and ',' escaped (RFC 5802 §5.1).
        let user = sasl.username.replace('=', "=3D").replace(',', "=2C");
        let client_first_bare = format!("n={user},r={nonce}");
        let first = format!("n,,{client_first_bare}").into_bytes();
        let login = ScramLogin {
            scram,
            password: sasl.password.clone(),
            client_first_bare,
            nonce: nonce.to_string(),
            server_signature: None,
        };
        (login, first)
    }

    /// A fresh client nonce: 24 random bytes, base64.
    pub(crate) fn nonce() -> Result<String> {
        use ring::rand::SecureRandom;
        let mut bytes = [0u8; 24];
        ring::rand::SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| Error::config("cannot draw a random SCRAM nonce from the system"))?;
        Ok(b64(&bytes))
    }

    /// The client's final message, from the server's first; an error says what in the
    /// server's message is wrong.
    pub(crate) fn client_final(&mut self, server_first: &[u8]) -> std::result::Result<Vec<u8>, String> {
        let server_first =
            std::str::from_utf8(server_first).map_err(|_| "its first message is not text".to_string())?;
        let field =
            |name: &str| server_first.split(',').find_map(|kv| kv.strip_prefix(name).and_then(|v| v.strip_prefix('=')));
        if let Some(e) = field("e") {
            return Err(format!("it refused the login: {e}"));
        }
        let nonce = field("r").ok_or_else(|| format!("its first message has no nonce: '{server_first}'"))?;
        if !nonce.starts_with(&self.nonce) || nonce.len() == self.nonce.len() {
            return Err("its nonce does not extend ours (not a SCRAM server, or a replayed answer)".into());
        }
        let salt =
            field("s").and_then(unb64).ok_or_else(|| format!("its first message has no salt: '{server_first}'"))?;
        let iterations: u32 = field("i")
            .and_then(|i| i.parse().ok())
            .ok_or_else(|| format!("its first message has no iteration count: '{server_first}'"))?;
        if iterations < MIN_ITERATIONS {
            return Err(format!("it asks for {iterations} iterations, under SCRAM's minimum of {MIN_ITERATIONS}"));
        }
        let salted = self.scram.salted_password(&self.password, &salt, iterations);
        let client_key = self.scram.hmac(&salted, b"Client Key");
        let stored_key = ring::digest::digest(self.scram.digest, &client_key);
        // "biws" is base64 of "n,,": no channel binding, no authorization identity.
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{server_first},{without_proof}", self.client_first_bare);
        let client_signature = self.scram.hmac(stored_key.as_ref(), auth_message.as_bytes());
        let proof: Vec<u8> = client_key.iter().zip(&client_signature).map(|(k, s)| k ^ s).collect();
        let server_key = self.scram.hmac(&salted, b"Server Key");
        self.server_signature = Some(self.scram.hmac(&server_key, auth_message.as_bytes()));
        Ok(format!("{without_proof},p={}", b64(&proof)).into_bytes())
    }

    /// Checks the server's final message: it proves the server knows the password's salted
    /// form (a broker that does not is not the cluster it claims to be).
    pub(crate) fn check_server_final(&self, server_final: &[u8]) -> std::result::Result<(), String> {
        let text = std::str::from_utf8(server_final).map_err(|_| "its final message is not text".to_string())?;
        if let Some(e) = text.strip_prefix("e=") {
            return Err(format!("it refused the login: {e}"));
        }
        let verifier = text
            .split(',')
            .find_map(|kv| kv.strip_prefix("v="))
            .and_then(unb64)
            .ok_or_else(|| format!("its final message has no verifier: '{text}'"))?;
        let expected = self.server_signature.as_ref().ok_or("it ended the login early")?;
        // Compared in time independent of where they differ.
        let differ =
            verifier.len() != expected.len() || verifier.iter().zip(expected).fold(0u8, |d, (a, b)| d | (a ^ b)) != 0;
        if differ {
            return Err("its signature is wrong: it does not know this user's password".into());
        }
        Ok(())
    }
}

/// PLAIN's one message: authorization identity (empty), user, password (RFC 4616).
pub(crate) fn plain_message(sasl: &Sasl) -> Vec<u8> {
    format!("\0{}\0{}", sasl.username, sasl.password).into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677 §3's SCRAM-SHA-256 conversation, the server's messages as recorded there.
    #[test]
    fn scram_sha_256_matches_rfc_7677() {
        let sasl = Sasl::new(SaslMechanism::ScramSha256, "user", "pencil");
        let (mut login, first) = ScramLogin::start(&sasl, "rOprNGfwEbeRWgbNEkqO");
        assert_eq!(first, b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let server_first = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        let last = login.client_final(server_first).unwrap();
        assert_eq!(
            String::from_utf8(last).unwrap(),
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        login.check_server_final(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=").unwrap();
        // A server that does not know the password cannot sign.
        let e = login.check_server_final(b"v=AAAATRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=").unwrap_err();
        assert!(e.contains("does not know"), "{e}");
    }

    #[test]
    fn bad_server_messages_say_what_is_wrong() {
        let sasl = Sasl::new(SaslMechanism::ScramSha512, "a=b,c", "pw");
        let (mut login, first) = ScramLogin::start(&sasl, "abc");
        assert_eq!(first, b"n,,n=a=3Db=2Cc,r=abc", "saslname escapes '=' and ','");
        for (server_first, says) in [
            (&b"r=xyz123,s=c2FsdA==,i=4096"[..], "does not extend ours"),
            (b"r=abc,s=c2FsdA==,i=4096", "does not extend ours"),
            (b"r=abcd,i=4096", "no salt"),
            (b"r=abcd,s=c2FsdA==", "no iteration count"),
            (b"r=abcd,s=c2FsdA==,i=10", "under SCRAM's minimum"),
            (b"e=unknown-user", "refused the login: unknown-user"),
            (b"\xff", "not text"),
        ] {
            let e = login.client_final(server_first).unwrap_err();
            assert!(e.contains(says), "{}: {e}", String::from_utf8_lossy(server_first));
        }
        assert!(login.check_server_final(b"v=c2lnbg==").unwrap_err().contains("early"));
        assert!(login.check_server_final(b"e=invalid-proof").unwrap_err().contains("invalid-proof"));
    }

    #[test]
    fn mechanisms_parse_by_kafka_names_and_passwords_stay_out_of_debug() {
        for m in [SaslMechanism::Plain, SaslMechanism::ScramSha256, SaslMechanism::ScramSha512] {
            assert_eq!(m.name().parse::<SaslMechanism>().unwrap(), m);
            assert_eq!(m.name().to_lowercase().parse::<SaslMechanism>().unwrap(), m);
        }
        let e = "GSSAPI".parse::<SaslMechanism>().unwrap_err().to_string();
        assert!(e.contains("GSSAPI") && e.contains("SCRAM-SHA-512"), "{e}");
        let sasl = Sasl::new(SaslMechanism::Plain, "weir", "hunter2");
        assert!(!format!("{sasl:?}").contains("hunter2"));
        assert_eq!(plain_message(&sasl), b"\0weir\0hunter2");
        assert_eq!(Security::default().sasl(sasl).protocol_name(), "SASL_PLAINTEXT");
    }

    #[test]
    fn a_ca_file_that_is_missing_or_not_pem_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let e = Tls::ca_file(&missing).unwrap_err().to_string();
        assert!(e.contains("missing.pem") && e.contains("cannot read"), "{e}");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let e = Tls::ca_file(&empty).unwrap_err().to_string();
        assert!(e.contains("empty.pem") && e.contains("no certificate"), "{e}");
    }
}
