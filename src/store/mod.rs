//! The store: where locks live. Thin and atomic: every state change is one step (one Lua
//! script in Redis, one critical section in memory), so the engine above it never sees a
//! half-done change.
//!
//! Data model, shared by every implementation (the Redis key names are in `redis.rs`):
//!
//! - a lock has *holders*, each an **owner** (an unguessable per-grant token) with its own
//!   expiry in store time, a hold count, its fencing token and the public session id and
//!   client name shown by `Describe`;
//! - a **fence** counter per lock that survives the lock's expiry and deletion (the
//!   memory store, which forgets idle locks, keeps instead the largest counter of the
//!   locks it forgot and starts new locks there);
//! - *waiters*, each an owner with an expiry, registered atomically with the busy answer
//!   that made it wait, so a release publishes a notification only when someone waits.
//!
//! Owners are per grant, not per session: a late renewal or release of an old grant can
//! never touch a newer grant of the same key by the same session.

pub mod memory;
pub mod redis;
pub mod redlock;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::broadcast;

/// A future returned by a [`Store`] method.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// What can go wrong talking to a store. Busy, not held and the like are outcomes, not
/// errors: an error means the store could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached or did not answer in time.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store's address or settings are wrong.
    #[error("bad store configuration: {0}")]
    Config(String),
    /// The store answered something this sidecar does not understand.
    #[error("unexpected store reply: {0}")]
    Protocol(String),
}

/// How a grant shares its lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sharing {
    /// Excludes every other holder (or, with a limit N > 1, all but N − 1 others).
    Exclusive,
    /// Coexists with other shared holders; excludes exclusive ones.
    Shared,
}

impl Sharing {
    /// The one-letter form stored in Redis.
    pub fn letter(self) -> &'static str {
        match self {
            Self::Exclusive => "x",
            Self::Shared => "s",
        }
    }
}

impl StoreError {
    /// A short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Unavailable(_) => "unavailable",
            Self::Config(_) => "config",
            Self::Protocol(_) => "protocol",
        }
    }
}

/// Who asks for a lock: the owner token and what `Describe` may show of it.
#[derive(Clone, Debug)]
pub struct Claim {
    /// The lock's name, as the client gave it.
    pub key: String,
    /// The per-grant secret that the store value carries (never shown by `Describe`).
    pub owner: String,
    /// How long the store keeps the grant, or the waiter registration, without a renewal.
    pub ttl: Duration,
    /// Register as a waiter when busy, so a release notifies this sidecar.
    pub wait: bool,
    /// The public session id, shown by `Describe`.
    pub session_id: String,
    /// The client's self-chosen name, shown by `Describe`.
    pub client_name: String,
    /// Exclusive or shared.
    pub sharing: Sharing,
    /// 1 for a lock, N > 1 for a counting semaphore of N permits.
    pub limit: u32,
    /// Granted in arrival order among fair waiters, across sidecars.
    pub fair: bool,
}

impl Claim {
    /// The name of this claim as a waiter: `mode|limit|owner|session_id|client_name`.
    /// One string in the store's waiter set and fair queue; `Describe` shows all but
    /// the owner.
    pub fn waiter(&self) -> String {
        format!(
            "{}|{}|{}|{}|{}",
            self.sharing.letter(),
            self.limit,
            self.owner,
            self.session_id,
            self.client_name
        )
    }
}

/// The answer to an acquire attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// Granted with a fresh fencing token.
    Granted {
        /// The grant's fencing token.
        fence: u64,
    },
    /// Not now.
    Busy {
        /// When a waiter should look again even without a wake-up: the first holder's
        /// expiry, the end of a lock-delay, or (fair) the first waiter's expiry.
        expires_in: Duration,
        /// Fair: 1 = next in line. Unfair: 0.
        position: u32,
    },
    /// The current holders use another limit (a lock and a semaphore, or two
    /// semaphores of different sizes, cannot share a key).
    Conflict {
        /// The holders' limit.
        limit: u32,
    },
}

/// One grant to renew, in a batch. Borrowed: a batch of 10,000 renewals is built
/// every few seconds and should not copy every key.
#[derive(Clone, Copy, Debug)]
pub struct Renewal<'a> {
    /// The lock's name.
    pub key: &'a str,
    /// The grant's owner token.
    pub owner: &'a str,
    /// The new validity from now, in store time.
    pub ttl: Duration,
}

/// What a renewal batch found for one of its grants.
#[derive(Clone, Debug)]
pub enum Renewed {
    /// Still held, and extended by its TTL from now.
    Extended,
    /// The store no longer holds the grant (expired, released, or lost by the store).
    NotHeld,
    /// The store could not be asked about this grant (its node or master did not answer
    /// in time, or too few Redlock masters did): nothing is known, try again. Shared by
    /// every grant of the part of the batch that failed.
    Failed(Arc<StoreError>),
}

impl Renewed {
    /// Whether the grant was extended.
    pub fn is_extended(&self) -> bool {
        matches!(self, Self::Extended)
    }
}

/// One holder as `Describe` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderState {
    /// Public session id of the holder.
    pub session_id: String,
    /// The client name the holder gave.
    pub client_name: String,
    /// Holds of this grant.
    pub hold_count: u32,
    /// Time until the store lets the grant go if it is not renewed.
    pub ttl_remaining: Duration,
    /// The fencing token of the grant.
    pub fence: u64,
}

/// A fair waiter as `Describe` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuedState {
    /// Public session id of the waiter.
    pub session_id: String,
    /// The client name the waiter gave.
    pub client_name: String,
    /// The mode it waits for.
    pub sharing: Sharing,
}

/// The state of one lock.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyState {
    /// Current holders.
    pub holders: Vec<HolderState>,
    /// The holders' mode (`None` when nobody holds the key).
    pub sharing: Option<Sharing>,
    /// The holders' limit (0 when nobody holds the key).
    pub limit: u32,
    /// Live waiter registrations, fair or not, across sidecars.
    pub waiters: u32,
    /// Fair waiters, oldest first.
    pub queue: Vec<QueuedState>,
    /// The last fencing token issued for the key (0 if none).
    pub fence: u64,
}

/// A notice from the store to every sidecar.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    /// `key` may now be granted to a waiter: to the fair waiters named by their owner
    /// tokens, or, when none is named, to any one unfair waiter.
    Released {
        /// The lock's name.
        key: String,
        /// Owner tokens of the fair waiters to wake.
        owners: Vec<String>,
    },
    /// Notices may have been missed (reconnect, lag): every waiter should look again.
    Resync,
}

impl Notice {
    /// Parses a release notice's payload: the key, then one owner per line.
    pub fn parse(payload: &str) -> Self {
        let mut lines = payload.split('\n');
        let key = lines.next().unwrap_or_default().to_owned();
        Self::Released {
            key,
            owners: lines.map(str::to_owned).collect(),
        }
    }
}

/// A place where locks live. Implementations must pass the conformance suite in
/// `tests/conformance.rs`. Every method is one atomic step.
pub trait Store: Send + Sync + 'static {
    /// Grants `claim.key` to `claim.owner` when the lock admits the claim's mode and
    /// limit, no lock-delay runs, and (fair) no fair waiter ahead of it could be granted
    /// instead. When not, and `claim.wait` is set, registers (and, fair, queues) the
    /// claim as a waiter for `claim.ttl`; a grant removes that registration. A shared
    /// grant or a semaphore permit that leaves room for more wakes the next waiters.
    fn acquire<'a>(&'a self, claim: &'a Claim) -> StoreFuture<'a, Acquired>;

    /// Sets a grant's hold count to `count` (at least 1) and extends it by `ttl`. Returns
    /// the count now stored, or `None` when `owner` no longer holds `key`.
    ///
    /// The session is the authority on hold counts and the store mirrors them: a hold
    /// carries the count the session wants, not "one more", so it is idempotent. A call
    /// that timed out but ran leaves the count the session would have had after it, and
    /// the session's next hold or release sets the count it actually keeps.
    fn hold<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        count: u32,
        ttl: Duration,
    ) -> StoreFuture<'a, Option<u32>>;

    /// Leaves `count` holds on a grant: 0 releases it (waiters are notified), N > 0 sets
    /// the hold count to N. Returns the holds left, or `None` when `owner` did not hold
    /// `key`. Idempotent, as [`Store::hold`]. A non-zero `delay` on the last holder of an
    /// exclusive lock keeps the lock from anyone for that long (lock-delay).
    fn release<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        count: u32,
        delay: Duration,
    ) -> StoreFuture<'a, Option<u32>>;

    /// Extends every grant of the batch that is still held; answers one [`Renewed`] per
    /// grant, in batch order. One round trip for the whole batch, whatever its size.
    ///
    /// A store whose grants live in several places (Cluster nodes, Redlock masters)
    /// answers per grant: a part of the batch that could not be renewed fails alone, so
    /// one frozen node puts only its own grants in jeopardy. `Err` means that the whole
    /// batch failed.
    fn renew<'a>(&'a self, batch: &'a [Renewal<'a>]) -> StoreFuture<'a, Vec<Renewed>>;

    /// Removes a waiter registration, and its place in the fair queue (after a timeout
    /// or a cancel).
    fn unwait<'a>(&'a self, claim: &'a Claim) -> StoreFuture<'a, ()>;

    /// The state of one lock.
    fn describe<'a>(&'a self, key: &'a str) -> StoreFuture<'a, KeyState>;

    /// Checks that the store answers.
    fn ping(&self) -> StoreFuture<'_, ()>;

    /// Subscribes to release notices. Every sidecar on the store sees every notice.
    fn notices(&self) -> broadcast::Receiver<Notice>;

    /// Whether this store can keep locks of this kind safely; `Err` says why not (for
    /// example, Redlock masters cannot count a semaphore's permits together). Asked
    /// before the first acquire of a key.
    fn supports(&self, _sharing: Sharing, _limit: u32, _fair: bool) -> Result<(), String> {
        Ok(())
    }

    /// What kind of store this is, in lower snake case (`memory`, `redis`,
    /// `redis_sentinel`, `redis_cluster`, `redlock`): the `store_kind` label of
    /// `lockside_build_info`.
    fn kind(&self) -> &'static str {
        "other"
    }
}

/// The clock drift allowed for by default between a sidecar and the store: 1% of a
/// TTL, as in the Redlock description (`--clock-drift`).
pub const DEFAULT_CLOCK_DRIFT: f64 = 0.01;

/// The margin taken off every validity: `drift` × TTL for clock rate differences
/// between the sidecar and the store, plus 2 ms for timer and scheduling slop.
pub fn drift_margin(ttl: Duration, drift: f64) -> Duration {
    ttl.mul_f64(drift) + Duration::from_millis(2)
}

/// How many grants per millisecond a lock can take before its fencing tokens run ahead
/// of the clock (they still increase; see [`next_fence`]).
pub const FENCE_PER_MS: u64 = 1024;

/// The next fencing token after `last`, given the store's clock.
///
/// Tokens are `max(last + 1, unix_ms × 1024)`. The counter alone makes them strictly
/// increase while the store keeps its data; the clock component makes them increase
/// across a store that lost the counter (a restarted memory store, a Redis failover that
/// lost the last writes), assuming the store's clock does not go back by more than the
/// time since the lost token was issued. For a failover: the new master's clock is not
/// behind the old master's by more than the failover takes (seconds, against the
/// milliseconds NTP keeps nodes apart), and a key took fewer than 1024 grants per
/// millisecond before it (more run ahead of the clock, and a failover may then repeat
/// some). Tested by scenario 7 of `tests/failover.rs`. Tokens stay below 2^53 until
/// the year 2248, so JavaScript clients can hold them in a double.
pub fn next_fence(last: u64, unix_ms: u64) -> u64 {
    last.saturating_add(1)
        .max(unix_ms.saturating_mul(FENCE_PER_MS))
}

/// The wall clock in milliseconds since the Unix epoch, for fencing tokens only.
pub(crate) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_follow_the_clock_and_never_go_back() {
        assert_eq!(next_fence(0, 1000), 1000 * FENCE_PER_MS);
        let high = 2000 * FENCE_PER_MS;
        assert_eq!(
            next_fence(high, 1000),
            high + 1,
            "a clock behind never lowers tokens"
        );
        assert_eq!(next_fence(u64::MAX, 1), u64::MAX);
    }
}
