//! `lockside serve`: its flags and the typed configurations they become (the library
//! layers never see the flags) in this file; the sidecar's start (store, listeners,
//! engine) in `run.rs`; its instance name and the lock that proves it in
//! `instance.rs`.

mod instance;
mod run;

pub use run::serve;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use super::files::{read_pem, read_token};
use crate::engine::EngineConfig;
use crate::parse::{StoreSpec, parse_duration, parse_mode};
use crate::proto::limits::MIN_TTL;
use crate::server::{ListenAddr, ServerConfig, tls_config};
use crate::store::redis::{RedisOptions, RedisStore};
use crate::store::redlock::RedlockStore;
use crate::store::{DEFAULT_CLOCK_DRIFT, Store, memory::MemoryStore};
use crate::telemetry::{LogFormat, TraceConfig};

/// Flags of `lockside serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// gRPC listener: HOST:PORT or unix:PATH. Loopback by default: only the pod's own
    /// containers should reach the sidecar.
    #[arg(long, env = "LOCKSIDE_LISTEN", default_value = "127.0.0.1:7420")]
    pub listen: ListenAddr,

    /// Admin listener (HTTP/1.1): /livez, /readyz, /metrics. `none` turns it off.
    /// Loopback by default: probes and scrapers run in the pod or through the kubelet.
    #[arg(long, env = "LOCKSIDE_ADMIN_LISTEN", default_value = "127.0.0.1:7421")]
    pub admin_listen: String,

    /// Where locks live: memory (embedded, the default, for one replica and tests),
    /// redis://[user:pass@]host:port[/db], rediss://..., or
    /// redis+sentinel://[user:pass@]h1:26379,h2:26379/master-name (rediss+sentinel://).
    #[arg(long, env = "LOCKSIDE_STORE", default_value = "memory")]
    pub store: StoreSpec,

    /// Prefix of every key and channel in the store, so apps can share one Redis.
    #[arg(long, env = "LOCKSIDE_NAMESPACE", default_value = "lockside")]
    pub namespace: String,

    /// TTL of an Acquire that sets none (renewed every TTL/3 while the session lives).
    #[arg(long, env = "LOCKSIDE_DEFAULT_TTL", default_value = "10s", value_parser = parse_duration)]
    pub default_ttl: Duration,

    /// Longest TTL a client may ask for.
    #[arg(long, env = "LOCKSIDE_MAX_TTL", default_value = "1h", value_parser = parse_duration)]
    pub max_ttl: Duration,

    /// HTTP/2 PING interval on client connections.
    #[arg(long, env = "LOCKSIDE_KEEPALIVE_INTERVAL", default_value = "5s", value_parser = parse_duration)]
    pub keepalive_interval: Duration,

    /// How long a PING may go unanswered before the client's sessions end.
    #[arg(long, env = "LOCKSIDE_KEEPALIVE_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub keepalive_timeout: Duration,

    /// How long one store call may take before it counts as failed. 1 s is far above a
    /// healthy Redis round trip and below the shortest TTL's renewal slack.
    #[arg(long, env = "LOCKSIDE_STORE_TIMEOUT", default_value = "1s", value_parser = parse_duration)]
    pub store_timeout: Duration,

    /// PEM file of the CA certificates that sign the Redis servers' certificates
    /// (`rediss://` stores). Unset: the public web PKI roots, as for a managed Redis.
    #[arg(long, env = "LOCKSIDE_STORE_CA_FILE")]
    pub store_ca_file: Option<std::path::PathBuf>,

    /// PEM client certificate for Redis servers that require mutual TLS (with
    /// `--store-client-key`).
    #[arg(
        long,
        env = "LOCKSIDE_STORE_CLIENT_CERT",
        requires = "store_client_key"
    )]
    pub store_client_cert: Option<std::path::PathBuf>,

    /// PEM private key of `--store-client-cert`. Read once, never logged.
    #[arg(
        long,
        env = "LOCKSIDE_STORE_CLIENT_KEY",
        requires = "store_client_cert"
    )]
    pub store_client_key: Option<std::path::PathBuf>,

    /// Replicas that must acknowledge a grant or a renewal (Redis `WAIT`, pipelined
    /// with the script on the same connection) before it counts. A grant that is not
    /// acknowledged in time is undone and the acquire answered UNAVAILABLE; a renewal
    /// that is not counts as failed (Jeopardy, then Lost). 0 (off) by default: it costs
    /// a replica round trip per grant and needs replicas; without it a failover may
    /// hand out a lock twice (see docs/guarantees.md, "Which topology, what guarantee").
    #[arg(long, env = "LOCKSIDE_MIN_REPLICA_ACKS", default_value_t = 0)]
    pub min_replica_acks: u32,

    /// How long a grant or renewal waits for `--min-replica-acks`. 100 ms: a healthy
    /// replica acknowledges within a millisecond or two, and an acquire should fail
    /// fast rather than wait on a replica that is gone. Must be below --store-timeout.
    #[arg(long, env = "LOCKSIDE_REPLICA_ACK_TIMEOUT", default_value = "100ms", value_parser = parse_duration)]
    pub replica_ack_timeout: Duration,

    /// Serve (and answer /readyz) although the store's eviction policy may evict held
    /// locks (Redis maxmemory-policy allkeys-* or volatile-*). Off: such a store keeps
    /// the sidecar unready, as a lock it evicts is a lock two clients may hold.
    #[arg(long, env = "LOCKSIDE_ALLOW_EVICTING_STORE")]
    pub allow_evicting_store: bool,

    /// After the store may have come back with less than it had (Redis restarted, from a
    /// snapshot or empty; a failover to a replica; a Cluster slot served by another
    /// node), how long no new lock is granted, by any sidecar, while holders write
    /// theirs back. Unset: --default-ttl. Cover the longest TTL your apps use; 0s turns
    /// the watch off (see docs/guarantees.md, "A store that comes back with less").
    #[arg(long, env = "LOCKSIDE_RESTART_HOLD_OFF", value_parser = parse_duration)]
    pub restart_hold_off: Option<Duration>,

    /// The store never comes back with less than it acknowledged (every write on disk
    /// before its answer, `appendfsync always`, and no failover): only a server that
    /// lost everything (restarted empty, flushed) holds new grants off, not a restart
    /// or a failover. Off by default: Redis' defaults (snapshots, `everysec`,
    /// asynchronous replicas) can lose the last grants.
    #[arg(long, env = "LOCKSIDE_DURABLE_STORE")]
    pub durable_store: bool,

    /// How long shutdown may take to release every lock.
    #[arg(long, env = "LOCKSIDE_DRAIN_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub drain_timeout: Duration,

    /// After a session ends without releasing (broken stream, keepalive timeout), its
    /// exclusive locks stay ungranted this long, in case the client is alive and still
    /// writing. A clean Release, a half-close or a sidecar shutdown is not delayed.
    /// 0 (off) by default: locks are freed the moment a stream ends.
    #[arg(long, env = "LOCKSIDE_LOCK_DELAY", default_value = "0s", value_parser = parse_duration)]
    pub lock_delay: Duration,

    /// How long a session whose stream broke (a connection reset, a transport error, a
    /// keepalive timeout) keeps its locks, still renewed, before releasing them: both
    /// ends see a reset at the same instant, and the client must be able to suspend its
    /// locks before a waiter elsewhere is granted. A clean end (a half-close, the end of
    /// the client's call) releases at once.
    #[arg(long, env = "LOCKSIDE_BROKEN_GRACE", default_value = "30ms", value_parser = parse_duration)]
    pub broken_grace: Duration,

    /// How much slower the sidecar's clock may run than the store's, as a fraction:
    /// every validity is cut by this share of the TTL so that `Lost` still comes before
    /// the store lets go. 0.01 (1%) as in the Redlock description; raise it on hosts
    /// whose clocks are less steady.
    #[arg(long, env = "LOCKSIDE_CLOCK_DRIFT", default_value_t = DEFAULT_CLOCK_DRIFT)]
    pub clock_drift: f64,

    /// How long this sidecar's attachment lives in the store without a refresh (one
    /// every third of it while it has sessions holding locks). A session of a sidecar
    /// that died can be resumed elsewhere (or by the restarted sidecar) once this has
    /// passed: keep it well below the TTL of your locks. Allowed: 300ms to 1m.
    #[arg(long, env = "LOCKSIDE_ATTACHMENT_TTL", default_value = "3s", value_parser = parse_duration)]
    pub attachment_ttl: Duration,

    /// This sidecar's stable name, one per pod and container (e.g. the pod's UID),
    /// with --instance-dir: a sidecar restarted in place then takes over its
    /// predecessor's sessions at once instead of after the old attachment expired.
    #[arg(long, env = "LOCKSIDE_INSTANCE", requires = "instance_dir")]
    pub instance: Option<String>,

    /// A pod-local directory (an emptyDir that outlives container restarts) where the
    /// sidecar locks `NAME.lock` while it runs: the proof that no other process runs
    /// under --instance NAME.
    #[arg(long, env = "LOCKSIDE_INSTANCE_DIR", requires = "instance")]
    pub instance_dir: Option<PathBuf>,

    /// A file holding a bearer token: every LockService call must then carry
    /// `authorization: Bearer <token>` (health excepted). The token is read once and
    /// never logged.
    #[arg(long, env = "LOCKSIDE_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<PathBuf>,

    /// TLS on the gRPC listener: the server's certificate chain (PEM). Needs
    /// --tls-key. Off by default: inside a pod, loopback and Unix sockets need none.
    #[arg(long, env = "LOCKSIDE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The private key of --tls-cert (PEM). Read once, never logged.
    #[arg(long, env = "LOCKSIDE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// Mutual TLS: clients must present a certificate that chains to this CA (PEM).
    #[arg(long, env = "LOCKSIDE_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,

    /// Export trace spans over OTLP/gRPC to this collector (e.g. http://localhost:4317).
    /// The standard OpenTelemetry variable, so a pod's usual setting applies; unset: no
    /// traces.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,

    /// `service.name` of exported spans (the standard OpenTelemetry variable).
    #[arg(long, env = "OTEL_SERVICE_NAME", default_value = "lockside")]
    pub service_name: String,

    /// Log format on stderr: `text` for people, `json` for log pipelines.
    #[arg(long, env = "LOCKSIDE_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,

    /// Permissions of a `unix:` listener's socket file (octal). 0600 by default: only
    /// the sidecar's user may connect; pods whose app runs as another user share a
    /// group and use 0660.
    #[arg(long, env = "LOCKSIDE_SOCKET_MODE", default_value = "600", value_parser = parse_mode)]
    pub socket_mode: u32,

    /// Threads that run sessions. One by default, like linkerd2-proxy: a sidecar shares
    /// its node with the app, and on one thread a lock's round trip skips the cross-thread
    /// wake-ups (measured: 1.6× instead of 2.0× the direct-Redis cycle, same throughput
    /// with 64 sessions on 2 cores). Raise it for very busy pods.
    #[arg(long, env = "LOCKSIDE_WORKER_THREADS", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=256))]
    pub worker_threads: u16,

    /// Open Lease streams per sidecar.
    #[arg(long, env = "LOCKSIDE_MAX_SESSIONS", default_value_t = 10_000)]
    pub max_sessions: usize,

    /// Locks held or being acquired per session.
    #[arg(long, env = "LOCKSIDE_MAX_LOCKS_PER_SESSION", default_value_t = 1024)]
    pub max_locks_per_session: usize,

    /// Unanswered requests per session.
    #[arg(long, env = "LOCKSIDE_MAX_PENDING_PER_SESSION", default_value_t = 1024)]
    pub max_pending_per_session: usize,

    /// Waiting acquires per key on this sidecar.
    #[arg(long, env = "LOCKSIDE_MAX_WAITERS_PER_KEY", default_value_t = 1024)]
    pub max_waiters_per_key: usize,

    /// Open Watch streams per sidecar. As many as sessions: a watch costs one channel
    /// receiver here, and each watched key one store read per change, however many
    /// watch it.
    #[arg(long, env = "LOCKSIDE_MAX_WATCHES", default_value_t = 10_000)]
    pub max_watches: usize,
}

impl ServeArgs {
    /// The Redis store's options beyond its URL.
    pub fn redis_options(&self) -> RedisOptions {
        RedisOptions {
            timeout: self.store_timeout,
            ca_file: self.store_ca_file.clone(),
            client_cert: self.store_client_cert.clone(),
            client_key: self.store_client_key.clone(),
            min_replica_acks: self.min_replica_acks,
            replica_ack_timeout: self.replica_ack_timeout,
            restart_hold_off: self.restart_hold_off.unwrap_or(self.default_ttl),
            durable: self.durable_store,
        }
    }

    /// Checks values that clap cannot and builds the engine's configuration.
    pub fn engine_config(&self) -> Result<EngineConfig, String> {
        if self.max_ttl < MIN_TTL {
            return Err("--max-ttl must be at least 1s".into());
        }
        if self.default_ttl < MIN_TTL || self.default_ttl > self.max_ttl {
            return Err("--default-ttl must lie between 1s and --max-ttl".into());
        }
        if self.namespace.is_empty() || self.namespace.contains(['{', '}']) {
            return Err("--namespace must be non-empty and without braces".into());
        }
        let positive = [
            ("--max-sessions", self.max_sessions),
            ("--max-locks-per-session", self.max_locks_per_session),
            ("--max-pending-per-session", self.max_pending_per_session),
            ("--max-waiters-per-key", self.max_waiters_per_key),
            ("--max-watches", self.max_watches),
        ];
        if let Some((flag, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("{flag} must be at least 1"));
        }
        if !(0.0..0.5).contains(&self.clock_drift) {
            return Err("--clock-drift must be a fraction from 0 to below 0.5".into());
        }
        if self.max_sessions > u32::MAX as usize {
            return Err("--max-sessions is too large".into());
        }
        if !(Duration::from_millis(300)..=Duration::from_secs(60)).contains(&self.attachment_ttl) {
            return Err("--attachment-ttl must be from 300ms to 1m".into());
        }
        Ok(EngineConfig {
            default_ttl: self.default_ttl,
            max_ttl: self.max_ttl,
            max_sessions: self.max_sessions,
            max_locks_per_session: self.max_locks_per_session,
            max_pending_per_session: self.max_pending_per_session,
            max_waiters_per_key: self.max_waiters_per_key,
            lock_delay: self.lock_delay,
            broken_grace: self.broken_grace,
            clock_drift: self.clock_drift,
            max_watches: self.max_watches,
            attachment_ttl: self.attachment_ttl,
            // Set by `serve` once the instance's lock is taken.
            instance: None,
        })
    }

    /// Where to send traces, if anywhere.
    pub fn trace_config(&self) -> Option<TraceConfig> {
        let endpoint = self.otlp_endpoint.as_deref().filter(|e| !e.is_empty())?;
        Some(TraceConfig {
            endpoint: endpoint.to_owned(),
            service_name: self.service_name.clone(),
        })
    }

    /// The server's settings (reads the token and TLS files).
    pub fn server_config(&self) -> Result<ServerConfig, String> {
        let auth_token = self
            .auth_token_file
            .as_deref()
            .map(read_token)
            .transpose()?;
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => {
                let client_ca = self.tls_client_ca.as_deref().map(read_pem).transpose()?;
                Some(tls_config(
                    &read_pem(cert)?,
                    &read_pem(key)?,
                    client_ca.as_deref(),
                ))
            }
            _ => None,
        };
        Ok(ServerConfig {
            keepalive_interval: self.keepalive_interval,
            keepalive_timeout: self.keepalive_timeout,
            drain_timeout: self.drain_timeout,
            auth_token,
            tls,
            allow_evicting_store: self.allow_evicting_store,
        })
    }
    /// The store `--store` names, with its options. Settings that cannot work together
    /// are refused here, in terms of the flags.
    pub fn store(&self) -> Result<Arc<dyn Store>, String> {
        let acks = self.min_replica_acks > 0;
        let store: Arc<dyn Store> = match &self.store {
            StoreSpec::Memory if acks => {
                return Err("--min-replica-acks needs a Redis store with replicas".into());
            }
            StoreSpec::Redlock(_) if acks => {
                return Err(
                    "--min-replica-acks does not apply to Redlock's independent masters".into(),
                );
            }
            StoreSpec::Redis(_) if acks && self.replica_ack_timeout >= self.store_timeout => {
                return Err("--replica-ack-timeout must be shorter than --store-timeout".into());
            }
            StoreSpec::Memory => Arc::new(MemoryStore::new()),
            StoreSpec::Redis(url) => Arc::new(
                RedisStore::with_options(url, &self.namespace, &self.redis_options())
                    .map_err(|e| format!("--store: {e}"))?,
            ),
            StoreSpec::Redlock(url) => Arc::new(
                RedlockStore::with_options(url, &self.namespace, &self.redis_options())
                    .map_err(|e| format!("--store: {e}"))?,
            ),
        };
        Ok(store)
    }
}
