//! Redlock over N independent Redis masters (`redlock://h1:6379,h2:6379,h3:6379`): each
//! master is a standalone [`RedisStore`] running the same Lua scripts; a grant, a hold
//! and a renewal count only when a majority of masters agree.
//!
//! - **Acquire** asks every master at once. Once a majority granted (or no majority
//!   can grant any more and a majority has answered), the others get as long again,
//!   at least 2 ms: healthy masters all answer, a frozen one does not delay the answer.
//!   A grant that took longer than the TTL minus the clock drift counts as failed. A
//!   failed attempt is rolled back at once on every master that granted; a master that
//!   had not answered is left alone (a release sent now could overtake the next try of
//!   the same claim and undo it there), and a late grant on it expires at its TTL.
//! - **Fencing tokens** strictly increase without trusting clocks: the grant's token is
//!   the largest token of the granting masters, and it is written back to the masters
//!   (a majority must confirm) before the grant is handed out. Any later majority shares
//!   a master with that one, whose counter is then at least this token, so it issues a
//!   larger one. A master restarted empty keeps the clock part of the token
//!   (`unix_ms × 1024`), so it cannot go back either unless its clock does.
//! - **Renewals** go to every master and are answered per grant, as soon as every
//!   grant's fate is settled: renewed when a majority renewed it, not held when the
//!   masters that did not refuse it are fewer than a majority, failed (the session
//!   hears `Jeopardy` and the renewal is retried) while too few answered to tell.
//!   **Releases** and holds answer once a majority decides and reach the other masters
//!   in the background. Their answer is the hold count a majority still has: the
//!   quorum-th largest of the masters' counts, a master without the grant counting 0
//!   (never the largest: one master's count is not a majority's). A grant the vote says
//!   is gone is released on the masters that still answered a count for it, before or
//!   after the vote.
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
    Acquired, Claim, DEFAULT_CLOCK_DRIFT, HolderState, KeyState, Notice, Renewal, Renewed, Sharing,
    Store, StoreError, StoreFuture, drift_margin,
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

    /// Runs `call` on every master at once; returns the answers (in arrival order) as
    /// soon as `enough` says they decide the matter, or once all have come. A frozen
    /// master then costs nothing while a majority answers.
    async fn gather<'a, T, F, E>(&'a self, call: F, enough: E) -> Vec<Result<T, StoreError>>
    where
        F: Fn(&'a RedisStore) -> StoreFuture<'a, T>,
        E: Fn(&[Result<T, StoreError>]) -> bool,
    {
        let mut calls: FuturesUnordered<_> = self.masters.iter().map(|m| call(m)).collect();
        let mut answers = Vec::with_capacity(self.masters.len());
        while let Some(answer) = calls.next().await {
            answers.push(answer);
            if enough(&answers) {
                break;
            }
        }
        answers
    }

    /// Too few masters answered to decide anything.
    fn no_quorum(&self, answered: usize) -> StoreError {
        StoreError::Unavailable(format!(
            "{answered} of {} Redlock masters answered; {} are needed",
            self.masters.len(),
            self.quorum
        ))
    }

    /// Takes a grant back from the masters in `granted`, before the acquire answers.
    /// Masters that had not answered are left alone: a release sent to them now could
    /// overtake a retry of the same claim (same owner) and undo its grant; a late grant
    /// there simply expires at its TTL.
    async fn roll_back(&self, key: &str, owner: &str, granted: &[usize]) {
        let release = |i: &usize| self.masters[*i].release(key, owner, 0, Duration::ZERO);
        join_all(granted.iter().map(release)).await;
    }

    /// Runs a hold or release of one grant (`call`) on every master and answers once
    /// the [`vote`] is decided; the calls still out finish in the background (safe: the
    /// owner token of a grant is never reused for a new acquire). When the vote says
    /// the grant is gone, every master that answered a count for it, before the vote or
    /// after, gets a release to 0 in the background: left there, it would keep the key
    /// from a new majority until its TTL. A master that did not answer is left alone
    /// (nothing says it has the grant); its copy expires at its TTL.
    async fn settle<F>(&self, key: &str, owner: &str, call: F) -> Result<Option<u32>, StoreError>
    where
        F: Fn(Arc<RedisStore>) -> StoreFuture<'static, Option<u32>>,
    {
        let mut calls: FuturesUnordered<_> = (self.masters.iter().enumerate())
            .map(|(i, m)| {
                let call = call(m.clone());
                async move { (i, call.await) }
            })
            .collect();
        let (n, quorum) = (self.masters.len(), self.quorum);
        let mut answers = Vec::with_capacity(n);
        let mut holding = Vec::new();
        let decided = loop {
            let Some((i, answer)) = calls.next().await else {
                break vote(&answers, n, quorum);
            };
            if matches!(answer, Ok(Some(c)) if c > 0) {
                holding.push(i);
            }
            answers.push(answer);
            match vote(&answers, n, quorum) {
                Vote::Open => continue,
                decided => break decided,
            }
        };
        let gone = matches!(decided, Vote::Decided(None | Some(0)));
        let left = Leftovers {
            masters: self.masters.clone(),
            key: key.to_owned(),
            owner: owner.to_owned(),
        };
        if gone {
            holding.iter().for_each(|&i| left.release(i));
        }
        if !calls.is_empty() {
            tokio::spawn(async move {
                while let Some((i, answer)) = calls.next().await {
                    if gone && matches!(answer, Ok(Some(c)) if c > 0) {
                        left.release(i);
                    }
                }
            });
        }
        match decided {
            Vote::Decided(count) => Ok(count),
            Vote::NoQuorum(answered) => Err(self.no_quorum(answered)),
            // Cannot happen: every master has answered.
            Vote::Open => Err(self.no_quorum(answers.iter().flatten().count())),
        }
    }

    async fn acquire_once(&self, claim: &Claim) -> Result<Acquired, StoreError> {
        let start = Instant::now();
        let mut calls: FuturesUnordered<_> = (self.masters.iter().enumerate())
            .map(|(i, m)| async move { (i, m.acquire(claim).await) })
            .collect();
        let (mut fences, mut refused, mut failed) = (Vec::new(), 0, 0);
        let mut granted: Vec<usize> = Vec::new();
        let mut look_again: Option<Duration> = None;
        let mut conflict = None;
        let n = self.masters.len();
        let mut grace: Option<Instant> = None;
        loop {
            let next = match grace {
                None => calls.next().await,
                Some(until) => tokio::time::timeout_at(until, calls.next())
                    .await
                    .unwrap_or(None),
            };
            let Some((i, answer)) = next else { break };
            match answer {
                Ok(Acquired::Granted { fence }) => {
                    fences.push(fence);
                    granted.push(i);
                }
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
            // Decided: a majority granted, or no majority can grant any more and a
            // majority has answered (so that a busy key is Busy, not UNAVAILABLE, while
            // a master is down). Then the others get as long again, at least 2 ms: a
            // healthy master answers and holds (or gives back) the grant like the rest,
            // a frozen one does not hold up the answer.
            let answered = fences.len() + refused;
            let impossible = refused + failed > n - self.quorum;
            let decided = fences.len() >= self.quorum || (impossible && answered >= self.quorum);
            if decided && grace.is_none() {
                grace = Some(Instant::now() + start.elapsed().max(MIN_GRACE));
            }
        }
        // Masters still to answer (frozen, or slower than the grace) may yet grant:
        // after a success the session's renewals and release reach them too; after a
        // failure the late grant expires at its TTL (see `roll_back`).
        drop(calls);
        // The engine checks the grant again with the configured drift.
        let in_time = start.elapsed() + drift_margin(claim.ttl, DEFAULT_CLOCK_DRIFT) < claim.ttl;
        if fences.len() >= self.quorum {
            if in_time {
                let fence = fences.iter().copied().max().unwrap_or_default();
                let quorum = self.quorum;
                let raised = self
                    .gather(
                        |m| Box::pin(m.raise_fence(&claim.key, fence)),
                        |a| a.iter().filter(|r| r.is_ok()).count() >= quorum,
                    )
                    .await;
                if raised.iter().filter(|r| r.is_ok()).count() >= self.quorum {
                    return Ok(Acquired::Granted { fence });
                }
            }
            self.roll_back(&claim.key, &claim.owner, &granted).await;
            return Err(StoreError::Unavailable(
                "a majority of Redlock masters granted, but too late or without confirming the token".into(),
            ));
        }
        if !granted.is_empty() {
            self.roll_back(&claim.key, &claim.owner, &granted).await;
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

/// A grant the vote says is gone, on masters that may still have it.
struct Leftovers {
    masters: Vec<Arc<RedisStore>>,
    key: String,
    owner: String,
}

impl Leftovers {
    /// Releases the grant on master `i` in the background, ignoring the answer.
    fn release(&self, i: usize) {
        let Some(master) = self.masters.get(i).cloned() else {
            return;
        };
        let (key, owner) = (self.key.clone(), self.owner.clone());
        tokio::spawn(async move {
            if let Err(e) = master.release(&key, &owner, 0, Duration::ZERO).await {
                tracing::debug!(%key, error = %e, "leftover grant on a Redlock master not released; it expires at its TTL");
            }
        });
    }
}

/// What the masters' answers to a hold or release of one grant decide so far.
#[derive(Debug, PartialEq, Eq)]
enum Vote {
    /// Masters still to answer could change the outcome.
    Open,
    /// The answer: `Some(n > 0)`, the hold count a majority has; `Some(0)`, a majority
    /// had the grant and released it; `None`, fewer than a majority have it.
    Decided(Option<u32>),
    /// Too few masters answered, or can still answer, to tell (the number that did).
    NoQuorum(usize),
}

/// Counts the masters' answers to a hold or release of one grant (`answers` so far, of
/// `masters`). The count is the quorum-th largest of the per-master counts, a master
/// without the grant (`None`) or that failed counting 0: the largest count a majority
/// has. Never the maximum: one master's count (say 1, when the other masters answered
/// 0) is not a majority's, and answering it would let the session keep a grant the
/// majority no longer has while someone else is granted the key. Decided when the
/// masters still out cannot change the answer whatever they say.
fn vote(answers: &[Result<Option<u32>, StoreError>], masters: usize, quorum: usize) -> Vote {
    let pending = masters.saturating_sub(answers.len());
    let ok = answers.iter().filter(|a| a.is_ok()).count();
    if ok + pending < quorum {
        return Vote::NoQuorum(ok);
    }
    let counts = || {
        answers.iter().map(|a| match a {
            Ok(Some(c)) => *c,
            Ok(None) | Err(_) => 0,
        })
    };
    let quorum_th = |rest: u32| {
        let mut all: Vec<u32> = counts().chain(std::iter::repeat_n(rest, pending)).collect();
        all.sort_unstable_by(|a, b| b.cmp(a));
        all.get(quorum.saturating_sub(1)).copied().unwrap_or(0)
    };
    let count = quorum_th(0);
    if count != quorum_th(u32::MAX) || ok < quorum {
        return Vote::Open;
    }
    if count > 0 {
        return Vote::Decided(Some(count));
    }
    let had = answers.iter().filter(|a| matches!(a, Ok(Some(_)))).count();
    if had >= quorum {
        Vote::Decided(Some(0))
    } else if had + pending < quorum {
        Vote::Decided(None)
    } else {
        Vote::Open
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
        count: u32,
        ttl: Duration,
    ) -> StoreFuture<'a, Option<u32>> {
        Box::pin(async move {
            let (k, o) = (key.to_owned(), owner.to_owned());
            let hold = move |m: Arc<RedisStore>| -> StoreFuture<'static, Option<u32>> {
                let (k, o) = (k.clone(), o.clone());
                Box::pin(async move { m.hold(&k, &o, count, ttl).await })
            };
            self.settle(key, owner, hold).await
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
            let (k, o) = (key.to_owned(), owner.to_owned());
            let release = move |m: Arc<RedisStore>| -> StoreFuture<'static, Option<u32>> {
                let (k, o) = (k.clone(), o.clone());
                Box::pin(async move { m.release(&k, &o, count, delay).await })
            };
            self.settle(key, owner, release).await
        })
    }

    fn renew<'a>(&'a self, batch: &'a [Renewal<'a>]) -> StoreFuture<'a, Vec<Renewed>> {
        Box::pin(async move {
            let (n, quorum) = (self.masters.len(), self.quorum);
            // Enough when every grant's fate is settled: renewed by a majority, or the
            // masters that did not refuse it could not make one.
            let settled = |answers: &[Result<Vec<Renewed>, StoreError>]| {
                (0..batch.len()).all(|i| renewal_vote(answers, n, quorum, i).is_some())
            };
            let answers = self.gather(|m| m.renew(batch), settled).await;
            // One error shared by every grant whose fate is open: a master that did not
            // answer in time may still hold it, so it is neither renewed nor lost yet.
            let undecided = Arc::new(StoreError::Unavailable(format!(
                "too few of the {n} Redlock masters renewed or refused the grant to tell; \
                 {quorum} are needed"
            )));
            Ok((0..batch.len())
                .map(|i| match renewal_vote(&answers, n, quorum, i) {
                    Some(true) => Renewed::Extended,
                    Some(false) => Renewed::NotHeld,
                    None => Renewed::Failed(undecided.clone()),
                })
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
            let quorum = self.quorum;
            let enough = |a: &[Result<(), StoreError>]| a.iter().flatten().count() >= quorum;
            let answers = self.gather(|m| m.ping(), enough).await;
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

    fn kind(&self) -> &'static str {
        "redlock"
    }
}

/// What the masters' answers to a renewal batch mean for its grant `i`: `Some(true)`
/// when a majority extended it, `Some(false)` when the masters that did not refuse it
/// (including those that failed or have not answered) are fewer than a majority, so
/// none can exist, and `None` while too few answered to tell.
fn renewal_vote(
    answers: &[Result<Vec<Renewed>, StoreError>],
    masters: usize,
    quorum: usize,
    i: usize,
) -> Option<bool> {
    let (mut extended, mut refused) = (0, 0);
    for answer in answers.iter().flatten() {
        match answer.get(i) {
            Some(Renewed::Extended) => extended += 1,
            Some(Renewed::NotHeld) => refused += 1,
            Some(Renewed::Failed(_)) | None => {}
        }
    }
    if extended >= quorum {
        Some(true)
    } else if masters - refused < quorum {
        Some(false)
    } else {
        None
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

    fn ok(count: Option<u32>) -> Result<Option<u32>, StoreError> {
        Ok(count)
    }

    fn down() -> Result<Option<u32>, StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }

    /// The vote on 3 masters (quorum 2) after `answers`.
    fn vote3(answers: Vec<Result<Option<u32>, StoreError>>) -> Vote {
        vote(&answers, 3, 2)
    }

    /// Issue 11: a reentrant hold reached master 0 only (count 2 there, 1 elsewhere) and
    /// the session releases its one hold with the old "one less" call: master 0 answers
    /// 1, master 1 answers 0. One master's 1 is not a majority's: the vote waits for
    /// master 2, and answers 0 unless master 2 also still has a hold.
    #[test]
    fn one_masters_count_is_not_a_majoritys() {
        assert_eq!(vote3(vec![ok(Some(1)), ok(Some(0))]), Vote::Open);
        assert_eq!(
            vote3(vec![ok(Some(1)), ok(Some(0)), ok(Some(0))]),
            Vote::Decided(Some(0))
        );
        assert_eq!(
            vote3(vec![ok(Some(1)), ok(Some(0)), down()]),
            Vote::Decided(Some(0)),
            "a failed master does not count as holding"
        );
        assert_eq!(
            vote3(vec![ok(Some(1)), ok(Some(0)), ok(Some(1))]),
            Vote::Decided(Some(1))
        );
        assert_eq!(
            vote3(vec![ok(Some(1)), ok(None), down()]),
            Vote::Decided(None),
            "a majority answered and only one has the grant"
        );
    }

    /// Issue 11: holds that answer counts 3, 2, 2 leave 2 on a majority, not 3.
    #[test]
    fn the_count_is_the_quorum_th_largest() {
        assert_eq!(
            vote3(vec![ok(Some(3)), ok(Some(2)), ok(Some(2))]),
            Vote::Decided(Some(2))
        );
        assert_eq!(
            vote3(vec![ok(Some(3)), ok(Some(2))]),
            Vote::Open,
            "master 2 decides between 2 and 3"
        );
        assert_eq!(
            vote3(vec![ok(Some(2)), ok(Some(2))]),
            Vote::Decided(Some(2)),
            "nothing master 2 says changes the second largest"
        );
        assert_eq!(
            vote(
                &[ok(Some(3)), ok(Some(2)), ok(Some(2)), ok(Some(1)), ok(None)],
                5,
                3
            ),
            Vote::Decided(Some(2))
        );
    }

    /// Issue 11: with a master down, the two others decide; with two down, nothing is
    /// decided, and Some(0) is "released" only when a majority says so.
    #[test]
    fn a_master_down() {
        assert_eq!(
            vote3(vec![ok(Some(2)), down(), ok(Some(2))]),
            Vote::Decided(Some(2))
        );
        assert_eq!(vote3(vec![down(), ok(Some(2))]), Vote::Open);
        assert_eq!(vote3(vec![ok(Some(2)), down(), down()]), Vote::NoQuorum(1));
        assert_eq!(vote3(vec![down(), down()]), Vote::NoQuorum(0));
        assert_eq!(
            vote3(vec![ok(Some(0)), ok(Some(0))]),
            Vote::Decided(Some(0)),
            "released on a majority: no need to wait for the third"
        );
        assert_eq!(vote3(vec![ok(Some(0)), ok(None)]), Vote::Open);
        assert_eq!(vote3(vec![ok(None), ok(None)]), Vote::Decided(None));
        assert_eq!(
            vote3(vec![ok(Some(0)), ok(None), down()]),
            Vote::Decided(None)
        );
        assert_eq!(vote3(vec![ok(None), down()]), Vote::Open);
    }

    #[test]
    fn a_renewal_counts_per_grant() {
        let down = || Err(StoreError::Unavailable("down".into()));
        let failed = || Renewed::Failed(Arc::new(StoreError::Unavailable("node".into())));
        let (yes, no) = (Renewed::Extended, Renewed::NotHeld);
        // Three masters, quorum 2; per grant: [a, b, c, d].
        let answers = vec![
            Ok(vec![yes.clone(), no.clone(), yes.clone(), failed()]),
            Ok(vec![yes.clone(), no.clone(), no.clone(), yes.clone()]),
            down(),
        ];
        let vote = |i| renewal_vote(&answers, 3, 2, i);
        assert_eq!(vote(0), Some(true), "a majority renewed it");
        assert_eq!(vote(1), Some(false), "a majority refused it");
        assert_eq!(
            vote(2),
            None,
            "one each, the third unknown: too few to tell"
        );
        assert_eq!(
            vote(3),
            None,
            "one node of a master failed: too few to tell"
        );
        assert_eq!(renewal_vote(&[down(), down()], 3, 2, 0), None);
    }
}
