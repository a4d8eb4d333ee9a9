//! Issue 28 (in part): the README's five-minute path runs as written. Its Python
//! (asyncio) and Node snippets are taken from README.md and run against a real sidecar,
//! with the packages installed as users get them (`bash clients/prepare.sh`, which
//! `.ci/run` runs): each must print its fencing token and exit by itself. (Once, the
//! Python snippet used `async with` at top level without importing asyncio, and the
//! Node one never exited: it did not close its client.)

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use common::{Sidecar, StoreKind, make_store};
use tokio::process::Command;

/// Long enough for the Python snippet's 5 s hold, and a slow start.
const RUNS_WITHIN: Duration = Duration::from_secs(30);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The first ```LANG block after the first line that contains `after`.
fn block(text: &str, after: &str, lang: &str) -> String {
    let from = text
        .find(after)
        .unwrap_or_else(|| panic!("README.md has {after:?}"));
    let open = format!("```{lang}\n");
    let start = text[from..]
        .find(&open)
        .map(|at| from + at + open.len())
        .unwrap_or_else(|| panic!("a {lang} block after {after:?}"));
    let end = text[start..].find("```").expect("the block ends") + start;
    text[start..end].to_owned()
}

/// Runs `command` with the sidecar's address; asserts it exits 0 within
/// [`RUNS_WITHIN`] and prints the fencing token.
async fn runs(name: &str, mut command: Command, addr: &str) {
    let child = command
        .env("LOCKSIDE_ADDR", addr)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let out = tokio::time::timeout(RUNS_WITHIN, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{name} did not exit by itself within {RUNS_WITHIN:?}"))
        .expect("ran");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "{name}: {}\n{stdout}{stderr}",
        out.status
    );
    assert!(
        stdout.contains("holding demo, fencing token"),
        "{name}: {stdout}{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_python_and_node_snippets_run_as_written() {
    let root = repo();
    let python = root.join("target/clients/venv/bin/python");
    let node_dir = root.join("target/clients/node");
    for path in [&python, &node_dir.join("node_modules/lockside")] {
        assert!(
            path.exists(),
            "{} is missing: build the clients first (bash clients/prepare.sh; `bash .ci/run` does it)",
            path.display()
        );
    }
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let sidecar = Sidecar::start(make_store(&StoreKind::Memory, "front-door")).await;

    let mut from_python = Command::new(&python);
    from_python
        .arg("-c")
        .arg(block(&readme, "From Python", "python"));
    runs("the Python snippet", from_python, &sidecar.addr).await;

    // An ES module resolves `lockside` from its own folder: beside the installed
    // package's node_modules.
    let script = node_dir.join(format!("front-door-{}.mjs", std::process::id()));
    std::fs::write(&script, block(&readme, "From Node", "js")).expect("write the snippet");
    let mut from_node = Command::new("node");
    from_node.arg(&script);
    runs("the Node snippet", from_node, &sidecar.addr).await;
    let _ = std::fs::remove_file(&script);
}
