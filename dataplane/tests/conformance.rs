//! The transport conformance suite for every software transport:
//! shared memory, tcp on io_uring, and the blocking tcp baseline.
//!
//! io_uring may be disabled in a sandbox (seccomp, sysctl): the tcp-uring
//! tests then print why and pass vacuously, and the blocking engine still runs.

use std::sync::Arc;

#[path = "../../tests/lib/require.rs"]
mod require;
#[path = "../src/transport/stream/test_pki.rs"]
mod test_pki;

use dataplane::mem::Region;
use dataplane::transport::conformance::{self, TransportFactory};
use dataplane::transport::shm::ShmDomain;
use dataplane::transport::tcp::{Engine, LinkTls, LinkTlsPem, TcpConfig, TcpDomain};
use dataplane::transport::Error;

struct Shm;
impl TransportFactory for Shm {
    type D = ShmDomain;
    fn name(&self) -> String {
        "shm".into()
    }
    fn domain(&self) -> Result<ShmDomain, Error> {
        ShmDomain::new()
    }
    fn region(&self, len: usize) -> Result<Arc<Region>, Error> {
        Ok(Region::shared(len)?)
    }
}

struct Tcp(Engine);
impl TransportFactory for Tcp {
    type D = TcpDomain;
    fn name(&self) -> String {
        format!("tcp-{:?}", self.0)
    }
    fn domain(&self) -> Result<TcpDomain, Error> {
        TcpDomain::new(TcpConfig::new(self.0))
    }
    fn listen_addr(&self) -> String {
        "127.0.0.1:0".into()
    }
    fn sends_block(&self) -> bool {
        self.0 == Engine::Blocking
    }
}

/// tcp with TLS under the framing (issue 55): every domain accepts with
/// a certificate the suite's CA signed and verifies its peers with that
/// CA, client certificates required. Whatever the engine, a TLS link
/// moves ciphertext with plain syscalls (`stream::tls`), so its sends
/// block like the baseline's.
struct TcpTls(Engine, LinkTls);
impl TransportFactory for TcpTls {
    type D = TcpDomain;
    fn name(&self) -> String {
        format!("tcp-tls-{:?}", self.0)
    }
    fn domain(&self) -> Result<TcpDomain, Error> {
        TcpDomain::with_tls(TcpConfig::new(self.0), Some(self.1.clone()))
    }
    fn listen_addr(&self) -> String {
        "127.0.0.1:0".into()
    }
    fn sends_block(&self) -> bool {
        true
    }
}

fn tls(engine: Engine) -> TcpTls {
    static TLS: std::sync::OnceLock<LinkTls> = std::sync::OnceLock::new();
    let tls = TLS.get_or_init(|| {
        let pki = test_pki::test_pki("conformance CA");
        LinkTls::from_pem(&LinkTlsPem {
            cert: Some(pki.server.0.into_bytes()),
            key: Some(pki.server.1.into_bytes()),
            ca: Some(pki.ca.into_bytes()),
            client_auth: true,
        })
        .expect("link TLS")
    });
    TcpTls(engine, tls.clone())
}

fn uring() -> Option<Tcp> {
    // Under the suite's lock: the probe's ring fd must not disturb a leak check.
    match conformance::exclusive(TcpDomain::uring) {
        Ok(_) => Some(Tcp(Engine::Uring)),
        Err(e) => {
            // io_uring is not a capability skip: under CI its absence fails the test.
            require::capability("io_uring", false, &format!("io_uring unavailable, tcp-uring conformance not run: {e}"));
            None
        }
    }
}

// Every check of the suite for each transport, from the suite's one list.
mod shm {
    use super::*;
    dataplane::conformance_tests!(Some(Shm));
}
mod tcp_uring {
    use super::*;
    dataplane::conformance_tests!(uring());
}
mod tcp_blocking {
    use super::*;
    dataplane::conformance_tests!(Some(Tcp(Engine::Blocking)));
}
mod tcp_tls_uring {
    use super::*;
    dataplane::conformance_tests!(uring().map(|_| tls(Engine::Uring)));
}
mod tcp_tls_blocking {
    use super::*;
    dataplane::conformance_tests!(Some(tls(Engine::Blocking)));
}
