//! Local waiters by key, each with its own wake-up. A release notice wakes the fair
//! waiters it names, or, when it names none, the longest-waiting local waiter (only one
//! can win an unfair race). A woken waiter always makes one more attempt before it
//! looks at cancel or timeout, so a wake is never swallowed; `Notify` keeps a permit
//! when the waiter is not listening at the moment of the wake.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// The local waiters of each key: owner token and wake-up, longest waiting first.
type Waiters = HashMap<String, Vec<(String, Arc<Notify>)>>;

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
        waiters.push((owner.to_owned(), notify.clone()));
        Some(WaitGuard {
            wakers: self.clone(),
            key: key.to_owned(),
            owner: owner.to_owned(),
            notify,
        })
    }

    /// Wakes the named waiters of `key` that wait here; with no names, the longest
    /// waiting one.
    pub(crate) fn wake(&self, key: &str, owners: &[String]) {
        let keys = self.keys();
        let Some(waiters) = keys.get(key) else { return };
        if owners.is_empty() {
            if let Some((_, notify)) = waiters.first() {
                notify.notify_one();
            }
            return;
        }
        for (owner, notify) in waiters {
            if owners.contains(owner) {
                notify.notify_one();
            }
        }
    }

    /// Wakes every waiter: notices may have been missed.
    pub(crate) fn wake_all(&self) {
        for (_, notify) in self.keys().values().flatten() {
            notify.notify_one();
        }
    }
}

/// A registered waiter; unregisters on drop.
pub(crate) struct WaitGuard {
    wakers: Arc<Wakers>,
    key: String,
    owner: String,
    notify: Arc<Notify>,
}

impl WaitGuard {
    /// Completes at the next wake of this waiter (or at once on a stored permit).
    pub(crate) async fn notified(&self) {
        self.notify.notified().await;
    }
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        let mut keys = self.wakers.keys();
        if let Some(waiters) = keys.get_mut(&self.key) {
            waiters.retain(|(owner, _)| *owner != self.owner);
            if waiters.is_empty() {
                keys.remove(&self.key);
            }
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
        assert!(woken(&guard).await, "the stored permit wakes the waiter");
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
