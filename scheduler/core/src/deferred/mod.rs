//! Deferred batch scheduling (Symphony's Algorithm 1 with the Appendix D
//! network-aware, multicore split). Eager and timeout batching, which the
//! paper derives from it by changing one line, are separate, plain policies
//! in [`crate::baselines::eager`], so no artefact of this machinery (windows,
//! rate estimates, the RankThread's matchmaking) shapes the baselines.
//!
//! Two sans-IO cores talk only by messages:
//! - [`ModelThreadCore`] owns a disjoint set of models: their queues, batch
//!   gathering (lazy or early drop), candidates and wake-up timers. It runs
//!   at the request rate.
//! - [`RankCore`] owns the GPUs' free times and the ready candidates, and
//!   does model-GPU matchmaking. It runs at the batch rate: a ModelThread
//!   informs it of a candidate only once that candidate is schedulable.
//!
//! [`DeferredScheduler`] wires one of each together with in-memory queues
//! for the simulator; the live runtime wires the same cores with SPSC rings.

mod departures;
mod follow_ups;
mod model_thread;
mod rank;
mod rate_window;
mod recent_loss;

pub use crate::types::Admission;
pub use departures::{Departure, DepartureSet};
pub use model_thread::{ModelThreadCore, ModelThreadStats};
pub use rank::{RankCore, RankStats};

use crate::netdelay::NetworkDelay;
use crate::types::{Actions, GpuId, ModelId, Request, RequestId, Scheduler};
use crate::zoo::ModelSpec;
use dataplane::time::{Duration, Instant};
use std::collections::VecDeque;

/// How a model's batch is gathered from its queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gather {
    /// Clipper-style: drop the head only when not even a batch of one can
    /// meet its deadline; the batch is the largest that fits the head.
    Lazy,
    /// Nexus-style sliding window: drop heads that would force a batch
    /// smaller than the target batch size (estimated from the model's
    /// arrival rate and SLO), then take the largest batch that fits.
    Early,
}

/// Configuration shared by every model of one scheduler.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CoreConfig {
    /// Batch gathering.
    pub gather: Gather,
    /// Network delay charged before a batch can start.
    pub delay: NetworkDelay,
    /// The schedulable window `[exec_at, latest]` is at least this wide:
    /// a model whose frontrun-to-latest gap (`alpha`, one request's worth of
    /// execution) is narrower opens its window earlier, so it is not dropped
    /// merely because no GPU freed inside a sliver of time.
    pub min_window: Duration,
    /// The window is also at least this many expected inter-arrival gaps of
    /// the model wide, times the squared coefficient of variation of its
    /// recent gaps when that exceeds 1 (Poisson; 0 disables; see
    /// docs/decisions.md, deferred items 4 and 10).
    pub window_gaps: f64,
    /// Early drop drops a head only when it would force a batch whose
    /// throughput per GPU (`b / l(b)`) is below this fraction of the target
    /// batch's (1.0 = Nexus's window; see docs/decisions.md, deferred 10).
    pub early_drop_fraction: f64,
    /// Deferral stops once the batch runs within this fraction of the best
    /// throughput per GPU the SLO allows: waiting then buys (almost) nothing
    /// and only risks colliding with the next burst.
    pub efficiency_slack: f64,
    /// Models with several priority levels: a batch holding members of a
    /// level above the lowest is planned to finish this long before the
    /// earliest of their deadlines, and lower-level members join only
    /// within that. The higher levels keep this much of their budget
    /// against what the plan cannot see (a late start, a slow answer); the
    /// lowest level pays for it in batch size. Their drop test stays at
    /// the true deadline: when not even the level's head fits the reserve,
    /// the batch is planned against its true deadline, with that level
    /// only. Zero (the default), or one level: no effect.
    pub priority_reserve: Duration,
    /// Which departures from Algorithm 1 are on ([`Departure`]; the
    /// default: all but [`Departure::LightLoad`]).
    pub departures: DepartureSet,
}

/// Default for [`CoreConfig::min_window`].
pub const DEFAULT_MIN_WINDOW: Duration = Duration::ZERO;
/// Default for [`CoreConfig::window_gaps`], chosen by the sweep recorded in
/// docs/decisions.md.
pub const DEFAULT_WINDOW_GAPS: f64 = 1.0;
/// Default for [`CoreConfig::efficiency_slack`] (see docs/decisions.md).
pub const DEFAULT_EFFICIENCY_SLACK: f64 = 0.02;
/// Default for [`CoreConfig::early_drop_fraction`] (see docs/decisions.md).
pub const DEFAULT_EARLY_DROP_FRACTION: f64 = 0.95;
/// [`Departure::LightLoad`]: a model whose arrivals, served in batches of
/// the current size, need at most this share of one GPU does not defer
/// while a GPU idles.
pub const LIGHT_LOAD_SHARE: f64 = 0.25;
/// [`Departure::LightLoad`]: nor does a batch whose expected growth by its
/// latest start would raise its throughput per GPU by less than this.
pub const LIGHT_LOAD_GAIN: f64 = 0.05;

impl Default for CoreConfig {
    fn default() -> Self {
        CoreConfig {
            gather: Gather::Early,
            delay: NetworkDelay::ZERO,
            min_window: DEFAULT_MIN_WINDOW,
            window_gaps: DEFAULT_WINDOW_GAPS,
            early_drop_fraction: DEFAULT_EARLY_DROP_FRACTION,
            efficiency_slack: DEFAULT_EFFICIENCY_SLACK,
            priority_reserve: Duration::ZERO,
            departures: DepartureSet::default(),
        }
    }
}

/// A model's current candidate batch, as the RankThread sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// Batch size.
    pub bs: u32,
    /// Earliest moment the window allows it to start (frontrun);
    /// the actual start is also bounded by the network delay and the GPU.
    pub exec_at: Instant,
    /// Latest start that still meets the earliest deadline in the batch.
    pub latest: Instant,
    /// The highest priority in the batch, as a level index (0 = highest;
    /// always 0 for a model with one level). Among feasible candidates the
    /// RankThread grants the highest level first, then the most urgent.
    pub level: u16,
    /// The latest start that still serves the members of that highest
    /// level (equal to `latest` when the batch holds one level): the
    /// RankThread orders candidates by `(level, urgency)`, so a model whose
    /// urgency comes only from its lower-priority members yields the GPU to
    /// one whose high-priority requests are about to miss, and the lower
    /// level absorbs the loss across models as it does within one.
    pub urgency: Instant,
    /// How long the batch runs (at the profile's speed): what a GPU is
    /// committed to once it starts.
    pub exec: Duration,
    /// The share of the model's recent admitted requests that scheduling
    /// dropped (early drop or out of time), in basis points (1% = 100):
    /// when a GPU cannot serve every candidate that cannot wait for the
    /// next one, the RankThread serves the model that has lost the most
    /// first (docs/decisions.md, deferred item 20).
    pub recent_loss_bp: u16,
}

/// ModelThread -> RankThread messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToRank {
    /// The model's schedulable candidate changed (`None`: it has none).
    Candidate {
        /// Which model.
        model: ModelId,
        /// Its ready candidate, if any.
        cand: Option<Candidate>,
    },
    /// The model's candidate whose window has not opened yet (`None`: it
    /// has none, or it became schedulable and was sent as `Candidate`).
    /// The RankThread grants it a GPU early when more models wait for
    /// their windows than GPUs are idle (see [`RankCore`] and
    /// docs/decisions.md).
    Pending {
        /// Which model.
        model: ModelId,
        /// Its deferred candidate, if any.
        cand: Option<Candidate>,
    },
    /// A GPU granted to a ModelThread is busy until `free_at` (or was not
    /// used and is handed back with its old free time).
    GpuFree {
        /// Which GPU.
        gpu: GpuId,
        /// When it is free.
        free_at: Instant,
    },
    /// Closed loop: a GPU's batches run late or early, so it is really
    /// free at `free_at` (replacing the free time its last `GpuFree` set).
    /// Ignored while the GPU is granted to a ModelThread (its coming
    /// `GpuFree` decides) or offline.
    GpuCorrect {
        /// Which GPU.
        gpu: GpuId,
        /// When it is really free.
        free_at: Instant,
    },
    /// Control plane: a GPU joined (free now) or left the cluster (a dead
    /// or drained backend). A GPU that left is never granted again, and a
    /// `GpuFree` for it (a batch that was in flight) is ignored.
    GpuMembership {
        /// Which GPU (new ids extend the cluster).
        gpu: GpuId,
        /// Joined (true) or left (false).
        online: bool,
        /// A joining GPU is free from then on (it may still be busy with
        /// batches an earlier scheduler planned); ignored when leaving.
        free_at: Instant,
    },
}

/// RankThread -> ModelThread: use this GPU for this model now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The model whose candidate won.
    pub model: ModelId,
    /// The GPU, now reserved for that model's ModelThread.
    pub gpu: GpuId,
    /// When the GPU is free (may be in the past).
    pub free_at: Instant,
    /// Granted to the model's pending (not yet schedulable) candidate
    /// because more models wait than GPUs are idle: run it now.
    pub early: bool,
    /// When the next *other* GPU is free, as the RankThread saw it at this
    /// grant: `free_at`-style, so at or before now when one is idle, and
    /// [`Instant::NEVER`] when every other GPU is reserved or offline. The
    /// ModelThread's only view of the cluster's load: a batch that waits
    /// for its frontrun on the bet that a GPU will be there then is worth
    /// it only while GPUs idle (docs/decisions.md, deferred item 13).
    pub other_free_at: Instant,
    /// When the second and the third other GPU are free, in the same
    /// terms: the second at or before now when two GPUs besides this one
    /// idle. A batch that waits for its pair need not hold on while three
    /// GPUs idle (deferred item 24).
    pub more_free_at: [Instant; 2],
    /// The largest share of recent requests any *other* model lost, in
    /// basis points, as their candidates last told the RankThread (`None`:
    /// the scheduler has one model). A model that loses far more than all
    /// others early-drops less (deferred item 27): the goodput bar is
    /// every model's bad rate, so losses one model takes alone are worth
    /// spreading.
    pub others_loss_bp: Option<u16>,
}

/// One ModelThread core and one RankThread core in a single thread, for the
/// simulator and for single-threaded use.
pub struct DeferredScheduler {
    models: ModelThreadCore,
    rank: RankCore,
    to_rank: VecDeque<ToRank>,
    grants: VecDeque<Grant>,
}

impl DeferredScheduler {
    /// A scheduler for `models` (model id = index) on `gpus` GPUs.
    pub fn new(models: &[ModelSpec], gpus: u32, cfg: CoreConfig) -> Self {
        let owned: Vec<(ModelId, ModelSpec)> = models.iter().cloned().enumerate().map(|(i, m)| (i as ModelId, m)).collect();
        DeferredScheduler {
            models: ModelThreadCore::new(cfg, owned),
            rank: RankCore::new(models.len(), gpus, cfg.delay).with_departures(cfg.departures),
            to_rank: VecDeque::with_capacity(64),
            grants: VecDeque::with_capacity(64),
        }
    }

    /// Control plane: GPU `gpu` joined (free now) or left the cluster (a
    /// dead or drained backend). Ids past the current count extend the
    /// cluster; a GPU that left is never granted again, and the batch it
    /// was running (if any) is the caller's to fail back.
    pub fn set_gpu_online(&mut self, now: Instant, gpu: GpuId, online: bool, out: &mut Actions) {
        self.to_rank.push_back(ToRank::GpuMembership { gpu, online, free_at: now });
        self.pump(now, out);
    }

    /// Control plane: GPU `gpu` joined, busy until `free_at` (batches its
    /// backend already holds); nothing is planned on it to start earlier.
    pub fn gpu_joined_busy(&mut self, now: Instant, gpu: GpuId, free_at: Instant, out: &mut Actions) {
        self.to_rank.push_back(ToRank::GpuMembership { gpu, online: true, free_at });
        self.pump(now, out);
    }

    /// GPUs currently in the cluster.
    pub fn online_gpus(&self) -> usize {
        self.rank.online_gpus()
    }

    /// The network delay bound later decisions charge (both cores).
    pub fn set_delay(&mut self, delay: NetworkDelay) {
        self.models.set_delay(delay);
        self.rank.set_delay(delay);
    }

    /// Closed loop: GPU `gpu` is really free at `free_at` (its batches ran
    /// late or early); matchmaking continues from there.
    pub fn correct_gpu_free(&mut self, now: Instant, gpu: GpuId, free_at: Instant, out: &mut Actions) {
        self.to_rank.push_back(ToRank::GpuCorrect { gpu, free_at });
        self.pump(now, out);
    }

    /// Closed loop: later batches on `gpu` are planned to take `factor`
    /// times their profiled time (for models without a factor of their
    /// own there; see [`ModelThreadCore::set_gpu_factor`]).
    pub fn set_gpu_factor(&mut self, gpu: GpuId, factor: f64) {
        self.models.set_gpu_factor(gpu, factor);
    }

    /// Closed loop: later batches of `model` on `gpu` take `factor` times
    /// their profiled time (`None`: the GPU's factor).
    pub fn set_model_gpu_factor(&mut self, model: ModelId, gpu: GpuId, factor: Option<f64>) {
        self.models.set_model_gpu_factor(model, gpu, factor);
    }

    /// Sets `model`'s priority levels, default level and queue bound (see
    /// [`Admission`]; the default is one level, unbounded: the scheduling
    /// of a workload without priorities is exactly as before).
    pub fn set_admission(&mut self, model: ModelId, admission: Admission) {
        self.models.set_admission(model, admission);
    }

    /// Requests waiting in `model`'s queue.
    pub fn queued_of(&self, model: ModelId) -> usize {
        self.models.queued_of(model)
    }

    /// The client gave request `id` of `model` up: if it still waits in the
    /// model's queue (no batch holding it was dispatched) it is answered
    /// now as [`crate::types::DropReason::Cancelled`] (in `out.drops`) and
    /// `true` is returned; otherwise nothing happens.
    pub fn cancel(&mut self, now: Instant, model: ModelId, id: RequestId, out: &mut Actions) -> bool {
        let to_rank = &mut self.to_rank;
        let found = self.models.cancel(now, model, id, out, &mut |m| to_rank.push_back(m));
        self.pump(now, out);
        found
    }

    /// Statistics of the two cores.
    pub fn stats(&self) -> (ModelThreadStats, RankStats) {
        (self.models.stats(), self.rank.stats())
    }

    /// Delivers queued messages between the two cores until both are quiet.
    fn pump(&mut self, now: Instant, out: &mut Actions) {
        let DeferredScheduler { models, rank, to_rank, grants, .. } = self;
        loop {
            while let Some(msg) = to_rank.pop_front() {
                rank.on_message(now, msg, &mut |g| grants.push_back(g));
            }
            match grants.pop_front() {
                Some(g) => models.on_grant(now, g, out, &mut |m| to_rank.push_back(m)),
                None => break,
            }
        }
    }
}

impl Scheduler for DeferredScheduler {
    fn set_gpu_membership(&mut self, now: Instant, gpu: GpuId, online: bool, out: &mut Actions) -> bool {
        self.set_gpu_online(now, gpu, online, out);
        true
    }

    fn on_request(&mut self, now: Instant, req: Request, out: &mut Actions) {
        let to_rank = &mut self.to_rank;
        self.models.on_request(now, req, out, &mut |m| to_rank.push_back(m));
        self.pump(now, out);
    }

    fn on_batch_done(&mut self, _now: Instant, _gpu: GpuId, _out: &mut Actions) {
        // The RankThread already knows each GPU's planned free time, and
        // emulated (or profiled) execution takes exactly that long.
    }

    fn on_wake(&mut self, now: Instant, out: &mut Actions) {
        // Canonical order at one instant, shared with the live runtime's
        // lockstep driver: model timers, then every message they cause,
        // then the GPU timer, then every message it causes.
        let to_rank = &mut self.to_rank;
        self.models.on_wake(now, out, &mut |m| to_rank.push_back(m));
        self.pump(now, out);
        if self.rank.poll_at().is_some_and(|t| t <= now) {
            let grants = &mut self.grants;
            self.rank.on_wake(now, &mut |g| grants.push_back(g));
            self.pump(now, out);
        }
    }

    fn poll_at(&self) -> Option<Instant> {
        match (self.models.poll_at(), self.rank.poll_at()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn name(&self) -> &'static str {
        "deferred"
    }

    fn set_admission(&mut self, model: ModelId, admission: Admission) -> bool {
        DeferredScheduler::set_admission(self, model, admission);
        true
    }
}
