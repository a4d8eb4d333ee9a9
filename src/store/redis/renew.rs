//! Batched renewal: `renew.lua` extends many grants in one call. On one server a batch
//! is cut into chunks of [`RENEW_CHUNK`] grants, sent concurrently (pipelined on the
//! multiplexed connection: one round trip). On a Cluster one script call may only touch
//! one slot, so the batch is first grouped by the slot of each lock's hash tag; the
//! groups go out concurrently too, and the cluster connection pipelines those bound for
//! the same node. With `--min-replica-acks`, each group is followed by its own `WAIT`
//! on its node (see `acked.rs`).

use std::collections::BTreeMap;

use deadpool_redis::redis::{self, FromRedisValue};

use super::{RedisStore, shards};
use crate::store::{Renewal, StoreError};

/// Grants per script call in a renewal batch: large enough that 10,000 locks take ten
/// calls pipelined in one round trip, small enough that one call does not stall Redis
/// (about a millisecond each).
pub(super) const RENEW_CHUNK: usize = 1000;

impl RedisStore {
    /// The batch's positions, grouped so that each group may go in one script call: by
    /// slot on a Cluster (in slot order), all together otherwise; then cut into chunks.
    fn renewal_groups(&self, batch: &[Renewal<'_>]) -> Vec<Vec<Vec<usize>>> {
        let groups: Vec<Vec<usize>> = if self.link.is_cluster() {
            let mut by_slot: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
            for (i, r) in batch.iter().enumerate() {
                by_slot
                    .entry(shards::slot(&self.key(r.key, "h")))
                    .or_default()
                    .push(i);
            }
            by_slot.into_values().collect()
        } else {
            vec![(0..batch.len()).collect()]
        };
        groups
            .into_iter()
            .map(|g| g.chunks(RENEW_CHUNK).map(<[usize]>::to_vec).collect())
            .collect()
    }

    fn renew_call(&self, batch: &[Renewal<'_>], chunk: &[usize]) -> redis::Cmd {
        let mut call = redis::cmd("EVALSHA");
        call.arg(self.scripts.renew.get_hash()).arg(chunk.len() * 2);
        for &i in chunk {
            call.arg(self.key(batch[i].key, "h"))
                .arg(self.key(batch[i].key, "d"));
        }
        for &i in chunk {
            call.arg(batch[i].owner)
                .arg(batch[i].ttl.as_millis() as u64);
        }
        call
    }

    /// Renews `batch`: `true` per grant still held and now extended, in order.
    pub(super) async fn renew_batch(&self, batch: &[Renewal<'_>]) -> Result<Vec<bool>, StoreError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let groups = self.renewal_groups(batch);
        let script = &self.scripts.renew;
        // Per group, the replies of its chunks and whether enough replicas acknowledged.
        let answers: Vec<(Vec<redis::Value>, bool)> = if self.acks.min > 0 {
            let calls = groups.iter().map(|chunks| {
                let calls = chunks.iter().map(|c| self.renew_call(batch, c)).collect();
                self.pipelined_with_wait(script, calls)
            });
            futures_util::future::try_join_all(calls).await?
        } else {
            let calls: Vec<redis::Cmd> = groups
                .iter()
                .flatten()
                .map(|c| self.renew_call(batch, c))
                .collect();
            let replies = self
                .run(|conn| async move {
                    // Concurrent calls on a multiplexed connection go out pipelined:
                    // one round trip for the whole batch (per node, on a Cluster).
                    let calls = calls.iter().map(|call| {
                        let mut conn = conn.clone();
                        async move {
                            match call.query_async::<redis::Value>(&mut conn).await {
                                Err(e) if e.code() == Some("NOSCRIPT") => {
                                    script.prepare_invoke().load_async(&mut conn).await?;
                                    call.query_async(&mut conn).await
                                }
                                other => other,
                            }
                        }
                    });
                    futures_util::future::try_join_all(calls).await
                })
                .await?;
            vec![(replies, true)]
        };
        if answers.iter().any(|(_, acked)| !acked) {
            // Renewed on the master only: not a renewal a failover keeps.
            return Err(StoreError::Unavailable(format!(
                "the renewal was not acknowledged by {} replicas within {:?}",
                self.acks.min, self.acks.timeout
            )));
        }
        let chunks = groups.iter().flatten();
        let replies = answers.into_iter().flat_map(|(replies, _)| replies);
        let mut renewed = vec![false; batch.len()];
        let mut seen = 0;
        for (chunk, reply) in chunks.zip(replies) {
            let flags = Vec::<i64>::from_redis_value(reply)
                .map_err(|e| StoreError::Protocol(e.to_string()))?;
            if flags.len() != chunk.len() {
                return Err(StoreError::Protocol("renew: bad reply".into()));
            }
            for (&i, flag) in chunk.iter().zip(flags) {
                renewed[i] = flag == 1;
            }
            seen += chunk.len();
        }
        if seen != batch.len() {
            return Err(StoreError::Protocol("renew: bad reply".into()));
        }
        Ok(renewed)
    }
}
