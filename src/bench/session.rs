//! One `Lease` stream as a client sees it: the gRPC helper every sidecar phase drives.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::timeout;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use super::err;
use crate::proto::lease_request::Command as Cmd;
use crate::proto::lease_response::Event as E;
use crate::proto::lock_service_client::LockServiceClient;
use crate::proto::{Acquire, LeaseRequest, LeaseResponse, Release};

/// Longest wait for one answer: above the 30 s `wait_timeout` of contended acquires, so
/// a sidecar that never answers fails the bench instead of hanging it.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(35);

/// One `Lease` stream, as a client sees it.
pub(super) struct Session {
    /// Requests to the sidecar; dropping it ends the stream.
    pub(super) tx: mpsc::Sender<LeaseRequest>,
    /// Events from the sidecar.
    pub(super) rx: tonic::Streaming<LeaseResponse>,
    next_id: u64,
}

/// The answer a session waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Want {
    Granted,
    Waiting,
    Released,
}

impl Session {
    /// Opens a `Lease` stream on `channel` and waits for its `SessionStarted`.
    pub(super) async fn open(channel: Channel) -> Result<Self, String> {
        let (tx, rx) = mpsc::channel(1024);
        let mut client = LockServiceClient::new(channel);
        let lease = timeout(ANSWER_TIMEOUT, client.lease(ReceiverStream::new(rx))).await;
        let response = lease.map_err(err("Lease"))?.map_err(err("Lease"))?;
        let mut session = Self {
            tx,
            rx: response.into_inner(),
            next_id: 1,
        };
        match session.event().await? {
            E::Started(_) => Ok(session),
            other => Err(format!("first event was {other:?}, not SessionStarted")),
        }
    }

    /// The next event; the end of the stream, or none within [`ANSWER_TIMEOUT`], is an
    /// error.
    pub(super) async fn event(&mut self) -> Result<E, String> {
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
    pub(super) async fn acquire(
        &mut self,
        key: &str,
        wait: Option<Duration>,
        ttl: Option<Duration>,
    ) -> Result<u64, String> {
        let (wait_timeout, ttl) = (wait.map(pb_duration), ttl.map(pb_duration));
        let (request_id, key) = (self.next_id, key.to_owned());
        let acquire = Acquire {
            request_id,
            key,
            wait_timeout,
            ttl,
            ..Default::default()
        };
        self.send(Cmd::Acquire(acquire)).await
    }

    /// Sends a `Release` of `key` and returns its request id.
    pub(super) async fn release(&mut self, key: &str) -> Result<u64, String> {
        let release = Release {
            request_id: self.next_id,
            key: key.to_owned(),
        };
        self.send(Cmd::Release(release)).await
    }

    /// Waits for `want` in answer to request `id`; a `Waiting` before a `Granted` is
    /// skipped. Anything else is an error: no phase expects it.
    pub(super) async fn wait_for(&mut self, id: u64, want: Want) -> Result<(), String> {
        loop {
            let event = self.event().await?;
            let got = match &event {
                E::Granted(g) if g.request_id == id => Some(Want::Granted),
                E::Waiting(w) if w.request_id == id => Some(Want::Waiting),
                E::Released(r) if r.request_id == id => Some(Want::Released),
                _ => None,
            };
            match got {
                Some(got) if got == want => return Ok(()),
                Some(Want::Waiting) if want == Want::Granted => {}
                _ => return Err(format!("expected {want:?} for request {id}, got {event:?}")),
            }
        }
    }
}

fn pb_duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration::try_from(d).unwrap_or_default()
}
