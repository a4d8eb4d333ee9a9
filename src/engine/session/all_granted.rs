//! An `AcquireAll` granted: its new grants become locks of their own, and its answer,
//! `GrantedAll`, is told once the session's record names every new grant (a sidecar
//! that dies before that leaves nothing a resume could not account for).

use std::sync::Arc;

use tokio::time::Instant;

use super::all::AllPending;
use super::{Done, Session, Slot};
use crate::engine::{Event, GrantedKey};
use crate::store::Claim;

impl Session {
    /// Takes on every new grant as a lock of its own, counts the holds of the keys held
    /// again, and tells `GrantedAll` once the session's record names the new grants.
    pub(super) fn granted_all(
        &mut self,
        request_id: u64,
        pending: &AllPending,
        claims: &[(usize, Claim)],
        taken: Vec<(usize, u64, Instant)>,
        held: Vec<(usize, u32)>,
    ) {
        let drift = self.shared.config.clock_drift;
        let mut grants: Vec<Option<GrantedKey>> = vec![None; pending.keys.len()];
        let mut recording = Vec::new();
        let mut leases = Vec::new();
        for (at, fence, sent_at) in taken {
            let Some((_, claim)) = claims.iter().find(|(a, _)| *a == at) else {
                continue;
            };
            let valid_until = sent_at + claim.ttl - crate::store::drift_margin(claim.ttl, drift);
            let name = pending.names[at].clone();
            let (lease_id, written) = self.take_on(
                name.clone(),
                claim.clone(),
                fence,
                (sent_at, valid_until),
                false,
            );
            if let Some(written) = written {
                recording.push(written);
            }
            leases.push((name, lease_id));
            grants[at] = Some(GrantedKey {
                key: pending.keys[at].clone(),
                fence,
                ttl: valid_until.saturating_duration_since(Instant::now()),
                hold_count: 1,
            });
        }
        for (at, count) in held {
            if let Some(Slot::Held(h)) = self.slots.get_mut(&*pending.names[at]) {
                h.count = count;
                grants[at] = Some(GrantedKey {
                    key: pending.keys[at].clone(),
                    fence: h.fence,
                    ttl: h.clock.get().saturating_duration_since(Instant::now()),
                    hold_count: count,
                });
            }
        }
        let event = Event::GrantedAll {
            request_id,
            grants: grants.into_iter().flatten().collect(),
            holder: pending.holder.clone(),
        };
        if recording.is_empty() {
            return self.send(event);
        }
        for (name, _) in &leases {
            if let Some(Slot::Held(h)) = self.slots.get_mut(&**name) {
                h.busy = true;
            }
            self.untold_all.insert(name.clone(), request_id);
        }
        self.untold_events.insert(request_id, event);
        self.ops.push(Box::pin(async move {
            for written in recording {
                let _ = written.await;
            }
            Done::RecordedAll { request_id, leases }
        }));
    }

    /// Every new grant of `request_id` is in the session's record: `GrantedAll` now.
    pub(super) fn recorded_all(&mut self, request_id: u64, leases: Vec<(Arc<str>, u64)>) {
        for (name, lease_id) in &leases {
            self.untold_all.remove(&**name);
            if let Some(Slot::Held(h)) = self.slots.get_mut(&**name)
                && h.lease_id == *lease_id
            {
                h.busy = false;
            }
        }
        if let Some(event) = self.untold_events.remove(&request_id) {
            self.send(event);
        }
        for (name, _) in &leases {
            self.drain(name);
        }
    }

    /// A grant of an `AcquireAll` not told yet is lost: its `GrantedAll` goes first.
    pub(super) fn tell_untold_all(&mut self, name: &str) {
        if let Some(request_id) = self.untold_all.remove(name)
            && let Some(event) = self.untold_events.remove(&request_id)
        {
            self.untold_all.retain(|_, id| *id != request_id);
            self.send(event);
        }
    }
}
