//! The sidecar injector through its real HTTPS listener: AdmissionReview v1 fixtures
//! (`tests/fixtures/admission/`) are posted over TLS with certificates made here, each
//! returned JSONPatch is applied to the pod, and the patched Pod is checked against the
//! Kubernetes 1.33 schema by `kubernetes-validate --strict` (installed by `.ci/run`).

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use common::certs::Ca;
use common::{PATIENCE, TempDir};
use lockside::webhook::SidecarDefaults;
use lockside::webhook::tls::CertFiles;
use rcgen::ExtendedKeyUsagePurpose;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;
use tokio_util::sync::CancellationToken;

const SIDECAR_IMAGE: &str = "lockside:test";
const SIDECAR_STORE: &str = "redis://lockside-redis.lockside.svc:6379";

// ---- certificates ----------------------------------------------------------------

/// A CA and a server certificate for `localhost` signed by it, as PEM.
struct Pki {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

impl Pki {
    fn new(name: &str) -> Self {
        let ca = Ca::new(name);
        let names = ["localhost", "lockside-injector.lockside-system.svc"];
        let leaf = ca.leaf(&names, ExtendedKeyUsagePurpose::ServerAuth);
        Self {
            ca_pem: ca.pem,
            cert_pem: leaf.cert,
            key_pem: leaf.key,
        }
    }

    /// Writes `tls.crt` and `tls.key` into `dir`, as a mounted Secret would hold them.
    fn write(&self, dir: &Path) -> (PathBuf, PathBuf) {
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&cert, &self.cert_pem).expect("write tls.crt");
        std::fs::write(&key, &self.key_pem).expect("write tls.key");
        (cert, key)
    }
}

// ---- the injector ----------------------------------------------------------------

/// `lockside::webhook::run` on a free loopback port; stopped on drop.
struct Injector {
    port: u16,
    certs: Arc<CertFiles>,
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
    dir: TempDir,
}

impl Injector {
    async fn start(pki: &Pki) -> Self {
        let dir = TempDir::new("webhook");
        let (cert, key) = pki.write(&dir.0);
        let certs = Arc::new(CertFiles::load(&cert, &key).expect("load certificate"));
        let tls = certs.server_config().expect("TLS config");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("local addr").port();
        let defaults = SidecarDefaults {
            image: SIDECAR_IMAGE.into(),
            store: SIDECAR_STORE.into(),
            default_ttl: Duration::from_secs(10),
            socket: false,
        };
        let stop = CancellationToken::new();
        let task = tokio::spawn(lockside::webhook::run(
            listener,
            tls,
            defaults,
            stop.clone().cancelled_owned(),
        ));
        Self {
            port,
            certs,
            stop,
            task: Some(task),
            dir,
        }
    }

    /// Stops the server and waits until `run` has returned.
    async fn shutdown(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            tokio::time::timeout(PATIENCE, task)
                .await
                .expect("run returns after shutdown")
                .expect("run does not panic");
        }
    }
}

impl Drop for Injector {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

fn connector(ca_pem: &str) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).expect("CA PEM"))
        .expect("add CA");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    TlsConnector::from(Arc::new(config))
}

/// One HTTP/1.1 request over TLS to `localhost` (the certificate's name) on 127.0.0.1,
/// trusting only `ca_pem`. Returns (status, body), or the handshake's error.
async fn https(
    port: u16,
    ca_pem: &str,
    method: &str,
    path: &str,
    body: &[u8],
) -> std::io::Result<(u16, Vec<u8>)> {
    let exchange = async {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        let name = ServerName::try_from("localhost").expect("server name");
        let mut tls = connector(ca_pem).connect(name, tcp).await?;
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        tls.write_all(head.as_bytes()).await?;
        tls.write_all(body).await?;
        tls.flush().await?;
        let mut response = Vec::new();
        match tls.read_to_end(&mut response).await {
            Ok(_) => {}
            // A peer that closes without close_notify after a complete response.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !response.is_empty() => {}
            Err(e) => return Err(e),
        }
        Ok(response)
    };
    let response = tokio::time::timeout(PATIENCE, exchange)
        .await
        .expect("the request completes in time")?;
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response head");
    let head = String::from_utf8_lossy(&response[..split]);
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    Ok((status, response[split + 4..].to_vec()))
}

fn fixture(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/admission")
        .join(name);
    let text = std::fs::read_to_string(&path).expect("read fixture");
    serde_json::from_str(&text).expect("fixture is JSON")
}

/// Posts a review; expects 200 and returns the `response` object, checking the
/// envelope and the echoed uid.
async fn review(injector: &Injector, pki: &Pki, review: &Value) -> Value {
    let body = review.to_string();
    let (status, answer) = https(
        injector.port,
        &pki.ca_pem,
        "POST",
        "/mutate",
        body.as_bytes(),
    )
    .await
    .expect("HTTPS exchange");
    let text = String::from_utf8_lossy(&answer);
    assert_eq!(status, 200, "{text}");
    let answer: Value = serde_json::from_str(&text).expect("the answer is JSON");
    assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(answer["kind"], "AdmissionReview");
    let response = answer["response"].clone();
    assert_eq!(response["uid"], review["request"]["uid"], "uid echoed");
    response
}

/// The response's JSONPatch, decoded.
fn patch_of(response: &Value) -> Vec<Value> {
    assert_eq!(response["allowed"], true, "{response}");
    assert_eq!(response["patchType"], "JSONPatch");
    let encoded = response["patch"].as_str().expect("a base64 patch");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .expect("base64");
    match serde_json::from_slice(&bytes).expect("patch JSON") {
        Value::Array(ops) => ops,
        other => panic!("a JSONPatch is an array, got {other}"),
    }
}

// ---- RFC 6902 -------------------------------------------------------------------

/// Applies `add` and `replace` operations as RFC 6902 says: `add` needs the parent
/// to exist and an array index at most its length (`-` appends); `replace` needs the
/// target to exist. Panics on anything else, which fails the test.
fn apply(doc: &mut Value, ops: &[Value]) {
    for op in ops {
        let path = op["path"].as_str().expect("op.path");
        let value = op.get("value").cloned().expect("op.value");
        let (parent, last) = path.rsplit_once('/').expect("a JSON pointer");
        let last = last.replace("~1", "/").replace("~0", "~");
        let target = doc
            .pointer_mut(parent)
            .unwrap_or_else(|| panic!("{path}: the parent does not exist"));
        match (op["op"].as_str(), target) {
            (Some("add"), Value::Object(map)) => {
                map.insert(last, value);
            }
            (Some("add"), Value::Array(list)) if last == "-" => list.push(value),
            (Some("add"), Value::Array(list)) => {
                let i: usize = last.parse().expect("an array index");
                assert!(i <= list.len(), "{path}: index past the end");
                list.insert(i, value);
            }
            (Some("replace"), Value::Object(map)) => {
                assert!(map.contains_key(&last), "{path}: nothing to replace");
                map.insert(last, value);
            }
            (Some("replace"), Value::Array(list)) => {
                let i: usize = last.parse().expect("an array index");
                assert!(i < list.len(), "{path}: nothing to replace");
                list[i] = value;
            }
            (kind, _) => panic!("{path}: unexpected operation {kind:?}"),
        }
    }
}

// ---- the Kubernetes schema --------------------------------------------------------

/// Runs `kubernetes-validate --strict -k 1.33.0` on `pod` (as `apiVersion: v1, kind:
/// Pod`); returns whether it passed and what it said.
async fn kubernetes_validate(pod: &Value) -> (bool, String) {
    let mut pod = pod.clone();
    pod["apiVersion"] = json!("v1");
    pod["kind"] = json!("Pod");
    // A pod made by a controller has only generateName at admission time; the API
    // server names it later. The validator needs a name to report on.
    if pod["metadata"].get("name").is_none() {
        let prefix = pod["metadata"]["generateName"].as_str().unwrap_or("pod-");
        pod["metadata"]["name"] = json!(format!("{prefix}test0"));
    }
    let dir = TempDir::new("validate");
    let file = dir.0.join("pod.json");
    std::fs::write(&file, pod.to_string()).expect("write pod");
    // `python3 -m`: the same program as the `kubernetes-validate` script, found even
    // where pyenv has no shim for the script yet.
    let run = tokio::process::Command::new("python3")
        .args(["-m", "kubernetes_validate", "--strict", "-k", "1.33.0"])
        .arg(&file)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(PATIENCE, run)
        .await
        .expect("kubernetes-validate finishes in time")
        .expect(
            "kubernetes-validate must be installed (pip install kubernetes-validate; .ci/run does)",
        );
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), said)
}

async fn assert_valid(pod: &Value) {
    let (ok, said) = kubernetes_validate(pod).await;
    assert!(
        ok,
        "the patched pod is not a valid 1.33 Pod: {said}\n{pod:#}"
    );
}

/// What the schema cannot check: names unique where Kubernetes wants them unique, the
/// sidecar first, and exactly one `LOCKSIDE_ADDR` of the right value everywhere else.
fn assert_injected(pod: &Value, addr: &str) {
    let spec = &pod["spec"];
    let init = spec["initContainers"].as_array().expect("initContainers");
    let apps = spec["containers"].as_array().expect("containers");
    assert_eq!(init[0]["name"], "lockside");
    assert_eq!(init[0]["restartPolicy"], "Always");
    let mut names: Vec<&str> = init
        .iter()
        .chain(apps)
        .filter_map(|c| c["name"].as_str())
        .collect();
    let count = names.len();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), count, "container names are unique");
    if let Some(volumes) = spec["volumes"].as_array() {
        let mut names: Vec<&str> = volumes.iter().filter_map(|v| v["name"].as_str()).collect();
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count, "volume names are unique");
    }
    for container in init.iter().skip(1).chain(apps) {
        let addrs: Vec<&Value> = container["env"]
            .as_array()
            .expect("env")
            .iter()
            .filter(|e| e["name"] == "LOCKSIDE_ADDR")
            .collect();
        assert_eq!(
            addrs,
            vec![&json!({ "name": "LOCKSIDE_ADDR", "value": addr })],
            "{}",
            container["name"]
        );
    }
}

fn env_value<'a>(container: &'a Value, name: &str) -> Option<&'a str> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)?["value"]
        .as_str()
}

/// Posts a fixture that must be injected; returns the patched pod after checking it.
async fn injected(injector: &Injector, pki: &Pki, review_json: &Value, addr: &str) -> Value {
    let response = review(injector, pki, review_json).await;
    let ops = patch_of(&response);
    let mut pod = review_json["request"]["object"].clone();
    apply(&mut pod, &ops);
    assert_injected(&pod, addr);
    assert_valid(&pod).await;
    pod
}

// ---- tests ------------------------------------------------------------------------

#[tokio::test]
async fn a_plain_pod_gets_the_sidecar_and_lockside_addr() {
    let pki = Pki::new("plain CA");
    let injector = Injector::start(&pki).await;
    let pod = injected(&injector, &pki, &fixture("plain.json"), "127.0.0.1:7420").await;
    let sidecar = &pod["spec"]["initContainers"][0];
    assert_eq!(sidecar["image"], SIDECAR_IMAGE);
    assert_eq!(env_value(sidecar, "LOCKSIDE_STORE"), Some(SIDECAR_STORE));
    assert_eq!(
        env_value(sidecar, "LOCKSIDE_LISTEN"),
        Some("127.0.0.1:7420")
    );
    assert_eq!(env_value(sidecar, "LOCKSIDE_DEFAULT_TTL"), Some("10s"));
    // Restarted in place, it takes over its sessions at once: its name is the pod's
    // UID, its instance lock is in the pod's emptyDir (which the app does not mount
    // without the socket option).
    let uid = sidecar["env"]
        .as_array()
        .and_then(|env| env.iter().find(|v| v["name"] == "LOCKSIDE_INSTANCE"));
    assert_eq!(
        uid.map(|v| &v["valueFrom"]["fieldRef"]["fieldPath"]),
        Some(&json!("metadata.uid"))
    );
    assert_eq!(
        env_value(sidecar, "LOCKSIDE_INSTANCE_DIR"),
        Some("/var/run/lockside")
    );
    assert_eq!(pod["spec"]["volumes"].as_array().map(Vec::len), Some(2));
    let app = &pod["spec"]["containers"][0];
    assert!(
        (app["volumeMounts"].as_array().into_iter().flatten()).all(|m| m["name"] != "lockside-run"),
        "the app's mounts are untouched: {app}"
    );
    injector.shutdown().await;
}

#[tokio::test]
async fn existing_init_containers_follow_the_sidecar_and_a_stale_addr_is_replaced() {
    let pki = Pki::new("init CA");
    let injector = Injector::start(&pki).await;
    let review_json = fixture("init-containers.json");
    let pod = injected(&injector, &pki, &review_json, "127.0.0.1:7420").await;
    let init = pod["spec"]["initContainers"].as_array().expect("init");
    assert_eq!(init.len(), 2);
    assert_eq!(init[1]["name"], "migrate");
    assert_eq!(env_value(&init[1], "DATABASE_URL"), None, "valueFrom kept");
    assert!(init[1]["env"][0]["valueFrom"].is_object());
    let app = &pod["spec"]["containers"][0];
    assert_eq!(env_value(app, "LOG_LEVEL"), Some("info"));
    assert!(
        app["env"][1].get("valueFrom").is_none(),
        "replaced, not merged"
    );
    injector.shutdown().await;
}

#[tokio::test]
async fn every_annotation_is_honoured() {
    let pki = Pki::new("annotations CA");
    let injector = Injector::start(&pki).await;
    let socket = "unix:/var/run/lockside/lockside.sock";
    let pod = injected(&injector, &pki, &fixture("every-annotation.json"), socket).await;
    let sidecar = &pod["spec"]["initContainers"][0];
    assert_eq!(sidecar["image"], "registry.example.com/lockside:0.1.0");
    assert_eq!(
        env_value(sidecar, "LOCKSIDE_STORE"),
        Some("rediss://lockside:s3cret@redis.example.com:6380/2")
    );
    assert_eq!(env_value(sidecar, "LOCKSIDE_DEFAULT_TTL"), Some("30s"));
    assert_eq!(env_value(sidecar, "LOCKSIDE_LISTEN"), Some(socket));
    assert_eq!(
        env_value(sidecar, "LOCKSIDE_ADDR"),
        Some(socket),
        "for the probes"
    );
    let volume = pod["spec"]["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == "lockside-run"))
        .expect("the socket volume");
    assert!(volume["emptyDir"].is_object());
    for container in [sidecar, &pod["spec"]["containers"][0]] {
        let mounted = container["volumeMounts"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["mountPath"] == "/var/run/lockside"));
        assert!(mounted, "{} mounts the socket", container["name"]);
    }
    injector.shutdown().await;
}

#[tokio::test]
async fn injection_is_idempotent() {
    let pki = Pki::new("idempotent CA");
    let injector = Injector::start(&pki).await;
    let already = fixture("already-injected.json");
    let response = review(&injector, &pki, &already).await;
    assert_eq!(response["allowed"], true);
    assert!(response.get("patch").is_none(), "{response}");

    // A reinvocation: the pod this injector just patched comes back unchanged.
    let mut again = fixture("plain.json");
    let pod = injected(&injector, &pki, &again, "127.0.0.1:7420").await;
    again["request"]["object"] = pod;
    let response = review(&injector, &pki, &again).await;
    assert_eq!(response["allowed"], true);
    assert!(response.get("patch").is_none(), "{response}");
    injector.shutdown().await;
}

#[tokio::test]
async fn a_pod_that_did_not_opt_in_passes_untouched() {
    let pki = Pki::new("opt-out CA");
    let injector = Injector::start(&pki).await;
    // Its lockside.io/default-ttl is "banana": not asked for, so not refused.
    let response = review(&injector, &pki, &fixture("not-opted-in.json")).await;
    assert_eq!(response["allowed"], true);
    assert!(response.get("patch").is_none(), "{response}");
    assert!(response.get("status").is_none(), "{response}");
    injector.shutdown().await;
}

#[tokio::test]
async fn unparseable_annotations_are_refused_by_name() {
    let pki = Pki::new("refusal CA");
    let injector = Injector::start(&pki).await;
    let mut cases = vec![("lockside.io/default-ttl", fixture("bad-default-ttl.json"))];
    for (name, value) in [
        ("lockside.io/inject", "maybe"),
        ("lockside.io/socket", "yes?"),
        ("lockside.io/store", "mysql://db:3306"),
        ("lockside.io/image", "two words"),
        ("lockside.io/default-ttl", "2h"),
    ] {
        let mut review_json = fixture("plain.json");
        review_json["request"]["object"]["metadata"]["annotations"][name] = json!(value);
        cases.push((name, review_json));
    }
    for (name, review_json) in cases {
        let response = review(&injector, &pki, &review_json).await;
        assert_eq!(response["allowed"], false, "{name}: {response}");
        assert!(response.get("patch").is_none());
        let message = response["status"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(name), "{name}: {message}");
        assert_eq!(response["status"]["code"], 422);
    }
    injector.shutdown().await;
}

#[tokio::test]
async fn unknown_lockside_annotations_are_injected_with_a_warning() {
    let pki = Pki::new("warning CA");
    let injector = Injector::start(&pki).await;
    let mut review_json = fixture("plain.json");
    review_json["request"]["object"]["metadata"]["annotations"]["lockside.io/defualt-ttl"] =
        json!("5s");
    let response = review(&injector, &pki, &review_json).await;
    assert!(!patch_of(&response).is_empty());
    let warnings = response["warnings"].to_string();
    assert!(warnings.contains("lockside.io/defualt-ttl"), "{warnings}");
    injector.shutdown().await;
}

#[tokio::test]
async fn malformed_requests_get_400_and_other_methods_paths_and_sizes_are_refused() {
    let pki = Pki::new("malformed CA");
    let injector = Injector::start(&pki).await;
    let mut v1beta1 = fixture("plain.json");
    v1beta1["apiVersion"] = json!("admission.k8s.io/v1beta1");
    let mut no_object = fixture("plain.json");
    no_object["request"]["object"] = Value::Null;
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (fixture("malformed.json").to_string().into_bytes(), "uid"),
        (b"{\"apiVersion\": ".to_vec(), "not an AdmissionReview"),
        (Vec::new(), "not an AdmissionReview"),
        (v1beta1.to_string().into_bytes(), "admission.k8s.io/v1beta1"),
        (no_object.to_string().into_bytes(), "request.object"),
    ];
    for (body, says) in cases {
        let (status, answer) = https(injector.port, &pki.ca_pem, "POST", "/mutate", &body)
            .await
            .expect("HTTPS exchange");
        let answer = String::from_utf8_lossy(&answer);
        assert_eq!(status, 400, "{answer}");
        assert!(answer.contains(says), "{answer:?} should mention {says:?}");
    }
    let huge = vec![b' '; lockside::webhook::MAX_BODY + 1];
    let (status, _) = https(injector.port, &pki.ca_pem, "POST", "/mutate", &huge)
        .await
        .expect("HTTPS exchange");
    assert_eq!(status, 413);
    let (status, _) = https(injector.port, &pki.ca_pem, "GET", "/mutate", b"")
        .await
        .expect("HTTPS exchange");
    assert_eq!(status, 405);
    let (status, _) = https(injector.port, &pki.ca_pem, "POST", "/validate", b"{}")
        .await
        .expect("HTTPS exchange");
    assert_eq!(status, 404);
    injector.shutdown().await;
}

#[tokio::test]
async fn healthz_answers_over_https() {
    let pki = Pki::new("healthz CA");
    let injector = Injector::start(&pki).await;
    let (status, body) = https(injector.port, &pki.ca_pem, "GET", "/healthz", b"")
        .await
        .expect("HTTPS exchange");
    assert_eq!((status, body.as_slice()), (200, &b"ok\n"[..]));
    injector.shutdown().await;
}

#[tokio::test]
async fn an_untrusted_certificate_fails_the_handshake_and_the_listener_goes_on() {
    let pki = Pki::new("trusted CA");
    let stranger = Pki::new("another CA");
    let injector = Injector::start(&pki).await;
    let failed = https(injector.port, &stranger.ca_pem, "GET", "/healthz", b"").await;
    let error = failed.expect_err("a client that trusts another CA must not connect");
    assert!(
        error.to_string().to_lowercase().contains("certificate"),
        "{error}"
    );
    // Plain bytes instead of a ClientHello: that handshake fails on the server side.
    let mut raw = tokio::net::TcpStream::connect(("127.0.0.1", injector.port))
        .await
        .expect("connect");
    raw.write_all(b"GET /healthz HTTP/1.1\r\n\r\n")
        .await
        .expect("write");
    let mut sink = Vec::new();
    let _ = tokio::time::timeout(PATIENCE, raw.read_to_end(&mut sink))
        .await
        .expect("the server closes a connection that is not TLS");
    let (status, _) = https(injector.port, &pki.ca_pem, "GET", "/healthz", b"")
        .await
        .expect("the listener still serves");
    assert_eq!(status, 200);
    injector.shutdown().await;
}

#[tokio::test]
async fn a_renewed_certificate_is_served_after_a_reload() {
    let old = Pki::new("old CA");
    let new = Pki::new("new CA");
    let injector = Injector::start(&old).await;
    assert!(!injector.certs.reload().expect("reload"), "nothing changed");
    new.write(&injector.dir.0);
    assert!(
        injector.certs.reload().expect("reload"),
        "the files changed"
    );
    let (status, _) = https(injector.port, &new.ca_pem, "GET", "/healthz", b"")
        .await
        .expect("the new certificate is served");
    assert_eq!(status, 200);
    assert!(
        https(injector.port, &old.ca_pem, "GET", "/healthz", b"")
            .await
            .is_err()
    );
    // A half-written renewal (a key that does not fit) keeps the current certificate.
    std::fs::write(injector.dir.0.join("tls.key"), &old.key_pem).expect("write");
    assert!(injector.certs.reload().is_err());
    let (status, _) = https(injector.port, &new.ca_pem, "GET", "/healthz", b"")
        .await
        .expect("still the new certificate");
    assert_eq!(status, 200);
    injector.shutdown().await;
}

#[tokio::test]
async fn shutdown_closes_idle_connections_without_waiting_for_the_drain_timeout() {
    let pki = Pki::new("shutdown CA");
    let injector = Injector::start(&pki).await;
    // One connection stuck before its handshake, one idle after it.
    let raw = tokio::net::TcpStream::connect(("127.0.0.1", injector.port))
        .await
        .expect("connect");
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", injector.port))
        .await
        .expect("connect");
    let name = ServerName::try_from("localhost").expect("server name");
    let mut idle = connector(&pki.ca_pem)
        .connect(name, tcp)
        .await
        .expect("handshake");
    let started = tokio::time::Instant::now();
    injector.shutdown().await;
    assert!(
        started.elapsed() < lockside::webhook::DRAIN_TIMEOUT,
        "shutdown took {:?}",
        started.elapsed()
    );
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(PATIENCE, idle.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "the idle connection is closed");
    drop(raw);
}

#[tokio::test]
async fn the_schema_check_can_fail() {
    let mut pod = fixture("plain.json")["request"]["object"].clone();
    assert!(kubernetes_validate(&pod).await.0);
    pod["spec"]["initContainers"] =
        json!([{ "name": "lockside", "image": "x", "restartPolicy": "Sometimes", "probe": {} }]);
    let (ok, said) = kubernetes_validate(&pod).await;
    assert!(!ok, "an invalid pod must fail: {said}");
}
