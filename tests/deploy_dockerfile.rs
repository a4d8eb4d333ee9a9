//! The Dockerfile cannot be built on these machines (no Docker engine), so its
//! promises are checked here instead: the builder compiles with exactly the cargo
//! command `.ci/run` builds with, and the image runs `lockside serve` as a numeric
//! non-root user, exposes the ports the binary listens on by default, and has a
//! HEALTHCHECK. `.ci/run` also lints it with hadolint.

use std::path::Path;

use clap::Parser;
use lockside::cli::{Cli, CliCommand};
use lockside::server::ListenAddr;

fn read(name: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(name))
        .unwrap_or_else(|e| panic!("read {name}: {e}"))
}

/// The Dockerfile's instructions, continuation lines joined, comments dropped:
/// (INSTRUCTION, arguments).
fn instructions() -> Vec<(String, String)> {
    let mut joined = Vec::new();
    let mut current = String::new();
    for line in read("Dockerfile").lines() {
        let line = line.trim();
        if line.starts_with('#') || (line.is_empty() && current.is_empty()) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(start) => {
                current.push_str(start);
                current.push(' ');
            }
            None => {
                current.push_str(line);
                joined.push(std::mem::take(&mut current));
            }
        }
    }
    joined
        .into_iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (op, args) = l.trim().split_once(' ').unwrap_or((l.trim(), ""));
            (op.to_uppercase(), args.trim().to_owned())
        })
        .collect()
}

/// The instructions of the last stage (the runtime image).
fn runtime_stage() -> Vec<(String, String)> {
    let all = instructions();
    let last_from = all
        .iter()
        .rposition(|(op, _)| op == "FROM")
        .expect("a FROM");
    all[last_from..].to_vec()
}

fn only(stage: &[(String, String)], op: &str) -> String {
    let found: Vec<&String> = stage
        .iter()
        .filter(|(o, _)| o == op)
        .map(|(_, a)| a)
        .collect();
    assert_eq!(found.len(), 1, "one {op} in the runtime stage: {found:?}");
    found[0].clone()
}

const CI_BUILD: &str = "cargo build --release --locked";

#[test]
fn the_builder_runs_the_cargo_command_ci_runs() {
    let ci = read(".ci/run");
    assert!(
        ci.lines().any(|l| l.trim() == CI_BUILD),
        ".ci/run must run `{CI_BUILD}` on a line of its own"
    );
    let cargo_calls: Vec<String> = instructions()
        .iter()
        .filter(|(op, _)| op == "RUN")
        .flat_map(|(_, args)| {
            args.split("&&")
                .map(str::trim)
                .filter(|c| c.starts_with("cargo"))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(!cargo_calls.is_empty(), "the builder runs cargo");
    for call in &cargo_calls {
        assert_eq!(call, CI_BUILD, "every cargo call of the builder");
    }
    let runtime = runtime_stage();
    let copy = only(&runtime, "COPY");
    assert!(
        copy.starts_with("--from=builder /src/target/release/lockside "),
        "the runtime copies the release binary: {copy}"
    );
}

#[test]
fn the_image_runs_serve_as_a_numeric_non_root_user_with_a_healthcheck() {
    let runtime = runtime_stage();
    let user = only(&runtime, "USER");
    let ids: Vec<u32> = user
        .split(':')
        .map(|id| id.parse().expect("a numeric uid:gid, for runAsNonRoot"))
        .collect();
    assert!(!ids.is_empty() && ids.iter().all(|&id| id != 0), "{user}");
    assert_eq!(only(&runtime, "ENTRYPOINT"), r#"["lockside"]"#);
    assert_eq!(only(&runtime, "CMD"), r#"["serve"]"#);
    let healthcheck = only(&runtime, "HEALTHCHECK");
    assert!(
        healthcheck.starts_with(r#"CMD ["lockside", "healthcheck""#),
        "{healthcheck}"
    );
}

/// The image runs with two malloc arenas, as the bench runs the sidecar it measures
/// (`benches/lockside/harness/process.rs`): more left the RSS of 100,000 held locks 15% higher in
/// half the runs.
#[test]
fn the_image_limits_malloc_arenas_as_the_bench_does() {
    assert_eq!(only(&runtime_stage(), "ENV"), "MALLOC_ARENA_MAX=2");
    let bench = read("benches/lockside/harness/process.rs");
    assert!(bench.contains(r#".env("MALLOC_ARENA_MAX", "2")"#));
}

#[test]
fn expose_names_the_ports_serve_listens_on_by_default() {
    let Ok(Cli {
        command: CliCommand::Serve(args),
    }) = Cli::try_parse_from(["lockside", "serve"])
    else {
        panic!("`lockside serve` parses without flags");
    };
    let ListenAddr::Tcp(grpc) = args.listen else {
        panic!("the default listener is TCP");
    };
    let port = |addr: &str| addr.rsplit(':').next().unwrap_or_default().to_owned();
    let exposed = only(&runtime_stage(), "EXPOSE");
    let exposed: Vec<&str> = exposed.split_whitespace().collect();
    assert_eq!(
        exposed,
        vec![port(&grpc), port(&args.admin_listen)],
        "EXPOSE gRPC then admin"
    );
}

#[test]
fn the_build_context_holds_what_the_builder_copies() {
    let ignore = read(".dockerignore");
    let allowed: Vec<&str> = ignore
        .lines()
        .filter_map(|l| l.trim().strip_prefix('!'))
        .collect();
    for (op, args) in instructions() {
        if op != "COPY" || args.starts_with("--from") {
            continue;
        }
        let mut sources: Vec<&str> = args.split_whitespace().collect();
        sources.pop(); // the destination
        for source in sources {
            let source = source.trim_end_matches('/');
            assert!(
                allowed.iter().any(|a| a.trim_end_matches('/') == source),
                "{source} is copied but not allowed by .dockerignore"
            );
        }
    }
}
