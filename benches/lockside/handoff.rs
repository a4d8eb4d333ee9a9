//! Phase 3 (`handoff`): many sessions on one key. Each run has `waiters + 1` sessions
//! take turns on one lock, fair or not, and times each grant from the moment the
//! previous holder sent its `Release`. Redis's command counters are read around the
//! run, so the cost of one handoff in Redis commands can be compared between 8 and 64
//! waiters: waking only the head waiter (fair) or the longest waiting one (unfair)
//! keeps it constant, waking all of them does not.

use std::sync::{Arc, Mutex};

use tokio::task::JoinSet;
use tokio::time::Instant;

use super::harness::contention::{LastRelease, Pace, contend, per_grant, pool, refresh_note};
use super::harness::context::{Ctx, plain_redis};
use super::harness::load::join_all;
use super::harness::redis_side::sample;
use super::harness::report::{Report, Stats, us};
use super::harness::rows::{Row, Rule};
use super::harness::session::Ask;

/// One handoff run: its name (in its key and in notes), how many sessions wait while
/// one holds, whether they queue fairly, and its lines.
struct Handoff {
    name: &'static str,
    waiters: usize,
    fair: bool,
    lines: Lines,
}

/// The lines of one handoff run, a measure each.
struct Lines {
    p50: Row,
    p99: Row,
    per_s: Row,
    commands: Row,
    evalsha: Row,
    script_us: Row,
}

/// "N waiters" are N + 1 sessions on one key; "16 on 1 key" is 15 waiters.
const H15: Handoff = Handoff {
    name: "handoff",
    waiters: 15,
    fair: false,
    lines: Lines {
        p50: Row::new("handoff_p50_us", "handoff, 16 on 1 key: p50 (µs)")
            .target("≤ 1 ms", Rule::AtMost(1000.0)),
        p99: Row::new("handoff_p99_us", "handoff, 16 on 1 key: p99 (µs)"),
        per_s: Row::new("handoff_per_s", "handoff, 16 on 1 key: grants/s"),
        commands: Row::new(
            "handoff_commands",
            "handoff, 16 on 1 key: Redis commands/handoff",
        ),
        evalsha: Row::new("handoff_evalsha", "handoff, 16 on 1 key: EVALSHA/handoff"),
        script_us: Row::new(
            "handoff_script_us",
            "handoff, 16 on 1 key: Redis script µs/handoff",
        ),
    },
};

const H8: Handoff = Handoff {
    name: "handoff8",
    waiters: 8,
    fair: false,
    lines: Lines {
        p50: Row::new("handoff8_p50_us", "handoff, 8 waiters: p50 (µs)"),
        p99: Row::new("handoff8_p99_us", "handoff, 8 waiters: p99 (µs)"),
        per_s: Row::new("handoff8_per_s", "handoff, 8 waiters: grants/s"),
        commands: Row::new(
            "handoff8_commands",
            "handoff, 8 waiters: Redis commands/handoff",
        ),
        evalsha: Row::new("handoff8_evalsha", "handoff, 8 waiters: EVALSHA/handoff"),
        script_us: Row::new(
            "handoff8_script_us",
            "handoff, 8 waiters: Redis script µs/handoff",
        ),
    },
};

/// Redis commands per handoff stay constant in the number of waiters: the target
/// leaves room for noise and waiter refreshes.
const H64: Handoff = Handoff {
    name: "handoff64",
    waiters: 64,
    fair: false,
    lines: Lines {
        p50: Row::new("handoff64_p50_us", "handoff, 64 waiters: p50 (µs)")
            .target("≤ 2 ms", Rule::AtMost(2000.0)),
        p99: Row::new("handoff64_p99_us", "handoff, 64 waiters: p99 (µs)"),
        per_s: Row::new("handoff64_per_s", "handoff, 64 waiters: grants/s"),
        commands: Row::new(
            "handoff64_commands",
            "handoff, 64 waiters: Redis commands/handoff",
        )
        .target("≤ 1.5× 8 waiters", Rule::TimesLine(1.5, &H8.lines.commands)),
        evalsha: Row::new("handoff64_evalsha", "handoff, 64 waiters: EVALSHA/handoff"),
        script_us: Row::new(
            "handoff64_script_us",
            "handoff, 64 waiters: Redis script µs/handoff",
        ),
    },
};

const H8_FAIR: Handoff = Handoff {
    name: "handoff8_fair",
    waiters: 8,
    fair: true,
    lines: Lines {
        p50: Row::new("handoff8_fair_p50_us", "handoff, 8 waiters fair: p50 (µs)"),
        p99: Row::new("handoff8_fair_p99_us", "handoff, 8 waiters fair: p99 (µs)"),
        per_s: Row::new("handoff8_fair_per_s", "handoff, 8 waiters fair: grants/s"),
        commands: Row::new(
            "handoff8_fair_commands",
            "handoff, 8 waiters fair: Redis commands/handoff",
        ),
        evalsha: Row::new(
            "handoff8_fair_evalsha",
            "handoff, 8 waiters fair: EVALSHA/handoff",
        ),
        script_us: Row::new(
            "handoff8_fair_script_us",
            "handoff, 8 waiters fair: Redis script µs/handoff",
        ),
    },
};

const H64_FAIR: Handoff = Handoff {
    name: "handoff64_fair",
    waiters: 64,
    fair: true,
    lines: Lines {
        p50: Row::new(
            "handoff64_fair_p50_us",
            "handoff, 64 waiters fair: p50 (µs)",
        )
        .target("≤ 2 ms", Rule::AtMost(2000.0)),
        p99: Row::new(
            "handoff64_fair_p99_us",
            "handoff, 64 waiters fair: p99 (µs)",
        ),
        per_s: Row::new("handoff64_fair_per_s", "handoff, 64 waiters fair: grants/s"),
        commands: Row::new(
            "handoff64_fair_commands",
            "handoff, 64 waiters fair: Redis commands/handoff",
        )
        .target(
            "≤ 1.5× 8 waiters",
            Rule::TimesLine(1.5, &H8_FAIR.lines.commands),
        ),
        evalsha: Row::new(
            "handoff64_fair_evalsha",
            "handoff, 64 waiters fair: EVALSHA/handoff",
        ),
        script_us: Row::new(
            "handoff64_fair_script_us",
            "handoff, 64 waiters fair: Redis script µs/handoff",
        ),
    },
};

/// The handoff runs, in order: 16 sessions as the first bench had, then the issue's
/// 8 and 64 waiters, unfair and fair.
const HANDOFFS: [&Handoff; 5] = [&H15, &H8, &H64, &H8_FAIR, &H64_FAIR];

/// The lines of the table this phase fills, in order: grouped by measure, so that 8
/// and 64 waiters of the same fairness sit on adjacent lines.
#[rustfmt::skip]
pub(super) const ROWS: &[Row] = &[
    H8.lines.p50, H15.lines.p50, H64.lines.p50, H8_FAIR.lines.p50, H64_FAIR.lines.p50,
    H8.lines.p99, H15.lines.p99, H64.lines.p99, H8_FAIR.lines.p99, H64_FAIR.lines.p99,
    H8.lines.per_s, H15.lines.per_s, H64.lines.per_s, H8_FAIR.lines.per_s,
    H64_FAIR.lines.per_s,
    H8.lines.commands, H15.lines.commands, H64.lines.commands, H8_FAIR.lines.commands,
    H64_FAIR.lines.commands,
    H8.lines.evalsha, H15.lines.evalsha, H64.lines.evalsha, H8_FAIR.lines.evalsha,
    H64_FAIR.lines.evalsha,
    H8.lines.script_us, H15.lines.script_us, H64.lines.script_us, H8_FAIR.lines.script_us,
    H64_FAIR.lines.script_us,
];

/// Runs phase 3: every run of [`HANDOFFS`] in turn, the fair ones but on Redlock
/// (which refuses fair queues).
pub(super) async fn run(ctx: &Ctx, redlock: bool, report: &mut Report) -> Result<(), String> {
    for run in HANDOFFS {
        if redlock && run.fair {
            continue;
        }
        let fair = if run.fair { "fair" } else { "unfair" };
        let waiters = run.waiters;
        eprintln!("bench: phase 3: handoff, {waiters} waiters on one key, {fair}");
        handoff(ctx, run, report).await?;
    }
    report.notes.push(
        "handoff and semaphore: N waiters are N + 1 sessions on one key; Redis commands \
         per grant count the commands run inside the Lua scripts, each script call is \
         one EVALSHA round trip"
            .into(),
    );
    Ok(())
}

/// One run: `run.waiters + 1` sessions take turns on one key for `--seconds`.
async fn handoff(ctx: &Ctx, run: &Handoff, report: &mut Report) -> Result<(), String> {
    let mut redis = plain_redis(&ctx.redis_url).await?;
    let key = ctx.key(run.name);
    let sessions = ctx.sessions(run.waiters + 1).await?;
    let last: LastRelease = Arc::new(Mutex::new(None));
    let ask = Ask {
        fair: run.fair,
        limit: 0,
    };
    let before = sample(&mut redis, None).await?;
    let (start, mut set) = (Instant::now(), JoinSet::new());
    for (me, session) in sessions.into_iter().enumerate() {
        let task = contend(
            session,
            me,
            key.clone(),
            ask,
            start + ctx.seconds,
            last.clone(),
            Pace::default(),
        );
        set.spawn(task);
    }
    let (seen, sessions) = pool(join_all(set).await?);
    let after = sample(&mut redis, None).await?;
    drop(sessions);

    let what = format!("handoffs, {} waiters", run.waiters);
    let stats = Stats::new(seen.samples, ctx.seconds, &what)?;
    let cost = per_grant(&before, &after, seen.grants);
    let (id, lines) = (run.name, &run.lines);
    report.put(&lines.p50, us(stats.p50), None);
    report.put(&lines.p99, us(stats.p99), None);
    let rate = seen.in_window as f64 / ctx.seconds.as_secs_f64();
    report.put(&lines.per_s, Some(rate), None);
    report.put(&lines.commands, Some(cost.commands), None);
    report.put(&lines.evalsha, Some(cost.evalsha), None);
    report.put(&lines.script_us, Some(cost.script_us), None);
    if seen.regrants > 0 {
        report.notes.push(format!(
            "{id}: {} of {} grants in the window went back to the session that had just \
             released (not counted as handoffs)",
            seen.regrants, seen.in_window
        ));
    }
    refresh_note(report, id, seen.refreshes, seen.grants, cost.commands);
    Ok(())
}

#[cfg(test)]
mod tests {
    // Run by tests/bench_units.rs; the bench target itself has no harness, so there
    // the tests below are compiled out and this import goes unused.
    #[allow(unused_imports)]
    use super::*;

    #[test]
    fn commands_per_handoff_are_judged_against_8_waiters() {
        let mut report = Report::new(ROWS.iter().copied());
        report.put(&H8.lines.commands, Some(40.0), None);
        report.put(&H64.lines.commands, Some(59.0), None);
        report.put(&H8_FAIR.lines.commands, Some(40.0), None);
        report.put(&H64_FAIR.lines.commands, Some(61.0), None);
        let met = |row| report.target(row).and_then(|(_, met)| met);
        assert_eq!(met(&H64.lines.commands), Some(true));
        assert_eq!(met(&H64_FAIR.lines.commands), Some(false));
        assert_eq!(met(&H64.lines.p50), None, "nothing measured");
        assert!(report.failed.is_empty());
    }
}
