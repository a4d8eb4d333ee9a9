//! The embedded store: the same semantics as Redis in one process, for development,
//! single-replica use and tests. Expiry runs on `tokio::time::Instant`, so tests can
//! pause the clock; fencing tokens use the wall clock like Redis (see
//! [`super::next_fence`]), so they keep increasing across a restart of the sidecar.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::time::Instant;

use super::{
    Acquired, Claim, HolderState, KeyState, Notice, Renewal, Store, StoreFuture, next_fence,
    unix_ms,
};

/// How many notices a slow sidecar task may fall behind before it resyncs.
const NOTICE_BUFFER: usize = 4096;

#[derive(Debug)]
struct Holder {
    owner: String,
    expires: Instant,
    count: u32,
    fence: u64,
    session_id: String,
    client_name: String,
}

#[derive(Debug, Default)]
struct Lock {
    holders: Vec<Holder>,
    /// owner -> registration expiry
    waiters: HashMap<String, Instant>,
    fence: u64,
}

impl Lock {
    fn purge(&mut self, now: Instant) {
        self.holders.retain(|h| h.expires > now);
        self.waiters.retain(|_, expires| *expires > now);
    }

    fn holder(&mut self, owner: &str) -> Option<&mut Holder> {
        self.holders.iter_mut().find(|h| h.owner == owner)
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
}

fn ready<'a, T: Send + 'a>(value: T) -> StoreFuture<'a, T> {
    Box::pin(std::future::ready(Ok(value)))
}

impl Store for MemoryStore {
    fn acquire<'a>(&'a self, claim: &'a Claim) -> StoreFuture<'a, Acquired> {
        let answer = self.with_lock(&claim.key, |lock, now| {
            if let Some(first) = lock.holders.iter().map(|h| h.expires).min() {
                if claim.wait {
                    lock.waiters.insert(claim.owner.clone(), now + claim.ttl);
                }
                return Acquired::Busy {
                    expires_in: first - now,
                };
            }
            lock.fence = next_fence(lock.fence, unix_ms());
            lock.waiters.remove(&claim.owner);
            lock.holders.push(Holder {
                owner: claim.owner.clone(),
                expires: now + claim.ttl,
                count: 1,
                fence: lock.fence,
                session_id: claim.session_id.clone(),
                client_name: claim.client_name.clone(),
            });
            Acquired::Granted { fence: lock.fence }
        });
        ready(answer)
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
    ) -> StoreFuture<'a, Option<u32>> {
        let answer = self.with_lock(key, |lock, _| {
            let holder = lock.holder(owner)?;
            if !all && holder.count > 1 {
                holder.count -= 1;
                return Some(holder.count);
            }
            lock.holders.retain(|h| h.owner != owner);
            if !lock.waiters.is_empty() {
                // No receiver is fine: no sidecar task listens yet.
                let _ = self.notices.send(Notice::Released(key.to_owned()));
            }
            Some(0)
        });
        ready(answer)
    }

    fn renew<'a>(&'a self, batch: &'a [Renewal<'a>]) -> StoreFuture<'a, Vec<bool>> {
        let answers = batch
            .iter()
            .map(|r| {
                self.with_lock(r.key, |lock, now| match lock.holder(r.owner) {
                    Some(holder) => {
                        holder.expires = now + r.ttl;
                        true
                    }
                    None => false,
                })
            })
            .collect();
        ready(answers)
    }

    fn unwait<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, ()> {
        self.with_lock(key, |lock, _| lock.waiters.remove(owner));
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
            waiters: lock.waiters.len() as u32,
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
