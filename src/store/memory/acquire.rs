//! An acquire on the embedded store: admitted, queued or granted, with the rules of
//! `lua/acquire.lua` (lock-delay, fair heads, tickets of several keys at once).

use super::MemoryStore;
use super::lock::{Admit, Holder, busy, register};
use crate::store::{Acquired, Claim, Sharing, next_fence, unix_ms};

impl MemoryStore {
    pub(super) fn acquire_now(&self, claim: &Claim) -> Acquired {
        let name = claim.waiter();
        let answer = self.with_new_lock(&claim.key, |lock, now| {
            let admit = lock.admit(claim.sharing, claim.limit);
            if let Admit::Conflict(limit) = admit {
                return (Acquired::Conflict { limit }, false);
            }
            let go = !matches!(admit, Admit::Busy)
                && lock.delay_until.is_none()
                && (!claim.fair || lock.first_in_line(&name, claim.sharing, claim.limit));
            if !go {
                return (busy(lock, claim, name, now), false);
            }
            lock.fence = next_fence(lock.fence, unix_ms());
            if let Admit::Free = admit {
                lock.sharing = Some(claim.sharing);
                lock.limit = claim.limit;
            }
            if claim.wait && claim.ticket.is_some() {
                // One key of several: its place is kept while the request may still
                // give it back (see `lua/acquire.lua`).
                register(lock, claim, &name, now);
            } else {
                lock.waiters.remove(&name);
                lock.queue.retain(|(_, n)| *n != name);
            }
            lock.holders.push(Holder {
                owner: claim.owner.clone(),
                expires: now + claim.ttl,
                count: 1,
                fence: lock.fence,
                session_id: claim.session_id.clone(),
                client_name: claim.client_name.clone(),
                holder: claim.holder.clone(),
                value: claim.value.clone(),
            });
            let room = (lock.holders.len() as u32) < claim.limit;
            // Room is left for more readers or permits: pass the wake on.
            let woke = (claim.sharing == Sharing::Shared || (claim.limit > 1 && room))
                && lock.wake(&claim.key, &self.notices);
            (Acquired::Granted { fence: lock.fence }, woke)
        });
        match answer {
            (Acquired::Granted { fence }, woke) => {
                if !woke {
                    self.changed(&claim.key);
                }
                Acquired::Granted { fence }
            }
            (other, _) => other,
        }
    }
}
