//! The scheduler daemon's control plane as a sans-IO state machine: peers
//! joining and leaving, tasks in, batch plans and drops out, failing back
//! the batches of a backend that died. It takes `now` from the caller and
//! writes every message it wants sent into an [`Outbox`]; the I/O loop in
//! `daemon::run` moves the bytes. Tests drive it on a virtual clock.
//!
//! # Parts
//!
//! In the way quinn-proto splits a connection, the plane is composed of
//! parts, each with its own state, its inputs (`now` and what happened)
//! and its outputs (returned values, or messages in the outbox);
//! [`ControlPlane`] only routes between them and the scheduling cores:
//! - `membership`: the registered frontends and backends, the checks a
//!   registration passes, where each backend's GPUs sit, and which
//!   backends drain (see [`ControlPlane::backend_draining`]);
//! - `ledger`: every task from arrival to answer (waiting tasks and the
//!   duplicate filter, batches in flight and their expiry, tasks handed
//!   back to another group);
//! - `dispatch`: the one translation of decisions into wire messages;
//! - `ownership`: the election epoch, the fence, the routing table's
//!   share of the models, and the tasks handed back as moved;
//! - `delay_bound`: the network delay bound's one owner and its one update
//!   path (the READ tail watch);
//! - `telemetry`: the closed loop, the overlap self-check, the estimates
//!   published, and the benchmark stamps (whose host clock the host
//!   hands in: no part reads a clock).
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

mod delay_bound;
mod dispatch;
mod ledger;
mod links;
mod membership;
mod outbox;
mod ownership;
mod telemetry;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// The hasher of the plane's per-task and per-batch tables (keyed by task
/// and batch ids): foldhash, seeded per process. SipHash (std's default)
/// was ~10% of a saturated daemon's time for four lookups per task;
/// foldhash keeps a random per-process seed, so a peer cannot aim ids at
/// one bucket without knowing it (docs/decisions.md).
pub(super) type IdHasher = foldhash::fast::RandomState;
type IdMap<V> = HashMap<u64, V, IdHasher>;
type IdSet = HashSet<u64, IdHasher>;

use dataplane::time::{Duration, Instant};
use dataplane::wire::{self, BatchPlanHead, BenchStamp, DropReason, Task, TaskId};

use super::engine::{Engine, EngineKind};
use super::metrics::{MessageRefusal, SchedulerMetrics};
use super::task_ids::TaskMeta;
use crate::closed_loop::{Estimate, LoopConfig, Ratio};
use crate::deferred::{CoreConfig, DeferredScheduler};
use crate::delay_watch::{DelayWatch, DelayWatchConfig, Verdict};
use crate::netdelay::NetworkDelay;
use crate::runtime::{Drive, PinnedConfig, PinnedScheduler, ThreadPlacement};
use crate::types::{Actions, BatchPlan, GpuId, Request};
use crate::zoo::ModelSpec;

use delay_bound::DelayBound;
use dispatch::Dispatch;
use ledger::{Finished, InFlight, TaskLedger};
pub use membership::Refusal;
use membership::{Drain, Gated, Membership};
pub use outbox::{Outbox, PeerId};
use ownership::Ownership;
pub use telemetry::HostClock;
use telemetry::Telemetry;

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

/// One sub-cluster: its models and the engine that schedules them.
struct SubCluster {
    /// Global model ids, by local id.
    models: Vec<u32>,
    sched: Engine,
    /// (backend, local GPU) of each sub-cluster GPU id.
    gpu_owner: Vec<(u32, u32)>,
}

/// The control plane (see the module docs).
pub struct ControlPlane {
    models: Vec<ModelSpec>,
    /// Sub-cluster and local model id of each global model (None: unserved).
    placement: Vec<Option<(usize, u32)>>,
    /// Each model's admission (by global id): the priority level of a
    /// task, for the per-level counters.
    admissions: Vec<crate::types::Admission>,
    subclusters: Vec<SubCluster>,
    /// The cores' configuration as given; its delay bound is
    /// [`DelayBound`]'s (see [`ControlPlane::core_config`]).
    core: CoreConfig,
    members: Membership,
    ledger: TaskLedger,
    ownership: Ownership,
    bound: DelayBound,
    telemetry: Telemetry,
    dispatch: Dispatch,
    /// The cores' decisions, turned into messages by [`ControlPlane::apply`].
    actions: Actions,
    metrics: Arc<SchedulerMetrics>,
    stopping: bool,
    /// Tasks of frontends waiting for data links, with their arrival (see
    /// `links`).
    link_held: Vec<(Instant, Task)>,
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
            });
        }
        Ok(ControlPlane {
            admissions: vec![crate::types::Admission::default(); models.len()],
            telemetry: Telemetry::new(scs.iter().map(|s| s.models.len()), metrics.clone()),
            bound: DelayBound::new(core.delay, metrics.clone()),
            dispatch: Dispatch::new(metrics.clone()),
            models,
            placement,
            subclusters: scs,
            core,
            members: Membership::new(metrics.registry()),
            ledger: TaskLedger::new(),
            ownership: Ownership::default(),
            actions: Actions::default(),
            metrics,
            stopping: false,
            link_held: Vec::new(),
        })
    }

    /// Planned tasks carry capabilities signed with `key` (none: unsigned;
    /// see `plane/dispatch.rs`).
    pub fn set_capability_key(&mut self, key: Option<dataplane::capability::CapabilityKey>) {
        self.dispatch.set_capability_key(key);
    }

    /// The cores' configuration with the delay bound in force.
    fn core_config(&self) -> CoreConfig {
        CoreConfig { delay: self.bound.current(), ..self.core }
    }

    /// Runs every sub-cluster's scheduling cores on `kind` (inline by
    /// default). Each sub-cluster gets `pinned.model_threads` ModelThreads
    /// and a RankThread; `pinned.cores` is dealt to them in sub-cluster
    /// order. Only before any peer joined (the cores start empty). Returns
    /// where each thread was asked to run (empty inline).
    pub fn set_engine(&mut self, kind: EngineKind, pinned: &PinnedConfig, drive: Drive) -> Result<Vec<ThreadPlacement>, PlaneError> {
        if self.members.peers() != (0, 0) || self.ledger.waiting_len() > 0 {
            return Err(PlaneError::EngineInUse);
        }
        let core = self.core_config();
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

    // --- configuration and what the parts report ---------------------------

    /// The closed loop's configuration (on by default).
    pub fn set_closed_loop(&mut self, cfg: LoopConfig) {
        self.telemetry.set_closed_loop(cfg);
    }

    /// The closed loop's configuration.
    pub fn closed_loop(&self) -> LoopConfig {
        self.telemetry.closed_loop()
    }

    /// How the READ tail of `transport` (a metric label: the transport
    /// this scheduler's links use) is held against the per-input bound.
    pub fn set_delay_watch(&mut self, transport: &str, cfg: DelayWatchConfig) {
        self.bound.set_watch(transport, cfg);
    }

    /// The READ tail watch.
    pub fn delay_watch(&self) -> &DelayWatch {
        self.bound.watch()
    }

    /// Benchmark-only: record ingress lags from frontends' stamps and
    /// stamp every plan (see [`super::bench_stamps`]); `origin_host_ns` is
    /// the host clock at this process's clock origin, and `host_clock`
    /// the host's clock (e.g. [`dataplane::time::host_monotonic_ns`]):
    /// the plane reads no clock of its own.
    pub fn set_bench_stamps(&mut self, origin_host_ns: Option<u64>, host_clock: HostClock) {
        self.telemetry.set_bench_stamps(origin_host_ns, host_clock);
    }

    /// The outbox was handed to the links. Benchmark only: records the
    /// send lag of each plan it held.
    pub fn outbox_sent(&mut self) {
        self.telemetry.outbox_sent();
    }

    /// A frontend's benchmark stamp for its next task (ignored unless
    /// stamps are on).
    pub fn on_bench_stamp(&mut self, from: u32, s: &BenchStamp) {
        self.telemetry.on_bench_stamp(from, s);
    }

    /// The network delay bound the cores charge now.
    pub fn delay(&self) -> NetworkDelay {
        self.bound.current()
    }

    /// The control delay bound every peer is told in its `Welcome`.
    pub fn control_delay(&self) -> Duration {
        self.bound.control()
    }

    /// The oldest delay-watch verdict not yet taken (for the host's log).
    pub fn take_delay_verdict(&mut self) -> Option<Verdict> {
        self.bound.take_verdict()
    }

    /// The closed loop's speed ratio of a live backend's GPU (measured
    /// over profiled time, pooled over its models).
    pub fn gpu_ratio(&self, backend: u32, local_gpu: u32) -> Option<Ratio> {
        let (sc, g) = self.members.locate_gpu(backend, local_gpu)?;
        Some(self.telemetry.gpu_ratio(sc, g))
    }

    /// The closed loop's speed ratio of every live backend's GPUs, as
    /// (backend, GPU index, ratio), in id order.
    pub fn gpu_ratios(&self) -> Vec<(u32, u32, Ratio)> {
        let mut v: Vec<(u32, u32, Ratio)> =
            self.members.gpus().map(|(b, i, sc, g)| (b, i, self.telemetry.gpu_ratio(sc, g))).collect();
        v.sort_unstable_by_key(|&(b, g, _)| (b, g));
        v
    }

    /// The closed loop's estimate of `model` (global id) on a live
    /// backend's GPU.
    pub fn model_estimate(&self, backend: u32, local_gpu: u32, model: u32) -> Option<Estimate> {
        let (sc, g) = self.members.locate_gpu(backend, local_gpu)?;
        let (psc, local) = self.placement.get(model as usize).copied().flatten()?;
        (psc == sc).then(|| {
            let line = self.models[model as usize].profile.linear_coefficients();
            self.telemetry.estimate(sc, local, g, line)
        })
    }

    /// Republishes the closed loop's estimates into the metrics, at most
    /// every [`PUBLISH_EVERY`] (a lock per publication, none per message).
    pub fn publish_estimates(&mut self, now: Instant) {
        self.telemetry.publish(now, &self.subclusters, &self.models);
    }

    /// Batches planned onto a GPU before its previous planned batch there
    /// ended (a scheduling bug; stays 0).
    pub fn overlapping_plans(&self) -> u64 {
        self.telemetry.overlapping_plans()
    }

    /// Messages to send; the caller sends them and then calls
    /// [`Outbox::clear`].
    pub fn outbox(&mut self) -> &mut Outbox {
        self.dispatch.outbox()
    }

    /// The metrics the plane counts into.
    pub fn metrics(&self) -> &Arc<SchedulerMetrics> {
        &self.metrics
    }

    /// The served models.
    pub fn models(&self) -> &[ModelSpec] {
        &self.models
    }

    /// Tasks waiting in sub-clusters.
    pub fn waiting_tasks(&self) -> usize {
        self.ledger.waiting_len()
    }

    /// Batches sent and not reported done.
    pub fn batches_in_flight(&self) -> usize {
        self.ledger.in_flight()
    }

    /// GPUs in matchmaking, over all sub-clusters.
    pub fn online_gpus(&self) -> usize {
        self.subclusters.iter().map(|s| s.sched.online_gpus()).sum()
    }

    /// Live frontends and backends.
    pub fn peers(&self) -> (usize, usize) {
        self.members.peers()
    }

    /// Task messages ignored as repeats of a task already taken.
    pub fn duplicate_tasks(&self) -> u64 {
        self.ledger.duplicate_tasks()
    }

    // --- batches in flight -------------------------------------------------

    /// How long after a batch's planned finish its `BatchDone` is waited
    /// for before [`expire_overdue`](Self::expire_overdue) gives it up.
    pub fn set_batch_grace(&mut self, grace: Duration) {
        self.ledger.set_batch_grace(grace);
    }

    /// When the earliest batch in flight becomes overdue (may be the
    /// deadline of a batch already reported: then expiring finds nothing).
    pub fn next_expiry(&self) -> Option<Instant> {
        self.ledger.next_expiry()
    }

    /// Gives up on every batch whose `BatchDone` has not come within the
    /// grace after its planned finish: its tasks are failed back to their
    /// frontends (a frontend keeps the first outcome of a task and counts
    /// later ones as duplicates, so this is safe if the completions did
    /// arrive) and its record is dropped, so that a lost `BatchDone` does
    /// not hold a shutdown drain or leak the record. The GPU itself never
    /// waits for a `BatchDone`: the RankThread frees it at its planned
    /// finish. A `BatchDone` that comes later is still learned from (the
    /// ledger keeps the last [`ledger::EXPIRED_RING`] batches given up);
    /// one for a batch given up longer ago is counted as a protocol error.
    /// Returns how many batches were given up.
    pub fn expire_overdue(&mut self, now: Instant) -> usize {
        let mut expired = 0;
        while let Some((batch, backend, local_gpu)) = self.ledger.pop_suspect(now) {
            self.hold_gpu(now, batch, backend, local_gpu);
        }
        while let Some((batch, f)) = self.ledger.pop_overdue(now) {
            self.telemetry.forget(f.subcluster, f.gpu, batch);
            self.hold_gpu(now, batch, f.backend, f.local_gpu);
            let backend = f.backend;
            self.fail_back_batch(f);
            self.release_if_done(backend);
            expired += 1;
        }
        expired
    }

    /// Every task of a batch that will not finish goes back to its
    /// frontend as failed.
    fn fail_back_batch(&mut self, f: InFlight) {
        for &(task, frontend) in &f.tasks {
            self.dispatch.fail_back(task, frontend, self.members.frontend_live(frontend));
        }
        self.ledger.recycle(f.tasks);
    }

    // --- ownership -------------------------------------------------------------

    /// The election epoch stamped in every `Welcome` and plan (0: no
    /// election, the embedded default).
    pub fn set_epoch(&mut self, epoch: u32) {
        self.ownership.set_epoch(epoch);
    }

    /// The epoch in force.
    pub fn epoch(&self) -> u32 {
        self.ownership.epoch()
    }

    /// Holds every GPU that joins from now on out of matchmaking: nothing
    /// is planned (tasks queue, dropped only by their deadlines) until
    /// [`lift_fence`](Self::lift_fence).
    pub fn fence(&mut self) {
        self.ownership.fence();
    }

    /// Whether GPUs are held out of matchmaking.
    pub fn fenced(&self) -> bool {
        self.ownership.fenced()
    }

    /// Puts the GPUs held by the fence into matchmaking (each busy until
    /// its backend's report said); planning starts.
    pub fn lift_fence(&mut self, now: Instant) {
        for (backend, sc, g, free_at) in self.ownership.lift_fence() {
            if self.members.drain_of(backend) != Drain::No {
                continue;
            }
            self.subclusters[sc].sched.gpu_joined_busy(now, g, free_at, &mut self.actions);
            self.apply(now, sc);
        }
        self.release_moved(now);
        self.sync_peer_gauges();
    }

    /// Whether this group owns global model `model` at the newest routing
    /// revision applied (no table: every model).
    pub fn owns(&self, model: u32) -> bool {
        self.ownership.owns(model)
    }

    /// This plane serves a scheduler group: it owns no model until a
    /// routing table is applied.
    pub fn await_routes(&mut self) {
        self.ownership.await_routes(self.models.len());
    }

    /// The newest routing-table revision applied (0: none).
    pub fn route_revision(&self) -> u64 {
        self.ownership.route_revision()
    }

    /// Plans held back because their model had moved away (see `apply`).
    pub fn unowned_plans_held(&self) -> u64 {
        self.ownership.unowned_plans_held()
    }

    /// Applies the routing table for group `group` (issue 19), if it is
    /// newer than the one applied: from now on tasks of a model the group
    /// does not own are answered [`DropReason::Moved`], and the queued
    /// (not yet planned) tasks of every model it just lost go back to their
    /// frontends as moved, at once, with their deadlines untouched at the
    /// frontend. Once this returns, no plan of a lost model leaves this
    /// plane. Returns whether the table was applied.
    pub fn set_routes(&mut self, now: Instant, table: &crate::routes::RouteTable, group: &str) -> bool {
        if table.revision <= self.ownership.route_revision() {
            return false;
        }
        let names: Vec<String> = self.models.iter().map(|m| m.name.clone()).collect();
        let Some(lost) = self.ownership.apply_routes(table, group, &names) else { return false };
        self.metrics.route_revision.set(i64::try_from(table.revision).unwrap_or(i64::MAX));
        if !lost.iter().any(|&l| l) {
            return true;
        }
        // Only tasks not yet planned wait: each is cancelled out of its
        // queue and answered moved (with the pinned engine, when its
        // answer comes back; a plan formed meanwhile is held in `apply`).
        for (id, handle, model) in self.ledger.waiting_of(&lost) {
            let Some((sc, local)) = self.placement.get(model as usize).copied().flatten() else { continue };
            self.ownership.hand_over(id);
            self.subclusters[sc].sched.cancel(now, local, handle, &mut self.actions);
            self.apply(now, sc);
        }
        true
    }

    /// Hands `task` back to `frontend` as moved: at once, or, while a
    /// batch of a previous scheduler of this group may still hold or run
    /// it, once that can no longer be (see `ownership`).
    /// The attempt handed back is remembered until `deadline`.
    fn answer_moved(&mut self, now: Instant, task: u64, frontend: u32, attempt: u16, deadline: Instant) {
        self.ledger.hand_back(task, attempt, deadline);
        if !self.ownership.hold_moved(now, (task, frontend, attempt)) {
            self.send_drop(task, frontend, DropReason::Moved, attempt);
        }
    }

    /// Answers the tasks held as moved once the fence has lifted and the
    /// GPUs reported busy have freed.
    fn release_moved(&mut self, now: Instant) {
        for (task, frontend, attempt) in self.ownership.release_moved(now) {
            self.send_drop(task, frontend, DropReason::Moved, attempt);
        }
    }

    // --- membership -------------------------------------------------------------

    /// The registration's acknowledgement: the model count and `d_ctrl`.
    fn ack(&mut self, to: PeerId) {
        // Unsigned here: the node signs it (it knows the handshake's nonces).
        let welcome = wire::Welcome::new(self.models.len() as u32, self.ownership.epoch(), self.bound.control().as_nanos());
        self.dispatch.welcome(to, &welcome);
    }

    /// A frontend registered with its data endpoint.
    pub fn frontend_joined(&mut self, id: u32, endpoint: &str) -> Result<(), Refusal> {
        self.members.check_frontend(id)?;
        // A restarted frontend numbers its tasks from the start again.
        self.ledger.frontend_registered(id);
        self.members.add_frontend(id, endpoint);
        self.ack(PeerId::Frontend(id));
        for b in self.members.backends_sorted() {
            self.dispatch.announce_frontend(b, id, endpoint);
            self.ask_link(b, id);
        }
        self.sync_peer_gauges();
        Ok(())
    }

    /// A backend registered with `gpus` GPUs holding `models`; `busy` says
    /// how long after `now` each of its GPUs named there is still busy with
    /// batches it holds (planned by an earlier scheduler): nothing is
    /// planned on such a GPU to start before then. Its GPUs join
    /// matchmaking at once (a backend that does not report its readiness;
    /// see [`backend_registered`](Self::backend_registered)).
    pub fn backend_joined(&mut self, now: Instant, id: u32, gpus: u32, models: &[u32], busy: &[wire::GpuBusy]) -> Result<(), Refusal> {
        self.backend_registered(now, id, gpus, models, busy, false)
    }

    /// [`backend_joined`](Self::backend_joined), and with `reports_ready`
    /// (its Join's [`wire::JOIN_REPORTS_READY`]) behind the join gate: it
    /// is sent the frontends' announcements, then `Drain{Ready}`, and its
    /// GPUs join matchmaking only once it answers `Drain{Ready}` (its data
    /// links to those frontends are up; [`backend_ready`](Self::backend_ready)),
    /// so that no plan reaches it before it can READ its tasks' inputs.
    pub fn backend_registered(
        &mut self,
        now: Instant,
        id: u32,
        gpus: u32,
        models: &[u32],
        busy: &[wire::GpuBusy],
        reports_ready: bool,
    ) -> Result<(), Refusal> {
        self.members.check_backend(id, gpus, models, busy, self.models.len())?;
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
        let free_at: Vec<Instant> = (0..gpus as usize)
            .map(|local| {
                busy.iter()
                    .find(|b| b.gpu_id as usize == local)
                    .map_or(now, |b| now.saturating_add(Duration::from_nanos(b.busy_ns)))
            })
            .collect();
        let gated = reports_ready.then(|| Gated { since: now, free_at: free_at.clone() });
        self.members.add_backend(id, sc, ids.clone(), gated);
        self.ack(PeerId::Backend(id));
        for (f, endpoint) in self.members.frontends_sorted() {
            self.dispatch.announce_frontend(id, f, &endpoint);
        }
        if reports_ready {
            // After the announcements on the same link: "those were all".
            self.send_ready_request(id);
        } else {
            self.gpus_to_matchmaking(now, id, sc, &ids, &free_at);
        }
        self.sync_peer_gauges();
        Ok(())
    }

    /// Backend `id` reported `Drain{Ready}`: its data links to the
    /// frontends announced at its registration are up; its GPUs join
    /// matchmaking now (each busy until its registration's report said).
    /// A repeated or unexpected report, or one from a backend that drains,
    /// changes nothing.
    pub fn backend_ready(&mut self, now: Instant, id: u32) {
        self.link_answered(now, id);
        let Some((sc, ids, gated)) = self.members.pass_gate(id) else { return };
        self.members.record_join(now.saturating_since(gated.since).as_nanos() / 1_000_000);
        self.gpus_to_matchmaking(now, id, sc, &ids, &gated.free_at);
        self.sync_peer_gauges();
    }

    /// Offers backend `id`'s GPUs `ids` of sub-cluster `sc` to
    /// matchmaking (held while fenced), each busy until `free_at`.
    fn gpus_to_matchmaking(&mut self, now: Instant, id: u32, sc: usize, ids: &[GpuId], free_at: &[Instant]) {
        for (&g, &free_at) in ids.iter().zip(free_at) {
            // The self-check of overlapping plans starts from the report.
            self.telemetry.gpu_joined(sc, g, free_at);
            if self.ownership.gpu_joined((id, sc, g, free_at)) {
                continue;
            }
            self.subclusters[sc].sched.gpu_joined_busy(now, g, free_at, &mut self.actions);
            self.apply(now, sc);
        }
    }

    /// A frontend left (disconnected or silent). Its tasks stay scheduled:
    /// their READs fail at the backend and the outcomes go nowhere.
    pub fn frontend_left(&mut self, id: u32) {
        self.forget_link_wait(id);
        if self.members.remove_frontend(id) {
            self.sync_peer_gauges();
        }
    }

    /// A backend left: its GPUs leave matchmaking and every task of its
    /// in-flight batches is failed back to its frontend.
    pub fn backend_left(&mut self, now: Instant, id: u32) {
        let Some(b) = self.members.remove_backend(id) else {
            return;
        };
        if b.drain == Drain::Released {
            // A graceful leave: nothing of it is in flight (unless the
            // pinned engine's rings still held a plan for it, failed back
            // below as from a crash).
            self.metrics.backends_drained.inc();
        } else {
            self.metrics.backend_deaths.inc();
        }
        self.ownership.backend_left(id);
        for &g in &b.gpus {
            self.telemetry.gpu_left(b.subcluster, g);
            self.subclusters[b.subcluster].sched.set_gpu_online(now, g, false, &mut self.actions);
            self.apply(now, b.subcluster);
        }
        for f in self.ledger.take_backend(id) {
            self.fail_back_batch(f);
        }
        self.ledger.trim_expiries();
        self.link_gone(now, id);
        self.sync_peer_gauges();
    }

    /// Backend `id` drains (its `Drain` notice: a backend told to stop,
    /// e.g. by SIGTERM on a scale-in): its GPUs leave matchmaking now (the
    /// cores' GPU offline, the one membership mechanism the simulator's
    /// autoscaler also uses), the batches already planned to it run and
    /// are reported, and once none of them is in flight it is sent
    /// `Drain{Released}`: it may leave, and nothing will be planned to it.
    /// It then closes its link ([`backend_left`](Self::backend_left), no
    /// fail-back). A repeated notice (the backend resends it until
    /// released) is answered again once released; one from an unknown
    /// backend is ignored. If the backend dies meanwhile, its batches in
    /// flight fail back as for any death.
    pub fn backend_draining(&mut self, now: Instant, id: u32) {
        if let Some((sc, gpus)) = self.members.start_drain(id) {
            // A fenced GPU of it is never put into matchmaking.
            self.ownership.backend_left(id);
            for g in gpus {
                self.subclusters[sc].sched.set_gpu_online(now, g, false, &mut self.actions);
                self.apply(now, sc);
            }
            self.link_gone(now, id);
            self.sync_peer_gauges();
        }
        if self.members.drain_of(id) == Drain::Released {
            self.send_released(id);
        } else {
            self.release_if_done(id);
        }
    }

    /// Releases backend `id` if it drains and nothing planned to it is in
    /// flight. Costs nothing while no backend drains.
    fn release_if_done(&mut self, id: u32) {
        if self.members.drain_of(id) == Drain::Draining && !self.ledger.holds_backend(id) {
            self.members.mark_released(id);
            self.send_released(id);
        }
    }

    fn send_released(&mut self, id: u32) {
        let released = wire::Drain::released(id);
        self.dispatch.outbox().push(PeerId::Backend(id), |b| wire::encode(b, &released));
    }

    /// Backends draining or released and still linked.
    pub fn draining_backends(&self) -> usize {
        self.members.draining()
    }

    fn sync_peer_gauges(&self) {
        let m = &self.metrics;
        let (frontends, backends) = self.members.peers();
        m.frontends.set(frontends as i64);
        m.backends.set(backends as i64);
        m.gpus_online.set(self.online_gpus() as i64);
    }

    // --- tasks ---------------------------------------------------------------

    /// A `Dropped` with no attempt named.
    fn send_dropped(&mut self, task: u64, frontend: u32, reason: DropReason) {
        self.send_drop(task, frontend, reason, 0);
    }

    /// A `Dropped` to `frontend`; `attempt` is named only by a moved
    /// answer.
    fn send_drop(&mut self, task: u64, frontend: u32, reason: DropReason, attempt: u16) {
        let live = self.members.frontend_live(frontend);
        self.dispatch.drop(task, frontend, reason, attempt, live);
    }

    /// A task message ignored as a copy of a task already taken or handed
    /// back.
    fn count_duplicate(&mut self) {
        self.ledger.count_duplicate();
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
        if !self.hold_for_link(now, from, task) {
            self.take_task(now, from, task);
        }
    }

    /// A task of frontend `from` goes to its model's queue (or is refused).
    fn take_task(&mut self, now: Instant, from: u32, task: &Task) {
        let Some((sc, local)) = self.placement.get(task.model_id as usize).copied().flatten() else {
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
        if self.ledger.is_handed_back_copy(now, task.task_id, task.attempt()) {
            self.count_duplicate();
            return;
        }
        if !self.ownership.owns(task.model_id) {
            self.on_unowned_task(now, from, task);
            return;
        }
        if !self.subclusters[sc].sched.admits(local) {
            self.refuse_overloaded(now, from, task);
            return;
        }
        let deadline = task_deadline(now, task.budget_ns);
        let meta = TaskMeta { frontend: from, input: task.input, model: task.model_id, attempt: task.attempt() };
        let Some(handle) = self.ledger.offer(task.task_id, now, deadline, meta) else {
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
        self.subclusters[sc].sched.on_request(now, req, &mut self.actions);
        self.telemetry.task_queued(from);
        self.apply(now, sc);
    }

    /// A task of a model another group owns now.
    fn on_unowned_task(&mut self, now: Instant, from: u32, task: &Task) {
        if self.ledger.seen(task.task_id, now) {
            // A repeat of a task planned before its model moved away (a
            // frontend resubmitting after its link came back): the batch
            // it is in still runs, so it must not go elsewhere.
            self.count_duplicate();
            return;
        }
        // The frontend resubmits it to the owner (see `answer_moved`).
        let deadline = task_deadline(now, task.budget_ns);
        self.answer_moved(now, task.task_id, from, task.attempt(), deadline);
    }

    /// Overload: refused before the id tables are touched, so that
    /// refusing costs the I/O thread less than taking (issue 14, item 2).
    /// A repeat of a refused task is refused again; a repeat of one taken
    /// is ignored (refusing it would answer the original): one lookup, on
    /// the refusal path only.
    fn refuse_overloaded(&mut self, now: Instant, from: u32, task: &Task) {
        if self.ledger.seen(task.task_id, now) {
            self.count_duplicate();
            return;
        }
        self.metrics.model_drops(task.model_id);
        let level = self.level_index(task.model_id, u16::try_from(task.priority).unwrap_or(u16::MAX));
        self.metrics.level_drops(level, DropReason::Overloaded);
        self.send_dropped(task.task_id, from, DropReason::Overloaded);
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
        let Some((handle, meta)) = self.ledger.waiting(cancel.task_id) else { return };
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

    /// Backend `from` finished a batch: the batch is done, and the closed
    /// loop and the delay watch learn from the report. A report for a
    /// batch given up recently (overdue past the grace; see
    /// [`expire_overdue`](Self::expire_overdue)) is learned from the same
    /// way, so that a backend lagging past the grace corrects its GPU's
    /// free time and speed instead of being planned for at its old pace;
    /// its tasks stay failed back (their frontends have their answer). A
    /// report for any other batch not in flight, or from another backend
    /// than the batch's, is refused and counted.
    pub fn on_batch_done(&mut self, now: Instant, from: u32, done: &wire::BatchDone) {
        let finished = match self.ledger.finish(done.batch_id, from) {
            Ok(finished) => finished,
            Err(r) => {
                self.metrics.protocol_errors.inc();
                self.metrics.refuse(r);
                return;
            }
        };
        let sc = finished.subcluster;
        if finished.late.is_some() {
            self.metrics.late_batch_reports.inc();
        } else {
            self.metrics.batches_done.inc();
        }
        self.metrics.actual_busy_ns.inc_by(done.actual_ns());
        if let Some(delay) = self.bound.on_reads(Duration::from_nanos(done.read_max_ns), done.reads) {
            for s in &mut self.subclusters {
                s.sched.set_delay(delay);
            }
        }
        if done.gpu_id != finished.local_gpu {
            // Done, but about which device? Nothing to learn from it.
            self.metrics.refuse(MessageRefusal::WrongGpu);
            self.telemetry.forget(sc, finished.gpu, done.batch_id);
        } else {
            // Its GPU runs: back into matchmaking if it was held.
            self.gpu_reported(now, from, finished.local_gpu, done.batch_id);
            self.learn(now, &finished, done);
        }
        // The cores take nothing from a report itself (they keep each
        // GPU's planned free time); `learn` has passed on any correction.
        self.apply(now, sc);
        self.release_if_done(from);
    }

    /// The closed loop: places the report on this clock, corrects the
    /// GPU's free time, and plans later batches with the learned factors.
    fn learn(&mut self, now: Instant, finished: &Finished, done: &wire::BatchDone) {
        let Finished { subcluster: sc, gpu, model, late, .. } = *finished;
        let global = self.subclusters[sc].models[model as usize] as usize;
        let profiled = match done.count {
            0 => Duration::ZERO,
            n => self.models[global].profile.latency(n),
        };
        let report = telemetry::report(now, done, gpu, model, profiled, self.bound.control());
        let Some(learned) = self.telemetry.learn(now, sc, &report, late) else { return };
        let s = &mut self.subclusters[sc];
        s.sched.set_gpu_factor(gpu, learned.gpu_factor);
        s.sched.set_model_gpu_factor(model, gpu, learned.model_factor);
        if let Some(free_at) = learned.free_at {
            s.sched.correct_gpu_free(now, gpu, free_at, &mut self.actions);
        }
    }

    /// A completion a backend could not deliver itself (its frontend was
    /// unknown to it or gone): forwarded if the frontend is live, which
    /// the task id names.
    pub fn on_rerouted_completion(&mut self, msg: &[u8], head: &wire::CompletionHead) {
        let f = TaskId(head.task_id).frontend();
        let signed = head.capability != [0u8; dataplane::capability::CAPABILITY_LEN];
        self.dispatch.forward(f, msg, self.members.frontend_live(f), signed);
    }

    // --- timers and shutdown ------------------------------------------------

    /// When the control plane wants [`on_wake`](Self::on_wake).
    pub fn poll_at(&self) -> Option<Instant> {
        self.subclusters
            .iter()
            .filter_map(|s| s.sched.poll_at())
            .chain(self.ownership.poll_at())
            .chain(self.members.next_hold_end())
            .chain(self.link_wait_end())
            .min()
    }

    /// Runs every sub-cluster timer due at `now`.
    pub fn on_wake(&mut self, now: Instant) {
        self.release_moved(now);
        self.end_gpu_holds(now);
        self.end_link_waits(now);
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
        self.drop_link_held();
        for (id, f) in self.ledger.drain_waiting() {
            self.send_dropped(id, f, DropReason::Shutdown);
        }
    }

    // --- the cores' decisions to messages ----------------------------------

    /// Turns the sub-cluster's actions into messages.
    fn apply(&mut self, now: Instant, sc: usize) {
        let mut actions = std::mem::take(&mut self.actions);
        // The cores name tasks by handle (`req.id`; see `task_ids`).
        for &(req, reason) in &actions.drops {
            self.apply_drop(now, &req, reason);
        }
        for plan in &actions.batches {
            self.apply_plan(now, sc, plan, actions.members_of(plan));
        }
        actions.clear();
        self.actions = actions;
    }

    /// A task the cores dropped: answered with its reason (`moved` if it
    /// was being handed back).
    fn apply_drop(&mut self, now: Instant, req: &Request, reason: DropReason) {
        let Some((id, m)) = self.ledger.take(req.id) else { return };
        let handed_back = self.ownership.take_handing_over(id);
        let reason = if handed_back && reason == DropReason::Cancelled { DropReason::Moved } else { reason };
        self.metrics.model_drops(m.model);
        self.metrics.level_drops(self.level_index(m.model, req.priority), reason);
        if reason == DropReason::Moved {
            // Handed back, not done: its frontend resubmits it to the
            // owner as its next attempt, which may be this group again
            // after a move back (then a new submission, not a duplicate).
            self.answer_moved(now, id, m.frontend, m.attempt, req.deadline);
        } else {
            self.send_dropped(id, m.frontend, reason);
        }
    }

    /// A batch the cores planned: sent to the GPU's backend and recorded
    /// in flight, unless its model moved away meanwhile.
    fn apply_plan(&mut self, now: Instant, sc: usize, plan: &BatchPlan, members: &[Request]) {
        let Some(&(backend, local_gpu)) = self.subclusters[sc].gpu_owner.get(plan.gpu as usize) else {
            return;
        };
        // Self-check: a GPU never gets a batch planned to start before
        // its previous planned batch ends (the harness asserts 0).
        self.telemetry.check_plan(sc, plan.gpu, plan.exec_at, plan.finish_at);
        let global_model = self.subclusters[sc].models[plan.model as usize];
        if !self.ownership.owns(global_model) {
            self.hold_unowned_plan(now, members);
            return;
        }
        let batch_id = self.ledger.next_batch_id();
        let mut list = self.ledger.task_list();
        let head = BatchPlanHead {
            batch_id,
            exec_in_ns: plan.exec_at.saturating_since(now).as_nanos(),
            model_id: global_model,
            gpu_id: local_gpu,
            count: 0,
            run_ns: plan.finish_at.saturating_since(plan.exec_at).as_nanos(),
            epoch: self.ownership.epoch(),
        };
        if self.telemetry.stamps_on() {
            let deadline = members.iter().map(|r| r.deadline).min().unwrap_or(plan.finish_at);
            if let Some(stamp) = self.telemetry.plan_stamp(plan.planned_at, plan.exec_at, deadline) {
                self.dispatch.bench_stamp(backend, &stamp);
            }
        }
        self.dispatch.plan(now, backend, &head, members, &mut self.ledger, &mut list);
        self.members.record_plan(backend, head.run_ns);
        self.count_dispatched(global_model, members, list.len() as u64);
        self.metrics.record_batch(
            global_model,
            list.len() as u32,
            plan.finish_at.saturating_since(plan.exec_at).as_nanos(),
            now.saturating_since(plan.planned_at).as_nanos(),
        );
        self.telemetry.on_plan(sc, plan.gpu, batch_id, plan.exec_at, plan.finish_at);
        let record = InFlight {
            backend,
            tasks: list,
            subcluster: sc,
            gpu: plan.gpu,
            local_gpu,
            model: plan.model,
            exec_at: plan.exec_at,
            finish_at: plan.finish_at,
        };
        self.ledger.sent(batch_id, record, plan.finish_at);
    }

    /// Planned by the cores from a candidate formed before the model moved
    /// away: nothing of it leaves this scheduler; its tasks go back to
    /// their frontends as moved.
    fn hold_unowned_plan(&mut self, now: Instant, members: &[Request]) {
        self.ownership.count_unowned_plan();
        self.metrics.unowned_plans_held.inc();
        for r in members {
            if let Some((id, m)) = self.ledger.take(r.id) {
                self.ownership.take_handing_over(id);
                self.metrics.model_drops(m.model);
                self.answer_moved(now, id, m.frontend, m.attempt, r.deadline);
            }
        }
    }

    /// Counts a plan's `count` tasks as dispatched at their levels.
    fn count_dispatched(&self, global_model: u32, members: &[Request], count: u64) {
        if let Some(a) = self.admissions.get(global_model as usize).filter(|a| a.levels > 1) {
            for r in members {
                self.metrics.level_dispatched(a.level_index(r.priority), 1);
            }
        } else {
            self.metrics.level_dispatched(0, count);
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod drain_tests;

#[cfg(test)]
mod gate_tests;

#[cfg(test)]
mod late_report_tests;

#[cfg(test)]
mod links_tests;
