//! Phases 3 and 4: many sessions on one key. Handoff runs `waiters + 1` sessions on
//! one lock, fair or not, and times each grant from the moment the previous holder sent
//! its `Release`; the semaphore run has 32 sessions share 4 permits. Both read Redis's
//! command counters around the run, so the cost of one handoff in Redis commands can be
//! compared between 8 and 64 waiters: waking only the head waiter (fair) or the longest
//! waiting one (unfair) keeps it constant, waking all of them does not.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;

use super::harness::context::{Ctx, WAIT, plain_redis};
use super::harness::load::{join_all, sampling};
use super::harness::report::{Report, Stats, us};
use super::harness::session::{Ask, Session, Want};
use super::many_locks::{Sample, sample};

/// One handoff run: its JSON id prefix, how many sessions wait while one holds, and
/// whether they queue fairly.
#[derive(Clone, Copy, Debug)]
pub(super) struct Handoff {
    pub(super) id: &'static str,
    pub(super) waiters: usize,
    pub(super) fair: bool,
}

/// The handoff runs, in order: 16 sessions as the first bench had, then the issue's
/// 8 and 64 waiters, unfair and fair.
pub(super) const HANDOFFS: [Handoff; 5] = [
    Handoff::new("handoff", 15, false),
    Handoff::new("handoff8", 8, false),
    Handoff::new("handoff64", 64, false),
    Handoff::new("handoff8_fair", 8, true),
    Handoff::new("handoff64_fair", 64, true),
];

/// Permits of the semaphore run.
pub(super) const PERMITS: u32 = 4;
/// Sessions of the semaphore run.
pub(super) const SEM_SESSIONS: usize = 32;

impl Handoff {
    const fn new(id: &'static str, waiters: usize, fair: bool) -> Self {
        Self { id, waiters, fair }
    }
}

/// The last `Release` sent on a key: by which session, and when.
pub(super) type LastRelease = Arc<Mutex<Option<(usize, Instant)>>>;

/// How a contending session paces itself: how long it holds each grant before its
/// `Release`, and how long it rests after it before the next `Acquire`. Zero for both
/// (the handoff phase) hands the lock on as fast as the sidecar can.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Pace {
    pub(super) hold: Duration,
    pub(super) rest: Duration,
}

/// What one session saw in a run.
#[derive(Default)]
pub(super) struct Seen {
    /// Latency of grants in the window: handoffs, or acquire waits on the semaphore.
    pub(super) samples: Vec<Duration>,
    /// Grants in the window.
    pub(super) in_window: u64,
    /// Grants in all, also those that drained the queue after the window.
    pub(super) grants: u64,
    /// Handoff only: grants in the window that went back to the session that had just
    /// released (an unfair re-acquire beat every waiter).
    pub(super) regrants: u64,
    /// Grants in the window that came without a `Waiting` first.
    at_once: u64,
    /// Waiter refresh periods (TTL/3) that the session's waits spanned.
    refreshes: u64,
}

impl Seen {
    /// Counts a grant that took `waited` from the `Acquire`, after a `Waiting` or not.
    fn grant(&mut self, waited: Duration, queued: bool, refresh: Duration, in_window: bool) {
        self.grants += 1;
        self.in_window += u64::from(in_window);
        self.at_once += u64::from(in_window && !queued);
        if !refresh.is_zero() {
            self.refreshes += (waited.as_nanos() / refresh.as_nanos()) as u64;
        }
    }
}

/// The sum of every session's [`Seen`]; the grant latencies pooled.
pub(super) fn pool(all: Vec<(Seen, Session)>) -> (Seen, Vec<Session>) {
    let mut sum = Seen::default();
    let mut sessions = Vec::with_capacity(all.len());
    for (seen, session) in all {
        sum.samples.extend(seen.samples);
        sum.in_window += seen.in_window;
        sum.grants += seen.grants;
        sum.regrants += seen.regrants;
        sum.at_once += seen.at_once;
        sum.refreshes += seen.refreshes;
        sessions.push(session);
    }
    (sum, sessions)
}

/// Redis's work between two readings, per grant.
struct PerGrant {
    /// Commands, those run inside scripts included.
    commands: f64,
    /// EVALSHA calls: round trips.
    evalsha: f64,
    /// Microseconds Redis spent running scripts: grows with the waiters if a script
    /// walks them, even when the command count does not.
    script_us: f64,
}

fn per_grant(before: &Sample, after: &Sample, grants: u64) -> PerGrant {
    let grants = grants.max(1) as f64;
    PerGrant {
        commands: before.commands_until(after) as f64 / grants,
        evalsha: before.evalsha_until(after) as f64 / grants,
        script_us: before.evalsha_usec_until(after) as f64 / grants,
    }
}

/// Phase 3: `run.waiters + 1` sessions take turns on one key for `--seconds`.
pub(super) async fn handoff_phase(
    ctx: &Ctx,
    run: Handoff,
    report: &mut Report,
) -> Result<(), String> {
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

/// A note when waits lasted long enough for waiter registrations to be refreshed
/// (every TTL/3), which adds commands that are not part of a handoff.
fn refresh_note(report: &mut Report, id: &str, refreshes: u64, grants: u64, commands: f64) {
    if refreshes == 0 {
        return;
    }
    let share = refreshes as f64 / grants.max(1) as f64;
    report.notes.push(format!(
        "{id}: waits spanned {refreshes} waiter refresh periods (TTL/3): up to {share:.3} \
         refresh script calls per grant are in its {commands:.2} Redis commands per grant"
    ));
}

/// Acquires and releases until `until`, as session `me`, paced by `pace`; returns what
/// it saw, with the handoff latency of every grant in the window that followed another
/// session's release, and the session, so that it ends after the closing Redis reading.
pub(super) async fn contend(
    mut s: Session,
    me: usize,
    key: String,
    ask: Ask,
    until: Instant,
    last: LastRelease,
    pace: Pace,
) -> Result<(Seen, Session), String> {
    let last = || last.lock().unwrap_or_else(|e| e.into_inner());
    let (refresh, mut seen) = (s.default_ttl / 3, Seen::default());
    while sampling(until, &seen.samples) {
        let asked = Instant::now();
        let id = s.acquire_as(&key, Some(WAIT), ask).await?;
        let queued = s.wait_for(id, Want::Granted).await?;
        let granted_at = Instant::now();
        let in_window = granted_at < until;
        seen.grant(granted_at - asked, queued, refresh, in_window);
        match last().take() {
            Some((from, sent)) if from != me && in_window => seen.samples.push(granted_at - sent),
            Some(_) if in_window => seen.regrants += 1,
            _ => {}
        }
        // The paced work: a holder's critical section, then its time away from the key.
        if !pace.hold.is_zero() {
            tokio::time::sleep(pace.hold).await;
        }
        // Stamped before the send, so the next holder cannot see its grant first.
        *last() = Some((me, Instant::now()));
        let id = s.release(&key).await?;
        s.wait_for(id, Want::Released).await?;
        if !pace.rest.is_zero() {
            tokio::time::sleep(pace.rest).await;
        }
    }
    Ok((seen, s))
}

/// Phase 4: [`SEM_SESSIONS`] sessions share [`PERMITS`] permits of one key for
/// `--seconds`; grants/s, acquire waits, and the most permits the bench saw held at once.
pub(super) async fn semaphore_phase(ctx: &Ctx, report: &mut Report) -> Result<(), String> {
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
    report.put("sem_per_s", Some(rate), None);
    report.put("sem_wait_p50_us", us(stats.p50), None);
    report.put("sem_wait_p99_us", us(stats.p99), None);
    report.put(
        "sem_max_held",
        Some(most.load(Ordering::SeqCst) as f64),
        None,
    );
    report.put("sem_commands", Some(cost.commands), None);
    report.put("sem_script_us", Some(cost.script_us), None);
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
