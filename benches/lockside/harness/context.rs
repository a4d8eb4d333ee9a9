//! What a run shares: its names (the namespace every key and channel is under), the
//! main sidecar's context [`Ctx`], the constants several phases use, error context,
//! and the cleanup at the end.

use std::fmt::Display;
use std::sync::Arc;
use std::time::Duration;

use tonic::transport::Channel;

use super::args::BenchArgs;
use super::report::Report;
use super::servers::Servers;
use super::session::Session;
use lockside::store::redis::RedisStore;

/// `wait_timeout` of contended acquires (phases 3 to 5).
pub(crate) const WAIT: Duration = Duration::from_secs(30);
/// TTL of direct grants: the sidecar's default, so both sides do the same work.
pub(crate) const DIRECT_TTL: Duration = Duration::from_secs(10);
/// Timeout of one direct store call, as `lockside serve` defaults to.
const STORE_TIMEOUT: Duration = Duration::from_secs(1);

/// Context for an error: `.map_err(err("INFO"))` gives "INFO: <error>".
pub(crate) fn err<E: Display>(what: impl Display) -> impl FnOnce(E) -> String {
    move |e| format!("{what}: {e}")
}

/// The name of run `tag`: the namespace of the spawned sidecar and of the direct store,
/// and the prefix of every key, so that [`cleanup`] finds all of them with one pattern.
pub(crate) fn namespace(tag: &str) -> String {
    format!("bench-{tag}")
}

/// A namespace of run `tag` for one phase's own sidecars (`bench-TAG-PART`): its keys
/// and channels are apart from every other phase's, and [`cleanup`] still finds them.
pub(crate) fn sub_namespace(tag: &str, part: &str) -> String {
    format!("{}-{part}", namespace(tag))
}

pub(crate) fn random_hex(bytes: usize) -> Result<String, String> {
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

/// Deletes every key of run `tag` on `--redis` and, when the sidecar ran on Redlock,
/// on its other masters too; what fails to be deleted is a note. An error only when
/// `--store` names no masters.
pub(crate) async fn clean_up(
    args: &BenchArgs,
    tag: &str,
    report: &mut Report,
) -> Result<(), String> {
    report.notes.extend(cleanup(&args.redis, tag).await.err());
    if let Some(store) = args
        .store
        .as_deref()
        .filter(|s| s.starts_with("redlock://"))
    {
        let masters = lockside::store::redlock::master_urls(store).map_err(err("--store"))?;
        for master in masters.iter().filter(|m| **m != args.redis) {
            report.notes.extend(cleanup(master, tag).await.err());
        }
        report.notes.push(format!(
            "the sidecar used {} (Redis commands per grant count --redis only)",
            lockside::parse::redact(store)
        ));
    }
    Ok(())
}

/// Plain connections to the store's data servers, for counters and cleanup.
pub(crate) async fn plain_redis(url: &str) -> Result<Servers, String> {
    Servers::connect(url).await
}

/// What every phase on the main sidecar needs.
pub(crate) struct Ctx {
    pub(crate) addr: String,
    pub(crate) channel: Channel,
    /// The same store as the sidecar's, called directly by the bench.
    pub(crate) store: Arc<RedisStore>,
    pub(crate) redis_url: String,
    pub(crate) seconds: Duration,
    pub(crate) namespace: String,
}

impl Ctx {
    /// The context of the main sidecar at `addr` (connected on `channel`) in run `tag`.
    pub(crate) fn new(
        args: &BenchArgs,
        addr: &str,
        channel: Channel,
        tag: &str,
    ) -> Result<Self, String> {
        let store = RedisStore::new(&args.redis, &namespace(tag), STORE_TIMEOUT);
        Ok(Self {
            addr: addr.to_owned(),
            channel,
            store: Arc::new(store.map_err(err("--redis"))?),
            redis_url: args.redis.clone(),
            seconds: Duration::from_secs(args.seconds),
            namespace: namespace(tag),
        })
    }

    pub(crate) fn key(&self, name: impl Display) -> String {
        format!("{}/{name}", self.namespace)
    }

    pub(crate) async fn sessions(&self, n: usize) -> Result<Vec<Session>, String> {
        let mut sessions = Vec::with_capacity(n);
        for _ in 0..n {
            sessions.push(Session::open(self.channel.clone()).await?);
        }
        Ok(sessions)
    }
}
