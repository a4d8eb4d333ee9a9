//! Watches (`Watch`): followers of a key's state. Every local watcher of a key shares
//! one entry, and each entry has one task that reads the key from the store, so a
//! change costs one `describe` however many watchers it has here.
//!
//! - **Notified, not polled.** While a key has watchers, the task listens to it in the
//!   store ([`Store::listen`] with `watch`: the store publishes the key's changes only
//!   while somebody listens). A notice for the key (a grant, a release, a value) makes
//!   it read the key once and publish the state if it changed; `Resync` (notices may
//!   have been missed: a reconnect, a failover) makes every key read again.
//! - **Expiry by the clock.** Nothing is published when a lock expires in the store
//!   because its sidecar died, so the task also reads the key again at its first
//!   holder's expiry: a dead holder is seen gone then, not before.
//! - **Latest state, bounded memory.** States go out on a `tokio::sync::watch` channel:
//!   one slot, overwritten. A watcher that reads slowly gets the newest state and
//!   skips the ones in between; its cost here is one receiver, whatever it misses.
//! - **In order.** One task reads each key, one read at a time, and numbers what it
//!   publishes: a watcher never gets a state older than one it already has. A new
//!   watcher asks the task for a fresh read and starts with its answer.
//! - **Nothing false in an outage.** A read that fails publishes nothing; the task
//!   tries again (backing off to once a second) and after a `Resync`, and publishes
//!   the state it finds then if it changed. Only a watch that cannot read its key as
//!   it starts fails (UNAVAILABLE).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::stream::{self, BoxStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{EngineError, KeyView};
use crate::store::{Store, StoreError};

/// First wait before reading a key again after a failed read; doubled per failure.
const RETRY_FIRST: Duration = Duration::from_millis(50);
/// Longest wait between reads of a key while the store fails: a watch sees the store
/// back within a second even if no `Resync` says so.
const RETRY_MAX: Duration = Duration::from_secs(1);
/// Read a key this long after its first holder's expiry: the store lets a grant go
/// at its expiry, and a read exactly then may still find it.
const EXPIRY_SLACK: Duration = Duration::from_millis(1);

/// A watch's states: the key's state first, then each change. Ends with
/// [`EngineError::ShuttingDown`] when the sidecar shuts down.
pub type WatchStream = BoxStream<'static, Result<KeyView, EngineError>>;

/// One state as published to the watchers of a key: numbered, so a watcher can drop
/// what it already has.
#[derive(Clone, Debug, Default)]
struct Published {
    seq: u64,
    view: Option<Arc<KeyView>>,
}

/// A watcher that just joined waits for a read of the key made after it joined.
type Join = oneshot::Sender<Result<Published, String>>;

/// What the watchers of one key share with the task that reads it.
struct KeyWatch {
    /// A notice for the key came: read it again.
    poke: Notify,
    /// New watchers, each waiting for a fresh read.
    joins: mpsc::UnboundedSender<Join>,
    /// The latest state.
    states: watch::Sender<Published>,
    /// The last watcher left: the task ends.
    stop: CancellationToken,
}

struct Entry {
    watchers: usize,
    shared: Arc<KeyWatch>,
}

/// The watched keys of this sidecar.
pub(crate) struct Watches {
    store: Arc<dyn Store>,
    /// The sessions' store-call turns ([`super::MAX_STORE_CALLS`]): reads of watched
    /// keys take their turn too.
    turns: Arc<Semaphore>,
    shutdown: CancellationToken,
    /// One per open watch; see [`super::EngineConfig::max_watches`].
    permits: Arc<Semaphore>,
    max: usize,
    keys: Mutex<HashMap<String, Entry>>,
}

impl Watches {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        turns: Arc<Semaphore>,
        shutdown: CancellationToken,
        max: usize,
    ) -> Self {
        Self {
            store,
            turns,
            shutdown,
            permits: Arc::new(Semaphore::new(max)),
            max,
            keys: Mutex::new(HashMap::new()),
        }
    }

    fn keys(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        // Poisoned only by a panic in the short sections below; the map is consistent.
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Open watches.
    pub(crate) fn count(&self) -> usize {
        self.max - self.permits.available_permits()
    }

    /// A notice for `key`: its task (if it is watched here) reads it again.
    pub(crate) fn poke(&self, key: &str) {
        if let Some(entry) = self.keys().get(key) {
            // Stores a permit if the task is busy reading: the change is not lost.
            entry.shared.poke.notify_one();
        }
    }

    /// Notices may have been missed: every watched key is read again.
    pub(crate) fn poke_all(&self) {
        for entry in self.keys().values() {
            entry.shared.poke.notify_one();
        }
    }

    /// Starts watching `key` (already validated): the stream's first item is a read of
    /// the key made now.
    pub(crate) async fn watch(self: &Arc<Self>, key: &str) -> Result<WatchStream, EngineError> {
        let permit = self.permits.clone().try_acquire_owned().map_err(|_| {
            EngineError::ResourceExhausted(format!(
                "this sidecar already serves {} watches, its limit",
                self.max
            ))
        })?;
        let registration = self.join(key);
        let shared = registration.shared.clone();
        // Subscribed before asking: every state published after the answer's is seen
        // as a change.
        let states = shared.states.subscribe();
        let (tx, answer) = oneshot::channel();
        let first = match shared.joins.send(tx) {
            Ok(()) => tokio::select! {
                answer = answer => answer.map_err(|_| EngineError::ShuttingDown)?,
                _ = self.shutdown.cancelled() => return Err(EngineError::ShuttingDown),
            },
            // The task is gone: only shutdown ends it while watchers remain.
            Err(_) => return Err(EngineError::ShuttingDown),
        };
        let first = first.map_err(|e| EngineError::Store(StoreError::Unavailable(e)))?;
        let follower = Follower {
            first: first.view,
            seen: first.seq,
            states,
            shutdown: self.shutdown.clone(),
            ended: false,
            _registration: registration,
            _permit: permit,
        };
        Ok(Box::pin(stream::unfold(follower, Follower::next)))
    }

    /// Counts one more watcher of `key`, starting its task if it is the first.
    fn join(self: &Arc<Self>, key: &str) -> Registration {
        let mut keys = self.keys();
        let entry = keys.entry(key.to_owned()).or_insert_with(|| {
            let (joins, joined) = mpsc::unbounded_channel();
            let shared = Arc::new(KeyWatch {
                poke: Notify::new(),
                joins,
                states: watch::channel(Published::default()).0,
                stop: CancellationToken::new(),
            });
            tokio::spawn(follow(
                key.to_owned(),
                shared.clone(),
                joined,
                self.store.clone(),
                self.turns.clone(),
                self.shutdown.clone(),
            ));
            Entry {
                watchers: 0,
                shared,
            }
        });
        entry.watchers += 1;
        Registration {
            watches: self.clone(),
            key: key.to_owned(),
            shared: entry.shared.clone(),
        }
    }
}

/// One watcher's place in its key's entry; leaving it (drop) stops the key's task
/// when it was the last.
struct Registration {
    watches: Arc<Watches>,
    key: String,
    shared: Arc<KeyWatch>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut keys = self.watches.keys();
        let Some(entry) = keys.get_mut(&self.key) else {
            return;
        };
        // The entry may be a newer one for the same key: leave that alone.
        if !Arc::ptr_eq(&entry.shared, &self.shared) {
            return;
        }
        entry.watchers -= 1;
        if entry.watchers == 0 {
            keys.remove(&self.key);
            self.shared.stop.cancel();
        }
    }
}

/// One watcher's side: what it has seen, and what keeps its place.
struct Follower {
    first: Option<Arc<KeyView>>,
    seen: u64,
    states: watch::Receiver<Published>,
    shutdown: CancellationToken,
    ended: bool,
    _registration: Registration,
    _permit: OwnedSemaphorePermit,
}

impl Follower {
    async fn next(mut self) -> Option<(Result<KeyView, EngineError>, Self)> {
        if self.ended {
            return None;
        }
        if let Some(first) = self.first.take() {
            return Some((Ok(KeyView::clone(&first)), self));
        }
        loop {
            tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => break,
                changed = self.states.changed() => {
                    if changed.is_err() {
                        break; // the task ended: only shutdown ends it while we watch
                    }
                    let published = self.states.borrow_and_update().clone();
                    if published.seq > self.seen {
                        self.seen = published.seq;
                        if let Some(view) = published.view {
                            return Some((Ok(KeyView::clone(&view)), self));
                        }
                    }
                }
            }
        }
        self.ended = true;
        Some((Err(EngineError::ShuttingDown), self))
    }
}

/// The task of one watched key: listens to it in the store, reads it when told to (a
/// notice, a new watcher), at its first holder's expiry, and again after a failed
/// read; publishes each state that differs from the last.
async fn follow(
    key: String,
    shared: Arc<KeyWatch>,
    mut joined: mpsc::UnboundedReceiver<Join>,
    store: Arc<dyn Store>,
    turns: Arc<Semaphore>,
    shutdown: CancellationToken,
) {
    // Before the first read: a change between the read and the subscription would be
    // missed. A failure is the store's to log; expiry reads and retries go on anyway.
    let _ = store.listen(&key, true).await;
    let mut last = Published::default();
    let mut waiting: Vec<Join> = Vec::new();
    let mut next_read: Option<Instant> = None;
    let mut retry = RETRY_FIRST;
    let mut failing = false;
    loop {
        if waiting.is_empty() {
            let at = next_read;
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                _ = shared.stop.cancelled() => break,
                join = joined.recv() => match join {
                    Some(join) => waiting.push(join),
                    None => break,
                },
                _ = shared.poke.notified() => {}
                _ = tokio::time::sleep_until(at.unwrap_or_else(Instant::now)), if at.is_some() => {}
            }
        }
        // Watchers that joined meanwhile share this read.
        while let Ok(join) = joined.try_recv() {
            waiting.push(join);
        }
        let read = {
            let _turn = turns.acquire().await;
            store.describe(&key).await
        };
        match read {
            Ok(state) => {
                if failing {
                    tracing::info!(%key, "watched key read again after store errors");
                    failing = false;
                }
                retry = RETRY_FIRST;
                let view = KeyView::from(state);
                next_read = view
                    .first_expiry()
                    .map(|left| Instant::now() + left.max(EXPIRY_SLACK) + EXPIRY_SLACK);
                let same = last.view.as_ref().is_some_and(|v| v.same_state(&view));
                if !same {
                    last = Published {
                        seq: last.seq + 1,
                        view: Some(Arc::new(view)),
                    };
                    shared.states.send_replace(last.clone());
                }
                for join in waiting.drain(..) {
                    let _ = join.send(Ok(last.clone()));
                }
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(%key, error = %e, "cannot read a watched key; its watchers hear nothing until it can be read");
                    failing = true;
                }
                for join in waiting.drain(..) {
                    let _ = join.send(Err(e.to_string()));
                }
                next_read = Some(Instant::now() + retry);
                retry = (retry * 2).min(RETRY_MAX);
            }
        }
    }
    store.unlisten(&key, true);
}
