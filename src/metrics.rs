//! Prometheus metrics of the sidecar, served as text on `/metrics` of the admin
//! listener. Names follow Prometheus conventions: `lockside_` prefix, `_total` on
//! counters (added by the encoder), `_seconds` on durations.

use std::sync::Arc;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::sync::Semaphore;

/// How an acquire ended.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Outcome {
    /// Granted (first grant or reentrant).
    Granted,
    /// Busy and not waiting.
    Busy,
    /// The wait timed out.
    Timeout,
    /// The wait was cancelled.
    Cancelled,
    /// Refused (bad input, limits, a conflict).
    Rejected,
    /// The store could not be reached.
    Unavailable,
}

/// What a renewal found.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Renewed {
    /// Extended.
    Ok,
    /// The store no longer held the grant.
    NotHeld,
    /// The store call failed.
    Failed,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: Outcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RenewedLabel {
    result: Renewed,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

/// Every metric of one sidecar.
pub struct Metrics {
    registry: Registry,
    /// Open `Lease` streams.
    pub sessions: Gauge,
    /// Grants held by sessions of this sidecar.
    pub locks_held: Gauge,
    acquires: Family<OutcomeLabel, Counter>,
    /// Time from an `Acquire` to its grant.
    pub acquire_wait: Histogram,
    /// Time from a grant to its release or loss.
    pub hold_time: Histogram,
    /// Grants that went to a request that had waited.
    pub handoffs: Counter,
    renewals: Family<RenewedLabel, Counter>,
    /// Duration of one renewal batch (one store round trip).
    pub renewal_time: Histogram,
    /// `Jeopardy` events sent.
    pub jeopardy: Counter,
    /// `Lost` events sent.
    pub lost: Counter,
    store_errors: Family<KindLabel, Counter>,
    store_calls: Gauge,
    /// The engine's limit on concurrent store calls and its semaphore, read at scrape
    /// time (a gauge kept up to date on every call would cost every call).
    store_calls_source: std::sync::OnceLock<(Arc<Semaphore>, usize)>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("lockside");
        let sessions = Gauge::default();
        let locks_held = Gauge::default();
        let acquires = Family::<OutcomeLabel, Counter>::default();
        // 100 µs to ~26 s: from an uncontended grant to a long wait.
        let acquire_wait = Histogram::new(exponential_buckets(0.0001, 4.0, 10));
        // 1 ms to ~4 min.
        let hold_time = Histogram::new(exponential_buckets(0.001, 4.0, 10));
        let handoffs = Counter::default();
        let renewals = Family::<RenewedLabel, Counter>::default();
        // 100 µs to ~1.6 s: one pipelined batch.
        let renewal_time = Histogram::new(exponential_buckets(0.0001, 2.0, 15));
        let jeopardy = Counter::default();
        let lost = Counter::default();
        let store_errors = Family::<KindLabel, Counter>::default();
        let store_calls = Gauge::default();
        registry.register(
            "store_calls_in_flight",
            "Store calls under way (the pool's use; at most 256 at once, more wait)",
            store_calls.clone(),
        );
        registry.register("sessions", "Open Lease streams", sessions.clone());
        registry.register(
            "locks_held",
            "Grants held by this sidecar's sessions",
            locks_held.clone(),
        );
        registry.register("acquires", "Acquire requests by outcome", acquires.clone());
        registry.register(
            "acquire_wait_seconds",
            "Time from an Acquire to its grant",
            acquire_wait.clone(),
        );
        registry.register(
            "hold_seconds",
            "Time from a grant to its release or loss",
            hold_time.clone(),
        );
        registry.register(
            "handoffs",
            "Grants to requests that had waited",
            handoffs.clone(),
        );
        registry.register("renewals", "Grant renewals by result", renewals.clone());
        registry.register(
            "renewal_seconds",
            "Duration of one renewal batch (one store round trip)",
            renewal_time.clone(),
        );
        registry.register("jeopardy", "Jeopardy events sent", jeopardy.clone());
        registry.register("lost", "Lost events sent", lost.clone());
        registry.register(
            "store_errors",
            "Failed store calls by kind",
            store_errors.clone(),
        );
        Self {
            registry,
            sessions,
            locks_held,
            acquires,
            acquire_wait,
            hold_time,
            handoffs,
            renewals,
            renewal_time,
            jeopardy,
            lost,
            store_errors,
            store_calls,
            store_calls_source: std::sync::OnceLock::new(),
        }
    }

    /// Counts an acquire's final answer.
    pub fn acquired(&self, outcome: Outcome) {
        self.acquires.get_or_create(&OutcomeLabel { outcome }).inc();
    }

    /// Counts `n` renewals with `result`.
    pub fn renewed(&self, result: Renewed, n: u64) {
        self.renewals
            .get_or_create(&RenewedLabel { result })
            .inc_by(n);
    }

    /// Counts a failed store call.
    pub fn store_error(&self, kind: &str) {
        self.store_errors
            .get_or_create(&KindLabel {
                kind: kind.to_owned(),
            })
            .inc();
    }

    /// Where `lockside_store_calls_in_flight` is read from: the semaphore that admits
    /// at most `limit` store calls at once.
    pub fn watch_store_calls(&self, semaphore: Arc<Semaphore>, limit: usize) {
        let _ = self.store_calls_source.set((semaphore, limit));
    }

    /// The text exposition.
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        if let Some((semaphore, limit)) = self.store_calls_source.get() {
            let busy = limit.saturating_sub(semaphore.available_permits());
            self.store_calls.set(busy as i64);
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}
