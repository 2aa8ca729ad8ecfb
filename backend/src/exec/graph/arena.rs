//! Lowered ops before placement, and their placement in one arena: the
//! weights are packed first (in op order, so every batch size of a model
//! gets the same weight image), then each activation buffer takes the
//! smallest dead buffer that fits or fresh space at the end.

use super::plan::{Kernel, Launch, Plan, SymArgs, ARG_FLOATS, ARG_INTS};
use super::GraphError;

/// Where an offset argument points before placement.
#[derive(Clone, Debug, PartialEq)]
pub enum Loc {
    /// An activation buffer, by id.
    Buf(usize),
    /// A constant, packed into the weights.
    Const(Vec<f32>),
}

/// One kernel launch with symbolic offsets.
#[derive(Clone, Debug)]
pub struct Op {
    /// The kernel.
    pub kernel: Kernel,
    /// Integer arguments; those named in `locs` are filled at placement.
    pub ints: [i64; ARG_INTS],
    /// Float arguments.
    pub floats: [f32; ARG_FLOATS],
    /// `(argument index, what it points at)`.
    pub locs: Vec<(usize, Loc)>,
    /// The buffer it writes.
    pub out: usize,
}

impl Op {
    /// An op of `kernel` over `n` output elements writing buffer `out`.
    pub fn new(kernel: Kernel, n: u64, out: usize) -> Op {
        let mut ints = [0i64; ARG_INTS];
        ints[0] = n as i64;
        Op { kernel, ints, floats: [0.0; ARG_FLOATS], locs: Vec::new(), out }
    }

    /// Sets integer arguments from `at` on.
    pub fn set(&mut self, at: usize, vals: &[i64]) -> &mut Op {
        self.ints[at..at + vals.len()].copy_from_slice(vals);
        self
    }

    /// Points argument `at` at `loc`.
    pub fn at(&mut self, at: usize, loc: Loc) -> &mut Op {
        self.locs.push((at, loc));
        self
    }
}

/// Largest arena a plan may need, in floats (16 GiB): a hostile graph's
/// shapes stop here, before anything is allocated.
pub const MAX_ARENA_FLOATS: u64 = 1 << 32;

/// Places `ops` over buffers of `buf_lens` floats: `input` is written before
/// the first op, `output` must survive the last.
pub fn place(
    batch: usize,
    ops: Vec<Op>,
    buf_lens: &[u64],
    input: (usize, Vec<usize>),
    output: (usize, Vec<usize>),
) -> Result<Plan, GraphError> {
    let nb = buf_lens.len();
    let mut last_use = vec![0usize; nb];
    for (i, op) in ops.iter().enumerate() {
        for (_, loc) in &op.locs {
            if let Loc::Buf(b) = loc {
                last_use[*b] = last_use[*b].max(i);
            }
        }
    }
    last_use[output.0] = usize::MAX;
    let mut weights = Vec::new();
    for op in &ops {
        for (_, loc) in &op.locs {
            if let Loc::Const(v) = loc {
                weights.extend_from_slice(v);
            }
        }
    }
    let mut end = weights.len() as u64;
    let mut at: Vec<Option<u64>> = vec![None; nb];
    let mut free: Vec<(u64, u64)> = Vec::new();
    let alloc = |len: u64, free: &mut Vec<(u64, u64)>, end: &mut u64| {
        let best = (0..free.len()).filter(|&j| free[j].1 >= len).min_by_key(|&j| free[j].1);
        match best {
            Some(j) => free.swap_remove(j).0,
            None => {
                *end += len;
                *end - len
            }
        }
    };
    at[input.0] = Some(alloc(buf_lens[input.0], &mut free, &mut end));
    let mut launches = Vec::with_capacity(ops.len());
    let mut wpos = 0u64;
    for (i, op) in ops.into_iter().enumerate() {
        if at[op.out].is_none() {
            at[op.out] = Some(alloc(buf_lens[op.out], &mut free, &mut end));
        }
        let mut args = SymArgs { i: op.ints, f: op.floats };
        let mut touches = Vec::with_capacity(op.locs.len() + 1);
        for (arg, loc) in &op.locs {
            let (off, len) = match loc {
                Loc::Buf(b) => (at[*b].ok_or_else(|| GraphError::Plan(format!("buffer {b} read before written")))?, buf_lens[*b]),
                Loc::Const(v) => {
                    wpos += v.len() as u64;
                    (wpos - v.len() as u64, v.len() as u64)
                }
            };
            args.i[*arg] = off as i64;
            touches.push((off, len));
        }
        let out_off = at[op.out].unwrap_or(0);
        touches.push((out_off, buf_lens[op.out]));
        launches.push(Launch { kernel: op.kernel, args, touches });
        for b in 0..nb {
            if last_use[b] == i && b != op.out {
                if let Some(off) = at[b] {
                    free.push((off, buf_lens[b]));
                }
            }
        }
    }
    if end > MAX_ARENA_FLOATS {
        return Err(GraphError::Plan(format!("an arena of {end} floats (at most {MAX_ARENA_FLOATS})")));
    }
    let out_off = at[output.0].ok_or_else(|| GraphError::Plan("the output is never written".into()))?;
    let plan = Plan {
        batch,
        weights,
        arena_len: end,
        input: (at[input.0].unwrap_or(0), input.1),
        output: (out_off, output.1),
        launches,
    };
    plan.validate()?;
    Ok(plan)
}
