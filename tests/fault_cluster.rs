//! Lockside on a real Redis Cluster (3 masters, 3 replicas on loopback): locks on every
//! master, handoffs woken by the sharded release notice (not by the holder's TTL),
//! batched renewals across slots, and a coordinated failover (MOVED) in the middle.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::topology::{ClusterSetup, wait_until};
use common::{LeaseStream, PATIENCE, Sidecar, acquire, handoff, namespace, secs, waiting_for};
use lockside::engine::EngineConfig;
use lockside::proto::{self, lease_response::Event};
use lockside::store::Store;
use lockside::store::redis::{RedisOptions, RedisStore};
use tokio::time::Instant;

fn store(url: &str, ns: &str) -> Arc<dyn Store> {
    let options = RedisOptions {
        timeout: Duration::from_millis(500),
        ..RedisOptions::default()
    };
    Arc::new(RedisStore::with_options(url, ns, &options).expect("cluster store"))
}

fn start_cluster() -> ClusterSetup {
    tokio::task::block_in_place(ClusterSetup::start)
}

/// `per_master` keys per master: lock names whose slots the three masters serve, with
/// the port of each one's master.
fn keys_per_master(cluster: &ClusterSetup, ns: &str, per_master: usize) -> Vec<(String, u16)> {
    tokio::task::block_in_place(|| {
        let mut found: Vec<(String, u16)> = Vec::new();
        for i in 0.. {
            let key = format!("key-{i}");
            let master = cluster.master_of(&format!("{{{ns}:{key}}}:h"));
            if found.iter().filter(|(_, m)| *m == master).count() < per_master {
                found.push((key, master));
            }
            if found.len() == 3 * per_master {
                break;
            }
        }
        found
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_on_every_master_are_handed_off_by_sharded_notices() {
    let cluster = start_cluster();
    let ns = namespace();
    let a = Sidecar::start(store(&cluster.url(), &ns)).await;
    let b = Sidecar::start(store(&cluster.url(), &ns)).await;
    let mut holder = a.client().await.lease().await;
    let mut waiter = b.client().await.lease().await;
    let keys = keys_per_master(&cluster, &ns, 1);
    for (key, master) in &keys {
        let took = handoff(&mut holder, &mut waiter, key).await;
        eprintln!("cluster handoff of {key} on master {master}: {took:?}");
        // Only this key's channel: sidecar b subscribed while it waited, then left.
        // (Every master's witness stays subscribed: `store/redis/restarts/witness.rs`.)
        let channels = common::topology::cli(*master, &["pubsub", "shardchannels", "*"]);
        let notices: Vec<&str> = (channels.lines())
            .filter(|c| c.contains(&ns) && !c.contains("}:w:"))
            .collect();
        assert!(notices.is_empty(), "{channels}");
    }
    // A waiter per key at once, on every master.
    let mut ids = Vec::new();
    for (key, _) in &keys {
        let id = holder
            .send_acquire(proto::Acquire {
                ttl: Some(secs(30.0)),
                ..acquire(key)
            })
            .await;
        holder.expect_granted(id).await;
        let id = waiter.send_acquire(waiting_for(key, 10.0)).await;
        waiter.expect_waiting(id).await;
        ids.push(id);
    }
    let released = Instant::now();
    for (key, _) in &keys {
        assert_eq!(holder.release(key).await, 0);
    }
    // In any order: the keys live on different masters, their notices come apart.
    let mut granted = Vec::new();
    while granted.len() < ids.len() {
        match waiter.next().await {
            Event::Granted(g) if ids.contains(&g.request_id) => granted.push(g.request_id),
            other => panic!("expected the waiters' grants, got {other:?}"),
        }
    }
    assert!(released.elapsed() < Duration::from_secs(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_locks_across_slots_are_renewed_past_two_ttls() {
    let cluster = start_cluster();
    let ns = namespace();
    let sidecar = Sidecar::start(store(&cluster.url(), &ns)).await;
    let client = sidecar.client().await;
    let mut lease = client.lease().await;
    let keys: Vec<String> = (0..50).map(|i| format!("renewed-{i}")).collect();
    for key in &keys {
        let id = lease
            .send_acquire(proto::Acquire {
                ttl: Some(secs(1.0)),
                ..acquire(key)
            })
            .await;
        lease.expect_granted(id).await;
    }
    // 2.5 TTLs: nothing may happen to a session whose locks are renewed.
    let quiet = tokio::time::timeout(Duration::from_millis(2500), lease.next()).await;
    assert!(quiet.is_err(), "no Lost or Jeopardy: {quiet:?}");
    let masters = tokio::task::block_in_place(|| {
        let mut masters: Vec<u16> = keys
            .iter()
            .map(|k| cluster.master_of(&format!("{{{ns}:{k}}}:h")))
            .collect();
        masters.sort_unstable();
        masters.dedup();
        masters
    });
    assert_eq!(masters.len(), 3, "the keys spread over all masters");
    for key in keys.iter().step_by(7) {
        let state = client.describe(key).await;
        assert_eq!(state.holders.len(), 1, "{key} still held");
    }
}

/// `key` held (TTL 2 s) by a session of one sidecar while a session of another waits
/// for it: the scene of a topology change.
struct Contended {
    holding: Sidecar,
    _waiting: Sidecar,
    holder: LeaseStream,
    waiter: LeaseStream,
    first: proto::Granted,
    wait_id: u64,
}

async fn contended(cluster: &ClusterSetup, ns: &str, key: &str) -> Contended {
    let holding = Sidecar::start(store(&cluster.url(), ns)).await;
    let waiting = Sidecar::start(store(&cluster.url(), ns)).await;
    let mut holder = holding.client().await.lease().await;
    let mut waiter = waiting.client().await.lease().await;
    let id = holder
        .send_acquire(proto::Acquire {
            ttl: Some(secs(2.0)),
            ..acquire(key)
        })
        .await;
    let first = holder.expect_granted(id).await;
    // The waiter subscribes where the slot is now, before the change; it waits long
    // enough to outlast a hold-off.
    let wait_id = waiter.send_acquire(waiting_for(key, 30.0)).await;
    waiter.expect_waiting(wait_id).await;
    Contended {
        holding,
        _waiting: waiting,
        holder,
        waiter,
        first,
        wait_id,
    }
}

/// After the change: the grant lives through 2 TTLs of renewals (which follow the slot
/// with MOVED) with its token (`Jeopardy` then `Restored` allowed while the slot moves,
/// never `Lost`), and its release wakes the waiter, whose subscription followed the
/// slot: within a second, or (`held_off`: a failover, the data may have gone back)
/// once the hold-off that began then has passed. Returns how long the wake took.
async fn survives_and_hands_off(
    c: &mut Contended,
    key: &str,
    change: &str,
    held_off: Option<Instant>,
) -> Duration {
    let quiet = Instant::now() + Duration::from_secs(4);
    let mut jeopardy = false;
    while let Ok(event) = tokio::time::timeout_at(quiet, c.holder.next()).await {
        match event {
            Event::Jeopardy(_) if !jeopardy => jeopardy = true,
            Event::Restored(_) if jeopardy => jeopardy = false,
            other => panic!("the grant survives {change}: {other:?}"),
        }
    }
    assert!(!jeopardy, "renewals go on after {change}");
    let state = c.holding.client().await.describe(key).await;
    assert_eq!(state.holders.len(), 1);
    assert_eq!(state.fencing_token, c.first.fencing_token);
    let released = Instant::now();
    assert_eq!(c.holder.release(key).await, 0);
    let next = c.waiter.expect_granted(c.wait_id).await;
    let took = released.elapsed();
    match held_off {
        None => assert!(
            took < Duration::from_secs(1),
            "woken by the notice: {took:?}"
        ),
        Some(since) => {
            let hold_off = RedisOptions::default().restart_hold_off;
            assert!(
                since.elapsed() >= hold_off,
                "granted {:?} after {change}, within the hold-off",
                since.elapsed()
            );
            assert!(since.elapsed() < hold_off + Duration::from_secs(2));
        }
    }
    assert!(next.fencing_token > c.first.fencing_token);
    took
}

/// A coordinated failover (`CLUSTER FAILOVER`) promotes a replica: a new tenure, so the
/// sidecars hold new grants off (issue 32: a promoted replica may lack the last
/// grants; this one does not, but nothing tells them apart) while the holder keeps its
/// lock, renewed on the new master with its token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinated_failover_moves_locks_renewals_and_notices() {
    let cluster = start_cluster();
    let ns = namespace();
    let key = "moving";
    let mut scene = contended(&cluster, &ns, key).await;
    let redis_key = format!("{{{ns}:{key}}}:h");
    let (old, replica) = tokio::task::block_in_place(|| {
        let old = cluster.master_of(&redis_key);
        (old, cluster.replica_of(old))
    });
    let switched = Instant::now();
    cluster.failover(replica);
    let promoted = wait_until(PATIENCE, || cluster.promoted(replica)).await;
    assert!(promoted, "the replica took over");
    eprintln!(
        "CLUSTER FAILOVER {old} -> {replica}: {:?}",
        switched.elapsed()
    );
    let change = "a coordinated failover";
    survives_and_hands_off(&mut scene, key, change, Some(switched)).await;
    let new_master = tokio::task::block_in_place(|| cluster.master_of(&redis_key));
    assert_eq!(new_master, replica);
}

/// A slot migration (`CLUSTER SETSLOT … MIGRATING/IMPORTING`, `MIGRATE`, then `NODE`)
/// while a lock is held and another sidecar waits: calls in the middle are redirected
/// with ASK, renewals follow MOVED afterwards, and the waiter's sharded subscription
/// follows the slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migration_moves_locks_renewals_and_notices() {
    let cluster = start_cluster();
    let ns = namespace();
    let key = "migrating";
    let mut scene = contended(&cluster, &ns, key).await;
    let before = scene.holding.client().await.describe(key).await;
    assert_eq!(before.holders.len(), 1);

    let redis_key = format!("{{{ns}:{key}}}:h");
    let (source, target, slot) = tokio::task::block_in_place(|| {
        let source = cluster.master_of(&redis_key);
        let target = cluster
            .masters()
            .into_iter()
            .find(|m| *m != source)
            .expect("another master");
        let slot = common::topology::cli(source, &["cluster", "keyslot", &redis_key]);
        (source, target, slot)
    });
    let id_of = |port: u16| common::topology::cli(port, &["cluster", "myid"]);
    let (source_id, target_id) = (id_of(source), id_of(target));
    let cli = common::topology::cli;
    assert_eq!(
        cli(
            target,
            &["cluster", "setslot", &slot, "importing", &source_id]
        ),
        "OK"
    );
    assert_eq!(
        cli(
            source,
            &["cluster", "setslot", &slot, "migrating", &target_id]
        ),
        "OK"
    );
    let keys = cli(source, &["cluster", "getkeysinslot", &slot, "100"]);
    let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
    assert!(keys.len() >= 2, "the lock's keys are in the slot: {keys:?}");
    let port = target.to_string();
    let mut migrate = vec!["migrate", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
    migrate.extend(keys.iter().copied());
    assert_eq!(cli(source, &migrate), "OK");
    // Mid-migration the keys are on the target and the slot still on the source: Redis
    // answers a script on several keys of the slot with ASK then TRYAGAIN until the
    // slot is assigned, so a call now either reads the lock or fails as UNAVAILABLE —
    // never a wrong answer.
    let mut grpc = scene.holding.client().await.grpc;
    let request = proto::DescribeRequest { key: key.into() };
    match grpc.describe(request).await {
        Ok(middle) => assert_eq!(middle.into_inner().holders.len(), 1),
        Err(status) => assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}"),
    }
    for port in [target, source] {
        assert_eq!(
            cli(port, &["cluster", "setslot", &slot, "node", &target_id]),
            "OK"
        );
    }
    let moved = wait_until(PATIENCE, || cluster.master_of(&redis_key) == target).await;
    assert!(moved, "every node sees the slot on its new master");

    let took = survives_and_hands_off(&mut scene, key, "a slot migration", None).await;
    eprintln!("slot {slot} {source} -> {target}: waiter woken {took:?} after the release");
}

/// Issue 11, item 2, and issue 32, item 2: one frozen master must not put every lock in
/// jeopardy, whichever master it is. 3 masters with the default 15 s node timeout (no
/// failover during the test), 24 locks with a 2 s TTL spread evenly over them on one
/// session, the product's store timeout (1 s), then one master SIGSTOPped for 3 s,
/// each master in turn: the locks whose slots the two healthy masters serve hear
/// nothing (their renewals go on), the frozen master's locks get `Jeopardy` and, past
/// their safe deadline, `Lost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_master_puts_only_its_own_locks_in_jeopardy() {
    for master in 0..3 {
        frozen_master_costs_only_its_locks(Freeze::Master(master)).await;
    }
}

/// The same with the master SIGKILLed and left down (the nemesis met it: a killed
/// master, no failover within the 15 s node timeout, once cost locks on the healthy
/// masters: "the epoch marker of this key's master could not be read"): its calls
/// fail at once rather than time out, and only its own locks hear of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_puts_only_its_own_locks_in_jeopardy() {
    for master in 0..3 {
        frozen_master_costs_only_its_locks(Freeze::Killed(master)).await;
    }
}

/// A sidecar that starts while one master is down (killed, no failover within the 15 s
/// node timeout: a pod restarted at the wrong moment) grants the keys of the two
/// healthy masters at once; only the dead master's keys are unavailable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_started_while_a_master_is_down_grants_on_the_others() {
    let mut cluster = tokio::task::block_in_place(|| ClusterSetup::start_with_node_timeout(15_000));
    let ns = namespace();
    let keys = keys_per_master(&cluster, &ns, 2);
    let dead = keys[0].1;
    // An earlier sidecar has read every master's marker, as a fleet's would have.
    let before = Sidecar::start(store(&cluster.url(), &ns)).await;
    before.client().await.lease().await.grant(&keys[2].0).await;
    cluster.kill(dead);
    let sidecar = Sidecar::start(store(&cluster.url(), &ns)).await;
    let mut lease = sidecar.client().await.lease().await;
    for (key, master) in &keys {
        let id = lease
            .send_acquire(proto::Acquire {
                ttl: Some(secs(5.0)),
                ..acquire(key)
            })
            .await;
        let started = Instant::now();
        match lease.next().await {
            Event::Granted(g) => {
                assert_ne!(*master, dead, "{key} granted on the dead master");
                assert_eq!(g.request_id, id);
                eprintln!("{key}: granted in {:?}", started.elapsed());
            }
            Event::Rejected(r) => {
                assert_eq!(*master, dead, "{key} on a healthy master refused: {r:?}");
                assert_eq!(r.code, tonic::Code::Unavailable as i32, "{r:?}");
            }
            Event::NotAcquired(n) if n.key == keys[2].0 => {}
            other => panic!("{key}: unexpected {other:?}"),
        }
    }
    drop(before);
}

/// Issue 25: the same with the frozen master the one that holds the sidecar's own keys
/// (its session's record and its attachment): the journal is off the lock path, so
/// the locks of the healthy masters hear nothing either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_master_holding_the_journal_costs_only_its_own_locks() {
    frozen_master_costs_only_its_locks(Freeze::TheJournals).await;
}

/// Issue 32, item 3 against item 2: a new grant is told once the session's record names
/// it, and that record lives on one master. Frozen, that master delays the session's
/// next grant on a healthy master by at most one store timeout (the write fails, and
/// the grant goes out unrecorded rather than wait), and none after it while its writes
/// keep failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_master_holding_the_journal_delays_new_grants_at_most_once() {
    let mut cluster = tokio::task::block_in_place(|| ClusterSetup::start_with_node_timeout(15_000));
    let ns = namespace();
    let (_sidecar, mut lease, journal) = journal_on_one_master(&cluster, &ns).await;
    let keys = keys_per_master(&cluster, &ns, 2);
    let healthy: Vec<&String> = (keys.iter().filter(|(_, m)| *m != journal))
        .map(|(k, _)| k)
        .collect();
    // The record exists (its first grant), on the master about to freeze.
    lease.grant("before").await;
    cluster.freeze(journal);
    let mut took = Vec::new();
    for key in healthy.iter().take(3) {
        let asked = Instant::now();
        let id = lease.send_acquire(acquire(key)).await;
        lease.expect_granted(id).await;
        took.push(asked.elapsed());
    }
    cluster.thaw();
    eprintln!("grants on healthy masters with the journal's master frozen: {took:?}");
    assert!(took[0] < Duration::from_millis(1500), "{took:?}");
    for later in &took[1..] {
        assert!(*later < Duration::from_millis(300), "{took:?}");
    }
}

/// A sidecar and a session of it whose record and the sidecar's attachment live on
/// one master (returned). The attachment's key follows from the sidecar's id, here its
/// instance name; a session id is random, so sessions are opened (holding nothing, they
/// write no record) until one's record falls on that master.
async fn journal_on_one_master(cluster: &ClusterSetup, ns: &str) -> (Sidecar, LeaseStream, u16) {
    let master_of = |key: String| tokio::task::block_in_place(|| cluster.master_of(&key));
    let master = master_of(format!("{{{ns}:sidecar/i-pod-0}}:a"));
    let config = EngineConfig {
        instance: Some("pod-0".into()),
        ..EngineConfig::default()
    };
    let sidecar = Sidecar::start_with(store(&cluster.url(), ns), config).await;
    let client = sidecar.client().await;
    loop {
        let lease = client.lease().await;
        if master_of(format!("{{{ns}:session/{}}}:s", lease.session_id)) == master {
            return (sidecar, lease, master);
        }
    }
}

/// Which master a frozen-master test freezes.
enum Freeze {
    /// The master of the `n`th key (of three, one per master).
    Master(usize),
    /// The same master, SIGKILLed (and not restarted) rather than stopped.
    Killed(usize),
    /// The master of the session's record, the sidecar's attachment on it too.
    TheJournals,
}

async fn frozen_master_costs_only_its_locks(which: Freeze) {
    const PER_MASTER: usize = 8;
    const FROZEN_FOR: Duration = Duration::from_secs(3);
    let mut cluster = tokio::task::block_in_place(|| ClusterSetup::start_with_node_timeout(15_000));
    let ns = namespace();
    let keys = keys_per_master(&cluster, &ns, PER_MASTER);
    let (sidecar, mut lease, frozen) = match which {
        Freeze::Master(n) | Freeze::Killed(n) => {
            let options = RedisOptions::default();
            let store = RedisStore::with_options(&cluster.url(), &ns, &options);
            let sidecar = Sidecar::start(Arc::new(store.expect("cluster store"))).await;
            let lease = sidecar.client().await.lease().await;
            (sidecar, lease, keys[n * PER_MASTER].1)
        }
        Freeze::TheJournals => journal_on_one_master(&cluster, &ns).await,
    };
    for (key, _) in &keys {
        let id = lease
            .send_acquire(proto::Acquire {
                ttl: Some(secs(2.0)),
                ..acquire(key)
            })
            .await;
        lease.expect_granted(id).await;
    }
    // A renewal round on every master before the fault.
    let quiet = tokio::time::timeout(Duration::from_millis(800), lease.next()).await;
    assert!(
        quiet.is_err(),
        "nothing happens before the fault: {quiet:?}"
    );
    // `cluster` SIGCONTs every frozen node when dropped, also when an assertion below
    // panics: no node outlives the test stopped.
    match which {
        Freeze::Killed(_) => cluster.kill(frozen),
        _ => cluster.freeze(frozen),
    }
    let froze = Instant::now();
    let mut events: Vec<(String, &'static str, Duration)> = Vec::new();
    // The freeze, then 1.5 s after the thaw: renewals of the healthy masters' locks
    // must not have stalled behind the frozen one at any point.
    let mut thawed = false;
    let end = froze + FROZEN_FOR + Duration::from_millis(1500);
    loop {
        let until = if thawed { end } else { froze + FROZEN_FOR };
        match tokio::time::timeout_at(until, lease.next()).await {
            Ok(event) => {
                let (key, kind) = match event {
                    Event::Jeopardy(j) => (j.key, "Jeopardy"),
                    Event::Lost(l) => (l.key, "Lost"),
                    Event::Restored(r) => (r.key, "Restored"),
                    other => panic!("unexpected event {other:?}"),
                };
                events.push((key, kind, froze.elapsed()));
            }
            Err(_) if !thawed => {
                cluster.thaw();
                thawed = true;
            }
            Err(_) => break,
        }
    }
    for (key, kind, at) in &events {
        eprintln!("{kind} {key} at {at:?} after the freeze");
    }
    let on_frozen = |key: &str| keys.iter().any(|(k, m)| k == key && *m == frozen);
    let healthy: Vec<_> = events.iter().filter(|(k, _, _)| !on_frozen(k)).collect();
    assert!(
        healthy.is_empty(),
        "locks on the healthy masters were disturbed: {healthy:?}"
    );
    for (key, _) in keys.iter().filter(|(_, m)| *m == frozen) {
        let kinds: Vec<&str> = events
            .iter()
            .filter(|(k, _, _)| k == key)
            .map(|(_, kind, _)| *kind)
            .collect();
        assert!(
            kinds.starts_with(&["Jeopardy"]) && kinds.contains(&"Lost"),
            "{key} on the frozen master: Jeopardy, then Lost past its deadline: {kinds:?}"
        );
    }
    let client = sidecar.client().await;
    for (key, _) in keys.iter().filter(|(_, m)| *m != frozen) {
        let state = client.describe(key).await;
        assert_eq!(state.holders.len(), 1, "{key} still held");
    }
}

/// A session of many locks on a Cluster: its record and its buckets share a slot; the
/// locks resume from it on another sidecar, and nothing of it is left once it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundreds_of_locks_resume_from_a_record_of_small_hashes_on_a_cluster() {
    let cluster = tokio::task::block_in_place(ClusterSetup::shared);
    let cli = |key: &str, args: &[&str]| {
        tokio::task::block_in_place(|| common::topology::cli(cluster.master_of(key), args))
    };
    common::records::many_locks_resume(&cluster.url(), &namespace(), cli, false).await;
}

/// Issue 26, item 3, on a Cluster: a master SIGKILLed and started again empty (with its
/// `nodes.conf`, so it comes back with its slots before its replica takes over: the
/// node timeout is 15 s). The cluster client reconnects by itself; the dropped
/// connection makes the sidecars read every master's epoch marker before their next
/// grant or renewal: the holder's lock is written back with its token, a new key of
/// that master is not granted during the hold-off (10 s, the default), and a waiter
/// is granted only after the holder's release and the hold-off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_restarted_empty_holds_off_and_keeps_its_holders() {
    let mut cluster = tokio::task::block_in_place(|| ClusterSetup::start_with_node_timeout(15_000));
    let ns = namespace();
    let a = Sidecar::start(store(&cluster.url(), &ns)).await;
    let b = Sidecar::start(store(&cluster.url(), &ns)).await;
    let keys = keys_per_master(&cluster, &ns, 2);
    let master = keys[0].1;
    let (held, fresh) = {
        let mut on_master = keys.iter().filter(|(_, m)| *m == master).map(|(k, _)| k);
        let held = on_master.next().expect("a key").clone();
        (held, on_master.next().expect("another key").clone())
    };
    let mut holder = a.client().await.lease().await;
    let token = holder.grant(&held).await.fencing_token;
    let mut other = b.client().await.lease().await;
    other.grant("elsewhere").await;
    // Both sidecars have read every master's marker (their first grant did).
    let node = (cluster.nodes.iter_mut())
        .find(|n| n.port == master)
        .expect("the master's node");
    tokio::task::block_in_place(|| node.restart());
    let restarted = Instant::now();
    let lock = format!("{{{ns}:{held}}}:h");
    let back = wait_until(PATIENCE, || {
        common::topology::cli(master, &["GET", &lock]).contains(&format!("|{token}|"))
    })
    .await;
    assert!(
        back,
        "the lock is written back on the restarted master, with its token"
    );
    let back_after = restarted.elapsed();
    // (A waiter that waits through the restart is told UNAVAILABLE when it looks again
    // while the node is down: it waits here from after the restart.)
    let mut waiter = b.client().await.lease().await;
    let waiting = waiter.send_acquire(waiting_for(&held, 60.0)).await;
    waiter.expect_waiting(waiting).await;
    let mut newcomer = b.client().await.lease().await;
    let id = newcomer.send_acquire(acquire(&fresh)).await;
    assert_eq!(
        newcomer.expect_not_acquired(id).await,
        proto::not_acquired::Reason::Busy as i32,
        "no new grant on the restarted master during the hold-off"
    );
    // The holder may hear `Jeopardy` (a renewal went out while the node was down) and
    // then `Restored`, never `Lost`.
    let mut jeopardy = false;
    while let Ok(event) = tokio::time::timeout(Duration::from_millis(300), holder.next()).await {
        match event {
            Event::Jeopardy(j) if j.key == held => jeopardy = true,
            Event::Restored(r) if r.key == held && jeopardy => jeopardy = false,
            other => panic!("the holder keeps its lock: {other:?}"),
        }
    }
    assert!(!jeopardy, "restored");
    assert_eq!(holder.release(&held).await, 0);
    let granted = waiter.granted_after_wait(waiting).await;
    assert!(granted.fencing_token > token);
    assert!(
        restarted.elapsed() >= Duration::from_secs(10),
        "not before the hold-off"
    );
    eprintln!(
        "SCENARIO 11 Cluster, a master restarted empty: its lock written back {back_after:?} \
         after the restart, the waiter granted {:?} after it",
        restarted.elapsed()
    );
}

/// Issue 32, item 1, on a Cluster: a master fails over to a replica that missed a grant
/// (TESTING.md's recipe: the replica SIGSTOPped, `CLIENT KILL TYPE replica` on the
/// master, the grant, the master SIGKILLed, the replica SIGCONTed and checked to lack
/// it before the cluster promotes it). The promoted replica is a new tenure: no other
/// session is granted the key while its holder holds it, the holder keeps it with its
/// token (written back on the new master), and a waiter gets it at the release, once
/// the hold-off has passed. Both when the master's epoch marker reached the replica long
/// before (`Marker::Replicated`) and when it was written with the missed grant
/// (`Marker::WithTheGrant`: the first grant on that master, both lost together).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_a_replica_that_missed_a_grant_keeps_its_holder() {
    failover_to_a_replica_that_missed_a_grant(Marker::WithTheGrant).await;
    failover_to_a_replica_that_missed_a_grant(Marker::Replicated).await;
}

/// When the master's epoch marker was written, in [`failover_to_a_replica_that_missed_a_grant`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Marker {
    Replicated,
    WithTheGrant,
}

async fn failover_to_a_replica_that_missed_a_grant(marker: Marker) {
    let mut cluster = start_cluster();
    let ns = namespace();
    let a = Sidecar::start(store(&cluster.url(), &ns)).await;
    let b = Sidecar::start(store(&cluster.url(), &ns)).await;
    let keys = keys_per_master(&cluster, &ns, 2);
    let mut on_first = keys.iter().filter(|(_, m)| *m == keys[0].1);
    let (key, before) = match (on_first.next(), on_first.next()) {
        (Some(k), Some(b)) => (k.0.clone(), b.0.clone()),
        _ => panic!("two keys on one master"),
    };
    let lock = format!("{{{ns}:{key}}}:h");
    let (master, replica, slot) = tokio::task::block_in_place(|| {
        let master = cluster.master_of(&lock);
        let slot = common::topology::cli(master, &["cluster", "keyslot", &lock]);
        (master, cluster.replica_of(master), slot)
    });
    let mut holder = a.client().await.lease().await;
    let kept = match marker {
        // A lock on the same master, replicated before the cut: so is the marker.
        Marker::Replicated => {
            let kept = holder.grant(&before).await;
            let before_lock = format!("{{{ns}:{before}}}:h");
            let replicated = wait_until(PATIENCE, || {
                common::topology::cli(
                    replica,
                    &["cluster", "countkeysinslot", &{
                        common::topology::cli(master, &["cluster", "keyslot", &before_lock])
                    }],
                ) == "1"
            })
            .await;
            assert!(replicated, "the first lock reached the replica");
            Some(kept)
        }
        Marker::WithTheGrant => None,
    };
    cluster.freeze(replica);
    let killed = common::topology::cli(master, &["client", "kill", "type", "replica"]);
    assert_eq!(killed, "1", "the replica's link is gone");
    let missed = holder.grant(&key).await;
    cluster.kill(master);
    cluster.thaw();
    let count = common::topology::cli(replica, &["cluster", "countkeysinslot", &slot]);
    assert_eq!(
        count, "0",
        "the replica lacks the grant before its promotion"
    );
    let failing = Instant::now();
    let mut other = b.client().await.lease().await;
    let taken_over = wait_until(Duration::from_secs(20), || cluster.promoted(replica)).await;
    assert!(taken_over, "the replica took over");
    let promoted = failing.elapsed();
    // Another session asks for the key until its holder's sidecar has written it back.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let id = other.send_acquire(acquire(&key)).await;
        loop {
            match other.next().await {
                Event::Granted(g) if g.request_id == id => {
                    panic!(
                        "{marker:?}: granted to another session while its holder holds it: {g:?}"
                    )
                }
                Event::Rejected(r) if r.request_id == id => break,
                Event::NotAcquired(n) if n.request_id == id => break,
                _ => continue,
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let token = format!("|{}|", missed.fencing_token);
    let back = wait_until(PATIENCE, || {
        common::topology::cli(replica, &["GET", &lock]).contains(&token)
    })
    .await;
    assert!(
        back,
        "{marker:?}: written back on the new master with its token"
    );
    let mut jeopardy = Vec::new();
    while let Ok(event) = tokio::time::timeout(Duration::from_millis(300), holder.next()).await {
        match event {
            Event::Jeopardy(j) => jeopardy.push(j.key),
            Event::Restored(r) => jeopardy.retain(|k| *k != r.key),
            other => panic!("{marker:?}: the holder keeps its locks: {other:?}"),
        }
    }
    assert!(jeopardy.is_empty(), "{marker:?}: restored: {jeopardy:?}");
    if let Some(kept) = kept {
        let state = b.client().await.describe(&before).await;
        assert_eq!(state.holders[0].fencing_token, kept.fencing_token);
    }
    let id = other.send_acquire(waiting_for(&key, 30.0)).await;
    other.expect_waiting(id).await;
    assert_eq!(holder.release(&key).await, 0);
    let next = other.granted_after_wait(id).await;
    assert!(next.fencing_token > missed.fencing_token);
    eprintln!(
        "SCENARIO 8 cluster, a failover to a replica that missed a grant (marker {marker:?}): \
         promoted {promoted:?} after the kill; the holder kept the lock; granted again {:?} \
         after the kill",
        failing.elapsed()
    );
}
