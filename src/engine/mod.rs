//! The engine: sessions, renewals, waiters and deadlines. It owns time and knows no
//! Redis and no protobuf: the API hands it [`Command`]s and turns its [`Event`]s into
//! messages; a [`Store`] keeps the locks.

mod renewer;
mod session;
mod wakers;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc};
use tokio_stream::Stream;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::metrics::Metrics;
use crate::metrics::store::MeteredStore;
use crate::store::{KeyState, Notice, Store, StoreError};
use renewer::Renewer;
use wakers::Wakers;

/// Shortest TTL a client may ask for: renewals every 333 ms are the most a sidecar
/// should do per lock, and shorter leases leave no room for a store round trip.
pub const MIN_TTL: Duration = Duration::from_secs(1);
/// Longest wait a client may ask for; longer values are almost certainly unit mistakes.
pub const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);
/// Longest key in bytes (DESIGN.md).
pub const MAX_KEY_BYTES: usize = 512;
/// Longest client name kept from the `lockside-client-name` header.
pub const MAX_CLIENT_NAME_BYTES: usize = 128;
/// Store calls that sessions may have in flight at once; more wait their turn. A burst
/// of 10,000 acquires then costs Redis and the sidecar's memory what 256 cost, while
/// 256 concurrent round trips keep the store busy.
pub const MAX_STORE_CALLS: usize = 256;
/// How much of bad client input an answer may echo.
const ECHO_BYTES: usize = 64;

/// Limits and defaults of the engine. Every value is documented in the README.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// TTL of an `Acquire` that sets none.
    pub default_ttl: Duration,
    /// Longest TTL a client may ask for.
    pub max_ttl: Duration,
    /// Sessions (open `Lease` streams) per sidecar.
    pub max_sessions: usize,
    /// Locks held or being acquired per session.
    pub max_locks_per_session: usize,
    /// Requests not yet answered per session (waits, queued and in-flight requests).
    pub max_pending_per_session: usize,
    /// Waiting acquires per key on this sidecar.
    pub max_waiters_per_key: usize,
    /// After a session ends without releasing (broken stream, keepalive timeout), its
    /// exclusive locks stay ungranted this long (Chubby's and Consul's lock-delay).
    pub lock_delay: Duration,
    /// How fast the sidecar's clock may run slow against the store's, as a fraction:
    /// every validity is shortened by this share of the TTL (plus 2 ms), so `Lost` comes
    /// before the store lets a lock go while the rates differ by less.
    pub clock_drift: f64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            // Redisson's watchdog default is 30 s; 10 s frees a dead sidecar's locks
            // sooner and still leaves two renewals of slack at TTL/3.
            default_ttl: Duration::from_secs(10),
            max_ttl: Duration::from_secs(3600),
            max_sessions: 10_000,
            max_locks_per_session: 1024,
            max_pending_per_session: 1024,
            max_waiters_per_key: 1024,
            // Off: the contract frees locks the moment a stream ends. A delay protects
            // resources from a client that keeps writing after its stream broke (Consul
            // defaults to 15 s); it is an opt-in per sidecar.
            lock_delay: Duration::ZERO,
            clock_drift: crate::store::DEFAULT_CLOCK_DRIFT,
        }
    }
}

/// Lock mode of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Excludes everyone else.
    Exclusive,
    /// Coexists with other shared holders.
    Shared,
}

/// An `Acquire`, decoded but not yet validated.
#[derive(Clone, Debug)]
pub struct AcquireRequest {
    /// Client's id for the answer.
    pub request_id: u64,
    /// The lock's name.
    pub key: String,
    /// How long to wait when busy; `None` or zero: do not wait.
    pub wait: Option<Duration>,
    /// Lock mode.
    pub mode: Mode,
    /// Semaphore limit (0 or 1: a plain lock).
    pub limit: u32,
    /// FIFO among waiters.
    pub fair: bool,
    /// Requested TTL; `None`: the default.
    pub ttl: Option<Duration>,
    /// The caller's trace context for this acquire (empty: the session's).
    pub trace: crate::telemetry::TraceContext,
}

/// A client command on a session.
#[derive(Clone, Debug)]
pub enum Command {
    /// Take or wait for a lock.
    Acquire(AcquireRequest),
    /// Give back one hold, or cancel a wait.
    Release {
        /// Client's id for the answer.
        request_id: u64,
        /// The lock's name.
        key: String,
    },
}

/// What arrives on a session's inbound side.
#[derive(Debug)]
pub enum Inbound {
    /// A well-formed command.
    Command(Command),
    /// A message the API could not decode into a command; answered `Rejected`.
    Invalid(Rejection),
    /// The transport broke; the session ends.
    Broken(String),
}

/// Why a request was refused. Mapped to a google.rpc code in the API, nowhere else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RejectCode {
    /// A bad value.
    InvalidArgument,
    /// A limit was reached.
    ResourceExhausted,
    /// The request does not fit the session's state.
    FailedPrecondition,
    /// Not built yet.
    Unimplemented,
    /// The store cannot be reached.
    Unavailable,
}

/// A refused request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// The request's id.
    pub request_id: u64,
    /// A short prefix of the request's key.
    pub key: String,
    /// Why.
    pub code: RejectCode,
    /// For humans.
    pub message: String,
}

impl Rejection {
    /// A rejection that echoes at most a short prefix of `key`.
    pub fn new(request_id: u64, key: &str, code: RejectCode, message: impl Into<String>) -> Self {
        Self {
            request_id,
            key: prefix(key, ECHO_BYTES).to_owned(),
            code,
            message: message.into(),
        }
    }
}

/// Why a `NotAcquired`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotAcquiredReason {
    /// Held by someone else and the request did not wait.
    Busy,
    /// Still held when the wait ran out.
    Timeout,
    /// The wait was cancelled.
    Cancelled,
}

/// Why a session's stream is ended by the sidecar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndReason {
    /// The sidecar is shutting down; every lock was released.
    Shutdown,
    /// The client did not read its answers.
    Overflow,
}

/// An event for the client of a session, in the order it must be sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// First event of every session.
    Started {
        /// Public id.
        session_id: String,
        /// TTL of an `Acquire` without one.
        default_ttl: Duration,
    },
    /// A grant.
    Granted {
        /// The `Acquire`'s id.
        request_id: u64,
        /// The key.
        key: String,
        /// Fencing token.
        fence: u64,
        /// Validity left, reduced by the drift margin.
        ttl: Duration,
        /// Holds now.
        hold_count: u32,
    },
    /// A wait began.
    Waiting {
        /// The `Acquire`'s id.
        request_id: u64,
        /// The key.
        key: String,
        /// Queue position (0 when unfair).
        position: u32,
    },
    /// Not acquired.
    NotAcquired {
        /// The `Acquire`'s id.
        request_id: u64,
        /// The key.
        key: String,
        /// Why.
        reason: NotAcquiredReason,
    },
    /// A hold was given back.
    Released {
        /// The `Release`'s id.
        request_id: u64,
        /// The key.
        key: String,
        /// Holds left.
        hold_count: u32,
    },
    /// A lock is no longer held.
    Lost {
        /// The key.
        key: String,
        /// Why.
        reason: String,
        /// The token the session held.
        fence: u64,
    },
    /// A request was refused.
    Rejected(Rejection),
    /// Renewals are failing.
    Jeopardy {
        /// The key.
        key: String,
        /// Validity left.
        ttl_remaining: Duration,
    },
    /// Renewals succeed again.
    Restored {
        /// The key.
        key: String,
        /// Validity left.
        ttl: Duration,
    },
    /// The sidecar ends the stream.
    Ended(EndReason),
}

/// Errors of calls outside a session.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A bad value from the client.
    #[error("{0}")]
    InvalidArgument(String),
    /// A limit was reached.
    #[error("{0}")]
    ResourceExhausted(String),
    /// The store cannot be reached.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The sidecar is shutting down.
    #[error("the sidecar is shutting down")]
    ShuttingDown,
    /// The operating system's random source failed.
    #[error("no randomness for session tokens: {0}")]
    Random(String),
}

/// `bytes` random bytes from the OS, as lowercase hex: session ids, owner secrets.
pub fn random_hex(bytes: usize) -> Result<String, getrandom::Error> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// Releases a grant in the background, ignoring the answer: the owner token is unique
/// per grant, so this can never touch anyone else's lock. For grants the session no
/// longer wants (cancelled, lost, answered too late, renewed after being dropped).
pub(crate) fn release_in_background(store: &Arc<dyn Store>, key: String, owner: String) {
    let store = store.clone();
    tokio::spawn(async move {
        let _ = store.release(&key, &owner, true, Duration::ZERO).await;
    });
}

/// Checks a key against the contract: 1 to 512 bytes, no control characters.
pub fn validate_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("key must not be empty".into());
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(format!(
            "key is {} bytes long; at most {MAX_KEY_BYTES} are allowed",
            key.len()
        ));
    }
    if let Some(pos) = key.find(char::is_control) {
        return Err(format!("key has a control character at byte {pos}"));
    }
    Ok(())
}

/// The longest prefix of `s` within `max` bytes, cut on a character boundary.
pub fn prefix(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Everything sessions share.
pub(crate) struct Shared {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) metrics: Arc<Metrics>,
    /// Turns for sessions' store calls; see [`MAX_STORE_CALLS`].
    pub(crate) store_calls: Arc<Semaphore>,
    pub(crate) config: EngineConfig,
    pub(crate) wakers: Arc<Wakers>,
    pub(crate) renewer: Renewer,
    pub(crate) shutdown: CancellationToken,
    next_lease: AtomicU64,
}

impl Shared {
    pub(crate) fn next_lease_id(&self) -> u64 {
        self.next_lease.fetch_add(1, Ordering::Relaxed)
    }
}

/// The lock engine of one sidecar. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    shared: Arc<Shared>,
    sessions: Arc<Semaphore>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// An engine over `store`. Spawns the renewer and the notice dispatcher, so it must
    /// be called inside a tokio runtime.
    pub fn new(store: Arc<dyn Store>, config: EngineConfig) -> Self {
        let metrics = Arc::new(Metrics::new(crate::metrics::Sidecar {
            store_kind: store.kind(),
            default_ttl: config.default_ttl,
            max_sessions: config.max_sessions,
        }));
        // Every call the engine makes, through sessions, the renewer or health checks,
        // is counted and timed by operation.
        let store: Arc<dyn Store> = Arc::new(MeteredStore::new(store, &metrics));
        let shutdown = CancellationToken::new();
        let wakers = Arc::new(Wakers::default());
        tokio::spawn(dispatch_notices(
            store.notices(),
            wakers.clone(),
            shutdown.clone(),
        ));
        let renewer = Renewer::spawn(
            store.clone(),
            metrics.clone(),
            shutdown.clone(),
            config.clock_drift,
        );
        let sessions = Arc::new(Semaphore::new(config.max_sessions));
        let store_calls = Arc::new(Semaphore::new(MAX_STORE_CALLS));
        metrics.watch_store_calls(store_calls.clone(), MAX_STORE_CALLS);
        Self {
            shared: Arc::new(Shared {
                store,
                metrics,
                config,
                wakers,
                renewer,
                shutdown,
                store_calls,
                next_lease: AtomicU64::new(1),
            }),
            sessions,
        }
    }

    /// The sidecar's metrics.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.shared.metrics.clone()
    }

    /// The engine's limits and defaults.
    pub fn config(&self) -> &EngineConfig {
        &self.shared.config
    }

    /// Starts a session: a task that reads `inbound` and writes events to `outbound`
    /// until either side ends, then releases everything it holds.
    pub fn start_session<S>(
        &self,
        client_name: String,
        trace: crate::telemetry::TraceContext,
        inbound: S,
        outbound: mpsc::Sender<Event>,
    ) -> Result<(), EngineError>
    where
        S: Stream<Item = Inbound> + Send + Unpin + 'static,
    {
        if self.shared.shutdown.is_cancelled() {
            return Err(EngineError::ShuttingDown);
        }
        let permit = self.sessions.clone().try_acquire_owned().map_err(|_| {
            EngineError::ResourceExhausted(format!(
                "this sidecar already has {} sessions, its limit",
                self.shared.config.max_sessions
            ))
        })?;
        let session = session::Session::new(self.shared.clone(), client_name, outbound)?;
        // INFO: exported as a trace span when traces are on (a sidecar's sessions are
        // few and long; this is not per request).
        let span = tracing::info_span!("session", session = %session.id(), client = %session.client_name());
        crate::telemetry::set_remote_parent(&span, &trace);
        let sessions = self.shared.metrics.sessions.clone();
        sessions.inc();
        tokio::spawn(
            async move {
                session.run(inbound).await;
                sessions.dec();
                drop(permit);
            }
            .instrument(span),
        );
        Ok(())
    }

    /// The state of `key` in the store.
    pub async fn describe(&self, key: &str) -> Result<KeyState, EngineError> {
        validate_key(key).map_err(EngineError::InvalidArgument)?;
        Ok(self.shared.store.describe(key).await?)
    }

    /// Checks that the store answers.
    pub async fn ping(&self) -> Result<(), EngineError> {
        Ok(self.shared.store.ping().await?)
    }

    /// Tells every session to release its locks and end; refuses new sessions.
    pub fn shutdown(&self) {
        self.shared.shutdown.cancel();
    }

    /// Completes when every session has ended and released its locks.
    pub async fn drained(&self) {
        let all = u32::try_from(self.shared.config.max_sessions).unwrap_or(u32::MAX);
        // Every session holds one permit until it has released everything.
        let _ = self.sessions.acquire_many(all).await;
    }

    /// Open sessions.
    pub fn sessions(&self) -> usize {
        self.shared.config.max_sessions - self.sessions.available_permits()
    }
}

/// Wakes local waiters on release notices from the store.
async fn dispatch_notices(
    mut notices: tokio::sync::broadcast::Receiver<Notice>,
    wakers: Arc<Wakers>,
    shutdown: CancellationToken,
) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        let notice = tokio::select! {
            _ = shutdown.cancelled() => return,
            notice = notices.recv() => notice,
        };
        match notice {
            Ok(Notice::Released { key, owners }) => wakers.wake(&key, &owners),
            Ok(Notice::Resync) | Err(RecvError::Lagged(_)) => wakers.wake_all(),
            Err(RecvError::Closed) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_checked() {
        assert!(validate_key("orders/42").is_ok());
        assert!(validate_key("").is_err());
        assert!(validate_key(&"k".repeat(512)).is_ok());
        assert!(validate_key(&"k".repeat(513)).is_err());
        assert!(validate_key("a\nb").is_err());
        assert!(validate_key("a\u{7f}b").is_err());
        assert!(validate_key("ключ").is_ok());
    }

    #[test]
    fn prefixes_cut_on_char_boundaries() {
        assert_eq!(prefix("abc", 10), "abc");
        assert_eq!(prefix("ééé", 3), "é");
    }

    #[test]
    fn margin_is_one_percent_plus_two_ms() {
        assert_eq!(
            crate::store::drift_margin(Duration::from_secs(10), crate::store::DEFAULT_CLOCK_DRIFT),
            Duration::from_millis(102)
        );
    }
}
