//! What keeps plans off a backend that cannot run them now (the state is
//! membership's; this routes it to the cores and the outbox):
//! - a GPU whose batch is overdue (no report some time after its planned
//!   finish, `ledger::SUSPECT_AFTER`, or within the grace, when it is
//!   given up: a stalled GPU, an executor far behind) is held out of
//!   matchmaking until a report from it comes, or the batch grace more;
//! - a frontend that registers while backends serve waits for their data
//!   links to it: its tasks are held until every serving backend that
//!   answers join-gate requests said its link is up, so that no plan
//!   sends a backend a READ it cannot post (which it would fail after its
//!   fetch grace: a 500 "backend could not fetch the input").

use dataplane::time::{Duration, Instant};
use dataplane::wire::{self, DropReason, Task};

use super::{ControlPlane, GpuId, PeerId, DEFAULT_BATCH_GRACE};

/// Tasks held for frontends waiting for data links, at most: more are
/// refused as overloaded.
pub(super) const LINK_HELD_MAX: usize = 65_536;

/// How long a frontend's tasks wait for data links at most, from its first
/// task held (a request or its answer lost): past it they are planned as
/// before links were waited for. A backend that cannot reach the frontend
/// answers at its own handshake timeout.
pub(super) const LINK_WAIT_MAX: Duration = DEFAULT_BATCH_GRACE;

impl ControlPlane {
    // --- GPUs with a batch overdue ------------------------------------------

    /// Batch `batch` on backend `backend`'s GPU `local_gpu` is overdue at
    /// `now` (its GPU suspect, or the batch given up): the GPU leaves
    /// matchmaking until it reports again or the batch grace passes (see
    /// `Membership::hold_gpu`).
    pub(super) fn hold_gpu(&mut self, now: Instant, batch: u64, backend: u32, local_gpu: u32) {
        let until = now + self.ledger.batch_grace();
        if let Some((sc, g)) = self.members.hold_gpu(backend, local_gpu, batch, until) {
            self.subclusters[sc].sched.set_gpu_online(now, g, false, &mut self.actions);
            self.apply(now, sc);
        }
    }

    /// A report of `batch` on backend `backend`'s GPU `local_gpu` came: a
    /// GPU held comes back into matchmaking, free once the batches planned
    /// on it would end (`back_to_matchmaking`).
    pub(super) fn gpu_reported(&mut self, now: Instant, backend: u32, local_gpu: u32, batch: u64) {
        if let Some((sc, g)) = self.members.gpu_reported(backend, local_gpu, batch) {
            self.back_to_matchmaking(now, backend, sc, g);
        }
    }

    /// GPUs held whose bound ended by `now` come back into matchmaking.
    pub(super) fn end_gpu_holds(&mut self, now: Instant) {
        for (backend, sc, g) in self.members.end_holds(now) {
            self.back_to_matchmaking(now, backend, sc, g);
        }
    }

    /// A GPU held comes back, free once the batches planned on it before
    /// it was held would end (a plan must not overlap them).
    fn back_to_matchmaking(&mut self, now: Instant, backend: u32, sc: usize, g: GpuId) {
        let free_at = self.telemetry.planned_free(sc, g).map_or(now, |t| t.max(now));
        self.gpus_to_matchmaking(now, backend, sc, &[g], &[free_at]);
    }

    // --- frontends waiting for data links ----------------------------------

    /// Frontend `f` was just announced to backend `backend`: `f` waits for
    /// its link if it answers join-gate requests (asked now, or after the
    /// request it has not answered yet).
    pub(super) fn ask_link(&mut self, backend: u32, f: u32) {
        if self.members.wait_for_link(backend, f) {
            self.send_ready_request(backend);
        }
    }

    /// Asks backend `backend` for `Drain{Ready}` (the join-gate request),
    /// which it answers once its data links to the frontends announced
    /// before this request are up.
    pub(super) fn send_ready_request(&mut self, backend: u32) {
        let ready = wire::Drain::ready(backend);
        self.dispatch.outbox().push(PeerId::Backend(backend), |b| wire::encode(b, &ready));
    }

    /// Backend `backend` answered a join-gate request: asked again if a
    /// frontend was announced meanwhile; the frontends no longer waiting
    /// have their tasks planned.
    pub(super) fn link_answered(&mut self, now: Instant, backend: u32) {
        let (again, linked) = self.members.link_answer(backend);
        if again {
            self.send_ready_request(backend);
        }
        self.release_link_held(now, &linked);
    }

    /// Backend `backend` left or drains: no frontend waits for it.
    pub(super) fn link_gone(&mut self, now: Instant, backend: u32) {
        let linked = self.members.link_gone(backend);
        self.release_link_held(now, &linked);
    }

    /// Whether `task` of frontend `from` is held (its frontend waits for
    /// data links) or refused as overloaded (too many held).
    pub(super) fn hold_for_link(&mut self, now: Instant, from: u32, task: &Task) -> bool {
        if !self.members.link_pending(from, now) {
            return false;
        }
        if self.link_held.len() >= LINK_HELD_MAX {
            self.refuse_overloaded(now, from, task);
        } else {
            self.link_held.push((now, *task));
        }
        true
    }

    /// When a frontend's wait for data links ends at the latest.
    pub(super) fn link_wait_end(&self) -> Option<Instant> {
        self.members.link_wait_since().map(|t| t + LINK_WAIT_MAX)
    }

    /// Frontends that waited for data links past the bound at `now` have
    /// their tasks planned anyway.
    pub(super) fn end_link_waits(&mut self, now: Instant) {
        if let Some(before) = now.as_nanos().checked_sub(LINK_WAIT_MAX.as_nanos()) {
            let over = self.members.link_wait_over(Instant::from_nanos(before));
            self.release_link_held(now, &over);
        }
    }

    /// Frontend `f` left: its held tasks go (as its planned tasks' outcomes
    /// do: nowhere).
    pub(super) fn forget_link_wait(&mut self, f: u32) {
        self.members.forget_links(f);
        self.link_held.retain(|(_, t)| t.frontend_id != f);
    }

    /// Shutdown: the held tasks are dropped as the waiting ones are.
    pub(super) fn drop_link_held(&mut self) {
        for (_, t) in std::mem::take(&mut self.link_held) {
            self.send_dropped(t.task_id, t.frontend_id, DropReason::Shutdown);
        }
    }

    /// The held tasks of `frontends` are taken as if they came now, each
    /// with its budget less the time it was held, in arrival order.
    fn release_link_held(&mut self, now: Instant, frontends: &[u32]) {
        if frontends.is_empty() || self.link_held.is_empty() {
            return;
        }
        let mut held = std::mem::take(&mut self.link_held);
        held.retain(|(at, task)| {
            if !frontends.contains(&task.frontend_id) {
                return true;
            }
            let mut t = *task;
            t.budget_ns = t.budget_ns.saturating_sub(now.saturating_since(*at).as_nanos());
            self.take_task(now, t.frontend_id, &t);
            false
        });
        held.append(&mut self.link_held);
        self.link_held = held;
    }
}
