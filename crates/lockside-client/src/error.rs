//! What can go wrong for a client, in words for a person.

use std::time::Duration;

/// What can go wrong for a client. Every message is words for a person (`lockside
/// hold` prints them as they are): "not acquired: timed out after 100ms", not an enum
/// name or a code number.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ClientError {
    /// The sidecar could not be reached, or the stream broke. The message says which.
    #[error("{0}")]
    Unavailable(String),
    /// Nothing listens at the sidecar's address (connection refused, no such socket):
    /// a plain connect says so at once.
    #[error("cannot reach the sidecar at {addr}: {}", cause.words())]
    NoSidecar {
        /// The address as the client was given it.
        addr: String,
        /// Why the connection failed.
        cause: Refusal,
    },
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

/// Why a connection to the sidecar failed, as far as it says that nothing listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Nothing listens on the TCP port.
    Refused,
    /// No socket file at the path.
    NoSuchSocket,
    /// The host name does not resolve.
    UnknownHost,
    /// The socket's permissions refuse this process.
    PermissionDenied,
    /// Another cause, in words.
    Other(String),
}

impl Refusal {
    /// The cause in words.
    pub fn words(&self) -> &str {
        match self {
            Self::Refused => "connection refused",
            Self::NoSuchSocket => "no such socket",
            Self::UnknownHost => "the host name does not resolve",
            Self::PermissionDenied => "permission denied",
            Self::Other(words) => words,
        }
    }
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
            Self::TimedOut(wait) => write!(f, "timed out after {}", format_duration(*wait)),
            Self::Cancelled => f.write_str("cancelled"),
            Self::Other(reason) => write!(f, "reason {reason}"),
        }
    }
}

/// A duration as the command line writes it: `250ms`, `1.5s`, `2m30s`.
pub fn format_duration(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        return format!("{}ms", d.as_millis());
    }
    if d < Duration::from_secs(60) {
        let tenths = (d.as_secs_f64() * 10.0).round() as u64;
        return match tenths % 10 {
            0 => format!("{}s", tenths / 10),
            t => format!("{}.{t}s", tenths / 10),
        };
    }
    let secs = d.as_secs_f64().round() as u64;
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut text = String::new();
    for (value, unit) in [(h, "h"), (m, "m"), (s, "s")] {
        if value > 0 {
            text.push_str(&format!("{value}{unit}"));
        }
    }
    text
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

/// A google.rpc code's name as gRPC spells it: `FAILED_PRECONDITION`.
pub fn code_name(code: i32) -> &'static str {
    use tonic::Code;
    match Code::from(code) {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
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
pub(crate) fn from_status(status: &tonic::Status) -> ClientError {
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

/// The root cause of a failed connection, when it says that nothing listens at the
/// address; `None` when it does not (a timeout, a TLS failure: something may be there).
pub(crate) fn refusal(error: &(dyn std::error::Error + 'static)) -> Option<Refusal> {
    let mut cause = error;
    while let Some(source) = cause.source() {
        cause = source;
    }
    use std::io::ErrorKind;
    let kind = cause.downcast_ref::<std::io::Error>().map(|e| e.kind())?;
    match kind {
        ErrorKind::ConnectionRefused => Some(Refusal::Refused),
        ErrorKind::NotFound => Some(Refusal::NoSuchSocket),
        ErrorKind::PermissionDenied => Some(Refusal::PermissionDenied),
        ErrorKind::TimedOut => None,
        _ if cause.to_string().contains("failed to lookup address") => Some(Refusal::UnknownHost),
        _ => None,
    }
}

/// "cannot reach the sidecar at ADDR: connection refused": the root cause of a
/// connection failure, not tonic's "transport error".
pub(crate) fn unreachable(addr: &str, error: &(dyn std::error::Error + 'static)) -> ClientError {
    if let Some(cause) = refusal(error) {
        return ClientError::NoSidecar {
            addr: addr.to_owned(),
            cause,
        };
    }
    let mut cause = error;
    while let Some(source) = cause.source() {
        cause = source;
    }
    let words = match cause.downcast_ref::<std::io::Error>().map(|e| e.kind()) {
        Some(std::io::ErrorKind::TimedOut) => "timed out".to_owned(),
        _ => cause.to_string(),
    };
    ClientError::Unavailable(format!("cannot reach the sidecar at {addr}: {words}"))
}
