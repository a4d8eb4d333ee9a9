//! The events a session sends its client, in the order it must send them.

use std::time::Duration;

use super::refusals::Rejection;

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

/// A session's resume token, `session_id.secret`: whoever has it can take over the
/// session's locks, so it is never logged (its `Debug` shows nothing of it) and never
/// shown by `Describe`.
#[derive(Clone, PartialEq, Eq)]
pub struct ResumeToken(pub(crate) String);

impl ResumeToken {
    /// The token itself, for the wire.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for ResumeToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ResumeToken(..)")
    }
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
        /// Resumes the session on a new stream; `None` when the store cannot resume
        /// sessions (Redlock).
        resume_token: Option<ResumeToken>,
        /// A resumed session: how many `Granted` (request id 0) and `Lost` events follow
        /// at once, one per lock its record listed. 0 for a new session.
        resumed: u32,
    },
    /// Every key of an `AcquireAll`, granted at once.
    GrantedAll {
        /// The `AcquireAll`'s id.
        request_id: u64,
        /// One per key, in the order asked.
        grants: Vec<GrantedKey>,
        /// The holder.
        holder: String,
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
        /// The holder.
        holder: String,
    },
    /// A wait began.
    Waiting {
        /// The `Acquire`'s id.
        request_id: u64,
        /// The key.
        key: String,
        /// Queue position (0 when unfair).
        position: u32,
        /// The holder.
        holder: String,
    },
    /// Not acquired.
    NotAcquired {
        /// The `Acquire`'s id.
        request_id: u64,
        /// The key.
        key: String,
        /// Why.
        reason: NotAcquiredReason,
        /// The holder.
        holder: String,
    },
    /// A hold was given back.
    Released {
        /// The `Release`'s id.
        request_id: u64,
        /// The key.
        key: String,
        /// Holds left.
        hold_count: u32,
        /// The holder.
        holder: String,
    },
    /// A holder's value was replaced.
    Proclaimed {
        /// The `Proclaim`'s id.
        request_id: u64,
        /// The key.
        key: String,
        /// The holder.
        holder: String,
    },
    /// A lock is no longer held.
    Lost {
        /// The key.
        key: String,
        /// Why.
        reason: String,
        /// The token the session held.
        fence: u64,
        /// The holder.
        holder: String,
    },
    /// A request was refused.
    Rejected(Rejection),
    /// Renewals are failing.
    Jeopardy {
        /// The key.
        key: String,
        /// Validity left.
        ttl_remaining: Duration,
        /// The holder.
        holder: String,
    },
    /// Renewals succeed again.
    Restored {
        /// The key.
        key: String,
        /// Validity left.
        ttl: Duration,
        /// The holder.
        holder: String,
    },
    /// The sidecar ends the stream.
    Ended(EndReason),
}

/// One key of a `GrantedAll`: as a `Granted` of it would say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrantedKey {
    /// The key.
    pub key: String,
    /// Fencing token.
    pub fence: u64,
    /// Validity left, reduced by the drift margin.
    pub ttl: Duration,
    /// Holds now.
    pub hold_count: u32,
}
