//! The byte movers under a stream ([`ByteIo`]): plain syscalls on a
//! blocking socket, io_uring submissions and completions, or shared-memory
//! byte rings beside a socket that only wakes and reports EOF. At most one
//! receive and one send are in flight; whatever the kernel may still touch
//! is held until it says it is done.

use std::io;
use std::os::fd::RawFd;

use super::super::shm_ring::{RingConsumer, RingProducer};
use super::super::Error;
use super::sys::{last_os_error_result, retryable};
use super::tls::TlsIo;

/// Where the bytes of a finished receive landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RecvTarget {
    Buffer,
    Payload,
}

/// The byte mover under a stream: at most one receive and one send in flight.
pub(crate) enum ByteIo {
    /// Plain syscalls on a blocking socket: sends block in `sendmsg`,
    /// receives are polled with `recv(MSG_DONTWAIT)`, and `wait` is a
    /// blocking `recv` (with `SO_RCVTIMEO`) that keeps what it got.
    Std(StdIo),
    /// io_uring submissions and completions.
    Uring(Box<UringIo>),
    /// Shared-memory byte rings (shm): sends and receives are copies, with
    /// no system call while the peer is awake; the socket carries wake-up
    /// bytes and the peer's end of stream only.
    Ring(Box<RingIo>),
    /// TLS over plain syscalls (`tls`): the stream's bytes are encrypted
    /// and decrypted here, under the framing.
    Tls(Box<TlsIo>),
}

/// Consecutive empty receives (see [`ByteIo::note_empty`]) after which
/// the socket is read anyway, for a peer's end of stream: at most one
/// socket read per this many empty polls of a quiet link.
const EMPTY_POLLS_PER_SOCKET_CHECK: u32 = 4;

pub(crate) struct RingIo {
    pub(super) fd: RawFd,
    tx: RingProducer,
    rx: RingConsumer,
    recv: Option<(*mut u8, usize)>,
    pub(super) sent: Option<io::Result<usize>>,
    /// The socket reported end of stream: the peer closed or died. Reported
    /// once the ring is empty (its last messages are delivered first).
    eof: bool,
    /// Empty receives in a row since the socket was last read.
    empty_polls: u32,
}

pub(crate) struct StdIo {
    pub(super) fd: RawFd,
    recv: Option<(*mut u8, usize)>,
    pub(super) sent: Option<io::Result<usize>>,
    /// What a blocking receive in `wait` got, handed out by the next `poll`.
    waited: Option<io::Result<usize>>,
    /// The last receive returned fewer bytes than asked: the socket was
    /// empty then, so the next `poll` skips its `recv` once. Why: a caller
    /// that handles a message and polls again before sleeping would
    /// otherwise pay an `EAGAIN` syscall per message, which on a wake-up
    /// path is measurable (netbench honesty check vs sockperf). Skipping
    /// one poll delays a busy-poller by one loop turn, never longer.
    skip_recv: bool,
    /// `SO_RCVTIMEO` as last set on the socket (None: not set by us).
    rcv_timeout: Option<std::time::Duration>,
}

pub(crate) struct UringIo {
    pub(super) ring: io_uring::IoUring,
    fd: RawFd,
    msg: libc::msghdr,
    recv_busy: bool,
    send_busy: bool,
}

const UD_RECV: u64 = 1;
const UD_SEND: u64 = 2;
const UD_CANCEL: u64 = 3;

/// Checks that io_uring works here and supports what the tcp transport needs.
pub(crate) fn probe_uring() -> Result<(), Error> {
    let ring = io_uring::IoUring::new(4).map_err(|_| {
        Error::Unsupported(
            "io_uring unavailable (io_uring_setup failed: kernel, seccomp or sysctl)",
        )
    })?;
    let mut probe = io_uring::Probe::new();
    ring.submitter()
        .register_probe(&mut probe)
        .map_err(|_| Error::Unsupported("io_uring probe failed"))?;
    let needed = [
        io_uring::opcode::Recv::CODE,
        io_uring::opcode::SendMsg::CODE,
        io_uring::opcode::AsyncCancel::CODE,
    ];
    if needed.iter().all(|&op| probe.is_supported(op)) {
        Ok(())
    } else {
        Err(Error::Unsupported(
            "io_uring lacks RECV/SENDMSG/ASYNC_CANCEL",
        ))
    }
}

impl ByteIo {
    pub(crate) fn std(fd: RawFd) -> Self {
        ByteIo::Std(StdIo {
            fd,
            recv: None,
            sent: None,
            waited: None,
            skip_recv: false,
            rcv_timeout: None,
        })
    }

    /// The shm mover: `tx` and `rx` are this side's ends of the two rings,
    /// `fd` the connection's socket (blocking or not: it is only read with
    /// `MSG_DONTWAIT` and written one wake byte at a time).
    pub(crate) fn ring(fd: RawFd, tx: RingProducer, rx: RingConsumer) -> Self {
        ByteIo::Ring(Box::new(RingIo {
            fd,
            tx,
            rx,
            recv: None,
            sent: None,
            eof: false,
            empty_polls: 0,
        }))
    }

    /// The TLS mover over `fd` (a blocking socket with a send timeout).
    /// With `handshake_by` (a client: the connect's deadline) the
    /// handshake completes first, so the link is handed out with its
    /// server verified or not at all.
    pub(crate) fn tls(fd: RawFd, conn: rustls::Connection, handshake_by: Option<std::time::Instant>) -> io::Result<Self> {
        let mut t = TlsIo::new(fd, conn);
        if let Some(deadline) = handshake_by {
            t.handshake(deadline)?;
        }
        Ok(ByteIo::Tls(Box::new(t)))
    }

    /// A send the std, ring or TLS mover finished inside `start_send`
    /// (io_uring reports its sends at a later poll).
    pub(super) fn take_sent(&mut self) -> Option<io::Result<usize>> {
        match self {
            ByteIo::Std(s) => s.sent.take(),
            ByteIo::Ring(r) => r.sent.take(),
            ByteIo::Tls(t) => t.sent.take(),
            ByteIo::Uring(_) => None,
        }
    }

    /// The fd that polls readable when this mover has something to report.
    pub(super) fn wait_fd(&self) -> RawFd {
        use std::os::fd::AsRawFd;
        match self {
            ByteIo::Std(s) => s.fd,
            ByteIo::Ring(r) => r.fd,
            ByteIo::Tls(t) => t.fd,
            ByteIo::Uring(u) => u.ring.as_raw_fd(),
        }
    }

    pub(crate) fn uring(fd: RawFd) -> Result<Self, Error> {
        // COOP_TASKRUN + TASKRUN_FLAG: the kernel does not interrupt the
        // busy-polling thread to post completions; it raises a flag in the
        // shared ring instead, and `poll` enters the kernel only then.
        let ring = io_uring::IoUring::builder()
            .setup_coop_taskrun()
            .setup_taskrun_flag()
            .build(8)
            .or_else(|_| io_uring::IoUring::new(8))
            .map_err(|_| Error::Unsupported("io_uring unavailable"))?;
        // SAFETY: msghdr is plain old data; all-zero is a valid empty header.
        let msg: libc::msghdr = unsafe { std::mem::zeroed() };
        Ok(ByteIo::Uring(Box::new(UringIo {
            ring,
            fd,
            msg,
            recv_busy: false,
            send_busy: false,
        })))
    }

    /// Starts a receive into `[ptr, ptr+len)`, which must stay valid until
    /// the receive is reported by `poll`.
    pub(super) fn start_recv(&mut self, ptr: *mut u8, len: usize) -> io::Result<()> {
        match self {
            ByteIo::Std(s) => {
                s.recv = Some((ptr, len));
                Ok(())
            }
            ByteIo::Ring(r) => {
                r.recv = Some((ptr, len));
                Ok(())
            }
            ByteIo::Tls(t) => {
                t.start_recv(ptr, len);
                Ok(())
            }
            ByteIo::Uring(u) => {
                let len = u32::try_from(len).unwrap_or(u32::MAX);
                let e = io_uring::opcode::Recv::new(io_uring::types::Fd(u.fd), ptr, len)
                    .build()
                    .user_data(UD_RECV);
                // SAFETY: the buffer stays valid until the completion is
                // reaped (the stream holds it and drains before freeing).
                unsafe { u.ring.submission().push(&e) }.map_err(|_| io::Error::other("sq full"))?;
                u.ring.submit()?;
                u.recv_busy = true;
                Ok(())
            }
        }
    }

    /// Starts a send of `iov[..n]`; iovecs and memory must stay valid until
    /// the send is reported by `poll`.
    pub(super) fn start_send(&mut self, iov: *const libc::iovec, n: usize) -> io::Result<()> {
        match self {
            ByteIo::Std(s) => {
                // SAFETY: msghdr is plain old data.
                let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
                msg.msg_iov = iov as *mut libc::iovec;
                msg.msg_iovlen = n as _;
                // SAFETY: `msg` points at `n` valid iovecs over live memory.
                let r = unsafe { libc::sendmsg(s.fd, &msg, libc::MSG_NOSIGNAL) };
                s.sent = Some(last_os_error_result(r));
                Ok(())
            }
            ByteIo::Ring(r) => {
                // SAFETY: the caller passes `n` valid iovecs over live
                // memory (start_send contract).
                let iov = unsafe { std::slice::from_raw_parts(iov, n) };
                // SAFETY: each iovec describes `iov_len` readable bytes.
                let parts = iov.iter().map(|v| unsafe { std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len) });
                r.sent = Some(match r.tx.write_parts(parts) {
                    Ok((taken, wake)) => {
                        if wake {
                            // The peer sleeps on the socket: one byte wakes
                            // it. A full socket buffer (EAGAIN) already holds
                            // wake bytes, and a gone peer shows as our EOF.
                            // SAFETY: one byte from a static buffer.
                            unsafe {
                                libc::send(
                                    r.fd,
                                    b"w".as_ptr() as *const libc::c_void,
                                    1,
                                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                                )
                            };
                        }
                        Ok(taken)
                    }
                    Err(_) => Err(io::Error::new(io::ErrorKind::InvalidData, "shm ring corrupted")),
                });
                Ok(())
            }
            ByteIo::Tls(t) => {
                t.start_send(iov, n);
                Ok(())
            }
            ByteIo::Uring(u) => {
                u.msg.msg_iov = iov as *mut libc::iovec;
                u.msg.msg_iovlen = n as _;
                let e = io_uring::opcode::SendMsg::new(io_uring::types::Fd(u.fd), &u.msg)
                    .flags(libc::MSG_NOSIGNAL as u32)
                    .build()
                    .user_data(UD_SEND);
                // SAFETY: `u.msg` lives in a Box that outlives the operation,
                // and the iovecs and their memory stay valid until reaped.
                unsafe { u.ring.submission().push(&e) }.map_err(|_| io::Error::other("sq full"))?;
                u.ring.submit()?;
                u.send_busy = true;
                Ok(())
            }
        }
    }

    /// Reports finished operations.
    pub(super) fn poll(&mut self, recv: &mut Option<io::Result<usize>>, send: &mut Option<io::Result<usize>>) {
        match self {
            ByteIo::Std(s) => {
                if let Some(r) = s.waited.take() {
                    s.recv = None;
                    *recv = Some(r);
                } else if let Some((ptr, len)) = s.recv {
                    if s.skip_recv {
                        s.skip_recv = false;
                    } else {
                        // SAFETY: the target is valid for `len` bytes (start_recv contract).
                        let r = unsafe {
                            libc::recv(s.fd, ptr as *mut libc::c_void, len, libc::MSG_DONTWAIT)
                        };
                        let r = last_os_error_result(r);
                        if !matches!(&r, Err(e) if retryable(e)) {
                            s.skip_recv = matches!(r, Ok(n) if n > 0 && n < len);
                            s.recv = None;
                            *recv = Some(r);
                        }
                    }
                }
                *send = s.sent.take();
            }
            ByteIo::Ring(r) => {
                if let Some((ptr, len)) = r.recv {
                    // SAFETY: the target is valid for `len` bytes
                    // (start_recv contract) and is ours, not the ring's.
                    match unsafe { r.rx.read(ptr, len) } {
                        Ok(0) if !r.eof => {}
                        Ok(n) => {
                            r.recv = None;
                            r.empty_polls = 0;
                            *recv = Some(Ok(n));
                        }
                        Err(_) => {
                            r.recv = None;
                            *recv = Some(Err(io::Error::new(io::ErrorKind::InvalidData, "shm ring corrupted")));
                        }
                    }
                }
                *send = r.sent.take();
            }
            ByteIo::Tls(t) => t.poll(recv, send),
            ByteIo::Uring(u) => {
                if (u.recv_busy || u.send_busy)
                    && u.ring.completion().is_empty()
                    && u.ring.submission().taskrun()
                {
                    // Completions wait as task work: run it (no blocking).
                    let _ = u.ring.submit();
                }
                for cqe in u.ring.completion() {
                    let res = cqe.result();
                    let r = if res < 0 {
                        Err(io::Error::from_raw_os_error(-res))
                    } else {
                        Ok(res as usize)
                    };
                    match cqe.user_data() {
                        UD_RECV => {
                            u.recv_busy = false;
                            *recv = Some(r);
                        }
                        UD_SEND => {
                            u.send_busy = false;
                            *send = Some(r);
                        }
                        _ => {}
                    }
                }
            }
        }
    }

    /// Blocks up to `timeout` until an operation may have finished. Std
    /// engine (sends finish inside `start_send`): a blocking `recv` into the
    /// armed target, bounded by `SO_RCVTIMEO`; what it gets (bytes, the
    /// peer's close, an error) is kept for the next `poll`, so waking and
    /// receiving is one syscall, as in a plain blocking server. io_uring:
    /// `io_uring_enter` with GETEVENTS and a timeout (which also runs
    /// deferred task work). Timeouts and interruptions are not reported:
    /// the caller polls next and learns the outcome there.
    pub(super) fn wait(&mut self, timeout: std::time::Duration) {
        match self {
            ByteIo::Std(s) => {
                let Some((ptr, len)) = s.recv else {
                    return;
                };
                if s.waited.is_some() {
                    return;
                }
                // SO_RCVTIMEO has microsecond resolution and 0 means "forever".
                let timeout = timeout.max(std::time::Duration::from_micros(1));
                if s.rcv_timeout != Some(timeout) {
                    let tv = libc::timeval {
                        tv_sec: timeout.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
                        tv_usec: timeout.subsec_micros() as libc::suseconds_t,
                    };
                    // SAFETY: `tv` is a valid timeval of the size passed.
                    let rc = unsafe {
                        libc::setsockopt(
                            s.fd,
                            libc::SOL_SOCKET,
                            libc::SO_RCVTIMEO,
                            &tv as *const libc::timeval as *const libc::c_void,
                            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
                        )
                    };
                    if rc != 0 {
                        // Without a bound the receive could block forever:
                        // report nothing; the caller polls and backs off.
                        s.rcv_timeout = None;
                        return;
                    }
                    s.rcv_timeout = Some(timeout);
                }
                s.skip_recv = false;
                // SAFETY: the target is valid for `len` bytes (start_recv contract).
                let r = unsafe { libc::recv(s.fd, ptr as *mut libc::c_void, len, 0) };
                let r = last_os_error_result(r);
                if !matches!(&r, Err(e) if retryable(e)) {
                    s.skip_recv = matches!(r, Ok(n) if n > 0 && n < len);
                    s.waited = Some(r);
                }
            }
            ByteIo::Ring(r) => {
                if r.recv.is_none() || r.eof || !r.rx.arm() {
                    return;
                }
                let ts = libc::timespec {
                    tv_sec: timeout.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
                    tv_nsec: timeout.subsec_nanos() as libc::c_long,
                };
                let mut pfd = libc::pollfd {
                    fd: r.fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd and a valid timespec.
                let rc = unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
                // Awake again: producers need not wake us any more.
                if r.rx.disarm() || rc > 0 {
                    r.read_socket();
                }
            }
            ByteIo::Tls(t) => t.wait(timeout),
            ByteIo::Uring(u) => {
                if !(u.recv_busy || u.send_busy) || !u.ring.completion().is_empty() {
                    return;
                }
                let ts = io_uring::types::Timespec::new()
                    .sec(timeout.as_secs())
                    .nsec(timeout.subsec_nanos());
                let args = io_uring::types::SubmitArgs::new().timespec(&ts);
                // ETIME (timed out) and EINTR are fine: the caller polls next.
                let _ = u.ring.submitter().submit_with_args(1, &args);
            }
        }
    }

    /// Shuts the socket down and waits (bounded) until no operation is in
    /// flight. False if the kernel still holds one.
    pub(super) fn quiesce(&mut self) -> bool {
        match self {
            ByteIo::Std(s) => {
                // SAFETY: plain syscall on our fd.
                unsafe { libc::shutdown(s.fd, libc::SHUT_RDWR) };
                s.recv = None;
                s.sent = None;
                s.waited = None;
                true
            }
            ByteIo::Ring(r) => {
                // SAFETY: plain syscall on our fd.
                unsafe { libc::shutdown(r.fd, libc::SHUT_RDWR) };
                r.recv = None;
                r.sent = None;
                true
            }
            ByteIo::Tls(t) => {
                t.quiesce();
                true
            }
            ByteIo::Uring(u) => {
                // SAFETY: plain syscall on our fd.
                unsafe { libc::shutdown(u.fd, libc::SHUT_RDWR) };
                for ud in [UD_RECV, UD_SEND] {
                    let busy = if ud == UD_RECV {
                        u.recv_busy
                    } else {
                        u.send_busy
                    };
                    if busy {
                        let e = io_uring::opcode::AsyncCancel::new(ud)
                            .build()
                            .user_data(UD_CANCEL);
                        // SAFETY: the cancel entry refers to no memory.
                        let _ = unsafe { u.ring.submission().push(&e) };
                    }
                }
                let ts = io_uring::types::Timespec::new().nsec(10_000_000);
                for _ in 0..200 {
                    for cqe in u.ring.completion() {
                        match cqe.user_data() {
                            UD_RECV => u.recv_busy = false,
                            UD_SEND => u.send_busy = false,
                            _ => {}
                        }
                    }
                    if !u.recv_busy && !u.send_busy {
                        return true;
                    }
                    let args = io_uring::types::SubmitArgs::new().timespec(&ts);
                    let _ = u.ring.submitter().submit_with_args(1, &args);
                }
                false
            }
        }
    }
}

impl ByteIo {
    /// A receive found nothing (the caller's `try_recv` returns empty). The
    /// ring mover reads its socket now and then: at once when a peer woke
    /// us (a wake byte to take off), else every
    /// [`EMPTY_POLLS_PER_SOCKET_CHECK`] empty polls in a row, to notice a
    /// departed peer's end of stream (a busy link, whose receives are rarely
    /// empty twice in a row, pays no system call). True if the socket said
    /// something (bytes or EOF): poll again.
    pub(super) fn note_empty(&mut self) -> bool {
        let ByteIo::Ring(r) = self else {
            return false;
        };
        r.empty_polls += 1;
        if r.eof || !(r.rx.take_woken() || r.empty_polls >= EMPTY_POLLS_PER_SOCKET_CHECK) {
            return false;
        }
        r.read_socket()
    }

    /// Whether the ring holds bytes not received yet (or the peer left):
    /// input the socket does not report.
    pub(super) fn ring_has_input(&self) -> bool {
        match self {
            ByteIo::Ring(r) => r.eof || r.rx.has_input(),
            ByteIo::Tls(t) => t.has_input(),
            _ => false,
        }
    }

    /// Before a sleep on the wait fd: see `Connection::arm_wait`.
    pub(super) fn arm(&self) -> bool {
        match self {
            ByteIo::Ring(r) => !r.eof && r.rx.arm(),
            _ => true,
        }
    }
}

impl RingIo {
    /// Bytes the peer has taken out of our outgoing ring since the start.
    pub(super) fn peer_taken(&self) -> u64 {
        self.tx.taken()
    }

    /// Takes wake bytes off the socket and notices its end of stream. True
    /// if it got either.
    fn read_socket(&mut self) -> bool {
        self.empty_polls = 0;
        let mut scratch = [0u8; 256];
        // SAFETY: `scratch` is valid for its length.
        let r = unsafe {
            libc::recv(
                self.fd,
                scratch.as_mut_ptr() as *mut libc::c_void,
                scratch.len(),
                libc::MSG_DONTWAIT,
            )
        };
        match r {
            0 => {
                self.eof = true;
                true
            }
            n if n > 0 => true,
            _ => {
                let e = io::Error::last_os_error();
                if retryable(&e) {
                    false
                } else {
                    // A reset socket: the peer is gone as surely as at EOF.
                    self.eof = true;
                    true
                }
            }
        }
    }
}
