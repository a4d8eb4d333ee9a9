//! Everything a round runs: the topology, the fenced register, three sidecars (`s2`
//! with `--instance`), the proxies between clients and sidecars and between sidecars
//! and Redis, and the client processes (four Rust, two Python; two workers each); plus
//! what the nemesis records about them: fault records, deaths, master changes.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::common::TempDir;
use super::common::proxy::Proxy;
use super::history::{Event, now_ns};
use super::plan::{CLOCK_DRIFT, HOLD_OFF, KeySpec, RoundPlan, TTL, Topo, WAIT, WorkerArgs};
use super::processes::{ClientProc, Events, SidecarProc};
use super::register::Register;
use super::schedule::Fault;
use super::topology::Topology;

/// The sidecars of a round.
pub const SIDECARS: usize = 3;
/// Rust client processes, then Python ones.
pub const RUST_CLIENTS: usize = 4;
pub const PYTHON_CLIENTS: usize = 2;

/// A fault as it happened: when it began and ended, and what it hit.
#[derive(Clone, Debug)]
pub struct Record {
    pub fault: Fault,
    pub start: u64,
    pub end: u64,
    /// The shard of the Redis node it hit, and the node.
    pub shard: Option<usize>,
    pub port: Option<u16>,
    pub sidecar: Option<usize>,
    /// The client process (with its incarnation) it hit.
    pub process: Option<String>,
    pub note: String,
}

/// A shard's master changed (seen by polling every 300 ms).
#[derive(Clone, Debug)]
pub struct MasterChange {
    pub t: u64,
    pub shard: usize,
    pub from: Option<u16>,
    pub to: Option<u16>,
}

pub struct World {
    pub topology: Topology,
    pub register: Register,
    pub sidecars: Vec<Mutex<SidecarProc>>,
    pub client_links: Vec<Proxy>,
    /// Per sidecar, a proxy to each proxied Redis node (standalone, Redlock).
    pub store_links: Vec<Vec<Proxy>>,
    pub clients: Vec<Mutex<ClientProc>>,
    /// The sidecar each client process uses.
    pub client_sidecar: Vec<usize>,
    pub events: Events,
    pub keys: Vec<KeySpec>,
    pub key_shard: BTreeMap<String, usize>,
    pub records: Mutex<Vec<Record>>,
    pub deaths: Mutex<BTreeMap<String, u64>>,
    pub changes: Mutex<Vec<MasterChange>>,
    pub dir: TempDir,
}

impl World {
    /// Starts everything of `plan`'s round; the clients run from here on.
    pub async fn start(plan: &RoundPlan) -> Self {
        let dir = TempDir::new("nemesis");
        // One namespace for every round: each round has Redis servers of its own, and
        // a fixed name keeps a Cluster's key slots the same from one replay to another.
        let ns = "nemesis".to_owned();
        let topology = Topology::start(plan.topo, plan.node_timeout).await;
        let register = Register::start().await;
        let instance_dir = dir.0.join("instances");
        std::fs::create_dir_all(&instance_dir).expect("instance dir");
        let mut sidecars = Vec::new();
        let mut store_links = Vec::new();
        for i in 0..SIDECARS {
            let mut links = Vec::new();
            for port in topology.proxied_ports() {
                links.push(Proxy::start(port).await);
            }
            let ports: Vec<u16> = links.iter().map(|p| p.port).collect();
            let mut flags: Vec<String> = [
                "--store",
                &topology.url(&ports),
                "--namespace",
                &ns,
                "--admin-listen",
                "127.0.0.1:0",
                "--default-ttl",
                &format!("{}s", TTL.as_secs()),
                "--restart-hold-off",
                &format!("{}s", HOLD_OFF.as_secs()),
                "--clock-drift",
                &CLOCK_DRIFT.to_string(),
                // Above the clients' keepalive (1 s + 1 s), as with the defaults (5 s):
                // a stalled connection is noticed by the client first.
                "--keepalive-interval",
                "3s",
                "--keepalive-timeout",
                "3s",
                "--min-replica-acks",
                &plan.acks.to_string(),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            if i == 2 {
                let dir = instance_dir.to_string_lossy().into_owned();
                flags.extend([
                    "--instance".into(),
                    "nemesis-s2".into(),
                    "--instance-dir".into(),
                    dir,
                ]);
            }
            let mut sidecar = SidecarProc::new(&format!("s{i}"), flags, plan.rates[i], &dir.0);
            assert!(
                tokio::task::block_in_place(|| sidecar.start()),
                "sidecar s{i} started"
            );
            sidecars.push(Mutex::new(sidecar));
            store_links.push(links);
        }
        let mut client_links = Vec::new();
        for s in &sidecars {
            let port = s.lock().expect("sidecar").port;
            client_links.push(Proxy::start(port).await);
        }
        let keys = tokio::task::block_in_place(|| spread_keys(&topology, &ns, plan.topo.keys()));
        let key_shard = keys
            .iter()
            .map(|k| {
                (
                    k.name.clone(),
                    tokio::task::block_in_place(|| topology.shard_of_key(&ns, &k.name)),
                )
            })
            .collect();
        let events: Events = Default::default();
        let mut clients = Vec::new();
        let mut client_sidecar = Vec::new();
        let total = RUST_CLIENTS + PYTHON_CLIENTS + usize::from(plan.wrong_client);
        for c in 0..total {
            let python = (RUST_CLIENTS..RUST_CLIENTS + PYTHON_CLIENTS).contains(&c);
            let wrong = c == RUST_CLIENTS + PYTHON_CLIENTS;
            let sidecar = if wrong { 0 } else { c % SIDECARS };
            let args = WorkerArgs {
                id: String::new(),
                addr: format!("127.0.0.1:{}", client_links[sidecar].port),
                register: register.addr.clone(),
                keys: keys.clone(),
                workers: if wrong { 1 } else { 2 },
                seed: plan.seed.wrapping_add(c as u64 * 104_729),
                ttl: TTL,
                wait: WAIT,
                wrong,
            };
            let name = if wrong {
                "wrong".to_owned()
            } else {
                format!("c{c}")
            };
            let mut client = ClientProc::new(&name, python, args, events.clone(), &dir.0);
            client.start();
            clients.push(Mutex::new(client));
            client_sidecar.push(sidecar);
        }
        Self {
            topology,
            register,
            sidecars,
            client_links,
            store_links,
            clients,
            client_sidecar,
            events,
            keys,
            key_shard,
            records: Mutex::new(Vec::new()),
            deaths: Mutex::new(BTreeMap::new()),
            changes: Mutex::new(Vec::new()),
            dir,
        }
    }

    /// The events gathered so far.
    pub fn events(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Kills client process `c` now and remembers when its incarnation died.
    pub fn kill_client(&self, c: usize) {
        let mut client = self.clients[c].lock().expect("client");
        let id = client.id();
        let at = client.kill();
        self.deaths.lock().expect("deaths").insert(id, at);
    }

    /// Ends every fault still in effect: the topology healed, every sidecar and client
    /// process running and continued, every link passing bytes.
    pub fn heal(&self) {
        self.topology.heal();
        for s in &self.sidecars {
            let mut s = s.lock().expect("sidecar");
            match s.pid() {
                Some(pid) => super::nodes::signal(pid, "CONT"),
                None => assert!(s.start(), "sidecar {} restarted", s.name),
            }
        }
        for c in &self.clients {
            let mut c = c.lock().expect("client");
            match c.pid() {
                Some(pid) => super::nodes::signal(pid, "CONT"),
                None => c.start(),
            }
        }
        for p in self
            .client_links
            .iter()
            .chain(self.store_links.iter().flatten())
        {
            p.heal();
        }
    }

    /// Appends a fault record; returns its index.
    pub fn begin(&self, record: Record) -> usize {
        let mut records = self.records.lock().expect("records");
        records.push(record);
        records.len() - 1
    }

    pub fn end(&self, index: usize, note: Option<String>) {
        let mut records = self.records.lock().expect("records");
        records[index].end = now_ns();
        if let Some(note) = note {
            records[index].note = note;
        }
    }
}

/// On a Cluster, renames keys (a suffix) until the first three live on three different
/// masters, so that every master's faults touch some lock (TESTING.md: freeze any
/// master, not only the one a test happens to know).
fn spread_keys(topology: &Topology, ns: &str, keys: Vec<KeySpec>) -> Vec<KeySpec> {
    if topology.topo != Topo::Cluster {
        return keys;
    }
    keys.into_iter()
        .enumerate()
        .map(|(i, mut k)| {
            let base = k.name.clone();
            for suffix in 0..64 {
                k.name = format!(
                    "{base}{}",
                    if suffix == 0 {
                        String::new()
                    } else {
                        suffix.to_string()
                    }
                );
                if topology.shard_of_key(ns, &k.name) == i % 3 {
                    break;
                }
            }
            k
        })
        .collect()
}
