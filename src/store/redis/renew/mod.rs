//! Batched renewal: `renew.lua` extends many grants in one call. On one server a batch
//! is cut into chunks of [`RENEW_CHUNK`] grants, [`RENEW_IN_FLIGHT`] of them on the
//! multiplexed connection at a time (pipelined: a round trip is not paid per chunk).
//! Never the whole batch at once: each call's timeout starts when it is sent, and a
//! chunk queued behind 99 others in Redis would spend its timeout waiting for them (at
//! 100,000 locks on a busy machine the later chunks timed out, their grants went
//! failing and were retried with the next ones, and the batches grew).
//!
//! On a Cluster one script call may only touch one slot, so the batch is grouped by the
//! slot of each lock's hash tag; the groups go out concurrently, and the cluster
//! connection pipelines those bound for the same node. Better, once the slot map is
//! known: the batch is grouped by the *node* that serves each slot and renewed with
//! `renew_across.lua` flagged `allow-cross-slot-keys` (Redis 7), so 10,000 locks cost
//! about ten calls per node again instead of one per slot.
//! With `--min-replica-acks`, each chunk (grouped by slot) is followed by its own `WAIT`
//! on its node (see `acked.rs`).
//!
//! **One node's failure stays its own.** Every chunk is its own call with its own
//! timeout and its own answer: a frozen master fails the chunks it serves, whose grants
//! are answered [`Renewed::Failed`] (their sessions hear `Jeopardy`), while the other
//! nodes' chunks are renewed in the same tick as usual.
//!
//! **Each node's chunks carry its guard** (`redis/restarts/witness.rs`): a renewal that
//! reaches a master whose tenure this sidecar did not read (restarted, promoted) renews
//! nothing and answers `UNVERIFIED`; the master's marker is read (which starts the
//! hold-off if the tenure changed) and the chunk sent once more, so a grant that master
//! lost is written back rather than taken for lost. A guard is read for its node alone:
//! a frozen master's reading delays its own chunks, never another node's.
//!
//! **The slot map is read off the hot path.** `CLUSTER SLOTS` goes to whichever node
//! the cluster client picks, possibly the frozen one; asked at every tick it would add a
//! second timeout to every renewal. So the map is kept (`slots::SlotMap`) and read again
//! when a node refuses a chunk (a key of a slot it no longer serves: the topology
//! changed since the map was read): that chunk waits for the new map and is renewed
//! once more by it, the other chunks do not wait.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::future::join_all;
use futures_util::stream::{self, StreamExt};

mod calls;

use super::call::KeyName;
use super::restarts::UNVERIFIED;
use super::{RedisStore, slots};
use crate::store::{Early, Renewal, Renewed, StoreError};

/// Grants per script call in a renewal batch: large enough that 10,000 locks take ten
/// calls pipelined in one round trip, small enough that one call does not stall Redis
/// (about a millisecond each).
pub(super) const RENEW_CHUNK: usize = 1000;

/// Chunks of one group (one server, one Cluster node) in flight at a time: two, so
/// that Redis runs one while the next is on its way, and a call's timeout measures
/// that call and at most one before it.
pub(super) const RENEW_IN_FLIGHT: usize = 2;

/// The answers for some grants of a batch: (position in the batch, answer).
type Answers = Vec<(usize, Renewed)>;

/// Every grant of `chunk` answered `Failed` with `error`.
fn failed(chunk: &[usize], error: StoreError) -> Answers {
    let error = Arc::new(error);
    chunk
        .iter()
        .map(|&i| (i, Renewed::Failed(error.clone())))
        .collect()
}

/// The script's flags (b'1': renewed, b'0': not held) for the grants of `chunk`.
fn flagged(chunk: &[usize], flags: Vec<u8>) -> Answers {
    if flags.len() != chunk.len() {
        return failed(chunk, StoreError::Protocol("renew: bad reply".into()));
    }
    chunk
        .iter()
        .zip(flags)
        .map(|(&i, flag)| {
            let answer = if flag == b'1' {
                Renewed::Extended
            } else {
                Renewed::NotHeld
            };
            (i, answer)
        })
        .collect()
}

/// Grants of a batch that go in the same calls: one server, one Cluster master (or, with
/// `--min-replica-acks`, one slot of it), cut into chunks.
struct Group {
    /// The master's index in the slot map (Cluster).
    node: Option<usize>,
    chunks: Vec<Vec<usize>>,
}

/// Whether `e` is a master's refusal of a chunk (a slot it does not serve), not a
/// failure of the master (no answer, a broken connection).
fn refused(e: &StoreError) -> bool {
    match e {
        StoreError::Unavailable(m) => {
            !m.starts_with(UNVERIFIED)
                && ["MOVED", "ASK", "CROSSSLOT", "TRYAGAIN", "CLUSTERDOWN"]
                    .iter()
                    .any(|code| m.contains(code))
        }
        _ => false,
    }
}

impl RedisStore {
    /// A lock's key `{ns:KEY}:h`, written straight into the command: a renewal of
    /// 100,000 locks builds no `String` per lock.
    fn lock_arg<'a>(&'a self, key: &'a str) -> KeyName<'a> {
        KeyName {
            namespace: &self.namespace,
            key,
            part: "h",
        }
    }

    /// The batch's positions (or those of `only`), grouped so that each group may go in
    /// one script call: by master on a Cluster (by slot with replica acknowledgement,
    /// each slot's `WAIT` following it), all together on one server; then cut into
    /// chunks.
    fn renewal_groups(
        &self,
        batch: &[Renewal<'_>],
        owners: Option<&slots::Owners>,
        only: Option<&[usize]>,
    ) -> Vec<Group> {
        let all: Vec<usize> = match only {
            Some(only) => only.to_vec(),
            None => (0..batch.len()).collect(),
        };
        let groups: Vec<(Option<usize>, Vec<usize>)> = match owners {
            Some(owners) => {
                let mut grouped: BTreeMap<(usize, u16), Vec<usize>> = BTreeMap::new();
                for i in all {
                    let slot = slots::slot(&self.key(batch[i].key, "h"));
                    let node = owners.node(slot).map_or(usize::MAX, |(node, _)| node);
                    let slot = if self.acks.min > 0 { slot } else { 0 };
                    grouped.entry((node, slot)).or_default().push(i);
                }
                let node = |n: usize| (n != usize::MAX).then_some(n);
                (grouped.into_iter())
                    .map(|((n, _), g)| (node(n), g))
                    .collect()
            }
            None => vec![(None, all)],
        };
        groups
            .into_iter()
            .map(|(node, g)| Group {
                node,
                chunks: g.chunks(RENEW_CHUNK).map(<[usize]>::to_vec).collect(),
            })
            .collect()
    }

    /// Renews one chunk in its own call, within its own timeout: with replica
    /// acknowledgement, or else alone; across the slots of its master on a Cluster.
    async fn renew_call_once(
        &self,
        batch: &[Renewal<'_>],
        chunk: &[usize],
        guard: &[u8],
    ) -> Result<Vec<u8>, StoreError> {
        if self.acks.min > 0 {
            return self.renew_acked(batch, chunk, guard).await;
        }
        let across = self.link.is_cluster();
        self.run(|mut conn| async move {
            self.renew_once(&mut conn, across, batch, chunk, guard)
                .await
        })
        .await
    }

    /// Renews one chunk of master `node` (Cluster) under its guard. A chunk its master
    /// answers `UNVERIFIED` goes once more after the master's marker is read again; one
    /// it refuses (the slot map moved on) once more by a new map.
    async fn renew_chunk(
        &self,
        batch: &[Renewal<'_>],
        chunk: &[usize],
        node: Option<usize>,
        owners: Option<&slots::Owners>,
    ) -> Answers {
        let (owners, index) = match (owners, node) {
            (Some(owners), Some(index)) => (owners, index),
            (Some(_), None) => {
                let e = StoreError::Unavailable("no master serves these slots".into());
                return failed(chunk, e);
            }
            _ => {
                let guard = self.witnesses.none.clone();
                return match self.renew_call_once(batch, chunk, &guard).await {
                    Ok(flags) => flagged(chunk, flags),
                    Err(e) => failed(chunk, e),
                };
            }
        };
        let addr = &owners.nodes[index];
        let guard = match self.guard_of(owners, index, addr).await {
            Ok(guard) => guard,
            // The master the map names may be one no longer.
            Err(e) => return self.renew_moved(batch, chunk, e).await,
        };
        match self.renew_call_once(batch, chunk, &guard).await {
            Ok(flags) => flagged(chunk, flags),
            Err(StoreError::Unavailable(e)) if e.starts_with(UNVERIFIED) => {
                // Restarted, promoted, or the slots moved on: read again.
                self.witnesses.forget(addr, Some(&guard), None);
                self.renew_moved(batch, chunk, StoreError::Unavailable(e))
                    .await
            }
            Err(e) if refused(&e) => self.renew_moved(batch, chunk, e).await,
            Err(e) => failed(chunk, e),
        }
    }

    /// A chunk its master refused (`error`: a slot it does not serve, a tenure not
    /// read): the slot map is read again, and the chunk renewed once more by it.
    async fn renew_moved(
        &self,
        batch: &[Renewal<'_>],
        chunk: &[usize],
        error: StoreError,
    ) -> Answers {
        tracing::debug!(%error, "a node refused a renewal chunk, or its marker could not be read; reading the slot map again");
        self.slot_map.forget();
        let Some(owners) = self.slot_map.read_now(&self.link, self.timeout).await else {
            return failed(chunk, error);
        };
        let groups = self.renewal_groups(batch, Some(&owners), Some(chunk));
        let parts = groups.iter().flat_map(|g| {
            (g.chunks.iter()).map(|c| self.renew_chunk_again(batch, c, g.node, &owners))
        });
        join_all(parts).await.into_iter().flatten().collect()
    }

    /// [`Self::renew_chunk`] once, without a second refusal's new map.
    async fn renew_chunk_again(
        &self,
        batch: &[Renewal<'_>],
        chunk: &[usize],
        node: Option<usize>,
        owners: &slots::Owners,
    ) -> Answers {
        let Some(index) = node else {
            return failed(chunk, StoreError::Unavailable("no master serves it".into()));
        };
        let addr = &owners.nodes[index];
        let guard = match self.guard_of(owners, index, addr).await {
            Ok(guard) => guard,
            Err(e) => return failed(chunk, e),
        };
        match self.renew_call_once(batch, chunk, &guard).await {
            Ok(flags) => flagged(chunk, flags),
            Err(e) => failed(chunk, e),
        }
    }

    /// Renews one group's chunks (one server, one Cluster master or slot),
    /// [`RENEW_IN_FLIGHT`] at a time, pipelined on the multiplexed connection.
    async fn renew_group(
        &self,
        batch: &[Renewal<'_>],
        group: &Group,
        owners: Option<&slots::Owners>,
        early: Early<'_>,
    ) -> Vec<Answers> {
        // By position: a closure taking a `&Vec` would make the future not `Send`
        // (rust-lang/rust#64552).
        // Each chunk, its master's reading and a new slot map included, within one store
        // timeout: a batch is answered when its last chunk is, so a frozen master's
        // chunks must not make the healthy masters' answers late.
        let chunks = &group.chunks;
        stream::iter(0..chunks.len())
            .map(|k| async move {
                let chunk = &chunks[k];
                let renewed = self.renew_chunk(batch, chunk, group.node, owners);
                let answers = match tokio::time::timeout(self.timeout, renewed).await {
                    Ok(answers) => answers,
                    Err(_) => failed(
                        chunk,
                        StoreError::Unavailable(format!("no answer within {:?}", self.timeout)),
                    ),
                };
                // Told now: the batch is answered when its slowest chunk is.
                for (i, answer) in &answers {
                    early(*i, answer);
                }
                answers
            })
            .buffer_unordered(RENEW_IN_FLIGHT)
            .collect()
            .await
    }

    /// Renews `batch`: one answer per grant, in order. Every chunk (or, with replica
    /// acknowledgement, its WAIT with it) is its own call with its own timeout, so a
    /// node that does not answer fails its own grants only.
    pub(super) async fn renew_batch(
        &self,
        batch: &[Renewal<'_>],
        early: Early<'_>,
    ) -> Result<Vec<Renewed>, StoreError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        // A Cluster's renewals go by master, each under its master's guard.
        let owners = match self.link.is_cluster() {
            true => Some(self.owners().await?),
            false => None,
        };
        let owners = owners.as_deref();
        let groups = self.renewal_groups(batch, owners, None);
        // The groups (masters, or slots) go concurrently.
        let answers: Vec<Answers> = join_all(
            groups
                .iter()
                .map(|g| self.renew_group(batch, g, owners, early)),
        )
        .await
        .into_iter()
        .flatten()
        .collect();
        let mut renewed: Vec<Option<Renewed>> = vec![None; batch.len()];
        for (i, answer) in answers.into_iter().flatten() {
            if let Some(slot) = renewed.get_mut(i) {
                *slot = Some(answer);
            }
        }
        let missing = Arc::new(StoreError::Protocol(
            "renew: a grant went unanswered".into(),
        ));
        Ok(renewed
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Renewed::Failed(missing.clone())))
            .collect())
    }
}
