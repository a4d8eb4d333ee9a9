//! Health and the admin listener: `grpc.health.v1` on the gRPC listener (SERVING only
//! while the store answers), and `/livez`, `/readyz`, `/metrics` over HTTP/1.1 on
//! `--admin-listen`.
//!
//! One watcher task pings the store every [`CHECK_EVERY`], asks it what it allows this
//! sidecar and whether it may evict locks (`Store::check`), and flips both the gRPC
//! health status and `/readyz` (whose body says why it fails), so probes never wait on
//! the store themselves.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::engine::Engine;
use crate::metrics::Metrics;
use crate::store::StoreCheck;

/// How often the store is pinged for health. One PING a second costs nothing and
/// flips readiness within about a second of the store going or coming back.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// The gRPC service name whose health is reported, besides the server's ("").
const SERVICE: &str = "lockside.v1.LockService";

/// Why the sidecar is not ready, when it is not: the body of a failing `/readyz`.
#[derive(Clone, Debug)]
pub struct Readiness(Arc<RwLock<Option<String>>>);

/// Why a sidecar whose store does not answer is not ready.
const NO_ANSWER: &str = "the lock store does not answer";

impl Default for Readiness {
    fn default() -> Self {
        Self(Arc::new(RwLock::new(Some(NO_ANSWER.into()))))
    }
}

impl Readiness {
    /// The store answered at the last check and allows what the sidecar needs.
    pub fn is_ready(&self) -> bool {
        self.why_not().is_none()
    }

    /// Why the sidecar is not ready, if it is not.
    pub fn why_not(&self) -> Option<String> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set(&self, why_not: Option<String>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = why_not;
    }
}

/// Reports NOT_SERVING for the server and the lock service. tonic-health starts with
/// the server as SERVING; the sidecar is not until the store has answered.
pub async fn not_serving(reporter: &HealthReporter) {
    reporter
        .set_service_status("", ServingStatus::NotServing)
        .await;
    reporter
        .set_service_status(SERVICE, ServingStatus::NotServing)
        .await;
}

/// Why a sidecar is not ready: its store does not answer, refuses a command the
/// sidecar needs, or may evict locks (unless the operator allowed that).
fn not_ready(up: bool, found: &StoreCheck, allow_evicting: bool) -> Option<String> {
    if !up {
        return Some(NO_ANSWER.into());
    }
    if !found.denied.is_empty() {
        return Some(format!(
            "the lock store refuses commands Lockside needs: {} (grant them to its user; \
             docs/operations.md, \"Least privilege on Redis\")",
            found.denied.join(", ")
        ));
    }
    match &found.evicting {
        Some(policy) if !allow_evicting => Some(format!(
            "the lock store may evict held locks (maxmemory-policy {policy}): set it to \
             noeviction, or start with --allow-evicting-store"
        )),
        _ => None,
    }
}

/// Logs what changed in the store's check, once per change.
fn log_check(before: &StoreCheck, now: &StoreCheck, allow_evicting: bool) {
    if now.denied != before.denied {
        match now.denied.as_slice() {
            [] => tracing::info!("the lock store allows every command Lockside needs again"),
            denied => tracing::error!(
                denied = %denied.join(", "),
                "the lock store refuses commands Lockside needs; not ready until its user may \
                 run them (docs/operations.md, \"Least privilege on Redis\")"
            ),
        }
    }
    if now.evicting != before.evicting {
        match &now.evicting {
            Some(policy) if allow_evicting => tracing::error!(
                %policy,
                "the lock store may evict held locks (maxmemory-policy); serving anyway, as \
                 --allow-evicting-store says"
            ),
            Some(policy) => tracing::error!(
                %policy,
                "the lock store may evict held locks (maxmemory-policy); not ready until it is \
                 noeviction, or --allow-evicting-store"
            ),
            None => tracing::info!("the lock store no longer evicts keys (maxmemory-policy)"),
        }
    }
}

/// Pings the store every [`CHECK_EVERY`] until `stop`, asks it what it allows and
/// whether it evicts (`Engine::check_store`: the store checks again after a reconnect),
/// and reports the result to gRPC health, to `/readyz` and to the metrics.
/// `allow_evicting`: `--allow-evicting-store`.
pub async fn watch_store(
    engine: Engine,
    reporter: HealthReporter,
    readiness: Readiness,
    allow_evicting: bool,
    stop: CancellationToken,
) {
    let mut last = None;
    let mut found = StoreCheck::default();
    loop {
        let up = matches!(
            tokio::time::timeout(CHECK_EVERY, engine.ping()).await,
            Ok(Ok(()))
        );
        if up {
            // A check that fails (the store went meanwhile) keeps what the last found.
            if let Ok(Ok(check)) = tokio::time::timeout(CHECK_EVERY, engine.check_store()).await {
                log_check(&found, &check, allow_evicting);
                engine.metrics().store_checked(&check);
                found = check;
            }
        }
        let why_not = not_ready(up, &found, allow_evicting);
        if last.as_ref() != Some(&why_not) {
            let status = match why_not {
                None => ServingStatus::Serving,
                Some(_) => ServingStatus::NotServing,
            };
            tracing::info!(serving = why_not.is_none(), why_not, "store health changed");
            // /readyz first: whoever sees the gRPC status change then finds /readyz
            // agreeing.
            readiness.set(why_not.clone());
            reporter.set_service_status("", status).await;
            reporter.set_service_status(SERVICE, status).await;
            last = Some(why_not);
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            // A probe interval, not a wait for a lock.
            _ = tokio::time::sleep(CHECK_EVERY) => {}
        }
    }
    readiness.set(Some("the sidecar is shutting down".into()));
    not_serving(&reporter).await;
}

#[derive(Clone)]
struct AdminState {
    readiness: Readiness,
    metrics: Arc<Metrics>,
}

/// Serves `/livez`, `/readyz` and `/metrics` on `listener` until `stop`.
pub async fn serve(
    listener: TcpListener,
    readiness: Readiness,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let router = Router::new()
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(render_metrics))
        .with_state(AdminState { readiness, metrics });
    axum::serve(listener, router)
        .with_graceful_shutdown(stop.cancelled_owned())
        .await
}

async fn readyz(State(state): State<AdminState>) -> impl IntoResponse {
    match state.readiness.why_not() {
        None => (StatusCode::OK, "ok\n".to_owned()),
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

async fn render_metrics(State(state): State<AdminState>) -> impl IntoResponse {
    match state.metrics.render(state.readiness.is_ready()) {
        Ok(text) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}
