//! What can go wrong for a client, in words for a person.

use std::time::Duration;

/// What can go wrong for a client. Every message is words for a person (`lockside
/// hold` prints them as they are): "not acquired: timed out after 100ms", not an enum
/// name or a code number.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The sidecar could not be reached, or the stream broke. The message says which.
    #[error("{0}")]
    Unavailable(String),
    /// The lock was not acquired: busy, timed out or cancelled.
    #[error("not acquired: {0}")]
    NotAcquired(NotAcquired),
    /// The sidecar refused the request (or, for code 14, its store is unavailable).
    #[error("{}", rejected(*code, message))]
    Rejected {
        /// A google.rpc code number.
        code: i32,
        /// The sidecar's explanation.
        message: String,
    },
    /// The lock was lost before it could be released.
    #[error("the lock was lost")]
    Lost,
    /// The client's own settings are wrong (a token or certificate file).
    #[error("{0}")]
    Settings(String),
}

/// Why a lock was not acquired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotAcquired {
    /// Somebody else holds it, and the request did not wait.
    Busy,
    /// The wait, this long, ended without the lock.
    TimedOut(Duration),
    /// The wait was cancelled.
    Cancelled,
    /// A reason this client does not know (a newer sidecar), by its number.
    Other(i32),
}

impl std::fmt::Display for NotAcquired {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Busy => f.write_str("busy"),
            Self::TimedOut(wait) => write!(
                f,
                "timed out after {}",
                crate::parse::format_duration(*wait)
            ),
            Self::Cancelled => f.write_str("cancelled"),
            Self::Other(reason) => write!(f, "reason {reason}"),
        }
    }
}

/// A google.rpc code in words, as the proto's comments name them.
pub fn code_words(code: i32) -> &'static str {
    use tonic::Code;
    match Code::from(code) {
        Code::Ok => "ok",
        Code::Cancelled => "cancelled",
        Code::Unknown => "unknown error",
        Code::InvalidArgument => "invalid argument",
        Code::DeadlineExceeded => "deadline exceeded",
        Code::NotFound => "not found",
        Code::AlreadyExists => "already exists",
        Code::PermissionDenied => "permission denied",
        Code::ResourceExhausted => "resource exhausted",
        Code::FailedPrecondition => "failed precondition",
        Code::Aborted => "aborted",
        Code::OutOfRange => "out of range",
        Code::Unimplemented => "unimplemented",
        Code::Internal => "internal error",
        Code::Unavailable => "unavailable",
        Code::DataLoss => "data loss",
        Code::Unauthenticated => "unauthenticated",
    }
}

/// "rejected: invalid argument: key must not be empty"; UNAVAILABLE is not a refusal
/// of the request but the store's state: "unavailable: the lock store is unavailable".
fn rejected(code: i32, message: &str) -> String {
    let words = code_words(code);
    let head = if code == tonic::Code::Unavailable as i32 {
        words.to_owned()
    } else {
        format!("rejected: {words}")
    };
    match message {
        "" => head,
        message => format!("{head}: {message}"),
    }
}

/// A failed call in words: the sidecar going away is `Unavailable`, anything else the
/// sidecar's refusal.
pub(super) fn from_status(status: &tonic::Status) -> ClientError {
    use tonic::Code;
    match status.code() {
        Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded => {
            ClientError::Unavailable(match status.message() {
                "" => "the sidecar is unavailable".to_owned(),
                message => format!("the sidecar is unavailable: {message}"),
            })
        }
        code => ClientError::Rejected {
            code: code as i32,
            message: status.message().to_owned(),
        },
    }
}

/// "cannot reach the sidecar at ADDR: connection refused": the root cause of a
/// connection failure, not tonic's "transport error".
pub(super) fn unreachable(addr: &str, error: &(dyn std::error::Error + 'static)) -> ClientError {
    let mut cause = error;
    while let Some(source) = cause.source() {
        cause = source;
    }
    let words = match cause.downcast_ref::<std::io::Error>().map(|e| e.kind()) {
        Some(std::io::ErrorKind::ConnectionRefused) => "connection refused".to_owned(),
        Some(std::io::ErrorKind::NotFound) => "no such socket".to_owned(),
        Some(std::io::ErrorKind::PermissionDenied) => "permission denied".to_owned(),
        Some(std::io::ErrorKind::TimedOut) => "timed out".to_owned(),
        _ => cause.to_string(),
    };
    ClientError::Unavailable(format!("cannot reach the sidecar at {addr}: {words}"))
}
