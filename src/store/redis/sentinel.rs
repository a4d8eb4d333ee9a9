//! Behind Sentinel: the master the sentinels name, checked to be one.

use std::time::Duration;

use deadpool_redis::redis::aio::{AsyncPushSender, MultiplexedConnection};
use deadpool_redis::redis::{self, ConnectionInfo};

use super::link::{Unused, at_address, single};
use crate::store::StoreError;

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
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(master)
                .query_async::<Option<(String, u16)>>(&mut conn)
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
