//! The `admission.k8s.io/v1` `AdmissionReview` envelope: what the API server sends to
//! `/mutate` and what it expects back. Only the fields the injector reads are typed;
//! the Pod stays a [`serde_json::Value`] (no `k8s-openapi`: the patch touches a few
//! fields, and every other field must pass through untouched anyway).

use base64::Engine as _;
use serde::Deserialize;
use serde_json::{Value, json};

use super::SidecarDefaults;
use super::patch::{self, Decision, PatchError};

const API_VERSION: &str = "admission.k8s.io/v1";
const KIND: &str = "AdmissionReview";

/// A request body that is not an `AdmissionReview` v1 the injector can answer: the
/// HTTP answer is 400 with this message.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// Not JSON, or missing a required field.
    #[error("not an AdmissionReview: {0}")]
    Json(#[from] serde_json::Error),
    /// JSON, but of another version or kind.
    #[error("expected apiVersion {API_VERSION} and kind {KIND}, got {0}")]
    Version(String),
    /// `request.uid` is empty.
    #[error("request.uid is empty")]
    NoUid,
    /// A pod CREATE whose object is missing or is not a Pod.
    #[error("{0}")]
    Object(String),
}

#[derive(Deserialize)]
struct Review {
    #[serde(rename = "apiVersion")]
    api_version: String,
    kind: String,
    request: Request,
}

#[derive(Deserialize)]
struct Request {
    uid: String,
    kind: GroupVersionKind,
    operation: String,
    #[serde(default)]
    object: Option<Value>,
    #[serde(default)]
    namespace: Option<String>,
}

#[derive(Deserialize)]
struct GroupVersionKind {
    #[serde(default)]
    group: String,
    version: String,
    kind: String,
}

/// What the injector answered, for its logs.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Allowed without a patch; the reason.
    Skipped(&'static str),
    /// Allowed with a patch of this many operations.
    Patched(usize),
    /// Refused; the message.
    Refused(String),
}

/// One answered review: the response body and what it said.
#[derive(Debug)]
pub struct Answer {
    /// The `AdmissionReview` to send back.
    pub body: Value,
    /// Echoed `request.uid`.
    pub uid: String,
    /// The pod's namespace, for the logs.
    pub namespace: String,
    /// The decision.
    pub verdict: Verdict,
}

/// Reads an `AdmissionReview` and answers it.
pub fn answer(body: &[u8], defaults: &SidecarDefaults) -> Result<Answer, ReviewError> {
    let review: Review = serde_json::from_slice(body)?;
    if review.api_version != API_VERSION || review.kind != KIND {
        return Err(ReviewError::Version(format!(
            "{} {}",
            short(&review.api_version),
            short(&review.kind)
        )));
    }
    let request = review.request;
    if request.uid.is_empty() {
        return Err(ReviewError::NoUid);
    }
    let is_pod =
        request.kind.group.is_empty() && request.kind.version == "v1" && request.kind.kind == "Pod";
    let verdict = if !is_pod || request.operation != "CREATE" {
        // The webhook configuration sends only pod CREATEs; anything else passes.
        Verdict::Skipped("not a pod creation")
    } else {
        let pod = match &request.object {
            Some(pod @ Value::Object(_)) => pod,
            _ => return Err(ReviewError::Object("request.object must be a Pod".into())),
        };
        match patch::mutate(pod, defaults) {
            Ok(Decision::Skip(reason)) => Verdict::Skipped(reason),
            Ok(Decision::Patch { ops, warnings }) => {
                let response = allowed_with_patch(&request.uid, &ops, warnings);
                return Ok(Answer {
                    body: response,
                    uid: request.uid,
                    namespace: request.namespace.unwrap_or_default(),
                    verdict: Verdict::Patched(ops.len()),
                });
            }
            Err(e @ PatchError::Setting { .. }) => Verdict::Refused(e.to_string()),
            Err(e @ PatchError::Malformed { .. }) => {
                return Err(ReviewError::Object(e.to_string()));
            }
        }
    };
    let response = match &verdict {
        Verdict::Refused(message) => json!({
            "uid": request.uid,
            "allowed": false,
            // 422 Invalid: the pod's own settings are wrong, as the API server says of
            // an invalid field.
            "status": { "code": 422, "reason": "Invalid", "message": format!("lockside injector: {message}") },
        }),
        _ => json!({ "uid": request.uid, "allowed": true }),
    };
    Ok(Answer {
        body: envelope(response),
        uid: request.uid,
        namespace: request.namespace.unwrap_or_default(),
        verdict,
    })
}

fn allowed_with_patch(uid: &str, ops: &[Value], warnings: Vec<String>) -> Value {
    let patch = base64::engine::general_purpose::STANDARD.encode(Value::from(ops).to_string());
    let mut response = json!({
        "uid": uid,
        "allowed": true,
        "patchType": "JSONPatch",
        "patch": patch,
    });
    if !warnings.is_empty() {
        response["warnings"] = json!(warnings);
    }
    envelope(response)
}

fn envelope(response: Value) -> Value {
    json!({ "apiVersion": API_VERSION, "kind": KIND, "response": response })
}

/// A client-controlled string for an error message, cut short.
fn short(text: &str) -> String {
    let cut: String = text.chars().take(64).collect();
    format!("{cut:?}")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn defaults() -> SidecarDefaults {
        SidecarDefaults {
            image: "lockside:test".into(),
            store: "memory".into(),
            default_ttl: Duration::from_secs(10),
            socket: false,
        }
    }

    fn review(operation: &str, kind: &str, object: Value) -> Vec<u8> {
        json!({
            "apiVersion": API_VERSION, "kind": KIND,
            "request": { "uid": "u-1", "kind": { "group": "", "version": "v1", "kind": kind },
                         "operation": operation, "object": object, "namespace": "ns" }
        })
        .to_string()
        .into_bytes()
    }

    #[test]
    fn malformed_reviews_are_errors() {
        for body in [
            &b"not json"[..],
            b"[]",
            b"{}",
            br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"u","kind":{"version":"v1","kind":"Pod"},"operation":"CREATE"}}"#,
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"","kind":{"version":"v1","kind":"Pod"},"operation":"CREATE"}}"#,
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","kind":{"version":"v1","kind":"Pod"},"operation":"CREATE"}}"#,
        ] {
            assert!(answer(body, &defaults()).is_err(), "{:?}", String::from_utf8_lossy(body));
        }
        let deep = "[".repeat(100_000);
        assert!(answer(deep.as_bytes(), &defaults()).is_err());
    }

    #[test]
    fn other_operations_and_kinds_pass() {
        let pod = json!({ "metadata": { "annotations": { "lockside.io/inject": "true" } } });
        for body in [
            review("UPDATE", "Pod", pod.clone()),
            review("CREATE", "Secret", pod),
        ] {
            let answer = answer(&body, &defaults()).expect("answered");
            assert_eq!(answer.verdict, Verdict::Skipped("not a pod creation"));
            assert_eq!(answer.body["response"]["allowed"], true);
            assert_eq!(answer.body["response"]["uid"], "u-1");
            assert!(answer.body["response"].get("patch").is_none());
        }
    }

    #[test]
    fn a_refusal_names_the_annotation() {
        let pod = json!({ "metadata": { "annotations": {
            "lockside.io/inject": "true", "lockside.io/default-ttl": "banana" } },
            "spec": { "containers": [] } });
        let answer = answer(&review("CREATE", "Pod", pod), &defaults()).expect("answered");
        let response = &answer.body["response"];
        assert_eq!(response["allowed"], false);
        let message = response["status"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("lockside.io/default-ttl"), "{message}");
    }
}
