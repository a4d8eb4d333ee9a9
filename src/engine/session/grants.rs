//! A held grant's life in the session: taken on, given back, or lost (by the store's
//! answer, the renewer's word or the safe-deadline timer), and the commands queued
//! behind its key run once the key has no call under way.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Done, Held, Session, Slot};
use crate::engine::renewer::{LeaseClock, RenewEvent, Renewable};
use crate::engine::{Command, Event};
use crate::metrics::Loss;
use crate::store::{Claim, names};

impl Session {
    /// Takes on a grant the store just made: the renewer renews it, the journal records
    /// it, and the client hears `Granted` once the record names it (at once on a store
    /// that keeps no records). Until then the slot is busy: commands for it wait, and
    /// a loss tells `Granted` first. `slot` is what the acquire's slot leaves: its name
    /// (the one string of it that the session, the renewer and the journal share) and
    /// the commands queued behind it.
    /// `at`: when the acquire was sent, and until when the grant is valid; `listed`:
    /// the store listed it in the session's record already.
    pub(super) fn hold_grant(
        &mut self,
        request_id: u64,
        slot: (Arc<str>, VecDeque<Command>),
        claim: Claim,
        fence: u64,
        at: (Instant, Instant),
        listed: bool,
    ) {
        let (name, queue) = slot;
        let (sent_at, valid_until) = at;
        let holder_name = claim.holder.clone();
        let key = claim.key.clone();
        let taken = self.take_on(name.clone(), claim, fence, (sent_at, valid_until), listed);
        let (lease_id, recording) = taken;
        if let Some(Slot::Held(h)) = self.slots.get_mut(&*name) {
            h.queue = queue;
            h.busy = recording.is_some();
        }
        let granted = Event::Granted {
            request_id,
            key,
            fence,
            ttl: valid_until.saturating_duration_since(Instant::now()),
            hold_count: 1,
            holder: holder_name,
        };
        match recording {
            None => self.send(granted),
            Some(written) => {
                self.untold.insert(name.clone(), granted);
                self.ops.push(Box::pin(async move {
                    let _ = written.await;
                    Done::Recorded { name, lease_id }
                }));
            }
        }
    }

    /// Takes a new grant on as a held slot: the renewer renews it, the journal records
    /// it. Returns its lease id, and what answers once the record names it (`None`: a
    /// store that keeps no records).
    pub(super) fn take_on(
        &mut self,
        name: Arc<str>,
        claim: Claim,
        fence: u64,
        at: (Instant, Instant),
        listed: bool,
    ) -> (u64, Option<tokio::sync::oneshot::Receiver<()>>) {
        let (sent_at, valid_until) = at;
        let lease_id = self.shared.next_lease_id();
        let clock = Arc::new(LeaseClock::new(valid_until));
        let owner: Arc<str> = claim.owner.into();
        self.shared.renewer.add(Renewable {
            id: lease_id,
            name: name.clone(),
            owner: owner.clone(),
            ttl: claim.ttl,
            confirmed_at: sent_at,
            clock: clock.clone(),
            events: self.notes_tx.clone(),
        });
        self.shared.metrics.locks_held.inc();
        let recording = self.journal_granted(&name, &owner, claim.ttl, fence, listed);
        self.watch_deadline(valid_until);
        self.slots.insert(
            name.clone(),
            Slot::Held(Box::new(Held {
                lease_id,
                owner,
                fence,
                ttl: claim.ttl,
                sharing: claim.sharing,
                limit: claim.limit,
                count: 1,
                clock,
                granted_at: Instant::now(),
                jeopardy: false,
                busy: false,
                gone: false,
                queue: VecDeque::new(),
                value: claim.value.into_boxed_slice(),
            })),
        );
        let (key, holder) = names::split(&name);
        log!(self, DEBUG, %key, %holder, fence, "granted");
        (lease_id, recording)
    }

    /// The record names grant `lease_id` of `name`: its client hears `Granted` now, and
    /// the commands that waited for it run.
    pub(super) fn recorded(&mut self, name: Arc<str>, lease_id: u64) {
        let Some(Slot::Held(h)) = self.slots.get_mut(&*name) else {
            return;
        };
        if h.lease_id != lease_id {
            return;
        }
        h.busy = false;
        if let Some(granted) = self.untold.remove(&*name) {
            self.send(granted);
        }
        self.drain(&name);
    }

    /// The last hold is gone: forget the grant and answer.
    pub(super) fn released(&mut self, name: String, request_id: u64) {
        let queue = match self.slots.remove_entry(name.as_str()) {
            Some((name, Slot::Held(h))) => {
                h.clock.release();
                self.forget(&h);
                self.journal_dropped(name);
                h.queue
            }
            _ => VecDeque::new(),
        };
        self.send_released(request_id, &name, 0);
        self.redispatch(queue);
    }

    /// Answers a `Release` of the grant `name`: `count` holds left.
    pub(super) fn send_released(&mut self, request_id: u64, name: &str, hold_count: u32) {
        let (key, holder) = names::split(name);
        self.send(Event::Released {
            request_id,
            key: key.to_owned(),
            hold_count,
            holder: holder.to_owned(),
        });
    }

    /// Drops a grant the session can no longer count on and says so. Returns the
    /// commands that were queued behind it.
    pub(super) fn lose(&mut self, name: &str, why: Loss) -> VecDeque<Command> {
        let Some((shared_name, Slot::Held(h))) = self.slots.remove_entry(name) else {
            return VecDeque::new();
        };
        if let Some(granted) = self.untold.remove(name) {
            // Lost before its record was written: its client hears of both, in order.
            self.send(granted);
        }
        self.tell_untold_all(name);
        let reason = lost_because(why);
        let (key, holder) = names::split(name);
        log!(self, WARN, %key, %holder, fence = h.fence, %reason, "lock lost");
        self.shared.metrics.lost(why);
        self.forget(&h);
        h.clock.release();
        self.journal_dropped(shared_name);
        // If the store is reachable again, let the others in now rather than at expiry.
        self.release_in_background(key.to_owned(), h.owner.to_string(), h.ttl);
        if why == Loss::Deadline && !h.jeopardy {
            // The renewal under way went unanswered until the deadline (a store slower
            // than the TTL allows): its client hears that renewals failed, with no time
            // left, before it hears `Lost`, as for any other lapse.
            self.send(Event::Jeopardy {
                key: key.to_owned(),
                ttl_remaining: Duration::ZERO,
                holder: holder.to_owned(),
            });
        }
        self.send(Event::Lost {
            key: key.to_owned(),
            reason: reason.to_owned(),
            fence: h.fence,
            holder: holder.to_owned(),
        });
        h.queue
    }

    /// Releases a grant the session no longer wants, trying again for at most `ttl`
    /// while the store does not confirm it (`engine/release.rs`).
    pub(super) fn release_in_background(&self, key: String, owner: String, ttl: Duration) {
        crate::engine::release_in_background(&self.shared.store, key, owner, ttl);
    }

    /// A grant the session does not take on (cancelled meanwhile, or answered too late
    /// to be safe): given back in the background, and taken off the session's record
    /// if the store listed it there (`listed`).
    pub(super) fn give_back(&mut self, name: &Arc<str>, claim: &Claim, fence: u64, listed: bool) {
        self.release_in_background(claim.key.clone(), claim.owner.clone(), claim.ttl);
        if listed {
            // Told at once (the store wrote the line), then dropped like any lock.
            let _ = self.journal_granted(name, &claim.owner, claim.ttl, fence, true);
            self.journal_dropped(name.clone());
        }
    }

    /// Runs the commands queued behind a slot while it has no call under way (first
    /// writing the grant back, if the renewer found it gone meanwhile).
    pub(super) fn drain(&mut self, name: &str) {
        if let Some((name, Slot::Held(h))) = self.slots.get_key_value(name)
            && h.gone
            && !h.busy
        {
            return self.reassert(name.clone());
        }
        loop {
            let command = match self.slots.get_mut(name) {
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

    /// A grant safe until `valid_until` was taken on: the timer fires by then.
    pub(super) fn watch_deadline(&mut self, valid_until: Instant) {
        self.deadline = Some(self.deadline.map_or(valid_until, |at| at.min(valid_until)));
    }

    /// The deadline timer fired: every grant whose clock (moved on by the renewer) says
    /// it is past its safe deadline is lost, and the timer is set to the earliest of
    /// the others. The only walk over the slots: once per earliest deadline, not per
    /// event.
    pub(super) fn check_deadlines(&mut self) {
        let now = Instant::now();
        let mut lost = Vec::new();
        let mut earliest: Option<Instant> = None;
        for (name, slot) in &self.slots {
            if let Slot::Held(h) = slot {
                let valid_until = h.clock.get();
                if valid_until <= now {
                    lost.push(name.clone());
                } else {
                    earliest = Some(earliest.map_or(valid_until, |at| at.min(valid_until)));
                }
            }
        }
        self.deadline = earliest;
        for name in lost {
            let queue = self.lose(&name, Loss::Deadline);
            self.redispatch(queue);
        }
    }

    pub(super) fn on_renew_event(&mut self, event: RenewEvent) {
        let (RenewEvent::Failing(id, name)
        | RenewEvent::Restored(id, name)
        | RenewEvent::NotHeld(id, name)) = &event;
        let (id, name) = (*id, name.clone());
        // The slot may have another grant by now (released and taken again): the event
        // is about the grant it names only.
        let Some(Slot::Held(h)) = self.slots.get_mut(&*name) else {
            return;
        };
        if h.lease_id != id {
            return;
        }
        let left = h.clock.get().saturating_duration_since(Instant::now());
        let (key, holder) = names::split(&name);
        let (key, holder) = (key.to_owned(), holder.to_owned());
        match event {
            RenewEvent::Failing(..) if !h.jeopardy => {
                h.jeopardy = true;
                self.send(Event::Jeopardy {
                    key,
                    ttl_remaining: left,
                    holder,
                });
            }
            RenewEvent::Restored(..) if h.jeopardy => {
                h.jeopardy = false;
                self.send(Event::Restored {
                    key,
                    ttl: left,
                    holder,
                });
            }
            // Gone while the store holds off new grants after losing its data: nobody
            // else can have it, so it is written back (`reassert.rs`).
            RenewEvent::NotHeld(..) if self.shared.store.restarted() => match h.busy {
                // The call under way goes first; then it is written back.
                true => h.gone = true,
                false => self.reassert(name),
            },
            RenewEvent::NotHeld(..) => {
                let queue = self.lose(&name, Loss::NotHeld);
                self.redispatch(queue);
            }
            _ => {}
        }
    }
}

/// The reason a `Lost` event gives, for each way of losing a lock.
pub(super) fn lost_because(why: Loss) -> &'static str {
    match why {
        Loss::Deadline => "renewal not confirmed before the safe deadline",
        Loss::NotHeld => "the store no longer holds the lock",
        Loss::Shutdown => "the sidecar is shutting down",
    }
}

/// A grant leaves the session: gauges and the hold-time histogram.
pub(super) fn forget(metrics: &crate::metrics::Metrics, held: &Held) {
    metrics.locks_held.dec();
    metrics
        .hold_time
        .observe(held.granted_at.elapsed().as_secs_f64());
}
