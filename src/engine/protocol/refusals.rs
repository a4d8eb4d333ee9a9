//! Refusals: a request's (a code and a message, mapped to a gRPC code in the API alone)
//! and an engine call's.

use crate::engine::{ECHO_BYTES, prefix};
use crate::store::{Refusal, StoreError};

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
