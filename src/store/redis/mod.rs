//! Redis through redis-rs: standalone, Sentinel or Cluster (see `redis/options.rs` for
//! the URLs). Every state change is one Lua script from `lua/`, run by EVALSHA (loaded
//! again on NOSCRIPT). The key layout is documented at the top of `lua/core.lua`; all
//! keys of one lock share the hash tag `{ns:KEY}`, so every script touches one slot.
//!
//! Requests share one connection (`redis/link.rs`); notices come on the same connection,
//! from subscriptions to the channels of the keys this sidecar listens to
//! (`redis/subscriptions/`). Batched renewals are in `redis/renew/` (grouped by
//! Cluster slot, `redis/slots.rs`), replica acknowledgement in `redis/acked.rs`,
//! session records and resuming in `redis/sessions.rs`.
//!
//! This file has the store and its `Store` methods; opening it is in `redis/open.rs`,
//! how one call reaches Redis (timeout, connection, script) in `redis/call.rs`, what
//! the scripts are given in `redis/args.rs`, Sentinel in `redis/sentinel.rs`, the
//! store's own check of its permissions and eviction policy in `redis/checks/`, a
//! server that lost its data (the hold-off, grants written back) in `redis/restarts/`.

mod acked;
mod acquire;
mod args;
mod call;
mod checks;
mod link;
mod open;
mod options;
mod renew;
mod replies;
mod restarts;
mod scripts;
mod sentinel;
mod sessions;
mod slots;
mod subscriptions;
mod watchers;

use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis::{self, Value};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

pub use options::RedisOptions;

use super::{
    Acquired, Claim, Early, KeyState, Listing, Notice, RecordWrite, Recorded, Renewal, Renewed,
    ResumeClaim, Resumption, Store, StoreCheck, StoreError, StoreFuture,
};
use args::{LOCK_PARTS, tail};
use link::{Conn, Link};
use replies::{held_count, key_state, ms};
use scripts::{Lua, Scripts};
use subscriptions::Subscriptions;
use watchers::Watchers;

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
    /// Cluster: which node serves each slot, for grouping renewals (`redis/renew/`)
    /// and for the guard of each call (`redis/restarts/witness.rs`).
    slot_map: Arc<slots::SlotMap>,
    /// Cluster: the masters whose tenure this sidecar read, and their witnesses.
    witnesses: Arc<restarts::Witnesses>,
    timeout: Duration,
    scripts: Scripts,
    notices: broadcast::Sender<Notice>,
    /// The tasks of the subscriptions, and the refresh of the watch registrations.
    tasks: Vec<JoinHandle<()>>,
    /// The keys watched here, registered in the store (`redis/watchers.rs`).
    watchers: Arc<Watchers>,
    /// What the commands this store sends depend on, and its last check (`checks.rs`).
    needs: checks::Needs,
    checked: checks::Checked,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may carry a password: never print it.
        f.debug_struct("RedisStore")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Raises the fencing counter of `key` to `fence` when it is lower (Redlock writes
    /// a majority's token back this way; see `redlock.rs`).
    pub async fn raise_fence(&self, key: &str, fence: u64) -> Result<(), StoreError> {
        let fence = fence.to_string();
        let _: i64 = self
            .invoke(&self.scripts.fence, key, &[fence.as_bytes()])
            .await?;
        Ok(())
    }

    /// `release.lua`: leaves `count` holds; `fence`, the grant's token when the caller
    /// knows it, lets a whole release write in one command (see the script).
    async fn release_with(
        &self,
        key: &str,
        owner: &str,
        count: u32,
        delay: Duration,
        fence: Option<u64>,
    ) -> Result<Option<u32>, StoreError> {
        let hold = format!("{count}|{}", ms(delay));
        let fence = fence.map(|f| f.to_string()).unwrap_or_default();
        let notice = self.notice(key);
        let args: [&[u8]; 4] = [
            owner.as_bytes(),
            fence.as_bytes(),
            hold.as_bytes(),
            notice.as_bytes(),
        ];
        let n: i64 = self.invoke(&self.scripts.release, key, &args).await?;
        Ok(held_count(n))
    }
}

impl Store for RedisStore {
    fn acquire<'a>(&'a self, claim: &'a Claim) -> StoreFuture<'a, Acquired> {
        Box::pin(async move { Ok(self.acquire_with(claim, None).await?.0) })
    }

    fn acquire_listed<'a>(
        &'a self,
        claim: &'a Claim,
        listing: Listing<'a>,
    ) -> StoreFuture<'a, (Acquired, bool)> {
        Box::pin(self.acquire_with(claim, Some(listing)))
    }

    fn reenter<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        count: u32,
        ttl: Duration,
    ) -> StoreFuture<'a, Option<u32>> {
        Box::pin(async move {
            let (count, ttl) = (count.to_string(), ms(ttl));
            let (channel, sharded) = self.notice_channel(key);
            let (count, ttl, channel) = (&count, &ttl, &channel);
            let n: i64 = self
                .guarded(key, false, |guard| async move {
                    let args: [&[u8]; 7] = [
                        owner.as_bytes(),
                        count.as_bytes(),
                        ttl.as_bytes(),
                        channel.as_bytes(),
                        key.as_bytes(),
                        sharded.as_bytes(),
                        &guard,
                    ];
                    self.invoke(&self.scripts.reenter, key, &args).await
                })
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
        Box::pin(self.release_with(key, owner, count, delay, None))
    }

    fn release_grant<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        fence: u64,
        delay: Duration,
    ) -> StoreFuture<'a, Option<u32>> {
        Box::pin(self.release_with(key, owner, 0, delay, Some(fence)))
    }

    fn renew<'a>(&'a self, batch: &'a [Renewal<'a>]) -> StoreFuture<'a, Vec<Renewed>> {
        Box::pin(self.renew_batch(batch, &|_, _| {}))
    }

    fn renew_early<'a>(
        &'a self,
        batch: &'a [Renewal<'a>],
        early: Early<'a>,
    ) -> StoreFuture<'a, Vec<Renewed>> {
        Box::pin(self.renew_batch(batch, early))
    }

    fn unwait<'a>(&'a self, claim: &'a Claim) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let waiter = claim.waiter();
            let (channel, sharded) = self.notice_channel(&claim.key);
            let args: [&[u8]; 4] = [
                waiter.as_bytes(),
                channel.as_bytes(),
                claim.key.as_bytes(),
                sharded.as_bytes(),
            ];
            self.invoke::<i64>(&self.scripts.unwait, &claim.key, &args)
                .await
                .map(drop)
        })
    }

    fn describe<'a>(&'a self, key: &'a str) -> StoreFuture<'a, KeyState> {
        Box::pin(async move {
            let reply: Vec<Value> = self.invoke(&self.scripts.describe, key, &[]).await?;
            key_state(&reply)
        })
    }

    fn proclaim<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        value: &'a [u8],
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let (channel, sharded) = self.notice_channel(key);
            let args: [&[u8]; 5] = [
                owner.as_bytes(),
                value,
                channel.as_bytes(),
                key.as_bytes(),
                sharded.as_bytes(),
            ];
            let held: i64 = self.invoke(&self.scripts.proclaim, key, &args).await?;
            Ok(held == 1)
        })
    }

    fn restarted(&self) -> bool {
        self.link.restarts().holding_off().is_some()
    }

    fn hold_offs(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.link.restarts().began())
    }

    fn reassert<'a>(&'a self, claim: &'a Claim, count: u32, fence: u64) -> StoreFuture<'a, bool> {
        Box::pin(self.reassert_grant(claim, count, fence))
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let pong = self.run(|mut conn| async move {
                redis::cmd("PING").query_async::<String>(&mut conn).await
            });
            match pong.await {
                // An answer: the store is there; the check names PING.
                Err(e) if checks::refused(&e) => Ok(()),
                answer => answer.map(drop),
            }
        })
    }

    fn check(&self) -> StoreFuture<'_, StoreCheck> {
        Box::pin(self.checked())
    }

    fn notices(&self) -> broadcast::Receiver<Notice> {
        self.notices.subscribe()
    }

    fn listen<'a>(&'a self, key: &'a str, watch: bool) -> StoreFuture<'a, ()> {
        // Counted now, so that an unlisten matches it even if this future is dropped.
        let subscribed = self.subscriptions.listen(key);
        let registered = watch.then(|| self.watchers.add(key));
        Box::pin(async move {
            if let Some(registered) = registered
                && let Err(e) = registered.await
            {
                // Not fatal: watchers also read the key again at its holders' expiry,
                // and the registration is retried at the next refresh.
                tracing::warn!(%key, error = %e, "registering a watch in the store failed");
            }
            subscribed.await;
            Ok(())
        })
    }

    fn unlisten(&self, key: &str, watch: bool) {
        self.subscriptions.unlisten(key);
        if watch {
            self.watchers.remove(key);
        }
    }

    fn keeps_sessions(&self) -> bool {
        true
    }

    fn record<'a>(&'a self, writes: &'a [RecordWrite]) -> StoreFuture<'a, Vec<Option<Recorded>>> {
        Box::pin(async move { Ok(self.write_records(writes).await) })
    }

    fn attach<'a>(&'a self, sidecar: &'a str, ttl: Duration) -> StoreFuture<'a, ()> {
        Box::pin(self.write_attachment(sidecar, ttl))
    }

    fn resume<'a>(&'a self, claim: &'a ResumeClaim) -> StoreFuture<'a, Resumption> {
        Box::pin(self.resume_session(claim))
    }

    fn kind(&self) -> &'static str {
        self.kind
    }
}

#[cfg(test)]
mod tests;
