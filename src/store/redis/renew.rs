//! Batched renewal: `renew.lua` extends many grants in one call. On one server a batch
//! is cut into chunks of [`RENEW_CHUNK`] grants, sent concurrently (pipelined on the
//! multiplexed connection: one round trip). On a Cluster one script call may only touch
//! one slot, so the batch is first grouped by the slot of each lock's hash tag; the
//! groups go out concurrently too, and the cluster connection pipelines those bound for
//! the same node. Better, when the slot map can be read (`CLUSTER SLOTS`, once per
//! batch): the batch is grouped by the *node* that serves each slot and renewed with
//! `renew.lua` flagged `allow-cross-slot-keys` (Redis 7), so 10,000 locks cost about
//! ten calls per node again instead of one per slot; a chunk the node refuses (the
//! map changed) is renewed slot by slot instead. With `--min-replica-acks`, each slot
//! group is followed by its own `WAIT` on its node (see `acked.rs`).

use std::collections::BTreeMap;

use deadpool_redis::redis::{self, FromRedisValue, Value};

use super::{Conn, RedisStore, shards};
use crate::store::{Renewal, StoreError};

/// Grants per script call in a renewal batch: large enough that 10,000 locks take ten
/// calls pipelined in one round trip, small enough that one call does not stall Redis
/// (about a millisecond each).
pub(super) const RENEW_CHUNK: usize = 1000;

/// Slots in a Cluster.
const SLOTS: usize = 16384;

/// Which node serves each slot (an index into the nodes of one `CLUSTER SLOTS` reply).
fn slot_owners(reply: &Value) -> Option<Vec<usize>> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    let mut nodes: Vec<(Vec<u8>, i64)> = Vec::new();
    let mut owners = vec![usize::MAX; SLOTS];
    for range in ranges {
        let Value::Array(fields) = range else {
            return None;
        };
        let (Some(Value::Int(first)), Some(Value::Int(last)), Some(Value::Array(master))) =
            (fields.first(), fields.get(1), fields.get(2))
        else {
            return None;
        };
        let (Some(Value::BulkString(host)), Some(Value::Int(port))) =
            (master.first(), master.get(1))
        else {
            return None;
        };
        let node = (host.clone(), *port);
        let index = match nodes.iter().position(|n| *n == node) {
            Some(index) => index,
            None => {
                nodes.push(node);
                nodes.len() - 1
            }
        };
        let (first, last) = (usize::try_from(*first).ok()?, usize::try_from(*last).ok()?);
        for owner in owners.get_mut(first..=last)? {
            *owner = index;
        }
    }
    Some(owners)
}

impl RedisStore {
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
                let slot = usize::from(shards::slot(&self.key(r.key, "h")));
                let group = owners
                    .and_then(|o| o.get(slot).copied())
                    .unwrap_or(SLOTS + slot);
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

    /// Who serves which slot, for grouping a Cluster's renewals by node; `None` when
    /// it cannot be read (then renewals go per slot).
    async fn slot_map(&self) -> Option<Vec<usize>> {
        let reply = self
            .run(|mut conn| async move {
                redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async::<Value>(&mut conn)
                    .await
            })
            .await
            .ok()?;
        slot_owners(&reply)
    }

    /// Runs one renewal call (`renew_across.lua` when `across`, else `renew.lua`),
    /// loading the script on NOSCRIPT.
    async fn renew_once(
        &self,
        conn: &mut Conn,
        across: bool,
        batch: &[Renewal<'_>],
        chunk: &[usize],
    ) -> redis::RedisResult<Vec<i64>> {
        let (script, call) = if across {
            (
                &self.scripts.renew_across_slots,
                self.across_call(batch, chunk),
            )
        } else {
            (&self.scripts.renew, self.renew_call(batch, chunk))
        };
        match call.query_async::<Vec<i64>>(conn).await {
            Err(e) if e.code() == Some("NOSCRIPT") => {
                script.prepare_invoke().load_async(conn).await?;
                call.query_async(conn).await
            }
            other => other,
        }
    }

    /// Renews one chunk of a node group; if the node refuses it (the slot map moved
    /// on), slot by slot instead.
    async fn renew_across(
        &self,
        mut conn: Conn,
        batch: &[Renewal<'_>],
        chunk: &[usize],
    ) -> redis::RedisResult<Vec<i64>> {
        match self.renew_once(&mut conn, true, batch, chunk).await {
            Ok(flags) => Ok(flags),
            Err(e) if e.is_io_error() || e.is_timeout() => Err(e),
            Err(_) => {
                let mut by_slot: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
                for &i in chunk {
                    let slot = shards::slot(&self.key(batch[i].key, "h"));
                    by_slot.entry(slot).or_default().push(i);
                }
                let mut renewed: BTreeMap<usize, i64> = BTreeMap::new();
                for part in by_slot.values() {
                    let flags = self.renew_once(&mut conn, false, batch, part).await?;
                    renewed.extend(part.iter().copied().zip(flags));
                }
                Ok(chunk
                    .iter()
                    .map(|i| renewed.get(i).copied().unwrap_or(0))
                    .collect())
            }
        }
    }

    /// `renew_across.lua`: the first grant's keys route the call, every grant's keys
    /// and owner go in ARGV.
    fn across_call(&self, batch: &[Renewal<'_>], chunk: &[usize]) -> redis::Cmd {
        let mut call = redis::cmd("EVALSHA");
        call.arg(self.scripts.renew_across_slots.get_hash()).arg(2);
        if let Some(&first) = chunk.first() {
            call.arg(self.key(batch[first].key, "h"))
                .arg(self.key(batch[first].key, "d"));
        }
        for &i in chunk {
            call.arg(self.key(batch[i].key, "h"))
                .arg(self.key(batch[i].key, "d"))
                .arg(batch[i].owner)
                .arg(batch[i].ttl.as_millis() as u64);
        }
        call
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
        // By node on a Cluster when the slot map can be read; replica acknowledgement
        // keeps per-slot groups (each is followed by a WAIT on its node).
        let owners = if self.link.is_cluster() && self.acks.min == 0 {
            self.slot_map().await
        } else {
            None
        };
        let groups = self.renewal_groups(batch, owners.as_deref());
        let across = owners.is_some();
        let script = &self.scripts.renew;
        // Per group, the replies of its chunks and whether enough replicas acknowledged.
        let answers: Vec<(Vec<redis::Value>, bool)> = if self.acks.min > 0 {
            let calls = groups.iter().map(|chunks| {
                let calls = chunks.iter().map(|c| self.renew_call(batch, c)).collect();
                self.pipelined_with_wait(script, calls)
            });
            futures_util::future::try_join_all(calls).await?
        } else {
            let chunks: Vec<&Vec<usize>> = groups.iter().flatten().collect();
            let replies = self
                .run(|conn| async move {
                    // Concurrent calls on a multiplexed connection go out pipelined:
                    // one round trip for the whole batch (per node, on a Cluster).
                    let calls = chunks.iter().map(|chunk| {
                        let mut conn = conn.clone();
                        async move {
                            let flags = if across {
                                self.renew_across(conn, batch, chunk).await?
                            } else {
                                self.renew_once(&mut conn, false, batch, chunk).await?
                            };
                            Ok::<_, redis::RedisError>(Value::Array(
                                flags.into_iter().map(Value::Int).collect(),
                            ))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn node(port: i64) -> Value {
        Value::Array(vec![
            Value::BulkString(b"127.0.0.1".to_vec()),
            Value::Int(port),
            Value::BulkString(b"id".to_vec()),
        ])
    }

    #[test]
    fn the_slot_map_names_one_node_per_slot() {
        let range = |first, last, port| {
            Value::Array(vec![
                Value::Int(first),
                Value::Int(last),
                node(port),
                node(port + 3),
            ])
        };
        let reply = Value::Array(vec![
            range(0, 5460, 7000),
            range(5461, 10922, 7001),
            range(10923, 16383, 7002),
            range(16000, 16383, 7000),
        ]);
        let owners = slot_owners(&reply).expect("a map");
        assert_eq!((owners[0], owners[5460], owners[5461]), (0, 0, 1));
        assert_eq!((owners[10923], owners[16383]), (2, 0), "later ranges win");
        assert!(slot_owners(&Value::Int(1)).is_none());
        let out_of_range = Value::Array(vec![range(0, 20000, 7000)]);
        assert!(
            slot_owners(&out_of_range).is_none(),
            "no panic on a bad range"
        );
    }
}
