//! Watch registrations: a sidecar with watchers of a key registers itself in the key's
//! watcher set (`{ns:KEY}:l`, see `lua/core.lua`), so that every change of the key is
//! published while it watches, and nothing is published for keys nobody watches or
//! waits for. A registration expires after [`REGISTRATION`] unless renewed, every
//! [`REFRESH`], for as long as the sidecar watches: a dead sidecar's registrations go
//! by themselves. After a `Resync` (the notice connection was made again: a Redis
//! restart, which forgets every registration, or a failover) every registration is
//! written again at once, so that changes made after it are published to this sidecar's
//! watchers, not only those after the next refresh.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::broadcast;

use super::link::Link;
use super::scripts::Lua;
use crate::store::{Notice, StoreError};

/// How long a registration lives without a refresh. Long enough that a store hiccup
/// does not lose it, short enough that a dead sidecar's registrations stop costing
/// publishes within a minute.
pub(super) const REGISTRATION: Duration = Duration::from_secs(60);
/// How often registrations are refreshed: three times per lifetime.
pub(super) const REFRESH: Duration = Duration::from_secs(20);

/// The keys this sidecar watches, and how many local watchers each has.
pub(super) struct Watchers {
    link: Arc<Link>,
    /// `{ns:`: a key's watcher set is `{ns:KEY}:l` and its lock `{ns:KEY}:h`.
    prefix: String,
    /// This sidecar in the watcher sets: `@` and a random id.
    id: String,
    lua: Lua,
    timeout: Duration,
    keys: Mutex<HashMap<String, usize>>,
}

impl Watchers {
    pub(super) fn new(link: Arc<Link>, namespace: &str, lua: Lua, timeout: Duration) -> Self {
        let id = crate::store::random_id();
        Self {
            link,
            prefix: format!("{{{namespace}:"),
            id: format!("@{id}"),
            lua,
            timeout,
            keys: Mutex::new(HashMap::new()),
        }
    }

    fn keys(&self) -> MutexGuard<'_, HashMap<String, usize>> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One more local watcher of `key`, counted at once (so that a `remove` matches
    /// it even if the returned future is dropped); the first registers this sidecar,
    /// which the future does.
    pub(super) fn add(
        self: &Arc<Self>,
        key: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'static {
        let first = {
            let mut keys = self.keys();
            let n = keys.entry(key.to_owned()).or_default();
            *n += 1;
            *n == 1
        };
        let (watchers, key) = (self.clone(), key.to_owned());
        async move {
            if first {
                watchers.register(&key, REGISTRATION).await?;
            }
            Ok(())
        }
    }

    /// One local watcher of `key` fewer; the last unregisters this sidecar (in the
    /// background: the registration expires anyway).
    pub(super) fn remove(self: &Arc<Self>, key: &str) {
        let last = {
            let mut keys = self.keys();
            match keys.get_mut(key) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    false
                }
                Some(_) => {
                    keys.remove(key);
                    true
                }
                None => false,
            }
        };
        if last {
            let (watchers, key) = (self.clone(), key.to_owned());
            tokio::spawn(async move {
                let _ = watchers.register(&key, Duration::ZERO).await;
            });
        }
    }

    /// Registers this sidecar as a watcher of `key` for `ttl` (zero: unregisters).
    async fn register(&self, key: &str, ttl: Duration) -> Result<(), StoreError> {
        let lock = format!("{}{key}}}:h", self.prefix);
        let watchers = format!("{}{key}}}:l", self.prefix);
        let call = async {
            let mut conn = self.link.connection().await?;
            let mut invoke = self.lua.script.prepare_invoke();
            // The scripts take every key of a lock; this one reads only the fourth.
            invoke
                .key(&lock)
                .key(&lock)
                .key(&lock)
                .key(&watchers)
                .arg(&self.id)
                .arg(ttl.as_millis() as u64);
            invoke
                .invoke_async::<i64>(&mut conn)
                .await
                .map_err(|e| StoreError::Unavailable(e.to_string()))
        };
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result.map(drop),
            Err(_) => Err(StoreError::Unavailable("no answer".into())),
        }
    }

    /// Renews every registration every [`REFRESH`], and at once after each `Resync`
    /// of `notices`, until the store goes.
    pub(super) async fn refresh(self: Arc<Self>, mut notices: broadcast::Receiver<Notice>) {
        use broadcast::error::RecvError;
        let mut tick = tokio::time::interval(REFRESH);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                notice = notices.recv() => match notice {
                    Ok(Notice::Resync) | Err(RecvError::Lagged(_)) => {
                        tracing::debug!("registering this sidecar's watches again");
                    }
                    Ok(_) => continue,
                    Err(RecvError::Closed) => return,
                },
            }
            let keys: Vec<String> = self.keys().keys().cloned().collect();
            let calls = keys.iter().map(|key| self.register(key, REGISTRATION));
            for (key, result) in keys.iter().zip(futures_util::future::join_all(calls).await) {
                if let Err(e) = result {
                    tracing::debug!(%key, error = %e, "a watch registration was not renewed");
                }
            }
        }
    }
}
