//! Release notices: one pub/sub subscription per sidecar to the server that holds the
//! data, followed to a new server after a failover.

use std::time::Duration;

use deadpool_redis::redis::{self, ConnectionInfo};
use tokio::sync::{broadcast, watch};
use tokio_stream::StreamExt;

use crate::store::Notice;

/// Reconnect backoff of the subscription.
const RESUBSCRIBE_MIN: Duration = Duration::from_millis(50);
const RESUBSCRIBE_MAX: Duration = Duration::from_secs(2);

/// Keeps one subscription to `channel` on the server `server` names, reconnecting with
/// backoff and moving when the server changes. After every (re)subscription it sends
/// `Resync`: releases published while it was away were missed.
pub(crate) async fn listen(
    mut server: watch::Receiver<Option<ConnectionInfo>>,
    channel: String,
    notices: broadcast::Sender<Notice>,
) {
    let mut backoff = RESUBSCRIBE_MIN;
    loop {
        let info = server.borrow_and_update().clone();
        if let Some(info) = info {
            subscribe(info, &channel, &notices, &mut server, &mut backoff).await;
        }
        // Backoff between reconnects to an unreachable Redis (not a wait for a lock); a
        // new server ends it early.
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            changed = server.changed() => if changed.is_err() { return },
        }
        backoff = (backoff * 2).min(RESUBSCRIBE_MAX);
    }
}

/// One subscription, until its connection ends or the server changes.
async fn subscribe(
    info: ConnectionInfo,
    channel: &str,
    notices: &broadcast::Sender<Notice>,
    server: &mut watch::Receiver<Option<ConnectionInfo>>,
    backoff: &mut Duration,
) {
    let client = match redis::Client::open(info) {
        Ok(client) => client,
        Err(e) => return tracing::warn!(error = %e, "release notice client"),
    };
    let mut pubsub = match client.get_async_pubsub().await {
        Ok(pubsub) => pubsub,
        Err(e) => return tracing::debug!(error = %e, "release notice connection failed"),
    };
    if let Err(e) = pubsub.subscribe(channel).await {
        return tracing::warn!(error = %e, "subscribing to release notices failed");
    }
    *backoff = RESUBSCRIBE_MIN;
    tracing::debug!(%channel, "subscribed to release notices");
    let _ = notices.send(Notice::Resync);
    let mut messages = pubsub.on_message();
    loop {
        tokio::select! {
            msg = messages.next() => match msg {
                Some(msg) => {
                    if let Ok(payload) = msg.get_payload::<String>() {
                        let _ = notices.send(Notice::parse(&payload));
                    }
                }
                None => {
                    tracing::warn!("release notice subscription ended; resubscribing");
                    return;
                }
            },
            changed = server.changed() => {
                if changed.is_ok() {
                    tracing::info!("the store moved to another server; resubscribing");
                }
                return;
            }
        }
    }
}
