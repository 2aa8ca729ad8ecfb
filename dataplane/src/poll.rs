//! A busy-poll loop on its own (optionally pinned) thread.
//!
//! [`spawn`] starts a named thread, pins it to a core if asked (a failed pin
//! is reported in [`PinStatus`], not fatal), and calls the body
//! `FnMut() -> usize` (the amount of work it did) until [`PollHandle::stop`].
//! Passes that did no work go through the configured [`IdleStrategy`].
//!
//! The loop counts passes and splits its wall time into *busy* (streaks of
//! passes that did work) and *idle* (everything else, including polling that
//! found nothing). It reads the clock only when a streak changes kind and
//! every [`FLUSH_EVERY`] passes, and publishes the counters to atomics that
//! [`PollHandle::counters`] reads while the loop runs: this is what a
//! thread's utilisation report uses.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};

use crate::idle::{IdleCounts, IdleStrategy, Idler, Waker};
use crate::time::Duration;

/// Passes between two counter publications within one streak (a power of
/// two).
pub const FLUSH_EVERY: u64 = 1024;

/// How to run a poll loop.
#[derive(Clone, Debug)]
pub struct PollConfig {
    /// Thread name (shows in `top -H`, debuggers and panics).
    pub name: String,
    /// Core to pin to, if any.
    pub core: Option<usize>,
    /// What to do on passes that find no work.
    pub idle: IdleStrategy,
}

impl PollConfig {
    /// An unpinned loop named `name` with the [`IdleStrategy::GENTLE`]
    /// back-off.
    pub fn new(name: impl Into<String>) -> Self {
        PollConfig { name: name.into(), core: None, idle: IdleStrategy::GENTLE }
    }

    /// Pins the loop to `core`.
    pub fn pinned(mut self, core: usize) -> Self {
        self.core = Some(core);
        self
    }

    /// Uses `idle` on passes without work.
    pub fn idle(mut self, idle: IdleStrategy) -> Self {
        self.idle = idle;
        self
    }
}

/// Whether the loop thread got the core it asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PinStatus {
    /// The thread has not tried yet.
    Pending,
    /// No core was requested.
    NotRequested,
    /// Pinned to this core.
    Pinned(usize),
    /// Pinning to this core failed; the loop runs unpinned.
    Failed(usize),
}

// 0 (the atomic's default) means pending.
const PIN_NOT_REQUESTED: u8 = 1;
const PIN_OK: u8 = 2;
const PIN_FAILED: u8 = 3;

/// A snapshot of a loop's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PollCounters {
    /// Calls of the body.
    pub iterations: u64,
    /// Calls that did work.
    pub busy_iterations: u64,
    /// Calls that did none.
    pub idle_iterations: u64,
    /// Sum of the work the body reported.
    pub work: u64,
    /// Wall time in busy streaks.
    pub busy_time: Duration,
    /// Wall time in idle streaks (polling that found nothing, spinning,
    /// yielding, parking).
    pub idle_time: Duration,
}

impl PollCounters {
    /// Busy time over total time, in `[0, 1]`; 0 before any time passed.
    pub fn utilisation(&self) -> f64 {
        let total = self.busy_time.as_nanos() as f64 + self.idle_time.as_nanos() as f64;
        if total == 0.0 {
            0.0
        } else {
            self.busy_time.as_nanos() as f64 / total
        }
    }
}

/// What a finished loop did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PollStats {
    /// Final counters.
    pub counters: PollCounters,
    /// What the idle strategy did.
    pub idle: IdleCounts,
    /// Whether the thread was pinned.
    pub pin: PinStatus,
}

/// Counters the loop thread writes (single writer, `Relaxed`) and anyone
/// reads.
#[derive(Debug, Default)]
struct Shared {
    stop: AtomicBool,
    pin: AtomicU8,
    pin_core: AtomicU64,
    iterations: AtomicU64,
    busy_iterations: AtomicU64,
    work: AtomicU64,
    busy_ns: AtomicU64,
    idle_ns: AtomicU64,
}

impl Shared {
    fn publish(&self, c: &PollCounters) {
        self.iterations.store(c.iterations, Ordering::Relaxed);
        self.busy_iterations.store(c.busy_iterations, Ordering::Relaxed);
        self.work.store(c.work, Ordering::Relaxed);
        self.busy_ns.store(c.busy_time.as_nanos(), Ordering::Relaxed);
        self.idle_ns.store(c.idle_time.as_nanos(), Ordering::Relaxed);
    }

    fn pin_status(&self) -> PinStatus {
        let core = self.pin_core.load(Ordering::Relaxed) as usize;
        match self.pin.load(Ordering::Acquire) {
            PIN_NOT_REQUESTED => PinStatus::NotRequested,
            PIN_OK => PinStatus::Pinned(core),
            PIN_FAILED => PinStatus::Failed(core),
            _ => PinStatus::Pending, // 0: the thread has not tried yet
        }
    }
}

/// Controls a running poll loop.
#[derive(Debug)]
pub struct PollHandle {
    shared: Arc<Shared>,
    waker: Waker,
    thread: JoinHandle<PollStats>,
}

impl PollHandle {
    /// Asks the loop to stop after its current pass (and wakes it if
    /// parked). Returns at once; [`join`](Self::join) waits.
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// Waits for the loop to end (it ends only after [`stop`](Self::stop) or
    /// a panic in the body) and returns its statistics, or the panic.
    pub fn join(self) -> thread::Result<PollStats> {
        self.thread.join()
    }

    /// [`stop`](Self::stop), then [`join`](Self::join).
    pub fn stop_and_join(self) -> thread::Result<PollStats> {
        self.stop();
        self.join()
    }

    /// A waker for the loop: producers feeding it call [`Waker::wake`] after
    /// publishing work so a parked loop resumes at once.
    pub fn waker(&self) -> Waker {
        self.waker.clone()
    }

    /// The counters as last published by the loop (at most
    /// [`FLUSH_EVERY`] passes or one streak old).
    pub fn counters(&self) -> PollCounters {
        let s = &self.shared;
        let iterations = s.iterations.load(Ordering::Relaxed);
        let busy_iterations = s.busy_iterations.load(Ordering::Relaxed);
        PollCounters {
            iterations,
            busy_iterations,
            idle_iterations: iterations.saturating_sub(busy_iterations),
            work: s.work.load(Ordering::Relaxed),
            busy_time: Duration(s.busy_ns.load(Ordering::Relaxed)),
            idle_time: Duration(s.idle_ns.load(Ordering::Relaxed)),
        }
    }

    /// Whether the loop thread got its core (may still be
    /// [`PinStatus::Pending`] right after spawn).
    pub fn pin_status(&self) -> PinStatus {
        self.shared.pin_status()
    }

    /// The loop thread's name.
    pub fn name(&self) -> Option<&str> {
        self.thread.thread().name()
    }
}

/// Starts `body` in a loop on a new thread configured by `config`.
///
/// `body` returns how much work it did (0 = none). When it finds none and
/// the strategy is about to park, the loop calls `body` once more as the
/// recheck that makes [`Waker::wake`] reliable.
pub fn spawn<F>(config: PollConfig, body: F) -> io::Result<PollHandle>
where
    F: FnMut() -> usize + Send + 'static,
{
    let shared = Arc::new(Shared::default());
    let idler = Idler::new(config.idle);
    let waker = idler.waker();
    let loop_shared = Arc::clone(&shared);
    let core = config.core;
    let thread = thread::Builder::new()
        .name(config.name)
        .spawn(move || run(&loop_shared, core, idler, body))?;
    Ok(PollHandle { shared, waker, thread })
}

/// Wall time since the loop started, in nanoseconds.
struct Stopwatch(std::time::Instant);

impl Stopwatch {
    fn now_ns(&self) -> u64 {
        u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

fn run<F: FnMut() -> usize>(
    shared: &Shared,
    core: Option<usize>,
    mut idler: Idler,
    mut body: F,
) -> PollStats {
    pin(shared, core);
    let clock = Stopwatch(std::time::Instant::now());
    let mut c = PollCounters::default();
    let mut busy_streak = false;
    let mut streak_start = 0u64;
    // Closes the current streak at `now` and starts one of kind `busy`.
    let mut account = |c: &mut PollCounters, busy: bool, streak_busy: &mut bool, now: u64| {
        let elapsed = Duration(now.saturating_sub(streak_start));
        if *streak_busy {
            c.busy_time += elapsed;
        } else {
            c.idle_time += elapsed;
        }
        streak_start = now;
        *streak_busy = busy;
    };
    while !shared.stop.load(Ordering::Relaxed) {
        let mut work = body();
        c.iterations += 1;
        if work == 0 {
            if busy_streak {
                account(&mut c, false, &mut busy_streak, clock.now_ns());
                shared.publish(&c);
            }
            let mut rechecked = false;
            idler.idle(|| {
                rechecked = true;
                work = body();
                work > 0 || shared.stop.load(Ordering::Relaxed)
            });
            if rechecked {
                c.iterations += 1;
                if work == 0 {
                    c.idle_iterations += 1;
                }
            }
            c.idle_iterations += 1;
        }
        if work > 0 {
            c.busy_iterations += 1;
            c.work = c.work.saturating_add(work as u64);
            idler.reset();
            if !busy_streak {
                account(&mut c, true, &mut busy_streak, clock.now_ns());
                shared.publish(&c);
            }
        }
        if c.iterations & (FLUSH_EVERY - 1) == 0 {
            let kind = busy_streak;
            account(&mut c, kind, &mut busy_streak, clock.now_ns());
            shared.publish(&c);
        }
    }
    let kind = busy_streak;
    account(&mut c, kind, &mut busy_streak, clock.now_ns());
    shared.publish(&c);
    PollStats { counters: c, idle: idler.counts(), pin: shared.pin_status() }
}

fn pin(shared: &Shared, core: Option<usize>) {
    let status = match core {
        None => PIN_NOT_REQUESTED,
        Some(id) => {
            shared.pin_core.store(id as u64, Ordering::Relaxed);
            // core_affinity indexes a fixed-size CPU set and would panic on
            // ids past its end; those cores cannot exist anyway.
            let in_set = id < libc::CPU_SETSIZE as usize;
            if in_set && core_affinity::set_for_current(core_affinity::CoreId { id }) {
                PIN_OK
            } else {
                PIN_FAILED
            }
        }
    };
    shared.pin.store(status, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring;

    fn gentle() -> PollConfig {
        PollConfig::new("poll-test").idle(IdleStrategy::SpinThenPark {
            spins: 10,
            yields: 2,
            park: Duration::from_millis(5),
        })
    }

    #[test]
    fn loop_drains_a_ring_and_counts_its_work() {
        let (mut tx, mut rx) = ring::channel::<u64>(64);
        let sum = Arc::new(AtomicU64::new(0));
        let loop_sum = Arc::clone(&sum);
        let handle = spawn(gentle(), move || {
            rx.pop_batch(16, |v| {
                loop_sum.fetch_add(v, Ordering::Relaxed);
            })
        })
        .expect("spawn");
        assert_eq!(handle.name(), Some("poll-test"));
        let waker = handle.waker();
        let mut next = 1..=1000u64;
        let mut pending = next.next();
        while let Some(v) = pending {
            match tx.try_push(v) {
                Ok(()) => {
                    pending = next.next();
                    waker.wake();
                }
                Err(_) => thread::yield_now(),
            }
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while sum.load(Ordering::Relaxed) != 500_500 {
            assert!(std::time::Instant::now() < deadline, "loop did not drain the ring");
            thread::yield_now();
        }
        let stats = handle.stop_and_join().expect("loop panicked");
        let c = stats.counters;
        assert_eq!(c.work, 1000);
        assert!(c.busy_iterations >= 1000 / 16);
        assert_eq!(c.iterations, c.busy_iterations + c.idle_iterations);
        assert_eq!(stats.pin, PinStatus::NotRequested);
        assert!((0.0..=1.0).contains(&c.utilisation()));
    }

    #[test]
    fn stop_wakes_a_parked_loop() {
        // Parks of an hour: the join returns only because stop() wakes it.
        let config = PollConfig::new("parked").idle(IdleStrategy::SpinThenPark {
            spins: 0,
            yields: 0,
            park: Duration::from_millis(3_600_000),
        });
        let handle = spawn(config, || 0).expect("spawn");
        let waker = handle.waker();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !waker.is_sleeping() {
            assert!(std::time::Instant::now() < deadline, "loop never parked");
            thread::yield_now();
        }
        let stats = handle.stop_and_join().expect("loop panicked");
        assert_eq!(stats.counters.work, 0);
        assert_eq!(stats.counters.busy_iterations, 0);
        assert!(stats.idle.parks >= 1);
    }

    #[test]
    fn pinning_reports_its_outcome() {
        let handle = spawn(gentle().pinned(0), || 0).expect("spawn");
        let stats = handle.stop_and_join().expect("loop panicked");
        // Core 0 exists on every machine, but containers may forbid it.
        assert!(matches!(stats.pin, PinStatus::Pinned(0) | PinStatus::Failed(0)), "{stats:?}");
        for absent in [1000, 1 << 20] {
            let handle = spawn(gentle().pinned(absent), || 0).expect("spawn");
            let stats = handle.stop_and_join().expect("loop panicked");
            assert_eq!(stats.pin, PinStatus::Failed(absent));
        }
    }

    #[test]
    fn a_panicking_body_surfaces_in_join() {
        let handle = spawn(gentle(), || panic!("body failed")).expect("spawn");
        assert!(handle.join().is_err());
    }
}
