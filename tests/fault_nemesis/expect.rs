//! What docs/guarantees.md promises on each topology, as the checker applies it. The
//! checker holds every topology to "no two holders, tokens strictly increase" and
//! excuses exactly what the docs say may happen, naming the passage; nothing else.
//! Written against the docs of 0ca97b3; when the guarantees change (issue 32 closes
//! the async-replication hole for live holders), change [`overlap_allowed`] with them.
//!
//! Excused:
//! - **A paused holder** (a client process SIGSTOPped while it held the lock): "`SIGSTOP`
//!   of a holding client — a resumed holder is Kleppmann's pause: fencing" (the table,
//!   scenario 3). Its overlap and its writes the register still accepted are counted
//!   as documented; the register refuses its writes once a newer token was written.
//! - **A grant lost at an automatic failover**, on Sentinel and Cluster as the docs
//!   allow it: Sentinel without `--min-replica-acks` ("a grant or renewal made just
//!   before the failover can be lost, and the lock handed out again"); Sentinel with
//!   acks when a replica was promoted by an automatic failover ("a failover that promotes
//!   the one replica that did *not* acknowledge ... can still lose a grant": two
//!   replicas here), but not after the lagging-replica failover, where no replica could
//!   acknowledge anything; Cluster without acks at an automatic failover ("an automatic
//!   failover (master unreachable for the node timeout) can lose the last grants like
//!   Sentinel's"), never at `CLUSTER FAILOVER` ("loses nothing"), and never with acks
//!   (one replica per master: the one promoted is the one that acknowledged).
//!
//! Not excused, because the docs promise otherwise: a standalone Redis restarted from
//! a snapshot or an older AOF ("a restart with its data (RDB, AOF) keeps [the marker]"
//! — the docs do not say it may grant twice), an empty restart (the hold-off), a frozen
//! or killed sidecar (the client's keepalive suspends first at this TTL), connection
//! resets and stalls (issue 25), clocks within `--clock-drift`, anything on Redlock
//! (scenario 9), and a Cluster lock lost for a fault on another master ("a frozen or
//! unreachable master touches only the locks whose slots it serves").

use std::collections::BTreeMap;

use super::history::Grant;
use super::plan::{SLACK, TTL, Topo};
use super::schedule::{Act, Link, LinkFault};
use super::world::{MasterChange, Record};

/// Why the docs allow a finding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Allowed {
    PausedHolder,
    FailoverLoss,
}

impl Allowed {
    pub fn why(self) -> &'static str {
        match self {
            Allowed::PausedHolder => {
                "a paused holder (docs/guarantees.md, scenario 3: Kleppmann's pause, fencing)"
            }
            Allowed::FailoverLoss => {
                "a grant lost at an automatic failover (docs/guarantees.md: Sentinel/Cluster, asynchronous replication)"
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

/// How long an old master goes on taking writes after its replica was promoted.
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
        let shard = self.key_shard.get(&a.key).copied().unwrap_or(0);
        // `a` was granted (or renewed) on the old master before the promotion, or on
        // the old master after it (a master cut off from its replicas goes on taking
        // writes until it is demoted: about 10 s, TESTING.md); `b` on the new one.
        let lost_at_failover = self.changes.iter().any(|c| {
            c.shard == shard
                && a.granted <= c.t + ns(ZOMBIE)
                && b.granted + NS >= c.t
                && b.granted <= c.t + ns(ZOMBIE + TTL + SLACK)
                && self.failover_may_lose(c)
        });
        lost_at_failover.then_some(Allowed::FailoverLoss)
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

    /// Whether the master change `c` is a failover the docs say may lose writes.
    fn failover_may_lose(&self, c: &MasterChange) -> bool {
        // The node fault that caused it: on its shard, running or just ended.
        let cause = self.records.iter().find(|r| {
            r.shard == Some(c.shard)
                && r.port.is_some()
                && r.start <= c.t
                && c.t <= r.end + 5 * NS
                && !matches!(r.fault.act, Act::Snapshot(_) | Act::Link(..))
        });
        let act = cause.map(|r| r.fault.act);
        match (self.topo, self.acks, act) {
            (Topo::Cluster, _, Some(Act::Failover(_))) => false,
            (Topo::Sentinel | Topo::Cluster, 0, _) => true,
            (Topo::Sentinel, _, Some(Act::Lagging(..))) => false,
            (Topo::Sentinel, _, _) => true,
            _ => false,
        }
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
