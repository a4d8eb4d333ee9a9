//! The engine: sessions, renewals, waiters and deadlines. It owns time and knows no
//! Redis and no protobuf: the API hands it [`Command`]s and turns its [`Event`]s into
//! messages; a [`Store`] keeps the locks.
//!
//! This file has the [`Engine`] handle and what its sessions share; the protocol types
//! are in `protocol.rs`, the limits and defaults in `config.rs`, the routing of the
//! store's notices to waiters and watchers in `notices.rs`, the sessions in `session/`.

mod config;
mod journal;
mod mailbox;
mod notices;
mod protocol;
mod release;
mod renewer;
mod resume;
mod session;
mod view;
mod wakers;
mod watches;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{Semaphore, mpsc};
use tokio_stream::Stream;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::metrics::store::MeteredStore;
use crate::proto::limits::{MAX_HOLDER_BYTES, MAX_KEY_BYTES};
/// Why a resume was refused ([`EngineError::NotResumable`]).
pub use crate::store::Refusal;
use crate::store::{Store, StoreCheck};
pub use config::EngineConfig;
use journal::Journal;
use notices::dispatch_notices;
pub use protocol::{
    AcquireAllRequest, AcquireRequest, Command, EndReason, EngineError, Event, GrantedKey, Inbound,
    Mode, NotAcquiredReason, RejectCode, Rejection, ResumeToken, STORE_OUT_OF_MEMORY,
};
pub(crate) use release::release_in_background;
use renewer::Renewer;
pub use view::{HolderView, KeyView, QueuedView};
use wakers::Wakers;
pub use watches::WatchStream;
use watches::Watches;

/// Store calls that sessions may have in flight at once; more wait their turn. A burst
/// of 10,000 acquires then costs Redis and the sidecar's memory what 256 cost, while
/// 256 concurrent round trips keep the store busy.
pub const MAX_STORE_CALLS: usize = 256;
/// How much of bad client input an answer may echo.
pub(crate) const ECHO_BYTES: usize = 64;

/// `bytes` random bytes from the OS, as lowercase hex: session ids, owner secrets.
pub fn random_hex(bytes: usize) -> Result<String, getrandom::Error> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
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

/// Checks a holder name against the contract: at most 128 bytes, no control
/// characters ("" is the session itself).
pub fn validate_holder(holder: &str) -> Result<(), String> {
    if holder.len() > MAX_HOLDER_BYTES {
        return Err(format!(
            "holder is {} bytes long; at most {MAX_HOLDER_BYTES} are allowed",
            holder.len()
        ));
    }
    if let Some(pos) = holder.find(char::is_control) {
        return Err(format!("holder has a control character at byte {pos}"));
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
    pub(crate) watches: Arc<Watches>,
    pub(crate) renewer: Renewer,
    /// Keeps the sessions' records in the store (resuming).
    pub(crate) journal: Journal,
    /// This process's id in the store (its attachment, its sessions' records).
    pub(crate) sidecar_id: String,
    /// The sessions running in this process (resumed ones included), by id, with their
    /// secrets: a session of this process is never resumed from under its stream, even
    /// by this process (its record names this sidecar, whose attachment is then no
    /// proof), and only its secret's holder is told that it is attached.
    pub(crate) live: std::sync::Mutex<std::collections::HashMap<String, String>>,
    pub(crate) shutdown: CancellationToken,
    next_lease: AtomicU64,
}

impl Shared {
    pub(crate) fn next_lease_id(&self) -> u64 {
        self.next_lease.fetch_add(1, Ordering::Relaxed)
    }

    /// Notes that session `id` runs in this process with `secret`, or (`None`) no
    /// longer does.
    fn set_live(&self, id: &str, secret: Option<&str>) {
        if let Ok(mut ids) = self.live.lock() {
            match secret {
                Some(secret) => ids.insert(id.to_owned(), secret.to_owned()),
                None => ids.remove(id),
            };
        }
    }

    /// Whether session `id` runs in this process, and whether under `secret`.
    pub(crate) fn live_as(&self, id: &str, secret: &str) -> Option<bool> {
        match self.live.lock() {
            Ok(ids) => ids.get(id).map(|s| s == secret),
            // Poisoned: taken as live, under another secret (refused as unknown).
            Err(_) => Some(false),
        }
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
        let store_calls = Arc::new(Semaphore::new(MAX_STORE_CALLS));
        let watches = Arc::new(Watches::new(
            store.clone(),
            store_calls.clone(),
            shutdown.clone(),
            config.max_watches,
        ));
        tokio::spawn(dispatch_notices(
            store.notices(),
            wakers.clone(),
            metrics.clone(),
            watches.clone(),
            shutdown.clone(),
        ));
        let renewer = Renewer::spawn(
            store.clone(),
            metrics.clone(),
            shutdown.clone(),
            config.clock_drift,
        );
        let sidecar_id = match &config.instance {
            Some(name) => format!("i-{name}"),
            None => crate::store::random_id(),
        };
        let journal = Journal::spawn(store.clone(), sidecar_id.clone(), config.attachment_ttl);
        let sessions = Arc::new(Semaphore::new(config.max_sessions));
        metrics.watch_store_calls(store_calls.clone(), MAX_STORE_CALLS);
        Self {
            shared: Arc::new(Shared {
                store,
                metrics,
                config,
                wakers,
                watches,
                renewer,
                journal,
                sidecar_id,
                live: Default::default(),
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
        let permit = self.session_permit()?;
        let session = session::Session::new(self.shared.clone(), client_name, outbound)?;
        self.spawn_session(session, inbound, permit, &trace);
        Ok(())
    }

    /// Runs `session` on `inbound` in its own task, holding `permit` until it has
    /// released everything.
    fn spawn_session<S>(
        &self,
        session: session::Session,
        inbound: S,
        permit: tokio::sync::OwnedSemaphorePermit,
        trace: &crate::telemetry::TraceContext,
    ) where
        S: Stream<Item = Inbound> + Send + Unpin + 'static,
    {
        crate::telemetry::set_remote_parent(session.span(), trace);
        let sessions = self.shared.metrics.sessions.clone();
        sessions.inc();
        let shared = self.shared.clone();
        let id = session.id().to_owned();
        shared.set_live(&id, Some(session.secret()));
        tokio::spawn(async move {
            session.run(inbound).await;
            shared.set_live(&id, None);
            sessions.dec();
            drop(permit);
        });
    }

    /// A permit for one more session, unless the sidecar shuts down or is full.
    fn session_permit(&self) -> Result<tokio::sync::OwnedSemaphorePermit, EngineError> {
        if self.shared.shutdown.is_cancelled() {
            return Err(EngineError::ShuttingDown);
        }
        self.sessions.clone().try_acquire_owned().map_err(|_| {
            EngineError::ResourceExhausted(format!(
                "this sidecar already has {} sessions, its limit",
                self.shared.config.max_sessions
            ))
        })
    }

    /// The state of `key` in the store.
    pub async fn describe(&self, key: &str) -> Result<KeyView, EngineError> {
        validate_key(key).map_err(EngineError::InvalidArgument)?;
        Ok(self.shared.store.describe(key).await?.into())
    }

    /// Follows `key`: its state now, then each change, on this sidecar or any other of
    /// the same store (see `engine/watches.rs`). Fails INVALID_ARGUMENT for a bad key,
    /// RESOURCE_EXHAUSTED at [`EngineConfig::max_watches`], and with the store's error
    /// when the key cannot be read now.
    pub async fn watch(&self, key: &str) -> Result<WatchStream, EngineError> {
        if self.shared.shutdown.is_cancelled() {
            return Err(EngineError::ShuttingDown);
        }
        validate_key(key).map_err(EngineError::InvalidArgument)?;
        self.shared.watches.watch(key).await
    }

    /// Open watches.
    pub fn watches(&self) -> usize {
        self.shared.watches.count()
    }

    /// Checks that the store answers.
    pub async fn ping(&self) -> Result<(), EngineError> {
        Ok(self.shared.store.ping().await?)
    }

    /// What the store allows this sidecar and whether it may evict its keys.
    pub async fn check_store(&self) -> Result<StoreCheck, EngineError> {
        Ok(self.shared.store.check().await?)
    }

    /// Tells every session to release its locks and end; refuses new sessions.
    pub fn shutdown(&self) {
        self.shared.shutdown.cancel();
    }

    /// Completes when every session has ended and released its locks, and their
    /// records are gone from the store.
    pub async fn drained(&self) {
        let all = u32::try_from(self.shared.config.max_sessions).unwrap_or(u32::MAX);
        // Every session holds one permit until it has released everything.
        let _ = self.sessions.acquire_many(all).await;
        self.shared.journal.flush().await;
    }

    /// Open sessions.
    pub fn sessions(&self) -> usize {
        self.shared.config.max_sessions - self.sessions.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
    fn holders_are_checked() {
        assert!(validate_holder("").is_ok());
        assert!(validate_holder("thread:140234").is_ok());
        assert!(validate_holder(&"h".repeat(MAX_HOLDER_BYTES)).is_ok());
        assert!(validate_holder(&"h".repeat(MAX_HOLDER_BYTES + 1)).is_err());
        assert!(validate_holder("a\0b").is_err());
        assert!(validate_holder("a\nb").is_err());
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
