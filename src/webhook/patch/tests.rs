//! Unit tests of the patch: every pod shape the API server may send.
use std::time::Duration;

use super::*;
use crate::webhook::annotations::{DEFAULT_TTL, IMAGE, STORE};
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
    // Then the sidecar's emptyDir (its instance lock) and the sidecar.
    assert_eq!(ops.len(), 5);
}

#[test]
fn an_injected_pod_is_left_alone() {
    let spec =
        json!({ "initContainers": [{ "name": SIDECAR_NAME }], "containers": [{ "name": "app" }] });
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
        let err =
            mutate(&pod(annotations, json!({ "containers": [] })), &defaults()).expect_err(value);
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
    let Ok(Decision::Patch { warnings, .. }) = mutate(&pod(annotations, spec), &defaults()) else {
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
