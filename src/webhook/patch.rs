//! The injection itself: from a Pod's JSON to the JSONPatch (RFC 6902) that adds the
//! Lockside native sidecar. Pure functions of their input, no I/O, no panics.
//!
//! The patch's operations come in an order that keeps every path valid when they are
//! applied one after the other: changes to existing containers first (their indices
//! are still the original ones), the shared volume next, and the sidecar's insertion
//! at `/spec/initContainers/0`, which shifts the other init containers, last.

use serde_json::{Map, Value, json};

use super::sidecar::{
    MAX_DEFAULT_TTL, SIDECAR_NAME, SOCKET_DIR, SOCKET_VOLUME, Sidecar, SidecarDefaults, TCP_ADDR,
    check_image, env_var,
};
use crate::parse::{StoreSpec, parse_duration};
use crate::proto::limits::MIN_TTL;

/// Opts a pod in (`"true"`/`"false"`); also the label the webhook's `objectSelector`
/// matches, since a selector cannot see annotations.
pub const INJECT: &str = "lockside.io/inject";
/// The sidecar's `--store`.
pub const STORE: &str = "lockside.io/store";
/// The sidecar's `--default-ttl`.
pub const DEFAULT_TTL: &str = "lockside.io/default-ttl";
/// The sidecar's image.
pub const IMAGE: &str = "lockside.io/image";
/// `"true"`: a Unix socket in a shared `emptyDir` instead of `127.0.0.1:7420`.
pub const SOCKET: &str = "lockside.io/socket";
const KNOWN: [&str; 5] = [INJECT, STORE, DEFAULT_TTL, IMAGE, SOCKET];

/// What the webhook does with one pod.
#[derive(Debug, PartialEq)]
pub enum Decision {
    /// Nothing to do; the reason is for the logs.
    Skip(&'static str),
    /// Inject: apply these operations (a JSONPatch array's elements).
    Patch {
        /// The RFC 6902 operations.
        ops: Vec<Value>,
        /// Shown by `kubectl` to whoever created the pod (AdmissionResponse warnings).
        warnings: Vec<String>,
    },
}

/// Why a pod cannot be injected.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    /// An opted-in pod with a value the webhook cannot use: refused, naming it.
    #[error("{kind} {name}: {problem}")]
    Setting {
        /// `annotation` or `label`.
        kind: &'static str,
        /// The annotation's or label's name.
        name: &'static str,
        /// What is wrong with its value.
        problem: String,
    },
    /// The object is not shaped like a Pod (the API server never sends one): the
    /// review is malformed.
    #[error("request.object{path} {problem}")]
    Malformed {
        /// JSON path inside the object.
        path: String,
        /// What is wrong there.
        problem: &'static str,
    },
}

fn malformed(path: impl Into<String>, problem: &'static str) -> PatchError {
    PatchError::Malformed {
        path: path.into(),
        problem,
    }
}

fn annotation_error(name: &'static str, problem: String) -> PatchError {
    PatchError::Setting {
        kind: "annotation",
        name,
        problem,
    }
}

/// Decides what to do with `pod` (a Pod object as JSON) and builds the patch.
///
/// Not opted in → `Skip`, whatever else the pod carries: the webhook never refuses a
/// pod that did not ask for it.
pub fn mutate(pod: &Value, defaults: &SidecarDefaults) -> Result<Decision, PatchError> {
    let metadata = pod.get("metadata");
    let annotations = string_map(metadata, "annotations")?;
    let labels = string_map(metadata, "labels")?;
    // The annotation, when present, decides; otherwise the label (which is what the
    // MutatingWebhookConfiguration's objectSelector matches, so it alone is enough).
    let opted_in = match annotations.get(INJECT) {
        Some(value) => parse_bool("annotation", INJECT, value)?,
        None => match labels.get(INJECT) {
            Some(value) => parse_bool("label", INJECT, value)?,
            None => false,
        },
    };
    if !opted_in {
        return Ok(Decision::Skip("not opted in"));
    }
    let spec = match pod.get("spec") {
        Some(Value::Object(spec)) => spec,
        _ => return Err(malformed(".spec", "must be an object")),
    };
    let init = containers(spec, "initContainers")?;
    let apps = containers(spec, "containers")?;
    if init
        .iter()
        .chain(&apps)
        .any(|c| c.get("name") == Some(&json!(SIDECAR_NAME)))
    {
        return Ok(Decision::Skip("already has a lockside container"));
    }
    let sidecar = settings(&annotations, defaults)?;

    let mut warnings: Vec<String> = annotations
        .keys()
        .filter(|k| k.starts_with("lockside.io/") && !KNOWN.contains(&k.as_str()))
        .map(|k| {
            format!(
                "unknown annotation {k} ignored (known: {})",
                KNOWN.join(", ")
            )
        })
        .collect();
    if !sidecar.socket && spec.get("hostNetwork") == Some(&Value::Bool(true)) {
        warnings.push(format!(
            "hostNetwork pod: {TCP_ADDR} is the node's loopback, shared with every other \
             hostNetwork pod there; consider {SOCKET}: \"true\""
        ));
    }

    let mut ops = Vec::new();
    for (kind, list) in [("initContainers", &init), ("containers", &apps)] {
        for (i, container) in list.iter().enumerate() {
            let path = format!("/spec/{kind}/{i}");
            set_addr(&mut ops, &path, container, sidecar.addr())?;
            if sidecar.socket {
                mount_socket(&mut ops, &path, container)?;
            }
        }
    }
    if sidecar.socket {
        add_volume(&mut ops, spec)?;
    }
    let container = sidecar.container();
    if spec.get("initContainers").is_none_or(Value::is_null) {
        ops.push(add("/spec/initContainers", json!([container])));
    } else {
        ops.push(add("/spec/initContainers/0", container));
    }
    Ok(Decision::Patch { ops, warnings })
}

/// `metadata.<field>` as a map of strings (absent or null: empty).
fn string_map(
    metadata: Option<&Value>,
    field: &'static str,
) -> Result<Map<String, Value>, PatchError> {
    let Some(value) = metadata.and_then(|m| m.get(field)) else {
        return Ok(Map::new());
    };
    match value {
        Value::Null => Ok(Map::new()),
        Value::Object(map) if map.values().all(Value::is_string) => Ok(map.clone()),
        _ => Err(malformed(
            format!(".metadata.{field}"),
            "must map names to strings",
        )),
    }
}

fn parse_bool(kind: &'static str, name: &'static str, value: &Value) -> Result<bool, PatchError> {
    match value.as_str() {
        Some("true") => Ok(true),
        Some("false") => Ok(false),
        _ => Err(PatchError::Setting {
            kind,
            name,
            problem: format!("{} is neither \"true\" nor \"false\"", shorten(value)),
        }),
    }
}

/// A value for a message, cut short: an annotation can hold 256 KiB.
fn shorten(value: &Value) -> String {
    let text = value.as_str().unwrap_or_default();
    let cut: String = text.chars().take(64).collect();
    if cut.len() < text.len() {
        format!("{cut:?}…")
    } else {
        format!("{cut:?}")
    }
}

/// `spec.<field>` as a list of container objects (absent or null: empty).
fn containers(spec: &Map<String, Value>, field: &'static str) -> Result<Vec<Value>, PatchError> {
    match spec.get(field) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(list)) if list.iter().all(Value::is_object) => Ok(list.clone()),
        _ => Err(malformed(
            format!(".spec.{field}"),
            "must be an array of containers",
        )),
    }
}

fn settings(
    annotations: &Map<String, Value>,
    defaults: &SidecarDefaults,
) -> Result<Sidecar, PatchError> {
    let text = |name| annotations.get(name).and_then(Value::as_str);
    let store = match text(STORE) {
        None => defaults.store.clone(),
        Some(url) => match url.parse::<StoreSpec>() {
            Ok(_) => url.to_owned(),
            Err(e) => return Err(annotation_error(STORE, e)),
        },
    };
    let default_ttl = match text(DEFAULT_TTL) {
        None => defaults.default_ttl,
        Some(ttl) => {
            let ttl = parse_duration(ttl).map_err(|e| annotation_error(DEFAULT_TTL, e))?;
            if ttl < MIN_TTL || ttl > MAX_DEFAULT_TTL {
                return Err(annotation_error(
                    DEFAULT_TTL,
                    "must lie between 1s and 1h".into(),
                ));
            }
            ttl
        }
    };
    let image = match text(IMAGE) {
        None => defaults.image.clone(),
        Some(image) => {
            check_image(image).map_err(|e| annotation_error(IMAGE, e.into()))?;
            image.to_owned()
        }
    };
    let socket = match annotations.get(SOCKET) {
        None => defaults.socket,
        Some(value) => parse_bool("annotation", SOCKET, value)?,
    };
    Ok(Sidecar {
        image,
        store,
        default_ttl,
        socket,
    })
}

fn add(path: impl Into<String>, value: Value) -> Value {
    json!({ "op": "add", "path": path.into(), "value": value })
}

/// Sets `LOCKSIDE_ADDR` in one container: a new `env` array, a replaced entry (every
/// entry of that name, so no stale duplicate wins), or an entry appended.
fn set_addr(
    ops: &mut Vec<Value>,
    path: &str,
    container: &Value,
    addr: &str,
) -> Result<(), PatchError> {
    let entry = env_var("LOCKSIDE_ADDR", addr);
    match container.get("env") {
        None | Some(Value::Null) => ops.push(add(format!("{path}/env"), json!([entry]))),
        Some(Value::Array(env)) => {
            let mut replaced = false;
            for (j, var) in env.iter().enumerate() {
                if var.get("name") == Some(&json!("LOCKSIDE_ADDR")) {
                    ops.push(json!({ "op": "replace", "path": format!("{path}/env/{j}"), "value": entry }));
                    replaced = true;
                }
            }
            if !replaced {
                ops.push(add(format!("{path}/env/-"), entry));
            }
        }
        Some(_) => return Err(malformed(path_of(path, "env"), "must be an array")),
    }
    Ok(())
}

fn path_of(pointer: &str, field: &str) -> String {
    format!("{}.{field}", pointer.replace('/', "."))
}

/// Mounts the socket volume in one container, unless it already mounts that volume or
/// something else at that path (a second mount there would make the pod invalid).
fn mount_socket(ops: &mut Vec<Value>, path: &str, container: &Value) -> Result<(), PatchError> {
    let mount = json!({ "name": SOCKET_VOLUME, "mountPath": SOCKET_DIR });
    match container.get("volumeMounts") {
        None | Some(Value::Null) => ops.push(add(format!("{path}/volumeMounts"), json!([mount]))),
        Some(Value::Array(mounts)) => {
            let taken = mounts.iter().any(|m| {
                m.get("name") == Some(&json!(SOCKET_VOLUME))
                    || m.get("mountPath") == Some(&json!(SOCKET_DIR))
            });
            if !taken {
                ops.push(add(format!("{path}/volumeMounts/-"), mount));
            }
        }
        Some(_) => return Err(malformed(path_of(path, "volumeMounts"), "must be an array")),
    }
    Ok(())
}

/// Adds the socket's `emptyDir`, unless the pod already has a volume of that name (it
/// is then used as it is).
fn add_volume(ops: &mut Vec<Value>, spec: &Map<String, Value>) -> Result<(), PatchError> {
    // Memory-backed: a socket needs no disk, and tmpfs never outlives the pod.
    let volume =
        json!({ "name": SOCKET_VOLUME, "emptyDir": { "medium": "Memory", "sizeLimit": "1Mi" } });
    match spec.get("volumes") {
        None | Some(Value::Null) => ops.push(add("/spec/volumes", json!([volume]))),
        Some(Value::Array(volumes)) => {
            if !volumes
                .iter()
                .any(|v| v.get("name") == Some(&json!(SOCKET_VOLUME)))
            {
                ops.push(add("/spec/volumes/-", volume));
            }
        }
        Some(_) => return Err(malformed(".spec.volumes", "must be an array")),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::webhook::sidecar::SOCKET_ADDR;

    fn defaults() -> SidecarDefaults {
        SidecarDefaults {
            image: "lockside:test".into(),
            store: "redis://redis:6379".into(),
            default_ttl: Duration::from_secs(10),
            socket: false,
        }
    }

    fn pod(annotations: Value, spec: Value) -> Value {
        json!({ "metadata": { "annotations": annotations }, "spec": spec })
    }

    fn ops(decision: Result<Decision, PatchError>) -> Vec<Value> {
        match decision {
            Ok(Decision::Patch { ops, .. }) => ops,
            other => panic!("expected a patch, got {other:?}"),
        }
    }

    fn opted_in(spec: Value) -> Value {
        pod(json!({ INJECT: "true" }), spec)
    }

    #[test]
    fn not_opted_in_is_skipped_whatever_else_it_carries() {
        let bad = json!({ DEFAULT_TTL: "banana", SOCKET: "yes?" });
        let decision = mutate(&pod(bad, json!(null)), &defaults());
        assert_eq!(decision, Ok(Decision::Skip("not opted in")));
        let off = pod(json!({ INJECT: "false" }), json!({ "containers": [] }));
        assert_eq!(
            mutate(&off, &defaults()),
            Ok(Decision::Skip("not opted in"))
        );
        assert_eq!(
            mutate(&json!({}), &defaults()),
            Ok(Decision::Skip("not opted in"))
        );
    }

    #[test]
    fn the_label_opts_in_and_the_annotation_overrides_it() {
        let spec = json!({ "containers": [{ "name": "app" }] });
        let labelled = json!({ "metadata": { "labels": { INJECT: "true" } }, "spec": spec });
        assert!(matches!(
            mutate(&labelled, &defaults()),
            Ok(Decision::Patch { .. })
        ));
        let overridden = json!({ "metadata": { "labels": { INJECT: "true" },
            "annotations": { INJECT: "false" } }, "spec": spec });
        assert_eq!(
            mutate(&overridden, &defaults()),
            Ok(Decision::Skip("not opted in"))
        );
        let bad_label = json!({ "metadata": { "labels": { INJECT: "yes" } }, "spec": spec });
        let err = mutate(&bad_label, &defaults()).unwrap_err().to_string();
        assert!(err.starts_with("label lockside.io/inject"), "{err}");
    }

    #[test]
    fn absent_init_containers_get_a_whole_array_and_present_ones_an_insert_at_0() {
        let ops_absent = ops(mutate(
            &opted_in(json!({ "containers": [{ "name": "app" }] })),
            &defaults(),
        ));
        let last = ops_absent.last().unwrap();
        assert_eq!(last["path"], "/spec/initContainers");
        assert_eq!(last["value"][0]["name"], SIDECAR_NAME);
        assert_eq!(last["value"][0]["restartPolicy"], "Always");

        let spec =
            json!({ "initContainers": [{ "name": "migrate" }], "containers": [{ "name": "app" }] });
        let ops_present = ops(mutate(&opted_in(spec), &defaults()));
        let last = ops_present.last().unwrap();
        assert_eq!(last["op"], "add");
        assert_eq!(last["path"], "/spec/initContainers/0");
        assert_eq!(last["value"]["name"], SIDECAR_NAME);
        // The existing init container also learns the address, at its original index,
        // before the insertion shifts it.
        assert_eq!(ops_present[0]["path"], "/spec/initContainers/0/env");
    }

    #[test]
    fn lockside_addr_is_added_or_replaced_never_duplicated() {
        let spec = json!({ "containers": [
            { "name": "a" },
            { "name": "b", "env": [{ "name": "X", "value": "1" }] },
            { "name": "c", "env": [{ "name": "X", "value": "1" },
                                   { "name": "LOCKSIDE_ADDR", "value": "elsewhere:1" }] },
        ]});
        let ops = ops(mutate(&opted_in(spec), &defaults()));
        let entry = json!({ "name": "LOCKSIDE_ADDR", "value": TCP_ADDR });
        assert_eq!(ops[0], add("/spec/containers/0/env", json!([entry])));
        assert_eq!(ops[1], add("/spec/containers/1/env/-", entry.clone()));
        assert_eq!(
            ops[2],
            json!({ "op": "replace", "path": "/spec/containers/2/env/1", "value": entry })
        );
        assert_eq!(ops.len(), 4);
    }

    #[test]
    fn an_injected_pod_is_left_alone() {
        let spec = json!({ "initContainers": [{ "name": SIDECAR_NAME }], "containers": [{ "name": "app" }] });
        assert_eq!(
            mutate(&opted_in(spec), &defaults()),
            Ok(Decision::Skip("already has a lockside container"))
        );
    }

    #[test]
    fn the_socket_option_shares_an_empty_dir() {
        let spec = json!({
            "containers": [
                { "name": "a" },
                { "name": "b", "volumeMounts": [{ "name": "data", "mountPath": "/data" }] },
                { "name": "c", "volumeMounts": [{ "name": "mine", "mountPath": SOCKET_DIR }] },
            ],
            "volumes": [{ "name": "data", "emptyDir": {} }],
        });
        let annotations = json!({ INJECT: "true", SOCKET: "true" });
        let ops = ops(mutate(&pod(annotations, spec), &defaults()));
        let paths: Vec<&str> = ops.iter().filter_map(|o| o["path"].as_str()).collect();
        assert!(paths.contains(&"/spec/containers/0/volumeMounts"));
        assert!(paths.contains(&"/spec/containers/1/volumeMounts/-"));
        assert!(
            !paths
                .iter()
                .any(|p| p.starts_with("/spec/containers/2/volumeMounts"))
        );
        assert!(paths.contains(&"/spec/volumes/-"));
        let sidecar = &ops.last().unwrap()["value"][0];
        assert_eq!(sidecar["env"][1], env_var("LOCKSIDE_LISTEN", SOCKET_ADDR));
        assert_eq!(sidecar["volumeMounts"][0]["mountPath"], SOCKET_DIR);
        assert_eq!(ops[0]["value"][0], env_var("LOCKSIDE_ADDR", SOCKET_ADDR));
    }

    #[test]
    fn annotations_override_the_defaults() {
        let annotations = json!({ INJECT: "true", STORE: "rediss://r:6380", DEFAULT_TTL: "1500ms",
                                  IMAGE: "registry.example/lockside:9" });
        let ops = ops(mutate(
            &pod(annotations, json!({ "containers": [] })),
            &defaults(),
        ));
        let sidecar = &ops.last().unwrap()["value"][0];
        assert_eq!(sidecar["image"], "registry.example/lockside:9");
        assert_eq!(
            sidecar["env"][0],
            env_var("LOCKSIDE_STORE", "rediss://r:6380")
        );
        assert_eq!(sidecar["env"][2], env_var("LOCKSIDE_DEFAULT_TTL", "1500ms"));
    }

    #[test]
    fn bad_annotations_are_refused_by_name() {
        for (name, value) in [
            (INJECT, "maybe"),
            (DEFAULT_TTL, "banana"),
            (DEFAULT_TTL, "2h"),
            (DEFAULT_TTL, "0s"),
            (SOCKET, "yes?"),
            (STORE, "mysql://db"),
            (IMAGE, "has space"),
            (IMAGE, ""),
        ] {
            let mut annotations = json!({ INJECT: "true" });
            annotations[name] = json!(value);
            let err = mutate(&pod(annotations, json!({ "containers": [] })), &defaults())
                .expect_err(value);
            assert!(
                err.to_string().starts_with(&format!("annotation {name}: ")),
                "{err}"
            );
        }
    }

    #[test]
    fn unknown_annotations_and_host_network_warn() {
        let annotations = json!({ INJECT: "true", "lockside.io/defualt-ttl": "5s" });
        let spec = json!({ "hostNetwork": true, "containers": [] });
        let Ok(Decision::Patch { warnings, .. }) = mutate(&pod(annotations, spec), &defaults())
        else {
            panic!("expected a patch");
        };
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].contains("lockside.io/defualt-ttl"));
    }

    #[test]
    fn odd_shapes_are_malformed_not_panics() {
        for spec in [
            json!("text"),
            json!({ "containers": {} }),
            json!({ "containers": [1] }),
            json!({ "containers": [{ "name": "a", "env": "x" }] }),
            json!({ "containers": [], "initContainers": "x" }),
        ] {
            let err = mutate(&opted_in(spec.clone()), &defaults()).expect_err("malformed");
            assert!(matches!(err, PatchError::Malformed { .. }), "{spec}: {err}");
        }
        let numbers = json!({ "metadata": { "annotations": { INJECT: 1 } } });
        assert!(mutate(&numbers, &defaults()).is_err());
    }

    #[test]
    fn long_values_are_cut_in_messages() {
        let mut annotations = json!({ INJECT: "true" });
        annotations[SOCKET] = json!("y".repeat(10_000));
        let err = mutate(&pod(annotations, json!({ "containers": [] })), &defaults())
            .unwrap_err()
            .to_string();
        assert!(err.len() < 200, "{err}");
    }
}
