//! The core's objects as Python sees them: a client, a held lock, a watch. Each call
//! that waits releases the GIL (sync) or returns at once and finishes through the
//! client's `Completions` (asyncio, a token naming the awaiting future); nothing here
//! makes a thread per call.

use std::sync::Arc;
use std::time::Duration;

use lockside_client::proto::DescribeResponse;
use lockside_client::{
    Client, ClientError, ClientSettings, ClientTls, ConnectOptions, LockHandle, LockOptions,
    LockState, WatchStream,
};
use pyo3::prelude::*;
use tokio_stream::StreamExt;

use crate::events::{Completions, CompletionsInner, Outcome, state_changed};
use crate::{ForkSafe, failure, failure_args, runtime};

/// A duration from seconds the package checked (finite, not negative).
pub(crate) fn seconds(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX)
}

fn duration_s(d: Option<prost_duration::Duration>) -> f64 {
    d.map(|d| d.seconds as f64 + f64::from(d.nanos) / 1e9)
        .unwrap_or(0.0)
}

mod prost_duration {
    pub(crate) use lockside_client::proto::prost_types::Duration;
}

type HolderRow = (String, u32, f64, String, Vec<u8>, u64, String);
type QueueRow = (String, String, i32, u32, String);
type DescribeRow = (String, i32, u32, Vec<HolderRow>, u32, u64, Vec<QueueRow>);

fn describe_row(r: DescribeResponse) -> DescribeRow {
    (
        r.key,
        r.mode,
        r.limit,
        r.holders
            .into_iter()
            .map(|h| {
                (
                    h.session_id,
                    h.hold_count,
                    duration_s(h.ttl_remaining),
                    h.client_name,
                    h.value,
                    h.fencing_token,
                    h.holder,
                )
            })
            .collect(),
        r.waiters,
        r.fencing_token,
        r.queue
            .into_iter()
            .map(|q| (q.session_id, q.client_name, q.mode, q.position, q.holder))
            .collect(),
    )
}

/// TLS as the package gives it: the CA, this client's certificate and key (PEM), the
/// name the sidecar's certificate carries.
type Tls = (
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Option<String>,
);

/// A client of the core, with its session.
#[pyclass(frozen)]
pub(crate) struct NativeClient {
    client: ForkSafe<Client>,
}

impl NativeClient {
    pub(crate) fn client(&self) -> PyResult<&Client> {
        self.client.get().ok_or_else(|| {
            failure(ClientError::Settings(
                "the client belongs to the process that forked this one".into(),
            ))
        })
    }
}

/// What `acquire` is given: key, wait (None: do not wait), ttl, shared, limit, fair,
/// value, holder.
type Asked = (
    String,
    Option<f64>,
    Option<f64>,
    bool,
    u32,
    bool,
    Vec<u8>,
    String,
);

fn options(asked: &Asked) -> LockOptions {
    let (_, wait, ttl, shared, limit, fair, value, _) = asked;
    LockOptions {
        wait: wait.map(seconds),
        ttl: ttl.map(seconds),
        shared: *shared,
        limit: *limit,
        fair: *fair,
        value: value.clone(),
    }
}

pub(crate) fn spawn_for(
    completions: &Completions,
    token: u64,
    work: impl Future<Output = Outcome> + Send + 'static,
) -> NativeTask {
    let inner: Arc<CompletionsInner> = completions.inner.clone();
    let task = runtime().spawn(async move {
        let outcome = work.await;
        inner.finish(token, outcome);
    });
    NativeTask {
        task: ForkSafe::new(task.abort_handle()),
    }
}

pub(crate) fn failed(e: ClientError) -> Outcome {
    Outcome::Failed(failure_args(e))
}

#[pymethods]
impl NativeClient {
    #[new]
    #[pyo3(signature = (addr, client_name, auth_token, tls, connect_timeout, resume, wait_for_sidecar))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        addr: String,
        client_name: Option<String>,
        auth_token: Option<String>,
        tls: Option<Tls>,
        connect_timeout: f64,
        resume: bool,
        wait_for_sidecar: f64,
    ) -> PyResult<Self> {
        let options = ConnectOptions {
            auth_token,
            tls: tls.map(|(ca_pem, cert, key, server_name)| ClientTls {
                ca_pem,
                identity: cert.zip(key),
                server_name,
            }),
            wait_for_sidecar: (wait_for_sidecar > 0.0).then(|| seconds(wait_for_sidecar)),
            client_name,
        };
        let settings = ClientSettings {
            resume,
            connect_timeout: seconds(connect_timeout),
            listener: Some(Arc::new(state_changed)),
        };
        let rt = runtime();
        let _entered = rt.enter();
        let client = Client::lazy(&addr, &options, settings).map_err(failure)?;
        Ok(Self {
            client: ForkSafe::new(client),
        })
    }

    fn session_id(&self) -> PyResult<Option<String>> {
        Ok(self.client()?.session_id())
    }

    #[pyo3(signature = (key, wait, ttl, shared, limit, fair, value, holder))]
    #[allow(clippy::too_many_arguments)]
    fn acquire(
        &self,
        py: Python<'_>,
        key: String,
        wait: Option<f64>,
        ttl: Option<f64>,
        shared: bool,
        limit: u32,
        fair: bool,
        value: Vec<u8>,
        holder: String,
    ) -> PyResult<NativeLock> {
        let client = self.client()?.clone();
        let asked = (key, wait, ttl, shared, limit, fair, value, holder);
        let options = options(&asked);
        let rt = runtime();
        let handle = py
            .detach(|| {
                rt.block_on(async { client.acquire(&asked.0, &options, Some(&asked.7)).await })
            })
            .map_err(failure)?;
        Ok(NativeLock::new(handle))
    }

    #[pyo3(signature = (completions, token, key, wait, ttl, shared, limit, fair, value, holder))]
    #[allow(clippy::too_many_arguments)]
    fn acquire_async(
        &self,
        completions: &Completions,
        token: u64,
        key: String,
        wait: Option<f64>,
        ttl: Option<f64>,
        shared: bool,
        limit: u32,
        fair: bool,
        value: Vec<u8>,
        holder: String,
    ) -> PyResult<NativeTask> {
        let client = self.client()?.clone();
        let asked = (key, wait, ttl, shared, limit, fair, value, holder);
        let options = options(&asked);
        Ok(spawn_for(completions, token, async move {
            match client.acquire(&asked.0, &options, Some(&asked.7)).await {
                Ok(handle) => Outcome::Value(Box::new(move |py| {
                    Ok(Py::new(py, NativeLock::new(handle))?.into_any())
                })),
                Err(e) => failed(e),
            }
        }))
    }

    fn describe(&self, py: Python<'_>, key: String, timeout: f64) -> PyResult<DescribeRow> {
        let client = self.client()?.clone();
        let rt = runtime();
        let within = seconds(timeout);
        py.detach(|| {
            rt.block_on(async {
                match tokio::time::timeout(within, client.describe(&key)).await {
                    Ok(answer) => answer,
                    Err(_) => Err(ClientError::Unavailable(format!(
                        "no answer from the sidecar within {timeout}s"
                    ))),
                }
            })
        })
        .map(describe_row)
        .map_err(failure)
    }

    fn describe_async(
        &self,
        completions: &Completions,
        token: u64,
        key: String,
        timeout: f64,
    ) -> PyResult<NativeTask> {
        let client = self.client()?.clone();
        let within = seconds(timeout);
        Ok(spawn_for(completions, token, async move {
            match tokio::time::timeout(within, client.describe(&key)).await {
                Ok(Ok(r)) => {
                    let row = describe_row(r);
                    Outcome::Value(Box::new(move |py| {
                        Ok(row.into_pyobject(py)?.into_any().unbind())
                    }))
                }
                Ok(Err(e)) => failed(e),
                Err(_) => failed(ClientError::Unavailable(format!(
                    "no answer from the sidecar within {timeout}s"
                ))),
            }
        }))
    }

    fn watch(&self, key: String) -> PyResult<NativeWatch> {
        let client = self.client()?.clone();
        Ok(NativeWatch {
            client: ForkSafe::new(client),
            key,
            stream: Arc::new(tokio::sync::Mutex::new(None)),
        })
    }

    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let Some(client) = self.client.get().cloned() else {
            return Ok(());
        };
        let rt = runtime();
        py.detach(|| rt.block_on(client.close()));
        Ok(())
    }

    fn close_async(&self, completions: &Completions, token: u64) -> PyResult<NativeTask> {
        let client = self.client()?.clone();
        Ok(spawn_for(completions, token, async move {
            client.close().await;
            Outcome::Value(Box::new(|py| Ok(py.None())))
        }))
    }
}

/// An asyncio request under way: `cancel()` when the awaiting task is cancelled (the
/// core then gives the request up: a wait is cancelled on the sidecar).
#[pyclass(frozen)]
pub(crate) struct NativeTask {
    task: ForkSafe<tokio::task::AbortHandle>,
}

#[pymethods]
impl NativeTask {
    fn cancel(&self) {
        if let Some(task) = self.task.get() {
            task.abort();
        }
    }
}

/// A held lock.
#[pyclass(frozen)]
pub(crate) struct NativeLock {
    handle: ForkSafe<LockHandle>,
    #[pyo3(get)]
    id: u64,
    #[pyo3(get)]
    key: String,
    #[pyo3(get)]
    holder: String,
    #[pyo3(get)]
    fencing_token: u64,
    #[pyo3(get)]
    ttl: f64,
    #[pyo3(get)]
    hold_count: u32,
    #[pyo3(get)]
    session_id: String,
}

impl NativeLock {
    pub(crate) fn new(handle: LockHandle) -> Self {
        let cell = handle.cell();
        Self {
            id: cell.id(),
            key: cell.key().to_owned(),
            holder: cell.holder().to_owned(),
            fencing_token: cell.fencing_token(),
            ttl: cell.ttl().as_secs_f64(),
            hold_count: cell.hold_count(),
            session_id: cell.session_id().to_owned(),
            handle: ForkSafe::new(handle),
        }
    }
}

#[pymethods]
impl NativeLock {
    /// `("held" | "suspended" | "lost", reason)`.
    fn state(&self) -> (&'static str, String) {
        match self.handle.get().map(|h| h.cell().state()) {
            Some(LockState::Held) => ("held", String::new()),
            Some(LockState::Suspended) => ("suspended", String::new()),
            Some(LockState::Lost(why)) => ("lost", why),
            None => ("lost", "held by the process that forked this one".into()),
        }
    }

    /// Gives the lock back; returns once the `Release` is on the stream. Raises
    /// `Failure("lost")` (once) for a lock lost before.
    fn release(&self) -> PyResult<()> {
        match self.handle.get() {
            Some(handle) => handle.release().map_err(failure),
            None => Ok(()),
        }
    }

    fn proclaim(&self, py: Python<'_>, value: Vec<u8>) -> PyResult<()> {
        let Some(handle) = self.handle.get().cloned() else {
            return Err(failure(ClientError::Lost));
        };
        let rt = runtime();
        py.detach(|| rt.block_on(handle.proclaim(value)))
            .map_err(failure)
    }

    fn proclaim_async(
        &self,
        completions: &Completions,
        token: u64,
        value: Vec<u8>,
    ) -> PyResult<NativeTask> {
        let Some(handle) = self.handle.get().cloned() else {
            return Err(failure(ClientError::Lost));
        };
        Ok(spawn_for(completions, token, async move {
            match handle.proclaim(value).await {
                Ok(()) => Outcome::Value(Box::new(|py| Ok(py.None()))),
                Err(e) => failed(e),
            }
        }))
    }
}

/// A watch of one key: its stream of states, opened on the first `next`.
#[pyclass(frozen)]
pub(crate) struct NativeWatch {
    client: ForkSafe<Client>,
    key: String,
    stream: Arc<tokio::sync::Mutex<Option<WatchStream>>>,
}

async fn next_state(
    client: Client,
    key: String,
    stream: Arc<tokio::sync::Mutex<Option<WatchStream>>>,
) -> Result<Option<DescribeResponse>, ClientError> {
    let mut stream = stream.lock().await;
    if stream.is_none() {
        *stream = Some(client.watch(&key).await?);
    }
    match stream.as_mut() {
        Some(states) => states.next().await.transpose(),
        None => Ok(None),
    }
}

#[pymethods]
impl NativeWatch {
    /// The next state (None at the end), waiting for it with the GIL released.
    fn next(&self, py: Python<'_>) -> PyResult<Option<DescribeRow>> {
        let Some(client) = self.client.get().cloned() else {
            return Ok(None);
        };
        let (key, stream) = (self.key.clone(), self.stream.clone());
        let rt = runtime();
        py.detach(|| rt.block_on(next_state(client, key, stream)))
            .map(|state| state.map(describe_row))
            .map_err(failure)
    }

    fn next_async(&self, completions: &Completions, token: u64) -> PyResult<NativeTask> {
        let Some(client) = self.client.get().cloned() else {
            return Err(failure(ClientError::Unavailable(
                "the watch belongs to another process".into(),
            )));
        };
        let (key, stream) = (self.key.clone(), self.stream.clone());
        Ok(spawn_for(completions, token, async move {
            match next_state(client, key, stream).await {
                Ok(state) => {
                    let row = state.map(describe_row);
                    Outcome::Value(Box::new(move |py| {
                        Ok(row.into_pyobject(py)?.into_any().unbind())
                    }))
                }
                Err(e) => failed(e),
            }
        }))
    }

    /// Ends the watch.
    fn cancel(&self) {
        if self.client.get().is_none() {
            return;
        }
        // Dropping the stream ends the call; a `next` under way returns at its end.
        if let Ok(mut stream) = self.stream.try_lock() {
            *stream = None;
        }
    }
}
