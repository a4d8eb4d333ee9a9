//! Commands on a key the holder holds: `Release` and `Proclaim`. Behind a pending
//! acquire or a call under way for the key, each waits its turn.

use std::time::Duration;

use super::{Done, Session, Slot};
use crate::engine::{Command, RejectCode};
use crate::proto::limits::MAX_VALUE_BYTES;
use crate::store::names;

impl Session {
    pub(super) fn release(&mut self, request_id: u64, key: String, holder: String) {
        // The key's own string for the session itself: a release copies nothing.
        let name = names::into_name(key, &holder);
        match self.slots.get_mut(name.as_str()) {
            Some(Slot::Acquiring(a)) => {
                // A Release of a key the holder waits for cancels the wait; the pending
                // Acquire is answered NotAcquired CANCELLED, the Release not at all.
                a.cancelled = true;
                a.cancel.cancel();
            }
            Some(Slot::Held(h)) if h.busy => {
                self.pending.insert(request_id);
                h.queue.push_back(Command::Release {
                    request_id,
                    key: names::key_of(&name).to_owned(),
                    holder,
                });
                // Busy with an AcquireAll that asked for it again: that request ends.
                self.cancel_all_for(&name);
            }
            Some(Slot::Held(h)) => {
                h.busy = true;
                self.pending.insert(request_id);
                let (store, turns) = (self.shared.store.clone(), self.shared.store_calls.clone());
                let (owner, lease_id, fence) = (h.owner.clone(), h.lease_id, h.fence);
                // The holds left, as the session counts them (see the reentrant hold).
                let left = h.count.saturating_sub(1);
                self.ops.push(Box::pin(async move {
                    let _turn = turns.acquire().await;
                    let key = names::key_of(&name);
                    let result = if left == 0 {
                        // The grant goes: with its token, Redis writes that in one step.
                        store
                            .release_grant(key, &owner, fence, Duration::ZERO)
                            .await
                    } else {
                        store.release(key, &owner, left, Duration::ZERO).await
                    };
                    Done::Release {
                        name,
                        lease_id,
                        request_id,
                        result,
                    }
                }));
            }
            None => self.reject(request_id, &name, RejectCode::FailedPrecondition, NOT_HELD),
        }
    }

    /// Replaces the value of a held grant. Behind a pending acquire or a call under
    /// way for the key, it waits its turn, so it applies to the grant that acquire
    /// brings.
    pub(super) fn proclaim(
        &mut self,
        request_id: u64,
        key: String,
        value: Vec<u8>,
        holder: String,
    ) {
        let name = names::name(&key, &holder).into_owned();
        if let Err((code, message)) = check_value(&value) {
            return self.reject(request_id, &name, code, message);
        }
        let command = || Command::Proclaim {
            request_id,
            key: key.clone(),
            value: value.clone(),
            holder: holder.clone(),
        };
        match self.slots.get_mut(name.as_str()) {
            Some(Slot::Acquiring(a)) => {
                self.pending.insert(request_id);
                a.queue.push_back(command());
            }
            Some(Slot::Held(h)) if h.busy => {
                self.pending.insert(request_id);
                h.queue.push_back(command());
            }
            Some(Slot::Held(h)) => {
                h.busy = true;
                h.value = value.clone().into_boxed_slice();
                self.pending.insert(request_id);
                let (store, turns) = (self.shared.store.clone(), self.shared.store_calls.clone());
                let (owner, lease_id) = (h.owner.clone(), h.lease_id);
                self.ops.push(Box::pin(async move {
                    let _turn = turns.acquire().await;
                    let result = store.proclaim(names::key_of(&name), &owner, &value).await;
                    Done::Proclaim {
                        name,
                        lease_id,
                        request_id,
                        result,
                    }
                }));
            }
            None => self.reject(request_id, &name, RejectCode::FailedPrecondition, NOT_HELD),
        }
    }
}

/// The refusal of a `Release` or `Proclaim` of a key its holder does not hold.
pub(super) const NOT_HELD: &str = "this holder does not hold this key";

/// Checks a holder's value against the contract's limit.
pub(super) fn check_value(value: &[u8]) -> Result<(), (RejectCode, String)> {
    if value.len() > MAX_VALUE_BYTES {
        return Err((
            RejectCode::InvalidArgument,
            format!(
                "value is {} bytes long; at most {MAX_VALUE_BYTES} are allowed",
                value.len()
            ),
        ));
    }
    Ok(())
}
