//! A whole cluster of real nodes in one thread: the scheduler node,
//! frontend nodes (each with its staging area and `ClusterService`) and
//! backend nodes (each a `BatchWorker` over emulated GPUs), connected by
//! the `sim` transport. The caller owns the clock: [`NodeCluster::poll`]
//! takes `now` and [`NodeCluster::next_wakeup`] says when to come back, so
//! the chaos harness drives it on virtual time and the in-process server on
//! the real clock. Nodes that exit (a frontend or backend that lost its
//! scheduler) are restarted after a delay, as a supervisor would.
//!
//! With [`ClusterSpec::ha`], several scheduler nodes stand by (issue 18):
//! each runs a [`Candidate`] over one [`InMemory`] election store, the
//! leader's heartbeats reach the standbys as `handle_heartbeat` while the
//! two are linked, only the leader listens (a fresh `SchedulerNode` of its
//! epoch, fenced for the lease TTL), and frontends and backends outlive
//! their scheduler and walk the scheduler address list.

use std::sync::Arc;

use backend::exec::emulated::EmulatedExecutor;
use backend::exec::ExecModel;
use backend::node::{BackendEvent, BackendNode, BackendNodeConfig};
use backend::worker::{BatchReport, BatchWorker, WorkerConfig};
use dataplane::mem::{Access, Region};
use dataplane::time::{Duration, Instant};
use dataplane::transport::sim::{NodeId, SimConn, SimDomain, SimListener, SimNet};
use dataplane::transport::{Domain, Listener};
use dataplane::wire;
use frontend::metrics::Metrics;
use frontend::models::ModelCatalog;
use frontend::node::{FrontendEvent, FrontendNode, FrontendNodeConfig, NetSink};
use frontend::service::ClusterService;
use frontend::staging::{Staging, StagingConfig};
use scheduler::daemon::metrics::SchedulerMetrics;
use scheduler::daemon::node::{Membership, NodeConfig, SchedulerNode};
use dataplane::join::{JoinToken, NonceSource};
use scheduler::daemon::plane::ControlPlane;
use scheduler::closed_loop::LoopConfig;
use scheduler::deferred::{Admission, CoreConfig};
use scheduler::election::{Candidate, CandidateConfig, InMemory, RoleEvent};
use scheduler::delay_watch::DelayWatchConfig;
use scheduler::zoo::ModelSpec;

/// Why a node of the in-process cluster could not start.
#[derive(Debug, thiserror::Error)]
pub enum NodeClusterError {
    /// The scheduler's control plane refused the models.
    #[error("scheduler control plane: {what}")]
    ControlPlane {
        /// The control plane's message.
        what: String,
    },
    /// A listener, registration or link of the `sim` transport failed.
    #[error("{what}: {source}")]
    Transport {
        /// What was being set up.
        what: &'static str,
        /// The transport error.
        source: dataplane::transport::Error,
    },
    /// A memory region or the staging area could not be made.
    #[error("{what}: {source}")]
    Memory {
        /// What was being set up.
        what: &'static str,
        /// The memory error.
        source: dataplane::mem::MemError,
    },
    /// Every 16-bit frontend id was used.
    #[error("frontend ids exhausted")]
    FrontendIdsExhausted,
    /// The scheduler is unreachable (partitioned): the daemon would exit.
    #[error("scheduler unreachable: {0}")]
    SchedulerUnreachable(#[source] dataplane::transport::Error),
    /// The backend's worker refused its configuration.
    #[error("backend worker: {0}")]
    Worker(#[source] backend::worker::WorkerError),
}

fn transport(what: &'static str) -> impl FnOnce(dataplane::transport::Error) -> NodeClusterError {
    move |source| NodeClusterError::Transport { what, source }
}

fn memory(what: &'static str) -> impl FnOnce(dataplane::mem::MemError) -> NodeClusterError {
    move |source| NodeClusterError::Memory { what, source }
}

/// Shape and timing of a [`NodeCluster`].
#[derive(Clone, Debug)]
pub struct ClusterSpec {
    /// The models (id = index); every backend serves all of them.
    pub models: Vec<ModelSpec>,
    /// Input and output tensors of the models.
    pub catalog: Arc<ModelCatalog>,
    /// Frontend nodes.
    pub frontends: usize,
    /// Backend nodes.
    pub backends: usize,
    /// Emulated GPUs per backend.
    pub gpus_per_backend: u32,
    /// The scheduler's core configuration (its `delay.d_ctrl` is also the
    /// control delay bound the backends subtract).
    pub core: CoreConfig,
    /// Heartbeat interval of every node.
    pub heartbeat: Duration,
    /// Silence after which a peer is dead.
    pub dead_after: Duration,
    /// Registration bound.
    pub handshake: Duration,
    /// Part of each budget a frontend keeps for the answer's way back.
    pub return_margin: Duration,
    /// How long past its budget a request waits before it gives up.
    pub grace: Duration,
    /// Staging slots per frontend (requests in flight at most).
    pub slots: u32,
    /// Task queue from the service to the node, per frontend.
    pub queue: usize,
    /// Batch buffers per GPU at a backend.
    pub batch_slots_per_gpu: u32,
    /// How long after an exit a node is restarted.
    pub restart_after: Duration,
    /// The join token every node proves ([`TEST_JOIN_TOKEN`] by default;
    /// the scheduler's nonces are seeded, so runs replay).
    pub join_token: JoinToken,
    /// The scheduler's closed loop (on by default).
    pub closed_loop: LoopConfig,
    /// How the scheduler holds the READ tail against `core.delay.d_data`.
    pub delay_watch: DelayWatchConfig,
    /// GPUs slower than their profile from the start, as (backend slot,
    /// GPU, factor); a restarted backend is slowed again.
    pub gpu_slowdowns: Vec<(usize, u32, f64)>,
    /// How long a backend's data link to a frontend takes to be accepted
    /// after its connect ([`SimNet::delay_accepts`] on every frontend's
    /// data listener; zero by default): a data path slower to come up
    /// than the control path, as on a loaded host.
    pub data_link_delay: Duration,
    /// Hot-standby schedulers (None: one scheduler, as the embedded
    /// default).
    pub ha: Option<HaSpec>,
    /// A second scheduler group (issue 19): scheduler node `b` (no
    /// standby) with the odd backend slots as its sub-cluster; every
    /// frontend links to both groups and routes by the table handed to it
    /// ([`NodeCluster::set_frontend_routes`]); each scheduler is handed
    /// its table by the caller (`handle_routes`).
    pub group_b: bool,
}

/// Hot-standby schedulers of a [`NodeCluster`] (see the module docs).
#[derive(Clone, Debug)]
pub struct HaSpec {
    /// Scheduler nodes (2 or 3).
    pub schedulers: usize,
    /// Leader -> standby heartbeats and lease renewals.
    pub heartbeat: Duration,
    /// Leader silence after which a standby revokes and campaigns.
    pub failure_timeout: Duration,
    /// The lease's time to live; also each new leader's fence.
    pub lease_ttl: Duration,
    /// A peer without a scheduler tries the next address this often.
    pub reconnect_every: Duration,
}

impl Default for HaSpec {
    fn default() -> Self {
        HaSpec {
            schedulers: 3,
            heartbeat: Duration::from_millis(5),
            failure_timeout: Duration::from_millis(30),
            lease_ttl: Duration::from_millis(150),
            reconnect_every: Duration::from_millis(5),
        }
    }
}

/// The harness's fixed join token (deterministic runs; never a real
/// cluster's).
pub const TEST_JOIN_TOKEN: &[u8] = b"symphony-inproc-test-join-token";
/// Seed of the scheduler's challenge nonces in the harness.
const NONCE_SEED: u64 = 0x6e6f_6e63_6573;
/// Seeds the frontends' data-link challenges (xor the frontend id).
const DATA_NONCE_SEED: u64 = 0x6461_7461_6c6e_6b00;
/// Seeds the peers' Join nonces (xor the id; a backend's also bit 32).
const JOIN_NONCE_SEED: u64 = 0x6a6f_696e_0000_0000;

impl ClusterSpec {
    /// The daemons' defaults around `models`.
    pub fn new(models: Vec<ModelSpec>, frontends: usize, backends: usize, gpus_per_backend: u32) -> Self {
        let catalog = Arc::new(ModelCatalog::with_default_tensors(&models));
        ClusterSpec {
            models,
            catalog,
            frontends,
            backends,
            gpus_per_backend,
            core: CoreConfig::default(),
            heartbeat: Duration::from_millis(100),
            dead_after: Duration::from_millis(1000),
            handshake: Duration::from_millis(1000),
            return_margin: Duration::from_micros(700),
            grace: Duration::from_millis(100),
            slots: 512,
            queue: 4096,
            batch_slots_per_gpu: 3,
            restart_after: Duration::from_millis(1000),
            join_token: test_join_token(),
            closed_loop: LoopConfig::default(),
            delay_watch: DelayWatchConfig::default(),
            gpu_slowdowns: Vec::new(),
            data_link_delay: Duration::ZERO,
            ha: None,
            group_b: false,
        }
    }
}

/// A scheduler node for `spec` of election `epoch` (0: none), fenced for
/// the lease TTL with [`ClusterSpec::ha`].
fn build_scheduler(spec: &ClusterSpec, admissions: &[(u32, Admission)], epoch: u32) -> Result<SchedulerNode<SimConn>, NodeClusterError> {
    let all: Vec<u32> = (0..spec.models.len() as u32).collect();
    let metrics = Arc::new(SchedulerMetrics::new(&spec.models));
    let mut plane = ControlPlane::new(spec.models.clone(), &[all], spec.core, metrics)
        .map_err(|e| NodeClusterError::ControlPlane { what: e.to_string() })?;
    plane.set_closed_loop(spec.closed_loop);
    plane.set_delay_watch("sim", spec.delay_watch);
    for &(m, a) in admissions {
        plane.set_admission(m, a);
    }
    let node = SchedulerNode::new(
        plane,
        NodeConfig {
            heartbeat: spec.heartbeat,
            dead_after: spec.dead_after,
            handshake_timeout: spec.handshake,
            batch_grace: spec.dead_after,
            // The old leader steps down before its lease could lapse.
            fence_wait: spec.ha.as_ref().map_or(Duration::ZERO, |h| h.lease_ttl),
            ..NodeConfig::default()
        },
    )
    .with_membership(Membership {
        nonces: NonceSource::Seeded(NONCE_SEED ^ u64::from(epoch)),
        ..Membership::with_token(spec.join_token.clone())
    });
    Ok(node.with_epoch(epoch))
}

/// [`TEST_JOIN_TOKEN`] as a token.
pub fn test_join_token() -> JoinToken {
    match JoinToken::new(TEST_JOIN_TOKEN) {
        Ok(t) => t,
        Err(e) => unreachable!("the fixed test token is long enough: {e}"),
    }
}

/// A running frontend node and what its host holds.
pub struct FrontendHost {
    /// Its node on the network.
    pub net_id: NodeId,
    /// The node.
    pub node: FrontendNode<SimConn>,
    /// Where backends connect.
    pub listener: SimListener,
    /// What clients submit through.
    pub service: Arc<ClusterService<NetSink>>,
    /// Without a scheduler (failover): the next address to try, and when.
    lost: Option<(usize, Instant)>,
    /// The address after the current scheduler link's.
    next_addr: usize,
}

/// A running backend node and what its host holds.
pub struct BackendHost {
    /// Its node on the network.
    pub net_id: NodeId,
    domain: SimDomain,
    /// The node.
    pub node: BackendNode<SimConn, EmulatedExecutor>,
    /// Without a scheduler (failover): the next address to try, and when.
    lost: Option<(usize, Instant)>,
    /// The address after the current scheduler link's.
    next_addr: usize,
}

/// A scheduler node's host: the node while it leads (always, without
/// [`ClusterSpec::ha`]), its listener, its candidate.
pub struct SchedHost {
    /// Its node on the network.
    pub net_id: NodeId,
    addr: String,
    node: Option<SchedulerNode<SimConn>>,
    listener: Option<SimListener>,
    candidate: Option<Candidate<InMemory>>,
    /// Stopped (SIGSTOP) until then: nothing of it runs.
    paused_until: Option<Instant>,
    crashed: bool,
}

impl SchedHost {
    /// Accepts what its listener has, runs its node and takes its events;
    /// true when anything happened (nothing without a node).
    fn run(&mut self, now: Instant) -> bool {
        let Some(node) = self.node.as_mut() else { return false };
        let mut progressed = false;
        if let Some(l) = self.listener.as_mut() {
            while let Ok(conn) = l.accept(Duration::ZERO) {
                node.handle_connection(now, conn);
                progressed = true;
            }
        }
        progressed |= node.poll(now);
        while node.poll_event().is_some() {
            progressed = true;
        }
        progressed
    }

    /// Whether it leads (has a scheduler node).
    pub fn leads(&self) -> bool {
        self.node.is_some()
    }

    fn running(&self, now: Instant) -> bool {
        !self.crashed && self.paused_until.is_none_or(|t| now >= t)
    }
}

/// A node's place in the cluster: running, or down until a restart.
pub enum Slot<T> {
    /// Running.
    Up(Box<T>),
    /// Down; restarted at the instant, if any.
    Down {
        /// When it comes back.
        restart_at: Option<Instant>,
    },
}

/// What happened in a [`NodeCluster::poll`], for the caller.
#[derive(Clone, Debug)]
pub enum ClusterEvent {
    /// Frontend slot `i` exited (its scheduler went away or refused it).
    FrontendExited(usize),
    /// Backend slot `i` exited.
    BackendExited(usize),
    /// Backend slot `i` finished a batch.
    Batch(usize, BatchReport),
    /// The scheduler node `net id` (a new term of group a) applied the
    /// newest routing table its group had read; which models it does not
    /// own.
    RoutesApplied(NodeId, Vec<bool>),
}

/// The cluster (see the module docs).
pub struct NodeCluster {
    spec: ClusterSpec,
    net: SimNet,
    scheds: Vec<SchedHost>,
    /// The election store (with [`ClusterSpec::ha`]).
    store: Option<InMemory>,
    /// Scheduler pairs whose heartbeats are cut (a partition).
    cut: Vec<(usize, usize)>,
    /// Overlapping plans of scheduler nodes that stepped down or crashed.
    retired_overlaps: u64,
    admissions: Vec<(u32, Admission)>,
    frontends: Vec<Slot<FrontendHost>>,
    backends: Vec<Slot<BackendHost>>,
    next_net_id: NodeId,
    next_frontend_id: u16,
    next_backend_id: u32,
    /// A notifier handed to every frontend's task queue (the real-clock
    /// host sleeps on it).
    waker: Option<dataplane::waitset::Notifier>,
    /// Backend net ids ever started (for taps that tell roles apart).
    pub backend_net_ids: Vec<NodeId>,
    busy_rejections: u64,
    /// With [`ClusterSpec::group_b`]: its scheduler.
    group_b: Option<SchedHost>,
    /// The newest routing table handed to frontends (revision, owner group
    /// of each model), given to each frontend that starts.
    frontend_routes: (u64, Vec<Option<u16>>),
    /// The newest routing table group a's hosts have read (each host
    /// follows the table, as the daemon's `RoutesWatch` does): a new term
    /// owns nothing until it has applied it, and applies it first.
    routes_a: Option<Arc<scheduler::routes::RouteTable>>,
    /// New terms that applied `routes_a`, to report from `poll`.
    new_terms_routes: Vec<(NodeId, Vec<bool>)>,
}

/// Group b's scheduler address in the harness.
const GROUP_B_ADDR: &str = "sim:scheduler-b";

impl NodeCluster {
    /// A cluster on `net` (node 0 is the scheduler); every frontend and
    /// backend starts at the first poll.
    pub fn new(spec: ClusterSpec, net: SimNet, waker: Option<dataplane::waitset::Notifier>) -> Result<NodeCluster, NodeClusterError> {
        let (scheds, store) = match &spec.ha {
            None => {
                let node = build_scheduler(&spec, &[], 0)?;
                let listener = net.domain(0).listen("sim:scheduler").map_err(transport("scheduler listener"))?;
                let host = SchedHost {
                    net_id: 0,
                    addr: listener.local_addr(),
                    node: Some(node),
                    listener: Some(listener),
                    candidate: None,
                    paused_until: None,
                    crashed: false,
                };
                (vec![host], None)
            }
            Some(ha) => {
                // The models and the plane are checked now, not at the
                // first election.
                build_scheduler(&spec, &[], 0)?;
                let store = InMemory::new(ha.lease_ttl);
                let hosts = (0..ha.schedulers)
                    .map(|i| {
                        let addr = format!("sim:scheduler{i}");
                        let cfg = CandidateConfig {
                            me: addr.clone(),
                            heartbeat: ha.heartbeat,
                            failure_timeout: ha.failure_timeout,
                            lease_ttl: ha.lease_ttl,
                        };
                        let candidate = Candidate::new(cfg, store.handle(&addr));
                        SchedHost { net_id: i as NodeId, addr, node: None, listener: None, candidate: Some(candidate), paused_until: None, crashed: false }
                    })
                    .collect();
                (hosts, Some(store))
            }
        };
        let mut next_net_id = scheds.len() as NodeId;
        let group_b = if spec.group_b {
            let net_id = next_net_id;
            next_net_id += 1;
            let listener = net.domain(net_id).listen(GROUP_B_ADDR).map_err(transport("group b scheduler listener"))?;
            let node = build_scheduler(&spec, &[], 0)?;
            Some(SchedHost { net_id, addr: listener.local_addr(), node: Some(node), listener: Some(listener), candidate: None, paused_until: None, crashed: false })
        } else {
            None
        };
        Ok(NodeCluster {
            group_b,
            frontend_routes: (0, Vec::new()),
            routes_a: None,
            new_terms_routes: Vec::new(),
            frontends: (0..spec.frontends).map(|_| Slot::Down { restart_at: Some(Instant::ZERO) }).collect(),
            backends: (0..spec.backends).map(|_| Slot::Down { restart_at: Some(Instant::ZERO) }).collect(),
            spec,
            net,
            scheds,
            store,
            cut: Vec::new(),
            retired_overlaps: 0,
            admissions: Vec::new(),
            next_net_id,
            next_frontend_id: 1,
            next_backend_id: 1,
            waker,
            backend_net_ids: Vec::new(),
            busy_rejections: 0,
        })
    }

    /// The network.
    pub fn net(&self) -> &SimNet {
        &self.net
    }

    /// The scheduler node that leads (the only one without
    /// [`ClusterSpec::ha`]), if any.
    pub fn scheduler(&self) -> Option<&SchedulerNode<SimConn>> {
        self.scheds.iter().find_map(|h| h.node.as_ref())
    }

    /// Sets a model's admission on the scheduler and on every scheduler
    /// elected later.
    pub fn set_admission(&mut self, model: u32, admission: Admission) {
        self.admissions.push((model, admission));
        for n in self.scheds.iter_mut().chain(self.group_b.as_mut()).filter_map(|h| h.node.as_mut()) {
            n.plane_mut().set_admission(model, admission);
        }
    }

    /// Group a's hosts have read routing `table` (ignored unless newer):
    /// every group-a scheduler node up applies it now. Returns, for each
    /// node that applied it, its net id and the models it does not own.
    pub fn apply_group_a_routes(&mut self, now: Instant, table: Arc<scheduler::routes::RouteTable>) -> Vec<(NodeId, Vec<bool>)> {
        if self.routes_a.as_ref().is_some_and(|t| t.revision >= table.revision) {
            return Vec::new();
        }
        let models = self.spec.models.len() as u32;
        let mut applied = Vec::new();
        for h in &mut self.scheds {
            if let Some(n) = h.node.as_mut() {
                if n.handle_routes(now, &table, "a") {
                    applied.push((h.net_id, (0..models).map(|m| !n.owns(m)).collect()));
                }
            }
        }
        self.routes_a = Some(table);
        applied
    }

    /// With [`ClusterSpec::group_b`]: group b's scheduler node.
    pub fn group_b(&self) -> Option<&SchedulerNode<SimConn>> {
        self.group_b.as_ref().and_then(|h| h.node.as_ref())
    }

    /// Group b's scheduler node, to hand it what its host would.
    pub fn group_b_mut(&mut self) -> Option<&mut SchedulerNode<SimConn>> {
        self.group_b.as_mut().and_then(|h| h.node.as_mut())
    }

    /// Group b's scheduler's net id.
    pub fn group_b_net_id(&self) -> Option<NodeId> {
        self.group_b.as_ref().map(|h| h.net_id)
    }

    /// With [`ClusterSpec::group_b`]: hands routing `revision` (the owner
    /// group of each model) to frontend `i` (`None`: none now; only kept
    /// for frontends that start later, as every newer table is).
    pub fn set_frontend_routes(&mut self, i: Option<usize>, revision: u64, owners: &[Option<u16>]) {
        if revision > self.frontend_routes.0 {
            self.frontend_routes = (revision, owners.to_vec());
        }
        if let Some(Slot::Up(h)) = i.and_then(|i| self.frontends.get_mut(i)) {
            h.node.handle_routes(revision, owners);
        }
    }

    /// Tasks the frontends up now took back (answered `moved`) for
    /// resubmission.
    pub fn moved_resubmits(&self) -> u64 {
        self.frontends
            .iter()
            .map(|f| if let Slot::Up(h) = f { h.node.stats().moved_taken_back.load(std::sync::atomic::Ordering::Relaxed) } else { 0 })
            .sum()
    }

    /// The scheduler hosts.
    pub fn schedulers(&self) -> &[SchedHost] {
        &self.scheds
    }

    /// The slot of the scheduler that leads (or last led while running).
    pub fn leader(&self) -> Option<usize> {
        self.scheds.iter().position(|h| h.node.is_some())
    }

    /// The election store (with [`ClusterSpec::ha`]).
    pub fn election_store(&self) -> Option<&InMemory> {
        self.store.as_ref()
    }

    /// Crashes scheduler `i` (its links break; it does not come back).
    pub fn crash_scheduler(&mut self, i: usize) -> bool {
        let Some(h) = self.scheds.get_mut(i).filter(|h| !h.crashed) else { return false };
        h.crashed = true;
        h.listener = None;
        if let Some(n) = h.node.take() {
            self.retired_overlaps += n.plane().overlapping_plans();
        }
        self.net.crash(h.net_id);
        true
    }

    /// Stops scheduler `i` until `until` (SIGSTOP then SIGCONT): nothing of
    /// it runs meanwhile; its links stay open.
    pub fn pause_scheduler(&mut self, i: usize, until: Instant) -> bool {
        let Some(h) = self.scheds.get_mut(i).filter(|h| !h.crashed) else { return false };
        h.paused_until = Some(until);
        true
    }

    /// Cuts (or restores) the heartbeats between schedulers `a` and `b`.
    pub fn cut_schedulers(&mut self, a: usize, b: usize, cut: bool) {
        self.cut.retain(|&(x, y)| (x, y) != (a, b) && (x, y) != (b, a));
        if cut {
            self.cut.push((a, b));
        }
    }

    /// Plans made onto a GPU before its previous planned batch there
    /// ended, by every scheduler node that ever led.
    pub fn overlapping_plans(&self) -> u64 {
        self.retired_overlaps + self.scheds.iter().chain(self.group_b.as_ref()).filter_map(|h| h.node.as_ref()).map(|n| n.plane().overlapping_plans()).sum::<u64>()
    }

    /// The frontend in slot `i`, if up.
    pub fn frontend(&self, i: usize) -> Option<&FrontendHost> {
        match self.frontends.get(i)? {
            Slot::Up(h) => Some(h),
            Slot::Down { .. } => None,
        }
    }

    /// The backend in slot `i`, if up.
    pub fn backend(&self, i: usize) -> Option<&BackendHost> {
        match self.backends.get(i)? {
            Slot::Up(h) => Some(h),
            Slot::Down { .. } => None,
        }
    }

    /// The backend in slot `i`, if up, to change it.
    pub fn backend_mut(&mut self, i: usize) -> Option<&mut BackendHost> {
        match self.backends.get_mut(i)? {
            Slot::Up(h) => Some(h),
            Slot::Down { .. } => None,
        }
    }

    /// Frontend slots.
    pub fn frontend_count(&self) -> usize {
        self.frontends.len()
    }

    /// The services of the frontends, by slot (`None` while down).
    pub fn services(&self) -> Vec<Option<&ClusterService<NetSink>>> {
        self.frontends.iter().map(|f| if let Slot::Up(h) = f { Some(&*h.service) } else { None }).collect()
    }

    /// Batches that reached a busy device (over every backend incarnation).
    pub fn busy_rejections(&self) -> u64 {
        self.busy_rejections
            + self.backends.iter().map(|b| if let Slot::Up(h) = b { h.node.worker().executor().busy_rejections() } else { 0 }).sum::<u64>()
    }

    fn fresh_net_id(&mut self) -> NodeId {
        let id = self.next_net_id;
        self.next_net_id += 1;
        id
    }

    fn start_frontend(&mut self, now: Instant) -> Result<FrontendHost, NodeClusterError> {
        let net_id = self.fresh_net_id();
        let id = self.next_frontend_id;
        self.next_frontend_id = self.next_frontend_id.checked_add(1).ok_or(NodeClusterError::FrontendIdsExhausted)?;
        let domain = self.net.domain(net_id);
        let catalog = &self.spec.catalog;
        let slot_size = catalog.max_input_bytes().max(1) as u32;
        // Reach the scheduler before mapping the staging region: while no
        // scheduler listens (store down, between leaders) a restart is tried
        // every few virtual milliseconds, and a populated region per failed
        // try made whole sweeps mostly mmap/munmap system time.
        let conn = self.connect_scheduler(&domain, 0).map_err(|e| {
            // Unreachable (partitioned): the daemon would exit.
            self.net.crash(net_id);
            NodeClusterError::SchedulerUnreachable(e)
        })?;
        let conn_b = match &self.group_b {
            Some(b) => Some(domain.connect(&b.addr, Duration::ZERO).map_err(|e| {
                self.net.crash(net_id);
                NodeClusterError::SchedulerUnreachable(e)
            })?),
            None => None,
        };
        let catalog = &self.spec.catalog;
        let region = Region::anonymous(slot_size as usize * self.spec.slots as usize).map_err(memory("frontend staging region"))?;
        let reg = domain.register(&region, Access::REMOTE_READ).map_err(transport("frontend staging registration"))?;
        let staging = Staging::new(reg, StagingConfig { frontend_id: id, slots: self.spec.slots, slot_size, max_output: catalog.max_output_bytes() as u32 })
            .map_err(memory("frontend staging"))?;
        let listener = domain.listen("").map_err(transport("frontend data listener"))?;
        if self.spec.data_link_delay > Duration::ZERO {
            self.net.delay_accepts(&listener.local_addr(), self.spec.data_link_delay);
        }
        let (sink, source) = NetSink::new(self.spec.queue, self.waker.clone());
        let metrics = Arc::new(Metrics::new(catalog));
        let service = ClusterService::new(catalog.clone(), staging.clone(), sink, metrics, self.spec.grace).with_return_margin(self.spec.return_margin);
        let mut node = FrontendNode::new(
            FrontendNodeConfig {
                id,
                data_endpoint: listener.local_addr(),
                models: self.spec.models.len() as u32,
                heartbeat: self.spec.heartbeat,
                dead_after: self.spec.dead_after,
                handshake_timeout: self.spec.handshake,
                coalesce: frontend::node::DEFAULT_COALESCE,
                coalesce_wait: Duration::ZERO,
            },
            staging,
            source,
        )
        .with_join_token(Some(self.spec.join_token.clone()))
        // The data links' challenges replay with the run.
        .with_data_link_nonces(NonceSource::Seeded(DATA_NONCE_SEED ^ u64::from(id)))
        .with_join_nonces(NonceSource::Seeded(JOIN_NONCE_SEED ^ u64::from(id)))
        .with_failover(self.spec.ha.is_some());
        if let Some(conn_b) = conn_b {
            node = node.with_groups(2);
            node.handle_routes(self.frontend_routes.0, &self.frontend_routes.1);
            node.handle_group_link(now, 1, conn_b);
        }
        node.handle_scheduler_link(now, conn.1);
        Ok(FrontendHost { net_id, node, listener, service: Arc::new(service), lost: None, next_addr: conn.0 })
    }

    fn start_backend(&mut self, slot: usize) -> Result<BackendHost, NodeClusterError> {
        let net_id = self.fresh_net_id();
        let id = self.next_backend_id;
        self.next_backend_id += 1;
        let domain = self.net.domain(net_id);
        let spec = &self.spec;
        let wcfg = WorkerConfig {
            max_batch: spec.models.iter().map(|m| m.profile.max_batch()).max().unwrap_or(1).min(wire::MAX_BATCH_TASKS as u32),
            input_slot: spec.catalog.max_input_bytes().max(1) as u32,
            output_slot: spec.catalog.max_output_bytes().max(1) as u32,
            batch_slots: spec.batch_slots_per_gpu * spec.gpus_per_backend,
            max_frontends: wire::MAX_FRONTENDS,
            control_delay: spec.core.delay.d_ctrl,
            fetch_grace: Duration::from_millis(5),
            report_capacity: 1024,
            start_when_ready: true,
        };
        // The scheduler first, as for a frontend: no region for a failed try.
        // With group b, the odd slots are its sub-cluster.
        let sched = match self.group_b.as_ref().filter(|_| slot % 2 == 1) {
            Some(b) => domain.connect(&b.addr, Duration::ZERO).map(|c| (0, c)),
            None => self.connect_scheduler(&domain, 0),
        }
        .map_err(|e| {
            self.net.crash(net_id);
            NodeClusterError::SchedulerUnreachable(e)
        })?;
        let spec = &self.spec;
        let region = Region::anonymous(wcfg.staging_bytes() as usize).map_err(memory("backend staging region"))?;
        let reg = domain.register(&region, Access::LOCAL_WRITE).map_err(transport("backend staging registration"))?;
        let models: Vec<ExecModel> = spec
            .models
            .iter()
            .zip(spec.catalog.entries())
            .map(|(m, e)| ExecModel { profile: m.profile.clone(), output_len: e.output.byte_len() as u32 })
            .collect();
        let exec = EmulatedExecutor::new(region, spec.gpus_per_backend, wcfg.max_batch, models);
        let cfg = BackendNodeConfig {
            id,
            gpus: spec.gpus_per_backend,
            served: (0..spec.models.len() as u32).collect(),
            cluster_models: spec.models.len() as u32,
            max_frontends: wire::MAX_FRONTENDS,
            heartbeat: spec.heartbeat,
            dead_after: spec.dead_after,
            handshake_timeout: spec.handshake,
            replace_timeout: Duration::from_millis(100),
            drain_timeout: Duration::from_millis(1000),
        };
        let next_addr = sched.0;
        let worker = BatchWorker::new(wcfg, exec, reg, sched.1).map_err(NodeClusterError::Worker)?;
        self.backend_net_ids.push(net_id);
        let node = BackendNode::new(cfg, worker)
            .with_join_token(Some(self.spec.join_token.clone()))
            .with_join_nonces(NonceSource::Seeded(JOIN_NONCE_SEED ^ (1 << 32) ^ u64::from(id)))
            .with_failover(self.spec.ha.is_some());
        Ok(BackendHost { net_id, domain, node, lost: None, next_addr })
    }

    /// Connects to the first scheduler address that listens, from address
    /// `from` on (in order, wrapping); returns the index after it.
    fn connect_scheduler(&self, domain: &SimDomain, from: usize) -> Result<(usize, SimConn), dataplane::transport::Error> {
        let n = self.scheds.len();
        let mut last = dataplane::transport::Error::PeerDisconnected;
        for k in 0..n {
            let i = (from + k) % n;
            match domain.connect(&self.scheds[i].addr, Duration::ZERO) {
                Ok(c) => return Ok((i + 1, c)),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Starts every node whose restart time has come. Returns the backend
    /// net ids started (so a tap can learn them before they send).
    fn restart_due(&mut self, now: Instant) {
        let retry = now + self.spec.ha.as_ref().map_or(self.spec.restart_after, |h| h.reconnect_every);
        for i in 0..self.frontends.len() {
            if matches!(self.frontends[i], Slot::Down { restart_at: Some(t) } if t <= now) {
                self.frontends[i] = match self.start_frontend(now) {
                    Ok(h) => Slot::Up(Box::new(h)),
                    Err(_) => Slot::Down { restart_at: Some(retry) },
                };
            }
        }
        for i in 0..self.backends.len() {
            if matches!(self.backends[i], Slot::Down { restart_at: Some(t) } if t <= now) {
                self.backends[i] = match self.start_backend(i) {
                    Ok(mut h) => {
                        for &(_, gpu, factor) in self.spec.gpu_slowdowns.iter().filter(|s| s.0 == i) {
                            h.node.worker_mut().executor_mut().set_slowdown(gpu, factor);
                        }
                        Slot::Up(Box::new(h))
                    }
                    Err(_) => Slot::Down { restart_at: Some(retry) },
                };
            }
        }
    }

    /// Takes frontend `i` down (crash: its links break at once); it comes
    /// back at `restart_at`. Returns whether it was up.
    pub fn kill_frontend(&mut self, i: usize, restart_at: Option<Instant>) -> bool {
        match self.frontends.get_mut(i).map(|s| std::mem::replace(s, Slot::Down { restart_at })) {
            Some(Slot::Up(h)) => {
                self.net.crash(h.net_id);
                true
            }
            _ => false,
        }
    }

    /// Takes backend `i` down; returns the batches it held, if it was up.
    pub fn kill_backend(&mut self, i: usize, restart_at: Option<Instant>) -> Option<usize> {
        match self.backends.get_mut(i).map(|s| std::mem::replace(s, Slot::Down { restart_at })) {
            Some(Slot::Up(h)) => {
                self.net.crash(h.net_id);
                self.busy_rejections += h.node.worker().executor().busy_rejections();
                Some(h.node.worker().batches_in_flight())
            }
            _ => None,
        }
    }

    /// The net id of a node, if up: the scheduler is `Target` 0.
    pub fn frontend_net_id(&self, i: usize) -> Option<NodeId> {
        self.frontend(i).map(|h| h.net_id)
    }

    /// The net id of backend `i`, if up.
    pub fn backend_net_id(&self, i: usize) -> Option<NodeId> {
        self.backend(i).map(|h| h.net_id)
    }

    /// Polls every node at `now` until a whole round makes no progress
    /// (bounded), restarting nodes that are due; `on` hears what happened.
    pub fn poll(&mut self, now: Instant, on: &mut impl FnMut(ClusterEvent)) {
        self.net.set_now(now);
        if self.spec.ha.is_some() {
            // A leader elected at this instant listens before peers start.
            self.poll_schedulers(now);
        }
        self.restart_due(now);
        for _round in 0..64 {
            let mut progressed = self.poll_schedulers(now);
            for (id, away) in self.new_terms_routes.drain(..) {
                on(ClusterEvent::RoutesApplied(id, away));
            }
            for i in 0..self.frontends.len() {
                progressed |= self.poll_frontend(i, now, on);
            }
            for i in 0..self.backends.len() {
                progressed |= self.poll_backend(i, now, on);
            }
            if !progressed {
                return;
            }
        }
    }

    /// The scheduler nodes: heartbeats from the leader to the standbys it
    /// is linked with, each running candidate's election (a new leader
    /// gets a fresh node of its epoch and listens; one that steps down
    /// drops its node, so its links close), then each leader's node.
    fn poll_schedulers(&mut self, now: Instant) -> bool {
        let mut progressed = false;
        let n = self.scheds.len();
        for i in 0..n {
            if !self.scheds[i].running(now) {
                continue;
            }
            let Some(epoch) = self.scheds[i].candidate.as_ref().and_then(|c| c.leading()) else { continue };
            for j in (0..n).filter(|&j| j != i) {
                let cut = self.cut.iter().any(|&(a, b)| (a, b) == (i, j) || (a, b) == (j, i));
                if cut || !self.scheds[j].running(now) {
                    continue;
                }
                if let Some(c) = self.scheds[j].candidate.as_mut() {
                    c.handle_heartbeat(now, epoch);
                }
            }
        }
        for i in 0..n {
            if !self.scheds[i].running(now) {
                continue;
            }
            self.scheds[i].paused_until = None;
            let mut elected = None;
            let mut stepped_down = false;
            if let Some(c) = self.scheds[i].candidate.as_mut() {
                progressed |= c.poll(now);
                while let Some(ev) = c.poll_event() {
                    progressed = true;
                    match ev {
                        RoleEvent::Elected { epoch } => elected = Some(epoch),
                        RoleEvent::SteppedDown { .. } => stepped_down = true,
                        RoleEvent::Following(_) | RoleEvent::LeaderSilent(_) => {}
                    }
                }
            }
            if stepped_down || elected.is_some() {
                let h = &mut self.scheds[i];
                h.listener = None;
                if let Some(old) = h.node.take() {
                    self.retired_overlaps += old.plane().overlapping_plans();
                }
            }
            if let Some(epoch) = elected {
                let epoch = u32::try_from(epoch).unwrap_or(u32::MAX);
                if let Ok(mut node) = build_scheduler(&self.spec, &self.admissions, epoch) {
                    if let Some(table) = &self.routes_a {
                        // As the daemon: a new term owns nothing until it
                        // has applied the newest table, which it does first.
                        node.plane_mut().await_routes();
                        node.handle_routes(now, table, "a");
                        let models = self.spec.models.len() as u32;
                        self.new_terms_routes.push((self.scheds[i].net_id, (0..models).map(|m| !node.owns(m)).collect()));
                    }
                    let h = &mut self.scheds[i];
                    h.listener = self.net.domain(h.net_id).listen(&h.addr).ok();
                    h.node = Some(node);
                }
            }
            progressed |= self.scheds[i].run(now);
        }
        if let Some(h) = self.group_b.as_mut() {
            progressed |= h.run(now);
        }
        progressed
    }

    /// With failover, a peer without a scheduler tries the addresses from
    /// the next one on when due; returns the link if one connected (then
    /// it registers over it: no new try until that fails). `lost` holds
    /// the next address and when to try; `next` the address after the
    /// last link's.
    fn reconnect_due(&self, lost: &mut Option<(usize, Instant)>, next: &mut usize, domain: &SimDomain, now: Instant) -> Option<SimConn> {
        let (from, at) = (*lost)?;
        if now < at {
            return None;
        }
        let every = self.spec.ha.as_ref().map_or(self.spec.restart_after, |h| h.reconnect_every);
        match self.connect_scheduler(domain, from) {
            Ok((after, conn)) => {
                *lost = None;
                *next = after;
                Some(conn)
            }
            Err(_) => {
                *lost = Some((from, now + every));
                None
            }
        }
    }

    fn poll_frontend(&mut self, i: usize, now: Instant, on: &mut impl FnMut(ClusterEvent)) -> bool {
        let Slot::Up(h) = &mut self.frontends[i] else { return false };
        let mut progressed = false;
        while let Ok(conn) = h.listener.accept(Duration::ZERO) {
            h.node.handle_backend_link(now, conn);
            progressed = true;
        }
        progressed |= h.node.poll(now);
        let mut exit = false;
        let failover = self.spec.ha.is_some();
        while let Some(e) = h.node.poll_event() {
            progressed = true;
            match e {
                FrontendEvent::SchedulerLost { .. } | FrontendEvent::Refused { .. } if failover => {
                    h.lost = Some((h.next_addr, now));
                }
                FrontendEvent::SchedulerLost { .. } | FrontendEvent::Refused { .. } => exit = true,
                _ => {}
            }
        }
        if failover && h.lost.is_some() {
            let domain = self.net.domain(h.net_id);
            let (mut lost, mut next) = (h.lost, h.next_addr);
            let conn = self.reconnect_due(&mut lost, &mut next, &domain, now);
            if let Slot::Up(h) = &mut self.frontends[i] {
                if let Some(conn) = conn {
                    h.node.handle_scheduler_link(now, conn);
                    progressed = true;
                }
                (h.lost, h.next_addr) = (lost, next);
            }
        }
        if exit {
            // The daemon exits; its supervisor restarts it.
            on(ClusterEvent::FrontendExited(i));
            self.kill_frontend(i, Some(now + self.spec.restart_after));
        }
        progressed
    }

    fn poll_backend(&mut self, i: usize, now: Instant, on: &mut impl FnMut(ClusterEvent)) -> bool {
        let failover = self.spec.ha.is_some();
        let Slot::Up(h) = &mut self.backends[i] else { return false };
        let mut progressed = h.node.poll(now);
        let mut exit = false;
        while let Some(e) = h.node.poll_event() {
            progressed = true;
            match e {
                BackendEvent::ConnectFrontend { id, endpoint } => {
                    if let Ok(conn) = h.domain.connect(&endpoint, Duration::ZERO) {
                        h.node.handle_frontend_link(now, id, conn);
                    }
                }
                BackendEvent::SchedulerLost { .. } | BackendEvent::Refused { .. } if failover => {
                    h.lost = Some((h.next_addr, now));
                }
                BackendEvent::SchedulerLost { .. } | BackendEvent::Refused { .. } | BackendEvent::Failed(_) => exit = true,
                _ => {}
            }
        }
        // Refused at its first registration, a node is done: restarted.
        exit |= failover && h.node.drained();
        if failover && !exit && h.node.scheduler_lost() && h.lost.is_some() {
            let (mut lost, mut next) = (h.lost, h.next_addr);
            let domain = self.net.domain(h.net_id);
            let conn = self.reconnect_due(&mut lost, &mut next, &domain, now);
            if let Slot::Up(h) = &mut self.backends[i] {
                if let Some(conn) = conn {
                    drop(h.node.handle_scheduler_link(conn));
                    progressed = true;
                }
                (h.lost, h.next_addr) = (lost, next);
            }
        }
        let Slot::Up(h) = &mut self.backends[i] else { return progressed };
        while let Some(r) = h.node.worker_mut().pop_report() {
            on(ClusterEvent::Batch(i, r));
        }
        if exit {
            on(ClusterEvent::BackendExited(i));
            self.kill_backend(i, Some(now + self.spec.restart_after));
        }
        progressed
    }

    /// When the cluster next has something to do by itself: a node's
    /// timer, a delivery on the network, a restart.
    pub fn next_wakeup(&self) -> Option<Instant> {
        let mut t = self.net.next_event_at();
        let mut take = |x: Option<Instant>| {
            if let Some(x) = x {
                t = Some(t.map_or(x, |y| y.min(x)));
            }
        };
        take(self.group_b().and_then(|n| n.poll_at()));
        for h in self.scheds.iter().filter(|h| !h.crashed) {
            if let Some(p) = h.paused_until {
                take(Some(p));
                continue;
            }
            take(h.node.as_ref().and_then(|n| n.poll_at()));
            take(h.candidate.as_ref().and_then(|c| c.poll_at()));
        }
        for f in &self.frontends {
            match f {
                Slot::Up(h) => {
                    take(h.node.poll_at());
                    take(h.lost.map(|l| l.1));
                }
                Slot::Down { restart_at } => take(*restart_at),
            }
        }
        for b in &self.backends {
            match b {
                Slot::Up(h) => {
                    take(h.node.poll_at());
                    take(h.lost.map(|l| l.1));
                }
                Slot::Down { restart_at } => take(*restart_at),
            }
        }
        t
    }
}
