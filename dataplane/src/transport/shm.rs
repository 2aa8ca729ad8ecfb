//! Same-host transport: registered regions are shared-memory files that
//! readers map read-only; a READ is a bounds-checked copy done by the
//! reader itself, synchronously inside `post_read`.
//!
//! Each domain publishes its key table in a registry file in this user's
//! private directory (`crate::mem::shm_dir`, mode 0700; files 0600) that
//! peers of the same user map: a reader checks every READ against the owner's *live*
//! registration and counts itself in flight there, so the owner's
//! deregistration sees it (and returns `Busy`) exactly as with the tcp
//! responder. The registry also holds one liveness word per connection and
//! one for the owner, cleared on close, so a reader notices a departed peer
//! on its next READ without a syscall.
//!
//! Control messages cross through two single-producer single-consumer
//! byte rings in shared memory per connection (`shm_ring`), one each way:
//! each side creates its outgoing ring's file at connect, names it in the
//! hello, maps the peer's, and unlinks its own once the peer acknowledged
//! the mapping. The rings are the stream engine's byte mover, so framing,
//! inbox, send queue and tests are shared with tcp. A Unix stream socket
//! stays beside them for the handshake, for wake-ups (one byte, only to a
//! peer that declared it sleeps: `Connection::arm_wait`) and for departure:
//! the kernel reports a crashed peer as end-of-stream, which a ring cannot
//! tell from a quiet writer. While both sides are busy, messages move
//! without a system call (the socket replaced them one `sendmsg`/`recv` per
//! message: ~27% of a busy daemon's CPU was kernel time, 2026-11-26).
//!
//! A host that sleeps on many links at once subscribes them to its
//! domain's [`Doorbell`] (`Connection::subscribe_doorbell`): a pending
//! bitmap and one sleep word in the registry head, and one eventfd passed
//! to each peer with the hello (`SCM_RIGHTS`), so that a wake-up costs one
//! eventfd write and read instead of a byte through each link's socket
//! (10,945 one-byte `recv`s against 2,122 context switches in 2 s of a
//! daemon at 1 M tasks/s, 2026-11-29). The protocol and its argument:
//! `shm_ring::doorbell`.

use std::collections::VecDeque;
use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use memmap2::{MmapOptions, MmapRaw};

use super::registry::Registry;
use super::shm_ring::doorbell::{self as bell, SharedBell, BELL_BITS};
use super::shm_ring::{self, ring_capacity, BellMap, HeaderView, RingConsumer, RingProducer, Ringer, RING_HEADER_LEN};
use super::stream::{drain_completions, messages_through_stream, registry_domain_methods, ByteIo, Stream, StreamConfig};
use super::tcp::wait_readable;
use super::{Completion, Connection, Domain, Error, ErrorKind, Listener, ReadOp, Registration};
use crate::mem::{Access, KeyTable, ReadOnlyMapping, Region, KEY_NAME_LEN};
use crate::time::Duration;

mod watch;
pub use watch::{DoorbellWatch, DOORBELL_TOKEN};

/// Connection liveness words per domain.
const MAX_CONNS: usize = 1024;
/// The key table starts here in the registry file.
const TABLE_OFFSET: usize = 8192;
/// Version 2: with the doorbell.
const REGISTRY_MAGIC: u64 = u64::from_le_bytes(*b"SYMPSHR2");
/// First word of a hello (version 2: with the ring file).
const HELLO_MAGIC: u64 = u64::from_le_bytes(*b"SYMPSHM2");
/// The acknowledgement that the peer's ring is mapped (its file may go).
const RING_MAPPED: u8 = 0xa5;
/// The same, and the peer's doorbell eventfd arrived: its rings may be
/// subscribed to it.
const RING_MAPPED_BELL: u8 = 0xa6;

/// Head of a registry file (all atomics: shared between processes).
#[repr(C)]
struct RegistryHead {
    magic: AtomicU64,
    owner_alive: AtomicU32,
    key_capacity: AtomicU32,
    /// Odd = open, even = closed; bumped on each open and close.
    conn_words: [AtomicU32; MAX_CONNS],
    /// The domain's doorbell: one bit per connection slot.
    bell: SharedBell,
}

const _: () = assert!(std::mem::size_of::<RegistryHead>() <= TABLE_OFFSET);
const _: () = assert!(MAX_CONNS <= BELL_BITS);
/// Where the doorbell lies in a registry file.
const BELL_OFFSET: usize = std::mem::offset_of!(RegistryHead, bell);

/// A mapped registry head (ours or a peer's).
struct HeadMap {
    map: MmapRaw,
}

impl HeadMap {
    fn head(&self) -> &RegistryHead {
        // SAFETY: the mapping is at least TABLE_OFFSET bytes (checked at
        // creation), page aligned, lives as long as `self`, and every field
        // of RegistryHead is an atomic for which zeroed bytes are valid.
        unsafe { &*(self.map.as_ptr() as *const RegistryHead) }
    }
}

/// Tunables.
#[derive(Clone, Copy, Debug)]
pub struct ShmConfig {
    /// READs completed and not yet polled, per connection.
    pub max_outstanding_reads: usize,
    /// Longest READ.
    pub max_read_len: u32,
    /// Registrations per domain.
    pub key_capacity: u32,
    /// Bytes of each direction's control ring (rounded up to a power of
    /// two, at least 4 KiB; default 64 KiB, about what a Unix socket
    /// buffers of small messages). A message larger than what is free waits
    /// in the sender's queue (64 KiB); a full queue refuses sends
    /// (`QueueFull`): overload is refused, not queued for seconds.
    pub ring_bytes: usize,
}

impl Default for ShmConfig {
    fn default() -> Self {
        ShmConfig {
            max_outstanding_reads: 256,
            max_read_len: 16 << 20,
            key_capacity: 1024,
            ring_bytes: 64 << 10,
        }
    }
}

struct Inner {
    cfg: ShmConfig,
    registry: Arc<Registry>,
    head: HeadMap,
    path: PathBuf,
    conn_alloc: Mutex<()>,
    /// Our doorbell (a view of our registry head) and its eventfd.
    bell: BellMap,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.head.head().owner_alive.store(0, Ordering::SeqCst);
        self.registry.close_all();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A shared-memory transport domain.
#[derive(Clone)]
pub struct ShmDomain {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ShmDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmDomain")
            .field("registry", &self.inner.path)
            .finish()
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn registry_bytes(cap: u32) -> usize {
    TABLE_OFFSET + KeyTable::bytes_for(cap)
}

impl ShmDomain {
    /// A domain with default tunables.
    pub fn new() -> Result<Self, Error> {
        Self::with_config(ShmConfig::default())
    }

    /// A domain; creates its registry file under `/dev/shm`.
    pub fn with_config(cfg: ShmConfig) -> Result<Self, Error> {
        let cap = cfg.key_capacity.clamp(1, crate::mem::MAX_KEYS);
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let path = crate::mem::shm_file_path(&format!(
            "symphony-reg-{}-{}",
            std::process::id(),
            id
        ))?;
        let file = crate::mem::create_own_shm_file(&path)?;
        let len = registry_bytes(cap);
        let setup = || -> Result<(HeadMap, KeyTable, BellMap), Error> {
            file.set_len(len as u64)?;
            let head = HeadMap {
                map: MmapOptions::new().len(TABLE_OFFSET).map_raw(&file)?,
            };
            let table = KeyTable::in_mapping(
                MmapOptions::new().len(len).map_raw(&file)?,
                TABLE_OFFSET,
                cap,
            )?;
            // SAFETY: plain syscall; the result is checked before use.
            let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
            if fd < 0 {
                return Err(std::io::Error::last_os_error().into());
            }
            // SAFETY: `fd` is a fresh descriptor we own.
            let fd = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
            let view = MmapOptions::new().len(TABLE_OFFSET).map_raw(&file)?;
            let bell = BellMap::new(view, BELL_OFFSET, fd).ok_or(Error::Unsupported("doorbell layout"))?;
            Ok((head, table, bell))
        };
        let (head, table, bell) = match setup() {
            Ok(x) => x,
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
        };
        let h = head.head();
        h.key_capacity.store(cap, Ordering::Relaxed);
        h.owner_alive.store(1, Ordering::Relaxed);
        h.magic.store(REGISTRY_MAGIC, Ordering::SeqCst);
        let registry = Arc::new(Registry::new(table));
        Ok(ShmDomain {
            inner: Arc::new(Inner {
                cfg,
                registry,
                head,
                path,
                conn_alloc: Mutex::new(()),
                bell,
            }),
        })
    }

    /// Claims a liveness word: returns (slot, open word value).
    fn open_conn_word(&self) -> Result<(u32, u32), Error> {
        let _g = self
            .inner
            .conn_alloc
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let h = self.inner.head.head();
        for (i, w) in h.conn_words.iter().enumerate() {
            let v = w.load(Ordering::SeqCst);
            if v % 2 == 0 {
                w.store(v.wrapping_add(1), Ordering::SeqCst);
                return Ok((i as u32, v.wrapping_add(1)));
            }
        }
        Err(Error::QueueFull)
    }

    fn close_conn_word(&self, slot: u32, word: u32) {
        let h = self.inner.head.head();
        if let Some(w) = h.conn_words.get(slot as usize) {
            let _ = w.compare_exchange(
                word,
                word.wrapping_add(1),
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
        }
    }

    /// Handshake over a fresh control socket, then the connection.
    fn establish(&self, mut sock: UnixStream, timeout: Duration) -> Result<ShmConn, Error> {
        let t = std::time::Duration::from_nanos(timeout.as_nanos().max(1_000_000));
        sock.set_read_timeout(Some(t))?;
        sock.set_write_timeout(Some(t))?;
        let (slot, word) = self.open_conn_word()?;
        let ring = match OwnRing::create(self.inner.cfg.ring_bytes) {
            Ok(r) => r,
            Err(e) => {
                self.close_conn_word(slot, word);
                return Err(e);
            }
        };
        let result = (|| {
            let mut hello = [0u8; HELLO_LEN];
            hello[..8].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
            hello[8..12].copy_from_slice(&slot.to_le_bytes());
            hello[12..16].copy_from_slice(&word.to_le_bytes());
            let p = self.inner.path.as_os_str().as_encoded_bytes();
            let rp = ring.path.as_os_str().as_encoded_bytes();
            if p.len() > KEY_NAME_LEN || rp.len() > KEY_NAME_LEN {
                return Err(Error::Unsupported("registry or ring path too long"));
            }
            hello[16..16 + p.len()].copy_from_slice(p);
            hello[RING_NAME_AT..RING_NAME_AT + rp.len()].copy_from_slice(rp);
            // Our doorbell's eventfd travels with the hello.
            send_with_fd(sock.as_raw_fd(), &hello, self.inner.bell.fd().as_raw_fd())?;
            let mut peer = [0u8; HELLO_LEN];
            let peer_bell_fd = recv_exact_with_fd(sock.as_raw_fd(), &mut peer)?;
            let (registry, peer_head) = PeerRegistry::open(&peer)?;
            let (rx, rx_view) = open_peer_ring(&peer)?;
            // Both rings mapped on both sides: the files may go (a crash
            // from here on leaves nothing in /dev/shm).
            sock.write_all(&[if peer_bell_fd.is_some() { RING_MAPPED_BELL } else { RING_MAPPED }])?;
            let mut ack = [0u8; 1];
            sock.read_exact(&mut ack)?;
            if ack[0] != RING_MAPPED && ack[0] != RING_MAPPED_BELL {
                return Err(Error::Protocol(crate::wire::WireError::BadValue("ring acknowledgement")));
            }
            let bell = Bell { peer_head, peer_fd: peer_bell_fd, peer_rings_ours: ack[0] == RING_MAPPED_BELL };
            Ok((registry, rx, rx_view, bell))
        })();
        let _ = std::fs::remove_file(&ring.path);
        let (peer, rx, rx_view, bell) = match result {
            Ok(p) => p,
            Err(e) => {
                self.close_conn_word(slot, word);
                return Err(e);
            }
        };
        sock.set_read_timeout(None)?;
        let fd = OwnedFd::from(sock);
        let mut producer = ring.producer;
        // The peer's doorbell, rung for its slot, if it passed an eventfd
        // (else its ring wakes it through the socket only).
        if let Some(bell_fd) = bell.peer_fd {
            let ringer = BellMap::new(bell.peer_head.map, BELL_OFFSET, Arc::new(bell_fd))
                .and_then(|m| Ringer::new(m, peer.slot));
            if let Some(r) = ringer {
                producer.set_bell(r);
            }
        }
        let io = ByteIo::ring(fd.as_raw_fd(), producer, rx);
        let cfg = &self.inner.cfg;
        let scfg = StreamConfig {
            max_outstanding: cfg.max_outstanding_reads.max(1),
            max_read_len: cfg.max_read_len,
            read_timeout: std::time::Duration::MAX,
            serve_reads: false,
        };
        let max = cfg.max_outstanding_reads.max(1);
        Ok(ShmConn {
            stream: Stream::new(fd, io, self.inner.registry.clone(), scfg),
            peer,
            done: VecDeque::with_capacity(max),
            max_outstanding: max,
            my_slot: slot,
            my_word: word,
            domain: self.clone(),
            rx_view,
            subscribed: AtomicBool::new(false),
            doorbell: bell.peer_rings_ours.then(|| Doorbell { inner: self.inner.clone() }),
        })
    }
}

/// What the handshake learnt about the doorbells: the peer's registry
/// head and eventfd (for ringing its doorbell), and whether the peer holds
/// ours (else our incoming ring may not be subscribed: nothing would ring).
struct Bell {
    peer_head: HeadMap,
    peer_fd: Option<OwnedFd>,
    peer_rings_ours: bool,
}

/// This side's outgoing ring, in a fresh shared-memory file.
struct OwnRing {
    path: PathBuf,
    producer: RingProducer,
}

impl OwnRing {
    fn create(bytes: usize) -> Result<Self, Error> {
        let cap = ring_capacity(bytes);
        let path = crate::mem::shm_file_path(&format!(
            "symphony-ring-{}-{}",
            std::process::id(),
            NEXT_ID.fetch_add(1, Ordering::Relaxed)
        ))?;
        let file = crate::mem::create_own_shm_file(&path)?;
        let len = RING_HEADER_LEN + cap;
        let made = (|| -> Result<RingProducer, Error> {
            file.set_len(len as u64)?;
            let map = MmapOptions::new().len(len).map_raw(&file)?;
            shm_ring::init_producer(map, cap)
                .map_err(|_| Error::Unsupported("shm ring layout"))
        })();
        match made {
            Ok(producer) => Ok(OwnRing { path, producer }),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                Err(e)
            }
        }
    }
}

/// Maps the ring the peer named in its hello (its outgoing, our incoming),
/// and a second view of its header (for a doorbell subscription).
fn open_peer_ring(hello: &[u8; HELLO_LEN]) -> Result<(RingConsumer, HeaderView), Error> {
    let name = &hello[RING_NAME_AT..];
    let n = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    let path = std::str::from_utf8(&name[..n])
        .map_err(|_| Error::Protocol(crate::wire::WireError::BadValue("ring path")))?;
    if !crate::mem::is_own_shm_file(path, "symphony-ring-") {
        return Err(Error::Protocol(crate::wire::WireError::BadValue("ring path")));
    }
    let file = OpenOptions::new().read(true).write(true).open(path)?;
    let len = file.metadata()?.len() as usize;
    if !(RING_HEADER_LEN + shm_ring::MIN_RING_BYTES..=RING_HEADER_LEN + shm_ring::MAX_RING_BYTES).contains(&len) {
        return Err(Error::Protocol(crate::wire::WireError::BadLength));
    }
    let map = MmapOptions::new().len(len).map_raw(&file)?;
    let bad = || Error::Protocol(crate::wire::WireError::BadValue("ring header"));
    let consumer = shm_ring::open_consumer(map).map_err(|_| bad())?;
    let view = HeaderView::new(MmapOptions::new().len(RING_HEADER_LEN).map_raw(&file)?).ok_or_else(bad)?;
    Ok((consumer, view))
}

/// Sends `bytes` on the stream socket `sock` with `fd` attached
/// (`SCM_RIGHTS`, on the first byte).
fn send_with_fd(sock: RawFd, bytes: &[u8], fd: RawFd) -> Result<(), Error> {
    let mut space = [0u64; 4];
    // SAFETY: CMSG_SPACE is a pure size computation.
    let cmsg_len = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    debug_assert!(cmsg_len <= std::mem::size_of_val(&space));
    let mut iov = libc::iovec { iov_base: bytes.as_ptr() as *mut libc::c_void, iov_len: bytes.len() };
    // SAFETY: an all-zero msghdr is valid (null pointers, zero lengths).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = space.as_mut_ptr().cast();
    msg.msg_controllen = cmsg_len as _;
    // SAFETY: the control buffer holds one cmsg with room for one fd
    // (CMSG_SPACE above, 8-byte aligned); CMSG_FIRSTHDR is then non-null.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut RawFd, fd);
    }
    // SAFETY: `msg` points at live buffers described above.
    let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // The fd went with the first byte; the rest (a short send) goes plain.
    let mut rest = &bytes[n as usize..];
    while !rest.is_empty() {
        // SAFETY: `rest` is a live slice of its length.
        let k = unsafe { libc::send(sock, rest.as_ptr().cast(), rest.len(), libc::MSG_NOSIGNAL) };
        if k <= 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        rest = &rest[k as usize..];
    }
    Ok(())
}

/// Fills `buf` from the stream socket `sock` (its receive timeout
/// bounds each wait) and returns the eventfd the peer attached, if it
/// attached one: any other kind of descriptor is closed and ignored, so a
/// peer cannot make us write to a pipe or file of its choosing.
fn recv_exact_with_fd(sock: RawFd, buf: &mut [u8]) -> Result<Option<OwnedFd>, Error> {
    let mut got = 0;
    let mut passed: Option<OwnedFd> = None;
    while got < buf.len() {
        let mut space = [0u64; 4];
        let mut iov = libc::iovec { iov_base: buf[got..].as_mut_ptr().cast(), iov_len: buf.len() - got };
        // SAFETY: an all-zero msghdr is valid.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = space.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&space) as _;
        // SAFETY: `msg` describes live buffers; descriptors arrive
        // close-on-exec; any that do not fit are closed by the kernel.
        let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e.into());
        }
        if n == 0 {
            return Err(Error::PeerDisconnected);
        }
        got += n as usize;
        // SAFETY: walks the control messages the kernel wrote into
        // `space` (CMSG_* stay inside msg_controllen).
        let mut c = unsafe { libc::CMSG_FIRSTHDR(&msg) };
        while !c.is_null() {
            // SAFETY: `c` is a header inside the control buffer.
            let (level, kind, len) = unsafe { ((*c).cmsg_level, (*c).cmsg_type, (*c).cmsg_len as usize) };
            if level == libc::SOL_SOCKET && kind == libc::SCM_RIGHTS {
                // SAFETY: CMSG_LEN(0) is a pure size computation.
                let data = len.saturating_sub(unsafe { libc::CMSG_LEN(0) } as usize);
                for i in 0..data / std::mem::size_of::<RawFd>() {
                    // SAFETY: the i-th fd lies inside this cmsg's data.
                    let raw = unsafe { std::ptr::read_unaligned((libc::CMSG_DATA(c) as *const RawFd).add(i)) };
                    // SAFETY: the kernel installed `raw` for us: we own it.
                    let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                    if passed.is_none() && is_eventfd(&owned) {
                        passed = Some(owned);
                    }
                }
            }
            // SAFETY: steps to the next header or null, within the buffer.
            c = unsafe { libc::CMSG_NXTHDR(&msg, c) };
        }
    }
    Ok(passed)
}

/// Whether `fd` is an eventfd (made nonblocking here: a wake never
/// blocks the producer).
fn is_eventfd(fd: &OwnedFd) -> bool {
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()));
    if !link.is_ok_and(|l| l.as_os_str() == "anon_inode:[eventfd]") {
        return false;
    }
    // SAFETY: plain fcntl calls on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        flags >= 0 && libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
    }
}

/// The hello: magic, liveness slot and word, registry path, ring path.
const RING_NAME_AT: usize = 16 + KEY_NAME_LEN;
const HELLO_LEN: usize = RING_NAME_AT + KEY_NAME_LEN;

/// A peer's registry, mapped read-write (for the in-flight counters), plus
/// read-only mappings of its region files, opened on first use.
struct PeerRegistry {
    head: HeadMap,
    table: KeyTable,
    slot: u32,
    word: u32,
    maps: Vec<Option<(u32, ReadOnlyMapping)>>,
}

impl PeerRegistry {
    /// The peer's registry and a second view of its head (for its doorbell).
    fn open(hello: &[u8; HELLO_LEN]) -> Result<(Self, HeadMap), Error> {
        let u64_at = |i: usize| u64::from_le_bytes(hello[i..i + 8].try_into().unwrap_or([0; 8]));
        let u32_at = |i: usize| u32::from_le_bytes(hello[i..i + 4].try_into().unwrap_or([0; 4]));
        if u64_at(0) != HELLO_MAGIC {
            return Err(Error::Protocol(crate::wire::WireError::BadMagic));
        }
        let (slot, word) = (u32_at(8), u32_at(12));
        if slot as usize >= MAX_CONNS {
            return Err(Error::Protocol(crate::wire::WireError::BadValue(
                "connection slot",
            )));
        }
        let name = &hello[16..RING_NAME_AT];
        let n = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        let path = std::str::from_utf8(&name[..n])
            .map_err(|_| Error::Protocol(crate::wire::WireError::BadValue("path")))?;
        if !crate::mem::is_own_shm_file(path, "symphony-reg-") {
            return Err(Error::Protocol(crate::wire::WireError::BadValue("path")));
        }
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let len = file.metadata()?.len() as usize;
        if len < TABLE_OFFSET {
            return Err(Error::Protocol(crate::wire::WireError::BadLength));
        }
        let head = HeadMap {
            map: MmapOptions::new().len(TABLE_OFFSET).map_raw(&file)?,
        };
        let h = head.head();
        if h.magic.load(Ordering::SeqCst) != REGISTRY_MAGIC {
            return Err(Error::Protocol(crate::wire::WireError::BadMagic));
        }
        let cap = h.key_capacity.load(Ordering::SeqCst);
        if cap == 0 || cap > crate::mem::MAX_KEYS || registry_bytes(cap) > len {
            return Err(Error::Protocol(crate::wire::WireError::BadLength));
        }
        let table = KeyTable::in_mapping(
            MmapOptions::new().len(len).map_raw(&file)?,
            TABLE_OFFSET,
            cap,
        )?;
        let maps = (0..cap).map(|_| None).collect();
        let bell_view = HeadMap {
            map: MmapOptions::new().len(TABLE_OFFSET).map_raw(&file)?,
        };
        Ok((
            PeerRegistry {
                head,
                table,
                slot,
                word,
                maps,
            },
            bell_view,
        ))
    }

    fn alive(&self) -> bool {
        let h = self.head.head();
        h.owner_alive.load(Ordering::SeqCst) == 1
            && h.conn_words[self.slot as usize].load(Ordering::SeqCst) == self.word
    }

    /// Copies the peer's `[offset, offset+len)` under `key` to `dest`.
    fn read(&mut self, key: u32, offset: u64, len: u32, dest: *mut u8) -> Result<(), ErrorKind> {
        if !self.alive() {
            return Err(ErrorKind::PeerDisconnected);
        }
        let token = self
            .table
            .acquire(key, offset, len as u64, Access::REMOTE_READ)
            .map_err(|e| Error::from(e).kind())?;
        let r = self.copy(key, offset, len, dest);
        self.table.release(token);
        r
    }

    fn copy(&mut self, key: u32, offset: u64, len: u32, dest: *mut u8) -> Result<(), ErrorKind> {
        let index = key & 0xffff;
        let generation = key >> 16;
        let cached =
            matches!(self.maps.get(index as usize), Some(Some((g, _))) if *g == generation);
        if !cached {
            // First READ of this registration: map its file (cold path).
            let mut name = [0u8; KEY_NAME_LEN];
            let n = self.table.name(index, &mut name);
            let path = std::str::from_utf8(&name[..n]).map_err(|_| ErrorKind::BadKey)?;
            if !crate::mem::is_own_shm_file(path, "symphony-") {
                return Err(ErrorKind::BadKey);
            }
            let m = ReadOnlyMapping::open(std::path::Path::new(path))
                .map_err(|_| ErrorKind::Deregistered)?;
            let slot = self.maps.get_mut(index as usize).ok_or(ErrorKind::BadKey)?;
            *slot = Some((generation, m));
        }
        let Some(Some((_, m))) = self.maps.get(index as usize) else {
            return Err(ErrorKind::BadKey);
        };
        // SAFETY: `dest` is valid for `len` bytes: it was acquired from our
        // own registry with LOCAL_WRITE for exactly this length.
        unsafe { m.read_to_ptr(offset, dest, len as usize) }.map_err(|_| ErrorKind::OutOfBounds)
    }
}

impl Domain for ShmDomain {
    type Conn = ShmConn;
    type Listener = ShmListener;

    fn kind(&self) -> &'static str {
        "shm"
    }

    fn listen(&self, addr: &str) -> Result<ShmListener, Error> {
        let name = if addr.is_empty() {
            format!(
                "@symphony-shm-{}-{}",
                std::process::id(),
                NEXT_ID.fetch_add(1, Ordering::Relaxed)
            )
        } else {
            addr.to_string()
        };
        let (listener, unlink) = if let Some(abs) = name.strip_prefix('@') {
            (
                UnixListener::bind_addr(&SocketAddr::from_abstract_name(abs.as_bytes())?)?,
                None,
            )
        } else {
            (UnixListener::bind(&name)?, Some(PathBuf::from(&name)))
        };
        listener.set_nonblocking(true)?;
        Ok(ShmListener {
            listener,
            name,
            unlink,
            domain: self.clone(),
        })
    }

    fn connect(&self, addr: &str, timeout: Duration) -> Result<ShmConn, Error> {
        let sock = if let Some(abs) = addr.strip_prefix('@') {
            UnixStream::connect_addr(&SocketAddr::from_abstract_name(abs.as_bytes())?)?
        } else {
            UnixStream::connect(addr)?
        };
        self.establish(sock, timeout)
    }

    fn register(&self, region: &Arc<Region>, access: Access) -> Result<Registration, Error> {
        let name = match region.shm_path() {
            Some(p) => p.as_os_str().as_encoded_bytes(),
            None if !access.contains(Access::REMOTE_READ) => &[][..],
            None => {
                return Err(Error::Unsupported(
                    "shm remote READ needs a shared-memory-file region (Region::shared)",
                ))
            }
        };
        self.inner.registry.register(region, access, name)
    }

    registry_domain_methods!();
}

/// Accepts shm connections on a Unix socket.
pub struct ShmListener {
    listener: UnixListener,
    name: String,
    unlink: Option<PathBuf>,
    domain: ShmDomain,
}

impl Drop for ShmListener {
    fn drop(&mut self) {
        if let Some(p) = &self.unlink {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Listener for ShmListener {
    type Conn = ShmConn;

    fn local_addr(&self) -> String {
        self.name.clone()
    }

    fn accept(&mut self, timeout: Duration) -> Result<ShmConn, Error> {
        let deadline =
            std::time::Instant::now() + std::time::Duration::from_nanos(timeout.as_nanos());
        loop {
            match self.listener.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(false)?;
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    return self
                        .domain
                        .establish(s, Duration::from_nanos(left.as_nanos() as u64));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e.into()),
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout);
            }
            // Sleep in the kernel until a peer connects: polling with short
            // naps cost an idle daemon's acceptor ~5% of a core.
            wait_readable(std::os::fd::AsRawFd::as_raw_fd(&self.listener), left);
        }
    }
}

/// An shm connection.
pub struct ShmConn {
    stream: Stream,
    peer: PeerRegistry,
    done: VecDeque<Completion>,
    max_outstanding: usize,
    my_slot: u32,
    my_word: u32,
    domain: ShmDomain,
    /// The incoming ring's header, for the doorbell subscription.
    rx_view: HeaderView,
    /// The incoming ring is subscribed to our doorbell: a sleep needs no
    /// arming of the ring (the host arms the doorbell).
    subscribed: AtomicBool,
    /// Our domain's doorbell, if the peer holds its eventfd.
    doorbell: Option<Doorbell>,
}

impl std::fmt::Debug for ShmConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmConn")
            .field("slot", &self.my_slot)
            .finish()
    }
}

impl Drop for ShmConn {
    fn drop(&mut self) {
        self.domain.close_conn_word(self.my_slot, self.my_word);
        self.stream.close();
    }
}

impl Connection for ShmConn {
    messages_through_stream!();
    fn post_read(&mut self, op: &ReadOp) -> Result<(), Error> {
        if !self.stream.is_connected() || !self.peer.alive() {
            return Err(Error::PeerDisconnected);
        }
        if self.done.len() >= self.max_outstanding {
            return Err(Error::QueueFull);
        }
        let len = op.remote.len;
        if len > self.domain.inner.cfg.max_read_len {
            return Err(Error::TooLarge);
        }
        if op.local.len < len {
            return Err(Error::OutOfBounds);
        }
        let reg = &self.domain.inner.registry;
        let (token, dest) = reg.acquire(op.local.key, op.local.offset, len, Access::LOCAL_WRITE)?;
        let status = self.peer.read(op.remote.key, op.remote.offset, len, dest);
        reg.release(token);
        let bytes = if status.is_ok() { len } else { 0 };
        self.done.push_back(Completion {
            wr_id: op.wr_id,
            status,
            bytes,
        });
        Ok(())
    }
    fn poll_completions(&mut self, out: &mut [Completion]) -> Result<usize, Error> {
        // READs complete inside post_read; no socket work here, so polling
        // costs no syscall. Departure is seen through the liveness words.
        Ok(drain_completions(&mut self.done, out))
    }
    fn progress(&mut self) -> Result<(), Error> {
        self.stream.progress()
    }
    fn outstanding_reads(&self) -> usize {
        self.done.len()
    }
    fn max_outstanding_reads(&self) -> usize {
        self.max_outstanding
    }
    fn is_connected(&self) -> bool {
        self.stream.is_connected() && self.peer.alive()
    }
    fn wait(&mut self, timeout: Duration) -> Result<bool, Error> {
        // READs complete inside post_read: only the control stream can
        // bring work (messages, the peer's departure). The stream arms the
        // ring before it sleeps.
        if !self.done.is_empty() {
            return Ok(true);
        }
        let t = std::time::Duration::from_nanos(timeout.as_nanos());
        self.stream.wait(t).map(|()| true)
    }
    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        // READs complete inside post_read; the control stream is the only
        // source of work.
        Some(self.stream.wait_fd())
    }
    fn may_hold_input(&self) -> bool {
        // Includes the incoming ring: one load of the peer's index.
        self.stream.may_hold_input()
    }
    fn send_progress(&self) -> Option<super::SendProgress> {
        Some(self.stream.send_progress())
    }
    fn arm_wait(&self) -> bool {
        if self.subscribed.load(Ordering::Relaxed) {
            // The peer rings our doorbell after each publish: nothing to
            // arm here (no fence, no flag); the host arms the doorbell.
            return !self.stream.may_hold_input();
        }
        self.stream.arm_wait()
    }
    fn doorbell(&self) -> Option<&Doorbell> {
        self.doorbell.as_ref()
    }
    fn subscribe_doorbell(&self) -> Option<u32> {
        self.doorbell.as_ref()?;
        if !self.subscribed.swap(true, Ordering::Relaxed) {
            self.rx_view.subscribe();
        }
        Some(self.my_slot)
    }
}

/// A domain's doorbell as its host sees it (see the module docs and
/// `shm_ring::doorbell`): the links subscribed to it
/// ([`Connection::subscribe_doorbell`]) are woken through one eventfd and
/// flagged in one bitmap. Cheap to clone; keeps its domain's registry.
#[derive(Clone)]
pub struct Doorbell {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Doorbell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Doorbell").field("registry", &self.inner.path).finish()
    }
}

impl Doorbell {
    /// The eventfd to sleep on (readable after a producer woke us).
    pub fn fd(&self) -> RawFd {
        self.inner.bell.fd().as_raw_fd()
    }

    /// Whether `other` is this same doorbell.
    pub fn same(&self, other: &Doorbell) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Before sleeping on [`fd`](Self::fd): false if a subscribed link was
    /// flagged meanwhile (take them instead of sleeping).
    pub fn arm(&self) -> bool {
        bell::arm(&self.inner.bell)
    }

    /// After the sleep: producers need not wake us any more.
    pub fn disarm(&self) {
        bell::disarm(&self.inner.bell)
    }

    /// Calls `flagged` with the slot (the link's
    /// [`subscribe_doorbell`](Connection::subscribe_doorbell) value) of
    /// each link whose peer published since the last call; returns how
    /// many. A hostile peer may flag any slot: callers ignore unknown ones.
    pub fn take_pending(&self, flagged: impl FnMut(u32)) -> usize {
        bell::take_pending(&self.inner.bell, flagged)
    }

    /// Resets the eventfd's readiness (after a wake-up it reported).
    pub fn clear(&self) {
        let mut count: u64 = 0;
        // SAFETY: reads 8 bytes into a valid u64 from our nonblocking
        // eventfd (EAGAIN is harmless).
        let _ = unsafe { libc::read(self.fd(), (&mut count as *mut u64).cast(), 8) };
    }
}
