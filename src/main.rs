//! `lockside`: parses the command line and runs a subcommand. Bad flags exit 64
//! (EX_USAGE), like other sidecars, so an orchestrator can tell them from crashes.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use lockside::config::{Cli, CliCommand, LogFormat, ServeArgs, StoreSpec};
use lockside::engine::Engine;
use lockside::server::{self, Listener};
use lockside::store::{Store, memory::MemoryStore, redis::RedisStore, redlock::RedlockStore};
use lockside::webhook::{WebhookArgs, tls::CertFiles};
use tokio_util::sync::CancellationToken;

const EX_USAGE: u8 = 64;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(EX_USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let workers = match &cli.command {
        CliCommand::Serve(args) => usize::from(args.worker_threads),
        // The injector answers a few reviews a minute: one thread is plenty.
        CliCommand::Hold(_)
        | CliCommand::Describe(_)
        | CliCommand::Healthcheck(_)
        | CliCommand::Webhook(_) => 1,
        CliCommand::Bench(_) => 0,
    };
    let runtime = match workers {
        1 => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        0 => tokio::runtime::Runtime::new(),
        n => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build(),
    };
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lockside: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let (format, traces) = match &cli.command {
            CliCommand::Serve(args) => (args.log_format, args.trace_config()),
            CliCommand::Webhook(args) => (args.log_format, None),
            _ => (LogFormat::Text, None),
        };
        let telemetry = match lockside::telemetry::init(format, traces.as_ref()) {
            Ok(telemetry) => telemetry,
            Err(e) => {
                eprintln!("lockside: {e}");
                return ExitCode::from(EX_USAGE);
            }
        };
        let code = match cli.command {
            CliCommand::Serve(args) => serve(*args).await,
            CliCommand::Hold(args) => ExitCode::from(lockside::hold::hold(args).await),
            CliCommand::Describe(args) => ExitCode::from(lockside::hold::describe(args).await),
            CliCommand::Healthcheck(args) => {
                ExitCode::from(lockside::hold::healthcheck(args).await)
            }
            CliCommand::Webhook(args) => webhook(args).await,
            CliCommand::Bench(args) => match lockside::bench::run(args).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("bench: {e}");
                    ExitCode::FAILURE
                }
            },
        };
        telemetry.shutdown().await;
        code
    })
}

async fn serve(args: ServeArgs) -> ExitCode {
    let configs = args
        .engine_config()
        .and_then(|engine| Ok((engine, args.server_config()?)));
    let (config, server_config) = match configs {
        Ok(configs) => configs,
        Err(e) => {
            eprintln!("lockside serve: {e}");
            return ExitCode::from(EX_USAGE);
        }
    };
    let store: Arc<dyn Store> = match &args.store {
        StoreSpec::Memory if args.min_replica_acks > 0 => {
            eprintln!("lockside serve: --min-replica-acks needs a Redis store with replicas");
            return ExitCode::from(EX_USAGE);
        }
        StoreSpec::Memory => Arc::new(MemoryStore::new()),
        StoreSpec::Redis(url) => {
            match RedisStore::with_options(url, &args.namespace, &args.redis_options()) {
                Ok(store) => Arc::new(store),
                Err(e) => {
                    eprintln!("lockside serve: --store: {e}");
                    return ExitCode::from(EX_USAGE);
                }
            }
        }
        StoreSpec::Redlock(_) if args.min_replica_acks > 0 => {
            eprintln!(
                "lockside serve: --min-replica-acks does not apply to Redlock's independent masters"
            );
            return ExitCode::from(EX_USAGE);
        }
        StoreSpec::Redlock(url) => {
            match RedlockStore::new(url, &args.namespace, args.store_timeout) {
                Ok(store) => Arc::new(store),
                Err(e) => {
                    eprintln!("lockside serve: --store: {e}");
                    return ExitCode::from(EX_USAGE);
                }
            }
        }
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

async fn webhook(args: WebhookArgs) -> ExitCode {
    let defaults = match args.sidecar_defaults() {
        Ok(defaults) => defaults,
        Err(e) => {
            eprintln!("lockside webhook: {e}");
            return ExitCode::from(EX_USAGE);
        }
    };
    let tls = CertFiles::load(&args.tls_cert, &args.tls_key)
        .map(Arc::new)
        .and_then(|certs| Ok((certs.server_config()?, certs)));
    let (tls, certs) = match tls {
        Ok(tls) => tls,
        Err(e) => {
            eprintln!("lockside webhook: {e}");
            return ExitCode::from(EX_USAGE);
        }
    };
    let listener = match tokio::net::TcpListener::bind(&args.listen).await {
        Ok(listener) => listener,
        Err(e) => {
            tracing::error!(listen = %args.listen, error = %e, "cannot listen");
            return ExitCode::FAILURE;
        }
    };
    let bound = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    tracing::info!(
        address = %bound,
        sidecar_image = %defaults.image,
        sidecar_store = %lockside::config::redact(&defaults.store),
        "injector listening (POST /mutate, GET /healthz)"
    );
    let stop = CancellationToken::new();
    let reload = tokio::spawn(certs.watch(args.tls_reload_interval, stop.clone()));
    lockside::webhook::run(listener, tls, defaults, shutdown_signal()).await;
    stop.cancel();
    let _ = reload.await;
    ExitCode::SUCCESS
}

/// Completes on SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; only SIGKILL stops this process");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM"),
        _ = int.recv() => tracing::info!("SIGINT"),
    }
}
