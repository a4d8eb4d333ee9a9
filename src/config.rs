//! The command line. Every flag also reads `LOCKSIDE_<FLAG>` from the environment
//! (`webhook`'s flags are in [`crate::webhook`]).
//! Tests build [`EngineConfig`] and [`ServerConfig`] directly instead.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::engine::EngineConfig;
use crate::server::{ListenAddr, ServerConfig};

/// Lockside: distributed locks held by a live gRPC stream.
#[derive(Debug, Parser)]
#[command(name = "lockside", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: CliCommand,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum CliCommand {
    /// Run the sidecar.
    Serve(Box<ServeArgs>),
    /// Run a command while holding a lock, like `etcdctl lock` (exit statuses: README).
    Hold(crate::hold::HoldArgs),
    /// Print a lock's holders and queue.
    Describe(crate::hold::DescribeArgs),
    /// Exit 0 when the sidecar serves (its store answers), 1 otherwise: for exec probes.
    Healthcheck(crate::hold::HealthcheckArgs),
    /// Measure a sidecar against direct Redis calls (see README "Benchmark").
    Bench(crate::bench::BenchArgs),
    /// Run the Kubernetes admission webhook that injects the sidecar into pods.
    Webhook(crate::webhook::WebhookArgs),
}

/// Where locks are kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreSpec {
    /// The embedded memory store.
    Memory,
    /// Redis: standalone (`redis://`, `rediss://`), through Sentinel
    /// (`redis+sentinel://`, `rediss+sentinel://`) or a Cluster (`redis+cluster://`,
    /// `rediss+cluster://`).
    Redis(String),
    /// Redlock over independent masters, `redlock://h1:p1,h2:p2,h3:p3`.
    Redlock(String),
}

impl std::str::FromStr for StoreSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "memory" {
            return Ok(Self::Memory);
        }
        let redis = [
            "redis://",
            "rediss://",
            "redis+sentinel://",
            "rediss+sentinel://",
            "redis+cluster://",
            "rediss+cluster://",
        ];
        if redis.iter().any(|scheme| s.starts_with(scheme)) {
            return Ok(Self::Redis(s.to_owned()));
        }
        if s.starts_with("redlock://") {
            return Ok(Self::Redlock(s.to_owned()));
        }
        Err(format!(
            "{:?} is not a store: use memory, redis://HOST:PORT or rediss://HOST:PORT",
            redact(s)
        ))
    }
}

impl std::fmt::Display for StoreSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Memory => f.write_str("memory"),
            Self::Redis(url) | Self::Redlock(url) => f.write_str(&redact(url)),
        }
    }
}

/// A URL with any `user:password@` part replaced, fit for logs.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

/// Parses `250ms`, `10s`, `5m`, `1h` (a bare number is seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 250ms, 10s, 5m or 1h"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use ms, s, m or h)")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{s:?}: {e}"))
}

/// A duration the way [`parse_duration`] reads them and people write them: `100ms`,
/// `1.5s`, `30s`, `5m`, `1h30m`. Below a second, whole milliseconds; below a minute,
/// seconds to a tenth; above, whole seconds.
pub fn format_duration(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        return format!("{}ms", d.as_millis());
    }
    if d < Duration::from_secs(60) {
        let tenths = (d.as_secs_f64() * 10.0).round() as u64;
        return match tenths % 10 {
            0 => format!("{}s", tenths / 10),
            t => format!("{}.{t}s", tenths / 10),
        };
    }
    let secs = d.as_secs_f64().round() as u64;
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut text = String::new();
    for (value, unit) in [(h, "h"), (m, "m"), (s, "s")] {
        if value > 0 {
            text.push_str(&format!("{value}{unit}"));
        }
    }
    text
}

/// Log formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

fn parse_mode(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("{s:?} is not an octal file mode like 600 or 660"))
}

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
    /// hand out a lock twice (see README "Which topology, what guarantee").
    #[arg(long, env = "LOCKSIDE_MIN_REPLICA_ACKS", default_value_t = 0)]
    pub min_replica_acks: u32,

    /// How long a grant or renewal waits for `--min-replica-acks`. 100 ms: a healthy
    /// replica acknowledges within a millisecond or two, and an acquire should fail
    /// fast rather than wait on a replica that is gone. Must be below --store-timeout.
    #[arg(long, env = "LOCKSIDE_REPLICA_ACK_TIMEOUT", default_value = "100ms", value_parser = parse_duration)]
    pub replica_ack_timeout: Duration,

    /// How long shutdown may take to release every lock.
    #[arg(long, env = "LOCKSIDE_DRAIN_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub drain_timeout: Duration,

    /// After a session ends without releasing (broken stream, keepalive timeout), its
    /// exclusive locks stay ungranted this long, in case the client is alive and still
    /// writing. A clean Release, a half-close or a sidecar shutdown is not delayed.
    /// 0 (off) by default: locks are freed the moment a stream ends.
    #[arg(long, env = "LOCKSIDE_LOCK_DELAY", default_value = "0s", value_parser = parse_duration)]
    pub lock_delay: Duration,

    /// How much slower the sidecar's clock may run than the store's, as a fraction:
    /// every validity is cut by this share of the TTL so that `Lost` still comes before
    /// the store lets go. 0.01 (1%) as in the Redlock description; raise it on hosts
    /// whose clocks are less steady.
    #[arg(long, env = "LOCKSIDE_CLOCK_DRIFT", default_value_t = crate::store::DEFAULT_CLOCK_DRIFT)]
    pub clock_drift: f64,

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
}

impl ServeArgs {
    /// The Redis store's options beyond its URL.
    pub fn redis_options(&self) -> crate::store::redis::RedisOptions {
        crate::store::redis::RedisOptions {
            timeout: self.store_timeout,
            ca_file: self.store_ca_file.clone(),
            client_cert: self.store_client_cert.clone(),
            client_key: self.store_client_key.clone(),
            min_replica_acks: self.min_replica_acks,
            replica_ack_timeout: self.replica_ack_timeout,
        }
    }

    /// Checks values that clap cannot and builds the engine's configuration.
    pub fn engine_config(&self) -> Result<EngineConfig, String> {
        if self.max_ttl < crate::engine::MIN_TTL {
            return Err("--max-ttl must be at least 1s".into());
        }
        if self.default_ttl < crate::engine::MIN_TTL || self.default_ttl > self.max_ttl {
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
        Ok(EngineConfig {
            default_ttl: self.default_ttl,
            max_ttl: self.max_ttl,
            max_sessions: self.max_sessions,
            max_locks_per_session: self.max_locks_per_session,
            max_pending_per_session: self.max_pending_per_session,
            max_waiters_per_key: self.max_waiters_per_key,
            lock_delay: self.lock_delay,
            clock_drift: self.clock_drift,
        })
    }

    /// Where to send traces, if anywhere.
    pub fn trace_config(&self) -> Option<crate::telemetry::TraceConfig> {
        let endpoint = self.otlp_endpoint.as_deref().filter(|e| !e.is_empty())?;
        Some(crate::telemetry::TraceConfig {
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
                Some(crate::server::tls_config(
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
        })
    }
}

/// Reads a bearer token from a file: one word, surrounding whitespace ignored. The
/// error names the file, never its content.
pub fn read_token(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let token = text.trim();
    if token.is_empty() || token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "{}: the token must be one non-empty word",
            path.display()
        ));
    }
    Ok(token.to_owned())
}

/// Reads a PEM file (certificate, key or CA); checks only that it looks like PEM, so
/// a wrong path fails at start rather than at the first handshake.
pub fn read_pem(path: &Path) -> Result<Vec<u8>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !pem.windows(11).any(|w| w == b"-----BEGIN ") {
        return Err(format!("{}: not a PEM file", path.display()));
    }
    Ok(pem)
}

/// How a client reaches the sidecar: `lockside hold`, `describe` and `healthcheck`.
#[derive(Clone, Debug, Args)]
pub struct ConnectArgs {
    /// The sidecar: HOST:PORT, http(s)://HOST:PORT or unix:PATH.
    #[arg(long, env = "LOCKSIDE_ADDR", default_value = crate::client::DEFAULT_ADDR)]
    pub addr: String,

    /// A file holding the sidecar's bearer token (its --auth-token-file).
    #[arg(long, env = "LOCKSIDE_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<PathBuf>,

    /// TLS: the CA that signed the sidecar's certificate (PEM). Implies TLS.
    #[arg(long, env = "LOCKSIDE_TLS_CA")]
    pub tls_ca: Option<PathBuf>,

    /// Mutual TLS: this client's certificate chain (PEM). Needs --tls-key.
    #[arg(long, env = "LOCKSIDE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// Mutual TLS: the private key of --tls-cert (PEM).
    #[arg(long, env = "LOCKSIDE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// TLS: the name the sidecar's certificate must carry, if not the address's host.
    #[arg(long, env = "LOCKSIDE_TLS_SERVER_NAME")]
    pub tls_server_name: Option<String>,
}

impl ConnectArgs {
    /// Reads the files and builds the client's options.
    pub fn options(&self) -> Result<crate::client::ConnectOptions, String> {
        let flag = |name: &'static str| move |e: String| format!("--{name}: {e}");
        let auth_token = self
            .auth_token_file
            .as_deref()
            .map(read_token)
            .transpose()
            .map_err(flag("auth-token-file"))?;
        let tls_wanted = self.tls_ca.is_some() || self.tls_cert.is_some();
        let tls = if tls_wanted || self.addr.starts_with("https://") {
            let identity = match (&self.tls_cert, &self.tls_key) {
                (Some(cert), Some(key)) => Some((
                    read_pem(cert).map_err(flag("tls-cert"))?,
                    read_pem(key).map_err(flag("tls-key"))?,
                )),
                _ => None,
            };
            Some(crate::client::ClientTls {
                ca_pem: self
                    .tls_ca
                    .as_deref()
                    .map(read_pem)
                    .transpose()
                    .map_err(flag("tls-ca"))?,
                identity,
                server_name: self.tls_server_name.clone(),
            })
        } else {
            None
        };
        Ok(crate::client::ConnectOptions { auth_token, tls })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_print_as_people_write_them_and_parse_back() {
        for (d, text) in [
            (Duration::ZERO, "0ms"),
            (Duration::from_millis(100), "100ms"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_secs(30), "30s"),
            (Duration::from_secs(300), "5m"),
            (Duration::from_secs(5400), "1h30m"),
            (Duration::from_secs(24 * 3600), "24h"),
            (Duration::from_secs(3661), "1h1m1s"),
        ] {
            assert_eq!(format_duration(d), text);
            // One unit: `hold --wait` reads it back.
            let one_unit = !text
                .trim_end_matches(char::is_alphabetic)
                .contains(char::is_alphabetic);
            if one_unit {
                assert_eq!(parse_duration(text), Ok(d), "{text}");
            }
        }
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("10d").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn stores_parse_and_redact() {
        assert_eq!("memory".parse(), Ok(StoreSpec::Memory));
        assert!(matches!("redis://h:1".parse(), Ok(StoreSpec::Redis(_))));
        assert!(matches!(
            "redis+sentinel://a:1,b:2/m".parse(),
            Ok(StoreSpec::Redis(_))
        ));
        assert!(matches!(
            "redlock://a,b,c".parse(),
            Ok(StoreSpec::Redlock(_))
        ));
        let shown = StoreSpec::Redlock("redlock://u:pw@a,b,c".into()).to_string();
        assert!(!shown.contains("pw"));
        assert!("mysql://x".parse::<StoreSpec>().is_err());
        assert_eq!(redact("redis://u:secret@h:1/0"), "redis://***@h:1/0");
        let shown = StoreSpec::Redis("rediss://:pw@h:1".into()).to_string();
        assert!(!shown.contains("pw"));
    }

    #[test]
    fn store_certificates_reach_the_redis_options() {
        let cli = Cli::try_parse_from([
            "lockside",
            "serve",
            "--store",
            "rediss://h:1",
            "--store-ca-file",
            "/etc/ca.pem",
            "--store-client-cert",
            "/c.pem",
            "--store-client-key",
            "/c.key",
        ])
        .expect("flags parse");
        let CliCommand::Serve(args) = cli.command else {
            panic!("serve");
        };
        let options = args.redis_options();
        assert_eq!(options.ca_file, Some("/etc/ca.pem".into()));
        assert_eq!(options.client_key, Some("/c.key".into()));
        let half = ["lockside", "serve", "--store-client-cert", "/c.pem"];
        assert!(Cli::try_parse_from(half).is_err(), "a cert needs its key");
    }

    #[test]
    fn listen_addresses_parse() {
        assert_eq!("unix:/tmp/s".parse(), Ok(ListenAddr::Unix("/tmp/s".into())));
        assert_eq!(
            "127.0.0.1:0".parse(),
            Ok(ListenAddr::Tcp("127.0.0.1:0".into()))
        );
        assert!("unix:".parse::<ListenAddr>().is_err());
        assert!("nowhere".parse::<ListenAddr>().is_err());
    }
}
