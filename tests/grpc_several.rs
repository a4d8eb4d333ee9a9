//! Several keys at once (`AcquireAll`) through real gRPC: every key or none (and
//! nothing left in the store), a lock of its own per key after, a key held already held
//! once more, a `Release` that cancels a waiting request, bad requests rejected, fair
//! requests never overtaken, and no deadlock among philosophers asking for overlapping
//! sets in any order, on the memory store, Redis, Sentinel, a Cluster (keys on every
//! master) and Redlock.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::records::{record_key, record_lines};
use common::topology::{ClusterSetup, SentinelSetup};
use common::{
    Client, LeaseStream, Redis, Setup, Sidecar, acquire, acquire_all, namespace, secs, waiting_for,
};
use lockside::proto::{self, not_acquired::Reason};
use lockside::store::Store;
use lockside::store::redis::{RedisOptions, RedisStore};
use lockside::store::redlock::RedlockStore;
use tonic::Code;

fn waiting_all(keys: &[&str], seconds: f64) -> proto::AcquireAll {
    proto::AcquireAll {
        wait_timeout: Some(secs(seconds)),
        ..acquire_all(keys)
    }
}

fn fair(a: proto::AcquireAll) -> proto::AcquireAll {
    proto::AcquireAll { fair: true, ..a }
}

async fn granted_all(lease: &mut LeaseStream, a: proto::AcquireAll) -> proto::GrantedAll {
    let id = lease.send_acquire_all(a).await;
    lease.granted_all_after_wait(id).await
}

/// Nobody holds `key` and nobody waits for it.
async fn untouched(client: &Client, key: &str) {
    let d = client.describe(key).await;
    assert!(d.holders.is_empty(), "{key} held: {d:?}");
    assert_eq!(
        (d.waiters, d.queue.len()),
        (0, 0),
        "{key} waited for: {d:?}"
    );
}

async fn all_or_none_and_nothing_left_behind(s: Setup) {
    let mut other = s.client.lease().await;
    let mut app = s.client.lease().await;
    let held = other.grant("b").await;
    // Not waiting: busy, nothing held.
    let id = app.send_acquire_all(acquire_all(&["a", "b", "c"])).await;
    assert_eq!(
        app.not_acquired_after_wait(id).await,
        ("b".to_owned(), Reason::Busy as i32)
    );
    untouched(&s.client, "a").await;
    untouched(&s.client, "c").await;
    // Waiting, fair or not, until the timeout: nothing held, no registration left.
    for ask in [
        waiting_all(&["a", "b"], 0.3),
        fair(waiting_all(&["b", "a"], 0.3)),
    ] {
        let id = app.send_acquire_all(ask).await;
        assert_eq!(
            app.not_acquired_after_wait(id).await,
            ("b".to_owned(), Reason::Timeout as i32)
        );
        untouched(&s.client, "a").await;
        let d = s.client.describe("b").await;
        assert_eq!(
            (d.waiters, d.queue.len(), d.holders.len()),
            (0, 0, 1),
            "{d:?}"
        );
    }
    assert_eq!(other.release("b").await, 0);
    // Free: every key, each a lock of its own, in the order asked.
    let all = granted_all(&mut app, acquire_all(&["c", "b", "a"])).await;
    let keys: Vec<&str> = all.grants.iter().map(|g| g.key.as_str()).collect();
    assert_eq!(keys, ["c", "b", "a"]);
    for g in &all.grants {
        assert_eq!((g.hold_count, g.request_id), (1, all.request_id), "{g:?}");
        assert!(g.ttl.is_some(), "{g:?}");
    }
    assert!(
        all.grants[1].fencing_token > held.fencing_token,
        "b's token grows"
    );
    let d = s.client.describe("a").await;
    assert_eq!(d.holders[0].session_id, app.session_id);
    assert_eq!(d.holders[0].fencing_token, all.grants[2].fencing_token);
    assert_eq!(app.release("b").await, 0);
    let again = other.grant("b").await;
    assert!(again.fencing_token > all.grants[1].fencing_token);
    assert_eq!(app.release("a").await, 0);
    assert_eq!(app.release("c").await, 0);
    untouched(&s.client, "a").await;
}

async fn a_key_held_already_is_held_once_more(s: Setup) {
    let mut app = s.client.lease().await;
    let first = app.grant("a").await;
    let all = granted_all(&mut app, acquire_all(&["b", "a"])).await;
    assert_eq!(all.grants[1].key, "a");
    assert_eq!(all.grants[1].hold_count, 2);
    assert_eq!(all.grants[1].fencing_token, first.fencing_token);
    assert_eq!(s.client.describe("a").await.holders[0].hold_count, 2);
    assert_eq!(app.release("a").await, 1);
    assert_eq!(app.release("a").await, 0);
    assert_eq!(app.release("b").await, 0);
    // Held SHARED, asked EXCLUSIVE: no upgrade, nothing taken.
    let id = app
        .send_acquire(proto::Acquire {
            mode: proto::LockMode::Shared as i32,
            ..acquire("r")
        })
        .await;
    app.expect_granted(id).await;
    let id = app.send_acquire_all(acquire_all(&["q", "r"])).await;
    let r = app.expect_rejected(id).await;
    assert_eq!(
        (r.code, r.key.as_str()),
        (Code::FailedPrecondition as i32, "r")
    );
    untouched(&s.client, "q").await;
    // Asked right behind a Release of one of its keys (not waiting for the Released,
    // as a client whose release does not wait sends them): it waits its turn, as a
    // single Acquire does, and is granted once the release is through.
    let first = app.grant("a").await;
    let release = app.send_release("a").await;
    let id = app.send_acquire_all(acquire_all(&["a", "b"])).await;
    assert_eq!(app.expect_released(release).await, 0);
    let all = app.granted_all_after_wait(id).await;
    assert_eq!(all.grants[0].hold_count, 1, "a new grant of a");
    assert!(all.grants[0].fencing_token > first.fencing_token);
    assert_eq!(app.release("a").await, 0);
    assert_eq!(app.release("b").await, 0);
}

async fn a_release_of_one_key_cancels_a_waiting_request(s: Setup) {
    let mut other = s.client.lease().await;
    let mut app = s.client.lease().await;
    other.grant("b").await;
    let id = app.send_acquire_all(waiting_all(&["a", "b"], 30.0)).await;
    app.expect_waiting(id).await;
    app.send_release("a").await;
    assert_eq!(app.expect_not_acquired(id).await, Reason::Cancelled as i32);
    untouched(&s.client, "a").await;
    // A key held before the request: the request ends, then the Release answers.
    app.grant("c").await;
    let id = app.send_acquire_all(waiting_all(&["c", "b"], 30.0)).await;
    app.expect_waiting(id).await;
    let release = app.send_release("c").await;
    assert_eq!(app.expect_not_acquired(id).await, Reason::Cancelled as i32);
    assert_eq!(app.expect_released(release).await, 0);
    untouched(&s.client, "c").await;
    assert_eq!(s.client.describe("b").await.waiters, 0);
}

async fn bad_requests_are_rejected_and_harm_nobody(s: Setup) {
    let mut app = s.client.lease().await;
    let many: Vec<String> = (0..65).map(|i| format!("k{i}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    for (keys, what) in [
        (vec![], "no keys"),
        (vec!["a"], "one key"),
        (vec!["a", "b", "a"], "a duplicate"),
        (many, "65 keys"),
        (vec!["a", ""], "an empty key"),
    ] {
        let id = app.send_acquire_all(acquire_all(&keys)).await;
        let r = app.expect_rejected(id).await;
        assert_eq!(r.code, Code::InvalidArgument as i32, "{what}: {r:?}");
        assert!(!r.message.is_empty(), "{what}");
    }
    // A key held as a semaphore permit: AcquireAll takes locks.
    let mut other = s.client.lease().await;
    let id = other
        .send_acquire(proto::Acquire {
            limit: 3,
            ..acquire("s")
        })
        .await;
    other.expect_granted(id).await;
    let id = app.send_acquire_all(acquire_all(&["a", "s"])).await;
    let r = app.expect_rejected(id).await;
    assert_eq!(
        (r.code, r.key.as_str()),
        (Code::FailedPrecondition as i32, "s")
    );
    untouched(&s.client, "a").await;
    // 64 keys are fine, and the session goes on.
    let most: Vec<String> = (0..64).map(|i| format!("k{i}")).collect();
    let most: Vec<&str> = most.iter().map(String::as_str).collect();
    assert_eq!(
        granted_all(&mut app, acquire_all(&most)).await.grants.len(),
        64
    );
}

async fn a_fair_request_is_not_overtaken(s: Setup) {
    let mut holder = s.client.lease().await;
    let mut all = s.client.lease().await;
    let mut later = s.client.lease().await;
    holder.grant("a").await;
    let id_all = all
        .send_acquire_all(fair(waiting_all(&["a", "b"], 30.0)))
        .await;
    all.expect_waiting(id_all).await;
    // b is free, but the request for a and b came first.
    let id_later = later
        .send_acquire(proto::Acquire {
            fair: true,
            ..waiting_for("b", 30.0)
        })
        .await;
    later.expect_waiting(id_later).await;
    let queue = s.client.describe("b").await.queue;
    let order: Vec<&str> = queue.iter().map(|q| q.session_id.as_str()).collect();
    assert_eq!(order, [all.session_id.as_str(), later.session_id.as_str()]);
    assert_eq!(holder.release("a").await, 0);
    let grants = all.granted_all_after_wait(id_all).await.grants;
    let d = s.client.describe("b").await;
    assert_eq!(d.holders[0].fencing_token, grants[1].fencing_token);
    assert_eq!(all.release("b").await, 0);
    later.granted_after_wait(id_later).await;
    // And one that came before it goes first: the request's holds a, `later` b.
    assert_eq!(later.release("b").await, 0);
    let id_first = later
        .send_acquire(proto::Acquire {
            fair: true,
            ..waiting_for("a", 30.0)
        })
        .await;
    later.expect_waiting(id_first).await;
    let id_all = holder
        .send_acquire_all(fair(waiting_all(&["b", "a"], 30.0)))
        .await;
    holder.expect_waiting(id_all).await;
    assert_eq!(all.release("a").await, 0);
    later.granted_after_wait(id_first).await;
    assert_eq!(later.release("a").await, 0);
    holder.granted_all_after_wait(id_all).await;
}

/// SHARED for every key: readers of overlapping sets hold together, a writer asking for
/// any of their keys is busy and takes nothing, and gets them all once they are free.
async fn readers_of_several_keys_share_them_and_keep_a_writer_out(s: Setup) {
    let shared = |keys: &[&str]| proto::AcquireAll {
        mode: proto::LockMode::Shared as i32,
        ..acquire_all(keys)
    };
    let mut r1 = s.client.lease().await;
    let mut r2 = s.client.lease().await;
    let mut writer = s.client.lease().await;
    granted_all(&mut r1, shared(&["p", "q"])).await;
    granted_all(&mut r2, shared(&["q", "p", "t"])).await;
    let d = s.client.describe("q").await;
    assert_eq!(d.holders.len(), 2, "{d:?}");
    let id = writer.send_acquire_all(acquire_all(&["t", "u"])).await;
    assert_eq!(
        writer.not_acquired_after_wait(id).await,
        ("t".to_owned(), Reason::Busy as i32)
    );
    untouched(&s.client, "u").await;
    for k in ["p", "q"] {
        assert_eq!(r1.release(k).await, 0);
    }
    for k in ["q", "p", "t"] {
        assert_eq!(r2.release(k).await, 0);
    }
    let all = granted_all(&mut writer, acquire_all(&["t", "u", "p"])).await;
    assert_eq!(all.grants.len(), 3);
    for k in ["t", "u", "p"] {
        assert_eq!(writer.release(k).await, 0);
    }
}

crate::for_each_store!(
    all_or_none_and_nothing_left_behind,
    readers_of_several_keys_share_them_and_keep_a_writer_out,
    a_key_held_already_is_held_once_more,
    a_release_of_one_key_cancels_a_waiting_request,
    bad_requests_are_rejected_and_harm_nobody,
    a_fair_request_is_not_overtaken,
);

/// Who holds each fork now, and the last token each was granted with.
struct Table {
    held: Vec<Option<usize>>,
    tokens: Vec<u64>,
    meals: usize,
}

/// Six philosophers, each on its own session (spread over `clients`): five ask for
/// their two forks, odd ones in the other order, and a sixth for three forks around the
/// table; each eats `rounds` times. Any two holders of a fork at once, or a token that
/// does not grow, fails; a deadlock (or a request that never completes) fails by
/// timeout.
async fn philosophers(clients: &[Client], forks: &[String], rounds: usize, fair: bool) {
    let n = forks.len();
    let table = Arc::new(Mutex::new(Table {
        held: vec![None; n],
        tokens: vec![0; n],
        meals: 0,
    }));
    let mut seats: Vec<Vec<usize>> = (0..n)
        .map(|i| match i % 2 {
            0 => vec![i, (i + 1) % n],
            _ => vec![(i + 1) % n, i],
        })
        .collect();
    seats.push(vec![4 % n, 0, 2 % n]);
    let mut eating = Vec::new();
    for (who, seat) in seats.into_iter().enumerate() {
        let client = clients[who % clients.len()].clone();
        let table = table.clone();
        let keys: Vec<String> = seat.iter().map(|&f| forks[f].clone()).collect();
        eating.push(tokio::spawn(async move {
            let mut lease = client.lease().await;
            for _ in 0..rounds {
                let ask = proto::AcquireAll {
                    keys: keys.clone(),
                    wait_timeout: Some(secs(60.0)),
                    fair,
                    ..Default::default()
                };
                let id = lease.send_acquire_all(ask).await;
                let all = lease.granted_all_after_wait(id).await;
                {
                    let mut t = table.lock().expect("table");
                    assert_eq!(all.grants.len(), seat.len());
                    for ((&fork, grant), key) in seat.iter().zip(&all.grants).zip(&keys) {
                        assert_eq!(&grant.key, key, "in the order asked");
                        assert_eq!(t.held[fork], None, "fork {fork} held twice (by {who} too)");
                        assert!(grant.fencing_token > t.tokens[fork], "fork {fork}'s token");
                        t.held[fork] = Some(who);
                        t.tokens[fork] = grant.fencing_token;
                    }
                }
                tokio::task::yield_now().await;
                {
                    let mut t = table.lock().expect("table");
                    for &fork in &seat {
                        t.held[fork] = None;
                    }
                    t.meals += 1;
                }
                for key in &keys {
                    assert_eq!(lease.release(key).await, 0);
                }
            }
        }));
    }
    let started = tokio::time::Instant::now();
    let all = futures_util::future::join_all(eating);
    let done = tokio::time::timeout(Duration::from_secs(90), all).await;
    for ate in done.expect("every philosopher ate (no deadlock)") {
        ate.expect("a philosopher's task");
    }
    let meals = table.lock().expect("table").meals;
    assert_eq!(meals, 6 * rounds);
    eprintln!(
        "{meals} meals (fair {fair}) on {} sidecar(s) in {:?}",
        clients.len(),
        started.elapsed()
    );
}

fn forks(prefix: &str) -> Vec<String> {
    (0..5).map(|i| format!("{prefix}-fork-{i}")).collect()
}

async fn clients_of(stores: Vec<Arc<dyn Store>>) -> (Vec<Sidecar>, Vec<Client>) {
    let mut sidecars = Vec::new();
    let mut clients = Vec::new();
    for store in stores {
        let sidecar = Sidecar::start(store).await;
        clients.push(sidecar.client().await);
        sidecars.push(sidecar);
    }
    (sidecars, clients)
}

fn redis_store(url: &str, ns: &str) -> Arc<dyn Store> {
    let options = RedisOptions {
        timeout: Duration::from_millis(500),
        ..RedisOptions::default()
    };
    Arc::new(RedisStore::with_options(url, ns, &options).expect("store"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn philosophers_eat_on_the_memory_store() {
    let (_sidecars, clients) =
        clients_of(vec![Arc::new(lockside::store::memory::MemoryStore::new())]).await;
    for fair in [false, true] {
        philosophers(&clients, &forks(&format!("fair-{fair}")), 20, fair).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn philosophers_eat_on_redis_across_sidecars() {
    let redis = Redis::start();
    let ns = namespace();
    let stores = vec![
        redis_store(&redis.url(), &ns),
        redis_store(&redis.url(), &ns),
    ];
    let (_sidecars, clients) = clients_of(stores).await;
    for fair in [false, true] {
        philosophers(&clients, &forks(&format!("fair-{fair}")), 15, fair).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn philosophers_eat_on_sentinel() {
    let topology = SentinelSetup::start().await;
    let ns = namespace();
    let stores = vec![
        redis_store(&topology.url(), &ns),
        redis_store(&topology.url(), &ns),
    ];
    let (_sidecars, clients) = clients_of(stores).await;
    philosophers(&clients, &forks("sentinel"), 10, true).await;
}

/// The forks lie on every master of the Cluster: a request's keys are on two or three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn philosophers_eat_on_a_cluster_with_forks_on_every_master() {
    let cluster = ClusterSetup::shared();
    let ns = namespace();
    let stores = vec![
        redis_store(&cluster.url(), &ns),
        redis_store(&cluster.url(), &ns),
    ];
    let (_sidecars, clients) = clients_of(stores).await;
    for fair in [false, true] {
        // Neighbours on different masters: the forks' masters go 0, 1, 2, 0, 1.
        let forks = tokio::task::block_in_place(|| {
            let masters = cluster.masters();
            let mut forks: Vec<(String, u16)> = Vec::new();
            for i in 0.. {
                if forks.len() == 5 {
                    break;
                }
                let key = format!("fair-{fair}-fork-{i}");
                let master = cluster.master_of(&format!("{{{ns}:{key}}}:h"));
                if master == masters[forks.len() % 3] {
                    forks.push((key, master));
                }
            }
            forks
        });
        eprintln!("forks and their masters: {forks:?}");
        let forks: Vec<String> = forks.into_iter().map(|(k, _)| k).collect();
        philosophers(&clients, &forks, 10, fair).await;
    }
}

/// Redlock takes no fair queues (it refuses them, for one key as for several).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn philosophers_eat_on_redlock() {
    let masters: Vec<Redis> = (0..3).map(|_| Redis::start()).collect();
    let hosts: Vec<String> = masters
        .iter()
        .map(|r| format!("127.0.0.1:{}", r.port))
        .collect();
    let url = format!("redlock://{}", hosts.join(","));
    let ns = namespace();
    let store = |_| -> Arc<dyn Store> {
        Arc::new(RedlockStore::new(&url, &ns, Duration::from_secs(1)).expect("redlock"))
    };
    let (_sidecars, clients) = clients_of((0..2).map(store).collect()).await;
    philosophers(&clients, &forks("redlock"), 10, false).await;
    let mut lease = clients[0].lease().await;
    let id = lease.send_acquire_all(fair(acquire_all(&["x", "y"]))).await;
    assert_eq!(
        lease.expect_rejected(id).await.code,
        Code::Unimplemented as i32
    );
}

/// Script calls (`EVALSHA`, `EVAL`) Redis has run so far: every store call of the
/// sidecar is one, and so is each write of a session record.
fn script_calls(redis: &Redis) -> u64 {
    redis
        .cli(&["info", "commandstats"])
        .lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Waits until the session's record lists `locks` grants: its writes are counted too.
async fn recorded(redis: &Redis, ns: &str, sid: &str, locks: usize) {
    let key = record_key(ns, sid);
    let deadline = tokio::time::Instant::now() + common::PATIENCE;
    while record_lines(|args| redis.cli(args), &key) != locks {
        assert!(tokio::time::Instant::now() < deadline, "record of {sid}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What an `AcquireAll` of N keys costs the store, against N single acquires of the
/// same keys (issue 36, item 2), and that a waiting one does not poll: from its first
/// try to its timeout, the store runs only what that first try and its end need.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_all_costs_no_more_store_calls_than_its_single_acquires() {
    const N: usize = 4;
    let redis = Redis::start();
    let ns = namespace();
    let sidecar = Sidecar::start(redis_store(&redis.url(), &ns)).await;
    let client = sidecar.client().await;
    let mut app = client.lease().await;
    let sid = app.session_id.clone();
    let keys: Vec<String> = (0..N).map(|i| format!("account-{i}")).collect();
    let names: Vec<&str> = keys.iter().map(String::as_str).collect();
    // A long TTL: no renewal falls inside the counts.
    let long = |a: proto::AcquireAll| proto::AcquireAll {
        ttl: Some(secs(120.0)),
        ..a
    };
    let release_all = async |app: &mut LeaseStream| {
        for k in &names {
            app.release(k).await;
        }
        recorded(&redis, &ns, &sid, 0).await;
    };
    // Warm: the connection's first calls (scripts loaded, the epoch marker read).
    granted_all(&mut app, long(acquire_all(&names))).await;
    release_all(&mut app).await;

    let before = script_calls(&redis);
    for k in &names {
        let id = app
            .send_acquire(proto::Acquire {
                ttl: Some(secs(120.0)),
                ..acquire(k)
            })
            .await;
        app.expect_granted(id).await;
    }
    recorded(&redis, &ns, &sid, N).await;
    let singles = script_calls(&redis) - before;
    release_all(&mut app).await;
    let before = script_calls(&redis);
    granted_all(&mut app, long(acquire_all(&names))).await;
    recorded(&redis, &ns, &sid, N).await;
    let all = script_calls(&redis) - before;
    eprintln!(
        "script calls, the record's writes included: AcquireAll of {N} keys {all}, {N} single acquires {singles}"
    );
    assert!(all <= singles, "AcquireAll {all} > singles {singles}");
    release_all(&mut app).await;

    // Waiting for a key somebody holds, until the timeout: no polling.
    let mut other = client.lease().await;
    other.grant(names[N - 1]).await;
    let before = script_calls(&redis);
    let id = app.send_acquire_all(long(waiting_all(&names, 1.0))).await;
    assert_eq!(
        app.not_acquired_after_wait(id).await.1,
        Reason::Timeout as i32
    );
    let waited = script_calls(&redis) - before;
    let before = script_calls(&redis);
    let id = app.send_acquire(waiting_for(names[N - 1], 1.0)).await;
    app.expect_waiting(id).await;
    assert_eq!(app.expect_not_acquired(id).await, Reason::Timeout as i32);
    let waited_single = script_calls(&redis) - before;
    eprintln!(
        "script calls while waiting 1 s until the timeout: AcquireAll of {N} keys {waited}, one acquire {waited_single}"
    );
    // A try is N acquires and N-1 given back; the first busy answer is followed by
    // one more, which registers the request on every key; then its end (N unwaits).
    // Three tries' worth at most: a poll every 100 ms would be ten more tries (70).
    let try_calls = 2 * N as u64 - 1;
    assert!(
        waited <= 3 * try_calls + N as u64 + waited_single,
        "{waited} script calls while waiting"
    );
}
