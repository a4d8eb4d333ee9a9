//! Redlock over N independent Redis masters (`redlock://h1:6379,h2:6379,h3:6379`): each
//! master is a standalone [`RedisStore`] running the same Lua scripts; a grant, a hold
//! and a renewal count only when a majority of masters agree.
//!
//! - **Acquire** asks every master at once and decides once a majority granted (then
//!   waiting as long again, at least 2 ms, for the others, so that healthy masters all
//!   hold the grant while a frozen one does not delay it) or can no longer grant. A grant that took longer than the TTL minus the clock
//!   drift is not safe and counts as failed. A failed attempt is rolled back at once on
//!   every master (owner tokens are unique, so releasing where nothing was granted is a
//!   no-op), so a split vote leaves nothing behind until the TTL.
//! - **Fencing tokens** strictly increase without trusting clocks: the grant's token is
//!   the largest token of the granting masters, and it is written back to the masters
//!   (a majority must confirm) before the grant is handed out. Any later majority shares
//!   a master with that one, whose counter is then at least this token, so it issues a
//!   larger one. A master restarted empty keeps the clock part of the token
//!   (`unix_ms × 1024`), so it cannot go back either unless its clock does.
//! - **Renewals** go to every master; a grant stays valid while a majority renews it.
//!   **Releases** go to every master.
//! - **Notices** from every master are merged: a release wakes a waiter once per master
//!   (a woken waiter only tries again; spurious wakes cost an attempt, never safety).
//! - **Not supported**: semaphores (N masters each counting permits would let more than
//!   N holders in) and fair queues (each master would keep its own order); both are
//!   refused with UNIMPLEMENTED. Read/write locks are safe (any two majorities meet).
//!
//! The documented hazard is Redlock's own: a master that restarts empty *at once* can
//! help grant a lock that a majority including it had already granted. Restart masters
//! after the longest TTL (or with persistence), as the Redlock description says.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::join_all;
use futures_util::stream::FuturesUnordered;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::redis::RedisStore;
use super::{
    Acquired, Claim, DEFAULT_CLOCK_DRIFT, HolderState, KeyState, Notice, Renewal, Sharing, Store,
    StoreError, StoreFuture, drift_margin,
};

/// After a majority granted, how long at least to wait for the other masters.
const MIN_GRACE: Duration = Duration::from_millis(2);

/// How many notices the merged channel buffers before a slow task resyncs.
const NOTICE_BUFFER: usize = 4096;

/// The Redlock store.
pub struct RedlockStore {
    masters: Vec<Arc<RedisStore>>,
    quorum: usize,
    notices: broadcast::Sender<Notice>,
    forwarders: Vec<JoinHandle<()>>,
}

impl Drop for RedlockStore {
    fn drop(&mut self) {
        for forwarder in &self.forwarders {
            forwarder.abort();
        }
    }
}

impl std::fmt::Debug for RedlockStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedlockStore")
            .field("masters", &self.masters.len())
            .field("quorum", &self.quorum)
            .finish_non_exhaustive()
    }
}

/// The masters of `redlock://[user:pass@]h1:p1,h2:p2,...[/db]`, as `redis://` URLs that
/// share the credentials and the database.
pub fn master_urls(url: &str) -> Result<Vec<String>, StoreError> {
    let config = |m: &str| StoreError::Config(m.to_owned());
    let rest = url
        .strip_prefix("redlock://")
        .ok_or_else(|| config("a Redlock URL starts with redlock://"))?;
    let (auth, rest) = match rest.rsplit_once('@') {
        Some((auth, hosts)) => (format!("{auth}@"), hosts),
        None => (String::new(), rest),
    };
    let (hosts, db) = match rest.split_once('/') {
        Some((hosts, db)) => (hosts, format!("/{db}")),
        None => (rest, String::new()),
    };
    let urls: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|h| format!("redis://{auth}{h}{db}"))
        .collect();
    if urls.len() < 3 {
        return Err(config(
            "Redlock needs at least 3 independent masters (with fewer, one failure stops all grants)",
        ));
    }
    Ok(urls)
}

impl RedlockStore {
    /// Connects lazily to every master of `url` (see [`master_urls`]); every call to one
    /// master gives up after `timeout`. Must be called inside a tokio runtime.
    pub fn new(url: &str, namespace: &str, timeout: Duration) -> Result<Self, StoreError> {
        let masters = master_urls(url)?
            .iter()
            .map(|u| RedisStore::new(u, namespace, timeout).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        let notices = broadcast::channel(NOTICE_BUFFER).0;
        let forwarders = masters
            .iter()
            .map(|m| tokio::spawn(forward(m.notices(), notices.clone())))
            .collect();
        Ok(Self {
            quorum: masters.len() / 2 + 1,
            masters,
            notices,
            forwarders,
        })
    }

    /// Runs `call` on every master at once and waits for all.
    async fn everywhere<'a, T, F>(&'a self, call: F) -> Vec<Result<T, StoreError>>
    where
        F: Fn(&'a RedisStore) -> StoreFuture<'a, T>,
    {
        join_all(self.masters.iter().map(|m| call(m))).await
    }

    /// Too few masters answered to decide anything.
    fn no_quorum(&self, answered: usize) -> StoreError {
        StoreError::Unavailable(format!(
            "{answered} of {} Redlock masters answered; {} are needed",
            self.masters.len(),
            self.quorum
        ))
    }

    /// Takes the grant back from every master.
    async fn roll_back(&self, key: &str, owner: &str) {
        self.everywhere(|m| m.release(key, owner, true, Duration::ZERO))
            .await;
    }

    async fn acquire_once(&self, claim: &Claim) -> Result<Acquired, StoreError> {
        let start = Instant::now();
        let mut calls: FuturesUnordered<_> =
            self.masters.iter().map(|m| m.acquire(claim)).collect();
        let (mut fences, mut refused, mut failed) = (Vec::new(), 0, 0);
        let mut look_again: Option<Duration> = None;
        let mut conflict = None;
        let n = self.masters.len();
        let mut grace: Option<Instant> = None;
        loop {
            let next = match grace {
                None => calls.next().await,
                // After a majority granted: the others a little longer, so that a
                // healthy master holds the grant too (one master restarting empty then
                // cannot undo it), but a frozen one does not hold the grant up.
                Some(until) => tokio::time::timeout_at(until, calls.next())
                    .await
                    .unwrap_or(None),
            };
            let Some(answer) = next else { break };
            match answer {
                Ok(Acquired::Granted { fence }) => fences.push(fence),
                Ok(Acquired::Busy { expires_in, .. }) => {
                    refused += 1;
                    look_again = Some(look_again.map_or(expires_in, |l| l.min(expires_in)));
                }
                Ok(Acquired::Conflict { limit }) => {
                    refused += 1;
                    conflict = Some(limit);
                }
                Err(_) => failed += 1,
            }
            if refused + failed > n - self.quorum {
                break;
            }
            if fences.len() >= self.quorum && grace.is_none() {
                grace = Some(Instant::now() + start.elapsed().max(MIN_GRACE));
            }
        }
        // Masters still to answer may yet grant: the roll-back below (or the session's
        // release) reaches them too, after the acquire on the same connection.
        drop(calls);
        // The engine checks the grant again with the configured drift.
        let in_time = start.elapsed() + drift_margin(claim.ttl, DEFAULT_CLOCK_DRIFT) < claim.ttl;
        if fences.len() >= self.quorum && in_time {
            let fence = fences.iter().copied().max().unwrap_or_default();
            let raised = self
                .everywhere(|m| Box::pin(m.raise_fence(&claim.key, fence)))
                .await;
            if raised.iter().filter(|r| r.is_ok()).count() >= self.quorum {
                return Ok(Acquired::Granted { fence });
            }
        }
        if !fences.is_empty() {
            self.roll_back(&claim.key, &claim.owner).await;
        }
        if fences.len() + refused < self.quorum {
            return Err(self.no_quorum(fences.len() + refused));
        }
        if let Some(limit) = conflict {
            return Ok(Acquired::Conflict { limit });
        }
        Ok(Acquired::Busy {
            // A split vote (each contender got a minority) has no holder to wait for:
            // look again soon rather than at a TTL.
            expires_in: look_again.unwrap_or(Duration::from_millis(10)),
            position: 0,
        })
    }
}

/// Forwards one master's notices to the merged channel.
async fn forward(mut from: broadcast::Receiver<Notice>, to: broadcast::Sender<Notice>) {
    loop {
        match from.recv().await {
            Ok(notice) => {
                let _ = to.send(notice);
            }
            Err(broadcast::error::RecvError::Lagged(_)) => {
                let _ = to.send(Notice::Resync);
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// What the masters' answers to a hold or release of one grant mean together: the hold
/// count when a majority still has the grant (the largest, should they differ), `None`
/// when a majority answered and too few of them have it (the grant is lost), and `Err`
/// with the number of answers when too few masters answered to tell.
fn majority_count(
    answers: &[Result<Option<u32>, StoreError>],
    quorum: usize,
) -> Result<Option<u32>, usize> {
    let held: Vec<u32> = answers.iter().flatten().flatten().copied().collect();
    let answered = answers.iter().filter(|a| a.is_ok()).count();
    if held.len() >= quorum {
        Ok(held.into_iter().max())
    } else if answered >= quorum {
        Ok(None)
    } else {
        Err(answered)
    }
}

impl Store for RedlockStore {
    fn acquire<'a>(&'a self, claim: &'a Claim) -> StoreFuture<'a, Acquired> {
        Box::pin(self.acquire_once(claim))
    }

    fn hold<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> StoreFuture<'a, Option<u32>> {
        Box::pin(async move {
            let answers = self.everywhere(|m| m.hold(key, owner, ttl)).await;
            majority_count(&answers, self.quorum).map_err(|n| self.no_quorum(n))
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
            let answers = self.everywhere(|m| m.release(key, owner, all, delay)).await;
            majority_count(&answers, self.quorum).map_err(|n| self.no_quorum(n))
        })
    }

    fn renew<'a>(&'a self, batch: &'a [Renewal<'a>]) -> StoreFuture<'a, Vec<bool>> {
        Box::pin(async move {
            let answers = self.everywhere(|m| m.renew(batch)).await;
            let renewed: Vec<Vec<bool>> = answers.into_iter().flatten().collect();
            if renewed.len() < self.quorum {
                return Err(self.no_quorum(renewed.len()));
            }
            Ok((0..batch.len())
                .map(|i| renewed.iter().filter(|r| r.get(i) == Some(&true)).count() >= self.quorum)
                .collect())
        })
    }

    fn unwait<'a>(&'a self, claim: &'a Claim) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let answers = self.everywhere(|m| m.unwait(claim)).await;
            let answered = answers.iter().filter(|a| a.is_ok()).count();
            if answered == 0 {
                return Err(self.no_quorum(0));
            }
            Ok(())
        })
    }

    fn describe<'a>(&'a self, key: &'a str) -> StoreFuture<'a, KeyState> {
        Box::pin(async move {
            let states: Vec<KeyState> = self
                .everywhere(|m| m.describe(key))
                .await
                .into_iter()
                .flatten()
                .collect();
            if states.len() < self.quorum {
                return Err(self.no_quorum(states.len()));
            }
            Ok(merge(states, self.quorum))
        })
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let answers = self.everywhere(|m| m.ping()).await;
            let answered = answers.iter().filter(|a| a.is_ok()).count();
            if answered < self.quorum {
                return Err(self.no_quorum(answered));
            }
            Ok(())
        })
    }

    fn notices(&self) -> broadcast::Receiver<Notice> {
        self.notices.subscribe()
    }

    fn supports(&self, sharing: Sharing, limit: u32, fair: bool) -> Result<(), String> {
        if limit > 1 {
            return Err(
                "semaphores are not supported on Redlock: each master would count \
                        permits on its own, letting more holders in than the limit"
                    .into(),
            );
        }
        if fair {
            return Err(
                "fair queues are not supported on Redlock: each master would keep \
                        its own order"
                    .into(),
            );
        }
        let _ = sharing; // read/write locks are safe: any two majorities share a master
        Ok(())
    }
}

/// One view of a lock from the masters' views: the holders a majority knows (with the
/// largest token any master gave them), the largest counter, the first master's queue.
fn merge(states: Vec<KeyState>, quorum: usize) -> KeyState {
    let mut holders: Vec<HolderState> = Vec::new();
    for state in &states {
        for h in &state.holders {
            let known = states
                .iter()
                .filter(|s| s.holders.iter().any(|o| o.session_id == h.session_id))
                .count();
            if known < quorum || holders.iter().any(|o| o.session_id == h.session_id) {
                continue;
            }
            let fence = states
                .iter()
                .flat_map(|s| &s.holders)
                .filter(|o| o.session_id == h.session_id)
                .map(|o| o.fence)
                .max()
                .unwrap_or(h.fence);
            holders.push(HolderState { fence, ..h.clone() });
        }
    }
    let fence = states.iter().map(|s| s.fence).max().unwrap_or_default();
    let first = states.into_iter().next().unwrap_or_default();
    KeyState {
        sharing: if holders.is_empty() {
            None
        } else {
            first.sharing
        },
        limit: if holders.is_empty() { 0 } else { first.limit },
        holders,
        fence,
        ..first
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_share_credentials_and_database() {
        let urls = master_urls("redlock://u:p@a:1,b:2, c:3/2").expect("valid");
        assert_eq!(
            urls,
            [
                "redis://u:p@a:1/2",
                "redis://u:p@b:2/2",
                "redis://u:p@c:3/2"
            ]
        );
        assert!(
            master_urls("redlock://a:1,b:2").is_err(),
            "two masters are too few"
        );
        assert!(master_urls("redis://a:1").is_err());
    }

    #[test]
    fn counts_follow_the_majority() {
        let ok = |c: Option<u32>| Ok::<_, StoreError>(c);
        let down = || Err(StoreError::Unavailable("down".into()));
        let count = |answers: Vec<_>| majority_count(&answers, 2);
        assert_eq!(count(vec![ok(Some(2)), ok(Some(2)), down()]), Ok(Some(2)));
        assert_eq!(count(vec![ok(Some(0)), ok(Some(0)), ok(None)]), Ok(Some(0)));
        assert_eq!(count(vec![ok(None), ok(None), ok(Some(1))]), Ok(None));
        assert_eq!(count(vec![ok(None), ok(Some(1)), down()]), Ok(None));
        assert_eq!(count(vec![ok(Some(1)), down(), down()]), Err(1));
    }
}
