//! Following a held lock's stream, and resuming its session when the stream breaks.
//!
//! From the client's side, a connection to a live sidecar that broke (a reset on the
//! way, a stall) looks like a sidecar that died; but a live sidecar releases a broken
//! stream's locks at once (after its short grace), and a waiter elsewhere is granted
//! within milliseconds. So the moment the stream breaks the lock is
//! [`LockState::Suspended`]: stop using it. The client then resumes the session with
//! its resume token, with backoff, on the restarted sidecar or any other on the same
//! store: the lock is [`LockState::Held`] again when the resumed session lists it with
//! its token (nobody else can have held it in between), and [`LockState::Lost`] when
//! it comes back `Lost` or not at all, when resuming is refused, or when the lock's
//! TTL has passed since the break (the store has surely let it go by then). A store
//! that cannot resume sessions (the embedded memory store: no resume token) makes a
//! break a loss at once.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use super::error::from_status;
use super::{Answers, Grpc, answer_id, proto};
use crate::proto::lease_request::Command;
use crate::proto::lease_response::Event;
use crate::proto::limits::RESUME_HEADER;

/// First pause between resume attempts; doubled up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// Where a held lock stands, as its client knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockState {
    /// Held: use it.
    Held,
    /// The stream to the sidecar broke: stop using the lock now. It becomes `Held`
    /// again if the resumed session lists it, `Lost` otherwise.
    Suspended,
    /// Gone, and why: never use it again.
    Lost(String),
}

/// A lock's stream, as the follower keeps it.
pub(super) struct Followed {
    pub(super) grpc: Grpc,
    pub(super) key: String,
    pub(super) token: String,
    pub(super) ttl: Duration,
    pub(super) tx: mpsc::Sender<proto::LeaseRequest>,
    pub(super) events: Streaming<proto::LeaseResponse>,
    /// Answers the guard awaits (release, proclaim), by request id.
    pub(super) answers: Answers,
}

/// The request id of a guard's request.
fn request_id(request: &proto::LeaseRequest) -> Option<u64> {
    match request.command.as_ref()? {
        Command::Release(r) => Some(r.request_id),
        Command::Proclaim(p) => Some(p.request_id),
        _ => None,
    }
}

/// Reads the lock's stream until it ends: answers go to whoever awaits them (the last
/// `Released` ends the stream's use); a broken stream suspends the lock until it is
/// resumed; `Lost`, or a broken stream that cannot be resumed, means the lock is gone,
/// and fails what is still awaited. Requests of the guard (`requests`) go to whichever
/// stream is current.
pub(super) async fn follow(
    mut lock: Followed,
    mut requests: mpsc::Receiver<proto::LeaseRequest>,
    state: watch::Sender<LockState>,
) {
    // When the store lets the lock go without news from the sidecar; set by
    // `Jeopardy`, cleared by `Restored`.
    let mut jeopardy_until: Option<Instant> = None;
    // Requests not answered yet, by id: sent again on a resumed stream, since the old
    // one may have broken before they arrived (a release and a proclaim are both
    // idempotent).
    let mut unanswered: BTreeMap<u64, proto::LeaseRequest> = BTreeMap::new();
    let why = loop {
        let broke = tokio::select! {
            request = requests.recv() => match request {
                // Sent on the current stream; if it broke, the events side says so.
                Some(request) => {
                    if let Some(id) = request_id(&request) {
                        unanswered.insert(id, request.clone());
                    }
                    let _ = lock.tx.send(request).await;
                    continue;
                }
                // The guard is gone: dropping the stream releases the lock.
                None => return,
            },
            event = lock.events.next() => match event.map(|m| m.map(|m| m.event)) {
                Some(Ok(Some(Event::Lost(l)))) => break l.reason,
                Some(Ok(Some(Event::Jeopardy(j)))) => {
                    let left = j.ttl_remaining.and_then(|d| Duration::try_from(d).ok());
                    jeopardy_until = Some(Instant::now() + left.unwrap_or_default());
                    continue;
                }
                Some(Ok(Some(Event::Restored(_)))) => {
                    jeopardy_until = None;
                    continue;
                }
                Some(Ok(Some(event))) => {
                    let last = matches!(&event, Event::Released(r) if r.hold_count == 0);
                    if let Some(id) = answer_id(&event) {
                        unanswered.remove(&id);
                        let waiter = lock.answers.lock().ok().and_then(|mut a| a.remove(&id));
                        if let Some(waiter) = waiter {
                            let _ = waiter.send(event);
                        }
                    }
                    if last {
                        return;
                    }
                    continue;
                }
                Some(Ok(None)) => continue,
                Some(Err(status)) => format!("the stream broke: {}", from_status(&status)),
                None => "the sidecar ended the stream".to_owned(),
            },
        };
        // At once: a live sidecar may already have let a waiter in.
        let _ = state.send(LockState::Suspended);
        let gone_by = jeopardy_until.unwrap_or_else(|| Instant::now() + lock.ttl);
        match resume(&mut lock, gone_by).await {
            Ok(()) => {
                tracing::info!(key = %lock.key, "lock resumed on a new stream");
                let _ = state.send(LockState::Held);
                jeopardy_until = None;
                for request in unanswered.values() {
                    let _ = lock.tx.send(request.clone()).await;
                }
            }
            Err(why) => break format!("{broke}; {why}"),
        }
    };
    // Set before the awaited answers fail, so their callers see the loss.
    let _ = state.send(LockState::Lost(why));
    if let Ok(mut awaited) = lock.answers.lock() {
        awaited.clear();
    }
}

/// Resumes the lock's session on a new stream before `safe_until` (when the store has
/// surely let the lock go), with backoff; `Err` says why the lock is lost.
async fn resume(lock: &mut Followed, safe_until: Instant) -> Result<(), String> {
    if lock.token.is_empty() {
        return Err("the sidecar's store cannot resume sessions".into());
    }
    let mut backoff = FIRST_BACKOFF;
    let mut last = String::from("no time was left to resume the session");
    while Instant::now() < safe_until {
        match tokio::time::timeout_at(safe_until, attempt(lock)).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(Attempt::Final(why))) => return Err(why),
            Ok(Err(Attempt::Again(why))) => last = why,
            Err(_) => break,
        }
        let pause = backoff.min(safe_until.saturating_duration_since(Instant::now()));
        tokio::time::sleep(pause).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
    Err(format!(
        "not resumed before the store let the lock go ({last})"
    ))
}

/// Why one resume attempt failed.
enum Attempt {
    /// Worth trying again: the sidecar is not back yet, or the session is still
    /// attached to the old one (it is not yet known to be dead).
    Again(String),
    /// The lock is gone.
    Final(String),
}

/// One resume attempt: a new stream with the token; on success it replaces the lock's
/// stream, and the session's new token replaces the old one.
async fn attempt(lock: &mut Followed) -> Result<(), Attempt> {
    let (tx, rx) = mpsc::channel(4);
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    let token = lock
        .token
        .parse()
        .map_err(|_| Attempt::Final("the resume token is not a header value".into()))?;
    request.metadata_mut().insert(RESUME_HEADER, token);
    let mut events = match lock.grpc.lease(request).await {
        Ok(response) => response.into_inner(),
        Err(status) => {
            let why = from_status(&status).to_string();
            use tonic::Code;
            return Err(match status.code() {
                // This client or this sidecar cannot resume at all.
                Code::Unimplemented
                | Code::Unauthenticated
                | Code::PermissionDenied
                | Code::InvalidArgument => Attempt::Final(why),
                // Still attached to the old sidecar (not known dead yet), the sidecar
                // not back yet, full, or its store away for a moment.
                _ => Attempt::Again(why),
            });
        }
    };
    let broken = |why: String| Attempt::Again(format!("the new stream broke: {why}"));
    let started = match events.next().await {
        Some(Ok(proto::LeaseResponse {
            event: Some(Event::Started(started)),
        })) => started,
        Some(Err(status)) => return Err(broken(from_status(&status).to_string())),
        _ => return Err(broken("no SessionStarted".into())),
    };
    let mut back = None;
    for _ in 0..started.resumed_locks {
        match events.next().await {
            Some(Ok(proto::LeaseResponse { event: Some(event) })) => match event {
                Event::Granted(g) if g.key == lock.key => back = Some(Ok(())),
                Event::Lost(l) if l.key == lock.key => back = Some(Err(l.reason)),
                _ => {}
            },
            Some(Err(status)) => return Err(broken(from_status(&status).to_string())),
            _ => {
                return Err(broken(
                    "the resumed session said less than it promised".into(),
                ));
            }
        }
    }
    // The session is resumed (its old token is spent): whatever happens next, this
    // stream is the session now.
    lock.token = started.resume_token;
    lock.tx = tx;
    lock.events = events;
    match back {
        Some(Ok(())) => Ok(()),
        Some(Err(reason)) => Err(Attempt::Final(format!(
            "resumed, but the lock was lost: {reason}"
        ))),
        None => Err(Attempt::Final(
            "resumed, but the lock did not come back (granted just before the sidecar died)".into(),
        )),
    }
}
