//! Several keys at once across a sidecar SIGKILLed (issue 36): the grants of an
//! `AcquireAll` are ordinary grants afterwards. Killed right after its `GrantedAll`,
//! the session resumes on another sidecar with every key and the same tokens (the
//! answer goes out only once the session's record names every new grant); killed while
//! the request waits, the session resumes holding nothing, and what it waited for goes
//! to others as soon as it is free. Every process is started on loopback and killed on
//! drop.

mod common;

use common::client::{granted, greeting, resume};
use common::{
    Client, LeaseStream, PATIENCE, Redis, SidecarProcess, acquire, acquire_all, namespace, refusal,
    secs,
};
use lockside::proto::{self, lease_response::Event};

/// A short attachment, so that a killed sidecar's sessions can be resumed at once.
const ARGS: [&str; 2] = ["--attachment-ttl", "600ms"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_killed_right_after_granted_all_resumes_with_every_key() {
    let redis = Redis::start();
    let ns = namespace();
    let other = SidecarProcess::start(&redis.url(), &ns, &ARGS);
    let on_other = Client::connect(&other.addr).await;
    for round in 0..3 {
        let keys: Vec<String> = ["a", "b", "c"]
            .iter()
            .map(|k| format!("{k}-{round}"))
            .collect();
        let names: Vec<&str> = keys.iter().map(String::as_str).collect();
        let mut doomed = SidecarProcess::start(&redis.url(), &ns, &ARGS);
        let mut app = Client::connect(&doomed.addr).await.lease().await;
        // Round 2: one key held already, so that the grant counts it once more.
        if round == 2 {
            app.grant(names[1]).await;
        }
        let id = app.send_acquire_all(acquire_all(&names)).await;
        let all = app.granted_all_after_wait(id).await;
        // At once: whatever the answer said must come back.
        doomed.kill();
        let mut resumed = resume(&on_other, &app.resume_token).await;
        assert_eq!(resumed.resumed_locks, 3, "round {round}");
        let events = greeting(&mut resumed).await;
        for g in &all.grants {
            let back = granted(&events[&g.key]);
            assert_eq!(
                back.fencing_token, g.fencing_token,
                "round {round}: {}",
                g.key
            );
            assert_eq!(back.hold_count, g.hold_count, "round {round}: {}", g.key);
        }
        // Nobody else gets any of them while the resumed session holds them.
        let mut rival = on_other.lease().await;
        let id = rival.send_acquire_all(acquire_all(&names)).await;
        let (_, reason) = rival.not_acquired_after_wait(id).await;
        assert_eq!(reason, proto::not_acquired::Reason::Busy as i32);
        drop(resumed);
    }
}

/// The session of `token` resumed on `client` (retried while its dead sidecar is
/// still attached), or `None` if it is refused as unknown.
async fn resumed_or_unknown(client: &Client, token: &str) -> Option<LeaseStream> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match client.resume(token).await {
            Ok(lease) => return Some(lease),
            Err(status) if refusal(&status) == "unknown" => return None,
            Err(status) => assert_eq!(refusal(&status), "attached", "{status:?}"),
        }
        assert!(tokio::time::Instant::now() < deadline, "an answer in time");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_killed_while_all_waits_leaves_nothing_held() {
    let redis = Redis::start();
    let ns = namespace();
    let other = SidecarProcess::start(&redis.url(), &ns, &ARGS);
    let on_other = Client::connect(&other.addr).await;
    let mut holder = on_other.lease().await;
    holder.grant("b").await;
    for fair in [false, true] {
        let mut doomed = SidecarProcess::start(&redis.url(), &ns, &ARGS);
        let mut app = Client::connect(&doomed.addr).await.lease().await;
        // A TTL well within the test's patience: the dead request's queue entries may
        // keep their place for one TTL, and the default 10 s is the patience itself.
        let ask = proto::AcquireAll {
            wait_timeout: Some(secs(PATIENCE.as_secs_f64())),
            fair,
            ttl: Some(secs(3.0)),
            ..acquire_all(&["a", "b"])
        };
        let id = app.send_acquire_all(ask).await;
        match app.next().await {
            Event::Waiting(w) => assert_eq!(w.request_id, id),
            other => panic!("expected Waiting, got {other:?}"),
        }
        doomed.kill();
        // A session that held nothing has no record to resume: refused as unknown
        // (never as still attached for long), or resumed with nothing.
        let resumed = resumed_or_unknown(&on_other, &app.resume_token).await;
        if let Some(resumed) = &resumed {
            assert_eq!(resumed.resumed_locks, 0, "fair {fair}: it held nothing");
        }
        let a = on_other.describe("a").await;
        assert!(a.holders.is_empty(), "fair {fair}: {a:?}");
        // A third party asking for both, fairly and waiting, gets them once "b" is
        // free: the dead request's place in a queue does not hold it up for good (a
        // fair one's queue entries keep it for at most one TTL, as for one key:
        // docs/semantics.md, "Fair queues").
        let mut third = on_other.lease().await;
        let ask = proto::AcquireAll {
            wait_timeout: Some(secs(PATIENCE.as_secs_f64())),
            fair: true,
            ..acquire_all(&["a", "b"])
        };
        let id = third.send_acquire_all(ask).await;
        assert_eq!(holder.release("b").await, 0);
        let freed = tokio::time::Instant::now();
        let all = third.granted_all_after_wait(id).await;
        eprintln!(
            "fair {fair}: granted {:?} after the release",
            freed.elapsed()
        );
        assert_eq!(all.grants.len(), 2, "fair {fair}");
        assert_eq!(third.release("a").await, 0);
        assert_eq!(third.release("b").await, 0);
        drop(resumed);
        // "b" held again for the next round.
        let id = holder.send_acquire(acquire("b")).await;
        holder.expect_granted(id).await;
    }
}
