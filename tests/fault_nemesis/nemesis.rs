//! Runs a round's schedule against its [`World`]: each fault starts at its time, on
//! its own task, and ends after its duration; what it hit is recorded (which node, in
//! which shard; which process incarnation). A poller notes every change of a shard's
//! master (failovers), which the checker matches with the faults around it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::common::proxy::Fault as ProxyFault;
use super::history::now_ns;
use super::nodes::{Restore, signal};
use super::plan::Topo;
use super::schedule::{Act, Fault, Link, LinkFault, Node};
use super::world::{MasterChange, Record, World};

/// Runs `faults` from `t0` (`CLOCK_MONOTONIC` ns); returns when every one has ended.
pub async fn run(world: Arc<World>, faults: Vec<Fault>, t0: tokio::time::Instant) {
    let tasks: Vec<_> = faults
        .into_iter()
        .map(|fault| {
            let world = world.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until(t0 + fault.at).await;
                execute(world, fault).await;
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a fault's task");
    }
}

/// Until `stop`, asks every reachable node of a Sentinel or Cluster topology for its
/// `ROLE` every 200 ms and records each promotion (a replica that now says master):
/// the moment a failover took effect, as precise as the polling, whatever the
/// sentinels or other nodes say yet.
pub async fn watch_masters(world: Arc<World>, stop: tokio_util::sync::CancellationToken) {
    if !matches!(world.topology.topo, Topo::Sentinel | Topo::Cluster) {
        return;
    }
    let w = world.clone();
    let _ = tokio::task::spawn_blocking(move || {
        let mut links: BTreeMap<u16, std::net::TcpStream> = BTreeMap::new();
        let mut master: BTreeMap<u16, bool> = BTreeMap::new();
        while !stop.is_cancelled() {
            std::thread::sleep(Duration::from_millis(200));
            let (frozen, down) = {
                let d = w.topology.damage.lock().expect("damage");
                (d.frozen.clone(), d.down.clone())
            };
            for port in w.topology.ports() {
                if down.contains(&port) {
                    // Killed: it comes back with a role of its own, which is no
                    // promotion.
                    master.remove(&port);
                    links.remove(&port);
                    continue;
                }
                // Frozen, or slow to answer: its role is as it was.
                let role = match frozen.contains(&port) {
                    true => None,
                    false => role(&mut links, port),
                };
                let Some(now) = role else {
                    links.remove(&port);
                    continue;
                };
                if master.insert(port, now) == Some(false) && now {
                    let shard = w.topology.shard_of_port(port);
                    let from = w.topology.shards[shard]
                        .ports
                        .iter()
                        .copied()
                        .find(|p| *p != port && master.get(p) == Some(&true));
                    w.changes.lock().expect("changes").push(MasterChange {
                        t: now_ns(),
                        shard,
                        from,
                        to: Some(port),
                    });
                }
            }
        }
    })
    .await;
}

/// Whether the node on `port` says it is a master (`ROLE`), on a kept connection.
fn role(links: &mut BTreeMap<u16, std::net::TcpStream>, port: u16) -> Option<bool> {
    use std::io::{Read, Write};
    let link = match links.entry(port) {
        std::collections::btree_map::Entry::Occupied(link) => link.into_mut(),
        std::collections::btree_map::Entry::Vacant(slot) => {
            let to = ([127, 0, 0, 1], port).into();
            let link =
                std::net::TcpStream::connect_timeout(&to, Duration::from_millis(200)).ok()?;
            link.set_read_timeout(Some(Duration::from_millis(300)))
                .ok()?;
            slot.insert(link)
        }
    };
    link.write_all(b"*1\r\n$4\r\nROLE\r\n").ok()?;
    // The reply is an array whose first element names the role; the rest is read
    // and thrown away (one read holds all of it on loopback).
    let mut buf = [0u8; 4096];
    let n = link.read(&mut buf).ok().filter(|n| *n > 0)?;
    let text = String::from_utf8_lossy(&buf[..n]);
    match (
        text.contains("\r\nmaster\r\n"),
        text.contains("\r\nslave\r\n"),
    ) {
        (true, _) => Some(true),
        (_, true) => Some(false),
        _ => None,
    }
}

/// Runs `f` on a blocking thread (redis-cli, process starts).
async fn blocking<T: Send + 'static>(
    world: &Arc<World>,
    f: impl FnOnce(&World) -> T + Send + 'static,
) -> T {
    let world = world.clone();
    tokio::task::spawn_blocking(move || f(&world))
        .await
        .expect("a blocking step")
}

/// The port of `node` now, if the shard has one in that role.
fn resolve(world: &World, node: Node) -> Option<u16> {
    match node {
        Node::Master(s) => world.topology.masters().get(s).copied().flatten(),
        Node::Replica(s) => world.topology.replicas(s).first().copied(),
    }
}

async fn execute(world: Arc<World>, fault: Fault) {
    let dur = fault.dur;
    let mut record = Record {
        fault: fault.clone(),
        start: now_ns(),
        end: 0,
        shard: None,
        port: None,
        sidecar: None,
        process: None,
        note: String::new(),
    };
    let node_of = |n: Node| match n {
        Node::Master(s) | Node::Replica(s) => s,
    };
    match fault.act {
        Act::Freeze(n) | Act::Kill(n, _) | Act::Snapshot(n) | Act::Squeeze(n) => {
            record.shard = Some(node_of(n));
            record.port = blocking(&world, move |w| resolve(w, n)).await;
        }
        Act::Lagging(s, _) | Act::Failover(s) => {
            record.shard = Some(s);
            record.port = blocking(&world, move |w| w.topology.masters()[s]).await;
        }
        Act::SidecarKill(i) | Act::SidecarStop(i) => record.sidecar = Some(i),
        Act::ClientKill(i) | Act::ClientStop(i) => {
            record.process = Some(world.clients[i].lock().expect("client").id());
            record.sidecar = Some(world.client_sidecar[i]);
        }
        Act::Link(Link::Clients(i), _) => record.sidecar = Some(i),
        Act::Link(Link::Store(i, s), _) => {
            record.sidecar = Some(i);
            record.shard = Some(s);
        }
    }
    let needs_node = matches!(
        fault.act,
        Act::Freeze(_)
            | Act::Kill(..)
            | Act::Snapshot(_)
            | Act::Squeeze(_)
            | Act::Lagging(..)
            | Act::Failover(_)
    );
    if needs_node && record.port.is_none() {
        record.note = "skipped: no node in that role now".into();
        record.end = record.start;
        world.begin(record);
        return;
    }
    let port = record.port.unwrap_or(0);
    let index = world.begin(record);
    let note = match fault.act {
        Act::Freeze(_) => {
            blocking(&world, move |w| w.topology.freeze(port)).await;
            tokio::time::sleep(dur).await;
            blocking(&world, move |w| w.topology.thaw(port)).await;
            None
        }
        Act::Kill(_, how) => {
            blocking(&world, move |w| w.topology.kill(port)).await;
            tokio::time::sleep(dur).await;
            blocking(&world, move |w| w.topology.restart(port, how)).await;
            None
        }
        Act::Snapshot(_) => {
            blocking(&world, move |w| w.topology.snapshot(port)).await;
            None
        }
        Act::Squeeze(_) => {
            blocking(&world, move |w| w.topology.squeeze(port, true)).await;
            tokio::time::sleep(dur).await;
            blocking(&world, move |w| w.topology.squeeze(port, false)).await;
            None
        }
        Act::Lagging(s, cut) => Some(lagging(&world, s, port, cut, dur).await),
        Act::Failover(s) => {
            let replica = blocking(&world, move |w| w.topology.replicas(s).first().copied()).await;
            match replica {
                Some(r) => {
                    blocking(&world, move |w| w.topology.cluster_failover(r)).await;
                    Some(format!("replica {r}"))
                }
                None => Some("skipped: no replica".into()),
            }
        }
        Act::SidecarKill(i) => {
            blocking(&world, move |w| {
                w.sidecars[i].lock().expect("sidecar").kill()
            })
            .await;
            tokio::time::sleep(dur).await;
            let up = blocking(&world, move |w| {
                w.sidecars[i].lock().expect("sidecar").start()
            })
            .await;
            (!up).then(|| "did not come back (healing retries)".to_owned())
        }
        Act::SidecarStop(i) => {
            let pid = world.sidecars[i].lock().expect("sidecar").pid();
            pid.iter().for_each(|p| signal(*p, "STOP"));
            tokio::time::sleep(dur).await;
            pid.iter().for_each(|p| signal(*p, "CONT"));
            None
        }
        Act::ClientKill(i) => {
            blocking(&world, move |w| w.kill_client(i)).await;
            tokio::time::sleep(dur).await;
            blocking(&world, move |w| {
                w.clients[i].lock().expect("client").start()
            })
            .await;
            None
        }
        Act::ClientStop(i) => {
            let pid = world.clients[i].lock().expect("client").pid();
            pid.iter().for_each(|p| signal(*p, "STOP"));
            tokio::time::sleep(dur).await;
            pid.iter().for_each(|p| signal(*p, "CONT"));
            None
        }
        Act::Link(link, what) => {
            let proxy = match link {
                Link::Clients(i) => &world.client_links[i],
                Link::Store(i, s) => &world.store_links[i][s],
            };
            match what {
                LinkFault::Reset => proxy.reset(),
                LinkFault::Stall => proxy.both(ProxyFault::Freeze),
                LinkFault::Blackhole => proxy.both(ProxyFault::Blackhole),
                LinkFault::Latency(ms) => {
                    proxy.both(ProxyFault::Latency(Duration::from_millis(ms)))
                }
            }
            if what != LinkFault::Reset {
                tokio::time::sleep(dur).await;
                // A blackholed connection lost bytes mid-stream: it can only end (as a
                // real one would, by its timeouts), before new ones pass again.
                if what == LinkFault::Blackhole {
                    proxy.reset();
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                proxy.heal();
            }
            None
        }
    };
    world.end(index, note);
}

/// The failover to a replica that missed the newest writes (TESTING.md, "A store that
/// comes back with less"): replicas of shard `s` frozen, their connections to the
/// master (`master`) killed, grants on the master alone for `cut` ms, the master
/// SIGKILLed, the replicas continued; the old master comes back empty at `dur`.
async fn lagging(world: &Arc<World>, s: usize, master: u16, cut: u64, dur: Duration) -> String {
    let replicas = blocking(world, move |w| w.topology.replicas(s)).await;
    let frozen = replicas.clone();
    blocking(world, move |w| {
        frozen.iter().for_each(|r| w.topology.freeze(*r));
        w.topology.cut_replicas(master);
    })
    .await;
    tokio::time::sleep(Duration::from_millis(cut)).await;
    let thawed = replicas.clone();
    blocking(world, move |w| {
        w.topology.kill(master);
        thawed.iter().for_each(|r| w.topology.thaw(*r));
    })
    .await;
    tokio::time::sleep(dur.saturating_sub(Duration::from_millis(cut))).await;
    blocking(world, move |w| w.topology.restart(master, Restore::Empty)).await;
    format!("master {master} killed, replicas {replicas:?} cut off")
}
