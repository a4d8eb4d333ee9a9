//! The baseline of the scale phase: the same number of locks held by the classic
//! recipe on the same Redis, each `SET key token PX ttl` and renewed every TTL/3 the
//! way Redisson's watchdog does it, one compare-and-`PEXPIRE` script call per lock
//! (pipelined a thousand at a time, as a busy client would). What Redis' CPU pays for
//! that, side by side with what it pays for the sidecar's batched renewals.

use std::time::Duration;

use deadpool_redis::redis::{self, Script};
use tokio::time::Instant;

use super::context::{err, random_hex};
use super::redis_side::{RedisProcs, delete, per_name, percent_of_core, set_px};
use super::servers::Servers;

/// Redisson's renewal, for a string lock: extend only while the token is ours.
const RENEW: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then \
    return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0";

/// Holds `locks` keys named `{ns}/watchdog/{i}` with `ttl` for `periods` renewal
/// periods (TTL/3 each), renewing each key once a period; returns Redis' CPU over that
/// window in % of a core (`None` when Redis is not a process of this machine, or on a
/// Cluster: one connection here serves one server). The keys are deleted after.
pub(crate) async fn classic_hold(
    url: &str,
    servers: &mut Servers,
    ns: &str,
    locks: u64,
    ttl: Duration,
    periods: u32,
) -> Result<Option<f64>, String> {
    if servers.0.len() != 1 {
        return Ok(None);
    }
    let procs = RedisProcs::find(servers).await?;
    let client = redis::Client::open(url).map_err(err("--redis"))?;
    let mut conn =
        (client.get_multiplexed_async_connection().await).map_err(err("connecting to Redis"))?;
    let keys: Vec<String> = (0..locks).map(|i| format!("{ns}/watchdog/{i}")).collect();
    let token = random_hex(16)?;
    let ttl_ms = ttl.as_millis() as u64;
    set_px(&mut conn, &keys, ttl, || Ok(token.clone())).await?;
    let renew = Script::new(RENEW);
    renew
        .prepare_invoke()
        .load_async(&mut conn)
        .await
        .map_err(err("SCRIPT LOAD"))?;
    let before = procs.cpu_ns()?;
    let start = Instant::now();
    for period in 1..=periods {
        // One renewal of every lock per TTL/3, as the watchdog's timer would.
        tokio::time::sleep_until(start + ttl / 3 * period).await;
        per_name(&mut conn, &keys, "renewing", |pipe, key| {
            pipe.cmd("EVALSHA")
                .arg(renew.get_hash())
                .arg(1)
                .arg(key)
                .arg(&token)
                .arg(ttl_ms)
                .ignore();
            Ok(())
        })
        .await?;
    }
    let after = procs.cpu_ns()?;
    let secs = start.elapsed().as_secs_f64();
    delete(&mut conn, &keys).await?;
    Ok(percent_of_core(before, after, secs))
}
