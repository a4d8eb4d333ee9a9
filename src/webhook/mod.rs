//! `lockside webhook`: a mutating admission webhook that injects Lockside as a native
//! sidecar into pods that opt in (`lockside.io/inject: "true"`).
//!
//! - [`patch`]: the pure part, Pod JSON → JSONPatch (unit-tested beside the code);
//!   [`annotations`]: the pod's `lockside.io/*` settings, checked.
//! - [`sidecar`]: the injected container and its defaults.
//! - [`review`]: the `AdmissionReview` v1 envelope around it.
//! - [`tls`]: the certificate, reloaded when cert-manager renews it.
//! - this file: the HTTPS server (`POST /mutate`, `GET /healthz`); [`run`] is what
//!   tests call on port 0. Its flags are in `cli/webhook.rs`.

pub mod annotations;
pub mod patch;
pub mod review;
pub mod sidecar;
pub mod tls;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use review::Verdict;
pub use sidecar::SidecarDefaults;

/// Largest request body read. The API server sends at most 3 MiB (its own request
/// limit) and etcd stores objects of at most 1.5 MiB, so 4 MiB refuses no real review
/// while bounding what one connection can make the injector hold.
pub const MAX_BODY: usize = 4 * 1024 * 1024;
/// A TLS handshake that takes longer is dropped: the API server's own webhook timeout
/// is at most 30 s, and a handshake on a cluster network takes milliseconds.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long shutdown waits for requests in flight (an admission review takes
/// milliseconds; the API server retries nothing, so finishing them matters).
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// The HTTP routes: `POST /mutate` and `GET /healthz`, bodies capped at [`MAX_BODY`].
pub fn router(defaults: SidecarDefaults) -> Router {
    Router::new()
        .route("/mutate", post(mutate))
        .route("/healthz", get(|| async { "ok\n" }))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(Arc::new(defaults))
}

async fn mutate(State(defaults): State<Arc<SidecarDefaults>>, body: Bytes) -> Response {
    let answer = match review::answer(&body, &defaults) {
        Ok(answer) => answer,
        Err(e) => {
            tracing::warn!(error = %e, bytes = body.len(), "malformed admission review");
            return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response();
        }
    };
    let (uid, namespace) = (&answer.uid, &answer.namespace);
    match &answer.verdict {
        Verdict::Patched(ops) => tracing::info!(%uid, %namespace, ops, "sidecar injected"),
        Verdict::Skipped(reason) => tracing::debug!(%uid, %namespace, reason, "nothing to inject"),
        Verdict::Refused(reason) => tracing::info!(%uid, %namespace, %reason, "pod refused"),
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        answer.body.to_string(),
    )
        .into_response()
}

/// Serves [`router`] over TLS on `listener` until `shutdown` completes, then lets the
/// requests in flight finish (at most [`DRAIN_TIMEOUT`]).
///
/// A failed or slow handshake ends only its own connection, never the listener.
pub async fn run(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    defaults: SidecarDefaults,
    shutdown: impl Future<Output = ()>,
) {
    let acceptor = TlsAcceptor::from(tls);
    let service = TowerToHyperService::new(router(defaults));
    let stop = CancellationToken::new();
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            () = &mut shutdown => break,
            // Reap finished connections so the set does not grow for ever.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: wait a little instead of
                    // spinning on an accept that fails at once.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let (acceptor, service, stop) = (acceptor.clone(), service.clone(), stop.clone());
        connections.spawn(async move {
            let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp));
            let tls = tokio::select! {
                () = stop.cancelled() => return,
                result = handshake => match result {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "TLS handshake timed out");
                        return;
                    }
                },
            };
            let mut builder = auto::Builder::new(TokioExecutor::new());
            // Drop a connection that sends no complete request head in time.
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(HANDSHAKE_TIMEOUT);
            let connection = builder.serve_connection(TokioIo::new(tls), service);
            tokio::pin!(connection);
            let result = tokio::select! {
                result = connection.as_mut() => result,
                () = stop.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(e) = result {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    tracing::info!(connections = connections.len(), "shutting down");
    stop.cancel();
    let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            connections = connections.len(),
            "drain timeout: closing connections"
        );
        connections.shutdown().await;
    }
}
