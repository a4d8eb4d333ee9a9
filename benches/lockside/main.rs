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
//! Files: this one has the flags, the run and phases 1, 2 and 5; `contend.rs` is
//! phases 3 and 4 (many sessions on one key); `many_locks.rs` is phase 6 with its
//! Redis and process readings; `process.rs` spawns and stops sidecars and reads their
//! CPU and memory from /proc; `redis_side.rs` reads Redis' process, commandstats,
//! memory and keys; `notices.rs` counts release notices as Redis delivers them;
//! `session.rs` is one `Lease` stream as a client drives it; `report.rs` turns samples
//! into the tables and the JSON; `svg.rs` draws the fleet's curves.

mod contend;
mod cost;
mod election;
mod fleet;
mod floor;
mod idle;
mod many_locks;
mod notices;
mod observe;
mod process;
mod redis_side;
mod report;
mod scale;
mod servers;
mod session;
mod svg;
mod watchdog;

use std::fmt::Display;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tonic::transport::Channel;

use contend::{HANDOFFS, PERMITS, SEM_SESSIONS, handoff_phase, semaphore_phase};
use cost::{CostArgs, cost_phase};
use fleet::{FleetArgs, fleet_phase};
use idle::idle_phase;
use lockside::store::redis::RedisStore;
use lockside::store::{Acquired, Claim, Sharing, Store};
use many_locks::hold_phase;
use process::{Sidecar, connect};
use report::{Report, Stats, ms, us};
use scale::{ScaleArgs, scale_phase};
use servers::Servers;
use session::{Session, Want};

/// `wait_timeout` of contended acquires (phases 3 to 5).
const WAIT: Duration = Duration::from_secs(30);
/// TTL of direct grants: the sidecar's default, so both sides do the same work.
const DIRECT_TTL: Duration = Duration::from_secs(10);
/// Timeout of one direct store call, as `lockside serve` defaults to.
const STORE_TIMEOUT: Duration = Duration::from_secs(1);
/// Samples per task at most, so a very fast store cannot grow memory without bound.
const MAX_SAMPLES: usize = 1_000_000;
/// Rounds of phase 5.
const DEATH_ROUNDS: usize = 20;

/// Flags of the benchmark.
#[derive(Debug, Parser)]
#[command(
    name = "lockside-bench",
    about = "Measures a Lockside sidecar against direct Redis calls"
)]
pub struct BenchArgs {
    /// Redis to measure against, directly and through the sidecar.
    #[arg(long, env = "LOCKSIDE_BENCH_REDIS")]
    pub redis: String,

    /// The spawned sidecar's store when it is not --redis: e.g. `redlock://A,B,C` with
    /// A = --redis, to compare Redlock against the standalone baseline in one run.
    #[arg(long, env = "LOCKSIDE_BENCH_STORE")]
    pub store: Option<String>,

    /// A running sidecar (HOST:PORT) on the same Redis. Unset: the bench spawns one.
    #[arg(long, env = "LOCKSIDE_BENCH_SIDECAR")]
    pub sidecar: Option<String>,

    /// Seconds per timed phase: 3 gives thousands of samples even on a slow machine.
    #[arg(long, env = "LOCKSIDE_BENCH_SECONDS", default_value_t = 3,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub seconds: u64,

    /// Locks held in the renewal phase; the targets are set for 10,000.
    #[arg(long, env = "LOCKSIDE_BENCH_LOCKS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub locks: u64,

    /// TTL of the locks held in the renewal phase (renewed every TTL/3); the sidecar's
    /// default TTL by default.
    #[arg(long, env = "LOCKSIDE_BENCH_HOLD_TTL", default_value = "10s",
          value_parser = lockside::parse::parse_duration)]
    pub hold_ttl: Duration,

    /// Also write the JSON result to this file.
    #[arg(long, env = "LOCKSIDE_BENCH_JSON")]
    pub json: Option<PathBuf>,

    /// The phases to run, by name, comma-separated (see the README's Benchmark
    /// section). Every phase but `fleet` by default: the fleet spawns up to 50
    /// sidecars and takes minutes, so it runs only when asked for (`--phases fleet`).
    #[arg(
        long,
        env = "LOCKSIDE_BENCH_PHASES",
        value_enum,
        value_delimiter = ',',
        default_value = "cycles,handoff,semaphore,death,hold,observe,cost,idle,scale,election"
    )]
    pub phases: Vec<Phase>,

    /// `cost`: uncontended cycles per side (sidecar, classic recipe). 2,000 take about
    /// a second per side and give Redis CPU to a few percent.
    #[arg(long, env = "LOCKSIDE_BENCH_COST_CYCLES", default_value_t = 2_000,
          value_parser = clap::value_parser!(u64).range(10..=1_000_000))]
    pub cost_cycles: u64,

    /// `cost`: locks held for the Redis memory per lock.
    #[arg(long, env = "LOCKSIDE_BENCH_COST_LOCKS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(100..=1_000_000))]
    pub cost_locks: u64,

    /// `cost`: distinct keys locked and released before counting the keys left (the
    /// issue's 2,000).
    #[arg(long, env = "LOCKSIDE_BENCH_LEFT_KEYS", default_value_t = 2_000,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub left_keys: u64,

    /// `idle`: sidecars with no session beside the busy one (the 20).
    #[arg(long, env = "LOCKSIDE_BENCH_IDLE_SIDECARS", default_value_t = 20,
          value_parser = clap::value_parser!(u64).range(1..=200))]
    pub idle_sidecars: u64,

    /// `scale`: locks held by one sidecar (issue 13: ≤ 3 % of a core, ≤ 100 MB).
    #[arg(long, env = "LOCKSIDE_BENCH_SCALE_LOCKS", default_value_t = 100_000,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub scale_locks: u64,

    /// `scale`: sessions with one lock each on another sidecar.
    #[arg(long, env = "LOCKSIDE_BENCH_SCALE_SESSIONS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub scale_sessions: u64,

    /// `fleet`: fleet sizes, sidecars on the one Redis, comma-separated.
    #[arg(long, env = "LOCKSIDE_BENCH_FLEET_SIZES", value_delimiter = ',',
          default_value = "5,10,25,50", value_parser = clap::value_parser!(u64).range(1..=200))]
    pub fleet_sizes: Vec<u64>,

    /// `fleet`: uncontended locks per sidecar, one curve each, comma-separated.
    #[arg(long, env = "LOCKSIDE_BENCH_FLEET_LOCKS", value_delimiter = ',',
          default_value = "100,1000", value_parser = clap::value_parser!(u64).range(0..=100_000))]
    pub fleet_locks: Vec<u64>,

    /// `fleet`: seconds per point; 10 spans three renewal periods of the default TTL.
    #[arg(long, env = "LOCKSIDE_BENCH_FLEET_SECONDS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=600))]
    pub fleet_seconds: u64,

    /// `fleet`: draw the curves to this SVG file (the README shows docs/fleet.svg).
    #[arg(long, env = "LOCKSIDE_BENCH_FLEET_SVG")]
    pub fleet_svg: Option<PathBuf>,

    /// Passed by `cargo bench` to every bench target; ignored.
    #[arg(long, hide = true)]
    pub bench: bool,
}

/// The phases, by the names `--phases` takes; README "Benchmark" says what each measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Phase {
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
}

impl Phase {
    /// Its name on the command line and in the JSON.
    pub fn name(self) -> &'static str {
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
        }
    }

    /// Whether it measures the bench's main sidecar (spawned, or `--sidecar`); the
    /// others spawn their own.
    fn on_main_sidecar(self) -> bool {
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
    report.notes.extend(cleanup(&args.redis, &tag).await.err());
    if let Some(store) = args
        .store
        .as_deref()
        .filter(|s| s.starts_with("redlock://"))
    {
        let masters = lockside::store::redlock::master_urls(store).map_err(err("--store"))?;
        for master in masters.iter().filter(|m| **m != args.redis) {
            report.notes.extend(cleanup(master, &tag).await.err());
        }
        report.notes.push(format!(
            "the sidecar used {} (Redis commands per grant count --redis only)",
            lockside::parse::redact(store)
        ));
    }
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

/// Context for an error: `.map_err(err("INFO"))` gives "INFO: <error>".
fn err<E: Display>(what: impl Display) -> impl FnOnce(E) -> String {
    move |e| format!("{what}: {e}")
}

/// The name of run `tag`: the namespace of the spawned sidecar and of the direct store,
/// and the prefix of every key, so that [`cleanup`] finds all of them with one pattern.
fn namespace(tag: &str) -> String {
    format!("bench-{tag}")
}

/// A namespace of run `tag` for one phase's own sidecars (`bench-TAG-PART`): its keys
/// and channels are apart from every other phase's, and [`cleanup`] still finds them.
fn sub_namespace(tag: &str, part: &str) -> String {
    format!("{}-{part}", namespace(tag))
}

fn random_hex(bytes: usize) -> Result<String, String> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).map_err(err("no randomness"))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// Deletes every key of this run: fence counters never expire on their own.
async fn cleanup(url: &str, tag: &str) -> Result<(), String> {
    let mut servers = Servers::connect(url).await?;
    servers
        .unlink_matching(&format!("*{}*", namespace(tag)))
        .await
}

/// Plain connections to the store's data servers, for counters and cleanup.
async fn plain_redis(url: &str) -> Result<Servers, String> {
    Servers::connect(url).await
}

/// What every phase needs.
struct Ctx {
    addr: String,
    channel: Channel,
    store: Arc<RedisStore>,
    redis_url: String,
    seconds: Duration,
    namespace: String,
}

impl Ctx {
    fn key(&self, name: impl Display) -> String {
        format!("{}/{name}", self.namespace)
    }

    async fn sessions(&self, n: usize) -> Result<Vec<Session>, String> {
        let mut sessions = Vec::with_capacity(n);
        for _ in 0..n {
            sessions.push(Session::open(self.channel.clone()).await?);
        }
        Ok(sessions)
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
    let store = RedisStore::new(&args.redis, &namespace(tag), STORE_TIMEOUT);
    let ctx = Ctx {
        addr: sidecar.addr.clone(),
        channel,
        store: Arc::new(store.map_err(err("--redis"))?),
        redis_url: args.redis.clone(),
        seconds: Duration::from_secs(args.seconds),
        namespace: namespace(tag),
    };
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

/// Waits for every task; a failed or panicked one fails the phase.
async fn join_all<T: Send + 'static>(
    mut set: JoinSet<Result<T, String>>,
) -> Result<Vec<T>, String> {
    let mut all = Vec::new();
    while let Some(joined) = set.join_next().await {
        all.push(joined.map_err(err("bench task"))??);
    }
    Ok(all)
}

/// Whether a sampling loop goes on: until `until`, and for at most [`MAX_SAMPLES`].
fn sampling(until: Instant, samples: &[Duration]) -> bool {
    Instant::now() < until && samples.len() < MAX_SAMPLES
}

/// Spawns `task(item, until)` for every item, with one window of `seconds` from now for
/// all, and pools their samples; the rate is over the time the tasks actually took.
async fn timed<T, F, Fut>(
    items: impl IntoIterator<Item = T>,
    seconds: Duration,
    what: &str,
    mut task: F,
) -> Result<Stats, String>
where
    F: FnMut(T, Instant) -> Fut,
    Fut: Future<Output = Result<Vec<Duration>, String>> + Send + 'static,
{
    let (start, mut set) = (Instant::now(), JoinSet::new());
    for item in items {
        set.spawn(task(item, start + seconds));
    }
    Stats::new(join_all(set).await?.concat(), start.elapsed(), what)
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

/// Acquire→release cycles on one session until `until`; one sample per cycle.
async fn cycles(s: &mut Session, key: &str, until: Instant) -> Result<Vec<Duration>, String> {
    let mut samples = Vec::new();
    while sampling(until, &samples) {
        let start = Instant::now();
        let id = s.acquire(key, None, None).await?;
        s.wait_for(id, Want::Granted).await?;
        let id = s.release(key).await?;
        s.wait_for(id, Want::Released).await?;
        samples.push(start.elapsed());
    }
    Ok(samples)
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
