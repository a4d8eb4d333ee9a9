//! Behind Sentinel: the master the sentinels name, checked to be one, and the watch
//! that follows it when it changes while the connection to the old one still works.

use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis::aio::{AsyncPushSender, MultiplexedConnection};
use deadpool_redis::redis::{self, ConnectionAddr, ConnectionInfo};

use super::link::{Link, Unused, at_address, single};
use crate::store::StoreError;

/// How often a sidecar behind Sentinel asks the sentinels which server is the master.
pub(crate) const SENTINEL_CHECK: Duration = Duration::from_secs(1);

/// The master's address as the first sentinel that answers names it, with the
/// template's credentials and TLS settings. Sentinels are asked in order; one that does
/// not answer within `timeout` is skipped.
pub(super) async fn resolve(
    sentinels: &[ConnectionInfo],
    master: &str,
    template: &ConnectionInfo,
    timeout: Duration,
) -> Result<ConnectionInfo, StoreError> {
    for sentinel in sentinels {
        let ask = async {
            let mut conn = single(sentinel, timeout, None::<Unused>).await?;
            master_named(&mut conn, master)
                .await
                .map_err(|e| StoreError::Unavailable(e.to_string()))
        };
        match tokio::time::timeout(timeout, ask).await {
            Ok(Ok(Some((host, port)))) => return Ok(at_address(template, host, port)),
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
pub(super) async fn master_connection(
    info: &ConnectionInfo,
    timeout: Duration,
    pushes: Option<impl AsyncPushSender>,
) -> Result<MultiplexedConnection, StoreError> {
    let mut conn = single(info, timeout, pushes).await?;
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

/// Asks the sentinels every [`SENTINEL_CHECK`] which server is the master, and drops
/// the shared connection once a majority of them name another one than it is to: the
/// next call connects to theirs. A master frozen (or cut off) through a failover comes
/// back believing it still is the master and answers; its replicas follow the new one,
/// so with replica acknowledgements every grant on it is refused, and without them it
/// may grant what the new master granted too, until Sentinel demotes it (the nemesis
/// saw 9–11 s of it, every lock of the sidecar refused). Redisson's Sentinel manager
/// checks the same way, every second. A majority, so that one sentinel that missed the
/// failover does not move the sidecar back; a connection to each is kept between
/// checks.
pub(super) async fn follow_master(link: Arc<Link>) {
    let Some((sentinels, master)) = link.sentinels() else {
        return;
    };
    let (sentinels, master) = (sentinels.to_vec(), master.to_owned());
    let timeout = link.timeout();
    let mut conns: Vec<Option<MultiplexedConnection>> = vec![None; sentinels.len()];
    let mut every = tokio::time::interval(SENTINEL_CHECK);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some((id, connected)) = link.current_server() else {
            continue; // no connection: the next one asks the sentinels anyway
        };
        let mut named: Vec<(String, u16)> = Vec::new();
        for (sentinel, conn) in sentinels.iter().zip(conns.iter_mut()) {
            if let Some(addr) = ask(sentinel, conn, &master, timeout).await {
                named.push(addr);
            }
        }
        let majority = sentinels.len() / 2 + 1;
        let Some((host, port)) = named
            .iter()
            .find(|a| named.iter().filter(|b| b == a).count() >= majority)
            .cloned()
        else {
            continue;
        };
        let same = match &connected {
            ConnectionAddr::Tcp(h, p)
            | ConnectionAddr::TcpTls {
                host: h, port: p, ..
            } => *h == host && *p == port,
            _ => true,
        };
        if !same {
            tracing::warn!(master = %format!("{host}:{port}"), "the sentinels name another master than the one this sidecar is connected to: reconnecting");
            link.forget(id);
        }
    }
}

/// The master one sentinel names, on its kept connection (made again after an error).
async fn ask(
    sentinel: &ConnectionInfo,
    conn: &mut Option<MultiplexedConnection>,
    master: &str,
    timeout: Duration,
) -> Option<(String, u16)> {
    let asked = async {
        if conn.is_none() {
            *conn = Some(single(sentinel, timeout, None::<Unused>).await.ok()?);
        }
        master_named(conn.as_mut()?, master).await.ok()
    };
    match tokio::time::timeout(timeout, asked).await {
        Ok(Some(Some(addr))) => Some(addr),
        Ok(Some(None)) => None,
        _ => {
            *conn = None;
            None
        }
    }
}

/// The master's address as the sentinel on `conn` names it (`None`: it knows no such
/// master).
async fn master_named(
    conn: &mut MultiplexedConnection,
    master: &str,
) -> redis::RedisResult<Option<(String, u16)>> {
    redis::cmd("SENTINEL")
        .arg("get-master-addr-by-name")
        .arg(master)
        .query_async(conn)
        .await
}
