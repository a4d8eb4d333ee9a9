//! One acquire: its trace span, and its store calls: try, and while busy and allowed
//! to, wait for a wake-up and try again.
//!
//! A waiting acquire listens to its key's notices ([`Store::listen`]) from its first
//! busy answer until it ends, however it ends; an acquire that is granted at once, or
//! does not wait, never listens (no subscription, no round trip). The first busy answer
//! comes before the subscription, so a release in between would be missed: right after
//! listening, the acquire tries once more before it waits.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{AcquireResult, Done, Note};
use crate::engine::AcquireRequest;
use crate::engine::journal::SessionRef;
use crate::engine::wakers::WaitGuard;
use crate::store::{Acquired, Claim, Listing, Sharing, Store};

/// The span of a first acquire of a key; its outcome, wait and token are recorded
/// when it is answered (`results.rs`).
pub(super) fn acquire_span(
    session: &tracing::Span,
    request: &AcquireRequest,
    sharing: Sharing,
    limit: u32,
) -> tracing::Span {
    let mode = match (sharing, limit) {
        (Sharing::Shared, _) => "shared",
        (Sharing::Exclusive, 1) => "exclusive",
        (Sharing::Exclusive, _) => "semaphore",
    };
    let span = tracing::info_span!(
        parent: session,
        "acquire",
        key = %request.key,
        mode,
        limit,
        fair = request.fair,
        wait_timeout_ms = request.wait.map(|w| w.as_millis() as u64),
        outcome = tracing::field::Empty,
        waited_ms = tracing::field::Empty,
        queue_position = tracing::field::Empty,
        fencing_token = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    crate::telemetry::set_remote_parent(&span, &request.trace);
    span
}

pub(super) struct AcquireOp {
    pub(super) store: Arc<dyn Store>,
    pub(super) turns: Arc<Semaphore>,
    pub(super) claim: Claim,
    /// The slot's name (key and holder), for what the session is told.
    pub(super) name: Arc<str>,
    pub(super) request_id: u64,
    pub(super) wait_until: Option<Instant>,
    pub(super) guard: Option<WaitGuard>,
    pub(super) cancel: CancellationToken,
    pub(super) waiting: mpsc::UnboundedSender<Note>,
    /// The session, when the store may list the grant in its record in the same step
    /// ([`Store::acquire_listed`]).
    pub(super) record: Option<Arc<SessionRef>>,
}

pub(super) async fn acquire(op: AcquireOp) -> Done {
    let outcome = attempts(&op).await;
    if op.claim.wait && !matches!(outcome, AcquireResult::Granted { .. }) {
        // Leave the waiters of the key in the store, in the background: the answer
        // need not wait for it, and the registration expires anyway.
        let store = op.store.clone();
        let claim = op.claim.clone();
        tokio::spawn(async move {
            let _ = store.unwait(&claim).await;
        });
    }
    Done::Acquire {
        request_id: op.request_id,
        name: op.name,
        claim: op.claim,
        outcome,
    }
}

/// One [`Store::listen`] of a key without `watch`, ended when dropped.
pub(super) struct Listening {
    store: Arc<dyn Store>,
    key: String,
}

impl Listening {
    /// Listens to `key` until the returned guard is dropped; completes once notices
    /// flow. The listen counts from the call, so the guard is taken before waiting.
    pub(super) async fn start(store: &Arc<dyn Store>, key: &str) -> Self {
        let listen = store.listen(key, false);
        let guard = Self {
            store: store.clone(),
            key: key.to_owned(),
        };
        // A failure is logged by the store: the waiter still looks again at its times.
        let _ = listen.await;
        guard
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.store.unlisten(&self.key, false);
    }
}

/// Tries to acquire; while busy and allowed to wait, sleeps until a release notice, the
/// time the store said to look again (a holder's expiry, the end of a lock-delay, a
/// fair waiter ahead expiring), or a refresh of the waiter registration at TTL/3.
async fn attempts(op: &AcquireOp) -> AcquireResult {
    let mut told = false;
    // Held until this function returns: granted, timed out, cancelled or failed.
    let mut listening: Option<Listening> = None;
    loop {
        let sent_at = Instant::now();
        let turn = op.turns.acquire().await;
        let grant = op
            .claim
            .owner
            .rsplit('.')
            .next()
            .and_then(|n| n.parse().ok());
        let answer = match (&op.record, grant) {
            (Some(record), Some(grant)) => {
                let listing = Listing {
                    session_id: &record.id,
                    secret: &record.secret,
                    name: &op.name,
                    grant,
                };
                op.store.acquire_listed(&op.claim, listing).await
            }
            _ => op.store.acquire(&op.claim).await.map(|a| (a, false)),
        };
        drop(turn);
        let (expires_in, position) = match answer {
            Ok((Acquired::Granted { fence }, listed)) => {
                return AcquireResult::Granted {
                    fence,
                    sent_at,
                    listed,
                };
            }
            Ok((
                Acquired::Busy {
                    expires_in,
                    position,
                    ..
                },
                _,
            )) => (expires_in, position),
            Ok((Acquired::Conflict { limit }, _)) => return AcquireResult::Conflict { limit },
            Err(e) => return AcquireResult::Unavailable(e),
        };
        let (Some(until), Some(guard)) = (op.wait_until, op.guard.as_ref()) else {
            return AcquireResult::Busy;
        };
        if Instant::now() >= until {
            return AcquireResult::Timeout;
        }
        if listening.is_none() {
            let listen = Listening::start(&op.store, &op.claim.key);
            tokio::select! {
                listened = listen => listening = Some(listened),
                _ = op.cancel.cancelled() => return AcquireResult::Cancelled,
                _ = tokio::time::sleep_until(until) => return AcquireResult::Timeout,
            }
            // Notices flow now; a release since the busy answer freed the key unheard.
            continue;
        }
        if !told {
            told = true;
            let _ = op.waiting.send(Note::Waiting {
                request_id: op.request_id,
                name: op.name.clone(),
                position,
            });
        }
        // +1 ms: look just after the holder's expiry, not just before it.
        let look_again =
            Instant::now() + (expires_in + Duration::from_millis(1)).min(op.claim.ttl / 3);
        tokio::select! {
            // A wake first: a woken waiter always tries once more, so no wake is lost.
            biased;
            _ = guard.notified() => {}
            _ = op.cancel.cancelled() => return AcquireResult::Cancelled,
            _ = tokio::time::sleep_until(until) => return AcquireResult::Timeout,
            _ = tokio::time::sleep_until(look_again) => {}
        }
    }
}
