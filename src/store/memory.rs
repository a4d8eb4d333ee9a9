//! The embedded store: the same semantics as the Redis scripts in `lua/`, in one
//! process, for development, single-replica use and tests. Expiry runs on
//! `tokio::time::Instant`, so tests can pause the clock; fencing tokens use the wall
//! clock like Redis (see [`super::next_fence`]), so they keep increasing across a
//! restart of the sidecar. The functions below mirror `lua/common.lua` by name.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::time::Instant;

use super::{
    Acquired, Claim, HolderState, KeyState, Notice, QueuedState, Renewal, Renewed, Sharing, Store,
    StoreFuture, next_fence, unix_ms,
};

/// How many notices a slow sidecar task may fall behind before it resyncs.
const NOTICE_BUFFER: usize = 4096;
/// Fair waiters woken by one notice at most, as in `lua/common.lua`.
const MAX_HEADS: usize = 64;

#[derive(Debug)]
struct Holder {
    owner: String,
    expires: Instant,
    count: u32,
    fence: u64,
    session_id: String,
    client_name: String,
}

#[derive(Clone, Debug)]
struct Waiter {
    expires: Instant,
    sharing: Sharing,
    limit: u32,
    owner: String,
    session_id: String,
    client_name: String,
}

#[derive(Debug, Default)]
struct Lock {
    holders: Vec<Holder>,
    /// The holders' mode and limit; meaningful while there are holders.
    sharing: Option<Sharing>,
    limit: u32,
    /// Waiter name (see [`Claim::waiter`]) -> registration.
    waiters: HashMap<String, Waiter>,
    /// Fair queue: arrival number -> waiter name.
    queue: BTreeMap<u64, String>,
    next_arrival: u64,
    delay_until: Option<Instant>,
    fence: u64,
}

enum Admit {
    Free,
    Ok,
    Busy,
    Conflict(u32),
}

impl Lock {
    fn purge(&mut self, now: Instant) {
        self.holders.retain(|h| h.expires > now);
        if self.holders.is_empty() {
            self.sharing = None;
            self.limit = 0;
        }
        self.waiters.retain(|_, w| w.expires > now);
        let waiters = &self.waiters;
        self.queue.retain(|_, name| waiters.contains_key(name));
        if self.delay_until.is_some_and(|t| t <= now) {
            self.delay_until = None;
        }
    }

    fn holder(&mut self, owner: &str) -> Option<&mut Holder> {
        self.holders.iter_mut().find(|h| h.owner == owner)
    }

    fn admit(&self, sharing: Sharing, limit: u32) -> Admit {
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

    /// Whether nobody queued ahead of `name` could be granted instead.
    fn first_in_line(&self, name: &str, sharing: Sharing, limit: u32) -> bool {
        let ahead: Vec<&String> = self.queue.values().take_while(|n| *n != name).collect();
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

    /// The fair waiters the lock would admit now (see `heads` in `lua/common.lua`).
    fn heads(&self) -> Vec<String> {
        let first: Vec<&Waiter> = self
            .queue
            .values()
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

    fn wake(&self, key: &str, notices: &broadcast::Sender<Notice>) {
        if self.waiters.is_empty() {
            return;
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
        }
    }
}

/// The embedded store. Locks live in a map behind one mutex, never held across an await.
#[derive(Debug)]
pub struct MemoryStore {
    locks: Mutex<HashMap<String, Lock>>,
    notices: broadcast::Sender<Notice>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self {
            locks: Mutex::new(HashMap::new()),
            notices: broadcast::channel(NOTICE_BUFFER).0,
        }
    }

    fn with_lock<T>(&self, key: &str, f: impl FnOnce(&mut Lock, Instant) -> T) -> T {
        let now = Instant::now();
        // A poisoned mutex means a panic inside one of the short sections below, which
        // touch no client input unchecked; the map itself is still consistent.
        let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        let lock = locks.entry(key.to_owned()).or_default();
        lock.purge(now);
        f(lock, now)
    }

    fn acquire_now(&self, claim: &Claim) -> Acquired {
        let name = claim.waiter();
        self.with_lock(&claim.key, |lock, now| {
            let admit = lock.admit(claim.sharing, claim.limit);
            if let Admit::Conflict(limit) = admit {
                return Acquired::Conflict { limit };
            }
            let go = !matches!(admit, Admit::Busy)
                && lock.delay_until.is_none()
                && (!claim.fair || lock.first_in_line(&name, claim.sharing, claim.limit));
            if !go {
                return busy(lock, claim, name, now);
            }
            lock.fence = next_fence(lock.fence, unix_ms());
            if let Admit::Free = admit {
                lock.sharing = Some(claim.sharing);
                lock.limit = claim.limit;
            }
            lock.waiters.remove(&name);
            lock.queue.retain(|_, n| *n != name);
            lock.holders.push(Holder {
                owner: claim.owner.clone(),
                expires: now + claim.ttl,
                count: 1,
                fence: lock.fence,
                session_id: claim.session_id.clone(),
                client_name: claim.client_name.clone(),
            });
            let room = (lock.holders.len() as u32) < claim.limit;
            if claim.sharing == Sharing::Shared || (claim.limit > 1 && room) {
                // Room is left for more readers or permits: pass the wake on.
                lock.wake(&claim.key, &self.notices);
            }
            Acquired::Granted { fence: lock.fence }
        })
    }
}

/// Registers (and queues) a waiter that may not go yet; says when to look again.
fn busy(lock: &mut Lock, claim: &Claim, name: String, now: Instant) -> Acquired {
    if claim.wait {
        if claim.fair && !lock.queue.values().any(|n| *n == name) {
            lock.next_arrival += 1;
            lock.queue.insert(lock.next_arrival, name.clone());
        }
        lock.waiters.insert(
            name.clone(),
            Waiter {
                expires: now + claim.ttl,
                sharing: claim.sharing,
                limit: claim.limit,
                owner: claim.owner.clone(),
                session_id: claim.session_id.clone(),
                client_name: claim.client_name.clone(),
            },
        );
    }
    let mut look = now + claim.ttl;
    if let Some(first) = lock.holders.iter().map(|h| h.expires).min() {
        look = look.min(first);
    }
    if let Some(delay) = lock.delay_until {
        look = look.min(delay);
    }
    let mut position = 0;
    if claim.fair {
        if let Some(oldest) = lock
            .waiters
            .iter()
            .filter(|(n, _)| **n != name)
            .map(|(_, w)| w.expires)
            .min()
        {
            look = look.min(oldest);
        }
        let rank = lock.queue.values().position(|n| *n == name);
        position = rank.unwrap_or(lock.queue.len()) as u32 + 1;
    }
    Acquired::Busy {
        expires_in: (look - now).max(Duration::from_millis(1)),
        position,
    }
}

fn ready<'a, T: Send + 'a>(value: T) -> StoreFuture<'a, T> {
    Box::pin(std::future::ready(Ok(value)))
}

impl Store for MemoryStore {
    fn acquire<'a>(&'a self, claim: &'a Claim) -> StoreFuture<'a, Acquired> {
        ready(self.acquire_now(claim))
    }

    fn hold<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> StoreFuture<'a, Option<u32>> {
        let answer = self.with_lock(key, |lock, now| {
            let holder = lock.holder(owner)?;
            holder.count = holder.count.saturating_add(1);
            holder.expires = now + ttl;
            Some(holder.count)
        });
        ready(answer)
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        all: bool,
        delay: Duration,
    ) -> StoreFuture<'a, Option<u32>> {
        let answer = self.with_lock(key, |lock, now| {
            let holder = lock.holder(owner)?;
            if !all && holder.count > 1 {
                holder.count -= 1;
                return Some(holder.count);
            }
            lock.holders.retain(|h| h.owner != owner);
            if lock.holders.is_empty() {
                let exclusive = lock.sharing == Some(Sharing::Exclusive) && lock.limit == 1;
                lock.sharing = None;
                lock.limit = 0;
                if exclusive && !delay.is_zero() {
                    lock.delay_until = Some(now + delay);
                }
            }
            lock.wake(key, &self.notices);
            Some(0)
        });
        ready(answer)
    }

    fn renew<'a>(&'a self, batch: &'a [Renewal<'a>]) -> StoreFuture<'a, Vec<Renewed>> {
        let answers = batch
            .iter()
            .map(|r| {
                self.with_lock(r.key, |lock, now| match lock.holder(r.owner) {
                    Some(holder) => {
                        holder.expires = now + r.ttl;
                        Renewed::Extended
                    }
                    None => Renewed::NotHeld,
                })
            })
            .collect();
        ready(answers)
    }

    fn unwait<'a>(&'a self, claim: &'a Claim) -> StoreFuture<'a, ()> {
        let name = claim.waiter();
        self.with_lock(&claim.key, |lock, _| {
            lock.waiters.remove(&name);
            let queued = lock.queue.len();
            lock.queue.retain(|_, n| *n != name);
            if lock.queue.len() < queued {
                // Those now first in line may be able to go.
                lock.wake(&claim.key, &self.notices);
            }
        });
        ready(())
    }

    fn describe<'a>(&'a self, key: &'a str) -> StoreFuture<'a, KeyState> {
        let state = self.with_lock(key, |lock, now| KeyState {
            holders: lock
                .holders
                .iter()
                .map(|h| HolderState {
                    session_id: h.session_id.clone(),
                    client_name: h.client_name.clone(),
                    hold_count: h.count,
                    ttl_remaining: h.expires - now,
                    fence: h.fence,
                })
                .collect(),
            sharing: lock.sharing,
            limit: lock.limit,
            waiters: lock.waiters.len() as u32,
            queue: lock
                .queue
                .values()
                .filter_map(|n| lock.waiters.get(n))
                .map(|w| QueuedState {
                    session_id: w.session_id.clone(),
                    client_name: w.client_name.clone(),
                    sharing: w.sharing,
                })
                .collect(),
            fence: lock.fence,
        });
        ready(state)
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        ready(())
    }

    fn notices(&self) -> broadcast::Receiver<Notice> {
        self.notices.subscribe()
    }
}
