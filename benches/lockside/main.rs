//! The benchmark (`cargo bench --bench lockside -- --redis redis://HOST:PORT`): measures a
//! live sidecar and, in the same run and from the same
//! process, the same Redis called directly with the same Lua scripts (through
//! [`RedisStore`]), so the table shows what the sidecar adds on top of Redis.
//!
//! Phases, each bounded in time and in count, over loopback only:
//! 1. acquire→release cycles on one session (p50, p99, cycles/s), sidecar and direct;
//! 2. the same with 64 concurrent sessions;
//! 3. handoff: 16 sessions contend for one key, then 8 and 64 waiters, unfair and fair;
//!    the next `Granted` minus the time the previous holder sent its `Release`, and
//!    Redis commands per handoff;
//! 4. semaphore: 32 sessions share 4 permits of one key;
//! 5. death to grant: a holder's connection closes while another session waits;
//! 6. `--locks` locks held and renewed: Redis load, sidecar CPU and memory;
//! 7. the cost of traces and metrics: uncontended cycles on a sidecar exporting spans
//!    and scraped, against one with neither (`observe.rs`);
//! 8. leader election across two sidecars: a grant seen by a watcher on the other
//!    sidecar, and a leader process's death to the next grant and to the watcher
//!    (`election.rs`).
//!
//! It is a bench target, not part of the product: the image neither builds nor ships it.
//! Without `--sidecar` the bench spawns `lockside serve` (the binary cargo built beside it) on a free loopback port and
//! stops it with SIGTERM at the end, also after an error.
//!
//! Files: this one has the flags, the run and phases 1, 2 and 5; `contend.rs` is
//! phases 3 and 4 (many sessions on one key); `hold.rs` is phase 6 with its Redis and
//! process readings; `process.rs` spawns and stops the sidecar and reads its CPU and
//! memory from /proc; `session.rs` is one `Lease` stream as a client drives it;
//! `report.rs` turns samples into the table and the JSON.

mod contend;
mod election;
mod many_locks;
mod observe;
mod process;
mod report;
mod servers;
mod session;

use std::fmt::Display;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tonic::transport::Channel;

use contend::{HANDOFFS, PERMITS, SEM_SESSIONS, handoff_phase, semaphore_phase};
use lockside::store::redis::RedisStore;
use lockside::store::{Acquired, Claim, Sharing, Store};
use many_locks::hold_phase;
use process::{Sidecar, connect};
use report::{Report, Stats, ms, us};
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

    /// Passed by `cargo bench` to every bench target; ignored.
    #[arg(long, hide = true)]
    pub bench: bool,
}

fn main() -> std::process::ExitCode {
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
    let (sidecar, channel) = Sidecar::start(&args, &tag).await?;
    let measured = measure(&args, &sidecar, channel, &tag).await;
    let mut notes: Vec<String> = sidecar.stop().await.into_iter().collect();
    notes.extend(cleanup(&args.redis, &tag).await.err());
    if let Some(store) = args
        .store
        .as_deref()
        .filter(|s| s.starts_with("redlock://"))
    {
        let masters = lockside::store::redlock::master_urls(store).map_err(err("--store"))?;
        for master in masters.iter().filter(|m| **m != args.redis) {
            notes.extend(cleanup(master, &tag).await.err());
        }
        notes.push(format!(
            "the sidecar used {} (Redis commands per grant count --redis only)",
            lockside::parse::redact(store)
        ));
    }
    let mut report = measured?;
    report.notes.extend(notes);
    report.print();
    let json = report.json(&args);
    println!("{json}");
    if let Some(path) = &args.json {
        std::fs::write(path, format!("{json}\n")).map_err(err(path.display()))?;
    }
    Ok(())
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

async fn measure(
    args: &BenchArgs,
    sidecar: &Sidecar,
    channel: Channel,
    tag: &str,
) -> Result<Report, String> {
    let store = RedisStore::new(&args.redis, &namespace(tag), STORE_TIMEOUT);
    let ctx = Ctx {
        addr: sidecar.addr.clone(),
        channel,
        store: Arc::new(store.map_err(err("--redis"))?),
        redis_url: args.redis.clone(),
        seconds: Duration::from_secs(args.seconds),
        namespace: namespace(tag),
    };
    let mut report = Report::default();
    eprintln!(
        "bench: sidecar at {}; phase 1/8: cycles, 1 session",
        ctx.addr
    );
    cycle_phase(&ctx, 1, &mut report).await?;
    eprintln!("bench: phase 2/8: cycles, 64 sessions");
    cycle_phase(&ctx, 64, &mut report).await?;
    // Redlock refuses fair queues and semaphores (UNIMPLEMENTED): those phases are left out.
    let redlock = args
        .store
        .as_deref()
        .is_some_and(|s| s.starts_with("redlock://"));
    for run in HANDOFFS {
        if redlock && run.fair {
            continue;
        }
        let fair = if run.fair { "fair" } else { "unfair" };
        let waiters = run.waiters;
        eprintln!("bench: phase 3/8: handoff, {waiters} waiters on one key, {fair}");
        handoff_phase(&ctx, run, &mut report).await?;
    }
    report.notes.push(
        "handoff and semaphore: N waiters are N + 1 sessions on one key; Redis commands \
         per grant count the commands run inside the Lua scripts, each script call is one \
         EVALSHA round trip"
            .into(),
    );
    if redlock {
        report
            .notes
            .push("Redlock: fair handoffs and the semaphore phase are left out (refused)".into());
    } else {
        eprintln!("bench: phase 4/8: semaphore, {SEM_SESSIONS} sessions on {PERMITS} permits");
        semaphore_phase(&ctx, &mut report).await?;
    }
    eprintln!("bench: phase 5/8: death to grant, {DEATH_ROUNDS} rounds");
    death_phase(&ctx, &mut report).await?;
    eprintln!("bench: phase 6/8: {} locks held", args.locks);
    hold_phase(&ctx, args.locks, args.hold_ttl, sidecar.pid(), &mut report).await?;
    if args.sidecar.is_none() {
        eprintln!("bench: phase 7/8: traces and metrics on vs off, uncontended cycles");
        observe::observability_phase(args, tag, &mut report).await?;
    } else {
        report.notes.push(
            "phase 7 (observability cost) needs spawned sidecars: skipped with --sidecar".into(),
        );
    }
    if args.sidecar.is_none() {
        eprintln!(
            "bench: phase 8/8: election, {} grants and {} leader deaths across two sidecars",
            election::GRANT_ROUNDS,
            election::DEATH_ROUNDS
        );
        // Not fatal: a store that cannot carry holder values or tell watchers of
        // changes (the Redis data model before v2) leaves the rest of the run standing.
        if let Err(e) = election::election_phase(args, &ctx, tag, &mut report).await {
            report.notes.push(format!("phase 8 (election) failed: {e}"));
        }
    } else {
        report.notes.push(
            "phase 8 (election) needs a second spawned sidecar: skipped with --sidecar".into(),
        );
    }
    Ok(report)
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
