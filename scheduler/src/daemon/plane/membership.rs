//! Membership: the frontends and backends registered with the plane, the
//! checks a registration must pass, and where each backend's GPUs sit
//! (its sub-cluster and their sub-cluster GPU ids), and which backends are
//! draining (out of matchmaking, finishing what was planned to them).
//! Liveness itself (heartbeats, silence) is the node's; it tells the plane
//! who left.

use std::collections::HashMap;

use dataplane::wire::{self, MAX_BACKENDS, MAX_FRONTENDS};

use super::IdHasher;
use crate::types::GpuId;

/// Why a registration was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The id is out of range.
    BadId(u32),
    /// A live peer already has this id.
    Duplicate(u32),
    /// A model id the scheduler does not know.
    UnknownModel(u32),
    /// The backend's models cover no sub-cluster.
    NoSubCluster,
    /// A backend with no GPUs.
    NoGpus,
    /// A busy report names a GPU the backend does not have.
    BadGpu(u32),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::BadId(id) => write!(f, "id {id} out of range"),
            Refusal::Duplicate(id) => write!(f, "id {id} is already registered"),
            Refusal::UnknownModel(m) => write!(f, "unknown model id {m}"),
            Refusal::NoSubCluster => write!(f, "its models cover no sub-cluster"),
            Refusal::NoGpus => write!(f, "no GPUs"),
            Refusal::BadGpu(g) => write!(f, "busy report for GPU {g}, which it does not have"),
        }
    }
}

/// A registered backend.
pub(super) struct BackendState {
    pub(super) subcluster: usize,
    /// Sub-cluster GPU id of each local GPU.
    pub(super) gpus: Vec<GpuId>,
    /// Where it stands in a drain (see [`Drain`]).
    pub(super) drain: Drain,
}

/// A backend's drain: the scheduler's side of a graceful leave.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum Drain {
    /// Serving: its GPUs are in matchmaking.
    #[default]
    No,
    /// It said it drains: its GPUs are out of matchmaking, batches already
    /// planned to it still run and are reported.
    Draining,
    /// Nothing planned to it is left in flight, and it was told it may go.
    Released,
}

/// The registered peers (see the module docs).
#[derive(Default)]
pub(super) struct Membership {
    // Foldhash: every drop, failed-back task and forwarded completion
    // looks its frontend up (SipHash was ~20 ns of each refusal under
    // overload). Iterations over them are sorted.
    /// Each frontend's data endpoint.
    frontends: HashMap<u32, String, IdHasher>,
    backends: HashMap<u32, BackendState, IdHasher>,
    /// Backends draining or released (so that the per-batch check whether
    /// a drain may end costs nothing while none drains).
    draining: usize,
}

impl Membership {
    /// Live frontends and backends.
    pub(super) fn peers(&self) -> (usize, usize) {
        (self.frontends.len(), self.backends.len())
    }

    /// Whether frontend `id` is registered (its answers can be delivered).
    pub(super) fn frontend_live(&self, id: u32) -> bool {
        self.frontends.contains_key(&id)
    }

    /// Whether frontend `id` may register.
    pub(super) fn check_frontend(&self, id: u32) -> Result<(), Refusal> {
        if id >= MAX_FRONTENDS {
            return Err(Refusal::BadId(id));
        }
        if self.frontends.contains_key(&id) {
            return Err(Refusal::Duplicate(id));
        }
        Ok(())
    }

    /// Frontend `id` registered with its data endpoint.
    pub(super) fn add_frontend(&mut self, id: u32, endpoint: &str) {
        self.frontends.insert(id, endpoint.to_string());
    }

    /// Frontend `id` left; whether it was registered.
    pub(super) fn remove_frontend(&mut self, id: u32) -> bool {
        self.frontends.remove(&id).is_some()
    }

    /// Every frontend with its endpoint, in id order.
    pub(super) fn frontends_sorted(&self) -> Vec<(u32, String)> {
        let mut fronts: Vec<(u32, String)> = self.frontends.iter().map(|(&f, ep)| (f, ep.clone())).collect();
        fronts.sort_unstable();
        fronts
    }

    /// Every backend id, in order.
    pub(super) fn backends_sorted(&self) -> Vec<u32> {
        let mut backends: Vec<u32> = self.backends.keys().copied().collect();
        backends.sort_unstable();
        backends
    }

    /// Whether backend `id` with `gpus` GPUs holding `models` (each below
    /// `model_count`) and the busy report `busy` may register (the
    /// sub-cluster it joins is the plane's choice).
    pub(super) fn check_backend(&self, id: u32, gpus: u32, models: &[u32], busy: &[wire::GpuBusy], model_count: usize) -> Result<(), Refusal> {
        if id >= MAX_BACKENDS {
            return Err(Refusal::BadId(id));
        }
        if self.backends.contains_key(&id) {
            return Err(Refusal::Duplicate(id));
        }
        if gpus == 0 {
            return Err(Refusal::NoGpus);
        }
        if let Some(&m) = models.iter().find(|&&m| m as usize >= model_count) {
            return Err(Refusal::UnknownModel(m));
        }
        if let Some(b) = busy.iter().find(|b| b.gpu_id >= gpus) {
            return Err(Refusal::BadGpu(b.gpu_id));
        }
        Ok(())
    }

    /// Backend `id` registered into sub-cluster `subcluster`, its GPUs
    /// numbered `gpus` there.
    pub(super) fn add_backend(&mut self, id: u32, subcluster: usize, gpus: Vec<GpuId>) {
        self.backends.insert(id, BackendState { subcluster, gpus, drain: Drain::No });
    }

    /// Backend `id` left: its state, if it was registered.
    pub(super) fn remove_backend(&mut self, id: u32) -> Option<BackendState> {
        let b = self.backends.remove(&id)?;
        if b.drain != Drain::No {
            self.draining -= 1;
        }
        Some(b)
    }

    /// Backend `id` starts draining: its sub-cluster and GPUs, which leave
    /// matchmaking now; None if it is not registered or drains already.
    pub(super) fn start_drain(&mut self, id: u32) -> Option<(usize, Vec<GpuId>)> {
        let b = self.backends.get_mut(&id).filter(|b| b.drain == Drain::No)?;
        b.drain = Drain::Draining;
        self.draining += 1;
        Some((b.subcluster, b.gpus.clone()))
    }

    /// Backends draining or released.
    pub(super) fn draining(&self) -> usize {
        self.draining
    }

    /// Where backend `id` stands in a drain (`No` if unknown).
    pub(super) fn drain_of(&self, id: u32) -> Drain {
        if self.draining == 0 {
            return Drain::No;
        }
        self.backends.get(&id).map_or(Drain::No, |b| b.drain)
    }

    /// Backend `id`, draining, was told it may go.
    pub(super) fn mark_released(&mut self, id: u32) {
        if let Some(b) = self.backends.get_mut(&id).filter(|b| b.drain != Drain::No) {
            b.drain = Drain::Released;
        }
    }

    /// Where a live backend's GPU is: (sub-cluster, sub-cluster GPU id).
    pub(super) fn locate_gpu(&self, backend: u32, local_gpu: u32) -> Option<(usize, GpuId)> {
        let b = self.backends.get(&backend)?;
        Some((b.subcluster, *b.gpus.get(local_gpu as usize)?))
    }

    /// Every live backend's GPUs as (backend, GPU index, sub-cluster,
    /// sub-cluster GPU id), in no order.
    pub(super) fn gpus(&self) -> impl Iterator<Item = (u32, u32, usize, GpuId)> + '_ {
        self.backends
            .iter()
            .flat_map(|(&b, st)| st.gpus.iter().enumerate().map(move |(i, &g)| (b, i as u32, st.subcluster, g)))
    }
}
