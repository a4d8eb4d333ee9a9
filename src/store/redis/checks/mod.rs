//! The store's own check ([`Store::check`]): may this sidecar's user run every command
//! Lockside needs, and may the server evict Lockside's keys?
//!
//! - **Permissions.** One `EVAL` of `lua/check.lua` asks the server's ACL, command by
//!   command, with arguments shaped as Lockside sends them (keys `{ns:…}`, channels
//!   `{ns:…}:n`), without running any: the commands the sidecar sends, and every
//!   command the scripts call (a script runs with its caller's permissions, so a
//!   missing `HSET` fails inside `acquire.lua`, not at its `EVALSHA`). `ACL DRYRUN`
//!   would need an admin permission the least-privilege user does not have; the
//!   script's `redis.acl_check_cmd` needs none beyond `EVAL`. Before Redis 7.0 it
//!   cannot tell, and says so once.
//! - **Eviction.** `INFO memory`'s `maxmemory_policy` (not `CONFIG GET`, which managed
//!   services often refuse): `allkeys-*` may evict any key, `volatile-*` any key with a
//!   TTL, and every lock key has one.
//!
//! A check runs on the first call, after every new connection (a restarted server or a
//! failover may have other users or settings) and every [`CHECK_AGAIN`]; otherwise the
//! last result answers.
//!
//! This file has the check; `tests.rs` its unit tests, among them that every command
//! the scripts call is checked.
//!
//! [`Store::check`]: crate::store::Store::check

use std::sync::Mutex;
use std::time::Duration;

use deadpool_redis::redis::{self, Value};
use tokio::time::Instant;

use super::RedisStore;
use crate::store::{StoreCheck, StoreError};

/// How often the check runs again on the same connection: an operator who changes the
/// eviction policy or the user's permissions sees `/readyz` follow within a minute.
const CHECK_AGAIN: Duration = Duration::from_secs(60);

/// The commands the scripts call (`src/store/lua/`), checked on a lock's keys; the
/// unit test below finds every one of them in the scripts' text.
const SCRIPT_COMMANDS: [&str; 23] = [
    "DEL",
    "EXISTS",
    "GET",
    "HDEL",
    "HGET",
    "HGETALL",
    "HLEN",
    "HMGET",
    "HSET",
    "PEXPIRE",
    "PEXPIREAT",
    "PEXPIRETIME",
    "PTTL",
    "SET",
    "TIME",
    "ZADD",
    "ZCARD",
    "ZCOUNT",
    "ZRANGE",
    "ZRANGEBYSCORE",
    "ZREM",
    "ZREMRANGEBYSCORE",
    "ZSCORE",
];

/// The last check and the connection it was made on; whether the log was told that
/// the server cannot check permissions (once, not at every check).
#[derive(Default)]
pub(super) struct Checked(
    Mutex<Option<(u64, Instant, StoreCheck)>>,
    std::sync::atomic::AtomicBool,
);

/// Where the store runs, for which commands it needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Needs {
    /// A Cluster: shard channels (`SPUBLISH`), `CLUSTER SLOTS`, `ASKING`.
    pub(super) cluster: bool,
    /// Behind Sentinel: `ROLE` on the master the sentinels name.
    pub(super) sentinel: bool,
    /// `--min-replica-acks`: `WAIT`.
    pub(super) acks: bool,
}

/// Every command a sidecar needs under `namespace`: its name (as an operator grants it,
/// `SCRIPT LOAD` for `+script|load`) and the words to check, shaped as sent.
pub(super) fn needed(namespace: &str, needs: Needs) -> Vec<(&'static str, Vec<String>)> {
    let lock = format!("{{{namespace}:check}}:h");
    let record = format!("{{{namespace}:session/check}}:s");
    let attachment = format!("{{{namespace}:sidecar/check}}:a");
    let channel = format!("{{{namespace}:check}}:n");
    let sha = "0".repeat(40);
    let words = |words: &[&str]| words.iter().map(|w| w.to_string()).collect::<Vec<_>>();
    let (publish, subscribe, unsubscribe) = match needs.cluster {
        true => ("SPUBLISH", "SSUBSCRIBE", "SUNSUBSCRIBE"),
        false => ("PUBLISH", "SUBSCRIBE", "UNSUBSCRIBE"),
    };
    let mut needed = vec![
        ("PING", words(&["PING"])),
        ("INFO", words(&["INFO", "memory"])),
        ("EVALSHA", words(&["EVALSHA", &sha, "1", &lock])),
        // Renewals fall back on EVAL when a node lacks a script, as does this check.
        ("EVAL", words(&["EVAL", "return 0", "1", &lock])),
        ("SCRIPT LOAD", words(&["SCRIPT", "LOAD", "return 0"])),
        // The attachment: written by SET, looked at by EXISTS when resuming.
        ("SET", words(&["SET", &attachment, "1", "PX", "1000"])),
        ("EXISTS", words(&["EXISTS", &attachment])),
        (subscribe, words(&[subscribe, &channel])),
        (unsubscribe, words(&[unsubscribe, &channel])),
        (publish, words(&[publish, &channel, "k"])),
        // A session's record, from `record.lua` and `resume.lua`.
        ("HSET", words(&["HSET", &record, "k", "v"])),
        ("HGETALL", words(&["HGETALL", &record])),
    ];
    for command in SCRIPT_COMMANDS {
        let args: &[&str] = match command {
            "TIME" => &[],
            "HSET" => &["f", "v"],
            "HDEL" | "HGET" | "HMGET" => &["f"],
            "ZADD" => &["1", "m"],
            "PEXPIRE" | "PEXPIREAT" => &["1"],
            "ZCOUNT" | "ZRANGE" | "ZRANGEBYSCORE" | "ZREMRANGEBYSCORE" => &["0", "1"],
            "SET" => &["v"],
            "ZREM" | "ZSCORE" => &["m"],
            _ => &[],
        };
        let mut call = vec![command.to_owned()];
        if command != "TIME" {
            call.push(lock.clone());
        }
        call.extend(args.iter().map(|a| a.to_string()));
        needed.push((command, call));
    }
    if needs.cluster {
        needed.push(("CLUSTER SLOTS", words(&["CLUSTER", "SLOTS"])));
        needed.push(("ASKING", words(&["ASKING"])));
        // Each master's witness (`redis/restarts/witness.rs`): subscribed to on its own
        // connection, counted by the guarded scripts.
        let witness = format!("{{{namespace}:epoch/0}}:w:check");
        needed.push(("SSUBSCRIBE", words(&["SSUBSCRIBE", &witness])));
        needed.push((
            "PUBSUB SHARDNUMSUB",
            words(&["PUBSUB", "SHARDNUMSUB", &witness]),
        ));
    }
    if needs.sentinel {
        needed.push(("ROLE", words(&["ROLE"])));
    }
    if needs.acks {
        needed.push(("WAIT", words(&["WAIT", "1", "100"])));
    }
    needed
}

/// Whether a `maxmemory-policy` may evict Lockside's keys.
fn evicts(policy: &str) -> bool {
    policy.starts_with("allkeys-") || policy.starts_with("volatile-")
}

/// The `maxmemory_policy` lines of an `INFO memory` reply (a Cluster answers one per
/// master), the first one that may evict.
fn evicting_policy(reply: &Value) -> Option<String> {
    let mut texts = Vec::new();
    collect_texts(reply, &mut texts);
    let policies = texts.iter().flat_map(|text| text.lines());
    policies
        .filter_map(|line| line.trim().strip_prefix("maxmemory_policy:"))
        .find(|policy| evicts(policy))
        .map(str::to_owned)
}

fn collect_texts(reply: &Value, out: &mut Vec<String>) {
    match reply {
        Value::BulkString(b) => out.push(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => out.push(s.clone()),
        Value::VerbatimString { text, .. } => out.push(text.clone()),
        Value::Array(items) | Value::Set(items) => {
            items.iter().for_each(|v| collect_texts(v, out));
        }
        Value::Map(pairs) => pairs.iter().for_each(|(_, v)| collect_texts(v, out)),
        _ => {}
    }
}

impl RedisStore {
    /// The check's answer: the last one, unless the connection changed since or it is
    /// older than [`CHECK_AGAIN`].
    pub(super) async fn checked(&self) -> Result<StoreCheck, StoreError> {
        let connection = *self.link.changes().borrow();
        let last = self
            .checked
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some((on, at, found)) = last
            && on == connection
            && at.elapsed() < CHECK_AGAIN
        {
            return Ok(found);
        }
        let found = self.check_now().await?;
        // The connection the check ran on: a reconnect during it checks again next time.
        let on = *self.link.changes().borrow();
        *self.checked.0.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((on.min(connection), Instant::now(), found.clone()));
        Ok(found)
    }

    /// Runs the check (see the module docs).
    async fn check_now(&self) -> Result<StoreCheck, StoreError> {
        let needed = needed(&self.namespace, self.needs);
        let mut eval = redis::cmd("EVAL");
        eval.arg(include_str!("../../lua/check.lua"))
            .arg(1)
            .arg(format!("{{{}:check}}:h", self.namespace));
        for (name, words) in &needed {
            eval.arg(*name).arg(words.len()).arg(words);
        }
        let eval = &eval;
        let answer = self
            .run_within(
                |mut conn| async move { eval.query_async::<Value>(&mut conn).await },
                false,
            )
            .await;
        let mut denied = match answer {
            Ok(Value::Int(_)) => {
                if !self
                    .checked
                    .1
                    .swap(true, std::sync::atomic::Ordering::Relaxed)
                {
                    tracing::info!(
                        "this Redis cannot check its user's permissions (before 7.0); not checked"
                    );
                }
                Vec::new()
            }
            Ok(Value::Array(names)) => names.iter().map(super::replies::text).collect(),
            Ok(other) => return Err(StoreError::Protocol(format!("check: {other:?}"))),
            Err(e) if refused(&e) => vec!["EVAL".to_owned()],
            Err(e) => return Err(e),
        };
        let mut seen = std::collections::HashSet::new();
        denied.retain(|name| seen.insert(name.clone()));
        let info = self
            .run_within(
                |mut conn| async move {
                    redis::cmd("INFO")
                        .arg("memory")
                        .query_async::<Value>(&mut conn)
                        .await
                },
                false,
            )
            .await;
        let evicting = match info {
            Ok(reply) => evicting_policy(&reply),
            Err(e) if refused(&e) => {
                if !denied.iter().any(|d| d == "INFO") {
                    denied.push("INFO".to_owned());
                }
                None
            }
            Err(e) => return Err(e),
        };
        Ok(StoreCheck { denied, evicting })
    }
}

/// Whether a call failed because the user may not run it (`NOPERM`: the store reports
/// it as unavailable, like any refused call).
pub(super) fn refused(error: &StoreError) -> bool {
    matches!(error, StoreError::Unavailable(m) if m.starts_with(super::call::REFUSED))
}

#[cfg(test)]
mod tests;
