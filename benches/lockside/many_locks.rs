//! Phase 6: `--locks` locks held and renewed by the sidecar, and what that costs: Redis
//! commands and EVALSHA calls per second, the sidecar's CPU time and memory.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::{Instant, timeout};
use tonic::transport::Channel;

use super::harness::context::{Ctx, err, plain_redis};
use super::harness::load::join_all;
use super::harness::process::{clock_ticks, cpu_ticks, rss_kb};
use super::harness::redis_side::{CommandStats, RedisProcs, info, info_value, percent_of_core};
use super::harness::report::{Report, mb};
use super::harness::servers::Servers;
use super::harness::session::Session;
use lockside::proto::LeaseResponse;
use lockside::proto::lease_response::Event as E;

/// Locks per session (a sidecar allows 1024 by default).
pub(super) const LOCKS_PER_SESSION: u64 = 1000;
/// Renewal rounds the phase samples (its window is this many renewal periods, TTL/3).
pub(super) const HOLD_ROUNDS: u32 = 6;
/// Sessions taking their locks at once: 2,000 acquires in flight keep the store busy
/// without queueing calls past the store timeout (1 s), which fails acquires and the
/// renewals of locks already held: 100,000 at once did on the 2-core machine, and
/// 8,000 did while other builds ran on it.
const SESSIONS_TAKING: usize = 2;
/// Bound on taking every lock: 100,000 take about 10 s on the 2-core machine.
const HOLD_SETUP: Duration = Duration::from_secs(120);
/// The bench's own INFO calls between two `total_commands_processed` readings.
const OWN_INFO_CALLS: u64 = 2;

/// Phase 6: `locks` locks held and renewed by the sidecar.
pub(super) async fn hold_phase(
    ctx: &Ctx,
    locks: u64,
    ttl: Duration,
    pid: Option<u32>,
    report: &mut Report,
) -> Result<(), String> {
    let mut redis = plain_redis(&ctx.redis_url).await?;
    // Earlier phases leave allocator caches behind: show where memory stood before.
    let rss_before = pid.map(rss_kb).transpose()?;
    let keys = (0..locks).map(|i| ctx.key(format!("hold/{i}"))).collect();
    let sessions = take_locks(&ctx.channel, keys, ttl).await?.all()?;
    let held = hold(&mut redis, sessions, pid, ttl).await?;
    report.put("hold_commands_per_s", Some(held.commands_per_s), None);
    report.put("hold_evalsha_per_s", Some(held.evalsha_per_s), None);
    report.put(
        "hold_evalsha_per_s_1k",
        Some(held.evalsha_per_s * 1000.0 / locks as f64),
        None,
    );
    report.put("hold_cpu_percent", held.cpu_percent, None);
    report.put("hold_redis_cpu_percent", held.redis_cpu_percent, None);
    report.put("hold_rss_before_mb", rss_before.map(mb), None);
    report.put("hold_rss_mb", held.rss_kb.map(mb), None);
    if pid.is_none() {
        report
            .notes
            .push("CPU and RSS are n/a with --sidecar: no child pid".into());
    }
    held.note_events(report);
    report.notes.push(format!(
        "{locks} locks held with ttl {ttl:?} (renewed every {:?}); Redis commands/s counts \
         every client of that Redis and the commands run inside scripts",
        ttl / 3
    ));
    Ok(())
}

/// What holding locks cost over [`HOLD_ROUNDS`] renewal periods.
pub(super) struct Held {
    /// Redis commands per second, those inside scripts included.
    pub(super) commands_per_s: f64,
    pub(super) evalsha_per_s: f64,
    /// The sidecar's CPU in % of a core; `None` without a pid.
    pub(super) cpu_percent: Option<f64>,
    /// Redis' CPU in % of a core (every master's, all clients'); `None` when Redis is
    /// not a process of this machine.
    pub(super) redis_cpu_percent: Option<f64>,
    /// The sidecar's RSS at the end.
    pub(super) rss_kb: Option<u64>,
    /// Events (a `Lost`), or stream ends, on sessions that asked for nothing more.
    pub(super) unexpected: u64,
}

impl Held {
    /// A note when a session holding locks heard anything.
    pub(super) fn note_events(&self, report: &mut Report) {
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
pub(super) async fn hold(
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
pub(super) struct Taken {
    pub(super) sessions: Vec<Session>,
    pub(super) failed: u64,
}

impl Taken {
    /// The sessions, if every lock was taken and kept; an error naming how many were
    /// not otherwise (phases whose figures need every lock held).
    pub(super) fn all(self) -> Result<Vec<Session>, String> {
        match self.failed {
            0 => Ok(self.sessions),
            n => Err(format!("{n} locks refused or lost while taking them")),
        }
    }
}

/// Takes every lock of `keys` on `channel` with `ttl`: one session per
/// [`LOCKS_PER_SESSION`] keys, all of a session's requests in flight at once, and
/// [`SESSIONS_TAKING`] sessions taking at a time; within [`HOLD_SETUP`].
pub(super) async fn take_locks(
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

/// One reading of Redis counters and of the sidecar process.
pub(super) struct Sample {
    at: Instant,
    /// The bench's own INFO calls in one reading (two per server).
    own_calls: u64,
    commands: u64,
    evalsha: u64,
    /// Microseconds Redis spent running EVALSHA calls (scripts included).
    evalsha_usec: u64,
    cpu_ticks: Option<u64>,
    rss_kb: Option<u64>,
}

impl Sample {
    /// Commands Redis processed from this reading to `later`, less the bench's own INFO
    /// calls; it counts every client of that Redis.
    pub(super) fn commands_until(&self, later: &Sample) -> u64 {
        later
            .commands
            .saturating_sub(self.commands + self.own_calls)
    }

    /// EVALSHA calls from this reading to `later`.
    pub(super) fn evalsha_until(&self, later: &Sample) -> u64 {
        later.evalsha.saturating_sub(self.evalsha)
    }

    /// Microseconds Redis spent in EVALSHA calls from this reading to `later`.
    pub(super) fn evalsha_usec_until(&self, later: &Sample) -> u64 {
        later.evalsha_usec.saturating_sub(self.evalsha_usec)
    }
}

/// Reads Redis's command counters (summed over the servers) and, given a pid, the
/// sidecar's CPU time and memory.
pub(super) async fn sample(redis: &mut Servers, pid: Option<u32>) -> Result<Sample, String> {
    let at = Instant::now();
    let (mut commands, mut evalsha, mut evalsha_usec) = (0, 0, 0);
    for conn in &mut redis.0 {
        let (stats, commandstats) = (
            info(conn, "stats").await?,
            info(conn, "commandstats").await?,
        );
        commands += info_value(&stats, "total_commands_processed")
            .ok_or("INFO stats has no total_commands_processed")?;
        let scripts = CommandStats::parse(&commandstats).0.get("evalsha").copied();
        let (calls, usec) = scripts.unwrap_or_default();
        evalsha += calls;
        evalsha_usec += usec;
    }
    Ok(Sample {
        at,
        own_calls: OWN_INFO_CALLS * redis.0.len() as u64,
        commands,
        evalsha,
        evalsha_usec,
        cpu_ticks: pid.map(cpu_ticks).transpose()?,
        rss_kb: pid.map(rss_kb).transpose()?,
    })
}
