//! The layout keeps itself: reads the `crate::` (and crate-escaping `super::`) paths of
//! every file under `src/`, builds the graph of top-level modules, and fails on a cycle
//! or on an edge ARCHITECTURE.md forbids. A new import that breaks the direction of
//! flow fails here, naming the file; so does a file under `src/` over [`MAX_LINES`].
//! The benchmark's layers are checked the same way: no phase imports another, the
//! harness imports no phase, no bench file is over [`MAX_BENCH_LINES`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Edges that must not exist: (from, to). `proto` means the generated protobuf types;
/// `proto::limits` (the contract's values) is its own node, `limits`, and may be used
/// by anyone.
const FORBIDDEN: &[(&str, &str)] = &[
    // The lower layers never reach up.
    ("engine", "api"),
    ("engine", "server"),
    ("engine", "cli"),
    ("engine", "webhook"),
    ("engine", "admin"),
    ("engine", "client"),
    ("store", "api"),
    ("store", "server"),
    ("store", "cli"),
    ("store", "webhook"),
    ("store", "admin"),
    ("store", "client"),
    ("store", "engine"),
    ("telemetry", "api"),
    ("telemetry", "server"),
    ("telemetry", "cli"),
    ("telemetry", "webhook"),
    ("telemetry", "engine"),
    ("telemetry", "store"),
    ("metrics", "api"),
    ("metrics", "server"),
    ("metrics", "cli"),
    ("metrics", "webhook"),
    ("metrics", "engine"),
    // The engine knows no protobuf, the store neither.
    ("engine", "proto"),
    ("store", "proto"),
    // The API translates; it sees the store only through the engine.
    ("api", "store"),
    // The Rust client depends on the contract only.
    ("client", "engine"),
    ("client", "store"),
    ("client", "api"),
    ("client", "server"),
    ("client", "cli"),
    // Library layers never import the command line.
    ("admin", "cli"),
    ("api", "cli"),
    ("server", "cli"),
    ("webhook", "cli"),
    ("client", "cli"),
    // The injector is a separate program that shares the binary.
    ("webhook", "engine"),
    ("webhook", "store"),
    ("webhook", "server"),
    ("webhook", "api"),
];

/// Leaves: modules that import nothing from the crate.
const LEAVES: &[&str] = &["parse", "limits", "proto"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file under `src/` belongs to (`None` for lib.rs and main.rs),
/// and how many `super::` it takes to reach the crate root from it.
fn module_of(relative: &Path) -> Option<(String, usize)> {
    let parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let first = parts.first()?;
    if parts.len() == 1 {
        let name = first.strip_suffix(".rs")?;
        return match name {
            "lib" | "main" => None,
            name => Some((name.to_owned(), 1)),
        };
    }
    // src/a/b/c.rs is module a::b::c (depth 3); a mod.rs file is its directory.
    let mut depth = parts.len();
    if parts.last().is_some_and(|l| l == "mod.rs") {
        depth -= 1;
    }
    let name = if first == "proto" && parts.get(1).is_some_and(|p| p == "limits.rs") {
        "limits".to_owned()
    } else {
        first.clone()
    };
    Some((name, depth))
}

/// The top-level module a path names, as a node: `proto::limits` is `limits`.
fn node(path: &str) -> Option<String> {
    let mut segments = path.split("::");
    let first = segments.next()?;
    if first.is_empty() || !first.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
        return None;
    }
    if first == "proto" && segments.next() == Some("limits") {
        return Some("limits".into());
    }
    Some(first.to_owned())
}

/// Code without comments (line comments and doc comments; good enough for `use`s).
fn code(text: &str) -> String {
    text.lines()
        .map(|line| {
            let trimmed = line.trim_start();
            if trimmed.starts_with("//") {
                ""
            } else if let Some(at) = line.find(" // ") {
                &line[..at]
            } else {
                line
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The modules `text` refers to through `crate::X` or enough `super::` to leave its
/// own top-level module.
fn references(text: &str, depth: usize) -> BTreeSet<String> {
    let text = code(text);
    let mut found = BTreeSet::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().last();
        let after = &rest[at + "crate::".len()..];
        // `lockside::crate::` never occurs; `$crate::` in macros is not ours either.
        if !matches!(before, Some(c) if c.is_alphanumeric() || c == '_' || c == '$') {
            let path: String = after
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            if let Some(n) = node(&path) {
                found.insert(n);
            }
            // `use crate::{a, b::c}`: every name in the braces.
            if let Some(group) = after.strip_prefix('{') {
                group_nodes(group, &mut found);
            }
        }
        rest = after;
    }
    let escape = "super::".repeat(depth);
    let mut rest = text.as_str();
    while let Some(at) = rest.find(&escape) {
        let after = &rest[at + escape.len()..];
        let path: String = after
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
            .collect();
        if let Some(n) = node(&path) {
            found.insert(n);
        }
        if let Some(group) = after.strip_prefix('{') {
            group_nodes(group, &mut found);
        }
        rest = after;
    }
    found
}

/// The modules named by a `{a, b::{c, d}}` group: the first segment of every item at
/// its top level (`group` starts after the opening brace).
fn group_nodes(group: &str, found: &mut BTreeSet<String>) {
    let (mut depth, mut start) = (0usize, 0);
    for (at, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth > 0 => depth -= 1,
            ',' if depth > 0 => {}
            ',' | '}' => {
                found.extend(node(group[start..at].trim()));
                if c == '}' {
                    return;
                }
                start = at + 1;
            }
            _ => {}
        }
    }
}

/// Edges between top-level modules, each with a file that makes it.
fn graph() -> BTreeMap<(String, String), String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut edges = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(&src).expect("under src");
        let Some((from, depth)) = module_of(relative) else {
            continue;
        };
        let text = std::fs::read_to_string(&file).expect("read a source file");
        for to in references(&text, depth) {
            if to != from {
                edges
                    .entry((from.clone(), to))
                    .or_insert_with(|| relative.display().to_string());
            }
        }
    }
    edges
}

/// A cycle through the graph, if there is one.
fn cycle(edges: &BTreeMap<(String, String), String>) -> Option<Vec<String>> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        next.entry(from).or_default().push(to);
    }
    fn visit<'a>(
        at: &'a str,
        next: &BTreeMap<&'a str, Vec<&'a str>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|p| *p == at) {
            let mut cycle: Vec<String> = path[start..].iter().map(|s| s.to_string()).collect();
            cycle.push(at.to_owned());
            return Some(cycle);
        }
        if !done.insert(at) {
            return None;
        }
        path.push(at);
        for to in next.get(at).into_iter().flatten() {
            if let Some(found) = visit(to, next, path, done) {
                return Some(found);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    for start in next.keys() {
        if let Some(found) = visit(start, &next, &mut Vec::new(), &mut done) {
            return Some(found);
        }
    }
    None
}

#[test]
fn no_import_cycle_between_top_level_modules() {
    let edges = graph();
    assert!(edges.len() > 10, "the scan found too few edges: {edges:?}");
    if let Some(cycle) = cycle(&edges) {
        let files: Vec<String> = cycle
            .windows(2)
            .map(|w| {
                format!(
                    "{} → {} ({})",
                    w[0],
                    w[1],
                    edges[&(w[0].clone(), w[1].clone())]
                )
            })
            .collect();
        panic!("import cycle: {}", files.join(", "));
    }
}

#[test]
fn no_forbidden_edge() {
    let edges = graph();
    let broken: Vec<String> = edges
        .iter()
        .filter(|((from, to), _)| {
            FORBIDDEN.contains(&(from.as_str(), to.as_str())) || LEAVES.contains(&from.as_str())
        })
        .map(|((from, to), file)| format!("{from} → {to} in src/{file}"))
        .collect();
    assert!(
        broken.is_empty(),
        "forbidden imports:\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_checker_sees_what_it_must() {
    let text = "use crate::engine::{Engine, Mode};\nuse crate::{store::Store, proto::limits::MAX_WAIT};\n// use crate::cli;\nlet x = super::super::api::status;";
    let found = references(text, 2);
    let expected: BTreeSet<String> = ["engine", "store", "limits", "api"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(found, expected);
    let bench = "use super::{cost::Spent, harness::{load, rows::Row}};\nuse super::super::idle::X;";
    let expected: BTreeSet<String> = ["cost", "harness", "super", "idle"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(
        references(bench, 1),
        expected,
        "groups after super::, nested"
    );
    assert_eq!(
        module_of(Path::new("harness/load.rs")),
        Some(("harness".into(), 2))
    );
    assert_eq!(
        module_of(Path::new("engine/session/mod.rs")),
        Some(("engine".into(), 2))
    );
    assert_eq!(
        module_of(Path::new("proto/limits.rs")),
        Some(("limits".into(), 2))
    );
    assert_eq!(module_of(Path::new("lib.rs")), None);
    let mut edges = BTreeMap::new();
    edges.insert(("a".into(), "b".into()), "a.rs".into());
    edges.insert(("b".into(), "a".into()), "b.rs".into());
    assert!(cycle(&edges).is_some(), "a two-module loop is a cycle");
}

#[test]
fn grpc_statuses_are_made_in_the_api_only() {
    // Engine outcomes become gRPC codes in src/api/wire.rs; the server's bearer-token
    // check and the codec's "cannot decode" (transport concerns, before any engine
    // call) are the other places.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut makers = Vec::new();
    for file in files {
        let relative = file.strip_prefix(&src).expect("under src").to_path_buf();
        if relative.starts_with("api")
            || relative == Path::new("server.rs")
            || relative == Path::new("proto/codec.rs")
        {
            continue;
        }
        let text = code(&std::fs::read_to_string(&file).expect("read"));
        let made = text.match_indices("Status::").any(|(at, _)| {
            let before = text[..at].chars().last();
            let after = text[at + "Status::".len()..].chars().next();
            !matches!(before, Some(c) if c.is_alphanumeric() || c == '_')
                && after.is_some_and(|c| c.is_ascii_lowercase())
        });
        if made {
            makers.push(relative.display().to_string());
        }
    }
    assert!(
        makers.is_empty(),
        "tonic::Status made outside src/api/: {makers:?}"
    );
}

/// The most lines a file under `src/` may have: a room a newcomer reads in one sitting.
/// Past it, split the file at a seam it already has (ARCHITECTURE.md, "Rooms").
const MAX_LINES: usize = 400;

/// The most lines a file of the benchmark may have.
const MAX_BENCH_LINES: usize = 500;

/// The Rust files under `dir` over `limit` lines, longest first, each with its count.
fn files_over(dir: &Path, limit: usize, shown_as: &str) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(dir, &mut files);
    assert!(files.len() > 10, "the scan found too few files: {files:?}");
    let mut big: Vec<(usize, String)> = files
        .iter()
        .map(|file| {
            let text = std::fs::read_to_string(file).expect("read a source file");
            let relative = file.strip_prefix(dir).expect("under the scanned folder");
            (text.lines().count(), relative.display().to_string())
        })
        .filter(|(lines, _)| *lines > limit)
        .collect();
    big.sort_unstable_by(|a, b| b.cmp(a));
    big.iter()
        .map(|(lines, file)| format!("{shown_as}/{file}: {lines} lines"))
        .collect()
}

#[test]
fn no_file_under_src_is_over_the_size_limit() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let named = files_over(&src, MAX_LINES, "src");
    assert!(
        named.is_empty(),
        "files over {MAX_LINES} lines (split each at a seam it has):\n{}",
        named.join("\n")
    );
}

/// The most lines a hand-written file of the client core (`crates/lockside-client`) may
/// have, as the client packages' own files.
const MAX_CLIENT_LINES: usize = 500;

#[test]
fn no_file_of_the_client_core_is_over_the_size_limit() {
    let core = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/lockside-client/src");
    let named = files_over(&core, MAX_CLIENT_LINES, "crates/lockside-client/src");
    assert!(
        named.is_empty(),
        "client core files over {MAX_CLIENT_LINES} lines (split each at a seam it has):\n{}",
        named.join("\n")
    );
}

#[test]
fn no_hand_written_file_of_the_bindings_is_over_the_size_limit() {
    // The Python and Node packages are a binding to the core and their idioms: each
    // file a room read in one sitting, as the core's.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut big = Vec::new();
    let mut seen = 0;
    for dir in [
        "clients/python/native",
        "clients/python/src/lockside",
        "clients/node/native",
        "clients/node/src",
    ] {
        let entries = std::fs::read_dir(root.join(dir)).expect("a binding's folder");
        for entry in entries.flatten() {
            let path = entry.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if ![".rs", ".py", ".ts", ".cts", ".cjs"]
                .iter()
                .any(|e| name.ends_with(e))
            {
                continue;
            }
            seen += 1;
            let lines = std::fs::read_to_string(&path)
                .expect("read")
                .lines()
                .count();
            if lines > MAX_CLIENT_LINES {
                big.push(format!("{dir}/{name}: {lines} lines"));
            }
        }
    }
    assert!(seen > 15, "the scan found too few files ({seen})");
    assert!(
        big.is_empty(),
        "binding files over {MAX_CLIENT_LINES} lines (split each at a seam it has):\n{}",
        big.join("\n")
    );
}

/// The crates one `cargo tree` selection compiles for the target (no build scripts'
/// or proc-macros' own dependencies), each with its features.
fn target_crates(packages: &[&str]) -> std::collections::BTreeSet<String> {
    let mut cargo = std::process::Command::new(env!("CARGO"));
    cargo.current_dir(env!("CARGO_MANIFEST_DIR")).args([
        "tree",
        "--offline",
        "--locked",
        "-e",
        "normal,no-proc-macro",
        "-f",
        "{p} [{f}]",
        "--prefix",
        "none",
        "--no-dedupe",
    ]);
    for package in packages {
        cargo.args(["-p", package]);
    }
    let out = cargo.output().expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        // "name vX.Y.Z (path) [features]" or "... (*)": the name, version and features.
        .filter_map(|line| {
            let (head, features) = line.split_once(" [")?;
            let mut words = head.split_whitespace();
            let (name, version) = (words.next()?, words.next()?);
            let features = features.split(']').next()?;
            Some(format!("{name} {version} [{features}]"))
        })
        .collect()
}

#[test]
fn the_sidecar_and_the_bindings_compile_shared_crates_with_one_feature_set() {
    // CI builds the wheel (lockside-python alone, through maturin), the Node addon and
    // the sidecar's release binary one after the other: each must resolve the crates
    // they share with the same features, or each compiles them again (futures-util or
    // tracing alone rebuild hyper, h2, tonic and the core). crates/lockside-unify asks
    // for the union; when this fails, add the crate and features it names there.
    let all = target_crates(&["lockside", "lockside-python", "lockside-node"]);
    for package in ["lockside", "lockside-python", "lockside-node"] {
        let alone = target_crates(&[package]);
        let differ: Vec<&String> = alone.difference(&all).collect();
        assert!(
            differ.is_empty(),
            "{package} alone compiles these with fewer features than the three together \
             (add them to crates/lockside-unify):\n{differ:#?}"
        );
    }
}

#[test]
fn the_client_core_depends_on_the_contract_only() {
    // The core is what the Rust, Python and Node clients share: it must never need the
    // sidecar (its engine, store or server), only the generated contract.
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/lockside-client/Cargo.toml");
    let text = std::fs::read_to_string(&manifest).expect("read the core's manifest");
    let deps: Vec<&str> = text
        .lines()
        .filter_map(|line| line.split_once('=').map(|(name, _)| name.trim()))
        .filter(|name| name.starts_with("lockside"))
        .collect();
    assert_eq!(deps, ["lockside-proto"], "the core's lockside dependencies");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/lockside-client/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    for file in files {
        let text = code(&std::fs::read_to_string(&file).expect("read"));
        assert!(
            !text.contains("lockside::"),
            "{} names the sidecar's crate",
            file.display()
        );
    }
}

#[test]
fn the_client_core_states_the_contracts_values_as_the_sidecar_does() {
    // The core keeps the few values of the contract a client needs (it must not depend
    // on the sidecar's crate): they must be the sidecar's.
    use lockside::client::limits as core;
    use lockside::proto::limits as sidecar;
    assert_eq!(core::DEFAULT_ADDR, sidecar::DEFAULT_ADDR);
    assert_eq!(core::MAX_WAIT, sidecar::MAX_WAIT);
    assert_eq!(core::CLIENT_NAME_HEADER, sidecar::CLIENT_NAME_HEADER);
    assert_eq!(core::RESUME_HEADER, sidecar::RESUME_HEADER);
    assert_eq!(
        core::RESUME_REFUSED_TRAILER,
        sidecar::RESUME_REFUSED_TRAILER
    );
    assert_eq!(
        core::RESUME_REFUSED_UNKNOWN,
        sidecar::RESUME_REFUSED_UNKNOWN
    );
    assert_eq!(
        core::RESUME_REFUSED_ATTACHED,
        sidecar::RESUME_REFUSED_ATTACHED
    );
}

/// The benchmark, `benches/lockside/`: its phases are the files directly in it but
/// `main.rs` (flags and dispatch), its harness is the folder `harness/`, what every
/// phase shares. tokio's benches are the model: shared setup in helpers, benchmarks
/// never import each other.
fn bench_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/lockside")
}

/// The benchmark's phases, by module name.
fn bench_phases() -> BTreeSet<String> {
    let entries = std::fs::read_dir(bench_dir()).expect("read benches/lockside");
    entries
        .map(|entry| entry.expect("dir entry").path())
        .filter(|path| path.is_file() && path.extension().is_some_and(|e| e == "rs"))
        .filter_map(|path| Some(path.file_stem()?.to_string_lossy().into_owned()))
        .filter(|name| name != "main")
        .collect()
}

/// Imports between the benchmark's modules (a phase, `harness`), each with a file that
/// makes it; the same scan as `src/`'s, from the bench's root (main.rs).
fn bench_graph() -> BTreeMap<(String, String), String> {
    let dir = bench_dir();
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    let mut edges = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(&dir).expect("under benches/lockside");
        let Some((from, depth)) = module_of(relative) else {
            continue;
        };
        let text = std::fs::read_to_string(&file).expect("read a bench file");
        for to in references(&text, depth) {
            if to != from {
                edges
                    .entry((from.clone(), to))
                    .or_insert_with(|| relative.display().to_string());
            }
        }
    }
    edges
}

#[test]
fn no_bench_phase_imports_another_and_the_harness_imports_none() {
    let phases = bench_phases();
    assert!(
        phases.len() >= 10,
        "the scan found too few phases: {phases:?}"
    );
    assert!(
        !phases.contains("harness"),
        "the harness is a folder, not a phase"
    );
    let edges = bench_graph();
    let seen = ("cost".to_owned(), "harness".to_owned());
    assert!(
        edges.contains_key(&seen),
        "the scan sees too little: {edges:?}"
    );
    let broken: Vec<String> = edges
        .iter()
        .filter(|((from, to), _)| {
            phases.contains(to) && (phases.contains(from) || from == "harness")
        })
        .map(|((from, to), file)| format!("{from} → {to} in benches/lockside/{file}"))
        .collect();
    assert!(
        broken.is_empty(),
        "a phase imports another, or the harness a phase (what two phases share \
         belongs in benches/lockside/harness/):\n{}",
        broken.join("\n")
    );
}

#[test]
fn no_bench_file_is_over_the_size_limit() {
    let named = files_over(&bench_dir(), MAX_BENCH_LINES, "benches/lockside");
    assert!(
        named.is_empty(),
        "bench files over {MAX_BENCH_LINES} lines (split each at a seam it has):\n{}",
        named.join("\n")
    );
}
