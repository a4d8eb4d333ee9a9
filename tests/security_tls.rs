//! TLS and mutual TLS on the gRPC listener, and a client that brings a token and
//! certificates: handshakes with good certificates (made by the test) succeed, those
//! with bad ones fail, and the CLI passes its flags through.

mod common;

use std::time::Duration;

use common::certs::{Ca, write};
use common::{PATIENCE, Sidecar, StoreKind, TempDir, make_store};
use lockside::client::{ClientTls, ConnectOptions};
use lockside::engine::EngineConfig;
use lockside::server::{ServerConfig, tls_config};

async fn tls_sidecar(ca: &Ca, client_ca: Option<&Ca>, token: Option<&str>) -> Sidecar {
    let leaf = ca.server();
    let server = ServerConfig {
        tls: Some(tls_config(
            leaf.cert.as_bytes(),
            leaf.key.as_bytes(),
            client_ca.map(|c| c.pem.as_bytes()),
        )),
        auth_token: token.map(str::to_owned),
        ..common::test_server_config()
    };
    let store = make_store(&StoreKind::Memory, "tls");
    Sidecar::start_configured(store, EngineConfig::default(), server).await
}

fn trusting(ca: &Ca) -> ConnectOptions {
    ConnectOptions {
        auth_token: None,
        tls: Some(ClientTls {
            ca_pem: Some(ca.pem.clone().into_bytes()),
            ..ClientTls::default()
        }),
        ..ConnectOptions::default()
    }
}

/// Connects and takes a lock: the handshake and a full round trip.
async fn lock_through(addr: &str, options: &ConnectOptions) -> Result<u64, String> {
    let attempt = async {
        let client = lockside::client::Client::connect_with(addr, options)
            .await
            .map_err(|e| e.to_string())?;
        let options = lockside::client::LockOptions::default();
        let guard = client
            .lock_with("tls-key", options)
            .await
            .map_err(|e| e.to_string())?;
        let token = guard.fencing_token();
        guard.release().await.map_err(|e| e.to_string())?;
        Ok(token)
    };
    tokio::time::timeout(PATIENCE, attempt)
        .await
        .unwrap_or_else(|_| Err("timed out".into()))
}

#[tokio::test]
async fn tls_serves_clients_that_trust_its_ca_and_nobody_else() {
    let ca = Ca::new("lockside test CA");
    let sidecar = tls_sidecar(&ca, None, None).await;
    let token = lock_through(&sidecar.addr, &trusting(&ca)).await;
    assert!(token.expect("a client trusting the CA gets a lock") > 0);
    // By name too: the certificate is valid for localhost.
    let port = sidecar.addr.rsplit(':').next().expect("port");
    let by_name = lock_through(&format!("https://localhost:{port}"), &trusting(&ca)).await;
    by_name.expect("localhost matches the certificate");

    let plaintext = lock_through(&sidecar.addr, &ConnectOptions::default()).await;
    assert!(plaintext.is_err(), "a plaintext client is refused");
    let other = Ca::new("another CA");
    let untrusted = lock_through(&sidecar.addr, &trusting(&other)).await;
    let error = untrusted.expect_err("a certificate from an unknown CA is refused");
    assert!(
        error.contains("transport") || error.contains("certificate"),
        "{error}"
    );
    let mut wrong_name = trusting(&ca);
    if let Some(tls) = wrong_name.tls.as_mut() {
        tls.server_name = Some("lockside.example".into());
    }
    let misnamed = lock_through(&sidecar.addr, &wrong_name).await;
    assert!(
        misnamed.is_err(),
        "a certificate for another name is refused"
    );
    sidecar.shutdown().await;
}

#[tokio::test]
async fn mutual_tls_needs_a_client_certificate_from_the_client_ca() {
    let server_ca = Ca::new("server CA");
    let client_ca = Ca::new("client CA");
    let sidecar = tls_sidecar(&server_ca, Some(&client_ca), None).await;
    let with_identity = |ca: &Ca| {
        let leaf = ca.client("app");
        let mut options = trusting(&server_ca);
        if let Some(tls) = options.tls.as_mut() {
            tls.identity = Some((leaf.cert.into_bytes(), leaf.key.into_bytes()));
        }
        options
    };
    let good = lock_through(&sidecar.addr, &with_identity(&client_ca)).await;
    good.expect("a client certificate from the client CA is accepted");
    let none = lock_through(&sidecar.addr, &trusting(&server_ca)).await;
    assert!(none.is_err(), "no client certificate: refused");
    let forged = lock_through(&sidecar.addr, &with_identity(&Ca::new("rogue CA"))).await;
    assert!(
        forged.is_err(),
        "a client certificate from another CA: refused"
    );
    sidecar.shutdown().await;
}

/// `lockside describe` through TLS with a token: the CLI reads its flags and files.
#[tokio::test]
async fn the_cli_brings_its_token_and_ca() {
    let ca = Ca::new("cli CA");
    let sidecar = tls_sidecar(&ca, None, Some("cli-t0ken")).await;
    let dir = TempDir::new("tls-cli");
    let ca_file = write(&dir, "ca.pem", &ca.pem);
    let token_file = write(&dir, "token", "cli-t0ken\n");
    let wrong_file = write(&dir, "wrong", "not-the-t0ken\n");
    let describe = |token: &std::path::Path| {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_lockside"));
        command
            .args(["describe", "some-key", "--addr", &sidecar.addr])
            .arg("--tls-ca")
            .arg(&ca_file)
            .arg("--auth-token-file")
            .arg(token)
            .env_remove("LOCKSIDE_ADDR")
            .kill_on_drop(true);
        async move {
            let out = tokio::time::timeout(PATIENCE, command.output())
                .await
                .expect("describe in time")
                .expect("run describe");
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        }
    };
    let (code, stderr) = describe(&token_file).await;
    assert_eq!(code, Some(0), "the right token over TLS: {stderr}");
    let (code, stderr) = describe(&wrong_file).await;
    assert_eq!(code, Some(69), "a wrong token is refused");
    assert!(stderr.contains("bearer token"), "{stderr}");
    assert!(
        !stderr.contains("not-the-t0ken"),
        "the token is not echoed: {stderr}"
    );
    sidecar.shutdown().await;
}

/// Reflection lists the lock service, so grpcurl-like tools need no proto file.
#[tokio::test]
async fn reflection_lists_the_lock_service() {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let sidecar = Sidecar::start(make_store(&StoreKind::Memory, "refl")).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", sidecar.addr))
        .expect("endpoint")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connect");
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = ServerReflectionClient::new(channel)
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("reflection answers")
        .into_inner();
    let response = responses.message().await.expect("a response").expect("one");
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("not a service list: {response:?}");
    };
    let names: Vec<_> = list.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.contains(&"lockside.v1.LockService".to_owned()),
        "{names:?}"
    );
    assert!(
        names.contains(&"grpc.health.v1.Health".to_owned()),
        "{names:?}"
    );
    sidecar.shutdown().await;
}
