//! The core's objects as JavaScript sees them: a client, a held lock, a watch. Every
//! call that waits is an `async fn` (a Promise in JavaScript) run on the core's I/O
//! thread; nothing here blocks the JavaScript thread.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockside_client::proto::DescribeResponse;
use lockside_client::{
    Client, ClientError, ClientSettings, ClientTls, ConnectOptions, LockHandle, LockOptions,
    WatchStream,
};
use napi::bindgen_prelude::Buffer;
use napi_derive::napi;
use tokio::sync::oneshot;
use tokio_stream::StreamExt;

use crate::events::{state_changed, state_of};
use crate::{failure, runtime};

/// A duration from seconds the package checked (finite, not negative).
pub(crate) fn seconds(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX)
}

/// TLS as the package gives it (PEM).
#[napi(object)]
pub struct NativeTls {
    pub ca: Option<Buffer>,
    pub cert: Option<Buffer>,
    pub key: Option<Buffer>,
    pub server_name: Option<String>,
}

/// One holder of a key, as `describe()` reads it.
#[napi(object)]
pub struct NativeHolder {
    pub session_id: String,
    pub holder: String,
    pub hold_count: u32,
    pub ttl_remaining: f64,
    pub client_name: String,
    pub value: Buffer,
    /// A u64 in decimal (the package makes it a bigint).
    pub fencing_token: String,
}

/// One fair waiter of a key.
#[napi(object)]
pub struct NativeWaiter {
    pub session_id: String,
    pub holder: String,
    pub client_name: String,
    /// The proto's `LockMode` number.
    pub mode: i32,
    pub position: u32,
}

/// The store's view of a key (the proto's `DescribeResponse`).
#[napi(object)]
pub struct NativeDescription {
    pub key: String,
    pub mode: i32,
    pub limit: u32,
    pub holders: Vec<NativeHolder>,
    pub waiters: u32,
    pub fencing_token: String,
    pub queue: Vec<NativeWaiter>,
}

fn description(r: DescribeResponse) -> NativeDescription {
    let secs = |d: Option<lockside_client::proto::prost_types::Duration>| {
        d.map(|d| d.seconds as f64 + f64::from(d.nanos) / 1e9)
            .unwrap_or(0.0)
    };
    NativeDescription {
        key: r.key,
        mode: r.mode,
        limit: r.limit,
        holders: r
            .holders
            .into_iter()
            .map(|h| NativeHolder {
                session_id: h.session_id,
                holder: h.holder,
                hold_count: h.hold_count,
                ttl_remaining: secs(h.ttl_remaining),
                client_name: h.client_name,
                value: h.value.into(),
                fencing_token: h.fencing_token.to_string(),
            })
            .collect(),
        waiters: r.waiters,
        fencing_token: r.fencing_token.to_string(),
        queue: r
            .queue
            .into_iter()
            .map(|q| NativeWaiter {
                session_id: q.session_id,
                holder: q.holder,
                client_name: q.client_name,
                mode: q.mode,
                position: q.position,
            })
            .collect(),
    }
}

/// A client of the core, with its session.
#[napi]
pub struct NativeClient {
    client: Client,
    /// Acquires under way, by the package's number for each: dropping the sender
    /// gives the acquire up (its wait is cancelled on the sidecar).
    giving_up: Arc<Mutex<HashMap<u32, oneshot::Sender<()>>>>,
}

impl NativeClient {
    /// Registers the acquire `request`: what it receives says it was given up.
    fn asking(&self, request: u32) -> oneshot::Receiver<()> {
        let (give_up, given_up) = oneshot::channel();
        if let Ok(mut map) = self.giving_up.lock() {
            map.insert(request, give_up);
        }
        given_up
    }

    /// The acquire `request` is answered: nothing to give up any more.
    fn asked(&self, request: u32) {
        if let Ok(mut map) = self.giving_up.lock() {
            map.remove(&request);
        }
    }
}

#[napi]
impl NativeClient {
    /// `addr`: `host:port`, `unix:/path` or `http(s)://host:port`.
    #[napi(constructor)]
    pub fn new(
        addr: String,
        client_name: Option<String>,
        auth_token: Option<String>,
        tls: Option<NativeTls>,
        connect_timeout: f64,
        resume: bool,
    ) -> napi::Result<Self> {
        let options = ConnectOptions {
            auth_token,
            tls: tls.map(|t| ClientTls {
                ca_pem: t.ca.map(|b| b.to_vec()),
                identity: t.cert.map(|b| b.to_vec()).zip(t.key.map(|b| b.to_vec())),
                server_name: t.server_name,
            }),
            // The package waits for a sidecar itself, saying so on the console.
            wait_for_sidecar: None,
            client_name,
        };
        let settings = ClientSettings {
            resume,
            connect_timeout: seconds(connect_timeout),
            listener: Some(Arc::new(state_changed)),
        };
        let runtime = runtime().ok_or_else(|| {
            napi::Error::from_reason("the lockside addon has no runtime (it failed to start)")
        })?;
        let _entered = runtime.enter();
        let client = Client::lazy(&addr, &options, settings).map_err(failure)?;
        Ok(Self {
            client,
            giving_up: Arc::default(),
        })
    }

    /// The current session's id, if there is one.
    #[napi]
    pub fn session_id(&self) -> Option<String> {
        self.client.session_id()
    }

    /// Takes `key` (the package checked the values); `request` names the call for
    /// `give_up`. `holder`: undefined for a holder of its own.
    #[napi]
    #[allow(clippy::too_many_arguments)]
    pub async fn acquire(
        &self,
        request: u32,
        key: String,
        wait: Option<f64>,
        ttl: Option<f64>,
        shared: bool,
        limit: u32,
        fair: bool,
        value: Buffer,
        holder: Option<String>,
    ) -> napi::Result<NativeLock> {
        let options = LockOptions {
            wait: wait.map(seconds),
            ttl: ttl.map(seconds),
            shared,
            limit,
            fair,
            value: value.to_vec(),
        };
        let given_up = self.asking(request);
        let client = self.client.clone();
        let acquired = tokio::select! {
            acquired = client.acquire(&key, &options, holder.as_deref()) => Some(acquired),
            _ = given_up => None,
        };
        self.asked(request);
        match acquired {
            Some(Ok(handle)) => Ok(NativeLock::new(handle)),
            Some(Err(e)) => Err(failure(e)),
            None => Err(failure(ClientError::NotAcquired(
                lockside_client::NotAcquired::Cancelled,
            ))),
        }
    }

    /// Takes every key of `keys` at once for `holder`, all or none (`several.rs`);
    /// `request` names the call for `give_up`. The locks come in the order asked.
    #[napi]
    #[allow(clippy::too_many_arguments)]
    pub async fn acquire_all(
        &self,
        request: u32,
        keys: Vec<String>,
        wait: Option<f64>,
        ttl: Option<f64>,
        shared: bool,
        fair: bool,
        holder: Option<String>,
    ) -> napi::Result<Vec<NativeLock>> {
        let options = crate::several::options(wait, ttl, shared, fair);
        let given_up = self.asking(request);
        let acquired =
            crate::several::acquire_all(&self.client, &keys, &options, holder, given_up).await;
        self.asked(request);
        acquired
    }

    /// Gives up the acquire named `request` (an aborted signal).
    #[napi]
    pub fn give_up(&self, request: u32) {
        if let Ok(mut map) = self.giving_up.lock()
            && let Some(give_up) = map.remove(&request)
        {
            let _ = give_up.send(());
        }
    }

    /// The store's view of `key`, within `timeout` seconds.
    #[napi]
    pub async fn describe(&self, key: String, timeout: f64) -> napi::Result<NativeDescription> {
        let client = self.client.clone();
        match tokio::time::timeout(seconds(timeout), client.describe(&key)).await {
            Ok(Ok(r)) => Ok(description(r)),
            Ok(Err(e)) => Err(failure(e)),
            Err(_) => Err(failure(ClientError::Unavailable(format!(
                "describe: no answer from the sidecar within {timeout} s"
            )))),
        }
    }

    /// A watch of `key`, opened on its first `next()`.
    #[napi]
    pub fn watch(&self, key: String) -> NativeWatch {
        NativeWatch {
            client: self.client.clone(),
            key,
            stream: Arc::new(tokio::sync::Mutex::new(None)),
            ended: Arc::default(),
        }
    }

    /// Ends the session (the sidecar releases every lock; they are let go).
    #[napi]
    pub async fn close(&self) {
        self.client.clone().close().await;
    }
}

/// A held lock.
#[napi]
pub struct NativeLock {
    handle: LockHandle,
}

impl NativeLock {
    pub(crate) fn new(handle: LockHandle) -> Self {
        Self { handle }
    }
}

#[napi]
impl NativeLock {
    /// A number of its own in the process: the listener's news names it.
    #[napi(getter)]
    pub fn id(&self) -> i64 {
        self.handle.cell().id() as i64
    }
    #[napi(getter)]
    pub fn key(&self) -> String {
        self.handle.cell().key().to_owned()
    }
    #[napi(getter)]
    pub fn holder(&self) -> String {
        self.handle.cell().holder().to_owned()
    }
    /// A u64 in decimal.
    #[napi(getter)]
    pub fn fencing_token(&self) -> String {
        self.handle.cell().fencing_token().to_string()
    }
    /// Seconds of validity the sidecar reported with the grant.
    #[napi(getter)]
    pub fn ttl(&self) -> f64 {
        self.handle.cell().ttl().as_secs_f64()
    }
    #[napi(getter)]
    pub fn hold_count(&self) -> u32 {
        self.handle.cell().hold_count()
    }
    #[napi(getter)]
    pub fn session_id(&self) -> String {
        self.handle.cell().session_id().to_owned()
    }

    /// `"held"`, `"suspended"` or `"lost"`.
    #[napi]
    pub fn state(&self) -> &'static str {
        state_of(self.handle.cell()).0
    }

    /// Why it is suspended or lost (empty while held).
    #[napi]
    pub fn reason(&self) -> String {
        state_of(self.handle.cell()).1
    }

    /// Gives the lock back; returns once the `Release` is on the stream. Throws
    /// `lost` (once) for a lock lost before.
    #[napi]
    pub fn release(&self) -> napi::Result<()> {
        self.handle.release().map_err(failure)
    }

    /// Replaces the grant's value and waits for the answer.
    #[napi]
    pub async fn proclaim(&self, value: Buffer) -> napi::Result<()> {
        let handle = self.handle.clone();
        handle.proclaim(value.to_vec()).await.map_err(failure)
    }
}

/// A watch of one key: its stream of states, opened on the first `next`.
#[napi]
pub struct NativeWatch {
    client: Client,
    key: String,
    stream: Arc<tokio::sync::Mutex<Option<WatchStream>>>,
    ended: Arc<std::sync::atomic::AtomicBool>,
}

#[napi]
impl NativeWatch {
    /// The next state; undefined once the watch ended (`cancel`).
    #[napi]
    pub async fn next(&self) -> napi::Result<Option<NativeDescription>> {
        use std::sync::atomic::Ordering;
        let (client, key) = (self.client.clone(), self.key.clone());
        let (stream, ended) = (self.stream.clone(), self.ended.clone());
        let mut stream = stream.lock().await;
        if ended.load(Ordering::Relaxed) {
            return Ok(None);
        }
        if stream.is_none() {
            *stream = Some(client.watch(&key).await.map_err(failure)?);
        }
        let Some(states) = stream.as_mut() else {
            return Ok(None);
        };
        // `cancel` wakes a `next` under way through the stream's end.
        let state = tokio::select! {
            state = states.next() => state,
            _ = wait_ended(&ended) => None,
        };
        match state {
            Some(Ok(state)) => Ok(Some(description(state))),
            Some(Err(e)) => Err(failure(e)),
            None => Ok(None),
        }
    }

    /// Ends the watch (a `next` under way resolves undefined).
    #[napi]
    pub fn cancel(&self) {
        self.ended.store(true, std::sync::atomic::Ordering::Relaxed);
        CANCELLED.notify_waiters();
    }
}

static CANCELLED: tokio::sync::Notify = tokio::sync::Notify::const_new();

async fn wait_ended(ended: &std::sync::atomic::AtomicBool) {
    loop {
        let notified = CANCELLED.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if ended.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        notified.await;
    }
}
