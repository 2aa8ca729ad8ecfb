//! The Open Inference Protocol's JSON bodies: parsing and validating an
//! inference request against a model (JSON tensor data, flat or nested,
//! or the binary tensor data extension), and building the responses.
//! Pure functions over bytes: no I/O, no panics on any input.

use crate::models::{ModelCatalog, ModelEntry};
use crate::tensor::{decode_to_json, encode_json_data, DataType, TensorSpec};
use dataplane::time::Duration;
use serde::Deserialize;
use serde_json::{json, Map, Value};

/// Server name reported by `GET /v2`.
pub const SERVER_NAME: &str = "symphony";
/// Protocol extensions this server implements.
pub const EXTENSIONS: [&str; 3] = [
    "binary_tensor_data",
    "model_repository",
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
    /// Time budget: the `timeout` parameter (microseconds, as Triton) if
    /// given, else the model's SLO.
    pub budget: Duration,
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
    let name = &model.spec.name;
    let [input] = req.inputs.as_slice() else {
        return bad(format!(
            "expected 1 input for model '{name}', got {}",
            req.inputs.len()
        ));
    };
    if input.name != spec.name {
        return bad(format!(
            "unexpected inference input '{}' for model '{name}' (expected '{}')",
            input.name, spec.name
        ));
    }
    match DataType::parse(&input.datatype) {
        Some(dt) if dt == spec.datatype => {}
        _ => {
            return bad(format!(
                "input '{}' has datatype '{}', model '{name}' expects '{}'",
                input.name,
                input.datatype,
                spec.datatype.as_str()
            ))
        }
    }
    let shape: Option<Vec<u64>> = input.shape.iter().map(Value::as_u64).collect();
    if shape.as_deref() != Some(spec.shape.as_slice()) {
        return bad(format!(
            "input '{}' has shape {}, model '{name}' expects {:?}",
            input.name,
            Value::Array(input.shape.clone()),
            spec.shape
        ));
    }
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
                return bad(format!(
                    "input '{}' has {n} bytes of binary data, shape and datatype require {len}",
                    input.name
                ));
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
            if o.name != model.output.name {
                return bad(format!(
                    "unexpected inference output '{}' for model '{name}'",
                    o.name
                ));
            }
            if let Some(b) = param_bool(&o.parameters, "binary_data")? {
                binary_output = b;
            }
        }
    }
    let budget = match param_u64(&req.parameters, "timeout")? {
        Some(0) | None => model.spec.slo,
        Some(us) => Duration::from_micros(us),
    };
    Ok(ParsedInfer {
        id,
        input: bytes,
        budget,
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
    let mut out = json!({ "name": o.name, "datatype": o.datatype.as_str(), "shape": o.shape });
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
    json!({ "name": t.name, "datatype": t.datatype.as_str(), "shape": t.shape })
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
    let t = |t: &TensorSpec| json!({ "name": t.name, "data_type": format!("TYPE_{}", t.datatype.as_str()), "dims": t.shape });
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
pub fn repository_index(catalog: &ModelCatalog) -> Value {
    Value::Array(
        catalog
            .entries()
            .iter()
            .map(|m| json!({ "name": m.spec.name, "version": m.version, "state": "READY" }))
            .collect(),
    )
}

/// `{"error": msg}`.
pub fn error_body(msg: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({ "error": msg })).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use scheduler::zoo::ModelSpec;

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
        assert_eq!(p.budget, Duration::from_millis(20));
        let raw: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(p.input, raw);
        let head = serde_json::to_vec(&json!({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": 64}}], "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": true}}], "parameters": {"timeout": 5000}})).unwrap();
        let mut b = head.clone();
        b.extend_from_slice(&raw);
        let q = parse_infer(&b, Some(head.len()), &m).unwrap();
        assert_eq!(q.input, raw);
        assert!(q.binary_output);
        assert_eq!(q.budget, Duration::from_millis(5));
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
