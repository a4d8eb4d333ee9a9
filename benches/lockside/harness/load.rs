//! Load helpers: tasks joined as one, sampling loops bounded in time and in count,
//! uncontended acquire→release cycles on one session, many keys locked and released at
//! once, and the CPU a process spends per cycle.

use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;
use tonic::transport::Channel;

use super::context::err;
use super::process::{cpu_ns, user_system_ticks};
use super::report::Stats;
use super::session::{Session, Want};
use lockside::proto::lease_response::Event as E;

/// Unmeasured cycles before measured ones: scripts loaded, connections and caches warm.
pub(crate) const WARMUP: u64 = 100;
/// Samples per task at most, so a very fast store cannot grow memory without bound.
const MAX_SAMPLES: usize = 1_000_000;

/// Waits for every task; a failed or panicked one fails the phase.
pub(crate) async fn join_all<T: Send + 'static>(
    mut set: JoinSet<Result<T, String>>,
) -> Result<Vec<T>, String> {
    let mut all = Vec::new();
    while let Some(joined) = set.join_next().await {
        all.push(joined.map_err(err("bench task"))??);
    }
    Ok(all)
}

/// Whether a sampling loop goes on: until `until`, and for at most [`MAX_SAMPLES`].
pub(crate) fn sampling(until: Instant, samples: &[Duration]) -> bool {
    Instant::now() < until && samples.len() < MAX_SAMPLES
}

/// Spawns `task(item, until)` for every item, with one window of `seconds` from now for
/// all, and pools their samples; the rate is over the time the tasks actually took.
pub(crate) async fn timed<T, F, Fut>(
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

/// Acquire→release cycles on one session until `until`; one sample per cycle.
pub(crate) async fn cycles(
    s: &mut Session,
    key: &str,
    until: Instant,
) -> Result<Vec<Duration>, String> {
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

/// Cycle `i` of a load that takes a new key every cycle: `key/i`.
pub(crate) fn nth_key(key: &str, i: u64) -> String {
    format!("{key}/{i}")
}

/// Acquire→release cycles on one session until `until`, each on a new key
/// ([`nth_key`], from `first`); one sample per cycle.
pub(crate) async fn fresh_cycles(
    s: &mut Session,
    key: &str,
    first: u64,
    until: Instant,
) -> Result<Vec<Duration>, String> {
    let mut samples = Vec::new();
    for i in first.. {
        if !sampling(until, &samples) {
            break;
        }
        let start = Instant::now();
        n_cycles(s, &nth_key(key, i), 1).await?;
        samples.push(start.elapsed());
    }
    Ok(samples)
}

/// `n` acquire→release cycles of `key` on `s`.
pub(crate) async fn n_cycles(s: &mut Session, key: &str, n: u64) -> Result<(), String> {
    for _ in 0..n {
        let id = s.acquire(key, None, None).await?;
        s.wait_for(id, Want::Granted).await?;
        let id = s.release(key).await?;
        s.wait_for(id, Want::Released).await?;
    }
    Ok(())
}

/// Locks every key of `keys` on `s` with `ttl`, all requests in flight at once, then
/// releases them all; the answers may come in any order.
pub(crate) async fn lock_and_release(
    s: &mut Session,
    keys: &[String],
    ttl: Duration,
) -> Result<(), String> {
    for key in keys {
        s.acquire(key, None, Some(ttl)).await?;
    }
    answers(s, keys.len(), Want::Granted).await?;
    for key in keys {
        s.release(key).await?;
    }
    answers(s, keys.len(), Want::Released).await
}

/// The next `n` events on `s`, each of them a `want`.
async fn answers(s: &mut Session, n: usize, want: Want) -> Result<(), String> {
    for _ in 0..n {
        match (s.event().await?, want) {
            (E::Granted(_), Want::Granted) | (E::Released(_), Want::Released) => {}
            (other, _) => return Err(format!("expected {want:?} for {n} keys, got {other:?}")),
        }
    }
    Ok(())
}

/// A process's CPU per cycle, and the kernel's part of it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Burn {
    /// Microseconds per cycle (schedstat).
    pub(crate) us: f64,
    /// Of which in the kernel: `us` split as /proc/PID/stat's stime and utime are (10 ms
    /// ticks, too coarse to count a cycle but fine for a share of thousands).
    pub(crate) kernel_us: f64,
}

/// The CPU per cycle of the process `pid` serving `channel`: `cycles` cycles after a
/// warm-up, on a session of their own.
pub(crate) async fn burn(
    channel: Channel,
    key: &str,
    pid: u32,
    cycles: u64,
) -> Result<Burn, String> {
    let mut session = Session::open(channel).await?;
    n_cycles(&mut session, key, WARMUP).await?;
    let (ns, ticks) = (cpu_ns(pid)?, user_system_ticks(pid)?);
    n_cycles(&mut session, key, cycles).await?;
    let ns = cpu_ns(pid)?.saturating_sub(ns);
    let (user, system) = user_system_ticks(pid)?;
    let (user, system) = (user.saturating_sub(ticks.0), system.saturating_sub(ticks.1));
    let us = ns as f64 / 1e3 / cycles as f64;
    let share = system as f64 / (user + system).max(1) as f64;
    Ok(Burn {
        us,
        kernel_us: us * share,
    })
}
