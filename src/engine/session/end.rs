//! The end of a session: why it ended, and releasing everything it holds, at once,
//! with the lock-delay when the client may still be alive. A shutdown tells the client
//! `Lost` first.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_stream::StreamExt;

use super::all_attempt::AllResult;
use super::grants::{forget, lost_because};
use super::{AcquireResult, Done, Session, Slot};
use crate::engine::{EndReason, Event};
use crate::metrics::Loss;
use crate::store::{Store, names};

/// Why a session ended: it decides the lock-delay and what the client is told.
pub(super) enum End {
    /// The client closed its side: a graceful end.
    Closed,
    /// The transport broke (reset, cancel, keepalive timeout): the client may be alive
    /// and still using what it held, so the lock-delay applies.
    Broken,
    /// The sidecar shuts down.
    Shutdown,
    /// The client stopped reading its answers (or is gone).
    Overflow,
}

impl Session {
    /// Releases everything: held grants at once, grants that in-flight calls produce as
    /// they finish. Waits are cancelled first.
    pub(super) async fn finish(mut self, end: End) {
        for slot in self.slots.values() {
            if let Slot::Acquiring(a) = slot {
                a.cancel.cancel();
            }
        }
        if let End::Broken = end {
            // The client may be alive and see the same reset only now: its locks stay
            // held (and renewed) until it has had the time to suspend them.
            tokio::time::sleep(self.shared.config.broken_grace).await;
        }
        if self.journaled {
            // Its record goes: only a dead sidecar leaves something to resume.
            self.shared.journal.ended(&self.record);
        }
        let mut held = Vec::new();
        for (name, slot) in self.slots.drain() {
            if let Slot::Held(h) = slot {
                h.clock.release();
                forget(&self.shared.metrics, &h);
                held.push((name, h.owner, h.fence));
            }
        }
        if let End::Shutdown = end {
            for (name, _, fence) in &held {
                let reason = lost_because(Loss::Shutdown).to_owned();
                self.shared.metrics.lost(Loss::Shutdown);
                let (key, holder) = names::split(name);
                let _ = self.out.try_send(Event::Lost {
                    key: key.to_owned(),
                    reason,
                    fence: *fence,
                    holder: holder.to_owned(),
                });
            }
        }
        let (store, turns) = (&self.shared.store, &self.shared.store_calls);
        let delay = match end {
            End::Broken | End::Overflow => self.shared.config.lock_delay,
            End::Closed | End::Shutdown => Duration::ZERO,
        };
        let release_held =
            futures_util::future::join_all(held.iter().map(|(name, owner, fence)| {
                release_quietly(store, turns, names::key_of(name), owner, *fence, delay)
            }));
        let mut ops = std::mem::take(&mut self.ops);
        let finish_ops = async {
            let mut granted = Vec::new();
            while let Some(done) = ops.next().await {
                match done {
                    Done::Acquire {
                        claim,
                        outcome: AcquireResult::Granted { fence, .. },
                        ..
                    } => granted.push((claim.key, claim.owner, fence)),
                    Done::AcquireAll {
                        claims,
                        outcome: AllResult::Granted { taken, .. },
                        ..
                    } => {
                        for (at, fence, _) in taken {
                            if let Some((_, claim)) = claims.iter().find(|(a, _)| *a == at) {
                                granted.push((claim.key.clone(), claim.owner.clone(), fence));
                            }
                        }
                    }
                    _ => {}
                }
            }
            granted
        };
        let ((), granted) = tokio::join!(
            async {
                release_held.await;
            },
            finish_ops
        );
        futures_util::future::join_all(
            granted
                .iter()
                // Never handed to the client: no lock-delay.
                .map(|(key, owner, fence)| {
                    release_quietly(store, turns, key, owner, *fence, Duration::ZERO)
                }),
        )
        .await;
        match end {
            End::Shutdown => {
                let _ = self.out.try_send(Event::Ended(EndReason::Shutdown));
            }
            End::Closed | End::Broken | End::Overflow => {}
        }
        tracing::debug!(
            released = held.len() + granted.len(),
            "session released its locks"
        );
    }
}

/// Releases one grant, in its turn among the sessions' store calls
/// ([`crate::engine::MAX_STORE_CALLS`] at once): a session that ends holding thousands
/// of locks (or a hundred such ending together) would otherwise put every release on
/// the store at once, and the last ones would wait past the store timeout, leaving
/// their locks until the TTL. In turns, each call's timeout covers only itself.
async fn release_quietly(
    store: &Arc<dyn Store>,
    turns: &Semaphore,
    key: &str,
    owner: &str,
    fence: u64,
    delay: Duration,
) {
    // The semaphore is never closed; were it, the release would go without a turn.
    let _turn = turns.acquire().await;
    if let Err(e) = store.release_grant(key, owner, fence, delay).await {
        tracing::warn!(%key, error = %e, "release at session end failed; the lock expires at its TTL");
    }
}
