//! The live runtime's workers. Each is a plain struct with `step(now)`
//! methods and no threads of its own, so the same code runs on pinned
//! threads (real clock) or under the lockstep driver (manual clock).

use crate::deferred::{Admission, Grant, ModelThreadCore, ToRank};
use crate::deferred::RankCore;
use crate::netdelay::NetworkDelay;
use crate::gpu::GpuSet;
use crate::profile::LatencyProfile;
use crate::sim::{Arrivals, Workload};
use crate::types::{Actions, DropReason, GpuId, ModelId, Request, RequestId};
use crate::zoo::ModelSpec;
use dataplane::spsc::{Consumer, Producer};
use dataplane::time::{Duration, Instant};
use hdrhistogram::Histogram;
use std::collections::VecDeque;

/// Requests or messages handled per ring per step, so no ring starves the
/// others and timers are checked often.
pub(crate) const BATCH: usize = 256;

/// A dispatched batch as recorded for comparisons: GPU, model, start, member ids.
pub type RecordedBatch = (GpuId, ModelId, Instant, Vec<u64>);

/// One batch as the (emulated) backends see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dispatch {
    /// GPU.
    pub gpu: GpuId,
    /// Model.
    pub model: ModelId,
    /// Batch size.
    pub size: u32,
    /// Planned start.
    pub exec_at: Instant,
    /// Planned end (`exec_at + l(size)`).
    pub finish_at: Instant,
    /// Earliest deadline among the members.
    pub min_deadline: Instant,
    /// First member's request id (members are listed by the lockstep driver).
    pub first_id: u64,
}

/// What the host (the daemon's I/O thread) asks a ModelThread to do
/// besides taking requests. It is applied once the ModelThread has taken
/// `after` requests from its ingress ring, so it lands exactly where the
/// host put it in the stream of requests (a cancel never overtakes its
/// task).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ModelControl {
    /// Requests the host had pushed to this ModelThread before this.
    pub after: u64,
    /// What to do.
    pub op: ModelOp,
}

/// The operations of a [`ModelControl`] (those of
/// [`crate::deferred::DeferredScheduler`] that reach the ModelThreads).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ModelOp {
    /// The client gave request `id` of `model` up.
    Cancel {
        /// Model.
        model: ModelId,
        /// Request.
        id: RequestId,
    },
    /// The network delay bound changed.
    Delay(NetworkDelay),
    /// Closed loop: a GPU's factor.
    GpuFactor {
        /// GPU.
        gpu: GpuId,
        /// Factor over the profile.
        factor: f64,
    },
    /// Closed loop: a (model, GPU) factor (`None`: the GPU's).
    ModelGpuFactor {
        /// Model.
        model: ModelId,
        /// GPU.
        gpu: GpuId,
        /// Factor over the profile.
        factor: Option<f64>,
    },
    /// A model's priority levels and queue bound.
    Admission {
        /// Model.
        model: ModelId,
        /// The policy.
        admission: Admission,
    },
}

/// What the host tells the RankThread: GPU membership and free-time
/// corrections (as [`ToRank`] messages) and delay bound changes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RankControl {
    /// A message as a ModelThread would send it.
    Message(ToRank),
    /// The network delay bound changed.
    Delay(NetworkDelay),
}

/// A ModelThread's decisions for the host, in decision order: drops, and
/// plans each followed by exactly `size` members.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A request was dropped.
    Dropped(Request, DropReason),
    /// A batch (its `size` members follow).
    Planned {
        /// GPU.
        gpu: GpuId,
        /// Model.
        model: ModelId,
        /// Planned start.
        exec_at: Instant,
        /// Planned end.
        finish_at: Instant,
        /// When the policy meant to decide it.
        planned_at: Instant,
        /// Members that follow.
        size: u32,
    },
    /// A member of the batch planned last.
    Member(Request),
}

/// Where a ModelThread's decisions go: to emulated GPUs as [`Dispatch`]es
/// (the benchmark and the lockstep comparison), or to the daemon's I/O
/// thread as [`Outcome`]s (every member and drop, to answer peers).
pub enum Sink {
    /// Batches only, summarised.
    Dispatches(Producer<Dispatch>),
    /// Every decision in full.
    Outcomes(Producer<Outcome>),
}

/// Latency histograms record nanoseconds up to 10 s with 3 significant digits.
pub(crate) fn ns_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 10_000_000_000, 3).unwrap_or_else(|_| Histogram::new(3).unwrap_or_else(|_| unreachable!()))
}

/// Counters of one ModelThread worker.
#[derive(Clone, Debug)]
pub struct ModelWorkerStats {
    /// Requests taken from ingress rings.
    pub requests: u64,
    /// Batches dispatched.
    pub batches: u64,
    /// Requests in those batches.
    pub batched: u64,
    /// Requests dropped.
    pub dropped: u64,
    /// Drops by reason, indexed by [`DropReason::index`].
    pub dropped_by_reason: [u64; DropReason::COUNT],
    /// Dispatch lag: decision time minus planned decision time, ns.
    pub dispatch_lag_ns: Histogram<u64>,
    /// `batch_requests[b]`: requests dispatched in batches of size `b`.
    pub batch_requests: Vec<u64>,
}

/// A ModelThread: a [`ModelThreadCore`] fed by ingress rings and the
/// RankThread's grants.
pub struct ModelWorker {
    core: ModelThreadCore,
    ingress: Vec<Consumer<Request>>,
    grants: Consumer<Grant>,
    to_rank: Producer<ToRank>,
    /// Messages that did not fit in `to_rank` yet (never dropped).
    outbox: VecDeque<ToRank>,
    sink: Sink,
    dispatch_backlog: VecDeque<Dispatch>,
    outcome_backlog: VecDeque<Outcome>,
    /// Outcomes pushed to the sink so far (the host's wake-up cue).
    pub outcomes_sent: u64,
    control: Option<Consumer<ModelControl>>,
    /// A control taken from its ring whose `after` is not reached yet.
    held_control: Option<ModelControl>,
    out: Actions,
    /// When set, every dispatched batch's members are recorded (lockstep
    /// comparisons only; the live path leaves it off).
    pub record_members: Option<Vec<RecordedBatch>>,
    /// Counters.
    pub stats: ModelWorkerStats,
}

impl ModelWorker {
    pub(crate) fn new(
        core: ModelThreadCore,
        ingress: Vec<Consumer<Request>>,
        grants: Consumer<Grant>,
        to_rank: Producer<ToRank>,
        sink: Sink,
        control: Option<Consumer<ModelControl>>,
    ) -> Self {
        let max_batch = core.max_batch() as usize;
        let mut out = Actions::default();
        out.batches.reserve(64);
        out.members.reserve(4096);
        out.drops.reserve(1024);
        ModelWorker {
            core,
            ingress,
            grants,
            to_rank,
            outbox: VecDeque::with_capacity(4096),
            sink,
            dispatch_backlog: VecDeque::with_capacity(1024),
            outcome_backlog: VecDeque::with_capacity(4096),
            outcomes_sent: 0,
            control,
            held_control: None,
            out,
            record_members: None,
            stats: ModelWorkerStats {
                requests: 0,
                batches: 0,
                batched: 0,
                dropped: 0,
                dropped_by_reason: [0; DropReason::COUNT],
                dispatch_lag_ns: ns_hist(),
                batch_requests: vec![0; max_batch + 1],
            },
        }
    }

    /// The next time this worker's timers want attention.
    pub fn poll_at(&self) -> Option<Instant> {
        self.core.poll_at()
    }

    /// Requests waiting in the queues.
    pub fn queued(&self) -> usize {
        self.core.queued()
    }

    /// Everything due: timers, ingress, grants. Returns the work done.
    pub fn step(&mut self, now: Instant) -> usize {
        let mut work = self.wake(now);
        for i in 0..self.ingress.len() {
            work += self.drain_ingress(i, now, BATCH);
        }
        work += self.drain_control(now);
        work += self.drain_grants(now);
        work
    }

    /// Applies the host's controls whose place in the request stream has
    /// been reached (all of them once the ingress is drained).
    pub fn drain_control(&mut self, now: Instant) -> usize {
        let Some(ring) = &mut self.control else { return 0 };
        let mut n = 0;
        while let Some(c) = self.held_control.take().or_else(|| ring.try_pop()) {
            if c.after > self.stats.requests {
                self.held_control = Some(c);
                break;
            }
            n += 1;
            let (core, out, outbox) = (&mut self.core, &mut self.out, &mut self.outbox);
            match c.op {
                ModelOp::Cancel { model, id } => {
                    core.cancel(now, model, id, out, &mut |m| outbox.push_back(m));
                }
                ModelOp::Delay(d) => core.set_delay(d),
                ModelOp::GpuFactor { gpu, factor } => core.set_gpu_factor(gpu, factor),
                ModelOp::ModelGpuFactor { model, gpu, factor } => core.set_model_gpu_factor(model, gpu, factor),
                ModelOp::Admission { model, admission } => core.set_admission(model, admission),
            }
        }
        if n == 0 {
            return 0;
        }
        n + self.flush(now)
    }

    /// Fires due model timers.
    pub fn wake(&mut self, now: Instant) -> usize {
        if self.core.poll_at().is_none_or(|t| t > now) {
            return self.flush(now);
        }
        let outbox = &mut self.outbox;
        self.core.on_wake(now, &mut self.out, &mut |m| outbox.push_back(m));
        1 + self.flush(now)
    }

    /// Takes up to `max` requests from ingress ring `i`.
    pub fn drain_ingress(&mut self, i: usize, now: Instant, max: usize) -> usize {
        let (core, out, outbox) = (&mut self.core, &mut self.out, &mut self.outbox);
        let n = self.ingress[i].pop_batch(max, |req| core.on_request(now, req, out, &mut |m| outbox.push_back(m)));
        self.stats.requests += n as u64;
        n + self.flush(now)
    }

    /// Handles every pending grant.
    pub fn drain_grants(&mut self, now: Instant) -> usize {
        let (core, out, outbox) = (&mut self.core, &mut self.out, &mut self.outbox);
        let n = self.grants.pop_batch(BATCH, |g| core.on_grant(now, g, out, &mut |m| outbox.push_back(m)));
        n + self.flush(now)
    }

    /// Sends queued messages and decisions; returns how many went out.
    fn flush(&mut self, now: Instant) -> usize {
        let outcomes = matches!(self.sink, Sink::Outcomes(_));
        if outcomes {
            for &(req, reason) in &self.out.drops {
                self.outcome_backlog.push_back(Outcome::Dropped(req, reason));
            }
        }
        for plan in &self.out.batches {
            let members = &self.out.members[plan.members.clone()];
            let min_deadline = members.iter().map(|r| r.deadline).min().unwrap_or(plan.finish_at);
            self.stats.batches += 1;
            self.stats.batched += members.len() as u64;
            if let Some(c) = self.stats.batch_requests.get_mut(members.len()) {
                *c += members.len() as u64;
            }
            let _ = self.stats.dispatch_lag_ns.record(now.saturating_since(plan.planned_at).as_nanos().max(1));
            if let Some(rec) = &mut self.record_members {
                rec.push((plan.gpu, plan.model, plan.exec_at, members.iter().map(|r| r.id).collect()));
            }
            if outcomes {
                self.outcome_backlog.push_back(Outcome::Planned {
                    gpu: plan.gpu,
                    model: plan.model,
                    exec_at: plan.exec_at,
                    finish_at: plan.finish_at,
                    planned_at: plan.planned_at,
                    size: members.len() as u32,
                });
                self.outcome_backlog.extend(members.iter().map(|&r| Outcome::Member(r)));
            } else {
                self.dispatch_backlog.push_back(Dispatch {
                    gpu: plan.gpu,
                    model: plan.model,
                    size: members.len() as u32,
                    exec_at: plan.exec_at,
                    finish_at: plan.finish_at,
                    min_deadline,
                    first_id: members.first().map_or(0, |r| r.id),
                });
            }
        }
        self.stats.dropped += self.out.drops.len() as u64;
        for (_, reason) in &self.out.drops {
            self.stats.dropped_by_reason[reason.index()] += 1;
        }
        self.out.clear();
        let mut work = 0;
        match &mut self.sink {
            Sink::Dispatches(ring) => {
                while let Some(&d) = self.dispatch_backlog.front() {
                    if ring.try_push(d).is_err() {
                        break;
                    }
                    self.dispatch_backlog.pop_front();
                    work += 1;
                }
            }
            Sink::Outcomes(ring) => {
                while let Some(&o) = self.outcome_backlog.front() {
                    if ring.try_push(o).is_err() {
                        break;
                    }
                    self.outcome_backlog.pop_front();
                    self.outcomes_sent += 1;
                    work += 1;
                }
            }
        }
        while let Some(&m) = self.outbox.front() {
            if self.to_rank.try_push(m).is_err() {
                break;
            }
            self.outbox.pop_front();
            work += 1;
        }
        work
    }

    /// True when nothing is waiting to be sent.
    pub fn flushed(&self) -> bool {
        self.outbox.is_empty() && self.dispatch_backlog.is_empty() && self.outcome_backlog.is_empty()
    }

    /// True when a ring has something for this worker (the recheck before
    /// parking).
    pub fn has_input(&mut self) -> bool {
        !self.grants.is_empty()
            || self.ingress.iter_mut().any(|c| !c.is_empty())
            || self.control.as_ref().is_some_and(|c| !c.is_empty())
    }
}

/// Counters of the RankThread worker.
#[derive(Clone, Copy, Debug, Default)]
pub struct RankWorkerStats {
    /// Messages and timer events handled.
    pub events: u64,
    /// Wall time spent handling them, ns (live runs only).
    pub busy_ns: u64,
}

/// The RankThread: a [`RankCore`] fed by every ModelThread's ring.
pub struct RankWorker {
    core: RankCore,
    from_models: Vec<Consumer<ToRank>>,
    /// The host's ring (the daemon's I/O thread), if any.
    control: Option<Consumer<RankControl>>,
    grants: Vec<Producer<Grant>>,
    backlog: Vec<VecDeque<Grant>>,
    /// Model id -> ModelThread index.
    owner: Vec<u32>,
    /// Counters.
    pub stats: RankWorkerStats,
}

impl RankWorker {
    pub(crate) fn new(core: RankCore, from_models: Vec<Consumer<ToRank>>, grants: Vec<Producer<Grant>>, owner: Vec<u32>) -> Self {
        let backlog = grants.iter().map(|_| VecDeque::with_capacity(1024)).collect();
        RankWorker { core, from_models, control: None, grants, backlog, owner, stats: RankWorkerStats::default() }
    }

    /// This worker, also taking the host's controls from `control`.
    pub(crate) fn with_control(mut self, control: Consumer<RankControl>) -> Self {
        self.control = Some(control);
        self
    }

    /// The GPU timer.
    pub fn poll_at(&self) -> Option<Instant> {
        self.core.poll_at()
    }

    /// Messages, then the GPU timer.
    pub fn step(&mut self, now: Instant) -> usize {
        self.drain_messages(now) + self.wake(now)
    }

    /// Handles every pending message from every ModelThread.
    pub fn drain_messages(&mut self, now: Instant) -> usize {
        let mut n = 0;
        if let Some(ring) = &mut self.control {
            let (core, backlog, owner) = (&mut self.core, &mut self.backlog, &self.owner);
            n += ring.pop_batch(BATCH, |c| match c {
                RankControl::Message(m) => {
                    core.on_message(now, m, &mut |g| backlog[owner[g.model as usize] as usize].push_back(g))
                }
                RankControl::Delay(d) => core.set_delay(d),
            });
        }
        for i in 0..self.from_models.len() {
            let (core, backlog, owner) = (&mut self.core, &mut self.backlog, &self.owner);
            n += self.from_models[i].pop_batch(BATCH, |m| {
                core.on_message(now, m, &mut |g| backlog[owner[g.model as usize] as usize].push_back(g))
            });
        }
        self.stats.events += n as u64;
        n + self.flush()
    }

    /// Fires the GPU timer if due.
    pub fn wake(&mut self, now: Instant) -> usize {
        if self.core.poll_at().is_none_or(|t| t > now) {
            return self.flush();
        }
        let (backlog, owner) = (&mut self.backlog, &self.owner);
        self.core.on_wake(now, &mut |g| backlog[owner[g.model as usize] as usize].push_back(g));
        self.stats.events += 1;
        1 + self.flush()
    }

    fn flush(&mut self) -> usize {
        let mut work = 0;
        for (q, ring) in self.backlog.iter_mut().zip(self.grants.iter_mut()) {
            while let Some(&g) = q.front() {
                if ring.try_push(g).is_err() {
                    break;
                }
                q.pop_front();
                work += 1;
            }
        }
        work
    }

    /// True when no grant waits to be sent.
    pub fn flushed(&self) -> bool {
        self.backlog.iter().all(VecDeque::is_empty)
    }

    /// True when a ModelThread's ring has a message (the recheck before
    /// parking).
    pub fn has_input(&mut self) -> bool {
        self.from_models.iter_mut().any(|c| !c.is_empty()) || self.control.as_ref().is_some_and(|c| !c.is_empty())
    }
}

/// In-process emulated backends: take the ModelThreads' dispatches and run
/// each batch on a [`GpuSet`] (exactly its profiled time from its planned
/// start). Checks that no two batches overlap on a GPU and none finishes
/// after its earliest deadline.
pub struct EmulatedGpus {
    from_models: Vec<Consumer<Dispatch>>,
    /// Each model's profile, for `l(b)`.
    profiles: Vec<LatencyProfile>,
    /// The GPUs; a batch's tag is its size.
    gpus: GpuSet<u32>,
    /// Batches completed.
    pub batches_done: u64,
    /// Requests completed (all within their deadline, or counted below).
    pub requests_done: u64,
    /// Busy GPU time accumulated by accepted batches, ns.
    pub busy_ns: u64,
    /// Invariant violations seen (overlap, late finish, unknown GPU or model).
    pub violations: u64,
    /// The first violation, described.
    pub first_violation: Option<String>,
}

impl EmulatedGpus {
    pub(crate) fn new(models: &[ModelSpec], gpus: u32, from_models: Vec<Consumer<Dispatch>>) -> Self {
        EmulatedGpus {
            from_models,
            profiles: models.iter().map(|m| m.profile.clone()).collect(),
            gpus: GpuSet::new(gpus),
            batches_done: 0,
            requests_done: 0,
            busy_ns: 0,
            violations: 0,
            first_violation: None,
        }
    }

    /// Batches accepted but not finished.
    pub fn in_flight(&self) -> usize {
        self.gpus.in_flight()
    }

    fn violate(&mut self, what: String) {
        self.violations += 1;
        if self.first_violation.is_none() {
            self.first_violation = Some(what);
        }
    }

    /// Accepts new batches and completes those whose time has come.
    pub fn step(&mut self, now: Instant) -> usize {
        let mut work = 0;
        for i in 0..self.from_models.len() {
            while let Some(d) = self.from_models[i].try_pop() {
                work += 1;
                let g = d.gpu;
                let Some(l) = self.profiles.get(d.model as usize).map(|p| p.latency(d.size)) else {
                    self.violate(format!("batch of unknown model {}", d.model));
                    continue;
                };
                if self.gpus.would_overlap(g, d.exec_at) {
                    let free = self.gpus.free_at(g).unwrap_or(Instant::NEVER);
                    self.violate(format!("GPU {g}: batch starting {} overlaps one ending {free}", d.exec_at));
                }
                let Ok(span) = self.gpus.submit(g, d.exec_at, l, d.size) else {
                    self.violate(format!("batch for unknown GPU {g}"));
                    continue;
                };
                if span.finish > d.min_deadline {
                    self.violate(format!("GPU {g}: batch finishing {} after deadline {}", span.finish, d.min_deadline));
                }
                self.busy_ns += span.finish.saturating_since(span.start).as_nanos();
            }
        }
        while let Some(done) = self.gpus.pop_finished(now) {
            self.batches_done += 1;
            self.requests_done += u64::from(done.tag);
            work += 1;
        }
        work
    }

    /// The next batch completion.
    pub fn poll_at(&self) -> Option<Instant> {
        self.gpus.poll_at()
    }

    /// True when a ModelThread sent a batch not yet taken.
    pub fn has_input(&mut self) -> bool {
        self.from_models.iter_mut().any(|c| !c.is_empty())
    }
}

/// Open-loop load generator: [`Arrivals`] pushed into the owning
/// ModelThread's ingress ring at their arrival time.
pub struct LoadGen {
    arrivals: Arrivals,
    slos: Vec<Duration>,
    owner: Vec<u32>,
    rings: Vec<Producer<Request>>,
    /// An arrival that found its ring full (retried first).
    held: Option<Request>,
    next_id: u64,
    /// Requests generated.
    pub generated: u64,
    /// Generation lag (push time minus arrival time), ns.
    pub ingress_lag_ns: Histogram<u64>,
    record_lag: bool,
}

impl LoadGen {
    /// Arrivals of `workload` from `origin` until `origin + duration`.
    pub(crate) fn streams(
        models: &[ModelSpec],
        workload: &Workload,
        seed: u64,
        origin: Instant,
        duration: Duration,
        owner: Vec<u32>,
        rings: Vec<Producer<Request>>,
    ) -> Self {
        let arrivals = Arrivals::generated(models, workload, seed, duration).with_origin(origin);
        Self::new(models, arrivals, owner, rings, true)
    }

    pub(crate) fn trace(models: &[ModelSpec], trace: Vec<(Instant, u32)>, owner: Vec<u32>, rings: Vec<Producer<Request>>) -> Self {
        Self::new(models, Arrivals::trace(trace), owner, rings, false)
    }

    fn new(models: &[ModelSpec], arrivals: Arrivals, owner: Vec<u32>, rings: Vec<Producer<Request>>, record_lag: bool) -> Self {
        LoadGen {
            arrivals,
            slos: models.iter().map(|m| m.slo).collect(),
            owner,
            rings,
            held: None,
            next_id: 0,
            generated: 0,
            ingress_lag_ns: ns_hist(),
            record_lag,
        }
    }

    /// The next arrival time, if any remain.
    pub fn peek(&self) -> Option<Instant> {
        match &self.held {
            Some(r) => Some(r.arrival),
            None => self.arrivals.peek_time(),
        }
    }

    fn pop(&mut self) -> Option<Request> {
        let (t, m) = self.arrivals.next()?;
        let id = self.next_id;
        self.next_id += 1;
        let slo = self.slos.get(m as usize).copied().unwrap_or(Duration::ZERO);
        Some(Request::new(id, m, t, t + slo))
    }

    /// Pushes every arrival due by `now`, at most `max`. Returns how many.
    pub fn step(&mut self, now: Instant, max: usize) -> usize {
        let mut n = 0;
        while n < max {
            let req = match self.held.take() {
                Some(r) => r,
                None => {
                    if self.peek().is_none_or(|t| t > now) {
                        break;
                    }
                    match self.pop() {
                        Some(r) => r,
                        None => break,
                    }
                }
            };
            let ring = self.owner.get(req.model as usize).copied().unwrap_or(0) as usize;
            if self.rings[ring].try_push(req).is_err() {
                self.held = Some(req);
                break;
            }
            if self.record_lag {
                let _ = self.ingress_lag_ns.record(now.saturating_since(req.arrival).as_nanos().max(1));
            }
            self.generated += 1;
            n += 1;
        }
        n
    }
}
