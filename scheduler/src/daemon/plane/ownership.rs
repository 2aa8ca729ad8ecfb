//! Ownership: what this scheduler may plan, and when. The election epoch
//! stamped in every `Welcome` and plan; the fence that holds joining GPUs
//! out of matchmaking at the start of a term; the routing table's share
//! of the models this group owns (issue 19), and the tasks of models it
//! no longer owns, handed back to their frontends as moved, held until
//! no batch of a previous scheduler of this group can still hold them.

use dataplane::time::Instant;

use super::IdSet;
use crate::routes::RouteTable;
use crate::types::GpuId;

/// A GPU held out of matchmaking by the fence: (backend, sub-cluster,
/// sub-cluster GPU id, free at).
pub(super) type HeldGpu = (u32, usize, GpuId, Instant);

/// A task answered `moved` later: (task, frontend, attempt).
pub(super) type MovedTask = (u64, u32, u16);

/// The ownership part (see the module docs).
#[derive(Default)]
pub(super) struct Ownership {
    /// The election epoch stamped in every `Welcome` and plan (0: none).
    epoch: u32,
    /// While fenced, GPUs that join are held out of matchmaking (nothing
    /// is planned) until [`lift_fence`](Self::lift_fence).
    fenced: bool,
    /// GPUs joined while fenced.
    held_gpus: Vec<HeldGpu>,
    /// Tasks of a model this group does not own that came while fenced or
    /// before `moved_release_at`, answered `moved` once both have passed.
    /// Handing a task to another group is planning it elsewhere: the
    /// previous scheduler of this group may have it in a batch that a
    /// backend still holds (stopped only by the fence, a newer epoch
    /// reaching the backends) or still runs (its GPU reported busy at
    /// registration). A frontend resubmits such tasks here.
    moved_held: Vec<MovedTask>,
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

impl Ownership {
    /// The election epoch stamped in every `Welcome` and plan.
    pub(super) fn epoch(&self) -> u32 {
        self.epoch
    }

    pub(super) fn set_epoch(&mut self, epoch: u32) {
        self.epoch = epoch;
    }

    /// Holds every GPU that joins from now on out of matchmaking.
    pub(super) fn fence(&mut self) {
        self.fenced = true;
    }

    pub(super) fn fenced(&self) -> bool {
        self.fenced
    }

    /// The fence lifts: the GPUs it held, to put into matchmaking.
    pub(super) fn lift_fence(&mut self) -> Vec<HeldGpu> {
        self.fenced = false;
        std::mem::take(&mut self.held_gpus)
    }

    /// A GPU joined, busy until `free_at` with batches its backend holds:
    /// no task is handed away before then. Returns whether the fence
    /// holds it (then it is not to be put into matchmaking now).
    pub(super) fn gpu_joined(&mut self, gpu: HeldGpu) -> bool {
        self.moved_release_at = self.moved_release_at.max(gpu.3);
        if self.fenced {
            self.held_gpus.push(gpu);
        }
        self.fenced
    }

    /// A backend left: the fence no longer holds its GPUs.
    pub(super) fn backend_left(&mut self, backend: u32) {
        self.held_gpus.retain(|h| h.0 != backend);
    }

    /// Whether this group owns global model `model` at the newest routing
    /// revision applied (no table: every model).
    pub(super) fn owns(&self, model: u32) -> bool {
        self.owned.as_ref().is_none_or(|o| o.get(model as usize).copied().unwrap_or(false))
    }

    /// This plane serves a scheduler group: it owns none of its `models`
    /// until a routing table is applied.
    pub(super) fn await_routes(&mut self, models: usize) {
        if self.route_revision == 0 {
            self.owned = Some(vec![false; models]);
        }
    }

    /// The newest routing-table revision applied (0: none).
    pub(super) fn route_revision(&self) -> u64 {
        self.route_revision
    }

    /// Applies `table` for `group` over the models named `names`, if it is
    /// newer than the one applied: the models it just lost (by global id),
    /// or None if the table is not newer.
    pub(super) fn apply_routes(&mut self, table: &RouteTable, group: &str, names: &[String]) -> Option<Vec<bool>> {
        if table.revision <= self.route_revision {
            return None;
        }
        let next = table.owned_mask(group, names);
        let lost: Vec<bool> = (0..next.len()).map(|m| self.owns(m as u32) && !next[m]).collect();
        self.owned = Some(next);
        self.route_revision = table.revision;
        Some(lost)
    }

    /// A queued task is being handed back: its cancellation answers moved.
    pub(super) fn hand_over(&mut self, task: u64) {
        self.handing_over.insert(task);
    }

    /// Whether `task` was being handed back (and no longer is).
    pub(super) fn take_handing_over(&mut self, task: u64) -> bool {
        // Empty unless a routing change is handing tasks back: no hash
        // per drop otherwise.
        !self.handing_over.is_empty() && self.handing_over.remove(&task)
    }

    /// A plan of a model this group no longer owns is held back.
    pub(super) fn count_unowned_plan(&mut self) {
        self.unowned_plans_held += 1;
    }

    pub(super) fn unowned_plans_held(&self) -> u64 {
        self.unowned_plans_held
    }

    /// Whether a task answered `moved` at `now` must wait (a batch of a
    /// previous scheduler of this group may still hold it); if so it is
    /// held until [`release_moved`](Self::release_moved) gives it back.
    pub(super) fn hold_moved(&mut self, now: Instant, task: MovedTask) -> bool {
        let hold = self.fenced || now < self.moved_release_at;
        if hold {
            self.moved_held.push(task);
        }
        hold
    }

    /// The tasks held by [`hold_moved`](Self::hold_moved) that may be
    /// answered at `now` (the fence has lifted and the GPUs reported busy
    /// have freed).
    pub(super) fn release_moved(&mut self, now: Instant) -> Vec<MovedTask> {
        if self.fenced || now < self.moved_release_at {
            return Vec::new();
        }
        std::mem::take(&mut self.moved_held)
    }

    /// When held tasks may be answered (None: none held, or fenced).
    pub(super) fn poll_at(&self) -> Option<Instant> {
        (!self.moved_held.is_empty() && !self.fenced).then_some(self.moved_release_at)
    }
}
