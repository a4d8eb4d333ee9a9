//! Every language at once: a Rust client, the Python, Node and Go packages (as built
//! from `clients/`), and two `lockside hold` loops compete for one key
//! through one sidecar on Redis. Each records its holding intervals (CLOCK_MONOTONIC
//! ns, one clock for all processes here) and fencing tokens; the checker finds 0
//! overlaps and strictly increasing tokens.
//!
//! And an election across them: every language (and `lockside elect`) campaigns for one
//! key in turn while every language (and `lockside watch`) watches it; leaders never
//! overlap, tokens increase, and every watcher sees the leaders in order.
//!
//! The packages must be built and installed first: `bash clients/prepare.sh` and `bash
//! clients/go/ci.sh build` (`.ci/run` does both). The Python and Node programs are
//! `tests/fixtures/clients/{contend,elect}.{py,cjs}`, run with the venv's Python and
//! with NODE_PATH on the installed tarball; Go's are modes of the Go package's
//! `clients/go/cmd/lockside-example`, built into `clients/go/bin`.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::{Interval, Redis, Sidecar, StoreKind, TempDir, check_history, make_store, namespace};
use lockside::client::{Client, LockOptions};
use lockside::engine::EngineConfig;
use lockside::server::ServerConfig;
use tokio::io::AsyncBufReadExt;
use tokio::process::Command;
use tokio::time::Instant;
use tokio_stream::StreamExt;

const ITERATIONS: usize = 30;
const KEY: &str = "shared-resource";
/// CLOCK_MONOTONIC from a shell: `date` only reads the wall clock.
const NOW: &str = "python3 -c \"import time; print(time.monotonic_ns())\"";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// CLOCK_MONOTONIC, as Python's `time.monotonic_ns()`, Node's `process.hrtime` and
/// Go's `unix.ClockGettime` read it. (Node's wall clock was measured ~1 ms off, and a
/// wall clock can be stepped.)
fn mono_ns() -> u128 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u128 * 1_000_000_000 + t.tv_nsec as u128
}

/// One client process: its command line, and the file it records to.
fn contender(program: &str, args: &[&str], out: &Path, addr: &str) -> Command {
    let mut command = Command::new(program);
    command
        .args(args)
        .args(["contend", "--addr", addr, "--key", KEY])
        .args(["--iterations", &ITERATIONS.to_string()])
        .arg("--out")
        .arg(out)
        .stdout(Stdio::null())
        .kill_on_drop(true);
    command
}

/// The client programs, as `clients/prepare.sh` and `clients/go/ci.sh build` install
/// them.
struct Installed {
    fixtures: PathBuf,
    venv_python: PathBuf,
    node_modules: PathBuf,
    go: PathBuf,
}

impl Installed {
    /// Finds them, or fails saying how to build them.
    fn find() -> Self {
        let root = repo();
        let installed = root.join("target/clients");
        let found = Self {
            fixtures: root.join("tests/fixtures/clients"),
            venv_python: installed.join("venv/bin/python"),
            node_modules: installed.join("node/node_modules"),
            go: root.join("clients/go/bin/lockside-example"),
        };
        require(&found.venv_python, "bash clients/prepare.sh");
        require(
            &found.node_modules.join("lockside"),
            "bash clients/prepare.sh",
        );
        require(&found.go, "bash clients/go/ci.sh build");
        found
    }
}

fn require(path: &Path, how: &str) {
    assert!(
        path.exists(),
        "{} is missing: build the clients first ({how}; `bash .ci/run` does it)",
        path.display()
    );
}

/// Reads `start_ns end_ns token` lines into intervals on one clock (ns since `base`).
fn read(file: &Path, base: Instant, base_ns: u128) -> Vec<Interval> {
    read_key(file, KEY, base, base_ns)
}

fn read_key(file: &Path, key: &str, base: Instant, base_ns: u128) -> Vec<Interval> {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let at = |ns: u128| base + Duration::from_nanos(ns.saturating_sub(base_ns) as u64);
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let fields: Vec<u128> = line
                .split_whitespace()
                .map(|f| {
                    f.parse()
                        .unwrap_or_else(|_| panic!("{}: bad line {line:?}", file.display()))
                })
                .collect();
            assert_eq!(fields.len(), 3, "{}: bad line {line:?}", file.display());
            Interval {
                key: key.into(),
                start: at(fields[0]),
                end: at(fields[1]),
                token: fields[2] as u64,
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_language_takes_turns_with_increasing_tokens() {
    let Installed {
        fixtures,
        venv_python,
        node_modules,
        go,
    } = Installed::find();

    let redis = Redis::start();
    // Six client processes, Redis and the sidecar share two cores here: keep the
    // production keepalive (5 s + 5 s), not the tests' 300 ms, or a client starved of
    // CPU for 300 ms would lose its lock (correctly, but not what this test measures).
    let store = make_store(&StoreKind::Redis(redis.url()), &namespace());
    let sidecar =
        Sidecar::start_configured(store, EngineConfig::default(), ServerConfig::default()).await;
    let dir = TempDir::new("languages");
    let base = Instant::now();
    let base_ns = mono_ns();
    let out = |name: &str| dir.0.join(format!("{name}.txt"));

    let mut node = contender(
        "node",
        &[&fixtures.join("contend.cjs").to_string_lossy()],
        &out("node"),
        &sidecar.addr,
    );
    node.env("NODE_PATH", &node_modules);
    let mut children = vec![
        contender(
            &venv_python.to_string_lossy(),
            &[&fixtures.join("contend.py").to_string_lossy()],
            &out("python"),
            &sidecar.addr,
        ),
        node,
        contender(&go.to_string_lossy(), &[], &out("go"), &sidecar.addr),
    ];
    for name in ["hold-1", "hold-2"] {
        // CMD starts after the grant and ends before the release: it records the hold.
        let record = format!(
            "s=$({NOW}); sleep 0.00$(( $$ % 3 )); e=$({NOW}); echo \"$s $e $LOCKSIDE_FENCING_TOKEN\" >> {}",
            out(name).display()
        );
        let lockside = env!("CARGO_BIN_EXE_lockside");
        let script = format!(
            "for i in $(seq {ITERATIONS}); do {lockside} hold {KEY} --wait 60s -- sh -c '{record}' || exit 1; done"
        );
        let mut command = Command::new("sh");
        command
            .args(["-c", &script])
            .env("LOCKSIDE_ADDR", &sidecar.addr)
            .kill_on_drop(true);
        children.push(command);
    }
    let mut running = Vec::new();
    for mut command in children {
        running.push(command.spawn().expect("spawn a contender"));
    }

    let client = Client::connect(&sidecar.addr).await.expect("connect");
    let mut rust = Vec::new();
    for _ in 0..ITERATIONS {
        let lock = client.lock(KEY).await.expect("rust lock");
        let start = mono_ns();
        tokio::time::sleep(Duration::from_millis(1)).await;
        rust.push(format!("{start} {} {}", mono_ns(), lock.fencing_token()));
        lock.release().await.expect("rust release");
    }

    for (i, child) in running.into_iter().enumerate() {
        let status = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
            .await
            .expect("contender finishes in time")
            .expect("contender ran");
        assert!(
            status.status.success(),
            "contender {i} failed: {:?}",
            status.status
        );
    }
    std::fs::write(out("rust"), rust.join("\n")).expect("write the rust record");
    let mut history = Vec::new();
    for name in ["rust", "python", "node", "go", "hold-1", "hold-2"] {
        let intervals = read(&out(name), base, base_ns);
        assert_eq!(intervals.len(), ITERATIONS, "{name} recorded every hold");
        // The key says who held it, for the report below; the checker needs one key.
        history.extend(intervals.into_iter().map(|i| (name, i)));
    }
    history.sort_by_key(|(_, i)| i.start);
    for pair in history.windows(2) {
        let ((a, x), (b, y)) = (&pair[0], &pair[1]);
        if y.start < x.end || y.token <= x.token {
            eprintln!(
                "violation: {a} [{:?}, {:?}] token {} then {b} [{:?}, {:?}] token {}",
                x.start - base,
                x.end - base,
                x.token,
                y.start - base,
                y.end - base,
                y.token
            );
        }
    }
    let history: Vec<Interval> = history.into_iter().map(|(_, i)| i).collect();
    let verdict = check_history(&history);
    eprintln!("languages: {verdict:?}");
    assert_eq!(verdict.intervals, 6 * ITERATIONS);
    assert_eq!(
        (verdict.overlaps, verdict.token_regressions),
        (0, 0),
        "{verdict:?}"
    );
}

/// The election's key, rounds per candidate and how long each term lasts.
const ELECTION: &str = "leader";
const TERMS: usize = 3;
const TERM_MS: u64 = 100;
/// The value that ends every watcher: the test's own last term.
const DONE: &str = "done";

/// One state a watcher recorded: how many held the key, the leader's token and value.
#[derive(Clone, Debug)]
struct Observed {
    holders: usize,
    token: u64,
    value: String,
}

/// Reads `mono_ns holders token value` lines.
fn observed(file: &Path) -> Vec<Observed> {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let mut fields = line.splitn(4, ' ');
            let mut number = || -> u64 {
                fields
                    .next()
                    .and_then(|f| f.parse().ok())
                    .unwrap_or_else(|| panic!("{}: bad line {line:?}", file.display()))
            };
            let (_at, holders, token) = (number(), number(), number());
            Observed {
                holders: holders as usize,
                token,
                value: fields.next().unwrap_or_default().to_owned(),
            }
        })
        .collect()
}

/// Checks one watcher's states against the terms (token -> candidate): never two
/// leaders at once, leaders in the order of their tokens, each leader's value its own
/// (its name, or what it proclaimed: "name/term"), every candidate seen, `done` last.
fn check_watcher(who: &str, seen: &[Observed], terms: &HashMap<u64, String>, names: &[&str]) {
    let mut last = 0;
    let mut leaders = std::collections::BTreeSet::new();
    for state in seen {
        assert!(state.holders <= 1, "{who}: two leaders at once: {state:?}");
        if state.holders == 0 {
            continue;
        }
        assert!(state.token >= last, "{who}: leaders out of order: {seen:?}");
        last = state.token;
        let name = state.value.split('/').next().unwrap_or_default();
        if name == DONE {
            continue;
        }
        assert_eq!(
            terms.get(&state.token).map(String::as_str),
            Some(name),
            "{who}: {state:?} is not a term of {name}"
        );
        leaders.insert(name.to_owned());
    }
    assert_eq!(
        seen.last().map(|s| s.value.as_str()),
        Some(DONE),
        "{who}: watched to the end"
    );
    let missing: Vec<&&str> = names.iter().filter(|n| !leaders.contains(**n)).collect();
    assert!(
        missing.is_empty(),
        "{who} never saw {missing:?} lead: {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_language_elects_one_leader_at_a_time_and_every_watcher_follows() {
    let Installed {
        fixtures,
        venv_python,
        node_modules,
        go,
    } = Installed::find();

    let redis = Redis::start();
    let store = make_store(&StoreKind::Redis(redis.url()), &namespace());
    let sidecar =
        Sidecar::start_configured(store, EngineConfig::default(), ServerConfig::default()).await;
    let addr = sidecar.addr.clone();
    let dir = TempDir::new("election");
    let base = Instant::now();
    let base_ns = mono_ns();
    let out = |name: &str| dir.0.join(format!("{name}.txt"));
    let python = |args: &[&str]| {
        let mut c = Command::new(&venv_python);
        c.arg(fixtures.join("elect.py")).args(args);
        c
    };
    let node = |args: &[&str]| {
        let mut c = Command::new("node");
        c.arg(fixtures.join("elect.cjs"))
            .args(args)
            .env("NODE_PATH", &node_modules);
        c
    };
    let go_program = |args: &[&str]| {
        let mut c = Command::new(&go);
        c.args(args);
        c
    };
    let common = |mut c: Command, file: &Path| {
        c.args(["--addr", &addr, "--key", ELECTION])
            .arg("--out")
            .arg(file)
            .stdout(Stdio::null())
            .kill_on_drop(true);
        c
    };

    // Watchers first, each with its first state (the key free) recorded.
    let mut watchers = Vec::new();
    for (name, command) in [
        ("python", python(&["watch", "--until", DONE])),
        ("node", node(&["watch", "--until", DONE])),
        ("go", go_program(&["watch", "--until", DONE])),
    ] {
        let file = out(&format!("watch-{name}"));
        let child = common(command, &file).spawn().expect("spawn a watcher");
        watchers.push((name, file, child));
    }
    let mut cli_watch = Command::new(env!("CARGO_BIN_EXE_lockside"))
        .args(["watch", ELECTION, "--json", "--addr", &addr])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn lockside watch");
    let cli_lines = tokio::io::BufReader::new(cli_watch.stdout.take().expect("stdout")).lines();
    let cli_seen = tokio::spawn(async move {
        let mut lines = cli_lines;
        let mut seen = Vec::new();
        while let Ok(Some(line)) = lines.next_line().await {
            let state: serde_json::Value = serde_json::from_str(&line).expect("json");
            let holders = state["holders"].as_array().map_or(0, Vec::len);
            let leader = &state["holders"][0];
            let value = leader["value"].as_str().unwrap_or_default().to_owned();
            let done = value == DONE;
            seen.push(Observed {
                holders,
                token: leader["fencing_token"].as_u64().unwrap_or(0),
                value,
            });
            if done {
                break;
            }
        }
        seen
    });
    let client = Client::connect(&addr).await.expect("connect");
    let mut states = client.watch(ELECTION).await.expect("watch");
    let rust_seen = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Some(Ok(state)) = states.next().await {
            let leader = state.holders.first();
            let value = leader.map(|h| String::from_utf8_lossy(&h.value).into_owned());
            let done = value.as_deref() == Some(DONE);
            seen.push(Observed {
                holders: state.holders.len(),
                token: leader.map_or(0, |h| h.fencing_token),
                value: value.unwrap_or_default(),
            });
            if done {
                break;
            }
        }
        seen
    });
    tokio::time::timeout(Duration::from_secs(30), async {
        while watchers
            .iter()
            .any(|(_, file, _)| std::fs::read_to_string(file).map_or(true, |t| t.is_empty()))
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("every watcher started");

    // The candidates.
    let (rounds, hold_ms, hold) = (
        TERMS.to_string(),
        TERM_MS.to_string(),
        format!("{TERM_MS}ms"),
    );
    let fixture = |value| {
        [
            "elect",
            "--value",
            value,
            "--rounds",
            &rounds,
            "--hold-ms",
            &hold_ms,
        ]
    };
    let mut candidates = Vec::new();
    for (name, command) in [
        ("python", python(&fixture("python"))),
        ("node", node(&fixture("node"))),
        (
            "go",
            go_program(&[
                "elect", "--value", "go", "--rounds", &rounds, "--hold", &hold,
            ]),
        ),
    ] {
        let file = out(name);
        let child = common(command, &file).spawn().expect("spawn a candidate");
        candidates.push((name, file, child));
    }
    // `lockside elect`: CMD records its term.
    let record = format!(
        "s=$({NOW}); sleep 0.{TERM_MS:03}; e=$({NOW}); echo \"$s $e $LOCKSIDE_FENCING_TOKEN\" >> {}",
        out("cli").display()
    );
    let lockside = env!("CARGO_BIN_EXE_lockside");
    let script = format!(
        "for i in $(seq {TERMS}); do {lockside} elect {ELECTION} --value cli -- sh -c '{record}' || exit 1; done"
    );
    let mut cli = Command::new("sh");
    cli.args(["-c", &script])
        .env("LOCKSIDE_ADDR", &addr)
        .kill_on_drop(true);
    candidates.push((
        "cli",
        out("cli"),
        cli.spawn().expect("spawn lockside elect"),
    ));
    // Rust: this test's own client.
    let mut rust_terms = Vec::new();
    for term in 1..=TERMS {
        let options = LockOptions {
            wait: Some(Duration::from_secs(60)),
            value: b"rust".to_vec(),
            ..LockOptions::default()
        };
        let lead = client
            .campaign_with(ELECTION, options)
            .await
            .expect("rust leads");
        let start = mono_ns();
        lead.proclaim(format!("rust/{term}").as_bytes())
            .await
            .expect("proclaim");
        tokio::time::sleep(Duration::from_millis(TERM_MS)).await;
        rust_terms.push(format!("{start} {} {}", mono_ns(), lead.fencing_token()));
        assert!(!lead.is_lost(), "rust lost its term");
        lead.resign().await.expect("resign");
    }
    std::fs::write(out("rust"), rust_terms.join("\n")).expect("write the rust record");
    for (name, _, child) in candidates {
        let status = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
            .await
            .expect("candidate finishes in time")
            .expect("candidate ran");
        assert!(
            status.status.success(),
            "candidate {name} failed: {:?}",
            status.status
        );
    }
    // The last term ends every watcher.
    let done = client
        .campaign(ELECTION, DONE.as_bytes())
        .await
        .expect("done leads");

    let names = ["python", "node", "go", "cli", "rust"];
    let mut history = Vec::new();
    let mut terms = HashMap::new();
    for name in names {
        let intervals = read_key(&out(name), ELECTION, base, base_ns);
        assert_eq!(intervals.len(), TERMS, "{name} recorded every term");
        for i in &intervals {
            terms.insert(i.token, name.to_owned());
        }
        history.extend(intervals);
    }
    let verdict = check_history(&history);
    eprintln!("election: {verdict:?}");
    assert_eq!(verdict.intervals, names.len() * TERMS);
    assert_eq!(
        (verdict.overlaps, verdict.token_regressions),
        (0, 0),
        "{verdict:?}"
    );

    for (name, file, child) in watchers {
        let status = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
            .await
            .expect("watcher finishes in time")
            .expect("watcher ran");
        assert!(
            status.status.success(),
            "watcher {name} failed: {:?}",
            status.status
        );
        check_watcher(name, &observed(&file), &terms, &names);
    }
    let seen = tokio::time::timeout(Duration::from_secs(30), cli_seen)
        .await
        .expect("lockside watch saw the end")
        .expect("task");
    check_watcher("lockside watch", &seen, &terms, &names);
    let seen = tokio::time::timeout(Duration::from_secs(30), rust_seen)
        .await
        .expect("the rust watch saw the end")
        .expect("task");
    check_watcher("rust", &seen, &terms, &names);
    done.resign().await.expect("resign");
    let _ = cli_watch.kill().await;
}
