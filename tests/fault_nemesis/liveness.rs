//! The liveness side of the checker: after healing, every key granted again and every
//! client process granted something within hold-off + TTL; no acquire unanswered (or
//! answered late) past its wait + TTL unless its process was paused or killed; and no
//! `Lost` without a fault on the lock's path to explain it.

use super::checker::{Finding, Kind, Phases, ns};
use super::expect::Context;
use super::history::History;
use super::plan::{HOLD_OFF, SLACK, TTL, WAIT};

pub fn lost_without_cause(
    ctx: &Context,
    history: &History,
    phases: &Phases,
    findings: &mut Vec<Finding>,
) {
    for lost in &history.lost {
        let process = lost.process();
        let sidecar = phases.sidecar_of.get(process).copied().unwrap_or(0);
        let shard = ctx.key_shard.get(&lost.key).copied().unwrap_or(0);
        if !ctx.explains_loss(process, sidecar, shard, lost.t) {
            let grant = history.grants.get(&lost.key).and_then(|gs| {
                gs.iter().find(|g| {
                    g.holder == lost.h && g.token == lost.token
                        || g.holder == lost.h && g.granted <= lost.t && g.last_use() >= lost.t
                })
            });
            findings.push(Finding {
                kind: Kind::LostWithoutCause,
                key: lost.key.clone(),
                text: format!("{} heard Lost ({}) with no fault on its path (sidecar s{sidecar}, shard {shard})", lost.h, lost.why),
                grants: grant.cloned().into_iter().collect(),
                span: (lost.t.saturating_sub(ns(TTL)), lost.t),
                allowed: None,
            });
        }
    }
}

pub fn stuck(ctx: &Context, history: &History, phases: &Phases, findings: &mut Vec<Finding>) {
    let bound = phases.heal_done + ns(HOLD_OFF + TTL + SLACK);
    let mut stuck = |key: &str, text: String, span: (u64, u64)| {
        findings.push(Finding {
            kind: Kind::Stuck,
            key: key.to_owned(),
            text,
            grants: vec![],
            span,
            allowed: None,
        });
    };
    for (key, probe) in &phases.probes {
        let first = history
            .grants
            .get(key)
            .into_iter()
            .flatten()
            .map(|g| g.granted)
            .filter(|t| *t >= phases.heal_done)
            .min();
        let first = first.or(*probe);
        if first.is_none_or(|t| t > bound) {
            let after = first.map(|t| format!("{:.2}", (t - phases.heal_done) as f64 / 1e9));
            stuck(
                key,
                format!(
                    "not granted within hold-off + TTL (+{}s) of healing (first after: {after:?} s)",
                    SLACK.as_secs()
                ),
                (phases.heal_done, bound),
            );
        }
    }
    for (process, _) in &phases.alive {
        let granted =
            history.grants.values().flatten().any(|g| {
                g.process() == process && g.granted >= phases.heal_done && g.granted <= bound
            });
        if !granted {
            stuck(
                "",
                format!(
                    "client process {process} was granted nothing within hold-off + TTL of healing"
                ),
                (phases.heal_done, bound),
            );
        }
    }
    let late = ns(WAIT + TTL + SLACK);
    for a in &history.asked {
        let answered = a.answered.unwrap_or(phases.stop);
        let died = phases
            .deaths
            .get(a.process())
            .is_some_and(|d| *d < answered);
        // The time its sidecar was down or frozen, or its link stalled, meanwhile: the
        // answer waits for that and a resume (up to a TTL) on top of the wait.
        let sidecar = phases.sidecar_of.get(a.process()).copied().unwrap_or(0);
        let away = ctx.sidecar_away(sidecar, a.asked, answered);
        if answered.saturating_sub(a.asked) <= late + away
            || died
            || ctx.paused(a.process(), a.asked, answered)
        {
            continue;
        }
        let how = match a.answered {
            Some(t) => format!("answered after {:.1} s", (t - a.asked) as f64 / 1e9),
            None => "never answered".to_owned(),
        };
        stuck(
            &a.key,
            format!(
                "{}'s acquire of {} was {how} (wait {} s)",
                a.holder,
                a.key,
                WAIT.as_secs()
            ),
            (a.asked, answered),
        );
    }
}
