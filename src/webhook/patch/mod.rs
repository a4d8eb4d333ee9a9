//! The injection itself: from a Pod's JSON to the JSONPatch (RFC 6902) that adds the
//! Lockside native sidecar. Pure functions of their input, no I/O, no panics.
//!
//! The patch's operations come in an order that keeps every path valid when they are
//! applied one after the other: changes to existing containers first (their indices
//! are still the original ones), the shared volume next, and the sidecar's insertion
//! at `/spec/initContainers/0`, which shifts the other init containers, last.

use serde_json::{Map, Value, json};

use super::annotations::{INJECT, KNOWN, SOCKET, parse_bool, settings, string_map};
use super::sidecar::{SIDECAR_NAME, SOCKET_DIR, SOCKET_VOLUME, SidecarDefaults, TCP_ADDR, env_var};

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

pub(super) fn malformed(path: impl Into<String>, problem: &'static str) -> PatchError {
    PatchError::Malformed {
        path: path.into(),
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
    // The sidecar mounts it in any case: its instance lock lives there.
    add_volume(&mut ops, spec)?;
    let container = sidecar.container();
    if spec.get("initContainers").is_none_or(Value::is_null) {
        ops.push(add("/spec/initContainers", json!([container])));
    } else {
        ops.push(add("/spec/initContainers/0", container));
    }
    Ok(Decision::Patch { ops, warnings })
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
mod tests;
