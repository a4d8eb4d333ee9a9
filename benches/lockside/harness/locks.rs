//! Many locks taken through a sidecar and held while measuring (hold, scale, cost and
//! fleet phases): taking them a session of a thousand at a time, and what holding them
//! costs Redis and the sidecar over a few renewal periods.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::timeout;
use tonic::transport::Channel;

use super::context::err;
use super::load::join_all;
use super::process::clock_ticks;
use super::redis_side::{RedisProcs, percent_of_core, sample};
use super::report::Report;
use super::servers::Servers;
use super::session::Session;
use lockside::proto::LeaseResponse;
use lockside::proto::lease_response::Event as E;

/// Locks per session (a sidecar allows 1024 by default).
pub(crate) const LOCKS_PER_SESSION: u64 = 1000;
/// Renewal rounds the phase samples (its window is this many renewal periods, TTL/3).
pub(crate) const HOLD_ROUNDS: u32 = 6;
/// Sessions taking their locks at once: 2,000 acquires in flight keep the store busy
/// without queueing calls past the store timeout (1 s), which fails acquires and the
/// renewals of locks already held: 100,000 at once did on the 2-core machine, and
/// 8,000 did while other builds ran on it.
const SESSIONS_TAKING: usize = 2;
/// Bound on taking every lock: 100,000 take about 10 s on the 2-core machine.
const HOLD_SETUP: Duration = Duration::from_secs(120);

/// What holding locks cost over [`HOLD_ROUNDS`] renewal periods.
pub(crate) struct Held {
    /// Redis commands per second, those inside scripts included.
    pub(crate) commands_per_s: f64,
    pub(crate) evalsha_per_s: f64,
    /// The sidecar's CPU in % of a core; `None` without a pid.
    pub(crate) cpu_percent: Option<f64>,
    /// Redis' CPU in % of a core (every master's, all clients'); `None` when Redis is
    /// not a process of this machine.
    pub(crate) redis_cpu_percent: Option<f64>,
    /// The sidecar's RSS at the end.
    pub(crate) rss_kb: Option<u64>,
    /// Events (a `Lost`), or stream ends, on sessions that asked for nothing more.
    pub(crate) unexpected: u64,
}

impl Held {
    /// A note when a session holding locks heard anything.
    pub(crate) fn note_events(&self, report: &mut Report) {
        if self.unexpected > 0 {
            report.notes.push(format!(
                "{} events or stream ends while holding locks",
                self.unexpected
            ));
        }
    }
}

/// Keeps `sessions` open (their locks renewed by the sidecar `pid`) for
/// [`HOLD_ROUNDS`] renewal periods of `ttl` and measures that window; then ends them.
pub(crate) async fn hold(
    redis: &mut Servers,
    sessions: Vec<Session>,
    pid: Option<u32>,
    ttl: Duration,
) -> Result<Held, String> {
    let events = Arc::new(AtomicU64::new(0));
    let held: Vec<_> = sessions
        .into_iter()
        .map(|s| (s.tx, tokio::spawn(count_events(s.rx, events.clone()))))
        .collect();
    let ticks_per_s = clock_ticks().await;
    let procs = RedisProcs::find(redis).await?;
    let redis_before = procs.cpu_ns()?;
    let before = sample(redis, pid).await?;
    // The measurement window itself, not a wait for an event.
    tokio::time::sleep(ttl / 3 * HOLD_ROUNDS).await;
    let after = sample(redis, pid).await?;
    let redis_after = procs.cpu_ns()?;
    for (tx, reader) in held {
        reader.abort();
        drop(tx);
    }
    let secs = (after.at - before.at).as_secs_f64();
    let cpu = match (before.cpu_ticks, after.cpu_ticks) {
        (Some(b), Some(a)) => Some(a.saturating_sub(b) as f64 / ticks_per_s / secs * 100.0),
        _ => None,
    };
    Ok(Held {
        commands_per_s: before.commands_until(&after) as f64 / secs,
        evalsha_per_s: before.evalsha_until(&after) as f64 / secs,
        cpu_percent: cpu,
        redis_cpu_percent: percent_of_core(redis_before, redis_after, secs),
        rss_kb: after.rss_kb,
        unexpected: events.load(Ordering::Relaxed),
    })
}

/// What [`take_locks`] got: the sessions holding the locks, and how many acquires were
/// refused or locks lost while the rest were being taken.
pub(crate) struct Taken {
    pub(crate) sessions: Vec<Session>,
    pub(crate) failed: u64,
}

impl Taken {
    /// The sessions, if every lock was taken and kept; an error naming how many were
    /// not otherwise (phases whose figures need every lock held).
    pub(crate) fn all(self) -> Result<Vec<Session>, String> {
        match self.failed {
            0 => Ok(self.sessions),
            n => Err(format!("{n} locks refused or lost while taking them")),
        }
    }
}

/// Takes every lock of `keys` on `channel` with `ttl`: one session per
/// [`LOCKS_PER_SESSION`] keys, all of a session's requests in flight at once, and
/// [`SESSIONS_TAKING`] sessions taking at a time; within [`HOLD_SETUP`].
pub(crate) async fn take_locks(
    channel: &Channel,
    keys: Vec<String>,
    ttl: Duration,
) -> Result<Taken, String> {
    let (locks, mut set) = (keys.len(), JoinSet::new());
    let taking = Arc::new(Semaphore::new(SESSIONS_TAKING));
    for chunk in keys.chunks(LOCKS_PER_SESSION as usize) {
        let session = Session::open(channel.clone()).await?;
        let (keys, taking) = (chunk.to_vec(), taking.clone());
        set.spawn(async move {
            let _turn = taking.acquire().await.map_err(err("taking locks"))?;
            take_all(session, keys, ttl).await
        });
    }
    let taken = timeout(HOLD_SETUP, join_all(set)).await;
    let taken = taken.map_err(err(format!("taking {locks} locks")))??;
    let failed = taken.iter().map(|(_, failed)| failed).sum();
    let sessions = taken.into_iter().map(|(session, _)| session).collect();
    Ok(Taken { sessions, failed })
}

/// Acquires every key on `s`, all requests in flight at once, and returns the session
/// with the number of acquires refused and locks lost meanwhile.
async fn take_all(
    mut s: Session,
    keys: Vec<String>,
    ttl: Duration,
) -> Result<(Session, u64), String> {
    for key in &keys {
        s.acquire(key, None, Some(ttl)).await?;
    }
    let (mut answered, mut failed) = (0, 0);
    while answered < keys.len() {
        match s.event().await? {
            E::Granted(_) => answered += 1,
            E::Rejected(_) => (answered, failed) = (answered + 1, failed + 1),
            // About locks granted earlier, not answers: a renewal late (counted if it
            // ends in a loss), a lock lost.
            E::Jeopardy(_) => {}
            E::Lost(_) => failed += 1,
            other => return Err(format!("taking {} locks: got {other:?}", keys.len())),
        }
    }
    Ok((s, failed))
}

/// Counts what arrives on a session that asks for nothing: every event is unexpected.
async fn count_events(mut rx: tonic::Streaming<LeaseResponse>, events: Arc<AtomicU64>) {
    loop {
        let next = rx.message().await;
        events.fetch_add(1, Ordering::Relaxed);
        if !matches!(next, Ok(Some(_))) {
            return;
        }
    }
}
