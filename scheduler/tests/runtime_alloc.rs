//! Zero allocations per request on the runtime's hot path once warm, and
//! none per batch on the emulated GPUs, measured with a counting global
//! allocator (one test function, so no other test allocates meanwhile).

use dataplane::time::{Duration, Instant};
use scheduler::deferred::CoreConfig;
use scheduler::gpu::GpuSet;
use scheduler::runtime::{build, RuntimeConfig, Topology};
use scheduler::types::Request;
use scheduler::zoo::ModelSpec;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn no_allocation_per_request_once_warm() {
    let models: Vec<ModelSpec> = (0..20).map(|i| ModelSpec::linear(&format!("m{i}"), 1.0, 5.0, 30.0).unwrap()).collect();
    let cfg = RuntimeConfig { models, gpus: 64, model_threads: 1, core: CoreConfig::default(), ring_capacity: 4096 };
    let Topology { mut model_workers, mut rank, mut gpus, mut ingress, .. } = build(&cfg);
    // 20 models x 2000 rps, uniform spacing, driven on a manual clock.
    let gap = Duration::from_micros(25);
    let mut now = Instant::ZERO;
    let mut id = 0u64;
    let mut run = |n: u64, now: &mut Instant| {
        for _ in 0..n {
            *now += gap;
            let model = (id % 20) as u32;
            let req = Request::new(id, model, *now, *now + Duration::from_millis(30));
            id += 1;
            while ingress[0].try_push(req).is_err() {
                model_workers[0].step(*now);
            }
            model_workers[0].step(*now);
            rank.step(*now);
            model_workers[0].step(*now);
            gpus.step(*now);
        }
    };
    run(200_000, &mut now);
    let before = ALLOCS.load(Ordering::Relaxed);
    run(200_000, &mut now);
    let allocs = ALLOCS.load(Ordering::Relaxed) - before;
    let batches = model_workers[0].stats.batches;
    assert!(batches > 10_000, "the workload dispatches batches: {batches}");
    assert_eq!(allocs, 0, "allocations while handling 200k requests once warm");
    gpu_set_allocates_nothing_per_batch_once_warm();
}

/// Batches queued several deep on every device, completed and preempted:
/// once each device's queue has grown to its peak, nothing allocates.
fn gpu_set_allocates_nothing_per_batch_once_warm() {
    let mut gpus: GpuSet<[u64; 4]> = GpuSet::new(16);
    let l = Duration::from_micros(700);
    let mut now = Instant::ZERO;
    let mut round = |rounds: u64, now: &mut Instant| {
        for r in 0..rounds {
            for d in 0..16 {
                for k in 0..6 {
                    let _ = gpus.submit(d, *now, l, [r, u64::from(d), k, 0]);
                }
            }
            if r % 7 == 0 {
                let _ = gpus.preempt(3, *now + Duration::from_micros(100));
            }
            *now += Duration::from_millis(5);
            while gpus.pop_finished(*now).is_some() {}
        }
    };
    round(100, &mut now);
    let before = ALLOCS.load(Ordering::Relaxed);
    round(10_000, &mut now);
    assert_eq!(ALLOCS.load(Ordering::Relaxed) - before, 0, "allocations on the emulated GPUs once warm");
}
