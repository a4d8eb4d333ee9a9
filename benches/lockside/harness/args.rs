//! The flags of the benchmark (`BenchArgs`) and its phases by name (`Phase`).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

/// Flags of the benchmark.
#[derive(Debug, Parser)]
#[command(
    name = "lockside-bench",
    about = "Measures a Lockside sidecar against direct Redis calls"
)]
pub(crate) struct BenchArgs {
    /// Redis to measure against, directly and through the sidecar.
    #[arg(long, env = "LOCKSIDE_BENCH_REDIS")]
    pub(crate) redis: String,

    /// The spawned sidecar's store when it is not --redis: e.g. `redlock://A,B,C` with
    /// A = --redis, to compare Redlock against the standalone baseline in one run.
    #[arg(long, env = "LOCKSIDE_BENCH_STORE")]
    pub(crate) store: Option<String>,

    /// A running sidecar (HOST:PORT) on the same Redis. Unset: the bench spawns one.
    #[arg(long, env = "LOCKSIDE_BENCH_SIDECAR")]
    pub(crate) sidecar: Option<String>,

    /// Seconds per timed phase: 3 gives thousands of samples even on a slow machine.
    #[arg(long, env = "LOCKSIDE_BENCH_SECONDS", default_value_t = 3,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub(crate) seconds: u64,

    /// Locks held in the renewal phase; the targets are set for 10,000.
    #[arg(long, env = "LOCKSIDE_BENCH_LOCKS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub(crate) locks: u64,

    /// TTL of the locks held in the renewal phase (renewed every TTL/3); the sidecar's
    /// default TTL by default.
    #[arg(long, env = "LOCKSIDE_BENCH_HOLD_TTL", default_value = "10s",
          value_parser = lockside::parse::parse_duration)]
    pub(crate) hold_ttl: Duration,

    /// Also write the JSON result to this file.
    #[arg(long, env = "LOCKSIDE_BENCH_JSON")]
    pub(crate) json: Option<PathBuf>,

    /// The phases to run, by name, comma-separated (see the README's Benchmark
    /// section). Every phase but `fleet` and `ceiling` by default: the fleet spawns up
    /// to 50 sidecars and takes minutes, the ceiling saturates the machine, so they run
    /// only when asked for (`--phases fleet`, `--phases ceiling`).
    #[arg(
        long,
        env = "LOCKSIDE_BENCH_PHASES",
        value_enum,
        value_delimiter = ',',
        default_value = "cycles,handoff,semaphore,death,hold,observe,cost,idle,scale,election"
    )]
    pub(crate) phases: Vec<Phase>,

    /// `cost`: uncontended cycles per side (sidecar, classic recipe). 2,000 take about
    /// a second per side and give Redis CPU to a few percent.
    #[arg(long, env = "LOCKSIDE_BENCH_COST_CYCLES", default_value_t = 2_000,
          value_parser = clap::value_parser!(u64).range(10..=1_000_000))]
    pub(crate) cost_cycles: u64,

    /// `cost`: locks held for the Redis memory per lock.
    #[arg(long, env = "LOCKSIDE_BENCH_COST_LOCKS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(100..=1_000_000))]
    pub(crate) cost_locks: u64,

    /// `cost`: distinct keys locked and released before counting the keys left (the
    /// issue's 2,000).
    #[arg(long, env = "LOCKSIDE_BENCH_LEFT_KEYS", default_value_t = 2_000,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub(crate) left_keys: u64,

    /// `idle`: sidecars with no session beside the busy one (the 20).
    #[arg(long, env = "LOCKSIDE_BENCH_IDLE_SIDECARS", default_value_t = 20,
          value_parser = clap::value_parser!(u64).range(1..=200))]
    pub(crate) idle_sidecars: u64,

    /// `scale`: locks held by one sidecar (issue 13: ≤ 3 % of a core, ≤ 100 MB).
    #[arg(long, env = "LOCKSIDE_BENCH_SCALE_LOCKS", default_value_t = 100_000,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub(crate) scale_locks: u64,

    /// `scale`: sessions with one lock each on another sidecar.
    #[arg(long, env = "LOCKSIDE_BENCH_SCALE_SESSIONS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub(crate) scale_sessions: u64,

    /// `fleet`: fleet sizes, sidecars on the one Redis, comma-separated.
    #[arg(long, env = "LOCKSIDE_BENCH_FLEET_SIZES", value_delimiter = ',',
          default_value = "5,10,25,50", value_parser = clap::value_parser!(u64).range(1..=200))]
    pub(crate) fleet_sizes: Vec<u64>,

    /// `fleet`: uncontended locks per sidecar, one curve each, comma-separated.
    #[arg(long, env = "LOCKSIDE_BENCH_FLEET_LOCKS", value_delimiter = ',',
          default_value = "100,1000", value_parser = clap::value_parser!(u64).range(0..=100_000))]
    pub(crate) fleet_locks: Vec<u64>,

    /// `fleet`: seconds per point; 10 spans three renewal periods of the default TTL.
    #[arg(long, env = "LOCKSIDE_BENCH_FLEET_SECONDS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=600))]
    pub(crate) fleet_seconds: u64,

    /// `fleet`: draw the curves to this SVG file (the README shows docs/fleet.svg).
    #[arg(long, env = "LOCKSIDE_BENCH_FLEET_SVG")]
    pub(crate) fleet_svg: Option<PathBuf>,

    /// `ceiling`: sidecar processes the sessions are spread over.
    #[arg(long, env = "LOCKSIDE_BENCH_CEILING_SIDECARS", default_value_t = 4,
          value_parser = clap::value_parser!(u64).range(1..=64))]
    pub(crate) ceiling_sidecars: u64,

    /// `ceiling`: seconds per point (1, 16, 64 sessions) and side.
    #[arg(long, env = "LOCKSIDE_BENCH_CEILING_SECONDS", default_value_t = 2,
          value_parser = clap::value_parser!(u64).range(1..=600))]
    pub(crate) ceiling_seconds: u64,

    /// `ceiling`: rounds, each every point on both sides (medians and ranges over them).
    #[arg(long, env = "LOCKSIDE_BENCH_CEILING_ROUNDS", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pub(crate) ceiling_rounds: u32,

    /// Passed by `cargo bench` to every bench target; ignored.
    #[arg(long, hide = true)]
    pub(crate) bench: bool,
}

/// The phases, by the names `--phases` takes; README "Benchmark" says what each measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Phase {
    /// 1 and 2: uncontended cycles, 1 and 64 sessions, sidecar against direct.
    Cycles,
    /// 3: handoffs on one key, 8 to 64 waiters, unfair and fair.
    Handoff,
    /// 4: 32 sessions on 4 permits.
    Semaphore,
    /// 5: a holder's death to the next grant.
    Death,
    /// 6: `--locks` locks held and renewed.
    Hold,
    /// 7: traces and metrics on against off.
    Observe,
    /// 8: Redis CPU, commands, memory and keys per lock against the classic recipe.
    Cost,
    /// 9: idle sidecars beside a busy one.
    Idle,
    /// 10: 100,000 locks, 10,000 sessions.
    Scale,
    /// 11: N sidecars on one Redis, drawn as curves.
    Fleet,
    /// 12: leader election across two sidecars, with a watcher.
    Election,
    /// 13: one Redis at saturation, Lockside against the classic recipe.
    Ceiling,
}

impl Phase {
    /// Its name on the command line and in the JSON.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Cycles => "cycles",
            Self::Handoff => "handoff",
            Self::Semaphore => "semaphore",
            Self::Death => "death",
            Self::Hold => "hold",
            Self::Observe => "observe",
            Self::Cost => "cost",
            Self::Idle => "idle",
            Self::Scale => "scale",
            Self::Fleet => "fleet",
            Self::Election => "election",
            Self::Ceiling => "ceiling",
        }
    }

    /// Whether it measures the bench's main sidecar (spawned, or `--sidecar`); the
    /// others spawn their own.
    pub(crate) fn on_main_sidecar(self) -> bool {
        matches!(
            self,
            Self::Cycles
                | Self::Handoff
                | Self::Semaphore
                | Self::Death
                | Self::Hold
                | Self::Election
        )
    }
}

#[cfg(test)]
mod tests {
    // Run by tests/bench_units.rs; the bench target itself has no harness, so there
    // the tests below are compiled out and this import goes unused.
    #[allow(unused_imports)]
    use super::*;

    #[test]
    fn every_phase_but_the_fleet_runs_by_default() {
        let args = BenchArgs::try_parse_from(["bench", "--redis", "redis://h:1"]).unwrap();
        assert_eq!(args.phases.len(), 10);
        assert!(!args.phases.contains(&Phase::Fleet));
        assert!(!args.phases.contains(&Phase::Ceiling));
        assert_eq!(args.fleet_sizes, [5, 10, 25, 50]);
        let names: Vec<&str> = args.phases.iter().map(|p| p.name()).collect();
        let value = |p: &Phase| p.to_possible_value().map(|v| v.get_name().to_owned());
        let clap_names: Vec<String> = args.phases.iter().filter_map(value).collect();
        assert_eq!(names, clap_names, "name() is the flag's value");
    }

    #[test]
    fn phases_are_picked_by_name() {
        let parse = |phases| {
            BenchArgs::try_parse_from(["bench", "--redis", "redis://h:1", "--phases", phases])
                .map(|a| a.phases)
        };
        assert_eq!(parse("fleet").unwrap(), [Phase::Fleet]);
        assert_eq!(parse("cost,idle").unwrap(), [Phase::Cost, Phase::Idle]);
        assert!(parse("costs").is_err());
    }
}
