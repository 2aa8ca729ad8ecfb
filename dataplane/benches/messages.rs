//! Control messages over one shm connection (two busy-polling threads):
//! the round trip of a heartbeat, and a one-way stream of heartbeats
//! flushed after every message (the frontends' coalesced `Tasks` carry 1-2
//! tasks each at 1 M tasks/s) and in batches of 16 (`send_batched` +
//! `flush_batched`), with the CPU time each side spends per message (thread
//! CPU clock, less disturbed by a shared machine than wall time); then the
//! bench-cluster frontends' unit, a 16-task `Tasks` message, sent with
//! `send` one at a time (as they do) and with `send_batched` + a flush.
//! Median of RUNS runs.
//! Run: `cargo bench -p dataplane --bench messages`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use dataplane::time::Duration;
use dataplane::stats::median;
use dataplane::transport::shm::ShmDomain;
use dataplane::transport::{Connection, Domain, Error, Listener};
use dataplane::wire::{self, Heartbeat, Task, TaskBatcher};

const RUNS: usize = 5;
const PINGS: usize = 20_000;
const STREAM: usize = 400_000;
const T: Duration = Duration::from_millis(10_000);

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn pair() -> (<ShmDomain as Domain>::Conn, <ShmDomain as Domain>::Conn) {
    let (a, b) = (ShmDomain::new().expect("domain"), ShmDomain::new().expect("domain"));
    let mut l = a.listen("").expect("listen");
    let addr = l.local_addr();
    std::thread::scope(|s| {
        let acc = s.spawn(move || l.accept(T).expect("accept"));
        let c = b.connect(&addr, T).expect("connect");
        (acc.join().expect("accept"), c)
    })
}

fn recv_one<C: Connection>(c: &mut C, buf: &mut [u8]) -> usize {
    loop {
        if let Some(n) = c.try_recv(buf).expect("recv") {
            return n;
        }
        std::hint::spin_loop();
    }
}

/// Median round trip, µs.
fn ping_pong() -> f64 {
    let (mut server, mut client) = pair();
    let stop = AtomicBool::new(false);
    let mut msg = [0u8; 64];
    let n = wire::encode(&mut msg, &Heartbeat { seq: 1, role: 4, id: 2 }).expect("encode");
    let mut rtts = Vec::with_capacity(PINGS);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut buf = [0u8; 256];
            while !stop.load(Ordering::Relaxed) {
                if let Some(k) = server.try_recv(&mut buf).expect("recv") {
                    server.send(&buf[..k]).expect("echo");
                }
            }
        });
        let mut buf = [0u8; 256];
        for _ in 0..PINGS {
            let t = Instant::now();
            client.send(&msg[..n]).expect("send");
            recv_one(&mut client, &mut buf);
            rtts.push(t.elapsed().as_nanos() as f64 / 1e3);
        }
        stop.store(true, Ordering::Relaxed);
    });
    median(&mut rtts).expect("rounds")
}

fn heartbeat() -> Vec<u8> {
    let mut msg = vec![0u8; 64];
    let n = wire::encode(&mut msg, &Heartbeat { seq: 1, role: 4, id: 2 }).expect("encode");
    msg.truncate(n);
    msg
}

/// A `Tasks` message of 16 tasks (the bench-cluster frontends' default batch).
fn tasks16() -> Vec<u8> {
    let mut b = TaskBatcher::new(16);
    for i in 0..16u64 {
        let t = Task { task_id: i, budget_ns: 50_000_000, model_id: (i % 20) as u32, frontend_id: 1, ..Default::default() };
        b.push(&t).expect("push");
    }
    b.take().expect("batch").to_vec()
}

/// (messages/s, sender CPU ns/msg, receiver CPU ns/msg). `batch` 0: each
/// message with `send`; otherwise `send_batched`, flushed every `batch`.
fn stream(batch: usize, msg: &[u8]) -> (f64, f64, f64) {
    let (mut rx, mut tx) = pair();
    let t = Instant::now();
    let (send_cpu, recv_cpu) = std::thread::scope(|s| {
        let r = s.spawn(|| {
            let c0 = thread_cpu_ns();
            let mut buf = vec![0u8; wire::MAX_MESSAGE_LEN];
            for _ in 0..STREAM {
                recv_one(&mut rx, &mut buf);
            }
            thread_cpu_ns() - c0
        });
        let c0 = thread_cpu_ns();
        let mut sent = 0;
        while batch == 0 && sent < STREAM {
            match tx.send(msg) {
                Ok(()) => sent += 1,
                Err(Error::QueueFull) => {
                    let _ = tx.progress();
                    std::hint::spin_loop();
                }
                Err(e) => panic!("send: {e}"),
            }
        }
        while sent < STREAM {
            let mut k = 0;
            while k < batch && sent < STREAM {
                match tx.send_batched(msg) {
                    Ok(()) => {
                        sent += 1;
                        k += 1;
                    }
                    Err(Error::QueueFull) => {
                        let _ = tx.progress();
                        std::hint::spin_loop();
                    }
                    Err(e) => panic!("send: {e}"),
                }
            }
            tx.flush_batched().expect("flush");
        }
        while tx.progress().is_ok() && rx_pending(&r) {
            std::hint::spin_loop();
        }
        let send = thread_cpu_ns() - c0;
        (send, r.join().expect("receiver"))
    });
    let secs = t.elapsed().as_secs_f64();
    let m = STREAM as f64;
    (m / secs, send_cpu as f64 / m, recv_cpu as f64 / m)
}

fn rx_pending<T>(h: &std::thread::ScopedJoinHandle<'_, T>) -> bool {
    !h.is_finished()
}

fn main() {
    let rtt = median(&mut (0..RUNS).map(|_| ping_pong()).collect::<Vec<_>>()).expect("runs");
    let len = wire::encode(&mut [0u8; 64], &Heartbeat::default()).expect("encode");
    println!("## shm control messages ({len} bytes; median of {RUNS} runs)\n");
    println!("heartbeat round trip p50: {rtt:.2} us\n");
    println!("| flush every | M msg/s | sender CPU ns/msg | receiver CPU ns/msg |\n|---:|---:|---:|---:|");
    let (hb, tasks) = (heartbeat(), tasks16());
    for batch in [1, 16] {
        row(&batch.to_string(), batch, &hb);
    }
    println!("\n## 16-task `Tasks` messages ({} bytes)\n", tasks.len());
    println!("| sent with | M msg/s | sender CPU ns/msg | receiver CPU ns/msg |\n|---:|---:|---:|---:|");
    row("send", 0, &tasks);
    row("send_batched, flush every 1", 1, &tasks);
    let one = |m: &[u8]| median(&mut (0..RUNS).map(|_| one_thread(m)).collect::<Vec<_>>()).expect("runs");
    println!("\none thread, send 32 then receive 32, CPU ns per message: heartbeat {:.0}, 16-task Tasks {:.0}", one(&hb), one(&tasks));
}

/// CPU ns per message of `send` + `try_recv` on one thread (send 32, then
/// receive them): unlike the two-thread stream, not disturbed by the
/// other thread being descheduled on a shared machine.
fn one_thread(msg: &[u8]) -> f64 {
    let (mut rx, mut tx) = pair();
    let mut buf = vec![0u8; wire::MAX_MESSAGE_LEN];
    let c0 = thread_cpu_ns();
    for _ in 0..STREAM / 32 {
        for _ in 0..32 {
            tx.send(msg).expect("send");
        }
        for _ in 0..32 {
            recv_one(&mut rx, &mut buf);
        }
    }
    (thread_cpu_ns() - c0) as f64 / (STREAM / 32 * 32) as f64
}

fn row(label: &str, batch: usize, msg: &[u8]) {
    let runs: Vec<_> = (0..RUNS).map(|_| stream(batch, msg)).collect();
    let pick = |f: fn(&(f64, f64, f64)) -> f64| median(&mut runs.iter().map(f).collect::<Vec<_>>()).expect("runs");
    println!("| {label} | {:.2} | {:.0} | {:.0} |", pick(|r| r.0) / 1e6, pick(|r| r.1), pick(|r| r.2));
}
