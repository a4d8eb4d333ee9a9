//! The client core's `lock_all` (issue 36, item 3; `lockside::client`, which the Python
//! package binds to) on real sidecars over a real Redis: every key held with a token of
//! its own and released together; all or none against a busy key; no deadlock for two
//! clients asking in opposite orders; a key the holder holds re-entered; a caller that
//! stops waiting leaves nothing held; bad sets refused in words; a sidecar killed
//! while the keys are held gives every key back on resume.

mod common;

use std::time::Duration;

use common::{PATIENCE, Redis, Sidecar, SidecarProcess, namespace, redis_store};
use lockside::client::{Client, ClientError, LockOptions, LockState, NotAcquired};
use tokio::time::{Instant, timeout};

/// A sidecar in this process on a fresh Redis (kept alive by the returned values).
async fn sidecar() -> (Redis, Sidecar) {
    let redis = Redis::start();
    let store = redis_store(&redis.url(), &namespace(), Duration::from_secs(1));
    let sidecar = Sidecar::start(store).await;
    (redis, sidecar)
}

async fn connect(sidecar: &Sidecar) -> Client {
    Client::connect(&sidecar.addr).await.expect("connect")
}

/// The fencing tokens the store names for `key`'s holders.
async fn holders(client: &Client, key: &str) -> Vec<(u64, u32)> {
    let state = client.describe(key).await.expect("describe");
    state
        .holders
        .iter()
        .map(|h| (h.fencing_token, h.hold_count))
        .collect()
}

const NO_WAIT: LockOptions = LockOptions {
    wait: None,
    ttl: None,
    shared: false,
    limit: 0,
    fair: false,
    value: Vec::new(),
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_all_holds_every_key_with_its_own_token_and_releases_them_together() {
    let (_redis, sidecar) = sidecar().await;
    let (app, rival) = (connect(&sidecar).await, connect(&sidecar).await);
    let all = app.lock_all(&["c", "a", "b"]).await.expect("lock_all");
    let keys: Vec<&str> = all.iter().map(|l| l.key()).collect();
    assert_eq!(keys, ["c", "a", "b"], "in the order asked");
    for lock in &all {
        assert_eq!(lock.state(), LockState::Held);
        assert_eq!(
            holders(&rival, lock.key()).await,
            [(lock.fencing_token(), 1)]
        );
        assert_eq!(all.fencing_token(lock.key()), Some(lock.fencing_token()));
    }
    assert!(all.all_held());
    assert_eq!(all.fencing_token("d"), None);
    // All or none: "d" is free, "b" is not: nothing of the rival's set is taken.
    let busy = rival.lock_all_with(&["d", "b"], NO_WAIT).await;
    assert!(
        matches!(busy, Err(ClientError::NotAcquired(NotAcquired::Busy))),
        "{busy:?}"
    );
    assert!(holders(&rival, "d").await.is_empty(), "nothing left of it");
    let before: Vec<(String, u64)> = all
        .fencing_tokens()
        .into_iter()
        .map(|(k, t)| (k.to_owned(), t))
        .collect();
    all.release().await.expect("release");
    for (key, _) in &before {
        assert!(holders(&rival, key).await.is_empty(), "{key} released");
    }
    // Dropped, a guard releases every key as well; tokens grow per key.
    let again = rival
        .lock_all_with(&["a", "b", "c"], NO_WAIT)
        .await
        .expect("free");
    for (key, token) in &before {
        assert!(again.fencing_token(key).expect("asked") > *token, "{key}");
    }
    drop(again);
    for key in ["a", "b", "c"] {
        assert!(
            holders(&app, key).await.is_empty(),
            "{key} released on drop"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_asking_in_opposite_orders_both_complete_with_growing_tokens() {
    let (_redis, sidecar) = sidecar().await;
    let (one, two) = (connect(&sidecar).await, connect(&sidecar).await);
    let diner = |client: Client, keys: [&'static str; 2]| async move {
        let mut seen = Vec::new();
        for _ in 0..25 {
            let both = client.lock_all(&keys).await.expect("lock_all");
            seen.push((
                both.fencing_token("x").unwrap(),
                both.fencing_token("y").unwrap(),
            ));
            tokio::task::yield_now().await;
            both.release().await.expect("release");
        }
        seen
    };
    let run = async {
        tokio::join!(
            tokio::spawn(diner(one, ["x", "y"])),
            tokio::spawn(diner(two, ["y", "x"]))
        )
    };
    let (a, b) = timeout(Duration::from_secs(30), run)
        .await
        .expect("no deadlock: both finish");
    let mut all: Vec<(u64, u64)> = a.expect("one").into_iter().chain(b.expect("two")).collect();
    all.sort();
    // Each grant of a key has a token of its own, and the grants of both keys come in
    // the same order: nobody held one key of a pair while the other held the other.
    for pair in all.windows(2) {
        assert!(pair[0].0 < pair[1].0 && pair[0].1 < pair[1].1, "{all:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_the_holder_holds_already_is_reentered() {
    let (_redis, sidecar) = sidecar().await;
    let client = connect(&sidecar).await;
    let b = client
        .acquire("b", &NO_WAIT, Some("worker"))
        .await
        .expect("b");
    let both = client
        .acquire_all(&["a", "b"], &NO_WAIT, Some("worker"))
        .await
        .expect("lock_all");
    assert_eq!(both[1].cell().fencing_token(), b.cell().fencing_token());
    assert_eq!(both[1].cell().hold_count(), 2);
    assert_eq!(holders(&client, "b").await, [(b.cell().fencing_token(), 2)]);
    // Another holder of the same session is excluded as another client would be.
    let other = client.lock_all_with(&["b", "c"], NO_WAIT).await;
    assert!(
        matches!(other, Err(ClientError::NotAcquired(NotAcquired::Busy))),
        "{other:?}"
    );
    for handle in &both {
        handle.release().expect("release");
    }
    assert_eq!(holders(&client, "b").await, [(b.cell().fencing_token(), 1)]);
    assert!(holders(&client, "a").await.is_empty());
    b.release().expect("release b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holder_stays_one_of_its_own_until_its_last_key_is_released() {
    let (_redis, sidecar) = sidecar().await;
    let client = connect(&sidecar).await;
    let mut locks = client
        .lock_all(&["a", "b", "c"])
        .await
        .expect("lock_all")
        .into_locks();
    let holder = locks[0].holder().to_owned();
    assert!(locks.iter().all(|l| l.holder() == holder));
    // With one key given back, the others are still this holder's: a new lock() of
    // the session is another holder, excluded from them (not re-entering).
    locks.remove(0).release().await.expect("release a");
    for key in ["b", "c"] {
        let other = client.lock_with(key, NO_WAIT).await;
        assert!(
            matches!(other, Err(ClientError::NotAcquired(NotAcquired::Busy))),
            "{key}: {other:?}"
        );
    }
    let a = client.lock_with("a", NO_WAIT).await.expect("a is free");
    assert_ne!(a.holder(), holder, "the name is still in use");
    drop(locks);
    drop(a);
    let again = client.lock_with("b", NO_WAIT).await.expect("b is free");
    drop(again);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_stops_waiting_leaves_nothing_held() {
    let (_redis, sidecar) = sidecar().await;
    let (app, owner) = (connect(&sidecar).await, connect(&sidecar).await);
    let b = owner.lock("b").await.expect("b");
    let waiting = tokio::spawn({
        let app = app.clone();
        async move { app.lock_all(&["a", "b"]).await }
    });
    // The request waits on "b" (the store counts its waiter): then give it up.
    let deadline = Instant::now() + PATIENCE;
    while owner.describe("b").await.expect("describe").waiters == 0 {
        assert!(Instant::now() < deadline, "the request waits in time");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    waiting.abort();
    assert!(waiting.await.expect_err("aborted").is_cancelled());
    // At once, the same client asks again for one of those keys: its holder's name
    // is not given again before the sidecar has ended the abandoned request.
    let again = app
        .lock_all_with(&["a", "c"], NO_WAIT)
        .await
        .expect("asked again at once");
    drop(again);
    b.release().await.expect("release b");
    // Nothing of the abandoned request is held by the app's session, now or later.
    let third = connect(&sidecar).await;
    let both = third
        .lock_all_with(
            &["a", "b"],
            LockOptions {
                wait: Some(PATIENCE),
                ..LockOptions::default()
            },
        )
        .await
        .expect("both free for a third client");
    for lock in &both {
        assert_eq!(holders(&app, lock.key()).await, [(lock.fencing_token(), 1)]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_sets_are_refused_in_words() {
    let (_redis, sidecar) = sidecar().await;
    let client = connect(&sidecar).await;
    let none: [&str; 0] = [];
    let refused = client.lock_all_with(&none, NO_WAIT).await;
    assert!(
        matches!(&refused, Err(ClientError::Settings(m)) if m.contains("2 to 64 keys")),
        "{refused:?}"
    );
    for (keys, words) in [(vec!["only"], "2 to 64 keys"), (vec!["a", "a"], "twice")] {
        match client.lock_all_with(&keys, NO_WAIT).await {
            Err(ClientError::Rejected { code, message }) => {
                assert_eq!(
                    code,
                    tonic::Code::InvalidArgument as i32,
                    "{keys:?}: {message}"
                );
                assert!(message.contains(words), "{keys:?}: {message}");
            }
            other => panic!("{keys:?}: {other:?}"),
        }
    }
    let semaphore = LockOptions {
        limit: 3,
        ..LockOptions::default()
    };
    let refused = client.lock_all_with(&["a", "b"], semaphore).await;
    assert!(
        matches!(&refused, Err(ClientError::Settings(m)) if m.contains("single key")),
        "{refused:?}"
    );
    // The session is fine afterwards.
    client
        .lock_all_with(&["a", "b"], NO_WAIT)
        .await
        .expect("a good set");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_killed_while_every_key_is_held_gives_every_key_back_on_resume() {
    let redis = Redis::start();
    let ns = namespace();
    let mut sidecar = SidecarProcess::start(&redis.url(), &ns, &[]);
    let addr = sidecar.addr.clone();
    let client = Client::connect(&addr).await.expect("connect");
    let options = LockOptions {
        ttl: Some(Duration::from_secs(30)),
        ..LockOptions::default()
    };
    let all = client
        .lock_all_with(&["p", "q", "r"], options)
        .await
        .expect("lock_all");
    let tokens: Vec<(String, u64)> = all
        .fencing_tokens()
        .into_iter()
        .map(|(k, t)| (k.to_owned(), t))
        .collect();
    // At once: `GrantedAll` goes out only once the session's record names each grant.
    sidecar.kill();
    let _restarted = SidecarProcess::start_at(&addr, &redis.url(), &ns, &[]);
    for lock in &all {
        let mut states = lock.states();
        let state = timeout(PATIENCE, states.wait_for(|s| *s != LockState::Suspended))
            .await
            .expect("an outcome in time")
            .expect("states")
            .clone();
        assert_eq!(state, LockState::Held, "{}", lock.key());
    }
    for (key, token) in &tokens {
        assert_eq!(holders(&client, key).await, [(*token, 1)], "{key}");
    }
    all.release().await.expect("release");
    for (key, _) in &tokens {
        assert!(holders(&client, key).await.is_empty(), "{key}");
    }
}
