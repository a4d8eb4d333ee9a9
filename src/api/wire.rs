//! The wire: protobuf messages to engine commands and engine events to protobuf, and
//! the one place where engine outcomes become gRPC codes ([`reject_code`], [`status`]).

use std::time::Duration;

use prost::Message;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Status};

use crate::engine::{
    AcquireRequest, Command, EndReason, EngineError, Event, Inbound, KeyView, Mode,
    NotAcquiredReason, Refusal, RejectCode, Rejection, STORE_OUT_OF_MEMORY,
};
use crate::proto::codec::UNREADABLE;
use crate::proto::limits::{
    RESUME_REFUSED_ATTACHED, RESUME_REFUSED_TRAILER, RESUME_REFUSED_UNKNOWN,
};
use crate::proto::{self, lease_request, lease_response, not_acquired};
use crate::telemetry::{TRACEPARENT, TRACESTATE, TraceContext};

use super::MAX_REQUEST_BYTES;

/// The one conversion of engine errors into gRPC statuses. Store details are logged,
/// not sent: the client learns that the store is unavailable, not how.
pub fn status(error: EngineError) -> Status {
    match error {
        EngineError::InvalidArgument(m) => Status::invalid_argument(m),
        EngineError::ResourceExhausted(m) => Status::resource_exhausted(m),
        e @ EngineError::Store(_) if e.store_out_of_memory() => {
            tracing::warn!(error = %e, "store call failed");
            Status::resource_exhausted(STORE_OUT_OF_MEMORY)
        }
        EngineError::Store(e) => {
            tracing::warn!(error = %e, "store call failed");
            Status::unavailable("the lock store is unavailable")
        }
        EngineError::ShuttingDown => Status::unavailable("the sidecar is shutting down"),
        EngineError::Random(e) => {
            tracing::error!(error = %e, "no randomness");
            Status::internal("the sidecar cannot create session tokens")
        }
        EngineError::NotResumable(why) => {
            let (message, detail) = match why {
                Refusal::Unknown => (
                    "the session cannot be resumed: no session has this token (never \
                     issued, already resumed or ended, expired, or malformed)",
                    RESUME_REFUSED_UNKNOWN,
                ),
                Refusal::Attached => (
                    "the session cannot be resumed yet: it is still attached to a live \
                     stream; it can be once that stream has ended",
                    RESUME_REFUSED_ATTACHED,
                ),
            };
            let mut trailers = MetadataMap::new();
            trailers.insert(RESUME_REFUSED_TRAILER, MetadataValue::from_static(detail));
            Status::with_metadata(Code::FailedPrecondition, message, trailers)
        }
        EngineError::Unimplemented(m) => Status::unimplemented(m),
    }
}

fn lock_mode(mode: Mode) -> proto::LockMode {
    match mode {
        Mode::Exclusive => proto::LockMode::Exclusive,
        Mode::Shared => proto::LockMode::Shared,
    }
}

/// The google.rpc code number of a rejection.
pub fn reject_code(code: RejectCode) -> i32 {
    let code = match code {
        RejectCode::InvalidArgument => Code::InvalidArgument,
        RejectCode::ResourceExhausted => Code::ResourceExhausted,
        RejectCode::FailedPrecondition => Code::FailedPrecondition,
        RejectCode::Unimplemented => Code::Unimplemented,
        RejectCode::Unavailable => Code::Unavailable,
    };
    code as i32
}

fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration::try_from(d).unwrap_or(prost_types::Duration {
        seconds: i64::MAX,
        nanos: 0,
    })
}

/// Decodes a protobuf `Duration` field; `None` when unset.
fn field_duration(
    value: Option<prost_types::Duration>,
    name: &str,
) -> Result<Option<Duration>, String> {
    let Some(value) = value else { return Ok(None) };
    if !(-999_999_999..=999_999_999).contains(&value.nanos) {
        return Err(format!("{name} has nanos out of range"));
    }
    if value.seconds < 0 || value.nanos < 0 {
        return Err(format!("{name} must not be negative"));
    }
    Duration::try_from(value)
        .map(Some)
        .map_err(|_| format!("{name} is out of range"))
}

/// The caller's W3C trace context from the request's metadata.
pub(super) fn trace_context(metadata: &tonic::metadata::MetadataMap) -> TraceContext {
    let text = |name| metadata.get(name).and_then(|v| v.to_str().ok());
    TraceContext {
        traceparent: text(TRACEPARENT).unwrap_or_default().to_owned(),
        tracestate: text(TRACESTATE).map(str::to_owned),
    }
}

pub(super) fn decode(message: proto::LeaseRequest) -> Inbound {
    let size = message.encoded_len();
    let (request_id, key) = match &message.command {
        Some(lease_request::Command::Acquire(a)) => (a.request_id, a.key.as_str()),
        Some(lease_request::Command::Release(r)) => (r.request_id, r.key.as_str()),
        Some(lease_request::Command::Proclaim(p)) => (p.request_id, p.key.as_str()),
        None => (0, ""),
    };
    if let Some(readable) = key.strip_prefix(UNREADABLE) {
        // Salvaged by the codec: prost could not read a string field as UTF-8.
        let message =
            "a string field (the key, the holder or the trace context) is not valid UTF-8";
        return Inbound::Invalid(Rejection::new(
            request_id,
            readable,
            RejectCode::InvalidArgument,
            message,
        ));
    }
    // Rejection::new keeps only a short prefix of the key: never echo a huge one.
    let echo = Rejection::new(request_id, key, RejectCode::InvalidArgument, "");
    let invalid = |code, message: String| {
        Inbound::Invalid(Rejection {
            code,
            message,
            ..echo.clone()
        })
    };
    if size > MAX_REQUEST_BYTES {
        return invalid(
            RejectCode::ResourceExhausted,
            format!("request is {size} bytes; at most {MAX_REQUEST_BYTES} are allowed"),
        );
    }
    let command = match message.command {
        None => {
            return invalid(
                RejectCode::InvalidArgument,
                "LeaseRequest has no command".into(),
            );
        }
        Some(lease_request::Command::Release(r)) => Command::Release {
            request_id: r.request_id,
            key: r.key,
            holder: r.holder,
        },
        Some(lease_request::Command::Proclaim(p)) => Command::Proclaim {
            request_id: p.request_id,
            key: p.key,
            value: p.value,
            holder: p.holder,
        },
        Some(lease_request::Command::Acquire(a)) => {
            let mode = match proto::LockMode::try_from(a.mode) {
                Ok(proto::LockMode::Unspecified | proto::LockMode::Exclusive) => Mode::Exclusive,
                Ok(proto::LockMode::Shared) => Mode::Shared,
                Err(_) => {
                    let message = format!("mode {} is not a LockMode", a.mode);
                    return invalid(RejectCode::InvalidArgument, message);
                }
            };
            let wait = match field_duration(a.wait_timeout, "wait_timeout") {
                Ok(wait) => wait,
                Err(message) => return invalid(RejectCode::InvalidArgument, message),
            };
            let ttl = match field_duration(a.ttl, "ttl") {
                Ok(ttl) => ttl,
                Err(message) => return invalid(RejectCode::InvalidArgument, message),
            };
            Command::Acquire(AcquireRequest {
                request_id: a.request_id,
                key: a.key,
                wait,
                mode,
                limit: a.limit,
                fair: a.fair,
                ttl,
                trace: TraceContext {
                    traceparent: a.traceparent,
                    tracestate: None,
                },
                value: a.value,
                holder: a.holder,
            })
        }
    };
    Inbound::Command(command)
}

pub(super) fn encode(event: Event) -> Result<proto::LeaseResponse, Status> {
    use lease_response::Event as E;
    let event = match event {
        Event::Started {
            session_id,
            default_ttl,
            resume_token,
            resumed,
        } => E::Started(proto::SessionStarted {
            session_id,
            default_ttl: Some(duration(default_ttl)),
            resume_token: resume_token
                .as_ref()
                .map(|t| t.expose().to_owned())
                .unwrap_or_default(),
            resumed_locks: resumed,
        }),
        Event::Granted {
            request_id,
            key,
            fence,
            ttl,
            hold_count,
            holder,
        } => E::Granted(proto::Granted {
            request_id,
            key,
            fencing_token: fence,
            ttl: Some(duration(ttl)),
            hold_count,
            holder,
        }),
        Event::Waiting {
            request_id,
            key,
            position,
            holder,
        } => E::Waiting(proto::Waiting {
            request_id,
            key,
            position,
            holder,
        }),
        Event::NotAcquired {
            request_id,
            key,
            reason,
            holder,
        } => E::NotAcquired(proto::NotAcquired {
            request_id,
            key,
            holder,
            reason: match reason {
                NotAcquiredReason::Busy => not_acquired::Reason::Busy,
                NotAcquiredReason::Timeout => not_acquired::Reason::Timeout,
                NotAcquiredReason::Cancelled => not_acquired::Reason::Cancelled,
            } as i32,
        }),
        Event::Released {
            request_id,
            key,
            hold_count,
            holder,
        } => E::Released(proto::Released {
            request_id,
            key,
            hold_count,
            holder,
        }),
        Event::Proclaimed {
            request_id,
            key,
            holder,
        } => E::Proclaimed(proto::Proclaimed {
            request_id,
            key,
            holder,
        }),
        Event::Lost {
            key,
            reason,
            fence,
            holder,
        } => E::Lost(proto::Lost {
            key,
            reason,
            fencing_token: fence,
            holder,
        }),
        Event::Rejected(r) => E::Rejected(proto::Rejected {
            request_id: r.request_id,
            key: r.key,
            code: reject_code(r.code),
            message: r.message,
            holder: r.holder,
        }),
        Event::Jeopardy {
            key,
            ttl_remaining,
            holder,
        } => E::Jeopardy(proto::Jeopardy {
            key,
            ttl_remaining: Some(duration(ttl_remaining)),
            holder,
        }),
        Event::Restored { key, ttl, holder } => E::Restored(proto::Restored {
            key,
            ttl: Some(duration(ttl)),
            holder,
        }),
        Event::Ended(EndReason::Shutdown) => {
            return Err(Status::unavailable(
                "the sidecar is shutting down; every lock of this session was released",
            ));
        }
        Event::Ended(EndReason::Overflow) => {
            return Err(Status::resource_exhausted(
                "the client did not read its answers; every lock of this session was released",
            ));
        }
    };
    Ok(proto::LeaseResponse { event: Some(event) })
}

/// One state of a `Watch` stream: the state as `Describe` answers it, or how the
/// stream ends.
pub(super) fn watch_response(
    key: &str,
    state: Result<KeyView, EngineError>,
) -> Result<proto::WatchResponse, Status> {
    let state = state.map_err(status)?;
    Ok(proto::WatchResponse {
        state: Some(describe_response(key.to_owned(), state)),
    })
}

/// A `Describe` answer from the engine's view of a key.
pub(crate) fn describe_response(key: String, state: KeyView) -> proto::DescribeResponse {
    proto::DescribeResponse {
        mode: state.mode.map_or(proto::LockMode::Unspecified, lock_mode) as i32,
        limit: state.limit,
        holders: state
            .holders
            .into_iter()
            .map(|h| proto::Holder {
                session_id: h.session_id,
                hold_count: h.hold_count,
                ttl_remaining: Some(duration(h.ttl_remaining)),
                client_name: h.client_name,
                value: h.value,
                fencing_token: h.fence,
                holder: h.holder,
            })
            .collect(),
        waiters: state.waiters,
        fencing_token: state.fence,
        queue: state
            .queue
            .into_iter()
            .zip(1..)
            .map(|(w, position)| proto::QueueEntry {
                session_id: w.session_id,
                client_name: w.client_name,
                mode: lock_mode(w.mode) as i32,
                position,
                holder: w.holder,
            })
            .collect(),
        key,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_and_malformed_durations_are_refused() {
        let d = |seconds, nanos| Some(prost_types::Duration { seconds, nanos });
        assert_eq!(field_duration(None, "x"), Ok(None));
        assert_eq!(field_duration(d(1, 5), "x"), Ok(Some(Duration::new(1, 5))));
        assert!(field_duration(d(-1, 0), "x").is_err());
        assert!(field_duration(d(0, -1), "x").is_err());
        assert!(field_duration(d(0, 1_000_000_000), "x").is_err());
        assert!(field_duration(d(i64::MAX, 0), "x").is_ok());
    }
}
