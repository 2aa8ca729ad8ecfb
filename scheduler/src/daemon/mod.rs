//! `symphony-scheduler`: the centralized scheduler as a daemon.
//!
//! Frontends and backends connect over a dataplane transport and register
//! (see `docs/architecture.md`, "Daemon protocol"). Tasks become requests
//! of the sub-cluster that serves their model; the sub-cluster's
//! [`DeferredScheduler`](crate::deferred::DeferredScheduler) decides batches,
//! which go to the owning backend as batch plans. The logic is the sans-IO
//! [`plane::ControlPlane`]; this module is its I/O loop: accepting and
//! handshaking peers, moving messages, heartbeats and liveness, the real
//! clock and the idle strategy.

pub mod metrics;
pub mod plane;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

use clap::Parser;
use dataplane::control::{self, Liveness, MetricsEndpoint, TransportKind, WithDomain};
use dataplane::waitset::IdleWait;
use dataplane::time::{Duration, Instant, MonotonicClock};
use dataplane::transport::{Connection, Domain, Error, Listener};
use dataplane::wire::{self, Message, Role};
use serde::Deserialize;

use crate::deferred::CoreConfig;
use crate::netdelay::NetworkDelay;
use crate::zoo::{cluster_models, ModelSpec};
use metrics::SchedulerMetrics;
use plane::{ControlPlane, PeerId};

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
        Ok(SchedulerConfig {
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

/// A registered peer's connection.
struct Link<C> {
    conn: C,
    live: Liveness,
}

/// A connection that has not finished registering.
struct Pending<C> {
    conn: C,
    since: Instant,
    /// A backend's Register, waiting for its Models message.
    backend: Option<wire::Register>,
}

const HANDSHAKE: Duration = Duration::from_millis(5000);
/// Messages taken from one peer per pass (bounds a pass's work).
const MSGS_PER_PEER: usize = 256;

/// Runs the scheduler on `domain` until a stop is requested.
pub fn serve<D: Domain>(domain: D, cfg: SchedulerConfig) -> Result<(), String> {
    let mut listener = domain
        .listen(&cfg.listen)
        .map_err(|e| format!("cannot listen on '{}': {e}", cfg.listen))?;
    let control_addr = listener.local_addr();
    let metrics = Arc::new(SchedulerMetrics::new(&cfg.models));
    let render = metrics.clone();
    let endpoint = MetricsEndpoint::start(cfg.metrics, Arc::new(move || render.render()))
        .map_err(|e| format!("cannot serve metrics on {}: {e}", cfg.metrics))?;
    let mut plane = ControlPlane::new(cfg.models.clone(), &cfg.subclusters, cfg.core, metrics.clone())?;

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
    println!("READY control={control_addr} metrics={}", endpoint.addr());
    use std::io::Write;
    let _ = std::io::stdout().flush();

    let clock = MonotonicClock::new();
    let mut io = Io::<D::Conn> {
        frontends: HashMap::new(),
        backends: HashMap::new(),
        pending: Vec::new(),
        dead: Vec::new(),
        buf: vec![0u8; wire::MAX_MESSAGE_LEN],
        hb: [0u8; 64],
        ids: Vec::new(),
        cfg: cfg.clone(),
        metrics: metrics.clone(),
        idle,
    };
    let mut last = clock.now();
    let mut drain_until: Option<Instant> = None;
    loop {
        let now = clock.now();
        let online = plane.online_gpus() as u64;
        metrics.gpu_online_ns.fetch_add(
            online.saturating_mul(now.saturating_since(last).as_nanos()),
            Ordering::Relaxed,
        );
        last = now;
        let mut busy = false;
        while let Ok(c) = rx.try_recv() {
            io.watch(&c);
            io.pending.push(Pending {
                conn: c,
                since: now,
                backend: None,
            });
            busy = true;
        }
        busy |= io.handshakes(now, &mut plane);
        busy |= io.receive(now, &mut plane);
        if plane.poll_at().is_some_and(|t| t <= now) {
            plane.on_wake(now);
            busy = true;
        }
        // The outbox first: a new peer's first message must be its ack,
        // before any heartbeat.
        busy |= io.flush(&mut plane);
        io.liveness(now);
        while !io.dead.is_empty() {
            io.bury(now, &mut plane);
            io.flush(&mut plane);
        }
        match drain_until {
            None if control::stop_requested() => {
                eprintln!("symphony-scheduler: stopping; {} batches in flight", plane.batches_in_flight());
                plane.stop();
                io.flush(&mut plane);
                drain_until = Some(now + cfg.drain);
            }
            Some(t) if plane.batches_in_flight() == 0 || now >= t => break,
            _ => {}
        }
        if busy {
            io.idle.reset();
        } else {
            let next = [plane.poll_at(), io.next_heartbeat(), drain_until]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(now + Duration::from_millis(100));
            io.idle.idle(next.saturating_since(clock.now()));
        }
    }
    stop_accepting.store(true, Ordering::SeqCst);
    drop(rx);
    let _ = acceptor.join();
    let (f, b) = plane.peers();
    eprintln!(
        "symphony-scheduler: stopped ({f} frontends, {b} backends connected; {} batches unfinished)",
        plane.batches_in_flight()
    );
    Ok(())
}

/// Takes up to [`MSGS_PER_PEER`] messages from one peer: heartbeats are
/// proof of life, `handle` takes the rest (false: not a message this peer
/// may send, counted); garbage or a failed connection marks the peer dead.
/// Returns whether anything arrived.
fn drain_link<C: Connection>(
    link: &mut Link<C>,
    buf: &mut [u8],
    now: Instant,
    peer: PeerId,
    dead: &mut Vec<PeerId>,
    metrics: &SchedulerMetrics,
    mut handle: impl FnMut(Message<'_>, &[u8]) -> bool,
) -> bool {
    let mut any = false;
    for _ in 0..MSGS_PER_PEER {
        let n = match link.conn.try_recv(buf) {
            Ok(Some(n)) => n,
            Ok(None) => break,
            Err(_) => {
                dead.push(peer);
                break;
            }
        };
        any = true;
        link.live.heard(now);
        let bytes = &buf[..n];
        match wire::decode(bytes) {
            Ok(Message::Heartbeat(_)) => {}
            Ok(m) => {
                if !handle(m, bytes) {
                    metrics.protocol_errors.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(_) => {
                metrics.protocol_errors.fetch_add(1, Ordering::Relaxed);
                dead.push(peer);
                break;
            }
        }
    }
    any
}

struct Io<C: Connection> {
    frontends: HashMap<u32, Link<C>>,
    backends: HashMap<u32, Link<C>>,
    pending: Vec<Pending<C>>,
    dead: Vec<PeerId>,
    buf: Vec<u8>,
    hb: [u8; 64],
    ids: Vec<u32>,
    cfg: SchedulerConfig,
    metrics: Arc<SchedulerMetrics>,
    /// Idle strategy and the wait set over every connection.
    idle: IdleWait,
}

impl<C: Connection> Io<C> {
    /// Wakes the idle loop when `conn` has work.
    fn watch(&mut self, conn: &C) {
        if let Some(fd) = conn.wait_fd() {
            let _ = self.idle.set().add(fd);
        }
    }

    /// Stops watching `conn` (before it is dropped).
    fn unwatch(&mut self, conn: &C) {
        if let Some(fd) = conn.wait_fd() {
            self.idle.set().remove(fd);
        }
    }

    /// Drops pending connection `i`.
    fn drop_pending(&mut self, i: usize) {
        let p = self.pending.swap_remove(i);
        self.unwatch(&p.conn);
    }

    fn new_link(&self, conn: C, now: Instant) -> Link<C> {
        Link {
            conn,
            live: Liveness::new(now, self.cfg.heartbeat, self.cfg.dead_after),
        }
    }

    /// Moves registering connections along: Register (then Models for a
    /// backend) within [`HANDSHAKE`], else the connection is dropped.
    fn handshakes(&mut self, now: Instant, plane: &mut ControlPlane) -> bool {
        let mut any = false;
        let mut i = 0;
        while i < self.pending.len() {
            let p = &mut self.pending[i];
            let got = match p.conn.try_recv(&mut self.buf) {
                Ok(Some(n)) => Some(n),
                Ok(None) => None,
                Err(e) => {
                    eprintln!("symphony-scheduler: a registering peer failed: {e}");
                    self.drop_pending(i);
                    continue;
                }
            };
            let Some(n) = got else {
                if now.saturating_since(p.since) > HANDSHAKE {
                    eprintln!("symphony-scheduler: a peer did not register within {HANDSHAKE:?}");
                    self.drop_pending(i);
                    self.metrics.refused.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                i += 1;
                continue;
            };
            any = true;
            let outcome = match (wire::decode(&self.buf[..n]), p.backend) {
                (Ok(Message::Register(r)), None) => match r.role() {
                    Some(Role::Frontend) => Some(
                        plane
                            .frontend_joined(r.id, r.endpoint())
                            .map(|()| PeerId::Frontend(r.id))
                            .map_err(|e| format!("frontend {}: {e}", r.id)),
                    ),
                    Some(Role::Backend) => {
                        p.backend = Some(r);
                        None
                    }
                    _ => Some(Err("a peer registered with an unexpected role".into())),
                },
                (Ok(Message::Models(ids)), Some(r)) => {
                    self.ids.clear();
                    self.ids.extend(ids.iter());
                    Some(
                        plane
                            .backend_joined(now, r.id, r.count, &self.ids)
                            .map(|()| PeerId::Backend(r.id))
                            .map_err(|e| format!("backend {}: {e}", r.id)),
                    )
                }
                (Ok(_), _) => Some(Err("a peer broke the registration handshake".into())),
                (Err(e), _) => Some(Err(format!("a registering peer sent garbage: {e}"))),
            };
            match outcome {
                None => i += 1,
                Some(Ok(peer)) => {
                    let p = self.pending.swap_remove(i);
                    let link = self.new_link(p.conn, now);
                    match peer {
                        PeerId::Frontend(id) => {
                            eprintln!("symphony-scheduler: frontend {id} registered");
                            self.frontends.insert(id, link);
                        }
                        PeerId::Backend(id) => {
                            eprintln!("symphony-scheduler: backend {id} registered");
                            self.backends.insert(id, link);
                        }
                    }
                }
                Some(Err(why)) => {
                    eprintln!("symphony-scheduler: registration refused: {why}");
                    self.metrics.refused.fetch_add(1, Ordering::Relaxed);
                    self.drop_pending(i);
                }
            }
        }
        any
    }

    /// Takes messages from every registered peer.
    fn receive(&mut self, now: Instant, plane: &mut ControlPlane) -> bool {
        let mut any = false;
        self.ids.clear();
        self.ids.extend(self.frontends.keys().copied());
        for k in 0..self.ids.len() {
            let id = self.ids[k];
            let Some(link) = self.frontends.get_mut(&id) else { continue };
            any |= drain_link(link, &mut self.buf, now, PeerId::Frontend(id), &mut self.dead, &self.metrics, |m, _| match m {
                Message::Task(t) => {
                    plane.on_task(now, id, &t);
                    true
                }
                _ => false,
            });
        }
        self.ids.clear();
        self.ids.extend(self.backends.keys().copied());
        for k in 0..self.ids.len() {
            let id = self.ids[k];
            let Some(link) = self.backends.get_mut(&id) else { continue };
            any |= drain_link(link, &mut self.buf, now, PeerId::Backend(id), &mut self.dead, &self.metrics, |m, bytes| match m {
                Message::BatchDone(d) => {
                    plane.on_batch_done(now, id, &d);
                    true
                }
                Message::Completion(h, _) => {
                    plane.on_rerouted_completion(bytes, h.task_id);
                    true
                }
                _ => false,
            });
        }
        any
    }

    /// Sends due heartbeats and declares silent peers dead.
    fn liveness(&mut self, now: Instant) {
        let hb = &mut self.hb;
        let dead = &mut self.dead;
        let links = self
            .frontends
            .iter_mut()
            .map(|(&id, l)| (PeerId::Frontend(id), l))
            .chain(self.backends.iter_mut().map(|(&id, l)| (PeerId::Backend(id), l)));
        for (peer, link) in links {
            if link.live.expired(now) {
                eprintln!("symphony-scheduler: {peer:?} silent for too long");
                dead.push(peer);
                continue;
            }
            // No separate progress(): `receive` has just drained every link
            // with try_recv, which drives the connection (flushes sends,
            // notices a departure) in the same call.
            if let Some(n) = link.live.due(now, Role::Scheduler, 0, hb) {
                match link.conn.send(&hb[..n]) {
                    Ok(()) | Err(Error::QueueFull) => {}
                    Err(_) => dead.push(peer),
                }
            }
        }
    }

    fn next_heartbeat(&self) -> Option<Instant> {
        self.frontends
            .values()
            .chain(self.backends.values())
            .map(|l| l.live.next_send())
            .min()
    }

    /// Sends the plane's outbox. A peer whose queue stays full for 100 ms
    /// or whose connection fails is dead.
    fn flush(&mut self, plane: &mut ControlPlane) -> bool {
        let out = plane.outbox();
        if out.is_empty() {
            return false;
        }
        for (peer, msg) in out.iter() {
            if self.dead.contains(&peer) {
                continue;
            }
            let Some(link) = (match peer {
                PeerId::Frontend(id) => self.frontends.get_mut(&id),
                PeerId::Backend(id) => self.backends.get_mut(&id),
            }) else {
                continue;
            };
            if let Err(e) = control::send_within(&mut link.conn, msg, Duration::from_millis(100)) {
                eprintln!("symphony-scheduler: sending to {peer:?} failed: {e}");
                self.dead.push(peer);
            }
        }
        out.clear();
        true
    }

    /// Removes dead peers and tells the plane.
    fn bury(&mut self, now: Instant, plane: &mut ControlPlane) {
        while let Some(p) = self.dead.pop() {
            match p {
                PeerId::Frontend(id) => {
                    if let Some(l) = self.frontends.remove(&id) {
                        self.unwatch(&l.conn);
                        eprintln!("symphony-scheduler: frontend {id} is gone");
                        self.metrics.frontend_deaths.fetch_add(1, Ordering::Relaxed);
                        plane.frontend_left(id);
                    }
                }
                PeerId::Backend(id) => {
                    if let Some(l) = self.backends.remove(&id) {
                        self.unwatch(&l.conn);
                        eprintln!(
                            "symphony-scheduler: backend {id} is gone; failing back its batches"
                        );
                        plane.backend_left(now, id);
                    }
                }
            }
        }
    }
}
