//! The baseline policies Symphony is compared against, modelled as the
//! Symphony paper (section 2) and the systems' own papers describe them:
//!
//! - [`clockwork`]: a centralized, work-conserving scheduler that keeps
//!   every GPU's action queue filled a few milliseconds ahead and runs the
//!   candidate with the earliest latest-executable moment.
//! - [`shepherd`]: Shepherd's online scheduler (Flex): one candidate per
//!   model, the largest first, lazy dropping, and preemption of a running
//!   batch by a candidate at least 3x its size.
//! - [`nexus`]: epoch-based squishy bin packing of models onto GPUs, frontend
//!   routing by weighted round robin, per-GPU round-robin duty cycles and
//!   early drop.
//! - [`eager`]: the simplest work-conserving earliest-deadline-first policy,
//!   and TF-Serving-style timeout batching on the same loop
//!   ([`crate::goodput::best_timeouts`] searches its `k` per model).
//! - [`latest_start`]: the eager family's strong variant (the largest
//!   feasible batch of the model whose latest start is the earliest) and
//!   Clockwork as the Symphony paper describes it.
//! - [`algorithm1`]: not a baseline but deferred's own family: the Symphony
//!   paper's Algorithm 1 as written, with Appendix D's network delay, the
//!   reference [`crate::deferred`]'s departures are measured against.
//!
//! All are sans-IO [`Scheduler`](crate::types::Scheduler)s, like the
//! deferred cores: they never read a clock, and they check every batch
//! against the profile before dispatching it, dropping what cannot make it.

pub mod algorithm1;
pub mod clockwork;
pub mod eager;
pub mod latest_start;
pub mod nexus;
pub mod shepherd;

pub use algorithm1::Algorithm1Scheduler;
pub use clockwork::{ClockworkConfig, ClockworkScheduler};
pub use eager::EagerScheduler;
pub use latest_start::{DropMode, LatestStartScheduler, Rank};
pub use nexus::{NexusConfig, NexusScheduler};
pub use shepherd::ShepherdScheduler;

use crate::types::{GpuId, Request};
use dataplane::heap::IndexedHeap;
use dataplane::time::Instant;
use std::collections::VecDeque;

/// Inserts `req` keeping `queue` sorted by deadline (ties in arrival order).
/// With one SLO per model this is a push to the back; re-queued requests
/// (after a preemption or a re-plan) go back to their place.
pub(crate) fn insert_by_deadline(queue: &mut VecDeque<Request>, req: Request) {
    let pos = queue.partition_point(|r| r.deadline <= req.deadline);
    queue.insert(pos, req);
}

/// Which GPUs are free, and when the busy ones free up, for the centralized
/// baselines that track GPU time themselves (emulated execution takes
/// exactly the profiled time, so the plan is the truth).
pub(crate) struct GpuPool {
    /// GPUs already free, lowest id first so high ids stay idle at low load.
    idle: IndexedHeap<GpuId>,
    /// The others, by the time their last planned batch ends.
    busy: IndexedHeap<Instant>,
}

impl GpuPool {
    /// `gpus` GPUs, all free.
    pub fn new(gpus: u32) -> Self {
        let mut idle = IndexedHeap::with_ids(gpus as usize);
        for g in 0..gpus {
            idle.set(g, g);
        }
        GpuPool { idle, busy: IndexedHeap::with_ids(gpus as usize) }
    }

    /// The GPU that is free first and from when (`now` if already free).
    pub fn earliest(&mut self, now: Instant) -> Option<(GpuId, Instant)> {
        while let Some((t, g)) = self.busy.peek() {
            if t > now {
                break;
            }
            self.busy.pop();
            self.idle.set(g, g);
        }
        match self.idle.peek() {
            Some((g, _)) => Some((g, now)),
            None => self.busy.peek().map(|(t, g)| (g, t)),
        }
    }

    /// `gpu` has work planned until `until`.
    pub fn occupy(&mut self, gpu: GpuId, until: Instant) {
        self.idle.remove(gpu);
        self.busy.set(gpu, until);
    }

    /// `gpu` is free again now (its batch was preempted).
    pub fn release(&mut self, gpu: GpuId) {
        self.busy.remove(gpu);
        self.idle.set(gpu, gpu);
    }

    /// When the first busy GPU frees up.
    pub fn next_free(&self) -> Option<Instant> {
        self.busy.peek().map(|(t, _)| t)
    }
}
