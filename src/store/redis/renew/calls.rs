//! The script calls of a renewal: `renew.lua` (one server, one slot) and
//! `renew_across.lua` (the slots of one Cluster master), each with the guard of its
//! master, by EVALSHA or, where a node lacks the script, EVAL; and with replica
//! acknowledgement, the call followed by its `WAIT`.

use deadpool_redis::redis::{self, FromRedisValue};

use super::super::{Conn, Lua, RedisStore};
use crate::store::{Renewal, StoreError};

impl RedisStore {
    /// Runs one renewal call (`renew_across.lua` when `across`, else `renew.lua`). On
    /// NOSCRIPT the same call goes again with `EVAL` and the script's text, which also
    /// caches the script on that node: `SCRIPT LOAD` would go to every node of a
    /// Cluster and wait for a frozen one, holding up the renewals of the healthy nodes.
    pub(super) async fn renew_once(
        &self,
        conn: &mut Conn,
        across: bool,
        batch: &[Renewal<'_>],
        chunk: &[usize],
        guard: &[u8],
    ) -> redis::RedisResult<Vec<u8>> {
        let call = |source: bool| {
            if across {
                self.across_call(batch, chunk, guard, source)
            } else {
                self.renew_call(batch, chunk, guard, source)
            }
        };
        match call(false).query_async::<Vec<u8>>(conn).await {
            Err(e) if e.code() == Some("NOSCRIPT") => call(true).query_async(conn).await,
            other => other,
        }
    }

    /// With `--min-replica-acks`: renews one chunk (of one slot) and waits for the
    /// replicas in one pipeline on its node, within its own timeout. Grants renewed on
    /// the master only count as failed: a failover could lose the renewal.
    pub(super) async fn renew_acked(
        &self,
        batch: &[Renewal<'_>],
        chunk: &[usize],
        guard: &[u8],
    ) -> Result<Vec<u8>, StoreError> {
        let call = self.renew_call(batch, chunk, guard, false);
        match (self.pipelined_with_wait(&self.scripts.renew, call, false)).await? {
            None => Err(StoreError::Protocol("renew: held off".into())),
            Some((reply, true)) => {
                Vec::<u8>::from_redis_value(reply).map_err(|e| StoreError::Protocol(e.to_string()))
            }
            Some((_, false)) => Err(StoreError::Unavailable(format!(
                "the renewal was not acknowledged by {} replicas within {:?}",
                self.acks.min, self.acks.timeout
            ))),
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

    /// `renew_across.lua`: the first grant's lock routes the call; the guard, then
    /// every grant's lock, owner and TTL go in ARGV.
    fn across_call(
        &self,
        batch: &[Renewal<'_>],
        chunk: &[usize],
        guard: &[u8],
        source: bool,
    ) -> redis::Cmd {
        let mut call = Self::script_call(&self.scripts.renew_across_slots, source);
        call.arg(1);
        if let Some(&first) = chunk.first() {
            call.arg(self.lock_arg(batch[first].key));
        }
        call.arg(guard);
        for &i in chunk {
            call.arg(self.lock_arg(batch[i].key))
                .arg(batch[i].owner)
                .arg(batch[i].ttl.as_millis() as u64);
        }
        call
    }

    /// `renew.lua`: every grant's lock in KEYS; the guard, then owners and TTLs in ARGV.
    fn renew_call(
        &self,
        batch: &[Renewal<'_>],
        chunk: &[usize],
        guard: &[u8],
        source: bool,
    ) -> redis::Cmd {
        let mut call = Self::script_call(&self.scripts.renew, source);
        call.arg(chunk.len());
        for &i in chunk {
            call.arg(self.lock_arg(batch[i].key));
        }
        call.arg(guard);
        for &i in chunk {
            call.arg(batch[i].owner)
                .arg(batch[i].ttl.as_millis() as u64);
        }
        call
    }
}
