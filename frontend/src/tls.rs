//! TLS for the HTTP and gRPC endpoints (rustls, ring provider), off by
//! default: a certificate chain and a private key read from PEM files.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Why a TLS identity cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file cannot be read.
    #[error("{}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The certificate chain or key does not parse, or they do not match.
    #[error("TLS certificate {} / key {}: {why}", cert.display(), key.display())]
    Identity {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// Why.
        #[source]
        why: Box<TlsError>,
    },
    /// A PEM section does not parse.
    #[error("{what} PEM: {source}")]
    Pem {
        /// "certificate" or "private key".
        what: &'static str,
        /// The parser's error.
        source: rustls::pki_types::pem::Error,
    },
    /// The certificate PEM file holds no certificate.
    #[error("no certificate in the PEM file")]
    NoCertificate,
    /// rustls refused the configuration (e.g. the key does not match the
    /// certificate).
    #[error(transparent)]
    Rustls(#[from] rustls::Error),
    /// Only one of `--tls-cert` and `--tls-key` was given.
    #[error("--tls-cert and --tls-key go together")]
    Unpaired,
}

/// A server identity: the PEM certificate chain and private key.
#[derive(Clone, PartialEq, Eq)]
pub struct TlsIdentity {
    /// PEM certificate chain (leaf first).
    pub cert_pem: Vec<u8>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key_pem: Vec<u8>,
}

impl std::fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.debug_struct("TlsIdentity").finish_non_exhaustive()
    }
}

impl TlsIdentity {
    /// Reads `cert` and `key` (PEM files) and checks that they parse and match.
    pub fn from_files(cert: &Path, key: &Path) -> Result<TlsIdentity, TlsError> {
        let read = |p: &Path| std::fs::read(p).map_err(|source| TlsError::Read { path: p.to_path_buf(), source });
        let id = TlsIdentity {
            cert_pem: read(cert)?,
            key_pem: read(key)?,
        };
        id.http_config().map_err(|e| TlsError::Identity {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            why: Box::new(e),
        })?;
        Ok(id)
    }

    /// The rustls server configuration for HTTP/1.1.
    pub fn http_config(&self) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&self.cert_pem)
            .collect::<Result<_, _>>()
            .map_err(|source| TlsError::Pem { what: "certificate", source })?;
        if certs.is_empty() {
            return Err(TlsError::NoCertificate);
        }
        let key = PrivateKeyDer::from_pem_slice(&self.key_pem)
            .map_err(|source| TlsError::Pem { what: "private key", source })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(certs, key)?;
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(cfg))
    }

    /// The tonic (gRPC) server TLS configuration.
    pub fn grpc_config(&self) -> tonic::transport::ServerTlsConfig {
        tonic::transport::ServerTlsConfig::new().identity(tonic::transport::Identity::from_pem(
            &self.cert_pem,
            &self.key_pem,
        ))
    }
}

/// Resolves the `--tls-cert` / `--tls-key` pair: both or neither.
pub fn from_options(
    cert: Option<&PathBuf>,
    key: Option<&PathBuf>,
) -> Result<Option<TlsIdentity>, TlsError> {
    match (cert, key) {
        (None, None) => Ok(None),
        (Some(c), Some(k)) => TlsIdentity::from_files(c, k).map(Some),
        _ => Err(TlsError::Unpaired),
    }
}
