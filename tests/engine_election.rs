//! Leader election and watching a key, through the engine on a paused clock: holder
//! values and `Proclaim`, and the watch registry (states in order, a slow watcher
//! coalesced, expiry seen at the holder's expiry, outages, limits, one store listener
//! per key). The store is the real memory store, behind a switch that makes it fail as
//! an unreachable Redis would. Through gRPC: `tests/grpc_watch.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use lockside::engine::{
    AcquireRequest, Command, Engine, EngineConfig, EngineError, Event, Inbound, KeyView, Mode,
    RejectCode, WatchStream,
};
use lockside::proto::limits::MAX_VALUE_BYTES;
use lockside::store::memory::MemoryStore;
use lockside::store::{
    Acquired, Claim, KeyState, Notice, Renewal, Renewed, Sharing, Store, StoreError, StoreFuture,
};
use tokio::sync::{broadcast, mpsc};
use tokio::time::Instant;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;

/// The memory store, with a switch that makes every call fail, one that makes it lose
/// every grant a proclaim asks about, and counters of the watch registrations the
/// engine makes.
#[derive(Default)]
struct Switchable {
    inner: MemoryStore,
    down: AtomicBool,
    lost_grants: AtomicBool,
    listens: AtomicUsize,
    unlistens: AtomicUsize,
}

impl Switchable {
    fn check(&self) -> Result<(), StoreError> {
        match self.down.load(Ordering::SeqCst) {
            true => Err(StoreError::Unavailable("switched off".into())),
            false => Ok(()),
        }
    }
}

macro_rules! guarded {
    ($self:ident, $call:expr) => {
        Box::pin(async move {
            $self.check()?;
            $call.await
        })
    };
}

impl Store for Switchable {
    fn acquire<'a>(&'a self, claim: &'a Claim) -> StoreFuture<'a, Acquired> {
        guarded!(self, self.inner.acquire(claim))
    }
    fn reenter<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        count: u32,
        ttl: Duration,
    ) -> StoreFuture<'a, Option<u32>> {
        guarded!(self, self.inner.reenter(key, owner, count, ttl))
    }
    fn release<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        count: u32,
        delay: Duration,
    ) -> StoreFuture<'a, Option<u32>> {
        guarded!(self, self.inner.release(key, owner, count, delay))
    }
    fn renew<'a>(&'a self, batch: &'a [Renewal<'a>]) -> StoreFuture<'a, Vec<Renewed>> {
        guarded!(self, self.inner.renew(batch))
    }
    fn unwait<'a>(&'a self, claim: &'a Claim) -> StoreFuture<'a, ()> {
        guarded!(self, self.inner.unwait(claim))
    }
    fn describe<'a>(&'a self, key: &'a str) -> StoreFuture<'a, KeyState> {
        guarded!(self, self.inner.describe(key))
    }
    fn proclaim<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        value: &'a [u8],
    ) -> StoreFuture<'a, bool> {
        if self.lost_grants.load(Ordering::SeqCst) {
            return Box::pin(std::future::ready(Ok(false)));
        }
        guarded!(self, self.inner.proclaim(key, owner, value))
    }
    fn listen<'a>(&'a self, key: &'a str, watch: bool) -> StoreFuture<'a, ()> {
        if watch {
            self.listens.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.listen(key, watch)
    }
    fn unlisten(&self, key: &str, watch: bool) {
        if watch {
            self.unlistens.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.unlisten(key, watch)
    }
    fn ping(&self) -> StoreFuture<'_, ()> {
        guarded!(self, self.inner.ping())
    }
    fn notices(&self) -> broadcast::Receiver<Notice> {
        self.inner.notices()
    }
}

fn setup_with(config: EngineConfig) -> (Arc<Switchable>, Engine) {
    let store = Arc::new(Switchable::default());
    let engine = Engine::new(store.clone(), config);
    (store, engine)
}

fn setup() -> (Arc<Switchable>, Engine) {
    setup_with(EngineConfig::default())
}

/// A grant made straight in the store, as by a sidecar that then died: nobody renews
/// it.
fn orphan(key: &str, ttl: Duration, value: &[u8]) -> Claim {
    Claim {
        key: key.into(),
        owner: "orphan-owner".into(),
        ttl,
        wait: false,
        session_id: "dead".into(),
        client_name: "dead-sidecar".into(),
        holder: String::new(),
        sharing: Sharing::Exclusive,
        limit: 1,
        fair: true,
        value: value.to_vec(),
        ticket: None,
    }
}

/// One session driven by the test.
struct Session {
    tx: mpsc::Sender<Inbound>,
    rx: mpsc::Receiver<Event>,
    next_id: u64,
}

fn start(engine: &Engine) -> Session {
    let (tx, inbound) = mpsc::channel(64);
    let (out, rx) = mpsc::channel(4096);
    engine
        .start_session(
            "candidate".into(),
            Default::default(),
            ReceiverStream::new(inbound),
            out,
        )
        .expect("session");
    Session { tx, rx, next_id: 0 }
}

/// An exclusive, fair Acquire of `key` with `value` that waits up to a minute.
fn campaign(key: &str, value: &[u8]) -> AcquireRequest {
    AcquireRequest {
        request_id: 0,
        key: key.into(),
        wait: Some(Duration::from_secs(60)),
        mode: Mode::Exclusive,
        limit: 0,
        fair: true,
        ttl: Some(Duration::from_secs(10)),
        trace: Default::default(),
        value: value.to_vec(),
        holder: String::new(),
    }
}

impl Session {
    async fn next(&mut self) -> Event {
        loop {
            match self.rx.recv().await.expect("an event") {
                Event::Started { .. } | Event::Waiting { .. } => continue,
                event => return event,
            }
        }
    }

    async fn command(&mut self, command: impl FnOnce(u64) -> Command) -> u64 {
        self.next_id += 1;
        let command = command(self.next_id);
        self.tx.send(Inbound::Command(command)).await.expect("send");
        self.next_id
    }

    /// Acquires and expects the grant; returns its token.
    async fn granted(&mut self, mut request: AcquireRequest) -> u64 {
        let id = self
            .command(|id| {
                request.request_id = id;
                Command::Acquire(request)
            })
            .await;
        match self.next().await {
            Event::Granted {
                request_id, fence, ..
            } if request_id == id => fence,
            other => panic!("expected a grant for {id}, got {other:?}"),
        }
    }

    async fn proclaim(&mut self, key: &str, value: &[u8]) -> Event {
        let key = key.to_owned();
        let value = value.to_vec();
        self.command(|request_id| Command::Proclaim {
            request_id,
            key,
            value,
            holder: String::new(),
        })
        .await;
        self.next().await
    }

    async fn proclaimed(&mut self, key: &str, value: &[u8]) {
        match self.proclaim(key, value).await {
            Event::Proclaimed { key: k, .. } if k == key => {}
            other => panic!("expected Proclaimed, got {other:?}"),
        }
    }

    async fn release(&mut self, key: &str) {
        let key = key.to_owned();
        self.command(|request_id| Command::Release {
            request_id,
            key,
            holder: String::new(),
        })
        .await;
        match self.next().await {
            Event::Released { hold_count: 0, .. } => {}
            other => panic!("expected Released, got {other:?}"),
        }
    }
}

/// The next state of a watch, within a (paused-clock) minute.
async fn state(watch: &mut WatchStream) -> KeyView {
    tokio::time::timeout(Duration::from_secs(60), watch.next())
        .await
        .expect("a state in time")
        .expect("the watch goes on")
        .expect("a state, not an error")
}

/// The one holder's value and token.
fn leader(view: &KeyView) -> (Vec<u8>, u64) {
    assert_eq!(view.holders.len(), 1, "{view:?}");
    (view.holders[0].value.clone(), view.holders[0].fence)
}

#[tokio::test(start_paused = true)]
async fn values_are_granted_proclaimed_and_shown() {
    let (store, engine) = setup();
    let mut a = start(&engine);
    let token = a.granted(campaign("jobs", b"web-1:8080")).await;
    let view = engine.describe("jobs").await.expect("describe");
    assert_eq!(leader(&view), (b"web-1:8080".to_vec(), token));
    a.proclaimed("jobs", b"web-1:9090").await;
    assert_eq!(
        leader(&engine.describe("jobs").await.expect("describe")).0,
        b"web-1:9090"
    );
    // A reentrant acquire with a value proclaims it; with none it keeps the value.
    assert_eq!(a.granted(campaign("jobs", b"web-1:7070")).await, token);
    let view: KeyView = store.inner.describe("jobs").await.expect("describe").into();
    assert_eq!(leader(&view).0, b"web-1:7070");
    assert_eq!(a.granted(campaign("jobs", b"")).await, token);
    let view = engine.describe("jobs").await.expect("describe");
    assert_eq!(leader(&view).0, b"web-1:7070");
    assert_eq!(view.holders[0].hold_count, 3);
    // An empty value clears it.
    a.proclaimed("jobs", b"").await;
    assert!(
        leader(&engine.describe("jobs").await.expect("describe"))
            .0
            .is_empty()
    );
}

#[tokio::test(start_paused = true)]
async fn proclaims_of_keys_not_held_and_oversized_values_are_rejected() {
    let (store, engine) = setup();
    let mut a = start(&engine);
    let mut b = start(&engine);
    let code = |event: Event| match event {
        Event::Rejected(r) => r.code,
        other => panic!("expected Rejected, got {other:?}"),
    };
    assert_eq!(
        code(a.proclaim("jobs", b"x").await),
        RejectCode::FailedPrecondition,
        "never held"
    );
    a.granted(campaign("jobs", b"a")).await;
    assert_eq!(
        code(b.proclaim("jobs", b"b").await),
        RejectCode::FailedPrecondition,
        "held by another session"
    );
    let big = vec![b'v'; MAX_VALUE_BYTES + 1];
    assert_eq!(
        code(a.proclaim("jobs", &big).await),
        RejectCode::InvalidArgument
    );
    let id = a
        .command(|request_id| {
            Command::Acquire(AcquireRequest {
                request_id,
                ..campaign("other", &big)
            })
        })
        .await;
    match a.next().await {
        Event::Rejected(r) if r.request_id == id => {
            assert_eq!(r.code, RejectCode::InvalidArgument);
            assert!(r.message.contains("4096"), "{r:?}");
        }
        other => panic!("expected Rejected, got {other:?}"),
    }
    a.proclaimed("jobs", &vec![b'v'; MAX_VALUE_BYTES]).await;
    // The store answering UNAVAILABLE is said so; the lock is still held.
    store.down.store(true, Ordering::SeqCst);
    assert_eq!(
        code(a.proclaim("jobs", b"x").await),
        RejectCode::Unavailable
    );
    store.down.store(false, Ordering::SeqCst);
    // The store lost the grant (a failover without the write): the proclaim finds
    // out, and the session loses the lock, then hears why the proclaim failed.
    store.lost_grants.store(true, Ordering::SeqCst);
    match a.proclaim("jobs", b"late").await {
        Event::Lost { key, .. } => assert_eq!(key, "jobs"),
        other => panic!("expected Lost, got {other:?}"),
    }
    assert_eq!(code(a.next().await), RejectCode::FailedPrecondition);
}

#[tokio::test(start_paused = true)]
async fn watchers_see_every_state_in_order() {
    let (_store, engine) = setup();
    let mut watch = engine.watch("jobs").await.expect("watch");
    assert!(state(&mut watch).await.holders.is_empty(), "free at first");
    let (mut a, mut b) = (start(&engine), start(&engine));
    let first = a.granted(campaign("jobs", b"a")).await;
    assert_eq!(leader(&state(&mut watch).await), (b"a".to_vec(), first));
    // b campaigns: a waiter may show, but the leader stays a.
    let id = b
        .command(|request_id| {
            Command::Acquire(AcquireRequest {
                request_id,
                ..campaign("jobs", b"b")
            })
        })
        .await;
    a.proclaimed("jobs", b"a2").await;
    let mut view = state(&mut watch).await;
    while leader(&view).0 != b"a2" {
        assert_eq!(leader(&view), (b"a".to_vec(), first), "{view:?}");
        view = state(&mut watch).await;
    }
    a.release("jobs").await;
    let second = match b.next().await {
        Event::Granted {
            request_id, fence, ..
        } if request_id == id => fence,
        other => panic!("expected b's grant, got {other:?}"),
    };
    assert!(second > first);
    // Between a and b the key may show free (or not, if both came in one read).
    let mut view = state(&mut watch).await;
    while view.holders.is_empty() {
        view = state(&mut watch).await;
    }
    assert_eq!(leader(&view), (b"b".to_vec(), second));
    b.release("jobs").await;
    let view = state(&mut watch).await;
    assert!(view.holders.is_empty() && view.fence == second, "{view:?}");
}

#[tokio::test(start_paused = true)]
async fn a_state_that_did_not_change_is_not_sent_again() {
    let (_store, engine) = setup();
    let mut watch = engine.watch("jobs").await.expect("watch");
    state(&mut watch).await;
    let mut a = start(&engine);
    let token = a.granted(campaign("jobs", b"a")).await;
    assert_eq!(leader(&state(&mut watch).await), (b"a".to_vec(), token));
    // Time passes (the TTL left changes with it) and the same value is proclaimed: a
    // notice and a read, but the same state.
    tokio::time::advance(Duration::from_secs(1)).await;
    a.proclaimed("jobs", b"a").await;
    let quiet = tokio::time::timeout(Duration::from_secs(1), watch.next()).await;
    assert!(quiet.is_err(), "the same state again: {quiet:?}");
    a.proclaimed("jobs", b"b").await;
    assert_eq!(leader(&state(&mut watch).await), (b"b".to_vec(), token));
}

#[tokio::test(start_paused = true)]
async fn a_slow_watcher_gets_the_latest_state_not_a_backlog() {
    let (_store, engine) = setup();
    let mut watch = engine.watch("jobs").await.expect("watch");
    state(&mut watch).await;
    let mut a = start(&engine);
    a.granted(campaign("jobs", b"")).await;
    // The watcher reads nothing while the leader proclaims 1,000 values of 4 KiB.
    let value = |i: usize| {
        let mut v = format!("{i:06}").into_bytes();
        v.resize(MAX_VALUE_BYTES, b'.');
        v
    };
    for i in 0..1000 {
        a.proclaimed("jobs", &value(i)).await;
    }
    let last = value(999);
    let mut messages = 0;
    loop {
        let view = state(&mut watch).await;
        messages += 1;
        if view.holders.first().is_some_and(|h| h.value == last) {
            break;
        }
        assert!(messages < 1000, "no backlog of states");
    }
    assert!(
        messages <= 3,
        "1,000 changes reached a slow watcher in {messages} messages"
    );
}

#[tokio::test(start_paused = true)]
async fn a_dead_holder_is_seen_gone_at_its_expiry_not_before() {
    let (store, engine) = setup();
    let mut watch = engine.watch("jobs").await.expect("watch");
    state(&mut watch).await;
    let ttl = Duration::from_secs(5);
    let granted_at = Instant::now();
    store
        .inner
        .acquire(&orphan("jobs", ttl, b"dead"))
        .await
        .expect("grant");
    assert_eq!(leader(&state(&mut watch).await).0, b"dead");
    let view = state(&mut watch).await;
    let seen = granted_at.elapsed();
    assert!(view.holders.is_empty(), "{view:?}");
    assert!(
        seen >= ttl && seen <= ttl + Duration::from_millis(5),
        "the expiry was seen {seen:?} after the grant, the TTL is {ttl:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_outage_sends_nothing_and_the_watch_reads_again_after_it() {
    let (store, engine) = setup();
    let mut watch = engine.watch("jobs").await.expect("watch");
    state(&mut watch).await;
    store
        .inner
        .acquire(&orphan("jobs", Duration::from_secs(5), b"dead"))
        .await
        .expect("grant");
    assert_eq!(leader(&state(&mut watch).await).0, b"dead");
    store.down.store(true, Ordering::SeqCst);
    // The holder expires during the outage: nothing can be read, nothing is said.
    let quiet = tokio::time::timeout(Duration::from_secs(20), watch.next()).await;
    assert!(quiet.is_err(), "a state during the outage: {quiet:?}");
    // A watch that cannot read its key as it starts fails.
    match engine.watch("other").await {
        Err(EngineError::Store(_)) => {}
        other => panic!("expected a store error, got {:?}", other.map(|_| ())),
    }
    store.down.store(false, Ordering::SeqCst);
    let back = Instant::now();
    let view = state(&mut watch).await;
    assert!(view.holders.is_empty(), "{view:?}");
    assert!(
        back.elapsed() <= Duration::from_secs(1),
        "read again {:?} after the store came back",
        back.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn watchers_of_a_key_share_one_store_listener() {
    let (store, engine) = setup();
    let mut first = engine.watch("jobs").await.expect("watch");
    let mut second = engine.watch("jobs").await.expect("watch");
    let mut other = engine.watch("other").await.expect("watch");
    for watch in [&mut first, &mut second, &mut other] {
        state(watch).await;
    }
    assert_eq!(store.listens.load(Ordering::SeqCst), 2, "one per key");
    assert_eq!(engine.watches(), 3);
    let mut a = start(&engine);
    a.granted(campaign("jobs", b"a")).await;
    assert_eq!(leader(&state(&mut first).await).0, b"a");
    assert_eq!(leader(&state(&mut second).await).0, b"a");
    drop(first);
    assert_eq!(
        store.unlistens.load(Ordering::SeqCst),
        0,
        "one watcher left"
    );
    drop(second);
    drop(other);
    // The keys' tasks leave the store when they notice.
    tokio::time::timeout(Duration::from_secs(1), async {
        while store.unlistens.load(Ordering::SeqCst) < 2 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("both keys unlistened");
    assert_eq!(engine.watches(), 0);
}

#[tokio::test(start_paused = true)]
async fn watches_are_limited_and_keys_checked() {
    let (_store, engine) = setup_with(EngineConfig {
        max_watches: 2,
        ..EngineConfig::default()
    });
    let one = engine.watch("a").await.expect("watch");
    let _two = engine.watch("b").await.expect("watch");
    match engine.watch("c").await {
        Err(EngineError::ResourceExhausted(m)) => assert!(m.contains('2'), "{m}"),
        other => panic!("expected RESOURCE_EXHAUSTED, got {:?}", other.map(|_| ())),
    }
    drop(one);
    let _three = engine.watch("c").await.expect("a watch ended: room again");
    for bad in ["", "a\nb"] {
        assert!(matches!(
            engine.watch(bad).await,
            Err(EngineError::InvalidArgument(_))
        ));
    }
}

#[tokio::test(start_paused = true)]
async fn watches_end_when_the_sidecar_shuts_down() {
    let (_store, engine) = setup();
    let mut watch = engine.watch("jobs").await.expect("watch");
    state(&mut watch).await;
    engine.shutdown();
    let end = tokio::time::timeout(Duration::from_secs(1), watch.next())
        .await
        .expect("ends at once");
    assert!(
        matches!(end, Some(Err(EngineError::ShuttingDown))),
        "{end:?}"
    );
    assert!(watch.next().await.is_none());
    assert!(matches!(
        engine.watch("jobs").await,
        Err(EngineError::ShuttingDown)
    ));
}
