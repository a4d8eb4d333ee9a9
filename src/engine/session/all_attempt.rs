//! One `AcquireAll` at work: every key it does not hold yet is tried at once; when one
//! is busy, those taken are given back and the request waits, holding nothing, for a
//! notice on a busy key (or its holder's expiry), then tries again; once every one is
//! taken, the keys the holder held already are held once more. See `all.rs` for why
//! this never deadlocks and how fair requests keep their place.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{join_all, select_all};
use tokio::sync::{Semaphore, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::attempt::Listening;
use super::{Done, Note};
use crate::engine::wakers::WaitGuard;
use crate::store::{Acquired, Claim, Store, StoreError};

/// A key the request holds already: held once more when the others are taken.
pub(super) struct Again {
    /// Its place in the request's keys.
    pub(super) at: usize,
    pub(super) key: String,
    pub(super) owner: Arc<str>,
    /// The holds wanted (one more than now).
    pub(super) count: u32,
    pub(super) ttl: Duration,
}

pub(super) struct AllOp {
    pub(super) store: Arc<dyn Store>,
    pub(super) turns: Arc<Semaphore>,
    pub(super) request_id: u64,
    /// The keys to take, with their place in the request's keys; their claims.
    pub(super) claims: Vec<(usize, Claim)>,
    pub(super) names: Vec<Arc<str>>,
    pub(super) again: Vec<Again>,
    pub(super) wait_until: Option<Instant>,
    /// One per claim when the request may wait.
    pub(super) guards: Vec<WaitGuard>,
    pub(super) cancel: CancellationToken,
    pub(super) waiting: mpsc::UnboundedSender<Note>,
}

/// How an `AcquireAll` ended.
pub(super) enum AllResult {
    /// Every key taken: (place, token, when its write was sent) of each new grant, and
    /// (place, holds) of each key held once more.
    Granted {
        taken: Vec<(usize, u64, Instant)>,
        held: Vec<(usize, u32)>,
    },
    /// Busy (and not waiting), timed out, or cancelled; the place of a key not free.
    Busy(usize),
    Timeout(usize),
    Cancelled(usize),
    /// A key is held with another limit (a semaphore).
    Conflict(usize, u32),
    Unavailable(usize, StoreError),
}

/// One try of every claim at once: the grants made, or what kept them from it.
enum Tried {
    All(Vec<(usize, u64, Instant)>),
    /// Busy: the grants made meanwhile (to give back), the claims that were busy (by
    /// their index in the claims), the first busy key's place and when to look again,
    /// its queue position, and the ticket the store offered.
    Busy {
        taken: Vec<(usize, u64)>,
        busy: Vec<usize>,
        at: usize,
        look: Duration,
        position: u32,
        ticket: u64,
    },
    Failed(Vec<(usize, u64)>, AllResult),
}

pub(super) async fn acquire_all(mut op: AllOp) -> Done {
    let outcome = attempts(&mut op).await;
    if op.claims.iter().any(|(_, c)| c.wait) {
        // The registrations (and fair queue places) the tries left: the request has
        // ended. Not granted, it leaves nothing in the store when it answers; granted,
        // they go in the background (a place in a queue of a key it holds keeps
        // nobody from anything).
        let store = op.store.clone();
        let claims: Vec<Claim> = op.claims.iter().map(|(_, c)| c.clone()).collect();
        let unwait = async move {
            join_all(claims.iter().map(|c| store.unwait(c))).await;
        };
        match outcome {
            AllResult::Granted { .. } => drop(tokio::spawn(unwait)),
            _ => unwait.await,
        }
    }
    Done::AcquireAll {
        request_id: op.request_id,
        claims: op.claims,
        names: op.names,
        outcome,
    }
}

async fn attempts(op: &mut AllOp) -> AllResult {
    let mut told = false;
    // Tries in a row that took some keys and gave them back: two requests for the same
    // keys that keep meeting back off, each a random while (so that one gets through).
    let mut collisions = 0u32;
    // Held until this function returns: notices of every key flow meanwhile.
    let mut listening: Vec<Listening> = Vec::new();
    loop {
        match try_all(op).await {
            Tried::All(taken) => return hold_again(op, taken).await,
            Tried::Failed(taken, result) => {
                give_back(op, &taken).await;
                return result;
            }
            Tried::Busy {
                taken,
                busy,
                at,
                look,
                position,
                ticket,
            } => {
                collisions = if taken.is_empty() { 0 } else { collisions + 1 };
                give_back(op, &taken).await;
                let Some(until) = op.wait_until else {
                    return AllResult::Busy(at);
                };
                if Instant::now() >= until {
                    return AllResult::Timeout(at);
                }
                if listening.is_empty() {
                    let keys = op.claims.iter().map(|(_, c)| c.key.clone());
                    let listens = keys.map(|key| {
                        let store = op.store.clone();
                        async move { Listening::start(&store, &key).await }
                    });
                    tokio::select! {
                        listened = join_all(listens) => listening = listened,
                        _ = op.cancel.cancelled() => return AllResult::Cancelled(at),
                        _ = tokio::time::sleep_until(until) => return AllResult::Timeout(at),
                    }
                }
                if op.claims.iter().any(|(_, c)| c.ticket.is_none()) && ticket > 0 {
                    // From now on every claim registers, with one ticket for all its
                    // keys (the store's clock at this first busy answer), so that every
                    // key orders this request alike among the fair ones.
                    for (_, claim) in &mut op.claims {
                        claim.wait = true;
                        claim.ticket = Some(ticket);
                    }
                    // Registered only by the next try, which goes at once (notices flow:
                    // a release since the busy answer would be unheard otherwise).
                    continue;
                }
                if !told {
                    told = true;
                    let _ = op.waiting.send(Note::Waiting {
                        request_id: op.request_id,
                        name: op.names[at].clone(),
                        position,
                    });
                }
                let ttl = op.claims.first().map_or(look, |(_, c)| c.ttl);
                let look_again = Instant::now() + (look + Duration::from_millis(1)).min(ttl / 3);
                // Woken by the keys that were busy only: a key this try took and gave
                // back is free (its own release would wake it for nothing, again and
                // again); should another take it meanwhile, the next try finds it busy.
                let wakes: Vec<_> = busy
                    .iter()
                    .filter_map(|i| op.guards.get(*i))
                    .map(|g| Box::pin(g.notified()))
                    .collect();
                let woken = async {
                    match wakes.is_empty() {
                        true => std::future::pending().await,
                        false => drop(select_all(wakes).await),
                    }
                };
                tokio::select! {
                    biased;
                    _ = woken => {}
                    _ = op.cancel.cancelled() => return AllResult::Cancelled(at),
                    _ = tokio::time::sleep_until(until) => return AllResult::Timeout(at),
                    _ = tokio::time::sleep_until(look_again) => {}
                }
                // The first try after a wake goes at once (a release woke it: the usual
                // handoff); one that collides again backs off, so that two requests
                // woken by each other's give-backs do not meet forever.
                if collisions > 1 {
                    tokio::select! {
                        _ = tokio::time::sleep(backoff(collisions - 1)) => {}
                        _ = op.cancel.cancelled() => return AllResult::Cancelled(at),
                        _ = tokio::time::sleep_until(until) => return AllResult::Timeout(at),
                    }
                }
            }
        }
    }
}

/// A random while, up to 2^collisions ms (at most 64 ms), before trying again.
fn backoff(collisions: u32) -> Duration {
    let most = 1u64 << collisions.min(6);
    let mut bytes = [0u8; 8];
    let _ = getrandom::fill(&mut bytes);
    Duration::from_micros(u64::from_le_bytes(bytes) % (most * 1000 + 1))
}

/// Tries every claim at once, each in its turn among the sessions' store calls.
async fn try_all(op: &AllOp) -> Tried {
    let tries = op.claims.iter().map(|(at, claim)| async move {
        let sent_at = Instant::now();
        let _turn = op.turns.acquire().await;
        (*at, sent_at, op.store.acquire(claim).await)
    });
    let answers = join_all(tries).await;
    let mut taken = Vec::new();
    let mut busy: Option<(usize, Duration, u32, u64)> = None;
    let mut busy_claims = Vec::new();
    let mut failed = None;
    let mut sent = Vec::new();
    for (i, (at, sent_at, answer)) in answers.into_iter().enumerate() {
        match answer {
            Ok(Acquired::Granted { fence }) => {
                taken.push((at, fence));
                sent.push((at, fence, sent_at));
            }
            Ok(Acquired::Busy {
                expires_in,
                position,
                ticket,
            }) => {
                busy_claims.push(i);
                let first = busy.is_none_or(|(_, look, _, _)| expires_in < look);
                let best = busy.map_or(ticket, |(_, _, _, t)| t.max(ticket));
                if first {
                    busy = Some((at, expires_in, position, best));
                } else if let Some(b) = busy.as_mut() {
                    b.3 = best;
                }
            }
            Ok(Acquired::Conflict { limit }) => {
                failed.get_or_insert(AllResult::Conflict(at, limit));
            }
            Err(e) => {
                failed.get_or_insert(AllResult::Unavailable(at, e));
            }
        }
    }
    if let Some(result) = failed {
        return Tried::Failed(taken, result);
    }
    match busy {
        Some((at, look, position, ticket)) => Tried::Busy {
            taken,
            busy: busy_claims,
            at,
            look,
            position,
            ticket,
        },
        None => Tried::All(sent),
    }
}

/// Gives back the grants of a try that could not take every key (its token tells the
/// store the whole release in one step). Waited for: the request waits holding nothing.
async fn give_back(op: &AllOp, taken: &[(usize, u64)]) {
    let releases = taken.iter().filter_map(|(at, fence)| {
        let (_, claim) = op.claims.iter().find(|(a, _)| a == at)?;
        Some(async move {
            let _turn = op.turns.acquire().await;
            let released = op.store.release_grant(&claim.key, &claim.owner, *fence, Duration::ZERO);
            if let Err(e) = released.await {
                tracing::debug!(key = %claim.key, error = %e, "giving back a key of a request for several failed; it expires at its TTL");
            }
        })
    });
    join_all(releases).await;
}

/// Every new key is taken: the keys held already are held once more. If one cannot be,
/// nothing is kept (the new grants go back).
async fn hold_again(op: &AllOp, taken: Vec<(usize, u64, Instant)>) -> AllResult {
    let holds = op.again.iter().map(|a| async move {
        let _turn = op.turns.acquire().await;
        (
            a.at,
            op.store.reenter(&a.key, &a.owner, a.count, a.ttl).await,
        )
    });
    let mut held = Vec::new();
    let mut failed = None;
    for (at, answer) in join_all(holds).await {
        match answer {
            Ok(Some(count)) => held.push((at, count)),
            Ok(None) => {
                let e = StoreError::Protocol("a key held before is held no longer".into());
                failed.get_or_insert(AllResult::Unavailable(at, e));
            }
            Err(e) => {
                failed.get_or_insert(AllResult::Unavailable(at, e));
            }
        }
    }
    match failed {
        None => AllResult::Granted { taken, held },
        Some(result) => {
            let back: Vec<(usize, u64)> = taken.iter().map(|(at, f, _)| (*at, *f)).collect();
            give_back(op, &back).await;
            result
        }
    }
}
