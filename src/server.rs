//! The gRPC server: listeners (TCP or a Unix socket), HTTP/2 settings, and the
//! shutdown sequence. [`run`] is what `lockside serve` and the tests call.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use tokio::net::{TcpListener, UnixListener};
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

use crate::admin;
use crate::api::{LockApi, MAX_DECODED_BYTES};
use crate::engine::Engine;
use crate::proto::lock_service_server::LockServiceServer;

/// Concurrent streams (sessions and calls) per HTTP/2 connection.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 1024;
/// Largest header list a client may send.
pub const MAX_HEADER_BYTES: u32 = 16 * 1024;

/// Checks the bearer token of every `LockService` call, in constant time.
#[derive(Clone)]
struct BearerAuth(Option<String>);

impl Interceptor for BearerAuth {
    fn call(&mut self, request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let Some(expected) = &self.0 else {
            return Ok(request);
        };
        let given = request
            .metadata()
            .get("authorization")
            .map(|v| v.as_bytes())
            .unwrap_or_default();
        if constant_time_eq(given, expected.as_bytes()) {
            Ok(request)
        } else {
            // Who, and whether a token came at all; never what it was.
            let token = if given.is_empty() { "none" } else { "wrong" };
            let peer = crate::api::peer(&request);
            tracing::warn!(%peer, token, "refused a call without a valid bearer token");
            Err(tonic::Status::unauthenticated(
                "a valid bearer token is required (authorization: Bearer <token>)",
            ))
        }
    }
}

/// Compares without an early exit, so timing does not tell how much of a guess was
/// right (the length is not secret).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Why the server stopped other than by shutdown.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The transport failed (for example, accepting connections).
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The server task panicked.
    #[error("server task: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// The reflection service could not read the descriptors.
    #[error("reflection: {0}")]
    Reflection(String),
}

/// Where to listen: `HOST:PORT` or `unix:PATH`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    /// A TCP address.
    Tcp(String),
    /// A Unix socket path.
    Unix(PathBuf),
}

impl std::str::FromStr for ListenAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.strip_prefix("unix:") {
            Some("") => Err("unix: needs a socket path".into()),
            Some(path) => Ok(Self::Unix(PathBuf::from(path))),
            None if s.contains(':') => Ok(Self::Tcp(s.to_owned())),
            None => Err(format!("{s:?} is neither HOST:PORT nor unix:PATH")),
        }
    }
}

/// A bound listener.
#[derive(Debug)]
pub enum Listener {
    /// TCP.
    Tcp(TcpListener),
    /// A Unix socket, removed again when the server stops.
    Unix(UnixListener, PathBuf),
}

impl Listener {
    /// Binds `addr`. A Unix socket file left by a dead sidecar is replaced; one that
    /// a live process still listens on is an error.
    pub async fn bind(addr: &ListenAddr) -> std::io::Result<Self> {
        match addr {
            ListenAddr::Tcp(a) => Ok(Self::Tcp(TcpListener::bind(a).await?)),
            ListenAddr::Unix(path) => {
                if path.exists() {
                    if tokio::net::UnixStream::connect(path).await.is_ok() {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::AddrInUse,
                            format!("{} is in use by a live process", path.display()),
                        ));
                    }
                    std::fs::remove_file(path)?;
                }
                Ok(Self::Unix(UnixListener::bind(path)?, path.clone()))
            }
        }
    }

    /// Sets the permissions of a Unix socket file (no-op for TCP).
    pub fn set_socket_mode(&self, mode: u32) -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        match self {
            Self::Tcp(_) => Ok(()),
            Self::Unix(_, path) => {
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            }
        }
    }

    /// The bound address, for logs and tests.
    pub fn local_addr(&self) -> String {
        match self {
            Self::Tcp(l) => l
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|e| e.to_string()),
            Self::Unix(_, path) => format!("unix:{}", path.display()),
        }
    }
}

/// HTTP/2, TLS, auth and shutdown settings of the server.
#[derive(Clone)]
pub struct ServerConfig {
    /// How often to PING a client's connection.
    pub keepalive_interval: Duration,
    /// How long a PING may go unanswered before the connection (and every session on
    /// it) is closed: a frozen client is noticed within interval + timeout.
    pub keepalive_timeout: Duration,
    /// How long shutdown may take to release every lock and close every stream.
    pub drain_timeout: Duration,
    /// When set, every `LockService` call must carry `authorization: Bearer <token>`
    /// (health is exempt, so probes need no secret).
    pub auth_token: Option<String>,
    /// TLS on the gRPC listener (with a client CA: mutual TLS). Off by default: on
    /// loopback or a Unix socket inside a pod, TLS adds nothing but cost.
    pub tls: Option<ServerTlsConfig>,
    /// Ready although the store may evict held locks (`--allow-evicting-store`).
    pub allow_evicting_store: bool,
}

impl std::fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the token.
        f.debug_struct("ServerConfig")
            .field("keepalive_interval", &self.keepalive_interval)
            .field("keepalive_timeout", &self.keepalive_timeout)
            .field("drain_timeout", &self.drain_timeout)
            .field("auth_token", &self.auth_token.as_ref().map(|_| "<set>"))
            .field("tls", &self.tls.is_some())
            .field("allow_evicting_store", &self.allow_evicting_store)
            .finish()
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            // 5 s + 5 s notices a frozen client well within the 10 s default TTL's
            // expiry of a dead sidecar, at one PING per connection every 5 s.
            keepalive_interval: Duration::from_secs(5),
            keepalive_timeout: Duration::from_secs(5),
            drain_timeout: Duration::from_secs(10),
            auth_token: None,
            tls: None,
            // An evicting store can drop a held lock: refuse to be ready on one unless
            // the operator says they know.
            allow_evicting_store: false,
        }
    }
}

/// Serves `engine` on `listener` until `shutdown` completes, then stops accepting,
/// releases every held lock, and returns once every session has ended or the drain
/// deadline has passed.
pub async fn run(
    listener: Listener,
    admin_listener: Option<TcpListener>,
    engine: Engine,
    config: ServerConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let service = InterceptedService::new(
        LockServiceServer::new(LockApi::new(engine.clone()))
            .max_decoding_message_size(MAX_DECODED_BYTES)
            .max_encoding_message_size(MAX_DECODED_BYTES),
        BearerAuth(config.auth_token.clone().map(|t| format!("Bearer {t}"))),
    );
    let (reporter, health) = tonic_health::server::health_reporter();
    admin::not_serving(&reporter).await;
    let readiness = admin::Readiness::default();
    let stop = CancellationToken::new();
    tokio::spawn(admin::watch_store(
        engine.clone(),
        reporter,
        readiness.clone(),
        config.allow_evicting_store,
        stop.clone(),
    ));
    if let Some(admin_listener) = admin_listener {
        let serving = admin::serve(admin_listener, readiness, engine.metrics(), stop.clone());
        tokio::spawn(async move {
            if let Err(e) = serving.await {
                tracing::error!(error = %e, "admin listener failed");
            }
        });
    }
    let mut builder = Server::builder();
    if let Some(tls) = config.tls.clone() {
        builder = builder.tls_config(tls)?;
    }
    let router = builder
        .http2_keepalive_interval(Some(config.keepalive_interval))
        .http2_keepalive_timeout(Some(config.keepalive_timeout))
        // One app per pod opens a handful of streams; 1,024 per connection bounds what
        // one misbehaving client can open, well above any real use.
        .max_concurrent_streams(Some(MAX_STREAMS_PER_CONNECTION))
        // Headers carry a name and a token: 16 KiB is generous.
        .http2_max_header_list_size(Some(MAX_HEADER_BYTES))
        .add_service(health)
        .add_service(reflection()?)
        .add_service(service);
    let signal = stop.clone().cancelled_owned();
    let mut socket_file = None;
    let server = match listener {
        Listener::Tcp(l) => {
            // With our own listener, tonic ignores Server::tcp_nodelay: set it here, or
            // two small frames in a row (Waiting, Granted) wait ~40 ms for a delayed ACK.
            let incoming = TcpIncoming::from(l).with_nodelay(Some(true));
            Box::pin(router.serve_with_incoming_shutdown(incoming, signal))
                as std::pin::Pin<Box<dyn Future<Output = _> + Send>>
        }
        Listener::Unix(l, path) => {
            socket_file = Some(path);
            Box::pin(router.serve_with_incoming_shutdown(UnixListenerStream::new(l), signal))
        }
    };
    let mut server = tokio::spawn(server);
    tokio::select! {
        result = &mut server => {
            remove_socket(socket_file);
            return Ok(result??);
        }
        _ = shutdown => {}
    }
    tracing::info!(
        sessions = engine.sessions(),
        "shutting down: releasing every lock"
    );
    let deadline = tokio::time::Instant::now() + config.drain_timeout;
    engine.shutdown();
    stop.cancel();
    if tokio::time::timeout_at(deadline, engine.drained())
        .await
        .is_err()
    {
        tracing::warn!(
            sessions = engine.sessions(),
            "drain deadline passed before every session released its locks"
        );
    }
    let result = match tokio::time::timeout_at(deadline, &mut server).await {
        Ok(result) => result?.map_err(ServeError::from),
        Err(_) => {
            tracing::warn!("drain deadline passed with connections still open");
            server.abort();
            Ok(())
        }
    };
    remove_socket(socket_file);
    tracing::info!("stopped");
    result
}

/// Server reflection (v1), so `grpcurl`/`buf curl` can call the sidecar without the
/// proto file. Exempt from auth like health: it tells nothing the proto does not.
fn reflection() -> Result<
    tonic_reflection::server::v1::ServerReflectionServer<
        impl tonic_reflection::server::v1::ServerReflection,
    >,
    ServeError,
> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| ServeError::Reflection(e.to_string()))
}

/// How long a client may take to finish the TLS handshake: bounds what a connection
/// that never completes it costs.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// TLS for the gRPC listener from PEM files: the server's certificate chain and key,
/// and for mutual TLS the CA that client certificates must chain to.
pub fn tls_config(
    cert_pem: &[u8],
    key_pem: &[u8],
    client_ca_pem: Option<&[u8]>,
) -> ServerTlsConfig {
    let mut tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(cert_pem, key_pem))
        .timeout(TLS_HANDSHAKE_TIMEOUT);
    if let Some(ca) = client_ca_pem {
        tls = tls.client_ca_root(Certificate::from_pem(ca));
    }
    tls
}

fn remove_socket(path: Option<PathBuf>) {
    if let Some(path) = path {
        let _ = std::fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_parse() {
        assert_eq!("unix:/tmp/s".parse(), Ok(ListenAddr::Unix("/tmp/s".into())));
        assert_eq!(
            "127.0.0.1:0".parse(),
            Ok(ListenAddr::Tcp("127.0.0.1:0".into()))
        );
        assert!("unix:".parse::<ListenAddr>().is_err());
        assert!("nowhere".parse::<ListenAddr>().is_err());
    }
}
