//! Side-by-side benchmark of SPSC queues: `rtrb` (the runtime's ring,
//! behind `dataplane::spsc`) vs `crossbeam_queue::ArrayQueue`.
//!
//! The project once carried its own rtrb-style ring, loom-checked; this
//! bench compared it with rtrb (0.88x rtrb's single-item and 0.96x its
//! batched throughput, equal round-trip latency: docs/decisions.md "SPSC
//! ring") and the hand-written ring was removed in favour of the crate.
//! The bench stays so that a ring replacing rtrb has to beat it here.
//!
//! * Throughput: a producer pinned to core 0 and a consumer pinned to core 1
//!   move `ITEMS` sequential `u64`s, one at a time and in batches of `BATCH`
//!   (ArrayQueue has no batch API, so it has no batched row).
//! * Round-trip latency: two pinned threads ping-pong one `u64` over two
//!   rings; p50/p99/p99.9 of the round trip from an HDR histogram.
//!
//! Each measurement runs `REPS` times, the implementations interleaved within
//! each repetition so drift hits all alike; the table shows medians.
//!
//! `cargo bench -p dataplane --bench rings` (env `RINGS_ITEMS`,
//! `RINGS_ROUNDS`, `RINGS_REPS` override the sizes).

use std::hint::{black_box, spin_loop};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Instant;

use crossbeam_queue::ArrayQueue;
use hdrhistogram::Histogram;

const CAPACITY: usize = 1024;
const BATCH: usize = 64;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Pins the calling thread, warning (once per thread) if that fails.
fn pin(core: usize) {
    if !core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
        eprintln!("warning: could not pin {:?} to core {core}", thread::current().name());
    }
}

/// The operations the benchmark needs from one queue implementation.
trait Queue: 'static {
    type Tx: Send + 'static;
    type Rx: Send + 'static;
    const NAME: &'static str;
    const BATCHED: bool;
    fn make(capacity: usize) -> (Self::Tx, Self::Rx);
    fn push(tx: &mut Self::Tx, v: u64) -> bool;
    fn pop(rx: &mut Self::Rx) -> Option<u64>;
    /// Pushes a prefix of `items`; returns its length.
    fn push_slice(tx: &mut Self::Tx, items: &[u64]) -> usize;
    /// Pops into a prefix of `out`; returns its length.
    fn pop_slice(rx: &mut Self::Rx, out: &mut [u64]) -> usize;
}

struct Rtrb;
impl Queue for Rtrb {
    type Tx = rtrb::Producer<u64>;
    type Rx = rtrb::Consumer<u64>;
    const NAME: &'static str = "rtrb 0.3";
    const BATCHED: bool = true;
    fn make(capacity: usize) -> (Self::Tx, Self::Rx) {
        rtrb::RingBuffer::new(capacity)
    }
    #[inline(always)]
    fn push(tx: &mut Self::Tx, v: u64) -> bool {
        tx.push(v).is_ok()
    }
    #[inline(always)]
    fn pop(rx: &mut Self::Rx) -> Option<u64> {
        rx.pop().ok()
    }
    #[inline(always)]
    fn push_slice(tx: &mut Self::Tx, items: &[u64]) -> usize {
        tx.push_partial_slice(items).0.len()
    }
    #[inline(always)]
    fn pop_slice(rx: &mut Self::Rx, out: &mut [u64]) -> usize {
        rx.pop_partial_slice(out).0.len()
    }
}

struct Crossbeam;
impl Queue for Crossbeam {
    type Tx = Arc<ArrayQueue<u64>>;
    type Rx = Arc<ArrayQueue<u64>>;
    const NAME: &'static str = "crossbeam ArrayQueue";
    const BATCHED: bool = false;
    fn make(capacity: usize) -> (Self::Tx, Self::Rx) {
        let q = Arc::new(ArrayQueue::new(capacity));
        (Arc::clone(&q), q)
    }
    #[inline(always)]
    fn push(tx: &mut Self::Tx, v: u64) -> bool {
        tx.push(v).is_ok()
    }
    #[inline(always)]
    fn pop(rx: &mut Self::Rx) -> Option<u64> {
        rx.pop()
    }
    fn push_slice(_: &mut Self::Tx, _: &[u64]) -> usize {
        unreachable!("ArrayQueue has no batch API")
    }
    fn pop_slice(_: &mut Self::Rx, _: &mut [u64]) -> usize {
        unreachable!("ArrayQueue has no batch API")
    }
}

/// Moves `0..items` from core 0 to core 1; returns items per second.
fn throughput<Q: Queue>(items: u64, batched: bool) -> f64 {
    let (mut tx, mut rx) = Q::make(CAPACITY);
    let start = Arc::new(Barrier::new(2));
    let producer_start = Arc::clone(&start);
    let producer = thread::Builder::new()
        .name("bench-producer".into())
        .spawn(move || {
            pin(0);
            producer_start.wait();
            if batched {
                let mut buf = [0u64; BATCH];
                let mut next = 0u64;
                while next < items {
                    let len = (items - next).min(BATCH as u64) as usize;
                    for (i, slot) in buf[..len].iter_mut().enumerate() {
                        *slot = next + i as u64;
                    }
                    let mut sent = 0;
                    while sent < len {
                        let n = Q::push_slice(&mut tx, &buf[sent..len]);
                        if n == 0 {
                            spin_loop();
                        }
                        sent += n;
                    }
                    next += len as u64;
                }
            } else {
                for v in 0..items {
                    while !Q::push(&mut tx, v) {
                        spin_loop();
                    }
                }
            }
            tx
        })
        .expect("spawn producer");
    let consumer = thread::Builder::new()
        .name("bench-consumer".into())
        .spawn(move || {
            pin(1);
            start.wait();
            let t0 = Instant::now();
            let mut sum = 0u64;
            let mut got = 0u64;
            if batched {
                let mut buf = [0u64; BATCH];
                while got < items {
                    let n = Q::pop_slice(&mut rx, &mut buf);
                    if n == 0 {
                        spin_loop();
                    }
                    for v in &buf[..n] {
                        sum = sum.wrapping_add(*v);
                    }
                    got += n as u64;
                }
            } else {
                while got < items {
                    match Q::pop(&mut rx) {
                        Some(v) => {
                            sum = sum.wrapping_add(v);
                            got += 1;
                        }
                        None => spin_loop(),
                    }
                }
            }
            let elapsed = t0.elapsed();
            (black_box(sum), elapsed)
        })
        .expect("spawn consumer");
    let (sum, elapsed) = consumer.join().expect("consumer panicked");
    drop(producer.join().expect("producer panicked"));
    assert_eq!(sum, items.wrapping_mul(items.wrapping_sub(1)) / 2, "{} lost items", Q::NAME);
    items as f64 / elapsed.as_secs_f64()
}

/// Ping-pongs `rounds` values between cores 0 and 1; returns round-trip
/// (p50, p99, p99.9) in nanoseconds.
fn round_trip<Q: Queue>(rounds: u64) -> (u64, u64, u64) {
    let (mut ping_tx, mut ping_rx) = Q::make(CAPACITY);
    let (mut pong_tx, mut pong_rx) = Q::make(CAPACITY);
    let warmup = rounds / 10;
    let echo = thread::Builder::new()
        .name("bench-echo".into())
        .spawn(move || {
            pin(1);
            for _ in 0..warmup + rounds {
                let v = loop {
                    match Q::pop(&mut ping_rx) {
                        Some(v) => break v,
                        None => spin_loop(),
                    }
                };
                while !Q::push(&mut pong_tx, v) {
                    spin_loop();
                }
            }
        })
        .expect("spawn echo");
    let timer = thread::Builder::new()
        .name("bench-pinger".into())
        .spawn(move || {
            pin(0);
            let mut hist = Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3).expect("bounds");
            for i in 0..warmup + rounds {
                let t0 = Instant::now();
                while !Q::push(&mut ping_tx, i) {
                    spin_loop();
                }
                let back = loop {
                    match Q::pop(&mut pong_rx) {
                        Some(v) => break v,
                        None => spin_loop(),
                    }
                };
                let rtt = t0.elapsed().as_nanos() as u64;
                assert_eq!(back, i);
                if i >= warmup {
                    hist.saturating_record(rtt.max(1));
                }
            }
            hist
        })
        .expect("spawn pinger");
    let hist = timer.join().expect("pinger panicked");
    echo.join().expect("echo panicked");
    (hist.value_at_quantile(0.50), hist.value_at_quantile(0.99), hist.value_at_quantile(0.999))
}

/// The 1-minute load average, to qualify the figures (other work on the
/// machine takes cores from the pinned threads).
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".to_string())
}

/// The median of a non-empty sample set (`dataplane::stats::median`).
fn median(v: &mut [f64]) -> f64 {
    dataplane::stats::median(v).expect("at least one repetition")
}

/// Per-implementation samples across repetitions.
#[derive(Default)]
struct Samples {
    single: Vec<f64>,
    batched: Vec<f64>,
    p50: Vec<f64>,
    p99: Vec<f64>,
    p999: Vec<f64>,
}

fn run_rep<Q: Queue>(s: &mut Samples, items: u64, rounds: u64) {
    // ArrayQueue is an order of magnitude slower; a quarter of the items
    // gives the same rate in a quarter of the time.
    let items = if Q::BATCHED { items } else { items / 4 };
    s.single.push(throughput::<Q>(items, false));
    if Q::BATCHED {
        s.batched.push(throughput::<Q>(items, true));
    }
    let (p50, p99, p999) = round_trip::<Q>(rounds);
    s.p50.push(p50 as f64);
    s.p99.push(p99 as f64);
    s.p999.push(p999 as f64);
}

fn main() {
    // `cargo bench` passes `--bench`; no other arguments are understood.
    let items = env_or("RINGS_ITEMS", 20_000_000);
    let rounds = env_or("RINGS_ROUNDS", 100_000);
    let reps = env_or("RINGS_REPS", 9).max(1) as usize;
    let cores = core_affinity::get_core_ids().map_or(0, |c| c.len());
    if cores < 2 {
        eprintln!("warning: {cores} usable cores; threads will share a core");
    }
    let wall = Instant::now();
    let load_before = load_average();
    let names = [Rtrb::NAME, Crossbeam::NAME];
    let mut samples: [Samples; 2] = Default::default();
    for rep in 0..reps {
        // Alternate the order so neither implementation always runs first.
        if rep % 2 == 0 {
            run_rep::<Rtrb>(&mut samples[0], items, rounds);
            run_rep::<Crossbeam>(&mut samples[1], items, rounds);
        } else {
            run_rep::<Crossbeam>(&mut samples[1], items, rounds);
            run_rep::<Rtrb>(&mut samples[0], items, rounds);
        }
        eprintln!("rep {}/{reps} done at {:.1?}", rep + 1, wall.elapsed());
        for (name, s) in names.iter().zip(&samples) {
            eprintln!(
                "  {name}: single {:.1} batched {:.1} Mitems/s, p50 {} ns",
                s.single[rep] / 1e6,
                s.batched.get(rep).map_or(0.0, |b| b / 1e6),
                s.p50[rep]
            );
        }
    }
    // Ratios of runs made back to back are steadier than ratios of medians
    // when other work shares the machine.
    let paired = |f: fn(&Samples) -> &Vec<f64>| {
        let mut r: Vec<f64> = f(&samples[0]).iter().zip(f(&samples[1])).map(|(a, b)| a / b).collect();
        median(&mut r)
    };
    let single_ratio = paired(|s| &s.single);
    let p50_ratio = paired(|s| &s.p50);
    println!();
    println!(
        "SPSC rings, u64 items, capacity {CAPACITY}, producer core 0 -> consumer core 1; \
         throughput {items} items (ArrayQueue {}; batch {BATCH}), latency {rounds} round \
         trips; median of {reps} runs",
        items / 4
    );
    println!();
    println!(
        "| queue | single Mitems/s | batched Mitems/s | RTT p50 ns | RTT p99 ns | RTT p99.9 ns |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, s) in names.iter().zip(samples.iter_mut()) {
        let single = median(&mut s.single) / 1e6;
        let batched = if s.batched.is_empty() {
            "n/a".to_string()
        } else {
            format!("{:.1}", median(&mut s.batched) / 1e6)
        };
        let (p50, p99, p999) = (median(&mut s.p50), median(&mut s.p99), median(&mut s.p999));
        println!("| {name} | {single:.1} | {batched} | {p50} | {p99} | {p999} |");
    }
    println!();
    println!(
        "rtrb / ArrayQueue, median of per-repetition ratios: single {single_ratio:.2}x \
         throughput (higher is better); p50 RTT {p50_ratio:.2}x (lower is better)"
    );
    println!(
        "wall time {:.1?}; 1-min load average {load_before} before, {} after",
        wall.elapsed(),
        load_average()
    );
}
