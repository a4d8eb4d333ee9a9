//! Phases 1 and 2 (`cycles`): uncontended acquire→release cycles, each session on a key
//! of its own, through the sidecar and, as the yardstick, the same Lua scripts called
//! directly on the same Redis ([`RedisStore`]): p50, p99 and cycles/s of 1, then 64
//! sessions and as many direct tasks.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::harness::context::{Ctx, DIRECT_TTL, random_hex};
use super::harness::load::{cycles, sampling, timed};
use super::harness::report::{Report, us};
use super::harness::rows::{Row, Rule};
use super::harness::session::Session;
use lockside::store::redis::RedisStore;
use lockside::store::{Acquired, Claim, Sharing, Store};

/// One run: its sessions (and direct tasks), and its lines.
struct Cycles {
    sessions: usize,
    p50: Row,
    p99: Row,
    per_s: Row,
}

/// Phase 1.
const ONE: Cycles = Cycles {
    sessions: 1,
    p50: Row::new("cycle1_p50_us", "cycle, 1 session: p50 (µs)")
        .target("≤ 2× direct", Rule::RatioAtMost(2.0)),
    p99: Row::new("cycle1_p99_us", "cycle, 1 session: p99 (µs)"),
    per_s: Row::new("cycle1_per_s", "cycle, 1 session: cycles/s")
        .target("≥ 0.5× direct", Rule::RatioAtLeast(0.5)),
};

/// Phase 2.
const MANY: Cycles = Cycles {
    sessions: 64,
    p50: Row::new("cycle64_p50_us", "cycle, 64 sessions: p50 (µs)")
        .target("≤ 2× direct", Rule::RatioAtMost(2.0)),
    p99: Row::new("cycle64_p99_us", "cycle, 64 sessions: p99 (µs)"),
    per_s: Row::new("cycle64_per_s", "cycle, 64 sessions: cycles/s")
        .target("≥ 0.5× direct", Rule::RatioAtLeast(0.5)),
};

/// The lines of the table this phase fills, in order; the baseline column has the
/// same scripts called directly.
pub(super) const ROWS: &[Row] = &[ONE.p50, ONE.p99, ONE.per_s, MANY.p50, MANY.p99, MANY.per_s];

/// Runs phases 1 and 2.
pub(super) async fn run(ctx: &Ctx, report: &mut Report) -> Result<(), String> {
    eprintln!("bench: phase 1: cycles, 1 session");
    cycle_phase(ctx, &ONE, report).await?;
    eprintln!("bench: phase 2: cycles, 64 sessions");
    cycle_phase(ctx, &MANY, report).await
}

/// `run.sessions` sessions, then as many direct tasks, each cycling on its own key.
async fn cycle_phase(ctx: &Ctx, run: &Cycles, report: &mut Report) -> Result<(), String> {
    let n = run.sessions;
    let sessions = ctx.sessions(n).await?.into_iter().enumerate();
    let side = timed(sessions, ctx.seconds, "sidecar cycles", |(i, s), until| {
        sidecar_cycles(s, ctx.key(format!("cycle{n}/{i}")), until)
    })
    .await?;
    let direct = timed(0..n, ctx.seconds, "direct cycles", |i, until| {
        let key = ctx.key(format!("direct{n}/{i}"));
        direct_cycles(ctx.store.clone(), key, until)
    })
    .await?;

    report.put(&run.p50, us(side.p50), us(direct.p50));
    report.put(&run.p99, us(side.p99), us(direct.p99));
    report.put(&run.per_s, Some(side.rate), Some(direct.rate));
    Ok(())
}

async fn sidecar_cycles(
    mut s: Session,
    key: String,
    until: Instant,
) -> Result<Vec<Duration>, String> {
    cycles(&mut s, &key, until).await
}

async fn direct_cycles(
    store: Arc<RedisStore>,
    key: String,
    until: Instant,
) -> Result<Vec<Duration>, String> {
    let mut samples = Vec::new();
    while sampling(until, &samples) {
        let claim = Claim {
            key: key.clone(),
            owner: random_hex(16)?,
            ttl: DIRECT_TTL,
            wait: false,
            session_id: "bench".into(),
            client_name: "lockside-bench".into(),
            holder: String::new(),
            sharing: Sharing::Exclusive,
            limit: 1,
            fair: false,
            value: Vec::new(),
            ticket: None,
        };
        let start = Instant::now();
        match store.acquire(&claim).await {
            Ok(Acquired::Granted { .. }) => {}
            other => return Err(format!("direct acquire of {key}: {other:?}")),
        }
        match store.release(&key, &claim.owner, 0, Duration::ZERO).await {
            Ok(Some(0)) => {}
            other => return Err(format!("direct release of {key}: {other:?}")),
        }
        samples.push(start.elapsed());
    }
    Ok(samples)
}
