//! Picks a transport by name and runs generic code on its domain.

use dataplane::time::Duration;
use dataplane::transport::shm::ShmDomain;
use dataplane::transport::tcp::{Engine, TcpConfig, TcpDomain};
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

/// Opens a `kind` domain and runs `task` on it.
pub fn with_domain<W: WithDomain>(
    kind: TransportKind,
    opts: DomainOptions,
    task: W,
) -> Res<W::Out> {
    match kind {
        TransportKind::Tcp | TransportKind::TcpBlocking => {
            let engine = if kind == TransportKind::Tcp {
                Engine::Uring
            } else {
                Engine::Blocking
            };
            let mut cfg = TcpConfig::new(engine);
            cfg.read_timeout = opts.read_timeout;
            let d = TcpDomain::new(cfg).map_err(|e| {
                Fail::runtime(format!(
                    "transport {} unavailable: {e} (try --transport tcp-blocking)",
                    kind.name()
                ))
            })?;
            task.run(d)
        }
        TransportKind::Shm => {
            let d = ShmDomain::new()
                .map_err(|e| Fail::runtime(format!("transport shm unavailable: {e}")))?;
            task.run(d)
        }
        TransportKind::Rdma => rdma(task),
    }
}

#[cfg(feature = "rdma")]
fn rdma<W: WithDomain>(task: W) -> Res<W::Out> {
    use dataplane::transport::rdma::RdmaDomain;
    let d = RdmaDomain::from_env()
        .map_err(|e| Fail::runtime(format!("transport rdma unavailable: {e}")))?;
    task.run(d)
}

#[cfg(not(feature = "rdma"))]
fn rdma<W: WithDomain>(_task: W) -> Res<W::Out> {
    Err(Fail::usage(
        "transport rdma: this netbench was built without RDMA support \
         (rebuild with `cargo build -p netbench --features rdma`)",
    ))
}
