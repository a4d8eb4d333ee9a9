//! `lockside hold`, `lockside describe` and the Rust client (`lockside::client`),
//! against real sidecars: exit statuses, the environment of CMD, forwarded signals, and
//! CMD stopped when the lock is lost.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::{PATIENCE, Redis, Sidecar, StoreKind, TempDir, make_store, namespace};
use lockside::cli::{EXIT_LOST, EXIT_NOT_ACQUIRED, EXIT_UNAVAILABLE};
use lockside::client::{Client, ClientError, LockOptions, NotAcquired};
use tokio::process::{Child, Command};
use tokio::time::Instant;

fn hold(addr: &str, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lockside"));
    command
        .arg("hold")
        .args(args)
        .env("LOCKSIDE_ADDR", addr)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    command
}

async fn status(mut child: Child) -> i32 {
    let status = tokio::time::timeout(PATIENCE, child.wait())
        .await
        .expect("hold exits in time")
        .expect("hold ran");
    status.code().expect("an exit code")
}

async fn run(addr: &str, args: &[&str]) -> i32 {
    status(hold(addr, args).spawn().expect("spawn hold")).await
}

/// Runs `lockside SUBCOMMAND ARGS` against `addr`: (exit code, stdout, stderr).
async fn words(addr: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_lockside"))
        .args(args)
        .env("LOCKSIDE_ADDR", addr)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(PATIENCE, out)
        .await
        .expect("exits in time")
        .expect("ran");
    (
        out.status.code().expect("an exit code"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Waits until `key` has a holder (a `hold` process has its lock).
async fn held(client: &Client, key: &str) {
    tokio::time::timeout(PATIENCE, async {
        while client
            .describe(key)
            .await
            .expect("describe")
            .holders
            .is_empty()
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the lock is taken in time");
}

/// Whether nobody holds `key`.
async fn free(client: &Client, key: &str) -> bool {
    client
        .describe(key)
        .await
        .expect("describe")
        .holders
        .is_empty()
}

async fn memory_sidecar() -> (Sidecar, Client) {
    let sidecar = Sidecar::start(make_store(&StoreKind::Memory, "ns")).await;
    let client = Client::connect(&sidecar.addr).await.expect("connect");
    (sidecar, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_runs_with_the_token_and_its_status_passes_through() {
    let (sidecar, client) = memory_sidecar().await;
    let dir = TempDir::new("hold");
    let out = dir.0.join("env");
    let script = format!(
        "echo \"$LOCKSIDE_KEY $LOCKSIDE_FENCING_TOKEN\" > {}; exit 7",
        out.display()
    );
    assert_eq!(
        run(&sidecar.addr, &["jobs/nightly", "--", "sh", "-c", &script]).await,
        7
    );
    let written = std::fs::read_to_string(&out).expect("the command ran");
    let state = client.describe("jobs/nightly").await.expect("describe");
    assert_eq!(
        written.trim(),
        format!("jobs/nightly {}", state.fencing_token)
    );
    assert!(state.holders.is_empty(), "released when the command exited");
    assert_eq!(run(&sidecar.addr, &["k", "--", "true"]).await, 0);
    assert_eq!(
        run(&sidecar.addr, &["k", "--", "/no/such/command"]).await,
        127
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_is_held_while_the_command_runs() {
    let (sidecar, client) = memory_sidecar().await;
    let child = hold(&sidecar.addr, &["k", "--", "sleep", "0.5"])
        .spawn()
        .expect("spawn");
    held(&client, "k").await;
    let busy = client.lock_with("k", LockOptions::default()).await;
    assert!(matches!(busy, Err(ClientError::NotAcquired(_))), "{busy:?}");
    assert_eq!(status(child).await, 0);
    assert!(free(&client, "k").await, "released after the command");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_acquired_in_time_and_no_sidecar_have_their_own_statuses() {
    let (sidecar, client) = memory_sidecar().await;
    let _lock = client.lock("k").await.expect("lock");
    let started = Instant::now();
    let code = run(&sidecar.addr, &["k", "--wait", "200ms", "--", "true"]).await;
    assert_eq!(code, i32::from(EXIT_NOT_ACQUIRED));
    assert!(started.elapsed() >= Duration::from_millis(200));
    let nowhere = format!("127.0.0.1:{}", common::free_port());
    assert_eq!(
        run(&nowhere, &["k", "--", "true"]).await,
        i32::from(EXIT_UNAVAILABLE)
    );
    assert_eq!(
        run(&sidecar.addr, &["k"]).await,
        64,
        "no command: a usage error"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_are_forwarded_to_the_command() {
    let (sidecar, client) = memory_sidecar().await;
    // The command says when its trap is set, so the signal cannot come before it.
    let dir = common::TempDir::new("hold-signals");
    let ready = dir.0.join("ready");
    let script = format!(
        "trap 'exit 42' TERM; touch {}; while true; do sleep 0.05; done",
        ready.display()
    );
    let child = hold(&sidecar.addr, &["k", "--", "sh", "-c", &script])
        .spawn()
        .expect("spawn");
    held(&client, "k").await;
    let trapped = async {
        while !ready.exists() {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(common::PATIENCE, trapped)
        .await
        .expect("the command set its trap");
    let pid = child.id().expect("pid").to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill")
            .success()
    );
    assert_eq!(
        status(child).await,
        42,
        "the command's own answer to SIGTERM"
    );
    assert!(free(&client, "k").await, "released after the command");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_stops_the_command() {
    let mut redis = Redis::start();
    let sidecar = Sidecar::start(make_store(&StoreKind::Redis(redis.url()), &namespace())).await;
    let client = Client::connect(&sidecar.addr).await.expect("connect");
    // The command ignores SIGTERM, so it takes the SIGKILL after --kill-grace.
    let script = "trap '' TERM; exec sleep 30";
    let args = [
        "k",
        "--ttl",
        "1s",
        "--kill-grace",
        "300ms",
        "--",
        "sh",
        "-c",
        script,
    ];
    let child = hold(&sidecar.addr, &args)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    held(&client, "k").await;
    let stopped = Instant::now();
    redis.kill();
    let out = tokio::time::timeout(PATIENCE, child.wait_with_output())
        .await
        .expect("hold exits in time")
        .expect("hold ran");
    assert_eq!(out.status.code(), Some(i32::from(EXIT_LOST)));
    let took = stopped.elapsed();
    assert!(
        took < Duration::from_secs(3),
        "lost within the 1 s TTL, killed 0.3 s later: {took:?}"
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "lockside hold: lost the lock on k (renewal not confirmed before the safe deadline); \
         stopping the command: SIGTERM, then SIGKILL after 300ms\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_client_holds_releases_and_notices_loss() {
    let mut redis = Redis::start();
    let sidecar = Sidecar::start(make_store(&StoreKind::Redis(redis.url()), &namespace())).await;
    let client = Client::connect(&sidecar.addr).await.expect("connect");
    let first = client.lock("k").await.expect("lock");
    assert_eq!(first.key(), "k");
    let busy = client.lock_with("k", LockOptions::default()).await;
    assert!(
        matches!(busy, Err(ClientError::NotAcquired(NotAcquired::Busy))),
        "{busy:?}"
    );
    let token = first.fencing_token();
    first.release().await.expect("release");
    // Dropping a guard releases its lock too.
    let second = client.lock("k").await.expect("lock again");
    assert!(second.fencing_token() > token);
    drop(second);
    let options = LockOptions {
        wait: Some(Duration::from_secs(5)),
        ttl: Some(Duration::from_secs(1)),
        ..LockOptions::default()
    };
    let third = client
        .lock_with("k", options)
        .await
        .expect("lock after drop");
    assert!(!third.is_lost());
    redis.kill();
    tokio::time::timeout(PATIENCE, third.lost())
        .await
        .expect("lost() completes when the store is gone");
    assert!(third.is_lost());
    assert!(matches!(third.release().await, Err(ClientError::Lost)));
    let bad = client.lock_with("", LockOptions::default()).await;
    assert!(
        matches!(bad, Err(ClientError::Rejected { code: 3, .. })),
        "{bad:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_prints_the_holders() {
    let (sidecar, client) = memory_sidecar().await;
    let _lock = client.lock("k").await.expect("lock");
    let out = Command::new(env!("CARGO_BIN_EXE_lockside"))
        .args(["describe", "k", "--addr", &sidecar.addr])
        .output()
        .await
        .expect("describe");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let state = client.describe("k").await.expect("describe");
    let holder = &state.holders[0];
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "key: k");
    assert_eq!(lines[1], "state: held exclusive");
    assert!(
        lines[2].starts_with(&format!(
            "holder: session {} (unnamed), 1 hold, token {}, expires in ",
            holder.session_id, holder.fencing_token
        )) && lines[2].ends_with("s unless renewed"),
        "{text}"
    );
    assert_eq!(lines[3], "waiting: 0");
    assert_eq!(
        lines[4],
        format!("last fencing token: {}", state.fencing_token)
    );
    assert!(
        !text.contains("LOCK_MODE") && !text.contains("EXCLUSIVE"),
        "{text}"
    );
    let (code, free, _) = words(&sidecar.addr, &["describe", "nobody-holds-this"]).await;
    assert_eq!(code, 0);
    assert_eq!(
        free,
        "key: nobody-holds-this\nstate: free\nwaiting: 0\nlast fencing token: none yet\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_speaks_in_words_not_enum_names() {
    let (sidecar, client) = memory_sidecar().await;
    let _lock = client.lock("k").await.expect("lock");
    let addr = sidecar.addr.as_str();
    let (code, _, stderr) = words(addr, &["hold", "k", "--wait", "100ms", "--", "true"]).await;
    assert_eq!(code, i32::from(EXIT_NOT_ACQUIRED));
    assert_eq!(
        stderr,
        "lockside hold: not acquired: timed out after 100ms\n"
    );
    let (code, _, stderr) = words(addr, &["hold", "k", "--wait", "0s", "--", "true"]).await;
    assert_eq!(code, i32::from(EXIT_NOT_ACQUIRED));
    assert_eq!(stderr, "lockside hold: not acquired: busy\n");
    let (code, _, stderr) = words(addr, &["hold", "", "--", "true"]).await;
    assert_eq!(code, i32::from(EXIT_UNAVAILABLE));
    assert_eq!(
        stderr,
        "lockside hold: rejected: invalid argument: key must not be empty\n"
    );
    let (code, _, stderr) = words(addr, &["hold", "free", "--", "/no/such/command"]).await;
    assert_eq!(code, 127);
    assert!(
        stderr.starts_with("lockside hold: cannot start /no/such/command: "),
        "{stderr}"
    );
    let (code, _, stderr) = words(addr, &["describe", ""]).await;
    assert_eq!(code, i32::from(EXIT_UNAVAILABLE));
    assert_eq!(
        stderr,
        "lockside describe: rejected: invalid argument: key must not be empty\n"
    );
    let nowhere = format!("127.0.0.1:{}", common::free_port());
    for command in [
        &["hold", "k", "--", "true"][..],
        &["describe", "k"],
        &["healthcheck"],
    ] {
        let (code, _, stderr) = words(&nowhere, command).await;
        let expected = format!(
            "lockside {}: cannot reach the sidecar at {nowhere}: connection refused\n",
            command[0]
        );
        assert_eq!(stderr, expected);
        assert_ne!(code, 0);
    }
    let (code, stdout, stderr) = words(addr, &["healthcheck"]).await;
    assert_eq!((code, stderr.as_str()), (0, ""));
    assert_eq!(stdout, "serving\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_while_waiting_ends_hold_without_running_the_command() {
    let (sidecar, client) = memory_sidecar().await;
    let holder = client.lock("k").await.expect("lock");
    let dir = TempDir::new("hold-wait");
    let ran = dir.0.join("ran");
    let script = format!("touch {}", ran.display());
    let child = hold(&sidecar.addr, &["k", "--", "sh", "-c", &script])
        .spawn()
        .expect("spawn");
    // Waiting: the hold process is registered behind the holder.
    tokio::time::timeout(PATIENCE, async {
        while client.describe("k").await.expect("describe").waiters == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("hold waits");
    let pid = child.id().expect("pid").to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status();
    assert!(killed.expect("kill").success());
    assert_eq!(status(child).await, 143, "128 + SIGTERM, like a shell");
    // The sidecar sees the killed hold's stream end a moment after hold has exited; a
    // release before then would hand the lock to that dying waiter for as long.
    tokio::time::timeout(PATIENCE, async {
        while client.describe("k").await.expect("describe").waiters > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the killed hold's wait ends with it");
    holder.release().await.expect("release");
    assert!(!ran.exists(), "the command never ran");
    assert!(free(&client, "k").await, "nothing left behind");
}

/// `lockside hold` across a sidecar restart shorter than the TTL: the sidecar is
/// SIGKILLed 1 s into CMD and restarted on the same address only once CMD is seen
/// stopped (SIGSTOP, state `T`): the break stops it, whatever the restart takes. It goes
/// on (SIGCONT) once `hold` has resumed its session there, and its status comes through,
/// not 77. Default TTL and attachment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_stops_the_command_while_suspended_and_resumes_it_across_a_sidecar_restart() {
    let redis = Redis::start();
    let ns = namespace();
    let dir = TempDir::new("hold-stop");
    let ticks = dir.0.join("ticks");
    let pid_file = dir.0.join("pid");
    let mut sidecar = common::SidecarProcess::start(&redis.url(), &ns, &[]);
    let addr = sidecar.addr.clone();
    // CMD writes its pid, then the time (ns) every 10 ms for 5 s.
    let script = format!(
        "echo $$ > {}; end=$(( $(date +%s) + 5 )); while [ $(date +%s) -lt $end ]; do \
         date +%s%N >> {}; sleep 0.01; done; exit 3",
        pid_file.display(),
        ticks.display()
    );
    let child = hold(&addr, &["k", "--", "sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let client = Client::connect(&addr).await.expect("connect");
    held(&client, "k").await;
    let token = client.describe("k").await.expect("describe").fencing_token;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let cmd_pid = std::fs::read_to_string(&pid_file).expect("CMD wrote its pid");
    let stat = format!("/proc/{}/stat", cmd_pid.trim());
    assert!(!stopped(&stat), "CMD runs while the session is attached");
    sidecar.kill();
    tokio::time::timeout(PATIENCE, async {
        while !stopped(&stat) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("CMD is stopped once the stream breaks");
    let restarted = common::SidecarProcess::start_at(&addr, &redis.url(), &ns, &[]);
    // Held all along: nobody else gets it on the restarted sidecar.
    let other = Client::connect(&restarted.addr).await.expect("connect");
    let busy = other.lock_with("k", LockOptions::default()).await;
    assert!(
        matches!(busy, Err(ClientError::NotAcquired(NotAcquired::Busy))),
        "{busy:?}"
    );
    let out = tokio::time::timeout(PATIENCE, child.wait_with_output())
        .await
        .expect("hold exits in time")
        .expect("hold ran");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(3),
        "CMD's status, not {EXIT_LOST}: {stderr}"
    );
    assert!(
        stderr.contains("SIGSTOP") && stderr.contains("goes on"),
        "{stderr}"
    );
    let state = other.describe("k").await.expect("describe");
    assert!(state.holders.is_empty(), "released when CMD exited");
    assert_eq!(state.fencing_token, token, "the same grant all along");
    // CMD went on after the restart: a stopped process cannot reach its `exit 3`
    // (asserted above), and `hold` said so ("goes on"). Its ticks need not show it: a
    // slow restart can outlast the rest of CMD's five seconds.
}

/// Whether the process of a `/proc/PID/stat` is stopped (state `T`).
fn stopped(stat: &str) -> bool {
    let text = std::fs::read_to_string(stat).expect("CMD is alive");
    // The state follows the command name, which is in parentheses.
    let after = &text[text.rfind(')').expect("stat") + 1..];
    after.split_whitespace().next() == Some("T")
}

/// Issue 25: a lock whose sidecar dies is suspended at once (a live sidecar would have
/// released it already), and lost once its TTL has passed without the session coming
/// back (the store has surely let it go by then), not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_client_suspends_at_once_and_loses_a_lock_whose_sidecar_does_not_come_back() {
    use lockside::client::LockState;
    let redis = Redis::start();
    let mut sidecar = common::SidecarProcess::start(&redis.url(), &namespace(), &[]);
    let client = Client::connect(&sidecar.addr).await.expect("connect");
    let ttl = Duration::from_secs(2);
    let options = LockOptions {
        ttl: Some(ttl),
        ..LockOptions::default()
    };
    let lock = client.lock_with("k", options).await.expect("lock");
    let mut states = lock.states();
    let killed = Instant::now();
    sidecar.kill();
    tokio::time::timeout(PATIENCE, states.changed())
        .await
        .expect("a change in time")
        .expect("the reader reports");
    assert_eq!(*states.borrow_and_update(), LockState::Suspended);
    let suspended = killed.elapsed();
    assert!(
        suspended < Duration::from_millis(500),
        "suspended after {suspended:?}"
    );
    tokio::time::timeout(PATIENCE, lock.lost())
        .await
        .expect("lost in time");
    let took = killed.elapsed();
    assert!(
        took >= ttl && took < ttl + Duration::from_millis(700),
        "lost {took:?} after the kill; the TTL is {ttl:?}"
    );
    let why = lock.lost_reason().expect("a reason");
    assert!(why.contains("not resumed"), "{why}");
}

/// A leader elected through the Rust client keeps leading across a sidecar restart
/// (SIGKILL, then the same address): a proclaim sent while the sidecar is down is
/// answered once the session is resumed, the value and the token are the grant's own,
/// and resigning hands the key back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_proclaims_and_resigns_across_a_sidecar_restart() {
    let redis = Redis::start();
    let ns = namespace();
    let mut sidecar = common::SidecarProcess::start(&redis.url(), &ns, &[]);
    let addr = sidecar.addr.clone();
    let client = Client::connect(&addr).await.expect("connect");
    let leader = client.campaign("jobs", b"a").await.expect("lead");
    let token = leader.fencing_token();
    journaled(&redis, &ns, "jobs").await;
    sidecar.kill();
    let proclaimed = leader.proclaim(b"b");
    let restarted = common::SidecarProcess::start_at(&addr, &redis.url(), &ns, &[]);
    tokio::time::timeout(PATIENCE, proclaimed)
        .await
        .expect("answered in time")
        .expect("proclaimed on the resumed session");
    assert!(!leader.is_lost(), "{:?}", leader.lost_reason());
    let other = Client::connect(&restarted.addr).await.expect("connect");
    let state = other.describe("jobs").await.expect("describe");
    assert_eq!(state.fencing_token, token, "the same grant");
    assert_eq!(state.holders.len(), 1, "{state:?}");
    assert_eq!(state.holders[0].value, b"b");
    leader.resign().await.expect("resigned");
    let state = other.describe("jobs").await.expect("describe");
    assert!(state.holders.is_empty(), "{state:?}");
}

/// Waits until a session record of namespace `ns` lists `key` (the journal writes a
/// grant once it has been held 50 ms): until then a killed sidecar's lock cannot come
/// back.
async fn journaled(redis: &Redis, ns: &str, key: &str) {
    let deadline = Instant::now() + PATIENCE;
    let field = format!("k:{key}");
    loop {
        let records = redis.cli(&["keys", &format!("{{{ns}:session/*")]);
        if records
            .lines()
            .any(|record| redis.cli(&["hexists", record, &field]) == "1")
        {
            return;
        }
        assert!(Instant::now() < deadline, "{key} never journaled");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Issue 24: nothing listens at the address: `hold` fails at once, naming the address
/// and the cause; with `--wait-for-sidecar` it says once that it waits, and runs CMD
/// as soon as a sidecar listens there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_sidecar_fails_at_once_unless_asked_to_wait_for_one() {
    let nowhere = format!("127.0.0.1:{}", common::free_port());
    let started = Instant::now();
    let out = hold(&nowhere, &["k", "--", "true"])
        .stderr(Stdio::piped())
        .output()
        .await
        .expect("hold ran");
    assert!(started.elapsed() < Duration::from_secs(1), "at once");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains(&nowhere) && said.contains("connection refused"),
        "{said}"
    );
    let mut child = hold(&nowhere, &["k", "--wait-for-sidecar", "20s", "--", "true"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // Once it says it waits, a sidecar starts on that address: an app that starts
    // before its sidecar.
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
    let mut first = String::new();
    tokio::time::timeout(PATIENCE, stderr.read_line(&mut first))
        .await
        .expect("a line in time")
        .expect("read");
    assert!(first.contains("waiting for the sidecar"), "{first}");
    let _sidecar = common::SidecarProcess::start_at(&nowhere, "memory", &namespace(), &[]);
    let status = tokio::time::timeout(PATIENCE, child.wait())
        .await
        .expect("hold exits in time")
        .expect("hold ran");
    let mut rest = String::new();
    stderr.read_to_string(&mut rest).await.expect("read");
    assert_eq!(status.code(), Some(0), "{first}{rest}");
    assert!(
        !rest.contains("waiting for the sidecar"),
        "said once: {rest}"
    );
}

/// Issue 28: the CLI explains itself. `--help` lists the exit statuses; a negative
/// wait is refused as such (clap would suggest `-- -1s`); the command may follow the
/// key without `--`; `--client-name` names the holder in `describe`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_explains_itself() {
    let (sidecar, client) = memory_sidecar().await;
    let (code, help, _) = words(&sidecar.addr, &["hold", "--help"]).await;
    assert_eq!(code, 0);
    assert!(
        help.contains("Exit statuses") && help.contains("77"),
        "{help}"
    );
    let (code, _, said) = words(&sidecar.addr, &["hold", "x", "--wait", "-1s", "--", "true"]).await;
    assert_eq!(code, 64);
    assert!(
        said.contains("cannot be negative") && !said.contains("-- -1"),
        "{said}"
    );
    assert_eq!(
        run(&sidecar.addr, &["k1", "true"]).await,
        0,
        "no `--` needed"
    );
    let child = hold(
        &sidecar.addr,
        &["k2", "--client-name", "web-1", "--", "sleep", "30"],
    )
    .spawn()
    .expect("spawn");
    held(&client, "k2").await;
    let state = client.describe("k2").await.expect("describe");
    assert_eq!(state.holders[0].client_name, "web-1");
    drop(child);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_keys_are_taken_together_with_each_token_numbered_in_the_environment() {
    let (sidecar, client) = memory_sidecar().await;
    let dir = TempDir::new("hold-several");
    let out = dir.0.join("env");
    let script = format!(
        "echo \"$LOCKSIDE_KEY_COUNT $LOCKSIDE_KEY_1=$LOCKSIDE_FENCING_TOKEN_1 \
         $LOCKSIDE_KEY_2=$LOCKSIDE_FENCING_TOKEN_2 $LOCKSIDE_KEY_3=$LOCKSIDE_FENCING_TOKEN_3 \
         ${{LOCKSIDE_FENCING_TOKEN-none}}\" > {}; exit 3",
        out.display()
    );
    let args = [
        "acct/alice",
        "--key",
        "acct/bob",
        "--key",
        "acct/carol",
        "--",
        "sh",
        "-c",
        &script,
    ];
    assert_eq!(run(&sidecar.addr, &args).await, 3);
    let written = std::fs::read_to_string(&out).expect("the command ran");
    let mut expected = vec!["3".to_owned()];
    for key in ["acct/alice", "acct/bob", "acct/carol"] {
        let state = client.describe(key).await.expect("describe");
        assert!(
            state.holders.is_empty(),
            "{key} released when the command exited"
        );
        assert!(state.fencing_token > 0, "{key} was granted");
        expected.push(format!("{key}={}", state.fencing_token));
    }
    expected.push("none".into());
    assert_eq!(written.trim(), expected.join(" "));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_keys_are_all_or_none() {
    let (sidecar, client) = memory_sidecar().await;
    let bob = client.lock("acct/bob").await.expect("lock");
    let args = [
        "acct/alice",
        "--key",
        "acct/bob",
        "--wait",
        "100ms",
        "--",
        "true",
    ];
    assert_eq!(
        run(&sidecar.addr, &args).await,
        i32::from(EXIT_NOT_ACQUIRED)
    );
    assert!(
        free(&client, "acct/alice").await,
        "nothing taken of a set not free"
    );
    drop(bob);
    let child = hold(
        &sidecar.addr,
        &["acct/alice", "--key", "acct/bob", "--", "sleep", "0.5"],
    )
    .spawn()
    .expect("spawn");
    held(&client, "acct/alice").await;
    let busy = client.lock_with("acct/bob", LockOptions::default()).await;
    assert!(matches!(busy, Err(ClientError::NotAcquired(_))), "{busy:?}");
    assert_eq!(status(child).await, 0);
    assert!(free(&client, "acct/bob").await && free(&client, "acct/alice").await);
    let (code, _, err) = words(
        &sidecar.addr,
        &["hold", "a", "--key", "b", "--limit", "3", "--", "true"],
    )
    .await;
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("--limit is for one key"), "{err}");
    let (code, _, err) = words(&sidecar.addr, &["hold", "a", "--key", "a", "--", "true"]).await;
    assert_eq!(code, i32::from(EXIT_UNAVAILABLE), "{err}");
    assert!(
        err.contains("twice"),
        "a refused set is said in words: {err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_of_several_lost_stops_the_command_and_releases_the_others() {
    let redis = Redis::start();
    let ns = namespace();
    let sidecar = Sidecar::start(make_store(&StoreKind::Redis(redis.url()), &ns)).await;
    let client = Client::connect(&sidecar.addr).await.expect("connect");
    let args = [
        "left",
        "--key",
        "right",
        "--ttl",
        "1s",
        "--kill-grace",
        "300ms",
        "--",
        "sleep",
        "30",
    ];
    let child = hold(&sidecar.addr, &args)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    held(&client, "right").await;
    // The store forgets "right" (its every part): its next renewal fails.
    let parts = redis.cli(&["--scan", "--pattern", &format!("{{{ns}:right}}:*")]);
    for part in parts.lines().filter(|l| !l.is_empty()) {
        redis.cli(&["del", part]);
    }
    let out = tokio::time::timeout(PATIENCE, child.wait_with_output())
        .await
        .expect("hold exits in time")
        .expect("hold ran");
    assert_eq!(out.status.code(), Some(i32::from(EXIT_LOST)));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("lockside hold: lost the lock on right ("),
        "{err}"
    );
    assert!(free(&client, "left").await, "the other key released");
}
