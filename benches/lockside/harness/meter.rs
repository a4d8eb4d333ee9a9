//! Readings of the Redis servers (commandstats, their processes' CPU) and of one
//! sidecar's CPU around a run, and what the run [`Spent`] per cycle, summed over
//! rounds (the cost phase's sidecar and classic sides).

use super::process::cpu_ns;
use super::redis_side::{CommandStats, RedisProcs};
use super::servers::Servers;

/// The Redis servers of a store URL and their processes.
pub(crate) struct Meter {
    pub(crate) servers: Servers,
    pub(crate) procs: RedisProcs,
}

impl Meter {
    /// Connects to the data servers of `url` and finds their processes.
    pub(crate) async fn connect(url: &str) -> Result<Self, String> {
        let mut servers = Servers::connect(url).await?;
        let procs = RedisProcs::find(&mut servers).await?;
        Ok(Self { servers, procs })
    }

    /// Commandstats, then CPU times; read again after a run, [`Self::spent`] takes the
    /// difference.
    pub(crate) async fn reading(&mut self, pid: Option<u32>) -> Result<Reading, String> {
        let stats = CommandStats::read(&mut self.servers).await?;
        let redis_ns = self.procs.cpu_ns()?;
        let sidecar_ns = pid.map(cpu_ns).transpose()?;
        Ok(Reading {
            stats,
            redis_ns,
            sidecar_ns,
        })
    }

    /// Adds what ran between `before` and `after` (`cycles` cycles) to `into`.
    pub(crate) fn spent(&self, into: &mut Spent, cycles: u64, before: Reading, after: Reading) {
        let diff = |a: Option<u64>, b: Option<u64>| a.zip(b).map(|(a, b)| b.saturating_sub(a));
        // The first reading's INFO is counted by the second (Redis counts a call after
        // running it); the second's own call is not in its reply.
        let own_info = self.servers.0.len() as u64;
        into.add(
            cycles,
            diff(before.redis_ns, after.redis_ns),
            diff(before.sidecar_ns, after.sidecar_ns),
            &before.stats.until(&after.stats, own_info),
        );
    }
}

/// One reading of [`Meter::reading`].
pub(crate) struct Reading {
    stats: CommandStats,
    redis_ns: Option<u64>,
    sidecar_ns: Option<u64>,
}

/// What the Redis servers and one sidecar did over some cycles.
#[derive(Default)]
pub(crate) struct Spent {
    pub(crate) cycles: u64,
    /// Redis CPU, nanoseconds; `None` when Redis is not on this machine.
    pub(crate) redis_ns: Option<u64>,
    /// The sidecar's CPU, nanoseconds (none for the classic recipe).
    pub(crate) sidecar_ns: Option<u64>,
    /// Commands Redis ran.
    pub(crate) stats: CommandStats,
}

impl Spent {
    fn add(
        &mut self,
        cycles: u64,
        redis_ns: Option<u64>,
        sidecar_ns: Option<u64>,
        stats: &CommandStats,
    ) {
        let sum = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (None, b) if self.cycles == 0 => b,
            (a, b) => a.zip(b).map(|(a, b)| a + b),
        };
        self.redis_ns = sum(self.redis_ns, redis_ns);
        self.sidecar_ns = sum(self.sidecar_ns, sidecar_ns);
        self.cycles += cycles;
        self.stats.merge(stats);
    }

    /// Microseconds per cycle of `ns`.
    pub(crate) fn per_cycle_us(&self, ns: Option<u64>) -> Option<f64> {
        ns.filter(|_| self.cycles > 0)
            .map(|ns| ns as f64 / 1e3 / self.cycles as f64)
    }
}

#[cfg(test)]
mod tests {
    // Run by tests/bench_units.rs; the bench target itself has no harness, so there
    // the tests below are compiled out and this import goes unused.
    #[allow(unused_imports)]
    use super::*;

    #[test]
    fn spent_sums_rounds_and_divides_by_cycles() {
        let mut spent = Spent::default();
        let stats = CommandStats::parse("cmdstat_set:calls=100,usec=150\r\n");
        spent.add(100, Some(4_000_000), Some(1_000_000), &stats);
        spent.add(100, Some(5_000_000), Some(3_000_000), &stats);
        assert_eq!(spent.per_cycle_us(spent.redis_ns), Some(45.0));
        assert_eq!(spent.per_cycle_us(spent.sidecar_ns), Some(20.0));
        assert_eq!(spent.stats.calls(), 200);
    }

    #[test]
    fn a_remote_redis_has_no_cpu_figure() {
        let mut spent = Spent::default();
        spent.add(100, None, Some(1_000), &CommandStats::default());
        spent.add(100, None, Some(1_000), &CommandStats::default());
        assert_eq!(spent.per_cycle_us(spent.redis_ns), None);
        assert_eq!(spent.per_cycle_us(spent.sidecar_ns), Some(0.01));
    }
}
