//! The store under test, one of [`Topo`]: its Redis processes (the harness's `Redis`,
//! `SentinelSetup`, `ClusterSetup`), the URL a sidecar is given, and who is master of
//! what. A *shard* is a set of nodes that hold the same locks: the one standalone node,
//! the Sentinel group, a Cluster master with its replica, one Redlock master. What the
//! nemesis does to nodes is in `nodes.rs`.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use super::common::topology::{ClusterSetup, SentinelSetup};
use super::common::{Redis, TempDir};
use super::plan::Topo;

/// The Redis processes of a round.
pub enum Inner {
    Nodes(Vec<Redis>),
    Sentinel(SentinelSetup),
    Cluster(ClusterSetup),
}

impl Inner {
    pub fn nodes_mut(&mut self) -> &mut Vec<Redis> {
        match self {
            Inner::Nodes(nodes) => nodes,
            Inner::Sentinel(s) => &mut s.nodes,
            Inner::Cluster(c) => &mut c.nodes,
        }
    }
}

/// A shard: its nodes' ports and, on a Cluster, the slot ranges it serves.
#[derive(Clone, Debug)]
pub struct Shard {
    pub ports: Vec<u16>,
    pub slots: Vec<(u16, u16)>,
}

/// Nodes the nemesis has stopped, killed or squeezed, so that healing undoes it.
#[derive(Default)]
pub struct Damage {
    pub frozen: BTreeSet<u16>,
    pub down: BTreeSet<u16>,
    pub squeezed: BTreeSet<u16>,
}

pub struct Topology {
    pub topo: Topo,
    pub inner: Mutex<Inner>,
    pub shards: Vec<Shard>,
    pub damage: Mutex<Damage>,
    /// Sentinel: the sentinels' ports.
    pub sentinels: Vec<u16>,
    /// Copies of AOF directories (`Topo::Aof` snapshots).
    pub snapshots: TempDir,
    url: String,
}

impl Topology {
    /// Starts the topology's processes and waits until they serve.
    pub async fn start(topo: Topo, node_timeout: u64) -> Self {
        let args = |words: &[&str]| words.iter().map(|w| w.to_string()).collect::<Vec<_>>();
        let (inner, url, sentinels) = match topo {
            Topo::Rdb => (Inner::Nodes(vec![Redis::start()]), String::new(), vec![]),
            Topo::Aof => {
                let aof = args(&["--appendonly", "yes", "--appendfsync", "everysec"]);
                let node = Redis::start_custom(None, &aof, &[], false);
                (Inner::Nodes(vec![node]), String::new(), vec![])
            }
            Topo::Redlock => {
                let nodes = (0..3).map(|_| Redis::start()).collect();
                (Inner::Nodes(nodes), String::new(), vec![])
            }
            Topo::Sentinel => {
                let setup = SentinelSetup::start().await;
                let url = setup.url();
                let sentinels = url
                    .trim_start_matches("redis+sentinel://")
                    .split('/')
                    .next()
                    .unwrap_or("")
                    .split(',')
                    .filter_map(|h| h.rsplit(':').next()?.parse().ok())
                    .collect();
                (Inner::Sentinel(setup), url, sentinels)
            }
            Topo::Cluster => {
                let setup = tokio::task::block_in_place(|| {
                    ClusterSetup::start_with_node_timeout(node_timeout)
                });
                let url = setup.url();
                (Inner::Cluster(setup), url, vec![])
            }
        };
        let shards = tokio::task::block_in_place(|| shards_of(&inner));
        Self {
            topo,
            inner: Mutex::new(inner),
            shards,
            damage: Mutex::new(Damage::default()),
            sentinels,
            snapshots: TempDir::new("nemesis-aof"),
            url,
        }
    }

    /// The Redis ports a sidecar reaches through proxies of its own (standalone and
    /// Redlock; Sentinel and Cluster hand out their nodes' addresses, which a proxy
    /// cannot stand in for).
    pub fn proxied_ports(&self) -> Vec<u16> {
        match self.topo {
            Topo::Rdb | Topo::Aof | Topo::Redlock => {
                self.shards.iter().map(|s| s.ports[0]).collect()
            }
            _ => vec![],
        }
    }

    /// The `--store` URL for a sidecar whose proxies to [`Topology::proxied_ports`]
    /// listen on `proxies`.
    pub fn url(&self, proxies: &[u16]) -> String {
        let hosts: Vec<String> = proxies.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        match self.topo {
            Topo::Rdb | Topo::Aof => format!("redis://{}", hosts[0]),
            Topo::Redlock => format!("redlock://{}", hosts.join(",")),
            _ => self.url.clone(),
        }
    }

    /// Every data node's port.
    pub fn ports(&self) -> Vec<u16> {
        self.shards.iter().flat_map(|s| s.ports.clone()).collect()
    }

    /// The shard of `port`.
    pub fn shard_of_port(&self, port: u16) -> usize {
        self.shards
            .iter()
            .position(|s| s.ports.contains(&port))
            .unwrap_or(0)
    }

    /// Per shard, the port of its master now (`None`: nobody serves it now).
    pub fn masters(&self) -> Vec<Option<u16>> {
        let skip = self.unreachable();
        match self.topo {
            Topo::Sentinel => vec![self.sentinel_master()],
            Topo::Cluster => {
                let Some(&asked) = self.ports().iter().find(|p| !skip.contains(p)) else {
                    return vec![None; self.shards.len()];
                };
                let mut masters = vec![None; self.shards.len()];
                for line in cli(asked, &["cluster", "nodes"]).lines() {
                    let f: Vec<&str> = line.split(' ').collect();
                    let port = f
                        .get(1)
                        .and_then(|a| a.split('@').next()?.rsplit(':').next()?.parse().ok());
                    if let Some(port) = port
                        && f.len() > 8
                        && f[2].contains("master")
                        && !f[2].contains("fail")
                    {
                        masters[self.shard_of_port(port)] = Some(port);
                    }
                }
                masters
            }
            _ => self
                .shards
                .iter()
                .map(|s| Some(s.ports[0]).filter(|p| !skip.contains(p)))
                .collect(),
        }
    }

    /// The master the sentinels name (the first that answers).
    fn sentinel_master(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|s| {
            let out = cli(
                *s,
                &[
                    "sentinel",
                    "get-master-addr-by-name",
                    super::common::topology::MASTER,
                ],
            );
            out.lines().nth(1)?.trim().parse().ok()
        })
    }

    /// The ports of shard `shard`'s nodes that are not its master now.
    pub fn replicas(&self, shard: usize) -> Vec<u16> {
        let master = self.masters()[shard];
        let ports = &self.shards[shard].ports;
        ports
            .iter()
            .copied()
            .filter(|p| Some(*p) != master)
            .collect()
    }

    /// Nodes frozen or down: asking them would hang or fail.
    pub fn unreachable(&self) -> BTreeSet<u16> {
        let damage = self.damage.lock().expect("damage");
        damage.frozen.union(&damage.down).copied().collect()
    }

    /// The shard serving `key` in namespace `ns` (a Cluster's slot; else 0).
    pub fn shard_of_key(&self, ns: &str, key: &str) -> usize {
        if self.topo != Topo::Cluster {
            return 0;
        }
        let slot: u16 = cli(
            self.shards[0].ports[0],
            &["cluster", "keyslot", &format!("{{{ns}:{key}}}")],
        )
        .parse()
        .unwrap_or(0);
        self.shards
            .iter()
            .position(|s| s.slots.iter().any(|&(lo, hi)| (lo..=hi).contains(&slot)))
            .unwrap_or(0)
    }

    /// Waits until every node is back and the topology serves, and stays so for 2 s
    /// with the same masters (no failover still under way): a master per shard; on
    /// Sentinel every sentinel naming it, none seeing it down or failing it over, and
    /// a replica online; on a Cluster every node ok and none flagged failing. `Err`
    /// says what was still missing at `limit`.
    pub async fn ready(&self, limit: Duration) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + limit;
        let mut seen: Option<(Vec<Option<u16>>, tokio::time::Instant)> = None;
        let mut missing = String::new();
        while tokio::time::Instant::now() < deadline {
            let now = tokio::task::block_in_place(|| self.serving());
            seen = match (now, seen) {
                (Ok(m), Some((before, since))) if m == before => {
                    if since.elapsed() >= Duration::from_secs(2) {
                        return Ok(());
                    }
                    Some((before, since))
                }
                (Ok(m), _) => Some((m, tokio::time::Instant::now())),
                (Err(why), _) => {
                    missing = why;
                    None
                }
            };
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(missing)
    }

    /// The masters, if the topology serves now (see [`Topology::ready`]); else why not.
    fn serving(&self) -> Result<Vec<Option<u16>>, String> {
        let masters = self.masters();
        if let Some(shard) = masters.iter().position(Option::is_none) {
            return Err(format!("shard {shard} has no master"));
        }
        let name = super::common::topology::MASTER;
        match self.topo {
            Topo::Sentinel => {
                let m = masters[0].unwrap_or(0);
                for s in &self.sentinels {
                    let addr = cli(*s, &["sentinel", "get-master-addr-by-name", name]);
                    let state = cli(*s, &["sentinel", "master", name]);
                    let mut lines = state.lines();
                    lines.find(|l| l.trim() == "flags");
                    let flags = lines.next().unwrap_or("").trim().to_owned();
                    if addr.lines().nth(1) != Some(m.to_string().as_str())
                        || flags.contains("down")
                        || flags.contains("failover")
                    {
                        return Err(format!(
                            "sentinel {s} names {:?} ({flags}), not {m}",
                            addr.lines().nth(1)
                        ));
                    }
                }
                if !cli(m, &["role"]).starts_with("master") {
                    return Err(format!("{m} is not master yet"));
                }
                if !cli(m, &["info", "replication"]).contains("state=online") {
                    return Err(format!("master {m} has no replica online"));
                }
            }
            Topo::Cluster => {
                for p in self.ports() {
                    if !cli(p, &["cluster", "info"]).contains("cluster_state:ok")
                        || cli(p, &["cluster", "nodes"]).contains("fail")
                    {
                        return Err(format!("cluster node {p} is not ok or sees a node failing"));
                    }
                }
            }
            _ => {
                if let Some(p) = self
                    .ports()
                    .into_iter()
                    .find(|p| cli(*p, &["ping"]) != "PONG")
                {
                    return Err(format!("{p} does not answer"));
                }
            }
        }
        Ok(masters)
    }
}

/// The shards of a freshly started topology.
fn shards_of(inner: &Inner) -> Vec<Shard> {
    match inner {
        Inner::Nodes(nodes) => nodes
            .iter()
            .map(|n| Shard {
                ports: vec![n.port],
                slots: vec![],
            })
            .collect(),
        Inner::Sentinel(s) => vec![Shard {
            ports: s.nodes.iter().map(|n| n.port).collect(),
            slots: vec![],
        }],
        Inner::Cluster(c) => {
            let mut shards = Vec::new();
            let nodes = cli(c.nodes[0].port, &["cluster", "nodes"]);
            for line in nodes.lines() {
                let f: Vec<&str> = line.split(' ').collect();
                if f.len() <= 8 || !f[2].contains("master") {
                    continue;
                }
                let Some(port) = f[1]
                    .split('@')
                    .next()
                    .and_then(|a| a.rsplit(':').next()?.parse().ok())
                else {
                    continue;
                };
                let slots = f[8..]
                    .iter()
                    .filter_map(|r| {
                        let (lo, hi) = r.split_once('-').unwrap_or((r, r));
                        Some((lo.parse().ok()?, hi.parse().ok()?))
                    })
                    .collect();
                shards.push(Shard {
                    ports: vec![port, c.replica_of(port)],
                    slots,
                });
            }
            shards.sort_by_key(|s: &Shard| s.slots.first().copied());
            shards
        }
    }
}

/// `redis-cli -p PORT ARGS...`, trimmed, giving up after 3 s (a frozen node never
/// answers).
pub fn cli(port: u16, args: &[&str]) -> String {
    let out = std::process::Command::new("timeout")
        .args(["3", "redis-cli", "-p", &port.to_string()])
        .args(args)
        .output();
    out.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}
