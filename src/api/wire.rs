//! The wire outbound: engine events to protobuf (`decode.rs` has the way in), and
//! the one place where engine outcomes become gRPC codes ([`reject_code`], [`status`]).

use std::time::Duration;

use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Status};

use crate::engine::{
    EndReason, EngineError, Event, KeyView, Mode, NotAcquiredReason, Refusal, RejectCode,
    STORE_OUT_OF_MEMORY,
};
use crate::proto::limits::{
    RESUME_REFUSED_ATTACHED, RESUME_REFUSED_TRAILER, RESUME_REFUSED_UNKNOWN,
};
use crate::proto::{self, lease_response, not_acquired};

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
        Event::GrantedAll {
            request_id,
            grants,
            holder,
        } => E::GrantedAll(proto::GrantedAll {
            request_id,
            grants: grants
                .into_iter()
                .map(|g| proto::Granted {
                    request_id,
                    key: g.key,
                    fencing_token: g.fence,
                    ttl: Some(duration(g.ttl)),
                    hold_count: g.hold_count,
                    holder: holder.clone(),
                })
                .collect(),
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
