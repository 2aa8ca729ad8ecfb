//! A discrete-event simulator on a virtual clock with emulated GPUs
//! ([`crate::gpu`]): a batch occupies its GPU for exactly `l(b)` from its
//! start. Arrivals come from [`Arrivals`]; events are taken in the order of
//! [`next_event`].
//!
//! It drives any [`Scheduler`] and checks, on every action, the invariants
//! every policy must keep: no request served twice or lost, no GPU running
//! two batches at once, no batch mixing models, no batch dispatched that the
//! profile says would finish late. A violation ends the run with an error.

pub mod autoscaled;
pub mod event;
mod metrics;
pub mod workload;

pub use event::{next_event, Event};
pub use metrics::{median_from_counts, AutoscaleAdvice, ClassReport, ModelReport, SimReport};
pub use workload::{Arrival, ArrivalStream, Arrivals, Popularity, RateSchedule, Workload};

use crate::gpu::GpuSet;
use crate::types::{Actions, Admission, DropReason, GpuId, ModelId, Request, Scheduler};
use crate::zoo::ModelSpec;
use dataplane::time::{Duration, Instant};
use metrics::{ms, ClassAcc, ModelAcc, RecordedCounts};
use std::fmt;

/// One simulated run.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// The models; model id = index.
    pub models: Vec<ModelSpec>,
    /// Number of emulated GPUs.
    pub gpus: u32,
    /// Offered load.
    pub workload: Workload,
    /// Arrivals stop at this time.
    pub duration: Duration,
    /// Requests arriving before this are not measured.
    pub warmup: Duration,
    /// Seed of every random stream.
    pub seed: u64,
    /// A recorded arrival trace `(time, model)`, sorted by time. When set it
    /// replaces the generated workload (whose rate is then ignored).
    pub trace: Option<Vec<(Instant, u32)>>,
    /// Priority classes and queue bounds (the default: none, so the run is
    /// exactly what it was before they existed).
    pub admission: SimAdmission,
}

/// Priorities and queue bounds of a simulated run.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SimAdmission {
    /// Share of requests at priority 1 (high); the rest are at priority 2.
    /// 0: no priorities (one level).
    pub priority_mix: f64,
    /// Every model's queue bound (0: unbounded).
    pub max_queue: u32,
}

impl SimAdmission {
    /// True when the run has neither priorities nor queue bounds.
    pub fn is_none(&self) -> bool {
        self.priority_mix <= 0.0 && self.max_queue == 0
    }

    /// The per-model admission policy the scheduler is given.
    pub fn model_admission(&self) -> Admission {
        Admission { levels: if self.priority_mix > 0.0 { 2 } else { 1 }, default_level: 1, max_queue: self.max_queue }
    }

    /// The priority of request `id` under `seed`: drawn from its own hash
    /// (not from the arrival streams, which stay exactly as without
    /// priorities).
    pub fn priority_of(&self, seed: u64, id: u64) -> u16 {
        if self.priority_mix <= 0.0 {
            return 0;
        }
        let mut z = seed ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let u = (z >> 11) as f64 / (1u64 << 53) as f64;
        if u < self.priority_mix {
            1
        } else {
            2
        }
    }
}

/// A broken invariant: the policy did something no policy may do.
#[derive(Clone, Debug, PartialEq)]
pub struct InvariantViolation(pub String);

impl fmt::Display for InvariantViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invariant violated: {}", self.0)
    }
}
impl std::error::Error for InvariantViolation {}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    Pending,
    Running,
    Done,
    Dropped,
}

/// What the simulator keeps of a batch on an emulated GPU.
struct SimBatch {
    model: ModelId,
    members: Vec<Request>,
}

/// An observer of every dispatched batch (for traces and live comparison).
pub trait BatchObserver {
    /// A batch was accepted: `(now, gpu, model, exec_at, members)`.
    fn on_batch(&mut self, now: Instant, gpu: GpuId, model: u32, exec_at: Instant, members: &[Request]);
    /// A request was dropped.
    fn on_drop(&mut self, _now: Instant, _req: &Request) {}
}

impl BatchObserver for () {
    fn on_batch(&mut self, _: Instant, _: GpuId, _: u32, _: Instant, _: &[Request]) {}
}

/// Runs `cfg` under `sched`.
pub fn simulate<S: Scheduler + ?Sized>(cfg: &SimConfig, sched: &mut S) -> Result<SimReport, InvariantViolation> {
    simulate_observed(cfg, sched, &mut ())
}

/// Runs `cfg` under `sched`, telling `obs` about every batch and drop.
pub fn simulate_observed<S: Scheduler + ?Sized, O: BatchObserver + ?Sized>(
    cfg: &SimConfig,
    sched: &mut S,
    obs: &mut O,
) -> Result<SimReport, InvariantViolation> {
    match drive(cfg, sched, obs, None)? {
        ProbeRun::Completed(r) => Ok(*r),
        // Without a bar the run never stops early.
        ProbeRun::Failed { .. } => Err(InvariantViolation("a run without a bar stopped early".into())),
    }
}

/// How a run that may stop early ended (see [`simulate_until_failed`]).
#[derive(Clone, Debug)]
pub enum ProbeRun {
    /// The run went to its end.
    Completed(Box<SimReport>),
    /// The run stopped once `model`'s bad rate over the whole measured
    /// window could no longer end at or under the bar.
    Failed {
        /// The model that failed.
        model: ModelId,
        /// Its bad requests so far over all its measured requests: a lower
        /// bound on the bad rate the full run would report.
        bad_rate_at_least: f64,
        /// The virtual time the run stopped at.
        stopped_at: Instant,
    },
}

/// Runs `cfg` under `sched` until some model's bad rate is certain to end
/// above `max_bad_rate`, or to its end. Every model's count of measured
/// arrivals is known before the run (the arrivals are a seeded function of
/// the configuration, counted in a first pass), and bad requests only
/// accumulate, so once `bad / measured > max_bad_rate` for some model the
/// full run's report would say the same: stopping there changes no pass or
/// fail, only the cost of the runs that fail. A goodput search's failing
/// probes above the crossing fail early, often within a fraction of their
/// span.
pub fn simulate_until_failed<S: Scheduler + ?Sized>(cfg: &SimConfig, sched: &mut S, max_bad_rate: f64) -> Result<ProbeRun, InvariantViolation> {
    let offered = measured_arrivals(cfg);
    drive(cfg, sched, &mut (), Some(FailBar { max_bad_rate, offered }))
}

/// The arrivals of `cfg` that its report will count, per model.
fn measured_arrivals(cfg: &SimConfig) -> Vec<u64> {
    let start = Instant::ZERO + cfg.warmup.min(cfg.duration);
    let mut n = vec![0u64; cfg.models.len()];
    for (t, m) in arrivals_of(cfg) {
        if t >= start {
            if let Some(c) = n.get_mut(m as usize) {
                *c += 1;
            }
        }
    }
    n
}

fn arrivals_of(cfg: &SimConfig) -> Arrivals {
    match &cfg.trace {
        Some(trace) => Arrivals::trace(trace.clone()),
        None => Arrivals::generated(&cfg.models, &cfg.workload, cfg.seed, cfg.duration),
    }
}

/// A bad rate no model may exceed, and every model's measured arrivals.
struct FailBar {
    max_bad_rate: f64,
    offered: Vec<u64>,
}

fn drive<S: Scheduler + ?Sized, O: BatchObserver + ?Sized>(
    cfg: &SimConfig,
    sched: &mut S,
    obs: &mut O,
    bar: Option<FailBar>,
) -> Result<ProbeRun, InvariantViolation> {
    let mut arrivals = arrivals_of(cfg);
    let mut run = Run::new(cfg, bar);
    if !cfg.admission.is_none() {
        for m in 0..cfg.models.len() {
            sched.set_admission(m as ModelId, cfg.admission.model_admission());
        }
    }
    match event_loop(&mut run, &mut arrivals, sched, obs, &mut NoLayer)? {
        LoopEnd::Failed { model, bad_rate_at_least, stopped_at } => Ok(ProbeRun::Failed { model, bad_rate_at_least, stopped_at }),
        LoopEnd::Ended(_) => run.finish(sched.name()).map(|r| ProbeRun::Completed(Box::new(r))),
    }
}

/// What a run adds to the one event loop ([`event_loop`]): events of its
/// own (a cluster that changes size: GPUs joining and leaving, the
/// autoscaler's decisions) and checks on the policy's actions before they
/// apply. A plain run adds nothing ([`NoLayer`]).
trait Layer {
    /// When the layer's next own event is due. At equal times it comes
    /// before the simulator's.
    fn control_at(&self) -> Option<Instant>;
    /// Handles the layer's events due at `now`, applying whatever the
    /// policy does in answer.
    fn on_control<S: Scheduler + ?Sized, O: BatchObserver + ?Sized>(
        &mut self,
        now: Instant,
        run: &mut Run<'_>,
        sched: &mut S,
        out: &mut Actions,
        obs: &mut O,
    ) -> Result<(), InvariantViolation>;
    /// GPU `g`'s batch finished at `now` (before the policy hears of it).
    fn on_gpu_done(&mut self, now: Instant, g: GpuId, run: &Run<'_>);
    /// Checks the policy's actions before the run applies them.
    fn before_apply(&mut self, out: &Actions, run: &Run<'_>, policy: &str) -> Result<(), InvariantViolation>;
}

/// The plain run's layer: a fixed cluster.
struct NoLayer;

impl Layer for NoLayer {
    fn control_at(&self) -> Option<Instant> {
        None
    }
    fn on_control<S: Scheduler + ?Sized, O: BatchObserver + ?Sized>(
        &mut self,
        _: Instant,
        _: &mut Run<'_>,
        _: &mut S,
        _: &mut Actions,
        _: &mut O,
    ) -> Result<(), InvariantViolation> {
        Ok(())
    }
    fn on_gpu_done(&mut self, _: Instant, _: GpuId, _: &Run<'_>) {}
    fn before_apply(&mut self, _: &Actions, _: &Run<'_>, _: &str) -> Result<(), InvariantViolation> {
        Ok(())
    }
}

/// How [`event_loop`] ended.
enum LoopEnd {
    /// A model's bad rate passed the run's bar (see [`ProbeRun::Failed`]).
    Failed { model: ModelId, bad_rate_at_least: f64, stopped_at: Instant },
    /// No event was left; the last one's time.
    Ended(Instant),
}

/// The simulator's one event loop: arrivals, GPUs finishing, the policy's
/// timers and the layer's own events, in time order, each followed by the
/// policy's actions, checked and applied.
fn event_loop<S: Scheduler + ?Sized, O: BatchObserver + ?Sized, L: Layer>(
    run: &mut Run<'_>,
    arrivals: &mut Arrivals,
    sched: &mut S,
    obs: &mut O,
    layer: &mut L,
) -> Result<LoopEnd, InvariantViolation> {
    let mut out = Actions::default();
    let mut now = Instant::ZERO;
    let mut stalls = 0u32;
    // The next arrival's time changes only when an arrival is taken (only
    // this loop takes them): looked up then, not on every event.
    let mut t_arrival = arrivals.peek_time();
    loop {
        if let Some((model, bad_rate_at_least)) = run.failed {
            return Ok(LoopEnd::Failed { model, bad_rate_at_least, stopped_at: now });
        }
        let t_wake = sched.poll_at().map(|t| t.max(now));
        let sim_next = next_event(run.gpus.poll_at(), t_wake, t_arrival);
        if let Some(tc) = layer.control_at().filter(|&tc| sim_next.is_none_or(|(t, _)| tc <= t)) {
            now = tc.max(now);
            layer.on_control(now, run, sched, &mut out, obs)?;
            continue;
        }
        let Some((t, event)) = sim_next else { break };
        if t == now {
            stalls += 1;
            if stalls > 1_000_000 {
                return Err(InvariantViolation(format!("{} livelocks at {now}", sched.name())));
            }
        } else {
            stalls = 0;
        }
        now = t;
        match event {
            Event::GpuDone => {
                if let Some(g) = run.gpu_done(now) {
                    layer.on_gpu_done(now, g, run);
                    sched.on_batch_done(now, g, &mut out);
                }
            }
            Event::Wake => sched.on_wake(now, &mut out),
            Event::Arrival => {
                let taken = arrivals.next();
                t_arrival = arrivals.peek_time();
                if let Some((_, m)) = taken {
                    let req = run.arrival(now, m)?;
                    sched.on_request(now, req, &mut out);
                }
            }
        }
        if out.is_empty() {
            continue;
        }
        layer.before_apply(&out, run, sched.name())?;
        run.apply(now, &out, sched.name(), obs)?;
        out.clear();
    }
    Ok(LoopEnd::Ended(now))
}

/// One simulated run's state: every request's state, the per-model
/// accumulators, the GPUs and their busy time inside the window.
struct Run<'a> {
    cfg: &'a SimConfig,
    window_start: Instant,
    end: Instant,
    states: Vec<State>,
    acc: Vec<ModelAcc>,
    /// Per priority class (index: level - 1; one class without priorities).
    classes: [ClassAcc; 2],
    gpus: GpuSet<SimBatch>,
    busy_ns: Vec<u64>,
    /// Member vectors of finished batches, reused.
    spare: Vec<Vec<Request>>,
    total_batches: u64,
    /// The bar a run may stop early on, if any.
    bar: Option<FailBar>,
    /// The first model found certain to end above the bar, and its bad
    /// rate then.
    failed: Option<(ModelId, f64)>,
}

impl<'a> Run<'a> {
    fn new(cfg: &'a SimConfig, bar: Option<FailBar>) -> Self {
        let expected = (cfg.workload.rate_rps * cfg.duration.as_secs_f64() * 1.1) as usize + 1024;
        Run {
            cfg,
            window_start: Instant::ZERO + cfg.warmup.min(cfg.duration),
            end: Instant::ZERO + cfg.duration,
            states: Vec::with_capacity(expected.min(1 << 28)),
            acc: cfg.models.iter().map(|m| ModelAcc::new(m.profile.max_batch())).collect(),
            classes: [ClassAcc::default(); 2],
            gpus: GpuSet::new(cfg.gpus),
            busy_ns: vec![0u64; cfg.gpus as usize],
            spare: Vec::new(),
            total_batches: 0,
            bar,
            failed: None,
        }
    }

    /// Notes a measured bad request of `model`: with a bar, the run fails
    /// once the model's bad count over all its measured arrivals is above
    /// it (the same division the report makes, with a numerator that can
    /// only grow).
    #[inline]
    fn note_bad(&mut self, model: ModelId) {
        let Some(bar) = &self.bar else { return };
        let (Some(a), Some(&n)) = (self.acc.get(model as usize), bar.offered.get(model as usize)) else { return };
        let bad_rate = (a.dropped + a.late) as f64 / n as f64;
        if self.failed.is_none() && n > 0 && bad_rate > bar.max_bad_rate {
            self.failed = Some((model, bad_rate));
        }
    }

    /// The class accumulator index of `r`.
    fn class_of(r: &Request) -> usize {
        usize::from(r.priority.saturating_sub(1)).min(1)
    }

    /// Whether `r` arrived inside the measurement window.
    fn measured(window_start: Instant, r: &Request) -> bool {
        r.arrival >= window_start
    }

    /// Nanoseconds of `[a, b)` inside the measurement window.
    fn overlap(&self, a: Instant, b: Instant) -> u64 {
        let (s, e) = (a.max(self.window_start), b.min(self.end));
        e.saturating_since(s).as_nanos()
    }

    /// Retires the batch finishing now; returns its GPU.
    fn gpu_done(&mut self, now: Instant) -> Option<GpuId> {
        let done = self.gpus.pop_finished(now)?;
        let g = done.device;
        self.busy_ns[g as usize] += self.overlap(done.start, done.finish);
        let b = done.tag;
        let a = &mut self.acc[b.model as usize];
        let mut late = false;
        for r in &b.members {
            self.states[r.id as usize] = State::Done;
            if Self::measured(self.window_start, r) {
                let lat = done.finish.saturating_since(r.arrival);
                if done.finish <= r.deadline {
                    a.good += 1;
                    self.classes[Self::class_of(r)].good += 1;
                } else {
                    a.late += 1;
                    self.classes[Self::class_of(r)].late += 1;
                    late = true;
                }
                a.latency_us.record((lat.as_nanos() / 1000).max(1));
            }
        }
        if late {
            self.note_bad(b.model);
        }
        let mut members = b.members;
        members.clear();
        self.spare.push(members);
        Some(g)
    }

    /// A request of model `m` arriving now.
    fn arrival(&mut self, now: Instant, m: ModelId) -> Result<Request, InvariantViolation> {
        let spec = self.cfg.models.get(m as usize).ok_or_else(|| InvariantViolation(format!("trace names unknown model {m}")))?;
        let mut req = Request::new(self.states.len() as u64, m, now, now + spec.slo);
        req.priority = self.cfg.admission.priority_of(self.cfg.seed, req.id);
        self.states.push(State::Pending);
        if Self::measured(self.window_start, &req) {
            self.acc[m as usize].offered += 1;
            self.classes[Self::class_of(&req)].offered += 1;
        }
        Ok(req)
    }

    /// Applies the policy's actions, checking every invariant.
    fn apply<O: BatchObserver + ?Sized>(&mut self, now: Instant, out: &Actions, policy: &str, obs: &mut O) -> Result<(), InvariantViolation> {
        for &g in &out.preemptions {
            self.preempt(now, g)?;
        }
        for &(r, reason) in &out.drops {
            self.drop_request(&r, reason)?;
            obs.on_drop(now, &r);
        }
        for plan in &out.batches {
            let members = out.members_of(plan);
            self.start_batch(now, plan.gpu, plan.model, plan.exec_at, members, policy)?;
            obs.on_batch(now, plan.gpu, plan.model, plan.exec_at, members);
        }
        Ok(())
    }

    fn preempt(&mut self, now: Instant, g: GpuId) -> Result<(), InvariantViolation> {
        if g >= self.gpus.devices() {
            return Err(InvariantViolation(format!("preempted unknown GPU {g}")));
        }
        if let Some(b) = self.gpus.preempt(g, now) {
            self.busy_ns[g as usize] += self.overlap(b.start, b.finish);
            for r in &b.tag.members {
                self.states[r.id as usize] = State::Pending;
            }
            let mut members = b.tag.members;
            members.clear();
            self.spare.push(members);
        }
        Ok(())
    }

    fn drop_request(&mut self, r: &Request, reason: DropReason) -> Result<(), InvariantViolation> {
        let st = self.states.get_mut(r.id as usize).ok_or_else(|| InvariantViolation(format!("dropped unknown request {}", r.id)))?;
        if *st != State::Pending {
            return Err(InvariantViolation(format!("request {} dropped while {:?}", r.id, st)));
        }
        *st = State::Dropped;
        if Self::measured(self.window_start, r) {
            let acc = &mut self.acc[r.model as usize];
            acc.dropped += 1;
            acc.drops_by_reason[reason.index()] += 1;
            let c = &mut self.classes[Self::class_of(r)];
            c.dropped += 1;
            c.refused += u64::from(reason == DropReason::Overloaded);
            c.timeouts += u64::from(reason == DropReason::Timeout);
            self.note_bad(r.model);
        }
        Ok(())
    }

    /// Checks a planned batch and puts it on its GPU.
    fn start_batch(&mut self, now: Instant, g: GpuId, model: ModelId, exec_at: Instant, members: &[Request], policy: &str) -> Result<(), InvariantViolation> {
        if g >= self.gpus.devices() {
            return Err(InvariantViolation(format!("batch for unknown GPU {g}")));
        }
        let spec = self.cfg.models.get(model as usize).ok_or_else(|| InvariantViolation(format!("batch of unknown model {model}")))?;
        let n = members.len() as u32;
        if n == 0 || n > spec.profile.max_batch() {
            return Err(InvariantViolation(format!("batch of size {n} for {}", spec.name)));
        }
        if exec_at < now {
            return Err(InvariantViolation(format!("batch starts in the past ({exec_at} < {now})")));
        }
        let l = spec.profile.latency(n);
        let finish = exec_at + self.gpus.hold_time(g, l);
        if self.gpus.would_overlap(g, exec_at) {
            return Err(InvariantViolation(format!(
                "GPU {g} would run two batches at once: starts {} before {} ends",
                exec_at,
                self.gpus.free_at(g).unwrap_or(Instant::NEVER)
            )));
        }
        let mut batch = self.spare.pop().unwrap_or_default();
        let window_start = self.window_start;
        let a = &mut self.acc[model as usize];
        let mut measured = 0u64;
        for r in members {
            if r.model != model {
                return Err(InvariantViolation(format!("batch mixes models {model} and {}", r.model)));
            }
            if finish > r.deadline {
                return Err(InvariantViolation(format!(
                    "{policy} dispatched a batch of {n} finishing at {finish}, after request {}'s deadline {}",
                    r.id, r.deadline
                )));
            }
            let st = self.states.get_mut(r.id as usize).ok_or_else(|| InvariantViolation(format!("unknown request {}", r.id)))?;
            if *st != State::Pending {
                return Err(InvariantViolation(format!("request {} dispatched while {:?}", r.id, st)));
            }
            *st = State::Running;
            if Self::measured(window_start, r) {
                measured += 1;
                a.queueing_us.record((exec_at.saturating_since(r.arrival).as_nanos() / 1000).max(1));
            }
            batch.push(*r);
        }
        // Counted once per batch: `n` is within the profile's sizes, for
        // which `batch_requests` has a slot.
        if measured > 0 {
            a.batch_requests[n as usize] += measured;
            a.batches += 1;
        }
        self.total_batches += 1;
        // Cannot fail: the GPU exists and the batch starts when planned.
        let _ = self.gpus.submit(g, exec_at, l, SimBatch { model, members: batch });
        Ok(())
    }

    /// Checks that every request ended, and reports.
    fn finish(self, policy: &str) -> Result<SimReport, InvariantViolation> {
        if let Some(id) = self.states.iter().position(|s| !matches!(s, State::Done | State::Dropped)) {
            return Err(InvariantViolation(format!("request {id} was never served nor dropped ({:?})", self.states[id])));
        }
        let window_ns = self.end.saturating_since(self.window_start).as_nanos().max(1);
        let mut rep = report(self.cfg, policy, &self.acc, &self.busy_ns, window_ns, self.states.len() as u64, self.total_batches);
        if !self.cfg.admission.is_none() {
            let n = if self.cfg.admission.priority_mix > 0.0 { 2 } else { 1 };
            rep.classes = Some(self.classes[..n].iter().enumerate().map(|(i, c)| c.report(i as u16 + 1)).collect());
        }
        Ok(rep)
    }
}

fn report(cfg: &SimConfig, policy: &str, acc: &[ModelAcc], busy_ns: &[u64], window_ns: u64, requests: u64, batches: u64) -> SimReport {
    let mut all_lat = RecordedCounts::new();
    let mut all_q = RecordedCounts::new();
    let mut all_batches = vec![0u64; acc.iter().map(|a| a.batch_requests.len()).max().unwrap_or(1)];
    let mut models = Vec::with_capacity(acc.len());
    let (mut offered, mut good, mut dropped, mut late, mut nbatches) = (0, 0, 0, 0, 0);
    let mut worst: f64 = 0.0;
    for (spec, a) in cfg.models.iter().zip(acc) {
        all_lat.add(&a.latency_us);
        all_q.add(&a.queueing_us);
        for (b, &c) in a.batch_requests.iter().enumerate() {
            all_batches[b] += c;
        }
        let bad = a.dropped + a.late;
        let bad_rate = if a.offered > 0 { bad as f64 / a.offered as f64 } else { 0.0 };
        worst = worst.max(bad_rate);
        let served: u64 = a.batch_requests.iter().sum();
        models.push(ModelReport {
            name: spec.name.clone(),
            offered: a.offered,
            good: a.good,
            bad,
            dropped: a.dropped,
            drops_by_reason: DropReason::ALL.iter().filter(|r| a.drops_by_reason[r.index()] > 0).map(|r| (r.as_str(), a.drops_by_reason[r.index()])).collect(),
            late: a.late,
            bad_rate,
            p50_ms: ms(&a.latency_us, 0.5),
            p99_ms: ms(&a.latency_us, 0.99),
            queueing_p50_ms: ms(&a.queueing_us, 0.5),
            queueing_p99_ms: ms(&a.queueing_us, 0.99),
            median_batch: median_from_counts(&a.batch_requests),
            mean_batch: if a.batches > 0 { served as f64 / a.batches as f64 } else { 0.0 },
            batches: a.batches,
        });
        offered += a.offered;
        good += a.good;
        dropped += a.dropped;
        late += a.late;
        nbatches += a.batches;
    }
    let window_s = window_ns as f64 / 1e9;
    let gpu_busy_fraction: Vec<f64> = busy_ns.iter().map(|&b| b as f64 / window_ns as f64).collect();
    let idle = if busy_ns.is_empty() { 0.0 } else { 1.0 - gpu_busy_fraction.iter().sum::<f64>() / busy_ns.len() as f64 };
    let bad_rate = if offered > 0 { (dropped + late) as f64 / offered as f64 } else { 0.0 };
    let served: u64 = all_batches.iter().sum();
    SimReport {
        policy: policy.to_string(),
        gpus: cfg.gpus,
        offered_rps: cfg.workload.rate_rps,
        measured_offered_rps: offered as f64 / window_s,
        good_rps: good as f64 / window_s,
        offered,
        good,
        dropped,
        late,
        bad_rate,
        max_model_bad_rate: worst,
        median_batch: median_from_counts(&all_batches),
        mean_batch: if nbatches > 0 { served as f64 / nbatches as f64 } else { 0.0 },
        gpu_idle_fraction: idle,
        p50_ms: ms(&all_lat, 0.5),
        p99_ms: ms(&all_lat, 0.99),
        queueing_p50_ms: ms(&all_q, 0.5),
        queueing_p99_ms: ms(&all_q, 0.99),
        batch_size_histogram: all_batches.iter().enumerate().filter(|(_, &c)| c > 0).map(|(b, &c)| [b as u64, c]).collect(),
        gpu_busy_fraction,
        autoscale: AutoscaleAdvice::new(cfg.gpus, bad_rate, idle, 0.01),
        simulated_requests: requests,
        simulated_batches: batches,
        models,
        classes: None,
    }
}
