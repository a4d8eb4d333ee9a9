//! Lockside: a per-pod gRPC sidecar that gives applications distributed locks on Redis.
//! An application opens one `Lease` stream; while it stays open the sidecar renews the
//! application's locks, and when it ends, for any reason, the sidecar releases them.
//!
//! # Layout
//!
//! Data flows one way: [`api`] → [`engine`] → [`store`]. `ARCHITECTURE.md` at the
//! repository's root has the code map (what each folder owns and never imports), the
//! invariants and where each kind of test lives; `tests/layout_architecture.rs` keeps the
//! import rules and the size of a file (at most 400 lines).
//!
//! - [`proto`]: the contract: generated gRPC types and [`proto::limits`].
//! - [`api`]: the gRPC service; protobuf ⇄ engine, the only place for gRPC codes.
//! - [`engine`]: sessions, renewals, waiters, deadlines; no Redis, no protobuf.
//! - [`store`]: the [`store::Store`] trait; memory, Redis (Lua in `store/lua/`), Redlock.
//! - [`server`], [`admin`], [`metrics`], [`telemetry`]: listeners and shutdown, health
//!   and `/metrics`, logs and traces.
//! - [`cli`]: the command line, one file per subcommand; [`parse`]: leaf parsers.
//! - [`client`]: the Rust client (contract only).
//! - [`webhook`]: the Kubernetes sidecar injector.
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
