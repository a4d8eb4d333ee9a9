//! `lockside webhook`: the flags of the sidecar injector, checked and turned into its
//! typed defaults; the injector itself is [`crate::webhook`].

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use tokio_util::sync::CancellationToken;

use super::shutdown_signal;
use crate::parse::{StoreSpec, parse_duration, redact};
use crate::proto::limits::MIN_TTL;
use crate::telemetry::LogFormat;
use crate::webhook::sidecar::{MAX_DEFAULT_TTL, check_image};
use crate::webhook::{self, SidecarDefaults, tls::CertFiles};

/// Flags of `lockside webhook`.
#[derive(Debug, Args)]
pub struct WebhookArgs {
    /// HTTPS listener. All interfaces: the API server dials the pod IP. 8443 and not
    /// 443: the injector runs as non-root without NET_BIND_SERVICE; the Service maps 443.
    #[arg(long, env = "LOCKSIDE_LISTEN", default_value = "0.0.0.0:8443")]
    pub listen: String,

    /// The serving certificate (PEM, leaf first), e.g. cert-manager's `tls.crt`.
    #[arg(long, env = "LOCKSIDE_TLS_CERT")]
    pub tls_cert: PathBuf,

    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1), e.g. `tls.key`.
    #[arg(long, env = "LOCKSIDE_TLS_KEY")]
    pub tls_key: PathBuf,

    /// How often the certificate files are read again to pick up a renewal. A minute
    /// is far inside cert-manager's renewal margin (a third of the lifetime) and costs
    /// two small reads.
    #[arg(long, env = "LOCKSIDE_TLS_RELOAD_INTERVAL", default_value = "60s", value_parser = parse_duration)]
    pub tls_reload_interval: Duration,

    /// Image of the injected sidecar (`lockside.io/image` overrides it). The injector's
    /// own version by default: one image is both.
    #[arg(long, env = "LOCKSIDE_SIDECAR_IMAGE", default_value = concat!("lockside:", env!("CARGO_PKG_VERSION")))]
    pub sidecar_image: String,

    /// The injected sidecar's `--store` (`lockside.io/store` overrides it). No default:
    /// locks are shared only by sidecars on one store, and an embedded memory store in
    /// every pod would hand out locks that exclude nobody.
    #[arg(long, env = "LOCKSIDE_SIDECAR_STORE")]
    pub sidecar_store: String,

    /// The injected sidecar's `--default-ttl` (`lockside.io/default-ttl` overrides it);
    /// the same default as `lockside serve`.
    #[arg(long, env = "LOCKSIDE_SIDECAR_DEFAULT_TTL", default_value = "10s", value_parser = parse_duration)]
    pub sidecar_default_ttl: Duration,

    /// Give pods the Unix socket unless they say `lockside.io/socket: "false"`. Off by
    /// default: loopback TCP works with every client, the socket needs a client that
    /// takes `unix:` addresses.
    #[arg(long, env = "LOCKSIDE_SIDECAR_SOCKET")]
    pub sidecar_socket: bool,

    /// Log format on stderr: `text` for people, `json` for log pipelines.
    #[arg(long, env = "LOCKSIDE_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

impl WebhookArgs {
    /// Checks the sidecar defaults as the annotations are checked, so that the
    /// injector never injects a sidecar that would exit 64.
    pub fn sidecar_defaults(&self) -> Result<SidecarDefaults, String> {
        self.sidecar_store
            .parse::<StoreSpec>()
            .map_err(|e| format!("--sidecar-store: {e}"))?;
        if self.sidecar_default_ttl < MIN_TTL || self.sidecar_default_ttl > MAX_DEFAULT_TTL {
            return Err("--sidecar-default-ttl must lie between 1s and 1h".into());
        }
        check_image(&self.sidecar_image).map_err(|e| format!("--sidecar-image {e}"))?;
        if self.tls_reload_interval < Duration::from_secs(1) {
            return Err("--tls-reload-interval must be at least 1s".into());
        }
        Ok(SidecarDefaults {
            image: self.sidecar_image.clone(),
            store: self.sidecar_store.clone(),
            default_ttl: self.sidecar_default_ttl,
            socket: self.sidecar_socket,
        })
    }
}

/// Runs the injector until SIGTERM or SIGINT; bad flags or certificates exit 64.
pub async fn webhook(args: WebhookArgs) -> ExitCode {
    let defaults = match args.sidecar_defaults() {
        Ok(defaults) => defaults,
        Err(e) => {
            eprintln!("lockside webhook: {e}");
            return ExitCode::from(super::EX_USAGE);
        }
    };
    let tls = CertFiles::load(&args.tls_cert, &args.tls_key)
        .map(Arc::new)
        .and_then(|certs| Ok((certs.server_config()?, certs)));
    let (tls, certs) = match tls {
        Ok(tls) => tls,
        Err(e) => {
            eprintln!("lockside webhook: {e}");
            return ExitCode::from(super::EX_USAGE);
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
        sidecar_store = %redact(&defaults.store),
        "injector listening (POST /mutate, GET /healthz)"
    );
    let stop = CancellationToken::new();
    let reload = tokio::spawn(certs.watch(args.tls_reload_interval, stop.clone()));
    webhook::run(listener, tls, defaults, shutdown_signal()).await;
    stop.cancel();
    let _ = reload.await;
    ExitCode::SUCCESS
}
