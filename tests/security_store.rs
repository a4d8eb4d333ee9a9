//! Redis behind TLS (`rediss://` with a CA file, and mutual TLS) and behind an ACL
//! user: a lock goes through each, with certificates generated here; a wrong setting
//! fails as UNAVAILABLE (or a configuration error) and no error shows a secret.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::certs::{Ca, write};
use common::{Redis, Sidecar, TempDir, namespace};
use lockside::store::redis::{RedisOptions, RedisStore};
use lockside::store::{Claim, Sharing, Store, StoreError};
use rcgen::ExtendedKeyUsagePurpose;

/// A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files.
struct Pki {
    dir: TempDir,
}

impl Pki {
    fn new() -> Self {
        let dir = TempDir::new("pki");
        let ca = Ca::new("lockside test CA");
        let server = ca.leaf(&["127.0.0.1"], ExtendedKeyUsagePurpose::ServerAuth);
        let client = ca.client("client");
        for (name, pem) in [
            ("ca.pem", &ca.pem),
            ("server.pem", &server.cert),
            ("server.key", &server.key),
            ("client.pem", &client.cert),
            ("client.key", &client.key),
        ] {
            write(&dir, name, pem);
        }
        Self { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.0.join(name)
    }

    fn arg(&self, name: &str) -> String {
        self.path(name).to_string_lossy().into_owned()
    }

    /// A TLS-only redis-server; with `mutual`, it requires client certificates.
    fn redis(&self, mutual: bool) -> Redis {
        let server = [
            "--tls-cert-file".into(),
            self.arg("server.pem"),
            "--tls-key-file".into(),
            self.arg("server.key"),
            "--tls-ca-cert-file".into(),
            self.arg("ca.pem"),
            "--tls-auth-clients".into(),
            if mutual { "yes" } else { "no" }.into(),
        ];
        let cli = [
            "--tls".into(),
            "--cacert".into(),
            self.arg("ca.pem"),
            "--cert".into(),
            self.arg("client.pem"),
            "--key".into(),
            self.arg("client.key"),
        ];
        Redis::start_custom(None, &server, &cli, true)
    }
}

fn claim(owner: &str) -> Claim {
    Claim {
        key: "k".into(),
        owner: owner.into(),
        ttl: Duration::from_secs(10),
        wait: false,
        session_id: "sid".into(),
        client_name: String::new(),
        holder: String::new(),
        sharing: Sharing::Exclusive,
        limit: 1,
        fair: false,
        value: Vec::new(),
        ticket: None,
    }
}

fn store(url: &str, options: RedisOptions) -> Arc<dyn Store> {
    let options = RedisOptions {
        timeout: Duration::from_secs(2),
        ..options
    };
    Arc::new(RedisStore::with_options(url, &namespace(), &options).expect("store"))
}

/// A whole lock through the gRPC API on `store`: grant, release, grant again.
async fn lock_through(store: Arc<dyn Store>) {
    let sidecar = Sidecar::start(store).await;
    let client = sidecar.client().await;
    let mut lease = client.lease().await;
    let first = lease.grant("k").await.fencing_token;
    assert_eq!(lease.release("k").await, 0);
    assert!(lease.grant("k").await.fencing_token > first);
}

#[tokio::test]
async fn rediss_with_a_ca_file_grants_locks() {
    let pki = Pki::new();
    let redis = pki.redis(false);
    let url = format!("rediss://127.0.0.1:{}", redis.port);
    let options = RedisOptions {
        ca_file: Some(pki.path("ca.pem")),
        ..RedisOptions::default()
    };
    lock_through(store(&url, options)).await;
    // Without the CA the server's certificate is not trusted (the web PKI roots are).
    let untrusted = store(&url, RedisOptions::default());
    let err = untrusted.acquire(&claim("a")).await.expect_err("untrusted");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err}");
}

#[tokio::test]
async fn mutual_tls_needs_the_client_certificate() {
    let pki = Pki::new();
    let redis = pki.redis(true);
    let url = format!("rediss://127.0.0.1:{}", redis.port);
    let ca_only = RedisOptions {
        ca_file: Some(pki.path("ca.pem")),
        ..RedisOptions::default()
    };
    let with_cert = RedisOptions {
        client_cert: Some(pki.path("client.pem")),
        client_key: Some(pki.path("client.key")),
        ..ca_only.clone()
    };
    lock_through(store(&url, with_cert)).await;
    let refused = store(&url, ca_only).acquire(&claim("a")).await;
    assert!(
        matches!(refused, Err(StoreError::Unavailable(_))),
        "{refused:?}"
    );
}

#[tokio::test]
async fn an_acl_user_grants_locks_and_a_wrong_password_is_not_shown() {
    let redis = Redis::start_custom(
        None,
        &[
            "--user".into(),
            "lockside".into(),
            "on".into(),
            ">s3cret-pw".into(),
            "~*".into(),
            "&*".into(),
            "+@all".into(),
        ],
        &[
            "--user".into(),
            "lockside".into(),
            "--pass".into(),
            "s3cret-pw".into(),
            "--no-auth-warning".into(),
        ],
        false,
    );
    let url = format!("redis://lockside:s3cret-pw@127.0.0.1:{}", redis.port);
    lock_through(store(&url, RedisOptions::default())).await;
    let wrong = format!("redis://lockside:wr0ng-pw@127.0.0.1:{}", redis.port);
    let err = store(&wrong, RedisOptions::default())
        .acquire(&claim("a"))
        .await
        .expect_err("wrong password");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err}");
    assert!(!err.to_string().contains("wr0ng-pw"), "{err}");
    let err = RedisStore::with_options(
        &format!("mysql://lockside:wr0ng-pw@127.0.0.1:{}", redis.port),
        "ns",
        &RedisOptions::default(),
    )
    .expect_err("bad scheme");
    assert!(!err.to_string().contains("wr0ng-pw"), "{err}");
}
