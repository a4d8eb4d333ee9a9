//! Sessions taking turns on one key: the loop each contending session runs (handoff,
//! idle and fleet phases), what it saw, and what a grant cost Redis between two
//! readings of its counters.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::context::WAIT;
use super::load::sampling;
use super::redis_side::Sample;
use super::report::Report;
use super::session::{Ask, Session, Want};

/// The last `Release` sent on a key: by which session, and when.
pub(crate) type LastRelease = Arc<Mutex<Option<(usize, Instant)>>>;

/// How a contending session paces itself: how long it holds each grant before its
/// `Release`, and how long it rests after it before the next `Acquire`. Zero for both
/// (the handoff phase) hands the lock on as fast as the sidecar can.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Pace {
    pub(crate) hold: Duration,
    pub(crate) rest: Duration,
}

/// What one session saw in a run.
#[derive(Default)]
pub(crate) struct Seen {
    /// Latency of grants in the window: handoffs, or acquire waits on the semaphore.
    pub(crate) samples: Vec<Duration>,
    /// Grants in the window.
    pub(crate) in_window: u64,
    /// Grants in all, also those that drained the queue after the window.
    pub(crate) grants: u64,
    /// Handoff only: grants in the window that went back to the session that had just
    /// released (an unfair re-acquire beat every waiter).
    pub(crate) regrants: u64,
    /// Grants in the window that came without a `Waiting` first.
    pub(crate) at_once: u64,
    /// Waiter refresh periods (TTL/3) that the session's waits spanned.
    pub(crate) refreshes: u64,
}

impl Seen {
    /// Counts a grant that took `waited` from the `Acquire`, after a `Waiting` or not.
    pub(crate) fn grant(
        &mut self,
        waited: Duration,
        queued: bool,
        refresh: Duration,
        in_window: bool,
    ) {
        self.grants += 1;
        self.in_window += u64::from(in_window);
        self.at_once += u64::from(in_window && !queued);
        if !refresh.is_zero() {
            self.refreshes += (waited.as_nanos() / refresh.as_nanos()) as u64;
        }
    }
}

/// The sum of every session's [`Seen`]; the grant latencies pooled.
pub(crate) fn pool(all: Vec<(Seen, Session)>) -> (Seen, Vec<Session>) {
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
pub(crate) struct PerGrant {
    /// Commands, those run inside scripts included.
    pub(crate) commands: f64,
    /// EVALSHA calls: round trips.
    pub(crate) evalsha: f64,
    /// Microseconds Redis spent running scripts: grows with the waiters if a script
    /// walks them, even when the command count does not.
    pub(crate) script_us: f64,
}

pub(crate) fn per_grant(before: &Sample, after: &Sample, grants: u64) -> PerGrant {
    let grants = grants.max(1) as f64;
    PerGrant {
        commands: before.commands_until(after) as f64 / grants,
        evalsha: before.evalsha_until(after) as f64 / grants,
        script_us: before.evalsha_usec_until(after) as f64 / grants,
    }
}

/// A note when waits lasted long enough for waiter registrations to be refreshed
/// (every TTL/3), which adds commands that are not part of a handoff.
pub(crate) fn refresh_note(
    report: &mut Report,
    id: &str,
    refreshes: u64,
    grants: u64,
    commands: f64,
) {
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
pub(crate) async fn contend(
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
