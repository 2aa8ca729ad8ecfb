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
//! The scheduler's loss (disconnect, or silent for `--dead-after-ms`) ends
//! nothing: the batches in hand finish and answer their frontends while
//! the loop reconnects (to the addresses `--scheduler` names, on a capped
//! exponential backoff, [`Reconnect`]) and registers again.
//!
//! Joining: the time from the start of `run` (executor built, models
//! loaded and warmed) to the scheduler's `Welcome` is logged as `join_ms`
//! with the registration; the backend's GPUs enter the scheduler's
//! matchmaking once its data links to the frontends announced then are up
//! (the join gate: logged with `ready_ms`, the scheduler's
//! `symphony_backend_join_ms`).
//!
//! Shutdown (SIGINT/SIGTERM, as Kubernetes or `symphony up --autoscale`
//! sends on a scale-in) is a graceful leave
//! ([`BackendNode::begin_leave`]): the scheduler is told the backend
//! drains, takes its GPUs out of matchmaking and releases it once every
//! batch it planned here was reported; the backend then finishes anything
//! still in hand, flushes its queued messages and exits 0. Everything is
//! bounded by [`DRAIN_TIMEOUT`]: past it the backend leaves anyway and the
//! scheduler fails back what it planned here (a request is answered,
//! never lost). The command line, logs, stop signals and exit codes are
//! the daemon shell's ([`node_shell`]); the options are in [`config`].

pub mod config;
pub mod metrics;

use std::io::Write;
use std::process::ExitCode;
use std::sync::mpsc;
use std::sync::Arc;

use dataplane::control::{self, connect_retrying, flush_within, ControlError, WithDomain};
use dataplane::mem::{Access, Region};
use dataplane::reconnect::{connect_first, split_addrs, Reconnect, DEFAULT_MAX_BACKOFF, DEFAULT_MIN_BACKOFF};
use node_shell::{self as shell, MetricsEndpoint, setup, Common, CommonArgs, ConfigError, Daemon, SchedulerUnreachable, SetupError};
use dataplane::time::{Duration, Instant, MonotonicClock};
use dataplane::transport::{Connection, Domain, Registration};
use dataplane::waitset::{IdleWait, Notifier, WatchList};
use tracing::{info, warn};

use crate::exec::onnx::{OnnxExecutor, OnnxOptions};
use crate::exec::{ExecModel, Executor};
use crate::node::{BackendEvent, BackendNode, BackendNodeConfig};
use crate::worker::{BatchWorker, WorkerConfig, WorkerStats};
use crate::EmulatedExecutor;
pub use config::{BackendArgs, BackendConfig, ExecutorKind, StartAt};
use metrics::BackendMetrics;

/// Longest wait for the scheduler's release and the batches in hand when
/// shutting down.
pub const DRAIN_TIMEOUT: Duration = Duration::from_millis(10_000);
/// Bound on each handshake step (a send, the scheduler's ack).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_millis(5_000);
/// How long a new connection to a frontend waits for the old one's READs
/// before it replaces it anyway.
const REPLACE_TIMEOUT: Duration = Duration::from_millis(5_000);
/// One reconnection attempt's connect bound (the poll loop waits in it).
const RECONNECT_ATTEMPT: Duration = Duration::from_millis(100);

/// Why the daemon stopped.
#[derive(Debug, PartialEq, Eq)]
pub enum Exit {
    /// A stop was requested (signal): clean, exit code 0. (Losing the
    /// scheduler ends nothing: the backend reconnects.)
    Stopped,
}

/// Why the backend could not start or had to give up.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The transport cannot be opened.
    #[error(transparent)]
    Transport(#[from] ControlError),
    /// The input slot is longer than the transport can READ.
    #[error("--input-bytes {input_bytes}: above the {transport} transport's longest READ ({max})")]
    InputTooLarge {
        /// The slot size.
        input_bytes: u32,
        /// The transport.
        transport: &'static str,
        /// Its longest READ.
        max: u32,
    },
    /// A part of the backend (staging region, executor, wait set, worker,
    /// metrics endpoint) cannot be set up.
    #[error(transparent)]
    Setup(#[from] SetupError),
    /// The scheduler cannot be reached.
    #[error(transparent)]
    Unreachable(#[from] SchedulerUnreachable),
    /// The scheduler refused the registration (its reason), or the node
    /// cannot be set up as configured.
    #[error("{0}")]
    Node(String),
    /// The executor refused a checked batch (a bug): the node stopped.
    #[error("executor: {0}")]
    Executor(#[source] std::sync::Arc<crate::exec::ExecError>),
    /// `--executor cuda` in a build without the `cuda` feature.
    #[error("executor cuda: built without CUDA support (rebuild with `--features cuda`)")]
    NoCudaSupport,
}

impl Daemon for BackendArgs {
    type Config = BackendConfig;
    type Error = BackendError;
    fn common(&self) -> &CommonArgs {
        &self.common
    }
    fn configure(self, common: Common) -> Result<BackendConfig, ConfigError> {
        self.resolve(common)
    }
    fn run(cfg: BackendConfig) -> Result<(), BackendError> {
        let announce = |ready: &Ready| {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "READY metrics={} gpus={}", ready.metrics, ready.gpus);
            let _ = out.flush();
        };
        match run(&cfg, &control::stop_requested, &announce)? {
            Exit::Stopped => {
                info!(backend = cfg.id, "stopped");
                Ok(())
            }
        }
    }
}

/// Runs `symphony-backend` with a command line (`args[0]` is the program
/// name), for the binary and for a multi-call binary: see
/// [`node_shell::main`].
pub fn main_with_args(args: Vec<String>) -> ExitCode {
    shell::main::<BackendArgs>(args)
}

/// What a started backend tells its launcher.
#[derive(Clone, Debug)]
pub struct Ready {
    /// The bound metrics address.
    pub metrics: std::net::SocketAddr,
    /// GPUs.
    pub gpus: u32,
}

/// Runs the daemon until `stop()` returns true (then `Ok(Exit::Stopped)`);
/// `ready` is called once registered and
/// serving. `Err` says why it could not start or had to give up.
pub fn run(s: &BackendConfig, stop: &dyn Fn() -> bool, ready: &dyn Fn(&Ready)) -> Result<Exit, BackendError> {
    let started = std::time::Instant::now();
    control::with_domain(s.transport, Launch { s, stop, ready, started })?
}

struct Launch<'a> {
    s: &'a BackendConfig,
    stop: &'a dyn Fn() -> bool,
    ready: &'a dyn Fn(&Ready),
    /// When `run` began: the join time is measured from it.
    started: std::time::Instant,
}

impl WithDomain for Launch<'_> {
    type Out = Result<Exit, BackendError>;
    fn run<D: Domain>(self, domain: D) -> Self::Out {
        let s = self.s;
        if s.input_bytes > domain.max_read_len() {
            return Err(BackendError::InputTooLarge {
                input_bytes: s.input_bytes,
                transport: s.transport.name(),
                max: domain.max_read_len(),
            });
        }
        let cfg = worker_config(s);
        // Private memory is enough: the staging region is written by READs
        // this process issues, never read by peers.
        let staging = Region::anonymous(cfg.staging_bytes() as usize)
            .map_err(setup(format!("staging region ({} bytes)", cfg.staging_bytes())))?;
        let staging_reg = domain
            .register(&staging, Access::LOCAL_WRITE)
            .map_err(setup("registering the staging region"))?;
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
            // KIND_GPU models: the graph engine on the CUDA executor (issue 51).
            #[cfg(feature = "cuda")]
            ExecutorKind::Onnx if s.onnx.as_ref().is_some_and(|r| crate::exec::onnx::gpu_engine_serves(&r.slots)) => {
                let slots = crate::exec::cuda::CudaSlots { max_batch: s.max_batch, input_slot: s.input_bytes, output_slot: s.output_bytes };
                let repo = s.onnx.as_ref().map_or(&[][..], |r| &r.slots[..]);
                let exec = crate::exec::graph::device::repo_executor(repo, s.gpus, staging, slots, models)
                    .map_err(setup("executor cuda (graph engine)"))?;
                serve(domain, cfg, exec, staging_reg, self)
            }
            ExecutorKind::Onnx => {
                let exec = onnx(s, staging)?;
                serve(domain, cfg, exec, staging_reg, self)
            }
        }
    }
}

/// The onnx executor over the repository's models; says which loaded.
fn onnx(s: &BackendConfig, staging: Arc<Region>) -> Result<OnnxExecutor, BackendError> {
    let repo = s.onnx.as_ref().ok_or_else(|| BackendError::Node("executor onnx: no model repository".into()))?;
    let opts = OnnxOptions {
        devices: s.gpus,
        intra_threads: repo.intra_threads,
        warmup: repo.warmup,
        ..OnnxOptions::default()
    };
    let exec = OnnxExecutor::with_slots(staging, repo.slots.clone(), &opts).map_err(setup("executor onnx"))?;
    for (id, m) in s.models.iter().enumerate() {
        if s.served.contains(&(id as u32)) {
            match exec.load_error(id as u32) {
                Some(e) => warn!(backend = s.id, model = %m.name, error = %e, "model NOT loaded"),
                None => info!(backend = s.id, model = %m.name, repository = %repo.repository.display(), "model loaded"),
            }
        }
    }
    for w in exec.warmup_runs() {
        let name = s.models.get(w.model as usize).map_or("?", |m| m.name.as_str());
        info!(backend = s.id, model = %name, device = w.device, batch = w.batch, ms = w.elapsed.as_secs_f64() * 1e3, "warm-up run");
    }
    Ok(exec)
}

#[cfg(feature = "cuda")]
fn cuda<D: Domain>(
    domain: D,
    cfg: WorkerConfig,
    staging: Arc<Region>,
    staging_reg: Registration,
    models: Vec<ExecModel>,
    launch: Launch<'_>,
) -> Result<Exit, BackendError> {
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
    .map_err(setup("executor cuda"))?;
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
) -> Result<Exit, BackendError> {
    Err(BackendError::NoCudaSupport)
}

fn worker_config(s: &BackendConfig) -> WorkerConfig {
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

fn node_config(s: &BackendConfig) -> BackendNodeConfig {
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

/// A frontend data connection the connector thread tried to open.
struct Opened<C> {
    frontend: u32,
    endpoint: String,
    conn: Result<C, dataplane::transport::Error>,
}

/// The poll loop's ends of the connector thread's channels.
struct Connector<C> {
    /// Frontend id and data endpoint to connect to.
    requests: mpsc::Sender<(u32, String)>,
    opened: mpsc::Receiver<Opened<C>>,
}

/// Starts the thread that opens frontend data connections (retrying for
/// `timeout`) and hands them back; the node sends `Register{Backend}`
/// first on each. It ends when the request channel closes.
fn spawn_connector<D: Domain>(domain: D, timeout: Duration, wake: Notifier) -> Result<Connector<D::Conn>, BackendError> {
    let (req_tx, req_rx) = mpsc::channel::<(u32, String)>();
    let (done_tx, done_rx) = mpsc::channel::<Opened<D::Conn>>();
    std::thread::Builder::new()
        .name("backend-connect".into())
        .spawn(move || {
            for (frontend, endpoint) in req_rx {
                let conn = connect_retrying(&domain, &endpoint, timeout);
                if done_tx.send(Opened { frontend, endpoint, conn }).is_err() {
                    return;
                }
                wake.signal();
            }
        })
        .map_err(setup("connector thread"))?;
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
) -> Result<Exit, BackendError> {
    let s = launch.s;
    let addrs = split_addrs(&s.scheduler);
    let (sched, at) = connect_first(&domain, &addrs, s.connect_timeout)
        .map_err(|source| SchedulerUnreachable { addr: s.scheduler.clone(), source })?;
    let mut reconnect = Reconnect::new(addrs.clone(), DEFAULT_MIN_BACKOFF, DEFAULT_MAX_BACKOFF);
    reconnect.prefer(&addrs[at]);
    let mut idle = IdleWait::new(s.idle).map_err(setup("wait set"))?;
    // Executors whose devices finish on their own threads wake the loop.
    let notifier = idle.notifier();
    exec.set_waker(Arc::new(move || notifier.signal()));
    let worker = BatchWorker::new(cfg, exec, staging_reg, sched).map_err(setup("worker"))?;
    let mut node = BackendNode::new(node_config(s), worker)
        .with_join_token(s.join_token.clone())
        .with_control_delay_override(s.control_delay)
        .with_failover(true);
    let clock = MonotonicClock::new();
    let mut watched = WatchList::new();
    register(&mut node, &clock, &mut idle, &mut watched)?;
    if let Some(d) = node.control_delay() {
        info!(backend = s.id, "{d}");
    }
    let metrics = BackendMetrics::new(s.id, s.gpus, s.models.iter().map(|m| m.name.clone()).collect());
    let metrics = Arc::new(metrics);
    node_shell::metrics::register_link_closures(metrics.registry());
    let endpoint = MetricsEndpoint::start(s.metrics, metrics.registry().clone())
        .map_err(setup(format!("metrics endpoint on {}", s.metrics)))?;
    let connector = spawn_connector(domain.clone(), s.connect_timeout, idle.notifier())?;
    info!(
        backend = s.id,
        scheduler = %addrs[at],
        transport = %s.transport.name(),
        gpus = s.gpus,
        executor = %s.executor.name(),
        models_served = s.served.len(),
        models = s.models.len(),
        metrics = %endpoint.addr(),
        join_ms = launch.started.elapsed().as_secs_f64() * 1e3,
        "registered with the scheduler; its GPUs join matchmaking once its data links to the frontends are up"
    );
    (launch.ready)(&Ready {
        metrics: endpoint.addr(),
        gpus: s.gpus,
    });
    let mut host = Host {
        metrics: &metrics,
        connector: &connector,
        idle: &mut idle,
        watched: &mut watched,
        clock: &clock,
        published: WorkerStats::default(),
        heartbeats_published: 0,
        exit: None,
        reconnect,
        connect: &|addr| domain.connect(addr, RECONNECT_ATTEMPT),
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
) -> Result<(), BackendError> {
    loop {
        let now = clock.now();
        let progressed = node.poll(now);
        while let Some(ev) = node.poll_event() {
            match ev {
                BackendEvent::Registered => return Ok(()),
                BackendEvent::Refused { why } => return Err(BackendError::Node(why)),
                BackendEvent::Failed(failure) => return Err(BackendError::Executor(failure.0)),
                ev => info!("{ev}"),
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
    // Arm the links' wait fds (shm: a peer wakes us only if told we
    // sleep); a message that came meanwhile means no sleep.
    let mut armed = true;
    node.for_each_conn(|_, c| armed &= c.arm_wait());
    if !armed {
        return;
    }
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
/// connector thread, metrics, the idle strategy, and what it published
/// and decided so far.
struct Host<'a, C> {
    metrics: &'a BackendMetrics,
    connector: &'a Connector<C>,
    idle: &'a mut IdleWait,
    watched: &'a mut WatchList,
    clock: &'a MonotonicClock,
    published: WorkerStats,
    heartbeats_published: u64,
    /// How the loop will end once the node has drained.
    exit: Option<Exit>,
    /// When to try the scheduler(s) again while the node is lost.
    reconnect: Reconnect,
    /// Opens a link to a scheduler address (one bounded attempt).
    connect: &'a dyn Fn(&str) -> Result<C, dataplane::transport::Error>,
}

impl<C: Connection> Host<'_, C> {
    /// Polls the node until it has drained after a stop or the
    /// scheduler's departure.
    fn run<E: Executor>(&mut self, node: &mut BackendNode<C, E>, stop: &dyn Fn() -> bool) -> Result<Exit, BackendError> {
        loop {
            let now = self.clock.now();
            let mut progressed = node.poll(now);
            while let Some(ev) = node.poll_event() {
                progressed = true;
                self.on_event(ev)?;
            }
            progressed |= self.take_opened(node, now);
            progressed |= self.try_reconnect(node, now);
            if !node.draining() && !node.leaving() && stop() {
                info!(
                    batches_in_hand = node.worker().batches_in_flight(),
                    bound_ms = DRAIN_TIMEOUT.as_nanos() / 1_000_000,
                    "stop requested; draining: telling the scheduler, finishing what it planned here"
                );
                node.begin_leave(now);
                self.exit.get_or_insert(Exit::Stopped);
                progressed = true;
            }
            self.publish(node);
            if node.drained() {
                return Ok(self.exit.take().unwrap_or(Exit::Stopped));
            }
            if progressed {
                self.idle.reset();
            } else {
                sleep_until_due(node, now, self.clock, self.idle, self.watched);
            }
        }
    }

    /// Acts on one of the node's events.
    fn on_event(&mut self, ev: BackendEvent) -> Result<(), BackendError> {
        match ev {
            BackendEvent::ConnectFrontend { id, ref endpoint } => {
                info!("{ev}");
                // The connector thread outlives the loop, so a send only
                // fails if it died; the frontend's tasks then fail as
                // unreachable.
                let _ = self.connector.requests.send((id, endpoint.clone()));
            }
            BackendEvent::SchedulerLost { .. } => {
                warn!("{ev}; batches in hand carry on, reconnecting");
                self.reconnect.lost(self.clock.now());
            }
            BackendEvent::Registered => {
                info!(attempts = self.reconnect.failures() + 1, "registered with a scheduler again");
                self.reconnect.registered();
            }
            BackendEvent::Refused { .. } => {
                warn!("{ev}; trying the next scheduler");
                self.reconnect.failed(self.clock.now());
            }
            BackendEvent::FrontendConnected { .. } => {
                self.metrics.frontends_connected.inc();
                info!("{ev}");
            }
            BackendEvent::FrontendUnreachable { .. } => {
                self.metrics.frontend_connect_failures.inc();
                warn!("{ev}");
            }
            // The worker fails the frontend's tasks; the scheduler
            // announces it again if it comes back.
            BackendEvent::FrontendLost(_) => {}
            // Counted in symphony_backend_plans_fenced{reason}.
            BackendEvent::Fenced(_) => warn!("{ev}"),
            BackendEvent::LeaveUnanswered { .. } | BackendEvent::DrainTimedOut { .. } => warn!("{ev}"),
            BackendEvent::Failed(failure) => return Err(BackendError::Executor(failure.0)),
            ev => info!("{ev}"),
        }
        Ok(())
    }

    /// One reconnection attempt if the node is lost and one is due.
    fn try_reconnect<E: Executor>(&mut self, node: &mut BackendNode<C, E>, now: Instant) -> bool {
        if !node.scheduler_lost() || node.draining() {
            return false;
        }
        let Some(addr) = self.reconnect.due(now) else { return false };
        match (self.connect)(addr) {
            Ok(conn) => {
                info!(scheduler = addr, "reconnected to a scheduler; registering");
                // The backoff stands until the registration succeeds.
                self.reconnect.linked();
                let old = node.handle_scheduler_link(conn);
                // The old link stays open until the wait set has swapped
                // its fd for the new one's (a reused fd number would hide
                // the change).
                self.watched.sync(self.idle.set(), |live| {
                    node.for_each_conn(|key, c| live.extend(c.wait_fd().map(|fd| (key, fd))))
                });
                drop(old);
            }
            Err(e) => {
                tracing::debug!(scheduler = addr, error = %e, "reconnection attempt failed");
                self.reconnect.failed(self.clock.now());
            }
        }
        true
    }

    /// Hands the connections the connector opened to the node.
    fn take_opened<E: Executor>(&mut self, node: &mut BackendNode<C, E>, now: Instant) -> bool {
        let mut any = false;
        while let Ok(o) = self.connector.opened.try_recv() {
            any = true;
            match o.conn {
                Ok(conn) => node.handle_frontend_link(now, o.frontend, conn),
                Err(e) => {
                    self.metrics.frontend_connect_failures.inc();
                    warn!(frontend = o.frontend, endpoint = %o.endpoint, error = %e, "cannot connect to the frontend");
                }
            }
        }
        any
    }

    /// Moves the node's reports and counters into the metrics.
    fn publish<E: Executor>(&mut self, node: &mut BackendNode<C, E>) {
        while let Some(r) = node.worker_mut().pop_report() {
            self.metrics.record_batch(&r);
        }
        let stats = node.worker().stats();
        if stats != self.published {
            self.metrics.store_stats(&stats);
            self.published = stats;
        }
        let beats = node.scheduler_heartbeats();
        if beats != self.heartbeats_published {
            self.metrics.scheduler_heartbeats.inc_by(beats - self.heartbeats_published);
            self.heartbeats_published = beats;
        }
        self.metrics.store_forged_welcomes(node.forged_welcomes());
    }
}
