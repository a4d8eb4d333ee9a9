//! The values that cross the store's interface: claims, answers, states, notices.

use std::sync::Arc;
use std::time::Duration;

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
    /// The store refused a write for lack of memory (Redis `-OOM` over `maxmemory`
    /// with `noeviction`): it answers, but takes no new lock until memory is freed.
    #[error("store out of memory: {0}")]
    OutOfMemory(String),
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
            Self::OutOfMemory(_) => "out_of_memory",
        }
    }
}

/// Who asks for a lock: the owner token and what `Describe` may show of it.
#[derive(Clone, Debug)]
pub struct Claim {
    /// The lock's name, as the client gave it.
    pub key: String,
    /// The per-grant secret that the store value carries: `session_id.secret.grant`,
    /// unique per grant. Stores show the part before the first `.` (the session id)
    /// and never the rest.
    pub owner: String,
    /// How long the store keeps the grant, or the waiter registration, without a renewal.
    pub ttl: Duration,
    /// Register as a waiter when busy, so a release notifies this sidecar.
    pub wait: bool,
    /// The public session id, shown by `Describe`.
    pub session_id: String,
    /// The client's self-chosen name, shown by `Describe`.
    pub client_name: String,
    /// Who in the session asks ("" for the session itself), shown by `Describe`.
    pub holder: String,
    /// Exclusive or shared.
    pub sharing: Sharing,
    /// 1 for a lock, N > 1 for a counting semaphore of N permits.
    pub limit: u32,
    /// Granted in arrival order among fair waiters, across sidecars.
    pub fair: bool,
    /// The holder's value (leader election: who leads, and where), shown by
    /// `Describe`; empty for none. At most [`crate::proto::limits::MAX_VALUE_BYTES`].
    pub value: Vec<u8>,
    /// A claim of a request for several keys at once (`AcquireAll`), with the ticket it
    /// queues by: its fair queue entry takes this score on every one of its keys (so
    /// every key orders the requests alike, and no two requests can wait for each
    /// other: see docs/semantics.md), and a grant keeps its waiter registration (the
    /// request may still give the key back and wait again in the same place), which
    /// [`Store::unwait`] removes once the request ends. `None` for a single key: its
    /// queue entry is scored by arrival, `max(last + 1, the store's ms × 1024)`.
    ///
    /// [`Store::unwait`]: crate::store::Store::unwait
    pub ticket: Option<u64>,
}

impl Claim {
    /// The name of this claim as a waiter: `mode|limit|owner|session_id|client_name`,
    /// the client name followed by the holder's (see [`Claim::shown_name`]). One string
    /// in the store's waiter set and fair queue; `Describe` shows all but the owner.
    pub fn waiter(&self) -> String {
        format!(
            "{}|{}|{}|{}|{}",
            self.sharing.letter(),
            self.limit,
            self.owner,
            self.session_id,
            self.shown_name()
        )
    }

    /// The client name and the holder as a store that keeps them in one string does:
    /// `client_name` alone for the session itself, else `client_name` NUL `holder`
    /// (read back by [`super::names::split`]; neither may hold a control character).
    pub fn shown_name(&self) -> std::borrow::Cow<'_, str> {
        super::names::name(&self.client_name, &self.holder)
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
        /// A ticket to queue by ([`Claim::ticket`]), from the store's clock (ms ×
        /// 1024); 0 when the store gave none (the call was not sent).
        ticket: u64,
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
    /// The holder inside its session ("" for the session itself).
    pub holder: String,
    /// Holds of this grant.
    pub hold_count: u32,
    /// Time until the store lets the grant go if it is not renewed.
    pub ttl_remaining: Duration,
    /// The fencing token of the grant.
    pub fence: u64,
    /// The holder's value (empty for none).
    pub value: Vec<u8>,
}

/// A fair waiter as `Describe` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuedState {
    /// Public session id of the waiter.
    pub session_id: String,
    /// The client name the waiter gave.
    pub client_name: String,
    /// The waiter's holder inside its session.
    pub holder: String,
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
    /// `key` changed in a way that frees nothing (a grant, a hold count, a value): its
    /// watchers read it again; no waiter is woken.
    Changed {
        /// The lock's name.
        key: String,
    },
    /// Notices may have been missed (reconnect, lag): every waiter and watcher should
    /// look again.
    Resync,
}

/// The second line of a [`Notice::Changed`] payload.
pub const CHANGED: &str = "=";

impl Notice {
    /// Parses a notice's payload: the key, then `=` for a change, or one fair waiter's
    /// owner per line for a release.
    pub fn parse(payload: &str) -> Self {
        let mut lines = payload.split('\n');
        let key = lines.next().unwrap_or_default().to_owned();
        let owners: Vec<String> = lines.map(str::to_owned).collect();
        if owners.len() == 1 && owners[0] == CHANGED {
            return Self::Changed { key };
        }
        Self::Released { key, owners }
    }

    /// The key the notice is about, if one.
    pub fn key(&self) -> Option<&str> {
        match self {
            Self::Released { key, .. } | Self::Changed { key } => Some(key),
            Self::Resync => None,
        }
    }
}

/// What a store's own check found ([`Store::check`]): what it refuses this sidecar,
/// and whether it may drop Lockside's keys before their time.
///
/// [`Store::check`]: super::Store::check
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreCheck {
    /// The commands Lockside needs that the store refuses this sidecar's user (or does
    /// not know), by name (`HSET`, `SCRIPT LOAD`), each once.
    pub denied: Vec<String>,
    /// The store's eviction policy, when it may evict Lockside's keys (Redis
    /// `maxmemory-policy` `allkeys-*`, or `volatile-*`: every lock key has a TTL).
    pub evicting: Option<String>,
}
