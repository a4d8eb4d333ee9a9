//! Faults with real processes: client processes SIGKILLed and SIGSTOPped, the sidecar
//! binary SIGKILLed and SIGTERMed, Redis killed under a held lock, and two sidecars on
//! one Redis. Every process is started by the harness on loopback and killed on drop.
//! Tests run on two workers: the harness blocks briefly while it starts processes.

mod common;

use std::time::Duration;

use common::{
    Client, HolderProcess, Redis, Sidecar, SidecarProcess, StoreKind, acquire, make_store,
    namespace, secs, waiting_for,
};
use lockside::proto::{self, lease_response};
use tokio::time::Instant;
use tonic::Code;

async fn in_process(redis: &Redis, ns: &str) -> Sidecar {
    Sidecar::start(make_store(&StoreKind::Redis(redis.url()), ns)).await
}

/// Starts a wait for `key` and returns its request id once `Waiting` arrived.
async fn wait_for(lease: &mut common::LeaseStream, key: &str) -> u64 {
    let id = lease.send_acquire(waiting_for(key, 30.0)).await;
    lease.expect_waiting(id).await;
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sidecars_on_one_redis_exclude_each_other() {
    let redis = Redis::start();
    let ns = namespace();
    let (s1, s2) = (in_process(&redis, &ns).await, in_process(&redis, &ns).await);
    let mut a = s1.client().await.lease().await;
    let mut b = s2.client().await.lease().await;
    let first = a.grant("k").await.fencing_token;
    let id = b.send_acquire(acquire("k")).await;
    assert_eq!(
        b.expect_not_acquired(id).await,
        proto::not_acquired::Reason::Busy as i32
    );
    let id = wait_for(&mut b, "k").await;
    let released = Instant::now();
    assert_eq!(a.release("k").await, 0);
    let g = b.expect_granted(id).await;
    // Woken by the release notice from the other sidecar, not by a periodic look
    // (the next look would be at TTL/3 = 3.3 s).
    assert!(
        released.elapsed() < Duration::from_secs(1),
        "{:?}",
        released.elapsed()
    );
    assert!(g.fencing_token > first);
    let id = a.send_acquire(acquire("k")).await;
    assert_eq!(
        a.expect_not_acquired(id).await,
        proto::not_acquired::Reason::Busy as i32
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_client_process_releases_at_once() {
    let redis = Redis::start();
    let sidecar = in_process(&redis, &namespace()).await;
    let (mut holder, token) = HolderProcess::start(&sidecar.addr, "k").await;
    let mut b = sidecar.client().await.lease().await;
    let id = wait_for(&mut b, "k").await;
    let killed = Instant::now();
    holder.sigkill();
    let g = b.expect_granted(id).await;
    let took = killed.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "freed when the stream broke: {took:?}"
    );
    assert!(g.fencing_token > token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_client_process_is_ended_by_keepalive() {
    let redis = Redis::start();
    let sidecar = in_process(&redis, &namespace()).await;
    let (holder, token) = HolderProcess::start(&sidecar.addr, "k").await;
    let mut b = sidecar.client().await.lease().await;
    let id = wait_for(&mut b, "k").await;
    let stopped = Instant::now();
    holder.sigstop();
    let g = b.expect_granted(id).await;
    let took = stopped.elapsed();
    // Keepalive in tests: 300 ms interval + 300 ms timeout. A frozen process closes
    // nothing, so only the unanswered PING can have ended its session.
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert!(g.fencing_token > token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_sidecar_keeps_its_locks_until_the_ttl_and_not_after() {
    let redis = Redis::start();
    let ns = namespace();
    let mut doomed = SidecarProcess::start(&redis.url(), &ns, &["--default-ttl", "2s"]);
    let mut a = Client::connect(&doomed.addr).await.lease().await;
    let first = a.grant("k").await;
    let other = in_process(&redis, &ns).await;
    let watcher = other.client().await;
    let mut b = watcher.lease().await;
    let id = wait_for(&mut b, "k").await;
    let killed = Instant::now();
    doomed.kill();
    // Nobody renews it any more, yet the store keeps it: the sidecar may only be
    // frozen, and its client may still be using the resource.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        watcher.describe("k").await.holders.len(),
        1,
        "still held 1 s after the kill"
    );
    let g = b.expect_granted(id).await;
    let took = killed.elapsed();
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_millis(3000),
        "free after the 2 s TTL, woken by the expiry: {took:?}"
    );
    assert!(g.fencing_token > first.fencing_token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_redis_sends_jeopardy_then_lost_and_grants_resume_when_it_returns() {
    let mut redis = Redis::start();
    // Held off for the TTL of its locks after Redis comes back empty.
    let hold_off = Duration::from_secs(2);
    let sidecar = Sidecar::start(common::redis_store(&redis.url(), &namespace(), hold_off)).await;
    let client = sidecar.client().await;
    let mut a = client.lease().await;
    let id = a
        .send_acquire(proto::Acquire {
            ttl: Some(secs(2.0)),
            ..acquire("k")
        })
        .await;
    let g = a.expect_granted(id).await;
    let killed = Instant::now();
    redis.kill();
    let promised = match a.next().await {
        lease_response::Event::Jeopardy(j) => {
            assert_eq!(j.key, "k");
            let left = j.ttl_remaining.expect("ttl");
            Instant::now() + Duration::new(left.seconds as u64, left.nanos as u32)
        }
        other => panic!("expected Jeopardy, got {other:?}"),
    };
    // A new acquire meanwhile is UNAVAILABLE, not BUSY.
    let id = a.send_acquire(acquire("other")).await;
    let r = a.expect_rejected(id).await;
    assert_eq!(r.code, Code::Unavailable as i32);
    assert_eq!(
        r.message, "the lock store is unavailable",
        "no addresses or driver errors"
    );
    match a.next().await {
        lease_response::Event::Lost(l) => {
            assert_eq!((l.key.as_str(), l.fencing_token), ("k", g.fencing_token));
        }
        other => panic!("expected Lost, got {other:?}"),
    }
    let now = Instant::now();
    assert!(
        now <= promised + Duration::from_millis(50),
        "Lost keeps Jeopardy's promise"
    );
    assert!(
        killed.elapsed() < Duration::from_secs(2),
        "Lost before the store's TTL could pass"
    );
    // Redis comes back (empty): new grants work without restarting the sidecar, once
    // the hold-off after a store that lost its data has passed (busy until then).
    redis.restart();
    let back = Instant::now();
    let (mut granted, mut held_off) = (None, false);
    for _ in 0..100 {
        let id = a.send_acquire(acquire("k")).await;
        match a.next().await {
            lease_response::Event::Granted(g) if g.request_id == id => {
                granted = Some(g);
                break;
            }
            lease_response::Event::Rejected(r) if r.code == Code::Unavailable as i32 => {}
            lease_response::Event::NotAcquired(n) if n.request_id == id => held_off = true,
            other => panic!("unexpected {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let again = granted.expect("granted once Redis is back");
    assert!(held_off && back.elapsed() >= hold_off, "held off first");
    assert!(
        again.fencing_token > g.fencing_token,
        "the clock part of the token survives an empty Redis"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_releases_held_locks_at_once() {
    let redis = Redis::start();
    let ns = namespace();
    let mut leaving = SidecarProcess::start(&redis.url(), &ns, &[]);
    let mut a = Client::connect(&leaving.addr).await.lease().await;
    let g = a.grant("k").await;
    let staying = in_process(&redis, &ns).await;
    let mut b = staying.client().await.lease().await;
    let id = wait_for(&mut b, "k").await;
    let asked = Instant::now();
    let status = leaving.terminate().await;
    assert!(status.success(), "clean exit: {status:?}");
    match a.try_next().await {
        Ok(Some(lease_response::Event::Lost(l))) => {
            assert_eq!(l.key, "k");
            assert!(l.reason.contains("shutting down"), "{}", l.reason);
        }
        other => panic!("expected Lost before the end, got {other:?}"),
    }
    let end = a
        .try_next()
        .await
        .expect_err("the stream ends with a status");
    assert_eq!(end.code(), Code::Unavailable);
    let b_granted = b.expect_granted(id).await;
    assert!(b_granted.fencing_token > g.fencing_token);
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "released at shutdown, not at the 10 s TTL: {:?}",
        asked.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_increase_across_sidecar_restarts() {
    let redis = Redis::start();
    let ns = namespace();
    for store in [redis.url(), "memory".to_owned()] {
        let mut last = 0;
        for _ in 0..3 {
            let mut sidecar = SidecarProcess::start(&store, &ns, &["--default-ttl", "1s"]);
            let mut lease = Client::connect(&sidecar.addr).await.lease().await;
            let id = lease.send_acquire(waiting_for("k", 5.0)).await;
            let token = lease.granted_after_wait(id).await.fencing_token;
            assert!(token > last, "{store}: {token} > {last}");
            last = token;
            sidecar.kill();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_keep_apps_apart_on_one_redis() {
    let redis = Redis::start();
    let billing = Sidecar::start(make_store(&StoreKind::Redis(redis.url()), "billing")).await;
    let search = Sidecar::start(make_store(&StoreKind::Redis(redis.url()), "search")).await;
    let mut a = billing.client().await.lease().await;
    let mut b = search.client().await.lease().await;
    a.grant("jobs/nightly").await;
    b.grant("jobs/nightly").await;
    assert_eq!(
        billing
            .client()
            .await
            .describe("jobs/nightly")
            .await
            .holders
            .len(),
        1
    );
    let keys = redis.cli(&["--scan"]);
    assert!(
        keys.lines()
            .all(|k| k.starts_with("{billing:") || k.starts_with("{search:")),
        "{keys}"
    );
}

/// Scenario 4 with resuming clients: clients of `lockside::client` contend for a few
/// keys through two sidecar processes, which are SIGKILLed in turn and restarted on
/// the same address. A client whose sidecar died suspends its lock at once (stops
/// using it), resumes its session on the restarted one and uses the lock again if it
/// came back, or learns it is lost: the history checker, fed the intervals of use,
/// finds no overlap and no token regression.
/// TESTING.md, scenario 4.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecar_kills_with_resuming_clients() {
    use common::{Interval, Rng, Verdict, check_history};
    use lockside::client::{Client as Rust, LockOptions, LockState};
    use std::sync::{Arc, Mutex};

    const CLIENTS: u64 = 8;
    const KEYS: u64 = 3;
    const RUN: Duration = Duration::from_secs(9);
    const TTL: Duration = Duration::from_secs(4);
    // Sidecars answer within 250 ms or fail a call: a renewal is confirmed or in
    // Jeopardy within twice that.
    let sidecar_args = ["--attachment-ttl", "600ms", "--store-timeout", "250ms"];
    let redis = Redis::start();
    let ns = namespace();
    let mut sidecars: Vec<SidecarProcess> = (0..2)
        .map(|_| SidecarProcess::start(&redis.url(), &ns, &sidecar_args))
        .collect();
    let addrs: Vec<String> = sidecars.iter().map(|s| s.addr.clone()).collect();
    // Every interval of use, whether its hold ended lost, and whether it was resumed.
    let history = Arc::new(Mutex::new(Vec::<(Interval, bool, bool)>::new()));
    let start = Instant::now();
    let deadline = start + RUN;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let addr = addrs[(i % 2) as usize].clone();
            let history = history.clone();
            tokio::spawn(async move {
                let mut rng = Rng::new(i + 1);
                let client = loop {
                    if let Ok(client) = Rust::connect(&addr).await {
                        break client;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                };
                let mut n = 0u64;
                while Instant::now() < deadline {
                    n += 1;
                    let key = format!("key-{}", rng.below(KEYS));
                    let options = LockOptions {
                        wait: Some(Duration::from_secs(1)),
                        ttl: Some(TTL),
                        ..LockOptions::default()
                    };
                    let Ok(lock) = client.lock_with(&key, options).await else {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    };
                    let begin = Instant::now();
                    // Some holds span a kill of their sidecar (each is killed every
                    // 3 s) and outlast the resume that follows it (under a second).
                    let hold = if n % 4 == 0 {
                        Duration::from_millis(2500)
                    } else {
                        Duration::from_millis(20 + rng.below(100))
                    };
                    // The resource is used only while the lock is held: a suspension
                    // ends an interval of use, a restore begins another.
                    let token = lock.fencing_token();
                    let mut states = lock.states();
                    let mut using = Some(begin);
                    let mut resumed = false;
                    let mut used = Vec::new();
                    let until = begin + hold;
                    let lost = loop {
                        tokio::select! {
                            _ = tokio::time::sleep_until(until) => break false,
                            changed = states.changed() => {
                                let state = match changed {
                                    Ok(()) => states.borrow_and_update().clone(),
                                    Err(_) => LockState::Lost(String::new()),
                                };
                                match state {
                                    LockState::Held => {
                                        using = Some(Instant::now());
                                        resumed = true;
                                    }
                                    LockState::Suspended => {
                                        used.extend(using.take().map(|s| (s, Instant::now())));
                                    }
                                    LockState::Lost(_) => {
                                        used.extend(using.take().map(|s| (s, Instant::now())));
                                        break true;
                                    }
                                }
                            }
                        }
                    };
                    used.extend(using.take().map(|s| (s, Instant::now())));
                    for (start, end) in used {
                        let interval = Interval {
                            key: key.clone(),
                            start,
                            end,
                            token,
                        };
                        history
                            .lock()
                            .expect("history")
                            .push((interval, lost, resumed));
                    }
                    if !lost {
                        let _ = lock.release().await;
                    }
                }
            })
        })
        .collect();
    // Kill a sidecar every 1.5 s, in turn, and restart it on its address at once.
    let mut kills = Vec::new();
    let mut next = start + Duration::from_secs(1);
    while next + Duration::from_secs(2) < deadline {
        tokio::time::sleep_until(next).await;
        let i = kills.len() % 2;
        kills.push(Instant::now());
        sidecars[i].kill();
        sidecars[i] = SidecarProcess::start_at(&addrs[i], &redis.url(), &ns, &sidecar_args);
        next += Duration::from_millis(1500);
    }
    for client in clients {
        client.await.expect("client");
    }
    let holds = std::mem::take(&mut *history.lock().expect("history"));
    let lost = holds.iter().filter(|(_, lost, _)| *lost).count();
    // Intervals of use after a suspension: the lock came back with its session.
    let through = holds.iter().filter(|(_, _, resumed)| *resumed).count();
    let history: Vec<Interval> = holds.into_iter().map(|(i, ..)| i).collect();
    // Overlaps among the intervals of use; token order among the grants (a resumed
    // grant is used again with its own token: one entry a grant).
    let mut grants = history.clone();
    grants.sort_by(|a, b| a.key.cmp(&b.key).then(a.start.cmp(&b.start)));
    grants.dedup_by(|later, earlier| later.key == earlier.key && later.token == earlier.token);
    let verdict = Verdict {
        token_regressions: check_history(&grants).token_regressions,
        ..check_history(&history)
    };
    eprintln!(
        "SCENARIO 4 with resuming clients: {} sidecar kills, {} holds, {through} held \
         through a kill, {lost} lost, overlaps {}, regressions {}",
        kills.len(),
        verdict.intervals,
        verdict.overlaps,
        verdict.token_regressions
    );
    assert!(kills.len() >= 3 && verdict.intervals > 30, "{verdict:?}");
    assert!(through > 0, "some holds came back through a kill");
    assert_eq!(
        (verdict.overlaps, verdict.token_regressions),
        (0, 0),
        "{verdict:?}"
    );
}
