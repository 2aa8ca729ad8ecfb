//! The `symphony-backend` daemon (protocol: the daemon protocol spec).
//!
//! Start-up: check the configuration, build the staging region and the
//! executor (so a missing CUDA driver is reported before anything
//! connects), connect to the scheduler, answer its challenge with
//! `Join{Backend, id, gpus, MAC}` and the `Models` it holds, wait for its
//! `Welcome` (which announces the control delay bound), start `/metrics`,
//! print `READY metrics=HOST:PORT gpus=N`.
//!
//! The logic (registration, announcements, data links, heartbeats,
//! liveness, drain) is the sans-IO [`BackendNode`] around the
//! [`BatchWorker`]; this module is its host. One thread runs the loop:
//! [`BackendNode::poll`] on the monotonic clock; its events (open a data
//! connection to an announced frontend, logs); counters for the metrics
//! thread; and the idle strategy, whose parks never outlast the node's
//! `poll_at` (a device finishing, a planned start, a heartbeat). Opening a
//! data connection may take seconds (the frontend may still be starting),
//! so a helper thread connects and hands the connection back over a
//! channel (the node sends `Register{Backend}` first on it): the loop never
//! blocks.
//!
//! Shutdown: on SIGINT/SIGTERM, or when the scheduler is gone (disconnect,
//! or silent for `--dead-after-ms`), the worker stops reading plans, the
//! batches in hand finish (bounded by [`DRAIN_TIMEOUT`]), queued messages
//! are flushed, and the process exits: 0 after a stop signal, 1 when the
//! scheduler went away.

pub mod config;
pub mod metrics;

use std::io::Write;
use std::process::ExitCode;
use std::sync::mpsc;
use std::sync::Arc;

use dataplane::control::{self, connect_retrying, flush_within, MetricsEndpoint, WithDomain};
use dataplane::mem::{Access, Region};
use dataplane::time::{Duration, Instant, MonotonicClock};
use dataplane::transport::{Connection, Domain, Registration};
use dataplane::waitset::{IdleWait, Notifier, WatchList};

use crate::exec::{ExecModel, Executor};
use crate::node::{BackendEvent, BackendNode, BackendNodeConfig};
use crate::worker::{BatchWorker, WorkerConfig, WorkerStats};
use crate::exec::onnx::{OnnxExecutor, OnnxOptions};
use crate::EmulatedExecutor;
pub use config::{Args, ExecutorKind, Settings};
use metrics::BackendMetrics;

/// Longest wait for the batches in hand when shutting down.
pub const DRAIN_TIMEOUT: Duration = Duration::from_millis(10_000);
/// Bound on each handshake step (a send, the scheduler's ack).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_millis(5_000);
/// How long a new connection to a frontend waits for the old one's READs
/// before it replaces it anyway.
const REPLACE_TIMEOUT: Duration = Duration::from_millis(5_000);

/// Why the daemon stopped.
#[derive(Debug, PartialEq, Eq)]
pub enum Exit {
    /// A stop was requested (signal): clean, exit code 0.
    Stopped,
    /// The scheduler disconnected or went silent: exit code 1.
    SchedulerGone,
}

/// Runs `symphony-backend` with a command line (`args[0]` is the program
/// name); for the binary and for a multi-call binary. Installs the
/// SIGINT/SIGTERM handlers. Exit code 0 after a stop signal, 1 on a
/// runtime failure (scheduler gone or refusing us, executor unavailable),
/// 2 on a bad command line or configuration.
pub fn main_with_args(args: Vec<String>) -> ExitCode {
    let parsed = match Args::parse_from_args(&args) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let settings = match parsed.with_config_file().and_then(Args::resolve) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("symphony-backend: configuration error: {e}");
            return ExitCode::from(2);
        }
    };
    if settings.exit_with_parent {
        control::terminate_with_parent();
    }
    if let Err(e) = control::install_stop_signals() {
        eprintln!("symphony-backend: {e}");
        return ExitCode::from(1);
    }
    let announce = |ready: &Ready| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "READY metrics={} gpus={}", ready.metrics, ready.gpus);
        let _ = out.flush();
    };
    match run(&settings, &control::stop_requested, &announce) {
        Ok(Exit::Stopped) => {
            eprintln!("symphony-backend[{}]: stopped", settings.id);
            ExitCode::SUCCESS
        }
        Ok(Exit::SchedulerGone) => {
            eprintln!("symphony-backend[{}]: scheduler gone; exiting", settings.id);
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("symphony-backend[{}]: error: {e}", settings.id);
            ExitCode::from(1)
        }
    }
}

/// What a started backend tells its launcher.
#[derive(Clone, Debug)]
pub struct Ready {
    /// The bound metrics address.
    pub metrics: std::net::SocketAddr,
    /// GPUs.
    pub gpus: u32,
}

/// Runs the daemon until `stop()` returns true (then `Ok(Exit::Stopped)`)
/// or the scheduler is gone; `ready` is called once registered and
/// serving. `Err` says why it could not start or had to give up.
pub fn run(s: &Settings, stop: &dyn Fn() -> bool, ready: &dyn Fn(&Ready)) -> Result<Exit, String> {
    control::with_domain(s.transport, Launch { s, stop, ready })?
}

struct Launch<'a> {
    s: &'a Settings,
    stop: &'a dyn Fn() -> bool,
    ready: &'a dyn Fn(&Ready),
}

impl WithDomain for Launch<'_> {
    type Out = Result<Exit, String>;
    fn run<D: Domain>(self, domain: D) -> Self::Out {
        let s = self.s;
        if s.input_bytes > domain.max_read_len() {
            return Err(format!(
                "--input-bytes {}: above the {} transport's longest READ ({})",
                s.input_bytes,
                s.transport.name(),
                domain.max_read_len()
            ));
        }
        let cfg = worker_config(s);
        // Private memory is enough: the staging region is written by READs
        // this process issues, never read by peers.
        let staging = Region::anonymous(cfg.staging_bytes() as usize)
            .map_err(|e| format!("staging region ({} bytes): {e}", cfg.staging_bytes()))?;
        let staging_reg = domain
            .register(&staging, Access::LOCAL_WRITE)
            .map_err(|e| format!("registering the staging region: {e}"))?;
        let models: Vec<ExecModel> = s
            .models
            .iter()
            .map(|m| ExecModel {
                profile: m.profile.clone(),
                output_len: s.output_bytes,
            })
            .collect();
        match s.executor {
            ExecutorKind::Emulated => {
                let exec = EmulatedExecutor::new(staging, s.gpus, s.max_batch, models);
                serve(domain, cfg, exec, staging_reg, self)
            }
            ExecutorKind::Cuda => cuda(domain, cfg, staging, staging_reg, models, self),
            ExecutorKind::Onnx => {
                let setup = s.onnx.as_ref().ok_or("executor onnx: no model repository")?;
                let opts = OnnxOptions {
                    devices: s.gpus,
                    intra_threads: setup.intra_threads,
                    ..OnnxOptions::default()
                };
                let exec = OnnxExecutor::with_slots(staging, setup.slots.clone(), &opts)
                    .map_err(|e| format!("executor onnx: {e}"))?;
                for (id, m) in s.models.iter().enumerate() {
                    if s.served.contains(&(id as u32)) {
                        match exec.load_error(id as u32) {
                            Some(e) => eprintln!("symphony-backend[{}]: model {} NOT loaded: {e}", s.id, m.name),
                            None => eprintln!("symphony-backend[{}]: model {} loaded from {}", s.id, m.name, setup.repository.display()),
                        }
                    }
                }
                serve(domain, cfg, exec, staging_reg, self)
            }
        }
    }
}

#[cfg(feature = "cuda")]
fn cuda<D: Domain>(
    domain: D,
    cfg: WorkerConfig,
    staging: Arc<Region>,
    staging_reg: Registration,
    models: Vec<ExecModel>,
    launch: Launch<'_>,
) -> Result<Exit, String> {
    let s = launch.s;
    let ordinals: Vec<usize> = (0..s.gpus as usize).collect();
    let exec = crate::CudaExecutor::new(
        &ordinals,
        staging,
        s.max_batch,
        s.input_bytes,
        s.output_bytes,
        models,
    )
    .map_err(|e| format!("executor cuda: {e}"))?;
    serve(domain, cfg, exec, staging_reg, launch)
}

#[cfg(not(feature = "cuda"))]
fn cuda<D: Domain>(
    _domain: D,
    _cfg: WorkerConfig,
    _staging: Arc<Region>,
    _staging_reg: Registration,
    _models: Vec<ExecModel>,
    _launch: Launch<'_>,
) -> Result<Exit, String> {
    Err("executor cuda: built without CUDA support (rebuild with `--features cuda`)".into())
}

fn worker_config(s: &Settings) -> WorkerConfig {
    WorkerConfig {
        max_batch: s.max_batch,
        input_slot: s.input_bytes,
        output_slot: s.output_bytes,
        batch_slots: s.batch_slots,
        max_frontends: config::MAX_FRONTENDS,
        // Until the scheduler's Welcome says (or the override).
        control_delay: s.control_delay.unwrap_or(Duration::ZERO),
        fetch_grace: s.fetch_grace,
        report_capacity: 4096,
        start_when_ready: s.start_when_ready,
    }
}

fn node_config(s: &Settings) -> BackendNodeConfig {
    BackendNodeConfig {
        id: s.id,
        gpus: s.gpus,
        served: s.served.clone(),
        cluster_models: s.models.len() as u32,
        max_frontends: config::MAX_FRONTENDS,
        heartbeat: s.heartbeat,
        dead_after: s.dead_after,
        handshake_timeout: HANDSHAKE_TIMEOUT,
        replace_timeout: REPLACE_TIMEOUT,
        drain_timeout: DRAIN_TIMEOUT,
    }
}

/// A data connection opened by the connector thread.
type Opened<C> = (u32, Result<C, String>);
/// Requests to the connector thread: frontend id and data endpoint.
type ConnectRequests = mpsc::Sender<(u32, String)>;

/// The poll loop's ends of the connector thread's channels.
struct Connector<C> {
    requests: ConnectRequests,
    opened: mpsc::Receiver<Opened<C>>,
}

/// Starts the thread that opens frontend data connections (retrying for
/// `timeout`) and hands them back; the node sends `Register{Backend}`
/// first on each. It ends when the request channel closes.
fn spawn_connector<D: Domain>(
    domain: D,
    timeout: Duration,
    wake: Notifier,
) -> Result<Connector<D::Conn>, String> {
    let (req_tx, req_rx) = mpsc::channel::<(u32, String)>();
    let (done_tx, done_rx) = mpsc::channel::<Opened<D::Conn>>();
    std::thread::Builder::new()
        .name("backend-connect".into())
        .spawn(move || {
            for (fid, endpoint) in req_rx {
                let opened = connect_retrying(&domain, &endpoint, timeout)
                    .map_err(|e| format!("cannot connect to frontend {fid} at '{endpoint}': {e}"));
                if done_tx.send((fid, opened)).is_err() {
                    return;
                }
                wake.signal();
            }
        })
        .map_err(|e| format!("cannot start the connector thread: {e}"))?;
    Ok(Connector {
        requests: req_tx,
        opened: done_rx,
    })
}

fn serve<D: Domain, E: Executor>(
    domain: D,
    cfg: WorkerConfig,
    exec: E,
    staging_reg: Registration,
    launch: Launch<'_>,
) -> Result<Exit, String> {
    let s = launch.s;
    let sched = connect_retrying(&domain, &s.scheduler, s.connect_timeout)
        .map_err(|e| format!("cannot reach the scheduler at '{}': {e}", s.scheduler))?;
    let mut idle = IdleWait::new(s.idle).map_err(|e| format!("wait set: {e}"))?;
    // Executors whose devices finish on their own threads wake the loop.
    let notifier = idle.notifier();
    exec.set_waker(Arc::new(move || notifier.signal()));
    let worker =
        BatchWorker::new(cfg, exec, staging_reg, sched).map_err(|e| format!("worker: {e}"))?;
    let mut node = BackendNode::new(node_config(s), worker)
        .with_join_token(s.join_token.clone())
        .with_control_delay_override(s.control_delay);
    let clock = MonotonicClock::new();
    let mut watched = WatchList::new();
    register(&mut node, &clock, &mut idle, &mut watched, s.id)?;
    if let Some(d) = node.control_delay() {
        eprintln!("symphony-backend[{}]: {d}", s.id);
    }
    let metrics = Arc::new(BackendMetrics::new(
        s.id,
        s.gpus,
        s.models.iter().map(|m| m.name.clone()).collect(),
    ));
    let endpoint = MetricsEndpoint::start(s.metrics, metrics.registry().clone())
        .map_err(|e| format!("metrics endpoint on {}: {e}", s.metrics))?;
    let connector = spawn_connector(domain.clone(), s.connect_timeout, idle.notifier())?;
    eprintln!(
        "symphony-backend[{}]: registered with {} over {} ({} GPUs, {} executor, {} of {} models); metrics on {}",
        s.id,
        s.scheduler,
        s.transport.name(),
        s.gpus,
        match s.executor {
            ExecutorKind::Emulated => "emulated",
            ExecutorKind::Cuda => "cuda",
            ExecutorKind::Onnx => "onnx",
        },
        s.served.len(),
        s.models.len(),
        endpoint.addr()
    );
    (launch.ready)(&Ready {
        metrics: endpoint.addr(),
        gpus: s.gpus,
    });
    let mut host = Host {
        s,
        metrics: &metrics,
        connector: &connector,
        idle: &mut idle,
        watched: &mut watched,
        clock: &clock,
    };
    let exit = host.run(&mut node, launch.stop);
    // Closing the request channel ends the connector thread once its
    // current attempt (if any) is over; it is not waited for.
    drop(connector);
    flush_all(node.worker_mut());
    drop(endpoint);
    exit
}

/// Polls the node until the scheduler acknowledges (or refuses) the
/// registration.
fn register<C: Connection, E: Executor>(
    node: &mut BackendNode<C, E>,
    clock: &MonotonicClock,
    idle: &mut IdleWait,
    watched: &mut WatchList,
    id: u32,
) -> Result<(), String> {
    loop {
        let now = clock.now();
        let progressed = node.poll(now);
        while let Some(ev) = node.poll_event() {
            match ev {
                BackendEvent::Registered => return Ok(()),
                BackendEvent::Refused { why } | BackendEvent::Failed { why } => return Err(why),
                ev => eprintln!("symphony-backend[{id}]: {ev}"),
            }
        }
        if progressed {
            idle.reset();
        } else {
            sleep_until_due(node, now, clock, idle, watched);
        }
    }
}

/// Idles per the strategy until the node's next deadline or a link wakes.
fn sleep_until_due<C: Connection, E: Executor>(
    node: &BackendNode<C, E>,
    now: Instant,
    clock: &MonotonicClock,
    idle: &mut IdleWait,
    watched: &mut WatchList,
) {
    watched.sync(idle.set(), |live| {
        node.for_each_conn(|key, c| live.extend(c.wait_fd().map(|fd| (key, fd))))
    });
    let wake = node.poll_at().unwrap_or(now + Duration::from_millis(100));
    idle.idle(wake.saturating_since(clock.now()));
}

/// Gives queued completions and BatchDones their chance to leave.
fn flush_all<C: Connection, E: Executor>(worker: &mut BatchWorker<C, E>) {
    let t = Duration::from_millis(100);
    let _ = flush_within(worker.scheduler(), t);
    for fid in 0..config::MAX_FRONTENDS {
        if let Some(c) = worker.frontend(fid) {
            let _ = flush_within(c, t);
        }
    }
}

/// What the serving loop needs besides the node: the real clock, the
/// connector thread, metrics, the idle strategy.
struct Host<'a, C> {
    s: &'a Settings,
    metrics: &'a BackendMetrics,
    connector: &'a Connector<C>,
    idle: &'a mut IdleWait,
    watched: &'a mut WatchList,
    clock: &'a MonotonicClock,
}

impl<C: Connection> Host<'_, C> {
    fn run<E: Executor>(&mut self, node: &mut BackendNode<C, E>, stop: &dyn Fn() -> bool) -> Result<Exit, String> {
        let id = self.s.id;
        let mut published = WorkerStats::default();
        let mut heartbeats_published = 0u64;
        let mut exit = None;
        loop {
            let now = self.clock.now();
            let mut progressed = node.poll(now);
            while let Some(ev) = node.poll_event() {
                progressed = true;
                match ev {
                    BackendEvent::ConnectFrontend { id: fid, ref endpoint } => {
                        eprintln!("symphony-backend[{id}]: {ev}");
                        // The connector thread outlives the loop, so a send
                        // only fails if it died; the frontend's tasks then
                        // fail as unreachable.
                        let _ = self.connector.requests.send((fid, endpoint.clone()));
                    }
                    BackendEvent::SchedulerLost { .. } => {
                        eprintln!("symphony-backend[{id}]: {ev}");
                        exit.get_or_insert(Exit::SchedulerGone);
                    }
                    BackendEvent::FrontendConnected { .. } => {
                        self.metrics.frontends_connected.inc();
                        eprintln!("symphony-backend[{id}]: {ev}");
                    }
                    BackendEvent::FrontendUnreachable { .. } => {
                        self.metrics.frontend_connect_failures.inc();
                        eprintln!("symphony-backend[{id}]: {ev}");
                    }
                    // The worker fails the frontend's tasks; the scheduler
                    // announces it again if it comes back.
                    BackendEvent::FrontendLost(_) => {}
                    BackendEvent::Failed { why } => return Err(why),
                    ev => eprintln!("symphony-backend[{id}]: {ev}"),
                }
            }
            while let Ok((fid, opened)) = self.connector.opened.try_recv() {
                progressed = true;
                match opened {
                    Ok(conn) => node.handle_frontend_link(now, fid, conn),
                    Err(e) => {
                        self.metrics.frontend_connect_failures.inc();
                        eprintln!("symphony-backend[{id}]: {e}");
                    }
                }
            }
            if !node.draining() && stop() {
                eprintln!(
                    "symphony-backend[{id}]: stop requested; finishing {} batches in hand",
                    node.worker().batches_in_flight()
                );
                node.begin_drain();
                exit.get_or_insert(Exit::Stopped);
                progressed = true;
            }
            while let Some(r) = node.worker_mut().pop_report() {
                self.metrics.record_batch(&r);
            }
            let stats = node.worker().stats();
            if stats != published {
                self.metrics.store_stats(&stats);
                published = stats;
            }
            let beats = node.scheduler_heartbeats();
            if beats != heartbeats_published {
                self.metrics.scheduler_heartbeats.inc_by(beats - heartbeats_published);
                heartbeats_published = beats;
            }
            if node.drained() {
                return Ok(exit.unwrap_or(Exit::Stopped));
            }
            if progressed {
                self.idle.reset();
            } else {
                sleep_until_due(node, now, self.clock, self.idle, self.watched);
            }
        }
    }
}
