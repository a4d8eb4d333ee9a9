//! The Rust client of the Lockside sidecar: the client core (`crates/lockside-client`),
//! which the Python and Node packages share, re-exported here so that the command line
//! and the tests keep one path to it. `Client::connect`, then `lock(key)` returns a
//! guard that holds the lock until it is dropped or released, exposes the fencing
//! token, and says when the lock is suspended (the stream broke) or lost.
//!
//! ```no_run
//! # async fn demo() -> Result<(), lockside::client::ClientError> {
//! use lockside::client::Client;
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
//! One client is one session; each `lock()` is a holder of its own in it, so two
//! guards of one key exclude each other like two processes. Leader election:
//! [`Client::campaign`] returns a [`Leader`]; followers [`Client::watch`] the key.

pub use lockside_client::*;
