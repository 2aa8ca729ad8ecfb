//! The subset of ONNX's protobuf schema (onnx.proto, proto2) the graph
//! engine reads, decoded with prost from hand-written messages: only the
//! fields used, with onnx.proto's tags. Unknown fields (subgraphs, docs,
//! metadata, training info) are skipped by the decoder.
//!
//! A model file is hostile input: its size is bounded before decoding
//! ([`MAX_MODEL_BYTES`]), prost allocates only what the bytes it reads
//! hold and caps nesting, and [`Tensor::from_proto`] checks every shape
//! product and data length before copying anything.

use super::GraphError;

/// Largest model file accepted (open_nsfw is 23 MB).
pub const MAX_MODEL_BYTES: usize = 256 << 20;
/// Largest tensor rank accepted anywhere.
pub const MAX_RANK: usize = 6;

/// `ModelProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelProto {
    /// `ir_version`.
    #[prost(int64, optional, tag = "1")]
    pub ir_version: Option<i64>,
    /// `graph`.
    #[prost(message, optional, tag = "7")]
    pub graph: Option<GraphProto>,
    /// `opset_import`.
    #[prost(message, repeated, tag = "8")]
    pub opset_import: Vec<OperatorSetIdProto>,
}

/// `OperatorSetIdProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct OperatorSetIdProto {
    /// `domain` ("" or "ai.onnx" is the default domain).
    #[prost(string, optional, tag = "1")]
    pub domain: Option<String>,
    /// `version`.
    #[prost(int64, optional, tag = "2")]
    pub version: Option<i64>,
}

/// `GraphProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GraphProto {
    /// `node`, in topological order (the format requires it).
    #[prost(message, repeated, tag = "1")]
    pub node: Vec<NodeProto>,
    /// `initializer`.
    #[prost(message, repeated, tag = "5")]
    pub initializer: Vec<TensorProto>,
    /// `input` (older files list the initializers here too).
    #[prost(message, repeated, tag = "11")]
    pub input: Vec<ValueInfoProto>,
    /// `output`.
    #[prost(message, repeated, tag = "12")]
    pub output: Vec<ValueInfoProto>,
}

/// `NodeProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeProto {
    /// `input` ("" marks an omitted optional input).
    #[prost(string, repeated, tag = "1")]
    pub input: Vec<String>,
    /// `output`.
    #[prost(string, repeated, tag = "2")]
    pub output: Vec<String>,
    /// `name`.
    #[prost(string, optional, tag = "3")]
    pub name: Option<String>,
    /// `op_type`.
    #[prost(string, optional, tag = "4")]
    pub op_type: Option<String>,
    /// `attribute`.
    #[prost(message, repeated, tag = "5")]
    pub attribute: Vec<AttributeProto>,
    /// `domain`.
    #[prost(string, optional, tag = "7")]
    pub domain: Option<String>,
}

/// `AttributeProto` (graph-valued attributes are skipped: no op used has one).
#[derive(Clone, PartialEq, prost::Message)]
pub struct AttributeProto {
    /// `name`.
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    /// `f`.
    #[prost(float, optional, tag = "2")]
    pub f: Option<f32>,
    /// `i`.
    #[prost(int64, optional, tag = "3")]
    pub i: Option<i64>,
    /// `s`.
    #[prost(bytes = "vec", optional, tag = "4")]
    pub s: Option<Vec<u8>>,
    /// `t`.
    #[prost(message, optional, tag = "5")]
    pub t: Option<TensorProto>,
    /// `floats`.
    #[prost(float, repeated, packed = "false", tag = "7")]
    pub floats: Vec<f32>,
    /// `ints`.
    #[prost(int64, repeated, packed = "false", tag = "8")]
    pub ints: Vec<i64>,
}

/// `TensorProto` (external data is refused: only embedded tensors).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorProto {
    /// `dims`.
    #[prost(int64, repeated, packed = "false", tag = "1")]
    pub dims: Vec<i64>,
    /// `data_type` (TensorProto.DataType).
    #[prost(int32, optional, tag = "2")]
    pub data_type: Option<i32>,
    /// `float_data`.
    #[prost(float, repeated, packed = "true", tag = "4")]
    pub float_data: Vec<f32>,
    /// `int32_data`.
    #[prost(int32, repeated, packed = "true", tag = "5")]
    pub int32_data: Vec<i32>,
    /// `int64_data`.
    #[prost(int64, repeated, packed = "true", tag = "7")]
    pub int64_data: Vec<i64>,
    /// `name`.
    #[prost(string, optional, tag = "8")]
    pub name: Option<String>,
    /// `raw_data` (little endian).
    #[prost(bytes = "vec", optional, tag = "9")]
    pub raw_data: Option<Vec<u8>>,
    /// `data_location` (1 = EXTERNAL).
    #[prost(int32, optional, tag = "14")]
    pub data_location: Option<i32>,
}

/// `ValueInfoProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueInfoProto {
    /// `name`.
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    /// `type`.
    #[prost(message, optional, tag = "2")]
    pub r#type: Option<TypeProto>,
}

/// `TypeProto` (tensor types only).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeProto {
    /// `tensor_type`.
    #[prost(message, optional, tag = "1")]
    pub tensor_type: Option<TypeTensor>,
}

/// `TypeProto.Tensor`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeTensor {
    /// `elem_type`.
    #[prost(int32, optional, tag = "1")]
    pub elem_type: Option<i32>,
    /// `shape`.
    #[prost(message, optional, tag = "2")]
    pub shape: Option<TensorShapeProto>,
}

/// `TensorShapeProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorShapeProto {
    /// `dim`.
    #[prost(message, repeated, tag = "1")]
    pub dim: Vec<Dimension>,
}

/// `TensorShapeProto.Dimension` (the `value` oneof as two optionals).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Dimension {
    /// `dim_value`.
    #[prost(int64, optional, tag = "1")]
    pub dim_value: Option<i64>,
    /// `dim_param` (a symbolic dimension, such as the batch).
    #[prost(string, optional, tag = "2")]
    pub dim_param: Option<String>,
}

/// TensorProto.DataType values used.
pub const DT_FLOAT: i32 = 1;
/// INT32.
pub const DT_INT32: i32 = 6;
/// INT64.
pub const DT_INT64: i32 = 7;

/// Reads a model file, refusing one over [`MAX_MODEL_BYTES`] without
/// reading more than one byte past the bound (a repository's file is as
/// hostile as a peer's bytes).
pub fn read_model_file(path: &std::path::Path) -> Result<Vec<u8>, GraphError> {
    use std::io::Read;
    let io = |e: std::io::Error| GraphError::Model(format!("{}: {e}", path.display()));
    let mut bytes = Vec::new();
    std::fs::File::open(path).map_err(io)?.take(MAX_MODEL_BYTES as u64 + 1).read_to_end(&mut bytes).map_err(io)?;
    if bytes.len() > MAX_MODEL_BYTES {
        return Err(GraphError::Model(format!("{}: larger than the {MAX_MODEL_BYTES}-byte bound", path.display())));
    }
    Ok(bytes)
}

/// Decodes a model file's bytes (bounded by [`MAX_MODEL_BYTES`]).
pub fn decode_model(bytes: &[u8]) -> Result<ModelProto, GraphError> {
    if bytes.len() > MAX_MODEL_BYTES {
        return Err(GraphError::Model(format!(
            "model file of {} bytes exceeds the {MAX_MODEL_BYTES}-byte bound",
            bytes.len()
        )));
    }
    <ModelProto as prost::Message>::decode(bytes)
        .map_err(|e| GraphError::Model(format!("not an ONNX ModelProto: {e}")))
}

/// A constant tensor: float data, or integers (INT32/INT64 widened).
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    /// FLOAT.
    F32(Vec<f32>),
    /// INT32 or INT64.
    I64(Vec<i64>),
}

/// A decoded constant tensor with checked dims.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// Dimensions (each `>= 0`, rank <= [`MAX_RANK`]).
    pub dims: Vec<usize>,
    /// Elements, row major (`dims` product of them).
    pub data: Data,
}

/// The element count of `dims`, checked (rank, negative dims, overflow).
pub fn numel(dims: &[i64], what: &str) -> Result<(Vec<usize>, usize), GraphError> {
    if dims.len() > MAX_RANK {
        return Err(GraphError::Model(format!("{what}: rank {} above {MAX_RANK}", dims.len())));
    }
    let mut out = Vec::with_capacity(dims.len());
    let mut n: usize = 1;
    for &d in dims {
        let d = usize::try_from(d)
            .map_err(|_| GraphError::Model(format!("{what}: negative dimension {d}")))?;
        n = n
            .checked_mul(d)
            .filter(|&n| n <= MAX_MODEL_BYTES)
            .ok_or_else(|| GraphError::Model(format!("{what}: element count overflows")))?;
        out.push(d);
    }
    Ok((out, n))
}

impl Tensor {
    /// Checks and converts a `TensorProto`: the data length must equal the
    /// dims' product (so no size in the file makes us allocate more than
    /// the file holds).
    pub fn from_proto(t: &TensorProto) -> Result<Tensor, GraphError> {
        let name = t.name.as_deref().unwrap_or("");
        let what = format!("tensor '{name}'");
        if t.data_location == Some(1) {
            return Err(GraphError::Unsupported(format!("{what}: external data")));
        }
        let (dims, n) = numel(&t.dims, &what)?;
        let raw = t.raw_data.as_deref();
        let bad_len = |got: usize| GraphError::Model(format!("{what}: {got} values for {n} elements"));
        let data = match t.data_type.unwrap_or(0) {
            DT_FLOAT => match raw {
                Some(r) if r.len() != n * 4 => return Err(bad_len(r.len() / 4)),
                Some(r) => Data::F32(r.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()),
                None if t.float_data.len() != n => return Err(bad_len(t.float_data.len())),
                None => Data::F32(t.float_data.clone()),
            },
            DT_INT64 => match raw {
                Some(r) if r.len() != n * 8 => return Err(bad_len(r.len() / 8)),
                Some(r) => Data::I64(r.chunks_exact(8).map(|c| {
                    i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])
                }).collect()),
                None if t.int64_data.len() != n => return Err(bad_len(t.int64_data.len())),
                None => Data::I64(t.int64_data.clone()),
            },
            DT_INT32 => match raw {
                Some(r) if r.len() != n * 4 => return Err(bad_len(r.len() / 4)),
                Some(r) => Data::I64(r.chunks_exact(4).map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect()),
                None if t.int32_data.len() != n => return Err(bad_len(t.int32_data.len())),
                None => Data::I64(t.int32_data.iter().map(|&v| i64::from(v)).collect()),
            },
            other => return Err(GraphError::Unsupported(format!("{what}: data type {other}"))),
        };
        Ok(Tensor { dims, data })
    }

    /// The element count.
    pub fn len(&self) -> usize {
        match &self.data {
            Data::F32(v) => v.len(),
            Data::I64(v) => v.len(),
        }
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The data as integers (floats truncated), for shape arithmetic.
    pub fn ints(&self) -> Vec<i64> {
        match &self.data {
            Data::I64(v) => v.clone(),
            Data::F32(v) => v.iter().map(|&f| f as i64).collect(),
        }
    }

    /// The data as floats.
    pub fn floats(&self) -> Vec<f32> {
        match &self.data {
            Data::F32(v) => v.clone(),
            Data::I64(v) => v.iter().map(|&i| i as f32).collect(),
        }
    }
}
