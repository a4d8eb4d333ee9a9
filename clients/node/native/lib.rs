//! The Node package's binding to the client core (`crates/lockside-client`), a
//! Node-API addon (`lockside.linux-x64-gnu.node`) that napi-rs builds. The package's
//! TypeScript (`src/`) keeps the idioms (Promises, `EventEmitter`s, `AbortSignal`s,
//! the error classes, the types); every rule of the session is the core's.
//!
//! - `lib.rs`: the module, the runtime the core runs on (one I/O thread per process,
//!   which also runs every `async fn` here), and how a core error reaches JavaScript.
//! - `objects.rs`: `NativeClient`, `NativeLock`, `NativeWatch`.
//! - `several.rs`: several keys at once (`NativeClient.acquireAll`, `client.lockAll`).
//! - `events.rs`: what the core tells JavaScript without being asked (locks' state
//!   changes and log lines), through one thread-safe function that never keeps the
//!   process alive.

mod events;
mod objects;
mod several;

use std::sync::OnceLock;

use lockside_client::{ClientError, NotAcquired, Refusal};
use napi_derive::module_init;
use tokio::runtime::Handle;

/// The runtime's handle: the core's lazy client is made inside it.
static RUNTIME: OnceLock<Handle> = OnceLock::new();

#[module_init]
fn init() {
    if RUNTIME.get().is_some() {
        return; // another worker thread loaded the addon first
    }
    // One I/O thread: the core's work per lock is small, and a second thread would
    // only add wake-ups (as in the Python package).
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("lockside-io")
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(_) => return, // napi makes its own then
    };
    if RUNTIME.set(runtime.handle().clone()).is_ok() {
        napi::bindgen_prelude::create_custom_tokio_runtime(runtime);
    }
    events::install_logging();
}

pub(crate) fn runtime() -> Option<&'static Handle> {
    RUNTIME.get()
}

/// Separates the fields of a core error in the message JavaScript receives; the
/// package splits it (`src/errors.ts`, `fromNative`).
const SEP: char = '\u{1f}';

/// A core error as a JavaScript `Error` whose message is `LOCKSIDE␟kind␟code␟reason␟
/// message`: kind `unavailable`, `no_sidecar` (reason: the cause as Node words it,
/// message: the address), `not_acquired` (reason BUSY, TIMEOUT, CANCELLED or
/// UNSPECIFIED), `rejected` (code: the google.rpc code), `lost` or `settings`.
pub(crate) fn failure(e: ClientError) -> napi::Error {
    let (kind, code, reason, message) = match e {
        ClientError::Unavailable(message) => ("unavailable", 14, String::new(), message),
        ClientError::NoSidecar { addr, cause } => {
            let reason = match &cause {
                Refusal::Refused => format!("connect ECONNREFUSED {addr}"),
                Refusal::NoSuchSocket => format!(
                    "connect ENOENT {}",
                    addr.strip_prefix("unix:").unwrap_or(&addr)
                ),
                Refusal::UnknownHost => format!("getaddrinfo ENOTFOUND {addr}"),
                Refusal::PermissionDenied => format!("connect EACCES {addr}"),
                Refusal::Other(words) => words.clone(),
            };
            ("no_sidecar", 14, reason, addr)
        }
        ClientError::NotAcquired(why) => {
            let reason = match why {
                NotAcquired::Busy => "BUSY",
                NotAcquired::TimedOut(_) => "TIMEOUT",
                NotAcquired::Cancelled => "CANCELLED",
                NotAcquired::Other(_) => "UNSPECIFIED",
            };
            ("not_acquired", 0, reason.to_owned(), String::new())
        }
        ClientError::Rejected { code, message } => ("rejected", code, String::new(), message),
        ClientError::Lost => ("lost", 0, String::new(), String::new()),
        ClientError::Settings(message) => ("settings", 0, String::new(), message),
    };
    napi::Error::from_reason(format!(
        "LOCKSIDE{SEP}{kind}{SEP}{code}{SEP}{reason}{SEP}{message}"
    ))
}
