//! The nemesis (issue 33): random faults against real processes, hunting for two
//! holders of one lock, with a history checker held to docs/guarantees.md.
//!
//! ```text
//! NEMESIS_SECONDS=N NEMESIS_SEED=S cargo test --release --test fault_nemesis -- --nocapture
//! ```
//!
//! runs about N seconds (default 140: the CI run) over the five topologies in turn
//! (standalone with RDB snapshots, standalone with AOF, Sentinel, Cluster, Redlock;
//! longer runs cycle through them again), and ends with one line:
//! `nemesis seed=S: F faults, G grants, O overlaps, R token regressions, W stale writes
//! accepted, stuck K`, exiting non-zero on any violation. Without `NEMESIS_SEED` a fresh
//! seed is drawn and printed; `NEMESIS_ROUND=I` replays round I of a seed only.
//! `NEMESIS_SELF_CHECK=1` runs one round with a deliberately wrong client (it keeps
//! writing after `Lost`) and passes only if the checker flags it.
//!
//! Each round: three real `lockside serve` sidecars (one with `--instance`, some under
//! libfaketime within `--clock-drift`) on the round's store; six client processes (this
//! binary's `client` role on `lockside::client`, and the Python package), two workers
//! each, contending for five keys (exclusive, fair, shared, a semaphore of 2) with short
//! holds and some long ones, resume on; every worker records its *use* of each lock and
//! writes, while it holds, to a fenced register in this process. A seeded schedule of
//! overlapping faults (Redis SIGKILL / SIGSTOP / restart empty or from a snapshot /
//! `maxmemory`, Sentinel and Cluster failovers including one to a replica that missed
//! the newest writes, sidecar and client SIGKILL / SIGSTOP, connection resets, stalls,
//! blackholes and latency through proxies) runs for the round's window; then
//! everything is healed, and every key and client must work again within hold-off +
//! TTL. The checker reads the history.
//!
//! This binary has its own `main` (`harness = false`): it is also the Rust client
//! process (`fault_nemesis client ARGS`), so the fixed command needs nothing else
//! built. Where things live (`tests/fault_nemesis/`):
//!
//! | file | what |
//! |---|---|
//! | `plan.rs` | the environment, the rounds, the workload's timing, the client's arguments |
//! | `schedule.rs` | the seeded fault schedule and how it prints |
//! | `world.rs` | a round's processes and proxies, fault records |
//! | `topology.rs`, `nodes.rs` | the Redis topologies; what the nemesis does to nodes |
//! | `processes.rs` | sidecar and client processes (process groups, killed on drop) |
//! | `nemesis.rs` | running the schedule; noting failovers |
//! | `register.rs` | the fenced register |
//! | `client.rs`, `several.rs` | the Rust client process (`several.rs`: several keys at once, `AcquireAll`); the Python one is `tests/fixtures/clients/nemesis.py` |
//! | `history.rs` | the events clients print; grants and segments of use |
//! | `checker.rs`, `writes.rs`, `liveness.rs` | the checks: overlaps and tokens; the register's log; keys, clients and acquires that got stuck, `Lost` without a cause |
//! | `expect.rs` | what docs/guarantees.md allows on each topology |
//! | `synthetic.rs` | the checker on made-up histories, before every run |
//! | `round.rs`, `report.rs` | one round start to end; what it prints and saves |

mod common;

#[path = "fault_nemesis/checker.rs"]
mod checker;
#[path = "fault_nemesis/client.rs"]
mod client;
#[path = "fault_nemesis/expect.rs"]
mod expect;
#[path = "fault_nemesis/history.rs"]
mod history;
#[path = "fault_nemesis/liveness.rs"]
mod liveness;
#[path = "fault_nemesis/nemesis.rs"]
mod nemesis;
#[path = "fault_nemesis/nodes.rs"]
mod nodes;
#[path = "fault_nemesis/plan.rs"]
mod plan;
#[path = "fault_nemesis/processes.rs"]
mod processes;
#[path = "fault_nemesis/register.rs"]
mod register;
#[path = "fault_nemesis/report.rs"]
mod report;
#[path = "fault_nemesis/round.rs"]
mod round;
#[path = "fault_nemesis/schedule.rs"]
mod schedule;
#[path = "fault_nemesis/several.rs"]
mod several;
#[path = "fault_nemesis/synthetic.rs"]
mod synthetic;
#[path = "fault_nemesis/topology.rs"]
mod topology;
#[path = "fault_nemesis/world.rs"]
mod world;
#[path = "fault_nemesis/writes.rs"]
mod writes;

use std::process::ExitCode;
use std::time::Duration;

/// libtest's options that take a value (skipped when looking for a name filter).
const VALUED: &[&str] = &[
    "--test-threads",
    "--skip",
    "--format",
    "--color",
    "--logfile",
    "-Z",
];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a == "client") {
        return client_process(&args[1..]);
    }
    // Behave as a test binary of one test, `nemesis`, for `cargo test` and its filters.
    if args.iter().any(|a| a == "--list") {
        println!("nemesis: test");
        return ExitCode::SUCCESS;
    }
    let mut filters = Vec::new();
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            a if VALUED.contains(&a) => i += 1,
            a if !a.starts_with('-') => filters.push(a.to_owned()),
            _ => {}
        }
        i += 1;
    }
    let exact = args.iter().any(|a| a == "--exact");
    let selected = filters.is_empty()
        || filters.iter().any(|f| {
            if exact {
                f == "nemesis"
            } else {
                "nemesis".contains(f.as_str())
            }
        });
    if !selected || args.iter().any(|a| a == "--ignored") {
        println!("running 0 tests (the nemesis is the test `nemesis`)");
        return ExitCode::SUCCESS;
    }
    synthetic::check();
    let config = match plan::Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("nemesis: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        runtime.block_on(run(&config))
    }));
    runtime.shutdown_timeout(Duration::from_secs(10));
    let left = processes::reap_children();
    if left > 0 {
        eprintln!("nemesis: stopped {left} processes still running at the end (left by a round)");
    }
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(_) => {
            eprintln!(
                "nemesis seed={}: the run failed (panic above); every process it started was stopped",
                config.seed
            );
            ExitCode::FAILURE
        }
    }
}

/// `fault_nemesis client ARGS`: the Rust client process.
fn client_process(args: &[String]) -> ExitCode {
    let args = match plan::WorkerArgs::parse(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("nemesis client: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(client::run(args));
    ExitCode::SUCCESS
}

/// Runs every round; whether the run passed.
async fn run(config: &plan::Config) -> bool {
    let rounds = plan::rounds(config);
    eprintln!(
        "nemesis: seed {} ({} rounds, about {} s); replay: NEMESIS_SECONDS={} NEMESIS_SEED={} cargo test --release --test fault_nemesis -- --nocapture",
        config.seed,
        rounds.len(),
        config.seconds,
        config.seconds,
        config.seed
    );
    let mut total = round::Summary::default();
    let started = std::time::Instant::now();
    for plan in &rounds {
        let limit = plan.window + Duration::from_secs(180);
        let s = match tokio::time::timeout(limit, round::run(config.seed, plan)).await {
            Ok(s) => s,
            Err(_) => panic!("round {} did not finish within {limit:?}", plan.index),
        };
        total.faults += s.faults;
        total.grants += s.grants;
        total.overlaps += s.overlaps;
        total.regressions += s.regressions;
        total.stale += s.stale;
        total.stuck += s.stuck;
        total.other += s.other;
        total.documented += s.documented;
        total.wrong_flagged += s.wrong_flagged;
    }
    eprintln!(
        "nemesis: {:.0} s; {} findings the docs allow; {} other violations (writes outside use, a broken register, Lost without a cause)",
        started.elapsed().as_secs_f64(),
        total.documented,
        total.other
    );
    let t = &total;
    let line = format!(
        "nemesis seed={}: {} faults, {} grants, {} overlaps, {} token regressions, {} stale writes accepted, stuck {}",
        config.seed, t.faults, t.grants, t.overlaps, t.regressions, t.stale, t.stuck
    );
    if config.self_check {
        match t.wrong_flagged {
            0 => eprintln!("self-check FAILED: the checker did not flag the wrong client"),
            n => eprintln!("self-check: the checker flagged the wrong client ({n} violations)"),
        }
        println!("{line}");
        return t.wrong_flagged > 0;
    }
    println!("{line}");
    t.overlaps + t.regressions + t.stale + t.stuck + t.other == 0
}
