//! The GPU worker (see docs/architecture.md, "GPU execution").
//!
//! - [`exec`]: the [`Executor`] interface, completion based
//!   and polled from the worker's loop, with an emulated implementation
//!   (a batch occupies its device for exactly `l(b)`, many devices on one
//!   timer queue), real inference with ONNX Runtime over the staging
//!   buffers (`exec::onnx`), and a CUDA one (feature `cuda`).
//! - [`worker`]: the batch pipeline: a batch plan arrives from the
//!   scheduler, every input is pulled at once with one-sided READs into
//!   staging slots, the batch runs at its planned time, each output goes
//!   back to its frontend and a `BatchDone` to the scheduler.
//! - [`output`]: the deterministic "model" both executors compute, so a
//!   frontend can check every response.
//! - [`node`]: the backend as a sans-IO node around the worker:
//!   registration with the scheduler, data links to frontends,
//!   heartbeats, liveness, drain.
//! - [`daemon`]: the `symphony-backend` process: the node's host (real
//!   connections and clock, a connector thread, metrics, the idle loop).

#![warn(missing_docs)]

pub mod daemon;
pub mod exec;
pub mod node;
pub mod output;
pub mod worker;

#[cfg(feature = "cuda")]
pub use exec::cuda::CudaExecutor;
pub use exec::emulated::EmulatedExecutor;
pub use exec::onnx::{OnnxExecutor, OnnxModel, OnnxOptions};
pub use exec::{ExecError, ExecModel, Executor, Finished, InputRef, Job, OutputRef};
pub use node::{BackendEvent, BackendNode, BackendNodeConfig, ControlDelay};
pub use worker::{
    BatchReport, BatchWorker, ControlMessage, WorkerConfig, WorkerError, WorkerStats,
    CONTROL_QUEUE_CAPACITY, EARLY_CAPACITY,
};
