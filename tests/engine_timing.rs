//! The engine's timing rules on a paused tokio clock: renewal at TTL/3 in batches,
//! `Jeopardy` / `Restored` / `Lost` by the safe deadline, waits woken by the holder's
//! expiry, and exact timeouts. The store is the real memory store behind a switch that
//! makes it fail on demand, as an unreachable Redis would.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use lockside::engine::{
    AcquireRequest, Command, Engine, EngineConfig, Event, Inbound, MAX_STORE_CALLS, Mode,
    NotAcquiredReason,
};
use lockside::store::memory::MemoryStore;
use lockside::store::{
    Acquired, Claim, KeyState, Notice, Renewal, Renewed, Store, StoreError, StoreFuture,
};
use tokio::sync::{broadcast, mpsc};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

/// The engine's default drift margin.
fn margin(ttl: Duration) -> Duration {
    lockside::store::drift_margin(ttl, lockside::store::DEFAULT_CLOCK_DRIFT)
}

/// How long the grant after [`Switchable::slow_grant`] takes to come back.
const SLOW_GRANT: Duration = Duration::from_millis(100);

/// The memory store, with a switch that makes every call fail, counters of renewals,
/// and a grant that comes back late on demand.
#[derive(Default)]
struct Switchable {
    inner: MemoryStore,
    down: AtomicBool,
    /// The next grant takes [`SLOW_GRANT`] to reach its caller (a slow round trip),
    /// and says when it starts to on `delaying`.
    slow_grant: AtomicBool,
    delaying: tokio::sync::Notify,
    forget: AtomicBool,
    /// Holds and releases run, then answer as a call that timed out would: the store
    /// changed, the caller cannot know it.
    ran_but_timed_out: AtomicBool,
    /// Renewals of keys under `frozen/` fail, as on a frozen Cluster node.
    frozen_node: AtomicBool,
    renew_calls: AtomicUsize,
    renew_items: AtomicUsize,
    /// Every key a renewal was asked for, in order.
    renewed_keys: std::sync::Mutex<Vec<String>>,
    /// Listens started, and listens not yet ended (without `watch`).
    listen_calls: AtomicUsize,
    listens: AtomicUsize,
    /// A listen says it started on `listening`, then waits for `proceed` (a slow
    /// subscription, during which the test acts).
    gated_listens: AtomicBool,
    listening: tokio::sync::Notify,
    proceed: tokio::sync::Notify,
    /// Its notices never arrive: waiters wake only by trying again.
    deaf: bool,
    /// Releases take a millisecond (a round trip), so that those made at once overlap;
    /// how many ran at once, at most.
    slow_releases: AtomicBool,
    releases_in_flight: AtomicUsize,
    most_releases_in_flight: AtomicUsize,
}

impl Switchable {
    fn check(&self) -> Result<(), StoreError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("switched off".into()));
        }
        Ok(())
    }

    /// The answer of a hold or release that ran: itself, or a timeout.
    fn answer(&self, ran: Result<Option<u32>, StoreError>) -> Result<Option<u32>, StoreError> {
        if self.ran_but_timed_out.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("timed out (but ran)".into()));
        }
        ran
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
        Box::pin(async move {
            self.check()?;
            let answer = self.inner.acquire(claim).await?;
            if matches!(answer, Acquired::Granted { .. })
                && self.slow_grant.swap(false, Ordering::SeqCst)
            {
                self.delaying.notify_one();
                tokio::time::sleep(SLOW_GRANT).await;
            }
            Ok(answer)
        })
    }
    fn reenter<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        count: u32,
        ttl: Duration,
    ) -> StoreFuture<'a, Option<u32>> {
        Box::pin(async move {
            self.check()?;
            self.answer(self.inner.reenter(key, owner, count, ttl).await)
        })
    }
    fn release<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        count: u32,
        delay: Duration,
    ) -> StoreFuture<'a, Option<u32>> {
        Box::pin(async move {
            self.check()?;
            if self.slow_releases.load(Ordering::SeqCst) {
                let now = self.releases_in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                self.most_releases_in_flight
                    .fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(1)).await;
                self.releases_in_flight.fetch_sub(1, Ordering::SeqCst);
            }
            self.answer(self.inner.release(key, owner, count, delay).await)
        })
    }
    fn renew<'a>(&'a self, batch: &'a [Renewal<'a>]) -> StoreFuture<'a, Vec<Renewed>> {
        self.renew_calls.fetch_add(1, Ordering::SeqCst);
        self.renew_items.fetch_add(batch.len(), Ordering::SeqCst);
        (self.renewed_keys.lock().expect("renewed keys"))
            .extend(batch.iter().map(|r| r.key.to_owned()));
        Box::pin(async move {
            self.check()?;
            if self.forget.load(Ordering::SeqCst) {
                return Ok(vec![Renewed::NotHeld; batch.len()]);
            }
            let mut renewed = self.inner.renew(batch).await?;
            if self.frozen_node.load(Ordering::SeqCst) {
                // The part of the batch on a frozen node fails; the rest is renewed.
                let error = Arc::new(StoreError::Unavailable("node frozen".into()));
                for (r, answer) in batch.iter().zip(&mut renewed) {
                    if r.key.starts_with("frozen/") {
                        *answer = Renewed::Failed(error.clone());
                    }
                }
            }
            Ok(renewed)
        })
    }
    fn unwait<'a>(&'a self, claim: &'a Claim) -> StoreFuture<'a, ()> {
        guarded!(self, self.inner.unwait(claim))
    }
    fn describe<'a>(&'a self, key: &'a str) -> StoreFuture<'a, KeyState> {
        guarded!(self, self.inner.describe(key))
    }
    fn ping(&self) -> StoreFuture<'_, ()> {
        guarded!(self, self.inner.ping())
    }
    fn proclaim<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        value: &'a [u8],
    ) -> StoreFuture<'a, bool> {
        guarded!(self, self.inner.proclaim(key, owner, value))
    }
    fn listen<'a>(&'a self, key: &'a str, watch: bool) -> StoreFuture<'a, ()> {
        // Counted at the call, as the trait asks.
        self.listen_calls.fetch_add(1, Ordering::SeqCst);
        self.listens.fetch_add(1, Ordering::SeqCst);
        let listen = self.inner.listen(key, watch);
        Box::pin(async move {
            if self.gated_listens.load(Ordering::SeqCst) {
                self.listening.notify_one();
                self.proceed.notified().await;
            }
            listen.await
        })
    }
    fn unlisten(&self, key: &str, watch: bool) {
        self.listens.fetch_sub(1, Ordering::SeqCst);
        self.inner.unlisten(key, watch)
    }
    fn notices(&self) -> broadcast::Receiver<Notice> {
        if self.deaf {
            // A closed channel: the engine hears nothing, ever.
            return broadcast::channel(1).1;
        }
        self.inner.notices()
    }
}

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
            "test".into(),
            Default::default(),
            ReceiverStream::new(inbound),
            out,
        )
        .expect("session");
    Session { tx, rx, next_id: 0 }
}

impl Session {
    /// The first request of a new session, an acquire of `key` without waiting, is
    /// refused `Busy` (after `SessionStarted`): someone else holds `key`.
    async fn first_try_is_busy(&mut self, key: &str, why: &str) {
        let id = self.send(request(key, 3, None)).await;
        assert!(matches!(self.next().await, Event::Started { .. }));
        assert_eq!(
            self.next().await,
            Event::NotAcquired {
                request_id: id,
                key: key.into(),
                reason: NotAcquiredReason::Busy,
                holder: String::new(),
            },
            "{why}"
        );
    }

    /// Nothing is waiting on this session's stream: no `Jeopardy` or `Lost`.
    fn no_event_while_renewals_succeed(&mut self) {
        if let Ok(event) = self.rx.try_recv() {
            panic!("no event expected while renewals succeed, got {event:?}");
        }
    }
}

fn request(key: &str, ttl: u64, wait: Option<u64>) -> AcquireRequest {
    AcquireRequest {
        request_id: 0,
        key: key.into(),
        wait: wait.map(Duration::from_secs),
        mode: Mode::Exclusive,
        limit: 0,
        fair: false,
        ttl: Some(Duration::from_secs(ttl)),
        trace: Default::default(),
        value: Vec::new(),
        holder: String::new(),
    }
}

impl Session {
    async fn next(&mut self) -> Event {
        self.rx.recv().await.expect("an event")
    }

    async fn send(&mut self, mut r: AcquireRequest) -> u64 {
        self.next_id += 1;
        r.request_id = self.next_id;
        self.tx
            .send(Inbound::Command(Command::Acquire(r)))
            .await
            .expect("send");
        self.next_id
    }

    /// Sends a Release of `key` and returns the holds left it answers.
    async fn release(&mut self, key: &str) -> u32 {
        self.next_id += 1;
        let request_id = self.next_id;
        let command = Command::Release {
            request_id,
            key: key.into(),
            holder: String::new(),
        };
        self.tx.send(Inbound::Command(command)).await.expect("send");
        match self.next().await {
            Event::Released {
                request_id: id,
                hold_count,
                ..
            } if id == request_id => hold_count,
            other => panic!("expected Released for {request_id}, got {other:?}"),
        }
    }

    /// Expects the answer to `request_id` to be `Rejected` UNAVAILABLE.
    async fn unavailable(&mut self, request_id: u64) {
        match self.next().await {
            Event::Rejected(r) if r.request_id == request_id => {
                assert_eq!(r.code, lockside::engine::RejectCode::Unavailable, "{r:?}");
            }
            other => panic!("expected Rejected UNAVAILABLE for {request_id}, got {other:?}"),
        }
    }

    async fn granted(&mut self, key: &str, ttl: u64) -> (u64, Duration) {
        self.send(request(key, ttl, None)).await;
        loop {
            match self.next().await {
                Event::Started { .. } => continue,
                Event::Granted { fence, ttl, .. } => return (fence, ttl),
                other => panic!("expected a grant, got {other:?}"),
            }
        }
    }
}

fn setup() -> (Arc<Switchable>, Engine) {
    let store = Arc::new(Switchable::default());
    let engine = Engine::new(store.clone(), EngineConfig::default());
    (store, engine)
}

#[tokio::test(start_paused = true)]
async fn renewals_keep_locks_and_are_batched() {
    let (store, engine) = setup();
    let mut a = start(&engine);
    let mut b = start(&engine);
    for i in 0..100 {
        a.granted(&format!("k{i}"), 3).await;
    }
    // Thirty seconds, ten TTLs: without renewal every lock would have expired.
    tokio::time::sleep(Duration::from_secs(30)).await;
    b.first_try_is_busy("k50", "").await;
    // Renewed every ~TTL/3 = 1 s, in batches: about 30 calls for all 100 locks, not
    // 3,000 (one per lock per tick).
    let calls = store.renew_calls.load(Ordering::SeqCst);
    let items = store.renew_items.load(Ordering::SeqCst);
    assert!((25..=70).contains(&calls), "{calls} renewal calls");
    assert!(items >= 100 * 25, "{items} renewals");
    assert!(
        items / calls >= 40,
        "batches of {} on average",
        items / calls
    );
    a.no_event_while_renewals_succeed();
}

#[tokio::test(start_paused = true)]
async fn lost_is_sent_at_the_safe_deadline_while_the_store_still_holds() {
    let (store, engine) = setup();
    let mut a = start(&engine);
    let t0 = Instant::now();
    let ttl = Duration::from_secs(3);
    let (_, granted_ttl) = a.granted("k", 3).await;
    assert_eq!(
        granted_ttl,
        ttl - margin(ttl),
        "validity counted from the send time"
    );
    store.down.store(true, Ordering::SeqCst);
    match a.next().await {
        Event::Jeopardy {
            key, ttl_remaining, ..
        } => {
            assert_eq!(key, "k");
            // The first renewal is due at TTL/3.
            assert_eq!(t0.elapsed(), ttl / 3);
            assert_eq!(ttl_remaining, ttl - margin(ttl) - ttl / 3);
        }
        other => panic!("expected Jeopardy, got {other:?}"),
    }
    match a.next().await {
        Event::Lost { key, reason, .. } => {
            assert_eq!(key, "k");
            assert!(reason.contains("deadline"), "{reason}");
        }
        other => panic!("expected Lost, got {other:?}"),
    }
    assert_eq!(
        t0.elapsed(),
        ttl - margin(ttl),
        "Lost exactly at the safe deadline"
    );
    // The store has not let go yet: nobody else could have been granted meanwhile.
    let state = store.inner.describe("k").await.expect("memory store");
    assert_eq!(
        state.holders.len(),
        1,
        "Lost came before the store's expiry"
    );
    assert!(state.holders[0].ttl_remaining >= margin(ttl));
}

/// The session's deadline timer is set for the earliest safe deadline of its grants:
/// a grant taken after a longer one, with a shorter TTL, brings it forward. Were the
/// timer left at the first grant's deadline, the second would be lost 27 s late.
#[tokio::test(start_paused = true)]
async fn a_later_grant_with_an_earlier_deadline_is_lost_on_time() {
    let (store, engine) = setup();
    let mut a = start(&engine);
    a.granted("long", 30).await;
    let t0 = Instant::now();
    let short = Duration::from_secs(3);
    a.granted("short", 3).await;
    store.down.store(true, Ordering::SeqCst);
    loop {
        match a.next().await {
            Event::Jeopardy { .. } => continue,
            Event::Lost { key, reason, .. } => {
                assert_eq!(key, "short");
                assert!(reason.contains("deadline"), "{reason}");
                break;
            }
            other => panic!("expected Lost, got {other:?}"),
        }
    }
    assert_eq!(
        t0.elapsed(),
        short - margin(short),
        "Lost exactly at the later grant's safe deadline"
    );
}

#[tokio::test(start_paused = true)]
async fn restored_after_a_short_outage() {
    let (store, engine) = setup();
    let mut a = start(&engine);
    let ttl = Duration::from_secs(3);
    a.granted("k", 3).await;
    store.down.store(true, Ordering::SeqCst);
    assert!(matches!(a.next().await, Event::Jeopardy { .. }));
    tokio::time::sleep(Duration::from_millis(500)).await;
    store.down.store(false, Ordering::SeqCst);
    match a.next().await {
        Event::Restored { key, ttl: left, .. } => {
            assert_eq!(key, "k");
            // Counted from the send time of the renewal that succeeded.
            assert!(left <= ttl - margin(ttl) && left > ttl - Duration::from_millis(300));
        }
        other => panic!("expected Restored, got {other:?}"),
    }
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(a.rx.try_recv().is_err(), "no Lost after Restored");
}

/// Issue 11, item 2: the store answers renewals per grant, and only the grants whose
/// renewal failed go into jeopardy; the others of the same batch are renewed.
#[tokio::test(start_paused = true)]
async fn only_the_grants_whose_renewal_failed_are_in_jeopardy() {
    let (store, engine) = setup();
    let mut a = start(&engine);
    let ttl = Duration::from_secs(3);
    for key in ["frozen/1", "healthy/1", "frozen/2", "healthy/2"] {
        a.granted(key, 3).await;
    }
    store.frozen_node.store(true, Ordering::SeqCst);
    let t0 = Instant::now();
    let mut jeopardy = Vec::new();
    let mut lost = Vec::new();
    while lost.len() < 2 {
        match a.next().await {
            Event::Jeopardy { key, .. } => jeopardy.push(key),
            Event::Lost { key, .. } => lost.push(key),
            other => panic!("unexpected {other:?}"),
        }
    }
    jeopardy.sort();
    lost.sort();
    assert_eq!(jeopardy, ["frozen/1", "frozen/2"]);
    assert_eq!(lost, ["frozen/1", "frozen/2"], "past their deadline");
    assert!(t0.elapsed() <= ttl);
    // Ten TTLs on: the healthy grants were renewed in the same batches all along.
    tokio::time::sleep(ttl * 10).await;
    assert!(a.rx.try_recv().is_err(), "nothing for the healthy grants");
    for key in ["healthy/1", "healthy/2"] {
        let state = store.inner.describe(key).await.expect("memory store");
        assert_eq!(state.holders.len(), 1, "{key} still held");
    }
}

/// Sessions tell the renewer nothing when they give a grant back (they mark its clock):
/// a grant released before its first renewal, the common case, must never be renewed,
/// whether the renewer had already looked at it or not.
#[tokio::test(start_paused = true)]
async fn a_grant_released_before_its_first_renewal_is_never_renewed() {
    let (store, engine) = setup();
    let mut a = start(&engine);
    // Held throughout: the renewer ticks every second for it, so grants are released
    // both before and after the renewer first looked at them.
    a.granted("kept", 3).await;
    for i in 0..40 {
        a.granted(&format!("brief{i}"), 3).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(a.release(&format!("brief{i}")).await, 0);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let renewed = store.renewed_keys.lock().expect("renewed keys").clone();
    assert!(
        renewed.iter().all(|k| k == "kept"),
        "released grants renewed: {:?}",
        renewed.iter().filter(|k| *k != "kept").collect::<Vec<_>>()
    );
    assert!(renewed.len() >= 15, "kept renewed {} times", renewed.len());
}

/// The renewer sleeps until the first renewal it knows of and is woken only by a grant
/// due earlier: a short-TTL grant taken while it waits for a long one must still be
/// renewed at TTL/3, not when the long one is due.
#[tokio::test(start_paused = true)]
async fn a_grant_due_before_the_renewers_next_tick_is_renewed_on_time() {
    let (store, engine) = setup();
    let mut a = start(&engine);
    let mut b = start(&engine);
    // First renewal at 10 s.
    a.granted("long", 30).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // First renewal at 1.5 s; expired at 3.5 s unless renewed before.
    let t0 = Instant::now();
    a.granted("short", 3).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    b.first_try_is_busy("short", "the short grant was not renewed in time")
        .await;
    a.no_event_while_renewals_succeed();
    let renewed = store.renewed_keys.lock().expect("renewed keys").clone();
    // Every second from the grant: at 1 to 5 s, and perhaps at 6 s (now).
    let short = renewed.iter().filter(|k| *k == "short").count();
    assert!(
        (5..=6).contains(&short),
        "renewed {short} times in {:?}",
        t0.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn a_grant_the_store_forgot_is_lost_at_once() {
    let (store, engine) = setup();
    let mut a = start(&engine);
    let t0 = Instant::now();
    a.granted("k", 3).await;
    store.forget.store(true, Ordering::SeqCst);
    match a.next().await {
        Event::Lost { key, reason, .. } => {
            assert_eq!(key, "k");
            assert!(reason.contains("no longer holds"), "{reason}");
        }
        other => panic!("expected Lost, got {other:?}"),
    }
    assert_eq!(t0.elapsed(), Duration::from_secs(1), "at the first renewal");
}

#[tokio::test(start_paused = true)]
async fn a_waiter_is_woken_by_the_holders_expiry() {
    let (store, engine) = setup();
    // A holder whose sidecar died: nobody renews it and nobody will release it.
    let claim = Claim {
        key: "k".into(),
        owner: "dead".into(),
        ttl: Duration::from_secs(2),
        wait: false,
        session_id: "dead".into(),
        client_name: String::new(),
        holder: String::new(),
        sharing: lockside::store::Sharing::Exclusive,
        limit: 1,
        fair: false,
        value: Vec::new(),
        ticket: None,
    };
    assert!(matches!(
        store.acquire(&claim).await,
        Ok(Acquired::Granted { .. })
    ));
    let t0 = Instant::now();
    let mut b = start(&engine);
    let id = b.send(request("k", 10, Some(60))).await;
    assert!(matches!(b.next().await, Event::Started { .. }));
    assert!(matches!(b.next().await, Event::Waiting { request_id, .. } if request_id == id));
    assert!(matches!(b.next().await, Event::Granted { request_id, .. } if request_id == id));
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_secs(2) && waited <= Duration::from_millis(2002),
        "granted just after the expiry, not later: {waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn waits_time_out_exactly() {
    let (_store, engine) = setup();
    let mut a = start(&engine);
    let mut b = start(&engine);
    a.granted("k", 10).await;
    let t0 = Instant::now();
    let id = b.send(request("k", 10, Some(5))).await;
    assert!(matches!(b.next().await, Event::Started { .. }));
    assert!(matches!(b.next().await, Event::Waiting { .. }));
    assert_eq!(
        b.next().await,
        Event::NotAcquired {
            request_id: id,
            key: "k".into(),
            reason: NotAcquiredReason::Timeout,
            holder: String::new(),
        }
    );
    assert_eq!(t0.elapsed(), Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_store_makes_acquires_unavailable_not_busy() {
    let (store, engine) = setup();
    let mut a = start(&engine);
    store.down.store(true, Ordering::SeqCst);
    let id = a.send(request("k", 10, None)).await;
    assert!(matches!(a.next().await, Event::Started { .. }));
    match a.next().await {
        Event::Rejected(r) => {
            assert_eq!(r.request_id, id);
            assert_eq!(r.code, lockside::engine::RejectCode::Unavailable);
        }
        other => panic!("expected Rejected UNAVAILABLE, got {other:?}"),
    }
    store.down.store(false, Ordering::SeqCst);
    a.granted("k", 10).await;
}

#[tokio::test(start_paused = true)]
async fn shutdown_releases_and_says_so() {
    let (store, engine) = setup();
    let mut a = start(&engine);
    let (fence, _) = a.granted("k", 10).await;
    engine.shutdown();
    assert_eq!(
        a.next().await,
        Event::Lost {
            key: "k".into(),
            reason: "the sidecar is shutting down".into(),
            fence,
            holder: String::new(),
        }
    );
    assert_eq!(
        a.next().await,
        Event::Ended(lockside::engine::EndReason::Shutdown)
    );
    tokio::time::timeout(Duration::from_secs(1), engine.drained())
        .await
        .expect("drained");
    assert!(
        store
            .inner
            .describe("k")
            .await
            .expect("memory")
            .holders
            .is_empty()
    );
    assert!(
        engine
            .start_session(
                "late".into(),
                Default::default(),
                tokio_stream::empty(),
                mpsc::channel(1).0,
            )
            .is_err()
    );
}

/// A session that ends holding a thousand locks releases them all, but no more at once
/// than sessions may have store calls in flight: a hundred such sessions ending together
/// must not put a hundred thousand calls on Redis at once, where the last ones would
/// wait past the store timeout and their locks stay until their TTL.
#[tokio::test(start_paused = true)]
async fn a_session_ending_with_many_locks_releases_them_in_turns() {
    let (store, engine) = setup();
    let mut a = start(&engine);
    let keys: Vec<String> = (0..1000).map(|i| format!("many/{i}")).collect();
    for key in &keys {
        a.granted(key, 10).await;
    }
    store.slow_releases.store(true, Ordering::SeqCst);
    drop(a);
    tokio::time::timeout(Duration::from_secs(5), async {
        for key in &keys {
            while !store
                .inner
                .describe(key)
                .await
                .expect("memory")
                .holders
                .is_empty()
            {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    })
    .await
    .expect("every lock released");
    let most = store.most_releases_in_flight.load(Ordering::SeqCst);
    assert!(most > 1, "releases overlap ({most})");
    assert!(most <= MAX_STORE_CALLS, "{most} releases at once");
}

/// A reentrant Acquire whose store call ran but answered as a timeout: the client hears
/// UNAVAILABLE, so it holds the key twice, not three times; its two Releases free the
/// lock. (Before holds carried the session's count, the store kept a third hold: the
/// second Release answered 1 and the lock stayed until the session ended.)
#[tokio::test(start_paused = true)]
async fn a_hold_that_ran_but_timed_out_leaves_no_hold_behind() {
    let (store, engine) = setup();
    let mut a = start(&engine);
    a.granted("k", 10).await;
    a.granted("k", 10).await;
    store.ran_but_timed_out.store(true, Ordering::SeqCst);
    let id = a.send(request("k", 10, None)).await;
    a.unavailable(id).await;
    store.ran_but_timed_out.store(false, Ordering::SeqCst);
    assert_eq!(a.release("k").await, 1);
    assert_eq!(a.release("k").await, 0, "the last hold the client knows of");
    let state = store.inner.describe("k").await.expect("memory store");
    assert!(state.holders.is_empty(), "the lock is free: {state:?}");
}

/// A Release whose store call ran but answered as a timeout took no hold as far as the
/// client knows (UNAVAILABLE): retrying it answers the same count, and the holds the
/// client knows of free the lock.
#[tokio::test(start_paused = true)]
async fn a_release_that_ran_but_timed_out_can_be_retried() {
    let (store, engine) = setup();
    let mut a = start(&engine);
    a.granted("k", 10).await;
    a.granted("k", 10).await;
    store.ran_but_timed_out.store(true, Ordering::SeqCst);
    a.next_id += 1;
    let id = a.next_id;
    let command = Command::Release {
        request_id: id,
        key: "k".into(),
        holder: String::new(),
    };
    a.tx.send(Inbound::Command(command)).await.expect("send");
    a.unavailable(id).await;
    store.ran_but_timed_out.store(false, Ordering::SeqCst);
    assert_eq!(a.release("k").await, 1, "the retry takes the same hold");
    let state = store.inner.describe("k").await.expect("memory store");
    assert_eq!(state.holders.len(), 1, "still held once: {state:?}");
    assert_eq!(state.holders[0].hold_count, 1);
    assert_eq!(a.release("k").await, 0);
    let state = store.inner.describe("k").await.expect("memory store");
    assert!(state.holders.is_empty(), "the lock is free: {state:?}");
}

/// A waiting acquire of `key` (TTL 30 s, wait 60 s) in `mode` with `limit`.
fn waiting_request(key: &str, mode: Mode, limit: u32) -> AcquireRequest {
    AcquireRequest {
        mode,
        limit,
        ..request(key, 30, Some(60))
    }
}

impl Session {
    /// Sends `r` and expects it to wait.
    async fn waits(&mut self, r: AcquireRequest) -> u64 {
        let id = self.send(r).await;
        loop {
            match self.next().await {
                Event::Started { .. } => continue,
                Event::Waiting { request_id, .. } if request_id == id => return id,
                other => panic!("expected Waiting for {id}, got {other:?}"),
            }
        }
    }

    /// Sends `r` and expects a grant.
    async fn grants(&mut self, r: AcquireRequest) {
        let id = self.send(r).await;
        loop {
            match self.next().await {
                Event::Started { .. } => continue,
                Event::Granted { request_id, .. } if request_id == id => return,
                other => panic!("expected Granted for {id}, got {other:?}"),
            }
        }
    }

    async fn releases(&mut self, key: &str) {
        self.next_id += 1;
        let request_id = self.next_id;
        self.tx
            .send(Inbound::Command(Command::Release {
                request_id,
                key: key.into(),
                holder: String::new(),
            }))
            .await
            .expect("send");
        match self.next().await {
            Event::Released { request_id: id, .. } if id == request_id => {}
            other => panic!("expected Released, got {other:?}"),
        }
    }

    /// Waits for the grant of `id`; how long it took.
    async fn granted_within(&mut self, id: u64, since: Instant) -> Duration {
        match self.next().await {
            Event::Granted { request_id, .. } if request_id == id => since.elapsed(),
            other => panic!("expected Granted for {id}, got {other:?}"),
        }
    }
}

/// Far below a waiter's next look (TTL/3 = 10 s here, the holder's expiry 30 s): the
/// second waiter must have been woken, not have looked again by itself.
const PROMPTLY: Duration = Duration::from_secs(1);

/// Issue 11, item 3: two SHARED waiters on one sidecar. The release wakes the first;
/// its grant leaves room and passes the wake on, which the first waiter, still
/// registered while its slow grant comes back, must not swallow: the second is granted
/// at once, not at its next look.
#[tokio::test(start_paused = true)]
async fn a_wake_the_first_shared_waiter_cannot_use_reaches_the_second() {
    let (store, engine) = setup();
    let (mut holder, mut first, mut second) = (start(&engine), start(&engine), start(&engine));
    holder.grants(request("k", 30, None)).await;
    let one = first.waits(waiting_request("k", Mode::Shared, 0)).await;
    let two = second.waits(waiting_request("k", Mode::Shared, 0)).await;
    store.slow_grant.store(true, Ordering::SeqCst);
    let released = Instant::now();
    holder.releases("k").await;
    let took = first.granted_within(one, released).await;
    assert_eq!(took, SLOW_GRANT, "the first waiter is woken by the release");
    let took = second.granted_within(two, released).await;
    assert!(took < PROMPTLY, "the second waiter slept {took:?}");
}

/// The same with a semaphore of 2: both permits are given back while the first
/// waiter's grant is on its way; the second release must wake the second waiter.
#[tokio::test(start_paused = true)]
async fn a_wake_the_first_semaphore_waiter_cannot_use_reaches_the_second() {
    let (store, engine) = setup();
    let (mut a, mut b) = (start(&engine), start(&engine));
    let (mut first, mut second) = (start(&engine), start(&engine));
    let permit = || waiting_request("s", Mode::Exclusive, 2);
    a.grants(AcquireRequest {
        wait: None,
        ..permit()
    })
    .await;
    b.grants(AcquireRequest {
        wait: None,
        ..permit()
    })
    .await;
    let one = first.waits(permit()).await;
    let two = second.waits(permit()).await;
    store.slow_grant.store(true, Ordering::SeqCst);
    let released = Instant::now();
    a.releases("s").await;
    // The first waiter has its grant and is still registered while it comes back.
    store.delaying.notified().await;
    b.releases("s").await;
    let took = first.granted_within(one, released).await;
    assert_eq!(took, SLOW_GRANT);
    let took = second.granted_within(two, released).await;
    assert!(took < PROMPTLY, "the second waiter slept {took:?}");
}

#[tokio::test(start_paused = true)]
async fn a_release_before_the_subscription_is_not_missed() {
    let store = Arc::new(Switchable {
        deaf: true,
        ..Switchable::default()
    });
    store.gated_listens.store(true, Ordering::SeqCst);
    let engine = Engine::new(store.clone(), EngineConfig::default());
    let mut holder = start(&engine);
    let mut waiter = start(&engine);
    holder.granted("k", 30).await;
    let id = waiter.send(request("k", 30, Some(60))).await;
    // Busy: the waiter subscribes; the lock is released before the subscription is
    // made, so its notice is not heard (here no notice is ever heard).
    store.listening.notified().await;
    assert_eq!(holder.release("k").await, 0);
    let released = Instant::now();
    store.proceed.notify_one();
    loop {
        match waiter.next().await {
            Event::Started { .. } => continue,
            Event::Granted { request_id, .. } if request_id == id => break,
            other => panic!("expected the grant at once, got {other:?}"),
        }
    }
    assert_eq!(
        released.elapsed(),
        Duration::ZERO,
        "tried again as soon as it listened, not at its next look (TTL/3 later)"
    );
}

/// Waits (on the paused clock) until the store has `n` listens.
async fn listens(store: &Switchable, n: usize) {
    for _ in 0..100 {
        if store.listens.load(Ordering::SeqCst) == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!(
        "{} listens, expected {n}",
        store.listens.load(Ordering::SeqCst)
    );
}

#[tokio::test(start_paused = true)]
async fn only_waiting_acquires_listen_and_only_while_they_wait() {
    let (store, engine) = setup();
    let mut a = start(&engine);
    let mut b = start(&engine);
    a.granted("k", 30).await;
    let id = b.send(request("k", 30, None)).await;
    assert!(matches!(b.next().await, Event::Started { .. }));
    assert!(matches!(b.next().await, Event::NotAcquired { request_id, .. } if request_id == id));
    assert_eq!(
        store.listen_calls.load(Ordering::SeqCst),
        0,
        "a grant and a busy answer without waiting listen to nothing"
    );
    let waiting = async |s: &mut Session, wait: u64| {
        let id = s.send(request("k", 30, Some(wait))).await;
        assert!(matches!(s.next().await, Event::Waiting { request_id, .. } if request_id == id));
        id
    };
    // Granted after waiting.
    let id = waiting(&mut b, 60).await;
    listens(&store, 1).await;
    assert_eq!(a.release("k").await, 0);
    assert!(matches!(b.next().await, Event::Granted { request_id, .. } if request_id == id));
    listens(&store, 0).await;
    // Timed out.
    let id = waiting(&mut a, 5).await;
    listens(&store, 1).await;
    assert!(matches!(
        a.next().await,
        Event::NotAcquired { request_id, reason: NotAcquiredReason::Timeout, .. } if request_id == id
    ));
    listens(&store, 0).await;
    // Cancelled by a Release of the key.
    let id = waiting(&mut a, 60).await;
    listens(&store, 1).await;
    a.tx.send(Inbound::Command(Command::Release {
        request_id: 99,
        key: "k".into(),
        holder: String::new(),
    }))
    .await
    .expect("send");
    assert!(matches!(
        a.next().await,
        Event::NotAcquired { request_id, reason: NotAcquiredReason::Cancelled, .. } if request_id == id
    ));
    listens(&store, 0).await;
    // The session ends while it waits.
    waiting(&mut a, 60).await;
    listens(&store, 1).await;
    drop(a);
    listens(&store, 0).await;
    assert_eq!(store.listen_calls.load(Ordering::SeqCst), 4);
}

/// Issue 25: a stream that broke (a reset both ends see at once) keeps its locks for
/// the grace, renewed, so that its client can suspend them before a waiter is granted;
/// one the client closed releases at once.
#[tokio::test(start_paused = true)]
async fn a_broken_stream_keeps_its_locks_for_the_grace_and_a_closed_one_does_not() {
    let (_store, engine) = setup();
    let grace = EngineConfig::default().broken_grace;
    assert!(grace > Duration::ZERO && grace < Duration::from_millis(50));
    for broken in [true, false] {
        let mut a = start(&engine);
        a.granted("k", 10).await;
        let mut b = start(&engine);
        let id = b.send(request("k", 10, Some(60))).await;
        assert!(matches!(b.next().await, Event::Started { .. }));
        assert!(matches!(b.next().await, Event::Waiting { .. }));
        let t0 = Instant::now();
        if broken {
            a.tx.send(Inbound::Broken("connection reset".into()))
                .await
                .expect("send");
        } else {
            drop(a);
        }
        let waited = b.granted_within(id, t0).await;
        let expected = if broken { grace } else { Duration::ZERO };
        assert!(
            waited >= expected && waited <= expected + Duration::from_millis(2),
            "broken {broken}: granted after {waited:?}"
        );
        drop(b);
    }
}
