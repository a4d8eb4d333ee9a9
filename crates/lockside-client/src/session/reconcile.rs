//! A resume was answered: its greeting (a `Granted` with request_id 0, or a `Lost`,
//! per grant of the session's record, each with its holder) squared with what is held
//! and asked here.
//!
//! A holder's key comes back with its hold count in the store. A release that was not
//! answered may have been applied before the sidecar died, so as many of those as the
//! count says were are taken as answered, and the others are sent again. Holds the
//! store has and nobody here knows of (a grant whose answer was lost, a lock already
//! reported lost) are given back. A key that did not come back, or came back under
//! another token, is lost, and the releases and proclaims of its grants fail.

use std::collections::HashMap;

use lockside_proto::lease_request::Command;
use lockside_proto::lease_response::Event;
use lockside_proto::{self as proto, Granted};

use super::reader::forget;
use super::{Kind, Session, SlotKey, State};
use crate::lock::LockState;
use crate::{ClientError, releasing};

impl Session {
    /// Squares `greeting` with the session's grants and requests; returns what to
    /// send on the new stream, in order, and the keys of the locks lost.
    pub(super) fn reconcile(
        &self,
        state: &mut State,
        greeting: Vec<Event>,
    ) -> (Vec<Command>, Vec<String>) {
        let mut granted: HashMap<SlotKey, Granted> = HashMap::new();
        let mut lost: HashMap<SlotKey, String> = HashMap::new();
        for event in greeting {
            match event {
                Event::Granted(g) => {
                    granted.insert((g.holder.clone(), g.key.clone()), g);
                }
                Event::Lost(l) => {
                    lost.insert((l.holder, l.key), l.reason);
                }
                _ => {}
            }
        }
        let mut out = Vec::new();
        let mut gone = Vec::new();
        let give_back = |state: &mut State, out: &mut Vec<Command>, slot: &SlotKey, holds: u32| {
            for _ in 0..holds {
                let request_id = state.id();
                out.push(Command::Release(proto::Release {
                    request_id,
                    key: slot.1.clone(),
                    holder: slot.0.clone(),
                }));
            }
        };
        let mut releases: HashMap<SlotKey, Vec<u64>> = HashMap::new();
        for (rid, pending) in &state.pending {
            if matches!(pending.kind, Kind::Release(_)) {
                let slot = (pending.holder.clone(), pending.key.clone());
                releases.entry(slot).or_default().push(*rid);
            }
        }
        let slot_keys: Vec<SlotKey> = state.slots.keys().cloned().collect();
        for slot_key in slot_keys {
            let (count, token) = match state.slots.get(&slot_key) {
                Some(slot) => (
                    slot.cells.len(),
                    slot.cells.first().map(|c| c.fencing_token()),
                ),
                None => continue,
            };
            let back = granted.remove(&slot_key);
            let lose = |state: &mut State, gone: &mut Vec<String>, why: String| {
                if let Some(slot) = state.slots.remove(&slot_key) {
                    for cell in slot.cells {
                        if cell.set(LockState::Lost(why.clone())) {
                            if !cell.released() {
                                gone.push(cell.key().to_owned());
                            }
                            self.tell(&cell);
                        }
                        Session::name_done(state, &cell);
                    }
                }
            };
            let back = match back {
                Some(back) if Some(back.fencing_token) == token => back,
                back => {
                    let reason = lost
                        .get(&slot_key)
                        .cloned()
                        .unwrap_or_else(|| "the resumed session did not list it".into());
                    lose(
                        state,
                        &mut gone,
                        format!("lost while the sidecar was away: {reason}"),
                    );
                    if let Some(back) = back {
                        give_back(state, &mut out, &slot_key, back.hold_count);
                    }
                    continue;
                }
            };
            let unanswered = releases.remove(&slot_key).unwrap_or_default();
            let applied = unanswered
                .len()
                .min(count.saturating_sub(back.hold_count as usize));
            for rid in &unanswered[..applied] {
                if let Some(pending) = state.pending.remove(rid)
                    && let Kind::Release(cell) = pending.kind
                {
                    releasing::remove(&pending.key, self.number, *rid);
                    forget(state, &cell);
                }
            }
            let surplus = back.hold_count as i64 + applied as i64 - count as i64;
            if surplus < 0 {
                lose(
                    state,
                    &mut gone,
                    "the resumed session holds the key fewer times than granted".into(),
                );
                give_back(state, &mut out, &slot_key, back.hold_count);
                continue;
            }
            give_back(state, &mut out, &slot_key, surplus as u32);
        }
        for (slot_key, back) in granted {
            give_back(state, &mut out, &slot_key, back.hold_count);
        }
        // Unanswered releases and proclaims go again, in their order; those of keys
        // that did not come back fail now (their locks are lost).
        let rids: Vec<u64> = state.pending.keys().copied().collect();
        for rid in rids {
            let Some(pending) = state.pending.get(&rid) else {
                continue;
            };
            let slot = (pending.holder.clone(), pending.key.clone());
            let acquire = matches!(pending.kind, Kind::Acquire);
            if !acquire && state.slots.contains_key(&slot) {
                if let Some(command) = pending.request.command.clone() {
                    out.push(command);
                }
                continue;
            }
            let Some(pending) = state.pending.remove(&rid) else {
                continue;
            };
            if let Kind::Release(_) = pending.kind {
                releasing::remove(&pending.key, self.number, rid);
            }
            if let Some(reply) = pending.reply {
                let why = if acquire {
                    "the session was resumed: ask again"
                } else {
                    "the lock was lost while the sidecar was away"
                };
                let _ = reply.send(Err(ClientError::Unavailable(why.into())));
            }
        }
        (out, gone)
    }
}

#[cfg(test)]
mod tests {
    //! The cases a sidecar kill cannot make on demand (the Python package tested them
    //! against its own session before the core; the clients' suites run the rest
    //! against real sidecars).
    use std::collections::{BTreeMap, HashMap};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use lockside_proto::lease_request::Command;
    use lockside_proto::lease_response::Event;
    use lockside_proto::lock_service_client::LockServiceClient;
    use lockside_proto::{self as proto, LeaseRequest};
    use tokio::sync::{Notify, mpsc};

    use crate::connect::Bearer;
    use crate::holders::Holders;
    use crate::lock::{LockCell, LockState};
    use crate::session::{Kind, Pending, Phase, Session, Settings, State};

    fn session() -> Session {
        let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:1").connect_lazy();
        let bearer = Bearer {
            token: None,
            client_name: None,
        };
        Session {
            number: u64::MAX,
            grpc: LockServiceClient::with_interceptor(channel, bearer),
            settings: Settings {
                resume: true,
                listener: None,
            },
            state: Mutex::new(State {
                phase: Phase::Open,
                session_id: "s".into(),
                token: "t".into(),
                default_ttl: Duration::from_secs(10),
                tx: mpsc::unbounded_channel().0,
                next_id: 100,
                pending: BTreeMap::new(),
                slots: HashMap::new(),
                holders: Holders::default(),
                closing: false,
            }),
            settled: Notify::new(),
        }
    }

    fn granted(key: &str, token: u64, holds: u32) -> proto::Granted {
        proto::Granted {
            key: key.into(),
            fencing_token: token,
            hold_count: holds,
            ..Default::default()
        }
    }

    /// A grant of `key` held here (hold count `holds`).
    fn hold(state: &mut State, key: &str, token: u64, holds: u32) -> Arc<LockCell> {
        let cell = LockCell::new(
            key.into(),
            String::new(),
            &granted(key, token, holds),
            "s".into(),
            Duration::from_secs(10),
        );
        let slot = state.slots.entry((String::new(), key.into())).or_default();
        slot.cells.push(cell.clone());
        cell
    }

    /// A release of `cell` sent and not answered.
    fn releasing(state: &mut State, cell: &Arc<LockCell>) -> u64 {
        let rid = state.id();
        cell.mark_released();
        let command = Command::Release(proto::Release {
            request_id: rid,
            key: cell.key().into(),
            holder: String::new(),
        });
        state.pending.insert(
            rid,
            Pending {
                kind: Kind::Release(cell.clone()),
                key: cell.key().into(),
                holder: String::new(),
                request: LeaseRequest {
                    command: Some(command),
                },
                reply: None,
                ttl_asked: None,
            },
        );
        rid
    }

    fn releases(out: &[Command]) -> Vec<String> {
        out.iter()
            .filter_map(|c| match c {
                Command::Release(r) => Some(r.key.clone()),
                _ => None,
            })
            .collect()
    }

    #[tokio::test]
    async fn a_release_the_dead_sidecar_applied_counts_as_answered() {
        let s = session();
        let mut state = s.lock();
        let outer = hold(&mut state, "k", 7, 1);
        let inner = hold(&mut state, "k", 7, 2);
        let rid = releasing(&mut state, &inner);
        let (out, lost) = s.reconcile(&mut state, vec![Event::Granted(granted("k", 7, 1))]);
        assert!(out.is_empty() && lost.is_empty(), "{out:?} {lost:?}");
        assert!(!state.pending.contains_key(&rid), "taken as answered");
        assert_eq!(state.slots[&(String::new(), "k".into())].cells.len(), 1);
        assert_eq!(outer.state(), LockState::Held);
    }

    #[tokio::test]
    async fn a_release_the_dead_sidecar_did_not_apply_is_sent_again() {
        let s = session();
        let mut state = s.lock();
        hold(&mut state, "k", 7, 1);
        let inner = hold(&mut state, "k", 7, 2);
        let rid = releasing(&mut state, &inner);
        let (out, _) = s.reconcile(&mut state, vec![Event::Granted(granted("k", 7, 2))]);
        assert_eq!(releases(&out), ["k"]);
        assert!(
            matches!(&out[0], Command::Release(r) if r.request_id == rid),
            "the same request"
        );
    }

    #[tokio::test]
    async fn holds_nobody_here_knows_of_are_given_back() {
        let s = session();
        let mut state = s.lock();
        hold(&mut state, "k", 7, 1);
        // The store holds it twice (a grant whose answer was lost), and a key this
        // session never heard of.
        let (out, lost) = s.reconcile(
            &mut state,
            vec![
                Event::Granted(granted("k", 7, 2)),
                Event::Granted(granted("x", 9, 1)),
            ],
        );
        let mut given = releases(&out);
        given.sort();
        assert_eq!(given, ["k", "x"]);
        assert!(lost.is_empty());
    }

    #[tokio::test]
    async fn a_key_back_with_another_token_or_not_at_all_is_lost() {
        let s = session();
        let mut state = s.lock();
        let moved = hold(&mut state, "k", 7, 1);
        let gone = hold(&mut state, "g", 3, 1);
        let (out, lost) = s.reconcile(&mut state, vec![Event::Granted(granted("k", 8, 1))]);
        assert_eq!(
            releases(&out),
            ["k"],
            "the other token's hold is given back"
        );
        let mut lost = lost;
        lost.sort();
        assert_eq!(lost, ["g", "k"]);
        assert!(matches!(moved.state(), LockState::Lost(_)));
        assert!(matches!(gone.state(), LockState::Lost(why) if why.contains("did not list it")));
        assert!(state.slots.is_empty());
    }
}
