//! Per-stage latency accounting over the in-process stack (the real
//! scheduler, frontend and backend nodes): after N requests every stage
//! histogram has N observations and the stages add up to the end-to-end
//! time; `/stats` says what `/metrics` says, field by field.

use bytes::Bytes;
use dataplane::control::metric;
use frontend::metrics::Stage;
use frontend::models::ModelCatalog;
use frontend::service::InferenceService;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use scheduler::zoo::ModelSpec;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::Duration as StdDuration;
use tools::inproc::server::{LocalConfig, LocalServer};

type HttpClient = Client<HttpConnector, Full<Bytes>>;

async fn send(c: &HttpClient, method: Method, addr: SocketAddr, path: &str, body: Vec<u8>) -> (StatusCode, Bytes) {
    let req = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = c.request(req).await.expect("request");
    let status = resp.status();
    (status, resp.into_body().collect().await.expect("body").to_bytes())
}

async fn start() -> LocalServer {
    let models = vec![ModelSpec::linear("resnet", 1.0, 4.0, 100.0).unwrap(), ModelSpec::linear("bert", 0.5, 6.0, 120.0).unwrap()];
    let mut cfg = LocalConfig::new(ModelCatalog::with_default_tensors(&models));
    cfg.cluster.gpus = 2;
    cfg.cluster.timer_slack = dataplane::time::Duration::from_millis(60);
    LocalServer::start(cfg).await.expect("server starts")
}

fn infer_body(n: u64) -> Vec<u8> {
    let v: Vec<f32> = (0..16).map(|i| ((n * 31 + i * 7) % 1000) as f32 - 500.0).collect();
    serde_json::to_vec(&json!({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": v}]})).unwrap()
}

/// Waits (bounded) until every accepted request has its outcome.
async fn quiet(server: &LocalServer) {
    let deadline = std::time::Instant::now() + StdDuration::from_secs(10);
    while !server.service().counters().balanced() && std::time::Instant::now() < deadline {
        tokio::time::sleep(StdDuration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_stage_counts_every_executed_request_and_the_stages_add_up() {
    let server = start().await;
    let (addr, c) = (server.addr(), Client::builder(TokioExecutor::new()).build_http());
    let n = 12u64;
    for i in 0..n {
        let (status, body) = send(&c, Method::POST, addr, "/v2/models/resnet/infer", infer_body(i)).await;
        assert_eq!(status, StatusCode::OK, "{body:?}");
    }
    quiet(&server).await;
    let (stages, (count, total_us)) = server.service().metrics().stage_totals(0);
    assert_eq!(count, n);
    for (st, (c, _)) in Stage::ALL.iter().zip(stages) {
        assert_eq!(c, n, "stage {}", st.as_str());
    }
    let sum: u64 = stages.iter().map(|s| s.1).sum();
    assert_eq!(sum, total_us, "the stages add up to the end-to-end time: {stages:?}");
    // Each request ran on an emulated GPU for l(1) = 5 ms, waited at the
    // scheduler for its plan, and every stage measured on a remote clock
    // fits inside the end-to-end time seen here.
    assert!(stages[Stage::Compute as usize].1 >= n * 4_500, "{stages:?}");
    assert!(stages[Stage::Network as usize].1 > 0, "{stages:?}");
    assert!(stages[Stage::Queue as usize].1 > 0, "the scheduler's stamp reached the frontend: {stages:?}");
    // The same figures are exported.
    let text = String::from_utf8(send(&c, Method::GET, addr, "/metrics", Vec::new()).await.1.to_vec()).unwrap();
    for (st, (c, s)) in Stage::ALL.iter().zip(stages) {
        let name = |f: &str| format!("symphony_stage_duration_us_{f}{{model=\"resnet\",stage=\"{}\"}}", st.as_str());
        assert_eq!(metric(&text, &name("count")), Some(c as f64), "{}", st.as_str());
        assert_eq!(metric(&text, &name("sum")), Some(s as f64), "{}", st.as_str());
    }
    assert_eq!(metric(&text, "symphony_executed_request_duration_us_count{model=\"resnet\"}"), Some(n as f64));
    server.stop().await;
}

/// The statistics extension and `/metrics`, field by field, after N
/// requests (issue 16): counts, durations and batch sizes agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_equal_metrics_field_by_field() {
    let server = start().await;
    let (addr, c) = (server.addr(), Client::builder(TokioExecutor::new()).build_http());
    let n = 8u64;
    for i in 0..n {
        let (status, body) = send(&c, Method::POST, addr, "/v2/models/resnet/infer", infer_body(i)).await;
        assert_eq!(status, StatusCode::OK, "{body:?}");
    }
    quiet(&server).await;
    let stats: Value = serde_json::from_slice(&send(&c, Method::GET, addr, "/v2/models/resnet/stats", Vec::new()).await.1).unwrap();
    let text = String::from_utf8(send(&c, Method::GET, addr, "/metrics", Vec::new()).await.1.to_vec()).unwrap();
    let s = &stats["model_stats"][0];
    let m = |name: &str| metric(&text, &format!("{name}{{model=\"resnet\",version=\"1\"}}")).unwrap_or(-1.0);
    let st = |path: &[&str]| path.iter().fold(s, |v, k| &v[*k]).as_f64().unwrap_or(-2.0);
    assert_eq!(st(&["inference_count"]), m("nv_inference_count"));
    assert_eq!(st(&["inference_count"]), n as f64);
    assert_eq!(st(&["execution_count"]), m("nv_inference_exec_count"));
    assert_eq!(st(&["inference_stats", "success", "count"]), m("nv_inference_request_success"));
    assert_eq!(st(&["inference_stats", "fail", "count"]), m("nv_inference_request_failure"));
    let us = |path: &[&str]| (st(path) / 1_000.0).floor();
    assert_eq!(us(&["inference_stats", "success", "ns"]) + us(&["inference_stats", "fail", "ns"]), m("nv_inference_request_duration_us"));
    assert_eq!(us(&["inference_stats", "queue", "ns"]), m("nv_inference_queue_duration_us"));
    assert_eq!(us(&["inference_stats", "compute_input", "ns"]), m("nv_inference_compute_input_duration_us"));
    assert_eq!(us(&["inference_stats", "compute_infer", "ns"]), m("nv_inference_compute_infer_duration_us"));
    assert_eq!(us(&["inference_stats", "compute_output", "ns"]), m("nv_inference_compute_output_duration_us"));
    let batched: f64 = s["batch_stats"].as_array().map_or(0.0, |b| {
        b.iter().map(|e| e["batch_size"].as_f64().unwrap_or(0.0) * e["compute_infer"]["count"].as_f64().unwrap_or(0.0)).sum()
    });
    assert_eq!(batched, metric(&text, "symphony_batch_size_sum{model=\"resnet\"}").unwrap_or(-1.0));
    assert_eq!(batched, n as f64, "the batch sizes of all executions add up to N");
    server.stop().await;
}
