//! Phase 6 (`hold`): `--locks` locks held and renewed by the sidecar, and what that
//! costs: Redis commands and EVALSHA calls per second, Redis' CPU, the sidecar's CPU
//! time and memory.

use std::time::Duration;

use super::harness::context::{Ctx, plain_redis};
use super::harness::locks::{hold, take_locks};
use super::harness::process::rss_kb;
use super::harness::report::{Report, mb};
use super::harness::rows::{Row, Rule};

const COMMANDS_PER_S: Row = Row::new("hold_commands_per_s", "locks held: Redis commands/s");
const EVALSHA_PER_S: Row = Row::new("hold_evalsha_per_s", "locks held: EVALSHA/s");
const REDIS_CPU: Row = Row::new("hold_redis_cpu_percent", "locks held: Redis CPU (% core)");
const EVALSHA_PER_S_1K: Row = Row::new("hold_evalsha_per_s_1k", "locks held: EVALSHA/s per 1k");
const CPU: Row = Row::new("hold_cpu_percent", "locks held: sidecar CPU (% core)")
    .target("≤ 1% of a core", Rule::AtMost(1.0));
const RSS_BEFORE: Row = Row::new("hold_rss_before_mb", "locks held: RSS before taking (MB)");
const RSS: Row =
    Row::new("hold_rss_mb", "locks held: sidecar RSS (MB)").target("≤ 50 MB", Rule::AtMost(50.0));

/// The lines of the table this phase fills, in order.
pub(super) const ROWS: &[Row] = &[
    COMMANDS_PER_S,
    EVALSHA_PER_S,
    REDIS_CPU,
    EVALSHA_PER_S_1K,
    CPU,
    RSS_BEFORE,
    RSS,
];

/// Phase 6: `locks` locks held and renewed by the sidecar.
pub(super) async fn run(
    ctx: &Ctx,
    locks: u64,
    ttl: Duration,
    pid: Option<u32>,
    report: &mut Report,
) -> Result<(), String> {
    eprintln!("bench: phase 6: {locks} locks held");
    let mut redis = plain_redis(&ctx.redis_url).await?;
    // Earlier phases leave allocator caches behind: show where memory stood before.
    let rss_before = pid.map(rss_kb).transpose()?;
    let keys = (0..locks).map(|i| ctx.key(format!("hold/{i}"))).collect();
    let sessions = take_locks(&ctx.channel, keys, ttl).await?.all()?;
    let held = hold(&mut redis, sessions, pid, ttl).await?;
    report.put(&COMMANDS_PER_S, Some(held.commands_per_s), None);
    report.put(&EVALSHA_PER_S, Some(held.evalsha_per_s), None);
    report.put(
        &EVALSHA_PER_S_1K,
        Some(held.evalsha_per_s * 1000.0 / locks as f64),
        None,
    );
    report.put(&CPU, held.cpu_percent, None);
    report.put(&REDIS_CPU, held.redis_cpu_percent, None);
    report.put(&RSS_BEFORE, rss_before.map(mb), None);
    report.put(&RSS, held.rss_kb.map(mb), None);
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
