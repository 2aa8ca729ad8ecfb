//! Model control under load (issue 16): load/unload cycles while other
//! clients keep the cluster busy and requests of the cycled model are in
//! flight leave no staging slot, queue entry, task id or `/dev/shm` file
//! behind. The acceptance's 100 cycles by default (about 3 s);
//! `SYMPHONY_CONTROL_CYCLES=N` runs another count.

use bytes::Bytes;
use frontend::models::ModelCatalog;
use frontend::service::InferenceService;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use scheduler::zoo::ModelSpec;
use serde_json::json;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration as StdDuration, Instant as StdInstant};
use tools::inproc::server::{LocalConfig, LocalServer};

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// The admin token these tests' servers are started with (model control
/// needs it, issue 55).
const ADMIN_TOKEN: &str = "model control tests' admin token";

fn with_admin(mut cfg: LocalConfig) -> LocalConfig {
    cfg.http.admin = frontend::api::AdminCredential::new(ADMIN_TOKEN.as_bytes());
    cfg
}

/// POSTs `body` to `path` with the admin credential.
async fn post(c: &HttpClient, addr: SocketAddr, path: &str, body: Vec<u8>) -> StatusCode {
    post_as(c, addr, path, body, Some(ADMIN_TOKEN)).await
}

async fn post_as(c: &HttpClient, addr: SocketAddr, path: &str, body: Vec<u8>, token: Option<&str>) -> StatusCode {
    let mut req = Request::builder()
        .method(Method::POST)
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/json");
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let req = req.body(Full::new(Bytes::from(body))).unwrap();
    let resp = c.request(req).await.expect("request");
    let status = resp.status();
    let _ = resp.into_body().collect().await;
    status
}

fn infer_body() -> Vec<u8> {
    let v: Vec<f32> = (0..16).map(|i| i as f32).collect();
    serde_json::to_vec(&json!({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": v}]})).unwrap()
}

/// Shared-memory files this process owns (`symphony-<pid>-..`), in the private
/// shm directory where they are made (dataplane::mem::shm_dir) and in /dev/shm.
fn my_shm_files() -> usize {
    let prefix = format!("symphony-{}-", std::process::id());
    let private = dataplane::mem::shm_dir().expect("the private shm directory").to_path_buf();
    [private, std::path::PathBuf::from("/dev/shm")]
        .iter()
        .map(|dir| std::fs::read_dir(dir).map_or(0, |rd| rd.flatten().filter(|e| e.file_name().to_string_lossy().starts_with(&prefix)).count()))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_unload_cycles_under_load_leave_nothing_behind() {
    let cycles: u32 = std::env::var("SYMPHONY_CONTROL_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(100);
    let models = vec![ModelSpec::linear("cycled", 0.5, 2.0, 100.0).unwrap(), ModelSpec::linear("steady", 0.5, 2.0, 100.0).unwrap()];
    let mut cfg = LocalConfig::new(ModelCatalog::with_default_tensors(&models));
    cfg.cluster.gpus = 2;
    cfg.cluster.timer_slack = dataplane::time::Duration::from_millis(60);
    let server = LocalServer::start(with_admin(cfg)).await.expect("server starts");
    let (addr, c): (SocketAddr, HttpClient) = (server.addr(), Client::builder(TokioExecutor::new()).build_http());
    let shm_before = my_shm_files();
    // Load: a steady client of the other model all along.
    let stop = Arc::new(AtomicBool::new(false));
    let steady_ok = Arc::new(AtomicU64::new(0));
    let load = {
        let (stop, ok, c) = (stop.clone(), steady_ok.clone(), c.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if post(&c, addr, "/v2/models/steady/infer", infer_body()).await == StatusCode::OK {
                    ok.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    let started = StdInstant::now();
    for _ in 0..cycles {
        // A request of the cycled model in flight across its unload.
        let in_flight = {
            let c = c.clone();
            tokio::spawn(async move { post(&c, addr, "/v2/models/cycled/infer", infer_body()).await })
        };
        assert_eq!(post(&c, addr, "/v2/repository/models/cycled/unload", Vec::new()).await, StatusCode::OK);
        let refused = post(&c, addr, "/v2/models/cycled/infer", infer_body()).await;
        assert!(refused.is_client_error() || refused.is_server_error(), "an unloaded model answered {refused}");
        assert_eq!(post(&c, addr, "/v2/repository/models/cycled/load", Vec::new()).await, StatusCode::OK);
        let early = in_flight.await.unwrap();
        // It raced the unload: served, or refused as the unloaded model's
        // (400/404/503), never an internal error.
        assert!(early == StatusCode::OK || early.is_client_error() || early == StatusCode::SERVICE_UNAVAILABLE, "in flight across the unload: {early}");
    }
    assert_eq!(post(&c, addr, "/v2/models/cycled/infer", infer_body()).await, StatusCode::OK);
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    eprintln!("{cycles} cycles in {:?}; steady client: {} successes", started.elapsed(), steady_ok.load(Ordering::Relaxed));
    assert!(steady_ok.load(Ordering::Relaxed) > 0, "the steady client was served");
    let svc = server.service().clone();
    let staging = svc.staging().clone();
    let deadline = StdInstant::now() + StdDuration::from_secs(10);
    while !(svc.counters().balanced() && staging.free_slots() == staging.capacity()) && StdInstant::now() < deadline {
        tokio::time::sleep(StdDuration::from_millis(5)).await;
    }
    let q = svc.counters();
    assert_eq!(q.accepted, q.succeeded + q.dropped + q.failed + q.cancelled, "{q:?}");
    assert_eq!(staging.free_slots(), staging.capacity(), "no staging slot left behind: {q:?}");
    assert_eq!(my_shm_files(), shm_before, "no /dev/shm file left behind");
    server.stop().await;
}

/// POSTs an inference to `/v2/models/{model}/infer`: the status and the
/// body's text.
async fn infer_text(c: &HttpClient, addr: SocketAddr, model: &str) -> (StatusCode, String) {
    let req = Request::builder()
        .method(Method::POST)
        .uri(format!("http://{addr}/v2/models/{model}/infer"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(infer_body())))
        .unwrap();
    let resp = c.request(req).await.expect("request");
    let status = resp.status();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unloading_answers_the_models_waiting_requests_at_once_and_frees_their_slots() {
    // A 5 s SLO: the deferred scheduler holds these requests for seconds
    // (it defers the batch toward its latest start), so they are still
    // waiting when the model is unloaded; the other model's (1.5 s SLO) is
    // served after it. Two GPUs: with fewer idle GPUs than waiting models
    // deferred serves the most urgent model at once (work conservation),
    // and the other model's request would not wait.
    let models = vec![ModelSpec::linear("patient", 0.5, 2.0, 5000.0).unwrap(), ModelSpec::linear("other", 0.5, 2.0, 1500.0).unwrap()];
    let mut cfg = LocalConfig::new(ModelCatalog::with_default_tensors(&models));
    cfg.cluster.gpus = 2;
    let server = LocalServer::start(with_admin(cfg)).await.expect("server starts");
    let (addr, c): (SocketAddr, HttpClient) = (server.addr(), Client::builder(TokioExecutor::new()).build_http());
    let svc = server.service().clone();
    const WAITING: u64 = 5;
    let waiting: Vec<_> = (0..WAITING)
        .map(|_| {
            let c = c.clone();
            tokio::spawn(async move { infer_text(&c, addr, "patient").await })
        })
        .collect();
    let other = {
        let c = c.clone();
        tokio::spawn(async move { infer_text(&c, addr, "other").await })
    };
    let deadline = StdInstant::now() + StdDuration::from_secs(10);
    while svc.counters().accepted < WAITING + 1 && StdInstant::now() < deadline {
        tokio::time::sleep(StdDuration::from_millis(2)).await;
    }
    assert_eq!(svc.counters().accepted, WAITING + 1, "every request was accepted");
    // Without the admin credential (or with a wrong one) nothing is
    // unloaded and nobody waiting is answered.
    let unload = "/v2/repository/models/patient/unload";
    assert_eq!(post_as(&c, addr, unload, Vec::new(), None).await, StatusCode::UNAUTHORIZED);
    assert_eq!(post_as(&c, addr, unload, Vec::new(), Some("model control tests' admin tokeN")).await, StatusCode::UNAUTHORIZED);
    assert!(svc.model_states().is_loaded(0));
    assert!(waiting.iter().all(|w| !w.is_finished()), "an unauthenticated unload ended a waiting request");
    let unloaded_at = StdInstant::now();
    assert_eq!(post(&c, addr, unload, Vec::new()).await, StatusCode::OK);
    for w in waiting {
        let (status, body) = w.await.unwrap();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert!(body.contains("model 'patient' was unloaded while the request waited"), "{body}");
    }
    let answered_in = unloaded_at.elapsed();
    assert!(answered_in < StdDuration::from_secs(1), "answered {answered_in:?} after the unload, not at once");
    assert!(!other.is_finished(), "the other model's request still waits for its batch");
    let staging = svc.staging().clone();
    let deadline = StdInstant::now() + StdDuration::from_secs(10);
    // A cancelled task's slot is freed once the scheduler can no longer
    // plan it (a READ must never hit a reused slot), so a little later.
    while !(svc.counters().cancelled == WAITING && staging.free_slots() == staging.capacity() - 1) && StdInstant::now() < deadline {
        tokio::time::sleep(StdDuration::from_millis(2)).await;
    }
    let q = svc.counters();
    assert_eq!(q.cancelled, WAITING, "{q:?}");
    assert_eq!(staging.free_slots(), staging.capacity() - 1, "only the other model's request holds a slot: {q:?}");
    let (status, body) = other.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    server.stop().await;
}
