//! Holders inside a session, through real gRPC on every store (memory, a real Redis,
//! a real Redis Cluster, Redlock over three masters): two holders of one session
//! exclude, share and take permits exactly as two sessions would, reentrancy is per
//! (session, holder, key), and a bad holder or an undecodable message is refused
//! without ending the session.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::topology::ClusterSetup;
use common::{
    Client, LeaseStream, Redis, Sidecar, StoreKind, acquire, make_store, namespace, secs,
};
use lockside::engine::EngineConfig;
use lockside::proto::{self, lease_response, not_acquired::Reason};
use lockside::store::Store;
use lockside::store::redlock::RedlockStore;
use tonic::Code;

/// A sidecar in this process on one store, with what keeps the store's servers alive.
struct Subject {
    sidecar: Sidecar,
    client: Client,
    kind: &'static str,
    _redis: Vec<Redis>,
    _cluster: Option<Arc<ClusterSetup>>,
}

async fn subject(kind: &'static str, config: EngineConfig) -> Subject {
    let ns = namespace();
    let (store, redis, cluster): (Arc<dyn Store>, Vec<Redis>, _) = match kind {
        "memory" => (make_store(&StoreKind::Memory, &ns), Vec::new(), None),
        "redis" => {
            let redis = Redis::start();
            let store = make_store(&StoreKind::Redis(redis.url()), &ns);
            (store, vec![redis], None)
        }
        "cluster" => {
            let cluster = tokio::task::block_in_place(ClusterSetup::shared);
            let store = make_store(&StoreKind::Redis(cluster.url()), &ns);
            (store, Vec::new(), Some(cluster))
        }
        _ => {
            let masters: Vec<Redis> = (0..3).map(|_| Redis::start()).collect();
            let hosts: Vec<String> = masters
                .iter()
                .map(|r| format!("127.0.0.1:{}", r.port))
                .collect();
            let url = format!("redlock://{}", hosts.join(","));
            let store = RedlockStore::new(&url, &ns, Duration::from_secs(1)).expect("redlock");
            (Arc::new(store), masters, None)
        }
    };
    let sidecar = Sidecar::start_with(store, config).await;
    let client = sidecar.client().await;
    Subject {
        sidecar,
        client,
        kind,
        _redis: redis,
        _cluster: cluster,
    }
}

/// Runs each `async fn NAME(Subject)` once per store, as `memory::NAME`, `redis::NAME`,
/// `cluster::NAME` and `redlock::NAME`.
macro_rules! on_every_store {
    ($($name:ident),* $(,)?) => {
        on_every_store!(@kind memory, "memory", $($name),*);
        on_every_store!(@kind redis, "redis", $($name),*);
        on_every_store!(@kind cluster, "cluster", $($name),*);
        on_every_store!(@kind redlock, "redlock", $($name),*);
    };
    (@kind $module:ident, $kind:literal, $($name:ident),*) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::subject($kind, Default::default()).await).await;
                }
            )*
        }
    };
}

on_every_store!(
    two_holders_of_one_session_exclude_each_other,
    reentrancy_is_per_holder,
    shared_holders_of_one_session_hold_together,
    a_semaphore_gives_each_holder_its_own_permit,
    fair_waiters_are_served_in_order_across_holders_and_sessions,
    a_release_naming_another_holder_changes_nothing,
    a_bad_holder_is_refused_and_the_session_goes_on,
    the_end_of_the_stream_releases_every_holders_locks,
);

fn by(holder: &str, a: proto::Acquire) -> proto::Acquire {
    proto::Acquire {
        holder: holder.into(),
        ..a
    }
}

fn wait(a: proto::Acquire) -> proto::Acquire {
    proto::Acquire {
        wait_timeout: Some(secs(20.0)),
        ..a
    }
}

async fn granted(lease: &mut LeaseStream, a: proto::Acquire) -> proto::Granted {
    let holder = a.holder.clone();
    let id = lease.send_acquire(a).await;
    let g = lease.expect_granted(id).await;
    assert_eq!(g.holder, holder, "Granted names its holder");
    g
}

async fn busy(lease: &mut LeaseStream, a: proto::Acquire) {
    let holder = a.holder.clone();
    let id = lease.send_acquire(a).await;
    match lease.next().await {
        lease_response::Event::NotAcquired(n) if n.request_id == id => {
            assert_eq!(n.reason, Reason::Busy as i32);
            assert_eq!(n.holder, holder, "NotAcquired names its holder");
        }
        other => panic!("expected NotAcquired BUSY for {id}, got {other:?}"),
    }
}

/// Sends a waiting acquire and reads its `Waiting`; returns the request id.
async fn waits(lease: &mut LeaseStream, a: proto::Acquire) -> (u64, u32) {
    let holder = a.holder.clone();
    let id = lease.send_acquire(wait(a)).await;
    match lease.next().await {
        lease_response::Event::Waiting(w) if w.request_id == id => {
            assert_eq!(w.holder, holder, "Waiting names its holder");
            (id, w.position)
        }
        other => panic!("expected Waiting for {id}, got {other:?}"),
    }
}

async fn release(lease: &mut LeaseStream, key: &str, holder: &str) -> u32 {
    let id = lease.send_release_of(key, holder).await;
    match lease.next().await {
        lease_response::Event::Released(r) if r.request_id == id => {
            assert_eq!(r.holder, holder, "Released names its holder");
            r.hold_count
        }
        other => panic!("expected Released for {id}, got {other:?}"),
    }
}

/// The holders `Describe` shows, as (session, holder, hold count).
async fn holders(client: &Client, key: &str) -> Vec<(String, String, u32)> {
    let mut holders: Vec<_> = (client.describe(key).await.holders.into_iter())
        .map(|h| (h.session_id, h.holder, h.hold_count))
        .collect();
    holders.sort();
    holders
}

async fn two_holders_of_one_session_exclude_each_other(s: Subject) {
    let mut lease = s.client.lease().await;
    let first = granted(&mut lease, by("a", acquire("k"))).await;
    busy(&mut lease, by("b", acquire("k"))).await;
    busy(&mut lease, acquire("k")).await; // the session itself is a holder too
    let (id, _) = waits(&mut lease, by("b", acquire("k"))).await;
    assert_eq!(release(&mut lease, "k", "a").await, 0);
    let second = lease.expect_granted(id).await;
    assert_eq!(second.holder, "b");
    assert!(second.fencing_token > first.fencing_token);
    let sid = lease.session_id.clone();
    assert_eq!(holders(&s.client, "k").await, [(sid, "b".into(), 1)]);
}

async fn reentrancy_is_per_holder(s: Subject) {
    let mut lease = s.client.lease().await;
    let first = granted(&mut lease, by("a", acquire("k"))).await;
    let again = granted(&mut lease, by("a", acquire("k"))).await;
    assert_eq!(
        (again.hold_count, again.fencing_token),
        (2, first.fencing_token)
    );
    busy(&mut lease, by("b", acquire("k"))).await;
    let sid = lease.session_id.clone();
    assert_eq!(holders(&s.client, "k").await, [(sid, "a".into(), 2)]);
    assert_eq!(release(&mut lease, "k", "a").await, 1);
    busy(&mut lease, by("b", acquire("k"))).await;
    assert_eq!(release(&mut lease, "k", "a").await, 0);
    granted(&mut lease, by("b", acquire("k"))).await;
}

async fn shared_holders_of_one_session_hold_together(s: Subject) {
    let shared = |holder: &str| proto::Acquire {
        mode: proto::LockMode::Shared as i32,
        ..by(holder, acquire("r"))
    };
    let mut lease = s.client.lease().await;
    let a = granted(&mut lease, shared("a")).await;
    let b = granted(&mut lease, shared("b")).await;
    assert_ne!(a.fencing_token, b.fencing_token, "two grants, two tokens");
    // A writer of the same session waits for both readers, as another session would.
    let (id, _) = waits(&mut lease, by("w", acquire("r"))).await;
    let sid = lease.session_id.clone();
    assert_eq!(
        holders(&s.client, "r").await,
        [(sid.clone(), "a".into(), 1), (sid.clone(), "b".into(), 1)]
    );
    assert_eq!(release(&mut lease, "r", "a").await, 0);
    assert_eq!(release(&mut lease, "r", "b").await, 0);
    assert_eq!(lease.expect_granted(id).await.holder, "w");
}

async fn a_semaphore_gives_each_holder_its_own_permit(s: Subject) {
    let permit = |holder: &str| proto::Acquire {
        limit: 2,
        ..by(holder, acquire("pool"))
    };
    let mut lease = s.client.lease().await;
    if s.kind == "redlock" {
        let id = lease.send_acquire(permit("a")).await;
        let r = lease.expect_rejected(id).await;
        assert_eq!(
            (r.code, r.holder.as_str()),
            (Code::Unimplemented as i32, "a")
        );
        return;
    }
    granted(&mut lease, permit("a")).await;
    granted(&mut lease, permit("b")).await;
    let (id, _) = waits(&mut lease, permit("c")).await;
    assert_eq!(holders(&s.client, "pool").await.len(), 2);
    assert_eq!(release(&mut lease, "pool", "b").await, 0);
    assert_eq!(lease.expect_granted(id).await.holder, "c");
    let held: Vec<String> = (holders(&s.client, "pool").await.into_iter())
        .map(|(_, holder, _)| holder)
        .collect();
    assert_eq!(held, ["a", "c"]);
}

async fn fair_waiters_are_served_in_order_across_holders_and_sessions(s: Subject) {
    let fair = |holder: &str| proto::Acquire {
        fair: true,
        ..by(holder, acquire("q"))
    };
    let mut one = s.client.lease().await;
    if s.kind == "redlock" {
        let id = one.send_acquire(fair("a")).await;
        assert_eq!(
            one.expect_rejected(id).await.code,
            Code::Unimplemented as i32
        );
        return;
    }
    let mut two = s.client.lease().await;
    granted(&mut one, fair("a1")).await;
    let (first, p1) = waits(&mut one, fair("a2")).await;
    let (second, p2) = waits(&mut two, fair("")).await;
    let (third, p3) = waits(&mut one, fair("a3")).await;
    assert_eq!((p1, p2, p3), (1, 2, 3));
    let queue: Vec<(String, String)> = (s.client.describe("q").await.queue.into_iter())
        .map(|w| (w.session_id, w.holder))
        .collect();
    let (sid1, sid2) = (one.session_id.clone(), two.session_id.clone());
    assert_eq!(
        queue,
        [
            (sid1.clone(), "a2".into()),
            (sid2, String::new()),
            (sid1, "a3".into())
        ]
    );
    assert_eq!(release(&mut one, "q", "a1").await, 0);
    assert_eq!(one.expect_granted(first).await.holder, "a2");
    assert_eq!(release(&mut one, "q", "a2").await, 0);
    two.expect_granted(second).await;
    assert_eq!(release(&mut two, "q", "").await, 0);
    assert_eq!(one.expect_granted(third).await.holder, "a3");
}

async fn a_release_naming_another_holder_changes_nothing(s: Subject) {
    let mut lease = s.client.lease().await;
    granted(&mut lease, by("a", acquire("k"))).await;
    for holder in ["b", ""] {
        let id = lease.send_release_of("k", holder).await;
        let r = lease.expect_rejected(id).await;
        assert_eq!(
            (r.code, r.holder.as_str()),
            (Code::FailedPrecondition as i32, holder)
        );
    }
    let sid = lease.session_id.clone();
    assert_eq!(holders(&s.client, "k").await, [(sid, "a".into(), 1)]);
    // A Release by a holder that only waits cancels its wait, and nothing else.
    let (id, _) = waits(&mut lease, by("b", acquire("k"))).await;
    lease.send_release_of("k", "b").await;
    match lease.next().await {
        lease_response::Event::NotAcquired(n) if n.request_id == id => {
            assert_eq!(
                (n.reason, n.holder.as_str()),
                (Reason::Cancelled as i32, "b")
            );
        }
        other => panic!("expected NotAcquired CANCELLED, got {other:?}"),
    }
    assert_eq!(release(&mut lease, "k", "a").await, 0);
}

async fn a_bad_holder_is_refused_and_the_session_goes_on(s: Subject) {
    let mut lease = s.client.lease().await;
    let held = granted(&mut lease, acquire("precious")).await;
    for bad in ["h".repeat(129), "a\nb".into(), "a\0b".into()] {
        let id = lease.send_acquire(by(&bad, acquire("k"))).await;
        let r = lease.expect_rejected(id).await;
        assert_eq!(r.code, Code::InvalidArgument as i32, "{bad:?}: {r:?}");
        assert!(r.message.contains("holder"), "{r:?}");
        assert!(r.holder.len() <= 64, "the echo is cut short");
    }
    granted(&mut lease, by(&"h".repeat(128), acquire("k"))).await;
    let again = granted(&mut lease, acquire("precious")).await;
    assert_eq!(
        (again.hold_count, again.fencing_token),
        (2, held.fencing_token)
    );
}

async fn the_end_of_the_stream_releases_every_holders_locks(s: Subject) {
    let mut lease = s.client.lease().await;
    for holder in ["a", "b", ""] {
        granted(&mut lease, by(holder, acquire(&format!("k-{holder}")))).await;
    }
    let mut other = s.client.lease().await;
    let (id, _) = waits(&mut other, acquire("k-a")).await;
    drop(lease);
    other.expect_granted(id).await;
    for key in ["k-b", "k-"] {
        granted(&mut other, wait(acquire(key))).await;
    }
}

/// The session's lock limit counts every holder's grants.
#[tokio::test]
async fn the_lock_limit_counts_every_holders_grants() {
    let config = EngineConfig {
        max_locks_per_session: 2,
        ..EngineConfig::default()
    };
    let s = subject("memory", config).await;
    let mut lease = s.client.lease().await;
    granted(&mut lease, by("a", acquire("k"))).await;
    granted(&mut lease, by("b", acquire("other"))).await;
    let id = lease.send_acquire(by("c", acquire("k"))).await;
    let r = lease.expect_rejected(id).await;
    assert_eq!(r.code, Code::ResourceExhausted as i32, "{r:?}");
    drop(s.sidecar);
}

/// A `LeaseRequest` whose key is not UTF-8 (what a JavaScript string cut inside a
/// surrogate pair encodes to): prost cannot decode it, yet the session is not ended:
/// the request is answered `Rejected` INVALID_ARGUMENT with its id, and every lock of
/// the session is still held.
#[tokio::test]
async fn an_undecodable_request_is_rejected_and_the_session_goes_on() {
    let s = subject("memory", EngineConfig::default()).await;
    let (tx, rx) = tokio::sync::mpsc::channel::<Vec<u8>>(8);
    let mut responses = raw::lease(&s.sidecar.addr, rx).await;
    assert!(matches!(
        next(&mut responses).await,
        lease_response::Event::Started(_)
    ));
    tx.send(raw::acquire(1, b"precious")).await.expect("send");
    assert!(matches!(
        next(&mut responses).await,
        lease_response::Event::Granted(_)
    ));
    // "a", a lone surrogate's three bytes (WTF-8), "b": not UTF-8.
    let bad = raw::acquire(2, b"a\xed\xa0\x80b");
    tx.send(bad).await.expect("send");
    match next(&mut responses).await {
        lease_response::Event::Rejected(r) => {
            assert_eq!(
                (r.request_id, r.code),
                (2, Code::InvalidArgument as i32),
                "{r:?}"
            );
            assert!(r.message.contains("UTF-8"), "{r:?}");
        }
        other => panic!("expected Rejected, got {other:?}"),
    }
    let d = s.client.describe("precious").await;
    assert_eq!(d.holders.len(), 1, "the session's lock is still held");
    tx.send(raw::acquire(3, b"precious")).await.expect("send");
    match next(&mut responses).await {
        lease_response::Event::Granted(g) => assert_eq!((g.request_id, g.hold_count), (3, 2)),
        other => panic!("the session goes on: {other:?}"),
    }
}

/// The next event on a raw stream; panics if none comes in time or the stream ends.
async fn next(responses: &mut tonic::Streaming<proto::LeaseResponse>) -> lease_response::Event {
    let message = tokio::time::timeout(Duration::from_secs(10), responses.message())
        .await
        .expect("an answer in time")
        .expect("the stream goes on")
        .expect("a message");
    message.event.expect("an event")
}

/// A `Lease` stream whose requests are raw protobuf bytes, to send what no typed
/// client can (a `string` field that is not UTF-8).
mod raw {
    use lockside::proto::LeaseResponse;
    use prost::Message;
    use tokio_stream::wrappers::ReceiverStream;
    use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
    use tonic::{Status, Streaming};

    /// A `LeaseRequest` with an `Acquire` of `key` (any bytes) as `request_id`.
    pub fn acquire(request_id: u64, key: &[u8]) -> Vec<u8> {
        use prost::encoding::encode_varint;
        let mut acquire = vec![0x08]; // field 1, varint: request_id
        encode_varint(request_id, &mut acquire);
        acquire.push(0x12); // field 2, bytes: key
        encode_varint(key.len() as u64, &mut acquire);
        acquire.extend_from_slice(key);
        let mut request = vec![0x0a]; // field 1, message: acquire
        encode_varint(acquire.len() as u64, &mut request);
        request.extend(acquire);
        request
    }

    #[derive(Default)]
    struct RawCodec;

    struct RawEncoder;
    struct ResponseDecoder;

    impl Encoder for RawEncoder {
        type Item = Vec<u8>;
        type Error = Status;
        fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
            use prost::bytes::BufMut;
            dst.put_slice(&item);
            Ok(())
        }
    }

    impl Decoder for ResponseDecoder {
        type Item = LeaseResponse;
        type Error = Status;
        fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<LeaseResponse>, Status> {
            LeaseResponse::decode(src)
                .map(Some)
                .map_err(|e| Status::internal(e.to_string()))
        }
    }

    impl Codec for RawCodec {
        type Encode = Vec<u8>;
        type Decode = LeaseResponse;
        type Encoder = RawEncoder;
        type Decoder = ResponseDecoder;
        fn encoder(&mut self) -> RawEncoder {
            RawEncoder
        }
        fn decoder(&mut self) -> ResponseDecoder {
            ResponseDecoder
        }
    }

    pub async fn lease(
        addr: &str,
        requests: tokio::sync::mpsc::Receiver<Vec<u8>>,
    ) -> Streaming<LeaseResponse> {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect");
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.expect("ready");
        let path = "/lockside.v1.LockService/Lease".parse().expect("path");
        let request = tonic::Request::new(ReceiverStream::new(requests));
        grpc.streaming(request, path, RawCodec)
            .await
            .expect("lease accepted")
            .into_inner()
    }
}

/// The Rust client: each `lock()` is a holder of its own (a session of its own), so
/// two guards of one key taken through one `Client` exclude each other, whatever
/// task holds them.
#[tokio::test]
async fn each_lock_of_the_rust_client_is_a_holder_of_its_own() {
    use lockside::client::{ClientError, LockOptions, NotAcquired};
    let s = subject("memory", EngineConfig::default()).await;
    let client = lockside::client::Client::connect(&s.sidecar.addr)
        .await
        .expect("connect");
    let first = client.lock("k").await.expect("first lock");
    let busy = client.lock_with("k", LockOptions::default()).await;
    assert!(
        matches!(busy, Err(ClientError::NotAcquired(NotAcquired::Busy))),
        "{busy:?}"
    );
    let waiting = tokio::spawn({
        let client = client.clone();
        async move { client.lock("k").await }
    });
    let token = first.fencing_token();
    first.release().await.expect("release");
    let second = waiting.await.expect("task").expect("second lock");
    assert!(second.fencing_token() > token);
}
