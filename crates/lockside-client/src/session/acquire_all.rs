//! Taking several keys at once (DESIGN.md, "Several keys at once"): an `AcquireAll` on
//! the stream and its one answer, `GrantedAll` (a grant per key, in the order asked),
//! `NotAcquired` or `Rejected`. Once granted, each key is a grant of its own in the
//! session (its slot, its states, its release), exactly as if taken alone; the holder's
//! name counts one use per key. A caller that stops waiting gives the whole request
//! up: a `Release` of one of its keys cancels it while it waits, and the grants that
//! come all the same are given back; the holder's name stays in use until the answer
//! comes (the sidecar refuses an `AcquireAll` while a request of its holder for one of
//! its keys is under way, so a name must not be given again before).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use lockside_proto::lease_request::Command;
use lockside_proto::lease_response::Event;
use lockside_proto::{self as proto, LeaseRequest};
use tokio::sync::oneshot;

use super::acquire::{answer_within, refusal};
use super::{Answer, Kind, Pending, Phase, Session, State};
use crate::limits::MAX_WAIT;
use crate::lock::LockCell;
use crate::{ClientError, LockOptions, releasing};

/// The keys an `AcquireAll` request asked for (empty for any other request).
fn keys_of(request: &LeaseRequest) -> &[String] {
    match &request.command {
        Some(Command::AcquireAll(all)) => &all.keys,
        _ => &[],
    }
}

impl Session {
    /// Takes every key of `keys` for `holder` (`None`: a holder of its own), all or
    /// none; the grants in the order asked. `Err(None)`: the session ended before
    /// anything was sent (ask a new one).
    pub(crate) async fn acquire_all(
        self: &Arc<Self>,
        keys: &[String],
        options: &LockOptions,
        holder: Option<&str>,
    ) -> Result<Vec<Arc<LockCell>>, Option<ClientError>> {
        let holder = {
            let mut state = self.lock();
            match holder {
                Some(name) => {
                    state.holders.again(name);
                    name.to_owned()
                }
                None => state.holders.take(),
            }
        };
        let mut asking = AskingAll {
            session: self,
            holder,
            rid: None,
            answer: None,
        };
        let wait = options
            .wait
            .map(|w| w.min(MAX_WAIT + Duration::from_secs(1)));
        let duration = |d: Duration| prost_types::Duration::try_from(d).ok();
        loop {
            if self.ready().await.is_err() {
                return Err(None);
            }
            // Unlike one Acquire, an AcquireAll is not queued behind a request of its
            // holder for one of its keys (the sidecar refuses it while one is under
            // way): wait for every release of these keys, this holder's included.
            for key in keys {
                releasing::settled(key, None).await;
            }
            let mut state = self.lock();
            if state.phase != Phase::Open {
                continue;
            }
            let rid = state.id();
            let command = Command::AcquireAll(proto::AcquireAll {
                request_id: rid,
                keys: keys.to_vec(),
                wait_timeout: wait.filter(|w| !w.is_zero()).and_then(duration),
                mode: if options.shared {
                    proto::LockMode::Shared
                } else {
                    proto::LockMode::Exclusive
                } as i32,
                fair: options.fair,
                ttl: options.ttl.and_then(duration),
                holder: asking.holder.clone(),
                traceparent: String::new(),
            });
            let (reply, answer) = oneshot::channel();
            // An acquire as far as a broken stream goes: the sidecar does not resume
            // waits, so its caller hears of the break and asks again.
            state.pending.insert(
                rid,
                Pending {
                    kind: Kind::Acquire,
                    key: keys.first().cloned().unwrap_or_default(),
                    holder: asking.holder.clone(),
                    request: LeaseRequest {
                        command: Some(command.clone()),
                    },
                    reply: Some(reply),
                    ttl_asked: options.ttl,
                },
            );
            state.send(command);
            asking.rid = Some(rid);
            asking.answer = Some(answer);
            break;
        }
        let answer = asking.answer.as_mut().expect("set above");
        let answer = answer_within(answer, wait).await;
        match answer.map_err(Some)? {
            Answer::GrantedAll(cells) => {
                // The grants keep the holder's name in use now (one use each).
                asking.rid = None;
                asking.answer = None;
                asking.holder.clear();
                Ok(cells)
            }
            Answer::Other(event @ (Event::NotAcquired(_) | Event::Rejected(_))) => {
                asking.rid = None;
                Err(Some(refusal(event, wait)))
            }
            Answer::Granted(_) => Err(Some(ClientError::Unavailable(
                "protocol error: a Granted answered an AcquireAll".into(),
            ))),
            Answer::Other(other) => Err(Some(ClientError::Unavailable(format!(
                "protocol error: {other:?} answered an AcquireAll"
            )))),
        }
    }

    /// The reader's `GrantedAll`: a grant per key of the request, each in its slot as
    /// a grant of its own, handed to the caller; given back at once when nobody
    /// waits for them any more or the answer does not match the request.
    pub(super) fn granted_all(&self, state: &mut State, all: proto::GrantedAll) {
        let Some(pending) = state.pending.remove(&all.request_id) else {
            return;
        };
        let keys = keys_of(&pending.request).to_vec();
        let ttl_asked = pending.ttl_asked.unwrap_or(state.default_ttl);
        let mut cells = Vec::with_capacity(all.grants.len());
        for (at, grant) in all.grants.iter().enumerate() {
            let key = match keys.get(at) {
                Some(key) if grant.key.is_empty() => key.clone(),
                _ => grant.key.clone(),
            };
            let cell = LockCell::new(
                key.clone(),
                pending.holder.clone(),
                grant,
                state.session_id.clone(),
                ttl_asked,
            );
            state
                .slots
                .entry((pending.holder.clone(), key))
                .or_default()
                .cells
                .push(cell.clone());
            cells.push(cell);
        }
        let complete =
            cells.len() == keys.len() && cells.iter().zip(&keys).all(|(c, k)| c.key() == k);
        let mut taken = false;
        if pending.reply.is_none() {
            // Given up and kept for this answer: the request's use of the name ends.
            state.holders.done(&pending.holder);
        }
        if let Some(reply) = pending.reply {
            if complete {
                // The request took one use of the holder's name; each grant needs one.
                for _ in 1..cells.len() {
                    state.holders.again(&pending.holder);
                }
                taken = reply.send(Ok(Answer::GrantedAll(cells.clone()))).is_ok();
                if !taken {
                    for _ in 1..cells.len() {
                        state.holders.done(&pending.holder);
                    }
                }
            } else {
                let _ = reply.send(Err(ClientError::Unavailable(format!(
                    "protocol error: a GrantedAll of {} grants answered an AcquireAll of {} keys",
                    cells.len(),
                    keys.len()
                ))));
            }
        }
        if !taken {
            // Nobody takes these grants: give each back (the holder's name is handed
            // back by the caller that gave up or failed).
            for cell in &cells {
                cell.mark_released();
                cell.name_returned.store(true, Ordering::Relaxed);
                self.send_release(state, cell);
            }
        }
    }

    /// The caller gave up on `AcquireAll` `rid`; true when the request stays pending
    /// for its answer, which then hands the holder's name back (`given_up`). The
    /// answer may be on its way already: grants that come are given back
    /// (`granted_all`). A `Release` of one key the holder does not hold cancels the
    /// request while it waits; should the grants have crossed it, it gives that key
    /// back (and the one given back again is refused, quietly). A holder that holds
    /// every key already is answered at once: nothing to cancel.
    fn abandon_all(&self, rid: u64) -> bool {
        let mut state = self.lock();
        let Some(pending) = state.pending.get_mut(&rid) else {
            return false;
        };
        pending.reply = None;
        let holder = pending.holder.clone();
        let keys = keys_of(&pending.request).to_vec();
        if state.phase != Phase::Open {
            state.pending.remove(&rid);
            return false;
        }
        let cancel = keys
            .into_iter()
            .find(|k| !state.slots.contains_key(&(holder.clone(), k.clone())));
        if let Some(key) = cancel {
            let id = state.id();
            state.send(Command::Release(proto::Release {
                request_id: id,
                key,
                holder,
            }));
        }
        true
    }
}

/// The answer (`NotAcquired`, `Rejected`) of a request nobody waits for any more: an
/// `AcquireAll` given up kept its holder's name in use until now.
pub(super) fn given_up(state: &mut State, pending: &Pending) {
    if !keys_of(&pending.request).is_empty() {
        state.holders.done(&pending.holder);
    }
}

/// An `AcquireAll` under way: when it ends without grants for its caller (failed, or
/// dropped by a caller that stopped waiting), its holder's name is handed back and the
/// request given up (`Session::abandon_all`); grants that came meanwhile go back.
struct AskingAll<'a> {
    session: &'a Session,
    /// Empty once the grants keep the name.
    holder: String,
    /// The request, while it may still be answered.
    rid: Option<u64>,
    answer: Option<oneshot::Receiver<Result<Answer, ClientError>>>,
}

impl Drop for AskingAll<'_> {
    fn drop(&mut self) {
        if let Some(mut answer) = self.answer.take() {
            // No answer can come after this: the reader gives back grants it cannot
            // hand over.
            answer.close();
            if let Ok(Ok(Answer::GrantedAll(cells))) = answer.try_recv() {
                let mut state = self.session.lock();
                for cell in &cells {
                    cell.mark_released();
                    // One use of the name per grant, the request's own among them.
                    Session::name_done(&mut state, cell);
                    self.session.send_release(&mut state, cell);
                }
                self.holder.clear();
            } else if let Some(rid) = self.rid
                && self.session.abandon_all(rid)
            {
                // Its answer hands the name back.
                self.holder.clear();
            }
        }
        if !self.holder.is_empty() {
            self.session.lock().holders.done(&self.holder);
        }
    }
}
