//! Running on a real Redis as operators run it (issue 26): a Redis out of memory
//! refuses with a reason of its own, and a release made meanwhile still frees the lock
//! once memory is back, not at its TTL.

mod common;

use std::time::Duration;

use common::{PATIENCE, Redis, Sidecar, StoreKind, acquire, make_store, namespace, secs};
use lockside::proto;
use tokio::time::Instant;
use tonic::Code;

/// `INFO memory`'s `used_memory`, in bytes.
fn used_memory(redis: &Redis) -> u64 {
    redis
        .cli(&["INFO", "memory"])
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("used_memory")
}

/// A Redis with `noeviction` (the default) whose `maxmemory` is reached: every write is
/// refused with `-OOM`. An acquire is told RESOURCE_EXHAUSTED "out of memory", not
/// UNAVAILABLE (retrying soon will not help; an operator must act). A lock released
/// meanwhile is answered `Released` and stays in the store while it refuses writes;
/// once memory is freed, the sidecar's retried release frees it, long before its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_store_says_out_of_memory_and_a_release_made_then_goes_through_once_memory_is_back()
{
    let redis = Redis::start();
    let sidecar = Sidecar::start(make_store(&StoreKind::Redis(redis.url()), &namespace())).await;
    let client = sidecar.client().await;
    let mut holder = client.lease().await;
    let id = holder
        .send_acquire(proto::Acquire {
            ttl: Some(secs(60.0)),
            ..acquire("k")
        })
        .await;
    holder.expect_granted(id).await;

    // Full: a limit a megabyte above what is used, then a 4 MB value.
    let limit = (used_memory(&redis) + (1 << 20)).to_string();
    assert_eq!(redis.cli(&["CONFIG", "SET", "maxmemory", &limit]), "OK");
    assert_eq!(
        redis.cli(&["SETRANGE", "filler", "4000000", "x"]),
        "4000001"
    );
    assert!(redis.cli(&["SET", "probe", "1"]).starts_with("OOM"));

    let mut other = client.lease().await;
    let id = other.send_acquire(acquire("other")).await;
    let rejected = other.expect_rejected(id).await;
    assert_eq!(
        rejected.code,
        Code::ResourceExhausted as i32,
        "{rejected:?}"
    );
    assert_eq!(rejected.message, "the lock store is out of memory");

    // The release is answered, and the store still holds the lock: it took no write.
    assert_eq!(holder.release("k").await, 0);
    assert_eq!(client.describe("k").await.holders.len(), 1);
    let id = other.send_acquire(acquire("k")).await;
    assert_eq!(
        other.expect_not_acquired(id).await,
        1,
        "busy while memory is full"
    );

    // Memory back: the lock is free within about a second, 60 s before its TTL.
    assert_eq!(redis.cli(&["DEL", "filler"]), "1");
    let freed = Instant::now();
    while !client.describe("k").await.holders.is_empty() {
        assert!(freed.elapsed() < PATIENCE, "the release was not retried");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    other.grant("k").await;
}
