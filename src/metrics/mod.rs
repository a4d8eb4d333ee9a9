//! Prometheus metrics of the sidecar, served on `/metrics` of the admin listener in the
//! OpenMetrics text format.
//!
//! Conventions (what operators of etcd or Linkerd expect, and what the alert rules and
//! the dashboard in `deploy/observability/` rely on): a `lockside_` prefix; `_total` on
//! counters and the unit on durations (both added by the encoder, with `# UNIT`); HELP
//! on every metric; label values in lower snake case; every labelled series created at
//! start, at 0, so that `rate()` and `increase()` see the first event and a dashboard
//! shows 0 rather than "no data". `docs/operations.md` lists every name.
//!
//! Recording is cheap: every labelled series is a handle taken once at start (an array
//! indexed by the label's enum), so a count is one atomic add, with no label set built,
//! hashed or allocated per call. `store.rs` meters every store call the same way.

mod labels;
pub mod store;

use labels::CALL_RESULTS;
pub use labels::{Heard, Loss, Operation, Outcome, Renewed};

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use tokio::sync::Semaphore;

use crate::store::StoreCheck;

/// A label set of `N` fixed labels; keys and values are static strings, so a handle is
/// looked up once and never allocates.
type Labels<const N: usize> = [(&'static str, &'static str); N];

/// One counter per value of a label, in the order of `values`. Creating them here makes
/// every series exist from the first scrape.
fn counters<const N: usize>(
    family: &Family<Labels<1>, Counter>,
    key: &'static str,
    values: [&'static str; N],
) -> [Counter; N] {
    values.map(|value| family.get_or_create_owned(&[(key, value)]))
}

/// The bounds of `lockside_renewal_seconds`: 100 µs to ~14 min, doubling. A quantile
/// never exceeds the largest finite bound (a batch slower than it counts as that
/// bound), so the buckets must reach past the largest threshold the alert rules compare
/// with: `LocksideRenewalsSlow` fires above half the renewal period, TTL/6 of
/// `--default-ttl`, which is 1.67 s at the default 10 s and 600 s at the longest TTL
/// (1 h). (They stopped at 1.6 s, and that alert could never fire.)
pub(crate) fn renewal_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.0001, 2.0, 24)
}

/// Handles of the store-call metrics, shared by [`store::MeteredStore`].
#[derive(Clone, Debug)]
pub(crate) struct StoreCalls {
    /// `[operation][result]`.
    counts: [[Counter; CALL_RESULTS.len()]; Operation::LABELS.len()],
    /// `[operation]`.
    seconds: [Histogram; Operation::LABELS.len()],
}

impl StoreCalls {
    /// Counts one finished call of `operation` that took `took`; `error` is the
    /// error's kind, `None` for success.
    pub(crate) fn record(&self, operation: Operation, took: Duration, error: Option<&str>) {
        let op = operation as usize;
        self.seconds[op].observe(took.as_secs_f64());
        let result = match error {
            None => 0,
            Some(kind) => CALL_RESULTS
                .iter()
                .position(|r| *r == kind)
                // A kind not listed here (a new StoreError variant) is still an error.
                .unwrap_or(1),
        };
        self.counts[op][result].inc();
    }
}

/// Counts a waiting acquire in `lockside_acquires_waiting` while it lives.
#[derive(Debug)]
pub struct Waiting(Gauge);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Every metric of one sidecar.
pub struct Metrics {
    registry: Registry,
    /// Open `Lease` streams.
    pub sessions: Gauge,
    /// Grants held by sessions of this sidecar.
    pub locks_held: Gauge,
    acquires: [Counter; Outcome::LABELS.len()],
    acquires_waiting: Gauge,
    /// Time from an `Acquire` to its grant.
    pub acquire_wait: Histogram,
    /// Time from a grant to its release or loss.
    pub hold_time: Histogram,
    /// Grants that went to a request that had waited.
    pub handoffs: Counter,
    renewals: [Counter; Renewed::LABELS.len()],
    /// Duration of one renewal batch (one store round trip).
    pub renewal_time: Histogram,
    /// `Jeopardy` events sent.
    pub jeopardy: Counter,
    lost: [Counter; Loss::LABELS.len()],
    store_calls: StoreCalls,
    store_calls_in_flight: Gauge,
    notices: [Counter; Heard::LABELS.len()],
    ready: Gauge,
    /// What the store's last check found (`Store::check`).
    store_evicting: Gauge,
    store_denied: Gauge,
    /// The engine's limit on concurrent store calls and its semaphore, read at scrape
    /// time (a gauge kept up to date on every call would cost every call).
    store_calls_source: std::sync::OnceLock<(Arc<Semaphore>, usize)>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// What the sidecar is, for `lockside_build_info` and the gauges the alert rules
/// compare with.
#[derive(Clone, Copy, Debug)]
pub struct Sidecar {
    /// The store's kind ([`crate::store::Store::kind`]).
    pub store_kind: &'static str,
    /// `--default-ttl`: renewals run every TTL/3 of it.
    pub default_ttl: Duration,
    /// `--max-sessions`.
    pub max_sessions: usize,
}

impl Metrics {
    /// Registers every metric.
    pub fn new(sidecar: Sidecar) -> Self {
        let mut registry = Registry::with_prefix("lockside");
        let r = &mut registry;

        let build_info = Family::<Labels<2>, Gauge>::default();
        build_info
            .get_or_create(&[
                ("version", env!("CARGO_PKG_VERSION")),
                ("store_kind", sidecar.store_kind),
            ])
            .set(1);
        r.register(
            "build_info",
            "Always 1: the sidecar's version and store kind as labels",
            build_info,
        );
        let ready = Gauge::default();
        r.register(
            "ready",
            "1 while /readyz answers 200: the store answered the last health check (every second), \
             allows every command Lockside needs, and does not evict (or --allow-evicting-store)",
            ready.clone(),
        );
        let default_ttl = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        default_ttl.set(sidecar.default_ttl.as_secs_f64());
        r.register_with_unit(
            "default_ttl",
            "TTL of an Acquire that sets none (--default-ttl); renewals run every TTL/3",
            Unit::Seconds,
            default_ttl,
        );

        let sessions = Gauge::default();
        r.register("sessions", "Open Lease streams", sessions.clone());
        let sessions_limit: Gauge = Gauge::default();
        sessions_limit.set(i64::try_from(sidecar.max_sessions).unwrap_or(i64::MAX));
        r.register(
            "sessions_limit",
            "Most Lease streams this sidecar accepts (--max-sessions)",
            sessions_limit,
        );
        let locks_held = Gauge::default();
        r.register(
            "locks_held",
            "Grants held by this sidecar's sessions",
            locks_held.clone(),
        );

        let family = Family::<Labels<1>, Counter>::default();
        let acquires = counters(&family, "outcome", Outcome::LABELS);
        r.register(
            "acquires",
            "Acquire requests by final answer (rejected counts every refused request)",
            family,
        );
        let acquires_waiting = Gauge::default();
        r.register(
            "acquires_waiting",
            "Acquires waiting for their lock now (sent Waiting, not yet answered)",
            acquires_waiting.clone(),
        );
        // 100 µs to ~1.9 h: from an uncontended grant to the longest wait a client may
        // ask for (24 h) but for its last hours, so that a p99 of long waits (which
        // LocksideAcquireWaitsGrowing compares with an hour earlier) is not cut at the
        // top bucket: a quantile never exceeds the largest finite bound.
        let acquire_wait = Histogram::new(exponential_buckets(0.0001, 4.0, 14));
        r.register_with_unit(
            "acquire_wait",
            "Time from an Acquire to its grant",
            Unit::Seconds,
            acquire_wait.clone(),
        );
        // 1 ms to ~4 min.
        let hold_time = Histogram::new(exponential_buckets(0.001, 4.0, 10));
        r.register_with_unit(
            "hold",
            "Time from a grant to its release or loss",
            Unit::Seconds,
            hold_time.clone(),
        );
        let handoffs = Counter::default();
        r.register(
            "handoffs",
            "Grants to requests that had waited",
            handoffs.clone(),
        );

        let family = Family::<Labels<1>, Counter>::default();
        let renewals = counters(&family, "result", Renewed::LABELS);
        r.register("renewals", "Grant renewals by result", family);
        let renewal_time = Histogram::new(renewal_buckets());
        r.register_with_unit(
            "renewal",
            "Duration of one renewal batch (one store round trip)",
            Unit::Seconds,
            renewal_time.clone(),
        );
        let jeopardy = Counter::default();
        r.register(
            "jeopardy",
            "Jeopardy events sent: a renewal failed, the lock is held until its safe deadline",
            jeopardy.clone(),
        );
        let family = Family::<Labels<1>, Counter>::default();
        let lost = counters(&family, "reason", Loss::LABELS);
        r.register(
            "lost",
            "Locks lost while held, by reason (deadline and not_held are incidents)",
            family,
        );

        let counts = Family::<Labels<2>, Counter>::default();
        let seconds = Family::<Labels<1>, Histogram, fn() -> Histogram>::new_with_constructor(
            // 100 µs to ~1.6 s, past the default --store-timeout of 1 s.
            || Histogram::new(exponential_buckets(0.0001, 2.0, 15)),
        );
        let store_calls = StoreCalls {
            counts: Operation::LABELS.map(|operation| {
                CALL_RESULTS.map(|result| {
                    counts.get_or_create_owned(&[("operation", operation), ("result", result)])
                })
            }),
            seconds: Operation::LABELS
                .map(|operation| seconds.get_or_create_owned(&[("operation", operation)])),
        };
        r.register(
            "store_calls",
            "Finished store calls by operation and result (ok or the error's kind)",
            counts,
        );
        r.register_with_unit(
            "store_call",
            "Duration of store calls by operation",
            Unit::Seconds,
            seconds,
        );
        let store_calls_in_flight = Gauge::default();
        r.register(
            "store_calls_in_flight",
            "Sessions' store calls under way (at most 256 at once, more wait)",
            store_calls_in_flight.clone(),
        );
        let family = Family::<Labels<1>, Counter>::default();
        let notices = counters(&family, "kind", Heard::LABELS);
        r.register(
            "store_notices_received",
            "Notices this sidecar received from the store, by kind: a store sends a key's \
             notices only to sidecars that wait on or watch it",
            family,
        );
        let store_evicting = Gauge::default();
        r.register(
            "store_evicting",
            "1 while the store's eviction policy may evict held locks (Redis maxmemory-policy \
             allkeys-* or volatile-*)",
            store_evicting.clone(),
        );
        let store_denied = Gauge::default();
        r.register(
            "store_commands_denied",
            "Commands Lockside needs that the store refuses this sidecar's user (/readyz names them)",
            store_denied.clone(),
        );
        Self {
            registry,
            sessions,
            locks_held,
            acquires,
            acquires_waiting,
            acquire_wait,
            hold_time,
            handoffs,
            renewals,
            renewal_time,
            jeopardy,
            lost,
            store_calls,
            store_calls_in_flight,
            notices,
            ready,
            store_evicting,
            store_denied,
            store_calls_source: std::sync::OnceLock::new(),
        }
    }

    /// Counts an acquire's final answer.
    pub fn acquired(&self, outcome: Outcome) {
        self.acquires[outcome as usize].inc();
    }

    /// Counts an acquire as waiting until the returned guard is dropped.
    pub fn waiting(&self) -> Waiting {
        self.acquires_waiting.inc();
        Waiting(self.acquires_waiting.clone())
    }

    /// Counts `n` renewals with `result`.
    pub fn renewed(&self, result: Renewed, n: u64) {
        self.renewals[result as usize].inc_by(n);
    }

    /// Counts a lock lost while held.
    pub fn lost(&self, why: Loss) {
        self.lost[why as usize].inc();
    }

    /// Counts a notice received from the store.
    pub fn heard(&self, kind: Heard) {
        self.notices[kind as usize].inc();
    }

    /// Shows what the store's last check found.
    pub fn store_checked(&self, check: &StoreCheck) {
        self.store_evicting.set(i64::from(check.evicting.is_some()));
        (self.store_denied).set(i64::try_from(check.denied.len()).unwrap_or(i64::MAX));
    }

    /// The handles [`store::MeteredStore`] records with.
    pub(crate) fn store_calls(&self) -> StoreCalls {
        self.store_calls.clone()
    }

    /// Where `lockside_store_calls_in_flight` is read from: the semaphore that admits
    /// at most `limit` store calls at once.
    pub fn watch_store_calls(&self, semaphore: Arc<Semaphore>, limit: usize) {
        let _ = self.store_calls_source.set((semaphore, limit));
    }

    /// The OpenMetrics text exposition; `ready` is what `/readyz` says now.
    pub fn render(&self, ready: bool) -> Result<String, std::fmt::Error> {
        if let Some((semaphore, limit)) = self.store_calls_source.get() {
            let busy = limit.saturating_sub(semaphore.available_permits());
            self.store_calls_in_flight.set(busy as i64);
        }
        self.ready.set(i64::from(ready));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

#[cfg(test)]
mod tests;
