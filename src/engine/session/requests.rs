//! Client commands: validated, then turned into store calls (one per key at a time)
//! or answered at once.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::attempt::{AcquireOp, acquire, acquire_span};
use super::held::check_value;
use super::{Acquiring, Done, Session, Slot};
use crate::engine::{
    AcquireRequest, Command, Event, Mode, RejectCode, Rejection, validate_holder, validate_key,
};
use crate::proto::limits::{MAX_WAIT, MIN_TTL};
use crate::store::{Claim, Sharing, names};

impl Session {
    pub(super) fn handle(&mut self, command: Command) {
        let (request_id, key, holder) = (command.request_id(), command.key(), command.holder());
        let refusal = if self.pending.contains(&request_id) {
            let message = format!("request_id {request_id} is still pending on this session");
            Some((RejectCode::InvalidArgument, message))
        } else if let Err(message) = validate_key(key).and_then(|()| validate_holder(holder)) {
            Some((RejectCode::InvalidArgument, message))
        } else if self.pending.len() >= self.shared.config.max_pending_per_session {
            let message = format!(
                "this session has {} requests pending, its limit",
                self.pending.len()
            );
            Some((RejectCode::ResourceExhausted, message))
        } else {
            None
        };
        if let Some((code, message)) = refusal {
            // Echoed as given (cut short): a bad key or holder makes no name.
            let rejection = Rejection::new(request_id, key, code, message).of_holder(holder);
            return self.send(Event::Rejected(rejection));
        }
        match command {
            Command::Acquire(request) => self.acquire(request),
            Command::AcquireAll(request) => self.acquire_all(request),
            Command::Release {
                request_id,
                key,
                holder,
            } => self.release(request_id, key, holder),
            Command::Proclaim {
                request_id,
                key,
                value,
                holder,
            } => self.proclaim(request_id, key, value, holder),
        }
    }

    /// Checks the values of an `Acquire` that do not depend on the session's state;
    /// returns its TTL, mode and limit (1 for a lock, N for a semaphore).
    pub(super) fn check(
        &self,
        r: &AcquireRequest,
    ) -> Result<(Duration, Sharing, u32), (RejectCode, String)> {
        use RejectCode::*;
        let sharing = match r.mode {
            Mode::Exclusive => Sharing::Exclusive,
            Mode::Shared => Sharing::Shared,
        };
        let limit = r.limit.max(1);
        if sharing == Sharing::Shared && limit > 1 {
            return Err((
                InvalidArgument,
                "a semaphore (limit > 1) is not SHARED: its permits are exclusive".into(),
            ));
        }
        let max_ttl = self.shared.config.max_ttl;
        let ttl = r.ttl.unwrap_or(self.shared.config.default_ttl);
        if ttl < MIN_TTL || ttl > max_ttl {
            return Err((
                InvalidArgument,
                format!("ttl {ttl:?} is outside the allowed range {MIN_TTL:?} to {max_ttl:?}"),
            ));
        }
        if let Some(wait) = r.wait
            && wait > MAX_WAIT
        {
            return Err((
                InvalidArgument,
                format!("wait_timeout {wait:?} is longer than the maximum {MAX_WAIT:?}"),
            ));
        }
        check_value(&r.value)?;
        Ok((ttl, sharing, limit))
    }

    pub(super) fn acquire(&mut self, request: AcquireRequest) {
        // Borrowed from the request (a copy only for a named holder): the first
        // acquire's slot makes its one string of it, a reentrant hold an owned copy.
        let name = names::name(&request.key, &request.holder);
        let (ttl, sharing, limit) = match self.check(&request) {
            Ok(checked) => checked,
            Err((code, message)) => {
                return self.reject(request.request_id, &name, code, message);
            }
        };
        let config = &self.shared.config;
        let (max_locks, max_waiters) = (config.max_locks_per_session, config.max_waiters_per_key);
        match self.slots.get_mut(name.as_ref()) {
            Some(Slot::Acquiring(a)) => {
                self.pending.insert(request.request_id);
                a.queue.push_back(Command::Acquire(request));
            }
            Some(Slot::Held(h)) if h.busy => {
                self.pending.insert(request.request_id);
                h.queue.push_back(Command::Acquire(request));
            }
            Some(Slot::Held(h)) => {
                if h.limit != limit {
                    let message = format!(
                        "this holder holds the key with limit {}; it cannot ask again with limit {limit}",
                        h.limit
                    );
                    return self.reject(
                        request.request_id,
                        &name,
                        RejectCode::FailedPrecondition,
                        message,
                    );
                }
                if h.sharing == Sharing::Shared && sharing == Sharing::Exclusive {
                    // Two readers upgrading at once would wait for each other forever.
                    let message = "this holder holds the key SHARED; release it before asking EXCLUSIVE (no upgrade)";
                    return self.reject(
                        request.request_id,
                        &name,
                        RejectCode::FailedPrecondition,
                        message,
                    );
                }
                if h.count == u32::MAX {
                    let message = "hold count is at its maximum";
                    return self.reject(
                        request.request_id,
                        &name,
                        RejectCode::ResourceExhausted,
                        message,
                    );
                }
                // Reentrant: the store mirrors the session's hold count so Describe shows
                // it. The call carries the count wanted, not "one more": if it fails
                // (the session keeps its count) but ran, the next hold or release sets
                // the store's count right. A reentrant acquire keeps the grant's TTL and
                // mode (SHARED asked while holding EXCLUSIVE is a hold of the exclusive
                // grant).
                //
                // A value on a reentrant acquire replaces the grant's value, as etcd's
                // Campaign on a lease that already leads proclaims; an empty one (proto3
                // cannot tell it from none) keeps it. The hold goes first: if the value
                // then cannot be set, the client hears UNAVAILABLE and keeps its count,
                // as for any hold that failed.
                h.busy = true;
                self.pending.insert(request.request_id);
                let (store, turns) = (self.shared.store.clone(), self.shared.store_calls.clone());
                let (owner, ttl, lease_id) = (h.owner.clone(), h.ttl, h.lease_id);
                let count = h.count + 1;
                let value = request.value.clone();
                let name = name.into_owned();
                self.ops.push(Box::pin(async move {
                    let _turn = turns.acquire().await;
                    let key = names::key_of(&name);
                    let mut result = store.reenter(key, &owner, count, ttl).await;
                    if let Ok(Some(_)) = result
                        && !value.is_empty()
                    {
                        result = match store.proclaim(key, &owner, &value).await {
                            Ok(true) => result,
                            // Gone between the two calls: as a hold that found no grant.
                            Ok(false) => Ok(None),
                            Err(e) => Err(e),
                        };
                    }
                    Done::Reenter {
                        name,
                        lease_id,
                        request,
                        result,
                    }
                }));
            }
            None => {
                if let Err(message) = self.shared.store.supports(sharing, limit, request.fair) {
                    return self.reject(
                        request.request_id,
                        &name,
                        RejectCode::Unimplemented,
                        message,
                    );
                }
                // Every holder's grants and waits count against the session's limit.
                if self.slots.len() >= max_locks {
                    let message =
                        format!("this session holds or waits for {max_locks} locks, its limit");
                    return self.reject(
                        request.request_id,
                        &name,
                        RejectCode::ResourceExhausted,
                        message,
                    );
                }
                let wait_until = request
                    .wait
                    .filter(|w| !w.is_zero())
                    .map(|w| Instant::now() + w);
                self.grants += 1;
                // `session id.secret.grant`: unique per grant; the store shows the part
                // before the first '.' (the public session id) and never the rest.
                let owner = format!("{}.{}.{}", self.id, self.secret, self.grants);
                let guard = match wait_until {
                    None => None,
                    Some(_) => match self
                        .shared
                        .wakers
                        .register(&request.key, &owner, max_waiters)
                    {
                        Some(guard) => Some(guard),
                        None => {
                            let message = format!(
                                "{max_waiters} requests already wait for this key on this sidecar, the limit"
                            );
                            return self.reject(
                                request.request_id,
                                &name,
                                RejectCode::ResourceExhausted,
                                message,
                            );
                        }
                    },
                };
                let claim = Claim {
                    key: request.key.clone(),
                    owner,
                    ttl,
                    wait: guard.is_some(),
                    session_id: self.id.clone(),
                    client_name: self.client_name.clone(),
                    holder: request.holder.clone(),
                    sharing,
                    limit,
                    fair: request.fair,
                    value: request.value.clone(),
                    ticket: None,
                };
                let cancel = CancellationToken::new();
                let span = acquire_span(&self.span, &request, sharing, limit);
                let name: Arc<str> = name.as_ref().into();
                self.slots.insert(
                    name.clone(),
                    Slot::Acquiring(Box::new(Acquiring {
                        request_id: request.request_id,
                        span: span.clone(),
                        started: Instant::now(),
                        waited: false,
                        waiting: None,
                        cancel: cancel.clone(),
                        cancelled: false,
                        queue: VecDeque::new(),
                    })),
                );
                self.pending.insert(request.request_id);
                let record = self.lists(&name);
                let op = acquire(AcquireOp {
                    store: self.shared.store.clone(),
                    turns: self.shared.store_calls.clone(),
                    claim,
                    name,
                    request_id: request.request_id,
                    wait_until,
                    guard,
                    cancel,
                    waiting: self.notes_tx.clone(),
                    // Only once the session has a record to list grants in.
                    record,
                });
                self.ops.push(Box::pin(op.instrument(span)));
            }
        }
    }
}
