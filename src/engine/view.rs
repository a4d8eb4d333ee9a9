//! What the engine shows of one lock (`Describe` and `Watch`): the store's state in
//! the engine's own terms, so the API never sees a store type.

use std::time::Duration;

use super::Mode;
use crate::store::{KeyState, Sharing};

/// One lock as a client may see it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyView {
    /// The holders' mode; `None` when nobody holds the key.
    pub mode: Option<Mode>,
    /// The holders' limit: 1 for a lock, N for a semaphore, 0 when nobody holds it.
    pub limit: u32,
    /// The current holders.
    pub holders: Vec<HolderView>,
    /// Live waiter registrations, fair or not, across sidecars.
    pub waiters: u32,
    /// Fair waiters, next in line first.
    pub queue: Vec<QueuedView>,
    /// The last fencing token issued for the key (0 if none).
    pub fence: u64,
}

/// One holder of a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderView {
    /// The holder's public session id.
    pub session_id: String,
    /// The name the holder's client gave.
    pub client_name: String,
    /// The holder inside its session ("" for the session itself).
    pub holder: String,
    /// How many times the holder holds the key.
    pub hold_count: u32,
    /// Time left before the store lets the grant go unless it is renewed.
    pub ttl_remaining: Duration,
    /// The grant's fencing token.
    pub fence: u64,
    /// The holder's value (empty for none).
    pub value: Vec<u8>,
}

impl KeyView {
    /// Whether `other` is the same state of the key for a watcher: everything but the
    /// time left on each grant, which changes with every reading and every renewal.
    pub fn same_state(&self, other: &Self) -> bool {
        let holders = self.holders.len() == other.holders.len()
            && self.holders.iter().zip(&other.holders).all(|(a, b)| {
                (a.session_id == b.session_id)
                    && (a.client_name == b.client_name)
                    && (a.holder == b.holder)
                    && (a.hold_count == b.hold_count)
                    && (a.fence == b.fence)
                    && (a.value == b.value)
            });
        holders
            && (self.mode, self.limit, self.waiters, self.fence)
                == (other.mode, other.limit, other.waiters, other.fence)
            && self.queue == other.queue
    }

    /// The earliest time left on a grant, if the key has holders: when the key
    /// changes by itself unless its holders are renewed.
    pub fn first_expiry(&self) -> Option<Duration> {
        self.holders.iter().map(|h| h.ttl_remaining).min()
    }
}

/// One fair waiter of a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuedView {
    /// The waiter's public session id.
    pub session_id: String,
    /// The name the waiter's client gave.
    pub client_name: String,
    /// The waiter's holder inside its session.
    pub holder: String,
    /// The mode it waits for.
    pub mode: Mode,
}

fn mode(sharing: Sharing) -> Mode {
    match sharing {
        Sharing::Exclusive => Mode::Exclusive,
        Sharing::Shared => Mode::Shared,
    }
}

impl From<KeyState> for KeyView {
    fn from(state: KeyState) -> Self {
        Self {
            mode: state.sharing.map(mode),
            limit: state.limit,
            holders: state
                .holders
                .into_iter()
                .map(|h| HolderView {
                    session_id: h.session_id,
                    client_name: h.client_name,
                    holder: h.holder,
                    hold_count: h.hold_count,
                    ttl_remaining: h.ttl_remaining,
                    fence: h.fence,
                    value: h.value,
                })
                .collect(),
            waiters: state.waiters,
            queue: state
                .queue
                .into_iter()
                .map(|q| QueuedView {
                    session_id: q.session_id,
                    client_name: q.client_name,
                    holder: q.holder,
                    mode: mode(q.sharing),
                })
                .collect(),
            fence: state.fence,
        }
    }
}
