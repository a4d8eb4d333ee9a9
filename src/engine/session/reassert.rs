//! A grant the store lost with its data, written back (`store/redis/restarts/`): when
//! the renewer finds a grant gone while the store holds off new grants after losing its
//! data, nobody else can have been granted the key since, so the session writes its
//! grant back (same owner, hold count and token) instead of telling its client `Lost`.
//! Its validity then counts from that write, as from a renewal (and a client told
//! `Jeopardy` while the store was down hears `Restored`).

use std::sync::Arc;

use tokio::time::Instant;

use super::{Done, Session, Slot};
use crate::engine::Event;
use crate::engine::renewer::Renewable;
use crate::metrics::Loss;
use crate::store::{Claim, StoreError, drift_margin, names};

impl Session {
    /// Writes back `name`'s grant, which the renewer found gone during a hold-off; not
    /// a grant past its safe deadline (it is lost: its client may already be told, and
    /// the store may have let it go before the loss), nor one the store's hold-off does
    /// not cover (the store's own script checks that too).
    pub(super) fn reassert(&mut self, name: Arc<str>) {
        let Some(Slot::Held(h)) = self.slots.get_mut(&*name) else {
            return;
        };
        if h.clock.get() <= Instant::now() {
            let queue = self.lose(&name, Loss::Deadline);
            return self.redispatch(queue);
        }
        (h.busy, h.gone) = (true, false);
        let (key, holder) = names::split(&name);
        let claim = Claim {
            key: key.to_owned(),
            owner: h.owner.to_string(),
            ttl: h.ttl,
            wait: false,
            session_id: self.id.clone(),
            client_name: self.client_name.clone(),
            holder: holder.to_owned(),
            sharing: h.sharing,
            limit: h.limit,
            fair: false,
            value: h.value.to_vec(),
            ticket: None,
        };
        let (count, fence, lease_id) = (h.count, h.fence, h.lease_id);
        let (store, turns) = (self.shared.store.clone(), self.shared.store_calls.clone());
        self.ops.push(Box::pin(async move {
            let _turn = turns.acquire().await;
            let sent_at = Instant::now();
            let result = store.reassert(&claim, count, fence).await;
            Done::Reassert {
                name,
                lease_id,
                sent_at,
                result,
            }
        }));
    }

    /// The store's answer: held again (renewed from now on as before), or lost. A call
    /// that failed is made again while the hold-off and the grant's validity last.
    pub(super) fn reasserted(
        &mut self,
        name: Arc<str>,
        lease_id: u64,
        sent_at: Instant,
        result: Result<bool, StoreError>,
    ) {
        let drift = self.shared.config.clock_drift;
        let Some(Slot::Held(h)) = self.slots.get_mut(&*name) else {
            return;
        };
        if h.lease_id != lease_id {
            return;
        }
        h.busy = false;
        let (key, holder) = names::split(&name);
        match result {
            Ok(true) => {
                h.clock.extend(sent_at + h.ttl - drift_margin(h.ttl, drift));
                self.shared.renewer.add(Renewable {
                    id: lease_id,
                    name: name.clone(),
                    owner: h.owner.clone(),
                    ttl: h.ttl,
                    confirmed_at: sent_at,
                    clock: h.clock.clone(),
                    events: self.notes_tx.clone(),
                });
                log!(self, INFO, %key, %holder, fence = h.fence, "written back after the store lost its data");
                if h.jeopardy {
                    // Renewals failed while the store was down: confirmed again now.
                    h.jeopardy = false;
                    let ttl = h.clock.get().saturating_duration_since(Instant::now());
                    let (key, holder) = (key.to_owned(), holder.to_owned());
                    self.send(Event::Restored { key, ttl, holder });
                }
                self.drain(&name);
            }
            Err(e) if self.shared.store.restarted() && h.clock.get() > Instant::now() => {
                log!(self, DEBUG, %key, %holder, error = %e, "writing back a grant failed; trying again");
                self.reassert(name);
            }
            _ => {
                let queue = self.lose(&name, Loss::NotHeld);
                self.redispatch(queue);
            }
        }
    }
}
