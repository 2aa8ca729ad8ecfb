//! Throwaway link TLS for one launch (`symphony up --link-tls`,
//! `bench-cluster --link-tls`): a fresh CA and one certificate it signed,
//! for 127.0.0.1 and localhost (server and client use), shared by every
//! daemon of the launch and written 0600 into the launch's directory.
//! Mutual: each daemon also asks its clients for a certificate.
//!
//! Why rcgen at run time (it was a test-only dependency): a launcher on
//! this host needs certificates that exist nowhere else, and rcgen with
//! ring is what the workspace already builds for its TLS tests (no second
//! crypto library, no `openssl` binary to find). The certificates live as
//! long as the launch; a deployment brings its own through
//! `--link-tls-cert/--link-tls-key/--link-tls-ca`.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::Path;

use node_shell::LinkTlsArgs;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose};

/// Why throwaway certificates could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ThrowawayTlsError {
    /// rcgen refused (no randomness, a bad parameter).
    #[error("making throwaway link TLS certificates: {0}")]
    Make(#[from] rcgen::Error),
    /// A file cannot be written.
    #[error("{}: {source}", path.display())]
    Write {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

fn write_private(path: &Path, text: &str) -> Result<(), ThrowawayTlsError> {
    let err = |source| ThrowawayTlsError::Write { path: path.to_path_buf(), source };
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path).map_err(err)?;
    f.write_all(text.as_bytes()).map_err(err)
}

/// Makes the CA and certificate, writes them into `dir` (created 0700 if
/// missing) and returns the flags that give them to a daemon.
pub fn throwaway(dir: &Path) -> Result<LinkTlsArgs, ThrowawayTlsError> {
    let dir_err = |source| ThrowawayTlsError::Write { path: dir.to_path_buf(), source };
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(dir_err)?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "symphony throwaway link CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let issuer = CertifiedIssuer::self_signed(ca, KeyPair::generate()?)?;
    let key = KeyPair::generate()?;
    let mut leaf = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])?;
    leaf.distinguished_name.push(DnType::CommonName, "symphony daemon");
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    let cert = leaf.signed_by(&key, &issuer)?;
    let (ca_path, cert_path, key_path) = (dir.join("link-ca.pem"), dir.join("link-cert.pem"), dir.join("link-key.pem"));
    write_private(&ca_path, &issuer.pem())?;
    write_private(&cert_path, &cert.pem())?;
    write_private(&key_path, &key.serialize_pem())?;
    Ok(LinkTlsArgs { link_tls_cert: Some(cert_path), link_tls_key: Some(key_path), link_tls_ca: Some(ca_path), link_tls_client_auth: true })
}
