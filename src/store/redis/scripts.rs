//! The Lua scripts, one per state change (`src/store/lua/`). A script says which helper
//! files it needs with `--#include core` and `--#include lock` lines, placed where the
//! helpers must be defined: the common case of a script runs before `lock`'s helpers
//! are defined, so it does not pay for creating them on every call.

use deadpool_redis::redis::Script;

/// The helper files a script may include, by name.
const INCLUDES: [(&str, &str); 3] = [
    ("core", include_str!("../lua/core.lua")),
    ("lock", include_str!("../lua/lock.lua")),
    ("guard", include_str!("../lua/guard.lua")),
];

/// A script and its text (a Cluster node that lacks it gets `EVAL` of the text: see
/// `renew/calls.rs`).
#[derive(Clone)]
pub(super) struct Lua {
    pub(super) script: Script,
    pub(super) source: String,
}

impl Lua {
    /// `text` with its includes expanded; `flags` (e.g. `allow-cross-slot-keys`) go on
    /// its shebang line.
    fn new(text: &str, flags: Option<&str>) -> Self {
        let mut source = String::new();
        if let Some(flags) = flags {
            source.push_str(&format!("#!lua flags={flags}\n"));
        }
        for line in text.lines() {
            match line.strip_prefix("--#include ") {
                Some(name) => {
                    let (_, helpers) = INCLUDES
                        .iter()
                        .find(|(n, _)| *n == name.trim())
                        .unwrap_or(&("", ""));
                    source.push_str(helpers);
                }
                None => {
                    source.push_str(line);
                    source.push('\n');
                }
            }
        }
        Self {
            script: Script::new(&source),
            source,
        }
    }
}

/// Every script of the store.
pub(super) struct Scripts {
    pub(super) acquire: Lua,
    pub(super) reenter: Lua,
    pub(super) release: Lua,
    pub(super) renew: Lua,
    /// `renew_across.lua`, flagged `allow-cross-slot-keys` (Redis 7): on a Cluster, one
    /// call renews the grants of many slots served by one node.
    pub(super) renew_across_slots: Lua,
    pub(super) unwait: Lua,
    pub(super) describe: Lua,
    pub(super) fence: Lua,
    pub(super) proclaim: Lua,
    /// A grant written back after the store lost its data (`redis/restarts/`).
    pub(super) reassert: Lua,
    pub(super) watch: Lua,
    /// Session records and resuming (`redis/sessions.rs`).
    pub(super) record: Lua,
    pub(super) resume: Lua,
    pub(super) rekey: Lua,
}

impl Scripts {
    pub(super) fn new() -> Self {
        let lua = |text| Lua::new(text, None);
        Self {
            acquire: lua(include_str!("../lua/acquire.lua")),
            reenter: lua(include_str!("../lua/reenter.lua")),
            release: lua(include_str!("../lua/release.lua")),
            renew: lua(include_str!("../lua/renew.lua")),
            renew_across_slots: Lua::new(
                include_str!("../lua/renew_across.lua"),
                Some("allow-cross-slot-keys"),
            ),
            unwait: lua(include_str!("../lua/unwait.lua")),
            describe: lua(include_str!("../lua/describe.lua")),
            fence: lua(include_str!("../lua/fence.lua")),
            proclaim: lua(include_str!("../lua/proclaim.lua")),
            reassert: lua(include_str!("../lua/reassert.lua")),
            watch: lua(include_str!("../lua/watch.lua")),
            record: lua(include_str!("../lua/record.lua")),
            resume: lua(include_str!("../lua/resume.lua")),
            rekey: lua(include_str!("../lua/rekey.lua")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn includes_are_expanded_where_they_stand() {
        let scripts = Scripts::new();
        let acquire = &scripts.acquire.source;
        assert!(
            !acquire.lines().any(|l| l.starts_with("--#include")),
            "every include expanded"
        );
        let fast = acquire.find("tail, 'PX', ttl)").expect("the fast path");
        for helpers in ["local function now_ms(", "local function load("] {
            let helpers = acquire.find(helpers).expect("core and lock helpers");
            assert!(
                fast < helpers,
                "the common case runs before the helpers are made"
            );
        }
        let release = &scripts.release.source;
        let fast = release.find("'KEEPTTL', 'GET')").expect("the fast path");
        let helpers = release
            .find("local function now_ms(")
            .expect("core helpers");
        assert!(fast < helpers, "the common case runs before the helpers");
        assert!(
            scripts
                .renew_across_slots
                .source
                .starts_with("#!lua flags=allow-cross-slot-keys\n")
        );
    }
}
