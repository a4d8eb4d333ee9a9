//! The connection a Redis store runs its scripts on, for each topology.
//!
//! Requests share one multiplexed connection: redis-rs pipelines concurrent requests on
//! it, and a new connection (one handshake) is made only after an error. The first
//! caller that needs one makes it; the others wait for that one instead of opening
//! their own (10,000 acquires in flight after a reconnect open one connection, not
//! 10,000).
//!
//! Every connection speaks RESP3 with a push sender, so that the same connection also
//! carries the notices of the keys this sidecar listens to, as push messages (see
//! `redis/subscriptions.rs`): no second connection, and none of it while nothing
//! listens. Each connection to one server has an id, and its pushes come tagged with
//! it, so a disconnection is matched to the connection it ended.
//!
//! A Cluster connection (redis-rs' cluster client) is one multiplexed connection per
//! node; it follows MOVED/ASK, refreshes the slot map and reconnects by itself, so it is
//! made once and never dropped after an error (dropping it would also drop the sharded
//! subscriptions it keeps).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use deadpool_redis::redis::aio::{AsyncPushSender, ConnectionLike, MultiplexedConnection};
use deadpool_redis::redis::cluster::{ClusterClient, ClusterClientBuilder};
use deadpool_redis::redis::cluster_async::ClusterConnection;
use deadpool_redis::redis::io::tcp::TcpSettings;
use deadpool_redis::redis::{
    self, AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, ProtocolVersion, PushInfo,
    RedisError,
};
use tokio::sync::{mpsc, watch};

use super::options::Topology;
use super::restarts::Restarts;
use super::sentinel::{master_connection, resolve};
use crate::store::StoreError;

/// A connection on which scripts run.
#[derive(Clone)]
pub(crate) enum Conn {
    /// To one server (standalone, or the master the sentinels named).
    Single(MultiplexedConnection),
    /// To a Redis Cluster: routed per key's slot.
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
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
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}

/// A push message (a notice, a subscription's confirmation, a disconnection) and the id
/// of the connection it came on (on a Cluster always 0: one connection, repaired by
/// redis-rs).
pub(crate) type Push = (u64, PushInfo);

/// The store's way to its data: the topology, the shared connection, and the address
/// of the server it last connected to.
pub(crate) struct Link {
    topology: Topology,
    timeout: Duration,
    /// The shared connection and its id.
    conn: Mutex<Option<(Conn, u64)>>,
    connecting: tokio::sync::Mutex<()>,
    /// The id of the next connection to one server.
    next_id: AtomicU64,
    /// Bumped whenever the shared connection is made or forgotten: subscriptions made on
    /// a forgotten connection went with it.
    changes: watch::Sender<u64>,
    /// The server the shared connection goes to, as `host:port`; changes on failover.
    server: watch::Sender<Option<ConnectionInfo>>,
    /// Cluster: the client, made once with the sender of its push messages.
    cluster: Option<ClusterClient>,
    /// Where every connection sends its push messages.
    push_sender: mpsc::UnboundedSender<Push>,
    /// Where the push messages arrive, until the notice listener takes them.
    pushes: Mutex<Option<mpsc::UnboundedReceiver<Push>>>,
    /// The store's epoch, read on each new connection before it is used.
    restarts: Restarts,
}

impl Link {
    pub(crate) fn new(
        topology: Topology,
        timeout: Duration,
        restarts: Restarts,
    ) -> Result<Self, StoreError> {
        let server = match &topology {
            Topology::Standalone(info) => Some(info.clone()),
            Topology::Sentinel { .. } | Topology::Cluster { .. } => None,
        };
        let (push_sender, pushes) = mpsc::unbounded_channel();
        let cluster = match &topology {
            Topology::Cluster {
                nodes,
                certificates,
            } => {
                let sender = tagged(push_sender.clone(), 0);
                Some(cluster_client(
                    nodes,
                    certificates.as_ref(),
                    timeout,
                    sender,
                )?)
            }
            _ => None,
        };
        Ok(Self {
            topology,
            timeout,
            conn: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            next_id: AtomicU64::new(1),
            changes: watch::channel(0).0,
            server: watch::channel(server).0,
            cluster,
            push_sender,
            pushes: Mutex::new(Some(pushes)),
            restarts,
        })
    }

    /// Whether the store lost its data and new grants are held off (`restarts/`).
    pub(crate) fn restarts(&self) -> &Restarts {
        &self.restarts
    }

    /// Whether the store is a Redis Cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        self.cluster.is_some()
    }

    /// Cluster: a seed node, whose credentials and TLS settings every node shares.
    pub(crate) fn cluster_template(&self) -> Option<ConnectionInfo> {
        match &self.topology {
            Topology::Cluster { nodes, .. } => nodes.first().cloned(),
            _ => None,
        }
    }

    /// The push messages of every connection (taken once, by the notice listener).
    pub(crate) fn take_pushes(&self) -> Option<mpsc::UnboundedReceiver<Push>> {
        self.pushes.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Changes when the shared connection is made or forgotten.
    pub(crate) fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// The id of the shared connection, if there is one now.
    pub(crate) fn current(&self) -> Option<u64> {
        self.slot().as_ref().map(|(_, id)| *id)
    }

    /// Behind Sentinel: the id of the shared connection and the address of the server
    /// it is to, if there is one now.
    pub(crate) fn current_server(&self) -> Option<(u64, ConnectionAddr)> {
        let id = self.current()?;
        let server = self.server.borrow();
        Some((id, server.as_ref()?.addr().clone()))
    }

    /// The sentinels and the master's name, behind Sentinel.
    pub(crate) fn sentinels(&self) -> Option<(&[ConnectionInfo], &str)> {
        match &self.topology {
            Topology::Sentinel {
                sentinels, master, ..
            } => Some((sentinels, master)),
            _ => None,
        }
    }

    /// How long a call, or a connection, may take.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<(Conn, u64)>> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The shared connection, made if there is none.
    pub(crate) async fn connection(&self) -> Result<Conn, StoreError> {
        self.connection_with_id().await.map(|(conn, _)| conn)
    }

    /// The shared connection and its id, made if there is none.
    pub(crate) async fn connection_with_id(&self) -> Result<(Conn, u64), StoreError> {
        if let Some(conn) = self.slot().as_ref() {
            return Ok(conn.clone());
        }
        // Boxed: connecting is a large future and rarely needed, and every in-flight
        // call would otherwise carry its size (7 KB per call, a 100 MB peak with 10,000
        // acquires in flight).
        Box::pin(self.reconnect()).await
    }

    async fn reconnect(&self) -> Result<(Conn, u64), StoreError> {
        let _turn = self.connecting.lock().await;
        if let Some(conn) = self.slot().as_ref() {
            return Ok(conn.clone());
        }
        let id = match self.cluster {
            Some(_) => 0,
            None => self.next_id.fetch_add(1, Ordering::Relaxed),
        };
        let pushes = || Some(tagged(self.push_sender.clone(), id));
        let conn = match &self.topology {
            Topology::Standalone(info) => {
                let mut conn = single(info, self.timeout, pushes()).await?;
                self.restarts.greet(&mut conn).await?;
                Conn::Single(conn)
            }
            Topology::Sentinel {
                sentinels,
                master,
                template,
            } => {
                let info = resolve(sentinels, master, template, self.timeout).await?;
                let mut conn = master_connection(&info, self.timeout, pushes()).await?;
                self.restarts.greet(&mut conn).await?;
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
            Topology::Cluster { .. } => match &self.cluster {
                Some(client) => Conn::Cluster(
                    client
                        .get_async_connection()
                        .await
                        .map_err(|e| StoreError::Unavailable(e.to_string()))?,
                ),
                None => return Err(StoreError::Config("no cluster client".into())),
            },
        };
        *self.slot() = Some((conn.clone(), id));
        self.changes.send_modify(|n| *n += 1);
        Ok((conn, id))
    }

    /// Forgets connection `id` after `error` when it may be broken or point at the
    /// wrong server, so the next call makes a new one.
    pub(crate) fn failed(&self, id: u64, error: &RedisError) {
        if error.is_io_error()
            || error.is_connection_dropped()
            || error.is_unrecoverable_error()
            || error.is_timeout()
            || moved_role(error)
        {
            self.forget(id);
        }
    }

    /// Forgets connection `id` (it failed, timed out or ended) if it is still the shared
    /// one: a call made on an older connection says nothing of the one that replaced
    /// it (calls on a hung link time out one after another, and each would otherwise
    /// drop the next connection, and the notice subscriptions with it). Not a cluster
    /// connection: it repairs itself (see the module docs), and a timeout there may
    /// concern one frozen node.
    pub(crate) fn forget(&self, id: u64) {
        if self.is_cluster() {
            return;
        }
        let mut slot = self.slot();
        if slot.as_ref().is_some_and(|(_, current)| *current == id) {
            *slot = None;
            drop(slot);
            self.changes.send_modify(|n| *n += 1);
        }
    }
}

/// A push sender that tags each push with the id of its connection.
fn tagged(
    sender: mpsc::UnboundedSender<Push>,
    id: u64,
) -> impl Fn(PushInfo) -> Result<(), mpsc::error::SendError<Push>> + Send + Sync + 'static {
    move |info| sender.send((id, info))
}

/// A server that is no longer (or not yet) the master: READONLY on a write, or
/// MASTERDOWN from a replica that lost its master.
fn moved_role(error: &RedisError) -> bool {
    let text = error.to_string();
    text.contains("READONLY") || text.contains("MASTERDOWN")
}

/// The cluster client: RESP3 with a push sender (sharded notices), the store timeout
/// for connecting and for each answer, no Nagle, and the certificates for every node.
fn cluster_client(
    nodes: &[ConnectionInfo],
    certificates: Option<&redis::TlsCertificates>,
    timeout: Duration,
    pushes: impl AsyncPushSender,
) -> Result<ClusterClient, StoreError> {
    let mut builder = ClusterClientBuilder::new(nodes.to_vec())
        .use_protocol(ProtocolVersion::RESP3)
        .push_sender(pushes)
        .connection_timeout(timeout)
        .response_timeout(timeout)
        .tcp_settings(TcpSettings::default().set_nodelay(true));
    if let Some(certificates) = certificates {
        builder = builder.certs(certificates.clone());
    }
    builder
        .build()
        .map_err(|e| StoreError::Config(format!("cluster: {e}")))
}

/// A multiplexed connection to one server, within `timeout`. With `pushes`, it speaks
/// RESP3 (Redis 6 or later) and sends its push messages there: it can subscribe.
pub(crate) async fn single(
    info: &ConnectionInfo,
    timeout: Duration,
    pushes: Option<impl AsyncPushSender>,
) -> Result<MultiplexedConnection, StoreError> {
    let mut info = info.clone();
    if pushes.is_some() {
        let settings = info.redis_settings().clone();
        info = info.set_redis_settings(settings.set_protocol(ProtocolVersion::RESP3));
    }
    let client = redis::Client::open(info).map_err(|e| StoreError::Config(e.to_string()))?;
    let mut config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout));
    if let Some(pushes) = pushes {
        config = config.set_push_sender(pushes);
    }
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| StoreError::Unavailable(e.to_string()))
}

/// `template` (credentials, TLS settings) for the server at `host:port`: the master the
/// sentinels name, a Cluster master's own connection.
pub(crate) fn at_address(template: &ConnectionInfo, host: String, port: u16) -> ConnectionInfo {
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
    template.clone().set_addr(addr)
}

/// The push sender type of a connection that has none (a sentinel's).
pub(super) type Unused = mpsc::UnboundedSender<PushInfo>;
