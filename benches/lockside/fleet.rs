//! Phase 11 (`fleet`, only when asked for: `--phases fleet`): many sidecar processes
//! on one Redis, as in a deployment with a sidecar in every pod. Every sidecar holds
//! `L` uncontended locks (renewed), and a fixed contended load runs across them:
//! [`HOT_KEYS`] keys, each wanted by [`CONTENDERS`] sessions on different sidecars,
//! paced by [`PACE`]. For every fleet size N of `--fleet-sizes` and every `L` of
//! `--fleet-locks`: Redis CPU, Redis memory above where it stood before the fleet,
//! release notices delivered per release, handoff p50/p99, and the sidecars' CPU all
//! together. The contended load stays the same as N grows, so what grows with N is
//! what the fleet itself costs: an operator can read off how big a Redis a fleet needs.
//!
//! The curves are drawn to `--fleet-svg` (the README shows `docs/fleet.svg`).

use std::path::PathBuf;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;
use tonic::transport::Channel;

use super::harness::args::BenchArgs;
use super::harness::contention::{LastRelease, Pace, contend, pool};
use super::harness::context::{DIRECT_TTL, err, plain_redis, sub_namespace};
use super::harness::load::join_all;
use super::harness::locks::take_locks;
use super::harness::notices::{NoticeTap, Tally};
use super::harness::process::{Sidecar, Spawn, cpu_ns_all, stop_all};
use super::harness::redis_side::{RedisProcs, used_memory};
use super::harness::report::{Report, Stats, Table};
use super::harness::servers::Servers;
use super::harness::session::{Ask, Session};
use super::harness::svg::{Chart, Panel, Series, render};

/// Contended keys.
const HOT_KEYS: usize = 4;
/// Sessions wanting each contended key, on as many different sidecars as there are.
const CONTENDERS: usize = 4;
/// A contender holds its grant 10 ms (a short critical section) and rests 10 ms before
/// asking again, so that waiters on other sidecars win the next grant and the load
/// stays far below what the machine can do: what grows is the fleet's cost.
const PACE: Pace = Pace {
    hold: Duration::from_millis(10),
    rest: Duration::from_millis(10),
};

/// Flags of the fleet phase.
#[derive(Clone, Debug)]
pub(super) struct FleetArgs {
    /// Fleet sizes, ascending: sidecars are added to reach each.
    pub(super) sizes: Vec<usize>,
    /// Uncontended locks per sidecar, one curve each.
    pub(super) locks: Vec<u64>,
    /// Seconds per point: at least three renewal periods of the default TTL (10 s).
    pub(super) seconds: u64,
    /// Where to write the SVG.
    pub(super) svg: Option<PathBuf>,
}

/// One fleet size with one lock count.
#[derive(Clone, Debug, Default)]
struct Point {
    sidecars: usize,
    locks_each: u64,
    /// Redis CPU in % of a core; `None` when Redis is not on this machine.
    redis_cpu: Option<f64>,
    /// `used_memory` above the reading before the fleet, in MB.
    redis_mb: f64,
    notices_per_release: Option<f64>,
    handoff_p50_ms: f64,
    handoff_p99_ms: f64,
    releases_per_s: f64,
    /// Every sidecar's CPU together, in % of a core.
    sidecars_cpu: f64,
    /// Why notices per release are n/a, if they are on a standalone Redis.
    notices_note: Option<String>,
}

/// Runs phase 11 and records its table, and draws the SVG.
pub(super) async fn run(
    args: &BenchArgs,
    fleet: &FleetArgs,
    tag: &str,
    report: &mut Report,
) -> Result<(), String> {
    let mut servers = plain_redis(&args.redis).await?;
    let procs = RedisProcs::find(&mut servers).await?;
    let mut points = Vec::new();
    for (curve, &locks) in fleet.locks.iter().enumerate() {
        // A namespace per curve: what one curve left behind is not in the next's keys.
        let ns = sub_namespace(tag, &format!("fleet{curve}"));
        let base = used_memory(&mut servers).await?;
        let mut fleet_now = Fleet::default();
        let result = async {
            for &n in &fleet.sizes {
                eprintln!("bench: phase 11: fleet, {n} sidecars, {locks} locks each");
                fleet_now.grow(args, &ns, n, locks).await?;
                let mut probe = Probe {
                    servers: &mut servers,
                    procs: &procs,
                    base,
                };
                let point = probe.point(args, &fleet_now, &ns, fleet.seconds).await?;
                points.push(Point {
                    locks_each: locks,
                    ..point
                });
            }
            Ok::<_, String>(())
        }
        .await;
        drop(fleet_now.holders);
        report.notes.extend(stop_all(fleet_now.sidecars).await);
        result?;
    }
    report.tables.push(table(&points));
    report
        .notes
        .extend(points.iter().find_map(|p| p.notices_note.clone()));
    report.notes.push(format!(
        "fleet: every sidecar holds its locks (TTL {DIRECT_TTL:?}); {HOT_KEYS} hot keys × \
         {CONTENDERS} sessions spread over the sidecars, holding {:?} and resting {:?}; \
         {} s per point; Redis memory is used_memory above the reading before each \
         curve's first sidecar",
        PACE.hold, PACE.rest, fleet.seconds
    ));
    report.notes.extend(procs.note());
    if let Some(path) = &fleet.svg {
        std::fs::write(path, render(&chart(&points, fleet))).map_err(err(path.display()))?;
        report
            .notes
            .push(format!("fleet curves drawn to {}", path.display()));
    }
    Ok(())
}

/// The sidecars of one curve and the sessions that hold their locks.
#[derive(Default)]
struct Fleet {
    sidecars: Vec<Sidecar>,
    channels: Vec<Channel>,
    holders: Vec<Session>,
}

impl Fleet {
    /// Spawns sidecars until there are `n`, each taking `locks` locks of its own.
    async fn grow(
        &mut self,
        args: &BenchArgs,
        ns: &str,
        n: usize,
        locks: u64,
    ) -> Result<(), String> {
        while self.sidecars.len() < n {
            let i = self.sidecars.len();
            let (sidecar, channel) = Sidecar::spawn_with(&Spawn::new(args, ns.to_owned())).await?;
            self.sidecars.push(sidecar);
            let keys = (0..locks).map(|k| format!("{ns}/s{i}/{k}")).collect();
            self.holders
                .extend(take_locks(&channel, keys, DIRECT_TTL).await?.all()?);
            self.channels.push(channel);
        }
        Ok(())
    }

    fn pids(&self) -> Vec<u32> {
        self.sidecars.iter().filter_map(Sidecar::pid).collect()
    }
}

/// Readings of Redis for one point.
struct Probe<'a> {
    servers: &'a mut Servers,
    procs: &'a RedisProcs,
    /// `used_memory` before the curve's first sidecar.
    base: u64,
}

impl Probe<'_> {
    /// Runs the contended load for `seconds` on `fleet` and measures it.
    async fn point(
        &mut self,
        args: &BenchArgs,
        fleet: &Fleet,
        ns: &str,
        seconds: u64,
    ) -> Result<Point, String> {
        let n = fleet.channels.len();
        let mut sessions = Vec::with_capacity(HOT_KEYS * CONTENDERS);
        for i in 0..HOT_KEYS * CONTENDERS {
            sessions.push(Session::open(fleet.channels[i % n].clone()).await?);
        }
        let tap = NoticeTap::start(&args.redis, ns).await?;
        let pids = fleet.pids();
        let (redis_before, sidecars_before) = (self.procs.cpu_ns()?, cpu_ns_all(&pids)?);
        let lasts: Vec<LastRelease> = (0..HOT_KEYS).map(|_| LastRelease::default()).collect();
        let (start, mut set) = (Instant::now(), JoinSet::new());
        let until = start + Duration::from_secs(seconds);
        for (i, session) in sessions.into_iter().enumerate() {
            // Session i wants hot key i % HOT_KEYS, so a key's contenders sit on
            // different sidecars whenever there are enough of them.
            let hot = i % HOT_KEYS;
            let key = format!("{ns}/hot/{hot}");
            let last = lasts[hot].clone();
            set.spawn(contend(session, i, key, Ask::default(), until, last, PACE));
        }
        let (seen, sessions) = pool(join_all(set).await?);
        let window = start.elapsed();
        let (redis_after, sidecars_after) = (self.procs.cpu_ns()?, cpu_ns_all(&pids)?);
        let memory = used_memory(self.servers).await?;
        let tally = match tap {
            Some(tap) => Some(tap.finish().await?),
            None => None,
        };
        drop(sessions);

        let percent = |ns: u64| ns as f64 / window.as_nanos() as f64 * 100.0;
        let redis = redis_before
            .zip(redis_after)
            .map(|(b, a)| a.saturating_sub(b));
        let stats = Stats::new(seen.samples, window, "fleet handoffs")?;
        Ok(Point {
            sidecars: n,
            locks_each: 0,
            redis_cpu: redis.map(percent),
            redis_mb: memory.saturating_sub(self.base) as f64 / 1048576.0,
            notices_per_release: tally.and_then(|t| t.per_release(seen.grants)),
            handoff_p50_ms: stats.p50.as_secs_f64() * 1e3,
            handoff_p99_ms: stats.p99.as_secs_f64() * 1e3,
            releases_per_s: seen.grants as f64 / window.as_secs_f64(),
            sidecars_cpu: percent(sidecars_after.saturating_sub(sidecars_before)),
            notices_note: tally.and_then(Tally::note),
        })
    }
}

/// The points as a table.
fn table(points: &[Point]) -> Table {
    let mut table = Table::new(
        "fleet: N sidecars on one Redis, L uncontended locks each, 4 hot keys contended",
        &[
            "Redis CPU %",
            "Redis MB",
            "notices/rel",
            "handoff p50 ms",
            "handoff p99 ms",
            "releases/s",
            "sidecars CPU %",
        ],
    );
    for p in points {
        table.row(
            format!("N={} L={}", p.sidecars, p.locks_each),
            vec![
                p.redis_cpu,
                Some(p.redis_mb),
                p.notices_per_release,
                Some(p.handoff_p50_ms),
                Some(p.handoff_p99_ms),
                Some(p.releases_per_s),
                Some(p.sidecars_cpu),
            ],
        );
    }
    table
}

/// The curves: one panel per figure, one line per lock count (p99 dashed beside p50).
fn chart(points: &[Point], fleet: &FleetArgs) -> Chart {
    let name = |locks: u64| format!("{locks} locks per sidecar");
    let curve = |locks: u64, f: &dyn Fn(&Point) -> Option<f64>| -> Vec<(f64, f64)> {
        let mine = points.iter().filter(|p| p.locks_each == locks);
        mine.map(|p| (p.sidecars as f64, f(p).unwrap_or(f64::NAN)))
            .collect()
    };
    let panel = |title: &str, f: &dyn Fn(&Point) -> Option<f64>| Panel {
        title: title.into(),
        series: fleet
            .locks
            .iter()
            .enumerate()
            .map(|(i, &locks)| Series {
                name: name(locks),
                points: curve(locks, f),
                colour: i,
                dashed: false,
            })
            .collect(),
    };
    let mut handoff = panel("Handoff p50 (solid) and p99 (dashed), ms", &|p| {
        Some(p.handoff_p50_ms)
    });
    for (i, &locks) in fleet.locks.iter().enumerate() {
        handoff.series.push(Series {
            name: format!("p99, {}", name(locks)),
            points: curve(locks, &|p| Some(p.handoff_p99_ms)),
            colour: i,
            dashed: true,
        });
    }
    Chart {
        title: "Lockside fleet on one Redis".into(),
        subtitle: format!(
            "every sidecar holds its locks (TTL {}s); {HOT_KEYS} hot keys, {CONTENDERS} \
             sessions each on different sidecars, hold {} ms, rest {} ms; {} s per point",
            DIRECT_TTL.as_secs(),
            PACE.hold.as_millis(),
            PACE.rest.as_millis(),
            fleet.seconds
        ),
        x_label: "sidecars on the Redis".into(),
        legend: panels_legend(fleet, &name),
        panels: vec![
            panel("Redis CPU, % of a core", &|p| p.redis_cpu),
            panel("Redis memory above empty, MB", &|p| Some(p.redis_mb)),
            panel("Notices delivered per release", &|p| p.notices_per_release),
            handoff,
            panel("Sidecars' CPU together, % of a core", &|p| {
                Some(p.sidecars_cpu)
            }),
            panel("Releases per second (4 hot keys)", &|p| {
                Some(p.releases_per_s)
            }),
        ],
    }
}

/// The chart's legend: a solid line per lock count, and what a dashed one means.
fn panels_legend(fleet: &FleetArgs, name: &dyn Fn(u64) -> String) -> Vec<Series> {
    let entry = |name: String, colour, dashed| Series {
        name,
        points: Vec::new(),
        colour,
        dashed,
    };
    let mut legend: Vec<Series> = (fleet.locks.iter().enumerate())
        .map(|(i, &locks)| entry(name(locks), i, false))
        .collect();
    legend.push(entry("dashed: handoff p99".into(), 0, true));
    legend
}

#[cfg(test)]
mod tests {
    // Run by tests/bench_units.rs; the bench target itself has no harness, so there
    // the tests below are compiled out and this import goes unused.
    #[allow(unused_imports)]
    use super::*;

    #[test]
    fn a_curve_per_lock_count_and_p99_dashed() {
        let point = |sidecars, locks_each| Point {
            sidecars,
            locks_each,
            redis_cpu: Some(sidecars as f64),
            ..Point::default()
        };
        let points = [
            point(5, 100),
            point(10, 100),
            point(5, 1000),
            point(10, 1000),
        ];
        let fleet = FleetArgs {
            sizes: vec![5, 10],
            locks: vec![100, 1000],
            seconds: 10,
            svg: None,
        };
        let chart = chart(&points, &fleet);
        assert_eq!(chart.panels.len(), 6);
        let cpu = &chart.panels[0];
        assert_eq!(cpu.series.len(), 2);
        assert_eq!(cpu.series[1].points, [(5.0, 5.0), (10.0, 10.0)]);
        let handoff = &chart.panels[3];
        assert_eq!(handoff.series.len(), 4);
        assert!(handoff.series[2].dashed && !handoff.series[0].dashed);
        assert_eq!(chart.legend.len(), 3);
        assert_eq!(table(&points).rows.len(), 4);
    }
}
