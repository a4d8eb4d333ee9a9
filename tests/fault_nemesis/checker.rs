//! The checker: per key, over the round's history of use and the register's log.
//!
//! - **Overlaps**: no two holders' uses of an exclusive key at once; on the shared key
//!   no writer beside anyone; on a semaphore no more than `limit`. A use is a segment
//!   (`granted`/`restored` to the first `suspended`, `lost`, `release`, death), and
//!   any register write a holder made outside its segments counts as use too: the
//!   register's log is the ground truth of who touched the resource, whatever a client
//!   says of itself. So "every holder heard Suspended or Lost before anyone else was
//!   granted" is this check.
//! - **Token order**: a grant asked after another arrived carries a larger token.
//! - **The register**: never a write outside its holder's use (a client that ignores
//!   `Lost`); *stale writes accepted*: writes the register took although a newer grant
//!   had already arrived (it had not seen the newer token yet: fencing cannot help);
//!   and the register itself never took a smaller token after a larger one.
//! - **Stuck**: after healing, every key granted again and every client process
//!   granted something within hold-off + TTL; no acquire left unanswered (or answered
//!   late) past its wait + TTL, unless its process was paused or killed.
//! - **Lost without a cause**: a `Lost` that no fault on the lock's path explains.
//!
//! Findings the docs allow carry their [`Allowed`] reason; the rest are violations.

use std::collections::BTreeMap;

use super::expect::{Allowed, Context};
use super::history::{Grant, History};
use super::liveness;
use super::register::Write;
use super::writes;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Overlap,
    OverLimit,
    TokenRegression,
    UseOutside,
    StaleWrite,
    RegisterBroken,
    Stuck,
    LostWithoutCause,
}

/// One thing the checker found.
#[derive(Clone, Debug)]
pub struct Finding {
    pub kind: Kind,
    pub key: String,
    pub text: String,
    /// The grants involved, earliest first.
    pub grants: Vec<Grant>,
    /// The span of time the finding is about (faults around it are printed).
    pub span: (u64, u64),
    pub allowed: Option<Allowed>,
}

/// When the round healed and stopped, and how the final probe went.
pub struct Phases {
    pub heal_done: u64,
    pub stop: u64,
    /// Per key, when the probe after the clients stopped was granted it (`None`:
    /// never).
    pub probes: BTreeMap<String, Option<u64>>,
    /// Client process incarnations running when the round healed, with their sidecar.
    pub alive: Vec<(String, usize)>,
    /// Every incarnation's sidecar.
    pub sidecar_of: BTreeMap<String, usize>,
    pub deaths: BTreeMap<String, u64>,
}

pub const NS: u64 = 1_000_000_000;

pub fn ns(d: std::time::Duration) -> u64 {
    d.as_nanos() as u64
}

pub fn check(ctx: &Context, history: &History, writes: &[Write], phases: &Phases) -> Vec<Finding> {
    let mut findings = Vec::new();
    for (key, grants) in &history.grants {
        overlaps(ctx, key, grants, writes, &mut findings);
        tokens(key, grants, &mut findings);
        writes::check(ctx, key, grants, writes, &mut findings);
    }
    liveness::stuck(ctx, history, phases, &mut findings);
    liveness::lost_without_cause(ctx, history, phases, &mut findings);
    findings
}

/// A use of a key: a segment, or a register write made outside every segment.
struct Use<'a> {
    grant: &'a Grant,
    start: u64,
    end: u64,
    /// A register write outside the grant's segments.
    written: bool,
}

fn overlaps(
    ctx: &Context,
    key: &str,
    grants: &[Grant],
    writes: &[Write],
    findings: &mut Vec<Finding>,
) {
    let mut uses: Vec<Use> = Vec::new();
    for g in grants {
        uses.extend(g.segments.iter().map(|s| Use {
            grant: g,
            start: s.start,
            end: s.end,
            written: false,
        }));
    }
    for w in writes.iter().filter(|w| w.key == key) {
        if let Some(g) = grants
            .iter()
            .find(|g| g.holder == w.holder && g.token == w.token)
            && !g.in_use_at(w.sent)
        {
            uses.push(Use {
                grant: g,
                start: w.sent,
                end: w.sent + 1,
                written: true,
            });
        }
    }
    uses.sort_by_key(|u| u.start);
    let limit = grants
        .iter()
        .find(|g| g.mode == "m")
        .map(|g| g.limit.max(1) as usize);
    let mut reported: std::collections::BTreeSet<(u64, u64, String, String)> = Default::default();
    let mut active: Vec<&Use> = Vec::new();
    for u in &uses {
        active.retain(|a| a.end > u.start);
        let others: Vec<&&Use> = active
            .iter()
            .filter(|a| a.grant.holder != u.grant.holder || a.grant.token != u.grant.token)
            .collect();
        match limit {
            Some(limit) => {
                let mut holders: Vec<&Grant> = others.iter().map(|a| a.grant).collect();
                holders.sort_by_key(|g| (g.granted, g.token));
                holders.dedup_by_key(|g| (g.holder.clone(), g.token));
                if holders.len() >= limit {
                    let a = holders[0];
                    let pair = (
                        a.token,
                        u.grant.token,
                        a.holder.clone(),
                        u.grant.holder.clone(),
                    );
                    if reported.insert(pair) {
                        let allowed = holders.iter().find_map(|h| ctx.overlap_allowed(h, u.grant));
                        let mut all: Vec<Grant> = holders.iter().map(|g| (*g).clone()).collect();
                        all.push(u.grant.clone());
                        findings.push(Finding {
                            kind: Kind::OverLimit,
                            key: key.to_owned(),
                            text: format!(
                                "{} holders of a semaphore of {limit} at once",
                                holders.len() + 1
                            ),
                            span: (a.granted, u.start),
                            grants: all,
                            allowed,
                        });
                    }
                }
            }
            None => {
                for a in others {
                    if !(a.grant.exclusive() || u.grant.exclusive()) {
                        continue; // two readers
                    }
                    let (first, second) = match a.grant.granted <= u.grant.granted {
                        true => (a.grant, u.grant),
                        false => (u.grant, a.grant),
                    };
                    let pair = (
                        first.token,
                        second.token,
                        first.holder.clone(),
                        second.holder.clone(),
                    );
                    if !reported.insert(pair) {
                        continue;
                    }
                    let what = match (first.mode.as_str(), second.mode.as_str()) {
                        ("s", _) | (_, "s") => "a writer beside a reader",
                        _ => "two holders at once",
                    };
                    let how = match a.written || u.written {
                        true => " (a register write made outside its holder's use)",
                        false => "",
                    };
                    findings.push(Finding {
                        kind: Kind::Overlap,
                        key: key.to_owned(),
                        text: format!(
                            "{what}: {} used it while {} held it{how}",
                            second.holder, first.holder
                        ),
                        span: (first.granted, u.start.max(a.start)),
                        grants: vec![first.clone(), second.clone()],
                        allowed: ctx.overlap_allowed(first, second),
                    });
                }
            }
        }
        active.push(u);
    }
}

/// A grant asked after another arrived must carry a larger token.
fn tokens(key: &str, grants: &[Grant], findings: &mut Vec<Finding>) {
    // `grants` is in arrival order: the largest token that had arrived before each.
    let mut best: Vec<(u64, usize)> = Vec::with_capacity(grants.len());
    for (i, g) in grants.iter().enumerate() {
        let prev = best.last().copied();
        best.push(match prev {
            Some((t, j)) if t >= g.token => (t, j),
            _ => (g.token, i),
        });
    }
    for g in grants {
        let before = grants.partition_point(|o| o.granted < g.asked);
        if before == 0 {
            continue;
        }
        let (top, j) = best[before - 1];
        if top >= g.token {
            findings.push(Finding {
                kind: Kind::TokenRegression,
                key: key.to_owned(),
                text: format!(
                    "{} was granted token {} after {} had {top}",
                    g.holder, g.token, grants[j].holder
                ),
                span: (grants[j].granted, g.granted),
                grants: vec![grants[j].clone(), g.clone()],
                allowed: None,
            });
        }
    }
}
