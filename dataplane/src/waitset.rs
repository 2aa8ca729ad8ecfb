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
    /// The timer's armed expiry (CLOCK_MONOTONIC ns; None: disarmed or
    /// fired). A sleep re-arms only when its deadline differs: arming and
    /// disarming around every sleep were two `timerfd_settime` calls per
    /// wake-up (29k/s in a daemon at 1 M tasks/s over shm, 2026-11-29).
    armed: Option<u64>,
    events: Vec<libc::epoll_event>,
    /// The callers' tokens the last [`wait`](Self::wait) found ready,
    /// handed out by the next [`ready_now`](Self::ready_now) instead of a
    /// second `epoll_wait` right after the wake-up (when the wait's buffer
    /// held every ready fd).
    woke: Vec<u64>,
    /// `woke` holds a wait's answer not handed out yet.
    woke_fresh: bool,
    /// For [`ready_now`](Self::ready_now) (sized once, at first use).
    ready: Vec<libc::epoll_event>,
}

/// At most this many fds per [`WaitSet::ready_now`] (level-triggered: the
/// rest come first at the next call).
const READY_BATCH: usize = 1024;

/// At most this many fds per [`WaitSet::wait`].
const WAIT_BATCH: usize = 64;

/// A sleep keeps the timer armed for an earlier expiry when that expiry is
/// at most this much before its own deadline (the loop wakes that much
/// early, finds its deadline not due, and spins or sleeps the rest),
/// instead of a `timerfd_settime` per sleep.
const REARM_BELOW: Duration = Duration::from_micros(10);

/// Whether a timer armed to expire at `armed` (if at all) serves a sleep
/// until `deadline` (all CLOCK_MONOTONIC ns): it has not fired by `now`,
/// and it expires at most [`REARM_BELOW`] before the deadline, never after.
fn keeps_armed(armed: Option<u64>, now: u64, deadline: u64) -> bool {
    armed.is_some_and(|at| at > now && at <= deadline && deadline - at <= REARM_BELOW.as_nanos())
}

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
            armed: None,
            events: vec![libc::epoll_event { events: 0, u64: 0 }; WAIT_BATCH],
            woke: Vec::with_capacity(WAIT_BATCH),
            woke_fresh: false,
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
        if std::mem::take(&mut self.woke_fresh) {
            // The wait that just ended asked the kernel already.
            out.extend_from_slice(&self.woke);
            return;
        }
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
        let mut timer_fired = false;
        out.extend(self.ready[..n as usize].iter().map(|e| e.u64).filter(|&t| {
            timer_fired |= t == TIMER_TOKEN;
            t != NOTIFY_TOKEN && t != TIMER_TOKEN
        }));
        if timer_fired {
            // An expiry armed for an earlier sleep passed while awake:
            // reset it here, or the next sleep would end at once.
            self.reset_timer();
        }
    }

    /// Reads the fired timer (resetting its readiness) and notes it
    /// disarmed.
    fn reset_timer(&mut self) {
        self.armed = None;
        let mut count: u64 = 0;
        // SAFETY: reads 8 bytes into a valid u64 from our nonblocking
        // timerfd (EAGAIN is harmless).
        let _ = unsafe {
            libc::read(self.timer.as_raw_fd(), (&mut count as *mut u64).cast(), std::mem::size_of::<u64>())
        };
    }

    /// Arms the timer to expire `timeout` from now, unless it is armed
    /// already for an expiry at most [`REARM_BELOW`] before that.
    fn arm_timer(&mut self, timeout: Duration) {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `ts` is a valid timespec; CLOCK_MONOTONIC always exists.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        let now = (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64);
        let deadline = now.saturating_add(timeout.as_nanos());
        if keeps_armed(self.armed, now, deadline) {
            return;
        }
        let spec = libc::itimerspec {
            it_interval: libc::timespec { tv_sec: 0, tv_nsec: 0 },
            it_value: libc::timespec {
                tv_sec: (deadline / 1_000_000_000) as libc::time_t,
                tv_nsec: (deadline % 1_000_000_000) as libc::c_long,
            },
        };
        // SAFETY: `spec` is a valid itimerspec; a null old-value pointer is
        // allowed; `self.timer` is our timerfd.
        let r = unsafe {
            libc::timerfd_settime(self.timer.as_raw_fd(), libc::TFD_TIMER_ABSTIME, &spec, std::ptr::null_mut())
        };
        self.armed = (r == 0).then_some(deadline);
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
        self.arm_timer(timeout);
        // SAFETY: `events` is a valid buffer of `len` epoll_events.
        let n = unsafe {
            libc::epoll_wait(
                self.ep.as_raw_fd(),
                self.events.as_mut_ptr(),
                self.events.len() as i32,
                -1,
            )
        };
        self.woke.clear();
        if n <= 0 {
            return 0;
        }
        let mut ready = 0;
        let mut timer_fired = false;
        for i in 0..n as usize {
            match self.events[i].u64 {
                NOTIFY_TOKEN => {
                    ready += 1;
                    let mut count: u64 = 0;
                    // SAFETY: reads 8 bytes into a valid u64 from our
                    // nonblocking eventfd (resets it; EAGAIN is harmless).
                    let _ = unsafe {
                        libc::read(self.event.as_raw_fd(), (&mut count as *mut u64).cast(), std::mem::size_of::<u64>())
                    };
                }
                TIMER_TOKEN => timer_fired = true,
                token => {
                    ready += 1;
                    self.woke.push(token);
                }
            }
        }
        if timer_fired {
            self.reset_timer();
        }
        // Only a complete answer stands in for the next `ready_now`: with
        // the buffer full, more fds may be ready, and a pass that reads
        // only some of them could judge the rest silent (their messages
        // unread) when its liveness check runs.
        self.woke_fresh = (n as usize) < self.events.len();
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
    /// Idle passes that spun instead of sleeping, the deadline being
    /// nearer than [`SLEEP_ABOVE`].
    pub timer_spins: u64,
}

/// Below this much time to the next deadline an idle pass spins: a sleep
/// ends [`WAKE_EARLY`] before the deadline, and the two context switches
/// around it cost several microseconds of CPU themselves.
pub const SLEEP_ABOVE: Duration = Duration::from_micros(30);

/// A sleep's timer is set this much before the caller's deadline: a
/// timerfd expiry has no timer slack, but the wake-up reaches user space
/// about 15 us after it on the project's VMs (p50 14-15 us, p90 15.5 us,
/// `epoll_wait` on an absolute timerfd, 2,000 sleeps, amd-vm under load 12,
/// 2026-11-29). Why not 50 us as before: every pass from the wake-up to the
/// deadline is spun (a full poll pass each), ~35 us of CPU per sleep that
/// the timer ends.
pub const WAKE_EARLY: Duration = Duration::from_micros(20);

impl IdleWait {
    /// Idling per `strategy` on a fresh set.
    pub fn new(strategy: IdleStrategy) -> io::Result<IdleWait> {
        Ok(IdleWait {
            strategy,
            step: 0,
            set: WaitSet::new()?,
            sleeps: 0,
            timer_spins: 0,
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
                    self.timer_spins += 1;
                    std::hint::spin_loop();
                } else {
                    self.sleeps += 1;
                    // Wake a little early (the timer's wake-up comes
                    // about WAKE_EARLY late): the loop then spins to the
                    // deadline.
                    let t = cap.min(budget.saturating_sub(WAKE_EARLY));
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
    fn a_sleep_keeps_the_timer_only_when_it_expires_a_little_before_its_deadline() {
        let us = |n: u64| n * 1000;
        // Never armed, or fired already: arm.
        assert!(!keeps_armed(None, us(0), us(500)));
        assert!(!keeps_armed(Some(us(100)), us(100), us(500)));
        // Expiring after the deadline would oversleep: arm.
        assert!(!keeps_armed(Some(us(501)), us(0), us(500)));
        // Far earlier than the deadline (a pass and a second sleep each
        // time): arm.
        assert!(!keeps_armed(Some(us(400)), us(0), us(500)));
        // At the deadline or just before it: keep.
        assert!(keeps_armed(Some(us(500)), us(0), us(500)));
        assert!(keeps_armed(Some(us(500) - REARM_BELOW.as_nanos()), us(0), us(500)));
    }

    #[test]
    fn a_wake_up_hands_its_ready_fds_to_the_next_ready_now_and_a_stale_timer_ends_no_sleep() {
        let mut set = WaitSet::new().unwrap();
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: fresh descriptors we own.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        set.add_keyed(r.as_raw_fd(), 7).unwrap();
        // SAFETY: writes one byte from a valid buffer to our pipe.
        assert_eq!(unsafe { libc::write(w.as_raw_fd(), b"x".as_ptr().cast(), 1) }, 1);
        // The timer is armed 20 ms out; the byte ends the sleep at once.
        let t0 = std::time::Instant::now();
        assert_eq!(set.wait(Duration::from_millis(20)), 1);
        let mut out = Vec::new();
        set.ready_now(&mut out);
        assert_eq!(out, [7], "the wait's answer");
        let mut byte = [0u8; 1];
        // SAFETY: reads one byte into a valid buffer from our pipe.
        assert_eq!(unsafe { libc::read(r.as_raw_fd(), byte.as_mut_ptr().cast(), 1) }, 1);
        out.clear();
        set.ready_now(&mut out);
        assert!(out.is_empty(), "asked the kernel again: nothing readable now");
        // The 20 ms expiry passes while the owner is awake (polling as a
        // busy loop does); a poll resets it, so a later sleep lasts.
        while set.armed.is_some() {
            assert!(t0.elapsed() < std::time::Duration::from_secs(30), "the timer never fired");
            set.ready_now(&mut out);
            std::thread::yield_now();
        }
        assert!(t0.elapsed() >= std::time::Duration::from_millis(20));
        let t1 = std::time::Instant::now();
        assert_eq!(set.wait(Duration::from_millis(5)), 0);
        assert!(t1.elapsed() >= std::time::Duration::from_millis(5), "{:?}", t1.elapsed());
        // A shorter sleep than the armed one re-arms (no oversleep) and
        // the notifier still ends a sleep.
        let n = set.notifier();
        let h = std::thread::spawn(move || n.signal());
        assert_eq!(set.wait(Duration::from_millis(5000)), 1);
        h.join().unwrap();
        let t2 = std::time::Instant::now();
        assert_eq!(set.wait(Duration::from_millis(2)), 0);
        let slept = t2.elapsed();
        assert!(slept >= std::time::Duration::from_millis(2) && slept < std::time::Duration::from_millis(4000), "{slept:?}");
    }

    #[test]
    fn after_a_wake_up_with_more_ready_fds_than_its_buffer_the_next_ready_now_reports_them_all() {
        let mut set = WaitSet::new().unwrap();
        let mut pipes = Vec::new();
        for token in 0..WAIT_BATCH as u64 + 6 {
            let mut fds = [0; 2];
            // SAFETY: `fds` has room for the two descriptors.
            assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
            // SAFETY: fresh descriptors we own.
            let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
            // SAFETY: writes one byte from a valid buffer to our pipe.
            assert_eq!(unsafe { libc::write(w.as_raw_fd(), b"x".as_ptr().cast(), 1) }, 1);
            set.add_keyed(r.as_raw_fd(), token).unwrap();
            pipes.push((r, w));
        }
        assert_eq!(set.wait(Duration::from_millis(5000)), WAIT_BATCH, "a full buffer");
        let mut out = Vec::new();
        set.ready_now(&mut out);
        out.sort_unstable();
        assert_eq!(out, (0..WAIT_BATCH as u64 + 6).collect::<Vec<_>>());
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
