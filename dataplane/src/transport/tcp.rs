//! TCP transport: control messages framed on the stream, one-sided READ
//! emulated by a responder at the memory owner, on io_uring or (baseline)
//! plain blocking std::net sockets.
//!
//! The responder is driven by the owner's own polling calls (`progress`,
//! `try_recv`, `poll_completions`) rather than by a thread of its own: the
//! owner (a frontend) busy-polls its connections anyway, a hidden thread
//! would need a lock or a ring between it and the owner's registry, would
//! fight the pinned data-path threads for cores, and its wake-up would sit
//! on every READ's latency. The price: READs of an owner that stops polling
//! stall, and the reader reports them as [`ErrorKind::Timeout`] after
//! [`TcpConfig::read_timeout`].
//!
//! A READ timeout breaks the connection (like a verbs QP entering the
//! error state): the stream position of a late response is unknowable.
//!
//! [`ErrorKind::Timeout`]: super::ErrorKind::Timeout

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::registry::Registry;
use super::stream::{messages_through_stream, probe_uring, registry_domain_methods, ByteIo, Stream, StreamConfig};
// shm's listener sleeps the same way.
pub(crate) use super::stream::wait_readable;
use super::{Completion, Connection, Domain, Error, Listener, ReadOp, Registration};
use crate::capability::{ReadGrant, ReadVerifier};
use crate::mem::{Access, KeyTable, Region};
use crate::time::Duration;

pub use super::stream::tls::{links_closed_on_tls_failure, read_pem_file, select_link_tls, selected_link_tls, LinkTls, LinkTlsError, LinkTlsPem, MAX_PEM_FILE};

/// How bytes move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// io_uring: one RECV and one SENDMSG in flight per connection,
    /// completions reaped from the shared ring without a syscall.
    Uring,
    /// Baseline: blocking std::net socket; sends block in `sendmsg`,
    /// receives are polled with `recv(MSG_DONTWAIT)` (one syscall per poll).
    Blocking,
}

/// Tunables.
#[derive(Clone, Copy, Debug)]
pub struct TcpConfig {
    /// Byte engine.
    pub engine: Engine,
    /// READs outstanding per connection (posted, not yet polled).
    pub max_outstanding_reads: usize,
    /// Longest READ served or posted.
    pub max_read_len: u32,
    /// A READ unanswered this long fails the connection with Timeout.
    pub read_timeout: Duration,
    /// Registrations per domain.
    pub key_capacity: u32,
}

impl TcpConfig {
    /// Defaults for `engine`: 256 outstanding, 16 MiB READs, 5 s timeout, 1024 keys.
    pub fn new(engine: Engine) -> Self {
        TcpConfig {
            engine,
            max_outstanding_reads: 256,
            max_read_len: 16 << 20,
            read_timeout: Duration::from_millis(5_000),
            key_capacity: 1024,
        }
    }
}

struct Inner {
    cfg: TcpConfig,
    registry: Arc<Registry>,
    /// TLS under every link's framing (issue 55); None: plaintext.
    tls: Option<LinkTls>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.registry.close_all();
    }
}

/// A tcp transport domain (registrations + connection factory).
#[derive(Clone)]
pub struct TcpDomain {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for TcpDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpDomain")
            .field("cfg", &self.inner.cfg)
            .finish()
    }
}

impl TcpDomain {
    /// A domain; with [`Engine::Uring`] this probes io_uring first and
    /// returns [`Error::Unsupported`] when it is not usable here.
    pub fn new(cfg: TcpConfig) -> Result<Self, Error> {
        Self::with_tls(cfg, None)
    }
    /// [`new`](Self::new), with every link (accepted and connected) under
    /// TLS when `tls` is given (see `stream::tls`).
    pub fn with_tls(cfg: TcpConfig, tls: Option<LinkTls>) -> Result<Self, Error> {
        if cfg.engine == Engine::Uring {
            probe_uring()?;
        }
        let registry = Arc::new(Registry::new(KeyTable::new_local(cfg.key_capacity)));
        Ok(TcpDomain {
            inner: Arc::new(Inner { cfg, registry, tls }),
        })
    }
    /// io_uring engine, default tunables.
    pub fn uring() -> Result<Self, Error> {
        Self::new(TcpConfig::new(Engine::Uring))
    }
    /// Blocking std::net baseline, default tunables.
    pub fn blocking() -> Result<Self, Error> {
        Self::new(TcpConfig::new(Engine::Blocking))
    }
    /// The configuration.
    pub fn config(&self) -> &TcpConfig {
        &self.inner.cfg
    }

    /// `accepted`: the peer dialled us, so its READs wait for
    /// [`Connection::allow_remote_reads`]; else we dialled `addr`, and a
    /// TLS client's handshake ends by `deadline`.
    fn wrap(&self, sock: TcpStream, accepted: bool, addr: &str, deadline: std::time::Instant) -> Result<TcpConn, Error> {
        sock.set_nodelay(true)?;
        // An IPv4 peer on a dual-stack socket reads as itself, so one
        // source is one address whichever way it connected.
        let peer = sock.peer_addr().ok().map(|a| a.ip().to_canonical());
        let cfg = &self.inner.cfg;
        if cfg.engine == Engine::Blocking || self.inner.tls.is_some() {
            // Bound a blocked send (peer not reading) like a READ.
            let t = std::time::Duration::from_nanos(cfg.read_timeout.as_nanos().max(1));
            sock.set_write_timeout(Some(t))?;
        }
        let fd = OwnedFd::from(sock);
        let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
        let io = match (&self.inner.tls, cfg.engine) {
            (Some(tls), _) if accepted => ByteIo::tls(raw, tls.accept()?, None)?,
            (Some(tls), _) => ByteIo::tls(raw, tls.connect(addr)?, Some(deadline))?,
            (None, Engine::Uring) => ByteIo::uring(raw)?,
            (None, Engine::Blocking) => ByteIo::std(raw),
        };
        let scfg = StreamConfig {
            max_outstanding: cfg.max_outstanding_reads.max(1),
            max_read_len: cfg.max_read_len,
            read_timeout: std::time::Duration::from_nanos(cfg.read_timeout.as_nanos()),
            serve_reads: true,
        };
        let mut stream = Stream::new(fd, io, self.inner.registry.clone(), scfg);
        if accepted {
            stream.hold_reads();
        }
        Ok(TcpConn {
            stream,
            peer,
            _domain: self.clone(),
        })
    }
}

fn to_std(d: Duration) -> std::time::Duration {
    std::time::Duration::from_nanos(d.as_nanos())
}

impl Domain for TcpDomain {
    type Conn = TcpConn;
    type Listener = TcpListener;

    fn kind(&self) -> &'static str {
        match self.inner.cfg.engine {
            Engine::Uring => "tcp-uring",
            Engine::Blocking => "tcp-blocking",
        }
    }

    fn listen(&self, addr: &str) -> Result<TcpListener, Error> {
        let addr = if addr.is_empty() { "127.0.0.1:0" } else { addr };
        let l = std::net::TcpListener::bind(addr)?;
        l.set_nonblocking(true)?;
        Ok(TcpListener {
            listener: l,
            domain: self.clone(),
        })
    }

    fn connect(&self, addr: &str, timeout: Duration) -> Result<TcpConn, Error> {
        let deadline = std::time::Instant::now() + to_std(timeout);
        let addrs: Vec<SocketAddr> = addr.to_socket_addrs()?.collect();
        let mut last = Error::Timeout;
        for a in addrs {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            match TcpStream::connect_timeout(&a, left) {
                Ok(s) => return self.wrap(s, false, addr, deadline),
                Err(e) => last = e.into(),
            }
        }
        Err(last)
    }

    fn register(&self, region: &Arc<Region>, access: Access) -> Result<Registration, Error> {
        self.inner.registry.register(region, access, b"")
    }

    registry_domain_methods!();
}

/// Accepts tcp connections.
pub struct TcpListener {
    listener: std::net::TcpListener,
    domain: TcpDomain,
}

impl Listener for TcpListener {
    type Conn = TcpConn;

    fn local_addr(&self) -> String {
        self.listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default()
    }

    /// Sleeps in the kernel (`ppoll` on the listening socket) until a
    /// connection is pending or `timeout` passes. Why not poll-and-sleep:
    /// an acceptor thread waking every few hundred microseconds competes
    /// with the serving threads for the cores and its wake-ups land on
    /// their round trips (measured: `docs/benchmarks.md`, netbench honesty).
    fn accept(&mut self, timeout: Duration) -> Result<TcpConn, Error> {
        let deadline = std::time::Instant::now() + to_std(timeout);
        loop {
            match self.listener.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(false)?;
                    return self.domain.wrap(s, true, "", deadline);
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(e.into()),
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout);
            }
            wait_readable(std::os::fd::AsRawFd::as_raw_fd(&self.listener), left);
        }
    }
}

/// The address most of `sources` come from (ties: the first seen; none
/// if none is known): whose link a full bound evicts, so that a flood from
/// one address pushes out its own links, not a peer's from another
/// (issue 55). Quadratic in the count, which is a small bound (the links
/// handshaking at once), with no allocation.
pub fn most_frequent_source<I>(sources: I) -> Option<std::net::IpAddr>
where
    I: Iterator<Item = Option<std::net::IpAddr>> + Clone,
{
    let mut best: Option<(std::net::IpAddr, usize)> = None;
    for a in sources.clone().flatten() {
        let n = sources.clone().filter(|s| *s == Some(a)).count();
        if best.is_none_or(|(_, m)| n > m) {
            best = Some((a, n));
        }
    }
    best.map(|(a, _)| a)
}

/// A tcp connection.
pub struct TcpConn {
    stream: Stream,
    /// The peer's address (per-source bounds: `Connection::peer_addr`).
    peer: Option<std::net::IpAddr>,
    _domain: TcpDomain,
}

impl std::fmt::Debug for TcpConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpConn")
            .field("fd", &self.stream.raw_fd())
            .finish()
    }
}

impl Connection for TcpConn {
    messages_through_stream!();
    fn post_read(&mut self, op: &ReadOp) -> Result<(), Error> {
        self.stream.post_reads(std::slice::from_ref(op), &[]).map(|_| ())
    }
    fn allow_remote_reads(&mut self) {
        self.stream.allow_reads();
    }
    fn allow_verified_remote_reads(&mut self, verifier: ReadVerifier) {
        self.stream.allow_verified_reads(verifier);
    }
    fn post_reads(&mut self, ops: &[ReadOp]) -> Result<usize, Error> {
        self.stream.post_reads(ops, &[])
    }
    fn post_granted_reads(&mut self, ops: &[ReadOp], grants: &[ReadGrant]) -> Result<usize, Error> {
        self.stream.post_reads(ops, grants)
    }
    fn peer_addr(&self) -> Option<std::net::IpAddr> {
        self.peer
    }
    fn poll_completions(&mut self, out: &mut [Completion]) -> Result<usize, Error> {
        self.stream.poll_completions(out)
    }
    fn progress(&mut self) -> Result<(), Error> {
        self.stream.progress()
    }
    fn outstanding_reads(&self) -> usize {
        self.stream.outstanding()
    }
    fn max_outstanding_reads(&self) -> usize {
        self.stream.max_outstanding()
    }
    fn is_connected(&self) -> bool {
        self.stream.is_connected()
    }
    fn wait(&mut self, timeout: Duration) -> Result<bool, Error> {
        self.stream.wait(to_std(timeout)).map(|()| true)
    }
    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(self.stream.wait_fd())
    }
    fn may_hold_input(&self) -> bool {
        self.stream.may_hold_input()
    }
    fn send_progress(&self) -> Option<super::SendProgress> {
        Some(self.stream.send_progress())
    }

    fn accepted_bytes(&self) -> Option<u64> {
        Some(self.stream.accepted_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{self, Heartbeat};

    /// `wait` sleeps in the kernel until bytes arrive, then the message is there.
    fn wait_wakes_on_message(domain: TcpDomain) {
        let mut listener = domain.listen("127.0.0.1:0").unwrap();
        let addr = listener.local_addr();
        let mut client = domain.connect(&addr, Duration::from_millis(5_000)).unwrap();
        let mut server = listener.accept(Duration::from_millis(5_000)).unwrap();

        // Nothing sent: a short wait returns (after its timeout) without work.
        assert!(server.wait(Duration::from_millis(5)).unwrap());
        let mut buf = [0u8; 64];
        assert_eq!(server.try_recv(&mut buf).unwrap(), None);

        let mut msg = [0u8; 64];
        let n = wire::encode(
            &mut msg,
            &Heartbeat {
                seq: 7,
                role: 4,
                id: 1,
            },
        )
        .unwrap();
        client.send(&msg[..n]).unwrap();
        let t0 = std::time::Instant::now();
        let mut got = None;
        while got.is_none() && t0.elapsed() < std::time::Duration::from_secs(5) {
            assert!(server.wait(Duration::from_millis(1_000)).unwrap());
            got = server.try_recv(&mut buf).unwrap();
        }
        assert_eq!(got, Some(n));
        assert_eq!(&buf[..n], &msg[..n]);

        // The peer's departure wakes a waiter and is then reported.
        drop(client);
        let t0 = std::time::Instant::now();
        loop {
            match server.wait(Duration::from_millis(1_000)) {
                Ok(_) if t0.elapsed() < std::time::Duration::from_secs(5) => {}
                Ok(_) => panic!("departure not noticed"),
                Err(e) => {
                    assert_eq!(e.kind(), super::super::ErrorKind::PeerDisconnected);
                    break;
                }
            }
        }
    }

    /// The blocking engine skips one `recv` after a short read (the socket
    /// was empty then): messages sent after that are still received, both
    /// by busy polling and by `wait`, and several in one read are all parsed.
    #[test]
    fn no_message_is_missed_after_a_short_read() {
        let domain = TcpDomain::blocking().unwrap();
        let mut listener = domain.listen("127.0.0.1:0").unwrap();
        let addr = listener.local_addr();
        let mut client = domain.connect(&addr, Duration::from_millis(5_000)).unwrap();
        let mut server = listener.accept(Duration::from_millis(5_000)).unwrap();
        let mut msg = [0u8; 64];
        let mut buf = [0u8; 64];
        let bound = std::time::Duration::from_secs(5);
        for seq in 0..50u64 {
            let n = wire::encode(
                &mut msg,
                &Heartbeat {
                    seq,
                    role: 4,
                    id: 1,
                },
            )
            .unwrap();
            client.send(&msg[..n]).unwrap();
            if seq % 10 == 9 {
                // A second message right behind the first: one read, two messages.
                client.send(&msg[..n]).unwrap();
            }
            let t0 = std::time::Instant::now();
            let mut got = 0;
            let want = if seq % 10 == 9 { 2 } else { 1 };
            while got < want {
                assert!(t0.elapsed() < bound, "message {seq} never arrived");
                if seq % 2 == 0 {
                    server.wait(Duration::from_millis(1_000)).unwrap();
                }
                if let Some(m) = server.try_recv(&mut buf).unwrap() {
                    assert_eq!(&buf[..m], &msg[..n]);
                    got += 1;
                }
            }
            assert_eq!(server.try_recv(&mut buf).unwrap(), None);
        }
    }

    /// With a verifier installed (issue 55), the owner serves a READ only
    /// when it presents the capability of a task planned to the reading
    /// backend whose input is exactly the range read: another task's
    /// capability, the right one for a neighbouring range, a forged one
    /// and none are refused (AccessDenied) and counted, the link stays up,
    /// and the planned READ is served byte for byte.
    #[test]
    fn only_reads_presenting_their_plans_capability_are_served() {
        use crate::capability::{CapabilityKey, Grant, ReadGrant, ReadVerifier};
        use crate::join::JoinToken;
        use crate::mem::Region;
        use crate::transport::ErrorKind;
        use crate::wire::RemoteRef;

        let bound = std::time::Duration::from_secs(10);
        let key = CapabilityKey::from_token(&JoinToken::new(b"sixteen bytes of token").unwrap());
        let (backend, frontend) = (3, 1);
        let domain = TcpDomain::blocking().unwrap();
        let staged = Region::anonymous(4096).unwrap();
        let bytes: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
        staged.write_at(0, &bytes).unwrap();
        let staging = domain.register(&staged, Access::REMOTE_READ).unwrap();
        let landing_region = Region::anonymous(4096).unwrap();
        let landing = domain.register(&landing_region, Access::LOCAL_WRITE).unwrap();
        let mut listener = domain.listen("127.0.0.1:0").unwrap();
        let mut reader = domain.connect(&listener.local_addr(), Duration::from_millis(5_000)).unwrap();
        let mut owner = listener.accept(Duration::from_millis(5_000)).unwrap();
        assert_eq!(owner.peer_addr(), Some(std::net::IpAddr::from([127, 0, 0, 1])));
        owner.allow_verified_remote_reads(ReadVerifier::new(key.clone(), backend, frontend));

        let slot = |i: u64| staging.remote_ref(i * 64, 64).unwrap();
        let grant = |task: u64, input: RemoteRef| ReadGrant { task, capability: key.sign(&Grant { backend, frontend, task, input }) };
        let planned = grant(7, slot(1));
        let cases: [(RemoteRef, ReadGrant, bool); 5] = [
            (slot(1), planned, true),
            (slot(2), grant(8, slot(1)), false), // another task's capability
            (slot(2), planned, false),           // the right capability, a neighbouring slot
            (slot(1), ReadGrant { capability: [0x55; 16], ..planned }, false),
            (slot(1), ReadGrant::default(), false),
        ];
        let refused_before = crate::capability::refused_reads();
        for (i, (remote, presented, served)) in cases.into_iter().enumerate() {
            let op = ReadOp { wr_id: i as u64, remote, local: landing.local_ref(0, 64).unwrap() };
            landing_region.write_at(0, &[0u8; 64]).unwrap();
            assert_eq!(reader.post_granted_reads(&[op], &[presented]).unwrap(), 1);
            let t0 = std::time::Instant::now();
            let mut done = [Completion { wr_id: 0, status: Ok(()), bytes: 0 }; 1];
            while reader.poll_completions(&mut done).unwrap() == 0 {
                assert!(t0.elapsed() < bound, "READ {i} never answered");
                owner.progress().unwrap();
            }
            assert_eq!(done[0].wr_id, i as u64);
            if served {
                assert_eq!(done[0].status, Ok(()), "READ {i}");
                let mut got = [0u8; 64];
                landing_region.read_at(0, &mut got).unwrap();
                assert_eq!(&got[..], &bytes[64..128]);
            } else {
                assert_eq!(done[0].status, Err(ErrorKind::AccessDenied), "READ {i}");
            }
        }
        assert!(crate::capability::refused_reads() >= refused_before + 4);
        assert!(owner.is_connected() && reader.is_connected(), "a refused READ keeps the link");
    }

    #[test]
    fn the_most_frequent_source_is_the_floods() {
        let (a, b) = (std::net::IpAddr::from([127, 0, 0, 1]), std::net::IpAddr::from([127, 0, 0, 2]));
        assert_eq!(most_frequent_source([Some(a), Some(b), None, Some(b)].into_iter()), Some(b));
        assert_eq!(most_frequent_source([Some(a), Some(b)].into_iter()), Some(a), "ties: the first seen");
        assert_eq!(most_frequent_source([None, None].into_iter()), None);
    }

    #[test]
    fn wait_blocking_engine() {
        wait_wakes_on_message(TcpDomain::blocking().unwrap());
    }

    #[test]
    fn wait_uring_engine() {
        match TcpDomain::uring() {
            Ok(d) => wait_wakes_on_message(d),
            Err(e) => eprintln!("io_uring unavailable ({e}); skipped"),
        }
    }
}
