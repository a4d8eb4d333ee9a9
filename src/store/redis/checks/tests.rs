//! Unit tests of the store's check: what it checks, and how it reads the policy.

use super::*;

/// Every script, as `scripts.rs` includes them.
const SCRIPTS: [&str; 18] = [
    include_str!("../../lua/acquire.lua"),
    include_str!("../../lua/core.lua"),
    include_str!("../../lua/describe.lua"),
    include_str!("../../lua/epoch.lua"),
    include_str!("../../lua/fence.lua"),
    include_str!("../../lua/guard.lua"),
    include_str!("../../lua/lock.lua"),
    include_str!("../../lua/proclaim.lua"),
    include_str!("../../lua/reassert.lua"),
    include_str!("../../lua/record.lua"),
    include_str!("../../lua/reenter.lua"),
    include_str!("../../lua/rekey.lua"),
    include_str!("../../lua/release.lua"),
    include_str!("../../lua/renew.lua"),
    include_str!("../../lua/renew_across.lua"),
    include_str!("../../lua/resume.lua"),
    include_str!("../../lua/unwait.lua"),
    include_str!("../../lua/watch.lua"),
];

/// Every script of `src/store/lua/` is in [`SCRIPTS`] (but `check.lua`, the check itself).
#[test]
fn every_script_is_checked() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store/lua");
    let files = std::fs::read_dir(dir).expect("the scripts' folder");
    let scripts = files.filter_map(|f| f.ok()).map(|f| f.file_name());
    let count = scripts
        .filter(|name| name.to_string_lossy().ends_with(".lua") && name != "check.lua")
        .count();
    assert_eq!(count, SCRIPTS.len(), "a script is missing from SCRIPTS");
}

/// The commands a script's text calls: every quoted upper-case word right after
/// `redis.call(`, `redis.pcall(`, `pcall(redis.call, ` or `chunked(` (record.lua's
/// helper), and the publish commands, chosen by an expression.
fn called(script: &str) -> Vec<String> {
    let mut found = Vec::new();
    for opening in [
        "redis.call('",
        "redis.pcall('",
        "redis.call, '",
        "chunked('",
    ] {
        for (at, _) in script.match_indices(opening) {
            let rest = &script[at + opening.len()..];
            let word: String = rest
                .chars()
                .take_while(|c| c.is_ascii_uppercase())
                .collect();
            if !word.is_empty() && rest[word.len()..].starts_with('\'') {
                found.push(word);
            }
        }
    }
    for publish in ["'PUBLISH'", "'SPUBLISH'"] {
        if script.contains(publish) {
            found.push(publish.trim_matches('\'').to_owned());
        }
    }
    found
}

/// A script runs with its caller's permissions: a command it calls that the check
/// leaves out would fail inside the script on a least-privilege user while
/// `/readyz` says all is well.
#[test]
fn every_command_the_scripts_call_is_checked() {
    let everywhere = |cluster| {
        let needs = Needs {
            cluster,
            sentinel: false,
            acks: false,
        };
        needed("ns", needs)
            .into_iter()
            .map(|(name, _)| name)
            .collect::<Vec<_>>()
    };
    let (single, cluster) = (everywhere(false), everywhere(true));
    let mut calls: Vec<String> = SCRIPTS.iter().flat_map(|s| called(s)).collect();
    calls.sort();
    calls.dedup();
    assert!(calls.len() >= 20, "{calls:?}");
    for call in &calls {
        let checked = if call == "SPUBLISH" || call == "PUBSUB" {
            &cluster
        } else {
            &single
        };
        // The one subcommand the scripts call, checked as such.
        let name = if call == "PUBSUB" {
            "PUBSUB SHARDNUMSUB"
        } else {
            call.as_str()
        };
        assert!(checked.contains(&name), "{call} is called but not checked");
    }
    for command in SCRIPT_COMMANDS {
        assert!(
            calls.iter().any(|c| c == command),
            "{command} is checked but never called"
        );
    }
}

#[test]
fn commands_are_checked_on_the_namespace_and_where_needed() {
    let needs = Needs {
        cluster: false,
        sentinel: true,
        acks: true,
    };
    let needed = needed("app", needs);
    let words = |name: &str| {
        needed
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, w)| w.join(" "))
            .unwrap_or_default()
    };
    assert_eq!(words("HSET"), "HSET {app:session/check}:s k v");
    assert_eq!(words("SUBSCRIBE"), "SUBSCRIBE {app:check}:n");
    assert_eq!(words("TIME"), "TIME");
    assert_eq!(words("ZADD"), "ZADD {app:check}:h 1 m");
    assert_eq!(words("ROLE"), "ROLE");
    assert_eq!(words("WAIT"), "WAIT 1 100");
    assert!(
        !needed
            .iter()
            .any(|(n, _)| *n == "SSUBSCRIBE" || *n == "CLUSTER SLOTS")
    );
}

#[test]
fn policies_that_may_evict_a_lock_are_told_apart() {
    let info = |policy: &str| Value::VerbatimString {
        format: redis::VerbatimFormat::Text,
        text: format!("# Memory\r\nused_memory:1\r\nmaxmemory_policy:{policy}\r\n"),
    };
    for policy in [
        "allkeys-lru",
        "allkeys-lfu",
        "allkeys-random",
        "volatile-lru",
        "volatile-ttl",
    ] {
        assert_eq!(evicting_policy(&info(policy)).as_deref(), Some(policy));
    }
    assert_eq!(evicting_policy(&info("noeviction")), None);
    // A Cluster: one reply per master; one that may evict is enough.
    let cluster = Value::Map(vec![
        (Value::SimpleString("a:1".into()), info("noeviction")),
        (Value::SimpleString("b:2".into()), info("volatile-lfu")),
    ]);
    assert_eq!(evicting_policy(&cluster).as_deref(), Some("volatile-lfu"));
}
