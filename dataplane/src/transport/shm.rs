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

use std::collections::VecDeque;
use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use memmap2::{MmapOptions, MmapRaw};

use super::registry::Registry;
use super::shm_ring::{self, ring_capacity, RingConsumer, RingProducer, RING_HEADER_LEN};
use super::stream::{drain_completions, messages_through_stream, registry_domain_methods, ByteIo, Stream, StreamConfig};
use super::tcp::wait_readable;
use super::{Completion, Connection, Domain, Error, ErrorKind, Listener, ReadOp, Registration};
use crate::mem::{Access, KeyTable, ReadOnlyMapping, Region, KEY_NAME_LEN};
use crate::time::Duration;

/// Connection liveness words per domain.
const MAX_CONNS: usize = 1024;
/// The key table starts here in the registry file.
const TABLE_OFFSET: usize = 8192;
const REGISTRY_MAGIC: u64 = u64::from_le_bytes(*b"SYMPSHM1");
/// First word of a hello (version 2: with the ring file).
const HELLO_MAGIC: u64 = u64::from_le_bytes(*b"SYMPSHM2");
/// The acknowledgement that the peer's ring is mapped (its file may go).
const RING_MAPPED: u8 = 0xa5;

/// Head of a registry file (all atomics: shared between processes).
#[repr(C)]
struct RegistryHead {
    magic: AtomicU64,
    owner_alive: AtomicU32,
    key_capacity: AtomicU32,
    /// Odd = open, even = closed; bumped on each open and close.
    conn_words: [AtomicU32; MAX_CONNS],
}

const _: () = assert!(std::mem::size_of::<RegistryHead>() <= TABLE_OFFSET);

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
        let setup = || -> Result<(HeadMap, KeyTable), Error> {
            file.set_len(len as u64)?;
            let head = HeadMap {
                map: MmapOptions::new().len(TABLE_OFFSET).map_raw(&file)?,
            };
            let table = KeyTable::in_mapping(
                MmapOptions::new().len(len).map_raw(&file)?,
                TABLE_OFFSET,
                cap,
            )?;
            Ok((head, table))
        };
        let (head, table) = match setup() {
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
            sock.write_all(&hello)?;
            let mut peer = [0u8; HELLO_LEN];
            sock.read_exact(&mut peer)?;
            let registry = PeerRegistry::open(&peer)?;
            let rx = open_peer_ring(&peer)?;
            // Both rings mapped on both sides: the files may go (a crash
            // from here on leaves nothing in /dev/shm).
            sock.write_all(&[RING_MAPPED])?;
            let mut ack = [0u8; 1];
            sock.read_exact(&mut ack)?;
            if ack[0] != RING_MAPPED {
                return Err(Error::Protocol(crate::wire::WireError::BadValue("ring acknowledgement")));
            }
            Ok((registry, rx))
        })();
        let _ = std::fs::remove_file(&ring.path);
        let (peer, rx) = match result {
            Ok(p) => p,
            Err(e) => {
                self.close_conn_word(slot, word);
                return Err(e);
            }
        };
        sock.set_read_timeout(None)?;
        let fd = OwnedFd::from(sock);
        let io = ByteIo::ring(std::os::fd::AsRawFd::as_raw_fd(&fd), ring.producer, rx);
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
        })
    }
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

/// Maps the ring the peer named in its hello (its outgoing, our incoming).
fn open_peer_ring(hello: &[u8; HELLO_LEN]) -> Result<RingConsumer, Error> {
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
    shm_ring::open_consumer(map).map_err(|_| Error::Protocol(crate::wire::WireError::BadValue("ring header")))
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
    fn open(hello: &[u8; HELLO_LEN]) -> Result<Self, Error> {
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
        Ok(PeerRegistry {
            head,
            table,
            slot,
            word,
            maps,
        })
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
        self.stream.arm_wait()
    }
}
