//! The scheduler daemon's control plane as a sans-IO state machine: peers
//! joining and leaving, tasks in, batch plans and drops out, failing back
//! the batches of a backend that died. It takes `now` from the caller and
//! writes every message it wants sent into an [`Outbox`]; the I/O loop in
//! `daemon::run` moves the bytes. Tests drive it on a virtual clock.
//!
//! # Sub-clusters
//!
//! Models are partitioned into sub-clusters (by configuration; one holding
//! every model by default). Each sub-cluster is one scheduling [`Engine`]
//! (a [`DeferredScheduler`] inline, or the pinned runtime's threads) over
//! its models and its own GPU id space. A backend joins the
//! sub-cluster whose models it holds all of (the one with the fewest GPUs
//! if several qualify), and its GPUs extend that sub-cluster. GPU ids are
//! never reused: a backend that leaves takes its ids out of matchmaking for
//! good, and one that comes back gets fresh ones.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};

/// The hasher of the plane's per-task and per-batch tables (keyed by task
/// and batch ids): foldhash, seeded per process. SipHash (std's default)
/// was ~10% of a saturated daemon's time for four lookups per task;
/// foldhash keeps a random per-process seed, so a peer cannot aim ids at
/// one bucket without knowing it (docs/decisions.md).
pub(super) type IdHasher = foldhash::fast::RandomState;
type IdMap<V> = HashMap<u64, V, IdHasher>;
type IdSet = HashSet<u64, IdHasher>;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use dataplane::time::{Duration, Instant};
use dataplane::wire::{
    self, BatchPlanHead, BatchPlanWriter, BenchStamp, BatchTask, CompletionHead, DropReason, OutputKind,
    Register, Role, Task, TaskId, TaskStatus, MAX_BACKENDS, MAX_FRONTENDS,
};

use super::bench_stamps::BenchClock;
use super::metrics::{LoopEstimate, MessageRefusal, SchedulerMetrics};
use crate::closed_loop::{ClosedLoop, Estimate, LoopConfig, Ratio, Report};
use super::engine::{Engine, EngineKind};
use super::task_ids::{TaskMeta, TaskTable};
use crate::deferred::{CoreConfig, DeferredScheduler};
use crate::runtime::{Drive, PinnedConfig, PinnedScheduler, ThreadPlacement};
use crate::delay_watch::{DelayWatch, DelayWatchConfig, Verdict};
use crate::netdelay::NetworkDelay;
use crate::types::{Actions, GpuId, Request};
use crate::zoo::ModelSpec;

/// A peer of the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PeerId {
    /// Frontend by id.
    Frontend(u32),
    /// Backend by id.
    Backend(u32),
}

/// How long after its planned finish a batch's `BatchDone` is waited for
/// by default (see [`ControlPlane::expire_overdue`]).
pub const DEFAULT_BATCH_GRACE: Duration = Duration::from_millis(1000);

/// The longest budget a task is given (issue 55): a frontend's budget (a
/// model's SLO, or a request's own `timeout`) beyond it is cut to it, so a
/// peer cannot park tasks, and the memory that tracks them, for hours. A
/// minute is far beyond every SLO and any client timeout this serves.
pub const MAX_TASK_BUDGET: Duration = Duration::from_millis(60_000);

/// A task's deadline: `budget_ns` from `now`, clamped to [`MAX_TASK_BUDGET`].
fn task_deadline(now: Instant, budget_ns: u64) -> Instant {
    now.saturating_add(Duration::from_nanos(budget_ns.min(MAX_TASK_BUDGET.as_nanos())))
}

/// How often [`ControlPlane::publish_estimates`] republishes the closed
/// loop's estimates into the metrics.
pub const PUBLISH_EVERY: Duration = Duration::from_millis(100);

/// Encoded messages waiting to be sent, in order, in one flat buffer
/// (no allocation once warm). Each message is encoded into a scratch
/// buffer of the largest message size and only its bytes are appended, so
/// a 40-byte `Dropped` costs 40 bytes of copying, not a 32 KiB fill.
#[derive(Debug, Default)]
pub struct Outbox {
    bytes: Vec<u8>,
    items: Vec<(PeerId, usize, usize)>,
    scratch: Vec<u8>,
}

impl Outbox {
    /// An empty outbox.
    pub fn new() -> Self {
        Outbox {
            bytes: Vec::with_capacity(1 << 20),
            items: Vec::with_capacity(4096),
            scratch: vec![0; wire::MAX_MESSAGE_LEN],
        }
    }
    /// The messages, in order.
    pub fn iter(&self) -> impl Iterator<Item = (PeerId, &[u8])> {
        self.items
            .iter()
            .map(|&(p, at, n)| (p, &self.bytes[at..at + n]))
    }
    /// Number of messages.
    pub fn len(&self) -> usize {
        self.items.len()
    }
    /// Nothing to send.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
    /// Forgets every message, keeping the storage.
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.items.clear();
    }
    /// Appends a message produced by `encode` (which writes into the given
    /// buffer and returns the length); one that fails to encode is skipped.
    fn push(
        &mut self,
        to: PeerId,
        encode: impl FnOnce(&mut [u8]) -> Result<usize, wire::WireError>,
    ) {
        if self.scratch.len() < wire::MAX_MESSAGE_LEN {
            self.scratch.resize(wire::MAX_MESSAGE_LEN, 0);
        }
        if let Ok(n) = encode(&mut self.scratch) {
            let at = self.bytes.len();
            self.bytes.extend_from_slice(&self.scratch[..n]);
            self.items.push((to, at, n));
        }
    }
}

/// Why a registration was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The id is out of range.
    BadId(u32),
    /// A live peer already has this id.
    Duplicate(u32),
    /// A model id the scheduler does not know.
    UnknownModel(u32),
    /// The backend's models cover no sub-cluster.
    NoSubCluster,
    /// A backend with no GPUs.
    NoGpus,
    /// A busy report names a GPU the backend does not have.
    BadGpu(u32),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::BadId(id) => write!(f, "id {id} out of range"),
            Refusal::Duplicate(id) => write!(f, "id {id} is already registered"),
            Refusal::UnknownModel(m) => write!(f, "unknown model id {m}"),
            Refusal::NoSubCluster => write!(f, "its models cover no sub-cluster"),
            Refusal::NoGpus => write!(f, "no GPUs"),
            Refusal::BadGpu(g) => write!(f, "busy report for GPU {g}, which it does not have"),
        }
    }
}

struct FrontendState {
    endpoint: String,
}

struct BackendState {
    subcluster: usize,
    /// Sub-cluster GPU id of each local GPU.
    gpus: Vec<GpuId>,
}

/// A batch sent to a backend and not yet reported done.
struct InFlight {
    backend: u32,
    /// (task id, frontend id)
    tasks: Vec<(u64, u32)>,
    subcluster: usize,
    /// Sub-cluster GPU id, and the GPU's index at the backend.
    gpu: GpuId,
    local_gpu: u32,
    /// Local model id in the sub-cluster.
    model: u32,
}

struct SubCluster {
    /// Global model ids, by local id.
    models: Vec<u32>,
    sched: Engine,
    /// (backend, local GPU) of each sub-cluster GPU id.
    gpu_owner: Vec<(u32, u32)>,
    /// Planned finish of the last batch planned on each GPU id (moved by
    /// the closed loop's corrections).
    planned_free: Vec<Instant>,
    /// What the sub-cluster learns from batch reports.
    closed_loop: ClosedLoop,
}

/// The control plane.
pub struct ControlPlane {
    models: Vec<ModelSpec>,
    /// Sub-cluster and local model id of each global model (None: unserved).
    placement: Vec<Option<(usize, u32)>>,
    /// Each model's admission (by global id): the priority level of a
    /// task, for the per-level counters.
    admissions: Vec<crate::types::Admission>,
    subclusters: Vec<SubCluster>,
    // Foldhash too: every drop, failed-back task and forwarded completion
    // looks its frontend up (SipHash was ~20 ns of each refusal under
    // overload). Iterations over them are sorted.
    frontends: HashMap<u32, FrontendState, IdHasher>,
    backends: HashMap<u32, BackendState, IdHasher>,
    /// Waiting tasks and the duplicate filter (see `task_ids`).
    ids: TaskTable,
    inflight: IdMap<InFlight>,
    /// (planned finish + grace, batch id) of batches in flight; entries of
    /// batches already reported are removed lazily.
    expiries: BinaryHeap<Reverse<(Instant, u64)>>,
    batch_grace: Duration,
    spare_task_lists: Vec<Vec<(u64, u32)>>,
    next_batch: u64,
    actions: Actions,
    out: Outbox,
    metrics: Arc<SchedulerMetrics>,
    stopping: bool,
    overlapping_plans: u64,
    /// Tasks handed back as moved, by id: the attempt handed back. A later
    /// copy of that attempt (a duplicated message) is ignored; the next
    /// attempt (the frontend's resubmission, after a move back) is new.
    handed_back: IdMap<u16>,
    /// When each entry of `handed_back` may be forgotten (its deadline),
    /// with its attempt.
    handed_back_expiry: BinaryHeap<Reverse<(Instant, u64, u16)>>,
    duplicate_tasks: u64,
    /// `d_ctrl` of the scheduling cores: announced to every peer in its
    /// `Welcome`, so that backends subtract the bound the scheduler charges.
    control_delay: Duration,
    /// The network delay bound the cores charge.
    delay: NetworkDelay,
    /// The cores' configuration (as given; `delay` is the live bound).
    core: CoreConfig,
    loop_cfg: LoopConfig,
    /// The READ tail against `delay.d_data`, for the one transport this
    /// scheduler's links use.
    watch: DelayWatch,
    verdicts: Vec<Verdict>,
    next_publish: Instant,
    /// Benchmark-only lag stamps (`--bench-stamps`), off by default.
    bench: Option<BenchClock>,
    /// Benchmark only: planned dispatch moments (host clock) of the plans
    /// in the outbox, for [`ControlPlane::outbox_sent`].
    bench_unsent: Vec<u64>,
    /// The election epoch stamped in every `Welcome` and plan (0: none).
    epoch: u32,
    /// While fenced, GPUs that join are held out of matchmaking (nothing
    /// is planned) until [`ControlPlane::lift_fence`].
    fenced: bool,
    /// GPUs joined while fenced: (backend, sub-cluster, GPU id, free at).
    held_gpus: Vec<(u32, usize, GpuId, Instant)>,
    /// Tasks of a model this group does not own that came while fenced or
    /// before `moved_release_at`: (task, frontend), answered `moved` once
    /// both have passed. Handing a task to another group is planning it
    /// elsewhere: the previous scheduler of this group may have it in a
    /// batch that a backend still holds (stopped only by the fence, a
    /// newer epoch reaching the backends) or still runs (its GPU reported
    /// busy at registration). A frontend resubmits such tasks here.
    moved_held: Vec<(u64, u32, u16)>,
    /// When the last GPU reported busy at its backend's registration
    /// frees: the batches of a previous scheduler end by then.
    moved_release_at: Instant,
    /// With several scheduler groups (issue 19): which models this group
    /// owns at `route_revision` (None: no routing table, it owns all).
    owned: Option<Vec<bool>>,
    /// The newest routing-table revision applied (0: none).
    route_revision: u64,
    /// Queued tasks being handed back as moved: their core cancellation
    /// answers `Moved`, not `Cancelled`.
    handing_over: IdSet,
    /// Plans of a model this group no longer owned, held back (their
    /// tasks answered moved).
    unowned_plans_held: u64,
}

/// Why a control plane cannot be built from its sub-clusters.
#[derive(Debug, thiserror::Error)]
pub enum PlaneError {
    /// A sub-cluster names a model id outside the model list.
    #[error("sub-cluster {subcluster}: no model id {model}")]
    NoSuchModel {
        /// The sub-cluster's index.
        subcluster: usize,
        /// The id.
        model: u32,
    },
    /// A model is in more than one sub-cluster.
    #[error("model {0} is in more than one sub-cluster")]
    SharedModel(String),
    /// A sub-cluster has no models.
    #[error("sub-cluster {0} has no models")]
    EmptySubCluster(usize),
    /// The engine can change only before any peer joined.
    #[error("the scheduling engine can change only before peers join")]
    EngineInUse,
    /// The pinned runtime's threads could not start.
    #[error("cannot start the pinned runtime: {0}")]
    Runtime(#[from] crate::runtime::RuntimeError),
}

impl ControlPlane {
    /// A control plane for `models` (global id = index) partitioned into
    /// `subclusters` (lists of global ids; every model in at most one).
    pub fn new(
        models: Vec<ModelSpec>,
        subclusters: &[Vec<u32>],
        core: CoreConfig,
        metrics: Arc<SchedulerMetrics>,
    ) -> Result<ControlPlane, PlaneError> {
        let mut placement = vec![None; models.len()];
        let mut scs = Vec::new();
        for (si, ids) in subclusters.iter().enumerate() {
            let mut specs = Vec::new();
            for (local, &g) in ids.iter().enumerate() {
                let spec = models
                    .get(g as usize)
                    .ok_or(PlaneError::NoSuchModel { subcluster: si, model: g })?;
                if placement[g as usize].is_some() {
                    return Err(PlaneError::SharedModel(spec.name.clone()));
                }
                placement[g as usize] = Some((si, local as u32));
                specs.push(spec.clone());
            }
            if specs.is_empty() {
                return Err(PlaneError::EmptySubCluster(si));
            }
            scs.push(SubCluster {
                models: ids.clone(),
                sched: Engine::Inline(Box::new(DeferredScheduler::new(&specs, 0, core))),
                gpu_owner: Vec::new(),
                planned_free: Vec::new(),
                closed_loop: ClosedLoop::new(specs.len(), LoopConfig::default()),
            });
        }
        Ok(ControlPlane {
            admissions: vec![crate::types::Admission::default(); models.len()],
            models,
            placement,
            subclusters: scs,
            frontends: HashMap::default(),
            backends: HashMap::default(),
            ids: TaskTable::new(),
            inflight: IdMap::with_capacity_and_hasher(1024, IdHasher::default()),
            expiries: BinaryHeap::with_capacity(1024),
            batch_grace: DEFAULT_BATCH_GRACE,
            spare_task_lists: Vec::new(),
            next_batch: 1,
            actions: Actions::default(),
            out: Outbox::new(),
            metrics,
            stopping: false,
            overlapping_plans: 0,
            duplicate_tasks: 0,
            control_delay: core.delay.d_ctrl,
            delay: core.delay,
            core,
            loop_cfg: LoopConfig::default(),
            watch: DelayWatch::new(core.delay.d_data, DelayWatchConfig::default()),
            verdicts: Vec::with_capacity(4),
            next_publish: Instant::ZERO,
            bench: None,
            bench_unsent: Vec::new(),
            epoch: 0,
            fenced: false,
            held_gpus: Vec::new(),
            moved_held: Vec::new(),
            handed_back: IdMap::default(),
            handed_back_expiry: BinaryHeap::new(),
            moved_release_at: Instant::ZERO,
            owned: None,
            route_revision: 0,
            handing_over: IdSet::default(),
            unowned_plans_held: 0,
        })
        .inspect(ControlPlane::sync_loop_gauges)
    }

    /// Runs every sub-cluster's scheduling cores on `kind` (inline by
    /// default). Each sub-cluster gets `pinned.model_threads` ModelThreads
    /// and a RankThread; `pinned.cores` is dealt to them in sub-cluster
    /// order. Only before any peer joined (the cores start empty). Returns
    /// where each thread was asked to run (empty inline).
    pub fn set_engine(&mut self, kind: EngineKind, pinned: &PinnedConfig, drive: Drive) -> Result<Vec<ThreadPlacement>, PlaneError> {
        if !self.frontends.is_empty() || !self.backends.is_empty() || self.ids.waiting_len() > 0 {
            return Err(PlaneError::EngineInUse);
        }
        let core = CoreConfig { delay: self.delay, ..self.core };
        let mut layout = Vec::new();
        let mut cores = pinned.cores.iter().copied();
        let several = self.subclusters.len() > 1;
        for (i, s) in self.subclusters.iter_mut().enumerate() {
            let specs: Vec<ModelSpec> = s.models.iter().map(|&g| self.models[g as usize].clone()).collect();
            s.sched = match kind {
                EngineKind::Inline => Engine::Inline(Box::new(DeferredScheduler::new(&specs, 0, core))),
                EngineKind::Pinned => {
                    let threads = pinned.model_threads.clamp(1, specs.len()) + usize::from(!pinned.shared_rank);
                    let cfg = PinnedConfig { cores: cores.by_ref().take(threads).collect(), ..pinned.clone() };
                    let name = if several { format!("sched{i}") } else { "sched".to_string() };
                    let (p, placed) = PinnedScheduler::new(&name, &specs, core, &cfg, drive.clone())?;
                    layout.extend(placed);
                    Engine::Pinned(Box::new(p))
                }
            };
        }
        Ok(layout)
    }

    /// Takes the decisions the pinned runtime's threads made since the
    /// last call and turns them into messages. Returns whether there were
    /// any.
    pub fn collect(&mut self, now: Instant) -> bool {
        let mut any = false;
        for sc in 0..self.subclusters.len() {
            if self.subclusters[sc].sched.collect(&mut self.actions) > 0 || !self.actions.is_empty() {
                self.apply(now, sc);
                any = true;
            }
        }
        any
    }

    /// True when the pinned runtime's threads have decisions waiting for
    /// [`collect`](Self::collect) (the host's check before it sleeps).
    pub fn has_decisions(&self) -> bool {
        self.subclusters.iter().any(|s| s.sched.has_output())
    }

    /// The closed loop's configuration (on by default).
    pub fn set_closed_loop(&mut self, cfg: LoopConfig) {
        self.loop_cfg = cfg;
        for s in &mut self.subclusters {
            s.closed_loop.set_config(cfg);
        }
        self.sync_loop_gauges();
    }

    /// The closed loop's configuration.
    pub fn closed_loop(&self) -> LoopConfig {
        self.loop_cfg
    }

    /// How the READ tail of `transport` (a metric label: the transport
    /// this scheduler's links use) is held against the per-input bound.
    pub fn set_delay_watch(&mut self, transport: &str, cfg: DelayWatchConfig) {
        self.watch.set_config(cfg);
        if let Ok(mut t) = self.metrics.closed_loop.read_transport.lock() {
            t.clear();
            t.push_str(transport);
        }
        self.sync_loop_gauges();
    }

    /// The READ tail watch.
    pub fn delay_watch(&self) -> &DelayWatch {
        &self.watch
    }

    /// Benchmark-only: record ingress lags from frontends' stamps and
    /// stamp every plan (see [`super::bench_stamps`]); `origin_host_ns` is
    /// the host clock at this process's clock origin.
    pub fn set_bench_stamps(&mut self, origin_host_ns: Option<u64>) {
        self.bench = origin_host_ns.map(BenchClock::new);
        self.bench_unsent = Vec::with_capacity(if self.bench.is_some() { 4096 } else { 0 });
    }

    /// The outbox was handed to the links. Benchmark only: records the
    /// send lag of each plan it held.
    pub fn outbox_sent(&mut self) {
        if self.bench_unsent.is_empty() {
            return;
        }
        let sent = dataplane::time::host_monotonic_ns();
        for &planned in &self.bench_unsent {
            self.metrics.bench_send_lag.record(sent.saturating_sub(planned));
        }
        self.bench_unsent.clear();
    }

    /// A frontend's benchmark stamp for its next task (ignored unless
    /// stamps are on).
    pub fn on_bench_stamp(&mut self, from: u32, s: &BenchStamp) {
        if let Some(b) = &mut self.bench {
            b.stamped(from, s);
        }
    }

    /// The network delay bound the cores charge now.
    pub fn delay(&self) -> NetworkDelay {
        self.delay
    }

    /// The oldest delay-watch verdict not yet taken (for the host's log).
    pub fn take_delay_verdict(&mut self) -> Option<Verdict> {
        (!self.verdicts.is_empty()).then(|| self.verdicts.remove(0))
    }

    /// Where a live backend's GPU is: (sub-cluster, sub-cluster GPU id).
    fn locate_gpu(&self, backend: u32, local_gpu: u32) -> Option<(usize, GpuId)> {
        let b = self.backends.get(&backend)?;
        Some((b.subcluster, *b.gpus.get(local_gpu as usize)?))
    }

    /// The closed loop's speed ratio of a live backend's GPU (measured
    /// over profiled time, pooled over its models).
    pub fn gpu_ratio(&self, backend: u32, local_gpu: u32) -> Option<Ratio> {
        let (sc, g) = self.locate_gpu(backend, local_gpu)?;
        Some(self.subclusters[sc].closed_loop.gpu_ratio(g))
    }

    /// The closed loop's speed ratio of every live backend's GPUs, as
    /// (backend, GPU index, ratio), in id order.
    pub fn gpu_ratios(&self) -> Vec<(u32, u32, Ratio)> {
        let mut v: Vec<(u32, u32, Ratio)> = self
            .backends
            .iter()
            .flat_map(|(&b, st)| {
                st.gpus.iter().enumerate().map(move |(i, &g)| (b, i as u32, self.subclusters[st.subcluster].closed_loop.gpu_ratio(g)))
            })
            .collect();
        v.sort_unstable_by_key(|&(b, g, _)| (b, g));
        v
    }

    /// The closed loop's estimate of `model` (global id) on a live
    /// backend's GPU.
    pub fn model_estimate(&self, backend: u32, local_gpu: u32, model: u32) -> Option<Estimate> {
        let (sc, g) = self.locate_gpu(backend, local_gpu)?;
        let (psc, local) = self.placement.get(model as usize).copied().flatten()?;
        (psc == sc).then(|| {
            let line = self.models[model as usize].profile.linear_coefficients();
            self.subclusters[sc].closed_loop.estimate(local, g, line)
        })
    }

    /// Republishes the closed loop's estimates into the metrics, at most
    /// every [`PUBLISH_EVERY`] (a lock per publication, none per message).
    pub fn publish_estimates(&mut self, now: Instant) {
        if now < self.next_publish {
            return;
        }
        self.next_publish = now + PUBLISH_EVERY;
        let Ok(mut rows) = self.metrics.closed_loop.loop_estimates.lock() else { return };
        rows.clear();
        for s in &self.subclusters {
            for (g, &(backend, gpu)) in s.gpu_owner.iter().enumerate() {
                let g = g as GpuId;
                let pooled = s.closed_loop.gpu_ratio(g);
                if pooled.samples() == 0 {
                    continue;
                }
                rows.push(LoopEstimate { backend, gpu, model: None, ratio: pooled.value(), samples: pooled.samples(), alpha_beta_ms: None });
                for (local, &global) in s.models.iter().enumerate() {
                    let line = self.models[global as usize].profile.linear_coefficients();
                    let e = s.closed_loop.estimate(local as u32, g, line);
                    if e.samples > 0 {
                        rows.push(LoopEstimate { backend, gpu, model: Some(global), ratio: e.ratio, samples: e.samples, alpha_beta_ms: e.alpha_beta_ms });
                    }
                }
            }
        }
    }

    fn sync_loop_gauges(&self) {
        let m = &self.metrics.closed_loop;
        m.closed_loop_enabled.store(u64::from(self.loop_cfg.enabled), Ordering::Relaxed);
        m.read_bound_ns.store(self.watch.bound().as_nanos(), Ordering::Relaxed);
        m.read_percentile_milli.store((self.watch.config().percentile * 1000.0) as u64, Ordering::Relaxed);
        m.read_tail_ns.store(self.watch.observed().map_or(0, |d| d.as_nanos()), Ordering::Relaxed);
        m.delay_bound_exceeded.store(u64::from(self.watch.exceeded()), Ordering::Relaxed);
    }

    /// Messages to send; the caller sends them and then calls
    /// Batches planned onto a GPU before its previous planned batch there
    /// ended (a scheduling bug; stays 0).
    pub fn overlapping_plans(&self) -> u64 {
        self.overlapping_plans
    }

    /// [`Outbox::clear`].
    pub fn outbox(&mut self) -> &mut Outbox {
        &mut self.out
    }

    /// The metrics the plane counts into.
    pub fn metrics(&self) -> &Arc<SchedulerMetrics> {
        &self.metrics
    }

    /// How long after a batch's planned finish its `BatchDone` is waited
    /// for before [`expire_overdue`](Self::expire_overdue) gives it up.
    pub fn set_batch_grace(&mut self, grace: Duration) {
        self.batch_grace = grace;
    }

    /// When the earliest batch in flight becomes overdue (may be the
    /// deadline of a batch already reported: then expiring finds nothing).
    pub fn next_expiry(&self) -> Option<Instant> {
        self.expiries.peek().map(|Reverse((t, _))| *t)
    }

    /// Gives up on every batch whose `BatchDone` has not come within the
    /// grace after its planned finish: its tasks are failed back to their
    /// frontends (a frontend keeps the first outcome of a task and counts
    /// later ones as duplicates, so this is safe if the completions did
    /// arrive) and its record is dropped, so that a lost `BatchDone` does
    /// not hold a shutdown drain or leak the record. The GPU itself never
    /// waits for a `BatchDone`: the RankThread frees it at its planned
    /// finish. A `BatchDone` that comes later is counted as a protocol
    /// error. Returns how many batches were given up.
    pub fn expire_overdue(&mut self, now: Instant) -> usize {
        let mut expired = 0;
        while let Some(&Reverse((t, batch))) = self.expiries.peek() {
            if t > now {
                break;
            }
            self.expiries.pop();
            if let Some(f) = self.inflight.remove(&batch) {
                self.subclusters[f.subcluster].closed_loop.forget(f.gpu, batch);
                for &(task, frontend) in &f.tasks {
                    self.fail_back(task, frontend);
                }
                self.recycle(f.tasks);
                expired += 1;
            }
        }
        expired
    }

    /// Drops expiry entries of batches no longer in flight from the top of
    /// the heap, so that [`next_expiry`](Self::next_expiry) stays tight.
    fn trim_expiries(&mut self) {
        while let Some(&Reverse((_, batch))) = self.expiries.peek() {
            if self.inflight.contains_key(&batch) {
                break;
            }
            self.expiries.pop();
        }
    }

    /// The served models.
    pub fn models(&self) -> &[ModelSpec] {
        &self.models
    }

    /// Tasks waiting in sub-clusters.
    pub fn waiting_tasks(&self) -> usize {
        self.ids.waiting_len()
    }

    /// Batches sent and not reported done.
    pub fn batches_in_flight(&self) -> usize {
        self.inflight.len()
    }

    /// GPUs in matchmaking, over all sub-clusters.
    pub fn online_gpus(&self) -> usize {
        self.subclusters.iter().map(|s| s.sched.online_gpus()).sum()
    }

    /// Live frontends and backends.
    pub fn peers(&self) -> (usize, usize) {
        (self.frontends.len(), self.backends.len())
    }

    /// The control delay bound every peer is told in its `Welcome`.
    pub fn control_delay(&self) -> Duration {
        self.control_delay
    }

    /// The election epoch stamped in every `Welcome` and plan (0: no
    /// election, the embedded default).
    pub fn set_epoch(&mut self, epoch: u32) {
        self.epoch = epoch;
    }

    /// The epoch in force.
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// Holds every GPU that joins from now on out of matchmaking: nothing
    /// is planned (tasks queue, dropped only by their deadlines) until
    /// [`lift_fence`](Self::lift_fence).
    pub fn fence(&mut self) {
        self.fenced = true;
    }

    /// Whether GPUs are held out of matchmaking.
    pub fn fenced(&self) -> bool {
        self.fenced
    }

    /// Puts the GPUs held by the fence into matchmaking (each busy until
    /// its backend's report said); planning starts.
    pub fn lift_fence(&mut self, now: Instant) {
        self.fenced = false;
        for (_, sc, g, free_at) in std::mem::take(&mut self.held_gpus) {
            self.subclusters[sc].sched.gpu_joined_busy(now, g, free_at, &mut self.actions);
            self.apply(now, sc);
        }
        self.release_moved(now);
        self.sync_peer_gauges();
    }

    /// Hands `task` back to `frontend` as moved: at once, or, while a
    /// batch of a previous scheduler of this group may still hold or run
    /// it, once that can no longer be (see `moved_held`).
    /// The attempt handed back is remembered until `deadline`.
    fn answer_moved(&mut self, now: Instant, task: u64, frontend: u32, attempt: u16, deadline: Instant) {
        self.ids.forget(task);
        self.handed_back.insert(task, attempt);
        self.handed_back_expiry.push(Reverse((deadline, task, attempt)));
        if self.fenced || now < self.moved_release_at {
            self.moved_held.push((task, frontend, attempt));
        } else {
            self.send_drop(task, frontend, DropReason::Moved, attempt);
        }
    }

    /// Answers the tasks held in `moved_held` once the fence has lifted and
    /// the GPUs reported busy have freed.
    fn release_moved(&mut self, now: Instant) {
        if self.fenced || now < self.moved_release_at {
            return;
        }
        for (task, frontend, attempt) in std::mem::take(&mut self.moved_held) {
            self.send_drop(task, frontend, DropReason::Moved, attempt);
        }
    }

    /// The registration's acknowledgement: the model count and `d_ctrl`.
    fn ack(&mut self, to: PeerId) {
        let welcome = wire::Welcome {
            models: self.models.len() as u32,
            epoch: self.epoch,
            control_delay_ns: self.control_delay.as_nanos(),
        };
        self.out.push(to, |b| wire::encode(b, &welcome));
    }

    /// A frontend registered with its data endpoint.
    pub fn frontend_joined(&mut self, id: u32, endpoint: &str) -> Result<(), Refusal> {
        if id >= MAX_FRONTENDS {
            return Err(Refusal::BadId(id));
        }
        if self.frontends.contains_key(&id) {
            return Err(Refusal::Duplicate(id));
        }
        // A restarted frontend numbers its tasks from the start again.
        self.ids.frontend_registered(id);
        self.frontends.insert(
            id,
            FrontendState {
                endpoint: endpoint.to_string(),
            },
        );
        self.ack(PeerId::Frontend(id));
        let announce = Register::new(Role::Frontend, id, 0, endpoint);
        let mut backends: Vec<u32> = self.backends.keys().copied().collect();
        backends.sort_unstable();
        for b in backends {
            self.out
                .push(PeerId::Backend(b), |buf| wire::encode(buf, &announce));
        }
        self.sync_peer_gauges();
        Ok(())
    }

    /// A backend registered with `gpus` GPUs holding `models`; `busy` says
    /// how long after `now` each of its GPUs named there is still busy with
    /// batches it holds (planned by an earlier scheduler): nothing is
    /// planned on such a GPU to start before then.
    pub fn backend_joined(
        &mut self,
        now: Instant,
        id: u32,
        gpus: u32,
        models: &[u32],
        busy: &[wire::GpuBusy],
    ) -> Result<(), Refusal> {
        if id >= MAX_BACKENDS {
            return Err(Refusal::BadId(id));
        }
        if self.backends.contains_key(&id) {
            return Err(Refusal::Duplicate(id));
        }
        if gpus == 0 {
            return Err(Refusal::NoGpus);
        }
        if let Some(&m) = models.iter().find(|&&m| m as usize >= self.models.len()) {
            return Err(Refusal::UnknownModel(m));
        }
        if let Some(b) = busy.iter().find(|b| b.gpu_id >= gpus) {
            return Err(Refusal::BadGpu(b.gpu_id));
        }
        let sc = self
            .subclusters
            .iter()
            .enumerate()
            .filter(|(_, s)| s.models.iter().all(|m| models.contains(m)))
            .min_by_key(|(i, s)| (s.sched.online_gpus(), *i))
            .map(|(i, _)| i)
            .ok_or(Refusal::NoSubCluster)?;
        let s = &mut self.subclusters[sc];
        let mut ids = Vec::with_capacity(gpus as usize);
        for local in 0..gpus {
            let g = s.gpu_owner.len() as GpuId;
            s.gpu_owner.push((id, local));
            ids.push(g);
        }
        self.backends.insert(
            id,
            BackendState {
                subcluster: sc,
                gpus: ids.clone(),
            },
        );
        self.ack(PeerId::Backend(id));
        let mut fronts: Vec<(u32, String)> = self
            .frontends
            .iter()
            .map(|(&f, st)| (f, st.endpoint.clone()))
            .collect();
        fronts.sort_unstable();
        for (f, ep) in fronts {
            let r = Register::new(Role::Frontend, f, 0, &ep);
            self.out.push(PeerId::Backend(id), |b| wire::encode(b, &r));
        }
        for (local, g) in ids.into_iter().enumerate() {
            let free_at = busy
                .iter()
                .find(|b| b.gpu_id as usize == local)
                .map_or(now, |b| now.saturating_add(Duration::from_nanos(b.busy_ns)));
            // The self-check of overlapping plans starts from the report.
            let free = &mut self.subclusters[sc].planned_free;
            if free.len() <= g as usize {
                free.resize(g as usize + 1, Instant::ZERO);
            }
            free[g as usize] = free[g as usize].max(free_at);
            self.moved_release_at = self.moved_release_at.max(free_at);
            if self.fenced {
                self.held_gpus.push((id, sc, g, free_at));
                continue;
            }
            self.subclusters[sc].sched.gpu_joined_busy(now, g, free_at, &mut self.actions);
            self.apply(now, sc);
        }
        self.sync_peer_gauges();
        Ok(())
    }

    /// A frontend left (disconnected or silent). Its tasks stay scheduled:
    /// their READs fail at the backend and the outcomes go nowhere.
    pub fn frontend_left(&mut self, id: u32) {
        if self.frontends.remove(&id).is_some() {
            self.sync_peer_gauges();
        }
    }

    /// A backend left: its GPUs leave matchmaking and every task of its
    /// in-flight batches is failed back to its frontend.
    pub fn backend_left(&mut self, now: Instant, id: u32) {
        let Some(b) = self.backends.remove(&id) else {
            return;
        };
        self.metrics.backend_deaths.inc();
        self.held_gpus.retain(|h| h.0 != id);
        for &g in &b.gpus {
            self.subclusters[b.subcluster].closed_loop.gpu_left(g);
            self.subclusters[b.subcluster]
                .sched
                .set_gpu_online(now, g, false, &mut self.actions);
            self.apply(now, b.subcluster);
        }
        let mut dead: Vec<u64> = self
            .inflight
            .iter()
            .filter(|(_, f)| f.backend == id)
            .map(|(&k, _)| k)
            .collect();
        // Batch order, not hash order: a run is reproducible.
        dead.sort_unstable();
        for batch in dead {
            if let Some(f) = self.inflight.remove(&batch) {
                for &(task, frontend) in &f.tasks {
                    self.fail_back(task, frontend);
                }
                self.recycle(f.tasks);
            }
        }
        self.trim_expiries();
        self.sync_peer_gauges();
    }

    fn fail_back(&mut self, task: u64, frontend: u32) {
        self.metrics.failed_back.inc();
        if !self.frontends.contains_key(&frontend) {
            self.metrics.undeliverable.inc();
            return;
        }
        let head = CompletionHead {
            task_id: task,
            status: TaskStatus::ExecFailed as u32,
            output_kind: OutputKind::None as u32,
            ..CompletionHead::default()
        };
        self.out.push(PeerId::Frontend(frontend), |b| {
            wire::encode_completion(b, &head, &[])
        });
    }

    fn send_dropped(&mut self, task: u64, frontend: u32, reason: DropReason) {
        self.send_drop(task, frontend, reason, 0);
    }

    /// A `Dropped` to `frontend`; `attempt` is named only by a moved
    /// answer (the wire's `reserved` word, zero otherwise).
    fn send_drop(&mut self, task: u64, frontend: u32, reason: DropReason, attempt: u16) {
        self.metrics.count_drop(reason);
        if !self.frontends.contains_key(&frontend) {
            self.metrics.undeliverable.inc();
            return;
        }
        let d = wire::Dropped {
            task_id: task,
            reason: reason.code(),
            reserved: u32::from(attempt),
        };
        self.out
            .push(PeerId::Frontend(frontend), |b| wire::encode(b, &d));
    }

    /// A task message ignored as a copy of a task already taken or handed
    /// back.
    fn count_duplicate(&mut self) {
        self.duplicate_tasks += 1;
        self.metrics.protocol_errors.inc();
    }

    /// A task from frontend `from`.
    pub fn on_task(&mut self, now: Instant, from: u32, task: &Task) {
        self.metrics.tasks_received.inc();
        if task.frontend_id != from || task.id().frontend() != from {
            // A frontend may only submit tasks whose outcome comes back to
            // it: completions are routed by the id's frontend field.
            self.metrics.protocol_errors.inc();
            self.metrics.refuse(MessageRefusal::FrontendMismatch);
            return;
        }
        if self.stopping {
            self.send_dropped(task.task_id, from, DropReason::Shutdown);
            return;
        }
        let Some((sc, local)) = self
            .placement
            .get(task.model_id as usize)
            .copied()
            .flatten()
        else {
            self.send_dropped(task.task_id, from, DropReason::UnknownModel);
            return;
        };
        // Ids are unique per frontend by construction, so a repeat is a
        // duplicated message (or a peer bug). It is ignored while the
        // original can still run: waiting, planned or running, i.e. until
        // the original's deadline. Answering it would answer the original.
        // One indexed entry per task, no hash (`TaskTable::offer`: a
        // window per frontend by staging slot). A repeat of a task that
        // still waits after its hold expired is held again.
        self.forget_handed_back(now);
        if !self.handed_back.is_empty() {
            // Empty unless tasks were handed back as moved: no hash per
            // task otherwise.
            match self.handed_back.get(&task.task_id) {
                Some(&a) if task.attempt() <= a => {
                    // A copy of an attempt already handed back.
                    self.count_duplicate();
                    return;
                }
                Some(_) => {
                    self.handed_back.remove(&task.task_id);
                }
                None => {}
            }
        }
        if !self.owns(task.model_id) {
            if self.ids.seen(task.task_id, now) {
                // A repeat of a task planned before its model moved away
                // (a frontend resubmitting after its link came back): the
                // batch it is in still runs, so it must not go elsewhere.
                self.count_duplicate();
                return;
            }
            // Another group owns it now: the frontend resubmits it there
            // (see `answer_moved`).
            let deadline = task_deadline(now, task.budget_ns);
            self.answer_moved(now, task.task_id, from, task.attempt(), deadline);
            return;
        }
        if !self.subclusters[sc].sched.admits(local) {
            // Overload: refused before the id tables are touched, so that
            // refusing costs the I/O thread less than taking (issue 14,
            // item 2). A repeat of a refused task is refused again; a
            // repeat of one taken is ignored as below (refusing it would
            // answer the original): one lookup, on the refusal path only.
            if self.ids.seen(task.task_id, now) {
                self.count_duplicate();
                return;
            }
            self.metrics.model_drops(task.model_id);
            let level = self.level_index(task.model_id, u16::try_from(task.priority).unwrap_or(u16::MAX));
            self.metrics.level_drops(level, DropReason::Overloaded);
            self.send_dropped(task.task_id, from, DropReason::Overloaded);
            return;
        }
        let deadline = task_deadline(now, task.budget_ns);
        let meta = TaskMeta { frontend: from, input: task.input, model: task.model_id, attempt: task.attempt() };
        let (_, handle) = self.ids.offer(task.task_id, now, deadline, meta);
        let Some(handle) = handle else {
            self.count_duplicate();
            return;
        };
        // The cores know it by its handle (see `task_ids`).
        let req = Request {
            id: handle,
            model: local,
            arrival: now,
            deadline,
            priority: u16::try_from(task.priority).unwrap_or(u16::MAX),
            timed: task.flags & wire::TASK_BUDGET_IS_TIMEOUT != 0,
        };
        self.subclusters[sc]
            .sched
            .on_request(now, req, &mut self.actions);
        if let Some(b) = self.bench.as_mut().filter(|b| b.awaits(from)) {
            // Benchmark only, the one clock read in the plane: the poll's
            // `now` was read before this link's messages were taken, and
            // the lag to measure ends now, when the task is queued.
            if let Some(lag) = b.take_ingress_lag(from, dataplane::time::host_monotonic_ns()) {
                self.metrics.bench_ingress_lag.record(lag);
            }
        }
        self.apply(now, sc);
    }

    /// Whether this group owns global model `model` at the newest routing
    /// revision applied (no table: every model).
    pub fn owns(&self, model: u32) -> bool {
        self.owned.as_ref().is_none_or(|o| o.get(model as usize).copied().unwrap_or(false))
    }

    /// This plane serves a scheduler group: it owns no model until a
    /// routing table is applied.
    pub fn await_routes(&mut self) {
        if self.route_revision == 0 {
            self.owned = Some(vec![false; self.models.len()]);
        }
    }

    /// The newest routing-table revision applied (0: none).
    pub fn route_revision(&self) -> u64 {
        self.route_revision
    }

    /// Plans held back because their model had moved away (see `apply`).
    pub fn unowned_plans_held(&self) -> u64 {
        self.unowned_plans_held
    }

    /// Applies the routing table for group `group` (issue 19), if it is
    /// newer than the one applied: from now on tasks of a model the group
    /// does not own are answered [`DropReason::Moved`], and the queued
    /// (not yet planned) tasks of every model it just lost go back to their
    /// frontends as moved, at once, with their deadlines untouched at the
    /// frontend. Once this returns, no plan of a lost model leaves this
    /// plane. Returns whether the table was applied.
    pub fn set_routes(&mut self, now: Instant, table: &crate::routes::RouteTable, group: &str) -> bool {
        if table.revision <= self.route_revision {
            return false;
        }
        let names: Vec<String> = self.models.iter().map(|m| m.name.clone()).collect();
        let next = table.owned_mask(group, &names);
        let lost: Vec<bool> = (0..next.len()).map(|m| self.owns(m as u32) && !next[m]).collect();
        self.owned = Some(next);
        self.route_revision = table.revision;
        self.metrics.route_revision.set(i64::try_from(table.revision).unwrap_or(i64::MAX));
        if !lost.iter().any(|&l| l) {
            return true;
        }
        let mut queued: Vec<(u64, u64, u32)> = self
            .ids
            .iter_waiting()
            .filter(|(_, _, m)| lost.get(m.model as usize).copied().unwrap_or(false))
            .map(|(handle, id, m)| (id, handle, m.model))
            .collect();
        queued.sort_unstable();
        // `tasks` holds only tasks not yet planned: each is cancelled out
        // of its queue and answered moved (with the pinned engine, when its
        // answer comes back; a plan formed meanwhile is held in `apply`).
        for (id, handle, model) in queued {
            let Some((sc, local)) = self.placement.get(model as usize).copied().flatten() else { continue };
            self.handing_over.insert(id);
            self.subclusters[sc].sched.cancel(now, local, handle, &mut self.actions);
            self.apply(now, sc);
        }
        true
    }

    /// Frontend `from` gave a task up. If the task still waits in its
    /// model's queue it leaves it and is answered as
    /// [`DropReason::Cancelled`]; planned, finished or unknown: nothing
    /// (the frontend discards a result that still comes).
    pub fn on_cancel(&mut self, now: Instant, from: u32, cancel: &wire::Cancel) {
        if cancel.id().frontend() != from {
            self.metrics.protocol_errors.inc();
            self.metrics.refuse(MessageRefusal::FrontendMismatch);
            return;
        }
        let Some((handle, meta)) = self.ids.waiting(cancel.task_id) else { return };
        let Some((sc, local)) = self.placement.get(meta.model as usize).copied().flatten() else { return };
        self.subclusters[sc].sched.cancel(now, local, handle, &mut self.actions);
        self.apply(now, sc);
    }

    /// Sets a model's priority levels, default level and queue bound
    /// (`model`: its index in the cluster's list; unknown: ignored).
    pub fn set_admission(&mut self, model: u32, admission: crate::deferred::Admission) {
        if let Some(a) = self.admissions.get_mut(model as usize) {
            *a = admission;
        }
        if let Some((sc, local)) = self.placement.get(model as usize).copied().flatten() {
            self.subclusters[sc].sched.set_admission(local, admission);
        }
    }

    /// The queue index (0: the highest level) of a task of global `model`
    /// at `priority`.
    fn level_index(&self, model: u32, priority: u16) -> usize {
        self.admissions.get(model as usize).map_or(0, |a| a.level_index(priority))
    }

    /// Forgets the tasks handed back whose deadline has passed.
    fn forget_handed_back(&mut self, now: Instant) {
        while let Some(&Reverse((t, id, attempt))) = self.handed_back_expiry.peek() {
            if t > now {
                break;
            }
            self.handed_back_expiry.pop();
            // A newer attempt handed back since has its own expiry.
            if self.handed_back.get(&id) == Some(&attempt) {
                self.handed_back.remove(&id);
            }
        }
    }

    /// Task messages ignored as repeats of a task already taken.
    pub fn duplicate_tasks(&self) -> u64 {
        self.duplicate_tasks
    }

    /// Backend `from` finished a batch: the batch is done, and the closed
    /// loop and the delay watch learn from the report. A report for a
    /// batch not in flight, or from another backend than the batch's, is
    /// refused and counted.
    pub fn on_batch_done(&mut self, now: Instant, from: u32, done: &wire::BatchDone) {
        let refusal = match self.inflight.get(&done.batch_id) {
            None => Some(MessageRefusal::UnknownBatch),
            Some(f) if f.backend != from => Some(MessageRefusal::WrongBackend),
            Some(_) => None,
        };
        if let Some(r) = refusal {
            self.metrics.protocol_errors.inc();
            self.metrics.refuse(r);
            return;
        }
        let Some(f) = self.inflight.remove(&done.batch_id) else { return };
        let (sc, gpu, local_gpu, model) = (f.subcluster, f.gpu, f.local_gpu, f.model);
        self.recycle(f.tasks);
        self.trim_expiries();
        self.metrics.batches_done.inc();
        self.metrics.actual_busy_ns.inc_by(done.actual_ns());
        self.watch_reads(done);
        if done.gpu_id != local_gpu {
            // Done, but about which device? Nothing to learn from it.
            self.metrics.refuse(MessageRefusal::WrongGpu);
            self.subclusters[sc].closed_loop.forget(gpu, done.batch_id);
        } else {
            self.learn(now, sc, gpu, model, done);
        }
        // The cores take nothing from a report itself (they keep each
        // GPU's planned free time); `learn` has passed on any correction.
        self.apply(now, sc);
    }

    /// Folds a report's READ latency into the delay watch.
    fn watch_reads(&mut self, done: &wire::BatchDone) {
        let Some(v) = self.watch.record(Duration::from_nanos(done.read_max_ns), done.reads) else {
            if done.reads > 0 {
                self.metrics.closed_loop.read_batches.fetch_add(1, Ordering::Relaxed);
            }
            return;
        };
        self.metrics.closed_loop.read_batches.fetch_add(1, Ordering::Relaxed);
        match v {
            Verdict::Exceeded { .. } => {
                self.metrics.closed_loop.delay_bound_alarms.fetch_add(1, Ordering::Relaxed);
            }
            Verdict::Restored { .. } => {}
            Verdict::Adopted { new, .. } => {
                self.metrics.closed_loop.delay_bound_adopted.fetch_add(1, Ordering::Relaxed);
                self.delay.d_data = new;
                for s in &mut self.subclusters {
                    s.sched.set_delay(self.delay);
                }
            }
        }
        if self.verdicts.len() < self.verdicts.capacity() {
            self.verdicts.push(v);
        }
        self.sync_loop_gauges();
    }

    /// The closed loop: places the report on this clock, corrects the
    /// GPU's free time, and plans later batches with the learned factors.
    fn learn(&mut self, now: Instant, sc: usize, gpu: GpuId, model: u32, done: &wire::BatchDone) {
        let global = self.subclusters[sc].models[model as usize] as usize;
        let profiled = match done.count {
            0 => Duration::ZERO,
            n => self.models[global].profile.latency(n),
        };
        let report = Report {
            batch: done.batch_id,
            gpu,
            model,
            count: done.count,
            profiled,
            actual: Duration::from_nanos(done.actual_ns()),
            // It was sent at most `d_ctrl` (the bound) before `now`.
            finished_after: now
                .saturating_sub(Duration::from_nanos(done.finish_ago_ns))
                .saturating_sub(self.control_delay),
        };
        let s = &mut self.subclusters[sc];
        let Some(learned) = s.closed_loop.on_report(now, &report) else { return };
        if !self.loop_cfg.enabled {
            return;
        }
        s.sched.set_gpu_factor(gpu, learned.gpu_factor);
        s.sched.set_model_gpu_factor(model, gpu, learned.model_factor);
        if let Some(free_at) = learned.free_at {
            let counter = match s.planned_free.get(gpu as usize) {
                Some(&p) if free_at < p => &self.metrics.closed_loop.free_corrections_earlier,
                _ => &self.metrics.closed_loop.free_corrections_later,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            if let Some(p) = s.planned_free.get_mut(gpu as usize) {
                *p = free_at;
            }
            s.sched.correct_gpu_free(now, gpu, free_at, &mut self.actions);
        }
    }

    /// A completion a backend could not deliver itself (its frontend was
    /// unknown to it or gone): forwarded if the frontend is live, which
    /// the task id names.
    pub fn on_rerouted_completion(&mut self, msg: &[u8], task_id: u64) {
        let f = TaskId(task_id).frontend();
        if self.frontends.contains_key(&f) {
            self.metrics.forwarded.inc();
            self.out.push(PeerId::Frontend(f), |b| {
                let n = msg.len();
                b.get_mut(..n)
                    .ok_or(wire::WireError::BufferTooSmall)?
                    .copy_from_slice(msg);
                Ok(n)
            });
        } else {
            self.metrics.undeliverable.inc();
        }
    }

    /// When the control plane wants [`on_wake`](Self::on_wake).
    pub fn poll_at(&self) -> Option<Instant> {
        let moved = (!self.moved_held.is_empty() && !self.fenced).then_some(self.moved_release_at);
        self.subclusters
            .iter()
            .filter_map(|s| s.sched.poll_at())
            .chain(moved)
            .min()
    }

    /// Runs every sub-cluster timer due at `now`.
    pub fn on_wake(&mut self, now: Instant) {
        self.release_moved(now);
        for sc in 0..self.subclusters.len() {
            if self.subclusters[sc].sched.poll_at().is_some_and(|t| t <= now) {
                self.subclusters[sc].sched.on_wake(now, &mut self.actions);
                self.apply(now, sc);
            }
        }
    }

    /// Shutdown: every waiting task is dropped (reason `Shutdown`) and new
    /// ones are refused; batches in flight still finish.
    pub fn stop(&mut self) {
        self.stopping = true;
        let mut waiting: Vec<(u64, u32)> = self
            .ids
            .drain_waiting()
            .into_iter()
            .map(|(id, m)| (id, m.frontend))
            .collect();
        // Task order, not hash order: a run is reproducible.
        waiting.sort_unstable();
        for (id, f) in waiting {
            self.send_dropped(id, f, DropReason::Shutdown);
        }
    }

    fn recycle(&mut self, mut v: Vec<(u64, u32)>) {
        v.clear();
        self.spare_task_lists.push(v);
    }

    /// Turns the sub-cluster's actions into messages.
    fn apply(&mut self, now: Instant, sc: usize) {
        let mut actions = std::mem::take(&mut self.actions);
        // The cores name tasks by handle (`req.id`; see `task_ids`).
        for &(req, reason) in &actions.drops {
            if let Some((id, m)) = self.ids.take(req.id) {
                // Empty unless a routing change is handing tasks back: no
                // hash per drop otherwise.
                let handed_back = !self.handing_over.is_empty() && self.handing_over.remove(&id);
                let reason = if handed_back && reason == DropReason::Cancelled { DropReason::Moved } else { reason };
                self.metrics.model_drops(m.model);
                self.metrics.level_drops(self.level_index(m.model, req.priority), reason);
                if reason == DropReason::Moved {
                    // Handed back, not done: its frontend resubmits it to
                    // the owner as its next attempt, which may be this
                    // group again after a move back (then a new
                    // submission, not a duplicate).
                    self.answer_moved(now, id, m.frontend, m.attempt, req.deadline);
                } else {
                    self.send_dropped(id, m.frontend, reason);
                }
            }
        }
        for plan in &actions.batches {
            let members = actions.members_of(plan);
            let Some(&(backend, local_gpu)) =
                self.subclusters[sc].gpu_owner.get(plan.gpu as usize)
            else {
                continue;
            };
            // Self-check: a GPU never gets a batch planned to start before
            // its previous planned batch ends (the harness asserts 0).
            let free = &mut self.subclusters[sc].planned_free;
            if free.len() <= plan.gpu as usize {
                free.resize(plan.gpu as usize + 1, Instant::ZERO);
            }
            if plan.exec_at < free[plan.gpu as usize] {
                self.overlapping_plans += 1;
            }
            free[plan.gpu as usize] = free[plan.gpu as usize].max(plan.finish_at);
            let global_model = self.subclusters[sc].models[plan.model as usize];
            if !self.owns(global_model) {
                // Planned by the cores from a candidate formed before the
                // model moved away: nothing of it leaves this scheduler;
                // its tasks go back to their frontends as moved.
                self.unowned_plans_held += 1;
                self.metrics.unowned_plans_held.inc();
                for r in members {
                    if let Some((id, m)) = self.ids.take(r.id) {
                        self.handing_over.remove(&id);
                        self.metrics.model_drops(m.model);
                        self.answer_moved(now, id, m.frontend, m.attempt, r.deadline);
                    }
                }
                continue;
            }
            let batch_id = self.next_batch;
            self.next_batch += 1;
            let mut list = self.spare_task_lists.pop().unwrap_or_default();
            let head = BatchPlanHead {
                batch_id,
                exec_in_ns: plan.exec_at.saturating_since(now).as_nanos(),
                model_id: global_model,
                gpu_id: local_gpu,
                count: 0,
                run_ns: plan.finish_at.saturating_since(plan.exec_at).as_nanos(),
                epoch: self.epoch,
            };
            if let Some(b) = &self.bench {
                let deadline = members.iter().map(|r| r.deadline).min().unwrap_or(plan.finish_at);
                let stamp = b.plan_stamp(plan.planned_at, plan.exec_at, deadline);
                // Benchmark only: where the dispatch lag goes (decided
                // here, handed to the link in `outbox_sent`, received at
                // the backend).
                self.metrics.bench_decision_lag.record(dataplane::time::host_monotonic_ns().saturating_sub(stamp.at_ns));
                self.bench_unsent.push(stamp.at_ns);
                self.out.push(PeerId::Backend(backend), |buf| wire::encode(buf, &stamp));
            }
            let ids = &mut self.ids;
            self.out.push(PeerId::Backend(backend), |buf| {
                let mut w = BatchPlanWriter::new(buf, &head)?;
                for r in members {
                    if let Some((id, m)) = ids.take(r.id) {
                        w.push(&BatchTask {
                            task_id: id,
                            frontend_id: m.frontend,
                            queued_us: queued_us(now, r.arrival),
                            input: m.input,
                        })?;
                        list.push((id, m.frontend));
                    }
                }
                Ok(w.finish())
            });
            if let Some(a) = self.admissions.get(global_model as usize).filter(|a| a.levels > 1) {
                for r in members {
                    self.metrics.level_dispatched(a.level_index(r.priority), 1);
                }
            } else {
                self.metrics.level_dispatched(0, list.len() as u64);
            }
            self.metrics.record_batch(
                global_model,
                list.len() as u32,
                plan.finish_at.saturating_since(plan.exec_at).as_nanos(),
                now.saturating_since(plan.planned_at).as_nanos(),
            );
            self.subclusters[sc]
                .closed_loop
                .on_plan(plan.gpu, batch_id, plan.exec_at, plan.finish_at);
            self.inflight.insert(
                batch_id,
                InFlight {
                    backend,
                    tasks: list,
                    subcluster: sc,
                    gpu: plan.gpu,
                    local_gpu,
                    model: plan.model,
                },
            );
            self.expiries
                .push(Reverse((plan.finish_at + self.batch_grace, batch_id)));
        }
        actions.clear();
        self.actions = actions;
    }

    fn sync_peer_gauges(&self) {
        let m = &self.metrics;
        m.frontends.set(self.frontends.len() as i64);
        m.backends.set(self.backends.len() as i64);
        m.gpus_online.set(self.online_gpus() as i64);
    }
}

/// A task's time from its ingress to `now` (its plan's sending), µs, as
/// [`BatchTask::queued_us`] carries it.
fn queued_us(now: Instant, arrival: Instant) -> u32 {
    u32::try_from(now.saturating_since(arrival).as_nanos() / 1_000).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_budgets_are_clamped_to_a_minute() {
        let now = Instant::from_nanos(5);
        assert_eq!(task_deadline(now, 40_000_000), now + Duration::from_millis(40));
        assert_eq!(task_deadline(now, u64::MAX), now + MAX_TASK_BUDGET);
    }

    use dataplane::wire::{Message, RemoteRef};
    use crate::runtime::{Drive, PinnedConfig};

    fn models() -> Vec<ModelSpec> {
        vec![
            ModelSpec::linear("a", 1.0, 5.0, 50.0).unwrap(),
            ModelSpec::linear("b", 2.0, 5.0, 100.0).unwrap(),
        ]
    }

    fn plane(subclusters: &[Vec<u32>]) -> ControlPlane {
        let metrics = Arc::new(SchedulerMetrics::new(&models()));
        ControlPlane::new(models(), subclusters, CoreConfig::default(), metrics).unwrap()
    }

    /// The id of a frontend's `seq`-th task (its frontend field set).
    /// Test task `n` of `frontend`: in staging slot `n`, as a frontend
    /// numbers tasks in flight together (the duplicate filter goes by
    /// slot: see `task_ids`).
    fn tid(n: u64, frontend: u32) -> u64 {
        TaskId::new(frontend, 1, n as u32).0
    }

    fn task(id: u64, model: u32, frontend: u32) -> Task {
        Task {
            task_id: tid(id, frontend),
            budget_ns: 40_000_000,
            model_id: model,
            frontend_id: frontend,
            input: RemoteRef {
                key: 1,
                len: 16,
                offset: id * 16,
            },
            ..Default::default()
        }
    }

    /// Every message in the outbox, decoded, with its peer; clears it.
    fn drain(p: &mut ControlPlane) -> Vec<(PeerId, String)> {
        let out = p
            .outbox()
            .iter()
            .map(|(to, b)| (to, format!("{:?}", wire::decode(b).expect("valid message"))))
            .collect();
        p.outbox().clear();
        out
    }

    fn run_until_quiet(p: &mut ControlPlane, from: Instant, limit: Instant) -> Instant {
        let mut now = from;
        while let Some(t) = p.poll_at() {
            if t > limit {
                break;
            }
            now = t.max(now);
            p.on_wake(now);
        }
        now
    }

    #[test]
    fn registration_acks_announces_frontends_and_refuses_bad_peers() {
        let mut p = plane(&[vec![0, 1]]);
        let t0 = Instant::ZERO;
        p.frontend_joined(3, "fe3").unwrap();
        assert_eq!(p.frontend_joined(3, "again"), Err(Refusal::Duplicate(3)));
        assert_eq!(p.frontend_joined(MAX_FRONTENDS, "x"), Err(Refusal::BadId(MAX_FRONTENDS)));
        p.backend_joined(t0, 7, 2, &[0, 1], &[]).unwrap();
        assert_eq!(p.backend_joined(t0, 8, 1, &[0], &[]), Err(Refusal::NoSubCluster));
        assert_eq!(p.backend_joined(t0, 9, 1, &[0, 5], &[]), Err(Refusal::UnknownModel(5)));
        assert_eq!(p.backend_joined(t0, 9, 0, &[0, 1], &[]), Err(Refusal::NoGpus));
        p.frontend_joined(4, "fe4").unwrap();
        let msgs = drain(&mut p);
        let to_backend: Vec<&String> = msgs
            .iter()
            .filter(|(to, _)| *to == PeerId::Backend(7))
            .map(|(_, m)| m)
            .collect();
        assert_eq!(to_backend.len(), 3, "ack + fe3 + fe4: {to_backend:?}");
        assert!(to_backend[1].contains("id: 3"));
        assert!(to_backend[2].contains("id: 4"));
        assert_eq!(msgs.iter().filter(|(to, _)| *to == PeerId::Frontend(3)).count(), 1);
        assert_eq!(p.online_gpus(), 2);
    }

    #[test]
    fn tasks_become_plans_on_the_owning_backend_and_a_dead_backend_fails_its_batches_back() {
        let mut p = plane(&[vec![0], vec![1]]);
        let t0 = Instant::ZERO;
        p.frontend_joined(1, "fe").unwrap();
        p.backend_joined(t0, 10, 1, &[0], &[]).unwrap();
        p.backend_joined(t0, 11, 1, &[1], &[]).unwrap();
        drain(&mut p);
        for i in 0..4 {
            p.on_task(t0, 1, &task(100 + i, 0, 1));
            p.on_task(t0, 1, &task(200 + i, 1, 1));
        }
        // A task naming another frontend is refused without an answer.
        p.on_task(t0, 1, &task(300, 0, 2));
        let now = run_until_quiet(&mut p, t0, t0 + Duration::from_millis(200));
        let msgs = drain(&mut p);
        let plans: Vec<&(PeerId, String)> =
            msgs.iter().filter(|(_, m)| m.starts_with("BatchPlan")).collect();
        assert!(plans.iter().any(|(to, m)| *to == PeerId::Backend(10) && m.contains("model_id: 0")));
        assert!(plans.iter().any(|(to, m)| *to == PeerId::Backend(11) && m.contains("model_id: 1")));
        assert!(plans.iter().all(|(to, m)| (*to == PeerId::Backend(10)) == m.contains("model_id: 0")));
        assert_eq!(p.waiting_tasks(), 0);
        let inflight = p.batches_in_flight();
        assert!(inflight >= 2);
        // Backend 11 dies before reporting: each of its tasks fails back once.
        p.backend_left(now, 11);
        let msgs = drain(&mut p);
        let failed: Vec<&String> = msgs
            .iter()
            .filter(|(to, m)| *to == PeerId::Frontend(1) && m.contains("status: 2"))
            .map(|(_, m)| m)
            .collect();
        assert_eq!(failed.len(), 4, "{msgs:?}");
        for i in 0..4 {
            assert!(failed.iter().any(|m| m.contains(&format!("task_id: {}", tid(200 + i, 1)))));
        }
        assert_eq!(p.online_gpus(), 1);
        // New tasks of model 1 now wait with no GPU and are dropped at their deadline.
        p.on_task(now, 1, &task(400, 1, 1));
        run_until_quiet(&mut p, now, now + Duration::from_secs_f64(1.0));
        let msgs = drain(&mut p);
        assert!(msgs.iter().any(|(_, m)| m.starts_with("Dropped") && m.contains(&format!("task_id: {}", tid(400, 1)))), "{msgs:?}");
    }

    #[test]
    fn a_repeated_task_is_ignored_while_its_original_can_run_and_forgotten_after() {
        let mut p = plane(&[vec![0]]);
        let t0 = Instant::ZERO;
        p.frontend_joined(1, "fe").unwrap();
        p.backend_joined(t0, 10, 1, &[0], &[]).unwrap();
        drain(&mut p);
        p.on_task(t0, 1, &task(7, 0, 1));
        p.on_task(t0, 1, &task(7, 0, 1));
        let mut now = t0;
        while p.batches_in_flight() == 0 {
            now = p.poll_at().expect("a timer until the task is planned");
            p.on_wake(now);
        }
        assert!(now < t0 + Duration::from_millis(40), "planned before its deadline");
        // A copy that arrives after the original was planned is still a copy.
        p.on_task(now, 1, &task(7, 0, 1));
        run_until_quiet(&mut p, now, now + Duration::from_millis(100));
        let plans = drain(&mut p).iter().filter(|(_, m)| m.starts_with("BatchPlan")).count();
        assert_eq!(plans, 1);
        assert_eq!(p.duplicate_tasks(), 2);
        // Past the original's deadline the id is forgotten (ids are reused
        // only with a new sequence number, so nothing old comes back).
        let later = t0 + Duration::from_millis(500);
        p.on_task(later, 1, &task(7, 0, 1));
        assert_eq!(p.duplicate_tasks(), 2);
    }

    #[test]
    fn stop_drops_waiting_tasks_and_refuses_new_ones() {
        let mut p = plane(&[vec![0, 1]]);
        let t0 = Instant::ZERO;
        p.frontend_joined(1, "fe").unwrap();
        drain(&mut p);
        p.on_task(t0, 1, &task(1, 0, 1));
        p.on_task(t0, 1, &task(2, 5, 1));
        p.stop();
        p.on_task(t0, 1, &task(3, 0, 1));
        let msgs = drain(&mut p);
        let reasons: Vec<(u64, u32)> = p_decode_drops(&msgs);
        assert!(reasons.contains(&(tid(2, 1), DropReason::UnknownModel as u32)));
        assert!(reasons.contains(&(tid(1, 1), DropReason::Shutdown as u32)));
        assert!(reasons.contains(&(tid(3, 1), DropReason::Shutdown as u32)));
    }

    #[test]
    fn cancels_timeouts_and_queue_bounds_answer_the_frontend_with_their_reason() {
        let mut p = plane(&[vec![0, 1]]);
        let t0 = Instant::ZERO;
        p.frontend_joined(1, "fe").unwrap();
        p.frontend_joined(2, "fe2").unwrap();
        drain(&mut p);
        p.set_admission(0, crate::deferred::Admission { levels: 2, default_level: 2, max_queue: 2 });
        // No backend: every task waits.
        p.on_task(t0, 1, &task(1, 0, 1));
        p.on_task(t0, 1, &Task { budget_ns: 10_000_000, flags: wire::TASK_BUDGET_IS_TIMEOUT, ..task(2, 0, 1) });
        p.on_task(t0, 1, &task(3, 0, 1));
        assert_eq!(p_decode_drops(&drain(&mut p)), [(tid(3, 1), DropReason::Overloaded as u32)]);
        // Another frontend cannot cancel it; an unknown id changes nothing.
        p.on_cancel(t0, 2, &wire::Cancel { task_id: tid(1, 1) });
        p.on_cancel(t0, 1, &wire::Cancel { task_id: tid(9, 1) });
        assert!(drain(&mut p).is_empty());
        assert_eq!(p.waiting_tasks(), 2);
        p.on_cancel(t0, 1, &wire::Cancel { task_id: tid(1, 1) });
        assert_eq!(p_decode_drops(&drain(&mut p)), [(tid(1, 1), DropReason::Cancelled as u32)]);
        assert_eq!(p.waiting_tasks(), 1);
        // The timed task ends by its 10 ms, as a timeout.
        let mut now = t0;
        while let Some(t) = p.poll_at().filter(|&t| t <= t0 + Duration::from_millis(10)) {
            now = t;
            p.on_wake(now);
        }
        assert_eq!(p_decode_drops(&drain(&mut p)), [(tid(2, 1), DropReason::Timeout as u32)]);
        assert!(now <= t0 + Duration::from_millis(10));
        assert_eq!(p.waiting_tasks(), 0);
        // Counted at their level: the default (lowest) one, 2.
        let text = p.metrics.encode();
        let by_level = |level: u32, reason: DropReason| {
            dataplane::control::metric(&text, &format!("symphony_tasks_dropped_by_level_total{{level=\"{level}\",reason=\"{}\"}}", reason.as_str()))
        };
        for r in [DropReason::Overloaded, DropReason::Cancelled, DropReason::Timeout] {
            assert_eq!((by_level(2, r), by_level(1, r)), (Some(1.0), Some(0.0)), "{r:?}");
        }
    }

    fn routes(revision: u64, a: &[&str], b: &[&str]) -> crate::routes::RouteTable {
        let g = |name: &str, models: &[&str]| crate::routes::RouteGroup {
            name: name.into(),
            election_key: format!("/k/{name}"),
            schedulers: vec![],
            models: models.iter().map(|m| m.to_string()).collect(),
            backends: vec![],
        };
        crate::routes::RouteTable { revision, groups: vec![g("a", a), g("b", b)] }
    }

    #[test]
    fn a_model_moved_away_hands_its_queued_tasks_back_and_refuses_new_ones() {
        let mut p = plane(&[vec![0, 1]]);
        let t0 = Instant::ZERO;
        p.frontend_joined(1, "fe").unwrap();
        drain(&mut p);
        // No backend: every task waits.
        p.on_task(t0, 1, &task(1, 0, 1));
        p.on_task(t0, 1, &task(2, 1, 1));
        p.on_task(t0, 1, &task(3, 0, 1));
        assert!(p.set_routes(t0, &routes(1, &["a", "b"], &[]), "a"));
        assert!(drain(&mut p).is_empty(), "it owns both");
        // Revision 2 moves model "a" (id 0) to group b.
        assert!(p.set_routes(t0, &routes(2, &["b"], &["a"]), "a"));
        let mut moved = p_decode_drops(&drain(&mut p));
        moved.sort_unstable();
        assert_eq!(moved, [(tid(1, 1), DropReason::Moved as u32), (tid(3, 1), DropReason::Moved as u32)]);
        assert_eq!(p.waiting_tasks(), 1, "model b's task stays");
        p.on_task(t0, 1, &task(4, 0, 1));
        assert_eq!(p_decode_drops(&drain(&mut p)), [(tid(4, 1), DropReason::Moved as u32)]);
        // An older or equal revision arriving late changes nothing.
        assert!(!p.set_routes(t0, &routes(1, &["a", "b"], &[]), "a"));
        assert!(!p.owns(0) && p.owns(1) && p.route_revision() == 2);
        let text = p.metrics.encode();
        assert!(text.contains("moved"), "drops by reason count moved");
        // Model "a" comes back: a late copy of a task's attempt handed
        // back is ignored; its next attempt (the frontend's resubmission,
        // same id) is a new submission, not a duplicate.
        assert!(p.set_routes(t0, &routes(3, &["a", "b"], &[]), "a"));
        let dups = p.duplicate_tasks();
        p.on_task(t0, 1, &task(1, 0, 1));
        assert_eq!(p.duplicate_tasks(), dups + 1, "a copy of attempt 0, handed back");
        assert_eq!(p.waiting_tasks(), 1);
        p.on_task(t0, 1, &task(1, 0, 1).with_attempt(1));
        assert!(drain(&mut p).is_empty(), "taken, not answered");
        assert_eq!(p.waiting_tasks(), 2, "task 1 waits again beside model b's");
    }

    /// Seeded runs (the harness's ownership invariant at the plane): tasks
    /// of two models arrive while the table moves model 0 in and out of
    /// this group at random times. After a revision that takes a model
    /// away, no plan of it leaves the plane, and every task ends exactly
    /// once: in one plan or one drop.
    #[test]
    fn under_random_moves_no_plan_of_a_lost_model_leaves_and_every_task_ends_once() {
        use rand::{Rng, SeedableRng};
        for seed in 0..300u64 {
            let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(seed);
            let mut p = plane(&[vec![0, 1]]);
            let t0 = Instant::ZERO;
            p.frontend_joined(1, "fe").unwrap();
            p.backend_joined(t0, 10, 2, &[0, 1], &[]).unwrap();
            drain(&mut p);
            let mut ends: HashMap<u64, u32> = HashMap::new();
            let mut sent = 0u64;
            let mut revision = 0;
            let mut now = t0;
            let account = |p: &mut ControlPlane, ends: &mut HashMap<u64, u32>| {
                let owned = [p.owns(0), p.owns(1)];
                for (_, b) in p.outbox().iter() {
                    match wire::decode(b) {
                        Ok(Message::BatchPlan(head, tasks)) => {
                            assert!(owned[head.model_id as usize], "seed {seed}: a plan of model {} after it moved away", head.model_id);
                            for t in tasks.iter() {
                                *ends.entry(t.task_id).or_default() += 1;
                            }
                        }
                        Ok(Message::Dropped(d)) => *ends.entry(d.task_id).or_default() += 1,
                        _ => {}
                    }
                }
                p.outbox().clear();
            };
            for step in 0..400u64 {
                now += Duration::from_micros(rng.random_range(100..2_000));
                if rng.random_bool(0.03) {
                    revision += 1;
                    let table = if rng.random_bool(0.5) { routes(revision, &["a", "b"], &[]) } else { routes(revision, &["b"], &["a"]) };
                    p.set_routes(now, &table, "a");
                    account(&mut p, &mut ends);
                }
                let model = rng.random_range(0..2u32);
                p.on_task(now, 1, &task(step, model, 1));
                sent += 1;
                while let Some(t) = p.poll_at().filter(|&t| t <= now) {
                    p.on_wake(t.max(now));
                }
                account(&mut p, &mut ends);
            }
            run_until_quiet(&mut p, now, now + Duration::from_millis(1000));
            account(&mut p, &mut ends);
            assert_eq!(ends.len() as u64, sent, "seed {seed}: every task ended");
            assert!(ends.values().all(|&n| n == 1), "seed {seed}: a task ended twice");
            assert_eq!(p.waiting_tasks(), 0);
        }
    }

    fn p_decode_drops(msgs: &[(PeerId, String)]) -> Vec<(u64, u32)> {
        msgs.iter()
            .filter_map(|(_, m)| {
                let id = m.split("task_id: ").nth(1)?.split(',').next()?.parse().ok()?;
                let r = m.split("reason: ").nth(1)?.split(',').next()?.parse().ok()?;
                Some((id, r))
            })
            .collect()
    }

    #[test]
    fn reports_of_unknown_batches_and_tasks_naming_another_frontend_are_refused_and_counted() {
        let mut p = plane(&[vec![0, 1]]);
        let t0 = Instant::ZERO;
        p.frontend_joined(1, "fe").unwrap();
        p.backend_joined(t0, 10, 1, &[0, 1], &[]).unwrap();
        drain(&mut p);
        // The id's own frontend field says 2, the message says 1.
        let mut forged = task(5, 0, 1);
        forged.task_id = tid(5, 2);
        p.on_task(t0, 1, &forged);
        assert_eq!(p.waiting_tasks(), 0);
        p.on_batch_done(t0, 10, &wire::BatchDone { batch_id: 77, ..Default::default() });
        let refused = |p: &ControlPlane, r: MessageRefusal| p.metrics().closed_loop.refused_messages[r.index()].load(Ordering::Relaxed);
        assert_eq!(refused(&p, MessageRefusal::FrontendMismatch), 1);
        assert_eq!(refused(&p, MessageRefusal::UnknownBatch), 1);
        assert!(p.metrics().encode().contains("symphony_messages_refused_total{reason=\"unknown_batch\"} 1"));
    }

    #[test]
    fn a_late_report_corrects_the_gpu_and_teaches_its_speed() {
        let mut p = plane(&[vec![0]]);
        let t0 = Instant::ZERO;
        p.frontend_joined(1, "fe").unwrap();
        p.backend_joined(t0, 10, 1, &[0], &[]).unwrap();
        drain(&mut p);
        let mut now = t0;
        let mut reported = 0;
        for round in 0..20u64 {
            p.on_task(now, 1, &task(round, 0, 1));
            while p.batches_in_flight() == 0 {
                now = p.poll_at().expect("a timer until the task is planned").max(now);
                p.on_wake(now);
            }
            let plan = drain(&mut p).into_iter().find(|(_, m)| m.starts_with("BatchPlan")).expect("a plan");
            let batch_id: u64 = plan.1.split("batch_id: ").nth(1).and_then(|v| v.split(',').next()).and_then(|v| v.parse().ok()).unwrap();
            // l(1) = 6 ms at profile; the GPU takes 9 ms, reported as it ends.
            now += Duration::from_millis(9);
            p.on_batch_done(now, 10, &wire::BatchDone { batch_id, start_ago_ns: 9_000_000, count: 1, ..Default::default() });
            reported += 1;
        }
        assert_eq!(reported, 20);
        let ratio = p.gpu_ratio(10, 0).expect("backend 10 is live");
        assert_eq!(ratio.samples(), 20);
        assert!((ratio.value() - 1.5).abs() < 0.01, "{ratio:?}");
        let e = p.model_estimate(10, 0, 0).unwrap();
        let (a, b) = e.alpha_beta_ms.unwrap();
        assert!((a - 1.5).abs() < 0.02 && (b - 7.5).abs() < 0.1, "{e:?}");
        p.publish_estimates(now);
        let text = p.metrics().encode();
        assert!(text.contains("symphony_gpu_speed_ratio{backend=\"10\",gpu=\"0\"} 1.4"), "{text}");
    }

    /// Drives a plane through a seeded workload on a virtual clock: two
    /// frontends, two backends (one leaves half-way), tasks of both
    /// models at random gaps, some cancelled, batches reported done late
    /// (closed-loop corrections). Returns every message sent, in order.
    fn recorded_workload(p: &mut ControlPlane) -> Vec<(PeerId, Vec<u8>)> {
        let mut sent = Vec::new();
        let take = |p: &mut ControlPlane, sent: &mut Vec<(PeerId, Vec<u8>)>| {
            sent.extend(p.outbox().iter().map(|(to, b)| (to, b.to_vec())));
            p.outbox().clear();
        };
        let t0 = Instant::ZERO;
        p.frontend_joined(1, "fe1").unwrap();
        p.frontend_joined(2, "fe2").unwrap();
        p.backend_joined(t0, 10, 2, &[0, 1], &[]).unwrap();
        p.backend_joined(t0, 11, 1, &[0, 1], &[]).unwrap();
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut now = t0;
        let mut inflight: Vec<(Instant, u32, u64, u32)> = Vec::new();
        for i in 0..400u64 {
            let at = now + Duration::from_micros(next() % 900);
            // Timers and reports due before the next arrival, in time order.
            loop {
                let report = inflight.iter().map(|r| r.0).min();
                let t = [p.poll_at(), report].into_iter().flatten().filter(|&t| t <= at).min();
                let Some(t) = t else { break };
                now = t.max(now);
                if report == Some(t) {
                    let k = inflight.iter().position(|r| r.0 == t).unwrap();
                    let (_, backend, batch_id, count) = inflight.swap_remove(k);
                    let done = wire::BatchDone { batch_id, start_ago_ns: 7_000_000, count, ..Default::default() };
                    p.on_batch_done(now, backend, &done);
                } else {
                    p.on_wake(now);
                }
                for (to, b) in p.outbox().iter() {
                    if let (PeerId::Backend(be), Ok(Message::BatchPlan(h, _))) = (to, wire::decode(b)) {
                        inflight.push((now + Duration::from_nanos(h.exec_in_ns) + Duration::from_millis(7), be, h.batch_id, h.count));
                    }
                }
                take(p, &mut sent);
            }
            now = at;
            let f = 1 + (i % 2) as u32;
            p.on_task(now, f, &task(i, (next() % 2) as u32, f));
            if i % 37 == 5 {
                p.on_cancel(now, f, &wire::Cancel { task_id: tid(i, f) });
            }
            if i == 200 {
                p.backend_left(now, 11);
            }
            for (to, b) in p.outbox().iter() {
                if let (PeerId::Backend(be), Ok(Message::BatchPlan(h, _))) = (to, wire::decode(b)) {
                    inflight.push((now + Duration::from_nanos(h.exec_in_ns) + Duration::from_millis(7), be, h.batch_id, h.count));
                }
            }
            take(p, &mut sent);
        }
        run_until_quiet(p, now, now + Duration::from_secs_f64(1.0));
        take(p, &mut sent);
        sent
    }

    #[test]
    fn the_pinned_engine_in_lockstep_sends_exactly_what_the_inline_engine_sends() {
        let inline = recorded_workload(&mut plane(&[vec![0, 1]]));
        let mut p = plane(&[vec![0, 1]]);
        let cfg = PinnedConfig { model_threads: 1, ..PinnedConfig::default() };
        let layout = p.set_engine(EngineKind::Pinned, &cfg, Drive::Lockstep).unwrap();
        assert_eq!(layout.len(), 2, "a ModelThread and the RankThread: {layout:?}");
        let shared = PinnedConfig { shared_rank: true, ..cfg.clone() };
        assert_eq!(plane(&[vec![0, 1]]).set_engine(EngineKind::Pinned, &shared, Drive::Lockstep).unwrap().len(), 1);
        let pinned = recorded_workload(&mut p);
        let plans = inline.iter().filter(|(_, b)| matches!(wire::decode(b), Ok(Message::BatchPlan(..)))).count();
        let drops = inline.iter().filter(|(_, b)| matches!(wire::decode(b), Ok(Message::Dropped(_)))).count();
        assert!(plans > 10 && drops > 0, "a workload that plans and drops: {plans} plans, {drops} drops");
        assert_eq!(inline.len(), pinned.len());
        for (i, (a, b)) in inline.iter().zip(&pinned).enumerate() {
            assert_eq!(a, b, "message {i} differs");
        }
    }

    #[test]
    fn the_pinned_engine_on_threads_answers_every_task_once() {
        for shared_rank in [false, true] {
            pinned_threads_answer_every_task_once(shared_rank);
        }
    }

    fn pinned_threads_answer_every_task_once(shared_rank: bool) {
        let mut p = plane(&[vec![0], vec![1]]);
        let clock = dataplane::time::MonotonicClock::new();
        let cfg = PinnedConfig { model_threads: 2, shared_rank, ..PinnedConfig::default() };
        let layout = p.set_engine(EngineKind::Pinned, &cfg, Drive::Threads { clock, notify: None }).unwrap();
        let names: Vec<&str> = layout.iter().map(|t| t.thread.as_str()).collect();
        match shared_rank {
            false => assert_eq!(names, ["sched0-model-0", "sched0-rank", "sched1-model-0", "sched1-rank"]),
            true => assert_eq!(names, ["sched0-model-0", "sched1-model-0"]),
        }
        p.frontend_joined(1, "fe").unwrap();
        p.backend_joined(clock.now(), 10, 2, &[0], &[]).unwrap();
        p.backend_joined(clock.now(), 11, 2, &[1], &[]).unwrap();
        p.outbox().clear();
        const TASKS: u64 = 300;
        for i in 0..TASKS {
            p.on_task(clock.now(), 1, &task(i, (i % 2) as u32, 1));
        }
        p.on_cancel(clock.now(), 1, &wire::Cancel { task_id: tid(TASKS - 1, 1) });
        let mut answered = std::collections::HashMap::new();
        // Bounded by the tasks' 40 ms budget: by then each is planned or dropped.
        let give_up = clock.now() + Duration::from_secs_f64(5.0);
        while (answered.len() as u64) < TASKS && clock.now() < give_up {
            if !p.collect(clock.now()) {
                std::thread::yield_now();
            }
            for (_, b) in p.outbox().iter() {
                match wire::decode(b) {
                    Ok(Message::BatchPlan(_, list)) => list.iter().for_each(|t| *answered.entry(t.task_id).or_insert(0) += 1),
                    Ok(Message::Dropped(d)) => *answered.entry(d.task_id).or_insert(0) += 1,
                    _ => {}
                }
            }
            p.outbox().clear();
        }
        assert_eq!(answered.len() as u64, TASKS, "every task planned or dropped");
        assert!(answered.values().all(|&n| n == 1), "none twice");
        assert_eq!(p.waiting_tasks(), 0);
        assert_eq!(p.overlapping_plans(), 0);
    }

    #[test]
    fn outbox_messages_decode() {
        let mut o = Outbox::new();
        o.push(PeerId::Frontend(1), |b| wire::encode(b, &wire::Heartbeat { seq: 1, role: 3, id: 0 }));
        assert_eq!(o.len(), 1);
        let (_, b) = o.iter().next().unwrap();
        assert!(matches!(wire::decode(b), Ok(Message::Heartbeat(_))));
    }

    /// A new term hands a task to another group (answers `moved`) only
    /// once its fence has lifted and the GPUs its backends reported busy
    /// (with the previous term's batches, which may hold that task) have
    /// freed; a task it queued and a table then took away waits the same.
    #[test]
    fn a_new_term_answers_moved_only_after_its_fence_and_the_reported_busy_gpus() {
        let mut p = plane(&[vec![0, 1]]);
        let t0 = Instant::ZERO;
        p.set_epoch(4);
        p.fence();
        p.await_routes();
        assert!(p.set_routes(t0, &routes(2, &["b"], &["a"]), "a"), "model a (id 0) is group b's");
        p.frontend_joined(1, "fe1").unwrap();
        let busy = [wire::GpuBusy { busy_ns: 20_000_000, gpu_id: 0, batches: 1 }];
        p.backend_joined(t0, 10, 1, &[0, 1], &busy).unwrap();
        let _ = drain(&mut p);
        p.on_task(t0, 1, &task(1, 0, 1));
        p.on_task(t0, 1, &task(2, 1, 1));
        assert!(p_decode_drops(&drain(&mut p)).is_empty(), "fenced: nothing handed over");
        // Model b (id 1) moves away too while task 2 waits in its queue.
        assert!(p.set_routes(t0, &routes(3, &[], &["a", "b"]), "a"));
        assert!(p_decode_drops(&drain(&mut p)).is_empty(), "still fenced");
        let t1 = t0 + Duration::from_millis(5);
        p.lift_fence(t1);
        assert!(p_decode_drops(&drain(&mut p)).is_empty(), "GPU 0 is busy until 20 ms");
        let release = t0 + Duration::from_millis(20);
        assert_eq!(p.poll_at(), Some(release));
        p.on_wake(release - Duration::from_nanos(1));
        assert!(p_decode_drops(&drain(&mut p)).is_empty());
        p.on_wake(release);
        let mut moved = p_decode_drops(&drain(&mut p));
        moved.sort_unstable();
        assert_eq!(moved, [(tid(1, 1), DropReason::Moved as u32), (tid(2, 1), DropReason::Moved as u32)]);
        // From now on a task of a model it does not own is answered at once.
        p.on_task(release, 1, &task(3, 0, 1));
        assert_eq!(p_decode_drops(&drain(&mut p)), [(tid(3, 1), DropReason::Moved as u32)]);
    }

    /// A frontend that lost its link resubmits what it had sent; a task
    /// already planned before its model moved away is in a batch that
    /// still runs, so the repeat is ignored (a duplicate), not answered
    /// `moved` (which would send it to the new owner as well).
    #[test]
    fn a_repeat_of_a_task_planned_before_its_model_moved_away_is_ignored() {
        let mut p = plane(&[vec![0, 1]]);
        let t0 = Instant::ZERO;
        assert!(p.set_routes(t0, &routes(1, &["a", "b"], &[]), "a"));
        p.frontend_joined(1, "fe1").unwrap();
        p.backend_joined(t0, 10, 1, &[0, 1], &[]).unwrap();
        p.on_task(t0, 1, &task(1, 0, 1));
        run_until_quiet(&mut p, t0, t0 + Duration::from_millis(100));
        let plans = drain(&mut p).into_iter().filter(|(_, m)| m.starts_with("BatchPlan")).count();
        assert_eq!(plans, 1, "task 1 is planned and sent");
        assert!(p.set_routes(t0, &routes(2, &["b"], &["a"]), "a"));
        let before = p.duplicate_tasks();
        p.on_task(t0, 1, &task(1, 0, 1));
        assert!(p_decode_drops(&drain(&mut p)).is_empty(), "not handed to group b");
        assert_eq!(p.duplicate_tasks(), before + 1);
        // A task it never had is answered moved.
        p.on_task(t0, 1, &task(2, 0, 1));
        assert_eq!(p_decode_drops(&drain(&mut p)), [(tid(2, 1), DropReason::Moved as u32)]);
    }

    #[test]
    fn a_fence_holds_joining_gpus_out_until_lifted_and_forgets_a_backend_that_left() {
        let mut p = plane(&[vec![0, 1]]);
        let t0 = Instant::ZERO;
        p.set_epoch(4);
        p.fence();
        p.frontend_joined(1, "fe1").unwrap();
        p.backend_joined(t0, 10, 1, &[0, 1], &[]).unwrap();
        p.backend_joined(t0, 11, 2, &[0, 1], &[]).unwrap();
        assert_eq!(p.online_gpus(), 0, "held by the fence");
        p.on_task(t0, 1, &task(1, 0, 1));
        let _ = drain(&mut p);
        p.backend_left(t0, 10);
        let t1 = t0 + Duration::from_millis(5);
        p.lift_fence(t1);
        assert!(!p.fenced());
        assert_eq!(p.online_gpus(), 2, "backend 11's GPUs only");
        run_until_quiet(&mut p, t1, t1 + Duration::from_millis(100));
        let plans: Vec<_> = drain(&mut p).into_iter().filter(|(_, m)| m.starts_with("BatchPlan")).collect();
        assert_eq!(plans.len(), 1, "the queued task runs once the fence lifts: {plans:?}");
        assert!(plans[0].1.contains("epoch: 4") && plans[0].0 == PeerId::Backend(11), "{plans:?}");
    }
}
