//! Phase 5 (`death`): a holder's client disappears (its TCP connection closes) while
//! another session waits for its key; the time from the close to the waiter's grant.

use tokio::time::Instant;

use super::harness::context::{Ctx, WAIT};
use super::harness::process::connect;
use super::harness::report::{Report, Stats, ms};
use super::harness::rows::{Row, Rule};
use super::harness::session::{Session, Want};

const P50: Row =
    Row::new("death_p50_ms", "death to grant: p50 (ms)").target("≤ 50 ms", Rule::AtMost(50.0));
const MAX: Row = Row::new("death_max_ms", "death to grant: max (ms)");

/// The lines of the table this phase fills, in order.
pub(super) const ROWS: &[Row] = &[P50, MAX];

/// Rounds of the phase.
const DEATH_ROUNDS: usize = 20;

/// Phase 5: a holder's client disappears while another session waits for its key.
pub(super) async fn run(ctx: &Ctx, report: &mut Report) -> Result<(), String> {
    eprintln!("bench: phase 5: death to grant, {DEATH_ROUNDS} rounds");
    let key = ctx.key("death");
    let mut waiter = Session::open(connect(&ctx.addr).await?).await?;
    let mut samples = Vec::with_capacity(DEATH_ROUNDS);
    for _ in 0..DEATH_ROUNDS {
        // Its own connection, so that dropping it closes a TCP connection.
        let channel = connect(&ctx.addr).await?;
        let mut holder = Session::open(channel.clone()).await?;
        let id = holder.acquire(&key, None, None).await?;
        holder.wait_for(id, Want::Granted).await?;
        let id = waiter.acquire(&key, Some(WAIT), None).await?;
        waiter.wait_for(id, Want::Waiting).await?;
        let t0 = Instant::now();
        drop((holder, channel));
        waiter.wait_for(id, Want::Granted).await?;
        samples.push(t0.elapsed());
        let id = waiter.release(&key).await?;
        waiter.wait_for(id, Want::Released).await?;
    }
    let stats = Stats::new(samples, ctx.seconds, "death to grant")?;
    report.put(&P50, ms(stats.p50), None);
    report.put(&MAX, ms(stats.max), None);
    Ok(())
}
