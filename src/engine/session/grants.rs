//! A held grant's life in the session: taken on, given back, or lost (by the store's
//! answer, the renewer's word or the safe-deadline timer), and the commands queued
//! behind its key run once the key has no call under way.

use std::collections::VecDeque;
use std::sync::Arc;

use tokio::time::Instant;

use super::{Held, Session, Slot};
use crate::engine::renewer::{LeaseClock, RenewEvent, Renewable};
use crate::engine::{Command, Event};
use crate::metrics::Loss;
use crate::store::Claim;

impl Session {
    /// Takes on a grant the store just made: the renewer renews it, the journal will
    /// record it, and the client hears `Granted`.
    pub(super) fn hold_grant(
        &mut self,
        request_id: u64,
        claim: Claim,
        fence: u64,
        sent_at: Instant,
        valid_until: Instant,
        queue: VecDeque<Command>,
    ) {
        let lease_id = self.shared.next_lease_id();
        let clock = Arc::new(LeaseClock::new(valid_until));
        let key = claim.key;
        self.shared.renewer.add(Renewable {
            id: lease_id,
            key: key.clone(),
            owner: claim.owner.clone(),
            ttl: claim.ttl,
            confirmed_at: sent_at,
            clock: clock.clone(),
            events: self.renew_tx.clone(),
        });
        self.leases.insert(lease_id, key.clone());
        self.shared.metrics.locks_held.inc();
        self.journal_granted(&key, &claim.owner, claim.ttl, fence);
        let remaining = valid_until.saturating_duration_since(Instant::now());
        self.slots.insert(
            key.clone(),
            Slot::Held(Held {
                lease_id,
                owner: claim.owner,
                fence,
                ttl: claim.ttl,
                sharing: claim.sharing,
                limit: claim.limit,
                count: 1,
                clock,
                granted_at: Instant::now(),
                valid_until,
                jeopardy: false,
                busy: false,
                queue,
            }),
        );
        tracing::debug!(%key, fence, "granted");
        self.send(Event::Granted {
            request_id,
            key,
            fence,
            ttl: remaining,
            hold_count: 1,
        });
    }

    /// The last hold is gone: forget the grant and answer.
    pub(super) fn released(&mut self, key: String, request_id: u64) {
        let queue = match self.slots.remove(&key) {
            Some(Slot::Held(h)) => {
                self.shared.renewer.remove(h.lease_id);
                self.leases.remove(&h.lease_id);
                self.forget(&h);
                self.shared.journal.dropped(&self.record, &key);
                h.queue
            }
            _ => VecDeque::new(),
        };
        self.send(Event::Released {
            request_id,
            key,
            hold_count: 0,
        });
        self.redispatch(queue);
    }

    /// Drops a grant the session can no longer count on and says so. Returns the
    /// commands that were queued behind it.
    pub(super) fn lose(&mut self, key: &str, why: Loss) -> VecDeque<Command> {
        let Some(Slot::Held(h)) = self.slots.remove(key) else {
            return VecDeque::new();
        };
        let reason = super::lost_because(why);
        tracing::warn!(%key, fence = h.fence, %reason, "lock lost");
        self.shared.metrics.lost(why);
        self.forget(&h);
        self.shared.renewer.remove(h.lease_id);
        self.leases.remove(&h.lease_id);
        self.shared.journal.dropped(&self.record, key);
        // If the store is reachable again, let the others in now rather than at expiry.
        self.release_in_background(key.to_owned(), h.owner);
        self.send(Event::Lost {
            key: key.to_owned(),
            reason: reason.to_owned(),
            fence: h.fence,
        });
        h.queue
    }

    pub(super) fn release_in_background(&self, key: String, owner: String) {
        crate::engine::release_in_background(&self.shared.store, key, owner);
    }

    /// Runs the commands queued behind a key while the key has no call under way.
    pub(super) fn drain(&mut self, key: &str) {
        loop {
            let command = match self.slots.get_mut(key) {
                Some(Slot::Held(h)) if !h.busy => h.queue.pop_front(),
                _ => None,
            };
            let Some(command) = command else { return };
            self.redispatch(VecDeque::from([command]));
        }
    }

    pub(super) fn redispatch(&mut self, queue: VecDeque<Command>) {
        for command in queue {
            self.pending.remove(&command.request_id());
            self.handle(command);
        }
    }

    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.slots
            .values()
            .filter_map(|s| match s {
                Slot::Held(h) => Some(h.valid_until),
                Slot::Acquiring(_) => None,
            })
            .min()
    }

    pub(super) fn check_deadlines(&mut self) {
        let now = Instant::now();
        let mut lost = Vec::new();
        for (key, slot) in &mut self.slots {
            if let Slot::Held(h) = slot {
                h.valid_until = h.clock.get();
                if h.valid_until <= now {
                    lost.push(key.clone());
                }
            }
        }
        for key in lost {
            let queue = self.lose(&key, Loss::Deadline);
            self.redispatch(queue);
        }
    }

    pub(super) fn on_renew_event(&mut self, event: RenewEvent) {
        let (RenewEvent::Failing(id) | RenewEvent::Restored(id) | RenewEvent::NotHeld(id)) = event;
        let Some(key) = self.leases.get(&id).cloned() else {
            return;
        };
        let Some(Slot::Held(h)) = self.slots.get_mut(&key) else {
            return;
        };
        let left = h.clock.get().saturating_duration_since(Instant::now());
        match event {
            RenewEvent::Failing(_) if !h.jeopardy => {
                h.jeopardy = true;
                self.send(Event::Jeopardy {
                    key,
                    ttl_remaining: left,
                });
            }
            RenewEvent::Restored(_) if h.jeopardy => {
                h.jeopardy = false;
                self.send(Event::Restored { key, ttl: left });
            }
            RenewEvent::NotHeld(_) => {
                let queue = self.lose(&key, Loss::NotHeld);
                self.redispatch(queue);
            }
            _ => {}
        }
    }
}
