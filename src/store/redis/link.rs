//! The connection a Redis store runs its scripts on, for each topology.
//!
//! Requests share one multiplexed connection: redis-rs pipelines concurrent requests on
//! it, and a new connection (one handshake) is made only after an error. The first
//! caller that needs one makes it; the others wait for that one instead of opening
//! their own (10,000 acquires in flight after a reconnect open one connection, not
//! 10,000).

use std::sync::Mutex;
use std::time::Duration;

use deadpool_redis::redis::aio::{ConnectionLike, MultiplexedConnection};
use deadpool_redis::redis::{
    self, AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, RedisError,
};
use tokio::sync::watch;

use super::options::Topology;
use crate::store::StoreError;

/// A connection on which scripts run.
#[derive(Clone)]
pub(crate) enum Conn {
    /// To one server (standalone, or the master the sentinels named).
    Single(MultiplexedConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
        }
    }
}

/// The store's way to its data: the topology, the shared connection, and the address
/// of the server it last connected to (the listener follows it).
pub(crate) struct Link {
    topology: Topology,
    timeout: Duration,
    conn: Mutex<Option<Conn>>,
    connecting: tokio::sync::Mutex<()>,
    /// The server the shared connection goes to, as `host:port`; changes on failover.
    server: watch::Sender<Option<ConnectionInfo>>,
}

impl Link {
    pub(crate) fn new(topology: Topology, timeout: Duration) -> Self {
        let server = match &topology {
            Topology::Standalone(info) => Some(info.clone()),
            Topology::Sentinel { .. } | Topology::Cluster(_) => None,
        };
        Self {
            topology,
            timeout,
            conn: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            server: watch::channel(server).0,
        }
    }

    /// The server data goes to, and its changes (for the pub/sub listener).
    pub(crate) fn server(&self) -> watch::Receiver<Option<ConnectionInfo>> {
        self.server.subscribe()
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Conn>> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The shared connection, made if there is none.
    pub(crate) async fn connection(&self) -> Result<Conn, StoreError> {
        if let Some(conn) = self.slot().as_ref() {
            return Ok(conn.clone());
        }
        // Boxed: connecting is a large future and rarely needed, and every in-flight
        // call would otherwise carry its size (7 KB per call, a 100 MB peak with 10,000
        // acquires in flight).
        Box::pin(self.reconnect()).await
    }

    async fn reconnect(&self) -> Result<Conn, StoreError> {
        let _turn = self.connecting.lock().await;
        if let Some(conn) = self.slot().as_ref() {
            return Ok(conn.clone());
        }
        let conn = match &self.topology {
            Topology::Standalone(info) => Conn::Single(single(info, self.timeout).await?),
            Topology::Sentinel {
                sentinels,
                master,
                template,
            } => {
                let info = resolve(sentinels, master, template, self.timeout).await?;
                let conn = master_connection(&info, self.timeout).await?;
                self.server.send_if_modified(|server| {
                    let moved = server.as_ref().map(|s| s.addr()) != Some(info.addr());
                    if moved {
                        tracing::info!(master = %info.addr(), "connected to the master the sentinels name");
                        *server = Some(info);
                    }
                    moved
                });
                Conn::Single(conn)
            }
            Topology::Cluster(_) => {
                return Err(StoreError::Config("not supported yet".into()));
            }
        };
        *self.slot() = Some(conn.clone());
        Ok(conn)
    }

    /// Forgets the shared connection after `error` when it may be broken or point at
    /// the wrong server, so the next call makes a new one.
    pub(crate) fn failed(&self, error: &RedisError) {
        if error.is_io_error()
            || error.is_connection_dropped()
            || error.is_unrecoverable_error()
            || error.is_timeout()
            || moved_role(error)
        {
            self.forget();
        }
    }

    /// Forgets the shared connection (after a timeout).
    pub(crate) fn forget(&self) {
        self.slot().take();
    }
}

/// A server that is no longer (or not yet) the master: READONLY on a write, or
/// MASTERDOWN from a replica that lost its master.
fn moved_role(error: &RedisError) -> bool {
    let text = error.to_string();
    text.contains("READONLY") || text.contains("MASTERDOWN")
}

/// A multiplexed connection to one server, within `timeout`.
pub(crate) async fn single(
    info: &ConnectionInfo,
    timeout: Duration,
) -> Result<MultiplexedConnection, StoreError> {
    let client =
        redis::Client::open(info.clone()).map_err(|e| StoreError::Config(e.to_string()))?;
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| StoreError::Unavailable(e.to_string()))
}

/// The master's address as the first sentinel that answers names it, with the
/// template's credentials and TLS settings. Sentinels are asked in order; one that does
/// not answer within `timeout` is skipped.
async fn resolve(
    sentinels: &[ConnectionInfo],
    master: &str,
    template: &ConnectionInfo,
    timeout: Duration,
) -> Result<ConnectionInfo, StoreError> {
    for sentinel in sentinels {
        let ask = async {
            let mut conn = single(sentinel, timeout).await?;
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(master)
                .query_async::<Option<(String, u16)>>(&mut conn)
                .await
                .map_err(|e| StoreError::Unavailable(e.to_string()))
        };
        match tokio::time::timeout(timeout, ask).await {
            Ok(Ok(Some((host, port)))) => {
                let addr = match template.addr() {
                    ConnectionAddr::TcpTls {
                        insecure,
                        tls_params,
                        ..
                    } => ConnectionAddr::TcpTls {
                        host,
                        port,
                        insecure: *insecure,
                        tls_params: tls_params.clone(),
                    },
                    _ => ConnectionAddr::Tcp(host, port),
                };
                return Ok(template.clone().set_addr(addr));
            }
            Ok(Ok(None)) => tracing::warn!(%master, "a sentinel does not know the master"),
            Ok(Err(e)) => tracing::debug!(error = %e, "a sentinel did not answer"),
            Err(_) => tracing::debug!("a sentinel did not answer in time"),
        }
    }
    Err(StoreError::Unavailable(
        "no sentinel named the master".into(),
    ))
}

/// A connection to the server the sentinels named, checked to be a master: a sentinel
/// may still name a demoted master for a moment after a failover.
async fn master_connection(
    info: &ConnectionInfo,
    timeout: Duration,
) -> Result<MultiplexedConnection, StoreError> {
    let mut conn = single(info, timeout).await?;
    let role: Vec<redis::Value> = redis::cmd("ROLE")
        .query_async(&mut conn)
        .await
        .map_err(|e| StoreError::Unavailable(e.to_string()))?;
    match role.first() {
        Some(redis::Value::BulkString(r)) if r == b"master" => Ok(conn),
        _ => Err(StoreError::Unavailable(format!(
            "{} is not a master (yet)",
            info.addr()
        ))),
    }
}
