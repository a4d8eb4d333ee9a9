//! Read/write locks, semaphores, fair queues and lock-delay through real gRPC, on the
//! memory store and on real `redis-server` processes (several sidecars where it
//! matters).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{
    Client, HolderProcess, Interval, LeaseStream, Redis, Rng, Setup, Sidecar, SidecarProcess,
    StoreKind, acquire, make_store, max_concurrent, namespace, secs,
};
use lockside::engine::EngineConfig;
use lockside::proto::{self, lease_response, not_acquired::Reason};
use tokio::time::Instant;
use tonic::Code;

fn shared(key: &str) -> proto::Acquire {
    proto::Acquire {
        mode: proto::LockMode::Shared as i32,
        ..acquire(key)
    }
}

fn permit(key: &str, limit: u32) -> proto::Acquire {
    proto::Acquire {
        limit,
        ..acquire(key)
    }
}

fn fair_wait(a: proto::Acquire) -> proto::Acquire {
    proto::Acquire {
        fair: true,
        wait_timeout: Some(secs(30.0)),
        ..a
    }
}

async fn granted(lease: &mut LeaseStream, a: proto::Acquire) -> proto::Granted {
    let id = lease.send_acquire(a).await;
    lease.expect_granted(id).await
}

async fn busy(lease: &mut LeaseStream, a: proto::Acquire) {
    let id = lease.send_acquire(a).await;
    assert_eq!(lease.expect_not_acquired(id).await, Reason::Busy as i32);
}

async fn rejected(lease: &mut LeaseStream, a: proto::Acquire) -> proto::Rejected {
    let id = lease.send_acquire(a).await;
    let r = lease.expect_rejected(id).await;
    assert_eq!(r.code, Code::FailedPrecondition as i32, "{r:?}");
    r
}

/// Sends a fair wait and returns its request id and queue position.
async fn queue(lease: &mut LeaseStream, a: proto::Acquire) -> (u64, u32) {
    let id = lease.send_acquire(fair_wait(a)).await;
    match lease.next().await {
        lease_response::Event::Waiting(w) if w.request_id == id => (id, w.position),
        other => panic!("expected Waiting, got {other:?}"),
    }
}

async fn readers_share_writers_wait_and_nobody_upgrades(s: Setup) {
    let mut r1 = s.client.lease().await;
    let mut r2 = s.client.lease().await;
    let mut w = s.client.lease().await;
    let first = granted(&mut r1, shared("k")).await;
    let second = granted(&mut r2, shared("k")).await;
    assert!(
        second.fencing_token > first.fencing_token,
        "a token per reader"
    );
    busy(&mut w, acquire("k")).await;
    let d = s.client.describe("k").await;
    assert_eq!(
        (d.mode, d.limit, d.holders.len()),
        (proto::LockMode::Shared as i32, 1, 2)
    );
    let r = rejected(&mut r1, acquire("k")).await;
    assert!(r.message.contains("no upgrade"), "{}", r.message);
    let again = granted(&mut r1, shared("k")).await;
    assert_eq!(
        (again.hold_count, again.fencing_token),
        (2, first.fencing_token)
    );
    // A writer asking SHARED holds its exclusive grant once more.
    let x = granted(&mut w, acquire("x")).await;
    let x2 = granted(&mut w, shared("x")).await;
    assert_eq!((x2.hold_count, x2.fencing_token), (2, x.fencing_token));
    assert_eq!(
        s.client.describe("x").await.mode,
        proto::LockMode::Exclusive as i32
    );
    drop(r1);
    drop(r2);
    let id = w
        .send_acquire(proto::Acquire {
            wait_timeout: Some(secs(10.0)),
            ..acquire("k")
        })
        .await;
    w.granted_after_wait(id).await;
}

async fn semaphores_hold_up_to_their_limit(s: Setup) {
    let mut a = s.client.lease().await;
    let mut b = s.client.lease().await;
    let mut c = s.client.lease().await;
    let ta = granted(&mut a, permit("sem", 2)).await.fencing_token;
    let tb = granted(&mut b, permit("sem", 2)).await.fencing_token;
    assert!(tb > ta);
    busy(&mut c, permit("sem", 2)).await;
    let r = rejected(&mut c, permit("sem", 3)).await;
    assert!(r.message.contains("limit 2"), "{}", r.message);
    rejected(&mut c, acquire("sem")).await;
    rejected(&mut a, permit("sem", 5)).await;
    let d = s.client.describe("sem").await;
    assert_eq!((d.limit, d.holders.len()), (2, 2));
    assert_eq!(a.release("sem").await, 0);
    assert!(granted(&mut c, permit("sem", 2)).await.fencing_token > tb);
}

async fn a_fair_reader_waits_behind_a_waiting_writer(s: Setup) {
    let mut r1 = s.client.lease().await;
    let mut w = s.client.lease().await;
    let mut r2 = s.client.lease().await;
    granted(&mut r1, shared("k")).await;
    let (wid, wpos) = queue(&mut w, acquire("k")).await;
    let (rid, rpos) = queue(&mut r2, shared("k")).await;
    assert_eq!((wpos, rpos), (1, 2));
    let d = s.client.describe("k").await;
    let modes: Vec<i32> = d.queue.iter().map(|q| q.mode).collect();
    assert_eq!(
        modes,
        [
            proto::LockMode::Exclusive as i32,
            proto::LockMode::Shared as i32
        ]
    );
    assert_eq!(d.queue[0].session_id, w.session_id);
    assert_eq!(r1.release("k").await, 0);
    w.expect_granted(wid).await;
    assert_eq!(w.release("k").await, 0);
    r2.expect_granted(rid).await;
}

crate::for_each_store!(
    readers_share_writers_wait_and_nobody_upgrades,
    semaphores_hold_up_to_their_limit,
    a_fair_reader_waits_behind_a_waiting_writer,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_waiters_on_two_sidecars_are_granted_in_arrival_order() {
    let redis = Redis::start();
    let sidecars = common::two_sidecars(&redis).await;
    let mut holder = sidecars[0].client().await.lease().await;
    granted(&mut holder, acquire("k")).await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..6u32 {
        let mut lease = sidecars[(i % 2) as usize].client().await.lease().await;
        let (id, position) = queue(&mut lease, acquire("k")).await;
        assert_eq!(position, i + 1);
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            lease.expect_granted(id).await;
            order.lock().expect("order").push(i);
            assert_eq!(lease.release("k").await, 0);
        }));
    }
    assert_eq!(holder.release("k").await, 0);
    for task in tasks {
        task.await.expect("waiter");
    }
    assert_eq!(*order.lock().expect("order"), [0, 1, 2, 3, 4, 5]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_sidecars_fair_waiter_leaves_the_queue_after_one_ttl() {
    let redis = Redis::start();
    let ns = namespace();
    let mut doomed = SidecarProcess::start(&redis.url(), &ns, &["--default-ttl", "1s"]);
    let alive = Sidecar::start(make_store(&StoreKind::Redis(redis.url()), &ns)).await;
    let mut holder = alive.client().await.lease().await;
    granted(&mut holder, acquire("k")).await;
    let mut first = Client::connect(&doomed.addr).await.lease().await;
    assert_eq!(queue(&mut first, acquire("k")).await.1, 1);
    let mut second = alive.client().await.lease().await;
    let (id, position) = queue(
        &mut second,
        proto::Acquire {
            ttl: Some(secs(1.0)),
            ..acquire("k")
        },
    )
    .await;
    assert_eq!(position, 2);
    doomed.kill();
    let killed = Instant::now();
    assert_eq!(holder.release("k").await, 0);
    second.expect_granted(id).await;
    let took = killed.elapsed();
    // The dead waiter's registration (1 s TTL, refreshed every 333 ms until the kill)
    // must expire first; it blocks the queue for at most one TTL.
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_millis(2500),
        "{took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_delay_holds_after_a_broken_stream_but_not_after_a_clean_release() {
    let redis = Redis::start();
    let config = EngineConfig {
        lock_delay: Duration::from_millis(600),
        ..EngineConfig::default()
    };
    let sidecar = Sidecar::start_with(
        make_store(&StoreKind::Redis(redis.url()), &namespace()),
        config,
    )
    .await;
    let client = sidecar.client().await;
    let mut waiter = client.lease().await;
    // Broken: a client process killed while holding.
    let (mut holder, _) = HolderProcess::start(&sidecar.addr, "k").await;
    let id = waiter
        .send_acquire(proto::Acquire {
            wait_timeout: Some(secs(10.0)),
            ..acquire("k")
        })
        .await;
    waiter.expect_waiting(id).await;
    let killed = Instant::now();
    holder.sigkill();
    waiter.expect_granted(id).await;
    let took = killed.elapsed();
    assert!(took >= Duration::from_millis(600), "delayed: {took:?}");
    assert!(took < Duration::from_millis(2000), "{took:?}");
    // Clean: a Release, and a half-close, are not delayed.
    let mut other = client.lease().await;
    let id = other
        .send_acquire(proto::Acquire {
            wait_timeout: Some(secs(10.0)),
            ..acquire("k")
        })
        .await;
    other.expect_waiting(id).await;
    let released = Instant::now();
    assert_eq!(waiter.release("k").await, 0);
    other.expect_granted(id).await;
    assert!(
        released.elapsed() < Duration::from_millis(400),
        "{:?}",
        released.elapsed()
    );
    let mut third = client.lease().await;
    let id = third
        .send_acquire(proto::Acquire {
            wait_timeout: Some(secs(10.0)),
            ..acquire("k")
        })
        .await;
    third.expect_waiting(id).await;
    let closed = Instant::now();
    other.close();
    third.expect_granted(id).await;
    assert!(
        closed.elapsed() < Duration::from_millis(400),
        "{:?}",
        closed.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_never_has_more_holders_than_its_limit() {
    const LIMIT: u32 = 3;
    let redis = Redis::start();
    let sidecars = common::two_sidecars(&redis).await;
    let history = Arc::new(Mutex::new(Vec::new()));
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut tasks = Vec::new();
    for i in 0..32u64 {
        let client = sidecars[(i % 2) as usize].client().await;
        let history = history.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng::new(i + 100);
            let mut lease = client.lease().await;
            while Instant::now() < deadline {
                let a = proto::Acquire {
                    wait_timeout: Some(secs(10.0)),
                    fair: rng.below(2) == 0,
                    ..permit("sem", LIMIT)
                };
                let id = lease.send_acquire(a).await;
                let token = lease.granted_after_wait(id).await.fencing_token;
                let start = Instant::now();
                tokio::time::sleep(Duration::from_micros(rng.below(3000))).await;
                let end = Instant::now();
                history.lock().expect("history").push(Interval {
                    key: format!("client-{i}"),
                    start,
                    end,
                    token,
                });
                if rng.below(10) == 0 {
                    lease = client.lease().await; // dropped while holding
                } else {
                    assert_eq!(lease.release("sem").await, 0);
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("client");
    }
    let history = history.lock().expect("history");
    let most = max_concurrent(&history);
    // Permits are granted concurrently, so arrival order across clients is not grant
    // order (a grant can be delivered after a later one was used and given back). What
    // must hold: every permit has its own token, and each client's tokens increase.
    let mut tokens: Vec<u64> = history.iter().map(|i| i.token).collect();
    tokens.sort_unstable();
    tokens.dedup();
    let duplicates = history.len() - tokens.len();
    let regressions = common::check_history(&history).token_regressions + duplicates;
    eprintln!(
        "semaphore history: {} permits, at most {most} at once, {regressions} token regressions",
        history.len()
    );
    assert!(history.len() > 100, "{}", history.len());
    assert!(most <= LIMIT as usize, "{most} holders at once");
    assert_eq!(
        most, LIMIT as usize,
        "contended enough to fill every permit"
    );
    assert_eq!(regressions, 0);
}

#[test]
fn the_concurrency_checker_counts_overlaps() {
    let t = Instant::now();
    let ms = |n| t + Duration::from_millis(n);
    let i = |s, e| Interval {
        key: "k".into(),
        start: ms(s),
        end: ms(e),
        token: 0,
    };
    assert_eq!(
        max_concurrent(&[i(0, 10), i(10, 20)]),
        1,
        "touching is not overlapping"
    );
    assert_eq!(max_concurrent(&[i(0, 10), i(5, 20), i(6, 7)]), 3);
}
