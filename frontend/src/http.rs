//! The KServe v2 / Open Inference Protocol REST server on hyper 1.x.
//!
//! Routes: `GET /v2/health/live`, `GET /v2/health/ready`, `GET /v2`,
//! `GET /v2/models/{m}[/versions/{v}]`, `GET .../ready`, `GET .../config`,
//! `GET .../stats`, `GET /v2/models/stats`, `POST .../infer`,
//! `POST /v2/repository/index`, `POST /v2/repository/models/{m}/load|unload`,
//! `GET /metrics`. The repository routes need the admin credential
//! ([`HttpConfig::admin`], [`api::AdminCredential`]): 403 when none is
//! configured, 401 for a missing or wrong one. Lookup, accounting and
//! errors are the shared [`crate::api`] layer's (the gRPC server's too).
//!
//! Status codes follow Triton's mapping of its error kinds: invalid
//! argument 400, not found 404, unavailable 503, internal 500; plus 413 for
//! a body over [`HttpConfig::max_body`] and 405 for a wrong method. Every
//! error body is `{"error": "..."}`. A request dropped for its deadline,
//! its `timeout` or shutdown, and one with no outcome within its budget
//! plus grace are 503 with the reason in the message; one refused for
//! overload (its model's queue or the staging area full) is 503 with a
//! `Retry-After` header. A client that disconnects mid-request has its
//! request cancelled (hyper drops the handler's future).

use crate::api::{self, ApiError, ErrorKind};
use crate::protocol::{self, BadRequest};
use crate::service::InferenceService;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, AUTHORIZATION, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

/// The `Retry-After` of an overload refusal, seconds: the smallest the
/// header can say (a queue drains within SLOs of milliseconds).
pub const RETRY_AFTER_SECS: u32 = 1;

/// The binary tensor data extension's header.
pub const HEADER_LEN_HEADER: &str = "inference-header-content-length";

/// Server limits.
#[derive(Clone, Copy, Debug)]
pub struct HttpConfig {
    /// Largest request body, bytes (larger: 413).
    pub max_body: usize,
    /// Most connections served at once; more wait in the accept queue.
    pub max_connections: usize,
    /// A client must send its request head within this time.
    pub header_timeout: std::time::Duration,
    /// A client must send its whole request body within this time once the
    /// head is in (else 408 and the connection is closed): a trickled body
    /// holds a connection slot no longer than this.
    pub body_timeout: std::time::Duration,
    /// The admin credential model control and the repository index need
    /// (`None`: they are refused on this port).
    pub admin: Option<api::AdminCredential>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            max_body: 1 << 20,
            max_connections: 1024,
            header_timeout: std::time::Duration::from_secs(10),
            body_timeout: std::time::Duration::from_secs(10),
            admin: None,
        }
    }
}

type Body = Full<Bytes>;

fn respond(status: StatusCode, content_type: &'static str, body: Vec<u8>) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn json(status: StatusCode, v: &serde_json::Value) -> Response<Body> {
    respond(
        status,
        "application/json",
        serde_json::to_vec(v).unwrap_or_default(),
    )
}

fn error(status: StatusCode, msg: &str) -> Response<Body> {
    respond(status, "application/json", protocol::error_body(msg))
}

/// The HTTP status of an error kind (Triton's mapping).
pub fn status_of(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::InvalidArgument => StatusCode::BAD_REQUEST,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Unavailable | ErrorKind::Overloaded | ErrorKind::DeadlineExceeded => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorKind::Unsupported => StatusCode::NOT_IMPLEMENTED,
        ErrorKind::Unauthenticated => StatusCode::UNAUTHORIZED,
        ErrorKind::PermissionDenied => StatusCode::FORBIDDEN,
    }
}

fn api_error(e: &ApiError) -> Response<Body> {
    let mut r = error(status_of(e.kind), &e.message);
    if e.kind == ErrorKind::Overloaded {
        r.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
    }
    if e.kind == ErrorKind::Unauthenticated {
        r.headers_mut()
            .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    r
}

/// The admin check of a repository route (see [`api::check_admin`]): the
/// refusal to send, if any.
fn refused_admin(req: &Request<Incoming>, cfg: &HttpConfig) -> Option<Response<Body>> {
    let presented = req.headers().get(AUTHORIZATION).map(HeaderValue::as_bytes);
    api::check_admin(cfg.admin.as_ref(), presented).err().map(|e| api_error(&e))
}

/// A running server.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    /// One permit per connection slot: all available = no connection open.
    permits: Arc<Semaphore>,
    max_connections: usize,
}

impl Server {
    /// Binds `addr` (e.g. `127.0.0.1:0`) and serves `service` on the current runtime.
    pub async fn start<S: InferenceService>(
        addr: SocketAddr,
        service: Arc<S>,
        cfg: HttpConfig,
    ) -> std::io::Result<Server> {
        Self::start_tls(addr, service, cfg, None).await
    }
    /// [`Server::start`], serving HTTPS with `tls` if given.
    pub async fn start_tls<S: InferenceService>(
        addr: SocketAddr,
        service: Arc<S>,
        cfg: HttpConfig,
        tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
    ) -> std::io::Result<Server> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let (stop, stop_rx) = watch::channel(false);
        let max_connections = cfg.max_connections.max(1);
        let permits = Arc::new(Semaphore::new(max_connections));
        let task = tokio::spawn(accept_loop(
            listener,
            service,
            cfg,
            stop_rx,
            permits.clone(),
            tls.map(tokio_rustls::TlsAcceptor::from),
        ));
        Ok(Server {
            addr,
            stop,
            task,
            permits,
            max_connections,
        })
    }
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
    /// Stops accepting connections (open ones finish their current request).
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
    /// Stops accepting connections, then waits (at most `limit`) until
    /// every open connection has answered its request in progress and
    /// closed. Returns whether they all did.
    pub async fn stop_and_drain(self, limit: std::time::Duration) -> bool {
        let permits = self.permits.clone();
        let all = u32::try_from(self.max_connections).unwrap_or(u32::MAX);
        self.stop().await;
        tokio::time::timeout(limit, permits.acquire_many(all))
            .await
            .is_ok_and(|p| p.is_ok())
    }
}

async fn accept_loop<S: InferenceService>(
    listener: TcpListener,
    service: Arc<S>,
    cfg: HttpConfig,
    mut stop: watch::Receiver<bool>,
    permits: Arc<Semaphore>,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
            _ = stop.changed() => return,
        };
        let (stream, _) = tokio::select! {
            r = listener.accept() => match r {
                Ok(s) => s,
                // Out of file descriptors and the like: keep serving others.
                Err(_) => { tokio::time::sleep(std::time::Duration::from_millis(10)).await; continue; }
            },
            _ = stop.changed() => return,
        };
        let _ = stream.set_nodelay(true);
        let service = service.clone();
        let conn_stop = stop.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                None => serve_connection(stream, service, cfg, conn_stop).await,
                Some(acceptor) => {
                    // A client that never finishes its handshake must not hold a slot.
                    let handshake =
                        tokio::time::timeout(cfg.header_timeout, acceptor.accept(stream));
                    if let Ok(Ok(stream)) = handshake.await {
                        serve_connection(stream, service, cfg, conn_stop).await;
                    }
                }
            }
            drop(permit);
        });
    }
}

/// Serves HTTP/1.1 on one connection (plain or TLS) until it closes or the
/// server stops (then after answering the request in progress).
async fn serve_connection<IO, S>(
    io: IO,
    service: Arc<S>,
    cfg: HttpConfig,
    mut conn_stop: watch::Receiver<bool>,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    S: InferenceService,
{
    let svc = service_fn(move |req| {
        let service = service.clone();
        async move { Ok::<_, std::convert::Infallible>(handle(&*service, req, cfg).await) }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(cfg.header_timeout)
        .serve_connection(TokioIo::new(io), svc);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = conn_stop.changed() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// Handles one request (exposed for in-process use without sockets).
pub async fn handle<S: InferenceService>(
    service: &S,
    req: Request<Incoming>,
    cfg: HttpConfig,
) -> Response<Body> {
    let path = req.uri().path().to_string();
    let segs: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    let method = req.method().clone();
    let get = method == Method::GET || method == Method::HEAD;
    match segs.as_slice() {
        ["v2", "health", "live"] if get => respond(StatusCode::OK, "text/plain", Vec::new()),
        ["v2", "health", "ready"] if get => {
            let s = if service.ready() {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            respond(s, "text/plain", Vec::new())
        }
        ["v2"] if get => json(StatusCode::OK, &protocol::server_metadata()),
        ["v2", "repository", "index"] if method == Method::POST => match refused_admin(&req, &cfg) {
            None => json(
                StatusCode::OK,
                &protocol::repository_index(&api::repository_index(service, false)),
            ),
            Some(refused) => refused,
        },
        ["v2", "repository", "models", name, action @ ("load" | "unload")]
            if method == Method::POST =>
        {
            if let Some(refused) = refused_admin(&req, &cfg) {
                return refused;
            }
            match api::set_loaded(service, name, *action == "load") {
                Ok(()) => respond(StatusCode::OK, "application/json", b"{}".to_vec()),
                Err(e) => api_error(&e),
            }
        }
        ["metrics"] if get => respond(
            StatusCode::OK,
            node_shell::metrics::CONTENT_TYPE,
            service.metrics().encode().into_bytes(),
        ),
        ["v2", "models", "stats"] if get => match api::statistics(service, "", None) {
            Ok(s) => json(StatusCode::OK, &protocol::statistics(&s)),
            Err(e) => api_error(&e),
        },
        ["v2", "models", name, rest @ ..] => {
            let (version, rest) = match rest {
                ["versions", v, rest @ ..] => (Some(*v), rest),
                _ => (None, rest),
            };
            let model = match api::find_model(service, name, version) {
                Ok(m) => m,
                Err(e) => return api_error(&e),
            };
            match (rest, get, method == Method::POST) {
                ([], true, _) => json(StatusCode::OK, &protocol::model_metadata(model)),
                (["ready"], true, _) => {
                    let s = if api::model_ready(service, name, version) {
                        StatusCode::OK
                    } else {
                        StatusCode::SERVICE_UNAVAILABLE
                    };
                    respond(s, "text/plain", Vec::new())
                }
                (["config"], true, _) => json(StatusCode::OK, &protocol::model_config(model)),
                (["stats"], true, _) => match api::statistics(service, name, version) {
                    Ok(s) => json(StatusCode::OK, &protocol::statistics(&s)),
                    Err(e) => api_error(&e),
                },
                (["infer"], _, true) => handle_infer(service, model.id, req, cfg).await,
                ([] | ["ready"] | ["config"] | ["stats"] | ["infer"], _, _) => error(
                    StatusCode::METHOD_NOT_ALLOWED,
                    &format!("method {method} not allowed on {path}"),
                ),
                _ => error(StatusCode::NOT_FOUND, &format!("not found: {path}")),
            }
        }
        _ => error(StatusCode::NOT_FOUND, &format!("not found: {path}")),
    }
}

async fn handle_infer<S: InferenceService>(
    service: &S,
    model_id: u32,
    req: Request<Incoming>,
    cfg: HttpConfig,
) -> Response<Body> {
    let started = std::time::Instant::now();
    let Some(model) = service.catalog().by_id(model_id) else {
        return error(StatusCode::NOT_FOUND, "unknown model");
    };
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > cfg.max_body as u64) {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("request body larger than {} bytes", cfg.max_body),
        );
    }
    let header_len = match req.headers().get(HEADER_LEN_HEADER) {
        None => None,
        Some(v) => match v.to_str().ok().and_then(|s| s.trim().parse::<usize>().ok()) {
            Some(n) => Some(n),
            None => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "Inference-Header-Content-Length is not a byte count",
                )
            }
        },
    };
    // A body already in is collected at the first poll, before the
    // timeout's timer is ever registered: the deadline costs a trickle, not
    // every request.
    let collected = tokio::time::timeout(
        cfg.body_timeout,
        Limited::new(req.into_body(), cfg.max_body).collect(),
    )
    .await;
    let Ok(collected) = collected else {
        let mut r = error(
            StatusCode::REQUEST_TIMEOUT,
            &format!("the request body did not arrive within {:?}", cfg.body_timeout),
        );
        r.headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
        return r;
    };
    let body = match collected {
        Ok(b) => b.to_bytes(),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("request body larger than {} bytes", cfg.max_body),
            );
        }
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("reading the request body: {e}"),
            )
        }
    };
    let parsed = match protocol::parse_infer(&body, header_len, model) {
        Ok(p) => p,
        Err(BadRequest(msg)) => return error(StatusCode::BAD_REQUEST, &msg),
    };
    // The budget runs from the request's arrival (run_infer subtracts the
    // time spent reading and parsing the body).
    let budget = model.spec.slo;
    match api::run_infer(service, model_id, &parsed.input, budget, parsed.options, started).await {
        Ok(out) => {
            let head =
                protocol::infer_response(model, parsed.id.as_deref(), &out, parsed.binary_output);
            if parsed.binary_output {
                let hl = head.len();
                let mut body = head;
                body.extend_from_slice(&out);
                let mut r = respond(StatusCode::OK, "application/octet-stream", body);
                r.headers_mut()
                    .insert(HEADER_LEN_HEADER, HeaderValue::from(hl));
                r
            } else {
                respond(StatusCode::OK, "application/json", head)
            }
        }
        Err(e) => api_error(&e),
    }
}
