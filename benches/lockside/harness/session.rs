//! One `Lease` stream as a client sees it: the gRPC helper every sidecar phase drives.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::timeout;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use super::context::err;
use lockside::proto::lease_request::Command as Cmd;
use lockside::proto::lease_response::Event as E;
use lockside::proto::lock_service_client::LockServiceClient;
use lockside::proto::{Acquire, LeaseRequest, LeaseResponse, Release};

/// Longest wait for one answer: above the 30 s `wait_timeout` of contended acquires, so
/// a sidecar that never answers fails the bench instead of hanging it.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(35);

/// One `Lease` stream, as a client sees it.
pub(crate) struct Session {
    /// Requests to the sidecar; dropping it ends the stream.
    pub(crate) tx: mpsc::Sender<LeaseRequest>,
    /// Events from the sidecar.
    pub(crate) rx: tonic::Streaming<LeaseResponse>,
    /// The sidecar's default TTL, from `SessionStarted`; waiters refresh at a third.
    pub(crate) default_ttl: Duration,
    next_id: u64,
}

/// How an `Acquire` asks beyond key, wait and TTL; the default is a plain unfair lock.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Ask {
    /// FIFO among waiters across sidecars (`Acquire.fair`).
    pub(crate) fair: bool,
    /// 0 or 1: a lock; N > 1: a semaphore of N permits (`Acquire.limit`).
    pub(crate) limit: u32,
}

/// The answer a session waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Want {
    Granted,
    Waiting,
    Released,
}

impl Session {
    /// Opens a `Lease` stream on `channel` and waits for its `SessionStarted`.
    pub(crate) async fn open(channel: Channel) -> Result<Self, String> {
        let (tx, rx) = mpsc::channel(1024);
        let mut client = LockServiceClient::new(channel);
        let lease = timeout(ANSWER_TIMEOUT, client.lease(ReceiverStream::new(rx))).await;
        let response = lease.map_err(err("Lease"))?.map_err(err("Lease"))?;
        let mut session = Self {
            tx,
            rx: response.into_inner(),
            default_ttl: Duration::ZERO,
            next_id: 1,
        };
        match session.event().await? {
            E::Started(started) => {
                let ttl = started.default_ttl.and_then(|d| Duration::try_from(d).ok());
                session.default_ttl = ttl.unwrap_or_default();
                Ok(session)
            }
            other => Err(format!("first event was {other:?}, not SessionStarted")),
        }
    }

    /// The next event; the end of the stream, or none within [`ANSWER_TIMEOUT`], is an
    /// error.
    pub(crate) async fn event(&mut self) -> Result<E, String> {
        match timeout(ANSWER_TIMEOUT, self.rx.message()).await {
            Err(_) => Err(format!("no event within {ANSWER_TIMEOUT:?}")),
            Ok(Err(status)) => Err(format!("Lease stream failed: {status}")),
            Ok(Ok(None)) => Err("the sidecar ended the Lease stream".into()),
            Ok(Ok(Some(LeaseResponse { event }))) => event.ok_or("an empty LeaseResponse".into()),
        }
    }

    /// Sends `command`, which carries `next_id` as its request id, and returns that id.
    async fn send(&mut self, command: Cmd) -> Result<u64, String> {
        let request = LeaseRequest {
            command: Some(command),
        };
        let sent = self.tx.send(request).await;
        sent.map_err(|_| "the Lease stream is closed".to_string())?;
        self.next_id += 1;
        Ok(self.next_id - 1)
    }

    /// Sends an `Acquire` of `key` and returns its request id; `None` leaves the
    /// sidecar's default (no wait, default TTL).
    pub(crate) async fn acquire(
        &mut self,
        key: &str,
        wait: Option<Duration>,
        ttl: Option<Duration>,
    ) -> Result<u64, String> {
        let ttl = ttl.map(pb_duration);
        self.send(Cmd::Acquire(self.request(key, wait, Ask::default(), ttl)))
            .await
    }

    /// Sends an exclusive `Acquire` of `key` with the default TTL, fair and with the
    /// limit that `ask` says, and returns its request id.
    pub(crate) async fn acquire_as(
        &mut self,
        key: &str,
        wait: Option<Duration>,
        ask: Ask,
    ) -> Result<u64, String> {
        self.send(Cmd::Acquire(self.request(key, wait, ask, None)))
            .await
    }

    /// Sends an exclusive `Acquire` of `key` that carries `value` (the holder's value,
    /// as a leader's), with the default TTL, and returns its request id.
    pub(crate) async fn acquire_valued(
        &mut self,
        key: &str,
        wait: Option<Duration>,
        ask: Ask,
        value: &[u8],
    ) -> Result<u64, String> {
        let acquire = Acquire {
            value: value.to_vec(),
            ..self.request(key, wait, ask, None)
        };
        self.send(Cmd::Acquire(acquire)).await
    }

    fn request(
        &self,
        key: &str,
        wait: Option<Duration>,
        ask: Ask,
        ttl: Option<prost_types::Duration>,
    ) -> Acquire {
        Acquire {
            request_id: self.next_id,
            key: key.to_owned(),
            wait_timeout: wait.map(pb_duration),
            ttl,
            fair: ask.fair,
            limit: ask.limit,
            ..Default::default()
        }
    }

    /// Sends a `Release` of `key` and returns its request id.
    pub(crate) async fn release(&mut self, key: &str) -> Result<u64, String> {
        let release = Release {
            request_id: self.next_id,
            key: key.to_owned(),
            ..Default::default()
        };
        self.send(Cmd::Release(release)).await
    }

    /// Waits for `want` in answer to request `id`; a `Waiting` before a `Granted` is
    /// skipped, and the answer says whether one came. Anything else is an error: no
    /// phase expects it.
    pub(crate) async fn wait_for(&mut self, id: u64, want: Want) -> Result<bool, String> {
        let mut waited = false;
        loop {
            let event = self.event().await?;
            let got = match &event {
                E::Granted(g) if g.request_id == id => Some(Want::Granted),
                E::Waiting(w) if w.request_id == id => Some(Want::Waiting),
                E::Released(r) if r.request_id == id => Some(Want::Released),
                _ => None,
            };
            match got {
                Some(got) if got == want => return Ok(waited),
                Some(Want::Waiting) if want == Want::Granted => waited = true,
                _ => return Err(format!("expected {want:?} for request {id}, got {event:?}")),
            }
        }
    }
}

fn pb_duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration::try_from(d).unwrap_or_default()
}
