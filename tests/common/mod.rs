//! Test harness: real `redis-server` processes on free loopback ports (`redis.rs`;
//! Sentinel and Cluster topologies in `topology.rs`), sidecars in this process or as the
//! real binary (`sidecar.rs`), a small `Lease` client (`client.rs`), the history checker
//! (`history.rs`, and `workload.rs` for the fault scenarios), a fault-injecting proxy
//! (`proxy.rs`), certificates (`certs.rs`) and a real Prometheus (`prometheus.rs`).
//! Every process started here is killed on drop, also when a test panics.
#![allow(dead_code)]

pub mod certs;
pub mod client;
pub mod history;
pub mod prometheus;
pub mod proxy;
pub mod records;
pub mod redis;
pub mod sidecar;
pub mod topology;
pub mod workload;

use std::net::TcpListener as StdListener;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use lockside::engine::EngineConfig;
use lockside::server::ServerConfig;
use lockside::store::{Store, memory::MemoryStore, redis::RedisStore};

// Every test binary compiles the whole harness and uses a part of it.
#[allow(unused_imports)]
pub use client::{Client, LeaseStream, acquire, acquire_all, handoff, refusal, secs, waiting_for};
#[allow(unused_imports)]
pub use history::{Interval, Rng, Verdict, check_history, max_concurrent};
#[allow(unused_imports)]
pub use redis::Redis;
#[allow(unused_imports)]
pub use sidecar::{HolderProcess, Sidecar, SidecarProcess, example_path, two_sidecars};

/// Upper bound for anything a test awaits. Generous: it only bounds a failing test.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// A free loopback port (below 55536, so Cluster bus ports fit too).
pub fn free_port() -> u16 {
    loop {
        let port = StdListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("bind a free port");
        // A Cluster node also listens on port + 10000 (its bus): keep both free.
        if port < 55536 && StdListener::bind(("127.0.0.1", port + 10000)).is_ok() {
            return port;
        }
    }
}

/// A scratch directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let name = lockside::engine::random_hex(8).expect("randomness");
        let path = std::env::temp_dir().join(format!("lockside-{tag}-{name}"));
        std::fs::create_dir_all(&path).expect("create temp dir");
        Self(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{sig} {pid} failed");
}

/// Which store a test runs on.
#[derive(Clone, Debug)]
pub enum StoreKind {
    Memory,
    Redis(String),
}

/// A namespace unique to this call, so tests sharing a Redis never meet.
pub fn namespace() -> String {
    TempDir::new("ns")
        .0
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

pub fn make_store(kind: &StoreKind, ns: &str) -> Arc<dyn Store> {
    match kind {
        StoreKind::Memory => Arc::new(MemoryStore::new()),
        StoreKind::Redis(url) => {
            Arc::new(RedisStore::new(url, ns, Duration::from_millis(500)).expect("redis store"))
        }
    }
}

/// A Redis store whose hold-off after the store lost its data (`store/redis/restarts/`)
/// is `hold_off` rather than the product's default (the default TTL, 10 s): for tests
/// that restart Redis empty to test something else, with the TTL of their locks.
pub fn redis_store(url: &str, ns: &str, hold_off: Duration) -> Arc<dyn Store> {
    let options = lockside::store::redis::RedisOptions {
        timeout: Duration::from_millis(500),
        restart_hold_off: hold_off,
        ..Default::default()
    };
    Arc::new(RedisStore::with_options(url, ns, &options).expect("redis store"))
}

/// Server settings for tests: short keepalive so a frozen client is noticed fast.
pub fn test_server_config() -> ServerConfig {
    ServerConfig {
        keepalive_interval: Duration::from_millis(300),
        keepalive_timeout: Duration::from_millis(300),
        drain_timeout: Duration::from_secs(5),
        ..ServerConfig::default()
    }
}

/// A sidecar in this process on the store under test ("memory" or "redis"), with a
/// client; the Redis (if any) lives as long as the setup.
pub struct Setup {
    pub sidecar: Sidecar,
    pub client: Client,
    _redis: Option<Redis>,
}

pub async fn setup(kind: &str) -> Setup {
    setup_with(kind, EngineConfig::default()).await
}

/// `kind`: "memory", "redis", or "least_privilege" (a Redis whose only user for the
/// sidecar is the least-privilege user the README documents).
pub async fn setup_with(kind: &str, config: EngineConfig) -> Setup {
    let ns = namespace();
    let (kind, redis) = match kind {
        "memory" => (StoreKind::Memory, None),
        "least_privilege" => {
            let (redis, url) = Redis::least_privilege(&ns);
            (StoreKind::Redis(url), Some(redis))
        }
        _ => {
            let redis = Redis::start();
            (StoreKind::Redis(redis.url()), Some(redis))
        }
    };
    let sidecar = Sidecar::start_with(make_store(&kind, &ns), config).await;
    let client = sidecar.client().await;
    Setup {
        sidecar,
        client,
        _redis: redis,
    }
}

/// Runs each `async fn NAME(Setup)` of the calling file on a Redis whose only user for
/// the sidecar is the least-privilege user the README documents, as
/// `least_privilege::NAME`.
#[macro_export]
macro_rules! on_least_privilege_redis {
    ($($name:ident),* $(,)?) => {
        mod least_privilege {
            $(#[tokio::test] async fn $name() { super::$name($crate::common::setup("least_privilege").await).await; })*
        }
    };
}

/// Runs each `async fn NAME(Setup)` of the calling file once on the memory store and
/// once on a real Redis, as `memory::NAME` and `redis::NAME`.
#[macro_export]
macro_rules! for_each_store {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(#[tokio::test] async fn $name() { super::$name($crate::common::setup("memory").await).await; })*
        }
        mod redis {
            $(#[tokio::test] async fn $name() { super::$name($crate::common::setup("redis").await).await; })*
        }
    };
}
