//! How the client commands (`hold`, `describe`, `healthcheck`, ...) reach the sidecar:
//! its address, bearer token and TLS.

use std::path::PathBuf;

use clap::Args;

use super::files::{read_pem, read_token};
use crate::client::{Client, ClientError, ClientTls, ConnectOptions};
use crate::proto::limits::DEFAULT_ADDR;

/// How a client reaches the sidecar: `lockside hold`, `describe` and `healthcheck`.
#[derive(Clone, Debug, Args)]
pub struct ConnectArgs {
    /// The sidecar: HOST:PORT, http(s)://HOST:PORT or unix:PATH.
    #[arg(long, env = "LOCKSIDE_ADDR", default_value = DEFAULT_ADDR)]
    pub addr: String,

    /// A file holding the sidecar's bearer token (its --auth-token-file).
    #[arg(long, env = "LOCKSIDE_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<PathBuf>,

    /// TLS: the CA that signed the sidecar's certificate (PEM). Implies TLS.
    #[arg(long, env = "LOCKSIDE_TLS_CA")]
    pub tls_ca: Option<PathBuf>,

    /// Mutual TLS: this client's certificate chain (PEM). Needs --tls-key.
    #[arg(long, env = "LOCKSIDE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// Mutual TLS: the private key of --tls-cert (PEM).
    #[arg(long, env = "LOCKSIDE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// TLS: the name the sidecar's certificate must carry, if not the address's host.
    #[arg(long, env = "LOCKSIDE_TLS_SERVER_NAME")]
    pub tls_server_name: Option<String>,

    /// Wait this long for a sidecar while nothing listens at the address (a command
    /// that may start before its sidecar); by default, fail at once.
    #[arg(long, env = "LOCKSIDE_WAIT_FOR_SIDECAR", value_parser = crate::parse::parse_duration)]
    pub wait_for_sidecar: Option<std::time::Duration>,

    /// This client's name, shown by `describe` and `watch` beside its session.
    #[arg(long, env = "LOCKSIDE_CLIENT_NAME")]
    pub client_name: Option<String>,
}

impl ConnectArgs {
    /// Reads the files and builds the client's options.
    pub fn options(&self) -> Result<ConnectOptions, String> {
        let flag = |name: &'static str| move |e: String| format!("--{name}: {e}");
        let auth_token = self
            .auth_token_file
            .as_deref()
            .map(read_token)
            .transpose()
            .map_err(flag("auth-token-file"))?;
        let tls_wanted = self.tls_ca.is_some() || self.tls_cert.is_some();
        let tls = if tls_wanted || self.addr.starts_with("https://") {
            let identity = match (&self.tls_cert, &self.tls_key) {
                (Some(cert), Some(key)) => Some((
                    read_pem(cert).map_err(flag("tls-cert"))?,
                    read_pem(key).map_err(flag("tls-key"))?,
                )),
                _ => None,
            };
            Some(ClientTls {
                ca_pem: self
                    .tls_ca
                    .as_deref()
                    .map(read_pem)
                    .transpose()
                    .map_err(flag("tls-ca"))?,
                identity,
                server_name: self.tls_server_name.clone(),
            })
        } else {
            None
        };
        Ok(ConnectOptions {
            auth_token,
            tls,
            wait_for_sidecar: self.wait_for_sidecar,
            client_name: self.client_name.clone(),
        })
    }
}

impl ConnectArgs {
    /// Connects as the flags say (a bad token or certificate file is reported like an
    /// unreachable sidecar: the command cannot do its work either way).
    pub async fn client(&self) -> Result<Client, ClientError> {
        let options = self.options().map_err(ClientError::Settings)?;
        Client::connect_with(&self.addr, &options).await
    }
}
