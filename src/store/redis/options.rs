//! How to reach Redis: the topology named by the URL, and the options the URL cannot
//! carry (certificate files, replica acknowledgement, timeouts).
//!
//! URLs (credentials, when given, are for the data nodes; `rediss` turns TLS on for
//! every connection, sentinels included):
//!
//! - `redis://[user:pass@]host:port[/db]`, `rediss://...`: one server (standalone);
//! - `redis+sentinel://[user:pass@]h1:26379,h2:26379/master-name`, `rediss+sentinel://`:
//!   the master that the sentinels name, followed across failovers;
//! - `redis+cluster://[user:pass@]h1:7000,h2:7001`, `rediss+cluster://`: a Redis Cluster,
//!   found from any of the seed nodes.

use std::path::PathBuf;
use std::time::Duration;

use deadpool_redis::redis::io::tcp::TcpSettings;
use deadpool_redis::redis::{self, ClientTlsConfig, ConnectionInfo, IntoConnectionInfo};

use crate::store::StoreError;

/// Connection options of a Redis store beyond its URL.
#[derive(Clone, Debug)]
pub struct RedisOptions {
    /// How long one store call may take before it counts as failed.
    pub timeout: Duration,
    /// PEM file of the CA certificates that sign the servers' certificates, for
    /// `rediss`. Unset: the public web PKI roots (a managed Redis).
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate and key, for servers that require mutual TLS.
    pub client_cert: Option<PathBuf>,
    /// The key of `client_cert`.
    pub client_key: Option<PathBuf>,
    /// Replicas that must acknowledge a grant or a renewal (`WAIT`) before it counts.
    /// 0: none (a failover may lose the last grants; see docs/guarantees.md).
    pub min_replica_acks: u32,
    /// How long a grant or renewal waits for those acknowledgements.
    pub replica_ack_timeout: Duration,
    /// After the store may have lost data (restarted, failed over), how long no new
    /// lock is granted while holders write theirs back (`redis/restarts/`); zero: not
    /// watched.
    pub restart_hold_off: Duration,
    /// The store never comes back with less than it acknowledged: a restart or a
    /// failover that kept the epoch marker holds nothing off (`--durable-store`).
    pub durable: bool,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(1),
            ca_file: None,
            client_cert: None,
            client_key: None,
            min_replica_acks: 0,
            // A replica on the same network acknowledges in about a millisecond; 100 ms
            // tolerates a busy replica and still answers an acquire quickly.
            replica_ack_timeout: Duration::from_millis(100),
            // The default TTL: every grant of a TTL up to it is written back by its
            // holder, or lost by its safe deadline, before anything is granted anew.
            restart_hold_off: Duration::from_secs(10),
            // Redis' defaults (RDB snapshots, `appendfsync everysec`, asynchronous
            // replicas) can all lose the last writes.
            durable: false,
        }
    }
}

impl RedisOptions {
    /// The defaults, with every call giving up after `timeout`.
    pub fn with_timeout(timeout: Duration) -> Self {
        Self {
            timeout,
            ..Self::default()
        }
    }
}

/// Where the data lives, with everything needed to connect.
#[derive(Clone, Debug)]
pub(crate) enum Topology {
    /// One server.
    Standalone(ConnectionInfo),
    /// A master found through sentinels.
    Sentinel {
        /// How to reach each sentinel.
        sentinels: Vec<ConnectionInfo>,
        /// The monitored master's name.
        master: String,
        /// Credentials and TLS for the master; its address is replaced on resolution.
        template: ConnectionInfo,
    },
    /// A Redis Cluster, found from its seed nodes.
    Cluster {
        /// The seed nodes (credentials included).
        nodes: Vec<ConnectionInfo>,
        /// The certificate files for `rediss+cluster://`: the cluster client applies
        /// them to every node it discovers, not only to the seeds.
        certificates: Option<redis::TlsCertificates>,
    },
}

impl Topology {
    /// Parses a store URL; reads the certificate files it needs.
    pub(crate) fn parse(url: &str, options: &RedisOptions) -> Result<Self, StoreError> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| config("a store URL needs a scheme"))?;
        let (base, topology) = match scheme.split_once('+') {
            Some((base, topology)) => (base, Some(topology)),
            None => (scheme, None),
        };
        let tls = match base {
            "redis" => false,
            "rediss" => true,
            _ => return Err(config(format!("unknown scheme {scheme:?}"))),
        };
        if tls {
            // redis-rs builds rustls without a crypto provider; installing one twice is
            // harmless (the second call reports the first).
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let certificates = certificates(options, tls)?;
        let node = |auth: &str, host: &str| -> Result<ConnectionInfo, StoreError> {
            let info = format!("{base}://{auth}{host}")
                .into_connection_info()
                .map_err(|e| config(e.to_string()))?;
            finish(info, certificates.as_ref())
        };
        match topology {
            None => {
                let info = url
                    .into_connection_info()
                    .map_err(|e| config(e.to_string()))?;
                Ok(Self::Standalone(finish(info, certificates.as_ref())?))
            }
            Some("sentinel") => {
                let (auth, rest) = split_auth(rest);
                let (hosts, master) = rest
                    .split_once('/')
                    .filter(|(_, m)| !m.is_empty() && !m.contains('/'))
                    .ok_or_else(|| config("redis+sentinel:// needs /master-name"))?;
                let sentinels = hosts
                    .split(',')
                    .map(|h| node("", h))
                    .collect::<Result<Vec<_>, _>>()?;
                let first = hosts.split(',').next().unwrap_or_default();
                Ok(Self::Sentinel {
                    sentinels,
                    master: master.to_owned(),
                    template: node(auth, first)?,
                })
            }
            Some("cluster") => {
                let (auth, hosts) = split_auth(rest);
                let hosts = hosts.trim_end_matches('/');
                let nodes = hosts
                    .split(',')
                    .map(|h| node(auth, h))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Self::Cluster {
                    nodes,
                    certificates,
                })
            }
            Some(other) => Err(config(format!("unknown topology {other:?}"))),
        }
    }
}

fn config(message: impl Into<String>) -> StoreError {
    StoreError::Config(message.into())
}

/// Splits `user:pass@rest` into (`user:pass@`, `rest`); the `@` stays with the
/// credentials so they can be put back in front of each host.
fn split_auth(rest: &str) -> (&str, &str) {
    match rest.rfind('@') {
        Some(at) => rest.split_at(at + 1),
        None => ("", rest),
    }
}

/// Nagle's algorithm would hold back the second of two pipelined requests until the
/// first is acknowledged; lock handoffs are latency-bound. No `CLIENT SETINFO` after
/// connecting: a command less per connection, and none that a least-privilege user is
/// refused (Redis 7.2 records each refusal in `ACL LOG`). TLS gets the certificates.
fn finish(
    info: ConnectionInfo,
    certificates: Option<&redis::TlsCertificates>,
) -> Result<ConnectionInfo, StoreError> {
    let settings = info.redis_settings().clone().set_skip_set_lib_name();
    let info = (info.set_redis_settings(settings))
        .set_tcp_settings(TcpSettings::default().set_nodelay(true));
    match certificates {
        Some(certs) => redis::Client::build_with_tls(info, certs.clone())
            .map(|client| client.get_connection_info().clone())
            .map_err(|e| config(format!("TLS settings: {e}"))),
        None => Ok(info),
    }
}

fn read(flag: &str, path: &PathBuf) -> Result<Vec<u8>, StoreError> {
    // The path may be shown; the contents never are.
    std::fs::read(path).map_err(|e| config(format!("{flag} {}: {e}", path.display())))
}

/// The certificate files, read once. Given without `rediss`, they are an error rather
/// than silently unused: the operator meant TLS.
fn certificates(
    options: &RedisOptions,
    tls: bool,
) -> Result<Option<redis::TlsCertificates>, StoreError> {
    let any = options.ca_file.is_some() || options.client_cert.is_some();
    if !tls {
        if any || options.client_key.is_some() {
            return Err(config(
                "--store-ca-file and --store-client-cert need a rediss:// store",
            ));
        }
        return Ok(None);
    }
    let client_tls = match (&options.client_cert, &options.client_key) {
        (Some(cert), Some(key)) => Some(ClientTlsConfig {
            client_cert: read("--store-client-cert", cert)?,
            client_key: read("--store-client-key", key)?,
        }),
        (None, None) => None,
        _ => {
            return Err(config(
                "--store-client-cert and --store-client-key go together",
            ));
        }
    };
    let root_cert = match &options.ca_file {
        Some(path) => Some(read("--store-ca-file", path)?),
        None => None,
    };
    if client_tls.is_none() && root_cert.is_none() {
        return Ok(None);
    }
    Ok(Some(redis::TlsCertificates {
        client_tls,
        root_cert,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> Result<Topology, StoreError> {
        Topology::parse(url, &RedisOptions::default())
    }

    #[test]
    fn topologies_parse() {
        assert!(matches!(parse("redis://h:1"), Ok(Topology::Standalone(_))));
        let Ok(Topology::Sentinel {
            sentinels,
            master,
            template,
        }) = parse("redis+sentinel://u:p%40ss@a:1,b:2/mymaster")
        else {
            panic!("sentinel");
        };
        assert_eq!((sentinels.len(), master.as_str()), (2, "mymaster"));
        assert_eq!(sentinels[0].redis_settings().password(), None);
        assert_eq!(template.redis_settings().username(), Some("u"));
        assert_eq!(template.redis_settings().password(), Some("p@ss"));
        let Ok(Topology::Cluster { nodes, .. }) = parse("redis+cluster://:pw@a:1,b:2,c:3") else {
            panic!("cluster");
        };
        assert_eq!(nodes.len(), 3);
        assert!(
            nodes
                .iter()
                .all(|n| n.redis_settings().password() == Some("pw"))
        );
        assert!(parse("redis+sentinel://a:1").is_err(), "no master name");
        assert!(parse("redis+mesh://a:1").is_err());
        assert!(parse("mysql://a:1").is_err());
    }

    #[test]
    fn certificate_files_need_tls_and_go_in_pairs() {
        let ca = RedisOptions {
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..RedisOptions::default()
        };
        assert!(Topology::parse("redis://h:1", &ca).is_err());
        let Err(StoreError::Config(message)) = Topology::parse("rediss://h:1", &ca) else {
            panic!("a missing CA file is a configuration error");
        };
        assert!(message.contains("/nonexistent/ca.pem"), "{message}");
        let half = RedisOptions {
            client_cert: Some("/x".into()),
            ..RedisOptions::default()
        };
        assert!(Topology::parse("rediss://h:1", &half).is_err());
    }
}
