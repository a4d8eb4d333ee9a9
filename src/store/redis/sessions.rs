//! Session records, attachments and resuming on Redis (`store/sessions.rs` says what
//! they are for). Keys, each its own Cluster slot:
//!
//! - `{ns:session/SID}:s`, a hash: `t` the SHA-1 of the session's secret, `a` the
//!   sidecar it is attached to, `c` its client name, `k:KEY → n|ttl_ms|fence` per lock
//!   it holds (`lua/record.lua`). Past 64 locks the lines move to buckets
//!   `{ns:session/SID}:s:N` (`KEY → n|ttl_ms|fence`), each small enough to stay a
//!   listpack, and the record keeps their number `b` and its lines' `n`: one hash of
//!   thousands of lines is a dict at ~130 bytes a line, the buckets ~50. The buckets
//!   share the record's hash tag, so the scripts reach them in the record's slot. The
//!   suffix `:s` is not one of a lock's (`h w q l`), so a client's key named
//!   `session/SID` cannot meet it.
//! - `{ns:sidecar/ID}:a`, a string with a short TTL: the sidecar is alive.
//!
//! Every record write is its own script call (`record.lua`, checking the secret's
//! hash), sent concurrently: pipelined on the shared connection. Resuming is three
//! steps, because the attachment lives in another slot than the record: check the
//! secret and read the attachment (`resume.lua` `check`), `EXISTS` the attachment,
//! claim the record if nothing changed meanwhile (`resume.lua` `claim`); then one
//! `rekey.lua` call per listed lock, concurrently.

use deadpool_redis::redis::{self, FromRedisValue, Value};
use futures_util::future::join_all;

use super::RedisStore;
use super::link::Conn;
use super::replies::{bytes, int, sharing, text};
use super::scripts::Lua;
use crate::store::names;
use crate::store::{
    RecordLine, RecordWrite, Recorded, Refusal, ResumeClaim, ResumedGrant, ResumedLock, Resumption,
    StoreError,
};

impl RedisStore {
    /// The record of session `session_id`.
    fn record_key(&self, session_id: &str) -> String {
        format!("{{{}:session/{session_id}}}:s", self.namespace)
    }

    /// The attachment of sidecar `sidecar`.
    fn attachment_key(&self, sidecar: &str) -> String {
        format!("{{{}:sidecar/{sidecar}}}:a", self.namespace)
    }

    /// As [`RedisStore::run`], except that a call that times out leaves the shared
    /// connection in place: a slow call made off the lock path (a session record, a
    /// first `NOSCRIPT` round trip through a slow link) must never cost the grants and
    /// renewals a reconnect, which through a slow link could itself time out. A
    /// connection that broke is still dropped, and the lock path's own timeouts still
    /// drop one that hangs.
    async fn run_quietly<T, F, Fut>(&self, f: F) -> Result<T, StoreError>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        self.run_within(f, false).await
    }

    /// Runs `lua` on `keys` with `args` within the store's timeout (quietly: see
    /// [`RedisStore::run_quietly`]).
    async fn call<T: FromRedisValue>(
        &self,
        lua: &Lua,
        keys: &[String],
        args: &[&[u8]],
    ) -> Result<T, StoreError> {
        self.run_quietly(|mut conn| async move {
            let mut call = lua.script.prepare_invoke();
            for k in keys {
                call.key(k);
            }
            for a in args {
                call.arg(*a);
            }
            call.invoke_async(&mut conn).await
        })
        .await
    }

    /// Applies one record write (see `lua/record.lua`).
    async fn write_record(&self, write: &RecordWrite) -> Result<Recorded, StoreError> {
        let keys = [self.record_key(&write.session_id)];
        let ttl = write.ttl.as_millis().max(1).to_string();
        let n_set = write.set.len().to_string();
        let lines: Vec<String> = write.set.iter().map(|(_, line)| line.encode()).collect();
        let mut args: Vec<&[u8]> = vec![
            write.secret.as_bytes(),
            write.sidecar.as_bytes(),
            write.client_name.as_bytes(),
            ttl.as_bytes(),
            match (write.end, write.listed, write.spent) {
                (true, _, false) => b"1",
                (true, _, true) => b"1s",
                (false, true, false) => b"l",
                (false, true, true) => b"ls",
                (false, false, false) => b"0",
                (false, false, true) => b"0s",
            },
            n_set.as_bytes(),
        ];
        for ((key, _), line) in write.set.iter().zip(&lines) {
            args.push(key.as_bytes());
            args.push(line.as_bytes());
        }
        let grants: Vec<String> = write.remove.iter().map(|(_, n)| n.to_string()).collect();
        for ((key, _), grant) in write.remove.iter().zip(&grants) {
            args.push(key.as_bytes());
            args.push(grant.as_bytes());
        }
        let written: i64 = self.call(&self.scripts.record, &keys, &args).await?;
        Ok(match written {
            1 => Recorded::Written,
            2 => Recorded::Missing,
            _ => Recorded::Foreign,
        })
    }

    /// Applies record writes concurrently; a failed one is logged and answered `None`.
    pub(super) async fn write_records(&self, writes: &[RecordWrite]) -> Vec<Option<Recorded>> {
        join_all(writes.iter().map(|write| async move {
            self.write_record(write)
                .await
                .inspect_err(|e| tracing::debug!(error = %e, "a session record write failed; it is tried again"))
                .ok()
        }))
        .await
    }

    /// Sets this sidecar's attachment for `ttl`.
    pub(super) async fn write_attachment(
        &self,
        sidecar: &str,
        ttl: std::time::Duration,
    ) -> Result<(), StoreError> {
        let key = self.attachment_key(sidecar);
        let ttl = ttl.as_millis().max(1) as u64;
        self.run_quietly(|mut conn| async move {
            redis::cmd("SET")
                .arg(&key)
                .arg(1)
                .arg("PX")
                .arg(ttl)
                .query_async::<()>(&mut conn)
                .await
        })
        .await
    }

    /// Resumes a session (see the module docs).
    pub(super) async fn resume_session(
        &self,
        claim: &ResumeClaim,
    ) -> Result<Resumption, StoreError> {
        let keys = [self.record_key(&claim.session_id)];
        let check: &[&[u8]] = &[b"check", claim.secret.as_bytes()];
        let attached: Option<String> = self.call(&self.scripts.resume, &keys, check).await?;
        let Some(attached) = attached else {
            return Ok(Resumption::Refused(Refusal::Unknown));
        };
        // A record attached to the resuming sidecar itself was left by a predecessor
        // of the same instance (the engine refuses a session that runs here), gone for
        // sure: taken over at once, whatever its attachment says.
        if attached != claim.sidecar {
            let key = self.attachment_key(&attached);
            let alive: bool = self
                .run(|mut conn| async move {
                    redis::cmd("EXISTS").arg(&key).query_async(&mut conn).await
                })
                .await?;
            if alive {
                return Ok(Resumption::Refused(Refusal::Attached));
            }
        }
        let args: &[&[u8]] = &[
            b"claim",
            claim.secret.as_bytes(),
            claim.new_secret.as_bytes(),
            claim.sidecar.as_bytes(),
            attached.as_bytes(),
        ];
        let listed: Vec<Value> = self.call(&self.scripts.resume, &keys, args).await?;
        let bad = || StoreError::Protocol("resume: bad reply".into());
        let (first, pairs) = listed.split_first().ok_or_else(bad)?;
        if int(first)? != 1 {
            // The record changed since the check: another sidecar claimed it first.
            return Ok(Resumption::Refused(Refusal::Attached));
        }
        let lines: Vec<(String, RecordLine)> = pairs
            .chunks_exact(2)
            .filter_map(|pair| {
                let line = RecordLine::decode(&text(&pair[1]));
                if line.is_none() {
                    tracing::warn!(
                        "a session record line this sidecar cannot read; the lock is reported lost"
                    );
                }
                Some((text(&pair[0]), line?))
            })
            .collect();
        let locks = join_all(
            lines
                .into_iter()
                .map(|(key, line)| self.rekey_listed(claim, key, line)),
        )
        .await;
        Ok(Resumption::Claimed(locks))
    }

    /// Re-keys one listed lock; tries once more if the store did not answer (the
    /// script may be run twice: a grant already re-keyed is only extended).
    async fn rekey_listed(
        &self,
        claim: &ResumeClaim,
        key: String,
        line: RecordLine,
    ) -> ResumedLock {
        let (old, new) = claim.owner_prefixes();
        let ttl = line.ttl.as_millis().max(1).to_string();
        let hint = line.grant.to_string();
        let holder = names::split(&key).1;
        let args: [&[u8]; 5] = [
            old.as_bytes(),
            new.as_bytes(),
            ttl.as_bytes(),
            hint.as_bytes(),
            holder.as_bytes(),
        ];
        let keys = [self.key(names::key_of(&key), "h")];
        let mut held = None;
        for attempt in 0..2 {
            match self
                .call::<Vec<Value>>(&self.scripts.rekey, &keys, &args)
                .await
            {
                Ok(reply) => {
                    held = resumed_grant(&reply).unwrap_or_else(|e| {
                        tracing::warn!(%key, error = %e, "resuming a lock: an answer this sidecar cannot read");
                        None
                    });
                    break;
                }
                Err(e) if attempt == 0 => {
                    tracing::debug!(%key, error = %e, "re-keying a resumed lock failed; trying once more");
                }
                Err(e) => {
                    tracing::warn!(%key, error = %e, "re-keying a resumed lock failed; it is reported lost and expires at its TTL");
                }
            }
        }
        ResumedLock { key, line, held }
    }
}

/// `rekey.lua`'s answer: `{1, count, fence, mode and limit, value, grant}` or `{0}`.
fn resumed_grant(reply: &[Value]) -> Result<Option<ResumedGrant>, StoreError> {
    let bad = || StoreError::Protocol("rekey: bad reply".into());
    match reply {
        [held] if int(held)? == 0 => Ok(None),
        [held, count, fence, mode, value, grant] if int(held)? == 1 => {
            let mode = text(mode);
            let (letter, limit) = mode.split_at_checked(1).ok_or_else(bad)?;
            Ok(Some(ResumedGrant {
                grant: text(grant).parse().map_err(|_| bad())?,
                count: u32::try_from(int(count)?).map_err(|_| bad())?,
                fence: u64::try_from(int(fence)?).map_err(|_| bad())?,
                sharing: sharing(letter).ok_or_else(bad)?,
                limit: limit.parse().map_err(|_| bad())?,
                value: bytes(value),
            }))
        }
        _ => Err(bad()),
    }
}
