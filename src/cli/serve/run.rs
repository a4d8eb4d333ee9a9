//! The sidecar's start: the store, the listeners, the engine, then serving until
//! SIGTERM or SIGINT.

use std::process::ExitCode;

use super::super::shutdown_signal;
use super::{ServeArgs, instance};
use crate::engine::Engine;
use crate::server::{self, Listener};

/// Runs the sidecar until SIGTERM or SIGINT; bad flags exit 64.
pub async fn serve(args: ServeArgs) -> ExitCode {
    let built = args.engine_config().and_then(|engine| {
        let server = args.server_config()?;
        Ok((engine, server, args.store()?))
    });
    let (mut config, server_config, store) = match built {
        Ok(built) => built,
        Err(e) => {
            eprintln!("lockside serve: {e}");
            return ExitCode::from(super::super::EX_USAGE);
        }
    };
    // Held until `serve` returns: the proof that no other process runs as this one.
    let _instance = match (&args.instance, &args.instance_dir) {
        (Some(name), Some(dir)) => match instance::take(name, dir) {
            Ok(instance) => {
                config.instance = Some(instance.name.clone());
                Some(instance)
            }
            Err(e) => {
                eprintln!("lockside serve: {e}");
                return ExitCode::from(super::super::EX_USAGE);
            }
        },
        _ => None,
    };
    let listener = match Listener::bind(&args.listen).await {
        Ok(listener) => listener,
        Err(e) => {
            tracing::error!(listen = ?args.listen, error = %e, "cannot listen");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = listener.set_socket_mode(args.socket_mode) {
        tracing::error!(error = %e, "cannot set the socket's mode");
        return ExitCode::FAILURE;
    }
    let admin = match args.admin_listen.as_str() {
        "none" | "" => None,
        addr => match tokio::net::TcpListener::bind(addr).await {
            Ok(admin) => {
                let bound = admin
                    .local_addr()
                    .map(|a| a.to_string())
                    .unwrap_or_default();
                tracing::info!(address = %bound, "admin listening (/livez /readyz /metrics)");
                Some(admin)
            }
            Err(e) => {
                tracing::error!(admin_listen = %addr, error = %e, "cannot listen");
                return ExitCode::FAILURE;
            }
        },
    };
    let engine = Engine::new(store, config);
    if let Err(e) = engine.ping().await {
        // Not fatal: the sidecar serves and answers UNAVAILABLE until the store is back.
        tracing::warn!(store = %args.store, error = %e, "the store does not answer yet");
    }
    tracing::info!(
        address = %listener.local_addr(),
        store = %args.store,
        namespace = %args.namespace,
        "listening"
    );
    match server::run(listener, admin, engine, server_config, shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "server failed");
            ExitCode::FAILURE
        }
    }
}
