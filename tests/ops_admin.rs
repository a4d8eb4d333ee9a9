//! Operating the sidecar: gRPC health and `/readyz` follow the store, `/livez` the
//! process, `lockside healthcheck` the gRPC health, `/metrics` counters move with what
//! sessions do, and a bearer token guards the lock service (not health).

mod common;

use std::time::Duration;

use common::{PATIENCE, Redis, Sidecar, StoreKind, make_store, namespace};
use lockside::client::{Client, LockOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A plain HTTP/1.1 GET: (status code, body).
async fn get(addr: &str, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect admin");
    let request = format!("GET {path} HTTP/1.1\r\nHost: lockside\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read");
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let body = response
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    (status, body)
}

/// Polls until `check` holds (the health watcher looks every second).
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    tokio::time::timeout(PATIENCE, async {
        while !check().await {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what} in time"));
}

/// The value of one sample line of the exposition, e.g. `lockside_locks_held`.
fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no sample {name} in\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_follows_the_store() {
    let mut redis = Redis::start();
    let sidecar = Sidecar::start(make_store(&StoreKind::Redis(redis.url()), &namespace())).await;
    let client = Client::connect(&sidecar.addr).await.expect("connect");
    // (exit code, what it printed on stdout and stderr)
    let healthcheck = |addr: String, live: bool| async move {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_lockside"))
            .args(["healthcheck", "--addr", &addr])
            .args(live.then_some("--live"))
            .output()
            .await
            .expect("healthcheck");
        let text = |bytes: Vec<u8>| String::from_utf8_lossy(&bytes).into_owned();
        (out.status.code(), text(out.stdout), text(out.stderr))
    };
    eventually("SERVING", || async {
        client.serving().await.unwrap_or(false)
    })
    .await;
    assert_eq!(get(&sidecar.admin, "/readyz").await.0, 200);
    assert_eq!(
        sample(&get(&sidecar.admin, "/metrics").await.1, "lockside_ready"),
        1.0
    );
    assert_eq!(
        healthcheck(sidecar.addr.clone(), false).await,
        (Some(0), "serving\n".into(), String::new())
    );
    redis.kill();
    eventually("NOT_SERVING", || async {
        !client.serving().await.unwrap_or(true)
    })
    .await;
    assert_eq!(get(&sidecar.admin, "/readyz").await.0, 503);
    let (_, text) = get(&sidecar.admin, "/metrics").await;
    assert_eq!(sample(&text, "lockside_ready"), 0.0, "/readyz as a metric");
    assert!(
        sample(
            &text,
            "lockside_store_calls_total{operation=\"ping\",result=\"unavailable\"}"
        ) >= 1.0,
        "the failed health checks are store errors: {text}"
    );
    assert_eq!(
        get(&sidecar.admin, "/livez").await.0,
        200,
        "the process itself is fine"
    );
    assert_eq!(
        healthcheck(sidecar.addr.clone(), false).await,
        (
            Some(1),
            String::new(),
            "lockside healthcheck: not serving: the sidecar cannot reach its lock store\n".into()
        )
    );
    assert_eq!(
        healthcheck(sidecar.addr.clone(), true).await,
        (
            Some(0),
            "alive (not serving: the sidecar cannot reach its lock store)\n".into(),
            String::new()
        ),
        "alive while the store is down"
    );
    redis.restart();
    eventually("SERVING again", || async {
        client.serving().await.unwrap_or(false)
    })
    .await;
    assert_eq!(get(&sidecar.admin, "/readyz").await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_what_sessions_do() {
    let redis = Redis::start();
    let sidecar = Sidecar::start(make_store(&StoreKind::Redis(redis.url()), &namespace())).await;
    let client = Client::connect(&sidecar.addr).await.expect("connect");
    let options = LockOptions {
        ttl: Some(Duration::from_secs(1)),
        ..LockOptions::default()
    };
    let (_, fresh) = get(&sidecar.admin, "/metrics").await;
    // Every labelled series is there, at 0, before anything happened.
    assert_eq!(
        sample(&fresh, "lockside_lost_total{reason=\"deadline\"}"),
        0.0
    );
    assert_eq!(
        sample(&fresh, "lockside_acquires_total{outcome=\"timeout\"}"),
        0.0
    );
    assert_eq!(
        sample(
            &fresh,
            &format!(
                "lockside_build_info{{version=\"{}\",store_kind=\"redis\"}}",
                env!("CARGO_PKG_VERSION")
            )
        ),
        1.0
    );
    assert_eq!(sample(&fresh, "lockside_default_ttl_seconds"), 10.0);
    assert_eq!(sample(&fresh, "lockside_sessions_limit"), 10_000.0);
    let lock = client.lock_with("k", options.clone()).await.expect("lock");
    let busy = client.lock_with("k", options.clone()).await;
    assert!(busy.is_err());
    // Real time: renewals at TTL/3 of a 1 s lock.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let (status, held) = get(&sidecar.admin, "/metrics").await;
    assert_eq!(status, 200);
    assert_eq!(sample(&held, "lockside_locks_held"), 1.0);
    assert_eq!(
        sample(&held, "lockside_sessions"),
        1.0,
        "the busy session has ended"
    );
    assert_eq!(
        sample(&held, "lockside_acquires_total{outcome=\"granted\"}"),
        1.0
    );
    assert_eq!(
        sample(&held, "lockside_acquires_total{outcome=\"busy\"}"),
        1.0
    );
    assert!(
        sample(&held, "lockside_renewals_total{result=\"ok\"}") >= 1.0,
        "{held}"
    );
    assert!(sample(&held, "lockside_renewal_seconds_count") >= 1.0);
    // Every store call, by operation and result.
    assert_eq!(
        sample(
            &held,
            "lockside_store_calls_total{operation=\"acquire\",result=\"ok\"}"
        ),
        2.0
    );
    assert!(
        sample(
            &held,
            "lockside_store_calls_total{operation=\"renew\",result=\"ok\"}"
        ) >= 1.0
    );
    assert!(
        sample(
            &held,
            "lockside_store_call_seconds_count{operation=\"renew\"}"
        ) >= 1.0
    );
    // The store-call pool's use, read at scrape time: nothing under way now.
    assert_eq!(sample(&held, "lockside_store_calls_in_flight"), 0.0);
    // A waiter counts as waiting until it is answered.
    let waiter = {
        let client = client.clone();
        let options = LockOptions {
            wait: Some(PATIENCE),
            ..options
        };
        tokio::spawn(async move { client.lock_with("k", options).await })
    };
    eventually("the waiter is counted", || async {
        let (_, text) = get(&sidecar.admin, "/metrics").await;
        sample(&text, "lockside_acquires_waiting") == 1.0
    })
    .await;
    lock.release().await.expect("release");
    let second = waiter
        .await
        .expect("waiter")
        .expect("granted after the wait");
    eventually("the released lock leaves the gauges", || async {
        let (_, text) = get(&sidecar.admin, "/metrics").await;
        sample(&text, "lockside_locks_held") == 1.0
            && sample(&text, "lockside_hold_seconds_count") == 1.0
            && sample(&text, "lockside_acquires_waiting") == 0.0
            && sample(&text, "lockside_handoffs_total") == 1.0
    })
    .await;
    drop(second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bearer_token_guards_the_lock_service_but_not_health() {
    use lockside::proto::lock_service_client::LockServiceClient;
    use lockside::proto::{DescribeRequest, LeaseRequest};
    let server = lockside::server::ServerConfig {
        auth_token: Some("s3cret-t0ken".into()),
        ..common::test_server_config()
    };
    let sidecar = Sidecar::start_configured(
        make_store(&StoreKind::Memory, "ns"),
        lockside::engine::EngineConfig::default(),
        server,
    )
    .await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", sidecar.addr))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let with = |token: &'static str| {
        LockServiceClient::with_interceptor(
            channel.clone(),
            move |mut request: tonic::Request<()>| {
                if !token.is_empty() {
                    let value = format!("Bearer {token}").parse().expect("ascii");
                    request.metadata_mut().insert("authorization", value);
                }
                Ok(request)
            },
        )
    };
    for token in ["", "wrong", "s3cret-t0ke", "s3cret-t0ken-and-more"] {
        let err = with(token)
            .describe(DescribeRequest { key: "k".into() })
            .await
            .expect_err("refused");
        assert_eq!(err.code(), tonic::Code::Unauthenticated, "token {token:?}");
        let (_tx, rx) = tokio::sync::mpsc::channel::<LeaseRequest>(1);
        let err = with(token)
            .lease(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .expect_err("refused");
        assert_eq!(err.code(), tonic::Code::Unauthenticated);
    }
    with("s3cret-t0ken")
        .describe(DescribeRequest { key: "k".into() })
        .await
        .expect("the right token is accepted");
    let client = Client::connect(&sidecar.addr).await.expect("connect");
    eventually("health without a token", || async {
        client.serving().await.unwrap_or(false)
    })
    .await;
}
