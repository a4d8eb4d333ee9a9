//! One conformance suite for every store: the same checks against the embedded memory
//! store, a real `redis-server` and a real Redis Cluster (one shared by the tests that run
//! at the same time). A store that passes is one the engine can use.
//!
//! Expiry here runs on real time for both stores (Redis has no paused clock), with TTLs
//! of a few hundred milliseconds; the engine-level TTL tests use a paused clock.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::topology::ClusterSetup;
use common::{Redis, StoreKind, make_store, namespace};
use lockside::store::redlock::RedlockStore;
use lockside::store::{
    Acquired, Claim, Listing, Notice, RecordLine, RecordWrite, Recorded, Refusal, Renewal, Renewed,
    ResumeClaim, Resumption, Sharing, Store, StoreCheck,
};

const NO_DELAY: Duration = Duration::ZERO;
/// A resume refused because no session has that token under that secret.
const UNKNOWN: Resumption = Resumption::Refused(Refusal::Unknown);

/// A release notice naming no fair waiter.
fn released(key: &str) -> Notice {
    Notice::Released {
        key: key.into(),
        owners: Vec::new(),
    }
}
use tokio::sync::broadcast;

/// The keys whose notices the checks read; "quiet" too, so that a notice it should not
/// publish would be heard.
const LISTENED: [&str; 5] = ["k", "busy", "quiet", "other", "r"];

/// A store under test, with the notices of [`LISTENED`] subscribed and live.
struct Subject {
    store: Arc<dyn Store>,
    notices: broadcast::Receiver<Notice>,
    _redis: Option<Redis>,
    _cluster: Option<Arc<ClusterSetup>>,
    /// Redlock: its three masters.
    _masters: Vec<Redis>,
    /// How many notices one change makes: one per Redlock master, else one.
    copies: usize,
}

/// A Redlock store over three fresh masters.
async fn redlock_subject() -> Subject {
    let masters: Vec<Redis> = (0..3).map(|_| Redis::start()).collect();
    let hosts: Vec<String> = masters
        .iter()
        .map(|r| format!("127.0.0.1:{}", r.port))
        .collect();
    let url = format!("redlock://{}", hosts.join(","));
    let store = RedlockStore::new(&url, &namespace(), Duration::from_millis(500));
    let store: Arc<dyn Store> = Arc::new(store.expect("redlock store"));
    // The checks Redlock runs use no notices: no subscription to wait for.
    let notices = store.notices();
    Subject {
        store,
        notices,
        _redis: None,
        _cluster: None,
        copies: masters.len(),
        _masters: masters,
    }
}

async fn subject(kind: &str) -> Subject {
    let ns = namespace();
    let (kind, redis, cluster) = match kind {
        "memory" => (StoreKind::Memory, None, None),
        "redlock" => return redlock_subject().await,
        // Only the least-privilege user the README documents (issue 26).
        "least_privilege" => {
            let (redis, url) = Redis::least_privilege(&ns);
            (StoreKind::Redis(url), Some(redis), None)
        }
        // One cluster for the tests that run at the same time; namespaces part them.
        "cluster" => {
            let cluster = tokio::task::block_in_place(ClusterSetup::shared);
            (StoreKind::Redis(cluster.url()), None, Some(cluster))
        }
        _ => {
            let redis = Redis::start();
            (StoreKind::Redis(redis.url()), Some(redis), None)
        }
    };
    let store = make_store(&kind, &ns);
    let notices = store.notices();
    // A store delivers the notices of the keys listened to (the engine listens while
    // it waits); the checks read the notices of these. Live once `listen` completes.
    for key in LISTENED {
        store.listen(key, false).await.expect("listen");
    }
    Subject {
        store,
        notices,
        _redis: redis,
        _cluster: cluster,
        _masters: Vec::new(),
        copies: 1,
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
        holder: String::new(),
        sharing: Sharing::Exclusive,
        limit: 1,
        fair: false,
        value: Vec::new(),
        ticket: None,
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
        Acquired::Busy { expires_in, .. } => {
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
        s.store
            .release("k", "a", 0, NO_DELAY)
            .await
            .expect("answer"),
        Some(0)
    );
    let second = fence(&s, &claim("k", "b", 10_000)).await;
    assert!(second > first, "{second} > {first}");
    assert_eq!(
        s.store
            .release("k", "b", 0, NO_DELAY)
            .await
            .expect("answer"),
        Some(0)
    );
    let third = fence(&s, &claim("k", "a", 10_000)).await;
    assert!(third > second);
}

async fn only_the_owner_releases(s: Subject) {
    fence(&s, &claim("k", "a", 10_000)).await;
    assert_eq!(
        s.store
            .release("k", "b", 1, NO_DELAY)
            .await
            .expect("answer"),
        None
    );
    assert_eq!(
        s.store
            .release("k", "b", 0, NO_DELAY)
            .await
            .expect("answer"),
        None
    );
    assert!(is_busy(&s, &claim("k", "b", 10_000)).await);
    assert_eq!(
        s.store
            .release("nothing", "a", 0, NO_DELAY)
            .await
            .expect("answer"),
        None
    );
}

/// `release_grant`, the release of a whole grant whose token the caller knows, answers
/// as `release` does, whatever token it names: only the holder releases, a release of
/// nothing or of a grant already released changes nothing, and a wrong token (a Redlock
/// master may keep a larger one) neither stops the release nor becomes the lock's.
async fn released_grants_answer_as_releases(s: Subject) {
    let first = fence(&s, &claim("k", "a", 10_000)).await;
    for named in [first, first + 1, 1] {
        let answer = s.store.release_grant("k", "b", named, NO_DELAY).await;
        assert_eq!(answer.expect("answer"), None, "not b's grant");
    }
    assert!(is_busy(&s, &claim("k", "b", 10_000)).await);
    let state = s.store.describe("k").await.expect("answer");
    // Redlock shows the largest token of its masters: one the acquire reached late
    // made a larger one than the grant's.
    assert_eq!(state.holders.len(), 1);
    assert!(state.fence >= first, "{} >= {first}", state.fence);
    let answer = s.store.release_grant("nothing", "a", first, NO_DELAY).await;
    assert_eq!(answer.expect("answer"), None);
    let nothing = s.store.describe("nothing").await.expect("answer");
    assert!(nothing.holders.is_empty());
    assert_eq!(nothing.fence, 0, "a release of nothing keeps no token");
    // Days of tokens ahead (1024 a ms): no master can have made it.
    let named = first + 1_000_000_000_000;
    let answer = s.store.release_grant("k", "a", named, NO_DELAY).await;
    assert_eq!(answer.expect("answer"), Some(0));
    let state = s.store.describe("k").await.expect("answer");
    assert!(state.holders.is_empty());
    assert!(state.fence < named, "the token named is not kept");
    let again = s.store.release_grant("k", "a", first, NO_DELAY).await;
    assert_eq!(again.expect("answer"), None, "released already");
    let second = fence(&s, &claim("k", "b", 10_000)).await;
    assert!(second > first, "{second} > {first}");
    let answer = s.store.release_grant("k", "b", second, NO_DELAY).await;
    assert_eq!(answer.expect("answer"), Some(0));
    let third = fence(&s, &claim("k", "a", 10_000)).await;
    assert!(third > second, "{third} > {second}");
}

/// A released grant wakes its waiters, and a release nobody waits for publishes nothing,
/// as with `release`.
async fn released_grants_notify_only_when_someone_waits(mut s: Subject) {
    let quiet = fence(&s, &claim("quiet", "a", 10_000)).await;
    let busy = fence(&s, &claim("busy", "a", 10_000)).await;
    assert!(is_busy(&s, &waiting("busy", "b", 10_000)).await);
    for (key, token) in [("quiet", quiet), ("busy", busy)] {
        let answer = s.store.release_grant(key, "a", token, NO_DELAY).await;
        assert_eq!(answer.expect("answer"), Some(0));
    }
    // Notices arrive in order: the first one proves "quiet" published nothing.
    assert_eq!(next_notice(&mut s).await, released("busy"));
    fence(&s, &waiting("busy", "b", 10_000)).await;
    assert_eq!(s.store.describe("busy").await.expect("answer").waiters, 0);
}

async fn holds_are_counted(s: Subject) {
    let ttl = Duration::from_secs(10);
    fence(&s, &claim("k", "a", 10_000)).await;
    assert_eq!(
        s.store.reenter("k", "a", 2, ttl).await.expect("answer"),
        Some(2)
    );
    assert_eq!(
        s.store.reenter("k", "a", 3, ttl).await.expect("answer"),
        Some(3)
    );
    assert_eq!(
        s.store.reenter("k", "b", 2, ttl).await.expect("answer"),
        None
    );
    assert_eq!(
        s.store.describe("k").await.expect("answer").holders[0].hold_count,
        3
    );
    assert_eq!(
        s.store
            .release("k", "a", 2, NO_DELAY)
            .await
            .expect("answer"),
        Some(2)
    );
    assert!(is_busy(&s, &claim("k", "b", 10_000)).await);
    assert_eq!(
        s.store
            .release("k", "a", 0, NO_DELAY)
            .await
            .expect("answer"),
        Some(0)
    );
    assert_eq!(
        s.store.reenter("k", "a", 2, ttl).await.expect("answer"),
        None
    );
    fence(&s, &claim("k", "b", 10_000)).await;
}

/// Holds and releases carry the count the session wants, so a call repeated (a retry,
/// or one that timed out but ran) leaves the store as one call would: the session, not
/// the store, counts holds.
async fn holds_and_releases_are_idempotent(s: Subject) {
    let ttl = Duration::from_secs(10);
    let count = |s: &Subject| {
        let store = s.store.clone();
        async move {
            let state = store.describe("k").await.expect("answer");
            state
                .holders
                .iter()
                .map(|h| h.hold_count)
                .collect::<Vec<_>>()
        }
    };
    fence(&s, &claim("k", "a", 10_000)).await;
    for _ in 0..2 {
        assert_eq!(
            s.store.reenter("k", "a", 2, ttl).await.expect("answer"),
            Some(2)
        );
    }
    assert_eq!(count(&s).await, [2], "two holds asked twice are two");
    for _ in 0..2 {
        assert_eq!(
            s.store
                .release("k", "a", 1, NO_DELAY)
                .await
                .expect("answer"),
            Some(1)
        );
    }
    assert_eq!(count(&s).await, [1], "a release repeated takes one hold");
    assert!(is_busy(&s, &claim("k", "b", 10_000)).await, "still held");
    // A hold that ran but whose answer was lost, then the release of the one hold the
    // session knows of: the store follows the session.
    s.store.reenter("k", "a", 2, ttl).await.expect("answer");
    assert_eq!(
        s.store
            .release("k", "a", 0, NO_DELAY)
            .await
            .expect("answer"),
        Some(0)
    );
    assert_eq!(
        s.store
            .release("k", "a", 0, NO_DELAY)
            .await
            .expect("answer"),
        None,
        "released once; the repeat finds nothing"
    );
    assert!(count(&s).await.is_empty());
    fence(&s, &claim("k", "b", 10_000)).await;
}

async fn grants_expire_and_fences_survive(s: Subject) {
    let first = fence(&s, &claim("k", "a", 150)).await;
    assert!(is_busy(&s, &claim("k", "b", 150)).await);
    // Real time: Redis has no paused clock.
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(renewed(&s, &[renewal("k", "a", 150)]).await, vec![false]);
    assert_eq!(
        s.store
            .release("k", "a", 0, NO_DELAY)
            .await
            .expect("answer"),
        None
    );
    let second = fence(&s, &claim("k", "b", 10_000)).await;
    assert!(second > first, "tokens survive expiry");
}

/// Renews `batch`: `true` per grant extended, `false` per grant not held; a grant the
/// store failed to answer for fails the test.
async fn renewed(s: &Subject, batch: &[Renewal<'_>]) -> Vec<bool> {
    let answers = s.store.renew(batch).await.expect("answer");
    assert_eq!(answers.len(), batch.len(), "one answer per grant");
    answers
        .into_iter()
        .map(|a| match a {
            Renewed::Extended => true,
            Renewed::NotHeld => false,
            Renewed::Failed(e) => panic!("renewal failed: {e}"),
        })
        .collect()
}

fn renewal<'a>(key: &'a str, owner: &'a str, ttl_ms: u64) -> Renewal<'a> {
    Renewal {
        key,
        owner,
        ttl: Duration::from_millis(ttl_ms),
    }
}

/// A renewal extends the holder's own grant only: not an owner that is a prefix of the
/// holder's, nor one named in the holder's client name or value (`renew.lua` finds the
/// holder by position, not by searching the lock's string).
async fn renewals_match_the_whole_holder(s: Subject) {
    let holder = claim("k", "sid.secret.12", 10_000);
    let holder = Claim {
        client_name: "x|sid.secret.1|y".into(),
        holder: String::new(),
        value: b"|sid.secret.1|sid.secret.3|".to_vec(),
        ..holder
    };
    fence(&s, &holder).await;
    let batch = [
        renewal("k", "sid.secret.1", 10_000),
        renewal("k", "sid.secret.123", 10_000),
        renewal("k", "sid.secret.3", 10_000),
        renewal("k", "sid.secret.12", 10_000),
    ];
    assert_eq!(renewed(&s, &batch).await, vec![false, false, false, true]);
}

async fn renewals_extend_only_held_grants(s: Subject) {
    fence(&s, &claim("k", "a", 300)).await;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let batch = [
            renewal("k", "a", 300),
            renewal("k", "b", 300),
            renewal("x", "a", 300),
        ];
        assert_eq!(renewed(&s, &batch).await, vec![true, false, false]);
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
    let expected: Vec<bool> = (0..2500).map(|i| i % 3 != 0).collect();
    assert_eq!(renewed(&s, &batch).await, expected);
    assert_eq!(renewed(&s, &[]).await, Vec::<bool>::new());
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
    s.store
        .release("quiet", "a", 0, NO_DELAY)
        .await
        .expect("answer");
    s.store
        .release("busy", "a", 0, NO_DELAY)
        .await
        .expect("answer");
    // Notices arrive in order: the first one proves "quiet" published nothing.
    assert_eq!(next_notice(&mut s).await, released("busy"));
    // The waiter's grant removes its registration.
    fence(&s, &waiting("busy", "b", 10_000)).await;
    assert_eq!(s.store.describe("busy").await.expect("answer").waiters, 0);
}

async fn unwait_and_expiry_remove_waiters(mut s: Subject) {
    fence(&s, &claim("k", "a", 10_000)).await;
    assert!(is_busy(&s, &waiting("k", "b", 10_000)).await);
    assert!(is_busy(&s, &waiting("k", "c", 100)).await);
    assert_eq!(s.store.describe("k").await.expect("answer").waiters, 2);
    s.store
        .unwait(&waiting("k", "b", 10_000))
        .await
        .expect("answer");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(s.store.describe("k").await.expect("answer").waiters, 0);
    fence(&s, &claim("other", "a", 10_000)).await;
    assert!(is_busy(&s, &waiting("other", "b", 10_000)).await);
    s.store
        .release("k", "a", 0, NO_DELAY)
        .await
        .expect("answer");
    s.store
        .release("other", "a", 0, NO_DELAY)
        .await
        .expect("answer");
    assert_eq!(next_notice(&mut s).await, released("other"));
}

async fn describe_shows_holders_but_no_secrets(s: Subject) {
    let empty = s.store.describe("k").await.expect("answer");
    assert!(empty.holders.is_empty());
    assert_eq!((empty.waiters, empty.fence), (0, 0));
    // An owner token starts with its session id and a '.'; the rest is secret.
    let mut c = claim("k", "public-id.0wner-secret.1", 10_000);
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
        .release("k", "public-id.0wner-secret.1", 0, NO_DELAY)
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
            s.store
                .release(key, "a", 0, NO_DELAY)
                .await
                .expect("answer"),
            Some(0)
        );
        assert!(fence(&s, &claim(key, "b", 10_000)).await > first);
    }
}

fn shared(key: &str, owner: &str) -> Claim {
    Claim {
        sharing: Sharing::Shared,
        ..claim(key, owner, 10_000)
    }
}

fn permit(key: &str, owner: &str, limit: u32) -> Claim {
    Claim {
        limit,
        ..claim(key, owner, 10_000)
    }
}

fn fair(mut c: Claim) -> Claim {
    c.fair = true;
    c.wait = true;
    c
}

async fn position(s: &Subject, c: &Claim) -> u32 {
    match s.store.acquire(c).await.expect("answer") {
        Acquired::Busy { position, .. } => position,
        other => panic!("expected busy for {}, got {other:?}", c.owner),
    }
}

fn names(notice: Notice) -> Vec<String> {
    match notice {
        Notice::Released { owners, .. } => owners,
        other => panic!("expected a release notice, got {other:?}"),
    }
}

async fn readers_share_and_exclude_writers(s: Subject) {
    let (r1, r2) = (
        fence(&s, &shared("k", "r1")).await,
        fence(&s, &shared("k", "r2")).await,
    );
    assert!(r2 > r1, "every reader has its own token");
    assert!(is_busy(&s, &claim("k", "w", 10_000)).await);
    let state = s.store.describe("k").await.expect("answer");
    assert_eq!(
        (state.sharing, state.limit, state.holders.len()),
        (Some(Sharing::Shared), 1, 2)
    );
    s.store
        .release("k", "r1", 0, NO_DELAY)
        .await
        .expect("answer");
    assert!(
        is_busy(&s, &claim("k", "w", 10_000)).await,
        "one reader still holds it"
    );
    s.store
        .release("k", "r2", 0, NO_DELAY)
        .await
        .expect("answer");
    fence(&s, &claim("k", "w", 10_000)).await;
    assert!(
        is_busy(&s, &shared("k", "r3")).await,
        "a writer excludes readers"
    );
    assert_eq!(
        s.store.describe("k").await.expect("answer").sharing,
        Some(Sharing::Exclusive)
    );
}

async fn semaphores_admit_up_to_their_limit(s: Subject) {
    let mut tokens = Vec::new();
    for owner in ["a", "b", "c"] {
        tokens.push(fence(&s, &permit("k", owner, 3)).await);
    }
    assert!(
        tokens.windows(2).all(|t| t[0] < t[1]),
        "one token per permit"
    );
    assert!(is_busy(&s, &permit("k", "d", 3)).await);
    for other in [permit("k", "d", 2), claim("k", "d", 10_000)] {
        assert_eq!(
            s.store.acquire(&other).await.expect("answer"),
            Acquired::Conflict { limit: 3 },
            "limit {} against holders with 3",
            other.limit
        );
    }
    let state = s.store.describe("k").await.expect("answer");
    assert_eq!((state.limit, state.holders.len()), (3, 3));
    s.store
        .release("k", "b", 0, NO_DELAY)
        .await
        .expect("answer");
    fence(&s, &permit("k", "d", 3)).await;
    for owner in ["a", "c", "d"] {
        s.store
            .release("k", owner, 0, NO_DELAY)
            .await
            .expect("answer");
    }
    fence(&s, &claim("k", "plain", 10_000)).await;
    assert_eq!(
        s.store.describe("k").await.expect("answer").limit,
        1,
        "limits go with the holders"
    );
}

async fn fair_waiters_go_in_arrival_order(mut s: Subject) {
    fence(&s, &claim("k", "holder", 10_000)).await;
    let waiters: Vec<Claim> = ["b", "c", "d"]
        .iter()
        .map(|o| fair(claim("k", o, 10_000)))
        .collect();
    for (i, w) in waiters.iter().enumerate() {
        assert_eq!(position(&s, w).await, i as u32 + 1);
    }
    assert_eq!(
        position(&s, &waiters[1]).await,
        2,
        "asking again keeps the place"
    );
    let state = s.store.describe("k").await.expect("answer");
    let queue: Vec<&str> = state.queue.iter().map(|q| q.session_id.as_str()).collect();
    assert_eq!(queue, ["sid-b", "sid-c", "sid-d"]);
    s.store
        .release("k", "holder", 0, NO_DELAY)
        .await
        .expect("answer");
    assert_eq!(
        names(next_notice(&mut s).await),
        ["b"],
        "only the head is woken"
    );
    assert_eq!(position(&s, &waiters[1]).await, 2, "c cannot pass b");
    // Unfair requests do not queue: one can take the free lock ahead of b.
    fence(&s, &claim("k", "x", 10_000)).await;
    s.store
        .release("k", "x", 0, NO_DELAY)
        .await
        .expect("answer");
    assert_eq!(
        names(next_notice(&mut s).await),
        ["b"],
        "b is still the head"
    );
    fence(&s, &waiters[0]).await;
    assert_eq!(position(&s, &waiters[1]).await, 1);
    s.store
        .release("k", "b", 0, NO_DELAY)
        .await
        .expect("answer");
    assert_eq!(names(next_notice(&mut s).await), ["c"]);
    fence(&s, &waiters[1]).await;
}

async fn next_notice_if_any(s: &mut Subject) -> Option<Notice> {
    tokio::time::timeout(Duration::from_millis(50), s.notices.recv())
        .await
        .ok()
        .and_then(Result::ok)
}

async fn fair_readers_go_together_until_a_writer(mut s: Subject) {
    fence(&s, &claim("k", "w0", 10_000)).await;
    let r1 = fair(shared("k", "r1"));
    let r2 = fair(shared("k", "r2"));
    let w1 = fair(claim("k", "w1", 10_000));
    let r3 = fair(shared("k", "r3"));
    for (i, c) in [&r1, &r2, &w1, &r3].into_iter().enumerate() {
        assert_eq!(position(&s, c).await, i as u32 + 1);
    }
    s.store
        .release("k", "w0", 0, NO_DELAY)
        .await
        .expect("answer");
    assert_eq!(
        names(next_notice(&mut s).await),
        ["r1", "r2"],
        "the readers at the head, together"
    );
    assert_eq!(
        position(&s, &r3).await,
        4,
        "a reader behind a waiting writer waits: no writer starvation"
    );
    fence(&s, &r2).await;
    fence(&s, &r1).await;
    assert_eq!(position(&s, &w1).await, 1);
    s.store
        .release("k", "r1", 0, NO_DELAY)
        .await
        .expect("answer");
    s.store
        .release("k", "r2", 0, NO_DELAY)
        .await
        .expect("answer");
    let mut woken = Vec::new();
    while let Some(notice) = next_notice_if_any(&mut s).await {
        woken.extend(names(notice));
    }
    assert!(woken.contains(&"w1".to_owned()), "{woken:?}");
    assert!(!woken.contains(&"r3".to_owned()), "{woken:?}");
    fence(&s, &w1).await;
    assert!(is_busy(&s, &r3).await);
}

async fn a_dead_fair_waiter_leaves_the_queue_at_its_expiry(s: Subject) {
    fence(&s, &claim("k", "holder", 10_000)).await;
    let dead = fair(claim("k", "dead", 150));
    let alive = fair(claim("k", "alive", 10_000));
    assert_eq!(position(&s, &dead).await, 1);
    assert_eq!(position(&s, &alive).await, 2);
    s.store
        .release("k", "holder", 0, NO_DELAY)
        .await
        .expect("answer");
    match s.store.acquire(&alive).await.expect("answer") {
        Acquired::Busy {
            expires_in,
            position,
            ..
        } => {
            assert_eq!(position, 2);
            assert!(
                expires_in <= Duration::from_millis(150),
                "look again when the one ahead may be gone: {expires_in:?}"
            );
        }
        other => panic!("expected busy, got {other:?}"),
    }
    // Real time: the dead waiter never refreshes its 150 ms registration.
    tokio::time::sleep(Duration::from_millis(250)).await;
    fence(&s, &alive).await;
    assert!(
        s.store
            .describe("k")
            .await
            .expect("answer")
            .queue
            .is_empty()
    );
}

async fn lock_delay_keeps_an_abandoned_lock_free_of_holders(s: Subject) {
    fence(&s, &claim("k", "a", 10_000)).await;
    s.store
        .release("k", "a", 0, Duration::from_millis(200))
        .await
        .expect("answer");
    match s
        .store
        .acquire(&claim("k", "b", 10_000))
        .await
        .expect("answer")
    {
        Acquired::Busy { expires_in, .. } => assert!(expires_in <= Duration::from_millis(200)),
        other => panic!("the lock-delay keeps it: {other:?}"),
    }
    tokio::time::sleep(Duration::from_millis(250)).await;
    fence(&s, &claim("k", "b", 10_000)).await;
    // Readers and semaphores are not delayed: only exclusive locks protect a writer.
    fence(&s, &shared("r", "a")).await;
    s.store
        .release("r", "a", 0, Duration::from_secs(10))
        .await
        .expect("answer");
    fence(&s, &shared("r", "b")).await;
}

async fn only_grants_that_leave_room_pass_the_wake_on(mut s: Subject) {
    fence(&s, &permit("k", "a", 2)).await;
    fence(&s, &permit("k", "b", 2)).await;
    let waiter = Claim {
        wait: true,
        ..permit("k", "w", 2)
    };
    let other = Claim {
        wait: true,
        ..permit("k", "w2", 2)
    };
    assert!(is_busy(&s, &waiter).await, "two permits taken");
    assert!(is_busy(&s, &other).await);
    s.store
        .release("k", "a", 0, NO_DELAY)
        .await
        .expect("answer");
    assert_eq!(
        next_notice(&mut s).await,
        released("k"),
        "a free permit wakes a waiter"
    );
    fence(&s, &waiter).await;
    assert!(
        next_notice_if_any(&mut s).await.is_none(),
        "taking the last permit wakes nobody"
    );
}

async fn unwait_leaves_the_fair_queue(mut s: Subject) {
    fence(&s, &claim("k", "holder", 10_000)).await;
    let (b, c) = (fair(claim("k", "b", 10_000)), fair(claim("k", "c", 10_000)));
    position(&s, &b).await;
    assert_eq!(position(&s, &c).await, 2);
    s.store
        .release("k", "holder", 0, NO_DELAY)
        .await
        .expect("answer");
    assert_eq!(names(next_notice(&mut s).await), ["b"]);
    // b gives up before taking it: c, now first, is woken.
    s.store.unwait(&b).await.expect("answer");
    assert_eq!(names(next_notice(&mut s).await), ["c"]);
    assert_eq!(s.store.describe("k").await.expect("answer").waiters, 1);
    fence(&s, &c).await;
}

/// A holder's claim with a value.
fn valued(key: &str, owner: &str, value: &[u8]) -> Claim {
    Claim {
        value: value.to_vec(),
        ..claim(key, owner, 10_000)
    }
}

async fn values_are_kept_proclaimed_and_shown(s: Subject) {
    // Any bytes: separators, NUL, invalid UTF-8, the contract's 4 KiB.
    let odd = b"10.0.0.7:8080|x\n\0\xff".to_vec();
    let first = fence(&s, &valued("k", "a", &odd)).await;
    let state = s.store.describe("k").await.expect("answer");
    assert_eq!(state.holders.len(), 1);
    assert_eq!(
        (&state.holders[0].value, state.holders[0].fence),
        (&odd, first)
    );
    let big = vec![b'v'; lockside::proto::limits::MAX_VALUE_BYTES];
    assert!(s.store.proclaim("k", "a", &big).await.expect("answer"));
    assert_eq!(
        s.store.describe("k").await.expect("answer").holders[0].value,
        big
    );
    assert!(
        !s.store
            .proclaim("k", "b", b"usurper")
            .await
            .expect("answer"),
        "only the holder proclaims"
    );
    assert!(
        !s.store
            .proclaim("nothing", "a", b"x")
            .await
            .expect("answer")
    );
    assert_eq!(
        s.store.describe("k").await.expect("answer").holders[0].value,
        big
    );
    assert!(s.store.proclaim("k", "a", b"").await.expect("answer"));
    assert!(
        s.store.describe("k").await.expect("answer").holders[0]
            .value
            .is_empty()
    );
    // The next leader: its own value, a larger token; nothing left of the last one.
    s.store
        .release("k", "a", 0, NO_DELAY)
        .await
        .expect("answer");
    assert!(!s.store.proclaim("k", "a", b"late").await.expect("answer"));
    let second = fence(&s, &valued("k", "b", b"b")).await;
    assert!(second > first);
    let state = s.store.describe("k").await.expect("answer");
    assert_eq!(
        (&state.holders[0].value[..], state.holders[0].fence),
        (&b"b"[..], second)
    );
    // A hold keeps the value.
    assert_eq!(
        s.store
            .reenter("k", "b", 2, Duration::from_secs(10))
            .await
            .expect("answer"),
        Some(2)
    );
    assert_eq!(
        s.store.describe("k").await.expect("answer").holders[0].value,
        b"b"
    );
}

async fn shared_holders_have_their_own_values(s: Subject) {
    fence(
        &s,
        &Claim {
            value: b"one".to_vec(),
            ..shared("k", "r1")
        },
    )
    .await;
    fence(
        &s,
        &Claim {
            value: b"two".to_vec(),
            ..shared("k", "r2")
        },
    )
    .await;
    assert!(s.store.proclaim("k", "r2", b"deux").await.expect("answer"));
    let mut values: Vec<Vec<u8>> = s
        .store
        .describe("k")
        .await
        .expect("answer")
        .holders
        .into_iter()
        .map(|h| h.value)
        .collect();
    values.sort();
    assert_eq!(values, [b"deux".to_vec(), b"one".to_vec()]);
}

/// The notice of one change: on Redlock every master sends its own copy, all read here.
async fn one_change(s: &mut Subject) -> Notice {
    let first = next_notice(s).await;
    for _ in 1..s.copies {
        let copy = next_notice(s).await;
        assert_eq!(
            copy.key(),
            first.key(),
            "copies of one change: {first:?}, {copy:?}"
        );
    }
    first
}

/// Whether `notice` says that `key` changed (a release notice counts: watchers read
/// the key again on either).
fn about(notice: &Notice, key: &str) -> bool {
    notice.key() == Some(key)
}

async fn watched_keys_announce_their_changes_and_others_nothing(mut s: Subject) {
    s.store.listen("watched", true).await.expect("listen");
    // Notices arrive in order: the first one proves "quiet" published nothing.
    fence(&s, &valued("quiet", "a", b"a")).await;
    fence(&s, &valued("watched", "a", b"a")).await;
    let notice = one_change(&mut s).await;
    assert!(about(&notice, "watched"), "a grant: {notice:?}");
    assert_ne!(
        notice,
        released("watched"),
        "a grant wakes no waiter: it is a change"
    );
    assert!(s.store.proclaim("quiet", "a", b"b").await.expect("answer"));
    assert!(
        s.store
            .proclaim("watched", "a", b"b")
            .await
            .expect("answer")
    );
    assert!(about(&one_change(&mut s).await, "watched"), "a proclaim");
    s.store
        .reenter("watched", "a", 2, Duration::from_secs(10))
        .await
        .expect("answer");
    assert!(about(&one_change(&mut s).await, "watched"), "a hold count");
    s.store
        .release("quiet", "a", 0, NO_DELAY)
        .await
        .expect("answer");
    s.store
        .release("watched", "a", 0, NO_DELAY)
        .await
        .expect("answer");
    assert!(about(&one_change(&mut s).await, "watched"), "a release");
    // Unwatched again: quiet again. A probe key proves it, as above.
    s.store.unlisten("watched", true);
    s.store.listen("probe", true).await.expect("listen");
    fence(&s, &valued("watched", "b", b"b")).await;
    fence(&s, &valued("probe", "b", b"b")).await;
    let notice = one_change(&mut s).await;
    assert!(about(&notice, "probe"), "nobody watches: {notice:?}");
}

async fn pings(s: Subject) {
    s.store.ping().await.expect("ping");
}

/// A session's record listing `lines`, written as sidecar `sidecar` with `secret`.
fn record(sid: &str, secret: &str, sidecar: &str, lines: &[(&str, RecordLine)]) -> RecordWrite {
    RecordWrite {
        session_id: sid.into(),
        secret: secret.into(),
        client_name: "app".into(),
        sidecar: sidecar.into(),
        set: lines
            .iter()
            .map(|(k, l)| ((*k).into(), l.clone()))
            .collect(),
        ttl: Duration::from_secs(20),
        ..RecordWrite::default()
    }
}

fn line(grant: u64, fence: u64) -> RecordLine {
    RecordLine {
        grant,
        ttl: Duration::from_secs(10),
        fence,
    }
}

fn resume_claim(sid: &str, secret: &str, new_secret: &str, sidecar: &str) -> ResumeClaim {
    ResumeClaim {
        session_id: sid.into(),
        secret: secret.into(),
        new_secret: new_secret.into(),
        sidecar: sidecar.into(),
    }
}

async fn write(s: &Subject, w: RecordWrite) -> Recorded {
    let answers = s.store.record(&[w]).await.expect("store answers");
    answers[0].clone().expect("written")
}

/// A record names its session's grants; a resume with the session's secret, once its
/// sidecar's attachment is gone, takes them over under a new secret: same tokens,
/// counts, modes and values, extended; the old owner can neither renew nor release
/// them, nor write the record again. Wrong secrets and live attachments are refused.
async fn sessions_resume_with_their_secret_only(s: Subject) {
    assert!(s.store.keeps_sessions());
    let (sid, old, new) = ("5e55105e55105e55", "secret-one", "secret-two");
    let mut k1 = claim("k1", &format!("{sid}.{old}.1"), 10_000);
    k1.value = b"leader at 10.0.0.7".to_vec();
    let f1 = fence(&s, &k1).await;
    assert_eq!(
        s.store
            .reenter("k1", &k1.owner, 2, k1.ttl)
            .await
            .expect("hold"),
        Some(2)
    );
    let k2 = Claim {
        sharing: Sharing::Shared,
        ..claim("k2", &format!("{sid}.{old}.2"), 10_000)
    };
    let f2 = fence(&s, &k2).await;
    let gone = claim("k3", &format!("{sid}.{old}.3"), 300);
    let f3 = fence(&s, &gone).await;
    let lines = [
        ("k1", line(1, f1)),
        ("k2", line(2, f2)),
        ("k3", line(3, f3)),
    ];
    assert_eq!(
        write(&s, record(sid, old, "A", &lines)).await,
        Recorded::Written
    );
    s.store
        .attach("A", Duration::from_millis(400))
        .await
        .expect("attach");

    for (secret, why) in [("secret-on", "altered"), ("", "empty"), (new, "not yet")] {
        let refused = s.store.resume(&resume_claim(sid, secret, "x", "B")).await;
        assert_eq!(refused.expect("answer"), UNKNOWN, "{why}");
    }
    let attached = s.store.resume(&resume_claim(sid, old, new, "B")).await;
    assert_eq!(
        attached.expect("answer"),
        Resumption::Refused(Refusal::Attached),
        "A is attached"
    );
    let unknown = resume_claim("0000000000000000", old, new, "B");
    assert_eq!(s.store.resume(&unknown).await.expect("answer"), UNKNOWN);

    // A dies: its attachment and k3 (TTL 300 ms) expire.
    tokio::time::sleep(Duration::from_millis(450)).await;
    let claimed = s.store.resume(&resume_claim(sid, old, new, "B")).await;
    let Resumption::Claimed(mut locks) = claimed.expect("answer") else {
        panic!("resumed once A is gone");
    };
    locks.sort_by(|a, b| a.key.cmp(&b.key));
    let keys: Vec<&str> = locks.iter().map(|l| l.key.as_str()).collect();
    assert_eq!(keys, ["k1", "k2", "k3"]);
    let g1 = locks[0].held.as_ref().expect("k1 held");
    assert_eq!(
        (g1.count, g1.fence, g1.sharing, g1.limit),
        (2, f1, Sharing::Exclusive, 1)
    );
    assert_eq!(g1.value, b"leader at 10.0.0.7");
    let g2 = locks[1].held.as_ref().expect("k2 held");
    assert_eq!((g2.count, g2.fence, g2.sharing), (1, f2, Sharing::Shared));
    assert_eq!(locks[2].held, None, "k3 expired before the resume");
    assert_eq!(locks[2].line, line(3, f3));

    // The old owners are fenced off; the new ones hold.
    let (n1, n2) = (format!("{sid}.{new}.1"), format!("{sid}.{new}.2"));
    let batch = [
        renewal("k1", &k1.owner, 10_000),
        renewal("k2", &k2.owner, 10_000),
        renewal("k1", &n1, 10_000),
        renewal("k2", &n2, 10_000),
    ];
    assert_eq!(renewed(&s, &batch).await, [false, false, true, true]);
    assert_eq!(
        s.store
            .release("k1", &k1.owner, 0, NO_DELAY)
            .await
            .expect("answer"),
        None
    );
    let state = s.store.describe("k1").await.expect("describe");
    assert_eq!(state.holders.len(), 1);
    assert_eq!(
        (state.holders[0].hold_count, state.holders[0].fence),
        (2, f1)
    );
    assert!(
        !format!("{state:?}").contains(new),
        "owner tokens stay secret"
    );
    assert!(is_busy(&s, &claim("k1", "other", 10_000)).await);

    // The old secret neither resumes nor writes the record any more.
    let again = s
        .store
        .resume(&resume_claim(sid, old, "secret-three", "C"))
        .await;
    assert_eq!(again.expect("answer"), UNKNOWN);
    let zombie = RecordWrite {
        end: true,
        ..record(sid, old, "A", &[])
    };
    assert_eq!(write(&s, zombie).await, Recorded::Foreign);
    // The new secret does; a resume made twice re-keys nothing twice (B never
    // attached, so it may be taken over again).
    let twice = s.store.resume(&resume_claim(sid, new, new, "C")).await;
    let Resumption::Claimed(locks) = twice.expect("answer") else {
        panic!("the new secret resumes");
    };
    assert_eq!(locks.iter().filter(|l| l.held.is_some()).count(), 2);
    // The session ends: its record goes.
    let end = RecordWrite {
        end: true,
        ..record(sid, new, "C", &[])
    };
    assert_eq!(write(&s, end).await, Recorded::Written);
    let after = s.store.resume(&resume_claim(sid, new, "x", "D")).await;
    assert_eq!(after.expect("answer"), UNKNOWN);
}

/// A record lists what it is told and goes with its last lock; writes of one session
/// do not touch another's.
async fn records_follow_their_locks(s: Subject) {
    let (a, b) = ("aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb");
    for (sid, grant) in [(a, 1), (b, 1)] {
        let c = claim("shared-key", &format!("{sid}.s.{grant}"), 10_000);
        let c = Claim {
            sharing: Sharing::Shared,
            ..c
        };
        let f = fence(&s, &c).await;
        let w = record(sid, "s", "A", &[("shared-key", line(grant, f))]);
        assert_eq!(write(&s, w).await, Recorded::Written);
    }
    // a drops its lock: its record goes, b's stays.
    let drop_a = RecordWrite {
        remove: vec![("shared-key".into(), u64::MAX)],
        ..record(a, "s", "A", &[])
    };
    assert_eq!(write(&s, drop_a).await, Recorded::Written);
    let gone = s.store.resume(&resume_claim(a, "s", "t", "B")).await;
    assert_eq!(gone.expect("answer"), UNKNOWN, "no lock, no record");
    // A write of no line extends b's record, which keeps its line.
    let extend = RecordWrite {
        listed: true,
        ..record(b, "s", "A", &[])
    };
    assert_eq!(write(&s, extend).await, Recorded::Written);
    let kept = s.store.resume(&resume_claim(b, "s", "t", "B")).await;
    assert!(matches!(kept.expect("answer"), Resumption::Claimed(l) if l.len() == 1));
    // Writing nothing creates nothing.
    let empty = record("cccccccccccccccc", "s", "A", &[]);
    assert_eq!(write(&s, empty).await, Recorded::Written);
    // A writer that listed lines before finds the record lost: told so, nothing is
    // written (a record of this write's line alone would leave the others out).
    let lost = RecordWrite {
        listed: true,
        ..record("cccccccccccccccc", "s", "A", &[("other-key", line(2, 1))])
    };
    assert_eq!(write(&s, lost).await, Recorded::Missing);
    let none = s
        .store
        .resume(&resume_claim("cccccccccccccccc", "s", "t", "B"))
        .await;
    assert_eq!(none.expect("answer"), UNKNOWN);
}

/// Issue 37: a grant is listed in its session's record as it is granted, where the
/// store can (one server: the memory store and a Cluster list nothing, and the journal
/// writes the line), only in the session's own record and only when the record lives
/// three of the lock's TTL; a resume finds it. A removal written for an earlier grant
/// of the key (on its way while the acquire listed the later one) leaves the later
/// grant's line; one for that grant takes it off.
async fn grants_are_listed_as_they_are_granted_where_the_store_can(s: Subject) {
    let (sid, secret) = ("dddddddddddddddd", "s");
    let one_server = s._redis.is_some();
    let first = claim("first", &format!("{sid}.{secret}.1"), 10_000);
    let f1 = fence(&s, &first).await;
    let created = RecordWrite {
        ttl: Duration::from_secs(60),
        ..record(sid, secret, "A", &[("first", line(1, f1))])
    };
    assert_eq!(write(&s, created).await, Recorded::Written);
    let listing = |name, grant| Listing {
        session_id: sid,
        secret,
        name,
        grant,
    };
    let acquire = |claim: Claim, listing: Listing<'static>| {
        let store = s.store.clone();
        async move {
            match store
                .acquire_listed(&claim, listing)
                .await
                .expect("acquire")
            {
                (Acquired::Granted { fence }, listed) => (fence, listed),
                other => panic!("{}: {other:?}", claim.key),
            }
        }
    };
    let other = claim("other", &format!("{sid}.x.2"), 10_000);
    let (_, listed) = acquire(
        other,
        Listing {
            secret: "x",
            ..listing("other", 2)
        },
    )
    .await;
    assert!(!listed, "listed in another secret's record");
    let long = claim("long", &format!("{sid}.{secret}.3"), 30_000);
    let (_, listed) = acquire(long, listing("long", 3)).await;
    assert!(
        !listed,
        "listed in a record that does not live three of its TTL"
    );
    let second = claim("second", &format!("{sid}.{secret}.4"), 10_000);
    let (f4, listed) = acquire(second, listing("second", 4)).await;
    assert_eq!(listed, one_server, "listed as granted");
    if !listed {
        let journal = RecordWrite {
            listed: true,
            ttl: Duration::from_secs(60),
            ..record(sid, secret, "A", &[("second", line(4, f4))])
        };
        assert_eq!(write(&s, journal).await, Recorded::Written);
    }
    let late = RecordWrite {
        listed: true,
        remove: vec![("second".into(), 2), ("first".into(), 1)],
        ttl: Duration::from_secs(60),
        ..record(sid, secret, "A", &[])
    };
    assert_eq!(write(&s, late).await, Recorded::Written);
    let resumed = s.store.resume(&resume_claim(sid, secret, "t", "B")).await;
    let Resumption::Claimed(locks) = resumed.expect("answer") else {
        panic!("not resumed");
    };
    let names: Vec<&str> = locks.iter().map(|l| l.key.as_str()).collect();
    assert_eq!(
        names,
        ["second"],
        "the earlier grant's removal left the later line"
    );
    assert_eq!(locks[0].line, line(4, f4));
    assert!(locks[0].held.is_some(), "resumed");
}

/// Issue 25: a resumed session's record stays spent. A sidecar the session left (frozen,
/// then woken) writes under the old secret: whether the record ended or its last line
/// went, that write is refused (not told the record is missing, which would make it
/// write the record again), and nothing resumes a record that ended.
async fn a_resumed_sessions_record_stays_spent(s: Subject) {
    let (ended, emptied) = ("dddddddddddddddd", "eeeeeeeeeeeeeeee");
    let spent = |w: RecordWrite| RecordWrite { spent: true, ..w };
    let zombie = |sid: &str| RecordWrite {
        listed: true,
        ..record(sid, "old", "A", &[("k", line(1, 1))])
    };
    for sid in [ended, emptied] {
        let w = spent(record(sid, "new", "B", &[("k", line(1, 1))]));
        assert_eq!(write(&s, w).await, Recorded::Written);
    }
    let end = spent(RecordWrite {
        end: true,
        ..record(ended, "new", "B", &[])
    });
    assert_eq!(write(&s, end).await, Recorded::Written);
    let last_line = spent(RecordWrite {
        remove: vec![("k".into(), u64::MAX)],
        ..record(emptied, "new", "B", &[])
    });
    assert_eq!(write(&s, last_line).await, Recorded::Written);
    for sid in [ended, emptied] {
        // The woken sidecar's extension, then its rewrite of every line.
        assert_eq!(write(&s, zombie(sid)).await, Recorded::Foreign, "{sid}");
        let rewrite = RecordWrite {
            listed: false,
            ..zombie(sid)
        };
        assert_eq!(write(&s, rewrite).await, Recorded::Foreign, "{sid}");
        let resumed = s.store.resume(&resume_claim(sid, "old", "x", "C")).await;
        assert_eq!(resumed.expect("answer"), UNKNOWN, "{sid}");
    }
    let reopened = s.store.resume(&resume_claim(ended, "new", "x", "C")).await;
    assert_eq!(reopened.expect("answer"), UNKNOWN, "an ended session");
    // The session whose last lock went goes on: its next lock is recorded.
    let next = spent(record(emptied, "new", "B", &[("k2", line(2, 2))]));
    assert_eq!(write(&s, next).await, Recorded::Written);
}

/// The store's own check (issue 26) finds every command Lockside needs allowed, on
/// each topology (the Cluster's shard channels and `CLUSTER SLOTS` included) and for
/// the least-privilege user, and no eviction policy that may drop a lock.
async fn the_store_allows_what_lockside_needs_and_does_not_evict(s: Subject) {
    let found = s.store.check().await.expect("a check");
    assert_eq!(found, StoreCheck::default());
}

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(#[tokio::test] async fn $name() { super::$name(super::subject("memory").await).await; })*
        }
        mod redis {
            $(#[tokio::test] async fn $name() { super::$name(super::subject("redis").await).await; })*
        }
        mod least_privilege {
            $(#[tokio::test] async fn $name() { super::$name(super::subject("least_privilege").await).await; })*
        }
        mod cluster {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
              async fn $name() { super::$name(super::subject("cluster").await).await; })*
        }
    };
}

conformance!(
    grants_then_busy,
    release_frees_and_fences_increase,
    only_the_owner_releases,
    released_grants_answer_as_releases,
    released_grants_notify_only_when_someone_waits,
    holds_are_counted,
    holds_and_releases_are_idempotent,
    grants_expire_and_fences_survive,
    renewals_extend_only_held_grants,
    renewals_match_the_whole_holder,
    large_batches_keep_their_order,
    releases_notify_only_when_someone_waits,
    unwait_and_expiry_remove_waiters,
    describe_shows_holders_but_no_secrets,
    keys_are_opaque,
    pings,
    readers_share_and_exclude_writers,
    semaphores_admit_up_to_their_limit,
    fair_waiters_go_in_arrival_order,
    fair_readers_go_together_until_a_writer,
    a_dead_fair_waiter_leaves_the_queue_at_its_expiry,
    lock_delay_keeps_an_abandoned_lock_free_of_holders,
    unwait_leaves_the_fair_queue,
    only_grants_that_leave_room_pass_the_wake_on,
    sessions_resume_with_their_secret_only,
    a_resumed_sessions_record_stays_spent,
    records_follow_their_locks,
    grants_are_listed_as_they_are_granted_where_the_store_can,
    the_store_allows_what_lockside_needs_and_does_not_evict,
);

/// Holder values, proclaim and the notices watchers rely on (issue 14), on every store.
macro_rules! election_conformance {
    ($($name:ident),* $(,)?) => {
        mod election {
            mod memory {
                $(#[tokio::test] async fn $name() { super::super::$name(super::super::subject("memory").await).await; })*
            }
            mod redis {
                $(#[tokio::test] async fn $name() { super::super::$name(super::super::subject("redis").await).await; })*
            }
            mod least_privilege {
                $(#[tokio::test] async fn $name() { super::super::$name(super::super::subject("least_privilege").await).await; })*
            }
            mod cluster {
                $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                  async fn $name() { super::super::$name(super::super::subject("cluster").await).await; })*
            }
            mod redlock {
                $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                  async fn $name() { super::super::$name(super::super::subject("redlock").await).await; })*
            }
        }
    };
}

election_conformance!(
    values_are_kept_proclaimed_and_shown,
    shared_holders_have_their_own_values,
    watched_keys_announce_their_changes_and_others_nothing,
);

/// Redlock runs the checks that fit it: it refuses semaphores and fair queues, and each
/// master sends its own copy of a release notice.
macro_rules! on_redlock {
    ($($name:ident),* $(,)?) => {
        mod redlock {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
              async fn $name() { super::$name(super::subject("redlock").await).await; })*
        }
    };
}

on_redlock!(
    grants_then_busy,
    release_frees_and_fences_increase,
    only_the_owner_releases,
    released_grants_answer_as_releases,
    holds_are_counted,
    holds_and_releases_are_idempotent,
    grants_expire_and_fences_survive,
    renewals_extend_only_held_grants,
    renewals_match_the_whole_holder,
    describe_shows_holders_but_no_secrets,
    keys_are_opaque,
    pings,
    readers_share_and_exclude_writers,
    lock_delay_keeps_an_abandoned_lock_free_of_holders,
    the_store_allows_what_lockside_needs_and_does_not_evict,
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
    // The broken connection is replaced without restarting anything; the new one finds
    // that the store lost its data, so it answers busy until the hold-off has passed
    // (`fault_store_restart.rs`).
    let mut answer = None;
    for _ in 0..20 {
        if let Ok(answered) = store.acquire(&claim("k", "a", 10_000)).await {
            answer = Some(answered);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let answer = answer.expect("the store answers again once Redis is back");
    assert!(
        matches!(answer, Acquired::Busy { .. }),
        "held off: {answer:?}"
    );
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
        store.release("k", "a", 0, NO_DELAY).await.expect("answer"),
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

#[tokio::test]
async fn redis_with_a_password_needs_it_in_the_url() {
    let redis = Redis::start_with_password(Some("pa55word"));
    let with = make_store(
        &StoreKind::Redis(format!("redis://:pa55word@127.0.0.1:{}", redis.port)),
        &namespace(),
    );
    assert!(matches!(
        with.acquire(&claim("k", "a", 10_000)).await,
        Ok(Acquired::Granted { .. })
    ));
    let without = make_store(&StoreKind::Redis(redis.url()), &namespace());
    let err = without
        .acquire(&claim("k", "b", 10_000))
        .await
        .expect_err("NOAUTH");
    assert!(!err.to_string().contains("pa55word"));
}
