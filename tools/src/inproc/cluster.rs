//! A whole cluster of real nodes in one thread: the scheduler node,
//! frontend nodes (each with its staging area and `ClusterService`) and
//! backend nodes (each a `BatchWorker` over emulated GPUs), connected by
//! the `sim` transport. The caller owns the clock: [`NodeCluster::poll`]
//! takes `now` and [`NodeCluster::next_wakeup`] says when to come back, so
//! the chaos harness drives it on virtual time and the in-process server on
//! the real clock. Nodes that exit (a frontend or backend that lost its
//! scheduler) are restarted after a delay, as a supervisor would.

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
use scheduler::deferred::CoreConfig;
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
}

/// The harness's fixed join token (deterministic runs; never a real
/// cluster's).
pub const TEST_JOIN_TOKEN: &[u8] = b"symphony-inproc-test-join-token";
/// Seed of the scheduler's challenge nonces in the harness.
const NONCE_SEED: u64 = 0x6e6f_6e63_6573;

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
        }
    }
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
}

/// A running backend node and what its host holds.
pub struct BackendHost {
    /// Its node on the network.
    pub net_id: NodeId,
    domain: SimDomain,
    /// The node.
    pub node: BackendNode<SimConn, EmulatedExecutor>,
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
}

/// The cluster (see the module docs).
pub struct NodeCluster {
    spec: ClusterSpec,
    net: SimNet,
    sched: SchedulerNode<SimConn>,
    sched_listener: SimListener,
    sched_addr: String,
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
}

impl NodeCluster {
    /// A cluster on `net` (node 0 is the scheduler); every frontend and
    /// backend starts at the first poll.
    pub fn new(spec: ClusterSpec, net: SimNet, waker: Option<dataplane::waitset::Notifier>) -> Result<NodeCluster, NodeClusterError> {
        let all: Vec<u32> = (0..spec.models.len() as u32).collect();
        let metrics = Arc::new(SchedulerMetrics::new(&spec.models));
        let mut plane = ControlPlane::new(spec.models.clone(), &[all], spec.core, metrics)
            .map_err(|e| NodeClusterError::ControlPlane { what: e.to_string() })?;
        plane.set_closed_loop(spec.closed_loop);
        plane.set_delay_watch("sim", spec.delay_watch);
        let sched = SchedulerNode::new(
            plane,
            NodeConfig {
                heartbeat: spec.heartbeat,
                dead_after: spec.dead_after,
                handshake_timeout: spec.handshake,
                batch_grace: spec.dead_after,
                ..NodeConfig::default()
            },
        )
        .with_membership(Membership {
            nonces: NonceSource::Seeded(NONCE_SEED),
            ..Membership::with_token(spec.join_token.clone())
        });
        let sched_listener = net.domain(0).listen("sim:scheduler").map_err(transport("scheduler listener"))?;
        let sched_addr = sched_listener.local_addr();
        Ok(NodeCluster {
            frontends: (0..spec.frontends).map(|_| Slot::Down { restart_at: Some(Instant::ZERO) }).collect(),
            backends: (0..spec.backends).map(|_| Slot::Down { restart_at: Some(Instant::ZERO) }).collect(),
            spec,
            net,
            sched,
            sched_listener,
            sched_addr,
            next_net_id: 1,
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

    /// The scheduler node.
    pub fn scheduler(&self) -> &SchedulerNode<SimConn> {
        &self.sched
    }

    /// The scheduler node, to configure it.
    pub fn scheduler_mut(&mut self) -> &mut SchedulerNode<SimConn> {
        &mut self.sched
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
        let region = Region::anonymous(slot_size as usize * self.spec.slots as usize).map_err(memory("frontend staging region"))?;
        let reg = domain.register(&region, Access::REMOTE_READ).map_err(transport("frontend staging registration"))?;
        let staging = Staging::new(reg, StagingConfig { frontend_id: id, slots: self.spec.slots, slot_size, max_output: catalog.max_output_bytes() as u32 })
            .map_err(memory("frontend staging"))?;
        let listener = domain.listen("").map_err(transport("frontend data listener"))?;
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
            },
            staging,
            source,
        )
        .with_join_token(Some(self.spec.join_token.clone()));
        let conn = domain.connect(&self.sched_addr, Duration::ZERO).map_err(|e| {
            // Unreachable (partitioned): the daemon would exit.
            self.net.crash(net_id);
            NodeClusterError::SchedulerUnreachable(e)
        })?;
        node.handle_scheduler_link(now, conn);
        Ok(FrontendHost { net_id, node, listener, service: Arc::new(service) })
    }

    fn start_backend(&mut self) -> Result<BackendHost, NodeClusterError> {
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
        let sched = domain.connect(&self.sched_addr, Duration::ZERO).map_err(|e| {
            self.net.crash(net_id);
            NodeClusterError::SchedulerUnreachable(e)
        })?;
        let worker = BatchWorker::new(wcfg, exec, reg, sched).map_err(NodeClusterError::Worker)?;
        self.backend_net_ids.push(net_id);
        let node = BackendNode::new(cfg, worker).with_join_token(Some(spec.join_token.clone()));
        Ok(BackendHost { net_id, domain, node })
    }

    /// Starts every node whose restart time has come. Returns the backend
    /// net ids started (so a tap can learn them before they send).
    fn restart_due(&mut self, now: Instant) {
        let retry = now + self.spec.restart_after;
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
                self.backends[i] = match self.start_backend() {
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
        self.restart_due(now);
        for _round in 0..64 {
            let mut progressed = false;
            while let Ok(conn) = self.sched_listener.accept(Duration::ZERO) {
                self.sched.handle_connection(now, conn);
                progressed = true;
            }
            progressed |= self.sched.poll(now);
            while self.sched.poll_event().is_some() {
                progressed = true;
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

    fn poll_frontend(&mut self, i: usize, now: Instant, on: &mut impl FnMut(ClusterEvent)) -> bool {
        let Slot::Up(h) = &mut self.frontends[i] else { return false };
        let mut progressed = false;
        while let Ok(conn) = h.listener.accept(Duration::ZERO) {
            h.node.handle_backend_link(now, conn);
            progressed = true;
        }
        progressed |= h.node.poll(now);
        let mut exit = false;
        while let Some(e) = h.node.poll_event() {
            progressed = true;
            exit |= matches!(e, FrontendEvent::SchedulerLost { .. } | FrontendEvent::Refused { .. });
        }
        if exit {
            // The daemon exits; its supervisor restarts it.
            on(ClusterEvent::FrontendExited(i));
            self.kill_frontend(i, Some(now + self.spec.restart_after));
        }
        progressed
    }

    fn poll_backend(&mut self, i: usize, now: Instant, on: &mut impl FnMut(ClusterEvent)) -> bool {
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
                BackendEvent::SchedulerLost { .. } | BackendEvent::Refused { .. } | BackendEvent::Failed { .. } => exit = true,
                _ => {}
            }
        }
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
        let mut t = [self.sched.poll_at(), self.net.next_event_at()].into_iter().flatten().min();
        let mut take = |x: Option<Instant>| {
            if let Some(x) = x {
                t = Some(t.map_or(x, |y| y.min(x)));
            }
        };
        for f in &self.frontends {
            match f {
                Slot::Up(h) => take(h.node.poll_at()),
                Slot::Down { restart_at } => take(*restart_at),
            }
        }
        for b in &self.backends {
            match b {
                Slot::Up(h) => take(h.node.poll_at()),
                Slot::Down { restart_at } => take(*restart_at),
            }
        }
        t
    }
}
