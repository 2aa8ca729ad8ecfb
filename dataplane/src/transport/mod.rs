//! One transport trait family, three implementations: `shm` (same host),
//! `tcp` (io_uring, plus a blocking std::net baseline) and `rdma`
//! (feature `rdma`, real verbs).
//!
//! The shape follows RDMA verbs so that the verbs implementation is a thin
//! layer and the software ones behave the same way:
//! - a [`Domain`] is one process's transport context (a verbs protection
//!   domain): it registers memory and makes connections;
//! - a [`Connection`] (a queue pair) carries two-sided control messages
//!   ([`Connection::send`], [`Connection::try_recv`], whole wire messages)
//!   and one-sided READs ([`Connection::post_read`] /
//!   [`Connection::post_reads`]) whose results arrive as [`Completion`]s from
//!   [`Connection::poll_completions`];
//! - READs name remote memory by [`RemoteRef`] `{key, offset, len}` created
//!   by the owner's [`Registration::remote_ref`], and land in local
//!   registered memory named by a [`LocalRef`].
//!
//! Everything is polled: no call blocks on the data path and no transport
//! starts a thread behind the caller's back. Memory owners must keep polling
//! their connections (any of `progress`, `try_recv`, `poll_completions`):
//! for tcp that is what serves peers' READs (see `tcp` for why).
//!
//! Contract of a READ: `post_read` returns `Err` only when it did not accept
//! the operation (queue full, connection known dead, local buffer invalid,
//! too long); then no completion will come. Once accepted, exactly one
//! completion with its `wr_id` comes, successful or carrying the error
//! (bad key, out of bounds, deregistered, peer disconnected, timeout). While
//! a READ is outstanding its landing bytes belong to the transport.

use std::io;
use std::sync::Arc;

pub use crate::mem::{Access, LocalRef, Region, RemoteRef};
use crate::time::Duration;
use crate::wire::WireError;

pub mod conformance;
#[doc(hidden)]
pub mod fuzz;
mod registry;
pub mod shm;
mod shm_ring;
pub mod sim;
mod stream;
pub mod tcp;

// The verbs implementation lives in `rdma.rs` (written separately, feature
// `rdma`); it implements the traits below and runs `conformance` unchanged.
#[cfg(feature = "rdma")]
pub mod rdma;

/// Caller-chosen id of a work request, returned in its [`Completion`].
pub type WrId = u64;

/// Links this process closed because the peer sent bytes that are not the
/// protocol (a bad frame, a READ before the owner allowed it, a broken
/// shm ring). A relaxed counter: daemons export it as a metric.
static BAD_BYTES_LINKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// See [`BAD_BYTES_LINKS`]: how many links this process has closed for
/// malformed input from the peer, since it started.
pub fn links_closed_on_bad_bytes() -> u64 {
    BAD_BYTES_LINKS.load(std::sync::atomic::Ordering::Relaxed)
}

pub(crate) fn count_bad_bytes_link() {
    BAD_BYTES_LINKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// Error classes, small and `Copy` so that completions can carry them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The key names no live registration at its owner.
    BadKey,
    /// The access falls outside the registration.
    OutOfBounds,
    /// The registration is closing or gone.
    Deregistered,
    /// The registration does not grant this access.
    AccessDenied,
    /// The peer went away (closed, crashed, reset).
    PeerDisconnected,
    /// No answer within the transport's bound.
    Timeout,
    /// Refused for now (deregistration with accesses in flight): retry.
    Busy,
    /// Send queue or outstanding-READ limit reached: poll, then retry.
    QueueFull,
    /// Longer than the transport or message format allows.
    TooLarge,
    /// The caller's buffer is too small.
    BufferTooSmall,
    /// The peer sent bytes that break the protocol.
    Protocol,
    /// Not available here (e.g. io_uring disabled, wrong region kind).
    Unsupported,
    /// Another OS-level failure.
    Io,
}

/// Transport errors.
#[derive(Debug)]
pub enum Error {
    /// See [`ErrorKind::BadKey`].
    BadKey,
    /// See [`ErrorKind::OutOfBounds`].
    OutOfBounds,
    /// See [`ErrorKind::Deregistered`].
    Deregistered,
    /// See [`ErrorKind::AccessDenied`].
    AccessDenied,
    /// See [`ErrorKind::PeerDisconnected`].
    PeerDisconnected,
    /// See [`ErrorKind::Timeout`].
    Timeout,
    /// See [`ErrorKind::Busy`].
    Busy,
    /// See [`ErrorKind::QueueFull`].
    QueueFull,
    /// See [`ErrorKind::TooLarge`].
    TooLarge,
    /// The message needs `needed` bytes (it stays queued).
    BufferTooSmall {
        /// Bytes needed.
        needed: usize,
    },
    /// Malformed bytes from the peer.
    Protocol(WireError),
    /// Not available here, and why.
    Unsupported(&'static str),
    /// OS error.
    Io(io::Error),
}

impl Error {
    /// The error's class.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::BadKey => ErrorKind::BadKey,
            Error::OutOfBounds => ErrorKind::OutOfBounds,
            Error::Deregistered => ErrorKind::Deregistered,
            Error::AccessDenied => ErrorKind::AccessDenied,
            Error::PeerDisconnected => ErrorKind::PeerDisconnected,
            Error::Timeout => ErrorKind::Timeout,
            Error::Busy => ErrorKind::Busy,
            Error::QueueFull => ErrorKind::QueueFull,
            Error::TooLarge => ErrorKind::TooLarge,
            Error::BufferTooSmall { .. } => ErrorKind::BufferTooSmall,
            Error::Protocol(_) => ErrorKind::Protocol,
            Error::Unsupported(_) => ErrorKind::Unsupported,
            Error::Io(_) => ErrorKind::Io,
        }
    }
}

impl From<ErrorKind> for Error {
    fn from(k: ErrorKind) -> Self {
        match k {
            ErrorKind::BadKey => Error::BadKey,
            ErrorKind::OutOfBounds => Error::OutOfBounds,
            ErrorKind::Deregistered => Error::Deregistered,
            ErrorKind::AccessDenied => Error::AccessDenied,
            ErrorKind::PeerDisconnected => Error::PeerDisconnected,
            ErrorKind::Timeout => Error::Timeout,
            ErrorKind::Busy => Error::Busy,
            ErrorKind::QueueFull => Error::QueueFull,
            ErrorKind::TooLarge => Error::TooLarge,
            ErrorKind::BufferTooSmall => Error::BufferTooSmall { needed: 0 },
            ErrorKind::Protocol => Error::Protocol(WireError::BadLength),
            ErrorKind::Unsupported => Error::Unsupported("unsupported"),
            ErrorKind::Io => Error::Io(io::Error::other("transport io error")),
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::BufferTooSmall { needed } => {
                write!(f, "buffer too small: {needed} bytes needed")
            }
            Error::Protocol(e) => write!(f, "protocol error: {e}"),
            Error::Unsupported(why) => write!(f, "unsupported: {why}"),
            Error::Io(e) => write!(f, "io: {e}"),
            other => write!(f, "{:?}", other.kind()),
        }
    }
}

impl std::error::Error for Error {
    /// The malformed-bytes or OS error underneath (its text is also in
    /// this error's own message, for one-line logs).
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Protocol(e) => Some(e),
            Error::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::UnexpectedEof
            | io::ErrorKind::NotConnected => Error::PeerDisconnected,
            io::ErrorKind::TimedOut => Error::Timeout,
            _ => Error::Io(e),
        }
    }
}

impl From<WireError> for Error {
    fn from(e: WireError) -> Self {
        Error::Protocol(e)
    }
}

impl From<crate::mem::MemError> for Error {
    fn from(e: crate::mem::MemError) -> Self {
        use crate::mem::MemError as M;
        match e {
            M::BadKey => Error::BadKey,
            M::OutOfBounds => Error::OutOfBounds,
            M::Deregistered => Error::Deregistered,
            M::AccessDenied => Error::AccessDenied,
            M::Busy => Error::Busy,
            M::TableFull => Error::QueueFull,
            M::NotAllocated => Error::BadKey,
            M::Unsupported(w) => Error::Unsupported(w),
            M::Io(e) => Error::Io(e),
        }
    }
}

/// One one-sided READ: copy `remote.len` bytes from the peer's `remote` into
/// local registered memory at `local` (`local.len >= remote.len`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadOp {
    /// Returned in the completion.
    pub wr_id: WrId,
    /// What to read (from the peer's registration).
    pub remote: RemoteRef,
    /// Where the bytes land (a local registration with LOCAL_WRITE).
    pub local: LocalRef,
}

/// The result of one READ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The work request's id.
    pub wr_id: WrId,
    /// Success, or the error class.
    pub status: Result<(), ErrorKind>,
    /// Bytes landed (0 on error).
    pub bytes: u32,
}

impl Default for Completion {
    fn default() -> Self {
        Completion {
            wr_id: 0,
            status: Ok(()),
            bytes: 0,
        }
    }
}

/// A memory registration with one domain: the keys peers and the local
/// transport use, and the region it keeps alive. The local key names the
/// registration (landing buffers, deregistration); the remote key is what a
/// [`RemoteRef`] carries. They are equal for offset-addressed transports and
/// may differ for verbs (`lkey` / `rkey`).
#[derive(Debug, Clone)]
pub struct Registration {
    key: u32,
    remote_key: u32,
    region: Arc<Region>,
    access: Access,
    addr_base: u64,
}

impl Registration {
    /// For transport implementations: `key` names the registration, locally
    /// and for peers;
    /// `addr_base` is added to region offsets to form [`RemoteRef::offset`]
    /// and [`LocalRef::offset`] (0 for offset-addressed transports, the
    /// region's virtual address for verbs).
    pub fn new(key: u32, region: Arc<Region>, access: Access, addr_base: u64) -> Self {
        Self::with_keys(key, key, region, access, addr_base)
    }
    /// [`new`](Self::new) with a separate key for peers (`remote_key`, what
    /// [`remote_ref`](Self::remote_ref) hands out) and for local use
    /// (`local_key`, what [`local_ref`](Self::local_ref) and [`key`](Self::key) give).
    pub fn with_keys(
        local_key: u32,
        remote_key: u32,
        region: Arc<Region>,
        access: Access,
        addr_base: u64,
    ) -> Self {
        Registration {
            key: local_key,
            remote_key,
            region,
            access,
            addr_base,
        }
    }
    /// The local key (names the registration).
    pub fn key(&self) -> u32 {
        self.key
    }
    /// The key peers name in their READs ([`RemoteRef::key`]).
    pub fn remote_key(&self) -> u32 {
        self.remote_key
    }
    /// The registered region.
    pub fn region(&self) -> &Arc<Region> {
        &self.region
    }
    /// Granted access.
    pub fn access(&self) -> Access {
        self.access
    }
    /// What is added to region offsets to form transport offsets.
    pub fn addr_base(&self) -> u64 {
        self.addr_base
    }
    /// A reference a peer can READ: `len` bytes at region offset `offset`.
    pub fn remote_ref(&self, offset: u64, len: u32) -> Result<RemoteRef, Error> {
        if !self.access.contains(Access::REMOTE_READ) {
            return Err(Error::AccessDenied);
        }
        self.region.check(offset, len as usize)?;
        Ok(RemoteRef {
            key: self.remote_key,
            len,
            offset: self.addr_base + offset,
        })
    }
    /// A landing buffer for local READs: `len` bytes at region offset `offset`.
    pub fn local_ref(&self, offset: u64, len: u32) -> Result<LocalRef, Error> {
        if !self.access.contains(Access::LOCAL_WRITE) {
            return Err(Error::AccessDenied);
        }
        self.region.check(offset, len as usize)?;
        Ok(LocalRef {
            key: self.key,
            len,
            offset: self.addr_base + offset,
        })
    }
}

/// One process's transport context: registers memory, listens, connects.
/// Cheap to clone (a shared handle); connections keep it alive.
pub trait Domain: Clone + Send + Sync + 'static {
    /// Connection type.
    type Conn: Connection;
    /// Listener type.
    type Listener: Listener<Conn = Self::Conn>;

    /// Short name ("shm", "tcp-uring", "tcp-blocking", "rdma").
    fn kind(&self) -> &'static str;

    /// Listens on `addr` (transport-specific text: "127.0.0.1:0" for tcp,
    /// a Unix socket path or "@abstract" name for shm; "" picks a fresh one).
    fn listen(&self, addr: &str) -> Result<Self::Listener, Error>;

    /// Connects to a listener at `addr`, giving up after `timeout`.
    fn connect(&self, addr: &str, timeout: Duration) -> Result<Self::Conn, Error>;

    /// Registers `region` with `access`. REMOTE_READ exposes it to every
    /// peer of this domain that is given a [`RemoteRef`] into it.
    fn register(&self, region: &Arc<Region>, access: Access) -> Result<Registration, Error>;

    /// Deregisters. From the first call on, new accesses are refused; while
    /// accesses are in flight it returns [`Error::Busy`] and the caller
    /// retries (see [`deregister_within`]). After `Ok`, no transport
    /// touches the region again on behalf of this registration.
    fn deregister(&self, reg: &Registration) -> Result<(), Error>;

    /// Live registrations (for leak checks).
    fn registered_count(&self) -> usize;

    /// Longest single READ this domain accepts.
    fn max_read_len(&self) -> u32;
}

/// Accepts connections.
pub trait Listener: Send {
    /// Connection type.
    type Conn: Connection;
    /// The address peers pass to [`Domain::connect`].
    fn local_addr(&self) -> String;
    /// Waits up to `timeout` for one connection.
    fn accept(&mut self, timeout: Duration) -> Result<Self::Conn, Error>;
}

/// A connection to one peer (a queue pair). Used by one thread at a time;
/// every method returns promptly (busy-poll friendly). Once warm, none
/// allocates.
pub trait Connection: Send {
    /// Queues one encoded wire message (header included) in order. Returns
    /// `QueueFull` (nothing queued) when the send queue is full: poll and
    /// retry. Bytes leave during this call or later polling calls.
    fn send(&mut self, msg: &[u8]) -> Result<(), Error>;

    /// Like [`send`](Self::send), but the bytes may wait in the send queue
    /// until [`flush_batched`](Self::flush_batched) (or a `send`, or a
    /// `progress`), so that several messages to one peer leave in one
    /// system call. Transports without such a queue send at once.
    fn send_batched(&mut self, msg: &[u8]) -> Result<(), Error> {
        self.send(msg)
    }

    /// Starts sending what [`send_batched`](Self::send_batched) queued
    /// (nothing to do where it sent at once).
    fn flush_batched(&mut self) -> Result<(), Error> {
        Ok(())
    }

    /// The next received control message, copied whole into `buf`; returns
    /// its length, or `None` if none is ready. A too-small `buf` gets
    /// `BufferTooSmall` and the message stays queued. After the peer left,
    /// remaining messages are delivered first, then `PeerDisconnected`.
    fn try_recv(&mut self, buf: &mut [u8]) -> Result<Option<usize>, Error>;

    /// Posts one READ (see the module docs for the contract).
    fn post_read(&mut self, op: &ReadOp) -> Result<(), Error>;

    /// Lets the peer READ this side's registered memory over this link.
    /// A link accepted by a [`Listener`] serves no READ until its owner
    /// calls this (typically once the peer has registered): a READ request
    /// arriving earlier is held while control messages before it wait for
    /// the owner, and otherwise closes the link as a protocol error. A
    /// link this side connected serves READs from the start. Transports
    /// whose READs the owner does not serve (shm: the reader copies; rdma:
    /// the NIC answers under the region's key) have nothing to hold: the
    /// default does nothing.
    fn allow_remote_reads(&mut self) {}

    /// [`allow_remote_reads`](Self::allow_remote_reads), and every READ
    /// the peer asks for must present a capability `verifier` accepts (a
    /// task planned to that peer whose input is exactly what it reads;
    /// issue 55): the others are refused (AccessDenied), counted
    /// ([`crate::capability::refused_reads`]), and the link stays up. Only
    /// a transport whose owner serves each READ can check (tcp); shm and
    /// rdma READs are one-sided, so the default allows them unchecked.
    fn allow_verified_remote_reads(&mut self, verifier: crate::capability::ReadVerifier) {
        let _ = verifier;
        self.allow_remote_reads();
    }

    /// [`post_reads`](Self::post_reads), `ops[i]` presenting `grants[i]`
    /// (the task and the plan's capability; none past its end) where the
    /// owner checks READs (tcp); the default ignores them.
    fn post_granted_reads(&mut self, ops: &[ReadOp], grants: &[crate::capability::ReadGrant]) -> Result<usize, Error> {
        let _ = grants;
        self.post_reads(ops)
    }

    /// The peer's address, where the transport knows one (tcp: the
    /// socket's peer); none for shm, rdma and in-process links. Bounds per
    /// source key on it.
    fn peer_addr(&self) -> Option<std::net::IpAddr> {
        None
    }

    /// Posts READs in order, all at once where the transport can (one
    /// doorbell / one submission). Returns how many were accepted: on a
    /// shortfall the rest were not posted and the error is that of the
    /// first refused one unless at least one was accepted.
    fn post_reads(&mut self, ops: &[ReadOp]) -> Result<usize, Error> {
        for (i, op) in ops.iter().enumerate() {
            if let Err(e) = self.post_read(op) {
                return if i == 0 { Err(e) } else { Ok(i) };
            }
        }
        Ok(ops.len())
    }

    /// Moves finished READs' results into `out`; returns how many. Also
    /// drives the connection like [`progress`](Self::progress).
    fn poll_completions(&mut self, out: &mut [Completion]) -> Result<usize, Error>;

    /// Drives I/O without consuming anything: flushes sends, serves peers'
    /// READs (tcp), notices a departed peer.
    fn progress(&mut self) -> Result<(), Error>;

    /// READs posted and not yet returned by `poll_completions`.
    fn outstanding_reads(&self) -> usize;

    /// Limit on [`outstanding_reads`](Self::outstanding_reads).
    fn max_outstanding_reads(&self) -> usize;

    /// False once the peer is known to be gone.
    fn is_connected(&self) -> bool;

    /// Blocks the calling thread for at most `timeout` until this
    /// connection may have work: bytes arrived (a message, a peer's READ
    /// request, the peer's departure) or a send finished. For memory owners
    /// that should not busy-poll (benchmark servers, tests, idle processes
    /// on small machines); the data path never calls it. Wake-ups may be
    /// spurious, so callers poll afterwards as usual.
    ///
    /// Returns `Ok(true)` if it waited in the kernel or found work pending,
    /// `Ok(false)` if this transport cannot wait (the default: the caller
    /// backs off on its own, e.g. with a short sleep), and the connection's
    /// error once it is dead.
    fn wait(&mut self, timeout: Duration) -> Result<bool, Error> {
        let _ = timeout;
        Ok(false)
    }

    /// A file descriptor that polls readable (level-triggered) whenever
    /// this connection may have work, so one thread can sleep on many
    /// connections at once (see [`crate::waitset::WaitSet`]); `None` if the
    /// transport has none (the caller then backs off on a timer). As with
    /// [`wait`](Self::wait), poll the connection before sleeping: a
    /// transport may only arm its receive during a poll.
    ///
    /// Once [`try_recv`](Self::try_recv) has returned `Ok(None)`, the fd
    /// turns readable before `try_recv` can return anything again (a
    /// message or the peer's departure), so a host may skip a link until
    /// then, unless [`may_hold_input`](Self::may_hold_input) says otherwise
    /// (shm: while the peer's messages sit in the shared ring, until
    /// [`arm_wait`](Self::arm_wait)).
    /// Between a `Some` and the next `None` messages may be buffered in user
    /// space without the fd saying so.
    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }

    /// Call before sleeping on [`wait_fd`](Self::wait_fd) (after polling
    /// the connection): makes the fd turn readable when input arrives, and
    /// returns false if input is already pending (poll instead of
    /// sleeping). Transports whose fd always reports input need nothing
    /// (the default). The shm transport moves messages through shared
    /// memory and wakes a sleeping peer through its socket only after this
    /// call, so that busy peers exchange messages without system calls;
    /// arming on every empty poll instead would cost the peer a system call
    /// per message.
    fn arm_wait(&self) -> bool {
        true
    }

    /// Whether input the kernel no longer reports may sit in user space:
    /// calls other than `try_recv` (a `send` that had to make room, a
    /// `progress`, `poll_completions`) may take bytes off the socket, and
    /// the fd is then quiet although `try_recv` would return a message. A
    /// host that skips links its wait set does not report must still drain
    /// a link for which this is true. The default (`true`) is always safe.
    fn may_hold_input(&self) -> bool {
        true
    }

    /// The wake-up this connection shares with others of its domain (shm:
    /// [`shm::Doorbell`]), if its transport has one.
    fn doorbell(&self) -> Option<&shm::Doorbell> {
        None
    }

    /// Makes the peer flag this link in [`doorbell`](Self::doorbell) and
    /// wake the host through it, instead of through [`wait_fd`](Self::wait_fd)
    /// (which still reports the peer's departure); returns the link's slot
    /// in the doorbell's bitmap. From then on [`arm_wait`](Self::arm_wait)
    /// arms nothing: the host arms the doorbell before it sleeps, and
    /// drains this link once after subscribing and whenever its slot is
    /// flagged. None: no doorbell (nothing changes).
    fn subscribe_doorbell(&self) -> Option<u32> {
        None
    }

    /// How far the peer has got with what this side sent: bytes accepted
    /// by [`send`](Self::send) so far, and how many of them have left this
    /// side's queues. shm: taken means taken out of the shared ring by the
    /// peer (its index, one load). tcp: put on the wire by the kernel
    /// (bytes handed to the socket less those it still holds unsent, one
    /// `ioctl`); bytes wait unsent when the peer's receive window is
    /// closed, i.e. its reader is behind. Not seen on tcp: what the peer's
    /// socket and stream hold unread (its receive buffer, ~100 KiB per
    /// link measured on loopback, and one receive of its stream's; a
    /// receive buffer capped small to shrink that closed the window so
    /// often that loopback throughput collapsed). With io_uring
    /// a send counts only
    /// once a later call on the connection (`send`, `try_recv`,
    /// `progress`) reaps it, so a sender that asks after a quiet spell
    /// polls the link first or sees its last message as still waiting.
    /// An open-loop sender compares the two to learn
    /// how long its oldest unread message has waited, and refuses load
    /// rather than queueing it past a time budget (issue 14: overload is
    /// refused and counted, never buffered without bound). `None` (the
    /// default): the transport cannot tell.
    fn send_progress(&self) -> Option<SendProgress> {
        None
    }

    /// [`SendProgress::accepted`] alone, where the transport counts it
    /// without asking the kernel (tcp: `send_progress` is one `ioctl`, and
    /// a sender noting each message's end needs only this half).
    fn accepted_bytes(&self) -> Option<u64> {
        self.send_progress().map(|p| p.accepted)
    }

    /// Ends the link now (the peer sees it close) while the connection
    /// itself stays in place until its owner drops it: a refused
    /// registration's link, kept until the next attempt replaces it.
    /// Default: nothing (the link closes when dropped).
    fn close(&mut self) {}
}

/// See [`Connection::send_progress`]: both counts run from the
/// connection's start and only grow; `taken <= accepted`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendProgress {
    /// Bytes accepted by `send` since the connection started.
    pub accepted: u64,
    /// Of those, bytes the peer (or the kernel, see above) has taken.
    pub taken: u64,
}

/// Retries [`Domain::deregister`] while it says `Busy`, polling `conns`
/// (which may be what serves the in-flight accesses) between tries, for at
/// most `timeout`.
pub fn deregister_within<D: Domain>(
    domain: &D,
    reg: &Registration,
    conns: &mut [&mut D::Conn],
    timeout: Duration,
) -> Result<(), Error> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_nanos(timeout.as_nanos());
    loop {
        match domain.deregister(reg) {
            Err(Error::Busy) => {}
            other => return other,
        }
        for c in conns.iter_mut() {
            let _ = c.progress();
        }
        if std::time::Instant::now() >= deadline {
            return Err(Error::Busy);
        }
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn os_and_protocol_errors_keep_their_source() {
        let io = Error::from(io::Error::new(io::ErrorKind::PermissionDenied, "no entry"));
        assert_eq!(io.source().map(|s| s.to_string()), Some("no entry".to_string()));
        let protocol = Error::Protocol(WireError::BadLength);
        assert_eq!(protocol.source().map(|s| s.to_string()), Some(WireError::BadLength.to_string()));
        assert!(Error::QueueFull.source().is_none());
    }
}
