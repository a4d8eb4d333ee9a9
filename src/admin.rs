//! Health and the admin listener: `grpc.health.v1` on the gRPC listener (SERVING only
//! while the store answers), and `/livez`, `/readyz`, `/metrics` over HTTP/1.1 on
//! `--admin-listen`.
//!
//! One watcher task pings the store every [`CHECK_EVERY`] and flips both the gRPC
//! health status and `/readyz`, so probes never wait on the store themselves.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
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

/// How often the store is pinged for health. One PING a second costs nothing and
/// flips readiness within about a second of the store going or coming back.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// The gRPC service name whose health is reported, besides the server's ("").
const SERVICE: &str = "lockside.v1.LockService";

/// Whether the store answered at the last check.
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// The store answered at the last check.
    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Relaxed)
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

/// Pings the store every [`CHECK_EVERY`] until `stop`, and reports the result to gRPC
/// health and to `/readyz`.
pub async fn watch_store(
    engine: Engine,
    reporter: HealthReporter,
    readiness: Readiness,
    stop: CancellationToken,
) {
    let mut last = None;
    loop {
        let up = matches!(
            tokio::time::timeout(CHECK_EVERY, engine.ping()).await,
            Ok(Ok(()))
        );
        if last != Some(up) {
            let status = if up {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            tracing::info!(serving = up, "store health changed");
            // /readyz first: whoever sees the gRPC status change then finds /readyz
            // agreeing.
            readiness.0.store(up, Ordering::Relaxed);
            reporter.set_service_status("", status).await;
            reporter.set_service_status(SERVICE, status).await;
            last = Some(up);
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            // A probe interval, not a wait for a lock.
            _ = tokio::time::sleep(CHECK_EVERY) => {}
        }
    }
    readiness.0.store(false, Ordering::Relaxed);
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
    if state.readiness.is_ready() {
        (StatusCode::OK, "ok\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "the lock store does not answer\n",
        )
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
