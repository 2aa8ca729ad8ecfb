//! The Kubernetes autoscaling provider against a fake API server: a real
//! HTTPS server (hyper over rustls, a throwaway CA made here with rcgen)
//! that checks the bearer token and the paths, serves the StatefulSet's
//! `scale` subresource and its pods, and applies merge patches of the
//! scale with the `resourceVersion` precondition the real one enforces. A
//! controller run scales the StatefulSet out and in; the API's refusals,
//! garbage, oversized bodies and a stalled server come back as clean
//! errors within the deadline.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use bytes::Bytes;
use dataplane::time::{Duration, Instant};
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use scheduler::autoscale::{AutoscaleConfig, GpuPhase, ScaleError, ScaleProvider};
use tokio_rustls::rustls::{self, pki_types::pem::PemObject};
use tools::autoscale::kubernetes::{KubeClient, KubeConfig, KubeError, KubernetesProvider};
use tools::autoscale::{Controller, ControllerConfig, Provider, Scrape, SignalError, SignalSource};

const TOKEN: &str = "test-token";
const SCALE_PATH: &str = "/apis/apps/v1/namespaces/symphony/statefulsets/symphony-backend/scale";
const PATCH_PATH: &str = "/apis/apps/v1/namespaces/symphony/statefulsets/symphony-backend/scale?fieldManager=symphony-autoscale";
const PODS_PATH: &str = "/api/v1/namespaces/symphony/pods?labelSelector=app.kubernetes.io%2Fname%3Dsymphony-backend";

/// How the fake answers.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    /// As the API server does.
    Normal,
    /// 403, as without the RBAC rule.
    Forbidden,
    /// 500 with a body that is not a Status.
    ServerError,
    /// 200 with bytes that are not JSON.
    Garbage,
    /// 200 with a body over the client's bound.
    Huge,
    /// Reads the request, never answers.
    Stall,
}

/// The API server's state: the StatefulSet's replicas and its pods.
struct Fake {
    mode: Mode,
    replicas: u32,
    resource_version: u64,
    /// Pods by ordinal: Ready or not.
    pods: BTreeMap<u32, bool>,
    /// Every request, as `METHOD path`.
    seen: Vec<String>,
    /// Scrapes of the fake scheduler's `/metrics` so far.
    scrapes: u64,
}

impl Fake {
    fn scale(&self) -> String {
        let (rv, n) = (self.resource_version, self.replicas);
        format!(r#"{{"kind":"Scale","apiVersion":"autoscaling/v1","metadata":{{"name":"symphony-backend","namespace":"symphony","resourceVersion":"{rv}"}},"spec":{{"replicas":{n}}},"status":{{"replicas":{n}}}}}"#)
    }

    fn pods(&self) -> String {
        let items: Vec<String> = self
            .pods
            .iter()
            .map(|(o, ready)| {
                let cond = if *ready { "True" } else { "False" };
                format!(r#"{{"metadata":{{"name":"symphony-backend-{o}","labels":{{"apps.kubernetes.io/pod-index":"{o}"}}}},"status":{{"conditions":[{{"type":"Ready","status":"{cond}"}}]}}}}"#)
            })
            .collect();
        format!(r#"{{"kind":"PodList","apiVersion":"v1","items":[{}]}}"#, items.join(","))
    }

    /// A StatefulSet controller's part: pods for the ordinals below
    /// `replicas` (not Ready yet), none above.
    fn set_replicas(&mut self, n: u32) {
        self.replicas = n;
        self.resource_version += 1;
        self.pods.retain(|&o, _| o < n);
        for o in 0..n {
            self.pods.entry(o).or_insert(false);
        }
    }

    /// A scheduler's counters under overload, one interval more at each
    /// scrape: half the tasks dropped, every serving GPU busy. Its
    /// backends in matchmaking are the Ready pods.
    fn scheduler_metrics(&mut self) -> String {
        self.scrapes += 1;
        let n = self.scrapes as f64;
        let serving: Vec<u32> = self.pods.iter().filter(|(_, r)| **r).map(|(o, _)| *o).collect();
        let mut text = format!(
            "symphony_tasks_received_total {}\nsymphony_tasks_dropped_total{{reason=\"deadline\"}} {}\nsymphony_planned_busy_ns_total {}\nsymphony_gpu_online_ns_total {}\n",
            1000.0 * n,
            500.0 * n,
            1e9 * n * serving.len() as f64,
            1e9 * n * serving.len() as f64
        );
        for b in serving {
            text += &format!("symphony_backend_planned_busy_ns{{backend=\"{b}\"}} {}\n", 1e9 * n);
        }
        text
    }

    fn answer(&mut self, method: &hyper::Method, path: &str, auth: Option<&str>, content_type: Option<&str>, body: &[u8]) -> (StatusCode, String) {
        self.seen.push(format!("{method} {path}"));
        let status = |code: StatusCode, reason: &str, message: &str| {
            (code, format!(r#"{{"kind":"Status","apiVersion":"v1","status":"Failure","message":"{message}","reason":"{reason}","code":{}}}"#, code.as_u16()))
        };
        if auth != Some(&format!("Bearer {TOKEN}")) {
            return status(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized");
        }
        match self.mode {
            Mode::Normal | Mode::Stall => {}
            Mode::Forbidden => return status(StatusCode::FORBIDDEN, "Forbidden", "statefulsets.apps \\\"symphony-backend\\\" is forbidden: User cannot patch resource"),
            Mode::ServerError => return (StatusCode::INTERNAL_SERVER_ERROR, "upstream\nexploded\u{7}".into()),
            Mode::Garbage => return (StatusCode::OK, "\u{0}{{not json at all".into()),
            Mode::Huge => return (StatusCode::OK, format!(r#"{{"kind":"Scale","pad":"{}"}}"#, "x".repeat(64 << 10))),
        }
        match (method.as_str(), path) {
            ("GET", SCALE_PATH) => (StatusCode::OK, self.scale()),
            ("GET", PODS_PATH) => (StatusCode::OK, self.pods()),
            ("PATCH", PATCH_PATH) => {
                if content_type != Some("application/merge-patch+json") {
                    return status(StatusCode::UNSUPPORTED_MEDIA_TYPE, "UnsupportedMediaType", "not a merge patch");
                }
                let Ok(patch) = serde_json::from_slice::<serde_json::Value>(body) else {
                    return status(StatusCode::BAD_REQUEST, "BadRequest", "not JSON");
                };
                if let Some(rv) = patch.pointer("/metadata/resourceVersion").and_then(|v| v.as_str()) {
                    if rv != self.resource_version.to_string() {
                        return status(StatusCode::CONFLICT, "Conflict", "the object has been modified; please apply your changes to the latest version and try again");
                    }
                }
                match patch.pointer("/spec/replicas").and_then(|v| v.as_u64()) {
                    Some(n) => {
                        self.set_replicas(n as u32);
                        (StatusCode::OK, self.scale())
                    }
                    None => status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", "no replicas"),
                }
            }
            _ => status(StatusCode::NOT_FOUND, "NotFound", "not found"),
        }
    }
}

/// The fake API server on a loopback port, its CA and token in a
/// temporary directory.
struct ApiServer {
    state: Arc<Mutex<Fake>>,
    port: u16,
    dir: PathBuf,
    _runtime: tokio::runtime::Runtime,
}

impl ApiServer {
    fn start(name: &str, replicas: u32) -> ApiServer {
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let issuer = CertifiedIssuer::self_signed(ca, KeyPair::generate().expect("CA key")).expect("CA");
        let key = KeyPair::generate().expect("server key");
        let cert = CertificateParams::new(vec!["127.0.0.1".to_string()]).expect("params").signed_by(&key, &issuer).expect("server certificate");
        let dir = std::env::temp_dir().join(format!("symphony-kube-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        std::fs::write(dir.join("ca.crt"), issuer.pem()).expect("write CA");
        std::fs::write(dir.join("token"), format!("{TOKEN}\n")).expect("write token");
        let certs = vec![cert.der().clone()];
        let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).expect("key");
        let tls = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("protocols")
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("server TLS");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
        let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let mut fake = Fake { mode: Mode::Normal, replicas: 0, resource_version: 100, pods: BTreeMap::new(), seen: Vec::new(), scrapes: 0 };
        fake.set_replicas(replicas);
        fake.pods.values_mut().for_each(|ready| *ready = true);
        let state = Arc::new(Mutex::new(fake));
        runtime.spawn(serve(listener, acceptor, Arc::clone(&state)));
        ApiServer { state, port, dir, _runtime: runtime }
    }

    fn config(&self) -> KubeConfig {
        let mut cfg = KubeConfig::new("127.0.0.1".into(), self.port, self.dir.join("token"), self.dir.join("ca.crt"), "symphony-backend");
        cfg.timeout = StdDuration::from_millis(500);
        cfg.max_body = 16 << 10;
        cfg.max_pods = 16;
        cfg
    }

    fn provider(&self) -> KubernetesProvider {
        KubernetesProvider::new(KubeClient::new(self.config()).expect("client"))
    }

    fn fake(&self) -> std::sync::MutexGuard<'_, Fake> {
        self.state.lock().expect("fake state")
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn serve(listener: tokio::net::TcpListener, acceptor: tokio_rustls::TlsAcceptor, state: Arc<Mutex<Fake>>) {
    while let Ok((tcp, _)) = listener.accept().await {
        let (acceptor, state) = (acceptor.clone(), Arc::clone(&state));
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else { return };
            let service = hyper::service::service_fn(move |req| handle(Arc::clone(&state), req));
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tls), service).await;
        });
    }
}

async fn handle(state: Arc<Mutex<Fake>>, req: Request<hyper::body::Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let header = |name: hyper::header::HeaderName| parts.headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    let path = parts.uri.path_and_query().map_or("", |p| p.as_str()).to_string();
    let (auth, content_type) = (header(hyper::header::AUTHORIZATION), header(hyper::header::CONTENT_TYPE));
    let (status, text, stall) = {
        let mut fake = state.lock().expect("fake state");
        let (status, text) = fake.answer(&parts.method, &path, auth.as_deref(), content_type.as_deref(), &body);
        (status, text, fake.mode == Mode::Stall)
    };
    if stall {
        std::future::pending::<()>().await;
    }
    Ok(Response::builder().status(status).header("content-type", "application/json").body(Full::new(Bytes::from(text))).expect("response"))
}

/// A fake scheduler's `/metrics` on a loopback port of `api`'s runtime.
fn scheduler_metrics(api: &ApiServer) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = api._runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("bind");
    let addr = listener.local_addr().expect("addr");
    let state = Arc::clone(&api.state);
    api._runtime.spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let text = state.lock().expect("fake").scheduler_metrics();
            tokio::spawn(async move {
                let mut request = [0u8; 1024];
                let _ = s.read(&mut request).await;
                let answer = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}", text.len());
                let _ = s.write_all(answer.as_bytes()).await;
            });
        }
    });
    addr
}

/// A child process killed when dropped (a failed assertion leaves none).
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn symphony_autoscale_scales_the_statefulset_and_stops_on_sigterm() {
    let api = ApiServer::start("binary", 2);
    let metrics = scheduler_metrics(&api);
    let mut child = Child(
        std::process::Command::new(env!("CARGO_BIN_EXE_symphony"))
            .args(["autoscale", "--provider=kubernetes", "--statefulset=symphony-backend", "--namespace=symphony"])
            .args(["--autoscale-interval-ms=200", "--autoscale-max-backends=4", "--metrics=127.0.0.1:0"])
            .arg(format!("--scheduler-metrics={metrics}"))
            .arg(format!("--service-account-dir={}", api.dir.display()))
            .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
            .env("KUBERNETES_SERVICE_PORT", api.port.to_string())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start symphony autoscale"),
    );
    // Its log: the metrics address first, then whatever it says.
    let stderr = child.0.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let started = rx.recv_timeout(StdDuration::from_secs(20)).expect("the controller's first log line");
    let own: std::net::SocketAddr = started.split("metrics=").nth(1).and_then(|s| s.split_whitespace().next()).and_then(|a| a.parse().ok()).unwrap_or_else(|| panic!("no metrics address in '{started}'"));
    // Half the requests bad on 2 GPUs: 2 more, up to the 4 allowed.
    let deadline = std::time::Instant::now() + StdDuration::from_secs(20);
    while api.fake().replicas < 4 {
        assert!(std::time::Instant::now() < deadline, "no scale-out: {:?}", rx.try_iter().collect::<Vec<_>>());
        std::thread::sleep(StdDuration::from_millis(20));
    }
    // The controller counts its action once the patch has been answered
    // and the tick is over, which may be after the fake applied it: wait
    // for the tick's metrics (bounded) rather than reading them at once.
    let deadline = std::time::Instant::now() + StdDuration::from_secs(10);
    let text = loop {
        let text = dataplane::control::http_get(own, "/metrics", StdDuration::from_secs(2)).expect("its /metrics");
        let ticked = dataplane::control::metric(&text, "symphony_autoscale_added_gpus_total") == Some(2.0);
        if ticked || std::time::Instant::now() >= deadline {
            break text;
        }
        std::thread::sleep(StdDuration::from_millis(20));
    };
    assert_eq!(dataplane::control::metric(&text, "symphony_autoscale_added_gpus_total"), Some(2.0), "{text}");
    assert_eq!(dataplane::control::metric(&text, "symphony_autoscale_joining_gpus"), Some(2.0), "{text}");
    // SIGTERM: it stops within an interval and exits 0.
    // SAFETY: kill(2) on our own child's pid, which has not been waited for.
    assert_eq!(unsafe { libc::kill(child.0.id() as libc::pid_t, libc::SIGTERM) }, 0);
    let deadline = std::time::Instant::now() + StdDuration::from_secs(5);
    let status = loop {
        if let Some(status) = child.0.try_wait().expect("wait") {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "still running 5 s after SIGTERM");
        std::thread::sleep(StdDuration::from_millis(20));
    };
    assert!(status.success(), "{status}");
    assert_eq!(api.fake().replicas, 4, "never past --autoscale-max-backends");
}

fn at(s: u64) -> Instant {
    Instant::ZERO + Duration::from_millis(s * 1000)
}

#[test]
fn the_provider_reads_the_scale_and_pods_and_patches_replicas() {
    let api = ApiServer::start("patch", 3);
    let mut p = api.provider();
    p.refresh(at(0)).expect("refresh");
    assert_eq!(p.scale().map(|s| s.replicas), Some(3));
    let phases: Vec<GpuPhase> = p.members().iter().map(|m| m.phase).collect();
    assert_eq!(phases, vec![GpuPhase::Serving; 3]);
    // Two more: ordinals 3 and 4, joining until their pods are Ready and
    // the scheduler has them in matchmaking.
    assert_eq!(p.add_gpus(at(1), 2), Ok(vec![3, 4]));
    assert_eq!(api.fake().replicas, 5);
    p.observe(at(2), &[0, 1, 2]).expect("observe");
    let joining = p.members().iter().filter(|m| matches!(m.phase, GpuPhase::Joining { .. })).count();
    assert_eq!(joining, 2);
    api.fake().pods.values_mut().for_each(|ready| *ready = true);
    p.observe(at(3), &[0, 1, 2, 3]).expect("observe");
    let phase_of = |p: &KubernetesProvider, gpu| p.members().iter().find(|m| m.gpu == gpu).map(|m| m.phase);
    assert_eq!(phase_of(&p, 3), Some(GpuPhase::Serving));
    assert!(matches!(phase_of(&p, 4), Some(GpuPhase::Joining { .. })), "Ready but not in matchmaking yet");
    p.observe(at(4), &[0, 1, 2, 3, 4]).expect("observe");
    // Scale-in drains the highest ordinals whatever GPUs are named: a
    // StatefulSet cannot remove ordinal 0 and keep 4.
    p.drain_gpus(at(5), &[0, 4]).expect("drain");
    assert_eq!(api.fake().replicas, 3);
    assert_eq!(api.fake().pods.keys().copied().collect::<Vec<_>>(), vec![0, 1, 2]);
    // Not serving (gone, or unknown): refused, nothing patched.
    let rv = api.fake().resource_version;
    assert_eq!(p.drain_gpus(at(6), &[4]), Err(ScaleError::NotServing { gpu: 4 }));
    assert_eq!(api.fake().resource_version, rv);
    // The pod index is the backend id.
    assert_eq!((p.backend_of(2), p.backend_of(9)), (Some(2), None));
    // Past max_pods (16): no capacity, nothing patched.
    assert!(matches!(p.add_gpus(at(7), 14), Err(ScaleError::NoCapacity { wanted: 14, available: 13 })));
    let seen = api.fake().seen.clone();
    assert!(seen.iter().all(|r| [SCALE_PATH, PATCH_PATH, PODS_PATH].iter().any(|p| r.ends_with(p))), "{seen:?}");
    assert_eq!(seen.iter().filter(|r| r.starts_with("PATCH")).count(), 2, "{seen:?}");
}

#[test]
fn a_change_made_meanwhile_is_a_conflict_not_overwritten() {
    let api = ApiServer::start("conflict", 2);
    let mut p = api.provider();
    p.refresh(at(0)).expect("refresh");
    // `kubectl scale --replicas=6` between the read and the patch.
    api.fake().set_replicas(6);
    let err = p.add_gpus(at(1), 1).expect_err("stale resourceVersion");
    assert!(matches!(&err, ScaleError::Provider { provider: "kubernetes", reason } if reason.contains("HTTP 409") && reason.contains("has been modified")), "{err}");
    assert_eq!(api.fake().replicas, 6);
    // The next interval reads the new scale and acts on it.
    p.refresh(at(2)).expect("refresh");
    assert_eq!(p.add_gpus(at(2), 1), Ok(vec![6]));
    assert_eq!(api.fake().replicas, 7);
}

#[test]
fn refusals_garbage_and_a_stalled_server_are_clean_errors() {
    let api = ApiServer::start("errors", 2);
    let mut p = api.provider();
    p.refresh(at(0)).expect("refresh");
    type Expected = fn(&KubeError) -> bool;
    // The stall last: it is the one case whose patch is applied.
    let cases: [(Mode, Expected); 5] = [
        (Mode::Forbidden, |e| e.status() == Some(403) && e.to_string().contains("forbidden")),
        (Mode::ServerError, |e| e.status() == Some(500) && e.to_string().contains("upstream exploded ")),
        (Mode::Garbage, |e| matches!(e, KubeError::Malformed { .. })),
        (Mode::Huge, |e| matches!(e, KubeError::TooLarge { limit: 16384, .. })),
        (Mode::Stall, |e| matches!(e, KubeError::Timeout { .. })),
    ];
    for (mode, expected) in cases {
        api.fake().mode = mode;
        let started = std::time::Instant::now();
        let err = p.refresh(at(1)).expect_err("refresh must fail");
        assert!(expected(&err), "{mode:?}: {err:?}");
        // Each within the 500 ms deadline (and the wait's 1 s margin).
        assert!(started.elapsed() < StdDuration::from_millis(1500), "{mode:?} took {:?}", started.elapsed());
        // Through the trait: a ScaleError, and the last view kept.
        let scale_err = p.add_gpus(at(1), 1).expect_err("add must fail");
        assert!(matches!(scale_err, ScaleError::Provider { provider: "kubernetes", .. }), "{mode:?}: {scale_err:?}");
        assert_eq!(p.members().len(), 2, "{mode:?}");
    }
    // The stalled server applied the last patch and never said so: the
    // client cannot know, and the next read shows it.
    api.fake().mode = Mode::Normal;
    assert_eq!(api.fake().replicas, 3, "only the stalled patch was applied");
    p.refresh(at(2)).expect("the API answers again");
    assert_eq!(p.scale().map(|s| s.replicas), Some(3));
}

#[test]
fn a_wrong_token_or_an_untrusted_server_is_refused() {
    let api = ApiServer::start("auth", 1);
    std::fs::write(api.dir.join("token"), "someone-else").expect("token");
    let mut p = api.provider();
    assert_eq!(p.refresh(at(0)).expect_err("401").status(), Some(401));
    // The token is read for every request: a rotated one is used at once.
    std::fs::write(api.dir.join("token"), TOKEN).expect("token");
    p.refresh(at(1)).expect("rotated token");
    // A server whose certificate the CA bundle does not vouch for.
    let other = ApiServer::start("auth-other", 1);
    let mut cfg = api.config();
    cfg.port = other.port;
    let err = KubernetesProvider::new(KubeClient::new(cfg).expect("client")).refresh(at(0)).expect_err("untrusted");
    assert!(matches!(err, KubeError::Connect { .. }), "{err:?}");
    assert!(other.fake().seen.is_empty());
}

/// The scheduler's counters as load on the fake cluster makes them: each
/// interval 10 s, the backends in matchmaking those whose pods are Ready,
/// consolidated on the lowest ids (deferred's lowest free GPU first).
struct ClusterLoad {
    state: Arc<Mutex<Fake>>,
    scrape: Scrape,
    /// Per interval: requests, their bad fraction, and busy GPU-seconds.
    schedule: Vec<(f64, f64, f64)>,
    next: usize,
}

impl SignalSource for ClusterLoad {
    fn scrape(&mut self) -> Result<Scrape, SignalError> {
        let serving: Vec<u32> = self.state.lock().expect("fake").pods.iter().filter(|(_, r)| **r).map(|(o, _)| *o).collect();
        let (tasks, bad, busy_s) = self.schedule.get(self.next).copied().unwrap_or((0.0, 0.0, 0.0));
        self.next += 1;
        let s = &mut self.scrape;
        s.tasks_received += tasks;
        s.tasks_dropped += tasks * bad;
        let busy_s = busy_s.min(10.0 * serving.len() as f64);
        s.planned_busy_ns += busy_s * 1e9;
        s.gpu_online_ns += 10e9 * serving.len() as f64;
        // Consolidated: the lowest ids full, the rest idle.
        let mut left = busy_s;
        s.backends = serving
            .iter()
            .map(|&b| {
                let was = s.backends.iter().find(|&&(id, _)| id == b).map_or(0.0, |&(_, v)| v);
                let mine = left.min(10.0);
                left -= mine;
                (b, was + mine * 1e9)
            })
            .collect();
        Ok(s.clone())
    }
}

#[test]
fn the_controller_scales_the_statefulset_out_and_in() {
    let api = ApiServer::start("controller", 2);
    let cfg = ControllerConfig {
        autoscale: AutoscaleConfig {
            bad_rate_threshold: 0.01,
            headroom: 0.0,
            min_idle: 0.0,
            stabilisation: Duration::ZERO,
            cooldown: Duration::ZERO,
            min_gpus: 1,
            max_gpus: 8,
            max_step: 4,
        },
        interval: Duration::from_millis(10_000),
    };
    // Interval 1: a baseline. 2: overloaded, half the requests bad (2
    // GPUs busy): 2·0.5/0.5 = 2 more. 3: the new pods are not Ready yet.
    // 4-5: they serve, the load fits on 1 GPU: 3 of 4 idle.
    let schedule = vec![(0.0, 0.0, 0.0), (1000.0, 0.5, 20.0), (1000.0, 0.0, 20.0), (500.0, 0.0, 10.0), (500.0, 0.0, 10.0)];
    let load = ClusterLoad { state: Arc::clone(&api.state), scrape: Scrape::default(), schedule, next: 0 };
    let mut c = Controller::new(cfg, api.provider(), load);
    assert_eq!(c.tick(at(0)).expect("tick 1"), None, "the first scrape is the baseline");
    let t = c.tick(at(10)).expect("tick 2").expect("an interval");
    assert_eq!(t.decision.add, 2, "{t:?}");
    assert_eq!(api.fake().replicas, 4);
    let t = c.tick(at(20)).expect("tick 3").expect("an interval");
    assert_eq!((t.decision.add, t.decision.drain.len()), (0, 0), "joining pods count as added: {t:?}");
    // The kubelet: the new pods pass their readiness probes.
    api.fake().pods.values_mut().for_each(|ready| *ready = true);
    let t = c.tick(at(30)).expect("tick 4").expect("an interval");
    // 4 serving, 3/4 idle: 3 drained, the idlest (consolidation left the
    // highest idle), which are the ordinals a StatefulSet removes.
    assert_eq!(t.decision.drain, vec![3, 2, 1], "{t:?}");
    assert_eq!(api.fake().replicas, 1);
    assert_eq!(api.fake().pods.keys().copied().collect::<Vec<_>>(), vec![0]);
    let t = c.tick(at(40)).expect("tick 5").expect("an interval");
    assert_eq!((t.decision.add, t.decision.drain.len()), (0, 0), "at the minimum: {t:?}");
    assert_eq!(api.fake().replicas, 1);
}
