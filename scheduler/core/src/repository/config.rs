//! A model's `config.pbtxt` (Triton's `ModelConfig`, the fields this
//! project uses) read from the [`super::pbtxt`] tree, each field checked.

use std::time::Duration as StdDuration;

use super::pbtxt::{Field, Message, Scalar, Value};

/// A tensor's element type, in both spellings the system meets: Triton's
/// config.pbtxt (`TYPE_FP32`) and the KServe v2 protocol (`FP32`). The one
/// datatype enum of the tree: the repository, the frontends' protocol
/// layers and the ONNX executor share it. (`BYTES`/`STRING`, FP16 and
/// BF16 are not served: models here take fixed-size numeric tensors.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataType {
    /// `BOOL`, one byte (0 or 1).
    Bool,
    /// `UINT8`.
    U8,
    /// `UINT16`.
    U16,
    /// `UINT32`.
    U32,
    /// `UINT64`.
    U64,
    /// `INT8`.
    I8,
    /// `INT16`.
    I16,
    /// `INT32`.
    I32,
    /// `INT64`.
    I64,
    /// `FP32`.
    F32,
    /// `FP64`.
    F64,
}

impl DataType {
    /// Every served type.
    pub const ALL: [DataType; 11] = [
        DataType::Bool,
        DataType::U8,
        DataType::U16,
        DataType::U32,
        DataType::U64,
        DataType::I8,
        DataType::I16,
        DataType::I32,
        DataType::I64,
        DataType::F32,
        DataType::F64,
    ];
    /// Parses a Triton config type name (`TYPE_FP32`); `None` for an
    /// unknown or unsupported one.
    pub fn from_triton(name: &str) -> Option<DataType> {
        name.strip_prefix("TYPE_").and_then(DataType::from_kserve)
    }
    /// Parses a protocol datatype name (`FP32`, `INT64`, ...).
    /// Case-sensitive, as the protocol spells them.
    pub fn from_kserve(name: &str) -> Option<DataType> {
        DataType::ALL.into_iter().find(|d| d.kserve_name() == name)
    }
    /// Triton's config name (`TYPE_FP32`).
    pub fn triton_name(self) -> &'static str {
        match self {
            DataType::Bool => "TYPE_BOOL",
            DataType::U8 => "TYPE_UINT8",
            DataType::U16 => "TYPE_UINT16",
            DataType::U32 => "TYPE_UINT32",
            DataType::U64 => "TYPE_UINT64",
            DataType::I8 => "TYPE_INT8",
            DataType::I16 => "TYPE_INT16",
            DataType::I32 => "TYPE_INT32",
            DataType::I64 => "TYPE_INT64",
            DataType::F32 => "TYPE_FP32",
            DataType::F64 => "TYPE_FP64",
        }
    }
    /// The KServe v2 protocol's name (`FP32`).
    pub fn kserve_name(self) -> &'static str {
        &self.triton_name()[5..]
    }
    /// Bytes per element.
    pub fn size(self) -> u32 {
        match self {
            DataType::Bool | DataType::U8 | DataType::I8 => 1,
            DataType::U16 | DataType::I16 => 2,
            DataType::U32 | DataType::I32 | DataType::F32 => 4,
            DataType::U64 | DataType::I64 | DataType::F64 => 8,
        }
    }
}

/// One input or output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorConfig {
    /// Tensor name (as in the ONNX graph).
    pub name: String,
    /// Element type.
    pub data_type: DataType,
    /// Per-sample dims (without the batch dim when `max_batch_size > 0`);
    /// `-1` is a variable dim.
    pub dims: Vec<i64>,
    /// `reshape { shape }`: the shape the model sees, when it differs.
    pub reshape: Option<Vec<i64>>,
}

impl TensorConfig {
    /// Bytes of one sample, `None` if a dim is variable (or the product
    /// overflows).
    pub fn sample_bytes(&self) -> Option<u64> {
        self.dims.iter().try_fold(u64::from(self.data_type.size()), |acc, &d| {
            u64::try_from(d).ok().and_then(|d| acc.checked_mul(d))
        })
    }
    /// The per-sample shape the model sees (`reshape` if any, else `dims`).
    pub fn model_dims(&self) -> &[i64] {
        self.reshape.as_deref().unwrap_or(&self.dims)
    }
}

/// `instance_group.kind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstanceKind {
    /// `KIND_AUTO` (the default): GPU if available, else CPU.
    Auto,
    /// `KIND_CPU`.
    Cpu,
    /// `KIND_GPU`.
    Gpu,
}

/// `instance_group` (summed over groups: instances run batches
/// concurrently).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InstanceGroup {
    /// Instances (concurrent batches) in all groups.
    pub count: u32,
    /// The first group's kind.
    pub kind: InstanceKind,
}

/// `version_policy`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VersionPolicy {
    /// `latest { num_versions: n }` (default n = 1).
    Latest(u32),
    /// `all {}`.
    All,
    /// `specific { versions: [..] }`.
    Specific(Vec<u64>),
}

/// `dynamic_batching`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DynamicBatching {
    /// `preferred_batch_size` values.
    pub preferred_batch_size: Vec<u32>,
    /// `max_queue_delay_microseconds`.
    pub max_queue_delay_us: u64,
    /// `priority_levels` (0: one level).
    pub priority_levels: u16,
    /// `default_priority_level` (0: the lowest level).
    pub default_priority_level: u16,
    /// `default_queue_policy.max_queue_size` (0: unbounded).
    pub max_queue_size: u32,
}

impl DynamicBatching {
    /// The scheduler's admission for these knobs: its priority levels, the
    /// level of a request that names none, and the queue bound.
    pub fn admission(&self) -> crate::types::Admission {
        let levels = self.priority_levels.max(1);
        let default_level = match self.default_priority_level {
            0 => levels,
            l => l.min(levels),
        };
        crate::types::Admission { levels, default_level, max_queue: self.max_queue_size }
    }
}

/// A parsed `config.pbtxt`.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// `name` (must equal the directory name when given).
    pub name: String,
    /// `platform` (e.g. `onnxruntime_onnx`), empty if absent.
    pub platform: String,
    /// `backend` (e.g. `onnxruntime`), empty if absent.
    pub backend: String,
    /// `max_batch_size` (0: the model has no batch dim).
    pub max_batch_size: u32,
    /// `input` entries.
    pub inputs: Vec<TensorConfig>,
    /// `output` entries.
    pub outputs: Vec<TensorConfig>,
    /// `dynamic_batching`, if present.
    pub dynamic_batching: Option<DynamicBatching>,
    /// `instance_group` (default: one `KIND_AUTO` instance).
    pub instance_group: InstanceGroup,
    /// `version_policy` (default `latest { num_versions: 1 }`).
    pub version_policy: VersionPolicy,
    /// `default_model_filename` (default `model.onnx`).
    pub default_model_filename: String,
    /// The SLO from `parameters { key: "slo_ms" ... }`, if present.
    pub slo: Option<StdDuration>,
    /// Every `parameters` entry, `(key, string_value)` in order.
    pub parameters: Vec<(String, String)>,
}

/// A field that is missing or wrong (the caller adds the file).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Dotted path of the field, e.g. `input[0].data_type`.
    pub field: String,
    /// 1-based line (0 when the field is missing).
    pub line: u32,
    /// What is wrong.
    pub what: String,
}

type R<T> = Result<T, FieldError>;

fn field_err(field: impl Into<String>, line: u32, what: impl Into<String>) -> FieldError {
    FieldError {
        field: field.into(),
        line,
        what: what.into(),
    }
}

fn scalar<'a>(f: &'a Field, path: &str) -> R<&'a Scalar> {
    match &f.value {
        Value::Scalar(s) => Ok(s),
        Value::Message(_) => Err(field_err(path, f.line, "expected a value, found a message")),
    }
}

fn message<'a>(f: &'a Field, path: &str) -> R<&'a Message> {
    match &f.value {
        Value::Message(m) => Ok(m),
        Value::Scalar(_) => Err(field_err(path, f.line, "expected a message { ... }")),
    }
}

fn string(f: &Field, path: &str) -> R<String> {
    match scalar(f, path)? {
        Scalar::Str(s) => Ok(s.clone()),
        Scalar::Token(t) => Err(field_err(path, f.line, format!("expected a quoted string, found {t}"))),
    }
}

fn token(f: &Field, path: &str) -> R<String> {
    match scalar(f, path)? {
        Scalar::Token(t) => Ok(t.clone()),
        Scalar::Str(s) => Ok(s.clone()),
    }
}

fn int<T: std::str::FromStr>(f: &Field, path: &str) -> R<T> {
    let t = token(f, path)?;
    t.parse::<T>()
        .map_err(|_| field_err(path, f.line, format!("'{t}' is not a valid integer here")))
}

fn opt_last<'a>(m: &'a Message, name: &str) -> Option<&'a Field> {
    m.last(name)
}

/// Known top-level fields this project reads or knowingly ignores.
const KNOWN_TOP: &[&str] = &[
    "name",
    "platform",
    "backend",
    "max_batch_size",
    "input",
    "output",
    "dynamic_batching",
    "instance_group",
    "version_policy",
    "parameters",
    "default_model_filename",
    // Read by Triton, ignored here.
    "optimization",
    "model_warmup",
    "runtime",
];

/// Reads a config from its parsed tree. `dir_name` is the model's
/// directory: the default name, and `name` must match it.
pub fn from_message(m: &Message, dir_name: &str) -> R<ModelConfig> {
    if let Some(f) = m.fields.iter().find(|f| !KNOWN_TOP.contains(&f.name.as_str())) {
        return Err(field_err(f.name.clone(), f.line, "unsupported field"));
    }
    let name = model_name(m, dir_name)?;
    let (platform, backend) = platform_and_backend(m)?;
    let max_batch_size = max_batch_size(m)?;
    let inputs = tensors(m, "input")?;
    let outputs = tensors(m, "output")?;
    if inputs.is_empty() {
        return Err(field_err("input", 0, "missing: at least one input"));
    }
    if outputs.is_empty() {
        return Err(field_err("output", 0, "missing: at least one output"));
    }
    let dynamic_batching = opt_last(m, "dynamic_batching").map(|f| dynamic_batching(f, max_batch_size)).transpose()?;
    let instance_group = instance_group(m)?;
    let version_policy = version_policy(m)?;
    let default_model_filename = default_model_filename(m)?;
    let (parameters, slo) = parameters(m)?;
    Ok(ModelConfig {
        name,
        platform,
        backend,
        max_batch_size,
        inputs,
        outputs,
        dynamic_batching,
        instance_group,
        version_policy,
        default_model_filename,
        slo,
        parameters,
    })
}

/// `name`: the directory's name, which a stated name must match.
fn model_name(m: &Message, dir_name: &str) -> R<String> {
    Ok(match opt_last(m, "name") {
        Some(f) => {
            let n = string(f, "name")?;
            if n != dir_name {
                return Err(field_err(
                    "name",
                    f.line,
                    format!("'{n}' differs from the model's directory name '{dir_name}'"),
                ));
            }
            n
        }
        None => dir_name.to_string(),
    })
}

/// `platform` and `backend`: ONNX Runtime's, one of them at least.
fn platform_and_backend(m: &Message) -> R<(String, String)> {
    let platform = opt_last(m, "platform").map(|f| string(f, "platform")).transpose()?.unwrap_or_default();
    let backend = opt_last(m, "backend").map(|f| string(f, "backend")).transpose()?.unwrap_or_default();
    match (platform.as_str(), backend.as_str()) {
        ("onnxruntime_onnx" | "", "onnxruntime" | "") if !(platform.is_empty() && backend.is_empty()) => {}
        ("", "") => {
            return Err(field_err(
                "platform",
                0,
                "missing: set platform: \"onnxruntime_onnx\" or backend: \"onnxruntime\"",
            ))
        }
        _ => {
            let f = opt_last(m, "platform").or(opt_last(m, "backend"));
            return Err(field_err(
                if platform.is_empty() { "backend" } else { "platform" },
                f.map_or(0, |f| f.line),
                format!("only onnxruntime_onnx / onnxruntime is served (got platform '{platform}', backend '{backend}')"),
            ));
        }
    }
    Ok((platform, backend))
}

/// `max_batch_size` (0: the model takes no batch dimension).
fn max_batch_size(m: &Message) -> R<u32> {
    Ok(match opt_last(m, "max_batch_size") {
        Some(f) => {
            let v: i64 = int(f, "max_batch_size")?;
            u32::try_from(v)
                .ok()
                .filter(|&v| v <= 4096)
                .ok_or_else(|| field_err("max_batch_size", f.line, format!("{v} is outside 0..=4096")))?
        }
        None => 0,
    })
}

/// The `dynamic_batching` block `f`, its preferred sizes within
/// `max_batch_size`.
fn dynamic_batching(f: &Field, max_batch_size: u32) -> R<DynamicBatching> {
    let d = message(f, "dynamic_batching")?;
    let mut db = DynamicBatching::default();
    for p in d.all("preferred_batch_size") {
        let v: u32 = int(p, "dynamic_batching.preferred_batch_size")?;
        if v == 0 || (max_batch_size > 0 && v > max_batch_size) {
            return Err(field_err(
                "dynamic_batching.preferred_batch_size",
                p.line,
                format!("{v} is outside 1..=max_batch_size ({max_batch_size})"),
            ));
        }
        db.preferred_batch_size.push(v);
    }
    if let Some(q) = d.last("max_queue_delay_microseconds") {
        db.max_queue_delay_us = int(q, "dynamic_batching.max_queue_delay_microseconds")?;
    }
    if let Some(p) = d.last("priority_levels") {
        db.priority_levels = int(p, "dynamic_batching.priority_levels")?;
    }
    if let Some(p) = d.last("default_priority_level") {
        let l: u16 = int(p, "dynamic_batching.default_priority_level")?;
        if l > db.priority_levels.max(1) {
            return Err(field_err("dynamic_batching.default_priority_level", p.line, format!("{l} is above priority_levels ({})", db.priority_levels)));
        }
        db.default_priority_level = l;
    }
    if let Some(q) = d.last("default_queue_policy") {
        let policy = message(q, "dynamic_batching.default_queue_policy")?;
        if let Some(n) = policy.last("max_queue_size") {
            db.max_queue_size = int(n, "dynamic_batching.default_queue_policy.max_queue_size")?;
        }
    }
    Ok(db)
}

/// `default_model_filename`: a plain file name (default `model.onnx`).
fn default_model_filename(m: &Message) -> R<String> {
    Ok(match opt_last(m, "default_model_filename") {
        Some(f) => {
            let n = string(f, "default_model_filename")?;
            if n.is_empty() || n.contains('/') || n == ".." {
                return Err(field_err("default_model_filename", f.line, "must be a plain file name"));
            }
            n
        }
        None => "model.onnx".into(),
    })
}

/// The `parameters` entries, `(key, string value)` each.
type Parameters = Vec<(String, String)>;

/// Every `parameters` entry, and the SLO the `slo_ms` entry states.
fn parameters(m: &Message) -> R<(Parameters, Option<StdDuration>)> {
    let mut parameters = Vec::new();
    let mut slo = None;
    for p in m.all("parameters") {
        let pm = message(p, "parameters")?;
        let key = pm.last("key").ok_or_else(|| field_err("parameters.key", p.line, "missing"))?;
        let key = string(key, "parameters.key")?;
        let value = pm
            .last("value")
            .ok_or_else(|| field_err(format!("parameters[{key}].value"), p.line, "missing"))?;
        let vm = message(value, "parameters.value")?;
        let sv = vm
            .last("string_value")
            .ok_or_else(|| field_err(format!("parameters[{key}].value.string_value"), value.line, "missing"))?;
        let s = string(sv, "parameters.value.string_value")?;
        if key == "slo_ms" {
            let ms: f64 = s.trim().parse().ok().filter(|v: &f64| v.is_finite() && *v > 0.0 && *v < 3.6e6).ok_or_else(
                || field_err("parameters[slo_ms]", sv.line, format!("'{s}' is not a positive number of milliseconds")),
            )?;
            slo = Some(StdDuration::from_secs_f64(ms / 1000.0));
        }
        parameters.push((key, s));
    }
    Ok((parameters, slo))
}

fn dims(m: &Message, path: &str, name: &str) -> R<Vec<i64>> {
    let mut out = Vec::new();
    for f in m.all(name) {
        let p = format!("{path}.{name}");
        let d: i64 = int(f, &p)?;
        if d == 0 || !(-1..=(1 << 31)).contains(&d) {
            return Err(field_err(p, f.line, format!("{d} is not a dim (positive, or -1 for variable)")));
        }
        out.push(d);
        if out.len() > 16 {
            return Err(field_err(p, f.line, "more than 16 dims"));
        }
    }
    Ok(out)
}

fn tensors(m: &Message, kind: &str) -> R<Vec<TensorConfig>> {
    let mut out: Vec<TensorConfig> = Vec::new();
    for (i, f) in m.all(kind).enumerate() {
        let path = format!("{kind}[{i}]");
        let t = message(f, &path)?;
        let name = t
            .last("name")
            .ok_or_else(|| field_err(format!("{path}.name"), f.line, "missing"))
            .and_then(|n| string(n, &format!("{path}.name")))?;
        if out.iter().any(|o| o.name == name) {
            return Err(field_err(format!("{path}.name"), f.line, format!("duplicate {kind} '{name}'")));
        }
        let dt_field = t
            .last("data_type")
            .ok_or_else(|| field_err(format!("{path}.data_type"), f.line, "missing"))?;
        let dt_name = token(dt_field, &format!("{path}.data_type"))?;
        let data_type = DataType::from_triton(&dt_name).ok_or_else(|| {
            field_err(
                format!("{path}.data_type"),
                dt_field.line,
                format!("unsupported data type {dt_name} (served: BOOL, UINT8, INT8, INT16, INT32, INT64, FP32, FP64)"),
            )
        })?;
        let d = dims(t, &path, "dims")?;
        if t.last("dims").is_none() {
            return Err(field_err(format!("{path}.dims"), f.line, "missing"));
        }
        let reshape = match t.last("reshape") {
            Some(r) => {
                let rm = message(r, &format!("{path}.reshape"))?;
                let shape = dims(rm, &format!("{path}.reshape"), "shape")?;
                let count = |v: &[i64]| v.iter().try_fold(1i64, |a, &d| if d < 0 { None } else { a.checked_mul(d) });
                if let (Some(a), Some(b)) = (count(&d), count(&shape)) {
                    if a != b {
                        return Err(field_err(
                            format!("{path}.reshape.shape"),
                            r.line,
                            format!("{shape:?} has {b} elements, dims {d:?} have {a}"),
                        ));
                    }
                }
                Some(shape)
            }
            None => None,
        };
        if let Some(unknown) = t.fields.iter().find(|f| {
            !matches!(f.name.as_str(), "name" | "data_type" | "dims" | "reshape" | "format" | "optional" | "is_shape_tensor")
        }) {
            return Err(field_err(format!("{path}.{}", unknown.name), unknown.line, "unsupported field"));
        }
        out.push(TensorConfig {
            name,
            data_type,
            dims: d,
            reshape,
        });
    }
    Ok(out)
}

fn instance_group(m: &Message) -> R<InstanceGroup> {
    let mut group = InstanceGroup {
        count: 0,
        kind: InstanceKind::Auto,
    };
    for (i, f) in m.all("instance_group").enumerate() {
        let path = format!("instance_group[{i}]");
        let g = message(f, &path)?;
        let count = match g.last("count") {
            Some(c) => {
                let v: u32 = int(c, &format!("{path}.count"))?;
                if v == 0 || v > 64 {
                    return Err(field_err(format!("{path}.count"), c.line, format!("{v} is outside 1..=64")));
                }
                v
            }
            None => 1,
        };
        let kind = match g.last("kind") {
            Some(k) => match token(k, &format!("{path}.kind"))?.as_str() {
                "KIND_AUTO" => InstanceKind::Auto,
                "KIND_CPU" => InstanceKind::Cpu,
                "KIND_GPU" => InstanceKind::Gpu,
                other => {
                    return Err(field_err(
                        format!("{path}.kind"),
                        k.line,
                        format!("unsupported kind {other} (KIND_AUTO, KIND_CPU or KIND_GPU)"),
                    ))
                }
            },
            None => InstanceKind::Auto,
        };
        if i == 0 {
            group.kind = kind;
        }
        group.count = group.count.saturating_add(count).min(64);
    }
    if group.count == 0 {
        group.count = 1;
    }
    Ok(group)
}

fn version_policy(m: &Message) -> R<VersionPolicy> {
    let Some(f) = m.last("version_policy") else {
        return Ok(VersionPolicy::Latest(1));
    };
    let p = message(f, "version_policy")?;
    match p.fields.as_slice() {
        [one] => match one.name.as_str() {
            "latest" => {
                let l = message(one, "version_policy.latest")?;
                let n = match l.last("num_versions") {
                    Some(n) => int::<u32>(n, "version_policy.latest.num_versions")?,
                    None => 1,
                };
                if n == 0 {
                    return Err(field_err("version_policy.latest.num_versions", one.line, "must be at least 1"));
                }
                Ok(VersionPolicy::Latest(n))
            }
            "all" => Ok(VersionPolicy::All),
            "specific" => {
                let s = message(one, "version_policy.specific")?;
                let v = s
                    .all("versions")
                    .map(|v| int::<u64>(v, "version_policy.specific.versions"))
                    .collect::<R<Vec<_>>>()?;
                if v.is_empty() {
                    return Err(field_err("version_policy.specific.versions", one.line, "missing"));
                }
                Ok(VersionPolicy::Specific(v))
            }
            other => Err(field_err(
                format!("version_policy.{other}"),
                one.line,
                "unsupported (latest, all or specific)",
            )),
        },
        _ => Err(field_err("version_policy", f.line, "exactly one of latest, all, specific")),
    }
}
