//! ONNX graph -> [`Plan`] for one batch size. The shape subgraph
//! (Shape, Cast, Slice, Concat, Reshape, Constant, Identity, arithmetic on
//! constants) is folded to constants; BatchNormalization and Relu after a
//! Conv whose output nothing else reads are folded into it; every other op
//! becomes one launch of a kernels.cu function. Any op, attribute or shape
//! outside what the kernels do is an error naming it.

use super::arena::place;
use super::plan::{elements, Plan};
use super::proto::{self, Data, GraphProto, NodeProto, Tensor, MAX_RANK};
use super::state::{attr, node_name, Lowering, Val};
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
        for n in &self.graph.node {
            lower_node(&mut l, n)?;
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

/// Lowers one node.
fn lower_node(l: &mut Lowering, n: &NodeProto) -> Result<(), GraphError> {
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
            l.set_out(n, Val::Const(t))
        }
        "Identity" | "Dropout" => {
            let v = l.req(n, 0)?.clone();
            l.set_out(n, v)
        }
        "Shape" => {
            let dims = match l.req(n, 0)? {
                Val::Const(t) => t.dims.clone(),
                Val::Act { dims, .. } => dims.clone(),
            };
            let t = Tensor { dims: vec![dims.len()], data: Data::I64(dims.iter().map(|&d| d as i64).collect()) };
            l.set_out(n, Val::Const(t))
        }
        "Cast" => ops::cast(l, n),
        "Slice" => ops::slice(l, n),
        "Concat" => ops::concat(l, n),
        "Reshape" | "Flatten" => ops::reshape(l, n),
        "Conv" => ops::conv(l, n),
        "BatchNormalization" => ops::batch_norm(l, n),
        "Relu" | "Clip" | "HardSigmoid" => ops::unary(l, n, op),
        "Add" | "Sub" | "Mul" | "Div" => ops::binary(l, n, op),
        "MaxPool" | "AveragePool" | "GlobalAveragePool" => ops::pool(l, n, op),
        "MatMul" => ops::matmul(l, n),
        "Softmax" => ops::softmax(l, n),
        "Transpose" => ops::transpose(l, n),
        other => Err(GraphError::Unsupported(format!("{}: op {other}", node_name(n)))),
    }
}
