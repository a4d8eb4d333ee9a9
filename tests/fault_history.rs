//! Scenario 1 of TESTING.md: many clients on two sidecars contend for a few keys on one
//! real Redis, holding, releasing and sometimes dropping their streams while holding.
//! A checker replays the recorded history: 0 overlaps, 0 token regressions.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Interval, Redis, Rng, acquire, check_history, secs};
use lockside::proto;
use tokio::time::Instant;

const CLIENTS: u64 = 16;
const KEYS: u64 = 3;
const RUN: Duration = Duration::from_secs(2);

async fn client(addr: String, seed: u64, history: Arc<Mutex<Vec<Interval>>>) {
    let mut rng = Rng::new(seed);
    let connection = common::Client::connect(&addr).await;
    let deadline = Instant::now() + RUN;
    let mut lease = connection.lease().await;
    while Instant::now() < deadline {
        let key = format!("key-{}", rng.below(KEYS));
        let id = lease
            .send_acquire(proto::Acquire {
                wait_timeout: Some(secs(5.0)),
                ..acquire(&key)
            })
            .await;
        let granted = lease.granted_after_wait(id).await;
        let start = Instant::now();
        tokio::time::sleep(Duration::from_micros(rng.below(2000))).await;
        let end = Instant::now();
        history.lock().expect("history").push(Interval {
            key: key.clone(),
            start,
            end,
            token: granted.fencing_token,
        });
        if rng.below(10) == 0 {
            // Crash while holding: the stream ends without a Release.
            lease = connection.lease().await;
        } else {
            assert_eq!(lease.release(&key).await, 0);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contended_keys_are_never_held_twice() {
    let redis = Redis::start();
    let sidecars = common::two_sidecars(&redis).await;
    let history = Arc::new(Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|i| {
            tokio::spawn(client(
                sidecars[(i % 2) as usize].addr.clone(),
                i + 1,
                history.clone(),
            ))
        })
        .collect();
    for task in tasks {
        task.await.expect("client");
    }
    let history = history.lock().expect("history");
    let verdict = check_history(&history);
    eprintln!("history: {verdict:?}");
    assert!(
        verdict.intervals > 100,
        "enough contention to mean something: {verdict:?}"
    );
    assert_eq!(
        (verdict.overlaps, verdict.token_regressions),
        (0, 0),
        "{verdict:?}"
    );
}

#[test]
fn the_checker_finds_overlaps_and_regressions() {
    let t = Instant::now();
    let ms = |n| t + Duration::from_millis(n);
    let i = |key: &str, s, e, token| Interval {
        key: key.into(),
        start: ms(s),
        end: ms(e),
        token,
    };
    let clean = [i("a", 0, 10, 1), i("a", 10, 20, 2), i("b", 5, 15, 1)];
    assert_eq!(check_history(&clean).overlaps, 0);
    let overlap = [i("a", 0, 10, 1), i("a", 9, 20, 2)];
    assert_eq!(check_history(&overlap).overlaps, 1);
    let nested = [i("a", 0, 30, 1), i("a", 10, 20, 2), i("a", 25, 40, 3)];
    assert_eq!(check_history(&nested).overlaps, 2);
    let regression = [i("a", 0, 10, 5), i("a", 10, 20, 5)];
    assert_eq!(check_history(&regression).token_regressions, 1);
}
