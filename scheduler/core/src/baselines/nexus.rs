//! Nexus (Shen et al., SOSP '19) as a sans-IO policy.
//!
//! - **Epoch planning.** Every epoch the global scheduler runs squishy bin
//!   packing (Nexus Algorithm 1, [`squishy_bin_packing`]) on the per-model
//!   request rates: whole GPUs are saturated with the largest batch `B` whose
//!   worst case, one duty cycle of waiting plus its own execution
//!   (`2 l(B)`), fits the SLO; the residual loads are packed onto shared
//!   GPUs by merging duty cycles. The first plan uses the configured rates
//!   ([`NexusConfig::rates`]) or, without them, spreads the models evenly
//!   over the GPUs until a short warm epoch has measured the rates. When the
//!   plan needs more GPUs than exist, every rate is scaled down by the same
//!   factor until it fits; the excess load is then dropped by the
//!   backends. When it needs fewer, each spare GPU replicates a planned
//!   GPU and takes a share of its load ([`plan`]): Nexus minimises the GPUs
//!   it holds (the cost of a cloud fleet), but every system here is given
//!   the same cluster, where a GPU left idle only drops the bursts it could
//!   have served. That is an operator's use of the spare GPUs, not a rule
//!   of Nexus's planner; [`NexusConfig::fill_cluster`] off gives the
//!   fewest GPUs ([`plan_fewest`]), the others idle. Plans provision
//!   [`DEFAULT_HEADROOM`] above the measured rates.
//! - **Frontend routing.** Each request is routed to one GPU serving its
//!   model, by smooth weighted round robin over the planned shares. With
//!   several frontends, requests are spread over them by id and each routes
//!   independently with its own position in the sequence: the lack of
//!   coordination the Symphony paper measures.
//! - **Backends.** Each GPU keeps a queue per resident model and serves its
//!   residents round robin, eagerly: when it is free it runs the next
//!   resident with queued requests, at most its planned batch size. Before
//!   that, the early-drop sliding window drops head requests that could not
//!   meet their deadline in a batch of the planned size.
//!
//! - **Backups** (Nexus's code, not its paper: `src/nexus/backend/worker.cpp`,
//!   `model_exec.cpp` and `gpu_executor.cpp` in uwsampl/nexus). A request
//!   whose model already has its planned batch queued on its GPU is
//!   relayed to the least utilised backup GPU of that model, if one is
//!   below full utilisation; otherwise it queues on its GPU anyway. (Nexus
//!   also counts the running batch, which relays requests that would make
//!   the next batch in time; see docs/decisions.md, "Nexus backups".)
//!   A GPU serves its backup models after each pass over its residents,
//!   with the largest batch that fits what the pass left of its duty cycle.
//!   Nexus configures backups by hand; here every planned GPU whose duty
//!   cycle can hold one request of a model it does not host is that
//!   model's backup ([`NexusConfig::backups`]).
//!
//! The duty cycle is not enforced by a timer: a backend that finds its
//! residents' queues empty idles until a request arrives, as Nexus's eager
//! backends do. Requests queued on a GPU that a new plan no longer gives
//! their model are re-routed. A request is never dispatched in a batch the
//! profile says would finish after its deadline.

use super::prelude::*;

/// Plans provision this much more than the measured rate. Nexus plans for
/// the last measured rate plus one standard deviation of its recent rates,
/// and re-plans only when the load leaves [0.8, 1.1] of what it planned;
/// on emulated GPUs that run exactly the profile, a plan for exactly the
/// mean rate loads the saturated GPUs to 100% and drops several percent of
/// Poisson traffic. 20% stands in for that slack: with it this model lands
/// within 6% of the Nexus goodputs in the Symphony paper's Table 2 (ResNet50
/// and InceptionResNetV2 on 8 GPUs). It is calibrated, not Nexus's rule.
pub const DEFAULT_HEADROOM: f64 = 0.2;
/// Rates below this (requests/s) are treated as no load.
const MIN_RATE_RPS: f64 = 1e-6;
/// Routing weights are rounded to this many parts per model.
const ROUTE_RESOLUTION: f64 = 1000.0;

/// Nexus's knobs.
#[derive(Clone, Debug, PartialEq)]
pub struct NexusConfig {
    /// Network delay charged before a batch can start.
    pub delay: NetworkDelay,
    /// Routing frontends (at least 1).
    pub frontends: u32,
    /// Re-planning period.
    pub epoch: Duration,
    /// Without configured rates: when the first measured plan is made.
    pub warm_epoch: Duration,
    /// Expected request rate per model (requests/s) for the plan at time
    /// zero; `None` to measure them during the warm epoch.
    pub rates: Option<Vec<f64>>,
    /// Plans are made for the measured (or configured) rates times
    /// `1 + headroom`.
    pub headroom: f64,
    /// Relay a GPU's overflow to backup GPUs (see the module documentation).
    pub backups: bool,
    /// Spread the plan over every GPU by replicating planned GPUs
    /// ([`plan`]); off: the fewest GPUs, the others idle ([`plan_fewest`]).
    pub fill_cluster: bool,
}

impl Default for NexusConfig {
    fn default() -> Self {
        NexusConfig {
            delay: NetworkDelay::ZERO,
            frontends: 1,
            epoch: Duration::from_millis(10_000),
            warm_epoch: Duration::from_millis(1_000),
            rates: None,
            headroom: DEFAULT_HEADROOM,
            backups: true,
            fill_cluster: true,
        }
    }
}

/// One model placed on one GPU.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Placement {
    /// The model.
    pub model: ModelId,
    /// Its planned batch size on this GPU.
    pub batch: u32,
    /// The request rate this GPU is planned to take for it.
    pub rate_rps: f64,
}

/// What one GPU runs, round robin.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuPlan {
    /// Resident models.
    pub residents: Vec<Placement>,
    /// The planned duty cycle: one round of every resident's batch.
    pub duty_cycle: Duration,
}

impl GpuPlan {
    /// Whether `model` is one of this GPU's residents.
    pub fn hosts(&self, model: usize) -> bool {
        self.residents.iter().any(|x| x.model as usize == model)
    }
}

/// A cluster plan: GPU `g` runs `gpus[g]`; GPUs past the end stay idle.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// Per used GPU.
    pub gpus: Vec<GpuPlan>,
    /// The factor every rate was scaled by to fit the cluster (1: all fit).
    pub rate_scale: f64,
}

/// A residual node being packed: a duty cycle and its residents' rates.
#[derive(Clone, Debug)]
struct SharedNode {
    duty: Duration,
    residents: Vec<Placement>,
    occupancy: f64,
}

/// Utilisation of a GPU dedicated to a model Nexus's rule cannot plan.
const UNPLANNABLE_UTILISATION: f64 = 0.3;

/// One-sided 99% normal quantile, for per-cycle Poisson burst allowance.
const POISSON_Z99: f64 = 2.33;

/// The batch that covers the 99th percentile of a Poisson count of
/// `rate` over `duty`.
fn burst_batch(m: &ModelSpec, rate: f64, duty: Duration) -> u32 {
    let mean = rate * duty.as_secs_f64();
    // The tolerance keeps `ceil(6.0000001)` from becoming 7.
    (mean + POISSON_Z99 * mean.sqrt() - 1e-6).ceil().max(1.0).min(f64::from(m.profile.max_batch())) as u32
}

/// A residual load alone on a node: starting from `duty`, shortens the cycle
/// until the burst-sized batch also fits the SLO (`duty + l(b) <= SLO`).
fn fit_alone(models: &[ModelSpec], p: Placement, mut duty: Duration) -> Option<SharedNode> {
    let m = &models[p.model as usize];
    for _ in 0..8 {
        if let Some(node) = SharedNode::build(models, duty, std::iter::once(p)) {
            return Some(node);
        }
        let shorter = m.slo.saturating_sub(m.profile.latency(burst_batch(m, p.rate_rps, duty)));
        if shorter >= duty || shorter == Duration::ZERO {
            return None;
        }
        duty = shorter;
    }
    None
}

impl SharedNode {
    /// The node with `residents` at duty cycle `duty`, if every resident's
    /// batch fits the cycle and its SLO. The batch covers the 99th
    /// percentile of a Poisson count per cycle, `rate*duty + 2.33 sqrt(rate*duty)`:
    /// planning for the mean count drops every burst above it, so at low
    /// rates (batch 1) a fifth of the requests would miss their cycle.
    fn build(models: &[ModelSpec], duty: Duration, residents: impl Iterator<Item = Placement>) -> Option<SharedNode> {
        let mut used = Duration::ZERO;
        let mut placed = Vec::new();
        for mut p in residents {
            let m = &models[p.model as usize];
            let b = burst_batch(m, p.rate_rps, duty);
            let l = m.profile.latency(b);
            if duty + l > m.slo {
                return None;
            }
            used += l;
            p.batch = b;
            placed.push(p);
        }
        (used <= duty && duty > Duration::ZERO).then(|| SharedNode {
            occupancy: used.as_secs_f64() / duty.as_secs_f64(),
            duty,
            residents: placed,
        })
    }
}

/// The largest batch whose worst case in a GPU of its own, waiting for one
/// batch then running one (`2 l(b)`), fits the SLO; at least 1. Nexus's
/// `ModelProfile::GetMaxBatch` (uwsampl/nexus `common/model_db.cpp`), the
/// `max_batch` its backends never run past.
pub fn saturating_batch(m: &ModelSpec) -> u32 {
    let half_slo = Duration::from_nanos(m.slo.as_nanos() / 2);
    m.profile.max_batch_within(half_slo, Duration::ZERO, u32::MAX).max(1)
}

/// `models` with every batch held to Nexus's largest ([`saturating_batch`]),
/// the batch its backends never run past. Not a policy but a reference:
/// what our schedulers (a global queue over every GPU, deferral, early
/// drop) reach on these models is a measured, not proven, bound on a
/// scheduler held to Nexus's batches; where even they stay below a share
/// of deferred on the full models, a faithful Nexus is not expected to
/// reach it (docs/benchmarks.md, "What caps Nexus on the 2-GPU cells").
pub fn held_to_nexus_batches(models: &[ModelSpec]) -> Vec<ModelSpec> {
    models.iter().map(|m| ModelSpec { name: m.name.clone(), profile: m.profile.clone().capped(saturating_batch(m)), slo: m.slo }).collect()
}

/// Nexus Algorithm 1 (squishy bin packing) for `rates[m]` requests/s of
/// model `m`, on as many GPUs as it takes.
pub fn squishy_bin_packing(models: &[ModelSpec], rates: &[f64]) -> Vec<GpuPlan> {
    let mut plans = Vec::new();
    let mut residual = Vec::new();
    // ScheduleSaturate: whole GPUs at the batch whose worst case, waiting
    // one batch then running one, fits the SLO.
    for (i, (m, &rate)) in models.iter().zip(rates).enumerate() {
        if rate.is_nan() || rate < MIN_RATE_RPS {
            continue;
        }
        let b = saturating_batch(m);
        let mut rest = rate;
        if m.profile.latency(b).saturating_mul(2) <= m.slo {
            let per_gpu = m.profile.throughput_rps(b);
            let n = (rate / per_gpu).floor();
            let whole = GpuPlan {
                residents: vec![Placement { model: i as ModelId, batch: b, rate_rps: per_gpu }],
                duty_cycle: m.profile.latency(b),
            };
            plans.extend(std::iter::repeat_n(whole, n as usize));
            rest -= n * per_gpu;
        } else {
            // Even a batch of one cannot wait one execution and still meet
            // the SLO (A100 DenseNet121: 2 l(1) = 21.2 ms > 21 ms), so Nexus's
            // duty-cycle rule has no plan. Our adaptation: dedicated GPUs at
            // batch 1, loaded to UNPLANNABLE_UTILISATION so a request rarely
            // queues longer than the SLO's slack.
            let per_gpu = UNPLANNABLE_UTILISATION * m.profile.throughput_rps(1);
            let n = (rate / per_gpu).ceil().max(1.0);
            let whole = GpuPlan {
                residents: vec![Placement { model: i as ModelId, batch: 1, rate_rps: rate / n }],
                duty_cycle: m.profile.latency(1),
            };
            plans.extend(std::iter::repeat_n(whole, n as usize));
            rest = 0.0;
        }
        if rest >= MIN_RATE_RPS {
            residual.push(Placement { model: i as ModelId, batch: 0, rate_rps: rest });
        }
    }
    // ScheduleResidue: each residual load alone at its largest batch b with
    // b/r + l(b) <= SLO (duty cycle b/r; shorter when even b = 1 waits too
    // long), then merged best-fit by decreasing occupancy.
    let mut alone = Vec::with_capacity(residual.len());
    for p in residual {
        let m = &models[p.model as usize];
        let gap = Duration::from_secs_f64(1.0 / p.rate_rps);
        let b = m.profile.max_batch_within(m.slo, gap, u32::MAX).max(1);
        let duty = Duration::from_secs_f64(f64::from(b) / p.rate_rps).min(m.slo.saturating_sub(m.profile.latency(b)));
        match fit_alone(models, p, duty) {
            Some(node) => alone.push(node),
            // A residual too heavy to share a duty cycle (its batch takes
            // longer than gathering it) gets a GPU of its own.
            None => plans.push(GpuPlan {
                residents: vec![Placement { model: p.model, batch: saturating_batch(m), rate_rps: p.rate_rps }],
                duty_cycle: m.profile.latency(saturating_batch(m)),
            }),
        }
    }
    alone.sort_by(|a, b| b.occupancy.total_cmp(&a.occupancy).then(a.residents[0].model.cmp(&b.residents[0].model)));
    let mut shared: Vec<SharedNode> = Vec::new();
    for item in alone {
        let best = shared
            .iter()
            .enumerate()
            .filter_map(|(i, node)| {
                let duty = node.duty.min(item.duty);
                SharedNode::build(models, duty, node.residents.iter().chain(&item.residents).copied()).map(|n| (i, n))
            })
            .max_by(|(ia, a), (ib, b)| a.occupancy.total_cmp(&b.occupancy).then(ib.cmp(ia)));
        match best {
            Some((i, merged)) => shared[i] = merged,
            None => shared.push(item),
        }
    }
    plans.extend(shared.into_iter().map(|n| GpuPlan { residents: n.residents, duty_cycle: n.duty }));
    plans
}

/// Squishy bin packing for `gpus` GPUs, using all of them: [`plan_fewest`],
/// then each GPU it leaves spare replicates one of the plan's GPUs (same
/// residents, batches and duty cycle) and takes an equal share of that
/// GPU's rates. Each spare goes to the GPU whose replicas carry the most
/// planned GPU time per second (`sum rate * l(b) / b`) each. The plan's
/// batches and duty cycles stay what squishy bin packing chose for the
/// measured load, so its worst cases hold; every replica runs at a fraction
/// of that load, with room for bursts.
pub fn plan(models: &[ModelSpec], rates: &[f64], gpus: u32) -> Plan {
    let fewest = plan_fewest(models, rates, gpus);
    let planned = fewest.gpus.len();
    if planned == 0 || planned >= gpus as usize {
        return fewest;
    }
    let busy: Vec<f64> = fewest
        .gpus
        .iter()
        .map(|g| g.residents.iter().map(|x| x.rate_rps * models[x.model as usize].profile.latency(x.batch).as_secs_f64() / f64::from(x.batch.max(1))).sum())
        .collect();
    let mut copies = vec![1u32; planned];
    for _ in planned..gpus as usize {
        let per_copy = |i: usize| busy[i] / f64::from(copies[i]);
        // Ties go to the earlier GPU (`max_by` keeps the last maximum).
        let i = (0..planned).rev().max_by(|&a, &b| per_copy(a).total_cmp(&per_copy(b))).unwrap_or(0);
        copies[i] += 1;
    }
    let gpus = fewest
        .gpus
        .into_iter()
        .zip(copies)
        .flat_map(|(g, k)| {
            let share = GpuPlan {
                residents: g.residents.iter().map(|x| Placement { rate_rps: x.rate_rps / f64::from(k), ..*x }).collect(),
                duty_cycle: g.duty_cycle,
            };
            std::iter::repeat_n(share, k as usize)
        })
        .collect();
    Plan { gpus, rate_scale: fewest.rate_scale }
}

/// Squishy bin packing on the fewest GPUs (Nexus's own objective), at most
/// `gpus`: when the rates need more, every rate is scaled down by the
/// largest common factor that fits (found by bisection). If even vanishing
/// rates do not fit, the plan keeps the first `gpus` GPUs of the full
/// packing and the other models are not served. GPUs past the plan's stay
/// idle.
pub fn plan_fewest(models: &[ModelSpec], rates: &[f64], gpus: u32) -> Plan {
    let full = squishy_bin_packing(models, rates);
    if full.len() <= gpus as usize {
        return Plan { gpus: full, rate_scale: 1.0 };
    }
    let scaled = |s: f64| -> Vec<f64> { rates.iter().map(|r| r * s).collect() };
    let (mut lo, mut hi) = (0.0, 1.0);
    let mut best = None;
    for _ in 0..40 {
        let mid = 0.5 * (lo + hi);
        let p = squishy_bin_packing(models, &scaled(mid));
        if p.len() <= gpus as usize {
            lo = mid;
            best = Some(p);
        } else {
            hi = mid;
        }
    }
    let served = |p: &[GpuPlan]| rates.iter().enumerate().all(|(m, &r)| r < MIN_RATE_RPS || p.iter().any(|g| g.hosts(m)));
    match best {
        Some(p) if served(&p) => Plan { gpus: p, rate_scale: lo },
        _ => {
            let mut p = full;
            p.truncate(gpus as usize);
            Plan { gpus: p, rate_scale: 1.0 }
        }
    }
}

/// [`plan`] or [`plan_fewest`], as `cfg` says.
fn plan_with(cfg: &NexusConfig, models: &[ModelSpec], rates: &[f64], gpus: u32) -> Plan {
    if cfg.fill_cluster {
        plan(models, rates, gpus)
    } else {
        plan_fewest(models, rates, gpus)
    }
}

/// The plan used before any rate is known: models dealt round robin over
/// the GPUs (or GPUs over the models), each at its saturating batch size.
fn spread_evenly(models: &[ModelSpec], gpus: u32) -> Plan {
    let (m_count, g_count) = (models.len(), gpus as usize);
    if m_count == 0 {
        return Plan { gpus: Vec::new(), rate_scale: 1.0 };
    }
    let place = |m: usize| Placement { model: m as ModelId, batch: saturating_batch(&models[m]), rate_rps: 1.0 };
    let plans = (0..g_count)
        .map(|g| {
            let residents: Vec<Placement> = if m_count <= g_count {
                vec![place(g % m_count)]
            } else {
                (g..m_count).step_by(g_count).map(place).collect()
            };
            let duty_cycle = residents.iter().map(|p| models[p.model as usize].profile.latency(p.batch)).fold(Duration::ZERO, |a, b| a + b);
            GpuPlan { residents, duty_cycle }
        })
        .collect();
    Plan { gpus: plans, rate_scale: 1.0 }
}

/// A smooth weighted round-robin sequence over `(gpu, weight)`: each GPU
/// appears in proportion to its weight, spread as evenly as possible.
fn weighted_sequence(targets: &[(GpuId, f64)]) -> Vec<GpuId> {
    let total: f64 = targets.iter().map(|t| t.1).sum();
    if targets.len() <= 1 || total <= 0.0 {
        return targets.iter().map(|t| t.0).collect();
    }
    let weights: Vec<i64> = targets.iter().map(|t| ((t.1 / total * ROUTE_RESOLUTION).round() as i64).max(1)).collect();
    let sum: i64 = weights.iter().sum();
    let mut current = vec![0i64; weights.len()];
    (0..sum)
        .map(|_| {
            let mut pick = 0;
            for (i, w) in weights.iter().enumerate() {
                current[i] += w;
                if current[i] > current[pick] {
                    pick = i;
                }
            }
            current[pick] -= sum;
            targets[pick].0
        })
        .collect()
}

/// A deterministic, well-mixed starting offset for frontend `f` (SplitMix64
/// finaliser), so frontends do not route in lockstep.
fn frontend_phase(f: u32) -> u64 {
    if f == 0 {
        return 0;
    }
    let mut z = u64::from(f).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

struct Backend {
    /// Index in the GPU's residents of the model to serve next.
    next: usize,
    /// When its current batch ends.
    free_at: Instant,
    /// GPU time taken by the batches of the current pass over the
    /// residents and backups: the duty cycle's budget for backups is what
    /// it leaves.
    pass_exec: Duration,
}

/// The Nexus policy: see the module documentation.
pub struct NexusScheduler {
    cfg: NexusConfig,
    specs: Vec<ModelSpec>,
    plan: Plan,
    backends: Vec<Backend>,
    /// `queues[g * models + m]`: model `m`'s requests waiting on GPU `g`.
    queues: Vec<VecDeque<Request>>,
    /// Per model, the GPUs its requests are routed to, in sequence.
    routes: Vec<Vec<GpuId>>,
    /// Per model, the GPUs that back it up (empty without backups).
    backups: Vec<Vec<GpuId>>,
    /// Per planned GPU, its residents' planned batches' GPU time: the
    /// fixed part of its utilisation as a backup.
    planned_work: Vec<Duration>,
    /// `cursors[f * models + m]`: how many of model `m`'s requests frontend
    /// `f` has routed.
    cursors: Vec<u64>,
    /// Arrivals per model since the last plan, and their sum.
    arrivals: Vec<u64>,
    arrivals_total: u64,
    last_plan: Instant,
    next_plan: Instant,
    plans: u32,
    relayed: u64,
}

impl NexusScheduler {
    /// A scheduler for `models` (model id = index) on `gpus` GPUs.
    pub fn new(models: &[ModelSpec], gpus: u32, cfg: NexusConfig) -> Self {
        let frontends = cfg.frontends.max(1) as usize;
        let m_count = models.len();
        let (first, next_plan) = match &cfg.rates {
            Some(r) => {
                let r: Vec<f64> = r.iter().map(|x| x * (1.0 + cfg.headroom)).collect();
                (plan_with(&cfg, models, &r, gpus), Instant::ZERO + cfg.epoch)
            }
            None => (spread_evenly(models, gpus), Instant::ZERO + cfg.warm_epoch),
        };
        let mut s = NexusScheduler {
            specs: models.to_vec(),
            plan: Plan::default(),
            backends: (0..gpus).map(|_| Backend { next: 0, free_at: Instant::ZERO, pass_exec: Duration::ZERO }).collect(),
            queues: (0..gpus as usize * m_count).map(|_| VecDeque::new()).collect(),
            routes: vec![Vec::new(); m_count],
            backups: vec![Vec::new(); m_count],
            planned_work: Vec::new(),
            cursors: vec![0; frontends * m_count],
            arrivals: vec![0; m_count],
            arrivals_total: 0,
            last_plan: Instant::ZERO,
            next_plan,
            plans: 0,
            relayed: 0,
            cfg,
        };
        s.install(first);
        s
    }

    /// The plan in force.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Plans made so far (the one at time zero included).
    pub fn plans(&self) -> u32 {
        self.plans
    }

    /// Requests relayed to a backup GPU so far.
    pub fn relayed(&self) -> u64 {
        self.relayed
    }

    /// Makes `plan` current: routing tables and backend round-robin state.
    fn install(&mut self, plan: Plan) {
        for (m, route) in self.routes.iter_mut().enumerate() {
            let targets: Vec<(GpuId, f64)> = plan
                .gpus
                .iter()
                .enumerate()
                .flat_map(|(g, p)| p.residents.iter().filter(|x| x.model as usize == m).map(move |x| (g as GpuId, x.rate_rps)))
                .collect();
            *route = weighted_sequence(&targets);
        }
        for (m, backups) in self.backups.iter_mut().enumerate() {
            backups.clear();
            if !self.cfg.backups {
                continue;
            }
            let one = self.specs[m].profile.latency(1);
            backups.extend(
                plan.gpus
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| p.duty_cycle > one && !p.hosts(m))
                    .map(|(g, _)| g as GpuId),
            );
        }
        self.planned_work = plan.gpus.iter().map(|p| p.residents.iter().map(|x| self.specs[x.model as usize].profile.latency(x.batch)).fold(Duration::ZERO, |a, l| a + l)).collect();
        for b in &mut self.backends {
            b.next = 0;
            b.pass_exec = Duration::ZERO;
        }
        self.plan = plan;
        self.plans += 1;
    }

    /// Picks the GPU for `req` as its frontend's round robin says.
    fn route(&mut self, req: &Request) -> Option<GpuId> {
        let m_count = self.specs.len();
        let route = &self.routes[req.model as usize];
        if route.is_empty() {
            return None;
        }
        let f = (req.id % self.cfg.frontends.max(1) as u64) as u32;
        let cursor = &mut self.cursors[f as usize * m_count + req.model as usize];
        let pos = cursor.wrapping_add(frontend_phase(f)) % route.len() as u64;
        *cursor += 1;
        Some(route[pos as usize])
    }

    /// Routes `req` to a backend's queue; returns the GPU.
    fn enqueue(&mut self, req: Request, out: &mut Actions) -> Option<GpuId> {
        let Some(mut g) = self.route(&req) else {
            out.drops.push((req, DropReason::UnknownModel));
            return None;
        };
        if self.overflows(g, req.model) {
            if let Some(b) = self.least_utilised_backup(req.model) {
                g = b;
                self.relayed += 1;
            }
        }
        let i = g as usize * self.specs.len() + req.model as usize;
        insert_by_deadline(&mut self.queues[i], req);
        Some(g)
    }

    /// Whether one more request of `model` on GPU `g` would queue past its
    /// planned batch there, so that it would wait for two batches, beyond
    /// what the plan's worst case allows: Nexus's `IncreaseOpenRequests`
    /// with a backup to go to, without the running batch.
    fn overflows(&self, g: GpuId, model: ModelId) -> bool {
        if self.backups[model as usize].is_empty() {
            return false;
        }
        let Some(planned) = self.plan.gpus.get(g as usize).and_then(|p| p.residents.iter().find(|x| x.model == model)).map(|x| x.batch) else {
            return false;
        };
        let queued = self.queues[g as usize * self.specs.len() + model as usize].len() as u32;
        queued + 1 > planned
    }

    /// The backup GPU of `model` with the lowest utilisation below 1, as
    /// Nexus's worker picks it. A GPU's utilisation is one duty cycle's
    /// work over its length: its residents' planned batches and a batch of
    /// each backup queue (Nexus's `GpuExecutorMultiBatching::
    /// CurrentUtilization`, with the planned batches for its estimate of
    /// the residents' next ones), so a saturated GPU is never a backup.
    fn least_utilised_backup(&self, model: ModelId) -> Option<GpuId> {
        let m_count = self.specs.len();
        let utilisation = |g: GpuId| {
            let plan = &self.plan.gpus[g as usize];
            let mut work = self.planned_work[g as usize];
            for (m, spec) in self.specs.iter().enumerate() {
                let q = self.queues[g as usize * m_count + m].len() as u32;
                if q > 0 && !plan.hosts(m) {
                    work += spec.profile.latency(q.min(spec.profile.max_batch()));
                }
            }
            work.as_secs_f64() / plan.duty_cycle.as_secs_f64()
        };
        self.backups[model as usize].iter().map(|&g| (g, utilisation(g))).filter(|&(_, u)| u < 1.0).min_by(|a, b| a.1.total_cmp(&b.1)).map(|(g, _)| g)
    }

    /// Re-plans from the rates measured since the last plan.
    fn replan(&mut self, now: Instant, out: &mut Actions) {
        let secs = now.saturating_since(self.last_plan).as_secs_f64();
        let scale = if secs > 0.0 { (1.0 + self.cfg.headroom) / secs } else { 0.0 };
        // Nexus plans for the measured rate plus one standard deviation; a
        // Poisson count `n` has deviation `sqrt(n)`, and the `+ 1` keeps a
        // model that happened to see no request this epoch placed somewhere.
        let rates: Vec<f64> = self.arrivals.iter().map(|&n| (n as f64 + (n as f64).sqrt() + 1.0) * scale).collect();
        let p = plan_with(&self.cfg, &self.specs, &rates, self.backends.len() as u32);
        self.install(p);
        self.arrivals.iter_mut().for_each(|n| *n = 0);
        self.arrivals_total = 0;
        self.last_plan = now;
        self.next_plan = now + self.cfg.epoch;
        // Requests waiting on a GPU that no longer serves their model follow
        // the model to its new GPUs (or to one of its backups).
        let m_count = self.specs.len();
        for i in 0..self.queues.len() {
            let (g, m) = (i / m_count, (i % m_count) as ModelId);
            let resident = self.plan.gpus.get(g).is_some_and(|p| p.hosts(m as usize));
            if !resident && !self.queues[i].is_empty() {
                for r in std::mem::take(&mut self.queues[i]) {
                    self.enqueue(r, out);
                }
            }
        }
        for g in 0..self.backends.len() {
            self.dispatch(now, g as GpuId, out);
        }
    }

    /// A free backend runs its next resident with queued requests, after
    /// early drop, at most at the planned batch size. A pass over the
    /// residents ends with its backups: each with queued requests may run
    /// the largest batch that fits what the pass left of the duty cycle
    /// (Nexus's `GpuExecutorMultiBatching::Run`); then a new pass starts.
    fn dispatch(&mut self, now: Instant, g: GpuId, out: &mut Actions) {
        if self.backends[g as usize].free_at > now {
            return;
        }
        let Some(k) = self.plan.gpus.get(g as usize).map(|p| p.residents.len()) else { return };
        let from = self.backends[g as usize].next.min(k);
        if self.run_resident(now, g, from..k, out) || self.run_backup(now, g, out) {
            return;
        }
        let b = &mut self.backends[g as usize];
        b.next = 0;
        b.pass_exec = Duration::ZERO;
        if !self.run_resident(now, g, 0..k, out) {
            self.run_backup(now, g, out);
        }
    }

    /// Runs the first resident in `range` with queued requests (after early
    /// drop); whether one ran.
    fn run_resident(&mut self, now: Instant, g: GpuId, range: std::ops::Range<usize>, out: &mut Actions) -> bool {
        let m_count = self.specs.len();
        for idx in range {
            let p = self.plan.gpus[g as usize].residents[idx];
            let profile = &self.specs[p.model as usize].profile;
            let queue = &mut self.queues[g as usize * m_count + p.model as usize];
            early_drop(queue, now, p.batch, profile, &self.cfg.delay, out);
            if queue.is_empty() {
                continue;
            }
            let size = p.batch.min(queue.len() as u32);
            self.start(now, g, p.model, size, out);
            self.backends[g as usize].next = idx + 1;
            return true;
        }
        false
    }

    /// Runs the first backup model of GPU `g` with queued requests whose
    /// batch fits the pass's remaining budget; whether one ran.
    fn run_backup(&mut self, now: Instant, g: GpuId, out: &mut Actions) -> bool {
        let m_count = self.specs.len();
        let gpu_plan = &self.plan.gpus[g as usize];
        let budget = gpu_plan.duty_cycle.saturating_sub(self.backends[g as usize].pass_exec);
        for m in 0..m_count {
            if gpu_plan.hosts(m) || self.queues[g as usize * m_count + m].is_empty() {
                continue;
            }
            let profile = &self.specs[m].profile;
            let batch = profile.max_batch_within(budget, Duration::ZERO, profile.max_batch());
            if batch == 0 {
                continue;
            }
            let queue = &mut self.queues[g as usize * m_count + m];
            early_drop(queue, now, batch, profile, &self.cfg.delay, out);
            if queue.is_empty() {
                continue;
            }
            let size = batch.min(queue.len() as u32);
            self.start(now, g, m as ModelId, size, out);
            return true;
        }
        false
    }

    /// Starts a batch of the first `size` queued requests of `model` on `g`.
    fn start(&mut self, now: Instant, g: GpuId, model: ModelId, size: u32, out: &mut Actions) {
        let profile = &self.specs[model as usize].profile;
        let exec_at = now + self.cfg.delay.of(size);
        let exec = profile.latency(size);
        let queue = &mut self.queues[g as usize * self.specs.len() + model as usize];
        out.push_batch(g, model, exec_at, exec_at + exec, now, queue.drain(..size as usize));
        let b = &mut self.backends[g as usize];
        b.free_at = exec_at + exec;
        b.pass_exec += exec;
    }

    fn maybe_replan(&mut self, now: Instant, out: &mut Actions) {
        if now >= self.next_plan {
            self.replan(now, out);
        }
    }
}

/// Nexus's sliding window: drops head requests until the head could finish
/// in a batch of the planned size (or of the whole queue, if shorter),
/// starting now.
fn early_drop(queue: &mut VecDeque<Request>, now: Instant, batch: u32, profile: &LatencyProfile, delay: &NetworkDelay, out: &mut Actions) {
    let done_by = |b: u32| now + delay.of(b) + profile.latency(b);
    while let Some(&head) = queue.front() {
        let window = batch.min(queue.len() as u32).max(1);
        if done_by(window) <= head.deadline {
            break;
        }
        let reason = if window > 1 && done_by(1) <= head.deadline { DropReason::EarlyDrop } else { DropReason::DeadlineUnmeetable };
        out.drops.push((head, reason));
        queue.pop_front();
    }
}

impl Scheduler for NexusScheduler {
    fn on_request(&mut self, now: Instant, req: Request, out: &mut Actions) {
        self.maybe_replan(now, out);
        let Some(n) = self.arrivals.get_mut(req.model as usize) else {
            out.drops.push((req, DropReason::UnknownModel));
            return;
        };
        *n += 1;
        self.arrivals_total += 1;
        if let Some(g) = self.enqueue(req, out) {
            self.dispatch(now, g, out);
        }
    }

    fn on_batch_done(&mut self, now: Instant, gpu: GpuId, out: &mut Actions) {
        self.maybe_replan(now, out);
        self.dispatch(now, gpu, out);
    }

    fn on_wake(&mut self, now: Instant, out: &mut Actions) {
        self.maybe_replan(now, out);
    }

    /// The next epoch, while requests keep coming (an idle system re-plans
    /// on its next arrival instead, so a finished run has no timer left).
    fn poll_at(&self) -> Option<Instant> {
        (self.arrivals_total > 0).then_some(self.next_plan)
    }

    fn name(&self) -> &'static str {
        "nexus"
    }
}
