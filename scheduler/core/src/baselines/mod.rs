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

/// The vocabulary the baseline policies are written in: each imports it
/// whole rather than repeating the same list.
mod prelude {
    pub(super) use super::{insert_by_deadline, GpuPool};
    pub(super) use crate::netdelay::NetworkDelay;
    pub(super) use crate::profile::LatencyProfile;
    pub(super) use crate::types::{Actions, DropReason, GpuId, ModelId, Request, Scheduler};
    pub(super) use crate::zoo::ModelSpec;
    pub(super) use dataplane::heap::IndexedHeap;
    pub(super) use dataplane::time::{Duration, Instant};
    pub(super) use std::collections::VecDeque;
}

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
    /// GPUs out of matchmaking (neither idle nor busy here), each with the
    /// time its last planned batch ends.
    offline: Vec<Option<Instant>>,
}

impl GpuPool {
    /// `gpus` GPUs, all free.
    pub fn new(gpus: u32) -> Self {
        let mut idle = IndexedHeap::with_ids(gpus as usize);
        for g in 0..gpus {
            idle.set(g, g);
        }
        GpuPool { idle, busy: IndexedHeap::with_ids(gpus as usize), offline: Vec::new() }
    }

    /// Puts `gpu` into matchmaking or takes it out (the policies'
    /// [`Scheduler::set_gpu_membership`](crate::types::Scheduler::set_gpu_membership)).
    /// A GPU taken out is never returned by [`GpuPool::earliest`] again
    /// until it is put back; what it already holds runs to its end, and a
    /// GPU put back before then is busy until that end. An id the pool
    /// never had joins it.
    pub fn set_online(&mut self, now: Instant, gpu: GpuId, online: bool) {
        let g = gpu as usize;
        if online {
            match self.offline.get_mut(g).and_then(Option::take) {
                Some(until) if until > now => self.busy.set(gpu, until),
                Some(_) => self.idle.set(gpu, gpu),
                None if !self.idle.contains(gpu) && !self.busy.contains(gpu) => self.idle.set(gpu, gpu),
                None => {}
            }
            return;
        }
        if self.offline.get(g).is_some_and(Option::is_some) {
            return;
        }
        let until = self.busy.remove(gpu).or_else(|| self.idle.remove(gpu).map(|_| Instant::ZERO));
        if self.offline.len() <= g {
            self.offline.resize(g + 1, None);
        }
        self.offline[g] = Some(until.unwrap_or(Instant::ZERO));
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
        if let Some(Some(until)) = self.offline.get_mut(gpu as usize) {
            *until = Instant::ZERO;
            return;
        }
        self.busy.remove(gpu);
        self.idle.set(gpu, gpu);
    }

    /// When the first busy GPU frees up.
    pub fn next_free(&self) -> Option<Instant> {
        self.busy.peek().map(|(t, _)| t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane::time::Duration;

    fn at(ms: u64) -> Instant {
        Instant::ZERO + Duration::from_millis(ms)
    }

    #[test]
    fn a_gpu_out_of_matchmaking_is_never_offered_until_it_is_back() {
        let mut pool = GpuPool::new(3);
        pool.occupy(0, at(10));
        // GPU 1 (idle) and GPU 0 (busy until 10) leave.
        pool.set_online(at(1), 1, false);
        pool.set_online(at(1), 0, false);
        assert_eq!(pool.earliest(at(1)), Some((2, at(1))));
        pool.occupy(2, at(20));
        // Only GPU 2 is left, busy until 20: GPU 0 freeing at 10 is not offered.
        assert_eq!(pool.earliest(at(11)), Some((2, at(20))));
        assert_eq!(pool.next_free(), Some(at(20)));
        // Back before its batch ends, GPU 0 is busy until then.
        pool.set_online(at(5), 0, true);
        assert_eq!(pool.earliest(at(5)), Some((0, at(10))));
        assert_eq!(pool.earliest(at(10)), Some((0, at(10))));
        // GPU 1 back: free at once; a new id joins.
        pool.set_online(at(12), 1, true);
        pool.set_online(at(12), 7, true);
        pool.occupy(0, at(30));
        assert_eq!(pool.earliest(at(12)), Some((1, at(12))));
        pool.occupy(1, at(35));
        assert_eq!(pool.earliest(at(12)), Some((7, at(12))));
        // Saying the same twice changes nothing.
        pool.set_online(at(12), 7, true);
        pool.set_online(at(13), 2, false);
        pool.set_online(at(13), 2, false);
        pool.occupy(7, at(40));
        assert_eq!(pool.earliest(at(13)), Some((0, at(30))));
    }

    #[test]
    fn every_gpu_out_leaves_nothing_to_offer() {
        let mut pool = GpuPool::new(2);
        pool.set_online(at(0), 0, false);
        pool.set_online(at(0), 1, false);
        assert_eq!(pool.earliest(at(0)), None);
        assert_eq!(pool.next_free(), None);
    }
}
