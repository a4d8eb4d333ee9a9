//! A Cluster's markers: one per master, `{ns:epoch/N}:e`, N the first number whose
//! key's slot that master serves. A marker moves with its slot when slots move; a
//! master that serves other slots then gets another marker, new to every sidecar (no
//! hold-off: nobody knew it).
//!
//! The cluster client reconnects to a restarted node by itself, with no call of ours
//! first, so the markers cannot be read "on a new connection". Instead a dropped node
//! connection (its push, which does not say which node) marks every marker to be read
//! again, and the next grant and the next renewal read them first: a grant is not sent
//! before the marker of its key's master was read since the last drop, and not at all
//! if another drop came meanwhile; and the renewer renews every grant at once after a
//! drop, which reads them. Reading them costs one script call per master after a drop;
//! the common case (nothing dropped) one atomic load.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use futures_util::future::join_all;

use super::super::{RedisStore, slots};
use super::Restarts;
use crate::store::StoreError;

/// Which markers were read since a node's connection last dropped.
#[derive(Default)]
pub(super) struct Verified {
    /// Markers read since the last drop.
    read: Mutex<HashSet<String>>,
    /// Every marker was: nothing to look at (the common case).
    all: AtomicBool,
    /// Bumped at every drop.
    drops: AtomicU64,
    /// One reading at a time: after a drop, ten thousand acquires read the markers once.
    reading: tokio::sync::Mutex<()>,
}

impl Restarts {
    /// A Cluster node's connection dropped: every marker is read again before the next
    /// grant (it may have been a restart).
    pub(crate) fn suspect(&self) {
        let verified = &self.cluster;
        verified.drops.fetch_add(1, Ordering::AcqRel);
        verified.all.store(false, Ordering::Release);
        verified
            .read
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        // The renewer renews at once (and again soon while the node is down), so a
        // restart is found, and the grants it lost written back, within moments of
        // the node's return rather than at the next renewal.
        if !self.hold_off.is_zero() {
            self.began.send_modify(|n| *n += 1);
        }
    }

    /// How many drops there were: a grant is sent only if none came since its markers
    /// were read.
    pub(crate) fn drops(&self) -> u64 {
        self.cluster.drops.load(Ordering::Acquire)
    }

    fn all_read(&self) -> bool {
        self.hold_off.is_zero() || self.cluster.all.load(Ordering::Acquire)
    }

    fn was_read(&self, marker: &str) -> bool {
        let read = self.cluster.read.lock().unwrap_or_else(|e| e.into_inner());
        read.contains(marker)
    }
}

/// The marker of each master of `owners` (the slot map: a node's index per slot).
fn markers(namespace: &str, owners: &[usize]) -> Vec<(usize, String)> {
    let nodes: HashSet<usize> = owners
        .iter()
        .copied()
        .filter(|&n| n != usize::MAX)
        .collect();
    let mut found: Vec<(usize, String)> = Vec::new();
    // Bounded: with n masters the first few dozen numbers find them all.
    for n in 0..(64 * slots::SLOTS) {
        if found.len() == nodes.len() {
            break;
        }
        let marker = format!("{{{namespace}:epoch/{n}}}:e");
        let node = owners.get(usize::from(slots::slot(&marker))).copied();
        if let Some(node) = node.filter(|&node| node != usize::MAX)
            && !found.iter().any(|(known, _)| *known == node)
        {
            found.push((node, marker));
        }
    }
    found
}

impl RedisStore {
    /// Cluster: reads every master's marker not read since the last drop (see the
    /// module docs). With `key`, fails unless the marker of its master could be read.
    /// Returns the drops counted when it began. Elsewhere: nothing to do.
    pub(in crate::store::redis) async fn read_markers(
        &self,
        key: Option<&str>,
    ) -> Result<u64, StoreError> {
        let restarts = self.link.restarts();
        if !self.link.is_cluster() || restarts.all_read() {
            return Ok(restarts.drops());
        }
        let _turn = restarts.cluster.reading.lock().await;
        let drops = restarts.drops();
        if restarts.all_read() {
            return Ok(drops);
        }
        let owners = match self.slot_map.get() {
            Some(owners) => owners,
            None => (self.slot_map.read_now(&self.link, self.timeout).await).ok_or_else(|| {
                StoreError::Unavailable("the Cluster's slot map could not be read".into())
            })?,
        };
        let markers = markers(&restarts.namespace, &owners);
        let unread = markers.iter().filter(|(_, m)| !restarts.was_read(m));
        let reads = unread.map(|(_, marker)| async move {
            let read = self.run_within(
                |mut conn| async move { Ok(restarts.read(&mut conn, marker).await) },
                false,
            );
            (marker, read.await.and_then(|r| r))
        });
        for (marker, read) in join_all(reads).await {
            match read {
                Ok(()) => {
                    let mut read = restarts
                        .cluster
                        .read
                        .lock()
                        .unwrap_or_else(|e| e.into_inner());
                    read.insert(marker.clone());
                }
                Err(e) => tracing::debug!(%marker, error = %e, "a master's epoch marker not read"),
            }
        }
        if markers.iter().all(|(_, m)| restarts.was_read(m)) && restarts.drops() == drops {
            restarts.cluster.all.store(true, Ordering::Release);
        }
        if let Some(key) = key {
            let node = owners.get(usize::from(slots::slot(&self.key(key, "h"))));
            let marker = markers.iter().find(|(n, _)| Some(n) == node);
            if !marker.is_some_and(|(_, m)| restarts.was_read(m)) {
                return Err(StoreError::Unavailable(
                    "the epoch marker of this key's master could not be read".into(),
                ));
            }
        }
        Ok(drops)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One marker per master, each in a slot that master serves.
    #[test]
    fn every_master_gets_a_marker_in_its_own_slots() {
        let mut owners = vec![0; slots::SLOTS];
        owners[5461..10923].fill(1);
        owners[10923..].fill(2);
        owners[100] = usize::MAX;
        let found = markers("ns", &owners);
        assert_eq!(found.len(), 3);
        for (node, marker) in &found {
            assert_eq!(owners[usize::from(slots::slot(marker))], *node, "{marker}");
        }
        assert!(markers("ns", &vec![usize::MAX; slots::SLOTS]).is_empty());
    }
}
