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
pub mod names;
pub mod redis;
pub mod redlock;
mod sessions;
mod types;

pub use sessions::{
    Listing, RecordLine, RecordWrite, Recorded, Refusal, ResumeClaim, ResumedGrant, ResumedLock,
    Resumption,
};
pub use types::{
    Acquired, CHANGED, Claim, HolderState, KeyState, Notice, QueuedState, Renewal, Renewed,
    Sharing, StoreCheck, StoreError,
};

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::broadcast;

/// A future returned by a [`Store`] method.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Told each answer of a renewal batch as soon as its part of the batch is answered
/// (see [`Store::renew_early`]): the grant's position in the batch and its answer.
pub type Early<'a> = &'a (dyn Fn(usize, &Renewed) + Send + Sync);

/// A place where locks live. Implementations must pass the conformance suite in
/// `tests/store_conformance.rs`. Every method is one atomic step.
pub trait Store: Send + Sync + 'static {
    /// Grants `claim.key` to `claim.owner` when the lock admits the claim's mode and
    /// limit, no lock-delay runs, and (fair) no fair waiter ahead of it could be granted
    /// instead. When not, and `claim.wait` is set, registers (and, fair, queues) the
    /// claim as a waiter for `claim.ttl`; a grant removes that registration. A shared
    /// grant or a semaphore permit that leaves room for more wakes the next waiters.
    fn acquire<'a>(&'a self, claim: &'a Claim) -> StoreFuture<'a, Acquired>;

    /// [`Store::acquire`], by a session that may have a record: a grant is also listed
    /// in it in the same step where the store can (one server, the record this
    /// session's, room for a line, and long enough to live for this TTL), saving the
    /// record's write (and its round trip) before the client may hear `Granted`. The
    /// answer says whether it was listed; when it was not, the journal writes the line
    /// (`engine/journal/`). By default it never is (memory, Redlock); a store that
    /// wraps another must pass the call on (`metrics/store.rs`).
    fn acquire_listed<'a>(
        &'a self,
        claim: &'a Claim,
        listing: Listing<'a>,
    ) -> StoreFuture<'a, (Acquired, bool)> {
        let _ = listing;
        Box::pin(async move { Ok((self.acquire(claim).await?, false)) })
    }

    /// Sets a grant's hold count to `count` (at least 1) and extends it by `ttl`. Returns
    /// the count now stored, or `None` when `owner` no longer holds `key`.
    ///
    /// The session is the authority on hold counts and the store mirrors them: a hold
    /// carries the count the session wants, not "one more", so it is idempotent. A call
    /// that timed out but ran leaves the count the session would have had after it, and
    /// the session's next hold or release sets the count it actually keeps.
    fn reenter<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        count: u32,
        ttl: Duration,
    ) -> StoreFuture<'a, Option<u32>>;

    /// Leaves `count` holds on a grant: 0 releases it (waiters are notified), N > 0 sets
    /// the hold count to N. Returns the holds left, or `None` when `owner` did not hold
    /// `key`. Idempotent, as [`Store::reenter`]. A non-zero `delay` on the last holder of an
    /// exclusive lock keeps the lock from anyone for that long (lock-delay).
    fn release<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        count: u32,
        delay: Duration,
    ) -> StoreFuture<'a, Option<u32>>;

    /// Releases a grant whose fencing token the caller knows: the same as
    /// `release(key, owner, 0, delay)`, answers included. `fence` is only a hint (the
    /// token the grant was given): Redis uses it to write the released state before
    /// reading the grant, one command fewer, and checks the grant afterwards; a wrong
    /// hint (a Redlock master may keep a larger token) costs a write more, never a
    /// different answer or state. Stores without such a shortcut need not implement it.
    fn release_grant<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        fence: u64,
        delay: Duration,
    ) -> StoreFuture<'a, Option<u32>> {
        let _ = fence;
        self.release(key, owner, 0, delay)
    }

    /// Extends every grant of the batch that is still held; answers one [`Renewed`] per
    /// grant, in batch order. One round trip for the whole batch, whatever its size.
    ///
    /// A store whose grants live in several places (Cluster nodes, Redlock masters)
    /// answers per grant: a part of the batch that could not be renewed fails alone, so
    /// one frozen node puts only its own grants in jeopardy. `Err` means that the whole
    /// batch failed.
    fn renew<'a>(&'a self, batch: &'a [Renewal<'a>]) -> StoreFuture<'a, Vec<Renewed>>;

    /// [`Store::renew`], also telling `early` each grant's answer as soon as its part of
    /// the batch is answered (a Cluster master's chunk), before the slowest part is: a
    /// renewal that a healthy master confirmed is not held back by a frozen one until
    /// its call times out. The answers returned are the same. By default none early
    /// (a store that keeps every grant in one place answers them all at once).
    fn renew_early<'a>(
        &'a self,
        batch: &'a [Renewal<'a>],
        early: Early<'a>,
    ) -> StoreFuture<'a, Vec<Renewed>> {
        let _ = early;
        self.renew(batch)
    }

    /// Removes a waiter registration, and its place in the fair queue (after a timeout
    /// or a cancel).
    fn unwait<'a>(&'a self, claim: &'a Claim) -> StoreFuture<'a, ()>;

    /// The state of one lock.
    fn describe<'a>(&'a self, key: &'a str) -> StoreFuture<'a, KeyState>;

    /// Replaces the value of `owner`'s grant of `key` (leader election: who leads, and
    /// where) and tells the key's watchers. `true` when `owner` holds `key`, `false`
    /// (nothing changed) when not.
    fn proclaim<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        value: &'a [u8],
    ) -> StoreFuture<'a, bool>;

    /// Delivers the notices of `key` to this sidecar from now on, until as many
    /// [`Store::unlisten`]s: a local waiter needs its release notices, a watcher every
    /// change. With `watch`, this sidecar also registers in the store as a listener of
    /// `key`, so that its changes are published while nobody waits for it (a store
    /// publishes a key's notices only while someone listens; waiters register with their
    /// acquire). Completes once notices flow (on Redis: the subscription is confirmed);
    /// a failure is logged, not returned: waiters and watchers also look again at the
    /// times the store gives them (a holder's expiry). The listen counts from the call,
    /// not from the future's first poll: its `unlisten` is due even if the future is
    /// dropped unfinished.
    fn listen<'a>(&'a self, _key: &'a str, _watch: bool) -> StoreFuture<'a, ()> {
        Box::pin(std::future::ready(Ok(())))
    }

    /// Ends one [`Store::listen`] of `key` (with the same `watch`).
    fn unlisten(&self, _key: &str, _watch: bool) {}

    /// Checks that the store answers.
    fn ping(&self) -> StoreFuture<'_, ()>;

    /// Whether the store lost its data (Redis restarted empty) and holds off new grants
    /// for now: acquires are answered busy, and a grant it no longer holds may be
    /// written back by [`Store::reassert`] (`store/redis/restarts/`).
    fn restarted(&self) -> bool {
        false
    }

    /// Changes when such a hold-off begins: the renewer then renews every grant at
    /// once, so that each one the store lost is written back before it ends.
    fn hold_offs(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }

    /// Writes back a grant the store lost with its data, while [`Store::restarted`]:
    /// `claim`'s owner, with `count` holds and token `fence`. `true` when held again,
    /// `false` when the lock admits it no more (or no hold-off runs).
    fn reassert<'a>(
        &'a self,
        _claim: &'a Claim,
        _count: u32,
        _fence: u64,
    ) -> StoreFuture<'a, bool> {
        Box::pin(std::future::ready(Ok(false)))
    }

    /// Checks what the store allows this sidecar and whether it may evict its keys
    /// ([`StoreCheck`]). Called by the health check after every ping that answered: a
    /// store checks at its first call and after every reconnect (Redis: every new
    /// connection, and every minute), and answers the last result otherwise, so the
    /// call is cheap. `Err` when the check could not be made (the store is down).
    fn check(&self) -> StoreFuture<'_, StoreCheck> {
        Box::pin(std::future::ready(Ok(StoreCheck::default())))
    }

    /// The notices of the keys this sidecar listens to (see [`Store::listen`]), and
    /// `Resync` when some may have been missed.
    fn notices(&self) -> broadcast::Receiver<Notice>;

    /// Whether this store can keep locks of this kind safely; `Err` says why not (for
    /// example, Redlock masters cannot count a semaphore's permits together). Asked
    /// before the first acquire of a key.
    fn supports(&self, _sharing: Sharing, _limit: u32, _fair: bool) -> Result<(), String> {
        Ok(())
    }

    /// Whether this store keeps session records, so that a session can be resumed on
    /// another sidecar after its own died (`store/sessions.rs`). When not, the methods
    /// below are never called, and sessions cannot be resumed.
    fn keeps_sessions(&self) -> bool {
        false
    }

    /// Whether this store's locks outlive this sidecar's process. The embedded memory
    /// store's die with it: nothing is left to resume after the sidecar died, and a
    /// live sidecar releases a stream's locks when it ends, so no session on it gets a
    /// resume token, and its clients treat a broken stream as lost at once.
    fn outlives_sidecar(&self) -> bool {
        true
    }

    /// Whether a session on this store can be resumed on a new stream: the store keeps
    /// session records and outlives the sidecar.
    fn resumes_sessions(&self) -> bool {
        self.keeps_sessions() && self.outlives_sidecar()
    }

    /// Applies changes to session records, one answer per write, in order: `None` when
    /// that write could not be made (the store could not be asked; try again later).
    /// Writes of different sessions are independent (a Cluster keeps each record in its
    /// own slot).
    fn record<'a>(&'a self, writes: &'a [RecordWrite]) -> StoreFuture<'a, Vec<Option<Recorded>>> {
        Box::pin(std::future::ready(Ok(vec![
            Some(Recorded::Written);
            writes.len()
        ])))
    }

    /// Says that the sidecar `sidecar` is alive for the next `ttl`: while it is, the
    /// sessions whose records name it cannot be resumed elsewhere.
    fn attach<'a>(&'a self, _sidecar: &'a str, _ttl: Duration) -> StoreFuture<'a, ()> {
        Box::pin(std::future::ready(Ok(())))
    }

    /// Resumes a session on this sidecar (see `store/sessions.rs`): checks the secret,
    /// refuses while the session's sidecar is attached, claims the record under the new
    /// secret and re-keys every lock it lists that the old owner still holds.
    fn resume<'a>(&'a self, _claim: &'a ResumeClaim) -> StoreFuture<'a, Resumption> {
        Box::pin(std::future::ready(Ok(Resumption::Refused(
            Refusal::Unknown,
        ))))
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
/// some). Tested by scenario 7 of `tests/fault_failover.rs`. Tokens stay below 2^53 until
/// the year 2248, so JavaScript clients can hold them in a double.
pub fn next_fence(last: u64, unix_ms: u64) -> u64 {
    last.saturating_add(1)
        .max(unix_ms.saturating_mul(FENCE_PER_MS))
}

/// A random id for this process's registrations in a store (16 hex digits; not a
/// secret). Falls back to the clock should the OS have no randomness for it.
pub(crate) fn random_id() -> String {
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_err() {
        bytes = unix_ms().to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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
