//! ONNX graph -> [`Plan`] for one batch size. The shape subgraph
//! (Shape, Cast, Slice, Concat, Reshape, Constant, Identity, arithmetic on
//! constants) is folded to constants; BatchNormalization and Relu after a
//! Conv whose output nothing else reads are folded into it; every other op
//! becomes one launch of a kernels.cu function. Any op, attribute or shape
//! outside what the kernels do is an error naming it.

use std::collections::HashMap;

use super::arena::{place, Op};
use super::plan::{elements, Kernel, Plan};
use super::proto::{self, AttributeProto, Data, GraphProto, NodeProto, Tensor, MAX_RANK};
use super::{ops, GraphError};

/// Largest batch a plan is made for.
pub const MAX_BATCH: usize = 4096;

/// A decoded, checked model, ready to be lowered for any batch size.
#[derive(Clone, Debug)]
pub struct Model {
    graph: GraphProto,
    /// The default domain's opset.
    pub opset: i64,
    /// The graph input's name.
    pub input_name: String,
    /// The input's dims after the batch dimension, as the graph declares
    /// them (`None`: symbolic).
    pub declared: Vec<Option<usize>>,
    /// The dims plans are made for (0 where still symbolic: see
    /// [`Model::with_sample_dims`]).
    pub sample_dims: Vec<usize>,
    /// The graph output's name.
    pub output_name: String,
}

/// A value during lowering.
#[derive(Clone, Debug)]
pub enum Val {
    /// Known now.
    Const(Tensor),
    /// Computed at run time into buffer `buf`, of shape `dims`.
    Act {
        /// Buffer id.
        buf: usize,
        /// Shape.
        dims: Vec<usize>,
    },
}

impl Model {
    /// Decodes a model file and checks its interface: one runtime input of
    /// float elements whose first dimension is the batch, one output.
    pub fn load(bytes: &[u8]) -> Result<Model, GraphError> {
        let m = proto::decode_model(bytes)?;
        let opset = m
            .opset_import
            .iter()
            .find(|o| matches!(o.domain.as_deref(), None | Some("") | Some("ai.onnx")))
            .and_then(|o| o.version)
            .ok_or_else(|| GraphError::Model("no default-domain opset_import".into()))?;
        let graph = m.graph.ok_or_else(|| GraphError::Model("no graph".into()))?;
        let inits: std::collections::HashSet<&str> =
            graph.initializer.iter().filter_map(|t| t.name.as_deref()).collect();
        let mut inputs = graph.input.iter().filter(|v| !inits.contains(v.name.as_deref().unwrap_or("")));
        let input = inputs.next().ok_or_else(|| GraphError::Model("no graph input".into()))?;
        if inputs.next().is_some() {
            return Err(GraphError::Unsupported("more than one graph input".into()));
        }
        let tt = input.r#type.as_ref().and_then(|t| t.tensor_type.as_ref());
        if tt.and_then(|t| t.elem_type) != Some(proto::DT_FLOAT) {
            return Err(GraphError::Unsupported("a graph input that is not FLOAT".into()));
        }
        let dims = tt.and_then(|t| t.shape.as_ref()).map(|s| s.dim.as_slice()).unwrap_or(&[]);
        if dims.is_empty() || dims.len() > MAX_RANK {
            return Err(GraphError::Unsupported(format!("graph input of rank {}", dims.len())));
        }
        let mut declared = Vec::with_capacity(dims.len() - 1);
        for d in &dims[1..] {
            declared.push(match d.dim_value {
                Some(v) if v > 0 && v <= 1 << 20 => Some(v as usize),
                Some(v) => return Err(GraphError::Model(format!("input dimension {v}"))),
                None => None,
            });
        }
        let sample_dims = declared.iter().map(|d| d.unwrap_or(0)).collect();
        let [output] = graph.output.as_slice() else {
            return Err(GraphError::Unsupported(format!("{} graph outputs (one supported)", graph.output.len())));
        };
        Ok(Model {
            input_name: input.name.clone().unwrap_or_default(),
            output_name: output.name.clone().unwrap_or_default(),
            graph,
            opset,
            declared,
            sample_dims,
        })
    }

    /// Fixes the input's per-sample dims (the model config's, for a graph
    /// whose input has symbolic dimensions besides the batch): they must
    /// agree with every dimension the graph fixes.
    pub fn with_sample_dims(mut self, dims: &[usize]) -> Result<Model, GraphError> {
        let agree = dims.len() == self.declared.len()
            && dims.iter().zip(&self.declared).all(|(&d, decl)| d > 0 && decl.is_none_or(|v| v == d));
        if !agree {
            return Err(GraphError::Model(format!(
                "input dims {dims:?} disagree with the graph's {:?}",
                self.declared
            )));
        }
        proto::numel(&dims.iter().map(|&d| d as i64).collect::<Vec<_>>(), "graph input")?;
        self.sample_dims = dims.to_vec();
        Ok(self)
    }

    /// Floats of one input.
    pub fn sample_len(&self) -> u64 {
        elements(&self.sample_dims)
    }

    /// Lowers the graph for batches of `batch`.
    pub fn plan(&self, batch: usize) -> Result<Plan, GraphError> {
        if batch == 0 || batch > MAX_BATCH {
            return Err(GraphError::Plan(format!("batch {batch} outside 1..={MAX_BATCH}")));
        }
        if self.sample_dims.contains(&0) {
            return Err(GraphError::Unsupported(format!(
                "input dims {:?} symbolic (give them: Model::with_sample_dims)",
                self.declared
            )));
        }
        let mut l = Lowering { opset: self.opset, ..Lowering::default() };
        for t in &self.graph.initializer {
            let name = t.name.clone().unwrap_or_default();
            l.vals.insert(name, Val::Const(Tensor::from_proto(t)?));
        }
        for n in &self.graph.node {
            for i in n.input.iter().filter(|i| !i.is_empty()) {
                *l.uses.entry(i.clone()).or_default() += 1;
            }
        }
        *l.uses.entry(self.output_name.clone()).or_default() += 1;
        let mut dims = vec![batch];
        dims.extend_from_slice(&self.sample_dims);
        let input_buf = l.new_buf(&dims)?;
        l.vals.insert(self.input_name.clone(), Val::Act { buf: input_buf, dims: dims.clone() });
        for node in &self.graph.node {
            l.node(node)?;
        }
        let (out_buf, out_dims) = match l.vals.get(&self.output_name) {
            Some(Val::Act { buf, dims }) => (*buf, dims.clone()),
            Some(Val::Const(_)) => return Err(GraphError::Unsupported("a constant graph output".into())),
            None => return Err(GraphError::Model(format!("output '{}' is never produced", self.output_name))),
        };
        if out_buf == input_buf {
            return Err(GraphError::Unsupported("an output that is the input".into()));
        }
        place(batch, l.ops, &l.buf_lens, (input_buf, dims), (out_buf, out_dims))
    }
}

/// Lowering state.
#[derive(Default)]
pub struct Lowering {
    /// Default-domain opset.
    pub opset: i64,
    /// Every named value so far.
    pub vals: HashMap<String, Val>,
    /// How many node inputs (and graph outputs) read each name.
    pub uses: HashMap<String, usize>,
    /// Emitted ops.
    pub ops: Vec<Op>,
    /// Activation buffer lengths, floats.
    pub buf_lens: Vec<u64>,
    /// For each buffer, the op that wrote it.
    pub writer: HashMap<usize, usize>,
}

impl Lowering {
    /// A fresh buffer for `dims`.
    pub fn new_buf(&mut self, dims: &[usize]) -> Result<usize, GraphError> {
        if dims.len() > MAX_RANK {
            return Err(GraphError::Unsupported(format!("a tensor of rank {}", dims.len())));
        }
        let n = dims.iter().try_fold(1u64, |n, &d| n.checked_mul(d as u64).filter(|&n| n <= 1 << 34));
        let n = n.filter(|&n| n > 0).ok_or_else(|| GraphError::Plan(format!("tensor of shape {dims:?}")))?;
        self.buf_lens.push(n);
        Ok(self.buf_lens.len() - 1)
    }

    /// Emits `op`, recording it as its buffer's writer.
    pub fn emit(&mut self, op: Op) {
        self.writer.insert(op.out, self.ops.len());
        self.ops.push(op);
    }

    /// Input `i` of `n` (`None` when absent or empty).
    pub fn input(&self, n: &NodeProto, i: usize) -> Result<Option<&Val>, GraphError> {
        match n.input.get(i).map(String::as_str) {
            None | Some("") => Ok(None),
            Some(name) => self.vals.get(name).map(Some).ok_or_else(|| {
                GraphError::Model(format!("{}: input '{name}' used before it is defined", node_name(n)))
            }),
        }
    }

    /// Input `i`, required.
    pub fn req(&self, n: &NodeProto, i: usize) -> Result<&Val, GraphError> {
        self.input(n, i)?
            .ok_or_else(|| GraphError::Model(format!("{}: missing input {i}", node_name(n))))
    }

    /// Input `i` as a runtime tensor `(buffer, dims)`.
    pub fn act(&self, n: &NodeProto, i: usize) -> Result<(usize, Vec<usize>), GraphError> {
        match self.req(n, i)? {
            Val::Act { buf, dims } => Ok((*buf, dims.clone())),
            Val::Const(_) => Err(GraphError::Unsupported(format!("{}: a constant data input", node_name(n)))),
        }
    }

    /// Input `i` as a constant.
    pub fn cst(&self, n: &NodeProto, i: usize) -> Result<Option<Tensor>, GraphError> {
        match self.input(n, i)? {
            None => Ok(None),
            Some(Val::Const(t)) => Ok(Some(t.clone())),
            Some(Val::Act { .. }) => Err(GraphError::Unsupported(format!(
                "{}: input {i} computed at run time (only constant weights and shapes)",
                node_name(n)
            ))),
        }
    }

    /// Binds output 0 of `n`.
    pub fn set_out(&mut self, n: &NodeProto, v: Val) -> Result<(), GraphError> {
        let name = n.output.first().ok_or_else(|| GraphError::Model(format!("{}: no output", node_name(n))))?;
        self.vals.insert(name.clone(), v);
        Ok(())
    }

    /// The op that wrote `buf` when `n`'s input 0 (that buffer) is read by
    /// `n` alone and that op is the latest one, of `kernel` (so `n` can be
    /// folded into it).
    pub fn fusable(&self, n: &NodeProto, buf: usize, kernel: Kernel) -> Option<usize> {
        let name = n.input.first()?;
        let w = *self.writer.get(&buf)?;
        (self.uses.get(name) == Some(&1) && w + 1 == self.ops.len() && self.ops[w].kernel == kernel)
            .then_some(w)
    }

    /// Lowers one node.
    fn node(&mut self, n: &NodeProto) -> Result<(), GraphError> {
        if !matches!(n.domain.as_deref(), None | Some("") | Some("ai.onnx")) {
            return Err(GraphError::Unsupported(format!("{}: domain '{}'", node_name(n), n.domain.as_deref().unwrap_or(""))));
        }
        let op = n.op_type.as_deref().unwrap_or("");
        match op {
            "Constant" => {
                let t = attr(n, "value").and_then(|a| a.t.as_ref()).ok_or_else(|| {
                    GraphError::Unsupported(format!("{}: Constant without a tensor 'value'", node_name(n)))
                })?;
                let t = Tensor::from_proto(t)?;
                self.set_out(n, Val::Const(t))
            }
            "Identity" | "Dropout" => {
                let v = self.req(n, 0)?.clone();
                self.set_out(n, v)
            }
            "Shape" => {
                let dims = match self.req(n, 0)? {
                    Val::Const(t) => t.dims.clone(),
                    Val::Act { dims, .. } => dims.clone(),
                };
                let t = Tensor { dims: vec![dims.len()], data: Data::I64(dims.iter().map(|&d| d as i64).collect()) };
                self.set_out(n, Val::Const(t))
            }
            "Cast" => ops::cast(self, n),
            "Slice" => ops::slice(self, n),
            "Concat" => ops::concat(self, n),
            "Reshape" | "Flatten" => ops::reshape(self, n),
            "Conv" => ops::conv(self, n),
            "BatchNormalization" => ops::batch_norm(self, n),
            "Relu" | "Clip" | "HardSigmoid" => ops::unary(self, n, op),
            "Add" | "Sub" | "Mul" | "Div" => ops::binary(self, n, op),
            "MaxPool" | "AveragePool" | "GlobalAveragePool" => ops::pool(self, n, op),
            "MatMul" => ops::matmul(self, n),
            "Softmax" => ops::softmax(self, n),
            "Transpose" => ops::transpose(self, n),
            other => Err(GraphError::Unsupported(format!("{}: op {other}", node_name(n)))),
        }
    }
}

/// A node's name for errors: its name, else its op and first output.
pub fn node_name(n: &NodeProto) -> String {
    let op = n.op_type.as_deref().unwrap_or("?");
    match n.name.as_deref() {
        Some(name) if !name.is_empty() => format!("{op} node '{name}'"),
        _ => format!("{op} node -> '{}'", n.output.first().map(String::as_str).unwrap_or("")),
    }
}

/// Attribute `name` of `n`.
pub fn attr<'a>(n: &'a NodeProto, name: &str) -> Option<&'a AttributeProto> {
    n.attribute.iter().find(|a| a.name.as_deref() == Some(name))
}

/// Integer attribute with a default.
pub fn attr_i(n: &NodeProto, name: &str, default: i64) -> i64 {
    attr(n, name).and_then(|a| a.i).unwrap_or(default)
}

/// Float attribute with a default.
pub fn attr_f(n: &NodeProto, name: &str, default: f32) -> f32 {
    attr(n, name).and_then(|a| a.f).unwrap_or(default)
}

/// Integer-list attribute (empty when absent).
pub fn attr_ints<'a>(n: &'a NodeProto, name: &str) -> &'a [i64] {
    attr(n, name).map(|a| a.ints.as_slice()).unwrap_or(&[])
}

/// Refuses attribute `name` unless absent or one of `ok` (as a string).
pub fn attr_str_in(n: &NodeProto, name: &str, ok: &[&str]) -> Result<(), GraphError> {
    match attr(n, name).and_then(|a| a.s.as_deref()) {
        None => Ok(()),
        Some(s) if ok.iter().any(|o| o.as_bytes() == s) => Ok(()),
        Some(s) => Err(GraphError::Unsupported(format!(
            "{}: {name}={}",
            node_name(n),
            String::from_utf8_lossy(s)
        ))),
    }
}
