//! One connection to one broker: Kafka's request/response framing over a blocking TCP stream,
//! the API versions the broker supports (asked once, when the connection opens), and the
//! messages encoded and decoded by `kafka-protocol`; TLS around the stream and a SASL login
//! on it where the cluster's [`Security`] asks for them.
//!
//! May touch: `error`, `security` (this crate's).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Message, StrBytes};

use crate::error::{network, protocol};
use crate::security::{plain_message, Sasl, SaslMechanism, ScramLogin, Security, Tls};
use weir::Result;

/// How long a request may take before the connection is given up (and the request fails,
/// retryably). A fetch waits on the broker for at most its own `max_wait_ms`, far less.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How long connecting may take: an unreachable broker is reported within seconds.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a new connection's first answer (the API versions) may take: a peer that accepts
/// connections and never answers is reported within seconds too.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// The newest version of each API this client speaks. Fetch and Produce stop before the
/// versions that name topics by id only; the others before fields this client has no use for.
fn newest_known(api: ApiKey) -> i16 {
    match api {
        ApiKey::Produce => 11,
        ApiKey::Fetch => 12,
        ApiKey::ListOffsets => 7,
        ApiKey::Metadata => 9,
        ApiKey::FindCoordinator => 3,
        ApiKey::InitProducerId => 4,
        ApiKey::AddPartitionsToTxn => 3,
        ApiKey::EndTxn => 4,
        ApiKey::CreateTopics => 7,
        ApiKey::JoinGroup => 5,
        ApiKey::SyncGroup => 3,
        ApiKey::Heartbeat => 3,
        // 3 and on: members leave by a list (the field version 3 needs).
        ApiKey::LeaveGroup => 3,
        ApiKey::OffsetCommit => 7,
        ApiKey::OffsetFetch => 7,
        // 1: the login's messages travel in SaslAuthenticate requests (0 sent them raw).
        ApiKey::SaslHandshake => 1,
        // 1 and on: a failed login says why.
        ApiKey::SaslAuthenticate => 2,
        _ => 0,
    }
}

/// A request this client sends, with its API key and response. (`kafka-protocol`'s own
/// `Request` trait needs its broker side compiled too.)
pub(crate) trait Api: Encodable + HeaderVersion + Message {
    const KEY: ApiKey;
    type Response: Decodable + HeaderVersion;
}

macro_rules! apis {
    ($($key:ident: $req:ty => $resp:ty),* $(,)?) => {$(
        impl Api for $req {
            const KEY: ApiKey = ApiKey::$key;
            type Response = $resp;
        }
    )*};
}

apis!(
    ApiVersions: ApiVersionsRequest => ApiVersionsResponse,
    Metadata: MetadataRequest => MetadataResponse,
    CreateTopics: CreateTopicsRequest => CreateTopicsResponse,
    ListOffsets: ListOffsetsRequest => ListOffsetsResponse,
    Fetch: FetchRequest => FetchResponse,
    Produce: ProduceRequest => ProduceResponse,
    FindCoordinator: FindCoordinatorRequest => FindCoordinatorResponse,
    InitProducerId: InitProducerIdRequest => InitProducerIdResponse,
    AddPartitionsToTxn: AddPartitionsToTxnRequest => AddPartitionsToTxnResponse,
    EndTxn: EndTxnRequest => EndTxnResponse,
    JoinGroup: JoinGroupRequest => JoinGroupResponse,
    SyncGroup: SyncGroupRequest => SyncGroupResponse,
    Heartbeat: HeartbeatRequest => HeartbeatResponse,
    LeaveGroup: LeaveGroupRequest => LeaveGroupResponse,
    OffsetCommit: OffsetCommitRequest => OffsetCommitResponse,
    OffsetFetch: OffsetFetchRequest => OffsetFetchResponse,
    SaslHandshake: SaslHandshakeRequest => SaslHandshakeResponse,
    SaslAuthenticate: SaslAuthenticateRequest => SaslAuthenticateResponse,
);

/// The byte stream under a connection: TCP, or TLS over TCP.
enum Stream {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => &s.sock,
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// Whether an I/O error is the broker closing the connection (what a listener does to a
/// client speaking what it does not expect: TLS, plaintext, or no login).
fn closed_by_peer(kind: std::io::ErrorKind) -> bool {
    matches!(kind, std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset)
}

/// The host part of `host:port` (an IPv6 address without its brackets), the name a
/// broker's certificate must carry.
fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host)
}

/// Runs the TLS handshake with the broker at `addr` over `tcp`; a failure says what it means
/// for the operator (an untrusted certificate, a plaintext listener, a refusal).
fn tls_handshake(
    mut tcp: TcpStream,
    tls: &Tls,
    addr: &str,
) -> Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
    let host = host_of(addr);
    let name = rustls::pki_types::ServerName::try_from(host.to_string()).map_err(|_| {
        weir::Error::config(format!(
            "Kafka broker {addr}: '{host}' is not a name or address a TLS certificate can carry"
        ))
    })?;
    let mut conn = rustls::ClientConnection::new(std::sync::Arc::clone(&tls.config), name)
        .map_err(|e| weir::Error::config(format!("cannot start TLS to Kafka broker {addr}: {e}")))?;
    while conn.is_handshaking() {
        if let Err(e) = conn.complete_io(&mut tcp) {
            return Err(tls_failure(addr, tls, e));
        }
    }
    Ok(rustls::StreamOwned::new(conn, tcp))
}

fn tls_failure(addr: &str, tls: &Tls, e: std::io::Error) -> weir::Error {
    use std::io::ErrorKind;
    let rustls_error = e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>());
    match (e.kind(), rustls_error) {
        (_, Some(rustls::Error::InvalidCertificate(why))) => weir::Error::Refused(format!(
            "Kafka broker {addr}'s TLS certificate is not trusted ({why:?}), checked against {}",
            tls.roots
        )),
        (_, Some(rustls::Error::InvalidMessage(_))) => weir::Error::Refused(format!(
            "Kafka broker {addr} did not answer in TLS ({e}): is it a plaintext listener? (then connect without TLS)"
        )),
        (_, Some(other)) => weir::Error::Refused(format!("the TLS handshake with Kafka broker {addr} failed: {other}")),
        (ErrorKind::WouldBlock | ErrorKind::TimedOut, None) => network(
            format!(
                "Kafka broker {addr} did not answer the TLS handshake within {} s (is it a plaintext listener? then \
                 connect without TLS)",
                HANDSHAKE_TIMEOUT.as_secs()
            ),
            e,
        ),
        (kind, None) if closed_by_peer(kind) => network(
            format!(
                "Kafka broker {addr} closed the connection during the TLS handshake (is it a plaintext listener? \
                 then connect without TLS)"
            ),
            e,
        ),
        _ => network(format!("the TLS handshake with Kafka broker {addr} failed"), e),
    }
}

/// A connection to one broker.
pub(crate) struct Connection {
    stream: Stream,
    addr: String,
    correlation: i32,
    /// API key → the broker's (oldest, newest) version.
    versions: HashMap<i16, (i16, i16)>,
    scratch: BytesMut,
}

impl Connection {
    /// Connects to `addr` (`host:port`) as `security` says (TLS, then SASL after the API
    /// versions), and asks which API versions it supports.
    pub(crate) fn open(addr: &str, security: &Security) -> Result<Connection> {
        let mut last = None;
        let addrs = addr.to_socket_addrs().map_err(|e| network(format!("cannot resolve Kafka broker {addr}"), e))?;
        for a in addrs {
            match TcpStream::connect_timeout(&a, CONNECT_TIMEOUT) {
                Ok(stream) => {
                    let setup = |s: &TcpStream| -> std::io::Result<()> {
                        s.set_nodelay(true)?;
                        s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
                        s.set_write_timeout(Some(REQUEST_TIMEOUT))
                    };
                    setup(&stream).map_err(|e| network(format!("cannot set up the connection to {addr}"), e))?;
                    let stream = match &security.tls {
                        None => Stream::Plain(stream),
                        Some(tls) => Stream::Tls(Box::new(tls_handshake(stream, tls, addr)?)),
                    };
                    let mut c = Connection {
                        stream,
                        addr: addr.to_string(),
                        correlation: 0,
                        versions: HashMap::new(),
                        scratch: BytesMut::new(),
                    };
                    match c.ask_versions() {
                        Err(weir::Error::Io { source, .. })
                            if matches!(
                                source.kind(),
                                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                            ) =>
                        {
                            return Err(network(
                                format!(
                                    "Kafka broker {addr} accepted the connection and did not answer within {} s \
                                     (is a Kafka broker listening there?)",
                                    HANDSHAKE_TIMEOUT.as_secs()
                                ),
                                source,
                            ));
                        }
                        Err(weir::Error::Io { source, .. })
                            if closed_by_peer(source.kind()) && security.tls.is_none() =>
                        {
                            return Err(network(
                                format!(
                                    "Kafka broker {addr} closed the connection at the first request (does its \
                                     listener want TLS? this client spoke plaintext)"
                                ),
                                source,
                            ));
                        }
                        r => r?,
                    }
                    if let Some(sasl) = &security.sasl {
                        c.authenticate(sasl)?;
                    }
                    c.stream
                        .tcp()
                        .set_read_timeout(Some(REQUEST_TIMEOUT))
                        .map_err(|e| network(format!("cannot set up the connection to {addr}"), e))?;
                    return Ok(c);
                }
                Err(e) => last = Some(e),
            }
        }
        let e = last.unwrap_or_else(|| std::io::Error::other("the name resolved to no address"));
        Err(network(format!("cannot connect to Kafka broker {addr}"), e))
    }

    fn ask_versions(&mut self) -> Result<()> {
        // Version 0: every broker answers it, whatever it supports.
        let response = self.send(&ApiVersionsRequest::default(), 0)?;
        if response.error_code != 0 {
            return Err(protocol(&self.addr, "ApiVersions", response.error_code));
        }
        self.versions = response.api_keys.iter().map(|k| (k.api_key, (k.min_version, k.max_version))).collect();
        Ok(())
    }

    /// Logs in with `sasl`: the mechanism agreed by a SaslHandshake, then its messages in
    /// SaslAuthenticate requests. Refused credentials are a configuration error naming the
    /// broker, the mechanism and the user (trying again cannot help).
    fn authenticate(&mut self, sasl: &Sasl) -> Result<()> {
        let addr = self.addr.clone();
        let mechanism = sasl.mechanism.name();
        if self.version::<SaslHandshakeRequest>()? < 1 {
            return Err(weir::Error::config(format!(
                "Kafka broker {addr} speaks only the SASL handshake of Kafka before 1.0, which this client does not"
            )));
        }
        let mut handshake = SaslHandshakeRequest::default();
        handshake.mechanism = StrBytes::from_static_str(mechanism);
        let answer = self.call(&handshake).map_err(|e| match e {
            // Some brokers close the connection instead of naming the mechanisms they take.
            weir::Error::Io { source, .. } if closed_by_peer(source.kind()) => weir::Error::Refused(format!(
                "Kafka broker {addr} closed the connection at the SASL handshake for {mechanism}: it does not take \
                     {mechanism} logins, or no SASL at all"
            )),
            e => e,
        })?;
        if answer.error_code == kafka_protocol::ResponseError::UnsupportedSaslMechanism.code() {
            let offered: Vec<&str> = answer.mechanisms.iter().map(|m| m.as_str()).collect();
            // A broker names the mechanisms it is configured with, whatever the listener: one
            // that "does not take" a mechanism it names takes no SASL on this listener.
            if offered.contains(&mechanism) {
                return Err(weir::Error::Refused(format!(
                    "Kafka broker {addr} takes no SASL logins on this listener (its SASL mechanisms, {}, are for \
                     another listener): connect to its SASL listener, or without a SASL login",
                    offered.join(", ")
                )));
            }
            return Err(weir::Error::Refused(format!(
                "Kafka broker {addr} does not take SASL {mechanism} logins (it takes: {})",
                if offered.is_empty() { "none".to_string() } else { offered.join(", ") }
            )));
        }
        if answer.error_code != 0 {
            return Err(protocol(&addr, "SaslHandshake", answer.error_code));
        }
        let refused = |why: String| {
            weir::Error::Refused(format!(
                "Kafka broker {addr} refused the SASL {mechanism} login of user '{}': {why}",
                sasl.username
            ))
        };
        if sasl.mechanism == SaslMechanism::Plain {
            self.sasl_step(plain_message(sasl), &refused)?;
            return Ok(());
        }
        let (mut login, first) = ScramLogin::start(sasl, &ScramLogin::nonce()?);
        let server_first = self.sasl_step(first, &refused)?;
        let last = login.client_final(&server_first).map_err(&refused)?;
        let server_final = self.sasl_step(last, &refused)?;
        login.check_server_final(&server_final).map_err(refused)
    }

    /// One SaslAuthenticate round: sends `bytes`, returns the server's; the broker's refusal
    /// becomes the error `refused` makes of its reason.
    fn sasl_step(&mut self, bytes: Vec<u8>, refused: &dyn Fn(String) -> weir::Error) -> Result<Bytes> {
        let mut request = SaslAuthenticateRequest::default();
        request.auth_bytes = Bytes::from(bytes);
        let answer = self.call(&request)?;
        if answer.error_code != 0 {
            let e = kafka_protocol::ResponseError::try_from_code(answer.error_code)
                .map_or_else(|| format!("error {}", answer.error_code), |e| format!("{e:?}"));
            return Err(refused(match answer.error_message {
                Some(m) if !m.is_empty() => format!("{} ({e})", m.as_str()),
                _ => e,
            }));
        }
        Ok(answer.auth_bytes)
    }

    /// The version of `R` to use with this broker: the newest both sides speak.
    fn version<R: Api>(&self) -> Result<i16> {
        let Some(&(oldest, newest)) = self.versions.get(&(R::KEY as i16)) else {
            return Err(weir::Error::config(format!(
                "Kafka broker {} does not support API {} (needed by weir's Kafka connector)",
                self.addr,
                api_name(R::KEY)
            )));
        };
        let ours = newest_known(R::KEY).min(R::VERSIONS.max);
        let v = newest.min(ours);
        if v < oldest || v < R::VERSIONS.min {
            return Err(weir::Error::config(format!(
                "Kafka broker {} supports {} versions {oldest}..={newest}, none of which this client speaks \
                 ({}..={ours})",
                self.addr,
                api_name(R::KEY),
                R::VERSIONS.min
            )));
        }
        Ok(v)
    }

    /// Sends `request` at the newest common version and reads its response.
    pub(crate) fn call<R: Api>(&mut self, request: &R) -> Result<R::Response> {
        let version = self.version::<R>()?;
        self.send(request, version)
    }

    fn send<R: Api>(&mut self, request: &R, version: i16) -> Result<R::Response> {
        self.correlation = self.correlation.wrapping_add(1);
        let mut header = RequestHeader::default();
        header.request_api_key = R::KEY as i16;
        header.request_api_version = version;
        header.correlation_id = self.correlation;
        header.client_id = Some(StrBytes::from_static_str("weir"));
        let buf = &mut self.scratch;
        buf.clear();
        buf.extend_from_slice(&[0; 4]);
        header
            .encode(buf, R::header_version(version))
            .and_then(|()| request.encode(buf, version))
            .map_err(|e| weir::Error::config(format!("cannot encode a Kafka {} request: {e}", api_name(R::KEY))))?;
        let len = (buf.len() - 4) as i32;
        buf[..4].copy_from_slice(&len.to_be_bytes());
        let what = api_name(R::KEY);
        self.stream
            .write_all(buf)
            .map_err(|e| network(format!("cannot send {what} to Kafka broker {}", self.addr), e))?;
        let mut size = [0u8; 4];
        self.stream.read_exact(&mut size).map_err(|e| {
            let hint = match closed_by_peer(e.kind()) {
                true => " (it closed the connection: does it want a SASL login, or TLS?)",
                false => "",
            };
            network(format!("no answer to {what} from Kafka broker {}{hint}", self.addr), e)
        })?;
        if matches!(size, [0x15 | 0x16, 0x03, _, _]) {
            // A TLS record (an alert, or a handshake) where a length should be.
            return Err(weir::Error::config(format!(
                "Kafka broker {} answered {what} in TLS: its listener wants TLS (this client spoke plaintext)",
                self.addr
            )));
        }
        let size = i32::from_be_bytes(size);
        if size < 0 {
            return Err(network(
                format!("Kafka broker {} answered {what} with a negative length", self.addr),
                std::io::Error::from(std::io::ErrorKind::InvalidData),
            ));
        }
        let mut body = vec![0u8; size as usize];
        self.stream
            .read_exact(&mut body)
            .map_err(|e| network(format!("incomplete answer to {what} from Kafka broker {}", self.addr), e))?;
        let mut body = Bytes::from(body);
        let decoded = ResponseHeader::decode(&mut body, R::Response::header_version(version))
            .and_then(|h| Ok((h, R::Response::decode(&mut body, version)?)));
        let (header, response) = decoded.map_err(|e| {
            network(
                format!("cannot decode the answer to {what} from Kafka broker {}", self.addr),
                std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()),
            )
        })?;
        if header.correlation_id != self.correlation {
            return Err(network(
                format!("Kafka broker {} answered another request than {what}", self.addr),
                std::io::Error::from(std::io::ErrorKind::InvalidData),
            ));
        }
        Ok(response)
    }
}

/// The name of API `key`, for messages.
pub(crate) fn api_name(key: ApiKey) -> String {
    format!("{key:?}")
}
