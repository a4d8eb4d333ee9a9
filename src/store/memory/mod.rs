//! The embedded store: the same semantics as the Redis scripts in `lua/`, in one
//! process, for development, single-replica use and tests. Expiry runs on
//! `tokio::time::Instant`, so tests can pause the clock; fencing tokens use the wall
//! clock like Redis (see [`super::next_fence`]), so they keep increasing across a
//! restart of the sidecar. Its locks die with the process: no session is resumable.
//!
//! **Only locks in use take memory.** Calls that only read or concern grants that do
//! not exist (`describe`, `renew`, `hold`, `release`, `unwait` of an unknown key)
//! create nothing; only an acquire makes a lock. A lock that has been idle (no holder,
//! no waiter, no lock-delay) for [`FORGET_AFTER`] is forgotten, at one of the next
//! store calls (each forgets at most [`SWEEP_BUDGET`] due locks, from a queue ordered
//! by when they are due: no scan of the map). Its next token is still larger: the
//! store keeps the largest token of every lock it forgot (one number) and starts a
//! lock made again from it: tokens increase even if the wall clock is stepped back.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::time::Instant;

mod acquire;
mod lock;
mod locks;
mod sessions;

use lock::Lock;
use locks::Locks;
pub use locks::{FORGET_AFTER, SWEEP_BUDGET};

use super::{
    Acquired, Claim, HolderState, KeyState, Notice, QueuedState, RecordWrite, Recorded, Renewal,
    Renewed, ResumeClaim, Resumption, Sharing, Store, StoreFuture,
};

/// How many notices a slow sidecar task may fall behind before it resyncs.
const NOTICE_BUFFER: usize = 4096;
/// Fair waiters woken by one notice at most, as in `lua/core.lua`.
const MAX_HEADS: usize = 64;

/// The embedded store. Locks live in a map behind one mutex, never held across an await.
#[derive(Debug)]
pub struct MemoryStore {
    locks: Mutex<Locks>,
    notices: broadcast::Sender<Notice>,
    /// Keys with watchers here, and how many ([`Store::listen`] with `watch`).
    watched: Mutex<HashMap<String, usize>>,
    /// Session records and sidecar attachments (`memory/sessions.rs`).
    sessions: Mutex<sessions::Sessions>,
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
            locks: Mutex::new(Locks::default()),
            notices: broadcast::channel(NOTICE_BUFFER).0,
            watched: Mutex::new(HashMap::new()),
            sessions: Mutex::default(),
        }
    }

    /// How many locks the store keeps (for tests: idle keys must not pile up).
    #[doc(hidden)]
    pub fn len(&self) -> usize {
        self.locks().map.len()
    }

    /// Whether the store keeps no lock at all.
    #[doc(hidden)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn locks(&self) -> std::sync::MutexGuard<'_, Locks> {
        // A poisoned mutex means a panic inside one of the short sections below, which
        // touch no client input unchecked; the map itself is still consistent.
        self.locks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the lock of `key` (expired holders and waiters purged), or returns
    /// `None` when the store has no such lock: nothing is created.
    fn with_lock<T>(&self, key: &str, f: impl FnOnce(&mut Lock, Instant) -> T) -> Option<T> {
        let now = Instant::now();
        let mut locks = self.locks();
        let locks = &mut *locks;
        locks.sweep(now);
        let lock = locks.map.get_mut(key)?;
        lock.purge(now);
        let answer = f(lock, now);
        lock.settle(now);
        Locks::schedule(&mut locks.due, key, lock);
        Some(answer)
    }

    /// Runs `f` on the lock of `key`, made if there is none (starting from the tokens
    /// of forgotten locks); kept only if `f` left it in use.
    fn with_new_lock<T>(&self, key: &str, f: impl FnOnce(&mut Lock, Instant) -> T) -> T {
        let now = Instant::now();
        let mut locks = self.locks();
        let locks = &mut *locks;
        locks.sweep(now);
        if let Some(lock) = locks.map.get_mut(key) {
            lock.purge(now);
            let answer = f(lock, now);
            lock.settle(now);
            Locks::schedule(&mut locks.due, key, lock);
            return answer;
        }
        let mut lock = Lock {
            fence: locks.floor,
            ..Lock::default()
        };
        let answer = f(&mut lock, now);
        lock.settle(now);
        if !lock.idle() {
            Locks::schedule(&mut locks.due, key, &mut lock);
            locks.map.insert(key.to_owned(), lock);
        }
        answer
    }

    /// Tells the watchers of `key`, if it has any, that it changed without freeing
    /// anything (nobody is told when nobody watches, as on Redis).
    fn changed(&self, key: &str) {
        if self.watched().contains_key(key) {
            let _ = self.notices.send(Notice::Changed {
                key: key.to_owned(),
            });
        }
    }

    fn watched(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.watched.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn ready<'a, T: Send + 'a>(value: T) -> StoreFuture<'a, T> {
    Box::pin(std::future::ready(Ok(value)))
}

impl Store for MemoryStore {
    fn acquire<'a>(&'a self, claim: &'a Claim) -> StoreFuture<'a, Acquired> {
        ready(self.acquire_now(claim))
    }

    fn reenter<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        count: u32,
        ttl: Duration,
    ) -> StoreFuture<'a, Option<u32>> {
        let answer = self
            .with_lock(key, |lock, now| {
                let holder = lock.holder(owner)?;
                let before = holder.count;
                holder.count = count.max(1);
                holder.expires = now + ttl;
                Some((holder.count, before))
            })
            .flatten();
        if let Some((count, before)) = answer
            && count != before
        {
            self.changed(key);
        }
        ready(answer.map(|(count, _)| count))
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        count: u32,
        delay: Duration,
    ) -> StoreFuture<'a, Option<u32>> {
        let answer = self.with_lock(key, |lock, now| {
            let holder = lock.holder(owner)?;
            if count > 0 {
                let changed = holder.count != count;
                holder.count = count;
                return Some((count, changed));
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
            // Watchers re-read on a release notice too.
            Some((0, !lock.wake(key, &self.notices)))
        });
        let answer = answer.flatten();
        if let Some((_, true)) = answer {
            self.changed(key);
        }
        ready(answer.map(|(count, _)| count))
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
                .unwrap_or(Renewed::NotHeld)
            })
            .collect();
        ready(answers)
    }

    fn unwait<'a>(&'a self, claim: &'a Claim) -> StoreFuture<'a, ()> {
        let name = claim.waiter();
        self.with_lock(&claim.key, |lock, _| {
            lock.waiters.remove(&name);
            let queued = lock.queue.len();
            lock.queue.retain(|(_, n)| *n != name);
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
                    holder: h.holder.clone(),
                    hold_count: h.count,
                    ttl_remaining: h.expires - now,
                    fence: h.fence,
                    value: h.value.clone(),
                })
                .collect(),
            sharing: lock.sharing,
            limit: lock.limit,
            waiters: lock.waiters.len() as u32,
            queue: lock
                .queue
                .iter()
                .filter_map(|(_, n)| lock.waiters.get(n))
                .map(|w| QueuedState {
                    session_id: w.session_id.clone(),
                    client_name: w.client_name.clone(),
                    holder: w.holder.clone(),
                    sharing: w.sharing,
                })
                .collect(),
            fence: lock.fence,
        });
        // A key the store does not have: nobody holds it, and no token is known.
        ready(state.unwrap_or_default())
    }

    fn proclaim<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        value: &'a [u8],
    ) -> StoreFuture<'a, bool> {
        let held = self
            .with_lock(key, |lock, _| {
                let holder = lock.holder(owner)?;
                holder.value = value.to_vec();
                Some(())
            })
            .flatten()
            .is_some();
        if held {
            self.changed(key);
        }
        ready(held)
    }

    fn listen<'a>(&'a self, key: &'a str, watch: bool) -> StoreFuture<'a, ()> {
        // Notices reach every listener of this process anyway; only watches count, so
        // that changes are announced only for watched keys.
        if watch {
            *self.watched().entry(key.to_owned()).or_default() += 1;
        }
        ready(())
    }

    fn unlisten(&self, key: &str, watch: bool) {
        if !watch {
            return;
        }
        let mut watched = self.watched();
        if let Some(n) = watched.get_mut(key) {
            *n -= 1;
            if *n == 0 {
                watched.remove(key);
            }
        }
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        ready(())
    }

    fn notices(&self) -> broadcast::Receiver<Notice> {
        self.notices.subscribe()
    }

    fn keeps_sessions(&self) -> bool {
        true
    }

    fn outlives_sidecar(&self) -> bool {
        false
    }

    fn record<'a>(&'a self, writes: &'a [RecordWrite]) -> StoreFuture<'a, Vec<Option<Recorded>>> {
        ready(self.write_records(writes))
    }

    fn attach<'a>(&'a self, sidecar: &'a str, ttl: Duration) -> StoreFuture<'a, ()> {
        self.write_attachment(sidecar, ttl);
        ready(())
    }

    fn resume<'a>(&'a self, claim: &'a ResumeClaim) -> StoreFuture<'a, Resumption> {
        ready(self.resume_session(claim))
    }

    fn kind(&self) -> &'static str {
        "memory"
    }
}

#[cfg(test)]
mod tests;
