//! What comes back from the store: the results of the session's calls, each turned
//! into its request's answer. A grant, once held, lives on in `grants.rs`.

use tokio::time::Instant;

use super::held::NOT_HELD;
use super::{AcquireResult, Acquiring, Done, Session, Slot};
use crate::engine::{Command, Event, NotAcquiredReason, RejectCode};
use crate::metrics::Loss;
use crate::store::{Claim, drift_margin, names};

/// Records how an acquire ended on its span.
fn trace_outcome(a: &Acquiring, outcome: &AcquireResult) {
    let span = &a.span;
    span.record("waited_ms", a.started.elapsed().as_millis() as u64);
    let name = match outcome {
        _ if a.cancelled => "cancelled",
        AcquireResult::Granted { fence, .. } => {
            span.record("fencing_token", fence);
            "granted"
        }
        AcquireResult::Busy => "busy",
        AcquireResult::Timeout => "timeout",
        AcquireResult::Cancelled => "cancelled",
        AcquireResult::Conflict { .. } => "conflict",
        AcquireResult::Unavailable(_) => {
            span.record("otel.status_code", "ERROR");
            "unavailable"
        }
    };
    span.record("outcome", name);
}

impl Session {
    pub(super) fn on_waiting(&mut self, request_id: u64, name: &str, position: u32) {
        if let Some(Slot::Acquiring(a)) = self.slots.get_mut(name)
            && a.request_id == request_id
            && !a.cancelled
        {
            a.waited = true;
            if a.waiting.is_none() {
                a.waiting = Some(self.shared.metrics.waiting());
            }
            a.span.record("queue_position", position);
            let (key, holder) = names::split(name);
            self.send(Event::Waiting {
                request_id,
                key: key.to_owned(),
                position,
                holder: holder.to_owned(),
            });
        }
    }

    pub(super) fn on_done(&mut self, done: Done) {
        match done {
            Done::Acquire {
                request_id,
                name,
                claim,
                outcome,
            } => self.acquired(request_id, &name, claim, outcome),
            Done::Reenter {
                name,
                lease_id,
                request,
                result,
            } => {
                self.pending.remove(&request.request_id);
                let Some(Slot::Held(h)) = self
                    .slots
                    .get_mut(name.as_str())
                    .filter(|s| lease_of(s) == Some(lease_id))
                else {
                    // The grant was lost while the call ran: acquire afresh.
                    return self.handle(Command::Acquire(request));
                };
                h.busy = false;
                match result {
                    Ok(Some(count)) => {
                        h.count = count;
                        if !request.value.is_empty() {
                            h.value = request.value.into_boxed_slice();
                        }
                        let event = Event::Granted {
                            request_id: request.request_id,
                            key: request.key,
                            fence: h.fence,
                            ttl: h.clock.get().saturating_duration_since(Instant::now()),
                            hold_count: count,
                            holder: request.holder,
                        };
                        self.send(event);
                        self.drain(&name);
                    }
                    // Lost with the store's data during its hold-off: written back
                    // first (`reassert.rs`), then held once more.
                    Ok(None) if self.shared.store.restarted() => {
                        self.pending.insert(request.request_id);
                        h.queue.push_front(Command::Acquire(request));
                        self.reassert(name.into());
                    }
                    Ok(None) => {
                        let queue = self.lose(&name, Loss::NotHeld);
                        self.handle(Command::Acquire(request));
                        self.redispatch(queue);
                    }
                    Err(e) => {
                        // The client hears UNAVAILABLE and the session keeps its count.
                        // Had the call run, the store holds one more: the session's next
                        // hold or release carries the count it keeps and sets it right.
                        self.store_failed(request.request_id, &name, &e);
                        self.drain(&name);
                    }
                }
            }
            Done::Release {
                name,
                lease_id,
                request_id,
                result,
            } => {
                self.pending.remove(&request_id);
                let Some(Slot::Held(h)) = self
                    .slots
                    .get_mut(name.as_str())
                    .filter(|s| lease_of(s) == Some(lease_id))
                else {
                    // Lost while the call ran: nothing is held any more.
                    return self.send_released(request_id, &name, 0);
                };
                h.busy = false;
                let last = h.count <= 1;
                match result {
                    Ok(Some(count)) if count > 0 => {
                        h.count = count;
                        self.send_released(request_id, &name, count);
                        self.drain(&name);
                    }
                    Ok(Some(_)) => self.released(name, request_id),
                    Ok(None) => {
                        let queue = self.lose(&name, Loss::NotHeld);
                        self.send_released(request_id, &name, 0);
                        self.redispatch(queue);
                    }
                    Err(e) if last => {
                        // Stop renewing, and release in the background until the store
                        // confirms it or lets the lock go at its expiry.
                        let key = names::key_of(&name);
                        log!(self, WARN, %key, error = %e, "release not confirmed by the store; retrying it in the background until the lock's TTL");
                        if let Some(Slot::Held(h)) = self.slots.get(name.as_str()) {
                            let (owner, ttl) = (h.owner.to_string(), h.ttl);
                            self.release_in_background(key.to_owned(), owner, ttl);
                        }
                        self.released(name, request_id);
                    }
                    Err(e) => {
                        // As for a hold: the session keeps its count, and a retried
                        // Release asks the store for the same count again.
                        self.store_failed(request_id, &name, &e);
                        self.drain(&name);
                    }
                }
            }
            Done::Proclaim {
                name,
                lease_id,
                request_id,
                result,
            } => self.proclaimed(name, lease_id, request_id, result),
            Done::Reassert {
                name,
                lease_id,
                sent_at,
                result,
            } => self.reasserted(name, lease_id, sent_at, result),
            Done::Recorded { name, lease_id } => self.recorded(name, lease_id),
            Done::AcquireAll {
                request_id,
                claims,
                names,
                outcome,
            } => self.acquired_all(request_id, claims, names, outcome),
            Done::RecordedAll { request_id, leases } => self.recorded_all(request_id, leases),
        }
    }

    fn proclaimed(
        &mut self,
        name: String,
        lease_id: u64,
        request_id: u64,
        result: Result<bool, crate::store::StoreError>,
    ) {
        self.pending.remove(&request_id);
        let Some(Slot::Held(h)) = self
            .slots
            .get_mut(name.as_str())
            .filter(|s| lease_of(s) == Some(lease_id))
        else {
            // Lost while the call ran (its `Lost` went out).
            return self.reject(request_id, &name, RejectCode::FailedPrecondition, NOT_HELD);
        };
        h.busy = false;
        match result {
            Ok(true) => {
                let (key, holder) = names::split(&name);
                self.send(Event::Proclaimed {
                    request_id,
                    key: key.to_owned(),
                    holder: holder.to_owned(),
                });
                self.drain(&name);
            }
            Ok(false) => {
                // The store no longer holds the grant: it is lost, and the value with it.
                let queue = self.lose(&name, Loss::NotHeld);
                self.reject(request_id, &name, RejectCode::FailedPrecondition, NOT_HELD);
                self.redispatch(queue);
            }
            Err(e) => {
                self.store_failed(request_id, &name, &e);
                self.drain(&name);
            }
        }
    }

    pub(super) fn acquired(
        &mut self,
        request_id: u64,
        name: &str,
        claim: Claim,
        outcome: AcquireResult,
    ) {
        self.pending.remove(&request_id);
        let key = claim.key.clone();
        let Some((shared_name, Slot::Acquiring(a))) = self.slots.remove_entry(name) else {
            // Cannot happen: an Acquiring slot only leaves through here.
            log!(self, ERROR, %key, "acquire finished without its slot");
            if let AcquireResult::Granted { .. } = outcome {
                self.release_in_background(key, claim.owner, claim.ttl);
            }
            return;
        };
        trace_outcome(&a, &outcome);
        let reason = match outcome {
            AcquireResult::Granted { fence, listed, .. } if a.cancelled => {
                self.give_back(&shared_name, &claim, fence, listed);
                Some(NotAcquiredReason::Cancelled)
            }
            _ if a.cancelled => Some(NotAcquiredReason::Cancelled),
            AcquireResult::Granted {
                fence,
                sent_at,
                listed,
            } => {
                let drift = self.shared.config.clock_drift;
                let valid_until = sent_at + claim.ttl - drift_margin(claim.ttl, drift);
                if valid_until <= Instant::now() {
                    self.give_back(&shared_name, &claim, fence, listed);
                    let message = "the store answered too late for the grant to be safe";
                    self.reject(request_id, name, RejectCode::Unavailable, message);
                    None
                } else {
                    let metrics = &self.shared.metrics;
                    metrics
                        .acquire_wait
                        .observe(a.started.elapsed().as_secs_f64());
                    if a.waited {
                        metrics.handoffs.inc();
                    }
                    let slot = (shared_name, a.queue);
                    let at = (sent_at, valid_until);
                    self.hold_grant(request_id, slot, claim, fence, at, listed);
                    return self.drain(name);
                }
            }
            AcquireResult::Busy => Some(NotAcquiredReason::Busy),
            AcquireResult::Timeout => Some(NotAcquiredReason::Timeout),
            AcquireResult::Cancelled => Some(NotAcquiredReason::Cancelled),
            AcquireResult::Conflict { limit } => {
                let message = format!(
                    "the key is held with limit {limit}; a request must use the holders' limit"
                );
                self.reject(request_id, name, RejectCode::FailedPrecondition, message);
                None
            }
            AcquireResult::Unavailable(e) => {
                // A call that timed out may still have been granted: the grant's owner
                // token is unique, so releasing it blindly is safe and frees the key
                // now rather than at its TTL.
                self.release_in_background(key.clone(), claim.owner, claim.ttl);
                self.store_failed(request_id, name, &e);
                None
            }
        };
        if let Some(reason) = reason {
            self.send(Event::NotAcquired {
                request_id,
                key,
                reason,
                holder: claim.holder,
            });
        }
        self.redispatch(a.queue);
    }
}

fn lease_of(slot: &Slot) -> Option<u64> {
    match slot {
        Slot::Held(h) => Some(h.lease_id),
        Slot::Acquiring(_) => None,
    }
}
