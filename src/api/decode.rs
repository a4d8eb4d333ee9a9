//! The wire inbound: a `LeaseRequest` decoded into an engine command, or a rejection
//! that names what is wrong with it (size, UTF-8, durations, mode).

use std::time::Duration;

use prost::Message;

use crate::engine::{
    AcquireAllRequest, AcquireRequest, Command, Inbound, Mode, RejectCode, Rejection,
};
use crate::proto::codec::UNREADABLE;
use crate::proto::{self, lease_request};
use crate::telemetry::{TRACEPARENT, TRACESTATE, TraceContext};

use super::MAX_REQUEST_BYTES;

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

/// An acquire's mode, wait and TTL as the engine takes them.
fn timing(
    mode: i32,
    wait: Option<prost_types::Duration>,
    ttl: Option<prost_types::Duration>,
) -> Result<(Mode, Option<Duration>, Option<Duration>), String> {
    let mode = match proto::LockMode::try_from(mode) {
        Ok(proto::LockMode::Unspecified | proto::LockMode::Exclusive) => Mode::Exclusive,
        Ok(proto::LockMode::Shared) => Mode::Shared,
        Err(_) => return Err(format!("mode {mode} is not a LockMode")),
    };
    let wait = field_duration(wait, "wait_timeout")?;
    let ttl = field_duration(ttl, "ttl")?;
    Ok((mode, wait, ttl))
}

pub(super) fn decode(message: proto::LeaseRequest) -> Inbound {
    let size = message.encoded_len();
    let (request_id, key) = match &message.command {
        Some(lease_request::Command::Acquire(a)) => (a.request_id, a.key.as_str()),
        Some(lease_request::Command::Release(r)) => (r.request_id, r.key.as_str()),
        Some(lease_request::Command::Proclaim(p)) => (p.request_id, p.key.as_str()),
        Some(lease_request::Command::AcquireAll(a)) => {
            let first = a.keys.first().map_or("", String::as_str);
            (a.request_id, first)
        }
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
        Some(lease_request::Command::AcquireAll(a)) => {
            let (mode, wait, ttl) = match timing(a.mode, a.wait_timeout, a.ttl) {
                Ok(decoded) => decoded,
                Err(message) => return invalid(RejectCode::InvalidArgument, message),
            };
            Command::AcquireAll(AcquireAllRequest {
                request_id: a.request_id,
                keys: a.keys,
                wait,
                mode,
                fair: a.fair,
                ttl,
                trace: TraceContext {
                    traceparent: a.traceparent,
                    tracestate: None,
                },
                holder: a.holder,
            })
        }
        Some(lease_request::Command::Acquire(a)) => {
            let (mode, wait, ttl) = match timing(a.mode, a.wait_timeout, a.ttl) {
                Ok(decoded) => decoded,
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
