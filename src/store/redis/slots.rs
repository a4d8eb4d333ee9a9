//! Redis Cluster hash slots: which slot a key lives in, and which node serves each slot
//! ([`SlotMap`], read in the background), for grouping renewals by node
//! (`redis/renew/`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_redis::redis::{self, Value};
use tokio::time::Instant;

use super::link::Link;

/// The Cluster hash slot of a Redis key: CRC16 (XMODEM) of its hash tag (the part
/// between the first `{` and the next `}`, when not empty) or of the whole key, mod 16384.
pub(crate) fn slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16(tagged.unwrap_or(bytes)) % 16384
}

fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// Slots in a Cluster.
pub(super) const SLOTS: usize = 16384;

/// Shortest pause between two reads of the slot map: a topology change makes many
/// chunks refused at once, and one read serves them all.
const MAP_PAUSE: Duration = Duration::from_secs(1);

/// Which master serves each slot, as one `CLUSTER SLOTS` reply said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Owners {
    /// Per slot, an index into `nodes` (`usize::MAX` for a slot nobody serves).
    pub(crate) slots: Vec<usize>,
    /// The masters, as `host` and `port`.
    pub(crate) nodes: Vec<(String, u16)>,
}

impl Owners {
    /// The master that serves `slot`, if any: its index and address.
    pub(crate) fn node(&self, slot: u16) -> Option<(usize, &(String, u16))> {
        let index = *self.slots.get(usize::from(slot))?;
        Some((index, self.nodes.get(index)?))
    }
}

/// Which node serves each slot (see [`Owners`]).
pub(super) fn slot_owners(reply: &Value) -> Option<Owners> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    let mut nodes: Vec<(String, u16)> = Vec::new();
    let mut owners = vec![usize::MAX; SLOTS];
    for range in ranges {
        let Value::Array(fields) = range else {
            return None;
        };
        let (Some(Value::Int(first)), Some(Value::Int(last)), Some(Value::Array(master))) =
            (fields.first(), fields.get(1), fields.get(2))
        else {
            return None;
        };
        let (Some(Value::BulkString(host)), Some(Value::Int(port))) =
            (master.first(), master.get(1))
        else {
            return None;
        };
        let node = (
            String::from_utf8(host.clone()).ok()?,
            u16::try_from(*port).ok()?,
        );
        let index = match nodes.iter().position(|n| *n == node) {
            Some(index) => index,
            None => {
                nodes.push(node);
                nodes.len() - 1
            }
        };
        let (first, last) = (usize::try_from(*first).ok()?, usize::try_from(*last).ok()?);
        for owner in owners.get_mut(first..=last)? {
            *owner = index;
        }
    }
    Some(Owners {
        slots: owners,
        nodes,
    })
}

/// Cluster: the slot map renewals are grouped by, as last read, and its refresh in the
/// background (see the module docs).
#[derive(Default)]
pub(super) struct SlotMap {
    owners: Mutex<Option<Arc<Owners>>>,
    /// A read is under way.
    reading: AtomicBool,
    /// When the last read started.
    last_read: Mutex<Option<Instant>>,
}

impl SlotMap {
    /// The map, if one is known.
    pub(super) fn get(&self) -> Option<Arc<Owners>> {
        self.owners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Reads the map now, within `timeout`, for a caller that cannot go on without it.
    pub(super) async fn read_now(&self, link: &Link, timeout: Duration) -> Option<Arc<Owners>> {
        let read = async {
            let mut conn = link.connection().await.ok()?;
            let mut slots = redis::cmd("CLUSTER");
            slots.arg("SLOTS");
            slots.query_async::<Value>(&mut conn).await.ok()
        };
        let owners = Arc::new(slot_owners(
            &tokio::time::timeout(timeout, read).await.ok()??,
        )?);
        *self.owners.lock().unwrap_or_else(|e| e.into_inner()) = Some(owners.clone());
        Some(owners)
    }

    /// Forgets the map (a node refused a chunk grouped by it).
    pub(super) fn forget(&self) {
        self.owners.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// Reads the map again in the background, unless a read is under way or the last
    /// one started less than [`MAP_PAUSE`] ago. Never waited for: a read that meets a
    /// frozen node costs a background task its timeout, not a renewal.
    pub(super) fn refresh(self: &Arc<Self>, link: &Arc<Link>, timeout: Duration) {
        {
            let mut last = self.last_read.lock().unwrap_or_else(|e| e.into_inner());
            if last.is_some_and(|t| t.elapsed() < MAP_PAUSE) {
                return;
            }
            if self.reading.swap(true, Ordering::AcqRel) {
                return;
            }
            *last = Some(Instant::now());
        }
        let (map, link) = (self.clone(), link.clone());
        tokio::spawn(async move {
            let read = async {
                let mut conn = link.connection().await.ok()?;
                redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async::<Value>(&mut conn)
                    .await
                    .ok()
            };
            match tokio::time::timeout(timeout, read).await {
                Ok(Some(reply)) => match slot_owners(&reply) {
                    Some(owners) => {
                        *map.owners.lock().unwrap_or_else(|e| e.into_inner()) =
                            Some(Arc::new(owners));
                    }
                    None => tracing::warn!("CLUSTER SLOTS: a reply this sidecar cannot read"),
                },
                _ => tracing::debug!("CLUSTER SLOTS not read; renewals go per slot meanwhile"),
            }
            map.reading.store(false, Ordering::Release);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_hash_tag() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("{user1000}.following"), slot("user1000"));
        assert_eq!(slot("{ns:k}:h"), slot("{ns:k}:n"));
        assert_eq!(
            slot("{}x"),
            slot("{}x"),
            "an empty tag hashes the whole key"
        );
        assert_ne!(slot("{}a"), slot("{}b"));
    }

    fn node(port: i64) -> Value {
        Value::Array(vec![
            Value::BulkString(b"127.0.0.1".to_vec()),
            Value::Int(port),
            Value::BulkString(b"id".to_vec()),
        ])
    }

    #[test]
    fn the_slot_map_names_one_node_per_slot() {
        let range = |first, last, port| {
            Value::Array(vec![
                Value::Int(first),
                Value::Int(last),
                node(port),
                node(port + 3),
            ])
        };
        let reply = Value::Array(vec![
            range(0, 5460, 7000),
            range(5461, 10922, 7001),
            range(10923, 16383, 7002),
            range(16000, 16383, 7000),
        ]);
        let map = slot_owners(&reply).expect("a map");
        let owners = &map.slots;
        assert_eq!((owners[0], owners[5460], owners[5461]), (0, 0, 1));
        assert_eq!((owners[10923], owners[16383]), (2, 0), "later ranges win");
        assert_eq!(map.nodes[1], ("127.0.0.1".to_owned(), 7001));
        assert_eq!(map.node(16383), Some((0, &("127.0.0.1".to_owned(), 7000))));
        assert!(slot_owners(&Value::Int(1)).is_none());
        let out_of_range = Value::Array(vec![range(0, 20000, 7000)]);
        assert!(
            slot_owners(&out_of_range).is_none(),
            "no panic on a bad range"
        );
    }
}
