//! Redis standalone through deadpool-redis. Every state change is one Lua script from
//! `lua/`, run by EVALSHA (loaded again on NOSCRIPT). The key layout is documented at the
//! top of `lua/common.lua`; all keys of one lock share the hash tag `{ns:KEY}`.
//!
//! Requests share one multiplexed connection taken from the pool: redis-rs pipelines
//! concurrent requests on it, and the pool's per-checkout PING is paid only when the
//! connection is replaced after an error, not once per lock operation.
//! Release notices come from one pub/sub subscription per sidecar.

use std::sync::Mutex;
use std::time::Duration;

use deadpool_redis::redis::aio::MultiplexedConnection;
use deadpool_redis::redis::io::tcp::TcpSettings;
use deadpool_redis::redis::{self, IntoConnectionInfo, Script, Value};
use deadpool_redis::{Manager, Pool, Runtime};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;

use super::{
    Acquired, Claim, HolderState, KeyState, Notice, QueuedState, Renewal, Sharing, Store,
    StoreError, StoreFuture,
};

macro_rules! script {
    ($file:literal) => {
        Script::new(concat!(
            include_str!("lua/common.lua"),
            include_str!(concat!("lua/", $file))
        ))
    };
}

/// Grants per script call in a renewal batch: large enough that 10,000 locks take ten
/// calls pipelined in one round trip, small enough that one call does not stall Redis
/// (about a millisecond each).
const RENEW_CHUNK: usize = 1000;

/// Connections the pool may open. Requests share one multiplexed connection; the pool
/// replaces it after an error and serves the few callers that race the replacement.
const POOL_SIZE: usize = 4;

/// How many notices a slow sidecar task may fall behind before it resyncs.
const NOTICE_BUFFER: usize = 4096;

/// Reconnect backoff of the pub/sub subscription.
const RESUBSCRIBE_MIN: Duration = Duration::from_millis(50);
const RESUBSCRIBE_MAX: Duration = Duration::from_secs(2);

struct Scripts {
    acquire: Script,
    hold: Script,
    release: Script,
    renew: Script,
    unwait: Script,
    describe: Script,
    fence: Script,
}

/// The Redis standalone store.
pub struct RedisStore {
    pool: Pool,
    conn: Mutex<Option<MultiplexedConnection>>,
    namespace: String,
    channel: String,
    timeout: Duration,
    scripts: Scripts,
    notices: broadcast::Sender<Notice>,
    listener: JoinHandle<()>,
}

impl Drop for RedisStore {
    fn drop(&mut self) {
        self.listener.abort();
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
    /// Connects lazily to `url` (`redis://` or `rediss://`); keys live under `namespace`;
    /// every call gives up after `timeout`. Must be called inside a tokio runtime.
    pub fn new(url: &str, namespace: &str, timeout: Duration) -> Result<Self, StoreError> {
        let config = |e: redis::RedisError| StoreError::Config(e.to_string());
        // Nagle's algorithm would hold back the second of two pipelined requests until
        // the first is acknowledged; lock handoffs are latency-bound.
        let info = url
            .into_connection_info()
            .map_err(config)?
            .set_tcp_settings(TcpSettings::default().set_nodelay(true));
        let client = redis::Client::open(info.clone()).map_err(config)?;
        let pool = Pool::builder(Manager::new(info).map_err(config)?)
            .max_size(POOL_SIZE)
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| StoreError::Config(e.to_string()))?;
        let channel = format!("{namespace}:released");
        let notices = broadcast::channel(NOTICE_BUFFER).0;
        let listener = tokio::spawn(listen(client, channel.clone(), notices.clone()));
        Ok(Self {
            pool,
            conn: Mutex::new(None),
            namespace: namespace.to_owned(),
            channel,
            timeout,
            scripts: Scripts {
                acquire: script!("acquire.lua"),
                hold: script!("hold.lua"),
                release: script!("release.lua"),
                renew: script!("renew.lua"),
                unwait: script!("unwait.lua"),
                describe: script!("describe.lua"),
                fence: script!("fence.lua"),
            },
            notices,
            listener,
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

    fn keys(&self, key: &str) -> [String; 6] {
        ["h", "d", "f", "w", "q", "x"].map(|part| self.key(key, part))
    }

    async fn connection(&self) -> Result<MultiplexedConnection, StoreError> {
        if let Some(conn) = self.lock_conn().as_ref() {
            return Ok(conn.clone());
        }
        // Boxed: the pool's future is large and rarely needed, and every in-flight call
        // would otherwise carry its size (7 KB per call before, a 100 MB peak with 10,000
        // acquires in flight).
        Box::pin(self.fresh_connection()).await
    }

    async fn fresh_connection(&self) -> Result<MultiplexedConnection, StoreError> {
        let pooled = self.pool.get().await.map_err(unavailable)?;
        let conn = deadpool_redis::Connection::take(pooled);
        *self.lock_conn() = Some(conn.clone());
        Ok(conn)
    }

    fn lock_conn(&self) -> std::sync::MutexGuard<'_, Option<MultiplexedConnection>> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the shared connection within the timeout. On a broken connection or a
    /// timeout the connection is dropped, so the next call takes a fresh one.
    async fn run<T, F, Fut>(&self, f: F) -> Result<T, StoreError>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let attempt = async {
            let conn = self.connection().await?;
            f(conn).await.map_err(|e| {
                if e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error() {
                    self.lock_conn().take();
                }
                unavailable(e)
            })
        };
        match tokio::time::timeout(self.timeout, attempt).await {
            Ok(result) => result,
            Err(_) => {
                self.lock_conn().take();
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
                &self.channel,
                &claim.key,
            ];
            let reply: Vec<Value> = self
                .invoke(&self.scripts.acquire, &claim.key, &args)
                .await?;
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
        ttl: Duration,
    ) -> StoreFuture<'a, Option<u32>> {
        Box::pin(async move {
            let n: i64 = self
                .invoke(&self.scripts.hold, key, &[owner, &ms(ttl)])
                .await?;
            Ok(held_count(n))
        })
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        all: bool,
        delay: Duration,
    ) -> StoreFuture<'a, Option<u32>> {
        Box::pin(async move {
            let all = if all { "1" } else { "0" };
            let args = [owner, all, &self.channel, key, &ms(delay)];
            let n: i64 = self.invoke(&self.scripts.release, key, &args).await?;
            Ok(held_count(n))
        })
    }

    fn renew<'a>(&'a self, batch: &'a [Renewal<'a>]) -> StoreFuture<'a, Vec<bool>> {
        Box::pin(async move {
            if batch.is_empty() {
                return Ok(Vec::new());
            }
            let script = &self.scripts.renew;
            let calls: Vec<_> = batch
                .chunks(RENEW_CHUNK)
                .map(|chunk| {
                    let mut call = script.prepare_invoke();
                    for r in chunk {
                        call.key(self.key(r.key, "h")).key(self.key(r.key, "d"));
                        call.arg(r.owner).arg(r.ttl.as_millis() as u64);
                    }
                    call
                })
                .collect();
            let replies: Vec<Vec<i64>> = self
                .run(|conn| async move {
                    // Concurrent calls on one multiplexed connection go out pipelined:
                    // one round trip for the whole batch.
                    let calls = calls.iter().map(|call| {
                        let mut conn = conn.clone();
                        async move { call.invoke_async::<Vec<i64>>(&mut conn).await }
                    });
                    futures_util::future::join_all(calls)
                        .await
                        .into_iter()
                        .collect::<redis::RedisResult<Vec<_>>>()
                })
                .await?;
            let renewed: Vec<bool> = replies.into_iter().flatten().map(|n| n == 1).collect();
            if renewed.len() != batch.len() {
                return Err(StoreError::Protocol("renew: bad reply".into()));
            }
            Ok(renewed)
        })
    }

    fn unwait<'a>(&'a self, claim: &'a Claim) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let waiter = claim.waiter();
            let args = [waiter.as_str(), &self.channel, &claim.key];
            let _: i64 = self.invoke(&self.scripts.unwait, &claim.key, &args).await?;
            Ok(())
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
}

/// Keeps one subscription to the release channel, reconnecting with backoff. After every
/// (re)subscription it sends `Resync`: releases published while it was away were missed.
async fn listen(client: redis::Client, channel: String, notices: broadcast::Sender<Notice>) {
    let mut backoff = RESUBSCRIBE_MIN;
    loop {
        match client.get_async_pubsub().await {
            Ok(mut pubsub) => match pubsub.subscribe(&channel).await {
                Ok(()) => {
                    backoff = RESUBSCRIBE_MIN;
                    tracing::debug!(%channel, "subscribed to release notices");
                    let _ = notices.send(Notice::Resync);
                    let mut messages = pubsub.on_message();
                    while let Some(msg) = messages.next().await {
                        if let Ok(payload) = msg.get_payload::<String>() {
                            let _ = notices.send(Notice::parse(&payload));
                        }
                    }
                    tracing::warn!("release notice subscription ended; resubscribing");
                }
                Err(e) => tracing::warn!(error = %e, "subscribing to release notices failed"),
            },
            Err(e) => tracing::debug!(error = %e, "release notice connection failed"),
        }
        // Backoff between reconnects to an unreachable Redis (not a wait for a lock).
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(RESUBSCRIBE_MAX);
    }
}
