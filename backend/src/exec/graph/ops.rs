//! Lowering of each supported ONNX op (see [`super::lower`]).

use super::arena::{Loc, Op};
use super::state::{attr, attr_f, attr_i, attr_ints, attr_str_in, node_name, Lowering, Val};
use super::plan::{elements, Kernel};
use super::proto::{AttributeProto, Data, NodeProto, Tensor, MAX_RANK};
use super::GraphError;

fn unsupported(n: &NodeProto, what: impl std::fmt::Display) -> GraphError {
    GraphError::Unsupported(format!("{}: {what}", node_name(n)))
}

fn bad(n: &NodeProto, what: impl std::fmt::Display) -> GraphError {
    GraphError::Model(format!("{}: {what}", node_name(n)))
}

/// `Cast`: of constants to float or integers; of a float tensor to float.
pub fn cast(l: &mut Lowering, n: &NodeProto) -> Result<(), GraphError> {
    let to = attr_i(n, "to", 0);
    let v = match (l.req(n, 0)?.clone(), to) {
        (Val::Const(t), 1) => Val::Const(Tensor { data: Data::F32(t.floats()), dims: t.dims }),
        (Val::Const(t), 6 | 7) => Val::Const(Tensor { data: Data::I64(t.ints()), dims: t.dims }),
        (v @ Val::Act { .. }, 1) => v,
        (_, to) => return Err(unsupported(n, format_args!("Cast to type {to}"))),
    };
    l.set_out(n, v)
}

/// Normalises axis `a` of a rank-`r` tensor.
fn axis(n: &NodeProto, a: i64, r: usize) -> Result<usize, GraphError> {
    let r = r as i64;
    let a = if a < 0 { a + r } else { a };
    if (0..r.max(1)).contains(&a) {
        Ok(a as usize)
    } else {
        Err(bad(n, format_args!("axis {a} for rank {r}")))
    }
}

/// `Slice` of a 1-D constant (the shape subgraph).
pub fn slice(l: &mut Lowering, n: &NodeProto) -> Result<(), GraphError> {
    let t = l.cst(n, 0)?.ok_or_else(|| bad(n, "no data"))?;
    if t.dims.len() != 1 {
        return Err(unsupported(n, "Slice of other than a 1-D constant"));
    }
    let (starts, ends, axes, steps) = if l.opset >= 10 {
        let get = |i: usize| -> Result<Option<Vec<i64>>, GraphError> { Ok(l.cst(n, i)?.map(|t| t.ints())) };
        (get(1)?.unwrap_or_default(), get(2)?.unwrap_or_default(), get(3)?, get(4)?)
    } else {
        let axes = attr(n, "axes").map(|a| a.ints.clone());
        (attr_ints(n, "starts").to_vec(), attr_ints(n, "ends").to_vec(), axes, None)
    };
    let (&[start], &[end]) = (starts.as_slice(), ends.as_slice()) else {
        return Err(unsupported(n, "Slice over more than one axis"));
    };
    if axes.is_some_and(|a| a.as_slice() != [0] && a.as_slice() != [-1]) || steps.is_some_and(|s| s.as_slice() != [1]) {
        return Err(unsupported(n, "Slice with axes other than 0 or steps other than 1"));
    }
    let len = t.dims[0] as i64;
    let clamp = |v: i64| if v < 0 { (v + len).max(0) } else { v.min(len) } as usize;
    let (s, e) = (clamp(start), clamp(end).max(clamp(start)));
    let data = match t.data {
        Data::F32(v) => Data::F32(v[s..e].to_vec()),
        Data::I64(v) => Data::I64(v[s..e].to_vec()),
    };
    l.set_out(n, Val::Const(Tensor { dims: vec![e - s], data }))
}

/// `Concat` of 1-D constants (the shape subgraph).
pub fn concat(l: &mut Lowering, n: &NodeProto) -> Result<(), GraphError> {
    let mut out = Vec::new();
    for i in 0..n.input.len() {
        let t = l.cst(n, i)?.ok_or_else(|| bad(n, "an empty input"))?;
        if t.dims.len() != 1 {
            return Err(unsupported(n, "Concat of other than 1-D constants"));
        }
        out.extend(t.ints());
    }
    l.set_out(n, Val::Const(Tensor { dims: vec![out.len()], data: Data::I64(out) }))
}

/// `Reshape` (shape input, or the old `shape` attribute) and `Flatten`:
/// a new view of the same buffer.
pub fn reshape(l: &mut Lowering, n: &NodeProto) -> Result<(), GraphError> {
    let v = l.req(n, 0)?.clone();
    let dims = match &v {
        Val::Const(t) => t.dims.clone(),
        Val::Act { dims, .. } => dims.clone(),
    };
    let total = elements(&dims);
    let new: Vec<usize> = if n.op_type.as_deref() == Some("Flatten") {
        let a = axis(n, attr_i(n, "axis", 1), dims.len() + 1)?;
        let head = elements(&dims[..a.min(dims.len())]);
        vec![head as usize, (total / head.max(1)) as usize]
    } else {
        let shape = match l.cst(n, 1)? {
            Some(t) => t.ints(),
            None => attr_ints(n, "shape").to_vec(),
        };
        target_shape(n, &dims, &shape)?
    };
    if elements(&new) != total {
        return Err(bad(n, format_args!("reshape of {dims:?} to {new:?}")));
    }
    let out = match v {
        Val::Const(t) => Val::Const(Tensor { dims: new, data: t.data }),
        Val::Act { buf, .. } => Val::Act { buf, dims: new },
    };
    l.set_out(n, out)
}

/// Reshape's target: 0 copies the input's dimension, -1 takes the rest.
fn target_shape(n: &NodeProto, dims: &[usize], shape: &[i64]) -> Result<Vec<usize>, GraphError> {
    if shape.len() > MAX_RANK || shape.iter().filter(|&&d| d == -1).count() > 1 {
        return Err(bad(n, format_args!("shape {shape:?}")));
    }
    let total = elements(dims);
    let mut out = Vec::with_capacity(shape.len());
    for (i, &d) in shape.iter().enumerate() {
        out.push(match d {
            0 => *dims.get(i).ok_or_else(|| bad(n, "0 past the input's rank"))?,
            -1 => 1,
            d if d > 0 && d <= 1 << 32 => d as usize,
            d => return Err(bad(n, format_args!("dimension {d}"))),
        });
    }
    if let Some(i) = shape.iter().position(|&d| d == -1) {
        let known = elements(&out);
        if known == 0 || !total.is_multiple_of(known) {
            return Err(bad(n, format_args!("cannot infer -1 reshaping {dims:?} to {shape:?}")));
        }
        out[i] = (total / known) as usize;
    }
    Ok(out)
}

/// A spatial attribute pair (defaults `d`), checked positive.
fn pair(n: &NodeProto, name: &str, d: i64) -> Result<[i64; 2], GraphError> {
    match attr_ints(n, name) {
        [] => Ok([d, d]),
        &[a, b] if a > 0 && b > 0 && a <= 1 << 16 && b <= 1 << 16 => Ok([a, b]),
        v => Err(unsupported(n, format_args!("{name}={v:?} (2-D, positive)"))),
    }
}

/// Pads `[top, left, bottom, right]`.
fn pads(n: &NodeProto) -> Result<[i64; 4], GraphError> {
    attr_str_in(n, "auto_pad", &["NOTSET"])?;
    match attr_ints(n, "pads") {
        [] => Ok([0; 4]),
        &[t, l, b, r] if [t, l, b, r].iter().all(|&p| (0..1 << 16).contains(&p)) => Ok([t, l, b, r]),
        v => Err(unsupported(n, format_args!("pads={v:?}"))),
    }
}

/// Output length of a window `k` (dilated) over `len` padded by `p0 + p1`.
fn out_len(n: &NodeProto, len: usize, k: i64, s: i64, p0: i64, p1: i64, ceil: bool) -> Result<usize, GraphError> {
    let span = len as i64 + p0 + p1 - k;
    if span < 0 {
        return Err(bad(n, "window larger than the padded input"));
    }
    let mut o = if ceil { (span + s - 1) / s + 1 } else { span / s + 1 };
    if ceil && (o - 1) * s >= len as i64 + p0 {
        o -= 1;
    }
    Ok(o as usize)
}

/// A 4-D runtime input.
fn nchw(l: &Lowering, n: &NodeProto) -> Result<(usize, [usize; 4]), GraphError> {
    let (buf, dims) = l.act(n, 0)?;
    let d: [usize; 4] = dims.as_slice().try_into().map_err(|_| unsupported(n, format_args!("input of rank {} (NCHW only)", dims.len())))?;
    Ok((buf, d))
}

/// `Conv` (2-D, any groups, pads, strides, dilations) with its bias.
pub fn conv(l: &mut Lowering, n: &NodeProto) -> Result<(), GraphError> {
    let (x, [b, c, h, w]) = nchw(l, n)?;
    let wt = l.cst(n, 1)?.ok_or_else(|| bad(n, "no weights"))?;
    let bias = l.cst(n, 2)?;
    let g = attr_i(n, "group", 1);
    let [k, cpg, kh, kw]: [usize; 4] = wt.dims.as_slice().try_into().map_err(|_| unsupported(n, "weights of rank other than 4"))?;
    if g <= 0 || !c.is_multiple_of(g as usize) || cpg * g as usize != c || !k.is_multiple_of(g as usize) {
        return Err(bad(n, format_args!("group {g} with {c} input channels, weights {:?}", wt.dims)));
    }
    if bias.as_ref().is_some_and(|t| t.len() != k) {
        return Err(bad(n, "bias length differs from the output channels"));
    }
    let ks = attr_ints(n, "kernel_shape");
    if !ks.is_empty() && ks != [kh as i64, kw as i64] {
        return Err(bad(n, "kernel_shape differs from the weights"));
    }
    let ([sh, sw], [dh, dw], [pt, pl, pb, pr]) = (pair(n, "strides", 1)?, pair(n, "dilations", 1)?, pads(n)?);
    let oh = out_len(n, h, (kh as i64 - 1) * dh + 1, sh, pt, pb, false)?;
    let ow = out_len(n, w, (kw as i64 - 1) * dw + 1, sw, pl, pr, false)?;
    let dims = vec![b, k, oh, ow];
    let out = l.new_buf(&dims)?;
    let mut op = Op::new(Kernel::Conv, elements(&dims), out);
    op.set(1, &[c, h, w, k, oh, ow, kh, kw].map(|v| v as i64))
        .set(9, &[sh, sw, pt, pl, dh, dw, g])
        .set(18, &[-1])
        .set(20, &[0])
        .at(16, Loc::Buf(x))
        .at(17, Loc::Const(wt.floats()))
        .at(19, Loc::Buf(out));
    if let Some(bias) = bias {
        op.at(18, Loc::Const(bias.floats()));
    }
    l.emit(op);
    l.set_out(n, Val::Act { buf: out, dims })
}

/// `BatchNormalization` (inference): folded into the Conv before it when
/// that Conv's output feeds nothing else, else a per-channel affine map.
pub fn batch_norm(l: &mut Lowering, n: &NodeProto) -> Result<(), GraphError> {
    let (x, dims) = l.act(n, 0)?;
    let c = *dims.get(1).ok_or_else(|| unsupported(n, "input of rank < 2"))?;
    let eps = attr_f(n, "epsilon", 1e-5);
    let mut p = Vec::with_capacity(4);
    for i in 1..5 {
        let t = l.cst(n, i)?.ok_or_else(|| bad(n, format_args!("missing input {i}")))?;
        if t.len() != c {
            return Err(bad(n, format_args!("input {i} of {} values for {c} channels", t.len())));
        }
        p.push(t.floats());
    }
    let scale: Vec<f32> = (0..c).map(|j| p[0][j] / (p[3][j] + eps).sqrt()).collect();
    let shift: Vec<f32> = (0..c).map(|j| p[1][j] - p[2][j] * scale[j]).collect();
    if let Some(w) = l.fusable(n, x, Kernel::Conv).filter(|&w| l.ops[w].ints[20] == 0) {
        fold_into_conv(&mut l.ops[w], &scale, &shift);
        return l.set_out(n, Val::Act { buf: x, dims });
    }
    let out = l.new_buf(&dims)?;
    let inner = elements(&dims[2..]) as i64;
    let mut op = Op::new(Kernel::ChannelAffine, elements(&dims), out);
    op.set(1, &[c as i64, inner])
        .at(3, Loc::Buf(x))
        .at(4, Loc::Const(scale))
        .at(5, Loc::Const(shift))
        .at(6, Loc::Buf(out));
    l.emit(op);
    l.set_out(n, Val::Act { buf: out, dims })
}

/// Scales each output channel's filter and rewrites the bias:
/// `bn(conv(x)) = conv_{w * s}(x) + (b * s + t)`.
fn fold_into_conv(op: &mut Op, scale: &[f32], shift: &[f32]) {
    let k = scale.len();
    let mut bias = vec![0.0f32; k];
    for (arg, loc) in op.locs.iter_mut() {
        match (*arg, loc) {
            (17, Loc::Const(w)) => {
                let per = w.len() / k.max(1);
                for (j, chunk) in w.chunks_mut(per.max(1)).enumerate().take(k) {
                    chunk.iter_mut().for_each(|v| *v *= scale[j]);
                }
            }
            (18, Loc::Const(b)) => bias.copy_from_slice(b),
            _ => {}
        }
    }
    for j in 0..k {
        bias[j] = bias[j] * scale[j] + shift[j];
    }
    op.locs.retain(|(arg, _)| *arg != 18);
    op.at(18, Loc::Const(bias));
}

/// `Relu` (folded into a Conv before it where possible), `Clip`, `HardSigmoid`.
pub fn unary(l: &mut Lowering, n: &NodeProto, op_type: &str) -> Result<(), GraphError> {
    let (x, dims) = l.act(n, 0)?;
    let (code, f0, f1) = match op_type {
        "Relu" => {
            if let Some(w) = l.fusable(n, x, Kernel::Conv).filter(|&w| l.ops[w].ints[20] == 0) {
                l.ops[w].ints[20] = 1;
                return l.set_out(n, Val::Act { buf: x, dims });
            }
            (0, 0.0, 0.0)
        }
        "Clip" if l.opset >= 11 => {
            let bound = |t: Option<Tensor>, d: f32| t.and_then(|t| t.floats().first().copied()).unwrap_or(d);
            (1, bound(l.cst(n, 1)?, f32::MIN), bound(l.cst(n, 2)?, f32::MAX))
        }
        "Clip" => (1, attr_f(n, "min", f32::MIN), attr_f(n, "max", f32::MAX)),
        _ => (2, attr_f(n, "alpha", 0.2), attr_f(n, "beta", 0.5)),
    };
    let out = l.new_buf(&dims)?;
    let mut op = Op::new(Kernel::Unary, elements(&dims), out);
    op.set(1, &[code]).at(2, Loc::Buf(x)).at(3, Loc::Buf(out));
    op.floats[0] = f0;
    op.floats[1] = f1;
    l.emit(op);
    l.set_out(n, Val::Act { buf: out, dims })
}

/// Row-major strides of `dims` padded on the left to rank 6, 0 where the
/// dimension is broadcast to `out`.
fn bcast_strides(dims: &[usize], out: &[usize; MAX_RANK]) -> [i64; MAX_RANK] {
    let mut padded = [1usize; MAX_RANK];
    padded[MAX_RANK - dims.len()..].copy_from_slice(dims);
    let mut s = [0i64; MAX_RANK];
    let mut acc = 1i64;
    for d in (0..MAX_RANK).rev() {
        s[d] = if padded[d] == 1 && out[d] != 1 { 0 } else { acc };
        acc *= padded[d] as i64;
    }
    s
}

/// Numpy broadcasting of two shapes.
fn broadcast(n: &NodeProto, a: &[usize], b: &[usize]) -> Result<Vec<usize>, GraphError> {
    let r = a.len().max(b.len());
    if r > MAX_RANK {
        return Err(unsupported(n, format_args!("rank {r}")));
    }
    let at = |v: &[usize], i: usize| if i + v.len() >= r { v[i + v.len() - r] } else { 1 };
    (0..r)
        .map(|i| match (at(a, i), at(b, i)) {
            (x, y) if x == y || y == 1 => Ok(x),
            (1, y) => Ok(y),
            (x, y) => Err(bad(n, format_args!("cannot broadcast {x} with {y}"))),
        })
        .collect()
}

/// `Add`, `Sub`, `Mul`, `Div`: folded when both sides are constant
/// (shape arithmetic), else one broadcasting launch.
pub fn binary(l: &mut Lowering, n: &NodeProto, op_type: &str) -> Result<(), GraphError> {
    let code = match op_type {
        "Add" => 0,
        "Sub" => 1,
        "Mul" => 2,
        _ => 3,
    };
    let (a, b) = (l.req(n, 0)?.clone(), l.req(n, 1)?.clone());
    if let (Val::Const(x), Val::Const(y)) = (&a, &b) {
        return fold_binary(l, n, code, x, y);
    }
    let side = |v: &Val| match v {
        Val::Const(t) => (Loc::Const(t.floats()), t.dims.clone()),
        Val::Act { buf, dims } => (Loc::Buf(*buf), dims.clone()),
    };
    let ((la, da), (lb, db)) = (side(&a), side(&b));
    let dims = broadcast(n, &da, &db)?;
    let mut out6 = [1usize; MAX_RANK];
    out6[MAX_RANK - dims.len()..].copy_from_slice(&dims);
    let out = l.new_buf(&dims)?;
    let mut op = Op::new(Kernel::Binary, elements(&dims), out);
    op.set(1, &[code])
        .set(5, &out6.map(|d| d as i64))
        .set(11, &bcast_strides(&da, &out6))
        .set(17, &bcast_strides(&db, &out6))
        .at(2, la)
        .at(3, lb)
        .at(4, Loc::Buf(out));
    l.emit(op);
    l.set_out(n, Val::Act { buf: out, dims })
}

/// Constant arithmetic, elementwise on equal shapes or with a scalar.
fn fold_binary(l: &mut Lowering, n: &NodeProto, code: i64, x: &Tensor, y: &Tensor) -> Result<(), GraphError> {
    let dims = if x.len() >= y.len() { x.dims.clone() } else { y.dims.clone() };
    let len = x.len().max(y.len());
    if !(x.len() == y.len() || x.len() == 1 || y.len() == 1) {
        return Err(unsupported(n, "constant arithmetic other than elementwise or with a scalar"));
    }
    let pick = |t: &Tensor, i: usize| if t.len() == 1 { 0 } else { i };
    let data = match (&x.data, &y.data) {
        (Data::I64(u), Data::I64(v)) => Data::I64(
            (0..len)
                .map(|i| {
                    let (p, q) = (u[pick(x, i)], v[pick(y, i)]);
                    match code {
                        0 => p.wrapping_add(q),
                        1 => p.wrapping_sub(q),
                        2 => p.wrapping_mul(q),
                        _ => p.checked_div(q).unwrap_or(0),
                    }
                })
                .collect(),
        ),
        _ => {
            let (u, v) = (x.floats(), y.floats());
            Data::F32(
                (0..len)
                    .map(|i| {
                        let (p, q) = (u[pick(x, i)], v[pick(y, i)]);
                        [p + q, p - q, p * q, p / q][code as usize]
                    })
                    .collect(),
            )
        }
    };
    l.set_out(n, Val::Const(Tensor { dims, data }))
}

/// `MaxPool`, `AveragePool`, `GlobalAveragePool`.
pub fn pool(l: &mut Lowering, n: &NodeProto, op_type: &str) -> Result<(), GraphError> {
    let (x, [b, c, h, w]) = nchw(l, n)?;
    let (kind, [kh, kw], [sh, sw], [pt, pl, pb, pr], ceil) = if op_type == "GlobalAveragePool" {
        (1, [h as i64, w as i64], [1, 1], [0; 4], false)
    } else {
        if attr_ints(n, "dilations").iter().any(|&d| d != 1) {
            return Err(unsupported(n, "pooling dilations"));
        }
        let kind = match op_type {
            "MaxPool" => 0,
            _ if attr_i(n, "count_include_pad", 0) != 0 => 2,
            _ => 1,
        };
        if attr(n, "kernel_shape").is_none_or(|a: &AttributeProto| a.ints.len() != 2) {
            return Err(unsupported(n, "kernel_shape other than 2-D"));
        }
        (kind, pair(n, "kernel_shape", 1)?, pair(n, "strides", 1)?, pads(n)?, attr_i(n, "ceil_mode", 0) != 0)
    };
    let oh = out_len(n, h, kh, sh, pt, pb, ceil)?;
    let ow = out_len(n, w, kw, sw, pl, pr, ceil)?;
    let dims = vec![b, c, oh, ow];
    let out = l.new_buf(&dims)?;
    let mut op = Op::new(Kernel::Pool, elements(&dims), out);
    op.set(1, &[c as i64, h as i64, w as i64, oh as i64, ow as i64, kh, kw, sh, sw, pt, pl])
        .set(14, &[kind])
        .at(12, Loc::Buf(x))
        .at(13, Loc::Buf(out));
    l.emit(op);
    l.set_out(n, Val::Act { buf: out, dims })
}

/// `MatMul` of a runtime `[..., K]` by constant `[K, N]` weights.
pub fn matmul(l: &mut Lowering, n: &NodeProto) -> Result<(), GraphError> {
    let (x, xd) = l.act(n, 0)?;
    let wt = l.cst(n, 1)?.ok_or_else(|| bad(n, "no weights"))?;
    let (&[kk, nn], Some(&k)) = (wt.dims.as_slice(), xd.last()) else {
        return Err(unsupported(n, "MatMul other than [.., K] x constant [K, N]"));
    };
    if k != kk {
        return Err(bad(n, format_args!("inner dimensions {k} and {kk}")));
    }
    let mut dims = xd.clone();
    *dims.last_mut().unwrap_or(&mut 0) = nn;
    let out = l.new_buf(&dims)?;
    let mut op = Op::new(Kernel::MatMul, elements(&dims), out);
    op.set(1, &[k as i64, nn as i64, 0, 0, 0, -1])
        .at(3, Loc::Buf(x))
        .at(4, Loc::Const(wt.floats()))
        .at(5, Loc::Buf(out));
    l.emit(op);
    l.set_out(n, Val::Act { buf: out, dims })
}

/// `Softmax` over the dimensions from `axis` on (opset < 13), or over the
/// last (opset >= 13 with the last axis).
pub fn softmax(l: &mut Lowering, n: &NodeProto) -> Result<(), GraphError> {
    let (x, dims) = l.act(n, 0)?;
    let default = if l.opset >= 13 { -1 } else { 1 };
    let a = axis(n, attr_i(n, "axis", default), dims.len())?;
    if l.opset >= 13 && a + 1 != dims.len() {
        return Err(unsupported(n, "Softmax (opset 13) over an axis other than the last"));
    }
    let row = elements(&dims[a..]);
    let out = l.new_buf(&dims)?;
    let mut op = Op::new(Kernel::Softmax, elements(&dims), out);
    op.set(1, &[row as i64]).at(2, Loc::Buf(x)).at(3, Loc::Buf(out));
    l.emit(op);
    l.set_out(n, Val::Act { buf: out, dims })
}

/// `Transpose` of a runtime tensor.
pub fn transpose(l: &mut Lowering, n: &NodeProto) -> Result<(), GraphError> {
    let (x, dims) = l.act(n, 0)?;
    let r = dims.len();
    let perm: Vec<usize> = match attr_ints(n, "perm") {
        [] => (0..r).rev().collect(),
        p => p.iter().map(|&a| axis(n, a, r)).collect::<Result<_, _>>()?,
    };
    let mut seen = [false; MAX_RANK];
    if perm.len() != r || perm.iter().any(|&p| std::mem::replace(&mut seen[p], true)) {
        return Err(bad(n, format_args!("perm {perm:?} for rank {r}")));
    }
    let mut in_strides = vec![1i64; r];
    for d in (0..r.saturating_sub(1)).rev() {
        in_strides[d] = in_strides[d + 1] * dims[d + 1] as i64;
    }
    let odims: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
    let (mut od6, mut st6) = ([1i64; MAX_RANK], [0i64; MAX_RANK]);
    for (j, &p) in perm.iter().enumerate() {
        od6[MAX_RANK - r + j] = dims[p] as i64;
        st6[MAX_RANK - r + j] = in_strides[p];
    }
    let out = l.new_buf(&odims)?;
    let mut op = Op::new(Kernel::Transpose, elements(&odims), out);
    op.set(3, &od6).set(9, &st6).at(1, Loc::Buf(x)).at(2, Loc::Buf(out));
    l.emit(op);
    l.set_out(n, Val::Act { buf: out, dims: odims })
}
