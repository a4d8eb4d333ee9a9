//! Secrets stay out of logs: a sidecar at the most verbose log level, with a Redis
//! password, a bearer token and a TLS key, is driven through grants, refusals, a
//! Redis outage and shutdown, and a config error; none of the secrets appears in what
//! it wrote.

mod common;

use common::certs::{Ca, write};
use common::{PATIENCE, Redis, SidecarProcess, TempDir};
use lockside::client::{Client, ClientTls, ConnectOptions, LockOptions};

const REDIS_PASSWORD: &str = "redis-pa55-Zq8vX1";
const TOKEN: &str = "bearer-t0k-Wm3rT7";

/// Waits until the sidecar says SERVING again (its store answers).
async fn serving(client: &Client) {
    let until_serving = async {
        while !client.serving().await.unwrap_or(false) {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(PATIENCE, until_serving)
        .await
        .expect("SERVING again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_the_logs() {
    let mut redis = Redis::start_with_password(Some(REDIS_PASSWORD));
    let dir = TempDir::new("secrets");
    let ca = Ca::new("secrets CA");
    let leaf = ca.server();
    let cert = write(&dir, "cert.pem", &leaf.cert);
    let key = write(&dir, "key.pem", &leaf.key);
    let token_file = write(&dir, "token", TOKEN);
    let log = dir.0.join("sidecar.log");
    let store = format!("redis://:{REDIS_PASSWORD}@127.0.0.1:{}", redis.port);
    let args = [
        "--auth-token-file",
        &token_file.to_string_lossy(),
        "--tls-cert",
        &cert.to_string_lossy(),
        "--tls-key",
        &key.to_string_lossy(),
    ];
    let env = [("RUST_LOG", "trace"), ("LOCKSIDE_LOG_FORMAT", "json")];
    let mut sidecar = SidecarProcess::launch(&store, "secrets", &args, &env, Some(&log));

    let tls = ClientTls {
        ca_pem: Some(ca.pem.clone().into_bytes()),
        ..ClientTls::default()
    };
    let options = ConnectOptions {
        auth_token: Some(TOKEN.into()),
        tls: Some(tls.clone()),
        ..ConnectOptions::default()
    };
    let client = Client::connect_with(&sidecar.addr, &options)
        .await
        .expect("connect");
    serving(&client).await;
    let guard = client.lock("k").await.expect("a lock");
    guard.release().await.expect("release");
    // A wrong token, refused.
    let wrong = ConnectOptions {
        auth_token: Some("wrong-t0ken".into()),
        tls: Some(tls),
        ..ConnectOptions::default()
    };
    let intruder = Client::connect_with(&sidecar.addr, &wrong)
        .await
        .expect("connect");
    assert!(
        intruder
            .lock_with("k", LockOptions::default())
            .await
            .is_err()
    );
    // Redis goes away and comes back: connection errors are logged.
    redis.kill();
    assert!(client.lock_with("k", LockOptions::default()).await.is_err());
    redis.restart();
    serving(&client).await;
    let guard = client.lock("k").await.expect("a lock after the outage");
    guard.release().await.expect("release");
    assert!(sidecar.terminate().await.success());

    // A store URL the sidecar cannot use: the error must not echo the password.
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_lockside"))
        .args(["serve", "--listen", "127.0.0.1:0", "--admin-listen", "none"])
        .env(
            "LOCKSIDE_STORE",
            format!("redis://:{REDIS_PASSWORD}@127.0.0.1:port"),
        )
        .env("RUST_LOG", "trace")
        .output()
        .expect("run lockside");
    assert_eq!(
        bad.status.code(),
        Some(64),
        "a bad store URL is a usage error"
    );

    let mut logs = std::fs::read_to_string(&log).expect("the sidecar's log");
    logs.push_str(&String::from_utf8_lossy(&bad.stderr));
    // The log is real and verbose: it saw the grants, the outage and the shutdown.
    for expected in [
        "listening",
        "***@127.0.0.1",
        "store health changed",
        "stopped",
        "TRACE",
    ] {
        assert!(logs.contains(expected), "the log lacks {expected:?}");
    }
    let key_body = leaf.key.lines().nth(1).expect("a PEM body line");
    for secret in [REDIS_PASSWORD, TOKEN, key_body] {
        assert!(!logs.contains(secret), "a secret reached the logs");
    }
}
