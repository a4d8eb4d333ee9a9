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
use super::harness::session::Ask;

/// One handoff run: its JSON id prefix, how many sessions wait while one holds, and
/// whether they queue fairly.
#[derive(Clone, Copy, Debug)]
struct Handoff {
    id: &'static str,
    waiters: usize,
    fair: bool,
}

/// The handoff runs, in order: 16 sessions as the first bench had, then the issue's
/// 8 and 64 waiters, unfair and fair.
const HANDOFFS: [Handoff; 5] = [
    Handoff::new("handoff", 15, false),
    Handoff::new("handoff8", 8, false),
    Handoff::new("handoff64", 64, false),
    Handoff::new("handoff8_fair", 8, true),
    Handoff::new("handoff64_fair", 64, true),
];

impl Handoff {
    const fn new(id: &'static str, waiters: usize, fair: bool) -> Self {
        Self { id, waiters, fair }
    }
}

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
async fn handoff(ctx: &Ctx, run: Handoff, report: &mut Report) -> Result<(), String> {
    let mut redis = plain_redis(&ctx.redis_url).await?;
    let key = ctx.key(run.id);
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
    let id = run.id;
    report.put(format!("{id}_p50_us"), us(stats.p50), None);
    report.put(format!("{id}_p99_us"), us(stats.p99), None);
    let rate = seen.in_window as f64 / ctx.seconds.as_secs_f64();
    report.put(format!("{id}_per_s"), Some(rate), None);
    report.put(format!("{id}_commands"), Some(cost.commands), None);
    report.put(format!("{id}_evalsha"), Some(cost.evalsha), None);
    report.put(format!("{id}_script_us"), Some(cost.script_us), None);
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
