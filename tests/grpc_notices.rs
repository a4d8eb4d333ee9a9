//! Release notices go only to the sidecars that wait: a sidecar subscribes to a key's
//! own channel `{ns:KEY}:n` while one of its acquires waits for the key (from its first
//! busy answer until it ends, whichever way), on every topology. Idle sidecars hear
//! nothing of other pods' contention; a waiter is still woken across sidecars, and
//! across a lost connection or a Redis restart (the subscription is made again, and
//! waiters look again: notices may have been missed meanwhile).
//!
//! Counts, not timings: what a sidecar heard is read from its
//! `lockside_store_notices_received_total` metric, what Redis has subscribed from
//! `PUBSUB`. The "within a second" checks tell a wake by a notice from the fallback
//! look at TTL/3 (10 s here).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::proxy::Proxy;
use common::topology::{ClusterSetup, SentinelSetup, cli, wait_until};
use common::{
    LeaseStream, PATIENCE, Redis, Sidecar, acquire, handoff, namespace, secs, waiting_for,
};
use lockside::proto::{self, lease_response::Event};
use lockside::store::Store;
use lockside::store::redis::{RedisOptions, RedisStore};
use lockside::store::redlock::RedlockStore;
use tokio::time::Instant;

/// A TTL whose fallback look (TTL/3) is far from the one-second wake checks.
const LONG_TTL: f64 = 30.0;

fn redis_store(url: &str, ns: &str) -> Arc<dyn Store> {
    let options = RedisOptions {
        timeout: Duration::from_millis(500),
        ..RedisOptions::default()
    };
    Arc::new(RedisStore::with_options(url, ns, &options).expect("redis store"))
}

/// The notices `sidecar` received from its store, all kinds together.
fn notices_heard(sidecar: &Sidecar) -> u64 {
    let text = sidecar.engine.metrics().render(true).expect("render");
    text.lines()
        .filter(|l| l.starts_with("lockside_store_notices_received_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

fn fair_wait(key: &str) -> proto::Acquire {
    proto::Acquire {
        fair: true,
        ttl: Some(secs(LONG_TTL)),
        ..waiting_for(key, 30.0)
    }
}

/// Four sessions of `sidecar` hand `key` around `rounds` times, in a fair queue, so
/// each release has waiters (and publishes a notice) and the order is known.
async fn hand_around(sidecar: &Sidecar, key: &str, rounds: usize) {
    let client = sidecar.client().await;
    let mut leases: Vec<LeaseStream> = Vec::new();
    for _ in 0..4 {
        leases.push(client.lease().await);
    }
    let first = leases[0].send_acquire(fair_wait(key)).await;
    leases[0].expect_granted(first).await;
    let mut pending = [0u64; 4];
    for (i, lease) in leases.iter_mut().enumerate().skip(1) {
        pending[i] = lease.send_acquire(fair_wait(key)).await;
        lease.expect_waiting(pending[i]).await;
    }
    for round in 0..rounds {
        let (holder, next) = (round % 4, (round + 1) % 4);
        assert_eq!(leases[holder].release(key).await, 0);
        leases[next].granted_after_wait(pending[next]).await;
        pending[holder] = leases[holder].send_acquire(fair_wait(key)).await;
        leases[holder].expect_waiting(pending[holder]).await;
    }
}

/// The channels of namespace `ns` subscribed on the server at `port` (`sharded`: shard
/// channels).
/// The notice channels of namespace `ns` subscribed to on `port` (not the masters'
/// witnesses on a Cluster, `store/redis/restarts/witness.rs`, which carry no notices).
fn channels(port: u16, ns: &str, sharded: bool) -> Vec<String> {
    let kind = if sharded { "shardchannels" } else { "channels" };
    cli(port, &["pubsub", kind, "*"])
        .lines()
        .filter(|c| c.contains(ns) && !c.contains("}:w:"))
        .map(str::to_owned)
        .collect()
}

async fn no_channels_left(ports: &[u16], ns: &str, sharded: bool) -> bool {
    wait_until(PATIENCE, || {
        ports.iter().all(|&p| channels(p, ns, sharded).is_empty())
    })
    .await
}

async fn an_idle_sidecar_hears_nothing(url: &str) {
    let ns = namespace();
    let busy = Sidecar::start(redis_store(url, &ns)).await;
    let idle = Sidecar::start(redis_store(url, &ns)).await;
    hand_around(&busy, "k", 12).await;
    assert!(
        notices_heard(&busy) >= 12,
        "the busy sidecar heard its releases: {}",
        notices_heard(&busy)
    );
    assert_eq!(
        notices_heard(&idle),
        0,
        "a sidecar without waiters hears nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_sidecar_hears_nothing_of_another_sidecars_handoffs() {
    let redis = Redis::start();
    an_idle_sidecar_hears_nothing(&redis.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_sidecar_hears_nothing_of_another_sidecars_handoffs_on_a_cluster() {
    let cluster = tokio::task::block_in_place(ClusterSetup::shared);
    an_idle_sidecar_hears_nothing(&cluster.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiters_subscription_lasts_as_long_as_its_acquire() {
    let redis = Redis::start();
    let ns = namespace();
    let a = Sidecar::start(redis_store(&redis.url(), &ns)).await;
    let b = Sidecar::start(redis_store(&redis.url(), &ns)).await;
    let mut holder = a.client().await.lease().await;
    let mut waiter = b.client().await.lease().await;
    // Uncontended: no subscription, not even a round trip for one.
    holder.grant("k").await;
    assert_eq!(holder.release("k").await, 0);
    let stats = redis.cli(&["info", "commandstats"]);
    assert!(
        !stats.contains("cmdstat_subscribe:"),
        "nobody waited, nobody subscribed: {stats}"
    );
    assert!(channels(redis.port, &ns, false).is_empty());

    // Granted: subscribed while it waits, unsubscribed once granted.
    holder.grant("k").await;
    let id = waiter.send_acquire(waiting_for("k", 30.0)).await;
    waiter.expect_waiting(id).await;
    assert_eq!(
        channels(redis.port, &ns, false),
        [format!("{{{ns}:k}}:n")],
        "the key's own channel, nothing else"
    );
    assert_eq!(holder.release("k").await, 0);
    waiter.expect_granted(id).await;
    assert!(no_channels_left(&[redis.port], &ns, false).await);

    // Timed out.
    let id = holder.send_acquire(waiting_for("k", 0.3)).await;
    holder.expect_waiting(id).await;
    assert_eq!(channels(redis.port, &ns, false).len(), 1);
    assert_eq!(
        holder.expect_not_acquired(id).await,
        proto::not_acquired::Reason::Timeout as i32
    );
    assert!(no_channels_left(&[redis.port], &ns, false).await);

    // Cancelled (a Release of a key the session waits for).
    let id = holder.send_acquire(waiting_for("k", 30.0)).await;
    holder.expect_waiting(id).await;
    assert_eq!(channels(redis.port, &ns, false).len(), 1);
    holder.send_release("k").await;
    assert_eq!(
        holder.expect_not_acquired(id).await,
        proto::not_acquired::Reason::Cancelled as i32
    );
    assert!(no_channels_left(&[redis.port], &ns, false).await);
    assert_eq!(waiter.release("k").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_across_sidecars_on_sentinel() {
    let sentinel = SentinelSetup::start().await;
    let ns = namespace();
    let a = Sidecar::start(redis_store(&sentinel.url(), &ns)).await;
    let b = Sidecar::start(redis_store(&sentinel.url(), &ns)).await;
    let mut holder = a.client().await.lease().await;
    let mut waiter = b.client().await.lease().await;
    handoff(&mut holder, &mut waiter, "k").await;
    handoff(&mut waiter, &mut holder, "k").await;
    assert!(no_channels_left(&[sentinel.master_port()], &ns, false).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_across_sidecars_on_a_cluster() {
    let cluster = tokio::task::block_in_place(ClusterSetup::shared);
    let ns = namespace();
    let a = Sidecar::start(redis_store(&cluster.url(), &ns)).await;
    let b = Sidecar::start(redis_store(&cluster.url(), &ns)).await;
    let mut holder = a.client().await.lease().await;
    let mut waiter = b.client().await.lease().await;
    handoff(&mut holder, &mut waiter, "k").await;
    handoff(&mut waiter, &mut holder, "k").await;
    assert!(no_channels_left(&cluster.masters(), &ns, true).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_across_sidecars_on_redlock() {
    let masters: Vec<Redis> = (0..3).map(|_| Redis::start()).collect();
    let hosts: Vec<String> = masters
        .iter()
        .map(|r| format!("127.0.0.1:{}", r.port))
        .collect();
    let url = format!("redlock://{}", hosts.join(","));
    let ns = namespace();
    let store = || -> Arc<dyn Store> {
        Arc::new(RedlockStore::new(&url, &ns, Duration::from_millis(500)).expect("redlock"))
    };
    let a = Sidecar::start(store()).await;
    let b = Sidecar::start(store()).await;
    let mut holder = a.client().await.lease().await;
    let mut waiter = b.client().await.lease().await;
    let id = holder.send_acquire(acquire("k")).await;
    holder.expect_granted(id).await;
    let id = waiter.send_acquire(waiting_for("k", 30.0)).await;
    waiter.expect_waiting(id).await;
    for m in &masters {
        assert_eq!(channels(m.port, &ns, false).len(), 1, "every master");
    }
    assert_eq!(holder.release("k").await, 0);
    waiter.expect_granted(id).await;
    let ports: Vec<u16> = masters.iter().map(|m| m.port).collect();
    assert!(no_channels_left(&ports, &ns, false).await);
}

/// `holder` holds "k" and `waiter` waits for it, both with a TTL whose fallback look
/// is 10 s away; returns the waiter's request id.
async fn hold_and_wait(holder: &mut LeaseStream, waiter: &mut LeaseStream) -> u64 {
    let id = holder
        .send_acquire(proto::Acquire {
            ttl: Some(secs(LONG_TTL)),
            ..acquire("k")
        })
        .await;
    holder.expect_granted(id).await;
    let id = waiter
        .send_acquire(proto::Acquire {
            ttl: Some(secs(LONG_TTL)),
            ..waiting_for("k", 30.0)
        })
        .await;
    waiter.expect_waiting(id).await;
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_not_stranded_by_a_lost_connection() {
    let redis = Redis::start();
    let proxy = Proxy::start(redis.port).await;
    let ns = namespace();
    let a = Sidecar::start(redis_store(&redis.url(), &ns)).await;
    let b = Sidecar::start(redis_store(
        &format!("redis://127.0.0.1:{}", proxy.port),
        &ns,
    ))
    .await;
    let mut holder = a.client().await.lease().await;
    let mut waiter = b.client().await.lease().await;
    let id = hold_and_wait(&mut holder, &mut waiter).await;
    let channel = format!("{{{ns}:k}}:n");
    let subscribed = || {
        cli(redis.port, &["pubsub", "numsub", &channel])
            .lines()
            .nth(1)
            .is_some_and(|n| n.trim() == "1")
    };
    assert!(subscribed());
    let resyncs = |s: &Sidecar| {
        let text = s.engine.metrics().render(true).expect("render");
        text.lines()
            .find(|l| l.starts_with("lockside_store_notices_received_total{kind=\"resync\"}"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let before = resyncs(&b);
    // Every connection of sidecar b breaks; Redis keeps its data.
    proxy.reset();
    assert!(
        wait_until(PATIENCE, || resyncs(&b) > before).await,
        "the waiters looked again once subscribed again"
    );
    assert!(subscribed(), "subscribed again before the resync");
    let released = Instant::now();
    assert_eq!(holder.release("k").await, 0);
    waiter.granted_after_wait(id).await;
    let took = released.elapsed();
    assert!(took < Duration::from_secs(1), "woken after {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_not_stranded_by_a_redis_restart() {
    let mut redis = Redis::start();
    let ns = namespace();
    // After the restart no new grant for a second (the product's default: the default
    // TTL; `fault_store_restart.rs`).
    let hold_off = Duration::from_secs(1);
    let a = Sidecar::start(common::redis_store(&redis.url(), &ns, hold_off)).await;
    let b = Sidecar::start(common::redis_store(&redis.url(), &ns, hold_off)).await;
    let mut holder = a.client().await.lease().await;
    let mut waiter = b.client().await.lease().await;
    let id = hold_and_wait(&mut holder, &mut waiter).await;
    // Restarted empty: every subscription and registration is gone, and so is the lock
    // until its holder writes it back.
    tokio::task::block_in_place(|| redis.restart());
    let lock = format!("{{{ns}:k}}:h");
    let back = wait_until(PATIENCE, || redis.cli(&["EXISTS", &lock]) == "1").await;
    assert!(back, "the holder wrote its lock back");
    // The holder's release reaches the waiter on the other sidecar by the end of the
    // hold-off, not at its look at TTL/3.
    let released = Instant::now();
    assert_eq!(holder.release("k").await, 0);
    match waiter.next().await {
        Event::Granted(g) if g.request_id == id => {}
        other => panic!("expected the grant, got {other:?}"),
    }
    let took = released.elapsed();
    assert!(
        took < hold_off + Duration::from_secs(1),
        "woken after {took:?}"
    );
    // And subscribed again: the next handoff (to a new session of sidecar a) is woken
    // by its notice.
    let mut next = a.client().await.lease().await;
    let id = next.send_acquire(waiting_for("k", 30.0)).await;
    next.expect_waiting(id).await;
    let released = Instant::now();
    assert_eq!(waiter.release("k").await, 0);
    next.expect_granted(id).await;
    let took = released.elapsed();
    assert!(took < Duration::from_secs(1), "woken after {took:?}");
    drop(holder);
}
