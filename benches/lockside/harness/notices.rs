//! Counting release notices as Redis delivers them, whatever channels the sidecars use:
//! the tap subscribes to the pattern `*NAMESPACE*` (every channel of a namespace holds
//! its name), counts the messages published on each channel, and every
//! [`FLUSH`] multiplies them by that channel's subscribers (`PUBSUB NUMSUB`, which
//! leaves out pattern subscribers such as the tap itself). Deliveries per release is
//! then the fan-out: how many sidecars each release woke.
//!
//! Standalone Redis only: a pattern does not see sharded channels (`SPUBLISH`), so on a
//! Cluster URL the tap is `None`, and where sidecars publish sharded notices on a
//! standalone Redis (`INFO commandstats` counts SPUBLISH calls) the figure is n/a
//! rather than a false zero.

use std::collections::HashMap;
use std::time::Duration;

use deadpool_redis::redis::{self, aio::MultiplexedConnection, aio::PubSub};
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;

use super::context::err;
use super::redis_side::{CommandStats, info};

/// How often channel counts are turned into deliveries. Subscriptions that change
/// faster than this (a sidecar listening to a key only while it has a waiter) are
/// counted as they stood at the flush: an estimate within one flush per change.
const FLUSH: Duration = Duration::from_millis(50);

/// Messages published on the namespace's channels, and their deliveries to subscribers.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Tally {
    pub(crate) published: u64,
    pub(crate) delivered: u64,
    /// SPUBLISH calls Redis ran meanwhile: notices the tap cannot see.
    pub(crate) sharded: u64,
}

impl Tally {
    /// Deliveries per release, over `releases`; `None` when some notices were sharded.
    pub(crate) fn per_release(self, releases: u64) -> Option<f64> {
        (releases > 0 && self.sharded == 0).then(|| self.delivered as f64 / releases as f64)
    }

    /// Why [`Self::per_release`] is `None` though releases happened, if it is.
    pub(crate) fn note(self) -> Option<String> {
        (self.sharded > 0).then(|| {
            format!(
                "notices per release are n/a: {} SPUBLISH calls (sharded notices) are not seen \
                 by the tap's pattern subscription",
                self.sharded
            )
        })
    }
}

/// A running count of a namespace's notices.
pub(crate) struct NoticeTap {
    stop: CancellationToken,
    task: JoinHandle<Result<Tally, String>>,
    /// Commandstats when the count began, and a connection to read them again.
    stats: CommandStats,
    conn: MultiplexedConnection,
}

impl NoticeTap {
    /// Starts counting on `url`'s server; `None` on a Cluster (see the module docs).
    pub(crate) async fn start(url: &str, namespace: &str) -> Result<Option<Self>, String> {
        if url.contains("+cluster://") || url.contains("+sentinel://") {
            return Ok(None);
        }
        let client = redis::Client::open(url).map_err(err("notice tap"))?;
        let mut pubsub = client.get_async_pubsub().await.map_err(err("notice tap"))?;
        pubsub
            .psubscribe(format!("*{namespace}*"))
            .await
            .map_err(err("notice tap PSUBSCRIBE"))?;
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(err("notice tap"))?;
        let stats = CommandStats::parse(&info(&mut conn, "commandstats").await?);
        let stop = CancellationToken::new();
        let task = tokio::spawn(tally(pubsub, conn.clone(), stop.clone()));
        Ok(Some(Self {
            stop,
            task,
            stats,
            conn,
        }))
    }

    /// Stops counting and returns the count. Call it before the subscribers go, so the
    /// last flush still sees them.
    pub(crate) async fn finish(mut self) -> Result<Tally, String> {
        self.stop.cancel();
        let mut tally = self.task.await.map_err(err("notice tap"))??;
        let later = CommandStats::parse(&info(&mut self.conn, "commandstats").await?);
        let ran = self.stats.until(&later, 0);
        tally.sharded = ran.0.get("spublish").map_or(0, |(calls, _)| *calls);
        Ok(tally)
    }
}

async fn tally(
    mut pubsub: PubSub,
    mut conn: MultiplexedConnection,
    stop: CancellationToken,
) -> Result<Tally, String> {
    let (mut tally, mut pending) = (Tally::default(), HashMap::new());
    let mut tick = tokio::time::interval(FLUSH);
    let mut messages = pubsub.on_message();
    loop {
        tokio::select! {
            // Messages first: those already received count before a stop.
            biased;
            message = messages.next() => {
                let message = message.ok_or("the notice tap's subscription ended")?;
                *pending.entry(message.get_channel_name().to_owned()).or_default() += 1;
                tally.published += 1;
            }
            _ = stop.cancelled() => {
                tally.delivered += flush(&mut conn, &mut pending).await?;
                return Ok(tally);
            }
            _ = tick.tick() => tally.delivered += flush(&mut conn, &mut pending).await?,
        }
    }
}

/// Deliveries of the `pending` messages, by their channels' subscribers now.
async fn flush(
    conn: &mut MultiplexedConnection,
    pending: &mut HashMap<String, u64>,
) -> Result<u64, String> {
    if pending.is_empty() {
        return Ok(0);
    }
    let mut numsub = redis::cmd("PUBSUB");
    numsub.arg("NUMSUB");
    for channel in pending.keys() {
        numsub.arg(channel);
    }
    let subscribers: HashMap<String, u64> = numsub
        .query_async(conn)
        .await
        .map_err(err("PUBSUB NUMSUB"))?;
    Ok(deliveries(pending.drain(), &subscribers))
}

/// Σ messages × subscribers, channel by channel.
fn deliveries(
    messages: impl IntoIterator<Item = (String, u64)>,
    subscribers: &HashMap<String, u64>,
) -> u64 {
    messages
        .into_iter()
        .map(|(channel, n)| n * subscribers.get(&channel).copied().unwrap_or(0))
        .sum()
}

#[cfg(test)]
mod tests {
    // Run by tests/bench_units.rs; the bench target itself has no harness, so there
    // the tests below are compiled out and this import goes unused.
    #[allow(unused_imports)]
    use super::*;

    #[test]
    fn deliveries_are_messages_times_subscribers() {
        let subscribers = HashMap::from([("ns:released".to_owned(), 21), ("k".to_owned(), 1)]);
        let messages = [
            ("ns:released".to_owned(), 10),
            ("k".to_owned(), 3),
            ("gone".to_owned(), 5),
        ];
        assert_eq!(deliveries(messages, &subscribers), 213);
        let tally = Tally {
            published: 18,
            delivered: 213,
            sharded: 0,
        };
        assert_eq!(tally.per_release(10), Some(21.3));
        assert_eq!(tally.per_release(0), None);
        assert_eq!(tally.note(), None);
        let sharded = Tally {
            sharded: 5,
            ..tally
        };
        assert_eq!(sharded.per_release(10), None, "not a false figure");
        assert!(sharded.note().is_some());
    }
}
