//! [`EtcdTlsArgs`]: the TLS flags of every command that reaches etcd, and
//! [`EtcdTls`], the settings they load.

pub use etcd_v3::Tls as EtcdTls;

/// The TLS flags of every command that reaches etcd (flattened into its
/// arguments beside `--etcd`).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct EtcdTlsArgs {
    /// TLS to etcd: the CA certificate (PEM) that signed the etcd members'
    /// certificates. With it, --etcd endpoints without a scheme use https.
    #[arg(long, value_name = "PEM")]
    pub etcd_ca: Option<std::path::PathBuf>,
    /// This client's certificate (PEM), for etcd's --client-cert-auth
    /// (with --etcd-ca and --etcd-key).
    #[arg(long, value_name = "PEM")]
    pub etcd_cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of --etcd-cert.
    #[arg(long, value_name = "PEM")]
    pub etcd_key: Option<std::path::PathBuf>,
}

impl EtcdTlsArgs {
    /// The TLS settings the flags name, files read (`None`: plain HTTP);
    /// the error names the flag at fault.
    pub fn load(&self) -> Result<Option<EtcdTls>, (&'static str, String)> {
        let identity = match (&self.etcd_cert, &self.etcd_key) {
            (Some(cert), Some(key)) => Some((cert.as_path(), key.as_path())),
            (None, None) => None,
            (Some(_), None) => return Err(("etcd-key", "--etcd-cert needs its key: give --etcd-key".into())),
            (None, Some(_)) => return Err(("etcd-cert", "--etcd-key without --etcd-cert".into())),
        };
        let Some(ca) = &self.etcd_ca else {
            return match identity {
                None => Ok(None),
                Some(_) => Err(("etcd-ca", "a client certificate is for TLS: give --etcd-ca too".into())),
            };
        };
        EtcdTls::from_files(ca, identity).map(Some).map_err(|e| ("etcd-ca", e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::EtcdTlsArgs;
    use std::path::PathBuf;

    fn args(ca: Option<&str>, cert: Option<&str>, key: Option<&str>) -> EtcdTlsArgs {
        EtcdTlsArgs { etcd_ca: ca.map(PathBuf::from), etcd_cert: cert.map(PathBuf::from), etcd_key: key.map(PathBuf::from) }
    }

    #[test]
    fn tls_flags_come_together_or_not_at_all_and_name_the_one_at_fault() {
        assert!(matches!(args(None, None, None).load(), Ok(None)));
        assert_eq!(args(Some("ca"), Some("c"), None).load().unwrap_err().0, "etcd-key");
        assert_eq!(args(Some("ca"), None, Some("k")).load().unwrap_err().0, "etcd-cert");
        assert_eq!(args(None, Some("c"), Some("k")).load().unwrap_err().0, "etcd-ca");
        let missing = "/nonexistent/symphony-etcd-ca.pem";
        let (flag, why) = args(Some(missing), None, None).load().unwrap_err();
        assert_eq!(flag, "etcd-ca");
        assert!(why.contains(missing), "{why}");
    }

    #[test]
    fn a_file_too_large_for_a_certificate_is_refused_unread() {
        let path = std::env::temp_dir().join(format!("symphony-etcd-big-{}.pem", std::process::id()));
        let file = std::fs::File::create(&path).expect("temp file");
        file.set_len(etcd_v3::MAX_PEM_BYTES + 1).expect("sparse length");
        let got = args(path.to_str(), None, None).load();
        let _ = std::fs::remove_file(&path);
        let (flag, why) = got.unwrap_err();
        assert_eq!(flag, "etcd-ca");
        assert!(why.contains("larger than"), "{why}");
    }
}
