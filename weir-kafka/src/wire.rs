//! One connection to one broker: Kafka's request/response framing over a blocking TCP stream,
//! the API versions the broker supports (asked once, when the connection opens), and the
//! messages encoded and decoded by `kafka-protocol`.
//!
//! May touch: `error` (this crate's).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Message, StrBytes};

use crate::error::{network, protocol};
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
);

/// A connection to one broker.
pub(crate) struct Connection {
    stream: TcpStream,
    addr: String,
    correlation: i32,
    /// API key → the broker's (oldest, newest) version.
    versions: HashMap<i16, (i16, i16)>,
    scratch: BytesMut,
}

impl Connection {
    /// Connects to `addr` (`host:port`) and asks which API versions it supports.
    pub(crate) fn open(addr: &str) -> Result<Connection> {
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
                        r => r?,
                    }
                    c.stream
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
        self.stream
            .read_exact(&mut size)
            .map_err(|e| network(format!("no answer to {what} from Kafka broker {}", self.addr), e))?;
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
