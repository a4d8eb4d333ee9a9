//! Phase 6 (`hold`): `--locks` locks held and renewed by the sidecar, and what that
//! costs: Redis commands and EVALSHA calls per second, Redis' CPU, the sidecar's CPU
//! time and memory.

use std::time::Duration;

use super::harness::context::{Ctx, plain_redis};
use super::harness::locks::{hold, take_locks};
use super::harness::process::rss_kb;
use super::harness::report::{Report, mb};

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
