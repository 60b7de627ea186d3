//! Object storage for weir: a checkpoint directory kept in S3 (or any store that speaks its
//! protocol: MinIO, moto, Ceph), so that a process started on another machine, or in a fresh
//! folder, resumes from it. The engine owns what goes where and when
//! ([`weir::checkpoint::ObjectStore`], [`weir::checkpoint::CheckpointConfig::in_store`]); this
//! crate speaks S3, through the `object_store` crate.
//!
//! ```no_run
//! use weir::checkpoint::CheckpointConfig;
//! // Endpoint, region and credentials from the standard AWS environment variables.
//! let store = weir_object_store::open("s3://my-bucket/jobs/wordcount").unwrap();
//! let config = CheckpointConfig::in_store(store);
//! ```
//!
//! Calls block the calling thread (the engine makes them from its coordinator and sink tasks,
//! never from an async runtime); each store drives its requests on a runtime of one thread
//! of its own.
//!
//! Nothing here changes the process: its TLS (rustls on `ring`) is configured for its own
//! connections, not installed as the process-wide rustls provider the embedding program's
//! other TLS would then use.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path as ObjectPath;
use object_store::{ClientConfigKey, ObjectStoreExt, PutMode, PutOptions, PutPayload, RetryConfig};
use weir::{Error, Result};

/// An S3 bucket and a prefix in it: `s3://BUCKET/PREFIX`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Url {
    /// The bucket.
    pub bucket: String,
    /// The prefix under which the checkpoint directory lies (no leading or trailing `/`;
    /// empty: the bucket's root).
    pub prefix: String,
}

impl S3Url {
    /// Whether `s` is meant as an S3 address (it starts with `s3://`).
    pub fn is_s3(s: &str) -> bool {
        s.starts_with("s3://")
    }

    /// Parses `s3://BUCKET/PREFIX` (the prefix may be empty); anything else is an error that
    /// shows the form.
    pub fn parse(s: &str) -> Result<S3Url> {
        let bad = |why: &str| Error::config(format!("'{s}' is not an S3 address ({why}): expected s3://BUCKET/PREFIX"));
        let rest = s.strip_prefix("s3://").ok_or_else(|| bad("it does not start with s3://"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let legal = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '-');
        if bucket.len() < 3 || bucket.len() > 63 || !bucket.chars().all(legal) {
            return Err(bad("a bucket name is 3 to 63 of a-z, 0-9, '.', '-'"));
        }
        let prefix = prefix.trim_matches('/');
        if prefix.split('/').any(|p| p == "." || p == "..") || prefix.contains("//") {
            return Err(bad("the prefix has an empty, '.' or '..' part"));
        }
        Ok(S3Url { bucket: bucket.to_string(), prefix: prefix.to_string() })
    }
}

impl std::fmt::Display for S3Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.prefix)
    }
}

/// A checkpoint directory in S3: the engine's [`weir::checkpoint::ObjectStore`] over
/// `object_store`'s S3 client.
#[derive(Debug)]
pub struct S3Store {
    url: S3Url,
    endpoint: String,
    inner: Arc<dyn object_store::ObjectStore>,
    runtime: tokio::runtime::Runtime,
}

/// Opens the checkpoint directory at `url` (`s3://BUCKET/PREFIX`): endpoint, region and
/// credentials come from the standard AWS environment variables (`AWS_ENDPOINT_URL`,
/// `AWS_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, ...). Nothing is sent yet: the
/// checkpoint configuration checks the store when the job starts.
pub fn open(url: &str) -> Result<Arc<dyn weir::checkpoint::ObjectStore>> {
    open_with(url, std::env::vars())
}

/// [`open`], with settings named as the AWS environment variables are (`AWS_ENDPOINT_URL`,
/// `AWS_ACCESS_KEY_ID`, ...) taken from `settings` instead of the environment.
pub fn open_with(
    url: &str,
    settings: impl IntoIterator<Item = (String, String)>,
) -> Result<Arc<dyn weir::checkpoint::ObjectStore>> {
    Ok(Arc::new(S3Store::open(S3Url::parse(url)?, settings)?))
}

impl S3Store {
    /// The store for `url`, configured by `settings` (the AWS environment variables, or the
    /// same names from elsewhere).
    pub fn open(url: S3Url, settings: impl IntoIterator<Item = (String, String)>) -> Result<S3Store> {
        let settings: std::collections::HashMap<String, String> =
            settings.into_iter().filter(|(k, _)| k.starts_with("AWS_")).collect();
        let mut builder = AmazonS3Builder::new().with_bucket_name(&url.bucket);
        for (key, value) in &settings {
            if let Ok(key) = key.to_ascii_lowercase().parse::<AmazonS3ConfigKey>() {
                builder = builder.with_config(key, value);
            }
        }
        let (from, endpoint) = ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"]
            .iter()
            .find_map(|k| settings.get(*k).map(|v| (*k, v.clone())))
            .unwrap_or_else(|| ("the default", "https://s3.amazonaws.com".into()));
        // The S3 client's credential code panics on an endpoint that is no address.
        let address = url::Url::parse(&endpoint).ok();
        if !address.is_some_and(|a| matches!(a.scheme(), "http" | "https") && a.host().is_some()) {
            return Err(Error::config(format!(
                "cannot use {url}: the S3 endpoint '{endpoint}' ({from}) is not an http:// or https:// address"
            )));
        }
        let allow_http = endpoint.starts_with("http://");
        builder = builder.with_allow_http(allow_http).with_http_connector(RingConnector { allow_http });
        if !settings.contains_key("AWS_REGION") && !settings.contains_key("AWS_DEFAULT_REGION") {
            builder = builder.with_region("us-east-1");
        }
        // A store that does not answer is named within seconds, not after minutes of retries.
        let builder = builder
            .with_config(AmazonS3ConfigKey::Client(ClientConfigKey::ConnectTimeout), "5s")
            .with_config(AmazonS3ConfigKey::Client(ClientConfigKey::Timeout), "120s")
            .with_retry(RetryConfig { max_retries: 3, retry_timeout: Duration::from_secs(20), ..Default::default() });
        let inner =
            builder.build().map_err(|e| Error::config(format!("cannot use {url} (endpoint {endpoint}): {e}")))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("weir-object-store")
            .enable_all()
            .build()
            .map_err(|e| Error::Io {
                context: "cannot start the object store's runtime".into(),
                path: None,
                source: e,
            })?;
        Ok(S3Store { url, endpoint, inner: Arc::new(inner), runtime })
    }

    fn path(&self, key: &str) -> ObjectPath {
        match self.url.prefix.as_str() {
            "" => ObjectPath::from(key),
            prefix => ObjectPath::from(format!("{prefix}/{key}")),
        }
    }

    /// The key of `location`, relative to the prefix.
    fn key<'a>(&self, location: &'a str) -> &'a str {
        match self.url.prefix.as_str() {
            "" => location,
            prefix => location.strip_prefix(prefix).and_then(|r| r.strip_prefix('/')).unwrap_or(location),
        }
    }
}

/// The S3 client's connections: reqwest with rustls on `ring`, given its TLS configuration
/// here, where reqwest would otherwise take the process-wide default provider (one the program
/// must install, changing its own TLS). Timeouts as the store's settings above; certificates
/// checked against the platform's roots, as reqwest does.
#[derive(Debug)]
struct RingConnector {
    allow_http: bool,
}

impl object_store::client::HttpConnector for RingConnector {
    fn connect(&self, _: &object_store::ClientOptions) -> object_store::Result<object_store::client::HttpClient> {
        use rustls_platform_verifier::BuilderVerifierExt;
        let failed =
            |e: Box<dyn std::error::Error + Send + Sync>| object_store::Error::Generic { store: "S3", source: e };
        // rustls 0.23.48 deprecates ring's provider (no post-quantum key exchange); ring stays,
        // as aws-lc-rs needs cmake and a C toolchain to build.
        #[allow(deprecated)]
        let ring = rustls::crypto::ring::default_provider();
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(ring))
            .with_safe_default_protocol_versions()
            .and_then(|b| b.with_platform_verifier())
            .map_err(|e| failed(Box::new(e)))?
            .with_no_client_auth();
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .https_only(!self.allow_http)
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(120))
            .build()
            .map_err(|e| failed(Box::new(e)))?;
        Ok(object_store::client::HttpClient::new(client))
    }
}

fn io(e: object_store::Error) -> std::io::Error {
    match e {
        object_store::Error::NotFound { .. } => std::io::Error::new(std::io::ErrorKind::NotFound, e.to_string()),
        e => std::io::Error::other(readable(&e.to_string())),
    }
}

/// An S3 error answer's code and message instead of its XML document.
fn readable(message: &str) -> String {
    let field = |tag: &str| {
        let start = message.find(&format!("<{tag}>"))? + tag.len() + 2;
        let end = message[start..].find(&format!("</{tag}>"))? + start;
        Some(&message[start..end])
    };
    match (message.find("<?xml").or_else(|| message.find("<Error>")), field("Code")) {
        (Some(xml), Some(code)) => {
            format!("{}S3 answered {code}: {}", &message[..xml], field("Message").unwrap_or("(no message)"))
        }
        _ => message.to_string(),
    }
}

/// How long a small request (a listing's page, a create, a delete) may take, retries
/// included: a store that accepts connections and never answers is named within seconds.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(15);

/// Files larger than this go up in parts of this size.
const PART_BYTES: usize = 16 << 20;

impl S3Store {
    /// Runs `f` to completion on the store's own runtime. Called from inside another tokio
    /// runtime (an embedding service, the control endpoint's handlers), `block_on` panics
    /// ("Cannot start a runtime from within a runtime"): there it runs on a thread of its own,
    /// this thread waiting for it.
    fn block_on<F>(&self, f: F) -> F::Output
    where
        F: std::future::Future + Send,
        F::Output: Send,
    {
        if tokio::runtime::Handle::try_current().is_err() {
            return self.runtime.block_on(f);
        }
        std::thread::scope(|s| {
            s.spawn(|| self.runtime.block_on(f)).join().unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }

    /// `f`'s answer, or a timeout naming the endpoint once [`ANSWER_TIMEOUT`] has passed.
    async fn answered<T>(&self, what: &str, f: impl std::future::Future<Output = T>) -> std::io::Result<T> {
        tokio::time::timeout(ANSWER_TIMEOUT, f).await.map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "the S3 endpoint {} did not answer {what} within {} s (it accepts connections: is it an S3 \
                     server?)",
                    self.endpoint,
                    ANSWER_TIMEOUT.as_secs()
                ),
            )
        })
    }
}

impl weir::checkpoint::ObjectStore for S3Store {
    fn location(&self) -> String {
        format!("{} (endpoint {})", self.url, self.endpoint)
    }

    fn upload(&self, key: &str, from: &Path) -> std::io::Result<()> {
        let path = self.path(key);
        let mut file = std::fs::File::open(from)?;
        let len = file.metadata()?.len() as usize;
        let store = Arc::clone(&self.inner);
        if len <= PART_BYTES {
            let mut bytes = Vec::with_capacity(len);
            file.read_to_end(&mut bytes)?;
            return self.block_on(store.put(&path, PutPayload::from(bytes))).map(|_| ()).map_err(io);
        }
        self.block_on(async move {
            let mut upload = store.put_multipart(&path).await.map_err(io)?;
            let result = async {
                loop {
                    let mut part = Vec::with_capacity(PART_BYTES);
                    (&mut file).take(PART_BYTES as u64).read_to_end(&mut part)?;
                    if part.is_empty() {
                        break;
                    }
                    upload.put_part(PutPayload::from(part)).await.map_err(io)?;
                }
                upload.complete().await.map(|_| ()).map_err(io)
            }
            .await;
            if result.is_err() {
                let _ = upload.abort().await;
            }
            result
        })
    }

    fn create(&self, key: &str, bytes: &[u8]) -> std::io::Result<bool> {
        let options = PutOptions { mode: PutMode::Create, ..Default::default() };
        let path = self.path(key);
        let put = self.inner.put_opts(&path, PutPayload::from(bytes.to_vec()), options);
        match self.block_on(self.answered("a put", put))? {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. }) => Ok(false),
            Err(e) => Err(io(e)),
        }
    }

    fn download(&self, key: &str, to: &Path) -> std::io::Result<bool> {
        let path = self.path(key);
        self.block_on(async {
            let mut stream = match self.inner.get(&path).await {
                Ok(got) => got.into_stream(),
                Err(object_store::Error::NotFound { .. }) => return Ok(false),
                Err(e) => return Err(io(e)),
            };
            let mut file = std::io::BufWriter::new(std::fs::File::create(to)?);
            while let Some(chunk) = stream.next().await {
                std::io::Write::write_all(&mut file, &chunk.map_err(io)?)?;
            }
            file.into_inner().map_err(|e| e.into_error())?.sync_all()?;
            Ok(true)
        })
    }

    fn read_range(&self, key: &str, start: u64, end: u64) -> std::io::Result<Vec<u8>> {
        let path = self.path(key);
        let range = start..end;
        let got = self.inner.get_range(&path, range);
        self.block_on(self.answered("a ranged get", got))?.map(|b| b.to_vec()).map_err(io)
    }

    fn list(&self, prefix: &str) -> std::io::Result<Vec<String>> {
        // Listing is by folder: list the folder the prefix is in, keep what starts with it.
        let folder = prefix.rsplit_once('/').map_or("", |(f, _)| f);
        let base = match (self.url.prefix.as_str(), folder) {
            ("", "") => None,
            (p, "") => Some(ObjectPath::from(p)),
            ("", f) => Some(ObjectPath::from(f)),
            (p, f) => Some(ObjectPath::from(format!("{p}/{f}"))),
        };
        self.block_on(async {
            let mut keys = Vec::new();
            let mut listing = self.inner.list(base.as_ref());
            while let Some(meta) = self.answered("a listing", listing.next()).await? {
                let meta = meta.map_err(io)?;
                let key = self.key(meta.location.as_ref());
                if key.starts_with(prefix) {
                    keys.push(key.to_string());
                }
            }
            keys.sort();
            Ok(keys)
        })
    }

    fn delete(&self, key: &str) -> std::io::Result<()> {
        match self.block_on(self.answered("a delete", self.inner.delete(&self.path(key))))? {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(io(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Opening a store, over https too, leaves the process's TLS as it was: no rustls provider
    /// is installed process-wide (it installed `ring` as the default, which then decided the
    /// TLS of everything else the embedding program did with rustls).
    #[test]
    fn opening_a_store_installs_no_process_wide_tls_provider() {
        for endpoint in ["https://127.0.0.1:1", "http://127.0.0.1:1"] {
            let settings = [("AWS_ENDPOINT_URL", endpoint), ("AWS_ACCESS_KEY_ID", "k"), ("AWS_SECRET_ACCESS_KEY", "s")];
            let settings = settings.map(|(k, v)| (k.to_string(), v.to_string()));
            S3Store::open(S3Url::parse("s3://bucket/job").unwrap(), settings).unwrap();
        }
        assert!(rustls::crypto::CryptoProvider::get_default().is_none(), "a provider was installed process-wide");
    }

    #[test]
    fn addresses_parse_or_show_the_form() {
        assert_eq!(S3Url::parse("s3://bucket/a/b/").unwrap(), S3Url { bucket: "bucket".into(), prefix: "a/b".into() });
        assert_eq!(S3Url::parse("s3://bucket").unwrap().prefix, "");
        for bad in
            ["s3:/bucket/p", "http://bucket/p", "s3://B!/p", "s3://ab/p", "s3://bucket/a/../b", "s3://bucket/a//b"]
        {
            let e = S3Url::parse(bad).unwrap_err().to_string();
            assert!(e.contains("expected s3://BUCKET/PREFIX") && e.contains(bad), "{bad}: {e}");
        }
    }

    /// `AWS_ENDPOINT_URL='not a url'` panicked every `s3://` command (rc 101, in the S3
    /// client's credential code): it is named now.
    #[test]
    fn an_endpoint_that_is_no_address_is_named() {
        for bad in ["not a url", "ftp://127.0.0.1:9000", "http://"] {
            let settings = [("AWS_ENDPOINT_URL".to_string(), bad.to_string())];
            let e = open_with("s3://bucket/p", settings).unwrap_err().to_string();
            assert!(e.contains(&format!("the S3 endpoint '{bad}' (AWS_ENDPOINT_URL) is not an http")), "{bad}: {e}");
        }
        let settings = [("AWS_ENDPOINT_URL".to_string(), "http://127.0.0.1:1".to_string())];
        assert!(open_with("s3://bucket/p", settings).is_ok(), "an address is taken (nothing is sent yet)");
    }

    #[test]
    fn an_error_answer_reads_as_its_code_and_message() {
        let answer = "404 Not Found: <?xml version=\"1.0\"?><Error><Code>NoSuchBucket</Code><Message>The specified \
                      bucket does not exist</Message><RequestId>x</RequestId></Error>";
        assert_eq!(readable(answer), "404 Not Found: S3 answered NoSuchBucket: The specified bucket does not exist");
        assert_eq!(readable("connection refused"), "connection refused");
    }
}
