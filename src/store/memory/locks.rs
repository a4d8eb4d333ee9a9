//! The memory store's map of locks, and how idle locks are forgotten: from a queue
//! ordered by when they are due, a bounded number per store call, no scan of the map.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::Duration;

use tokio::time::Instant;

use super::lock::Lock;

/// How long an idle lock is kept before it is forgotten: long enough that `Describe`
/// just after a release still shows the last token issued (the contract), short enough
/// that keys used once cost memory for about a second of traffic, not forever.
pub const FORGET_AFTER: Duration = Duration::from_secs(1);
/// Most idle locks one store call forgets, so that a burst of releases never makes
/// one call slow; the rest go at the next calls.
pub const SWEEP_BUDGET: usize = 1024;
/// The locks in use, and what it takes to forget them when idle.
#[derive(Debug, Default)]
pub(super) struct Locks {
    pub(super) map: HashMap<String, Lock>,
    /// When locks may be forgotten, earliest first: about one entry per idle lock, not
    /// one per release (a key locked and released 10,000 times a second is queued about
    /// once a second). An entry whose time is not its lock's `queued_for` is stale
    /// (the lock was forgotten, or queued earlier since) and is dropped when popped.
    pub(super) due: BinaryHeap<Reverse<(Instant, String)>>,
    /// The largest token of any lock forgotten so far: a lock made again starts there.
    pub(super) floor: u64,
}

impl Locks {
    /// Puts `key` in the forget queue if it is unheld and not queued yet for that time
    /// or earlier: an entry due earlier looks again when popped (see `sweep`).
    pub(super) fn schedule(
        due: &mut BinaryHeap<Reverse<(Instant, String)>>,
        key: &str,
        lock: &mut Lock,
    ) {
        let Some(at) = lock.forget_at() else {
            return;
        };
        if lock.queued_for.is_none_or(|queued| at < queued) {
            lock.queued_for = Some(at);
            due.push(Reverse((at, key.to_owned())));
        }
    }

    /// Forgets up to [`SWEEP_BUDGET`] locks that are due and still idle.
    pub(super) fn sweep(&mut self, now: Instant) {
        let mut forgot = false;
        for _ in 0..SWEEP_BUDGET {
            match self.due.peek() {
                Some(Reverse((at, _))) if *at <= now => {}
                _ => break,
            }
            let Some(Reverse((at, key))) = self.due.pop() else {
                break;
            };
            let Some(lock) = self.map.get_mut(&key) else {
                continue;
            };
            if lock.queued_for != Some(at) {
                continue;
            }
            lock.queued_for = None;
            lock.purge(now);
            if lock.idle() && lock.forget_at().is_some_and(|at| at <= now) {
                self.floor = self.floor.max(lock.fence);
                self.map.remove(&key);
                forgot = true;
            } else {
                // Used again, or a waiter or a delay came: due later, if at all.
                Self::schedule(&mut self.due, &key, lock);
            }
        }
        if forgot && self.map.capacity() > 4 * self.map.len() + 1024 {
            // A burst of keys left: give the table back too.
            self.map.shrink_to(2 * self.map.len());
            self.due.shrink_to(2 * self.due.len());
        }
    }
}
