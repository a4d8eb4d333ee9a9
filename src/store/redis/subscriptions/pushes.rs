//! What the server pushes on the subscribed connection: notices, confirmations, drops,
//! disconnections; and the healing of a Cluster's subscriptions after a move.

use std::sync::Arc;

use super::*;

impl Subscriptions {
    /// An unsubscribe of `keys` failed: those not listened to again are still
    /// subscribed, for the next pass to try again.
    pub(super) fn still_subscribed(&self, keys: &[String]) {
        let mut state = self.state();
        for key in keys {
            if self.sharded {
                let channel = self.channel(key);
                if let Some(n) = state.leaving.get_mut(&channel) {
                    *n -= 1;
                    if *n == 0 {
                        state.leaving.remove(&channel);
                    }
                }
            }
            if !state.wanted.contains_key(key) {
                state.subscribed.insert(key.clone());
            }
        }
    }

    /// Cluster: the server confirmed an unsubscribe of `channel`. One this sidecar did
    /// not send means the server dropped the subscription (its slot moved): a key still
    /// listened to is subscribed again (see [`Self::heal`]).
    fn unsubscribed(self: &Arc<Self>, channel: &str) {
        let mut state = self.state();
        if let Some(n) = state.leaving.get_mut(channel) {
            *n -= 1;
            if *n == 0 {
                state.leaving.remove(channel);
            }
            return;
        }
        let wanted = self
            .key_of(channel)
            .is_some_and(|key| state.wanted.contains_key(key));
        drop(state);
        if wanted {
            tracing::info!(%channel, "a notice subscription moved; subscribing again");
            self.heal();
        }
    }

    /// Cluster: after a failover or a slot migration the cluster connection
    /// re-subscribes by itself, but its slot map may lag behind the cluster's for a
    /// moment, and a subscription made on a node that is losing the slot may be dropped
    /// again. So every listened key is subscribed again a few times while the topology
    /// settles (SSUBSCRIBE is idempotent per node), and waiters look again after each
    /// pass: their acquires also move the slot map forward (MOVED). One healing at a
    /// time; waiters keep their own deadlines meanwhile, so this is about latency only.
    fn heal(self: &Arc<Self>) {
        if self.healing.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            for pause in HEAL_PAUSES {
                // Time for the cluster to settle, not a wait for an event we could see.
                tokio::time::sleep(pause).await;
                {
                    let mut state = this.state();
                    state.again = true;
                    state.missed = true;
                }
                this.kick.notify_one();
            }
            this.healing.store(false, Ordering::Release);
        });
    }

    /// Turns push messages into notices until the store goes.
    pub(super) async fn hear(self: Arc<Self>, mut pushes: mpsc::UnboundedReceiver<Push>) {
        while let Some((id, push)) = pushes.recv().await {
            match push.kind {
                PushKind::Message | PushKind::SMessage => {
                    if let Some(payload) = text(push.data.get(1)) {
                        let _ = self.notices.send(Notice::parse(&payload));
                    }
                }
                PushKind::SUnsubscribe => {
                    if let Some(channel) = text(push.data.first()) {
                        self.unsubscribed(&channel);
                    }
                }
                PushKind::Disconnection if self.sharded => {
                    // Releases on that node were missed until the connection
                    // re-subscribes.
                    tracing::debug!("a cluster node connection dropped");
                    // It may have restarted: the renewer renews at once, and a grant
                    // the node lost is found on its own guarded call there
                    // (`redis/restarts/witness.rs`).
                    self.link.restarts().renew_now();
                    let _ = self.notices.send(Notice::Resync);
                    self.heal();
                }
                PushKind::Disconnection => {
                    // The next pass makes a new connection and subscribes there.
                    tracing::debug!("the connection to Redis dropped");
                    self.link.forget(id);
                    self.kick.notify_one();
                }
                _ => {}
            }
        }
    }
}

fn text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}
