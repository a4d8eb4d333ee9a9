//! Every language at once: a Rust client, the Python and Node packages (as installed
//! from `clients/`), the Go example, and two `lockside hold` loops compete for one key
//! through one sidecar on Redis. Each records its holding intervals (CLOCK_MONOTONIC
//! ns, one clock for all processes here) and fencing tokens; the checker finds 0
//! overlaps and strictly increasing tokens.
//!
//! The packages and the Go example must be built and installed first: `bash
//! clients/prepare.sh` and `bash examples/go/build.sh` (`.ci/run` does both). The
//! Python and Node contenders are `tests/fixtures/clients/contend.{py,cjs}`, run with
//! the venv's Python and with NODE_PATH on the installed tarball.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::{Interval, Redis, Sidecar, StoreKind, TempDir, check_history, make_store, namespace};
use lockside::client::Client;
use lockside::engine::EngineConfig;
use lockside::server::ServerConfig;
use tokio::process::Command;
use tokio::time::Instant;

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

fn require(path: &Path, how: &str) {
    assert!(
        path.exists(),
        "{} is missing: build the clients first ({how}; `bash .ci/run` does it)",
        path.display()
    );
}

/// Reads `start_ns end_ns token` lines into intervals on one clock (ns since `base`).
fn read(file: &Path, base: Instant, base_ns: u128) -> Vec<Interval> {
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
                key: KEY.into(),
                start: at(fields[0]),
                end: at(fields[1]),
                token: fields[2] as u64,
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_language_takes_turns_with_increasing_tokens() {
    let root = repo();
    let fixtures = root.join("tests/fixtures/clients");
    let installed = root.join("target/clients");
    let venv_python = installed.join("venv/bin/python");
    let node_modules = installed.join("node/node_modules");
    let go = root.join("examples/go/bin/lockside-example");
    require(&venv_python, "bash clients/prepare.sh");
    require(&node_modules.join("lockside"), "bash clients/prepare.sh");
    require(&go, "bash examples/go/build.sh");

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
