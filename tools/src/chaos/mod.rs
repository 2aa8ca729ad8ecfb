//! The deterministic cluster harness behind `symphony chaos`.
//!
//! A whole cluster — the scheduler node, frontend nodes and backend nodes,
//! the same nodes the daemons run — lives in one thread on virtual time,
//! connected by the `sim` transport (`dataplane::transport::sim`), whose
//! seeded fault generator loses, duplicates and reorders messages; the
//! harness adds partitions, crash-restarts and slow GPUs from a seeded
//! schedule. An open-loop client sends requests at their intended times
//! (the simulator's arrival generator) through each frontend's real
//! `ClusterService` and classifies every outcome by the virtual time it
//! came. Everything is a function of the seed: the same seed replays the
//! same trace, and [`ChaosReport::trace_hash`] proves it.
//!
//! After every run the harness checks ([`checks`]):
//! - every request the client sent ended exactly once (`unaccounted = 0`);
//!   a request whose frontend crashed under it ends once as failed with
//!   reason `frontend_lost`;
//! - no batch was planned onto a GPU still busy with another planned batch,
//!   and no executor refused a batch for a busy device;
//! - no task was executed twice (every successful completion a backend
//!   sent is counted, before the network could duplicate it);
//! - nothing late is reported as on time: each frontend's own outcome
//!   counters agree with what the client saw from it, and an answer that
//!   reached the client after its deadline is counted late, never good;
//! - every output is the reference output of its own input.
//!
//! The scheduler is not crashed here (it is a single point of failure
//! until the failover issue lands); it can be partitioned.

pub mod checks;
pub mod client;
pub mod faults;
pub mod sweep;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use backend::exec::emulated::EmulatedExecutor;
use backend::exec::ExecModel;
use backend::node::{BackendEvent, BackendNode, BackendNodeConfig};
use backend::worker::{BatchWorker, WorkerConfig};
use dataplane::mem::{Access, Region};
use dataplane::time::{Duration, Instant};
use dataplane::transport::sim::{FaultCounts, NodeId, SimConn, SimDomain, SimNet};
use dataplane::transport::{Domain, Listener};
use dataplane::wire;
use frontend::node::{FrontendEvent, FrontendNode, FrontendNodeConfig, NetSink};
use frontend::metrics::Metrics;
use frontend::models::ModelCatalog;
use frontend::service::ClusterService;
use frontend::staging::{Staging, StagingConfig};
use scheduler::daemon::metrics::SchedulerMetrics;
use scheduler::daemon::node::{NodeConfig, SchedulerEvent, SchedulerNode};
use scheduler::daemon::plane::ControlPlane;
use scheduler::deferred::CoreConfig;
use scheduler::netdelay::NetworkDelay;
use scheduler::zoo::ModelSpec;
use serde::Serialize;

pub use faults::{FaultClass, FaultSet};

use client::Client;
use faults::{Event, Target};

/// A deliberately broken node, to prove the checks catch what they claim.
/// Only in builds with the `mutations` feature.
pub use dataplane::mutation::Mutation;

/// One harness run.
#[derive(Clone, Debug)]
pub struct ChaosConfig {
    /// Seed of the workload, the fault schedule and the network's faults.
    pub seed: u64,
    /// Fault classes injected.
    pub faults: FaultSet,
    /// Arrivals stop after this much virtual time (after the start-up).
    pub duration: Duration,
    /// Frontend nodes.
    pub frontends: usize,
    /// Backend nodes.
    pub backends: usize,
    /// Emulated GPUs per backend.
    pub gpus_per_backend: u32,
    /// The cluster's models.
    pub models: Vec<ModelSpec>,
    /// Offered load, requests per second over all models.
    pub rate_rps: f64,
    /// A deliberate bug to switch on (mutation testing).
    pub mutation: Option<Mutation>,
}

impl ChaosConfig {
    /// The default cluster: 3 frontends, 4 backends of one GPU, two A100
    /// models at about half the cluster's capacity.
    pub fn new(seed: u64, faults: FaultSet, duration: Duration) -> Self {
        let models = vec![
            ModelSpec::linear("ResNet50", 1.053, 5.072, 25.0).unwrap_or_else(|_| unreachable!()),
            ModelSpec::linear("InceptionV3", 1.130, 7.400, 50.0).unwrap_or_else(|_| unreachable!()),
        ];
        ChaosConfig { seed, faults, duration, frontends: 3, backends: 4, gpus_per_backend: 1, models, rate_rps: 800.0, mutation: None }
    }

    /// The command that replays this run.
    pub fn replay_command(&self) -> String {
        let mut s = format!(
            "symphony chaos --seed {} --faults {} --duration-s {} --frontends {} --backends {} --rate {}",
            self.seed,
            self.faults.names(),
            self.duration.as_secs_f64(),
            self.frontends,
            self.backends,
            self.rate_rps
        );
        if let Some(m) = self.mutation {
            s.push_str(&format!(" --mutation {}", m.as_str()));
        }
        s
    }
}

/// What a run did and whether every invariant held.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ChaosReport {
    /// The seed.
    pub seed: u64,
    /// The fault classes injected.
    pub fault_classes: String,
    /// Requests the client sent.
    pub accepted: u64,
    /// Answered with the right output before the deadline.
    pub succeeded: u64,
    /// Answered with the right output after the deadline.
    pub late: u64,
    /// Dropped by the scheduler, by reason.
    pub dropped: BTreeMap<String, u64>,
    /// Failed, by reason (`frontend_lost`, `timed_out`, `refused`, backend statuses).
    pub failed: BTreeMap<String, u64>,
    /// Sent but never ended (must be 0).
    pub unaccounted: u64,
    /// Faults that hit something in flight, by class.
    pub faults: BTreeMap<String, u64>,
    /// Hash of every message and fault, in order.
    pub trace_hash: String,
    /// Broken invariants (must be empty).
    pub violations: Vec<String>,
    /// The command that replays this run.
    pub replay: String,
    /// Batches executed.
    pub batches: u64,
    /// Virtual time simulated, seconds.
    pub virtual_s: f64,
}

impl ChaosReport {
    /// Total drops.
    pub fn dropped_total(&self) -> u64 {
        self.dropped.values().sum()
    }
    /// Total failures.
    pub fn failed_total(&self) -> u64 {
        self.failed.values().sum()
    }
    /// Whether every invariant held.
    pub fn ok(&self) -> bool {
        self.violations.is_empty() && self.unaccounted == 0
    }
}

/// Liveness and handshake timing of every node (the daemons' defaults).
const HEARTBEAT: Duration = Duration::from_millis(100);
const DEAD_AFTER: Duration = Duration::from_millis(1000);
const HANDSHAKE: Duration = Duration::from_millis(1000);
/// Control delay bound the scheduler charges and the backends subtract.
const CONTROL_DELAY: Duration = Duration::from_micros(200);
/// Part of each budget kept for the answer's way back.
const RETURN_MARGIN: Duration = Duration::from_micros(700);
/// How long past its budget a request waits before giving up (the daemon's `--grace-ms` default).
const GRACE: Duration = Duration::from_millis(100);
/// Faults start after the cluster has formed.
const STARTUP: Duration = Duration::from_millis(50);
/// Input bytes of every request (the default tensor).
const SLOTS_PER_FRONTEND: u32 = 512;

struct FrontendHost {
    net_id: NodeId,
    node: FrontendNode<SimConn>,
    listener: <SimDomain as Domain>::Listener,
    service: ClusterService<NetSink>,
    staging: Arc<Staging>,
}

struct BackendHost {
    net_id: NodeId,
    domain: SimDomain,
    node: BackendNode<SimConn, EmulatedExecutor>,
}

enum Slot<T> {
    Up(Box<T>),
    Down { restart_at: Option<Instant> },
}

/// The cluster and everything that drives it.
struct Harness {
    cfg: ChaosConfig,
    net: SimNet,
    now: Instant,
    sched: SchedulerNode<SimConn>,
    sched_listener: <SimDomain as Domain>::Listener,
    sched_addr: String,
    frontends: Vec<Slot<FrontendHost>>,
    backends: Vec<Slot<BackendHost>>,
    next_net_id: NodeId,
    next_frontend_id: u16,
    next_backend_id: u32,
    catalog: Arc<ModelCatalog>,
    events: Vec<(Instant, Event)>,
    next_event: usize,
    /// Partitions in force, by target pair, with their end.
    partitions: Vec<(Target, Target, Instant)>,
    slow: Vec<(usize, u32, Instant)>,
    client: Client,
    ledger: Arc<Mutex<checks::Ledger>>,
    violations: Vec<String>,
    slow_batches: u64,
    /// Requests and batches in flight on nodes when they crashed.
    crash_hits: u64,
    batches: u64,
    busy_rejections: u64,
}

impl Harness {
    fn new(cfg: ChaosConfig) -> Result<Harness, String> {
        let net = SimNet::new(cfg.seed, faults::message_faults(cfg.faults, Instant::ZERO + STARTUP));
        let ledger = Arc::new(Mutex::new(checks::Ledger::default()));
        {
            let ledger = ledger.clone();
            net.set_tap(Box::new(move |t| {
                if let Ok(mut l) = ledger.lock() {
                    l.observe(t);
                }
            }));
        }
        let core = CoreConfig { delay: NetworkDelay { d_ctrl: CONTROL_DELAY, d_data: Duration::ZERO }, ..CoreConfig::default() };
        let all: Vec<u32> = (0..cfg.models.len() as u32).collect();
        let metrics = Arc::new(SchedulerMetrics::new(&cfg.models));
        let plane = ControlPlane::new(cfg.models.clone(), &[all], core, metrics).map_err(|e| e.to_string())?;
        let sched = SchedulerNode::new(plane, NodeConfig { heartbeat: HEARTBEAT, dead_after: DEAD_AFTER, handshake_timeout: HANDSHAKE, batch_grace: DEAD_AFTER, ..NodeConfig::default() });
        let sched_domain = net.domain(0);
        let sched_listener = sched_domain.listen("sim:scheduler").map_err(|e| e.to_string())?;
        let sched_addr = sched_listener.local_addr();
        let catalog = Arc::new(ModelCatalog::with_default_tensors(&cfg.models));
        let start = Instant::ZERO + STARTUP;
        let end = start + cfg.duration;
        let events = faults::schedule(cfg.faults, cfg.seed, start, end, cfg.frontends, cfg.backends, cfg.gpus_per_backend);
        let client = Client::new(&cfg, catalog.clone(), start);
        let mut h = Harness {
            frontends: (0..cfg.frontends).map(|_| Slot::Down { restart_at: Some(Instant::ZERO) }).collect(),
            backends: (0..cfg.backends).map(|_| Slot::Down { restart_at: Some(Instant::ZERO) }).collect(),
            cfg,
            net,
            now: Instant::ZERO,
            sched,
            sched_listener,
            sched_addr,
            next_net_id: 1,
            next_frontend_id: 1,
            next_backend_id: 1,
            catalog,
            events,
            next_event: 0,
            partitions: Vec::new(),
            slow: Vec::new(),
            client,
            ledger,
            violations: Vec::new(),
            slow_batches: 0,
            crash_hits: 0,
            batches: 0,
            busy_rejections: 0,
        };
        #[cfg(feature = "mutations")]
        dataplane::mutation::set(h.cfg.mutation);
        #[cfg(not(feature = "mutations"))]
        if h.cfg.mutation.is_some() {
            return Err("mutations need a build with the `mutations` feature".into());
        }
        h.restart_due();
        Ok(h)
    }

    fn fresh_net_id(&mut self) -> NodeId {
        let id = self.next_net_id;
        self.next_net_id += 1;
        id
    }

    fn start_frontend(&mut self) -> Result<FrontendHost, String> {
        let net_id = self.fresh_net_id();
        let id = self.next_frontend_id;
        self.next_frontend_id = self.next_frontend_id.checked_add(1).ok_or("frontend ids exhausted")?;
        let domain = self.net.domain(net_id);
        let slot_size = self.catalog.max_input_bytes().max(1) as u32;
        let region = Region::anonymous((slot_size as usize) * SLOTS_PER_FRONTEND as usize).map_err(|e| e.to_string())?;
        let reg = domain.register(&region, Access::REMOTE_READ).map_err(|e| e.to_string())?;
        let staging = Staging::new(
            reg,
            StagingConfig { frontend_id: id, slots: SLOTS_PER_FRONTEND, slot_size, max_output: self.catalog.max_output_bytes() as u32 },
        )
        .map_err(|e| e.to_string())?;
        let listener = domain.listen("").map_err(|e| e.to_string())?;
        let (sink, source) = NetSink::new(4096, None);
        let metrics = Arc::new(Metrics::new(&self.catalog));
        let service = ClusterService::new(self.catalog.clone(), staging.clone(), sink, metrics, GRACE).with_return_margin(RETURN_MARGIN);
        let mut node = FrontendNode::new(
            FrontendNodeConfig {
                id,
                data_endpoint: listener.local_addr(),
                models: self.cfg.models.len() as u32,
                heartbeat: HEARTBEAT,
                dead_after: DEAD_AFTER,
                handshake_timeout: HANDSHAKE,
            },
            staging.clone(),
            source,
        );
        match domain.connect(&self.sched_addr, Duration::ZERO) {
            Ok(conn) => node.handle_scheduler_link(self.now, conn),
            Err(_) => {
                // The scheduler is unreachable (partition): the daemon
                // would exit; the supervisor retries later.
                self.net.crash(net_id);
                return Err("scheduler unreachable".into());
            }
        }
        Ok(FrontendHost { net_id, node, listener, service, staging })
    }

    fn start_backend(&mut self) -> Result<BackendHost, String> {
        let net_id = self.fresh_net_id();
        let id = self.next_backend_id;
        self.next_backend_id += 1;
        let domain = self.net.domain(net_id);
        let wcfg = WorkerConfig {
            max_batch: self.cfg.models.iter().map(|m| m.profile.max_batch()).max().unwrap_or(1).min(wire::MAX_BATCH_TASKS as u32),
            input_slot: self.catalog.max_input_bytes().max(1) as u32,
            output_slot: self.catalog.max_output_bytes().max(1) as u32,
            batch_slots: 3 * self.cfg.gpus_per_backend,
            max_frontends: wire::MAX_FRONTENDS,
            control_delay: CONTROL_DELAY,
            fetch_grace: Duration::from_millis(5),
            report_capacity: 1024,
            start_when_ready: true,
        };
        let region = Region::anonymous(wcfg.staging_bytes() as usize).map_err(|e| e.to_string())?;
        let reg = domain.register(&region, Access::LOCAL_WRITE).map_err(|e| e.to_string())?;
        let models: Vec<ExecModel> = self
            .cfg
            .models
            .iter()
            .zip(self.catalog.entries())
            .map(|(m, e)| ExecModel { profile: m.profile.clone(), output_len: e.output.byte_len() as u32 })
            .collect();
        let exec = EmulatedExecutor::new(region, self.cfg.gpus_per_backend, wcfg.max_batch, models);
        let sched = match domain.connect(&self.sched_addr, Duration::ZERO) {
            Ok(c) => c,
            Err(_) => {
                self.net.crash(net_id);
                return Err("scheduler unreachable".into());
            }
        };
        let worker = BatchWorker::new(wcfg, exec, reg, sched).map_err(|e| e.to_string())?;
        let served: Vec<u32> = (0..self.cfg.models.len() as u32).collect();
        let node = BackendNode::new(
            BackendNodeConfig {
                id,
                gpus: self.cfg.gpus_per_backend,
                served,
                cluster_models: self.cfg.models.len() as u32,
                max_frontends: wire::MAX_FRONTENDS,
                heartbeat: HEARTBEAT,
                dead_after: DEAD_AFTER,
                handshake_timeout: HANDSHAKE,
                replace_timeout: Duration::from_millis(100),
                drain_timeout: Duration::from_millis(1000),
            },
            worker,
        );
        if let Ok(mut l) = self.ledger.lock() {
            l.backends.insert(net_id);
        }
        Ok(BackendHost { net_id, domain, node })
    }

    /// Starts every node whose restart time has come.
    fn restart_due(&mut self) {
        for i in 0..self.frontends.len() {
            if matches!(self.frontends[i], Slot::Down { restart_at: Some(t) } if t <= self.now) {
                self.frontends[i] = match self.start_frontend() {
                    Ok(h) => Slot::Up(Box::new(h)),
                    Err(_) => Slot::Down { restart_at: Some(self.now + DEAD_AFTER) },
                };
            }
        }
        for i in 0..self.backends.len() {
            if matches!(self.backends[i], Slot::Down { restart_at: Some(t) } if t <= self.now) {
                self.backends[i] = match self.start_backend() {
                    Ok(h) => Slot::Up(Box::new(h)),
                    Err(_) => Slot::Down { restart_at: Some(self.now + DEAD_AFTER) },
                };
            }
        }
    }

    fn net_id(&self, t: Target) -> Option<NodeId> {
        match t {
            Target::Scheduler => Some(0),
            Target::Frontend(i) => match self.frontends.get(i)? {
                Slot::Up(h) => Some(h.net_id),
                Slot::Down { .. } => None,
            },
            Target::Backend(i) => match self.backends.get(i)? {
                Slot::Up(h) => Some(h.net_id),
                Slot::Down { .. } => None,
            },
        }
    }

    /// Takes a frontend down: its process is gone, so every request the
    /// client had open on it ends as `frontend_lost`.
    fn kill_frontend(&mut self, i: usize, restart_at: Option<Instant>) {
        if let Slot::Up(h) = std::mem::replace(&mut self.frontends[i], Slot::Down { restart_at }) {
            self.net.crash(h.net_id);
            self.crash_hits += self.client.frontend_lost(i);
        }
    }

    fn kill_backend(&mut self, i: usize, restart_at: Option<Instant>) {
        if let Slot::Up(h) = std::mem::replace(&mut self.backends[i], Slot::Down { restart_at }) {
            self.net.crash(h.net_id);
            self.crash_hits += h.node.worker().batches_in_flight() as u64;
            self.busy_rejections += h.node.worker().executor().busy_rejections();
        }
    }

    fn apply_event(&mut self, e: Event) {
        match e {
            Event::Partition { a, b, until } => {
                if let (Some(x), Some(y)) = (self.net_id(a), self.net_id(b)) {
                    self.net.partition(x, y);
                    self.partitions.push((a, b, until));
                }
            }
            Event::Crash { node, restart_at } => match node {
                Target::Frontend(i) => self.kill_frontend(i, Some(restart_at)),
                Target::Backend(i) => self.kill_backend(i, Some(restart_at)),
                Target::Scheduler => {}
            },
            Event::SlowGpu { backend, gpu, factor, until } => {
                if let Some(Slot::Up(h)) = self.backends.get_mut(backend) {
                    h.node.worker_mut().executor_mut().set_slowdown(gpu, factor);
                    self.net.record(0x534c_4f57, u64::from(gpu));
                    self.slow.push((backend, gpu, until));
                }
            }
        }
    }

    fn heal_due(&mut self) {
        let now = self.now;
        let mut i = 0;
        while i < self.partitions.len() {
            let (a, b, until) = self.partitions[i];
            if until <= now {
                if let (Some(x), Some(y)) = (self.net_id(a), self.net_id(b)) {
                    self.net.heal(x, y);
                }
                self.partitions.swap_remove(i);
            } else {
                i += 1;
            }
        }
        let mut i = 0;
        while i < self.slow.len() {
            let (b, g, until) = self.slow[i];
            if until <= now {
                if let Some(Slot::Up(h)) = self.backends.get_mut(b) {
                    h.node.worker_mut().executor_mut().set_slowdown(g, 1.0);
                }
                self.slow.swap_remove(i);
            } else {
                i += 1;
            }
        }
    }

    /// Polls every node until a whole round makes no progress.
    fn poll_nodes(&mut self) {
        let now = self.now;
        for _round in 0..64 {
            let mut progressed = false;
            while let Ok(conn) = self.sched_listener.accept(Duration::ZERO) {
                self.sched.handle_connection(now, conn);
                progressed = true;
            }
            progressed |= self.sched.poll(now);
            while let Some(e) = self.sched.poll_event() {
                progressed = true;
                let _: SchedulerEvent = e;
            }
            for i in 0..self.frontends.len() {
                progressed |= self.poll_frontend(i);
            }
            for i in 0..self.backends.len() {
                progressed |= self.poll_backend(i);
            }
            if !progressed {
                return;
            }
        }
    }

    fn poll_frontend(&mut self, i: usize) -> bool {
        let now = self.now;
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
            if matches!(e, FrontendEvent::SchedulerLost { .. } | FrontendEvent::Refused { .. }) {
                exit = true;
            }
        }
        if exit {
            // The daemon exits; its supervisor restarts it.
            self.kill_frontend(i, Some(now + DEAD_AFTER));
        }
        progressed
    }

    fn poll_backend(&mut self, i: usize) -> bool {
        let now = self.now;
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
            if r.start.is_some() {
                self.batches += 1;
                if self.slow.iter().any(|&(b, g, _)| b == i && g == r.gpu) {
                    self.slow_batches += 1;
                }
            }
        }
        if exit {
            self.kill_backend(i, Some(now + DEAD_AFTER));
        }
        progressed
    }

    fn next_wakeup(&self) -> Option<Instant> {
        let mut t = [
            self.sched.poll_at(),
            self.net.next_event_at(),
            self.client.next_at(),
            self.events.get(self.next_event).map(|e| e.0),
            self.partitions.iter().map(|p| p.2).min(),
            self.slow.iter().map(|s| s.2).min(),
        ]
        .into_iter()
        .flatten()
        .min();
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

    fn run(mut self) -> ChaosReport {
        let arrivals_end = Instant::ZERO + STARTUP + self.cfg.duration;
        let slo_max = self.cfg.models.iter().map(|m| m.slo).max().unwrap_or(Duration::ZERO);
        // Every request's wait ends by its budget plus the grace; restarts
        // and liveness settle within a few seconds.
        let end = arrivals_end + slo_max + GRACE + DEAD_AFTER + DEAD_AFTER;
        let mut steps: u64 = 0;
        let step_limit: u64 = 50_000_000;
        loop {
            steps += 1;
            if steps > step_limit {
                self.violations.push(format!("no end after {step_limit} steps at {}", self.now));
                break;
            }
            self.net.set_now(self.now);
            while self.next_event < self.events.len() && self.events[self.next_event].0 <= self.now {
                let e = self.events[self.next_event].1;
                self.next_event += 1;
                self.apply_event(e);
            }
            self.heal_due();
            self.restart_due();
            self.poll_nodes();
            let fronts: Vec<Option<&ClusterService<NetSink>>> =
                self.frontends.iter().map(|f| if let Slot::Up(h) = f { Some(&h.service) } else { None }).collect();
            let sent = self.client.send_due(self.now, &fronts);
            if sent {
                self.poll_nodes();
            }
            self.client.collect(self.now);
            let next = self.next_wakeup();
            let Some(next) = next else { break };
            // Time moves forward at least 1 us per step so a node that
            // keeps asking for "now" cannot stall the run.
            let next = next.max(self.now + Duration::from_micros(1));
            if next > end {
                break;
            }
            self.now = next;
        }
        self.finish()
    }

    fn finish(mut self) -> ChaosReport {
        for i in 0..self.backends.len() {
            if let Slot::Up(h) = &self.backends[i] {
                self.busy_rejections += h.node.worker().executor().busy_rejections();
            }
        }
        let frontend_counters: Vec<(usize, frontend::staging::CounterSnapshot)> = self
            .frontends
            .iter()
            .enumerate()
            .filter_map(|(i, f)| if let Slot::Up(h) = f { Some((i, h.staging.counters().snapshot())) } else { None })
            .collect();
        let counts = self.net.counts();
        let surviving: Vec<NodeId> = self.backends.iter().filter_map(|b| if let Slot::Up(h) = b { Some(h.net_id) } else { None }).collect();
        let ledger = std::mem::take(&mut *self.ledger.lock().unwrap_or_else(|p| p.into_inner()));
        let mut report = ChaosReport {
            seed: self.cfg.seed,
            fault_classes: self.cfg.faults.names(),
            trace_hash: format!("{:016x}", self.net.trace_hash()),
            replay: self.cfg.replay_command(),
            batches: self.batches,
            virtual_s: self.now.as_nanos() as f64 / 1e9,
            ..ChaosReport::default()
        };
        self.client.fill(&mut report);
        report.faults = fault_map(counts, self.cfg.faults, self.slow_batches, self.crash_hits);
        let plane = self.sched.plane();
        let mut v = std::mem::take(&mut self.violations);
        checks::check(
            &checks::Observed {
                overlapping_plans: plane.overlapping_plans(),
                busy_rejections: self.busy_rejections,
                ledger: &ledger,
                surviving_backends: &surviving,
                frontend_counters: &frontend_counters,
                client: &self.client,
            },
            &mut v,
        );
        report.violations = v;
        report
    }
}

fn fault_map(c: FaultCounts, set: FaultSet, slow_batches: u64, crash_hits: u64) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    let mut put = |cls: FaultClass, n: u64| {
        if set.has(cls) {
            m.insert(cls.as_str().to_string(), n);
        }
    };
    put(FaultClass::Loss, c.lost_messages + c.lost_reads);
    put(FaultClass::Dup, c.duplicated);
    put(FaultClass::Reorder, c.reordered);
    put(FaultClass::Partition, c.partitioned);
    put(FaultClass::Crash, c.crash_hits + crash_hits);
    put(FaultClass::SlowGpu, slow_batches);
    m
}

/// Runs one seed.
pub fn run(cfg: ChaosConfig) -> Result<ChaosReport, String> {
    Ok(Harness::new(cfg)?.run())
}
