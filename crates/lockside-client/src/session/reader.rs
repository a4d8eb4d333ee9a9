//! The reader: reads the session's stream and routes each message, under the
//! session's lock: answers to the requests they answer (by `request_id`), `Lost`,
//! `Jeopardy` and `Restored` to the grants of the holder and key they name. When the
//! stream ends it hands over to `resume.rs`.

use std::sync::{Arc, Weak};
use std::time::Duration;

use lockside_proto::LeaseResponse;
use lockside_proto::lease_response::Event;
use tokio::time::Instant;
use tokio_stream::StreamExt;
use tonic::Streaming;

use super::{Answer, Kind, Session, State};
use crate::lock::{LockCell, LockState};
use crate::releasing;

/// Follows the session's streams until it ends. Between messages it holds the session
/// only weakly: a client dropped with its locks ends its session (the stream's
/// sender goes with it, and the sidecar releases everything).
pub(super) async fn follow(session: Weak<Session>, mut events: Streaming<LeaseResponse>) {
    loop {
        let message = events.next().await;
        let Some(s) = session.upgrade() else { return };
        match message {
            Some(Ok(LeaseResponse { event: Some(event) })) => s.dispatch(event),
            Some(Ok(LeaseResponse { event: None })) => {}
            Some(Err(status)) => match s.resume_after(Some(status)).await {
                Some(next) => events = next,
                None => return,
            },
            None => match s.resume_after(None).await {
                Some(next) => events = next,
                None => return,
            },
        }
    }
}

impl Session {
    fn dispatch(self: &Arc<Self>, event: Event) {
        let mut state = self.lock();
        match event {
            Event::Granted(g) if g.request_id != 0 => {
                let Some(pending) = state.pending.remove(&g.request_id) else {
                    return;
                };
                let ttl_asked = pending.ttl_asked.unwrap_or(state.default_ttl);
                let cell = LockCell::new(
                    pending.key.clone(),
                    pending.holder.clone(),
                    &g,
                    state.session_id.clone(),
                    ttl_asked,
                );
                state
                    .slots
                    .entry((pending.holder.clone(), pending.key.clone()))
                    .or_default()
                    .cells
                    .push(cell.clone());
                let taken = match pending.reply {
                    Some(reply) => reply.send(Ok(Answer::Granted(cell.clone()))).is_ok(),
                    None => false,
                };
                if !taken {
                    // Nobody waits for this grant any more: give it back at once (its
                    // name was handed back by the caller that gave up).
                    cell.mark_released();
                    cell.name_returned
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                    self.send_release(&mut state, &cell);
                }
            }
            Event::GrantedAll(all) => self.granted_all(&mut state, all),
            Event::NotAcquired(n) => answered(&mut state, n.request_id, Event::NotAcquired(n)),
            Event::Proclaimed(p) => answered(&mut state, p.request_id, Event::Proclaimed(p)),
            Event::Rejected(r) => {
                let rid = r.request_id;
                if let Some(pending) = state.pending.get(&rid)
                    && let Kind::Release(cell) = &pending.kind
                {
                    let (key, cell) = (pending.key.clone(), cell.clone());
                    state.pending.remove(&rid);
                    releasing::remove(&key, self.number, rid);
                    forget(&mut state, &cell);
                    // FAILED_PRECONDITION: a `Lost` crossed the release.
                    if r.code != tonic::Code::FailedPrecondition as i32 {
                        tracing::warn!(%key, code = r.code, message = %r.message, "the release of a lock was refused");
                    }
                    return;
                }
                answered(&mut state, rid, Event::Rejected(r));
            }
            Event::Released(r) => {
                let Some(pending) = state.pending.remove(&r.request_id) else {
                    return;
                };
                if let Kind::Release(cell) = &pending.kind {
                    releasing::remove(&pending.key, self.number, r.request_id);
                    forget(&mut state, cell);
                }
            }
            Event::Lost(l) => {
                let Some(slot) = state.slots.remove(&(l.holder.clone(), l.key.clone())) else {
                    return;
                };
                let reason = if l.reason.is_empty() {
                    "Lost".to_owned()
                } else {
                    l.reason
                };
                for cell in slot.cells {
                    if cell.set(LockState::Lost(reason.clone())) {
                        tracing::debug!(key = %l.key, holder = %l.holder, %reason, "lock lost");
                        Self::name_done(&mut state, &cell);
                        self.tell(&cell);
                    }
                }
            }
            Event::Jeopardy(j) => {
                let left = j
                    .ttl_remaining
                    .and_then(|d| Duration::try_from(d).ok())
                    .unwrap_or_default();
                if let Some(slot) = state.slots.get_mut(&(j.holder.clone(), j.key.clone())) {
                    slot.jeopardy_until = Some(Instant::now() + left);
                }
                tracing::debug!(key = %j.key, holder = %j.holder, left = ?left, "lock in jeopardy: renewals failing");
            }
            Event::Restored(r) => {
                if let Some(slot) = state.slots.get_mut(&(r.holder.clone(), r.key.clone())) {
                    slot.jeopardy_until = None;
                }
                tracing::debug!(key = %r.key, holder = %r.holder, "lock renewed again after jeopardy");
            }
            _ => {} // Waiting, a grant listed by a resume (read there), newer events
        }
    }
}

/// Hands an answer to the request waiting for it.
fn answered(state: &mut State, rid: u64, event: Event) {
    let Some(pending) = state.pending.remove(&rid) else {
        return;
    };
    match pending.reply {
        Some(reply) => {
            let _ = reply.send(Ok(Answer::Other(event)));
        }
        None => super::acquire_all::given_up(state, &pending),
    }
}

/// A grant given back and answered: the session no longer counts it.
pub(super) fn forget(state: &mut State, cell: &Arc<LockCell>) {
    let slot_key = (cell.holder().to_owned(), cell.key().to_owned());
    if let Some(slot) = state.slots.get_mut(&slot_key) {
        slot.cells.retain(|c| !Arc::ptr_eq(c, cell));
        if slot.cells.is_empty() {
            state.slots.remove(&slot_key);
        }
    }
}
