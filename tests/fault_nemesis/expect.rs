//! What docs/guarantees.md promises on each topology, as the checker applies it. The
//! checker holds every topology to "no two holders, tokens strictly increase" and
//! excuses exactly what the docs say may happen, naming the passage; nothing else.
//!
//! Excused:
//! - **A paused holder** (a client process SIGSTOPped while it held the lock): "`SIGSTOP`
//!   of a holding client — a resumed holder is Kleppmann's pause: fencing" (the table,
//!   scenario 3). Its overlap and its writes the register still accepted are counted
//!   as documented; the register refuses its writes once a newer token was written.
//!
//! Not excused, because the docs promise otherwise ("A store that comes back with
//! less": any discontinuity holds new grants off while live holders write theirs
//! back): a standalone Redis restarted empty, from a snapshot or from an older AOF; a
//! Sentinel or Cluster failover, automatic or not, to a lagging replica or not, with
//! or without `--min-replica-acks`; a frozen or killed sidecar (the client's keepalive
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
}

impl Allowed {
    pub fn why(self) -> &'static str {
        match self {
            Allowed::PausedHolder => {
                "a paused holder (docs/guarantees.md, scenario 3: Kleppmann's pause, fencing)"
            }
        }
    }
}

/// What the expectations need to know about a round.
pub struct Context<'a> {
    pub topo: Topo,
    pub records: &'a [Record],
    pub changes: &'a [MasterChange],
    pub key_shard: &'a BTreeMap<String, usize>,
}

const NS: u64 = 1_000_000_000;

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
        None
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
