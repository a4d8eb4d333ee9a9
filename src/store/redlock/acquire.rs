//! One Redlock acquire: every master at once, decided by a majority within the TTL
//! minus the drift, the token written back to a majority, and a failed attempt rolled
//! back where it was granted.

use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::join_all;
use futures_util::stream::FuturesUnordered;
use tokio::time::Instant;

use super::{MIN_GRACE, RedlockStore};
use crate::store::{Acquired, Claim, DEFAULT_CLOCK_DRIFT, Store, StoreError, drift_margin};

impl RedlockStore {
    /// Takes a grant back from the masters in `granted`, before the acquire answers.
    /// Masters that had not answered are left alone: a release sent to them now could
    /// overtake a retry of the same claim (same owner) and undo its grant; a late grant
    /// there simply expires at its TTL.
    async fn roll_back(&self, key: &str, owner: &str, granted: &[usize]) {
        let release = |i: &usize| self.masters[*i].release(key, owner, 0, Duration::ZERO);
        join_all(granted.iter().map(release)).await;
    }

    pub(super) async fn acquire_once(&self, claim: &Claim) -> Result<Acquired, StoreError> {
        let start = Instant::now();
        let mut calls: FuturesUnordered<_> = (self.masters.iter().enumerate())
            .map(|(i, m)| async move { (i, m.acquire(claim).await) })
            .collect();
        let (mut fences, mut refused, mut failed) = (Vec::new(), 0, 0);
        let mut granted: Vec<usize> = Vec::new();
        let mut look_again: Option<Duration> = None;
        // The latest of the masters' clocks: a ticket every master orders alike.
        let mut ticket = 0;
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
                Ok(Acquired::Busy {
                    expires_in,
                    ticket: t,
                    ..
                }) => {
                    refused += 1;
                    look_again = Some(look_again.map_or(expires_in, |l| l.min(expires_in)));
                    ticket = ticket.max(t);
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
            ticket,
        })
    }
}
