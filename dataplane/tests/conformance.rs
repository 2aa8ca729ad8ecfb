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

macro_rules! suite {
    ($m:ident, $f:expr) => {
        mod $m {
            use super::*;
            #[test]
            fn connect_and_exchange() {
                if let Some(f) = $f {
                    conformance::connect_and_exchange(&f);
                }
            }
            #[test]
            fn read_sizes() {
                if let Some(f) = $f {
                    conformance::read_sizes(&f);
                }
            }
            #[test]
            fn incast() {
                if let Some(f) = $f {
                    conformance::incast(&f);
                }
            }
            #[test]
            fn rejects_bad_reads() {
                if let Some(f) = $f {
                    conformance::rejects_bad_reads(&f);
                }
            }
            #[test]
            fn deregister_during_reads() {
                if let Some(f) = $f {
                    conformance::deregister_during_reads(&f);
                }
            }
            #[test]
            fn disconnect_mid_read() {
                if let Some(f) = $f {
                    conformance::disconnect_mid_read(&f);
                }
            }
            #[test]
            fn no_leaks() {
                if let Some(f) = $f {
                    conformance::no_leaks(&f);
                }
            }
            #[test]
            fn wait_fd_wakes() {
                if let Some(f) = $f {
                    conformance::wait_fd_wakes(&f);
                }
            }
            #[test]
            fn wait_fd_after_empty_recv() {
                if let Some(f) = $f {
                    conformance::wait_fd_after_empty_recv(&f);
                }
            }
            #[test]
            fn input_taken_in_by_a_send_is_reported() {
                if let Some(f) = $f {
                    conformance::input_taken_in_by_a_send_is_reported(&f);
                }
            }
            #[test]
            fn send_progress_counts() {
                if let Some(f) = $f {
                    conformance::send_progress_counts(&f);
                }
            }
        }
    };
}

suite!(shm, Some(Shm));
suite!(tcp_uring, uring());
suite!(tcp_blocking, Some(Tcp(Engine::Blocking)));
