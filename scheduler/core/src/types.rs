//! Identifiers, requests, and the actions a scheduling core emits.

use dataplane::time::Instant;
use std::ops::Range;

/// Dense model index within one scheduler (0-based).
pub type ModelId = u32;
/// Dense GPU index within one scheduler (0-based); lower ids are preferred
/// when several GPUs are idle, so high ids stay idle at low load.
pub type GpuId = u32;
/// Globally unique request id.
pub type RequestId = u64;

/// One inference request as the scheduler sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// Unique id.
    pub id: RequestId,
    /// Target model.
    pub model: ModelId,
    /// When it reached the scheduler (local clock).
    pub arrival: Instant,
    /// When its result is due (local clock): arrival plus remaining budget
    /// (or its own timeout, when that is shorter: see `timed`).
    pub deadline: Instant,
    /// Priority level as Triton numbers them: 1 is the highest, 0 means the
    /// model's default level; a level past the model's lowest counts as
    /// its lowest ([`Admission`]).
    pub priority: u16,
    /// The deadline is the request's own timeout: a drop for running out of
    /// time is reported as [`DropReason::Timeout`].
    pub timed: bool,
}

impl Request {
    /// A request at the model's default priority, without a timeout of its
    /// own.
    pub const fn new(id: RequestId, model: ModelId, arrival: Instant, deadline: Instant) -> Self {
        Request { id, model, arrival, deadline, priority: 0, timed: false }
    }
}

/// Why a request was dropped without being executed: the cluster's one
/// list of reasons, owned by the wire because it crosses it. The cores use
/// `DeadlineUnmeetable` (not even a batch of one could finish before the
/// deadline), `EarlyDrop` (a sliding window gave it up to keep batches
/// efficient) and `UnknownModel`.
pub use dataplane::wire::DropReason;

/// A model's admission policy (Triton's `dynamic_batching` priority levels
/// and queue bound).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admission {
    /// Priority levels, 1 (highest) to `levels` (at least 1).
    pub levels: u16,
    /// The level of a request that names none (priority 0), in `1..=levels`.
    pub default_level: u16,
    /// Most requests waiting in the model's queue (every level together);
    /// 0: unbounded. A request over the bound is refused at once as
    /// [`DropReason::Overloaded`], unless a request of a lower level is
    /// waiting: then the latest of the lowest level goes instead.
    pub max_queue: u32,
}

impl Default for Admission {
    fn default() -> Self {
        Admission { levels: 1, default_level: 1, max_queue: 0 }
    }
}

impl Admission {
    /// Queue index (0 = highest level) of a request's priority.
    #[inline]
    pub fn level_index(&self, priority: u16) -> usize {
        let levels = self.levels.max(1);
        let level = if priority == 0 { self.default_level } else { priority };
        usize::from(level.clamp(1, levels) - 1)
    }
}

/// A batch the scheduler committed to a GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchPlan {
    /// Which GPU runs it.
    pub gpu: GpuId,
    /// Which model (every member is of this model).
    pub model: ModelId,
    /// When the GPU starts it (after inputs have arrived).
    pub exec_at: Instant,
    /// When the profile says it finishes: `exec_at + l(len)`.
    pub finish_at: Instant,
    /// When the policy meant to decide this batch (window open, GPU free,
    /// or the triggering message, whichever is latest); the decision time
    /// minus this is the dispatch lag.
    pub planned_at: Instant,
    /// Its members, as a range of [`Actions::members`].
    pub members: Range<usize>,
}

/// Output buffer of a scheduling core. The caller drains it after each call
/// and clears it (keeping capacity), so steady-state scheduling allocates
/// nothing.
#[derive(Clone, Debug, Default)]
pub struct Actions {
    /// Batches to send to GPUs.
    pub batches: Vec<BatchPlan>,
    /// Members of all batches in `batches`, batch by batch.
    pub members: Vec<Request>,
    /// Requests dropped, with the reason.
    pub drops: Vec<(Request, DropReason)>,
    /// GPUs whose running batch is abandoned (Shepherd-style preemption);
    /// the policy re-queues or drops the preempted requests itself.
    pub preemptions: Vec<GpuId>,
}

impl Actions {
    /// Forgets every action, keeping the storage.
    pub fn clear(&mut self) {
        self.batches.clear();
        self.members.clear();
        self.drops.clear();
        self.preemptions.clear();
    }

    /// True when there is nothing to act on.
    pub fn is_empty(&self) -> bool {
        self.batches.is_empty() && self.drops.is_empty() && self.preemptions.is_empty()
    }

    /// The members of `plan`.
    pub fn members_of(&self, plan: &BatchPlan) -> &[Request] {
        &self.members[plan.members.clone()]
    }

    /// Records a batch and its members.
    pub fn push_batch(&mut self, gpu: GpuId, model: ModelId, exec_at: Instant, finish_at: Instant, planned_at: Instant, members: impl IntoIterator<Item = Request>) {
        let start = self.members.len();
        self.members.extend(members);
        let end = self.members.len();
        self.batches.push(BatchPlan { gpu, model, exec_at, finish_at, planned_at, members: start..end });
    }
}

/// A sans-IO scheduling policy: it is told what happened and when, and
/// answers with actions and the next time it wants to be woken. It never
/// reads a clock, sleeps, spawns or does I/O, so the simulator and the live
/// runtime drive the very same code.
pub trait Scheduler {
    /// A request arrived.
    fn on_request(&mut self, now: Instant, req: Request, out: &mut Actions);
    /// A GPU finished the batch it was running (at `now`).
    fn on_batch_done(&mut self, now: Instant, gpu: GpuId, out: &mut Actions);
    /// The time returned by [`Scheduler::poll_at`] has come.
    fn on_wake(&mut self, now: Instant, out: &mut Actions);
    /// The earliest time at which the policy wants `on_wake`, if any.
    fn poll_at(&self) -> Option<Instant>;
    /// The policy's short name.
    fn name(&self) -> &'static str;
    /// Sets a model's priority levels and queue bound; returns whether the
    /// policy honours them (the baselines do not).
    fn set_admission(&mut self, _model: ModelId, _admission: Admission) -> bool {
        false
    }
    /// Control plane: GPU `gpu` joins matchmaking (free at `now`) or leaves
    /// it (`online` false: it gets no new plans; what it already holds
    /// runs to its end, and its `on_batch_done` still comes). Ids past the
    /// current count extend the cluster. Returns whether the policy
    /// changes its GPUs while it runs; one that does not (the default)
    /// ignores the call, and its cluster stays as built.
    fn set_gpu_membership(&mut self, _now: Instant, _gpu: GpuId, _online: bool, _out: &mut Actions) -> bool {
        false
    }
}
