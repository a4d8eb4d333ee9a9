//! Issue 28, item 6: every example runs. Every fenced code block of the user's
//! documentation (`README.md`, `CONTRIBUTING.md`, `ARCHITECTURE.md`, `docs/*.md`,
//! `clients/*/README.md` and `deploy/README.md`, `deploy/*/README.md`, found by listing,
//! so a page or a block added later is covered)
//! is run or checked here, or says why not. The line just before each opening fence is
//! an HTML comment (invisible once rendered) that says which:
//!
//! - `<!-- example: run -->`: a whole program, run as written against a sidecar of this
//!   test (memory store; `LOCKSIDE_ADDR` is its address, as the examples expect); it must
//!   exit 0 within [`RUNS_WITHIN`]. The blocks of one page run in their order, on a
//!   sidecar of the page's own; pages run side by side.
//! - `<!-- example: run in WRAPPER -->`: a fragment, put in place of the `EXAMPLE` line of
//!   `tests/client_doc_examples/WRAPPER` (indented as that line is), then run the same
//!   way. The wrappers hold stand-ins for the application's own things (`db`,
//!   `batches`, `work`, ...) and, where a fragment needs one, an open client.
//! - `<!-- example: check: REASON -->`, `<!-- example: check in WRAPPER: REASON -->`:
//!   type-checked or compiled like a run block, not run, for the stated reason (a
//!   follower's loop that runs until interrupted, ...).
//! - `<!-- example: background holding KEY -->` (shell): started; once KEY is held, the
//!   page's next block runs, then this one is interrupted (SIGINT to its process group,
//!   as Ctrl-C in a terminal) and must end within [`RUNS_WITHIN`].
//! - `<!-- example: part of PATH -->` (Rust): every line of the block appears, in order
//!   and together, in PATH, a module of this test compiled with it.
//! - `<!-- example: file NAME of project PROJECT -->` (`xml` pom.xml, `java` NAME.java,
//!   `yaml` application.yaml): the blocks of one PROJECT on a page make a Maven project,
//!   compiled by Maven as a user would (Lockside's artifacts from `~/.m2`), then
//!   its program is run: a plain one must exit 0, a Spring Boot application must start
//!   without a logging warning and is then stopped (`client_doc_examples/maven.rs`).
//! - `<!-- example: not run: REASON -->`: output samples, diagrams, manifests, commands
//!   that need a Kubernetes cluster or minutes of benchmark, ...; the reason is required.
//!
//! Checked and run by language: Python with the package installed as users get it
//! (`target/clients/venv`, `bash clients/prepare.sh`) after `mypy --strict` of every
//! Python block (one mypy run); TypeScript and JavaScript (`ts`, `js`) compiled by
//! `tsc --strict` as ES modules next to the installed Node package
//! (`target/clients/node`), then run with `node`; Go built (one `go build`) in a scratch
//! module whose `replace` points at `clients/go`; Java compiled by one `javac` against
//! the jars and classpath `bash clients/java/ci.sh build` leaves in `clients/java/*/target`
//! (`.ci/run` runs it before `cargo test`); shell (`sh`) in `bash -euo pipefail` in a
//! scratch directory whose `target/release` is this build's `lockside` binary (the
//! README's commands prepend it to `PATH`). Any other language can only be `not run`.
//! A block without a marker, with an unknown marker, or marked to run in a language
//! that cannot be run fails the test. Every process started here is killed with its
//! process group when the test ends, also when it fails.

mod common;

/// The Rust blocks of the documentation, compiled with this test (`part of`).
#[path = "client_doc_examples/rust.rs"]
mod rust_examples;

/// Finding the blocks and reading their markers.
#[path = "client_doc_examples/blocks.rs"]
mod blocks;

/// Checking and building them, a tool run per language.
#[path = "client_doc_examples/builds.rs"]
mod builds;

/// The Maven projects of the Java page (a pom, a source, a Boot application's yaml).
#[path = "client_doc_examples/maven.rs"]
mod maven;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use blocks::{Block, Marker, blocks_of, part_of};
use builds::{go, java, java_classpath, node, python};
use common::{Client, PATIENCE, Sidecar, StoreKind, TempDir, make_store};
use lockside::proto::DescribeRequest;
use tokio::process::{Child, Command};

/// The bound for one block's run, and for one type-check or compile step. Generous: a
/// Python example holds its lock 5 s, and a cold mypy takes its time.
const RUNS_WITHIN: Duration = Duration::from_secs(60);

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The documentation pages: the front door, the contributor's pages, `docs/`, each
/// client package's README and the deployment's.
fn pages() -> Vec<PathBuf> {
    let root = repo();
    let mut pages: Vec<PathBuf> = ["README.md", "CONTRIBUTING.md", "ARCHITECTURE.md"]
        .iter()
        .map(|p| root.join(p))
        .collect();
    let mut listed = Vec::new();
    for entry in std::fs::read_dir(root.join("docs")).expect("docs/") {
        let path = entry.expect("docs/ entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            listed.push(path);
        }
    }
    for entry in std::fs::read_dir(root.join("clients")).expect("clients/") {
        let path = entry.expect("clients/ entry").path().join("README.md");
        if path.exists() {
            listed.push(path);
        }
    }
    listed.push(root.join("deploy/README.md"));
    for entry in std::fs::read_dir(root.join("deploy")).expect("deploy/") {
        let path = entry.expect("deploy/ entry").path().join("README.md");
        if path.exists() {
            listed.push(path);
        }
    }
    listed.sort();
    pages.extend(listed);
    pages
}

/// Where a block's program lives once written, and how to run it.
pub struct Unit {
    pub block: Block,
    /// The file run (or the class name, for Java).
    pub target: PathBuf,
}

/// Processes of one process group, SIGKILLed together when dropped.
struct Group(Option<Child>);

impl Group {
    fn spawn(mut command: Command) -> Self {
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        Self(Some(command.spawn().expect("spawn")))
    }

    fn signal(&self, sig: &str) {
        if let Some(pid) = self.0.as_ref().and_then(Child::id) {
            kill_group(pid, sig);
        }
    }

    /// Its output once it exits; None if it did not within [`RUNS_WITHIN`]. Either way,
    /// whatever is left of its group is killed.
    async fn output(self) -> Option<Output> {
        self.output_within(RUNS_WITHIN).await
    }

    /// [`Group::output`] with a bound of its own.
    async fn output_within(mut self, bound: Duration) -> Option<Output> {
        let child = self.0.take().expect("a child");
        let pid = child.id();
        let out = tokio::time::timeout(bound, child.wait_with_output()).await;
        if let Some(pid) = pid {
            kill_group(pid, "-KILL");
        }
        out.ok().map(|out| out.expect("wait"))
    }
}

fn kill_group(pid: u32, sig: &str) {
    let _ = std::process::Command::new("kill")
        .args([sig, "--", &format!("-{pid}")])
        .stderr(Stdio::null())
        .status();
}

impl Drop for Group {
    fn drop(&mut self) {
        self.signal("-KILL");
    }
}

/// Runs a check or build step; its failure is a failure of the blocks it covered.
pub async fn step(what: &str, command: Command) -> Result<(), String> {
    step_within(what, command, RUNS_WITHIN).await
}

/// [`step`] with a bound of its own.
pub async fn step_within(what: &str, command: Command, bound: Duration) -> Result<(), String> {
    let started = Instant::now();
    let out = Group::spawn(command)
        .output_within(bound)
        .await
        .ok_or_else(|| format!("{what} did not finish within {bound:?}"))?;
    eprintln!("{what}: {:.1} s", started.elapsed().as_secs_f64());
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what}: {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}
/// The command that runs `unit` (its program already checked and built).
fn run_command(unit: &Unit, scratch: &Path) -> Command {
    let project = matches!(unit.block.marker, Marker::File { .. });
    let mut command = match unit.block.lang.as_str() {
        _ if project => maven::run_command(unit),
        "python" => {
            let mut c = Command::new(repo().join("target/clients/venv/bin/python"));
            c.arg(&unit.target);
            c
        }
        "ts" | "js" => {
            let mut c = Command::new("node");
            c.arg(&unit.target);
            c
        }
        "go" => Command::new(&unit.target),
        "java" => {
            let mut c = Command::new("java");
            c.arg("-cp")
                .arg(format!(
                    "{}:{}",
                    scratch.join("java/classes").display(),
                    java_classpath()
                ))
                .arg(&unit.target);
            c
        }
        "sh" => {
            let mut c = Command::new("bash");
            c.args(["-euo", "pipefail", "-c", &unit.block.text]);
            c
        }
        other => panic!("no runner for {other}"),
    };
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_lockside"))
        .parent()
        .expect("bin dir");
    let path = std::env::var("PATH").unwrap_or_default();
    command
        .current_dir(scratch.join("cwd"))
        .env("PATH", format!("{}:{path}", bin_dir.display()));
    command
}

/// Waits until `key` has a holder on the sidecar at `addr`.
async fn held(addr: &str, key: &str) {
    let client = Client::connect(addr).await;
    let deadline = Instant::now() + PATIENCE;
    loop {
        let described = client
            .grpc
            .clone()
            .describe(DescribeRequest { key: key.into() })
            .await
            .expect("describe")
            .into_inner();
        if !described.holders.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "{key} was never held");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn failure(unit: &Unit, out: &Output) -> String {
    format!(
        "{} ({}): {}\n{}{}",
        unit.block.place,
        unit.target.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A Spring Boot application: it must log Boot's "Started" line within [`RUNS_WITHIN`]
/// and no logging warning (SLF4J's own, when no provider came with the starter); then
/// it is stopped (SIGTERM, as a container runtime would) and must end.
async fn started_then_stopped(mut group: Group) -> Result<(), String> {
    use tokio::io::AsyncBufReadExt;
    let stdout = group
        .0
        .as_mut()
        .and_then(|c| c.stdout.take())
        .expect("piped stdout");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let mut seen = Vec::new();
    let started = tokio::time::timeout(RUNS_WITHIN, async {
        while let Ok(Some(line)) = lines.next_line().await {
            let done = line.contains("Started ");
            seen.push(line);
            if done {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    group.signal("-TERM");
    let out = group.output().await;
    let stderr = out
        .as_ref()
        .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
        .unwrap_or_default();
    if !started {
        return Err(format!(
            "did not start within {RUNS_WITHIN:?}:\n{}\n{stderr}",
            seen.join("\n")
        ));
    }
    if out.is_none() {
        return Err("did not end on SIGTERM".into());
    }
    if stderr.contains("SLF4J(W)") || seen.iter().any(|l| l.contains("SLF4J(W)")) {
        return Err(format!("a logging warning:\n{stderr}"));
    }
    Ok(())
}

/// Runs one page's blocks in order on a sidecar of its own; returns the failures.
async fn run_page(units: Vec<Unit>, scratch: PathBuf) -> Vec<String> {
    let sidecar = Sidecar::start(make_store(&StoreKind::Memory, "doc-examples")).await;
    let mut failures = Vec::new();
    let mut background: Option<(String, Group)> = None;
    for unit in &units {
        let mut command = run_command(unit, &scratch);
        command.env("LOCKSIDE_ADDR", &sidecar.addr);
        let started = Instant::now();
        let group = Group::spawn(command);
        if let Marker::Background { key } = &unit.block.marker {
            held(&sidecar.addr, key).await;
            background = Some((unit.block.place.clone(), group));
            continue;
        }
        if matches!(unit.block.marker, Marker::File { .. }) && maven::is_boot(&unit.block) {
            if let Err(e) = started_then_stopped(group).await {
                failures.push(format!("{}: {e}", unit.block.place));
            }
            continue;
        }
        match group.output().await {
            None => failures.push(format!(
                "{}: did not exit by itself within {RUNS_WITHIN:?}",
                unit.block.place
            )),
            Some(out) if !out.status.success() => failures.push(failure(unit, &out)),
            Some(out) => eprintln!(
                "{}: ran in {:.1} s\n{}",
                unit.block.place,
                started.elapsed().as_secs_f64(),
                String::from_utf8_lossy(&out.stdout)
            ),
        }
        if let Some((place, group)) = background.take() {
            group.signal("-INT");
            if group.output().await.is_none() {
                failures.push(format!("{place}: did not end on SIGINT"));
            }
        }
    }
    if let Some((place, _)) = background {
        failures.push(format!("{place}: no block ran after it"));
    }
    failures
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_block_of_the_docs_runs_or_says_why_not() {
    let root = repo();
    let (mut blocks, mut errors) = (Vec::new(), Vec::new());
    for page in pages() {
        let name = page
            .strip_prefix(&root)
            .expect("in the repository")
            .display()
            .to_string();
        let text = std::fs::read_to_string(&page).expect("read page");
        let (found, wrong) = blocks_of(&name, &text);
        blocks.extend(found);
        errors.extend(wrong);
    }
    assert!(errors.is_empty(), "blocks:\n{}", errors.join("\n"));
    // The pages this test was written for have blocks; finding none means the search broke.
    assert!(blocks.len() > 40, "only {} blocks found", blocks.len());

    for block in &blocks {
        if let Marker::PartOf(path) = &block.marker
            && let Err(e) = part_of(block, path)
        {
            errors.push(e);
        }
    }

    let scratch = TempDir::new("doc-examples");
    std::fs::create_dir_all(scratch.0.join("cwd/target")).expect("cwd");
    // The README's shell blocks put `$PWD/target/release` first in PATH: there, it is
    // this build's binary.
    std::os::unix::fs::symlink(
        Path::new(env!("CARGO_BIN_EXE_lockside"))
            .parent()
            .expect("bin dir"),
        scratch.0.join("cwd/target/release"),
    )
    .expect("symlink");
    // The Go page's install recipe makes a module next to a checkout at ./lockside.
    std::os::unix::fs::symlink(&root, scratch.0.join("cwd/lockside")).expect("symlink");
    // Node resolves `lockside` from the folder of the module that imports it.
    let node_dir = TempDir(root.join(format!(
        "target/clients/node/doc-examples-{}",
        std::process::id()
    )));

    let checked: Vec<&Block> = blocks
        .iter()
        .filter(|b| matches!(b.marker, Marker::Run { .. } | Marker::Check { .. }))
        .collect();
    let of = |langs: &[&str]| -> Vec<&Block> {
        checked
            .iter()
            .copied()
            .filter(|b| langs.contains(&b.lang.as_str()))
            .collect()
    };
    let started = Instant::now();
    let (py_blocks, node_blocks, go_blocks, java_blocks) = (
        of(&["python"]),
        of(&["ts", "js"]),
        of(&["go"]),
        of(&["java"]),
    );
    let project_blocks: Vec<&Block> = blocks
        .iter()
        .filter(|b| matches!(b.marker, Marker::File { .. }))
        .collect();
    let (py_dir, go_dir, java_dir, maven_dir) = (
        scratch.0.join("python"),
        scratch.0.join("go"),
        scratch.0.join("java"),
        scratch.0.join("maven"),
    );
    let (py, ts, golang, jv) = tokio::join!(
        python(&py_blocks, &py_dir),
        node(&node_blocks, &node_dir.0),
        go(&go_blocks, &go_dir),
        java(&java_blocks, &java_dir),
    );
    // After the others: Maven beside tsc and javac on 2 cores slowed them past their bound.
    let mvn = maven::maven(&project_blocks, &maven_dir).await;
    eprintln!(
        "checked and built in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let mut runnable: Vec<Unit> = Vec::new();
    for (units, result) in [py, ts, golang, jv, mvn] {
        if let Err(e) = result {
            errors.push(e);
        }
        runnable.extend(units);
    }
    assert!(errors.is_empty(), "{}", errors.join("\n\n"));

    // Shell blocks need no build; then each page's runnable blocks in their order.
    runnable.extend(
        blocks
            .iter()
            .filter(|b| {
                b.lang == "sh" && matches!(b.marker, Marker::Run { .. } | Marker::Background { .. })
            })
            .map(|b| Unit {
                block: b.clone(),
                target: PathBuf::from("bash"),
            }),
    );
    let line = |u: &Unit| -> usize {
        u.block
            .place
            .rsplit(':')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let mut by_page: BTreeMap<String, Vec<Unit>> = BTreeMap::new();
    for unit in runnable {
        if matches!(unit.block.marker, Marker::Check { .. }) {
            continue;
        }
        by_page
            .entry(unit.block.page.clone())
            .or_default()
            .push(unit);
    }
    let mut pages = tokio::task::JoinSet::new();
    for (_, mut units) in by_page {
        units.sort_by_key(line);
        pages.spawn(run_page(units, scratch.0.clone()));
    }
    while let Some(failures) = pages.join_next().await {
        errors.extend(failures.expect("page task"));
    }
    eprintln!(
        "{} blocks; checked, built and ran in {:.1} s",
        blocks.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(errors.is_empty(), "{}", errors.join("\n\n"));
}
