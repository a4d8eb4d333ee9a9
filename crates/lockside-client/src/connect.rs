//! How a client reaches its sidecar: TCP or a Unix socket, TLS, a bearer token, and
//! HTTP/2 keepalive well below any TTL.

use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::ClientError;
use crate::error::unreachable;
use crate::limits::CLIENT_NAME_HEADER;

/// Keepalive of the client's channel: the client guidance in docs/protocol.md, below the
/// 1 s minimum TTL.
const KEEPALIVE: Duration = Duration::from_secs(1);

/// How to reach a sidecar beyond its address: its bearer token and TLS.
#[derive(Clone, Default)]
pub struct ConnectOptions {
    /// Sent as `authorization: Bearer <token>` on every call (the sidecar's
    /// `--auth-token-file`).
    pub auth_token: Option<String>,
    /// TLS to the sidecar; `None`: plaintext (loopback, Unix socket).
    pub tls: Option<ClientTls>,
    /// How long to wait for a sidecar while nothing listens at the address (an app
    /// that starts before its sidecar), saying so once in the log. `None`: fail at
    /// once, naming the address and the cause.
    pub wait_for_sidecar: Option<Duration>,
    /// This client's name, shown by `Describe` and `Watch` beside its session (the
    /// `lockside-client-name` header; ASCII).
    pub client_name: Option<String>,
}

impl std::fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the token or the key.
        f.debug_struct("ConnectOptions")
            .field("auth_token", &self.auth_token.as_ref().map(|_| "<set>"))
            .field("tls", &self.tls.is_some())
            .field("wait_for_sidecar", &self.wait_for_sidecar)
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

/// Adds the bearer token and the client's name, if any, to every call.
#[derive(Clone, Debug)]
pub struct Bearer {
    pub(crate) token: Option<MetadataValue<Ascii>>,
    pub(crate) client_name: Option<MetadataValue<Ascii>>,
}

impl Bearer {
    /// The interceptor of `options`: its token and name as header values.
    pub(crate) fn new(options: &ConnectOptions) -> Result<Self, ClientError> {
        let token = match &options.auth_token {
            None => None,
            Some(token) => Some(
                format!("Bearer {token}")
                    .parse()
                    .map_err(|_| ClientError::Settings("the token is not ASCII".into()))?,
            ),
        };
        let client_name = match &options.client_name {
            None => None,
            Some(name) => Some(name.parse().map_err(|_| {
                ClientError::Settings("the client name is not printable ASCII".into())
            })?),
        };
        Ok(Self { token, client_name })
    }
}

impl Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.token {
            request
                .metadata_mut()
                .insert("authorization", token.clone());
        }
        if let Some(name) = &self.client_name {
            request
                .metadata_mut()
                .insert(CLIENT_NAME_HEADER, name.clone());
        }
        Ok(request)
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

/// A channel to `addr` (`HOST:PORT`, `http(s)://HOST:PORT` or `unix:PATH`): connected
/// now (`lazy` false: fails at once when nothing listens), or on its first call.
pub(crate) async fn channel(
    addr: &str,
    options: &ConnectOptions,
    lazy: bool,
) -> Result<Channel, ClientError> {
    let unavailable = |e: tonic::transport::Error| unreachable(addr, &e);
    let scheme = if options.tls.is_some() {
        "https"
    } else {
        "http"
    };
    match addr.strip_prefix("unix:") {
        Some(path) => {
            let path = path.strip_prefix("//").unwrap_or(path).to_owned();
            let connector = tower::service_fn(move |_| {
                let path = path.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(path).await?;
                    Ok::<_, std::io::Error>(TokioIo::new(stream))
                }
            });
            let endpoint = endpoint(&format!("{scheme}://lockside"), options)?;
            if lazy {
                Ok(endpoint.connect_with_connector_lazy(connector))
            } else {
                endpoint
                    .connect_with_connector(connector)
                    .await
                    .map_err(unavailable)
            }
        }
        None => {
            let host = addr.split_once("://").map_or(addr, |(_, rest)| rest);
            let endpoint = endpoint(
                &format!("{scheme}://{}", host.trim_end_matches('/')),
                options,
            )?;
            if lazy {
                Ok(endpoint.connect_lazy())
            } else {
                endpoint.connect().await.map_err(unavailable)
            }
        }
    }
}
