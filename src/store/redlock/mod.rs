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
//!   A listen subscribes on every master.
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

mod acquire;
mod settle;
mod urls;
mod vote;

pub use urls::master_urls;
use vote::{merge, renewal_vote};

use super::redis::{RedisOptions, RedisStore};
use super::{
    Acquired, Claim, KeyState, Notice, Renewal, Renewed, Sharing, Store, StoreCheck, StoreError,
    StoreFuture,
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

impl RedlockStore {
    /// Connects lazily to every master of `url` ([`master_urls`]), `timeout` per call.
    pub fn new(url: &str, namespace: &str, timeout: Duration) -> Result<Self, StoreError> {
        Self::with_options(url, namespace, &RedisOptions::with_timeout(timeout))
    }

    /// [`RedlockStore::new`] with the masters' options (see `redis/restarts/`). Must
    /// be called inside a tokio runtime.
    pub fn with_options(
        url: &str,
        namespace: &str,
        options: &RedisOptions,
    ) -> Result<Self, StoreError> {
        let masters = master_urls(url)?
            .iter()
            .map(|u| RedisStore::with_options(u, namespace, options).map(Arc::new))
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

impl Store for RedlockStore {
    fn acquire<'a>(&'a self, claim: &'a Claim) -> StoreFuture<'a, Acquired> {
        Box::pin(self.acquire_once(claim))
    }

    fn reenter<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        count: u32,
        ttl: Duration,
    ) -> StoreFuture<'a, Option<u32>> {
        Box::pin(self.settle(key, owner, move |m, k, o| {
            Box::pin(async move { m.reenter(&k, &o, count, ttl).await })
        }))
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        count: u32,
        delay: Duration,
    ) -> StoreFuture<'a, Option<u32>> {
        Box::pin(self.settle(key, owner, move |m, k, o| {
            Box::pin(async move { m.release(&k, &o, count, delay).await })
        }))
    }

    fn release_grant<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        fence: u64,
        delay: Duration,
    ) -> StoreFuture<'a, Option<u32>> {
        // A master may keep a larger token than the majority's `fence` (it made its own,
        // or missed the write-back): the hint is wrong there, which costs that master one
        // write more, never a different answer.
        Box::pin(self.settle(key, owner, move |m, k, o| {
            Box::pin(async move { m.release_grant(&k, &o, fence, delay).await })
        }))
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

    fn proclaim<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        value: &'a [u8],
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            // The value is the granting majority's: held where a majority holds the
            // grant, as a hold is. Decided as soon as the masters still out cannot
            // change the answer.
            let (n, quorum) = (self.masters.len(), self.quorum);
            let decided = |answers: &[Result<bool, StoreError>]| {
                let yes = answers.iter().filter(|a| matches!(a, Ok(true))).count();
                let answered = answers.iter().filter(|a| a.is_ok()).count();
                yes >= quorum || (answered >= quorum && yes + (n - answers.len()) < quorum)
            };
            // Every master gets the value, also after the answer is known (the rest
            // finish in the background), so that a later Describe finds it on all.
            let (k, o, v) = (key.to_owned(), owner.to_owned(), value.to_vec());
            let mut calls: futures_util::stream::FuturesUnordered<_> = self
                .masters
                .iter()
                .map(|m| {
                    let (m, k, o, v) = (m.clone(), k.clone(), o.clone(), v.clone());
                    async move { m.proclaim(&k, &o, &v).await }
                })
                .collect();
            let mut answers = Vec::with_capacity(n);
            while let Some(answer) = calls.next().await {
                answers.push(answer);
                if decided(&answers) {
                    break;
                }
            }
            if !calls.is_empty() {
                tokio::spawn(async move { while calls.next().await.is_some() {} });
            }
            let yes = answers.iter().filter(|a| matches!(a, Ok(true))).count();
            let answered = answers.iter().filter(|a| a.is_ok()).count();
            if yes >= quorum {
                Ok(true)
            } else if answered >= quorum {
                Ok(false)
            } else {
                Err(self.no_quorum(answered))
            }
        })
    }

    fn listen<'a>(&'a self, key: &'a str, watch: bool) -> StoreFuture<'a, ()> {
        // On every master, counted now: a release reaches a majority, not always the
        // same one, and a master that lags must not hold up the others' notices.
        let listens: Vec<_> = self.masters.iter().map(|m| m.listen(key, watch)).collect();
        Box::pin(async move {
            join_all(listens).await;
            Ok(())
        })
    }

    fn unlisten(&self, key: &str, watch: bool) {
        for master in &self.masters {
            master.unlisten(key, watch);
        }
    }

    fn check(&self) -> StoreFuture<'_, StoreCheck> {
        // Every master's findings: a refused command or an evicting master anywhere
        // is a problem of the whole. Masters that do not answer are left out.
        Box::pin(async move {
            let mut found = StoreCheck::default();
            let answers = self.everywhere(|m| m.check()).await;
            let answered = answers.iter().filter(|a| a.is_ok()).count();
            if answered < self.quorum {
                return Err(self.no_quorum(answered));
            }
            for check in answers.into_iter().flatten() {
                for name in check.denied {
                    if !found.denied.contains(&name) {
                        found.denied.push(name);
                    }
                }
                found.evicting = found.evicting.or(check.evicting);
            }
            Ok(found)
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
