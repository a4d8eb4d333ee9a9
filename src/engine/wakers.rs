//! Local waiters by key. A release notice wakes one local waiter of the key (not all of
//! them: only one can win). A woken waiter always makes one more attempt before it
//! looks at cancel or timeout, so a wake is never swallowed; `Notify` keeps a permit
//! when nobody is listening at the moment of the wake.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

#[derive(Default)]
pub(crate) struct Wakers {
    keys: Mutex<HashMap<String, Entry>>,
}

struct Entry {
    notify: Arc<Notify>,
    waiters: usize,
}

impl Wakers {
    fn keys(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a waiter of `key`, unless `limit` waiters already wait for it here.
    pub(crate) fn register(self: &Arc<Self>, key: &str, limit: usize) -> Option<WaitGuard> {
        let mut keys = self.keys();
        let entry = keys.entry(key.to_owned()).or_insert_with(|| Entry {
            notify: Arc::new(Notify::new()),
            waiters: 0,
        });
        if entry.waiters >= limit {
            return None;
        }
        entry.waiters += 1;
        Some(WaitGuard {
            wakers: self.clone(),
            key: key.to_owned(),
            notify: entry.notify.clone(),
        })
    }

    /// Wakes one waiter of `key`, if any waits here.
    pub(crate) fn wake(&self, key: &str) {
        if let Some(entry) = self.keys().get(key) {
            entry.notify.notify_one();
        }
    }

    /// Wakes every waiter: notices may have been missed.
    pub(crate) fn wake_all(&self) {
        for entry in self.keys().values() {
            entry.notify.notify_waiters();
            entry.notify.notify_one();
        }
    }
}

/// A registered waiter; unregisters on drop.
pub(crate) struct WaitGuard {
    wakers: Arc<Wakers>,
    key: String,
    notify: Arc<Notify>,
}

impl WaitGuard {
    /// Completes at the next wake of this key (or at once on a stored permit).
    pub(crate) async fn notified(&self) {
        self.notify.notified().await;
    }
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        let mut keys = self.wakers.keys();
        if let Some(entry) = keys.get_mut(&self.key) {
            entry.waiters -= 1;
            if entry.waiters == 0 {
                keys.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_wake_before_listening_is_kept() {
        let wakers = Arc::new(Wakers::default());
        let guard = wakers.register("k", 10).expect("registered");
        wakers.wake("k");
        tokio::time::timeout(std::time::Duration::from_secs(1), guard.notified())
            .await
            .expect("the stored permit wakes the waiter");
    }

    #[test]
    fn waiters_per_key_are_limited_and_unregister_on_drop() {
        let wakers = Arc::new(Wakers::default());
        let a = wakers.register("k", 1).expect("first");
        assert!(wakers.register("k", 1).is_none());
        drop(a);
        assert!(wakers.register("k", 1).is_some());
        assert!(wakers.keys().is_empty(), "the last guard removed the key");
    }
}
