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
//! daemon shell's ([`dataplane::shell`]); the options are in [`config`].

pub mod bench_stamps;
pub mod config;
pub mod engine;
pub mod metrics;
pub mod node;
pub mod plane;

use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;

use dataplane::control::{self, ControlError, MetricsEndpoint, WithDomain};
use dataplane::shell::{self, Acceptor, Common, CommonArgs, ConfigError, Daemon};
use dataplane::time::{Duration, MonotonicClock};
use dataplane::transport::{Connection, Domain, Listener};
use dataplane::waitset::{IdleWait, WatchList};
use tracing::{info, warn};

pub use config::{ModelListArgs, SchedulerArgs, SchedulerConfig};
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
    /// The models and sub-clusters do not make a control plane.
    #[error("{0}")]
    Plane(String),
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
/// daemon scheduler`): see [`dataplane::shell::main`].
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

/// A new connection must register within this.
const HANDSHAKE: Duration = Duration::from_millis(5000);
/// A peer whose send queue stays full this long is dead.
const SEND_TIMEOUT: Duration = Duration::from_millis(100);

/// Runs the scheduler on `domain` until a stop is requested.
pub fn serve<D: Domain>(domain: D, cfg: SchedulerConfig) -> Result<(), SchedulerError> {
    let listener = domain.listen(&cfg.listen).map_err(|source| SchedulerError::Listen {
        addr: cfg.listen.clone(),
        source,
    })?;
    let control_addr = listener.local_addr();
    let metrics = Arc::new(SchedulerMetrics::new(&cfg.models));
    let endpoint = MetricsEndpoint::start(cfg.metrics, metrics.registry().clone())
        .map_err(|source| SchedulerError::Metrics { addr: cfg.metrics, source })?;
    let mut plane = ControlPlane::new(cfg.models.clone(), &cfg.subclusters, cfg.core, metrics)
        .map_err(|e| SchedulerError::Plane(e.to_string()))?;
    plane.set_closed_loop(cfg.closed_loop);
    plane.set_delay_watch(cfg.transport.name(), cfg.delay_watch);
    let clock = MonotonicClock::new();
    plane.set_bench_stamps(cfg.bench_stamps.then(|| clock.origin_host_ns()));
    let setup = |what| move |source| SchedulerError::Setup { what, source };
    let mut idle = IdleWait::new(cfg.idle).map_err(setup("wait set"))?;
    let drive = Drive::Threads { clock, notify: Some(idle.notifier()) };
    let layout = plane.set_engine(cfg.engine, &cfg.pinned, drive).map_err(|e| SchedulerError::Plane(e.to_string()))?;
    // After the engine is in place: a new engine starts from the cores' defaults.
    for (model, admission) in cfg.admissions.iter().enumerate() {
        if *admission != crate::types::Admission::default() {
            let name = cfg.models.get(model).map_or("?", |m| m.name.as_str());
            info!(model = name, levels = admission.levels, default_level = admission.default_level, max_queue = admission.max_queue, "admission");
            plane.set_admission(model as u32, *admission);
        }
    }
    let acceptor = Acceptor::spawn("sched-accept", listener, idle.set().notifier())
        .map_err(setup("acceptor thread"))?;
    // After the acceptor's spawn: it would inherit this thread's CPU.
    log_layout(&cfg, &layout);
    announce(&cfg, &control_addr, endpoint.addr());
    let mut node = SchedulerNode::new(
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
            ..NodeConfig::default()
        },
    )
    .with_membership(cfg.membership.clone());
    poll_until_drained(&mut node, &acceptor, &mut idle, &clock);
    drop(acceptor);
    let (frontends, backends) = node.plane().peers();
    info!(
        frontends,
        backends,
        batches_unfinished = node.plane().batches_in_flight(),
        "stopped"
    );
    Ok(())
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
/// (then a drain), and idling on the links' wait fds until the node's
/// next timer.
fn poll_until_drained<C: Connection>(node: &mut SchedulerNode<C>, acceptor: &Acceptor<C>, idle: &mut IdleWait, clock: &MonotonicClock) {
    let mut watched = WatchList::new();
    loop {
        let now = clock.now();
        let mut busy = false;
        while let Some(c) = acceptor.try_next() {
            node.handle_connection(now, c);
            busy = true;
        }
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
            return;
        }
        if busy {
            idle.reset();
        } else {
            watched.sync(idle.set(), |live| {
                node.for_each_conn(|key, c| live.extend(c.wait_fd().map(|fd| (key, fd))))
            });
            let next = node.poll_at().unwrap_or(now + Duration::from_millis(100));
            // The pinned runtime's threads notify the wait set when they
            // hand decisions over; the recheck closes the race with a
            // notify sent just before this thread declared itself asleep.
            idle.idle_unless(next.saturating_since(clock.now()), || node.plane().has_decisions());
        }
    }
}

fn log_event(ev: &SchedulerEvent) {
    match ev {
        SchedulerEvent::PeerJoined(_) | SchedulerEvent::PeerLost(_) => info!("{ev}"),
        _ => warn!("{ev}"),
    }
}
