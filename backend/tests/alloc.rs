//! Once warm, a batch (plan in, READs, execution, completions, BatchDone)
//! allocates nothing in the worker. One thread drives the frontend, the
//! scheduler end and the worker over shm (READs complete inside
//! `post_reads`, so no serving thread is needed) on a virtual clock.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use backend::{BatchWorker, EmulatedExecutor};
use common::*;
use dataplane::mem::{Access, Region};
use dataplane::time::{Duration, Instant};
use dataplane::transport::{Connection, Domain, Listener};
use dataplane::wire::{self, BatchPlanHead, BatchTask, Message, TaskStatus};

struct Counting;
static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn a_warm_batch_allocates_nothing() {
    let net = Shm;
    let fe_dom = net.domain();
    let be_dom = net.domain();
    let sched_dom = net.domain();
    let inputs = net.region(64 * SLOT);
    let mut rng = Rng::new(7);
    let mut input_bytes = Vec::new();
    for k in 0..64 {
        let len = 1 + rng.next() as usize % SLOT;
        let b: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        inputs.write_at((k * SLOT) as u64, &b).unwrap();
        input_bytes.push(b);
    }
    let reg = fe_dom.register(&inputs, Access::REMOTE_READ).unwrap();
    let t = Duration::from_millis(10_000);
    let mut fl = fe_dom.listen("").unwrap();
    let mut sl = sched_dom.listen("").unwrap();
    let (fa, sa) = (fl.local_addr(), sl.local_addr());
    let (mut fe_conn, mut sched, be_fe, be_sched) = std::thread::scope(|s| {
        let a = s.spawn(move || (fl.accept(t).unwrap(), sl.accept(t).unwrap()));
        let c1 = be_dom.connect(&fa, t).unwrap();
        let c2 = be_dom.connect(&sa, t).unwrap();
        let (mut x, y) = a.join().unwrap();
        // The frontend side serves the backend's READs (it registered).
        x.allow_remote_reads();
        (x, y, c1, c2)
    });
    let cfg = config();
    let staging = Region::anonymous(cfg.staging_bytes() as usize).unwrap();
    let staging_reg = be_dom.register(&staging, Access::LOCAL_WRITE).unwrap();
    let exec = EmulatedExecutor::new(staging, 1, cfg.max_batch, models());
    let mut worker = BatchWorker::new(cfg, exec, staging_reg, be_sched).unwrap();
    worker.add_frontend(1, be_fe).unwrap();

    let mut plan_buf = vec![0u8; wire::MAX_MESSAGE_LEN];
    let mut rx = vec![0u8; wire::MAX_MESSAGE_LEN];
    let mut now = Instant::from_nanos(1);
    let tasks: Vec<BatchTask> = (0..32)
        .map(|k| BatchTask {
            task_id: k as u64,
            frontend_id: 1,
            queued_us: 0,
            input: reg
                .remote_ref((k * SLOT) as u64, input_bytes[k].len() as u32)
                .unwrap(),
            capability: Default::default(),
        })
        .collect();
    const WARM: u64 = 40;
    const MEASURED: u64 = 200;
    let mut ok_seen = 0u64;
    for b in 0..WARM + MEASURED {
        if b == WARM {
            COUNTING.store(true, Ordering::SeqCst);
        }
        let size = 1 + (b as usize * 7) % 32;
        let head = BatchPlanHead {
            batch_id: b,
            exec_in_ns: 1_000_000,
            model_id: (b % 2) as u32,
            gpu_id: 0,
            count: 0,
            run_ns: 0,
            epoch: 0,
        };
        let n = wire::encode_batch_plan(&mut plan_buf, &head, &tasks[..size]).unwrap();
        sched.send(&plan_buf[..n]).unwrap();
        let mut done = false;
        let mut completions = 0;
        for _ in 0..100_000 {
            worker.poll(now).unwrap();
            while let Some(n) = sched.try_recv(&mut rx).unwrap() {
                if let Ok(Message::BatchDone(d)) = wire::decode(&rx[..n]) {
                    assert_eq!(d.batch_id, b);
                    done = true;
                }
            }
            while let Some(n) = fe_conn.try_recv(&mut rx).unwrap() {
                if let Ok(Message::Completion(h, _)) = wire::decode(&rx[..n]) {
                    assert_eq!(h.status, TaskStatus::Ok as u32);
                    completions += 1;
                }
            }
            if done && completions == size {
                break;
            }
            if !worker.io_pending() && worker.batches_in_flight() > 0 {
                if let Some(w) = worker.next_wakeup() {
                    now = now.max(w);
                }
            }
        }
        assert!(done && completions == size, "batch {b} not finished");
        ok_seen += completions as u64;
        now += Duration::from_millis(1);
    }
    let allocs = ALLOCS.load(Ordering::SeqCst);
    // The counter works: one deliberate allocation is seen.
    let probe = std::hint::black_box(Box::new(1u64));
    assert_eq!(
        ALLOCS.load(Ordering::SeqCst),
        allocs + 1,
        "counting allocator is live"
    );
    drop(probe);
    COUNTING.store(false, Ordering::SeqCst);
    assert!(ok_seen > 0);
    assert_eq!(allocs, 0, "{allocs} allocations in {MEASURED} warm batches");
}
