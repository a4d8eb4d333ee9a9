//! Leader election through real gRPC on the memory store: holder values in `Describe`,
//! `Proclaim` on a `Lease` stream, the `Watch` stream (states, errors, a reader that
//! does not keep up, shutdown), and the Rust client's `campaign` and `watch`. The
//! engine's timing rules are in `tests/engine_election.rs`; two sidecars on Redis in
//! `tests/cli_elect.rs`.

mod common;

use std::time::Duration;

use common::{PATIENCE, Sidecar, StoreKind, acquire, make_store, setup, setup_with};
use lockside::client::{Client, ClientError};
use lockside::engine::EngineConfig;
use lockside::proto::limits::MAX_VALUE_BYTES;
use lockside::proto::{self, lease_request, lease_response};
use tokio_stream::StreamExt;
use tonic::Code;

type States = tonic::Streaming<proto::WatchResponse>;

async fn watch(client: &common::Client, key: &str) -> Result<States, tonic::Status> {
    let mut grpc = client.grpc.clone();
    let call = grpc.watch(proto::WatchRequest { key: key.into() });
    let states = tokio::time::timeout(PATIENCE, call)
        .await
        .expect("watch answers in time")?;
    Ok(states.into_inner())
}

async fn next_state(states: &mut States) -> proto::DescribeResponse {
    tokio::time::timeout(PATIENCE, states.next())
        .await
        .expect("a state in time")
        .expect("the watch goes on")
        .expect("a state")
        .state
        .expect("a state in the message")
}

/// The leader's value and token, or `None` when the key is free.
fn leader(state: &proto::DescribeResponse) -> Option<(Vec<u8>, u64)> {
    assert!(state.holders.len() <= 1, "{state:?}");
    state
        .holders
        .first()
        .map(|h| (h.value.clone(), h.fencing_token))
}

fn valued(key: &str, value: &[u8]) -> proto::Acquire {
    proto::Acquire {
        value: value.to_vec(),
        fair: true,
        ..acquire(key)
    }
}

fn proclaim(id: u64, key: &str, value: &[u8]) -> lease_request::Command {
    lease_request::Command::Proclaim(proto::Proclaim {
        request_id: id,
        key: key.into(),
        value: value.to_vec(),
        holder: String::new(),
    })
}

#[tokio::test]
async fn watchers_see_grants_values_and_releases_in_order() {
    let s = setup("memory").await;
    let mut states = watch(&s.client, "jobs").await.expect("watch");
    let first = next_state(&mut states).await;
    assert_eq!((first.key.as_str(), leader(&first)), ("jobs", None));
    let mut a = s.client.lease_named("web-1").await;
    let id = a.send_acquire(valued("jobs", b"10.0.0.7:8080")).await;
    let token = a.expect_granted(id).await.fencing_token;
    let state = next_state(&mut states).await;
    assert_eq!(leader(&state), Some((b"10.0.0.7:8080".to_vec(), token)));
    assert_eq!(state.holders[0].client_name, "web-1");
    assert_eq!(state.fencing_token, token);
    // Describe shows the same.
    let described = s.client.describe("jobs").await;
    assert_eq!(leader(&described), leader(&state));
    a.send(proclaim(77, "jobs", b"10.0.0.7:9090")).await;
    match a.next().await {
        lease_response::Event::Proclaimed(p) => {
            assert_eq!((p.request_id, p.key.as_str()), (77, "jobs"))
        }
        other => panic!("expected Proclaimed, got {other:?}"),
    }
    let state = next_state(&mut states).await;
    assert_eq!(leader(&state), Some((b"10.0.0.7:9090".to_vec(), token)));
    assert_eq!(a.release("jobs").await, 0);
    let state = next_state(&mut states).await;
    assert_eq!((leader(&state), state.fencing_token), (None, token));
}

#[tokio::test]
async fn bad_watches_and_proclaims_are_refused() {
    let s = setup_with(
        "memory",
        EngineConfig {
            max_watches: 1,
            ..EngineConfig::default()
        },
    )
    .await;
    let error = watch(&s.client, "").await.expect_err("empty key");
    assert_eq!(error.code(), Code::InvalidArgument);
    let _only = watch(&s.client, "a").await.expect("watch");
    let error = watch(&s.client, "b").await.expect_err("over the limit");
    assert_eq!(error.code(), Code::ResourceExhausted, "{error:?}");

    let mut a = s.client.lease().await;
    let mut b = s.client.lease().await;
    a.send(proclaim(1, "jobs", b"x")).await;
    assert_eq!(
        a.expect_rejected(1).await.code,
        Code::FailedPrecondition as i32
    );
    a.grant("jobs").await;
    b.send(proclaim(2, "jobs", b"x")).await;
    assert_eq!(
        b.expect_rejected(2).await.code,
        Code::FailedPrecondition as i32,
        "another session's lock"
    );
    let big = vec![0u8; MAX_VALUE_BYTES + 1];
    a.send(proclaim(3, "jobs", &big)).await;
    assert_eq!(
        a.expect_rejected(3).await.code,
        Code::InvalidArgument as i32
    );
    let id = a.send_acquire(valued("other", &big)).await;
    assert_eq!(
        a.expect_rejected(id).await.code,
        Code::InvalidArgument as i32
    );
    // The session goes on: its lock is still there, with no value.
    assert_eq!(leader(&s.client.describe("jobs").await), {
        let token = s.client.describe("jobs").await.fencing_token;
        Some((Vec::new(), token))
    });
}

#[tokio::test]
async fn a_watcher_that_does_not_read_skips_states() {
    let s = setup("memory").await;
    // HTTP/2 lets a sender run ahead of its reader by the reader's receive window
    // (hyper's client: 2 MiB per stream, ~500 of these states), kept on the client's
    // side. HTTP/2's own default, 64 KiB, shows what the sidecar adds: nothing.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", s.sidecar.addr))
        .expect("endpoint")
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535)
        .connect()
        .await
        .expect("connect");
    let reader = common::Client {
        grpc: proto::lock_service_client::LockServiceClient::new(channel),
    };
    let mut states = watch(&reader, "jobs").await.expect("watch");
    next_state(&mut states).await;
    let mut a = s.client.lease().await;
    a.grant("jobs").await;
    let value = |i: usize| {
        let mut v = format!("{i:06}").into_bytes();
        v.resize(MAX_VALUE_BYTES, b'.');
        v
    };
    const CHANGES: usize = 1000;
    for i in 0..CHANGES {
        a.send(proclaim(1000 + i as u64, "jobs", &value(i))).await;
        match a.next().await {
            lease_response::Event::Proclaimed(_) => {}
            other => panic!("expected Proclaimed, got {other:?}"),
        }
    }
    let last = value(CHANGES - 1);
    let mut messages = 0;
    loop {
        let state = next_state(&mut states).await;
        messages += 1;
        if state.holders.first().is_some_and(|h| h.value == last) {
            break;
        }
    }
    eprintln!(
        "{CHANGES} changes of 4 KiB reached a watcher that did not read in {messages} messages"
    );
    // What the reader's window had taken before it stopped reading, then the latest
    // state: never the backlog.
    assert!(
        messages < CHANGES / 20,
        "{messages} messages for {CHANGES} changes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_watches_at_once() {
    let sidecar = Sidecar::start(make_store(&StoreKind::Memory, "ns")).await;
    let client = sidecar.client().await;
    let mut states = watch(&client, "jobs").await.expect("watch");
    next_state(&mut states).await;
    tokio::time::timeout(Duration::from_secs(3), sidecar.shutdown())
        .await
        .expect("an open watch does not hold shutdown up");
    let end = tokio::time::timeout(PATIENCE, states.next())
        .await
        .expect("the watch ends");
    match end {
        Some(Err(status)) => assert_eq!(status.code(), Code::Unavailable, "{status:?}"),
        None => {}
        other => panic!("expected the end of the watch, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_client_campaigns_proclaims_and_watches() {
    let s = setup("memory").await;
    let client = Client::connect(&s.sidecar.addr).await.expect("connect");
    let mut states = client.watch("jobs").await.expect("watch");
    let state = states.next().await.expect("a state").expect("ok");
    assert!(state.holders.is_empty());
    let first = client.campaign("jobs", b"a").await.expect("leads");
    let state = states.next().await.expect("a state").expect("ok");
    assert_eq!(leader(&state), Some((b"a".to_vec(), first.fencing_token())));
    // A second candidate waits its turn.
    let second = {
        let client = client.clone();
        tokio::spawn(async move { client.campaign("jobs", b"b").await })
    };
    first.proclaim(b"a, moved").await.expect("proclaim");
    let mut state = states.next().await.expect("a state").expect("ok");
    while leader(&state).is_some_and(|(v, _)| v == b"a") {
        state = states.next().await.expect("a state").expect("ok"); // the waiter
    }
    assert_eq!(leader(&state).expect("a leader").0, b"a, moved");
    let token = first.fencing_token();
    first.resign().await.expect("resign");
    let second = tokio::time::timeout(PATIENCE, second)
        .await
        .expect("the next candidate leads in time")
        .expect("task")
        .expect("leads");
    assert!(second.fencing_token() > token);
    let mut state = states.next().await.expect("a state").expect("ok");
    while leader(&state).is_none() {
        state = states.next().await.expect("a state").expect("ok");
    }
    assert_eq!(
        leader(&state),
        Some((b"b".to_vec(), second.fencing_token()))
    );
    // A lost leader's proclaim says so.
    let big = vec![0u8; MAX_VALUE_BYTES + 1];
    match second.proclaim(&big).await {
        Err(ClientError::Rejected { code, .. }) => assert_eq!(code, Code::InvalidArgument as i32),
        other => panic!("expected a refusal, got {other:?}"),
    }
    // A bad key: the watch call fails.
    match client.watch("").await {
        Err(ClientError::Rejected { code, .. }) => assert_eq!(code, Code::InvalidArgument as i32),
        other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
    }
}

/// Issue 25: Redis restarts empty during a watch (every watcher registration is gone
/// with it): the watching sidecar registers its watches again as soon as it is back,
/// so a leader elected afterwards on another sidecar reaches the watcher within a
/// second, not after the next refresh (20 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_follow_a_leader_elected_after_a_redis_restart() {
    let mut redis = common::Redis::start();
    let ns = common::namespace();
    // After the restart no new grant for a second (`fault_store_restart.rs`).
    let hold_off = Duration::from_secs(1);
    let a = Sidecar::start(common::redis_store(&redis.url(), &ns, hold_off)).await;
    let b = Sidecar::start(common::redis_store(&redis.url(), &ns, hold_off)).await;
    let watcher = b.client().await;
    let mut states = watch(&watcher, "jobs").await.expect("watch");
    assert_eq!(leader(&next_state(&mut states).await), None);
    tokio::task::block_in_place(|| redis.restart());
    // The restarted Redis knows no watcher until the sidecar registers again.
    let registered = format!("{{{ns}:jobs}}:l");
    let back =
        common::topology::wait_until(PATIENCE, || redis.cli(&["EXISTS", &registered]) == "1").await;
    assert!(back, "the watch was registered again after the restart");
    let mut candidate = a.client().await.lease().await;
    let campaign = proto::Acquire {
        wait_timeout: Some(common::secs(30.0)),
        ..valued("jobs", b"a:1")
    };
    let id = candidate.send_acquire(campaign).await;
    let token = candidate.granted_after_wait(id).await.fencing_token;
    let elected = tokio::time::Instant::now();
    loop {
        let state = next_state(&mut states).await;
        if leader(&state).is_some() {
            assert_eq!(leader(&state), Some((b"a:1".to_vec(), token)));
            break;
        }
    }
    let took = elected.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "seen {took:?} after the election"
    );
}
