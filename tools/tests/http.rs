//! The real HTTP server on 127.0.0.1:0 over the in-process cluster (a real
//! deferred scheduler on the real clock with emulated GPUs), driven by a
//! real HTTP client.

use bytes::Bytes;
use tools::inproc::server::{LocalConfig, LocalServer};
use frontend::models::ModelCatalog;
use frontend::service::InferenceService;
use frontend::staging::CounterSnapshot;
use frontend::tensor::reference_output;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use scheduler::zoo::ModelSpec;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::Duration as StdDuration;

type HttpClient = Client<HttpConnector, Full<Bytes>>;
/// What, method, path, headers, body, expected status.
type BadCase<'a> = (
    &'a str,
    Method,
    &'a str,
    Vec<(&'a str, String)>,
    Vec<u8>,
    StatusCode,
);

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

struct Reply {
    status: StatusCode,
    headers: hyper::HeaderMap,
    body: Bytes,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

async fn call(
    c: &HttpClient,
    method: Method,
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, String)],
    body: Vec<u8>,
) -> Reply {
    let mut b = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    for (k, v) in headers {
        b = b.header(*k, v);
    }
    let resp = c
        .request(b.body(Full::new(Bytes::from(body))).unwrap())
        .await
        .expect("http request");
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    Reply {
        status,
        headers,
        body,
    }
}

async fn get(c: &HttpClient, addr: SocketAddr, path: &str) -> Reply {
    call(c, Method::GET, addr, path, &[], Vec::new()).await
}

async fn post_json(c: &HttpClient, addr: SocketAddr, path: &str, v: &Value) -> Reply {
    call(
        c,
        Method::POST,
        addr,
        path,
        &[("content-type", "application/json".into())],
        serde_json::to_vec(v).unwrap(),
    )
    .await
}

fn models() -> Vec<ModelSpec> {
    vec![
        // SLOs far above l(1) (5 and 6.5 ms): the test machine has 2 shared
        // cores, timer wakes can be late by milliseconds, and these tests
        // check the protocol and routing, not capacity.
        ModelSpec::linear("resnet", 1.0, 4.0, 100.0).unwrap(),
        ModelSpec::linear("bert", 0.5, 6.0, 120.0).unwrap(),
    ]
}

async fn start(max_body: usize) -> LocalServer {
    let mut cfg = LocalConfig::new(ModelCatalog::with_default_tensors(&models()));
    cfg.http.max_body = max_body;
    cfg.cluster.gpus = 2;
    // Other jobs share the 2 cores: timer wakes have been seen 30 ms late.
    // A 60 ms window still dispatches such a lone request in time.
    cfg.cluster.timer_slack = dataplane::time::Duration::from_millis(60);
    LocalServer::start(cfg).await.expect("server starts")
}

fn values(n: u64) -> Vec<f32> {
    (0..16)
        .map(|i| ((n * 31 + i * 7) % 1000) as f32 - 500.0)
        .collect()
}

/// Model ids of [`models`].
const RESNET: u32 = 0;
const BERT: u32 = 1;

/// The JSON data of the reference output (UINT8 elements) of `values` for `model`.
fn expected(model: u32, values: &[f32]) -> Value {
    let input: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut out = [0u8; 40];
    reference_output(model, &input, &mut out);
    Value::Array(out.iter().map(|&b| json!(b)).collect())
}

fn infer_body(id: &str, v: &[f32]) -> Value {
    json!({"id": id, "inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": v}]})
}

/// Waits (bounded) until every accepted request has its outcome.
async fn quiet(server: &LocalServer) -> CounterSnapshot {
    let deadline = std::time::Instant::now() + StdDuration::from_secs(10);
    loop {
        let c = server.service().counters();
        if c.balanced() || std::time::Instant::now() > deadline {
            return c;
        }
        tokio::time::sleep(StdDuration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_metadata_infer_and_metrics() {
    let s = start(1 << 20).await;
    let (c, a) = (client(), s.addr());
    assert_eq!(get(&c, a, "/v2/health/live").await.status, StatusCode::OK);
    assert_eq!(get(&c, a, "/v2/health/ready").await.status, StatusCode::OK);
    let meta = get(&c, a, "/v2").await.json();
    assert_eq!(meta["name"], "symphony");
    assert!(meta["extensions"]
        .as_array()
        .unwrap()
        .contains(&json!("binary_tensor_data")));
    let m = get(&c, a, "/v2/models/resnet").await;
    assert_eq!(m.status, StatusCode::OK);
    let m = m.json();
    assert_eq!(m["name"], "resnet");
    assert_eq!(m["versions"], json!(["1"]));
    assert_eq!(
        m["inputs"][0],
        json!({"name": "INPUT0", "datatype": "FP32", "shape": [1, 16]})
    );
    assert_eq!(
        m["outputs"][0],
        json!({"name": "OUTPUT0", "datatype": "UINT8", "shape": [1, 40]})
    );
    assert_eq!(get(&c, a, "/v2/models/resnet/versions/1").await.json(), m);
    assert_eq!(
        get(&c, a, "/v2/models/resnet/versions/2").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get(&c, a, "/v2/models/resnet/ready").await.status,
        StatusCode::OK
    );
    assert_eq!(
        get(&c, a, "/v2/models/resnet/versions/1/ready")
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        get(&c, a, "/v2/models/resnet/config").await.json()["max_batch_size"],
        0
    );

    // Flat data.
    let v = values(1);
    let r = post_json(&c, a, "/v2/models/resnet/infer", &infer_body("a-1", &v)).await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    let j = r.json();
    assert_eq!(j["id"], "a-1");
    assert_eq!(j["model_name"], "resnet");
    assert_eq!(j["outputs"][0]["name"], "OUTPUT0");
    assert_eq!(j["outputs"][0]["shape"], json!([1, 40]));
    assert_eq!(j["outputs"][0]["data"], expected(RESNET, &v));
    // Nested data, versioned path, no id.
    let nested: Vec<Vec<f32>> = vec![values(2)];
    let r = post_json(&c, a, "/v2/models/bert/versions/1/infer", &json!({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": nested}]})).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.json().get("id").is_none());
    assert_eq!(r.json()["outputs"][0]["data"], expected(BERT, &values(2)));
    // Binary tensor data in and out.
    let v = values(3);
    let head = serde_json::to_vec(&json!({"id": "bin", "inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": 64}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": true}}]})).unwrap();
    let mut body = head.clone();
    body.extend(v.iter().flat_map(|x| x.to_le_bytes()));
    let r = call(
        &c,
        Method::POST,
        a,
        "/v2/models/resnet/infer",
        &[("inference-header-content-length", head.len().to_string())],
        body,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let hl: usize = r.headers["inference-header-content-length"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let j: Value = serde_json::from_slice(&r.body[..hl]).unwrap();
    assert_eq!(j["id"], "bin");
    assert_eq!(j["outputs"][0]["parameters"]["binary_data_size"], 40);
    let input: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut out = [0u8; 40];
    reference_output(RESNET, &input, &mut out);
    assert_eq!(&r.body[hl..], &out);

    let q = quiet(&s).await;
    assert_eq!((q.accepted, q.succeeded), (3, 3));
    let metrics = String::from_utf8(get(&c, a, "/metrics").await.body.to_vec()).unwrap();
    for needle in [
        "nv_inference_request_success{model=\"resnet\",version=\"1\"} 2",
        "nv_inference_request_success{model=\"bert\",version=\"1\"} 1",
        "nv_inference_exec_count{model=\"resnet\"",
        "nv_inference_request_duration_us",
        "nv_inference_queue_duration_us",
        "nv_inference_compute_infer_duration_us",
        "symphony_batch_size_bucket{le=\"+Inf\",model=\"resnet\"}",
        "symphony_dropped_total{model=\"resnet\",reason=\"deadline_unmeetable\"} 0",
        "symphony_requests_accepted_total 3",
        "symphony_requests_succeeded_total 3",
    ] {
        assert!(metrics.contains(needle), "missing {needle} in\n{metrics}");
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_protocol_errors_while_a_good_client_keeps_succeeding() {
    let s = start(4096).await;
    let a = s.addr();
    let good = tokio::spawn(async move {
        let c = client();
        let mut ok = 0;
        for n in 0..30u64 {
            let v = values(100 + n);
            let r = post_json(
                &c,
                a,
                "/v2/models/bert/infer",
                &infer_body(&format!("good-{n}"), &v),
            )
            .await;
            assert_eq!(
                r.status,
                StatusCode::OK,
                "{}",
                String::from_utf8_lossy(&r.body)
            );
            assert_eq!(r.json()["id"], format!("good-{n}"));
            assert_eq!(r.json()["outputs"][0]["data"], expected(BERT, &v));
            ok += 1;
        }
        ok
    });
    let c = client();
    let p = "/v2/models/resnet/infer";
    let json_ct = || vec![("content-type", "application/json".to_string())];
    let input = |name: &str, shape: Value, dt: &str, data: Value| json!({"inputs": [{"name": name, "shape": shape, "datatype": dt, "data": data}]});
    let cases: Vec<BadCase> = vec![
        (
            "unknown model",
            Method::POST,
            "/v2/models/nope/infer",
            json_ct(),
            serde_json::to_vec(&infer_body("x", &values(0))).unwrap(),
            StatusCode::NOT_FOUND,
        ),
        (
            "unknown model metadata",
            Method::GET,
            "/v2/models/nope",
            vec![],
            vec![],
            StatusCode::NOT_FOUND,
        ),
        (
            "wrong shape",
            Method::POST,
            p,
            json_ct(),
            serde_json::to_vec(&input("INPUT0", json!([2, 8]), "FP32", json!(values(0)))).unwrap(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "data shorter than shape",
            Method::POST,
            p,
            json_ct(),
            serde_json::to_vec(&input("INPUT0", json!([1, 16]), "FP32", json!([1, 2, 3]))).unwrap(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "wrong datatype",
            Method::POST,
            p,
            json_ct(),
            serde_json::to_vec(&input(
                "INPUT0",
                json!([1, 16]),
                "INT32",
                json!(vec![1; 16]),
            ))
            .unwrap(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "unknown datatype",
            Method::POST,
            p,
            json_ct(),
            serde_json::to_vec(&input("INPUT0", json!([1, 16]), "FP33", json!(vec![1; 16])))
                .unwrap(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "non-numeric data",
            Method::POST,
            p,
            json_ct(),
            serde_json::to_vec(&input(
                "INPUT0",
                json!([1, 16]),
                "FP32",
                json!(vec!["a"; 16]),
            ))
            .unwrap(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "wrong input name",
            Method::POST,
            p,
            json_ct(),
            serde_json::to_vec(&input("IN", json!([1, 16]), "FP32", json!(values(0)))).unwrap(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "malformed JSON",
            Method::POST,
            p,
            json_ct(),
            b"{\"inputs\": [".to_vec(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "not JSON at all",
            Method::POST,
            p,
            json_ct(),
            vec![0xff, 0xfe, 0x00],
            StatusCode::BAD_REQUEST,
        ),
        (
            "empty body",
            Method::POST,
            p,
            json_ct(),
            vec![],
            StatusCode::BAD_REQUEST,
        ),
        (
            "oversized body",
            Method::POST,
            p,
            json_ct(),
            vec![b' '; 8192],
            StatusCode::PAYLOAD_TOO_LARGE,
        ),
        (
            "bad header length",
            Method::POST,
            p,
            vec![("inference-header-content-length", "abc".into())],
            b"{}".to_vec(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "header length past body",
            Method::POST,
            p,
            vec![("inference-header-content-length", "99".into())],
            b"{}".to_vec(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "wrong method",
            Method::GET,
            p,
            vec![],
            vec![],
            StatusCode::METHOD_NOT_ALLOWED,
        ),
        (
            "unknown path",
            Method::GET,
            "/v3/whatever",
            vec![],
            vec![],
            StatusCode::NOT_FOUND,
        ),
    ];
    for (what, method, path, headers, body, want) in cases {
        let r = call(&c, method, a, path, &headers, body).await;
        assert_eq!(
            r.status,
            want,
            "{what}: {}",
            String::from_utf8_lossy(&r.body)
        );
        assert!(
            r.json()["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{what}: body {:?}",
            r.body
        );
    }
    // A chunked oversized body (no Content-Length) is cut off at the limit too.
    let chunked_client: Client<HttpConnector, Chunks> =
        Client::builder(TokioExecutor::new()).build_http();
    // The server answers 413 and closes as soon as the limit is passed; the
    // client may still be writing and then sees a broken pipe instead.
    match chunked_client
        .request(
            Request::post(format!("http://{a}{p}"))
                .body(Chunks(16))
                .unwrap(),
        )
        .await
    {
        Ok(resp) => assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE),
        Err(e) => assert!(format!("{e:?}").contains("BodyWrite"), "{e:?}"),
    }

    assert_eq!(good.await.unwrap(), 30);
    let q = quiet(&s).await;
    assert!(q.balanced(), "{q:?}");
    assert_eq!(
        (q.accepted, q.succeeded, q.unroutable, q.duplicates),
        (30, 30, 0, 0)
    );
    s.stop().await;
}

/// A body of `n` 1 KiB chunks with no length (sent chunked).
struct Chunks(u32);

impl hyper::body::Body for Chunks {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        if self.0 == 0 {
            return std::task::Poll::Ready(None);
        }
        self.0 -= 1;
        std::task::Poll::Ready(Some(Ok(hyper::body::Frame::data(Bytes::from(vec![
            b' ';
            1024
        ])))))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_each_get_their_own_output_and_batches_form() {
    let s = start(1 << 20).await;
    let a = s.addr();
    let mut handles = Vec::new();
    for n in 0..200u64 {
        handles.push(tokio::spawn(async move {
            let c = client();
            let (model, id) = if n % 2 == 0 {
                ("resnet", RESNET)
            } else {
                ("bert", BERT)
            };
            let v = values(1000 + n);
            let r = post_json(
                &c,
                a,
                &format!("/v2/models/{model}/infer"),
                &infer_body(&format!("c-{n}"), &v),
            )
            .await;
            (r.status, r.json(), v, n, id)
        }));
    }
    let mut ok = 0;
    for h in handles {
        let (status, j, v, n, id) = h.await.unwrap();
        if status == StatusCode::OK {
            assert_eq!(j["id"], format!("c-{n}"));
            assert_eq!(
                j["outputs"][0]["data"],
                expected(id, &v),
                "request {n} got another request's output"
            );
            ok += 1;
        } else {
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{j}");
        }
    }
    let q = quiet(&s).await;
    assert!(q.balanced(), "{q:?}");
    assert_eq!(q.accepted, 200);
    assert_eq!(q.succeeded, ok);
    // Drops (503) are allowed, misrouted outputs are not; with these SLOs
    // nearly all succeed.
    assert!(ok >= 150, "only {ok} of 200 succeeded: {q:?}");
    let svc = s.service();
    let batches = svc.metrics().exec_count(0) + svc.metrics().exec_count(1);
    assert!(
        batches < ok,
        "a burst of 200 requests should batch: {batches} batches for {ok} results"
    );
    // Issue 16's invariant, from what the backends reported in their
    // completions: success = inferences = N, and the batch sizes of the
    // executions add up to N.
    let text = String::from_utf8(get(&client(), a, "/metrics").await.body.to_vec()).unwrap();
    let sum = |name: &str| dataplane::control::metric_sum(&text, name);
    let n = ok as f64;
    assert_eq!(sum("nv_inference_request_success"), n, "{text}");
    assert_eq!(sum("nv_inference_count"), n);
    assert_eq!(sum("symphony_batch_size_sum"), n);
    assert_eq!(sum("nv_inference_exec_count"), batches as f64);
    assert_eq!(sum("symphony_batch_size_count"), batches as f64);
    for busy in [
        "nv_inference_queue_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_compute_output_duration_us",
    ] {
        assert!(sum(busy) > 0.0, "{busy} is 0 in\n{text}");
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_timeout_cannot_be_met_is_dropped_with_503() {
    let s = start(1 << 20).await;
    let (c, a) = (client(), s.addr());
    // l(1) = 5 ms for resnet; a 1 ms timeout cannot be met.
    let mut body = infer_body("late", &values(7));
    body["parameters"] = json!({"timeout": 1000});
    let r = post_json(&c, a, "/v2/models/resnet/infer", &body).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        r.json()["error"].as_str().unwrap().contains("timeout"),
        "{}",
        r.json()
    );
    let q = quiet(&s).await;
    assert_eq!((q.accepted, q.dropped), (1, 1));
    let metrics = String::from_utf8(get(&c, a, "/metrics").await.body.to_vec()).unwrap();
    assert!(
        metrics
            .contains("symphony_dropped_total{model=\"resnet\",reason=\"timeout\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("nv_inference_request_failure{model=\"resnet\",version=\"1\"} 1"));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_generator_drives_the_server_open_loop() {
    use frontend::loadgen::{run, LoadConfig, LoadModel};
    use scheduler::sim::workload::{Arrival, Popularity, RateSchedule, Workload};
    let s = start(1 << 20).await;
    let cfg = LoadConfig {
        targets: vec![s.addr()],
        models: vec![
            LoadModel::new("resnet", RESNET),
            LoadModel::new("bert", BERT),
        ],
        input_elements: 16,
        output_bytes: 40,
        workload: Workload {
            rate_rps: 200.0,
            arrival: Arrival::Gamma(0.5),
            popularity: Popularity::Zipf(1.0),
            schedule: RateSchedule::parse("0:1,0.5:2").unwrap(),
        },
        duration: dataplane::time::Duration::from_millis(1000),
        max_requests: 400,
        max_in_flight: 256,
        seed: 42,
        timeout_us: None,
        priority_mix: None,
    };
    let r = run(cfg.clone()).await.unwrap();
    assert!(r.balanced(), "{r}");
    assert_eq!((r.wrong_output, r.wrong_id), (0, 0), "{r}");
    assert!(r.sent > 100 && r.ok > 0, "{r}");
    assert_eq!(
        r.client_errors + r.server_errors + r.transport_errors,
        0,
        "{r}"
    );
    let q = quiet(&s).await;
    assert!(q.balanced(), "{q:?}");
    assert_eq!(q.accepted, r.sent);
    let mut remote = cfg;
    remote.targets.push("10.1.2.3:8000".parse().unwrap());
    assert!(
        run(remote).await.is_err(),
        "non-loopback targets are refused"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_hang_up_mid_request_leave_the_counters_balanced() {
    use std::io::Write;
    let s = start(1 << 20).await;
    let a = s.addr();
    for n in 0..20u64 {
        let body = serde_json::to_vec(&infer_body(&format!("gone-{n}"), &values(n))).unwrap();
        // Blocking std socket: a few hundred bytes to loopback.
        let mut stream = std::net::TcpStream::connect(a).unwrap();
        let head = format!("POST /v2/models/resnet/infer HTTP/1.1\r\nhost: {a}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n", body.len());
        stream.write_all(head.as_bytes()).unwrap();
        stream.write_all(&body).unwrap();
        // Hang up without reading the answer.
        drop(stream);
    }
    // A well-behaved client is still served.
    let c = client();
    let v = values(99);
    let r = post_json(&c, a, "/v2/models/resnet/infer", &infer_body("after", &v)).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["outputs"][0]["data"], expected(RESNET, &v));
    let q = quiet(&s).await;
    assert!(q.balanced(), "{q:?}");
    assert!(
        q.accepted >= 1 && q.unroutable == 0 && q.duplicates == 0,
        "{q:?}"
    );
    // Every slot comes back once the orphaned requests' outcomes arrive.
    let deadline = std::time::Instant::now() + StdDuration::from_secs(10);
    let staging = s.service().staging().clone();
    while staging.free_slots() != staging.capacity() && std::time::Instant::now() < deadline {
        tokio::time::sleep(StdDuration::from_millis(5)).await;
    }
    assert_eq!(staging.free_slots(), staging.capacity());
    s.stop().await;
}

/// `/v2/models/{m}[/versions/{v}]/stats` in Triton's shape, from the same
/// counters as `/metrics`: after N successes, success = inference count = N.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statistics_extension_counts_what_metrics_counts() {
    let server = start(1 << 20).await;
    let addr = server.addr();
    let c = client();
    let n = 6u64;
    for i in 0..n {
        let r = post_json(&c, addr, "/v2/models/resnet/infer", &infer_body("s", &values(i))).await;
        assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    }
    let _ = quiet(&server).await;
    for path in ["/v2/models/resnet/stats", "/v2/models/resnet/versions/1/stats"] {
        let r = get(&c, addr, path).await;
        assert_eq!(r.status, StatusCode::OK);
        let v = r.json();
        let s = &v["model_stats"][0];
        assert_eq!(s["name"], "resnet");
        assert_eq!(s["inference_count"], json!(n));
        assert_eq!(s["inference_stats"]["success"]["count"], json!(n));
        assert_eq!(s["inference_stats"]["fail"]["count"], json!(0));
        assert_eq!(s["execution_count"], json!(server.service().metrics().exec_count(RESNET)));
        assert_eq!(s["inference_stats"]["success"]["count"], json!(server.service().metrics().successes(RESNET)));
        assert!(s["inference_stats"]["queue"]["count"].as_u64().unwrap() >= n);
    }
    let all = get(&c, addr, "/v2/models/stats").await.json();
    assert_eq!(all["model_stats"].as_array().map(Vec::len), Some(2));
    assert_eq!(all["model_stats"][1]["inference_count"], json!(0));
    assert_eq!(get(&c, addr, "/v2/models/nope/stats").await.status, StatusCode::NOT_FOUND);
    assert_eq!(get(&c, addr, "/v2/models/resnet/versions/9/stats").await.status, StatusCode::NOT_FOUND);
    server.stop().await;
}

/// A server whose `patient` model (l(1) = 40 ms, SLO 5 s) holds a request
/// for seconds, with `slots` staging slots.
async fn start_patient(slots: u32) -> LocalServer {
    let mut specs = models();
    specs.push(ModelSpec::linear("patient", 1.0, 39.0, 5000.0).unwrap());
    let mut cfg = LocalConfig::new(ModelCatalog::with_default_tensors(&specs));
    cfg.cluster.gpus = 2;
    cfg.cluster.timer_slack = dataplane::time::Duration::from_millis(60);
    cfg.slots = slots;
    LocalServer::start(cfg).await.expect("server starts")
}

/// Waits (bounded) until the server has accepted `n` requests.
async fn accepted(server: &LocalServer, n: u64) {
    let deadline = std::time::Instant::now() + StdDuration::from_secs(10);
    while server.service().counters().accepted < n && std::time::Instant::now() < deadline {
        tokio::time::sleep(StdDuration::from_millis(2)).await;
    }
    assert!(server.service().counters().accepted >= n, "{:?}", server.service().counters());
}

/// Sends an infer request for `model` on a raw connection and returns it
/// unread (dropping it hangs up).
fn raw_infer(a: SocketAddr, model: &str, n: u64) -> std::net::TcpStream {
    use std::io::Write;
    let body = serde_json::to_vec(&infer_body(&format!("raw-{n}"), &values(n))).unwrap();
    let mut stream = std::net::TcpStream::connect(a).unwrap();
    let head = format!("POST /v2/models/{model}/infer HTTP/1.1\r\nhost: {a}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n", body.len());
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(&body).unwrap();
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_and_timeout_parameters_are_accepted_and_bad_values_refused() {
    let s = start(1 << 20).await;
    let (c, a) = (client(), s.addr());
    for (n, params) in [
        json!({"priority": 1}),
        json!({"priority": 0}),
        json!({"priority": 2, "timeout": 80_000}),
        json!({"timeout": 0}),
    ]
    .into_iter()
    .enumerate()
    {
        let v = values(n as u64);
        let mut body = infer_body("p", &v);
        body["parameters"] = params.clone();
        let r = post_json(&c, a, "/v2/models/resnet/infer", &body).await;
        assert_eq!(r.status, StatusCode::OK, "{params}: {}", r.json());
        assert_eq!(r.json()["outputs"][0]["data"], expected(RESNET, &v));
    }
    for (params, name) in [
        (json!({"priority": -1}), "priority"),
        (json!({"priority": "high"}), "priority"),
        (json!({"priority": 1.5}), "priority"),
        (json!({"priority": 1u64 << 33}), "priority"),
        (json!({"timeout": -1}), "timeout"),
        (json!({"timeout": "soon"}), "timeout"),
    ] {
        let mut body = infer_body("bad", &values(1));
        body["parameters"] = params.clone();
        let r = post_json(&c, a, "/v2/models/resnet/infer", &body).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{params}");
        let msg = r.json()["error"].as_str().unwrap_or_default().to_string();
        assert!(msg.contains(name), "{params}: {msg}");
    }
    let q = quiet(&s).await;
    assert_eq!((q.accepted, q.succeeded, q.cancelled), (4, 4, 0), "{q:?}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_timeout_under_a_long_slo_is_answered_timeout_within_it() {
    let s = start_patient(64).await;
    let (c, a) = (client(), s.addr());
    // 20 ms cannot hold the 40 ms model, whose SLO is 5 s.
    let timeout = StdDuration::from_millis(20);
    let mut body = infer_body("hurry", &values(3));
    body["parameters"] = json!({"timeout": timeout.as_micros() as u64});
    // Issue 17: answered by T + 5 ms. Ten requests one after another; the
    // median holds the bound and none is far past it (a shared 2-core
    // machine may preempt any single one).
    const N: usize = 10;
    let mut took = Vec::with_capacity(N);
    for _ in 0..N {
        let sent = std::time::Instant::now();
        let r = post_json(&c, a, "/v2/models/patient/infer", &body).await;
        took.push(sent.elapsed());
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(r.headers.get("retry-after").is_none());
        let msg = r.json()["error"].as_str().unwrap_or_default().to_string();
        assert!(msg.contains("timeout"), "{msg}");
    }
    took.sort();
    assert!(took[N / 2] <= timeout + StdDuration::from_millis(5), "median answer after {:?} (all: {took:?})", took[N / 2]);
    assert!(took[N - 1] <= timeout + StdDuration::from_millis(50), "answered after {:?}", took[N - 1]);
    let q = quiet(&s).await;
    assert_eq!((q.accepted, q.dropped), (N as u64, N as u64), "{q:?}");
    let metrics = String::from_utf8(get(&c, a, "/metrics").await.body.to_vec()).unwrap();
    assert!(
        metrics.contains(&format!("symphony_dropped_total{{model=\"patient\",reason=\"timeout\"}} {N}")),
        "{metrics}"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_is_refused_with_retry_after_and_clients_that_leave_are_cancelled() {
    let s = start_patient(2).await;
    let (c, a) = (client(), s.addr());
    // Two requests the patient model holds for seconds fill both slots.
    let held: Vec<_> = (0..2).map(|n| raw_infer(a, "patient", n)).collect();
    accepted(&s, 2).await;
    let r = post_json(&c, a, "/v2/models/resnet/infer", &infer_body("third", &values(3))).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    let retry: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(retry >= 1);
    let msg = r.json()["error"].as_str().unwrap_or_default().to_string();
    assert!(msg.contains("overloaded"), "{msg}");
    // Their clients hang up: both are cancelled, and the scheduler drops
    // them long before their 5 s deadline, which frees the slots.
    drop(held);
    let q = quiet(&s).await;
    assert!(q.balanced() && q.cancelled >= 1, "{q:?}");
    assert_eq!(q.accepted, q.succeeded + q.dropped + q.failed + q.cancelled, "{q:?}");
    let staging = s.service().staging().clone();
    let deadline = std::time::Instant::now() + StdDuration::from_secs(3);
    while staging.free_slots() != staging.capacity() && std::time::Instant::now() < deadline {
        tokio::time::sleep(StdDuration::from_millis(5)).await;
    }
    assert_eq!(staging.free_slots(), staging.capacity(), "{:?}", s.service().counters());
    let v = values(4);
    let r = post_json(&c, a, "/v2/models/resnet/infer", &infer_body("after", &v)).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["outputs"][0]["data"], expected(RESNET, &v));
    let metrics = String::from_utf8(get(&c, a, "/metrics").await.body.to_vec()).unwrap();
    assert!(metrics.contains("reason=\"cancelled\"} 2"), "{metrics}");
    s.stop().await;
}
