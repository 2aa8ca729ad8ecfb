//! How long a thread asleep in a [`WaitSet`] takes to run again after
//! another thread signals it: the floor under every lag that crosses a
//! sleeping thread (a plan handed from the ModelThread to the I/O thread,
//! a plan reaching a backend that waits for its links).
//!
//! A sleeper waits in `WaitSet::wait`; the signaller stamps the time, then
//! rings the set's eventfd through its `Notifier`; the sleeper records
//! `now - stamp` as soon as `wait` returns. Between signals the signaller
//! pauses 200-700 µs (seeded), so the sleeper is really asleep each time.
//! Three settings, one after the other in one run:
//! - `idle`: nothing else of ours runs;
//! - `busy`: one spinning thread per usable core competes (the cores a
//!   loaded host shares with peers and load generators);
//! - `spin`: for contrast, a sleeper that spins on the stamp instead of
//!   sleeping (no kernel wake-up: the cache-line handover alone), idle.
//!
//! ```text
//! cargo bench -p dataplane --bench wake            # WAKE_ROUNDS=N (default 20000)
//! ```
//!
//! Percentiles in µs per setting, with the load average before and after
//! (other jobs on the host change the figures; report it with them).

use std::hint::spin_loop;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

use dataplane::time::{Duration, MonotonicClock};
use dataplane::waitset::WaitSet;
use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

/// No stamp pending.
const NONE: u64 = 0;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").map_or_else(|_| "?".into(), |s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
}

/// Pauses the signaller (sleeping, not spinning: it must not hold a core
/// the sleeper might want).
fn pause(rng: &mut Xoshiro256PlusPlus) {
    thread::sleep(std::time::Duration::from_micros(rng.random_range(200..700)));
}

/// `rounds` wake-ups of a sleeper in a `WaitSet` (or a spinner, if `spin`).
fn measure(rounds: u64, spin: bool, seed: u64) -> Histogram<u64> {
    let clock = Arc::new(MonotonicClock::new());
    let stamp = Arc::new(AtomicU64::new(NONE));
    let mut set = WaitSet::new().expect("epoll and eventfd");
    let notifier = set.notifier();
    let hist = {
        let (clock, stamp) = (clock.clone(), stamp.clone());
        thread::spawn(move || {
            let mut h = Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3).expect("histogram bounds");
            let mut seen = 0;
            while seen < rounds {
                let at = if spin {
                    loop {
                        let s = stamp.load(Ordering::Acquire);
                        if s != NONE {
                            break s;
                        }
                        spin_loop();
                    }
                } else {
                    set.wait(Duration::from_millis(100));
                    match stamp.load(Ordering::Acquire) {
                        NONE => continue,
                        s => s,
                    }
                };
                let now = clock.now().as_nanos().max(1);
                stamp.store(NONE, Ordering::Release);
                let _ = h.record(now.saturating_sub(at).max(1));
                seen += 1;
            }
            h
        })
    };
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    for _ in 0..rounds {
        pause(&mut rng);
        // Waits out a wake-up still in flight (the sleeper clears the stamp).
        while stamp.load(Ordering::Acquire) != NONE {
            pause(&mut rng);
        }
        stamp.store(clock.now().as_nanos().max(1), Ordering::Release);
        notifier.signal();
    }
    hist.join().expect("sleeper thread")
}

fn main() {
    // `cargo bench` passes `--bench`; no other arguments are understood.
    let rounds = env_or("WAKE_ROUNDS", 20_000).max(1);
    let cores = core_affinity::get_core_ids().map_or(1, |c| c.len().max(1));
    println!("wake-up latency of a thread sleeping in a WaitSet, {rounds} signals per setting, {cores} usable cores");
    println!("load average before: {}", load_average());
    println!("| setting | p50 µs | p99 µs | p99.9 µs | max µs |");
    println!("|---|---:|---:|---:|---:|");
    let row = |name: &str, h: &Histogram<u64>| {
        let us = |q: f64| h.value_at_quantile(q) as f64 / 1e3;
        println!("| {name} | {:.1} | {:.1} | {:.1} | {:.1} |", us(0.5), us(0.99), us(0.999), h.max() as f64 / 1e3);
    };
    row("idle", &measure(rounds, false, 1));
    let stop = Arc::new(AtomicBool::new(false));
    let spinners: Vec<_> = (0..cores)
        .map(|_| {
            let stop = stop.clone();
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    spin_loop();
                }
            })
        })
        .collect();
    row(&format!("busy ({cores} spinning threads)"), &measure(rounds, false, 2));
    stop.store(true, Ordering::Relaxed);
    for s in spinners {
        s.join().expect("spinner thread");
    }
    row("spin (no sleep), idle", &measure(rounds, true, 3));
    println!("load average after: {}", load_average());
}
