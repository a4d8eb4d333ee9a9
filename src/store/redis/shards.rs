//! Redis Cluster: hash slots, and release notices on sharded pub/sub.
//!
//! On a Cluster a plain `PUBLISH` goes to every node and every subscriber: each release
//! would wake every sidecar of the cluster. Instead each lock has its own shard channel
//! `{ns:KEY}:n` (same hash tag, so the scripts `SPUBLISH` to it from the lock's slot),
//! and a sidecar `SSUBSCRIBE`s only to the keys it has waiters for: from before a
//! waiting acquire is sent (so a release between the busy answer and the subscription
//! cannot be missed) until the waiter is granted or leaves. The cluster connection
//! re-subscribes by itself after a reconnection or a slot map change; every
//! re-subscription, and every subscription the server drops (its slot moved), is
//! followed by a wake of that key's waiters here, since notices may have been missed.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use deadpool_redis::redis::{PushInfo, PushKind, Value};
use tokio::sync::{OnceCell, broadcast, mpsc};
use tokio::time::Instant;

use super::link::{Conn, Link};
use crate::store::{Notice, StoreError};

/// The Cluster hash slot of a Redis key: CRC16 (XMODEM) of its hash tag (the part
/// between the first `{` and the next `}`, when not empty) or of the whole key, mod 16384.
pub(crate) fn slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16(tagged.unwrap_or(bytes)) % 16384
}

fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// One key this sidecar waits on: its waiters (owner → when its registration in the
/// store expires unless refreshed) and its subscription, made once.
#[derive(Default)]
struct Wanted {
    owners: HashMap<String, Instant>,
    subscribed: Arc<OnceCell<()>>,
}

/// The shard channels this sidecar wants, by lock key.
pub(crate) struct Shards {
    link: Arc<Link>,
    /// `{ns:` and `}:n`: a channel is `{ns:KEY}:n`.
    prefix: String,
    wanted: Mutex<HashMap<String, Wanted>>,
    /// Channels whose subscription the server has confirmed once: a second confirmation
    /// is a re-subscription.
    confirmed: Mutex<HashSet<String>>,
    /// Whether a healing pass runs (see [`Shards::heal`]).
    healing: AtomicBool,
}

/// When to subscribe again after the topology moved: soon, then as the slot maps of
/// the nodes and of the connection converge (a coordinated failover takes ~100 ms, an
/// automatic one ~2 s before it starts).
const HEAL_PAUSES: [Duration; 4] = [
    Duration::from_millis(100),
    Duration::from_millis(300),
    Duration::from_millis(1000),
    Duration::from_millis(2000),
];

const SUFFIX: &str = "}:n";

impl Shards {
    pub(crate) fn new(link: Arc<Link>, namespace: &str) -> Self {
        Self {
            link,
            prefix: format!("{{{namespace}:"),
            wanted: Mutex::new(HashMap::new()),
            confirmed: Mutex::new(HashSet::new()),
            healing: AtomicBool::new(false),
        }
    }

    /// The shard channel of `key`.
    pub(crate) fn channel(&self, key: &str) -> String {
        format!("{}{key}{SUFFIX}", self.prefix)
    }

    fn key_of<'c>(&self, channel: &'c str) -> Option<&'c str> {
        channel.strip_prefix(&self.prefix)?.strip_suffix(SUFFIX)
    }

    fn wanted(&self) -> MutexGuard<'_, HashMap<String, Wanted>> {
        self.wanted.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn confirmed(&self) -> MutexGuard<'_, HashSet<String>> {
        self.confirmed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records `owner` as a waiter of `key` for `ttl` and makes sure this sidecar is
    /// subscribed to the key's channel before returning (or `timeout` has passed). A
    /// subscription that fails is not fatal: the waiter still looks again at its
    /// deadlines, only later.
    pub(crate) async fn want(&self, key: &str, owner: &str, ttl: Duration, timeout: Duration) {
        let subscribed = {
            let mut wanted = self.wanted();
            let now = Instant::now();
            let entry = wanted.entry(key.to_owned()).or_default();
            // A waiter whose registration expired was abandoned without an unwait.
            entry.owners.retain(|_, until| *until > now);
            entry.owners.insert(owner.to_owned(), now + ttl);
            entry.subscribed.clone()
        };
        let channel = self.channel(key);
        let subscribe = subscribed.get_or_try_init(|| async {
            match self.link.connection().await? {
                Conn::Cluster(mut conn) => conn
                    .ssubscribe(&channel)
                    .await
                    .map_err(|e| StoreError::Unavailable(e.to_string())),
                Conn::Single(_) => Ok(()),
            }
        });
        let made = match tokio::time::timeout(timeout, subscribe).await {
            Ok(made) => made.map(drop),
            Err(_) => Err(StoreError::Unavailable(format!(
                "no answer within {timeout:?}"
            ))),
        };
        if let Err(e) = made {
            tracing::warn!(error = %e, %key, "subscribing to the key's release notices failed");
        }
    }

    /// `owner` no longer waits on `key` (granted, gave up, or cancelled); the last one
    /// leaving unsubscribes.
    pub(crate) fn unwant(&self, key: &str, owner: &str) {
        let mut wanted = self.wanted();
        let Some(entry) = wanted.get_mut(key) else {
            return;
        };
        let now = Instant::now();
        entry.owners.remove(owner);
        entry.owners.retain(|_, until| *until > now);
        if !entry.owners.is_empty() {
            return;
        }
        let was_subscribed = entry.subscribed.initialized();
        wanted.remove(key);
        drop(wanted);
        if was_subscribed {
            let link = self.link.clone();
            let channel = self.channel(key);
            tokio::spawn(async move {
                if let Ok(Conn::Cluster(mut conn)) = link.connection().await {
                    let _ = conn.sunsubscribe(&channel).await;
                }
            });
        }
    }

    /// The waiters of `key` here, to wake them all.
    fn owners(&self, key: &str) -> Option<Vec<String>> {
        let wanted = self.wanted();
        let entry = wanted.get(key)?;
        Some(entry.owners.keys().cloned().collect())
    }

    /// A subscription the server confirmed: the first one for a channel is the one this
    /// sidecar asked for; any later one is a re-subscription, after which the key's
    /// waiters look again.
    fn subscribed(&self, channel: &str, notices: &broadcast::Sender<Notice>) {
        let Some(key) = self.key_of(channel) else {
            return;
        };
        let Some(owners) = self.owners(key) else {
            return;
        };
        if !self.confirmed().insert(channel.to_owned()) {
            tracing::debug!(%key, "re-subscribed to a key's release notices");
            let _ = notices.send(Notice::Released {
                key: key.to_owned(),
                owners,
            });
        }
    }

    /// The server dropped a subscription: this sidecar asked for it, or the slot moved
    /// to another node. A key still waited on is subscribed again (see [`Self::heal`]).
    fn unsubscribed(self: &Arc<Self>, channel: &str, notices: &broadcast::Sender<Notice>) {
        self.confirmed().remove(channel);
        let wanted = self
            .key_of(channel)
            .is_some_and(|key| self.wanted().contains_key(key));
        if wanted {
            tracing::info!(%channel, "a release notice subscription moved; subscribing again");
            self.heal(notices);
        }
    }

    /// After a failover or a slot migration the cluster connection re-subscribes by
    /// itself, but its slot map may lag behind the cluster's for a moment, and a
    /// subscription made on a node that is losing the slot may be dropped again. So
    /// every key still waited on is subscribed again a few times while the topology
    /// settles (SSUBSCRIBE is idempotent per node), and its waiters look again after
    /// each pass: their acquires also move the slot map forward (MOVED). One healing at
    /// a time; waiters keep their own deadlines meanwhile, so this is about latency only.
    pub(crate) fn heal(self: &Arc<Self>, notices: &broadcast::Sender<Notice>) {
        if self.healing.swap(true, Ordering::AcqRel) {
            return;
        }
        let shards = self.clone();
        let notices = notices.clone();
        tokio::spawn(async move {
            for pause in HEAL_PAUSES {
                // Time for the cluster to settle, not a wait for an event we could see.
                tokio::time::sleep(pause).await;
                let keys: Vec<(String, Vec<String>)> = shards
                    .wanted()
                    .iter()
                    .map(|(key, w)| (key.clone(), w.owners.keys().cloned().collect()))
                    .collect();
                if let Ok(Conn::Cluster(conn)) = shards.link.connection().await {
                    let subscriptions = keys.iter().map(|(key, _)| {
                        let mut conn = conn.clone();
                        let channel = shards.channel(key);
                        async move { conn.ssubscribe(&channel).await }
                    });
                    for result in futures_util::future::join_all(subscriptions).await {
                        if let Err(e) = result {
                            tracing::debug!(error = %e, "subscribing again failed");
                        }
                    }
                }
                for (key, owners) in keys {
                    let _ = notices.send(Notice::Released { key, owners });
                }
            }
            shards.healing.store(false, Ordering::Release);
        });
    }
}

fn text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// Turns the cluster connection's push messages into notices until the store goes.
pub(crate) async fn listen(
    mut pushes: mpsc::UnboundedReceiver<PushInfo>,
    shards: Arc<Shards>,
    notices: broadcast::Sender<Notice>,
) {
    while let Some(push) = pushes.recv().await {
        match push.kind {
            PushKind::SMessage => {
                if let Some(payload) = text(push.data.get(1)) {
                    let _ = notices.send(Notice::parse(&payload));
                }
            }
            PushKind::SSubscribe => {
                if let Some(channel) = text(push.data.first()) {
                    shards.subscribed(&channel, &notices);
                }
            }
            PushKind::SUnsubscribe => {
                if let Some(channel) = text(push.data.first()) {
                    shards.unsubscribed(&channel, &notices);
                }
            }
            PushKind::Disconnection => {
                // Releases on that node were missed until the connection re-subscribes.
                tracing::debug!("a cluster node connection dropped");
                let _ = notices.send(Notice::Resync);
                shards.heal(&notices);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_hash_tag() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("{user1000}.following"), slot("user1000"));
        assert_eq!(slot("{ns:k}:h"), slot("{ns:k}:n"));
        assert_eq!(
            slot("{}x"),
            slot("{}x"),
            "an empty tag hashes the whole key"
        );
        assert_ne!(slot("{}a"), slot("{}b"));
    }
}
