//! Control-plane plumbing the daemons share: picking a transport by name,
//! the registration handshake, heartbeat liveness, bounded blocking helpers
//! for the rare control-path sends and receives, idle-strategy parsing,
//! termination signals, and a tiny HTTP endpoint for Prometheus scrapes.
//!
//! Nothing here is on the data path: a daemon's poll loop only calls
//! [`Liveness`] (two comparisons) and [`stop_requested`] (one load) per pass.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::idle::IdleStrategy;
use crate::mem::{MemError, Region};
use crate::time::{Duration, Instant};
use crate::transport::shm::ShmDomain;
use crate::transport::tcp::{Engine, TcpConfig, TcpDomain};
use crate::transport::{Connection, Domain, Error};
use crate::wire::{self, Message, Register, Role};

/// Why a daemon's plumbing could not be set up: a name that is not a
/// transport or idle strategy, a transport this host or build lacks, a
/// signal handler the OS refused.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// Not a transport name.
    #[error("unknown transport '{0}' (shm, tcp, tcp-blocking, rdma)")]
    UnknownTransport(String),
    /// Not an idle strategy.
    #[error("unknown idle strategy '{0}' (spin, yield, park, wait, park:US with 1..=1000000)")]
    UnknownIdle(String),
    /// The transport cannot be opened on this host.
    #[error("transport {kind} unavailable: {source}{hint}")]
    TransportUnavailable {
        /// The transport's name.
        kind: &'static str,
        /// What failed.
        source: Error,
        /// What to try instead (may be empty).
        hint: &'static str,
    },
    /// This build has no support for the transport.
    #[error("transport {kind}: built without support for it (rebuild with `--features {feature}`)")]
    NotBuilt {
        /// The transport's name.
        kind: &'static str,
        /// The cargo feature that brings it.
        feature: &'static str,
    },
    /// A stop-signal handler could not be installed.
    #[error("cannot install a handler for signal {0}")]
    Signal(i32),
}


// ---- transports by name -----------------------------------------------------

/// The transports a daemon can run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TransportKind {
    /// Same-host shared memory (the local default).
    Shm,
    /// TCP over io_uring, READs served by a responder at the memory owner.
    Tcp,
    /// TCP on plain blocking sockets.
    TcpBlocking,
    /// RDMA verbs (needs the `rdma` feature and a device).
    Rdma,
}

impl TransportKind {
    /// Every kind, for help texts.
    pub const ALL: [TransportKind; 4] = [
        TransportKind::Shm,
        TransportKind::Tcp,
        TransportKind::TcpBlocking,
        TransportKind::Rdma,
    ];

    /// Parses a command-line name.
    pub fn parse(s: &str) -> Result<TransportKind, ControlError> {
        TransportKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| ControlError::UnknownTransport(s.to_string()))
    }

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Shm => "shm",
            TransportKind::Tcp => "tcp",
            TransportKind::TcpBlocking => "tcp-blocking",
            TransportKind::Rdma => "rdma",
        }
    }

    /// A listen address on `host` that picks a fresh port or name.
    pub fn ephemeral_listen(self, host: &str) -> String {
        match self {
            TransportKind::Shm => String::new(),
            _ => format!("{host}:0"),
        }
    }

    /// A region peers of this transport can READ once registered: shm
    /// regions live in shared memory files that readers map; the others
    /// are private memory the transport (or NIC) reads on the owner's
    /// behalf.
    pub fn readable_region(self, len: usize) -> Result<Arc<Region>, MemError> {
        match self {
            TransportKind::Shm => Region::shared(len),
            _ => Region::anonymous(len),
        }
    }
}

/// Code that runs on any transport domain (the daemons are generic over
/// [`Domain`]; this picks the type at run time).
pub trait WithDomain {
    /// What it returns.
    type Out;
    /// Runs on `domain`.
    fn run<D: Domain>(self, domain: D) -> Self::Out;
}

/// Options that shape a domain beyond its kind.
#[derive(Clone, Copy, Debug, Default)]
pub struct DomainOptions {
    /// tcp: a READ unanswered this long breaks the connection (`None`:
    /// the transport's default).
    pub tcp_read_timeout: Option<Duration>,
}

/// Opens a domain of `kind` and runs `task` on it; `Err` says why the
/// transport is unavailable.
pub fn with_domain<W: WithDomain>(kind: TransportKind, task: W) -> Result<W::Out, ControlError> {
    with_domain_opts(kind, DomainOptions::default(), task)
}

/// [`with_domain`] with options.
pub fn with_domain_opts<W: WithDomain>(
    kind: TransportKind,
    opts: DomainOptions,
    task: W,
) -> Result<W::Out, ControlError> {
    let unavailable = |kind: TransportKind, hint| {
        move |source| ControlError::TransportUnavailable { kind: kind.name(), source, hint }
    };
    match kind {
        TransportKind::Shm => {
            let d = ShmDomain::new().map_err(unavailable(kind, ""))?;
            Ok(task.run(d))
        }
        TransportKind::Tcp | TransportKind::TcpBlocking => {
            let engine = if kind == TransportKind::Tcp {
                Engine::Uring
            } else {
                Engine::Blocking
            };
            let mut cfg = TcpConfig::new(engine);
            if let Some(t) = opts.tcp_read_timeout {
                cfg.read_timeout = t;
            }
            // The process's link TLS (--link-tls-*), if its command line gave one.
            let tls = crate::transport::tcp::selected_link_tls();
            let d = TcpDomain::with_tls(cfg, tls).map_err(unavailable(kind, " (try --transport tcp-blocking)"))?;
            Ok(task.run(d))
        }
        TransportKind::Rdma => rdma(task),
    }
}

/// The RDMA device, port and GID index given on the command line
/// (`--rdma-device`, `--rdma-port`, `--gid-index`); each one given
/// overrides its `SYMPHONY_RDMA_*` variable.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RdmaSelection {
    /// Device name.
    pub device: Option<String>,
    /// Port number, from 1.
    pub port: Option<u8>,
    /// GID table index.
    pub gid_index: Option<u32>,
}

/// Process-wide, like the environment variables it overrides: a process
/// opens its RDMA domain once, deep inside [`with_domain_opts`], long after
/// its flags were parsed.
static RDMA_SELECTION: std::sync::OnceLock<RdmaSelection> = std::sync::OnceLock::new();

/// Sets the process's RDMA selection; the first call wins (a process has
/// one command line).
pub fn select_rdma(selection: RdmaSelection) {
    let _ = RDMA_SELECTION.set(selection);
}

#[cfg(feature = "rdma")]
fn rdma<W: WithDomain>(task: W) -> Result<W::Out, ControlError> {
    use crate::transport::rdma::{RdmaConfig, RdmaDomain};
    let unavailable = |source| ControlError::TransportUnavailable { kind: "rdma", source, hint: "" };
    let mut cfg = RdmaConfig::from_env().map_err(unavailable)?;
    if let Some(sel) = RDMA_SELECTION.get() {
        if let Some(device) = &sel.device {
            cfg.device = Some(device.clone());
        }
        if let Some(port) = sel.port {
            cfg.port = port;
        }
        if let Some(gid) = sel.gid_index {
            cfg.gid_index = Some(gid);
        }
    }
    let d = RdmaDomain::open(cfg).map_err(unavailable)?;
    Ok(task.run(d))
}

#[cfg(not(feature = "rdma"))]
fn rdma<W: WithDomain>(_task: W) -> Result<W::Out, ControlError> {
    Err(ControlError::NotBuilt { kind: "rdma", feature: "rdma" })
}

// ---- bounded blocking helpers ---------------------------------------------

fn std_deadline(timeout: Duration) -> std::time::Instant {
    std::time::Instant::now() + std::time::Duration::from_nanos(timeout.as_nanos())
}

/// Connects to `addr`, retrying refused or failed attempts (the peer may
/// still be starting) until `timeout` has passed.
pub fn connect_retrying<D: Domain>(
    domain: &D,
    addr: &str,
    timeout: Duration,
) -> Result<D::Conn, Error> {
    let deadline = std_deadline(timeout);
    let mut pause = std::time::Duration::from_millis(1);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let attempt = Duration::from_nanos((left.as_nanos() as u64).min(1_000_000_000));
        match domain.connect(addr, attempt) {
            Ok(c) => return Ok(c),
            Err(e) => {
                if std::time::Instant::now() + pause >= deadline {
                    return Err(e);
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(std::time::Duration::from_millis(50));
            }
        }
    }
}

/// Queues `msg`, polling the connection while its send queue is full, for
/// at most `timeout` (`Timeout` then).
pub fn send_within<C: Connection>(conn: &mut C, msg: &[u8], timeout: Duration) -> Result<(), Error> {
    let deadline = std_deadline(timeout);
    loop {
        match conn.send(msg) {
            Err(Error::QueueFull) => {
                conn.progress()?;
                if std::time::Instant::now() >= deadline {
                    return Err(Error::Timeout);
                }
                std::thread::yield_now();
            }
            other => return other,
        }
    }
}

/// Waits up to `timeout` for the next message (`Timeout` then); returns its
/// length in `buf`.
pub fn recv_within<C: Connection>(conn: &mut C, buf: &mut [u8], timeout: Duration) -> Result<usize, Error> {
    let deadline = std_deadline(timeout);
    loop {
        if let Some(n) = conn.try_recv(buf)? {
            return Ok(n);
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout);
        }
        let step = Duration::from_nanos((left.as_nanos() as u64).min(10_000_000));
        if !conn.wait(step)? {
            std::thread::sleep(std::time::Duration::from_micros(200).min(left));
        }
    }
}

/// Sends `reg` as the first message of a connection (a backend's data
/// link to a frontend).
pub fn send_register<C: Connection>(conn: &mut C, reg: &Register, timeout: Duration) -> Result<(), Error> {
    let mut buf = [0u8; 128];
    let n = wire::encode(&mut buf, reg)?;
    send_within(conn, &buf[..n], timeout)?;
    flush_within(conn, timeout)
}

/// Drives the connection until queued sends have left (best effort: the
/// trait has no "send queue empty" query, so this progresses a few rounds).
/// A peer that is gone by now is not an error here: it may well have read
/// the message and left (a refusal, a short-lived tool); the caller's next
/// receive reports the departure.
pub fn flush_within<C: Connection>(conn: &mut C, timeout: Duration) -> Result<(), Error> {
    let deadline = std_deadline(timeout);
    for _ in 0..8 {
        match conn.progress() {
            Ok(()) => {}
            Err(Error::PeerDisconnected) => return Ok(()),
            Err(e) => return Err(e),
        }
        if std::time::Instant::now() >= deadline {
            break;
        }
    }
    Ok(())
}

/// Waits for the peer's [`Register`] (the first message of a backend's
/// data link); anything else first is a protocol error.
pub fn expect_register<C: Connection>(conn: &mut C, timeout: Duration) -> Result<Register, Error> {
    let mut buf = [0u8; wire::MAX_MESSAGE_LEN];
    let n = recv_within(conn, &mut buf, timeout)?;
    match wire::decode(&buf[..n])? {
        Message::Register(r) => Ok(r),
        _ => Err(Error::Protocol(wire::WireError::BadValue(
            "first message is not Register",
        ))),
    }
}

/// Plays the scheduler's side of a registration, for tools and tests that
/// stand in for a scheduler: sends a [`wire::Challenge`] (no token
/// required), waits for the peer's [`wire::Join`] and answers `welcome`.
/// A backend's `Models` message follows on the link for the caller to read.
pub fn admit_peer<C: Connection>(
    conn: &mut C,
    welcome: &wire::Welcome,
    timeout: Duration,
) -> Result<wire::Join, Error> {
    let mut buf = [0u8; wire::MAX_MESSAGE_LEN];
    let nonce = crate::join::NonceSource::Os
        .next_nonce()
        .ok_or(Error::Protocol(wire::WireError::BadValue("no OS randomness")))?;
    let n = wire::encode(&mut buf, &wire::Challenge::new(nonce, false))?;
    send_within(conn, &buf[..n], timeout)?;
    flush_within(conn, timeout)?;
    let n = recv_within(conn, &mut buf, timeout)?;
    let join = match wire::decode(&buf[..n])? {
        Message::Join(j) => j,
        _ => {
            return Err(Error::Protocol(wire::WireError::BadValue(
                "first message is not Join",
            )))
        }
    };
    let n = wire::encode(&mut buf, welcome)?;
    send_within(conn, &buf[..n], timeout)?;
    flush_within(conn, timeout)?;
    Ok(join)
}

// ---- liveness ----------------------------------------------------------------

/// Heartbeat bookkeeping for one peer: when to send ours, and whether the
/// peer has been silent too long. Any message from the peer counts as
/// proof of life, not only heartbeats.
#[derive(Clone, Copy, Debug)]
pub struct Liveness {
    interval: Duration,
    timeout: Duration,
    next_send: Instant,
    last_heard: Instant,
    seq: u64,
}

impl Liveness {
    /// Heartbeats every `interval`; the peer is dead after `timeout` of
    /// silence. Starts as heard at `now`.
    pub fn new(now: Instant, interval: Duration, timeout: Duration) -> Self {
        Liveness {
            interval,
            timeout,
            next_send: now,
            last_heard: now,
            seq: 0,
        }
    }
    /// The peer was heard from at `now`.
    pub fn heard(&mut self, now: Instant) {
        self.last_heard = now;
    }
    /// Whether the peer has been silent for longer than the timeout.
    pub fn expired(&self, now: Instant) -> bool {
        now.saturating_since(self.last_heard) > self.timeout
    }
    /// Our heartbeat to send at `now`, if one is due (encoded into `buf`;
    /// returns its length).
    pub fn due(&mut self, now: Instant, role: Role, id: u32, buf: &mut [u8]) -> Option<usize> {
        if now < self.next_send {
            return None;
        }
        self.next_send = now + self.interval;
        self.seq += 1;
        let hb = wire::Heartbeat {
            seq: self.seq,
            role: role as u32,
            id,
        };
        wire::encode(buf, &hb).ok()
    }
    /// When the next heartbeat is due.
    pub fn next_send(&self) -> Instant {
        self.next_send
    }
    /// The first instant at which [`expired`](Self::expired) holds unless
    /// the peer is heard from before (for a node's `poll_at`).
    pub fn expires_at(&self) -> Instant {
        self.last_heard + self.timeout + Duration::from_nanos(1)
    }
}

// ---- idle strategies -----------------------------------------------------------

/// Parses an idle strategy: `spin` (never sleep: dedicated cores),
/// `yield` (spin, then yield the CPU), `park` (100 spins, 10 yields, then
/// sleep until a connection has work, another thread notifies, or the next
/// timer is due, at most 100 ms at a time; see [`crate::waitset::IdleWait`])
/// `wait` (sleep at once: every idle pass is a wait-set sleep, the
/// cheapest on a small shared machine) or `park:US` (like `park` with
/// sleeps of at most US microseconds, for transports without a wait fd).
pub fn parse_idle(s: &str) -> Result<IdleStrategy, ControlError> {
    let park = |us: u64| IdleStrategy::SpinThenPark {
        spins: 100,
        yields: 10,
        park: Duration::from_micros(us),
    };
    match s {
        "spin" => Ok(IdleStrategy::Spin),
        "yield" => Ok(IdleStrategy::SpinThenYield { spins: 1000 }),
        "park" => Ok(park(100_000)),
        "wait" => Ok(IdleStrategy::SpinThenPark {
            spins: 0,
            yields: 0,
            park: Duration::from_millis(100),
        }),
        _ => match s.strip_prefix("park:").map(str::parse::<u64>) {
            Some(Ok(us)) if (1..=1_000_000).contains(&us) => Ok(park(us)),
            _ => Err(ControlError::UnknownIdle(s.to_string())),
        },
    }
}

// ---- termination --------------------------------------------------------------

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_sig: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    STOP.store(true, Ordering::SeqCst);
}

/// Makes SIGINT and SIGTERM set the flag [`stop_requested`] reads (instead
/// of killing the process), so a daemon can shut down cleanly.
pub fn install_stop_signals() -> Result<(), ControlError> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: `on_signal` is an `extern "C"` function that only stores
        // to an atomic, which is async-signal-safe; `signal` has no other
        // preconditions.
        let prev = unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
        if prev == libc::SIG_ERR {
            return Err(ControlError::Signal(sig));
        }
    }
    Ok(())
}

/// Whether a stop signal arrived (or [`request_stop`] was called).
pub fn stop_requested() -> bool {
    STOP.load(Ordering::Relaxed)
}

/// Asks this process's daemon loop to stop (as a signal would).
pub fn request_stop() {
    STOP.store(true, Ordering::SeqCst);
}

/// Asks the kernel to send this process SIGTERM when its parent dies, so
/// that daemons started by `symphony up` never outlive it (even when it is
/// killed with SIGKILL). Linux only; elsewhere a no-op.
pub fn terminate_with_parent() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: PR_SET_PDEATHSIG takes a signal number and has no memory
        // effects.
        let _ = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) };
    }
}

/// Fetches `http://addr/path` with a plain blocking client (for tools and
/// tests that scrape the endpoints); the body on a 200, else an error.
pub fn http_get(addr: SocketAddr, path: &str, timeout: std::time::Duration) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    write!(s, "GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n")?;
    let mut resp = Vec::new();
    s.take(64 << 20).read_to_end(&mut resp)?;
    let text = String::from_utf8_lossy(&resp);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("malformed HTTP response"))?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return Err(std::io::Error::other(format!(
            "GET {path}: {}",
            head.lines().next().unwrap_or("")
        )));
    }
    Ok(body.to_string())
}

/// The value of an unlabelled (or exactly labelled) sample `name` in a
/// Prometheus text exposition, e.g. `metric(text, "symphony_backends")` or
/// `metric(text, "nv_inference_count{model=\"ResNet50\"}")`.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let rest = l.strip_prefix(name)?;
            let rest = rest.strip_prefix(' ')?;
            rest.split_whitespace().next()?.parse().ok()
        })
}

/// The sum of every sample of `name` over all label sets.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let rest = if rest.starts_with('{') {
                &rest[rest.find('}')? + 1..]
            } else {
                rest
            };
            rest.strip_prefix(' ')?.split_whitespace().next()?.parse::<f64>().ok()
        })
        .sum()
}

/// A loopback TCP port that nothing listens on now, for a daemon that must
/// be started on a fixed address (hot-standby schedulers, a local etcd).
/// Drawn below the kernel's ephemeral range (Linux's default starts at
/// 32768): a port asked of the kernel with `:0` and released is the very
/// kind it hands out next as the source port of an outgoing connection, so
/// a listener started on it moments later could find it taken. Racy by
/// nature (another process may bind it first); the starter must report a
/// failed bind.
pub fn unused_port() -> std::io::Result<u16> {
    use std::sync::atomic::AtomicU32;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // Spread over [20000, 32000) by pid and call count: parallel test
    // processes do not walk the same sequence.
    let base = std::process::id().wrapping_mul(7919);
    for _ in 0..1000 {
        let k = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = 20_000 + (base.wrapping_add(k.wrapping_mul(104_729)) % 12_000) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(std::io::Error::new(std::io::ErrorKind::AddrInUse, "no unused port in 20000..32000"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_names_parse_and_bad_ones_are_refused() {
        assert_eq!(parse_idle("spin").ok(), Some(IdleStrategy::Spin));
        assert!(matches!(
            parse_idle("park:250"),
            Ok(IdleStrategy::SpinThenPark { park, .. }) if park == Duration::from_micros(250)
        ));
        assert!(parse_idle("park:0").is_err());
        assert!(parse_idle("nap").is_err());
        assert_eq!(TransportKind::parse("tcp-blocking").ok(), Some(TransportKind::TcpBlocking));
        let e = TransportKind::parse("udp").unwrap_err().to_string();
        assert_eq!(e, "unknown transport 'udp' (shm, tcp, tcp-blocking, rdma)");
    }

    #[test]
    fn liveness_sends_on_schedule_and_expires_after_silence() {
        let t0 = Instant::ZERO + Duration::from_millis(1000);
        let mut l = Liveness::new(t0, Duration::from_millis(100), Duration::from_millis(300));
        let mut buf = [0u8; 64];
        assert!(l.due(t0, Role::Backend, 3, &mut buf).is_some());
        assert!(l.due(t0 + Duration::from_millis(99), Role::Backend, 3, &mut buf).is_none());
        let n = l.due(t0 + Duration::from_millis(100), Role::Backend, 3, &mut buf).unwrap();
        assert!(matches!(wire::decode(&buf[..n]), Ok(Message::Heartbeat(h)) if h.seq == 2 && h.id == 3));
        assert!(!l.expired(t0 + Duration::from_millis(300)));
        assert!(l.expired(t0 + Duration::from_millis(301)));
        l.heard(t0 + Duration::from_millis(301));
        assert!(!l.expired(t0 + Duration::from_millis(500)));
    }
}
