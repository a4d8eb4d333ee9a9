//! How one call reaches Redis: on the shared connection, within the store's timeout,
//! and what a failure does to the connection. Every method of the store goes through
//! [`RedisStore::run`] (or [`RedisStore::run_within`]); a script on one lock's keys
//! through [`RedisStore::invoke`].

use std::io::Write;

use deadpool_redis::redis::{self, RedisWrite, ToRedisArgs};

use super::link::Conn;
use super::scripts::Lua;
use super::{LOCK_PARTS, RedisStore};
use crate::store::StoreError;

/// How a command the store's ACL refused this sidecar's user (`NOPERM`) begins its
/// error: unavailable as far as a lock is concerned, told apart by the store's check.
pub(super) const REFUSED: &str = "refused by the store's ACL";

/// The store error of a failed Redis call: out of memory (a write refused over
/// `maxmemory`, by the command or inside a script), or unavailable (refused by the
/// ACL, or any other failure).
pub(super) fn store_error(e: &redis::RedisError) -> StoreError {
    if super::restarts::unverified(e) {
        StoreError::Unavailable(format!("{}: {e}", super::restarts::UNVERIFIED))
    } else if e.code() == Some("OOM") {
        StoreError::OutOfMemory(e.to_string())
    } else if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) {
        StoreError::Unavailable(format!("{REFUSED}: {e}"))
    } else {
        StoreError::Unavailable(e.to_string())
    }
}

impl RedisStore {
    /// Runs `f` on the shared connection within the timeout. On a broken connection, a
    /// server that is no longer the master, or a timeout, the connection is dropped, so
    /// the next call takes a fresh one (after a failover: to the new master).
    pub(super) async fn run<T, F, Fut>(&self, f: F) -> Result<T, StoreError>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        self.run_within(f, true).await
    }

    /// [`RedisStore::run`], saying whether a timeout drops the shared connection
    /// (calls off the lock path keep it: see `redis/sessions.rs`). A timeout is ours or
    /// redis-rs' own answer timeout (the same duration, so often in the same clock
    /// tick, and then redis-rs' error is what the call returns): both obey the flag.
    pub(super) async fn run_within<T, F, Fut>(
        &self,
        f: F,
        forget_on_timeout: bool,
    ) -> Result<T, StoreError>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        // The connection the call went out on: a timeout drops that one, not one that
        // replaced it meanwhile (see `Link::forget`).
        let used = std::sync::OnceLock::new();
        let attempt = async {
            let (conn, id) = self.link.connection_with_id().await?;
            let _ = used.set(id);
            f(conn).await.map_err(|e| {
                if forget_on_timeout || !e.is_timeout() {
                    self.link.failed(id, &e);
                }
                store_error(&e)
            })
        };
        match tokio::time::timeout(self.timeout, attempt).await {
            Ok(result) => result,
            Err(_) => {
                if forget_on_timeout {
                    // A call still connecting when it timed out went out on none.
                    if let Some(id) = used.get() {
                        self.link.forget(*id);
                    }
                }
                Err(StoreError::Unavailable(format!(
                    "no answer within {:?}",
                    self.timeout
                )))
            }
        }
    }

    /// Runs `lua` on the keys of the lock `key` (`RedisStore::keys`) with `args`,
    /// by EVALSHA (loading the script on NOSCRIPT).
    ///
    /// The command is built here, once, with room for all of it: redis-rs'
    /// `ScriptInvocation` first copies every key and argument into a `Vec` of its own
    /// (about fifteen allocations for an acquire) and then builds the same command;
    /// the lock's key names are written straight into it (four `String`s a call
    /// before).
    pub(super) async fn invoke<T: redis::FromRedisValue>(
        &self,
        lua: &Lua,
        key: &str,
        args: &[&[u8]],
    ) -> Result<T, StoreError> {
        let answer = self.invoke_unless_held_off(lua, key, args, false).await?;
        answer.ok_or_else(|| StoreError::Protocol("a call held off".into()))
    }

    /// [`RedisStore::invoke`]; with `grants`, not sent (`None`) while new grants are
    /// held off after the store may have lost data (`redis/restarts/`). Asked once the
    /// connection is made: a new connection learns of the loss before it is used. (On
    /// a Cluster the acquire script asks its own master instead: `lua/guard.lua`.)
    pub(super) async fn invoke_unless_held_off<T: redis::FromRedisValue>(
        &self,
        lua: &Lua,
        key: &str,
        args: &[&[u8]],
        grants: bool,
    ) -> Result<Option<T>, StoreError> {
        self.invoke_on(lua, key, None, args, grants).await
    }

    /// [`RedisStore::invoke_unless_held_off`], with a fifth key after the lock's:
    /// `{ns:record}:s` (a session's record, `redis/sessions.rs`, when `record` is
    /// `session/SID`).
    pub(super) async fn invoke_on<T: redis::FromRedisValue>(
        &self,
        lua: &Lua,
        key: &str,
        record: Option<&str>,
        args: &[&[u8]],
        grants: bool,
    ) -> Result<Option<T>, StoreError> {
        let record = record.map(|key| KeyName {
            namespace: &self.namespace,
            key,
            part: "s",
        });
        let lock = LOCK_PARTS.map(|part| KeyName {
            namespace: &self.namespace,
            key,
            part,
        });
        let keys: Vec<&KeyName> = lock.iter().chain(record.as_ref()).collect();
        // EVALSHA; or, where a Cluster node lacks the script, EVAL of its text on that
        // node alone (`SCRIPT LOAD` would go to every node and wait for a frozen one).
        let call = |head: &str, script: &str| {
            let bytes = (keys.iter().map(|k| k.len()))
                .chain(args.iter().map(|a| a.len()))
                .sum::<usize>()
                + head.len()
                + script.len()
                + 4;
            let mut cmd = redis::Cmd::with_capacity(3 + keys.len() + args.len(), bytes);
            cmd.arg(head).arg(script).arg(keys.len());
            for k in &keys {
                cmd.arg(*k);
            }
            for a in args {
                cmd.arg(*a);
            }
            cmd
        };
        let cmd = call("EVALSHA", lua.script.get_hash());
        let call = &call;
        self.run(|mut conn| async move {
            if grants && self.held_off_here() {
                return Ok(None);
            }
            match cmd.query_async(&mut conn).await.map(Some) {
                Err(e)
                    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    // A restarted or failed-over server (on one server: on the connection
                    // that read its marker; on a Cluster the guarded scripts check their
                    // master themselves).
                    if self.link.is_cluster() {
                        return call("EVAL", &lua.source)
                            .query_async(&mut conn)
                            .await
                            .map(Some);
                    }
                    lua.script.load_async(&mut conn).await?;
                    cmd.query_async(&mut conn).await.map(Some)
                }
                answer => answer,
            }
        })
        .await
    }
}

/// One key of a lock, `{ns:KEY}:part` (as `RedisStore::key` makes it), written into a
/// command piece by piece rather than made as a `String` first.
pub(super) struct KeyName<'a> {
    pub(super) namespace: &'a str,
    pub(super) key: &'a str,
    pub(super) part: &'a str,
}

impl KeyName<'_> {
    fn len(&self) -> usize {
        self.namespace.len() + self.key.len() + self.part.len() + 4
    }
}

impl ToRedisArgs for KeyName<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + RedisWrite,
    {
        let mut arg = out.writer_for_next_arg();
        for piece in ["{", self.namespace, ":", self.key, "}:", self.part] {
            // Writing into a command's buffer (a Vec) cannot fail.
            let _ = arg.write_all(piece.as_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names written into a command are those the rest of the store uses.
    #[test]
    fn key_names_are_the_stores_own() {
        let name = KeyName {
            namespace: "ns",
            key: "orders/42",
            part: "w",
        };
        let mut args: Vec<Vec<u8>> = Vec::new();
        name.write_redis_args(&mut args);
        assert_eq!(args, vec![b"{ns:orders/42}:w".to_vec()]);
        assert_eq!(name.len(), args[0].len());
    }
}
