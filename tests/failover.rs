//! The fault suite on replicated topologies (TESTING.md scenarios 5 to 8): Redis behind
//! a proxy that cuts or slows it, Sentinel failovers after a replication cut and a
//! frozen master, Cluster failovers. Every scenario prints one line of figures for the
//! README's "Which topology, what guarantee" table.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::topology::{SentinelSetup, wait_until};
use common::{Lease, Sidecar, acquire, namespace, secs};
use lockside::proto::{self, lease_response::Event};
use lockside::store::Store;
use lockside::store::redis::{RedisOptions, RedisStore};
use tokio::time::Instant;

/// Store calls give up after this long: well under the TTLs used here.
const STORE_TIMEOUT: Duration = Duration::from_millis(500);

fn store(url: &str, ns: &str, acks: u32) -> Arc<dyn Store> {
    let options = RedisOptions {
        timeout: STORE_TIMEOUT,
        min_replica_acks: acks,
        ..RedisOptions::default()
    };
    Arc::new(RedisStore::with_options(url, ns, &options).expect("store"))
}

fn with_ttl(key: &str, ttl: f64) -> proto::Acquire {
    proto::Acquire {
        ttl: Some(secs(ttl)),
        ..acquire(key)
    }
}

/// Acquires `key` until granted or `limit` passes, retrying UNAVAILABLE (a store in
/// failover) and BUSY; returns the grant.
async fn grant_eventually(
    lease: &mut Lease,
    key: &str,
    ttl: f64,
    limit: Duration,
) -> Option<proto::Granted> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        let id = lease.send_acquire(with_ttl(key, ttl)).await;
        loop {
            match lease.next().await {
                Event::Granted(g) if g.request_id == id => return Some(g),
                Event::Rejected(r) if r.request_id == id => break,
                Event::NotAcquired(n) if n.request_id == id => break,
                _ => continue,
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_7_sentinel_failover_keeps_replicated_locks_and_loses_the_others() {
    let mut topology = SentinelSetup::start().await;
    let ns = namespace();
    let sidecar = Sidecar::start(store(&topology.url(), &ns, 0)).await;
    let client = sidecar.client().await;
    let mut a = client.lease().await;
    let kept = a.send_acquire(with_ttl("kept", 6.0)).await;
    let kept = a.expect_granted(kept).await;
    let old = topology.master_port();
    let replicated = wait_until(Duration::from_secs(5), || {
        topology.nodes[1..]
            .iter()
            .all(|n| n.cli(&["exists", &format!("{{{ns}:kept}}:h")]) == "1")
    })
    .await;
    assert!(replicated, "the first grant reached the replicas");
    topology.cut_replication();
    let lost = a.send_acquire(with_ttl("lost", 6.0)).await;
    let lost = a.expect_granted(lost).await;
    let frozen = Instant::now();
    topology.freeze(old);
    let failed_over = wait_until(Duration::from_secs(20), || topology.failed_over_from(old)).await;
    assert!(failed_over, "sentinels promoted a replica");
    let failover = frozen.elapsed();
    // The session hears Lost for the grant the new master lacks, before its deadline,
    // and keeps the replicated one.
    let deadline = frozen + Duration::from_secs(6);
    let mut lost_at = None;
    while lost_at.is_none() {
        match a.next().await {
            Event::Lost(l) => {
                assert_eq!(
                    (l.key.as_str(), l.fencing_token),
                    ("lost", lost.fencing_token)
                );
                lost_at = Some(Instant::now());
            }
            Event::Jeopardy(_) | Event::Restored(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(
        lost_at.is_some_and(|t| t < deadline),
        "Lost before the 6 s TTL ran out"
    );
    // Another session takes the lost key, with a larger token; the kept one is busy.
    let mut b = client.lease().await;
    let again = grant_eventually(&mut b, "lost", 6.0, Duration::from_secs(10))
        .await
        .expect("the lost key is granted on the new master");
    assert!(
        again.fencing_token > lost.fencing_token,
        "tokens do not regress across failover"
    );
    let id = b.send_acquire(acquire("kept")).await;
    assert_eq!(
        b.expect_not_acquired(id).await,
        proto::not_acquired::Reason::Busy as i32
    );
    let describe = client.describe("kept").await;
    assert_eq!(describe.holders.len(), 1);
    assert_eq!(describe.holders[0].session_id, a.session_id);
    assert_eq!(describe.fencing_token, kept.fencing_token);
    // Release notices come from the new master: a waiter is woken by the release, not
    // by the holder's expiry 6 s later.
    let id = b.send_acquire(common::waiting_for("kept", 10.0)).await;
    b.expect_waiting(id).await;
    let released = Instant::now();
    assert_eq!(a.release("kept").await, 0);
    let next = b.expect_granted(id).await;
    assert!(
        released.elapsed() < Duration::from_secs(1),
        "{:?}",
        released.elapsed()
    );
    assert!(next.fencing_token > kept.fencing_token);
    eprintln!("scenario 7 (sentinel, basic): failover {failover:?}");
}
