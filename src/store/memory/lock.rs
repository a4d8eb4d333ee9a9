//! One lock of the memory store: its holders, waiters and fair queue, and the rules
//! that mirror `lua/core.lua` by name (purge, admit, heads, wake).

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::time::Instant;

use super::{FORGET_AFTER, MAX_HEADS};
use crate::store::{Acquired, Claim, Notice, Sharing, unix_ms};

#[derive(Debug)]
pub(super) struct Holder {
    pub(super) owner: String,
    pub(super) expires: Instant,
    pub(super) count: u32,
    pub(super) fence: u64,
    pub(super) session_id: String,
    pub(super) client_name: String,
    pub(super) holder: String,
    /// The holder's value (empty for none).
    pub(super) value: Vec<u8>,
}

#[derive(Clone, Debug)]
pub(super) struct Waiter {
    pub(super) expires: Instant,
    pub(super) sharing: Sharing,
    pub(super) limit: u32,
    pub(super) owner: String,
    pub(super) session_id: String,
    pub(super) client_name: String,
    pub(super) holder: String,
}

#[derive(Debug, Default)]
pub(super) struct Lock {
    pub(super) holders: Vec<Holder>,
    /// The holders' mode and limit; meaningful while there are holders.
    pub(super) sharing: Option<Sharing>,
    pub(super) limit: u32,
    /// Waiter name (see [`Claim::waiter`]) -> registration.
    pub(super) waiters: HashMap<String, Waiter>,
    /// Fair queue: (score, waiter name), by score (see `lua/acquire.lua`: arrival
    /// `max(last + 1, ms × 1024)` for one key, the request's ticket for several).
    pub(super) queue: BTreeSet<(u64, String)>,
    pub(super) delay_until: Option<Instant>,
    pub(super) fence: u64,
    /// Since when the lock has had no holder (`None` while held).
    pub(super) unheld_since: Option<Instant>,
    /// The time of this lock's live entry in the forget queue (`None`: not queued).
    pub(super) queued_for: Option<Instant>,
}

pub(super) enum Admit {
    Free,
    Ok,
    Busy,
    Conflict(u32),
}

impl Lock {
    pub(super) fn purge(&mut self, now: Instant) {
        self.holders.retain(|h| h.expires > now);
        if self.holders.is_empty() {
            self.sharing = None;
            self.limit = 0;
        }
        self.waiters.retain(|_, w| w.expires > now);
        let waiters = &self.waiters;
        self.queue.retain(|(_, name)| waiters.contains_key(name));
        if self.delay_until.is_some_and(|t| t <= now) {
            self.delay_until = None;
        }
        self.settle(now);
    }

    /// Notes when the lock lost its last holder. A held lock is not in the forget
    /// queue: the engine releases every grant it drops, and that release (or any later
    /// call on the key, which purges an expired holder) queues it.
    pub(super) fn settle(&mut self, now: Instant) {
        if self.holders.is_empty() {
            self.unheld_since.get_or_insert(now);
        } else {
            self.unheld_since = None;
        }
    }

    /// Nobody holds or waits for the lock and no lock-delay runs.
    pub(super) fn idle(&self) -> bool {
        self.holders.is_empty()
            && self.waiters.is_empty()
            && self.queue.is_empty()
            && self.delay_until.is_none()
    }

    /// When the lock may be forgotten unless it is used again: [`FORGET_AFTER`] after
    /// its last holder left, its lock-delay ended and its last waiter registration
    /// expired. `None` while held.
    pub(super) fn forget_at(&self) -> Option<Instant> {
        let mut quiet = self.unheld_since?;
        if let Some(delay) = self.delay_until {
            quiet = quiet.max(delay);
        }
        for waiter in self.waiters.values() {
            quiet = quiet.max(waiter.expires);
        }
        Some(quiet + FORGET_AFTER)
    }

    pub(super) fn holder(&mut self, owner: &str) -> Option<&mut Holder> {
        self.holders.iter_mut().find(|h| h.owner == owner)
    }

    pub(super) fn admit(&self, sharing: Sharing, limit: u32) -> Admit {
        let n = self.holders.len() as u32;
        if n == 0 {
            return Admit::Free;
        }
        if self.limit != limit {
            return Admit::Conflict(self.limit);
        }
        if limit > 1 {
            return if n < limit { Admit::Ok } else { Admit::Busy };
        }
        if sharing == Sharing::Shared && self.sharing == Some(Sharing::Shared) {
            return Admit::Ok;
        }
        Admit::Busy
    }

    /// The fair waiters ahead of `name`: of a strictly smaller score (all of them when
    /// it is not queued), so that no two requests are each ahead of the other.
    pub(super) fn ahead_of(&self, name: &str) -> Vec<&String> {
        let mine = self.queue.iter().find(|(_, n)| n == name).map(|(s, _)| *s);
        (self.queue.iter())
            .take_while(|(s, _)| mine.is_none_or(|m| *s < m))
            .map(|(_, n)| n)
            .collect()
    }

    /// Whether nobody queued ahead of `name` could be granted instead.
    pub(super) fn first_in_line(&self, name: &str, sharing: Sharing, limit: u32) -> bool {
        let ahead = self.ahead_of(name);
        if ahead.is_empty() {
            return true;
        }
        if limit > 1 {
            return (ahead.len() as u32) < limit - self.holders.len() as u32;
        }
        sharing == Sharing::Shared
            && ahead.iter().all(|n| {
                self.waiters
                    .get(*n)
                    .is_some_and(|w| w.sharing == Sharing::Shared)
            })
    }

    /// The fair waiters the lock would admit now (see `heads` in `lua/core.lua`).
    pub(super) fn heads(&self) -> Vec<String> {
        let first: Vec<&Waiter> = self
            .queue
            .iter()
            .map(|(_, n)| n)
            .take(MAX_HEADS)
            .filter_map(|n| self.waiters.get(n))
            .collect();
        let Some(head) = first.first() else {
            return Vec::new();
        };
        let n = self.holders.len();
        let (room, readers_only) = if n == 0 {
            match (head.limit, head.sharing) {
                (l, _) if l > 1 => (l as usize, false),
                (_, Sharing::Shared) => (first.len(), true),
                _ => (1, false),
            }
        } else if self.limit > 1 {
            ((self.limit as usize).saturating_sub(n), false)
        } else if self.sharing == Some(Sharing::Shared) {
            (first.len(), true)
        } else {
            (0, false)
        };
        first
            .iter()
            .take(room)
            .take_while(|w| !readers_only || w.sharing == Sharing::Shared)
            .map(|w| w.owner.clone())
            .collect()
    }

    /// Wakes the waiters that can now have the lock, when there are any; whether a
    /// notice went out.
    pub(super) fn wake(&self, key: &str, notices: &broadcast::Sender<Notice>) -> bool {
        if self.waiters.is_empty() {
            return false;
        }
        let owners = if self.queue.is_empty() {
            Vec::new()
        } else {
            self.heads()
        };
        if !owners.is_empty() || self.waiters.len() > self.queue.len() {
            // No receiver is fine: no sidecar task listens yet.
            let _ = notices.send(Notice::Released {
                key: key.to_owned(),
                owners,
            });
            return true;
        }
        false
    }
}

/// A ticket from the store's clock, as the Redis scripts make it: ms × 1024.
pub(super) fn ticket_now() -> u64 {
    unix_ms().saturating_mul(1024)
}

/// The score of a claim that comes now: after every one queued, on the store's clock.
fn next_score(lock: &Lock) -> u64 {
    let last = lock.queue.iter().next_back().map_or(0, |(s, _)| *s);
    (last + 1).max(ticket_now())
}

/// Registers `claim` as a waiter for its TTL (and queues it, when fair: by its ticket,
/// or by arrival), as `register` in `lua/acquire.lua`.
pub(super) fn register(lock: &mut Lock, claim: &Claim, name: &str, now: Instant) {
    if claim.fair && !lock.queue.iter().any(|(_, n)| n == name) {
        let score = claim.ticket.unwrap_or_else(|| next_score(lock));
        lock.queue.insert((score, name.to_owned()));
    }
    lock.waiters.insert(
        name.to_owned(),
        Waiter {
            expires: now + claim.ttl,
            sharing: claim.sharing,
            limit: claim.limit,
            owner: claim.owner.clone(),
            session_id: claim.session_id.clone(),
            client_name: claim.client_name.clone(),
            holder: claim.holder.clone(),
        },
    );
}

/// Registers (and queues) a waiter that may not go yet; says when to look again.
pub(super) fn busy(lock: &mut Lock, claim: &Claim, name: String, now: Instant) -> Acquired {
    if claim.wait {
        register(lock, claim, &name, now);
    }
    let mut look = now + claim.ttl;
    if let Some(first) = lock.holders.iter().map(|h| h.expires).min() {
        look = look.min(first);
    }
    if let Some(delay) = lock.delay_until {
        look = look.min(delay);
    }
    let (mut position, mut ticket) = (0, ticket_now());
    if claim.fair {
        // A request for several keys that comes now is behind every one queued here.
        ticket = next_score(lock);
        if let Some(oldest) = lock
            .waiters
            .iter()
            .filter(|(n, _)| **n != name)
            .map(|(_, w)| w.expires)
            .min()
        {
            look = look.min(oldest);
        }
        position = lock.ahead_of(&name).len() as u32 + 1;
    }
    Acquired::Busy {
        expires_in: (look - now).max(Duration::from_millis(1)),
        position,
        ticket,
    }
}
