//! The `rdma` transport: real verbs (feature `rdma`).
//!
//! - [`RdmaDomain`] = one device port + protection domain. It registers
//!   [`Region`]s as verbs memory regions with exactly the access asked for
//!   (see "Keys" below).
//! - [`RdmaConnection`] = one RC queue pair, bootstrapped over a TCP socket
//!   (both sides exchange QPN, PSN, LID, GID, MTU and READ depth, then meet at
//!   a barrier once ready-to-send). Control messages go by SEND into a ring of
//!   pre-posted receive slots; READs are RDMA READ work requests naming the
//!   peer's `(rkey, virtual address)` straight from the [`RemoteRef`]
//!   (`conn.rs`). [`RdmaConnection::post_writes`] posts RDMA WRITEs into a
//!   region the peer registered [`Access::REMOTE_WRITE`] (netbench's WRITE
//!   test; no serving region is remote-writable).
//! - The TCP socket stays open for the connection's life: its EOF is how a
//!   side learns the peer left (RC itself only notices on the next send).
//!
//! Keys: a registration keeps its verbs `lkey` ([`Registration::key`], what
//! landing [`LocalRef`](super::LocalRef)s and deregistration name) and its
//! `rkey` ([`Registration::remote_key`], what [`RemoteRef`](super::RemoteRef)s
//! carry) apart; nothing assumes they are equal. A memory region grants what
//! its [`Access`] says and nothing more ([`mr_flags`]): staging regions
//! (`REMOTE_READ`) are remote-readable only, landing regions (`LOCAL_WRITE`)
//! are locally writable only, so the NIC itself refuses a peer's READ of a
//! landing buffer, a READ landing in a staging region and any peer's WRITE.
//! `RemoteRef::offset` / `LocalRef::offset` are virtual addresses.
//!
//! Device, port and GID come from [`RdmaConfig`] (env overrides:
//! `SYMPHONY_RDMA_DEVICE`, `SYMPHONY_RDMA_PORT`, `SYMPHONY_RDMA_GID_INDEX`).
//! Without an override the GID is the first RoCE v2 entry holding an
//! IPv4-mapped address (what perftest picks on RoCE), then any RoCE v2 one.
//!
//! Verbs semantics the other transports do not share: a READ that fails at
//! the responder (bad key, out of bounds, deregistered) moves BOTH queue
//! pairs to the error state, so the connection is dead afterwards: its
//! completion says why, READs still in flight complete with that same error,
//! later READs are refused with it and messages with `PeerDisconnected`. The
//! NIC reports all three causes as one "remote access error" (`BadKey`).
//!
//! Resource setup goes through the `sideway` crate; the data path (post,
//! poll) calls verbs directly through `rdma-mummy-sys` with work requests
//! built on the stack, because sideway's guards allocate per call. See
//! docs/decisions.md, "RDMA crate: ibverbs vs sideway".

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::AccessFlags;

use super::{Access, Domain, Error, Listener, Region, Registration};
use crate::mem::{AccessToken, KeyTable};
use crate::time::Duration;

mod conn;
mod device;
mod raw;
mod raw_conn;
mod wake;
pub use conn::{RdmaConnection, WriteOp};
pub use raw::{RawCompletion, RawKind, RAW_INLINE, RAW_MAX_DEPTH, RAW_MAX_LEN};
use device::Device;

/// Environment variable naming the device (default: first with an active port).
pub const ENV_DEVICE: &str = "SYMPHONY_RDMA_DEVICE";
/// Environment variable overriding the GID table index.
pub const ENV_GID_INDEX: &str = "SYMPHONY_RDMA_GID_INDEX";
/// Environment variable naming the port number (default 1).
pub const ENV_PORT: &str = "SYMPHONY_RDMA_PORT";
/// Environment variable overriding [`RdmaConfig::read_depth`].
pub const ENV_READ_DEPTH: &str = "SYMPHONY_RDMA_READ_DEPTH";
/// Environment variable overriding [`RdmaConfig::ack_timeout`].
pub const ENV_ACK_TIMEOUT: &str = "SYMPHONY_RDMA_ACK_TIMEOUT";
/// Environment variable overriding [`RdmaConfig::max_reads_in_flight`] (1..=128;
/// perftest's bandwidth tests keep 128 in flight, netbench's `bw` its `--tx-depth`).
pub const ENV_MAX_READS: &str = "SYMPHONY_RDMA_MAX_READS";
/// Environment variable setting [`RdmaConfig::busy_poll`] (`1` on, `0` off).
pub const ENV_BUSY_POLL: &str = "SYMPHONY_RDMA_BUSY_POLL";
/// Environment variable overriding [`RdmaConfig::recv_slots`] (1..=[`MAX_SLOTS`];
/// perftest's `--rx-depth`, 512 by default, for netbench's SEND bandwidth test).
pub const ENV_RECV_SLOTS: &str = "SYMPHONY_RDMA_RECV_SLOTS";
/// Environment variable overriding [`RdmaConfig::send_slots`] (1..=[`MAX_SLOTS`];
/// perftest's `--tx-depth` for SENDs).
pub const ENV_SEND_SLOTS: &str = "SYMPHONY_RDMA_SEND_SLOTS";
/// Environment variable setting [`RdmaConfig::raw_depth`] (0..=[`RAW_MAX_DEPTH`]).
pub const ENV_RAW_DEPTH: &str = "SYMPHONY_RDMA_RAW_DEPTH";
/// Most receive or send slots per connection: each slot is one largest
/// control message (32 KiB), so 4096 of them register 128 MiB.
pub const MAX_SLOTS: u32 = 4096;

/// Longest single READ accepted (verbs allows 2 GiB; staging slots are far smaller).
pub const MAX_READ_LEN: u32 = 1 << 30;

/// Registrations per domain.
const MAX_REGISTRATIONS: u32 = 1024;

/// Work requests posted with one doorbell by `post_reads`.
const POST_BATCH: usize = 16;

/// Empty polls between two checks of the bootstrap socket for the peer's EOF
/// (a syscall; keeps the busy-poll loop cheap).
const PEER_CHECK_EVERY: u32 = 4096;

/// The same once both completion queues are armed: the caller is about to sleep
/// on the wait fd, which the socket's EOF keeps readable, so each wake-up is one
/// empty poll and the EOF must be noticed within a few of them.
const PEER_CHECK_EVERY_ARMED: u32 = 8;

/// How to pick and drive the RDMA device.
#[derive(Clone, Debug)]
pub struct RdmaConfig {
    /// Device name (e.g. `rxe0`, `mlx5_0`); `None` = first device with an active port.
    pub device: Option<String>,
    /// Port number (from 1).
    pub port: u8,
    /// GID table index; `None` = RoCE v2 + IPv4-mapped first, then RoCE v2, then any.
    pub gid_index: Option<u32>,
    /// Receive slots pre-posted per connection (the control-message receive ring).
    pub recv_slots: u32,
    /// Send slots per connection (control messages in flight).
    pub send_slots: u32,
    /// Largest control message in bytes (one slot).
    pub max_msg_len: u32,
    /// READs a caller may have posted and not yet polled, per connection.
    pub max_reads_in_flight: u32,
    /// READs on the wire per connection: the queue pair's initiator depth
    /// (`max_rd_atomic`) and the responder depth granted to the peer
    /// (`max_dest_rd_atomic`), each capped by the device (`max_qp_init_rd_atom`,
    /// `max_qp_rd_atom`; a real NIC refuses a QP above them) and the initiator
    /// depth by the peer's grant. READs posted beyond it wait in the send queue
    /// and the NIC issues each as an earlier one completes, so
    /// `max_reads_in_flight` may be larger. A small depth also bounds what a
    /// retry re-requests: after a lost response packet an RC requester asks
    /// again for every READ from the lost one on (`docs/journal/benchmarks-2026.md`,
    /// netbench, two Soft-RoCE guests).
    pub read_depth: u32,
    /// ACK timeout exponent: the requester retries after 4.096 us x 2^value
    /// without an answer (verbs `timeout`, 1..=31).
    pub ack_timeout: u8,
    /// Polls (`poll_completions`, `progress`, `try_recv`, a `send` into a full
    /// queue) that find nothing leave the completion queues unarmed: no
    /// `ibv_req_notify_cq` and no completion-event read per busy-to-empty
    /// transition (system calls on rxe), as perftest polls by default. Only
    /// for callers that busy-poll or sleep through `Connection::wait` (which
    /// arms both queues itself), never on the bare `wait_fd`.
    pub busy_poll: bool,
    /// SENDs and receives of a second, raw queue pair per connection (`raw.rs`:
    /// SENDs of registered buffers of any size, no framing, no copy); 0 = none.
    /// A connection has one when both sides ask for it.
    pub raw_depth: u32,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        RdmaConfig {
            device: None,
            port: 1,
            gid_index: None,
            recv_slots: 64,
            send_slots: 64,
            max_msg_len: crate::wire::MAX_MESSAGE_LEN as u32,
            max_reads_in_flight: 64,
            // What mlx5 devices allow per QP; rxe allows 128.
            read_depth: 16,
            // 4.096 us * 2^16 = 268 ms. 14 (67 ms) was too short for Soft-RoCE
            // between two emulated guests: their link dropped 7-14% of an
            // incast's packets and 7 timeouts in a row ended a connection
            // (docs/journal/benchmarks-2026.md, netbench). A peer process that exits is
            // noticed sooner anyway, by the bootstrap socket's EOF.
            ack_timeout: 16,
            busy_poll: false,
            raw_depth: 0,
        }
    }
}

impl RdmaConfig {
    /// Defaults, overridden by `SYMPHONY_RDMA_DEVICE`, `SYMPHONY_RDMA_PORT`,
    /// `SYMPHONY_RDMA_GID_INDEX`, `SYMPHONY_RDMA_READ_DEPTH`,
    /// `SYMPHONY_RDMA_MAX_READS`, `SYMPHONY_RDMA_BUSY_POLL`,
    /// `SYMPHONY_RDMA_RECV_SLOTS`, `SYMPHONY_RDMA_SEND_SLOTS`,
    /// `SYMPHONY_RDMA_RAW_DEPTH` and `SYMPHONY_RDMA_ACK_TIMEOUT` when set.
    pub fn from_env() -> Result<Self, Error> {
        let mut cfg = RdmaConfig::default();
        if let Ok(name) = std::env::var(ENV_DEVICE) {
            cfg.device = Some(name);
        }
        if let Ok(v) = std::env::var(ENV_PORT) {
            cfg.port = v
                .parse()
                .map_err(|_| invalid(format!("{ENV_PORT}={v:?} is not a port number")))?;
        }
        if let Ok(v) = std::env::var(ENV_GID_INDEX) {
            cfg.gid_index = Some(
                v.parse()
                    .map_err(|_| invalid(format!("{ENV_GID_INDEX}={v:?} is not an index")))?,
            );
        }
        if let Ok(v) = std::env::var(ENV_READ_DEPTH) {
            cfg.read_depth = v
                .parse()
                .ok()
                .filter(|d| (1..=255).contains(d))
                .ok_or_else(|| invalid(format!("{ENV_READ_DEPTH}={v:?} is not in 1..=255")))?;
        }
        if let Ok(v) = std::env::var(ENV_MAX_READS) {
            cfg.max_reads_in_flight = v
                .parse()
                .ok()
                .filter(|d| (1..=128).contains(d))
                .ok_or_else(|| invalid(format!("{ENV_MAX_READS}={v:?} is not in 1..=128")))?;
        }
        for (name, slots) in [
            (ENV_RECV_SLOTS, &mut cfg.recv_slots),
            (ENV_SEND_SLOTS, &mut cfg.send_slots),
        ] {
            if let Ok(v) = std::env::var(name) {
                *slots = v
                    .parse()
                    .ok()
                    .filter(|d| (1..=MAX_SLOTS).contains(d))
                    .ok_or_else(|| invalid(format!("{name}={v:?} is not in 1..={MAX_SLOTS}")))?;
            }
        }
        if let Ok(v) = std::env::var(ENV_BUSY_POLL) {
            cfg.busy_poll = match v.as_str() {
                "1" => true,
                "0" => false,
                _ => return Err(invalid(format!("{ENV_BUSY_POLL}={v:?} is not 0 or 1"))),
            };
        }
        if let Ok(v) = std::env::var(ENV_RAW_DEPTH) {
            cfg.raw_depth = v
                .parse()
                .ok()
                .filter(|d| *d <= RAW_MAX_DEPTH)
                .ok_or_else(|| invalid(format!("{ENV_RAW_DEPTH}={v:?} is not in 0..={RAW_MAX_DEPTH}")))?;
        }
        if let Ok(v) = std::env::var(ENV_ACK_TIMEOUT) {
            cfg.ack_timeout = v
                .parse()
                .ok()
                .filter(|t| (1..=31).contains(t))
                .ok_or_else(|| invalid(format!("{ENV_ACK_TIMEOUT}={v:?} is not in 1..=31")))?;
        }
        Ok(cfg)
    }
}

fn invalid(msg: String) -> Error {
    Error::Io(io::Error::new(io::ErrorKind::InvalidInput, msg))
}

fn verbs_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Io(io::Error::other(format!("{what}: {e}")))
}

fn errno_err(what: &str, rc: i32) -> Error {
    verbs_err(what, io::Error::from_raw_os_error(rc))
}

/// The verbs access flags of a memory region granting `access`: exactly what it
/// asks for (local READ is always implied by verbs; remote write implies local
/// write at the NIC, though the key table still refuses such a region as a
/// landing buffer unless it was registered `LOCAL_WRITE`).
fn mr_flags(access: Access) -> AccessFlags {
    let mut flags = AccessFlags::none();
    if access.contains(Access::LOCAL_WRITE) {
        flags |= AccessFlags::LocalWrite;
    }
    if access.contains(Access::REMOTE_READ) {
        flags |= AccessFlags::RemoteRead;
    }
    if access.contains(Access::REMOTE_WRITE) {
        // Verbs refuses remote write without local write.
        flags |= AccessFlags::RemoteWrite | AccessFlags::LocalWrite;
    }
    flags
}

// ---------------------------------------------------------------------------------------
// Domain: registrations
// ---------------------------------------------------------------------------------------

/// The verbs side of one registration, indexed like its key-table entry.
struct VerbsEntry {
    /// The verbs local key (`lkey`); 0 = free.
    key: AtomicU32,
    /// The key-table key (generation and index) for accounting local READs.
    table_key: AtomicU32,
    /// Virtual address of the region's first byte.
    base: AtomicU64,
}

/// A verbs memory region and the mapped region it covers (kept mapped while registered).
type Owned = (Arc<MemoryRegion>, Arc<Region>);

struct DomainInner {
    // Field order is drop order: registrations before the device.
    /// Cold path only (register / deregister): the MR and the region it covers.
    owners: Mutex<Vec<Option<Owned>>>,
    /// Bounds, liveness and in-flight counts of local landing accesses.
    table: KeyTable,
    /// Lock-free verbs-key lookup for the data path.
    entries: Box<[VerbsEntry]>,
    /// Entries below this index may be in use (scan bound).
    high_water: AtomicU32,
    dev: Device,
    cfg: RdmaConfig,
}

impl DomainInner {
    /// Checks that `len` bytes at virtual address `addr` lie inside a live local
    /// registration `key` with LOCAL_WRITE; returns the access token to release
    /// when the READ completes.
    fn acquire_local(&self, key: u32, addr: u64, len: u32) -> Result<AccessToken, Error> {
        let n = self.high_water.load(Ordering::Acquire) as usize;
        for e in &self.entries[..n.min(self.entries.len())] {
            if e.key.load(Ordering::Acquire) != key || key == 0 {
                continue;
            }
            let table_key = e.table_key.load(Ordering::Acquire);
            let base = e.base.load(Ordering::Acquire);
            let offset = addr.checked_sub(base).ok_or(Error::OutOfBounds)?;
            return Ok(self.table.acquire(
                table_key,
                offset,
                u64::from(len),
                Access::LOCAL_WRITE,
            )?);
        }
        Err(Error::BadKey)
    }
}

/// One process's RDMA context (device port + protection domain). Cheap to clone.
#[derive(Clone)]
pub struct RdmaDomain {
    inner: Arc<DomainInner>,
}

impl std::fmt::Debug for RdmaDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let d = &self.inner.dev;
        f.debug_struct("RdmaDomain")
            .field("device", &d.name)
            .field("port", &d.port)
            .field("gid_index", &d.gid_index)
            .field("gid", &std::net::Ipv6Addr::from(d.gid))
            .field("gid_type", &d.gid_type)
            .field("mtu", &d.mtu)
            .finish()
    }
}

impl RdmaDomain {
    /// Opens the device and port `cfg` names. `Error::Unsupported` means no
    /// (matching) device exists here.
    pub fn open(cfg: RdmaConfig) -> Result<RdmaDomain, Error> {
        let dev = Device::open(&cfg)?;
        let entries = (0..MAX_REGISTRATIONS)
            .map(|_| VerbsEntry {
                key: AtomicU32::new(0),
                table_key: AtomicU32::new(0),
                base: AtomicU64::new(0),
            })
            .collect();
        Ok(RdmaDomain {
            inner: Arc::new(DomainInner {
                owners: Mutex::new(vec![None; MAX_REGISTRATIONS as usize]),
                table: KeyTable::new_local(MAX_REGISTRATIONS),
                entries,
                high_water: AtomicU32::new(0),
                dev,
                cfg,
            }),
        })
    }

    /// [`open`](Self::open) with [`RdmaConfig::from_env`].
    pub fn from_env() -> Result<RdmaDomain, Error> {
        Self::open(RdmaConfig::from_env()?)
    }

    /// Device name (e.g. `rxe0`).
    pub fn device_name(&self) -> &str {
        &self.inner.dev.name
    }

    /// The GID this domain's connections advertise.
    pub fn gid(&self) -> std::net::Ipv6Addr {
        std::net::Ipv6Addr::from(self.inner.dev.gid)
    }

    /// The port in use (from 1).
    pub fn port(&self) -> u8 {
        self.inner.dev.port
    }

    /// The GID table index in use.
    pub fn gid_index(&self) -> u8 {
        self.inner.dev.gid_index
    }

    fn establish(
        &self,
        mut sock: TcpStream,
        deadline: std::time::Instant,
    ) -> Result<RdmaConnection, Error> {
        let left = deadline
            .saturating_duration_since(std::time::Instant::now())
            .max(std::time::Duration::from_millis(1));
        sock.set_read_timeout(Some(left))?;
        sock.set_write_timeout(Some(left))?;
        sock.set_nodelay(true)?;
        let conn = RdmaConnection::establish(self.inner.clone(), &mut sock)?;
        // The connection holds a clone of this socket (same open file): from now on it
        // is only peeked at for EOF, without blocking.
        sock.set_read_timeout(None)?;
        sock.set_nonblocking(true)?;
        Ok(conn)
    }
}

fn deadline_after(timeout: Duration) -> std::time::Instant {
    std::time::Instant::now() + std::time::Duration::from_nanos(timeout.as_nanos())
}

fn resolve(addr: &str) -> Result<SocketAddr, Error> {
    addr.to_socket_addrs()?
        .next()
        .ok_or_else(|| invalid(format!("address {addr:?} resolves to nothing")))
}

impl Domain for RdmaDomain {
    type Conn = RdmaConnection;
    type Listener = RdmaListener;

    fn kind(&self) -> &'static str {
        "rdma"
    }

    fn listen(&self, addr: &str) -> Result<RdmaListener, Error> {
        let addr = if addr.is_empty() { "127.0.0.1:0" } else { addr };
        let tcp = TcpListener::bind(resolve(addr)?)?;
        Ok(RdmaListener {
            tcp,
            domain: self.clone(),
        })
    }

    fn connect(&self, addr: &str, timeout: Duration) -> Result<RdmaConnection, Error> {
        let deadline = deadline_after(timeout);
        let target = resolve(addr)?;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout);
            }
            match TcpStream::connect_timeout(&target, left) {
                Ok(sock) => return self.establish(sock, deadline),
                // The listener may not be up yet (another VM still booting): retry
                // until the deadline, backing off briefly.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    std::thread::sleep(left.min(std::time::Duration::from_millis(20)));
                }
                Err(e) if e.kind() == io::ErrorKind::TimedOut => return Err(Error::Timeout),
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn register(&self, region: &Arc<Region>, access: Access) -> Result<Registration, Error> {
        let inner = &self.inner;
        // SAFETY: the region stays mapped while registered: `owners` holds an Arc to it
        // until `deregister` has dropped the MR (or the domain is dropped, MR first).
        let mr = unsafe {
            inner
                .dev
                .pd
                .reg_mr(region.as_ptr() as usize, region.len(), mr_flags(access))
        }
        .map_err(|e| verbs_err("ibv_reg_mr", e))?;
        let (key, remote_key) = (mr.lkey(), mr.rkey());
        let base = region.as_ptr() as u64;
        let mut owners = inner.owners.lock().unwrap_or_else(|p| p.into_inner());
        let table_key = inner
            .table
            .register(region.len() as u64, access, b"", |index| {
                let e = &inner.entries[index as usize];
                e.base.store(base, Ordering::Release);
                e.key.store(key, Ordering::Release);
                inner.high_water.fetch_max(index + 1, Ordering::AcqRel);
            })?;
        let index = (table_key & 0xffff) as usize;
        inner.entries[index]
            .table_key
            .store(table_key, Ordering::Release);
        owners[index] = Some((mr, region.clone()));
        Ok(Registration::with_keys(
            key,
            remote_key,
            region.clone(),
            access,
            base,
        ))
    }

    fn deregister(&self, reg: &Registration) -> Result<(), Error> {
        let inner = &self.inner;
        let mut owners = inner.owners.lock().unwrap_or_else(|p| p.into_inner());
        let n = inner.high_water.load(Ordering::Acquire) as usize;
        let found = inner.entries[..n].iter().position(|e| {
            e.key.load(Ordering::Acquire) == reg.key()
                && e.base.load(Ordering::Acquire) == reg.addr_base()
        });
        let index = found.ok_or(Error::BadKey)?;
        inner
            .table
            .deregister(inner.entries[index].table_key.load(Ordering::Acquire))?;
        inner.entries[index].key.store(0, Ordering::Release);
        // Dropping the MR deregisters it: peers' READs with its rkey fail from now on.
        owners[index] = None;
        Ok(())
    }

    fn registered_count(&self) -> usize {
        self.inner.table.live_count()
    }

    fn max_read_len(&self) -> u32 {
        MAX_READ_LEN
    }
}

/// Accepts RDMA connections (TCP bootstrap listener).
pub struct RdmaListener {
    tcp: TcpListener,
    domain: RdmaDomain,
}

impl Listener for RdmaListener {
    type Conn = RdmaConnection;

    fn local_addr(&self) -> String {
        self.tcp
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default()
    }

    fn accept(&mut self, timeout: Duration) -> Result<RdmaConnection, Error> {
        let deadline = deadline_after(timeout);
        let left_ms = deadline
            .saturating_duration_since(std::time::Instant::now())
            .as_millis();
        let mut pfd = libc::pollfd {
            fd: self.tcp.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `pfd` is a valid pollfd for the duration of the call; nfds = 1.
        let rc = unsafe { libc::poll(&mut pfd, 1, left_ms.min(i32::MAX as u128) as i32) };
        if rc < 0 {
            return Err(io::Error::last_os_error().into());
        }
        if rc == 0 {
            return Err(Error::Timeout);
        }
        let (sock, _) = self.tcp.accept()?;
        self.domain.establish(sock, deadline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_grant_exactly_their_access() {
        // Staging: remote READ only; landing: local write only; nothing else.
        assert_eq!(mr_flags(Access::REMOTE_READ), AccessFlags::RemoteRead);
        assert_eq!(mr_flags(Access::LOCAL_WRITE), AccessFlags::LocalWrite);
        assert_eq!(
            mr_flags(Access::REMOTE_READ | Access::LOCAL_WRITE),
            AccessFlags::RemoteRead | AccessFlags::LocalWrite
        );
        // A WRITE target (netbench's): remote write needs local write in verbs.
        assert_eq!(
            mr_flags(Access::REMOTE_READ | Access::REMOTE_WRITE),
            AccessFlags::RemoteRead | AccessFlags::RemoteWrite | AccessFlags::LocalWrite
        );
    }

    #[test]
    fn registration_keeps_local_and_remote_keys_apart() {
        let region = Region::anonymous(4096).unwrap();
        let base = region.as_ptr() as u64;
        let staging =
            Registration::with_keys(0x11, 0x22, region.clone(), Access::REMOTE_READ, base);
        assert_eq!(staging.key(), 0x11);
        let r = staging.remote_ref(64, 8).unwrap();
        assert_eq!((r.key, r.offset), (0x22, base + 64));
        assert!(
            staging.local_ref(0, 8).is_err(),
            "staging is no landing buffer"
        );
        let landing = Registration::with_keys(0x33, 0x44, region, Access::LOCAL_WRITE, base);
        assert_eq!(landing.local_ref(0, 8).unwrap().key, 0x33);
        assert!(
            landing.remote_ref(0, 8).is_err(),
            "landing is not remote-readable"
        );
    }

    #[test]
    fn missing_device_is_reported_not_panicked() {
        let cfg = RdmaConfig {
            device: Some("no-such-device-xyz".into()),
            ..RdmaConfig::default()
        };
        match RdmaDomain::open(cfg) {
            Err(Error::Unsupported(_)) => {}
            other => panic!("expected Unsupported, got {other:?}"),
        }
    }
}
