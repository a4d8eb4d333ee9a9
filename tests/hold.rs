//! `lockside hold`, `lockside describe` and the Rust client (`lockside::client`),
//! against real sidecars: exit statuses, the environment of CMD, forwarded signals, and
//! CMD stopped when the lock is lost.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::{PATIENCE, Redis, Sidecar, StoreKind, TempDir, make_store, namespace};
use lockside::cli::{EXIT_LOST, EXIT_NOT_ACQUIRED, EXIT_UNAVAILABLE};
use lockside::client::{Client, ClientError, LockOptions};
use tokio::process::{Child, Command};
use tokio::time::Instant;

fn hold(addr: &str, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lockside"));
    command
        .arg("hold")
        .args(args)
        .env("LOCKSIDE_ADDR", addr)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    command
}

async fn status(mut child: Child) -> i32 {
    let status = tokio::time::timeout(PATIENCE, child.wait())
        .await
        .expect("hold exits in time")
        .expect("hold ran");
    status.code().expect("an exit code")
}

async fn run(addr: &str, args: &[&str]) -> i32 {
    status(hold(addr, args).spawn().expect("spawn hold")).await
}

/// Waits until `key` has a holder (a `hold` process has its lock).
async fn held(client: &Client, key: &str) {
    tokio::time::timeout(PATIENCE, async {
        while client
            .describe(key)
            .await
            .expect("describe")
            .holders
            .is_empty()
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the lock is taken in time");
}

/// Whether nobody holds `key`.
async fn free(client: &Client, key: &str) -> bool {
    client
        .describe(key)
        .await
        .expect("describe")
        .holders
        .is_empty()
}

async fn memory_sidecar() -> (Sidecar, Client) {
    let sidecar = Sidecar::start(make_store(&StoreKind::Memory, "ns")).await;
    let client = Client::connect(&sidecar.addr).await.expect("connect");
    (sidecar, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_runs_with_the_token_and_its_status_passes_through() {
    let (sidecar, client) = memory_sidecar().await;
    let dir = TempDir::new("hold");
    let out = dir.0.join("env");
    let script = format!(
        "echo \"$LOCKSIDE_KEY $LOCKSIDE_FENCING_TOKEN\" > {}; exit 7",
        out.display()
    );
    assert_eq!(
        run(&sidecar.addr, &["jobs/nightly", "--", "sh", "-c", &script]).await,
        7
    );
    let written = std::fs::read_to_string(&out).expect("the command ran");
    let state = client.describe("jobs/nightly").await.expect("describe");
    assert_eq!(
        written.trim(),
        format!("jobs/nightly {}", state.fencing_token)
    );
    assert!(state.holders.is_empty(), "released when the command exited");
    assert_eq!(run(&sidecar.addr, &["k", "--", "true"]).await, 0);
    assert_eq!(
        run(&sidecar.addr, &["k", "--", "/no/such/command"]).await,
        127
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_is_held_while_the_command_runs() {
    let (sidecar, client) = memory_sidecar().await;
    let child = hold(&sidecar.addr, &["k", "--", "sleep", "0.5"])
        .spawn()
        .expect("spawn");
    held(&client, "k").await;
    let busy = client.lock_with("k", LockOptions::default()).await;
    assert!(matches!(busy, Err(ClientError::NotAcquired(_))), "{busy:?}");
    assert_eq!(status(child).await, 0);
    assert!(free(&client, "k").await, "released after the command");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_acquired_in_time_and_no_sidecar_have_their_own_statuses() {
    let (sidecar, client) = memory_sidecar().await;
    let _lock = client.lock("k").await.expect("lock");
    let started = Instant::now();
    let code = run(&sidecar.addr, &["k", "--wait", "200ms", "--", "true"]).await;
    assert_eq!(code, i32::from(EXIT_NOT_ACQUIRED));
    assert!(started.elapsed() >= Duration::from_millis(200));
    let nowhere = format!("127.0.0.1:{}", common::free_port());
    assert_eq!(
        run(&nowhere, &["k", "--", "true"]).await,
        i32::from(EXIT_UNAVAILABLE)
    );
    assert_eq!(
        run(&sidecar.addr, &["k"]).await,
        64,
        "no command: a usage error"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_are_forwarded_to_the_command() {
    let (sidecar, client) = memory_sidecar().await;
    // The command says when its trap is set, so the signal cannot come before it.
    let dir = common::TempDir::new("hold-signals");
    let ready = dir.0.join("ready");
    let script = format!(
        "trap 'exit 42' TERM; touch {}; while true; do sleep 0.05; done",
        ready.display()
    );
    let child = hold(&sidecar.addr, &["k", "--", "sh", "-c", &script])
        .spawn()
        .expect("spawn");
    held(&client, "k").await;
    let trapped = async {
        while !ready.exists() {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(common::PATIENCE, trapped)
        .await
        .expect("the command set its trap");
    let pid = child.id().expect("pid").to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill")
            .success()
    );
    assert_eq!(
        status(child).await,
        42,
        "the command's own answer to SIGTERM"
    );
    assert!(free(&client, "k").await, "released after the command");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_stops_the_command() {
    let mut redis = Redis::start();
    let sidecar = Sidecar::start(make_store(&StoreKind::Redis(redis.url()), &namespace())).await;
    let client = Client::connect(&sidecar.addr).await.expect("connect");
    // The command ignores SIGTERM, so it takes the SIGKILL after --kill-grace.
    let script = "trap '' TERM; exec sleep 30";
    let args = [
        "k",
        "--ttl",
        "1s",
        "--kill-grace",
        "300ms",
        "--",
        "sh",
        "-c",
        script,
    ];
    let child = hold(&sidecar.addr, &args).spawn().expect("spawn");
    held(&client, "k").await;
    let stopped = Instant::now();
    redis.kill();
    assert_eq!(status(child).await, i32::from(EXIT_LOST));
    let took = stopped.elapsed();
    assert!(
        took < Duration::from_secs(3),
        "lost within the 1 s TTL, killed 0.3 s later: {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_client_holds_releases_and_notices_loss() {
    let mut redis = Redis::start();
    let sidecar = Sidecar::start(make_store(&StoreKind::Redis(redis.url()), &namespace())).await;
    let client = Client::connect(&sidecar.addr).await.expect("connect");
    let first = client.lock("k").await.expect("lock");
    assert_eq!(first.key(), "k");
    let busy = client.lock_with("k", LockOptions::default()).await;
    assert!(
        matches!(busy, Err(ClientError::NotAcquired(ref r)) if r.contains("BUSY")),
        "{busy:?}"
    );
    let token = first.fencing_token();
    first.release().await.expect("release");
    // Dropping a guard releases its lock too.
    let second = client.lock("k").await.expect("lock again");
    assert!(second.fencing_token() > token);
    drop(second);
    let options = LockOptions {
        wait: Some(Duration::from_secs(5)),
        ttl: Some(Duration::from_secs(1)),
        ..LockOptions::default()
    };
    let third = client
        .lock_with("k", options)
        .await
        .expect("lock after drop");
    assert!(!third.is_lost());
    redis.kill();
    tokio::time::timeout(PATIENCE, third.lost())
        .await
        .expect("lost() completes when the store is gone");
    assert!(third.is_lost());
    assert!(matches!(third.release().await, Err(ClientError::Lost)));
    let bad = client.lock_with("", LockOptions::default()).await;
    assert!(
        matches!(bad, Err(ClientError::Rejected { code: 3, .. })),
        "{bad:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_prints_the_holders() {
    let (sidecar, client) = memory_sidecar().await;
    let _lock = client.lock("k").await.expect("lock");
    let out = Command::new(env!("CARGO_BIN_EXE_lockside"))
        .args(["describe", "k", "--addr", &sidecar.addr])
        .output()
        .await
        .expect("describe");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("mode: EXCLUSIVE"), "{text}");
    assert!(
        text.contains("holder ") && text.contains("holds 1"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_while_waiting_ends_hold_without_running_the_command() {
    let (sidecar, client) = memory_sidecar().await;
    let holder = client.lock("k").await.expect("lock");
    let dir = TempDir::new("hold-wait");
    let ran = dir.0.join("ran");
    let script = format!("touch {}", ran.display());
    let child = hold(&sidecar.addr, &["k", "--", "sh", "-c", &script])
        .spawn()
        .expect("spawn");
    // Waiting: the hold process is registered behind the holder.
    tokio::time::timeout(PATIENCE, async {
        while client.describe("k").await.expect("describe").waiters == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("hold waits");
    let pid = child.id().expect("pid").to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status();
    assert!(killed.expect("kill").success());
    assert_eq!(status(child).await, 143, "128 + SIGTERM, like a shell");
    holder.release().await.expect("release");
    assert!(!ran.exists(), "the command never ran");
    assert!(free(&client, "k").await, "nothing left behind");
}
