//! The classic recipe, the yardstick of the cost and scale phases, on the same Redis as
//! the sidecar: a lock is `SET key token NX PX ttl`, released by a compare-and-delete
//! script ([`Classic::cycles`]); locks held are renewed every TTL/3 the way Redisson's
//! watchdog does it, one compare-and-`PEXPIRE` script call per lock, pipelined a
//! thousand at a time as a busy client would ([`classic_hold`]): what Redis' CPU pays
//! for that, side by side with what it pays for the sidecar's batched renewals.

use std::time::Duration;

use deadpool_redis::redis::{self, Script, aio::MultiplexedConnection};
use tokio::time::Instant;

use super::context::{err, random_hex};
use super::redis_side::{RedisProcs, delete, per_name, percent_of_core, set_px};
use super::servers::Servers;

/// The classic recipe's release: delete the key only if it still holds our token.
const RELEASE: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then \
     return redis.call('del', KEYS[1]) else return 0 end";

/// A connection of the bench's own that takes locks the classic way.
pub(crate) struct Classic {
    pub(crate) conn: MultiplexedConnection,
    release: Script,
}

impl Classic {
    /// Connects to the standalone Redis at `url`.
    pub(crate) async fn connect(url: &str) -> Result<Self, String> {
        let client = redis::Client::open(url).map_err(err("--redis"))?;
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(err("connecting to Redis"))?;
        Ok(Self {
            conn,
            release: Script::new(RELEASE),
        })
    }

    /// `n` classic cycles on `key`: SET NX PX, then the compare-and-delete script; with
    /// a `pace`, each cycle lasts that long, its release half of it after its SET.
    pub(crate) async fn cycles(
        &mut self,
        key: &str,
        n: u64,
        ttl: Duration,
        pace: Option<Duration>,
    ) -> Result<(), String> {
        for _ in 0..n {
            let started = std::time::Instant::now();
            let token = random_hex(16)?;
            let set: Option<String> = redis::cmd("SET")
                .arg(key)
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(ttl.as_millis() as u64)
                .query_async(&mut self.conn)
                .await
                .map_err(err("classic SET"))?;
            if let Some(pace) = pace {
                wait_until(started + pace / 2);
            }
            if set.is_none() {
                return Err(format!("classic SET NX of {key}: the key was taken"));
            }
            let deleted: i64 = self
                .release
                .key(key)
                .arg(&token)
                .invoke_async(&mut self.conn)
                .await
                .map_err(err("classic release"))?;
            if deleted != 1 {
                return Err(format!("classic release of {key}: nothing deleted"));
            }
            if let Some(pace) = pace {
                wait_until(started + pace);
            }
        }
        Ok(())
    }
}

/// Classic cycles on `key` on this client's connection, back to back until `until`
/// (one client of many, as an app's processes each with a connection of their own);
/// one sample per cycle.
pub(crate) async fn classic_until(
    mut classic: Classic,
    key: String,
    until: Instant,
) -> Result<Vec<Duration>, String> {
    let mut samples = Vec::new();
    while super::load::sampling(until, &samples) {
        let start = Instant::now();
        classic
            .cycles(&key, 1, Duration::from_secs(10), None)
            .await?;
        samples.push(start.elapsed());
    }
    Ok(samples)
}

/// [`classic_until`], each cycle on a new key (`load::nth_key`, from `first`).
pub(crate) async fn classic_fresh_until(
    mut classic: Classic,
    key: String,
    first: u64,
    until: Instant,
) -> Result<Vec<Duration>, String> {
    let mut samples = Vec::new();
    for i in first.. {
        if !super::load::sampling(until, &samples) {
            break;
        }
        let start = Instant::now();
        let key = super::load::nth_key(&key, i);
        classic
            .cycles(&key, 1, Duration::from_secs(10), None)
            .await?;
        samples.push(start.elapsed());
    }
    Ok(samples)
}

/// Sleeps this thread (not the task) until `deadline`: the pauses of a paced cycle are
/// a fraction of a millisecond, finer than tokio's timer. The bench's runtime has other
/// workers, which drive the Redis connection meanwhile.
fn wait_until(deadline: std::time::Instant) {
    let now = std::time::Instant::now();
    if deadline > now {
        std::thread::sleep(deadline - now);
    }
}

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
    let mut conn = Classic::connect(url).await?.conn;
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
