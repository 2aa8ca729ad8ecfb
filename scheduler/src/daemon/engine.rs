//! Where a sub-cluster's scheduling cores run (see docs/decisions.md,
//! "The daemon on the pinned runtime"):
//! - [`Engine::Inline`]: one [`DeferredScheduler`] called on the plane's
//!   own thread. Deterministic; the harness (`symphony chaos`) and the
//!   plane's tests use it.
//! - [`Engine::Pinned`]: the runtime's ModelThreads and RankThread
//!   ([`PinnedScheduler`]); the plane pushes into their rings and takes
//!   their decisions back in [`Engine::collect`].
//!
//! Both take the same calls and leave their decisions in the caller's
//! [`Actions`], so the plane has one code path for either.

use dataplane::time::Instant;

use crate::deferred::{Admission, DeferredScheduler};
use crate::netdelay::NetworkDelay;
use crate::runtime::PinnedScheduler;
use crate::types::{Actions, GpuId, ModelId, Request, RequestId, Scheduler};

/// Which engine the daemon's sub-clusters use.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EngineKind {
    /// The cores on the I/O thread.
    Inline,
    /// The cores on the runtime's ModelThreads and RankThread.
    #[default]
    Pinned,
}

impl EngineKind {
    /// The engine for a host with `cores` CPUs: the pinned runtime when its
    /// threads (`model_threads` ModelThreads, a RankThread and the I/O
    /// thread) plus `busy_peers` other busy processes of the host each have
    /// a core; inline otherwise. Why: threads that share cores hand tasks
    /// through rings across context switches, and on 2 cores the pinned
    /// engine carries 3.5-6x less than inline (docs/journal/benchmarks-2026.md 10c.7).
    pub fn auto(cores: usize, model_threads: usize, busy_peers: usize) -> Self {
        if cores >= model_threads.max(1) + 2 + busy_peers {
            EngineKind::Pinned
        } else {
            EngineKind::Inline
        }
    }

    /// The option value.
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Inline => "inline",
            EngineKind::Pinned => "pinned",
        }
    }
}

/// One sub-cluster's scheduling cores.
pub enum Engine {
    /// On the caller's thread (both boxed: they differ much in size).
    Inline(Box<DeferredScheduler>),
    /// On the pinned runtime.
    Pinned(Box<PinnedScheduler>),
}

impl Engine {
    /// A request of local model `req.model`.
    pub fn on_request(&mut self, now: Instant, req: Request, out: &mut Actions) {
        match self {
            Engine::Inline(s) => s.on_request(now, req, out),
            Engine::Pinned(s) => s.on_request(now, req, out),
        }
    }

    /// Whether a request of local model `model` would be queued now (the
    /// inline core takes everything; its own admission decides).
    pub fn admits(&mut self, model: ModelId) -> bool {
        match self {
            Engine::Inline(_) => true,
            Engine::Pinned(s) => s.admits(model),
        }
    }

    /// The client gave request `id` up.
    pub fn cancel(&mut self, now: Instant, model: ModelId, id: RequestId, out: &mut Actions) {
        match self {
            Engine::Inline(s) => {
                s.cancel(now, model, id, out);
            }
            Engine::Pinned(s) => s.cancel(now, model, id, out),
        }
    }

    /// A GPU joined or left.
    pub fn set_gpu_online(&mut self, now: Instant, gpu: GpuId, online: bool, out: &mut Actions) {
        match self {
            Engine::Inline(s) => s.set_gpu_online(now, gpu, online, out),
            Engine::Pinned(s) => s.set_gpu_online(now, gpu, online, out),
        }
    }

    /// A GPU joined, busy until `free_at`.
    pub fn gpu_joined_busy(&mut self, now: Instant, gpu: GpuId, free_at: Instant, out: &mut Actions) {
        match self {
            Engine::Inline(s) => s.gpu_joined_busy(now, gpu, free_at, out),
            Engine::Pinned(s) => s.gpu_joined_busy(now, gpu, free_at, out),
        }
    }

    /// GPUs in matchmaking.
    pub fn online_gpus(&self) -> usize {
        match self {
            Engine::Inline(s) => s.online_gpus(),
            Engine::Pinned(s) => s.online_gpus(),
        }
    }

    /// The delay bound later decisions charge.
    pub fn set_delay(&mut self, delay: NetworkDelay) {
        match self {
            Engine::Inline(s) => s.set_delay(delay),
            Engine::Pinned(s) => s.set_delay(delay),
        }
    }

    /// Closed loop: a GPU's real free time.
    pub fn correct_gpu_free(&mut self, now: Instant, gpu: GpuId, free_at: Instant, out: &mut Actions) {
        match self {
            Engine::Inline(s) => s.correct_gpu_free(now, gpu, free_at, out),
            Engine::Pinned(s) => s.correct_gpu_free(now, gpu, free_at, out),
        }
    }

    /// Closed loop: a GPU's factor.
    pub fn set_gpu_factor(&mut self, gpu: GpuId, factor: f64) {
        match self {
            Engine::Inline(s) => s.set_gpu_factor(gpu, factor),
            Engine::Pinned(s) => s.set_gpu_factor(gpu, factor),
        }
    }

    /// Closed loop: a (model, GPU) factor.
    pub fn set_model_gpu_factor(&mut self, model: ModelId, gpu: GpuId, factor: Option<f64>) {
        match self {
            Engine::Inline(s) => s.set_model_gpu_factor(model, gpu, factor),
            Engine::Pinned(s) => s.set_model_gpu_factor(model, gpu, factor),
        }
    }

    /// A model's admission policy.
    pub fn set_admission(&mut self, model: ModelId, admission: Admission) {
        match self {
            Engine::Inline(s) => s.set_admission(model, admission),
            Engine::Pinned(s) => s.set_admission(model, admission),
        }
    }

    /// When [`on_wake`](Self::on_wake) is due (never for cores on threads
    /// of their own).
    pub fn poll_at(&self) -> Option<Instant> {
        match self {
            Engine::Inline(s) => s.poll_at(),
            Engine::Pinned(s) => s.poll_at(),
        }
    }

    /// Fires due timers.
    pub fn on_wake(&mut self, now: Instant, out: &mut Actions) {
        match self {
            Engine::Inline(s) => s.on_wake(now, out),
            Engine::Pinned(s) => s.on_wake(now, out),
        }
    }

    /// Decisions made on other threads since the last call, into `out`;
    /// returns how many messages were taken (always 0 inline).
    pub fn collect(&mut self, out: &mut Actions) -> usize {
        match self {
            Engine::Inline(_) => 0,
            Engine::Pinned(s) => s.collect(out),
        }
    }

    /// True when decisions wait for [`collect`](Self::collect).
    pub fn has_output(&self) -> bool {
        match self {
            Engine::Inline(_) => false,
            Engine::Pinned(s) => s.has_outcomes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::EngineKind;

    #[test]
    fn auto_is_inline_unless_every_thread_and_peer_has_a_core() {
        assert_eq!(EngineKind::auto(2, 1, 2), EngineKind::Inline);
        assert_eq!(EngineKind::auto(4, 1, 2), EngineKind::Inline);
        assert_eq!(EngineKind::auto(5, 1, 2), EngineKind::Pinned);
        assert_eq!(EngineKind::auto(3, 1, 0), EngineKind::Pinned);
        assert_eq!(EngineKind::auto(3, 2, 0), EngineKind::Inline);
    }
}
