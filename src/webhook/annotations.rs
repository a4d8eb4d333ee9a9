//! The pod's settings: the `lockside.io/*` annotations (and the opt-in label), read and
//! checked as `lockside serve` would check the flags they become, so the injector never
//! injects a sidecar that would exit 64.

use serde_json::{Map, Value};

use super::patch::{PatchError, malformed};
use super::sidecar::{MAX_DEFAULT_TTL, Sidecar, SidecarDefaults, check_image};
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
pub(super) const KNOWN: [&str; 5] = [INJECT, STORE, DEFAULT_TTL, IMAGE, SOCKET];

fn annotation_error(name: &'static str, problem: String) -> PatchError {
    PatchError::Setting {
        kind: "annotation",
        name,
        problem,
    }
}

/// `metadata.<field>` as a map of strings (absent or null: empty).
pub(super) fn string_map(
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

pub(super) fn parse_bool(
    kind: &'static str,
    name: &'static str,
    value: &Value,
) -> Result<bool, PatchError> {
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

/// The sidecar a pod asks for: its annotations over the injector's defaults.
pub(super) fn settings(
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
