//! Issue 25: a broken connection never leaves two holders. The connection between a
//! live client and a live sidecar breaks (a reset on the way, or the sidecar stalls
//! past the client's keepalive) while a waiter on another sidecar waits: the sidecar
//! releases the lock (after its grace) and the waiter is granted within milliseconds,
//! so the client must have told its application to stop (suspended) first. The
//! history checker, fed the holder's intervals of use (grant to suspension) and the
//! waiter's grants, finds no overlap. `lockside::client` here; `hold` and `elect` share
//! its rule (`tests/cli_hold.rs`), the Python, Node and Go packages test it in theirs.

mod common;

use std::time::Duration;

use common::proxy::Proxy;
use common::{
    Interval, PATIENCE, Redis, Sidecar, SidecarProcess, StoreKind, check_history, make_store,
    namespace, signal,
};
use lockside::client::{Client, LockOptions, LockState};
use tokio::time::Instant;

fn options() -> LockOptions {
    LockOptions {
        wait: Some(Duration::from_secs(30)),
        ttl: Some(Duration::from_secs(30)),
        ..LockOptions::default()
    }
}

/// Waits until `lock` is no longer held (suspended or lost); returns when.
async fn stopped(lock: &lockside::client::LockGuard) -> Instant {
    let mut states = lock.states();
    let state = tokio::time::timeout(PATIENCE, states.wait_for(|s| *s != LockState::Held))
        .await
        .expect("told to stop in time")
        .map(|s| s.clone());
    assert!(state.is_ok(), "the lock's reader ended without a verdict");
    Instant::now()
}

/// A reset between the holder's client and its sidecar, ten times, with a waiter on
/// another sidecar each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_connection_suspends_the_holder_before_a_waiter_elsewhere_is_granted() {
    let redis = Redis::start();
    let ns = namespace();
    let held_on = Sidecar::start(make_store(&StoreKind::Redis(redis.url()), &ns)).await;
    let other = Sidecar::start(make_store(&StoreKind::Redis(redis.url()), &ns)).await;
    let port: u16 = held_on
        .addr
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("port");
    let proxy = Proxy::start(port).await;
    let holder = Client::connect(&format!("127.0.0.1:{}", proxy.port))
        .await
        .expect("connect");
    let waiter = Client::connect(&other.addr).await.expect("connect");
    let mut history = Vec::new();
    for round in 0..10 {
        let key = format!("k{round}");
        let lock = holder.lock_with(&key, options()).await.expect("lock");
        let granted = Instant::now();
        let token = lock.fencing_token();
        let waiting = tokio::spawn({
            let (waiter, key) = (waiter.clone(), key.clone());
            async move {
                let lock = waiter.lock_with(&key, options()).await.expect("waiter");
                (Instant::now(), lock)
            }
        });
        // The waiter waits (its Waiting is not visible through the Rust client: the
        // store shows it).
        let listed = common::topology::wait_until(PATIENCE, || {
            redis.cli(&["ZCARD", &format!("{{{ns}:{key}}}:w")]) == "1"
        })
        .await;
        assert!(listed, "the waiter waits");
        proxy.reset();
        let stop = stopped(&lock).await;
        let (taken, next) = waiting.await.expect("waiter task");
        history.push(Interval {
            key: key.clone(),
            start: granted,
            end: stop,
            token,
        });
        history.push(Interval {
            key: key.clone(),
            start: taken,
            end: taken,
            token: next.fencing_token(),
        });
        assert!(
            stop <= taken,
            "round {round}: told to stop {:?} after the waiter's grant",
            stop - taken
        );
        drop(lock);
        next.release().await.expect("release");
    }
    let verdict = check_history(&history);
    assert_eq!(
        (verdict.overlaps, verdict.token_regressions),
        (0, 0),
        "{verdict:?}"
    );
}

/// The sidecar stalls (SIGSTOP) past the client's keepalive (1 s + 1 s) while a waiter
/// on another sidecar waits: the client suspends; the stalled sidecar, continued, sees
/// the stream gone and releases; the waiter is granted only then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_sidecar_suspends_the_holder_before_a_waiter_elsewhere_is_granted() {
    let redis = Redis::start();
    let ns = namespace();
    let held_on = SidecarProcess::start(&redis.url(), &ns, &[]);
    let other = Sidecar::start(make_store(&StoreKind::Redis(redis.url()), &ns)).await;
    let holder = Client::connect(&held_on.addr).await.expect("connect");
    let lock = holder.lock_with("k", options()).await.expect("lock");
    let granted = Instant::now();
    let waiting = tokio::spawn({
        let waiter = Client::connect(&other.addr).await.expect("connect");
        async move {
            let lock = waiter.lock_with("k", options()).await.expect("waiter");
            (Instant::now(), lock)
        }
    });
    signal(held_on.pid(), "STOP");
    let stop = stopped(&lock).await;
    let suspended_after = stop - granted;
    signal(held_on.pid(), "CONT");
    let (taken, next) = waiting.await.expect("waiter task");
    assert!(
        stop <= taken,
        "told to stop {:?} after the waiter's grant",
        stop - taken
    );
    assert!(next.fencing_token() > lock.fencing_token());
    eprintln!(
        "stalled sidecar: suspended {suspended_after:?} after the stall, waiter granted {:?} later",
        taken - stop
    );
}
