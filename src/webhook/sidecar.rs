//! What is injected: the Lockside sidecar container, the same as
//! `deploy/base/app.yaml`'s (see the comments there for the probes, resources and
//! security context), configured by the webhook's flags and a pod's annotations.

use std::time::Duration;

use serde_json::{Value, json};

/// Name of the injected container; a pod that already has a container of this name
/// (init or app) is left alone, which makes injection idempotent.
pub const SIDECAR_NAME: &str = "lockside";
/// The `emptyDir` volume that holds the Unix socket.
pub const SOCKET_VOLUME: &str = "lockside-run";
/// Where that volume is mounted, in the sidecar and in every other container.
pub const SOCKET_DIR: &str = "/var/run/lockside";
/// `LOCKSIDE_ADDR` (and the sidecar's `LOCKSIDE_LISTEN`) with `lockside.io/socket`.
pub const SOCKET_ADDR: &str = "unix:/var/run/lockside/lockside.sock";
/// `LOCKSIDE_ADDR` (and the sidecar's `LOCKSIDE_LISTEN`) otherwise: the pod's loopback.
pub const TCP_ADDR: &str = "127.0.0.1:7420";

/// The injected sidecar's longest allowed default TTL: its own `--max-ttl` default. A
/// larger one would make `lockside serve` exit 64 and the pod never start.
pub const MAX_DEFAULT_TTL: Duration = Duration::from_secs(3600);
/// Longest image reference accepted from an annotation (registry limits are lower).
const MAX_IMAGE_LEN: usize = 512;

/// How the sidecar is configured where a pod's annotations say nothing: from the
/// webhook's flags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SidecarDefaults {
    /// Container image of the sidecar.
    pub image: String,
    /// The sidecar's `LOCKSIDE_STORE`, as written (credentials included).
    pub store: String,
    /// The sidecar's `LOCKSIDE_DEFAULT_TTL`.
    pub default_ttl: Duration,
    /// Whether pods get the Unix socket unless they say `lockside.io/socket: "false"`.
    pub socket: bool,
}

/// The sidecar settings of one pod, after its annotations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Sidecar {
    pub(super) image: String,
    pub(super) store: String,
    pub(super) default_ttl: Duration,
    pub(super) socket: bool,
}

impl Sidecar {
    /// `LOCKSIDE_ADDR` of the pod's containers (and the sidecar's `LOCKSIDE_LISTEN`).
    pub(super) fn addr(&self) -> &'static str {
        if self.socket { SOCKET_ADDR } else { TCP_ADDR }
    }

    /// The container to insert as the pod's first init container.
    pub(super) fn container(&self) -> Value {
        container(self)
    }
}

/// A plausible image reference: what the kubelet would choke on is refused here, where
/// the pod's author sees the message, instead of an `InvalidImageName` later.
pub fn check_image(image: &str) -> Result<(), &'static str> {
    if image.is_empty() || image.len() > MAX_IMAGE_LEN {
        return Err("must be an image reference of 1 to 512 characters");
    }
    if image.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("must not contain spaces or control characters");
    }
    Ok(())
}

/// A duration as the sidecar's flag parser reads it.
pub fn render_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

pub(super) fn env_var(name: &str, value: &str) -> Value {
    json!({ "name": name, "value": value })
}

/// The sidecar, the same container as `deploy/base/app.yaml`'s (see the comments
/// there for the probes, resources and security context).
fn container(sidecar: &Sidecar) -> Value {
    let mut env = vec![
        env_var("LOCKSIDE_STORE", &sidecar.store),
        env_var("LOCKSIDE_LISTEN", sidecar.addr()),
        env_var(
            "LOCKSIDE_DEFAULT_TTL",
            &render_duration(sidecar.default_ttl),
        ),
        env_var("LOCKSIDE_LOG_FORMAT", "json"),
        // Restarted in place, the sidecar takes over its sessions at once: a name of
        // its own (the pod's UID) and a lock file in the pod's emptyDir, which
        // outlives container restarts, prove its predecessor is gone.
        json!({
            "name": "LOCKSIDE_INSTANCE",
            "valueFrom": { "fieldRef": { "fieldPath": "metadata.uid" } }
        }),
        env_var("LOCKSIDE_INSTANCE_DIR", SOCKET_DIR),
    ];
    let mut container = json!({
        "name": SIDECAR_NAME,
        "image": sidecar.image,
        "imagePullPolicy": "IfNotPresent",
        // A native sidecar: started before the app containers (and before the pod's
        // other init containers), stopped after them.
        "restartPolicy": "Always",
        "args": ["serve"],
        // exec probes, not `grpc:`: the kubelet dials the pod IP, and the sidecar
        // listens on loopback (or a socket) only. `lockside healthcheck` dials
        // LOCKSIDE_ADDR from inside the container.
        "startupProbe": {
            "exec": { "command": ["lockside", "healthcheck"] },
            "periodSeconds": 1, "timeoutSeconds": 2, "failureThreshold": 60
        },
        "livenessProbe": {
            "exec": { "command": ["lockside", "healthcheck", "--live"] },
            "periodSeconds": 10, "timeoutSeconds": 3, "failureThreshold": 6
        },
        "resources": {
            "requests": { "cpu": "50m", "memory": "32Mi" },
            "limits": { "cpu": "1", "memory": "128Mi" }
        },
        "securityContext": {
            "runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
            "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
            "capabilities": { "drop": ["ALL"] },
            "seccompProfile": { "type": "RuntimeDefault" }
        }
    });
    if sidecar.socket {
        // For the probes' `lockside healthcheck`.
        env.push(env_var("LOCKSIDE_ADDR", SOCKET_ADDR));
        // The volume is this pod's alone, so a socket anyone in it may open reaches no
        // further than the loopback port would; and the app may run as any user.
        env.push(env_var("LOCKSIDE_SOCKET_MODE", "666"));
    }
    container["volumeMounts"] = json!([{ "name": SOCKET_VOLUME, "mountPath": SOCKET_DIR }]);
    container["env"] = Value::Array(env);
    container
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse_duration;

    #[test]
    fn durations_render_as_the_flag_parser_reads_them() {
        for d in [Duration::from_secs(10), Duration::from_millis(1500)] {
            assert_eq!(parse_duration(&render_duration(d)), Ok(d));
        }
    }
}
