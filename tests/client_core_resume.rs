//! The client core (`lockside::client`, which the Python and Node packages bind to)
//! across a sidecar killed right after a grant (issue 32, item 4): a session that
//! cannot be resumed holds up nothing else: its lock is reported lost and the same
//! client object takes another key on a new session within a second of the sidecar
//! being back; a lock whose grant the dead sidecar had recorded comes back on resume.

mod common;

use std::time::Duration;

use common::records::{record_key, record_lines};
use common::{PATIENCE, Redis, SidecarProcess, namespace};
use lockside::client::{Client, LockOptions, LockState};
use tokio::time::Instant;

/// Long enough that an outcome within a third of it cannot be the TTL's doing.
const TTL: Duration = Duration::from_secs(30);

/// Waits until `lock`'s state is not `Suspended` any more: held again, or lost.
async fn outcome(lock: &lockside::client::LockGuard) -> LockState {
    let mut states = lock.states();
    tokio::time::timeout(PATIENCE, states.wait_for(|s| *s != LockState::Suspended))
        .await
        .expect("an outcome in time")
        .expect("states")
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_killed_right_after_a_grant_holds_up_nothing_else() {
    let redis = Redis::start();
    let ns = namespace();
    let mut sidecar = SidecarProcess::start(&redis.url(), &ns, &[]);
    let addr = sidecar.addr.clone();
    let client = Client::connect(&addr).await.expect("connect");
    let options = LockOptions {
        ttl: Some(TTL),
        ..LockOptions::default()
    };
    let lock = client.lock_with("k", options).await.expect("lock");
    // At once: the session's record may not name the grant yet.
    sidecar.kill();
    let restarted = SidecarProcess::start_at(&addr, &redis.url(), &ns, &[]);
    let back = Instant::now();
    // Either the lock comes back with its session (the record named it) or the
    // session is refused as unknown and the lock is lost at once: never a wait for
    // its TTL with the client held up. The bound is a third of the TTL: far
    // above a reconnect on a loaded machine, far below the TTL.
    let state = outcome(&lock).await;
    assert!(
        back.elapsed() < TTL / 3,
        "the outcome ({state:?}) took {:?} after the sidecar was back",
        back.elapsed()
    );
    let other = client
        .lock_with("another", LockOptions::default())
        .await
        .expect("the same client takes another key");
    assert!(
        back.elapsed() < TTL / 3 + Duration::from_secs(1),
        "another key {:?} after the sidecar was back",
        back.elapsed()
    );
    match state {
        LockState::Held => {
            assert_eq!(other.state(), LockState::Held);
        }
        LockState::Lost(why) => {
            assert!(
                why.contains("unknown") || why.contains("did not list"),
                "{why}"
            );
            assert!(lock.is_lost());
        }
        LockState::Suspended => unreachable!("waited for an outcome"),
    }
    drop(restarted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_the_dead_sidecar_recorded_comes_back_on_resume() {
    let redis = Redis::start();
    let ns = namespace();
    let mut sidecar = SidecarProcess::start(&redis.url(), &ns, &[]);
    let addr = sidecar.addr.clone();
    let client = Client::connect(&addr).await.expect("connect");
    let lock = client.lock("k").await.expect("lock");
    let token = lock.fencing_token();
    // Only what the session's record names can come back: wait until it does.
    let sid = client.session_id().expect("a session");
    let record = record_key(&ns, &sid);
    let deadline = Instant::now() + PATIENCE;
    while record_lines(|args| redis.cli(args), &record) != 1 {
        assert!(Instant::now() < deadline, "the grant is recorded in time");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    sidecar.kill();
    let _restarted = SidecarProcess::start_at(&addr, &redis.url(), &ns, &[]);
    assert_eq!(outcome(&lock).await, LockState::Held);
    let state = client.describe("k").await.expect("describe");
    assert_eq!(state.holders.len(), 1);
    assert_eq!(state.holders[0].fencing_token, token);
    lock.release().await.expect("release");
    assert!(
        client
            .describe("k")
            .await
            .expect("describe")
            .holders
            .is_empty()
    );
}
