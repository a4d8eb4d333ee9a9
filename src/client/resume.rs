//! Following a held lock's stream, and resuming its session when the stream breaks
//! (the sidecar died or was restarted).
//!
//! A broken stream is not yet a lost lock: the store keeps the lock until its TTL
//! after the last renewal. The client reconnects with the session's resume token,
//! with backoff, and reports the lock lost only when resuming fails, when the lock
//! comes back `Lost` or does not come back at all, or when the lock may no longer be
//! safe to use: the client cannot see renewals, so it counts on what the sidecar
//! promises. A sidecar renews every TTL/3 and says `Jeopardy` when a renewal fails;
//! a renewal that is only slow is confirmed within the sidecar's store timeout, and
//! the next one may wait behind it as long. So, without an open `Jeopardy`, a lock is
//! held in the store for at least `TTL × 2/3 − 2 × store timeout − drift margin` after
//! the stream broke ([`safe_window`]); with one, until the time `Jeopardy` gave.

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

/// The sidecar's default store timeout, twice (see the module docs): how late a
/// renewal may be confirmed without a `Jeopardy`.
pub const DEFAULT_RENEWAL_SLACK: Duration = Duration::from_secs(2);

/// First pause between resume attempts; doubled up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// How long after its stream broke a lock of TTL `ttl` is still held in the store for
/// sure (see the module docs); zero when the TTL is too short to count on anything.
pub fn safe_window(ttl: Duration, renewal_slack: Duration) -> Duration {
    // The sidecar's drift margin at its default clock drift (1% of the TTL + 2 ms).
    let margin = ttl / 100 + Duration::from_millis(2);
    (ttl * 2 / 3)
        .saturating_sub(renewal_slack)
        .saturating_sub(margin)
}

/// A lock's stream, as the follower keeps it.
pub(super) struct Followed {
    pub(super) grpc: Grpc,
    pub(super) key: String,
    pub(super) token: String,
    pub(super) ttl: Duration,
    pub(super) renewal_slack: Duration,
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
/// `Released` ends the stream's use); `Lost`, or a broken stream that cannot be
/// resumed in time, means the lock is gone, and fails what is still awaited. Requests
/// of the guard (`requests`) go to whichever stream is current.
pub(super) async fn follow(
    mut lock: Followed,
    mut requests: mpsc::Receiver<proto::LeaseRequest>,
    lost: watch::Sender<Option<String>>,
) {
    // When the lock stops being safe to use without news from the sidecar; set by
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
        let safe_until = jeopardy_until
            .unwrap_or_else(|| Instant::now() + safe_window(lock.ttl, lock.renewal_slack));
        match resume(&mut lock, safe_until).await {
            Ok(()) => {
                tracing::info!(key = %lock.key, "lock resumed on a new stream");
                jeopardy_until = None;
                for request in unanswered.values() {
                    let _ = lock.tx.send(request.clone()).await;
                }
            }
            Err(why) => break format!("{broke}; {why}"),
        }
    };
    // Set before the awaited answers fail, so their callers see the loss.
    let _ = lost.send(Some(why));
    if let Ok(mut awaited) = lock.answers.lock() {
        awaited.clear();
    }
}

/// Resumes the lock's session on a new stream before `safe_until`, with backoff;
/// `Err` says why the lock is lost.
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
        "not resumed while the lock was still safe to use ({last})"
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
