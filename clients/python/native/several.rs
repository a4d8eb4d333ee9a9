//! Several keys at once through the core (`Client::acquire_all`): what
//! `Client.lock_all` and `AsyncClient.lock_all` call. Functions of the module rather
//! than methods, so that `objects.rs` stays one room: the client is their first
//! argument.

use lockside_client::LockOptions;
use pyo3::prelude::*;

use crate::events::{Completions, Outcome};
use crate::objects::{NativeClient, NativeLock, NativeTask, failed, seconds, spawn_for};
use crate::{failure, runtime};

fn options(wait: Option<f64>, ttl: Option<f64>, shared: bool, fair: bool) -> LockOptions {
    LockOptions {
        wait: wait.map(seconds),
        ttl: ttl.map(seconds),
        shared,
        fair,
        ..LockOptions::default()
    }
}

/// Takes every key of `keys` for `holder`, all or none, waiting with the GIL
/// released; the locks in the order asked.
#[pyfunction]
#[pyo3(signature = (client, keys, wait, ttl, shared, fair, holder))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn acquire_all(
    py: Python<'_>,
    client: PyRef<'_, NativeClient>,
    keys: Vec<String>,
    wait: Option<f64>,
    ttl: Option<f64>,
    shared: bool,
    fair: bool,
    holder: String,
) -> PyResult<Vec<NativeLock>> {
    let client = client.client()?.clone();
    let options = options(wait, ttl, shared, fair);
    let rt = runtime();
    let handles = py
        .detach(|| rt.block_on(client.acquire_all(&keys, &options, Some(&holder))))
        .map_err(failure)?;
    Ok(handles.into_iter().map(NativeLock::new).collect())
}

/// `acquire_all` for asyncio: returns at once; the list of locks (or the failure)
/// comes through `completions` under `token`.
#[pyfunction]
#[pyo3(signature = (client, completions, token, keys, wait, ttl, shared, fair, holder))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn acquire_all_async(
    client: PyRef<'_, NativeClient>,
    completions: &Completions,
    token: u64,
    keys: Vec<String>,
    wait: Option<f64>,
    ttl: Option<f64>,
    shared: bool,
    fair: bool,
    holder: String,
) -> PyResult<NativeTask> {
    let client = client.client()?.clone();
    let options = options(wait, ttl, shared, fair);
    Ok(spawn_for(completions, token, async move {
        match client.acquire_all(&keys, &options, Some(&holder)).await {
            Ok(handles) => Outcome::Value(Box::new(move |py| {
                let locks = handles
                    .into_iter()
                    .map(|h| Py::new(py, NativeLock::new(h)))
                    .collect::<PyResult<Vec<_>>>()?;
                Ok(locks.into_pyobject(py)?.into_any().unbind())
            })),
            Err(e) => failed(e),
        }
    }))
}
