//! The executor interface: submit a batch, poll for finished ones.
//!
//! Completion based and driven by the caller's loop: `submit` returns at
//! once, `poll(now)` reports batches that finished, `next_wakeup` says when
//! the next one can finish (for a caller that sleeps). No executor starts a
//! thread (except the ONNX one, whose devices are threads: `onnx`). Inputs and outputs live in the staging region the executor was
//! built with (the transport's landing zone): a [`Job`] names them by
//! offset. Between `submit` and the [`Finished`] report the executor owns
//! those bytes: the caller must not write the inputs or read the outputs.
//!
//! A device runs one batch at a time and holds at most one: submitting to a
//! device whose batch has not been reported finished is
//! [`ExecError::DeviceBusy`] (the scheduler never plans overlapping batches
//! on one GPU; the worker waits for the device before submitting).

use dataplane::time::Instant;
use scheduler_core::profile::LatencyProfile;

pub mod emulated;
pub mod graph;
pub mod onnx;

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "cuda")]
pub mod cuda_h2d;
pub mod cuda_libs;

/// One servable model as an executor sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct ExecModel {
    /// Batch latency `l(b)` (the emulated executor occupies the device for
    /// exactly this long; the CUDA one ignores it).
    pub profile: LatencyProfile,
    /// Output bytes per input.
    pub output_len: u32,
}

/// One input of a job: `len` bytes at `offset` in the staging region.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InputRef {
    /// Byte offset in the staging region.
    pub offset: u64,
    /// Input length.
    pub len: u32,
}

/// Where a job's outputs go: output `i` at `offset + i * stride` in the
/// staging region, `output_len` bytes each (`stride >= output_len`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OutputRef {
    /// Byte offset of output 0 in the staging region.
    pub offset: u64,
    /// Distance between consecutive outputs.
    pub stride: u32,
}

/// A batch to run.
#[derive(Clone, Copy, Debug)]
pub struct Job<'a> {
    /// Caller's tag, returned in [`Finished`].
    pub tag: u64,
    /// Device index.
    pub device: u32,
    /// Model index (into the executor's model table).
    pub model: u32,
    /// Planned start: the batch starts at `max(now, exec_at, device free)`.
    pub exec_at: Instant,
    /// The batch's inputs, in order (batch size = `inputs.len()`).
    pub inputs: &'a [InputRef],
    /// Where the outputs go.
    pub output: OutputRef,
}

/// A batch that finished (successfully or not).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Finished {
    /// The job's tag.
    pub tag: u64,
    /// Device index.
    pub device: u32,
    /// Batch size.
    pub batch: u32,
    /// When the device started the batch.
    pub start: Instant,
    /// When it finished (outputs are in place from then on).
    pub finish: Instant,
    /// Whether the outputs are valid.
    pub ok: bool,
}

impl Default for Finished {
    fn default() -> Self {
        Finished {
            tag: 0,
            device: 0,
            batch: 0,
            start: Instant::ZERO,
            finish: Instant::ZERO,
            ok: false,
        }
    }
}

/// Executor errors.
#[derive(Debug)]
pub enum ExecError {
    /// The device still holds a batch: a second one was submitted to a busy
    /// device (a scheduling bug upstream).
    DeviceBusy {
        /// The device.
        device: u32,
    },
    /// No such device.
    NoSuchDevice(u32),
    /// No such model.
    NoSuchModel(u32),
    /// Empty batch, batch over the device limit, or inputs/outputs outside
    /// the staging region.
    BadJob(&'static str),
    /// The CUDA driver or NVRTC library (CUDA 12 or 13) is not found or
    /// does not load: which, and the folders searched.
    CudaLibraries(cuda_libs::MissingCudaLibs),
    /// A CUDA call failed: what was being done, and the driver's,
    /// compiler's or operating system's error.
    Cuda {
        /// The step that failed (e.g. "nvrtc", "staging region").
        what: &'static str,
        /// The underlying error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl std::fmt::Display for ExecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExecError::DeviceBusy { device } => {
                write!(f, "device {device} already holds a batch")
            }
            ExecError::NoSuchDevice(d) => write!(f, "no device {d}"),
            ExecError::NoSuchModel(m) => write!(f, "no model {m}"),
            ExecError::BadJob(why) => write!(f, "bad job: {why}"),
            ExecError::CudaLibraries(missing) => write!(f, "{missing}"),
            ExecError::Cuda { what, source } => write!(f, "cuda: {what}: {source}"),
        }
    }
}

impl std::error::Error for ExecError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ExecError::Cuda { source, .. } => Some(source.as_ref()),
            _ => None,
        }
    }
}

/// A set of devices that run batches.
pub trait Executor {
    /// Number of devices.
    fn devices(&self) -> u32;
    /// Largest batch a device accepts.
    fn max_batch(&self) -> u32;
    /// Output bytes per input of `model`, `None` if unknown.
    fn output_len(&self, model: u32) -> Option<u32>;
    /// Whether `device` holds no batch (a submit would be accepted).
    fn is_idle(&self, device: u32) -> bool;
    /// Queues `job` on its device. Errors leave the device unchanged.
    fn submit(&mut self, now: Instant, job: &Job<'_>) -> Result<(), ExecError>;
    /// Starts due work and reports finished batches into `out`; returns how
    /// many. Batches not reported (out full) are reported by a later call.
    fn poll(&mut self, now: Instant, out: &mut [Finished]) -> usize;
    /// When `poll` next has something to do (`None`: nothing pending;
    /// a real device that must be polled returns `Some(now)`-like times).
    fn next_wakeup(&self) -> Option<Instant>;
    /// Gives the executor a function to call when a batch finishes on a
    /// thread of its own (so a sleeping host wakes). Default: ignored
    /// (executors polled on the caller's clock need none).
    fn set_waker(&self, _wake: onnx::Waker) {}
    /// Why the latest failed batch failed (`None`: unknown, or nothing
    /// failed), for the host's log. Default: none.
    fn last_error(&self) -> Option<&str> {
        None
    }
}

/// A boxed executor is one (the backend picks its engine at run time).
impl<E: Executor + ?Sized> Executor for Box<E> {
    fn devices(&self) -> u32 {
        (**self).devices()
    }
    fn max_batch(&self) -> u32 {
        (**self).max_batch()
    }
    fn output_len(&self, model: u32) -> Option<u32> {
        (**self).output_len(model)
    }
    fn is_idle(&self, device: u32) -> bool {
        (**self).is_idle(device)
    }
    fn submit(&mut self, now: Instant, job: &Job<'_>) -> Result<(), ExecError> {
        (**self).submit(now, job)
    }
    fn poll(&mut self, now: Instant, out: &mut [Finished]) -> usize {
        (**self).poll(now, out)
    }
    fn next_wakeup(&self) -> Option<Instant> {
        (**self).next_wakeup()
    }
    fn set_waker(&self, wake: onnx::Waker) {
        (**self).set_waker(wake)
    }
    fn last_error(&self) -> Option<&str> {
        (**self).last_error()
    }
}

/// Checks a job against a region of `region_len` bytes, a batch limit and
/// an output length. Shared by the executors.
pub(crate) fn check_job(
    job: &Job<'_>,
    region_len: usize,
    max_batch: u32,
    output_len: u32,
) -> Result<(), ExecError> {
    let b = job.inputs.len();
    if b == 0 {
        return Err(ExecError::BadJob("empty batch"));
    }
    if b > max_batch as usize {
        return Err(ExecError::BadJob("batch larger than the device limit"));
    }
    let end_ok = |off: u64, len: u64| off.checked_add(len).is_some_and(|e| e <= region_len as u64);
    if !job
        .inputs
        .iter()
        .all(|i| end_ok(i.offset, u64::from(i.len)))
    {
        return Err(ExecError::BadJob("input outside the staging region"));
    }
    if job.output.stride < output_len {
        return Err(ExecError::BadJob("output stride shorter than the output"));
    }
    let span = u64::from(job.output.stride) * (b as u64 - 1) + u64::from(output_len);
    if !end_ok(job.output.offset, span) {
        return Err(ExecError::BadJob("outputs outside the staging region"));
    }
    Ok(())
}
