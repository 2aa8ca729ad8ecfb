//! Proves the hot paths allocate nothing once warm: ring push/pop (single
//! and batched), timer insert/cancel/reschedule/pop, and idle steps.
//!
//! A counting global allocator counts per thread, so the test harness's own
//! threads cannot disturb the figures.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::thread;

use dataplane::idle::{IdleStrategy, Idler};
use dataplane::spsc;
use dataplane::time::Instant;
use dataplane::timer::TimerQueue;

struct CountingAllocator;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count_one() {
    // `try_with`: the slot may be gone while a thread is being torn down.
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

/// Allocations made by the current thread so far.
fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees carry over; counting touches only a
// const-initialised thread-local `Cell`, which never allocates.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: forwarded unchanged; the caller upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: forwarded unchanged.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_one();
        // SAFETY: forwarded unchanged; `ptr` came from this allocator, which
        // got it from `System`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged; `ptr` came from `System`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// Runs `f` and returns how many allocations the current thread made in it.
fn allocations_in(f: impl FnOnce()) -> u64 {
    let before = allocations();
    f();
    allocations() - before
}

#[test]
fn counting_allocator_sees_allocations() {
    assert!(allocations_in(|| drop(std::hint::black_box(vec![1u8; 16]))) >= 1);
}

#[test]
fn ring_operations_do_not_allocate() {
    let (mut tx, mut rx) = spsc::channel::<u64>(64);
    let mut sum = 0u64;
    let n = allocations_in(|| {
        for round in 0..1000u64 {
            for v in 0..17u64 {
                assert!(tx.try_push(round + v).is_ok());
            }
            assert_eq!(rx.try_pop(), Some(round));
            assert_eq!(rx.pop_batch(8, |v| sum += v - round), 8);
            assert_eq!(rx.pop_batch(64, |v| sum += v - round), 8);
            assert!(rx.is_empty() && !rx.is_abandoned() && tx.free_slots() == 64);
        }
    });
    assert_eq!(n, 0);
    assert_eq!(sum, 1000 * (1..17).sum::<u64>());
}

#[test]
fn ring_operations_across_threads_do_not_allocate() {
    const ITEMS: u64 = 100_000;
    let (mut tx, mut rx) = spsc::channel::<u64>(256);
    let consumer = thread::spawn(move || {
        let mut got = 0u64;
        let mut sum = 0u64;
        let n = allocations_in(|| {
            while got < ITEMS {
                let popped = rx.pop_batch(32, |v| sum += v) as u64;
                got += popped;
                if popped == 0 {
                    thread::yield_now();
                }
            }
        });
        (n, sum)
    });
    let produced = allocations_in(|| {
        let mut next = 0u64;
        while next < ITEMS {
            match tx.try_push(next) {
                Ok(()) => next += 1,
                Err(_) => thread::yield_now(),
            }
        }
    });
    let (consumed, sum) = consumer.join().expect("consumer panicked");
    assert_eq!((produced, consumed), (0, 0));
    assert_eq!(sum, ITEMS * (ITEMS - 1) / 2);
}

#[test]
fn timer_operations_do_not_allocate_once_warm() {
    const PEAK: usize = 4096;
    let mut timers = TimerQueue::with_capacity(PEAK);
    // Warm: reach the peak once so every slot and heap position exists.
    let handles: Vec<_> = (0..PEAK as u64).map(|i| timers.insert(Instant(i), i)).collect();
    for h in handles {
        assert!(timers.cancel(h).is_some());
    }
    let mut live = Vec::with_capacity(PEAK);
    let n = allocations_in(|| {
        for round in 0..20u64 {
            for i in 0..PEAK as u64 {
                live.push(timers.insert(Instant((i * 7919 + round) % 10_000), i));
            }
            for h in live.iter().step_by(3) {
                assert!(timers.reschedule(*h, Instant(20_000)));
            }
            for h in live.iter().skip(1).step_by(3) {
                assert!(timers.cancel(*h).is_some());
            }
            let mut fired = 0;
            while timers.pop_expired(Instant(30_000)).is_some() {
                fired += 1;
            }
            let cancelled = (PEAK - 1).div_ceil(3);
            assert_eq!(fired, PEAK - cancelled);
            live.clear();
        }
    });
    assert_eq!(n, 0);
}

#[test]
fn idle_steps_and_wakes_do_not_allocate() {
    let mut idler = Idler::new(IdleStrategy::SpinThenYield { spins: 4 });
    let waker = idler.waker();
    let n = allocations_in(|| {
        for _ in 0..100 {
            idler.idle(|| false);
            waker.wake();
        }
        idler.reset();
    });
    assert_eq!(n, 0);
}
