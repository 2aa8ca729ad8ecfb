//! `--link-tls-*`: TLS on the tcp links between the daemons (issue 55),
//! one set of flags for the three of them (part of [`CommonArgs`](crate::CommonArgs)).
//! Off by default: links are plaintext, as before.

use std::path::PathBuf;

use dataplane::control::TransportKind;
use dataplane::transport::tcp::{select_link_tls, LinkTls};

use crate::ConfigError;

/// TLS on tcp daemon links: the scheduler's control port and the
/// frontends' data ports accept with a certificate; frontends and
/// backends verify the servers they dial against a CA (the server name
/// is the address's host: an IP address SAN or a DNS name).
#[derive(clap::Args, Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkTlsArgs {
    /// TLS on tcp daemon links: this daemon's certificate chain (PEM),
    /// served on the links it accepts (scheduler, frontend) and shown to
    /// servers that ask for one (--link-tls-client-auth there) [default:
    /// plaintext links].
    #[arg(long, value_name = "PEM")]
    pub link_tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --link-tls-cert.
    #[arg(long, value_name = "PEM")]
    pub link_tls_key: Option<PathBuf>,
    /// The CA certificate (PEM) the servers this daemon dials must chain to
    /// (frontends, backends) and, with --link-tls-client-auth, its clients.
    #[arg(long, value_name = "PEM")]
    pub link_tls_ca: Option<PathBuf>,
    /// Mutual TLS: links accepted here must present a certificate the
    /// --link-tls-ca signed.
    #[arg(long)]
    pub link_tls_client_auth: bool,
}

impl LinkTlsArgs {
    /// Whether any link TLS flag is given.
    pub fn is_on(&self) -> bool {
        self.link_tls_cert.is_some() || self.link_tls_key.is_some() || self.link_tls_ca.is_some() || self.link_tls_client_auth
    }

    /// Reads the files (once, bounded) and builds the TLS configuration;
    /// None when no flag is given. Refused: TLS on a transport that is not
    /// tcp, a certificate without its key, a file that is not PEM.
    pub fn resolve(&self, transport: TransportKind) -> Result<Option<LinkTls>, ConfigError> {
        if !self.is_on() {
            return Ok(None);
        }
        if !matches!(transport, TransportKind::Tcp | TransportKind::TcpBlocking) {
            return Err(ConfigError::invalid(
                "link-tls-cert",
                format!("TLS is for tcp links; --transport {} does not use it", transport.name()),
            ));
        }
        LinkTls::from_files(
            self.link_tls_cert.as_deref(),
            self.link_tls_key.as_deref(),
            self.link_tls_ca.as_deref(),
            self.link_tls_client_auth,
        )
        .map(Some)
        .map_err(|e| ConfigError::invalid("link-tls-cert", e))
    }

    /// [`resolve`](Self::resolve), then makes it the process's link TLS
    /// (`select_link_tls`: the tcp domain the daemon opens uses it).
    pub fn select(&self, transport: TransportKind) -> Result<(), ConfigError> {
        if let Some(tls) = self.resolve(transport)? {
            select_link_tls(tls);
        }
        Ok(())
    }

    /// The command-line flags that say the same (for a launcher passing
    /// them on to the daemons it starts).
    pub fn to_flags(&self) -> Vec<String> {
        let mut flags = Vec::new();
        for (flag, path) in [
            ("--link-tls-cert", &self.link_tls_cert),
            ("--link-tls-key", &self.link_tls_key),
            ("--link-tls-ca", &self.link_tls_ca),
        ] {
            if let Some(p) = path {
                flags.push(flag.to_string());
                flags.push(p.display().to_string());
            }
        }
        if self.link_tls_client_auth {
            flags.push("--link-tls-client-auth".into());
        }
        flags
    }
}
