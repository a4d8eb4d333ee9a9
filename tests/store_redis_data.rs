//! The Redis data model (`src/store/lua/common.lua`) as an operator sees it: nothing is
//! left behind once a lock is released and its TTL has passed, fencing tokens keep
//! increasing when a key's state is gone (expired, or Redis restarted empty), and a lock
//! of the previous data model (a sidecar not yet upgraded) is respected, never granted
//! over; a session's record and its sidecar's attachment carry expiries and keep no
//! secret. Counts and keys, read with `redis-cli`, not timings.

mod common;

use std::time::Duration;

use common::{Redis, namespace};
use lockside::store::redis::RedisStore;
use lockside::store::{Acquired, Claim, Sharing, Store};

fn claim(key: &str, owner: &str, ttl: Duration) -> Claim {
    Claim {
        key: key.into(),
        owner: format!("sid{owner}.secret.1"),
        ttl,
        wait: false,
        session_id: format!("sid{owner}"),
        client_name: String::new(),
        holder: String::new(),
        sharing: Sharing::Exclusive,
        limit: 1,
        fair: false,
        value: Vec::new(),
        ticket: None,
    }
}

async fn granted(store: &RedisStore, c: &Claim) -> u64 {
    match store.acquire(c).await.expect("redis answers") {
        Acquired::Granted { fence } => fence,
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// Every key of namespace `ns`, with its time to live in ms (-1: none). A key that
/// expired between the scan and its PTTL (-2; one redis-cli per key is slow on a loaded
/// machine) is not listed: it is gone.
/// The store's epoch marker is not listed: the one key a namespace keeps for good
/// (`a_namespace_keeps_one_epoch_marker`).
fn keys_of(redis: &Redis, ns: &str) -> Vec<(String, i64)> {
    let listed = redis.cli(&["--scan", "--pattern", &format!("{{{ns}:*")]);
    let marker = format!("{{{ns}:epoch}}:e");
    listed
        .lines()
        .filter(|k| !k.is_empty() && *k != marker)
        .map(|k| {
            let ttl = redis.cli(&["PTTL", k]).parse().expect("a number");
            (k.to_owned(), ttl)
        })
        .filter(|(_, ttl)| *ttl != -2)
        .collect()
}

/// Issue 13: once released and past its TTL, a lock leaves nothing. Checked without
/// waiting for the TTL: every key a released or expired lock keeps carries an expiry
/// within its TTL (v1 kept a token counter per key forever).
#[tokio::test]
async fn nothing_is_kept_beyond_a_locks_ttl() {
    let redis = Redis::start();
    let ns = namespace();
    let store = RedisStore::new(&redis.url(), &ns, Duration::from_secs(1)).expect("store");
    let ttl = Duration::from_secs(5);
    for i in 0..200 {
        let c = claim(&format!("order-{i}"), "a", ttl);
        granted(&store, &c).await;
        if i % 2 == 0 {
            // Released; the odd ones are left to expire, as after a sidecar's death.
            let left = store
                .release(&c.key, &c.owner, 0, Duration::ZERO)
                .await
                .expect("redis answers");
            assert_eq!(left, Some(0));
        }
    }
    let kept = keys_of(&redis, &ns);
    assert!(
        kept.len() <= 200,
        "at most one key per lock: {}",
        kept.len()
    );
    for (key, pttl) in &kept {
        assert!(
            *pttl > 0 && *pttl <= ttl.as_millis() as i64,
            "{key} lives {pttl} ms, beyond the lock's TTL"
        );
    }
    // And they do go: shorten what is left (as the TTL passing would) and look again.
    for (key, _) in &kept {
        redis.cli(&["PEXPIRE", key, "1"]);
    }
    let deadline = std::time::Instant::now() + common::PATIENCE;
    while !keys_of(&redis, &ns).is_empty() {
        assert!(std::time::Instant::now() < deadline, "keys were left");
        // Redis expires keys lazily on access (the scan) and actively every 100 ms.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A held exclusive lock is one key (v1 used three, one of them kept forever).
#[tokio::test]
async fn a_held_lock_is_one_key() {
    let redis = Redis::start();
    let ns = namespace();
    let store = RedisStore::new(&redis.url(), &ns, Duration::from_secs(1)).expect("store");
    for i in 0..50 {
        granted(
            &store,
            &claim(&format!("k{i}"), "a", Duration::from_secs(30)),
        )
        .await;
    }
    assert_eq!(keys_of(&redis, &ns).len(), 50);
}

/// Holders inside a session cost the common case nothing: an exclusive lock held by
/// the session itself (holder "") is the string it always was, `x|count|fence|owner|
/// name length|name`; a named holder adds NUL and its name after the client's, in the
/// same one key, and `Describe` reads both back.
#[tokio::test]
async fn a_holder_is_kept_in_the_locks_own_string() {
    let redis = Redis::start();
    let ns = namespace();
    let store = RedisStore::new(&redis.url(), &ns, Duration::from_secs(1)).expect("store");
    let mut session = claim("k", "a", Duration::from_secs(30));
    session.client_name = "web".into();
    let fence = granted(&store, &session).await;
    let value = redis.cli(&["GET", &format!("{{{ns}:k}}:h")]);
    assert_eq!(value, format!("x|1|{fence}|sida.secret.1|3|web"));
    let mut thread = claim("t", "a", Duration::from_secs(30));
    thread.client_name = "web".into();
    thread.holder = "thread-7".into();
    let fence = granted(&store, &thread).await;
    let raw = redis.cli(&["--no-raw", "GET", &format!("{{{ns}:t}}:h")]);
    assert_eq!(
        raw,
        format!("\"x|1|{fence}|sida.secret.1|12|web\\x00thread-7\"")
    );
    let holder = &store.describe("t").await.expect("describe").holders[0];
    assert_eq!(
        (holder.client_name.as_str(), holder.holder.as_str()),
        ("web", "thread-7")
    );
    assert_eq!(
        keys_of(&redis, &ns).len(),
        2,
        "one key a lock, whoever holds it"
    );
}

/// Tokens keep increasing once a key's state is gone: after its keys expired (faked by
/// shortening their TTL, as TESTING.md advises) and after Redis restarted empty. They
/// rest on the store's clock (`max(last + 1, TIME ms × 1024)`).
#[tokio::test]
async fn tokens_increase_after_the_state_is_gone() {
    let mut redis = Redis::start();
    let ns = namespace();
    // After the restart, no new grant for a second (`fault_store_restart.rs`).
    let options = lockside::store::redis::RedisOptions {
        restart_hold_off: Duration::from_secs(1),
        ..Default::default()
    };
    let store = RedisStore::with_options(&redis.url(), &ns, &options).expect("store");
    let ttl = Duration::from_secs(30);
    let c = claim("k", "a", ttl);
    let first = granted(&store, &c).await;
    // Expired without a release (the holder's sidecar died).
    for (key, _) in keys_of(&redis, &ns) {
        redis.cli(&["PEXPIRE", &key, "1"]);
    }
    let deadline = std::time::Instant::now() + common::PATIENCE;
    while !keys_of(&redis, &ns).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the lock did not expire"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let second = granted(&store, &claim("k", "b", ttl)).await;
    assert!(second > first, "after expiry: {second} <= {first}");
    // Redis restarted with an empty dataset.
    redis.restart();
    let mut held_off = false;
    let third = loop {
        match store.acquire(&claim("k", "c", ttl)).await {
            Ok(Acquired::Granted { fence }) => break fence,
            Ok(Acquired::Busy { expires_in, .. }) => {
                held_off = true;
                tokio::time::sleep(expires_in).await;
            }
            Ok(other) => panic!("a restarted Redis holds nothing: {other:?}"),
            // The store reconnects on its next call.
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    assert!(held_off, "no new grant right after the store lost its data");
    assert!(third > second, "after a restart: {third} <= {second}");
}

/// The store's epoch marker (`store/redis/restarts/`): the one key a namespace keeps
/// without an expiry, written at the first connection, `epoch|hold-off end|known|
/// tenure|witness`, the tenure being the server's `run_id:master_replid`; it is how
/// every sidecar tells a server that lost its data, or may have.
#[tokio::test]
async fn a_namespace_keeps_one_epoch_marker() {
    let redis = Redis::start();
    let ns = namespace();
    let store = RedisStore::new(&redis.url(), &ns, Duration::from_secs(1)).expect("store");
    granted(&store, &claim("k", "a", Duration::from_secs(5))).await;
    let marker = format!("{{{ns}:epoch}}:e");
    assert_eq!(redis.cli(&["PTTL", &marker]), "-1", "kept for good");
    let value = redis.cli(&["GET", &marker]);
    let parts: Vec<&str> = value.split('|').collect();
    assert_eq!(parts.len(), 5, "{value}");
    assert_eq!(
        &parts[1..3],
        ["0", "0"],
        "no hold-off on a first start: {value}"
    );
    let info = |section: &str, field: &str| {
        let text = redis.cli(&["INFO", section]);
        let line = text.lines().find_map(|l| l.strip_prefix(field));
        line.expect("the field").trim().to_owned()
    };
    let tenure = format!(
        "{}:{}",
        info("server", "run_id:"),
        info("replication", "master_replid:")
    );
    assert_eq!(parts[3], tenure, "the server's tenure: {value}");
}

/// A rolling upgrade: a lock held by a sidecar of the previous data model (a sorted set
/// of holders at `{ns:KEY}:h`) reads as busy until it expires; the upgraded sidecar
/// never grants it, and says when to look again (its expiry).
#[tokio::test]
async fn a_lock_of_the_previous_data_model_is_busy() {
    let redis = Redis::start();
    let ns = namespace();
    let store = RedisStore::new(&redis.url(), &ns, Duration::from_secs(1)).expect("store");
    let old = format!("{{{ns}:k}}:h");
    redis.cli(&["ZADD", &old, "99999999999999", "old-owner.7"]);
    redis.cli(&["PEXPIRE", &old, "20000"]);
    match store
        .acquire(&claim("k", "a", Duration::from_secs(10)))
        .await
        .expect("redis answers")
    {
        Acquired::Busy { expires_in, .. } => {
            assert!(expires_in <= Duration::from_secs(20), "{expires_in:?}");
            assert!(expires_in > Duration::from_secs(15), "{expires_in:?}");
        }
        other => panic!("an old lock must read as busy: {other:?}"),
    }
    let state = store.describe("k").await.expect("redis answers");
    assert_eq!(state.holders.len(), 1, "shown as held: {state:?}");
    let c = claim("k", "a", Duration::from_secs(10));
    assert_eq!(
        store
            .release(&c.key, &c.owner, 0, Duration::ZERO)
            .await
            .expect("redis answers"),
        None
    );
    assert_eq!(
        redis.cli(&["TYPE", &old]),
        "zset",
        "the old lock is untouched"
    );
}

/// A holder's value (leader election) lives in the lock's one key and changes with
/// `proclaim`; a watching sidecar registers in the key's watcher set, with an expiry,
/// and hears every change while it watches.
#[tokio::test]
async fn values_proclaims_and_watch_registrations() {
    use lockside::store::Notice;
    let redis = Redis::start();
    let ns = namespace();
    let store = RedisStore::new(&redis.url(), &ns, Duration::from_secs(1)).expect("store");
    let mut notices = store.notices();
    store.listen("k", true).await.expect("listen");
    let watchers = format!("{{{ns}:k}}:l");
    let pttl: i64 = redis.cli(&["PTTL", &watchers]).parse().expect("a number");
    assert!(
        pttl > 0 && pttl <= 60_000,
        "a registration that expires: {pttl}"
    );

    let mut c = claim("k", "a", Duration::from_secs(10));
    c.client_name = "name|with|bars".into();
    c.value = b"10.0.0.1:8080|\x00binary".to_vec();
    granted(&store, &c).await;
    let changed = Notice::Changed { key: "k".into() };
    let mut seen = Vec::new();
    while seen.is_empty() {
        match tokio::time::timeout(common::PATIENCE, notices.recv()).await {
            Ok(Ok(Notice::Resync)) => {}
            Ok(Ok(notice)) => seen.push(notice),
            other => panic!("no notice of the grant: {other:?}"),
        }
    }
    assert_eq!(seen[0], changed, "a grant is announced to watchers");
    let holder = store.describe("k").await.expect("describe").holders[0].clone();
    assert_eq!(holder.value, c.value);
    assert_eq!(holder.client_name, "name|with|bars");

    assert!(
        store
            .proclaim("k", &c.owner, b"v2")
            .await
            .expect("proclaim")
    );
    assert!(
        !store
            .proclaim("k", "sidb.secret.1", b"x")
            .await
            .expect("proclaim")
    );
    let state = store.describe("k").await.expect("describe");
    assert_eq!(state.holders[0].value, b"v2");
    assert_eq!(state.holders[0].client_name, "name|with|bars");

    store.unlisten("k", true);
    let deadline = std::time::Instant::now() + common::PATIENCE;
    while redis.cli(&["EXISTS", &watchers]) != "0" {
        assert!(
            std::time::Instant::now() < deadline,
            "the registration stayed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Issue 15: a session holding a lock has a record (the hash of its secret, never the
/// secret; its sidecar; a line per lock) that lives twice the lock's TTL, and its
/// sidecar an attachment of 3 s; both carry expiries, and the record goes with the
/// session. A session that never holds a lock, and an idle sidecar, write nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_record_and_its_sidecar_attachment() {
    use common::{Sidecar, StoreKind, acquire, make_store, secs};
    use lockside::proto;
    let redis = Redis::start();
    let ns = namespace();
    let sidecar = Sidecar::start(make_store(&StoreKind::Redis(redis.url()), &ns)).await;
    let client = sidecar.client().await;
    let idle = client.lease().await;
    let mut app = client.lease().await;
    let id = app
        .send_acquire(proto::Acquire {
            ttl: Some(secs(4.0)),
            ..acquire("orders")
        })
        .await;
    let g = app.expect_granted(id).await;
    let record = format!("{{{ns}:session/{}}}:s", app.session_id);
    let deadline = std::time::Instant::now() + common::PATIENCE;
    while redis.cli(&["exists", &record]) != "1" {
        assert!(
            std::time::Instant::now() < deadline,
            "the record is written"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let kept = keys_of(&redis, &ns);
    let names: Vec<&str> = kept.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names.len(),
        3,
        "the lock, the record, the attachment: {names:?}"
    );
    for (key, pttl) in &kept {
        // The record: 30 s (or three TTLs) after the sidecar's death, plus the TTL
        // between its extensions; the attachment: two fifths of the shortest TTL.
        let most = if key == &record {
            34_000
        } else if key.ends_with(":a") {
            1_600
        } else {
            4_000
        };
        assert!(*pttl > 0 && *pttl <= most, "{key} lives {pttl} ms");
    }
    let fields = redis.cli(&["hgetall", &record]);
    let (_, secret) = app.resume_token.split_once('.').expect("id.secret");
    assert!(!fields.contains(secret), "the secret is not kept: {fields}");
    let line = redis.cli(&["hget", &record, "k:orders"]);
    assert!(
        line.ends_with(&format!("|4000|{}", g.fencing_token)),
        "{line}"
    );
    assert!(
        !redis.cli(&["hget", &record, "t"]).is_empty(),
        "the secret's hash"
    );
    // The session ends: its lock is released and its record goes at once; what is
    // left expires (the released lock's last token, the attachment within 3 s).
    drop(app);
    drop(idle);
    let deadline = std::time::Instant::now() + common::PATIENCE;
    while redis.cli(&["exists", &record]) != "0" {
        assert!(std::time::Instant::now() < deadline, "the record goes");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let lock = format!("{{{ns}:orders}}:h");
    assert!(redis.cli(&["get", &lock]).starts_with("f|"), "released");
    for (key, pttl) in keys_of(&redis, &ns) {
        assert!(key == lock || key.ends_with(":a"), "{key} was left");
        assert!(pttl > 0 && pttl <= 4_000, "{key} lives {pttl} ms");
    }
}

/// A key's raw state: its content (a string's value, a hash's fields, else its type) and
/// its expiry (PEXPIRETIME: -2 no key, -1 none), to the millisecond.
fn raw(redis: &Redis, key: &str) -> (String, String) {
    let content = match redis.cli(&["TYPE", key]).as_str() {
        "string" => redis.cli(&["GET", key]),
        "hash" => redis.cli(&["HGETALL", key]),
        other => other.to_owned(),
    };
    (content, redis.cli(&["PEXPIRETIME", key]))
}

/// A release that names a grant's token writes the released state first and checks the
/// grant afterwards (one command fewer, `release.lua`). Whenever it was not the
/// caller's grant, the lock is left exactly as it was, value and expiry to the
/// millisecond: another holder's grant, a kept token, a lock-delay, a shared lock; and a
/// key that did not exist is not created (it would have no TTL: left forever).
#[tokio::test]
async fn a_release_of_a_grant_not_held_leaves_the_lock_as_it_was() {
    let redis = Redis::start();
    let ns = namespace();
    let store = RedisStore::new(&redis.url(), &ns, Duration::from_secs(1)).expect("store");
    let ttl = Duration::from_secs(30);
    let h = |key: &str| format!("{{{ns}:{key}}}:h");
    let unchanged = async |key: &str, owner: &str, fence: u64| {
        let before = raw(&redis, &h(key));
        let answer = store
            .release_grant(key, owner, fence, Duration::ZERO)
            .await
            .expect("redis answers");
        assert_eq!(answer, None, "{owner} does not hold {key}");
        assert_eq!(raw(&redis, &h(key)), before, "{key} changed");
    };

    // Another holder's grant, whatever token is named.
    let mut a = claim("k", "a", ttl);
    a.value = b"the holder's value".to_vec();
    let first = granted(&store, &a).await;
    for named in [first, first + 1, 7] {
        unchanged("k", "sidb.secret.1", named).await;
    }
    // A kept token, released again (a retry) or by another.
    let answer = store
        .release_grant("k", &a.owner, first, Duration::ZERO)
        .await;
    assert_eq!(answer.expect("redis answers"), Some(0));
    assert_eq!(raw(&redis, &h("k")).0, format!("f|{first}|0"));
    unchanged("k", &a.owner, first).await;
    unchanged("k", "sidb.secret.1", first).await;
    // A running lock-delay.
    let d = claim("d", "a", ttl);
    let token = granted(&store, &d).await;
    let answer = store
        .release(&d.key, &d.owner, 0, Duration::from_secs(60))
        .await;
    assert_eq!(answer.expect("redis answers"), Some(0));
    unchanged("d", &d.owner, token).await;
    // A shared lock (a hash), then released by its holder.
    let mut s = claim("s", "a", ttl);
    s.sharing = lockside::store::Sharing::Shared;
    let token = granted(&store, &s).await;
    unchanged("s", "sidb.secret.1", token).await;
    let answer = store
        .release_grant("s", &s.owner, token, Duration::ZERO)
        .await;
    assert_eq!(answer.expect("redis answers"), Some(0));
    // No key at all.
    unchanged("none", &a.owner, first).await;
    assert_eq!(redis.cli(&["EXISTS", &h("none")]), "0");
}

/// The holder's release naming a token other than the one its lock keeps (a Redlock
/// master that made a larger one) keeps the lock's own token, never the one named.
#[tokio::test]
async fn a_release_naming_another_token_keeps_the_locks_own() {
    let redis = Redis::start();
    let ns = namespace();
    let store = RedisStore::new(&redis.url(), &ns, Duration::from_secs(1)).expect("store");
    for (key, named_after) in [("lower", false), ("higher", true)] {
        let c = claim(key, "a", Duration::from_secs(30));
        let token = granted(&store, &c).await;
        let named = if named_after { token + 1 } else { token - 1 };
        let answer = store
            .release_grant(key, &c.owner, named, Duration::ZERO)
            .await;
        assert_eq!(answer.expect("redis answers"), Some(0));
        let (content, _) = raw(&redis, &format!("{{{ns}:{key}}}:h"));
        assert_eq!(content, format!("f|{token}|0"), "named {named}");
    }
}

/// The grant over a kept token that is ahead of the clock (a Redlock write-back, a
/// clock that went back) goes beyond it and carries its own TTL; a claim on a held lock
/// leaves the holder's key exactly as it was.
#[tokio::test]
async fn grants_go_beyond_a_kept_token_and_never_touch_a_held_lock() {
    let redis = Redis::start();
    let ns = namespace();
    let store = RedisStore::new(&redis.url(), &ns, Duration::from_secs(1)).expect("store");
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64;
    // Ten minutes ahead of the clock: kept for ten minutes.
    let ahead = (now_ms + 600_000) * 1024;
    store.raise_fence("k", ahead).await.expect("redis answers");
    let ttl = Duration::from_secs(30);
    let token = granted(&store, &claim("k", "a", ttl)).await;
    assert_eq!(token, ahead + 1);
    let h = format!("{{{ns}:k}}:h");
    let pttl: i64 = redis.cli(&["PTTL", &h]).parse().expect("a number");
    assert!(pttl > 0 && pttl <= 30_000, "the grant's TTL: {pttl}");

    let before = raw(&redis, &h);
    let busy = store.acquire(&claim("k", "b", ttl)).await;
    assert!(matches!(
        busy.expect("redis answers"),
        Acquired::Busy { .. }
    ));
    assert_eq!(raw(&redis, &h), before);
}
