//! The injector's TLS: its certificate and key from PEM files, reloaded when they
//! change. cert-manager renews the certificate (by default a month before it expires)
//! into the mounted Secret, and the kubelet swaps the files in place; without a reload
//! the injector would keep serving the old certificate until it expired and the API
//! server refused to call it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio_util::sync::CancellationToken;

/// A certificate or key that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file cannot be read or holds no usable PEM block.
    #[error("{path}: {problem}")]
    File {
        /// The file.
        path: String,
        /// What is wrong.
        problem: String,
    },
    /// The key does not suit rustls or does not match the certificate.
    #[error("--tls-key does not fit --tls-cert: {0}")]
    Key(rustls::Error),
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Config(rustls::Error),
}

fn file_error(path: &Path, problem: impl ToString) -> TlsError {
    TlsError::File {
        path: path.display().to_string(),
        problem: problem.to_string(),
    }
}

/// The ring provider, chosen here rather than through a process-wide default.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificate and key the injector serves, read from two PEM files; [`reload`]
/// swaps them while connections go on.
///
/// [`reload`]: CertFiles::reload
#[derive(Debug)]
pub struct CertFiles {
    cert_path: PathBuf,
    key_path: PathBuf,
    /// The files' bytes at the last successful load, to notice a change.
    loaded: RwLock<(Vec<u8>, Vec<u8>)>,
    current: RwLock<Arc<CertifiedKey>>,
}

impl CertFiles {
    /// Reads and checks both files.
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Self, TlsError> {
        let (cert_pem, key_pem) = read(cert_path, key_path)?;
        let key = certified_key(cert_path, &cert_pem, key_path, &key_pem)?;
        Ok(Self {
            cert_path: cert_path.to_owned(),
            key_path: key_path.to_owned(),
            loaded: RwLock::new((cert_pem, key_pem)),
            current: RwLock::new(Arc::new(key)),
        })
    }

    /// Reads the files again; swaps the certificate when they changed and are usable.
    /// Returns whether it swapped. On an error the previous certificate stays.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let (cert_pem, key_pem) = read(&self.cert_path, &self.key_path)?;
        let unchanged = self
            .loaded
            .read()
            .map(|l| l.0 == cert_pem && l.1 == key_pem)
            .unwrap_or(false);
        if unchanged {
            return Ok(false);
        }
        let key = certified_key(&self.cert_path, &cert_pem, &self.key_path, &key_pem)?;
        // A poisoned lock only means a panic elsewhere while holding it; the value is
        // whole (a single assignment), so keep using it.
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(key);
        *self.loaded.write().unwrap_or_else(|p| p.into_inner()) = (cert_pem, key_pem);
        Ok(true)
    }

    /// Reloads every `every` until `stop`, logging swaps and failures.
    pub async fn watch(self: Arc<Self>, every: Duration, stop: CancellationToken) {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                // A polling interval for files, not a wait for an event: the kubelet
                // updates Secret volumes through a symlink swap that inotify on the
                // file itself would miss.
                _ = tokio::time::sleep(every) => {}
            }
            match self.reload() {
                Ok(true) => {
                    tracing::info!(cert = %self.cert_path.display(), "TLS certificate reloaded")
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "TLS certificate not reloaded; serving the previous one")
                }
            }
        }
    }

    /// A rustls server configuration that serves the current certificate, HTTP/2 or
    /// HTTP/1.1 (the API server speaks either).
    pub fn server_config(self: &Arc<Self>) -> Result<Arc<ServerConfig>, TlsError> {
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Config)?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

impl ResolvesServerCert for CertFiles {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        )
    }
}

fn read(cert_path: &Path, key_path: &Path) -> Result<(Vec<u8>, Vec<u8>), TlsError> {
    let cert = std::fs::read(cert_path).map_err(|e| file_error(cert_path, e))?;
    let key = std::fs::read(key_path).map_err(|e| file_error(key_path, e))?;
    Ok((cert, key))
}

fn certified_key(
    cert_path: &Path,
    cert_pem: &[u8],
    key_path: &Path,
    key_pem: &[u8],
) -> Result<CertifiedKey, TlsError> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(cert_path, e))?;
    if chain.is_empty() {
        return Err(file_error(cert_path, "no CERTIFICATE block"));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| file_error(key_path, e))?;
    let key = CertifiedKey::from_der(chain, key, &provider()).map_err(TlsError::Key)?;
    Ok(key)
}
