//! The graph engine as the CUDA executor's [`DeviceModel`]: every model's
//! plans (one per batch size) over one device arena holding its weights,
//! uploaded once; per batch, the inputs the executor copied from the
//! page-locked staging region are moved into the arena, the plan's kernels
//! (kernels.cu, compiled by NVRTC) run, and the outputs are moved to the
//! executor's output buffer, which it copies back. All of it is enqueued on
//! the executor's own stream, so its completion event covers it.
//!
//! Not run on a GPU here (no device on the development and CI machines):
//! setup without a driver fails cleanly (tested); the plans and kernel text
//! are the ones checked on the CPU against ONNX Runtime (tests/graph.rs),
//! and scripts/device-check.sh checks the outputs on the GPU.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, CudaFunction};
use cudarc::nvrtc::Ptx;

use super::plan::{Kernel, Plan, SymArgs};
use super::{GraphError, Model};
use crate::exec::cuda::{cuda_err, CudaExecutor, CudaSlots, DeviceBatch, DeviceModel};
use crate::exec::onnx::{OnnxModel, Provider};
use crate::exec::ExecError;

/// One model on one GPU: plans for batches `1..=plans.len()`, its arena.
struct Loaded {
    plans: Vec<Plan>,
    /// `max(arena_len)` floats, the weights at 0.
    arena: sys::CUdeviceptr,
    /// Bytes of one input and one output.
    sample_bytes: u64,
    out_bytes: u64,
}

/// The plans of one model for batches `1..=max_batch`, checked to share
/// one weight image (so one upload serves every batch size).
pub fn plans(model: &Model, max_batch: u32) -> Result<Vec<Plan>, GraphError> {
    let plans = (1..=max_batch as usize).map(|b| model.plan(b)).collect::<Result<Vec<_>, _>>()?;
    if plans.iter().any(|p| p.weights != plans[0].weights) {
        return Err(GraphError::Plan("weights differ between batch sizes".into()));
    }
    Ok(plans)
}

/// The plans of the repository models the backend serves on the GPU (its
/// `KIND_GPU` models: [`crate::exec::onnx::Provider::Cuda`]), by model
/// index; `None` for a slot that is not served or not a GPU model.
pub fn repo_plans(
    slots: &[Result<OnnxModel, (String, String)>],
    max_batch: u32,
) -> Result<Vec<Option<Vec<Plan>>>, ExecError> {
    let err = |name: &str, e: GraphError| ExecError::Cuda { what: "graph engine", source: format!("model {name}: {e}").into() };
    let mut out = Vec::with_capacity(slots.len());
    for slot in slots {
        let m = match slot {
            Ok(m) if m.provider == Provider::Cuda => m,
            _ => {
                out.push(None);
                continue;
            }
        };
        let bytes = super::proto::read_model_file(&m.path).map_err(|e| err(&m.name, e))?;
        let dims: Vec<usize> = m.input.dims.iter().map(|&d| usize::try_from(d).unwrap_or(0)).collect();
        let model = Model::load(&bytes).and_then(|g| g.with_sample_dims(&dims)).map_err(|e| err(&m.name, e))?;
        out.push(Some(plans(&model, max_batch.min(m.max_batch())).map_err(|e| err(&m.name, e))?));
    }
    Ok(out)
}

/// The CUDA executor over the repository's GPU models (see [`repo_plans`])
/// on GPUs `0..gpus`, one stream, arena and buffer set each.
pub fn repo_executor(
    slots: &[Result<OnnxModel, (String, String)>],
    gpus: u32,
    staging: Arc<dataplane::mem::Region>,
    cuda_slots: CudaSlots,
    models: Vec<crate::exec::ExecModel>,
) -> Result<CudaExecutor, ExecError> {
    let plans = repo_plans(slots, cuda_slots.max_batch)?;
    // A graph model's outputs are its own size (the daemon's table says
    // the backend's output slot for every model).
    let mut models = models;
    for (em, slot) in models.iter_mut().zip(slots) {
        if let Some(m) = slot.as_ref().ok().filter(|m| m.provider == Provider::Cuda) {
            em.output_len = m.output_bytes();
        }
    }
    let ordinals: Vec<usize> = (0..gpus.max(1) as usize).collect();
    executor(&ordinals, staging, cuda_slots, models, &plans)
}

/// The CUDA executor running real models on GPUs `ordinals`: the graph
/// engine's kernels (kernels.cu, compiled once by NVRTC) over `plans`, one
/// entry per model index (`None`: not a graph model; its batches fail),
/// each the plans for batches `1..=max_batch` from [`plans`]. Every GPU
/// gets its own arena with the weights ([`GraphModels`]).
pub fn executor(
    ordinals: &[usize],
    staging: Arc<dataplane::mem::Region>,
    cuda_slots: CudaSlots,
    models: Vec<crate::exec::ExecModel>,
    plans: &[Option<Vec<Plan>>],
) -> Result<CudaExecutor, ExecError> {
    crate::exec::cuda_libs::load().map_err(ExecError::CudaLibraries)?;
    let ptx = super::nvrtc::compile(super::KERNELS_CU, None)?;
    let mut make = |ctx: &Arc<CudaContext>, _ordinal: usize| {
        GraphModels::load(ctx, &ptx, plans).map(|m| Box::new(m) as Box<dyn DeviceModel>)
    };
    CudaExecutor::with_models(ordinals, staging, cuda_slots, models, &mut make)
}

/// The graph models of one GPU, by executor model index (`None`: not a
/// graph model; a batch of it fails).
pub struct GraphModels {
    funcs: Vec<CudaFunction>,
    models: Vec<Option<Loaded>>,
    _ctx: Arc<CudaContext>,
}

impl GraphModels {
    /// Loads `ptx` (kernels.cu) into `ctx` (bound to this thread) and
    /// uploads each model's weights into a fresh arena.
    pub fn load(ctx: &Arc<CudaContext>, ptx: &Ptx, models: &[Option<Vec<Plan>>]) -> Result<Self, ExecError> {
        let module = ctx.load_module(ptx.clone()).map_err(cuda_err)?;
        let funcs = Kernel::ALL
            .iter()
            .map(|k| module.load_function(k.name()).map_err(cuda_err))
            .collect::<Result<Vec<_>, _>>()?;
        let mut out = GraphModels { funcs, models: Vec::with_capacity(models.len()), _ctx: ctx.clone() };
        for plans in models {
            let Some(plans) = plans.as_ref().filter(|p| !p.is_empty()) else {
                out.models.push(None);
                continue;
            };
            let floats = plans.iter().map(|p| p.arena_len).max().unwrap_or(0);
            let bytes = usize::try_from(floats * 4).map_err(|_| ExecError::BadJob("arena too large"))?;
            // SAFETY: the context is bound (the caller's contract); the size
            // is positive; the pointer is stored at once for Drop to free.
            let arena = unsafe { result::malloc_sync(bytes.max(4)) }.map_err(cuda_err)?;
            let p0 = &plans[0];
            out.models.push(Some(Loaded {
                arena,
                sample_bytes: p0.input_len() * 4,
                out_bytes: p0.output_len() * 4,
                plans: plans.clone(),
            }));
            // SAFETY: `arena` holds `floats >= weights.len()` floats.
            unsafe { result::memcpy_htod_sync(arena, &p0.weights) }.map_err(cuda_err)?;
        }
        Ok(out)
    }
}

impl Drop for GraphModels {
    fn drop(&mut self) {
        for m in self.models.iter().flatten() {
            // SAFETY: allocated in `load` in this context (kept alive by
            // `_ctx`); the executor drains its stream before dropping models.
            let _ = unsafe { result::free_sync(m.arena) };
        }
    }
}

impl DeviceModel for GraphModels {
    unsafe fn enqueue(&self, stream: sys::CUstream, b: &DeviceBatch) -> Result<(), ExecError> {
        let m = self
            .models
            .get(b.model as usize)
            .and_then(Option::as_ref)
            .ok_or(ExecError::NoSuchModel(b.model))?;
        let n = b.n as usize;
        let plan = m.plans.get(n.wrapping_sub(1)).ok_or(ExecError::BadJob("batch above the model's plans"))?;
        if u64::from(b.slot) < m.sample_bytes || u64::from(b.out_len) != m.out_bytes {
            return Err(ExecError::BadJob("slot or output length differs from the model's tensors"));
        }
        let (arena_in, arena_out) = (m.arena + plan.input.0 * 4, m.arena + plan.output.0 * 4);
        for i in 0..n as u64 {
            // SAFETY: by the trait's contract input i lies at inputs + i*slot
            // with slot >= sample_bytes (checked); the destination is the
            // plan's input buffer (n samples, inside the arena: validated
            // plan); the copy is ordered on `stream` before the kernels.
            unsafe {
                result::memcpy_dtod_async(arena_in + i * m.sample_bytes, b.inputs + i * u64::from(b.slot), m.sample_bytes as usize, stream)
            }
            .map_err(cuda_err)?;
        }
        for l in &plan.launches {
            let (blocks, threads) = l.grid();
            let mut arena = m.arena;
            let mut args: SymArgs = l.args;
            let mut params: [*mut c_void; 2] = [&mut arena as *mut _ as *mut c_void, &mut args as *mut _ as *mut c_void];
            // SAFETY: the function is kernels.cu's `l.kernel`, loaded in this
            // context, whose parameters are (float*, SymArgs by value),
            // matching `params` (read at launch); the plan was validated, so
            // every range the kernel touches is inside the arena.
            unsafe { result::launch_kernel(self.funcs[l.kernel as usize].cu_function(), (blocks, 1, 1), (threads, 1, 1), 0, stream, &mut params) }
                .map_err(cuda_err)?;
        }
        for i in 0..n as u64 {
            // SAFETY: output i goes to outputs + i*stride with out_len ==
            // out_bytes bytes (checked, and the contract gives the room); the
            // source is the plan's output buffer inside the arena.
            unsafe { result::memcpy_dtod_async(b.outputs + i * u64::from(b.stride), arena_out + i * m.out_bytes, m.out_bytes as usize, stream) }
                .map_err(cuda_err)?;
        }
        Ok(())
    }
}
