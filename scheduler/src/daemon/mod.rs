//! `symphony-scheduler`: the centralized scheduler as a daemon.
//!
//! Frontends and backends connect over a dataplane transport and register
//! (see `docs/architecture.md`, "Daemon protocol"). Tasks become requests
//! of the sub-cluster that serves their model; the sub-cluster's
//! [`DeferredScheduler`](crate::deferred::DeferredScheduler) decides batches,
//! which go to the owning backend as batch plans. The logic is the sans-IO
//! [`plane::ControlPlane`], wrapped with everything done per peer link
//! (handshakes, moving messages, heartbeats and liveness) in the sans-IO
//! [`node::SchedulerNode`]; this module is its host: the listener and its
//! acceptor thread, the real clock and the idle strategy over the links'
//! wait fds. The command line, logs, stop signals and exit codes are the
//! daemon shell's ([`node_shell`]); the options are in [`config`].

pub mod bench_stamps;
pub mod config;
pub mod engine;
pub mod ha;
pub mod metrics;
pub mod node;
pub mod plane;
pub use routing::watch as routes_watch;
mod task_ids;

use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;

use dataplane::control::{self, ControlError, WithDomain};
use node_shell::{self as shell, MetricsEndpoint, Acceptor, Common, CommonArgs, ConfigError, Daemon};
use dataplane::time::{Duration, MonotonicClock};
use dataplane::transport::{Connection, Domain, Listener};
use dataplane::transport::shm::DoorbellWatch;
use dataplane::waitset::{IdleWait, WatchList};
use tracing::{info, warn};

pub use crate::zoo::ModelListArgs;
pub use config::{SchedulerArgs, SchedulerConfig};
use metrics::SchedulerMetrics;
use node::{NodeConfig, SchedulerEvent, SchedulerNode};
use crate::runtime::{Drive, ThreadPlacement};
use plane::ControlPlane;

/// Why the scheduler daemon could not start or had to stop.
#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    /// The transport cannot be opened.
    #[error(transparent)]
    Transport(#[from] ControlError),
    /// The control address cannot be listened on.
    #[error("cannot listen on '{addr}': {source}")]
    Listen {
        /// The address.
        addr: String,
        /// Why.
        source: dataplane::transport::Error,
    },
    /// The metrics endpoint cannot be served.
    #[error("cannot serve metrics on {addr}: {source}")]
    Metrics {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The models and sub-clusters do not make a control plane, or its
    /// engine cannot start.
    #[error(transparent)]
    Plane(#[from] plane::PlaneError),
    /// An election epoch past the wire's 32 bits (refused rather than
    /// wrapped: a wrapped epoch would fence the new leader instead of the
    /// old one).
    #[error("election epoch {0} does not fit the wire's 32 bits: compact or recreate the etcd cluster")]
    EpochTooLarge(u64),
    /// The wait set or a thread cannot be created.
    #[error("cannot set up the {what}: {source}")]
    Setup {
        /// What.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
}

impl Daemon for SchedulerArgs {
    type Config = SchedulerConfig;
    type Error = SchedulerError;
    fn common(&self) -> &CommonArgs {
        &self.common
    }
    fn configure(self, common: Common) -> Result<SchedulerConfig, ConfigError> {
        self.resolve(common)
    }
    fn run(cfg: SchedulerConfig) -> Result<(), SchedulerError> {
        control::with_domain(cfg.transport, Serve(cfg))?
    }
}

/// Entry point of the `symphony-scheduler` binary (and of `symphony
/// daemon scheduler`): see [`node_shell::main`].
pub fn main_with_args(args: Vec<String>) -> std::process::ExitCode {
    shell::main::<SchedulerArgs>(args)
}

struct Serve(SchedulerConfig);

impl WithDomain for Serve {
    type Out = Result<(), SchedulerError>;
    fn run<D: Domain>(self, domain: D) -> Result<(), SchedulerError> {
        serve(domain, self.0)
    }
}

/// The queue bound of a model given none (`--max-queue 0` and no
/// repository bound): the pinned engine's ingress ring holds as many, and
/// a model queue this long is seconds of work at any rate served, so it
/// refuses only a peer that floods the scheduler.
pub const DEFAULT_QUEUE_BOUND: u32 = 65_536;

/// A new connection must register within this.
const HANDSHAKE: Duration = Duration::from_millis(5000);
/// A peer whose send queue stays full this long is dead.
const SEND_TIMEOUT: Duration = Duration::from_millis(100);

/// How a term of serving ended.
enum TermEnd {
    /// A stop was requested and the node drained.
    Stopped,
    /// The election took the leadership away (hot standby only).
    SteppedDown,
}

/// The leadership gauges every scheduler exports (issue 18): what `symphony
/// up --ha` and an operator read to see who leads and since when.
struct TermMetrics {
    epoch: node_shell::metrics::Gauge,
    terms: node_shell::metrics::Counter,
    first_plan_host_ns: node_shell::metrics::Gauge,
}

impl TermMetrics {
    fn register(m: &SchedulerMetrics) -> TermMetrics {
        let r = m.registry();
        let epoch = node_shell::metrics::Gauge::default();
        r.register("symphony_scheduler_leader_epoch", "The term this scheduler leads (0: standby; 0 also when no election is configured and it leads alone)", epoch.clone());
        let terms = node_shell::metrics::Counter::default();
        r.register("symphony_scheduler_terms", "Terms this scheduler began to serve", terms.clone());
        let first_plan_host_ns = node_shell::metrics::Gauge::default();
        r.register(
            "symphony_scheduler_term_first_plan_host_ns",
            "CLOCK_MONOTONIC of the first batch planned in the current term, ns (0: none yet)",
            first_plan_host_ns.clone(),
        );
        TermMetrics { epoch, terms, first_plan_host_ns }
    }
}

/// Runs the scheduler on `domain` until a stop is requested: alone, or
/// with `--etcd` as a hot standby that serves whenever it is elected.
pub fn serve<D: Domain>(domain: D, cfg: SchedulerConfig) -> Result<(), SchedulerError> {
    let metrics = Arc::new(SchedulerMetrics::new(&cfg.models));
    node_shell::metrics::register_link_closures(metrics.registry());
    let endpoint = MetricsEndpoint::start(cfg.metrics, metrics.registry().clone())
        .map_err(|source| SchedulerError::Metrics { addr: cfg.metrics, source })?;
    let terms = TermMetrics::register(&metrics);
    let clock = MonotonicClock::new();
    let setup = |what| move |source| SchedulerError::Setup { what, source };
    let mut idle = IdleWait::new(cfg.idle).map_err(setup("wait set"))?;
    let watch = match &cfg.routes {
        Some(r) => Some(routes_watch::RoutesWatch::spawn(r, idle.notifier()).map_err(setup("routing table watch"))?),
        None => None,
    };
    let Some(election) = &cfg.election else {
        let listener = listen(&domain, &cfg)?;
        announce(&cfg, &listener.local_addr(), endpoint.addr());
        terms.terms.inc();
        serve_term(listener, &cfg, 0, None, watch.as_ref(), &metrics, &terms, &clock, &mut idle)?;
        return Ok(());
    };
    let key = ha::HeartbeatKey::from_token(cfg.membership.token.as_ref());
    let host = ha::ElectionHost::spawn(election, &cfg.listen, key, idle.notifier()).map_err(setup("election"))?;
    metrics.registry().register(
        "symphony_scheduler_heartbeats_refused",
        "Election heartbeats refused: a bad MAC, a replayed or unsolicited answer, a term the election store did not confirm, or pings beyond the answer rate",
        node_shell::metrics::Computed::counter_of(host.refused_reader()),
    );
    announce(&cfg, &cfg.listen, endpoint.addr());
    loop {
        // Standing by: nothing listens on the control address, so peers
        // walking their scheduler list pass on to the leader at once.
        let epoch = loop {
            if control::stop_requested() {
                host.stop();
                info!("stopped (standby)");
                return Ok(());
            }
            if let Some(e) = host.leading() {
                break e;
            }
            idle.set().wait(Duration::from_millis(100));
        };
        terms.epoch.set(i64::try_from(epoch).unwrap_or(i64::MAX));
        terms.terms.inc();
        let listener = listen(&domain, &cfg)?;
        info!(epoch, control = %cfg.listen, "leading: serving peers");
        let end = serve_term(listener, &cfg, epoch, Some(&host), watch.as_ref(), &metrics, &terms, &clock, &mut idle)?;
        terms.epoch.set(0);
        terms.first_plan_host_ns.set(0);
        match end {
            TermEnd::Stopped => {
                host.stop();
                return Ok(());
            }
            TermEnd::SteppedDown => warn!(epoch, "no longer leading: every link is closed; standing by"),
        }
    }
}

fn listen<D: Domain>(domain: &D, cfg: &SchedulerConfig) -> Result<D::Listener, SchedulerError> {
    domain.listen(&cfg.listen).map_err(|source| SchedulerError::Listen { addr: cfg.listen.clone(), source })
}

/// One term: a fresh control plane and node on `listener`, serving until
/// a stop (then a drain) or, under an election, until this scheduler no
/// longer leads `epoch` (then everything is dropped at once: the new
/// leader rebuilds its state from the peers).
#[allow(clippy::too_many_arguments)]
fn serve_term<L: Listener + 'static>(
    listener: L,
    cfg: &SchedulerConfig,
    epoch: u64,
    election: Option<&ha::ElectionHost>,
    routes: Option<&routes_watch::RoutesWatch>,
    metrics: &Arc<SchedulerMetrics>,
    terms: &TermMetrics,
    clock: &MonotonicClock,
    idle: &mut IdleWait,
) -> Result<TermEnd, SchedulerError>
where
    L::Conn: Send + 'static,
{
    let (mut node, layout) = build_node(cfg, metrics, epoch, clock, Some(idle.notifier()))?;
    let setup = |what| move |source| SchedulerError::Setup { what, source };
    let acceptor = Acceptor::spawn("sched-accept", listener, idle.set().notifier())
        .map_err(setup("acceptor thread"))?;
    // After the acceptor's spawn: it would inherit this thread's CPU.
    log_layout(cfg, &layout);
    let mut term = Term { election, routes: routes.map(|w| (w, cfg.routes.as_ref().map_or("", |r| r.group.as_str()))), epoch, stall: cfg.election.as_ref().map(|e| e.failure_timeout), last_pass: clock.now(), hold: None };
    let mut first_plan = FirstPlan::new(metrics, clock, terms);
    let end = poll_until_drained(&mut node, &acceptor, idle, clock, &mut term, &mut first_plan);
    drop(acceptor);
    let (frontends, backends) = node.plane().peers();
    info!(
        frontends,
        backends,
        batches_unfinished = node.plane().batches_in_flight(),
        epoch,
        "stopped"
    );
    Ok(end)
}

/// The node of one term for `cfg`: a fresh control plane whose engine's
/// threads read `clock` and tell `notify` when decisions wait, with the
/// configured admissions, membership and (for `epoch` > 0) the election's
/// fence. What [`serve`] runs, and what the per-task benchmark
/// (`cargo bench -p scheduler --bench node_path`) drives over in-memory
/// links. Also returns where the engine's threads were asked to run.
pub fn build_node<C: Connection>(
    cfg: &SchedulerConfig,
    metrics: &Arc<SchedulerMetrics>,
    epoch: u64,
    clock: &MonotonicClock,
    notify: Option<dataplane::waitset::Notifier>,
) -> Result<(SchedulerNode<C>, Vec<ThreadPlacement>), SchedulerError> {
    // The wire carries the epoch in 32 bits; an etcd revision past that is
    // refused rather than wrapped (a wrapped epoch would fence the new
    // leader instead of the old one).
    let wire_epoch = u32::try_from(epoch).map_err(|_| SchedulerError::EpochTooLarge(epoch))?;
    let mut plane = ControlPlane::new(cfg.models.clone(), &cfg.subclusters, cfg.core, metrics.clone())?;
    plane.set_closed_loop(cfg.closed_loop);
    if cfg.routes.is_some() {
        // A group owns nothing until it has read the routing table (a new
        // term included: the poll loop applies the newest table first).
        plane.await_routes();
    }
    plane.set_delay_watch(cfg.transport.name(), cfg.delay_watch);
    // The host hands the plane its clock for the benchmark stamps: the
    // plane reads none itself.
    plane.set_bench_stamps(cfg.bench_stamps.then(|| clock.origin_host_ns()), dataplane::time::host_monotonic_ns);
    let drive = Drive::Threads { clock: *clock, notify };
    let layout = plane.set_engine(cfg.engine, &cfg.pinned, drive)?;
    // After the engine is in place: a new engine starts from the cores' defaults.
    for (model, admission) in cfg.admissions.iter().enumerate() {
        // No model queue is unbounded in a daemon (issue 55): `--max-queue
        // 0` means the built-in bound.
        let admission = &crate::types::Admission {
            max_queue: if admission.max_queue == 0 { DEFAULT_QUEUE_BOUND } else { admission.max_queue },
            ..*admission
        };
        if *admission != crate::types::Admission::default() {
            let name = cfg.models.get(model).map_or("?", |m| m.name.as_str());
            info!(model = name, levels = admission.levels, default_level = admission.default_level, max_queue = admission.max_queue, "admission");
            plane.set_admission(model as u32, *admission);
        }
    }
    // The old leader finds its lease revoked at its next renewal, one
    // heartbeat after the revoke at most (plus the etcd call): plan nothing
    // before that has passed. Backends that register meanwhile learn the
    // epoch from their Welcome and refuse the old term's plans from then on.
    let fence_wait = cfg.election.as_ref().map_or(Duration::ZERO, |e| Duration::from_nanos(e.heartbeat.as_nanos().saturating_mul(2)));
    let node = SchedulerNode::new(
        plane,
        NodeConfig {
            heartbeat: cfg.heartbeat,
            dead_after: cfg.dead_after,
            handshake_timeout: HANDSHAKE,
            send_timeout: SEND_TIMEOUT,
            drain: cfg.drain,
            // A backend that is alive reports a batch long before its
            // liveness bound passes.
            batch_grace: cfg.dead_after,
            fence_wait,
        },
    )
    .with_membership(cfg.membership.clone())
    .with_epoch(wire_epoch);
    Ok((node, layout))
}

/// Whether this scheduler may go on serving its term (hot standby).
struct Term<'a> {
    election: Option<&'a ha::ElectionHost>,
    /// With `--group`: the routing table's follower and this group's name.
    routes: Option<(&'a routes_watch::RoutesWatch, &'a str)>,
    epoch: u64,
    /// A gap between two passes of the poll loop longer than this (the
    /// failure timeout) means the process was stopped or starved: a standby
    /// may have taken over meanwhile.
    stall: Option<Duration>,
    last_pass: dataplane::time::Instant,
    /// Held after a stall until the candidate has been polled again.
    hold: Option<u64>,
}

/// What [`Term::check`] found.
#[derive(PartialEq, Eq)]
enum TermCheck {
    Lead,
    /// Touch nothing until the lease is confirmed (or lost).
    Hold,
    SteppedDown,
}

impl Term<'_> {
    fn check(&mut self, now: dataplane::time::Instant) -> TermCheck {
        let Some(host) = self.election else { return TermCheck::Lead };
        if host.leading() != Some(self.epoch) {
            return TermCheck::SteppedDown;
        }
        let gap = now.saturating_since(self.last_pass);
        self.last_pass = now;
        if self.stall.is_some_and(|s| gap > s) && self.hold.is_none() {
            // Resumed after a pause (SIGSTOP, a VM stall): the term may
            // have passed to a standby that revoked the lease. Plan nothing
            // until the election thread has tried a renewal since; a
            // revoked lease then steps this scheduler down before it sends
            // a single plan of the old term.
            warn!(stalled_ms = gap.as_nanos() / 1_000_000, "the poll loop stalled past the failure timeout: holding until the lease is confirmed");
            self.hold = Some(host.polls());
        }
        match self.hold {
            Some(p) if host.polls() <= p.saturating_add(1) => TermCheck::Hold,
            Some(_) => {
                self.hold = None;
                TermCheck::Lead
            }
            None => TermCheck::Lead,
        }
    }
}

/// Notes when the term's first batch is planned (for takeover times).
struct FirstPlan<'a> {
    metrics: &'a SchedulerMetrics,
    clock: &'a MonotonicClock,
    terms: &'a TermMetrics,
    before: u64,
    seen: bool,
}

impl<'a> FirstPlan<'a> {
    fn new(metrics: &'a SchedulerMetrics, clock: &'a MonotonicClock, terms: &'a TermMetrics) -> Self {
        let before = Self::batches(metrics);
        FirstPlan { metrics, clock, terms, before, seen: false }
    }

    fn batches(metrics: &SchedulerMetrics) -> u64 {
        metrics.models.iter().map(|m| m.batches.get()).sum()
    }

    /// Checks once per busy pass until the first batch shows.
    fn check(&mut self) {
        if !self.seen && Self::batches(self.metrics) != self.before {
            self.seen = true;
            let host_ns = self.clock.origin_host_ns().saturating_add(self.clock.now().as_nanos());
            self.terms.first_plan_host_ns.set(i64::try_from(host_ns).unwrap_or(i64::MAX));
            info!(host_ns, "first batch of the term planned");
        }
    }
}

/// Logs where every scheduling thread runs.
fn log_layout(cfg: &SchedulerConfig, layout: &[ThreadPlacement]) {
    let core = |c: Option<usize>| c.map_or_else(|| "any".to_string(), |c| c.to_string());
    let io_core = cfg.pinned.cores.get(layout.len()).copied();
    if let Some(c) = io_core {
        if !core_affinity::set_for_current(core_affinity::CoreId { id: c }) {
            warn!(core = c, "cannot pin the I/O thread to its core; it runs unpinned");
        }
    }
    let threads: Vec<String> = layout
        .iter()
        .map(|p| format!("{}@{}", p.thread, core(p.core)))
        .chain(std::iter::once(format!("sched-io@{}", core(io_core))))
        .collect();
    info!(
        engine = cfg.engine.name(),
        model_threads = cfg.pinned.model_threads,
        rank_thread = if cfg.pinned.shared_rank { "shared" } else { "own" },
        idle = ?cfg.idle,
        layout = %threads.join(" "),
        "scheduler threads (thread@cpu)"
    );
}

/// Logs what the scheduler runs with and prints the READY line.
fn announce(cfg: &SchedulerConfig, control_addr: &str, metrics: SocketAddr) {
    info!(
        models = cfg.models.len(),
        subclusters = cfg.subclusters.len(),
        transport = %cfg.transport.name(),
        control = %control_addr,
        metrics = %format_args!("http://{metrics}/metrics"),
        "scheduler serving"
    );
    info!(
        wire_version = dataplane::wire::VERSION,
        oldest_peer_version = dataplane::wire::OLDEST_PEER_VERSION,
        control_delay_us = cfg.core.delay.d_ctrl.as_nanos() / 1000,
        "control delay bound announced to every peer"
    );
    if cfg.membership.token.is_some() {
        info!("peers must prove the join token");
    } else {
        warn!("OPEN MEMBERSHIP: any peer that reaches the port may join");
    }
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "READY control={control_addr} metrics={metrics}");
    let _ = out.flush();
}

/// The poll loop: new links, the node's work and events, the stop signal
/// (then a drain), the loss of the leadership (then at once), and idling on the links' wait fds until the node's
/// next timer.
fn poll_until_drained<C: Connection>(
    node: &mut SchedulerNode<C>,
    acceptor: &Acceptor<C>,
    idle: &mut IdleWait,
    clock: &MonotonicClock,
    term: &mut Term<'_>,
    first_plan: &mut FirstPlan<'_>,
) -> TermEnd {
    let mut watched = WatchList::new();
    let mut bells = DoorbellWatch::new();
    let mut synced = None;
    let mut ready = Vec::new();
    let metrics = node.plane().metrics().clone();
    loop {
        metrics.poll_passes.inc();
        match term.check(clock.now()) {
            // Stop planning at once: the links close when the node drops.
            TermCheck::SteppedDown => return TermEnd::SteppedDown,
            TermCheck::Hold => {
                idle.set().wait(Duration::from_millis(5));
                continue;
            }
            TermCheck::Lead => {}
        }
        let now = clock.now();
        let mut busy = false;
        if let Some((watch, group)) = term.routes {
            if let Some(table) = watch.newer_than(node.route_revision()) {
                if node.handle_routes(now, &table, group) {
                    let owned: Vec<&str> = table.group(group).map_or(Vec::new(), |g| table.groups[g].models.iter().map(String::as_str).collect());
                    info!(revision = table.revision, group, owns = ?owned, "routing table applied");
                    busy = true;
                }
            }
        }
        while let Some(c) = acceptor.try_next() {
            node.handle_connection(now, c);
            busy = true;
        }
        // One epoll_wait per pass tells which armed links have bytes: the
        // node then skips the rest instead of a recv each that finds
        // nothing. Right after a sleep the wait's own answer serves
        // (`WaitSet::ready_now`), without a second epoll_wait.
        // The watch list is rebuilt only when the links changed (listing
        // and sorting ~300 links took ~10% of a busy daemon's time).
        if synced != Some(node.link_set_version()) {
            sync_watch(node, idle, &mut watched, &mut bells);
            synced = Some(node.link_set_version());
        }
        ready.clear();
        idle.set().ready_now(&mut ready);
        // shm links subscribed to the doorbell: the flagged ones.
        bells.take_ready(&mut ready);
        node.set_readable(ready.iter().copied());
        busy |= node.poll(now);
        while let Some(ev) = node.poll_event() {
            log_event(&ev);
        }
        if !node.stopping() && control::stop_requested() {
            info!(batches_in_flight = node.plane().batches_in_flight(), "stopping");
            node.stop();
            continue;
        }
        if node.drained() {
            return TermEnd::Stopped;
        }
        if busy {
            first_plan.check();
            idle.reset();
        } else if !node.arm_waits() {
            // A send or progress late in the pass (heartbeats after the
            // flush) took a peer's bytes in: its fd is quiet now, so a
            // sleep would strand the message until the next timer. Or
            // a message arrived while the links were armed for the sleep.
            continue;
        } else {
            if synced != Some(node.link_set_version()) {
                sync_watch(node, idle, &mut watched, &mut bells);
                synced = Some(node.link_set_version());
            }
            // Under an election, wake well within the stall bound, so
            // that an idle loop is never mistaken for a stopped one.
            let longest = term.stall.map_or(Duration::from_millis(100), |s| Duration::from_nanos((s.as_nanos() / 2).min(100_000_000)));
            let next = node.wake_at().unwrap_or(now + longest).min(now + longest);
            // The pinned runtime's threads notify the wait set when they
            // hand decisions over; the recheck closes the race with a
            // notify sent just before this thread declared itself asleep.
            // The doorbell is armed last: a link flagged meanwhile means
            // no sleep (its key comes with the next pass's take_ready).
            let (sleeps, spins) = (idle.sleeps, idle.timer_spins);
            idle.idle_unless(next.saturating_since(clock.now()), || node.plane().has_decisions() || !bells.arm());
            bells.disarm();
            metrics.poll_sleeps.inc_by(idle.sleeps - sleeps);
            metrics.poll_timer_spins.inc_by(idle.timer_spins - spins);
        }
    }
}

/// Makes the wait set watch the live links' fds and the doorbell (shm
/// links subscribe to it: their peers then ring it instead of writing a
/// byte to each link's socket).
fn sync_watch<C: Connection>(node: &mut SchedulerNode<C>, idle: &mut IdleWait, watched: &mut WatchList, bells: &mut DoorbellWatch) {
    bells.begin_sync();
    watched.sync(idle.set(), |live| {
        node.for_each_conn(|key, c| {
            live.extend(c.wait_fd().map(|fd| (key, fd)));
            bells.watch(key, c);
        })
    });
    bells.end_sync(idle.set());
}

fn log_event(ev: &SchedulerEvent) {
    match ev {
        SchedulerEvent::PeerJoined(_) | SchedulerEvent::PeerLost(_) => info!("{ev}"),
        _ => warn!("{ev}"),
    }
}
