//! The engine's side of the conversation with a client, free of protobuf: the commands
//! a session receives, the events it sends, and the refusals. The API translates these
//! to and from the wire, and turns [`RejectCode`]s into gRPC codes in one place.

use std::time::Duration;

use super::{ECHO_BYTES, prefix};
use crate::store::{Refusal, StoreError};

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
    /// The holder's value (empty: none; on a held key, keep the grant's value).
    pub value: Vec<u8>,
    /// Who in the session asks (a thread, a task, a lock object); "" is the session
    /// itself. Reentrancy is per (holder, key).
    pub holder: String,
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
        /// The holder giving back its hold.
        holder: String,
    },
    /// Replace the value of a held lock.
    Proclaim {
        /// Client's id for the answer.
        request_id: u64,
        /// The lock's name.
        key: String,
        /// The new value.
        value: Vec<u8>,
        /// The holder whose value to replace.
        holder: String,
    },
}

impl Command {
    /// The client's id for the answer.
    pub fn request_id(&self) -> u64 {
        match self {
            Self::Acquire(r) => r.request_id,
            Self::Release { request_id, .. } | Self::Proclaim { request_id, .. } => *request_id,
        }
    }

    /// The lock's name.
    pub fn key(&self) -> &str {
        match self {
            Self::Acquire(r) => &r.key,
            Self::Release { key, .. } | Self::Proclaim { key, .. } => key,
        }
    }

    /// Who in the session asks.
    pub fn holder(&self) -> &str {
        match self {
            Self::Acquire(r) => &r.holder,
            Self::Release { holder, .. } | Self::Proclaim { holder, .. } => holder,
        }
    }
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
    /// A short prefix of the request's holder.
    pub holder: String,
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
            holder: String::new(),
            code,
            message: message.into(),
        }
    }

    /// The same rejection, for `holder` (echoed as a short prefix).
    pub fn of_holder(mut self, holder: &str) -> Self {
        self.holder = prefix(holder, ECHO_BYTES).to_owned();
        self
    }

    /// The code and message of a request a failed store call refused: the client
    /// learns that the store is out of memory (its own reason: retrying soon will not
    /// help, an operator must act) or unavailable, not how; the details stay in the log.
    pub(crate) fn of_store(error: &StoreError) -> (RejectCode, &'static str) {
        match error {
            StoreError::OutOfMemory(_) => (RejectCode::ResourceExhausted, STORE_OUT_OF_MEMORY),
            _ => (RejectCode::Unavailable, "the lock store is unavailable"),
        }
    }
}

/// What a client is told of a store that refuses writes for lack of memory.
pub const STORE_OUT_OF_MEMORY: &str = "the lock store is out of memory";

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

impl EngineError {
    /// Whether the store refused for lack of memory: RESOURCE_EXHAUSTED, not
    /// UNAVAILABLE (see [`Rejection::of_store`]).
    pub fn store_out_of_memory(&self) -> bool {
        matches!(self, Self::Store(StoreError::OutOfMemory(_)))
    }
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
    /// A session that was not resumed: its token is malformed, unknown, expired or
    /// altered ([`Refusal::Unknown`]: the session is gone), or its session is still
    /// attached to a live stream ([`Refusal::Attached`]: it may be resumable later).
    /// Only the holder of the session's secret can be told `Attached`.
    #[error("the session cannot be resumed ({0:?})")]
    NotResumable(Refusal),
    /// Something this sidecar's store cannot do (resuming, on Redlock).
    #[error("{0}")]
    Unimplemented(String),
}
