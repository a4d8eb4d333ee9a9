//! `lockside._native`: the Python package's binding to the client core
//! (`crates/lockside-client`). The package's Python code (`src/lockside/`) keeps the
//! idioms (context managers, `threading.Event`s and `asyncio.Event`s, holders named
//! after threads and tasks, typing, the errors); every rule of the session is the
//! core's.
//!
//! - `lib.rs`: the module, the runtime the core runs on (one I/O thread per process,
//!   made again in a forked child) and how a core error reaches Python (`Failure`).
//! - `objects.rs`: `NativeClient`, `NativeLock`, `NativeWatch`.
//! - `several.rs`: `acquire_all`, several keys at once.
//! - `events.rs`: what the core tells Python without being asked: locks' state
//!   changes and log lines (read by one Python thread, `next_events`), and the answers
//!   asyncio awaits (`Completions`, a socket the event loop watches).
#![forbid(unsafe_code)]

mod events;
mod objects;
mod several;

use std::sync::{Arc, Mutex};

use lockside_client::{ClientError, NotAcquired, Refusal};
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use tokio::runtime::Runtime;

pyo3::create_exception!(_native, Failure, PyException);

/// The runtime of this process: a forked child builds its own (the parent's has no
/// thread in the child, and its sockets and epoll set are the parent's: never touched).
static RUNTIME: Mutex<Option<(u32, Arc<Runtime>)>> = Mutex::new(None);

pub(crate) fn runtime() -> Arc<Runtime> {
    let pid = std::process::id();
    let mut current = RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((owner, runtime)) = current.as_ref()
        && *owner == pid
    {
        return runtime.clone();
    }
    if let Some(inherited) = current.take() {
        // The parent's: dropping it would touch the parent's file descriptors.
        std::mem::forget(inherited);
    }
    let runtime = Arc::new(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("lockside-io")
            .enable_all()
            .build()
            .expect("a tokio runtime"),
    );
    *current = Some((pid, runtime.clone()));
    runtime
}

/// A value made in one process that a forked child must never drop (it holds the
/// parent's channels and tasks): forgotten there instead.
pub(crate) struct ForkSafe<T> {
    pid: u32,
    value: Option<T>,
}

impl<T> ForkSafe<T> {
    pub(crate) fn new(value: T) -> Self {
        Self {
            pid: std::process::id(),
            value: Some(value),
        }
    }

    /// The value, in the process that made it; `None` in a forked child.
    pub(crate) fn get(&self) -> Option<&T> {
        if self.pid == std::process::id() {
            self.value.as_ref()
        } else {
            None
        }
    }
}

impl<T> Drop for ForkSafe<T> {
    fn drop(&mut self) {
        if let Some(value) = self.value.take()
            && self.pid != std::process::id()
        {
            std::mem::forget(value);
        }
    }
}

/// A core error as Python's `Failure(kind, message, code, reason)`; the package turns
/// it into its own exception (`_errors.py`).
pub(crate) fn failure(e: ClientError) -> PyErr {
    let (kind, message, code, reason) = failure_args(e);
    Failure::new_err((kind, message, code, reason))
}

pub(crate) fn failure_args(e: ClientError) -> (&'static str, String, i32, String) {
    match e {
        ClientError::Unavailable(message) => ("unavailable", message, 14, String::new()),
        ClientError::NoSidecar { addr, cause } => {
            let words = match cause {
                Refusal::Refused => "connection refused (nothing listens there)".to_owned(),
                Refusal::NoSuchSocket => "no such socket file".to_owned(),
                other => other.words().to_owned(),
            };
            ("no_sidecar", addr, 14, words)
        }
        ClientError::NotAcquired(why) => {
            let reason = match why {
                NotAcquired::Busy => "BUSY",
                NotAcquired::TimedOut(_) => "TIMEOUT",
                NotAcquired::Cancelled => "CANCELLED",
                NotAcquired::Other(_) => "UNSPECIFIED",
            };
            ("not_acquired", String::new(), 0, reason.to_owned())
        }
        ClientError::Rejected { code, message } => ("rejected", message, code, String::new()),
        ClientError::Lost => ("lost", String::new(), 0, String::new()),
        ClientError::Settings(message) => ("settings", message, 0, String::new()),
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    events::install_logging();
    m.add("Failure", m.py().get_type::<Failure>())?;
    m.add_class::<objects::NativeClient>()?;
    m.add_class::<objects::NativeLock>()?;
    m.add_class::<objects::NativeWatch>()?;
    m.add_class::<events::Completions>()?;
    m.add_function(wrap_pyfunction!(events::next_events, m)?)?;
    m.add_function(wrap_pyfunction!(several::acquire_all, m)?)?;
    m.add_function(wrap_pyfunction!(several::acquire_all_async, m)?)?;
    Ok(())
}
