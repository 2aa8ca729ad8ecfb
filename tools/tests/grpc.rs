//! The real gRPC server (`inference.GRPCInferenceService`) on 127.0.0.1:0
//! over the in-process cluster, driven by a tonic client: metadata, infer
//! with raw and typed contents, the statistics extension (also over HTTP,
//! which must agree with /metrics), and bad input answered with the same
//! errors as over HTTP.

use frontend::grpc::pb;
use frontend::grpc::pb::grpc_inference_service_client::GrpcInferenceServiceClient;
use frontend::models::ModelCatalog;
use frontend::service::InferenceService;
use frontend::tensor::reference_output;
use scheduler::zoo::ModelSpec;
use tonic::transport::Channel;
use tonic::Code;
use tools::inproc::server::{LocalConfig, LocalServer};

/// The admin token the servers of these tests are started with.
const ADMIN_TOKEN: &str = "grpc tests' admin token";

async fn start() -> LocalServer {
    let models = vec![ModelSpec::linear("resnet", 1.0, 4.0, 100.0).unwrap()];
    let mut cfg = LocalConfig::new(ModelCatalog::with_default_tensors(&models));
    cfg.cluster.timer_slack = dataplane::time::Duration::from_millis(60);
    cfg.grpc.max_message = 64 << 10;
    cfg.grpc.admin = frontend::api::AdminCredential::new(ADMIN_TOKEN.as_bytes());
    LocalServer::start(cfg).await.expect("server starts")
}

/// `msg` with the admin credential in its metadata.
fn admin<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut().insert("authorization", format!("Bearer {ADMIN_TOKEN}").parse().unwrap());
    r
}

async fn client(s: &LocalServer) -> GrpcInferenceServiceClient<Channel> {
    GrpcInferenceServiceClient::connect(format!("http://{}", s.grpc_addr()))
        .await
        .expect("connects")
        .max_encoding_message_size(1 << 20)
}

fn values(n: u32) -> Vec<f32> {
    (0..16).map(|i| ((n * 31 + i * 7) % 1000) as f32 - 500.0).collect()
}

fn le(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn request(id: &str) -> pb::ModelInferRequest {
    pb::ModelInferRequest {
        model_name: "resnet".into(),
        id: id.into(),
        inputs: vec![pb::model_infer_request::InferInputTensor {
            name: "INPUT0".into(),
            datatype: "FP32".into(),
            shape: vec![1, 16],
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn expected(v: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; 40];
    reference_output(0, &le(v), &mut out);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_infer_and_statistics_over_grpc() {
    let s = start().await;
    let mut c = client(&s).await;
    assert!(c.server_live(pb::ServerLiveRequest {}).await.unwrap().into_inner().live);
    assert!(c.server_ready(pb::ServerReadyRequest {}).await.unwrap().into_inner().ready);
    let meta = c.server_metadata(pb::ServerMetadataRequest {}).await.unwrap().into_inner();
    assert_eq!(meta.name, "symphony");
    assert!(meta.extensions.iter().any(|e| e == "statistics"));
    let m = c
        .model_metadata(pb::ModelMetadataRequest { name: "resnet".into(), version: String::new() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(m.inputs[0].name, "INPUT0");
    assert_eq!(m.inputs[0].shape, vec![1, 16]);
    assert_eq!(m.outputs[0].datatype, "UINT8");
    let cfg = c
        .model_config(pb::ModelConfigRequest { name: "resnet".into(), version: "1".into() })
        .await
        .unwrap()
        .into_inner()
        .config
        .unwrap();
    assert_eq!(cfg.max_batch_size, 0);
    assert_eq!(cfg.input[0].data_type, pb::DataType::TypeFp32 as i32);
    let ready = c
        .model_ready(pb::ModelReadyRequest { name: "resnet".into(), version: String::new() })
        .await
        .unwrap()
        .into_inner();
    assert!(ready.ready);
    let index = c.repository_index(admin(pb::RepositoryIndexRequest::default())).await.unwrap().into_inner();
    assert_eq!(index.models.len(), 1);

    // Raw and typed contents, both checked against the reference output.
    let n = 10u32;
    for i in 0..n {
        let v = values(i);
        let mut r = request(&format!("r{i}"));
        if i % 2 == 0 {
            r.raw_input_contents = vec![le(&v).into()];
        } else {
            r.inputs[0].contents =
                Some(pb::InferTensorContents { fp32_contents: v.clone(), ..Default::default() });
        }
        let out = c.model_infer(r).await.expect("infer").into_inner();
        assert_eq!(out.id, format!("r{i}"));
        assert_eq!(out.outputs[0].name, "OUTPUT0");
        assert_eq!(out.outputs[0].shape, vec![1, 40]);
        assert_eq!(out.raw_output_contents, vec![expected(&v)]);
    }

    let stats = c
        .model_statistics(pb::ModelStatisticsRequest { name: "resnet".into(), version: String::new() })
        .await
        .unwrap()
        .into_inner();
    let st = &stats.model_stats[0];
    let inf = st.inference_stats.as_ref().unwrap();
    assert_eq!(st.inference_count, u64::from(n));
    assert_eq!(inf.success.as_ref().unwrap().count, u64::from(n));
    assert_eq!(inf.fail.as_ref().unwrap().count, 0);
    assert!(inf.success.as_ref().unwrap().ns > 0);
    assert!(st.last_inference > 0);
    // In process every batch is recorded: executed requests = successes.
    assert_eq!(inf.queue.as_ref().unwrap().count, u64::from(n));
    assert!(st.execution_count >= 1);
    let executions: u64 = st.batch_stats.iter().map(|b| b.compute_infer.as_ref().unwrap().count).sum();
    assert_eq!(executions, st.execution_count);
    // The same counters as /metrics.
    let text = s.service().metrics().encode();
    assert!(text.contains(&format!("nv_inference_request_success{{model=\"resnet\",version=\"1\"}} {n}")));
    assert!(text.contains(&format!("nv_inference_exec_count{{model=\"resnet\",version=\"1\"}} {}", st.execution_count)));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_the_http_errors_as_grpc_codes() {
    let s = start().await;
    let mut c = client(&s).await;
    let good = || {
        let mut r = request("x");
        r.raw_input_contents = vec![le(&values(1)).into()];
        r
    };
    let mut cases: Vec<(&str, pb::ModelInferRequest, Code)> = Vec::new();
    let mut r = good();
    r.model_name = "nope".into();
    cases.push(("unknown model", r, Code::NotFound));
    let mut r = good();
    r.model_version = "7".into();
    cases.push(("unknown version", r, Code::NotFound));
    let mut r = good();
    r.inputs[0].shape = vec![2, 8];
    cases.push(("wrong shape", r, Code::InvalidArgument));
    let mut r = good();
    r.inputs[0].datatype = "INT32".into();
    cases.push(("wrong type", r, Code::InvalidArgument));
    let mut r = good();
    r.raw_input_contents = vec![vec![0u8; 63].into()];
    cases.push(("wrong size", r, Code::InvalidArgument));
    let mut r = good();
    r.raw_input_contents = vec![vec![0u8; 100 << 10].into()];
    cases.push(("oversize message", r, Code::OutOfRange));
    for (what, req, code) in cases {
        let e = c.model_infer(req).await.expect_err(what);
        // tonic reports an oversize message as RESOURCE_EXHAUSTED or OUT_OF_RANGE.
        let ok = e.code() == code
            || (code == Code::OutOfRange && e.code() == Code::ResourceExhausted);
        assert!(ok, "{what}: {e:?}");
        assert!(!e.message().is_empty(), "{what}");
    }
    let e = c
        .model_statistics(pb::ModelStatisticsRequest { name: "nope".into(), version: String::new() })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let e = c
        .repository_model_load(admin(pb::RepositoryModelLoadRequest { model_name: "nope".into(), ..Default::default() }))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    // The server still serves.
    let out = c.model_infer(good()).await.expect("still serving").into_inner();
    assert_eq!(out.raw_output_contents, vec![expected(&values(1))]);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unload_refuses_new_requests_and_load_serves_again() {
    let s = start().await;
    let mut c = client(&s).await;
    let good = || {
        let mut r = request("x");
        r.raw_input_contents = vec![le(&values(2)).into()];
        r
    };
    let ready = |c: &mut GrpcInferenceServiceClient<Channel>| {
        let mut c = c.clone();
        async move {
            c.model_ready(pb::ModelReadyRequest { name: "resnet".into(), version: String::new() })
                .await
                .unwrap()
                .into_inner()
                .ready
        }
    };
    c.model_infer(good()).await.expect("loaded at start");
    // Without the admin credential, or with a wrong one, nothing changes.
    let unload = || pb::RepositoryModelUnloadRequest { model_name: "resnet".into(), ..Default::default() };
    let e = c.repository_model_unload(unload()).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    let mut wrong = tonic::Request::new(unload());
    wrong.metadata_mut().insert("authorization", "Bearer grpc tests' admin tokeN".parse().unwrap());
    assert_eq!(c.repository_model_unload(wrong).await.unwrap_err().code(), Code::Unauthenticated);
    assert_eq!(c.repository_index(pb::RepositoryIndexRequest::default()).await.unwrap_err().code(), Code::Unauthenticated);
    assert!(ready(&mut c).await);
    c.repository_model_unload(admin(unload()))
        .await
        .expect("unloads");
    assert!(!ready(&mut c).await);
    let e = c.model_infer(good()).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(e.message().contains("unloaded"), "{e:?}");
    let index = c.repository_index(admin(pb::RepositoryIndexRequest::default())).await.unwrap().into_inner();
    assert_eq!(index.models[0].state, "UNAVAILABLE");
    let ready_only = c
        .repository_index(admin(pb::RepositoryIndexRequest { ready: true, ..Default::default() }))
        .await
        .unwrap()
        .into_inner();
    assert!(ready_only.models.is_empty());
    c.repository_model_load(admin(pb::RepositoryModelLoadRequest { model_name: "resnet".into(), ..Default::default() }))
        .await
        .expect("loads");
    assert!(ready(&mut c).await);
    let out = c.model_infer(good()).await.expect("serves again").into_inner();
    assert_eq!(out.raw_output_contents, vec![expected(&values(2))]);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_protobuf_is_refused_and_the_server_keeps_serving() {
    let s = start().await;
    // A raw HTTP/2 gRPC call with a body that is not a ModelInferRequest.
    let channel = Channel::from_shared(format!("http://{}", s.grpc_addr())).unwrap().connect().await.unwrap();
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.unwrap();
    let path = http::uri::PathAndQuery::from_static("/inference.GRPCInferenceService/ModelInfer");
    let codec = RawCodec;
    let r: Result<tonic::Response<Vec<u8>>, tonic::Status> = grpc
        .unary(tonic::Request::new(vec![0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f, 1, 2]), path, codec)
        .await;
    let e = r.expect_err("malformed protobuf is refused");
    assert!(matches!(e.code(), Code::Internal | Code::InvalidArgument), "{e:?}");
    let mut c = GrpcInferenceServiceClient::new(channel);
    assert!(c.server_live(pb::ServerLiveRequest {}).await.unwrap().into_inner().live);
    s.stop().await;
}

/// Sends and receives raw message bytes (for malformed requests).
#[derive(Clone, Copy, Debug, Default)]
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }
    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), tonic::Status> {
        use bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        use bytes::Buf;
        let mut v = vec![0u8; src.remaining()];
        src.copy_to_slice(&mut v);
        Ok(Some(v))
    }
}

/// TLS (off by default): with a certificate and key, HTTP and gRPC both
/// answer over TLS only, verified against the self-signed test certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_on_http_and_grpc_with_a_self_signed_certificate() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tls");
    let id = frontend::tls::TlsIdentity::from_files(&dir.join("cert.pem"), &dir.join("key.pem"))
        .expect("test certificate loads");
    let models = vec![ModelSpec::linear("resnet", 1.0, 4.0, 100.0).unwrap()];
    let mut cfg = LocalConfig::new(ModelCatalog::with_default_tensors(&models));
    cfg.cluster.timer_slack = dataplane::time::Duration::from_millis(60);
    cfg.tls = Some(id.clone());
    let s = LocalServer::start(cfg).await.expect("server starts");

    // gRPC over TLS, with the certificate as the only root.
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(&id.cert_pem))
        .domain_name("localhost");
    let channel = Channel::from_shared(format!("https://{}", s.grpc_addr()))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .expect("TLS gRPC connects");
    let mut c = GrpcInferenceServiceClient::new(channel);
    let mut r = request("tls");
    r.raw_input_contents = vec![le(&values(5)).into()];
    let out = c.model_infer(r).await.expect("infer over TLS").into_inner();
    assert_eq!(out.raw_output_contents, vec![expected(&values(5))]);
    // Plain text to the TLS port fails.
    let plain = GrpcInferenceServiceClient::connect(format!("http://{}", s.grpc_addr())).await;
    if let Ok(mut p) = plain {
        assert!(p.server_live(pb::ServerLiveRequest {}).await.is_err());
    }

    // HTTPS.
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&id.cert_pem) {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let client_cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(client_cfg));
    let tcp = tokio::net::TcpStream::connect(s.addr()).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls_stream = connector.connect(name, tcp).await.expect("TLS HTTP handshake");
    tls_stream
        .write_all(b"GET /v2/health/live HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut reply = Vec::new();
    let _ = tls_stream.read_to_end(&mut reply).await;
    let text = String::from_utf8_lossy(&reply);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    s.stop().await;
}

fn int_param(v: i64) -> pb::InferParameter {
    pb::InferParameter { parameter_choice: Some(pb::infer_parameter::ParameterChoice::Int64Param(v)) }
}

/// `resnet` and a `patient` model (l(1) = 40 ms, SLO 5 s) that holds a
/// request for seconds, with `slots` staging slots.
async fn start_patient(slots: u32) -> LocalServer {
    let models = vec![
        ModelSpec::linear("resnet", 1.0, 4.0, 100.0).unwrap(),
        ModelSpec::linear("patient", 1.0, 39.0, 5000.0).unwrap(),
    ];
    let mut cfg = LocalConfig::new(ModelCatalog::with_default_tensors(&models));
    cfg.cluster.timer_slack = dataplane::time::Duration::from_millis(60);
    cfg.slots = slots;
    LocalServer::start(cfg).await.expect("server starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_timeout_overload_and_cancel_map_to_grpc_codes() {
    let s = start_patient(1).await;
    let mut c = client(&s).await;
    let with = |model: &str, params: &[(&str, pb::InferParameter)]| {
        let mut r = request("p");
        r.model_name = model.into();
        r.raw_input_contents = vec![le(&values(5)).into()];
        r.parameters = params.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        r
    };
    // Accepted priorities (int64 and uint64), refused bad ones by name.
    let uint = pb::InferParameter { parameter_choice: Some(pb::infer_parameter::ParameterChoice::Uint64Param(2)) };
    for p in [int_param(1), int_param(0), uint] {
        let out = c.model_infer(with("resnet", &[("priority", p)])).await.expect("priority accepted");
        assert_eq!(out.into_inner().raw_output_contents, vec![expected(&values(5))]);
    }
    let text = pb::InferParameter { parameter_choice: Some(pb::infer_parameter::ParameterChoice::StringParam("high".into())) };
    for (k, p) in [("priority", int_param(-1)), ("priority", text), ("timeout", int_param(-3))] {
        let e = c.model_infer(with("resnet", &[(k, p)])).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains(k), "{e:?}");
    }
    // A 20 ms timeout under the 5 s SLO of a 40 ms model: DEADLINE_EXCEEDED.
    let sent = std::time::Instant::now();
    let e = c.model_infer(with("patient", &[("timeout", int_param(20_000))])).await.unwrap_err();
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e:?}");
    assert!(e.message().contains("timeout"), "{e:?}");
    assert!(sent.elapsed() <= std::time::Duration::from_millis(70), "{:?}", sent.elapsed());
    // One held request fills the one slot: the next is refused at once.
    let mut holder = c.clone();
    let held = tokio::spawn(async move { holder.model_infer(with("patient", &[])).await });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while s.service().counters().accepted < 5 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let e = c.model_infer(with("resnet", &[])).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(e.message().contains("overloaded"), "{e:?}");
    // The client cancels the held call: the request is cancelled and its
    // slot comes back long before the model's 5 s deadline.
    held.abort();
    let _ = held.await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    let staging = s.service().staging().clone();
    while (staging.free_slots() != staging.capacity() || !s.service().counters().balanced())
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let q = s.service().counters();
    assert!(q.balanced() && q.cancelled == 1, "{q:?}");
    assert_eq!(staging.free_slots(), staging.capacity(), "{q:?}");
    c.model_infer(with("resnet", &[])).await.expect("served again");
    s.stop().await;
}

/// ModelStreamInfer: every request on the stream is answered on it, tagged
/// with its id, good ones with their reference output and a bad one with
/// the unary call's error text while the stream goes on; the accounting is
/// the unary path's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_infer_answers_each_request_and_a_bad_one_does_not_end_the_stream() {
    let s = start().await;
    let mut c = client(&s).await;
    let n = 8u32;
    let mut reqs: Vec<pb::ModelInferRequest> = (0..n)
        .map(|i| {
            let mut r = request(&format!("s{i}"));
            r.raw_input_contents = vec![le(&values(i)).into()];
            r
        })
        .collect();
    // One with the wrong shape, in the middle of the stream.
    let mut bad = request("bad");
    bad.inputs[0].shape = vec![1, 15];
    bad.raw_input_contents = vec![le(&values(0)[..15]).into()];
    reqs.insert(3, bad.clone());
    let unary = c.model_infer(bad).await.expect_err("the unary call refuses it");
    let outbound = tokio_stream::iter(reqs);
    let mut inbound = c.model_stream_infer(outbound).await.expect("stream opens").into_inner();
    let mut seen = std::collections::BTreeMap::new();
    while let Some(msg) = inbound.message().await.expect("stream stays healthy") {
        let r = msg.infer_response.expect("every answer names its request");
        assert!(seen.insert(r.id.clone(), (msg.error_message, r.raw_output_contents)).is_none(), "answered twice: {}", r.id);
    }
    assert_eq!(seen.len(), n as usize + 1, "{seen:?}");
    let (err, out) = &seen["bad"];
    assert_eq!(err, unary.message(), "the stream reports the unary call's error");
    assert!(out.is_empty());
    for i in 0..n {
        let (err, out) = &seen[&format!("s{i}")];
        assert!(err.is_empty(), "s{i}: {err}");
        assert_eq!(out, &vec![expected(&values(i))], "s{i}");
    }
    let q = s.service().counters();
    assert_eq!((q.accepted, q.succeeded), (u64::from(n), u64::from(n)), "{q:?}");
    s.stop().await;
}
