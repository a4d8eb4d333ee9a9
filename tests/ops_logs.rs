//! Logs an operator can read (issue 26): a retry loop that starts failing says so once
//! and says once when it works again, however many times it retried in between; a
//! refused resume and a refused bearer token are logged at `warn` with the peer's
//! address and nothing secret. Each test runs the real binary and reads its stderr.

mod common;

use std::path::Path;
use std::time::Duration;

use common::proxy::{Fault, Proxy};
use common::{Client, PATIENCE, Redis, SidecarProcess, TempDir, acquire, secs, waiting_for};
use lockside::proto::{self, lease_response::Event};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

/// How many lines of the sidecar's log contain `what`.
fn count(log: &Path, what: &str) -> usize {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines().filter(|l| l.contains(what)).count()
}

/// Waits until the sidecar's log has a line containing `what`.
async fn logged(log: &Path, what: &str) {
    let deadline = Instant::now() + PATIENCE;
    while count(log, what) == 0 {
        assert!(Instant::now() < deadline, "the log never said {what:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The retry loops of one sidecar, each with the line it logs when it starts failing
/// and the line it logs when it works again.
const LOOPS: [(&str, &str); 3] = [
    (
        "writing this sidecar's attachment failed; retrying",
        "writing this sidecar's attachment works again",
    ),
    ("renewals failed; retrying", "renewals succeed again"),
    (
        "subscribing to notices failed; retrying",
        "subscribing to notices works again",
    ),
];

/// A Redis that swallows every byte for a while: the attachment (refreshed every
/// 100 ms here), the renewals (retried every TTL/20) and the notice subscriptions
/// (retried with backoff) each fail many times over, and each loop says so once,
/// then once that it works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_retry_loop_is_logged_once_when_it_starts_and_once_when_it_recovers() {
    let redis = Redis::start();
    let proxy = Proxy::start(redis.port).await;
    let dir = TempDir::new("logs");
    let log = dir.0.join("sidecar.log");
    let store = format!("redis://127.0.0.1:{}", proxy.port);
    let args = ["--attachment-ttl", "300ms", "--store-timeout", "200ms"];
    let sidecar = SidecarProcess::launch(&store, "logs", &args, &[], Some(&log));
    let client = Client::connect(&sidecar.addr).await;
    // A holder (renewed every 2 s, so a renewal falls in the outage, which it
    // outlives), and a waiter whose notices are subscribed (looking again only
    // every 10 s, so it waits through the outage).
    let mut holder = client.lease().await;
    let id = holder
        .send_acquire(proto::Acquire {
            ttl: Some(secs(6.0)),
            ..acquire("k")
        })
        .await;
    holder.expect_granted(id).await;
    let mut waiter = client.lease().await;
    let id = waiter
        .send_acquire(proto::Acquire {
            ttl: Some(secs(30.0)),
            ..waiting_for("k", 30.0)
        })
        .await;
    waiter.expect_waiting(id).await;

    proxy.both(Fault::Blackhole);
    match holder.next().await {
        Event::Jeopardy(j) => assert_eq!(j.key, "k"),
        other => panic!("expected Jeopardy, got {other:?}"),
    }
    for (failing, _) in LOOPS {
        logged(&log, failing).await;
    }
    // Long enough for every loop to fail again and again: the attachment about ten
    // times, the subscriptions a few.
    tokio::time::sleep(Duration::from_secs(1)).await;
    proxy.heal();
    match holder.next().await {
        Event::Restored(r) => assert_eq!(r.key, "k"),
        other => panic!("expected Restored, got {other:?}"),
    }
    for (_, recovered) in LOOPS {
        logged(&log, recovered).await;
    }
    for (failing, recovered) in LOOPS {
        assert_eq!(count(&log, failing), 1, "{failing:?} once per streak");
        assert_eq!(count(&log, recovered), 1, "{recovered:?} once per streak");
    }
    // The records, when one was due in the outage, the same way.
    assert!(count(&log, "writing session records failed; retrying") <= 1);
    // The waiter waited through it all and still gets the lock.
    assert_eq!(holder.release("k").await, 0);
    waiter.granted_after_wait(id).await;
}

/// A Lease call with these metadata headers; the refusal's status if refused.
async fn lease_with(
    client: &Client,
    headers: &[(&'static str, &str)],
) -> Result<(), tonic::Status> {
    let (_tx, rx) = tokio::sync::mpsc::channel::<proto::LeaseRequest>(1);
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    for (name, value) in headers {
        let value = value.parse().expect("an ASCII header");
        request.metadata_mut().insert(*name, value);
    }
    let mut grpc = client.grpc.clone();
    let mut responses = grpc.lease(request).await?.into_inner();
    // A resume is refused at the start of the call or with its first message.
    match tokio::time::timeout(PATIENCE, responses.message()).await {
        Ok(Err(status)) => Err(status),
        _ => Ok(()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_and_resumes_are_warned_with_the_peer_and_no_secret() {
    const TOKEN: &str = "bearer-t0k-Qw7pL2";
    const WRONG: &str = "wrong-t0k-Zx4nB8";
    const SECRET: &str = "AAAAAAAAAAAAAAAAAAAA-_";
    let redis = Redis::start();
    let dir = TempDir::new("logs");
    let log = dir.0.join("sidecar.log");
    let token_file = dir.0.join("token");
    std::fs::write(&token_file, TOKEN).expect("write the token");
    let args = ["--auth-token-file", &*token_file.to_string_lossy()];
    let sidecar = SidecarProcess::launch(&redis.url(), "logs", &args, &[], Some(&log));
    let client = Client::connect(&sidecar.addr).await;

    let bearer = |t: &str| format!("Bearer {t}");
    let refused = lease_with(&client, &[("authorization", &bearer(WRONG))]).await;
    assert_eq!(
        refused.expect_err("a wrong token").code(),
        tonic::Code::Unauthenticated
    );
    let refused = lease_with(&client, &[]).await;
    assert_eq!(
        refused.expect_err("no token").code(),
        tonic::Code::Unauthenticated
    );
    let unknown = format!("0123456789abcdef.{SECRET}");
    let resume = [
        ("authorization", bearer(TOKEN)),
        ("lockside-resume", unknown),
    ];
    let resume: Vec<(&str, &str)> = resume.iter().map(|(n, v)| (*n, v.as_str())).collect();
    let refused = lease_with(&client, &resume).await;
    assert_eq!(
        refused.expect_err("an unknown session").code(),
        tonic::Code::FailedPrecondition
    );

    let warned = |what: &'static str| {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<String> = (text.lines())
            .filter(|l| l.contains(what))
            .map(str::to_owned)
            .collect();
        lines
    };
    logged(&log, "refused to resume a session").await;
    let credentials = warned("refused a call without a valid bearer token");
    assert_eq!(credentials.len(), 2, "one line per refused call");
    let resumes = warned("refused to resume a session");
    assert_eq!(resumes.len(), 1);
    for line in credentials.iter().chain(&resumes) {
        assert!(line.contains("WARN"), "{line}");
        assert!(
            line.contains("peer=127.0.0.1:"),
            "the peer's address: {line}"
        );
    }
    assert!(credentials[0].contains("token=\"wrong\"") || credentials[0].contains("token=wrong"));
    assert!(
        resumes[0].contains("session=0123456789abcdef"),
        "{}",
        resumes[0]
    );
    let text = std::fs::read_to_string(&log).expect("the sidecar's log");
    for secret in [TOKEN, WRONG, SECRET] {
        assert!(!text.contains(secret), "a secret reached the log");
    }
}
