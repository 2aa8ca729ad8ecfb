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
//! The failover classes (`leader-crash`, `leader-pause`, `store-down`,
//! `leader-partition`) run three scheduler nodes elected through an
//! in-memory store (`inproc::cluster::HaSpec`); peers outlive their
//! scheduler and walk the address list. They add the checks that no two
//! leaders planned in live terms (no plan of an epoch was sent after a
//! newer epoch's first plan) and that no backend started a batch of an
//! older epoch than one it had already been delivered. Without them the
//! one scheduler is never crashed; it can be partitioned.
//!
//! The membership classes (`drain`, `join`; issue 52) make backends leave
//! gracefully (the same `BackendNode::begin_leave` the daemon's SIGTERM
//! runs; a drained backend exits) and join the running cluster. They add
//! the check that a backend whose leave the scheduler released answered
//! every task planned to it.

pub mod checks;
pub mod client;
pub mod faults;
pub mod sweep;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use dataplane::time::{Duration, Instant};
use dataplane::transport::sim::{FaultConfig, FaultCounts, NodeId, SimNet};
use scheduler::closed_loop::LoopConfig;
use scheduler::delay_watch::DelayWatchConfig;
use scheduler::deferred::{Admission, CoreConfig};
use scheduler::netdelay::NetworkDelay;
use scheduler::zoo::ModelSpec;
use serde::Serialize;

use crate::inproc::cluster::{ClusterEvent, ClusterSpec, HaSpec, NodeCluster};

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
    /// Frontend nodes; the client spreads its requests over them, and
    /// crashes and partitions pick among them.
    pub frontends: usize,
    /// Backend nodes, each a crash and partition target.
    pub backends: usize,
    /// Emulated GPUs on each backend (slow-GPU faults pick among them).
    pub gpus_per_backend: u32,
    /// The cluster's models.
    pub models: Vec<ModelSpec>,
    /// Offered load, requests per second over all models.
    pub rate_rps: f64,
    /// A deliberate bug to switch on (mutation testing).
    pub mutation: Option<Mutation>,
    /// The network delay bound the scheduler charges (`d_ctrl` is also
    /// what backends subtract).
    pub delay: NetworkDelay,
    /// The latency of a READ on the simulated network.
    pub read_delay: Duration,
    /// The scheduler's closed loop.
    pub closed_loop: LoopConfig,
    /// How the scheduler watches the READ tail against `delay.d_data`.
    pub delay_watch: DelayWatchConfig,
    /// GPUs slower than their profile for the whole run: (backend, GPU,
    /// factor).
    pub gpu_slowdowns: Vec<(usize, u32, f64)>,
    /// Share of requests at priority 1; the rest at 2 (0: no priorities,
    /// one level).
    pub priority_mix: f64,
    /// Share of requests the client cancels, each at a random point of its
    /// budget.
    pub cancel_share: f64,
    /// Every model's queue bound at the scheduler (0: unbounded).
    pub max_queue: u32,
    /// A task id whose messages the report lists (`ChaosReport::trace`),
    /// to follow one task through a failing seed.
    pub trace_task: Option<u64>,
}

impl ChaosConfig {
    /// The default cluster: 3 frontends, 4 backends of one GPU, two A100
    /// models at about half the cluster's capacity.
    pub fn new(seed: u64, faults: FaultSet, duration: Duration) -> Self {
        let models = vec![
            ModelSpec::linear("ResNet50", 1.053, 5.072, 25.0).unwrap_or_else(|_| unreachable!()),
            ModelSpec::linear("InceptionV3", 1.130, 7.400, 50.0).unwrap_or_else(|_| unreachable!()),
        ];
        ChaosConfig {
            seed,
            faults,
            duration,
            frontends: 3,
            backends: 4,
            gpus_per_backend: 1,
            models,
            rate_rps: 800.0,
            mutation: None,
            delay: NetworkDelay { d_ctrl: CONTROL_DELAY, d_data: Duration::ZERO },
            read_delay: FaultConfig::default().read_delay,
            closed_loop: LoopConfig::default(),
            delay_watch: DelayWatchConfig::default(),
            gpu_slowdowns: Vec::new(),
            priority_mix: 0.0,
            cancel_share: 0.0,
            max_queue: 0,
            trace_task: None,
        }
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
        if self.priority_mix > 0.0 {
            s.push_str(&format!(" --priority-mix {}", self.priority_mix));
        }
        if self.cancel_share > 0.0 {
            s.push_str(&format!(" --cancel-share {}", self.cancel_share));
        }
        if self.max_queue > 0 {
            s.push_str(&format!(" --max-queue {}", self.max_queue));
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
    /// Cancelled by the client before an outcome came.
    pub cancelled: u64,
    /// Sent but never ended (must be 0).
    pub unaccounted: u64,
    /// Faults that hit something in flight, by class.
    pub faults: BTreeMap<String, u64>,
    /// Hash of every message and fault, in order.
    pub trace_hash: String,
    /// With `ChaosConfig::trace_task`: every message of that task the
    /// network carried (sent and delivered), in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub trace: Vec<String>,
    /// Broken invariants (must be empty).
    pub violations: Vec<String>,
    /// The command that replays this run.
    pub replay: String,
    /// Batches executed.
    pub batches: u64,
    /// Virtual time simulated, seconds.
    pub virtual_s: f64,
    /// The scheduler's closed-loop speed ratio of each GPU it learned
    /// about, keyed `backend<id>/gpu<i>` (1 = as profiled).
    pub gpu_speed: BTreeMap<String, f64>,
    /// Times the scheduler's delay-bound alarm was raised.
    pub delay_alarms: u64,
    /// The READ tail per input the scheduler observed last, ns.
    pub read_tail_ns: u64,
    /// Plans backends did not run for their epoch (refused as stale, or
    /// held unstarted when a newer epoch came), over the backends up at
    /// the end.
    pub fenced_plans: u64,
    /// With two scheduler groups (`reroute2`): tasks the frontends took
    /// back (answered `moved`) to resubmit to their model's owner.
    pub resubmitted: u64,
    /// Batch reports the scheduler took after it had given the batch up
    /// (overdue past its grace), and learned from.
    pub late_batch_reports: u64,
    /// Plans backends skipped unexecuted because the scheduler had given
    /// them up before they could start, over the backends up at the end.
    pub plans_skipped: u64,
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

/// Control delay bound the scheduler charges and the backends subtract.
const CONTROL_DELAY: Duration = Duration::from_micros(200);
/// Faults start after the cluster has formed.
const STARTUP: Duration = Duration::from_millis(50);
/// With two scheduler groups, each node applies a new routing table up to
/// this long after it is stored (each its own seeded lag, as each follows
/// etcd on its own).
const ROUTE_LAG_MAX_US: u64 = 8_000;

/// Who applies a routing table (two scheduler groups).
#[derive(Clone, Copy, Debug)]
enum RouteAt {
    A,
    B,
    Frontend(usize),
}

/// The cluster and everything that drives it.
struct Harness {
    cfg: ChaosConfig,
    cluster: NodeCluster,
    now: Instant,
    events: Vec<(Instant, Event)>,
    next_event: usize,
    /// Partitions in force, with their end.
    partitions: Vec<(Target, Target, Instant)>,
    slow: Vec<(usize, u32, Instant)>,
    client: Client,
    ledger: Arc<Mutex<checks::Ledger>>,
    violations: Vec<String>,
    slow_batches: u64,
    /// Requests and batches in flight on nodes when they crashed.
    crash_hits: u64,
    batches: u64,
    /// Failover faults that hit (a leader crashed or paused, the store
    /// down, a standby cut off), by class.
    failover_hits: BTreeMap<FaultClass, u64>,
    /// When the election store comes back.
    store_down_until: Option<Instant>,
    /// Scheduler heartbeats cut: (leader, standby, until).
    sched_cuts: Vec<(usize, usize, Instant)>,
    /// Batch reports of this poll: (backend slot, report).
    reports: Vec<(usize, backend::worker::BatchReport)>,
    fence_violations: Vec<String>,
    /// The routing revision the `reroute` class last wrote.
    route_revision: u64,
    /// Routing changes applied, for the report.
    reroutes: BTreeMap<FaultClass, u64>,
    /// With two groups: tables stored but not yet applied by a node.
    pending_routes: Vec<(Instant, RouteAt, Arc<scheduler::routes::RouteTable>)>,
    /// Backends leaving (the membership classes).
    leaves: Vec<LeaveWatch>,
    /// Net ids of backends that left released (they must have answered
    /// every task planned to them).
    released: Vec<NodeId>,
    /// Membership faults, by report key.
    membership_hits: BTreeMap<&'static str, u64>,
}

/// A backend told to leave: which instance, when it crashes if still up,
/// and when its slot starts again once it is down.
#[derive(Clone, Copy)]
struct LeaveWatch {
    slot: usize,
    net_id: NodeId,
    crash_at: Option<Instant>,
    rejoin_at: Option<Instant>,
}

impl Harness {
    fn new(cfg: ChaosConfig) -> Result<Harness, ChaosError> {
        #[cfg(feature = "mutations")]
        dataplane::mutation::set(cfg.mutation);
        #[cfg(not(feature = "mutations"))]
        if cfg.mutation.is_some() {
            return Err(ChaosError::MutationsNotBuilt);
        }
        let net = SimNet::new(
            cfg.seed,
            FaultConfig { read_delay: cfg.read_delay, ..faults::message_faults(cfg.faults, Instant::ZERO + STARTUP) },
        );
        let ha = cfg.faults.failover().then(HaSpec::default);
        let ledger = Arc::new(Mutex::new(checks::Ledger {
            schedulers: ha.as_ref().map_or(1, |h| h.schedulers as NodeId),
            trace_task: cfg.trace_task,
            ..checks::Ledger::default()
        }));
        {
            let ledger = ledger.clone();
            net.set_tap(Box::new(move |t| {
                if let Ok(mut l) = ledger.lock() {
                    l.observe(t);
                }
            }));
        }
        let mut spec = ClusterSpec::new(cfg.models.clone(), cfg.frontends, cfg.backends, cfg.gpus_per_backend);
        spec.core = CoreConfig { delay: cfg.delay, ..CoreConfig::default() };
        spec.closed_loop = cfg.closed_loop;
        spec.delay_watch = cfg.delay_watch;
        spec.gpu_slowdowns = cfg.gpu_slowdowns.clone();
        spec.ha = ha;
        spec.group_b = cfg.faults.has(FaultClass::Reroute2);
        let catalog = spec.catalog.clone();
        let mut cluster = NodeCluster::new(spec, net, None)?;
        if cfg.priority_mix > 0.0 || cfg.max_queue > 0 {
            let admission = Admission { levels: if cfg.priority_mix > 0.0 { 2 } else { 1 }, default_level: 1, max_queue: cfg.max_queue };
            for m in 0..cfg.models.len() {
                cluster.set_admission(m as u32, admission);
            }
        }
        let start = Instant::ZERO + STARTUP;
        let end = start + cfg.duration;
        let events = faults::schedule(cfg.faults, cfg.seed, start, end, cfg.frontends, cfg.backends, cfg.gpus_per_backend);
        let client = Client::new(&cfg, catalog, start);
        if cfg.faults.has(FaultClass::Join) {
            // Held down until its first join.
            cluster.kill_backend(faults::join_slot(cfg.backends), None);
        }
        Ok(Harness {
            cfg,
            cluster,
            now: Instant::ZERO,
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
            failover_hits: BTreeMap::new(),
            store_down_until: None,
            sched_cuts: Vec::new(),
            reports: Vec::new(),
            fence_violations: Vec::new(),
            route_revision: 0,
            reroutes: BTreeMap::new(),
            pending_routes: Vec::new(),
            leaves: Vec::new(),
            released: Vec::new(),
            membership_hits: BTreeMap::new(),
        }
        .with_initial_routes())
    }

    /// With two groups: revision 1 (even models to group a, odd ones to
    /// b), applied by every node before anything runs.
    fn with_initial_routes(mut self) -> Self {
        let Some(b) = self.cluster.group_b_net_id() else { return self };
        if let Ok(mut l) = self.ledger.lock() {
            l.group_b = Some(b);
        }
        let owned = (0..64).step_by(2).fold(0u64, |m, i| m | 1 << i);
        self.route_revision = 1;
        let table = Arc::new(self.table(owned));
        for at in [RouteAt::A, RouteAt::B] {
            self.apply_routes(at, &table);
        }
        let owners = self.owners(&table);
        self.cluster.set_frontend_routes(None, table.revision, &owners);
        self
    }

    /// Routing revision `self.route_revision`: group a owns the models
    /// whose bit is set in `owned`, group b the rest.
    fn table(&self, owned: u64) -> scheduler::routes::RouteTable {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for (i, m) in self.cfg.models.iter().enumerate() {
            if owned >> (i % 64) & 1 == 1 { a.push(m.name.clone()) } else { b.push(m.name.clone()) }
        }
        let group = |name: &str, models: Vec<String>| scheduler::routes::RouteGroup {
            name: name.into(),
            election_key: format!("/symphony/leader/{name}"),
            schedulers: Vec::new(),
            models,
            backends: Vec::new(),
        };
        scheduler::routes::RouteTable { revision: self.route_revision, groups: vec![group("a", a), group("b", b)] }
    }

    /// The owner group index of each model (a frontend's view).
    fn owners(&self, t: &scheduler::routes::RouteTable) -> Vec<Option<u16>> {
        self.cfg.models.iter().map(|m| t.owner(&m.name).map(|g| g as u16)).collect()
    }

    /// Node `at` applies `table` now; the ledger learns what a scheduler
    /// gave away as soon as it has applied it.
    fn apply_routes(&mut self, at: RouteAt, table: &Arc<scheduler::routes::RouteTable>) {
        let now = self.now;
        let n = self.cfg.models.len();
        let applied = match at {
            RouteAt::A => self.cluster.apply_group_a_routes(now, table.clone()),
            RouteAt::B => {
                let id = self.cluster.group_b_net_id();
                let Some((node, id)) = self.cluster.group_b_mut().zip(id) else { return };
                if !node.handle_routes(now, table, "b") {
                    return;
                }
                vec![(id, (0..n as u32).map(|m| !node.owns(m)).collect())]
            }
            RouteAt::Frontend(i) => {
                let owners = self.owners(table);
                self.cluster.set_frontend_routes(Some(i), table.revision, &owners);
                return;
            }
        };
        if applied.is_empty() {
            return;
        }
        if let Ok(mut l) = self.ledger.lock() {
            l.moved_away.extend(applied);
        }
        if matches!(at, RouteAt::A) && table.revision > 1 {
            *self.reroutes.entry(FaultClass::Reroute2).or_insert(0) += 1;
        }
    }

    /// With two groups: the next revision, applied by each node after its
    /// own seeded lag.
    fn reroute2(&mut self, owned: u64) {
        use rand::{Rng, SeedableRng};
        self.route_revision += 1;
        let table = Arc::new(self.table(owned));
        self.cluster.net().record(0x5245_5232, owned);
        let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(self.cfg.seed ^ self.route_revision.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let targets = [RouteAt::A, RouteAt::B].into_iter().chain((0..self.cfg.frontends).map(RouteAt::Frontend));
        for at in targets {
            let lag = Duration::from_micros(rng.random_range(0..=ROUTE_LAG_MAX_US));
            self.pending_routes.push((self.now + lag, at, table.clone()));
        }
    }

    /// Applies the tables whose time has come.
    fn apply_routes_due(&mut self) {
        let now = self.now;
        let mut i = 0;
        while i < self.pending_routes.len() {
            if self.pending_routes[i].0 <= now {
                let (_, at, table) = self.pending_routes.remove(i);
                self.apply_routes(at, &table);
            } else {
                i += 1;
            }
        }
    }

    fn net_id(&self, t: Target) -> Option<NodeId> {
        match t {
            Target::Scheduler => Some(self.cluster.leader().map_or(0, |l| self.cluster.schedulers()[l].net_id)),
            Target::Frontend(i) => self.cluster.frontend_net_id(i),
            Target::Backend(i) => self.cluster.backend_net_id(i),
        }
    }

    fn apply_event(&mut self, e: Event) {
        match e {
            Event::Partition { a, b, until } => {
                if let (Some(x), Some(y)) = (self.net_id(a), self.net_id(b)) {
                    self.cluster.net().partition(x, y);
                    self.partitions.push((a, b, until));
                }
            }
            Event::Crash { node: Target::Frontend(i), restart_at } => {
                if self.cluster.kill_frontend(i, Some(restart_at)) {
                    // The process is gone: what the client had open on it
                    // ends as frontend_lost.
                    self.crash_hits += self.client.frontend_lost(i);
                }
            }
            Event::Crash { node: Target::Backend(i), restart_at } => {
                self.crash_hits += self.cluster.kill_backend(i, Some(restart_at)).unwrap_or(0) as u64;
            }
            Event::Crash { node: Target::Scheduler, .. } => {}
            Event::LeaderCrash => {
                if let Some(l) = self.cluster.leader() {
                    self.cluster.crash_scheduler(l);
                    *self.failover_hits.entry(FaultClass::LeaderCrash).or_insert(0) += 1;
                }
            }
            Event::LeaderPause { until } => {
                if let Some(l) = self.cluster.leader() {
                    self.cluster.pause_scheduler(l, until);
                    *self.failover_hits.entry(FaultClass::LeaderPause).or_insert(0) += 1;
                }
            }
            Event::StoreDown { until } => {
                if let Some(s) = self.cluster.election_store() {
                    s.set_down(true);
                    self.store_down_until = Some(until);
                    *self.failover_hits.entry(FaultClass::StoreDown).or_insert(0) += 1;
                }
            }
            Event::LeaderPartition { until } => {
                let n = self.cluster.schedulers().len();
                if let Some(l) = self.cluster.leader() {
                    let standby = (l + 1) % n;
                    self.cluster.cut_schedulers(l, standby, true);
                    self.sched_cuts.push((l, standby, until));
                    *self.failover_hits.entry(FaultClass::LeaderPartition).or_insert(0) += 1;
                }
            }
            Event::Reroute { owned } => self.reroute(owned),
            Event::Drain { backend, crash_at, rejoin_at } => self.begin_leave(backend, crash_at, rejoin_at),
            Event::Join { backend, peer, until } => self.join(backend, peer, until),
            Event::SlowGpu { backend, gpu, factor, until } => {
                if let Some(h) = self.cluster.backend_mut(backend) {
                    h.node.worker_mut().executor_mut().set_slowdown(gpu, factor);
                    self.cluster.net().record(0x534c_4f57, u64::from(gpu));
                    self.slow.push((backend, gpu, until));
                }
            }
        }
    }

    /// The next routing revision: the scheduler (group a) owns the models
    /// whose bit is set in `owned`, group b (no scheduler in the harness:
    /// its models' requests end as dropped `moved`) the rest. The ledger
    /// learns what moved away as soon as the scheduler has applied it.
    fn reroute(&mut self, owned: u64) {
        if self.cluster.group_b_net_id().is_some() {
            return self.reroute2(owned);
        }
        self.route_revision += 1;
        let table = Arc::new(self.table(owned));
        let applied = self.cluster.apply_group_a_routes(self.now, table);
        if !applied.is_empty() {
            self.cluster.net().record(0x5245_5254, owned);
            if let Ok(mut l) = self.ledger.lock() {
                l.moved_away.extend(applied);
            }
            *self.reroutes.entry(FaultClass::Reroute).or_insert(0) += 1;
        }
    }

    /// Backend `slot`, if up and not leaving, is told to leave (its
    /// daemon's SIGTERM).
    fn begin_leave(&mut self, slot: usize, crash_at: Option<Instant>, rejoin_at: Option<Instant>) {
        let now = self.now;
        let Some(h) = self.cluster.backend_mut(slot) else { return };
        if h.node.leaving() || h.node.draining() {
            return;
        }
        h.node.begin_leave(now);
        let (net_id, in_hand) = (h.net_id, h.node.worker().batches_in_flight() as u64);
        self.cluster.net().record(0x4c45_4156, slot as u64);
        if crash_at.is_some() {
            *self.membership_hits.entry("drain").or_insert(0) += 1;
        }
        *self.membership_hits.entry("leave-batches-in-hand").or_insert(0) += in_hand;
        self.leaves.push(LeaveWatch { slot, net_id, crash_at, rejoin_at });
    }

    /// Backend `slot`, if held down, starts now and is cut from `peer`
    /// until `until` (from its first message on: the connect itself went
    /// through, as a process that reached the scheduler before the cut).
    fn join(&mut self, slot: usize, peer: Target, until: Instant) {
        if self.cluster.backend(slot).is_some() {
            return;
        }
        self.cluster.kill_backend(slot, Some(self.now));
        self.cluster.net().record(0x4a4f_494e, slot as u64);
        self.poll_cluster();
        if let (Some(x), Some(y)) = (self.net_id(Target::Backend(slot)), self.net_id(peer)) {
            self.cluster.net().partition(x, y);
            self.partitions.push((Target::Backend(slot), peer, until));
            *self.membership_hits.entry("join").or_insert(0) += 1;
        }
    }

    /// Leaving backends: one that has drained exits (the one it released
    /// is remembered for the checks) and its slot starts again at its
    /// rejoin time; one still up at its crash time crashes.
    fn watch_leaves(&mut self) {
        let now = self.now;
        let mut i = 0;
        while i < self.leaves.len() {
            let LeaveWatch { slot, net_id, crash_at, rejoin_at } = self.leaves[i];
            let Some(h) = self.cluster.backend(slot).filter(|h| h.net_id == net_id) else {
                // Down already (crashed by another fault).
                self.leaves.swap_remove(i);
                continue;
            };
            let (drained, released) = (h.node.drained(), h.node.leave_released());
            if drained {
                if released {
                    self.released.push(net_id);
                    *self.membership_hits.entry("leave-released").or_insert(0) += 1;
                }
                self.cluster.kill_backend(slot, rejoin_at);
                self.leaves.swap_remove(i);
            } else if crash_at.is_some_and(|t| t <= now) {
                self.crash_hits += self.cluster.kill_backend(slot, rejoin_at).unwrap_or(0) as u64;
                *self.membership_hits.entry("drain-crashed").or_insert(0) += 1;
                self.leaves.swap_remove(i);
            } else {
                i += 1;
            }
        }
    }

    fn heal_due(&mut self) {
        let now = self.now;
        if self.store_down_until.is_some_and(|t| t <= now) {
            self.store_down_until = None;
            if let Some(s) = self.cluster.election_store() {
                s.set_down(false);
            }
        }
        let mut i = 0;
        while i < self.sched_cuts.len() {
            let (a, b, until) = self.sched_cuts[i];
            if until <= now {
                self.cluster.cut_schedulers(a, b, false);
                self.sched_cuts.swap_remove(i);
            } else {
                i += 1;
            }
        }
        let mut i = 0;
        while i < self.partitions.len() {
            let (a, b, until) = self.partitions[i];
            if until <= now {
                if let (Some(x), Some(y)) = (self.net_id(a), self.net_id(b)) {
                    self.cluster.net().heal(x, y);
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
                if let Some(h) = self.cluster.backend_mut(b) {
                    h.node.worker_mut().executor_mut().set_slowdown(g, 1.0);
                }
                self.slow.swap_remove(i);
            } else {
                i += 1;
            }
        }
    }

    fn poll_cluster(&mut self) {
        let now = self.now;
        let (client, slow) = (&mut self.client, &self.slow);
        let (batches, slow_batches) = (&mut self.batches, &mut self.slow_batches);
        let reports = &mut self.reports;
        let ledger = &self.ledger;
        self.cluster.poll(now, &mut |e| match e {
            ClusterEvent::RoutesApplied(id, away) => {
                if let Ok(mut l) = ledger.lock() {
                    l.moved_away.insert(id, away);
                }
            }
            ClusterEvent::FrontendExited(i) => {
                client.frontend_lost(i);
            }
            ClusterEvent::BackendExited(_) => {}
            ClusterEvent::Batch(i, r) => {
                reports.push((i, r));
                if r.start.is_some() {
                    *batches += 1;
                    if slow.iter().any(|&(b, g, _)| b == i && g == r.gpu) {
                        *slow_batches += 1;
                    }
                }
            }
        });
        self.check_fences();
    }

    /// Every batch that ran started before its backend was delivered a
    /// newer epoch than the batch's own.
    fn check_fences(&mut self) {
        if self.reports.is_empty() {
            return;
        }
        let ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        for (i, r) in self.reports.drain(..) {
            let (Some(start), Some(b)) = (r.start, self.cluster.backend_net_id(i)) else { continue };
            if let Some((at, newer)) = ledger.newer_epoch_before(b, r.epoch, start) {
                self.fence_violations.push(format!(
                    "backend node {b} started batch {} of epoch {} at {start}, after epoch {newer} reached it at {at}",
                    r.batch_id, r.epoch
                ));
            } else if let Some((newer, first)) = ledger.newer_term_before(b, r.epoch, start) {
                self.fence_violations.push(format!(
                    "backend node {b} started batch {} of epoch {} at {start}, after epoch {newer}'s first plan at {first}",
                    r.batch_id, r.epoch
                ));
            }
        }
    }

    fn next_wakeup(&self) -> Option<Instant> {
        [
            self.cluster.next_wakeup(),
            self.client.next_at(),
            self.events.get(self.next_event).map(|e| e.0),
            self.partitions.iter().map(|p| p.2).min(),
            self.slow.iter().map(|s| s.2).min(),
            self.store_down_until,
            self.sched_cuts.iter().map(|c| c.2).min(),
            self.pending_routes.iter().map(|p| p.0).min(),
            self.leaves.iter().filter_map(|l| l.crash_at).min(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// When the last batch a stalled GPU started has surely ended: the
    /// longest batch of any model, run [`faults::STALL_FACTOR`] times
    /// slower, after the last stall's end.
    fn stall_tail(&self) -> Instant {
        let longest = self.cfg.models.iter().map(|m| m.profile.latency(m.profile.max_batch())).max().unwrap_or(Duration::ZERO);
        let stalled = Duration::from_nanos((longest.as_nanos() as f64 * faults::STALL_FACTOR) as u64);
        let last = self.events.iter().filter_map(|&(_, e)| match e {
            Event::SlowGpu { factor, until, .. } if factor >= faults::STALL_FACTOR => Some(until),
            _ => None,
        });
        last.max().map_or(Instant::ZERO, |until| until + stalled + Duration::from_millis(100))
    }

    fn run(mut self) -> ChaosReport {
        let arrivals_end = Instant::ZERO + STARTUP + self.cfg.duration;
        let slo_max = self.cfg.models.iter().map(|m| m.slo).max().unwrap_or(Duration::ZERO);
        // Every request's wait ends by its budget plus the grace; restarts
        // and liveness settle within a few seconds.
        let dead_after = Duration::from_millis(1000);
        let end = arrivals_end + slo_max + Duration::from_millis(100) + dead_after + dead_after;
        let end = end.max(self.stall_tail());
        let step_limit: u64 = 50_000_000;
        let mut steps: u64 = 0;
        loop {
            steps += 1;
            if steps > step_limit {
                self.violations.push(format!("no end after {step_limit} steps at {}", self.now));
                break;
            }
            self.cluster.net().set_now(self.now);
            while self.next_event < self.events.len() && self.events[self.next_event].0 <= self.now {
                let e = self.events[self.next_event].1;
                self.next_event += 1;
                self.apply_event(e);
            }
            self.heal_due();
            self.apply_routes_due();
            self.poll_cluster();
            if !self.leaves.is_empty() {
                self.watch_leaves();
            }
            if self.client.send_due(self.now, &self.cluster.services()) {
                self.poll_cluster();
            }
            if self.client.cancel_due(self.now, &self.cluster.services()) {
                self.poll_cluster();
            }
            self.client.collect(self.now);
            let Some(next) = self.next_wakeup() else { break };
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
        let frontend_counters: Vec<(usize, frontend::staging::CounterSnapshot)> = (0..self.cluster.frontend_count())
            .filter_map(|i| self.cluster.frontend(i).map(|h| (i, h.service.staging().counters().snapshot())))
            .collect();
        let mut surviving: Vec<NodeId> = (0..self.cfg.backends).filter_map(|i| self.cluster.backend_net_id(i)).collect();
        // A released leave answered everything planned to it, as a
        // backend that ran to the end did.
        surviving.extend(self.released.iter().copied());
        let ledger = std::mem::take(&mut *self.ledger.lock().unwrap_or_else(|p| p.into_inner()));
        let net = self.cluster.net();
        let mut report = ChaosReport {
            seed: self.cfg.seed,
            fault_classes: self.cfg.faults.names(),
            trace_hash: format!("{:016x}", net.trace_hash()),
            replay: self.cfg.replay_command(),
            batches: self.batches,
            virtual_s: self.now.as_nanos() as f64 / 1e9,
            resubmitted: self.cluster.moved_resubmits(),
            ..ChaosReport::default()
        };
        report.trace = ledger.trace.clone();
        if let Some(plane) = self.cluster.scheduler().map(|s| s.plane()) {
            report.gpu_speed = plane.gpu_ratios().into_iter().map(|(b, g, r)| (format!("backend{b}/gpu{g}"), r.value())).collect();
            report.delay_alarms = plane.delay_watch().alarms();
            report.read_tail_ns = plane.delay_watch().observed().map_or(0, |d| d.as_nanos());
            report.late_batch_reports = plane.metrics().late_batch_reports.get();
        }
        let stats: Vec<_> = (0..self.cfg.backends).filter_map(|i| self.cluster.backend(i)).map(|h| h.node.worker().stats()).collect();
        report.fenced_plans = stats.iter().map(|s| s.stale_plans + s.superseded_batches).sum();
        report.plans_skipped = stats.iter().map(|s| s.plans_skipped).sum();
        self.client.fill(&mut report);
        report.faults = fault_map(net.counts(), self.cfg.faults, self.slow_batches, self.crash_hits);
        if self.cfg.faults.has(FaultClass::Stall) {
            // What a stall hits: batches given up and reported late, and
            // plans skipped for it.
            report.faults.insert(FaultClass::Stall.as_str().to_string(), report.late_batch_reports + report.plans_skipped);
        }
        for (c, n) in self.failover_hits.iter().chain(&self.reroutes) {
            report.faults.insert(c.as_str().to_string(), *n);
        }
        for (k, n) in &self.membership_hits {
            report.faults.insert((*k).to_string(), *n);
        }
        let mut v = std::mem::take(&mut self.violations);
        // A leader that was paused, cut off or without its store has
        // stepped down on its own by the end.
        let leaders = self.cluster.schedulers().iter().filter(|h| h.leads()).count();
        if leaders > 1 {
            v.push(format!("{leaders} schedulers lead at the end of the run"));
        }
        let slots_in_use: Vec<(usize, usize)> =
            (0..self.cluster.frontend_count()).filter_map(|i| self.cluster.frontend(i).map(|h| (i, h.service.staging().in_flight()))).collect();
        // A lost, partitioned or crashed-away outcome never comes back, so
        // its slot stays held (a backend might still READ it): the leak
        // check is exact only where every message arrives.
        let lossless = !(self.cfg.faults.has(FaultClass::Loss)
            || self.cfg.faults.has(FaultClass::Partition)
            || self.cfg.faults.has(FaultClass::Crash)
            || self.cfg.faults.has(FaultClass::Drain)
            || self.cfg.faults.has(FaultClass::Join)
            || self.cfg.faults.failover());
        checks::check(
            &checks::Observed {
                slots_in_use: &slots_in_use,
                scheduler_tasks: self.cluster.scheduler().map_or(0, |s| s.plane().waiting_tasks())
                    + self.cluster.group_b().map_or(0, |s| s.plane().waiting_tasks()),
                lossless,
                fence_violations: &self.fence_violations,
                overlapping_plans: self.cluster.overlapping_plans(),
                busy_rejections: self.cluster.busy_rejections(),
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

/// Why a chaos run could not start.
#[derive(Debug, thiserror::Error)]
pub enum ChaosError {
    /// `--mutation` without the `mutations` feature.
    #[error("mutations need a build with the `mutations` feature")]
    MutationsNotBuilt,
    /// The in-process cluster did not start.
    #[error(transparent)]
    Cluster(#[from] crate::inproc::cluster::NodeClusterError),
}

/// Runs one seed.
pub fn run(cfg: ChaosConfig) -> Result<ChaosReport, ChaosError> {
    Ok(Harness::new(cfg)?.run())
}
