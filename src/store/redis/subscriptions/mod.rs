//! Notices per key, on every topology: each lock has its own channel `{ns:KEY}:n` (the
//! lock's hash tag, so on a Cluster it is a shard channel in the lock's slot, which the
//! scripts `SPUBLISH` to; elsewhere they `PUBLISH`), and this sidecar subscribes to a
//! key's channel only while something here listens to the key ([`Store::listen`]: a
//! waiter from its first busy answer until its acquire ends, a watcher). A sidecar
//! without waiters subscribes to nothing and hears nothing of other pods' contention.
//!
//! The subscriptions ride on the store's shared connection (RESP3 push messages, see
//! `redis/link.rs`). One task makes them ([`Subscriptions::keep`]): it compares the keys
//! listened to with the keys subscribed and sends the difference, so subscribes and
//! unsubscribes of one key never overtake each other (a waiter that leaves and one that
//! comes at once leave the key subscribed), and many keys go in one round trip.
//!
//! **No notice is missed for good.** A listen completes once the server has confirmed
//! the subscription (the engine then tries once more, so a release between its busy
//! answer and the subscription is seen). When the connection to one server ends, its
//! subscriptions end with it: the task subscribes every listened key again on the next
//! connection (after a failover: to the new master) and then sends `Resync`, so every
//! waiter looks again. On a Cluster, redis-rs re-subscribes by itself after a
//! reconnection or a slot map change; a disconnection, or a subscription the server
//! drops (its slot moved), starts a healing: every listened key is subscribed again a
//! few times while the topology settles, each pass followed by `Resync`.
//!
//! [`Store::listen`]: crate::store::Store::listen

mod pushes;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use deadpool_redis::redis::{PushKind, RedisError, Value};
use futures_util::future::join_all;
use tokio::sync::{Notify, broadcast, mpsc, watch};
use tokio::task::JoinHandle;

use super::link::{Conn, Link, Push};
use crate::store::{Notice, StoreError};
use crate::telemetry::Streak;

/// When to subscribe again after a Cluster's topology moved: soon, then as the slot
/// maps of the nodes and of the connection converge (a coordinated failover takes
/// ~100 ms, an automatic one ~2 s before it starts).
const HEAL_PAUSES: [Duration; 4] = [
    Duration::from_millis(100),
    Duration::from_millis(300),
    Duration::from_millis(1000),
    Duration::from_millis(2000),
];

/// Backoff between passes that failed (Redis unreachable).
const RETRY_MIN: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(2);

/// Channels per SUBSCRIBE or UNSUBSCRIBE: after a reconnection with 10,000 keys
/// listened to, 40 commands rather than one huge one or 10,000 small ones.
const CHANNELS_PER_COMMAND: usize = 256;

const SUFFIX: &str = "}:n";

/// What is listened to and what is subscribed.
#[derive(Default)]
struct State {
    /// Keys listened to here, and how many listens each.
    wanted: HashMap<String, usize>,
    /// Keys whose subscription the server confirmed on connection `on`.
    subscribed: HashSet<String>,
    /// The connection (its id, see `redis/link.rs`) the subscriptions are on.
    on: Option<u64>,
    /// Cluster: subscribe every listened key again, subscribed or not.
    again: bool,
    /// Notices may have been missed: `Resync` once the next pass has subscribed.
    missed: bool,
    /// Cluster: unsubscribes sent whose confirmation has not come yet, by channel: a
    /// confirmation nobody asked for means the server dropped the subscription.
    leaving: HashMap<String, usize>,
}

/// The per-key notice subscriptions of one Redis store.
pub(crate) struct Subscriptions {
    link: Arc<Link>,
    /// `{ns:`: a key's channel is `{ns:KEY}:n`.
    prefix: String,
    /// Cluster: shard channels (`SSUBSCRIBE`).
    sharded: bool,
    timeout: Duration,
    state: Mutex<State>,
    /// Wakes the task that subscribes and unsubscribes.
    kick: Notify,
    /// Counts that task's passes: a listen waits for the one that subscribes its key.
    passes: watch::Sender<u64>,
    /// Whether a healing runs (see [`Subscriptions::heal`]).
    healing: AtomicBool,
    notices: broadcast::Sender<Notice>,
}

impl Subscriptions {
    /// The subscriptions of a store under `namespace` on `link`, and the tasks that keep
    /// them and turn push messages into `notices` (abort them when the store goes).
    pub(crate) fn start(
        link: Arc<Link>,
        namespace: &str,
        timeout: Duration,
        notices: broadcast::Sender<Notice>,
    ) -> (Arc<Self>, Vec<JoinHandle<()>>) {
        let this = Arc::new(Self {
            sharded: link.is_cluster(),
            link: link.clone(),
            prefix: format!("{{{namespace}:"),
            timeout,
            state: Mutex::default(),
            kick: Notify::new(),
            passes: watch::channel(0).0,
            healing: AtomicBool::new(false),
            notices,
        });
        let mut tasks = vec![tokio::spawn(this.clone().keep())];
        if let Some(pushes) = link.take_pushes() {
            tasks.push(tokio::spawn(this.clone().hear(pushes)));
        }
        (this, tasks)
    }

    /// The notice channel of `key`.
    pub(crate) fn channel(&self, key: &str) -> String {
        let mut channel = String::with_capacity(self.prefix.len() + key.len() + SUFFIX.len());
        channel.push_str(&self.prefix);
        channel.push_str(key);
        channel.push_str(SUFFIX);
        channel
    }

    /// Whether the scripts publish with `SPUBLISH` (Cluster).
    pub(crate) fn sharded(&self) -> bool {
        self.sharded
    }

    fn key_of<'c>(&self, channel: &'c str) -> Option<&'c str> {
        channel.strip_prefix(&self.prefix)?.strip_suffix(SUFFIX)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One more listen of `key`, counted now (not when the future is first polled);
    /// the future completes once the key's subscription is confirmed, or after the
    /// store timeout (logged: the subscription is still made as soon as Redis answers,
    /// followed by `Resync`).
    pub(crate) fn listen(self: &Arc<Self>, key: &str) -> impl Future<Output = ()> + Send + 'static {
        let mut passes = self.passes.subscribe();
        let subscribed = {
            let mut state = self.state();
            *state.wanted.entry(key.to_owned()).or_default() += 1;
            state.subscribed.contains(key)
        };
        if !subscribed {
            self.kick.notify_one();
        }
        let this = self.clone();
        let key = key.to_owned();
        async move {
            if subscribed {
                return;
            }
            let confirmed = async {
                loop {
                    {
                        let state = this.state();
                        if state.subscribed.contains(&key) || !state.wanted.contains_key(&key) {
                            return;
                        }
                    }
                    if passes.changed().await.is_err() {
                        return;
                    }
                }
            };
            if tokio::time::timeout(this.timeout, confirmed).await.is_err() {
                this.state().missed = true;
                tracing::warn!(%key, "subscribing to the key's notices takes long; its waiters look again once it is made");
            }
        }
    }

    /// One listen of `key` fewer; the last one unsubscribes.
    pub(crate) fn unlisten(&self, key: &str) {
        let mut state = self.state();
        let Some(n) = state.wanted.get_mut(key) else {
            return;
        };
        *n -= 1;
        if *n == 0 {
            state.wanted.remove(key);
            drop(state);
            // Even when not subscribed yet: a pass under way may be subscribing it.
            self.kick.notify_one();
        }
    }

    /// The task that makes the subscriptions follow the listens: a pass whenever a
    /// listen or an unlisten asks for one or the shared connection changes, again with
    /// backoff while passes fail.
    async fn keep(self: Arc<Self>) {
        let mut changes = self.link.changes();
        // One log line when passes start failing and one when they work again.
        let mut failing = Streak::default();
        loop {
            tokio::select! {
                _ = self.kick.notified() => {}
                changed = changes.changed() => if changed.is_err() { return },
            }
            let mut backoff = RETRY_MIN;
            loop {
                let result = self.pass().await;
                self.passes.send_modify(|n| *n += 1);
                match result {
                    Ok(()) => {
                        if let Some((failures, took)) = failing.recovered() {
                            tracing::info!(failures, ?took, "subscribing to notices works again");
                        }
                        break;
                    }
                    Err(e) if failing.failed() => {
                        tracing::warn!(error = %e, "subscribing to notices failed; retrying until it works (waiters look again at their keys' expiry meanwhile)")
                    }
                    Err(e) => tracing::debug!(error = %e, "subscribing to notices failed again"),
                }
                // Backoff between attempts on an unreachable Redis, not a wait for a
                // lock; listens give up waiting at their own timeout meanwhile.
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(RETRY_MAX);
            }
        }
    }

    /// Subscribes the keys listened to and not subscribed, unsubscribes the keys
    /// subscribed and no longer listened to, then sends `Resync` if notices may have
    /// been missed.
    async fn pass(&self) -> Result<(), StoreError> {
        {
            let mut state = self.state();
            if state.on.is_some() && self.link.current() != state.on {
                // The connection is gone, and its subscriptions with it.
                state.on = None;
                self.lost(&mut state);
            }
            if state.wanted.is_empty() && state.subscribed.is_empty() {
                state.missed = false;
                return Ok(());
            }
        }
        let connect = self.link.connection_with_id();
        let (conn, id) = match tokio::time::timeout(self.timeout, connect).await {
            Ok(made) => made?,
            Err(_) => return Err(self.timed_out(None)),
        };
        let (join, leave) = {
            let mut state = self.state();
            if state.on != Some(id) {
                state.on = Some(id);
                self.lost(&mut state);
            }
            let again = std::mem::take(&mut state.again);
            let join: Vec<String> = (state.wanted.keys())
                .filter(|k| again || !state.subscribed.contains(*k))
                .cloned()
                .collect();
            let leave: Vec<String> = (state.subscribed.iter())
                .filter(|k| !state.wanted.contains_key(*k))
                .cloned()
                .collect();
            // Not subscribed from now on: a listen that comes meanwhile waits for the
            // next pass to subscribe again rather than trust a leaving subscription.
            for key in &leave {
                state.subscribed.remove(key);
                if self.sharded {
                    *state.leaving.entry(self.channel(key)).or_default() += 1;
                }
            }
            (join, leave)
        };
        match tokio::time::timeout(self.timeout, self.send(conn, id, &join, &leave)).await {
            Ok(sent) => sent?,
            Err(_) => return Err(self.timed_out(Some(id))),
        }
        let missed = std::mem::take(&mut self.state().missed);
        if missed {
            tracing::debug!("subscribed again; waiters look again");
            let _ = self.notices.send(Notice::Resync);
        }
        Ok(())
    }

    /// The subscriptions in `state` are gone: listened keys may have missed notices.
    fn lost(&self, state: &mut State) {
        if !state.subscribed.is_empty() {
            state.missed = true;
        }
        state.subscribed.clear();
        state.leaving.clear();
    }

    /// A pass that timed out, on connection `on` if it had one by then.
    fn timed_out(&self, on: Option<u64>) -> StoreError {
        // As a request that timed out: the connection may be broken.
        if let Some(id) = on {
            self.link.forget(id);
        }
        StoreError::Unavailable(format!("no answer within {:?}", self.timeout))
    }

    fn failed(&self, on: u64, e: RedisError) -> StoreError {
        self.link.failed(on, &e);
        StoreError::Unavailable(e.to_string())
    }

    /// Sends the subscribes and unsubscribes of one pass; records each one confirmed.
    async fn send(
        &self,
        conn: Conn,
        on: u64,
        join: &[String],
        leave: &[String],
    ) -> Result<(), StoreError> {
        match conn {
            Conn::Single(mut conn) => {
                for keys in join.chunks(CHANNELS_PER_COMMAND) {
                    let channels: Vec<String> = keys.iter().map(|k| self.channel(k)).collect();
                    conn.subscribe(&channels)
                        .await
                        .map_err(|e| self.failed(on, e))?;
                    self.state().subscribed.extend(keys.iter().cloned());
                }
                for keys in leave.chunks(CHANNELS_PER_COMMAND) {
                    let channels: Vec<String> = keys.iter().map(|k| self.channel(k)).collect();
                    if let Err(e) = conn.unsubscribe(&channels).await {
                        self.still_subscribed(keys);
                        return Err(self.failed(on, e));
                    }
                }
                Ok(())
            }
            Conn::Cluster(conn) => {
                // One command per key: channels of different slots cannot share one.
                let joins = join.iter().map(|key| {
                    let (mut conn, channel) = (conn.clone(), self.channel(key));
                    async move { conn.ssubscribe(&channel).await }
                });
                let leaves = leave.iter().map(|key| {
                    let (mut conn, channel) = (conn.clone(), self.channel(key));
                    async move { conn.sunsubscribe(&channel).await }
                });
                let (joined, left) = tokio::join!(join_all(joins), join_all(leaves));
                let mut error = None;
                for (key, result) in join.iter().zip(joined) {
                    match result {
                        Ok(()) => {
                            self.state().subscribed.insert(key.clone());
                        }
                        Err(e) => error = Some(e),
                    }
                }
                for (key, result) in leave.iter().zip(left) {
                    if let Err(e) = result {
                        self.still_subscribed(std::slice::from_ref(key));
                        error = Some(e);
                    }
                }
                error.map_or(Ok(()), |e| Err(StoreError::Unavailable(e.to_string())))
            }
        }
    }
}
