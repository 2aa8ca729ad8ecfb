//! The GPU engine for real models (issue 51): an ONNX model's graph lowered
//! for a batch size to a static [`plan::Plan`] (one f32 arena, a list of
//! kernel launches) over the CUDA C kernels of `kernels.cu`. NVRTC compiles
//! those kernels for the GPU (`device::GraphModels`, the CUDA executor's
//! `DeviceModel`, runs the plans on the executor's stream); the same text compiled by the host C++ compiler
//! ([`cpu`]) runs the plan on the CPU, which is how the lowering and the
//! kernels are checked against ONNX Runtime on machines without a GPU.
//!
//! Supports what ppocr_cls and open_nsfw use: Conv (groups, pads, strides,
//! dilations; BatchNormalization and Relu folded into it), BatchNormalization,
//! Add/Sub/Mul/Div (broadcasting), Relu, Clip, HardSigmoid, MaxPool,
//! AveragePool, GlobalAveragePool, MatMul, Softmax, Transpose, and the
//! constant shape subgraph (Shape, Cast, Slice, Concat, Reshape, Flatten,
//! Constant, Identity). Anything else fails lowering with
//! [`GraphError::Unsupported`] naming the node and what it needs.

pub mod arena;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod device;
pub mod lower;
#[cfg(feature = "cuda")]
pub mod nvrtc;
mod ops;
pub mod plan;
pub mod proto;
pub mod state;

pub use lower::Model;
pub use plan::{Kernel, Launch, Plan};

/// The kernels' CUDA C source (NVRTC input; also compiled for the CPU).
pub const KERNELS_CU: &str = include_str!("kernels.cu");

/// Why a model cannot be lowered or run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GraphError {
    /// The file is not a well-formed ONNX model (or breaks a bound).
    Model(String),
    /// A well-formed model using an op, attribute or shape the engine lacks.
    Unsupported(String),
    /// The plan cannot be made or run (batch bound, arena, grid).
    Plan(String),
}

impl std::fmt::Display for GraphError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GraphError::Model(m) => write!(f, "bad ONNX model: {m}"),
            GraphError::Unsupported(m) => write!(f, "unsupported by the graph engine: {m}"),
            GraphError::Plan(m) => write!(f, "graph plan: {m}"),
        }
    }
}

impl std::error::Error for GraphError {}

/// One repository model alone on GPU 0 through the graph engine, as
/// `symphony profile` times it: the CUDA executor over `staging` (batches up
/// to the model's largest, one input and output slot each of the model's
/// own size). Without the `cuda` feature, or without a driver or GPU, an
/// error saying which (never a panic).
pub fn gpu_executor(
    model: &crate::exec::onnx::OnnxModel,
    staging: std::sync::Arc<dataplane::mem::Region>,
) -> Result<Box<dyn crate::exec::Executor + Send>, crate::exec::ExecError> {
    #[cfg(feature = "cuda")]
    {
        let slots = crate::exec::cuda::CudaSlots {
            max_batch: model.max_batch(),
            input_slot: model.input_bytes(),
            output_slot: model.output_bytes(),
        };
        // The CUDA executor ignores the profile (the device takes what it
        // takes); the one given is only well-formed.
        let profile = scheduler_core::profile::LatencyProfile::linear(1.0, 1.0, model.max_batch())
            .map_err(|e| crate::exec::ExecError::Cuda { what: "graph engine", source: e.to_string().into() })?;
        let models = vec![crate::exec::ExecModel { profile, output_len: model.output_bytes() }];
        let exec = device::repo_executor(&[Ok(model.clone())], 1, staging, slots, models)?;
        Ok(Box::new(exec))
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (model, staging);
        Err(crate::exec::ExecError::Cuda {
            what: "graph engine",
            source: "this build has no GPU engine (backend feature `cuda`)".into(),
        })
    }
}
