//! Local waiters by key, each with its own wake-up. A release notice wakes the fair
//! waiters it names, or, when it names none, the longest-waiting local waiter that has
//! no wake pending yet (only one can win an unfair race; one that will try anyway
//! needs no second wake).
//!
//! **A wake is never swallowed.** A wake is a flag on its waiter, set under the lock
//! and cleared only when the waiter takes it (`Notify` is just the doorbell that says
//! to look at the flag): a woken waiter always makes one more attempt before it looks
//! at cancel or timeout. A waiter that leaves with a wake it did not take (its attempt
//! in flight was granted, it timed out, it was cancelled) passes the wake on to the
//! next waiter of the key, which tries in its place. Without that, the notice that lets
//! a second waiter in (a shared grant or a semaphore permit that leaves room, a second
//! release) could land on a first waiter whose grant is still on its way back, and the
//! second would sleep until its next look, TTL/3 later, while the key is free.
//! A wake passed on in vain costs one attempt, never safety.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// One local waiter of a key.
struct Waiter {
    owner: String,
    notify: Arc<Notify>,
    /// A wake was given to this waiter and not yet taken.
    woken: bool,
}

impl Waiter {
    fn wake(&mut self) {
        self.woken = true;
        self.notify.notify_one();
    }
}

/// The local waiters of each key, longest waiting first.
type Waiters = HashMap<String, Vec<Waiter>>;

#[derive(Default)]
pub(crate) struct Wakers {
    keys: Mutex<Waiters>,
}

impl Wakers {
    fn keys(&self) -> std::sync::MutexGuard<'_, Waiters> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers `owner` as a waiter of `key`, unless `limit` waiters already wait for
    /// it here.
    pub(crate) fn register(
        self: &Arc<Self>,
        key: &str,
        owner: &str,
        limit: usize,
    ) -> Option<WaitGuard> {
        let mut keys = self.keys();
        let waiters = keys.entry(key.to_owned()).or_default();
        if waiters.len() >= limit {
            return None;
        }
        let notify = Arc::new(Notify::new());
        waiters.push(Waiter {
            owner: owner.to_owned(),
            notify: notify.clone(),
            woken: false,
        });
        Some(WaitGuard {
            wakers: self.clone(),
            key: key.to_owned(),
            owner: owner.to_owned(),
            notify,
        })
    }

    /// Wakes the named waiters of `key` that wait here; with no names, the longest
    /// waiting one that has no wake pending.
    pub(crate) fn wake(&self, key: &str, owners: &[String]) {
        let mut keys = self.keys();
        let Some(waiters) = keys.get_mut(key) else {
            return;
        };
        if owners.is_empty() {
            wake_next(waiters);
            return;
        }
        for waiter in waiters.iter_mut() {
            if owners.contains(&waiter.owner) {
                waiter.wake();
            }
        }
    }

    /// Wakes every waiter: notices may have been missed.
    pub(crate) fn wake_all(&self) {
        for waiter in self.keys().values_mut().flatten() {
            waiter.wake();
        }
    }

    /// Takes the wake of `owner` on `key`, if one is pending.
    fn take(&self, key: &str, owner: &str) -> bool {
        let mut keys = self.keys();
        let waiter = keys
            .get_mut(key)
            .and_then(|waiters| waiters.iter_mut().find(|w| w.owner == owner));
        match waiter {
            Some(waiter) => std::mem::take(&mut waiter.woken),
            None => false,
        }
    }
}

/// Wakes the longest waiting of `waiters` that has no wake pending (if all have one,
/// all will try anyway).
fn wake_next(waiters: &mut [Waiter]) {
    if let Some(waiter) = waiters.iter_mut().find(|w| !w.woken) {
        waiter.wake();
    }
}

/// A registered waiter; unregisters on drop, passing on a wake it did not take.
pub(crate) struct WaitGuard {
    wakers: Arc<Wakers>,
    key: String,
    owner: String,
    notify: Arc<Notify>,
}

impl WaitGuard {
    /// Completes when this waiter has a wake to take (at once if one is pending), and
    /// takes it.
    pub(crate) async fn notified(&self) {
        loop {
            if self.wakers.take(&self.key, &self.owner) {
                return;
            }
            // A wake between the look above and this wait leaves a permit: no race. A
            // permit left over from a wake already taken only makes the loop look again.
            self.notify.notified().await;
        }
    }
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        let mut keys = self.wakers.keys();
        let Some(waiters) = keys.get_mut(&self.key) else {
            return;
        };
        let Some(index) = waiters.iter().position(|w| w.owner == self.owner) else {
            return;
        };
        let left = waiters.remove(index);
        if left.woken {
            // Not taken: this waiter was granted meanwhile, or gave up. The next one
            // tries in its place.
            wake_next(waiters);
        }
        if waiters.is_empty() {
            keys.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn woken(guard: &WaitGuard) -> bool {
        tokio::time::timeout(Duration::from_millis(50), guard.notified())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_wake_before_listening_is_kept() {
        let wakers = Arc::new(Wakers::default());
        let guard = wakers.register("k", "a", 10).expect("registered");
        wakers.wake("k", &[]);
        assert!(woken(&guard).await, "the stored wake wakes the waiter");
        assert!(!woken(&guard).await, "once");
    }

    #[tokio::test]
    async fn named_waiters_are_woken_and_no_one_else() {
        let wakers = Arc::new(Wakers::default());
        let a = wakers.register("k", "a", 10).expect("a");
        let b = wakers.register("k", "b", 10).expect("b");
        wakers.wake("k", &["b".to_owned()]);
        assert!(woken(&b).await);
        assert!(!woken(&a).await);
        wakers.wake("k", &[]);
        assert!(
            woken(&a).await,
            "an unnamed wake goes to the longest waiting"
        );
    }

    #[tokio::test]
    async fn an_unnamed_wake_skips_a_waiter_that_has_one_pending() {
        let wakers = Arc::new(Wakers::default());
        let a = wakers.register("k", "a", 10).expect("a");
        let b = wakers.register("k", "b", 10).expect("b");
        wakers.wake("k", &[]);
        wakers.wake("k", &[]);
        assert!(woken(&b).await, "the second wake goes to the second waiter");
        assert!(woken(&a).await);
    }

    #[tokio::test]
    async fn a_wake_not_taken_is_passed_on() {
        let wakers = Arc::new(Wakers::default());
        let a = wakers.register("k", "a", 10).expect("a");
        let b = wakers.register("k", "b", 10).expect("b");
        wakers.wake("k", &[]);
        drop(a);
        assert!(woken(&b).await, "a left with its wake: b tries instead");
        let c = wakers.register("k", "c", 10).expect("c");
        drop(b);
        assert!(!woken(&c).await, "b had taken its wake: nothing to pass on");
    }

    #[test]
    fn waiters_per_key_are_limited_and_unregister_on_drop() {
        let wakers = Arc::new(Wakers::default());
        let a = wakers.register("k", "a", 1).expect("first");
        assert!(wakers.register("k", "b", 1).is_none());
        drop(a);
        assert!(wakers.register("k", "b", 1).is_some());
        assert!(wakers.keys().is_empty(), "the last guard removed the key");
    }
}
