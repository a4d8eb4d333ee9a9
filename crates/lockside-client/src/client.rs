//! A client: a channel to one sidecar and one session on it at a time, opened on the
//! first lock and again after one ended; `describe`, `watch` and the health check are
//! plain calls.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockside_proto::lock_service_client::LockServiceClient;
use lockside_proto::{self as proto};
use tonic::transport::Channel;

use crate::connect::{Bearer, ConnectOptions, channel};
use crate::error::{from_status, refusal};
use crate::lock::{Leader, Listener, LockCell, LockGuard};
use crate::session::{OpenError, Session, Settings};
use crate::watch::{WatchStream, from_grpc};
use crate::{ClientError, Grpc, LockOptions, releasing};

/// How a client behaves beyond how it reaches the sidecar.
#[derive(Clone)]
pub struct ClientSettings {
    /// Resume the session when its stream breaks (its locks suspended meanwhile);
    /// false: a break loses every lock at once.
    pub resume: bool,
    /// How long a sidecar that accepted the connection may take to open a session.
    pub connect_timeout: Duration,
    /// Told of every change of a lock's state (the bindings' events).
    pub listener: Option<Listener>,
}

impl Default for ClientSettings {
    fn default() -> Self {
        Self {
            resume: true,
            connect_timeout: Duration::from_secs(10),
            listener: None,
        }
    }
}

impl std::fmt::Debug for ClientSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientSettings")
            .field("resume", &self.resume)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

/// A granted lock as the bindings hold it: unlike [`LockGuard`], dropping it does
/// nothing (a lock is released by `release`, or when its session ends).
#[derive(Clone, Debug)]
pub struct LockHandle {
    pub(crate) session: Arc<Session>,
    pub(crate) cell: Arc<LockCell>,
}

impl LockHandle {
    /// The grant and its state.
    pub fn cell(&self) -> &Arc<LockCell> {
        &self.cell
    }

    /// Gives the lock back; returns once the `Release` is on the stream. `Lost` (once)
    /// for a lock lost before.
    pub fn release(&self) -> Result<(), ClientError> {
        self.session.release(&self.cell)
    }

    /// Replaces the grant's value (at most 4 KiB) and waits for the answer.
    pub async fn proclaim(&self, value: Vec<u8>) -> Result<(), ClientError> {
        self.session.proclaim(&self.cell, value).await
    }

    /// The Rust guard of this lock (released when dropped).
    pub fn into_guard(self) -> LockGuard {
        LockGuard {
            session: self.session,
            cell: self.cell,
            done: false,
        }
    }
}

struct Core {
    addr: String,
    grpc: Grpc,
    channel: Channel,
    wait_for_sidecar: Option<Duration>,
    settings: ClientSettings,
    session: Mutex<Option<Arc<Session>>>,
    opening: tokio::sync::Mutex<()>,
    closed: AtomicBool,
}

/// A connection to a sidecar and one session on it. Cheap to clone: clones share the
/// session. Each `lock()` is a holder of its own in the session (two guards of one key
/// exclude each other, whichever tasks hold them). When the stream breaks every lock is
/// suspended ([`crate::LockState::Suspended`]: stop using it) and the session resumed
/// with its resume token, on the restarted sidecar or any other on the same store: each
/// lock is held again if it comes back, and lost when it does not, when resuming is
/// refused, or when its TTL has passed since the break. A session that cannot be
/// resumed ends, and the next lock opens a new one at once. The channel uses HTTP/2
/// keepalive of 1 s / 1 s, well below any TTL, so a frozen sidecar is noticed in time.
#[derive(Clone)]
pub struct Client {
    core: Arc<Core>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("addr", &self.core.addr)
            .finish()
    }
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
        let deadline = options
            .wait_for_sidecar
            .map(|w| tokio::time::Instant::now() + w);
        let mut said = false;
        loop {
            match channel(addr, options, false).await {
                Ok(channel) => {
                    return Self::build(addr, options, channel, ClientSettings::default());
                }
                Err(e @ (ClientError::NoSidecar { .. } | ClientError::Unavailable(_)))
                    if deadline.is_some_and(|d| tokio::time::Instant::now() < d) =>
                {
                    if !said {
                        said = true;
                        tracing::warn!(%addr, wait = ?options.wait_for_sidecar, why = %e, "waiting for the sidecar");
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// A client that connects on its first call (the bindings': a new session fails
    /// at once when nothing listens, or waits for `options.wait_for_sidecar`). Must be
    /// called inside a tokio runtime.
    pub fn lazy(
        addr: &str,
        options: &ConnectOptions,
        settings: ClientSettings,
    ) -> Result<Self, ClientError> {
        let channel = futures_ready(channel(addr, options, true))?;
        Self::build(addr, options, channel, settings)
    }

    fn build(
        addr: &str,
        options: &ConnectOptions,
        channel: Channel,
        settings: ClientSettings,
    ) -> Result<Self, ClientError> {
        let grpc = LockServiceClient::with_interceptor(channel.clone(), Bearer::new(options)?);
        Ok(Self {
            core: Arc::new(Core {
                addr: addr.to_owned(),
                grpc,
                channel,
                wait_for_sidecar: options.wait_for_sidecar,
                settings,
                session: Mutex::new(None),
                opening: tokio::sync::Mutex::new(()),
                closed: AtomicBool::new(false),
            }),
        })
    }

    /// The address the client was given.
    pub fn addr(&self) -> &str {
        &self.core.addr
    }

    /// The current session's id (as `describe` shows it; the same across a resume);
    /// `None` before the first lock and after a session ended.
    pub fn session_id(&self) -> Option<String> {
        self.current().and_then(|s| s.session_id())
    }

    fn current(&self) -> Option<Arc<Session>> {
        self.core.session.lock().ok().and_then(|s| s.clone())
    }

    /// The session, opened if there is none (or the last one ended).
    pub(crate) async fn session(&self) -> Result<Arc<Session>, ClientError> {
        let usable = |s: &Arc<Session>| s.ended().is_none();
        if self.core.closed.load(Ordering::Relaxed) {
            return Err(ClientError::Settings("the client is closed".into()));
        }
        if let Some(session) = self.current().filter(usable) {
            return Ok(session);
        }
        let _opening = self.core.opening.lock().await;
        if let Some(session) = self.current().filter(usable) {
            return Ok(session);
        }
        let session = self.open().await?;
        if self.core.closed.load(Ordering::Relaxed) {
            session.close(Duration::from_secs(2)).await;
            return Err(ClientError::Settings("the client is closed".into()));
        }
        if let Ok(mut current) = self.core.session.lock() {
            *current = Some(session.clone());
        }
        Ok(session)
    }

    /// Opens a session: at once when the sidecar is there; with nothing listening,
    /// fails naming the address and the cause, or waits for `wait_for_sidecar`.
    async fn open(&self) -> Result<Arc<Session>, ClientError> {
        let core = &self.core;
        let settings = Settings {
            resume: core.settings.resume,
            listener: core.settings.listener.clone(),
        };
        let deadline = core
            .wait_for_sidecar
            .map(|w| tokio::time::Instant::now() + w);
        let mut said = false;
        loop {
            let opened = tokio::time::timeout(
                core.settings.connect_timeout,
                Session::open(&core.grpc, settings.clone()),
            )
            .await;
            let status = match opened {
                Ok(Ok(session)) => return Ok(session),
                Ok(Err(OpenError::Failed(e))) => return Err(e),
                Ok(Err(OpenError::NotAnswered(status))) => status,
                Err(_) => {
                    return Err(ClientError::Unavailable(format!(
                        "no answer from the sidecar at {} within {}",
                        core.addr,
                        crate::error::format_duration(core.settings.connect_timeout)
                    )));
                }
            };
            let error = match refusal(&status) {
                Some(cause) => ClientError::NoSidecar {
                    addr: core.addr.clone(),
                    cause,
                },
                None => from_status(&status),
            };
            let waiting = matches!(
                error,
                ClientError::NoSidecar { .. } | ClientError::Unavailable(_)
            ) && deadline.is_some_and(|d| tokio::time::Instant::now() < d);
            if !waiting {
                return Err(error);
            }
            if !said {
                said = true;
                let wait = core.wait_for_sidecar.unwrap_or_default();
                let cause = match &error {
                    ClientError::NoSidecar { cause, .. } => cause.words().to_owned(),
                    other => other.to_string(),
                };
                tracing::warn!(
                    "no sidecar at {} yet ({cause}): waiting up to {} for it",
                    core.addr,
                    crate::error::format_duration(wait)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Takes `key` for `holder` (`None`: a holder of its own) as `options` say; the
    /// bindings' lock (dropping the handle does not release it).
    pub async fn acquire(
        &self,
        key: &str,
        options: &LockOptions,
        holder: Option<&str>,
    ) -> Result<LockHandle, ClientError> {
        // A session that ends before the request went out is not this caller's
        // failure: ask the next one.
        for _ in 0..3 {
            let session = self.session().await?;
            match session.acquire(key, options, holder).await {
                Ok(cell) => return Ok(LockHandle { session, cell }),
                Err(Some(e)) => return Err(e),
                Err(None) => continue,
            }
        }
        Err(ClientError::Unavailable(
            "lease stream ended before the request went out".into(),
        ))
    }

    /// Takes `key` exclusively, waiting for it as long as needed (24 h at most).
    pub async fn lock(&self, key: &str) -> Result<LockGuard, ClientError> {
        let options = LockOptions {
            wait: Some(crate::limits::MAX_WAIT),
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
        Ok(self.acquire(key, &options, None).await?.into_guard())
    }

    /// Campaigns for leadership of `key` with `value` (who you are, where to reach
    /// you), waiting as long as it takes (24 h at most): candidates win in the order
    /// they campaigned, on every sidecar of the store (a fair lock). Returns once this
    /// candidate leads; followers see `value` in the key's holder (`watch`,
    /// `describe`).
    pub async fn campaign(&self, key: &str, value: &[u8]) -> Result<Leader, ClientError> {
        let options = LockOptions {
            wait: Some(crate::limits::MAX_WAIT),
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
        releasing::settled(key, None).await;
        let mut grpc = self.core.grpc.clone();
        let states = grpc
            .watch(proto::WatchRequest {
                key: key.to_owned(),
            })
            .await
            .map_err(|s| from_status(&s))?
            .into_inner();
        Ok(from_grpc(states))
    }

    /// Whether the sidecar reports SERVING on `grpc.health.v1` (its store answers).
    pub async fn serving(&self) -> Result<bool, ClientError> {
        use tonic_health::pb::HealthCheckRequest;
        use tonic_health::pb::health_check_response::ServingStatus;
        let mut health =
            tonic_health::pb::health_client::HealthClient::new(self.core.channel.clone());
        let response = health
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .map_err(|s| from_status(&s))?;
        Ok(response.into_inner().status == ServingStatus::Serving as i32)
    }

    /// The state of `key` as the sidecar's store sees it (after the releases of it
    /// this process made: see [`LockGuard::release`]).
    pub async fn describe(&self, key: &str) -> Result<proto::DescribeResponse, ClientError> {
        releasing::settled(key, None).await;
        let mut grpc = self.core.grpc.clone();
        let response = grpc
            .describe(proto::DescribeRequest {
                key: key.to_owned(),
            })
            .await
            .map_err(|s| from_status(&s))?;
        Ok(response.into_inner())
    }

    /// Ends the session (the sidecar releases every lock it holds; they are let go)
    /// and refuses new locks. Waits up to 2 s for the sidecar to end the stream.
    pub async fn close(&self) {
        self.core.closed.store(true, Ordering::Relaxed);
        let session = self.core.session.lock().ok().and_then(|mut s| s.take());
        if let Some(session) = session {
            session.close(Duration::from_secs(2)).await;
        }
    }
}

/// The value of a future that is ready at once (a lazy channel is made without
/// waiting).
fn futures_ready<T>(future: impl std::future::Future<Output = T>) -> T {
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    let mut future = std::pin::pin!(future);
    match future.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(value) => value,
        std::task::Poll::Pending => unreachable!("a lazy channel is made without waiting"),
    }
}
