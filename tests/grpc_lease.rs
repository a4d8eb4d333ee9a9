//! The `Lease` conversation through real gRPC, against the memory store and a real
//! `redis-server`: grants, waits, cancels, reentrancy, ownership, fencing, release on
//! stream end, `Describe`, and every kind of bad input.

mod common;

use std::time::Duration;

use common::{Client, Setup, StoreKind, acquire, make_store, secs, setup, setup_with, waiting_for};
use lockside::engine::EngineConfig;
use lockside::proto::{self, lease_request, lease_response, not_acquired::Reason};
use tonic::Code;

async fn grant_busy_release(s: Setup) {
    let mut a = s.client.lease().await;
    let mut b = s.client.lease().await;
    let g = a.grant("k").await;
    assert_eq!((g.key.as_str(), g.hold_count), ("k", 1));
    let ttl = g.ttl.expect("ttl");
    assert!(
        ttl.seconds == 9 || ttl.seconds == 10,
        "validity left, less the margin: {ttl:?}"
    );
    let id = b.send_acquire(acquire("k")).await;
    assert_eq!(b.expect_not_acquired(id).await, Reason::Busy as i32);
    assert_eq!(a.release("k").await, 0);
    let g2 = b.grant("k").await;
    assert!(g2.fencing_token > g.fencing_token);
}

async fn wait_then_grant(s: Setup) {
    let mut a = s.client.lease().await;
    let mut b = s.client.lease().await;
    let first = a.grant("k").await.fencing_token;
    let id = b.send_acquire(waiting_for("k", 10.0)).await;
    b.expect_waiting(id).await;
    assert_eq!(a.release("k").await, 0);
    let g = b.expect_granted(id).await;
    assert!(g.fencing_token > first);
}

async fn wait_times_out(s: Setup) {
    let mut a = s.client.lease().await;
    let mut b = s.client.lease().await;
    a.grant("k").await;
    let started = tokio::time::Instant::now();
    let id = b.send_acquire(waiting_for("k", 0.3)).await;
    b.expect_waiting(id).await;
    assert_eq!(b.expect_not_acquired(id).await, Reason::Timeout as i32);
    assert!(started.elapsed() >= Duration::from_millis(300));
    // The timed-out waiter left no registration behind.
    tokio::time::timeout(common::PATIENCE, async {
        while s.client.describe("k").await.waiters > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("waiter registration removed");
}

async fn release_cancels_a_wait(s: Setup) {
    let mut a = s.client.lease().await;
    let mut b = s.client.lease().await;
    a.grant("k").await;
    let id = b.send_acquire(waiting_for("k", 30.0)).await;
    b.expect_waiting(id).await;
    let _ = b.send_release("k").await;
    assert_eq!(b.expect_not_acquired(id).await, Reason::Cancelled as i32);
    // The Release got no answer of its own: the next event answers the next request.
    let g = b.grant("other").await;
    assert_eq!(g.key, "other");
    assert_eq!(a.release("k").await, 0);
    b.grant("k").await;
}

async fn reentrancy_counts_holds(s: Setup) {
    let mut a = s.client.lease().await;
    let mut b = s.client.lease().await;
    let first = a.grant("k").await;
    let second = a.grant("k").await;
    assert_eq!(second.hold_count, 2);
    assert_eq!(
        second.fencing_token, first.fencing_token,
        "a reentrant grant keeps the token"
    );
    let d = s.client.describe("k").await;
    assert_eq!(d.holders.len(), 1);
    assert_eq!(d.holders[0].hold_count, 2);
    assert_eq!(a.release("k").await, 1);
    let id = b.send_acquire(acquire("k")).await;
    assert_eq!(b.expect_not_acquired(id).await, Reason::Busy as i32);
    assert_eq!(a.release("k").await, 0);
    b.grant("k").await;
}

async fn only_the_holder_releases(s: Setup) {
    let mut a = s.client.lease().await;
    let mut b = s.client.lease().await;
    a.grant("k").await;
    let id = b.send_release("k").await;
    assert_eq!(
        b.expect_rejected(id).await.code,
        Code::FailedPrecondition as i32
    );
    let d = s.client.describe("k").await;
    assert_eq!(
        d.holders[0].session_id, a.session_id,
        "still held by its owner"
    );
    assert_eq!(a.release("k").await, 0);
    let id = a.send_release("k").await;
    assert_eq!(
        a.expect_rejected(id).await.code,
        Code::FailedPrecondition as i32
    );
}

async fn tokens_increase_across_holders(s: Setup) {
    let mut last = 0;
    for _ in 0..5 {
        let mut lease = s.client.lease().await;
        let g = lease.grant("k").await;
        assert!(g.fencing_token > last, "{} > {last}", g.fencing_token);
        last = g.fencing_token;
        drop(lease);
        // The next holder may have to wait for the dropped stream to be noticed.
        let mut next = s.client.lease().await;
        let id = next.send_acquire(waiting_for("k", 5.0)).await;
        let g = next.granted_after_wait(id).await;
        assert!(g.fencing_token > last);
        last = g.fencing_token;
        assert_eq!(next.release("k").await, 0);
    }
    assert_eq!(s.client.describe("k").await.fencing_token, last);
}

async fn dropping_the_stream_releases(s: Setup) {
    let mut a = s.client.lease().await;
    let mut b = s.client.lease().await;
    a.grant("k1").await;
    a.grant("k2").await;
    let id = b.send_acquire(waiting_for("k1", 10.0)).await;
    b.expect_waiting(id).await;
    drop(a);
    b.expect_granted(id).await;
    b.grant("k2").await;
}

async fn half_close_releases(s: Setup) {
    let mut a = s.client.lease().await;
    let mut b = s.client.lease().await;
    a.grant("k").await;
    let id = b.send_acquire(waiting_for("k", 10.0)).await;
    b.expect_waiting(id).await;
    a.close();
    assert!(
        a.try_next().await.expect("clean end").is_none(),
        "the server ends the stream"
    );
    b.expect_granted(id).await;
}

async fn describe_reports_the_key(s: Setup) {
    let empty = s.client.describe("k").await;
    assert_eq!(
        (empty.holders.len(), empty.waiters, empty.fencing_token),
        (0, 0, 0)
    );
    assert_eq!(empty.mode, proto::LockMode::Unspecified as i32);
    let mut a = s.client.lease_named("billing-worker").await;
    let mut b = s.client.lease().await;
    let g = a.grant("k").await;
    let id = b.send_acquire(waiting_for("k", 10.0)).await;
    b.expect_waiting(id).await;
    let d = s.client.describe("k").await;
    assert_eq!(d.key, "k");
    assert_eq!(d.mode, proto::LockMode::Exclusive as i32);
    assert_eq!(
        (d.limit, d.waiters, d.fencing_token),
        (1, 1, g.fencing_token)
    );
    let holder = &d.holders[0];
    assert_eq!(holder.session_id, a.session_id);
    assert_eq!(holder.client_name, "billing-worker");
    let left = holder.ttl_remaining.expect("ttl");
    assert!(left.seconds >= 9, "renewed TTL, 10 s default: {left:?}");
    let mut grpc = s.client.grpc.clone();
    let err = grpc
        .describe(proto::DescribeRequest { key: String::new() })
        .await
        .expect_err("empty key");
    assert_eq!(err.code(), Code::InvalidArgument);
}

async fn renewal_keeps_short_leases(s: Setup) {
    let mut a = s.client.lease().await;
    let mut b = s.client.lease().await;
    let id = a
        .send_acquire(proto::Acquire {
            ttl: Some(secs(1.0)),
            ..acquire("k")
        })
        .await;
    a.expect_granted(id).await;
    // Three TTLs of real time: renewals at TTL/3 keep it held.
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let id = b.send_acquire(acquire("k")).await;
    assert_eq!(b.expect_not_acquired(id).await, Reason::Busy as i32);
    let left = s.client.describe("k").await.holders[0]
        .ttl_remaining
        .expect("ttl");
    let left = Duration::try_from(left).expect("a positive ttl");
    assert!(
        left > Duration::from_millis(300) && left <= Duration::from_secs(1),
        "renewed recently: {left:?}"
    );
    assert_eq!(a.release("k").await, 0);
}

/// Sends a raw request and expects it rejected with `code`; returns the rejection.
async fn rejected(
    lease: &mut common::LeaseStream,
    request: proto::LeaseRequest,
    code: Code,
) -> proto::Rejected {
    lease.send_raw(request).await;
    match lease.next().await {
        lease_response::Event::Rejected(r) => {
            assert_eq!(r.code, code as i32, "{r:?}");
            r
        }
        other => panic!("expected Rejected {code:?}, got {other:?}"),
    }
}

fn raw_acquire(a: proto::Acquire) -> proto::LeaseRequest {
    proto::LeaseRequest {
        command: Some(lease_request::Command::Acquire(a)),
    }
}

async fn bad_input_is_rejected_and_harms_nobody(s: Setup) {
    let mut a = s.client.lease().await;
    let held = a.grant("held").await;
    let id = |n: u64| proto::Acquire {
        request_id: 1000 + n,
        ..acquire("k")
    };
    let cases: Vec<(proto::Acquire, Code, &str)> = vec![
        (
            proto::Acquire {
                key: String::new(),
                ..id(1)
            },
            Code::InvalidArgument,
            "empty",
        ),
        (
            proto::Acquire {
                key: "x".repeat(513),
                ..id(2)
            },
            Code::InvalidArgument,
            "513 bytes",
        ),
        (
            proto::Acquire {
                key: "a\u{0}b".into(),
                ..id(3)
            },
            Code::InvalidArgument,
            "control",
        ),
        (
            proto::Acquire {
                ttl: Some(secs(0.5)),
                ..id(4)
            },
            Code::InvalidArgument,
            "ttl",
        ),
        (
            proto::Acquire {
                ttl: Some(secs(7200.0)),
                ..id(5)
            },
            Code::InvalidArgument,
            "ttl",
        ),
        (
            proto::Acquire {
                wait_timeout: Some(prost_types::Duration {
                    seconds: -1,
                    nanos: 0,
                }),
                ..id(6)
            },
            Code::InvalidArgument,
            "negative",
        ),
        (
            proto::Acquire {
                wait_timeout: Some(secs(25.0 * 3600.0)),
                ..id(7)
            },
            Code::InvalidArgument,
            "maximum",
        ),
        (
            proto::Acquire { mode: 7, ..id(8) },
            Code::InvalidArgument,
            "LockMode",
        ),
        (
            proto::Acquire {
                mode: proto::LockMode::Shared as i32,
                limit: 2,
                ..id(9)
            },
            Code::InvalidArgument,
            "semaphore",
        ),
        (
            proto::Acquire {
                ttl: Some(prost_types::Duration {
                    seconds: 5,
                    nanos: 2_000_000_000,
                }),
                ..id(12)
            },
            Code::InvalidArgument,
            "nanos",
        ),
    ];
    for (request, code, words) in cases {
        let request_id = request.request_id;
        let r = rejected(&mut a, raw_acquire(request), code).await;
        assert_eq!(r.request_id, request_id);
        assert!(
            r.message.contains(words),
            "{:?} should mention {words:?}",
            r.message
        );
        assert!(
            r.key.len() <= 64,
            "only a short prefix of bad input is echoed"
        );
    }
    let r = rejected(
        &mut a,
        proto::LeaseRequest { command: None },
        Code::InvalidArgument,
    )
    .await;
    assert!(r.message.contains("no command"));
    let huge = proto::Acquire {
        request_id: 2000,
        key: "h".repeat(70 * 1024),
        ..acquire("")
    };
    let r = rejected(&mut a, raw_acquire(huge), Code::ResourceExhausted).await;
    assert_eq!((r.request_id, r.key.len()), (2000, 64));
    // The session and its lock live on.
    let again = a.grant("held").await;
    assert_eq!(
        (again.hold_count, again.fencing_token),
        (2, held.fencing_token)
    );
    a.grant("fresh").await;
}

async fn duplicate_pending_request_ids_are_rejected(s: Setup) {
    let mut a = s.client.lease().await;
    let mut b = s.client.lease().await;
    b.grant("k").await;
    let id = a.send_acquire(waiting_for("k", 30.0)).await;
    a.expect_waiting(id).await;
    let dup = proto::Acquire {
        request_id: id,
        ..acquire("other")
    };
    let r = rejected(&mut a, raw_acquire(dup), Code::InvalidArgument).await;
    assert!(r.message.contains("pending"));
    assert_eq!(b.release("k").await, 0);
    a.expect_granted(id).await;
    // Once answered, the id may be used again.
    let reuse = proto::Acquire {
        request_id: id,
        ..acquire("other")
    };
    a.send_acquire(reuse).await;
    a.expect_granted(id).await;
}

/// Every store, and a Redis with only the least-privilege user (issue 26).
macro_rules! lease_tests {
    ($($name:ident),* $(,)?) => {
        crate::for_each_store!($($name),*);
        crate::on_least_privilege_redis!($($name),*);
    };
}

lease_tests!(
    grant_busy_release,
    wait_then_grant,
    wait_times_out,
    release_cancels_a_wait,
    reentrancy_counts_holds,
    only_the_holder_releases,
    tokens_increase_across_holders,
    dropping_the_stream_releases,
    half_close_releases,
    describe_reports_the_key,
    renewal_keeps_short_leases,
    bad_input_is_rejected_and_harms_nobody,
    duplicate_pending_request_ids_are_rejected,
);

fn small_limits() -> EngineConfig {
    EngineConfig {
        max_sessions: 3,
        max_locks_per_session: 2,
        max_pending_per_session: 3,
        max_waiters_per_key: 1,
        ..EngineConfig::default()
    }
}

#[tokio::test]
async fn locks_per_session_are_limited() {
    let s = setup_with("memory", small_limits()).await;
    let mut a = s.client.lease().await;
    a.grant("one").await;
    a.grant("two").await;
    let id = a.send_acquire(acquire("three")).await;
    let r = a.expect_rejected(id).await;
    assert_eq!(r.code, Code::ResourceExhausted as i32);
    assert!(r.message.contains("2 locks"), "{}", r.message);
    // Reentrant grants are not new locks; the others still work.
    assert_eq!(a.grant("one").await.hold_count, 2);
    assert_eq!(a.release("two").await, 0);
    a.grant("three").await;
}

#[tokio::test]
async fn waiters_per_key_are_limited() {
    let s = setup_with("memory", small_limits()).await;
    let mut holder = s.client.lease().await;
    let mut w1 = s.client.lease().await;
    let mut w2 = s.client.lease().await;
    holder.grant("k").await;
    let id1 = w1.send_acquire(waiting_for("k", 30.0)).await;
    w1.expect_waiting(id1).await;
    let id2 = w2.send_acquire(waiting_for("k", 30.0)).await;
    let r = w2.expect_rejected(id2).await;
    assert_eq!(r.code, Code::ResourceExhausted as i32);
    assert!(r.message.contains("wait"), "{}", r.message);
    // Trying without waiting is not waiting: plain busy.
    let id3 = w2.send_acquire(acquire("k")).await;
    assert_eq!(w2.expect_not_acquired(id3).await, Reason::Busy as i32);
    assert_eq!(holder.release("k").await, 0);
    w1.expect_granted(id1).await;
}

#[tokio::test]
async fn sessions_per_sidecar_are_limited() {
    let s = setup_with("memory", small_limits()).await;
    let _a = s.client.lease().await;
    let _b = s.client.lease().await;
    let _c = s.client.lease().await;
    let (_tx, rx) = tokio::sync::mpsc::channel::<proto::LeaseRequest>(1);
    let mut grpc = s.client.grpc.clone();
    let err = grpc
        .lease(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect_err("a fourth session is refused");
    assert_eq!(err.code(), Code::ResourceExhausted);
    drop(_a);
    // The freed slot is reusable once the session has ended.
    tokio::time::timeout(common::PATIENCE, async {
        while s.sidecar.engine.sessions() > 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("session ended");
    let _d = s.client.lease().await;
}

#[tokio::test]
async fn pending_requests_per_session_are_limited() {
    let s = setup_with("memory", small_limits()).await;
    let mut holder = s.client.lease().await;
    holder.grant("a").await;
    holder.grant("b").await;
    let mut w = s.client.lease().await;
    let ia = w.send_acquire(waiting_for("a", 30.0)).await;
    w.expect_waiting(ia).await;
    let ib = w.send_acquire(waiting_for("b", 30.0)).await;
    w.expect_waiting(ib).await;
    // Queued behind the wait for "a": pending but not a new lock.
    let ia2 = w.send_acquire(waiting_for("a", 30.0)).await;
    let ia3 = w.send_acquire(waiting_for("a", 30.0)).await;
    let r = w.expect_rejected(ia3).await;
    assert_eq!(r.code, Code::ResourceExhausted as i32);
    assert!(r.message.contains("pending"), "{}", r.message);
    drop(holder);
    // Both waits end in grants; the queued acquire becomes reentrant.
    let mut granted = Vec::new();
    while granted.len() < 3 {
        if let lease_response::Event::Granted(g) = w.next().await {
            granted.push((g.request_id, g.hold_count));
        }
    }
    granted.sort();
    assert_eq!(granted, vec![(ia, 1), (ib, 1), (ia2, 2)]);
}

#[tokio::test]
async fn client_names_are_shown_and_cut() {
    let s = setup("memory").await;
    let long = "n".repeat(300);
    let mut a = s.client.lease_named(&long).await;
    a.grant("k").await;
    let d = s.client.describe("k").await;
    assert_eq!(d.holders[0].client_name.len(), 128);
}

#[tokio::test]
async fn serves_on_a_unix_socket() {
    use hyper_util::rt::TokioIo;
    use lockside::server::{self, Listener};
    let dir = common::TempDir::new("uds");
    let path = dir.0.join("lockside.sock");
    let addr = format!("unix:{}", path.display()).parse().expect("addr");
    let listener = Listener::bind(&addr).await.expect("bind");
    assert_eq!(listener.local_addr(), format!("unix:{}", path.display()));
    listener.set_socket_mode(0o600).expect("chmod");
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path)
            .expect("socket")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "only the sidecar's user may connect");
    }
    let engine = lockside::engine::Engine::new(
        make_store(&StoreKind::Memory, "ns"),
        EngineConfig::default(),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(server::run(
        listener,
        None,
        engine,
        common::test_server_config(),
        async {
            let _ = stopped.await;
        },
    ));
    let socket = path.clone();
    let channel = tonic::transport::Endpoint::from_static("http://lockside")
        .connect_with_connector(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(
                    tokio::net::UnixStream::connect(socket).await?,
                ))
            }
        }))
        .await
        .expect("connect over the socket");
    let client = Client {
        grpc: proto::lock_service_client::LockServiceClient::new(channel),
    };
    let mut a = client.lease().await;
    a.grant("k").await;
    // A second sidecar cannot take over a socket that a live one serves.
    assert!(Listener::bind(&addr).await.is_err());
    let _ = stop.send(());
    server.await.expect("task").expect("server");
    assert!(!path.exists(), "the socket file is removed at shutdown");
}
