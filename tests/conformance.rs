//! One conformance suite for every store: the same checks against the embedded memory
//! store and a real `redis-server`. A store that passes is one the engine can use.
//!
//! Expiry here runs on real time for both stores (Redis has no paused clock), with TTLs
//! of a few hundred milliseconds; the engine-level TTL tests use a paused clock.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Redis, StoreKind, make_store, namespace};
use lockside::store::{Acquired, Claim, Notice, Renewal, Store};
use tokio::sync::broadcast;

/// A store under test, with its notices subscribed and (for Redis) live.
struct Subject {
    store: Arc<dyn Store>,
    notices: broadcast::Receiver<Notice>,
    _redis: Option<Redis>,
}

async fn subject(kind: &str) -> Subject {
    let (kind, redis) = match kind {
        "memory" => (StoreKind::Memory, None),
        _ => {
            let redis = Redis::start();
            (StoreKind::Redis(redis.url()), Some(redis))
        }
    };
    let store = make_store(&kind, &namespace());
    let mut notices = store.notices();
    if redis.is_some() {
        // The subscription is live once it says so; releases before that are missed.
        let first = tokio::time::timeout(common::PATIENCE, notices.recv()).await;
        assert_eq!(
            first.expect("subscribed in time").expect("notice"),
            Notice::Resync
        );
    }
    Subject {
        store,
        notices,
        _redis: redis,
    }
}

fn claim(key: &str, owner: &str, ttl_ms: u64) -> Claim {
    Claim {
        key: key.into(),
        owner: owner.into(),
        ttl: Duration::from_millis(ttl_ms),
        wait: false,
        session_id: format!("sid-{owner}"),
        client_name: format!("name|{owner}"),
    }
}

fn waiting(key: &str, owner: &str, ttl_ms: u64) -> Claim {
    Claim {
        wait: true,
        ..claim(key, owner, ttl_ms)
    }
}

async fn fence(s: &Subject, c: &Claim) -> u64 {
    match s.store.acquire(c).await.expect("store answers") {
        Acquired::Granted { fence } => fence,
        other => panic!("expected a grant for {}, got {other:?}", c.owner),
    }
}

async fn is_busy(s: &Subject, c: &Claim) -> bool {
    matches!(
        s.store.acquire(c).await.expect("store answers"),
        Acquired::Busy { .. }
    )
}

async fn next_notice(s: &mut Subject) -> Notice {
    tokio::time::timeout(common::PATIENCE, s.notices.recv())
        .await
        .expect("a notice in time")
        .expect("notice")
}

async fn grants_then_busy(s: Subject) {
    let a = claim("k", "a", 10_000);
    assert!(fence(&s, &a).await > 0);
    match s
        .store
        .acquire(&claim("k", "b", 10_000))
        .await
        .expect("answer")
    {
        Acquired::Busy { expires_in } => {
            assert!(expires_in <= Duration::from_secs(10) && expires_in > Duration::from_secs(9))
        }
        other => panic!("expected busy, got {other:?}"),
    }
    assert!(
        is_busy(&s, &a).await,
        "a new claim by the holder is busy too: reentrancy is hold()"
    );
}

async fn release_frees_and_fences_increase(s: Subject) {
    let first = fence(&s, &claim("k", "a", 10_000)).await;
    assert_eq!(
        s.store.release("k", "a", false).await.expect("answer"),
        Some(0)
    );
    let second = fence(&s, &claim("k", "b", 10_000)).await;
    assert!(second > first, "{second} > {first}");
    assert_eq!(
        s.store.release("k", "b", false).await.expect("answer"),
        Some(0)
    );
    let third = fence(&s, &claim("k", "a", 10_000)).await;
    assert!(third > second);
}

async fn only_the_owner_releases(s: Subject) {
    fence(&s, &claim("k", "a", 10_000)).await;
    assert_eq!(
        s.store.release("k", "b", false).await.expect("answer"),
        None
    );
    assert_eq!(s.store.release("k", "b", true).await.expect("answer"), None);
    assert!(is_busy(&s, &claim("k", "b", 10_000)).await);
    assert_eq!(
        s.store.release("nothing", "a", true).await.expect("answer"),
        None
    );
}

async fn holds_are_counted(s: Subject) {
    let ttl = Duration::from_secs(10);
    fence(&s, &claim("k", "a", 10_000)).await;
    assert_eq!(s.store.hold("k", "a", ttl).await.expect("answer"), Some(2));
    assert_eq!(s.store.hold("k", "a", ttl).await.expect("answer"), Some(3));
    assert_eq!(s.store.hold("k", "b", ttl).await.expect("answer"), None);
    assert_eq!(
        s.store.describe("k").await.expect("answer").holders[0].hold_count,
        3
    );
    assert_eq!(
        s.store.release("k", "a", false).await.expect("answer"),
        Some(2)
    );
    assert!(is_busy(&s, &claim("k", "b", 10_000)).await);
    assert_eq!(
        s.store.release("k", "a", true).await.expect("answer"),
        Some(0)
    );
    assert_eq!(s.store.hold("k", "a", ttl).await.expect("answer"), None);
    fence(&s, &claim("k", "b", 10_000)).await;
}

async fn grants_expire_and_fences_survive(s: Subject) {
    let first = fence(&s, &claim("k", "a", 150)).await;
    assert!(is_busy(&s, &claim("k", "b", 150)).await);
    // Real time: Redis has no paused clock.
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(
        s.store
            .renew(&[renewal("k", "a", 150)])
            .await
            .expect("answer"),
        vec![false]
    );
    assert_eq!(
        s.store.release("k", "a", false).await.expect("answer"),
        None
    );
    let second = fence(&s, &claim("k", "b", 10_000)).await;
    assert!(second > first, "tokens survive expiry");
}

fn renewal<'a>(key: &'a str, owner: &'a str, ttl_ms: u64) -> Renewal<'a> {
    Renewal {
        key,
        owner,
        ttl: Duration::from_millis(ttl_ms),
    }
}

async fn renewals_extend_only_held_grants(s: Subject) {
    fence(&s, &claim("k", "a", 300)).await;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let renewed = s
            .store
            .renew(&[
                renewal("k", "a", 300),
                renewal("k", "b", 300),
                renewal("x", "a", 300),
            ])
            .await
            .expect("answer");
        assert_eq!(renewed, vec![true, false, false]);
    }
    assert!(
        is_busy(&s, &claim("k", "b", 300)).await,
        "450 ms later, renewals kept it"
    );
    let left = s.store.describe("k").await.expect("answer").holders[0].ttl_remaining;
    assert!(left > Duration::from_millis(200) && left <= Duration::from_millis(300));
}

async fn large_batches_keep_their_order(s: Subject) {
    let keys: Vec<String> = (0..2500).map(|i| format!("k{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        if i % 3 != 0 {
            fence(&s, &claim(key, "a", 10_000)).await;
        }
    }
    let batch: Vec<_> = keys.iter().map(|key| renewal(key, "a", 10_000)).collect();
    let renewed = s.store.renew(&batch).await.expect("answer");
    let expected: Vec<bool> = (0..2500).map(|i| i % 3 != 0).collect();
    assert_eq!(renewed, expected);
    assert_eq!(
        s.store.renew(&[]).await.expect("answer"),
        Vec::<bool>::new()
    );
}

async fn releases_notify_only_when_someone_waits(mut s: Subject) {
    fence(&s, &claim("quiet", "a", 10_000)).await;
    fence(&s, &claim("busy", "a", 10_000)).await;
    assert!(is_busy(&s, &waiting("busy", "b", 10_000)).await);
    assert!(
        is_busy(&s, &claim("quiet", "b", 10_000)).await,
        "no wait, no registration"
    );
    assert_eq!(s.store.describe("busy").await.expect("answer").waiters, 1);
    assert_eq!(s.store.describe("quiet").await.expect("answer").waiters, 0);
    s.store.release("quiet", "a", false).await.expect("answer");
    s.store.release("busy", "a", false).await.expect("answer");
    // Notices arrive in order: the first one proves "quiet" published nothing.
    assert_eq!(next_notice(&mut s).await, Notice::Released("busy".into()));
    // The waiter's grant removes its registration.
    fence(&s, &waiting("busy", "b", 10_000)).await;
    assert_eq!(s.store.describe("busy").await.expect("answer").waiters, 0);
}

async fn unwait_and_expiry_remove_waiters(mut s: Subject) {
    fence(&s, &claim("k", "a", 10_000)).await;
    assert!(is_busy(&s, &waiting("k", "b", 10_000)).await);
    assert!(is_busy(&s, &waiting("k", "c", 100)).await);
    assert_eq!(s.store.describe("k").await.expect("answer").waiters, 2);
    s.store.unwait("k", "b").await.expect("answer");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(s.store.describe("k").await.expect("answer").waiters, 0);
    fence(&s, &claim("other", "a", 10_000)).await;
    assert!(is_busy(&s, &waiting("other", "b", 10_000)).await);
    s.store.release("k", "a", false).await.expect("answer");
    s.store.release("other", "a", false).await.expect("answer");
    assert_eq!(next_notice(&mut s).await, Notice::Released("other".into()));
}

async fn describe_shows_holders_but_no_secrets(s: Subject) {
    let empty = s.store.describe("k").await.expect("answer");
    assert!(empty.holders.is_empty());
    assert_eq!((empty.waiters, empty.fence), (0, 0));
    let mut c = claim("k", "0wner-secret", 10_000);
    c.session_id = "public-id".into();
    c.client_name = "name|with|bars".into();
    let token = fence(&s, &c).await;
    let state = s.store.describe("k").await.expect("answer");
    assert_eq!(state.fence, token);
    let holder = &state.holders[0];
    assert_eq!(holder.session_id, "public-id");
    assert_eq!(
        holder.client_name, "name|with|bars",
        "names may hold the separator"
    );
    assert_eq!((holder.hold_count, holder.fence), (1, token));
    assert!(holder.ttl_remaining > Duration::from_secs(9));
    assert!(
        !format!("{state:?}").contains("0wner-secret"),
        "owner tokens stay secret"
    );
    s.store
        .release("k", "0wner-secret", true)
        .await
        .expect("answer");
    let after = s.store.describe("k").await.expect("answer");
    assert!(after.holders.is_empty());
    assert_eq!(after.fence, token, "the last token issued stays visible");
}

async fn keys_are_opaque(s: Subject) {
    for key in ["a}b{c", "{x}", "ключ", "with space", "a:b:c", "%s%d"] {
        let first = fence(&s, &claim(key, "a", 10_000)).await;
        assert!(is_busy(&s, &claim(key, "b", 10_000)).await, "{key}");
        assert_eq!(
            s.store.release(key, "a", false).await.expect("answer"),
            Some(0)
        );
        assert!(fence(&s, &claim(key, "b", 10_000)).await > first);
    }
}

async fn pings(s: Subject) {
    s.store.ping().await.expect("ping");
}

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(#[tokio::test] async fn $name() { super::$name(super::subject("memory").await).await; })*
        }
        mod redis {
            $(#[tokio::test] async fn $name() { super::$name(super::subject("redis").await).await; })*
        }
    };
}

conformance!(
    grants_then_busy,
    release_frees_and_fences_increase,
    only_the_owner_releases,
    holds_are_counted,
    grants_expire_and_fences_survive,
    renewals_extend_only_held_grants,
    large_batches_keep_their_order,
    releases_notify_only_when_someone_waits,
    unwait_and_expiry_remove_waiters,
    describe_shows_holders_but_no_secrets,
    keys_are_opaque,
    pings,
);

#[tokio::test]
async fn redis_store_reports_unavailable_when_redis_is_gone() {
    let mut redis = Redis::start();
    let store = make_store(&StoreKind::Redis(redis.url()), &namespace());
    store.ping().await.expect("ping");
    redis.kill();
    let err = store
        .acquire(&claim("k", "a", 10_000))
        .await
        .expect_err("no redis");
    assert!(err.to_string().contains("unavailable"), "{err}");
    redis.restart();
    // The broken connection is replaced without restarting anything.
    let mut granted = false;
    for _ in 0..20 {
        if let Ok(Acquired::Granted { .. }) = store.acquire(&claim("k", "a", 10_000)).await {
            granted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(granted, "grants work again once Redis is back");
}

#[tokio::test]
async fn redis_scripts_are_loaded_again_after_a_flush() {
    let redis = Redis::start();
    let store = make_store(&StoreKind::Redis(redis.url()), &namespace());
    let Acquired::Granted { fence: a } = store
        .acquire(&claim("k", "a", 10_000))
        .await
        .expect("answer")
    else {
        panic!("grant")
    };
    // EVALSHA answers NOSCRIPT now; the store must load the script and go on.
    assert_eq!(redis.cli(&["script", "flush"]), "OK");
    assert_eq!(
        store.release("k", "a", false).await.expect("answer"),
        Some(0)
    );
    let Acquired::Granted { fence: b } = store
        .acquire(&claim("k", "b", 10_000))
        .await
        .expect("answer")
    else {
        panic!("grant")
    };
    assert!(b > a);
}

#[tokio::test]
async fn memory_fences_keep_increasing_across_a_new_store() {
    let first = make_store(&StoreKind::Memory, "ns");
    let Acquired::Granted { fence: a } = first
        .acquire(&claim("k", "a", 10_000))
        .await
        .expect("answer")
    else {
        panic!("grant")
    };
    drop(first);
    // A restart takes longer than the token clock's millisecond.
    tokio::time::sleep(Duration::from_millis(2)).await;
    let second = make_store(&StoreKind::Memory, "ns");
    let Acquired::Granted { fence: b } = second
        .acquire(&claim("k", "a", 10_000))
        .await
        .expect("answer")
    else {
        panic!("grant")
    };
    assert!(
        b > a,
        "a restarted memory store issues larger tokens ({b} > {a})"
    );
}
