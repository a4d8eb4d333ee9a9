//! A server that lost its data (restarted without persistence, or flushed) never makes
//! two holders of one lock.
//!
//! Redis forgets every lock when it restarts empty, while their holders, told nothing,
//! go on holding them. Granting the keys again at once would make two holders, so:
//!
//! - **Detect it.** The store keeps a marker, `{ns:epoch}:e` (`lua/epoch.lua`), that
//!   never expires. Every new connection reads it before any other call goes out on it
//!   (`Link::reconnect`); a sidecar that read an epoch before and finds none, or finds
//!   one that a sidecar which knew none wrote meanwhile, has found the loss. Failover to
//!   a replica keeps the marker (it was replicated long before), so it is not a loss.
//! - **Hold off.** The marker then carries the end of a hold-off (`--restart-hold-off`,
//!   by default the default TTL), in the server's clock: every sidecar, whichever
//!   connects first, grants nothing new until then; acquires are answered busy for what
//!   is left of it (waiters wait it out). Antirez's "delayed restart", done by the
//!   sidecars instead of by the operator.
//! - **Re-assert.** Meanwhile a renewal that finds a grant gone makes its session write
//!   the grant back (`lua/reassert.lua`) with the same owner, hold count and token,
//!   instead of telling its client `Lost`: holders keep their locks through the restart.
//!   A holder whose sidecar cannot reach the server loses its lock by its safe deadline,
//!   which the hold-off outlasts for every TTL up to the hold-off.
//!
//! On a Cluster each master keeps a marker of its own, and the cluster client
//! reconnects to a node by itself, with no call of ours first: a dropped connection
//! (its push) marks every marker to be read again, and a grant or a renewal reads them
//! first (`cluster.rs`).
//!
//! What it cannot see: a sidecar that never connected before (it knew no epoch) and
//! reaches a server that lost its data before any sidecar that knew it cannot tell it
//! from a new server. The first sidecar that knew the old epoch to arrive starts the
//! hold-off then (see docs/guarantees.md).
//!
//! This file has the marker's reading ([`Restarts::greet`]), the hold-off, and the
//! store's side of acquiring under it and of re-asserting; `cluster.rs` the markers of
//! a Cluster's masters.

mod cluster;

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use deadpool_redis::redis::aio::{ConnectionLike, MultiplexedConnection};
use deadpool_redis::redis::{self, Value};
use tokio::sync::watch;
use tokio::time::Instant;

use super::replies::ms;
use super::{RedisStore, tail};
use crate::store::{Acquired, Claim, StoreError};

/// The marker, the hold-off, and who wants to hear that one began.
pub(crate) struct Restarts {
    namespace: String,
    marker: String,
    hold_off: Duration,
    script: redis::Script,
    /// The epoch read last in each marker (one; on a Cluster, one per master).
    epochs: Mutex<HashMap<String, String>>,
    /// When the hold-off ends, in ns after `base` (0: none): asked by every acquire,
    /// so one atomic load when none runs.
    until: AtomicU64,
    base: Instant,
    /// Bumped when a hold-off begins (and, on a Cluster, when a node's connection
    /// drops): the renewer renews every grant at once, so that grants with long TTLs
    /// are written back before it ends.
    began: watch::Sender<u64>,
    /// Cluster: which markers were read since a node's connection last dropped.
    cluster: cluster::Verified,
}

impl Restarts {
    /// For the keys of `namespace`; `hold_off` zero turns it all off.
    pub(crate) fn new(namespace: &str, hold_off: Duration) -> Self {
        Self {
            namespace: namespace.to_owned(),
            marker: format!("{{{namespace}:epoch}}:e"),
            hold_off,
            script: redis::Script::new(include_str!("../../lua/epoch.lua")),
            epochs: Mutex::default(),
            until: AtomicU64::new(0),
            base: Instant::now(),
            began: watch::channel(0).0,
            cluster: cluster::Verified::default(),
        }
    }

    fn epochs(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.epochs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long new grants are still held off, if they are.
    pub(crate) fn holding_off(&self) -> Option<Duration> {
        let until = match self.until.load(Ordering::Acquire) {
            0 => return None,
            nanos => self.base + Duration::from_nanos(nanos),
        };
        let left = until.saturating_duration_since(Instant::now());
        (!left.is_zero()).then_some(left)
    }

    /// Changes when a hold-off begins.
    pub(crate) fn began(&self) -> watch::Receiver<u64> {
        self.began.subscribe()
    }

    /// Reads (or writes) the marker on a new connection, before anything else is sent
    /// on it. A connection that fails here is not used; any other failure (a user who
    /// may not run the script: the store's check names it) leaves what was known.
    pub(crate) async fn greet(&self, conn: &mut MultiplexedConnection) -> Result<(), StoreError> {
        if self.hold_off.is_zero() {
            return Ok(());
        }
        self.read(conn, &self.marker).await
    }

    /// Reads (or writes) `marker` on `conn` (see [`Restarts::greet`]).
    async fn read<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        marker: &str,
    ) -> Result<(), StoreError> {
        let known = self.epochs().get(marker).cloned().unwrap_or_default();
        let fresh = crate::store::random_id();
        let reply = self
            .script
            .key(marker)
            .arg(&known)
            .arg(&fresh)
            .arg(ms(self.hold_off))
            .invoke_async::<(String, u64, u8)>(conn)
            .await;
        let (epoch, left, found) = match reply {
            Ok(reply) => reply,
            Err(e) if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() => {
                return Err(StoreError::Unavailable(e.to_string()));
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading the store's epoch marker failed; a restart of the store would not be noticed");
                return Ok(());
            }
        };
        let left = Duration::from_millis(left);
        self.epochs().insert(marker.to_owned(), epoch);
        if left.is_zero() {
            return Ok(());
        }
        let was_holding = self.holding_off().is_some();
        // Counted from the answer: it may end a round trip later here than in the
        // store, never earlier; and a later end (another master's) is kept.
        let until = (Instant::now() + left).saturating_duration_since(self.base);
        let until = u64::try_from(until.as_nanos()).unwrap_or(u64::MAX).max(1);
        self.until.fetch_max(until, Ordering::AcqRel);
        if found == 1 {
            tracing::warn!(
                hold_off = ?left,
                "the store lost its data (restarted empty, or flushed): no new lock is granted until the hold-off ends; locks held through this sidecar are written back"
            );
        } else if !was_holding {
            tracing::info!(hold_off = ?left, "the store lost its data: another sidecar found it; no new lock is granted until the hold-off ends");
        }
        self.began.send_modify(|n| *n += 1);
        Ok(())
    }
}

impl RedisStore {
    /// Whether a grant is not to be sent: a hold-off runs, or (Cluster) a node's
    /// connection dropped since its markers were read at `drops`.
    pub(in crate::store::redis) fn held_off_since(&self, drops: u64) -> bool {
        let restarts = self.link.restarts();
        restarts.holding_off().is_some() || restarts.drops() != drops
    }

    /// Busy for what is left of the hold-off, if one runs: the acquire is not sent.
    pub(super) fn held_off(&self) -> Option<Acquired> {
        let left = self.link.restarts().holding_off()?;
        Some(Acquired::Busy {
            expires_in: left,
            position: 0,
        })
    }

    /// Writes back `claim`'s grant (`count` holds, token `fence`), which the store lost
    /// with its data (`lua/reassert.lua`); only while the hold-off runs, when nobody
    /// else can have been granted it since.
    pub(super) async fn reassert_grant(
        &self,
        claim: &Claim,
        count: u32,
        fence: u64,
    ) -> Result<bool, StoreError> {
        if self.link.restarts().holding_off().is_none() {
            return Ok(false);
        }
        let ttl = ms(claim.ttl);
        let tail = tail(claim);
        let grant = format!("{}|{}|{count}|{fence}", claim.sharing.letter(), claim.limit);
        let args: [&[u8]; 3] = [ttl.as_bytes(), &tail, grant.as_bytes()];
        let held: Value = self
            .invoke(&self.scripts.reassert, &claim.key, &args)
            .await?;
        Ok(matches!(held, Value::Int(1)))
    }
}
