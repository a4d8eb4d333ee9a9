//! Running on a real Redis as operators run it (issue 26): with the least-privilege
//! user the README documents, each command it lacks makes `/readyz` name it; a store
//! whose eviction policy may drop locks keeps the sidecar unready unless allowed; a
//! Redis out of memory refuses with a reason of its own, and a release made meanwhile
//! still frees the lock once memory is back, not at its TTL. (The conformance suite
//! and the lease tests run with the least-privilege user too: `least_privilege::`.)

mod common;

use std::path::Path;
use std::time::Duration;

use common::prometheus;
use common::redis::{LOCKSIDE_PASSWORD, least_privilege_rules};
use common::{
    Client, PATIENCE, Redis, Sidecar, SidecarProcess, StoreKind, TempDir, acquire, free_port,
    make_store, namespace, secs,
};
use lockside::proto;
use tokio::time::Instant;
use tonic::Code;

/// `INFO memory`'s `used_memory`, in bytes.
fn used_memory(redis: &Redis) -> u64 {
    redis
        .cli(&["INFO", "memory"])
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("used_memory")
}

/// A Redis with `noeviction` (the default) whose `maxmemory` is reached: every write is
/// refused with `-OOM`. An acquire is told RESOURCE_EXHAUSTED "out of memory", not
/// UNAVAILABLE (retrying soon will not help; an operator must act). A lock released
/// meanwhile is answered `Released` and stays in the store while it refuses writes;
/// once memory is freed, the sidecar's retried release frees it, long before its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_store_says_out_of_memory_and_a_release_made_then_goes_through_once_memory_is_back()
{
    let redis = Redis::start();
    let sidecar = Sidecar::start(make_store(&StoreKind::Redis(redis.url()), &namespace())).await;
    let client = sidecar.client().await;
    let mut holder = client.lease().await;
    let id = holder
        .send_acquire(proto::Acquire {
            ttl: Some(secs(60.0)),
            ..acquire("k")
        })
        .await;
    holder.expect_granted(id).await;

    // Full: a limit a megabyte above what is used, then a 4 MB value.
    let limit = (used_memory(&redis) + (1 << 20)).to_string();
    assert_eq!(redis.cli(&["CONFIG", "SET", "maxmemory", &limit]), "OK");
    assert_eq!(
        redis.cli(&["SETRANGE", "filler", "4000000", "x"]),
        "4000001"
    );
    assert!(redis.cli(&["SET", "probe", "1"]).starts_with("OOM"));

    let mut other = client.lease().await;
    let id = other.send_acquire(acquire("other")).await;
    let rejected = other.expect_rejected(id).await;
    assert_eq!(
        rejected.code,
        Code::ResourceExhausted as i32,
        "{rejected:?}"
    );
    assert_eq!(rejected.message, "the lock store is out of memory");

    // The release is answered, and the store still holds the lock: it took no write.
    assert_eq!(holder.release("k").await, 0);
    assert_eq!(client.describe("k").await.holders.len(), 1);
    let id = other.send_acquire(acquire("k")).await;
    assert_eq!(
        other.expect_not_acquired(id).await,
        1,
        "busy while memory is full"
    );

    // Memory back: the lock is free within about a second, 60 s before its TTL.
    assert_eq!(redis.cli(&["DEL", "filler"]), "1");
    let freed = Instant::now();
    while !client.describe("k").await.holders.is_empty() {
        assert!(freed.elapsed() < PATIENCE, "the release was not retried");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    other.grant("k").await;
}

/// `/readyz` of the admin listener at `admin`: (status, body).
async fn readyz(admin: &str) -> (u16, String) {
    prometheus::get(admin, "/readyz")
        .await
        .unwrap_or((0, String::new()))
}

/// The scrape of the admin listener at `admin`.
async fn metrics(admin: &str) -> String {
    prometheus::get(admin, "/metrics")
        .await
        .map(|(_, text)| text)
        .unwrap_or_default()
}

/// Waits until `/readyz` at `admin` answers `status` with a body containing `says`;
/// returns the body.
async fn ready_as(admin: &str, status: u16, says: &str) -> String {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (got, body) = readyz(admin).await;
        if got == status && body.contains(says) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz: {got} {body:?}, not {status} {says:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The commands a `/readyz` body says the store refuses.
fn refused(body: &str) -> Vec<String> {
    let list = body
        .split_once("refuses commands Lockside needs: ")
        .map_or("", |(_, rest)| rest.split(" (").next().unwrap_or_default());
    list.split(", ").map(str::to_owned).collect()
}

/// How many lines of a log at `level` contain `what`.
fn lines(log: &Path, level: &str, what: &str) -> usize {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let level = format!(" {level} ");
    text.lines()
        .filter(|l| l.contains(&level) && l.contains(what))
        .count()
}

/// Waits for `n` more health checks of the sidecar at `admin` (its pings that
/// answered, one a second), each followed by the store's check.
async fn health_checks(admin: &str, n: f64) {
    let pings = |text: String| {
        text.lines()
            .find_map(|l| {
                l.strip_prefix("lockside_store_calls_total{operation=\"ping\",result=\"ok\"} ")
            })
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let until = pings(metrics(admin).await) + n;
    let deadline = Instant::now() + PATIENCE;
    while pings(metrics(admin).await) < until {
        assert!(Instant::now() < deadline, "health checks stopped");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The commands the documented least-privilege user is granted, as the sidecar names
/// them (`+script|load` is `SCRIPT LOAD`).
fn granted() -> Vec<String> {
    least_privilege_rules("ns", "pw")
        .iter()
        .filter_map(|rule| rule.strip_prefix('+'))
        .map(|command| command.replace('|', " ").to_uppercase())
        .collect()
}

/// Issue 26: each command Lockside needs, refused in turn to the least-privilege user,
/// makes `/readyz` fail naming it (and only it), for the commands the sidecar sends
/// (PING, EVAL, ...) and those its scripts call (HSET, ZADD, TIME, ...) alike; the
/// user with every documented grant is ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_command_lockside_needs_refused_in_turn_makes_readyz_name_it() {
    let redis = Redis::start_with_acl();
    let commands = granted();
    assert!(commands.len() >= 30, "{commands:?}");
    let mut sidecars = Vec::new();
    for (i, command) in commands.iter().chain([&String::new()]).enumerate() {
        let ns = namespace();
        let user = format!("lockside{i}");
        let mut rules = least_privilege_rules(&ns, LOCKSIDE_PASSWORD);
        if !command.is_empty() {
            rules.push(format!("-{}", command.to_lowercase().replace(' ', "|")));
        }
        redis.set_user(&user, &rules);
        let url = format!(
            "redis://{user}:{LOCKSIDE_PASSWORD}@127.0.0.1:{}",
            redis.port
        );
        let sidecar = Sidecar::start(make_store(&StoreKind::Redis(url), &ns)).await;
        sidecars.push((command.clone(), sidecar));
    }
    for (command, sidecar) in &sidecars {
        if command.is_empty() {
            ready_as(&sidecar.admin, 200, "ok").await;
            assert!(
                metrics(&sidecar.admin)
                    .await
                    .contains("lockside_store_commands_denied 0\n")
            );
            continue;
        }
        let body = ready_as(&sidecar.admin, 503, "refuses commands Lockside needs").await;
        assert_eq!(refused(&body), std::slice::from_ref(command), "{body}");
        assert!(
            metrics(&sidecar.admin)
                .await
                .contains("lockside_store_commands_denied 1\n")
        );
    }
}

/// A refused command is logged once however many health checks find it, and checked
/// again at the next connection: granted, and the sidecar reconnected, it is ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_command_is_logged_once_and_checked_again_on_reconnect() {
    let redis = Redis::start_with_acl();
    let ns = namespace();
    let mut rules = least_privilege_rules(&ns, LOCKSIDE_PASSWORD);
    rules.push("-hset".into());
    redis.set_user("lockside", &rules);
    let url = format!(
        "redis://lockside:{LOCKSIDE_PASSWORD}@127.0.0.1:{}",
        redis.port
    );
    let dir = TempDir::new("acl");
    let log = dir.0.join("sidecar.log");
    let admin = format!("127.0.0.1:{}", free_port());
    let _sidecar = SidecarProcess::launch(&url, &ns, &["--admin-listen", &admin], &[], Some(&log));
    let body = ready_as(&admin, 503, "refuses commands Lockside needs").await;
    assert_eq!(refused(&body), ["HSET"]);
    health_checks(&admin, 3.0).await;
    assert_eq!(
        lines(&log, "ERROR", "refuses commands Lockside needs"),
        1,
        "logged once"
    );
    assert!(
        !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains(LOCKSIDE_PASSWORD)
    );

    // Granted; the check runs again on the next connection.
    redis.set_user("lockside", &["+hset".to_owned()]);
    assert!(
        redis
            .cli(&["CLIENT", "KILL", "USER", "lockside"])
            .parse::<u32>()
            .is_ok()
    );
    ready_as(&admin, 200, "ok").await;
    assert_eq!(
        lines(&log, "INFO", "allows every command Lockside needs again"),
        1
    );
}

/// Issue 26: a store whose `maxmemory-policy` may evict locks keeps a sidecar unready,
/// says why, sets `lockside_store_evicting` and logs it once; with
/// `--allow-evicting-store` a sidecar serves. The policy fixed, the next connection's
/// check makes the first one ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicting_store_keeps_the_sidecar_unready_unless_allowed() {
    let policy = ["--maxmemory-policy".to_owned(), "allkeys-lru".to_owned()];
    let redis = Redis::start_custom(None, &policy, &[], false);
    let ns = namespace();
    let dir = TempDir::new("evicting");
    let log = dir.0.join("sidecar.log");
    let (strict_admin, allowed_admin) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let strict = ["--admin-listen", strict_admin.as_str()];
    let _strict = SidecarProcess::launch(&redis.url(), &ns, &strict, &[], Some(&log));
    let allowed = [
        "--admin-listen",
        allowed_admin.as_str(),
        "--allow-evicting-store",
    ];
    let allowed = SidecarProcess::launch(&redis.url(), &ns, &allowed, &[], None);

    let body = ready_as(&strict_admin, 503, "maxmemory-policy allkeys-lru").await;
    assert!(body.contains("--allow-evicting-store"), "{body}");
    let text = metrics(&strict_admin).await;
    assert!(text.contains("lockside_store_evicting 1\n") && text.contains("lockside_ready 0\n"));

    ready_as(&allowed_admin, 200, "ok").await;
    let text = metrics(&allowed_admin).await;
    assert!(text.contains("lockside_store_evicting 1\n") && text.contains("lockside_ready 1\n"));
    let mut lease = Client::connect(&allowed.addr).await.lease().await;
    lease.grant("k").await;

    health_checks(&strict_admin, 3.0).await;
    assert_eq!(
        lines(&log, "ERROR", "may evict held locks"),
        1,
        "logged once"
    );

    // Fixed; the check runs again on the next connection.
    assert_eq!(
        redis.cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]),
        "OK"
    );
    assert!(
        redis
            .cli(&["CLIENT", "KILL", "TYPE", "normal"])
            .parse::<u32>()
            .is_ok()
    );
    ready_as(&strict_admin, 200, "ok").await;
    assert!(
        metrics(&strict_admin)
            .await
            .contains("lockside_store_evicting 0\n")
    );
    assert_eq!(lines(&log, "INFO", "no longer evicts"), 1);
}
