//! A store that comes back with less than it had (restarted empty or from a snapshot,
//! failed over to a replica that missed the last writes, a Cluster slot served by
//! another node) never makes two holders of one lock.
//!
//! Redis forgets the locks granted after its last snapshot when it restarts from it, and
//! a replica promoted by a failover lacks what it had not received yet, while their
//! holders, told nothing, go on holding them. Granting the keys again at once would make
//! two holders, so:
//!
//! - **Detect it.** The store keeps a marker, `{ns:epoch}:e` (`lua/epoch.lua`), that
//!   never expires. Every new connection reads it before any other call goes out on it
//!   (`Link::reconnect`). The marker names the *tenure* that read it last: the server
//!   process (`run_id`) and its replication history (`master_replid`), both new after
//!   any restart, the second after a promotion. A marker that names another tenure, or
//!   none (the server lost everything, and this sidecar knew the marker), is a
//!   discontinuity: the data may have gone back.
//! - **Hold off.** The marker then carries the end of a hold-off (`--restart-hold-off`,
//!   by default the default TTL), in the server's clock: every sidecar, whichever
//!   connects first, grants nothing new until then; acquires are answered busy for what
//!   is left of it (waiters wait it out). Antirez's "delayed restart", done by the
//!   sidecars instead of by the operator. `--durable-store` (a store that never loses
//!   an acknowledged write) holds off only when the marker is gone.
//! - **Re-assert.** Meanwhile a renewal that finds a grant gone makes its session write
//!   the grant back (`lua/reassert.lua`) with the same owner, hold count and token,
//!   instead of telling its client `Lost`: holders keep their locks through the loss.
//!   A holder whose sidecar cannot reach the server loses its lock by its safe deadline,
//!   which the hold-off outlasts for every TTL up to the hold-off.
//!
//! One server's connection reaches one process, so reading the marker first on every
//! connection is enough there. A Cluster connection is redis-rs' own: it follows MOVED,
//! reconnects to a restarted node and sends the call again by itself. There each master
//! keeps a marker of its own, and the scripts that grant or keep a grant check, on the
//! node that runs them, that its tenure was read (`witness.rs`, `lua/guard.lua`).
//!
//! What it cannot see: a sidecar that never connected before (it knew no marker) and
//! reaches a server that lost everything before any sidecar that knew it cannot tell
//! it from a new server. The first sidecar that knew the old epoch to arrive starts the
//! hold-off then (see docs/guarantees.md).
//!
//! This file has the marker's reading ([`Restarts::greet`]), the hold-off, and the
//! store's side of acquiring under it and of re-asserting; `witness.rs` the markers and
//! witnesses of a Cluster's masters.

mod witness;

pub(crate) use witness::{UNVERIFIED, Witnesses, unverified};

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

/// What one reading of a marker found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reading {
    /// The witness of the marker's tenure (`lua/epoch.lua`): subscribed to on a
    /// Cluster, it lets this sidecar's guarded calls run on that master.
    pub(crate) witness: String,
}

/// The marker, the hold-off, and who wants to hear that one began.
pub(crate) struct Restarts {
    marker: String,
    hold_off: Duration,
    /// `--durable-store`: a changed tenure is no discontinuity.
    durable: bool,
    script: redis::Script,
    /// The epoch read last in each marker (one; on a Cluster, one per master).
    epochs: Mutex<HashMap<String, String>>,
    /// When the hold-off ends, in ns after `base` (0: none): asked by every acquire,
    /// so one atomic load when none runs.
    until: AtomicU64,
    base: Instant,
    /// Bumped when a hold-off begins (and, on a Cluster, when a master's tenure must be
    /// read again): the renewer renews every grant at once, so that grants with long
    /// TTLs are written back before it ends.
    began: watch::Sender<u64>,
}

impl Restarts {
    /// For the keys of `namespace`; `hold_off` zero turns it all off.
    pub(crate) fn new(namespace: &str, hold_off: Duration, durable: bool) -> Self {
        Self {
            marker: format!("{{{namespace}:epoch}}:e"),
            hold_off,
            durable,
            script: redis::Script::new(include_str!("../../lua/epoch.lua")),
            epochs: Mutex::default(),
            until: AtomicU64::new(0),
            base: Instant::now(),
            began: watch::channel(0).0,
        }
    }

    fn epochs(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.epochs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The marker's key on one server.
    pub(crate) fn marker(&self) -> &str {
        &self.marker
    }

    /// Whether the marker is watched at all (`--restart-hold-off` not zero).
    pub(crate) fn watched(&self) -> bool {
        !self.hold_off.is_zero()
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

    /// The renewer renews every grant at once (a master's tenure is in doubt: a grant
    /// it lost is found, and written back, within moments rather than at the next
    /// renewal).
    pub(crate) fn renew_now(&self) {
        if self.watched() {
            self.began.send_modify(|n| *n += 1);
        }
    }

    /// Reads (or writes) the marker on a new connection, before anything else is sent
    /// on it. A connection that fails here is not used; any other failure (a user who
    /// may not run the script: the store's check names it) leaves what was known.
    pub(crate) async fn greet(&self, conn: &mut MultiplexedConnection) -> Result<(), StoreError> {
        if !self.watched() {
            return Ok(());
        }
        self.read(conn, &self.marker).await.map(drop)
    }

    /// Reads (or writes) `marker` on `conn` (see [`Restarts::greet`]). `None` when the
    /// server answered but would not run the script (the failure is logged).
    async fn read<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        marker: &str,
    ) -> Result<Option<Reading>, StoreError> {
        let known = self.epochs().get(marker).cloned().unwrap_or_default();
        let reply = self
            .script
            .key(marker)
            .arg(&known)
            .arg(crate::store::random_id())
            .arg(ms(self.hold_off))
            .arg(crate::store::random_id())
            .arg(if self.durable { "1" } else { "0" })
            .invoke_async::<(String, u64, u8, String)>(conn)
            .await;
        let (epoch, left, found, witness) = match reply {
            Ok(reply) => reply,
            Err(e) if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() => {
                return Err(StoreError::Unavailable(e.to_string()));
            }
            // A server still loading its data (a restart from a snapshot or an AOF,
            // the very moment to notice) or not a master: nothing goes out on this
            // connection (the nemesis found a grant made 28 ms after a restart from
            // an older AOF, on a connection whose marker read met LOADING).
            Err(e) if not_ready(&e) => {
                return Err(StoreError::Unavailable(format!(
                    "the store's epoch marker could not be read yet: {e}"
                )));
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading the store's epoch marker failed; a restart or failover of the store would not be noticed");
                return Ok(None);
            }
        };
        let left = Duration::from_millis(left);
        self.epochs().insert(marker.to_owned(), epoch);
        let reading = Reading { witness };
        if left.is_zero() {
            return Ok(Some(reading));
        }
        let was_holding = self.holding_off().is_some();
        // Counted from the answer: it may end a round trip later here than in the
        // store, never earlier; and a later end (another master's) is kept.
        let until = (Instant::now() + left).saturating_duration_since(self.base);
        let until = u64::try_from(until.as_nanos()).unwrap_or(u64::MAX).max(1);
        self.until.fetch_max(until, Ordering::AcqRel);
        match found {
            1 => tracing::warn!(
                hold_off = ?left,
                "the store lost its data (restarted empty, or flushed): no new lock is granted until the hold-off ends; locks held through this sidecar are written back"
            ),
            2 => tracing::warn!(
                hold_off = ?left,
                "the store may have come back with less than it had (restarted, from a snapshot or an AOF; failed over to a replica): no new lock is granted until the hold-off ends; locks held through this sidecar are written back"
            ),
            _ if !was_holding => tracing::info!(
                hold_off = ?left,
                "the store may have lost data: another sidecar found it; no new lock is granted until the hold-off ends"
            ),
            _ => {}
        }
        self.began.send_modify(|n| *n += 1);
        Ok(Some(reading))
    }
}

impl RedisStore {
    /// Whether a grant is not to be sent for the hold-off. One server holds off as a
    /// whole; on a Cluster each master's own marker says so, inside the acquire script
    /// on that master (`lua/guard.lua`): a master that failed over holds off its own
    /// slots, not every master's.
    pub(super) fn held_off_here(&self) -> bool {
        !self.link.is_cluster() && self.link.restarts().holding_off().is_some()
    }

    /// Busy for what is left of the hold-off, if one runs: the acquire is not sent.
    pub(super) fn held_off(&self) -> Option<Acquired> {
        let left = self.link.restarts().holding_off()?;
        Some(Acquired::Busy {
            expires_in: left,
            position: 0,
            ticket: 0,
        })
    }

    /// Writes back `claim`'s grant (`count` holds, token `fence`), which the store lost
    /// with its data (`lua/reassert.lua`); only while the hold-off runs, when nobody
    /// else can have been granted it since: here, and on the server, whose marker must
    /// say so too (a Cluster master that did not lose its data grants nothing back).
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
        let (ttl, tail, grant) = (&ttl, &tail, &grant);
        let held: Value = self
            .guarded(&claim.key, true, |guard| async move {
                let args: [&[u8]; 4] = [ttl.as_bytes(), tail, grant.as_bytes(), &guard];
                self.invoke(&self.scripts.reassert, &claim.key, &args).await
            })
            .await?;
        Ok(matches!(held, Value::Int(1)))
    }
}

/// Whether `e` says the server cannot answer yet or is not a master: a state that
/// passes, in which no call may go out unchecked.
fn not_ready(e: &redis::RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind as S};
    matches!(
        e.kind(),
        ErrorKind::Server(
            S::BusyLoading | S::TryAgain | S::MasterDown | S::ReadOnly | S::ClusterDown
        )
    )
}
