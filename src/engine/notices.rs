//! Routing the store's notices: a release wakes this sidecar's waiters for the key,
//! and every change has the key's watchers read it again. One task per engine.

use std::sync::Arc;

use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use super::wakers::Wakers;
use super::watches::Watches;
use crate::metrics::{Heard, Metrics};
use crate::store::Notice;

/// Wakes local waiters on release notices from the store, and has watched keys read
/// again on every notice.
pub(super) async fn dispatch_notices(
    mut notices: broadcast::Receiver<Notice>,
    wakers: Arc<Wakers>,
    metrics: Arc<Metrics>,
    watches: Arc<Watches>,
    shutdown: CancellationToken,
) {
    loop {
        let notice = tokio::select! {
            _ = shutdown.cancelled() => return,
            notice = notices.recv() => notice,
        };
        metrics.heard(match &notice {
            Ok(Notice::Released { .. }) => Heard::Released,
            Ok(Notice::Changed { .. }) => Heard::Changed,
            Ok(Notice::Resync) | Err(RecvError::Lagged(_)) => Heard::Resync,
            Err(RecvError::Closed) => return,
        });
        match notice {
            Ok(Notice::Released { key, owners }) => {
                wakers.wake(&key, &owners);
                watches.poke(&key);
            }
            // A change that frees nothing: nobody waiting can go; watchers look.
            Ok(Notice::Changed { key }) => watches.poke(&key),
            Ok(Notice::Resync) | Err(RecvError::Lagged(_)) => {
                wakers.wake_all();
                watches.poke_all();
            }
            Err(RecvError::Closed) => return,
        }
    }
}
