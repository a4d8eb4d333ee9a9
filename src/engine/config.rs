//! The engine's limits and defaults: what a sidecar's operator may set (the command
//! line turns its flags into an [`EngineConfig`]).

use std::time::Duration;

/// Limits and defaults of the engine. Every value is documented in `docs/configuration.md`.
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
    /// How long a session whose stream broke (a reset, an error, a keepalive timeout)
    /// keeps its locks before releasing them, renewed: both ends see a reset at the
    /// same instant, and the client must be able to tell its application to stop (its
    /// locks are *suspended*) before a waiter elsewhere is granted. A clean end and a
    /// shutdown release at once.
    pub broken_grace: Duration,
    /// How fast the sidecar's clock may run slow against the store's, as a fraction:
    /// every validity is shortened by this share of the TTL (plus 2 ms), so `Lost` comes
    /// before the store lets a lock go while the rates differ by less.
    pub clock_drift: f64,
    /// Open `Watch` streams per sidecar.
    pub max_watches: usize,
    /// How long this sidecar's attachment lives in the store without being refreshed
    /// (every third of it, while the sidecar has sessions holding locks): after the
    /// sidecar died, its sessions can be resumed elsewhere once this has passed.
    pub attachment_ttl: Duration,
    /// This sidecar's stable name (one per pod and container), when the command line
    /// has proved that no other process runs under it (`--instance` with a file lock in
    /// `--instance-dir`): its id in the store is then the same across restarts in
    /// place, and a restarted sidecar takes over its predecessor's sessions at once,
    /// without waiting for the old attachment to expire. `None`: a random id per
    /// process.
    pub instance: Option<String>,
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
            // Far longer than a client takes to see a reset on the same host (well under
            // a millisecond), short enough that a killed client's locks go within 50 ms.
            broken_grace: Duration::from_millis(30),
            clock_drift: crate::store::DEFAULT_CLOCK_DRIFT,
            // As many as sessions: a pod's followers each watch a key or two, and a
            // watch costs a receiver here (the key's reads are shared).
            max_watches: 10_000,
            // A sidecar killed and restarted in place gets its sessions back within
            // this (plus the restart): well inside the default 10 s TTL, and long
            // enough that a sidecar that misses two refreshes is not taken for dead.
            attachment_ttl: Duration::from_secs(3),
            instance: None,
        }
    }
}
