//! What a busy-poll loop does when a pass found no work.
//!
//! Production threads spin ([`IdleStrategy::Spin`]): lowest latency, one core
//! burnt. Tests and small machines back off instead: spin a little, then
//! yield, then park with a timeout ([`IdleStrategy::SpinThenPark`]). Any work
//! found resets the back-off ([`Idler::reset`]).
//!
//! A parked thread can be woken early through a [`Waker`]: the producer that
//! just published work calls [`Waker::wake`]. The fast path of `wake` (nobody
//! asleep) is a fence and a load of a read-mostly flag; it takes no lock and
//! makes no system call.
//!
//! # Why parking cannot miss a wake-up
//!
//! Before parking, the idle thread sets its `sleeping` flag, issues a
//! `SeqCst` fence, and *rechecks for work* (the `recheck` closure given to
//! [`Idler::idle`]). A producer publishes its work, issues a `SeqCst` fence,
//! then reads `sleeping`. The two fences guarantee that either the recheck
//! sees the work or the producer sees the flag and unparks the thread (an
//! unpark that comes before the park makes the park return at once).

use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::{self, Thread};

use crate::time::Duration;

/// Below this much time to the next deadline, [`Idler::idle_within`] spins:
/// parking and waking costs tens of microseconds of timer slack.
pub const SPIN_BELOW: Duration = Duration::from_micros(50);

/// How a polling loop waits when it finds no work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdleStrategy {
    /// Busy-spin forever (with a CPU spin hint). For pinned production
    /// threads that own a core.
    Spin,
    /// Spin `spins` times, then yield the CPU on every further idle pass.
    SpinThenYield {
        /// Idle passes that spin before the first yield.
        spins: u32,
    },
    /// Spin `spins` times, yield `yields` times, then park for at most
    /// `park` per idle pass until work comes or a [`Waker`] wakes the thread.
    SpinThenPark {
        /// Idle passes that spin.
        spins: u32,
        /// Idle passes that yield, after the spins.
        yields: u32,
        /// Longest single park; bounds the latency of a missed wake (there is
        /// none with correct use, see the module docs) and of stop requests
        /// that do not wake.
        park: Duration,
    },
}

impl IdleStrategy {
    /// A back-off suited to tests and shared machines: 100 spins, 10 yields,
    /// then parks of at most 1 ms.
    pub const GENTLE: IdleStrategy =
        IdleStrategy::SpinThenPark { spins: 100, yields: 10, park: Duration::from_millis(1) };

    /// The action for the `step`-th consecutive idle pass (0-based).
    pub fn action(&self, step: u64) -> IdleAction {
        match *self {
            IdleStrategy::Spin => IdleAction::Spin,
            IdleStrategy::SpinThenYield { spins } => {
                if step < u64::from(spins) {
                    IdleAction::Spin
                } else {
                    IdleAction::Yield
                }
            }
            IdleStrategy::SpinThenPark { spins, yields, park } => {
                if step < u64::from(spins) {
                    IdleAction::Spin
                } else if step < u64::from(spins) + u64::from(yields) {
                    IdleAction::Yield
                } else {
                    IdleAction::Park(park)
                }
            }
        }
    }
}

/// One idle step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdleAction {
    /// A CPU spin-loop hint.
    Spin,
    /// `std::thread::yield_now`.
    Yield,
    /// Park the thread for at most this long.
    Park(Duration),
}

/// What an [`Idler`] did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IdleCounts {
    /// Spin steps.
    pub spins: u64,
    /// Yield steps.
    pub yields: u64,
    /// Parks actually entered.
    pub parks: u64,
    /// Parks skipped because the recheck found work.
    pub parks_avoided: u64,
    /// Parks ended by a [`Waker`] (the rest timed out or woke spuriously).
    pub woken: u64,
}

/// The state shared between an [`Idler`] and its [`Waker`]s.
#[derive(Debug)]
struct ParkState {
    /// True while the idle thread is parked or about to park.
    sleeping: AtomicBool,
    /// The thread that parks; set the first time it does.
    thread: OnceLock<Thread>,
}

/// Runs an [`IdleStrategy`] for one thread: counts consecutive idle passes
/// and performs the matching action.
///
/// An `Idler` may be created on one thread and moved to another; it binds to
/// the thread that first parks with it, and must keep parking on that thread.
#[derive(Debug)]
pub struct Idler {
    strategy: IdleStrategy,
    /// Consecutive idle passes since the last reset.
    step: u64,
    counts: IdleCounts,
    park: Arc<ParkState>,
}

impl Idler {
    /// An idler for `strategy`.
    pub fn new(strategy: IdleStrategy) -> Self {
        Idler {
            strategy,
            step: 0,
            counts: IdleCounts::default(),
            park: Arc::new(ParkState { sleeping: AtomicBool::new(false), thread: OnceLock::new() }),
        }
    }

    /// The strategy this idler runs.
    pub fn strategy(&self) -> IdleStrategy {
        self.strategy
    }

    /// A handle other threads use to end a park early.
    pub fn waker(&self) -> Waker {
        Waker { park: Arc::clone(&self.park) }
    }

    /// Work was found: start the back-off from the beginning.
    #[inline]
    pub fn reset(&mut self) {
        self.step = 0;
    }

    /// What the next [`idle`](Self::idle) call will do.
    pub fn next_action(&self) -> IdleAction {
        self.strategy.action(self.step)
    }

    /// Counts of what this idler did.
    pub fn counts(&self) -> IdleCounts {
        self.counts
    }

    /// Performs one idle step after a pass that found no work, and returns
    /// the action taken.
    ///
    /// `recheck` is called only before a park, after the thread has declared
    /// itself asleep; it must return true when work is available (it may also
    /// do that work). When it does, the park is skipped and the back-off
    /// resets. Passing `|| false` is allowed but lets a wake-up that races
    /// with the park wait for the park timeout.
    #[inline]
    pub fn idle(&mut self, recheck: impl FnOnce() -> bool) -> IdleAction {
        let action = self.next_action();
        self.perform(action, recheck)
    }

    /// Like [`idle`](Self::idle), for a loop whose next timer is `budget`
    /// away: a park never outlasts the budget, and when the budget is below
    /// [`SPIN_BELOW`] the pass spins instead (a yield or a park could hand
    /// the CPU away for longer than that).
    #[inline]
    pub fn idle_within(&mut self, budget: Duration, recheck: impl FnOnce() -> bool) -> IdleAction {
        if budget < SPIN_BELOW {
            self.counts.spins += 1;
            std::hint::spin_loop();
            return IdleAction::Spin;
        }
        let action = match self.next_action() {
            IdleAction::Park(t) => IdleAction::Park(t.min(budget - Duration::from_nanos(SPIN_BELOW.as_nanos() / 2))),
            other => other,
        };
        self.perform(action, recheck)
    }

    /// Takes one idle step of kind `action`.
    #[inline]
    fn perform(&mut self, action: IdleAction, recheck: impl FnOnce() -> bool) -> IdleAction {
        self.step = self.step.saturating_add(1);
        match action {
            IdleAction::Spin => {
                self.counts.spins += 1;
                std::hint::spin_loop();
            }
            IdleAction::Yield => {
                self.counts.yields += 1;
                thread::yield_now();
            }
            IdleAction::Park(timeout) => self.park(timeout, recheck),
        }
        action
    }

    #[cold]
    fn park(&mut self, timeout: Duration, recheck: impl FnOnce() -> bool) {
        let me = self.park.thread.get_or_init(thread::current);
        debug_assert_eq!(
            me.id(),
            thread::current().id(),
            "an Idler must park on the thread that first parked with it"
        );
        // Release: a waker that reads `true` (Acquire) also sees `thread` set.
        self.park.sleeping.store(true, Ordering::Release);
        // Pairs with the fence in `Waker::wake`: either the recheck sees the
        // producer's work or the producer sees `sleeping`.
        fence(Ordering::SeqCst);
        if recheck() {
            self.park.sleeping.store(false, Ordering::Relaxed);
            self.counts.parks_avoided += 1;
            self.step = 0;
            return;
        }
        self.counts.parks += 1;
        thread::park_timeout(std::time::Duration::from_nanos(timeout.as_nanos()));
        // A waker that took the flag (swapped it to false) unparked us.
        if !self.park.sleeping.swap(false, Ordering::Acquire) {
            self.counts.woken += 1;
        }
    }
}

/// Wakes the thread parked by an [`Idler`]. Cheap to clone; `Send + Sync`.
#[derive(Clone, Debug)]
pub struct Waker {
    park: Arc<ParkState>,
}

impl Waker {
    /// Call after publishing work for the idle thread. Unparks it if it is
    /// parked or about to park; otherwise does nothing but a fence and a
    /// load.
    #[inline]
    pub fn wake(&self) {
        // Pairs with the fence in `Idler::park`.
        fence(Ordering::SeqCst);
        if self.park.sleeping.load(Ordering::Relaxed) {
            self.wake_slow();
        }
    }

    #[cold]
    fn wake_slow(&self) {
        // Only the waker that flips the flag unparks: one system call per
        // park, however many producers wake at once.
        if self.park.sleeping.swap(false, Ordering::Acquire) {
            if let Some(thread) = self.park.thread.get() {
                thread.unpark();
            }
        }
    }

    /// True while the idle thread is parked or about to park.
    pub fn is_sleeping(&self) -> bool {
        self.park.sleeping.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn strategies_step_through_their_phases() {
        let s = IdleStrategy::SpinThenPark { spins: 2, yields: 1, park: Duration::from_micros(5) };
        let steps: Vec<_> = (0..5).map(|i| s.action(i)).collect();
        assert_eq!(steps, [
            IdleAction::Spin,
            IdleAction::Spin,
            IdleAction::Yield,
            IdleAction::Park(Duration::from_micros(5)),
            IdleAction::Park(Duration::from_micros(5)),
        ]);
        let y = IdleStrategy::SpinThenYield { spins: 1 };
        assert_eq!((y.action(0), y.action(1), y.action(99)), (
            IdleAction::Spin,
            IdleAction::Yield,
            IdleAction::Yield
        ));
        assert_eq!(IdleStrategy::Spin.action(u64::MAX), IdleAction::Spin);
    }

    #[test]
    fn work_resets_the_back_off() {
        let mut idler = Idler::new(IdleStrategy::SpinThenYield { spins: 1 });
        assert_eq!(idler.idle(|| false), IdleAction::Spin);
        assert_eq!(idler.idle(|| false), IdleAction::Yield);
        idler.reset();
        assert_eq!(idler.next_action(), IdleAction::Spin);
        assert_eq!(idler.counts(), IdleCounts { spins: 1, yields: 1, ..IdleCounts::default() });
    }

    #[test]
    fn recheck_that_finds_work_skips_the_park() {
        // A park of an hour would hang the test if the recheck were ignored.
        let mut idler = Idler::new(IdleStrategy::SpinThenPark {
            spins: 0,
            yields: 0,
            park: Duration::from_millis(3_600_000),
        });
        idler.idle(|| true);
        assert_eq!(idler.counts().parks_avoided, 1);
        assert_eq!(idler.counts().parks, 0);
        assert!(!idler.waker().is_sleeping());
    }

    #[test]
    fn idle_within_never_parks_past_the_budget() {
        let mut idler = Idler::new(IdleStrategy::SpinThenPark { spins: 0, yields: 0, park: Duration::from_millis(1000) });
        // Closer than SPIN_BELOW: spin, whatever the strategy says.
        assert_eq!(idler.idle_within(Duration::from_micros(10), || true), IdleAction::Spin);
        // Further: the strategy's park, cut to the budget (the recheck says
        // work is there, so the park itself is skipped).
        match idler.idle_within(Duration::from_millis(2), || true) {
            IdleAction::Park(t) => assert!(t < Duration::from_millis(2), "{t:?}"),
            other => panic!("expected a bounded park, got {other:?}"),
        }
        assert_eq!(idler.counts().parks_avoided, 1);
    }

    #[test]
    fn wake_without_a_sleeper_is_a_no_op() {
        let idler = Idler::new(IdleStrategy::GENTLE);
        idler.waker().wake();
        assert!(!idler.waker().is_sleeping());
    }

    #[test]
    fn a_waker_unparks_a_parked_thread() {
        // Parks are long (10 s), so the loop below ends promptly only
        // through the waker; the counts prove which way each park ended.
        let strategy =
            IdleStrategy::SpinThenPark { spins: 0, yields: 0, park: Duration::from_millis(10_000) };
        let mut idler = Idler::new(strategy);
        let waker = idler.waker();
        let go = Arc::new(AtomicBool::new(false));
        let go2 = Arc::clone(&go);
        let sleeper = thread::spawn(move || {
            while !go2.load(Ordering::Acquire) {
                idler.idle(|| go2.load(Ordering::Acquire));
            }
            idler.counts()
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !waker.is_sleeping() {
            assert!(std::time::Instant::now() < deadline, "sleeper never parked");
            thread::yield_now();
        }
        go.store(true, Ordering::Release);
        waker.wake();
        let counts = sleeper.join().expect("sleeper panicked");
        assert!(counts.woken >= 1, "{counts:?}");
    }

    #[test]
    fn racing_wakes_are_never_lost() {
        // Ping-pong 500 rounds between two parking threads. Each side
        // publishes, then wakes; the other rechecks before parking. A lost
        // wake-up would stall a round for the 60 s park timeout, far beyond
        // what 500 rounds take even on a loaded machine, so the bounded run
        // time is the check.
        const ROUNDS: u64 = 500;
        let strategy =
            IdleStrategy::SpinThenPark { spins: 10, yields: 2, park: Duration::from_millis(60_000) };
        let ball = Arc::new(AtomicU64::new(0));
        let mut a_idler = Idler::new(strategy);
        let mut b_idler = Idler::new(strategy);
        let (a_waker, b_waker) = (a_idler.waker(), b_idler.waker());
        let b_ball = Arc::clone(&ball);
        let b = thread::spawn(move || {
            for round in 0..ROUNDS {
                // Wait for the odd value 2*round+1, then answer.
                let want = 2 * round + 1;
                while b_ball.load(Ordering::Acquire) != want {
                    b_idler.idle(|| b_ball.load(Ordering::Acquire) == want);
                }
                b_idler.reset();
                b_ball.store(want + 1, Ordering::Release);
                a_waker.wake();
            }
            b_idler.counts()
        });
        let start = std::time::Instant::now();
        for round in 0..ROUNDS {
            ball.store(2 * round + 1, Ordering::Release);
            b_waker.wake();
            let want = 2 * round + 2;
            while ball.load(Ordering::Acquire) != want {
                a_idler.idle(|| ball.load(Ordering::Acquire) == want);
            }
            a_idler.reset();
        }
        let b_counts = b.join().expect("answering thread panicked");
        assert!(
            start.elapsed() < std::time::Duration::from_secs(50),
            "a wake-up was lost: {:?} / {b_counts:?}",
            a_idler.counts()
        );
    }
}
