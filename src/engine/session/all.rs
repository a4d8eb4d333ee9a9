//! Several keys at once (`AcquireAll`): every key or none, never a deadlock, and with
//! `fair`, never overtaken by a later request for any of its keys.
//!
//! **All or none.** The request takes every key it does not hold yet at once
//! (`all_attempt.rs`). If one is busy, it gives back those it took, before it waits
//! or answers: a request that waits, or was answered `NotAcquired`, holds nothing, and
//! leaves nothing in the store (its waiter registrations are taken off at its end).
//!
//! **No deadlock.** A waiting request holds nothing, so it never keeps another request
//! from a lock: a request waits only for *holders*, and a holder is a request that
//! completed and waits for nothing. No set of requests can wait for one another,
//! whatever the order of their keys, on one server or across Cluster masters. Nor do
//! two requests that keep meeting (each takes part of the keys, both give back) go on
//! forever: after each such meeting a request waits a random while, up to 2^n ms, so
//! that one gets through.
//!
//! **Fair.** A fair request queues on every key with one *ticket*, the store's clock at
//! its first busy answer (ms × 1024); every key's queue orders by score, and a single
//! key's requests are scored by arrival on the same clock, so that both compare. A
//! request is behind only those of a strictly smaller score: no two requests can each
//! be ahead of the other, so the oldest waiting fair request is first on every one of
//! its keys and is granted as soon as they are free. A key it takes and has to give
//! back keeps its place: its registration stays until the request ends.
//!
//! This file has the session's side: the checks, the slots the request takes (other
//! commands for its keys wait behind them; a `Release` of one cancels the request), and
//! its answer, `GrantedAll`, told once every new grant is in the session's record.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::all_attempt::{Again, AllOp, AllResult, acquire_all};
use super::{Acquiring, Session, Slot};
use crate::engine::{
    AcquireAllRequest, AcquireRequest, Command, Event, NotAcquiredReason, RejectCode, validate_key,
};
use crate::store::{Claim, Sharing, names};

/// The most keys one `AcquireAll` may ask for.
pub(crate) const MAX_KEYS: usize = 64;

/// An `AcquireAll` under way, as its answer needs it.
pub(super) struct AllPending {
    /// The keys, in the order asked.
    pub(super) keys: Vec<String>,
    pub(super) holder: String,
    /// Each key's slot name, in the order asked.
    pub(super) names: Vec<Arc<str>>,
    /// Cancels the request's tries; set (and `cancelled`) by a `Release` of one of its
    /// keys that the holder held already (the new keys' slots have their own flag).
    cancel: CancellationToken,
    cancelled: bool,
}

impl Session {
    pub(super) fn acquire_all(&mut self, request: AcquireAllRequest) {
        let id = request.request_id;
        let first = names::name(
            request.keys.first().map_or("", String::as_str),
            &request.holder,
        )
        .into_owned();
        let n = request.keys.len();
        if !(2..=MAX_KEYS).contains(&n) {
            let message = format!("AcquireAll takes 2 to {MAX_KEYS} keys; this one has {n}");
            return self.reject(id, &first, RejectCode::InvalidArgument, message);
        }
        let mut seen = HashSet::new();
        for key in &request.keys {
            let name = names::name(key, &request.holder).into_owned();
            if let Err(message) = validate_key(key) {
                return self.reject(id, &name, RejectCode::InvalidArgument, message);
            }
            if !seen.insert(key.as_str()) {
                let message = "a key appears twice in AcquireAll";
                return self.reject(id, &name, RejectCode::InvalidArgument, message);
            }
        }
        // The checks of one Acquire, for what the keys share.
        let one = AcquireRequest {
            request_id: id,
            key: request.keys[0].clone(),
            wait: request.wait,
            mode: request.mode,
            limit: 1,
            fair: request.fair,
            ttl: request.ttl,
            trace: request.trace.clone(),
            value: Vec::new(),
            holder: request.holder.clone(),
        };
        let (ttl, sharing, limit) = match self.check(&one) {
            Ok(checked) => checked,
            Err((code, message)) => return self.reject(id, &first, code, message),
        };
        if let Err(message) = self.shared.store.supports(sharing, limit, request.fair) {
            return self.reject(id, &first, RejectCode::Unimplemented, message);
        }
        // Each key: taken anew, or held already (held once more).
        let mut fresh = Vec::new();
        let mut again = Vec::new();
        for (at, key) in request.keys.iter().enumerate() {
            let name = names::name(key, &request.holder).into_owned();
            match self.slots.get(name.as_str()) {
                None => fresh.push(at),
                Some(Slot::Held(h)) if !h.busy => {
                    let refusal = if h.limit != 1 {
                        Some("this holder holds the key as a semaphore permit")
                    } else if h.sharing == Sharing::Shared && sharing == Sharing::Exclusive {
                        Some(
                            "this holder holds the key SHARED; release it before asking EXCLUSIVE (no upgrade)",
                        )
                    } else if h.count == u32::MAX {
                        Some("hold count is at its maximum")
                    } else {
                        None
                    };
                    if let Some(message) = refusal {
                        return self.reject(id, &name, RejectCode::FailedPrecondition, message);
                    }
                    again.push(Again {
                        at,
                        key: key.clone(),
                        owner: h.owner.clone(),
                        count: h.count + 1,
                        ttl: h.ttl,
                    });
                }
                Some(_) => {
                    // A request of this holder for this key is under way (an acquire,
                    // a release, a write of the record): the whole request waits its
                    // turn behind it, as a single Acquire does, and is checked afresh.
                    return self.queue_all_behind(name, request);
                }
            }
        }
        let max_locks = self.shared.config.max_locks_per_session;
        if self.slots.len() + fresh.len() > max_locks {
            let message = format!("this session holds or waits for {max_locks} locks, its limit");
            return self.reject(id, &first, RejectCode::ResourceExhausted, message);
        }
        let wait_until = (request.wait)
            .filter(|w| !w.is_zero())
            .map(|w| Instant::now() + w);
        let mut claims = Vec::new();
        let mut guards = Vec::new();
        for &at in &fresh {
            self.grants += 1;
            let claim = Claim {
                key: request.keys[at].clone(),
                owner: format!("{}.{}.{}", self.id, self.secret, self.grants),
                ttl,
                // The first try registers nothing: it may take every key at once.
                wait: false,
                session_id: self.id.clone(),
                client_name: self.client_name.clone(),
                holder: request.holder.clone(),
                sharing,
                limit,
                fair: request.fair,
                value: Vec::new(),
                ticket: None,
            };
            if wait_until.is_some() {
                let max_waiters = self.shared.config.max_waiters_per_key;
                match (self.shared.wakers).register(&claim.key, &claim.owner, max_waiters) {
                    Some(guard) => guards.push(guard),
                    None => {
                        let name = names::name(&claim.key, &request.holder).into_owned();
                        let message = format!(
                            "{max_waiters} requests already wait for this key on this sidecar, the limit"
                        );
                        return self.reject(id, &name, RejectCode::ResourceExhausted, message);
                    }
                }
            }
            claims.push((at, claim));
        }
        let names: Vec<Arc<str>> = (request.keys.iter())
            .map(|key| names::name(key, &request.holder).as_ref().into())
            .collect();
        let cancel = CancellationToken::new();
        let span =
            tracing::info_span!(parent: &self.span, "acquire_all", keys = n, fair = request.fair);
        for &at in &fresh {
            self.slots.insert(
                names[at].clone(),
                Slot::Acquiring(Box::new(Acquiring {
                    request_id: id,
                    span: span.clone(),
                    started: Instant::now(),
                    waited: false,
                    waiting: None,
                    cancel: cancel.clone(),
                    cancelled: false,
                    queue: VecDeque::new(),
                })),
            );
        }
        for a in &again {
            if let Some(Slot::Held(h)) = self.slots.get_mut(&*names[a.at]) {
                h.busy = true;
            }
        }
        self.pending.insert(id);
        self.alls.insert(
            id,
            AllPending {
                keys: request.keys,
                holder: request.holder,
                names: names.clone(),
                cancel: cancel.clone(),
                cancelled: false,
            },
        );
        let op = acquire_all(AllOp {
            store: self.shared.store.clone(),
            turns: self.shared.store_calls.clone(),
            request_id: id,
            claims,
            names,
            again,
            wait_until,
            guards,
            cancel,
            waiting: self.notes_tx.clone(),
        });
        self.ops
            .push(Box::pin(tracing::Instrument::instrument(op, span)));
    }

    /// The request's end: every key held (told `GrantedAll` once every new grant is in
    /// the session's record), or nothing held and `NotAcquired` or `Rejected`.
    pub(super) fn acquired_all(
        &mut self,
        request_id: u64,
        claims: Vec<(usize, Claim)>,
        names: Vec<Arc<str>>,
        outcome: AllResult,
    ) {
        self.pending.remove(&request_id);
        let Some(pending) = self.alls.remove(&request_id) else {
            return;
        };
        // Its slots: the new keys' leave (with the commands queued behind them), the
        // held keys' wait no more.
        let mut cancelled = pending.cancelled;
        let mut queues: Vec<(Arc<str>, VecDeque<_>)> = Vec::new();
        for (at, _) in &claims {
            if let Some(Slot::Acquiring(a)) = self.slots.remove(&*names[*at]) {
                cancelled |= a.cancelled;
                queues.push((names[*at].clone(), a.queue));
            }
        }
        for name in &names {
            if let Some(Slot::Held(h)) = self.slots.get_mut(&**name) {
                h.busy = false;
            }
        }
        let name_at = |at: usize| pending.names[at].to_string();
        match outcome {
            AllResult::Granted { taken, held } if cancelled => {
                // A Release of one of its keys crossed the grants: nothing is kept.
                for (at, _, _) in &taken {
                    if let Some((_, claim)) = claims.iter().find(|(a, _)| a == at) {
                        self.release_in_background(
                            claim.key.clone(),
                            claim.owner.clone(),
                            claim.ttl,
                        );
                    }
                }
                // The holds added to the keys held already are set right in the store by
                // their next hold or release (the session keeps its counts).
                drop(held);
                let at = claims.first().map_or(0, |(at, _)| *at);
                self.not_acquired_all(request_id, &pending, at, NotAcquiredReason::Cancelled);
            }
            AllResult::Granted { taken, held } => {
                self.granted_all(request_id, &pending, &claims, taken, held);
            }
            AllResult::Busy(at) => {
                self.not_acquired_all(request_id, &pending, at, NotAcquiredReason::Busy)
            }
            AllResult::Timeout(at) => {
                self.not_acquired_all(request_id, &pending, at, NotAcquiredReason::Timeout)
            }
            AllResult::Cancelled(at) => {
                self.not_acquired_all(request_id, &pending, at, NotAcquiredReason::Cancelled)
            }
            AllResult::Conflict(at, limit) => {
                let message = format!(
                    "the key is held with limit {limit}; AcquireAll takes locks, not permits"
                );
                self.reject(
                    request_id,
                    &name_at(at),
                    RejectCode::FailedPrecondition,
                    message,
                );
            }
            AllResult::Unavailable(at, e) => self.store_failed(request_id, &name_at(at), &e),
        }
        for (name, queue) in queues {
            self.redispatch(queue);
            self.drain(&name);
        }
        for name in &names {
            self.drain(name);
        }
    }

    fn not_acquired_all(
        &mut self,
        request_id: u64,
        pending: &AllPending,
        at: usize,
        reason: NotAcquiredReason,
    ) {
        self.send(Event::NotAcquired {
            request_id,
            key: pending.keys[at].clone(),
            reason,
            holder: pending.holder.clone(),
        });
    }

    /// A `Release` of `name`, which the holder held before an `AcquireAll` now under way
    /// asked for it again: the request is cancelled (the Release waits behind it).
    pub(super) fn cancel_all_for(&mut self, name: &str) {
        for pending in self.alls.values_mut() {
            if pending.names.iter().any(|n| &**n == name) {
                pending.cancelled = true;
                pending.cancel.cancel();
            }
        }
    }

    /// Queues `request` behind the command under way for `name`, one of its keys.
    fn queue_all_behind(&mut self, name: String, request: AcquireAllRequest) {
        let id = request.request_id;
        let command = Command::AcquireAll(request);
        match self.slots.get_mut(name.as_str()) {
            Some(Slot::Acquiring(a)) => a.queue.push_back(command),
            Some(Slot::Held(h)) => h.queue.push_back(command),
            None => return self.handle(command),
        }
        self.pending.insert(id);
    }
}
