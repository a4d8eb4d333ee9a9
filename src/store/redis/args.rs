//! What the scripts are given, made in one place: a lock's key names, where its
//! notices go, an exclusive lock's tail and an acquire's claim (see `lua/core.lua`).

use super::RedisStore;
use crate::store::Claim;

impl RedisStore {
    /// The Redis key of one part of a lock (see `lua/core.lua`).
    pub(super) fn key(&self, key: &str, part: &str) -> String {
        // Pushed rather than format!-ed: every store call makes four of these.
        let mut name = String::with_capacity(self.namespace.len() + key.len() + 4 + part.len());
        name.push('{');
        name.push_str(&self.namespace);
        name.push(':');
        name.push_str(key);
        name.push_str("}:");
        name.push_str(part);
        name
    }

    /// Where the scripts publish the notices of `key` (its own channel `{ns:KEY}:n`),
    /// and whether with `SPUBLISH` ("1": a shard channel, Cluster) or `PUBLISH` ("0").
    pub(super) fn notice_channel(&self, key: &str) -> (String, &'static str) {
        let sharded = if self.subscriptions.sharded() {
            "1"
        } else {
            "0"
        };
        (self.subscriptions.channel(key), sharded)
    }

    /// The `notice` argument of `acquire.lua` and `release.lua`: whether they publish
    /// with `SPUBLISH` ("1": Cluster) or `PUBLISH` ("0"), then the lock's name. The
    /// scripts make the channel from the lock's key (see [`Self::notice_channel`]):
    /// one argument fewer, and Redis pays for every argument on every call.
    pub(super) fn notice(&self, key: &str) -> String {
        let mut notice = String::with_capacity(1 + key.len());
        notice.push(if self.subscriptions.sharded() {
            '1'
        } else {
            '0'
        });
        notice.push_str(key);
        notice
    }

    /// The keys of one lock, in the order the scripts take them: its hash, its
    /// waiters, its fair queue, its watchers (see `lua/core.lua`).
    pub(super) fn keys(&self, key: &str) -> [String; 4] {
        LOCK_PARTS.map(|part| self.key(key, part))
    }
}

/// The parts of one lock's keys (`{ns:KEY}:part`), in the order the scripts take them:
/// its hash, its waiters, its fair queue, its watchers (see `lua/core.lua`).
pub(super) const LOCK_PARTS: [&str; 4] = ["h", "w", "q", "l"];

/// The end of an exclusive lock's string (see `lua/core.lua`): `owner|name length|name`,
/// then the value. Made here, once per acquire, rather than in Lua.
pub(super) fn tail(claim: &Claim) -> Vec<u8> {
    let name = claim.shown_name();
    let name = name.as_bytes();
    let mut tail = Vec::with_capacity(claim.owner.len() + name.len() + claim.value.len() + 8);
    tail.extend_from_slice(claim.owner.as_bytes());
    tail.push(b'|');
    tail.extend_from_slice(name.len().to_string().as_bytes());
    tail.push(b'|');
    tail.extend_from_slice(name);
    tail.extend_from_slice(&claim.value);
    tail
}

/// The `claim` argument of `acquire.lua`: wait and fair ("1" or "0" each), '|', then
/// the waiter as `w` and `q` keep it (`mode|limit|owner|session_id|client_name`), from
/// which the script reads mode, limit and owner.
pub(super) fn claimed(claim: &Claim) -> String {
    let flag = |on: bool| if on { '1' } else { '0' };
    let mut claimed = String::new();
    claimed.push(flag(claim.wait));
    claimed.push(flag(claim.fair));
    claimed.push('|');
    claimed.push_str(&claim.waiter());
    claimed
}
