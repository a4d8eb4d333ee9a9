//! Leader election from the shell and across sidecars: `lockside elect`, `lockside
//! leader` and `lockside watch` against a sidecar on the memory store, and an election
//! of four candidates on two sidecars of one Redis whose leaders are killed one by one
//! (`on_redis` below).

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::{PATIENCE, Redis, Sidecar, SidecarProcess, StoreKind, make_store, namespace};
use lockside::cli::{EXIT_NO_LEADER, EXIT_UNAVAILABLE};
use lockside::client::{Client, LockOptions, WatchStream};
use lockside::proto::DescribeResponse;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use tokio::time::Instant;
use tokio_stream::StreamExt;

fn lockside(addr: &str, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lockside"));
    command
        .args(args)
        .env("LOCKSIDE_ADDR", addr)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

/// Runs `lockside ARGS` to its end: (exit code, stdout, stderr).
async fn run(addr: &str, args: &[&str]) -> (i32, String, String) {
    let out = tokio::time::timeout(PATIENCE, lockside(addr, args).output())
        .await
        .expect("exits in time")
        .expect("ran");
    (
        out.status.code().expect("an exit code"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A running `lockside` and the lines of its stdout.
struct Running {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Running {
    fn start(addr: &str, args: &[&str]) -> Self {
        let mut child = lockside(addr, args).spawn().expect("spawn lockside");
        let stdout = child.stdout.take().expect("stdout");
        Self {
            child,
            lines: BufReader::new(stdout).lines(),
        }
    }

    async fn line(&mut self) -> String {
        tokio::time::timeout(PATIENCE, self.lines.next_line())
            .await
            .expect("a line in time")
            .expect("stdout readable")
            .expect("a line before the end")
    }

    fn signal(&self, name: &str) {
        common::signal(self.child.id().expect("running"), name);
    }

    async fn status(mut self) -> i32 {
        let status = tokio::time::timeout(PATIENCE, self.child.wait())
            .await
            .expect("exits in time")
            .expect("exit status");
        status.code().expect("an exit code")
    }
}

/// `elect KEY --value VALUE -- CMD` whose CMD prints its key and token, then runs
/// `then` (a shell snippet).
fn candidate(addr: &str, key: &str, value: &str, then: &str) -> Running {
    let script = format!("echo \"$LOCKSIDE_KEY $LOCKSIDE_FENCING_TOKEN\"; {then}");
    Running::start(
        addr,
        &["elect", key, "--value", value, "--", "sh", "-c", &script],
    )
}

fn token_of(line: &str, key: &str) -> u64 {
    let token = line
        .strip_prefix(&format!("{key} "))
        .unwrap_or_else(|| panic!("unexpected line {line:?}"));
    token.parse().expect("a token")
}

/// Waits until `key`'s fair queue has `n` candidates.
async fn queued(client: &Client, key: &str, n: usize) {
    tokio::time::timeout(PATIENCE, async {
        while client.describe(key).await.expect("describe").queue.len() < n {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the candidates queue in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elect_runs_the_command_while_leading_and_leader_names_the_leader() {
    let sidecar = Sidecar::start(make_store(&StoreKind::Memory, "ns")).await;
    let addr = sidecar.addr.clone();
    let client = Client::connect(&addr).await.expect("connect");
    assert_eq!(
        run(&addr, &["leader", "jobs"]).await,
        (3, String::new(), String::new())
    );
    assert_eq!(EXIT_NO_LEADER, 3);

    let mut first = candidate(&addr, "jobs", "web-1:8080", "exec sleep 30");
    let token = token_of(&first.line().await, "jobs");
    assert_eq!(run(&addr, &["leader", "jobs"]).await.1, "web-1:8080\n");
    let second = candidate(&addr, "jobs", "web-2:8080", "exit 7");
    queued(&client, "jobs", 1).await;
    assert_eq!(
        run(&addr, &["leader", "jobs"]).await.1,
        "web-1:8080\n",
        "still the first"
    );

    // SIGTERM reaches the first leader's command; its end hands leadership on.
    first.signal("TERM");
    assert_eq!(first.status().await, 128 + 15);
    let mut second = second;
    let next = token_of(&second.line().await, "jobs");
    assert!(next > token, "{next} > {token}");
    assert_eq!(second.status().await, 7, "the command's status");
    let (code, out, _) = run(&addr, &["leader", "jobs"]).await;
    assert_eq!((code, out.as_str()), (i32::from(EXIT_NO_LEADER), ""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_prints_one_line_per_state_until_interrupted() {
    let sidecar = Sidecar::start(make_store(&StoreKind::Memory, "ns")).await;
    let addr = sidecar.addr.clone();
    let client = Client::connect(&addr).await.expect("connect");
    let mut text = Running::start(&addr, &["watch", "jobs"]);
    let mut json = Running::start(&addr, &["watch", "jobs", "--json"]);
    assert_eq!(text.line().await, "free");
    let first: serde_json::Value = serde_json::from_str(&json.line().await).expect("json");
    assert_eq!(
        (
            first["key"].as_str(),
            first["holders"].as_array().map(Vec::len)
        ),
        (Some("jobs"), Some(0))
    );

    let leader = client
        .campaign("jobs", b"10.0.0.7:8080")
        .await
        .expect("leads");
    let token = leader.fencing_token();
    let line = text.line().await;
    assert!(
        line.starts_with("held exclusive: session ")
            && line.ends_with(&format!("token {token} value \"10.0.0.7:8080\"")),
        "{line}"
    );
    let state: serde_json::Value = serde_json::from_str(&json.line().await).expect("json");
    assert_eq!(state["holders"][0]["value"], "10.0.0.7:8080");
    assert_eq!(state["holders"][0]["fencing_token"], token);
    leader.resign().await.expect("resign");
    assert_eq!(text.line().await, format!("free; last token {token}"));

    text.signal("INT");
    json.signal("TERM");
    assert_eq!(text.status().await, 0);
    assert_eq!(json.status().await, 0);

    let (code, _, err) = run(&addr, &["watch", ""]).await;
    assert_eq!(code, i32::from(EXIT_UNAVAILABLE));
    assert!(
        err.starts_with("lockside watch: rejected: invalid argument"),
        "{err}"
    );
    let (code, _, err) = run("127.0.0.1:1", &["leader", "jobs"]).await;
    assert_eq!(code, i32::from(EXIT_UNAVAILABLE));
    assert!(err.contains("cannot reach the sidecar"), "{err}");
}

/// The two-sidecar election runs on Redis: the memory store cannot be shared.
mod on_redis {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn four_candidates_on_two_sidecars_lead_in_turn_as_leaders_die() {
        super::four_candidates_on_two_sidecars_lead_in_turn_as_leaders_die().await;
    }
}

/// One state as a watcher saw it, and when.
struct Seen {
    at: Instant,
    state: DescribeResponse,
}

/// Forwards a watch's states, with when they came, until the watch ends.
fn record(mut states: WatchStream) -> tokio::sync::mpsc::UnboundedReceiver<Seen> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(state)) = states.next().await {
            if tx
                .send(Seen {
                    at: Instant::now(),
                    state,
                })
                .is_err()
            {
                return;
            }
        }
    });
    rx
}

/// The states a watcher saw until (and with) the one `done` accepts, or until its
/// watch ended.
async fn seen_until(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<Seen>,
    done: impl Fn(&DescribeResponse) -> bool,
) -> Vec<Seen> {
    let mut seen = Vec::new();
    while let Some(s) = tokio::time::timeout(PATIENCE, rx.recv())
        .await
        .expect("states in time")
    {
        let last = done(&s.state);
        seen.push(s);
        if last {
            break;
        }
    }
    seen
}

/// Checks what one watcher saw: never two leaders at once, leaders in `order` (by
/// value) with increasing tokens, each leader seen once (a run of states), and the
/// key free at the end.
fn check_leaders(seen: &[Seen], order: &[&str], who: &str) {
    let mut leaders: Vec<(String, u64)> = Vec::new();
    for s in seen {
        assert!(
            s.state.holders.len() <= 1,
            "{who}: two leaders at once: {:?}",
            s.state
        );
        let Some(h) = s.state.holders.first() else {
            continue;
        };
        let value = String::from_utf8_lossy(&h.value).into_owned();
        if leaders
            .last()
            .is_none_or(|(_, token)| *token != h.fencing_token)
        {
            leaders.push((value, h.fencing_token));
        }
    }
    let values: Vec<&str> = leaders.iter().map(|(v, _)| v.as_str()).collect();
    assert_eq!(values, order, "{who}: leaders in campaign order");
    assert!(
        leaders.windows(2).all(|w| w[0].1 < w[1].1),
        "{who}: tokens increase: {leaders:?}"
    );
}

/// Four candidates campaign in turn on two sidecars of one Redis (c1, c3 on A; c2, c4
/// on B); a watcher on each sidecar records every state. The leaders go one by one:
/// c1 closes its stream (the next leads at once), c2's process is SIGKILLed (its
/// sidecar sees the stream break and releases at once), c3's sidecar A is SIGKILLed
/// (its lock stays until its TTL: watchers on B see c3 gone at its expiry, not
/// before, and c4 leads then), c4 resigns.
#[allow(dead_code)]
async fn four_candidates_on_two_sidecars_lead_in_turn_as_leaders_die() {
    const KEY: &str = "election";
    const TTL: Duration = Duration::from_secs(2);
    let redis = Redis::start();
    let ns = namespace();
    let mut sidecar_a = SidecarProcess::start(&redis.url(), &ns, &[]);
    let sidecar_b = Sidecar::start(make_store(&StoreKind::Redis(redis.url()), &ns)).await;
    let on_a = Client::connect(&sidecar_a.addr).await.expect("connect A");
    let on_b = Client::connect(&sidecar_b.addr).await.expect("connect B");
    let mut watch_a = record(on_a.watch(KEY).await.expect("watch on A"));
    let mut watch_b = record(on_b.watch(KEY).await.expect("watch on B"));
    let options = |value: &str| LockOptions {
        wait: Some(Duration::from_secs(60)),
        ttl: Some(TTL),
        value: value.as_bytes().to_vec(),
        ..LockOptions::default()
    };

    let c1 = on_a
        .campaign_with(KEY, options("c1"))
        .await
        .expect("c1 leads");
    // c2: `lockside elect` on B, a process of its own; CMD lives as long as it does.
    let mut c2 = candidate(
        &sidecar_b.addr,
        KEY,
        "c2",
        "while kill -0 $PPID 2>/dev/null; do sleep 0.05; done",
    );
    queued(&on_b, KEY, 1).await;
    let c3 = {
        let on_a = on_a.clone();
        let options = options("c3");
        tokio::spawn(async move { on_a.campaign_with(KEY, options).await })
    };
    queued(&on_b, KEY, 2).await;
    let c4 = {
        let on_b = on_b.clone();
        let options = options("c4");
        tokio::spawn(async move { on_b.campaign_with(KEY, options).await })
    };
    queued(&on_b, KEY, 3).await;

    // c1 closes its stream: c2 leads at once.
    let dropped = Instant::now();
    drop(c1);
    let c2_token = token_of(&c2.line().await, KEY);
    assert!(
        dropped.elapsed() < Duration::from_secs(1),
        "c2 led {:?} after c1 left",
        dropped.elapsed()
    );

    // c2's process dies: its sidecar sees the stream break and c3 leads at once.
    let killed = Instant::now();
    c2.signal("KILL");
    let c3 = tokio::time::timeout(PATIENCE, c3)
        .await
        .expect("c3 leads in time")
        .expect("task")
        .expect("c3 leads");
    assert!(c3.fencing_token() > c2_token);
    assert!(
        killed.elapsed() < Duration::from_secs(1),
        "c3 led {:?} after c2 died",
        killed.elapsed()
    );

    // c3's sidecar dies: its lock stays in Redis until its expiry. A renewal between
    // this reading and the kill only moves the expiry later: `expiry` is a lower
    // bound, and the kill plus one TTL an upper one.
    let left = on_b.describe(KEY).await.expect("describe").holders[0]
        .ttl_remaining
        .and_then(|d| Duration::try_from(d).ok())
        .expect("a ttl");
    let expiry = Instant::now() + left;
    sidecar_a.kill();
    let latest_expiry = Instant::now() + TTL;
    let c4 = tokio::time::timeout(PATIENCE, c4)
        .await
        .expect("c4 leads in time")
        .expect("task")
        .expect("c4 leads");
    let led = Instant::now();
    assert!(c4.fencing_token() > c3.fencing_token());
    assert!(
        led + Duration::from_millis(5) >= expiry,
        "c4 led {:?} before c3's lock expired",
        expiry - led
    );
    let (c3_token, c4_token) = (c3.fencing_token(), c4.fencing_token());
    c4.resign().await.expect("c4 resigns");

    // The watcher on B saw every leader, and c3 gone at its expiry, not before.
    let last = c4_token;
    let seen_b = seen_until(&mut watch_b, |state| {
        state.holders.is_empty() && state.fencing_token == last
    })
    .await;
    check_leaders(&seen_b, &["c1", "c2", "c3", "c4"], "the watcher on B");
    let c3_gone = seen_b
        .iter()
        .skip_while(|s| {
            s.state
                .holders
                .first()
                .is_none_or(|h| h.fencing_token != c3_token)
        })
        .find(|s| {
            s.state
                .holders
                .first()
                .is_none_or(|h| h.fencing_token != c3_token)
        })
        .expect("c3 seen gone");
    assert!(
        c3_gone.at + Duration::from_millis(5) >= expiry,
        "c3 seen gone {:?} before its expiry",
        expiry - c3_gone.at
    );
    assert!(
        c3_gone.at <= latest_expiry + Duration::from_millis(300),
        "c3 seen gone {:?} after its latest expiry",
        c3_gone.at - latest_expiry
    );
    // The watcher on A died with A, after c3 led.
    let seen_a = seen_until(&mut watch_a, |_| false).await;
    check_leaders(&seen_a, &["c1", "c2", "c3"], "the watcher on A");
    drop(c3);
}
