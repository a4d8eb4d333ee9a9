//! The Lockside client core: the client's rules written once, for the Rust client
//! (`lockside::client` re-exports this crate) and the Python and Node packages (thin
//! bindings in `clients/python` and `clients/node`).
//!
//! One client is one session (one `Lease` stream) at a time with any number of locks
//! on it; each lock belongs to a holder inside the session (a Python thread or task, a
//! Node or Rust `lock()` call). When the stream breaks every lock is suspended at once,
//! and the session is resumed with its token or ends (its locks lost); a session that
//! cannot be resumed holds up nothing: the next lock opens a new one. A release returns
//! once it is on the stream (`releasing.rs` says why that is safe).
//!
//! ```no_run
//! # async fn demo() -> Result<(), lockside_client::ClientError> {
//! use lockside_client::Client;
//! let client = Client::connect("127.0.0.1:7420").await?;
//! let lock = client.lock("orders").await?;
//! let token = lock.fencing_token(); // pass it to the resource you protect
//! tokio::select! {
//!     _ = lock.lost() => { /* stop using the resource now */ }
//!     _ = async { /* the work */ } => {}
//! }
//! lock.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Layout
//!
//! - `client.rs`: [`Client`], its session opened on demand, `describe`, `watch`.
//! - `session/`: one session: requests and answers, holders' grants, a broken
//!   stream suspended and resumed, what a resumed session's greeting says.
//! - `lock.rs`: a grant and its states ([`LockCell`], [`LockState`]); [`LockGuard`],
//!   [`Leader`].
//! - `lock_all.rs`: several keys at once, all or none ([`Client::lock_all`],
//!   [`LockAllGuard`]).
//! - `holders.rs`: the names of the holders a session makes itself.
//! - `releasing.rs`: releases not answered yet, process-wide.
//! - `connect.rs`: the channel (TCP, Unix socket, TLS, token, keepalive).
//! - `error.rs`: errors in words; `limits.rs`: the contract's values a client needs;
//!   `watch.rs`: a watch's stream of states.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::time::Duration;

mod client;
mod connect;
mod error;
mod holders;
pub mod limits;
mod lock;
mod lock_all;
mod releasing;
mod session;
mod watch;

pub use client::{Client, ClientSettings, LockHandle};
pub use connect::{Bearer, ClientTls, ConnectOptions};
pub use error::{ClientError, NotAcquired, Refusal, code_name, code_words, format_duration};
pub use limits::DEFAULT_ADDR;
pub use lock::{Leader, Listener, LockCell, LockGuard, LockState};
pub use lock_all::LockAllGuard;
pub use lockside_proto as proto;
pub use session::Session;
pub use watch::WatchStream;

/// The gRPC client of a sidecar, with the bearer token.
pub(crate) type Grpc = lockside_proto::lock_service_client::LockServiceClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Bearer>,
>;

/// How to take a lock.
#[derive(Clone, Debug, Default)]
pub struct LockOptions {
    /// How long to wait when busy; `None`: do not wait.
    pub wait: Option<Duration>,
    /// The lock's TTL; `None`: the sidecar's default.
    pub ttl: Option<Duration>,
    /// Take it SHARED (a reader) rather than EXCLUSIVE.
    pub shared: bool,
    /// N > 1: one permit of a semaphore of N.
    pub limit: u32,
    /// Wait in arrival order.
    pub fair: bool,
    /// The holder's value, shown by `Describe` and `Watch` (at most 4 KiB).
    pub value: Vec<u8>,
}
