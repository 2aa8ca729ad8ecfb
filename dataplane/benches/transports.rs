//! READ latency of the software transports side by side (shm, tcp on
//! io_uring, tcp on blocking std::net sockets) for 64 B, 4 KiB and 150 KiB,
//! and shm copy bandwidth next to a plain `copy_from_slice`.
//!
//! Every figure is the median over RUNS runs; within a run, one connection
//! does ITERS back-to-back READs (post, then busy-poll the completion), and
//! the memory owner busy-polls its connection on its own thread (tcp).
//! Run: `cargo bench -p dataplane --bench transports`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use dataplane::mem::{Access, Region};
use dataplane::stats::median;
use dataplane::time::Duration;
use dataplane::transport::shm::ShmDomain;
use dataplane::transport::tcp::{Engine, TcpConfig, TcpDomain};
use dataplane::transport::{Completion, Connection, Domain, Listener, ReadOp};
use hdrhistogram::Histogram;

const RUNS: usize = 5;
const ITERS: usize = 4000;
const WARMUP: usize = 300;
const SIZES: [u32; 3] = [64, 4096, 150 * 1024];
const T: Duration = Duration::from_millis(10_000);

#[derive(Clone, Copy, Default)]
struct Figures {
    p50: f64,
    p99: f64,
    p999: f64,
}

fn read_once<C: Connection>(c: &mut C, op: &ReadOp, comps: &mut [Completion]) {
    c.post_read(op).expect("post");
    loop {
        if c.poll_completions(comps).expect("poll") == 1 {
            assert_eq!(comps[0].status, Ok(()));
            return;
        }
        std::hint::spin_loop();
    }
}

/// One run per call: a fresh pair, WARMUP + ITERS READs of each size.
fn run<D: Domain>(
    owner_dom: D,
    reader_dom: D,
    region: &dyn Fn(usize) -> Arc<Region>,
    owner_polls: bool,
) -> Vec<Figures> {
    let mut l = owner_dom.listen("").expect("listen");
    let addr = l.local_addr();
    let (mut owner, mut reader) = std::thread::scope(|s| {
        let a = s.spawn(move || l.accept(T).expect("accept"));
        let c = reader_dom.connect(&addr, T).expect("connect");
        (a.join().expect("accept"), c)
    });
    let src = region(1 << 20);
    let dst = region(1 << 20);
    src.write_at(0, &vec![7u8; 1 << 20]).unwrap();
    let sreg = owner_dom.register(&src, Access::REMOTE_READ).unwrap();
    let dreg = reader_dom.register(&dst, Access::LOCAL_WRITE).unwrap();
    let stop = AtomicBool::new(false);
    let mut out = Vec::new();
    std::thread::scope(|s| {
        if owner_polls {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    let _ = owner.progress();
                    std::hint::spin_loop();
                }
            });
        }
        let mut comps = [Completion::default(); 4];
        for &len in &SIZES {
            let op = ReadOp {
                wr_id: 1,
                remote: sreg.remote_ref(0, len).unwrap(),
                local: dreg.local_ref(0, len).unwrap(),
            };
            for _ in 0..WARMUP {
                read_once(&mut reader, &op, &mut comps);
            }
            let mut h = Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3).unwrap();
            for _ in 0..ITERS {
                let t = Instant::now();
                read_once(&mut reader, &op, &mut comps);
                h.saturating_record(t.elapsed().as_nanos() as u64);
            }
            out.push(Figures {
                p50: h.value_at_quantile(0.5) as f64 / 1e3,
                p99: h.value_at_quantile(0.99) as f64 / 1e3,
                p999: h.value_at_quantile(0.999) as f64 / 1e3,
            });
        }
        stop.store(true, Ordering::Relaxed);
    });
    out
}

fn bandwidth() -> (f64, f64) {
    const LEN: usize = 4 << 20;
    const REPS: usize = 50;
    let od = ShmDomain::new().unwrap();
    let rd = ShmDomain::new().unwrap();
    let mut l = od.listen("").unwrap();
    let addr = l.local_addr();
    let (_owner, mut reader) = std::thread::scope(|s| {
        let a = s.spawn(move || l.accept(T).unwrap());
        let c = rd.connect(&addr, T).unwrap();
        (a.join().unwrap(), c)
    });
    let src = Region::shared(LEN).unwrap();
    let dst = Region::shared(LEN).unwrap();
    src.write_at(0, &vec![3u8; LEN]).unwrap();
    let sreg = od.register(&src, Access::REMOTE_READ).unwrap();
    let dreg = rd.register(&dst, Access::LOCAL_WRITE).unwrap();
    let op = ReadOp {
        wr_id: 1,
        remote: sreg.remote_ref(0, LEN as u32).unwrap(),
        local: dreg.local_ref(0, LEN as u32).unwrap(),
    };
    let a = vec![3u8; LEN];
    let mut b = vec![0u8; LEN];
    let mut comps = [Completion::default(); 4];
    let (mut shm, mut cpy) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        read_once(&mut reader, &op, &mut comps);
        let t = Instant::now();
        for _ in 0..REPS {
            read_once(&mut reader, &op, &mut comps);
        }
        shm.push((LEN * REPS) as f64 / t.elapsed().as_secs_f64() / 1e9);
        b.copy_from_slice(&a);
        let t = Instant::now();
        for _ in 0..REPS {
            b.copy_from_slice(std::hint::black_box(&a));
            std::hint::black_box(&mut b);
        }
        cpy.push((LEN * REPS) as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    (median(&mut shm).expect("runs"), median(&mut cpy).expect("runs"))
}

fn main() {
    let started = Instant::now();
    let uring_ok = TcpDomain::uring().is_ok();
    let mut names = vec!["shm", "tcp-blocking"];
    if uring_ok {
        names.insert(1, "tcp-uring");
    } else {
        println!("io_uring unavailable here: tcp-uring skipped");
    }
    // all[name][run][size]
    let mut all: Vec<Vec<Vec<Figures>>> = vec![Vec::new(); names.len()];
    for _ in 0..RUNS {
        // Interleave transports inside each run so drift hits all alike.
        for (k, name) in names.iter().enumerate() {
            let figs = match *name {
                "shm" => run(
                    ShmDomain::new().unwrap(),
                    ShmDomain::new().unwrap(),
                    &|n| Region::shared(n).unwrap(),
                    false,
                ),
                "tcp-uring" => {
                    let d = || TcpDomain::new(TcpConfig::new(Engine::Uring)).unwrap();
                    run(d(), d(), &|n| Region::anonymous(n).unwrap(), true)
                }
                _ => {
                    let d = || TcpDomain::new(TcpConfig::new(Engine::Blocking)).unwrap();
                    run(d(), d(), &|n| Region::anonymous(n).unwrap(), true)
                }
            };
            all[k].push(figs);
        }
    }
    println!("## READ latency, microseconds (median of {RUNS} runs x {ITERS} READs)\n");
    println!("| size | transport | p50 | p99 | p99.9 |");
    println!("|---:|---|---:|---:|---:|");
    for (si, size) in SIZES.iter().enumerate() {
        for (k, name) in names.iter().enumerate() {
            let m = |f: fn(&Figures) -> f64| median(&mut all[k].iter().map(|r| f(&r[si])).collect::<Vec<_>>()).expect("runs");
            println!(
                "| {} | {} | {:.1} | {:.1} | {:.1} |",
                human(*size),
                name,
                m(|f| f.p50),
                m(|f| f.p99),
                m(|f| f.p999)
            );
        }
    }
    let (shm, cpy) = bandwidth();
    println!("\n## shm copy bandwidth, 4 MiB READs (median of {RUNS} runs)\n");
    println!("| path | GB/s |\n|---|---:|\n| shm READ | {shm:.2} |\n| copy_from_slice | {cpy:.2} |\n| ratio shm/memcpy | {:.2} |", shm / cpy);
    println!(
        "\ntotal bench time: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

fn human(n: u32) -> String {
    if n >= 1024 {
        format!("{} KiB", n / 1024)
    } else {
        format!("{n} B")
    }
}
