//! Phase 10 (`scale`): one sidecar holding many locks (100,000 by default: issue 13's
//! goal is ≤ 3 % of a core and ≤ 100 MB RSS), then one serving many sessions with one
//! lock each (10,000 by default, the sidecar's default `--max-sessions`). Each runs on
//! a sidecar spawned for it, so that its RSS is its own; the window is phase 6's, six
//! renewal periods of `--hold-ttl`.

use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::{Instant, timeout};
use tonic::transport::Channel;

use super::harness::args::BenchArgs;
use super::harness::classic::classic_hold;
use super::harness::context::{err, plain_redis, sub_namespace};
use super::harness::load::join_all;
use super::harness::locks::{HOLD_ROUNDS, LOCKS_PER_SESSION, hold, take_locks};
use super::harness::process::{Sidecar, Spawn, connect, rss_kb};
use super::harness::report::{Report, mb};
use super::harness::rows::{Row, Rule};
use super::harness::session::{Session, Want};

const LOCKS_TAKE: Row = Row::new("scale_locks_take_s", "many locks: seconds to take them all");
const LOCKS_FAILED: Row = Row::new(
    "scale_locks_failed",
    "many locks: refused or Lost while taking",
)
.target("0", Rule::Zero);
const LOCKS_CPU: Row = Row::new(
    "scale_locks_cpu_percent",
    "many locks held: sidecar CPU (% core)",
)
.target("≤ 3% of a core", Rule::AtMost(3.0));
const LOCKS_RSS: Row = Row::new("scale_locks_rss_mb", "many locks held: sidecar RSS (MB)")
    .target("≤ 100 MB", Rule::AtMost(100.0));
const LOCKS_EVALSHA: Row = Row::new("scale_locks_evalsha_per_s", "many locks held: EVALSHA/s");
const LOCKS_REDIS_CPU: Row = Row::new(
    "scale_locks_redis_cpu_percent",
    "many locks held: Redis CPU (% core)",
);
const LOCKS_EVENTS: Row = Row::new(
    "scale_locks_events",
    "many locks held: Lost (or other events)",
)
.target("0", Rule::Zero);
const SESSIONS_OPEN: Row = Row::new(
    "scale_sessions_open_s",
    "many sessions: seconds to open and lock",
);
const SESSIONS_CPU: Row = Row::new(
    "scale_sessions_cpu_percent",
    "many sessions, 1 lock each: CPU (% core)",
);
const SESSIONS_RSS: Row = Row::new(
    "scale_sessions_rss_mb",
    "many sessions, 1 lock each: RSS (MB)",
);
const SESSIONS_EVENTS: Row = Row::new(
    "scale_sessions_events",
    "many sessions: Lost (or other events)",
)
.target("0", Rule::Zero);

/// The lines of the table this phase fills, in order; Redis CPU's baseline is the
/// classic recipe's, renewed the way Redisson's watchdog does it.
pub(super) const ROWS: &[Row] = &[
    LOCKS_TAKE,
    LOCKS_FAILED,
    LOCKS_CPU,
    LOCKS_RSS,
    LOCKS_EVALSHA,
    LOCKS_REDIS_CPU,
    LOCKS_EVENTS,
    SESSIONS_OPEN,
    SESSIONS_CPU,
    SESSIONS_RSS,
    SESSIONS_EVENTS,
];

/// Sessions per HTTP/2 connection: below the sidecar's 1,024 concurrent streams.
const SESSIONS_PER_CONNECTION: u64 = 1000;
/// Bound on opening every session and taking its lock.
const OPEN_SETUP: Duration = Duration::from_secs(120);

/// Flags of the scale phase.
#[derive(Clone, Copy, Debug)]
pub(super) struct ScaleArgs {
    /// Locks held by one sidecar.
    pub(super) locks: u64,
    /// Sessions, one lock each, on another.
    pub(super) sessions: u64,
}

/// Runs phase 10 and records its lines.
pub(super) async fn run(
    args: &BenchArgs,
    scale: ScaleArgs,
    tag: &str,
    report: &mut Report,
) -> Result<(), String> {
    let mut redis = plain_redis(&args.redis).await?;
    let ttl = args.hold_ttl;

    eprintln!(
        "bench: phase 10: scale, {} locks on one sidecar",
        scale.locks
    );
    let ns = sub_namespace(tag, "scale");
    let (sidecar, channel) = Sidecar::spawn_with(&Spawn::new(args, ns.clone())).await?;
    let pid = sidecar.pid();
    let result = async {
        let keys = (0..scale.locks).map(|i| format!("{ns}/lock/{i}")).collect();
        let start = Instant::now();
        // Refusals and losses are figures here: how far the sidecar gets is the point.
        let taken = take_locks(&channel, keys, ttl).await?;
        let took = start.elapsed();
        let held = hold(&mut redis, taken.sessions, pid, ttl).await?;
        Ok::<_, String>((took, taken.failed, held))
    }
    .await;
    report.notes.extend(sidecar.stop().await);
    let (took, failed, held) = result?;
    report.put(&LOCKS_TAKE, Some(took.as_secs_f64()), None);
    report.put(&LOCKS_FAILED, Some(failed as f64), None);
    report.put(&LOCKS_CPU, held.cpu_percent, None);
    report.put(&LOCKS_RSS, held.rss_kb.map(mb), None);
    report.put(&LOCKS_EVALSHA, Some(held.evalsha_per_s), None);
    // The baseline: as many locks held by the classic recipe, renewed one call each.
    let watchdog =
        classic_hold(&args.redis, &mut redis, &ns, scale.locks, ttl, HOLD_ROUNDS).await?;
    report.put(&LOCKS_REDIS_CPU, held.redis_cpu_percent, watchdog);
    report.put(&LOCKS_EVENTS, Some(held.unexpected as f64), None);

    eprintln!(
        "bench: phase 10: scale, {} sessions with one lock each",
        scale.sessions
    );
    let mut spawn = Spawn::new(args, ns.clone());
    // Room for every session: the default (10,000) is the figure the issue asks for.
    let max = scale.sessions.max(10_000) + 16;
    spawn.extra = vec!["--max-sessions".into(), max.to_string()];
    let (sidecar, _) = Sidecar::spawn_with(&spawn).await?;
    let pid = sidecar.pid();
    let result = async {
        let rss_idle = pid.map(rss_kb).transpose()?;
        let start = Instant::now();
        let sessions = open_with_locks(&sidecar.addr, &ns, scale.sessions, ttl).await?;
        let took = start.elapsed();
        let held = hold(&mut redis, sessions, pid, ttl).await?;
        Ok::<_, String>((took, held, rss_idle))
    }
    .await;
    report.notes.extend(sidecar.stop().await);
    let (took, held, rss_idle) = result?;
    report.put(&SESSIONS_OPEN, Some(took.as_secs_f64()), None);
    report.put(&SESSIONS_CPU, held.cpu_percent, None);
    report.put(&SESSIONS_RSS, held.rss_kb.map(mb), None);
    report.put(&SESSIONS_EVENTS, Some(held.unexpected as f64), None);
    report.notes.push(format!(
        "scale: {} locks in sessions of {LOCKS_PER_SESSION} on one sidecar, then {} \
         sessions with one lock each on another (its RSS with no session: {} MB); TTL \
         {ttl:?}, CPU and RSS over six renewal periods; Redis CPU's baseline: as many \
         keys SET PX and renewed the classic way (Redisson's watchdog: one \
         compare-and-PEXPIRE script call per lock every TTL/3, pipelined), same window",
        scale.locks,
        scale.sessions,
        rss_idle.map_or("n/a".into(), |kb| format!("{:.1}", mb(kb))),
    ));
    Ok(())
}

/// Opens `n` sessions to the sidecar at `addr`, [`SESSIONS_PER_CONNECTION`] per
/// connection, each holding one lock of its own.
async fn open_with_locks(
    addr: &str,
    ns: &str,
    n: u64,
    ttl: Duration,
) -> Result<Vec<Session>, String> {
    let mut set = JoinSet::new();
    for first in (0..n).step_by(SESSIONS_PER_CONNECTION as usize) {
        let last = (first + SESSIONS_PER_CONNECTION).min(n);
        let keys: Vec<String> = (first..last).map(|i| format!("{ns}/session/{i}")).collect();
        set.spawn(sessions_on(connect(addr).await?, keys, ttl));
    }
    let opened = timeout(OPEN_SETUP, join_all(set)).await;
    let opened = opened.map_err(err(format!("opening {n} sessions")))??;
    Ok(opened.into_iter().flatten().collect())
}

/// One session per key on `channel`, each holding its key.
async fn sessions_on(
    channel: Channel,
    keys: Vec<String>,
    ttl: Duration,
) -> Result<Vec<Session>, String> {
    let mut sessions = Vec::with_capacity(keys.len());
    for key in keys {
        let mut session = Session::open(channel.clone()).await?;
        let id = session.acquire(&key, None, Some(ttl)).await?;
        session.wait_for(id, Want::Granted).await?;
        sessions.push(session);
    }
    Ok(sessions)
}
