//! The `rdma` transport: real verbs (feature `rdma`).
//!
//! - [`RdmaDomain`] = one device port + protection domain. It registers
//!   [`Region`]s as verbs memory regions with exactly the access asked for
//!   (see "Keys" below).
//! - [`RdmaConnection`] = one RC queue pair, bootstrapped over a TCP socket
//!   (both sides exchange QPN, PSN, LID, GID, MTU and READ depth, then meet at
//!   a barrier once ready-to-send). Control messages go by SEND into a ring of
//!   pre-posted receive slots; READs are RDMA READ work requests naming the
//!   peer's `(rkey, virtual address)` straight from the [`RemoteRef`].
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
//! landing buffer and a READ landing in a staging region.
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

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::mem::MaybeUninit;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::ptr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rdma_mummy_sys as sys;
use sideway::ibverbs::address::{AddressHandleAttribute, Gid, GidType};
use sideway::ibverbs::completion::{BasicCompletionQueue, CompletionQueue as _};
use sideway::ibverbs::device::{DeviceInfo as _, DeviceList};
use sideway::ibverbs::device_context::{DeviceContext, Mtu, PortState};
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{
    BasicQueuePair, QueuePair as _, QueuePairAttribute, QueuePairState,
};
use sideway::ibverbs::AccessFlags;

use super::{
    Access, Completion, Connection, Domain, Error, ErrorKind, Listener, ReadOp, Region,
    Registration,
};
use crate::mem::{AccessToken, KeyTable};
use crate::time::Duration;

mod wake;
use wake::{CqWake, WaitFd};

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
        }
    }
}

impl RdmaConfig {
    /// Defaults, overridden by `SYMPHONY_RDMA_DEVICE`, `SYMPHONY_RDMA_PORT`,
    /// `SYMPHONY_RDMA_GID_INDEX`, `SYMPHONY_RDMA_READ_DEPTH` and
    /// `SYMPHONY_RDMA_ACK_TIMEOUT` when set.
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

// ---------------------------------------------------------------------------------------
// Device, port and GID selection
// ---------------------------------------------------------------------------------------

/// Whether a GID is an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`): the RoCE v2
/// GID of an IPv4 interface address.
fn is_ipv4_mapped(gid: &[u8; 16]) -> bool {
    gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff
}

/// GID preference, lower is better: RoCE v2 with IPv4-mapped address (routable over
/// UDP/IPv4), then RoCE v2, then anything else (RoCE v1, InfiniBand).
fn gid_rank(gid_type: GidType, gid: &[u8; 16]) -> u8 {
    match (gid_type, is_ipv4_mapped(gid)) {
        (GidType::RoceV2, true) => 0,
        (GidType::RoceV2, false) => 1,
        _ => 2,
    }
}

/// The verbs access flags of a memory region granting `access`: exactly what it
/// asks for (local READ is always implied by verbs).
fn mr_flags(access: Access) -> AccessFlags {
    let mut flags = AccessFlags::none();
    if access.contains(Access::LOCAL_WRITE) {
        flags |= AccessFlags::LocalWrite;
    }
    if access.contains(Access::REMOTE_READ) {
        flags |= AccessFlags::RemoteRead;
    }
    flags
}

/// An opened device port with its protection domain.
struct Device {
    // Field order is drop order: the PD before the context it came from.
    pd: Arc<ProtectionDomain>,
    ctx: Arc<DeviceContext>,
    name: String,
    port: u8,
    gid_index: u8,
    gid: [u8; 16],
    gid_type: GidType,
    lid: u16,
    mtu: Mtu,
    /// READs a QP may have outstanding as initiator (`max_qp_init_rd_atom`).
    max_init_reads: u8,
    /// READs a QP may serve at once as responder (`max_qp_rd_atom`).
    max_resp_reads: u8,
}

/// A device's READ depth attribute as a verbs `u8` (at least 1).
fn depth_attr(v: i32) -> u8 {
    u8::try_from(v.clamp(1, 255)).unwrap_or(1)
}

impl Device {
    fn open(cfg: &RdmaConfig) -> Result<Device, Error> {
        let list = DeviceList::new()
            .map_err(|_| Error::Unsupported("no RDMA device list (libibverbs missing?)"))?;
        let mut chosen = None;
        for dev in list.iter() {
            let name = dev.name();
            if cfg.device.as_deref().is_some_and(|want| want != name) {
                continue;
            }
            let ctx = dev
                .open()
                .map_err(|e| verbs_err(&format!("open {name}"), e))?;
            let port = ctx
                .query_port(cfg.port)
                .map_err(|e| verbs_err(&format!("query {name} port"), e))?;
            if port.port_state() != PortState::Active && cfg.device.is_none() {
                continue;
            }
            chosen = Some((name, ctx, port));
            break;
        }
        let (name, ctx, port) = chosen.ok_or(Error::Unsupported(match cfg.device {
            Some(_) => "the configured RDMA device was not found",
            None => "no RDMA device with an active port",
        }))?;
        let (gid_index, gid, gid_type) = match cfg.gid_index {
            Some(i) => {
                let e = ctx
                    .query_gid_ex(cfg.port, i)
                    .map_err(|e| verbs_err(&format!("GID index {i}"), e))?;
                (i, e.gid().raw, e.gid_type())
            }
            None => {
                let mut best: Option<(u8, u32, [u8; 16], GidType)> = None;
                for i in 0..u32::try_from(port.gid_tbl_len()).unwrap_or(0) {
                    // Unpopulated entries fail to query or read as zero.
                    let Ok(e) = ctx.query_gid_ex(cfg.port, i) else {
                        continue;
                    };
                    let raw = e.gid().raw;
                    if raw == [0; 16] {
                        continue;
                    }
                    let rank = gid_rank(e.gid_type(), &raw);
                    if best.as_ref().is_none_or(|b| rank < b.0) {
                        best = Some((rank, i, raw, e.gid_type()));
                    }
                }
                let (_, i, raw, t) = best.ok_or_else(|| verbs_err(&name, "no usable GID"))?;
                (i, raw, t)
            }
        };
        let gid_index = u8::try_from(gid_index)
            .map_err(|_| invalid(format!("GID index {gid_index} above 255")))?;
        let attr = ctx
            .query_device()
            .map_err(|e| verbs_err(&format!("query {name}"), e))?;
        let max_init_reads = depth_attr(attr.max_qp_init_rd_atom());
        let max_resp_reads = depth_attr(attr.max_qp_rd_atom());
        let pd = ctx.alloc_pd().map_err(|e| verbs_err("ibv_alloc_pd", e))?;
        Ok(Device {
            pd,
            ctx,
            name,
            port: cfg.port,
            gid_index,
            gid,
            gid_type,
            lid: port.lid(),
            mtu: port.active_mtu(),
            max_init_reads,
            max_resp_reads,
        })
    }
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
    /// Whether any RDMA device is visible (libibverbs loadable, one device listed).
    /// Never fails: false on any error.
    pub fn device_present() -> bool {
        DeviceList::new().map(|l| !l.is_empty()).unwrap_or(false)
    }

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

// ---------------------------------------------------------------------------------------
// Connection bootstrap
// ---------------------------------------------------------------------------------------

/// What each side sends the other over the bootstrap socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct QpEndpoint {
    qpn: u32,
    psn: u32,
    lid: u16,
    gid: [u8; 16],
    /// Active MTU, verbs enum value 1..=5.
    mtu: u8,
    /// READs this side serves at once as responder (its `max_dest_rd_atomic`):
    /// the most the peer may have on the wire towards it.
    resp_depth: u8,
    /// Largest control message this side sends and receives.
    max_msg_len: u32,
}

/// "SYRD" + version 2 (1 had one READ depth for both directions).
const BOOTSTRAP_MAGIC: u32 = u32::from_le_bytes(*b"SYRD");
const BOOTSTRAP_VERSION: u8 = 2;

impl QpEndpoint {
    const LEN: usize = 4 + 1 + 4 + 4 + 2 + 16 + 1 + 1 + 4;

    fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&BOOTSTRAP_MAGIC.to_le_bytes());
        b[4] = BOOTSTRAP_VERSION;
        b[5..9].copy_from_slice(&self.qpn.to_le_bytes());
        b[9..13].copy_from_slice(&self.psn.to_le_bytes());
        b[13..15].copy_from_slice(&self.lid.to_le_bytes());
        b[15..31].copy_from_slice(&self.gid);
        b[31] = self.mtu;
        b[32] = self.resp_depth;
        b[33..37].copy_from_slice(&self.max_msg_len.to_le_bytes());
        b
    }

    /// Decodes and validates the peer's bytes; never panics.
    fn decode(b: &[u8; Self::LEN]) -> Result<Self, Error> {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        if u32_at(0) != BOOTSTRAP_MAGIC {
            return Err(Error::Protocol(crate::wire::WireError::BadMagic));
        }
        if b[4] != BOOTSTRAP_VERSION {
            return Err(Error::Protocol(crate::wire::WireError::BadVersion(
                u16::from(b[4]),
            )));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[15..31]);
        let e = QpEndpoint {
            qpn: u32_at(5),
            psn: u32_at(9),
            lid: u16::from_le_bytes([b[13], b[14]]),
            gid,
            mtu: b[31],
            resp_depth: b[32],
            max_msg_len: u32_at(33),
        };
        let valid =
            e.qpn < 1 << 24 && e.psn < 1 << 24 && (1..=5).contains(&e.mtu) && e.resp_depth > 0;
        if !valid {
            return Err(Error::Protocol(crate::wire::WireError::BadLength));
        }
        Ok(e)
    }
}

fn mtu_from_wire(v: u8) -> Mtu {
    match v {
        1 => Mtu::Mtu256,
        2 => Mtu::Mtu512,
        3 => Mtu::Mtu1024,
        4 => Mtu::Mtu2048,
        _ => Mtu::Mtu4096,
    }
}

/// `wr_id` tag of SEND work requests; READs use their record index.
const WR_SEND: u64 = 1 << 63;

/// A READ in flight: what to report and what to release on completion.
#[derive(Clone, Copy)]
struct ReadRecord {
    wr_id: u64,
    token: Option<AccessToken>,
    len: u32,
}

/// One RC queue pair to a peer. Used by one thread at a time; allocation-free once built.
pub struct RdmaConnection {
    // Field order is drop order: the QP first (no more DMA), then the registrations,
    // then the buffers they cover, then the CQs and the domain.
    qp: BasicQueuePair,
    recv_mr: Arc<MemoryRegion>,
    send_mr: Arc<MemoryRegion>,
    recv_buf: Box<[u8]>,
    send_buf: Box<[u8]>,
    send_cq: Arc<BasicCompletionQueue>,
    recv_cq: Arc<BasicCompletionQueue>,
    domain: Arc<DomainInner>,
    sock: TcpStream,
    /// Completion-channel state of each queue (event-driven idling) and the fd
    /// over both channels and `sock` that idle callers sleep on.
    send_wake: CqWake,
    recv_wake: CqWake,
    wait: WaitFd,
    slot_len: usize,
    /// Largest message the peer accepts.
    peer_max_msg: usize,
    send_slots: u32,
    /// Next send slot; slots are reused in order and SEND completions arrive in order,
    /// so `sends_in_flight` alone tells which slots are busy.
    send_next: u32,
    sends_in_flight: u32,
    /// A received message not yet handed out (it did not fit the caller's buffer,
    /// or `wait` found it): (slot, length).
    pending_recv: Option<(u32, usize)>,
    records: Box<[ReadRecord]>,
    free_records: Vec<u32>,
    done: VecDeque<Completion>,
    max_reads: u32,
    empty_polls: u32,
    peer_gone: bool,
    /// Why the QP stopped working (a failed work completion puts it in the error state).
    failed: Option<ErrorKind>,
}

impl std::fmt::Debug for RdmaConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaConnection")
            .field("device", &self.domain.dev.name)
            .field("qpn", &self.qp.qp_number())
            .field(
                "reads_in_flight",
                &(self.max_reads as usize - self.free_records.len()),
            )
            .field("failed", &self.failed)
            .finish()
    }
}

impl RdmaConnection {
    /// Creates the QP, swaps endpoints over `sock`, connects (INIT, RTR, RTS) and meets
    /// the peer at a barrier. `sock` is filled in by the caller afterwards.
    fn establish(domain: Arc<DomainInner>, sock: &mut TcpStream) -> Result<RdmaConnection, Error> {
        let cfg = &domain.cfg;
        let dev = &domain.dev;
        let slot_len = cfg.max_msg_len.max(64) as usize;
        let max_reads = cfg.max_reads_in_flight.clamp(1, 128);
        let depth = u8::try_from(cfg.read_depth.clamp(1, 255)).unwrap_or(1);
        // What we serve at once as responder, granted to the peer.
        let resp_depth = depth.min(dev.max_resp_reads);
        let recv_slots = cfg.recv_slots.max(1);
        let send_slots = cfg.send_slots.max(1);
        let sq_depth = send_slots + max_reads;
        let send_wake = CqWake::new(&dev.ctx)?;
        let recv_wake = CqWake::new(&dev.ctx)?;
        let send_cq = dev
            .ctx
            .create_cq_builder()
            .setup_cqe(sq_depth)
            .setup_comp_channel(send_wake.channel(), 0)
            .build()
            .map_err(|e| verbs_err("ibv_create_cq", e))?;
        let recv_cq = dev
            .ctx
            .create_cq_builder()
            .setup_cqe(recv_slots)
            .setup_comp_channel(recv_wake.channel(), 0)
            .build()
            .map_err(|e| verbs_err("ibv_create_cq", e))?;
        let mut qp = dev
            .pd
            .create_qp_builder()
            .setup_max_send_wr(sq_depth)
            .setup_max_recv_wr(recv_slots)
            .setup_max_send_sge(1)
            .setup_max_recv_sge(1)
            .setup_send_cq(send_cq.clone())
            .setup_recv_cq(recv_cq.clone())
            .build()
            .map_err(|e| verbs_err("ibv_create_qp", e))?;

        let mut recv_buf = vec![0u8; slot_len * recv_slots as usize].into_boxed_slice();
        let mut send_buf = vec![0u8; slot_len * send_slots as usize].into_boxed_slice();
        // SAFETY: both buffers move into the connection, whose field order drops the
        // registrations before the buffers; a Box's heap memory does not move with it.
        let recv_mr = unsafe {
            dev.pd.reg_mr(
                recv_buf.as_mut_ptr() as usize,
                recv_buf.len(),
                AccessFlags::LocalWrite,
            )
        }
        .map_err(|e| verbs_err("ibv_reg_mr", e))?;
        // SAFETY: as above.
        let send_mr = unsafe {
            dev.pd.reg_mr(
                send_buf.as_mut_ptr() as usize,
                send_buf.len(),
                AccessFlags::LocalWrite,
            )
        }
        .map_err(|e| verbs_err("ibv_reg_mr", e))?;

        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::Init)
            .setup_pkey_index(0)
            .setup_port(dev.port)
            // Which regions a peer may READ is decided per MR; the QP must allow the kind.
            .setup_access_flags(AccessFlags::LocalWrite | AccessFlags::RemoteRead);
        qp.modify(&attr).map_err(|e| verbs_err("QP to INIT", e))?;

        let qpn = qp.qp_number();
        // Any 24-bit start works; derived from the QPN so that runs are reproducible.
        let psn = qpn.wrapping_mul(0x9E37_79B1) & 0x00ff_ffff;
        let local = QpEndpoint {
            qpn,
            psn,
            lid: dev.lid,
            gid: dev.gid,
            mtu: dev.mtu as u8,
            resp_depth,
            max_msg_len: slot_len as u32,
        };
        sock.write_all(&local.encode())?;
        let mut buf = [0u8; QpEndpoint::LEN];
        sock.read_exact(&mut buf)?;
        let remote = QpEndpoint::decode(&buf)?;
        // READs on the wire as initiator: never more than the peer serves at once.
        let init_depth = depth.min(dev.max_init_reads).min(remote.resp_depth);

        let records = vec![
            ReadRecord {
                wr_id: 0,
                token: None,
                len: 0
            };
            max_reads as usize
        ]
        .into_boxed_slice();
        let conn_sock = sock.try_clone()?;
        let wait = WaitFd::new(&send_wake, &recv_wake, conn_sock.as_raw_fd())?;
        let mut conn = RdmaConnection {
            qp,
            recv_mr,
            send_mr,
            recv_buf,
            send_buf,
            send_cq,
            recv_cq,
            domain: domain.clone(),
            sock: conn_sock,
            send_wake,
            recv_wake,
            wait,
            slot_len,
            peer_max_msg: remote.max_msg_len as usize,
            send_slots,
            send_next: 0,
            sends_in_flight: 0,
            pending_recv: None,
            records,
            free_records: (0..max_reads).rev().collect(),
            done: VecDeque::with_capacity(max_reads as usize),
            max_reads,
            empty_polls: 0,
            peer_gone: false,
            failed: None,
        };
        // Receives go up before RTR, so the peer's first SEND finds one.
        for slot in 0..recv_slots {
            conn.post_recv_slot(slot)?;
        }

        let mut ah = AddressHandleAttribute::new();
        ah.setup_dest_lid(remote.lid)
            .setup_port(dev.port)
            .setup_grh(&Gid { raw: remote.gid }, 0, dev.gid_index, 64, 0);
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::ReadyToReceive)
            .setup_path_mtu(dev.mtu.min(mtu_from_wire(remote.mtu)))
            .setup_dest_qp_num(remote.qpn)
            .setup_rq_psn(remote.psn)
            .setup_max_dest_read_atomic(resp_depth)
            // 12 = 0.64 ms before a sender retries after a receive-not-ready NAK
            .setup_min_rnr_timer(12)
            .setup_address_vector(&ah);
        conn.qp
            .modify(&attr)
            .map_err(|e| verbs_err("QP to RTR", e))?;

        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::ReadyToSend)
            .setup_sq_psn(psn)
            .setup_timeout(cfg.ack_timeout.clamp(1, 31))
            // 6, not 7: rxe treats 7 as "retry forever", and a vanished peer must
            // end outstanding READs with an error (7 ACK timeouts: ~1.9 s by default)
            .setup_retry_cnt(6)
            // 7 = retry forever on RNR: a full receive ring back-pressures the sender
            .setup_rnr_retry(7)
            // READs posted beyond this wait in the send queue (see `read_depth`).
            .setup_max_read_atomic(init_depth);
        conn.qp
            .modify(&attr)
            .map_err(|e| verbs_err("QP to RTS", e))?;

        // Neither side sends before both are ready to receive.
        sock.write_all(&[0xA5])?;
        let mut b = [0u8; 1];
        sock.read_exact(&mut b)?;
        if b[0] != 0xA5 {
            return Err(Error::Protocol(crate::wire::WireError::BadMagic));
        }
        Ok(conn)
    }

    /// Largest control message this connection carries.
    pub fn max_msg_len(&self) -> usize {
        self.slot_len.min(self.peer_max_msg)
    }

    /// Why new READs are refused, if they are: after a remote access error the
    /// queue pair is gone and later READs report that same error (they would have
    /// been refused for it); after anything else the peer counts as gone.
    fn dead(&self) -> Option<Error> {
        match self.failed {
            Some(k @ (ErrorKind::BadKey | ErrorKind::OutOfBounds | ErrorKind::Timeout)) => {
                Some(Error::from(k))
            }
            Some(_) => Some(Error::PeerDisconnected),
            None => self.peer_gone.then_some(Error::PeerDisconnected),
        }
    }

    /// Why messages can no longer flow, if so.
    fn dead_for_messages(&self) -> Option<Error> {
        (self.failed.is_some() || self.peer_gone).then_some(Error::PeerDisconnected)
    }

    fn post_recv_slot(&mut self, slot: u32) -> Result<(), Error> {
        let mut sge = sys::ibv_sge {
            addr: self.recv_buf.as_ptr() as u64 + u64::from(slot) * self.slot_len as u64,
            length: self.slot_len as u32,
            lkey: self.recv_mr.lkey(),
        };
        let mut wr = sys::ibv_recv_wr {
            wr_id: u64::from(slot),
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad = ptr::null_mut();
        // SAFETY: the QP is alive (owned by self); `wr` and `sge` outlive the call; the
        // slot lies inside recv_buf, registered by recv_mr, both outliving the QP.
        let rc = unsafe { sys::ibv_post_recv(self.qp.qp().as_ptr(), &mut wr, &mut bad) };
        if rc != 0 {
            return Err(errno_err("ibv_post_recv", rc));
        }
        Ok(())
    }

    fn status_kind(status: u32) -> ErrorKind {
        use sys::ibv_wc_status as s;
        match status {
            s::IBV_WC_REM_ACCESS_ERR => ErrorKind::BadKey,
            s::IBV_WC_LOC_PROT_ERR | s::IBV_WC_LOC_LEN_ERR => ErrorKind::OutOfBounds,
            s::IBV_WC_REM_INV_REQ_ERR => ErrorKind::OutOfBounds,
            s::IBV_WC_RETRY_EXC_ERR | s::IBV_WC_RNR_RETRY_EXC_ERR | s::IBV_WC_WR_FLUSH_ERR => {
                ErrorKind::PeerDisconnected
            }
            s::IBV_WC_RESP_TIMEOUT_ERR => ErrorKind::Timeout,
            _ => ErrorKind::Io,
        }
    }

    /// Drains the send CQ: frees SEND slots, turns READ completions into `Completion`s.
    fn drain_send_cq(&mut self) -> Result<(), Error> {
        let mut wcs: [MaybeUninit<sys::ibv_wc>; 16] = [const { MaybeUninit::uninit() }; 16];
        loop {
            // SAFETY: the CQ is alive (held by self); the array has room for 16 entries.
            let n = unsafe {
                sys::ibv_poll_cq(self.send_cq.cq().as_ptr(), 16, wcs.as_mut_ptr().cast())
            };
            if n < 0 {
                return Err(errno_err("ibv_poll_cq", -n));
            }
            if n == 0 {
                // Drained: arm the channel, then poll once more (see `wake`). Only an
                // empty poll arms: a caller that always finds work (a busy-polled READ
                // that completes inside its doorbell, as on rxe) never pays for it.
                // SAFETY: the pointer is only used while self holds the CQ.
                let cq = unsafe { self.send_cq.cq() }.as_ptr();
                if self.send_wake.arm_when_empty(cq)? {
                    continue;
                }
                return Ok(());
            }
            self.send_wake.note_work();
            for wc in &wcs[..n as usize] {
                // SAFETY: ibv_poll_cq initialised the first n entries.
                let wc = unsafe { wc.assume_init_ref() };
                let ok = wc.status == sys::ibv_wc_status::IBV_WC_SUCCESS;
                if !ok && self.failed.is_none() {
                    self.failed = Some(Self::status_kind(wc.status));
                }
                // A flushed work request died of the QP's first error: report that one.
                let kind = match (wc.status, self.failed) {
                    (sys::ibv_wc_status::IBV_WC_WR_FLUSH_ERR, Some(first)) => first,
                    _ => Self::status_kind(wc.status),
                };
                if wc.wr_id & WR_SEND != 0 {
                    self.sends_in_flight = self.sends_in_flight.saturating_sub(1);
                    continue;
                }
                let Some(rec) = self.records.get(wc.wr_id as usize).copied() else {
                    continue;
                };
                if let Some(t) = rec.token {
                    self.domain.table.release(t);
                }
                self.free_records.push(wc.wr_id as u32);
                self.done.push_back(Completion {
                    wr_id: rec.wr_id,
                    status: if ok { Ok(()) } else { Err(kind) },
                    bytes: if ok { rec.len } else { 0 },
                });
            }
            if (n as usize) < wcs.len() {
                return Ok(());
            }
        }
    }

    /// Before telling a caller "nothing" (after which it may sleep on the wait fd):
    /// drains the send queue until it is armed, or until a READ completion turns
    /// up for the caller. A drain that found only SEND completions does not arm.
    fn arm_send_if_idle(&mut self) -> Result<(), Error> {
        while !self.send_wake.armed() && self.done.is_empty() {
            self.drain_send_cq()?;
        }
        Ok(())
    }

    /// The next receive completion: `(slot, length)`, or None once the receive
    /// queue is empty (then armed).
    fn poll_recv_cq(&mut self) -> Result<Option<(u32, usize)>, Error> {
        loop {
            let mut wc = MaybeUninit::<sys::ibv_wc>::uninit();
            // SAFETY: the CQ is alive; room for one entry.
            let n = unsafe { sys::ibv_poll_cq(self.recv_cq.cq().as_ptr(), 1, wc.as_mut_ptr()) };
            if n < 0 {
                return Err(errno_err("ibv_poll_cq", -n));
            }
            if n == 0 {
                // SAFETY: the pointer is only used while self holds the CQ.
                let cq = unsafe { self.recv_cq.cq() }.as_ptr();
                if self.recv_wake.arm_when_empty(cq)? {
                    continue;
                }
                return Ok(None);
            }
            self.recv_wake.note_work();
            // SAFETY: n == 1, so the entry is initialised.
            let wc = unsafe { wc.assume_init() };
            if wc.status != sys::ibv_wc_status::IBV_WC_SUCCESS {
                // Flushed receives after the QP failed: report the connection as dead.
                if self.failed.is_none() {
                    self.failed = Some(Self::status_kind(wc.status));
                }
                return Err(Error::PeerDisconnected);
            }
            let slot =
                u32::try_from(wc.wr_id).map_err(|_| errno_err("bad receive wr_id", libc::EINVAL))?;
            return Ok(Some((slot, (wc.byte_len as usize).min(self.slot_len))));
        }
    }

    /// Every `PEER_CHECK_EVERY` calls, looks for EOF on the bootstrap socket.
    fn check_peer(&mut self, force: bool) {
        if self.peer_gone {
            return;
        }
        self.empty_polls += 1;
        let every = if self.send_wake.armed() && self.recv_wake.armed() {
            PEER_CHECK_EVERY_ARMED
        } else {
            PEER_CHECK_EVERY
        };
        if !force && self.empty_polls < every {
            return;
        }
        self.empty_polls = 0;
        let mut b = [0u8; 1];
        match self.sock.peek(&mut b) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            // EOF; bytes after the barrier (which break the protocol); a reset.
            Ok(_) | Err(_) => self.peer_gone = true,
        }
        // The peer is gone: move the QP to the error state so that outstanding work
        // requests flush now (READs with an error completion) instead of after the
        // retry budget. Receives that already completed stay ahead of the flush, and
        // the peer waited for its SENDs to complete before it closed the socket.
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::Error);
        let _ = self.qp.modify(&attr);
    }

    /// Validates one READ, takes a record for it and builds its work request (whose
    /// `sg_list` the caller points at the returned SGE).
    fn prepare_read(&mut self, op: &ReadOp) -> Result<(sys::ibv_send_wr, sys::ibv_sge), Error> {
        if let Some(e) = self.dead() {
            return Err(e);
        }
        if op.remote.len > MAX_READ_LEN {
            return Err(Error::TooLarge);
        }
        if op.remote.len > op.local.len {
            return Err(Error::OutOfBounds);
        }
        // Completions not yet handed out count too: that bounds `done` (no growth).
        if self.outstanding_reads() >= self.max_reads as usize {
            return Err(Error::QueueFull);
        }
        let Some(&index) = self.free_records.last() else {
            return Err(Error::QueueFull);
        };
        let token = self
            .domain
            .acquire_local(op.local.key, op.local.offset, op.remote.len)?;
        self.free_records.pop();
        self.records[index as usize] = ReadRecord {
            wr_id: op.wr_id,
            token: Some(token),
            len: op.remote.len,
        };
        let sge = sys::ibv_sge {
            addr: op.local.offset,
            length: op.remote.len,
            lkey: op.local.key,
        };
        // SAFETY: ibv_send_wr is a plain C struct; all-zero is a valid value.
        let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = u64::from(index);
        wr.num_sge = 1;
        wr.opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_READ;
        wr.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        wr.wr.rdma = sys::rdma_t {
            remote_addr: op.remote.offset,
            rkey: op.remote.key,
        };
        Ok((wr, sge))
    }

    /// Undoes `prepare_read` for WRs that were built but not posted.
    fn unprepare(&mut self, wrs: &[sys::ibv_send_wr]) {
        for wr in wrs {
            let index = wr.wr_id as usize;
            if let Some(t) = self.records[index].token.take() {
                self.domain.table.release(t);
            }
            self.free_records.push(index as u32);
        }
    }

    /// Posts `wrs` (with `sges`, same length) as one linked list; on failure unwinds
    /// the ones the provider did not take and returns how many it took.
    fn post_chain(
        &mut self,
        wrs: &mut [sys::ibv_send_wr],
        sges: &mut [sys::ibv_sge],
    ) -> Result<(), (usize, Error)> {
        let n = wrs.len().min(sges.len());
        for i in 0..n {
            wrs[i].sg_list = &mut sges[i];
            wrs[i].next = if i + 1 < n {
                &mut wrs[i + 1]
            } else {
                ptr::null_mut()
            };
        }
        let mut bad: *mut sys::ibv_send_wr = ptr::null_mut();
        // SAFETY: the QP is alive; the WR chain and its SGEs live on the caller's stack
        // across the call; every local range was checked against a live LOCAL_WRITE
        // registration whose access token is held until the READ completes.
        let rc = unsafe { sys::ibv_post_send(self.qp.qp().as_ptr(), wrs.as_mut_ptr(), &mut bad) };
        if rc == 0 {
            return Ok(());
        }
        let taken = if bad.is_null() {
            0
        } else {
            (bad as usize - wrs.as_ptr() as usize) / size_of::<sys::ibv_send_wr>()
        };
        let taken = taken.min(n);
        self.unprepare(&wrs[taken..n]);
        let err = if rc == libc::ENOMEM {
            Error::QueueFull
        } else {
            errno_err("ibv_post_send(READ)", rc)
        };
        Err((taken, err))
    }
}

impl Connection for RdmaConnection {
    fn send(&mut self, msg: &[u8]) -> Result<(), Error> {
        if let Some(e) = self.dead_for_messages() {
            return Err(e);
        }
        if msg.len() > self.max_msg_len() {
            return Err(Error::TooLarge);
        }
        // Whole wire messages only: the peer must never see a torn or padded one.
        if crate::wire::frame_len(msg)? != Some(msg.len()) {
            return Err(Error::Protocol(crate::wire::WireError::BadLength));
        }
        if self.sends_in_flight == self.send_slots {
            self.drain_send_cq()?;
            if self.sends_in_flight == self.send_slots {
                return Err(Error::QueueFull);
            }
        }
        let slot = self.send_next;
        let off = slot as usize * self.slot_len;
        self.send_buf[off..off + msg.len()].copy_from_slice(msg);
        let mut sge = sys::ibv_sge {
            addr: self.send_buf.as_ptr() as u64 + off as u64,
            length: msg.len() as u32,
            lkey: self.send_mr.lkey(),
        };
        // SAFETY: ibv_send_wr is a plain C struct; all-zero is a valid value.
        let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = WR_SEND | u64::from(slot);
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = sys::ibv_wr_opcode::IBV_WR_SEND;
        wr.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        let mut bad = ptr::null_mut();
        // SAFETY: the QP is alive; `wr`/`sge` outlive the call; the slot is inside the
        // registered send buffer and is not rewritten before this SEND completes.
        let rc = unsafe { sys::ibv_post_send(self.qp.qp().as_ptr(), &mut wr, &mut bad) };
        if rc != 0 {
            return Err(if rc == libc::ENOMEM {
                Error::QueueFull
            } else {
                errno_err("ibv_post_send(SEND)", rc)
            });
        }
        self.sends_in_flight += 1;
        self.send_next = (slot + 1) % self.send_slots;
        Ok(())
    }

    fn try_recv(&mut self, buf: &mut [u8]) -> Result<Option<usize>, Error> {
        let (slot, len) = match self.pending_recv.take() {
            Some(p) => p,
            None => match self.poll_recv_cq()? {
                Some(p) => p,
                None => {
                    if let Some(e) = self.dead_for_messages() {
                        return Err(e);
                    }
                    self.check_peer(false);
                    return Ok(None);
                }
            },
        };
        if len > buf.len() {
            self.pending_recv = Some((slot, len));
            return Err(Error::BufferTooSmall { needed: len });
        }
        let off = slot as usize * self.slot_len;
        let msg = &self.recv_buf[off..off + len];
        // Untrusted bytes: hand out only what frames as exactly one message.
        let framed = crate::wire::frame_len(msg);
        if framed == Ok(Some(len)) {
            buf[..len].copy_from_slice(msg);
        }
        self.post_recv_slot(slot)?;
        match framed {
            Ok(Some(n)) if n == len => Ok(Some(len)),
            Err(e) => Err(Error::Protocol(e)),
            _ => Err(Error::Protocol(crate::wire::WireError::BadLength)),
        }
    }

    fn post_read(&mut self, op: &ReadOp) -> Result<(), Error> {
        match self.post_reads(std::slice::from_ref(op)) {
            Ok(_) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn post_reads(&mut self, ops: &[ReadOp]) -> Result<usize, Error> {
        if ops.len() > self.free_records.len() {
            self.drain_send_cq()?;
        }
        let mut accepted = 0;
        for chunk in ops.chunks(POST_BATCH) {
            // Only the entries used are written: zeroing all 16 WRs (2 KiB) per call is
            // measurable on a single READ (and very much so under emulation).
            let mut sges = [const { MaybeUninit::<sys::ibv_sge>::uninit() }; POST_BATCH];
            let mut wrs = [const { MaybeUninit::<sys::ibv_send_wr>::uninit() }; POST_BATCH];
            let mut n = 0;
            let mut refused = None;
            for op in chunk {
                match self.prepare_read(op) {
                    Ok((wr, sge)) => {
                        wrs[n].write(wr);
                        sges[n].write(sge);
                        n += 1;
                    }
                    Err(e) => {
                        refused = Some(e);
                        break;
                    }
                }
            }
            if n > 0 {
                // SAFETY: the first n entries of both arrays were written just above.
                let (wrs, sges) = unsafe {
                    (
                        std::slice::from_raw_parts_mut(
                            wrs.as_mut_ptr().cast::<sys::ibv_send_wr>(),
                            n,
                        ),
                        std::slice::from_raw_parts_mut(sges.as_mut_ptr().cast::<sys::ibv_sge>(), n),
                    )
                };
                if let Err((taken, e)) = self.post_chain(wrs, sges) {
                    accepted += taken;
                    return if accepted == 0 { Err(e) } else { Ok(accepted) };
                }
                accepted += n;
            }
            if let Some(e) = refused {
                return if accepted == 0 { Err(e) } else { Ok(accepted) };
            }
        }
        Ok(accepted)
    }

    fn poll_completions(&mut self, out: &mut [Completion]) -> Result<usize, Error> {
        self.drain_send_cq()?;
        if self.done.is_empty() {
            self.arm_send_if_idle()?;
        }
        let n = out.len().min(self.done.len());
        for slot in out.iter_mut().take(n) {
            if let Some(c) = self.done.pop_front() {
                *slot = c;
            }
        }
        if n == 0 {
            self.check_peer(false);
        }
        Ok(n)
    }

    fn progress(&mut self) -> Result<(), Error> {
        self.drain_send_cq()?;
        if self.done.is_empty() {
            self.arm_send_if_idle()?;
        }
        self.check_peer(false);
        Ok(())
    }

    fn outstanding_reads(&self) -> usize {
        (self.max_reads as usize - self.free_records.len()) + self.done.len()
    }

    fn max_outstanding_reads(&self) -> usize {
        self.max_reads as usize
    }

    fn is_connected(&self) -> bool {
        self.dead().is_none()
    }

    /// Sleeps on the completion channels and the bootstrap socket (see `wake`).
    fn wait(&mut self, timeout: Duration) -> Result<bool, Error> {
        if let Some(e) = self.dead_for_messages() {
            return Err(e);
        }
        if !self.done.is_empty() || self.pending_recv.is_some() {
            return Ok(true);
        }
        // Both queues must be armed before sleeping (the caller may have polled
        // only one): drain-and-arm each; whatever turns up is kept for the next poll.
        self.arm_send_if_idle()?;
        if !self.done.is_empty() {
            return Ok(true);
        }
        if let Some(p) = self.poll_recv_cq()? {
            self.pending_recv = Some(p);
            return Ok(true);
        }
        self.check_peer(true);
        if self.peer_gone {
            return Ok(true);
        }
        self.wait.wait(timeout)?;
        Ok(true)
    }

    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(self.wait.fd())
    }

    /// Receive completions are taken off the CQ only by `try_recv` and
    /// `wait`; `wait` may keep one for the next `try_recv`.
    fn may_hold_input(&self) -> bool {
        self.pending_recv.is_some()
    }
}

impl Drop for RdmaConnection {
    fn drop(&mut self) {
        // Let queued SENDs reach the peer before the QP goes (a closed bootstrap socket
        // tells the peer everything we sent has arrived). Bounded: a dead peer gives up.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while self.sends_in_flight > 0
            && self.failed.is_none()
            && std::time::Instant::now() < deadline
        {
            if self.drain_send_cq().is_err() {
                break;
            }
            std::thread::yield_now();
        }
        // READs still in flight die with the QP: give their landing accesses back.
        for i in 0..self.records.len() {
            if let Some(t) = self.records[i].token.take() {
                self.domain.table.release(t);
            }
        }
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_roundtrips_and_rejects_garbage() {
        let e = QpEndpoint {
            qpn: 17,
            psn: 0xabcdef,
            lid: 0,
            gid: [7; 16],
            mtu: 3,
            resp_depth: 16,
            max_msg_len: 32768,
        };
        assert_eq!(QpEndpoint::decode(&e.encode()).unwrap(), e);
        let mut b = e.encode();
        b[0] ^= 1;
        assert!(QpEndpoint::decode(&b).is_err());
        let mut b = e.encode();
        b[31] = 9; // MTU enum out of range
        assert!(QpEndpoint::decode(&b).is_err());
        let mut b = e.encode();
        b[8] = 1; // PSN >= 2^24
        assert!(QpEndpoint::decode(&b).is_err());
        for seed in 0..256u32 {
            let mut b = [0u8; QpEndpoint::LEN];
            for (i, x) in b.iter_mut().enumerate() {
                *x = (seed.wrapping_mul(2654435761).wrapping_add(i as u32 * 40503) >> 13) as u8;
            }
            let _ = QpEndpoint::decode(&b); // never panics
        }
    }

    #[test]
    fn gid_preference_is_rocev2_ipv4_first() {
        let v4 = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 2, 15];
        let link_local = [
            0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x50, 0x54, 0, 0xff, 0xfe, 0x12, 0x34, 0x56,
        ];
        assert!(is_ipv4_mapped(&v4));
        assert!(!is_ipv4_mapped(&link_local));
        assert!(gid_rank(GidType::RoceV2, &v4) < gid_rank(GidType::RoceV2, &link_local));
        assert!(gid_rank(GidType::RoceV2, &link_local) < gid_rank(GidType::RoceV1, &v4));
    }

    #[test]
    fn regions_grant_exactly_their_access() {
        // Staging: remote READ only; landing: local write only; nothing else.
        assert_eq!(mr_flags(Access::REMOTE_READ), AccessFlags::RemoteRead);
        assert_eq!(mr_flags(Access::LOCAL_WRITE), AccessFlags::LocalWrite);
        assert_eq!(
            mr_flags(Access::REMOTE_READ | Access::LOCAL_WRITE),
            AccessFlags::RemoteRead | AccessFlags::LocalWrite
        );
    }

    #[test]
    fn registration_keeps_local_and_remote_keys_apart() {
        let region = Region::anonymous(4096).unwrap();
        let base = region.as_ptr() as u64;
        let staging = Registration::with_keys(0x11, 0x22, region.clone(), Access::REMOTE_READ, base);
        assert_eq!(staging.key(), 0x11);
        let r = staging.remote_ref(64, 8).unwrap();
        assert_eq!((r.key, r.offset), (0x22, base + 64));
        assert!(staging.local_ref(0, 8).is_err(), "staging is no landing buffer");
        let landing = Registration::with_keys(0x33, 0x44, region, Access::LOCAL_WRITE, base);
        assert_eq!(landing.local_ref(0, 8).unwrap().key, 0x33);
        assert!(landing.remote_ref(0, 8).is_err(), "landing is not remote-readable");
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
