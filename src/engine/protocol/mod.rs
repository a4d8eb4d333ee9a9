//! The engine's side of the conversation with a client, free of protobuf: the commands
//! a session receives (this file), the events it sends (`events.rs`), and the refusals
//! (`refusals.rs`). The API translates these to and from the wire, and turns
//! [`RejectCode`]s into gRPC codes in one place.

mod events;
mod refusals;

pub use events::{EndReason, Event, GrantedKey, NotAcquiredReason, ResumeToken};
pub use refusals::{EngineError, RejectCode, Rejection, STORE_OUT_OF_MEMORY};

use std::time::Duration;

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

/// An `AcquireAll`, decoded but not yet validated: every key or none, never a
/// deadlock (`engine/session/all.rs`).
#[derive(Clone, Debug)]
pub struct AcquireAllRequest {
    /// Client's id for the answer.
    pub request_id: u64,
    /// The locks' names, in the order the answer lists them.
    pub keys: Vec<String>,
    /// How long to wait when busy; `None` or zero: do not wait.
    pub wait: Option<Duration>,
    /// Lock mode, for every key.
    pub mode: Mode,
    /// Not overtaken by later requests for any of its keys.
    pub fair: bool,
    /// Requested TTL; `None`: the default.
    pub ttl: Option<Duration>,
    /// The caller's trace context (empty: the session's).
    pub trace: crate::telemetry::TraceContext,
    /// Who in the session asks; "" is the session itself.
    pub holder: String,
}

/// A client command on a session.
#[derive(Clone, Debug)]
pub enum Command {
    /// Take or wait for a lock.
    Acquire(AcquireRequest),
    /// Take or wait for several locks at once.
    AcquireAll(AcquireAllRequest),
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
            Self::AcquireAll(r) => r.request_id,
            Self::Release { request_id, .. } | Self::Proclaim { request_id, .. } => *request_id,
        }
    }

    /// The lock's name (of an `AcquireAll`, its first key, or "").
    pub fn key(&self) -> &str {
        match self {
            Self::Acquire(r) => &r.key,
            Self::AcquireAll(r) => r.keys.first().map_or("", String::as_str),
            Self::Release { key, .. } | Self::Proclaim { key, .. } => key,
        }
    }

    /// Who in the session asks.
    pub fn holder(&self) -> &str {
        match self {
            Self::Acquire(r) => &r.holder,
            Self::AcquireAll(r) => &r.holder,
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
