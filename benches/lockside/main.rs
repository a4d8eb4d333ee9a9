//! The benchmark (`cargo bench --bench lockside -- --redis redis://HOST:PORT`): measures
//! live sidecars and, in the same run and from the same process, a yardstick on the
//! same Redis: the same Lua scripts called directly (through [`RedisStore`]), or the
//! classic single-key recipe, so the table shows what the sidecar adds or costs.
//!
//! Phases, each bounded in time and in count, over loopback only; `--phases` picks
//! them by name (all but `fleet` by default):
//! 1. `cycles`: acquire→release cycles on one session (p50, p99, cycles/s), sidecar and
//!    direct; 2. the same with 64 concurrent sessions;
//! 3. `handoff`: 16 sessions contend for one key, then 8 and 64 waiters, unfair and
//!    fair; the next `Granted` minus the time the previous holder sent its `Release`,
//!    and Redis commands per handoff;
//! 4. `semaphore`: 32 sessions share 4 permits of one key;
//! 5. `death`: a holder's connection closes while another session waits;
//! 6. `hold`: `--locks` locks held and renewed: Redis load, sidecar CPU and memory;
//! 7. `observe`: the cost of traces and metrics: uncontended cycles on a sidecar
//!    exporting spans and scraped, against one with neither (`observe.rs`);
//! 8. `cost`: Redis CPU, commands, memory and keys per lock against the classic recipe
//!    (`SET NX PX` + compare-and-delete), the sidecar's CPU per cycle (`cost.rs`);
//! 9. `idle`: sidecars with no sessions beside a busy one: their CPU, notices per
//!    release (`idle.rs`);
//! 10. `scale`: 100,000 locks on one sidecar, 10,000 sessions on another (`scale.rs`);
//! 11. `fleet`: N sidecars on one Redis, the curves drawn as SVG (`fleet.rs`).
//! 12. `election`: leader election across two sidecars: a grant seen by a watcher on
//!     the other sidecar, and a leader process's death to the next grant and to the
//!     watcher (`election.rs`).
//!
//! It is a bench target, not part of the product: the image neither builds nor ships
//! it. Without `--sidecar` the bench spawns `lockside serve` (the binary cargo built
//! beside it) on a free loopback port and stops it with SIGTERM at the end, also after
//! an error; phases 7 to 11 spawn sidecars of their own, each in a namespace of its
//! own, and stop them before the next phase.
//!
//! Files: this one has the run and phases 1, 2 and 5; `contend.rs` is phases 3 and 4
//! (many sessions on one key); `many_locks.rs` is phase 6; `harness/` is what the
//! phases share (its `mod.rs` says which file owns what).

mod contend;
mod cost;
mod election;
mod fleet;
mod harness;
mod idle;
mod many_locks;
mod observe;
mod scale;

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use tokio::time::Instant;
use tonic::transport::Channel;

use contend::{HANDOFFS, PERMITS, SEM_SESSIONS, handoff_phase, semaphore_phase};
use cost::{CostArgs, cost_phase};
use fleet::{FleetArgs, fleet_phase};
use harness::args::{BenchArgs, Phase};
use harness::context::{Ctx, DIRECT_TTL, WAIT, clean_up, random_hex};
use harness::floor;
use harness::load::{cycles, sampling, timed};
use harness::process::{Sidecar, connect};
use harness::report::{Report, Stats, ms, us};
use harness::session::{Session, Want};
use idle::idle_phase;
use lockside::store::redis::RedisStore;
use lockside::store::{Acquired, Claim, Sharing, Store};
use many_locks::hold_phase;
use scale::{ScaleArgs, scale_phase};

/// Rounds of phase 5.
const DEATH_ROUNDS: usize = 20;

fn main() -> std::process::ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some(floor::FLOOR_SERVE) {
        return floor::serve(&argv[2..]);
    }
    let args = BenchArgs::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("bench: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs the benchmark; prints the table, then the JSON object on one line.
async fn run(args: BenchArgs) -> Result<(), String> {
    let tag = random_hex(6)?;
    let mut report = Report::default();
    measure(&args, &tag, &mut report).await;
    clean_up(&args, &tag, &mut report).await?;
    report.print();
    let json = report.json(&args);
    println!("{json}");
    if let Some(path) = &args.json {
        std::fs::write(path, format!("{json}\n")).map_err(harness::context::err(path.display()))?;
    }
    match report.failed.is_empty() {
        true => Ok(()),
        false => Err(format!("failed: {}", report.failed.join("; "))),
    }
}

/// Runs the phases `--phases` names: those on the main sidecar first, then those that
/// spawn sidecars of their own. A phase that fails is recorded in the report (the run
/// then exits non-zero) and the next group of phases still runs: a failure at the
/// fifth minute keeps the figures of the first four.
async fn measure(args: &BenchArgs, tag: &str, report: &mut Report) {
    if args.phases.iter().any(|p| p.on_main_sidecar()) {
        match Sidecar::start(args, tag).await {
            Ok((sidecar, channel)) => {
                let measured = measure_main(args, &sidecar, channel, tag, report).await;
                report.notes.extend(sidecar.stop().await);
                report.check("phases 1-6", measured);
            }
            Err(e) => report.check("starting the sidecar", Err(e)),
        }
    }
    let on = |phase| args.phases.contains(&phase);
    let own: Vec<Phase> = args
        .phases
        .iter()
        .copied()
        .filter(|p| !p.on_main_sidecar())
        .collect();
    if args.sidecar.is_some() && !own.is_empty() {
        let names: Vec<&str> = own.iter().map(|p| p.name()).collect();
        report.notes.push(format!(
            "{} spawn sidecars of their own: skipped with --sidecar",
            names.join(", ")
        ));
        return;
    }
    if on(Phase::Observe) {
        eprintln!("bench: phase 7: traces and metrics on vs off, uncontended cycles");
        let measured = observe::observability_phase(args, tag, report).await;
        report.check("observe", measured);
    }
    if on(Phase::Cost) {
        let cost = CostArgs {
            cycles: args.cost_cycles,
            locks: args.cost_locks,
            left: args.left_keys,
        };
        let measured = cost_phase(args, cost, tag, report).await;
        report.check("cost", measured);
    }
    if on(Phase::Idle) {
        let idle = args.idle_sidecars as usize;
        eprintln!("bench: phase 9: idle, {idle} idle sidecars beside a busy one");
        let measured = idle_phase(args, idle, tag, report).await;
        report.check("idle", measured);
    }
    if on(Phase::Scale) {
        let scale = ScaleArgs {
            locks: args.scale_locks,
            sessions: args.scale_sessions,
        };
        let measured = scale_phase(args, scale, tag, report).await;
        report.check("scale", measured);
    }
    if on(Phase::Fleet) {
        let mut sizes: Vec<usize> = args.fleet_sizes.iter().map(|n| *n as usize).collect();
        sizes.sort_unstable();
        sizes.dedup();
        let fleet = FleetArgs {
            sizes,
            locks: args.fleet_locks.clone(),
            seconds: args.fleet_seconds,
            svg: args.fleet_svg.clone(),
        };
        let measured = fleet_phase(args, &fleet, tag, report).await;
        report.check("fleet", measured);
    }
}

/// Phases 1 to 6, on the main sidecar.
async fn measure_main(
    args: &BenchArgs,
    sidecar: &Sidecar,
    channel: Channel,
    tag: &str,
    report: &mut Report,
) -> Result<(), String> {
    let ctx = Ctx::new(args, &sidecar.addr, channel, tag)?;
    let on = |phase| args.phases.contains(&phase);
    eprintln!("bench: sidecar at {}", ctx.addr);
    if on(Phase::Cycles) {
        eprintln!("bench: phase 1: cycles, 1 session");
        cycle_phase(&ctx, 1, report).await?;
        eprintln!("bench: phase 2: cycles, 64 sessions");
        cycle_phase(&ctx, 64, report).await?;
    }
    // Redlock refuses fair queues and semaphores (UNIMPLEMENTED): those phases are left out.
    let redlock = args
        .store
        .as_deref()
        .is_some_and(|s| s.starts_with("redlock://"));
    if on(Phase::Handoff) {
        for run in HANDOFFS {
            if redlock && run.fair {
                continue;
            }
            let fair = if run.fair { "fair" } else { "unfair" };
            let waiters = run.waiters;
            eprintln!("bench: phase 3: handoff, {waiters} waiters on one key, {fair}");
            handoff_phase(&ctx, run, report).await?;
        }
        report.notes.push(
            "handoff and semaphore: N waiters are N + 1 sessions on one key; Redis commands \
             per grant count the commands run inside the Lua scripts, each script call is \
             one EVALSHA round trip"
                .into(),
        );
    }
    if redlock && (on(Phase::Handoff) || on(Phase::Semaphore)) {
        report
            .notes
            .push("Redlock: fair handoffs and the semaphore phase are left out (refused)".into());
    } else if on(Phase::Semaphore) {
        eprintln!("bench: phase 4: semaphore, {SEM_SESSIONS} sessions on {PERMITS} permits");
        semaphore_phase(&ctx, report).await?;
    }
    if on(Phase::Death) {
        eprintln!("bench: phase 5: death to grant, {DEATH_ROUNDS} rounds");
        death_phase(&ctx, report).await?;
    }
    if on(Phase::Hold) {
        eprintln!("bench: phase 6: {} locks held", args.locks);
        hold_phase(&ctx, args.locks, args.hold_ttl, sidecar.pid(), report).await?;
    }
    if on(Phase::Election) {
        if args.sidecar.is_none() {
            eprintln!(
                "bench: phase 12: election, {} grants and {} leader deaths across two sidecars",
                election::GRANT_ROUNDS,
                election::DEATH_ROUNDS
            );
            election::election_phase(args, &ctx, tag, report).await?;
        } else {
            report.notes.push(
                "phase 12 (election) needs a second spawned sidecar: skipped with --sidecar".into(),
            );
        }
    }
    Ok(())
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

/// Phase 5: a holder's client disappears while another session waits for its key.
async fn death_phase(ctx: &Ctx, report: &mut Report) -> Result<(), String> {
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
    report.put("death_p50_ms", ms(stats.p50), None);
    report.put("death_max_ms", ms(stats.max), None);
    Ok(())
}
