//! The system-call helpers the stream's byte movers share (the plain,
//! io_uring, ring and TLS movers, and the tcp and shm listeners).

use std::io;
use std::os::fd::RawFd;

/// A syscall's `ssize_t` result as an `io::Result` (errno when negative).
pub(crate) fn last_os_error_result(r: isize) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// Errors after which the operation is simply issued again. ECANCELED:
/// io_uring cancels a task's pending requests when the thread that
/// submitted them exits, so a connection handed to another thread sees its
/// armed receive (or a send not yet started) cancelled with nothing moved.
pub(crate) fn retryable(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    ) || e.raw_os_error() == Some(libc::ECANCELED)
}

/// Blocks up to `timeout` until `fd` is readable (or has an error or hang-up
/// pending). Errors and timeouts are not reported: the caller retries its
/// non-blocking call and learns the outcome there.
pub(crate) fn wait_readable(fd: RawFd, timeout: std::time::Duration) {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `pfd` is one valid pollfd on the stack, `ts` a valid timespec,
    // and a null signal mask means "unchanged".
    unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
}
