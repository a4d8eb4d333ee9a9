//! A Cluster's markers and witnesses: every call that grants or keeps a grant runs only
//! on a master whose tenure this sidecar read.
//!
//! The cluster client follows MOVED, reconnects to a restarted node and sends a call
//! again by itself, so nothing this sidecar checks before a call can say which server
//! process will run it. The check is made by the script, on the node that runs it:
//!
//! - Each master keeps a marker, `{ns:epoch/N}:e` (N the first number whose key's slot
//!   that master serves), read by this sidecar on a connection of its own to that
//!   master (`lua/epoch.lua`): the read compares the master's tenure (`run_id`,
//!   `master_replid`) with the one the marker names, and starts the hold-off if it
//!   changed. The marker names a *witness*, a shard channel in its own slot, which the
//!   sidecar then subscribes to on that same connection: the read and the subscription
//!   reach the same process.
//! - Every guarded script gets `marker|witness` (`lua/guard.lua`) and first checks, on
//!   its node, that the marker names that witness and that the witness has
//!   subscribers. A restarted node has none; a promoted replica never had this master's
//!   (subscriptions are not replicated); a demoted master drops them, and so does a
//!   node that gives the slot up. The script then answers `UNVERIFIED` and changes
//!   nothing; the sidecar reads that master's marker again and sends the call once
//!   more. A marker not on the node that runs the call (the slot map moved on) fails
//!   the script the same way.
//! - A witness connection that drops, or whose subscription the node drops, forgets
//!   that master's guard and makes the renewer renew at once: grants a restarted
//!   master lost are found, and written back, within moments.
//!
//! Reading a marker costs one script call and one subscription per master after a
//! change; each guarded call a `GET` and a `PUBSUB SHARDNUMSUB` inside its script.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use deadpool_redis::redis::aio::MultiplexedConnection;
use deadpool_redis::redis::{self, ConnectionInfo, PushInfo, PushKind, Value};
use tokio::sync::mpsc;

use super::super::link::{Link, at_address, single};
use super::super::{RedisStore, slots};
use crate::store::StoreError;

/// How a Redis error names a guarded script that ran on a master whose tenure this
/// sidecar did not read (`lua/guard.lua`), or whose marker lives on another node.
pub(crate) fn unverified(error: &redis::RedisError) -> bool {
    error.code() == Some("UNVERIFIED") || error.to_string().contains("non local key")
}

/// The start of the message of a [`StoreError`] made from an [`unverified`] error.
pub(crate) const UNVERIFIED: &str = "the master's tenure is not verified";

/// One master's guard: what its guarded scripts are given, and the connection that
/// keeps its witness subscribed.
struct Verified {
    guard: Arc<[u8]>,
    /// Kept open: the witness lives as long as this connection and its process.
    _conn: MultiplexedConnection,
    id: u64,
}

/// A master, by address.
#[derive(Default)]
struct Master {
    verified: Mutex<Option<Verified>>,
    /// One reading at a time: ten thousand acquires after a failover read once.
    reading: tokio::sync::Mutex<()>,
}

impl Master {
    fn verified(&self) -> std::sync::MutexGuard<'_, Option<Verified>> {
        self.verified.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A push of a master's own connection: the master, the connection's id, the push.
type Push = ((String, u16), u64, PushInfo);

/// The Cluster's masters as this sidecar verified them.
pub(crate) struct Witnesses {
    masters: Mutex<HashMap<(String, u16), Arc<Master>>>,
    /// The guards of one server: none, and its marker alone (made once: every call
    /// passes one).
    pub(crate) none: Arc<[u8]>,
    marker_only: Arc<[u8]>,
    /// Credentials and TLS for a master's own connection; its address is replaced.
    template: Option<ConnectionInfo>,
    next_id: AtomicU64,
    pushes: mpsc::UnboundedSender<Push>,
    receiver: Mutex<Option<mpsc::UnboundedReceiver<Push>>>,
}

impl Witnesses {
    /// For the Cluster found through `template` (a seed node; `None` elsewhere), or the
    /// one server whose marker is `marker`.
    pub(crate) fn new(template: Option<ConnectionInfo>, marker: &str) -> Self {
        let (pushes, receiver) = mpsc::unbounded_channel();
        Self {
            masters: Mutex::default(),
            none: Arc::from(&b""[..]),
            marker_only: format!("{marker}|").into_bytes().into(),
            template,
            next_id: AtomicU64::new(1),
            pushes,
            receiver: Mutex::new(Some(receiver)),
        }
    }

    fn master(&self, addr: &(String, u16)) -> Arc<Master> {
        let mut masters = self.masters.lock().unwrap_or_else(|e| e.into_inner());
        masters.entry(addr.clone()).or_default().clone()
    }

    /// Forgets `addr`'s guard if it is still `guard` (or the one of connection `id`):
    /// the next guarded call reads the marker again.
    pub(crate) fn forget(
        &self,
        addr: &(String, u16),
        guard: Option<&[u8]>,
        id: Option<u64>,
    ) -> bool {
        let master = self.master(addr);
        let mut verified = master.verified();
        let same = verified.as_ref().is_some_and(|v| {
            guard.is_none_or(|g| *v.guard == *g) && id.is_none_or(|id| v.id == id)
        });
        if same {
            *verified = None;
        }
        same
    }
}

/// The marker of each master of `owners`, by the master's index.
pub(super) fn markers(namespace: &str, owners: &slots::Owners) -> HashMap<usize, String> {
    let nodes: HashSet<usize> = (owners.slots.iter().copied())
        .filter(|&n| n != usize::MAX)
        .collect();
    let mut found = HashMap::new();
    // Bounded: with n masters the first few dozen numbers find them all.
    for n in 0..(64 * slots::SLOTS) {
        if found.len() == nodes.len() {
            break;
        }
        let marker = format!("{{{namespace}:epoch/{n}}}:e");
        if let Some((node, _)) = owners.node(slots::slot(&marker))
            && node != usize::MAX
        {
            found.entry(node).or_insert(marker);
        }
    }
    found
}

impl RedisStore {
    /// Runs `call` with the guard of `key`'s master (`lua/guard.lua`: on a Cluster,
    /// `marker|witness`; elsewhere empty, or with `marker`, this server's marker with no
    /// witness, for the scripts that check the hold-off on the server). A call answered
    /// [`UNVERIFIED`] is made once more after the master's marker is read again.
    pub(in crate::store::redis) async fn guarded<T, F, Fut>(
        &self,
        key: &str,
        marker: bool,
        call: F,
    ) -> Result<T, StoreError>
    where
        F: Fn(Arc<[u8]>) -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        if !self.link.is_cluster() || !self.link.restarts().watched() {
            let guard = match marker {
                true => &self.witnesses.marker_only,
                false => &self.witnesses.none,
            };
            return call(guard.clone()).await;
        }
        let slot = slots::slot(&self.key(key, "h"));
        let mut again = false;
        loop {
            let last = again;
            let (addr, guard) = match self.guard_of_slot(slot).await {
                Ok(found) => found,
                // The map may have moved on (the master it names is no longer one).
                Err(e) if !last => {
                    tracing::debug!(%key, error = %e, "a master's marker not read; reading the slot map again");
                    self.slot_map.forget();
                    again = true;
                    continue;
                }
                Err(e) => return Err(e),
            };
            match call(guard.clone()).await {
                Err(StoreError::Unavailable(e)) if e.starts_with(UNVERIFIED) && !last => {
                    tracing::debug!(%key, "a guarded call reached a master whose tenure was not read; reading it");
                    self.witnesses.forget(&addr, Some(&guard), None);
                    self.slot_map.forget();
                    again = true;
                }
                answer => return answer,
            }
        }
    }

    /// The guard of the master that serves `slot`, read first if need be; and the
    /// master's address.
    pub(in crate::store::redis) async fn guard_of_slot(
        &self,
        slot: u16,
    ) -> Result<((String, u16), Arc<[u8]>), StoreError> {
        let owners = self.owners().await?;
        let (index, addr) = owners.node(slot).ok_or_else(|| {
            StoreError::Unavailable(format!("no master serves slot {slot} in the slot map"))
        })?;
        let guard = self.guard_of(&owners, index, addr).await?;
        Ok((addr.clone(), guard))
    }

    /// The slot map, read now when none is known.
    pub(in crate::store::redis) async fn owners(&self) -> Result<Arc<slots::Owners>, StoreError> {
        match self.slot_map.get() {
            Some(owners) => Ok(owners),
            None => (self.slot_map.read_now(&self.link, self.timeout).await).ok_or_else(|| {
                StoreError::Unavailable("the Cluster's slot map could not be read".into())
            }),
        }
    }

    /// Master `index` of `owners` (at `addr`)'s guard, its marker read and its witness
    /// subscribed first when this sidecar has none for it.
    pub(in crate::store::redis) async fn guard_of(
        &self,
        owners: &slots::Owners,
        index: usize,
        addr: &(String, u16),
    ) -> Result<Arc<[u8]>, StoreError> {
        let master = self.witnesses.master(addr);
        if let Some(v) = master.verified().as_ref() {
            return Ok(v.guard.clone());
        }
        let _turn = master.reading.lock().await;
        if let Some(v) = master.verified().as_ref() {
            return Ok(v.guard.clone());
        }
        let marker = markers(&self.namespace, owners)
            .remove(&index)
            .ok_or_else(|| StoreError::Unavailable("no marker for this master".into()))?;
        let read = tokio::time::timeout(self.timeout, self.read_master(addr, &marker)).await;
        let verified = read.map_err(|_| {
            StoreError::Unavailable(format!(
                "the epoch marker of {}:{} not read within {:?}",
                addr.0, addr.1, self.timeout
            ))
        })??;
        let guard = verified.guard.clone();
        *master.verified() = Some(verified);
        Ok(guard)
    }

    /// Reads `marker` on a connection of its own to the master at `addr`, then
    /// subscribes to the witness it names on that connection.
    async fn read_master(
        &self,
        addr: &(String, u16),
        marker: &str,
    ) -> Result<Verified, StoreError> {
        let witnesses = &self.witnesses;
        let template = witnesses
            .template
            .as_ref()
            .ok_or_else(|| StoreError::Config("no Cluster node to connect to".into()))?;
        let info = at_address(template, addr.0.clone(), addr.1);
        let id = witnesses.next_id.fetch_add(1, Ordering::Relaxed);
        let (sender, node) = (witnesses.pushes.clone(), addr.clone());
        let pushes = move |push: PushInfo| sender.send((node.clone(), id, push));
        let mut conn = single(&info, self.timeout, Some(pushes)).await?;
        let reading = self.link.restarts().read(&mut conn, marker).await;
        let failed = |e: String| {
            // The map may have moved on: the marker is no longer on this master.
            self.slot_map.refresh(&self.link, self.timeout);
            StoreError::Unavailable(e)
        };
        let reading = reading
            .map_err(|e| failed(e.to_string()))?
            .ok_or_else(|| failed(format!("the epoch marker {marker} could not be read")))?;
        let subscribed: redis::RedisResult<Value> = redis::cmd("SSUBSCRIBE")
            .arg(&reading.witness)
            .query_async(&mut conn)
            .await;
        subscribed.map_err(|e| failed(e.to_string()))?;
        let guard: Arc<[u8]> = format!("{marker}|{}", reading.witness).into_bytes().into();
        Ok(Verified {
            guard,
            _conn: conn,
            id,
        })
    }
}

impl Witnesses {
    /// Forgets a master's guard when its witness connection drops or the master drops
    /// its subscription, and has the renewer renew at once; until the store goes.
    pub(crate) async fn watch(self: Arc<Self>, link: Arc<Link>) {
        let Some(mut pushes) = (self.receiver.lock())
            .unwrap_or_else(|e| e.into_inner())
            .take()
        else {
            return;
        };
        while let Some((addr, id, push)) = pushes.recv().await {
            if matches!(push.kind, PushKind::SUnsubscribe | PushKind::Disconnection)
                && self.forget(&addr, None, Some(id))
            {
                let master = format!("{}:{}", addr.0, addr.1);
                tracing::debug!(%master, "a master's witness went; its tenure is read again before the next guarded call");
                link.restarts().renew_now();
            }
        }
    }
}
