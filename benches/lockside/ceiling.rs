//! Phase 13 (`ceiling`, only when asked for: `--phases ceiling`): the fleet's ceiling.
//! One redis-server is driven as hard as this machine can through Lockside (the
//! sessions spread over `--ceiling-sidecars` sidecar processes, each session cycling
//! acquire→release on a key of its own, back to back) and, in the same run, through the
//! classic recipe (`SET NX PX` + a compare-and-delete EVALSHA, as many clients as
//! sessions, each with a connection of its own), at 1, 16 and 64 concurrent sessions.
//! For each: cycles/s, Redis CPU per cycle (/proc/PID/task/*/schedstat of
//! redis-server), Redis commands per cycle (`INFO commandstats`, those run inside
//! scripts counted too), Redis' CPU in % of a core (how close it came to saturation),
//! the sidecars' CPU per cycle and p50; every figure beside the classic recipe's, as
//! medians over `--ceiling-rounds` rounds (the two sides alternate in each round, so
//! drift in the machine's load falls on both) with the ranges in the notes. Redis'
//! CPU per cycle is what sizes a Redis: one core serves 10⁶ / that many cycles a
//! second, two lock operations each. A last point has 64 sessions take a new key every
//! cycle (a lock per order, per user: every grant is its session's first of its key,
//! so its record gets a line, and loses it, in every cycle), beside 64 classic clients
//! doing the same.

use std::time::Duration;

use tokio::time::Instant;
use tonic::transport::Channel;

use super::harness::args::BenchArgs;
use super::harness::classic::{Classic, classic_fresh_until, classic_until};
use super::harness::context::sub_namespace;
use super::harness::load::{cycles, fresh_cycles, n_cycles, nth_key, timed};
use super::harness::meter::{Meter, Spent};
use super::harness::process::{Sidecar, Spawn, cpu_ns_all, stop_all};
use super::harness::report::{Report, Table};
use super::harness::rows::{Row, Rule};
use super::harness::session::Session;

/// One point: concurrent sessions (and classic clients), and whether each cycle takes a
/// new key.
#[derive(Clone, Copy, Debug)]
pub(super) struct Load {
    pub(super) sessions: usize,
    pub(super) fresh: bool,
}

/// The points, in order.
pub(super) const POINTS: [Load; 4] = [
    Load::same(1),
    Load::same(16),
    Load::same(64),
    Load {
        sessions: 64,
        fresh: true,
    },
];

impl Load {
    const fn same(sessions: usize) -> Self {
        Self {
            sessions,
            fresh: false,
        }
    }

    fn name(self) -> String {
        let n = self.sessions;
        if self.fresh {
            format!("{n} sessions, a new key each cycle")
        } else {
            format!("{n} sessions")
        }
    }

    /// The key of cycle `i` of one session or client whose own key is `key`.
    fn key(self, key: &str, i: u64) -> std::borrow::Cow<'_, str> {
        if self.fresh {
            nth_key(key, i).into()
        } else {
            key.into()
        }
    }
}
/// Unmeasured cycles per session or client before a point.
const WARM: u64 = 20;

const CPU_1: Row = Row::new(
    "ceiling1_redis_cpu_us",
    "ceiling, 1 session: Redis CPU/cycle (µs) vs classic",
)
.target("≤ 1.1×", Rule::RatioAtMost(1.1));
const CPU_16: Row = Row::new(
    "ceiling16_redis_cpu_us",
    "ceiling, 16 sessions: Redis CPU/cycle (µs) vs classic",
)
.target("≤ 0.3×", Rule::RatioAtMost(0.3));
const CPU_64: Row = Row::new(
    "ceiling64_redis_cpu_us",
    "ceiling, 64 sessions: Redis CPU/cycle (µs) vs classic",
)
.target("≤ 0.3×", Rule::RatioAtMost(0.3));
const RATE_64: Row = Row::new(
    "ceiling64_per_s",
    "ceiling, 64 sessions: cycles/s vs classic clients",
)
.target("≥ 2×", Rule::RatioAtLeast(2.0));
const CPU_FRESH: Row = Row::new(
    "ceiling64_fresh_redis_cpu_us",
    "ceiling, 64 sessions, new keys: Redis CPU/cycle (µs) vs classic",
);
const SIDECAR_64: Row = Row::new(
    "ceiling64_sidecars_cpu_us",
    "ceiling, 64 sessions: sidecars' CPU/cycle (µs) vs Redis' classic",
)
.target("≤ 2×", Rule::RatioAtMost(2.0));

/// The lines of the main table this phase fills, in order.
pub(super) const ROWS: &[Row] = &[CPU_1, CPU_16, CPU_64, RATE_64, SIDECAR_64, CPU_FRESH];

/// Flags of the ceiling phase.
#[derive(Clone, Copy, Debug)]
pub(super) struct CeilingArgs {
    /// Sidecar processes the sessions are spread over.
    pub(super) sidecars: usize,
    /// Seconds per point and side.
    pub(super) seconds: u64,
    /// Rounds, each every point on both sides.
    pub(super) rounds: u32,
}

/// One side of one point in one round.
#[derive(Clone, Copy, Debug, Default)]
struct Side {
    per_s: f64,
    /// Redis CPU per cycle, µs; `None` when Redis is not on this machine.
    redis_us: Option<f64>,
    /// Redis CPU in % of a core over the window.
    redis_pct: Option<f64>,
    calls: f64,
    /// The sidecars' CPU per cycle, µs (none for the classic recipe).
    sidecars_us: Option<f64>,
    p50_us: f64,
}

/// Every round's sides of one point, and the commands of all its rounds.
#[derive(Default)]
struct Point {
    lockside: Vec<Side>,
    classic: Vec<Side>,
    lockside_stats: Spent,
    classic_stats: Spent,
}

/// Runs the phase and records its lines, its table and its notes.
pub(super) async fn run(
    args: &BenchArgs,
    ceiling: CeilingArgs,
    tag: &str,
    report: &mut Report,
) -> Result<(), String> {
    if args.redis.contains("+cluster://") {
        report
            .notes
            .push("ceiling phase skipped: the classic recipe needs a standalone --redis".into());
        return Ok(());
    }
    let mut meter = Meter::connect(&args.redis).await?;
    report.notes.extend(meter.procs.note());
    let ns = sub_namespace(tag, "ceiling");
    let mut spawned = Vec::new();
    let mut channels = Vec::new();
    let result = async {
        for _ in 0..ceiling.sidecars.max(1) {
            let (sidecar, channel) = Sidecar::spawn_with(&Spawn::new(args, ns.clone())).await?;
            spawned.push(sidecar);
            channels.push(channel);
        }
        let pids: Vec<u32> = spawned.iter().filter_map(Sidecar::pid).collect();
        let seconds = Duration::from_secs(ceiling.seconds);
        let mut points: Vec<Point> = POINTS.iter().map(|_| Point::default()).collect();
        for round in 0..ceiling.rounds {
            for (i, &load) in POINTS.iter().enumerate() {
                eprintln!("bench: phase 13: ceiling, round {round}, {}", load.name());
                let point = &mut points[i];
                // The side that goes first alternates from round to round.
                for lockside_first in [round % 2 == 0, round % 2 == 1] {
                    if lockside_first {
                        let (side, stats) =
                            lockside(&mut meter, &channels, &pids, &ns, load, seconds).await?;
                        point.lockside.push(side);
                        merge(&mut point.lockside_stats, stats);
                    } else {
                        let (side, stats) =
                            classic(&mut meter, &args.redis, &ns, load, seconds).await?;
                        point.classic.push(side);
                        merge(&mut point.classic_stats, stats);
                    }
                }
            }
        }
        figures(&points, ceiling, report);
        Ok(())
    }
    .await;
    report.notes.extend(stop_all(spawned).await);
    result
}

/// `load.sessions` sessions spread over the sidecars, each cycling on a key of its own
/// (a new one each cycle when `load.fresh`).
async fn lockside(
    meter: &mut Meter,
    channels: &[Channel],
    pids: &[u32],
    ns: &str,
    load: Load,
    seconds: Duration,
) -> Result<(Side, Spent), String> {
    let n = load.sessions;
    let mut sessions = Vec::with_capacity(n);
    for i in 0..n {
        let mut s = Session::open(channels[i % channels.len()].clone()).await?;
        let key = format!("{ns}/s{n}{}/{i}", if load.fresh { "f" } else { "" });
        for cycle in 0..WARM {
            n_cycles(&mut s, &load.key(&key, cycle), 1).await?;
        }
        sessions.push((s, key));
    }
    let before = meter.reading(None).await?;
    let sidecars_before = cpu_ns_all(pids)?;
    let started = Instant::now();
    let stats = timed(
        sessions,
        seconds,
        "ceiling cycles",
        move |(mut s, key), until| async move {
            match load.fresh {
                true => fresh_cycles(&mut s, &key, WARM, until).await,
                false => cycles(&mut s, &key, until).await,
            }
        },
    )
    .await?;
    let window = started.elapsed();
    let sidecars = cpu_ns_all(pids)?.saturating_sub(sidecars_before);
    let after = meter.reading(None).await?;
    let mut spent = Spent::default();
    let done = (stats.rate * window.as_secs_f64()).round() as u64;
    meter.spent(&mut spent, done, before, after);
    let mut side = side(&spent, window, stats.rate, stats.p50);
    side.sidecars_us = Some(sidecars as f64 / 1e3 / done.max(1) as f64);
    Ok((side, spent))
}

/// `load.sessions` classic clients, each with a connection of its own and a key of its
/// own (a new one each cycle when `load.fresh`).
async fn classic(
    meter: &mut Meter,
    url: &str,
    ns: &str,
    load: Load,
    seconds: Duration,
) -> Result<(Side, Spent), String> {
    let n = load.sessions;
    let ttl = Duration::from_secs(10);
    let mut clients = Vec::with_capacity(n);
    for i in 0..n {
        let mut c = Classic::connect(url).await?;
        let key = format!("{ns}/c{n}{}/{i}", if load.fresh { "f" } else { "" });
        for cycle in 0..WARM {
            c.cycles(&load.key(&key, cycle), 1, ttl, None).await?;
        }
        clients.push((c, key));
    }
    let before = meter.reading(None).await?;
    let started = Instant::now();
    let stats = timed(
        clients,
        seconds,
        "classic cycles",
        move |(c, key), until| async move {
            match load.fresh {
                true => classic_fresh_until(c, key, WARM, until).await,
                false => classic_until(c, key, until).await,
            }
        },
    )
    .await?;
    let window = started.elapsed();
    let after = meter.reading(None).await?;
    let mut spent = Spent::default();
    let done = (stats.rate * window.as_secs_f64()).round() as u64;
    meter.spent(&mut spent, done, before, after);
    Ok((side(&spent, window, stats.rate, stats.p50), spent))
}

fn side(spent: &Spent, window: Duration, per_s: f64, p50: Duration) -> Side {
    Side {
        per_s,
        redis_us: spent.per_cycle_us(spent.redis_ns),
        redis_pct: spent
            .redis_ns
            .map(|ns| ns as f64 / window.as_nanos() as f64 * 100.0),
        calls: spent.stats.calls() as f64 / spent.cycles.max(1) as f64,
        sidecars_us: None,
        p50_us: p50.as_secs_f64() * 1e6,
    }
}

/// Adds one round's commands (and cycles) to a point's.
fn merge(into: &mut Spent, spent: Spent) {
    into.cycles += spent.cycles;
    into.stats.merge(&spent.stats);
}

/// The median of `values` (the lower middle of an even count); `None` when empty.
fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    values.get(values.len().saturating_sub(1) / 2).copied()
}

/// Median and range of one figure over the rounds, as text.
fn spread(values: &[f64]) -> String {
    let (lo, hi) = values
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
    match median(values.to_vec()) {
        Some(m) => format!("{m:.2} ({lo:.2}–{hi:.2})"),
        None => "n/a".into(),
    }
}

/// Each round's Lockside figure over its classic one.
fn ratios(point: &Point, f: fn(&Side) -> Option<f64>) -> Vec<f64> {
    let pairs = point.lockside.iter().zip(&point.classic);
    pairs
        .filter_map(|(l, c)| f(l).zip(f(c).filter(|c| *c > 0.0)).map(|(l, c)| l / c))
        .collect()
}

/// The main table's lines, the phase's table, the commandstats of 64 sessions, notes.
fn figures(points: &[Point], ceiling: CeilingArgs, report: &mut Report) {
    let med =
        |sides: &[Side], f: fn(&Side) -> Option<f64>| median(sides.iter().filter_map(f).collect());
    let cpu = |s: &Side| s.redis_us;
    let rate = |s: &Side| Some(s.per_s);
    let mut table = Table::new(
        "ceiling: one Redis, Lockside sessions vs as many classic clients (medians)",
        &[
            "cycles/s",
            "classic /s",
            "ratio",
            "Redis µs/cyc",
            "classic µs",
            "ratio",
            "calls/cyc",
            "classic",
            "Redis %",
            "classic %",
            "sidecars µs",
            "p50 µs",
            "classic p50",
        ],
    );
    for (point, load) in points.iter().zip(POINTS) {
        let (l, c) = (&point.lockside, &point.classic);
        table.row(
            load.name(),
            vec![
                med(l, rate),
                med(c, rate),
                median(ratios(point, rate)),
                med(l, cpu),
                med(c, cpu),
                median(ratios(point, cpu)),
                med(l, |s| Some(s.calls)),
                med(c, |s| Some(s.calls)),
                med(l, |s| s.redis_pct),
                med(c, |s| s.redis_pct),
                med(l, |s| s.sidecars_us),
                med(l, |s| Some(s.p50_us)),
                med(c, |s| Some(s.p50_us)),
            ],
        );
        report.notes.push(format!(
            "ceiling, {}, over {} rounds, median (range): cycles/s {} vs classic {} \
             (ratio {}); Redis µs/cycle {} vs {} (ratio {}); Redis % of a core {} vs {}",
            load.name(),
            l.len(),
            spread(&l.iter().map(|s| s.per_s).collect::<Vec<_>>()),
            spread(&c.iter().map(|s| s.per_s).collect::<Vec<_>>()),
            spread(&ratios(point, rate)),
            spread(&l.iter().filter_map(cpu).collect::<Vec<_>>()),
            spread(&c.iter().filter_map(cpu).collect::<Vec<_>>()),
            spread(&ratios(point, cpu)),
            spread(&l.iter().filter_map(|s| s.redis_pct).collect::<Vec<_>>()),
            spread(&c.iter().filter_map(|s| s.redis_pct).collect::<Vec<_>>()),
        ));
    }
    report.tables.push(table);
    for (row, i) in [(&CPU_1, 0), (&CPU_16, 1), (&CPU_64, 2), (&CPU_FRESH, 3)] {
        let p = &points[i];
        report.put(row, med(&p.lockside, cpu), med(&p.classic, cpu));
    }
    let last = &points[2];
    report.put(
        &RATE_64,
        med(&last.lockside, rate),
        med(&last.classic, rate),
    );
    report.put(
        &SIDECAR_64,
        med(&last.lockside, |s| s.sidecars_us),
        med(&last.classic, cpu),
    );
    for (point, load) in points.iter().zip(POINTS).skip(2) {
        let stats = (&point.lockside_stats, &point.classic_stats);
        report.tables.push(commands(load, stats.0, stats.1));
    }
    report.notes.push(format!(
        "ceiling: {} sidecar processes on one Redis (the sessions round-robin over them), \
         {} s per point and side, {} rounds, the sides alternating which goes first; the \
         classic recipe is SET NX PX + a compare-and-delete EVALSHA, one connection per \
         client; every session and client cycles back to back on a key of its own (a \
         new one each cycle in the last point); \
         Redis CPU from /proc/PID/task/*/schedstat of redis-server; the bench process \
         drives both sides, so on a small machine the clients share Redis' cores",
        ceiling.sidecars, ceiling.seconds, ceiling.rounds
    ));
}

/// `INFO commandstats` per cycle of one point, command by command: where Redis' CPU per
/// cycle goes (calls, and µs inside Redis; a script's µs include its commands').
fn commands(load: Load, lockside: &Spent, classic: &Spent) -> Table {
    let title = format!(
        "ceiling, {}: INFO commandstats per cycle (a script's µs include its commands')",
        load.name()
    );
    let mut table = Table::new(
        &title,
        &[
            "Lockside calls",
            "Lockside µs",
            "classic calls",
            "classic µs",
        ],
    );
    let mut names: Vec<&String> = lockside
        .stats
        .0
        .keys()
        .chain(classic.stats.0.keys())
        .collect();
    names.sort_unstable();
    names.dedup();
    let per = |s: &Spent, name: &str, f: fn(&(u64, u64)) -> u64| {
        Some(s.stats.0.get(name).map_or(0, f) as f64 / s.cycles.max(1) as f64)
    };
    for name in names {
        table.row(
            name.to_uppercase(),
            vec![
                per(lockside, name, |c| c.0),
                per(lockside, name, |c| c.1),
                per(classic, name, |c| c.0),
                per(classic, name, |c| c.1),
            ],
        );
    }
    table
}

#[cfg(test)]
mod tests {
    // Run by tests/bench_units.rs; the bench target itself has no harness, so there
    // the tests below are compiled out and this import goes unused.
    #[allow(unused_imports)]
    use super::*;

    #[test]
    fn medians_and_ratios_pair_the_rounds() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0]), Some(1.0));
        assert_eq!(median(Vec::new()), None);
        let side = |per_s| Side {
            per_s,
            ..Side::default()
        };
        let point = Point {
            lockside: vec![side(10.0), side(30.0)],
            classic: vec![side(5.0), side(10.0)],
            ..Point::default()
        };
        assert_eq!(ratios(&point, |s| Some(s.per_s)), [2.0, 3.0]);
        assert_eq!(spread(&[1.0, 3.0, 2.0]), "2.00 (1.00–3.00)");
    }
}
