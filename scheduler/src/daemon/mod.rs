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
//! acceptor thread, the real clock, stop signals, logging and the idle
//! strategy over the links' wait fds.

pub mod metrics;
pub mod node;
pub mod plane;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

use clap::Parser;
use dataplane::control::{self, MetricsEndpoint, TransportKind, WithDomain};
use dataplane::time::{Duration, MonotonicClock};
use dataplane::transport::{Connection, Domain, Error, Listener};
use dataplane::waitset::{IdleWait, WatchList};
use serde::Deserialize;

use crate::deferred::CoreConfig;
use crate::netdelay::NetworkDelay;
use crate::zoo::{cluster_models, ModelSpec};
use dataplane::join::{JoinToken, TOKEN_ENV};
use metrics::SchedulerMetrics;
use node::{Membership, NodeConfig, SchedulerNode};
use plane::ControlPlane;

/// Command line (every option may also come from `--config FILE.toml`,
/// keyed by the long name with `_` for `-`; flags win).
#[derive(Parser, Debug, Default, Deserialize)]
#[command(name = "symphony-scheduler", about = "The Symphony centralized scheduler daemon")]
#[serde(default, deny_unknown_fields)]
pub struct SchedulerArgs {
    /// TOML configuration file.
    #[arg(long)]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Control address to listen on (tcp: HOST:PORT; shm: a socket path or
    /// "@name"; default: a fresh one, printed on the READY line).
    #[arg(long)]
    pub listen: Option<String>,
    /// Transport: shm, tcp, tcp-blocking, rdma [default: shm].
    #[arg(long)]
    pub transport: Option<String>,
    /// Model zoo table: a100 or 1080ti [default: a100].
    #[arg(long)]
    pub zoo: Option<String>,
    /// Models of the zoo (all, strong, weak, none, or names) [default: all].
    #[arg(long)]
    pub models: Option<String>,
    /// Extra model NAME=ALPHA_MS,BETA_MS,SLO_MS (repeatable).
    #[arg(long = "model")]
    pub model: Vec<String>,
    /// A sub-cluster: comma-separated model names (repeatable) [default: one with every model].
    #[arg(long = "subcluster")]
    pub subcluster: Vec<String>,
    /// Network delay calibration (netbench calibrate's TOML).
    #[arg(long)]
    pub network_delay: Option<PathBuf>,
    /// Control delay d_ctrl when no calibration file is given, µs [default: 1000].
    #[arg(long)]
    pub control_delay_us: Option<f64>,
    /// Narrowest schedulable window: this process's timer lateness bound, µs [default: 2000].
    #[arg(long)]
    pub min_window_us: Option<f64>,
    /// Heartbeat interval, ms [default: 100].
    #[arg(long)]
    pub heartbeat_ms: Option<u64>,
    /// A peer silent this long is dead, ms [default: 1000].
    #[arg(long)]
    pub dead_after_ms: Option<u64>,
    /// Idle strategy: spin, yield, park, park:US [default: park].
    #[arg(long)]
    pub idle: Option<String>,
    /// Prometheus /metrics address [default: 127.0.0.1:0].
    #[arg(long)]
    pub metrics: Option<String>,
    /// On shutdown, wait at most this long for batches in flight, ms [default: 2000].
    #[arg(long)]
    pub drain_ms: Option<u64>,
    /// Exit when the parent process dies.
    #[arg(long)]
    #[serde(default)]
    pub exit_with_parent: bool,
    /// File holding the cluster's join token (else the environment's
    /// SYMPHONY_JOIN_TOKEN; never a flag's value). Peers must prove it.
    #[arg(long)]
    pub join_token_file: Option<PathBuf>,
    /// Let any peer that reaches the port join, without a token (a test
    /// setup on a trusted host only).
    #[arg(long)]
    #[serde(default)]
    pub open_membership: bool,
    /// Most live frontends [default: 4096, the id bound].
    #[arg(long)]
    pub max_frontends: Option<usize>,
    /// Most live backends [default: the id bound].
    #[arg(long)]
    pub max_backends: Option<usize>,
    /// Most links registering at once [default: 256].
    #[arg(long)]
    pub max_registering: Option<usize>,
}

/// The resolved configuration.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Listen address.
    pub listen: String,
    /// Transport.
    pub transport: TransportKind,
    /// Models (global id = index).
    pub models: Vec<ModelSpec>,
    /// Sub-clusters as lists of global model ids.
    pub subclusters: Vec<Vec<u32>>,
    /// Scheduling core configuration (delay and min window included).
    pub core: CoreConfig,
    /// Heartbeat interval.
    pub heartbeat: Duration,
    /// Silence that makes a peer dead.
    pub dead_after: Duration,
    /// Idle strategy.
    pub idle: dataplane::idle::IdleStrategy,
    /// Metrics address.
    pub metrics: SocketAddr,
    /// Shutdown drain bound.
    pub drain: Duration,
    /// The join token and the registration limits.
    pub membership: Membership,
}

impl SchedulerArgs {
    /// Merges the config file (if any) under the flags and validates.
    pub fn resolve(self) -> Result<SchedulerConfig, String> {
        let file = match &self.config {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .map_err(|e| format!("cannot read {}: {e}", p.display()))?;
                toml::from_str::<SchedulerArgs>(&text)
                    .map_err(|e| format!("bad config {}: {e}", p.display()))?
            }
            None => SchedulerArgs::default(),
        };
        let a = self;
        let transport = TransportKind::parse(a.transport.or(file.transport).as_deref().unwrap_or("shm"))?;
        let listen = a
            .listen
            .or(file.listen)
            .unwrap_or_else(|| transport.ephemeral_listen("127.0.0.1"));
        let extra = if a.model.is_empty() { file.model } else { a.model };
        let models = cluster_models(
            a.zoo.or(file.zoo).as_deref().unwrap_or("a100"),
            a.models.or(file.models).as_deref().unwrap_or("all"),
            &extra,
        )?;
        let groups = if a.subcluster.is_empty() { file.subcluster } else { a.subcluster };
        let subclusters = if groups.is_empty() {
            vec![(0..models.len() as u32).collect()]
        } else {
            groups
                .iter()
                .map(|g| {
                    g.split(',')
                        .map(str::trim)
                        .filter(|n| !n.is_empty())
                        .map(|n| {
                            models
                                .iter()
                                .position(|m| m.name == n)
                                .map(|i| i as u32)
                                .ok_or_else(|| format!("sub-cluster names unknown model '{n}'"))
                        })
                        .collect::<Result<Vec<u32>, String>>()
                })
                .collect::<Result<Vec<_>, _>>()?
        };
        let delay = match a.network_delay.or(file.network_delay) {
            Some(p) => {
                let text = std::fs::read_to_string(&p)
                    .map_err(|e| format!("cannot read {}: {e}", p.display()))?;
                NetworkDelay::from_toml(&text)?
            }
            None => {
                let us = a.control_delay_us.or(file.control_delay_us).unwrap_or(1000.0);
                if !(us.is_finite() && (0.0..=1e6).contains(&us)) {
                    return Err("--control-delay-us must be in [0, 1e6]".into());
                }
                NetworkDelay {
                    d_ctrl: Duration::from_nanos((us * 1000.0) as u64),
                    d_data: Duration::ZERO,
                }
            }
        };
        let min_window_us = a.min_window_us.or(file.min_window_us).unwrap_or(2000.0);
        if !(min_window_us.is_finite() && (0.0..=1e6).contains(&min_window_us)) {
            return Err("--min-window-us must be in [0, 1e6]".into());
        }
        let core = CoreConfig {
            delay,
            min_window: Duration::from_nanos((min_window_us * 1000.0) as u64),
            ..CoreConfig::default()
        };
        let heartbeat_ms = a.heartbeat_ms.or(file.heartbeat_ms).unwrap_or(100);
        let dead_ms = a.dead_after_ms.or(file.dead_after_ms).unwrap_or(1000);
        if heartbeat_ms == 0 || dead_ms <= heartbeat_ms {
            return Err("need 0 < --heartbeat-ms < --dead-after-ms".into());
        }
        let idle = control::parse_idle(a.idle.or(file.idle).as_deref().unwrap_or("park"))?;
        let metrics = a
            .metrics
            .or(file.metrics)
            .unwrap_or_else(|| "127.0.0.1:0".into());
        let metrics: SocketAddr = metrics
            .parse()
            .map_err(|e| format!("bad --metrics address '{metrics}': {e}"))?;
        let token = JoinToken::from_file_or_env(a.join_token_file.or(file.join_token_file).as_deref())?;
        let open = a.open_membership || file.open_membership;
        let mut membership = match (token, open) {
            (Some(_), true) => {
                return Err("a join token and --open-membership exclude each other".into())
            }
            (Some(t), false) => Membership::with_token(t),
            (None, true) => Membership::open(),
            (None, false) => {
                return Err(format!(
                    "no join token: give --join-token-file PATH or set {TOKEN_ENV} (or --open-membership to let any peer join)"
                ))
            }
        };
        let limit = |v: Option<usize>, name: &str, default: usize, max: usize| match v {
            None => Ok(default),
            Some(n) if (1..=max).contains(&n) => Ok(n),
            Some(n) => Err(format!("--{name} {n}: must be 1..={max}")),
        };
        let m = &mut membership;
        m.max_frontends = limit(a.max_frontends.or(file.max_frontends), "max-frontends", m.max_frontends, m.max_frontends)?;
        m.max_backends = limit(a.max_backends.or(file.max_backends), "max-backends", m.max_backends, m.max_backends)?;
        m.max_pending = limit(a.max_registering.or(file.max_registering), "max-registering", m.max_pending, 65536)?;
        Ok(SchedulerConfig {
            membership,
            listen,
            transport,
            models,
            subclusters,
            core,
            heartbeat: Duration::from_millis(heartbeat_ms),
            dead_after: Duration::from_millis(dead_ms),
            idle,
            metrics,
            drain: Duration::from_millis(a.drain_ms.or(file.drain_ms).unwrap_or(2000)),
        })
    }
}

/// Entry point of the `symphony-scheduler` binary (and of `symphony
/// daemon scheduler`): parses `args` (program name first), runs until
/// SIGINT/SIGTERM. Exit codes: 0 after a stop signal, 2 for a bad command
/// line or configuration, 1 for a failure at run time.
pub fn main_with_args(args: Vec<String>) -> std::process::ExitCode {
    let parsed = match SchedulerArgs::try_parse_from(args) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return std::process::ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    if parsed.exit_with_parent {
        control::terminate_with_parent();
    }
    let cfg = match parsed.resolve() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("symphony-scheduler: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let result = control::install_stop_signals()
        .and_then(|()| control::with_domain(cfg.transport, Serve(cfg))?);
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("symphony-scheduler: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

struct Serve(SchedulerConfig);

impl WithDomain for Serve {
    type Out = Result<(), String>;
    fn run<D: Domain>(self, domain: D) -> Result<(), String> {
        serve(domain, self.0)
    }
}

/// A new connection must register within this.
const HANDSHAKE: Duration = Duration::from_millis(5000);
/// A peer whose send queue stays full this long is dead.
const SEND_TIMEOUT: Duration = Duration::from_millis(100);

/// Runs the scheduler on `domain` until a stop is requested.
pub fn serve<D: Domain>(domain: D, cfg: SchedulerConfig) -> Result<(), String> {
    let mut listener = domain
        .listen(&cfg.listen)
        .map_err(|e| format!("cannot listen on '{}': {e}", cfg.listen))?;
    let control_addr = listener.local_addr();
    let metrics = Arc::new(SchedulerMetrics::new(&cfg.models));
    let endpoint = MetricsEndpoint::start(cfg.metrics, metrics.registry().clone())
        .map_err(|e| format!("cannot serve metrics on {}: {e}", cfg.metrics))?;
    let plane = ControlPlane::new(cfg.models.clone(), &cfg.subclusters, cfg.core, metrics.clone())?;

    let mut idle = IdleWait::new(cfg.idle).map_err(|e| format!("cannot create the wait set: {e}"))?;
    let wake = idle.set().notifier();
    let stop_accepting = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel::<D::Conn>();
    let flag = stop_accepting.clone();
    let acceptor = std::thread::Builder::new()
        .name("sched-accept".into())
        .spawn(move || {
            while !flag.load(Ordering::SeqCst) {
                match listener.accept(Duration::from_millis(100)) {
                    Ok(c) => {
                        if tx.send(c).is_err() {
                            break;
                        }
                        wake.signal();
                    }
                    Err(Error::Timeout) => {}
                    Err(e) => {
                        eprintln!("symphony-scheduler: accept: {e}");
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                }
            }
        })
        .map_err(|e| format!("cannot start the acceptor: {e}"))?;

    eprintln!(
        "symphony-scheduler: {} models in {} sub-cluster(s), transport {}, control {control_addr}, metrics http://{}/metrics",
        cfg.models.len(),
        cfg.subclusters.len(),
        cfg.transport.name(),
        endpoint.addr()
    );
    eprintln!(
        "symphony-scheduler: wire version {} (accepting peers of {}..={}); control delay bound {} µs announced to every peer; {}",
        dataplane::wire::VERSION,
        dataplane::wire::OLDEST_PEER_VERSION,
        dataplane::wire::VERSION,
        cfg.core.delay.d_ctrl.as_nanos() / 1000,
        if cfg.membership.token.is_some() {
            "peers must prove the join token"
        } else {
            "OPEN MEMBERSHIP: any peer that reaches the port may join"
        }
    );
    println!("READY control={control_addr} metrics={}", endpoint.addr());
    use std::io::Write;
    let _ = std::io::stdout().flush();

    let clock = MonotonicClock::new();
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
        },
    )
    .with_membership(cfg.membership.clone());
    let mut watched = WatchList::new();
    loop {
        let now = clock.now();
        let mut busy = false;
        while let Ok(c) = rx.try_recv() {
            node.handle_connection(now, c);
            busy = true;
        }
        busy |= node.poll(now);
        while let Some(ev) = node.poll_event() {
            eprintln!("symphony-scheduler: {ev}");
        }
        if !node.stopping() && control::stop_requested() {
            eprintln!(
                "symphony-scheduler: stopping; {} batches in flight",
                node.plane().batches_in_flight()
            );
            node.stop();
            continue;
        }
        if node.drained() {
            break;
        }
        if busy {
            idle.reset();
        } else {
            watched.sync(idle.set(), |live| {
                node.for_each_conn(|key, c| live.extend(c.wait_fd().map(|fd| (key, fd))))
            });
            let next = node.poll_at().unwrap_or(now + Duration::from_millis(100));
            idle.idle(next.saturating_since(clock.now()));
        }
    }
    stop_accepting.store(true, Ordering::SeqCst);
    drop(rx);
    let _ = acceptor.join();
    let (f, b) = node.plane().peers();
    eprintln!(
        "symphony-scheduler: stopped ({f} frontends, {b} backends connected; {} batches unfinished)",
        node.plane().batches_in_flight()
    );
    Ok(())
}

