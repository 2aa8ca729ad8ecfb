//! The Open Inference Protocol's JSON bodies: parsing and validating an
//! inference request against a model (JSON tensor data, flat or nested,
//! or the binary tensor data extension), and building the responses.
//! Pure functions over bytes: no I/O, no panics on any input.

use crate::models::ModelEntry;
use crate::staging::RequestOptions;
use crate::tensor::{decode_to_json, encode_json_data, DataType, TensorSpec};
use dataplane::time::Duration;
use serde::Deserialize;
use serde_json::{json, Map, Value};

/// Server name reported by `GET /v2`.
pub const SERVER_NAME: &str = "symphony";
/// Protocol extensions this server implements.
pub const EXTENSIONS: [&str; 4] = [
    "binary_tensor_data",
    "model_repository",
    "statistics",
    "statistics_metrics",
];
/// Longest request `id` echoed back, bytes.
pub const MAX_ID_LEN: usize = 256;

/// A request refused as invalid (HTTP 400), with the message for `{"error": ...}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadRequest(pub String);

fn bad<T>(msg: impl Into<String>) -> Result<T, BadRequest> {
    Err(BadRequest(msg.into()))
}

#[derive(Deserialize)]
struct RequestBody {
    #[serde(default)]
    id: Option<Value>,
    #[serde(default)]
    parameters: Option<Map<String, Value>>,
    inputs: Vec<InputBody>,
    #[serde(default)]
    outputs: Option<Vec<OutputBody>>,
}

#[derive(Deserialize)]
struct InputBody {
    name: String,
    shape: Vec<Value>,
    datatype: String,
    #[serde(default)]
    parameters: Option<Map<String, Value>>,
    #[serde(default)]
    data: Option<Value>,
}

#[derive(Deserialize)]
struct OutputBody {
    name: String,
    #[serde(default)]
    parameters: Option<Map<String, Value>>,
}

/// A validated inference request.
#[derive(Clone, Debug, PartialEq)]
pub struct ParsedInfer {
    /// The request id to echo, if any.
    pub id: Option<String>,
    /// The input tensor's bytes, little-endian, exactly the model's size.
    pub input: Vec<u8>,
    /// The `priority` and `timeout` parameters (the budget is the
    /// model's SLO; a shorter timeout shortens it).
    pub options: RequestOptions,
    /// Whether the output goes back as binary tensor data.
    pub binary_output: bool,
}

fn param_bool(p: &Option<Map<String, Value>>, key: &str) -> Result<Option<bool>, BadRequest> {
    match p.as_ref().and_then(|m| m.get(key)) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => bad(format!("parameter '{key}' must be a boolean")),
    }
}

fn param_u64(p: &Option<Map<String, Value>>, key: &str) -> Result<Option<u64>, BadRequest> {
    match p.as_ref().and_then(|m| m.get(key)) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| BadRequest(format!("parameter '{key}' must be a non-negative integer"))),
    }
}

/// The message for a request with `got` inputs (every model takes one).
pub fn input_count_message(model: &ModelEntry, got: usize) -> String {
    format!(
        "expected 1 input for model '{}', got {got}",
        model.spec.name
    )
}

/// Checks an input's name, datatype and shape (`None`: not all integers;
/// `shape_text` shows it as sent, formatted only for the error) against `model`'s input: the one check
/// HTTP and gRPC requests both pass.
pub fn check_input(
    model: &ModelEntry,
    input_name: &str,
    datatype: &str,
    shape: Option<&[i64]>,
    shape_text: impl FnOnce() -> String,
) -> Result<(), BadRequest> {
    let spec = &model.input;
    let name = &model.spec.name;
    if input_name != spec.name {
        return bad(format!(
            "unexpected inference input '{input_name}' for model '{name}' (expected '{}')",
            spec.name
        ));
    }
    match DataType::from_kserve(datatype) {
        Some(dt) if dt == spec.datatype => {}
        _ => {
            return bad(format!(
                "input '{input_name}' has datatype '{datatype}', model '{name}' expects '{}'",
                spec.datatype.kserve_name()
            ))
        }
    }
    let same = shape.is_some_and(|s| {
        s.len() == spec.shape.len()
            && s.iter()
                .zip(&spec.shape)
                .all(|(&a, &b)| u64::try_from(a) == Ok(b))
    });
    if !same {
        return bad(format!(
            "input '{input_name}' has shape {}, model '{name}' expects {:?}",
            shape_text(),
            spec.shape
        ));
    }
    Ok(())
}

/// The message for binary input data of the wrong size.
pub fn input_size_message(input_name: &str, got: u64, want: u64) -> String {
    format!(
        "input '{input_name}' has {got} bytes of binary data, shape and datatype require {want}"
    )
}

/// Checks a requested output's name against `model`'s output.
pub fn check_output(model: &ModelEntry, output_name: &str) -> Result<(), BadRequest> {
    if output_name != model.output.name {
        return bad(format!(
            "unexpected inference output '{output_name}' for model '{}'",
            model.spec.name
        ));
    }
    Ok(())
}

/// Triton's per-request scheduling parameters, checked: `priority` (1 is
/// the highest level; 0 or absent: the model's default) and `timeout`
/// (microseconds; 0 or absent: none, the model's SLO alone bounds the
/// request). The one check HTTP and gRPC requests both pass.
pub fn request_options(
    priority: Option<u64>,
    timeout_us: Option<u64>,
) -> Result<RequestOptions, BadRequest> {
    let priority = match priority.map(u32::try_from) {
        None => 0,
        Some(Ok(p)) => p,
        Some(Err(_)) => return bad(format!("parameter 'priority' must be at most {}", u32::MAX)),
    };
    let timeout = match timeout_us {
        None | Some(0) => None,
        Some(us) => Some(Duration::from_micros(us)),
    };
    Ok(RequestOptions { priority, timeout })
}

/// Parses the body of `POST /v2/models/{m}/infer` for `model`.
/// `header_len` is the `Inference-Header-Content-Length` value, if sent:
/// the JSON is then `body[..header_len]` and binary tensor data follows.
pub fn parse_infer(
    body: &[u8],
    header_len: Option<usize>,
    model: &ModelEntry,
) -> Result<ParsedInfer, BadRequest> {
    let (json_part, mut binary) = match header_len {
        Some(n) if n <= body.len() => body.split_at(n),
        Some(n) => {
            return bad(format!(
                "Inference-Header-Content-Length {n} exceeds the body length {}",
                body.len()
            ))
        }
        None => (body, &[][..]),
    };
    let req: RequestBody = serde_json::from_slice(json_part)
        .map_err(|e| BadRequest(format!("malformed inference request JSON: {e}")))?;
    let id = match req.id {
        None => None,
        Some(Value::String(s)) if s.len() <= MAX_ID_LEN => Some(s),
        Some(Value::String(_)) => return bad(format!("request id longer than {MAX_ID_LEN} bytes")),
        Some(_) => return bad("request id must be a string"),
    };
    let spec = &model.input;
    let [input] = req.inputs.as_slice() else {
        return bad(input_count_message(model, req.inputs.len()));
    };
    let shape: Option<Vec<i64>> = input.shape.iter().map(Value::as_i64).collect();
    check_input(
        model,
        &input.name,
        &input.datatype,
        shape.as_deref(),
        || Value::Array(input.shape.clone()).to_string(),
    )?;
    let len = spec.byte_len() as usize;
    let mut bytes = vec![0u8; len];
    match param_u64(&input.parameters, "binary_data_size")? {
        Some(n) => {
            if input.data.is_some() {
                return bad(format!(
                    "input '{}' has both JSON data and binary_data_size",
                    input.name
                ));
            }
            if n != len as u64 {
                return bad(input_size_message(&input.name, n, len as u64));
            }
            if binary.len() < len {
                return bad(format!(
                    "binary data of input '{}' runs past the end of the body",
                    input.name
                ));
            }
            let (this, rest) = binary.split_at(len);
            bytes.copy_from_slice(this);
            binary = rest;
        }
        None => {
            let Some(data) = &input.data else {
                return bad(format!("input '{}' has no data", input.name));
            };
            encode_json_data(data, spec.datatype, &mut bytes)
                .map_err(|e| BadRequest(format!("input '{}': {e}", input.name)))?;
        }
    }
    if !binary.is_empty() {
        return bad(format!(
            "{} bytes of binary data not claimed by any input",
            binary.len()
        ));
    }
    let mut binary_output = param_bool(&req.parameters, "binary_data_output")?.unwrap_or(false);
    if let Some(outs) = &req.outputs {
        for o in outs {
            check_output(model, &o.name)?;
            if let Some(b) = param_bool(&o.parameters, "binary_data")? {
                binary_output = b;
            }
        }
    }
    let options = request_options(
        param_u64(&req.parameters, "priority")?,
        param_u64(&req.parameters, "timeout")?,
    )?;
    Ok(ParsedInfer {
        id,
        input: bytes,
        options,
        binary_output,
    })
}

/// The body of an inference response. With `binary`, the output bytes are
/// returned separately (append them after the JSON and send the JSON's
/// length as `Inference-Header-Content-Length`).
pub fn infer_response(
    model: &ModelEntry,
    id: Option<&str>,
    output: &[u8],
    binary: bool,
) -> Vec<u8> {
    let o = &model.output;
    let mut out = json!({ "name": o.name, "datatype": o.datatype.kserve_name(), "shape": o.shape });
    if binary {
        out["parameters"] = json!({ "binary_data_size": output.len() });
    } else {
        out["data"] = decode_to_json(output, o.datatype);
    }
    let mut v =
        json!({ "model_name": model.spec.name, "model_version": model.version, "outputs": [out] });
    if let Some(id) = id {
        v["id"] = Value::String(id.to_string());
    }
    serde_json::to_vec(&v).unwrap_or_default()
}

fn tensor_meta(t: &TensorSpec) -> Value {
    json!({ "name": t.name, "datatype": t.datatype.kserve_name(), "shape": t.shape })
}

/// `GET /v2/models/{m}`.
pub fn model_metadata(model: &ModelEntry) -> Value {
    json!({
        "name": model.spec.name,
        "versions": [model.version],
        "platform": model.platform,
        "inputs": [tensor_meta(&model.input)],
        "outputs": [tensor_meta(&model.output)],
    })
}

/// `GET /v2/models/{m}/config` (Triton's model configuration, the parts
/// that apply).
pub fn model_config(model: &ModelEntry) -> Value {
    let t = |t: &TensorSpec| json!({ "name": t.name, "data_type": format!("TYPE_{}", t.datatype.kserve_name()), "dims": t.shape });
    json!({
        "name": model.spec.name,
        "platform": model.platform,
        "max_batch_size": 0,
        "input": [t(&model.input)],
        "output": [t(&model.output)],
        "parameters": { "slo_ms": { "string_value": format!("{}", model.spec.slo.as_millis_f64()) } },
    })
}

/// `GET /v2`.
pub fn server_metadata() -> Value {
    json!({ "name": SERVER_NAME, "version": env!("CARGO_PKG_VERSION"), "extensions": EXTENSIONS })
}

/// `POST /v2/repository/index`.
pub fn repository_index(entries: &[crate::types::IndexEntry]) -> Value {
    Value::Array(
        entries
            .iter()
            .map(|e| {
                let mut v = json!({ "name": e.name, "version": e.version, "state": e.state });
                if !e.reason.is_empty() {
                    v["reason"] = Value::String(e.reason.into());
                }
                v
            })
            .collect(),
    )
}

/// `GET /v2/models/{m}[/versions/{v}]/stats`: Triton's statistics JSON.
pub fn statistics(stats: &[crate::types::ModelStats]) -> Value {
    let d = |c: &crate::types::CountNs| json!({ "count": c.count, "ns": c.ns });
    let models: Vec<Value> = stats
        .iter()
        .map(|s| {
            json!({
                "name": s.name,
                "version": s.version,
                "last_inference": s.last_inference,
                "inference_count": s.inference_count,
                "execution_count": s.execution_count,
                "inference_stats": {
                    "success": d(&s.success),
                    "fail": d(&s.fail),
                    "queue": d(&s.queue),
                    "compute_input": d(&s.compute_input),
                    "compute_infer": d(&s.compute_infer),
                    "compute_output": d(&s.compute_output),
                    "cache_hit": { "count": 0, "ns": 0 },
                    "cache_miss": { "count": 0, "ns": 0 },
                },
                "batch_stats": s.batch_stats.iter().map(|b| json!({
                    "batch_size": b.batch_size,
                    "compute_input": { "count": b.compute_infer.count, "ns": 0 },
                    "compute_infer": d(&b.compute_infer),
                    "compute_output": { "count": b.compute_infer.count, "ns": 0 },
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({ "model_stats": models })
}

/// `{"error": msg}`.
pub fn error_body(msg: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({ "error": msg })).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::ModelCatalog;
    use scheduler_core::zoo::ModelSpec;

    fn model() -> ModelEntry {
        let c =
            ModelCatalog::with_default_tensors(&[ModelSpec::linear("m", 1.0, 1.0, 20.0).unwrap()]);
        c.entries()[0].clone()
    }

    fn body(data: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({"id": "r1", "inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": data}]})).unwrap()
    }

    #[test]
    fn json_and_binary_requests_parse_to_the_same_bytes() {
        let m = model();
        let vals: Vec<f32> = (0..16).map(|i| i as f32 * 0.5).collect();
        let p = parse_infer(&body(json!(vals)), None, &m).unwrap();
        assert_eq!(p.id.as_deref(), Some("r1"));
        assert_eq!(p.options, RequestOptions::default());
        let raw: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(p.input, raw);
        let head = serde_json::to_vec(&json!({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": 64}}], "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": true}}], "parameters": {"timeout": 5000}})).unwrap();
        let mut b = head.clone();
        b.extend_from_slice(&raw);
        let q = parse_infer(&b, Some(head.len()), &m).unwrap();
        assert_eq!(q.input, raw);
        assert!(q.binary_output);
        assert_eq!(q.options.timeout, Some(Duration::from_millis(5)));
        b.push(0);
        assert!(parse_infer(&b, Some(head.len()), &m).is_err());
        assert!(parse_infer(&b, Some(b.len() + 1), &m).is_err());
    }

    #[test]
    fn bad_requests_are_refused_with_a_reason() {
        let m = model();
        let cases: Vec<Vec<u8>> = vec![
            b"{not json".to_vec(),
            b"[]".to_vec(),
            body(json!([1, 2, 3])),
            body(json!("x")),
            serde_json::to_vec(&json!({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": vec![0; 16]}]})).unwrap(),
            serde_json::to_vec(&json!({"inputs": [{"name": "INPUT0", "shape": [2, 8], "datatype": "FP32", "data": vec![0; 16]}]})).unwrap(),
            serde_json::to_vec(&json!({"inputs": [{"name": "X", "shape": [1, 16], "datatype": "FP32", "data": vec![0; 16]}]})).unwrap(),
            serde_json::to_vec(&json!({"inputs": []})).unwrap(),
            serde_json::to_vec(&json!({"id": 5, "inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": vec![0; 16]}]})).unwrap(),
            serde_json::to_vec(&json!({"inputs": [{"name": "INPUT0", "shape": [1, -16], "datatype": "FP32", "data": vec![0; 16]}]})).unwrap(),
        ];
        for c in cases {
            assert!(
                parse_infer(&c, None, &m).is_err(),
                "{}",
                String::from_utf8_lossy(&c)
            );
        }
    }

    #[test]
    fn priority_and_timeout_parameters_are_read_and_bad_ones_refused_by_name() {
        let m = model();
        let with = |p: Value| {
            let mut v: Value = serde_json::from_slice(&body(json!(vec![0; 16]))).unwrap();
            v["parameters"] = p;
            parse_infer(&serde_json::to_vec(&v).unwrap(), None, &m)
        };
        let p = with(json!({"priority": 1, "timeout": 5000})).unwrap();
        assert_eq!(
            p.options,
            RequestOptions { priority: 1, timeout: Some(Duration::from_micros(5000)) }
        );
        // 0: the model's default level, no timeout.
        assert_eq!(with(json!({"priority": 0, "timeout": 0})).unwrap().options, RequestOptions::default());
        for (p, name) in [
            (json!({"priority": -1}), "priority"),
            (json!({"priority": "high"}), "priority"),
            (json!({"priority": 1.5}), "priority"),
            (json!({"priority": 1u64 << 40}), "priority"),
            (json!({"timeout": -5}), "timeout"),
            (json!({"timeout": true}), "timeout"),
        ] {
            let e = with(p.clone()).unwrap_err();
            assert!(e.0.contains(name), "{p}: {e:?}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 512, ..Default::default() })]
        #[test]
        fn arbitrary_bodies_never_panic(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512), hl in proptest::option::of(0usize..600)) {
            let _ = parse_infer(&body, hl, &model());
        }

        #[test]
        fn arbitrary_json_shaped_bodies_never_panic(
            shape in proptest::collection::vec(-3i64..20, 0..4),
            dt in "(FP32|FP64|INT8|UINT8|BOOL|BYTES|x)",
            depth in 0usize..80,
            n in 0usize..40,
            bin in proptest::option::of(0u64..200),
        ) {
            let mut data = json!((0..n).map(|i| i as f64 - 3.5).collect::<Vec<_>>());
            for _ in 0..depth {
                data = json!([data]);
            }
            let mut input = json!({"name": "INPUT0", "shape": shape, "datatype": dt, "data": data});
            if let Some(b) = bin {
                input["parameters"] = json!({"binary_data_size": b});
            }
            let body = serde_json::to_vec(&json!({"inputs": [input]})).unwrap();
            let _ = parse_infer(&body, None, &model());
        }
    }
}
