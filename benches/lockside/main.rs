//! The benchmark (`cargo bench --bench lockside -- --redis redis://HOST:PORT`): measures
//! live sidecars and, in the same run and from the same process, a yardstick on the
//! same Redis: the same Lua scripts called directly (through [`RedisStore`]), or the
//! classic single-key recipe, so the table shows what the sidecar adds or costs.
//!
//! Phases, each bounded in time and in count, over loopback only; `--phases` picks
//! them by name (all but `fleet` by default):
//! 1. `cycles`: acquire→release cycles on one session (p50, p99, cycles/s), sidecar and
//!    direct; 2. the same with 64 concurrent sessions (`cycles.rs`);
//! 3. `handoff`: 16 sessions contend for one key, then 8 and 64 waiters, unfair and
//!    fair; the next `Granted` minus the time the previous holder sent its `Release`,
//!    and Redis commands per handoff (`handoff.rs`);
//! 4. `semaphore`: 32 sessions share 4 permits of one key (`semaphore.rs`);
//! 5. `death`: a holder's connection closes while another session waits (`death.rs`);
//! 6. `hold`: `--locks` locks held and renewed: Redis load, sidecar CPU and memory
//!    (`hold.rs`);
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
//! 13. `ceiling`: one Redis driven to saturation through Lockside (several sidecars,
//!     1, 16 and 64 sessions) and through the classic recipe, in the same run
//!     (`ceiling.rs`).
//!
//! It is a bench target, not part of the product: the image neither builds nor ships
//! it. Without `--sidecar` the bench spawns `lockside serve` (the binary cargo built
//! beside it) on a free loopback port and stops it with SIGTERM at the end, also after
//! an error; phases 7 to 11 spawn sidecars of their own, each in a namespace of its
//! own, and stop them before the next phase.
//!
//! Files: this one parses the flags and dispatches the phases; each phase is a file
//! beside it, named as `--phases` names it, that imports the harness and no other
//! phase; `harness/` is what the phases share (its `mod.rs` says which file owns what).

mod ceiling;
mod cost;
mod cycles;
mod death;
mod election;
mod fleet;
mod handoff;
mod harness;
mod hold;
mod idle;
mod observe;
mod scale;
mod semaphore;

use clap::Parser;
use tonic::transport::Channel;

use ceiling::CeilingArgs;
use cost::CostArgs;
use fleet::FleetArgs;
use harness::args::{BenchArgs, Phase};
use harness::context::{Ctx, clean_up, err, random_hex};
use harness::floor;
use harness::process::Sidecar;
use harness::report::Report;
use harness::rows::Row;
use scale::ScaleArgs;

/// The main table's lines, in order: each phase's own, as its file declares them. A
/// label that names a yardstick ("vs ...") has it in the baseline column, measured in
/// the same run; the other lines with a baseline have the same scripts called
/// directly there.
const TABLE: [&[Row]; 11] = [
    cycles::ROWS,
    handoff::ROWS,
    semaphore::ROWS,
    death::ROWS,
    hold::ROWS,
    observe::ROWS,
    cost::ROWS,
    idle::ROWS,
    scale::ROWS,
    election::ROWS,
    ceiling::ROWS,
];

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
    let mut report = Report::new(TABLE.into_iter().flatten().copied());
    measure(&args, &tag, &mut report).await;
    clean_up(&args, &tag, &mut report).await?;
    report.print();
    let json = report.json(&args);
    println!("{json}");
    if let Some(path) = &args.json {
        std::fs::write(path, format!("{json}\n")).map_err(err(path.display()))?;
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
        let measured = observe::run(args, tag, report).await;
        report.check("observe", measured);
    }
    if on(Phase::Cost) {
        let cost = CostArgs {
            cycles: args.cost_cycles,
            locks: args.cost_locks,
            left: args.left_keys,
        };
        let measured = cost::run(args, cost, tag, report).await;
        report.check("cost", measured);
    }
    if on(Phase::Idle) {
        let idle = args.idle_sidecars as usize;
        let measured = idle::run(args, idle, tag, report).await;
        report.check("idle", measured);
    }
    if on(Phase::Scale) {
        let scale = ScaleArgs {
            locks: args.scale_locks,
            sessions: args.scale_sessions,
        };
        let measured = scale::run(args, scale, tag, report).await;
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
        let measured = fleet::run(args, &fleet, tag, report).await;
        report.check("fleet", measured);
    }
    if on(Phase::Ceiling) {
        let ceiling = CeilingArgs {
            sidecars: args.ceiling_sidecars as usize,
            seconds: args.ceiling_seconds,
            rounds: args.ceiling_rounds,
        };
        let measured = ceiling::run(args, ceiling, tag, report).await;
        report.check("ceiling", measured);
    }
}

/// Phases 1 to 6 and 12, on the main sidecar.
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
        cycles::run(&ctx, report).await?;
    }
    // Redlock refuses fair queues and semaphores (UNIMPLEMENTED): those phases are left out.
    let redlock = args
        .store
        .as_deref()
        .is_some_and(|s| s.starts_with("redlock://"));
    if on(Phase::Handoff) {
        handoff::run(&ctx, redlock, report).await?;
    }
    if redlock && (on(Phase::Handoff) || on(Phase::Semaphore)) {
        report
            .notes
            .push("Redlock: fair handoffs and the semaphore phase are left out (refused)".into());
    } else if on(Phase::Semaphore) {
        semaphore::run(&ctx, report).await?;
    }
    if on(Phase::Death) {
        death::run(&ctx, report).await?;
    }
    if on(Phase::Hold) {
        hold::run(&ctx, args.locks, args.hold_ttl, sidecar.pid(), report).await?;
    }
    if on(Phase::Election) {
        election::run(args, &ctx, tag, report).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    // Run by tests/bench_units.rs; the bench target itself has no harness, so there
    // the tests below are compiled out and this import goes unused.
    #[allow(unused_imports)]
    use super::*;

    #[test]
    fn every_line_of_the_table_has_an_id_of_its_own() {
        let mut ids: Vec<&str> = TABLE
            .iter()
            .flat_map(|rows| rows.iter().map(|r| r.id))
            .collect();
        let lines = ids.len();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), lines);
    }

    #[test]
    fn every_baseline_is_a_line_of_the_table() {
        let table: Vec<&Row> = TABLE.iter().flat_map(|rows| rows.iter()).collect();
        for row in &table {
            if let Some(base) = row.baseline() {
                assert!(
                    table.iter().any(|r| r.id == base.id),
                    "{} → {}",
                    row.id,
                    base.id
                );
            }
        }
        assert!(
            table.iter().any(|r| r.baseline().is_some()),
            "handoff64_commands has one"
        );
    }
}
