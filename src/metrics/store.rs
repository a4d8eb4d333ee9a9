//! [`MeteredStore`]: the engine's store, with every call counted and timed by operation
//! and result (`lockside_store_calls_total`, `lockside_store_call_seconds`).
//!
//! A wrapper rather than counts in each store: Redis, Redlock and memory are metered
//! alike, calls made by sessions, the renewer and the health check alike, and a new
//! store gets its metrics by passing through here.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::time::Instant;

use super::{Operation, StoreCalls};
use crate::store::{
    Acquired, Claim, Early, KeyState, Listing, Notice, RecordWrite, Recorded, Renewal, Renewed,
    ResumeClaim, Resumption, Sharing, Store, StoreCheck, StoreError, StoreFuture,
};

/// A [`Store`] that meters the calls it passes to `inner`. A call dropped before it
/// finished (a cancelled wait) is not counted: it has no result.
pub struct MeteredStore {
    inner: Arc<dyn Store>,
    calls: StoreCalls,
}

impl std::fmt::Debug for MeteredStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeteredStore")
            .field("kind", &self.inner.kind())
            .finish_non_exhaustive()
    }
}

impl MeteredStore {
    /// Meters `inner` into `metrics`.
    pub fn new(inner: Arc<dyn Store>, metrics: &super::Metrics) -> Self {
        Self {
            inner,
            calls: metrics.store_calls(),
        }
    }

    fn meter<'a, T: Send + 'a>(
        &'a self,
        operation: Operation,
        call: StoreFuture<'a, T>,
    ) -> StoreFuture<'a, T> {
        Box::pin(async move {
            let started = Instant::now();
            let result = call.await;
            let took: Duration = started.elapsed();
            self.calls
                .record(operation, took, result.as_ref().err().map(StoreError::kind));
            result
        })
    }
}

impl Store for MeteredStore {
    fn acquire<'a>(&'a self, claim: &'a Claim) -> StoreFuture<'a, Acquired> {
        self.meter(Operation::Acquire, self.inner.acquire(claim))
    }

    fn acquire_listed<'a>(
        &'a self,
        claim: &'a Claim,
        listing: Listing<'a>,
    ) -> StoreFuture<'a, (Acquired, bool)> {
        self.meter(
            Operation::Acquire,
            self.inner.acquire_listed(claim, listing),
        )
    }

    fn reenter<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        count: u32,
        ttl: Duration,
    ) -> StoreFuture<'a, Option<u32>> {
        self.meter(Operation::Hold, self.inner.reenter(key, owner, count, ttl))
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        count: u32,
        delay: Duration,
    ) -> StoreFuture<'a, Option<u32>> {
        self.meter(
            Operation::Release,
            self.inner.release(key, owner, count, delay),
        )
    }

    fn release_grant<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        fence: u64,
        delay: Duration,
    ) -> StoreFuture<'a, Option<u32>> {
        self.meter(
            Operation::Release,
            self.inner.release_grant(key, owner, fence, delay),
        )
    }

    fn renew<'a>(&'a self, batch: &'a [Renewal<'a>]) -> StoreFuture<'a, Vec<Renewed>> {
        self.meter(Operation::Renew, self.inner.renew(batch))
    }

    fn renew_early<'a>(
        &'a self,
        batch: &'a [Renewal<'a>],
        early: Early<'a>,
    ) -> StoreFuture<'a, Vec<Renewed>> {
        self.meter(Operation::Renew, self.inner.renew_early(batch, early))
    }

    fn unwait<'a>(&'a self, claim: &'a Claim) -> StoreFuture<'a, ()> {
        self.meter(Operation::Unwait, self.inner.unwait(claim))
    }

    fn describe<'a>(&'a self, key: &'a str) -> StoreFuture<'a, KeyState> {
        self.meter(Operation::Describe, self.inner.describe(key))
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        self.meter(Operation::Ping, self.inner.ping())
    }

    fn restarted(&self) -> bool {
        self.inner.restarted()
    }

    fn hold_offs(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.inner.hold_offs()
    }

    fn reassert<'a>(&'a self, claim: &'a Claim, count: u32, fence: u64) -> StoreFuture<'a, bool> {
        self.meter(
            Operation::Reassert,
            self.inner.reassert(claim, count, fence),
        )
    }

    fn check(&self) -> StoreFuture<'_, StoreCheck> {
        // Not metered: mostly answered from the last result, without a call.
        self.inner.check()
    }

    fn proclaim<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        value: &'a [u8],
    ) -> StoreFuture<'a, bool> {
        self.meter(Operation::Proclaim, self.inner.proclaim(key, owner, value))
    }

    fn listen<'a>(&'a self, key: &'a str, watch: bool) -> StoreFuture<'a, ()> {
        self.inner.listen(key, watch)
    }

    fn unlisten(&self, key: &str, watch: bool) {
        self.inner.unlisten(key, watch);
    }

    fn notices(&self) -> broadcast::Receiver<Notice> {
        self.inner.notices()
    }

    fn supports(&self, sharing: Sharing, limit: u32, fair: bool) -> Result<(), String> {
        self.inner.supports(sharing, limit, fair)
    }

    fn keeps_sessions(&self) -> bool {
        self.inner.keeps_sessions()
    }

    fn outlives_sidecar(&self) -> bool {
        self.inner.outlives_sidecar()
    }

    fn record<'a>(&'a self, writes: &'a [RecordWrite]) -> StoreFuture<'a, Vec<Option<Recorded>>> {
        self.meter(Operation::Record, self.inner.record(writes))
    }

    fn attach<'a>(&'a self, sidecar: &'a str, ttl: Duration) -> StoreFuture<'a, ()> {
        self.meter(Operation::Attach, self.inner.attach(sidecar, ttl))
    }

    fn resume<'a>(&'a self, claim: &'a ResumeClaim) -> StoreFuture<'a, Resumption> {
        self.meter(Operation::Resume, self.inner.resume(claim))
    }

    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
}
