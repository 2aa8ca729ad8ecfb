//! A lowered model: one arena of f32 (the weights first, then the
//! activations, dead buffers reused) and the kernel launches that run it.
//! The same plan drives the CPU runner ([`super::cpu`]) and the GPU
//! ([`crate::exec::cuda`]); both launch `kernels.cu`'s functions with the
//! arguments here, so a plan checked on the CPU runs the same way there.

use super::GraphError;

/// Integer arguments per launch (`SymArgs.i` in kernels.cu).
pub const ARG_INTS: usize = 28;
/// Float arguments per launch (`SymArgs.f`).
pub const ARG_FLOATS: usize = 4;
/// Threads per block of every launch.
pub const THREADS: u32 = 256;

/// `SymArgs` in kernels.cu, passed by value to every kernel.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SymArgs {
    /// Element count (`i[0]`), shapes and arena offsets (in floats).
    pub i: [i64; ARG_INTS],
    /// Float parameters (clip bounds, hard-sigmoid slope and offset).
    pub f: [f32; ARG_FLOATS],
}

/// The kernels of kernels.cu, in the order of cpu_shim.cpp's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Kernel {
    /// `sym_conv`.
    Conv = 0,
    /// `sym_pool`.
    Pool = 1,
    /// `sym_binary`.
    Binary = 2,
    /// `sym_unary`.
    Unary = 3,
    /// `sym_channel_affine`.
    ChannelAffine = 4,
    /// `sym_matmul`.
    MatMul = 5,
    /// `sym_softmax`.
    Softmax = 6,
    /// `sym_transpose`.
    Transpose = 7,
}

impl Kernel {
    /// Every kernel, by id.
    pub const ALL: [Kernel; 8] = [
        Kernel::Conv,
        Kernel::Pool,
        Kernel::Binary,
        Kernel::Unary,
        Kernel::ChannelAffine,
        Kernel::MatMul,
        Kernel::Softmax,
        Kernel::Transpose,
    ];

    /// The CUDA C function's name in kernels.cu.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Conv => "sym_conv",
            Kernel::Pool => "sym_pool",
            Kernel::Binary => "sym_binary",
            Kernel::Unary => "sym_unary",
            Kernel::ChannelAffine => "sym_channel_affine",
            Kernel::MatMul => "sym_matmul",
            Kernel::Softmax => "sym_softmax",
            Kernel::Transpose => "sym_transpose",
        }
    }
}

/// One kernel launch.
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    /// Which kernel.
    pub kernel: Kernel,
    /// Its arguments (offsets resolved).
    pub args: SymArgs,
    /// The arena ranges `(offset, len)` in floats it reads or writes; the
    /// kernel's indexing stays inside them (lowering computes both from
    /// the same shapes) and [`Plan::validate`] checks them against the arena.
    pub touches: Vec<(u64, u64)>,
}

impl Launch {
    /// Output elements, one thread each.
    pub fn elements(&self) -> u64 {
        self.args.i[0].max(0) as u64
    }

    /// `(blocks, threads per block)`.
    pub fn grid(&self) -> (u32, u32) {
        let blocks = self.elements().div_ceil(u64::from(THREADS));
        (u32::try_from(blocks).unwrap_or(u32::MAX), THREADS)
    }
}

/// A model lowered for one batch size.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Batch size.
    pub batch: usize,
    /// The weights, at arena offset 0 (the same for every batch size of a model).
    pub weights: Vec<f32>,
    /// Arena length in floats (weights included).
    pub arena_len: u64,
    /// The graph input: arena offset and dims (batch first).
    pub input: (u64, Vec<usize>),
    /// The graph output: arena offset and dims (batch first).
    pub output: (u64, Vec<usize>),
    /// The launches, in order.
    pub launches: Vec<Launch>,
}

/// Elements of `dims`.
pub fn elements(dims: &[usize]) -> u64 {
    dims.iter().map(|&d| d as u64).product()
}

impl Plan {
    /// Input floats (whole batch).
    pub fn input_len(&self) -> u64 {
        elements(&self.input.1)
    }

    /// Output floats (whole batch).
    pub fn output_len(&self) -> u64 {
        elements(&self.output.1)
    }

    /// Checks that every launch, the input and the output stay inside the
    /// arena and that every grid fits one launch.
    pub fn validate(&self) -> Result<(), GraphError> {
        let inside = |off: u64, len: u64| off.checked_add(len).is_some_and(|e| e <= self.arena_len);
        if self.weights.len() as u64 > self.arena_len
            || !inside(self.input.0, self.input_len())
            || !inside(self.output.0, self.output_len())
        {
            return Err(GraphError::Plan("input, output or weights outside the arena".into()));
        }
        for (n, l) in self.launches.iter().enumerate() {
            if l.elements() == 0 || l.elements().div_ceil(u64::from(THREADS)) > u64::from(u32::MAX) {
                return Err(GraphError::Plan(format!("launch {n} ({}): bad grid", l.kernel.name())));
            }
            if let Some(&(off, len)) = l.touches.iter().find(|&&(o, len)| !inside(o, len)) {
                return Err(GraphError::Plan(format!(
                    "launch {n} ({}): range {off}+{len} outside the arena of {}",
                    l.kernel.name(),
                    self.arena_len
                )));
            }
        }
        Ok(())
    }
}
