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
//! sidecar releases on stream end), and each `lock()` is a holder of its own: two
//! guards of one key exclude each other like two processes, whichever tasks hold
//! them (no reentrancy across calls). When the stream breaks (the sidecar died, was
//! killed or restarted, or the connection broke), the lock is suspended at once
//! ([`LockState::Suspended`]: stop using it) and the guard resumes its session with
//! the session's resume token, on the restarted sidecar or any other on the same
//! store: the lock is held again if it comes back, and lost when resuming fails, when
//! it comes back `Lost` or not at all (`resume.rs`). The channel uses HTTP/2
//! keepalive of 1 s / 1 s, well below any TTL, so a frozen sidecar is noticed in
//! time.
//!
//! Leader election: [`Client::campaign`] waits its turn (a fair lock) and returns a
//! [`Leader`] whose value ([`LockGuard::proclaim`]) tells followers who leads;
//! followers [`Client::watch`] the key:
//!
//! ```no_run
//! # async fn demo() -> Result<(), lockside::client::ClientError> {
//! use lockside::client::Client;
//! use tokio_stream::StreamExt;
//! let client = Client::connect("127.0.0.1:7420").await?;
//! let mut states = client.watch("jobs/leader").await?;
//! while let Some(state) = states.next().await {
//!     let state = state?;
//!     match state.holders.first() {
//!         Some(leader) => println!("leader: {}", String::from_utf8_lossy(&leader.value)),
//!         None => println!("no leader"),
//!     }
//! }
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod connect;
mod error;
mod guard;
mod resume;
mod states;

use hyper_util::rt::TokioIo;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::proto::lock_service_client::LockServiceClient;
use crate::proto::{self, lease_request, lease_response};
use connect::endpoint;
pub use connect::{Bearer, ClientTls, ConnectOptions};
pub use error::{ClientError, NotAcquired, code_words};
use error::{from_status, unreachable};
pub use guard::{Leader, LockGuard};
pub use resume::LockState;
pub use states::WatchStream;

pub use crate::proto::limits::DEFAULT_ADDR;

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
    /// The holder's value, shown by `Describe` and `Watch` (at most 4 KiB).
    pub value: Vec<u8>,
}

/// Answers awaited on a guard's stream, by request id.
pub(crate) type Answers = Arc<Mutex<HashMap<u64, oneshot::Sender<lease_response::Event>>>>;

/// The request id an answer carries, if it is one a guard awaits.
fn answer_id(event: &lease_response::Event) -> Option<u64> {
    use lease_response::Event as E;
    match event {
        E::Released(r) => Some(r.request_id),
        E::Proclaimed(p) => Some(p.request_id),
        E::Rejected(r) => Some(r.request_id),
        _ => None,
    }
}

/// The gRPC client of a sidecar, with the bearer token.
type Grpc = LockServiceClient<InterceptedService<Channel, Bearer>>;

/// A connection to a sidecar. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Client {
    grpc: Grpc,
    channel: Channel,
}

impl Client {
    /// Connects to `HOST:PORT`, `http://HOST:PORT` or `unix:PATH`, in plaintext and
    /// without a token.
    pub async fn connect(addr: &str) -> Result<Self, ClientError> {
        Self::connect_with(addr, &ConnectOptions::default()).await
    }

    /// Connects to `HOST:PORT`, `http(s)://HOST:PORT` or `unix:PATH` with a token and
    /// TLS as `options` say. Fails at once when nothing listens there, unless
    /// `options.wait_for_sidecar` says how long to wait for one.
    pub async fn connect_with(addr: &str, options: &ConnectOptions) -> Result<Self, ClientError> {
        let Some(wait) = options.wait_for_sidecar else {
            return Self::connect_once(addr, options).await;
        };
        let deadline = tokio::time::Instant::now() + wait;
        let mut said = false;
        loop {
            match Self::connect_once(addr, options).await {
                Err(ClientError::Unavailable(why)) if tokio::time::Instant::now() < deadline => {
                    if !said {
                        said = true;
                        tracing::warn!(%addr, wait = ?wait, %why, "waiting for the sidecar");
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                done => return done,
            }
        }
    }

    /// One attempt of [`Client::connect_with`].
    async fn connect_once(addr: &str, options: &ConnectOptions) -> Result<Self, ClientError> {
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
        let client_name = match &options.client_name {
            None => None,
            Some(name) => Some(name.parse().map_err(|_| {
                ClientError::Settings("the client name is not printable ASCII".into())
            })?),
        };
        let interceptor = Bearer { token, client_name };
        Ok(Self {
            grpc: LockServiceClient::with_interceptor(channel.clone(), interceptor),
            channel,
        })
    }

    /// Takes `key` exclusively, waiting for it as long as needed (24 h at most).
    pub async fn lock(&self, key: &str) -> Result<LockGuard, ClientError> {
        let options = LockOptions {
            wait: Some(crate::proto::limits::MAX_WAIT),
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
            value: options.value,
            // The guard's session is its own: it is the holder.
            holder: String::new(),
        };
        send(&tx, lease_request::Command::Acquire(acquire)).await?;
        let mut started = None;
        let granted = loop {
            let event = events
                .next()
                .await
                .ok_or_else(|| ClientError::Unavailable("the sidecar ended the stream".into()))?
                .map_err(|s| from_status(&s))?
                .event;
            match event {
                Some(lease_response::Event::Started(s)) => started = Some(s),
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
                _ => continue, // Waiting
            }
        };
        let started = started.unwrap_or_default();
        let default_ttl = started.default_ttl.and_then(|d| Duration::try_from(d).ok());
        let (state_tx, state_rx) = watch::channel(LockState::Held);
        let answers = Answers::default();
        let (requests, requests_rx) = mpsc::channel(4);
        // Reads the rest of the stream, and resumes the session when it breaks (see
        // `resume.rs`): answers go to whoever awaits them; Lost, or a stream that
        // cannot be resumed while the lock is surely held, means the lock is gone.
        let lock = resume::Followed {
            grpc: self.grpc.clone(),
            key: key.to_owned(),
            token: started.resume_token,
            ttl: options.ttl.or(default_ttl).unwrap_or_default(),
            tx,
            events,
            answers: answers.clone(),
        };
        let reader = tokio::spawn(resume::follow(lock, requests_rx, state_tx));
        Ok(LockGuard {
            key: key.to_owned(),
            token: granted.fencing_token,
            tx: requests,
            state: state_rx,
            answers,
            next_id: std::sync::atomic::AtomicU64::new(2),
            reader,
        })
    }

    /// Campaigns for leadership of `key` with `value` (who you are, where to reach
    /// you), waiting as long as it takes (24 h at most): candidates win in the order
    /// they campaigned, on every sidecar of the store (a fair lock). Returns once this
    /// candidate leads; followers see `value` in the key's holder (`watch`,
    /// `describe`).
    pub async fn campaign(&self, key: &str, value: &[u8]) -> Result<Leader, ClientError> {
        let options = LockOptions {
            wait: Some(crate::proto::limits::MAX_WAIT),
            value: value.to_vec(),
            ..LockOptions::default()
        };
        self.campaign_with(key, options).await
    }

    /// Campaigns as [`Client::campaign`], with the wait, TTL and value of `options`;
    /// leadership is always an EXCLUSIVE lock taken in arrival order (`shared`,
    /// `limit` and `fair` are ignored).
    pub async fn campaign_with(
        &self,
        key: &str,
        options: LockOptions,
    ) -> Result<Leader, ClientError> {
        let options = LockOptions {
            shared: false,
            limit: 0,
            fair: true,
            ..options
        };
        Ok(Leader::new(self.lock_with(key, options).await?))
    }

    /// Follows `key`: its state now, then each change (a grant, a release, an expiry,
    /// a holder's value), as `describe` would answer it. A slow reader gets the latest
    /// state, skipping those in between. The stream ends with an error when the
    /// sidecar goes away or shuts down.
    pub async fn watch(&self, key: &str) -> Result<WatchStream, ClientError> {
        let mut grpc = self.grpc.clone();
        let states = grpc
            .watch(proto::WatchRequest {
                key: key.to_owned(),
            })
            .await
            .map_err(|s| from_status(&s))?
            .into_inner();
        Ok(states::from_grpc(states))
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

pub(super) async fn send(
    tx: &mpsc::Sender<proto::LeaseRequest>,
    command: lease_request::Command,
) -> Result<(), ClientError> {
    tx.send(proto::LeaseRequest {
        command: Some(command),
    })
    .await
    .map_err(|_| ClientError::Unavailable("the sidecar ended the stream".into()))
}
