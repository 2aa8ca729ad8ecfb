//! The transport conformance suite for every software transport:
//! shared memory, tcp on io_uring, and the blocking tcp baseline.
//!
//! io_uring may be disabled in a sandbox (seccomp, sysctl): the tcp-uring
//! tests then print why and pass vacuously, and the blocking engine still runs.

use std::sync::Arc;

#[path = "../../tests/lib/require.rs"]
mod require;

use dataplane::mem::Region;
use dataplane::transport::conformance::{self, TransportFactory};
use dataplane::transport::shm::ShmDomain;
use dataplane::transport::tcp::{Engine, TcpConfig, TcpDomain};
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
