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
use super::harness::session::Session;
use lockside::store::redis::RedisStore;
use lockside::store::{Acquired, Claim, Sharing, Store};

/// Runs phases 1 and 2.
pub(super) async fn run(ctx: &Ctx, report: &mut Report) -> Result<(), String> {
    eprintln!("bench: phase 1: cycles, 1 session");
    cycle_phase(ctx, 1, report).await?;
    eprintln!("bench: phase 2: cycles, 64 sessions");
    cycle_phase(ctx, 64, report).await
}

/// Phases 1 and 2: `n` sessions, then `n` direct tasks, each cycling on its own key.
async fn cycle_phase(ctx: &Ctx, n: usize, report: &mut Report) -> Result<(), String> {
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

    report.put(format!("cycle{n}_p50_us"), us(side.p50), us(direct.p50));
    report.put(format!("cycle{n}_p99_us"), us(side.p99), us(direct.p99));
    report.put(
        format!("cycle{n}_per_s"),
        Some(side.rate),
        Some(direct.rate),
    );
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
