//! The register's side of the checker: no write outside its holder's use of the lock
//! (a client that ignores `Suspended` or `Lost`), no *stale write accepted* (a write
//! the register took although a grant with a larger token had already arrived: it had
//! not seen the newer token yet, so fencing could not help), and the register itself
//! never took a smaller token after a larger one.

use std::collections::BTreeMap;

use super::checker::{Finding, Kind, NS};
use super::expect::{Allowed, Context};
use super::history::Grant;
use super::register::Write;

pub fn check(
    ctx: &Context,
    key: &str,
    grants: &[Grant],
    writes: &[Write],
    findings: &mut Vec<Finding>,
) {
    let mut highest = 0;
    let mut newest: Vec<(u64, usize)> = Vec::new();
    for (i, g) in grants.iter().enumerate() {
        let prev = newest.last().copied();
        newest.push(match prev {
            Some((t, j)) if t >= g.token => (t, j),
            _ => (g.token, i),
        });
    }
    // Accepted writes older than a grant that had arrived, per (writer, its token, the
    // newer grant): (first, count).
    let mut stale: BTreeMap<(&str, u64, usize), (u64, usize)> = BTreeMap::new();
    // Writes outside their holder's use, per grant: (first, last, count, all paused).
    let mut outside: BTreeMap<(&str, u64), (u64, u64, usize, bool)> = BTreeMap::new();
    for w in writes.iter().filter(|w| w.key == key) {
        let own = grants
            .iter()
            .find(|g| g.holder == w.holder && g.token == w.token);
        if let Some(g) = own
            && !g.in_use_at(w.sent)
        {
            // A write between a pause's check of the lock and its stamp is the pause's.
            let paused = ctx.paused(g.process(), w.sent.saturating_sub(NS), w.sent);
            let e = outside
                .entry((&g.holder, g.token))
                .or_insert((w.sent, w.sent, 0, true));
            *e = (e.0.min(w.sent), e.1.max(w.sent), e.2 + 1, e.3 && paused);
        }
        if !w.fenced || !w.accepted {
            continue;
        }
        if w.token < highest {
            findings.push(Finding {
                kind: Kind::RegisterBroken,
                key: key.to_owned(),
                text: format!("the register accepted token {} after {highest}", w.token),
                span: (w.received, w.received),
                grants: vec![],
                allowed: None,
            });
        }
        highest = highest.max(w.token);
        let before = grants.partition_point(|g| g.granted < w.sent);
        if before > 0 && newest[before - 1].0 > w.token {
            let e = stale
                .entry((&w.holder, w.token, newest[before - 1].1))
                .or_insert((w.sent, 0));
            e.1 += 1;
        }
    }
    for ((holder, token, newer), (first, count)) in stale {
        let own = grants
            .iter()
            .find(|g| g.holder == holder && g.token == token);
        let newer = &grants[newer];
        findings.push(Finding {
            kind: Kind::StaleWrite,
            key: key.to_owned(),
            text: format!(
                "the register accepted {count} write(s) of {holder} with token {token}, from {:.3} s after {} was granted token {}",
                (first - newer.granted) as f64 / 1e9,
                newer.holder,
                newer.token
            ),
            span: (newer.granted, first),
            grants: own.into_iter().cloned().chain([newer.clone()]).collect(),
            // A writer paused since it asked (its grant read late) or while it held is
            // Kleppmann's pause; else the write is as allowed as the overlap it is.
            allowed: own.and_then(|a| match ctx.paused(a.process(), a.asked, first) {
                true => Some(Allowed::PausedHolder),
                false => ctx.overlap_allowed(a, newer),
            }),
        });
    }
    for ((holder, token), (first, last, count, paused)) in outside {
        let Some(g) = grants
            .iter()
            .find(|g| g.holder == holder && g.token == token)
        else {
            continue;
        };
        findings.push(Finding {
            kind: Kind::UseOutside,
            key: key.to_owned(),
            text: format!(
                "{holder} wrote {count} time(s) with token {token} outside its use of the lock, {:.3}..{:.3} s after its grant ({:?})",
                (first - g.granted) as f64 / 1e9,
                (last - g.granted) as f64 / 1e9,
                g.segments.last().map(|s| &s.cut)
            ),
            span: (g.granted, last),
            grants: vec![g.clone()],
            allowed: paused.then_some(Allowed::PausedHolder),
        });
    }
}
