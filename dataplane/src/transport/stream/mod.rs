//! The framed-stream engine behind `tcp` (both I/O engines) and the `shm`
//! control channel (its shared-memory rings as the byte mover): wire-message
//! framing, an inbox for control messages, the emulated one-sided READ
//! (requester and responder halves), all on preallocated buffers and driven
//! only by the owner's polling calls.
//!
//! On the stream, a READ is `ReadRequest{wr_id, remote}` one way and
//! `ReadResponse{wr_id, status, len}` + `len` raw bytes the other way. The
//! responder serves requests in arrival order, so responses come back in
//! posting order and the requester keeps its pending READs in a FIFO. Large
//! payloads are received straight into the landing buffer and sent straight
//! from the registered region (iovecs), never through an intermediate copy.
//!
//! Only one receive and one send are in flight at a time. Whatever the
//! kernel may still touch (buffers, landing and source regions) is held
//! until the kernel says it is done: teardown shuts the socket down, cancels
//! and waits (bounded), and leaks rather than frees if the kernel does not
//! answer.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use super::registry::Registry;
use super::{Completion, Error, ErrorKind, ReadOp};
use crate::capability::{ReadGrant, ReadVerifier};
use crate::mem::{Access, AccessToken};
use crate::wire::{self, Kind, ReadRequest, ReadResponse, ReadStatus, HEADER_LEN, MAX_MESSAGE_LEN};

/// Receive buffer: room for a few maximal messages.
const RX_CAP: usize = 4 * MAX_MESSAGE_LEN;
/// Control messages waiting for `try_recv`.
const INBOX_CAP: usize = 8 * MAX_MESSAGE_LEN;
/// Outgoing staged bytes (control messages, READ requests and response heads).
const TX_CAP: usize = 8 * MAX_MESSAGE_LEN;
/// The same over shm rings, where the ring is the send buffer: bytes wait
/// here only while it is full, and more room here would only add latency
/// behind a receiver that cannot keep up (overload is refused instead).
const RING_TX_CAP: usize = 2 * MAX_MESSAGE_LEN;
/// Most bytes one receive takes out of an shm ring. Why: what the ring
/// holds, the sender sees waiting (`send_progress`) and can refuse load
/// past a time budget; bytes taken into this side's buffers before it
/// handles them would be a queue the sender does not see (up to a whole
/// ring per link: tens of ms in front of a saturated scheduler). Small
/// receives cost no system call, only a pass through `pump`.
const RING_RECV_CHUNK: usize = 4096;
/// Most bytes one receive takes off a socket into the receive buffer (READ
/// payloads land in place, unbounded by this). Why: as for
/// [`RING_RECV_CHUNK`], bytes taken in ahead of the caller are a queue the
/// sender does not see, and io_uring takes them in the background: up to
/// the whole receive buffer (4 maximal messages) per link before.
const SOCKET_RECV_CHUNK: usize = 8192;
/// iovecs per send.
const MAX_IOV: usize = 64;

const READ_REQUEST_LEN: usize = HEADER_LEN + std::mem::size_of::<ReadRequest>();
const READ_RESPONSE_LEN: usize = HEADER_LEN + std::mem::size_of::<ReadResponse>();

mod byte_io;
mod sys;
pub(crate) mod tls;

pub(crate) use byte_io::{probe_uring, ByteIo};
pub(crate) use sys::wait_readable;

/// Moves completions from `done` into `out`, oldest first; returns how
/// many. (The stream's READs and the shm transport's, which complete
/// inside `post_read`, are handed out alike.)
pub(crate) fn drain_completions(done: &mut VecDeque<Completion>, out: &mut [Completion]) -> usize {
    let n = out.len().min(done.len());
    for (slot, c) in out.iter_mut().zip(done.drain(..n)) {
        *slot = c;
    }
    n
}

/// The [`Connection`](super::Connection) methods a stream-backed
/// connection (shm, tcp) hands straight to its `stream` field: sending,
/// batching and receiving control messages. Expanded inside the
/// connection's `impl Connection`.
macro_rules! messages_through_stream {
    () => {
        fn send(&mut self, msg: &[u8]) -> Result<(), $crate::transport::Error> {
            self.stream.send(msg)
        }
        fn send_batched(&mut self, msg: &[u8]) -> Result<(), $crate::transport::Error> {
            self.stream.send_batched(msg)
        }
        fn flush_batched(&mut self) -> Result<(), $crate::transport::Error> {
            self.stream.flush_batched()
        }
        fn try_recv(&mut self, buf: &mut [u8]) -> Result<Option<usize>, $crate::transport::Error> {
            self.stream.try_recv(buf)
        }
        fn close(&mut self) {
            self.stream.close()
        }
    };
}
pub(crate) use messages_through_stream;

/// The [`Domain`](super::Domain) methods a stream transport's domain (shm,
/// tcp) answers from its `inner.registry` and `inner.cfg`. Expanded inside
/// the domain's `impl Domain`.
macro_rules! registry_domain_methods {
    () => {
        fn deregister(&self, reg: &$crate::transport::Registration) -> Result<(), $crate::transport::Error> {
            self.inner.registry.deregister(reg)
        }
        fn registered_count(&self) -> usize {
            self.inner.registry.table.live_count()
        }
        fn max_read_len(&self) -> u32 {
            self.inner.cfg.max_read_len
        }
    };
}
pub(crate) use registry_domain_methods;
use byte_io::RecvTarget;
use sys::retryable;

/// A READ posted and not yet answered.
struct Pending {
    wr_id: u64,
    len: u32,
    got: u32,
    dest: *mut u8,
    token: AccessToken,
    posted: std::time::Instant,
}

/// Outgoing bytes: staged copies, or a registered region sent in place.
enum Seg {
    Staged {
        start: usize,
        end: usize,
    },
    Region {
        ptr: *const u8,
        len: usize,
        token: AccessToken,
    },
}

impl Seg {
    fn len(&self) -> usize {
        match self {
            Seg::Staged { start, end } => end - start,
            Seg::Region { len, .. } => *len,
        }
    }
}

/// Sizing and behaviour of a stream.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StreamConfig {
    pub(crate) max_outstanding: usize,
    pub(crate) max_read_len: u32,
    pub(crate) read_timeout: std::time::Duration,
    /// Serve the peer's READ requests from `registry` (tcp); shm refuses them.
    pub(crate) serve_reads: bool,
}

/// One framed connection.
pub(crate) struct Stream {
    io: ByteIo,
    sock: OwnedFd,
    cfg: StreamConfig,
    registry: Arc<Registry>,

    rx: Box<[u8]>,
    rpos: usize,
    wpos: usize,
    /// The front pending READ's payload is arriving.
    in_payload: bool,
    recv_busy: Option<RecvTarget>,

    tx: Box<[u8]>,
    tx_len: usize,
    segs: VecDeque<Seg>,
    seg_cap: usize,
    /// Bytes of the front segment already sent.
    front_sent: usize,
    send_busy: bool,
    iov: Box<[libc::iovec]>,
    /// Bytes queued for sending since the start (see `send_progress`).
    accepted: u64,
    /// Of those, bytes the byte mover has taken.
    moved: u64,
    /// The highest `taken` `send_progress` reported (it never goes back).
    taken_seen: std::cell::Cell<u64>,

    inbox: Box<[u8]>,
    ihead: usize,
    itail: usize,
    /// Inside `try_recv`: `parse` leaves the next message in `rx` (see there).
    deliver: bool,

    pending: VecDeque<Pending>,
    done: VecDeque<Completion>,

    dead: Option<ErrorKind>,
    /// The kernel did not give back an operation: never free its memory.
    leak: bool,
    /// The owner let this link's READ requests be served (see
    /// [`allow_reads`](Self::allow_reads)).
    reads_allowed: bool,
    /// Each READ served must present a capability this accepts (issue 55).
    verifier: Option<ReadVerifier>,
}

// SAFETY: the raw pointers refer to registered regions (kept mapped by the
// access tokens this stream holds) and to the stream's own boxed buffers;
// the stream is used by one thread at a time.
unsafe impl Send for Stream {}

impl Stream {
    pub(crate) fn new(
        sock: OwnedFd,
        io: ByteIo,
        registry: Arc<Registry>,
        cfg: StreamConfig,
    ) -> Self {
        let seg_cap = 2 * cfg.max_outstanding + 256;
        let tx_cap = if matches!(io, ByteIo::Ring(_)) { RING_TX_CAP } else { TX_CAP };
        Stream {
            io,
            sock,
            cfg,
            registry,
            rx: vec![0u8; RX_CAP].into_boxed_slice(),
            rpos: 0,
            wpos: 0,
            in_payload: false,
            recv_busy: None,
            tx: vec![0u8; tx_cap].into_boxed_slice(),
            tx_len: 0,
            segs: VecDeque::with_capacity(seg_cap),
            seg_cap,
            front_sent: 0,
            send_busy: false,
            iov: vec![
                libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0
                };
                MAX_IOV
            ]
            .into_boxed_slice(),
            accepted: 0,
            moved: 0,
            taken_seen: std::cell::Cell::new(0),
            inbox: vec![0u8; INBOX_CAP].into_boxed_slice(),
            ihead: 0,
            itail: 0,
            deliver: false,
            pending: VecDeque::with_capacity(cfg.max_outstanding),
            done: VecDeque::with_capacity(cfg.max_outstanding),
            dead: None,
            leak: false,
            reads_allowed: true,
            verifier: None,
        }
    }

    /// Holds the peer's READ requests until [`allow_reads`](Self::allow_reads):
    /// an accepted link serves no memory before its owner has seen the
    /// peer register. Why not serve at once: anyone who reaches a data
    /// port could otherwise read staging memory before saying who it is.
    pub(crate) fn hold_reads(&mut self) {
        self.reads_allowed = false;
    }

    /// Serves the peer's READ requests from now on (the owner accepted its
    /// registration); requests held until now are served at the next poll.
    pub(crate) fn allow_reads(&mut self) {
        self.reads_allowed = true;
    }

    /// [`allow_reads`](Self::allow_reads), serving only READs whose
    /// capability `verifier` accepts; the others are answered AccessDenied
    /// (the link stays up: see `Connection::allow_verified_remote_reads`).
    pub(crate) fn allow_verified_reads(&mut self, verifier: ReadVerifier) {
        self.verifier = Some(verifier);
        self.reads_allowed = true;
    }

    pub(crate) fn raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    pub(crate) fn is_connected(&self) -> bool {
        self.dead.is_none()
    }

    pub(crate) fn outstanding(&self) -> usize {
        self.pending.len() + self.done.len()
    }

    pub(crate) fn max_outstanding(&self) -> usize {
        self.cfg.max_outstanding
    }

    fn dead_error(&self) -> Option<Error> {
        self.dead.map(Error::from)
    }

    // ---- public operations -------------------------------------------------

    pub(crate) fn send(&mut self, msg: &[u8]) -> Result<(), Error> {
        let idle = self.segs.is_empty() && !self.send_busy && self.tx_room(msg.len(), 1);
        if idle && !matches!(self.io, ByteIo::Uring(_)) {
            return self.send_direct(msg);
        }
        self.send_batched(msg)?;
        self.flush();
        Ok(())
    }

    /// `send` with nothing queued, on an engine that sends within the call
    /// (a ring write, a nonblocking `sendmsg`): the bytes go from `msg`
    /// straight to the ring or socket, and only what did not fit is staged.
    /// Why: staging first was a second copy of every message.
    fn send_direct(&mut self, msg: &[u8]) -> Result<(), Error> {
        self.check_outgoing(msg)?;
        let iov = libc::iovec { iov_base: msg.as_ptr() as *mut libc::c_void, iov_len: msg.len() };
        if let Err(e) = self.io.start_send(&iov, 1) {
            self.fail(Error::from(e).kind());
            return Err(self.dead_error().unwrap_or(Error::QueueFull));
        }
        let sent = self.io.take_sent();
        let n = match sent {
            Some(Ok(n)) => n.min(msg.len()),
            Some(Err(e)) if retryable(&e) => 0,
            Some(Err(e)) => {
                self.fail(Error::from(e).kind());
                return Err(self.dead_error().unwrap_or(Error::QueueFull));
            }
            None => 0,
        };
        self.accepted += n as u64;
        self.moved += n as u64;
        // Nothing was queued and `send` checked the room, so the rest
        // fits; were it ever not to, the peer would read a message cut
        // short, so the connection fails rather than go on.
        if n < msg.len() && !self.stage(&msg[n..]) {
            self.fail(ErrorKind::Protocol);
            return Err(self.dead_error().unwrap_or(Error::QueueFull));
        }
        Ok(())
    }

    /// Refuses what must not go out as a control message: on a dead
    /// stream, a frame whose length is not the message's, a READ frame.
    fn check_outgoing(&self, msg: &[u8]) -> Result<(), Error> {
        if let Some(e) = self.dead_error() {
            return Err(e);
        }
        match wire::frame_len(msg)? {
            Some(n) if n == msg.len() => {}
            _ => return Err(Error::Protocol(wire::WireError::BadLength)),
        }
        let kind = u16::from_le_bytes([msg[6], msg[7]]);
        if kind == Kind::ReadRequest as u16 || kind == Kind::ReadResponse as u16 {
            return Err(Error::Protocol(wire::WireError::UnknownKind(kind)));
        }
        Ok(())
    }

    /// Starts sending the staged bytes.
    pub(crate) fn flush_batched(&mut self) -> Result<(), Error> {
        self.flush();
        match self.dead_error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Stages `msg` behind the queued bytes; they leave at the next
    /// flush (a `send`, a `progress`), or now if the queue had to make room.
    pub(crate) fn send_batched(&mut self, msg: &[u8]) -> Result<(), Error> {
        self.check_outgoing(msg)?;
        self.reap_cheap();
        if !self.stage(msg) {
            self.pump();
            if !self.stage(msg) {
                return Err(Error::QueueFull);
            }
        }
        Ok(())
    }

    pub(crate) fn try_recv(&mut self, buf: &mut [u8]) -> Result<Option<usize>, Error> {
        if self.ihead == self.itail {
            if let Some(n) = self.rx_front_message() {
                return self.take_rx_front(n, buf);
            }
            // Messages this pump parses stay in the receive buffer for the
            // copy straight into `buf` below (not through the inbox).
            self.deliver = true;
            self.pump();
            // A ring receive takes at most RING_RECV_CHUNK: a message may
            // span a few of them.
            for _ in 0..MAX_MESSAGE_LEN / RING_RECV_CHUNK {
                if self.has_message() || self.dead.is_some() || !self.io.ring_has_input() {
                    break;
                }
                self.pump();
            }
            if !self.has_message() && self.dead.is_none() && self.io.note_empty() {
                self.pump();
            }
            self.deliver = false;
            if self.ihead == self.itail {
                if let Some(n) = self.rx_front_message() {
                    return self.take_rx_front(n, buf);
                }
            }
        }
        if self.ihead == self.itail {
            self.check_timeout();
            return match self.dead_error() {
                Some(e) => Err(e),
                None => Ok(None),
            };
        }
        let n = match wire::frame_len(&self.inbox[self.ihead..self.itail]) {
            Ok(Some(n)) => n,
            // Only whole, header-checked messages enter the inbox.
            _ => return Err(Error::Protocol(wire::WireError::Truncated)),
        };
        if buf.len() < n {
            return Err(Error::BufferTooSmall { needed: n });
        }
        buf[..n].copy_from_slice(&self.inbox[self.ihead..self.ihead + n]);
        self.ihead += n;
        if self.ihead == self.itail {
            self.ihead = 0;
            self.itail = 0;
        }
        Ok(Some(n))
    }

    /// Whether `try_recv` has a message without receiving more.
    fn has_message(&self) -> bool {
        self.ihead != self.itail || self.rx_front_message().is_some()
    }

    /// Length of the whole control message at the front of the receive
    /// buffer, if one is there (READ frames are the parser's, and a bad
    /// header is left for the parser to fail the connection on).
    fn rx_front_message(&self) -> Option<usize> {
        if self.in_payload {
            return None;
        }
        let bytes = &self.rx[self.rpos..self.wpos];
        match wire::frame_len(bytes) {
            Ok(Some(n)) if n <= bytes.len() => {
                let kind = u16::from_le_bytes([bytes[6], bytes[7]]);
                (kind != Kind::ReadRequest as u16 && kind != Kind::ReadResponse as u16).then_some(n)
            }
            _ => None,
        }
    }

    /// Hands the receive buffer's front message (`n` bytes, see
    /// `rx_front_message`) to the caller: one copy from where the bytes
    /// were received, instead of two through the inbox.
    fn take_rx_front(&mut self, n: usize, buf: &mut [u8]) -> Result<Option<usize>, Error> {
        if buf.len() < n {
            return Err(Error::BufferTooSmall { needed: n });
        }
        buf[..n].copy_from_slice(&self.rx[self.rpos..self.rpos + n]);
        self.rpos += n;
        if self.rpos == self.wpos && self.recv_busy != Some(RecvTarget::Buffer) {
            self.rpos = 0;
            self.wpos = 0;
        }
        Ok(Some(n))
    }

    /// Posts `ops`, `ops[i]` presenting `grants[i]` (none past its end).
    pub(crate) fn post_reads(&mut self, ops: &[ReadOp], grants: &[ReadGrant]) -> Result<usize, Error> {
        self.reap_cheap();
        let mut posted = 0;
        let mut first_err = None;
        for (i, op) in ops.iter().enumerate() {
            match self.post_one(op, grants.get(i).copied().unwrap_or_default()) {
                Ok(()) => posted += 1,
                Err(e) => {
                    first_err = Some(e);
                    break;
                }
            }
        }
        if posted > 0 {
            self.flush();
            return Ok(posted);
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(0),
        }
    }

    fn post_one(&mut self, op: &ReadOp, grant: ReadGrant) -> Result<(), Error> {
        if let Some(e) = self.dead_error() {
            return Err(e);
        }
        if self.outstanding() >= self.cfg.max_outstanding {
            return Err(Error::QueueFull);
        }
        let len = op.remote.len;
        if len > self.cfg.max_read_len {
            return Err(Error::TooLarge);
        }
        if op.local.len < len {
            return Err(Error::OutOfBounds);
        }
        if !self.tx_room(READ_REQUEST_LEN, 1) {
            self.pump();
            if !self.tx_room(READ_REQUEST_LEN, 1) {
                return Err(Error::QueueFull);
            }
        }
        let (token, dest) =
            self.registry
                .acquire(op.local.key, op.local.offset, len, Access::LOCAL_WRITE)?;
        let req = ReadRequest { wr_id: op.wr_id, remote: op.remote, task: grant.task, capability: grant.capability };
        let mut msg = [0u8; READ_REQUEST_LEN];
        let n = wire::encode(&mut msg, &req)?;
        let staged = self.stage(&msg[..n]);
        debug_assert!(staged, "room was checked");
        self.pending.push_back(Pending {
            wr_id: op.wr_id,
            len,
            got: 0,
            dest,
            token,
            posted: std::time::Instant::now(),
        });
        Ok(())
    }

    pub(crate) fn poll_completions(&mut self, out: &mut [Completion]) -> Result<usize, Error> {
        self.pump();
        self.check_timeout();
        Ok(drain_completions(&mut self.done, out))
    }

    pub(crate) fn progress(&mut self) -> Result<(), Error> {
        self.pump();
        self.check_timeout();
        match self.dead_error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Input the fd no longer reports: whole messages in the inbox, a whole
    /// frame received but not parsed yet (a send's `pump` or io_uring's
    /// cheap reap may take it off the socket, which then polls quiet), or
    /// no receive armed (nothing would make the fd readable). A partial
    /// frame is not: the rest of it makes the fd readable, and counting it
    /// would keep an idle host spinning on a peer that stalled mid-frame.
    pub(crate) fn may_hold_input(&self) -> bool {
        if self.dead.is_some() {
            return false;
        }
        let unparsed = &self.rx[self.rpos..self.wpos];
        self.ihead != self.itail
            || self.recv_busy.is_none()
            || self.io.ring_has_input()
            || (!self.in_payload && matches!(wire::frame_len(unparsed), Ok(Some(t)) if t <= unparsed.len()))
    }

    /// Bytes queued since the start and how many of them have left this
    /// side (see `Connection::send_progress`): over shm rings, what the
    /// peer read out of the ring; over a socket, what the kernel has put on
    /// the wire: handed to it (as far as reaped) less what still waits in
    /// its send queue, unsent (`SIOCOUTQNSD`: the peer's receive window is
    /// closed, its reader is behind). Why unsent rather than unacknowledged
    /// (`SIOCOUTQ`): a delayed ACK would make a quiet link's last message
    /// look unread for tens of ms; bytes in flight wait for the network,
    /// not for the reader. What the peer's socket holds unread is not seen
    /// here (it is bounded by that socket's receive buffer).
    pub(crate) fn send_progress(&self) -> super::SendProgress {
        let taken = match &self.io {
            ByteIo::Ring(r) => r.peer_taken().min(self.moved),
            // Everything handed to the kernel has left already: no need to
            // ask it (the count only grows).
            _ if self.taken_seen.get() >= self.moved => self.moved,
            _ => self.moved.saturating_sub(self.kernel_unsent()),
        };
        // A send the kernel finished but nobody reaped yet is in the
        // kernel's count and not yet in `moved`: the difference can dip
        // for a moment, and the count only grows.
        let taken = taken.max(self.taken_seen.get());
        self.taken_seen.set(taken);
        super::SendProgress {
            accepted: self.accepted,
            taken,
        }
    }

    /// `send_progress().accepted` without the `ioctl`.
    pub(crate) fn accepted_bytes(&self) -> u64 {
        self.accepted
    }

    /// Bytes the socket holds that the kernel has not sent yet (0 when it
    /// cannot tell: a dead socket's bytes go nowhere anyway).
    fn kernel_unsent(&self) -> u64 {
        if self.dead.is_some() {
            return 0;
        }
        let mut n: libc::c_int = 0;
        // SAFETY: SIOCOUTQNSD writes one int through the pointer, which
        // points at `n` on this stack frame.
        let rc = unsafe { libc::ioctl(self.sock.as_raw_fd(), libc::SIOCOUTQNSD as _, &mut n as *mut libc::c_int) };
        if rc == 0 {
            n.max(0) as u64
        } else {
            0
        }
    }

    /// Before sleeping on [`wait_fd`](Self::wait_fd) (see
    /// `Connection::arm_wait`): false if input is pending.
    pub(crate) fn arm_wait(&self) -> bool {
        self.dead.is_some() || (!self.may_hold_input() && self.io.arm())
    }

    /// A file descriptor that polls readable (level-triggered) whenever
    /// [`wait`](Self::wait) would return: the socket for plain syscalls,
    /// the ring for io_uring (its completion queue: the ring consumes the
    /// socket's bytes itself, so the socket's readiness would race it).
    pub(crate) fn wait_fd(&self) -> RawFd {
        self.io.wait_fd()
    }

    /// Blocks up to `timeout` until the kernel reports something for this
    /// stream (see `Connection::wait`). Returns at once when work is already
    /// pending: a message in the inbox, a completion to hand out, bytes not
    /// yet parsed, or no receive armed (the caller must poll first).
    pub(crate) fn wait(&mut self, timeout: std::time::Duration) -> Result<(), Error> {
        let std_engine = matches!(self.io, ByteIo::Std(_));
        let ring_engine = matches!(self.io, ByteIo::Ring(_));
        // The std engine's wait is itself a receive: when nothing else is
        // pending (no send queued, a receive armed), polling first would
        // only add an EAGAIN syscall in front of it.
        let std_quiet = std_engine
            && self.dead.is_none()
            && self.recv_busy.is_some()
            && self.segs.is_empty()
            && !self.send_busy;
        if !std_quiet {
            self.pump();
        }
        if let Some(e) = self.dead_error() {
            return Err(e);
        }
        let pending_work = self.ihead != self.itail
            || !self.done.is_empty()
            || self.rpos != self.wpos
            || self.recv_busy.is_none();
        if pending_work || timeout.is_zero() {
            return Ok(());
        }
        // A full ring has no wake-up for room: bytes still queued here are
        // retried after a short sleep.
        let timeout = if ring_engine && !self.segs.is_empty() {
            timeout.min(std::time::Duration::from_micros(100))
        } else {
            timeout
        };
        self.io.wait(timeout);
        if !matches!(self.io, ByteIo::Uring(_)) {
            // Take in what the receive got now: parse it, answer READ
            // requests, and leave messages in the inbox for `try_recv`.
            self.pump();
        }
        Ok(())
    }

    // ---- engine --------------------------------------------------------------

    fn pump(&mut self) {
        if self.dead.is_some() {
            return;
        }
        self.reap();
        self.parse();
        self.flush();
        self.arm_recv();
    }

    fn check_timeout(&mut self) {
        if let Some(p) = self.pending.front() {
            if p.posted.elapsed() > self.cfg.read_timeout {
                self.fail(ErrorKind::Timeout);
            }
        }
    }

    fn reap(&mut self) {
        let mut recv = None;
        let mut send = None;
        self.io.poll(&mut recv, &mut send);
        if let Some(r) = send {
            self.send_busy = false;
            match r {
                Ok(n) => self.consume_sent(n),
                Err(e) if retryable(&e) => {}
                Err(e) => return self.fail(Error::from(e).kind()),
            }
        }
        if let Some(r) = recv {
            let target = self.recv_busy.take();
            match r {
                Ok(0) => self.fail(ErrorKind::PeerDisconnected),
                Ok(n) => match target {
                    Some(RecvTarget::Payload) => {
                        if let Some(p) = self.pending.front_mut() {
                            p.got += n as u32;
                            if p.got == p.len {
                                self.in_payload = false;
                                self.complete_front(Ok(()));
                            }
                        }
                    }
                    _ => self.wpos += n,
                },
                Err(e) if retryable(&e) => {}
                Err(e) => self.fail(Error::from(e).kind()),
            }
        }
    }

    fn complete_front(&mut self, status: Result<(), ErrorKind>) {
        if let Some(p) = self.pending.pop_front() {
            self.registry.release(p.token);
            let bytes = if status.is_ok() { p.len } else { 0 };
            self.done.push_back(Completion {
                wr_id: p.wr_id,
                status,
                bytes,
            });
        }
    }

    fn parse(&mut self) {
        while self.dead.is_none() {
            let avail = self.wpos - self.rpos;
            if self.in_payload {
                let Some(p) = self.pending.front_mut() else {
                    return self.fail(ErrorKind::Protocol);
                };
                let k = avail.min((p.len - p.got) as usize);
                if k == 0 {
                    break;
                }
                // SAFETY: `dest + got .. + k` lies in the landing range
                // acquired under `p.token` (k <= len - got); the rx range is
                // initialised and cannot overlap registered memory.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.rx.as_ptr().add(self.rpos),
                        p.dest.add(p.got as usize),
                        k,
                    )
                };
                p.got += k as u32;
                self.rpos += k;
                if p.got == p.len {
                    self.in_payload = false;
                    self.complete_front(Ok(()));
                }
                continue;
            }
            let bytes = &self.rx[self.rpos..self.wpos];
            let total = match wire::frame_len(bytes) {
                Err(_) => return self.fail(ErrorKind::Protocol),
                Ok(None) => break,
                Ok(Some(t)) if t > bytes.len() => break,
                Ok(Some(t)) => t,
            };
            let kind = u16::from_le_bytes([bytes[6], bytes[7]]);
            if kind == Kind::ReadRequest as u16 {
                if !self.cfg.serve_reads {
                    return self.fail(ErrorKind::Protocol);
                }
                // Decoded like any other message: a frame of another wire
                // version is framed by its length alone and may hold no
                // body at all (issue 55: 16 bytes crashed the daemon).
                let req = match wire::decode(&bytes[..total]) {
                    Ok(wire::Message::ReadRequest(r)) => r,
                    _ => return self.fail(ErrorKind::Protocol),
                };
                if !self.reads_allowed {
                    // Control messages ahead of it wait for the owner (a
                    // Register may be among them): hold the READ until the
                    // owner has read them. With nothing ahead, the peer
                    // asked for memory before registering.
                    if self.ihead != self.itail {
                        break;
                    }
                    return self.fail(ErrorKind::Protocol);
                }
                if !self.tx_room(READ_RESPONSE_LEN, 1) {
                    break;
                }
                self.rpos += total;
                self.serve(req);
            } else if kind == Kind::ReadResponse as u16 {
                let resp = match wire::decode(&bytes[..total]) {
                    Ok(wire::Message::ReadResponse(r)) => r,
                    _ => return self.fail(ErrorKind::Protocol),
                };
                self.rpos += total;
                let Some(p) = self.pending.front() else {
                    return self.fail(ErrorKind::Protocol);
                };
                if p.wr_id != resp.wr_id {
                    return self.fail(ErrorKind::Protocol);
                }
                match ReadStatus::from_u32(resp.status) {
                    Some(ReadStatus::Ok) if resp.len == p.len => {
                        if p.len == 0 {
                            self.complete_front(Ok(()));
                        } else {
                            self.in_payload = true;
                        }
                    }
                    Some(ReadStatus::Ok) => return self.fail(ErrorKind::Protocol),
                    Some(s) => self.complete_front(Err(status_kind(s))),
                    None => return self.fail(ErrorKind::Protocol),
                }
            } else {
                // For `try_recv` (`deliver`), the first message waiting for
                // the caller stays here and is copied once, straight into
                // its buffer; parsing stops there so that order is kept.
                // Other calls move messages into the inbox so that READ
                // frames behind them are still served.
                if self.deliver && self.ihead == self.itail {
                    break;
                }
                if !self.inbox_push(total) {
                    break;
                }
                self.rpos += total;
            }
        }
        if self.rpos == self.wpos && self.recv_busy != Some(RecvTarget::Buffer) {
            self.rpos = 0;
            self.wpos = 0;
        } else if self.recv_busy.is_none()
            && self.rpos > 0
            && self.rx.len() - self.wpos < MAX_MESSAGE_LEN
        {
            self.rx.copy_within(self.rpos..self.wpos, 0);
            self.wpos -= self.rpos;
            self.rpos = 0;
        }
    }

    /// Answers one READ request from the registry (responder half).
    fn serve(&mut self, req: ReadRequest) {
        let r = req.remote;
        let grant = ReadGrant { task: req.task, capability: req.capability };
        let status = if r.len > self.cfg.max_read_len {
            Err(ReadStatus::TooLarge)
        } else if self.verifier.as_ref().is_some_and(|v| !v.allows(r, &grant)) {
            Err(ReadStatus::AccessDenied)
        } else {
            match self
                .registry
                .acquire(r.key, r.offset, r.len, Access::REMOTE_READ)
            {
                Ok(ok) => Ok(ok),
                Err(e) => Err(match e.kind() {
                    ErrorKind::OutOfBounds => ReadStatus::OutOfBounds,
                    ErrorKind::Deregistered => ReadStatus::Deregistered,
                    ErrorKind::AccessDenied => ReadStatus::AccessDenied,
                    _ => ReadStatus::BadKey,
                }),
            }
        };
        let (resp, seg) = match status {
            Ok((token, ptr)) => (
                ReadResponse {
                    wr_id: req.wr_id,
                    status: ReadStatus::Ok as u32,
                    len: r.len,
                },
                Some(Seg::Region {
                    ptr,
                    len: r.len as usize,
                    token,
                }),
            ),
            Err(s) => (
                ReadResponse {
                    wr_id: req.wr_id,
                    status: s as u32,
                    len: 0,
                },
                None,
            ),
        };
        let mut msg = [0u8; READ_RESPONSE_LEN];
        let Ok(n) = wire::encode(&mut msg, &resp) else {
            return;
        };
        let staged = self.stage(&msg[..n]);
        debug_assert!(staged, "room was checked");
        match seg {
            Some(Seg::Region { token, .. }) if r.len == 0 => self.registry.release(token),
            Some(seg) => {
                self.accepted += seg.len() as u64;
                self.segs.push_back(seg);
            }
            None => {}
        }
    }

    fn inbox_push(&mut self, total: usize) -> bool {
        if self.itail + total > self.inbox.len() && self.ihead > 0 {
            self.inbox.copy_within(self.ihead..self.itail, 0);
            self.itail -= self.ihead;
            self.ihead = 0;
        }
        if self.itail + total > self.inbox.len() {
            return false;
        }
        self.inbox[self.itail..self.itail + total]
            .copy_from_slice(&self.rx[self.rpos..self.rpos + total]);
        self.itail += total;
        true
    }

    fn tx_room(&self, bytes: usize, segs: usize) -> bool {
        self.tx_len + bytes <= self.tx.len() && self.segs.len() + segs < self.seg_cap
    }

    /// Appends bytes to the staging buffer; false if there is no room.
    fn stage(&mut self, bytes: &[u8]) -> bool {
        if !self.tx_room(bytes.len(), 1) {
            return false;
        }
        let start = self.tx_len;
        self.tx[start..start + bytes.len()].copy_from_slice(bytes);
        self.tx_len += bytes.len();
        self.accepted += bytes.len() as u64;
        // Contiguous bytes extend the last staged segment, even one being
        // sent: the kernel sends the iovec's old length and `front_sent`
        // then points into the segment, so ordering is kept.
        match self.segs.back_mut() {
            Some(Seg::Staged { end, .. }) if *end == start => *end += bytes.len(),
            _ => self.segs.push_back(Seg::Staged {
                start,
                end: start + bytes.len(),
            }),
        }
        true
    }

    fn flush(&mut self) {
        if self.send_busy || self.segs.is_empty() || self.dead.is_some() {
            return;
        }
        let mut n = 0;
        for (i, seg) in self.segs.iter().take(MAX_IOV).enumerate() {
            let skip = if i == 0 { self.front_sent } else { 0 };
            let (base, len) = match *seg {
                // SAFETY: staged ranges lie inside `tx`.
                Seg::Staged { start, end } => (
                    unsafe { self.tx.as_ptr().add(start + skip) },
                    end - start - skip,
                ),
                // SAFETY: region ranges were bounds-checked when acquired.
                Seg::Region { ptr, len, .. } => (unsafe { ptr.add(skip) }, len - skip),
            };
            self.iov[i] = libc::iovec {
                iov_base: base as *mut libc::c_void,
                iov_len: len,
            };
            n += 1;
        }
        self.send_busy = true;
        if let Err(e) = self.io.start_send(self.iov.as_ptr(), n) {
            self.send_busy = false;
            return self.fail(Error::from(e).kind());
        }
        // The std and ring engines finished inside start_send: account for
        // it now so that sends never wait for a later poll. A full ring
        // took nothing: the bytes stay queued for a later flush.
        let sent = self.io.take_sent();
        if let Some(r) = sent {
            self.send_busy = false;
            match r {
                Ok(0) => {}
                Ok(n) => {
                    self.consume_sent(n);
                    self.flush();
                }
                Err(e) if retryable(&e) => {}
                Err(e) => self.fail(Error::from(e).kind()),
            }
        }
    }

    /// Reaps io_uring completions (no syscall) so that a finished send
    /// frees its slot before new bytes are queued.
    fn reap_cheap(&mut self) {
        if matches!(self.io, ByteIo::Uring(_)) && self.dead.is_none() {
            self.reap();
        }
    }

    fn consume_sent(&mut self, mut n: usize) {
        self.moved += n as u64;
        while n > 0 {
            let Some(front) = self.segs.front() else {
                break;
            };
            let left = front.len() - self.front_sent;
            if n >= left {
                n -= left;
                self.front_sent = 0;
                if let Some(Seg::Region { token, .. }) = self.segs.pop_front() {
                    self.registry.release(token);
                }
            } else {
                self.front_sent += n;
                n = 0;
            }
        }
        // Reclaim staging space (no send is in flight here).
        let first_staged = self.segs.iter().enumerate().find_map(|(i, s)| match s {
            Seg::Staged { start, .. } => Some((
                i,
                if i == 0 {
                    *start + self.front_sent
                } else {
                    *start
                },
            )),
            Seg::Region { .. } => None,
        });
        match first_staged {
            None => self.tx_len = 0,
            Some((_, 0)) => {}
            Some((_, from)) if self.tx_len <= self.tx.len() / 2 && from < self.tx_len => {}
            Some((idx, from)) => {
                self.tx.copy_within(from..self.tx_len, 0);
                self.tx_len -= from;
                for (i, s) in self.segs.iter_mut().enumerate() {
                    if let Seg::Staged { start, end } = s {
                        *start = if i == 0 { 0 } else { *start - from };
                        *end -= from;
                    }
                }
                if idx == 0 {
                    self.front_sent = 0;
                }
            }
        }
    }

    fn arm_recv(&mut self) {
        if self.recv_busy.is_some() || self.dead.is_some() {
            return;
        }
        let (ptr, len, target) = if self.in_payload && self.rpos == self.wpos {
            let Some(p) = self.pending.front() else {
                return;
            };
            // SAFETY: within the landing range held under `p.token`.
            (
                unsafe { p.dest.add(p.got as usize) },
                (p.len - p.got) as usize,
                RecvTarget::Payload,
            )
        } else if self.wpos < self.rx.len() {
            if self.holds_unread_messages() {
                // Received ahead of the caller already: the rest waits in
                // the socket, where the sender sees it (see
                // SOCKET_RECV_CHUNK). A `try_recv` that empties the
                // buffers arms the next receive.
                return;
            }
            let room = self.rx.len() - self.wpos;
            let len = match self.io {
                ByteIo::Ring(_) => room.min(RING_RECV_CHUNK),
                _ => room.min(SOCKET_RECV_CHUNK),
            };
            // SAFETY: `wpos < rx.len()`.
            (
                unsafe { self.rx.as_mut_ptr().add(self.wpos) },
                len,
                RecvTarget::Buffer,
            )
        } else {
            return;
        };
        match self.io.start_recv(ptr, len) {
            Ok(()) => self.recv_busy = Some(target),
            Err(e) => self.fail(Error::from(e).kind()),
        }
    }

    /// Whether a socket stream holds at least a receive's worth of whole
    /// control messages its caller has not taken (in the inbox, or whole
    /// at the front of the receive buffer). A partial frame never counts:
    /// its rest must be received.
    fn holds_unread_messages(&self) -> bool {
        if matches!(self.io, ByteIo::Ring(_)) {
            return false;
        }
        let front = if self.rx_front_message().is_some() { self.wpos - self.rpos } else { 0 };
        (self.itail - self.ihead) + front >= SOCKET_RECV_CHUNK
    }

    /// The connection is over: stop the kernel, then fail everything pending.
    fn fail(&mut self, kind: ErrorKind) {
        if self.dead.is_some() {
            return;
        }
        if kind == ErrorKind::Protocol {
            super::count_bad_bytes_link();
        }
        self.dead = Some(kind);
        if !self.io.quiesce() {
            // The kernel may still write landing buffers or read regions:
            // keep every token (their regions stay mapped) and our buffers.
            self.leak = true;
            while let Some(p) = self.pending.pop_front() {
                self.done.push_back(Completion {
                    wr_id: p.wr_id,
                    status: Err(kind),
                    bytes: 0,
                });
            }
            return;
        }
        self.recv_busy = None;
        self.send_busy = false;
        self.in_payload = false;
        while !self.pending.is_empty() {
            self.complete_front(Err(kind));
        }
        while let Some(seg) = self.segs.pop_front() {
            if let Seg::Region { token, .. } = seg {
                self.registry.release(token);
            }
        }
    }

    /// Frees what the stream holds; called by the owning connection's Drop.
    pub(crate) fn close(&mut self) {
        self.fail(ErrorKind::PeerDisconnected);
        if self.leak {
            std::mem::forget(std::mem::take(&mut self.rx));
            std::mem::forget(std::mem::take(&mut self.tx));
            std::mem::forget(std::mem::take(&mut self.iov));
            let io = std::mem::replace(&mut self.io, ByteIo::std(-1));
            std::mem::forget(io);
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.close();
    }
}

fn status_kind(s: ReadStatus) -> ErrorKind {
    match s {
        ReadStatus::Ok => ErrorKind::Protocol,
        ReadStatus::BadKey => ErrorKind::BadKey,
        ReadStatus::OutOfBounds => ErrorKind::OutOfBounds,
        ReadStatus::Deregistered => ErrorKind::Deregistered,
        ReadStatus::AccessDenied => ErrorKind::AccessDenied,
        ReadStatus::TooLarge => ErrorKind::TooLarge,
    }
}
