//! The runtime as a service for a host thread (the scheduler daemon's I/O
//! thread): the host pushes requests and controls into rings, N
//! ModelThreads and one RankThread run the same cores as the simulator on
//! their own (optionally pinned) threads, and their decisions come back as
//! [`Outcome`]s that the host turns into [`Actions`].
//!
//! ```text
//!  host ──Request / ModelControl──▶ ModelThread i ──ToRank──▶ RankThread
//!  host ◀──────── Outcome ───────── ModelThread i ◀──Grant─── RankThread
//!  host ──────────────────────── RankControl ───────────────▶ RankThread
//! ```
//!
//! [`Drive::Lockstep`] runs the very same workers on the host's thread and
//! steps them to quiescence inside every call, in the order
//! [`crate::deferred::DeferredScheduler`] uses, so that tests can compare
//! the two decision by decision.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use dataplane::idle::{IdleStrategy, Idler, Waker};
use dataplane::spsc::{channel, Consumer, Producer};
use dataplane::time::{Instant, MonotonicClock};
use dataplane::waitset::Notifier;
use tracing::warn;

use super::workers::{ModelControl, ModelOp, ModelWorker, Outcome, RankControl, RankWorker, Sink};
use super::{idle_pass, RuntimeError};
use crate::deferred::{Admission, CoreConfig, ModelThreadCore, RankCore, ToRank};
use crate::netdelay::NetworkDelay;
use crate::types::{Actions, BatchPlan, DropReason, GpuId, ModelId, Request, RequestId};
use crate::zoo::ModelSpec;

/// Most slots of a ModelThread's ingress ring (the largest
/// [`PinnedConfig::ingress_bound`]): a burst beyond the ring is refused as
/// [`DropReason::Overloaded`], never buffered.
pub const INGRESS_SLOTS: usize = 1 << 16;
/// Default [`PinnedConfig::ingress_bound`]: at the daemon's measured
/// 100-400k tasks/s per ModelThread, 4096 waiting requests are 10-40 ms,
/// within one SLO; the full ring (65,536) was 0.2-0.6 s, so under overload
/// every request the thread reached was already late (issue 14, item 2).
pub const INGRESS_BOUND: usize = 4096;
/// The ring's occupancy (an atomic read of the consumer's position) is
/// refreshed every this many pushes, not per request.
const BOUND_CHECK_EVERY: u32 = 16;
/// Requests handed to a ModelThread before it is woken without waiting
/// for the host's next `collect`.
const KICK_EVERY: u32 = 64;
/// Slots of each outcome ring (ModelThread -> host).
const OUTCOME_SLOTS: usize = 1 << 16;
/// Slots of the control rings and of the rings between the cores.
const CONTROL_SLOTS: usize = 4096;

/// Shape of a [`PinnedScheduler`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PinnedConfig {
    /// ModelThreads (at most one per model; models are dealt round robin).
    pub model_threads: usize,
    /// CPU ids, in order, for ModelThread 0, 1, ..., then the RankThread
    /// (unless shared); threads past the list's end are not pinned.
    pub cores: Vec<usize>,
    /// How idle threads wait.
    pub idle: IdleStrategy,
    /// The RankThread runs on ModelThread 0's thread instead of its own:
    /// one thread hand-off less per decision (see docs/decisions.md).
    pub shared_rank: bool,
    /// Slots of each ModelThread's ingress ring, i.e. most requests waiting
    /// there: beyond, new requests are refused as [`DropReason::Overloaded`]
    /// (2 to [`INGRESS_SLOTS`]).
    pub ingress_bound: usize,
}

impl Default for PinnedConfig {
    fn default() -> Self {
        PinnedConfig { model_threads: 1, cores: Vec::new(), idle: IdleStrategy::GENTLE, shared_rank: false, ingress_bound: INGRESS_BOUND }
    }
}

/// How the workers run.
#[derive(Clone, Debug)]
pub enum Drive {
    /// On threads of their own against `clock`; `notify` is told whenever
    /// outcomes wait for the host.
    Threads {
        /// The host's clock (the workers read the same one).
        clock: MonotonicClock,
        /// Wakes the host.
        notify: Option<Notifier>,
    },
    /// On the host's thread, to quiescence inside every call.
    Lockstep,
}

/// One thread of the runtime and the CPU it was asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadPlacement {
    /// Thread name.
    pub thread: String,
    /// CPU id (None: not pinned).
    pub core: Option<usize>,
}

/// The workers, when the host steps them itself.
struct Stepped {
    models: Vec<ModelWorker>,
    rank: RankWorker,
}

/// Threads running the workers.
struct Running {
    stop: Arc<AtomicBool>,
    model_wakers: Vec<Waker>,
    rank_waker: Waker,
    handles: Vec<std::thread::JoinHandle<()>>,
}

enum Mode {
    Stepped(Box<Stepped>),
    Running(Running),
}

/// A plan whose members have not all been taken from its ring yet.
#[derive(Default)]
struct Partial {
    plan: Option<BatchPlan>,
    size: usize,
    members: Vec<Request>,
}

/// The scheduling cores of one sub-cluster on the runtime's workers.
pub struct PinnedScheduler {
    /// Local model id -> ModelThread.
    owner: Vec<u32>,
    ingress: Vec<Producer<Request>>,
    /// Requests pushed to each ModelThread (orders its controls).
    pushed: Vec<u64>,
    /// Requests pushed to each ModelThread since it was last woken.
    unkicked: Vec<u32>,
    /// Most requests waiting in one ingress ring (see [`PinnedConfig`]).
    ingress_bound: usize,
    /// Each ring's occupancy at its last check, plus the pushes since.
    queued: Vec<usize>,
    /// Pushes to each ring until its occupancy is read again.
    until_check: Vec<u32>,
    control: Vec<Producer<ModelControl>>,
    control_backlog: Vec<VecDeque<ModelControl>>,
    rank_control: Producer<RankControl>,
    rank_backlog: VecDeque<RankControl>,
    outcomes: Vec<Consumer<Outcome>>,
    partial: Vec<Partial>,
    online: Vec<bool>,
    /// GPUs set in `online` (the host reads it on every pass).
    online_count: usize,
    mode: Mode,
}

impl PinnedScheduler {
    /// Workers for `models` (local id = index) with no GPU yet, driven as
    /// `drive` says; also returns where each thread was asked to run.
    /// Threads are named `{name}-model-{i}` and `{name}-rank` (none when
    /// the RankThread shares ModelThread 0's thread).
    pub fn new(name: &str, models: &[ModelSpec], core: CoreConfig, cfg: &PinnedConfig, drive: Drive) -> Result<(Self, Vec<ThreadPlacement>), RuntimeError> {
        let threads = cfg.model_threads.clamp(1, models.len().max(1));
        let owner: Vec<u32> = (0..models.len()).map(|m| (m % threads) as u32).collect();
        let ingress_bound = cfg.ingress_bound.clamp(2, INGRESS_SLOTS);
        let (mut workers, mut ingress, mut control, mut outcomes, mut to_rank_rx, mut grants_tx) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for t in 0..threads {
            // The bound is the ring's capacity: the slots past it were
            // never live, only ~3 MiB of cache footprint (measured neutral,
            // docs/journal/benchmarks-2026.md 10c.5).
            let (ing_tx, ing_rx) = channel(ingress_bound);
            let (ctl_tx, ctl_rx) = channel(CONTROL_SLOTS);
            let (out_tx, out_rx) = channel(OUTCOME_SLOTS);
            let (tr_tx, tr_rx) = channel(CONTROL_SLOTS);
            let (gr_tx, gr_rx) = channel(CONTROL_SLOTS);
            let mine: Vec<(ModelId, ModelSpec)> =
                models.iter().enumerate().filter(|(m, _)| owner[*m] as usize == t).map(|(m, s)| (m as ModelId, s.clone())).collect();
            let core = ModelThreadCore::new(core, mine);
            workers.push(ModelWorker::new(core, vec![ing_rx], gr_rx, tr_tx, Sink::Outcomes(out_tx), Some(ctl_rx)));
            ingress.push(ing_tx);
            control.push(ctl_tx);
            outcomes.push(out_rx);
            to_rank_rx.push(tr_rx);
            grants_tx.push(gr_tx);
        }
        let (rank_tx, rank_rx) = channel(CONTROL_SLOTS);
        let rank = RankWorker::new(RankCore::new(models.len(), 0, core.delay).with_departures(core.departures), to_rank_rx, grants_tx, owner.clone()).with_control(rank_rx);
        let mut layout: Vec<ThreadPlacement> = (0..threads)
            .map(|i| ThreadPlacement { thread: format!("{name}-model-{i}"), core: cfg.cores.get(i).copied() })
            .collect();
        if !cfg.shared_rank {
            layout.push(ThreadPlacement { thread: format!("{name}-rank"), core: cfg.cores.get(threads).copied() });
        }
        let mode = match drive {
            Drive::Lockstep => Mode::Stepped(Box::new(Stepped { models: workers, rank })),
            Drive::Threads { clock, notify } => Mode::Running(spawn(workers, rank, &layout, cfg.idle, clock, notify)?),
        };
        let s = PinnedScheduler {
            owner,
            pushed: vec![0; threads],
            unkicked: vec![0; threads],
            ingress_bound,
            queued: vec![0; threads],
            until_check: vec![0; threads],
            ingress,
            control_backlog: (0..threads).map(|_| VecDeque::new()).collect(),
            control,
            rank_control: rank_tx,
            rank_backlog: VecDeque::new(),
            partial: (0..threads).map(|_| Partial::default()).collect(),
            outcomes,
            online: Vec::new(),
            online_count: 0,
            mode,
        };
        Ok((s, layout))
    }

    /// A request: queued at its ModelThread, or refused at once as
    /// [`DropReason::Overloaded`] (in `out`) when that thread's ingress
    /// ring holds its bound (or is full).
    pub fn on_request(&mut self, now: Instant, req: Request, out: &mut Actions) {
        let t = self.owner.get(req.model as usize).copied().unwrap_or(0) as usize;
        if !self.has_room(t) || self.ingress[t].try_push(req).is_err() {
            out.drops.push((req, DropReason::Overloaded));
            return;
        }
        self.queued[t] += 1;
        self.until_check[t] -= 1;
        self.pushed[t] += 1;
        // One wake-up per batch of requests, not per request: the thread
        // is woken at the next `collect` (the host's every pass), or now
        // once KICK_EVERY requests wait. A wake is a fence, and a futex
        // call when the thread sleeps, which it does as soon as its ring
        // is empty: per request, a drain of many links woke it many times.
        self.unkicked[t] += 1;
        if self.unkicked[t] >= KICK_EVERY {
            self.kick_model(t);
        }
        self.settle(now, out);
    }

    /// Whether a request of local model `model` would be taken now rather
    /// than refused as overloaded: lets the host refuse before it spends
    /// anything on the request (the daemon's id tables).
    pub fn admits(&mut self, model: ModelId) -> bool {
        let t = self.owner.get(model as usize).copied().unwrap_or(0) as usize;
        self.has_room(t)
    }

    /// Whether ModelThread `t`'s ring is below its bound.
    fn has_room(&mut self, t: usize) -> bool {
        if self.until_check[t] == 0 || self.queued[t] >= self.ingress_bound {
            // The estimate only grows between checks, so a refusal always
            // reads the ring again: refusing stops as soon as the thread
            // has taken requests.
            self.queued[t] = self.ingress_bound.saturating_sub(self.ingress[t].free_slots());
            self.until_check[t] = BOUND_CHECK_EVERY;
        }
        self.queued[t] < self.ingress_bound
    }

    /// Wakes the ModelThreads that were handed requests since their last
    /// wake-up (see [`on_request`](Self::on_request)).
    pub fn kick_pending(&mut self) {
        for t in 0..self.unkicked.len() {
            if self.unkicked[t] > 0 {
                self.kick_model(t);
            }
        }
    }

    /// The client gave request `id` of `model` up (answered, if it still
    /// waited, by a [`DropReason::Cancelled`] outcome).
    pub fn cancel(&mut self, now: Instant, model: ModelId, id: RequestId, out: &mut Actions) {
        self.send_to_model(model, ModelOp::Cancel { model, id });
        self.settle(now, out);
    }

    /// GPU `gpu` joined (free now) or left the cluster.
    pub fn set_gpu_online(&mut self, now: Instant, gpu: GpuId, online: bool, out: &mut Actions) {
        self.membership(now, gpu, online, now, out);
    }

    /// GPU `gpu` joined, busy until `free_at` (batches its backend already
    /// holds).
    pub fn gpu_joined_busy(&mut self, now: Instant, gpu: GpuId, free_at: Instant, out: &mut Actions) {
        self.membership(now, gpu, true, free_at, out);
    }

    fn membership(&mut self, now: Instant, gpu: GpuId, online: bool, free_at: Instant, out: &mut Actions) {
        let g = gpu as usize;
        if self.online.len() <= g {
            self.online.resize(g + 1, false);
        }
        if self.online[g] != online {
            self.online[g] = online;
            if online {
                self.online_count += 1;
            } else {
                self.online_count -= 1;
            }
        }
        self.send_to_rank(RankControl::Message(ToRank::GpuMembership { gpu, online, free_at }));
        self.settle(now, out);
    }

    /// GPUs currently in the cluster.
    pub fn online_gpus(&self) -> usize {
        self.online_count
    }

    /// The network delay bound later decisions charge (every core).
    pub fn set_delay(&mut self, delay: NetworkDelay) {
        for t in 0..self.control.len() {
            self.send_to_thread(t, ModelOp::Delay(delay));
        }
        self.send_to_rank(RankControl::Delay(delay));
        self.settle_quietly();
    }

    /// Closed loop: GPU `gpu` is really free at `free_at`.
    pub fn correct_gpu_free(&mut self, now: Instant, gpu: GpuId, free_at: Instant, out: &mut Actions) {
        self.send_to_rank(RankControl::Message(ToRank::GpuCorrect { gpu, free_at }));
        self.settle(now, out);
    }

    /// Closed loop: later batches on `gpu` take `factor` times their profile.
    pub fn set_gpu_factor(&mut self, gpu: GpuId, factor: f64) {
        for t in 0..self.control.len() {
            self.send_to_thread(t, ModelOp::GpuFactor { gpu, factor });
        }
        self.settle_quietly();
    }

    /// Closed loop: later batches of `model` on `gpu` take `factor` times
    /// their profile (`None`: the GPU's factor).
    pub fn set_model_gpu_factor(&mut self, model: ModelId, gpu: GpuId, factor: Option<f64>) {
        self.send_to_model(model, ModelOp::ModelGpuFactor { model, gpu, factor });
        self.settle_quietly();
    }

    /// A model's priority levels, default level and queue bound.
    pub fn set_admission(&mut self, model: ModelId, admission: Admission) {
        self.send_to_model(model, ModelOp::Admission { model, admission });
        self.settle_quietly();
    }

    /// When the host must call [`on_wake`](Self::on_wake): the workers'
    /// timers when stepped by the host; never when they run on threads
    /// (they keep their own time).
    pub fn poll_at(&self) -> Option<Instant> {
        match &self.mode {
            Mode::Stepped(w) => w.models.iter().filter_map(ModelWorker::poll_at).chain(w.rank.poll_at()).min(),
            Mode::Running(_) => None,
        }
    }

    /// Stepped workers: fires the timers due at `now` in the simulator's
    /// order (model timers and what they cause, then the GPU timer and
    /// what it causes). Threads: nothing.
    pub fn on_wake(&mut self, now: Instant, out: &mut Actions) {
        let Mode::Stepped(w) = &mut self.mode else { return };
        for m in &mut w.models {
            m.wake(now);
        }
        quiesce(now, w);
        w.rank.wake(now);
        quiesce(now, w);
        self.collect(out);
    }

    /// True when a ModelThread's outcomes wait for [`collect`](Self::collect)
    /// (the host's recheck before it sleeps).
    pub fn has_outcomes(&self) -> bool {
        // A thread not woken yet is work for the host's next `collect`.
        self.outcomes.iter().any(|c| !c.is_empty()) || self.unkicked.iter().any(|&n| n > 0)
    }

    /// Moves every complete decision the workers made into `out` and
    /// retries controls that found a full ring. Returns the outcomes taken.
    pub fn collect(&mut self, out: &mut Actions) -> usize {
        self.kick_pending();
        self.retry_controls();
        let mut taken = 0;
        for (t, (ring, partial)) in self.outcomes.iter_mut().zip(&mut self.partial).enumerate() {
            let n = ring.pop_batch(usize::MAX, |o| match o {
                Outcome::Dropped(r, why) => out.drops.push((r, why)),
                Outcome::Planned { gpu, model, exec_at, finish_at, planned_at, size } => {
                    partial.plan = Some(BatchPlan { gpu, model, exec_at, finish_at, planned_at, members: 0..0 });
                    partial.size = size as usize;
                    partial.members.clear();
                    complete(partial, out);
                }
                Outcome::Member(r) => {
                    partial.members.push(r);
                    complete(partial, out);
                }
            });
            if n > 0 {
                if let Mode::Running(r) = &self.mode {
                    // The ModelThread may have stopped at a full ring.
                    r.model_wakers[t].wake();
                }
            }
            taken += n;
        }
        taken
    }

    fn send_to_model(&mut self, model: ModelId, op: ModelOp) {
        let t = self.owner.get(model as usize).copied().unwrap_or(0) as usize;
        self.send_to_thread(t, op);
    }

    /// Queues `op` for ModelThread `t`, behind its earlier controls.
    fn send_to_thread(&mut self, t: usize, op: ModelOp) {
        let c = ModelControl { after: self.pushed[t], op };
        if !self.control_backlog[t].is_empty() || self.control[t].try_push(c).is_err() {
            self.control_backlog[t].push_back(c);
        }
        self.kick_model(t);
    }

    fn send_to_rank(&mut self, c: RankControl) {
        if !self.rank_backlog.is_empty() || self.rank_control.try_push(c).is_err() {
            self.rank_backlog.push_back(c);
        }
        if let Mode::Running(r) = &self.mode {
            r.rank_waker.wake();
        }
    }

    fn retry_controls(&mut self) {
        for (t, q) in self.control_backlog.iter_mut().enumerate() {
            while let Some(&c) = q.front() {
                if self.control[t].try_push(c).is_err() {
                    break;
                }
                q.pop_front();
            }
        }
        while let Some(&c) = self.rank_backlog.front() {
            if self.rank_control.try_push(c).is_err() {
                break;
            }
            self.rank_backlog.pop_front();
        }
    }

    fn kick_model(&mut self, t: usize) {
        self.unkicked[t] = 0;
        if let Mode::Running(r) = &self.mode {
            r.model_wakers[t].wake();
        }
    }

    /// Stepped workers: runs everything the last push caused and collects
    /// the decisions into `out`. Threads: nothing (the host collects).
    fn settle(&mut self, now: Instant, out: &mut Actions) {
        let Mode::Stepped(w) = &mut self.mode else { return };
        for m in &mut w.models {
            m.drain_ingress(0, now, usize::MAX);
            m.drain_control(now);
        }
        w.rank.drain_messages(now);
        quiesce(now, w);
        self.collect(out);
    }

    /// Stepped workers: applies a control that decides nothing by itself.
    fn settle_quietly(&mut self) {
        if let Mode::Stepped(w) = &mut self.mode {
            // No clock is read: a factor, delay or admission change only
            // takes effect in later decisions.
            for m in &mut w.models {
                m.drain_control(Instant::ZERO);
            }
            w.rank.drain_messages(Instant::ZERO);
        }
    }
}

/// Moves a plan whose members are all in into `out`.
fn complete(p: &mut Partial, out: &mut Actions) {
    if p.members.len() < p.size {
        return;
    }
    if let Some(mut plan) = p.plan.take() {
        let at = out.members.len();
        out.members.extend_from_slice(&p.members);
        plan.members = at..at + p.size;
        out.batches.push(plan);
    }
    p.members.clear();
    p.size = 0;
}

/// Delivers messages between the cores until both are quiet.
fn quiesce(now: Instant, w: &mut Stepped) {
    loop {
        let mut work = w.rank.drain_messages(now);
        for m in &mut w.models {
            work += m.drain_grants(now);
        }
        if work == 0 {
            break;
        }
    }
}

impl Drop for PinnedScheduler {
    fn drop(&mut self) {
        if let Mode::Running(r) = &mut self.mode {
            r.stop.store(true, Ordering::Release);
            for w in r.model_wakers.iter().chain(std::iter::once(&r.rank_waker)) {
                w.wake();
            }
            for h in r.handles.drain(..) {
                let _ = h.join();
            }
        }
    }
}

/// Pins the calling thread to CPU `core`.
fn pin_to(core: usize) -> bool {
    core_affinity::set_for_current(core_affinity::CoreId { id: core })
}

/// Starts the ModelThreads and the RankThread (on ModelThread 0's thread
/// when `layout` has no place of its own for it).
fn spawn(
    models: Vec<ModelWorker>,
    rank: RankWorker,
    layout: &[ThreadPlacement],
    idle: IdleStrategy,
    clock: MonotonicClock,
    notify: Option<Notifier>,
) -> Result<Running, RuntimeError> {
    let stop = Arc::new(AtomicBool::new(false));
    let n = models.len();
    let shared = layout.len() == n;
    let idlers: Vec<Idler> = (0..n + usize::from(!shared)).map(|_| Idler::new(idle)).collect();
    let model_wakers: Vec<Waker> = idlers[..n].iter().map(Idler::waker).collect();
    let rank_waker = idlers[if shared { 0 } else { n }].waker();
    let mut rank = Some(rank);
    let mut jobs: Vec<(Option<ModelWorker>, Option<RankWorker>)> =
        models.into_iter().enumerate().map(|(i, m)| (Some(m), if shared && i == 0 { rank.take() } else { None })).collect();
    if !shared {
        jobs.push((None, rank.take()));
    }
    let mut handles = Vec::new();
    for (i, ((mut model, mut rank), mut idler)) in jobs.into_iter().zip(idlers).enumerate() {
        let (stop, rank_waker, notify, wakers) = (Arc::clone(&stop), rank_waker.clone(), notify.clone(), model_wakers.clone());
        let p = layout[i].clone();
        let h = std::thread::Builder::new()
            .name(p.thread.clone())
            .spawn(move || {
                if let Some(c) = p.core.filter(|&c| !pin_to(c)) {
                    warn!(thread = %p.thread, core = c, "cannot pin the thread to its core; it runs unpinned");
                }
                while !stop.load(Ordering::Acquire) {
                    let now = clock.now();
                    let mut work = 0;
                    if let Some(r) = &mut rank {
                        let k = r.step(now);
                        if k > 0 {
                            wakers.iter().for_each(Waker::wake);
                        }
                        work += k;
                    }
                    if let Some(m) = &mut model {
                        let sent = m.outcomes_sent;
                        let k = m.step(now);
                        if k > 0 {
                            rank_waker.wake();
                        }
                        if m.outcomes_sent != sent {
                            if let Some(n) = &notify {
                                n.notify();
                            }
                        }
                        work += k;
                    }
                    if work > 0 {
                        idler.reset();
                    } else {
                        let next = [model.as_ref().and_then(ModelWorker::poll_at), rank.as_ref().and_then(RankWorker::poll_at)].into_iter().flatten().min();
                        idle_pass(&mut idler, idle, now, next, || {
                            model.as_mut().is_some_and(ModelWorker::has_input) || rank.as_mut().is_some_and(RankWorker::has_input)
                        });
                    }
                }
            })
            .map_err(|source| RuntimeError::Spawn { index: i, source })?;
        handles.push(h);
    }
    Ok(Running { stop, model_wakers, rank_waker, handles })
}
