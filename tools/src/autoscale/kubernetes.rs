//! The Kubernetes [`ScaleProvider`]: the backends are the pods of a
//! StatefulSet (`deploy/base/backend.yaml`, one GPU each), and the
//! autoscaler acts by changing its `replicas` through the `scale`
//! subresource (`/apis/apps/v1/namespaces/{ns}/statefulsets/{name}/scale`).
//!
//! - **Ids.** A backend's `--id` is its pod index (the label
//!   `apps.kubernetes.io/pod-index`), and its GPUs are
//!   `ordinal·gpus_per_pod + k`: the ids this provider reports and takes.
//! - **Scale-out** raises `replicas`: the new ordinals are the next ones,
//!   [`GpuPhase::Joining`] until their pod is Ready (and, where the
//!   controller tells the provider which backends the scheduler has
//!   admitted to matchmaking, until the scheduler lists them too).
//! - **Scale-in** lowers `replicas`. A StatefulSet always removes the
//!   highest ordinals, so that is what this provider drains, whatever ids
//!   it is given: it honours the count. The controller names the idlest
//!   GPUs ([`scheduler::autoscale::pick_drain`], highest id first among
//!   equals), and deferred matchmaking (lowest free GPU first) leaves the
//!   highest ids idlest, so the two mostly agree; where they do not, the
//!   busier backend drains all the same (what it holds finishes). The
//!   removed pods get SIGTERM, the backend's graceful leave; the pod's
//!   `terminationGracePeriodSeconds` must cover the drain.
//! - **Concurrency.** Every patch carries the `resourceVersion` the
//!   provider last read, so a change made meanwhile by anyone else (`kubectl
//!   scale`, a second controller) fails with 409 instead of being
//!   overwritten; the next [`KubernetesProvider::refresh`] reads it.
//!
//! Every byte from the API server is hostile: each request has one deadline
//! (connect, TLS, request and the whole body), bodies are read up to a
//! bound, and a body that does not parse, or a replica count out of range,
//! is an error, never a panic. The service-account token is read again for
//! every request, since the kubelet rotates projected tokens.
//!
//! The client is hyper 1 over tokio-rustls (ring), already in the
//! workspace for the frontend; see docs/decisions.md for why not `kube`.
//! It runs on a one-thread runtime of its own, so the provider's methods
//! are plain blocking calls that may be made from any thread, inside an
//! async runtime or not.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::io::Read;
use std::net::ToSocketAddrs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration as StdDuration;

use bytes::Bytes;
use dataplane::time::{Duration, Instant, MonotonicClock};
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE, HOST, USER_AGENT};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use node_shell::metrics::{Counter, Gauge, MetricsRegistry};
use node_shell::MetricsEndpoint;
use scheduler::autoscale::{GpuMember, GpuPhase, ScaleError, ScaleProvider};
use scheduler::types::GpuId;
use serde::Deserialize;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};
use tracing::{info, warn};

use super::{Controller, ControllerFlags, Provider, SchedulerMetrics, Scrape, SignalError, SignalSource, Tick};

/// Where a pod's service-account files are mounted.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The most bytes of a token or CA bundle file read.
const MAX_FILE_BYTES: u64 = 256 << 10;
/// Who the API server records as the writer of the replicas, and the
/// user agent.
pub const FIELD_MANAGER: &str = "symphony-autoscale";
/// The most characters of a status message kept in an error.
const MAX_MESSAGE_CHARS: usize = 200;

/// How to reach the API server and which StatefulSet to scale.
#[derive(Clone, Debug)]
pub struct KubeConfig {
    /// The API server's host (`KUBERNETES_SERVICE_HOST`): an IP address or
    /// a DNS name, which its certificate must name.
    pub host: String,
    /// Its port (`KUBERNETES_SERVICE_PORT`).
    pub port: u16,
    /// The bearer token's file, read again for every request.
    pub token_path: PathBuf,
    /// The CA bundle the API server's certificate must chain to (PEM).
    pub ca_path: PathBuf,
    /// The backends' namespace.
    pub namespace: String,
    /// The backends' StatefulSet.
    pub statefulset: String,
    /// The label selector of its pods.
    pub pod_selector: String,
    /// GPUs per backend pod (`--gpus-per-backend`).
    pub gpus_per_pod: u32,
    /// The most pods it may have (scale-out past it is `NoCapacity`).
    pub max_pods: u32,
    /// One request's deadline: connect, TLS, request and body.
    pub timeout: StdDuration,
    /// The most bytes of one response body.
    pub max_body: usize,
    /// How long a new backend is expected to take to warm and register
    /// (a joining GPU's `ready_at`; the autoscaler does not wait on it).
    pub join_estimate: Duration,
}

impl KubeConfig {
    /// The in-cluster configuration: the API server from
    /// `KUBERNETES_SERVICE_HOST`/`KUBERNETES_SERVICE_PORT`, the token and CA
    /// bundle of the pod's service account, the StatefulSet `statefulset`
    /// in `namespace` (or in the service account's own namespace).
    /// `account_dir` holds the service account's `token`, `ca.crt` and
    /// `namespace` ([`SERVICE_ACCOUNT_DIR`] in a pod).
    pub fn in_cluster(account_dir: &Path, namespace: Option<&str>, statefulset: &str) -> Result<KubeConfig, KubeError> {
        let var = |name: &'static str| std::env::var(name).map_err(|_| KubeError::NotInCluster { missing: name });
        let host = var("KUBERNETES_SERVICE_HOST")?;
        let port = var("KUBERNETES_SERVICE_PORT")?;
        let port = port.parse().map_err(|_| KubeError::Config(format!("KUBERNETES_SERVICE_PORT '{port}' is not a port")))?;
        let dir = account_dir;
        let namespace = match namespace {
            Some(ns) => ns.to_string(),
            None => String::from_utf8_lossy(&read_bounded(&dir.join("namespace"))?).trim().to_string(),
        };
        Ok(KubeConfig { namespace, ..KubeConfig::new(host, port, dir.join("token"), dir.join("ca.crt"), statefulset) })
    }

    /// A configuration with the defaults of `deploy/`: namespace
    /// `symphony`, one GPU per pod, pods selected by
    /// `app.kubernetes.io/name=<statefulset>`, a 5 s deadline, 16 MiB
    /// bodies (the pod list of 512 backends, each pod ~20 KiB of JSON with
    /// its managed fields, and room to spare).
    pub fn new(host: String, port: u16, token_path: PathBuf, ca_path: PathBuf, statefulset: &str) -> KubeConfig {
        KubeConfig {
            host,
            port,
            token_path,
            ca_path,
            namespace: "symphony".into(),
            statefulset: statefulset.into(),
            pod_selector: format!("app.kubernetes.io/name={statefulset}"),
            gpus_per_pod: 1,
            max_pods: 512,
            timeout: StdDuration::from_secs(5),
            max_body: 16 << 20,
            join_estimate: Duration::from_millis(30_000),
        }
    }
}

/// What went wrong talking to the API server.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// Not in a pod: a variable of the in-cluster configuration is unset.
    #[error("not running in a Kubernetes pod: {missing} is not set")]
    NotInCluster {
        /// The variable.
        missing: &'static str,
    },
    /// The configuration is unusable.
    #[error("kubernetes configuration: {0}")]
    Config(String),
    /// A token or CA file could not be read.
    #[error("cannot read {path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The TCP connection or the TLS handshake failed.
    #[error("{method} {path}: cannot connect to the API server: {source}")]
    Connect {
        /// The request's method.
        method: Method,
        /// The request's path.
        path: String,
        /// The socket's or the TLS handshake's error.
        #[source]
        source: std::io::Error,
    },
    /// HTTP failed on an established connection.
    #[error("{method} {path}: {source}")]
    Http {
        /// The request's method.
        method: Method,
        /// The request's path.
        path: String,
        /// hyper's error.
        #[source]
        source: hyper::Error,
    },
    /// No whole answer within the deadline.
    #[error("{method} {path}: no answer within {timeout:?}")]
    Timeout {
        /// The request's method.
        method: Method,
        /// The request's path.
        path: String,
        /// The deadline.
        timeout: StdDuration,
    },
    /// The body was over the bound.
    #[error("{method} {path}: response body over {limit} bytes")]
    TooLarge {
        /// The request's method.
        method: Method,
        /// The request's path.
        path: String,
        /// The bound.
        limit: usize,
    },
    /// The API server refused (403: RBAC; 409: changed since read; ...).
    #[error("{method} {path}: HTTP {status}: {message}")]
    Status {
        /// The request's method.
        method: Method,
        /// The request's path.
        path: String,
        /// The HTTP status.
        status: u16,
        /// The Status object's message (bounded), or the body's start.
        message: String,
    },
    /// A body that is not the object asked for.
    #[error("{method} {path}: malformed response: {reason}")]
    Malformed {
        /// The request's method.
        method: Method,
        /// The request's path.
        path: String,
        /// What was wrong.
        reason: String,
    },
}

impl KubeError {
    /// The HTTP status the API server answered, if it did.
    pub fn status(&self) -> Option<u16> {
        match self {
            KubeError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

impl From<KubeError> for ScaleError {
    fn from(e: KubeError) -> ScaleError {
        ScaleError::Provider { provider: "kubernetes", reason: e.to_string() }
    }
}

/// The StatefulSet's scale as last read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scale {
    /// `spec.replicas`.
    pub replicas: u32,
    /// `metadata.resourceVersion`, the precondition of the next patch.
    pub resource_version: String,
}

/// One backend pod as last listed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodState {
    /// Its Ready condition is True.
    pub ready: bool,
    /// It is terminating (its deletion timestamp is set).
    pub terminating: bool,
}

/// A blocking client of the few API calls the provider makes.
pub struct KubeClient {
    inner: Arc<Inner>,
    runtime: Option<tokio::runtime::Runtime>,
}

struct Inner {
    cfg: KubeConfig,
    tls: tokio_rustls::TlsConnector,
    server_name: ServerName<'static>,
    authority: HeaderValue,
}

impl KubeClient {
    /// A client for `cfg`: reads its CA bundle now (the token at each
    /// request).
    pub fn new(cfg: KubeConfig) -> Result<KubeClient, KubeError> {
        let mut roots = RootCertStore::empty();
        let pem = read_bounded(&cfg.ca_path)?;
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert = cert.map_err(|e| KubeError::Config(format!("CA bundle {}: {e}", cfg.ca_path.display())))?;
            roots.add(cert).map_err(|e| KubeError::Config(format!("CA bundle {}: {e}", cfg.ca_path.display())))?;
        }
        if roots.is_empty() {
            return Err(KubeError::Config(format!("CA bundle {} holds no certificate", cfg.ca_path.display())));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| KubeError::Config(format!("TLS: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let server_name = ServerName::try_from(cfg.host.clone())
            .map_err(|_| KubeError::Config(format!("'{}' is neither an IP address nor a DNS name", cfg.host)))?;
        let authority = match server_name {
            ServerName::IpAddress(rustls::pki_types::IpAddr::V6(_)) => format!("[{}]:{}", cfg.host, cfg.port),
            _ => format!("{}:{}", cfg.host, cfg.port),
        };
        let authority = HeaderValue::from_str(&authority).map_err(|_| KubeError::Config(format!("bad host '{}'", cfg.host)))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("kube-client")
            .enable_all()
            .build()
            .map_err(|e| KubeError::Config(format!("cannot start the client's runtime: {e}")))?;
        let inner = Inner { cfg, tls: tokio_rustls::TlsConnector::from(Arc::new(tls)), server_name, authority };
        Ok(KubeClient { inner: Arc::new(inner), runtime: Some(runtime) })
    }

    /// The configuration.
    pub fn config(&self) -> &KubeConfig {
        &self.inner.cfg
    }

    fn scale_path(&self) -> String {
        let c = &self.inner.cfg;
        format!("/apis/apps/v1/namespaces/{}/statefulsets/{}/scale", c.namespace, c.statefulset)
    }

    /// GET the StatefulSet's scale.
    pub fn get_scale(&self) -> Result<Scale, KubeError> {
        let path = self.scale_path();
        let body = self.call(Method::GET, path.clone(), None)?;
        parse_scale(&body, self.inner.cfg.max_pods).map_err(|reason| KubeError::Malformed { method: Method::GET, path, reason })
    }

    /// Sets `replicas` with a merge patch of the scale, on condition that
    /// it is still at `resource_version` (else HTTP 409).
    pub fn patch_replicas(&self, replicas: u32, resource_version: &str) -> Result<Scale, KubeError> {
        // The field manager names who set the replicas (kubectl get --show-managed-fields).
        let path = format!("{}?fieldManager={FIELD_MANAGER}", self.scale_path());
        let patch = serde_json::json!({"metadata": {"resourceVersion": resource_version}, "spec": {"replicas": replicas}});
        let body = self.call(Method::PATCH, path.clone(), Some(patch.to_string().into_bytes()))?;
        parse_scale(&body, self.inner.cfg.max_pods).map_err(|reason| KubeError::Malformed { method: Method::PATCH, path, reason })
    }

    /// Lists the backend pods by ordinal.
    pub fn list_pods(&self) -> Result<BTreeMap<u32, PodState>, KubeError> {
        let c = &self.inner.cfg;
        let path = format!("/api/v1/namespaces/{}/pods?labelSelector={}", c.namespace, percent_encode(&c.pod_selector));
        let body = self.call(Method::GET, path.clone(), None)?;
        parse_pods(&body, &c.statefulset, c.max_pods).map_err(|reason| KubeError::Malformed { method: Method::GET, path, reason })
    }

    /// Runs one request on the client's runtime and waits for it, at most
    /// the deadline (the request enforces it too; this bounds the wait
    /// should the runtime itself be stuck).
    fn call(&self, method: Method, path: String, body: Option<Vec<u8>>) -> Result<Bytes, KubeError> {
        let timeout = self.inner.cfg.timeout;
        let inner = Arc::clone(&self.inner);
        let (m, p) = (method.clone(), path.clone());
        let request = async move {
            match tokio::time::timeout(timeout, inner.request(m.clone(), &p, body)).await {
                Ok(r) => r,
                Err(_) => Err(KubeError::Timeout { method: m, path: p, timeout }),
            }
        };
        self.block_on(request).unwrap_or(Err(KubeError::Timeout { method, path, timeout }))
    }

    fn block_on<T: Send + 'static>(&self, fut: impl Future<Output = T> + Send + 'static) -> Option<T> {
        let runtime = self.runtime.as_ref()?;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let task = runtime.spawn(async move {
            // The receiver only goes away once it gave up waiting.
            let _ = tx.send(fut.await);
        });
        let answer = rx.recv_timeout(self.inner.cfg.timeout + StdDuration::from_secs(1)).ok();
        if answer.is_none() {
            task.abort();
        }
        answer
    }
}

impl Drop for KubeClient {
    fn drop(&mut self) {
        // Not a blocking shutdown: the client may be dropped inside an
        // async runtime, where waiting for a runtime's threads panics.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Inner {
    async fn request(&self, method: Method, path: &str, body: Option<Vec<u8>>) -> Result<Bytes, KubeError> {
        let connect_err = |source| KubeError::Connect { method: method.clone(), path: path.to_string(), source };
        let http_err = |source| KubeError::Http { method: method.clone(), path: path.to_string(), source };
        let mut token = HeaderValue::from_bytes(&bearer(&self.cfg.token_path)?)
            .map_err(|_| KubeError::Config(format!("the token in {} is not a header value", self.cfg.token_path.display())))?;
        token.set_sensitive(true);
        let tcp = tokio::net::TcpStream::connect((self.cfg.host.as_str(), self.cfg.port)).await.map_err(connect_err)?;
        tcp.set_nodelay(true).map_err(connect_err)?;
        let tls = self.tls.connect(self.server_name.clone(), tcp).await.map_err(connect_err)?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.map_err(http_err)?;
        let conn = tokio::spawn(conn);
        let mut request = Request::builder()
            .method(method.clone())
            .uri(path)
            .header(HOST, self.authority.clone())
            .header(AUTHORIZATION, token)
            .header(ACCEPT, "application/json")
            .header(USER_AGENT, FIELD_MANAGER);
        if body.is_some() {
            request = request.header(CONTENT_TYPE, "application/merge-patch+json");
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| KubeError::Config(format!("request {path}: {e}")))?;
        let answer = sender.send_request(request).await;
        let result = match answer {
            Ok(response) => {
                let status = response.status();
                match Limited::new(response.into_body(), self.cfg.max_body).collect().await {
                    Ok(b) if status.is_success() => Ok(b.to_bytes()),
                    Ok(b) => Err(KubeError::Status { method: method.clone(), path: path.into(), status: status.as_u16(), message: status_message(&b.to_bytes()) }),
                    Err(e) => Err(match e.downcast::<hyper::Error>() {
                        Ok(e) => http_err(*e),
                        Err(_) => KubeError::TooLarge { method: method.clone(), path: path.into(), limit: self.cfg.max_body },
                    }),
                }
            }
            Err(e) => Err(http_err(e)),
        };
        conn.abort();
        result
    }
}

/// `Bearer <token>` from the token file (trimmed; at most 256 KiB read).
fn bearer(path: &Path) -> Result<Vec<u8>, KubeError> {
    let token = read_bounded(path)?;
    let token = token.trim_ascii();
    if token.is_empty() {
        return Err(KubeError::Config(format!("the token file {} is empty", path.display())));
    }
    Ok([b"Bearer ".as_slice(), token].concat())
}

fn read_bounded(path: &Path) -> Result<Vec<u8>, KubeError> {
    let file_err = |source| KubeError::File { path: path.to_path_buf(), source };
    let mut bytes = Vec::new();
    std::fs::File::open(path).map_err(file_err)?.take(MAX_FILE_BYTES).read_to_end(&mut bytes).map_err(file_err)?;
    Ok(bytes)
}

/// A Kubernetes `Status` object's message, or the start of a body that is
/// not one; control characters replaced, at most 200 characters.
fn status_message(body: &[u8]) -> String {
    #[derive(Deserialize)]
    struct Status {
        #[serde(default)]
        message: String,
    }
    let text = match serde_json::from_slice::<Status>(body) {
        Ok(s) if !s.message.is_empty() => s.message,
        _ => String::from_utf8_lossy(&body[..body.len().min(4 * MAX_MESSAGE_CHARS)]).into_owned(),
    };
    text.chars().take(MAX_MESSAGE_CHARS).map(|c| if c.is_control() { ' ' } else { c }).collect()
}

/// The label selector's query form (RFC 3986 unreserved characters kept).
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn parse_scale(body: &[u8], max_pods: u32) -> Result<Scale, String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Meta {
        resource_version: String,
    }
    #[derive(Deserialize)]
    struct Spec {
        #[serde(default)]
        replicas: i64,
    }
    #[derive(Deserialize)]
    struct ScaleObject {
        kind: String,
        metadata: Meta,
        spec: Spec,
    }
    let s: ScaleObject = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    if s.kind != "Scale" {
        return Err(format!("kind '{}', not Scale", s.kind.chars().take(40).collect::<String>()));
    }
    let replicas = u32::try_from(s.spec.replicas).ok().filter(|&r| r <= max_pods);
    let replicas = replicas.ok_or_else(|| format!("replicas {} outside 0..={max_pods}", s.spec.replicas))?;
    if s.metadata.resource_version.is_empty() || s.metadata.resource_version.len() > 64 {
        return Err("no usable resourceVersion".into());
    }
    Ok(Scale { replicas, resource_version: s.metadata.resource_version })
}

fn parse_pods(body: &[u8], statefulset: &str, max_pods: u32) -> Result<BTreeMap<u32, PodState>, String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Meta {
        name: String,
        #[serde(default)]
        labels: HashMap<String, String>,
        #[serde(default)]
        deletion_timestamp: Option<String>,
    }
    #[derive(Deserialize)]
    struct Condition {
        #[serde(rename = "type")]
        kind: String,
        status: String,
    }
    #[derive(Deserialize, Default)]
    struct Status {
        #[serde(default)]
        conditions: Vec<Condition>,
    }
    #[derive(Deserialize)]
    struct Pod {
        metadata: Meta,
        #[serde(default)]
        status: Status,
    }
    #[derive(Deserialize)]
    struct PodList {
        kind: String,
        items: Vec<Pod>,
    }
    let list: PodList = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    if list.kind != "PodList" {
        return Err(format!("kind '{}', not PodList", list.kind.chars().take(40).collect::<String>()));
    }
    let mut pods = BTreeMap::new();
    for pod in list.items {
        // The index label where the cluster sets it (1.28+), else the
        // name's suffix; a pod of another StatefulSet, or an index past
        // the bound, is not one of ours.
        let index = match pod.metadata.labels.get("apps.kubernetes.io/pod-index") {
            Some(i) => Some(i.as_str()),
            None => pod.metadata.name.strip_prefix(statefulset).and_then(|s| s.strip_prefix('-')),
        };
        let Some(ordinal) = index.and_then(|i| i.parse::<u32>().ok()).filter(|&o| o < max_pods) else {
            continue;
        };
        let ready = pod.status.conditions.iter().any(|c| c.kind == "Ready" && c.status == "True");
        pods.insert(ordinal, PodState { ready, terminating: pod.metadata.deletion_timestamp.is_some() });
    }
    Ok(pods)
}

/// The Kubernetes provider (see the module documentation).
pub struct KubernetesProvider {
    client: KubeClient,
    /// The scale last read or written (None before the first refresh).
    scale: Option<Scale>,
    /// The pods last listed, by ordinal.
    pods: BTreeMap<u32, PodState>,
    /// When each ordinal not yet serving was first asked for or seen.
    joining_since: BTreeMap<u32, Instant>,
    /// The backends the scheduler admitted to matchmaking, where the
    /// controller reports them (None: pod readiness alone decides).
    admitted: Option<BTreeSet<u32>>,
}

impl KubernetesProvider {
    /// A provider over `client`; call [`KubernetesProvider::refresh`]
    /// before the first step.
    pub fn new(client: KubeClient) -> KubernetesProvider {
        KubernetesProvider { client, scale: None, pods: BTreeMap::new(), joining_since: BTreeMap::new(), admitted: None }
    }

    /// The client.
    pub fn client(&self) -> &KubeClient {
        &self.client
    }

    /// The scale last read or written.
    pub fn scale(&self) -> Option<&Scale> {
        self.scale.as_ref()
    }

    /// Reads the scale and the pods at `now`. On an error the last view is
    /// kept ([`ScaleProvider::members`] cannot fail), and the caller should
    /// skip acting on it.
    pub fn refresh(&mut self, now: Instant) -> Result<(), KubeError> {
        let scale = self.client.get_scale()?;
        let pods = self.client.list_pods()?;
        self.pods = pods;
        let ready = |pods: &BTreeMap<u32, PodState>, o: &u32| pods.get(o).is_some_and(|p| p.ready);
        // A pod that was Ready and is not now (restarted) joins anew.
        self.joining_since.retain(|o, _| *o < scale.replicas && !ready(&self.pods, o));
        for ordinal in 0..scale.replicas {
            if !ready(&self.pods, &ordinal) {
                self.joining_since.entry(ordinal).or_insert(now);
            }
        }
        self.scale = Some(scale);
        Ok(())
    }

    /// The backend ids the scheduler has in matchmaking: a Ready pod whose
    /// backend is not among them is still joining. None: readiness alone.
    pub fn set_admitted(&mut self, backends: Option<BTreeSet<u32>>) {
        self.admitted = backends;
    }

    fn phase(&self, ordinal: u32, replicas: u32) -> GpuPhase {
        let pod = self.pods.get(&ordinal);
        if ordinal >= replicas || pod.is_some_and(|p| p.terminating) {
            return GpuPhase::Draining;
        }
        let admitted = self.admitted.as_ref().is_none_or(|a| a.contains(&ordinal));
        if pod.is_some_and(|p| p.ready) && admitted {
            return GpuPhase::Serving;
        }
        let since = self.joining_since.get(&ordinal).copied().unwrap_or(Instant::ZERO);
        GpuPhase::Joining { ready_at: since + self.client.config().join_estimate }
    }

    fn gpus_of(&self, ordinal: u32) -> impl Iterator<Item = GpuId> {
        let per = self.client.config().gpus_per_pod.max(1);
        (0..per).map(move |k| ordinal.saturating_mul(per).saturating_add(k))
    }

    fn set_replicas(&mut self, replicas: u32) -> Result<Scale, ScaleError> {
        let Some(current) = &self.scale else {
            return Err(ScaleError::Provider { provider: "kubernetes", reason: "the scale was never read".into() });
        };
        let scale = self.client.patch_replicas(replicas, &current.resource_version)?;
        if scale.replicas != replicas {
            warn!(asked = replicas, got = scale.replicas, "the API server answered another replica count");
        }
        self.scale = Some(scale.clone());
        Ok(scale)
    }
}

impl ScaleProvider for KubernetesProvider {
    fn add_gpus(&mut self, now: Instant, n: u32) -> Result<Vec<GpuId>, ScaleError> {
        let cfg = self.client.config();
        let (per, max) = (cfg.gpus_per_pod.max(1), cfg.max_pods);
        let from = self.scale.as_ref().map_or(0, |s| s.replicas);
        let pods = n.div_ceil(per);
        if from.saturating_add(pods) > max {
            return Err(ScaleError::NoCapacity { wanted: n, available: max.saturating_sub(from).saturating_mul(per) });
        }
        let to = self.set_replicas(from + pods)?.replicas;
        let mut added = Vec::new();
        for ordinal in from..to {
            self.joining_since.insert(ordinal, now);
            added.extend(self.gpus_of(ordinal));
        }
        Ok(added)
    }

    fn drain_gpus(&mut self, _now: Instant, gpus: &[GpuId]) -> Result<(), ScaleError> {
        let per = self.client.config().gpus_per_pod.max(1);
        let replicas = self.scale.as_ref().map_or(0, |s| s.replicas);
        let mut named: BTreeMap<u32, u32> = BTreeMap::new();
        for &gpu in gpus {
            if self.phase(gpu / per, replicas) != GpuPhase::Serving {
                return Err(ScaleError::NotServing { gpu });
            }
            *named.entry(gpu / per).or_default() += 1;
        }
        // A pod leaves whole: only pods all of whose GPUs were named count.
        let whole = named.values().filter(|&&k| k >= per).count() as u32;
        if whole == 0 {
            return Ok(());
        }
        let to = replicas.saturating_sub(whole);
        let top: Vec<u32> = (to..replicas).collect();
        if named.keys().rev().take(whole as usize).ne(top.iter().rev()) {
            warn!(named = ?named.keys().collect::<Vec<_>>(), draining = ?top, "a StatefulSet removes its highest ordinals: draining those");
        }
        self.set_replicas(to)?;
        Ok(())
    }

    fn members(&self) -> Vec<GpuMember> {
        let replicas = self.scale.as_ref().map_or(0, |s| s.replicas);
        let highest = self.pods.keys().next_back().map_or(0, |&o| o + 1);
        let mut members = Vec::new();
        for ordinal in 0..replicas.max(highest) {
            if ordinal >= replicas && !self.pods.contains_key(&ordinal) {
                continue;
            }
            // Idle until measured: the controller sets each serving GPU's
            // from the scheduler's per-backend busy time.
            let phase = self.phase(ordinal, replicas);
            members.extend(self.gpus_of(ordinal).map(|gpu| GpuMember { gpu, phase, idle_fraction: 1.0 }));
        }
        members
    }
}

impl Provider for KubernetesProvider {
    fn backend_of(&self, gpu: GpuId) -> Option<u32> {
        // A backend's --id is its pod index.
        let ordinal = gpu / self.client.config().gpus_per_pod.max(1);
        let replicas = self.scale.as_ref().map_or(0, |s| s.replicas);
        (ordinal < replicas || self.pods.contains_key(&ordinal)).then_some(ordinal)
    }

    /// Reads the scale and the pods; a Ready pod serves once the scheduler
    /// has its backend in matchmaking (`serving`).
    fn observe(&mut self, now: Instant, serving: &[u32]) -> Result<(), ScaleError> {
        self.refresh(now)?;
        self.set_admitted(Some(serving.iter().copied().collect()));
        Ok(())
    }
}

/// The schedulers' `/metrics` endpoints by name (`HOST:PORT`), resolved
/// again at every scrape: a scheduler pod that restarts comes back with
/// another IP address under the same name.
#[derive(Clone, Debug)]
pub struct ResolvedSchedulerMetrics {
    names: Vec<String>,
}

impl ResolvedSchedulerMetrics {
    /// The endpoints named `names`.
    pub fn new(names: Vec<String>) -> Self {
        ResolvedSchedulerMetrics { names }
    }
}

impl SignalSource for ResolvedSchedulerMetrics {
    fn scrape(&mut self) -> Result<Scrape, SignalError> {
        let mut addrs = Vec::new();
        let mut last_err = std::io::Error::other("no name resolved");
        for name in &self.names {
            match name.to_socket_addrs() {
                Ok(found) => addrs.extend(found),
                Err(e) => last_err = e,
            }
        }
        if addrs.is_empty() {
            return Err(SignalError::Unreachable { addrs: self.names.join(", "), source: last_err });
        }
        SchedulerMetrics::new(addrs).scrape()
    }
}

/// `symphony autoscale`: the autoscale controller for a cluster on
/// Kubernetes (deploy/overlays/autoscale runs it in a pod).
#[derive(clap::Args, Clone, Debug)]
pub struct AutoscaleArgs {
    /// What owns the backends: kubernetes (the backend StatefulSet, through the API server of the
    /// pod's cluster, with the pod's service account).
    #[arg(long, default_value = "kubernetes", value_parser = ["kubernetes"])]
    pub provider: String,
    /// The schedulers' metrics endpoints, HOST:PORT,... (resolved at every scrape; the leader's is
    /// read).
    #[arg(long = "scheduler-metrics", value_delimiter = ',', required = true)]
    pub scheduler_metrics: Vec<String>,
    /// The backends' StatefulSet.
    #[arg(long, default_value = "symphony-backend")]
    pub statefulset: String,
    /// Its namespace (default: the service account's).
    #[arg(long)]
    pub namespace: Option<String>,
    /// GPUs per backend.
    #[arg(long = "gpus-per-backend", default_value_t = 1)]
    pub gpus_per_backend: u32,
    /// The controller's flags.
    #[command(flatten)]
    pub controller: ControllerFlags,
    /// Where the service account's token, ca.crt and namespace are (a pod's own; another for a
    /// test against a fake API server).
    #[arg(long = "service-account-dir", default_value = SERVICE_ACCOUNT_DIR, hide = true)]
    pub service_account_dir: PathBuf,
    /// Prometheus /metrics (and /health) listen address, HOST:PORT (port 0 picks one).
    #[arg(long, default_value = "127.0.0.1:0", value_parser = node_shell::parse_socket_addr)]
    pub metrics: std::net::SocketAddr,
}

/// Why `symphony autoscale` could not run.
#[derive(Debug, thiserror::Error)]
pub enum AutoscaleCmdError {
    /// The in-cluster configuration or the client.
    #[error(transparent)]
    Kube(#[from] KubeError),
    /// A bad option.
    #[error("{0}")]
    Usage(String),
    /// The metrics endpoint or the stop signals.
    #[error("autoscale: {what}: {source}")]
    Setup {
        /// What was being set up.
        what: &'static str,
        /// Why it failed.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// The controller's own counters, on its `/metrics`.
#[derive(Default)]
struct CmdMetrics {
    ticks: Counter,
    added: Counter,
    drained: Counter,
    serving: Gauge,
    joining: Gauge,
    draining: Gauge,
}

impl CmdMetrics {
    fn register(&self, r: &MetricsRegistry) {
        r.register("symphony_autoscale_ticks", "Intervals judged", self.ticks.clone());
        r.register("symphony_autoscale_added_gpus", "GPUs the controller added", self.added.clone());
        r.register("symphony_autoscale_drained_gpus", "GPUs the controller drained", self.drained.clone());
        r.register("symphony_autoscale_serving_gpus", "GPUs serving after the last tick", self.serving.clone());
        r.register("symphony_autoscale_joining_gpus", "GPUs joining after the last tick", self.joining.clone());
        r.register("symphony_autoscale_draining_gpus", "GPUs draining after the last tick", self.draining.clone());
    }

    fn record(&self, tick: &Tick, provider: &KubernetesProvider) {
        self.ticks.inc();
        self.added.inc_by(u64::from(tick.decision.add));
        self.drained.inc_by(tick.decision.drain.len() as u64);
        let members = provider.members();
        let count = |f: fn(&GpuPhase) -> bool| members.iter().filter(|m| f(&m.phase)).count() as i64;
        self.serving.set(count(|p| *p == GpuPhase::Serving));
        self.joining.set(count(|p| matches!(p, GpuPhase::Joining { .. })));
        self.draining.set(count(|p| *p == GpuPhase::Draining));
    }
}

/// Runs `symphony autoscale` until SIGTERM or SIGINT.
pub fn run(args: &AutoscaleArgs) -> Result<(), AutoscaleCmdError> {
    let per = args.gpus_per_backend;
    let mut controller_cfg = args.controller.config(per).map_err(AutoscaleCmdError::Usage)?;
    // Not more often than every 100 ms: each tick reads the API server.
    controller_cfg.interval = controller_cfg.interval.max(Duration::from_millis(100));
    let mut cfg = KubeConfig::in_cluster(&args.service_account_dir, args.namespace.as_deref(), &args.statefulset)?;
    cfg.gpus_per_pod = per;
    cfg.max_pods = args.controller.max_backends;
    let provider = KubernetesProvider::new(KubeClient::new(cfg)?);
    let source = ResolvedSchedulerMetrics::new(args.scheduler_metrics.clone());
    let interval_ms = controller_cfg.interval.as_nanos() / 1_000_000;
    let mut controller = Controller::new(controller_cfg, provider, source);
    let setup = |what| move |e: std::io::Error| AutoscaleCmdError::Setup { what, source: e.into() };
    let registry = Arc::new(MetricsRegistry::new());
    let metrics = CmdMetrics::default();
    metrics.register(&registry);
    let endpoint = MetricsEndpoint::start(args.metrics, registry).map_err(setup("metrics endpoint"))?;
    dataplane::control::install_stop_signals().map_err(|e| AutoscaleCmdError::Setup { what: "stop signals", source: e.into() })?;
    info!(statefulset = %args.statefulset, interval_ms, metrics = %endpoint.addr(), "autoscale: controlling the backend StatefulSet");
    let clock = MonotonicClock::new();
    controller.run(&clock, &dataplane::control::stop_requested, &mut |tick, provider| {
        metrics.record(tick, provider);
        if tick.decision.add > 0 || !tick.decision.drain.is_empty() {
            info!(add = tick.decision.add, drain = ?tick.decision.drain, bad_rate = tick.interval.signals.bad_rate, idle = tick.interval.signals.idle_fraction, "autoscale: acted");
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCALE: &[u8] = br#"{"kind":"Scale","apiVersion":"autoscaling/v1","metadata":{"name":"b","resourceVersion":"42"},"spec":{"replicas":3},"status":{"replicas":3}}"#;

    #[test]
    fn a_scale_object_parses_and_hostile_ones_are_refused() {
        assert_eq!(parse_scale(SCALE, 512), Ok(Scale { replicas: 3, resource_version: "42".into() }));
        // No replicas: a StatefulSet scaled to 0 omits them.
        let zero = br#"{"kind":"Scale","metadata":{"resourceVersion":"1"},"spec":{}}"#;
        assert_eq!(parse_scale(zero, 512).map(|s| s.replicas), Ok(0));
        for bad in [
            &br#"{"kind":"Scale","metadata":{"resourceVersion":"1"},"spec":{"replicas":-1}}"#[..],
            br#"{"kind":"Scale","metadata":{"resourceVersion":"1"},"spec":{"replicas":513}}"#,
            br#"{"kind":"Scale","metadata":{"resourceVersion":"1"},"spec":{"replicas":1e300}}"#,
            br#"{"kind":"Status","metadata":{"resourceVersion":"1"},"spec":{"replicas":1}}"#,
            br#"{"kind":"Scale","metadata":{"resourceVersion":""},"spec":{"replicas":1}}"#,
            br#"{"kind":"Scale","metadata":{},"spec":{"replicas":1}}"#,
            b"\xff\x00garbage",
            b"",
        ] {
            assert!(parse_scale(bad, 512).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn pods_are_keyed_by_ordinal_and_others_ignored() {
        let body = br#"{"kind":"PodList","items":[
            {"metadata":{"name":"b-0","labels":{"apps.kubernetes.io/pod-index":"0"}},"status":{"conditions":[{"type":"Ready","status":"True"}]}},
            {"metadata":{"name":"b-1"},"status":{"conditions":[{"type":"Ready","status":"False"}]}},
            {"metadata":{"name":"b-2","deletionTimestamp":"2026-11-29T07:00:00Z"},"status":{"conditions":[{"type":"Ready","status":"True"}]}},
            {"metadata":{"name":"b-3"}},
            {"metadata":{"name":"other-4"}},
            {"metadata":{"name":"b-99999999999"}},
            {"metadata":{"name":"b-600"}}]}"#;
        let pods = parse_pods(body, "b", 512).unwrap();
        let expect = [(0, true, false), (1, false, false), (2, true, true), (3, false, false)];
        let expect: BTreeMap<u32, PodState> = expect.iter().map(|&(o, ready, terminating)| (o, PodState { ready, terminating })).collect();
        assert_eq!(pods, expect);
        assert!(parse_pods(br#"{"kind":"PodList","items":"no"}"#, "b", 512).is_err());
        assert!(parse_pods(br#"{"kind":"Scale","items":[]}"#, "b", 512).is_err());
    }

    #[test]
    fn a_status_message_is_bounded_and_printable() {
        let conflict = br#"{"kind":"Status","message":"the object has been modified","reason":"Conflict","code":409}"#;
        assert_eq!(status_message(conflict), "the object has been modified");
        let long = vec![b'x'; 10_000];
        assert_eq!(status_message(&long).len(), MAX_MESSAGE_CHARS);
        assert_eq!(status_message(b"a\nb\x07c"), "a b c");
        assert_eq!(percent_encode("app.kubernetes.io/name=b"), "app.kubernetes.io%2Fname%3Db");
    }
}
