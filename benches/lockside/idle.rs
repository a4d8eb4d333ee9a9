//! Phase 9 (`idle`): what one pod's contention costs the others. `--idle-sidecars`
//! sidecars with no session share a Redis and a namespace with one busy sidecar, on
//! which four sessions hand one lock around for `--seconds`. Measured: the idle ones'
//! CPU against the busy one's (and against their own in a window as long with no
//! contention), release notices delivered per release (`harness/notices.rs`), and
//! Redis CPU per release.

use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;

use super::harness::args::BenchArgs;
use super::harness::contention::{LastRelease, Pace, contend, pool};
use super::harness::context::{plain_redis, sub_namespace};
use super::harness::load::join_all;
use super::harness::notices::NoticeTap;
use super::harness::process::{Sidecar, Spawn, cpu_ns_all, stop_all};
use super::harness::redis_side::RedisProcs;
use super::harness::report::Report;
use super::harness::rows::{Row, Rule};
use super::harness::session::{Ask, Session};

const CPU: Row = Row::new("idle_cpu_ms", "idle sidecars' CPU (ms) vs the busy one's")
    .target("≤ 0.1×", Rule::RatioAtMost(0.1));
const QUIET_CPU: Row = Row::new(
    "idle_quiet_cpu_ms",
    "idle sidecars' CPU (ms) vs theirs, no contention",
);
const NOTICES: Row = Row::new("idle_notices_per_release", "notices delivered per release")
    .target("≤ 1", Rule::AtMost(1.0));
const REDIS_CPU: Row = Row::new(
    "idle_redis_cpu_us",
    "Redis CPU per release (µs), idle sidecars on",
);
const RELEASES_PER_S: Row = Row::new("idle_releases_per_s", "busy sidecar: releases/s");

/// The lines of the table this phase fills, in order; a label that names a yardstick
/// ("vs ...") has it in the baseline column.
pub(super) const ROWS: &[Row] = &[CPU, QUIET_CPU, NOTICES, REDIS_CPU, RELEASES_PER_S];

/// Sessions on the busy sidecar, taking turns on one key.
const BUSY_SESSIONS: usize = 4;

/// Runs phase 9 and records its lines.
pub(super) async fn run(
    args: &BenchArgs,
    idle: usize,
    tag: &str,
    report: &mut Report,
) -> Result<(), String> {
    eprintln!("bench: phase 9: idle, {idle} idle sidecars beside a busy one");
    let ns = sub_namespace(tag, "idle");
    let mut servers = plain_redis(&args.redis).await?;
    let procs = RedisProcs::find(&mut servers).await?;
    let mut spawned = Vec::new();
    let result = async {
        let (busy, channel) = Sidecar::spawn_with(&Spawn::new(args, ns.clone())).await?;
        let busy_pid = busy.pid();
        spawned.push(busy);
        let mut idle_pids = Vec::new();
        for _ in 0..idle {
            let (sidecar, _) = Sidecar::spawn_with(&Spawn::new(args, ns.clone())).await?;
            idle_pids.extend(sidecar.pid());
            spawned.push(sidecar);
        }

        let mut sessions = Vec::with_capacity(BUSY_SESSIONS);
        for _ in 0..BUSY_SESSIONS {
            sessions.push(Session::open(channel.clone()).await?);
        }
        let tap = NoticeTap::start(&args.redis, &ns).await?;
        let (idle_before, busy_before) =
            (cpu_ns_all(&idle_pids)?, cpu_ns_all(busy_pid.as_slice())?);
        let redis_before = procs.cpu_ns()?;
        let start = Instant::now();
        let last: LastRelease = Default::default();
        let mut set = JoinSet::new();
        for (me, session) in sessions.into_iter().enumerate() {
            let key = format!("{ns}/hot");
            let (until, last) = (start + Duration::from_secs(args.seconds), last.clone());
            set.spawn(contend(
                session,
                me,
                key,
                Ask::default(),
                until,
                last,
                Pace::default(),
            ));
        }
        let (seen, sessions) = pool(join_all(set).await?);
        let window = start.elapsed();
        let redis_after = procs.cpu_ns()?;
        let (idle_after, busy_after) = (cpu_ns_all(&idle_pids)?, cpu_ns_all(busy_pid.as_slice())?);
        let tally = match tap {
            Some(tap) => Some(tap.finish().await?),
            None => None,
        };
        drop(sessions);

        // The same idle sidecars over a window as long, with nobody contending.
        let quiet_before = cpu_ns_all(&idle_pids)?;
        tokio::time::sleep(window).await;
        let quiet = cpu_ns_all(&idle_pids)?.saturating_sub(quiet_before);

        let ms = |ns: u64| Some(ns as f64 / 1e6);
        let idle_ns = idle_after.saturating_sub(idle_before);
        let busy_ns = busy_after.saturating_sub(busy_before);
        let releases = seen.grants;
        report.put(
            &CPU,
            ms(idle_ns),
            ms(busy_ns).filter(|_| busy_pid.is_some()),
        );
        report.put(&QUIET_CPU, ms(idle_ns), ms(quiet));
        report.put(&NOTICES, tally.and_then(|t| t.per_release(releases)), None);
        let redis_ns = redis_before
            .zip(redis_after)
            .map(|(b, a)| a.saturating_sub(b));
        let per_release = redis_ns.map(|ns| ns as f64 / 1e3 / releases.max(1) as f64);
        report.put(&REDIS_CPU, per_release, None);
        let rate = releases as f64 / window.as_secs_f64();
        report.put(&RELEASES_PER_S, Some(rate), None);
        report.notes.push(format!(
            "idle: {idle} sidecars with no session and one busy sidecar in one namespace; \
             {BUSY_SESSIONS} sessions on the busy one hand one key around for {:.1} s \
             ({releases} releases, {} published notices); deliveries are messages × \
             PUBSUB NUMSUB of their channel, the bench's own PSUBSCRIBE left out",
            window.as_secs_f64(),
            tally.map_or("n/a".into(), |t| t.published.to_string()),
        ));
        match tally {
            None => report
                .notes
                .push("notices per release are n/a on a Cluster (sharded channels)".into()),
            Some(tally) => report.notes.extend(tally.note()),
        }
        report.notes.extend(procs.note());
        Ok(())
    }
    .await;
    report.notes.extend(stop_all(spawned).await);
    result
}
