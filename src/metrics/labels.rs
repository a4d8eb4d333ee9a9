//! The label values of the metrics: one enum per label, each value in lower snake case
//! as Prometheus users expect, in the order of its `LABELS`.

/// How an acquire ended (`lockside_acquires_total{outcome}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Granted (first grant or reentrant).
    Granted,
    /// Busy and not waiting.
    Busy,
    /// The wait timed out.
    Timeout,
    /// The wait was cancelled.
    Cancelled,
    /// Refused (bad input, limits, a conflict). Counted for every `Rejected` a session
    /// sends, a refused `Release` included.
    Rejected,
    /// The store could not be reached.
    Unavailable,
}

impl Outcome {
    pub(super) const LABELS: [&'static str; 6] = [
        "granted",
        "busy",
        "timeout",
        "cancelled",
        "rejected",
        "unavailable",
    ];
}

/// What a renewal found (`lockside_renewals_total{result}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewed {
    /// Extended.
    Ok,
    /// The store no longer held the grant.
    NotHeld,
    /// The store call failed.
    Failed,
}

impl Renewed {
    pub(super) const LABELS: [&'static str; 3] = ["ok", "not_held", "failed"];
}

/// Why a held lock was lost (`lockside_lost_total{reason}`). The first two are
/// incidents (the store failed the lock); a shutdown is routine when the app left
/// locks held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loss {
    /// No renewal was confirmed before the safe deadline (the store unreachable or
    /// too slow).
    Deadline,
    /// The store said the grant was gone (expired there, or lost by a failover, a
    /// restart or an eviction).
    NotHeld,
    /// The sidecar shut down while the session held it.
    Shutdown,
}

impl Loss {
    pub(super) const LABELS: [&'static str; 3] = ["deadline", "not_held", "shutdown"];
}

/// A store operation (`lockside_store_calls_total{operation}`): one per method of the
/// [`crate::store::Store`] trait that reaches the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// `acquire`.
    Acquire,
    /// `hold` (a reentrant acquire).
    Hold,
    /// `release`.
    Release,
    /// `renew` (one batch).
    Renew,
    /// `unwait` (a wait given up).
    Unwait,
    /// `describe`.
    Describe,
    /// `ping` (the health check, every second).
    Ping,
    /// `proclaim` (a holder's new value).
    Proclaim,
    /// `record` (a batch of session record changes, every ~50 ms at most).
    Record,
    /// `attach` (this sidecar's attachment, every second while it has sessions with
    /// locks).
    Attach,
    /// `resume` (a session resumed here).
    Resume,
    /// `reassert` (a grant written back after the store lost its data).
    Reassert,
}

impl Operation {
    pub(super) const LABELS: [&'static str; 12] = [
        "acquire", "hold", "release", "renew", "unwait", "describe", "ping", "proclaim", "record",
        "attach", "resume", "reassert",
    ];
}

/// A notice the sidecar received from its store
/// (`lockside_store_notices_received_total{kind}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Heard {
    /// A lock was released (or a permit freed): local waiters may go.
    Released,
    /// A lock changed in a way that frees nothing (its watchers read it again).
    Changed,
    /// Notices may have been missed (a reconnection, or this sidecar fell behind):
    /// every local waiter looks again.
    Resync,
}

impl Heard {
    pub(super) const LABELS: [&'static str; 3] = ["released", "changed", "resync"];
}

/// The result of a store call (`lockside_store_calls_total{result}`): `ok`, or the
/// error's kind ([`crate::store::StoreError::kind`]).
pub(super) const CALL_RESULTS: [&str; 5] =
    ["ok", "unavailable", "config", "protocol", "out_of_memory"];
