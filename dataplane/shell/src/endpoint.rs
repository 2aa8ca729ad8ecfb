//! The `/metrics` and `/health` HTTP endpoint every daemon serves.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::metrics::{self, MetricsRegistry};

/// A minimal HTTP/1.1 endpoint: `GET /metrics` returns the registry's
/// OpenMetrics text ([`crate::metrics`]), `GET /health` returns 200,
/// anything else 404. One request per connection, bounded reads.
///
/// A client cannot starve the others (issue 55: one client trickling a
/// byte every 1.5 s made `/health` time out for a liveness probe): the
/// acceptor thread never reads; each connection is served on its own
/// short-lived thread and must send its request within
/// [`METRICS_REQUEST_DEADLINE`] in all; at most [`METRICS_MAX_CLIENTS`]
/// are open at once, and a new connection beyond that closes the oldest,
/// so a flood of idle connections pushes out its own, not a probe that
/// connects after it and asks at once.
pub struct MetricsEndpoint {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// Most connections of a [`MetricsEndpoint`] served at once.
pub const METRICS_MAX_CLIENTS: usize = 64;
/// How long a [`MetricsEndpoint`] client has to send its whole request
/// (and to take the answer).
pub const METRICS_REQUEST_DEADLINE: std::time::Duration = std::time::Duration::from_secs(1);

/// The connections a [`MetricsEndpoint`] serves now: (id, a handle to
/// close it with), oldest first.
type OpenClients = Arc<std::sync::Mutex<std::collections::VecDeque<(u64, TcpStream)>>>;

impl MetricsEndpoint {
    /// Listens on `addr` (port 0 picks one).
    pub fn start(addr: SocketAddr, registry: Arc<MetricsRegistry>) -> std::io::Result<MetricsEndpoint> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("metrics-http".into())
            .spawn(move || {
                let open: OpenClients = Arc::default();
                let mut next_id = 0u64;
                for conn in listener.incoming() {
                    if flag.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(s) = conn else { continue };
                    let id = next_id;
                    next_id += 1;
                    admit(&open, id, &s);
                    let (mine, registry) = (open.clone(), registry.clone());
                    let spawned = std::thread::Builder::new()
                        .name("metrics-client".into())
                        .stack_size(64 << 10)
                        .spawn(move || {
                            let _ = serve_one(s, &registry);
                            forget(&mine, id);
                        });
                    // Out of threads: this connection is dropped (closed),
                    // the endpoint goes on.
                    if spawned.is_err() {
                        forget(&open, id);
                    }
                }
            })?;
        Ok(MetricsEndpoint {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

fn lock_clients(open: &OpenClients) -> std::sync::MutexGuard<'_, std::collections::VecDeque<(u64, TcpStream)>> {
    // Every update is one push or removal: a panic elsewhere leaves it whole.
    open.lock().unwrap_or_else(|p| p.into_inner())
}

/// Records connection `id`, first closing the oldest if
/// [`METRICS_MAX_CLIENTS`] are open (its thread's read then ends at once).
fn admit(open: &OpenClients, id: u64, s: &TcpStream) {
    let mut open = lock_clients(open);
    while open.len() >= METRICS_MAX_CLIENTS {
        if let Some((_, oldest)) = open.pop_front() {
            let _ = oldest.shutdown(std::net::Shutdown::Both);
        }
    }
    if let Ok(handle) = s.try_clone() {
        open.push_back((id, handle));
    }
}

fn forget(open: &OpenClients, id: u64) {
    lock_clients(open).retain(|(i, _)| *i != id);
}

impl Drop for MetricsEndpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Unblocks `accept`; the thread then sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, std::time::Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve_one(mut s: TcpStream, registry: &MetricsRegistry) -> std::io::Result<()> {
    let deadline = std::time::Instant::now() + METRICS_REQUEST_DEADLINE;
    s.set_write_timeout(Some(METRICS_REQUEST_DEADLINE))?;
    let mut req = [0u8; 4096];
    let mut n = 0;
    while n < req.len() && !req[..n].windows(4).any(|w| w == b"\r\n\r\n") {
        // The deadline bounds the whole request, not each read: a byte
        // now and then does not keep the connection.
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut req[n..])? {
            0 => break,
            k => n += k,
        }
    }
    let line = req[..n].split(|&b| b == b'\r').next().unwrap_or(&[]);
    let (status, ctype, body) = if line.starts_with(b"GET /metrics ") {
        ("200 OK", metrics::CONTENT_TYPE, registry.encode())
    } else if line.starts_with(b"GET /health ") {
        ("200 OK", "text/plain", "ok\n".to_string())
    } else {
        ("404 Not Found", "text/plain", "not found\n".to_string())
    };
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane::control::{http_get, metric, metric_sum};

    #[test]
    fn metrics_endpoint_serves_scrapes_and_refuses_other_paths() {
        let registry = Arc::new(MetricsRegistry::new());
        registry.register("symphony_up", "Up", metrics::Computed::gauge_of(|| 1.0));
        let req = metrics::labelled(&registry, "req", "Requests", "model", ["a".into(), "b".into()], metrics::FloatGauge::default);
        req[0].set(2.0);
        req[1].set(3.5);
        let ep = MetricsEndpoint::start("127.0.0.1:0".parse().unwrap(), registry).unwrap();
        let t = std::time::Duration::from_secs(5);
        let body = http_get(ep.addr(), "/metrics", t).unwrap();
        assert_eq!(metric(&body, "symphony_up"), Some(1.0));
        assert_eq!(metric(&body, "req{model=\"b\"}"), Some(3.5));
        assert_eq!(metric_sum(&body, "req"), 5.5);
        assert_eq!(metric(&body, "symphony"), None);
        assert!(http_get(ep.addr(), "/nope", t).is_err());
        assert_eq!(http_get(ep.addr(), "/health", t).unwrap(), "ok\n");
        drop(ep);
    }

    #[test]
    fn health_answers_within_a_second_while_idle_and_trickling_clients_stall() {
        let ep = MetricsEndpoint::start("127.0.0.1:0".parse().unwrap(), Arc::new(MetricsRegistry::new())).unwrap();
        // More idle connections than the client bound, and one that
        // trickles a request byte by byte. Fewer than the listen backlog
        // (128): a burst beyond it has the kernel drop SYNs, and a probe
        // then waits for its SYN's 1 s retransmission whatever the
        // endpoint does (tests/security/bounds.py holds 1000, made first).
        let idle: Vec<TcpStream> = (0..METRICS_MAX_CLIENTS + 16).map(|_| TcpStream::connect(ep.addr()).unwrap()).collect();
        let mut trickle = TcpStream::connect(ep.addr()).unwrap();
        trickle.write_all(b"GET /he").unwrap();
        for _ in 0..3 {
            let started = std::time::Instant::now();
            let health = http_get(ep.addr(), "/health", std::time::Duration::from_secs(5));
            assert_eq!(health.unwrap(), "ok\n");
            let took = started.elapsed();
            assert!(took < std::time::Duration::from_secs(1), "/health took {took:?}");
            let _ = trickle.write_all(b"a");
        }
        // The trickler is cut off by the whole-request deadline, however
        // often it sends.
        let cut = std::time::Instant::now() + 3 * METRICS_REQUEST_DEADLINE;
        let mut closed = false;
        while std::time::Instant::now() < cut && !closed {
            closed = trickle.write_all(b"l").is_err();
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert!(closed, "a trickled request held its connection past the deadline");
        drop(idle);
    }
}
