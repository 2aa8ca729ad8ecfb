//! Membership: the frontends and backends registered with the plane, the
//! checks a registration must pass, and where each backend's GPUs sit
//! (its sub-cluster and their sub-cluster GPU ids), which backends are
//! still behind the join gate (registered, their data links to the
//! frontends not yet up: their GPUs wait out of matchmaking) and which
//! are draining (out of matchmaking, finishing what was planned to them),
//! which GPUs are held out of matchmaking because a batch on them is
//! overdue (a stalled GPU: back at its next report, or at a bound), and
//! which frontends wait for the backends' data links to them (their tasks
//! are held until every serving backend reported its link up).
//! Liveness itself (heartbeats, silence) is the node's; it tells the plane
//! who left.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use dataplane::time::Instant;
use node_shell::metrics::{Computed, Counter, Gauge, Histogram, MetricsRegistry};
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
    /// Its planned busy time, ns (what the autoscaler picks the GPUs to
    /// drain by).
    busy_ns: Arc<AtomicU64>,
    /// Behind the join gate: when it registered, and until when each of
    /// its GPUs is busy (its registration's busy report); None once its
    /// GPUs were offered to matchmaking.
    pub(super) gated: Option<Gated>,
    /// Per local GPU: held out of matchmaking while a batch on it is
    /// overdue, until this moment at the latest (None: not held).
    held_until: Vec<Option<Instant>>,
    /// Per local GPU: the newest batch id reported done on it (an overdue
    /// batch older than it lost its report; the GPU works).
    last_done: Vec<u64>,
    /// It answers join-gate requests (`Drain{Ready}`): a frontend that
    /// registers later waits for its answer.
    pub(super) reports_ready: bool,
    /// Join-gate requests sent to it, and answered (it answers each once
    /// its data links to the frontends announced before it are up).
    asked: u64,
    answered: u64,
    /// A frontend was announced while a request was unanswered: ask again
    /// once it is answered.
    reask: bool,
}

/// A backend behind the join gate.
pub(super) struct Gated {
    /// When it registered.
    pub(super) since: Instant,
    /// Each local GPU's end of busy time, as reported at registration.
    pub(super) free_at: Vec<Instant>,
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

/// Upper bounds (ms) of the join-time histogram.
const JOIN_MS_BUCKETS: [u64; 12] = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000];

/// What membership shows an autoscaler in `/metrics`: the backends whose
/// GPUs are in matchmaking, each with its planned busy time
/// (`symphony_backend_planned_busy_ns{backend="ID"}`: present = serving,
/// past the join gate and not draining), and how long the join gate held
/// each backend (`symphony_backend_join_ms`, registration to ready),
/// and the GPUs held out of matchmaking while a batch on them is overdue
/// (`symphony_gpus_held` now, `symphony_gpu_holds_total` ever).
#[derive(Clone)]
struct MemberMetrics {
    /// Locked only when a backend starts or stops serving and at a scrape.
    serving: Arc<Mutex<BTreeMap<u32, Arc<AtomicU64>>>>,
    join_ms: Histogram,
    gpus_held: Gauge,
    gpu_holds: Counter,
}

impl Default for MemberMetrics {
    /// Not registered anywhere.
    fn default() -> Self {
        MemberMetrics {
            serving: Arc::default(),
            join_ms: Histogram::new(&JOIN_MS_BUCKETS),
            gpus_held: Gauge::default(),
            gpu_holds: Counter::default(),
        }
    }
}

impl MemberMetrics {
    fn register(r: &MetricsRegistry) -> Self {
        let m = MemberMetrics::default();
        let serving = m.serving.clone();
        r.register(
            "symphony_backend_planned_busy_ns",
            "Planned GPU busy time of each backend whose GPUs are in matchmaking (past the join gate, not draining), ns",
            Computed::plain(move |s| {
                let serving = serving.lock().unwrap_or_else(|p| p.into_inner());
                for (id, ns) in serving.iter() {
                    s.labelled(&[("backend", &id.to_string())], ns.load(Ordering::Relaxed) as f64);
                }
            }),
        );
        r.register(
            "symphony_backend_join_ms",
            "Backends' join time behind the join gate: registration to their data links to every frontend up, ms",
            m.join_ms.clone(),
        );
        r.register(
            "symphony_gpus_held",
            "GPUs held out of matchmaking now because a batch planned on them is overdue (no report past its planned finish)",
            m.gpus_held.clone(),
        );
        r.register(
            "symphony_gpu_holds",
            "Times a GPU was held out of matchmaking because a batch planned on it was overdue",
            m.gpu_holds.clone(),
        );
        m
    }

    fn set_serving(&self, id: u32, busy_ns: Option<&Arc<AtomicU64>>) {
        let mut serving = self.serving.lock().unwrap_or_else(|p| p.into_inner());
        match busy_ns {
            Some(ns) => serving.insert(id, ns.clone()),
            None => serving.remove(&id),
        };
    }
}

/// A frontend waiting for data links: since its first task held, and
/// (backend, the join-gate request whose answer says its link is up) per
/// backend still to answer.
type LinkWait = (Option<Instant>, Vec<(u32, u64)>);

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
    /// GPUs held out of matchmaking while a batch on them is overdue.
    held: usize,
    /// Frontends waiting for data links: since when (its first task held),
    /// and (backend,
    /// join-gate request whose answer says its link is up) per serving
    /// backend that has not answered it yet. Empty unless a frontend
    /// joined recently.
    unlinked: HashMap<u32, LinkWait, IdHasher>,
    metrics: MemberMetrics,
}

impl Membership {
    /// No peers; the autoscaler's view of them registered in `r`.
    pub(super) fn new(r: &MetricsRegistry) -> Self {
        Membership { metrics: MemberMetrics::register(r), ..Membership::default() }
    }

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
    /// numbered `gpus` there; `gated`: it waits behind the join gate.
    pub(super) fn add_backend(&mut self, id: u32, subcluster: usize, gpus: Vec<GpuId>, gated: Option<Gated>) {
        let busy_ns = Arc::new(AtomicU64::new(0));
        if gated.is_none() {
            self.metrics.set_serving(id, Some(&busy_ns));
        }
        // A gated backend was sent its first join-gate request.
        let reports_ready = gated.is_some();
        let n = gpus.len();
        self.backends.insert(
            id,
            BackendState {
                subcluster,
                gpus,
                drain: Drain::No,
                busy_ns,
                gated,
                held_until: vec![None; n],
                last_done: vec![0; n],
                reports_ready,
                asked: u64::from(reports_ready),
                answered: 0,
                reask: false,
            },
        );
    }

    /// Backend `id` passed the join gate: its sub-cluster, GPUs and what
    /// it waited with; None if it is not registered, was not gated or
    /// passed already, or drains (its GPUs never serve then).
    pub(super) fn pass_gate(&mut self, id: u32) -> Option<(usize, Vec<GpuId>, Gated)> {
        let b = self.backends.get_mut(&id).filter(|b| b.drain == Drain::No)?;
        let gated = b.gated.take()?;
        self.metrics.set_serving(id, Some(&b.busy_ns));
        Some((b.subcluster, b.gpus.clone(), gated))
    }

    /// A backend waited `ms` behind the join gate.
    pub(super) fn record_join(&self, ms: u64) {
        self.metrics.join_ms.observe(ms);
    }

    /// A batch of `ns` planned on backend `id`'s GPUs.
    pub(super) fn record_plan(&self, id: u32, ns: u64) {
        if let Some(b) = self.backends.get(&id) {
            b.busy_ns.fetch_add(ns, Ordering::Relaxed);
        }
    }

    /// Backend `id` left: its state, if it was registered.
    pub(super) fn remove_backend(&mut self, id: u32) -> Option<BackendState> {
        let b = self.backends.remove(&id)?;
        if b.drain != Drain::No {
            self.draining -= 1;
        }
        self.held -= b.held_until.iter().flatten().count();
        self.metrics.gpus_held.set(self.held as i64);
        self.metrics.set_serving(id, None);
        Some(b)
    }

    /// Backend `id` starts draining: its sub-cluster and GPUs, which leave
    /// matchmaking now; None if it is not registered or drains already.
    pub(super) fn start_drain(&mut self, id: u32) -> Option<(usize, Vec<GpuId>)> {
        let b = self.backends.get_mut(&id).filter(|b| b.drain == Drain::No)?;
        b.drain = Drain::Draining;
        self.draining += 1;
        // Its GPUs leave matchmaking for good: none is held any more.
        for h in &mut b.held_until {
            self.held -= usize::from(h.take().is_some());
        }
        self.metrics.gpus_held.set(self.held as i64);
        self.metrics.set_serving(id, None);
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

/// GPUs held out of matchmaking while a batch on them is overdue (the
/// cores' GPU offline, as for a backend that left or drains: one GPU
/// state, the cores' online flag, whatever keeps a GPU out).
impl Membership {
    /// Batch `batch` on backend `id`'s GPU `local_gpu` is overdue (no
    /// report by `ledger::SUSPECT_AFTER` past its planned finish, or given
    /// up at the grace): the GPU may be stalled, and every batch
    /// planned on it would be given up too. Unless a later batch on it was
    /// reported already (this report was lost; the GPU works) or its GPUs
    /// do not serve (behind the gate, draining), it is held out of
    /// matchmaking until its next report or until `until`. Returns
    /// (sub-cluster, GPU) to take out of matchmaking now; None if nothing
    /// is to change (a GPU held already is held until `until` now).
    pub(super) fn hold_gpu(&mut self, id: u32, local_gpu: u32, batch: u64, until: Instant) -> Option<(usize, GpuId)> {
        let b = self.backends.get_mut(&id).filter(|b| b.drain == Drain::No && b.gated.is_none())?;
        let l = local_gpu as usize;
        if b.last_done.get(l).is_some_and(|&done| done > batch) {
            return None;
        }
        let gpu = *b.gpus.get(l)?;
        let held = b.held_until.get_mut(l)?.replace(until);
        if held.is_some() {
            return None;
        }
        self.held += 1;
        self.metrics.gpus_held.set(self.held as i64);
        self.metrics.gpu_holds.inc();
        Some((b.subcluster, gpu))
    }

    /// A batch on backend `id`'s GPU `local_gpu` was reported (on time or
    /// late): the GPU runs. Returns (sub-cluster, GPU) to put back into
    /// matchmaking if it was held.
    pub(super) fn gpu_reported(&mut self, id: u32, local_gpu: u32, batch: u64) -> Option<(usize, GpuId)> {
        let b = self.backends.get_mut(&id)?;
        let l = local_gpu as usize;
        if let Some(done) = b.last_done.get_mut(l) {
            *done = (*done).max(batch);
        }
        b.held_until.get_mut(l)?.take()?;
        self.held -= 1;
        self.metrics.gpus_held.set(self.held as i64);
        Some((b.subcluster, *b.gpus.get(l)?))
    }

    /// When the first held GPU's bound ends (None: none is held; costs
    /// nothing then).
    pub(super) fn next_hold_end(&self) -> Option<Instant> {
        if self.held == 0 {
            return None;
        }
        self.backends.values().flat_map(|b| b.held_until.iter().flatten()).min().copied()
    }

    /// The held GPUs whose bound ended by `now`, no longer held: (backend,
    /// sub-cluster, GPU), in that order (a run is reproducible).
    pub(super) fn end_holds(&mut self, now: Instant) -> Vec<(u32, usize, GpuId)> {
        let mut ended = Vec::new();
        if self.held == 0 {
            return ended;
        }
        for (&id, b) in &mut self.backends {
            for (h, &g) in b.held_until.iter_mut().zip(&b.gpus) {
                if h.is_some_and(|t| t <= now) {
                    *h = None;
                    ended.push((id, b.subcluster, g));
                }
            }
        }
        self.held -= ended.len();
        self.metrics.gpus_held.set(self.held as i64);
        ended.sort_unstable();
        ended
    }
}

/// Frontends waiting for the backends' data links to them. A frontend
/// that registers is announced to every backend; one that answers
/// join-gate requests (`Drain{Ready}`, its Join's `REPORTS_READY`) is
/// asked again after the announcement, and answers once its data link to
/// the frontend is up (or at its handshake timeout). The frontend's tasks
/// wait until every serving backend answered: a plan never sends a
/// backend a READ it cannot post. One request at a time per backend (it
/// answers the frontends announced before each request at once).
impl Membership {
    /// Frontend `f` was just announced to backend `id`: whether to send it
    /// a join-gate request now (none is unanswered). Unless the backend
    /// does not answer those or drains, `f` waits for its answer to the
    /// first request after the announcement (this one, or the next).
    pub(super) fn wait_for_link(&mut self, id: u32, f: u32) -> bool {
        let Some(b) = self.backends.get_mut(&id).filter(|b| b.reports_ready && b.drain == Drain::No) else { return false };
        let ask_now = b.asked == b.answered;
        let answer = b.asked + 1;
        if ask_now {
            b.asked += 1;
        } else {
            b.reask = true;
        }
        self.unlinked.entry(f).or_default().1.push((id, answer));
        ask_now
    }

    /// Backend `id` answered a join-gate request: whether to ask it again
    /// (a frontend was announced meanwhile), and the frontends no longer
    /// waiting for any backend's link, in id order.
    pub(super) fn link_answer(&mut self, id: u32) -> (bool, Vec<u32>) {
        let Some(b) = self.backends.get_mut(&id) else { return (false, Vec::new()) };
        b.answered = (b.answered + 1).min(b.asked);
        let again = b.reask && b.answered == b.asked && b.drain == Drain::No;
        if again {
            b.reask = false;
            b.asked += 1;
        }
        let answered = b.answered;
        (again, self.settle_links(|(from, answer)| from == id && answer <= answered))
    }

    /// Backend `id` left or drains: no frontend waits for its link.
    pub(super) fn link_gone(&mut self, id: u32) -> Vec<u32> {
        self.settle_links(|(from, _)| from == id)
    }

    /// Frontends that waited since `before` or earlier stop waiting (a
    /// request or its answer was lost, a backend never links): their
    /// tasks are planned as they were before links were waited for.
    pub(super) fn link_wait_over(&mut self, before: Instant) -> Vec<u32> {
        let mut over: Vec<u32> = self.unlinked.iter().filter(|(_, w)| w.0.is_some_and(|t| t <= before)).map(|(&f, _)| f).collect();
        over.sort_unstable();
        for f in &over {
            self.unlinked.remove(f);
        }
        over
    }

    /// When the frontend waiting longest had its first task held (None:
    /// none waits with a task).
    pub(super) fn link_wait_since(&self) -> Option<Instant> {
        self.unlinked.values().filter_map(|w| w.0).min()
    }

    /// Whether frontend `f` waits for data links: if so, a task of it came
    /// at `now` and is held (its wait is bounded from its first).
    pub(super) fn link_pending(&mut self, f: u32, now: Instant) -> bool {
        if self.unlinked.is_empty() {
            return false;
        }
        match self.unlinked.get_mut(&f) {
            Some(w) => {
                w.0.get_or_insert(now);
                true
            }
            None => false,
        }
    }

    /// Frontend `f` left: it waits for nothing.
    pub(super) fn forget_links(&mut self, f: u32) {
        self.unlinked.remove(&f);
    }

    /// Drops the waits `done` says are over; the frontends left waiting
    /// for nothing, in id order.
    fn settle_links(&mut self, done: impl Fn((u32, u64)) -> bool) -> Vec<u32> {
        let mut linked = Vec::new();
        self.unlinked.retain(|&f, w| {
            w.1.retain(|&x| !done(x));
            if w.1.is_empty() {
                linked.push(f);
            }
            !w.1.is_empty()
        });
        linked.sort_unstable();
        linked
    }
}
