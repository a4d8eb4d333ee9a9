//! A Rust client of the Lockside sidecar: `Client::connect`, then `lock(key)` returns a
//! guard that holds the lock until it is dropped or released, exposes the fencing token,
//! and says when the lock is lost.
//!
//! ```no_run
//! # async fn demo() -> Result<(), lockside::client::ClientError> {
//! use lockside::client::Client;
//! let client = Client::connect("127.0.0.1:7420").await?;
//! let lock = client.lock("orders").await?;
//! let token = lock.fencing_token(); // pass it to the resource you protect
//! tokio::select! {
//!     _ = lock.lost() => { /* stop using the resource now */ }
//!     _ = async { /* the work */ } => {}
//! }
//! lock.release().await?;
//! # Ok(()) }
//! ```
//!
//! Each guard has its own `Lease` stream, so dropping a guard releases its lock (the
//! sidecar releases on stream end) and the lock is lost with the stream: any stream
//! error counts as `Lost`, as DESIGN.md advises. The channel uses HTTP/2 keepalive of
//! 1 s / 1 s, well below any TTL, so a frozen sidecar is noticed in time.

use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::sync::{mpsc, watch};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::proto::lock_service_client::LockServiceClient;
use crate::proto::{self, lease_request, lease_response};

/// Where clients find the sidecar unless told otherwise (DESIGN.md).
pub const DEFAULT_ADDR: &str = "127.0.0.1:7420";

/// Keepalive of the client's channel: DESIGN.md's advice, below the 1 s minimum TTL.
const KEEPALIVE: Duration = Duration::from_secs(1);

/// What can go wrong for a client. Every message is words for a person (`lockside
/// hold` prints them as they are): "not acquired: timed out after 100ms", not an enum
/// name or a code number.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The sidecar could not be reached, or the stream broke. The message says which.
    #[error("{0}")]
    Unavailable(String),
    /// The lock was not acquired: busy, timed out or cancelled.
    #[error("not acquired: {0}")]
    NotAcquired(NotAcquired),
    /// The sidecar refused the request (or, for code 14, its store is unavailable).
    #[error("{}", rejected(*code, message))]
    Rejected {
        /// A google.rpc code number.
        code: i32,
        /// The sidecar's explanation.
        message: String,
    },
    /// The lock was lost before it could be released.
    #[error("the lock was lost")]
    Lost,
    /// The client's own settings are wrong (a token or certificate file).
    #[error("{0}")]
    Settings(String),
}

/// Why a lock was not acquired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotAcquired {
    /// Somebody else holds it, and the request did not wait.
    Busy,
    /// The wait, this long, ended without the lock.
    TimedOut(Duration),
    /// The wait was cancelled.
    Cancelled,
    /// A reason this client does not know (a newer sidecar), by its number.
    Other(i32),
}

impl std::fmt::Display for NotAcquired {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Busy => f.write_str("busy"),
            Self::TimedOut(wait) => write!(
                f,
                "timed out after {}",
                crate::config::format_duration(*wait)
            ),
            Self::Cancelled => f.write_str("cancelled"),
            Self::Other(reason) => write!(f, "reason {reason}"),
        }
    }
}

/// A google.rpc code in words, as the proto's comments name them.
pub fn code_words(code: i32) -> &'static str {
    use tonic::Code;
    match Code::from(code) {
        Code::Ok => "ok",
        Code::Cancelled => "cancelled",
        Code::Unknown => "unknown error",
        Code::InvalidArgument => "invalid argument",
        Code::DeadlineExceeded => "deadline exceeded",
        Code::NotFound => "not found",
        Code::AlreadyExists => "already exists",
        Code::PermissionDenied => "permission denied",
        Code::ResourceExhausted => "resource exhausted",
        Code::FailedPrecondition => "failed precondition",
        Code::Aborted => "aborted",
        Code::OutOfRange => "out of range",
        Code::Unimplemented => "unimplemented",
        Code::Internal => "internal error",
        Code::Unavailable => "unavailable",
        Code::DataLoss => "data loss",
        Code::Unauthenticated => "unauthenticated",
    }
}

/// "rejected: invalid argument: key must not be empty"; UNAVAILABLE is not a refusal
/// of the request but the store's state: "unavailable: the lock store is unavailable".
fn rejected(code: i32, message: &str) -> String {
    let words = code_words(code);
    let head = if code == tonic::Code::Unavailable as i32 {
        words.to_owned()
    } else {
        format!("rejected: {words}")
    };
    match message {
        "" => head,
        message => format!("{head}: {message}"),
    }
}

/// A failed call in words: the sidecar going away is `Unavailable`, anything else the
/// sidecar's refusal.
fn from_status(status: &tonic::Status) -> ClientError {
    use tonic::Code;
    match status.code() {
        Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded => {
            ClientError::Unavailable(match status.message() {
                "" => "the sidecar is unavailable".to_owned(),
                message => format!("the sidecar is unavailable: {message}"),
            })
        }
        code => ClientError::Rejected {
            code: code as i32,
            message: status.message().to_owned(),
        },
    }
}

/// "cannot reach the sidecar at ADDR: connection refused": the root cause of a
/// connection failure, not tonic's "transport error".
fn unreachable(addr: &str, error: &(dyn std::error::Error + 'static)) -> ClientError {
    let mut cause = error;
    while let Some(source) = cause.source() {
        cause = source;
    }
    let words = match cause.downcast_ref::<std::io::Error>().map(|e| e.kind()) {
        Some(std::io::ErrorKind::ConnectionRefused) => "connection refused".to_owned(),
        Some(std::io::ErrorKind::NotFound) => "no such socket".to_owned(),
        Some(std::io::ErrorKind::PermissionDenied) => "permission denied".to_owned(),
        Some(std::io::ErrorKind::TimedOut) => "timed out".to_owned(),
        _ => cause.to_string(),
    };
    ClientError::Unavailable(format!("cannot reach the sidecar at {addr}: {words}"))
}

/// How to take a lock.
#[derive(Clone, Debug, Default)]
pub struct LockOptions {
    /// How long to wait when busy; `None`: do not wait.
    pub wait: Option<Duration>,
    /// The lock's TTL; `None`: the sidecar's default.
    pub ttl: Option<Duration>,
    /// Take it SHARED (a reader) rather than EXCLUSIVE.
    pub shared: bool,
    /// N > 1: one permit of a semaphore of N.
    pub limit: u32,
    /// Wait in arrival order.
    pub fair: bool,
}

/// How to reach a sidecar beyond its address: its bearer token and TLS.
#[derive(Clone, Default)]
pub struct ConnectOptions {
    /// Sent as `authorization: Bearer <token>` on every call (the sidecar's
    /// `--auth-token-file`).
    pub auth_token: Option<String>,
    /// TLS to the sidecar; `None`: plaintext (loopback, Unix socket).
    pub tls: Option<ClientTls>,
}

impl std::fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the token or the key.
        f.debug_struct("ConnectOptions")
            .field("auth_token", &self.auth_token.as_ref().map(|_| "<set>"))
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// TLS settings of a client.
#[derive(Clone, Default)]
pub struct ClientTls {
    /// The CA that signed the sidecar's certificate (PEM); `None`: the webpki roots.
    pub ca_pem: Option<Vec<u8>>,
    /// Mutual TLS: this client's certificate chain and key (PEM).
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// The name the sidecar's certificate must carry; `None`: the address's host.
    pub server_name: Option<String>,
}

/// Adds the bearer token, if any, to every call.
#[derive(Clone, Debug)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", token.clone());
        }
        Ok(request)
    }
}

/// A connection to a sidecar. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Client {
    grpc: LockServiceClient<InterceptedService<Channel, Bearer>>,
    channel: Channel,
}

impl Client {
    /// Connects to `HOST:PORT`, `http://HOST:PORT` or `unix:PATH`, in plaintext and
    /// without a token.
    pub async fn connect(addr: &str) -> Result<Self, ClientError> {
        Self::connect_with(addr, &ConnectOptions::default()).await
    }

    /// Connects to `HOST:PORT`, `http(s)://HOST:PORT` or `unix:PATH` with a token and
    /// TLS as `options` say.
    pub async fn connect_with(addr: &str, options: &ConnectOptions) -> Result<Self, ClientError> {
        let unavailable = |e: tonic::transport::Error| unreachable(addr, &e);
        let scheme = if options.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let channel = match addr.strip_prefix("unix:") {
            Some(path) => {
                let path = path.to_owned();
                endpoint(&format!("{scheme}://lockside"), options)?
                    .connect_with_connector(tower::service_fn(move |_| {
                        let path = path.clone();
                        async move {
                            let stream = tokio::net::UnixStream::connect(path).await?;
                            Ok::<_, std::io::Error>(TokioIo::new(stream))
                        }
                    }))
                    .await
                    .map_err(unavailable)?
            }
            None => {
                let host = addr.split_once("://").map_or(addr, |(_, rest)| rest);
                endpoint(&format!("{scheme}://{host}"), options)?
                    .connect()
                    .await
                    .map_err(unavailable)?
            }
        };
        let token = match &options.auth_token {
            None => None,
            Some(token) => Some(
                format!("Bearer {token}")
                    .parse()
                    .map_err(|_| ClientError::Settings("the token is not ASCII".into()))?,
            ),
        };
        Ok(Self {
            grpc: LockServiceClient::with_interceptor(channel.clone(), Bearer(token)),
            channel,
        })
    }

    /// Takes `key` exclusively, waiting for it as long as needed (24 h at most).
    pub async fn lock(&self, key: &str) -> Result<LockGuard, ClientError> {
        let options = LockOptions {
            wait: Some(crate::engine::MAX_WAIT),
            ..LockOptions::default()
        };
        self.lock_with(key, options).await
    }

    /// Takes `key` as `options` say.
    pub async fn lock_with(
        &self,
        key: &str,
        options: LockOptions,
    ) -> Result<LockGuard, ClientError> {
        let (tx, rx) = mpsc::channel(4);
        let mut grpc = self.grpc.clone();
        let mut events = grpc
            .lease(ReceiverStream::new(rx))
            .await
            .map_err(|s| from_status(&s))?
            .into_inner();
        let duration = |d: Duration| prost_types::Duration::try_from(d).ok();
        let wait = options.wait;
        let acquire = proto::Acquire {
            traceparent: String::new(),
            request_id: 1,
            key: key.to_owned(),
            wait_timeout: options.wait.and_then(duration),
            mode: if options.shared {
                proto::LockMode::Shared
            } else {
                proto::LockMode::Exclusive
            } as i32,
            limit: options.limit,
            fair: options.fair,
            ttl: options.ttl.and_then(duration),
        };
        send(&tx, lease_request::Command::Acquire(acquire)).await?;
        let granted = loop {
            let event = events
                .next()
                .await
                .ok_or_else(|| ClientError::Unavailable("the sidecar ended the stream".into()))?
                .map_err(|s| from_status(&s))?
                .event;
            match event {
                Some(lease_response::Event::Granted(g)) => break g,
                Some(lease_response::Event::NotAcquired(n)) => {
                    use proto::not_acquired::Reason;
                    let reason = match Reason::try_from(n.reason) {
                        Ok(Reason::Busy) => NotAcquired::Busy,
                        Ok(Reason::Timeout) => NotAcquired::TimedOut(wait.unwrap_or_default()),
                        Ok(Reason::Cancelled) => NotAcquired::Cancelled,
                        _ => NotAcquired::Other(n.reason),
                    };
                    return Err(ClientError::NotAcquired(reason));
                }
                Some(lease_response::Event::Rejected(r)) => {
                    return Err(ClientError::Rejected {
                        code: r.code,
                        message: r.message,
                    });
                }
                _ => continue, // SessionStarted, Waiting
            }
        };
        let (lost_tx, lost_rx) = watch::channel(None);
        let (released_tx, released_rx) = watch::channel(None);
        // Reads the rest of the stream: Released answers the release; Lost, an error or
        // the end of the stream before it means the lock is gone.
        let reader = tokio::spawn(async move {
            let why = loop {
                match events.next().await.map(|m| m.map(|m| m.event)) {
                    Some(Ok(Some(lease_response::Event::Released(r)))) => {
                        let _ = released_tx.send(Some(r.hold_count));
                        return;
                    }
                    Some(Ok(Some(lease_response::Event::Lost(lost)))) => break lost.reason,
                    Some(Err(status)) => {
                        break format!("the stream broke: {}", from_status(&status));
                    }
                    None => break "the sidecar ended the stream".to_owned(),
                    Some(Ok(_)) => {}
                }
            };
            let _ = lost_tx.send(Some(why));
        });
        Ok(LockGuard {
            key: key.to_owned(),
            token: granted.fencing_token,
            tx,
            lost: lost_rx,
            released: released_rx,
            reader,
        })
    }

    /// Whether the sidecar reports SERVING on `grpc.health.v1` (its store answers).
    pub async fn serving(&self) -> Result<bool, ClientError> {
        use tonic_health::pb::HealthCheckRequest;
        use tonic_health::pb::health_check_response::ServingStatus;
        let mut health = tonic_health::pb::health_client::HealthClient::new(self.channel.clone());
        let response = health
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .map_err(|s| from_status(&s))?;
        Ok(response.into_inner().status == ServingStatus::Serving as i32)
    }

    /// The state of `key` as the sidecar's store sees it.
    pub async fn describe(&self, key: &str) -> Result<proto::DescribeResponse, ClientError> {
        let mut grpc = self.grpc.clone();
        let response = grpc
            .describe(proto::DescribeRequest {
                key: key.to_owned(),
            })
            .await
            .map_err(|s| from_status(&s))?;
        Ok(response.into_inner())
    }
}

fn endpoint(uri: &str, options: &ConnectOptions) -> Result<Endpoint, ClientError> {
    let bad = |e: tonic::transport::Error| ClientError::Unavailable(format!("{uri}: {e}"));
    let mut endpoint = Endpoint::from_shared(uri.to_owned())
        .map_err(bad)?
        .http2_keep_alive_interval(KEEPALIVE)
        .keep_alive_timeout(KEEPALIVE)
        .keep_alive_while_idle(true)
        .tcp_nodelay(true);
    if let Some(tls) = &options.tls {
        let mut config = ClientTlsConfig::new();
        config = match &tls.ca_pem {
            Some(ca) => config.ca_certificate(Certificate::from_pem(ca)),
            None => config.with_webpki_roots(),
        };
        if let Some((cert, key)) = &tls.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(name) = &tls.server_name {
            config = config.domain_name(name.clone());
        }
        endpoint = endpoint.tls_config(config).map_err(bad)?;
    }
    Ok(endpoint)
}

async fn send(
    tx: &mpsc::Sender<proto::LeaseRequest>,
    command: lease_request::Command,
) -> Result<(), ClientError> {
    tx.send(proto::LeaseRequest {
        command: Some(command),
    })
    .await
    .map_err(|_| ClientError::Unavailable("the sidecar ended the stream".into()))
}

/// A held lock. Dropping it releases the lock (its stream ends).
#[derive(Debug)]
pub struct LockGuard {
    key: String,
    token: u64,
    tx: mpsc::Sender<proto::LeaseRequest>,
    /// Why the lock was lost, once it is.
    lost: watch::Receiver<Option<String>>,
    released: watch::Receiver<Option<u32>>,
    reader: tokio::task::JoinHandle<()>,
}

impl LockGuard {
    /// The lock's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The fencing token: pass it to the resource you protect.
    pub fn fencing_token(&self) -> u64 {
        self.token
    }

    /// Whether the lock is already lost.
    pub fn is_lost(&self) -> bool {
        self.lost.borrow().is_some()
    }

    /// Why the lock was lost (the `Lost` event's reason, or how the stream broke), once
    /// it is.
    pub fn lost_reason(&self) -> Option<String> {
        self.lost.borrow().clone()
    }

    /// Completes when the lock is lost (a `Lost` event, or the stream broke or ended).
    /// Stop using the resource then.
    pub async fn lost(&self) {
        let mut lost = self.lost.clone();
        // An error means the reader is gone without a verdict: treat it as lost.
        let _ = lost.wait_for(Option::is_some).await;
    }

    /// Releases the lock and waits for the sidecar to confirm.
    pub async fn release(mut self) -> Result<(), ClientError> {
        if self.is_lost() {
            return Err(ClientError::Lost);
        }
        let release = proto::Release {
            request_id: 2,
            key: self.key.clone(),
        };
        send(&self.tx, lease_request::Command::Release(release)).await?;
        let mut lost = self.lost.clone();
        tokio::select! {
            // The reader ends (closing both channels) right after a Released: look at
            // the answer first, and count only a real Lost, not a closed channel.
            biased;
            answer = self.released.wait_for(Option::is_some) => {
                answer.map_err(|_| ClientError::Lost)?;
                Ok(())
            }
            Ok(_) = lost.wait_for(Option::is_some) => Err(ClientError::Lost),
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        // Ending the stream is the release; the reader has nothing left to report.
        self.reader.abort();
    }
}
