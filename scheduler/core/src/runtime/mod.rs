//! The live scheduler runtime: N ModelThreads and one RankThread connected
//! by SPSC rings, driving the same sans-IO cores as the simulator.
//!
//! Topology (one ring per direction per ModelThread):
//!
//! ```text
//!  load generator ──ingress──▶ ModelThread i ──ToRank──▶ RankThread
//!                              ModelThread i ◀──Grant─── RankThread
//!                              ModelThread i ──Dispatch─▶ emulated GPUs
//! ```
//!
//! The load generator and the emulated GPUs share the RankThread's core:
//! RankThread work is per batch, so on a 2-core machine one core takes the
//! request line rate (a ModelThread) and the other everything else.
//!
//! [`run_live`] runs the workers on pinned threads against the monotonic
//! clock. [`run_lockstep`] runs the very same workers on one thread against a
//! manual clock, in the simulator's event order, so a recorded trace gives
//! exactly the simulator's decisions.

mod service;
mod workers;

pub use service::{Drive, PinnedConfig, PinnedScheduler, ThreadPlacement, INGRESS_BOUND, INGRESS_SLOTS};
pub use workers::{
    Dispatch, EmulatedGpus, LoadGen, ModelControl, ModelOp, ModelWorker, ModelWorkerStats, Outcome, RankControl, RankWorker, RankWorkerStats,
    RecordedBatch, Sink,
};

use crate::deferred::{CoreConfig, ModelThreadCore, RankCore};
use crate::sim::{next_event, Event, Workload};
use crate::types::ModelId;
use crate::zoo::ModelSpec;
use dataplane::idle::{IdleStrategy, Idler};
use dataplane::spsc::{channel, Producer};
use dataplane::time::{Duration, Instant, MonotonicClock};
use hdrhistogram::Histogram;
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use workers::BATCH;

/// Shape of the runtime.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// Models; id = index.
    pub models: Vec<ModelSpec>,
    /// Emulated GPUs.
    pub gpus: u32,
    /// ModelThreads (models are dealt round robin).
    pub model_threads: usize,
    /// Scheduling configuration.
    pub core: CoreConfig,
    /// Slots per ring.
    pub ring_capacity: usize,
}

/// All workers of one runtime, wired.
pub struct Topology {
    /// ModelThreads.
    pub model_workers: Vec<ModelWorker>,
    /// The RankThread.
    pub rank: RankWorker,
    /// The backends.
    pub gpus: EmulatedGpus,
    /// Producer side of each ModelThread's ingress ring.
    pub ingress: Vec<Producer<crate::types::Request>>,
    /// Model id -> ModelThread index.
    pub owner: Vec<u32>,
}

/// Builds the workers and rings for `cfg`.
pub fn build(cfg: &RuntimeConfig) -> Topology {
    let threads = cfg.model_threads.clamp(1, cfg.models.len().max(1));
    let owner: Vec<u32> = (0..cfg.models.len()).map(|m| (m % threads) as u32).collect();
    let cap = cfg.ring_capacity.max(2);
    let mut model_workers = Vec::with_capacity(threads);
    let mut to_rank_rx = Vec::new();
    let mut grants_tx = Vec::new();
    let mut dispatch_rx = Vec::new();
    let mut ingress = Vec::new();
    for t in 0..threads {
        let (ing_tx, ing_rx) = channel(cap);
        let (tr_tx, tr_rx) = channel(cap);
        let (gr_tx, gr_rx) = channel(cap);
        let (d_tx, d_rx) = channel(cap);
        let mine: Vec<(ModelId, ModelSpec)> = cfg
            .models
            .iter()
            .enumerate()
            .filter(|(m, _)| owner[*m] as usize == t)
            .map(|(m, s)| (m as ModelId, s.clone()))
            .collect();
        let core = ModelThreadCore::new(cfg.core, mine);
        model_workers.push(ModelWorker::new(core, vec![ing_rx], gr_rx, tr_tx, workers::Sink::Dispatches(d_tx), None));
        ingress.push(ing_tx);
        to_rank_rx.push(tr_rx);
        grants_tx.push(gr_tx);
        dispatch_rx.push(d_rx);
    }
    let rank = RankWorker::new(RankCore::new(cfg.models.len(), cfg.gpus, cfg.core.delay).with_departures(cfg.core.departures), to_rank_rx, grants_tx, owner.clone());
    let gpus = EmulatedGpus::new(&cfg.models, cfg.gpus, dispatch_rx);
    Topology { model_workers, rank, gpus, ingress, owner }
}

/// What the lockstep driver saw.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LockstepResult {
    /// Every batch, in dispatch order: `(gpu, model, exec_at, member ids)`.
    pub batches: Vec<RecordedBatch>,
    /// Requests dropped.
    pub dropped: u64,
    /// Emulated-GPU invariant violations.
    pub violations: u64,
}

/// Runs `trace` through the live workers on a manual clock, in the
/// simulator's event order ([`next_event`]): at each instant, due timers
/// (then everything they cause), then one arrival at a time (then
/// everything it causes). The emulated GPUs take dispatches after every
/// event; their completions feed nothing back (the RankThread keeps its own
/// GPU timers), so they only advance the GPUs' clock.
pub fn run_lockstep(cfg: &RuntimeConfig, trace: Vec<(Instant, u32)>) -> LockstepResult {
    let Topology { mut model_workers, mut rank, mut gpus, ingress, owner } = build(cfg);
    for w in &mut model_workers {
        w.record_members = Some(Vec::new());
    }
    let mut load = LoadGen::trace(&cfg.models, trace, owner, ingress);
    let quiesce = |now: Instant, mws: &mut [ModelWorker], rank: &mut RankWorker| loop {
        let mut work = rank.drain_messages(now);
        for w in mws.iter_mut() {
            work += w.drain_grants(now);
        }
        if work == 0 {
            break;
        }
    };
    let mut now = Instant::ZERO;
    // Bounded: every pass consumes an arrival, completes a batch or fires a
    // timer that moves time forward; the bound only guards against a
    // policy bug.
    for _ in 0..u64::MAX {
        let t_wake = model_workers.iter().filter_map(ModelWorker::poll_at).chain(rank.poll_at()).min().map(|t| t.max(now));
        let Some((t, event)) = next_event(gpus.poll_at(), t_wake, load.peek()) else { break };
        now = t;
        match event {
            Event::GpuDone => {}
            Event::Wake => {
                for w in &mut model_workers {
                    w.wake(now);
                }
                quiesce(now, &mut model_workers, &mut rank);
                rank.wake(now);
                quiesce(now, &mut model_workers, &mut rank);
            }
            Event::Arrival => {
                load.step(now, 1);
                // The arrival went to its owner's ring; the others are empty.
                for w in &mut model_workers {
                    w.drain_ingress(0, now, 1);
                }
                quiesce(now, &mut model_workers, &mut rank);
            }
        }
        gpus.step(now);
    }
    gpus.step(Instant::NEVER);
    let mut batches = Vec::new();
    let mut dropped = 0;
    for w in &mut model_workers {
        batches.extend(w.record_members.take().unwrap_or_default());
        dropped += w.stats.dropped;
    }
    LockstepResult { batches, dropped, violations: gpus.violations }
}

/// A live run.
#[derive(Clone, Debug)]
pub struct LiveConfig {
    /// The runtime.
    pub runtime: RuntimeConfig,
    /// Offered load.
    pub workload: Workload,
    /// How long arrivals are generated.
    pub duration: Duration,
    /// Seed.
    pub seed: u64,
    /// Idle strategy of every thread (`Spin` for benchmarks, a parking one
    /// for tests and shared machines).
    pub idle: IdleStrategy,
    /// Pin threads: ModelThread i to core i, the RankThread to the next.
    pub pin: bool,
}

/// Percentiles of a latency histogram, microseconds.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct LagSummary {
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// 99.99th percentile.
    pub p9999_us: f64,
    /// Largest.
    pub max_us: f64,
    /// Samples.
    pub count: u64,
}

impl LagSummary {
    fn of(h: &Histogram<u64>) -> Self {
        let q = |q: f64| if h.is_empty() { 0.0 } else { h.value_at_quantile(q) as f64 / 1e3 };
        LagSummary { p50_us: q(0.5), p99_us: q(0.99), p999_us: q(0.999), p9999_us: q(0.9999), max_us: h.max() as f64 / 1e3, count: h.len() }
    }
}

/// Outcome of a live run.
#[derive(Clone, Debug, Serialize)]
pub struct LiveReport {
    /// Models.
    pub models: usize,
    /// GPUs.
    pub gpus: u32,
    /// ModelThreads.
    pub model_threads: usize,
    /// Configured rate.
    pub offered_rps: f64,
    /// Requests generated.
    pub requests: u64,
    /// Requests generated per second of the run.
    pub sustained_rps: f64,
    /// `sustained_rps / model_threads`.
    pub rps_per_model_thread: f64,
    /// Requests dropped.
    pub dropped: u64,
    /// Drops by reason, indexed by [`DropReason::index`](crate::types::DropReason::index).
    pub dropped_by_reason: [u64; crate::types::DropReason::COUNT],
    /// Dropped / generated.
    pub bad_rate: f64,
    /// Requests executed by the emulated GPUs.
    pub completed: u64,
    /// Batches executed.
    pub batches: u64,
    /// Mean batch size.
    pub mean_batch: f64,
    /// Median batch size seen by a dispatched request.
    pub median_batch: u32,
    /// Requests executed within their deadline per second of the run.
    pub goodput_rps: f64,
    /// Autoscaling advice from the bad rate and the GPU idle fraction.
    pub autoscale: crate::sim::AutoscaleAdvice,
    /// Dispatch lag (decision time minus planned decision time).
    pub dispatch_lag: LagSummary,
    /// Load-generation lag (push time minus scheduled arrival).
    pub ingress_lag: LagSummary,
    /// RankThread events (messages and timer firings) per second.
    pub rank_events_per_s: f64,
    /// Fraction of the RankThread core spent in RankThread work.
    pub rank_utilisation: f64,
    /// Fraction of each ModelThread's wall time spent busy.
    pub model_thread_utilisation: Vec<f64>,
    /// Process CPU time per request, ns.
    pub cpu_ns_per_request: f64,
    /// GPU busy fraction over the run.
    pub gpu_busy_fraction: f64,
    /// Emulated-GPU invariant violations (must be 0).
    pub violations: u64,
    /// The first violation.
    pub first_violation: Option<String>,
    /// Accounting check: generated == dispatched + dropped once quiet.
    pub accounted: bool,
    /// Whether threads got their cores.
    pub pinned: bool,
}

fn cpu_time_ns() -> u64 {
    // Process CPU time; used only for the per-request cost figure.
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec and the clock id is a
    // constant the kernel knows; the call writes only into `ts`.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
}

/// Pins the calling thread to `core`, an index into `cores` (the CPUs this
/// process may use, read before anything was pinned).
fn pin(cores: &[core_affinity::CoreId], core: Option<usize>) -> bool {
    let Some(core) = core else { return false };
    cores.get(core % cores.len().max(1)).is_some_and(|id| core_affinity::set_for_current(*id))
}

/// Lets the calling thread run on every CPU again. A pinned thread's mask is
/// inherited by the threads it spawns and is all `core_affinity` reports, so
/// the runtime's own (pinned) thread must be unpinned after a run, or the
/// next run would put every thread on its core.
fn unpin_current() {
    // SAFETY: an all-zero `cpu_set_t` is a valid empty set; `CPU_SET` writes
    // bits inside it for indices below `CPU_SETSIZE`; `sched_setaffinity`
    // reads exactly `size_of::<cpu_set_t>()` bytes from it. The kernel
    // intersects the mask with the CPUs the process may use.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for i in 0..libc::CPU_SETSIZE as usize {
            libc::CPU_SET(i, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Idles one pass: a spinning strategy spins; otherwise the pass follows
/// the strategy but never sleeps past `next` (the worker's next timer), and a
/// park ends early when a producer wakes the thread.
fn idle_pass(idler: &mut Idler, strategy: IdleStrategy, now: Instant, next: Option<Instant>, recheck: impl FnOnce() -> bool) {
    if matches!(strategy, IdleStrategy::Spin) {
        std::hint::spin_loop();
        return;
    }
    match next {
        Some(t) => {
            idler.idle_within(t.saturating_since(now), recheck);
        }
        None => {
            idler.idle(recheck);
        }
    }
}

/// Why the live runtime could not run.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// Nothing to schedule.
    #[error("need at least one model and one GPU (got {models} models, {gpus} GPUs)")]
    EmptyCluster {
        /// Models given.
        models: usize,
        /// GPUs given.
        gpus: u32,
    },
    /// A ModelThread could not be started.
    #[error("cannot spawn ModelThread {index}: {source}")]
    Spawn {
        /// Its index.
        index: usize,
        /// The OS error.
        source: std::io::Error,
    },
    /// A ModelThread panicked.
    #[error("ModelThread {index} panicked")]
    Panicked {
        /// Its index.
        index: usize,
    },
}

/// What each ModelThread returns when stopped: its worker, its busy
/// fraction and whether it was pinned.
type ModelThreadHandle = std::thread::JoinHandle<(ModelWorker, f64, bool)>;

/// Requests each ModelThread has dispatched or dropped, published after
/// every working pass so the RankThread knows when the run is quiet:
/// `(dispatched, dropped)` per ModelThread.
type Resolved = Arc<Vec<[AtomicU64; 2]>>;

/// Starts one thread per ModelWorker; each wakes the RankThread after
/// pushing into a ring, so a parked RankThread reacts at once instead of at
/// its next timeout. Returns the threads and their wakers.
fn spawn_model_threads(
    model_workers: Vec<ModelWorker>,
    cfg: &LiveConfig,
    clock: MonotonicClock,
    stop: &Arc<AtomicBool>,
    resolved: &Resolved,
    rank_waker: &dataplane::idle::Waker,
) -> Result<(Vec<ModelThreadHandle>, Vec<dataplane::idle::Waker>), RuntimeError> {
    let cores = Arc::new(core_affinity::get_core_ids().unwrap_or_default());
    let model_idlers: Vec<Idler> = (0..model_workers.len()).map(|_| Idler::new(cfg.idle)).collect();
    let model_wakers: Vec<_> = model_idlers.iter().map(Idler::waker).collect();
    let mut handles = Vec::new();
    for ((i, mut w), mut idler) in model_workers.into_iter().enumerate().zip(model_idlers) {
        let stop = Arc::clone(stop);
        let resolved = Arc::clone(resolved);
        let rank_waker = rank_waker.clone();
        let cores = Arc::clone(&cores);
        let (strategy, core) = (cfg.idle, cfg.pin.then_some(i));
        let h = std::thread::Builder::new()
            .name(format!("model-thread-{i}"))
            .spawn(move || {
                let pinned = pin(&cores, core);
                let (mut busy, t0) = (0u64, clock.now());
                while !stop.load(Ordering::Relaxed) {
                    let now = clock.now();
                    let work = w.step(now);
                    if work > 0 {
                        busy += clock.now().saturating_since(now).as_nanos();
                        resolved[i][1].store(w.stats.dropped, Ordering::Release);
                        resolved[i][0].store(w.stats.batched, Ordering::Release);
                        rank_waker.wake();
                        idler.reset();
                    } else {
                        let next = w.poll_at();
                        idle_pass(&mut idler, strategy, now, next, || w.has_input());
                    }
                }
                let wall = clock.now().saturating_since(t0).as_nanos().max(1);
                (w, busy as f64 / wall as f64, pinned)
            })
            .map_err(|source| RuntimeError::Spawn { index: i, source })?;
        handles.push(h);
    }
    Ok((handles, model_wakers))
}

/// The ModelThreads' statistics summed after they stop.
struct ModelTotals {
    lag: Histogram<u64>,
    dispatched: u64,
    dropped: u64,
    batches: u64,
    utils: Vec<f64>,
    all_pinned: bool,
    accepted: u64,
    queued: u64,
    by_reason: [u64; crate::types::DropReason::COUNT],
    batch_requests: Vec<u64>,
}

/// Joins the stopped ModelThreads and sums their statistics.
fn join_model_threads(handles: Vec<ModelThreadHandle>, pin: bool) -> Result<ModelTotals, RuntimeError> {
    let mut t = ModelTotals {
        lag: workers::ns_hist(),
        dispatched: 0,
        dropped: 0,
        batches: 0,
        utils: Vec::new(),
        all_pinned: true,
        accepted: 0,
        queued: 0,
        by_reason: [0u64; crate::types::DropReason::COUNT],
        batch_requests: Vec::new(),
    };
    for (index, h) in handles.into_iter().enumerate() {
        let (w, util, pinned) = h.join().map_err(|_| RuntimeError::Panicked { index })?;
        let _ = t.lag.add(&w.stats.dispatch_lag_ns);
        t.dispatched += w.stats.batched;
        t.dropped += w.stats.dropped;
        for (a, b) in t.by_reason.iter_mut().zip(w.stats.dropped_by_reason) {
            *a += b;
        }
        t.batches += w.stats.batches;
        if t.batch_requests.len() < w.stats.batch_requests.len() {
            t.batch_requests.resize(w.stats.batch_requests.len(), 0);
        }
        for (a, b) in t.batch_requests.iter_mut().zip(&w.stats.batch_requests) {
            *a += b;
        }
        t.accepted += w.stats.requests;
        t.queued += w.queued() as u64;
        t.utils.push(util);
        t.all_pinned &= pinned || !pin;
    }
    Ok(t)
}

/// Runs the runtime on threads against the monotonic clock.
pub fn run_live(cfg: &LiveConfig) -> Result<LiveReport, RuntimeError> {
    let rt = &cfg.runtime;
    if rt.models.is_empty() || rt.gpus == 0 {
        return Err(RuntimeError::EmptyCluster { models: rt.models.len(), gpus: rt.gpus });
    }
    let Topology { model_workers, mut rank, mut gpus, ingress, owner } = build(rt);
    let threads = model_workers.len();
    unpin_current();
    let clock = MonotonicClock::new();
    let start = clock.now() + Duration::from_millis(5);
    let end = start + cfg.duration;
    let mut load = LoadGen::streams(&rt.models, &cfg.workload, cfg.seed, start, cfg.duration, owner, ingress);
    let stop = Arc::new(AtomicBool::new(false));
    let max_slo = rt.models.iter().map(|m| m.slo).max().unwrap_or(Duration::ZERO);
    let cpu0 = cpu_time_ns();
    let resolved: Resolved = Arc::new((0..threads).map(|_| [AtomicU64::new(0), AtomicU64::new(0)]).collect());
    let rank_idler = Idler::new(cfg.idle);
    let (handles, model_wakers) = spawn_model_threads(model_workers, cfg, clock, &stop, &resolved, &rank_idler.waker())?;

    // The RankThread (with the load generator and the emulated GPUs) runs
    // on this thread.
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let pinned_rank = pin(&cores, cfg.pin.then_some(threads));
    let mut idler = rank_idler;
    let mut rank_busy = 0u64;
    let drain_deadline = end + max_slo + Duration::from_millis(500);
    loop {
        let now = clock.now();
        let mut work = load.step(now, BATCH);
        let t0 = clock.now();
        let rank_work = rank.step(t0);
        if rank_work > 0 {
            rank_busy += clock.now().saturating_since(t0).as_nanos();
        }
        work += rank_work + gpus.step(now);
        if now > end && load.peek().is_none() {
            let dispatched: u64 = resolved.iter().map(|r| r[0].load(Ordering::Acquire)).sum();
            let dropped: u64 = resolved.iter().map(|r| r[1].load(Ordering::Acquire)).sum();
            let quiet = dispatched + dropped == load.generated && gpus.requests_done == dispatched && rank.flushed() && rank.poll_at().is_none();
            if quiet || now > drain_deadline {
                break;
            }
        }
        if work > 0 {
            for wk in &model_wakers {
                wk.wake();
            }
            idler.reset();
        } else {
            let next = [load.peek(), rank.poll_at(), gpus.poll_at()].into_iter().flatten().min();
            idle_pass(&mut idler, cfg.idle, now, next, || rank.has_input() || gpus.has_input());
        }
    }
    let run_end = clock.now();
    stop.store(true, Ordering::Relaxed);
    if cfg.pin {
        unpin_current();
    }
    let ModelTotals { lag, dispatched, dropped, batches, utils, all_pinned, accepted, queued, by_reason, batch_requests } =
        join_model_threads(handles, cfg.pin)?;
    let all_pinned = all_pinned && (pinned_rank || !cfg.pin);
    // Requests a ModelThread has not pulled yet count as neither.
    let cpu = cpu_time_ns().saturating_sub(cpu0);
    let secs = cfg.duration.as_secs_f64();
    let wall = run_end.saturating_since(start).as_secs_f64().max(1e-9);
    let generated = load.generated;
    let bad_rate = if generated > 0 { dropped as f64 / generated as f64 } else { 0.0 };
    let gpu_busy_fraction = gpus.busy_ns as f64 / (wall * 1e9 * f64::from(rt.gpus));
    Ok(LiveReport {
        models: rt.models.len(),
        gpus: rt.gpus,
        model_threads: threads,
        offered_rps: cfg.workload.rate_rps,
        requests: generated,
        sustained_rps: generated as f64 / secs,
        rps_per_model_thread: generated as f64 / secs / threads as f64,
        dropped,
        dropped_by_reason: by_reason,
        bad_rate,
        completed: gpus.requests_done,
        batches,
        mean_batch: if batches > 0 { dispatched as f64 / batches as f64 } else { 0.0 },
        median_batch: crate::sim::median_from_counts(&batch_requests),
        goodput_rps: gpus.requests_done as f64 / secs,
        autoscale: crate::sim::AutoscaleAdvice::new(rt.gpus, bad_rate, 1.0 - gpu_busy_fraction, 0.01),
        dispatch_lag: LagSummary::of(&lag),
        ingress_lag: LagSummary::of(&load.ingress_lag_ns),
        rank_events_per_s: rank.stats.events as f64 / wall,
        rank_utilisation: rank_busy as f64 / (wall * 1e9),
        model_thread_utilisation: utils,
        cpu_ns_per_request: if generated > 0 { cpu as f64 / generated as f64 } else { 0.0 },
        gpu_busy_fraction,
        violations: gpus.violations,
        first_violation: gpus.first_violation.clone(),
        accounted: accepted == generated && queued == 0 && dispatched + dropped == accepted && gpus.requests_done == dispatched,
        pinned: all_pinned,
    })
}
