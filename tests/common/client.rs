//! A small `LeaseStream` client for tests: a connection ([`Client`]) and one stream driven
//! request by request ([`LeaseStream`]), with helpers for common conversations.

use std::time::Duration;

use lockside::proto::lock_service_client::LockServiceClient;
use lockside::proto::{self, lease_request, lease_response};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};

use super::PATIENCE;

/// A gRPC connection to a sidecar.
#[derive(Clone)]
pub struct Client {
    pub grpc: LockServiceClient<Channel>,
}

impl Client {
    pub async fn connect(addr: &str) -> Self {
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .expect("endpoint")
            .http2_keep_alive_interval(Duration::from_secs(1))
            .keep_alive_timeout(Duration::from_secs(1))
            .connect()
            .await
            .expect("connect to sidecar");
        Self {
            grpc: LockServiceClient::new(channel),
        }
    }

    /// Opens a LeaseStream stream and reads its SessionStarted.
    pub async fn lease(&self) -> LeaseStream {
        self.lease_named("").await
    }

    pub async fn lease_named(&self, name: &str) -> LeaseStream {
        let (tx, rx) = mpsc::channel(1024);
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        if !name.is_empty() {
            request
                .metadata_mut()
                .insert("lockside-client-name", name.parse().expect("ascii name"));
        }
        let mut grpc = self.grpc.clone();
        let responses = tokio::time::timeout(PATIENCE, grpc.lease(request))
            .await
            .expect("lease in time")
            .expect("lease accepted")
            .into_inner();
        LeaseStream::open(tx, responses).await
    }

    /// Opens a LeaseStream that resumes the session of `token`; the refusal's status
    /// if it is refused.
    pub async fn resume(&self, token: &str) -> Result<LeaseStream, tonic::Status> {
        let (tx, rx) = mpsc::channel(1024);
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        let value = token
            .parse()
            .map_err(|_| tonic::Status::invalid_argument("not a header value"))?;
        request.metadata_mut().insert("lockside-resume", value);
        let mut grpc = self.grpc.clone();
        let responses = tokio::time::timeout(PATIENCE, grpc.lease(request))
            .await
            .expect("lease in time")?
            .into_inner();
        Ok(LeaseStream::open(tx, responses).await)
    }

    pub async fn describe(&self, key: &str) -> proto::DescribeResponse {
        let mut grpc = self.grpc.clone();
        grpc.describe(proto::DescribeRequest { key: key.into() })
            .await
            .expect("describe")
            .into_inner()
    }
}

/// Why a resume was refused (its `lockside-resume-refused` trailer: `unknown` or
/// `attached`), or what else it was.
pub fn refusal(status: &tonic::Status) -> String {
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    let detail = status.metadata().get("lockside-resume-refused");
    detail
        .and_then(|v| v.to_str().ok())
        .unwrap_or("none")
        .to_owned()
}

/// One open `LeaseStream` stream.
pub struct LeaseStream {
    tx: Option<mpsc::Sender<proto::LeaseRequest>>,
    rx: tonic::Streaming<proto::LeaseResponse>,
    pub session_id: String,
    /// `SessionStarted.resume_token`.
    pub resume_token: String,
    /// `SessionStarted.resumed_locks`.
    pub resumed_locks: u32,
    next_id: u64,
}

pub fn secs(d: f64) -> prost_types::Duration {
    prost_types::Duration::try_from(Duration::from_secs_f64(d)).expect("duration")
}

/// Builds an Acquire with everything but id and key at its default.
pub fn acquire(key: &str) -> proto::Acquire {
    proto::Acquire {
        key: key.into(),
        ..Default::default()
    }
}

impl LeaseStream {
    /// The stream's first event must be `SessionStarted`.
    async fn open(
        tx: mpsc::Sender<proto::LeaseRequest>,
        rx: tonic::Streaming<proto::LeaseResponse>,
    ) -> Self {
        let mut lease = LeaseStream {
            tx: Some(tx),
            rx,
            session_id: String::new(),
            resume_token: String::new(),
            resumed_locks: 0,
            next_id: 1,
        };
        match lease.next().await {
            lease_response::Event::Started(s) => {
                lease.session_id = s.session_id;
                lease.resume_token = s.resume_token;
                lease.resumed_locks = s.resumed_locks;
            }
            other => panic!("first event must be SessionStarted, got {other:?}"),
        }
        lease
    }

    pub async fn send(&self, command: lease_request::Command) {
        self.tx
            .as_ref()
            .expect("stream open")
            .send(proto::LeaseRequest {
                command: Some(command),
            })
            .await
            .expect("send");
    }

    pub async fn send_raw(&self, request: proto::LeaseRequest) {
        self.tx
            .as_ref()
            .expect("stream open")
            .send(request)
            .await
            .expect("send");
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Sends an Acquire (its request_id is set here) and returns the id.
    pub async fn send_acquire(&mut self, mut a: proto::Acquire) -> u64 {
        if a.request_id == 0 {
            a.request_id = self.id();
        }
        let id = a.request_id;
        self.send(lease_request::Command::Acquire(a)).await;
        id
    }

    /// Sends an AcquireAll (its request_id is set here) and returns the id.
    pub async fn send_acquire_all(&mut self, mut a: proto::AcquireAll) -> u64 {
        if a.request_id == 0 {
            a.request_id = self.id();
        }
        let id = a.request_id;
        self.send(lease_request::Command::AcquireAll(a)).await;
        id
    }

    /// The `GrantedAll` for `id`, after any `Waiting` for it.
    pub async fn granted_all_after_wait(&mut self, id: u64) -> proto::GrantedAll {
        loop {
            match self.next().await {
                lease_response::Event::Waiting(w) if w.request_id == id => continue,
                lease_response::Event::GrantedAll(g) if g.request_id == id => return g,
                other => panic!("expected GrantedAll for {id}, got {other:?}"),
            }
        }
    }

    /// The `NotAcquired` for `id` (after any `Waiting` for it): its key and reason.
    pub async fn not_acquired_after_wait(&mut self, id: u64) -> (String, i32) {
        loop {
            match self.next().await {
                lease_response::Event::Waiting(w) if w.request_id == id => continue,
                lease_response::Event::NotAcquired(n) if n.request_id == id => {
                    return (n.key, n.reason);
                }
                other => panic!("expected NotAcquired for {id}, got {other:?}"),
            }
        }
    }

    pub async fn send_release(&mut self, key: &str) -> u64 {
        self.send_release_of(key, "").await
    }

    /// Sends a Release of `holder`'s hold of `key`; returns its id.
    pub async fn send_release_of(&mut self, key: &str, holder: &str) -> u64 {
        let id = self.id();
        self.send(lease_request::Command::Release(proto::Release {
            request_id: id,
            key: key.into(),
            holder: holder.into(),
        }))
        .await;
        id
    }

    /// The next event; panics if none comes in time or the stream ends.
    pub async fn next(&mut self) -> lease_response::Event {
        match self.try_next().await {
            Ok(Some(event)) => event,
            Ok(None) => panic!("stream ended"),
            Err(status) => panic!("stream failed: {status}"),
        }
    }

    /// The next event, the end of the stream, or its error status.
    pub async fn try_next(&mut self) -> Result<Option<lease_response::Event>, tonic::Status> {
        let message = tokio::time::timeout(PATIENCE, self.rx.next())
            .await
            .expect("an event in time");
        match message {
            None => Ok(None),
            Some(Err(status)) => Err(status),
            Some(Ok(response)) => Ok(Some(response.event.expect("event set"))),
        }
    }

    /// Acquires `key` without waiting and expects a grant; returns it.
    pub async fn grant(&mut self, key: &str) -> proto::Granted {
        let id = self.send_acquire(acquire(key)).await;
        self.expect_granted(id).await
    }

    pub async fn expect_granted(&mut self, id: u64) -> proto::Granted {
        match self.next().await {
            lease_response::Event::Granted(g) if g.request_id == id => g,
            other => panic!("expected Granted for {id}, got {other:?}"),
        }
    }

    /// The grant for `id`, after any `Waiting` for it.
    pub async fn granted_after_wait(&mut self, id: u64) -> proto::Granted {
        loop {
            match self.next().await {
                lease_response::Event::Waiting(w) if w.request_id == id => continue,
                lease_response::Event::Granted(g) if g.request_id == id => return g,
                other => panic!("expected Granted for {id}, got {other:?}"),
            }
        }
    }

    pub async fn expect_not_acquired(&mut self, id: u64) -> i32 {
        match self.next().await {
            lease_response::Event::NotAcquired(n) if n.request_id == id => n.reason,
            other => panic!("expected NotAcquired for {id}, got {other:?}"),
        }
    }

    pub async fn expect_waiting(&mut self, id: u64) {
        match self.next().await {
            lease_response::Event::Waiting(w) if w.request_id == id => {}
            other => panic!("expected Waiting for {id}, got {other:?}"),
        }
    }

    pub async fn expect_released(&mut self, id: u64) -> u32 {
        match self.next().await {
            lease_response::Event::Released(r) if r.request_id == id => r.hold_count,
            other => panic!("expected Released for {id}, got {other:?}"),
        }
    }

    pub async fn expect_rejected(&mut self, id: u64) -> proto::Rejected {
        match self.next().await {
            lease_response::Event::Rejected(r) if r.request_id == id => r,
            other => panic!("expected Rejected for {id}, got {other:?}"),
        }
    }

    pub async fn release(&mut self, key: &str) -> u32 {
        let id = self.send_release(key).await;
        self.expect_released(id).await
    }

    /// Half-closes the request side, as a client that is done.
    pub fn close(&mut self) {
        self.tx = None;
    }
}

/// Builds an AcquireAll of `keys` with everything else at its default.
pub fn acquire_all(keys: &[&str]) -> proto::AcquireAll {
    proto::AcquireAll {
        keys: keys.iter().map(|k| (*k).to_owned()).collect(),
        ..Default::default()
    }
}

/// An Acquire that waits up to `seconds`.
pub fn waiting_for(key: &str, seconds: f64) -> proto::Acquire {
    proto::Acquire {
        wait_timeout: Some(secs(seconds)),
        ..acquire(key)
    }
}

/// `key` held by `holder` with a 30 s TTL; `waiter` (on another sidecar) waits, and gets
/// it within a second of the release: woken by the release notice, not by its next
/// look (at TTL/3). Both hold nothing after. Returns the time from release to grant.
pub async fn handoff(holder: &mut LeaseStream, waiter: &mut LeaseStream, key: &str) -> Duration {
    let id = holder
        .send_acquire(proto::Acquire {
            ttl: Some(secs(30.0)),
            ..acquire(key)
        })
        .await;
    let first = holder.expect_granted(id).await;
    let id = waiter.send_acquire(waiting_for(key, 10.0)).await;
    waiter.expect_waiting(id).await;
    let released = tokio::time::Instant::now();
    assert_eq!(holder.release(key).await, 0);
    let next = waiter.expect_granted(id).await;
    let took = released.elapsed();
    assert!(next.fencing_token > first.fencing_token);
    assert!(took < Duration::from_secs(1), "{key}: woken after {took:?}");
    assert_eq!(waiter.release(key).await, 0);
    took
}

/// Resumes `token` on `client`, retrying while its old sidecar is still attached
/// (FAILED_PRECONDITION, `attached`): a refusal as unknown fails the test.
pub async fn resume(client: &Client, token: &str) -> LeaseStream {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match client.resume(token).await {
            Ok(lease) => return lease,
            Err(status) if status.code() == tonic::Code::FailedPrecondition => {
                assert_eq!(refusal(&status), "attached", "{status:?}");
            }
            Err(status) => panic!("resume: {status}"),
        }
        assert!(tokio::time::Instant::now() < deadline, "resumed in time");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The events that follow a resumed `SessionStarted`, by key.
pub async fn greeting(
    lease: &mut LeaseStream,
) -> std::collections::BTreeMap<String, lease_response::Event> {
    let mut events = std::collections::BTreeMap::new();
    for _ in 0..lease.resumed_locks {
        let event = lease.next().await;
        let key = match &event {
            lease_response::Event::Granted(g) => {
                assert_eq!(g.request_id, 0, "resumed grants answer no request");
                g.key.clone()
            }
            lease_response::Event::Lost(l) => l.key.clone(),
            other => panic!("expected Granted or Lost after a resume, got {other:?}"),
        };
        events.insert(key, event);
    }
    events
}

pub fn granted(event: &lease_response::Event) -> &proto::Granted {
    match event {
        lease_response::Event::Granted(g) => g,
        other => panic!("expected Granted, got {other:?}"),
    }
}
