//! Lockside: a per-pod gRPC sidecar that gives applications distributed locks on Redis.
//! An application opens one `Lease` stream; while it stays open the sidecar renews the
//! application's locks, and when it ends, for any reason, the sidecar releases them.
//!
//! # Layout
//!
//! Data flows one way: `api` → `engine` → `store`.
//!
//! - [`proto`]: the generated gRPC types of `proto/lockside/v1/lockside.proto`.
//! - [`api`]: the tonic service; protobuf in, engine calls, protobuf out. The only place
//!   where outcomes become gRPC codes.
//! - [`engine`]: sessions (`engine/session/`, one task per `Lease` stream), the
//!   sidecar-wide batched renewer (`engine/renewer.rs`), local waiters woken by release
//!   notices (`engine/wakers.rs`), watched keys (`engine/watches.rs`: one reader per
//!   key for all its `Watch` streams). Knows no Redis and no protobuf.
//! - [`store`]: the [`store::Store`] trait and its implementations: `store/memory.rs`
//!   (embedded) and `store/redis.rs` with one Lua script per state change in
//!   `store/lua/`; `store/redis/options.rs` (URLs, topologies, TLS files),
//!   `store/redis/link.rs` (the shared connection; on a Cluster, redis-rs' cluster
//!   connection), `store/redis/notices.rs` (the release-notice subscription),
//!   `store/redis/shards.rs` (Cluster: hash slots, sharded notices per waited-on key),
//!   `store/redis/renew.rs` (batched renewals, per node on a Cluster, answered per
//!   grant),
//!   `store/redis/acked.rs` (replica acknowledgement, `WAIT`); `store/redlock.rs`
//!   (Redlock over independent masters).
//! - [`admin`]: gRPC health (SERVING while the store answers) and the admin listener
//!   (`/livez`, `/readyz`, `/metrics`); [`metrics`]: the Prometheus metrics, with
//!   `metrics/store.rs` wrapping the engine's store to count and time every call.
//!   Alert rules and a dashboard for them: `deploy/observability/`.
//! - [`server`]: listeners, HTTP/2 keepalive, and the shutdown sequence; [`server::run`]
//!   is the entry point tests call on port 0.
//! - [`telemetry`]: logs (text or JSON) and OTLP traces, with the caller's W3C trace
//!   context as parent.
//! - [`cli`]: the command line, a file per subcommand (`serve`, `hold`, `elect`,
//!   `leader`, `watch`, `describe`, `webhook`); the client commands use [`client`].
//! - [`client`]: a Rust client: `Client::connect`, `lock(key)` → a guard with the
//!   fencing token and a `lost()` future; `campaign(key, value)` → a leader guard with
//!   `proclaim()`; `watch(key)` → a `Stream` of the key's states.
//! - [`bench`]: the benchmark, sidecar against direct Redis in one run.
//! - [`webhook`]: `lockside webhook`, the Kubernetes admission webhook that injects the
//!   sidecar: `webhook/patch.rs` (Pod JSON → JSONPatch, pure), `webhook/sidecar.rs`
//!   (the injected container), `webhook/review.rs`
//!   (the `AdmissionReview` v1 envelope), `webhook/tls.rs` (certificate, reloaded),
//!   `webhook/mod.rs` (flags and the HTTPS server; [`webhook::run`] for tests).
//! - `main.rs`: a thin `main` that parses flags (exit 64 on bad ones) and runs.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admin;
pub mod api;
pub mod cli;
pub mod client;
pub mod engine;
pub mod metrics;
pub mod parse;
pub mod proto;
pub mod server;
pub mod store;
pub mod telemetry;
pub mod webhook;
