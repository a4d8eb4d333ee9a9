//! What the bench reads from the Redis servers themselves: their processes' CPU time
//! (when they run on this machine), `INFO commandstats` and `INFO memory`, and the
//! counters of one [`Sample`] (with the sidecar's CPU and memory). The phases
//! take their Redis figures from here, and count a namespace's keys with
//! `Servers::count_matching`.

use std::collections::BTreeMap;

use deadpool_redis::redis::{self, aio::MultiplexedConnection};
use tokio::time::Instant;

use super::context::err;
use super::process::{cpu_ns_all, cpu_ticks, rss_kb};
use super::servers::Servers;

/// The Redis server processes behind a store URL, found on this machine.
pub(crate) enum RedisProcs {
    /// Every master's pid: its CPU time can be read from /proc.
    Local(Vec<u32>),
    /// Why Redis' CPU cannot be read here (the bench prints it as a note).
    Remote(String),
}

impl RedisProcs {
    /// Asks every master for its `process_id` and `tcp_port` (`INFO server`) and keeps
    /// them when that pid is a redis-server on this machine that listens on that port:
    /// a Redis in a container or on another host may report a pid that means nothing,
    /// or something else, here.
    pub(crate) async fn find(servers: &mut Servers) -> Result<Self, String> {
        let mut pids = Vec::new();
        for conn in &mut servers.0 {
            let server = info(conn, "server").await?;
            let (Some(pid), Some(port)) = (
                info_value(&server, "process_id"),
                info_value(&server, "tcp_port"),
            ) else {
                return Ok(Self::Remote(
                    "INFO server has no process_id or tcp_port".into(),
                ));
            };
            if !is_local_redis(pid as u32, port as u16) {
                return Ok(Self::Remote(format!(
                    "the Redis on port {port} (pid {pid}) is not a process of this machine"
                )));
            }
            pids.push(pid as u32);
        }
        Ok(Self::Local(pids))
    }

    /// CPU time of every Redis process, in nanoseconds; `None` when Redis is remote.
    pub(crate) fn cpu_ns(&self) -> Result<Option<u64>, String> {
        match self {
            Self::Local(pids) => Ok(Some(cpu_ns_all(pids)?)),
            Self::Remote(_) => Ok(None),
        }
    }

    /// The note to print when Redis' CPU cannot be read.
    pub(crate) fn note(&self) -> Option<String> {
        match self {
            Self::Local(_) => None,
            Self::Remote(why) => Some(format!("Redis CPU figures are n/a: {why}")),
        }
    }
}

/// Whether `pid` is a redis-server of this machine with a listening socket on `port`.
fn is_local_redis(pid: u32, port: u16) -> bool {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    if !comm.starts_with("redis") {
        return false;
    }
    let sockets = socket_inodes(pid);
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|table| {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        listeners(&text)
            .into_iter()
            .any(|(p, inode)| p == port && sockets.contains(&inode))
    })
}

/// Inodes of the sockets `pid` has open (the targets `socket:[INODE]` of /proc/PID/fd).
fn socket_inodes(pid: u32) -> Vec<u64> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    fds.flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            target
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect()
}

/// (port, inode) of every listening socket in a /proc/net/tcp table: state 0A, the
/// local address as `HEXADDR:HEXPORT`, the inode the tenth column.
fn listeners(table: &str) -> Vec<(u16, u64)> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.get(3) != Some(&"0A") {
                return None;
            }
            let port = cols.get(1)?.rsplit_once(':')?.1;
            let port = u16::from_str_radix(port, 16).ok()?;
            Some((port, cols.get(9)?.parse().ok()?))
        })
        .collect()
}

/// Calls and microseconds of every command Redis ran, from `INFO commandstats`.
/// Commands a script runs are counted under their own names too, and the script's
/// EVALSHA (or FCALL) microseconds include theirs.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct CommandStats(pub(crate) BTreeMap<String, (u64, u64)>);

impl CommandStats {
    /// Sums `INFO commandstats` over every server.
    pub(crate) async fn read(servers: &mut Servers) -> Result<Self, String> {
        let mut all = Self::default();
        for conn in &mut servers.0 {
            all.merge(&Self::parse(&info(conn, "commandstats").await?));
        }
        Ok(all)
    }

    /// Parses `cmdstat_NAME:calls=C,usec=U,...` lines.
    pub(crate) fn parse(info: &str) -> Self {
        let mut stats = BTreeMap::new();
        for line in info.lines() {
            let Some((name, fields)) = line
                .strip_prefix("cmdstat_")
                .and_then(|l| l.split_once(':'))
            else {
                continue;
            };
            let field = |key: &str| {
                fields
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(key)?.trim().parse::<u64>().ok())
            };
            if let (Some(calls), Some(usec)) = (field("calls="), field("usec=")) {
                stats.insert(name.to_owned(), (calls, usec));
            }
        }
        Self(stats)
    }

    /// Adds `other` to this, command by command.
    pub(crate) fn merge(&mut self, other: &Self) {
        for (name, (calls, usec)) in &other.0 {
            let entry = self.0.entry(name.clone()).or_default();
            entry.0 += calls;
            entry.1 += usec;
        }
    }

    /// What ran from this reading to `later`, less `own_info` INFO calls (the
    /// bench's own readings); commands that did not run are left out.
    pub(crate) fn until(&self, later: &Self, own_info: u64) -> Self {
        let mut diff = BTreeMap::new();
        for (name, (calls, usec)) in &later.0 {
            let (c0, u0) = self.0.get(name).copied().unwrap_or_default();
            let mut calls = calls.saturating_sub(c0);
            if name == "info" {
                calls = calls.saturating_sub(own_info);
            }
            if calls > 0 {
                diff.insert(name.clone(), (calls, usec.saturating_sub(u0)));
            }
        }
        Self(diff)
    }

    /// Commands in all (those run inside scripts included).
    pub(crate) fn calls(&self) -> u64 {
        self.0.values().map(|(calls, _)| calls).sum()
    }
}

/// `used_memory` summed over every server, in bytes.
pub(crate) async fn used_memory(servers: &mut Servers) -> Result<u64, String> {
    let mut total = 0;
    for conn in &mut servers.0 {
        let memory = info(conn, "memory").await?;
        total += info_value(&memory, "used_memory").ok_or("INFO memory has no used_memory")?;
    }
    Ok(total)
}

/// The `section` of `INFO` on `conn`.
pub(crate) async fn info(
    conn: &mut MultiplexedConnection,
    section: &str,
) -> Result<String, String> {
    let reply = redis::cmd("INFO").arg(section).query_async(conn).await;
    reply.map_err(err(format!("INFO {section}")))
}

/// The number of the `name:value` line of an INFO reply.
pub(crate) fn info_value(info: &str, name: &str) -> Option<u64> {
    info.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key == name).then(|| value.trim().parse().ok())?
    })
}

/// Adds one command per name to pipelines of a thousand and runs them on `conn`
/// (`what` names the commands in an error).
pub(crate) async fn per_name(
    conn: &mut MultiplexedConnection,
    names: &[String],
    what: &str,
    mut command: impl FnMut(&mut redis::Pipeline, &str) -> Result<(), String>,
) -> Result<(), String> {
    for chunk in names.chunks(1000) {
        let mut pipe = redis::pipe();
        for name in chunk {
            command(&mut pipe, name)?;
        }
        pipe.query_async::<()>(conn).await.map_err(err(what))?;
    }
    Ok(())
}

/// `SET name token PX ttl` for every name, a token from `token` each.
pub(crate) async fn set_px(
    conn: &mut MultiplexedConnection,
    names: &[String],
    ttl: std::time::Duration,
    token: impl Fn() -> Result<String, String>,
) -> Result<(), String> {
    per_name(conn, names, "SET PX", |pipe, name| {
        pipe.cmd("SET")
            .arg(name)
            .arg(token()?)
            .arg("PX")
            .arg(ttl.as_millis() as u64)
            .ignore();
        Ok(())
    })
    .await
}

/// `DEL name` for every name.
pub(crate) async fn delete(
    conn: &mut MultiplexedConnection,
    names: &[String],
) -> Result<(), String> {
    per_name(conn, names, "DEL", |pipe, name| {
        pipe.cmd("DEL").arg(name).ignore();
        Ok(())
    })
    .await
}

/// CPU time between two readings (ns) over `secs`, in % of a core.
pub(crate) fn percent_of_core(before: Option<u64>, after: Option<u64>, secs: f64) -> Option<f64> {
    before
        .zip(after)
        .map(|(b, a)| a.saturating_sub(b) as f64 / 1e9 / secs * 100.0)
}

/// The bench's own INFO calls between two `total_commands_processed` readings.
const OWN_INFO_CALLS: u64 = 2;

/// One reading of Redis counters and of the sidecar process.
pub(crate) struct Sample {
    pub(crate) at: Instant,
    /// The bench's own INFO calls in one reading (two per server).
    own_calls: u64,
    commands: u64,
    evalsha: u64,
    /// Microseconds Redis spent running EVALSHA calls (scripts included).
    evalsha_usec: u64,
    /// The sidecar's CPU time (utime + stime, clock ticks) and RSS, given its pid.
    pub(crate) cpu_ticks: Option<u64>,
    pub(crate) rss_kb: Option<u64>,
}

impl Sample {
    /// Commands Redis processed from this reading to `later`, less the bench's own INFO
    /// calls; it counts every client of that Redis.
    pub(crate) fn commands_until(&self, later: &Sample) -> u64 {
        later
            .commands
            .saturating_sub(self.commands + self.own_calls)
    }

    /// EVALSHA calls from this reading to `later`.
    pub(crate) fn evalsha_until(&self, later: &Sample) -> u64 {
        later.evalsha.saturating_sub(self.evalsha)
    }

    /// Microseconds Redis spent in EVALSHA calls from this reading to `later`.
    pub(crate) fn evalsha_usec_until(&self, later: &Sample) -> u64 {
        later.evalsha_usec.saturating_sub(self.evalsha_usec)
    }
}

/// Reads Redis's command counters (summed over the servers) and, given a pid, the
/// sidecar's CPU time and memory.
pub(crate) async fn sample(redis: &mut Servers, pid: Option<u32>) -> Result<Sample, String> {
    let at = Instant::now();
    let (mut commands, mut evalsha, mut evalsha_usec) = (0, 0, 0);
    for conn in &mut redis.0 {
        let (stats, commandstats) = (
            info(conn, "stats").await?,
            info(conn, "commandstats").await?,
        );
        commands += info_value(&stats, "total_commands_processed")
            .ok_or("INFO stats has no total_commands_processed")?;
        let scripts = CommandStats::parse(&commandstats).0.get("evalsha").copied();
        let (calls, usec) = scripts.unwrap_or_default();
        evalsha += calls;
        evalsha_usec += usec;
    }
    Ok(Sample {
        at,
        own_calls: OWN_INFO_CALLS * redis.0.len() as u64,
        commands,
        evalsha,
        evalsha_usec,
        cpu_ticks: pid.map(cpu_ticks).transpose()?,
        rss_kb: pid.map(rss_kb).transpose()?,
    })
}

#[cfg(test)]
mod tests {
    // Run by tests/bench_units.rs; the bench target itself has no harness, so there
    // the tests below are compiled out and this import goes unused.
    #[allow(unused_imports)]
    use super::*;

    #[test]
    fn commandstats_are_parsed_and_subtracted() {
        const COMMANDSTATS: &str = "# Commandstats\r\n\
            cmdstat_set:calls=10,usec=15,usec_per_call=1.50,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_evalsha:calls=10,usec=60,usec_per_call=6.00,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_info:calls=3,usec=300,usec_per_call=100.00,rejected_calls=0,failed_calls=0\r\n";
        let before = CommandStats::parse(COMMANDSTATS);
        assert_eq!(before.0["set"], (10, 15));
        assert_eq!(before.0["evalsha"], (10, 60));
        let later = COMMANDSTATS
            .replace("set:calls=10,usec=15", "set:calls=30,usec=45")
            .replace("info:calls=3,usec=300", "info:calls=4,usec=400")
            + "cmdstat_get:calls=2,usec=1\r\n";
        let diff = before.until(&CommandStats::parse(&later), 1);
        assert_eq!(diff.0["set"], (20, 30));
        assert_eq!(diff.0["get"], (2, 1));
        assert!(!diff.0.contains_key("evalsha"), "did not run");
        assert!(!diff.0.contains_key("info"), "the bench's own");
        assert_eq!(diff.calls(), 22);
    }

    #[test]
    fn info_values_match_whole_names() {
        let info = "used_memory:1000\r\nused_memory_rss:5000\r\nprocess_id:42\r\n";
        assert_eq!(info_value(info, "used_memory"), Some(1000));
        assert_eq!(info_value(info, "process_id"), Some(42));
        assert_eq!(info_value(info, "used_memory_peak"), None);
    }

    #[test]
    fn listening_sockets_of_a_tcp_table() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
            0: 0100007F:18EB 00000000:0000 0A 00000000:00000000 00:00000000 00000000  0 0 4242 1\n\
            1: 0100007F:C350 0100007F:18EB 01 00000000:00000000 00:00000000 00000000  0 0 4343 1\n";
        assert_eq!(listeners(table), [(6379, 4242)]);
    }
}
