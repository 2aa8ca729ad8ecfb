//! A whole single-process serving stack: the HTTP server over a
//! [`ClusterService`] whose tasks loop through the in-process cluster.
//! What the tests, the `serve` example and capacity runs start.

use crate::cluster::{self, ClusterConfig, ClusterHandle, LoopbackSink};
use crate::http::{HttpConfig, Server};
use crate::metrics::Metrics;
use crate::models::ModelCatalog;
use crate::service::ClusterService;
use crate::staging::{Staging, StagingConfig};
use dataplane::mem::{Access, Region};
use dataplane::time::Duration;
use dataplane::transport::Registration;
use std::net::SocketAddr;
use std::sync::Arc;

/// Configuration of a [`LocalServer`].
#[derive(Clone, Debug)]
pub struct LocalConfig {
    /// Served models.
    pub catalog: ModelCatalog,
    /// Emulated cluster.
    pub cluster: ClusterConfig,
    /// HTTP limits.
    pub http: HttpConfig,
    /// Where to listen (`127.0.0.1:0` picks a port).
    pub addr: SocketAddr,
    /// Staging slots (requests in flight at most).
    pub slots: u32,
    /// Wait past a request's budget before answering it timed out.
    pub grace: Duration,
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
            slots: 4096,
            grace: Duration::from_millis(100),
        }
    }
}

/// A running single-process stack.
#[derive(Debug)]
pub struct LocalServer {
    server: Server,
    service: Arc<ClusterService<LoopbackSink>>,
    cluster: ClusterHandle,
}

impl LocalServer {
    /// Starts everything on the current tokio runtime.
    pub async fn start(cfg: LocalConfig) -> std::io::Result<LocalServer> {
        let io = |e: dataplane::mem::MemError| std::io::Error::other(e.to_string());
        let slot_size = cfg.catalog.max_input_bytes().max(1);
        let slot_size = u32::try_from(slot_size)
            .map_err(|_| std::io::Error::other("model input too large for a slot"))?;
        let region =
            Region::anonymous(slot_size as usize * cfg.slots.max(1) as usize).map_err(io)?;
        // In a daemon the transport domain registers the region; here the
        // in-process cluster resolves key 1 to it directly.
        let reg = Registration::new(1, region, Access::REMOTE_READ, 0);
        let staging = Staging::new(
            reg,
            StagingConfig {
                frontend_id: 1,
                slots: cfg.slots,
                slot_size,
                max_output: cfg.catalog.max_output_bytes().min(u64::from(u32::MAX)) as u32,
            },
        )
        .map_err(io)?;
        let metrics = Arc::new(Metrics::new(&cfg.catalog));
        let (sink, cluster) =
            cluster::start(&cfg.catalog, staging.clone(), metrics.clone(), cfg.cluster);
        let service = Arc::new(ClusterService::new(
            Arc::new(cfg.catalog),
            staging,
            sink,
            metrics,
            cfg.grace,
        ));
        let server = Server::start(cfg.addr, service.clone(), cfg.http).await?;
        Ok(LocalServer {
            server,
            service,
            cluster,
        })
    }
    /// The HTTP address.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }
    /// The service (counters, metrics, catalog, staging).
    pub fn service(&self) -> &Arc<ClusterService<LoopbackSink>> {
        &self.service
    }
    /// Stops the HTTP server, then the cluster.
    pub async fn stop(self) {
        self.server.stop().await;
        self.cluster.shutdown().await;
    }
}
