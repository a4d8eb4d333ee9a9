//! Phase 12 (`election`): leader election across two sidecars of one store. A second
//! sidecar (B) is spawned beside the one under test (A); followers watch the election
//! key on B.
//!
//! - grant → watcher: a leader on A takes the key (fair, with a value); the time from
//!   its `Granted` to the watcher on B receiving the state that shows it (p50, p99);
//! - leader death: a `lockside elect` process leads through A and is SIGKILLed while a
//!   candidate on B waits; the time from the kill to that candidate's `Granted`, and
//!   to the watcher on B showing the new leader (its sidecar sees the stream break and
//!   releases at once: no session timeout).

use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::time::{Instant, timeout};
use tonic::transport::Channel;

use super::harness::args::BenchArgs;
use super::harness::context::{Ctx, WAIT, err};
use super::harness::process::Sidecar;
use super::harness::report::{Report, Stats, ms};
use super::harness::rows::{Row, Rule};
use super::harness::session::{Ask, Session, Want};
use lockside::proto::lock_service_client::LockServiceClient;
use lockside::proto::{DescribeResponse, WatchRequest, WatchResponse};

const SEEN_P50: Row = Row::new("watch_seen_p50_ms", "election: grant → watcher: p50 (ms)")
    .target("≤ 10 ms", Rule::AtMost(10.0));
const SEEN_P99: Row = Row::new("watch_seen_p99_ms", "election: grant → watcher: p99 (ms)");
const TAKEOVER_P50: Row = Row::new(
    "takeover_p50_ms",
    "election: leader killed → next grant: p50 (ms)",
)
.target("≤ 50 ms", Rule::AtMost(50.0));
const TAKEOVER_MAX: Row = Row::new(
    "takeover_max_ms",
    "election: leader killed → next grant: max (ms)",
);
const TAKEOVER_SEEN_P50: Row = Row::new(
    "takeover_seen_p50_ms",
    "election: leader killed → watcher: p50 (ms)",
)
.target("≤ 50 ms", Rule::AtMost(50.0));
const TAKEOVER_SEEN_MAX: Row = Row::new(
    "takeover_seen_max_ms",
    "election: leader killed → watcher: max (ms)",
);

/// The lines of the table this phase fills, in order. Its targets are milliseconds
/// where etcd and ZooKeeper wait out a session timeout (seconds).
pub(super) const ROWS: &[Row] = &[
    SEEN_P50,
    SEEN_P99,
    TAKEOVER_P50,
    TAKEOVER_MAX,
    TAKEOVER_SEEN_P50,
    TAKEOVER_SEEN_MAX,
];

/// Grants timed to a watcher on the other sidecar.
const GRANT_ROUNDS: usize = 50;
/// Leader processes killed.
const DEATH_ROUNDS: usize = 10;
/// Longest wait for a state: far above any healthy notice, so a store that does not
/// publish changes fails the phase instead of hanging the bench.
const SEEN_TIMEOUT: Duration = Duration::from_secs(5);

/// A `Watch` stream and the states it brings.
struct Watcher {
    states: tonic::Streaming<WatchResponse>,
}

impl Watcher {
    async fn open(channel: Channel, key: &str) -> Result<Self, String> {
        let mut client = LockServiceClient::new(channel);
        let call = client.watch(WatchRequest { key: key.into() });
        let states = timeout(SEEN_TIMEOUT, call).await.map_err(err("Watch"))?;
        Ok(Self {
            states: states.map_err(err("Watch"))?.into_inner(),
        })
    }

    /// Reads states until one that `want` accepts; returns when it came.
    async fn until(&mut self, want: impl Fn(&DescribeResponse) -> bool) -> Result<Instant, String> {
        let wait = async {
            loop {
                match self.states.message().await {
                    Ok(Some(WatchResponse { state: Some(state) })) if want(&state) => {
                        return Ok(Instant::now());
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => return Err("the sidecar ended the watch".to_string()),
                    Err(status) => return Err(format!("Watch failed: {status}")),
                }
            }
        };
        timeout(SEEN_TIMEOUT, wait)
            .await
            .map_err(|_| format!("the state awaited did not come within {SEEN_TIMEOUT:?}"))?
    }
}

fn leader_value(state: &DescribeResponse) -> Option<&[u8]> {
    state.holders.first().map(|h| h.value.as_slice())
}

/// Runs phase 12 on a second sidecar spawned for it; stops that sidecar after. Skipped
/// with `--sidecar`: the bench spawns no sidecar then.
pub(super) async fn run(
    args: &BenchArgs,
    ctx: &Ctx,
    tag: &str,
    report: &mut Report,
) -> Result<(), String> {
    if args.sidecar.is_some() {
        report.notes.push(
            "phase 12 (election) needs a second spawned sidecar: skipped with --sidecar".into(),
        );
        return Ok(());
    }
    eprintln!(
        "bench: phase 12: election, {GRANT_ROUNDS} grants and {DEATH_ROUNDS} leader deaths \
         across two sidecars"
    );
    let (other, channel) = Sidecar::spawn(args, tag, "none", None).await?;
    let measured = measure(ctx, &other.addr, channel, report).await;
    if let Some(note) = other.stop().await {
        report.notes.push(format!("the second sidecar: {note}"));
    }
    measured
}

async fn measure(
    ctx: &Ctx,
    other: &str,
    channel: Channel,
    report: &mut Report,
) -> Result<(), String> {
    let ask = Ask {
        fair: true,
        limit: 0,
    };
    // Grant → watcher on the other sidecar.
    let key = ctx.key("election/grant");
    let mut watcher = Watcher::open(channel.clone(), &key).await?;
    watcher.until(|s| s.holders.is_empty()).await?;
    let mut leader = Session::open(ctx.channel.clone()).await?;
    let mut seen = Vec::with_capacity(GRANT_ROUNDS);
    for round in 0..GRANT_ROUNDS {
        let value = format!("leader-{round}").into_bytes();
        let id = leader.acquire_valued(&key, None, ask, &value).await?;
        leader.wait_for(id, Want::Granted).await?;
        let granted = Instant::now();
        let at = watcher.until(|s| leader_value(s) == Some(&value)).await?;
        // The watcher's path is longer (a notice, then a read): it comes after.
        seen.push(at.saturating_duration_since(granted));
        let id = leader.release(&key).await?;
        leader.wait_for(id, Want::Released).await?;
        watcher.until(|s| s.holders.is_empty()).await?;
    }
    let stats = Stats::new(seen, ctx.seconds, "grant to watcher")?;
    report.put(&SEEN_P50, ms(stats.p50), None);
    report.put(&SEEN_P99, ms(stats.p99), None);

    // Leader process death → the next leader's grant, and → the watcher seeing it.
    let key = ctx.key("election/death");
    let mut watcher = Watcher::open(channel.clone(), &key).await?;
    let mut candidate = Session::open(channel).await?;
    let (mut granted, mut shown) = (Vec::new(), Vec::new());
    for round in 0..DEATH_ROUNDS {
        let doomed = format!("doomed-{round}").into_bytes();
        let mut process = elect(&ctx.addr, &key, &doomed)?;
        let led = watcher.until(|s| leader_value(s) == Some(&doomed)).await;
        if let Err(e) = led {
            let _ = process.kill().await;
            return Err(e);
        }
        let next = format!("next-{round}").into_bytes();
        let id = candidate
            .acquire_valued(&key, Some(WAIT), ask, &next)
            .await?;
        candidate.wait_for(id, Want::Waiting).await?;
        let killed = Instant::now();
        process
            .kill()
            .await
            .map_err(err("SIGKILL lockside elect"))?;
        candidate.wait_for(id, Want::Granted).await?;
        granted.push(killed.elapsed());
        let at = watcher.until(|s| leader_value(s) == Some(&next)).await?;
        shown.push(at.saturating_duration_since(killed));
        let id = candidate.release(&key).await?;
        candidate.wait_for(id, Want::Released).await?;
    }
    let granted = Stats::new(granted, ctx.seconds, "leader death to grant")?;
    let shown = Stats::new(shown, ctx.seconds, "leader death to watcher")?;
    report.put(&TAKEOVER_P50, ms(granted.p50), None);
    report.put(&TAKEOVER_MAX, ms(granted.max), None);
    report.put(&TAKEOVER_SEEN_P50, ms(shown.p50), None);
    report.put(&TAKEOVER_SEEN_MAX, ms(shown.max), None);
    report.notes.push(format!(
        "election: a second sidecar on the same store ({other}) runs the watcher and the \
         next candidate; the leader that dies is a `lockside elect` process through the \
         sidecar under test, SIGKILLed"
    ));
    Ok(())
}

/// `lockside elect KEY --value VALUE -- CMD` through the sidecar at `addr`; CMD lives
/// as long as its parent (no orphan is left when the elect process is killed).
fn elect(addr: &str, key: &str, value: &[u8]) -> Result<Child, String> {
    let value = String::from_utf8_lossy(value).into_owned();
    Command::new(env!("CARGO_BIN_EXE_lockside"))
        .args(["elect", key, "--value", &value, "--", "sh", "-c"])
        .arg("while kill -0 $PPID 2>/dev/null; do sleep 0.05; done")
        .env("LOCKSIDE_ADDR", addr)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(err("spawning lockside elect"))
}
