//! What docs/guarantees.md promises on each topology, as the checker applies it. The
//! checker holds every topology to "no two holders, tokens strictly increase" and
//! excuses exactly what the docs say may happen, naming the passage; nothing else.
//!
//! Excused:
//! - **A split brain without replica acks** (Sentinel or Cluster, `--min-replica-acks
//!   0`): a master frozen, or killed and restarted with its data, while a replica was
//!   promoted, takes grants when it is back until it is demoted ("a master cut off or
//!   frozen while a replica is promoted ... takes writes until it is demoted", the
//!   Sentinel bullet). The hour-long run met it (seed 854332250, round 32: sidecars sent
//!   to two masters at once for seconds); the register refused the stale writes.
//! - **A paused holder** (a client process SIGSTOPped while it held the lock): "`SIGSTOP`
//!   of a holding client — a resumed holder is Kleppmann's pause: fencing" (the table,
//!   scenario 3). Its overlap and its writes the register still accepted are counted
//!   as documented; the register refuses its writes once a newer token was written.
//!
//! Not excused, because the docs promise otherwise ("A store that comes back with
//! less": any discontinuity holds new grants off while live holders write theirs
//! back): a standalone Redis restarted empty, from a snapshot or from an older AOF; a
//! Sentinel or Cluster failover, automatic or not, to a lagging replica or not, with
//! `--min-replica-acks` (and without it, but for the split brain above); a frozen or killed sidecar (the client's keepalive
//! suspends first at this TTL); connection resets and stalls (issue 25); clocks within
//! `--clock-drift`; anything on Redlock (scenario 9); and a Cluster lock lost for a
//! fault on another master ("a frozen or unreachable master touches only the locks
//! whose slots it serves").
//!
//! (Until issue 32, on 0ca97b3, the docs allowed a grant lost at an automatic failover
//! without replica acks; the checker excused it then.)

use std::collections::BTreeMap;

use super::history::Grant;
use super::plan::{SLACK, TTL, Topo};
use super::schedule::{Act, Link, LinkFault};
use super::world::{MasterChange, Record};

/// Why the docs allow a finding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Allowed {
    PausedHolder,
    SplitBrain,
}

impl Allowed {
    pub fn why(self) -> &'static str {
        match self {
            Allowed::PausedHolder => {
                "a paused holder (docs/guarantees.md, scenario 3: Kleppmann's pause, fencing)"
            }
            Allowed::SplitBrain => {
                "a split brain without --min-replica-acks: an old master back from a freeze or a restart took grants before it was demoted (docs/guarantees.md: Sentinel without replica acks)"
            }
        }
    }
}

/// What the expectations need to know about a round.
pub struct Context<'a> {
    pub topo: Topo,
    pub acks: u32,
    pub records: &'a [Record],
    pub changes: &'a [MasterChange],
    pub key_shard: &'a BTreeMap<String, usize>,
}

const NS: u64 = 1_000_000_000;

/// How long an old master may go on taking writes after a replica was promoted.
const ZOMBIE: std::time::Duration = std::time::Duration::from_secs(10);

fn ns(d: std::time::Duration) -> u64 {
    d.as_nanos() as u64
}

impl Context<'_> {
    /// Whether `b`, granted while `a` was still in use, is a double grant the docs
    /// allow, and which.
    pub fn overlap_allowed(&self, a: &Grant, b: &Grant) -> Option<Allowed> {
        // `a` paused while it held; or `b` paused between its acquire and the arrival of
        // its grant, which was issued before `a`'s (a smaller token) and read late:
        // its session had ended meanwhile (the sidecar's keepalive), letting `a` in.
        if self.paused(a.process(), a.granted, b.granted)
            || (b.token < a.token && self.paused(b.process(), b.asked, b.granted))
        {
            return Some(Allowed::PausedHolder);
        }
        self.split_brain(a, b).then_some(Allowed::SplitBrain)
    }

    /// Whether `a` and `b` overlap around a master change of their shard that left an
    /// old master taking writes (frozen, or killed and restarted with its data) with no
    /// replica acks asked: until the sentinels (or the cluster) demote it, a sidecar
    /// still connected to it, or sent to it by a sentinel that has not caught up, grants
    /// beside the new master. Not a lagging failover (its old master comes back empty:
    /// held off) nor `CLUSTER FAILOVER` (coordinated).
    fn split_brain(&self, a: &Grant, b: &Grant) -> bool {
        if self.acks > 0 || !matches!(self.topo, Topo::Sentinel | Topo::Cluster) {
            return false;
        }
        let shard = self.key_shard.get(&a.key).copied().unwrap_or(0);
        let window = ns(ZOMBIE + TTL + SLACK);
        self.changes.iter().any(|c| {
            c.shard == shard
                && a.granted.max(b.granted) + NS >= c.t
                && a.granted.min(b.granted) <= c.t + window
                && self.zombie_cause(c)
        })
    }

    /// Whether the node fault behind master change `c` can leave the old master taking
    /// writes: a freeze, or a kill with a restart that keeps data.
    fn zombie_cause(&self, c: &MasterChange) -> bool {
        self.records.iter().any(|r| {
            r.shard == Some(c.shard)
                && r.port.is_some()
                && r.start <= c.t + ns(ZOMBIE)
                && c.t <= r.end + ns(ZOMBIE)
                && matches!(r.fault.act, Act::Freeze(_) | Act::Kill(_, _))
        })
    }

    /// Whether client process `process` was SIGSTOPped at some time in `[from, to]`.
    pub fn paused(&self, process: &str, from: u64, to: u64) -> bool {
        self.records.iter().any(|r| {
            matches!(r.fault.act, Act::ClientStop(_))
                && r.process.as_deref() == Some(process)
                && r.start <= to
                && r.end >= from
        })
    }

    /// How long, within `[from, to]`, sidecar `sidecar` was killed or frozen or the
    /// link to its clients stalled or blackholed (ns; overlapping faults add up).
    pub fn sidecar_away(&self, sidecar: usize, from: u64, to: u64) -> u64 {
        self.records
            .iter()
            .filter(|r| r.sidecar == Some(sidecar) && r.start <= to && r.end >= from)
            .filter(|r| match r.fault.act {
                Act::SidecarKill(_) | Act::SidecarStop(_) => true,
                Act::Link(Link::Clients(_), f) => {
                    matches!(f, LinkFault::Stall | LinkFault::Blackhole)
                }
                _ => false,
            })
            .map(|r| r.end.min(to) - r.start.max(from))
            .sum()
    }

    /// Whether some fault on the path of a lock can explain its `Lost` at `t`: its
    /// client process, its sidecar, the links between them and the store, the Redis
    /// nodes of its shard (any master on Redlock), or a change of its shard's master.
    pub fn explains_loss(&self, process: &str, sidecar: usize, shard: usize, t: u64) -> bool {
        let from = t.saturating_sub(ns(TTL + SLACK));
        let near = |r: &Record| r.start <= t && r.end + NS >= from;
        let faulted = self
            .records
            .iter()
            .filter(|r| near(r))
            .any(|r| match r.fault.act {
                Act::ClientStop(_) | Act::ClientKill(_) => r.process.as_deref() == Some(process),
                Act::SidecarKill(i) | Act::SidecarStop(i) => i == sidecar,
                Act::Link(..) => r.sidecar == Some(sidecar),
                Act::Snapshot(_) => false,
                _ => self.topo == Topo::Redlock || r.shard == Some(shard),
            });
        faulted
            || self
                .changes
                .iter()
                .any(|c| c.shard == shard && c.t <= t && c.t >= from)
    }
}
