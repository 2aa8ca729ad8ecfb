//! The `symphony-frontend` daemon (see PROTOCOL-SPEC.md): the KServe v2
//! HTTP server over a [`ClusterService`] whose tasks go to a remote
//! scheduler, with inputs staged in a region registered for REMOTE_READ
//! and outcomes coming back from the scheduler (drops, failures) and from
//! the backends' data connections (completions).
//!
//! The I/O work is a sans-IO [`FrontendNode`] (see [`crate::node`]); this
//! module is its host. Threads: the HTTP runtime's workers stage requests
//! and push their tasks into the node's bounded lock-free queue
//! ([`NetSink`]); one I/O thread polls the node on the real clock (it owns
//! every connection: sends the tasks, polls the scheduler and each backend,
//! serves READs on tcp, routes outcomes into the staging area, heartbeats)
//! and sleeps in a wait set over the node's links until the node's next
//! timer; an acceptor thread takes backends' data connections and hands
//! them to the node, which checks their `Register{Backend}`; the main
//! thread connects to the scheduler, registers through the node, then
//! waits for a stop signal or for the I/O thread to end.
//!
//! Entry point: [`main_with_args`] (the `symphony-frontend` binary is a
//! thin wrapper, so a multi-call binary can run it too).

use crate::http::{HttpConfig, Server};
use crate::metrics::Metrics;
use crate::models::ModelCatalog;
use crate::node::{FrontendEvent, FrontendNode, FrontendNodeConfig, FrontendStats, NetSink};
use crate::service::ClusterService;
use crate::staging::{RoutedOutcome, Staging, StagingConfig};
use clap::Parser;
use dataplane::control::{self, MetricsEndpoint, TransportKind, WithDomain};
use dataplane::idle::IdleStrategy;
use dataplane::join::JoinToken;
use dataplane::waitset::{IdleWait, Notifier};
use dataplane::mem::Access;
use dataplane::time::{Duration, Instant, MonotonicClock};
use dataplane::transport::{Connection, Domain, Error as TransportError, Listener, Registration};
use dataplane::wire::DropReason;
use scheduler::zoo::{cluster_models, ModelSpec};
use serde::Deserialize;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};

/// Frontend ids must be below this (every daemon refuses others; the
/// task-id layout fixes it).
pub use dataplane::ids::MAX_FRONTENDS as MAX_FRONTEND_ID;
/// How long to keep trying to reach the scheduler at start.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(5000);
/// How long the scheduler has to acknowledge the registration, and a
/// backend to send its `Register` on a new data connection.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_millis(5000);

/// Command line of `symphony-frontend`. Every option can also be set in
/// the `--config` TOML file (key = the long flag with '_' for '-');
/// flags override the file.
#[derive(Parser, Debug, Default)]
#[command(
    name = "symphony-frontend",
    about = "Symphony frontend: the KServe v2 HTTP API in front of a Symphony scheduler"
)]
pub struct Cli {
    /// TOML file with any of the options below.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// This frontend's id (< 4096, unique in the cluster). Default 0.
    #[arg(long)]
    pub id: Option<u32>,
    /// The scheduler's control address (required).
    #[arg(long)]
    pub scheduler: Option<String>,
    /// KServe v2 HTTP listen address. Default 127.0.0.1:0.
    #[arg(long)]
    pub http: Option<String>,
    /// KServe v2 gRPC listen address. Default 127.0.0.1:0.
    #[arg(long)]
    pub grpc: Option<String>,
    /// TLS certificate chain (PEM) for the HTTP and gRPC endpoints (with --tls-key). Default: no TLS.
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM) for the HTTP and gRPC endpoints (with --tls-cert).
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    /// Data listen address for backends' connections (transport address).
    /// Default: a fresh one (shm: a new name; tcp: 127.0.0.1:0).
    #[arg(long)]
    pub data_listen: Option<String>,
    /// shm, tcp, tcp-blocking or rdma. Default shm.
    #[arg(long)]
    pub transport: Option<String>,
    /// I/O thread idle strategy: spin, yield, park, park:US. Default park.
    #[arg(long)]
    pub idle: Option<String>,
    /// Prometheus /metrics listen address. Default 127.0.0.1:0.
    #[arg(long)]
    pub metrics: Option<String>,
    /// Model zoo table: a100 or 1080ti. Default a100.
    #[arg(long)]
    pub zoo: Option<String>,
    /// Models of the zoo: all, strong, weak, none, or names. Default all.
    #[arg(long)]
    pub models: Option<String>,
    /// Extra model NAME=ALPHA_MS,BETA_MS,SLO_MS (repeatable; appended).
    #[arg(long)]
    pub model: Vec<String>,
    /// Staging slots: requests in flight at most. Default 4096.
    #[arg(long)]
    pub slots: Option<u32>,
    /// Largest HTTP request body, bytes. Default 1 MiB.
    #[arg(long)]
    pub max_body: Option<usize>,
    /// Wait past a request's deadline before answering it timed out, ms.
    /// Default 100.
    #[arg(long)]
    pub grace_ms: Option<u64>,
    /// Part of each request's budget kept for the way back (the output's
    /// trip to this frontend and the HTTP answer): the scheduler is given
    /// the budget minus this, µs. Default 2000.
    #[arg(long)]
    pub return_margin_us: Option<u64>,
    /// HTTP worker threads. Default 2.
    #[arg(long)]
    pub http_threads: Option<usize>,
    /// Heartbeat interval toward the scheduler, ms. Default 100.
    #[arg(long)]
    pub heartbeat_ms: Option<u64>,
    /// The scheduler is dead after this much silence, ms. Default 1000.
    #[arg(long)]
    pub dead_after_ms: Option<u64>,
    /// Tasks queued toward the scheduler at most (a full queue fails the
    /// request, 503). Default: the number of slots.
    #[arg(long)]
    pub queue: Option<usize>,
    /// Exit (SIGTERM) when the parent process dies.
    #[arg(long)]
    pub exit_with_parent: bool,
    /// File holding the cluster's join token (else the environment's
    /// SYMPHONY_JOIN_TOKEN; never a flag's value).
    #[arg(long)]
    pub join_token_file: Option<PathBuf>,
    /// Triton-layout model repository: the models found there by name
    /// declare their real tensors (names, types, shapes) instead of the
    /// default INPUT0/OUTPUT0.
    #[arg(long)]
    pub model_repository: Option<PathBuf>,
}

/// The `--config` file: the same options, '_' for '-'.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    id: Option<u32>,
    scheduler: Option<String>,
    http: Option<String>,
    grpc: Option<String>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    data_listen: Option<String>,
    transport: Option<String>,
    idle: Option<String>,
    metrics: Option<String>,
    zoo: Option<String>,
    models: Option<String>,
    model: Option<Vec<String>>,
    slots: Option<u32>,
    max_body: Option<usize>,
    grace_ms: Option<u64>,
    return_margin_us: Option<u64>,
    http_threads: Option<usize>,
    heartbeat_ms: Option<u64>,
    dead_after_ms: Option<u64>,
    queue: Option<usize>,
    exit_with_parent: Option<bool>,
    join_token_file: Option<PathBuf>,
    model_repository: Option<PathBuf>,
}

/// A validated configuration.
#[derive(Clone, Debug)]
pub struct Options {
    /// Frontend id.
    pub id: u16,
    /// Scheduler control address.
    pub scheduler: String,
    /// HTTP listen address.
    pub http: SocketAddr,
    /// gRPC listen address.
    pub grpc: SocketAddr,
    /// TLS identity for HTTP and gRPC, if any.
    pub tls: Option<crate::tls::TlsIdentity>,
    /// Data listen address.
    pub data_listen: String,
    /// Transport.
    pub transport: TransportKind,
    /// I/O thread idle strategy.
    pub idle: IdleStrategy,
    /// /metrics listen address.
    pub metrics: SocketAddr,
    /// The cluster's model list (model id = index).
    pub models: Vec<ModelSpec>,
    /// Staging slots.
    pub slots: u32,
    /// Largest HTTP body.
    pub max_body: usize,
    /// Grace past a deadline.
    pub grace: Duration,
    /// Budget kept for the way back.
    pub return_margin: Duration,
    /// HTTP worker threads.
    pub http_threads: usize,
    /// Heartbeat interval.
    pub heartbeat: Duration,
    /// Silence after which the scheduler is dead.
    pub dead_after: Duration,
    /// Task queue capacity.
    pub queue: usize,
    /// Die with the parent.
    pub exit_with_parent: bool,
    /// The cluster's join token, if any.
    pub join_token: Option<JoinToken>,
    /// Model repository whose tensors the catalog declares.
    pub model_repository: Option<PathBuf>,
}

fn addr(what: &str, s: &str) -> Result<SocketAddr, String> {
    s.parse()
        .map_err(|_| format!("--{what} '{s}': expected HOST:PORT (e.g. 127.0.0.1:0)"))
}

impl Options {
    /// Resolves a command line (and its `--config` file) into options.
    pub fn resolve(cli: Cli) -> Result<Options, String> {
        let file = match &cli.config {
            None => FileConfig::default(),
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .map_err(|e| format!("--config {}: {e}", p.display()))?;
                toml::from_str::<FileConfig>(&text)
                    .map_err(|e| format!("--config {}: {e}", p.display()))?
            }
        };
        let id = cli.id.or(file.id).unwrap_or(0);
        if id >= MAX_FRONTEND_ID {
            return Err(format!(
                "--id {id}: frontend ids must be < {MAX_FRONTEND_ID}"
            ));
        }
        let scheduler = cli
            .scheduler
            .or(file.scheduler)
            .ok_or("--scheduler ADDR is required (the scheduler's control address)")?;
        let transport =
            TransportKind::parse(cli.transport.or(file.transport).as_deref().unwrap_or("shm"))?;
        let idle = control::parse_idle(cli.idle.or(file.idle).as_deref().unwrap_or("park"))?;
        let http = addr(
            "http",
            cli.http.or(file.http).as_deref().unwrap_or("127.0.0.1:0"),
        )?;
        let grpc = addr(
            "grpc",
            cli.grpc.or(file.grpc).as_deref().unwrap_or("127.0.0.1:0"),
        )?;
        let tls = crate::tls::from_options(
            cli.tls_cert.or(file.tls_cert).as_ref(),
            cli.tls_key.or(file.tls_key).as_ref(),
        )?;
        let metrics = addr(
            "metrics",
            cli.metrics
                .or(file.metrics)
                .as_deref()
                .unwrap_or("127.0.0.1:0"),
        )?;
        let data_listen = cli
            .data_listen
            .or(file.data_listen)
            .unwrap_or_else(|| transport.ephemeral_listen("127.0.0.1"));
        let extra = if cli.model.is_empty() {
            file.model.unwrap_or_default()
        } else {
            cli.model
        };
        let models = cluster_models(
            cli.zoo.or(file.zoo).as_deref().unwrap_or("a100"),
            cli.models.or(file.models).as_deref().unwrap_or("all"),
            &extra,
        )?;
        let slots = cli.slots.or(file.slots).unwrap_or(4096);
        if slots == 0 || slots > crate::staging::MAX_SLOTS {
            return Err(format!(
                "--slots {slots}: must be 1..={}",
                crate::staging::MAX_SLOTS
            ));
        }
        let max_body = cli.max_body.or(file.max_body).unwrap_or(1 << 20);
        if max_body == 0 {
            return Err("--max-body must be positive".into());
        }
        let http_threads = cli.http_threads.or(file.http_threads).unwrap_or(2);
        if http_threads == 0 || http_threads > 256 {
            return Err(format!("--http-threads {http_threads}: must be 1..=256"));
        }
        let heartbeat_ms = cli.heartbeat_ms.or(file.heartbeat_ms).unwrap_or(100);
        let dead_after_ms = cli.dead_after_ms.or(file.dead_after_ms).unwrap_or(1000);
        if heartbeat_ms == 0 || dead_after_ms <= heartbeat_ms {
            return Err(format!(
                "--heartbeat-ms {heartbeat_ms} / --dead-after-ms {dead_after_ms}: need 0 < heartbeat < dead-after"
            ));
        }
        let queue = cli.queue.or(file.queue).unwrap_or(slots as usize);
        if queue == 0 {
            return Err("--queue must be positive".into());
        }
        let join_token =
            JoinToken::from_file_or_env(cli.join_token_file.or(file.join_token_file).as_deref())?;
        Ok(Options {
            join_token,
            id: id as u16,
            scheduler,
            http,
            grpc,
            tls,
            data_listen,
            transport,
            idle,
            metrics,
            models,
            slots,
            max_body,
            grace: Duration::from_millis(cli.grace_ms.or(file.grace_ms).unwrap_or(100)),
            return_margin: Duration::from_micros(
                cli.return_margin_us.or(file.return_margin_us).unwrap_or(2000),
            ),
            http_threads,
            heartbeat: Duration::from_millis(heartbeat_ms),
            dead_after: Duration::from_millis(dead_after_ms),
            queue,
            exit_with_parent: cli.exit_with_parent || file.exit_with_parent.unwrap_or(false),
            model_repository: cli.model_repository.or(file.model_repository),
        })
    }
}

/// Runs the daemon with `args` (`args[0]` is the program name). Exit code 0
/// after a stop signal, 2 for a bad command line or configuration, 1 for
/// anything else (scheduler unreachable, refused or gone, ...).
pub fn main_with_args(args: Vec<String>) -> ExitCode {
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let opts = match Options::resolve(cli) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("symphony-frontend: {e}");
            return ExitCode::from(2);
        }
    };
    if opts.exit_with_parent {
        control::terminate_with_parent();
    }
    if let Err(e) = control::install_stop_signals() {
        eprintln!("symphony-frontend: {e}");
        return ExitCode::from(1);
    }
    match run(opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("symphony-frontend: {e}");
            ExitCode::from(1)
        }
    }
}

/// Runs the daemon until a stop signal ([`control::stop_requested`]):
/// `Ok` then, `Err` if it could not start or the scheduler went away.
pub fn run(opts: Options) -> Result<(), String> {
    control::with_domain(opts.transport, Daemon { opts })?
}

struct Daemon {
    opts: Options,
}

impl WithDomain for Daemon {
    type Out = Result<(), String>;
    fn run<D: Domain>(self, domain: D) -> Result<(), String> {
        serve(domain, self.opts)
    }
}

fn serve<D: Domain>(domain: D, opts: Options) -> Result<(), String> {
    let catalog = match &opts.model_repository {
        Some(repo) => {
            let scanned = scheduler::repository::scan(repo).map_err(|e| e.to_string())?;
            for e in &scanned.refused {
                eprintln!("symphony-frontend: model repository: refused: {e}");
            }
            ModelCatalog::with_repository(&opts.models, &scanned)
        }
        None => ModelCatalog::with_default_tensors(&opts.models),
    };
    let slot_size = u32::try_from(catalog.max_input_bytes().max(1))
        .map_err(|_| "a model input is too large for a staging slot".to_string())?;
    let region = opts
        .transport
        .readable_region(slot_size as usize * opts.slots as usize)
        .map_err(|e| format!("staging region: {e}"))?;
    let reg = domain
        .register(&region, Access::REMOTE_READ)
        .map_err(|e| format!("registering the staging region: {e}"))?;
    let staging = Staging::new(
        reg.clone(),
        StagingConfig {
            frontend_id: opts.id,
            slots: opts.slots,
            slot_size,
            max_output: catalog.max_output_bytes().min(u64::from(u32::MAX)) as u32,
        },
    )
    .map_err(|e| format!("staging: {e}"))?;
    let listener = domain
        .listen(&opts.data_listen)
        .map_err(|e| format!("data listener on '{}': {e}", opts.data_listen))?;
    let data_addr = listener.local_addr();

    let idler = IdleWait::new(opts.idle).map_err(|e| format!("wait set: {e}"))?;
    let (sink, tasks) = NetSink::new(opts.queue, Some(idler.notifier()));
    let stats = sink.stats().clone();
    let node = FrontendNode::new(
        FrontendNodeConfig {
            id: opts.id,
            data_endpoint: data_addr.clone(),
            models: catalog.entries().len() as u32,
            heartbeat: opts.heartbeat,
            dead_after: opts.dead_after,
            handshake_timeout: HANDSHAKE_TIMEOUT,
        },
        staging.clone(),
        tasks,
    )
    .with_join_token(opts.join_token.clone());
    let sched = control::connect_retrying(&domain, &opts.scheduler, CONNECT_TIMEOUT)
        .map_err(|e| format!("cannot reach the scheduler at '{}': {e}", opts.scheduler))?;
    let stop_io = Arc::new(AtomicBool::new(false));
    let mut io = IoHost {
        domain,
        reg,
        node,
        idler,
        clock: MonotonicClock::new(),
        id: opts.id,
        stop: stop_io.clone(),
    };
    let model_count = io.register(sched)?;
    eprintln!(
        "symphony-frontend {}: registered with the scheduler at {} ({} models, transport {})",
        opts.id,
        opts.scheduler,
        model_count,
        opts.transport.name()
    );

    let stop_accept = Arc::new(AtomicBool::new(false));
    let (conn_tx, conn_rx) = mpsc::channel();
    let acceptor = {
        let (stop, waker) = (stop_accept.clone(), io.idler.notifier());
        std::thread::Builder::new()
            .name("frontend-accept".into())
            .spawn(move || accept_backends(listener, conn_tx, stop, waker))
            .map_err(|e| format!("acceptor thread: {e}"))?
    };

    let (done_tx, done_rx) = mpsc::channel();
    let io_wake = io.idler.notifier();
    let io_thread = std::thread::Builder::new()
        .name("frontend-io".into())
        .spawn(move || {
            let r = io.run(conn_rx);
            let _ = done_tx.send(r);
        })
        .map_err(|e| format!("I/O thread: {e}"))?;

    let result = serve_http(
        &opts, catalog, staging, sink, &stats, &data_addr, &done_rx, &stop_io, &io_wake,
    );
    stop_io.store(true, Ordering::SeqCst);
    stop_accept.store(true, Ordering::SeqCst);
    io_wake.signal();
    let _ = io_thread.join();
    let _ = acceptor.join();
    result
}

/// Starts HTTP and /metrics, prints READY, waits for a stop or the I/O
/// thread's end, then shuts HTTP down after answering what is in flight.
#[allow(clippy::too_many_arguments)]
fn serve_http(
    opts: &Options,
    catalog: ModelCatalog,
    staging: Arc<Staging>,
    sink: NetSink,
    stats: &Arc<FrontendStats>,
    data_addr: &str,
    done_rx: &mpsc::Receiver<Result<(), String>>,
    stop_io: &AtomicBool,
    io_wake: &Notifier,
) -> Result<(), String> {
    let max_slo_ms = catalog
        .entries()
        .iter()
        .map(|e| e.spec.slo.as_nanos() / 1_000_000)
        .max()
        .unwrap_or(0);
    let metrics = Arc::new(Metrics::new(&catalog));
    let extra = stats.clone();
    metrics.set_extra(Box::new(move |o: &mut String| extra.render(o)));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(opts.http_threads)
        .thread_name("frontend-http")
        .enable_all()
        .build()
        .map_err(|e| format!("HTTP runtime: {e}"))?;
    let service = Arc::new(
        ClusterService::new(
            Arc::new(catalog),
            staging.clone(),
            sink,
            metrics.clone(),
            opts.grace,
        )
        .with_ready(stats.ready.clone())
        .with_return_margin(opts.return_margin),
    );
    let http_cfg = HttpConfig {
        max_body: opts.max_body,
        ..HttpConfig::default()
    };
    let grpc = start_grpc(&rt, opts, service.clone())?;
    let http_tls = opts.tls.as_ref().map(|t| t.http_config()).transpose()?;
    let server = rt
        .block_on(Server::start_tls(opts.http, service, http_cfg, http_tls))
        .map_err(|e| format!("HTTP listener on {}: {e}", opts.http))?;
    let render_staging = staging.clone();
    let render_metrics = metrics.clone();
    let endpoint = MetricsEndpoint::start(
        opts.metrics,
        Arc::new(move || render_metrics.render(&render_staging.counters().snapshot())),
    )
    .map_err(|e| format!("metrics listener on {}: {e}", opts.metrics))?;
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(
            out,
            "READY http={} grpc={} metrics={} data={}",
            server.addr(),
            grpc.addr(),
            endpoint.addr(),
            data_addr
        );
        let _ = out.flush();
    }

    let mut io_result = None;
    while !control::stop_requested() {
        match done_rx.recv_timeout(std::time::Duration::from_millis(20)) {
            Ok(r) => {
                io_result = Some(r);
                break;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                io_result = Some(Err("the I/O thread ended unexpectedly".into()));
                break;
            }
        }
    }
    // Stop taking requests; answer those in flight (outcomes still arrive
    // while the I/O thread runs; if it has ended they were already ended),
    // waiting at most the longest deadline plus grace.
    stats.ready.store(false, Ordering::Release);
    let limit = std::time::Duration::from_millis(
        max_slo_ms
            .saturating_add(opts.grace.as_nanos() / 1_000_000)
            .saturating_add(1000),
    );
    let (drained, ()) = rt.block_on(async { tokio::join!(server.stop_and_drain(limit), grpc.stop()) });
    if !drained {
        eprintln!("symphony-frontend: some HTTP connections were still open at shutdown");
    }
    if io_result.is_none() {
        stop_io.store(true, Ordering::SeqCst);
        io_wake.signal();
        io_result = done_rx.recv_timeout(std::time::Duration::from_secs(5)).ok();
    }
    // Anything staged after the I/O thread's last pass.
    staging.end_in_flight(RoutedOutcome::Dropped(DropReason::Shutdown));
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    drop(endpoint);
    let c = staging.counters().snapshot();
    eprintln!(
        "symphony-frontend {}: accepted={} succeeded={} dropped={} failed={}",
        opts.id, c.accepted, c.succeeded, c.dropped, c.failed
    );
    match io_result {
        Some(Err(e)) if !control::stop_requested() => Err(e),
        Some(_) => Ok(()),
        None => Err("the I/O thread did not stop within 5 s".into()),
    }
}

/// Starts the gRPC server on `rt` over the same service (and TLS) as HTTP.
fn start_grpc<S: crate::service::InferenceService>(
    rt: &tokio::runtime::Runtime,
    opts: &Options,
    service: Arc<S>,
) -> Result<crate::grpc::GrpcServer, String> {
    let addr = opts.grpc;
    rt.block_on(crate::grpc::GrpcServer::start_tls(
        addr,
        service,
        Default::default(),
        opts.tls.as_ref(),
    ))
    .map_err(|e| format!("gRPC listener on {addr}: {e}"))
}

/// Accepts backends' data connections and hands them to the I/O thread
/// (whose node checks their `Register{Backend}`).
fn accept_backends<L: Listener>(
    mut listener: L,
    tx: mpsc::Sender<L::Conn>,
    stop: Arc<AtomicBool>,
    waker: Notifier,
) {
    while !stop.load(Ordering::SeqCst) {
        match listener.accept(Duration::from_millis(100)) {
            Ok(conn) => {
                if tx.send(conn).is_err() {
                    return;
                }
                waker.signal();
            }
            Err(TransportError::Timeout) => {}
            Err(e) => {
                eprintln!("symphony-frontend: accepting a data connection: {e}");
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
    }
}

/// What ends the I/O loop.
enum Ended {
    Stopped,
    SchedulerGone(String),
}

/// The host around the [`FrontendNode`]: the real clock, the wait set over
/// the node's links, the logs, and the domain the staging region is
/// registered in.
struct IoHost<D: Domain> {
    domain: D,
    reg: Registration,
    node: FrontendNode<D::Conn>,
    idler: IdleWait,
    clock: MonotonicClock,
    id: u16,
    stop: Arc<AtomicBool>,
}

impl<D: Domain> IoHost<D> {
    /// Puts a link's fd in the wait set (before the node gets the link).
    fn add_fd(&mut self, conn: &D::Conn) {
        if let Some(fd) = conn.wait_fd() {
            let _ = self.idler.set().add(fd);
        }
    }

    /// Takes the links the node let go of out of the wait set (a dead
    /// connection's fd would stay readable) and drops them.
    fn retire_closed(&mut self) {
        while let Some(gone) = self.node.take_closed_link() {
            if let Some(fd) = gone.wait_fd() {
                self.idler.set().remove(fd);
            }
        }
    }

    /// One idle pass until the node's next timer, unless a task arrives.
    fn idle(&mut self, now: Instant) {
        let budget = self
            .node
            .poll_at()
            .map_or(Duration::from_millis(100), |t| t.saturating_since(now));
        let (node, stop) = (&self.node, &self.stop);
        self.idler
            .idle_unless(budget, || node.has_queued_tasks() || stop.load(Ordering::Acquire));
    }

    /// Registers with the scheduler over `sched`; returns the scheduler's
    /// model count once it acknowledged.
    fn register(&mut self, sched: D::Conn) -> Result<u32, String> {
        self.add_fd(&sched);
        self.node.handle_scheduler_link(self.clock.now(), sched);
        loop {
            let now = self.clock.now();
            let work = self.node.poll(now);
            self.retire_closed();
            while let Some(ev) = self.node.poll_event() {
                match ev {
                    FrontendEvent::Registered { models } => return Ok(models),
                    FrontendEvent::Refused { why } => return Err(why),
                    _ => {}
                }
            }
            if work {
                self.idler.reset();
            } else {
                self.idle(now);
            }
        }
    }

    fn run(mut self, incoming: mpsc::Receiver<D::Conn>) -> Result<(), String> {
        let ended = self.poll_loop(&incoming);
        // Nothing will answer what is still queued or in flight.
        self.node.shutdown();
        let mut links = self.node.into_links();
        let mut conns: Vec<&mut D::Conn> = links.iter_mut().collect();
        let _ = dataplane::transport::deregister_within(
            &self.domain,
            &self.reg,
            &mut conns,
            Duration::from_millis(1000),
        );
        match ended {
            Ended::Stopped => Ok(()),
            Ended::SchedulerGone(why) => Err(format!("scheduler gone: {why}")),
        }
    }

    fn poll_loop(&mut self, incoming: &mpsc::Receiver<D::Conn>) -> Ended {
        loop {
            if self.stop.load(Ordering::Acquire) {
                return Ended::Stopped;
            }
            let now = self.clock.now();
            let mut work = self.node.poll(now);
            self.retire_closed();
            while let Some(ev) = self.node.poll_event() {
                match ev {
                    FrontendEvent::SchedulerLost { why } => return Ended::SchedulerGone(why),
                    FrontendEvent::BackendLost { id, why } => eprintln!(
                        "symphony-frontend {}: backend {id} data connection closed: {why}",
                        self.id
                    ),
                    FrontendEvent::LinkRefused { why } => eprintln!("symphony-frontend: {why}"),
                    FrontendEvent::Registered { .. }
                    | FrontendEvent::Refused { .. }
                    | FrontendEvent::BackendJoined(_) => {}
                }
            }
            while let Ok(conn) = incoming.try_recv() {
                work = true;
                self.add_fd(&conn);
                self.node.handle_backend_link(now, conn);
            }
            if work {
                self.idler.reset();
            } else {
                self.idle(now);
            }
        }
    }
}
