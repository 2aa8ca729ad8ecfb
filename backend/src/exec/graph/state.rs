//! The state of one lowering ([`super::lower`]) and the node-attribute
//! helpers every op's lowering ([`super::ops`]) uses.

use std::collections::HashMap;

use super::arena::Op;
use super::plan::Kernel;
use super::proto::{AttributeProto, NodeProto, Tensor, MAX_RANK};
use super::GraphError;

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
        let n = dims.iter().try_fold(1u64, |n, &d| n.checked_mul(d as u64).filter(|&n| n <= super::arena::MAX_ARENA_FLOATS));
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
