//! Load helpers: tasks joined as one, sampling loops bounded in time and in count, and
//! uncontended acquire→release cycles on one session.

use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;

use super::context::err;
use super::report::Stats;
use super::session::{Session, Want};

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
