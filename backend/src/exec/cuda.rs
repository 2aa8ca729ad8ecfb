//! Real GPUs through the CUDA driver API (cudarc, loaded with dlopen at run
//! time: the crate builds without the toolkit, and a host without the
//! driver or NVRTC of CUDA 12 or 13 gets [`ExecError::CudaLibraries`] from
//! [`CudaExecutor::new`], naming what is missing and where it looked, never
//! a panic: [`super::cuda_libs`] finds and opens the libraries before the
//! first driver call).
//!
//! Data path per batch, all asynchronous on one stream per device:
//! 1. the staging region (the transport's READ landing zone) is page-locked
//!    once with `cuMemHostRegister` (portable across contexts), so the
//!    inputs the READs landed are DMA'd straight from it;
//! 2. one `cuMemcpyHtoDAsync` per input into a packed device buffer (slot
//!    stride), plus the input lengths from a `cuMemHostAlloc` buffer;
//! 3. the model: a [`DeviceModel`] enqueues its work on the same stream
//!    (the built-in one, [`HashKernel`], is one kernel launch of CUDA C
//!    compiled once with NVRTC that computes exactly [`crate::output`], one
//!    thread per input; a real model's engine is another implementation,
//!    given to [`CudaExecutor::with_models`]);
//! 4. one `cuMemcpyDtoHAsync` of all outputs into the staging region;
//! 5. an event recorded after the copy; [`Executor::poll`] queries it
//!    (`cuEventQuery`, no blocking) and reports the batch when it fired.
//!
//! A batch submitted before its `exec_at` is held and launched by the first
//! `poll` at or after `exec_at`. Start and finish are the poll times that
//! launched it and saw its event (so they include polling granularity).
//!
//! Not run on the development host (no GPU, no driver): only the
//! no-driver path is tested here; the launch path compiles but is unrun.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::result::{self, stream::StreamKind};
use cudarc::driver::{sys, CudaContext, CudaFunction};
use dataplane::mem::Region;
use dataplane::time::Instant;

use super::{
    check_job, cuda_libs, ExecError, ExecModel, Executor, Finished, InputRef, Job, OutputRef,
};

/// The model kernel: [`crate::output`] in CUDA C (one thread per input).
pub const KERNEL_SRC: &str = r#"
__device__ unsigned long long symphony_fold(unsigned long long h, unsigned long long x) {
    return (h ^ x) * 0x100000001b3ULL;
}

extern "C" __global__ void symphony_model(
    const unsigned char* inputs, unsigned int slot, const unsigned int* lens,
    unsigned char* outputs, unsigned int stride, unsigned int out_len,
    unsigned int n, unsigned int model)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned long long h = symphony_fold(0xcbf29ce484222325ULL, (unsigned long long)model);
    const unsigned char* in = inputs + (unsigned long long)i * slot;
    unsigned int len = lens[i];
    unsigned int j = 0;
    for (; j + 8 <= len; j += 8) {
        unsigned long long w = 0;
        for (int k = 7; k >= 0; k--) w = (w << 8) | (unsigned long long)in[j + k];
        h = symphony_fold(h, w);
    }
    for (; j < len; j++) h = symphony_fold(h, (unsigned long long)in[j]);
    h = symphony_fold(h, (unsigned long long)len);
    unsigned char* out = outputs + (unsigned long long)i * stride;
    for (unsigned int q = 0; q < out_len; q++) {
        out[q] = (unsigned char)(h >> (8 * (q % 8))) ^ (unsigned char)(q / 8);
    }
}
"#;
const KERNEL_NAME: &str = "symphony_model";
const THREADS_PER_BLOCK: u32 = 128;

pub(super) fn cuda_err(e: result::DriverError) -> ExecError {
    ExecError::Cuda { what: "driver", source: Box::new(e) }
}

/// Whether the CUDA driver library is found and loads on this host
/// (through [`cuda_libs::load`]; NVRTC may still be missing).
pub fn driver_present() -> bool {
    cuda_libs::load().map_or_else(|e| !e.driver_missing, |_| true)
}

/// Whether the driver and an NVRTC it can use are found and load.
pub fn nvrtc_present() -> bool {
    cuda_libs::load().is_ok()
}

/// The GPUs the driver sees: the libraries' error when they are missing,
/// the driver's (say `CUDA_ERROR_NO_DEVICE`) when it cannot initialise.
pub fn gpu_count() -> Result<u32, ExecError> {
    cuda_libs::load().map_err(ExecError::CudaLibraries)?;
    result::init().map_err(cuda_err)?;
    let n = result::device::get_count().map_err(cuda_err)?;
    Ok(u32::try_from(n).unwrap_or(0))
}

/// Whether this host has a GPU the executor can use: the libraries load
/// and the driver counts at least one device.
pub fn gpu_present() -> bool {
    gpu_count().is_ok_and(|n| n > 0)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Idle,
    Queued,
    Running,
}

/// One batch as a [`DeviceModel`] sees it: device buffers already filled
/// on the stream it is given (inputs copied from the staging region) and
/// the buffer its outputs go to (copied back to the staging region after).
#[derive(Clone, Copy, Debug)]
pub struct DeviceBatch {
    /// The model's index in the executor's table.
    pub model: u32,
    /// Input `i` at `inputs + i * slot`, `lens[i]` bytes long.
    pub inputs: sys::CUdeviceptr,
    /// Distance between inputs in `inputs`, bytes.
    pub slot: u32,
    /// `n` u32 input lengths (device memory).
    pub lens: sys::CUdeviceptr,
    /// Batch size.
    pub n: u32,
    /// Output `i` goes to `outputs + i * stride`, `out_len` bytes.
    pub outputs: sys::CUdeviceptr,
    /// Distance between outputs, bytes.
    pub stride: u32,
    /// Output bytes per input.
    pub out_len: u32,
}

/// What runs a batch on one GPU: enqueues its work on `stream` (the
/// executor's own, in the device's bound context) and returns without
/// waiting; the executor records its completion event after it. The
/// executor makes one per device (see [`CudaExecutor::with_models`]).
pub trait DeviceModel: Send {
    /// Enqueues `batch` on `stream`.
    ///
    /// # Safety
    /// `stream` is a live stream of the context this model was made in,
    /// bound to the calling thread; `batch`'s device pointers hold what
    /// [`DeviceBatch`] says (n inputs `slot` apart, n lengths, room for n
    /// outputs `stride` apart) until the stream has run past this work.
    unsafe fn enqueue(&self, stream: sys::CUstream, batch: &DeviceBatch) -> Result<(), ExecError>;
}

/// The built-in model: [`KERNEL_SRC`], computing [`crate::output`].
pub struct HashKernel {
    func: CudaFunction,
}

impl HashKernel {
    /// Loads the compiled kernel into `ctx`.
    pub fn load(ctx: &Arc<CudaContext>, ptx: &cudarc::nvrtc::Ptx) -> Result<Self, ExecError> {
        let module = ctx.load_module(ptx.clone()).map_err(cuda_err)?;
        let func = module.load_function(KERNEL_NAME).map_err(cuda_err)?;
        Ok(HashKernel { func })
    }
}

impl DeviceModel for HashKernel {
    unsafe fn enqueue(&self, stream: sys::CUstream, b: &DeviceBatch) -> Result<(), ExecError> {
        let (mut a_in, mut a_slot, mut a_lens, mut a_out) = (b.inputs, b.slot, b.lens, b.outputs);
        let (mut a_stride, mut a_out_len, mut a_n, mut a_model) =
            (b.stride, b.out_len, b.n, b.model);
        let mut params: [*mut c_void; 8] = [
            &mut a_in as *mut _ as *mut c_void,
            &mut a_slot as *mut _ as *mut c_void,
            &mut a_lens as *mut _ as *mut c_void,
            &mut a_out as *mut _ as *mut c_void,
            &mut a_stride as *mut _ as *mut c_void,
            &mut a_out_len as *mut _ as *mut c_void,
            &mut a_n as *mut _ as *mut c_void,
            &mut a_model as *mut _ as *mut c_void,
        ];
        let blocks = b.n.div_ceil(THREADS_PER_BLOCK);
        // SAFETY: the function comes from a module loaded in the context
        // the caller bound (the trait's contract); the 8 parameters match
        // the kernel signature in order and type (u64 device pointers, u32
        // scalars) and are read at launch; by the contract `inputs`/`lens`
        // hold n*slot bytes / n entries and `outputs` (n-1)*stride +
        // out_len bytes, so the kernel stays inside them.
        unsafe {
            result::launch_kernel(
                self.func.cu_function(),
                (blocks, 1, 1),
                (THREADS_PER_BLOCK, 1, 1),
                0,
                stream,
                &mut params,
            )
        }
        .map_err(cuda_err)
    }
}

/// The batch buffers of each GPU: inputs of at most `input_slot` bytes,
/// outputs `output_slot` apart, `max_batch` of each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CudaSlots {
    /// Largest batch.
    pub max_batch: u32,
    /// Bytes of one input slot.
    pub input_slot: u32,
    /// Bytes between two outputs (at least every model's output length).
    pub output_slot: u32,
}

/// Makes the model of GPU `ordinal` in its (bound) context.
pub type MakeModel<'a> =
    dyn FnMut(&Arc<CudaContext>, usize) -> Result<Box<dyn DeviceModel>, ExecError> + 'a;

/// One GPU: context, stream, model, device buffers, completion event.
struct Device {
    ctx: Arc<CudaContext>,
    model_impl: Box<dyn DeviceModel>,
    stream: sys::CUstream,
    event: sys::CUevent,
    d_inputs: sys::CUdeviceptr,
    d_lens: sys::CUdeviceptr,
    d_outputs: sys::CUdeviceptr,
    /// Page-locked, `max_batch` lengths.
    h_lens: *mut u32,
    state: State,
    tag: u64,
    model: u32,
    exec_at: Instant,
    start: Instant,
    inputs: Vec<InputRef>,
    output: OutputRef,
}

/// GPUs driven through the CUDA driver API. See the module docs.
pub struct CudaExecutor {
    staging: Arc<Region>,
    /// Whether `cuMemHostRegister` on the staging region succeeded.
    host_registered: bool,
    models: Vec<ExecModel>,
    max_batch: u32,
    input_slot: u32,
    output_slot: u32,
    devices: Vec<Device>,
}

// SAFETY: the raw CUDA handles (stream, event, device and pinned pointers)
// are owned by this executor alone and used only through `&mut self` (or
// `&self` reads of plain fields); CUDA handles may be used from any thread
// once the owning context is bound, which every method does first. The
// models are `Send` themselves (`DeviceModel: Send`).
unsafe impl Send for CudaExecutor {}

impl std::fmt::Debug for CudaExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaExecutor")
            .field("devices", &self.devices.len())
            .finish()
    }
}

impl CudaExecutor {
    /// Opens GPUs `ordinals`, compiles the model kernel, page-locks
    /// `staging` and allocates device buffers for batches of `max_batch`
    /// inputs of at most `input_slot` bytes and outputs `output_slot` apart.
    ///
    /// Returns [`ExecError::CudaLibraries`] when the libraries are absent
    /// (checked before any call that could panic).
    pub fn new(
        ordinals: &[usize],
        staging: Arc<Region>,
        max_batch: u32,
        input_slot: u32,
        output_slot: u32,
        models: Vec<ExecModel>,
    ) -> Result<Self, ExecError> {
        cuda_libs::load().map_err(ExecError::CudaLibraries)?;
        let ptx = cudarc::nvrtc::compile_ptx(KERNEL_SRC)
            .map_err(|e| ExecError::Cuda { what: "nvrtc", source: Box::new(e) })?;
        let mut hash = |ctx: &Arc<CudaContext>, _ordinal: usize| {
            HashKernel::load(ctx, &ptx).map(|k| Box::new(k) as Box<dyn DeviceModel>)
        };
        let slots = CudaSlots { max_batch, input_slot, output_slot };
        Self::with_models(ordinals, staging, slots, models, &mut hash)
    }

    /// As [`CudaExecutor::new`], with the model of each GPU made by `make`
    /// (in that GPU's context, bound to this thread): one executor per set
    /// of GPUs by device ordinal, one stream, buffer set and model each.
    pub fn with_models(
        ordinals: &[usize],
        staging: Arc<Region>,
        slots: CudaSlots,
        models: Vec<ExecModel>,
        make: &mut MakeModel<'_>,
    ) -> Result<Self, ExecError> {
        cuda_libs::load().map_err(ExecError::CudaLibraries)?;
        let CudaSlots { max_batch, input_slot, output_slot } = slots;
        if max_batch == 0 || input_slot == 0 || output_slot == 0 {
            return Err(ExecError::BadJob("zero batch, input slot or output slot"));
        }
        if models.iter().any(|m| m.output_len > output_slot) {
            return Err(ExecError::BadJob(
                "a model's output is longer than output_slot",
            ));
        }
        let mut exec = CudaExecutor {
            staging,
            host_registered: false,
            models,
            max_batch,
            input_slot,
            output_slot,
            devices: Vec::with_capacity(ordinals.len()),
        };
        for &ordinal in ordinals {
            let ctx = CudaContext::new(ordinal).map_err(cuda_err)?;
            ctx.bind_to_thread().map_err(cuda_err)?;
            let model_impl = make(&ctx, ordinal)?;
            let stream = result::stream::create(StreamKind::NonBlocking).map_err(cuda_err)?;
            let event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING);
            let event = match event {
                Ok(e) => e,
                Err(e) => {
                    // SAFETY: `stream` was just created in the bound context.
                    let _ = unsafe { result::stream::destroy(stream) };
                    return Err(cuda_err(e));
                }
            };
            let mb = max_batch as usize;
            // Push first so that Drop frees whatever was allocated if a
            // later allocation fails.
            exec.devices.push(Device {
                ctx,
                model_impl,
                stream,
                event,
                d_inputs: 0,
                d_lens: 0,
                d_outputs: 0,
                h_lens: std::ptr::null_mut(),
                state: State::Idle,
                tag: 0,
                model: 0,
                exec_at: Instant::ZERO,
                start: Instant::ZERO,
                inputs: Vec::with_capacity(mb),
                output: OutputRef::default(),
            });
            let d = exec.devices.last_mut().expect("just pushed");
            // SAFETY: the device's context is bound to this thread; sizes
            // are positive; the pointers are stored for Drop to free.
            unsafe {
                d.d_inputs = result::malloc_sync(mb * input_slot as usize).map_err(cuda_err)?;
                d.d_lens = result::malloc_sync(mb * 4).map_err(cuda_err)?;
                d.d_outputs = result::malloc_sync(mb * output_slot as usize).map_err(cuda_err)?;
                d.h_lens = result::malloc_host(mb * 4, 0).map_err(cuda_err)? as *mut u32;
            }
        }
        if let Some(d) = exec.devices.first() {
            d.ctx.bind_to_thread().map_err(cuda_err)?;
            // SAFETY: the region is a live mapping of `len()` bytes that
            // outlives this executor (we hold its Arc); Drop unregisters it.
            let r = unsafe {
                sys::cuMemHostRegister_v2(
                    exec.staging.as_ptr() as *mut c_void,
                    exec.staging.len(),
                    sys::CU_MEMHOSTREGISTER_PORTABLE,
                )
            };
            r.result().map_err(cuda_err)?;
            exec.host_registered = true;
        }
        Ok(exec)
    }

    /// Enqueues copies, kernel and event for the queued batch of `di`.
    fn launch(&mut self, di: usize) -> Result<(), ExecError> {
        let base = self.staging.as_ptr();
        let slot = self.input_slot;
        let d = &mut self.devices[di];
        let out_len = self.models[d.model as usize].output_len;
        let b = d.inputs.len();
        d.ctx.bind_to_thread().map_err(cuda_err)?;
        for (i, input) in d.inputs.iter().enumerate() {
            // SAFETY: `h_lens` holds `max_batch >= b` u32s (allocated in new).
            unsafe { *d.h_lens.add(i) = input.len };
            // SAFETY: the source range was bounds-checked against the region
            // in `submit` and the caller does not write it until Finished;
            // the destination is inside `d_inputs` (i < max_batch, len <=
            // input_slot checked in submit).
            unsafe {
                sys::cuMemcpyHtoDAsync_v2(
                    d.d_inputs + i as u64 * u64::from(slot),
                    base.add(input.offset as usize) as *const c_void,
                    input.len as usize,
                    d.stream,
                )
            }
            .result()
            .map_err(cuda_err)?;
        }
        // SAFETY: `h_lens` (page-locked) holds b lengths, `d_lens` room for
        // max_batch; both live until Drop, which synchronises first.
        unsafe { sys::cuMemcpyHtoDAsync_v2(d.d_lens, d.h_lens as *const c_void, b * 4, d.stream) }
            .result()
            .map_err(cuda_err)?;
        let batch = DeviceBatch {
            model: d.model,
            inputs: d.d_inputs,
            slot,
            lens: d.d_lens,
            n: b as u32,
            outputs: d.d_outputs,
            stride: d.output.stride,
            out_len,
        };
        // SAFETY: the device's context is bound (above) and `stream` is its
        // own; the inputs and lengths were enqueued on it just before, into
        // buffers of max_batch >= b slots, and d_outputs holds max_batch
        // outputs of output_slot >= stride bytes (checked in submit); the
        // buffers live until Drop, which synchronises the stream first.
        unsafe { d.model_impl.enqueue(d.stream, &batch) }?;
        let span = (b - 1) * d.output.stride as usize + out_len as usize;
        // SAFETY: the destination range was bounds-checked against the
        // region in `submit` and is not read by the caller until Finished;
        // the source is inside d_outputs (see above).
        unsafe {
            sys::cuMemcpyDtoHAsync_v2(
                base.add(d.output.offset as usize) as *mut c_void,
                d.d_outputs,
                span,
                d.stream,
            )
        }
        .result()
        .map_err(cuda_err)?;
        // SAFETY: event and stream belong to the bound context.
        unsafe { result::event::record(d.event, d.stream) }.map_err(cuda_err)?;
        Ok(())
    }

    fn finish(&mut self, di: usize, now: Instant, ok: bool) -> Finished {
        let d = &mut self.devices[di];
        d.state = State::Idle;
        Finished {
            tag: d.tag,
            device: di as u32,
            batch: d.inputs.len() as u32,
            start: d.start,
            finish: now,
            ok,
        }
    }
}

impl Executor for CudaExecutor {
    fn devices(&self) -> u32 {
        self.devices.len() as u32
    }

    fn max_batch(&self) -> u32 {
        self.max_batch
    }

    fn output_len(&self, model: u32) -> Option<u32> {
        self.models.get(model as usize).map(|m| m.output_len)
    }

    fn is_idle(&self, device: u32) -> bool {
        self.devices
            .get(device as usize)
            .is_some_and(|d| d.state == State::Idle)
    }

    fn submit(&mut self, now: Instant, job: &Job<'_>) -> Result<(), ExecError> {
        let model = self
            .models
            .get(job.model as usize)
            .ok_or(ExecError::NoSuchModel(job.model))?;
        let out_len = model.output_len;
        let d = self
            .devices
            .get(job.device as usize)
            .ok_or(ExecError::NoSuchDevice(job.device))?;
        if d.state != State::Idle {
            return Err(ExecError::DeviceBusy { device: job.device });
        }
        check_job(job, self.staging.len(), self.max_batch, out_len)?;
        if job.inputs.iter().any(|i| i.len > self.input_slot) {
            return Err(ExecError::BadJob("input longer than the device slot"));
        }
        if job.output.stride > self.output_slot {
            return Err(ExecError::BadJob("output stride above output_slot"));
        }
        let d = &mut self.devices[job.device as usize];
        d.tag = job.tag;
        d.model = job.model;
        d.exec_at = job.exec_at;
        d.inputs.clear();
        d.inputs.extend_from_slice(job.inputs);
        d.output = job.output;
        d.state = State::Queued;
        let _ = now;
        Ok(())
    }

    fn poll(&mut self, now: Instant, out: &mut [Finished]) -> usize {
        let mut n = 0;
        for di in 0..self.devices.len() {
            if n == out.len() {
                break;
            }
            match self.devices[di].state {
                State::Idle => {}
                State::Queued if now >= self.devices[di].exec_at => {
                    self.devices[di].start = now;
                    match self.launch(di) {
                        Ok(()) => self.devices[di].state = State::Running,
                        Err(_) => {
                            out[n] = self.finish(di, now, false);
                            n += 1;
                        }
                    }
                }
                State::Queued => {}
                State::Running => {
                    let d = &self.devices[di];
                    if d.ctx.bind_to_thread().is_err() {
                        out[n] = self.finish(di, now, false);
                        n += 1;
                        continue;
                    }
                    // SAFETY: the event was created in this context and
                    // recorded by `launch`.
                    let r = unsafe { sys::cuEventQuery(d.event) };
                    match r {
                        sys::CUresult::CUDA_SUCCESS => {
                            out[n] = self.finish(di, now, true);
                            n += 1;
                        }
                        sys::CUresult::CUDA_ERROR_NOT_READY => {}
                        _ => {
                            out[n] = self.finish(di, now, false);
                            n += 1;
                        }
                    }
                }
            }
        }
        n
    }

    fn next_wakeup(&self) -> Option<Instant> {
        // A running batch is polled continuously (its event has no time);
        // a queued one wants its exec_at.
        self.devices
            .iter()
            .filter_map(|d| match d.state {
                State::Idle => None,
                State::Queued => Some(d.exec_at),
                State::Running => Some(d.start),
            })
            .min()
    }
}

impl Drop for CudaExecutor {
    fn drop(&mut self) {
        for d in &self.devices {
            if d.ctx.bind_to_thread().is_err() {
                continue;
            }
            // SAFETY: every handle below was created in this context by
            // `new` (null/zero ones are skipped); the stream is drained
            // first so no copy or kernel still uses the buffers.
            unsafe {
                let _ = sys::cuStreamSynchronize(d.stream);
                let _ = result::event::destroy(d.event);
                let _ = result::stream::destroy(d.stream);
                if d.d_inputs != 0 {
                    let _ = result::free_sync(d.d_inputs);
                }
                if d.d_lens != 0 {
                    let _ = result::free_sync(d.d_lens);
                }
                if d.d_outputs != 0 {
                    let _ = result::free_sync(d.d_outputs);
                }
                if !d.h_lens.is_null() {
                    let _ = result::free_host(d.h_lens as *mut c_void);
                }
            }
        }
        if self.host_registered {
            if let Some(d) = self.devices.first() {
                let _ = d.ctx.bind_to_thread();
                // SAFETY: registered in `new` on this live mapping.
                let _ = unsafe { sys::cuMemHostUnregister(self.staging.as_ptr() as *mut c_void) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::KERNEL_SRC;
    use crate::output::expected_output;

    /// The kernel's logic, compiled as host C++ with a tiny shim for the
    /// CUDA built-ins (no GPU needed), gives the reference bytes. Skipped
    /// when no C++ compiler is installed.
    #[test]
    fn kernel_source_computes_the_reference_output() {
        let dir = std::env::temp_dir().join(format!("symphony-kernel-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("k.cpp");
        let bin = dir.join("k");
        let main = r#"
#include <cstdio>
int main() {
    const unsigned n = 6, slot = 256, stride = 48, out_len = 40, model = 3;
    static unsigned char in[6 * 256];
    static unsigned int lens[6];
    static unsigned char out[6 * 48];
    for (unsigned i = 0; i < n; i++) {
        lens[i] = 10 + 37 * i;
        for (unsigned j = 0; j < lens[i]; j++) in[i * slot + j] = (unsigned char)(j * 7 + i * 13);
    }
    blockDim.x = 128;
    for (blockIdx.x = 0; blockIdx.x < 1; blockIdx.x++)
        for (threadIdx.x = 0; threadIdx.x < 128; threadIdx.x++)
            symphony_model(in, slot, lens, out, stride, out_len, n, model);
    for (unsigned i = 0; i < n; i++) {
        for (unsigned j = 0; j < out_len; j++) printf("%02x", out[i * stride + j]);
        printf("\n");
    }
}
"#;
        let shim = "struct Dim { unsigned int x; };\nstatic Dim blockIdx, blockDim, threadIdx;\n#define __global__\n#define __device__ static\n";
        std::fs::write(&src, format!("{shim}{KERNEL_SRC}{main}")).unwrap();
        let built = std::process::Command::new("c++")
            .arg("-O1")
            .arg("-o")
            .arg(&bin)
            .arg(&src)
            .status();
        match built {
            Ok(s) if s.success() => {}
            _ => {
                eprintln!("skipped: no working C++ compiler");
                let _ = std::fs::remove_dir_all(&dir);
                return;
            }
        }
        let out = std::process::Command::new(&bin).output().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let text = String::from_utf8(out.stdout).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 6);
        for (i, line) in lines.iter().enumerate() {
            let len = 10 + 37 * i;
            let input: Vec<u8> = (0..len).map(|j| (j * 7 + i * 13) as u8).collect();
            let mut want = [0u8; 40];
            expected_output(3, &input, &mut want);
            let want_hex: String = want.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(*line, want_hex, "input {i}");
        }
    }
}
