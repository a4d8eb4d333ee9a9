//! The seeded fault schedule of a round: which fault starts when, for how long, on
//! what. The same seed (and window) gives the same schedule, printed before the round
//! starts; what the processes do in between is up to the machine, so a replay repeats
//! the faults, not every interleaving.
//!
//! Faults overlap, with one rule that keeps every round healable and every failover
//! attributable: a Redis node takes one fault at a time, and on standalone, Sentinel
//! and Cluster one node fault runs at a time (Redlock: per master). A process or a
//! link, likewise, takes one fault at a time.

use std::fmt;
use std::time::Duration;

use super::common::Rng;
use super::nodes::Restore;
use super::plan::{RoundPlan, Topo};

/// A Redis node, named by its role in a shard when the fault starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Node {
    Master(usize),
    Replica(usize),
}

/// What happens to a link's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkFault {
    /// Every connection reset at once.
    Reset,
    /// Bytes not read: they pile up until the fault ends.
    Stall,
    /// Bytes read and thrown away.
    Blackhole,
    /// Bytes delayed by this many ms each way.
    Latency(u64),
}

/// A proxied link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    /// Between the clients of sidecar N and sidecar N.
    Clients(usize),
    /// Between sidecar N and the Redis node of shard M (standalone, Redlock).
    Store(usize, usize),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    Freeze(Node),
    /// SIGKILL, and back after the fault's duration.
    Kill(Node, Restore),
    Snapshot(Node),
    Squeeze(Node),
    /// Replicas of shard N frozen and cut off, grants on the master alone for `ms`,
    /// the master SIGKILLed, the replicas continued: one is promoted without the last
    /// writes. The old master comes back empty at the fault's end.
    Lagging(usize, u64),
    /// `CLUSTER FAILOVER` on shard N's replica.
    Failover(usize),
    SidecarKill(usize),
    SidecarStop(usize),
    ClientKill(usize),
    ClientStop(usize),
    Link(Link, LinkFault),
}

/// One fault of the schedule.
#[derive(Clone, Debug)]
pub struct Fault {
    pub id: usize,
    pub at: Duration,
    pub dur: Duration,
    pub act: Act,
}

/// What the generator may target.
pub struct Targets {
    pub sidecars: usize,
    pub clients: usize,
}

/// A resource a fault occupies for its duration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Res {
    Redis(usize),
    Sidecar(usize),
    Client(usize),
    Link(Link),
}

/// The schedule of `plan`'s round.
pub fn generate(plan: &RoundPlan, targets: &Targets) -> Vec<Fault> {
    let mut rng = Rng::new(plan.seed ^ 0x5EED);
    let ms = |rng: &mut Rng, lo: u64, hi: u64| Duration::from_millis(lo + rng.below(hi - lo + 1));
    let window = plan.window;
    let shards = match plan.topo {
        Topo::Cluster | Topo::Redlock => 3,
        _ => 1,
    };
    let mut faults: Vec<Fault> = Vec::new();
    let mut busy: Vec<(Res, Duration, Duration)> = Vec::new();
    let free = |busy: &[(Res, Duration, Duration)], r: Res, at: Duration, end: Duration| {
        !busy.iter().any(|&(b, s, e)| b == r && s <= end && at <= e)
    };
    let mut t = ms(&mut rng, 500, 1500);
    while t + Duration::from_millis(500) < window {
        for _attempt in 0..6 {
            let (act, dur) = pick(plan.topo, shards, targets, &mut rng);
            let dur = dur.min(window.saturating_sub(t));
            // Cut short by the window's end, the lagging failover would restart the old
            // master right after killing it: no failover, and a topology that takes
            // half a minute to settle.
            if let Act::Lagging(_, cut) = act
                && dur < Duration::from_millis(cut + 2500)
            {
                continue;
            }
            let res = resources(plan.topo, act);
            if !res.iter().all(|r| free(&busy, *r, t, t + dur)) {
                continue;
            }
            // A restart from a snapshot needs one taken shortly before it, while the
            // node was up and free: grants made in between are what it loses.
            if let Act::Kill(node, Restore::Snapshot) = act {
                let r = res[0];
                let last_end = busy
                    .iter()
                    .filter(|b| b.0 == r && b.2 <= t)
                    .map(|b| b.2)
                    .max();
                let lo = last_end.map_or(Duration::ZERO, |e| e + Duration::from_millis(50));
                let lo = lo.max(t.saturating_sub(Duration::from_millis(2500)));
                let hi = t.saturating_sub(Duration::from_millis(150));
                if lo > hi {
                    continue;
                }
                let span = (hi - lo).as_millis() as u64;
                let before = lo + Duration::from_millis(rng.below(span + 1));
                faults.push(Fault {
                    id: 0,
                    at: before,
                    dur: Duration::ZERO,
                    act: Act::Snapshot(node),
                });
            }
            busy.extend(res.iter().map(|r| (*r, t, t + dur)));
            faults.push(Fault {
                id: 0,
                at: t,
                dur,
                act,
            });
            break;
        }
        t += ms(&mut rng, 300, 2000);
    }
    faults.sort_by_key(|f| f.at);
    for (i, f) in faults.iter_mut().enumerate() {
        f.id = i + 1;
    }
    faults
}

/// One random fault for `topo` and how long it lasts.
fn pick(topo: Topo, shards: usize, targets: &Targets, rng: &mut Rng) -> (Act, Duration) {
    let ms = |rng: &mut Rng, lo: u64, hi: u64| Duration::from_millis(lo + rng.below(hi - lo + 1));
    let shard = rng.below(shards as u64) as usize;
    let sidecar = rng.below(targets.sidecars as u64) as usize;
    let client = rng.below(targets.clients as u64) as usize;
    let replicated = matches!(topo, Topo::Sentinel | Topo::Cluster);
    let node = match replicated && rng.below(3) == 0 {
        true => Node::Replica(shard),
        false => Node::Master(shard),
    };
    let link = match topo {
        Topo::Rdb | Topo::Aof | Topo::Redlock if rng.below(2) == 0 => Link::Store(sidecar, shard),
        _ => Link::Clients(sidecar),
    };
    let link_fault = match rng.below(4) {
        0 => LinkFault::Reset,
        1 => LinkFault::Stall,
        2 => LinkFault::Blackhole,
        // Between a client and its sidecar (in one pod) latency stays well under the
        // drift margin `Lost` comes ahead by (5% of the TTL: 200 ms); towards Redis it
        // may reach 0.06 x TTL each way (scenario 6 takes 0.3 x TTL per round trip).
        _ => match link {
            Link::Clients(_) => LinkFault::Latency(5 + rng.below(35)),
            Link::Store(..) => LinkFault::Latency(20 + rng.below(230)),
        },
    };
    // Weights: the store's faults first, then processes and links.
    let choices: &[(u32, u8)] = match topo {
        Topo::Rdb | Topo::Aof | Topo::Redlock => &[
            (2, 0),
            (1, 1),
            (4, 2),
            (1, 3),
            (2, 6),
            (1, 7),
            (1, 8),
            (1, 9),
            (5, 10),
        ],
        Topo::Sentinel | Topo::Cluster => &[
            (4, 0),
            (2, 1),
            (3, 4),
            (1, 3),
            (2, 6),
            (1, 7),
            (1, 8),
            (1, 9),
            (3, 10),
            (1, 5),
        ],
    };
    let total: u32 = choices.iter().map(|c| c.0).sum();
    let mut roll = rng.below(u64::from(total)) as u32;
    let kind = choices
        .iter()
        .find(|c| {
            let hit = roll < c.0;
            roll = roll.saturating_sub(c.0);
            hit
        })
        .map_or(10, |c| c.1);
    match kind {
        // Half of them past 2/3 of the TTL: the frozen node's locks are lost.
        0 => (Act::Freeze(node), ms(rng, 300, 5000)),
        1 => (Act::Kill(node, Restore::Empty), ms(rng, 100, 3000)),
        2 => (
            Act::Kill(Node::Master(shard), Restore::Snapshot),
            ms(rng, 50, 1500),
        ),
        3 => (Act::Squeeze(Node::Master(shard)), ms(rng, 1000, 4000)),
        4 => {
            let cut = 300 + rng.below(1200);
            (Act::Lagging(shard, cut), ms(rng, cut + 3000, cut + 5000))
        }
        5 if topo == Topo::Cluster => (Act::Failover(shard), Duration::ZERO),
        5 => (Act::Freeze(Node::Master(shard)), ms(rng, 1500, 4000)),
        6 => (Act::SidecarKill(sidecar), ms(rng, 50, 3000)),
        7 => (Act::SidecarStop(sidecar), ms(rng, 500, 5000)),
        8 => (Act::ClientKill(client), ms(rng, 200, 2000)),
        9 => (Act::ClientStop(client), ms(rng, 300, 7000)),
        _ => match link_fault {
            LinkFault::Reset => (Act::Link(link, link_fault), Duration::ZERO),
            LinkFault::Latency(_) => (Act::Link(link, link_fault), ms(rng, 1000, 4000)),
            _ => (Act::Link(link, link_fault), ms(rng, 300, 4000)),
        },
    }
}

/// What a fault occupies: one node fault at a time per topology (per master on
/// Redlock), one fault per process and per link.
fn resources(topo: Topo, act: Act) -> Vec<Res> {
    let redis = |shard: usize| match topo {
        Topo::Redlock => Res::Redis(shard),
        _ => Res::Redis(0),
    };
    match act {
        Act::Freeze(Node::Master(s) | Node::Replica(s))
        | Act::Kill(Node::Master(s) | Node::Replica(s), _)
        | Act::Snapshot(Node::Master(s) | Node::Replica(s))
        | Act::Squeeze(Node::Master(s) | Node::Replica(s))
        | Act::Lagging(s, _)
        | Act::Failover(s) => vec![redis(s)],
        Act::SidecarKill(i) | Act::SidecarStop(i) => vec![Res::Sidecar(i)],
        Act::ClientKill(i) | Act::ClientStop(i) => vec![Res::Client(i)],
        Act::Link(link, _) => vec![Res::Link(link)],
    }
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Node::Master(s) => write!(f, "master of shard {s}"),
            Node::Replica(s) => write!(f, "a replica of shard {s}"),
        }
    }
}

impl fmt::Display for Act {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Act::Freeze(n) => write!(f, "SIGSTOP redis {n}"),
            Act::Kill(n, Restore::Empty) => write!(f, "SIGKILL redis {n}, restart empty"),
            Act::Kill(n, Restore::Snapshot) => {
                write!(f, "SIGKILL redis {n}, restart from its snapshot")
            }
            Act::Snapshot(n) => write!(f, "snapshot redis {n}"),
            Act::Squeeze(n) => write!(f, "maxmemory just above use on redis {n}"),
            Act::Lagging(s, cut) => write!(
                f,
                "failover of shard {s} to a replica cut off {cut} ms before its master's SIGKILL"
            ),
            Act::Failover(s) => write!(f, "CLUSTER FAILOVER of shard {s}"),
            Act::SidecarKill(i) => write!(f, "SIGKILL sidecar s{i}, restart"),
            Act::SidecarStop(i) => write!(f, "SIGSTOP sidecar s{i}"),
            Act::ClientKill(i) => write!(f, "SIGKILL client process c{i}, restart"),
            Act::ClientStop(i) => write!(f, "SIGSTOP client process c{i}"),
            Act::Link(link, fault) => {
                let what = match fault {
                    LinkFault::Reset => "reset".to_owned(),
                    LinkFault::Stall => "stall".to_owned(),
                    LinkFault::Blackhole => "blackhole".to_owned(),
                    LinkFault::Latency(ms) => format!("+{ms} ms latency"),
                };
                match link {
                    Link::Clients(i) => write!(f, "{what} clients <-> s{i}"),
                    Link::Store(i, s) => write!(f, "{what} s{i} <-> redis shard {s}"),
                }
            }
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{:<3} +{:>6.2}s ", self.id, self.at.as_secs_f64())?;
        match self.dur.is_zero() {
            true => write!(f, "        {}", self.act),
            false => write!(f, "{:>5.2}s  {}", self.dur.as_secs_f64(), self.act),
        }
    }
}
