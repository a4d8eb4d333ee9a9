//! A hold or a release of one grant on every master: answered with the count a majority
//! still has (`vote.rs`), and the grant released where the vote says it is gone.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;

use super::RedlockStore;
use super::vote::{Vote, vote};
use crate::store::redis::RedisStore;
use crate::store::{Store, StoreError, StoreFuture};

impl RedlockStore {
    /// Runs a hold or release of one grant (`call`, given a master and the key and owner
    /// it may keep beyond this call) on every master and answers once
    /// the [`vote`] is decided; the calls still out finish in the background (safe: the
    /// owner token of a grant is never reused for a new acquire). When the vote says
    /// the grant is gone, every master that answered a count for it, before the vote or
    /// after, gets a release to 0 in the background: left there, it would keep the key
    /// from a new majority until its TTL. A master that did not answer is left alone
    /// (nothing says it has the grant); its copy expires at its TTL.
    pub(super) async fn settle<F>(
        &self,
        key: &str,
        owner: &str,
        call: F,
    ) -> Result<Option<u32>, StoreError>
    where
        F: Fn(Arc<RedisStore>, Arc<str>, Arc<str>) -> StoreFuture<'static, Option<u32>>,
    {
        let (k, o): (Arc<str>, Arc<str>) = (key.into(), owner.into());
        let mut calls: FuturesUnordered<_> = (self.masters.iter().enumerate())
            .map(|(i, m)| {
                let call = call(m.clone(), k.clone(), o.clone());
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
