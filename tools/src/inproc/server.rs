//! A whole serving stack in one process: the KServe v2 HTTP server over a
//! frontend node's `ClusterService`, with the scheduler, frontend and
//! backend nodes of a [`NodeCluster`] on one thread on the real clock.
//! What the HTTP tests, the `serve` example (the in-process tritonclient
//! tests) and quick capacity runs start. It runs the same nodes as the
//! daemons and the chaos harness; only the transport (`sim`, in memory)
//! and the GPUs (emulated) differ.
//!
//! The cluster thread sleeps in a wait set until the cluster's next timer
//! or until an HTTP worker queues a task (the frontend's task queue
//! notifies it). A wake-up can still come late on a loaded machine, so
//! every schedulable window is kept at least [`ClusterConfig::timer_slack`]
//! wide (`CoreConfig::min_window`), and [`ClusterConfig::control_delay`] is
//! charged as the scheduler's control delay.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};

use dataplane::time::{Duration, MonotonicClock};
use dataplane::transport::sim::{FaultConfig, SimNet};
use dataplane::waitset::WaitSet;
use frontend::grpc::{GrpcConfig, GrpcServer};
use frontend::http::{HttpConfig, Server};
use frontend::models::ModelCatalog;
use frontend::node::NetSink;
use frontend::service::ClusterService;
use scheduler::deferred::CoreConfig;
use scheduler::netdelay::NetworkDelay;
use scheduler::types::Admission;

use super::cluster::{ClusterSpec, NodeCluster};

/// Shape of the in-process cluster.
#[derive(Clone, Copy, Debug)]
pub struct ClusterConfig {
    /// Emulated GPUs (on one backend node).
    pub gpus: u32,
    /// Scheduler knobs (the delay and the narrowest window are set from
    /// the fields below).
    pub core: CoreConfig,
    /// The timer's lateness bound: the narrowest schedulable window.
    pub timer_slack: Duration,
    /// Charged before each batch as the scheduler's control delay.
    pub control_delay: Duration,
    /// Tasks queued toward the scheduler before a submit is refused.
    pub queue: usize,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            gpus: 1,
            core: CoreConfig::default(),
            timer_slack: Duration::from_millis(5),
            control_delay: Duration::from_millis(1),
            queue: 4096,
        }
    }
}

/// Configuration of a [`LocalServer`].
#[derive(Clone, Debug)]
pub struct LocalConfig {
    /// Served models.
    pub catalog: ModelCatalog,
    /// The emulated cluster.
    pub cluster: ClusterConfig,
    /// HTTP limits.
    pub http: HttpConfig,
    /// Where to listen (`127.0.0.1:0` picks a port).
    pub addr: SocketAddr,
    /// gRPC listen address (default `127.0.0.1:0`).
    pub grpc_addr: SocketAddr,
    /// gRPC limits.
    pub grpc: GrpcConfig,
    /// TLS for HTTP and gRPC (default: none).
    pub tls: Option<frontend::tls::TlsIdentity>,
    /// Staging slots (requests in flight at most).
    pub slots: u32,
    /// Wait past a request's budget before answering it timed out.
    pub grace: Duration,
    /// Per model (by catalog index) its priority levels and queue bound
    /// (`max_queue`; over it a request is refused at once as overloaded);
    /// a model past the end gets the default (one level, unbounded).
    pub admission: Vec<Admission>,
}

impl LocalConfig {
    /// Defaults around `catalog`: one GPU, 4096 slots, 1 MiB bodies,
    /// 100 ms grace, an ephemeral loopback port.
    pub fn new(catalog: ModelCatalog) -> Self {
        LocalConfig {
            catalog,
            cluster: ClusterConfig::default(),
            http: HttpConfig::default(),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            grpc_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            grpc: GrpcConfig::default(),
            tls: None,
            slots: 4096,
            grace: Duration::from_millis(100),
            admission: Vec::new(),
        }
    }
}

/// How long start-up waits for the nodes to register.
const FORM_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// The longest the cluster thread sleeps without a timer (it also wakes
/// on every queued task).
const MAX_SLEEP: Duration = Duration::from_millis(50);

/// A running single-process stack.
pub struct LocalServer {
    server: Server,
    grpc: GrpcServer,
    service: Arc<ClusterService<NetSink>>,
    stop: StopOnDrop,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Stops the cluster thread when the server is dropped without `stop`.
struct StopOnDrop {
    flag: Arc<AtomicBool>,
    wake: dataplane::waitset::Notifier,
}

impl StopOnDrop {
    fn stop(&self) {
        self.flag.store(true, Ordering::Release);
        self.wake.signal();
    }
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.stop();
    }
}

impl std::fmt::Debug for LocalServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalServer").field("addr", &self.server.addr()).finish_non_exhaustive()
    }
}

fn spec(cfg: &LocalConfig) -> ClusterSpec {
    let mut spec = ClusterSpec::new(cfg.catalog.specs(), 1, 1, cfg.cluster.gpus.max(1));
    spec.catalog = Arc::new(cfg.catalog.clone());
    let mut core = cfg.cluster.core;
    core.delay = NetworkDelay { d_ctrl: cfg.cluster.control_delay, d_data: Duration::ZERO };
    core.min_window = core.min_window.max(cfg.cluster.timer_slack);
    spec.core = core;
    spec.slots = cfg.slots.max(1);
    spec.grace = cfg.grace;
    spec.queue = cfg.cluster.queue.max(1);
    spec.return_margin = Duration::ZERO;
    spec
}

impl LocalServer {
    /// Starts the cluster thread and the HTTP server on the current tokio
    /// runtime; returns once the nodes have registered.
    pub async fn start(cfg: LocalConfig) -> std::io::Result<LocalServer> {
        let spec = spec(&cfg);
        let mut waits = WaitSet::new()?;
        let wake = waits.notifier();
        let net = SimNet::new(0, FaultConfig { base_delay: Duration::from_micros(5), read_delay: Duration::from_micros(5), ..FaultConfig::default() });
        let mut cluster = NodeCluster::new(spec, net, Some(wake.clone())).map_err(std::io::Error::other)?;
        for (model, admission) in cfg.admission.iter().enumerate() {
            cluster.set_admission(model as u32, *admission);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::channel::<Result<Arc<ClusterService<NetSink>>, std::io::Error>>();
        let stopping = stop.clone();
        let thread = std::thread::Builder::new().name("symphony-inproc".into()).spawn(move || {
            let clock = MonotonicClock::new();
            let begun = std::time::Instant::now();
            let mut ready = Some(ready_tx);
            while !stopping.load(Ordering::Acquire) {
                let now = clock.now();
                cluster.poll(now, &mut |_| {});
                if let Some(tx) = &ready {
                    let formed = cluster.frontend(0).filter(|h| h.node.is_registered()).map(|h| h.service.clone());
                    let gpus = cluster.scheduler().map_or(0, |s| s.plane().online_gpus());
                    match formed {
                        Some(svc) if gpus > 0 => {
                            let _ = tx.send(Ok(svc));
                            ready = None;
                        }
                        _ if begun.elapsed() > FORM_TIMEOUT => {
                            let _ = tx.send(Err(std::io::Error::new(
                                std::io::ErrorKind::TimedOut,
                                "the in-process cluster did not form",
                            )));
                            return;
                        }
                        _ => {}
                    }
                }
                let next = cluster.next_wakeup();
                let now = clock.now();
                let sleep = next.map_or(MAX_SLEEP, |t| t.saturating_since(now).min(MAX_SLEEP));
                if sleep > Duration::ZERO {
                    // Sleep unless an HTTP worker queued a task meanwhile
                    // (its notify sees the sleeping flag, or this sees the task).
                    waits.wait_unless(sleep, || cluster.frontend(0).is_some_and(|h| h.node.has_queued_tasks()));
                }
            }
        })?;
        let service = tokio::task::spawn_blocking(move || ready_rx.recv_timeout(FORM_TIMEOUT + std::time::Duration::from_secs(1)))
            .await
            .map_err(std::io::Error::other)?
            .map_err(std::io::Error::other)??;
        let http_tls = cfg.tls.as_ref().map(|t| t.http_config()).transpose().map_err(std::io::Error::other)?;
        let server = Server::start_tls(cfg.addr, service.clone(), cfg.http, http_tls).await?;
        let grpc = GrpcServer::start_tls(cfg.grpc_addr, service.clone(), cfg.grpc, cfg.tls.as_ref()).await?;
        Ok(LocalServer { server, grpc, service, stop: StopOnDrop { flag: stop, wake }, thread: Some(thread) })
    }

    /// The HTTP address.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// The gRPC address.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc.addr()
    }

    /// The service (counters, metrics, catalog, staging).
    pub fn service(&self) -> &Arc<ClusterService<NetSink>> {
        &self.service
    }

    /// Stops the HTTP and gRPC servers, then the cluster thread.
    pub async fn stop(mut self) {
        self.server.stop().await;
        self.grpc.stop().await;
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
    }
}
