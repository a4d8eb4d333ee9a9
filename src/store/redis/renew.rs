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
//! `renew.lua` flagged `allow-cross-slot-keys` (Redis 7), so 10,000 locks cost about
//! ten calls per node again instead of one per slot.
//! With `--min-replica-acks`, each chunk (grouped by slot) is followed by its own `WAIT`
//! on its node (see `acked.rs`).
//!
//! **One node's failure stays its own.** Every chunk is its own call with its own
//! timeout and its own answer: a frozen master fails the chunks it serves, whose grants
//! are answered [`Renewed::Failed`] (their sessions hear `Jeopardy`), while the other
//! nodes' chunks are renewed in the same tick as usual.
//!
//! **The slot map is read off the hot path.** `CLUSTER SLOTS` goes to whichever node
//! the cluster client picks, possibly the frozen one; asked at every tick it would add a
//! second timeout to every renewal. So the map is kept (`slots::SlotMap`) and read again in
//! the background: when none is known yet, and when a node refuses a chunk (a key of a
//! slot it no longer serves: the topology changed since the map was read). A refused
//! chunk is renewed slot by slot at once, and until a new map arrives the batch goes
//! per slot: correct in any topology, only more calls.

use std::collections::BTreeMap;
use std::sync::Arc;

use deadpool_redis::redis::{self, FromRedisValue};
use futures_util::future::join_all;
use futures_util::stream::{self, StreamExt};

use super::call::KeyName;
use super::{Conn, Lua, RedisStore, slots};
use crate::store::{Renewal, Renewed, StoreError};

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

    /// The batch's positions, grouped so that each group may go in one script call: by
    /// node when `owners` is known, else by slot on a Cluster (in slot order), all
    /// together on one server; then cut into chunks.
    fn renewal_groups(
        &self,
        batch: &[Renewal<'_>],
        owners: Option<&[usize]>,
    ) -> Vec<Vec<Vec<usize>>> {
        let groups: Vec<Vec<usize>> = if self.link.is_cluster() {
            let mut grouped: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
            for (i, r) in batch.iter().enumerate() {
                let slot = usize::from(slots::slot(&self.key(r.key, "h")));
                let group = owners
                    .and_then(|o| o.get(slot).copied())
                    .filter(|&node| node != usize::MAX)
                    .unwrap_or(slots::SLOTS + slot);
                grouped.entry(group).or_default().push(i);
            }
            grouped.into_values().collect()
        } else {
            vec![(0..batch.len()).collect()]
        };
        groups
            .into_iter()
            .map(|g| g.chunks(RENEW_CHUNK).map(<[usize]>::to_vec).collect())
            .collect()
    }

    /// Runs one renewal call (`renew_across.lua` when `across`, else `renew.lua`). On
    /// NOSCRIPT the same call goes again with `EVAL` and the script's text, which also
    /// caches the script on that node: `SCRIPT LOAD` would go to every node of a
    /// Cluster and wait for a frozen one, holding up the renewals of the healthy nodes.
    async fn renew_once(
        &self,
        conn: &mut Conn,
        across: bool,
        batch: &[Renewal<'_>],
        chunk: &[usize],
    ) -> redis::RedisResult<Vec<u8>> {
        let call = |source: bool| {
            if across {
                self.across_call(batch, chunk, source)
            } else {
                self.renew_call(batch, chunk, source)
            }
        };
        match call(false).query_async::<Vec<u8>>(conn).await {
            Err(e) if e.code() == Some("NOSCRIPT") => call(true).query_async(conn).await,
            other => other,
        }
    }

    /// Renews one chunk in its own call, within its own timeout. A chunk grouped by
    /// node (`across`) that the node refuses (the slot map moved on) is renewed slot by
    /// slot instead, each slot on its own, and the map is read again.
    async fn renew_chunk(&self, batch: &[Renewal<'_>], chunk: &[usize], across: bool) -> Answers {
        let answer = self
            .run(|mut conn| async move {
                match self.renew_once(&mut conn, across, batch, chunk).await {
                    // Answered, but refused: not a failure of the node.
                    Err(e) if across && !(e.is_io_error() || e.is_timeout()) => Ok(Err(e)),
                    other => other.map(Ok),
                }
            })
            .await;
        match answer {
            Ok(Ok(flags)) => flagged(chunk, flags),
            Err(e) => failed(chunk, e),
            Ok(Err(refused)) => {
                tracing::debug!(error = %refused, "a node refused a renewal chunk; renewing it per slot");
                self.slot_map.forget();
                self.slot_map.refresh(&self.link, self.timeout);
                let mut by_slot: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
                for &i in chunk {
                    let slot = slots::slot(&self.key(batch[i].key, "h"));
                    by_slot.entry(slot).or_default().push(i);
                }
                let parts = by_slot.values().map(|part| self.renew_slot(batch, part));
                join_all(parts).await.into_iter().flatten().collect()
            }
        }
    }

    /// Renews grants of one slot with `renew.lua`, within its own timeout.
    async fn renew_slot(&self, batch: &[Renewal<'_>], part: &[usize]) -> Answers {
        let answer = self
            .run(|mut conn| async move { self.renew_once(&mut conn, false, batch, part).await })
            .await;
        match answer {
            Ok(flags) => flagged(part, flags),
            Err(e) => failed(part, e),
        }
    }

    /// With `--min-replica-acks`: renews one chunk and waits for the replicas in one
    /// pipeline on its node, within its own timeout. Grants renewed on the master only
    /// count as failed: a failover could lose the renewal.
    async fn renew_acked(&self, batch: &[Renewal<'_>], chunk: &[usize]) -> Answers {
        let call = self.renew_call(batch, chunk, false);
        match self
            .pipelined_with_wait(&self.scripts.renew, call, None)
            .await
        {
            Ok(None) => failed(chunk, StoreError::Protocol("renew: held off".into())),
            Ok(Some((reply, true))) => match Vec::<u8>::from_redis_value(reply) {
                Ok(flags) => flagged(chunk, flags),
                Err(e) => failed(chunk, StoreError::Protocol(e.to_string())),
            },
            Ok(Some((_, false))) => failed(
                chunk,
                StoreError::Unavailable(format!(
                    "the renewal was not acknowledged by {} replicas within {:?}",
                    self.acks.min, self.acks.timeout
                )),
            ),
            Err(e) => failed(chunk, e),
        }
    }

    /// `EVALSHA hash`, or `EVAL source` when the node lacks the script.
    fn script_call(lua: &Lua, source: bool) -> redis::Cmd {
        if source {
            let mut call = redis::cmd("EVAL");
            call.arg(&lua.source);
            call
        } else {
            let mut call = redis::cmd("EVALSHA");
            call.arg(lua.script.get_hash());
            call
        }
    }

    /// `renew_across.lua`: the first grant's lock routes the call, every grant's lock,
    /// owner and TTL go in ARGV.
    fn across_call(&self, batch: &[Renewal<'_>], chunk: &[usize], source: bool) -> redis::Cmd {
        let mut call = Self::script_call(&self.scripts.renew_across_slots, source);
        call.arg(1);
        if let Some(&first) = chunk.first() {
            call.arg(self.lock_arg(batch[first].key));
        }
        for &i in chunk {
            call.arg(self.lock_arg(batch[i].key))
                .arg(batch[i].owner)
                .arg(batch[i].ttl.as_millis() as u64);
        }
        call
    }

    /// `renew.lua`: every grant's lock in KEYS, owners and TTLs in ARGV.
    fn renew_call(&self, batch: &[Renewal<'_>], chunk: &[usize], source: bool) -> redis::Cmd {
        let mut call = Self::script_call(&self.scripts.renew, source);
        call.arg(chunk.len());
        for &i in chunk {
            call.arg(self.lock_arg(batch[i].key));
        }
        for &i in chunk {
            call.arg(batch[i].owner)
                .arg(batch[i].ttl.as_millis() as u64);
        }
        call
    }

    /// Renews one group's chunks (one server, one Cluster node or slot),
    /// [`RENEW_IN_FLIGHT`] at a time, pipelined on the multiplexed connection.
    async fn renew_group(
        &self,
        batch: &[Renewal<'_>],
        chunks: &[Vec<usize>],
        across: bool,
    ) -> Vec<Answers> {
        // By position: a closure taking a `&Vec` would make the future not `Send`
        // (rust-lang/rust#64552).
        stream::iter(0..chunks.len())
            .map(|k| self.renew_one(batch, &chunks[k], across))
            .buffer_unordered(RENEW_IN_FLIGHT)
            .collect()
            .await
    }

    /// Renews one chunk: with replica acknowledgement, or else alone.
    async fn renew_one(&self, batch: &[Renewal<'_>], chunk: &[usize], across: bool) -> Answers {
        if self.acks.min > 0 {
            self.renew_acked(batch, chunk).await
        } else {
            self.renew_chunk(batch, chunk, across).await
        }
    }

    /// Renews `batch`: one answer per grant, in order. Every chunk (or, with replica
    /// acknowledgement, its WAIT with it) is its own call with its own timeout, so a
    /// node that does not answer fails its own grants only.
    pub(super) async fn renew_batch(
        &self,
        batch: &[Renewal<'_>],
    ) -> Result<Vec<Renewed>, StoreError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        // A Cluster whose node's connection dropped reads its masters' epoch markers
        // first, so a grant its restarted master lost is written back, not lost. A
        // master that cannot be read fails its own chunks below anyway.
        let _ = self.read_markers(None).await;
        // By node on a Cluster once the slot map is known; replica acknowledgement
        // keeps per-slot groups (each is followed by a WAIT on its node).
        let owners = if self.link.is_cluster() && self.acks.min == 0 {
            let owners = self.slot_map.get();
            if owners.is_none() {
                self.slot_map.refresh(&self.link, self.timeout);
            }
            owners
        } else {
            None
        };
        let groups = self.renewal_groups(batch, owners.as_deref().map(Vec::as_slice));
        let across = owners.is_some();
        // The groups (nodes, or slots) go concurrently.
        let answers: Vec<Answers> =
            join_all(groups.iter().map(|g| self.renew_group(batch, g, across)))
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
