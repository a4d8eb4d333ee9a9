//! Phase 4 (`semaphore`): [`SEM_SESSIONS`] sessions share [`PERMITS`] permits of one
//! key: grants/s, acquire waits, the most permits the bench saw held at once, and what
//! a grant costs Redis.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use tokio::task::JoinSet;
use tokio::time::Instant;

use super::harness::contention::{Seen, per_grant, pool, refresh_note};
use super::harness::context::{Ctx, WAIT, plain_redis};
use super::harness::load::{join_all, sampling};
use super::harness::redis_side::sample;
use super::harness::report::{Report, Stats, us};
use super::harness::rows::{Row, Rule};
use super::harness::session::{Ask, Session, Want};

const PER_S: Row = Row::new("sem_per_s", "semaphore, 4 of 32: grants/s");
const WAIT_P50: Row = Row::new(
    "sem_wait_p50_us",
    "semaphore, 4 of 32: acquire wait p50 (µs)",
);
const WAIT_P99: Row = Row::new(
    "sem_wait_p99_us",
    "semaphore, 4 of 32: acquire wait p99 (µs)",
);
const MAX_HELD: Row = Row::new("sem_max_held", "semaphore, 4 of 32: most held at once")
    .target("≤ 4 permits", Rule::AtMost(4.0));
const COMMANDS: Row = Row::new("sem_commands", "semaphore, 4 of 32: Redis commands/grant");
const SCRIPT_US: Row = Row::new("sem_script_us", "semaphore, 4 of 32: Redis script µs/grant");

/// The lines of the table this phase fills, in order.
pub(super) const ROWS: &[Row] = &[PER_S, WAIT_P50, WAIT_P99, MAX_HELD, COMMANDS, SCRIPT_US];

/// Permits of the semaphore run.
const PERMITS: u32 = 4;
/// Sessions of the semaphore run.
const SEM_SESSIONS: usize = 32;

/// Phase 4: [`SEM_SESSIONS`] sessions share [`PERMITS`] permits of one key for
/// `--seconds`; grants/s, acquire waits, and the most permits the bench saw held at once.
pub(super) async fn run(ctx: &Ctx, report: &mut Report) -> Result<(), String> {
    eprintln!("bench: phase 4: semaphore, {SEM_SESSIONS} sessions on {PERMITS} permits");
    let mut redis = plain_redis(&ctx.redis_url).await?;
    let key = ctx.key("semaphore");
    let sessions = ctx.sessions(SEM_SESSIONS).await?;
    let (held, most) = (Arc::new(AtomicI64::new(0)), Arc::new(AtomicI64::new(0)));
    let before = sample(&mut redis, None).await?;
    let (until, mut set) = (Instant::now() + ctx.seconds, JoinSet::new());
    for session in sessions {
        set.spawn(permits(
            session,
            key.clone(),
            until,
            held.clone(),
            most.clone(),
        ));
    }
    let (seen, sessions) = pool(join_all(set).await?);
    let after = sample(&mut redis, None).await?;
    drop(sessions);

    let stats = Stats::new(seen.samples, ctx.seconds, "semaphore grants")?;
    let cost = per_grant(&before, &after, seen.grants);
    let rate = seen.in_window as f64 / ctx.seconds.as_secs_f64();
    report.put(&PER_S, Some(rate), None);
    report.put(&WAIT_P50, us(stats.p50), None);
    report.put(&WAIT_P99, us(stats.p99), None);
    report.put(&MAX_HELD, Some(most.load(Ordering::SeqCst) as f64), None);
    report.put(&COMMANDS, Some(cost.commands), None);
    report.put(&SCRIPT_US, Some(cost.script_us), None);
    report.notes.push(format!(
        "sem: {} of {} grants in the window came at once, without Waiting (a permit was \
         free when the Acquire arrived)",
        seen.at_once, seen.in_window
    ));
    refresh_note(report, "sem", seen.refreshes, seen.grants, cost.commands);
    Ok(())
}

/// Takes and gives back one permit of `key` until `until`; returns the acquire waits of
/// grants in the window. `held` counts permits from their `Granted` to the send of their
/// `Release`, a span inside the store's, so `most` can only understate the true peak.
async fn permits(
    mut s: Session,
    key: String,
    until: Instant,
    held: Arc<AtomicI64>,
    most: Arc<AtomicI64>,
) -> Result<(Seen, Session), String> {
    let ask = Ask {
        fair: false,
        limit: PERMITS,
    };
    let (refresh, mut seen) = (s.default_ttl / 3, Seen::default());
    while sampling(until, &seen.samples) {
        let asked = Instant::now();
        let id = s.acquire_as(&key, Some(WAIT), ask).await?;
        let queued = s.wait_for(id, Want::Granted).await?;
        let now_held = held.fetch_add(1, Ordering::SeqCst) + 1;
        most.fetch_max(now_held, Ordering::SeqCst);
        let granted_at = Instant::now();
        let in_window = granted_at < until;
        seen.grant(granted_at - asked, queued, refresh, in_window);
        if in_window {
            seen.samples.push(granted_at - asked);
        }
        // Held across one await: with none, no more tasks could count themselves at
        // once than the runtime has worker threads, whatever the sidecar grants.
        tokio::task::yield_now().await;
        held.fetch_sub(1, Ordering::SeqCst);
        let id = s.release(&key).await?;
        s.wait_for(id, Want::Released).await?;
    }
    Ok((seen, s))
}
