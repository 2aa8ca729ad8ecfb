//! Event-driven idling for a verbs connection: one completion channel per
//! completion queue, armed when a poll finds the queue empty, and one epoll
//! fd over both channels and the bootstrap socket as the connection's
//! [`wait_fd`](crate::transport::Connection::wait_fd).
//!
//! The cycle per completion queue:
//! 1. a poll finds it empty and it is not armed: consume the channel's
//!    events of the previous round (if any), `ibv_req_notify_cq`, and poll
//!    once more (a completion that landed before the arm raises no event);
//! 2. the next completion raises an event: the channel fd (and so the
//!    epoll fd) turns readable and stays so until step 1 consumes it;
//! 3. a poll that finds work while armed marks the arm as spent.
//!
//! Only a poll that returns nothing arms; the connection makes sure a poll
//! that hands its caller nothing leaves its queue armed. A busy poller pays one
//! `ibv_req_notify_cq` per busy-to-empty transition (a doorbell on mlx5, a
//! system call on rxe) and one non-blocking read of the channel before the
//! next arm; a poller that always finds work (a busy-polled READ that
//! completes inside its doorbell, as on rxe's loopback path) pays nothing.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr;
use std::sync::Arc;

use rdma_mummy_sys as sys;
use sideway::ibverbs::completion::CompletionChannel;
use sideway::ibverbs::device_context::DeviceContext;

use super::{errno_err, verbs_err};
use crate::time::Duration;
use crate::transport::Error;

/// The notification state of one completion queue.
pub(super) struct CqWake {
    channel: Arc<CompletionChannel>,
    /// `ibv_req_notify_cq` was called and no completion was polled since.
    armed: bool,
    /// A completion was polled while armed: the channel may hold its event.
    event_pending: bool,
}

impl CqWake {
    /// A fresh non-blocking completion channel for one completion queue.
    pub(super) fn new(ctx: &Arc<DeviceContext>) -> Result<CqWake, Error> {
        let channel =
            CompletionChannel::new(ctx).map_err(|e| verbs_err("ibv_create_comp_channel", e))?;
        channel.set_nonblocking(true)?;
        Ok(CqWake {
            channel,
            armed: false,
            event_pending: false,
        })
    }

    /// The channel, for the completion queue builder.
    pub(super) fn channel(&self) -> &Arc<CompletionChannel> {
        &self.channel
    }

    /// The channel's fd (readable while an event waits).
    fn fd(&self) -> RawFd {
        self.channel.as_raw_fd()
    }

    /// Whether the queue is armed (the caller may then sleep on it).
    pub(super) fn armed(&self) -> bool {
        self.armed
    }

    /// A poll of `cq` found work.
    #[inline]
    pub(super) fn note_work(&mut self) {
        if self.armed {
            self.armed = false;
            self.event_pending = true;
        }
    }

    /// A poll of `cq` found it empty: arms it unless armed. Returns true if it
    /// armed now; the caller then polls `cq` once more.
    #[inline]
    pub(super) fn arm_when_empty(&mut self, cq: *mut sys::ibv_cq) -> Result<bool, Error> {
        if self.armed {
            return Ok(false);
        }
        if self.event_pending {
            self.consume_events();
        }
        // SAFETY: `cq` is the live completion queue created on this channel (the
        // caller owns both); 0 = notify on any completion, not only solicited ones.
        let rc = unsafe { sys::ibv_req_notify_cq(cq, 0) };
        if rc != 0 {
            return Err(errno_err("ibv_req_notify_cq", rc));
        }
        self.armed = true;
        Ok(true)
    }

    /// Reads and acknowledges every event waiting on the channel (non-blocking).
    fn consume_events(&mut self) {
        loop {
            let mut cq: *mut sys::ibv_cq = ptr::null_mut();
            let mut ctx: *mut std::ffi::c_void = ptr::null_mut();
            // SAFETY: the channel is alive (held by self) and non-blocking; both out
            // pointers are valid for writes.
            let rc = unsafe {
                sys::ibv_get_cq_event(self.channel.comp_channel().as_ptr(), &mut cq, &mut ctx)
            };
            if rc != 0 || cq.is_null() {
                break;
            }
            // SAFETY: `cq` was just returned by ibv_get_cq_event: a live CQ of this
            // channel. Acknowledged at once, so destroying the CQ never waits for us.
            unsafe { sys::ibv_ack_cq_events(cq, 1) };
        }
        self.event_pending = false;
    }
}

/// An epoll fd over a connection's channel fds and its bootstrap socket:
/// readable while a completion event waits or the peer has closed.
pub(super) struct WaitFd {
    epoll: OwnedFd,
}

impl WaitFd {
    /// Watches `send` and `recv` (their channels) and `sock` (EOF / reset).
    pub(super) fn new(send: &CqWake, recv: &CqWake, sock: RawFd) -> Result<WaitFd, Error> {
        // SAFETY: plain syscall; the result is checked before use.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error().into());
        }
        // SAFETY: `fd` is a fresh descriptor owned by nobody else.
        let epoll = unsafe { OwnedFd::from_raw_fd(fd) };
        let watch = |target: RawFd, events: u32| -> Result<(), Error> {
            let mut ev = libc::epoll_event {
                events,
                u64: target as u64,
            };
            // SAFETY: both fds are open; `ev` is valid for the call.
            let rc =
                unsafe { libc::epoll_ctl(epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, target, &mut ev) };
            if rc < 0 {
                return Err(io::Error::last_os_error().into());
            }
            Ok(())
        };
        watch(send.fd(), libc::EPOLLIN as u32)?;
        watch(recv.fd(), libc::EPOLLIN as u32)?;
        watch(
            sock,
            (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLHUP) as u32,
        )?;
        Ok(WaitFd { epoll })
    }

    /// The fd callers sleep on.
    pub(super) fn fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }

    /// Sleeps until the fd is readable or `timeout` passed (EINTR counts as a wake).
    pub(super) fn wait(&self, timeout: Duration) -> Result<(), Error> {
        let mut pfd = libc::pollfd {
            fd: self.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_nanos().div_ceil(1_000_000).min(i32::MAX as u64) as i32;
        // SAFETY: `pfd` is a valid pollfd for the call; nfds = 1.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e.into());
            }
        }
        Ok(())
    }
}
