//! Sleeping on many connections at once: an epoll set over the
//! connections' [`wait_fd`](crate::transport::Connection::wait_fd)s plus an
//! eventfd that other threads signal through a [`Notifier`]. A daemon's poll
//! loop idles here (after its spins and yields) until a message arrives, a
//! peer leaves, another thread hands it work, or its next timer is due:
//! no CPU while idle, and a wake-up as soon as the kernel sees bytes,
//! instead of a timed park that either burns CPU (short) or adds latency
//! (long).
//!
//! [`IdleWait`] is the idle strategy on top: spin, then yield, then wait
//! here, with the wait capped by the caller's next deadline.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;

use crate::idle::{IdleAction, IdleStrategy};
use crate::time::Duration;

/// Wakes a [`WaitSet`] from another thread. Cheap to clone.
///
/// Like [`crate::idle::Waker`], the fast path (nobody asleep) is a fence
/// and a load: the sleeper sets `sleeping`, fences, and rechecks for work
/// before it sleeps ([`WaitSet::wait_unless`]); a producer publishes its
/// work, fences, and only then reads `sleeping`. One of the two sees the
/// other.
#[derive(Clone, Debug)]
pub struct Notifier {
    fd: Arc<OwnedFd>,
    sleeping: Arc<AtomicBool>,
}

impl Notifier {
    /// Call after publishing work: wakes the set's owner if it sleeps (or
    /// is about to). Never blocks.
    #[inline]
    pub fn notify(&self) {
        // Pairs with the fence in `WaitSet::wait_unless`.
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) {
            self.signal();
        }
    }

    /// Makes the set's current or next `wait` return, asleep or not (the
    /// eventfd counter saturates long before a write could block).
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our eventfd.
        let _ = unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }
}

/// An epoll set (level-triggered) plus a notifier eventfd and a timerfd
/// (so timeouts have the kernel timer's precision, not epoll's
/// milliseconds).
#[derive(Debug)]
pub struct WaitSet {
    ep: OwnedFd,
    event: Arc<OwnedFd>,
    sleeping: Arc<AtomicBool>,
    timer: OwnedFd,
    events: Vec<libc::epoll_event>,
    /// For [`ready_now`](Self::ready_now) (sized once, at first use).
    ready: Vec<libc::epoll_event>,
}

/// At most this many fds per [`WaitSet::ready_now`] (level-triggered: the
/// rest come first at the next call).
const READY_BATCH: usize = 1024;

/// Token of the notifier in the epoll set.
const NOTIFY_TOKEN: u64 = u64::MAX;
/// Token of the timer in the epoll set.
const TIMER_TOKEN: u64 = u64::MAX - 1;

impl WaitSet {
    /// An empty set with its notifier registered.
    pub fn new() -> io::Result<WaitSet> {
        // SAFETY: plain syscall; the result is checked before use.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `ep` is a fresh descriptor we own.
        let ep = unsafe { OwnedFd::from_raw_fd(ep) };
        // SAFETY: plain syscall; the result is checked before use.
        let ev = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if ev < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `ev` is a fresh descriptor we own.
        let event = Arc::new(unsafe { OwnedFd::from_raw_fd(ev) });
        // SAFETY: plain syscall; the result is checked before use.
        let t = unsafe {
            libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_CLOEXEC | libc::TFD_NONBLOCK)
        };
        if t < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `t` is a fresh descriptor we own.
        let timer = unsafe { OwnedFd::from_raw_fd(t) };
        let mut set = WaitSet {
            ep,
            event,
            sleeping: Arc::new(AtomicBool::new(false)),
            timer,
            events: vec![libc::epoll_event { events: 0, u64: 0 }; 64],
            ready: Vec::new(),
        };
        set.ctl(libc::EPOLL_CTL_ADD, set.event.as_raw_fd(), NOTIFY_TOKEN)?;
        set.ctl(libc::EPOLL_CTL_ADD, set.timer.as_raw_fd(), TIMER_TOKEN)?;
        Ok(set)
    }

    fn ctl(&mut self, op: libc::c_int, fd: RawFd, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLRDHUP) as u32,
            u64: token,
        };
        // SAFETY: `ev` is a valid epoll_event; `self.ep` is our epoll fd.
        let r = unsafe { libc::epoll_ctl(self.ep.as_raw_fd(), op, fd, &mut ev) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Adds `fd` (the caller keeps it open until [`remove`](Self::remove)
    /// or until it is closed, which removes it too).
    pub fn add(&mut self, fd: RawFd) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, fd as u64)
    }

    /// Adds `fd` under `token` (below `u64::MAX - 1`), which
    /// [`ready_now`](Self::ready_now) reports for it.
    pub fn add_keyed(&mut self, fd: RawFd, token: u64) -> io::Result<()> {
        debug_assert!(token < TIMER_TOKEN);
        self.ctl(libc::EPOLL_CTL_ADD, fd, token)
    }

    /// Without sleeping, pushes the token of each registered fd that is
    /// readable now (or hung up) to `out` (the fd itself for fds added
    /// with [`add`](Self::add)). One syscall, however many fds there are;
    /// leaves the notifier and timer to the next [`wait`](Self::wait).
    pub fn ready_now(&mut self, out: &mut Vec<u64>) {
        if self.ready.is_empty() {
            self.ready = vec![libc::epoll_event { events: 0, u64: 0 }; READY_BATCH];
        }
        // SAFETY: `ready` is a valid buffer of `len` epoll_events; a zero
        // timeout never blocks.
        let n = unsafe {
            libc::epoll_wait(self.ep.as_raw_fd(), self.ready.as_mut_ptr(), self.ready.len() as i32, 0)
        };
        if n <= 0 {
            return;
        }
        out.extend(
            self.ready[..n as usize]
                .iter()
                .map(|e| e.u64)
                .filter(|&t| t != NOTIFY_TOKEN && t != TIMER_TOKEN),
        );
    }

    /// Removes `fd` (an fd that is not in the set is not an error).
    pub fn remove(&mut self, fd: RawFd) {
        let _ = self.ctl(libc::EPOLL_CTL_DEL, fd, fd as u64);
    }

    /// A handle other threads use to wake this set.
    pub fn notifier(&self) -> Notifier {
        Notifier {
            fd: self.event.clone(),
            sleeping: self.sleeping.clone(),
        }
    }

    /// Declares the owner asleep, rechecks for work handed over by other
    /// threads (`recheck` returns true if there is some: then no sleep),
    /// and otherwise waits as [`wait`](Self::wait) does.
    pub fn wait_unless(&mut self, timeout: Duration, recheck: impl FnOnce() -> bool) -> usize {
        self.sleeping.store(true, Ordering::Relaxed);
        // Pairs with the fence in `Notifier::notify`.
        fence(Ordering::SeqCst);
        if recheck() {
            self.sleeping.store(false, Ordering::Relaxed);
            return 1;
        }
        let n = self.wait(timeout);
        self.sleeping.store(false, Ordering::Relaxed);
        n
    }

    /// Sleeps until a registered fd is readable, the notifier fires, or
    /// `timeout` passes. Returns how many of the caller's fds (and the
    /// notifier) were ready: 0 means the timeout or an interruption.
    pub fn wait(&mut self, timeout: Duration) -> usize {
        if timeout == Duration::ZERO {
            return 0;
        }
        let ns = timeout.as_nanos();
        let spec = libc::itimerspec {
            it_interval: libc::timespec { tv_sec: 0, tv_nsec: 0 },
            it_value: libc::timespec {
                tv_sec: (ns / 1_000_000_000) as libc::time_t,
                tv_nsec: (ns % 1_000_000_000) as libc::c_long,
            },
        };
        // SAFETY: `spec` is a valid itimerspec; a null old-value pointer is
        // allowed; `self.timer` is our timerfd.
        unsafe { libc::timerfd_settime(self.timer.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        // SAFETY: `events` is a valid buffer of `len` epoll_events.
        let n = unsafe {
            libc::epoll_wait(
                self.ep.as_raw_fd(),
                self.events.as_mut_ptr(),
                self.events.len() as i32,
                -1,
            )
        };
        let disarm = libc::itimerspec {
            it_interval: libc::timespec { tv_sec: 0, tv_nsec: 0 },
            it_value: libc::timespec { tv_sec: 0, tv_nsec: 0 },
        };
        // SAFETY: as above; a zero value disarms the timer.
        unsafe { libc::timerfd_settime(self.timer.as_raw_fd(), 0, &disarm, std::ptr::null_mut()) };
        if n <= 0 {
            return 0;
        }
        let mut ready = 0;
        for e in &self.events[..n as usize] {
            let fd = match e.u64 {
                NOTIFY_TOKEN => self.event.as_raw_fd(),
                TIMER_TOKEN => self.timer.as_raw_fd(),
                _ => {
                    ready += 1;
                    continue;
                }
            };
            if e.u64 == NOTIFY_TOKEN {
                ready += 1;
            }
            let mut count: u64 = 0;
            // SAFETY: reads 8 bytes into a valid u64 from our nonblocking
            // eventfd or timerfd (resets it; EAGAIN is harmless).
            let _ = unsafe { libc::read(fd, (&mut count as *mut u64).cast(), std::mem::size_of::<u64>()) };
        }
        ready
    }
}

/// What a daemon loop does when a pass found no work: spin, then yield,
/// then sleep in a [`WaitSet`], following an [`IdleStrategy`] whose park
/// bound caps each sleep (a `Spin` strategy never sleeps).
#[derive(Debug)]
pub struct IdleWait {
    strategy: IdleStrategy,
    step: u64,
    set: WaitSet,
    /// Sleeps taken so far.
    pub sleeps: u64,
}

/// Below this much time to the next deadline an idle pass spins: a sleep
/// and the reschedule after it cost tens of microseconds of timer slack.
pub const SLEEP_ABOVE: Duration = Duration::from_micros(60);

impl IdleWait {
    /// Idling per `strategy` on a fresh set.
    pub fn new(strategy: IdleStrategy) -> io::Result<IdleWait> {
        Ok(IdleWait {
            strategy,
            step: 0,
            set: WaitSet::new()?,
            sleeps: 0,
        })
    }

    /// A handle other threads use to wake this idler.
    pub fn notifier(&self) -> Notifier {
        self.set.notifier()
    }

    /// The wait set (add and remove connections' fds here).
    pub fn set(&mut self) -> &mut WaitSet {
        &mut self.set
    }

    /// Work was found: the next idle pass starts the back-off over.
    pub fn reset(&mut self) {
        self.step = 0;
    }

    /// One idle pass; `budget` is the time until the caller's next timer.
    pub fn idle(&mut self, budget: Duration) {
        self.idle_unless(budget, || false)
    }

    /// One idle pass that does not sleep if `recheck` (called after the
    /// owner declared itself asleep) finds work other threads handed over
    /// (see [`Notifier::notify`]).
    pub fn idle_unless(&mut self, budget: Duration, recheck: impl FnOnce() -> bool) {
        let action = self.strategy.action(self.step);
        self.step = self.step.saturating_add(1);
        match action {
            IdleAction::Spin => std::hint::spin_loop(),
            IdleAction::Yield => std::thread::yield_now(),
            IdleAction::Park(cap) => {
                if budget < SLEEP_ABOVE {
                    std::hint::spin_loop();
                } else {
                    self.sleeps += 1;
                    // Wake a little early (timer slack is ~50 us): the loop
                    // then spins to the deadline.
                    let t = cap.min(budget.saturating_sub(Duration::from_micros(50)));
                    if self.set.wait_unless(t, recheck) > 0 {
                        self.step = 0;
                    }
                }
            }
        }
    }
}

/// The connection fds a daemon sleeps on, kept equal to its live links'.
/// Each link has a key its owner never reuses: a new connection may get a
/// closed one's fd number, so entries are matched by key and fd, and stale
/// ones leave the set before new ones join it. A dead connection's fd stays
/// readable for ever, so the owner lists only connected links.
#[derive(Debug, Default)]
pub struct WatchList {
    /// Watched (key, fd), sorted by key.
    watched: Vec<(u64, RawFd)>,
    /// Scratch for the live list.
    live: Vec<(u64, RawFd)>,
}

impl WatchList {
    /// Nothing watched.
    pub fn new() -> Self {
        WatchList::default()
    }

    /// Makes `set` watch exactly the `(key, fd)` pairs `fill` pushes, each
    /// fd under its key (what [`WaitSet::ready_now`] reports).
    pub fn sync(&mut self, set: &mut WaitSet, fill: impl FnOnce(&mut Vec<(u64, RawFd)>)) {
        self.live.clear();
        fill(&mut self.live);
        self.live.sort_unstable();
        let live = &self.live;
        self.watched.retain(|w| {
            let keep = live.binary_search(w).is_ok();
            if !keep {
                set.remove(w.1);
            }
            keep
        });
        for &l in live.iter() {
            if let Err(at) = self.watched.binary_search(&l) {
                if set.add_keyed(l.1, l.0).is_ok() {
                    self.watched.insert(at, l);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wakes_on_a_readable_fd_and_on_the_notifier_and_times_out_otherwise() {
        let mut set = WaitSet::new().unwrap();
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: fresh descriptors we own.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        set.add(r.as_raw_fd()).unwrap();
        let t0 = std::time::Instant::now();
        assert_eq!(set.wait(Duration::from_micros(2500)), 0);
        assert!(t0.elapsed() >= std::time::Duration::from_micros(2500));
        // SAFETY: writes one byte from a valid buffer to our pipe.
        assert_eq!(unsafe { libc::write(w.as_raw_fd(), b"x".as_ptr().cast(), 1) }, 1);
        assert_eq!(set.wait(Duration::from_millis(5000)), 1);
        set.remove(r.as_raw_fd());
        let n = set.notifier();
        let h = std::thread::spawn(move || n.signal());
        assert_eq!(set.wait(Duration::from_millis(5000)), 1);
        h.join().unwrap();
        // notify() only signals a sleeper: here nobody sleeps.
        set.notifier().notify();
        assert_eq!(set.wait(Duration::from_millis(1)), 0);
        // A sleeper with work already handed over does not sleep at all.
        assert_eq!(set.wait_unless(Duration::from_millis(5000), || true), 1);
        // The notification was consumed: the next wait times out.
        assert_eq!(set.wait(Duration::from_millis(1)), 0);
    }

    #[test]
    fn a_watch_list_follows_the_live_links() {
        let mut set = WaitSet::new().unwrap();
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: fresh descriptors we own.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: writes one byte from a valid buffer to our pipe.
        assert_eq!(unsafe { libc::write(w.as_raw_fd(), b"x".as_ptr().cast(), 1) }, 1);
        let mut list = WatchList::new();
        list.sync(&mut set, |live| live.push((1, r.as_raw_fd())));
        assert_eq!(set.wait(Duration::from_millis(5000)), 1, "watched: readable");
        list.sync(&mut set, |_| {});
        assert_eq!(set.wait(Duration::from_millis(1)), 0, "link gone: no longer watched");
        // The same fd number under a new key (a new connection) is watched again.
        list.sync(&mut set, |live| live.push((2, r.as_raw_fd())));
        assert_eq!(set.wait(Duration::from_millis(5000)), 1);
        list.sync(&mut set, |live| live.push((2, r.as_raw_fd())));
        assert_eq!(set.wait(Duration::from_millis(5000)), 1, "a repeated sync keeps it");
    }
}
