//! Redis through redis-rs: standalone, Sentinel or Cluster (see `redis/options.rs` for
//! the URLs). Every state change is one Lua script from `lua/`, run by EVALSHA (loaded
//! again on NOSCRIPT). The key layout is documented at the top of `lua/common.lua`; all
//! keys of one lock share the hash tag `{ns:KEY}`, so every script touches one slot.
//!
//! Requests share one connection (`redis/link.rs`); notices come on the same connection,
//! from subscriptions to the channels of the keys this sidecar listens to
//! (`redis/subscriptions.rs`). Batched renewals are in `redis/renew.rs` (grouped by
//! Cluster slot, `redis/slots.rs`), replica acknowledgement in `redis/acked.rs`.

mod acked;
mod link;
mod options;
mod renew;
mod slots;
mod subscriptions;

use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis::{self, Script, Value};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

pub use options::RedisOptions;

use super::{
    Acquired, Claim, HolderState, KeyState, Notice, QueuedState, Renewal, Renewed, Sharing, Store,
    StoreError, StoreFuture,
};
use link::{Conn, Link};
use options::Topology;
use subscriptions::Subscriptions;

macro_rules! script {
    ($file:literal) => {
        Script::new(concat!(
            include_str!("../lua/common.lua"),
            include_str!(concat!("../lua/", $file))
        ))
    };
}

/// How many notices a slow sidecar task may fall behind before it resyncs.
const NOTICE_BUFFER: usize = 4096;

struct Scripts {
    acquire: Script,
    hold: Script,
    release: Script,
    renew: Script,
    /// `renew_across.lua`, flagged `allow-cross-slot-keys` (Redis 7): on a Cluster, one
    /// call renews the grants of many slots served by one node.
    renew_across_slots: Script,
    unwait: Script,
    describe: Script,
    fence: Script,
}

/// Replica acknowledgement settings (see `redis/acked.rs`).
struct Acks {
    /// Replicas that must acknowledge; 0: no `WAIT`.
    min: u32,
    timeout: Duration,
}

/// The Redis store.
pub struct RedisStore {
    /// `redis`, `redis_sentinel` or `redis_cluster` (see [`Store::kind`]).
    kind: &'static str,
    acks: Acks,
    link: Arc<Link>,
    namespace: String,
    /// A notice channel per key, subscribed while listened to.
    subscriptions: Arc<Subscriptions>,
    /// Cluster: which node serves each slot, for grouping renewals (`redis/renew.rs`).
    slot_map: Arc<renew::SlotMap>,
    timeout: Duration,
    scripts: Scripts,
    notices: broadcast::Sender<Notice>,
    /// The tasks of the subscriptions.
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for RedisStore {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may carry a password: never print it.
        f.debug_struct("RedisStore")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

impl RedisStore {
    /// Connects lazily to `url`; keys live under `namespace`; every call gives up after
    /// `timeout`. Must be called inside a tokio runtime.
    pub fn new(url: &str, namespace: &str, timeout: Duration) -> Result<Self, StoreError> {
        let options = RedisOptions {
            timeout,
            ..RedisOptions::default()
        };
        Self::with_options(url, namespace, &options)
    }

    /// Connects lazily to `url` with `options` (certificates, replica acknowledgement).
    /// Must be called inside a tokio runtime.
    pub fn with_options(
        url: &str,
        namespace: &str,
        options: &RedisOptions,
    ) -> Result<Self, StoreError> {
        let topology = Topology::parse(url, options)?;
        if options.min_replica_acks > 0 && options.replica_ack_timeout >= options.timeout {
            return Err(StoreError::Config(
                "the replica acknowledgement timeout must be shorter than the store timeout".into(),
            ));
        }
        let kind = match topology {
            Topology::Standalone(_) => "redis",
            Topology::Sentinel { .. } => "redis_sentinel",
            Topology::Cluster { .. } => "redis_cluster",
        };
        let link = Arc::new(Link::new(topology, options.timeout)?);
        let notices = broadcast::channel(NOTICE_BUFFER).0;
        let (subscriptions, tasks) =
            Subscriptions::start(link.clone(), namespace, options.timeout, notices.clone());
        Ok(Self {
            kind,
            acks: Acks {
                min: options.min_replica_acks,
                timeout: options.replica_ack_timeout,
            },
            link,
            namespace: namespace.to_owned(),
            subscriptions,
            slot_map: Arc::default(),
            timeout: options.timeout,
            scripts: Scripts {
                acquire: script!("acquire.lua"),
                hold: script!("hold.lua"),
                release: script!("release.lua"),
                renew: Script::new(renew::RENEW_LUA),
                renew_across_slots: Script::new(renew::RENEW_ACROSS_LUA),
                unwait: script!("unwait.lua"),
                describe: script!("describe.lua"),
                fence: script!("fence.lua"),
            },
            notices,
            tasks,
        })
    }

    /// Raises the fencing counter of `key` to `fence` when it is lower (Redlock writes
    /// a majority's token back this way; see `redlock.rs`).
    pub async fn raise_fence(&self, key: &str, fence: u64) -> Result<(), StoreError> {
        let fence = fence.to_string();
        let _: i64 = self.invoke(&self.scripts.fence, key, &[&fence]).await?;
        Ok(())
    }

    /// The Redis key of one part of a lock (see `lua/common.lua`).
    fn key(&self, key: &str, part: &str) -> String {
        format!("{{{}:{}}}:{}", self.namespace, key, part)
    }

    /// Where the scripts publish the notices of `key` (its own channel `{ns:KEY}:n`),
    /// and whether with `SPUBLISH` ("1": a shard channel, Cluster) or `PUBLISH` ("0").
    fn notice_channel(&self, key: &str) -> (String, &'static str) {
        let sharded = if self.subscriptions.sharded() {
            "1"
        } else {
            "0"
        };
        (self.subscriptions.channel(key), sharded)
    }

    /// Registers this sidecar in the store as a watcher of `key` ('@<sidecar id>' in
    /// `{ns:KEY}:w`, with an expiry, refreshed while it watches), so that the key's
    /// changes are published while nobody waits for it. The lead fills this in with
    /// the data model's v2 scripts (`/work/notes/DATAMODEL.md`); until then a watch
    /// subscribes only, and hears the notices that waiters make the scripts publish.
    async fn register_watcher(&self, _key: &str) -> Result<(), StoreError> {
        Ok(())
    }

    fn keys(&self, key: &str) -> [String; 6] {
        ["h", "d", "f", "w", "q", "x"].map(|part| self.key(key, part))
    }

    /// Runs `f` on the shared connection within the timeout. On a broken connection, a
    /// server that is no longer the master, or a timeout, the connection is dropped, so
    /// the next call takes a fresh one (after a failover: to the new master).
    async fn run<T, F, Fut>(&self, f: F) -> Result<T, StoreError>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let attempt = async {
            let conn = self.link.connection().await?;
            f(conn).await.map_err(|e| {
                self.link.failed(&e);
                unavailable(e)
            })
        };
        match tokio::time::timeout(self.timeout, attempt).await {
            Ok(result) => result,
            Err(_) => {
                self.link.forget();
                Err(StoreError::Unavailable(format!(
                    "no answer within {:?}",
                    self.timeout
                )))
            }
        }
    }

    async fn invoke<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        key: &str,
        args: &[&str],
    ) -> Result<T, StoreError> {
        let keys = self.keys(key);
        self.run(|mut conn| async move {
            let mut call = script.prepare_invoke();
            for k in &keys {
                call.key(k);
            }
            for a in args {
                call.arg(*a);
            }
            call.invoke_async(&mut conn).await
        })
        .await
    }
}

fn ms(d: Duration) -> String {
    d.as_millis().to_string()
}

fn int(v: &Value) -> Result<i64, StoreError> {
    match v {
        Value::Int(n) => Ok(*n),
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| StoreError::Protocol("expected a number".into())),
        other => Err(StoreError::Protocol(format!(
            "expected a number, got {other:?}"
        ))),
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(n) => n.to_string(),
        _ => String::new(),
    }
}

fn sharing(letter: &str) -> Option<Sharing> {
    match letter {
        "x" => Some(Sharing::Exclusive),
        "s" => Some(Sharing::Shared),
        _ => None,
    }
}

fn held_count(n: i64) -> Option<u32> {
    u32::try_from(n).ok()
}

impl Store for RedisStore {
    fn acquire<'a>(&'a self, claim: &'a Claim) -> StoreFuture<'a, Acquired> {
        Box::pin(async move {
            let ttl = ms(claim.ttl);
            let flag = |on: bool| if on { "1" } else { "0" };
            let limit = claim.limit.to_string();
            let waiter = claim.waiter();
            let (channel, sharded) = self.notice_channel(&claim.key);
            let args = [
                claim.owner.as_str(),
                &ttl,
                flag(claim.wait),
                &claim.session_id,
                &claim.client_name,
                claim.sharing.letter(),
                &limit,
                flag(claim.fair),
                &waiter,
                &channel,
                &claim.key,
                sharded,
            ];
            let reply: Vec<Value> = if self.acks.min == 0 {
                self.invoke(&self.scripts.acquire, &claim.key, &args)
                    .await?
            } else {
                let keys = self.keys(&claim.key);
                let (reply, acked) = self
                    .invoke_acked(&self.scripts.acquire, &keys, &args)
                    .await?;
                let reply: Vec<Value> = redis::FromRedisValue::from_redis_value(reply)
                    .map_err(|e| StoreError::Protocol(e.to_string()))?;
                if !acked && matches!(reply.first(), Some(Value::Int(1))) {
                    // Not on enough replicas: a failover could hand it out again. Undo
                    // it rather than hand out a grant that is not safe.
                    let _ = self
                        .release(&claim.key, &claim.owner, 0, Duration::ZERO)
                        .await;
                    return Err(StoreError::Unavailable(format!(
                        "the grant was not acknowledged by {} replicas within {:?}",
                        self.acks.min, self.acks.timeout
                    )));
                }
                reply
            };
            match reply.as_slice() {
                [code, fence] if int(code)? == 1 => Ok(Acquired::Granted {
                    fence: int(fence)? as u64,
                }),
                [code, limit] if int(code)? == 2 => Ok(Acquired::Conflict {
                    limit: int(limit)?.max(0) as u32,
                }),
                [_, look, position] => Ok(Acquired::Busy {
                    expires_in: Duration::from_millis(int(look)?.max(0) as u64),
                    position: int(position)?.max(0) as u32,
                }),
                _ => Err(StoreError::Protocol("acquire: bad reply".into())),
            }
        })
    }

    fn hold<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        count: u32,
        ttl: Duration,
    ) -> StoreFuture<'a, Option<u32>> {
        Box::pin(async move {
            let count = count.to_string();
            let n: i64 = self
                .invoke(&self.scripts.hold, key, &[owner, &count, &ms(ttl)])
                .await?;
            Ok(held_count(n))
        })
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        count: u32,
        delay: Duration,
    ) -> StoreFuture<'a, Option<u32>> {
        Box::pin(async move {
            let count = count.to_string();
            let (channel, sharded) = self.notice_channel(key);
            let args = [owner, &count, &channel, key, &ms(delay), sharded];
            let n: i64 = self.invoke(&self.scripts.release, key, &args).await?;
            Ok(held_count(n))
        })
    }

    fn renew<'a>(&'a self, batch: &'a [Renewal<'a>]) -> StoreFuture<'a, Vec<Renewed>> {
        Box::pin(self.renew_batch(batch))
    }

    fn unwait<'a>(&'a self, claim: &'a Claim) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let waiter = claim.waiter();
            let (channel, sharded) = self.notice_channel(&claim.key);
            let args = [waiter.as_str(), &channel, &claim.key, sharded];
            self.invoke::<i64>(&self.scripts.unwait, &claim.key, &args)
                .await
                .map(drop)
        })
    }

    fn describe<'a>(&'a self, key: &'a str) -> StoreFuture<'a, KeyState> {
        Box::pin(async move {
            let reply: Vec<Value> = self.invoke(&self.scripts.describe, key, &[]).await?;
            let bad = || StoreError::Protocol("describe: bad reply".into());
            let [fence, waiters, mode, limit, count, rest @ ..] = reply.as_slice() else {
                return Err(bad());
            };
            let count = usize::try_from(int(count)?).map_err(|_| bad())?;
            if rest.len() < count * 5 {
                return Err(bad());
            }
            let (holders, queue) = rest.split_at(count * 5);
            let holders = holders
                .chunks_exact(5)
                .map(|h| {
                    Ok(HolderState {
                        session_id: text(&h[0]),
                        client_name: text(&h[1]),
                        hold_count: int(&h[2])?.max(0) as u32,
                        ttl_remaining: Duration::from_millis(int(&h[3])?.max(0) as u64),
                        fence: int(&h[4])? as u64,
                        value: Vec::new(),
                    })
                })
                .collect::<Result<Vec<_>, StoreError>>()?;
            let queue = queue
                .chunks_exact(3)
                .map(|w| QueuedState {
                    sharing: sharing(&text(&w[0])).unwrap_or(Sharing::Exclusive),
                    session_id: text(&w[1]),
                    client_name: text(&w[2]),
                })
                .collect();
            Ok(KeyState {
                holders,
                sharing: sharing(&text(mode)),
                limit: int(limit)?.max(0) as u32,
                waiters: int(waiters)?.max(0) as u32,
                queue,
                fence: int(fence)? as u64,
            })
        })
    }

    fn proclaim<'a>(
        &'a self,
        _key: &'a str,
        _owner: &'a str,
        _value: &'a [u8],
    ) -> StoreFuture<'a, bool> {
        // Values come with the store's second data model (issue 14).
        Box::pin(std::future::ready(Err(StoreError::Unavailable(
            "holder values are not stored by this store yet".into(),
        ))))
    }

    fn listen<'a>(&'a self, key: &'a str, watch: bool) -> StoreFuture<'a, ()> {
        // Counted now, so that an unlisten matches it even if this future is dropped.
        let subscribed = self.subscriptions.listen(key);
        Box::pin(async move {
            if watch && let Err(e) = self.register_watcher(key).await {
                tracing::warn!(%key, error = %e, "registering as the key's watcher failed");
            }
            subscribed.await;
            Ok(())
        })
    }

    fn unlisten(&self, key: &str, _watch: bool) {
        self.subscriptions.unlisten(key);
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            self.run(|mut conn| async move {
                redis::cmd("PING").query_async::<String>(&mut conn).await
            })
            .await?;
            Ok(())
        })
    }

    fn notices(&self) -> broadcast::Receiver<Notice> {
        self.notices.subscribe()
    }

    fn kind(&self) -> &'static str {
        self.kind
    }
}
