//! Picks a transport by name and runs generic code on its domain.

use dataplane::control;
use dataplane::time::Duration;
use dataplane::transport::Domain;
use serde::{Deserialize, Serialize};

use crate::fail::{Fail, Res};

/// The transports netbench can drive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TransportKind {
    /// RDMA verbs (RC queue pairs, one-sided RDMA READ); needs `--features rdma`.
    Rdma,
    /// TCP over io_uring, READs emulated by a responder at the memory owner.
    Tcp,
    /// TCP on plain blocking sockets (baseline).
    TcpBlocking,
    /// Same-host shared memory (a READ is a bounds-checked copy).
    Shm,
}

impl TransportKind {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Rdma => "rdma",
            TransportKind::Tcp => "tcp",
            TransportKind::TcpBlocking => "tcp-blocking",
            TransportKind::Shm => "shm",
        }
    }
    /// A listen address for a server on this host when none is given.
    pub fn default_listen(self, host: &str) -> String {
        match self {
            TransportKind::Shm => String::new(),
            _ => format!("{host}:0"),
        }
    }
}

/// Code that runs on any transport domain.
pub trait WithDomain {
    /// What it returns.
    type Out;
    /// Runs on `domain`.
    fn run<D: Domain>(self, domain: D) -> Res<Self::Out>;
}

/// Options that shape a domain.
#[derive(Clone, Copy, Debug)]
pub struct DomainOptions {
    /// tcp: a READ unanswered this long breaks the connection.
    pub read_timeout: Duration,
}

impl From<TransportKind> for control::TransportKind {
    fn from(k: TransportKind) -> Self {
        match k {
            TransportKind::Rdma => control::TransportKind::Rdma,
            TransportKind::Tcp => control::TransportKind::Tcp,
            TransportKind::TcpBlocking => control::TransportKind::TcpBlocking,
            TransportKind::Shm => control::TransportKind::Shm,
        }
    }
}

/// netbench's tasks fail with [`Fail`]; the shared opener's tasks return
/// anything.
struct Adapt<W>(W);

impl<W: WithDomain> control::WithDomain for Adapt<W> {
    type Out = Res<W::Out>;
    fn run<D: Domain>(self, domain: D) -> Res<W::Out> {
        self.0.run(domain)
    }
}

/// Opens a `kind` domain (through `dataplane::control`, as the daemons do)
/// and runs `task` on it.
pub fn with_domain<W: WithDomain>(
    kind: TransportKind,
    opts: DomainOptions,
    task: W,
) -> Res<W::Out> {
    let opts = control::DomainOptions {
        tcp_read_timeout: Some(opts.read_timeout),
    };
    // The dataplane decides whether verbs are built in (its `rdma` feature, which
    // this crate's `rdma` feature turns on, as does a workspace build that enables
    // `dataplane/rdma`): READ and SEND then work; WRITE needs this crate's feature.
    control::with_domain_opts(kind.into(), opts, Adapt(task)).map_err(|e| match e {
        control::ControlError::NotBuilt { .. } => Fail::usage(format!(
            "{e}; for netbench: `cargo build -p netbench --features rdma`"
        )),
        e => Fail::runtime(e.to_string()),
    })?
}
