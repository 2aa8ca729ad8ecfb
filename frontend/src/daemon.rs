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
//! The frontend outlives its scheduler: `--scheduler` may name several
//! addresses (comma-separated: the leader and its standbys); when the link
//! is lost the node holds the requests in flight (see
//! [`FrontendNode::with_failover`]) while the I/O thread reconnects on a
//! capped exponential backoff ([`Reconnect`]) and registers again.
//!
//! Entry point: [`main_with_args`] (the `symphony-frontend` binary is a
//! thin wrapper, so a multi-call binary can run it too); the command line,
//! logs, stop signals and exit codes are the daemon shell's
//! ([`node_shell`]).

use crate::http::{HttpConfig, Server};
use crate::metrics::Metrics;
use crate::models::ModelCatalog;
use crate::node::{FrontendEvent, FrontendNode, FrontendNodeConfig, FrontendStats, NetSink};
use crate::service::ClusterService;
use crate::staging::{RoutedOutcome, Staging, StagingConfig};
use clap::Parser;
use dataplane::control::{self, ControlError, TransportKind, WithDomain};
use dataplane::idle::IdleStrategy;
use dataplane::join::JoinToken;
use dataplane::mem::Access;
use dataplane::reconnect::{connect_first, split_addrs, Reconnect, DEFAULT_MAX_BACKOFF, DEFAULT_MIN_BACKOFF};
use node_shell::metrics::Counter;
use node_shell::{self as shell, MetricsEndpoint, parse_socket_addr, setup, Acceptor, Common, CommonArgs, ConfigError, Daemon, SchedulerUnreachable, SetupError};
use dataplane::time::{Duration, Instant, MonotonicClock};
use dataplane::transport::{Connection, Domain, Listener, Registration};
use dataplane::waitset::{IdleWait, Notifier};
use dataplane::wire::DropReason;
use routing::{RoutesConfig, RoutesWatch};
use scheduler_core::zoo::ModelListArgs;
use scheduler_core::routes::RouteTable;
use scheduler_core::zoo::ModelSpec;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use tracing::{info, warn};

/// Frontend ids must be below this (every daemon refuses others; the
/// task-id layout fixes it).
pub use dataplane::ids::MAX_FRONTENDS as MAX_FRONTEND_ID;
/// How long the scheduler has to acknowledge the registration, and a
/// backend to send its `Register` on a new data connection.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_millis(5000);
/// One reconnection attempt's connect bound (the I/O thread waits in it).
const RECONNECT_ATTEMPT: Duration = Duration::from_millis(100);

/// Command line of `symphony-frontend` (loaded by
/// [`node_shell::load`]: flags, `SYMPHONY_*` variables, `--config`).
#[derive(Parser, Debug)]
#[command(
    name = "symphony-frontend",
    about = "Symphony frontend: the KServe v2 HTTP API in front of a Symphony scheduler"
)]
pub struct FrontendArgs {
    /// This frontend's id (< 4096, unique in the cluster).
    #[arg(long, default_value_t = 0)]
    pub id: u32,
    /// The scheduler's control address (required unless --etcd); several,
    /// comma-separated (a leader and its standbys), are tried in turn when
    /// reconnecting.
    #[arg(long)]
    pub scheduler: Option<String>,
    /// Several scheduler groups (issue 19): etcd client endpoints,
    /// comma-separated. The frontend reads the routing table there (as the
    /// schedulers do), links to every group by the `schedulers` addresses
    /// the table gives, sends each task to its model's owner and follows
    /// the table's changes; replaces --scheduler.
    #[arg(long)]
    pub etcd: Option<String>,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub etcd_tls: routing::EtcdTlsArgs,
    /// The routing table's key in etcd (with --etcd).
    #[arg(long, default_value = scheduler_core::routes::DEFAULT_ROUTES_KEY)]
    pub routes_key: String,
    /// How often the routing table is re-read, ms (with --etcd).
    #[arg(long, default_value_t = 50)]
    pub routes_poll_ms: u64,
    /// KServe v2 HTTP listen address, HOST:PORT.
    #[arg(long, default_value = "127.0.0.1:0", value_parser = parse_socket_addr)]
    pub http: SocketAddr,
    /// KServe v2 gRPC listen address, HOST:PORT.
    #[arg(long, default_value = "127.0.0.1:0", value_parser = parse_socket_addr)]
    pub grpc: SocketAddr,
    /// TLS certificate chain (PEM) for the HTTP and gRPC endpoints (with
    /// --tls-key) [default: no TLS].
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM) for the HTTP and gRPC endpoints (with --tls-cert).
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    /// Data listen address for backends' connections (transport address).
    /// Default: a fresh one (shm: a new name; tcp: 127.0.0.1:0).
    #[arg(long)]
    pub data_listen: Option<String>,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub model_list: ModelListArgs,
    /// Staging slots: requests in flight at most.
    #[arg(long, default_value_t = 4096)]
    pub slots: u32,
    /// Largest HTTP request body, bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub max_body: usize,
    /// Wait past a request's deadline before answering it timed out, ms.
    #[arg(long, default_value_t = 100)]
    pub grace_ms: u64,
    /// Part of each request's budget kept for the way back (the output's
    /// trip to this frontend and the HTTP answer): the scheduler is given
    /// the budget minus this, µs.
    #[arg(long, default_value_t = 2000)]
    pub return_margin_us: u64,
    /// HTTP worker threads.
    #[arg(long, default_value_t = 2)]
    pub http_threads: usize,
    /// Tasks queued toward the scheduler at most (a full queue fails the
    /// request, 503). Default: the number of slots.
    #[arg(long)]
    pub queue: Option<usize>,
    /// Most tasks per submission message to the scheduler (a full batch
    /// leaves at once); 1 sends one `Task` message per task.
    #[arg(long, default_value_t = crate::node::DEFAULT_COALESCE)]
    pub coalesce: usize,
    /// How long a task may wait for more to fill its message, µs; 0 never
    /// waits (latency first: a busy frontend's messages fill anyway, since
    /// one pass takes every task queued since the last).
    #[arg(long, default_value_t = 0)]
    pub coalesce_us: u64,
    /// Triton-layout model repository: the models found there by name
    /// declare their real tensors (names, types, shapes) instead of the
    /// default INPUT0/OUTPUT0.
    #[arg(long)]
    pub model_repository: Option<PathBuf>,
    /// File holding the admin token (at least 16 bytes; a trailing newline
    /// is not part of it): model load/unload and the repository index on
    /// the HTTP and gRPC ports need `Authorization: Bearer TOKEN`
    /// [default: none, and those calls are refused].
    #[arg(long)]
    pub admin_token_file: Option<PathBuf>,
    /// Longest a client may take to send a request body once its head is
    /// in, ms (HTTP; else 408 and the connection closes).
    #[arg(long, default_value_t = 10_000)]
    pub body_timeout_ms: u64,
    /// How long to retry connecting to the scheduler (and reading the first
    /// routing table) at start, ms. A frontend started before any scheduler
    /// leads waits this long before it gives up (Kubernetes: raise it so a
    /// fresh cluster does not crash-loop while etcd elects a leader).
    #[arg(long, default_value_t = 5000)]
    pub connect_timeout_ms: u64,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: CommonArgs,
}

/// A validated configuration.
#[derive(Clone, Debug)]
pub struct FrontendConfig {
    /// Frontend id.
    pub id: u16,
    /// Scheduler control addresses (at least one, unless `routes`), tried
    /// in this order.
    pub schedulers: Vec<String>,
    /// With scheduler groups: where the routing table is read (the
    /// schedulers' follower; its `group` is unused here).
    pub routes: Option<RoutesConfig>,
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
    /// Most tasks per submission message.
    pub coalesce: usize,
    /// How long a task may wait for more to fill its message.
    pub coalesce_wait: Duration,
    /// The cluster's join token, if any.
    pub join_token: Option<JoinToken>,
    /// Model repository whose tensors the catalog declares.
    pub model_repository: Option<PathBuf>,
    /// The admin credential of model control and the repository index.
    pub admin: Option<crate::api::AdminCredential>,
    /// Longest an HTTP request body may take to arrive.
    pub body_timeout: std::time::Duration,
    /// How long to retry reaching the scheduler at start.
    pub connect_timeout: Duration,
}

impl FrontendArgs {
    /// Checks every frontend option; `common` is the resolved shared part.
    pub fn resolve(self, common: Common) -> Result<FrontendConfig, ConfigError> {
        if self.id >= MAX_FRONTEND_ID {
            return Err(ConfigError::invalid("id", format!("{}: frontend ids must be < {MAX_FRONTEND_ID}", self.id)));
        }
        let routes = match self.etcd.as_deref().map(split_addrs) {
            None => None,
            Some(e) if e.is_empty() => return Err(ConfigError::invalid("etcd", "no endpoint given")),
            Some(_) if self.scheduler.is_some() => {
                return Err(ConfigError::invalid("scheduler", "with --etcd the routing table names every group's schedulers: give one of the two"))
            }
            Some(_) if self.routes_poll_ms == 0 => return Err(ConfigError::invalid("routes-poll-ms", "must be positive")),
            Some(endpoints) => Some(RoutesConfig {
                endpoints,
                group: String::new(),
                key: self.routes_key.clone(),
                poll: Duration::from_millis(self.routes_poll_ms),
                tls: self.etcd_tls.load().map_err(|(flag, why)| ConfigError::invalid(flag, why))?,
            }),
        };
        let scheduler = match (self.scheduler, &routes) {
            (Some(s), _) => s,
            (None, Some(_)) => String::new(),
            (None, None) => {
                return Err(ConfigError::Missing { option: "scheduler", what: "the scheduler's control address" })
            }
        };
        let in_range = |name: &str, v: usize, max: usize| {
            if (1..=max).contains(&v) {
                Ok(v)
            } else {
                Err(ConfigError::invalid(name, format!("{v}: must be 1..={max}")))
            }
        };
        let slots = in_range("slots", self.slots as usize, crate::staging::MAX_SLOTS as usize)? as u32;
        if common.control_delay.is_some() {
            warn!("--control-delay-us is for the scheduler and the backends; a frontend ignores it");
        }
        let schedulers = split_addrs(&scheduler);
        if schedulers.is_empty() && routes.is_none() {
            return Err(ConfigError::invalid("scheduler", "no address given"));
        }
        Ok(FrontendConfig {
            id: self.id as u16,
            schedulers,
            routes,
            http: self.http,
            grpc: self.grpc,
            tls: crate::tls::from_options(self.tls_cert.as_ref(), self.tls_key.as_ref())
                .map_err(|e| ConfigError::invalid("tls-cert, --tls-key", e.to_string()))?,
            data_listen: self
                .data_listen
                .unwrap_or_else(|| common.transport.ephemeral_listen("127.0.0.1")),
            transport: common.transport,
            idle: common.idle,
            metrics: common.metrics,
            models: self.model_list.resolve().map_err(|e| ConfigError::invalid(ModelListArgs::FLAGS, e))?,
            slots,
            max_body: in_range("max-body", self.max_body, usize::MAX)?,
            grace: Duration::from_millis(self.grace_ms),
            return_margin: Duration::from_micros(self.return_margin_us),
            http_threads: in_range("http-threads", self.http_threads, 256)?,
            heartbeat: common.heartbeat,
            dead_after: common.dead_after,
            queue: in_range("queue", self.queue.unwrap_or(slots as usize), usize::MAX)?,
            coalesce: in_range("coalesce", self.coalesce, dataplane::wire::MAX_TASKS_PER_MESSAGE)?,
            coalesce_wait: Duration::from_micros(self.coalesce_us),
            join_token: common.join_token,
            model_repository: self.model_repository,
            admin: match &self.admin_token_file {
                None => None,
                Some(p) => {
                    let bytes = std::fs::read(p).map_err(|e| ConfigError::invalid("admin-token-file", format!("{}: {e}", p.display())))?;
                    let admin = crate::api::AdminCredential::new(&bytes).ok_or_else(|| {
                        ConfigError::invalid("admin-token-file", format!("{}: shorter than {} bytes", p.display(), crate::api::MIN_ADMIN_TOKEN_LEN))
                    })?;
                    Some(admin)
                }
            },
            body_timeout: match self.body_timeout_ms {
                0 => return Err(ConfigError::invalid("body-timeout-ms", "must be positive")),
                n => std::time::Duration::from_millis(n),
            },
            connect_timeout: Duration::from_millis(self.connect_timeout_ms),
        })
    }
}

/// Why the frontend could not start or had to stop.
#[derive(Debug, thiserror::Error)]
pub enum FrontendError {
    /// The transport cannot be opened.
    #[error(transparent)]
    Transport(#[from] ControlError),
    /// A part of the frontend (model repository, staging, listeners, routing
    /// follower, I/O thread) cannot be set up.
    #[error(transparent)]
    Setup(#[from] SetupError),
    /// The scheduler cannot be reached.
    #[error(transparent)]
    Unreachable(#[from] SchedulerUnreachable),
    /// The scheduler refused the registration (or its model list differs).
    #[error("{0}")]
    Refused(String),
    /// The I/O thread ended without saying why, or did not stop.
    #[error("the I/O thread {0}")]
    IoThread(&'static str),
}

impl Daemon for FrontendArgs {
    type Config = FrontendConfig;
    type Error = FrontendError;
    fn common(&self) -> &CommonArgs {
        &self.common
    }
    fn configure(self, common: Common) -> Result<FrontendConfig, ConfigError> {
        self.resolve(common)
    }
    fn run(cfg: FrontendConfig) -> Result<(), FrontendError> {
        run(cfg)
    }
}

/// Runs the daemon with `args` (`args[0]` is the program name): see
/// [`node_shell::main`].
pub fn main_with_args(args: Vec<String>) -> ExitCode {
    shell::main::<FrontendArgs>(args)
}

/// Runs the daemon until a stop signal ([`control::stop_requested`]):
/// `Ok` then, `Err` if it could not start (losing the scheduler ends
/// nothing: it reconnects).
pub fn run(cfg: FrontendConfig) -> Result<(), FrontendError> {
    control::with_domain(cfg.transport, Serve(cfg))?
}

struct Serve(FrontendConfig);

impl WithDomain for Serve {
    type Out = Result<(), FrontendError>;
    fn run<D: Domain>(self, domain: D) -> Result<(), FrontendError> {
        serve(domain, self.0)
    }
}

/// The models' tensors: the repository's where it declares them.
fn catalog(cfg: &FrontendConfig) -> Result<ModelCatalog, FrontendError> {
    let Some(repo) = &cfg.model_repository else {
        return Ok(ModelCatalog::with_default_tensors(&cfg.models));
    };
    let scanned = scheduler_core::repository::scan(repo).map_err(setup("model repository"))?;
    for e in &scanned.refused {
        warn!(error = %e, "model repository: refused");
    }
    Ok(ModelCatalog::with_repository(&cfg.models, &scanned))
}

/// The staging area: a region backends READ inputs from, registered.
fn staging<D: Domain>(domain: &D, cfg: &FrontendConfig, catalog: &ModelCatalog) -> Result<(Registration, Arc<Staging>), FrontendError> {
    let slot_size = u32::try_from(catalog.max_input_bytes().max(1))
        .map_err(setup("a model input is too large for a staging slot"))?;
    let region = cfg
        .transport
        .readable_region(slot_size as usize * cfg.slots as usize)
        .map_err(setup("staging region"))?;
    let reg = domain
        .register(&region, Access::REMOTE_READ)
        .map_err(setup("registering the staging region"))?;
    let staging = Staging::new(
        reg.clone(),
        StagingConfig {
            frontend_id: cfg.id,
            slots: cfg.slots,
            slot_size,
            max_output: catalog.max_output_bytes().min(u64::from(u32::MAX)) as u32,
        },
    )
    .map_err(setup("staging"))?;
    Ok((reg, staging))
}

fn serve<D: Domain>(domain: D, cfg: FrontendConfig) -> Result<(), FrontendError> {
    let catalog = catalog(&cfg)?;
    let (reg, staging) = staging(&domain, &cfg, &catalog)?;
    let listener = domain
        .listen(&cfg.data_listen)
        .map_err(setup(format!("data listener on '{}'", cfg.data_listen)))?;
    let data_addr = listener.local_addr();
    let idler = IdleWait::new(cfg.idle).map_err(setup("wait set"))?;
    let (sink, tasks) = NetSink::new(cfg.queue, Some(idler.notifier()));
    let stats = sink.stats().clone();
    let node = FrontendNode::new(
        FrontendNodeConfig {
            id: cfg.id,
            data_endpoint: data_addr.clone(),
            models: catalog.entries().len() as u32,
            heartbeat: cfg.heartbeat,
            dead_after: cfg.dead_after,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            coalesce: cfg.coalesce,
            coalesce_wait: cfg.coalesce_wait,
        },
        staging.clone(),
        tasks,
    )
    .with_join_token(cfg.join_token.clone())
    .with_failover(true);
    // One link per scheduler group (one group without a routing table).
    let (node, groups, routes) = match &cfg.routes {
        None => (node, vec![(String::new(), cfg.schedulers.clone())], None),
        Some(rc) => {
            let watch = RoutesWatch::spawn(rc, idler.notifier()).map_err(setup("routing table follower"))?;
            let table = first_table(&watch, rc, cfg.connect_timeout)?;
            let groups: Vec<(String, Vec<String>)> = table.groups.iter().map(|g| (g.name.clone(), g.schedulers.clone())).collect();
            if let Some((name, _)) = groups.iter().find(|(_, addrs)| addrs.is_empty()) {
                return Err(FrontendError::Setup(SetupError::new(
                    format!("routing table at {}", rc.key),
                    format!("group {name:?} names no scheduler address (its `schedulers`)"),
                )));
            }
            let names: Vec<String> = groups.iter().map(|(n, _)| n.clone()).collect();
            let models: Vec<String> = catalog.entries().iter().map(|e| e.spec.name.clone()).collect();
            let mut node = node.with_groups(groups.len());
            node.handle_routes(table.revision, &owners(&table, &names, &models));
            info!(revision = table.revision, groups = groups.len(), "routing table read");
            (node, groups, Some(FollowedRoutes { watch, names, models }))
        }
    };
    let stop_io = Arc::new(AtomicBool::new(false));
    let mut io = IoHost {
        domain,
        reg,
        node,
        idler,
        clock: MonotonicClock::new(),
        stop: stop_io.clone(),
        reconnects: Vec::new(),
        routes,
        forged_welcomes: Counter::default(),
    };
    for (g, (name, addrs)) in groups.iter().enumerate() {
        let (sched, at) = connect_first(&io.domain, addrs, cfg.connect_timeout)
            .map_err(|source| SchedulerUnreachable { addr: addrs.join(","), source })?;
        let mut reconnect = Reconnect::new(addrs.clone(), DEFAULT_MIN_BACKOFF, DEFAULT_MAX_BACKOFF);
        reconnect.prefer(&addrs[at]);
        io.reconnects.push(reconnect);
        let models = io.register(g, sched)?;
        info!(
            frontend = cfg.id,
            scheduler = %addrs[at],
            group = %name,
            models,
            transport = %cfg.transport.name(),
            "registered with the scheduler"
        );
    }
    let acceptor = Acceptor::spawn("frontend-accept", listener, io.idler.notifier())
        .map_err(setup("acceptor thread"))?;
    let (done_tx, done_rx) = mpsc::channel();
    let io_wake = io.idler.notifier();
    let forged_welcomes = io.forged_welcomes.clone();
    let io_thread = std::thread::Builder::new()
        .name("frontend-io".into())
        .spawn(move || {
            let _ = done_tx.send(io.run(acceptor));
        })
        .map_err(setup("I/O thread"))?;
    let io_end = IoEnd { done: done_rx, stop: stop_io, wake: io_wake };
    let result = Http::start(&cfg, catalog, staging, sink, &stats, forged_welcomes, &data_addr).and_then(|http| http.serve(&cfg, &stats, &io_end));
    io_end.stop.store(true, Ordering::SeqCst);
    io_end.wake.signal();
    let _ = io_thread.join();
    result
}

/// The first routing table (waited for at most `timeout`).
fn first_table(watch: &RoutesWatch, rc: &RoutesConfig, timeout: Duration) -> Result<Arc<RouteTable>, FrontendError> {
    let start = std::time::Instant::now();
    loop {
        if let Some(t) = watch.newer_than(0) {
            return Ok(t);
        }
        if start.elapsed().as_nanos() as u64 >= timeout.as_nanos() {
            return Err(FrontendError::Setup(SetupError::new(
                format!("routing table at {} in etcd {}", rc.key, rc.endpoints.join(",")),
                format!("none read within {} ms (store one with `symphony route set`)", timeout.as_nanos() / 1_000_000),
            )));
        }
        std::thread::sleep(std::time::Duration::from_nanos(rc.poll.as_nanos()));
    }
}

/// The owner of each of `models` in `table`, as an index into `groups`
/// (the groups the frontend links to, by name; a group it has no link
/// for owns nothing here).
fn owners(table: &RouteTable, groups: &[String], models: &[String]) -> Vec<Option<u16>> {
    models
        .iter()
        .map(|m| {
            let name = &table.groups[table.owner(m)?].name;
            groups.iter().position(|g| g == name).map(|g| g as u16)
        })
        .collect()
}

/// With scheduler groups: the table's follower and what its names mean.
struct FollowedRoutes {
    watch: RoutesWatch,
    /// The groups linked to, by index.
    names: Vec<String>,
    /// The catalog's model names, by id.
    models: Vec<String>,
}

/// The main thread's handle on the I/O thread: its result, its stop flag
/// and its waker.
struct IoEnd {
    done: mpsc::Receiver<Result<(), FrontendError>>,
    stop: Arc<AtomicBool>,
    wake: Notifier,
}

/// The HTTP side: its runtime, server and `/metrics`.
struct Http {
    rt: tokio::runtime::Runtime,
    server: Server,
    grpc: crate::grpc::GrpcServer,
    endpoint: MetricsEndpoint,
    staging: Arc<Staging>,
    /// How long answering what is in flight may take at shutdown.
    drain_limit: std::time::Duration,
}

impl Http {
    /// Starts HTTP and /metrics and prints the READY line.
    fn start(
        cfg: &FrontendConfig,
        catalog: ModelCatalog,
        staging: Arc<Staging>,
        sink: NetSink,
        stats: &Arc<FrontendStats>,
        forged_welcomes: Counter,
        data_addr: &str,
    ) -> Result<Http, FrontendError> {
        let max_slo_ms = catalog
            .entries()
            .iter()
            .map(|e| e.spec.slo.as_nanos() / 1_000_000)
            .max()
            .unwrap_or(0);
        let drain_limit = std::time::Duration::from_millis(
            max_slo_ms
                .saturating_add(cfg.grace.as_nanos() / 1_000_000)
                .saturating_add(1000),
        );
        let metrics = Arc::new(Metrics::new(&catalog));
        stats.register(metrics.registry());
        metrics.register_forged_welcomes(forged_welcomes);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cfg.http_threads)
            .thread_name("frontend-http")
            .enable_all()
            .build()
            .map_err(setup("HTTP runtime"))?;
        let service = Arc::new(
            ClusterService::new(Arc::new(catalog), staging.clone(), sink, metrics.clone(), cfg.grace)
                .with_ready(stats.ready.clone())
                .with_return_margin(cfg.return_margin),
        );
        let http_cfg = HttpConfig {
            max_body: cfg.max_body,
            body_timeout: cfg.body_timeout,
            admin: cfg.admin,
            ..HttpConfig::default()
        };
        let grpc_cfg = crate::grpc::GrpcConfig { admin: cfg.admin, ..Default::default() };
        let grpc = rt
            .block_on(crate::grpc::GrpcServer::start_tls(cfg.grpc, service.clone(), grpc_cfg, cfg.tls.as_ref()))
            .map_err(setup(format!("gRPC listener on {}", cfg.grpc)))?;
        let http_tls = cfg.tls.as_ref().map(|t| t.http_config()).transpose().map_err(setup("TLS"))?;
        let server = rt
            .block_on(Server::start_tls(cfg.http, service, http_cfg, http_tls))
            .map_err(setup(format!("HTTP listener on {}", cfg.http)))?;
        node_shell::metrics::register_link_closures(metrics.registry());
        let endpoint = MetricsEndpoint::start(cfg.metrics, metrics.registry().clone())
        .map_err(setup(format!("metrics listener on {}", cfg.metrics)))?;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(
            out,
            "READY http={} grpc={} metrics={} data={data_addr}",
            server.addr(),
            grpc.addr(),
            endpoint.addr()
        );
        let _ = out.flush();
        Ok(Http { rt, server, grpc, endpoint, staging, drain_limit })
    }

    /// Waits for a stop or the I/O thread's end, then shuts HTTP down
    /// after answering what is in flight.
    fn serve(self, cfg: &FrontendConfig, stats: &FrontendStats, io: &IoEnd) -> Result<(), FrontendError> {
        let mut io_result = None;
        while !control::stop_requested() {
            match io.done.recv_timeout(std::time::Duration::from_millis(20)) {
                Ok(r) => {
                    io_result = Some(r);
                    break;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    io_result = Some(Err(FrontendError::IoThread("ended unexpectedly")));
                    break;
                }
            }
        }
        // Stop taking requests; answer those in flight (outcomes still
        // arrive while the I/O thread runs; if it has ended they were
        // already ended), waiting at most the longest deadline plus grace.
        stats.ready.store(false, Ordering::Release);
        let (drained, ()) = self
            .rt
            .block_on(async { tokio::join!(self.server.stop_and_drain(self.drain_limit), self.grpc.stop()) });
        if !drained {
            warn!("some HTTP connections were still open at shutdown");
        }
        if io_result.is_none() {
            io.stop.store(true, Ordering::SeqCst);
            io.wake.signal();
            io_result = io.done.recv_timeout(std::time::Duration::from_secs(5)).ok();
        }
        // Anything staged after the I/O thread's last pass.
        self.staging.end_in_flight(RoutedOutcome::Dropped(DropReason::Shutdown));
        self.rt.shutdown_timeout(std::time::Duration::from_secs(1));
        drop(self.endpoint);
        let c = self.staging.counters().snapshot();
        info!(
            frontend = cfg.id,
            accepted = c.accepted,
            succeeded = c.succeeded,
            dropped = c.dropped,
            failed = c.failed,
            "requests at shutdown"
        );
        match io_result {
            Some(Err(e)) if !control::stop_requested() => Err(e),
            Some(_) => Ok(()),
            None => Err(FrontendError::IoThread("did not stop within 5 s")),
        }
    }
}

/// What ends the I/O loop (losing the scheduler does not: it reconnects).
enum Ended {
    Stopped,
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
    stop: Arc<AtomicBool>,
    /// When to try each group's scheduler(s) again while its link is down
    /// (one group without a routing table).
    reconnects: Vec<Reconnect>,
    /// With scheduler groups: the routing table's follower.
    routes: Option<FollowedRoutes>,
    /// The node's count of Welcomes that did not prove the join token, as
    /// `/metrics` shows it (`symphony_frontend_forged_welcomes_total`).
    forged_welcomes: Counter,
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
        let next = self.reconnects.iter().filter_map(Reconnect::due_at).chain(self.node.poll_at()).min();
        let budget = next.map_or(Duration::from_millis(100), |t| t.saturating_since(now));
        let (node, stop) = (&self.node, &self.stop);
        // Arm the links' wait fds (shm: a peer wakes us only if told we
        // sleep); a message that came meanwhile means no sleep.
        let mut armed = true;
        node.for_each_conn(|c| armed &= c.arm_wait());
        if !armed {
            return;
        }
        self.idler
            .idle_unless(budget, || node.has_queued_tasks() || stop.load(Ordering::Acquire));
    }

    /// Registers with group `group`'s scheduler over `sched`; returns the
    /// scheduler's model count once it acknowledged.
    fn register(&mut self, group: usize, sched: D::Conn) -> Result<u32, FrontendError> {
        self.add_fd(&sched);
        self.node.handle_group_link(self.clock.now(), group, sched);
        loop {
            let now = self.clock.now();
            let work = self.node.poll(now);
            self.retire_closed();
            while let Some(ev) = self.node.poll_event() {
                match ev {
                    FrontendEvent::Registered { models, group: g } if usize::from(g) == group => return Ok(models),
                    FrontendEvent::Refused { why, group: g } if usize::from(g) == group => return Err(FrontendError::Refused(why)),
                    // Another group's link (registered before this one).
                    other => self.on_event(other, now),
                }
            }
            if work {
                self.idler.reset();
            } else {
                self.idle(now);
            }
        }
    }

    fn run(mut self, acceptor: Acceptor<D::Conn>) -> Result<(), FrontendError> {
        let ended = self.poll_loop(&acceptor);
        drop(acceptor);
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
        }
    }

    /// One reconnection attempt if one is due: the link goes to the node,
    /// which registers over it (its events say how that went).
    fn try_reconnect(&mut self, now: Instant) -> bool {
        let mut work = false;
        for g in 0..self.reconnects.len() {
            let Some(addr) = self.reconnects[g].due(now) else { continue };
            work = true;
            match self.domain.connect(addr, RECONNECT_ATTEMPT) {
                Ok(conn) => {
                    info!(scheduler = addr, group = g, "reconnected to a scheduler; registering");
                    // Nothing more is due until the registration's outcome;
                    // the backoff stands until it succeeds.
                    self.reconnects[g].linked();
                    self.add_fd(&conn);
                    self.node.handle_group_link(self.clock.now(), g, conn);
                }
                Err(e) => {
                    tracing::debug!(scheduler = addr, group = g, error = %e, "reconnection attempt failed");
                    self.reconnects[g].failed(self.clock.now());
                }
            }
        }
        work
    }

    /// With scheduler groups: hands the node a newer routing table, if the
    /// follower has read one. A group the table adds gets a link (tried at
    /// once); a group whose scheduler addresses changed is tried at the new
    /// ones from its next attempt.
    fn follow_routes(&mut self, now: Instant) -> bool {
        let Some(r) = &mut self.routes else { return false };
        if self.node.take_stale_table() {
            r.watch.read_now();
        }
        let Some(t) = r.watch.newer_than(self.node.route_revision()) else { return false };
        for g in t.groups.iter().filter(|g| !g.schedulers.is_empty()) {
            match r.names.iter().position(|n| *n == g.name) {
                Some(i) => {
                    if let Some(rc) = self.reconnects.get_mut(i) {
                        rc.set_addrs(g.schedulers.clone());
                    }
                }
                None => {
                    let Some(i) = self.node.add_group() else { continue };
                    debug_assert_eq!(i, r.names.len());
                    r.names.push(g.name.clone());
                    let mut rc = Reconnect::new(g.schedulers.clone(), DEFAULT_MIN_BACKOFF, DEFAULT_MAX_BACKOFF);
                    rc.lost(now);
                    self.reconnects.push(rc);
                    info!(group = %g.name, schedulers = %g.schedulers.join(","), "the routing table added a scheduler group; linking to it");
                }
            }
        }
        let taken = self.node.handle_routes(t.revision, &owners(&t, &r.names, &r.models));
        if taken {
            info!(revision = t.revision, "routing table applied");
        }
        taken
    }

    /// Logs an event of the node and tells its group's reconnection what
    /// became of the link.
    fn on_event(&mut self, ev: FrontendEvent, now: Instant) {
        // A forged Welcome ends in an event (Refused): count it then.
        self.forged_welcomes.inner().store(self.node.forged_welcomes(), Ordering::Relaxed);
        match ev {
            FrontendEvent::SchedulerLost { why, group } => {
                warn!(%why, group, "scheduler lost; holding requests and reconnecting");
                if let Some(r) = self.reconnects.get_mut(usize::from(group)) {
                    r.lost(now);
                }
            }
            FrontendEvent::Registered { group, .. } => {
                if let Some(r) = self.reconnects.get_mut(usize::from(group)) {
                    info!(attempts = r.failures() + 1, group, "registered with the scheduler again");
                    r.registered();
                }
            }
            FrontendEvent::Refused { why, group } => {
                warn!(%why, group, "the scheduler refused the registration; trying the next");
                if let Some(r) = self.reconnects.get_mut(usize::from(group)) {
                    r.failed(now);
                }
            }
            FrontendEvent::BackendLost { id, why } => {
                warn!(backend = id, %why, "backend data connection closed")
            }
            FrontendEvent::LinkRefused { why } => warn!("{why}"),
            FrontendEvent::BackendJoined(id) => info!(backend = id, "backend data connection registered"),
        }
    }

    fn poll_loop(&mut self, acceptor: &Acceptor<D::Conn>) -> Ended {
        loop {
            if self.stop.load(Ordering::Acquire) {
                return Ended::Stopped;
            }
            let now = self.clock.now();
            let mut work = self.follow_routes(now);
            work |= self.node.poll(now);
            self.retire_closed();
            while let Some(ev) = self.node.poll_event() {
                self.on_event(ev, now);
            }
            work |= self.try_reconnect(now);
            while let Some(conn) = acceptor.try_next() {
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
