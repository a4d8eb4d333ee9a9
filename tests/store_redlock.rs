//! Redlock over three real masters: majorities grant and exclude, failed partial
//! acquisitions are rolled back at once, a minority of masters may fail, fencing tokens
//! strictly increase even when the masters' counters disagree, and what Redlock cannot
//! keep safely (semaphores, fair queues) is refused.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Redis, Sidecar, acquire, namespace, secs, signal};
use lockside::store::redis::{RedisOptions, RedisStore};
use lockside::store::redlock::RedlockStore;
use lockside::store::{Acquired, Claim, Sharing, Store};

struct Masters {
    redis: Vec<Redis>,
    namespace: String,
}

impl Masters {
    fn start(n: usize) -> Self {
        Self {
            redis: (0..n).map(|_| Redis::start()).collect(),
            namespace: namespace(),
        }
    }

    fn url(&self) -> String {
        let hosts: Vec<String> = self
            .redis
            .iter()
            .map(|r| format!("127.0.0.1:{}", r.port))
            .collect();
        format!("redlock://{}", hosts.join(","))
    }

    async fn sidecar(&self) -> Sidecar {
        let store = RedlockStore::new(&self.url(), &self.namespace, Duration::from_secs(1));
        Sidecar::start(Arc::new(store.expect("redlock store"))).await
    }

    /// A sidecar whose masters, after losing their data, vote for no new grant for
    /// `hold_off` (the product's default: the default TTL; `fault_store_restart.rs`).
    /// Zero where a test restarts a master empty to test votes or tokens, not that.
    async fn sidecar_holding_off(&self, hold_off: Duration) -> Sidecar {
        let options = RedisOptions {
            restart_hold_off: hold_off,
            ..RedisOptions::default()
        };
        let store = RedlockStore::with_options(&self.url(), &self.namespace, &options);
        Sidecar::start(Arc::new(store.expect("redlock store"))).await
    }

    /// Master `i` on its own, as a standalone store in the same namespace.
    fn single(&self, i: usize) -> RedisStore {
        RedisStore::new(
            &self.redis[i].url(),
            &self.namespace,
            Duration::from_secs(1),
        )
        .expect("store")
    }

    /// The fencing counter of `key` on master `i`.
    /// The last token master `i` keeps for `key`: the second field of the lock's
    /// string (`x|count|fence|...` held, `f|fence|...` released), or the hash's `f`.
    fn counter(&self, i: usize, key: &str) -> String {
        let lock = format!("{{{}:{key}}}:h", self.namespace);
        match self.redis[i].cli(&["TYPE", &lock]).as_str() {
            "hash" => self.redis[i].cli(&["HGET", &lock, "f"]),
            _ => {
                let value = self.redis[i].cli(&["GET", &lock]);
                value
                    .split('|')
                    .nth(2 - usize::from(value.starts_with('f')))
                    .unwrap_or_default()
                    .to_owned()
            }
        }
    }
}

fn claim(key: &str, owner: &str) -> Claim {
    Claim {
        key: key.into(),
        owner: owner.into(),
        ttl: Duration::from_secs(30),
        wait: false,
        session_id: format!("session-of-{owner}"),
        client_name: "other".into(),
        holder: String::new(),
        sharing: Sharing::Exclusive,
        limit: 1,
        fair: false,
        value: Vec::new(),
        ticket: None,
    }
}

impl Masters {
    /// A Redlock store on the masters, used through the `Store` trait.
    fn redlock(&self) -> RedlockStore {
        RedlockStore::new(&self.url(), &self.namespace, Duration::from_secs(1))
            .expect("redlock store")
    }

    /// Whether master `i` still has a grant of `key` by `owner`'s session.
    async fn holds(&self, i: usize, key: &str, owner: &str) -> bool {
        let state = self.single(i).describe(key).await.expect("describe");
        let session = claim(key, owner).session_id;
        state.holders.iter().any(|h| h.session_id == session)
    }

    /// Waits (bounded) until master `i` no longer has `owner`'s grant of `key`.
    async fn let_go(&self, i: usize, key: &str, owner: &str) {
        let gone = tokio::time::timeout(common::PATIENCE, async {
            while self.holds(i, key, owner).await {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        assert!(
            gone.is_ok(),
            "master {i} still has {owner}'s grant of {key}"
        );
    }
}

/// Issue 11, item 1. A reentrant hold reached one master only (its call timed out, the
/// session kept count 1); while another master is frozen, the session's Release must
/// answer what a majority has left (0), not the largest count of one master, and the
/// key is then free for someone else on the two live masters. The frozen master lets
/// go once it runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_answers_what_a_majority_of_masters_has_left() {
    let masters = Masters::start(3);
    let redlock = masters.redlock();
    let got = redlock.acquire(&claim("k", "s1")).await;
    assert!(matches!(got, Ok(Acquired::Granted { .. })), "{got:?}");
    // The hold that reached master 0 only.
    let held = masters
        .single(0)
        .reenter("k", "s1", 2, Duration::from_secs(30))
        .await;
    assert_eq!(held.expect("master 0"), Some(2));
    let frozen = masters.redis[2].pid();
    signal(frozen, "STOP");
    // The session holds the key once: it leaves 0 holds.
    let released = redlock
        .release("k", "s1", 0, Duration::ZERO)
        .await
        .expect("a majority answers");
    assert_eq!(released, Some(0), "released on a majority");
    let other = redlock.acquire(&claim("k", "s2")).await;
    assert!(
        matches!(other, Ok(Acquired::Granted { .. })),
        "masters 0 and 1 are free: {other:?}"
    );
    signal(frozen, "CONT");
    masters.let_go(2, "k", "s1").await;
}

/// Issue 11, item 1. Counts a majority no longer shares: master 1 lost the grant, master
/// 2 is frozen. Releasing one of two holds must answer "not held" (only master 0 still
/// has it), and master 0, left holding a grant the vote says is gone, lets it go, so
/// the key can be granted on masters 0 and 1 while master 2 is still frozen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_the_majority_lost_is_cleaned_up_where_it_is_left() {
    let masters = Masters::start(3);
    let redlock = masters.redlock();
    let got = redlock.acquire(&claim("k", "s1")).await;
    assert!(matches!(got, Ok(Acquired::Granted { .. })), "{got:?}");
    let held = redlock.reenter("k", "s1", 2, Duration::from_secs(30)).await;
    assert_eq!(held.expect("a majority answers"), Some(2));
    // Master 1 loses the grant (as a master restarted empty would).
    let lost = masters
        .single(1)
        .release("k", "s1", 0, Duration::ZERO)
        .await;
    assert_eq!(lost.expect("master 1"), Some(0));
    let frozen = masters.redis[2].pid();
    signal(frozen, "STOP");
    // One of the two holds given back: 1 left, where the grant still is.
    let released = redlock
        .release("k", "s1", 1, Duration::ZERO)
        .await
        .expect("a majority answers");
    assert_eq!(released, None, "only master 0 of 3 had the grant");
    masters.let_go(0, "k", "s1").await;
    let other = redlock.acquire(&claim("k", "s2")).await;
    assert!(
        matches!(other, Ok(Acquired::Granted { .. })),
        "masters 0 and 1 are free: {other:?}"
    );
    signal(frozen, "CONT");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_majority_grants_and_excludes() {
    let masters = Masters::start(3);
    let sidecar = masters.sidecar().await;
    let client = sidecar.client().await;
    let mut a = client.lease().await;
    let mut b = client.lease().await;
    let first = a.grant("k").await.fencing_token;
    let mut wait = acquire("k");
    wait.wait_timeout = Some(secs(10.0));
    let id = b.send_acquire(wait).await;
    b.expect_waiting(id).await;
    a.release("k").await;
    let second = b.granted_after_wait(id).await.fencing_token;
    assert!(second > first, "{second} > {first}");
    let mut holding = 0;
    for i in 0..3 {
        let state = masters.single(i).describe("k").await.expect("describe");
        if state.holders.iter().any(|h| h.session_id == b.session_id) {
            holding += 1;
        }
        assert!(state.holders.iter().all(|h| h.session_id == b.session_id));
    }
    assert!(holding >= 2, "a majority of masters has the grant");
    let described = client.describe("k").await;
    assert_eq!(described.holders.len(), 1);
    assert_eq!(described.holders[0].session_id, b.session_id);
    sidecar.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_vote_is_rolled_back_at_once() {
    let masters = Masters::start(3);
    // Someone else holds the key on masters 1 and 2 (a minority view for us is
    // master 0 alone).
    for i in [1, 2] {
        let got = masters.single(i).acquire(&claim("k", "someone-else")).await;
        assert!(matches!(got, Ok(Acquired::Granted { .. })), "{got:?}");
    }
    let sidecar = masters.sidecar().await;
    let mut lease = sidecar.client().await.lease().await;
    let id = lease.send_acquire(acquire("k")).await;
    assert_eq!(lease.expect_not_acquired(id).await, 1, "BUSY");
    let state = masters.single(0).describe("k").await.expect("describe");
    assert!(
        state.holders.is_empty(),
        "master 0 granted alone and must have been rolled back: {state:?}"
    );
    sidecar.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minority_of_masters_may_fail_a_majority_may_not() {
    let mut masters = Masters::start(3);
    let sidecar = masters.sidecar_holding_off(Duration::ZERO).await;
    let mut lease = sidecar.client().await.lease().await;
    masters.redis[0].kill();
    lease.grant("one-down").await;
    // A frozen master does not slow grants: the majority answers first.
    let frozen = masters.redis[1].pid();
    signal(frozen, "STOP");
    masters.redis[0].restart();
    lease.grant("one-frozen").await;
    signal(frozen, "CONT");
    masters.redis[0].kill();
    masters.redis[1].kill();
    let id = lease.send_acquire(acquire("two-down")).await;
    let rejected = lease.expect_rejected(id).await;
    assert_eq!(rejected.code, 14, "UNAVAILABLE: {rejected:?}");
    sidecar.shutdown().await;
}

/// The grant's token is written back to the masters: a later majority that does not
/// include the master with the highest counter still issues a larger token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_when_the_masters_counters_disagree() {
    let mut masters = Masters::start(3);
    // Master 0's counter runs far ahead of the others' (and of any clock).
    let far = (u64::from(u32::MAX) * 1_000_000).to_string();
    // A released lock keeps its last token in a string, here for 10 minutes.
    let lock = format!("{{{}:k}}:h", masters.namespace);
    masters.redis[0].cli(&["SET", &lock, &format!("f|{far}|0"), "PX", "600000"]);
    let sidecar = masters.sidecar_holding_off(Duration::ZERO).await;
    let mut lease = sidecar.client().await.lease().await;
    masters.redis[2].kill();
    let first = lease.grant("k").await.fencing_token;
    assert!(first > far.parse::<u64>().expect("number"), "{first}");
    assert_eq!(masters.counter(1, "k"), first.to_string(), "written back");
    lease.release("k").await;
    // Without master 0, the majority is 1 and 2: master 1 knows the token.
    masters.redis[0].kill();
    masters.redis[2].restart();
    let second = lease.grant("k").await.fencing_token;
    assert!(second > first, "{second} > {first}");
    sidecar.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_across_a_master_restarted_empty() {
    let mut masters = Masters::start(3);
    let sidecar = masters.sidecar_holding_off(Duration::ZERO).await;
    let mut lease = sidecar.client().await.lease().await;
    let mut last = 0;
    for round in 0..30 {
        if round == 10 || round == 20 {
            masters.redis[round / 10 - 1].restart();
        }
        let token = lease.grant("k").await.fencing_token;
        assert!(token > last, "round {round}: {token} after {last}");
        last = token;
        lease.release("k").await;
    }
    sidecar.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphores_and_fair_queues_are_refused() {
    let masters = Masters::start(3);
    let sidecar = masters.sidecar().await;
    let mut lease = sidecar.client().await.lease().await;
    let mut semaphore = acquire("sem");
    semaphore.limit = 3;
    let id = lease.send_acquire(semaphore).await;
    let rejected = lease.expect_rejected(id).await;
    assert_eq!(rejected.code, 12, "UNIMPLEMENTED: {rejected:?}");
    assert!(
        rejected.message.contains("semaphores"),
        "{}",
        rejected.message
    );
    let mut fair = acquire("fair");
    fair.fair = true;
    let id = lease.send_acquire(fair).await;
    assert_eq!(lease.expect_rejected(id).await.code, 12);
    // Shared locks are fine: any two majorities share a master.
    let mut shared = acquire("rw");
    shared.mode = lockside::proto::LockMode::Shared as i32;
    let id = lease.send_acquire(shared).await;
    lease.expect_granted(id).await;
    sidecar.shutdown().await;
}

/// Sessions cannot be resumed on Redlock (each master would need its own record and a
/// majority's re-keying): `SessionStarted` carries no resume token, a resume is
/// UNIMPLEMENTED, and no session record is written on any master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_cannot_be_resumed_on_redlock() {
    let masters = Masters::start(3);
    let sidecar = masters.sidecar().await;
    let client = sidecar.client().await;
    let mut lease = client.lease().await;
    assert!(lease.resume_token.is_empty(), "no token to resume with");
    lease.grant("k").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let token = format!("{}.AAAAAAAAAAAAAAAAAAAAAA", lease.session_id);
    let refused = client.resume(&token).await.err().expect("refused");
    assert_eq!(refused.code(), tonic::Code::Unimplemented, "{refused}");
    for master in &masters.redis {
        let records = master.cli(&["--scan", "--pattern", "*session/*"]);
        assert!(records.is_empty(), "no record: {records}");
    }
    sidecar.shutdown().await;
}

/// Scenario 9: clients on two sidecars contend for a few keys on Redlock while a
/// master fails; returns what they saw (printed as a table line).
async fn scenario_9(masters: &mut Masters, what: &str, fault: Fault9) -> common::Verdict {
    use common::workload::{self, Plan};
    // Held off for the TTL after a master lost its data, as the product's default is.
    let one = masters.sidecar_holding_off(Duration::from_secs(1)).await;
    let two = masters.sidecar_holding_off(Duration::from_secs(1)).await;
    let addrs = [one.addr.clone(), two.addr.clone()];
    let plan = Plan {
        clients: 6,
        keys: 3,
        ttl: Duration::from_secs(1),
        long_every: 5,
        long_hold: Duration::from_millis(600),
        run: Duration::from_secs(4),
    };
    let start = tokio::time::Instant::now();
    let faults = async {
        tokio::time::sleep(Duration::from_millis(800)).await;
        match fault {
            Fault9::Freeze => {
                let pid = masters.redis[0].pid();
                signal(pid, "STOP");
                tokio::time::sleep(Duration::from_millis(1500)).await;
                signal(pid, "CONT");
            }
            Fault9::RestartAtOnce => {
                let pid = masters.redis[0].pid();
                signal(pid, "STOP");
                tokio::time::sleep(Duration::from_millis(700)).await;
                // Grants made meanwhile live on masters 1 and 2 only; master 1 now
                // forgets them at once.
                masters.redis[1].restart();
                signal(pid, "CONT");
            }
            Fault9::RestartAfterTtl => {
                masters.redis[1].kill();
                tokio::time::sleep(plan.ttl + Duration::from_millis(200)).await;
                masters.redis[1].restart();
            }
        }
    };
    let (outcome, ()) = tokio::join!(workload::run(&addrs, plan), faults);
    let verdict = common::check_history(&outcome.history);
    let mut takeovers = common::workload::takeovers(&outcome.history, start);
    eprintln!(
        "SCENARIO 9 Redlock {} masters, {what}: intervals {}, overlaps {}, regressions {}, \
         fenced rejections {}, unavailable {}, lost {}, first grant per key p50 {:?}",
        masters.redis.len(),
        verdict.intervals,
        verdict.overlaps,
        verdict.token_regressions,
        outcome.fenced_rejections,
        outcome.unavailable,
        outcome.lost,
        common::workload::percentile(&mut takeovers, 50),
    );
    one.shutdown().await;
    two.shutdown().await;
    verdict
}

#[derive(Clone, Copy)]
enum Fault9 {
    Freeze,
    RestartAtOnce,
    RestartAfterTtl,
}

/// TESTING.md, scenario 9.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_master_leaves_the_quorum_safe() {
    for n in [3, 5] {
        let mut masters = Masters::start(n);
        let verdict = scenario_9(&mut masters, "one master frozen 1.5 s", Fault9::Freeze).await;
        assert!(verdict.intervals > 10, "the workload ran: {verdict:?}");
        assert_eq!(verdict.overlaps, 0);
        assert_eq!(verdict.token_regressions, 0);
    }
}

/// TESTING.md, scenario 9.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_restarted_after_the_ttl_is_safe() {
    let mut masters = Masters::start(3);
    let verdict = scenario_9(
        &mut masters,
        "one master down, restarted empty after the TTL",
        Fault9::RestartAfterTtl,
    )
    .await;
    assert!(verdict.intervals > 10, "the workload ran: {verdict:?}");
    assert_eq!(verdict.overlaps, 0);
    assert_eq!(verdict.token_regressions, 0);
}

/// Once the documented hazard (a majority of one frozen master and one restarted
/// empty could grant a lock the other majority holds): a master that lost its data
/// now votes for no new grant for the hold-off, so no two holders.
/// TESTING.md, scenario 9.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_restarted_empty_at_once_holds_off_and_stays_safe() {
    let mut masters = Masters::start(3);
    let verdict = scenario_9(
        &mut masters,
        "one frozen, another restarted empty at once",
        Fault9::RestartAtOnce,
    )
    .await;
    assert!(verdict.intervals > 10, "the workload ran: {verdict:?}");
    assert_eq!(verdict.overlaps, 0);
    assert_eq!(verdict.token_regressions, 0);
}

/// Issue 25: one master's clock an hour ahead of the others (faked: it keeps a last
/// token issued by that clock, as if it had issued it). A majority's grant that
/// includes it carries that large token, written back to the others; after the
/// grant expired there and that master is gone, a grant of the other two must still
/// carry a larger token: they keep the written-back token as long as it is ahead of
/// their own clocks, not only as long as the grant's key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_never_go_back_when_one_masters_clock_ran_ahead() {
    let mut masters = Masters::start(3);
    let redlock = masters.redlock();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64;
    let ahead_ms = now_ms + 3_600_000;
    let big = ahead_ms * lockside::store::FENCE_PER_MS;
    let lock = format!("{{{}:k}}:h", masters.namespace);
    let kept = format!("f|{big}|0");
    masters.redis[0].cli(&["SET", &lock, &kept, "PX", "7200000"]);
    let short = Claim {
        ttl: Duration::from_secs(1),
        ..claim("k", "s1")
    };
    let first = match redlock.acquire(&short).await {
        Ok(Acquired::Granted { fence }) => fence,
        other => panic!("granted: {other:?}"),
    };
    assert!(
        first > big,
        "the majority's token is the fast master's: {first}"
    );
    // Held in its new form on the other masters: renewed as any grant.
    let renewal = lockside::store::Renewal {
        key: "k",
        owner: "s1",
        ttl: Duration::from_secs(1),
    };
    let renewed = redlock.renew(&[renewal]).await.expect("renewed");
    assert!(renewed[0].is_extended(), "{renewed:?}");
    // Not renewed: the grant expires on every master; then the fast master is gone.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    masters.redis[0].kill();
    let next = match redlock.acquire(&claim("k", "s2")).await {
        Ok(Acquired::Granted { fence }) => fence,
        other => panic!("granted by the other two: {other:?}"),
    };
    assert!(next > first, "token went back: {next} after {first}");
}

/// Issue 32, item 2, on Redlock: one frozen master, whichever it is, costs no lock
/// anything: every lock lives on every master, and a renewal needs a majority, which the
/// two others give at once. A session holds six locks with a 2 s TTL (the product's 1 s
/// store timeout) while one master, each in turn on fresh masters, is SIGSTOPped for 3 s:
/// no `Jeopardy`, no `Lost`, every lock still held with its token. (The frozen master's
/// copies expire meanwhile and are not written back: a second master frozen later would
/// leave one copy, no majority.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_master_whichever_it_is_costs_no_lock_anything() {
    for master in 0..3 {
        let masters = Masters::start(3);
        let sidecar = masters.sidecar().await;
        let client = sidecar.client().await;
        let mut lease = client.lease().await;
        let mut tokens = Vec::new();
        for i in 0..6 {
            let key = format!("k{i}");
            let id = lease
                .send_acquire(lockside::proto::Acquire {
                    ttl: Some(secs(2.0)),
                    ..acquire(&key)
                })
                .await;
            tokens.push((key, lease.expect_granted(id).await.fencing_token));
        }
        let pid = masters.redis[master].pid();
        signal(pid, "STOP");
        let quiet = tokio::time::timeout(Duration::from_secs(3), lease.next()).await;
        signal(pid, "CONT");
        assert!(
            quiet.is_err(),
            "master {master} frozen: the locks hear nothing: {quiet:?}"
        );
        for (key, token) in &tokens {
            let state = client.describe(key).await;
            assert_eq!(state.holders.len(), 1, "{key} held");
            assert_eq!(state.fencing_token, *token, "{key}");
        }
        drop(lease);
        sidecar.shutdown().await;
    }
}
