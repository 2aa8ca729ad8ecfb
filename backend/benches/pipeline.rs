//! Batch pipeline overhead: from the scheduler sending a plan to it
//! receiving `BatchDone`, with a zero-latency emulated model (`l(b) = 0`),
//! so the figure is the worker's own cost: plan decode, the incast of
//! READs, submission, one inline `Completion` per task to the frontend,
//! and `BatchDone`.
//!
//! One process: the worker and the scheduler end busy-poll on the main
//! thread; the frontend (memory owner, completion receiver) runs on its
//! own thread and blocks in `Connection::wait` when it has nothing to do. Figures are medians over RUNS runs of the per-run
//! median (and p99) of ITERS batches.
//! Run: `cargo bench -p backend --bench pipeline`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use backend::exec::ExecModel;
use backend::{BatchWorker, EmulatedExecutor, WorkerConfig};
use dataplane::mem::{Access, Region};
use dataplane::stats::{median, percentile_of};
use dataplane::time::{Duration, MonotonicClock};
use dataplane::transport::shm::ShmDomain;
use dataplane::transport::tcp::TcpDomain;
use dataplane::transport::{Connection, Domain, Listener};
use dataplane::wire::{self, BatchPlanHead, BatchTask, Message};
use scheduler::profile::LatencyProfile;

const RUNS: usize = 5;
const ITERS: usize = 400;
const WARMUP: usize = 40;
const T: Duration = Duration::from_millis(10_000);

/// One run: returns (p50, p99) of plan -> BatchDone in microseconds.
fn run<D: Domain>(
    dom: &dyn Fn() -> D,
    region: &dyn Fn(usize) -> Arc<Region>,
    batch: usize,
    input: u32,
) -> (f64, f64) {
    let fe_dom = dom();
    let be_dom = dom();
    let sched_dom = dom();
    let inputs = region(batch * input as usize);
    for k in 0..batch {
        let bytes: Vec<u8> = (0..input).map(|j| (j as usize * 31 + k) as u8).collect();
        inputs
            .write_at((k * input as usize) as u64, &bytes)
            .unwrap();
    }
    let reg = fe_dom.register(&inputs, Access::REMOTE_READ).unwrap();
    let mut fl = fe_dom.listen("").unwrap();
    let mut sl = sched_dom.listen("").unwrap();
    let (fa, sa) = (fl.local_addr(), sl.local_addr());
    let (mut fe_conn, mut sched, be_fe, be_sched) = std::thread::scope(|s| {
        let a = s.spawn(move || (fl.accept(T).unwrap(), sl.accept(T).unwrap()));
        let c1 = be_dom.connect(&fa, T).unwrap();
        let c2 = be_dom.connect(&sa, T).unwrap();
        let (mut x, y) = a.join().unwrap();
        // The frontend side serves the backend's READs (it registered).
        x.allow_remote_reads();
        (x, y, c1, c2)
    });
    let cfg = WorkerConfig {
        max_batch: 32,
        input_slot: input,
        output_slot: 64,
        batch_slots: 4,
        max_frontends: 4,
        control_delay: Duration::ZERO,
        fetch_grace: Duration::from_millis(1_000),
        report_capacity: 0,
        start_when_ready: false,
    };
    let staging = Region::anonymous(cfg.staging_bytes() as usize).unwrap();
    let staging_reg = be_dom.register(&staging, Access::LOCAL_WRITE).unwrap();
    let models = vec![ExecModel {
        profile: LatencyProfile::linear(0.0, 0.0, 64).unwrap(),
        output_len: 64,
    }];
    let exec = EmulatedExecutor::new(staging, 1, 32, models);
    let mut worker = BatchWorker::new(cfg, exec, staging_reg, be_sched).unwrap();
    worker.add_frontend(1, be_fe).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let frontend = std::thread::spawn(move || {
        let mut buf = vec![0u8; wire::MAX_MESSAGE_LEN];
        let mut n = 0u64;
        while !stop2.load(Ordering::Relaxed) {
            while let Ok(Some(_)) = fe_conn.try_recv(&mut buf) {
                n += 1;
            }
            // Block in the kernel until bytes arrive (READ requests on tcp,
            // completions on both): on a 2-core box a second spinning
            // thread would mostly measure CPU contention.
            let _ = fe_conn.wait(Duration::from_millis(1));
        }
        n
    });

    let tasks: Vec<BatchTask> = (0..batch)
        .map(|k| BatchTask {
            task_id: k as u64,
            frontend_id: 1,
            queued_us: 0,
            input: reg.remote_ref((k * input as usize) as u64, input).unwrap(),
            capability: Default::default(),
        })
        .collect();
    let clock = MonotonicClock::new();
    let mut plan = vec![0u8; wire::MAX_MESSAGE_LEN];
    let mut rx = vec![0u8; wire::MAX_MESSAGE_LEN];
    let mut lat = Vec::with_capacity(ITERS);
    for i in 0..WARMUP + ITERS {
        let head = BatchPlanHead {
            batch_id: i as u64,
            exec_in_ns: 0,
            model_id: 0,
            gpu_id: 0,
            count: 0,
            run_ns: 0,
            epoch: 0,
        };
        let n = wire::encode_batch_plan(&mut plan, &head, &tasks).unwrap();
        let t0 = std::time::Instant::now();
        sched.send(&plan[..n]).unwrap();
        'wait: loop {
            worker.poll(clock.now()).unwrap();
            while let Some(n) = sched.try_recv(&mut rx).unwrap() {
                if let Ok(Message::BatchDone(_)) = wire::decode(&rx[..n]) {
                    break 'wait;
                }
            }
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(10),
                "batch stuck"
            );
        }
        if i >= WARMUP {
            lat.push(t0.elapsed().as_secs_f64() * 1e6);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let got = frontend.join().unwrap();
    assert!(
        got >= (ITERS * batch) as u64 / 2,
        "frontend saw its completions"
    );
    let p50 = percentile_of(&mut lat, 0.5).expect("batches");
    let p99 = percentile_of(&mut lat, 0.99).expect("batches");
    (p50, p99)
}

fn main() {
    let cases = [(1usize, 1024u32), (32, 1024), (32, 16 * 1024)];
    println!("batch pipeline, plan -> BatchDone, l(b)=0, median of {RUNS} runs x {ITERS} batches");
    println!(
        "{:<10} {:>6} {:>8} {:>10} {:>10} {:>12}",
        "transport", "batch", "input", "p50 us", "p99 us", "p50 us/task"
    );
    for (batch, input) in cases {
        let mut r50 = Vec::new();
        let mut r99 = Vec::new();
        for _ in 0..RUNS {
            let (a, b) = run(
                &|| ShmDomain::new().unwrap(),
                &|n| Region::shared(n).unwrap(),
                batch,
                input,
            );
            r50.push(a);
            r99.push(b);
        }
        let (m50, m99) = (median(&mut r50).expect("runs"), median(&mut r99).expect("runs"));
        println!(
            "{:<10} {:>6} {:>8} {:>10.1} {:>10.1} {:>12.2}",
            "shm",
            batch,
            input,
            m50,
            m99,
            m50 / batch as f64
        );
        let mut r50 = Vec::new();
        let mut r99 = Vec::new();
        let tcp = TcpDomain::uring().is_ok();
        for _ in 0..RUNS {
            let (a, b) = run(
                &|| {
                    TcpDomain::uring()
                        .or_else(|_| TcpDomain::blocking())
                        .unwrap()
                },
                &|n| Region::anonymous(n).unwrap(),
                batch,
                input,
            );
            r50.push(a);
            r99.push(b);
        }
        let (m50, m99) = (median(&mut r50).expect("runs"), median(&mut r99).expect("runs"));
        let name = if tcp { "tcp-uring" } else { "tcp-block" };
        println!(
            "{:<10} {:>6} {:>8} {:>10.1} {:>10.1} {:>12.2}",
            name,
            batch,
            input,
            m50,
            m99,
            m50 / batch as f64
        );
    }
}
