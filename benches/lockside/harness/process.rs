//! The sidecar under test as a process: spawning `lockside serve` and stopping it, and
//! reading its CPU time and memory from /proc.

use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::time::{Instant, timeout};
use tonic::transport::{Channel, Endpoint};

use super::args::BenchArgs;
use super::context::{err, namespace};

/// How long a spawned sidecar may take to accept gRPC connections.
const STARTUP: Duration = Duration::from_secs(10);
/// How long a spawned sidecar may take to stop after SIGTERM (its drain takes ≤ 10 s).
const STOP: Duration = Duration::from_secs(15);

/// How to spawn one more sidecar: by default on the bench's store (`--store`, else
/// `--redis`), in `namespace`, without admin listener, traces or extra flags.
pub(crate) struct Spawn {
    /// `LOCKSIDE_STORE`: a URL, or `memory` for the embedded store.
    pub(crate) store: String,
    pub(crate) namespace: String,
    /// `--admin-listen`: HOST:PORT, or `none`.
    pub(crate) admin: String,
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`; `None` exports no traces.
    pub(crate) otlp: Option<String>,
    /// More `lockside serve` flags, e.g. `--max-sessions`.
    pub(crate) extra: Vec<String>,
}

impl Spawn {
    pub(crate) fn new(args: &BenchArgs, namespace: String) -> Self {
        Self {
            store: args.store.clone().unwrap_or_else(|| args.redis.clone()),
            namespace,
            admin: "none".into(),
            otlp: None,
            extra: Vec::new(),
        }
    }
}

/// The sidecar under test: spawned by the bench or given with `--sidecar`.
pub(crate) struct Sidecar {
    /// Its gRPC address, HOST:PORT.
    pub(crate) addr: String,
    /// The spawned process; `None` with `--sidecar`.
    child: Option<Child>,
}

impl Sidecar {
    /// Connects to `--sidecar`, or spawns one on a free loopback port in the run's
    /// namespace and waits until it accepts connections.
    pub(crate) async fn start(args: &BenchArgs, tag: &str) -> Result<(Self, Channel), String> {
        if let Some(addr) = &args.sidecar {
            let sidecar = Self {
                addr: addr.clone(),
                child: None,
            };
            return Ok((sidecar, connect(addr).await?));
        }
        // Any free admin port: the bench does not scrape it, and 7421 may be taken.
        Self::spawn(args, tag, "127.0.0.1:0", None).await
    }

    /// Spawns `lockside serve` with its admin listener at `admin` (or `none`) and,
    /// with `otlp`, traces exported there; no traces otherwise, whatever this
    /// process's environment says.
    pub(crate) async fn spawn(
        args: &BenchArgs,
        tag: &str,
        admin: &str,
        otlp: Option<&str>,
    ) -> Result<(Self, Channel), String> {
        let mut spawn = Spawn::new(args, namespace(tag));
        spawn.admin = admin.to_owned();
        spawn.otlp = otlp.map(str::to_owned);
        Self::spawn_with(&spawn).await
    }

    /// Spawns `lockside serve` as `spawn` says, on a free loopback port, and waits
    /// until it accepts connections.
    pub(crate) async fn spawn_with(spawn: &Spawn) -> Result<(Self, Channel), String> {
        let addr = format!("127.0.0.1:{}", free_port()?);
        let mut command = Command::new(env!("CARGO_BIN_EXE_lockside"));
        command
            .args(["serve", "--listen", &addr, "--namespace", &spawn.namespace])
            .args(["--admin-listen", &spawn.admin])
            .args(&spawn.extra)
            // Through the environment, not argv: a password in the URL stays out of `ps`.
            .env("LOCKSIDE_STORE", &spawn.store)
            // As the image runs it (Dockerfile): two malloc arenas.
            .env("MALLOC_ARENA_MAX", "2")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true);
        if let Some(endpoint) = &spawn.otlp {
            command.env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint);
        }
        if std::env::var_os("RUST_LOG").is_none() {
            command.env("RUST_LOG", "warn");
        }
        let mut child = command.spawn().map_err(err("spawning the sidecar"))?;
        match wait_ready(&addr, &mut child).await {
            Ok(channel) => Ok((
                Self {
                    addr,
                    child: Some(child),
                },
                channel,
            )),
            Err(e) => {
                let _ = child.kill().await;
                Err(e)
            }
        }
    }

    /// The pid of a spawned sidecar, for /proc readings.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// SIGTERM, then SIGKILL if it has not drained in time. A note if it did not stop
    /// cleanly.
    pub(crate) async fn stop(mut self) -> Option<String> {
        let mut child = self.child.take()?;
        let pid = child.id()?.to_string();
        let term = Command::new("kill").args(["-TERM", &pid]).status().await;
        if !matches!(term, Ok(status) if status.success()) {
            let _ = child.kill().await;
            return Some(format!(
                "SIGTERM to the sidecar failed ({term:?}); killed it"
            ));
        }
        match timeout(STOP, child.wait()).await {
            Ok(Ok(status)) if status.success() => None,
            Ok(Ok(status)) => Some(format!("the sidecar exited with {status} on SIGTERM")),
            Ok(Err(e)) => Some(format!("waiting for the sidecar: {e}")),
            Err(_) => {
                let _ = child.kill().await;
                Some(format!(
                    "the sidecar did not stop within {STOP:?}; killed it"
                ))
            }
        }
    }
}

pub(crate) fn free_port() -> Result<u16, String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(err("free port"))?;
    Ok(listener.local_addr().map_err(err("free port"))?.port())
}

/// A new gRPC connection to the sidecar at `addr`.
pub(crate) async fn connect(addr: &str) -> Result<Channel, String> {
    Endpoint::from_shared(format!("http://{addr}"))
        .map_err(err(format!("sidecar address {addr:?}")))?
        .connect_timeout(Duration::from_secs(1))
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(err(format!("connecting to the sidecar at {addr}")))
}

/// Stops every sidecar of `all`, one after another; the notes of those that did not
/// stop cleanly.
pub(crate) async fn stop_all(all: Vec<Sidecar>) -> Vec<String> {
    let mut notes = Vec::new();
    for sidecar in all {
        notes.extend(sidecar.stop().await);
    }
    notes
}

/// Waits until the process `child` accepts gRPC connections at `addr`.
pub(crate) async fn wait_ready(addr: &str, child: &mut Child) -> Result<Channel, String> {
    let deadline = Instant::now() + STARTUP;
    loop {
        if let Some(status) = child.try_wait().map_err(err("sidecar"))? {
            return Err(format!("the sidecar exited at startup ({status})"));
        }
        match connect(addr).await {
            Ok(channel) => return Ok(channel),
            Err(e) if Instant::now() >= deadline => {
                return Err(format!("not ready in {STARTUP:?}: {e}"));
            }
            // Another process's startup has no event to await: poll the port.
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// utime + stime of `pid` in clock ticks ([`user_system_ticks`]).
pub(crate) fn cpu_ticks(pid: u32) -> Result<u64, String> {
    user_system_ticks(pid).map(|(user, system)| user + system)
}

/// utime and stime of `pid` in clock ticks: fields 14 and 15 of /proc/PID/stat, its
/// time in its own code and in the kernel's (system calls: here mostly sockets).
pub(crate) fn user_system_ticks(pid: u32) -> Result<(u64, u64), String> {
    let (path, stat) = read_proc(pid, "stat")?;
    // The command name (field 2) may hold spaces: count the fields after its ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .flat_map(str::parse::<u64>)
        .collect();
    match fields[..] {
        [utime, stime] => Ok((utime, stime)),
        _ => Err(format!("{path}: no utime and stime")),
    }
}

/// CPU time of `pid` in nanoseconds: the first field (time on a CPU) of
/// /proc/PID/task/TID/schedstat, summed over its threads. Nanoseconds, where
/// /proc/PID/stat counts 10 ms ticks: a few thousand lock cycles are well under a
/// second of CPU. A thread that exits inside a window takes its time with it, so this
/// is for long-lived threads (Redis' own, a sidecar's runtime workers).
pub(crate) fn cpu_ns(pid: u32) -> Result<u64, String> {
    let dir = format!("/proc/{pid}/task");
    let mut total = 0;
    for task in std::fs::read_dir(&dir).map_err(err(&dir))? {
        let path = task.map_err(err(&dir))?.path().join("schedstat");
        // A thread that ended since read_dir listed it has nothing more to count.
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        total += schedstat_ns(&text).ok_or(format!("{}: no run time", path.display()))?;
    }
    Ok(total)
}

/// CPU time of every process of `pids` together, in nanoseconds ([`cpu_ns`]).
pub(crate) fn cpu_ns_all(pids: &[u32]) -> Result<u64, String> {
    pids.iter().map(|pid| cpu_ns(*pid)).sum()
}

/// The first field of a schedstat line: nanoseconds spent on a CPU.
pub(crate) fn schedstat_ns(line: &str) -> Option<u64> {
    line.split_whitespace().next()?.parse().ok()
}

/// Resident memory of `pid` in kB: `VmRSS` of /proc/PID/status.
pub(crate) fn rss_kb(pid: u32) -> Result<u64, String> {
    let (path, status) = read_proc(pid, "status")?;
    let rss = status.lines().find_map(|line| line.strip_prefix("VmRSS:"));
    let kb = rss.and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok());
    kb.ok_or(format!("{path}: no VmRSS"))
}

/// The path of /proc/PID/`file`, for error messages, and its contents.
fn read_proc(pid: u32, file: &str) -> Result<(String, String), String> {
    let path = format!("/proc/{pid}/{file}");
    let text = std::fs::read_to_string(&path).map_err(err(&path))?;
    Ok((path, text))
}

/// Clock ticks per second from `getconf CLK_TCK`; Linux's usual 100 if that fails.
pub(crate) async fn clock_ticks() -> f64 {
    let output = Command::new("getconf").arg("CLK_TCK").output().await;
    let ticks = output.ok().and_then(|o| String::from_utf8(o.stdout).ok());
    ticks
        .and_then(|s| s.trim().parse().ok())
        .filter(|t| *t > 0.0)
        .unwrap_or(100.0)
}

#[cfg(test)]
mod tests {
    // Run by tests/bench_units.rs; the bench target itself has no harness, so there
    // the tests below are compiled out and this import goes unused.
    #[allow(unused_imports)]
    use super::*;

    #[test]
    fn schedstat_first_field_is_run_time() {
        assert_eq!(schedstat_ns("75619367 27719275 240\n"), Some(75_619_367));
        assert_eq!(schedstat_ns(""), None);
    }

    #[test]
    fn this_process_has_run() {
        let ns = cpu_ns(std::process::id()).expect("own schedstat");
        assert!(ns > 0);
    }
}
