//! A broken stream (DESIGN.md, "A broken stream" and "Sessions that survive a sidecar
//! restart"). From the client's side a connection to a live sidecar that broke looks
//! like a sidecar that died, and a live sidecar releases a broken stream's locks at
//! once: so every lock is suspended the moment the stream breaks. The session is then
//! resumed with its token on a new stream, with backoff, on the restarted sidecar or
//! any other on the same store; each lock the resumed session lists with its token is
//! restored, any other lost, and so is each lock still suspended when its TTL has
//! passed since the break (or the time an open `Jeopardy` gave): the store has let it
//! go. A resume refused as unknown (the session is gone) ends the session at once, so
//! the client's next lock opens a new one. Retries log at debug; the outcome once.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use lockside_proto::lease_response::Event;
use lockside_proto::{LeaseRequest, LeaseResponse};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::StreamExt;
use tonic::{Code, Status, Streaming};

use super::{Kind, Phase, Session, SlotKey, State, log_lost};
use crate::ClientError;
use crate::error::{code_name, from_status};
use crate::limits::{RESUME_HEADER, RESUME_REFUSED_TRAILER, RESUME_REFUSED_UNKNOWN};
use crate::lock::LockState;

/// First pause between resume attempts; doubled up to [`MAX_BACKOFF`]: the sidecar is
/// local and comes back within seconds, or not in time.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// Why one resume attempt failed.
enum Attempt {
    /// Worth trying again: the sidecar is not back yet, or the session is still
    /// attached to the old one.
    Again(String),
    /// The session cannot come back.
    Final(String),
}

impl Session {
    /// The stream ended (`status`: how, `None` for a clean end). Resumes the session
    /// and returns its new stream, or ends it and returns `None`.
    pub(super) async fn resume_after(
        self: &Arc<Self>,
        status: Option<Status>,
    ) -> Option<Streaming<LeaseResponse>> {
        let (reason, mut gone_by) = {
            let mut state = self.lock();
            self.broke(&mut state, status)?
        };
        let mut backoff = FIRST_BACKOFF;
        let mut last = String::from("no attempt");
        loop {
            let attempt = self.attempt();
            tokio::pin!(attempt);
            let outcome = loop {
                let next = gone_by.values().min().copied();
                tokio::select! {
                    outcome = &mut attempt => break outcome,
                    _ = sleep_until(next) => {
                        if !self.expire(&mut gone_by, &reason, &last) {
                            return None;
                        }
                    }
                }
            };
            match outcome {
                Ok(events) => return Some(events),
                Err(Attempt::Final(why)) => {
                    let mut state = self.lock();
                    if state.phase == Phase::Resuming {
                        tracing::warn!(session = %state.session_id, %why, "the session cannot be resumed: its locks are lost");
                        self.end(&mut state, format!("{reason}; resuming failed: {why}"));
                    }
                    return None;
                }
                Err(Attempt::Again(why)) => {
                    if self.lock().phase != Phase::Resuming {
                        return None;
                    }
                    tracing::debug!(%why, again_in = ?backoff, "resuming the session");
                    last = why;
                }
            }
            let pause = tokio::time::sleep(backoff);
            tokio::pin!(pause);
            loop {
                let next = gone_by.values().min().copied();
                tokio::select! {
                    _ = &mut pause => break,
                    _ = sleep_until(next) => {
                        if !self.expire(&mut gone_by, &reason, &last) {
                            return None;
                        }
                    }
                }
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Either ends the session (`None`) or suspends every lock and starts resuming it:
    /// then how the stream broke and when the store lets each holder's key go.
    fn broke(
        &self,
        state: &mut State,
        status: Option<Status>,
    ) -> Option<(String, HashMap<SlotKey, Instant>)> {
        if matches!(state.phase, Phase::Ended(_)) {
            return None;
        }
        let reason = match &status {
            _ if state.closing => "client closed".to_owned(),
            None => "closed by the sidecar".to_owned(),
            Some(s) => broke_because(s),
        };
        if state.closing {
            self.end(state, reason);
            return None;
        }
        let resumable = status.as_ref().is_some_and(|s| {
            matches!(s.code(), Code::Unavailable | Code::Internal | Code::Unknown | Code::Cancelled)
                // A sidecar stopping cleanly sends `Lost` for every lock, releases,
                // then ends its streams saying so: nothing is left to resume.
                && !s.message().contains("shutting down")
        });
        let why_not = if state.slots.is_empty() || !resumable {
            Some(String::new())
        } else if !self.settings.resume {
            Some(" (resuming is off)".to_owned())
        } else if state.token.is_empty() {
            Some("; the sidecar's store cannot resume sessions (it gave no resume token: the embedded memory store or Redlock, which keep no session records), so its locks are gone".to_owned())
        } else {
            None
        };
        if let Some(why_not) = why_not {
            self.end(state, format!("{reason}{why_not}"));
            return None;
        }
        // First of all: a live sidecar releases these locks within milliseconds.
        state.phase = Phase::Resuming;
        for slot in state.slots.values() {
            for cell in &slot.cells {
                if !cell.released() && cell.suspend(&reason) {
                    self.tell(cell);
                }
            }
        }
        tracing::warn!(
            %reason,
            locks = state.slots.values().map(|s| s.cells.len()).sum::<usize>(),
            session = %state.session_id,
            "lease stream broke: locks suspended; resuming the session"
        );
        // The sidecar does not resume waits in progress: their callers hear it now.
        let waits: Vec<u64> = state
            .pending
            .iter()
            .filter(|(_, p)| matches!(p.kind, Kind::Acquire))
            .map(|(rid, _)| *rid)
            .collect();
        for rid in waits {
            if let Some(reply) = state.pending.remove(&rid).and_then(|p| p.reply) {
                let _ = reply.send(Err(ClientError::Unavailable(format!(
                    "the stream to the sidecar broke while waiting ({reason}); the sidecar does not resume waits in progress: ask again"
                ))));
            }
        }
        // The store keeps a lock at most its TTL after the last renewal, which came
        // before the break (or until the time an open Jeopardy gave).
        let now = Instant::now();
        let gone_by = state
            .slots
            .iter()
            .map(|(slot_key, slot)| {
                let ttl = slot
                    .cells
                    .iter()
                    .map(|c| c.ttl_asked)
                    .max()
                    .unwrap_or_default();
                (slot_key.clone(), slot.jeopardy_until.unwrap_or(now + ttl))
            })
            .collect();
        Some((reason, gone_by))
    }

    /// Loses every lock whose time has passed; false once the session ended (nothing
    /// held any more, or it ended otherwise meanwhile).
    fn expire(&self, gone_by: &mut HashMap<SlotKey, Instant>, reason: &str, last: &str) -> bool {
        let mut state = self.lock();
        if state.phase != Phase::Resuming {
            return false;
        }
        let now = Instant::now();
        let why = format!(
            "the stream to the sidecar broke ({reason}) and the session was not resumed before the lock's TTL passed (the store has let it go; the last attempt: {last})"
        );
        let mut lost = Vec::new();
        gone_by.retain(|slot_key, until| {
            if *until > now {
                return true;
            }
            if let Some(slot) = state.slots.remove(slot_key) {
                for cell in slot.cells {
                    if cell.set(LockState::Lost(why.clone())) {
                        if !cell.released() {
                            lost.push(cell.key().to_owned());
                        }
                        self.tell(&cell);
                    }
                    Self::name_done(&mut state, &cell);
                }
            }
            false
        });
        log_lost(&lost, &why);
        if state.slots.is_empty() {
            self.end(&mut state, why);
            return false;
        }
        true
    }

    /// One resume attempt: a new stream with the token, its greeting read and
    /// squared with what is held here; on success it is the session's stream.
    async fn attempt(self: &Arc<Self>) -> Result<Streaming<LeaseResponse>, Attempt> {
        let token = self.lock().token.clone();
        let (tx, rx) = mpsc::unbounded_channel::<LeaseRequest>();
        let mut request =
            tonic::Request::new(tokio_stream::wrappers::UnboundedReceiverStream::new(rx));
        let value = token
            .parse()
            .map_err(|_| Attempt::Final("the resume token is not a header value".into()))?;
        request.metadata_mut().insert(RESUME_HEADER, value);
        let mut grpc = self.grpc.clone();
        let mut events = match grpc.lease(request).await {
            Ok(response) => response.into_inner(),
            Err(status) => return Err(refused(&status)),
        };
        let started = match events.next().await {
            Some(Ok(LeaseResponse {
                event: Some(Event::Started(started)),
            })) => started,
            Some(Err(status)) => return Err(refused(&status)),
            _ => {
                return Err(Attempt::Again(
                    "the new stream did not start the session".into(),
                ));
            }
        };
        // The old token is spent from here on, whatever comes next.
        self.lock().token = started.resume_token.clone();
        let mut greeting = Vec::new();
        for _ in 0..started.resumed_locks {
            match events.next().await {
                Some(Ok(LeaseResponse { event: Some(event) })) => greeting.push(event),
                _ => {
                    return Err(Attempt::Again(
                        "the resumed stream broke before it said which locks came back".into(),
                    ));
                }
            }
        }
        let mut state = self.lock();
        if state.phase != Phase::Resuming {
            return Err(Attempt::Final("the session ended meanwhile".into()));
        }
        if started.session_id != state.session_id {
            return Err(Attempt::Final(
                "a resume answered with another session".into(),
            ));
        }
        state.tx = tx;
        state.phase = Phase::Open;
        let (out, lost) = self.reconcile(&mut state, greeting);
        for command in out {
            state.send(command);
        }
        let mut restored = 0;
        for slot in state.slots.values() {
            for cell in &slot.cells {
                if cell.set(LockState::Held) {
                    restored += 1;
                    self.tell(cell);
                }
            }
        }
        log_lost(&lost, "not held by the resumed session");
        tracing::info!(session = %state.session_id, restored, lost = lost.len(), "session resumed");
        self.settled.notify_waiters();
        Ok(events)
    }
}

/// A refused attempt: worth another one, or not. FAILED_PRECONDITION says why in its
/// trailer: `unknown` (the session is gone) is final; `attached` (still attached to a
/// stream elsewhere), or no word (an older sidecar), is tried again.
fn refused(status: &Status) -> Attempt {
    let why = from_status(status).to_string();
    match status.code() {
        Code::FailedPrecondition => {
            let detail = status
                .metadata()
                .get(RESUME_REFUSED_TRAILER)
                .and_then(|v| v.to_str().ok());
            if detail == Some(RESUME_REFUSED_UNKNOWN) {
                Attempt::Final(format!(
                    "the sidecar does not know the session (refused as unknown: {why})"
                ))
            } else {
                Attempt::Again(why)
            }
        }
        Code::Unimplemented
        | Code::Unauthenticated
        | Code::PermissionDenied
        | Code::InvalidArgument => Attempt::Final(why),
        _ => Attempt::Again(why),
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// How a stream that ended with `status` broke, in words: a connection that broke
/// under the stream (the sidecar killed or restarted, a reset) says so first, with
/// tonic's words after it for whoever debugs ("h2 protocol error: error reading a body
/// from connection" alone reads like a bug in the app).
fn broke_because(status: &Status) -> String {
    let said = format!("{}: {}", code_name(status.code() as i32), status.message());
    let message = status.message().to_ascii_lowercase();
    let transport = [
        "h2 protocol error",
        "transport error",
        "connection",
        "broken pipe",
    ]
    .iter()
    .any(|words| message.contains(words));
    if transport {
        format!("the connection to the sidecar broke ({said})")
    } else {
        said
    }
}

#[cfg(test)]
mod words {
    use tonic::{Code, Status};

    #[test]
    fn a_broken_connection_says_so_before_tonic_does() {
        let h2 = Status::new(
            Code::Unknown,
            "h2 protocol error: error reading a body from connection",
        );
        assert_eq!(
            super::broke_because(&h2),
            "the connection to the sidecar broke (UNKNOWN: h2 protocol error: error reading a body from connection)"
        );
        let other = Status::new(Code::Internal, "a bug");
        assert_eq!(super::broke_because(&other), "INTERNAL: a bug");
    }
}
