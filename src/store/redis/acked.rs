//! Replica acknowledgement (`--min-replica-acks N`): a grant or a renewal counts only
//! once N replicas have it, so a failover to one of them cannot lose it.
//!
//! The script and `WAIT N timeout` go out pipelined on the same connection: `WAIT`
//! counts only the writes of the connection it is sent on. The connection is shared
//! (multiplexed), so `WAIT` also waits for other requests' writes made before it; that
//! is conservative (it can only wait longer or count fewer acknowledgements), never
//! optimistic.
//!
//! On a Cluster the pipeline is routed as one unit to the master of the script's slot,
//! on that node's one connection, so `WAIT` still follows the script there; a pipeline
//! that meets a MOVED fails as a whole (the grant is then not handed out).

use deadpool_redis::redis::{self, Value};

use super::{Lua, RedisStore};
use crate::store::StoreError;

impl RedisStore {
    /// Runs the acquire `script` on the keys of the lock `key` and `args`, then `WAIT`;
    /// returns the script's reply and whether enough replicas acknowledged it; `None`
    /// when not sent because new grants are held off (see
    /// `RedisStore::invoke_unless_held_off`).
    pub(super) async fn invoke_acked(
        &self,
        lua: &Lua,
        key: &str,
        args: &[&[u8]],
    ) -> Result<Option<(Value, bool)>, StoreError> {
        let keys = self.keys(key);
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha
            .arg(lua.script.get_hash())
            .arg(keys.len())
            .arg(&keys)
            .arg(args);
        self.pipelined_with_wait(lua, evalsha, true).await
    }

    /// Runs `call` (an EVALSHA of `lua`) and `WAIT` in one pipeline; loads the script
    /// and tries once more on NOSCRIPT. Returns the call's reply and whether enough
    /// replicas acknowledged it; with `grants`, `None` when new grants are held off.
    pub(super) async fn pipelined_with_wait(
        &self,
        lua: &Lua,
        call: redis::Cmd,
        grants: bool,
    ) -> Result<Option<(Value, bool)>, StoreError> {
        let wanted = self.acks.min;
        let mut pipe = redis::pipe();
        pipe.add_command(call);
        pipe.cmd("WAIT")
            .arg(wanted)
            .arg(self.acks.timeout.as_millis() as u64);
        let pipe = &pipe;
        let replies = self
            .run(|mut conn| async move {
                if grants && self.held_off_here() {
                    return Ok(None);
                }
                match pipe.query_async::<Vec<Value>>(&mut conn).await.map(Some) {
                    Err(e) if e.code() == Some("NOSCRIPT") => {
                        lua.script.prepare_invoke().load_async(&mut conn).await?;
                        pipe.query_async(&mut conn).await.map(Some)
                    }
                    other => other,
                }
            })
            .await?;
        let Some(mut replies) = replies else {
            return Ok(None);
        };
        let acks = match replies.pop() {
            Some(Value::Int(n)) => n,
            _ => return Err(StoreError::Protocol("WAIT: bad reply".into())),
        };
        let reply = replies.pop().unwrap_or(Value::Nil);
        Ok(Some((reply, acks >= i64::from(wanted))))
    }
}
